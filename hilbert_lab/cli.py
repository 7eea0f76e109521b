"""`hilbert-lab` command line: info, bench, probe, estimate, select, curve, report, train, generate, ring.

Only parsing and dispatch: each package registers its commands (bench/cli.py: info, bench, probe,
estimate, select; curves/cli.py: curve; reports/cli.py: report; models/cli.py: train, generate;
distributed/cli.py: ring).
Bad input exits with code 2 and one line on stderr (a traceback only with --debug). Lists are
comma-separated; output paths follow hilbert_lab.arguments.OUTPUT_RULE.
"""
from __future__ import annotations

import argparse
import signal
import sys
import textwrap
import threading
from typing import Sequence

from hilbert_lab.arguments import EXIT_BAD_INPUT, EXIT_INTERRUPTED, OUTPUT_RULE, flag_names, help_formatter

class CliError(ValueError):
    """Bad command-line input: reported as one line with exit code 2."""


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are one line (exit 2) instead of usage + message."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise CliError(f"{self.prog}: {message}")


# Every command: the module whose register_cli adds it, and the one line `hilbert-lab --help` shows for it
# (the same line that module registers; tests/test_cli.py checks they agree). Only the module of the command
# being run is imported, so `hilbert-lab --help` loads no torch, numba or plotly.
COMMANDS: dict[str, tuple[str, str]] = {
    "info": ("hilbert_lab.bench.cli", "hardware, available backends and what 'auto' picks per dtype"),
    "bench": ("hilbert_lab.bench.cli", "run a benchmark matrix safely (isolated cases, append-only JSONL, resume)"),
    "probe": ("hilbert_lab.bench.cli", "find the largest sequence length that runs (doubling, then bisecting)"),
    "estimate": ("hilbert_lab.bench.cli", "estimated peak memory of the engine (and whether it fits)"),
    "select": ("hilbert_lab.bench.cli", "time the backends that run here on one input per shape and store the "
                                        "fastest for select_backend(..., timed=True)"),
    "curve": ("hilbert_lab.curves.cli", "export a curve over a grid as CSV (index,x,y[,z]) or PNG"),
    "report": ("hilbert_lab.reports.cli", "list / inspect / run papermill reports"),
    "train": ("hilbert_lab.models.cli", "train a LongNet LM on the synthetic retrieval task"),
    "generate": ("hilbert_lab.models.cli", "continue prompts with a trained LongNet checkpoint (dilated KV cache)"),
    "ring": ("hilbert_lab.distributed.cli", "ring attention: self-check vs the engine, then tokens/s per rank"),
}


def build_parser(command: str | None = None, *, lazy: bool = False) -> argparse.ArgumentParser:
    """The `hilbert-lab` parser with every command registered by its package.

    lazy=True: only the package of `command` (None: no package) is imported and registers its commands;
    the others are listed by name and summary only (enough for the top-level help and "invalid choice").
    """
    import importlib

    parser = _Parser(prog="hilbert-lab", formatter_class=help_formatter,
                     description="hilbert_lab: dilated attention with space-filling-curve orderings.",
                     epilog="examples:\n  hilbert-lab info\n  hilbert-lab estimate --seq-len 65536 --backend sdpa\n"
                            "  hilbert-lab bench --seq-len 2048,4096 --backend manual,sdpa --out results.jsonl\n"
                            "  hilbert-lab <command> --help\n\n"
                            "lists are comma-separated (--segment-lengths 2048,4096); bad input exits 2 with one line\n"
                            + textwrap.fill(OUTPUT_RULE, 100))
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = COMMANDS.get(command, (None,))[0] if lazy else None
    for module in dict.fromkeys(home for home, _ in COMMANDS.values()):
        if not lazy or module == wanted:
            importlib.import_module(module).register_cli(subparsers)
        else:
            for name, (home, summary) in COMMANDS.items():
                if home == module:
                    subparsers.add_parser(name, help=summary, add_help=False)
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The command named in argv (its first word that is not an option), or None."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `hilbert-lab` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    if hasattr(signal, "SIGXFSZ") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past a file-size limit a write fails (OSError below)
    parser = None
    try:
        parser = build_parser(_command_of(argv), lazy=True)
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
        if parser is not None:  # the library names its parameters; the user typed flags
            message = flag_names(message, parser)
        if not message.startswith("hilbert-lab"):
            message = f"hilbert-lab: error: {message}"
        print(message, file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as error:  # a full disk, a file-size limit, a folder gone: one line, results kept
        if debug:
            raise
        where = f"{error.filename}: " if error.filename else ""
        print(f"hilbert-lab: error: {where}" + " ".join((error.strerror or str(error)).split()), file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
