"""The package's version: the installed distribution's, or in a source checkout the one in pyproject.toml."""

from __future__ import annotations

import re
from pathlib import Path

#: what a checkout without pyproject.toml (or a copy of the modules alone) says
UNKNOWN = "0+unknown"


def package_version() -> str:
    """``importlib.metadata``'s version of ``unihub``; where it is not installed (a checkout on
    ``PYTHONPATH``), the ``version = "..."`` of the pyproject.toml beside this file."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("unihub")
    except PackageNotFoundError:
        return checkout_version(Path(__file__).with_name("pyproject.toml"))


def checkout_version(pyproject: Path) -> str:
    """The ``[project]`` version in ``pyproject`` (read as text: ``tomllib`` is Python 3.11+)."""
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return UNKNOWN
    project = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    found = re.search(r'^version\s*=\s*["\']([^"\']+)["\']', project.group(1), re.M) if project else None
    return found.group(1) if found else UNKNOWN
