"""docs/cli.md and the `hilbert-lab` parser agree: every command and every option of the parser is in the
doc, under the command's own heading, and every flag the doc names is one the parser has."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from hilbert_lab.cli import COMMANDS, build_parser

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*(?![\w])")


def _commands(parser: argparse.ArgumentParser, prefix: str = ""):
    """(command path, parser) for every command and sub-command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield f"{prefix}{name}", child
                yield from _commands(child, f"{prefix}{name} ")


def _shown(parser: argparse.ArgumentParser) -> tuple[set[str], set[str]]:
    """(long flags, positional names) of a command, hidden aliases and --help left out."""
    flags, positionals = set(), set()
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            flags.update(option for option in action.option_strings if option.startswith("--"))
        else:
            positionals.add(action.metavar or action.dest.upper())
    return flags, positionals


def _sections() -> dict[str, str]:
    """command path -> the text under its `### \\`hilbert-lab COMMAND\\`` heading."""
    parts = re.split(r"^### `hilbert-lab ([a-z -]+)`\s*$", DOC.read_text(encoding="utf-8"), flags=re.M)
    return {name: text for name, text in zip(parts[1::2], parts[2::2])}


COMMAND_PARSERS = dict(_commands(build_parser()))


def test_every_command_has_a_row_and_a_section():
    text = DOC.read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z]+)", text, flags=re.M)
    assert rows == list(COMMANDS)
    assert list(_sections()) == list(COMMAND_PARSERS)


@pytest.mark.parametrize("command", list(COMMAND_PARSERS))
def test_each_section_lists_exactly_the_options_of_its_command(command):
    flags, positionals = _shown(COMMAND_PARSERS[command])
    section = _sections()[command]
    assert set(FLAG.findall(section)) == flags, command
    assert all(re.search(rf"`{name}\b", section) for name in positionals), (command, positionals)


def test_every_flag_the_doc_names_exists():
    known = set().union(_shown(build_parser())[0], {"--help"}, *(_shown(parser)[0] for parser in COMMAND_PARSERS.values()))
    unknown = set(FLAG.findall(DOC.read_text(encoding="utf-8"))) - known
    assert not unknown, f"docs/cli.md names flags no command has: {sorted(unknown)}"
