"""Parameterized papermill reports: registry, runner, pages rebuilt from metrics/env (render) and the `report` CLI."""
from __future__ import annotations

from hilbert_lab.reports.registry import (
    REPORTS,
    ReportSpec,
    get_report,
    list_reports,
    parse_parameter_overrides,
    report_parameters,
)

__all__ = [
    "REPORTS",
    "ReportSpec",
    "get_report",
    "list_reports",
    "parse_parameter_overrides",
    "report_parameters",
    "render_run",
    "run_report",
    "register_cli",
]


def __getattr__(name: str):
    if name == "run_report":
        from hilbert_lab.reports.runner import run_report

        return run_report
    if name == "render_run":
        from hilbert_lab.reports.render import render_run

        return render_run
    if name == "register_cli":
        from hilbert_lab.reports.cli import register_cli

        return register_cli
    raise AttributeError(f"module 'hilbert_lab.reports' has no attribute {name!r}")
