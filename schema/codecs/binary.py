"""Zero-copy views of a binary column's values (the image codec's bytes, the readers' late decode).

``to_pylist`` copies every value into a ``bytes``; :func:`binary_views` and :class:`BinaryCells`
hand out ``memoryview`` slices of the Arrow buffers of binary, large binary and ``binary_view``
columns instead, or (``untracked``) 1-D uint8 numpy views of them, for values held a while (a
shuffling queue's encoded images): the garbage collector tracks every memoryview, and a queue of
them promoted into its oldest generation sets off full collections, each of which walks every
object of the process (~0.2 s with TensorFlow imported, once per ~80,000 rows); it tracks no numpy
array, and a slice of one is made in under half a memoryview slice's time.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from unihub.schema.arrow_numpy import int64_array, is_binary_view, is_view, take_views, to_numpy, view_records
from unihub.schema.codecs.base import column_as_array

#: where a binary column's values lie: (buffers, each value's buffer or None: the first, starts, ends)
Spans = tuple[list[memoryview], np.ndarray | None, np.ndarray, np.ndarray]


def _binary_spans(array: pa.Array) -> Spans | None:
    """Where each value of a binary array lies: (buffers as unsigned bytes, each value's buffer
    (None: all in the first), start, end); None for other types. Arrow's buffers export signed
    chars, which the image decoders refuse."""
    if pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
        offset_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
        _, offsets_buf, data_buf = array.buffers()
        offsets = np.frombuffer(offsets_buf, dtype=offset_type, count=len(array) + 1,
                                offset=array.offset * np.dtype(offset_type).itemsize)
        data = memoryview(data_buf).cast("B") if data_buf is not None else memoryview(b"")
        return [data], None, offsets[:-1], offsets[1:]
    if not is_binary_view(array.type):
        return None
    views = view_records(array)  # a read at store/_pages.py: one buffer, few values inline
    lengths = views[:, 0].astype(np.int64)
    referenced = lengths > 12
    buffers = [memoryview(b).cast("B") for b in array.buffers()[2:]]
    if referenced.all():
        starts = views[:, 3].astype(np.int64)
        return buffers, (None if len(buffers) == 1 else views[:, 2]), starts, starts + lengths
    # a short value lies in its own view, 4 bytes in: the views are the first buffer
    inline = 16 * np.arange(array.offset, array.offset + len(array), dtype=np.int64) + 4
    starts = np.where(referenced, views[:, 3], inline)
    which = np.where(referenced, views[:, 2] + 1, 0)
    return [memoryview(array.buffers()[1]).cast("B"), *buffers], which, starts, starts + lengths


def binary_views(array: pa.Array) -> list[memoryview | None]:
    """Zero-copy views of each value of a binary column (None for nulls); ``to_pylist`` would copy."""
    if not (pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type) or is_binary_view(array.type)):
        return array.to_pylist()
    return BinaryCells(array).at()


def spans_at(spans: Spans, rows: np.ndarray | None = None, untracked: bool = False) -> list[Any]:
    """The values ``spans`` (``(buffers, each value's buffer or None: the first, starts, ends)``) place
    at ``rows`` (every value where None), as zero-copy views of their buffers: memoryviews, or
    (``untracked``) uint8 numpy arrays, which the garbage collector does not track (module docstring)."""
    buffers, which, starts, ends = spans
    if untracked:
        buffers = [np.frombuffer(b, np.uint8) for b in buffers]  # type: ignore[misc]
    if rows is not None:
        starts, ends = starts[rows], ends[rows]
        which = None if which is None else which[rows]
    if which is None:
        data = buffers[0]
        return [data[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
    return [buffers[k][a:b] for k, a, b in zip(which.tolist(), starts.tolist(), ends.tolist())]


class BinaryCells:
    """A binary column's values by row, as zero-copy views (None for nulls): ``cells.at(rows)`` is
    what ``binary_views(column.take(rows))`` gives, without copying the values twice. Made once per
    column, it serves any number of lookups (a row group cached for random access). Binary, large
    binary and ``binary_view`` columns (images read without a copy: store/_pages.py)."""

    def __init__(self, column: pa.Array | pa.ChunkedArray) -> None:
        array = column.chunk(0) if isinstance(column, pa.ChunkedArray) and column.num_chunks == 1 else column
        self._column = column
        self._spans = _binary_spans(array) if isinstance(array, pa.Array) else None
        self._valid: np.ndarray | None = None
        if self._spans is not None and array.null_count:
            self._valid = to_numpy(array.is_valid())

    def spans(self) -> Spans | None:
        """Where each value lies, ``(buffers, each value's buffer or None: the first, starts, ends)``;
        None where :meth:`at` takes with Arrow (several chunks, not binary) or a value is null."""
        return self._spans if self._valid is None else None

    def at(self, rows: np.ndarray | None = None, untracked: bool = False) -> list[Any]:
        """The values at ``rows``, in that order; every value where ``rows`` is None. ``untracked``: as
        uint8 numpy arrays, not memoryviews (module docstring), where the column is one binary array."""
        if self._spans is None:  # several chunks, or not binary: Arrow's take
            if rows is None:
                column = self._column
            elif is_view(self._column.type):
                column = take_views(self._column, rows)
            else:
                column = self._column.take(int64_array(rows))
            return binary_views(column_as_array(column))
        views: list[Any] = spans_at(self._spans, rows, untracked)
        if self._valid is not None:
            for i in np.flatnonzero(~(self._valid if rows is None else self._valid[rows])).tolist():
                views[i] = None
        return views
