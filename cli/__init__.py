"""The ``unihub`` command line (``unihub = unihub.cli:main``): ``commands.py`` builds the parser from each
module's commands and runs the one given (its errors as one line). The commands, a module per job:
``conversion.py`` (``convert``, ``verify``, ``copy``, ``add-schema``), ``reading.py`` (``inspect``, ``show``,
``throughput``), ``versions.py`` (``inspect --versions``, ``vacuum``, ``delete``, ``compact``), ``columns.py``
(``columns``), ``cache.py`` (``cache``), ``main_job.py`` (``demo``; its data from ``demo.py``) and
``completion.py`` (``completion``, shell completion); ``parsers.py`` (every subcommand's parser is built
through ``add_command``; the options several share) and ``storage.py`` (``--storage-option``) serve them."""

from unihub.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
