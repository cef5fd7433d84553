"""Petastorm's ``petastorm.fs_utils``: a dataset URL resolved to a filesystem and a path, by unihub's resolver.

``FilesystemResolver(url).filesystem()`` is what Petastorm's was, an object with the fsspec-style methods
(``exists``, ``open``, ``ls``, ``isdir``, ``isfile``, ``rm``, ``mkdir``) that Petastorm's ``pyarrow.localfs``
and its s3fs/gcsfs filesystems share, and that ``pq.ParquetDataset(path, filesystem=...)`` and
``materialize_dataset(..., filesystem_factory=...)`` take. It is made by
:func:`unihub.fs.filesystem.resolve_filesystem` (unihub's timeouts, retries and URL checks) and shown through
fsspec: fsspec's local filesystem for ``file://`` (pyarrow 15 removed ``pyarrow.localfs``), the fsspec
filesystem itself where unihub resolved the URL through fsspec (``storage_options``, ``memory://``, ...), and
pyarrow's own S3, GCS and HDFS filesystems wrapped in fsspec's ``ArrowFSWrapper``::

    resolver = FilesystemResolver("s3://bucket/datasets/train")
    resolver.filesystem().exists(resolver.get_dataset_path())     # 'bucket/datasets/train'

``hdfs://`` goes to pyarrow's ``HadoopFileSystem``, which reads the Hadoop configuration itself:
``hadoop_configuration``, ``connector`` and ``hdfs_driver`` are taken for Petastorm's signature only.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any
from urllib.parse import ParseResult, parse_qsl, urlencode, urlparse, urlunparse

import pyarrow.fs as pafs

from unihub.dependencies import require
from unihub.errors import DatasetUrlError, InvalidArgumentError, UsageError
from unihub.fs.filesystem import resolve_filesystem

#: schemes whose dataset path is the URL's path alone (Petastorm's ``file`` and ``hdfs``; ``viewfs`` as ``hdfs``)
_PATH_ONLY_SCHEMES = ("file", "hdfs", "viewfs")


def get_dataset_path(parsed_url: ParseResult | str) -> str:
    """The path of a (parsed) URL on its filesystem: the URL's path for ``file``/``hdfs``, else
    ``bucket/key`` without a trailing '/' (what s3fs and gcsfs take, and pyarrow's S3 and GCS)."""
    parsed = urlparse(parsed_url) if isinstance(parsed_url, str) else parsed_url
    if parsed.scheme.lower() in _PATH_ONLY_SCHEMES:
        return parsed.path
    return f"{parsed.netloc}{parsed.path}".rstrip("/")


class FilesystemResolver:
    """A dataset URL resolved to a filesystem (Petastorm's class, same arguments and methods).

    The filesystem is made at once, so a URL it cannot serve is refused here: one without a scheme
    and an ``s3://``/``gs://`` one without a bucket are a ``ValueError`` in Petastorm's words. The
    resolver does not pickle (as Petastorm's); :meth:`filesystem_factory` does, for Spark executors.
    """

    def __init__(self, dataset_url: str | ParseResult, hadoop_configuration: Any = None, connector: Any = None,
                 hdfs_driver: str = "libhdfs3", user: str | None = None,
                 storage_options: dict[str, Any] | None = None) -> None:
        parsed = urlparse(dataset_url) if isinstance(dataset_url, str) else dataset_url
        url = dataset_url if isinstance(dataset_url, str) else urlunparse(dataset_url)
        _check_url(parsed, url)
        self._dataset_url = url
        self._parsed_dataset_url = parsed
        self._filesystem_factory = functools.partial(
            _fsspec_filesystem, _with_user(parsed, user) or url, dict(storage_options) if storage_options else None)
        self._filesystem = self._filesystem_factory()

    def parsed_dataset_url(self) -> ParseResult:
        """The URL, parsed by ``urllib.parse.urlparse``."""
        return self._parsed_dataset_url

    def get_dataset_path(self) -> str:
        """The dataset's path on :meth:`filesystem` (see :func:`get_dataset_path`)."""
        return get_dataset_path(self._parsed_dataset_url)

    def filesystem(self) -> Any:
        """The filesystem (fsspec's interface; the same object on every call)."""
        return self._filesystem

    def filesystem_factory(self) -> functools.partial[Any]:
        """A picklable function that makes the filesystem again (on a Spark executor, say); it holds the
        URL and storage options, not the resolver."""
        return self._filesystem_factory

    def __getstate__(self) -> dict[str, Any]:
        raise UsageError("Pickling FilesystemResolver is not supported as it may contain some a file-system instance "
                         "objects that do not support pickling but do not have anti-pickling protection; pickle "
                         "its filesystem_factory() instead")  # Petastorm's words first


def get_filesystem_and_path_or_paths(url_or_urls: str | Sequence[str], hdfs_driver: str = "libhdfs3",
                                     storage_options: dict[str, Any] | None = None,
                                     filesystem: Any = None) -> tuple[Any, str | list[str]]:
    """``(filesystem, path)`` for a URL, ``(filesystem, [paths])`` for a list of URLs of one scheme and host.

    The filesystem is ``filesystem`` when given (returned as it is), else :class:`FilesystemResolver`'s
    for the first URL; ``hdfs_driver`` is taken for Petastorm's signature::

        fs, paths = get_filesystem_and_path_or_paths(["file:///d/0.parquet", "file:///d/1.parquet"])
    """
    urls = [url_or_urls] if isinstance(url_or_urls, str) else list(url_or_urls)
    if not urls:
        raise DatasetUrlError("dataset url list must be non-empty: an empty list of URLs names no files")
    parsed = [urlparse(url) for url in urls]
    if any((p.scheme, p.netloc) != (parsed[0].scheme, parsed[0].netloc) for p in parsed):
        raise InvalidArgumentError("The dataset url list must contain url with the same scheme and netloc. "
                                   f"Got {sorted({f'{p.scheme}://{p.netloc}' for p in parsed})}")
    fs = filesystem if filesystem is not None else \
        FilesystemResolver(urls[0], hdfs_driver=hdfs_driver, storage_options=storage_options).filesystem()
    paths = [get_dataset_path(p) for p in parsed]
    return fs, (paths[0] if isinstance(url_or_urls, str) else paths)


def normalize_dir_url(dataset_url: str) -> str:
    """``dataset_url`` without one trailing '/' (``file:///data/ds/`` -> ``file:///data/ds``)."""
    if not isinstance(dataset_url, str) or not dataset_url:
        raise InvalidArgumentError(f"directory url must be a string, not empty; got {dataset_url!r}")
    return dataset_url[:-1] if dataset_url.endswith("/") else dataset_url


def fsspec_view(fs: pafs.FileSystem) -> Any:
    """``fs`` (one :func:`resolve_filesystem` made) with fsspec's interface: fsspec's own filesystem where
    there is one (local, or the one ``fs`` wraps), else ``fs`` in fsspec's ``ArrowFSWrapper``."""
    fsspec = require("fsspec", extra="fsspec", purpose="Petastorm's FilesystemResolver")
    if isinstance(fs, pafs.LocalFileSystem):
        return fsspec.filesystem("file")
    handler = fs.handler if isinstance(fs, pafs.PyFileSystem) else None
    if isinstance(handler, pafs.FSSpecHandler):
        return handler.fs
    arrow = require("fsspec.implementations.arrow", extra="fsspec", purpose="Petastorm's FilesystemResolver")
    return arrow.ArrowFSWrapper(fs)


def _fsspec_filesystem(url: str, storage_options: dict[str, Any] | None) -> Any:
    """The filesystem of ``url`` (a :class:`FilesystemResolver`'s factory: module level, so it pickles)."""
    return fsspec_view(resolve_filesystem(url, storage_options=storage_options)[0])


def _check_url(parsed: ParseResult, url: str) -> None:
    """Petastorm's refusals: a URL without a scheme; a bucket URL without its bucket."""
    if not parsed.scheme:
        raise DatasetUrlError(f"ERROR! A scheme-less dataset url ({url}) is no longer supported. Please prepend "
                              '"file://" for local filesystem.')  # Petastorm's words, with the URL
    if parsed.scheme.lower() not in _PATH_ONLY_SCHEMES and not parsed.netloc:
        raise DatasetUrlError(f"URLs must be of the form {parsed.scheme}://bucket/path; got {url!r}")


def _with_user(parsed: ParseResult, user: str | None) -> str | None:
    """An ``hdfs://`` URL with ``user`` as the ``user=`` parameter pyarrow's HDFS client takes; None where
    there is nothing to add."""
    if user is None or parsed.scheme.lower() not in ("hdfs", "viewfs"):
        return None
    query = [(k, v) for k, v in parse_qsl(parsed.query, keep_blank_values=True) if k != "user"]
    return urlunparse(parsed._replace(query=urlencode([*query, ("user", user)])))
