"""Resolving a dataset URL to a pyarrow filesystem and a path on it.

Local paths and ``file://`` use pyarrow's local filesystem; ``s3://``, ``gs://``,
``hdfs://`` use pyarrow's own where it has one; anything else, or any URL given
``storage_options``, goes through fsspec wrapped as a pyarrow filesystem. Filesystems made here
get unihub's remote timeouts and retries, and a remote failure through either is a
``RemoteStorageError`` naming the URL (:mod:`unihub.fs.remote`).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlparse, urlunparse

import pyarrow as pa
import pyarrow.fs as pafs

from unihub.dependencies import require
from unihub.errors import InvalidArgumentError, OutputError, UnsupportedFilesystemError
from unihub.fs import atomic, remote
from unihub.fs.uploads import READ_AHEAD_BYTES, UPLOAD_PART_BYTES, abort_uploads

_PYARROW_SCHEMES = {"s3", "gs", "gcs", "hdfs", "viewfs"}
#: pyarrow's object stores: keys are names, taken as written in the URL (:func:`_pyarrow_from_url`)
_OBJECT_SCHEMES = {"s3", "gs", "gcs"}
#: the query parameters pyarrow's filesystems read from an ``s3://`` or ``gs://`` URL
#: (``s3://bucket/key?region=eu-west-1``); any other is refused by name before pyarrow sees the URL
URL_PARAMETERS: dict[str, tuple[str, ...]] = {
    "s3": ("region", "scheme", "endpoint_override", "allow_bucket_creation", "allow_bucket_deletion",
           "tls_ca_file_path", "tls_verify_certificates"),
    "gs": ("scheme", "endpoint_override", "retry_limit_seconds", "project_id"),
}
URL_PARAMETERS["gcs"] = URL_PARAMETERS["gs"]


#: storage options of the conversion under way (see :func:`unihub.fs.sources.using`)
_OPTIONS: dict[str, Any] | None = None


@contextmanager
def storage_options_in_use(storage_options: Mapping[str, Any] | None) -> Iterator[None]:
    """Within this block, :func:`current_options` is ``storage_options`` (what :func:`resolve_filesystem`
    uses for a URL given none)."""
    global _OPTIONS
    before = _OPTIONS
    _OPTIONS = dict(storage_options) if storage_options else None
    try:
        yield
    finally:
        _OPTIONS = before


def current_options() -> dict[str, Any] | None:
    """The storage options :func:`unihub.fs.sources.using` set (for tasks that run elsewhere: Spark executors)."""
    return dict(_OPTIONS) if _OPTIONS else None


def resolve_filesystem(url: str, filesystem: Any = None,
                       storage_options: dict[str, Any] | None = None) -> tuple[pafs.FileSystem, str]:
    """``(filesystem, path)`` for ``url``; ``filesystem`` may be pyarrow's or fsspec's.

    ``storage_options`` go to fsspec, except unihub's remote settings (``unihub_timeout``,
    ``unihub_retries``: see :mod:`unihub.fs.remote`)."""
    url = os.fspath(url)
    scheme = urlparse(url).scheme if "://" in url else ""
    if storage_options is None and filesystem is None and scheme not in ("", "file"):
        storage_options = current_options()  # what a conversion under way was given (sources.using)
    if filesystem is not None:
        refuse_ignored_query(url, "a filesystem")
        return as_pyarrow_filesystem(filesystem), strip_scheme(url)
    if scheme in ("", "file"):
        path = strip_scheme(url)
        return pafs.LocalFileSystem(), os.path.abspath(path)
    settings, storage_options = remote.split_settings(storage_options)
    if scheme in _PYARROW_SCHEMES and not storage_options:
        check_url_parameters(url)
        try:
            with remote.remote_errors(url):  # a region look-up may go to the network
                fs, path = _pyarrow_from_url(url, scheme)
        except pa.ArrowInvalid as exc:  # a parameter's value pyarrow refuses (allow_bucket_creation=maybe)
            raise InvalidArgumentError(f"{remote.public_url(url)}: a query parameter pyarrow refuses: {exc}"
                                       f"{_supported(scheme)}") from None
        return remote.configure_pyarrow(fs, settings), path
    if scheme in _PYARROW_SCHEMES:
        refuse_ignored_query(url, "storage_options")
    fsspec = require("fsspec", extra="fsspec", purpose=f"{scheme}:// URLs")
    try:
        fsspec.get_filesystem_class(scheme)
    except (ValueError, ImportError) as exc:
        raise UnsupportedFilesystemError(f"{remote.public_url(url)}: no filesystem for {scheme}:// URLs ({exc}); "
                                         "a path with a scheme is never taken for a local one") from None
    fs = _fsspec_filesystem(fsspec, url, scheme, remote.fsspec_options(scheme, storage_options, settings))
    return as_pyarrow_filesystem(remote.configure_fsspec(fs), settings), strip_scheme(url, keep_netloc=True)


def _fsspec_filesystem(fsspec: Any, url: str, scheme: str, options: dict[str, Any]) -> Any:
    """fsspec's filesystem for ``scheme`` with ``options``; s3fs's client is made now, so that options it refuses
    (an unknown keyword, an endpoint that is no URL, ``client_kwargs`` that are no mapping) are an
    :class:`InvalidArgumentError` here, not a ``TypeError``, ``ValueError`` or ``AttributeError`` from inside s3fs
    at the first request (a traceback in the CLI); so are botocore's refusals of them (a key without its secret,
    a profile that does not exist). Making the client sends no request."""
    try:
        fs = fsspec.filesystem(scheme, **options)
        if remote.is_s3fs(fs):
            fs.connect()
    except Exception as exc:
        if not isinstance(exc, (TypeError, ValueError, AttributeError)) and \
                type(exc).__module__.split(".")[0] != "botocore":
            raise
        raise InvalidArgumentError(f"{remote.public_url(url)}: storage options that {scheme}:// refuses "
                                   f"({type(exc).__name__}: {exc})") from None
    return fs


def _pyarrow_from_url(url: str, scheme: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's filesystem for ``url`` and the path in it. On ``s3://`` and ``gs://`` the key is the URL's as
    written, as s3fs, gcsfs and ``aws s3`` take it: pyarrow's own parse percent-decodes it (``a%20b`` would name
    ``a b`` here and ``a%20b`` through ``storage_options``) and refuses a space; the filesystem is made from the
    bucket and the query."""
    if scheme not in _OBJECT_SCHEMES:
        return pafs.FileSystem.from_uri(url)
    parsed = urlparse(url)
    fs, _ = pafs.FileSystem.from_uri(urlunparse(parsed._replace(path="")))
    return fs, f"{parsed.netloc}{parsed.path}".rstrip("/")


def check_url_parameters(url: str) -> None:
    """Refuse query parameters of an ``s3://`` or ``gs://`` URL that pyarrow's filesystem does not take
    (:data:`URL_PARAMETERS`), naming them (never their values: the query may hold a secret)."""
    refuse_fragment(url)
    refuse_credentials(url)
    parsed = urlparse(url)
    supported = URL_PARAMETERS.get(parsed.scheme)
    if supported is None:
        return
    unknown = sorted({name for name, _ in parse_qsl(parsed.query, keep_blank_values=True)} - set(supported))
    if unknown:
        raise InvalidArgumentError(f"{remote.public_url(url)}: unsupported query parameter "
                                   f"{', '.join(map(repr, unknown))}{_supported(parsed.scheme)}")


_QUERY_HINTS = {
    "storage_options": "put its settings in storage_options (s3fs: client_kwargs={'endpoint_url': ..., "
                       "'region_name': ...})",
    "a filesystem": "make the filesystem with its settings",
}


def refuse_ignored_query(url: str, given: str) -> None:
    """Refuse a URL's query (``s3://b/k?endpoint_override=...``) beside ``storage_options`` or a filesystem:
    the query is pyarrow's way to set its filesystem, so with either of those it would be dropped, and the data
    read from or written to another store than the URL names. Names the parameters, never their values."""
    if "://" not in url:
        return
    names = sorted({name for name, _ in parse_qsl(urlparse(url).query, keep_blank_values=True)})
    if names:
        raise InvalidArgumentError(
            f"{remote.public_url(url)}: the URL's query ({', '.join(map(repr, names))}) and {given} were both "
            f"given, and the query would be ignored; {_QUERY_HINTS[given]}, or give the query alone")


def refuse_fragment(url: str) -> None:
    """Refuse a URL holding ``#``: URL parsing ends the path there (the fragment names no object), so
    ``s3://bucket/a#b`` would read or write ``bucket/a``, silently another object than the one named."""
    if "://" in url and "#" in url:
        raise InvalidArgumentError(f"{remote.public_url(url)}#...: a URL's path ends at '#' (what follows is a "
                                   f"fragment, no part of a name), so this would read or write "
                                   f"{remote.public_url(url)}; rename the object or folder to a name without '#'")


def refuse_credentials(url: str) -> None:
    """Refuse an ``s3://`` or ``gs://`` URL holding credentials (``s3://KEY:SECRET@bucket/key``, which pyarrow's
    own URL parse takes): the bucket was taken to be ``KEY:SECRET@bucket``, so every call failed with a raw
    ``ArrowInvalid`` (a traceback from the CLI) showing the secret, and a URL is shown in messages and kept in
    metadata. Names the URL without them."""
    parsed = urlparse(url) if "://" in url else None
    if parsed is not None and parsed.scheme in _OBJECT_SCHEMES and "@" in parsed.netloc:
        raise InvalidArgumentError(f"{remote.public_url(url)}: credentials in the URL (the '{parsed.scheme}://"
                                   "KEY:SECRET@BUCKET' form) are refused, as a URL is shown in messages and kept in metadata; "
                                   "pass them as storage_options 'key'/'secret' (--storage-option key=...), the "
                                   "environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) or a profile")


def _supported(scheme: str) -> str:
    return (f" (pyarrow's {scheme}:// filesystem takes {', '.join(URL_PARAMETERS[scheme])}; other settings go in "
            "storage_options, or --storage-option KEY=VALUE on the command line)")


def as_pyarrow_filesystem(filesystem: Any, settings: remote.RemoteSettings | None = None) -> pafs.FileSystem:
    """A pyarrow filesystem for a pyarrow or fsspec filesystem object (``settings``: how often
    an fsspec read cut short is repeated; by default from the environment)."""
    if isinstance(filesystem, pafs.FileSystem):
        return filesystem
    handler = _FSSpecHandler(filesystem)
    handler.retries = (settings or remote.split_settings(None)[0]).retries
    return pafs.PyFileSystem(handler)


class _FSSpecHandler(pafs.FSSpecHandler):
    """pyarrow's fsspec bridge, with directory moves and modification times that work on object stores.

    ``fsspec``'s recursive ``mv`` of a directory on S3 also tries to copy the directory's own
    (nonexistent) key and fails after copying the files; here the files are copied as one
    batch and the source removed afterwards. s3fs and gcsfs report modification times as
    ``LastModified`` / ``updated`` rather than ``mtime``; they are passed on to pyarrow.
    An async fsspec filesystem (s3fs, gcsfs) refuses to run in a forked process (the process
    pool forks), so a child re-creates it from its storage options on first use. Every call, and
    every read or write of a file it opens, turns a network failure or timeout into a
    ``RemoteStorageError`` naming the URL.
    """

    _fs: Any  # the fsspec filesystem
    _pid: int  # the process that made or re-created it

    retries = 0  #: how many times a read cut short is repeated (see remote.read_retrying)

    @property
    def fs(self) -> Any:
        if self._pid != os.getpid():
            self._fs, self._pid = _reopen(self._fs), os.getpid()
        return self._fs

    @fs.setter
    def fs(self, value: Any) -> None:
        self._fs, self._pid = value, os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        # fsspec's pickled form makes the filesystem anew from its storage options, without s3fs's own
        # retries set after (turned off by remote.configure_fsspec): a spawned worker would retry 5 times
        return {**self.__dict__, "_fs_retries": getattr(self._fs, "retries", None)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        retries = state.pop("_fs_retries", None)
        self.__dict__.update(state)
        if retries is not None:
            self._fs.retries = retries

    def move(self, src: str, dest: str) -> None:
        if _is_local(self.fs) or not self.fs.isdir(src):
            super().move(src, dest)
            return
        root = self.fs._strip_protocol(src).rstrip("/")
        sources = [p for p in self.fs.find(root) if p.startswith(root + "/")]
        targets = [f"{dest.rstrip('/')}/{p[len(root) + 1:]}" for p in sources]
        if sources:
            self.fs.copy(sources, targets)
        self.fs.rm(root, recursive=True)
        self.fs.invalidate_cache()

    @staticmethod
    def _create_file_info(path: str, info: dict[str, Any]) -> pafs.FileInfo:
        found = pafs.FSSpecHandler._create_file_info(path, info)
        if found.type != pafs.FileType.File or found.mtime is not None:
            return found
        mtime = next((info[k] for k in ("LastModified", "last_modified", "updated", "mtime") if info.get(k)), None)
        if isinstance(mtime, str):
            mtime = _parse_time(mtime)
        if mtime is None:
            return found
        return pafs.FileInfo(path, found.type, size=found.size, mtime=mtime)

    def url(self, path: str) -> str:
        """``path`` as a URL of this filesystem (``s3://bucket/key``), for error messages."""
        protocol = self.fs.protocol
        scheme = protocol[0] if isinstance(protocol, (tuple, list)) else protocol
        return path if scheme in ("file", "local") else f"{scheme}://{path}"

    def open_input_stream(self, path: str) -> Any:
        return self._open(path, "rb")

    def open_input_file(self, path: str) -> Any:
        return self._open(path, "rb")

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        return self._open(path, "wb")

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        return self._open(path, "ab")

    def _open(self, path: str, mode: str) -> Any:
        """pyarrow's file over the fsspec file, each of whose calls translates remote failures."""
        from pyarrow import PythonFile

        url = self.url(path)
        with remote.remote_errors(url, broad=True):
            if mode == "rb" and not self.fs.isfile(path):
                raise FileNotFoundError(path)
            if mode != "rb":
                remote.before_upload(self.fs)
            handle = self.fs.open(path, mode=mode, **self._buffering(mode))
        return PythonFile(_TranslatingFile(handle, url, self.retries), mode=mode[0])

    def _buffering(self, mode: str) -> dict[str, Any]:
        """How an object store's file buffers: uploads in parts of a few MB, each one request with its
        own timeout (s3fs's default, 50 MB, sent every file under 50 MB in one request that must end
        within the timeout), reads of what is asked plus a little (its default read 50 MB ahead of
        every ranged read: 625 MiB RSS to read one 484 MB object; see :mod:`unihub.fs.uploads`)."""
        if _is_local(self.fs):
            return {}

        if mode == "rb":
            return {"block_size": READ_AHEAD_BYTES, "cache_type": "readahead"}
        return {"block_size": UPLOAD_PART_BYTES}


def _translating(method: Any) -> Any:
    """``method`` of the handler, turning remote failures into ``RemoteStorageError`` naming its path."""

    def call(self: _FSSpecHandler, target: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(target, list):  # get_file_info(paths)
            where = target[0] if target else ""
        else:
            where = target if isinstance(target, str) else getattr(target, "base_dir", "")
        with remote.remote_errors(self.url(where), broad=True):
            return method(self, target, *args, **kwargs)

    call.__name__, call.__doc__ = method.__name__, method.__doc__
    return call


for _name in ("get_file_info", "get_file_info_selector", "create_dir", "delete_dir", "delete_dir_contents",
              "delete_file", "move", "copy_file"):
    setattr(_FSSpecHandler, _name, _translating(getattr(_FSSpecHandler, _name)))


class _TranslatingFile:
    """An fsspec file whose calls (read, seek, write, close...) turn remote failures into
    ``RemoteStorageError``, and whose reads are repeated when an answer is cut short;
    pyarrow's ``PythonFile`` wraps it."""

    def __init__(self, handle: Any, url: str, retries: int) -> None:
        self._handle, self._url, self._retries = handle, url, retries

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._handle, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            with remote.remote_errors(self._url, broad=True):
                if name in ("read", "readinto"):
                    return remote.read_retrying(lambda: value(*args, **kwargs), self._retries)
                return value(*args, **kwargs)

        return call


def _reopen(fs: Any) -> Any:
    """A fresh instance of an fsspec filesystem in this process (sync ones are reused as they are)."""
    if not getattr(fs, "async_impl", False):
        return fs
    make, args = fs.__reduce__()[:2]  # fsspec: (make_instance, (cls, storage_args, storage_options))
    fresh = make(*args)
    if hasattr(fs, "retries"):
        fresh.retries = fs.retries  # set by remote.configure_fsspec, not among the storage options
    return fresh


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return "file" in protocol or "local" in protocol


def _parse_time(text: str) -> Any:
    from datetime import datetime

    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def strip_scheme(url: str, *, keep_netloc: bool = True) -> str:
    """``s3://bucket/key`` -> ``bucket/key``; ``file:///tmp/x`` -> ``/tmp/x``."""
    if "://" not in url:
        return url
    refuse_fragment(url)
    refuse_credentials(url)
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


def move(fs: pafs.FileSystem, src: str, dest: str) -> None:
    """Rename ``src`` (a file or directory) to ``dest``.

    pyarrow's S3 and GCS filesystems move only single objects, so a directory there is
    moved object by object (copy, then delete; not atomic on an object store).
    """
    if fs.type_name not in ("s3", "gcs") or not is_dir(fs, src):
        fs.move(src, dest)
        return
    root = src.rstrip("/")
    for entry in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        if entry.type == pafs.FileType.File:
            fs.copy_file(entry.path, join(dest, entry.path[len(root):]))
    fs.delete_dir(root)


def temporary_sibling(target: str) -> str:
    """A hidden, unique path beside ``target`` to write into before :func:`commit`, named after this
    process so that the next run on ``target`` can tell it from one a killed run left (:func:`settle`)."""
    return atomic.sibling(target, "tmp")


def check_bucket(fs: pafs.FileSystem, path: str, url: str) -> None:
    """Refuse to write ``url`` (``path`` on ``fs``) into an S3 or GCS bucket that does not exist, before anything
    is written: an :class:`~unihub.errors.OutputError` naming the URL and the bucket. unihub makes no buckets
    (through s3fs, making the staging folder created a bucket of a misspelled name; pyarrow's S3 raised a bare
    ``OSError``, or in an export a ``RemoteStorageError`` blaming the retries) unless a URL asks pyarrow to
    (``allow_bucket_creation=true``). A bucket that cannot be looked at (no ``ListBucket`` right) is left to the
    write itself."""
    bucket = _bucket_to_check(fs, path)
    if bucket is None:
        return
    try:
        missing = fs.get_file_info(bucket).type == pafs.FileType.NotFound
    except OSError:
        return
    if missing:
        raise OutputError(f"cannot write {remote.public_url(url)}: the bucket {bucket!r} does not exist; create it "
                          "first (unihub makes no buckets), or check the bucket's name in the URL",
                          code=errno.ENOENT, filename=remote.public_url(url))


def _bucket_to_check(fs: pafs.FileSystem, path: str) -> str | None:
    """The bucket ``path`` lies in where ``fs`` is an S3 or GCS store that would not make it, else None."""
    handler = getattr(fs, "handler", None)
    if isinstance(handler, _FSSpecHandler):
        protocol = handler.fs.protocol
        protocols = set(protocol) if isinstance(protocol, (tuple, list)) else {protocol}
        if not protocols & {"s3", "s3a", "gs", "gcs"}:
            return None
    elif fs.type_name not in ("s3", "gcs"):
        return None
    elif fs.type_name == "s3" and pafs.S3FileSystem.__reduce__(fs)[1][0].get("allow_bucket_creation"):
        return None
    bucket = path.strip("/").split("/")[0]
    return bucket or None


def on_local_disk(fs: pafs.FileSystem) -> bool:
    """Paths on ``fs`` are this machine's paths (pyarrow's local filesystem, or fsspec's wrapped)."""
    if isinstance(fs, pafs.LocalFileSystem):
        return True
    handler = getattr(fs, "handler", None)
    return isinstance(handler, _FSSpecHandler) and _is_local(handler.fs)


def discard(fs: pafs.FileSystem, path: str) -> None:
    """Remove what a failed write left at ``path`` (a staging area or one file), as the last thing the
    write does: on an object store, the multipart uploads still open under it are aborted first, so
    that a last step the server runs late cannot create a file after the removal, and ``path`` is
    looked at once more after a moment (a task being cancelled may still write into it). Best effort:
    where the store fails too, the write's own error is the one to report, and the next run's
    :func:`settle` removes the rest."""
    for _ in range(2):
        try:
            if not on_local_disk(fs):
                abort_uploads(fs, path)
            remove(fs, path)
            if not exists(fs, path):
                return
        except Exception as exc:
            if not remote.is_remote_failure(exc):
                raise
            return
        time.sleep(0.2)


def remove(fs: pafs.FileSystem, path: str) -> None:
    """Delete a file or a directory tree; a missing path is fine."""
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        fs.delete_dir(path)
    elif info.type == pafs.FileType.File:
        fs.delete_file(path)


#: local files of at most this many bytes are read whole by :func:`open_local` rather than memory-mapped
SMALL_FILE_BYTES = 1 << 20


def open_local(path: str) -> pa.NativeFile:
    """The local file ``path`` opened for reading: read whole into memory where it holds at most
    ``SMALL_FILE_BYTES``, else memory-mapped. For a small file (a column set's side file) mapping and
    unmapping it costs more CPU than copying it once: page-table work, and an unmap interrupts every core
    that runs one of the reader's threads. What was read whole is what later reads of the handle see: a
    reader that must see the file as it is at each read (the part files: see ParquetStore._open_file)
    maps it."""
    with open(path, "rb", buffering=0) as handle:
        if os.fstat(handle.fileno()).st_size <= SMALL_FILE_BYTES:
            return pa.BufferReader(handle.read())
    return pa.memory_map(path)
