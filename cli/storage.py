"""The CLI's ``--storage-option KEY=VALUE`` pairs as fsspec storage options, for every subcommand that takes
remote paths (the argument itself is :data:`unihub.cli.parsers.STORAGE_OPTION`)."""

from __future__ import annotations

import argparse
from typing import Any

from unihub.errors import UnihubError
from unihub.schema.metadata_json import parse_json


def storage_options_of(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--storage-option KEY=VALUE`` pairs: a value is JSON where it parses as JSON (``{"endpoint_url":
    ...}``, numbers, true), else text; a dotted key sets a nested one (``client_kwargs.endpoint_url=URL``)."""
    options: dict[str, Any] = {}
    for pair in getattr(args, "storage_option", None) or []:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise UnihubError(f"--storage-option takes KEY=VALUE, got {pair!r}")
        try:
            value = parse_json(text)
        except ValueError:  # not JSON (nested past Python's limit too): the text as it is
            value = text
        *parents, last = key.strip().split(".")
        level = options
        for name in parents:
            level = level.setdefault(name, {})
            if not isinstance(level, dict):
                raise UnihubError(f"--storage-option {key}: {name} is set to a value, not options")
        level[last] = value
    return options or None
