"""The layering of hilbert_lab, read from the AST of every module (lazy imports inside functions included).

kernels -> curves -> attention -> {distributed, locality, models, integrations, bench} -> viz -> reports -> cli: a
package imports only from its own layer or below, and packages never import each other in a circle; nor do
modules, inside a package or across (no module imports itself through others, package __init__ files included).
The leaf modules io, dtypes, imaging and arguments may be imported by anyone and import only each other.
No module imports a private name (`_x`) of another package, and no other package is imported under
try/except (an optional dependency is a decision of the package that owns it). Modules stay under
MAX_LINES, except the one-algorithm modules listed below.

Known exceptions are in ALLOWED, each with its reason; everything else fails.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hilbert_lab"

LAYERS = {"kernels": 0, "curves": 1, "attention": 2, "distributed": 3, "locality": 3, "models": 3, "integrations": 3, "bench": 3,
          "viz": 4, "reports": 5, "cli": 6, "examples": 6}
LEAVES = {"io", "dtypes", "imaging", "arguments"}

# (rule, importing module or package, imported package) -> reason; rules "upward", "cycle" (the edge left
# out of the circle search), "try"
ALLOWED: dict[tuple[str, str, str], str] = {
    ("try", "hilbert_lab.curves.codec", "kernels"): "the CUDA curve module is optional (built at first use; "
                                                    "any failure means the CPU path)",
}

MAX_LINES = 400
# the only modules allowed over MAX_LINES: one algorithm each, not split further
ONE_ALGORITHM_MODULES = {
    "hilbert_lab/kernels/triton_dilated.py": "the fused Triton dilated-attention kernel, forward and backward",
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. hilbert_lab.attention.engine
    target: str  # the imported module, e.g. hilbert_lab.curves.orderings
    name: Optional[str]  # the name taken from it (from-imports of a non-module name), else None
    line: int
    in_try: bool
    package: Optional[str] = None  # `from package import module`: the package, whose __init__ runs first


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def package_of(module: str) -> Optional[str]:
    """hilbert_lab.X[.Y...] -> X (a package or a top-level module); the root itself -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def imports_of(module: str, source: str, known: set[str], is_package: bool = False) -> Iterator[Import]:
    """Every hilbert_lab import in `source` (at any depth), relative ones resolved."""
    tree = ast.parse(source)
    in_try: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            for statement in node.body:
                in_try.update(id(inner) for inner in ast.walk(statement))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "hilbert_lab":
                    yield Import(module, alias.name, None, node.lineno, id(node) in in_try)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".") if is_package else module.split(".")[:-1]
                parent = parent[:len(parent) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            if base.split(".")[0] != "hilbert_lab":
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in known:
                    yield Import(module, submodule, None, node.lineno, id(node) in in_try, base)
                else:
                    yield Import(module, base, alias.name, node.lineno, id(node) in in_try)


def private_attribute_uses(module: str, source: str, known: set[str], is_package: bool = False) -> Iterator[str]:
    """`alias._name` where alias is a module of another package bound by an import in `source`."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in known:
                    aliases[alias.asname] = alias.name
    for record in imports_of(module, source, known, is_package):
        if record.name is None and record.target.count("."):
            aliases.setdefault(record.target.rsplit(".", 1)[1], record.target)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and _private(node.attr) and package_of(aliases[node.value.id]) != package_of(module)):
            yield f"{module}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def all_imports() -> list[Import]:
    modules = all_modules()
    known = set(modules)
    return [record for module, path in modules.items()
            for record in imports_of(module, path.read_text(), known, path.name == "__init__.py")]


def upward_imports(records: list[Import]) -> list[str]:
    """Imports that run up the layers (or out of a leaf), as 'module:line -> target'."""
    found = []
    for record in records:
        source, target = package_of(record.module), package_of(record.target)
        if source is None or target is None or source == target or target in LEAVES:
            continue
        if source in LEAVES or LAYERS[target] > LAYERS[source]:
            found.append(f"{record.module}:{record.line} -> {record.target}")
    return found


def package_cycles(records: list[Import]) -> list[list[str]]:
    """Circles in the graph of imports between packages (ALLOWED "cycle" edges left out)."""
    edges: dict[str, set[str]] = {}
    allowed = {(module, target) for rule, module, target in ALLOWED if rule == "cycle"}
    for record in records:
        source, target = package_of(record.module), package_of(record.target)
        if source is None or target is None or source == target:
            continue
        if (record.module, target) in allowed or (f"hilbert_lab.{source}", target) in allowed:
            continue
        edges.setdefault(source, set()).add(target)
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    return cycles


def module_edges(records: list[Import]) -> dict[str, dict[str, int]]:
    """module -> {module it imports: line of the first such import}. `import a.b` and `from a.b import name` are
    edges to a.b; `from a import b` with b a module is an edge to b and to a (a's __init__ runs first and hands b
    over). A module's import of itself is left out."""
    edges: dict[str, dict[str, int]] = {}
    for record in records:
        for target in (record.target, record.package):
            if target is not None and target != record.module:
                edges.setdefault(record.module, {}).setdefault(target, record.line)
    return edges


def module_cycles(records: list[Import]) -> list[str]:
    """Each group of modules that import one another (a strongly connected component, lazy imports included), as
    one readable chain 'a:line -> b:line -> a' (each line the import of the next module) through its first module,
    followed by the group's other modules when the chain does not pass them."""
    edges = module_edges(records)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, {})):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = [stack.pop()]
            while group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(sorted(group))

    for start in sorted(set(edges) | {t for targets in edges.values() for t in targets}):
        if start not in index:
            connect(start)
    chains = []
    for group in sorted(groups):
        start, members = group[0], set(group)
        came_from: dict[str, str] = {}
        frontier = [start]
        while start not in came_from:  # breadth first inside the group, back to the start: a shortest circle
            following = []
            for node in frontier:
                for nxt in sorted(edges[node]):
                    if nxt in members and nxt not in came_from:
                        came_from[nxt] = node
                        following.append(nxt)
            frontier = following
        path = [start]
        while len(path) == 1 or path[-1] != start:
            path.append(came_from[path[-1]])
        path.reverse()
        chain = " -> ".join(f"{node}:{edges[node][nxt]}" for node, nxt in zip(path, path[1:])) + f" -> {start}"
        others = sorted(members - set(path))
        chains.append(chain + (f" (with {', '.join(others)})" if others else ""))
    return chains


def test_the_scanner_sees_imports_and_flags_each_kind_of_violation():
    """The checks below would catch a violation (on made-up sources)."""
    known = {"hilbert_lab.curves.codec", "hilbert_lab.viz.curves", "hilbert_lab.attention.engine",
             "hilbert_lab.curves", "hilbert_lab.viz"}
    source = ("import hilbert_lab.curves.codec as codec\n"
              "def f():\n    from hilbert_lab.viz import curves\n    from . import codec as c\n"
              "    try:\n        from hilbert_lab.attention.engine import _plan\n"
              "    except ImportError:\n        pass\n"
              "    return codec._kernel\n")
    records = list(imports_of("hilbert_lab.curves.orderings", source, known))
    assert [(r.target, r.name, r.in_try) for r in records] == [
        ("hilbert_lab.curves.codec", None, False), ("hilbert_lab.viz.curves", None, False),
        ("hilbert_lab.curves.codec", None, False), ("hilbert_lab.attention.engine", "_plan", True)]
    assert upward_imports(records) == ["hilbert_lab.curves.orderings:3 -> hilbert_lab.viz.curves",
                                       "hilbert_lab.curves.orderings:6 -> hilbert_lab.attention.engine"]
    assert package_cycles(records + [Import("hilbert_lab.viz.curves", "hilbert_lab.curves", None, 1, False)]) == [
        ["curves", "viz", "curves"]]
    assert list(private_attribute_uses("hilbert_lab.viz.x", source, known)) == [
        "hilbert_lab.viz.x:9 uses hilbert_lab.curves.codec._kernel"]
    assert list(private_attribute_uses("hilbert_lab.curves.x", source, known)) == []  # same package


def test_the_module_circle_search_finds_lazy_and_package_circles():
    """module_cycles on made-up sources: a circle closed by a lazy import, and a package whose __init__ imports a
    submodule that takes a sibling from the package."""
    known = {"hilbert_lab.curves", "hilbert_lab.curves.a", "hilbert_lab.curves.b", "hilbert_lab.curves.c",
             "hilbert_lab.viz", "hilbert_lab.viz.figures", "hilbert_lab.viz.style"}
    sources = {
        "hilbert_lab.curves.a": "from hilbert_lab.curves.b import f\n",
        "hilbert_lab.curves.b": "import numpy\n\n\ndef f():\n    import hilbert_lab.curves.c as c\n    return c\n",
        "hilbert_lab.curves.c": "from hilbert_lab.curves.a import g\nfrom hilbert_lab.viz import style\n",
        "hilbert_lab.viz": "from hilbert_lab.viz.figures import draw\n",
        "hilbert_lab.viz.figures": "from hilbert_lab.viz import style\n",
    }

    def records(skip: str = "") -> list[Import]:
        return [record for module, source in sources.items() if module != skip
                for record in imports_of(module, source, known, module.count(".") == 1)]

    assert module_cycles(records()) == [
        "hilbert_lab.curves.a:1 -> hilbert_lab.curves.b:5 -> hilbert_lab.curves.c:1 -> hilbert_lab.curves.a",
        "hilbert_lab.viz:1 -> hilbert_lab.viz.figures:1 -> hilbert_lab.viz"]
    assert module_cycles(records(skip="hilbert_lab.curves.b")) == [module_cycles(records())[1]]
    assert module_cycles(records(skip="hilbert_lab.viz")) == [module_cycles(records())[0]]  # c -> viz is no circle


def test_every_module_belongs_to_a_known_layer():
    places = {package_of(module) for module in all_modules()} - {None}
    assert places <= set(LAYERS) | LEAVES, sorted(places - set(LAYERS) - LEAVES)
    assert {"kernels", "curves", "attention", "bench", "viz", "reports", "cli"} <= places


def test_no_import_runs_up_the_layers():
    records = all_imports()
    assert any(r.module == "hilbert_lab.attention.engine" and r.target.startswith("hilbert_lab.curves")
               for r in records)  # lazy and top-level imports alike are seen
    allowed = {(module, target) for rule, module, target in ALLOWED if rule == "upward"}
    found = [line for line in upward_imports(records)
             if (line.split(":")[0], package_of(line.split(" -> ")[1])) not in allowed]
    assert found == [], "imports running up the layers:\n" + "\n".join(found)


def test_packages_never_import_each_other_in_a_circle():
    cycles = package_cycles(all_imports())
    assert cycles == [], "circles between packages: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_no_module_imports_itself_through_others():
    """No circle of imports between modules, lazy (function-local) imports and package __init__ files included:
    every concept has one home below its users."""
    records = all_imports()
    assert any(r.module == "hilbert_lab.attention.memory" and r.target == "hilbert_lab.attention.selection"
               for r in records)  # a lazy import is an edge too
    cycles = module_cycles(records)
    assert cycles == [], "modules importing themselves through others:\n" + "\n".join(cycles)


def test_no_private_name_of_another_package_is_imported_or_used():
    modules = all_modules()
    known = set(modules)
    found = []
    for record in all_imports():
        other = package_of(record.target) != package_of(record.module)
        names = [record.name] if record.name else []
        if other and any(_private(part) for part in record.target.split(".") + names):
            shown = record.target + (f".{record.name}" if names else "")
            found.append(f"{record.module}:{record.line} imports {shown}")
    for module, path in modules.items():
        found += private_attribute_uses(module, path.read_text(), known, path.name == "__init__.py")
    assert found == [], "private names of other packages:\n" + "\n".join(found)


def test_no_other_package_is_imported_under_try():
    found = [f"{r.module}:{r.line} -> {r.target}" for r in all_imports()
             if r.in_try and package_of(r.target) not in (None, package_of(r.module))
             and ("try", r.module, package_of(r.target)) not in ALLOWED]
    assert found == [], "imports of another package under try/except:\n" + "\n".join(found)


@pytest.mark.parametrize("listed", sorted(ONE_ALGORITHM_MODULES))
def test_one_algorithm_modules_exist(listed):
    assert (PACKAGE.parent / listed).is_file(), f"{listed} is listed but does not exist"


def test_modules_stay_under_the_line_limit():
    exempt = set(ONE_ALGORITHM_MODULES)
    found = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE.parent).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and relative not in exempt:
            found[relative] = lines
    assert found == {}, f"modules over {MAX_LINES} lines: {found}"
