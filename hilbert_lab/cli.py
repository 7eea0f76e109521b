"""`hilbert-lab` command line: info, bench, probe, estimate, select, curve, report, train, generate, ring.

Only parsing and dispatch: each package registers its commands (bench/cli.py: info, bench, probe,
estimate, select; curves/cli.py: curve; reports/cli.py: report; models/cli.py: train, generate;
distributed/cli.py: ring).
Bad input exits with code 2 and one line on stderr (a traceback only with --debug). Lists are
comma-separated; output paths follow hilbert_lab.arguments.OUTPUT_RULE.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Sequence

from hilbert_lab.arguments import EXIT_BAD_INPUT, EXIT_INTERRUPTED, OUTPUT_RULE, help_formatter

class CliError(ValueError):
    """Bad command-line input: reported as one line with exit code 2."""


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are one line (exit 2) instead of usage + message."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise CliError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    """The full `hilbert-lab` parser; every command is registered by its package."""
    from hilbert_lab.bench.cli import register_cli as register_bench
    from hilbert_lab.curves.cli import register_cli as register_curve
    from hilbert_lab.distributed.cli import register_cli as register_ring
    from hilbert_lab.models.cli import register_cli as register_train
    from hilbert_lab.models.cli import register_generate_cli as register_generate
    from hilbert_lab.reports.cli import register_cli as register_report

    parser = _Parser(prog="hilbert-lab", formatter_class=help_formatter,
                     description="hilbert_lab: dilated attention with space-filling-curve orderings.",
                     epilog="examples:\n  hilbert-lab info\n  hilbert-lab estimate --seq-len 65536 --backend sdpa\n"
                            "  hilbert-lab bench --seq-len 2048,4096 --backend manual,sdpa --out results.jsonl\n"
                            "  hilbert-lab <command> --help\n\n"
                            "lists are comma-separated (--segment-lengths 2048,4096); bad input exits 2 with one line\n"
                            + textwrap.fill(OUTPUT_RULE, 100))
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")

    register_bench(subparsers)
    register_curve(subparsers)
    register_report(subparsers)
    register_train(subparsers)
    register_generate(subparsers)
    register_ring(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `hilbert-lab` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if getattr(args, "func", None) is None:
            parser.print_help()
            return EXIT_BAD_INPUT
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("hilbert-lab: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ValueError as error:  # CliError, and the library's ValueErrors for bad input
        if debug:
            raise
        message = " ".join(str(error).split()) or type(error).__name__
        if not message.startswith("hilbert-lab"):
            message = f"hilbert-lab: error: {message}"
        print(message, file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
