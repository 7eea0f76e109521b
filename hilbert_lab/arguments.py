"""argparse value types shared by every `hilbert-lab` command: one list syntax, bounds, devices.

Lists are comma-separated (`--segment-lengths 2048,4096`; spaces around the commas are accepted).
A bad value raises argparse.ArgumentTypeError, which argparse reports as
"argument --flag: <message>" (exit code 2, one line under `hilbert-lab`). Imports nothing from
hilbert_lab, so any command module can use it.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import re
import tempfile
from collections.abc import Mapping
from typing import Callable, Sequence

from hilbert_lab.io import path_problem

DEVICE_SYNTAX = "cpu | cuda | cuda:N"
MAX_SEQ_LEN = 1 << 40  # a bound for parsing only; the memory estimate refuses sizes no device holds
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


def _bounds(minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f"in {minimum}..{maximum}"
    return f">= {minimum}" if minimum is not None else f"<= {maximum}"


_INTEGER = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def parse_int(text: str) -> int:
    """An integer written in ASCII digits with an optional sign (int() would also take "1_0" and other
    scripts' digits such as "٤"); ValueError otherwise."""
    value = str(text).strip()
    if not _INTEGER.fullmatch(value):
        raise ValueError(f"expected an integer in ASCII digits, got {text!r}")
    return int(value)


def parse_float(text: str) -> float:
    """A decimal number in ASCII digits (sign, point, exponent); ValueError otherwise (no "1_0", no
    other scripts' digits, no inf or nan)."""
    value = str(text).strip()
    if not _NUMBER.fullmatch(value):
        raise ValueError(f"expected a number in ASCII digits, got {text!r}")
    return float(value)


def integer(minimum: int | None = 1, maximum: int | None = None) -> Callable[[str], int]:
    """Type for one integer in [minimum, maximum] (None: unbounded on that side), in ASCII digits."""
    def parse(text: str) -> int:
        try:
            value = parse_int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer {_bounds(minimum, maximum)}, got {text!r}") from None
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected an integer {_bounds(minimum, maximum)}, got {text!r}")
        return value
    return parse


def number(minimum: float = 0.0, maximum: float | None = None, *, open_minimum: bool = True) -> Callable[[str], float]:
    """Type for one finite number > minimum (>= with open_minimum=False), <= maximum."""
    low = f"> {minimum:g}" if open_minimum else f">= {minimum:g}"
    allowed = low + (f" and <= {maximum:g}" if maximum is not None else "")

    def parse(text: str) -> float:
        try:
            value = parse_float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a finite number {allowed}, got {text!r}") from None
        too_low = value <= minimum if open_minimum else value < minimum
        if not math.isfinite(value) or too_low or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected a finite number {allowed}, got {text!r}")
        return value
    return parse


def _items(text: str) -> list[str]:
    return [part.strip() for part in str(text).split(",") if part.strip()]


def int_list(minimum: int = 1, maximum: int | None = None) -> Callable[[str], list[int]]:
    """Type for a comma-separated list of integers in [minimum, maximum], at least one."""
    allowed = f"comma-separated integers {_bounds(minimum, maximum)}, e.g. 2048,4096"

    def parse(text: str) -> list[int]:
        try:
            values = [parse_int(part) for part in _items(text)]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}") from None
        if not values or any(v < minimum or (maximum is not None and v > maximum) for v in values):
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}")
        return values
    return parse


def choice_list(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    """Type for a comma-separated list of names from `allowed`, at least one."""
    def parse(text: str) -> list[str]:
        values = _items(text)
        bad = [v for v in values if v not in allowed]
        if not values or bad:
            raise argparse.ArgumentTypeError(f"unknown value(s) {bad or [text]}; allowed: {', '.join(allowed)}")
        return values
    return parse


def choice(allowed: Sequence[str]) -> Callable[[str], str]:
    """Type for one name from `allowed`."""
    def parse(text: str) -> str:
        value = str(text).strip()
        if value not in allowed:
            raise argparse.ArgumentTypeError(f"unknown value {text!r}; allowed: {', '.join(allowed)}")
        return value
    return parse


def device(text: str) -> str:
    """Type for a device name: cpu, cuda or cuda:N (not checked against this machine)."""
    value = str(text).strip()
    if value == "cpu" or re.fullmatch(r"cuda(:[0-9]+)?", value):
        return value
    raise argparse.ArgumentTypeError(f"expected {DEVICE_SYNTAX}, got {text!r}")


def available_device(text: str) -> str:
    """Type for a device that this machine has: cpu, or cuda[:N] with CUDA present and N < device count."""
    value = device(text)
    if value == "cpu":
        return value
    import torch

    if not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{value!r}: CUDA is not available here (torch {torch.__version__}); use cpu")
    index = int(value.split(":")[1]) if ":" in value else 0
    if index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{value!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return value


OUTPUT_RULE = ("outputs: missing folders on an output path are created; a path that cannot be written is "
               "refused (exit 2); results are never overwritten (bench appends to its file and resumes, "
               "train continues a run folder only with --resume, curve and probe refuse an existing file, "
               "each report run gets a new folder)")


def prepare_output(path: str, flag: str, *, folder: bool = False, existing: str = "refuse") -> str:
    """Absolute output path after applying OUTPUT_RULE: its folders exist and are writable.

    folder: the path is a folder (else a file). existing: "refuse" an existing file, or "keep" it
    (the caller appends to it, or decides itself). Raises ValueError naming `flag` otherwise.
    """
    if existing not in ("refuse", "keep"):
        raise ValueError(f"existing must be 'refuse' or 'keep', got {existing!r}")
    problem = path_problem(os.path.expanduser(str(path)), folder=folder, must_exist=False)
    if problem is not None:
        raise ValueError(f"{flag} {path!r} {problem}")
    absolute = os.path.abspath(os.path.expanduser(str(path)))
    if folder:
        directory = absolute
    else:
        if os.path.exists(absolute) and existing == "refuse":
            raise ValueError(f"{flag} {path!r} already exists and results are never overwritten; "
                             "remove it or choose another path")
        directory = os.path.dirname(absolute)
    ancestor = directory
    while not os.path.lexists(ancestor):
        ancestor = os.path.dirname(ancestor)
    problem = path_problem(ancestor, folder=True)
    if problem is not None:
        raise ValueError(f"{flag} {path!r}: {ancestor!r} {problem}")
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as error:
        raise ValueError(f"{flag} {path!r} is not writable: {error.strerror or error}") from None
    if not folder and os.path.exists(absolute) and not os.access(absolute, os.W_OK):
        raise ValueError(f"{flag} {path!r} is not writable")
    return absolute


def input_file(text: str) -> str:
    """Type for a file the command reads: a regular file that exists (not a folder, FIFO, device,
    dangling or looping link, nor a path too long)."""
    problem = path_problem(os.path.expanduser(str(text)))
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text!r} {problem}")
    return str(text)


def default_text(value: object) -> str:
    """A default as it is typed on the command line: lists comma-separated, None in a list as `none`."""
    if isinstance(value, (list, tuple)):
        return ",".join("none" if item is None else str(item) for item in value)
    return str(value)


class DefaultsHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples kept as written; each option's help ends with its default, as typed
    (`(default: 256,512)`), unless the option has none (None, a flag) or its help already names it."""

    def _format_action(self, action: argparse.Action) -> str:
        default = action.default
        shown = (action.option_strings and default is not None and default is not argparse.SUPPRESS
                 and not isinstance(default, bool) and "default" not in (action.help or ""))
        if shown:
            action = copy.copy(action)
            suffix = f"(default: {default_text(default)})".replace("%", "%%")
            action.help = f"{action.help} {suffix}" if action.help else suffix
        return super()._format_action(action)


def help_formatter(prog: str) -> argparse.HelpFormatter:
    """The `hilbert-lab` help layout: descriptions and examples kept as written, defaults shown."""
    return DefaultsHelpFormatter(prog, max_help_position=32)


def add_command(subparsers, name: str, help_text: str, examples: str) -> argparse.ArgumentParser:
    """Add `hilbert-lab NAME` to a parser's subparsers: its help, description and an examples epilog."""
    return subparsers.add_parser(name, help=help_text, description=help_text, formatter_class=help_formatter,
                                 epilog="examples:\n" + examples)


def option_flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Python parameter name -> flag, for the options of `parser` and of every command below it
    (`segment_lengths` -> `--segment-lengths`, `pass_` -> `--pass`); positionals and hidden aliases are left out."""
    flags: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                flags.update(option_flags(child))
        elif action.help is not argparse.SUPPRESS:
            long = [option for option in action.option_strings if option.startswith("--")]
            if long and long[0] != "--help":
                for name in {action.dest, action.dest.rstrip("_"), long[0][2:].replace("-", "_")}:
                    flags.setdefault(name, long[0])
    return flags


def flag_names(message: str, parser: argparse.ArgumentParser | Mapping[str, str]) -> str:
    """`message` (a library error) with the Python parameter names of `parser`'s options (or of a
    {name: flag} mapping) written as their flags: "segment_lengths and dilation_rates must have the same
    length" -> "--segment-lengths and --dilation-rates must ...". A name without "_" is translated only where
    it opens the message followed by "must" ("backend must be one of ...") or is given a value ("dim=30"),
    so plain words stay words."""
    flags = dict(parser) if isinstance(parser, Mapping) else option_flags(parser)

    def replace(match: re.Match) -> str:
        name = match.group(0)
        opens = match.start() == 0 and message[match.end():].startswith(" must ")
        assigned = message[match.end():match.end() + 1] == "="
        if name in flags and ("_" in name or opens or assigned):
            return flags[name]
        return name

    return re.sub(r"(?<![\w\-./'\"])[A-Za-z][A-Za-z0-9_]*(?![\w\-/'\"(])", replace, message)

