"""``tf.train.Example`` protobuf wire format: parse and serialize, without protobuf.

``Example{features: Features{map<string, Feature>}}``, each ``Feature`` one of ``bytes_list``,
``float_list`` (packed float32) or ``int64_list`` (packed varints). TFRecord framing lives in
:mod:`unihub.formats.tfrecord.format`.

Why a codec of our own: TensorFlow and the ``tfrecord`` package both register the protobuf
messages ``tensorflow.Example`` & co., and one process cannot import both (``duplicate symbol
'tensorflow.BytesList'``). The wire format is small, so it is read and written here with numpy,
which works with either, both or neither installed. Timed against protobuf's own classes (from a
private ``DescriptorPool``): see :mod:`unihub.formats.tfrecord.parsers`.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["Feature", "NoFeatures", "NotAnExample", "encode_entries", "encode_example", "encode_feature",
           "encode_scalar", "ld", "message_fields", "parse_example", "parse_feature", "parse_features"]

Feature = tuple[str | None, Any]  # ("bytes", [b"..."]) | ("float", f32 array) | ("int64", i64 array)


class NoFeatures(dict[str, Feature]):
    """What :func:`parse_example` gives for an Example without a features field (``b''``, as TensorFlow
    serializes ``tf.train.Example()``): no features, like an empty features field (``0a 00``), but other
    bytes, which an export keeps apart (the ``empty_context`` write option)."""


class NotAnExample(ValueError):
    """A well-formed record that is another message: a SequenceExample, a TensorProto, other bytes."""


def describe_other(number: int, wire: int) -> str:
    """Why a record whose top level holds field ``number`` (of ``wire`` type) is not an Example."""
    if number == 2 and wire == 2:
        return ("a tf.train.SequenceExample (it has feature_lists), among tf.train.Examples: a dataset mixing "
                "the two cannot be converted as one; convert them apart, or pass --option "
                "payload=sequence_example if every record is a SequenceExample")
    if number == 1 and wire == 0:
        return ("not a tf.train.Example: it starts like a TensorProto (tf.io.serialize_tensor), among "
                "tf.train.Examples")
    return f"not a tf.train.Example: it holds protobuf field {number} (wire type {wire}), which Examples do not have"


# -- parsing ---------------------------------------------------------------------------------
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _skip(buf: bytes, pos: int, key: int) -> int:
    """The position after the value of a field (tag ``key``) that is not read."""
    wire = key & 7
    if wire == 0:
        return _varint(buf, pos)[1]
    if wire == 2:
        size, pos = _varint(buf, pos)
        return pos + size
    if wire in (1, 5):
        return pos + (8 if wire == 1 else 4)
    raise ValueError(f"unsupported protobuf wire type {wire}")


def _field(buf: bytes, pos: int) -> tuple[int, int, int]:
    """``(key, start, stop)`` of the field at ``pos``: its value's bounds when it is
    length-delimited, else ``start == stop``, the position after the value (skipped)."""
    key = buf[pos]
    pos += 1
    if key >= 0x80:
        key, pos = _varint(buf, pos - 1)
    if key & 7 != 2:
        pos = _skip(buf, pos, key)
        return key, pos, pos
    size = buf[pos]
    pos += 1
    if size >= 0x80:
        size, pos = _varint(buf, pos - 1)
    return key, pos, pos + size


def _packed_varints(buf: bytes | mmap.mmap, start: int, end: int) -> np.ndarray | list[int]:
    chunk = buf[start:end]
    if not chunk or max(chunk) < 0x80:  # every value below 128: one byte each
        return list(chunk) if len(chunk) <= 16 else np.frombuffer(chunk, np.uint8).astype(np.int64)
    if chunk[-1] & 0x80:
        raise ValueError("truncated varint")
    if len(chunk) <= 64:  # a few values: a Python loop beats numpy's fixed costs
        values = []
        value = shift = 0
        for b in chunk:
            value |= (b & 0x7F) << shift
            if b < 0x80:
                value &= 0xFFFFFFFFFFFFFFFF  # what the uint64 arithmetic below keeps
                values.append(value - (1 << 64) if value >> 63 else value)
                value = shift = 0
            else:
                shift += 7
                if shift > 63:  # an over-long varint: leave it to the general path below
                    break
        else:
            return np.array(values, np.int64)
    raw = np.frombuffer(chunk, np.uint8)
    ends = np.flatnonzero(raw < 0x80)
    starts = np.concatenate(([0], ends[:-1] + 1))
    position = np.arange(len(raw)) - np.repeat(starts, ends - starts + 1)
    parts = (raw & 0x7F).astype(np.uint64) << (7 * position).astype(np.uint64)
    return np.add.reduceat(parts, starts).view(np.int64)


def _parse_list(buf: bytes, key: int, pos: int, end: int) -> Any:
    """The values of a BytesList (``key`` 0x0A), FloatList (0x12) or Int64List (0x1A)."""
    if pos < end and buf[pos] == 0x0A:  # the usual list: one bytes value or packed run, alone
        size = buf[pos + 1]
        start = pos + 2
        if size >= 0x80:  # two bytes inline, longer ones by _varint
            if buf[start] < 0x80:
                size = (size & 0x7F) | buf[start] << 7
                start += 1
            else:
                size, start = _varint(buf, start - 1)
        if start + size == end:
            if key == 0x0A:
                return "bytes", [buf[start:end]]
            if key == 0x12:
                return "float", np.frombuffer(buf, "<f4", size // 4, start)
            if size == 1 and end <= len(buf) and buf[start] < 0x80:  # one small int (a label)
                return "int64", [buf[start]]
            return "int64", _packed_varints(buf, start, end)
    return _joined(key, _list_items(buf, key, pos, end))


def _list_items(buf: bytes, key: int, pos: int, end: int) -> list[Any]:
    """The items of a list in any other layout: several values or packed runs, unpacked values
    (proto2 writers), unknown fields (skipped); one item per value or run."""
    items: list[Any] = []
    while pos < end:
        tag = buf[pos]
        pos += 1
        if tag == 0x0A:  # a bytes value, or a packed run of floats / varints
            size = buf[pos]
            pos += 1
            if size >= 0x80:
                size, pos = _varint(buf, pos - 1)
            items.append(_list_item(buf, key, pos, pos + size))
            pos += size
        elif tag == 0x0D and key == 0x12:  # an unpacked float
            items.append(np.frombuffer(buf, "<f4", 1, pos))
            pos += 4
        elif tag == 0x08 and key == 0x1A:  # an unpacked varint
            value, pos = _varint(buf, pos)
            items.append([value - (1 << 64) if value >> 63 else value])
        else:
            pos = _skip(buf, pos, tag if tag < 0x80 else _varint(buf, pos - 1)[0])
    if pos != end:
        raise ValueError("a list runs past the end of its feature")
    return items


def _list_item(buf: bytes, key: int, start: int, end: int) -> Any:
    """One length-delimited item of a list: a bytes value, or a packed run of floats or varints."""
    if key == 0x0A:
        return buf[start:end]
    if key == 0x12:
        return np.frombuffer(buf, "<f4", (end - start) // 4, start)
    return _packed_varints(buf, start, end)


def _joined(key: int, items: list[Any]) -> Any:
    """``(kind, values)`` of a list from its items: the bytes values, or the runs and values end to end."""
    if key == 0x0A:
        return "bytes", items
    kind, dtype = ("float", np.float32) if key == 0x12 else ("int64", np.int64)
    if len(items) == 1:
        return kind, items[0]
    return kind, np.concatenate([np.asarray(i, dtype) for i in items]) if items else np.empty(0, dtype)


# Each loop below walks the fields of one message, written out rather than shared through a
# generator because this runs once per record: ``key & 0x87 == 2`` is the usual one-byte tag
# of a length-delimited field, read inline; anything else goes through _field. Fields other
# than the ones read are passed over; a field running past its message's end is an error.
def parse_example(buf: bytes) -> dict[str, Feature]:
    """A serialized ``tf.train.Example`` -> ``{name: (kind, values)}``; ValueError if malformed.

    ``values``: a list of bytes, or a sequence (numpy array or list) of float32 / int64. A record without
    a features field gives a :class:`NoFeatures` (empty).
    """
    out: dict[str, Feature] = {}
    bare = True
    try:
        pos, end = 0, len(buf)
        while pos < end:  # Example
            key = buf[pos]
            if key & 0x87 == 2:
                size = buf[pos + 1]
                pos += 2
                if size >= 0x80:  # two bytes inline, longer ones by _varint
                    if buf[pos] < 0x80:
                        size = (size & 0x7F) | buf[pos] << 7
                        pos += 1
                    else:
                        size, pos = _varint(buf, pos - 1)
                stop = pos + size
            else:
                key, pos, stop = _field(buf, pos)
            if key == 0x0A:  # Example.features
                _parse_features(buf, pos, stop, out)
                bare = False
            elif stop <= end:  # another message (SequenceExample, TensorProto ...): its data would be lost
                raise NotAnExample(describe_other(key >> 3, key & 7))
            pos = stop
        if pos != end:
            raise ValueError("a field runs past the end of its message")
    except NotAnExample:
        raise
    except (IndexError, ValueError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
        raise ValueError(f"malformed tf.train.Example: {exc}") from exc
    return NoFeatures() if bare else out


def parse_features(buf: bytes, pos: int, end: int) -> dict[str, Feature]:
    """The ``Features`` message in ``buf[pos:end]`` (an Example's, a SequenceExample's context)."""
    out: dict[str, Feature] = {}
    _parse_features(buf, pos, end, out)
    return out


def message_fields(buf: bytes, pos: int = 0, end: int | None = None) -> list[tuple[int, int, int, int]]:
    """``(field number, wire type, start, stop)`` of each top-level field of a message: ``buf[start:stop]``
    is a length-delimited field's payload; for other wire types ``start == stop`` (value skipped)."""
    end = len(buf) if end is None else end
    out = []
    while pos < end:
        key, start, stop = _field(buf, pos)
        if stop > end:
            raise ValueError("a field runs past the end of its message")
        out.append((key >> 3, key & 7, start, stop))
        pos = stop
    return out


def _parse_features(buf: bytes, pos: int, end: int, out: dict[str, Feature]) -> None:
    """The ``Features`` message in ``buf[pos:end]`` into ``out``."""
    while pos < end:
        key = buf[pos]
        if key & 0x87 == 2:
            size = buf[pos + 1]
            pos += 2
            if size >= 0x80:  # two bytes inline, longer ones by _varint
                if buf[pos] < 0x80:
                    size = (size & 0x7F) | buf[pos] << 7
                    pos += 1
                else:
                    size, pos = _varint(buf, pos - 1)
            stop = pos + size
        else:
            key, pos, stop = _field(buf, pos)
        if key == 0x0A:  # Features.feature map entry: key (name) = 1, value (Feature) = 2
            name = ""
            feature: Feature = (None, [])
            pos3 = pos
            while pos3 < stop:
                key3 = buf[pos3]
                if key3 & 0x87 == 2:
                    size = buf[pos3 + 1]
                    pos3 += 2
                    if size >= 0x80:  # two bytes inline, longer ones by _varint
                        if buf[pos3] < 0x80:
                            size = (size & 0x7F) | buf[pos3] << 7
                            pos3 += 1
                        else:
                            size, pos3 = _varint(buf, pos3 - 1)
                    stop3 = pos3 + size
                else:
                    key3, pos3, stop3 = _field(buf, pos3)
                if key3 == 0x0A:
                    name = buf[pos3:stop3].decode("utf-8")
                elif key3 == 0x12:  # Feature: bytes_list = 1, float_list = 2, int64_list = 3
                    feature = parse_feature(buf, pos3, stop3)
                pos3 = stop3
            if pos3 != stop:
                raise ValueError("a field runs past the end of its message")
            out[name] = feature
        pos = stop
    if pos != end:
        raise ValueError("a field runs past the end of its message")


def parse_feature(buf: bytes, pos: int, end: int) -> Feature:
    """The ``Feature`` message in ``buf[pos:end]``: ``(kind, values)``, ``(None, [])`` when no list is set."""
    feature: Feature = (None, [])
    while pos < end:
        key = buf[pos]
        if key & 0x87 == 2:
            size = buf[pos + 1]
            pos += 2
            if size >= 0x80:  # two bytes inline, longer ones by _varint
                if buf[pos] < 0x80:
                    size = (size & 0x7F) | buf[pos] << 7
                    pos += 1
                else:
                    size, pos = _varint(buf, pos - 1)
            stop = pos + size
        else:
            key, pos, stop = _field(buf, pos)
        if key == 0x0A or key == 0x12 or key == 0x1A:
            feature = _parse_list(buf, key, pos, stop)
        pos = stop
    if pos != end:
        raise ValueError("a field runs past the end of its message")
    return feature


# -- serializing -----------------------------------------------------------------------------
_SMALL_VARINTS = [bytes([i]) for i in range(0x80)]
_TAGS = {1: b"\x0a", 2: b"\x12", 3: b"\x1a"}  # field 1, 2, 3 with wire type 2 (length-delimited)
_F32 = struct.Struct("<f")


def _varint_bytes(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _SMALL_VARINTS[value]
    value &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def ld(number: int, payload: bytes) -> bytes:
    """Field ``number`` (1-3) of wire type 2 (length-delimited) holding ``payload``."""
    return _TAGS[number] + _varint_bytes(len(payload)) + payload


def encode_feature(kind: str, values: Any) -> bytes:
    """A serialized ``tf.train.Feature`` of ``kind`` 'bytes', 'float' or 'int64'."""
    if kind == "bytes":
        return ld(1, b"".join([ld(1, v) for v in values]))
    if kind == "float":
        packed = np.asarray(values, "<f4").tobytes()
        return ld(2, ld(1, packed) if packed else b"")
    ints = np.asarray(values, np.int64).ravel()
    if ints.size > 16 and ints.min() >= 0 and ints.max() < 0x80:
        packed = ints.astype(np.uint8).tobytes()
    else:
        packed = b"".join([_varint_bytes(v) for v in ints.tolist()])
    return ld(3, ld(1, packed) if packed else b"")


def encode_scalar(kind: str, value: Any) -> bytes:
    if kind == "float":
        return ld(2, ld(1, _F32.pack(value)))
    return ld(3, ld(1, _varint_bytes(int(value))))


def encode_entries(entries: Iterable[tuple[bytes, bytes]], empty_features: bool = True) -> bytes:
    """A serialized Example from ``(ld(1, name), feature)`` pairs; without any, an empty features field
    only with ``empty_features`` (else ``b''``, as TensorFlow serializes ``tf.train.Example()``)."""
    body = b"".join([ld(1, key + ld(2, feature)) for key, feature in entries])
    return ld(1, body) if body or empty_features else b""


def encode_example(features: dict[str, bytes]) -> bytes:
    """A serialized ``tf.train.Example`` from ``{name: encode_feature(...)}``."""
    return encode_entries((ld(1, name.encode()), feature) for name, feature in features.items())
