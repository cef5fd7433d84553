"""Reading ``.npy`` bytes (Petastorm's ``NdarrayCodec`` cells, WebDataset members) fast and without pickle.

Layout: the magic ``\\x93NUMPY``, the format version (two bytes), the header length (2 bytes in
version 1, 4 in versions 2 and 3), the header, then the data. The header is a Python dict literal
(``{'descr': '<f4', 'fortran_order': False, 'shape': (16,)}``) parsed with :func:`ast.literal_eval`.

The bytes may come from anywhere, so the header is checked as numpy's own reader checks it and
more: a header of at most :data:`MAX_HEADER_BYTES`, exactly the three keys, a shape of at most 64
non-negative ints, a bool ``fortran_order``, a sized dtype that needs no pickle (object arrays are
refused), and data exactly as long as the shape says. Anything else is a :class:`CodecError`
naming the byte offset in the ``.npy``, before an array is allocated. A column whose cells all
share one header decodes in one step.
"""

from __future__ import annotations

import ast
import functools
import io
import math
import zipfile

import numpy as np
import pyarrow as pa

from unihub.errors import CodecError
from unihub.schema.dtypes import fits

__all__ = ["MAX_HEADER_BYTES", "data_size", "header_mismatch", "load_npy", "load_npy_column", "load_npz_member",
           "parse_header"]

_MAGIC = b"\x93NUMPY"
#: numpy's ``np.load`` reads headers of up to 10,000 bytes by default; version 1 allows 65,535
MAX_HEADER_BYTES = 65_535
_MAX_DIMS = 64  # numpy's limit


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
    if len(view) < 10 or bytes(view[:6]) != _MAGIC:
        raise CodecError(f"not .npy bytes (starts with {bytes(view[:8])!r}, expected {_MAGIC!r})")
    major = view[6]
    if major == 1:
        header_len, start = int.from_bytes(view[8:10], "little"), 10
    elif major in (2, 3) and len(view) >= 12:
        header_len, start = int.from_bytes(view[8:12], "little"), 12
    elif major in (2, 3):
        raise CodecError(f".npy is truncated: {len(view)} bytes end inside the header length at byte 8")
    else:
        raise CodecError(f".npy format version {major} is not supported (byte 6)")
    if header_len > MAX_HEADER_BYTES:
        raise CodecError(f".npy header length {header_len:,} at byte 8 is over the limit of {MAX_HEADER_BYTES:,} "
                         "bytes (numpy writes a few hundred)")
    end = start + header_len
    if end > len(view):
        raise CodecError(f".npy header at byte {start} claims {header_len} bytes but the .npy has "
                         f"{len(view) - start} after byte {start} (truncated)")
    text = bytes(view[start:end]).decode("utf-8" if major == 3 else "latin-1", "replace")
    try:
        header = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise CodecError(f"malformed .npy header at byte {start} ({type(exc).__name__}): {text[:80]!r}") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise CodecError(f".npy header at byte {start} is not a dict of exactly 'descr', 'fortran_order' and "
                         f"'shape': {text[:80]!r}")
    return _dtype(header["descr"], start), _shape(header["shape"], start), _fortran(header["fortran_order"], start), end


def _dtype(descr: object, start: int) -> np.dtype:
    try:
        dtype = np.dtype(descr)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError, MemoryError, RecursionError, KeyError, IndexError) as exc:
        raise CodecError(f".npy header at byte {start}: descr {str(descr)[:60]!r} is not a numpy dtype "
                         f"({str(exc)[:80]})") from None
    if dtype.hasobject:
        raise CodecError(".npy holds Python objects, which would need pickle; refused")
    if dtype.itemsize == 0 or dtype.subdtype is not None:
        raise CodecError(f".npy header at byte {start}: descr {str(descr)[:60]!r} is a dtype np.save never writes "
                         f"({'no size' if dtype.itemsize == 0 else 'a sub-array'})")
    return dtype


def _shape(shape: object, start: int) -> tuple[int, ...]:
    if not isinstance(shape, tuple) or len(shape) > _MAX_DIMS or \
            not all(type(d) is int and d >= 0 for d in shape):
        raise CodecError(f".npy header at byte {start}: shape {str(shape)[:60]} is not a tuple of at most "
                         f"{_MAX_DIMS} non-negative ints")
    return shape


def _fortran(fortran: object, start: int) -> bool:
    if not isinstance(fortran, bool):
        raise CodecError(f".npy header at byte {start}: fortran_order {repr(fortran)[:20]} is not True or False")
    return fortran


def data_size(dtype: np.dtype, shape: tuple[int, ...]) -> int:
    """Bytes the data of an array of ``shape`` and ``dtype`` takes (exact: Python ints do not overflow)."""
    return math.prod(shape) * dtype.itemsize


def header_mismatch(dtype: np.dtype, shape: tuple[int, ...], expected_dtype: np.dtype,
                    expected_shape: tuple[int | None, ...]) -> str | None:
    """Why an array of ``dtype`` and ``shape`` is no value of a field of ``expected_dtype`` (``object``: any)
    and ``expected_shape`` (``None`` dims free), or None when it is. Byte order does not count, and a
    generic datetime64/timedelta64 field takes any unit."""
    if expected_dtype != dtype and expected_dtype.kind != "O":
        native = dtype.newbyteorder("=") if dtype.byteorder not in "=|" else dtype
        if not fits(native, expected_dtype):
            return f"the stored array is {dtype}, the field is {expected_dtype}"
    if len(shape) != len(expected_shape) or any(e is not None and e != d for d, e in zip(shape, expected_shape)):
        return f"the stored array has shape {shape}, the field {expected_shape}"
    return None


def load_npy(blob: bytes | memoryview, *, expected_dtype: np.dtype | None = None,
             expected_shape: tuple[int | None, ...] | None = None) -> np.ndarray:
    """One ``.npy`` blob to an array (a copy, so it outlives the buffer).

    With ``expected_dtype`` and ``expected_shape`` (a field's), a header that contradicts them is
    refused (see :func:`header_mismatch`) before any data is copied.
    """
    dtype, shape, fortran, offset = parse_header(blob)
    _check_size(dtype, shape, len(blob) - offset, offset)
    _check_expected(dtype, shape, expected_dtype, expected_shape)
    flat = np.frombuffer(blob, dtype=dtype, count=math.prod(shape), offset=offset)
    array = flat.reshape(shape, order="F" if fortran else "C")
    return array.copy()


def _check_expected(dtype: np.dtype, shape: tuple[int, ...], expected_dtype: np.dtype | None,
                    expected_shape: tuple[int | None, ...] | None) -> None:
    if expected_dtype is not None and expected_shape is not None:
        reason = header_mismatch(dtype, shape, expected_dtype, expected_shape)
        if reason is not None:
            raise CodecError(reason)


def _check_size(dtype: np.dtype, shape: tuple[int, ...], found: int, offset: int) -> None:
    expected = data_size(dtype, shape)
    if found != expected:
        state = "truncated" if found < expected else "followed by other bytes"
        raise CodecError(f".npy data at byte {offset} is {state}: shape {shape} of {dtype} is {expected:,} bytes, "
                         f"found {found:,}")


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
    if length - header_end != data_size(dtype, shape):
        return None
    body = np.ascontiguousarray(data[:, header_end:])
    return body.view(dtype).reshape((n, *shape))


def load_npz_member(blob: bytes | memoryview, name: str = "arr", *, expected_dtype: np.dtype | None = None,
                    expected_shape: tuple[int | None, ...] | None = None) -> np.ndarray:
    """The array ``name`` of ``np.savez``/``np.savez_compressed`` bytes, as ``np.load(...)[name]`` without pickle.

    The member's header is checked (and against ``expected_dtype``/``expected_shape`` when given)
    before its data is inflated, and the data must be exactly as long as the header says.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as archive:
            try:
                info = archive.getinfo(f"{name}.npy")
            except KeyError:
                raise CodecError(f"the .npz holds no array {name!r} (members: {archive.namelist()[:8]})") from None
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):  # what np.savez(_compressed) write
                raise CodecError(f"the .npz member {info.filename!r} is compressed by method {info.compress_type}, not "
                                 "stored or deflated as numpy writes it: bzip2 or LZMA inflate a few bytes to any size")
            with archive.open(info) as member:
                head = member.read(12)
                if len(head) >= 12 and head[:6] == _MAGIC:
                    header_len = int.from_bytes(head[8:10 if head[6] == 1 else 12], "little")
                    head += member.read(min(header_len, MAX_HEADER_BYTES) + 2)
                dtype, shape, fortran, offset = parse_header(head)
                _check_expected(dtype, shape, expected_dtype, expected_shape)
                _check_size(dtype, shape, info.file_size - offset, offset)
                data = bytearray(head[offset:])  # grows with what inflates, not with what the zip declares
                data += member.read(info.file_size - len(head))
    except CodecError:
        raise
    except Exception as exc:  # zipfile, zlib, bz2, lzma, an encrypted member: all say "not readable"
        raise CodecError(f"not a readable .npz ({type(exc).__name__}: {str(exc)[:100]})") from None
    _check_size(dtype, shape, len(data), offset)
    return np.frombuffer(data, dtype=dtype, count=math.prod(shape)).reshape(shape, order="F" if fortran else "C")
