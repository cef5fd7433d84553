"""Reading ``.npy`` bytes (Petastorm's ``NdarrayCodec`` cells) fast and without pickle.

The header is a Python dict literal (``{'descr': '<f4', 'fortran_order': False,
'shape': (16,)}``) parsed with :func:`ast.literal_eval`; object arrays, which would need
pickle, are refused. A column whose cells all share one header decodes in one step.
"""

from __future__ import annotations

import ast
import functools

import numpy as np
import pyarrow as pa

from unihub.errors import CodecError

_MAGIC = b"\x93NUMPY"


def parse_header(blob: memoryview | bytes) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """``(dtype, shape, fortran_order, data_offset)`` of one ``.npy`` blob (headers are cached)."""
    view = memoryview(blob)
    if len(view) >= 10 and view[6] == 1:
        end = 10 + int.from_bytes(view[8:10], "little")
        if end <= len(view):
            return _parse_header_cached(bytes(view[:end]))
    return _parse_header(view)


@functools.lru_cache(maxsize=1024)
def _parse_header_cached(header: bytes) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """Columns repeat a handful of headers (one per shape): parse each once."""
    return _parse_header(memoryview(header))


def _parse_header(view: memoryview) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    if bytes(view[:6]) != _MAGIC or len(view) < 10:
        raise CodecError(f"not .npy bytes (starts with {bytes(view[:8])!r}, expected {_MAGIC!r})")
    major = view[6]
    if major == 1:
        header_len, start = int.from_bytes(view[8:10], "little"), 10
    elif major in (2, 3):
        header_len, start = int.from_bytes(view[8:12], "little"), 12
    else:
        raise CodecError(f".npy format version {major} is not supported")
    end = start + header_len
    if end > len(view):
        raise CodecError(f".npy header claims {header_len} bytes but the blob has {len(view) - start}")
    try:
        header = ast.literal_eval(bytes(view[start:end]).decode("latin1"))
        dtype = np.dtype(header["descr"])
        shape = tuple(int(d) for d in header["shape"])
        fortran = bool(header["fortran_order"])
    except (ValueError, SyntaxError, KeyError, TypeError) as exc:
        raise CodecError(f"malformed .npy header: {exc}") from exc
    if dtype.hasobject:
        raise CodecError(".npy holds Python objects, which would need pickle; refused")
    return dtype, shape, fortran, end


def load_npy(blob: bytes | memoryview) -> np.ndarray:
    """One ``.npy`` blob to an array (a copy, so it outlives the buffer)."""
    dtype, shape, fortran, offset = parse_header(blob)
    count = int(np.prod(shape)) if shape else 1
    if len(blob) - offset < count * dtype.itemsize:
        raise CodecError(f".npy data is truncated: expected {count * dtype.itemsize} bytes, "
                         f"found {len(blob) - offset}")
    flat = np.frombuffer(blob, dtype=dtype, count=count, offset=offset)
    array = flat.reshape(shape, order="F" if fortran else "C")
    return array.copy()


def load_npy_column(array: pa.Array) -> np.ndarray | None:
    """Decode a null-free binary column of same-header ``.npy`` cells as one ``(n, *shape)`` array.

    Returns None when the cells differ in length or header (the caller then goes cell by cell).
    """
    n = len(array)
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int32, count=n + 1, offset=array.offset * 4)
    lengths = np.diff(offsets)
    if n == 0 or not np.all(lengths == lengths[0]) or lengths[0] < 10:
        return None
    length = int(lengths[0])
    data = np.frombuffer(buffers[2], dtype=np.uint8, count=n * length, offset=int(offsets[0])).reshape(n, length)
    dtype, shape, fortran, header_end = parse_header(data[0].tobytes()[:length])
    if fortran and len(shape) > 1:
        return None
    if not np.array_equal(data[:, :header_end], np.broadcast_to(data[0, :header_end], (n, header_end))):
        return None
    count = int(np.prod(shape)) if shape else 1
    if length - header_end != count * dtype.itemsize:
        return None
    body = np.ascontiguousarray(data[:, header_end:])
    return body.view(dtype).reshape((n, *shape))
