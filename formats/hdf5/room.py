"""Room on disk for HDF5's writes, reserved before HDF5 needs it.

HDF5 (1.14, through h5py) crashes the interpreter (SIGSEGV in ``write_direct``) when a write fails
while it stores variable-length values (bytes, strings, ragged arrays: its global heap), as on a full
disk. And it keeps what it is given in its caches, so the write that fails may come long after the
values were handed over (at an eviction, at close). So HDF5 must never meet a full disk: before each
write, :meth:`DiskRoom.ensure` gives every file of the export room for it beyond HDF5's end of
allocated space, reserved with ``fallocate(FALLOC_FL_KEEP_SIZE)`` (the file's size does not change;
HDF5's later writes land in blocks the filesystem has set aside). A disk without that room fails
there, as a Python ``OSError`` (ENOSPC) naming the file, before HDF5 is handed the values. A file-size
limit (``ulimit -f``) is checked the same way (EFBIG). Where the filesystem cannot reserve, its free
space is checked instead (cheap, though another writer may take it meanwhile).

The reservation holds what is written, what the chunk caches may still hold, and a margin
(:data:`MARGIN_BYTES`), so an export is refused when the disk would be left with less than about a
batch and that margin; :meth:`DiskRoom.release` gives back what a complete file did not use.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from unihub.formats.hdf5.dtypes import h5py_module

#: reserved beyond each write's own bytes and the chunk caches: HDF5's metadata (chunk indexes,
#: object headers, heaps)
MARGIN_BYTES = 1 << 20
#: what one variable-length value costs HDF5 beyond its bytes: its descriptor in the dataset's chunk
#: (16 bytes) and its global heap object's header and padding (up to 24 bytes)
VLEN_OVERHEAD_BYTES = 40
_FALLOC_FL_KEEP_SIZE = 1
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL}


class DiskRoom:
    """The HDF5 files of one export (``track``), each given room ahead of its writes (``ensure``)."""

    def __init__(self) -> None:
        self._files: list[tuple[Any, str]] = []
        self._reserved: dict[str, int] = {}
        #: True once a write was refused: HDF5 itself met no failure, its files close as usual
        self.refused = False

    def track(self, handle: Any) -> None:
        """Give ``handle`` (an open ``h5py.File``) room from now on."""
        self._files.append((handle, os.fspath(handle.filename)))

    def ensure(self, nbytes: int) -> None:
        """Room for ``nbytes`` more in every tracked file (see the module docstring), else OSError."""
        for handle, path in self._files:
            if handle.id.valid:
                self._reserve(handle, path, handle.id.get_filesize() + nbytes + _chunk_caches(handle) + MARGIN_BYTES)

    def release(self, path: str) -> None:
        """Give back the blocks reserved beyond the end of the complete file ``path``."""
        if self._reserved.pop(path, None) is not None:
            os.truncate(path, os.path.getsize(path))  # drops what lies beyond the end

    def _reserve(self, handle: Any, path: str, end: int) -> None:
        """Make the first ``end`` bytes of ``path`` the file's own (reserved, or free on its disk)."""
        reserved = self._reserved.get(path)  # None: nothing reserved yet, or the filesystem cannot
        if reserved is not None and end <= reserved:
            return
        descriptor = handle.id.get_vfd_handle()
        try:
            _check_file_size_limit(path, end)
            if _fallocate(descriptor, reserved or 0, end - (reserved or 0), path):
                self._reserved[path] = end
            else:  # what the file does not hold yet must be free
                _check_free_space(path, end - os.fstat(descriptor).st_blocks * 512)
        except OSError:
            self.refused = True
            raise


def _chunk_caches(handle: Any) -> int:
    """The most that the chunk caches of ``handle``'s open datasets hold: whole chunks, which get their
    place in the file (beyond HDF5's end of allocated space) only when written out, at the latest at
    close, however few rows they hold."""
    h5py = h5py_module()
    cache_bytes = int(handle.id.get_access_plist().get_cache()[2])
    total = 0
    for dataset in h5py.h5f.get_obj_ids(handle.id, h5py.h5f.OBJ_DATASET | h5py.h5f.OBJ_LOCAL):
        plist = dataset.get_create_plist()
        if plist.get_layout() != h5py.h5d.CHUNKED:
            continue
        chunk = plist.get_chunk()
        chunk_bytes = int(np.prod(chunk)) * dataset.get_type().get_size()
        if chunk_bytes > cache_bytes:  # written through, never cached
            continue
        chunks = int(np.prod([-(-extent // size) for extent, size in zip(dataset.shape, chunk)]))
        total += min(cache_bytes, chunks * chunk_bytes)
    return total


def nbytes_of(rows: Any) -> int:
    """What writing ``rows`` (an array, or a sequence of values) stores, about: variable-length values
    counted with what HDF5 adds to each."""
    if isinstance(rows, np.ndarray) and rows.dtype != object:
        return int(rows.nbytes)
    if isinstance(rows, (bytes, str, np.generic)) or not hasattr(rows, "__len__"):
        return _value_bytes(rows)
    return sum(_value_bytes(value) for value in np.asarray(rows, dtype=object).reshape(-1))


def _value_bytes(value: Any) -> int:
    if isinstance(value, str):
        return 4 * len(value) + VLEN_OVERHEAD_BYTES  # at most 4 bytes a character in UTF-8
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value) + VLEN_OVERHEAD_BYTES
    if isinstance(value, np.ndarray):
        return nbytes_of(value) + VLEN_OVERHEAD_BYTES
    return 16


def _check_file_size_limit(path: str, end: int) -> None:
    """EFBIG where the process may not write a file of ``end`` bytes (``ulimit -f``)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and end > limit:
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG), path)


def _check_free_space(path: str, nbytes: int) -> None:
    """ENOSPC where the filesystem of ``path`` has less than ``nbytes`` free (for this user)."""
    stat = os.statvfs(path)
    free = (stat.f_bfree if os.geteuid() == 0 else stat.f_bavail) * stat.f_frsize
    if nbytes > free:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


def _fallocate(descriptor: int, offset: int, length: int, path: str) -> bool:
    """Reserve ``length`` bytes at ``offset`` of the file ``path``, keeping its size; False where the system
    or filesystem cannot (then nothing is reserved), OSError where the disk has no room."""
    function = _libc_fallocate()
    if function is None or length <= 0:
        return function is not None
    if function(descriptor, _FALLOC_FL_KEEP_SIZE, offset, length) == 0:
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), path)


@functools.lru_cache(maxsize=1)
def _libc_fallocate() -> Callable[..., int] | None:
    """libc's ``fallocate`` with 64-bit offsets (Linux); None elsewhere."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = getattr(libc, "fallocate64", None) or libc.fallocate
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    function.restype = ctypes.c_int
    return function
