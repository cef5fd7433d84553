"""The CLI's ``--storage-option KEY=VALUE``: one argument and one parser for every subcommand that
takes remote paths (convert, verify, cache)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from unihub.errors import UnihubError


def add_storage_option(parser: argparse.ArgumentParser) -> None:
    """The ``--storage-option KEY=VALUE`` argument of every subcommand that takes a remote path."""
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an fsspec storage option for s3://, gs://... paths (repeatable; JSON values allowed; "
                             "client_kwargs.endpoint_url=http://127.0.0.1:9000 sets a nested one). The endpoint "
                             "can also come from AWS_ENDPOINT_URL or the URL (s3://b/p?endpoint_override=HOST:PORT)")


def storage_options_of(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--storage-option KEY=VALUE`` pairs: a value is JSON where it parses as JSON (``{"endpoint_url":
    ...}``, numbers, true), else text; a dotted key sets a nested one (``client_kwargs.endpoint_url=URL``)."""
    options: dict[str, Any] = {}
    for pair in getattr(args, "storage_option", None) or []:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise UnihubError(f"--storage-option takes KEY=VALUE, got {pair!r}")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        *parents, last = key.strip().split(".")
        level = options
        for name in parents:
            level = level.setdefault(name, {})
            if not isinstance(level, dict):
                raise UnihubError(f"--storage-option {key}: {name} is set to a value, not options")
        level[last] = value
    return options or None
