"""Notebooks are committed without outputs and in sync with their jupytext py:percent pairs."""
from __future__ import annotations

from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext", reason="jupytext (notebooks extra) is needed to check the pairs")
nbformat = pytest.importorskip("nbformat", reason="nbformat (notebooks extra) reads the notebooks")

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.rglob("*.ipynb"))
NOTEBOOKS = [path for path in NOTEBOOKS if ".ipynb_checkpoints" not in path.parts]


def _cells(notebook) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(cell.cell_type, cell.source.strip(), tuple(cell.metadata.get("tags", []))) for cell in notebook.cells]


def test_notebooks_exist():
    names = {path.stem for path in NOTEBOOKS}
    expected = {"curve_explorer", "locality_explorer", "attention_explorer", "backend_dashboard",
                "benchmark_report", "locality_report", "claims_report", "training_report"}
    assert expected <= names, f"missing notebooks: {sorted(expected - names)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_outputs_stripped(path: Path):
    notebook = nbformat.read(path, as_version=4)
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {index} has outputs"
            assert cell.execution_count is None, f"{path.name} cell {index} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_jupytext_pair_in_sync(path: Path):
    paired = path.with_suffix(".py")
    assert paired.exists(), f"{path.name} has no py:percent pair (run: jupytext --sync {path})"
    notebook = nbformat.read(path, as_version=4)
    assert "py:percent" in notebook.metadata.get("jupytext", {}).get("formats", ""), f"{path.name} is not paired"
    script = jupytext.read(paired)
    assert _cells(script) == _cells(notebook), f"{path.name} and {paired.name} differ (run: jupytext --sync)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_parameters_cell_tagged(path: Path):
    notebook = nbformat.read(path, as_version=4)
    tagged = [cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path.name} needs exactly one cell tagged 'parameters', has {len(tagged)}"
