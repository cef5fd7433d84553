"""Resolving a dataset URL to a pyarrow filesystem and a path on it.

Local paths and ``file://`` use pyarrow's local filesystem; ``s3://``, ``gs://``,
``hdfs://`` use pyarrow's own where it has one; anything else, or any URL given
``storage_options``, goes through fsspec wrapped as a pyarrow filesystem.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs as pafs

from unihub.dependencies import require

_PYARROW_SCHEMES = {"s3", "gs", "gcs", "hdfs", "viewfs"}


def resolve_filesystem(url: str, filesystem: Any = None,
                       storage_options: dict[str, Any] | None = None) -> tuple[pafs.FileSystem, str]:
    """``(filesystem, path)`` for ``url``; ``filesystem`` may be pyarrow's or fsspec's."""
    url = os.fspath(url)
    scheme = urlparse(url).scheme if "://" in url else ""
    if filesystem is not None:
        return as_pyarrow_filesystem(filesystem), strip_scheme(url)
    if scheme in ("", "file"):
        path = strip_scheme(url)
        return pafs.LocalFileSystem(), os.path.abspath(path)
    if scheme in _PYARROW_SCHEMES and not storage_options:
        fs, path = pafs.FileSystem.from_uri(url)
        return fs, path
    fsspec = require("fsspec", extra="fsspec", purpose=f"{scheme}:// URLs")
    fs = fsspec.filesystem(scheme, **(storage_options or {}))
    return as_pyarrow_filesystem(fs), strip_scheme(url, keep_netloc=True)


def as_pyarrow_filesystem(filesystem: Any) -> pafs.FileSystem:
    """A pyarrow filesystem for a pyarrow or fsspec filesystem object."""
    if isinstance(filesystem, pafs.FileSystem):
        return filesystem
    return pafs.PyFileSystem(pafs.FSSpecHandler(filesystem))


def strip_scheme(url: str, *, keep_netloc: bool = True) -> str:
    """``s3://bucket/key`` -> ``bucket/key``; ``file:///tmp/x`` -> ``/tmp/x``."""
    if "://" not in url:
        return url
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return parsed.path
    return f"{parsed.netloc}{parsed.path}" if keep_netloc else parsed.path


def join(*parts: str) -> str:
    """Join path parts with '/' (every pyarrow filesystem uses forward slashes)."""
    return "/".join(p.rstrip("/") if i == 0 else p.strip("/") for i, p in enumerate(parts) if p != "")


def exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def is_dir(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type == pafs.FileType.Directory
