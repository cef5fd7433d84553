"""Loading one planned task: read row group -> filter -> take rows -> decode -> transform.

The unit of work is (row group, rows, columns) -> decoded numpy columns (DESIGN.md
decision 2). Predicate and filter columns are read and tested first; the other columns
are read afterwards and only the matching rows are decoded, so a selective predicate
skips most of the image decoding. Whatever a task yields is a :class:`Batch`: an
ordered mapping of column name to a numpy array with one entry per row.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from unihub.errors import CodecError, FilterExpressionError, SchemaError
from unihub.readers.decode import (  # noqa: F401  (decode_column: API)
    UNIHUB,
    DecodePolicy,
    OnDecodeError,
    decode_column,
    decoded_images,
    undecodable_rows,
)
from unihub.readers.plan import ReadTask, task_rows
from unihub.readers.predicates import predicate_fields
from unihub.schema.arrow_numpy import take_table, to_numpy
from unihub.schema.codecs import BinaryCells
from unihub.schema.unischema import UnischemaField
from unihub.store.dataset import ParquetStore, RowGroupInfo, views_the_file

if TYPE_CHECKING:
    from unihub.readers.cache import Cache
    from unihub.readers.predicates import PredicateBase
    from unihub.readers.prefetch import RowGroupPrefetcher


#: the column a loader that hands images out encoded adds (``RowGroupLoader.late_images``): each
#: row's row number in the dataset, so that whoever decodes them reports a corrupt image where it is
SOURCE_ROW = "unihub_source_row"


@dataclass
class Batch:
    """Decoded columns of one task, all of length ``num_rows``."""

    columns: dict[str, Any]
    num_rows: int
    row_group: int = -1
    #: rows of the task itself; the rest were read past its end so NGram windows that start
    #: in the task can finish (None: every row is the task's)
    own_rows: int | None = None
    #: the rows of each task of the plan this batch's task stood for (``ReadTask.pieces``)
    pieces: tuple[int, ...] = ()
    #: where and why rows were dropped for images that do not decode (``on_decode_error='skip'``)
    skipped: tuple[str, ...] = ()
    #: the image columns handed out encoded (:func:`encoded_images`)
    encoded: frozenset[str] = frozenset()

    def slice(self, start: int, stop: int | None = None) -> Batch:
        stop = self.num_rows if stop is None else min(stop, self.num_rows)
        return Batch({k: v[start:stop] for k, v in self.columns.items()}, max(0, stop - start), self.row_group,
                     encoded=self.encoded)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a process pool's result): images handed out as views of the file (:func:`encoded_images`)
        go as bytes of their own, which pickle carries (a ragged field's arrays go as they are)."""
        return dict(self.__dict__, columns={name: _own_bytes(values) if name in self.encoded else values
                                            for name, values in self.columns.items()})


def _own_bytes(values: np.ndarray) -> np.ndarray:
    """An encoded image column (:func:`encoded_images`) with its views of the file as bytes."""
    return np.fromiter((v if v is None or type(v) is bytes else bytes(v) for v in values), dtype=object,
                       count=len(values))


def take_rows(table: pa.Table, rows: np.ndarray | None) -> pa.Table:
    """``table`` restricted to ``rows`` (in that order); ``None`` keeps it whole, and a run of
    consecutive rows is a slice (no copy)."""
    if rows is None:
        return table
    if len(rows) and rows[-1] - rows[0] == len(rows) - 1 and np.array_equal(rows, np.arange(rows[0], rows[-1] + 1)):
        return table.slice(int(rows[0]), len(rows))
    return take_table(table, rows)


class RecentReads:
    """The last few row groups read, shared by the threads of one reader.

    A row group cut into several tasks (``PlanConfig.task_rows``) is read once: the first task
    to ask reads it and the others wait for that read. Only partial tasks come here, so whole
    row groups are never held longer than their task. A process worker gets its own, empty.
    """

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._reads: OrderedDict[tuple[int, tuple[str, ...], frozenset[str]], Future[pa.Table]] = OrderedDict()

    def __reduce__(self) -> tuple[type, tuple[int]]:
        return RecentReads, (self.keep,)

    def get(self, row_group: int, columns: Sequence[str], read: Callable[[], pa.Table],
            views: frozenset[str] = frozenset()) -> pa.Table:
        """The table ``read()`` gives, read once for every task that asks for the same columns
        (and the same ``views``: a table with views is for decoding only)."""
        key = (row_group, tuple(columns), views)
        with self._lock:
            pending = self._reads.get(key)
            mine = pending is None
            if pending is None:
                pending = self._reads[key] = Future()
                while len(self._reads) > self.keep:
                    self._reads.popitem(last=False)
            else:
                self._reads.move_to_end(key)
        if mine:
            try:
                pending.set_result(read())
            except BaseException as exc:
                pending.set_exception(exc)
                with self._lock:
                    if self._reads.get(key) is pending:
                        del self._reads[key]  # the next task tries again
        return pending.result()


@dataclass
class RowGroupLoader:
    """Callable that turns a :class:`ReadTask` into a :class:`Batch` (runs in the workers)."""

    store: ParquetStore
    fields: Sequence[UnischemaField]
    seed: int
    predicate: PredicateBase | None = None
    filter_expression: pc.Expression | None = None
    filter_columns: tuple[str, ...] = ()
    transform: Callable[[Batch], Batch] | None = None
    decode_images: bool = True
    cache: Cache | None = None
    #: rows read past the end of a task cut from a row group in natural order (NGram length - 1),
    #: so that windows starting in the task are whole; Petastorm does the same
    window_overlap: int = 0
    #: Petastorm's types or unihub's (nulls, uniform lists; see readers/decode.py)
    policy: DecodePolicy = UNIHUB
    #: image fields handed out encoded, with :data:`SOURCE_ROW`, for a consumer that decodes them
    #: after shuffling (readers/late_decode.py)
    late_images: frozenset[str] = frozenset()
    #: row groups that tasks cut from one row group share (read once)
    recent: RecentReads = field(default_factory=RecentReads, repr=False, compare=False)
    #: an image that fails to decode: raise (naming where it is), or drop its row (readers/decode.py)
    on_decode_error: OnDecodeError = "raise"
    #: the read-ahead of a remote dataset (readers/prefetch.py): row groups it fetched are read from memory
    prefetch: RowGroupPrefetcher | None = field(default=None, repr=False, compare=False)

    def __call__(self, job: tuple[int, int, ReadTask]) -> Batch:
        epoch, _, task = job
        info = self.store.row_groups[task.row_group]
        own_rows = None
        if self.window_overlap and not task.shuffle_rows and task.stop < info.num_rows:
            own_rows = task.num_rows
            task = dataclasses.replace(task, stop=min(info.num_rows, task.stop + self.window_overlap))
        rows = task_rows(task, self.seed, epoch, info.num_rows)
        partial = task.num_rows < info.num_rows
        pre_columns = self._pre_columns()
        decoded: dict[str, Any] = {}
        if pre_columns:
            rows, own_rows, decoded = self._filtered(task.row_group, pre_columns, partial, info, rows, own_rows)
        rest = [f.name for f in self.fields if f.name not in decoded]
        views = decoded_images(self.fields, self.decode_images)
        table = take_rows(self._read(task.row_group, rest, partial, views), rows) if rest else None
        pieces = task.pieces
        skipped: tuple[str, ...] = ()
        try:
            columns = self._decoded(table, decoded, info, rows)
        except CodecError:
            dropped = self._without_undecodable(table, decoded, info, rows, own_rows, pieces) \
                if self.on_decode_error == "skip" and table is not None else None
            if dropped is None:  # not asked to skip, or no row fails alone (then not a corrupt image)
                raise
            table, decoded, rows, own_rows, pieces, skipped = dropped
            columns = self._decoded(table, decoded, info, rows)
        num_rows = table.num_rows if table is not None else (len(rows) if rows is not None else info.num_rows)
        if self.late_images:
            columns[SOURCE_ROW] = info.first_row + (np.arange(num_rows, dtype=np.int64) if rows is None
                                                    else np.asarray(rows, dtype=np.int64))
        batch = Batch(columns, num_rows, task.row_group, own_rows, pieces, skipped, self.late_images)
        if self.transform is not None:
            batch = self.transform(batch)
        return batch

    def _filtered(self, row_group: int, pre_columns: list[str], partial: bool, info: RowGroupInfo,
                  rows: np.ndarray | None, own_rows: int | None
                  ) -> tuple[np.ndarray, int | None, dict[str, Any]]:
        """The task's rows that pass ``filters`` and the predicate, NGram's own rows among them, and the
        columns decoded to decide (kept where the reader reads them)."""
        pre = take_rows(self._read(row_group, pre_columns, partial), rows)
        decoded: dict[str, Any] = {}
        try:
            keep = self._filter_mask(pre, decoded, rows_hint=row_group)
        except CodecError as exc:
            raise located(exc, info, rows) from exc
        idx = np.flatnonzero(keep)
        if own_rows is not None:
            own_rows = int(np.searchsorted(idx, own_rows))
        rows = (np.arange(info.num_rows) if rows is None else rows)[idx]
        return rows, own_rows, {name: values[idx] for name, values in decoded.items()}

    def _decoded(self, table: pa.Table | None, decoded: dict[str, Any], info: RowGroupInfo,
                 rows: np.ndarray | None) -> dict[str, Any]:
        """Every field's values: those decoded to filter, the rest from ``table`` (late images encoded);
        a decode error names the file, row group and row (:func:`located`)."""
        columns: dict[str, Any] = {}
        for f in self.fields:
            if f.name in decoded:
                columns[f.name] = decoded[f.name]
                continue
            assert table is not None
            if f.name in self.late_images:
                columns[f.name] = encoded_images(table, f.name)
                continue
            try:
                columns[f.name] = decode_column(f, table.column(f.name), decode_images=self.decode_images,
                                                policy=self.policy)
            except CodecError as exc:
                raise located(exc, info, rows) from exc
        return columns

    def _without_undecodable(self, table: pa.Table, decoded: dict[str, Any], info: RowGroupInfo,
                             rows: np.ndarray | None, own_rows: int | None, pieces: tuple[int, ...]
                             ) -> tuple[pa.Table, dict[str, Any], np.ndarray, int | None, tuple[int, ...],
                                        tuple[str, ...]] | None:
        """The task's rows without those whose images do not decode (``on_decode_error='skip'``), and
        where and why each was dropped; what counts rows (NGram's own rows, the plan's pieces) follows.
        None where no row fails on its own."""
        fields = [f for f in self.fields if f.name not in decoded and f.name not in self.late_images]
        blobs = {f.name: table.column(f.name).to_pylist() for f in fields if self.decode_images and
                 f.name in table.column_names}
        bad = undecodable_rows(fields, blobs)
        if not bad:
            return None
        dropped = np.asarray(sorted(bad), dtype=np.int64)
        keep = np.setdiff1d(np.arange(table.num_rows, dtype=np.int64), dropped)
        skipped = tuple(str(located(bad[row], info, rows)) for row in dropped.tolist())
        rows = (np.arange(info.num_rows, dtype=np.int64) if rows is None else np.asarray(rows))[keep]
        if own_rows is not None:
            own_rows -= int(np.count_nonzero(dropped < own_rows))
        if pieces:
            ends = np.cumsum(pieces)
            lost = np.bincount(np.searchsorted(ends, dropped, side="right"), minlength=len(pieces))
            pieces = tuple(int(n) for n in np.asarray(pieces) - lost)
        decoded = {name: values[keep] for name, values in decoded.items()}
        return take_table(table, keep), decoded, rows, own_rows, pieces, skipped

    def _pre_columns(self) -> list[str]:
        names: list[str] = list(self.filter_columns)
        if self.predicate is not None:
            names += [n for n in predicate_fields(self.predicate) if n not in names]
        return names

    def _read(self, row_group: int, columns: list[str], partial: bool = False,
              views: frozenset[str] = frozenset()) -> pa.Table:
        """The row group's ``columns``; through :class:`RecentReads` for a task that is part of one.
        Image columns in ``views`` may come as views of the file (``ParquetStore.read_row_group``)."""
        if partial:
            return self.recent.get(row_group, columns, lambda: self._read(row_group, columns, views=views), views)
        if self.cache is not None:
            return self.cache.get_row_group(self.store, row_group, columns)
        fetched = self.prefetch.take(row_group) if self.prefetch is not None else None
        return self.store.read_row_group(row_group, columns, views=views, fetched=fetched)

    def _filter_mask(self, pre: pa.Table, decoded: dict[str, Any], rows_hint: int) -> np.ndarray:
        """Rows of ``pre`` that pass ``filters`` and the predicate; fills ``decoded``."""
        keep = np.ones(pre.num_rows, dtype=bool)
        if self.filter_expression is not None and pre.num_rows:
            mask = pc.fill_null(evaluate_expression(pre, self.filter_expression), False)
            keep &= np.asarray(to_numpy(mask), dtype=bool)
        if self.predicate is not None:
            by_name = {f.name: f for f in self.store.schema}
            for name in predicate_fields(self.predicate):
                if name not in by_name:
                    raise SchemaError(f"predicate uses field {name!r}, which is not in the dataset; "
                                      f"fields: {list(by_name)}")
                decoded[name] = decode_column(by_name[name], pre.column(name), policy=self.policy)
            keep &= np.asarray(self.predicate.evaluate(decoded, pre.num_rows), dtype=bool)
        wanted = {f.name for f in self.fields}
        for name in list(decoded):
            if name not in wanted:
                del decoded[name]
        return keep


def encoded_images(table: pa.Table, name: str) -> np.ndarray:
    """An image column handed out encoded (``RowGroupLoader.late_images``): an object array of its
    values (None for nulls). Views of the memory-mapped file stay views (a row held in a shuffling
    queue pins nothing but the file's pages); values pyarrow read into memory are copied out one by
    one, so that a few rows held do not keep their whole row group's bytes alive."""
    column = table.column(name)
    # views as numpy arrays, which the garbage collector does not track (a queue of memoryviews sets off
    # full collections: schema/codecs/binary.py); LateImages.decode gives the decoders memoryviews of them
    values = BinaryCells(column).at(untracked=True) if views_the_file(table.schema.field(name)) else column.to_pylist()
    return np.fromiter(values, dtype=object, count=len(values))  # an array or memoryview is one value each


def located(exc: CodecError, info: RowGroupInfo, rows: np.ndarray | None) -> CodecError:
    """``exc`` with its file and row group named and its row counted inside the row group.

    A codec counts rows in the batch it decoded, which ``rows`` (shuffled, sliced or
    filtered) took from the row group; the message and ``.row`` give the stored row instead.
    """
    where = f"{info.path}, row group {info.row_group}"
    message, row = str(exc), exc.row
    if row is not None:
        local = int(rows[row]) if rows is not None and 0 <= row < len(rows) else row
        message = re.sub(rf"\brow {row}\b", f"row {local}", message, count=1)
        where += f" (row {info.first_row + local} of the dataset)"
        row = local
    try:
        return type(exc)(f"{where}: {message}", field=exc.field, row=row)
    except TypeError:  # a subclass with another signature
        return CodecError(f"{where}: {message}", field=exc.field, row=row)


def evaluate_expression(table: pa.Table, expression: pc.Expression) -> pa.Array:
    """``expression`` (a pyarrow.compute filter) evaluated over ``table``: one value per row."""
    import pyarrow.dataset as ds

    try:
        return ds.dataset(table).to_table(columns={"_keep": expression}).column("_keep")
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:  # e.g. a string compared with ints
        raise FilterExpressionError(f"filters {expression} cannot be evaluated on the columns "
                                    f"{', '.join(f'{f.name} ({f.type})' for f in table.schema)}: {exc}") from exc


def filters_to_expression(filters: Any) -> tuple[pc.Expression | None, tuple[str, ...]]:
    """pyarrow DNF filters (``[("a", ">", 3)]`` or ``[[...], [...]]``) or an expression."""
    if filters is None:
        return None, ()
    import pyarrow.parquet as pq

    if isinstance(filters, pc.Expression):
        return filters, ()  # the caller reads every column: an expression does not list its fields
    else:
        expression = pq.filters_to_expression(filters)
        flat = filters if filters and isinstance(filters[0], tuple) else [c for conj in filters for c in conj]
        names = tuple(dict.fromkeys(str(term[0]) for term in flat))
    return expression, tuple(names)


def check_filter_columns(names: Sequence[str], fields: Sequence[str], url: str) -> None:
    """:class:`FilterExpressionError` naming the columns of ``filters`` that are no field of the dataset at
    ``url`` (pyarrow's own error came only at the first read, and named no dataset)."""
    unknown = [name for name in names if name not in fields]
    if unknown:
        raise FilterExpressionError(f"filters name {', '.join(map(repr, unknown))}, which "
                                    f"{'is not a field' if len(unknown) == 1 else 'are not fields'} of {url}; "
                                    f"its fields: {', '.join(fields)}")
