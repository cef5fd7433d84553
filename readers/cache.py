"""Caching stored row groups between epochs: ``cache_type='null'`` or ``'local-disk'``.

A cache maps (dataset, row group, columns) to the encoded Arrow table of that row group,
so a second epoch over remote data makes no remote reads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import pyarrow as pa

from unihub.store.dataset import ParquetStore


class Cache(Protocol):
    def get_row_group(self, store: ParquetStore, row_group: int, columns: Sequence[str]) -> pa.Table: ...


class CacheBase(ABC):
    """Petastorm's cache contract: ``get(key, fill_cache_func)`` (readers use ``get_row_group``)."""

    @abstractmethod
    def get(self, key: Any, fill_cache_func: Callable[[], Any]) -> Any:
        """The value cached under ``key``; on a miss, ``fill_cache_func()``, cached and returned."""

    def cleanup(self) -> None:
        """Release what the cache holds (a reader calls it when its with-block ends)."""
        return None


class NullCache(CacheBase):
    """No caching: every read goes to the store."""

    def get(self, key: Any, fill_cache_func: Callable[[], Any]) -> Any:
        return fill_cache_func()

    def get_row_group(self, store: ParquetStore, row_group: int, columns: Sequence[str]) -> pa.Table:
        return store.read_row_group(row_group, list(columns))
