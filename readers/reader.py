"""The reader: ``make_reader`` (rows) and ``make_batch_reader`` (batches), Petastorm's API.

A :class:`Reader` plans each epoch (:mod:`unihub.readers.plan`), runs the tasks in a
worker pool (:mod:`unihub.readers.workers`) through a :class:`RowGroupLoader`, and
delivers rows (namedtuples of numpy values) or batches (namedtuples of column arrays)
in plan order. Its position is ``(epoch, task, offset)``: :meth:`Reader.state_dict`
after any row, :meth:`Reader.load_state_dict` (or ``resume_from=``) in a new reader,
and the rows not yet delivered come next, in the same order.

    with make_reader("file:///data/train", schema_fields=["image", "label"], num_epochs=2) as reader:
        for row in reader:
            train_step(row.image, row.label)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import threading
import warnings
from collections.abc import Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from unihub.errors import (
    InvalidArgumentError,
    NoMatchingFieldsError,
    ReaderResetError,
    ReaderStateError,
    UnsupportedFormatError,
    UsageError,
)
from unihub.readers import elastic
from unihub.readers import plan as planning
from unihub.readers.cache import Cache, NullCache
from unihub.readers.decode import DecodePolicy, DecodeSkips, OnDecodeError, check_on_decode_error, with_policy_types
from unihub.readers.loader import (
    SOURCE_ROW,
    Batch,
    RowGroupLoader,
    check_filter_columns,
    evaluate_expression,
    filters_to_expression,
)
from unihub.readers.predicates import PredicateBase, per_row_group, predicate_fields, unusable_predicate
from unihub.readers.prefetch import PrefetchStats, RowGroupPrefetcher
from unihub.readers.rowgroup_index import apply_rowgroup_selector
from unihub.readers.transform import TransformSpec, apply_to_batch, apply_to_rows, transform_schema
from unihub.readers.workers import Pool, PoolType, check_pool_arguments, usable_cores
from unihub.runtime.memory import batch_nbytes, memory_budget
from unihub.runtime.world import shard_or_detected
from unihub.schema.codecs import CompressedImageCodec
from unihub.schema.unischema import Unischema, UnischemaField, infer_field, select_unischema_fields
from unihub.store.dataset import ParquetStore, open_dataset, partition_value

if TYPE_CHECKING:
    from unihub.readers.late_decode import LateImages

STATE_VERSION = 1


class SkipTarget(NamedTuple):
    """Where :meth:`Reader.skip_rows` goes: ``state`` to load, rows of its task still to drop (a batch
    reader's), and how many rows that skips (fewer than asked where the reader ends first)."""

    state: dict[str, Any]
    rows_into_task: int
    rows: int


def _check_epochs_and_shards(num_epochs: Any, cur_shard: Any, shard_count: Any, shard_by: planning.ShardBy,
                             seed: int | None, *, shuffles: bool) -> None:
    """Raise :class:`InvalidArgumentError` for an epoch count or shard that cannot be, and for a row-sharded
    shuffled read without a seed (each rank would shuffle its own way: rows lost and repeated)."""
    if num_epochs is not None and (not isinstance(num_epochs, (int, np.integer)) or num_epochs < 1):
        raise InvalidArgumentError(f"num_epochs must be a positive integer or None (forever), got {num_epochs!r}")
    if seed is not None and (not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0):
        # else numpy's bare "expected non-negative integer" at the first read, or int('x')'s words
        raise InvalidArgumentError(f"seed must be a non-negative int or None (a fresh one), got {seed!r}")
    for name, value in (("cur_shard", cur_shard), ("shard_count", shard_count)):
        if value is not None and (not isinstance(value, (int, np.integer)) or isinstance(value, bool)):
            raise InvalidArgumentError(f"{name} must be an int or None, got {value!r}")
    if shard_by == "row" and shard_count is not None and shard_count > 1 and seed is None and shuffles:
        raise InvalidArgumentError(
            "shard_by='row' cuts each epoch's shuffled order into blocks, so every rank must shuffle alike: "
            "pass the same seed= on every rank (or shuffle_row_groups=False, shuffle_rows=False)")


def _checked_pool(store: ParquetStore, pool_type: PoolType, workers_count: int | None,
                  results_queue_size: Any, read_ahead: bool = False) -> int:
    """The workers' count (the store's default for None; ``read_ahead``: remote row groups are fetched
    ahead), once the pool's arguments are known to be valid."""
    if workers_count is None:
        workers_count = default_workers_count(store, read_ahead and pool_type == "thread")
    check_pool_arguments(pool_type, workers_count)
    if not isinstance(results_queue_size, int) or isinstance(results_queue_size, bool) or results_queue_size < 1:
        raise InvalidArgumentError(f"results_queue_size must be an int >= 1, got {results_queue_size!r}")
    return int(workers_count)


def random_seed() -> int:
    """A fresh seed in ``[0, 2**63)`` from the OS's entropy (what ``seed=None`` means)."""
    entropy = np.random.SeedSequence().entropy
    assert isinstance(entropy, int)  # a SeedSequence made without entropy draws an int
    return entropy % (2**63)


class Reader:
    """Iterates rows or batches of a dataset; see :func:`make_reader` and :func:`make_batch_reader`."""

    def __init__(self, store: ParquetStore, *, fields: Sequence[UnischemaField], batched: bool,
                 ngram: Any = None, predicate: PredicateBase | None = None, filters: Any = None,
                 transform_spec: TransformSpec | None = None, shuffle_row_groups: bool = True,
                 shuffle_rows: bool = False, shuffle_row_drop_partitions: int = 1, seed: int | None = None,
                 num_epochs: int | None = 1, cur_shard: int | None = None, shard_count: int | None = None,
                 shard_by: planning.ShardBy = "row_group", shard_remainder: planning.ShardRemainder = "pad",
                 reader_pool_type: PoolType = "thread", workers_count: int | None = None, results_queue_size: int = 50,
                 cache: Cache | None = None, decode_images: bool = True,
                 resume_from: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
                 petastorm_types: bool | None = None, rowgroup_selector: Any = None, memory_budget_mb: float | None = None,
                 on_decode_error: OnDecodeError = "raise", read_ahead_mb: float | None = None) -> None:
        _check_epochs_and_shards(num_epochs, cur_shard, shard_count, shard_by, seed,
                                 shuffles=shuffle_row_groups or shuffle_rows)
        self.store = store
        #: rows dropped for images that do not decode (``on_decode_error='skip'``; readers/decode.py)
        self._decode_skips = DecodeSkips()
        #: Petastorm's ``Reader.cache``: the local-disk cache, or a NullCache
        self.cache: Any = cache if cache is not None else NullCache()
        self.batched = batched
        self.ngram = ngram
        self.num_epochs = num_epochs
        self._read_fields = list(fields)
        self._predicate = predicate
        self._transform_spec = transform_spec
        self._filters = filters
        read_schema = Unischema(store.schema.name, self._read_fields, attributes=store.schema.attribute_names)
        self.schema = transform_schema(read_schema, transform_spec)
        if seed is None:
            seed = random_seed()
        self.seed = int(seed)
        expression, filter_columns = filters_to_expression(filters)
        check_filter_columns(filter_columns, tuple(store.schema.fields), store.url)
        if expression is not None and not filter_columns:
            filter_columns = tuple(f.name for f in store.schema)
        #: a predicate the dataset cannot serve: raised at the first read, as Petastorm's workers raised it
        self._predicate_error = unusable_predicate(predicate, store.schema.fields, store.url) \
            if predicate is not None else None
        self._groups = self._chosen_row_groups(None if self._predicate_error else predicate, expression,
                                               filter_columns, rowgroup_selector)
        cut = decode_task_rows(self._read_fields, decode_images) if ngram is None else None
        self._fingerprint_of: tuple[planning.PlanConfig, str, str] | None = None
        #: what ranks delivered of epochs before an elastic resume (readers/elastic.py): those epochs' plans
        #: are this shard's run of the rest
        self._done: dict[int, planning.Intervals] = {}
        self._plan = planning.PlanConfig(
            row_group_sizes=tuple(store.row_groups[g].num_rows for g in self._groups), seed=self.seed,
            # an NGram's rows are sorted by timestamp into windows anyway: tasks cut from a row group (drop
            # partitions, row shards) take runs of consecutive rows, or windows across their cuts were lost
            shuffle_row_groups=shuffle_row_groups, shuffle_rows=shuffle_rows and ngram is None,
            shuffle_row_drop_partitions=shuffle_row_drop_partitions, cur_shard=cur_shard, shard_count=shard_count,
            shard_by=shard_by, shard_remainder=shard_remainder,
            task_rows=cut, first_task_rows=None if cut is None else max(1, cut // FIRST_TASK_SHARE),
            dataset_row_groups=len(store.row_groups) if len(self._groups) < len(store.row_groups) else None)
        self._warn_if_the_shard_is_empty()
        self._loader = self._make_loader(predicate, expression, filter_columns, decode_images=decode_images,
                                         cache=cache, petastorm_types=petastorm_types, on_decode_error=on_decode_error)
        #: bytes of row groups a remote dataset's read-ahead holds (readers/prefetch.py; 0: none)
        self._read_ahead_bytes = read_ahead_bytes(read_ahead_mb, memory_budget_mb)
        fetched_ahead = bool(self._read_ahead_bytes) and (cache is None or isinstance(cache, NullCache))
        workers_count = _checked_pool(store, reader_pool_type, workers_count, results_queue_size,
                                      read_ahead=fetched_ahead)
        self._pool_type, self._workers_count = reader_pool_type, workers_count
        self._window = max(2, min(results_queue_size, 2 * workers_count + 2))
        #: decoded results in flight are held to about this many bytes too (unihub.runtime.memory)
        self._max_bytes = memory_budget(memory_budget_mb).queue_bytes
        self._prefetch: RowGroupPrefetcher | None = None
        #: the read-ahead begun when the reader was made, and the (epoch, task) it begins at: the first
        #: ``next()`` from there takes it over (see _begin_read_ahead)
        self._early: tuple[tuple[int, int], RowGroupPrefetcher] | None = None
        # the position is (epoch, task, offset): _position while no batch is loaded, else derived
        # from the loaded batch (_current), its items and the cursor (see _where)
        self._position = (0, 0, 0)
        self._items: Sequence[Any] = []
        self._batch_columns: list[Any] | None = None  # the loaded batch's columns (a row reader's)
        self._cursor = 0
        self._first = 0  # the cursor where the loaded batch started (a resumed offset)
        self._current: tuple[int, int] | None = None
        self._current_pieces: tuple[int, ...] = ()  # the loaded batch's tasks of the plan (Batch.pieces)
        self._skip = 0
        self._skip_rows = 0  # a batch reader's seek(): rows cut off the front of the next batch
        #: rows after a resumed position that a loader had delivered (the state's skip/exclude): not delivered again
        self._drops: elastic.Drops | None = None
        self._batch_origin = 0  # with drops: the stream offset (elastic.Drops) of the loaded batch's row 0
        #: where rows were dropped from the loaded batch: the batch's row of each item (a batch reader's: the start
        #: of its task); None: the items are the batch's rows (tasks) one for one
        self._item_rows: np.ndarray | None = None
        self._iterator: Iterator[tuple[int, int, Batch]] | None = None  # (epoch, task, batch)
        self._pool: Pool | None = None
        self._finished = False
        self._reading = False  # rows of the current run were loaded (reset() mid-epoch is refused)
        self._stopped = False
        self._lock = threading.Lock()  # next(): one caller at a time, so shared readers neither drop nor repeat
        self._delivered = 0
        self._batches = 0
        self._row_type: type[Any] = self.schema._get_namedtuple()  # a namedtuple class made for the schema
        self._item_names: tuple[str, ...] = tuple(self.schema.fields)  # the columns of an item, in order
        if resume_from is not None:
            self.load_state_dict(resume_from)
        self._begin_read_ahead()

    def _warn_if_the_shard_is_empty(self) -> None:
        """Petastorm's warning where the row groups a predicate, filters or a selector chose leave this row-group
        shard none (the reader yields nothing; the other shards read them)."""
        plan = self._plan
        if self._groups and plan.shard_by == "row_group" and plan.cur_shard is not None and \
                plan.shard_count is not None and plan.cur_shard >= len(self._groups):
            warnings.warn("No matching data is available for loading after rowgroup selector were applied and the "
                          f"data was sharded: shard {plan.cur_shard} of {plan.shard_count} has none of the "
                          f"{len(self._groups)} row groups chosen; the reader yields nothing", UserWarning, stacklevel=5)

    def _make_loader(self, predicate: PredicateBase | None, expression: Any, filter_columns: tuple[str, ...], *,
                     decode_images: bool, cache: Cache | None, petastorm_types: bool | None,
                     on_decode_error: OnDecodeError) -> RowGroupLoader:
        """The loader the workers run: the predicate per row (per row group for a batch reader), unless
        the dataset cannot serve it or the row groups' selection already applied it (partitions only)."""
        store, batched, ngram = self.store, self.batched, self.ngram
        row_predicate = None if self._predicate_error or _on_partitions_only(predicate, store) else predicate
        policy = DecodePolicy.for_store(store.schema_source, petastorm_types, batched=batched)
        return RowGroupLoader(store, self._read_fields, self.seed,
                              predicate=per_row_group(row_predicate) if batched and row_predicate is not None
                              else row_predicate,
                              filter_expression=expression, filter_columns=filter_columns,
                              transform=self._make_transform(policy), decode_images=decode_images,
                              cache=cache, window_overlap=ngram.length - 1 if ngram is not None else 0,
                              policy=policy, on_decode_error=check_on_decode_error(on_decode_error))

    # -- planning ---------------------------------------------------------------------------
    def _chosen_row_groups(self, predicate: PredicateBase | None, expression: Any, filter_columns: tuple[str, ...],
                           rowgroup_selector: Any) -> list[int]:
        """Row groups to read (:meth:`_select_row_groups`, then Petastorm's ``rowgroup_selector``); warns,
        as Petastorm does, where none is left: an empty reader is not an error, but never a silent one."""
        store = self.store
        groups = self._select_row_groups(predicate, expression, filter_columns)
        if rowgroup_selector is not None:  # Petastorm's row-group indexes (readers/rowgroup_index.py)
            groups = apply_rowgroup_selector(store, rowgroup_selector, groups)
        if not groups:
            why = (f"the predicate, filters or rowgroup_selector left none of the {len(store.row_groups)} row groups "
                   f"of {store.url}") if store.row_groups else f"{store.url} holds no rows"
            warnings.warn("No matching data is available for loading after rowgroup selector were applied and the "
                          f"data was sharded: {why}; the reader yields nothing", UserWarning, stacklevel=5)
        return groups

    def _select_row_groups(self, predicate: PredicateBase | None, expression: Any,
                           filter_columns: tuple[str, ...]) -> list[int]:
        """Row groups to read: all, minus partitions a partition-only predicate or filter excludes."""
        store = self.store
        groups = list(range(len(store.row_groups)))
        parts = set(store.partition_names)
        if not parts:
            return groups
        by_partition: dict[tuple[tuple[str, str], ...], bool] = {}
        for rg in store.row_groups:
            if rg.partition in by_partition:
                continue
            values = {k: partition_value(store.schema[k], v) for k, v in rg.partition}
            keep = True
            if predicate is not None and _on_partitions_only(predicate, store):
                keep = bool(predicate.do_include(values))
            if keep and expression is not None and filter_columns and set(filter_columns) <= parts:
                table = pa.table({k: pa.array([values[k]], type=store.schema[k].arrow_type()) for k in values})

                keep = bool(evaluate_expression(table, expression)[0].as_py())
            by_partition[rg.partition] = keep
        return [g for g in groups if by_partition[store.row_groups[g].partition]]

    def _make_transform(self, policy: DecodePolicy):
        """The transform the loader runs; a batch transform's output takes ``policy``'s types, as read columns do."""
        spec = self._transform_spec
        if spec is None:
            return None
        out = self.schema
        if self.batched:
            def run(batch: Batch) -> Batch:
                columns = apply_to_batch(spec, out, batch.columns)
                columns = {name: with_policy_types(out[name], values, policy) for name, values in columns.items()}
                n = len(next(iter(columns.values()))) if columns else 0
                return dataclasses.replace(batch, columns=columns, num_rows=n)
        else:
            def run(batch: Batch) -> Batch:
                columns = apply_to_rows(spec, out, batch.columns, batch.num_rows)
                return dataclasses.replace(batch, columns=columns)
        return run

    def plan_of(self, epoch: int, config: planning.PlanConfig | None = None) -> list[planning.ReadTask]:
        """This shard's tasks of ``epoch`` (row groups numbered among the chosen ones), as the position
        counts them: the plan, or after an elastic resume this shard's run of what was left."""
        return planning.rank_plan(self._plan if config is None else config, epoch, self._done)

    def _epoch_tasks(self, epoch: int) -> list[planning.ReadTask]:
        tasks = self.plan_of(epoch)
        return [dataclasses.replace(t, row_group=self._groups[t.row_group]) for t in tasks]

    def _jobs(self, epoch: int, task: int) -> Iterator[tuple[int, int, planning.ReadTask]]:
        merge = self._merges_tasks()
        while self.num_epochs is None or epoch < self.num_epochs:
            tasks = self._epoch_tasks(epoch)
            if merge:
                for index, merged in planning.merged_tasks(tasks, task):
                    yield epoch, index, merged
            else:
                for index in range(task, len(tasks)):
                    yield epoch, index, tasks[index]
            epoch, task = epoch + 1, 0

    def _merges_tasks(self) -> bool:
        """Whether a row group's tasks are read as one: where its images are decoded later, the
        tasks are cut for decoding that no longer happens in them, and every piece only costs (one
        more read of its row group, one more batch for the loader). Not where a predicate or filters
        drop rows: a position counts the rows a task delivers, which are then known only per task."""
        loader = self._loader
        return bool(loader.late_images) and loader.predicate is None and loader.filter_expression is None \
            and loader.transform is None and not loader.window_overlap

    # -- iteration ----------------------------------------------------------------------------
    def __iter__(self) -> Reader:
        return self

    def _start(self) -> Iterator[tuple[int, int, Batch]]:
        if self._predicate_error is not None:
            raise self._predicate_error.with_traceback(None)  # each read's own traceback
        epoch, task, offset = self._where()
        if self._pool is not None:  # a pool left by an error: release its workers first
            self._pool.stop()
            self._pool.join()
        if self._prefetch is not None:
            self._prefetch.join()
        self._pool = Pool(self._pool_type, self._workers_count)
        jobs: Iterator[tuple[int, int, planning.ReadTask]] = self._jobs(epoch, task)
        early, self._early = self._early, None
        if early is not None and early[0] == (epoch, task) and not early[1].closed:  # begun when the reader was made
            self._prefetch = self._loader.prefetch = early[1]
            jobs = early[1].tasks()
        else:
            if early is not None:  # stopped, or moved since (seek, load_state_dict): its row groups may be others
                early[1].join()
            self._prefetch = self._loader.prefetch = self._make_prefetcher()
            if self._prefetch is not None:
                jobs = self._prefetch.tasks(jobs)
        # merged tasks read whole row groups of encoded images, cheaply: reading further ahead than
        # one each and one more only takes the cores from the first batches' decoding (first shuffled
        # batch 25 -> 22 ms, benchmarks/peers.py's data)
        window = min(self._window, self._workers_count + 1) if self._merges_tasks() else self._window
        self._iterator = iterator = self._pool.imap(partial(_load_job, self._loader), jobs, window,
                                                    max_bytes=self._max_bytes, size_of=_job_nbytes)
        if self._drops is not None:  # the first batch is read from the position
            self._drops.next = self._stream_where()
        self._skip = offset
        return iterator

    def _make_prefetcher(self) -> RowGroupPrefetcher | None:
        """The read-ahead of row groups, for a remote dataset read by threads (process workers could
        not reach its buffers) and not through the local-disk cache; None otherwise."""
        if not self._read_ahead_bytes or self._pool_type == "process" or self._cache_in_use() or \
                isinstance(self.store.filesystem, pafs.LocalFileSystem):
            return None
        loader = self._loader
        columns = [f.name for f in loader.fields]
        columns += [name for name in loader._pre_columns() if name not in columns]
        return RowGroupPrefetcher(self.store, columns, self._read_ahead_bytes)

    def _begin_read_ahead(self) -> None:
        """Start the read-ahead now, in its threads, from the reader's position (where it would have one):
        the first row group's GETs are under way while the caller builds its loader, not from the first
        ``next()``. Moved from that position before reading (seek, load_state_dict), it is dropped."""
        if self._predicate_error is not None:
            return
        prefetch = self._make_prefetcher()
        if prefetch is None:
            return
        epoch, task, _ = self._where()
        prefetch.begin(self._jobs(epoch, task))
        self._early = ((epoch, task), prefetch)

    def _drop_early(self, wait: bool = False) -> None:
        """Stop the read-ahead begun when the reader was made, if no run took it over (``wait``: and wait for its
        fetch threads, then forget it; else it is kept for :meth:`join` to wait for)."""
        if self._early is None:
            return
        if wait:
            early, self._early = self._early, None
            early[1].join()
        else:
            self._early[1].close()

    def _cache_in_use(self) -> bool:
        return self._loader.cache is not None and not isinstance(self._loader.cache, NullCache)

    @property
    def read_ahead(self) -> PrefetchStats | None:
        """What the read-ahead of the last run did (row groups and bytes fetched, GETs, the most bytes
        held at once); None where there was none (local data, process workers, the local-disk cache)."""
        prefetch = self._prefetch if self._prefetch is not None else self._early[1] if self._early else None
        return prefetch.stats if prefetch is not None else None

    def __next__(self) -> Any:
        # the per-row path: one index and one counter under a lock (threads sharing a reader get
        # every row once); the position is derived when asked for
        with self._lock:
            cursor = self._cursor
            if cursor < len(self._items) and not self._stopped:
                self._cursor = cursor + 1
                return self._items[cursor]
            if self._stopped:
                raise UsageError("Trying to read a sample after a reader created by make_reader/make_batch_reader "
                                 "has stopped: next() on a reader that was stopped (its with-block ended, or stop() "
                                 "was called); reset() or load_state_dict() make it readable again")
            return self._next_from_new_batch()

    def _next_from_new_batch(self) -> Any:
        self._load_next_batch()
        if isinstance(self._items, _Rows):  # read row by row: a plain list keeps next() an index
            self._items = self._items.rows()
        item = self._items[self._cursor]
        self._cursor += 1
        return item

    def _load_next_batch(self) -> None:
        """Read batches until one has an item left to deliver; StopIteration at the end."""
        while self._cursor >= len(self._items):
            if self._finished:
                raise StopIteration
            iterator = self._iterator  # a local: stop() from another thread may set self._iterator to None
            if iterator is None:
                iterator = self._start()
            try:
                epoch, index, batch = next(iterator)
            except StopIteration:
                if self._stopped:  # stop() from another thread: the position stays where it was
                    raise
                self._finished = True
                self._set_position((self.num_epochs or 0, 0, 0))
                self._drops = None
                raise
            except BaseException:
                self._halt()  # the next call retries the failed task
                raise
            self._delivered += self._cursor - self._first
            self._decode_skips.add(batch.skipped)
            self._reading = True
            self._current, self._current_pieces = (epoch, index), batch.pieces
            self._item_rows = None
            if self._drops is None or not self._drop_rows(batch):
                self._items = self._to_items(batch)
                self._cursor = self._first = min(self._skip, len(self._items))
            self._batch_columns = self._items.columns if isinstance(self._items, _Rows) else None
            self._skip = 0

    def _drop_rows(self, batch: Batch) -> bool:
        """Load ``batch`` without the rows :attr:`_drops` names, if it holds any (False: it holds none)."""
        drops = self._drops
        assert drops is not None
        skip, rows = self._skip, batch.num_rows  # rows before skip: before the resumed position
        self._batch_origin = origin = drops.next - skip
        drops.next = origin + rows
        dropped = drops.within(origin + skip, origin + rows)
        if dropped is None:
            if drops.passed(origin + skip):
                self._drops = None
            return False
        keep = np.ones(rows, dtype=bool)
        keep[:skip] = False
        keep[dropped + skip] = False
        columns = [batch.columns[name] for name in self._item_names]
        if self.batched:
            self._items, self._item_rows = self._kept_batches(columns, batch.pieces or (rows,), keep)
        else:
            kept = self._item_rows = np.flatnonzero(keep)
            self._items = _Rows([_take(c, kept) for c in columns], self._row_type) if columns and kept.size else []
        self._cursor = self._first = 0
        return True

    def _kept_batches(self, columns: list[Any], pieces: Sequence[int], keep: np.ndarray
                      ) -> tuple[list[Any], np.ndarray]:
        """A batch reader's items of a batch without the rows ``keep`` leaves out, a batch per task of the plan
        (none where a task has no row left), and the batch's row each task starts at."""
        items, starts = [], []
        bounds = np.cumsum((0, *pieces)).tolist()
        for a, b in zip(bounds[:-1], bounds[1:]):
            kept = np.flatnonzero(keep[a:b]) + a
            if kept.size:
                items.append(self._row_type(*(_take(c, kept) for c in columns)))
                starts.append(a)
        self._batches += len(items)
        return items, np.asarray(starts, dtype=np.int64)

    def _stream_where(self) -> int:
        """The stream offset (:attr:`_drops`' count) of the next item to deliver."""
        drops = self._drops
        assert drops is not None
        cursor = self._cursor
        if self._current is None or cursor >= len(self._items):
            return drops.next
        if self._item_rows is not None:
            return self._batch_origin + int(self._item_rows[cursor])
        if self.batched:  # an item per task of the plan
            return self._batch_origin + sum(self._current_pieces[:cursor])
        return self._batch_origin + cursor

    def next_columns(self, max_rows: int) -> dict[str, Any] | None:
        """The next rows, at most ``max_rows`` and not past the current batch, as columns (field
        name -> the sequence of their values); None at the end.

        The same rows, values and positions as that many ``next()`` calls, without a namedtuple
        per row: the row loaders gather rows this way. Row readers only (not batch or NGram ones).
        """
        if self.batched or self.ngram is not None:
            raise UsageError("next_columns() reads rows of a row reader (make_reader without an NGram)")
        with self._lock:
            if self._stopped:
                raise UsageError("next_columns() on a reader that was stopped; reset() or load_state_dict() "
                                 "make it readable again")
            if self._cursor >= len(self._items):
                try:
                    self._load_next_batch()
                except StopIteration:
                    return None
            columns = self._batch_columns
            assert columns is not None  # a row reader's batch always has its columns
            start = self._cursor
            stop = min(len(self._items), start + max(1, max_rows))
            if self._current_pieces:  # not past a task of the plan: the rows come as if read task by task
                ends = np.cumsum(self._current_pieces)
                kept = self._item_rows  # rows dropped from the batch: the task of its row, and its rows kept
                row = start if kept is None else int(kept[start])
                end = int(ends[np.searchsorted(ends, row, side="right")])
                stop = min(stop, end if kept is None else int(np.searchsorted(kept, end)))
            self._cursor = stop
            return {name: column[start:stop] for name, column in zip(self._item_names, columns)}

    def _where(self) -> tuple[int, int, int]:
        """(epoch, task, offset) of the next item to deliver."""
        if self._current is None:
            return self._position
        epoch, index = self._current
        pieces = self._current_pieces
        if self._cursor >= len(self._items):
            return epoch, index + max(1, len(pieces)), 0
        if self._item_rows is not None:  # rows were dropped from the batch
            return self._where_row(epoch, index, int(self._item_rows[self._cursor]))
        if not pieces:
            return epoch, index, self._cursor
        if self.batched:  # an item per task of the plan (_to_items)
            return epoch, index + self._cursor, 0
        offset = self._cursor  # rows into the batch: into which task of the plan?
        for k, rows in enumerate(pieces):
            if offset < rows:
                return epoch, index + k, offset
            offset -= rows
        raise AssertionError("a cursor past the batch's pieces")

    def _where_row(self, epoch: int, index: int, row: int) -> tuple[int, int, int]:
        """(epoch, task, offset) of the loaded batch's row ``row`` (a batch reader's: of its task's start)."""
        pieces = self._current_pieces
        if not pieces:
            return epoch, index, 0 if self.batched else row
        ends = np.cumsum(pieces)
        k = int(np.searchsorted(ends, row, side="right"))
        return epoch, index + k, 0 if self.batched else row - (int(ends[k - 1]) if k else 0)

    def _set_position(self, position: tuple[int, int, int]) -> None:
        """Forget the current batch; the next item is at ``position``."""
        if self._drops is not None:  # the position is the next item's (decoding later) or drops are reset after
            self._drops.next = self._stream_where()
        self._delivered += self._cursor - self._first
        self._position, self._current, self._current_pieces = position, None, ()
        self._items, self._cursor, self._first = [], 0, 0
        self._batch_columns, self._item_rows = None, None
        self._skip_rows = 0

    def _to_items(self, batch: Batch) -> Sequence[Any]:
        if self.ngram is not None:
            return self.ngram.form_windows(batch, self.schema)
        columns = [batch.columns[name] for name in self._item_names]
        if self.batched and batch.pieces:  # a batch per task of the plan, as if read one by one
            skip, self._skip_rows = self._skip_rows, 0  # seek() into the first task
            bounds = np.cumsum((0, *batch.pieces)).tolist()
            bounds[0] = min(skip, bounds[1] - 1)
            self._batches += len(batch.pieces)
            return [self._row_type(*(c[a:b] for c in columns)) for a, b in zip(bounds[:-1], bounds[1:])]
        if self.batched:
            rows = batch.num_rows
            if self._skip_rows:  # seek() into the middle of this batch's task
                columns, rows, self._skip_rows = [c[self._skip_rows:] for c in columns], rows - self._skip_rows, 0
            if rows <= 0:
                return []
            self._batches += 1
            return [self._row_type(*columns)]
        return _Rows(columns, self._row_type) if columns else []

    # -- decoding images after a shuffle ---------------------------------------------------------
    @contextlib.contextmanager
    def images_decoded_later(self) -> Iterator[LateImages | None]:
        """While the block runs, hand the image fields out encoded, with a :data:`SOURCE_ROW`
        column, for a shuffling loader that decodes the rows it draws (readers/late_decode.py);
        yields how to decode them, or None where this reader cannot (no images, images off,
        a transform or n-grams that need them decoded). The rows, their order and the reader's
        position are the same either way; batches already read are read again in the new form.
        """
        from unihub.readers.late_decode import LateImages  # start-up cost: 6 ms, for shuffling loaders only

        loader = self._loader
        late = tuple(f for f in self._read_fields if isinstance(f.codec, CompressedImageCodec)
                     and f.name not in self._decoded_before_filtering())
        if not late or loader.late_images or not loader.decode_images or self._transform_spec is not None or \
                self.ngram is not None or SOURCE_ROW in self.schema.fields:
            yield None
            return
        threads = max(1, min(self._workers_count, usable_cores()))
        self._decode_later(frozenset(f.name for f in late))
        try:
            yield LateImages(self.store, late, loader.policy, threads, loader.on_decode_error, self._decode_skips,
                             reader_threads=lambda: self._pool.threads_to_share() if self._pool is not None else None)
        finally:
            self._decode_later(frozenset())

    def _decoded_before_filtering(self) -> set[str]:
        """Fields a predicate decodes to test rows (they come decoded whatever happens later)."""
        return set(predicate_fields(self._predicate)) if self._predicate is not None else set()

    def _decode_later(self, names: frozenset[str]) -> None:
        """Hand ``names`` out encoded (with SOURCE_ROW) from the next row on; none: decode all."""
        with self._lock:
            if self._iterator is not None or self._current is not None:  # rows already read, in the old form
                skip_rows = self._skip_rows  # a seek()'s skip is consumed with the first batch, so
                self._halt()                   # none is pending here today; if one were, dropping it
                self._set_position(self._where())  # would deliver rows twice
                self._skip_rows = skip_rows
            self._loader = dataclasses.replace(self._loader, late_images=names)
            self._item_names = tuple(self.schema.fields) + ((SOURCE_ROW,) if names else ())
            if names:  # the schema's row type and one more field (names that are not identifiers work alike)
                source = UnischemaField(SOURCE_ROW, np.int64, (), None, False)
                with_source = Unischema(self.schema.name, [*self.schema, source],
                                        attributes=self.schema.attribute_names)
                self._row_type = with_source._get_namedtuple()
            else:
                self._row_type = self.schema._get_namedtuple()

    # -- position -------------------------------------------------------------------------------
    def _fingerprint(self, config: planning.PlanConfig | None = None) -> str:
        return self._fingerprints(config)[0]

    def _order_fingerprint(self, config: planning.PlanConfig | None = None) -> str:
        """The fingerprint of the epochs' global order, which every shard count shares (readers/elastic.py)."""
        return self._fingerprints(config)[1]

    def _fingerprints(self, config: planning.PlanConfig | None = None) -> tuple[str, str]:
        config = self._plan if config is None else config
        cached = self._fingerprint_of
        if cached is not None and cached[0] is config:  # a loader asks for a state per reader batch
            return cached[1], cached[2]
        plan = self._compute_fingerprint(config)
        order = self._compute_fingerprint(dataclasses.replace(config, cur_shard=None, shard_count=None,
                                                              shard_by="row_group", shard_remainder="pad"))
        self._fingerprint_of = (config, plan, order)
        return plan, order

    def _compute_fingerprint(self, config: planning.PlanConfig) -> str:
        plan = dataclasses.asdict(config)
        for key in ("task_rows", "first_task_rows"):
            if plan[key] is None:
                del plan[key]  # states saved before tasks were cut stay valid where none are
        del plan["dataset_row_groups"]  # only what the shards are checked against: the plan is the same
        plan["row_groups"] = self._groups
        plan["batched"] = self.batched
        plan["num_epochs"] = self.num_epochs
        plan["ngram"] = repr(self.ngram) if self.ngram is not None else None  # items are windows then
        plan["fields"] = list(self.schema.fields)
        return hashlib.sha256(json.dumps(plan, sort_keys=True, default=str).encode()).hexdigest()[:16]

    @functools.cached_property
    def _kept_by(self) -> str | None:
        """What a state records of the predicate and filters its offsets count the rows of (None: neither): the
        predicate's type and fields and the filters' text (a function's code is not compared: it would change
        with the Python version). A key of its own beside ``plan``, so that states saved before it was recorded
        still resume."""
        if self._predicate is None and self._filters is None:
            return None
        predicate = self._predicate
        kept_by = [None if predicate is None else [type(predicate).__name__, sorted(predicate.get_fields())],
                   str(self._filters)]
        return hashlib.sha256(json.dumps(kept_by, default=str).encode()).hexdigest()[:16]

    def state_dict(self) -> dict[str, Any]:
        """The position after the last delivered row/batch: small, JSON-able. With the states of every rank,
        a reader with any other shard count resumes the run (``resume_from=[...]``, readers/elastic.py).

        After a resume from a state with ``skip``/``exclude``, the rows after the position still to pass over
        are this state's ``skip``/``exclude`` (else 0 and []: the keys are in every state, as ``done``'s are)."""
        epoch, task, offset = self._where()
        plan, order = self._fingerprints()
        state = {"version": STATE_VERSION, "seed": self.seed, "epoch": epoch, "task": task, "offset": offset,
                 "plan": plan, "order": order, "dataset_version": self.store.version, "kept_by": self._kept_by,
                 **elastic.shard_keys(self._plan)}
        state.update(elastic.done_keys(self._done, epoch))  # what runs before an elastic resume delivered
        drops = self._drops
        state.update(drops.state_keys(self._stream_where()) if drops is not None else {"skip": 0, "exclude": []})
        return state

    def _plain_state(self, **position: int) -> dict[str, Any]:
        """:meth:`state_dict` at ``position`` (epoch, task, offset), without rows to pass over."""
        return dict(self.state_dict(), **position, skip=0, exclude=[])

    def load_state_dict(self, state: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        """Continue from ``state``: the next item is the first one not delivered before it was saved.

        A state may name rows after its position that were delivered all the same (a loader's, a TF position's:
        ``skip``, the next rows, and ``exclude``, rows at ``skip + x`` offsets after the position): they are
        passed over as they come, in this epoch or the next ones (not with n-grams, whose items are windows).

        Given a list, the states every rank of a run saved (with any shard count, worker count or batch
        size), this reader delivers its equal share of the rows none of them delivered in their epoch,
        and later epochs as a fresh run with this reader's shard count would (readers/elastic.py).
        """
        if isinstance(state, (list, tuple)):
            self._load_states(state)
            return
        other = _other_kind(state)
        if other:
            raise ReaderStateError(f"the state is a {other}'s, not a reader's: load it into the {other} that saved it")
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            found = state.get("version") if isinstance(state, dict) else type(state).__name__
            raise ReaderStateError(f"reader state version {found!r} is not {STATE_VERSION}")
        missing = sorted({"seed", "epoch", "task", "offset", "plan"} - set(state))
        if missing:
            raise ReaderStateError(f"the reader state lacks {missing}; pass what state_dict() returned")
        wrong = [key for key in ("seed", "epoch", "task", "offset") if not elastic.is_count(state[key])]
        if wrong:
            raise ReaderStateError(f"the reader state's {wrong} are not ints >= 0 (found "
                                   f"{[state[key] for key in wrong]!r}); pass what state_dict() returned")
        # check against the plan with the saved seed before changing anything: a refused state
        # must leave this reader as it was
        config = dataclasses.replace(self._plan, seed=elastic.seed_of(state))
        if state.get("plan") != self._fingerprint(config) or state.get("kept_by", self._kept_by) != self._kept_by:
            raise ReaderStateError("the saved reader state belongs to another dataset or other reader options "
                                   "(row groups, shuffling, sharding, epochs, batching, fields, predicate or "
                                   "filters differ); states of another shard count resume as the list of every "
                                   "rank's state"
                                   + elastic.other_version(state, self.store.version))
        done = elastic.checked_done(state, config)
        position = elastic.position_of(state)
        elastic.check_position(position, planning.rank_plan(config, position[0], done), self.batched, self.num_epochs)
        drops = elastic.Drops.of_state(state)
        if drops is not None and self.ngram is not None:
            raise ReaderStateError("an n-gram reader's state names no rows to pass over (skip, exclude): its items "
                                   "are windows of rows; pass what its state_dict() returned")
        self._go_to(config, done, position)
        self._drops = drops

    def _load_states(self, states: Sequence[dict[str, Any]]) -> None:
        """:meth:`load_state_dict` of every rank's state (readers/elastic.py)."""
        if self.num_rows_per_epoch is None:
            raise InvalidArgumentError("resuming from several ranks' states needs the rows of an epoch known in "
                                       "advance: not with a predicate, filters, n-grams or a batch transform")
        seed = elastic.check_one_run(states, STATE_VERSION,
                                     lambda s: self._order_fingerprint(dataclasses.replace(self._plan, seed=s)),
                                     self.store.version)
        config = dataclasses.replace(self._plan, seed=seed)
        progress = [elastic.progress_of(state, elastic.rank_config(state, config), self.batched, self.num_epochs)
                    for state in states]
        elastic.check_epochs_known(states, progress)
        epoch, done = planning.delivered_before(progress, self.num_epochs)
        self._go_to(config, done, (epoch, 0, 0))

    def _go_to(self, config: planning.PlanConfig, done: dict[int, planning.Intervals],
               position: tuple[int, int, int]) -> None:
        """Stop reading; the next item is at ``position`` of the plan ``config`` with ``done``."""
        self._halt()
        self._drops = None
        self.seed, self._plan, self._loader.seed, self._done = config.seed, config, config.seed, done
        self._set_position(position)
        self._iterator, self._finished, self._reading = None, False, False
        self._stopped = False

    # -- skipping ahead: a position computed from the plan, no row read ----------------------------------
    def skip_rows(self, count: int) -> int:
        """Pass over the next ``count`` rows as if read and dropped, reading none: the plan says where the
        row ``count`` on is, so this costs a resume, not ``count`` reads. Returns the rows skipped, fewer
        where the reader ends first (the next ``next()`` then raises StopIteration).

        A row reader's state then resumes after the skipped rows. A batch reader's next batch starts at the
        row (as after :meth:`seek`), and a state saved before that batch is read resumes at the start of its
        task. Refused (:class:`~unihub.errors.InvalidArgumentError`) where rows are known only by reading
        them: a predicate, filters, n-grams or a batch transform (read and drop them there). With
        ``on_decode_error='skip'`` the count includes rows whose images would not have decoded. Rows a resumed
        state names to pass over (``skip``/``exclude``) are not counted: they are passed over as ``next()`` would.
        """
        target = self.position_after(count)
        if target.rows:
            self.load_state_dict(target.state)
            self._skip_rows = target.rows_into_task
        return target.rows

    def position_after(self, count: int) -> SkipTarget:
        """Where :meth:`skip_rows` goes, without going: a state at most ``count`` rows on (a batch reader's at
        the start of the task that holds the row), the rows of that task still to drop, and the rows skipped."""
        if self.num_rows_per_epoch is None:
            raise InvalidArgumentError("skip_rows() needs the rows of an epoch known in advance: not with a "
                                       "predicate, filters, n-grams or a batch transform; read and drop the rows")
        if not isinstance(count, (int, np.integer)) or isinstance(count, bool) or count < 0:
            raise InvalidArgumentError(f"skip_rows() takes a count >= 0, got {count!r}")
        ahead = elastic.Drops.of_state(self._drops.state_keys(self._stream_where())) if self._drops else None
        if ahead is None:
            return self._plan_position_after(int(count))
        # rows a resumed state passes over are not rows delivered: the count goes past them, and those after it
        # are passed over from the target on (a batch reader's rows of the task before the row too)
        rows = int(ahead.kept(np.array([int(count)]))[0])
        target = self._plan_position_after(rows)
        if target.rows < rows:  # the reader ends first
            return target._replace(rows=target.rows - min(ahead.below, target.rows)
                                   - int(np.searchsorted(ahead.rows, target.rows)))
        later = ahead.rows[np.searchsorted(ahead.rows, rows):] - (rows - target.rows_into_task)
        keys = elastic.Drops(target.rows_into_task, later).state_keys(0)
        return SkipTarget(dict(target.state, **keys), 0, int(count))

    def _plan_position_after(self, count: int) -> SkipTarget:
        """:meth:`position_after` along the plan: ``count`` rows of it, none passed over."""
        epoch, task, offset = self._where()
        per_epoch, left = self.num_rows_per_epoch or 0, count
        while left and (self.num_epochs is None or epoch < self.num_epochs) and per_epoch:
            ends = np.cumsum([0] + [t.num_rows for t in self.plan_of(epoch)])
            row = int(ends[task]) + offset + left
            if row < ends[-1]:
                index = int(np.searchsorted(ends, row, side="right")) - 1
                into = row - int(ends[index])
                state = self._plain_state(epoch=epoch, task=index, offset=0 if self.batched else into)
                return SkipTarget(state, into if self.batched else 0, int(count))
            left -= int(ends[-1]) - (row - left)
            whole = left // per_epoch if self.num_epochs is None else min(left // per_epoch,
                                                                          self.num_epochs - epoch - 1)
            if any(e > epoch for e in self._done):  # an epoch ahead is a run of what was left: step into it
                whole = 0
            epoch, task, offset, left = epoch + 1 + whole, 0, 0, left - whole * per_epoch
        moved = (epoch, task, offset) != self._where()
        state = self._plain_state(epoch=epoch, task=task, offset=offset) if moved else self.state_dict()
        return SkipTarget(state, 0, int(count) - left)

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def stopped(self) -> bool:
        """True after :meth:`stop` (the with-block's end) until :meth:`reset` or :meth:`start_over`
        (Petastorm's ``Reader.stopped``)."""
        return self._stopped

    def reset(self) -> None:
        """Start over from the first epoch once all rows were read, or after :meth:`stop` (Petastorm's
        ``reset``).

        In the middle of an epoch it raises :class:`~unihub.errors.ReaderResetError`, a
        NotImplementedError as Petastorm's; :meth:`start_over` starts over from anywhere.
        """
        if self._reading and not self._finished and not self._stopped:
            raise ReaderResetError("Currently do not support resetting a reader while in the middle of iteration. "
                                   "You can call reset only after all samples were consumed (or after stop()); "
                                   "start_over() starts from the first epoch wherever the reader is")
        self.start_over()

    def state_at_start(self, seed: int, state: dict[str, Any] | None = None) -> dict[str, Any]:
        """The state of a run ordered by ``seed`` before it delivered anything, for the shard ``state`` was saved
        by (this reader's by default). A mix that cycles this reader (``WeightedSamplingReader(on_exhausted=
        'cycle')``) starts each pass so, ordered by :func:`next_pass_seed` of the last pass's seed: a pass has its
        own order, as the next epochs of a reader with more of them have theirs."""
        state = self.state_dict() if state is None else state
        own = state["shard"] == elastic.shard_keys(self._plan)["shard"]  # its plan as this reader's options say
        config = dataclasses.replace(self._plan if own else elastic.rank_config(state, self._plan), seed=int(seed))
        plan, order = self._fingerprints(config)
        return {**elastic.at_start(state, *(int(v) for v in state["shard"]), fresh=True), "seed": int(seed),
                "plan": plan, "order": order, "done": [], "done_from": 0, "skip": 0, "exclude": []}

    def start_over(self) -> None:
        """Start over from the first epoch wherever the reader is: mid-epoch, at the end or after :meth:`stop`
        (:func:`start_over` does it for any reader)."""
        self._halt()
        self.join()
        self._done, self._drops = {}, None
        self._set_position((0, 0, 0))
        self._iterator, self._finished, self._reading = None, False, False
        self._stopped = False

    def stop(self) -> None:
        """Stop the workers (pending tasks are cancelled) and end the iteration.

        May be called from another thread while one iterates: the ``next()`` under way then raises
        StopIteration, which ends its loop; a ``next()`` called after ``stop()`` raises
        :class:`~unihub.errors.UsageError` (a RuntimeError, as Petastorm's). The position stays at
        the last delivered item (``state_dict()``); ``reset()`` or ``load_state_dict()`` make the
        reader usable again.
        """
        self._stopped = True
        self._halt()

    def _halt(self) -> None:
        """Stop the workers; a later ``next()`` starts new ones from the current position."""
        if self._pool is not None:
            self._pool.stop()
        if self._prefetch is not None:
            self._prefetch.close()
        self._drop_early()
        if self._iterator is not None:
            close = getattr(self._iterator, "close", None)
            if close is not None:
                try:
                    close()
                except ValueError:  # running in the consumer's thread: the stopped pool ends it there
                    pass
        self._iterator = None

    def join(self) -> None:
        """Wait for the workers to exit."""
        if self._pool is not None:
            self._pool.join()
            self._pool = None
        if self._prefetch is not None:
            self._prefetch.join()
        self._drop_early(wait=True)

    def __enter__(self) -> Reader:
        return self

    def cleanup_cache(self) -> None:
        """Remove what the local-disk cache holds (unless made with ``cleanup=False``), as Petastorm's
        reader does when its with-block ends; prints Petastorm's lines ("Error cleaning cache: ...",
        "Cache cleanup complete.") instead of raising an OSError of the cache, as Petastorm did."""
        try:
            self.cache.cleanup()
        except OSError as exc:
            print(f"Error cleaning cache: {exc}")
        print("Cache cleanup complete.")

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        self.join()
        try:  # as cleanup_cache(), without its printed lines at every with-block's end
            self.cache.cleanup()
        except OSError as error:
            warnings.warn(f"Error cleaning cache: {error}", stacklevel=2)

    def __del__(self) -> None:
        try:
            self.stop()
        except Exception:  # interpreter shutdown: best effort
            pass

    @property
    def diagnostics(self) -> dict[str, Any]:
        """Where the reader is and what its workers do: the pool, tasks in flight, items (rows, or
        batches) delivered, the position; and Petastorm's pool counters (``items_consumed``,
        ``items_produced``, ``items_inprocess``, ``output_queue_size``: see :attr:`Pool.diagnostics`)
        of the workers started last, zeros before the first read."""
        epoch, task, offset = self._where()
        pool = self._pool.diagnostics if self._pool else dict.fromkeys(
            ("items_consumed", "items_produced", "items_inprocess", "output_queue_size"), 0)
        return {**pool, "pool_type": self._pool_type, "workers_count": self._workers_count,
                "in_flight": self._pool.in_flight if self._pool else 0,
                "items_delivered": self._delivered + self._cursor - self._first,
                "batches_delivered": self._batches, "epoch": epoch, "task": task, "offset": offset,
                "row_groups": len(self._groups), "decode_errors_skipped": self._decode_skips.count,
                "decode_errors": list(self._decode_skips.messages)}

    @property
    def cache_stats(self) -> dict[str, Any] | None:
        """The local-disk cache's hits, misses, fetches and bytes: ``"reader"`` (this reader and its
        worker processes) and ``"node"`` (every process that used the cache directory, with the
        entries and bytes it holds); None without a local-disk cache."""
        summary = getattr(self.cache, "summary", None)
        return summary() if callable(summary) else None

    @property
    def is_batched_reader(self) -> bool:
        return self.batched

    @property
    def batched_output(self) -> bool:
        """True for a batch reader (Petastorm's ``Reader.batched_output``, which its TF bridge read)."""
        return self.batched

    @property
    def last_row_consumed(self) -> bool:
        """True once the last row of the last epoch was read (``next()`` raised StopIteration), until
        :meth:`reset` (Petastorm's ``Reader.last_row_consumed``)."""
        return self._finished

    def next(self) -> Any:
        """The next row or batch: ``next(reader)``, under Petastorm's method name."""
        return self.__next__()

    @property
    def petastorm_types(self) -> bool:
        """True when this reader decodes with Petastorm's types (nulls as NaN, uniform lists stacked)."""
        return self._loader.policy.petastorm

    @property
    def decode_images(self) -> bool:
        """False when this reader hands out its image fields as their stored PNG/JPEG bytes (``decode_images=False``)."""
        return bool(self._loader.decode_images)

    @property
    def on_decode_error(self) -> OnDecodeError:
        """What this reader does with an image that does not decode: ``'raise'`` or ``'skip'`` its row."""
        return self._loader.on_decode_error

    @property
    def num_rows_per_epoch(self) -> int | None:
        """Rows one epoch delivers, when known (no predicate, filters or n-grams)."""
        if self._predicate is not None or self._filters is not None or self.ngram is not None:
            return None
        if self._transform_spec is not None and self.batched:
            return None
        return planning.rows_per_epoch(self._plan)

    def seek(self, row: int) -> None:
        """Go to row ``row`` of the current epoch (as this reader orders and shards it), reading nothing.

        The rows before it are skipped without being read or decoded: the plan says which task
        holds the row, and only that task is read. A batch reader's next batch then starts at
        that row. Refused where an epoch's rows are not known in advance (a predicate, filters,
        n-grams, a batch transform) and for a row beyond this shard's epoch. Rows a resumed state named to pass
        over (``skip``/``exclude``) are no longer passed over.
        """
        if self.num_rows_per_epoch is None:
            raise InvalidArgumentError("seek() needs the rows of an epoch known in advance: not with a predicate, "
                                       "filters, n-grams or a batch transform")
        if not isinstance(row, (int, np.integer)) or isinstance(row, bool) or row < 0:
            raise InvalidArgumentError(f"seek() takes a row number >= 0, got {row!r}")
        epoch, left = self._where()[0], int(row)
        for index, task in enumerate(self.plan_of(epoch)):
            if left < task.num_rows:
                self.load_state_dict(self._plain_state(epoch=epoch, task=index, offset=0 if self.batched else left))
                self._skip_rows = left if self.batched else 0
                return
            left -= task.num_rows
        raise InvalidArgumentError(f"seek({row}) is beyond this shard's {self.num_rows_per_epoch} rows per epoch")

    def __len__(self) -> int:
        """Items (rows, or batches for a batch reader) over all epochs, where known."""
        rows = self.num_rows_per_epoch
        if rows is None or self.num_epochs is None:
            raise TypeError("len() is unknown for this reader (predicate, filters, n-grams, a batch transform "
                            "or num_epochs=None)")
        if self.batched:
            per_epoch = sum(1 for t in self._epoch_tasks(0) if t.num_rows > 0)
            return per_epoch * self.num_epochs
        return rows * self.num_epochs


#: pixels a decode task aims at when a big row group is cut into several tasks: the reader holds
#: a few tasks per worker decoded ahead, so this sets most of its memory (4 MiB: 35-40 MiB less
#: peak RSS than 8 MiB over 64x64 JPEGs, as fast, benchmarks/peers.py)
DECODE_TASK_BYTES = 4 * 2**20
_UNKNOWN_IMAGE_BYTES = 64 * 2**10  # an image field with a None dim: a guess
#: the epoch's first decode task is this share of a task, the next twice that, ... (the first
#: batch waits for a few images' decoding, not a whole task's)
FIRST_TASK_SHARE = 8


_KINDS = {"weighted_sampling": "WeightedSamplingReader", "torch_iterable_dataset": "TorchIterableDataset",
          "torch_iterable_stream": "TorchIterableDataset", "elastic_sampler": "ElasticDistributedSampler"}


def _other_kind(state: Any) -> str:
    """What saved ``state`` where that is not a reader (a mix, a loader, a TF ``ReaderPosition``, a torch
    dataset or sampler, torchdata's ``StatefulDataLoader``), for the error that says so; '' for anything else."""
    if not isinstance(state, dict):
        return ""
    if "kind" in state:
        return _KINDS.get(state["kind"], str(state["kind"]))
    if "_num_yielded" in state:
        return "StatefulDataLoader"
    if {"reader", "row"} <= set(state):
        return "ReaderPosition"
    return "loader" if {"reader", "skip", "exclude"} <= set(state) else ""


def _take(column: Any, rows: np.ndarray) -> Any:
    """``column``'s values at ``rows`` (a numpy array's, a list's)."""
    if isinstance(column, np.ndarray):
        return column[rows]
    if isinstance(column, (pa.Array, pa.ChunkedArray)):
        return column.take(pa.array(rows))
    return [column[i] for i in rows.tolist()]


class _Rows(Sequence[Any]):
    """A row reader's batch: its columns, and the row namedtuples made from them when the first
    row is asked for (:meth:`Reader.next_columns` takes the columns and makes none; ``next()``
    swaps this for the plain list of rows)."""

    __slots__ = ("columns", "_row_type", "_length", "_rows")

    def __init__(self, columns: list[Any], row_type: Any) -> None:
        self.columns = columns
        self._row_type = row_type
        self._length = len(columns[0])
        self._rows: list[Any] | None = None

    def __len__(self) -> int:
        return self._length

    def rows(self) -> list[Any]:
        if self._rows is None:
            self._rows = [self._row_type._make(values) for values in zip(*self.columns)]
        return self._rows

    def __getitem__(self, index: Any) -> Any:
        return self.rows()[index]




def decode_task_rows(fields: Sequence[UnischemaField], decode_images: bool) -> int | None:
    """Rows per read task when images are decoded: about :data:`DECODE_TASK_BYTES` of pixels, 64 to
    2,048 rows, so that one big row group spreads over every worker and its first rows come soon;
    None (a task per row group) when nothing heavy is decoded."""
    if not decode_images:
        return None
    sizes = [math.prod(cast("tuple[int, ...]", f.shape)) * np.dtype(f.numpy_dtype).itemsize
             if f.is_fixed_shape else _UNKNOWN_IMAGE_BYTES
             for f in fields if isinstance(f.codec, CompressedImageCodec)]
    if not sizes:
        return None
    return max(64, min(2048, DECODE_TASK_BYTES // max(1, sum(sizes))))


def read_ahead_bytes(read_ahead_mb: float | None, memory_budget_mb: float | None) -> int:
    """Bytes of the remote read-ahead: ``read_ahead_mb`` (0: none), else the memory budget's share."""
    if read_ahead_mb is None:
        return memory_budget(memory_budget_mb).read_ahead_bytes
    if isinstance(read_ahead_mb, bool) or not isinstance(read_ahead_mb, (int, float)) or not read_ahead_mb >= 0 \
            or read_ahead_mb == float("inf"):
        raise InvalidArgumentError(f"read_ahead_mb must be a number of megabytes >= 0, got {read_ahead_mb!r}")
    return max(1, int(read_ahead_mb * 2**20)) if read_ahead_mb else 0  # a bound under a byte: one row group


def default_workers_count(store: ParquetStore, read_ahead: bool = False) -> int:
    """One worker per core this process may run on, for local data (decoding is CPU-bound and more
    threads only contend) and for remote data fetched by the read-ahead (its threads do the waiting on
    the network: more workers only hold more decoded batches and contend); four per core for remote
    filesystems read without it, where workers mostly wait on the network."""
    cores = usable_cores()
    return cores if read_ahead or isinstance(store.filesystem, pafs.LocalFileSystem) else 4 * cores


def _load_job(loader: RowGroupLoader, job: tuple[int, int, planning.ReadTask]) -> tuple[int, int, Batch]:
    return job[0], job[1], loader(job)


def _job_nbytes(result: tuple[int, int, Batch]) -> int:
    """Bytes of a loaded task's decoded columns (what the results in flight hold)."""
    return batch_nbytes(result[2].columns)


def _on_partitions_only(predicate: PredicateBase | None, store: ParquetStore) -> bool:
    """Whether ``predicate`` tests only Hive partition values: the row groups it keeps are chosen whole
    (``Reader._select_row_groups``) and no row of them is tested again, as Petastorm's reader gave such a
    predicate to no worker (a ``do_include`` written for a row's dict then works in ``make_batch_reader``)."""
    return predicate is not None and bool(store.partition_names) and \
        predicate_fields(predicate) <= set(store.partition_names)


def resolve_fields(schema: Unischema, schema_fields: Any, dataset: str = "",
                   columns: pa.Schema | None = None) -> tuple[list[UnischemaField], Any]:
    """The fields to read (and the NGram, if ``schema_fields`` is one).

    As Petastorm's readers: names and regexes that match no field are left out (here with a warning
    naming them), and :class:`~unihub.errors.NoMatchingFieldsError` (a RuntimeError) when none
    matches at all. ``dataset`` (its URL) is named in both; so are the ``columns`` of its files (their
    Arrow schema) that a name asks for but the schema leaves out, with their types (a plain Parquet
    struct or map column: unihub reads no field of such a type, as Petastorm's inference left it out).
    """
    if schema_fields is None:
        return list(schema), None
    if hasattr(schema_fields, "get_field_names_at_all_timesteps"):  # an NGram
        ngram = schema_fields
        ngram.resolve_regex_field_names(schema)
        names = set(ngram.get_field_names_at_all_timesteps())
        return [f for f in schema if f.name in names], ngram
    if isinstance(schema_fields, (str, UnischemaField)):
        schema_fields = [schema_fields]
    patterns = list(schema_fields)
    if not patterns:  # Petastorm's readers read every field for an empty list, as for None
        return list(schema), None
    fields, unmatched = select_unischema_fields(schema, patterns)
    where = f" in the dataset {dataset}" if dataset else f" in Unischema {schema.name!r}"
    unread = _unread_columns(unmatched, schema, columns)
    if patterns and not fields:
        criteria = [p.name if isinstance(p, UnischemaField) else p for p in patterns]
        raise NoMatchingFieldsError(f"No fields matching the criteria {criteria} were found{where}: no field "
                                    f"matches {', '.join(map(repr, criteria))} (by name, or as a regex matching the "
                                    f"whole name){unread}; fields: {list(schema.fields)}")
    if unmatched:
        warnings.warn(f"schema_fields {unmatched} match no field{where} and are left out (the other fields are "
                      f"read){unread}; fields: {list(schema.fields)}", UserWarning, stacklevel=4)
    return fields, None


def _unread_columns(unmatched: Sequence[Any], schema: Unischema, columns: pa.Schema | None) -> str:
    """The words for the names in ``unmatched`` that are columns of the files (``columns``) but no field of
    ``schema``, with their Arrow types and why; empty where there are none."""
    if columns is None:
        return ""
    names = [str(getattr(p, "name", p)) for p in unmatched]
    found = [columns.field(n) for n in names if n in columns.names and n not in schema.fields]
    unread = [f"{f.name!r} ({f.type})" for f in found if infer_field(f) is None]
    unlisted = [repr(f.name) for f in found if infer_field(f) is not None]
    words = ""
    if unread:
        words += f"; {', '.join(unread)} {'is a column' if len(unread) == 1 else 'are columns'} of a type unihub does not read"
    if unlisted:
        words += (f"; {', '.join(unlisted)} {'is a column' if len(unlisted) == 1 else 'are columns'} of the files "
                  "that the dataset's Unischema does not list")
    return words


def _open(dataset_url: Any, storage_options: dict[str, Any] | None, filesystem: Any, version: int | None = None,
          tag: str | None = None) -> ParquetStore:
    if isinstance(dataset_url, ParquetStore):
        if (version is not None and version != dataset_url.version) or tag is not None:
            raise InvalidArgumentError("version=/tag= choose the version to open; an open store is read as it is")
        return dataset_url
    if isinstance(dataset_url, (list, tuple)):  # Petastorm's list of Parquet file URLs, or one URL in a list
        urls = [os.fspath(u) for u in dataset_url]
        return open_dataset(urls[0] if len(urls) == 1 else urls, filesystem=filesystem,
                            storage_options=storage_options, version=version, tag=tag)
    if not isinstance(dataset_url, (str, os.PathLike)):
        raise InvalidArgumentError(f"dataset_url must be a URL or path (or a list of Parquet file URLs), "
                                   f"got {type(dataset_url).__name__}")
    return open_dataset(os.fspath(dataset_url), filesystem=filesystem, storage_options=storage_options,
                        version=version, tag=tag)


#: Petastorm's arguments that change nothing here: transport and driver knobs of its worker pools,
#: its deprecated ``shard_seed`` (shards here are fixed by ``cur_shard``/``shard_count`` and ``seed``),
#: and ``convert_early_to_numpy`` (batches are converted to numpy in the workers already)
_IGNORED = ("pyarrow_serialize", "hdfs_driver", "zmq_copy_buffers", "shard_seed", "cache_row_size_estimate",
            "convert_early_to_numpy")


_MEMORY_POOL_CHOSEN = False


def _choose_memory_pool() -> None:
    """Use jemalloc for Arrow unless the user chose a pool (``ARROW_DEFAULT_MEMORY_POOL``).

    pyarrow's default mimalloc keeps arenas committed per worker thread, so a reader's peak
    memory grew ~1.8x with dataset size; with jemalloc it stays within ~1.2x (measured by
    tests/readers/test_reader.py). Set ``UNIHUB_KEEP_ARROW_MEMORY_POOL=1`` to leave it alone.
    """
    global _MEMORY_POOL_CHOSEN
    if _MEMORY_POOL_CHOSEN:
        return
    _MEMORY_POOL_CHOSEN = True
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL") or os.environ.get("UNIHUB_KEEP_ARROW_MEMORY_POOL"):
        return
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except (NotImplementedError, pa.ArrowNotImplementedError):
        pass  # a pyarrow build without jemalloc keeps its default


def make_cache(cache_type: str | None, cache_location: str | None = None, cache_size_limit: int | None = None,
               cache_row_size_estimate: int | None = None, cache_extra_settings: dict[str, Any] | None = None,
               store: ParquetStore | None = None) -> Cache | None:
    """The cache for Petastorm's ``cache_*`` arguments (None for no cache); a local-disk cache inside the folder of
    ``store`` (the dataset it will cache) is refused before anything is written there."""
    if cache_type in (None, "null", "none"):
        return None
    if cache_type == "local-disk":
        from unihub.readers.local_disk_cache import (  # start-up cost: 4 ms, this cache only
            LocalDiskCache,
            refuse_inside,
        )

        if store is not None:
            refuse_inside(cache_location, store)
        return LocalDiskCache(cache_location, cache_size_limit, cache_row_size_estimate, **(cache_extra_settings or {}))
    raise UnsupportedFormatError(f"Unknown cache_type: {cache_type!r}; valid: 'null', 'local-disk'")  # Petastorm's


def _check_ngram_cuts(ngram: Any, shuffle_row_drop_partitions: int, shard_by: str, shard_count: int | None) -> None:
    """:class:`InvalidArgumentError` for ``NGram(timestamp_overlap=False)`` over tasks cut from a row group: each
    task can only keep its own windows apart, so windows on both sides of a cut shared timestamps (Petastorm
    refused the same with NotImplementedError)."""
    if ngram is None or ngram.timestamp_overlap:
        return
    if shuffle_row_drop_partitions > 1 or (shard_by == "row" and shard_count is not None and shard_count > 1):
        raise InvalidArgumentError(
            "Using timestamp_overlap=False is not implemented with shuffle_options.shuffle_row_drop_partitions > 1 "
            f"(shuffle_row_drop_partitions={shuffle_row_drop_partitions}, shard_by={shard_by!r}): the windows of "
            "a row group cut into parts could share timestamps; use shuffle_row_drop_partitions=1 and "
            "shard_by='row_group', or timestamp_overlap=True")


def _make(dataset_url: Any, *, batched: bool, schema_fields: Any = None, reader_pool_type: PoolType = "thread",
          workers_count: int | None = None, results_queue_size: int = 50, seed: int | None = None, shuffle_rows: bool = False,
          shuffle_row_groups: bool = True, shuffle_row_drop_partitions: int = 1,
          predicate: PredicateBase | None = None, rowgroup_selector: Any = None, num_epochs: int | None = 1,
          cur_shard: int | None = None, shard_count: int | None = None, shard_by: planning.ShardBy = "row_group",
          shard_remainder: planning.ShardRemainder = "pad", cache_type: str | None = "null",
          cache_location: str | None = None, cache_size_limit: int | None = None,
          cache_extra_settings: dict[str, Any] | None = None, transform_spec: TransformSpec | None = None,
          on_decode_error: OnDecodeError = "raise",
          filters: Any = None, storage_options: dict[str, Any] | None = None, filesystem: Any = None,
          decode_images: bool = True, resume_from: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
          petastorm_types: bool | None = None, memory_budget_mb: float | None = None,
          read_ahead_mb: float | None = None, version: int | None = None, tag: str | None = None,
          **ignored: Any) -> Reader:
    unknown = sorted(set(ignored) - set(_IGNORED))
    if unknown:  # Python's own words for a keyword the function does not take, as Petastorm's raised
        raise TypeError(f"{'make_batch_reader' if batched else 'make_reader'}() got an unexpected keyword "
                        f"argument{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}")
    if ignored.get("shard_seed"):
        warnings.warn("shard_seed was deprecated and will be removed in future versions. Use seed to apply "
                      "randomization effects on sharding row groups. (unihub ignores shard_seed: shards are dealt "
                      "by cur_shard, shard_count and seed)", UserWarning, stacklevel=3)
    _choose_memory_pool()
    if predicate is not None and not callable(getattr(predicate, "get_fields", None)):
        raise InvalidArgumentError(f"predicate parameter is expected to be derived from PredicateBase, got "
                                   f"{type(predicate).__name__}: wrap a function as in_lambda(field_names, func)")
    cur_shard, shard_count = shard_or_detected(cur_shard, shard_count)
    store = _open(dataset_url, storage_options, filesystem, version, tag)
    if store.num_rows == 0 and num_epochs is None:
        num_epochs = 1  # no rows in any number of epochs: endless ones would only spin (Petastorm's read none)
    fields, ngram = resolve_fields(store.schema, schema_fields, store.url, store.arrow_schema)
    if ngram is not None and batched:
        raise InvalidArgumentError("NGram schema_fields work with make_reader, not make_batch_reader")
    _check_ngram_cuts(ngram, shuffle_row_drop_partitions, shard_by, shard_count)
    store.require_fields({f.name for f in fields} | (predicate_fields(predicate) if predicate is not None else set()))
    cache = make_cache(cache_type, cache_location, cache_size_limit, ignored.get("cache_row_size_estimate"),
                       cache_extra_settings, store)
    return Reader(store, fields=fields, batched=batched, ngram=ngram, predicate=predicate, filters=filters,
                  transform_spec=transform_spec, shuffle_row_groups=shuffle_row_groups, shuffle_rows=shuffle_rows,
                  shuffle_row_drop_partitions=shuffle_row_drop_partitions, seed=seed, num_epochs=num_epochs,
                  cur_shard=cur_shard, shard_count=shard_count, shard_by=shard_by, shard_remainder=shard_remainder,
                  reader_pool_type=reader_pool_type, workers_count=workers_count,
                  results_queue_size=results_queue_size, cache=cache, decode_images=decode_images,
                  resume_from=resume_from, petastorm_types=petastorm_types, rowgroup_selector=rowgroup_selector,
                  memory_budget_mb=memory_budget_mb, on_decode_error=on_decode_error, read_ahead_mb=read_ahead_mb)


#: Petastorm's ``make_reader`` parameters after ``schema_fields``, in its order: they may be passed by position
_READER_POSITIONAL = (
    "reader_pool_type", "workers_count", "pyarrow_serialize", "results_queue_size", "seed", "shuffle_rows",
    "shuffle_row_groups", "shuffle_row_drop_partitions", "predicate", "rowgroup_selector", "num_epochs", "cur_shard",
    "shard_count", "shard_seed", "cache_type", "cache_location", "cache_size_limit", "cache_row_size_estimate",
    "cache_extra_settings", "hdfs_driver", "transform_spec", "filters", "storage_options", "zmq_copy_buffers",
    "filesystem", "convert_early_to_numpy")
#: ``make_batch_reader``'s: the same without ``pyarrow_serialize``
_BATCH_READER_POSITIONAL = tuple(name for name in _READER_POSITIONAL if name != "pyarrow_serialize")


def _by_name(function: str, names: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the positional ``args`` named as Petastorm's signature names them, in Python's words
    for too many or doubled arguments."""
    if len(args) > len(names):
        raise TypeError(f"{function}() takes from 1 to {len(names) + 2} positional arguments but "
                        f"{len(args) + 2} were given")
    for name, value in zip(names, args):
        if name in kwargs:
            raise TypeError(f"{function}() got multiple values for argument {name!r}")
        kwargs[name] = value
    return kwargs


def make_reader(dataset_url: Any, schema_fields: Any = None, *args: Any, **kwargs: Any) -> Reader:
    """A reader that yields one row at a time: a namedtuple of decoded numpy values.

    Petastorm's arguments (by keyword, or by position in Petastorm's order): ``schema_fields`` (names,
    regexes, fields or an ``NGram``; an empty list reads every field, as None does),
    ``predicate``, ``filters``, ``transform_spec``, ``shuffle_row_groups`` (default True),
    ``shuffle_rows``, ``shuffle_row_drop_partitions``, ``seed``, ``num_epochs`` (None =
    forever), ``cur_shard``/``shard_count`` (neither given: the rank and world size of a distributed job,
    see :mod:`unihub.runtime.world`), ``reader_pool_type`` ('thread', 'process',
    'dummy'), ``workers_count`` (default one per core for local data and for remote data fetched by
    the read-ahead, four per core for remote data read without it; Petastorm's was 10), ``results_queue_size``, ``cache_type='local-disk'`` with
    ``cache_location``/``cache_size_limit``, ``storage_options``/``filesystem``,
    ``rowgroup_selector`` (read only the row groups a selector picks from the dataset's
    row-group indexes; see :mod:`unihub.readers.selectors`). As Petastorm's: ``schema_fields`` that
    match no field are left out (with a warning; none matching raises ``NoMatchingFieldsError``), and
    a predicate on fields the dataset lacks raises at the first ``next()``. Added:
    ``shard_by='row'`` with ``shard_remainder='pad'|'drop'`` for equal shards,
    ``resume_from=state`` (or every rank's states, to resume on another world size: readers/elastic.py),
    ``decode_images=False`` (raw PNG/JPEG bytes, e.g. for DALI),
    ``petastorm_types`` (None: Petastorm's types for nulls and uniform lists in datasets Petastorm
    wrote and plain Parquet, unihub's in its own; True/False to choose; see ``readers/decode.py``),
    ``memory_budget_mb`` (default ``UNIHUB_MEMORY_MB``, else 512): the decoded row groups waiting
    for the consumer are held to a quarter of it in bytes, as well as to ``results_queue_size``
    (never fewer than one per worker; see :mod:`unihub.runtime.memory`), ``on_decode_error='raise'|'skip'``:
    an image that does not decode raises :class:`~unihub.errors.ImageDecodeError` naming its file, row
    group, row and field, or (``'skip'``) its row is dropped, counted in ``diagnostics`` and warned of once.
    ``read_ahead_mb`` (remote datasets: default a sixteenth of the memory budget, 32 MB; 0: none): the row
    groups the plan reads next are fetched ahead in parallel ranged GETs, the first one alone, holding at
    most this many bytes fetched and not yet decoded, whatever the objects' size (see
    :mod:`unihub.readers.prefetch`; :attr:`Reader.read_ahead` reports what it did).
    ``version=N`` or ``tag='name'`` read that version of a dataset that records versions (default: the
    latest); the reader keeps to the version it opened, rows appended meanwhile are not seen
    (:mod:`unihub.store.versions`).
    """
    kwargs = _by_name("make_reader", _READER_POSITIONAL, args, kwargs)
    return _make(dataset_url, batched=False, schema_fields=schema_fields, **kwargs)


def make_batch_reader(dataset_url_or_urls: Any, schema_fields: Any = None, *args: Any, **kwargs: Any) -> Reader:
    """A reader that yields batches (a namedtuple of column arrays), one per row group or task.

    Reads any Parquet store, with or without a Unischema; arguments as :func:`make_reader`.
    A ``transform_spec`` function receives a pandas DataFrame (Petastorm's contract), or a
    dict of numpy columns with ``TransformSpec(..., batch_format='numpy')``. A predicate of one's
    own that defines only ``do_include`` is called once per row group with its columns
    (:class:`~unihub.readers.predicates.RowGroupColumns`) and returns a boolean mask, as Petastorm's.
    """
    kwargs = _by_name("make_batch_reader", _BATCH_READER_POSITIONAL, args, kwargs)
    return _make(dataset_url_or_urls, batched=True, schema_fields=schema_fields, **kwargs)


#: the last word of a pass's seed (:func:`next_pass_seed`): other than any seed a plan or a mix draws with
_PASS_STREAM = 0x50415353


def next_pass_seed(seed: int) -> int:
    """The seed that orders the pass after one ordered by ``seed`` (a mix's ``on_exhausted='cycle'``): a pure
    function of it, so a resumed mix starts the same passes in the same orders."""
    return int(np.random.SeedSequence([int(seed), _PASS_STREAM]).generate_state(1, np.uint64)[0] >> 1)


def start_over(reader: Any) -> None:
    """Start ``reader`` over from its first epoch, wherever it is: its ``start_over()`` where it has one
    (unihub's readers, mixed ones), else ``reset()`` (Petastorm's, or a reader of one's own)."""
    if hasattr(reader, "start_over"):
        reader.start_over()
    else:
        reader.reset()
