"""Every name the README shows resolves, so that moving code cannot break a documented name silently.

Read from README.md: the imports in its python code blocks (`from hilbert_lab... import ...`,
`import hilbert_lab...`), every dotted `hilbert_lab.x.y` name (code blocks and inline code), inline
`package.name` spans of a hilbert_lab package (`kernels.cuda_curves`), the calls shown in inline code
of a section titled with its package (`encode(...)` under "(`hilbert_lab.curves`)": found in the
package or one of its modules), and every `.py` / `.md` path in inline code (a file of the repository, of
hilbert_lab/ or of benchmarks/).
"""
from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
PACKAGES = ("kernels", "curves", "attention", "distributed", "locality", "models", "bench", "safety", "viz",
            "reports", "examples")

CODE_BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, flags=re.S)
INLINE = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", README, flags=re.S))
DOTTED = re.compile(r"\bhilbert_lab(?:\.[A-Za-z_]\w*)+")


def resolve(dotted: str):
    """The object `dotted` names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as error:
            if error.name is None or not ".".join(parts[:cut]).startswith(error.name):
                raise  # the module exists but one of its own imports is missing
            continue
        for attribute in parts[cut:]:
            value = getattr(value, attribute)
        return value
    raise ModuleNotFoundError(dotted)


def imported_names() -> list[str]:
    """`module.name` for each name imported from hilbert_lab in the python code blocks."""
    names = []
    for language, code in CODE_BLOCKS:
        if language != "python":
            continue
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hilbert_lab":
                names += [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names += [alias.name for alias in node.names if alias.name.split(".")[0] == "hilbert_lab"]
    return names


def dotted_names() -> list[str]:
    found = set()
    for _, code in CODE_BLOCKS:
        found.update(DOTTED.findall(code))
    for span in INLINE:
        found.update(DOTTED.findall(span))
        head = re.match(r"([a-z]+)\.([A-Za-z_]\w*)\b", span)
        if head and head.group(1) in PACKAGES:
            found.add(f"hilbert_lab.{head.group(0)}")
    return sorted(found)


def section_calls() -> list[tuple[str, str]]:
    """(package, name) for each `name(` in inline code of a section whose title names (`hilbert_lab.X`)."""
    calls = set()
    for title, body in re.findall(r"^### ([^\n]*)\n(.*?)(?=^##)", README + "\n##", flags=re.S | re.M):
        packages = re.findall(r"`hilbert_lab\.(\w+)`", title)
        if len(packages) != 1:
            continue
        for span in re.findall(r"`([^`]+)`", body):
            match = re.match(r"([A-Za-z_]\w*)\(", span)
            if match and not span.startswith(("hilbert_lab", "python")):
                calls.add((packages[0], match.group(1)))
    return sorted(calls)


def file_paths() -> list[str]:
    return sorted({span for span in INLINE if span.endswith((".py", ".md")) and "*" not in span and " " not in span})


def test_the_readme_shows_names_of_each_kind():
    """The parsing finds what the README shows (a README rewrite that hides them fails here first)."""
    assert "hilbert_lab.dilated_attention" in imported_names()
    assert "hilbert_lab.curves.segment_permutation" in imported_names()
    assert "hilbert_lab.bench.stats" in dotted_names() and "hilbert_lab.kernels.cuda_curves" in dotted_names()
    assert ("curves", "gilbert") in section_calls() and ("locality", "lru_misses") in section_calls()
    assert "attention/plan.py" in file_paths() and "docs/INTERFACES.md" in file_paths()
    for missing in ("hilbert_lab.curves.no_such_name", "hilbert_lab.no_such_package.name"):
        with pytest.raises(AttributeError):
            resolve(missing)


@pytest.mark.parametrize("name", imported_names() + dotted_names())
def test_documented_name_resolves(name):
    resolve(name)


@pytest.mark.parametrize("package,name", section_calls())
def test_call_shown_in_a_package_section_exists(package, name):
    module = importlib.import_module(f"hilbert_lab.{package}")
    if hasattr(module, name):
        return
    for info in pkgutil.walk_packages(module.__path__, prefix=f"{module.__name__}."):
        try:
            submodule = importlib.import_module(info.name)
        except ImportError:  # an optional dependency (Triton, flash-attn) missing here
            continue
        if hasattr(submodule, name):
            return
    pytest.fail(f"the README shows {name}(...) under hilbert_lab.{package}, which has no such name")


@pytest.mark.parametrize("path", file_paths())
def test_documented_file_exists(path):
    assert any((root / path).is_file() for root in (REPO, REPO / "hilbert_lab", REPO / "benchmarks")), path
