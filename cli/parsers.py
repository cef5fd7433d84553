"""How every ``unihub`` subcommand's parser is built: :func:`add_command` (help, description, arguments in
order, examples under the help) and the arguments several commands share, written once.

A command is declared as data, its arguments in the order ``--help`` lists them::

    add_command(sub, "vacuum", cmd_vacuum, DATASET, STORAGE_OPTION, arg("--keep", type=int, required=True),
                help="remove a dataset's old versions", examples=["unihub vacuum /data/train --keep 10"])
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Arg:
    """One ``add_argument`` call, written down to be made when a command's parser is built."""

    flags: tuple[str, ...]
    settings: Mapping[str, Any]

    def changed(self, *flags: str, **settings: Any) -> Arg:
        """This argument under other flags (when given) or with some settings changed (another help, say)."""
        return Arg(flags or self.flags, {**self.settings, **settings})

    def add_to(self, parser: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup) -> None:  # noqa: SLF001
        """Make the call on ``parser`` (or on a group of its arguments)."""
        parser.add_argument(*self.flags, **self.settings)


@dataclass(frozen=True)
class OneOf:
    """Arguments of which a command takes at most one (argparse's mutually exclusive group)."""

    choices: tuple[Arg, ...]

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add the group and its arguments to ``parser``."""
        group = parser.add_mutually_exclusive_group()
        for choice in self.choices:
            choice.add_to(group)


def arg(*flags: str, **settings: Any) -> Arg:
    """An argument as ``parser.add_argument(*flags, **settings)`` would add it."""
    return Arg(flags, settings)


def one_of(*choices: Arg) -> OneOf:
    """``choices`` as mutually exclusive arguments."""
    return OneOf(choices)


#: the dataset a command works on, a folder or a URL
DATASET = arg("path", help="dataset directory or URL")
#: the dataset, or one Parquet file of it, that a command reads
DATASET_OR_FILE = arg("path", help="dataset directory, Parquet file or URL (file://, s3://, ...)")
#: ``--storage-option KEY=VALUE``, for every command that takes a remote path (read by ``storage_options_of``)
STORAGE_OPTION = arg("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                     help="an fsspec storage option for s3://, gs://... paths (repeatable; JSON values allowed; "
                          "client_kwargs.endpoint_url=http://127.0.0.1:9000 sets a nested one). The endpoint "
                          "can also come from AWS_ENDPOINT_URL or the URL (s3://b/p?endpoint_override=HOST:PORT)")
#: the name of the version a command makes
TAG = arg("--tag", help="a name for the version it makes")
JSON = arg("--json", action="store_true", help="print JSON instead of a table")
QUIET = arg("--quiet", action="store_true", help="no progress bar or summary")


def add_command(commands: Any, name: str, run: Callable[[argparse.Namespace], int] | None, *arguments: Arg | OneOf,
                help: str, description: str | None = None, examples: Sequence[str] = (),
                notes: str = "") -> argparse.ArgumentParser:
    """Add the subcommand ``name`` to ``commands`` (an ``add_subparsers()`` action): ``help`` in the list of
    commands, ``description`` atop its own help, ``arguments`` in order, ``examples`` (and ``notes``) under it.
    ``run`` is what the command does (``None`` for a group of commands, whose parser gets their own)."""
    epilog = "\n".join(["examples:", *(f"  {example}" for example in examples)]) + (f"\n\n{notes}" if notes else "")
    parser = commands.add_parser(name, help=help, description=description, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    for argument in arguments:
        argument.add_to(parser)
    if run is not None:
        parser.set_defaults(func=run)
    return parser
