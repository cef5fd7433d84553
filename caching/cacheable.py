"""``cacheable``: build a data loader's output once as a unihub dataset, then serve it with unihub's readers.

Example::

    from unihub import cacheable, make_tf_dataset

    @cacheable("s3://bucket/cache", dataset_id="mnist-train", version="3")
    def make_data():
        return tf.data.Dataset.from_tensor_slices(files).map(decode)

    ds = make_data()            # the first call anywhere builds; later calls only open
    stream = ds.stream(start_offset=1200, shuffle=True, seed=0, shard_rank=rank, num_shards=world)
    make_tf_dataset(stream, batch_size=64)

The function is called only when the cache is built. Of many processes calling at once, one
builds and the others wait (:mod:`unihub.caching.lease`); a build that fails or is killed leaves
no cache, and the next call builds again.
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from unihub.caching.lease import HEARTBEAT_SECONDS, break_if_stale, describe, try_acquire
from unihub.caching.sources import Row, adapt, image_fields, infer_schema
from unihub.caching.store import CacheInfo, CacheRoot, check_name
from unihub.errors import CacheError, CacheTimeoutError, InvalidArgumentError, SchemaError
from unihub.readers.random_access import Dataset
from unihub.readers.reader import Reader, make_reader
from unihub.runtime.memory import DEFAULT_ROW_GROUP_SIZE_MB
from unihub.runtime.progress import is_progress_bar_enabled
from unihub.schema.unischema import Unischema
from unihub.store.writer import write_dataset

Progress = Callable[[int, float], None]


class CachedDataset:
    """A published cache: ``url`` for any unihub reader, ``len()``, ``take()`` and ``stream()``."""

    def __init__(self, root: CacheRoot, info: CacheInfo) -> None:
        self.root, self.info = root, info
        self.url = root.dataset_url(info.dataset_id, info.version)

    def __len__(self) -> int:
        return self.info.num_rows

    def __repr__(self) -> str:
        return f"CachedDataset({self.url!r}, {self.info.num_rows} rows from {self.info.source_type})"

    def _options(self) -> dict[str, Any]:
        return {"storage_options": self.root.storage_options, "filesystem": self.root.filesystem}

    def take(self, indices: Sequence[int]) -> Any:
        """Rows ``indices`` (global, in the order given) as a batch namedtuple of column arrays."""
        return Dataset(self.url, **{k: v for k, v in self._options().items() if v is not None}).take(indices)

    def stream(self, start_offset: int | Sequence[int] = 0, *, shuffle: bool = False, seed: int | None = None,
               shard_rank: int = 0, num_shards: int = 1, drop_shard_remainder: bool = False,
               num_epochs: int | None = 1, resume_from: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
               **reader_kwargs: Any) -> Reader:
        """yogadl's ``DataRef.stream``: a row reader over this shard, from ``start_offset``.

        ``len()`` is this shard's rows per epoch times ``num_epochs`` (as yogadl's, the skipped
        rows included). Shards are cut by row, so every rank gets ``ceil(rows / num_shards)`` rows
        (wrapping around), or ``floor`` with ``drop_shard_remainder=True``; pass the same ``seed`` on
        every rank. ``start_offset`` positions the first epoch without reading the rows before it
        (the reader's exact resume); later epochs are whole, reshuffled by ``(seed, epoch)``. The
        result is a :class:`~unihub.Reader`, so the bridges take it (``make_tf_dataset``,
        ``DataLoader``, ``BatchedDataLoader``, ``TorchIterableDataset`` with torch's ``num_workers=0``);
        DALI's sources take the same arguments on the same plan (``DaliBatchSource(ds.url, ...,
        shuffle=, seed=, shard_id=, num_shards=, start_offset=)``). ``reader_kwargs`` go to
        :func:`~unihub.make_reader`.

        Elastic resume, onto another ``num_shards``: ``start_offset=[offset_0, ..., offset_n]``, the first
        epoch's offsets of every rank of a run of ``n + 1`` shards (the same other arguments), or
        ``resume_from=[state_0, ..., state_n]``, every rank's ``state_dict()`` of the stream (a single state
        resumes its own rank); this rank then reads its equal share of the rows no rank of that run read
        (:meth:`~unihub.Reader.load_state_dict`).
        """
        start_offset, shard_rank, num_shards = _ints(start_offset), _ints(shard_rank), _ints(num_shards)
        if not isinstance(num_shards, int) or not isinstance(shard_rank, int) or num_shards < 1 or \
                not 0 <= shard_rank < num_shards:
            raise InvalidArgumentError(f"need 0 <= shard_rank < num_shards, got shard_rank={shard_rank}, "
                                       f"num_shards={num_shards}")
        offsets = [start_offset] if isinstance(start_offset, int) else start_offset
        if not isinstance(offsets, Sequence) or not offsets or \
                not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets):
            raise InvalidArgumentError(f"start_offset must be a non-negative int, or a non-empty list of them (every "
                                       f"rank's), got {start_offset!r}")
        if resume_from is not None and (any(offsets) or not isinstance(start_offset, int)):
            raise InvalidArgumentError("start_offset and resume_from both say where to start: pass one of them")

        def open_shard(rank: int, count: int, resume: Any = None) -> Reader:
            sharded = count > 1
            return make_reader(self.url, shuffle_row_groups=shuffle, shuffle_rows=shuffle, seed=seed,
                               cur_shard=rank if sharded else None, shard_count=count if sharded else None,
                               shard_by="row", shard_remainder="drop" if drop_shard_remainder else "pad",
                               num_epochs=num_epochs, resume_from=resume, **self._options(), **reader_kwargs)

        if not isinstance(start_offset, int):  # every rank's offsets: as their readers' states
            resume_from = [_state_at(open_shard(rank, len(offsets)), offset, rank) for rank, offset in enumerate(offsets)]
        reader = open_shard(shard_rank, num_shards, resume_from)
        if isinstance(start_offset, int) and start_offset:
            try:
                reader.seek(start_offset)
            except BaseException:
                reader.stop()
                raise
        return reader


def _ints(value: Any) -> Any:
    """numpy's integers (a rank or an offset read from a checkpoint) as Python ints, in a list too; the rest as given."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, list | tuple):
        return [int(v) if isinstance(v, np.integer) else v for v in value]
    return value


def _state_at(reader: Reader, offset: int, rank: int) -> dict[str, Any]:
    """``reader``'s state after ``offset`` rows of its first epoch (all of them: the epoch's end), read nothing.
    It is stopped, not closed: closing would remove a local-disk cache the stream's reader and other ranks use."""
    try:
        rows = reader.num_rows_per_epoch or 0
        if offset > rows:
            raise InvalidArgumentError(f"start_offset {offset} is beyond the {rows} rows of shard "
                                       f"{rank}'s epoch")
        return reader.position_after(offset).state
    finally:
        reader.stop()
        reader.join()


def cacheable(url: str | os.PathLike[str], dataset_id: str, version: str | int, *,
              storage_options: dict[str, Any] | None = None, filesystem: Any = None,
              names: Sequence[str] | None = None, schema: Unischema | None = None,
              image_format: str | Mapping[str, str] | None = None, row_group_size_mb: float = DEFAULT_ROW_GROUP_SIZE_MB,
              rows_per_file: int | None = None, wait_timeout: float = 3600.0, stale_after: float = 60.0,
              progress: bool | Progress = False) -> Callable[[Callable[..., Any]], Callable[..., CachedDataset]]:
    """Decorate a function returning a data loader; calling it returns the :class:`CachedDataset`.

    ``url`` is the cache root (a folder, ``s3://...``); caches live at ``url/dataset_id/version``.
    That key is all a call looks at: the function's arguments and the data its loader reads are not,
    so a call with other arguments, or after the source changed, opens the cache built before; give
    each its own ``dataset_id`` or ``version``.
    ``names``: field names for tuple elements (else ``field_0``, ...; ``x``, ``y`` for Keras).
    ``schema``: a Unischema instead of the inferred one. ``image_format``: ``"png"``/``"jpeg"``
    (or ``{field: format}``) stores decoded uint8 images compressed; encoded bytes stay as given.
    ``row_group_size_mb``/``rows_per_file`` bound the build's memory as :func:`write_dataset`'s.
    Waiters give up after ``wait_timeout`` s (:class:`~unihub.errors.CacheTimeoutError`); the lease
    of a builder on this host that is gone, or of one on another host whose heartbeat is older than
    ``stale_after`` s, is taken over. ``progress``: True prints rows and rows/s on stderr; a callable gets
    ``(rows, rows_per_second)``.
    """
    options: dict[str, Any] = dict(names=names, schema=schema, image_format=image_format, row_group_size_mb=row_group_size_mb,
                   rows_per_file=rows_per_file, progress=progress)
    dataset_id, version = check_name("dataset_id", dataset_id), check_name("version", version)

    def decorate(make: Callable[..., Any]) -> Callable[..., CachedDataset]:
        @functools.wraps(make)
        def call(*args: Any, **kwargs: Any) -> CachedDataset:
            root = CacheRoot(url, storage_options=storage_options, filesystem=filesystem)
            return get_or_build(root, dataset_id, version, lambda: make(*args, **kwargs), wait_timeout=wait_timeout,
                                stale_after=stale_after, **options)
        return call
    return decorate


def get_or_build(root: CacheRoot, dataset_id: str, version: str, make: Callable[[], Any], *,
                 wait_timeout: float = 3600.0, stale_after: float = 60.0, heartbeat: float = HEARTBEAT_SECONDS,
                 **options: Any) -> CachedDataset:
    """Open the cache, or build it holding its lease, or wait for the process that holds it."""
    lease_path = root.lease_path(dataset_id, version)
    deadline = time.monotonic() + wait_timeout
    delay = 0.02
    checked = False
    while True:
        info = root.info(dataset_id, version)
        if info is not None:
            return _opened(root, info)
        if not checked:  # before anything is written: not when the cache is there already
            root.check_outside_datasets()
            checked = True
        lease = try_acquire(root.files, lease_path, interval=heartbeat)
        if lease is not None:
            try:
                info = root.info(dataset_id, version) or build(root, dataset_id, version, make, **options)
            finally:
                lease.release()
            return CachedDataset(root, info)
        record = root.files.read(lease_path)
        if record is not None and break_if_stale(root.files, lease_path, record, stale_after):
            continue
        if time.monotonic() > deadline:
            holder = describe(record) if record else "a process that has just finished or failed"
            raise CacheTimeoutError(f"waited {wait_timeout:g} s for cache {root.dataset_url(dataset_id, version)}, "
                                    f"which another process is building ({holder}); raise wait_timeout=, or if "
                                    f"that build is gone, delete {root.url}/{dataset_id}/{version}.lease")
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)


def _opened(root: CacheRoot, info: CacheInfo) -> CachedDataset:
    """The published cache ``info`` names, refused where its record outlived its data (a folder removed by hand:
    every read failed with 'no such file or directory')."""
    if not root.has_data(info.dataset_id, info.version):
        raise CacheError(f"cache {root.dataset_url(info.dataset_id, info.version)} is recorded but its folder is "
                         f"gone; remove the record (unihub cache rm {root.url} {info.dataset_id} {info.version}) "
                         "and it is built again")
    return CachedDataset(root, info)


def build(root: CacheRoot, dataset_id: str, version: str, make: Callable[[], Any], *,
          names: Sequence[str] | None = None, schema: Unischema | None = None,
          image_format: str | Mapping[str, str] | None = None, row_group_size_mb: float = DEFAULT_ROW_GROUP_SIZE_MB,
          rows_per_file: int | None = None, progress: bool | Progress = False) -> CacheInfo:
    """Write the loader's rows as the cache and publish its record (the caller holds the lease)."""
    started = time.time()
    source = adapt(make(), names=names)
    rows: Iterator[Row] = source.rows
    if schema is None:
        if source.schema is not None:
            schema = image_fields(source.schema, image_format)
        else:
            schema, rows = infer_schema(rows, image_format=image_format)
    url = root.dataset_url(dataset_id, version)
    counter = _Counter(url, progress)
    meta = {"cache": {"dataset_id": dataset_id, "version": version, "source_type": source.kind, "built_at": started}}
    data = _refuse_empty(counter.count(rows) if source.batches is None else counter.count_batches(source.batches))
    result = write_dataset(url, schema, data, batched=source.batches is not None, row_group_size_mb=row_group_size_mb,
                           rows_per_file=rows_per_file, overwrite=True, storage_options=root.storage_options,
                           filesystem=root.filesystem, extra_metadata=meta)
    counter.report(final=True)
    info = CacheInfo(dataset_id, version, source.kind, started, time.time() - started, result.num_rows, url)
    root.publish(info)
    return info


def _refuse_empty(data: Iterator[Row]) -> Iterator[Row]:
    """``data`` as it is, or a SchemaError before anything is written: an empty cache could not be read."""
    first = next(data, None)
    if first is None:
        raise SchemaError("the loader yielded no rows; there is nothing to cache")
    return itertools.chain([first], data)


class _Counter:
    """Counts rows on their way to the writer and reports rows and rows/s about once a second."""

    def __init__(self, url: str, progress: bool | Progress) -> None:
        # a callable is the caller's own; the line on stderr is a display, which the switch turns off
        self.url, self.progress = url, progress if callable(progress) else bool(progress) and is_progress_bar_enabled()
        self.rows, self.start, self.last = 0, time.monotonic(), time.monotonic()

    def count(self, rows: Iterator[Row]) -> Iterator[Row]:
        for row in rows:
            self.rows += 1
            yield row
            if self.progress and time.monotonic() - self.last >= 1.0:
                self.report()

    def count_batches(self, batches: Iterator[Row]) -> Iterator[Row]:
        for batch in batches:
            self.rows += len(next(iter(batch.values()))) if batch else 0
            yield batch
            if self.progress and time.monotonic() - self.last >= 1.0:
                self.report()

    def report(self, *, final: bool = False) -> None:
        if not self.progress:
            return
        self.last = time.monotonic()
        rate = self.rows / max(self.last - self.start, 1e-9)
        if callable(self.progress):
            self.progress(self.rows, rate)
        else:
            end = "\n" if final else "\r"
            print(f"cache {self.url}: {self.rows:,} rows, {rate:,.0f} rows/s", end=end, file=sys.stderr, flush=True)
