"""Opening an HDF5 file for reading, on a local disk or any filesystem unihub reads."""

from __future__ import annotations

from typing import IO, Any

from unihub.formats.hdf5.dtypes import h5py_module
from unihub.fs import sources


def open_hdf5(path: str) -> Any:
    """An h5py ``File`` for reading ``path``: by name on a local disk, else over ``sources.open_input``'s
    buffered file, which closing the h5py file closes (h5py reads file objects through its ``fileobj``
    driver; the buffer turns its many small reads into few requests)."""
    h5py = h5py_module()
    if not sources.is_url(path):
        return h5py.File(sources.local_path(path), "r")
    raw = sources.open_input(path)
    try:
        handle = _owning_file(h5py)(raw, "r")
    except BaseException:
        raw.close()
        raise
    handle.unihub_raw = raw
    return handle


_OWNING: list[type] = []


def _owning_file(h5py: Any) -> type:
    """An ``h5py.File`` subclass that closes the Python file object it reads (made once, lazily)."""
    if not _OWNING:
        class OwningFile(h5py.File):
            unihub_raw: IO[bytes] | None = None

            def close(self) -> None:
                try:
                    super().close()
                finally:
                    if self.unihub_raw is not None:
                        self.unihub_raw.close()

        _OWNING.append(OwningFile)
    return _OWNING[0]
