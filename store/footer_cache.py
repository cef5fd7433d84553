"""Footers of local Parquet files this process read before, kept for the next open of the same files.

A training job opens its dataset again each epoch (a reader per epoch, ``make_reader`` in a loop, each
torch worker's store), and a dataset grown by appends and column sets is hundreds of files: parsing their
footers again is most of what opening it costs (100 parts: ~8 ms of CPU of ~13). A file's footer is a
function of its bytes, so a footer is reused only for the same path with the same size and modification
time (nanoseconds, as ``os.stat`` reports them), the test that tells a dataset's files changed elsewhere
(``ParquetStore._check_unchanged``, the local-disk cache). Only local files: an object store's listing
gives its time to the second, and a rewrite of the same size within it would go unseen.

The cache is bounded by the footers' serialized bytes (``FOOTER_CACHE_BYTES``), least recently used first
out; footers are immutable, shared between threads and stores as each store already shares its own.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import pyarrow.parquet as pq

#: the most bytes of serialized footers kept (a footer of 100 row groups of 10 columns is ~60 KB)
FOOTER_CACHE_BYTES = 64 << 20

Key = tuple[str, int, int]


class FooterCache:
    """Footers by (path, size, modification time in ns), least recently used first out past ``limit`` bytes."""

    def __init__(self, limit: int = FOOTER_CACHE_BYTES) -> None:
        self.limit = limit
        self._footers: OrderedDict[Key, tuple[pq.FileMetaData, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: Key | None) -> pq.FileMetaData | None:
        """The footer kept for ``key`` (None: none, or no key)."""
        if key is None:
            return None
        with self._lock:
            found = self._footers.get(key)
            if found is None:
                self.misses += 1
                return None
            self._footers.move_to_end(key)
            self.hits += 1
            return found[0]

    def put(self, key: Key | None, footer: pq.FileMetaData) -> None:
        """Keep ``footer`` for ``key``, the least recently used ones going past the limit."""
        size = footer.serialized_size
        if key is None or size > self.limit:
            return
        with self._lock:
            old = self._footers.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._footers[key] = (footer, size)
            self._bytes += size
            while self._bytes > self.limit:
                _, (_, dropped) = self._footers.popitem(last=False)
                self._bytes -= dropped

    def clear(self) -> None:
        with self._lock:
            self._footers.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._footers)


#: this process's footers (a forked worker starts with its parent's: the same files' footers)
FOOTERS = FooterCache()


def _new_lock_after_fork() -> None:
    FOOTERS._lock = threading.Lock()  # a thread of the parent may have held it at the fork (a torch worker's)


os.register_at_fork(after_in_child=_new_lock_after_fork)


def key_of(path: str, size: int | None, mtime_ns: int | None) -> Key | None:
    """The cache key of a local file whose listing gave its size and time; None where either is unknown."""
    return (path, size, mtime_ns) if size is not None and mtime_ns is not None else None


def stat_key(path: str) -> Key:
    """The cache key of the local file ``path`` as it is now."""
    stat = os.stat(path)
    return path, stat.st_size, stat.st_mtime_ns
