"""Memory budgets: one setting in megabytes, from which every stage's byte bound derives.

Rows range from a few bytes to camera frames of 6.9 MB, so counts of rows bound nothing. Each
buffer that holds rows between two stages is cut at a number of **bytes** as well as at its
row count (a batch ends at whichever comes first; a row is never split):

================================  ============================  ========================
buffer                            share of the budget           at the default (512 MB)
================================  ============================  ========================
a source's batch (ingest, export) ``total / 32``                16 MB
read-ahead (batches in flight)    ``total / 16``                32 MB (two batches)
a reader's results in flight      ``total / 4``                 128 MB (at least one row
                                                                group per worker)
Dataset's row-group cache         ``total`` (cache_mb=None)     512 MB (each process)
================================  ============================  ========================

The writer's row groups (``row_group_size_mb``, :data:`DEFAULT_ROW_GROUP_SIZE_MB` by default) are a
separate setting: a row group is what a reader reads at once, so peak memory is a small multiple of
it plus the budget.

The setting is ``UNIHUB_MEMORY_MB`` in the environment (default 512), or ``memory_budget_mb=``
where a call takes it (``convert``, ``make_reader``, ``make_batch_reader``), which wins.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from unihub.errors import InvalidArgumentError

#: the writers' default ``row_group_size_mb`` (``write_dataset``, ``convert``, ``copy_dataset``, the
#: cache, ``make_spark_converter``): chosen by ``benchmarks/row_groups.py`` (README, "Row-group size")
DEFAULT_ROW_GROUP_SIZE_MB: float = 4
#: the writers' default ``part_size_mb``: a data file ends before it would pass this size, so that no
#: file is one request too long for an object store, nor a copy on publish too slow (issue 37);
#: chosen by ``benchmarks/part_size.py`` (README, "Part-file size"): reads are as fast from 32 MB up,
#: and row groups of up to 32 MB (half of it) keep their size
DEFAULT_PART_SIZE_MB: float = 64

ENV = "UNIHUB_MEMORY_MB"
DEFAULT_MEMORY_MB = 512.0


@dataclass(frozen=True)
class MemoryBudget:
    """The byte bounds of each stage, derived from one total (see the module docstring)."""

    total_bytes: int

    @property
    def batch_bytes(self) -> int:
        """Most bytes of rows a source gathers into one batch (ingest and export)."""
        return max(1, self.total_bytes // 32)

    @property
    def read_ahead_bytes(self) -> int:
        """Most bytes of batches a read-ahead thread holds ready."""
        return max(1, self.total_bytes // 16)

    @property
    def queue_bytes(self) -> int:
        """Most bytes of decoded results a reader keeps in flight (never fewer than one per worker)."""
        return max(1, self.total_bytes // 4)


def is_amount(value: Any, *, zero: bool = False) -> bool:
    """Whether ``value`` is an amount a size or time setting takes (megabytes, bytes, seconds): a finite number,
    not a bool, above 0 (at least 0 with ``zero``). NaN and inf fail later as bytes are counted; True would be 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return (0 <= value if zero else 0 < value) and value < float("inf")


def memory_budget(memory_budget_mb: float | None = None) -> MemoryBudget:
    """The budget for ``memory_budget_mb``, else ``UNIHUB_MEMORY_MB``, else 512 MB."""
    where = "memory_budget_mb"
    value: Any = memory_budget_mb
    if value is None:
        text = os.environ.get(ENV, "").strip()
        if not text:
            return MemoryBudget(int(DEFAULT_MEMORY_MB * 2**20))
        where = ENV
        try:
            value = float(text)
        except ValueError:
            raise InvalidArgumentError(f"{ENV} must be a number of megabytes, got {text!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise InvalidArgumentError(f"{where} must be a positive number of megabytes, got {value!r}")
    return MemoryBudget(max(1, int(value * 2**20)))


_SAMPLE = 16  # items of a long list or object array whose sizes stand for the rest


def value_nbytes(value: Any) -> int:
    """Bytes a value holds: arrays and byte strings by their size, lists and object arrays by their
    items (of a long one, a sample of 16 scaled up), 8 for a scalar. Cheap: what cuts batches and
    queues by bytes, not an exact account."""
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        return len(value)
    if isinstance(value, np.ndarray):
        if value.dtype != object:
            return int(value.nbytes)
        value = value.ravel()
    elif isinstance(value, dict):
        return sum(value_nbytes(v) for v in value.values())
    elif not isinstance(value, (list, tuple)):
        nbytes = getattr(value, "nbytes", None)
        return int(nbytes) if isinstance(nbytes, int) else 8
    n = len(value)
    if n <= 4 * _SAMPLE:
        return sum(value_nbytes(v) for v in value)
    return sum(value_nbytes(value[i * n // _SAMPLE]) for i in range(_SAMPLE)) * n // _SAMPLE


def batch_nbytes(batch: Any) -> int:
    """Bytes of a column batch (a mapping of columns: arrays, Arrow arrays or lists), or of an Arrow
    record batch or table."""
    nbytes = getattr(batch, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    values = batch.values() if hasattr(batch, "values") else batch
    return sum(value_nbytes(column) for column in values)


class BatchCut:
    """Where a batch of rows ends: at ``rows`` rows or ``nbytes`` bytes, whichever comes first.

    ``add(n)`` counts one row of ``n`` bytes and says whether the batch is now full; ``reset()``
    starts the next batch. A row is never split, so a batch holds at least one row.
    """

    __slots__ = ("max_rows", "max_bytes", "rows", "bytes")

    def __init__(self, rows: int, nbytes: int) -> None:
        self.max_rows, self.max_bytes = rows, nbytes
        self.rows = self.bytes = 0

    def add(self, nbytes: int) -> bool:
        self.rows += 1
        self.bytes += nbytes
        return self.rows >= self.max_rows or self.bytes >= self.max_bytes

    def reset(self) -> None:
        self.rows = self.bytes = 0


def rows_for(batch_size: int, batch_bytes: int, row_bytes: float) -> int:
    """Rows per batch for rows of about ``row_bytes``: ``batch_size``, or fewer to keep within
    ``batch_bytes`` (at least one)."""
    if row_bytes <= 0:
        return batch_size
    return max(1, min(batch_size, int(batch_bytes // row_bytes)))
