"""Petastorm's loaders: ``DataLoader`` (rows collated into batches), ``BatchedDataLoader`` (reader batches
re-cut as tensors) and ``InMemBatchedDataLoader`` (rows held in memory, served for several epochs).

Batches are dicts of field name -> tensor (``collate.py`` says how each kind of field comes). Each
loader resumes exactly from its ``state_dict()`` (``state.py``) and is torch's ``Stateful``; with
several ranks wrap it as ``PerRank(loader)``.

    with make_batch_reader(url, num_epochs=1) as reader:
        for batch in BatchedDataLoader(reader, batch_size=256, shuffling_queue_capacity=4096, seed=0):
            train_step(batch["image"], batch["label"])

torch is imported when a loader is made, never when this module is imported. The names README
documents from this module (the torch datasets, ``PerRank``, ``decimal_friendly_collate``) are also
here; the package ``unihub.bridges.torch`` has every public name.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from unihub.bridges.torch.base import LoaderBase
from unihub.bridges.torch.collate import (
    Collate,
    Variable,
    check_variable,
    decimal_friendly_collate,
    default_collate_like,
    finalize,
    make_collate,
)
from unihub.bridges.torch.state import IN_MEMORY_STATE, LOADER_STATE_VERSION, LoaderStateError, PerRank, reader_state_of
from unihub.bridges.torch.tensors import Columns
from unihub.errors import InvalidArgumentError, UsageError
from unihub.readers.batching import columns_length, concat_columns, slice_columns, take_columns

#: the loaders' public names (the package ``unihub.bridges.torch`` re-exports them with the torch datasets)
__all__ = ["BatchedDataLoader", "DataLoader", "InMemBatchedDataLoader", "LoaderStateError", "PerRank",
           "decimal_friendly_collate", "make_collate"]


def _rows_of(batch: Any) -> Iterator[Any]:
    """A batch namedtuple of columns as row namedtuples of the same type."""
    return (batch._make(values) for values in zip(*batch))


class DataLoader(LoaderBase):
    """Petastorm's row loader: rows collated into batches of ``batch_size``.

    The reader is a row reader (``make_reader``) or, as Petastorm allows, a batch reader
    (``make_batch_reader``): with a :func:`make_collate` collate its batches are re-cut as tensors
    (as ``BatchedDataLoader`` does; a list column the reader gives as an ``(n, k)`` array comes
    as a ``(batch_size, k)`` tensor, as in Petastorm), with another ``collate_fn`` they are cut into
    rows for it. ``shuffling_queue_capacity > 0`` passes rows through a buffer of that many rows
    and, once it is full, lets out random ones (seeded by ``seed``). ``collate_fn`` receives a list
    of row namedtuples; the default stacks numeric fields and keeps variable-shape fields as lists
    of tensors (``make_collate(variable="pad")`` pads them; :func:`decimal_friendly_collate` is
    Petastorm's default).

    With a row reader and a :func:`make_collate` collate (the default), rows are taken from the
    reader as columns (:meth:`~unihub.readers.reader.Reader.next_columns`): the same batches
    without a Python object per row, and a shuffling queue that lets out batches of random rows
    once it holds ``shuffling_queue_capacity`` (``BatchedDataLoader``'s).
    """

    def __init__(self, reader: Any, batch_size: int = 1, collate_fn: Callable[[list[Any]], Any] = default_collate_like,
                 shuffling_queue_capacity: int = 0, seed: int | None = None) -> None:
        super().__init__(reader, batch_size, shuffling_queue_capacity, seed)
        if isinstance(collate_fn, Collate):
            collate_fn = self._collate = collate_fn.with_schema(reader.schema)
        self.collate_fn = collate_fn

    def _out(self, columns: Columns) -> Any:
        return finalize(columns, self._collate.variable, ragged=self._collate.ragged)

    def _rows(self) -> Iterator[tuple[int, Any]]:
        """(position, row) for every row read and not dropped by a loaded state; a batch reader's
        batches cut into rows, with a resume mark at each of its batches."""
        reader, tracker, bs = self.reader, self._tracker, self.batch_size
        batched = getattr(reader, "is_batched_reader", False)
        while True:
            if batched or tracker.consumed - tracker.marks[-1][0] >= bs:
                tracker.mark(reader_state_of(reader))
            try:
                item = next(reader)
            except StopIteration:
                tracker.mark(reader_state_of(reader))
                return
            for row in (_rows_of(item) if batched else (item,)):
                position, keep = tracker.advance_one()
                if keep:
                    yield position, row

    def _batches(self) -> Iterator[Any]:
        batched = getattr(self.reader, "is_batched_reader", False)
        if isinstance(self.collate_fn, Collate) and (self._row_columns or batched):
            # a column-wise collate over columns: a row reader's rows gathered as columns, or a batch
            # reader's batches as they are, so a list column the reader gave as an (n, k) array stays a
            # (batch, k) tensor, as Petastorm's DataLoader stacks it (cut into rows, the Collate would
            # keep them apart as a field with None dims)
            return self._columnar_batches()
        return self._row_batches()

    def _row_batches(self) -> Iterator[Any]:
        bs, capacity = self.batch_size, self.shuffling_queue_capacity
        rows: list[Any] = []
        positions: list[int] = []
        buffer: list[tuple[int, Any]] = []
        self._pending = lambda: np.asarray(positions + [p for p, _ in buffer], dtype=np.int64)

        def emit() -> Any:
            batch = self.collate_fn(rows[:])
            rows.clear()
            positions.clear()
            return batch

        draws: list[float] = []  # uniform numbers drawn a thousand at a time: one numpy call each

        def take_random() -> None:
            if not draws:
                draws.extend(self._rng.random(1024).tolist())
            i = int(draws.pop() * len(buffer))
            buffer[i], buffer[-1] = buffer[-1], buffer[i]
            position, row = buffer.pop()
            rows.append(row)
            positions.append(position)

        for position, row in self._rows():
            if capacity == 0:
                rows.append(row)
                positions.append(position)
            else:
                buffer.append((position, row))
                while len(buffer) >= capacity and len(rows) < bs:
                    take_random()
            if len(rows) == bs:
                yield emit()
        while buffer:
            take_random()
            if len(rows) == bs:
                yield emit()
        if rows:
            yield emit()
        self._pending = np.empty(0, dtype=np.int64)


class BatchedDataLoader(LoaderBase):
    """Columnar loader: each reader batch becomes tensors once and is re-sliced into ``batch_size`` batches.

    Takes ``make_batch_reader`` (or ``make_reader``, whose rows are gathered into chunks).
    ``shuffling_queue_capacity > 0`` keeps a tensor buffer of at least that many rows and
    draws batches from it by a seeded random permutation. ``transform_fn`` maps each batch
    dict; ``device`` moves the tensors there.
    """

    def __init__(self, reader: Any, batch_size: int = 1, transform_fn: Callable[[dict[str, Any]], Any] | None = None,
                 shuffling_queue_capacity: int = 0, seed: int | None = None, device: Any = None, *,
                 variable: Variable = "list") -> None:
        super().__init__(reader, batch_size, shuffling_queue_capacity, seed)
        check_variable(variable)
        self.transform_fn = transform_fn
        self.device = device
        self.variable = variable
        self._collate = Collate(variable).with_schema(reader.schema)

    def _out(self, columns: Columns) -> Any:
        batch = finalize(columns, self.variable, self.device, self._collate.ragged)
        return self.transform_fn(batch) if self.transform_fn is not None else batch

    def _batches(self) -> Iterator[Any]:
        return self._columnar_batches()


class InMemBatchedDataLoader(LoaderBase):
    """Loads up to ``rows_capacity`` rows into memory when made and stops the reader (as Petastorm's),
    then serves ``num_epochs`` epochs of batches, one pass at a time.

    Petastorm's arguments in Petastorm's order. ``shuffle=True`` permutes the rows every epoch
    (seeded by ``seed``); ``transform_fn`` maps each batch dict; ``num_epochs=None`` serves
    forever. ``rows_capacity=None`` loads every row (Petastorm's default, 1,024, silently
    truncated larger datasets); the reader must then be finite. ``state_dict()`` after any batch
    resumes the pass exactly, also in a loader made anew over a fresh reader (see :meth:`state_dict`).
    """

    def __init__(self, reader: Any, batch_size: int = 1, transform_fn: Callable[[dict[str, Any]], Any] | None = None,
                 num_epochs: int | None = 1, seed: int | None = None, rows_capacity: int | None = None,
                 shuffle: bool = False, *, variable: Variable = "list", device: Any = None) -> None:
        super().__init__(reader, batch_size, 0, seed)
        if num_epochs is not None and num_epochs < 1:
            raise InvalidArgumentError(f"num_epochs must be >= 1 or None, got {num_epochs}")
        if rows_capacity is None and getattr(reader, "num_epochs", 1) is None:
            raise InvalidArgumentError("the reader never ends (num_epochs=None): pass rows_capacity to bound what is loaded")
        self.num_epochs, self.rows_capacity, self.shuffle = num_epochs, rows_capacity, shuffle
        self._loader = BatchedDataLoader(reader, batch_size=batch_size, variable=variable)
        self._loader._max_rows = rows_capacity
        self.variable, self.device, self.transform_fn = variable, device, transform_fn
        self._data: Columns | None = None
        self._loaded_from = reader.state_dict()  # the rows held are the reader's from here: part of the state
        self._load()  # here, as Petastorm's: the reader is read, then stopped, before the first pass
        # where the pass stands: its shuffling seed, and (epoch, rows of that epoch delivered); a loaded state
        # sets where the next pass starts
        self._pass_seed = self._draw_seed()
        self._served = (0, 0)
        self._resume_at: tuple[int, int] | None = None

    def _load(self) -> Columns:
        if self._data is None:
            parts = [columns for _, columns in self._loader._chunks()]
            self._data = concat_columns(parts) if parts else {}
            stop, join = getattr(self.reader, "stop", None), getattr(self.reader, "join", None)
            if stop is not None:  # every row needed is in memory: the workers go (Petastorm: reader.stopped)
                stop()
                if join is not None:
                    join()
        return self._data

    def __iter__(self) -> Iterator[Any]:
        return self._batches()

    def _batches(self) -> Iterator[Any]:
        # one pass at a time, as Petastorm's (its RuntimeError's words); a finished or closed pass may be
        # followed by another, which serves the rows again
        if self._iterating:
            raise UsageError("InMemBatchedDataLoader couldn't be used multiple times, please specify total number "
                             "of epochs using num_epochs in constructor: another iteration of this loader is under "
                             "way; finish or close it (or use one iterator) before starting another")
        self._iterating = True
        try:
            data = self._load()
            n = columns_length(data)
            if self._resume_at is None:
                self._pass_seed, first_epoch, first_row = self._draw_seed(), 0, 0
            else:
                (first_epoch, first_row), self._resume_at = self._resume_at, None
            rng = np.random.default_rng(self._pass_seed)
            self._served = (first_epoch, first_row)
            for epoch in itertools.count() if self.num_epochs is None else range(self.num_epochs):
                order = rng.permutation(n) if self.shuffle else None  # drawn for skipped epochs too: the same order
                if epoch < first_epoch:
                    continue
                for start in range(first_row if epoch == first_epoch else 0, n, self.batch_size):
                    stop = min(start + self.batch_size, n)
                    columns = take_columns(data, order[start:stop]) if order is not None \
                        else slice_columns(data, start, stop)
                    batch = finalize(columns, self.variable, self.device, self._loader._collate.ragged)
                    self._served = (epoch, stop) if stop < n else (epoch + 1, 0)
                    yield self.transform_fn(batch) if self.transform_fn is not None else batch
        finally:
            self._iterating = False

    def __len__(self) -> int:
        if self.num_epochs is None:
            raise TypeError("len() is unknown for num_epochs=None")
        return math.ceil(columns_length(self._load()) / self.batch_size) * self.num_epochs

    def _draw_seed(self) -> int:
        """The seed of a pass's shuffling: ``seed``, or a fresh one per pass (kept in the state)."""
        return int(self.seed) if self.seed is not None else int(np.random.SeedSequence().generate_state(1)[0])

    def state_dict(self) -> dict[str, Any]:
        """Where to resume: after the last batch delivered (JSON-able). It holds the reader's position when
        the rows were loaded, the pass's shuffling seed, and the epoch and rows of it delivered, so a
        loader made anew (another reader seed, another ``batch_size``) serves exactly the rest."""
        epoch, row = self._resume_at if self._resume_at is not None else self._served
        # copies: torch.distributed.checkpoint's load writes the saved values into the dicts it is given
        return {"version": LOADER_STATE_VERSION, "kind": IN_MEMORY_STATE, "loaded_from": dict(self._loaded_from),
                "rows_capacity": self.rows_capacity, "shuffle_seed": self._pass_seed, "epoch": epoch, "row": row}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next pass serves exactly the batches not delivered before it; the
        rows are loaded again from the reader where they were loaded from, if this loader's differ."""
        if self._iterating:
            raise UsageError("load_state_dict() while the loader is being iterated; call it before iterating")
        if not isinstance(state, dict) or state.get("kind") != IN_MEMORY_STATE:
            raise LoaderStateError("not an InMemBatchedDataLoader state: pass what its state_dict() returned")
        missing = sorted({"version", "loaded_from", "rows_capacity", "shuffle_seed", "epoch", "row"} - set(state))
        if missing or state["version"] != LOADER_STATE_VERSION:
            raise LoaderStateError(f"the in-memory loader state lacks {missing} or has version "
                                   f"{state.get('version')!r}; pass what state_dict() returned")
        if state["rows_capacity"] != self.rows_capacity:
            raise LoaderStateError(f"the state was saved with rows_capacity={state['rows_capacity']}, this loader "
                                   f"has {self.rows_capacity}: the rows held would differ")
        if state["loaded_from"] != self._loaded_from:  # other rows (another seed or position): load those
            self._loader.load_state_dict({"version": LOADER_STATE_VERSION, "reader": state["loaded_from"],
                                          "skip": 0, "exclude": []})
            self._loaded_from, self._data = state["loaded_from"], None
            self._load()
        self._pass_seed = int(state["shuffle_seed"])
        self._resume_at = (int(state["epoch"]), int(state["row"]))
