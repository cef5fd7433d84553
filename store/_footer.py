"""A Parquet footer checked for what pyarrow's metadata getters cannot survive, before they are asked.

pyarrow builds a column chunk's metadata (``FileMetaData.row_group(i).column(j)``) and names its
compression (``.compression``) in C++ code that throws on some hostile footers, through Cython
properties that cannot pass the exception on: the process aborts (SIGABRT), whatever the caller
catches. Reading the same chunk (``read_row_group``) raises pyarrow's error instead. So a footer is
walked here first (its Thrift bytes, by the rules of store/_thrift.py) for the two that a fuzz of
Parquet files found, each as Arrow checks it:

- a codec (``ColumnMetaData`` field 4) outside parquet.thrift's ``CompressionCodec`` (0-7);
- ``SizeStatistics`` (field 16) whose level histograms are neither empty nor ``max level + 1`` long,
  or that count unencoded ``BYTE_ARRAY`` bytes of a column of another type;

and a row group whose chunks differ in number from the schema's leaves; also a chunk's path in the schema
that is not UTF-8 (its getter raises a raw UnicodeDecodeError). A footer this walk cannot
parse is not refused here: pyarrow reads it as before.

The walk reads the footer's bytes as they are in the file: those :func:`remember`-ed with the footer
(store/dataset.py reads each footer so), or given (the tail of a memory-mapped file). pyarrow cannot
give them back: ``FileMetaData.write_metadata_file`` of some hostile footers is a segmentation fault. A
footer whose bytes are not known is not checked (it is read as before this module).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import pyarrow.parquet as pq

from unihub.errors import FormatError
from unihub.store._thrift import (
    BINARY,
    BYTE,
    FALSE,
    I16,
    I32,
    I64,
    LIST,
    MAX_DEPTH,
    SET,
    STOP,
    STRUCT,
    TRUE,
    field_header,
    skip,
    varint,
)

#: parquet.thrift's CompressionCodec values (UNCOMPRESSED to LZ4_RAW): pyarrow knows these, and aborts on others
KNOWN_CODECS = range(8)
_FOOTER_ELEMENTS = 2**31  # a footer's lists (schema fields, row groups) are bounded by its bytes alone
_ROW_GROUPS, _COLUMNS, _META_DATA, _PATH, _CODEC, _SIZE_STATISTICS = 4, 1, 3, 3, 4, 16
_UNENCODED, _REPETITION_HISTOGRAM, _DEFINITION_HISTOGRAM = 1, 2, 3
#: footers larger than this are not checked (their bytes are not kept)
MAX_FOOTER_BYTES = 64 * 2**20
#: each footer's bytes (not checked yet) or its problem ("" for none), kept while the footer lives
_KNOWN: dict[int, tuple[weakref.ref[pq.FileMetaData], Any]] = {}
_LOCK = threading.Lock()


def remember(metadata: pq.FileMetaData, footer: Any) -> None:
    """Keep ``footer``, the Thrift bytes ``metadata`` was parsed from, for :func:`problem`."""
    if len(footer) <= MAX_FOOTER_BYTES:
        _keep(metadata, bytes(footer))


def remember_from(metadata: pq.FileMetaData, handle: Any) -> None:
    """:func:`remember` the footer at the end of the open file ``handle`` (two small reads)."""
    size = handle.size()
    if size >= 12:
        handle.seek(size - 8)
        tail = handle.read(8)
        length = int.from_bytes(tail[:4], "little")
        if tail[4:] == b"PAR1" and 0 < length <= min(size - 12, MAX_FOOTER_BYTES):
            handle.seek(size - 8 - length)
            _keep(metadata, handle.read(length))


def share(metadata: pq.FileMetaData, source: pq.FileMetaData | None) -> None:
    """What is known of ``source``'s bytes, for ``metadata`` too (``ParquetFile(metadata=source).metadata`` is
    another object)."""
    with _LOCK:
        held = _KNOWN.get(id(source))
    if held is not None and held[0]() is source:
        _keep(metadata, held[1])


def tail(data: Any) -> memoryview | None:
    """The footer's Thrift bytes at the end of a whole Parquet file's ``data``; None where there is none."""
    view = memoryview(data).cast("B")
    if len(view) < 12 or view[-4:] != b"PAR1":
        return None
    length = int.from_bytes(view[-8:-4], "little")
    return view[-8 - length:-8] if 0 < length <= len(view) - 12 else None


def problem(metadata: pq.FileMetaData, footer: Any = None) -> str | None:
    """What in ``metadata`` would abort pyarrow's getters (see the module docstring), or None (also where its
    bytes are not known: remembered, or given as ``footer``). Checked once per footer object, where unihub first
    asks for its column chunks (not when a dataset is opened: a footer of 20 row groups of 5 columns takes 2 ms
    here, 0.2 ms in pyarrow)."""
    with _LOCK:
        held = _KNOWN.get(id(metadata))
    known = held[1] if held is not None and held[0]() is metadata else footer
    if known is None:
        return None
    if not isinstance(known, str):
        known = _problem(metadata, memoryview(known).cast("B"))
        _keep(metadata, known)
    return known or None


def _keep(metadata: pq.FileMetaData, value: Any) -> None:
    key = id(metadata)
    with _LOCK:
        _KNOWN[key] = (weakref.ref(metadata, lambda _: _KNOWN.pop(key, None)), value)


def check(metadata: pq.FileMetaData, path: str) -> None:
    """A FormatError naming ``path`` where ``metadata`` (its footer) has a :func:`problem`."""
    trouble = problem(metadata)
    if trouble is not None:
        raise FormatError(f"{path}: not a readable Parquet file: {trouble}", path=path)


def _problem(metadata: pq.FileMetaData, footer: memoryview) -> str:
    schema = metadata.schema
    leaves = [(schema.column(j).max_repetition_level, schema.column(j).max_definition_level,
               schema.column(j).physical_type == "BYTE_ARRAY") for j in range(len(schema))]
    found: list[str] = []
    try:
        _walk(footer, 0, lambda field, kind, at: _row_groups(footer, at, leaves, found)
              if field == _ROW_GROUPS and kind == LIST else None)
    except (FormatError, IndexError):
        return ""  # not parsed here: pyarrow reads it as before
    return found[0] if found else ""


def _row_groups(footer: memoryview, at: int, leaves: list[tuple[int, int, bool]], found: list[str]) -> int:
    count, at = _list_of_structs(footer, at)
    for group in range(count):
        chunks: list[int] = []

        def chunk_list(field: int, kind: int, position: int, group: int = group,
                       chunks: list[int] = chunks) -> int | None:
            if field != _COLUMNS or kind != LIST:
                return None
            n, position = _list_of_structs(footer, position)
            for leaf in range(n):
                chunks.append(leaf)
                position = _walk(footer, position, lambda f, k, p, leaf=leaf: _meta_data(
                    footer, p, leaves[leaf] if leaf < len(leaves) else None, f"row group {group}, column {leaf}",
                    found) if f == _META_DATA and k == STRUCT else None)
            return position

        at = _walk(footer, at, chunk_list)
        if len(chunks) != len(leaves) and not found:
            found.append(f"row group {group} has {len(chunks)} column chunks, the schema {len(leaves)} columns")
    return at


def _meta_data(footer: memoryview, at: int, leaf: tuple[int, int, bool] | None, where: str, found: list[str]) -> int:
    """The offset after a ``ColumnMetaData``, its problems added to ``found``."""
    def field(field_id: int, kind: int, position: int) -> int | None:
        if field_id == _CODEC and kind == I32:
            zigzag, after = varint(footer, position)
            codec = (zigzag >> 1) ^ -(zigzag & 1)
            if codec not in KNOWN_CODECS:
                found.append(f"{where}: compression codec {codec}, which pyarrow does not know")
            return after
        if field_id == _PATH and kind == LIST and footer[position] & 0x0F == BINARY:
            return _utf8_names(footer, position, where, found)
        if field_id == _SIZE_STATISTICS and kind == STRUCT and leaf is not None:
            return _walk(footer, position, lambda f, k, p: _size_statistic(footer, p, f, k, leaf, where, found))
        return None
    return _walk(footer, at, field)


def _utf8_names(footer: memoryview, at: int, where: str, found: list[str]) -> int:
    """The offset after a list of binaries (a chunk's path in the schema), a problem added where one is not
    UTF-8 (pyarrow's ``path_in_schema`` raises a raw UnicodeDecodeError)."""
    head = footer[at]
    count, at = head >> 4, at + 1
    if count == 15:
        count, at = varint(footer, at, 5)
    for _ in range(count):
        length, at = varint(footer, at)
        if at + length > len(footer):
            raise FormatError("a binary past the footer's end")
        try:
            str(footer[at:at + length], "utf-8")
        except UnicodeDecodeError:
            found.append(f"{where}: a column path in bytes that are not UTF-8")
        at += length
    return at


def _size_statistic(footer: memoryview, at: int, field_id: int, kind: int, leaf: tuple[int, int, bool], where: str,
                    found: list[str]) -> int | None:
    max_repetition, max_definition, binary = leaf
    if field_id == _UNENCODED and not binary:
        found.append(f"{where}: size statistics count unencoded BYTE_ARRAY bytes of a column of another type")
    elif field_id in (_REPETITION_HISTOGRAM, _DEFINITION_HISTOGRAM) and kind == LIST:
        head = footer[at]
        count = head >> 4 if head >> 4 != 15 else varint(footer, at + 1, 5)[0]
        levels = max_repetition if field_id == _REPETITION_HISTOGRAM else max_definition
        if count not in (0, levels + 1):
            name = "repetition" if field_id == _REPETITION_HISTOGRAM else "definition"
            found.append(f"{where}: a {name} level histogram of {count} levels, not {levels + 1}")
    return None


def _list_of_structs(footer: memoryview, at: int) -> tuple[int, int]:
    head = footer[at]
    count, at = head >> 4, at + 1
    if count == 15:
        count, at = varint(footer, at, 5)
    if head & 0x0F != STRUCT:
        raise FormatError("a list that does not hold structs")
    return count, at


def _walk(footer: memoryview, at: int, visit: Any) -> int:
    """The offset after the struct at ``at``: ``visit(field_id, kind, offset of its value)`` returns the offset
    after a field's value it read, or None for a field skipped."""
    field_id = 0
    while True:
        header = field_header(footer, at, field_id)
        if header is None:
            return at + 1
        field_id, kind, at = header
        if kind in (TRUE, FALSE):
            continue  # a boolean field's value is its type
        after = visit(field_id, kind, at) if visit is not None else None
        at = after if after is not None else _skip(footer, at, kind, 0)


def _skip(footer: memoryview, at: int, kind: int, depth: int) -> int:
    """The offset after a value of wire type ``kind`` (store/_thrift.py's ``skip``, without its parsing of
    nested structs into fields: a footer holds thousands of them)."""
    if kind in (I16, I32, I64):
        while footer[at] & 0x80:
            at += 1
        return at + 1
    if kind == BINARY:
        length, at = varint(footer, at)
        if at + length > len(footer):
            raise FormatError("a binary past the footer's end")
        return at + length
    if kind == STRUCT and depth < MAX_DEPTH:
        while True:
            head = footer[at]
            at += 1
            if head == STOP:
                return at
            if not head >> 4:
                at = varint(footer, at, 3)[1]
            if head & 0x0F not in (TRUE, FALSE):
                at = _skip(footer, at, head & 0x0F, depth + 1)
    if kind in (LIST, SET) and depth < MAX_DEPTH:
        head = footer[at]
        count, element, at = head >> 4, head & 0x0F, at + 1
        if count == 15:
            count, at = varint(footer, at, 5)
        if count > len(footer) - at:
            raise FormatError("a list longer than the footer")
        if element in (TRUE, FALSE, BYTE):
            return at + count
        for _ in range(count):
            at = _skip(footer, at, element, depth + 1)
        return at
    return skip(footer, at, kind, _FOOTER_ELEMENTS)  # the rest (rare in footers) as store/_thrift.py skips it
