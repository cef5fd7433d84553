"""cli/parsers.py: every subcommand's parser is built through add_command, from shared arguments."""

from __future__ import annotations

import argparse

import pytest

from unihub.cli import build_parser
from unihub.cli.parsers import DATASET, QUIET, STORAGE_OPTION, add_command, arg, one_of
from unihub.cli.storage import storage_options_of


def _run(args: argparse.Namespace) -> int:
    return 0


def test_add_command_adds_the_arguments_in_order_with_examples_under_the_help() -> None:
    commands = argparse.ArgumentParser(prog="unihub").add_subparsers(dest="command")
    parser = add_command(commands, "trim", _run, DATASET, one_of(arg("--first", action="store_true"),
                                                                 arg("--last", action="store_true")),
                         STORAGE_OPTION, help="trim a dataset", description="Trim it.",
                         examples=["unihub trim /data/train", "unihub trim /data/train --last"], notes="more notes")
    assert [a.dest for a in parser._actions] == ["help", "path", "first", "last", "storage_option"]
    assert parser.epilog == "examples:\n  unihub trim /data/train\n  unihub trim /data/train --last\n\nmore notes"
    args = parser.parse_args(["/data/train", "--storage-option", "anon=true"])
    assert args.func is _run and args.path == "/data/train" and args.storage_option == ["anon=true"]
    with pytest.raises(SystemExit):
        parser.parse_args(["/data/train", "--first", "--last"])  # one of them at most


def test_a_changed_shared_argument_leaves_the_shared_one_as_it_was() -> None:
    quiet = QUIET.changed(help="no progress line")
    url = DATASET.changed("url")
    assert quiet.settings["help"] == "no progress line" and quiet.flags == ("--quiet",)
    assert QUIET.settings["help"] == "no progress bar or summary" and url.flags == ("url",)
    assert DATASET.flags == ("path",) and url.settings == DATASET.settings


def test_parsers_built_twice_are_the_same() -> None:
    """Building a parser leaves the shared arguments as they were (argparse gets a copy of their settings)."""
    assert build_parser().format_help() == build_parser().format_help()
    helps = [[a.help for a in sub._actions] for parser in (build_parser(), build_parser())
             for action in parser._subparsers._group_actions for sub in action.choices.values()]
    assert helps[: len(helps) // 2] == helps[len(helps) // 2:]


def test_a_storage_option_nested_past_pythons_limit_is_text_as_other_non_json_is() -> None:
    """Before: json.loads' RecursionError escaped, a traceback from every command taking --storage-option."""
    deep = "[" * 100_000
    args = argparse.Namespace(storage_option=[f"token={deep}", "anon=true", "region=eu west"])
    assert storage_options_of(args) == {"token": deep, "anon": True, "region": "eu west"}
