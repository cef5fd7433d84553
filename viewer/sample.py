"""Which rows a report shows, and the one streaming pass that finds them and feeds the statistics.

Rows are chosen in the same pass over the row groups that computes the statistics, so a filter
(``where``) is evaluated once: each row group's filter and statistics columns are read, filtered, folded
into the statistics, and its matching rows offered to the sample. A random sample keeps the ``rows``
matching rows with the smallest keys from ``np.random.default_rng((seed, row group))``: uniform,
the same for the same seed whatever the reading order, and bounded (``rows`` indices kept). ``first``
keeps the first ``rows`` matching rows instead. Only the sampled rows are then read whole and decoded
(images included), through :class:`unihub.readers.random_access.Dataset`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from unihub.readers.loader import evaluate_expression
from unihub.store.dataset import ParquetStore
from unihub.viewer.stats import StatsAccumulator


@dataclass(frozen=True)
class Sampling:
    """How to choose the rows a report shows: ``rows`` of them, at random with ``seed`` or the first."""

    rows: int = 16
    seed: int = 0
    first: bool = False


class Reservoir:
    """The ``rows`` offered indices with the smallest random keys (or the first ``rows`` offered)."""

    def __init__(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self.keys = np.empty(0, dtype=np.float64)
        self.indices = np.empty(0, dtype=np.int64)

    def offer(self, indices: np.ndarray, group: int) -> None:
        """Indices (global rows) from row group ``group``, in order."""
        n = self.sampling.rows
        if self.sampling.first:
            if len(self.indices) < n:
                self.indices = np.concatenate([self.indices, indices[:n - len(self.indices)]])
            return
        keys = np.random.default_rng((self.sampling.seed, group)).random(len(indices))
        if len(keys) > n:  # the group's n smallest first, in linear time: a row group may hold millions
            smallest = np.argpartition(keys, n)[:n] if n else np.empty(0, np.int64)
            keys, indices = keys[smallest], indices[smallest]
        keys = np.concatenate([self.keys, keys])
        both = np.concatenate([self.indices, indices])
        keep = np.argsort(keys, kind="stable")[:n]
        self.keys, self.indices = keys[keep], both[keep]

    def chosen(self) -> np.ndarray:
        """The sampled row indices, in dataset order."""
        return np.sort(self.indices)


@dataclass
class PassResult:
    """What the pass found: the sampled rows and how many rows matched the filter."""

    indices: np.ndarray
    matched: int


def scan(store: ParquetStore, stats: StatsAccumulator, sampling: Sampling, where: pc.Expression | None,
         where_columns: Sequence[str] | None = (), *, progress: Callable[[int, int], None] | None = None) -> PassResult:
    """Read every row group once (the statistics' columns and ``where_columns``, the filter's; None:
    every column), fold the matching rows into ``stats`` and choose the sample."""
    reservoir = Reservoir(sampling)
    every = list(store.schema.fields)
    columns = every if where_columns is None else list(dict.fromkeys([*stats.columns, *where_columns]))
    matched = 0
    todo = range(len(store.row_groups))
    for done, group in enumerate(todo):
        info = store.row_groups[group]
        table = store.read_row_group(group, columns) if columns else pa.table({"_": pa.nulls(info.num_rows)})
        rows = np.arange(info.first_row, info.first_row + info.num_rows, dtype=np.int64)
        if where is not None:
            mask = _evaluate(table, where)
            table, rows = table.filter(mask), rows[np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)]
        matched += len(rows)
        stats.add(table.select(stats.columns))
        reservoir.offer(rows, group)
        if progress is not None:
            progress(done + 1, len(todo))
    return PassResult(reservoir.chosen(), matched)


def _evaluate(table: pa.Table, where: pc.Expression) -> pa.Array:
    """The filter's value for each row of ``table``, null as False; a filter the rows' types cannot take
    (``score > 'a'``, a list column compared with a number) is a :class:`FilterExpressionError`
    (:func:`~unihub.readers.loader.evaluate_expression`'s, as the readers')."""
    mask = evaluate_expression(table, where)
    return pc.fill_null(mask.combine_chunks() if isinstance(mask, pa.ChunkedArray) else mask, False)

