"""A local fsspec filesystem that logs every read of a Parquet file, for the node-cache tests.

Each read of a ``.parquet`` file appends ``<pid> <data|footer> <path> <offset> <bytes>`` to ``log``
(``O_APPEND``: one line per read whatever the process), where ``data`` is a read that ends before
the file's footer (a row group's pages; a read of the tail, footer and all, is ``footer``). A data read may also be slowed (``delay`` seconds) or held:
with ``gate``, the first data read creates ``gate + ".entered"`` and waits until ``gate`` exists, so a
test can stop a process in the middle of fetching a row group (and kill it there).
"""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path
from typing import Any

from fsspec.implementations.local import LocalFileOpener, LocalFileSystem


class WatchedFileSystem(LocalFileSystem):
    """See the module docstring; picklable (fsspec keeps the constructor's arguments)."""

    cachable = False

    def __init__(self, log: str, delay: float = 0.0, gate: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.log, self.delay, self.gate = log, delay, gate
        self._footers: dict[str, int] = {}

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, **kwargs: Any) -> Any:
        path = self._strip_protocol(path)
        if mode == "rb" and path.endswith(".parquet"):
            return _WatchedFile(path, mode, fs=self, **kwargs)
        return super()._open(path, mode, block_size=block_size, **kwargs)

    def watch(self, path: str, offset: int, size: int) -> None:
        """Log one read; slow or hold it where it is a data read."""
        start = self._footer_start(path)
        is_data = offset < start and 0 <= size and offset + size <= start  # not a read of the file's tail
        line = f"{os.getpid()} {'data' if is_data else 'footer'} {path} {offset} {size}\n"
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        if not is_data:
            return
        if self.gate is not None:
            Path(self.gate + ".entered").touch()
            while not os.path.exists(self.gate):
                time.sleep(0.01)
        if self.delay:
            time.sleep(self.delay)

    def _footer_start(self, path: str) -> int:
        start = self._footers.get(path)
        if start is None:
            with open(path, "rb") as handle:
                size = handle.seek(0, 2)
                handle.seek(size - 8)
                length = struct.unpack("<i", handle.read(4))[0]
            start = self._footers[path] = size - 8 - length
        return start


class _WatchedFile(LocalFileOpener):
    def read(self, size: int = -1) -> bytes:
        self.fs.watch(self.path, self.f.tell(), size)
        return self.f.read(size)


def data_reads(log: Path, pid: int | None = None) -> list[tuple[str, int, int]]:
    """``(path, offset, bytes)`` of the data reads logged (by ``pid``, or by any process)."""
    if not log.exists():
        return []
    found = []
    for line in log.read_text().splitlines():
        who, kind, path, offset, size = line.split()
        if kind == "data" and (pid is None or int(who) == pid):
            found.append((path, int(offset), int(size)))
    return found
