"""Where an export's writers put their files: a local directory or a prefix on any pyarrow filesystem.

A writer (TFRecord shards, WebDataset tars, an image folder) asks its :class:`Outputs` for a binary
stream per file (``open("part-00000.tfrecord")``; ``open()`` is the target itself, for a single-file
export) and never sees where the bytes go:

- :class:`LocalOutputs` writes this machine's files (Python's buffered files, ``os.open`` for whole
  files). With ``atomic=True`` each file is written beside its name and renamed into place when
  closed, for a writer called on a path of its own; an export that ``convert`` stages and commits as
  one (:func:`unihub.fs.publish.commit`) needs no per-file renames.
- :class:`FileSystemOutputs` streams to a pyarrow filesystem (S3, GCS, HDFS, fsspec's): nothing is
  written locally, and memory stays bounded (pyarrow's S3 stream uploads in parts as they fill).

A file a failed writer leaves is :meth:`Outputs.discard`-ed: closed and removed (best effort: the
staged prefix it lies in is removed as a whole after a failure anyway). What the disk refused (no
space left, a file too large, a read-only destination) reaches the caller as
:class:`~unihub.errors.OutputError` naming the destination (:func:`naming_output_errors`).
"""

from __future__ import annotations

import errno
import functools
import inspect
import io
import os
import posixpath
import re
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import IO, Any, TypeVar

import pyarrow.fs as pafs

from unihub.errors import OutputError, UnihubError

#: Python-side buffer in front of a remote stream: one call into pyarrow per MiB, not per record
_REMOTE_BUFFER = 1 << 20


class Outputs(ABC):
    """A place to write an export's files, rooted at ``root`` (the target: a file or a directory)."""

    root: str
    #: how many files a writer of many small ones (an image folder) writes at once
    parallel_files = 2

    @abstractmethod
    def open(self, relative: str = "") -> IO[bytes]:
        """A writable binary stream for ``relative`` under the root ('' : the root itself);
        its parent directories are made where the filesystem needs them."""

    def write_file(self, relative: str, data: bytes | bytearray | memoryview) -> None:
        """Write one whole file at once."""
        with self.open(relative) as handle:
            handle.write(data)

    @abstractmethod
    def makedirs(self, relative: str = "") -> None:
        """Make the directory ``relative`` (empty ones included: an image folder's empty classes)."""

    def path(self, relative: str = "") -> str:
        """``relative``'s full path on the filesystem."""
        return self.root if not relative else posixpath.join(self.root, relative)

    @abstractmethod
    def local_file(self) -> AbstractContextManager[str]:
        """A local path at which a writer that needs a seekable, readable file (h5py) writes the root,
        put in place when the block ends without an error."""

    def discard(self, handle: IO[bytes] | None, relative: str = "") -> None:
        """Close ``handle`` of a failed write and remove what it wrote (no error of its own raised)."""
        if handle is not None:
            try:
                handle.close()
            except Exception:  # noqa: BLE001 (the write's own error is the one to report)
                pass
        self._remove(relative)

    @abstractmethod
    def _remove(self, relative: str) -> None:
        """Remove what a failed write of ``relative`` left."""


class LocalOutputs(Outputs):
    """Files under a local path; ``atomic``: each appears under its name only once complete."""

    def __init__(self, root: str | os.PathLike[str], *, atomic: bool = False) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.atomic = atomic
        self._made: set[str] = set()

    def path(self, relative: str = "") -> str:
        return self.root if not relative else os.path.join(self.root, *relative.split("/"))

    def _temporary(self, final: str) -> str:
        return os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.tmp-{os.getpid()}")

    def _parent(self, final: str) -> None:
        directory = os.path.dirname(final)
        if directory not in self._made:
            os.makedirs(directory, exist_ok=True)
            self._made.add(directory)

    def open(self, relative: str = "") -> IO[bytes]:
        final = self.path(relative)
        self._parent(final)
        if not self.atomic:
            return open(final, "wb")  # noqa: SIM115 (the writer closes it)
        return _RenamedOnClose(self._temporary(final), final)

    def write_file(self, relative: str, data: bytes | bytearray | memoryview) -> None:
        """One ``os.open`` and ``os.write`` calls: the fast path of many small files (image folders)."""
        final = self.path(relative)
        self._parent(final)
        where = self._temporary(final) if self.atomic else final
        fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        except BaseException:
            os.remove(where)
            raise
        if self.atomic:
            os.replace(where, final)

    def makedirs(self, relative: str = "") -> None:
        os.makedirs(self.path(relative), exist_ok=True)

    @contextmanager
    def local_file(self) -> Iterator[str]:
        """The root itself (the writer makes it atomic, or the export is staged as a whole)."""
        yield self.root

    def discard(self, handle: IO[bytes] | None, relative: str = "") -> None:
        if isinstance(handle, _RenamedOnClose):
            handle.discarded = True  # closing it must not put it in place
        super().discard(handle, relative)

    def _remove(self, relative: str) -> None:
        final = self.path(relative)
        leftover = self._temporary(final) if self.atomic else final  # atomic: an old, complete file stays
        if os.path.isfile(leftover):
            os.remove(leftover)


class _RenamedOnClose(io.FileIO):
    """A local file written at a temporary name and renamed to ``final`` when closed."""

    def __init__(self, temporary: str, final: str) -> None:
        super().__init__(temporary, "wb")
        self.final = final
        self.discarded = False

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        if not self.discarded:
            os.replace(str(self.name), self.final)


class FileSystemOutputs(Outputs):
    """Files under ``root`` on a pyarrow filesystem, each streamed as it is written."""

    parallel_files = 8  # one request each: their latencies overlap

    def __init__(self, fs: pafs.FileSystem, root: str) -> None:
        self.fs, self.root = fs, root.rstrip("/")
        self._flat = fs.type_name in ("s3", "gcs")  # object stores: no directories to make
        self._made: set[str] = set()

    def _stream(self, relative: str) -> Any:
        path = self.path(relative)
        parent = posixpath.dirname(path)
        if not self._flat and parent not in self._made:
            self.fs.create_dir(parent, recursive=True)
            self._made.add(parent)
        return self.fs.open_output_stream(path)

    def open(self, relative: str = "") -> IO[bytes]:
        return io.BufferedWriter(_Raw(self._stream(relative)), _REMOTE_BUFFER)

    def write_file(self, relative: str, data: bytes | bytearray | memoryview) -> None:
        with self._stream(relative) as stream:
            stream.write(data)

    def makedirs(self, relative: str = "") -> None:
        """Object stores have no directories, and pyarrow's S3 makes a marker object for each: none is
        made there (an empty class folder of an image folder does not survive on them)."""
        if not self._flat:
            self.fs.create_dir(self.path(relative), recursive=True)

    @contextmanager
    def local_file(self) -> Iterator[str]:
        """A file in a temporary directory in ``$TMPDIR``, streamed to the root when complete, then removed:
        the one case where an export to a remote filesystem writes locally (HDF5, which h5py seeks in)."""
        with tempfile.TemporaryDirectory(prefix="unihub-spool-") as spool:
            local = os.path.join(spool, posixpath.basename(self.root) or "file")
            yield local
            with open(local, "rb") as source, self.open() as sink:
                shutil.copyfileobj(source, sink, _REMOTE_BUFFER)

    def _remove(self, relative: str) -> None:
        try:
            info = self.fs.get_file_info(self.path(relative))
            if info.type == pafs.FileType.File:
                self.fs.delete_file(info.path)
        except Exception:  # noqa: BLE001 (best effort: the staged prefix is removed as a whole)
            pass


class _Raw(io.RawIOBase):
    """A pyarrow output stream as Python's raw stream (what ``io.BufferedWriter`` wraps)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._stream.write(data)
        return len(data)

    def tell(self) -> int:
        return self._stream.tell()

    def close(self) -> None:
        if not self.closed:
            try:
                self._stream.close()
            finally:
                super().close()


def outputs_for(target: str | os.PathLike[str] | Outputs) -> Outputs:
    """``target`` as given, or a local path as per-file atomic :class:`LocalOutputs` (a writer called
    directly on a path: each file it finishes appears whole, and a failure leaves none half written)."""
    if isinstance(target, Outputs):
        return target
    return LocalOutputs(target, atomic=True)


#: errors of a disk that cannot take an output, and what to do about each
DISK_ERRORS = {errno.ENOSPC: "free some space, or write elsewhere", errno.EDQUOT: "free some space, or write elsewhere",
               errno.EFBIG: "a file reached the largest size the file system or this process (ulimit -f) allows",
               errno.EROFS: "write elsewhere"}


F = TypeVar("F", bound=Callable[..., Any])


def names_output_errors(target_argument: str) -> Callable[[F], F]:
    """Decorate a writer so that what the disk refused raises :class:`~unihub.errors.OutputError`
    naming the writer's argument ``target_argument`` (:func:`naming_output_errors`)."""
    def decorate(writer: F) -> F:
        signature = inspect.signature(writer)

        @functools.wraps(writer)
        def named(*args: Any, **kwargs: Any) -> Any:
            target = signature.bind_partial(*args, **kwargs).arguments.get(target_argument)
            if target is None:
                return writer(*args, **kwargs)
            with naming_output_errors(target):
                return writer(*args, **kwargs)
        return named  # type: ignore[return-value]
    return decorate


@contextmanager
def naming_output_errors(target: str | os.PathLike[str]) -> Iterator[None]:
    """Raise what the disk refused while writing ``target`` as :class:`~unihub.errors.OutputError`
    (see :func:`output_error`); other errors pass as they are."""
    try:
        yield
    except OSError as exc:
        named = output_error(exc, os.fspath(target))
        if named is None:
            raise
        raise named from exc


def output_error(exc: OSError, target: str) -> OutputError | None:
    """``exc``, met while writing ``target``, as one line naming ``target``, the reason, the file when
    it is another (pyarrow and HDF5 may name none) and for a disk error what to do: for a disk error
    anywhere, or any error on ``target``, in it or on a temporary beside it; else None (a source that
    cannot be read, a unihub error)."""
    if isinstance(exc, UnihubError):
        return None
    path = path_of(exc)
    reason = os.strerror(exc.errno) if exc.errno else ""
    hint = DISK_ERRORS.get(exc.errno or 0)
    if not reason or not (hint or (path is not None and _within(str(path), target))):
        return None
    line = f"cannot write {target}: {reason}" + (f" ({path})" if path not in (None, target) else "")
    return OutputError(f"{line}; {hint}" if hint else line, code=exc.errno, filename=path)


def path_of(exc: OSError) -> str | None:
    """The file ``exc`` is about: its ``filename``, else the first quoted path in its message (pyarrow
    names the file in its text only)."""
    if exc.filename is not None:
        return str(exc.filename)
    match = re.search(r"'([^']*/[^']*)'", str(exc))
    return match.group(1) if match else None


def _within(path: str, target: str) -> bool:
    """True when ``path`` is ``target``, inside it, or one of the temporaries written beside it."""
    name = os.path.basename(os.path.normpath(target))
    first = os.path.relpath(os.path.abspath(path), os.path.dirname(os.path.abspath(target))).split(os.sep)[0]
    return first == name or first.startswith(f".{name}.unihub-")
