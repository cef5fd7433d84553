"""Numpy views of Arrow arrays without pyarrow's pandas bridge, and numpy arrays in Arrow's memory.

pyarrow's ``Array.to_numpy`` (and ``pa.array`` of a numpy array) initialise its pandas support on
first use, which imports pandas: ~0.3 s on the first read of every process (and of every torch
worker), on the path to the first batch. A null-free array of fixed-width numbers is one buffer,
so :func:`to_numpy` maps it directly; anything else goes to pyarrow as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

_NUMBER_TYPES = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
                 pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.uint64(): np.uint64,
                 pa.float16(): np.float16, pa.float32(): np.float32, pa.float64(): np.float64}


#: Arrow's buffers start on this boundary; TensorFlow takes a numpy array so aligned without a copy
ALIGNMENT = 64


#: from this size up, :func:`arrow_backed_empty` takes numpy's memory: jemalloc (Arrow's pool) serves
#: requests of 8 MiB or more from a dedicated arena that returns their pages to the system as soon as they
#: are freed, so every such array faulted in fresh pages (256x256 images, 64-row batches of 12 MiB: ~50
#: page faults and ~50 us of system time a row, 15% of the rows/s), while glibc keeps freed chunks up to
#: 32 MiB for the next request of that size (its mmap threshold rises to the largest size freed)
OVERSIZE_BYTES = 8 * 2**20


def arrow_backed_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised writable array aligned to :data:`ALIGNMENT` bytes, whose memory comes from Arrow's
    pool (jemalloc by default) below :data:`OVERSIZE_BYTES` and from numpy's at or above.

    Decoded image columns and the batches cut from them are large and short-lived; numpy's malloc
    hands back fresh pages each time for the smaller ones, and the page faults cost ~10% of decode
    throughput with two threads, while Arrow's pool keeps recently freed pages (benchmarks/reader.py
    measures it); for the oversize ones it is the other way round (:data:`OVERSIZE_BYTES`).
    TensorFlow copies every array that ``from_generator`` hands it unless it is 64-byte aligned,
    which numpy's allocations are not (1 ms per 786 KB batch on this machine): the large ones are
    cut from a slightly larger numpy buffer at an aligned offset.
    """
    size = math.prod(shape) * np.dtype(dtype).itemsize
    if size == 0:
        return np.empty(shape, dtype=dtype)
    if size >= OVERSIZE_BYTES:
        raw = np.empty(size + ALIGNMENT, np.uint8)
        start = -raw.ctypes.data % ALIGNMENT
        return raw[start:start + size].view(dtype).reshape(shape)
    return np.frombuffer(pa.allocate_buffer(size), dtype=dtype).reshape(shape)


def numpy_dtype(arrow_type: pa.DataType) -> np.dtype | None:
    """The numpy dtype :func:`to_numpy` gives a null-free array of ``arrow_type``; None where only
    pyarrow's own conversion knows."""
    if arrow_type in _NUMBER_TYPES:
        return np.dtype(_NUMBER_TYPES[arrow_type])
    if pa.types.is_boolean(arrow_type):
        return np.dtype(bool)
    if _is_text(arrow_type):
        return np.dtype(object)
    return None


def _is_text(arrow_type: pa.DataType) -> bool:
    return (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
            or pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type))


def to_numpy(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``array.to_numpy(zero_copy_only=False)`` without importing pandas for strings/bytes and
    null-free numbers (a zero-copy, read-only view) and booleans; pyarrow's conversion for the rest."""
    if isinstance(array, pa.ChunkedArray):
        if array.num_chunks == 1:
            return to_numpy(array.chunk(0))
        if array.num_chunks == 0:
            return array.to_numpy()
        return np.concatenate([to_numpy(chunk) for chunk in array.chunks])
    if _is_text(array.type):  # None where null, as pyarrow's conversion gives
        out = np.empty(len(array), dtype=object)
        out[:] = array.to_pylist()
        return out
    if array.null_count:
        return array.to_numpy(zero_copy_only=False)
    if pa.types.is_boolean(array.type):
        bits = array.buffers()[1]
        if bits is None:
            return np.empty(0, bool)
        unpacked = np.unpackbits(np.frombuffer(bits, np.uint8), bitorder="little")
        return unpacked[array.offset:array.offset + len(array)].astype(bool)
    dtype = _NUMBER_TYPES.get(array.type)
    if dtype is None:
        return array.to_numpy(zero_copy_only=False)
    data = array.buffers()[1]
    if data is None:  # an empty array may have no buffer
        return np.empty(0, dtype)
    return np.frombuffer(data, dtype, count=len(array), offset=array.offset * np.dtype(dtype).itemsize)


def without_validity(array: pa.Array) -> pa.Array:
    """A number or boolean array's values with its nulls forgotten (whatever its data buffer holds
    there), sharing the buffer: for callers that put their own null back, as ``fill_null`` would
    without its ``pa.scalar`` (which imports pandas)."""
    return pa.Array.from_buffers(array.type, len(array), [None, array.buffers()[1]], offset=array.offset)


#: bytes one Arrow binary or string array (int32 offsets) holds
MAX_BINARY = 2**31 - 1


def binary_array(values: Sequence[bytes | memoryview], arrow_type: pa.DataType = pa.binary()) -> pa.Array:
    """``pa.array(values, arrow_type)`` for bytes (``pa.binary()``; ``pa.string()`` for UTF-8 the
    caller vouches for), without importing pandas; at most :data:`MAX_BINARY` bytes in all."""
    lengths = np.fromiter(map(len, values), np.int64, len(values))
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > MAX_BINARY:
        raise ValueError(f"{offsets[-1]} bytes do not fit one Arrow array (at most {MAX_BINARY})")
    data = b"".join(values)
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(offsets.astype(np.int32)),
                                                           pa.py_buffer(data)])


def string_array(values: Sequence[str]) -> pa.Array:
    """``pa.array(values, pa.string())`` without importing pandas."""
    return binary_array([value.encode() for value in values], pa.string())


def numbers_array(values: np.ndarray, arrow_type: pa.DataType) -> pa.Array | None:
    """``pa.array(values, arrow_type)`` for a 1-D numpy array of that type's numbers (native order),
    sharing its memory and without importing pandas; None for anything else."""
    dtype = _NUMBER_TYPES.get(arrow_type)
    if dtype is None or values.ndim != 1 or values.dtype != dtype or not values.dtype.isnative:
        return None
    data = np.ascontiguousarray(values)
    return pa.Array.from_buffers(arrow_type, len(data), [None, pa.py_buffer(data)])


def int64_array(values: np.ndarray) -> pa.Array:
    """``pa.array(values, pa.int64())`` for a numpy array of indices, without importing pandas."""
    data = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])


def fixed_width_cells(array: pa.Array | pa.ChunkedArray) -> np.ndarray | None:
    """A null-free array of fixed-width values as a read-only ``(len, width)`` byte view of its
    data, one row per value; None for anything else (nulls at any level, booleans' bits,
    variable-width values, several chunks).

    Fixed-width: numbers, temporals, fixed-size binary and decimals, fixed-size lists of those, and
    extension types stored as one of them (a ``fixed_shape_tensor``). Rows gathered from such views,
    put back by :func:`from_fixed_width_cells`, are what Arrow's take and concatenation give,
    without their per-call costs (a sampler's batch takes from each of a dozen row groups).
    """
    if isinstance(array, pa.ChunkedArray):
        if array.num_chunks != 1:
            return None
        array = array.chunk(0)
    layout = _fixed_width_layout(array)
    if layout is None:
        return None
    data, start, width = layout
    cells = np.frombuffer(data, np.uint8, count=len(array) * width, offset=start).reshape(len(array), width)
    cells.flags.writeable = False  # the array's own memory (a cached row group's, say)
    return cells


def _fixed_width_layout(array: pa.Array) -> tuple[pa.Buffer, int, int] | None:
    """(data buffer, byte offset of the array's first value, bytes per value) of a null-free
    fixed-width array."""
    if array.null_count:
        return None
    kind = array.type
    if isinstance(kind, pa.BaseExtensionType):
        return _fixed_width_layout(array.storage)
    if pa.types.is_fixed_size_list(kind):
        inner = _fixed_width_layout(array.values)  # the whole child: the list's offset is applied here
        if inner is None:
            return None
        data, start, width = inner
        return data, start + array.offset * kind.list_size * width, kind.list_size * width
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_temporal(kind)
            or pa.types.is_fixed_size_binary(kind) or pa.types.is_decimal(kind)):
        return None
    data = array.buffers()[1]
    if data is None or kind.byte_width <= 0:
        return None
    return data, array.offset * kind.byte_width, kind.byte_width


def from_fixed_width_cells(arrow_type: pa.DataType, cells: np.ndarray) -> pa.Array:
    """The Arrow array of ``arrow_type`` whose values are the rows of ``cells`` (as
    :func:`fixed_width_cells` views them), sharing their memory."""
    data = np.ascontiguousarray(cells)
    return _from_values(arrow_type, len(data), pa.py_buffer(data))


def _from_values(arrow_type: pa.DataType, length: int, data: pa.Buffer) -> pa.Array:
    if isinstance(arrow_type, pa.BaseExtensionType):
        return pa.ExtensionArray.from_storage(arrow_type, _from_values(arrow_type.storage_type, length, data))
    if pa.types.is_fixed_size_list(arrow_type):
        values = _from_values(arrow_type.value_type, length * arrow_type.list_size, data)
        return pa.Array.from_buffers(arrow_type, length, [None], children=[values])
    return pa.Array.from_buffers(arrow_type, length, [None, data])


#: Arrow's view types (values referenced by 16-byte views), where this pyarrow has them (16 and later)
_VIEW_TYPES = {kind().id: kind() for kind in (getattr(pa, "binary_view", None), getattr(pa, "string_view", None))
               if kind is not None}


def is_view(arrow_type: pa.DataType) -> bool:
    """Arrow's ``binary_view`` and ``string_view``."""
    return arrow_type.id in _VIEW_TYPES


def is_binary_view(arrow_type: pa.DataType) -> bool:
    return is_view(arrow_type) and not pa.types.is_string_view(arrow_type)


def view_records(array: pa.Array) -> np.ndarray:
    """A view array's views as ``(len, 4)`` int32: length, 4-byte prefix, data buffer, offset (the
    last two for values of over 12 bytes; shorter ones are inline in the view's last 12 bytes)."""
    views = array.buffers()[1]
    count = 4 * (array.offset + len(array))
    return np.frombuffer(views, dtype=np.int32, count=count).reshape(-1, 4)[array.offset:]


def take_views(array: pa.Array | pa.ChunkedArray, rows: np.ndarray) -> pa.Array:
    """Arrow's ``take`` of a view array (pyarrow has no kernel for them): the views gathered,
    the values' buffers shared, not copied."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) and (rows.min() < 0 or rows.max() >= len(array)):
        raise IndexError(f"row {int(rows.max() if rows.max() >= len(array) else rows.min())} is out of range "
                         f"for an array of {len(array)}")
    taken = np.ascontiguousarray(view_records(array)[rows])
    validity = None
    if array.null_count:
        validity = pa.py_buffer(np.packbits(to_numpy(array.is_valid())[rows], bitorder="little"))
    return pa.Array.from_buffers(array.type, len(rows), [validity, pa.py_buffer(taken), *array.buffers()[2:]])


def take_table(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """``table.take(rows)``, view columns included (see :func:`take_views`)."""
    viewed = {i for i, kind in enumerate(table.schema.types) if is_view(kind)}
    if not viewed:
        return table.take(int64_array(rows))
    names = table.column_names
    kept = [name for i, name in enumerate(names) if i not in viewed]
    taken = dict(zip(kept, table.select(kept).take(int64_array(rows)).columns)) if kept else {}
    columns = [take_views(table.column(i), rows) if i in viewed else taken[name] for i, name in enumerate(names)]
    return pa.Table.from_arrays(columns, schema=table.schema)


def joined_dtype(parts: Sequence[np.ndarray]) -> np.dtype | None:
    """The dtype arrays of ``parts`` are joined in: numpy's, but for dates or durations of different units (row
    groups of Spark's INT96 timestamps come as nanoseconds or, holding a date past 1677-2262, microseconds: see
    store/int96.py) the finest unit that holds every value exactly, numpy's own cast wrapping a value it cannot
    hold to another date; None where no unit of theirs holds them all (joined as objects then)."""
    kinds = list(dict.fromkeys(p.dtype for p in parts))
    if len(kinds) == 1 or not all(k.kind == kinds[0].kind and k.kind in "mM" for k in kinds):
        return np.result_type(*parts)
    units = [k for k in kinds if np.datetime_data(k)[0] != "generic"]  # a null scalar's NaT has no unit
    finest_first = sorted(units, key=lambda k: sum(np.result_type(k, other) == k for other in units), reverse=True)
    for unit in finest_first:
        if all(_holds(p, unit) for p in parts):
            return unit
    return None


def _holds(values: np.ndarray, dtype: np.dtype) -> bool:
    """Whether every value of a date or duration array comes back from ``dtype`` as it was."""
    if values.dtype == dtype:
        return True
    if np.datetime_data(values.dtype)[0] == "generic":
        return bool(np.isnat(values).all())
    back = values.astype(dtype).astype(values.dtype)
    return bool(np.array_equal(back.view(np.int64), values.view(np.int64)))
