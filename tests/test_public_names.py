"""Every name the README and the package pages in docs/ show resolves, so that moving code cannot break a
documented name silently.

Read from README.md and docs/*.md: the imports in their python code blocks (`from hilbert_lab... import ...`,
`import hilbert_lab...`), every dotted `hilbert_lab.x.y` name (code blocks and inline code), inline
`package.name` spans of a hilbert_lab package (`kernels.cuda_curves`), the calls shown in inline code
of a section titled with its package (`encode(...)` under "(`hilbert_lab.curves`)") or anywhere on the
package's own page (docs/curves.md: found in the package or one of its modules), every `.py` / `.md` path
in inline code (a file of the repository, of hilbert_lab/ or of benchmarks/) and every relative link target.
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
PAGES = {"README.md": README, **{f"docs/{path.name}": path.read_text() for path in sorted((REPO / "docs").glob("*.md"))}}

DOTTED = re.compile(r"\bhilbert_lab(?:\.[A-Za-z_]\w*)+")


def code_blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S)


def inline_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))


CODE_BLOCKS = code_blocks(README)
INLINE = inline_spans(README)


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


def imported_names(text: str = README) -> list[str]:
    """`module.name` for each name imported from hilbert_lab in the python code blocks."""
    names = []
    for language, code in code_blocks(text):
        if language != "python":
            continue
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hilbert_lab":
                names += [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names += [alias.name for alias in node.names if alias.name.split(".")[0] == "hilbert_lab"]
    return names


def dotted_names(text: str = README) -> list[str]:
    found = set()
    for _, code in code_blocks(text):
        found.update(DOTTED.findall(code))
    for span in inline_spans(text):
        found.update(DOTTED.findall(span))
        head = re.match(r"([a-z]+)\.([A-Za-z_]\w*)\b", span)
        if head and head.group(1) in PACKAGES:
            found.add(f"hilbert_lab.{head.group(0)}")
    return sorted(found)


def _calls(package: str, body: str) -> set[tuple[str, str]]:
    calls = set()
    for span in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", body, flags=re.S)):
        match = re.match(r"([A-Za-z_]\w*)\(", span)
        if match and not span.startswith(("hilbert_lab", "python")):
            calls.add((package, match.group(1)))
    return calls


def section_calls(text: str = README, page: str = "README.md") -> list[tuple[str, str]]:
    """(package, name) for each `name(` in inline code of a section whose title names (`hilbert_lab.X`),
    and on a package's own page (docs/X.md), anywhere."""
    calls = set()
    stem = Path(page).stem
    if page.startswith("docs/") and stem in PACKAGES:
        calls |= _calls(stem, text)
    for title, body in re.findall(r"^### ([^\n]*)\n(.*?)(?=^##)", text + "\n##", flags=re.S | re.M):
        packages = re.findall(r"`hilbert_lab\.(\w+)`", title)
        if len(packages) == 1:
            calls |= _calls(packages[0], body)
    return sorted(calls)


def file_paths(text: str = README) -> list[str]:
    return sorted({span for span in inline_spans(text)
                   if span.endswith((".py", ".md")) and not any(mark in span for mark in "*< ")})


def link_targets(text: str) -> list[str]:
    """Relative targets of the markdown links [text](target)."""
    return sorted({target for target in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in target})


def test_the_pages_show_names_of_each_kind():
    """The parsing finds what the pages show (a rewrite that hides them fails here first)."""
    every = "\n".join(PAGES.values())
    assert "hilbert_lab.dilated_attention" in imported_names(README)
    assert "hilbert_lab.curves.segment_permutation" in imported_names(README)
    assert "hilbert_lab.bench.stats" in dotted_names(every) and "hilbert_lab.attention.memory" in dotted_names(every)
    assert ("curves", "gilbert") in section_calls(PAGES["docs/curves.md"], "docs/curves.md")
    assert ("locality", "lru_misses") in section_calls(PAGES["docs/locality.md"], "docs/locality.md")
    assert "attention/selection.py" in file_paths(every) and "docs/INTERFACES.md" in file_paths(README)
    assert "reports/results/retrieval_grid_h100.json" in link_targets(README)
    for missing in ("hilbert_lab.curves.no_such_name", "hilbert_lab.no_such_package.name"):
        with pytest.raises(AttributeError):
            resolve(missing)


def _each_page(collect):
    return sorted({(page, item) for page, text in PAGES.items() for item in collect(text, page)})


@pytest.mark.parametrize("page,name", _each_page(lambda text, page: imported_names(text) + dotted_names(text)))
def test_documented_name_resolves(page, name):
    resolve(name)


@pytest.mark.parametrize("page,call", _each_page(section_calls))
def test_call_shown_in_a_package_section_exists(page, call):
    package, name = call
    module = importlib.import_module(f"hilbert_lab.{package}")
    if hasattr(module, name):
        return
    for info in pkgutil.walk_packages(module.__path__, prefix=f"{module.__name__}."):
        if info.name.endswith(".__main__"):  # an entry point runs when imported
            continue
        try:
            submodule = importlib.import_module(info.name)
        except ImportError:  # an optional dependency (Triton, flash-attn) missing here
            continue
        if hasattr(submodule, name):
            return
    pytest.fail(f"{page} shows {name}(...) under hilbert_lab.{package}, which has no such name")


@pytest.mark.parametrize("page,path", _each_page(lambda text, page: file_paths(text)))
def test_documented_file_exists(page, path):
    assert any((root / path).is_file() for root in (REPO, REPO / "hilbert_lab", REPO / "benchmarks")), path


@pytest.mark.parametrize("page,target", _each_page(lambda text, page: link_targets(text)))
def test_link_target_exists(page, target):
    assert (REPO / Path(page).parent / target).exists(), f"{page} links to {target}, which does not exist"


def test_every_package_has_its_page():
    pages = {Path(page).stem for page in PAGES}
    assert {"curves", "attention", "distributed", "locality", "models", "bench", "viz", "reports", "cli",
            "INTERFACES"} <= pages
