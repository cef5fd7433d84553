"""The ``unihub`` command line (``unihub = unihub.cli:main``): ``commands.py`` builds the parser and runs each
subcommand; ``parsers.py`` (every subcommand's parser is built through ``add_command``; the options several
share), ``storage.py`` (``--storage-option``), ``completion.py`` (shell completion), ``cache.py``
(``unihub cache``), ``demo.py`` and ``main_job.py`` (``unihub demo``) serve it."""

from unihub.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
