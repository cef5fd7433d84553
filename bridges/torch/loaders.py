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
import json
import math
from collections.abc import Callable, Iterator, Sequence
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
from unihub.bridges.torch.state import (
    IN_MEMORY_STATE,
    LOADER_STATE_VERSION,
    LoaderStateError,
    PerRank,
    check_every_shard,
    reader_state_of,
)
from unihub.bridges.torch.tensors import Columns
from unihub.errors import InvalidArgumentError, UsageError
from unihub.readers.batching import columns_length, concat_columns, numpy_view, slice_columns, take_columns
from unihub.schema.metadata_json import parse_json

#: the loaders' public names (the package ``unihub.bridges.torch`` re-exports them with the torch datasets)
__all__ = ["BatchedDataLoader", "DataLoader", "InMemBatchedDataLoader", "LoaderStateError", "PerRank",
           "decimal_friendly_collate", "make_collate"]


def _rows_of(batch: Any) -> Iterator[Any]:
    """A batch namedtuple of columns as row namedtuples of the same type."""
    return (batch._make(values) for values in zip(*batch))


def _row_dict(row: Any) -> Any:
    """A row as the dict of field name -> value Petastorm's DataLoader hands a ``collate_fn`` (a row that is
    no namedtuple, e.g. a mock reader's dict, as it is)."""
    return row._asdict() if hasattr(row, "_asdict") else row


class DataLoader(LoaderBase):
    """Petastorm's row loader: rows collated into batches of ``batch_size``.

    The reader is a row reader (``make_reader``) or, as Petastorm allows, a batch reader
    (``make_batch_reader``): with a :func:`make_collate` collate its batches are re-cut as tensors
    (as ``BatchedDataLoader`` does; a list column the reader gives as an ``(n, k)`` array comes
    as a ``(batch_size, k)`` tensor, as in Petastorm), with another ``collate_fn`` they are cut into
    rows for it. ``shuffling_queue_capacity > 0`` passes rows through a buffer of that many rows
    and, once it is full, lets out random ones (seeded by ``seed``). ``collate_fn`` receives a list
    of rows as dicts of field name -> value, as Petastorm's did; the default stacks numeric fields and keeps variable-shape fields as lists
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
        as_dicts = not isinstance(self.collate_fn, Collate)  # a function of one's own gets Petastorm's dicts

        def emit() -> Any:
            batch = self.collate_fn([_row_dict(row) for row in rows] if as_dicts else rows[:])
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
    draws batches from it by a seeded random permutation. ``transform_fn`` (Petastorm's) takes each
    column of a batch as a numpy array in place of ``torch.as_tensor`` and returns what the batch holds;
    ``batch_transform_fn`` maps each batch dict; ``device`` moves the tensors there.
    """

    def __init__(self, reader: Any, batch_size: int = 1, transform_fn: Callable[[Any], Any] | None = None,
                 shuffling_queue_capacity: int = 0, seed: int | None = None, device: Any = None, *,
                 variable: Variable = "list", batch_transform_fn: Callable[[dict[str, Any]], Any] | None = None
                 ) -> None:
        super().__init__(reader, batch_size, shuffling_queue_capacity, seed)
        check_variable(variable)
        self.transform_fn, self.batch_transform_fn = transform_fn, batch_transform_fn
        self.device = device
        self.variable = variable
        self._collate = Collate(variable).with_schema(reader.schema)

    def _out(self, columns: Columns) -> Any:
        return _transformed(columns, self.variable, self.device, self._collate.ragged, self.transform_fn,
                            self.batch_transform_fn)

    def _batches(self) -> Iterator[Any]:
        return self._columnar_batches()


class InMemBatchedDataLoader(LoaderBase):
    """Loads up to ``rows_capacity`` rows into memory when made and stops the reader (as Petastorm's),
    then serves ``num_epochs`` epochs of batches, one pass at a time.

    Petastorm's arguments in Petastorm's order. ``shuffle=True`` permutes the rows every epoch
    (seeded by ``seed``); ``transform_fn`` and ``batch_transform_fn`` as :class:`BatchedDataLoader`'s; ``num_epochs=None`` serves
    forever. ``rows_capacity=None`` loads every row (Petastorm's default, 1,024, silently
    truncated larger datasets); the reader must then be finite. ``state_dict()`` after any batch
    resumes the pass exactly, also in a loader made anew over a fresh reader (see :meth:`state_dict`).

    **Elastic resume.** Each rank holds its shard's rows and serves its own epochs of them. Given every
    old rank's state (``load_state_dict([state_0, ..., state_n])``), a loader whose reader has another
    ``cur_shard`` / ``shard_count`` serves the epoch the old ranks were in from its equal share of the rows
    none of them delivered in it (read from the reader as the streaming loaders' resume reads them, and
    held beside its own rows), then later epochs of its own shard's rows, as a fresh run with the new
    world size. It needs every row of one pass of the reader in memory (``rows_capacity=None``, a reader
    of ``num_epochs=1``), and the old ranks in one epoch (or just through it).
    """

    def __init__(self, reader: Any, batch_size: int = 1, transform_fn: Callable[[Any], Any] | None = None,
                 num_epochs: int | None = 1, seed: int | None = None, rows_capacity: int | None = None,
                 shuffle: bool = False, *, variable: Variable = "list", device: Any = None,
                 batch_transform_fn: Callable[[dict[str, Any]], Any] | None = None) -> None:
        super().__init__(reader, batch_size, 0, seed)
        if num_epochs is not None and num_epochs < 1:
            raise InvalidArgumentError(f"num_epochs must be >= 1 or None, got {num_epochs}")
        if rows_capacity is not None and (isinstance(rows_capacity, bool) or not isinstance(rows_capacity, int)
                                          or rows_capacity < 1):  # 0 or -1 silently held no rows
            raise InvalidArgumentError(f"rows_capacity must be a positive integer or None (every row), got {rows_capacity!r}")
        if rows_capacity is None and getattr(reader, "num_epochs", 1) is None:
            raise InvalidArgumentError("the reader never ends (num_epochs=None): pass rows_capacity to bound what is loaded")
        self.num_epochs, self.rows_capacity, self.shuffle = num_epochs, rows_capacity, shuffle
        self._loader = BatchedDataLoader(reader, batch_size=batch_size, variable=variable)
        self._loader._max_rows = rows_capacity
        self.variable, self.device, self.transform_fn = variable, device, transform_fn
        self.batch_transform_fn = batch_transform_fn
        self._data: Columns | None = None
        self._loaded_from = reader.state_dict()  # the rows held are the reader's from here: part of the state
        self._load()  # here, as Petastorm's: the reader is read, then stopped, before the first pass
        # where the pass stands: its shuffling seed, and (epoch, rows of that epoch delivered); a loaded state
        # sets where the next pass starts
        self._passes = 0  # passes begun: a seeded loader's next pass shuffles anew, as a seeded generator would
        self._pass_seed = self._draw_seed()
        self._served = (0, 0)
        self._resume_at: tuple[int, int] | None = None
        #: after an elastic resume: the epoch served from this rank's share of what the old ranks left, the
        #: reader state that share was read from, and its rows
        self._rest: tuple[int, dict[str, Any], Columns] | None = None

    def _load(self) -> Columns:
        if self._data is None:
            self._data = self._read_all()
        return self._data

    def _read_all(self) -> Columns:
        """Every row the reader delivers from where it is (up to ``rows_capacity``); then the reader stops."""
        parts = [columns for _, columns in self._loader._chunks()]
        stop, join = getattr(self.reader, "stop", None), getattr(self.reader, "join", None)
        if stop is not None:  # every row needed is in memory: the workers go (Petastorm: reader.stopped)
            stop()
            if join is not None:
                join()
        return concat_columns(parts) if parts else {}

    def _read_from(self, state: dict[str, Any] | list[dict[str, Any]]) -> tuple[dict[str, Any], Columns]:
        """The reader's state once ``state`` is loaded (a list: every old rank's, elastic), and the rows it
        delivers from there."""
        self._loader.load_state_dict(state)
        start = reader_state_of(self.reader)
        if start is None:
            raise LoaderStateError("this loader's reader keeps no state (it has no state_dict()), so the loader "
                                   "cannot say where its rows were read from")
        return start, self._read_all()

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
                self._passes += 1
                self._rest = None  # a new pass: this rank's own rows every epoch
            else:
                (first_epoch, first_row), self._resume_at = self._resume_at, None
            rng = np.random.default_rng(self._pass_seed)
            self._served = (first_epoch, first_row)
            for epoch in itertools.count() if self.num_epochs is None else range(self.num_epochs):
                order = rng.permutation(n) if self.shuffle else None  # drawn for skipped epochs too: the same order
                if epoch < first_epoch:
                    continue
                epoch_data, order = self._of_epoch(epoch, data, order)
                yield from self._epoch(epoch, epoch_data, order, first_row if epoch == first_epoch else 0)
        finally:
            self._iterating = False

    def _of_epoch(self, epoch: int, data: Columns, order: np.ndarray | None) -> tuple[Columns, np.ndarray | None]:
        """The rows ``epoch`` serves and their order: this rank's, or its share of the rest (elastic)."""
        if self._rest is None or self._rest[0] != epoch:
            return data, order
        rest = self._rest[2]
        return rest, _rest_order(self._pass_seed, epoch, columns_length(rest)) if self.shuffle else None

    def _epoch(self, epoch: int, data: Columns, order: np.ndarray | None, first_row: int) -> Iterator[Any]:
        n = columns_length(data)
        for start in range(first_row, n, self.batch_size):
            stop = min(start + self.batch_size, n)
            columns = take_columns(data, order[start:stop]) if order is not None else slice_columns(data, start, stop)
            batch = _transformed(columns, self.variable, self.device, self._loader._collate.ragged, self.transform_fn,
                                 self.batch_transform_fn)
            self._served = (epoch, stop) if stop < n else (epoch + 1, 0)
            yield batch
        if n == 0:
            self._served = (epoch + 1, 0)

    def __len__(self) -> int:
        if self.num_epochs is None:
            raise TypeError("len() is unknown for num_epochs=None")
        return math.ceil(columns_length(self._load()) / self.batch_size) * self.num_epochs

    def _draw_seed(self) -> int:
        """The seed of a pass's shuffling (kept in the state): ``seed`` for the first pass and one drawn from
        ``seed`` and the pass's number for each later one (a ``for epoch`` loop over a seeded loader served one
        order every epoch), or a fresh one per pass without a seed."""
        if self.seed is None:
            return int(np.random.SeedSequence().generate_state(1)[0])
        if not self._passes:
            return int(self.seed)
        return int(np.random.SeedSequence([int(self.seed), self._passes]).generate_state(1)[0])

    def state_dict(self) -> dict[str, Any]:
        """Where to resume: after the last batch delivered (JSON-able). It holds the reader's position when
        the rows were loaded, the pass's shuffling seed, and the epoch and rows of it delivered, so a
        loader made anew (another reader seed, another ``batch_size``) serves exactly the rest; and, for an
        elastic resume, the rows held and whether they were shuffled (``rest``: after one, the epoch served
        from a share of what older ranks left, and the reader state it was read from)."""
        epoch, row = self._resume_at if self._resume_at is not None else self._served
        # copies: torch.distributed.checkpoint's load writes the saved values into the dicts it is given
        state = {"version": LOADER_STATE_VERSION, "kind": IN_MEMORY_STATE, "loaded_from": dict(self._loaded_from),
                 "rows_capacity": self.rows_capacity, "shuffle_seed": self._pass_seed, "epoch": epoch, "row": row,
                 "rows": columns_length(self._load()), "shuffle": self.shuffle, "rest": "", "passes": self._passes}
        if self._rest is not None:  # a string: the state's keys stay the same (DCP's template is a fresh loader's)
            rest_epoch, rest_from, rest = self._rest
            state["rest"] = json.dumps({"epoch": rest_epoch, "from": rest_from, "rows": columns_length(rest)})
        return state

    def load_state_dict(self, state: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        """Continue from ``state``: the next pass serves exactly the batches not delivered before it; the
        rows are loaded again from the reader where they were loaded from, if this loader's differ. A list
        is every old rank's state, resumed on this reader's shard count (elastic: see the class)."""
        if self._iterating:
            raise UsageError("load_state_dict() while the loader is being iterated; call it before iterating")
        if isinstance(state, (list, tuple)):
            self._load_states([self._checked(s) for s in state])
            return
        state = self._checked(state)
        if state["loaded_from"] != self._loaded_from:  # other rows (another seed or position): load those
            self._data = self._read_from(_loader_state(state["loaded_from"]))[1]
            self._loaded_from = state["loaded_from"]
        rest = _rest_of(state)
        self._rest = None if rest is None else (rest["epoch"], *self._read_from(_loader_state(rest["from"])))
        self._pass_seed = int(state["shuffle_seed"])
        self._passes = int(state.get("passes", 1))  # (states saved before passes were counted: after the first)
        self._resume_at = (int(state["epoch"]), int(state["row"]))

    def _checked(self, state: Any) -> dict[str, Any]:
        if not isinstance(state, dict) or state.get("kind") != IN_MEMORY_STATE:
            raise LoaderStateError("not an InMemBatchedDataLoader state: pass what its state_dict() returned")
        missing = sorted({"version", "loaded_from", "rows_capacity", "shuffle_seed", "epoch", "row"} - set(state))
        if missing or state["version"] != LOADER_STATE_VERSION:
            raise LoaderStateError(f"the in-memory loader state lacks {missing} or has version "
                                   f"{state.get('version')!r}; pass what state_dict() returned")
        if state["rows_capacity"] != self.rows_capacity:
            raise LoaderStateError(f"the state was saved with rows_capacity={state['rows_capacity']}, this loader "
                                   f"has {self.rows_capacity}: the rows held would differ")
        return state

    def _load_states(self, states: list[dict[str, Any]]) -> None:
        """Elastic resume from every old rank's state: the epoch they were in from this rank's share of what
        none of them delivered of it, later epochs from this rank's own rows (a fresh run's)."""
        if self.rows_capacity is not None or getattr(self.reader, "num_epochs", 1) != 1:
            raise LoaderStateError("an elastic resume of InMemBatchedDataLoader needs every rank to have held one "
                                   "whole pass of its reader (rows_capacity=None, a reader of num_epochs=1): "
                                   "otherwise which rows an old rank held is not known to the new ones")
        if not states:
            raise LoaderStateError("an empty list of loader states: pass every rank's state_dict() of the run")
        epoch = min(int(s["epoch"]) for s in states)
        delivered = [_delivered_in(s, epoch) for s in states]
        check_every_shard([source for source, _ in delivered])
        self._pass_seed = int(states[0]["shuffle_seed"])  # later epochs: a fresh run's with the first rank's seed
        self._rest = None
        if any(len(rows) for _, rows in delivered) and (self.num_epochs is None or epoch < self.num_epochs):
            self._rest = (epoch, *self._read_from([dict(_loader_state(source), exclude=rows)
                                                   for source, rows in delivered]))
        self._resume_at = (epoch, 0)


def _loader_state(reader_state: dict[str, Any]) -> dict[str, Any]:
    """A streaming loader's state at ``reader_state``, nothing after it delivered."""
    return {"version": LOADER_STATE_VERSION, "reader": reader_state, "skip": 0, "exclude": []}


def _rest_of(state: dict[str, Any]) -> dict[str, Any] | None:
    """An in-memory loader state's ``rest`` (see :meth:`InMemBatchedDataLoader.state_dict`), or None."""
    rest = state.get("rest")
    if not rest:
        return None
    try:
        parsed: dict[str, Any] = parse_json(rest)
        return {"epoch": int(parsed["epoch"]), "from": dict(parsed["from"]), "rows": int(parsed["rows"])}
    except (TypeError, ValueError, KeyError):
        raise LoaderStateError("the in-memory loader state's 'rest' is not what state_dict() wrote") from None


def _rest_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order of the rows of an epoch served from a share of what older ranks left (shuffled)."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def _delivered_in(state: dict[str, Any], epoch: int) -> tuple[dict[str, Any], list[int]]:
    """The reader state the rows an old rank served in ``epoch`` were read from, and the offsets after it of
    those it delivered (sorted); :class:`LoaderStateError` where the state cannot say."""
    missing = sorted({"rows", "shuffle"} - set(state))
    if missing:
        raise LoaderStateError(f"the in-memory loader state lacks {missing}: states saved before elastic resume "
                               "resume only one by one, on the world size that saved them")
    at, row = int(state["epoch"]), int(state["row"])
    if at > epoch + 1 or (at == epoch + 1 and row):
        raise LoaderStateError(f"the old ranks' states are in epochs {epoch} and {at} of the in-memory loader: an "
                               "elastic resume needs them in one epoch (or just through it)")
    rest = _rest_of(state)
    if rest is not None and rest["epoch"] == epoch:
        source, n = rest["from"], rest["rows"]
        order = _rest_order(int(state["shuffle_seed"]), epoch, n) if state["shuffle"] else None
    else:
        source, n = state["loaded_from"], int(state["rows"])
        rng = np.random.default_rng(int(state["shuffle_seed"]))
        order = [rng.permutation(n) for _ in range(epoch + 1)][-1] if state["shuffle"] else None
    done = row if at == epoch else n
    delivered = order[:done] if order is not None else np.arange(done)
    return source, sorted(int(i) for i in delivered)


def _transformed(columns: Columns, variable: Variable, device: Any, ragged: frozenset[str],
                 transform_fn: Callable[[Any], Any] | None,
                 batch_transform_fn: Callable[[dict[str, Any]], Any] | None) -> Any:
    """The batch a columnar loader yields: each column through ``transform_fn`` where given (Petastorm's: it gets the
    column as the numpy array a reader batch holds, in place of ``torch.as_tensor``), padded and moved to ``device``
    (:func:`finalize`), then the batch dict through ``batch_transform_fn``."""
    if transform_fn is not None:
        columns = {name: transform_fn(_as_numpy(column)) for name, column in columns.items()}
    batch = finalize(columns, variable, device, ragged)
    return batch_transform_fn(batch) if batch_transform_fn is not None else batch


def _as_numpy(column: Any) -> Any:
    """A column as numpy: a CPU tensor's view, a list's values as one array (an object array where they do not
    stack: variable shapes)."""
    column = numpy_view(column)
    if not isinstance(column, list):
        return column
    try:
        return np.asarray(column)
    except ValueError:
        out = np.empty(len(column), dtype=object)
        out[:] = [numpy_view(v) for v in column]
        return out
