"""Structs of the Thrift compact protocol, the encoding of Parquet's page headers, parsed from bytes
that may be hostile.

Only what reading a page header needs: integers, booleans and nested structs are decoded; binary,
double, list, set and map values are skipped. Stricter than Thrift's own reader wherever the two
could differ (a field id past int16, a field given twice, nesting deeper than 16, a container of
more than 10,000 elements, an element type Thrift does not know): :class:`FormatError` then, so a
caller that falls back to another reader on it never accepts a header that reader would refuse.
Time and memory are bounded by the bytes given.
"""

from __future__ import annotations

from typing import Any

from unihub.errors import FormatError

STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)
_TYPES = range(TRUE, STRUCT + 1)
MAX_DEPTH = 16  # structs and containers nested; Parquet's headers nest 3 deep
MAX_ELEMENTS = 10_000  # in one list, set or map; Thrift's own limit is 1,000,000 in all
_FIELD_IDS = range(1, 2**15)  # Thrift keeps a field id as an int16

#: a field of a parsed struct by id: (value, offset of the value's first byte, wire type); a nested
#: struct's value is its own fields
Fields = dict[int, tuple[Any, int, int]]


def read_struct(data: Any, position: int, max_elements: int = MAX_ELEMENTS) -> tuple[Fields, int]:
    """The struct at ``position`` of ``data`` (bytes-like) and the offset after it; FormatError where
    the bytes end first or break a rule of the module docstring. ``max_elements``: in one container (a
    footer's lists grow with its columns and row groups: there, its length, as every element takes a byte)."""
    try:
        return _struct(data, position, 0, max_elements)
    except IndexError as exc:
        raise FormatError(f"a Thrift struct at byte {position} runs past the end of its bytes") from exc


def varint(data: Any, position: int, max_bytes: int = 10) -> tuple[int, int]:
    """The unsigned LEB128 varint at ``position`` (at most ``max_bytes`` long) and the offset after it."""
    shift = value = 0
    for _ in range(max_bytes):
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
    raise FormatError(f"a varint longer than {max_bytes} bytes before byte {position}")


def skip(data: Any, position: int, kind: int, max_elements: int = MAX_ELEMENTS) -> int:
    """The offset after the value of wire type ``kind`` at ``position`` (a field's; a boolean field has none);
    FormatError or IndexError where the bytes break a rule or end first. ``max_elements``: in one container (a
    Parquet footer's schema and row groups may hold more than a page header's bound)."""
    return _skip(data, position, kind, 1, max_elements)


def field_header(data: Any, position: int, field_id: int) -> tuple[int, int, int] | None:
    """The compact protocol's field header at ``position`` after field ``field_id``: ``(field id, type, offset
    of its value)``, or None at the struct's STOP byte (the offset after it is ``position + 1``)."""
    head = data[position]
    position += 1
    if head == STOP:
        return None
    delta, kind = head >> 4, head & 0x0F
    if delta:
        return field_id + delta, kind, position
    zigzag, position = varint(data, position, 3)
    return (zigzag >> 1) ^ -(zigzag & 1), kind, position


def _struct(data: Any, position: int, depth: int, limit: int) -> tuple[Fields, int]:
    _deeper(depth)
    fields: Fields = {}
    field_id = 0
    while True:
        header = field_header(data, position, field_id)
        if header is None:
            return fields, position + 1
        field_id, kind, position = header
        if field_id not in _FIELD_IDS or field_id in fields or kind not in _TYPES:
            raise FormatError(f"Thrift field {field_id} of type {kind} at byte {position}: out of range, "
                              "repeated or of an unknown type")
        start = position
        if kind in (I16, I32, I64):
            zigzag, position = varint(data, position)
            fields[field_id] = ((zigzag >> 1) ^ -(zigzag & 1), start, kind)
        elif kind in (TRUE, FALSE):
            fields[field_id] = (kind == TRUE, start, TRUE)
        elif kind == STRUCT:
            nested, position = _struct(data, position, depth + 1, limit)
            fields[field_id] = (nested, start, kind)
        else:
            position = _skip(data, position, kind, depth + 1, limit)
            fields[field_id] = (None, start, kind)


def _skip(data: Any, position: int, kind: int, depth: int, limit: int) -> int:
    """The offset after a value of wire type ``kind`` at ``position``."""
    _deeper(depth)
    if kind in (TRUE, FALSE, BYTE):  # a boolean element of a container takes a byte
        return position + 1
    if kind in (I16, I32, I64):
        return varint(data, position)[1]
    if kind == DOUBLE:
        return position + 8
    if kind == BINARY:
        length, position = varint(data, position)
        return _within(data, position + length)
    if kind == STRUCT:
        return _struct(data, position, depth, limit)[1]
    if kind in (LIST, SET):
        head = data[position]
        position += 1
        count, element = head >> 4, head & 0x0F
        if count == 15:
            count, position = varint(data, position, 5)
        return _elements(data, position, count, (element,), depth, limit)
    if kind == MAP:
        count, position = varint(data, position, 5)
        if not count:
            return position
        types = data[position]
        return _elements(data, position + 1, count, (types >> 4, types & 0x0F), depth, limit)
    raise FormatError(f"unknown Thrift compact type {kind} at byte {position}")


def _elements(data: Any, position: int, count: int, kinds: tuple[int, ...], depth: int, limit: int) -> int:
    if count > limit or any(k not in _TYPES for k in kinds):
        raise FormatError(f"a Thrift container of {count} elements of types {kinds} at byte {position}")
    for _ in range(count):
        for kind in kinds:
            position = _skip(data, position, kind, depth + 1, limit)
    return position


def _deeper(depth: int) -> None:
    if depth > MAX_DEPTH:
        raise FormatError(f"Thrift values nested more than {MAX_DEPTH} deep")


def _within(data: Any, end: int) -> int:
    if end > len(data):
        raise IndexError("past the end")
    return end

