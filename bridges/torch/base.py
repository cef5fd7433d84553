"""What the three loaders share: the iteration guard, the columnar path (reader batches, or gathered
rows, as columns cut into batches, in order or through a shuffling queue), exact resume and
context management. The loaders themselves are in ``loaders.py``; resume's states in ``state.py``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from unihub.bridges.torch.collate import Collate, columns_from_numpy
from unihub.bridges.torch.shared_batches import FILLING, StoragePool
from unihub.bridges.torch.state import (
    RowTracker,
    elastic_reader_states,
    parse_loader_state,
    reader_state_of,
)
from unihub.bridges.torch.tensors import (
    Columns,
    copy_into,
    empty_in_pool,
    in_one_shared_storage,
    load_torch,
    split_columns,
    torch_dtype,
)
from unihub.errors import InvalidArgumentError, SchemaError, UsageError
from unihub.readers.batching import (
    ARRIVAL_ROWS,
    Rebatcher,
    ShuffleBuffer,
    columns_length,
    numpy_view,
    slice_columns,
    take_columns,
)
from unihub.readers.late_decode import DecodeAhead, cut_pays, decoded_later
from unihub.readers.reader import start_over
from unihub.schema.codecs import image_pixels_allowed

if TYPE_CHECKING:
    from unihub.readers.late_decode import LateImages

_CHUNK_ROWS = 256  # rows a batched loader gathers from a row reader before converting them
_POSITIONS = " stream positions"  # the column the loaders carry each row's stream position in (no field's name)


class LoaderBase:
    """Iteration guard, Petastorm's reset on re-iteration, resume and context management."""

    def __init__(self, reader: Any, batch_size: int, shuffling_queue_capacity: int, seed: int | None) -> None:
        # a bool is an int to Python, and a float, string or None only failed deep inside numpy or torch
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidArgumentError(f"batch_size must be a positive integer, got {batch_size!r}")
        if isinstance(shuffling_queue_capacity, bool) or not isinstance(shuffling_queue_capacity, int) or \
                shuffling_queue_capacity < 0:
            raise InvalidArgumentError(f"shuffling_queue_capacity must be an integer >= 0, got {shuffling_queue_capacity!r}")
        load_torch()
        self.reader = reader
        self.batch_size = batch_size
        self.shuffling_queue_capacity = shuffling_queue_capacity
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        # positions taken from the reader but not yet delivered: an array, or a function that
        # makes one (computed only when a state is asked for, so batches do no O(buffer) work)
        self._pending: np.ndarray | Callable[[], np.ndarray] = np.empty(0, dtype=np.int64)
        self._tracker = RowTracker(reader_state_of(reader), self._pending_positions)
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
            self._tracker = RowTracker(reader_state_of(self.reader), self._pending_positions)
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
            tracker.mark(reader_state_of(reader))
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
        tracker.mark(reader_state_of(reader))

    def _in_order(self) -> Iterator[Any]:
        """Batches in reader order (see :meth:`_in_order_batches`). The images come encoded where the
        reader can hand them out so and keeps every row (``on_decode_error='raise'``: a dropped row
        would leave a batch short)."""
        wanted = self._late_decoding and getattr(self.reader, "on_decode_error", "raise") == "raise" and \
            cut_pays(self.reader.schema.fields.values(), self.batch_size)
        with decoded_later(self.reader, wanted) as late:
            yield from self._in_order_batches(late)

    def _in_order_batches(self, late: LateImages | None) -> Iterator[Any]:
        """Batches in reader order, cut by a :class:`Rebatcher`. With ``late``, from encoded rows, each
        batch's images decoded straight into its own memory a few batches ahead (in a torch worker, into
        the storage of its pool the batch leaves in): a batch across two reader batches (nearly every
        one, where a reader's decode task is under a batch) costs no copy of its pixels. Without, whole
        batches are views of a reader batch's tensors (one ``torch.split`` per column), and a batch
        across two reader batches is concatenated."""
        rebatcher = Rebatcher(self.batch_size, split=split_columns)
        decoder = DecodeAhead(late) if late is not None else None
        if decoder is not None and self._shared_batches is not None:  # each batch decoding holds a slot
            decoder.ahead = min(decoder.ahead, FILLING - 1)

        def pending() -> np.ndarray:  # the rows held to complete a batch, and those of batches decoding
            parts = [key[0] for key in decoder.keys()] if decoder is not None else []
            parts += rebatcher.pending(_POSITIONS)
            return np.concatenate(parts) if parts else np.empty(0, np.int64)

        self._pending = pending
        chunks = self._chunks_with_positions(late.columns if late is not None else frozenset())
        if decoder is None or late is None:
            for batch, _ in rebatcher.batches(chunks):
                del batch[_POSITIONS]
                yield self._out(self._shareable(batch))
            return
        images = frozenset(f.name for f in late.fields)
        try:
            for batch, _ in rebatcher.batches(chunks):
                positions = batch.pop(_POSITIONS)
                tensors, arrays = self._room(batch, late)
                decoder.submit((positions, tensors, arrays), batch, arrays)
                yield from self._decoded_in_order(decoder.ready(), images)
            yield from self._decoded_in_order(decoder.drain(), images)
        finally:  # a loop that broke off: its state must still count the batches decoding
            self._pending = pending()
            decoder.close()

    def _room(self, batch: Columns, late: LateImages) -> tuple[Columns, dict[str, np.ndarray]]:
        """In a torch worker, the batch's numeric columns moved into one storage of its pool, with room
        there for its fixed-shape images: ``(pooled tensors, the images' numpy views to decode into)``;
        else nothing (the images get new memory)."""
        pool = self._shared_batches
        n = columns_length(batch)
        if pool is None or not n:
            return {}, {}
        torch = load_torch()
        shapes = {name: (column.dtype, tuple(column.shape)) for name, column in batch.items()
                  if isinstance(column, torch.Tensor) and column.device.type == "cpu" and not column.requires_grad}
        for f in late.fields:
            dtype = torch_dtype(f.dtype)
            if f.is_fixed_shape and dtype is not None and image_pixels_allowed(f):
                shapes[f.name] = (dtype, (n, *f.shape))
        tensors = empty_in_pool(shapes, pool)
        for name, tensor in tensors.items():
            if name in batch and isinstance(batch[name], torch.Tensor):
                copy_into(tensor, batch[name])
                batch[name] = tensor
        return tensors, {f.name: numpy_view(tensors[f.name]) for f in late.fields if f.name in tensors}

    def _decoded_in_order(self, ready: Iterator[tuple[Any, Columns]], images: frozenset[str]) -> Iterator[Any]:
        """Decoded batches as the loader's: an image decoded into the batch's pooled room as that tensor,
        the others converted as the reader's columns are."""
        for (_, tensors, arrays), columns in ready:
            pooled = {name: tensors[name] for name, array in arrays.items() if columns.get(name) is array}
            rest = {name: column for name, column in columns.items() if name not in pooled}
            converted = self._convert(rest, keep=frozenset(rest) - images)
            yield self._out(self._shareable({name: pooled[name] if name in pooled else converted[name]
                                             for name in columns}))

    def _chunks_with_positions(self, encoded: frozenset[str] = frozenset()) -> Iterator[Columns]:
        for positions, columns in self._chunks(encoded):
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
                if not columns_length(columns):  # every row's image skipped (on_decode_error='skip'): no batch
                    continue
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

    def load_state_dict(self, state: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        """Continue from ``state``: the next iteration delivers exactly the rows not delivered before it.

        Given a list, the states every rank of a run saved (``[state_rank0, ..., state_rankN]``, with or
        without a shuffling queue, any batch size), this loader's reader may have another ``cur_shard`` /
        ``shard_count``: it delivers its equal share of the rows no old rank delivered in their epoch, and
        later epochs as a fresh run with its shard count (elastic resume, readers/elastic.py).
        """
        if self._iterating:
            raise UsageError("load_state_dict() while the loader is being iterated; call it before iterating")
        if isinstance(state, (list, tuple)):
            self.reader.load_state_dict(elastic_reader_states(state))
            self._pending = np.empty(0, dtype=np.int64)
            self._tracker = RowTracker(reader_state_of(self.reader), self._pending_positions)
            self._resumed = True
            return
        reader_state, skip, exclude = parse_loader_state(state)
        self.reader.load_state_dict(reader_state)
        self._pending = np.empty(0, dtype=np.int64)
        self._tracker = RowTracker(reader_state, self._pending_positions, skip, (skip + e for e in exclude))
        self._resumed = True

    def skip_batches(self, count: int) -> None:
        """Pass over the next ``count`` batches (after a loss spike, or to replay from a step) at the cost of a
        resume: from where the loader is (its :meth:`state_dict`), the reader moves ``count * batch_size`` rows
        on without reading them (its ``skip_rows``), and the next iteration continues there, as after
        :meth:`load_state_dict` (also after a pass broken off, which would otherwise start over). A batch
        reader's rows before that point in its batch are read and dropped, as a resume does.

        Not while iterating (break out, skip, iterate again), nor with a shuffling queue, whose batches are
        known only by drawing them, nor with ``on_decode_error='skip'``, whose dropped rows are known only by
        decoding them (:class:`~unihub.errors.InvalidArgumentError`: read and drop the batches there).
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidArgumentError(f"skip_batches() takes a count >= 0, got {count!r}")
        if self._iterating:
            raise UsageError("skip_batches() while the loader is being iterated; break out of the loop, skip, "
                             "then iterate again")
        if self.shuffling_queue_capacity > 0:
            raise InvalidArgumentError("skip_batches() on a loader with a shuffling queue: its batches are known "
                                       "only by drawing them; read and drop them (itertools.islice)")
        if getattr(self.reader, "on_decode_error", "raise") == "skip":  # stored rows are not batches where some drop
            raise InvalidArgumentError("skip_batches() on a reader with on_decode_error='skip': the rows it drops are "
                                       "known only by decoding them, so the batches to pass over are too; read and "
                                       "drop them (itertools.islice)")
        reader = self.reader
        reader_state, skip, _ = parse_loader_state(self.state_dict())  # in reader order, nothing is held out of order
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
        self._tracker = RowTracker(reader_state, self._pending_positions, skip)
        self._resumed = True

    def __len__(self) -> int:
        """Batches the whole run yields, where the reader knows its row count: an upper bound with
        ``on_decode_error='skip'`` (a dropped row is known only once decoded), and the whole run's also
        after :meth:`load_state_dict`, as torch's ``StatefulDataLoader``."""
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
