"""Report registry: report name -> notebook + default parameters (read from its `parameters` cell)."""
from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
REPORT_NOTEBOOK_DIR = NOTEBOOK_DIR / "reports"


@dataclass(frozen=True)
class ReportSpec:
    """One named report: a notebook, or a suite of other reports.

    `overrides` replace the notebook's own defaults (the suite's parts use them for small CPU sizes).
    `measures_speed`: its findings compare timings taken on this machine, so a suite runs it with nothing beside
    it; a suite runs its other parts side by side, one per core (two at most).
    """

    name: str
    description: str
    notebook: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    parts: tuple[str, ...] = ()
    measures_speed: bool = False

    @property
    def is_suite(self) -> bool:
        return bool(self.parts)


# CPU-sized overrides used by the "default" suite (make report): under 3 minutes on 2 cores in total.
_SMALL_BENCHMARK = {
    "device": "cpu",
    "dtype": "float32",
    "seq_lens": [512, 2048],
    "modes": ["longnet"],
    "orderings": ["identity", "hilbert"],
    "backends": ["auto", "manual"],
    "num_heads": 4,
    "head_dim": 32,
    "repeats": 10,
    "ab_repeats": 21,
    "save_png": False,  # the page draws its figures from metrics.json; kaleido would start a browser per PNG
}
_SMALL_CLAIMS = {"device": "cpu", "max_tokens": 2048, "repeats": 5, "save_png": False}
# exact locality on smaller data sets (the largest ones dominate the time), the committed trained results as they are
_SMALL_SERIALIZATION = {"grids": [[64, 64], [128, 128], [16, 32, 32]],
                        "point_clouds": {"uniform 3D": 16384, "clustered 3D": 16384}, "timing_grid": [512, 512],
                        "save_png": False}

REPORTS: dict[str, ReportSpec] = {
    spec.name: spec
    for spec in (
        ReportSpec(
            "benchmark",
            "backends x sequence lengths x modes x orderings: time, useful TFLOP/s, peak memory, scaling",
            REPORT_NOTEBOOK_DIR / "benchmark_report.ipynb",
            measures_speed=True,
        ),
        ReportSpec(
            "benchmark-small",
            "the benchmark report at CPU sizes (a few seconds per configuration on 2 cores)",
            REPORT_NOTEBOOK_DIR / "benchmark_report.ipynb",
            overrides=_SMALL_BENCHMARK,
            measures_speed=True,
        ),
        ReportSpec(
            "locality",
            "cache locality of token orderings: miss curves, reuse distances, block density",
            REPORT_NOTEBOOK_DIR / "locality_report.ipynb",
        ),
        ReportSpec(
            "claims",
            "the claims of an earlier Hilbert dilated-attention implementation (hilbert_lab/reports/claims.md) measured: claimed vs "
            "measured, verdict, why",
            REPORT_NOTEBOOK_DIR / "claims_report.ipynb",
            measures_speed=True,
        ),
        ReportSpec(
            "claims-small",
            "the claims report capped at 2048 tokens (CPU minutes); longer claims are listed as not run",
            REPORT_NOTEBOOK_DIR / "claims_report.ipynb",
            overrides=_SMALL_CLAIMS,
            measures_speed=True,
        ),
        ReportSpec(
            "training",
            "LongNet training runs (reports/results/train_*.json): loss/accuracy curves, final evals, ring vs 1 GPU",
            REPORT_NOTEBOOK_DIR / "training_report.ipynb",
        ),
        ReportSpec(
            "serialization",
            "serialized attention on images, videos and point clouds: exact locality per ordering and window, "
            "trained accuracy per ordering (reports/results/serialization_*.json)",
            REPORT_NOTEBOOK_DIR / "serialization_report.ipynb",
        ),
        ReportSpec(
            "serialization-small",
            "the serialization report with the exact locality on smaller data sets (CPU seconds)",
            REPORT_NOTEBOOK_DIR / "serialization_report.ipynb",
            overrides=_SMALL_SERIALIZATION,
        ),
        ReportSpec(
            "default",
            "the CPU reports end to end (benchmark-small, locality, claims-small, training, serialization-small): "
            "what `make report` runs",
            parts=("benchmark-small", "locality", "claims-small", "training", "serialization-small"),
        ),
    )
}


def list_reports() -> list[ReportSpec]:
    """All registered reports, in registration order."""
    return list(REPORTS.values())


def get_report(name: str) -> ReportSpec:
    """The report called `name`; ValueError naming the known reports otherwise."""
    if name not in REPORTS:
        raise ValueError(f"report name must be one of {sorted(REPORTS)}, got {name!r}")
    return REPORTS[name]


def notebook_parameters(notebook: Path) -> dict[str, Any]:
    """Literal assignments of the cell tagged `parameters` in `notebook`, in order."""
    data = json.loads(Path(notebook).read_text(encoding="utf-8"))
    for cell in data["cells"]:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            parameters: dict[str, Any] = {}
            for node in ast.parse(source).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    parameters[node.targets[0].id] = ast.literal_eval(node.value)
            return parameters
    raise ValueError(f"notebook {notebook} has no cell tagged 'parameters'")


def report_parameters(name: str) -> dict[str, Any]:
    """Default parameters of report `name` (a suite: {part: parameters})."""
    spec = get_report(name)
    if spec.is_suite:
        return {part: report_parameters(part) for part in spec.parts}
    assert spec.notebook is not None
    return {**notebook_parameters(spec.notebook), **spec.overrides}


def _coerce(key: str, value: Any, default: Any) -> Any:
    """Check `value` against the type of `default` (int -> float widening allowed)."""
    if default is None or value is None:
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"parameter {key} must be true or false, got {value!r}")
        return value
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(default, (list, tuple)):
        if not isinstance(value, (list, tuple)):
            value = [value]
        return list(value)
    if not isinstance(value, type(default)) or isinstance(value, bool) != isinstance(default, bool):
        raise ValueError(
            f"parameter {key} must be of type {type(default).__name__} (default {default!r}), got {value!r}"
        )
    return value


def parse_parameter_overrides(assignments: list[str], defaults: dict[str, Any]) -> dict[str, Any]:
    """Parse `key=value` strings (values in YAML: 3, 0.5, [256, 512], cpu) against `defaults`.

    Unknown keys and values of the wrong type raise ValueError naming the allowed keys / type.
    """
    overrides: dict[str, Any] = {}
    for assignment in assignments:
        if "=" not in assignment:
            raise ValueError(f"parameter must be written key=value, got {assignment!r}")
        key, text = assignment.split("=", 1)
        key = key.strip()
        if key not in defaults:
            raise ValueError(f"parameter {key!r} is not one of {sorted(defaults)}")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError as error:
            raise ValueError(f"parameter {key}: cannot parse value {text!r}: {error}") from None
        overrides[key] = _coerce(key, value, defaults[key])
    return overrides
