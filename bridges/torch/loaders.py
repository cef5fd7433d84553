"""PyTorch bridge: Petastorm's loaders (``DataLoader``, ``BatchedDataLoader``,
``InMemBatchedDataLoader``) and torch-native datasets (``TorchIterableDataset``,
``TorchMapDataset``).

Batches are dicts of field name -> tensor. Numeric columns become tensors (one
conversion per reader batch in the batched loaders); strings, decimals, bytes and nullable
cells pass through as lists. Fields with ``None`` dims are lists of tensors, or with
``variable="pad"`` a zero-padded tensor plus a boolean ``<field>_mask`` of the same shape.

Resume: ``loader.state_dict()`` after any batch, then ``load_state_dict(state)`` on a
loader over a new reader with the same options, and exactly the rows not yet delivered
come next. The state is the reader's position at (or before) the oldest row the loader
holds undelivered, plus the stream offsets of rows after it that were already delivered.
Without a shuffling queue the remaining rows come in the original order. With one, rows
that sat in the queue are re-read from the reader and shuffled again, so the order
differs from an uninterrupted run, but each remaining row still comes exactly once.

The loaders and readers are torch's ``Stateful`` (``torch.distributed.checkpoint.stateful``):
``torch.distributed.checkpoint`` saves them beside the model and optimizer and ``dcp.load`` resumes
them, their states being dicts of fixed keys whose values are ints, strings and lists of ints:

    dcp.save({"model": model.state_dict(), "loader": loader}, checkpoint_id=path)
    dcp.load({"model": model.state_dict(), "loader": loader}, checkpoint_id=path)  # a loader made anew

With several ranks, wrap it as ``PerRank(loader)``: DCP keeps one copy of a non-tensor value that
all ranks hold under the same key, so each rank's position needs its own.

    with make_batch_reader(url, num_epochs=1) as reader:
        for batch in BatchedDataLoader(reader, batch_size=256, shuffling_queue_capacity=4096, seed=0):
            train_step(batch["image"], batch["label"])

torch is imported when a loader or dataset is used, never when this module is imported.
"""

from __future__ import annotations

import ctypes
import decimal
import itertools
import math
import operator
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from unihub.bridges.torch.shared_batches import StoragePool, in_torch_worker, receive_here, worker_pool
from unihub.dependencies import require
from unihub.errors import InvalidArgumentError, SchemaError, UnihubError, UsageError
from unihub.readers.batching import (
    ARRIVAL_ROWS,
    Rebatcher,
    ShuffleBuffer,
    columns_length,
    concat_columns,
    numpy_view,
    slice_columns,
    take_columns,
)
from unihub.readers.late_decode import DecodeAhead, decoded_later
from unihub.readers.random_access import Dataset
from unihub.readers.reader import Reader, make_batch_reader, make_reader, random_seed, start_over
from unihub.readers.workers import usable_cores
from unihub.schema.codecs import CompressedImageCodec, image_pixels_allowed

if TYPE_CHECKING:
    from unihub.readers.late_decode import LateImages

Variable = Literal["list", "pad"]
Columns = dict[str, Any]  # field name -> torch.Tensor (numeric) or list (anything else)
LOADER_STATE_VERSION = 1
IN_MEMORY_STATE = "in_memory"  # the "kind" of an InMemBatchedDataLoader's state
_NUMERIC = "biufc"
_CHUNK_ROWS = 256  # rows a batched loader gathers from a row reader before converting them
_POSITIONS = " stream positions"  # the column the loaders carry each row's stream position in (no field's name)


class LoaderStateError(UnihubError, ValueError):
    """A loader state that is malformed or was saved by another kind of loader."""


def _torch() -> Any:
    return require("torch", extra="torch", purpose="the PyTorch loaders")


def _check_variable(variable: str) -> None:
    if variable not in ("list", "pad"):
        raise InvalidArgumentError(f"variable must be 'list' or 'pad', got {variable!r}")


# -- columns -> tensors ----------------------------------------------------------------------------
def _tensor(array: np.ndarray) -> Any:
    """A tensor sharing memory with ``array``; read-only or strided arrays (Arrow buffers) are copied."""
    if not array.flags.writeable or not array.flags.c_contiguous:
        array = np.array(array, order="C")
    return _torch().from_numpy(array)


def _torch_dtype(dtype: Any) -> Any:
    """The torch dtype of a numeric numpy ``dtype``; None for one torch does not have (or not numeric)."""
    if np.dtype(dtype).kind not in _NUMERIC:
        return None
    try:
        return _torch().from_numpy(np.empty(0, dtype)).dtype
    except TypeError:
        return None


def _cell(value: Any) -> Any:
    """One cell of a non-numeric column: a numeric ndarray becomes a tensor, anything else stays."""
    if isinstance(value, np.ndarray) and value.dtype.kind in _NUMERIC:
        return _tensor(value)
    return value


def _column(values: Sequence[Any], ragged: bool) -> Any:
    """Row values of one field as a tensor when they stack (same shape, numeric), else a list."""
    torch = _torch()
    if not values:
        return []
    first = values[0]
    if not ragged:
        if isinstance(first, torch.Tensor):
            if all(isinstance(v, torch.Tensor) and v.shape == first.shape for v in values):
                return torch.stack(list(values))
        elif isinstance(first, (np.ndarray, np.generic)) and first.dtype.kind in _NUMERIC:
            shape, kind = np.shape(first), first.dtype.kind
            if all(isinstance(v, (np.ndarray, np.generic)) and v.shape == shape and v.dtype.kind == kind
                   for v in values):
                return torch.from_numpy(np.stack(values))
        elif isinstance(first, (bool, int, float)) and all(type(v) is type(first) for v in values):
            return torch.tensor(list(values))
    return [_cell(v) for v in values]


def columns_from_numpy(columns: Mapping[str, Any], cell: Callable[[Any], Any] = _cell) -> Columns:
    """Reader columns as tensors (numeric arrays, no per-row work) or lists (everything else, each
    value through ``cell``)."""
    out: Columns = {}
    for name, column in columns.items():
        if isinstance(column, np.ndarray) and column.dtype.kind in _NUMERIC:
            out[name] = _tensor(column)
        else:
            out[name] = [cell(v) for v in column]
    return out


def _split(columns: Columns, size: int) -> list[Columns]:
    """``columns`` cut into consecutive pieces of ``size`` rows: tensor views (one ``torch.split``
    per column, not a slice per piece), lists sliced."""
    torch = _torch()
    n = columns_length(columns)
    cut = {name: (torch.split(col, size) if isinstance(col, torch.Tensor) else
                  [col[i:i + size] for i in range(0, n, size)]) for name, col in columns.items()}
    return [dict(zip(cut, piece)) for piece in zip(*cut.values())]


def in_one_shared_storage(columns: Columns, pool: StoragePool | None = None) -> Columns:
    """Numeric CPU tensor columns as views of one shared-memory storage (copied in once; from
    ``pool`` where given: readers/shared_batches.py).

    A torch ``DataLoader`` worker hands each tensor of a batch to the main process as a
    shared-memory file descriptor, passed over a socket with a handshake per descriptor, after
    copying the tensor's storage into shared memory. Tensors that are views of one shared storage
    cost one descriptor per batch and no copy (1.35-1.5x the batches per second of three separate
    tensors on this machine). From ``pool``, a storage's descriptor crosses once, and later
    batches in it carry only their layout. Columns already in one shared storage come back as they are.
    """
    torch = _torch()
    tensors = {name: col for name, col in columns.items()
               if isinstance(col, torch.Tensor) and col.device.type == "cpu" and not col.requires_grad}
    if not tensors or (len(tensors) < 2 and pool is None):
        return columns  # torch shares a lone tensor in one descriptor anyway
    storages = {t.untyped_storage().data_ptr() for t in tensors.values()}
    if len(storages) == 1 and next(iter(tensors.values())).untyped_storage().is_shared():
        return columns
    shapes = {name: (tensor.dtype, tuple(tensor.shape)) for name, tensor in tensors.items()}
    offsets, total = _packed(shapes)
    storage = pool.storage(total) if pool is not None else torch.UntypedStorage._new_shared(max(total, 1))
    out = dict(columns)
    for name, view in _views(storage, shapes, offsets).items():
        _copy_into(view, tensors[name])
        out[name] = view
    return out


def _copy_into(target: Any, source: Any) -> None:
    """``source``'s values into ``target`` (same shape), not by torch's copy, whose threads would spin
    beside the decoders: one ``memmove`` where both are contiguous, else numpy's copy where
    ``target`` is shared memory (a numpy view would make new memory unresizable, unlike a stack)."""
    if target.is_contiguous() and source.is_contiguous() and target.dtype == source.dtype and \
            target.shape == source.shape:
        ctypes.memmove(target.data_ptr(), source.data_ptr(), source.nbytes)
        return
    into, values = numpy_view(target), numpy_view(source)
    if target.untyped_storage().is_shared() and isinstance(into, np.ndarray) and isinstance(values, np.ndarray):
        np.copyto(into, values)
    else:
        target.copy_(source)


def _packed(shapes: Mapping[str, tuple[Any, tuple[int, ...]]]) -> tuple[dict[str, int], int]:
    """Where each column of ``shapes`` (name: torch dtype, shape) starts in one storage, each
    64-byte aligned, and the storage's size in bytes."""
    offsets, total = {}, 0
    for name, (dtype, shape) in shapes.items():
        total = -(-total // 64) * 64
        offsets[name] = total
        total += math.prod(shape) * dtype.itemsize
    return offsets, total


def _views(storage: Any, shapes: Mapping[str, tuple[Any, tuple[int, ...]]], offsets: Mapping[str, int]) -> dict[str, Any]:
    torch = _torch()
    return {name: torch.empty(0, dtype=dtype).set_(storage, offsets[name] // dtype.itemsize, shape)
            for name, (dtype, shape) in shapes.items()}


def empty_in_pool(shapes: Mapping[str, tuple[Any, tuple[int, ...]]]) -> dict[str, Any]:
    """Uninitialised tensors (name: torch dtype, shape) in one storage of this worker's pool: a batch
    written there leaves the worker without a copy (:func:`from_worker` finds them in one storage)."""
    offsets, total = _packed(shapes)
    return _views(worker_pool().storage(total), shapes, offsets)


def from_worker(columns: Columns) -> Any:
    """A batch as a torch worker sends it: in one storage of the worker's pool, which crosses to the
    main process once (readers/shared_batches.py)."""
    pool = worker_pool()
    return pool.sending(in_one_shared_storage(columns, pool))


def pad(tensors: Sequence[Any]) -> tuple[Any, Any]:
    """Zero-pad same-rank tensors to the largest size in each dim: ``(padded, mask)``; mask is True on data."""
    torch = _torch()
    ranks = {t.dim() for t in tensors}
    if len(ranks) != 1:
        raise SchemaError(f"cannot pad tensors of different ranks {sorted(ranks)} into one batch")
    shape = tuple(max(t.shape[d] for t in tensors) for d in range(ranks.pop()))
    out = torch.zeros((len(tensors), *shape), dtype=tensors[0].dtype)
    mask = torch.zeros((len(tensors), *shape), dtype=torch.bool)
    for i, t in enumerate(tensors):
        region = (i, *(slice(0, s) for s in t.shape))
        out[region] = t
        mask[region] = True
    return out, mask


def finalize(columns: Columns, variable: Variable = "list", device: Any = None,
             ragged: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The batch a loader yields: padding (``variable="pad"``) and the move to ``device``.

    With ``variable="pad"``, a ``ragged`` field (``None`` dims) that came as one tensor (a batch
    reader's ``(n, k)`` array) gets an all-True mask, so every batch of it has its ``<field>_mask``."""
    torch = _torch()
    out: dict[str, Any] = {}
    for name, col in columns.items():
        if isinstance(col, torch.Tensor):
            out[name] = col.to(device) if device is not None else col
            if variable == "pad" and name in ragged:
                out[f"{name}_mask"] = torch.ones(col.shape, dtype=torch.bool, device=out[name].device)
            continue
        if variable == "pad" and col and all(isinstance(v, torch.Tensor) for v in col):
            padded, mask = pad(col)
            if device is not None:
                padded, mask = padded.to(device), mask.to(device)
            out[name], out[f"{name}_mask"] = padded, mask
        elif device is not None:
            out[name] = [v.to(device) if isinstance(v, torch.Tensor) else v for v in col]
        else:
            out[name] = col
    return out


class Collate:
    """Rows (dicts or namedtuples) -> a batch dict; see :func:`make_collate`."""

    def __init__(self, variable: Variable = "list", ragged: Iterable[str] = ()) -> None:
        _check_variable(variable)
        self.variable = variable
        self.ragged = frozenset(ragged)

    def with_schema(self, schema: Any) -> Collate:
        """The same collate, told which fields have ``None`` dims so they never stack by chance."""
        ragged = {f.name for f in schema if any(d is None for d in (f.shape or ()))}
        return Collate(self.variable, self.ragged | ragged)

    def columns(self, rows: Sequence[Any]) -> Columns:
        dicts = [r._asdict() if hasattr(r, "_asdict") else r for r in rows]
        if not dicts:
            return {}
        return {name: _column([d[name] for d in dicts], name in self.ragged) for name in dicts[0]}

    def from_columns(self, columns: Mapping[str, Sequence[Any]]) -> Columns:
        """What :meth:`columns` gives for the rows of these columns, without cutting them into
        rows: a numeric array is the tensor its rows would stack into (sharing its memory)."""
        out: Columns = {}
        for name, column in columns.items():
            ragged = name in self.ragged
            if not ragged and isinstance(column, np.ndarray) and column.dtype.kind in _NUMERIC and len(column):
                out[name] = _tensor(column)
            else:
                out[name] = _column(list(column), ragged)
        return out

    def __call__(self, rows: Sequence[Any]) -> dict[str, Any]:
        return finalize(self.columns(rows), self.variable, ragged=self.ragged)


def make_collate(*, variable: Variable = "list", pad: bool | None = None) -> Collate:
    """A collate function: numeric fields stacked into tensors, others as lists.

    Variable-shape fields are lists of tensors (``variable="list"``, the default) or padded
    with zeros to the batch maximum plus a ``<field>_mask`` bool tensor (``variable="pad"``
    or ``pad=True``). Also works as ``collate_fn`` of torch's own DataLoader.
    """
    if pad is not None:
        variable = "pad" if pad else "list"
    return Collate(variable)


default_collate_like = make_collate()


# -- positions, for exact resume -------------------------------------------------------------------
class _Tracker:
    """Stream positions of the rows a loader took from its reader, and reader states to resume them.

    Position ``p`` is the ``p``-th row read since the reader was at ``marks[0]``'s state.
    ``skip`` and ``drop`` come from a loaded state: rows before ``skip`` and at ``drop``
    positions were delivered before the state was saved and are discarded.
    """

    def __init__(self, reader_state: dict[str, Any] | None, pending: Callable[[], np.ndarray], skip: int = 0,
                 drop: Iterable[int] = ()) -> None:
        self.consumed = 0
        self.marks: deque[tuple[int, dict[str, Any] | None]] = deque([(0, reader_state)])
        self.prune_at = 64
        self.pending = pending
        self.skip = skip
        self.drop = set(drop)

    def mark(self, reader_state: dict[str, Any] | None) -> None:
        """The reader is at ``reader_state`` and its next row has position ``consumed``."""
        if self.marks[-1][0] == self.consumed:
            self.marks[-1] = (self.consumed, reader_state)
        else:
            self.marks.append((self.consumed, reader_state))
        if len(self.marks) > self.prune_at:
            base = self._base()
            while len(self.marks) > 1 and self.marks[1][0] <= base:
                self.marks.popleft()
            # marks still needed (a shuffling queue holds old rows) are not looked at again until they double
            self.prune_at = max(64, 2 * len(self.marks))

    def advance(self, n: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Positions of the next ``n`` rows read, and a keep mask (None: keep all)."""
        positions = np.arange(self.consumed, self.consumed + n, dtype=np.int64)
        self.consumed += n
        if self.consumed <= self.skip:
            return positions, np.zeros(n, dtype=bool)
        if positions[0] >= self.skip and not self.drop:
            return positions, None
        keep = positions >= self.skip
        if self.drop:
            keep &= ~np.isin(positions, np.fromiter(self.drop, np.int64, len(self.drop)))
            self.drop = {d for d in self.drop if d >= self.consumed}
        return positions, keep

    def advance_one(self) -> tuple[int, bool]:
        """:meth:`advance` of one row, without arrays: its position, and whether to keep it."""
        position = self.consumed
        self.consumed += 1
        if position < self.skip:
            return position, False
        if self.drop and position in self.drop:
            self.drop.discard(position)
            return position, False
        return position, True

    def _base(self) -> int:
        pending = self.pending()
        base = int(pending.min()) if pending.size else self.consumed
        return max(base, self.skip)

    def state(self) -> dict[str, Any]:
        pending = self.pending()
        base = self._base()
        gone = np.setdiff1d(np.arange(base, max(base, self.consumed), dtype=np.int64), pending)
        exclude = sorted({int(p) - base for p in gone} | {d - base for d in self.drop if d >= base})
        start, reader_state = next(m for m in reversed(self.marks) if m[0] <= base)
        if reader_state is None:
            raise LoaderStateError("this loader's reader keeps no state (it has no state_dict(), or mixes readers "
                                   "that have none), so the loader cannot say where to resume")
        # a copy: torch.distributed.checkpoint's load writes the saved values into the dict it is given
        return {"version": LOADER_STATE_VERSION, "reader": dict(reader_state), "skip": base - start, "exclude": exclude}


def _reader_state(reader: Any) -> dict[str, Any] | None:
    """``reader.state_dict()``, or None for a reader that keeps none (a mock; a mix of such readers, see
    ``WeightedSamplingReader.keeps_state``): a loader reads it all the same and refuses only its own state."""
    if not getattr(reader, "keeps_state", True) or not callable(getattr(reader, "state_dict", None)):
        return None
    state: dict[str, Any] = reader.state_dict()
    return state


def _parse_state(state: Any) -> tuple[dict[str, Any], int, list[int]]:
    if not isinstance(state, dict) or state.get("version") != LOADER_STATE_VERSION:
        found = state.get("version") if isinstance(state, dict) else type(state).__name__
        raise LoaderStateError(f"loader state version {found!r} is not {LOADER_STATE_VERSION}; "
                               "pass what the loader's state_dict() returned")
    missing = sorted({"reader", "skip", "exclude"} - set(state))
    if missing:
        raise LoaderStateError(f"the loader state lacks {missing}; pass what state_dict() returned")
    return state["reader"], int(state["skip"]), [int(e) for e in state["exclude"]]


# -- loaders ---------------------------------------------------------------------------------------
class _LoaderBase:
    """Iteration guard, Petastorm's reset on re-iteration, resume and context management."""

    def __init__(self, reader: Any, batch_size: int, shuffling_queue_capacity: int, seed: int | None) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidArgumentError(f"batch_size must be a positive integer, got {batch_size!r}")
        if shuffling_queue_capacity < 0:
            raise InvalidArgumentError(f"shuffling_queue_capacity must be >= 0, got {shuffling_queue_capacity}")
        _torch()
        self.reader = reader
        self.batch_size = batch_size
        self.shuffling_queue_capacity = shuffling_queue_capacity
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        # positions taken from the reader but not yet delivered: an array, or a function that
        # makes one (computed only when a state is asked for, so batches do no O(buffer) work)
        self._pending: np.ndarray | Callable[[], np.ndarray] = np.empty(0, dtype=np.int64)
        self._tracker = _Tracker(_reader_state(reader), self._pending_positions)
        self._iterated = False
        self._iterating = False
        self._resumed = False

    def _pending_positions(self) -> np.ndarray:
        pending = self._pending
        return pending() if callable(pending) else pending

    def __iter__(self) -> Iterator[Any]:
        # a generator from the first line: an iterator that is never started claims nothing
        if self._iterating:
            raise UsageError("You must finish a full pass of Petastorm DataLoader before making another pass from "
                             "the beginning: this loader is already being iterated; finish or close that "
                             "iteration first")
        if self._iterated and not self._resumed:  # Petastorm: iterating again starts the reader over
            start_over(self.reader)  # also after a pass broken off mid-epoch
            self._tracker = _Tracker(_reader_state(self.reader), self._pending_positions)
        self._iterated, self._resumed, self._iterating = True, False, True
        self._rng = np.random.default_rng(self.seed)
        try:
            yield from self._batches()
        finally:
            self._iterating = False

    def _batches(self) -> Iterator[Any]:
        raise NotImplementedError

    # -- the columnar path: reader batches (or gathered rows) as columns, cut into batches ----------
    _collate: Collate
    _max_rows: int | None = None  # TorchIterableDataset's exact share of a padded shard
    #: in a torch worker: each batch's tensors in one shared storage, from this pool
    _shared_batches: StoragePool | None = None

    def _shareable(self, columns: Columns) -> Columns:
        return in_one_shared_storage(columns, self._shared_batches) if self._shared_batches is not None else columns

    @property
    def _row_columns(self) -> bool:
        """Whether rows come from the reader as columns (:meth:`Reader.next_columns`), not one by one."""
        reader = self.reader
        return (hasattr(reader, "next_columns") and not getattr(reader, "is_batched_reader", False)
                and getattr(reader, "ngram", None) is None)

    def _out(self, columns: Columns) -> Any:
        raise NotImplementedError

    def _columnar_batches(self) -> Iterator[Any]:
        if self.shuffling_queue_capacity > 0:
            yield from self._shuffled()
        else:
            yield from self._in_order()

    def _convert(self, columns: Mapping[str, Any], keep: frozenset[str] = frozenset()) -> Columns:
        """A reader's numpy columns as the loader's (tensors where numeric; see :meth:`Collate.from_columns`),
        in the same order; the columns in ``keep`` stay as they are (images still encoded)."""
        convert = columns_from_numpy if getattr(self.reader, "is_batched_reader", False) else \
            self._collate.from_columns
        if not keep:
            return convert(columns)
        converted = convert({name: column for name, column in columns.items() if name not in keep})
        return {name: column if name in keep else converted[name] for name, column in columns.items()}

    def _chunks(self, encoded: frozenset[str] = frozenset()) -> Iterator[tuple[np.ndarray, Columns]]:
        """(positions, columns) per reader batch (or per chunk of rows of a row reader); the
        ``encoded`` columns (images decoded later) are left as the reader gives them."""
        reader, tracker = self.reader, self._tracker
        batched = getattr(reader, "is_batched_reader", False)
        left = self._max_rows
        while left is None or left > 0:
            tracker.mark(_reader_state(reader))
            if batched:
                try:
                    item = next(reader)
                except StopIteration:
                    break
                columns = self._convert(item._asdict(), encoded)
            elif self._row_columns:
                gathered = reader.next_columns(max(self.batch_size, _CHUNK_ROWS))
                if gathered is None:
                    break
                columns = self._convert(gathered, encoded)
            else:
                rows = list(itertools.islice(reader, max(self.batch_size, _CHUNK_ROWS)))
                if not rows:
                    break
                columns = self._collate.columns(rows)
            n = columns_length(columns)
            if left is not None and n > left:
                columns, n = slice_columns(columns, 0, left), left
            if left is not None:
                left -= n
            positions, keep = tracker.advance(n)
            if keep is not None:
                index = np.flatnonzero(keep)
                columns, positions = take_columns(columns, index), positions[index]
            if len(positions):
                yield positions, columns
        tracker.mark(_reader_state(reader))

    def _in_order(self) -> Iterator[Any]:
        """Batches in reader order: whole batches are views of a reader batch's tensors (one
        ``torch.split`` per column), only a batch across two reader batches is concatenated."""
        rebatcher = Rebatcher(self.batch_size, split=_split)

        def pending() -> np.ndarray:
            parts = rebatcher.pending(_POSITIONS)
            return np.concatenate(parts) if parts else np.empty(0, np.int64)

        self._pending = pending
        for batch, _ in rebatcher.batches(self._chunks_with_positions()):
            del batch[_POSITIONS]
            yield self._out(self._shareable(batch))

    def _chunks_with_positions(self) -> Iterator[Columns]:
        for positions, columns in self._chunks():
            if _POSITIONS in columns:
                raise SchemaError(f"a column is named {_POSITIONS!r}, which the loaders use for themselves")
            yield dict(columns, **{_POSITIONS: positions})

    #: shuffled batches decode their images after the draw where the reader can hand them out
    #: encoded (readers/late_decode.py); False decodes them in the reader (the same batches)
    _late_decoding = True

    def _shuffled(self) -> Iterator[Any]:
        with decoded_later(self.reader, self._late_decoding) as late:
            yield from self._shuffled_batches(late)

    def _shuffled_batches(self, late: LateImages | None) -> Iterator[Any]:
        """Batches drawn at random from a queue of at least ``shuffling_queue_capacity`` rows; with
        ``late``, the queue holds the images encoded and each drawn batch is decoded a few ahead."""
        bs = self.batch_size
        capacity = max(self.shuffling_queue_capacity, bs)
        buffer = ShuffleBuffer(reserve=capacity + max(bs, ARRIVAL_ROWS))
        decoder = DecodeAhead(late) if late is not None else None
        images = frozenset(f.name for f in late.fields) if late is not None else frozenset()

        def pending() -> np.ndarray:  # with a decoder: the rows queued, and those drawn and decoding
            assert decoder is not None
            return np.concatenate([*decoder.keys(), buffer.positions()])

        def draw(count: int) -> Iterator[Any]:
            chosen, chosen_positions = buffer.take_random(count, self._rng)
            if decoder is None:
                for start in range(0, count, bs):
                    self._pending = lambda rest=chosen_positions[start + bs:]: np.concatenate([rest, buffer.positions()])
                    yield self._out(self._shareable(slice_columns(chosen, start, start + bs)))
                return
            for start in range(0, count, bs):
                decoder.submit(chosen_positions[start:start + bs], slice_columns(chosen, start, start + bs))
            yield from decoded(decoder.ready())

        def decoded(ready: Iterator[tuple[Any, Columns]]) -> Iterator[Any]:
            for _, columns in ready:  # the decoded images converted as the reader's columns are
                yield self._out(self._shareable(self._convert(columns, keep=frozenset(columns) - images)))

        if decoder is not None:
            self._pending = pending
        try:
            for new_positions, columns in self._chunks(late.columns if late is not None else frozenset()):
                buffer.add(columns, new_positions)
                if decoder is None:
                    self._pending = buffer.positions
                if buffer.size >= capacity:
                    yield from draw(((buffer.size - capacity) // bs + 1) * bs)
            if buffer.size:
                yield from draw(buffer.size)
            if decoder is not None:
                yield from decoded(decoder.drain())
        finally:
            if decoder is not None:  # a loop that broke off: its state must still count the batches decoding
                self._pending = pending()
                decoder.close()

    @property
    def diagnostics(self) -> dict[str, Any]:
        """The reader's (``decode_errors_skipped``: rows dropped for images that do not decode, with
        ``make_reader(..., on_decode_error='skip')``); empty for a reader that keeps none."""
        return dict(getattr(self.reader, "diagnostics", {}))

    def state_dict(self) -> dict[str, Any]:
        """Where to resume: after the last batch this loader delivered (JSON-able)."""
        state = self._tracker.state()
        carry = getattr(self.reader, "with_later_changes", None)  # a mix's weights changed since (weighted.py)
        return dict(state, reader=carry(state["reader"])) if callable(carry) else state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration delivers exactly the rows not delivered before it."""
        if self._iterating:
            raise UsageError("load_state_dict() while the loader is being iterated; call it before iterating")
        reader_state, skip, exclude = _parse_state(state)
        self.reader.load_state_dict(reader_state)
        self._pending = np.empty(0, dtype=np.int64)
        self._tracker = _Tracker(reader_state, self._pending_positions, skip, (skip + e for e in exclude))
        self._resumed = True

    def skip_batches(self, count: int) -> None:
        """Pass over the next ``count`` batches (after a loss spike, or to replay from a step) at the cost of a
        resume: from where the loader is (its :meth:`state_dict`), the reader moves ``count * batch_size`` rows
        on without reading them (its ``skip_rows``), and the next iteration continues there, as after
        :meth:`load_state_dict` (also after a pass broken off, which would otherwise start over). A batch
        reader's rows before that point in its batch are read and dropped, as a resume does.

        Not while iterating (break out, skip, iterate again), nor with a shuffling queue, whose batches are
        known only by drawing them (:class:`~unihub.errors.InvalidArgumentError`: read and drop them there).
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidArgumentError(f"skip_batches() takes a count >= 0, got {count!r}")
        if self._iterating:
            raise UsageError("skip_batches() while the loader is being iterated; break out of the loop, skip, "
                             "then iterate again")
        if self.shuffling_queue_capacity > 0:
            raise InvalidArgumentError("skip_batches() on a loader with a shuffling queue: its batches are known "
                                       "only by drawing them; read and drop them (itertools.islice)")
        reader = self.reader
        reader_state, skip, _ = _parse_state(self.state_dict())  # in reader order, nothing is held out of order
        reader.load_state_dict(reader_state)
        rows = skip + count * self.batch_size
        if callable(getattr(reader, "position_after", None)):
            target = reader.position_after(rows)
            reader.load_state_dict(target.state)
            reader_state, skip = target.state, target.rows_into_task
        elif callable(getattr(reader, "skip_rows", None)) and not getattr(reader, "is_batched_reader", False):
            reader.skip_rows(rows)
            reader_state, skip = reader.state_dict(), 0
        else:
            raise InvalidArgumentError(f"skip_batches() needs a reader that skips rows without reading them; "
                                       f"{type(reader).__name__} has no skip_rows() for its rows")
        self._pending = np.empty(0, dtype=np.int64)
        self._tracker = _Tracker(reader_state, self._pending_positions, skip)
        self._resumed = True

    def __len__(self) -> int:
        """Batches the loader yields, where the reader knows its row count."""
        rows = getattr(self.reader, "num_rows_per_epoch", None)
        epochs = getattr(self.reader, "num_epochs", None)
        if rows is None or epochs is None:
            raise TypeError("len() is unknown: the reader does not know its row count (predicate, filters, "
                            "a batch transform or num_epochs=None)")
        return math.ceil(rows * epochs / self.batch_size)

    def stop(self) -> None:
        self.reader.stop()

    def join(self) -> None:
        self.reader.join()

    def terminate(self) -> None:
        """Petastorm's name for stop + join."""
        self.stop()
        self.join()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.terminate()


def _rows_of(batch: Any) -> Iterator[Any]:
    """A batch namedtuple of columns as row namedtuples of the same type."""
    return (batch._make(values) for values in zip(*batch))


def decimal_friendly_collate(batch: Sequence[Any]) -> Any:
    """Petastorm's default collate: torch's ``default_collate``, with ``decimal.Decimal`` values and
    strings kept as they come (torch cannot stack them), mappings and sequences collated item by item.

    Sequences are collated position by position into a list; the decimals or strings at one
    position come as a tuple (of the rows' values), as Petastorm's do; a list of rows of them as a list."""
    torch = _torch()
    first = batch[0]
    if isinstance(first, decimal.Decimal) or isinstance(first, (str, bytes)):
        return batch if isinstance(batch, tuple) else list(batch)
    if isinstance(first, Mapping):
        return {key: decimal_friendly_collate([row[key] for row in batch]) for key in first}
    if hasattr(first, "_asdict"):  # a row namedtuple: a dict of its fields, as Petastorm's loaders give
        return decimal_friendly_collate([row._asdict() for row in batch])
    if isinstance(first, Sequence):
        return [decimal_friendly_collate(samples) for samples in zip(*batch)]
    return torch.utils.data.default_collate(list(batch))


class DataLoader(_LoaderBase):
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
                tracker.mark(_reader_state(reader))
            try:
                item = next(reader)
            except StopIteration:
                tracker.mark(_reader_state(reader))
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


class BatchedDataLoader(_LoaderBase):
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
        _check_variable(variable)
        self.transform_fn = transform_fn
        self.device = device
        self.variable = variable
        self._collate = Collate(variable).with_schema(reader.schema)

    def _out(self, columns: Columns) -> Any:
        batch = finalize(columns, self.variable, self.device, self._collate.ragged)
        return self.transform_fn(batch) if self.transform_fn is not None else batch

    def _batches(self) -> Iterator[Any]:
        return self._columnar_batches()


class InMemBatchedDataLoader(_LoaderBase):
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


# -- torch datasets --------------------------------------------------------------------------------
def row_to_tensors(row: Any) -> dict[str, Any]:
    """One row as a dict: numeric values as tensors, others unchanged (for torch's default_collate)."""
    values = row._asdict() if hasattr(row, "_asdict") else dict(row)
    return {name: _row_value(value) for name, value in values.items()}


def _row_value(value: Any) -> Any:
    """A row's value as :func:`row_to_tensors` gives it: a numeric array or scalar as a tensor."""
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in _NUMERIC:
        return _tensor(np.asarray(value))
    return value


class PerRank:
    """A loader's (or reader's) state in ``torch.distributed.checkpoint`` under its rank's own key.

    DCP saves a non-tensor value that every rank has under the same key once, as replicated: with
    ``{"loader": loader}`` in a group of several ranks, one rank's position is saved and every rank
    loads it (a sharded reader refuses it; an unsharded one repeats rows). Under
    ``{"loader": PerRank(loader)}`` each rank's state is kept as ``rank_<k>``, and each loads its own.

        dcp.save({"model": model.state_dict(), "loader": PerRank(loader)}, checkpoint_id=path)
    """

    def __init__(self, loader: Any, rank: int | None = None) -> None:
        self.loader = loader
        self.rank = _rank_and_world()[0] if rank is None else rank

    @property
    def key(self) -> str:
        return f"rank_{self.rank}"

    def state_dict(self) -> dict[str, Any]:
        return {self.key: self.loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.key not in state:
            raise LoaderStateError(f"the checkpoint holds no state for {self.key} (it has {sorted(state)})")
        self.loader.load_state_dict(state[self.key])


def _rank_and_world() -> tuple[int, int]:
    dist = _torch().distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _epoch_seed(seed: int, epoch: int) -> int:
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1, np.uint64)[0] >> 1)


def _exact_share(reader: Any, shard: int, count: int) -> int:
    """Rows of a ``shard_remainder='pad'`` row shard that are not wrap-around repeats."""
    if reader.num_rows_per_epoch is None:
        raise InvalidArgumentError("TorchIterableDataset with several workers or ranks needs the row count to shard "
                          "rows exactly once; predicate=, filters= and batch transforms are not supported there")
    total = reader.store.num_rows
    per = math.ceil(total / count)
    return max(0, min(per, total - shard * per))


def _threads_per_worker(workers: int) -> int:
    """Decoding threads for the reader of each of ``workers`` torch worker processes: their share
    of the cores (a reader's default is one thread per core, and every worker starting that many
    had 2 x workers threads contending for the cores)."""
    return max(1, usable_cores() // workers)


_RESERVED = ("cur_shard", "shard_count", "shard_by", "shard_remainder", "num_epochs", "resume_from")


def _build_iterable_dataset(torch: Any) -> type:
    class TorchIterableDataset(torch.utils.data.IterableDataset):
        """Rows (``batch_size=None``) or column batches of a dataset for torch's own DataLoader.

        Each torch worker of each rank reads its own shard: ``cur_shard = rank * num_workers +
        worker_id`` of ``world_size * num_workers``, cut by row so every row of an epoch is
        delivered exactly once. Each ``iter()`` is one epoch; the order is seeded by
        ``(seed, epoch)``, and ``set_epoch`` sets the epoch (needed when workers are not
        persistent). Pass the same ``seed`` on every rank. With ``batch_size``, use torch's
        ``DataLoader(ds, batch_size=None)``. ``reader_kwargs`` go to ``make_reader``/``make_batch_reader``.

        ``url`` may also be a row reader, such as ``CachedDataset.stream(...)``: it is served as it is
        (its shard, order, offset and epochs), once, in the process that iterates (torch's
        ``num_workers=0``): one position in one order cannot be split among torch workers.
        """

        def __init__(self, url: Any, batch_size: int | None = None, *, seed: int | None = None,
                     variable: Variable = "list", **reader_kwargs: Any) -> None:
            super().__init__()
            receive_here()  # the workers torch forks hand this process their shared memory
            reserved = sorted(set(reader_kwargs) & set(_RESERVED))
            if reserved:
                raise InvalidArgumentError(f"TorchIterableDataset sets {reserved} itself (one epoch per iter(), sharded "
                                  "by torch worker and rank); leave them out")
            _check_variable(variable)

            self.stream = url if isinstance(url, Reader) else None
            if self.stream is not None and (reader_kwargs or self.stream.batched):
                raise InvalidArgumentError("a reader given to TorchIterableDataset is served as it is: pass a row "
                                           "reader (make_reader, CachedDataset.stream) and no reader options")
            self.url, self.batch_size, self.variable = url, batch_size, variable
            if seed is None:
                seed = random_seed()
            self.seed = int(seed)
            self.reader_kwargs = reader_kwargs
            self.epoch = 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __iter__(self) -> Iterator[Any]:
            info = torch.utils.data.get_worker_info()
            if info is not None:
                in_torch_worker()
            if self.stream is not None:
                yield from self._serve_stream(info)
                return
            worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
            rank, world = _rank_and_world()
            shard, count = rank * workers + worker, world * workers
            kwargs = dict(self.reader_kwargs, seed=_epoch_seed(self.seed, self.epoch), num_epochs=1)
            if workers > 1 and "workers_count" not in kwargs:
                kwargs["workers_count"] = _threads_per_worker(workers)
            self.epoch += 1
            if count > 1:
                kwargs.update(cur_shard=shard, shard_count=count, shard_by="row", shard_remainder="pad")
            make = make_reader if self.batch_size is None else make_batch_reader
            with make(self.url, **kwargs) as reader:
                limit = _exact_share(reader, shard, count) if count > 1 else None
                if self.batch_size is None and reader.ngram is None:
                    yield from _cut_rows(reader, limit)
                elif self.batch_size is None:  # an n-gram a row: torch collates them as they are
                    for row in itertools.islice(reader, limit):
                        yield row_to_tensors(row)
                else:
                    loader = BatchedDataLoader(reader, batch_size=self.batch_size, variable=self.variable)
                    loader._max_rows = limit
                    if info is None:
                        yield from loader
                        return
                    pool = loader._shared_batches = worker_pool()
                    for batch in loader:
                        yield pool.sending(batch)

        def _serve_stream(self, info: Any) -> Iterator[Any]:
            if info is not None:
                raise InvalidArgumentError("a reader (a stream) is one position in one order and cannot be split "
                                           "among torch workers: use num_workers=0, or pass the dataset's URL so "
                                           "that each worker reads its own shard")
            assert self.stream is not None
            if self.batch_size is None:
                for row in self.stream:
                    yield row_to_tensors(row)
            else:
                yield from BatchedDataLoader(self.stream, batch_size=self.batch_size, variable=self.variable)

    _register_sampler_collate()

    TorchIterableDataset.__module__ = __name__
    TorchIterableDataset.__qualname__ = "TorchIterableDataset"
    return TorchIterableDataset


class _CompactWhenPickled(dict[str, Any]):
    """A dict whose tensors may view a whole batch's columns: pickled, a plain dict of tensors that
    hold only their own values (torch would send a view's whole storage)."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return dict, (_compact_row(self),)


class _Row(_CompactWhenPickled):
    """A row the datasets hand torch's collate; copied, a plain dict, or in a torch worker one that
    pickles compact: torch's ``default_convert`` copies each item a worker sends without collating
    it (``batch_size=None``), puts the row's values back into the copy, and pickles that."""

    __slots__ = ()

    def __copy__(self) -> dict[str, Any]:
        return _CompactWhenPickled(self) if _torch().utils.data.get_worker_info() is not None else dict(self)


class SamplerRow(_Row):
    """A row cut from a batch's columns (``TorchMapDataset``'s sampler batch, ``TorchIterableDataset``'s
    reader batch): a dict that also knows the columns it was cut from and where, so that torch's
    default collate can hand those columns over in runs (:func:`collate_sampler_rows`) instead of
    stacking the rows back into new memory. It pickles and copies as a plain dict."""

    __slots__ = ("columns", "cells", "index")
    columns: Columns  # the batch the row was cut from
    cells: dict[str, Sequence[Any]]  # its columns cut into rows: the cells every row holds
    index: int  # the row's place in them


def _compact_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` as a plain dict whose tensors hold only their own values: a row's tensors view its
    batch's whole columns, and pickled for another process torch would send those whole storages."""
    torch = _torch()
    return {name: value.clone() if isinstance(value, torch.Tensor) and
            value.untyped_storage().nbytes() > value.nbytes else value for name, value in row.items()}


def _rows_of_columns(columns: Columns, count: int, row_type: type[dict[str, Any]]) -> list[Any]:
    """``count`` rows of ``columns`` as dicts of ``row_type`` (tensor rows are views of the columns)."""
    cells = {name: (list(col.unbind(0)) if isinstance(col, _torch().Tensor) else col) for name, col in columns.items()}
    rows = []
    for i in range(count):
        row = row_type({name: values[i] for name, values in cells.items()})
        if isinstance(row, SamplerRow):
            row.columns, row.cells, row.index = columns, cells, i
        rows.append(row)
    return rows


def _cut_rows(reader: Any, limit: int | None) -> Iterator[Any]:
    """A row reader's rows as :func:`row_to_tensors` gives them (at most ``limit``), cut from its
    columns (:meth:`~unihub.readers.reader.Reader.next_columns`) as :class:`SamplerRow`: torch's
    collate hands runs of them over as slices of those columns, not stacked row by row."""
    left = limit
    while left is None or left > 0:
        columns = reader.next_columns(left if left is not None else 2**31)
        if columns is None:
            return
        converted = columns_from_numpy(columns, cell=_row_value)
        count = columns_length(converted)
        if left is not None:
            left -= count
        yield from _rows_of_columns(converted, count, SamplerRow)


Run = tuple[Columns, int, int]  # columns, first row, row after the last


def _row_runs(rows: Sequence[Any]) -> list[Run] | None:
    """``rows`` as runs of consecutive rows of tensor columns, when each row is a :class:`SamplerRow`
    exactly as cut (the same cell objects, no key added or removed) and every run's columns have the
    first's names, dtypes and row shapes: then stacking the rows would rebuild those slices. Otherwise None."""
    torch = _torch()
    runs: list[list[Any]] = []
    first: Columns | None = None
    for row in rows:
        if type(row) is not SamplerRow:
            return None
        columns, cells, index = row.columns, row.cells, row.index
        if not runs or columns is not runs[-1][0] or index != runs[-1][2]:
            if not all(isinstance(c, torch.Tensor) for c in columns.values()):
                return None
            if first is None:
                first = columns
            elif list(columns) != list(first) or any(
                    columns[n].dtype != first[n].dtype or columns[n].shape[1:] != first[n].shape[1:] for n in first):
                return None
            runs.append([columns, index, index])
        if len(row) != len(cells):
            return None
        for name, values in cells.items():
            if row.get(name) is not values[index]:
                return None
        runs[-1][2] += 1
    return [(columns, start, stop) for columns, start, stop in runs]


def _whole_columns(rows: Sequence[Any]) -> Columns | None:
    """The columns ``rows`` were cut from, when ``rows`` are all of them, in order (see :func:`_row_runs`)."""
    runs = _row_runs(rows) if rows else None
    return None if runs is None else _whole(runs)


def _whole(runs: list[Run]) -> Columns | None:
    """The columns of ``runs`` when they are one run of all their rows, in order."""
    if len(runs) != 1:
        return None
    columns, start, stop = runs[0]
    return columns if start == 0 and stop == columns_length(columns) else None


def _joined_runs(runs: list[Run]) -> Columns:
    """The runs' rows as columns: in a torch worker, in one storage of its pool (one copy, and the
    batch leaves the worker without another); elsewhere in new memory, as stacking gives."""
    torch = _torch()
    total = sum(stop - start for _, start, stop in runs)
    first = runs[0][0]
    shapes = {name: (first[name].dtype, (total, *first[name].shape[1:])) for name in first}
    in_worker = torch.utils.data.get_worker_info() is not None
    out = empty_in_pool(shapes) if in_worker else {name: torch.empty(shape, dtype=dtype)
                                                   for name, (dtype, shape) in shapes.items()}
    for name, tensor in out.items():
        at = 0
        for columns, start, stop in runs:
            _copy_into(tensor[at:at + stop - start], columns[name][start:stop])
            at += stop - start
    return worker_pool().sending(out) if in_worker else out


def collate_sampler_rows(rows: Sequence[Any], *, collate_fn_map: Any = None) -> Any:
    """torch's default collate for :class:`SamplerRow` batches: the slices of the columns the rows
    were cut from, joined (equal to the stacked rows: same dtypes, shapes and values), in a torch
    worker into the worker's reused shared memory (readers/shared_batches.py) rather than the new
    shared memory torch's collate allocates for every field of every batch. Rows that were changed,
    mixed or reordered, and a ``collate_fn_map`` that collates tensors its own way, get torch's
    collate of plain dicts."""
    collate_fn_map, tensors_as_torch = _collate_map(collate_fn_map)
    runs = _row_runs(rows) if rows and tensors_as_torch else None
    if runs is None:
        return _torch_collate(rows, collate_fn_map)
    whole = _whole(runs)
    if whole is not None and _torch().utils.data.get_worker_info() is not None:
        return from_worker(dict(whole))  # whole columns (a sampler batch): copied into the pool once
    return _joined_runs(runs)


class TransformedRow(_Row):
    """A row a ``TorchMapDataset``'s ``transform`` returned (a dict), in a torch worker: torch's
    default collate stacks its same-shaped tensors into one storage of the worker's reused shared
    memory (:func:`collate_transformed_rows`), not into new shared memory per field. It pickles and
    copies as a plain dict."""

    __slots__ = ()


def collate_transformed_rows(rows: Sequence[Any], *, collate_fn_map: Any = None) -> Any:
    """torch's default collate for :class:`TransformedRow` batches in a worker: the fields whose
    values are CPU tensors of one dtype and shape are stacked (``torch.stack``, as torch does) into one
    storage of the worker's pool; the others are torch's collate of them. Equal to torch's collate of
    plain dicts, which rows of different keys, other collate maps and the main process get."""
    from torch.utils.data._utils.collate import collate

    torch = _torch()
    collate_fn_map, tensors_as_torch = _collate_map(collate_fn_map)
    keys = list(rows[0]) if rows else []
    if (not rows or not tensors_as_torch or torch.utils.data.get_worker_info() is None
            or any(not isinstance(row, dict) or list(row) != keys for row in rows)):
        return _torch_collate(rows, collate_fn_map)
    shapes = {}
    for key in keys:
        first = rows[0][key]
        if type(first) is torch.Tensor and first.device.type == "cpu" and not first.requires_grad and \
                first.layout == torch.strided and all(
                    type(row[key]) is torch.Tensor and row[key].dtype == first.dtype and row[key].shape == first.shape
                    and row[key].device.type == "cpu" and not row[key].requires_grad for row in rows):
            shapes[key] = (first.dtype, (len(rows), *first.shape))
    if not shapes:
        return _torch_collate(rows, collate_fn_map)
    stacked = empty_in_pool(shapes)
    for key, out in stacked.items():
        torch.stack([row[key] for row in rows], 0, out=out)
    return worker_pool().sending({key: stacked[key] if key in stacked else
                                  collate([row[key] for row in rows], collate_fn_map=collate_fn_map) for key in keys})


def _collate_map(collate_fn_map: Any) -> tuple[Any, bool]:
    """The collate map torch's collate was called with (its default for None), and whether it collates
    tensors as torch's default does (otherwise the rows are left to it)."""
    from torch.utils.data._utils.collate import collate_tensor_fn, default_collate_fn_map

    collate_fn_map = default_collate_fn_map if collate_fn_map is None else collate_fn_map
    return collate_fn_map, collate_fn_map.get(_torch().Tensor) is collate_tensor_fn


def _torch_collate(rows: Sequence[Any], collate_fn_map: Any) -> Any:
    """torch's own collate of ``rows``, this module's rows as the plain dicts they stand for."""
    from torch.utils.data._utils.collate import collate

    return collate([dict(row) if isinstance(row, _Row) else row for row in rows], collate_fn_map=collate_fn_map)


class _SamplerBatch:
    """A ``TorchMapDataset`` sampler batch that goes from ``__getitems__`` straight to torch's
    ``default_collate`` in a worker, as the list of one such marker per row: the collate
    (:func:`collate_sampler_batch`) hands its columns over whole, as collating its rows would, without
    cutting them into 64 row dicts to join back (~115 µs a batch, ~7% of a map worker's time)."""

    __slots__ = ("columns",)

    def __init__(self, columns: Columns) -> None:
        self.columns = columns


def _straight_to_default_collate(caller: Any) -> bool:
    """Whether ``caller`` (a frame) is torch's map fetcher in a worker, which collates what it gets with
    ``default_collate`` and shows it to nothing else: then a sampler batch may go as markers."""
    fetcher = caller.f_locals.get("self") if caller.f_code.co_name == "fetch" else None
    if type(fetcher).__name__ != "_MapDatasetFetcher" or not getattr(fetcher, "auto_collation", False):
        return False
    try:
        from torch.utils.data._utils.collate import default_collate, default_collate_fn_map
    except ImportError:  # a torch without the collate map: rows, which its collate takes as dicts
        return False
    return (getattr(fetcher, "collate_fn", None) is default_collate and _collate_map(None)[1]
            and default_collate_fn_map.get(_SamplerBatch) is collate_sampler_batch)


def collate_sampler_batch(markers: Sequence[Any], *, collate_fn_map: Any = None) -> Any:
    """torch's default collate of a sampler batch sent as :class:`_SamplerBatch` markers: its columns,
    into the worker's pool, exactly what :func:`collate_sampler_rows` gives for its rows; anything else
    (markers of several batches, a collate map that stacks tensors its own way) as those rows."""
    torch = _torch()
    first = markers[0]
    if all(m is first for m in markers) and len(markers) == columns_length(first.columns) \
            and all(isinstance(c, torch.Tensor) for c in first.columns.values()) \
            and _collate_map(collate_fn_map)[1] and torch.utils.data.get_worker_info() is not None:
        return from_worker(dict(first.columns))  # what collate_sampler_rows gives a whole batch's rows
    cut: dict[int, list[Any]] = {}  # each batch's rows, cut once
    rows = []
    for i, marker in enumerate(markers):
        if id(marker) not in cut:
            cut[id(marker)] = _rows_of_columns(marker.columns, columns_length(marker.columns), SamplerRow)
        rows.append(cut[id(marker)][i])
    return collate_sampler_rows(rows, collate_fn_map=collate_fn_map)


def _register_sampler_collate() -> None:
    """Teach torch's ``default_collate`` :class:`SamplerRow` (its documented extension point,
    ``default_collate_fn_map``); a torch without it collates the rows as plain dicts."""
    try:
        from torch.utils.data._utils.collate import default_collate_fn_map
    except ImportError:
        return
    default_collate_fn_map.setdefault(SamplerRow, collate_sampler_rows)
    default_collate_fn_map.setdefault(TransformedRow, collate_transformed_rows)
    default_collate_fn_map.setdefault(_SamplerBatch, collate_sampler_batch)


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
                rows = [self.transform(row) for row in _rows_of_columns(columns, len(indices), dict)]
                if torch.utils.data.get_worker_info() is None:
                    return rows
                # dicts the transform made: collated into the worker's reused shared memory
                return [TransformedRow(row) if type(row) is dict else row for row in rows]
            columns = self._columns(list(indices))
            if indices and torch.utils.data.get_worker_info() is not None and \
                    all(isinstance(c, torch.Tensor) for c in columns.values()) and \
                    _straight_to_default_collate(sys._getframe(1)):
                return [_SamplerBatch(columns)] * len(indices)
            return _rows_of_columns(columns, len(indices), SamplerRow)

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
                                     if f.is_fixed_shape and (dtype := _torch_dtype(f.dtype)) is not None]
            return self._pool_fields

    _register_sampler_collate()

    TorchMapDataset.__module__ = __name__
    TorchMapDataset.__qualname__ = "TorchMapDataset"
    return TorchMapDataset


_BUILDERS = {"TorchIterableDataset": _build_iterable_dataset, "TorchMapDataset": _build_map_dataset}


def __getattr__(name: str) -> Any:
    """The torch dataset classes subclass torch's, so they are built when first asked for."""
    builder = _BUILDERS.get(name)
    if builder is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = builder(_torch())
    globals()[name] = cls
    return cls
