"""`hilbert-lab report list | params NAME | run NAME [-p key=value ...] | render RUN_DIR` (registered by hilbert_lab.cli)."""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

from hilbert_lab.arguments import help_formatter, prepare_output
from hilbert_lab.io import path_problem
from hilbert_lab.reports.registry import NOTEBOOK_DIR, get_report, list_reports, parse_parameter_overrides, report_parameters


def _list(_args: argparse.Namespace) -> int:
    specs = list_reports()
    width = max(len(spec.name) for spec in specs)
    for spec in specs:
        target = "suite: " + ", ".join(spec.parts) if spec.is_suite else spec.notebook.relative_to(NOTEBOOK_DIR.parent).as_posix()
        print(f"{spec.name:<{width}}  {spec.description}  [{target}]")
    return 0


def _params(args: argparse.Namespace) -> int:
    print(json.dumps(report_parameters(args.name), indent=1))
    return 0


# Running a report needs the `notebooks` extra; listing and inspecting reports do not.
NOTEBOOK_MODULES = ("papermill", "nbformat", "nbclient", "nbconvert", "ipykernel", "plotly", "pandas")
REPORTS_EXTRA = 'pip install "hilbert-lab[reports]"'


def missing_notebook_modules() -> list[str]:
    """The modules of the `notebooks` extra that this environment lacks."""
    return [name for name in NOTEBOOK_MODULES if importlib.util.find_spec(name) is None]


def _allowed(default: Any) -> tuple[Any, str] | None:
    """(check, words) for an override of a parameter whose default is `default`: a count or size stays
    positive (>= 0 where the default is 0), a list stays non-empty with items like the default's."""
    if isinstance(default, bool):
        return None
    if isinstance(default, int):
        low = 0 if default == 0 else 1
        return (lambda value: value >= low), f"an integer >= {low}"
    if isinstance(default, float) and default > 0:
        return (lambda value: math.isfinite(value) and value > 0), "a finite number > 0"
    if isinstance(default, (list, tuple)) and default:
        kinds = {type(item) for item in default}
        item_rule = _allowed(default[0]) if len(kinds) == 1 else None
        words = "a non-empty list" + (f" of {item_rule[1].replace('an integer', 'integers')}" if item_rule else "")

        def check(value: Any) -> bool:
            return bool(value) and (item_rule is None or all(
                isinstance(item, type(default[0])) and item_rule[0](item) for item in value))
        return check, words
    return None


def check_parameter_ranges(overrides: dict[str, Any], defaults: dict[str, Any]) -> None:
    """ValueError naming the parameter for an override outside what its default allows (_allowed)."""
    for key, value in overrides.items():
        rule = _allowed(defaults.get(key))
        if rule is not None and value is not None and not rule[0](value):
            raise ValueError(f"parameter {key} must be {rule[1]} (default {defaults[key]!r}), got {value!r}")


def _check_number_syntax(assignments: list[str]) -> None:
    for assignment in assignments:
        key, _, text = assignment.partition("=")
        if "_" in text and any(ch.isdigit() for ch in text) and not any(ch.isalpha() for ch in text):
            raise ValueError(f"parameter {key.strip()}: write numbers without '_', got {text!r}")


def _run(args: argparse.Namespace) -> int:
    missing = missing_notebook_modules()
    if missing:
        raise ValueError(f"report run needs the reports extra (missing: {', '.join(missing)}): {REPORTS_EXTRA}")
    from hilbert_lab.reports.runner import report_page, run_report

    spec = get_report(args.name)
    defaults = report_parameters(args.name)
    if spec.is_suite:  # a suite accepts any part's parameter, typed by the first part that has it
        flat: dict = {}
        for part_defaults in defaults.values():
            for key, value in part_defaults.items():
                flat.setdefault(key, value)
        defaults = flat
    _check_number_syntax(args.parameter or [])
    overrides = parse_parameter_overrides(args.parameter or [], defaults)
    check_parameter_ranges(overrides, defaults)
    if args.run_id is not None and (args.run_id in ("", ".", "..") or "/" in args.run_id or "\\" in args.run_id):
        raise ValueError(f"--run-id must be a plain folder name (no '/'), got {args.run_id!r}")
    output_root = prepare_output(args.output_root, "--output-root", folder=True)
    if args.run_id is not None and (Path(output_root) / args.name / args.run_id).exists():
        raise ValueError(f"--run-id {args.run_id!r} already exists under {output_root}/{args.name} and results are "
                         "never overwritten; choose another run id")
    run_dir = run_report(args.name, overrides, output_root=args.output_root, run_id=args.run_id,
                         progress=not args.quiet)
    if not args.quiet:
        print(f"finished {args.name} (its data, executed notebooks and pages are in {run_dir}/); open this page "
              "in a browser:", file=sys.stderr)
    print(report_page(run_dir, args.name))
    return 0


def _render(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hilbert_lab.reports.render import committed_gpu_runs, load_run, render_run, render_suite_index

    problem = path_problem(args.run_dir, folder=True)
    if problem is not None and "does not exist" not in problem:
        raise ValueError(f"run_dir {args.run_dir!r} {problem}")
    run_dir = Path(args.run_dir)
    metrics, _env = load_run(run_dir)
    if "parts" in metrics:  # a suite run: every part's page and the index (with the committed GPU runs)
        parts = list(metrics["parts"])
        path = render_suite_index(run_dir, parts, title=f"hilbert_lab reports ({metrics.get('report', 'suite')})",
                                  gpu_runs=committed_gpu_runs() if metrics.get("report") == "default" else [])
    else:
        if args.out is None:
            path = render_run(run_dir)
        else:  # another page is never overwritten unless asked, and never left half-written (written atomically)
            out = Path(prepare_output(args.out, "--out", existing="keep" if args.force else "refuse"))
            try:
                path = render_run(run_dir, out)
            except OSError as error:  # the page named, whichever of its files failed
                raise OSError(error.errno, error.strerror, str(out)) from None
    print(path)
    return 0


def _dispatch(args: argparse.Namespace) -> int:
    try:
        return args.report_func(args)
    except ValueError as error:
        print("hilbert-lab report: error: " + " ".join(str(error).split()), file=sys.stderr)
        return 2
    except FileNotFoundError as error:  # a wheel install has no notebooks/ folder
        print(f"hilbert-lab report: error: report notebook not found ({error.filename}); reports run from a "
              f"source checkout: pip install -e \".[reports]\"", file=sys.stderr)
        return 2


def register_cli(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    """Add the `report` command to a parent parser's subparsers; sets `func` to the handler."""
    summary = "list / inspect / run papermill reports"
    parser = subparsers.add_parser("report", help=summary, description=summary, formatter_class=help_formatter)
    commands = parser.add_subparsers(dest="report_command", required=True)
    formatted = {"formatter_class": help_formatter}
    commands.add_parser("list", help="registered reports", **formatted).set_defaults(report_func=_list)
    params = commands.add_parser("params", help="default parameters of a report (JSON)", **formatted)
    params.add_argument("name", help="a report name (hilbert-lab report list)")
    params.set_defaults(report_func=_params)
    run = commands.add_parser("run", help="execute a report into OUTPUT_ROOT/NAME/RUN_ID/", **formatted)
    run.add_argument("name", help="a report name (hilbert-lab report list); 'default' is the CPU suite of make report")
    run.add_argument("-p", "--parameter", action="append", metavar="KEY=VALUE",
                     help="override a parameter (YAML value: 3, 0.5, [256,512], cpu); repeatable")
    run.add_argument("--output-root", default="reports", metavar="DIR",
                     help="default: ./reports (created if missing; every run writes a new RUN_ID folder)")
    run.add_argument("--run-id", default=None, help="the run's folder name (default: UTC time + git commit + random "
                     "suffix)")
    run.add_argument("--quiet", action="store_true", help="no progress lines or bars; print only the page's path")
    run.set_defaults(report_func=_run)
    render = commands.add_parser("render", help="rebuild a run's HTML page from its metrics.json + env.json "
                                              "(no re-run; a suite run: every page and index.html)",
                                  formatter_class=help_formatter)
    render.add_argument("run_dir", metavar="RUN_DIR", help="a run folder of `report run` (holds metrics.json, env.json)")
    render.add_argument("--out", default=None, metavar="FILE", help="default: RUN_DIR/NAME.html (rebuilt in place); an existing "
                        "--out file is refused unless --force")
    render.add_argument("--force", action="store_true", help="replace an existing --out file")
    render.set_defaults(report_func=_render)
    parser.set_defaults(func=_dispatch)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Standalone entry: `python -m hilbert_lab.reports ...` (same as `hilbert-lab report ...`)."""
    parser = argparse.ArgumentParser(prog="hilbert-lab")
    register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["report", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)
