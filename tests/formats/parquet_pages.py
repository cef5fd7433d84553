"""Where the pages of a Parquet file lie: page headers parsed from the Thrift compact protocol.

pyarrow does not expose page locations, so the integrity tests find them here: each column
chunk runs from its dictionary (or first data) page for ``total_compressed_size`` bytes, and is a
sequence of (PageHeader, page bytes); a header's ``compressed_page_size`` (field 3) gives the
length of the bytes after it, ``crc`` (field 4) is the checksum, and a data page header (field 5)
holds ``num_values`` (its field 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.parquet as pq

_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(13)


@dataclass(frozen=True)
class Page:
    row_group: int
    column: str  # path in schema: "ragged.data.list.element"
    header: int  # offset of the page header in the file
    body: int  # offset of the page bytes (the CRC covers body .. end)
    end: int
    has_crc: bool
    num_values: int | None  # a data page's count (None for a dictionary page)
    num_values_at: int | None  # offset of the first byte of that count's varint


def pages(path: str) -> list[Page]:
    """Every page of the Parquet file at ``path``, in file order."""
    data = open(path, "rb").read()
    metadata = pq.read_metadata(path)
    found = []
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            column = group.column(c)
            start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
            position = start
            while position < start + column.total_compressed_size:
                fields, body = _struct(data, position)
                end = body + fields[3][0]
                data_page = fields.get(5)
                num_values = data_page[0].get(1) if data_page else None
                found.append(Page(g, column.path_in_schema, position, body, end, 4 in fields,
                                  num_values[0] if num_values else None, num_values[1] if num_values else None))
                position = end
    return found


def _varint(data: bytes, position: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, position


def _struct(data: bytes, position: int) -> tuple[dict[int, tuple[object, int]], int]:
    """Fields of the struct at ``position`` (id -> (value, offset of the value)) and where it ends;
    integers and nested structs are decoded, other values skipped."""
    fields: dict[int, tuple[object, int]] = {}
    field_id = 0
    while True:
        head = data[position]
        position += 1
        if head == _STOP:
            return fields, position
        delta, kind = head >> 4, head & 0x0F
        if delta:
            field_id += delta
        else:
            zigzag, position = _varint(data, position)
            field_id = (zigzag >> 1) ^ -(zigzag & 1)
        start = position
        if kind in (_I16, _I32, _I64):
            zigzag, position = _varint(data, position)
            fields[field_id] = ((zigzag >> 1) ^ -(zigzag & 1), start)
        elif kind == _STRUCT:
            nested, position = _struct(data, position)
            fields[field_id] = (nested, start)
        else:
            position = _skip(data, position, kind)


def _skip(data: bytes, position: int, kind: int) -> int:
    if kind in (_TRUE, _FALSE):
        return position
    if kind == _BYTE:
        return position + 1
    if kind in (_I16, _I32, _I64):
        return _varint(data, position)[1]
    if kind == _DOUBLE:
        return position + 8
    if kind == _BINARY:
        length, position = _varint(data, position)
        return position + length
    if kind in (_LIST, _SET):
        head = data[position]
        position += 1
        count, element = head >> 4, head & 0x0F
        if count == 15:
            count, position = _varint(data, position)
        for _ in range(count):
            position = _skip(data, position, element)
        return position
    if kind == _STRUCT:
        return _struct(data, position)[1]
    if kind == _MAP:
        count, position = _varint(data, position)
        if count:
            types = data[position]
            position += 1
            for _ in range(count):
                position = _skip(data, position, types >> 4)
                position = _skip(data, position, types & 0x0F)
        return position
    raise ValueError(f"unknown Thrift compact type {kind} at byte {position}")
