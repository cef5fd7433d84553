"""Shell completion of ``unihub``: subcommands, options, formats and format options, through argcomplete.

argcomplete is optional (``pip install 'unihub[cli]'``): without it ``unihub`` runs as ever and
``unihub completion SHELL`` says what to install. The shell asks by running ``unihub`` with
``_ARGCOMPLETE`` set; :func:`autocomplete` answers and exits before anything else runs. Choices
(``--from``/``--to`` formats, pools, ...) come from the parser, which fills them from the registries.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from unihub.cli.parsers import add_command, arg
from unihub.dependencies import require
from unihub.formats.base import FORMATS

SHELLS = ("bash", "zsh", "fish", "tcsh")


def autocomplete(parser: argparse.ArgumentParser) -> None:
    """Answer the shell's completion request and exit, when this run is one (``_ARGCOMPLETE`` set)."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    try:
        import argcomplete
    except ImportError:
        return
    _add_completers(parser)
    argcomplete.autocomplete(parser)


def _add_completers(parser: argparse.ArgumentParser) -> None:
    """``--option`` completes to the formats' option keys (``KEY=``), in every subcommand that has it."""
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for sub in action.choices.values():
                _add_completers(sub)
        elif action.dest == "option":
            action.completer = option_keys  # type: ignore[attr-defined]


def option_keys(prefix: str = "", **_: Any) -> list[str]:
    """``KEY=`` of every format's reading and writing options that start with ``prefix``."""
    import unihub.formats.builtin  # noqa: F401  (registers every format; start-up cost: 0.1 s)

    keys = {key for name in FORMATS for fmt in [FORMATS.get(name)] for key in [*fmt.OPTIONS, *fmt.WRITE_OPTIONS]}
    return sorted(f"{key}=" for key in keys if key.startswith(prefix))


def add_completion_command(sub: Any) -> None:
    """Register ``unihub completion SHELL`` on the CLI's subparsers."""
    add_command(sub, "completion", cmd_completion, arg("shell", choices=SHELLS, help="the shell to complete in"),
                help="print the shell code that completes unihub's commands, options and formats",
                description="Print the code that makes SHELL complete unihub's subcommands, options, formats (--from, "
                            "--to) and format options (--option KEY=). Needs argcomplete: pip install 'unihub[cli]'.",
                examples=["eval \"$(unihub completion bash)\"                  # this bash session (add it to "
                          "~/.bashrc)",
                          "unihub completion zsh > ~/.zfunc/_unihub          # zsh (compinit finds it through fpath)",
                          "unihub completion fish > ~/.config/fish/completions/unihub.fish"])


def cmd_completion(args: argparse.Namespace) -> int:
    argcomplete = require("argcomplete", extra="cli", purpose="shell completion")
    sys.stdout.write(argcomplete.shellcode(["unihub"], shell=args.shell))
    return 0
