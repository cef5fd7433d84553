"""One shuffling buffer for every bridge: columns of numpy arrays, torch tensors or lists.

A shuffling queue holds rows between the reader and the batches. Concatenating each arriving
reader batch onto the queue and re-taking what stays copies the whole queue per reader batch,
which grows with the capacity (and with smaller row groups). Here adding copies only the new
rows in, and drawing ``k`` random rows copies those ``k`` out and moves at most ``k`` rows
from the end into their places: the work per row is constant. ``make_tf_dataset`` (numpy) and
``BatchedDataLoader`` (torch) both draw from it; torch is imported only for torch columns.

Rows of CPU tensors are moved through numpy views of them (:func:`take`, :func:`concat`): torch's
own indexing and copies run on its OpenMP threads, which then spin waiting for more work and
take the cores from the threads that decode the next rows (1.3-1.5x fewer rows/s on 2 cores).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from unihub.schema.arrow_numpy import arrow_backed_empty, joined_dtype

Columns = dict[str, Any]


def _empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Room for rows: Arrow's pool (aligned, recycled pages) for numbers, numpy's for objects."""
    return np.empty(shape, dtype) if np.dtype(dtype).hasobject else arrow_backed_empty(shape, dtype)


def _numpy_take(array: np.ndarray, index: np.ndarray) -> np.ndarray:
    out = _empty((len(index), *array.shape[1:]), array.dtype)
    return np.take(array, index, axis=0, out=out)


def _numpy_concat(parts: list[np.ndarray]) -> np.ndarray:
    if any(p.ndim == 0 for p in parts):
        return np.concatenate(parts)  # numpy's own error
    dtype = joined_dtype(parts)
    if dtype is None:  # dates no one unit holds: each row keeps its own
        return _object_rows(parts)
    out = _empty((sum(len(p) for p in parts), *parts[0].shape[1:]), dtype)
    return np.concatenate(parts, out=out)  # exact: joined_dtype checked every value


def _object_rows(parts: list[np.ndarray]) -> np.ndarray:
    out = np.empty(sum(len(p) for p in parts), dtype=object)
    for i, value in enumerate(value for part in parts for value in part):  # not out[:] = list: arrays would broadcast
        out[i] = value
    return out


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def numpy_view(value: Any) -> Any:
    """A CPU tensor's numpy view (sharing its memory); anything else (and a tensor numpy cannot
    hold) as it is."""
    if _is_tensor(value) and value.device.type == "cpu" and not value.requires_grad:
        try:
            return value.numpy()
        except (TypeError, RuntimeError):  # bfloat16, say
            return value
    return value


def take(column: Any, index: np.ndarray) -> Any:
    """Rows ``index`` of a tensor, numpy array or list column, as the same kind."""
    if _is_tensor(column):
        import torch

        view = numpy_view(column)
        if isinstance(view, np.ndarray):
            return torch.from_numpy(_numpy_take(view, index))
        return column[torch.from_numpy(index)]
    if isinstance(column, np.ndarray):
        return _numpy_take(column, index)
    return [column[i] for i in index.tolist()]


def concat(parts: list[Any]) -> Any:
    """Tensor, numpy or list columns joined row-wise (tensors stay tensors)."""
    if all(_is_tensor(p) for p in parts):
        import torch

        views = [numpy_view(p) for p in parts]
        if all(isinstance(v, np.ndarray) for v in views):
            return torch.from_numpy(_numpy_concat(views))
        return torch.cat(parts)
    if all(isinstance(p, np.ndarray) for p in parts):
        return _numpy_concat(parts)
    return [v for p in parts for v in p]


def columns_length(columns: Mapping[str, Any]) -> int:
    """Rows of a batch of columns (a dict of equal-length columns)."""
    return len(next(iter(columns.values()))) if columns else 0


def slice_columns(columns: Mapping[str, Any], start: int, stop: int | None = None) -> Columns:
    """Rows ``start:stop`` of every column (views for arrays and tensors)."""
    return {name: column[start:stop] for name, column in columns.items()}


def take_columns(columns: Mapping[str, Any], index: np.ndarray) -> Columns:
    """Rows ``index`` of every column, each as its own kind (:func:`take`)."""
    index = np.ascontiguousarray(index, dtype=np.int64)
    return {name: take(column, index) for name, column in columns.items()}


def concat_columns(parts: list[Columns]) -> Columns:
    """Batches of the same columns joined row-wise (:func:`concat`); one part comes back as it is."""
    if len(parts) == 1:
        return parts[0]
    return {name: concat([p[name] for p in parts]) for name in parts[0]}


def _slices(columns: Columns, size: int) -> list[Columns]:
    n = columns_length(columns)
    return [slice_columns(columns, start, start + size) for start in range(0, n, size)]


class Rebatcher:
    """Column chunks (reader batches, shuffled draws) cut into batches of exactly ``size`` rows.

    Whole batches are views of an arriving chunk (``split`` cuts a chunk's full batches at once:
    one ``torch.split`` per column for tensors); only a batch across two chunks is concatenated,
    into new aligned memory (which TensorFlow takes without copying again). :meth:`pending` gives a
    column's values of the rows taken in and not yet handed out: the torch loaders carry each row's
    stream position as a column, for exact resume.
    """

    def __init__(self, size: int, split: Callable[[Columns, int], list[Columns]] = _slices) -> None:
        self.size = size
        self._split = split
        self._held: list[Columns] = []  # the rows of a batch begun in earlier chunks
        self._held_rows = 0
        self._current: Columns = {}  # the chunk being cut, and where its rows not handed out start
        self._offset = 0

    def pending(self, name: str) -> list[Any]:
        """Column ``name`` of the rows not handed out yet, as parts in stream order."""
        parts = [held[name] for held in self._held]
        if self._current and self._offset < columns_length(self._current):
            parts.append(self._current[name][self._offset:])
        return parts

    def batches(self, chunks: Iterable[Columns], drop_remainder: bool = False) -> Iterator[tuple[Columns, bool]]:
        """``(batch, joined)`` per batch; ``joined``: concatenated from two chunks (new memory). The
        last batch may be smaller, unless ``drop_remainder``."""
        size = self.size
        for columns in chunks:
            n, start = columns_length(columns), 0
            self._current, self._offset = columns, 0
            if self._held_rows:  # complete the batch begun before
                start = self._offset = min(size - self._held_rows, n)
                self._held.append(slice_columns(columns, 0, start))
                self._held_rows += start
                if self._held_rows < size:
                    continue
                batch = concat_columns(self._held)
                self._held, self._held_rows = [], 0
                yield batch, True
            full = (n - start) // size
            if full:
                for i, piece in enumerate(self._split(slice_columns(columns, start, start + full * size), size)):
                    self._offset = start + (i + 1) * size
                    yield piece, False
                start += full * size
            if start < n:
                self._held, self._held_rows = [slice_columns(columns, start, n)], n - start
            self._current, self._offset = {}, 0
        if self._held_rows and not drop_remainder:
            batch = concat_columns(self._held)
            self._held, self._held_rows = [], 0
            yield batch, True
        self._held, self._held_rows = [], 0


def _room(like: Any, rows: int) -> Any:
    """An empty column of ``rows`` rows shaped and typed as ``like``'s rows."""
    if _is_tensor(like):
        import torch

        view = numpy_view(like)
        if isinstance(view, np.ndarray):
            return torch.from_numpy(_empty((rows, *like.shape[1:]), view.dtype))
        return torch.empty((rows, *like.shape[1:]), dtype=like.dtype)
    if isinstance(like, np.ndarray):
        return _empty((rows, *like.shape[1:]), like.dtype)
    return [None] * rows


def _fits(held: Any, new: Any) -> bool:
    """Whether ``new``'s rows can be stored in ``held`` as they are."""
    if _is_tensor(held):
        return _is_tensor(new) and new.dtype == held.dtype and tuple(new.shape[1:]) == tuple(held.shape[1:])
    if isinstance(held, np.ndarray):
        return held.dtype == object and held.ndim == 1 or (
            isinstance(new, np.ndarray) and new.dtype == held.dtype and new.shape[1:] == held.shape[1:])
    return True


def _as_rows(held: Any, size: int, capacity: int) -> Any:
    """``held`` turned into a column that takes any row: an object array for numpy, else a list."""
    if isinstance(held, np.ndarray):
        out = np.empty(capacity, dtype=object)
        for i in range(size):
            out[i] = held[i]
        return out
    return list(held[:size]) + [None] * (capacity - size)


def _move(column: Any, to: np.ndarray, source: np.ndarray) -> None:
    """``column[to] = column[source]``, rows one for one."""
    view = numpy_view(column)
    if _is_tensor(view):
        import torch

        column[torch.from_numpy(to)] = column[torch.from_numpy(source)]
    elif isinstance(view, np.ndarray):  # a numpy column, or a CPU tensor's view
        view[to] = view[source]
    else:
        for t, s in zip(to.tolist(), source.tolist()):
            column[t] = column[s]


def _assign(held: Any, rows: slice, new: Any) -> None:
    """``held[rows] = new``, through numpy views where both are CPU tensors."""
    target, source = numpy_view(held), numpy_view(new)
    if _is_tensor(held) and isinstance(target, np.ndarray) and isinstance(source, np.ndarray):
        target[rows] = source
    else:
        held[rows] = new


#: rows a shuffling queue sets aside beyond its capacity for the batch that arrives when it is
#: nearly full (the most rows a decode task delivers); a bigger batch grows the room
ARRIVAL_ROWS = 2048


class ShuffleBuffer:
    """Rows waiting in a shuffling queue, with their stream positions (for exact resume).

    ``reserve``: the rows it will hold at most, if known (a queue's capacity and an arriving
    batch). The room for them is taken once, when the first rows arrive, so that filling the queue
    does not copy it into ever bigger room (each copy held the old and the new room at once);
    room not yet written to costs no resident memory.
    """

    def __init__(self, reserve: int = 0) -> None:
        self.columns: Columns = {}
        self._positions = np.empty(0, np.int64)
        self.size = 0
        self._reserve = reserve

    def positions(self) -> np.ndarray:
        """Stream positions of the rows held."""
        return self._positions[:self.size]

    def add(self, columns: Mapping[str, Any], positions: np.ndarray | None = None) -> None:
        """Hold ``columns`` (equal lengths); ``positions`` default to consecutive numbers."""
        n = len(next(iter(columns.values()))) if columns else 0
        if positions is None:
            start = int(self._positions[self.size - 1]) + 1 if self.size else 0
            positions = np.arange(start, start + n, dtype=np.int64)
        end = self.size + n
        if end > len(self._positions):
            self._grow(columns, max(end, 2 * len(self._positions), self._reserve))
        for name, new in columns.items():
            held = self.columns[name]
            if not _fits(held, new):
                held = self.columns[name] = _as_rows(held, self.size, len(self._positions))
            if isinstance(held, list):
                held[self.size:end] = list(new)
            elif held.dtype == object and not (isinstance(new, np.ndarray) and new.dtype == object):
                for i, value in enumerate(new):
                    held[self.size + i] = value
            else:
                _assign(held, slice(self.size, end), new)
        self._positions[self.size:end] = positions
        self.size = end

    def _grow(self, columns: Mapping[str, Any], rows: int) -> None:
        for name, new in columns.items():
            held = self.columns.get(name)
            grown = _room(held if held is not None else new, rows)
            if held is not None and self.size:
                _assign(grown, slice(0, self.size), held[:self.size])
            self.columns[name] = grown
        positions = np.empty(rows, np.int64)
        positions[:self.size] = self._positions[:self.size]
        self._positions = positions

    def take_random(self, count: int, rng: np.random.Generator) -> tuple[Columns, np.ndarray]:
        """``count`` rows drawn at random (seeded by ``rng``) and removed: ``(columns, positions)``."""
        # O(count) work per draw, not O(size): a permutation of the whole queue and an isin cost
        # ~100 us per draw, which with a draw per batch was ~2 us per row
        chosen = rng.choice(self.size, size=count, replace=False)
        keep_end = self.size - count
        holes = np.sort(chosen[chosen < keep_end])  # places below the new end to fill
        leaving = np.zeros(count, dtype=bool)
        leaving[chosen[chosen >= keep_end] - keep_end] = True
        movers = np.flatnonzero(~leaving) + keep_end  # rows past the new end that stay
        out = {name: take(held, chosen) for name, held in self.columns.items()}
        for held in self.columns.values():
            if len(holes):
                _move(held, holes, movers)
            if isinstance(held, list) or (isinstance(held, np.ndarray) and held.dtype == object):
                held[keep_end:self.size] = [None] * count  # rows handed out are not kept alive here
        positions = self._positions[chosen]
        if len(holes):
            self._positions[holes] = self._positions[movers]
        self.size = keep_end
        return out, positions
