"""``tensorflow.TensorProto`` wire format (what ``tf.io.serialize_tensor`` writes): parse and serialize.

A TFRecord file of serialized tensors holds one ``TensorProto`` per record::

    dtype = 1 (DataType enum), tensor_shape = 2 (TensorShapeProto: dim = 2 {size = 1, name = 2}),
    version_number = 3, tensor_content = 4 (the values' raw little-endian bytes), or typed values:
    float_val = 5, double_val = 6, int_val = 7, string_val = 8, int64_val = 10, bool_val = 11,
    half_val = 13, uint32_val = 16, uint64_val = 17

Typed values follow TensorFlow's ``tf.make_ndarray``: no values is all zeros, fewer values than
the shape holds repeat the last one. ``tf.io.serialize_tensor`` writes numbers as ``tensor_content``;
``tf.make_tensor_proto`` writes a tensor of one value, and every bool and uint16 tensor, as typed
values (:data:`ENCODINGS`; an export writes either). Data types without a numpy or Arrow equivalent (complex,
bfloat16, quantized, resource, variant) are refused by name, never approximated.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from unihub.formats.tfrecord.example import _packed_varints, _varint, _varint_bytes

#: TensorFlow DataType enum -> numpy dtype (``object`` holds bytes: DT_STRING)
DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<f4"), 2: np.dtype("<f8"), 3: np.dtype("<i4"), 4: np.dtype("u1"), 5: np.dtype("<i2"),
    6: np.dtype("i1"), 7: np.dtype(object), 9: np.dtype("<i8"), 10: np.dtype("?"), 17: np.dtype("<u2"),
    19: np.dtype("<f2"), 22: np.dtype("<u4"), 23: np.dtype("<u8"),
}
_UNSUPPORTED = {8: "complex64", 11: "qint8", 12: "quint8", 13: "qint32", 14: "bfloat16", 15: "qint16",
                16: "quint16", 18: "complex128", 20: "resource", 21: "variant"}
_BY_NUMPY = {dtype: number for number, dtype in DTYPES.items() if dtype.kind != "O"}
#: typed value fields: number -> (wire type when not packed, how values are stored)
_VALUE_FIELDS = {5: "f4", 6: "f8", 7: "varint", 10: "varint", 11: "varint", 13: "varint", 16: "varint",
                 17: "varint"}
_KNOWN = {1, 2, 3, 4, 8, *_VALUE_FIELDS}
#: how a TensorProto's numbers are written: as ``tf.io.serialize_tensor`` or as ``tf.make_tensor_proto`` does
ENCODINGS = ("serialize_tensor", "make_tensor_proto")
#: numpy dtype -> the typed value field ``tf.make_tensor_proto`` writes it in (its number's key bytes)
_TYPED_KEYS = {np.dtype("<f4"): b"\x2a", np.dtype("<f8"): b"\x32", np.dtype("<i4"): b"\x3a", np.dtype("u1"): b"\x3a",
               np.dtype("<i2"): b"\x3a", np.dtype("i1"): b"\x3a", np.dtype("<u2"): b"\x3a", np.dtype("<i8"): b"\x52",
               np.dtype("?"): b"\x5a", np.dtype("<f2"): b"\x6a", np.dtype("<u4"): b"\x82\x01",
               np.dtype("<u8"): b"\x8a\x01"}
#: the most bytes a tensor may grow to when its typed values are padded to its shape (``tf.make_ndarray``
#: repeats the last value): a dozen bytes can claim a shape of 2**40 values, and would take all memory
MAX_PADDED_BYTES = 256 << 20


class TensorProtoError(ValueError):
    """Bytes that are not a TensorProto unihub can store exactly."""


def dtype_name(number: int) -> str:
    """``DT_*`` name of a DataType number, for messages."""
    if number in DTYPES:
        return "string" if DTYPES[number].kind == "O" else DTYPES[number].name
    return _UNSUPPORTED.get(number, f"DataType {number}")


def _fields(buf: bytes) -> list[tuple[int, int, Any]]:
    """``(field number, wire type, value)`` of a message: ints for varints, ``(start, end)`` for the rest."""
    out: list[tuple[int, int, Any]] = []
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            out.append((number, wire, value))
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > end:
                raise TensorProtoError("a field runs past the end of the message")
            out.append((number, wire, (pos, pos + size)))
            pos += size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if pos + width > end:
                raise TensorProtoError("a field runs past the end of the message")
            out.append((number, wire, (pos, pos + width)))
            pos += width
        else:
            raise TensorProtoError(f"unsupported protobuf wire type {wire}")
    return out


def _shape(buf: bytes, start: int, end: int) -> tuple[int, ...]:
    dims = []
    for number, wire, value in _fields(buf[start:end]):
        if number == 2 and wire == 2:
            size = 0
            for n2, w2, v2 in _fields(buf[start + value[0]:start + value[1]]):
                if n2 == 1 and w2 == 0:
                    size = v2 - (1 << 64) if v2 >> 63 else v2
            if size < 0:
                raise TensorProtoError("the shape has an unknown dimension (-1): not a concrete tensor")
            dims.append(size)
        elif number == 3 and wire == 0 and value:
            raise TensorProtoError("the shape has an unknown rank: not a concrete tensor")
    return tuple(dims)


def parse_tensor(buf: bytes) -> np.ndarray:
    """A serialized TensorProto -> the numpy array ``tf.make_ndarray`` gives (bytes as an object array).

    Raises :class:`TensorProtoError` for malformed bytes (wherever they end: in the message, its shape or
    its packed values), unknown fields, unsupported types and shapes that padding would blow past
    :data:`MAX_PADDED_BYTES`.
    """
    try:
        return _parse_tensor(buf)
    except TensorProtoError:
        raise
    except IndexError:  # a varint cut short, in the message, its shape or its dimensions
        raise TensorProtoError("malformed TensorProto: it ends inside a varint") from None
    except (ValueError, OverflowError) as exc:  # an over-long varint, a shape numpy refuses
        raise TensorProtoError(f"malformed TensorProto: {exc}") from None


def _parse_tensor(buf: bytes) -> np.ndarray:
    fields = _fields(buf)
    dtype_number = _dtype_number(fields)
    dtype = DTYPES[dtype_number]
    shape = next((_shape(buf, *v) for n, w, v in fields if n == 2 and w == 2), ())
    count = math.prod(shape)
    content = [v for n, w, v in fields if n == 4 and w == 2]
    if content and dtype.kind != "O":
        return _from_content(buf, content[-1], shape, dtype)
    check_padding(shape, dtype_number, len(buf))
    if dtype.kind == "O":
        array = _strings(buf, fields, count)
    else:
        array = _typed_values(buf, fields, dtype, dtype_number, count)
    if array.size != count:
        raise TensorProtoError(f"{array.size} values do not fill shape {shape}")
    return array.reshape(shape)


def _dtype_number(fields: list[tuple[int, int, Any]]) -> int:
    """The tensor's dtype number (field 1); TensorProtoError for a message that is not a TensorProto
    unihub can store (unknown fields, no dtype or an unknown one, a dtype numpy/Arrow cannot hold)."""
    dtype_number = next((v for n, w, v in fields if n == 1 and w == 0), 0)
    if dtype_number in _UNSUPPORTED:
        raise TensorProtoError(f"a tensor of dtype {dtype_name(dtype_number)}, which has no exact numpy/Arrow "
                               "equivalent")
    unknown = sorted({n for n, _, _ in fields if n not in _KNOWN})
    if unknown or dtype_number not in DTYPES:
        raise TensorProtoError(f"not a TensorProto: unknown field(s) {unknown}" if unknown else
                               f"not a TensorProto: dtype {dtype_number}" if dtype_number else
                               "not a TensorProto: it has no dtype")
    return int(dtype_number)


def _from_content(buf: bytes, bounds: tuple[int, int], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The tensor held whole in ``tensor_content`` (``buf[bounds[0]:bounds[1]]``), which must fill ``shape``."""
    a, b = bounds
    count = math.prod(shape)
    if (b - a) != count * dtype.itemsize:
        raise TensorProtoError(f"tensor_content holds {b - a} bytes, shape {shape} of {dtype.name} needs "
                               f"{count * dtype.itemsize}")
    return np.frombuffer(buf, dtype, count, a).copy().reshape(shape)


def _strings(buf: bytes, fields: list[tuple[int, int, Any]], count: int) -> np.ndarray:
    """The ``string_val`` values as an object array of ``count`` (padded with the last, as TF pads)."""
    strings = [buf[v[0]:v[1]] for n, w, v in fields if n == 8 and w == 2]
    array = np.empty(max(count, len(strings)), dtype=object)
    array[:len(strings)] = strings
    array[len(strings):] = strings[-1] if strings else b""
    return array


def check_padding(shape: tuple[int, ...], dtype_number: int, size: int) -> None:
    """Refuse a TensorProto of ``size`` bytes whose typed values, padded to ``shape`` as ``tf.make_ndarray`` pads
    them, would take more than :data:`MAX_PADDED_BYTES` (a few bytes can claim 2**40 values)."""
    itemsize = DTYPES[dtype_number].itemsize if dtype_number in DTYPES else 16  # complex128 at most
    needed = math.prod(shape) * itemsize
    if needed > max(MAX_PADDED_BYTES, size):
        raise TensorProtoError(f"shape {shape} of {dtype_name(dtype_number)} needs {needed} bytes once its {size} "
                               f"bytes are padded as tf.make_ndarray pads them; unihub pads to {MAX_PADDED_BYTES} "
                               "bytes at most")


def _typed_values(buf: bytes, fields: list[tuple[int, int, Any]], dtype: np.dtype, dtype_number: int,
                  count: int) -> np.ndarray:
    """The ``*_val`` values (packed or not) as ``dtype``, padded as ``tf.make_ndarray`` pads them."""
    parts: list[np.ndarray] = []
    for number, wire, value in fields:
        kind = _VALUE_FIELDS.get(number)
        if kind is None:
            continue
        if kind in ("f4", "f8") and wire in (1, 2, 5):
            parts.append(np.frombuffer(buf[value[0]:value[1]], "<" + kind))
        elif kind == "varint" and wire == 2:
            parts.append(np.asarray(_packed_varints(buf, *value), np.int64))
        elif kind == "varint" and wire == 0:
            parts.append(np.array([value - (1 << 64) if value >> 63 else value], np.int64))
    raw = np.concatenate(parts) if parts else np.zeros(0)
    if dtype_number == 19:  # half_val holds the float16 bits in int32 slots
        values = raw.astype(np.uint16).view(np.float16)
    elif dtype_number == 23:
        values = raw.astype(np.int64).view(np.uint64)
    else:
        values = raw.astype(dtype)
    if values.size == 0:
        return np.zeros(count, dtype)
    if values.size < count:
        values = np.concatenate([values, np.repeat(values[-1:], count - values.size)])
    return values


def encode_tensor(array: Any, encoding: str = "serialize_tensor") -> bytes:
    """``array`` serialized as ``tf.io.serialize_tensor`` serializes it (bytes/str arrays as string_val), or
    with ``encoding="make_tensor_proto"`` as ``tf.make_tensor_proto(array).SerializeToString()`` does."""
    array = np.asarray(array)
    if array.dtype.kind in "OSU":
        number = 7
    else:
        number = _BY_NUMPY.get(array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype, 0)
        if not number:
            raise TensorProtoError(f"a TensorProto cannot hold dtype {array.dtype}")
    dims = b"".join(b"\x12" + _ld_bytes(b"\x08" + _varint_bytes(d) if d else b"") for d in array.shape)
    out = b"\x08" + _varint_bytes(number) + b"\x12" + _ld_bytes(dims)
    if number == 7:
        for item in array.ravel().tolist():
            data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
            out += b"\x42" + _ld_bytes(data)
        return out
    little = np.ascontiguousarray(array, array.dtype.newbyteorder("<"))
    if encoding == "make_tensor_proto" and little.size and (little.size == 1 or little.dtype.kind == "b"
                                                            or little.dtype == np.dtype("<u2")):
        return out + _TYPED_KEYS[little.dtype] + _ld_bytes(_typed_payload(little.reshape(-1)))
    content = little.tobytes()
    return out + b"\x22" + _ld_bytes(content) if content else out


def _typed_payload(values: np.ndarray) -> bytes:
    """The packed typed values of ``values`` (little-endian): floats as themselves, float16 as its bits
    and every integer as a varint (negative ones in ten bytes, as protobuf writes an int32 or int64)."""
    if values.dtype.kind == "f" and values.itemsize > 2:
        return values.tobytes()
    numbers = values.view(np.uint16) if values.dtype.kind == "f" else values
    return b"".join(_varint_bytes(int(v)) for v in numbers.tolist())


def _ld_bytes(payload: bytes) -> bytes:
    return _varint_bytes(len(payload)) + payload


def looks_like_tensor(buf: bytes) -> bool:
    """True when ``buf`` parses as a TensorProto unihub can store (the payload detection's test)."""
    try:
        parse_tensor(buf)
    except TensorProtoError:
        return False
    return bool(buf) and buf[0] == 0x08
