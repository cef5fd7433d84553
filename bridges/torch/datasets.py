"""torch-native datasets over unihub readers, for torch's own ``DataLoader``: ``TorchIterableDataset``
(rows or column batches, each torch worker of each rank reading its own shard) and ``TorchMapDataset``
(rows by index, for any sampler).

Both subclass torch's dataset classes, so they are built when first asked for (this module's
``__getattr__``), and torch is never imported when this module is. Their rows go to torch's
``default_collate`` as the types of ``sampler_rows.py``, which hand their columns over whole.

    loader = torch.utils.data.DataLoader(TorchIterableDataset(url, batch_size=64), num_workers=4)
    loader = torch.utils.data.DataLoader(TorchMapDataset(url), batch_size=64, shuffle=True, num_workers=2)

Exact, elastic resume: ``TorchIterableDataset`` is torch's ``Stateful`` per worker (torchdata's
``StatefulDataLoader`` checkpoints it), and resumes from every rank's states on other rank and worker
counts; ``TorchMapDataset``'s order is its sampler's: ``stateful.ElasticDistributedSampler`` resumes alike.
"""

from __future__ import annotations

import itertools
import json
import math
import operator
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import numpy as np

from unihub.bridges.torch.collate import Variable, check_variable, columns_from_numpy, row_to_tensors, row_value
from unihub.bridges.torch.loaders import BatchedDataLoader
from unihub.bridges.torch.sampler_rows import (
    SamplerBatch,
    SamplerRow,
    TransformedRow,
    register_sampler_collate,
    rows_of_columns,
    straight_to_default_collate,
)
from unihub.bridges.torch.shared_batches import in_torch_worker, receive_here, worker_pool
from unihub.bridges.torch.state import LoaderStateError, rank_and_world
from unihub.bridges.torch.stateful import (
    STATEFUL_VERSION,
    STREAM_KIND,
    IterableResume,
    exact_share,
    iterable_resume,
    iterable_state,
    reader_of,
    state_json,
)
from unihub.bridges.torch.tensors import Columns, empty_in_pool, from_worker, load_torch, torch_dtype
from unihub.errors import InvalidArgumentError
from unihub.readers.batching import columns_length, numpy_view
from unihub.readers.random_access import Dataset
from unihub.readers.reader import Reader, make_batch_reader, make_reader, random_seed
from unihub.readers.workers import usable_cores
from unihub.schema.codecs import CompressedImageCodec, image_pixels_allowed


def _epoch_seed(seed: int, epoch: int) -> int:
    """The reader seed of ``epoch``: one per (seed, epoch), the same in every rank and worker (so shards agree)."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1, np.uint64)[0] >> 1)


def _threads_per_worker(workers: int) -> int:
    """Decoding threads for the reader of each of ``workers`` torch worker processes: their share
    of the cores (a reader's default is one thread per core, and every worker starting that many
    had 2 x workers threads contending for the cores)."""
    return max(1, usable_cores() // workers)


_RESERVED = ("cur_shard", "shard_count", "shard_by", "shard_remainder", "num_epochs", "resume_from")


class _Run:
    """One ``iter()`` of a ``TorchIterableDataset`` in one worker: what its state says (see
    :func:`~unihub.bridges.torch.stateful.iterable_state`), asked for between the rows it yields."""

    def __init__(self, epoch: int, seed: int, shard: tuple[int, int], before: int, rows: int) -> None:
        self.epoch, self.seed, self.shard, self.before = epoch, seed, shard, before
        self.rows = rows  # rows of the epoch this shard delivered before the current chunk
        self.finished = False
        self.frozen: dict[str, Any] | None = None
        self._reader_state: dict[str, Any] = {}
        self._chunk: tuple[int, Iterator[Any]] | None = None
        #: a state that is asked for where it is (a loader's: reader, skip, exclude), instead of chunks
        self.live: Callable[[], dict[str, Any]] | None = None
        #: a batch reader's: its state where the run began, the rows after it delivered then (a resume's skip)
        #: and this shard's rows then, and where each task of its plan ends (rows of the epoch, from 0)
        self._base: tuple[dict[str, Any], int, int, np.ndarray] | None = None

    def from_base(self, reader: Any, skip: int) -> None:
        """Count the rows of a batch reader's run on from where ``reader`` is now (``skip`` rows on, which
        its loader drops): its batches are read ahead, so the state is worked out from the plan when asked
        (a loader's state_dict() would cost a set difference of the rows it holds, per batch)."""
        state = reader.state_dict()
        sizes = [task.num_rows for task in reader.plan_of(int(state["epoch"]))]
        self._base = (state, skip, self.rows, np.cumsum([0, *sizes]))

    def _reader_after_base(self) -> dict[str, Any]:
        """The batch reader's state after the rows delivered: the start of the task that holds the next row,
        and the rows of that task before it (``skip``)."""
        assert self._base is not None
        state, skip, rows, ends = self._base
        target = int(ends[min(int(state["task"]), len(ends) - 1)]) + skip + self.rows - rows
        task = int(np.searchsorted(ends, target, side="right")) - 1
        return dict(state, task=task, offset=0, skip=target - int(ends[task]), exclude=[])

    def at(self, reader_state: dict[str, Any]) -> None:
        """The reader is at ``reader_state`` before a chunk is read: the rows of the last are delivered."""
        if self._chunk is not None:
            self.rows += self._chunk[0]
        self._reader_state, self._chunk = reader_state, None

    def serve(self, rows: list[Any]) -> Iterator[Any]:
        """``rows`` (a chunk read after :meth:`at`): how many were delivered is their iterator's length hint,
        so the rows go out at ``yield from`` speed, with no count kept per row."""
        self._chunk = (len(rows), iterator := iter(rows))
        return iterator

    def state(self) -> dict[str, Any]:
        if self.frozen is not None:
            return self.frozen
        taken = self._chunk[0] - operator.length_hint(self._chunk[1]) if self._chunk is not None else 0
        if self._base is not None:
            reader = self._reader_after_base()
        elif self.live is not None:
            loader = self.live()
            reader = dict(loader["reader"], skip=int(loader["skip"]), exclude=list(loader["exclude"]))
        else:
            reader = dict(self._reader_state, skip=taken, exclude=[]) if self._reader_state else {}
        return iterable_state(seed=self.seed, epoch=self.epoch, shard=self.shard, before=self.before,
                              rows=self.rows + taken, finished=self.finished, reader=reader)


def _reader_state_only(state: dict[str, Any]) -> dict[str, Any]:
    """A dataset state's reader state without the loader's ``skip``/``exclude`` (a reader's own resume)."""
    return {key: value for key, value in state.items() if key not in ("skip", "exclude")}


def _build_iterable_dataset(torch: Any) -> type:
    class TorchIterableDataset(torch.utils.data.IterableDataset):
        """Rows (``batch_size=None``) or column batches of a dataset for torch's own DataLoader.

        Each torch worker of each rank reads its own shard: ``cur_shard = rank * num_workers +
        worker_id`` of ``world_size * num_workers``, cut by row so every row of an epoch is
        delivered exactly once. Each ``iter()`` is one epoch; the order is seeded by
        ``(seed, epoch)``, and ``set_epoch`` sets the epoch (needed when workers are not
        persistent). Pass the same ``seed`` on every rank. With ``batch_size``, use torch's
        ``DataLoader(ds, batch_size=None)``. ``reader_kwargs`` go to ``make_reader``/``make_batch_reader``.
        ``rank``/``world_size`` default to ``torch.distributed``'s (read in each worker).
        ``shard_remainder``: ``'exact'`` (each row of an epoch once; the last shards may have a row or a
        few fewer), ``'pad'`` (every shard ``ceil(rows / shards)``, wrapping round: ranks equal, as DDP
        needs) or ``'drop'`` (every shard ``floor(rows / shards)``).

        Resume (torch's ``Stateful``): ``state_dict()`` is the state of the worker it is called in, after
        the rows it yielded; torchdata's ``StatefulDataLoader`` calls it in each worker and keeps the states
        as of the last batch it delivered, and gives each worker its own back (``load_state_dict``), with
        ``num_workers=0`` or more. Elastic: ``load_state_dict([...])`` with the states of **every** rank of a
        run (each rank's ``StatefulDataLoader.state_dict()``, or the dataset states of every worker of every
        rank), saved with any number of ranks and workers, before iterating: this worker of this rank then
        delivers its equal contiguous run of the rows no old worker delivered of that epoch (each row once
        over all of them), and later epochs are as a fresh run's with this world size. The loaded seed and
        epoch replace the dataset's; the resume applies to that epoch (a ``set_epoch`` to another drops it).

        ``url`` may also be a row reader, such as ``CachedDataset.stream(...)``: it is served as it is
        (its shard, order, offset and epochs), once, in the process that iterates (torch's
        ``num_workers=0``): one position in one order cannot be split among torch workers.
        """

        def __init__(self, url: Any, batch_size: int | None = None, *, seed: int | None = None,
                     variable: Variable = "list", rank: int | None = None, world_size: int | None = None,
                     shard_remainder: Literal["exact", "pad", "drop"] = "exact", **reader_kwargs: Any) -> None:
            super().__init__()
            receive_here()  # the workers torch forks hand this process their shared memory
            reserved = sorted(set(reader_kwargs) & set(_RESERVED))
            if reserved:
                raise InvalidArgumentError(f"TorchIterableDataset sets {reserved} itself (one epoch per iter(), sharded "
                                  "by torch worker and rank); leave them out")
            check_variable(variable)
            self.stream = url if isinstance(url, Reader) else None
            if self.stream is not None and (reader_kwargs or self.stream.batched):
                raise InvalidArgumentError("a reader given to TorchIterableDataset is served as it is: pass a row "
                                           "reader (make_reader, CachedDataset.stream) and no reader options")
            if (rank is None) != (world_size is None) or \
                    (rank is not None and world_size is not None and not 0 <= rank < world_size):
                raise InvalidArgumentError(f"rank and world_size go together, 0 <= rank < world_size; got {rank} "
                                           f"and {world_size}")
            self.url, self.batch_size, self.variable = url, batch_size, variable
            self.rank, self.world_size = rank, world_size
            if shard_remainder not in ("exact", "pad", "drop"):
                raise InvalidArgumentError(f"shard_remainder must be 'exact', 'pad' or 'drop', got {shard_remainder!r}")
            self.shard_remainder = shard_remainder
            if seed is None:
                seed = random_seed()
            self.seed = int(seed)
            self.reader_kwargs = reader_kwargs
            self.epoch = 0
            self._resume: IterableResume | None = None
            self._run: _Run | None = None
            self._iterators = self._loaded_at = 0  # iterators made, and made before the last load_state_dict
            #: a stream's: the loader of its batches, and a state to load into the next one
            self._stream_loader: BatchedDataLoader | None = None
            self._stream_resume: dict[str, Any] | None = None

        def __getstate__(self) -> dict[str, Any]:
            return dict(self.__dict__, _run=None, _stream_loader=None)  # a worker's iteration stays in it

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def _shard(self) -> tuple[int, int]:
            info = torch.utils.data.get_worker_info()
            worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
            rank, world = (self.rank, self.world_size) if self.rank is not None and self.world_size is not None \
                else rank_and_world()
            return rank * workers + worker, world * workers

        def _pending(self, number: int | None = None) -> IterableResume | None:
            """The loaded resume, where it applies to this epoch. A worker's state that had finished its share
            resumes the epoch with nothing left only in the first iterator made after it was loaded (the others
            of that loader deliver the rest); an iterator made later (``StatefulDataLoader`` resuming an epoch
            that had ended makes a new one; persistent workers keep this dataset) begins the next epoch."""
            resume = self._resume
            if resume is None or resume.epoch != self.epoch:
                return None
            if resume.own is not None and resume.own["finished"] and number is not None and \
                    number != self._loaded_at + 1:
                self.epoch, self._resume = resume.epoch + 1, None
                return None
            return resume

        def state_dict(self) -> dict[str, Any]:
            """This worker's position: after the rows it yielded (see the class; JSON-able)."""
            if self.stream is not None:
                return self._stream_state()
            if self._run is not None:
                return self._run.state()
            shard = self._shard()
            resume = self._own_or_elastic(self._pending(), shard)
            if resume is None:
                return iterable_state(seed=self.seed, epoch=self.epoch, shard=shard, before=0, rows=0,
                                      finished=False, reader={})
            if resume.own is not None:
                return resume.own
            with self._open(resume.epoch, shard, resume) as reader:  # where this shard's run of the rest starts
                before = _delivered_before(reader, resume.before, len(resume.readers or ()))
                if before >= reader.store.num_rows:  # the old ranks' epoch is over: this shard is at the next's start
                    return iterable_state(seed=self.seed, epoch=self.epoch + 1, shard=shard, before=0, rows=0,
                                          finished=False, reader={})
                return iterable_state(seed=self.seed, epoch=self.epoch, shard=shard, before=before, rows=0,
                                      finished=False, reader=dict(reader.state_dict(), skip=0, exclude=[]))

        def load_state_dict(self, state: Any) -> None:
            """Resume from this worker's own state, or elastically from the states of every rank (see the class)."""
            if self.stream is not None:
                self._load_stream_state(state)
                return
            resume = iterable_resume(state, in_worker=torch.utils.data.get_worker_info() is not None)
            self._loaded_at = self._iterators
            if isinstance(resume, tuple):
                (self.epoch, self.seed), self._resume = resume, None
            else:
                self.epoch, self.seed, self._resume = resume.epoch, resume.seed, resume
            self._run = None

        @staticmethod
        def _own_or_elastic(resume: IterableResume | None, shard: tuple[int, int]) -> IterableResume | None:
            """``resume``, a worker's own state turned into an elastic resume where it was saved by the only
            shard of its run for another shard; :class:`LoaderStateError` where it is another shard's."""
            if resume is None or resume.own is None or resume.own["shard"] == list(shard):
                return resume
            own = resume.own
            if own["shard"] != [0, 1]:
                raise LoaderStateError(f"the state is shard {own['shard'][0]} of {own['shard'][1]}'s (rank * workers "
                                       f"+ worker of world * workers), this worker is shard {shard[0]} of {shard[1]}: "
                                       "to resume on other numbers of ranks or workers, load the list of every "
                                       "rank's states")
            return IterableResume(resume.epoch, resume.seed, readers=[reader_of(own)],
                                  before=int(own["before"]) + int(own["rows"]))

        def _open(self, epoch: int, shard: tuple[int, int], resume: IterableResume | None) -> Reader:
            kwargs = dict(self.reader_kwargs, seed=_epoch_seed(self.seed, epoch), num_epochs=1)
            info = torch.utils.data.get_worker_info()
            if info is not None and info.num_workers > 1 and "workers_count" not in kwargs:
                kwargs["workers_count"] = _threads_per_worker(info.num_workers)
            if shard[1] > 1:
                kwargs.update(cur_shard=shard[0], shard_count=shard[1], shard_by="row",
                              shard_remainder="drop" if self.shard_remainder == "drop" else "pad")
            if resume is not None:
                kwargs["resume_from"] = _reader_state_only(reader_of(resume.own)) if resume.own is not None \
                    else resume.readers
            make = make_reader if self.batch_size is None else make_batch_reader
            return make(self.url, **kwargs)

        def __iter__(self) -> Iterator[Any]:
            self._iterators += 1  # counted when made, not when started (see _pending)
            return self._iterate(self._iterators)

        def _iterate(self, number: int) -> Iterator[Any]:
            info = torch.utils.data.get_worker_info()
            if info is not None:
                in_torch_worker()
            if self.stream is not None:
                yield from self._serve_stream(info)
                return
            shard = self._shard()
            resume = self._own_or_elastic(self._pending(number), shard)
            epoch, self._resume = self.epoch, None
            self.epoch += 1
            own = resume.own if resume is not None else None
            before = int(own["before"]) if own is not None else resume.before if resume is not None else 0
            run = self._run = _Run(epoch, self.seed, shard, before, int(own["rows"]) if own is not None else 0)
            reader = self._open(epoch, shard, resume)
            if resume is not None and resume.readers is not None:
                run.before = _delivered_before(reader, run.before, len(resume.readers))
                if run.before >= reader.store.num_rows:
                    # the old ranks delivered every row of their epoch (or with 'drop' each its whole share, saved
                    # before it saw its end): the next one, as a fresh run's
                    with _one_epoch(reader):
                        pass
                    epoch, resume, self.epoch = epoch + 1, None, epoch + 2
                    run = self._run = _Run(epoch, self.seed, shard, 0, 0)
                    reader = self._open(epoch, shard, None)
            with _one_epoch(reader):
                limit = _share_left(reader, run, resume, self.shard_remainder)
                skip = int(reader_of(own).get("skip", 0)) if own is not None else 0
                try:
                    yield from self._serve(reader, run, limit, skip, info)
                    run.finished = True
                finally:
                    if self._run is run:  # a later iter() may have begun before this one is closed
                        run.frozen = run.state()

        def _serve(self, reader: Any, run: _Run, limit: int | None, skip: int, info: Any) -> Iterator[Any]:
            if self.batch_size is None and reader.ngram is None:
                _skip_rows(reader, skip)
                yield from _cut_rows(reader, limit, run)
                return
            if self.batch_size is None:  # an n-gram a row: torch collates them as they are
                if skip:
                    raise LoaderStateError("an n-gram reader's state carries no rows to skip: it was not saved here")
                run.live = lambda: {"reader": reader.state_dict(), "skip": 0, "exclude": []}
                for row in itertools.islice(reader, limit):
                    run.rows += 1
                    yield row_to_tensors(row)
                return
            loader = BatchedDataLoader(reader, batch_size=self.batch_size, variable=self.variable)
            if skip:  # rows of the reader's position on that were delivered: the loader drops them
                loader.load_state_dict(dict(loader.state_dict(), skip=skip))
            loader._max_rows = limit + skip if limit is not None else None
            if reader.num_rows_per_epoch is None or getattr(reader, "on_decode_error", "raise") == "skip":
                # a predicate or filters, or rows dropped for images that do not decode: the plan does not
                # count the rows delivered, the loader does
                run.live = loader.state_dict
            else:
                run.from_base(reader, skip)
            pool = loader._shared_batches = worker_pool() if info is not None else None
            for batch in loader:
                run.rows += columns_length(batch)
                yield pool.sending(batch) if pool is not None else batch

        def _serve_stream(self, info: Any) -> Iterator[Any]:
            if info is not None:
                raise InvalidArgumentError("a reader (a stream) is one position in one order and cannot be split "
                                           "among torch workers: use num_workers=0, or pass the dataset's URL so "
                                           "that each worker reads its own shard")
            assert self.stream is not None
            if self.batch_size is None:
                for row in self.stream:
                    yield row_to_tensors(row)
                return
            loader = self._stream_loader = BatchedDataLoader(self.stream, batch_size=self.batch_size,
                                                             variable=self.variable)
            if self._stream_resume is not None:
                loader.load_state_dict(self._stream_resume)
                self._stream_resume = None
            yield from loader

        def _stream_state(self) -> dict[str, Any]:
            """A stream's position after what was yielded: its reader's, or with ``batch_size`` its loader's."""
            assert self.stream is not None
            if self.batch_size is None:
                position = self.stream.state_dict()
            elif self._stream_resume is not None:
                position = self._stream_resume
            else:
                loader = self._stream_loader or BatchedDataLoader(self.stream, batch_size=self.batch_size,
                                                                  variable=self.variable)
                position = loader.state_dict()
            # the reader's state as its JSON text: keys that vary would be lost by torch.distributed.checkpoint
            return {"version": STATEFUL_VERSION, "kind": STREAM_KIND, "position": json.dumps(position, sort_keys=True)}

        def _load_stream_state(self, state: Any) -> None:
            if not isinstance(state, dict) or state.get("kind") != STREAM_KIND or \
                    state.get("version") != STATEFUL_VERSION:
                raise LoaderStateError("a TorchIterableDataset over a reader (a stream) resumes from its own "
                                       "state_dict() only (one stream, one position: no elastic resume)")
            position = state_json(state.get("position"), "the TorchIterableDataset stream state's 'position'")
            if not isinstance(position, dict):
                raise LoaderStateError("the TorchIterableDataset stream state's 'position' is not a position")
            if self.batch_size is None:
                self.stream.load_state_dict(position)  # type: ignore[union-attr]
            else:
                self._stream_resume, self._stream_loader = position, None

    register_sampler_collate()

    TorchIterableDataset.__module__ = __name__
    TorchIterableDataset.__qualname__ = "TorchIterableDataset"
    return TorchIterableDataset


def _delivered_before(reader: Any, counted: int, shards: int) -> int:
    """Rows of its epoch that the old ranks delivered, each once, as ``reader`` (resumed from their states, its
    one epoch 0) records them. Their states' rows summed (``counted``) also count a ``'pad'`` shard's
    wrap-around repeats, fewer than one per shard of ``shards``: more or fewer, the states are not of one run.
    Every row where the reader starts after the epoch: each shard was at the end of its share (with ``'drop'``,
    rows left out that no count reaches)."""
    state = reader.state_dict()
    if state["epoch"] > 0:
        return int(reader.store.num_rows)
    done = state["done"]
    delivered = sum(done[k + 2] - done[k + 1] for k in range(0, len(done), 3) if done[k] == 0)
    if not 0 <= counted - delivered < shards:
        raise LoaderStateError(f"the states say {counted} of {reader.store.num_rows} rows of the epoch were "
                               f"delivered, their readers' positions {delivered}: the states are not of one run of "
                               "this dataset, or some rank's are missing")
    return delivered


def _share_left(reader: Any, run: _Run, resume: IterableResume | None, remainder: str) -> int | None:
    """Rows this shard still delivers of its epoch: with ``remainder='exact'`` its exact share of what runs
    before left (a ``shard_remainder='pad'`` row shard's rows that are not wrap-around repeats), less what it
    delivered. None where the reader ends where the share does: the only shard, and ``'pad'``/``'drop'``."""
    shard, count = run.shard
    if count == 1:
        return None
    if reader.num_rows_per_epoch is None:
        raise InvalidArgumentError("TorchIterableDataset with several workers or ranks needs the row count to shard "
                          "rows exactly once; predicate=, filters= and batch transforms are not supported there")
    rest = reader.store.num_rows - run.before
    if resume is not None and resume.readers is not None:
        planned = sum(task.num_rows for task in reader.plan_of(0))
        if planned != (rest // count if remainder == "drop" else math.ceil(rest / count)):
            raise LoaderStateError(f"the states say {run.before} of {reader.store.num_rows} rows of the epoch were "
                                   f"delivered, the reader's plan leaves {planned} rows to this shard of {count}: "
                                   "the states are not of one run of this dataset, or some rank's are missing")
    return exact_share(rest, shard, count) - run.rows if remainder == "exact" else None


def _skip_rows(reader: Any, count: int) -> None:
    """Pass over ``count`` rows of a row reader: from its plan, or where a predicate or filters leave rows
    known only by reading them, read and dropped."""
    if count and reader.num_rows_per_epoch is not None:
        reader.skip_rows(count)
        return
    while count > 0:
        columns = reader.next_columns(count)
        if columns is None:
            return
        count -= columns_length(columns)


def _cut_rows(reader: Any, limit: int | None, run: _Run) -> Iterator[Any]:
    """A row reader's rows as :func:`row_to_tensors` gives them (at most ``limit``), cut from its
    columns (:meth:`~unihub.readers.reader.Reader.next_columns`) as :class:`SamplerRow`: torch's
    collate hands runs of them over as slices of those columns, not stacked row by row. ``run`` is
    told where the reader is before each chunk, and which rows of it are delivered."""
    left = limit
    while left is None or left > 0:
        run.at(reader.state_dict())
        columns = reader.next_columns(left if left is not None else 2**31)
        if columns is None:
            return
        converted = columns_from_numpy(columns, cell=row_value)
        count = columns_length(converted)
        if left is not None:
            left -= count
        yield from run.serve(rows_of_columns(converted, count, SamplerRow))
    run.at(reader.state_dict())


def _build_map_dataset(torch: Any) -> type:
    class TorchMapDataset(torch.utils.data.Dataset):
        """Rows by index (``random_access.Dataset``) for samplers: ``RandomSampler``, ``DistributedSampler``.

        Items are dicts (numeric values as tensors), passed through ``transform`` if given.
        ``__getitems__`` reads a whole sampler batch at once, each row group once.
        """

        def __init__(self, url: Any, schema_fields: Any = None, transform: Callable[[dict[str, Any]], Any] | None = None,
                     **dataset_kwargs: Any) -> None:
            receive_here()  # the workers torch forks hand this process their shared memory
            self.url, self.schema_fields, self.transform = url, schema_fields, transform
            self.dataset_kwargs = dataset_kwargs
            self._dataset: Any = None
            self._pool_fields: list[tuple[Any, Any]] | None = None
            self._len = len(self._open())

        def _open(self) -> Any:
            if self._dataset is None:
                self._dataset = Dataset(self.url, self.schema_fields, **self.dataset_kwargs)
            return self._dataset

        def __getstate__(self) -> dict[str, Any]:
            return dict(self.__dict__, _dataset=None)  # reopened in each worker process

        def __len__(self) -> int:
            return self._len

        def __getitem__(self, index: Any) -> Any:
            """A row for an int index. For a sequence of indices (a ``BatchSampler`` as the
            ``sampler`` with ``batch_size=None``, HF's idiom), their batch: columns (numeric ones as
            tensors), or with ``transform`` the list of transformed rows."""
            if isinstance(index, bool):
                raise TypeError("a row index must be an int, not a bool")
            try:
                position = operator.index(index)
            except TypeError:
                return self._batch(index)
            row = self.__getitems__([position])[0]
            return dict(row) if type(row) in (SamplerRow, TransformedRow) else row

        def _batch(self, indices: Any) -> Any:
            indices = indices.tolist() if hasattr(indices, "tolist") else list(indices)
            if self.transform is not None:
                return self.__getitems__(indices)
            columns = self._columns(indices)
            return columns if torch.utils.data.get_worker_info() is None else from_worker(columns)

        def __getitems__(self, indices: Sequence[int]) -> list[Any]:
            if torch.utils.data.get_worker_info() is not None:
                in_torch_worker()
            if self.transform is not None:
                columns = columns_from_numpy(self._open().take(list(indices))._asdict())
                rows = [self.transform(row) for row in rows_of_columns(columns, len(indices), dict)]
                if torch.utils.data.get_worker_info() is None:
                    return rows
                # dicts the transform made: collated into the worker's reused shared memory
                return [TransformedRow(row) if type(row) is dict else row for row in rows]
            columns = self._columns(list(indices))
            if indices and torch.utils.data.get_worker_info() is not None and \
                    all(isinstance(c, torch.Tensor) for c in columns.values()) and \
                    straight_to_default_collate(sys._getframe(1)):
                return [SamplerBatch(columns)] * len(indices)
            return rows_of_columns(columns, len(indices), SamplerRow)

        def _columns(self, indices: list[int]) -> Columns:
            """Rows ``indices`` as columns (numeric ones as tensors). In a torch worker the
            fixed-shape numeric columns are decoded (or copied) straight into one storage of the
            worker's pool, in which the batch then leaves the worker without another copy."""
            dataset = self._open()
            in_worker = bool(indices) and torch.utils.data.get_worker_info() is not None
            shapes = {f.name: (dtype, (len(indices), *f.shape)) for f, dtype in self._pooled_fields()
                      if not isinstance(f.codec, CompressedImageCodec) or image_pixels_allowed(f)} if in_worker else {}
            if not shapes:
                return columns_from_numpy(dataset.take(indices)._asdict())
            tensors = empty_in_pool(shapes)
            arrays = {name: numpy_view(tensor) for name, tensor in tensors.items()}
            batch = dataset.take(indices, into=arrays)._asdict()
            columns = columns_from_numpy({name: v for name, v in batch.items() if v is not arrays.get(name)})
            return {name: tensors[name] if v is arrays.get(name) else columns[name] for name, v in batch.items()}

        def _pooled_fields(self) -> list[tuple[Any, Any]]:
            """(field, torch dtype) of the fixed-shape numeric fields a worker decodes into its pool."""
            if self._pool_fields is None:
                self._pool_fields = [(f, dtype) for f in self._open().schema
                                     if f.is_fixed_shape and (dtype := torch_dtype(f.dtype)) is not None]
            return self._pool_fields

    register_sampler_collate()

    TorchMapDataset.__module__ = __name__
    TorchMapDataset.__qualname__ = "TorchMapDataset"
    return TorchMapDataset


_BUILDERS = {"TorchIterableDataset": _build_iterable_dataset, "TorchMapDataset": _build_map_dataset}


def __getattr__(name: str) -> Any:
    """The torch dataset classes subclass torch's, so they are built when first asked for."""
    builder = _BUILDERS.get(name)
    if builder is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = builder(load_torch())
    globals()[name] = cls
    return cls


@contextmanager
def _one_epoch(reader: Reader) -> Iterator[Reader]:
    """``reader``, stopped and joined when its epoch ends, its local-disk cache kept: the dataset opens a reader per
    epoch, and ``cache_type='local-disk'`` is for the next one (as ``make_tf_dataset``'s readers keep it; a reader's
    with-block would remove it unless ``cleanup=False``, so every epoch read the store again)."""
    try:
        yield reader
    finally:
        reader.stop()
        reader.join()
