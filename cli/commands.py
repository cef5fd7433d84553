"""The ``unihub`` command line: a thin layer over the library, one subcommand per function (``unihub.cli.main``).

Examples::

    unihub inspect /data/train            # schema, rows, files, row groups, bytes
    unihub inspect /data/train --json     # the same as JSON
    unihub show /data/train --open        # one HTML page: sampled images, statistics, provenance
    unihub demo /tmp/unihub-demo          # the main job: write, convert TFRecord + images, inspect, train
    unihub convert 'train-*.tfrecord' /data/train          # TFRecord -> unihub (format detected)
    unihub convert 'raw/*.tfrecord' /data/train --append   # only the files not converted yet, a new version
    unihub inspect /data/train --versions                  # the versions; unihub vacuum /data/train --keep 10
    unihub convert /data/train shards/ --to webdataset     # unihub -> WebDataset tar shards
    unihub verify /data/images /data/train                 # exit 0 only when equal
    unihub copy /data/train /data/small --field-regex 'id' 'image.*' --not-null-fields label
    unihub add-schema /data/spark_out --schema schema.json --petastorm-compatible
    unihub throughput /data/train --field-regex image label -w 4 -n 2000
    unihub COMMAND --help                  # each command's options and examples
    eval "$(unihub completion bash)"       # complete commands, options and formats (pip install 'unihub[cli]')

A :class:`~unihub.errors.UnihubError` prints as one line and exits 1 (``--verbose`` shows the
traceback); usage errors exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from unihub.cli.cache import add_cache_commands
from unihub.cli.columns import add_columns_commands
from unihub.cli.completion import add_completion_command, autocomplete
from unihub.cli.conversion import add_add_schema_command, add_convert_command, add_copy_command, add_verify_command
from unihub.cli.main_job import add_demo_command
from unihub.cli.reading import add_inspect_command, add_show_command, add_throughput_command
from unihub.cli.terminal import PrintableStream, printable
from unihub.cli.versions import add_adopt_command, add_compact_command, add_delete_command, add_vacuum_command
from unihub.errors import UnihubError
from unihub.fs.outputs import DISK_ERRORS, output_error, path_of
from unihub.runtime import interrupts
from unihub.version import package_version


def _top_examples() -> str:
    """The examples of this module's docstring, as ``unihub --help`` shows them."""
    import textwrap

    block = (__doc__ or "").split("Examples::\n\n", 1)[-1].split("\n\n", 1)[0]
    return "examples:\n" + textwrap.indent(textwrap.dedent(block), "  ")


#: each subcommand's registration, in the order ``unihub --help`` lists them
#: what ``unihub --help`` says first (the module docstring above is for the code's readers)
DESCRIPTION = ("Convert datasets between TFRecord, HDF5, WebDataset, image folders and Parquet with a\n"
               "Unischema; inspect, verify, copy and grow them.")

_COMMANDS = (add_cache_commands, add_columns_commands, add_completion_command, add_inspect_command,
             add_show_command, add_demo_command, add_convert_command, add_verify_command, add_copy_command,
             add_add_schema_command, add_throughput_command, add_vacuum_command, add_delete_command,
             add_compact_command, add_adopt_command)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="unihub", description=DESCRIPTION,
                                     epilog=_top_examples(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verbose", action="store_true", help="show tracebacks of errors (also after the command)")
    parser.add_argument("--version", action="version", version=f"unihub {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add_commands in _COMMANDS:
        add_commands(sub)
    return parser


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush does not fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (captured): nothing to flush into a closed pipe
        pass


def _one_line_warnings(verbose: bool) -> Any:
    """Warnings printed as ``unihub: warning: ...`` lines (with ``--verbose``, Python's usual form with the
    source line); only their format changes, so a caller's recorder (pytest, a notebook) still gets them.
    Returns the previous ``warnings.formatwarning`` to restore."""
    import warnings

    previous = warnings.formatwarning
    if not verbose:
        def one_line(message: Any, category: Any, filename: str, lineno: int, line: Any = None) -> str:
            return f"unihub: warning: {printable(str(message))}\n"

        warnings.formatwarning = one_line
    return previous


def _accept_verbose_after_the_command(parser: argparse.ArgumentParser) -> None:
    """``unihub convert A B --verbose`` as well as ``unihub --verbose convert A B``."""
    for action in parser._subparsers._group_actions if parser._subparsers else []:  # noqa: SLF001
        for sub in getattr(action, "choices", {}).values():
            sub.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                             help="show tracebacks of errors")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``unihub`` console script."""
    import warnings

    parser = build_parser()
    _accept_verbose_after_the_command(parser)
    autocomplete(parser)  # answers the shell and exits, when the shell is asking
    args, extra = parser.parse_known_args(argv)
    if extra:
        _refuse_extra_arguments(parser, args, extra, argv)
    previous = _one_line_warnings(args.verbose)
    stdout, sys.stdout = sys.stdout, PrintableStream(sys.stdout)  # a dataset's names cannot drive the terminal
    try:
        with interrupts.raised():  # Ctrl-C and SIGTERM unwind the command, which removes what it staged
            return _run(args)
    except KeyboardInterrupt as stop:  # one landing between _run's own lines
        print(interrupts.last_line(stop), file=sys.stderr)
        return interrupts.exit_code(stop)
    finally:
        warnings.formatwarning = previous
        sys.stdout = stdout


#: the commands that take exactly two paths, SRC then DST
_TWO_PATHS = ("convert", "verify")


def _refuse_extra_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str],
                            argv: Sequence[str] | None) -> None:
    """argparse's usage error (exit 2) for arguments no command takes; for paths past SRC and DST,
    one that says why it happens: a glob the shell expanded, which must be quoted."""
    paths = [arg for arg in extra if not arg.startswith("-")]
    if getattr(args, "command", None) in _TWO_PATHS and paths:
        given = [args.src, args.dst, *paths]
        shown = " ".join(given[:4]) + (" ..." if len(given) > 4 else "")
        parser.exit(2, f"unihub: error: {args.command} takes one SRC and one DST, but {len(given)} paths were given "
                       f"({shown}): the shell expanded an unquoted glob; quote it so that unihub expands it, e.g. "
                       f"unihub {args.command} '{_glob_of(given)}' DST\n")
    parser.parse_args(argv)  # argparse's own message for the rest (it exits)


def _glob_of(paths: list[str]) -> str:
    """A glob matching what the shell listed, to show in the message: their directory and extension."""
    folder = os.path.dirname(paths[0])
    exts = {os.path.splitext(p)[1] for p in paths}
    pattern = "*" + (exts.pop() if len(exts) == 1 else "")
    return os.path.join(folder, pattern) if folder else pattern


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args) or 0)
    except UnihubError as exc:
        if args.verbose:
            raise
        print(f"unihub: error: {printable(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM (interrupts.Terminated), once the command unwound
        print(interrupts.last_line(stop), file=sys.stderr)
        return interrupts.exit_code(stop)
    except BrokenPipeError:  # the reader went away (``unihub inspect DS | head``): stop quietly
        _silence_stdout()
        return 141  # 128 + SIGPIPE, as a program the pipe killed
    except OSError as exc:  # a full disk, a read-only destination, a file too large
        if args.verbose:
            raise
        print(f"unihub: error: {printable(_os_error_line(exc, args))}", file=sys.stderr)
        return 1


#: the argument naming what each command writes
_WRITES = {"convert": "dst", "copy": "dst", "add-schema": "url", "demo": "path", "show": "out"}


def _os_error_line(exc: OSError, args: argparse.Namespace) -> str:
    """One line for an OSError: as :func:`~unihub.fs.outputs.output_error` words it when it is
    the command's destination that could not be written, else the path and the reason."""
    target = getattr(args, _WRITES.get(args.command, ""), None)
    named = output_error(exc, target) if target else None
    if named is not None:
        return str(named)
    path, reason = path_of(exc), os.strerror(exc.errno) if exc.errno else ""
    hint = DISK_ERRORS.get(exc.errno or 0)
    line = f"{path}: {reason}" if path is not None and reason else \
        (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{line}; {hint}" if hint else line


if __name__ == "__main__":
    sys.exit(main())
