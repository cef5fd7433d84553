"""Foreign source files on any filesystem: listing, globbing and opening local paths and URLs alike.

A format module asks here, not ``os``, about the files it reads: :func:`isdir`, :func:`isfile`,
:func:`getsize`, :func:`walk`, :func:`listdir`, :func:`glob` and :func:`open_input`. A local path (no
scheme, or ``file://``) goes straight to ``os`` and ``open`` (nothing changes on the hot path); a URL
(``s3://bucket/key``, ``gs://...``, ``hdfs://...``, any fsspec protocol) goes through the pyarrow or
fsspec filesystem :func:`~unihub.fs.filesystem.resolve_filesystem` makes for it, and every file it
lists comes back as a URL of that filesystem, so that it can be opened again from its name alone.

How to reach a store is given once per conversion with :func:`using` (``convert(storage_options=...)``,
the CLI's ``--storage-option``): the options, and a URL's query (``?endpoint_override=...``), hold for
every URL of the same scheme and bucket read meanwhile, also in forked workers, which inherit them and
make their own filesystem objects (S3 clients do not survive a fork).

Remote reads are buffered (:data:`READ_BUFFER` bytes): h5py and the tar reader make many small reads,
which would otherwise be one request each.

Walking a local tree of inputs (:func:`tree_entries`, :func:`read_regular`) reads only regular files and
follows symbolic links as ``tar`` and ``rsync`` do not by default: a link to a regular file inside the tree
is read (it names a file of the tree), a link to a directory is not descended into, and a link leading out
of the tree, a special file (FIFO, socket, device) or a file larger than the limit the caller gives is
named, never opened for reading (a FIFO would block, ``/dev/zero`` never ends). With ``follow_links=True``
(``--follow-links``, as ``tar -h`` and ``rsync -L``) links are followed wherever they lead, except into a
directory the walk is already inside (a loop), so a walk always ends.
"""

from __future__ import annotations

import fnmatch
import io
import os
import posixpath
import re
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any, Literal
from urllib.parse import urlparse

import pyarrow.fs as pafs

from unihub.errors import DatasetChangedError, RemoteStorageError, UnsupportedFilesystemError
from unihub.fs import filesystem as fsutil
from unihub.fs import remote

#: bytes read ahead per request from a remote file
READ_BUFFER = 1 << 20
_QUERY = re.compile(r"\?(?=[A-Za-z_][A-Za-z0-9_]*=)")

#: (scheme, bucket) -> the URL (with its query) that first named it, to make filesystems from
_ORIGINS: dict[tuple[str, str], str] = {}
#: (pid, origin URL, options) -> filesystem made in that process
_CACHE: dict[tuple[int, str, str], pafs.FileSystem] = {}


@contextmanager
def using(storage_options: Mapping[str, Any] | None) -> Iterator[None]:
    """Within this block, URLs are opened with ``storage_options`` (fsspec's, plus unihub's remote settings),
    through filesystems made for this block."""
    cached, origins = dict(_CACHE), dict(_ORIGINS)
    _CACHE.clear()  # filesystems live for one conversion: a store that was down is asked afresh
    try:
        with fsutil.storage_options_in_use(storage_options):
            yield
    finally:
        _CACHE.clear()
        _CACHE.update(cached)
        _ORIGINS.clear()  # a URL's query holds for its bucket until the conversion ends, not for the process
        _ORIGINS.update(origins)


def is_url(path: str) -> bool:
    """True for a URL of a filesystem other than the local one (``file://`` is local)."""
    return "://" in path and urlparse(path).scheme not in ("", "file")


def split_query(url: str) -> tuple[str, str]:
    """``s3://b/k/*.tfr?endpoint_override=...`` -> (``s3://b/k/*.tfr``, ``?endpoint_override=...``).

    Only ``?key=`` starts a query, so a glob's ``?`` stays in the path."""
    if not is_url(url):
        return url, ""
    match = _QUERY.search(url)
    return (url, "") if match is None else (url[:match.start()], url[match.start():])


def without_query(url: str) -> str:
    """``url`` without its query, which from now on holds for its bucket (see :func:`filesystem`)."""
    bare, query = split_query(url)
    if query:
        filesystem(url)
    return bare


def utf8_name(name: str) -> bool:
    """Whether a file or member ``name`` was UTF-8 bytes: one that was not is listed (and parsed from a tar
    header) with surrogate escapes (``bad\\udcff.png``), which text columns cannot store."""
    if name.isascii():
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def local_path(path: str) -> str:
    """A local path for ``path`` (``file:///x`` -> ``/x``)."""
    return urlparse(path).path if path.startswith("file://") else path


def filesystem(url: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem for ``url`` (made once per process, scheme, bucket and options) and the path on it."""
    bare, query = split_query(url)
    parsed = urlparse(bare)
    key = (parsed.scheme, parsed.netloc)
    if query or key not in _ORIGINS:
        _ORIGINS[key] = f"{parsed.scheme}://{parsed.netloc}/{query}"
    options = fsutil.current_options()
    # beside fsspec's options only this URL's own query counts (and is refused): an origin an earlier URL left
    # (before this conversion: a query holds for its bucket within one) is dropped, as fsspec takes none
    origin = f"{parsed.scheme}://{parsed.netloc}/{query}" if remote.split_settings(options)[1] else _ORIGINS[key]
    cache_key = (os.getpid(), origin, repr(sorted((options or {}).items())))
    fs = _CACHE.get(cache_key)
    if fs is None:
        try:
            fs, _ = fsutil.resolve_filesystem(origin, None, options)
        except UnsupportedFilesystemError as exc:
            raise UnsupportedFilesystemError(str(exc).replace(origin, bare, 1)) from None
        _forget_listings(fs)
        _CACHE[cache_key] = fs
    return fs, fsutil.strip_scheme(bare)


def _forget_listings(fs: pafs.FileSystem) -> None:
    """Have a conversion list its sources afresh: fsspec hands every caller with the same options one instance,
    listings (and the ETags s3fs reads with) cached since an earlier conversion in this process. With them a
    file added since was "not a file", and one rewritten since was "changed since the dataset was opened"
    before ``convert --append`` could tell it changed (a SourceChangedError)."""
    invalidate = getattr(getattr(getattr(fs, "handler", None), "fs", None), "invalidate_cache", None)
    if invalidate is not None:
        invalidate()


def join(directory: str, name: str) -> str:
    """``os.path.join`` for local paths; ``/`` for URLs."""
    return f"{directory.rstrip('/')}/{name}" if is_url(directory) else os.path.join(directory, name)


def _url(scheme_of: str, path: str) -> str:
    """``path`` on the filesystem of URL ``scheme_of`` as a URL."""
    return f"{urlparse(scheme_of).scheme}://{path}"


def _info(path: str) -> pafs.FileInfo:
    fs, inner = filesystem(path)
    with remote.remote_errors(path):
        return fs.get_file_info(inner)


def isdir(path: str) -> bool:
    if not is_url(path):
        return os.path.isdir(local_path(path))
    return _info(path).type == pafs.FileType.Directory


def isfile(path: str) -> bool:
    if not is_url(path):
        return os.path.isfile(local_path(path))
    return _info(path).type == pafs.FileType.File


def exists(path: str) -> bool:
    if not is_url(path):
        return os.path.exists(local_path(path))
    return _info(path).type != pafs.FileType.NotFound


def getsize(path: str) -> int:
    if not is_url(path):
        return os.path.getsize(local_path(path))
    info = _info(path)
    if info.type != pafs.FileType.File:
        raise FileNotFoundError(f"{path}: no such file")
    return int(info.size or 0)


def total_size(paths: list[str]) -> int:
    """Bytes of the files ``paths`` (URLs): one listing per folder holding many of them, not one request per file
    (an image folder has many); a request per file where a folder holds few (a listing of a bucket's root to
    size one HDF5 file there would page through every object); a file not found counts 0."""
    wanted: dict[str, set[str]] = {}
    for path in paths:
        folder, _, name = without_query(path).rpartition("/")
        wanted.setdefault(folder, set()).add(name)
    total = 0
    for folder, names in wanted.items():
        if len(names) > _LOOKS_PER_FOLDER:
            found = [e for e in _entries(folder, recursive=False) if posixpath.basename(e.path) in names]
        else:
            found = [_info(f"{folder}/{name}") for name in sorted(names)]
        total += sum(int(e.size or 0) for e in found if e.type == pafs.FileType.File)
    return total


#: files of one folder sized by a request each (:func:`total_size`); more: by a listing of the folder
_LOOKS_PER_FOLDER = 8


def _entries(root: str, *, recursive: bool) -> list[pafs.FileInfo]:
    fs, inner = filesystem(root)
    with remote.remote_errors(root):
        return list(fs.get_file_info(pafs.FileSelector(inner.rstrip("/"), recursive=recursive, allow_not_found=True)))


def listdir(path: str) -> list[str]:
    """Names in a directory (as ``os.listdir``)."""
    if not is_url(path):
        return os.listdir(local_path(path))
    return [posixpath.basename(e.path.rstrip("/")) for e in _entries(path, recursive=False)]


def scandir(path: str) -> list[tuple[str, bool]]:
    """``(name, is a directory)`` for each entry of a directory, from one listing (links followed locally)."""
    if not is_url(path):
        with os.scandir(local_path(path)) as entries:
            return [(e.name, e.is_dir()) for e in entries]
    return [(posixpath.basename(e.path.rstrip("/")), e.type == pafs.FileType.Directory)
            for e in _entries(path, recursive=False)]


#: what a walked entry is: a directory to descend into, a regular file to read, a special file (FIFO,
#: socket, device: never opened), a link left out with a word, or a link refused (out of the tree)
EntryKind = Literal["dir", "file", "special", "left out", "refused"]


@dataclass(frozen=True)
class TreeEntry:
    """One entry of a directory as :func:`tree_entries` classifies it; ``reason`` says why it is not read."""

    name: str
    kind: EntryKind
    reason: str = ""


def tree_entries(directory: str, root: str, *, follow_links: bool = False,
                 inside: frozenset[tuple[int, int]] = frozenset()) -> list[TreeEntry]:
    """The entries of ``directory`` (a folder of the tree ``root``), sorted, hidden names left out,
    each classified without opening it (see the module docstring). ``inside``: ``(st_dev, st_ino)``
    of the directories the walk is in (:func:`directory_key`), so that a followed link back into
    one is a loop, named and not followed. URLs list as they are (object stores have no links)."""
    if is_url(directory):
        return [TreeEntry(n, "dir" if d else "file") for n, d in sorted(scandir(directory)) if not n.startswith(".")]
    real_root = os.path.realpath(local_path(root))
    found = []
    with os.scandir(local_path(directory)) as listing:
        for entry in listing:
            if not entry.name.startswith("."):
                found.append(_classified(entry, real_root, follow_links, inside))
    return sorted(found, key=lambda e: e.name)


def directory_key(path: str) -> tuple[int, int]:
    """``(st_dev, st_ino)`` of the directory ``path`` (links followed): its identity, for loop checks."""
    info = os.stat(local_path(path))
    return info.st_dev, info.st_ino


def _classified(entry: os.DirEntry[str], real_root: str, follow_links: bool,
                inside: frozenset[tuple[int, int]]) -> TreeEntry:
    name = entry.name
    if not entry.is_symlink():  # the listing's own types: no system call per entry
        if entry.is_dir(follow_symlinks=False):
            return TreeEntry(name, "dir")
        if entry.is_file(follow_symlinks=False):
            return TreeEntry(name, "file")
        return TreeEntry(name, "special", _special(entry.stat(follow_symlinks=False).st_mode))
    target = os.path.realpath(entry.path)
    try:
        mode, key = _target(entry.path)
    except OSError as exc:  # dangling, or a chain of links that loops (ELOOP)
        return TreeEntry(name, "left out", f"a symbolic link to {os.readlink(entry.path)!r} that leads to no "
                                           f"file ({exc.strerror})")
    within = target == real_root or target.startswith(os.path.join(real_root, ""))
    if not follow_links and not within:
        return TreeEntry(name, "refused", f"a symbolic link to {target}, outside the folder: not followed "
                                          "(--follow-links, follow_links=True, reads through it)")
    if stat.S_ISDIR(mode):
        if not follow_links:
            return TreeEntry(name, "left out", f"a symbolic link to the folder {target}: not followed, its files "
                                               "are read where they lie (--follow-links reads them here too)")
        if key in inside:
            return TreeEntry(name, "left out", f"a symbolic link to {target}, a folder it lies in: a loop, "
                                               "not followed")
        return TreeEntry(name, "dir")
    if stat.S_ISREG(mode):
        return TreeEntry(name, "file")
    return TreeEntry(name, "special", f"a symbolic link to {target}, {_special(mode)}")


def _target(path: str) -> tuple[int, tuple[int, int]]:
    info = os.stat(path)
    return info.st_mode, (info.st_dev, info.st_ino)


def _special(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"))
    what = next((text for test, text in kinds if test(mode)), "a special file")
    return f"not a regular file ({what}): never opened"


class NotReadable(Exception):
    """:func:`read_regular` refused a file: ``reason`` says why (not regular, or larger than allowed)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def read_regular(path: str, limit: int = -1, *, max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (the first ``limit``), one read where it can.

    Raises :class:`NotReadable` for anything else (checked on the open file, so a FIFO put in a file's
    place after the walk neither blocks nor is read) and for a file of more than ``max_bytes`` bytes,
    checked before reading and while reading (a file that grows is cut off at the limit, not read on).
    Local files are read without a buffered file object (a third of the cost).
    """
    wanted = limit if limit >= 0 else -1
    if is_url(path):
        cap = wanted if max_bytes is None or 0 <= wanted <= max_bytes else max_bytes + 1
        data = read_bytes(path, cap)
        return _bounded(data, max_bytes, limit)
    fd = os.open(local_path(path), os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotReadable(_special(info.st_mode))
        if max_bytes is not None and info.st_size > max_bytes and limit < 0:
            raise NotReadable(_too_large(info.st_size, max_bytes))
        if limit >= 0:
            return os.read(fd, limit)
        data = os.read(fd, info.st_size + 1)  # one read for the whole file; a second when it grew
        if len(data) <= info.st_size:
            return data
        parts, total = [data], len(data)
        while chunk := os.read(fd, 1 << 20):
            parts.append(chunk)
            total += len(chunk)
            if max_bytes is not None and total > max_bytes:
                raise NotReadable(_too_large(total, max_bytes))
        return b"".join(parts)
    finally:
        os.close(fd)


def _bounded(data: bytes, max_bytes: int | None, limit: int) -> bytes:
    if limit < 0 and max_bytes is not None and len(data) > max_bytes:
        raise NotReadable(_too_large(len(data), max_bytes))
    return data


def _too_large(size: int, max_bytes: int) -> str:
    return f"{size:,} bytes or more, above the limit of {max_bytes:,} bytes a file may have"


def read_bytes(path: str, limit: int = -1) -> bytes:
    """The bytes of a remote or local file (the first ``limit``)."""
    with open_input(path) as handle:
        return handle.read(limit) if limit >= 0 else handle.read()


def relative(path: str, root: str) -> str:
    """``path`` relative to ``root`` with ``/`` separators (lexically, for URLs and local paths)."""
    if is_url(path):
        return path[len(root.rstrip("/")):].strip("/") or "."
    return os.path.relpath(path, root).replace(os.sep, "/")


def walk(root: str, *, followlinks: bool = False) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(root)`` (top-down; pruning ``dirs`` in place works), for URLs from one recursive listing."""
    if not is_url(root):
        yield from os.walk(local_path(root), followlinks=followlinks)
        return
    base = filesystem(root)[1].rstrip("/")
    dirs_of: dict[str, set[str]] = {}
    files_of: dict[str, list[str]] = {}
    for entry in _entries(root, recursive=True):
        parts = entry.path.rstrip("/")[len(base):].strip("/").split("/")
        for i in range(len(parts) - 1):  # every ancestor is a directory, listed or not (object stores)
            dirs_of.setdefault("/".join(parts[:i]), set()).add(parts[i])
        parent = "/".join(parts[:-1])
        if entry.type == pafs.FileType.Directory:
            dirs_of.setdefault(parent, set()).add(parts[-1])
        else:
            files_of.setdefault(parent, []).append(parts[-1])
    pending = [""]
    while pending:
        rel = pending.pop()
        dirs = sorted(dirs_of.get(rel, ()))
        yield (root.rstrip("/") + ("/" + rel if rel else ""), dirs, sorted(files_of.get(rel, [])))
        pending.extend(f"{rel}/{d}" if rel else d for d in reversed(dirs))


def walk_following_links(top: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(top, followlinks=True)`` (local), except into a directory the walk is already inside:
    links are followed as Arrow's recursive listing and torchvision's walk follow them, and a link back
    up (``a/l -> .``, ``a/l -> ..``) is listed as a name but not descended into, so the walk ends."""
    for dirpath, dirnames, filenames in os.walk(local_path(top), followlinks=True):
        inside = {os.path.realpath(dirpath)}
        parent = dirpath
        while len(parent) > len(top):
            parent = os.path.dirname(parent)
            inside.add(os.path.realpath(parent))
        dirnames[:] = [d for d in dirnames if os.path.realpath(os.path.join(dirpath, d)) not in inside]
        yield dirpath, dirnames, filenames


def glob(pattern: str) -> list[str]:
    """Files matching a glob (``*``, ``?``, ``[...]`` within one path component), sorted; URLs for URLs."""
    if not is_url(pattern):
        import glob as globbing

        return sorted(globbing.glob(local_path(pattern)))
    bare, _ = split_query(pattern)
    parts = bare.split("/")
    fixed = next(i for i, p in enumerate(parts) if any(c in p for c in "*?["))
    root = "/".join(parts[:fixed])
    wanted = parts[fixed:]
    found = []
    for entry in _entries(root, recursive=len(wanted) > 1):
        if entry.type != pafs.FileType.File:
            continue
        fs_root = filesystem(root)[1].rstrip("/")
        rel = entry.path[len(fs_root):].lstrip("/").split("/")
        if len(rel) == len(wanted) and all(fnmatch.fnmatchcase(r, w) for r, w in zip(rel, wanted)):
            found.append(_url(bare, entry.path))
    return sorted(found)


def open_input(path: str) -> IO[bytes]:
    """``path`` opened for reading bytes: a local file, or a buffered, seekable remote one."""
    if not is_url(path):
        return open(local_path(path), "rb")  # noqa: SIM115  (the caller closes it)

    fs, inner = filesystem(path)
    with remote.remote_errors(path):
        info = fs.get_file_info(inner)
        if info.type != pafs.FileType.File:
            raise FileNotFoundError(2, "No such file or directory", path)
        handle = fs.open_input_file(inner)
    # s3fs reads with the ETag it listed (a change is its FileExpired); pyarrow's ranged reads carry none
    unchanged = None if isinstance(getattr(fs, "handler", None), pafs.FSSpecHandler) else \
        (lambda: _refuse_changed(fs, inner, path, info))
    return io.BufferedReader(_RemoteRaw(handle, path, int(info.size or 0), unchanged), buffer_size=READ_BUFFER)


def _refuse_changed(fs: pafs.FileSystem, inner: str, path: str, opened: pafs.FileInfo) -> None:
    """Raise :class:`~unihub.errors.DatasetChangedError` if the object at ``path`` is not the one ``opened``
    described (size, modification time): another writer replaced it while it was read in several requests, and
    the bytes read mix both (a tar's members, an HDF5 file's chunks: no checksum tells). A failed look is left
    to what the reads said."""
    try:
        with remote.remote_errors(path):
            now = fs.get_file_info(inner)
    except RemoteStorageError:
        return
    if (now.type, now.size, now.mtime) != (opened.type, opened.size, opened.mtime):
        raise DatasetChangedError(f"{remote.public_url(path)}: the object changed while it was read ("
                                  f"{opened.size:,} bytes when opened, {now.size or 0:,} now): another writer "
                                  "replaced it, and records of both versions would mix; convert it again once "
                                  "it is written", path=remote.public_url(path))


@contextmanager
def local_copy(path: str) -> Iterator[str]:
    """A local path holding ``path``'s bytes: itself when local, else a temporary copy removed at the end
    (for readers that take only local names: TensorFlow's TFRecordDataset in ``verify``)."""
    if not is_url(path):
        yield local_path(path)
        return
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory(prefix="unihub-") as holder:
        local = os.path.join(holder, posixpath.basename(path) or "file")
        with open_input(path) as remote_file, open(local, "wb") as out:
            shutil.copyfileobj(remote_file, out, READ_BUFFER)
        yield local


class _RemoteRaw(io.RawIOBase):
    """A pyarrow file as a raw binary stream (what ``io.BufferedReader`` buffers), with a ``name``."""

    def __init__(self, handle: Any, name: str, size: int, unchanged: Any = None) -> None:
        super().__init__()
        self._handle, self.name, self._size = handle, name, size
        self._unchanged, self._requests = unchanged, 0  # checked at close where it was read in several

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        with remote.remote_errors(self.name):
            data = self._handle.read(len(view))
        view[:len(data)] = data
        self._requests += bool(data)
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self._handle.seek(offset, whence))

    def tell(self) -> int:
        return int(self._handle.tell())

    def close(self) -> None:
        try:
            if not self.closed:
                self._handle.close()
                if self._unchanged is not None and self._requests > 1:
                    self._unchanged()
        finally:
            super().close()
