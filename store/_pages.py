"""Pages of a memory-mapped Parquet file: binary columns read as views of it, and page checksums
checked, without pyarrow's copies and at memory speed.

pyarrow copies every value of a binary (``BYTE_ARRAY``) column into new memory as it reads a row
group. For image columns that is the whole row group, and new memory is dear: a process that reads
a row group for the first time (a torch worker, forked each epoch) page-faults and zeroes every
page of it, 3–15 ms per 4 MB row group on this kind of machine against 0.3 ms for the same read
into memory already used.

:func:`plain_binary_column` reads a column chunk whose pages are ``PLAIN``, uncompressed and
without nulls (what unihub writes for images: JPEG and PNG do not compress) as an Arrow
``binary_view`` array whose views point into the memory-mapped file: nothing is copied, and the
only pages touched are the file's own, already in the page cache. Page checksums are checked when
asked, as pyarrow checks them.

:func:`checksums_pass` walks a row group's pages (:func:`chunk_pages`, as Arrow's page reader
walks them) and checks their CRCs at memory speed (store/crc.py), so that pyarrow reads them
without its own, slower check.

The view reader declines (returns None) whatever else it meets: compression, a dictionary, nulls,
another encoding, short values, a header it does not expect (store/_thrift.py is stricter
than Thrift), sizes that do not add up. pyarrow then reads the column as before, with its own checks and
errors, so this reader never accepts a chunk pyarrow would refuse for its layout, and never rejects one.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from unihub.errors import DataCorruptionError, FormatError
from unihub.store._footer import problem
from unihub.store._footer import tail as footer_bytes
from unihub.store._thrift import I32, STRUCT, Fields, read_struct, varint
from unihub.store.crc import crc32

_DATA_PAGE, _INDEX_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = range(4)
_DATA_PAGES = (_DATA_PAGE, _DATA_PAGE_V2)
_CHECKED = (_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2)  # the pages whose CRC Arrow verifies
_PLAIN, _RLE, _BIT_PACKED = 0, 3, 4
_LEVEL_ENCODINGS = (_RLE, _BIT_PACKED)
_INLINE = 12  # binary_view keeps values of up to 12 bytes in the view itself
_MAX_HEADER = 64 * 1024  # bytes of a page header (Arrow's own limit is 16 MiB)
_MIN_AVERAGE = 16  # bytes a value and its length take on average: fewer, and pyarrow's copy is cheaper
_LENGTH = struct.Struct("<i")
_LENGTH_BYTES = np.arange(4)  # a PLAIN value's length: its first 4 bytes
#: this pyarrow has view arrays (16 and later)
SUPPORTED = hasattr(pa, "binary_view")


_REQUIRED = object()


def chunk_span(column: pq.ColumnChunkMetaData) -> tuple[int, int]:
    """Where a column chunk's pages lie in its file: (first byte, byte after the last), as Arrow's
    page reader takes them (a dictionary page's offset only where it is before the data's)."""
    start = column.data_page_offset
    if column.has_dictionary_page and 0 < column.dictionary_page_offset < start:
        start = column.dictionary_page_offset
    return start, start + column.total_compressed_size


class Page(NamedTuple):
    """One page of a column chunk: where its header and bytes lie in the file, and what the header says."""

    header: int  # offset of the page header
    body: int  # offset of the page's bytes (what its CRC covers)
    end: int  # offset after them
    kind: int  # Parquet's PageType: 0 data, 1 index, 2 dictionary, 3 data v2
    crc: int | None  # the CRC-32 in the header (unsigned), if it has one
    num_values: int | None  # a data page's count of values (levels included); None for other pages
    uncompressed: int  # the size of its bytes uncompressed
    #: the whole parsed header; None where it is laid out as Arrow writes a v1 data page (:func:`_v1_header`)
    fields: Fields | None
    #: that v1 page's count of values and encodings of values, definition and repetition levels (None: see fields)
    data_header: tuple[int, int, int, int] | None

    def fails_its_crc(self, data: Any, at: int = 0) -> bool:
        """Whether the page's bytes in ``data`` (what its offsets index, less ``at``) differ from the CRC in its
        header."""
        return self.crc is not None and crc32(data[self.body - at:self.end - at]) != self.crc


def chunk_pages(data: Any, position: int, end_of_chunk: int, num_values: int) -> Iterator[Page]:
    """The pages of the column chunk at ``data[position:end_of_chunk]`` (bytes-like; see
    :func:`chunk_span`), in order, until their values add up to ``num_values`` (the chunk's, from
    the footer), where Arrow's page reader stops too. FormatError where a header cannot be parsed
    (see store/_thrift.py), a page runs past the chunk, or the chunk ends before its values do."""
    if position < 0 or end_of_chunk > len(data):
        raise FormatError("a column chunk past the end of its file")
    seen = 0
    while seen < num_values:
        if position >= end_of_chunk:
            raise FormatError("a column chunk that ends before its values")
        v1 = _v1_header(data, position)  # Arrow's layout, read at a glance (a row group's image pages are many)
        if v1 is not None:
            end = v1[8] + v1[2]
            if v1[1] < 0 or v1[2] < 0 or v1[4] < 0 or end > end_of_chunk:
                raise FormatError("a page past its chunk, or a negative count of values")
            yield Page(position, v1[8], end, _DATA_PAGE, v1[3] & 0xFFFFFFFF, v1[4], v1[1], None,
                       (v1[4], v1[5], v1[6], v1[7]))
            seen += v1[4]
            position = end
            continue
        fields, body = read_struct(data, position)
        if body - position > _MAX_HEADER:
            raise FormatError("a page header of more than 64 KiB")
        kind, uncompressed, compressed = _i32(fields, 1), _i32(fields, 2), _i32(fields, 3)
        end = body + compressed
        if compressed < 0 or uncompressed < 0 or end > end_of_chunk:
            raise FormatError("a page past its chunk")
        crc = _i32(fields, 4, None)
        count = _i32(_struct(fields, 5 if kind == _DATA_PAGE else 8), 1) if kind in _DATA_PAGES else None
        if count is not None and count < 0:
            raise FormatError("a negative count of values")
        yield Page(position, body, end, kind, None if crc is None else crc & 0xFFFFFFFF, count, uncompressed, fields,
                   None)
        seen += count or 0
        position = end


def checksums_pass(data: Any, metadata: pq.FileMetaData, row_group: int, leaves: Iterable[int],
                   walked: dict[int, list[Page]] | None = None) -> bool:
    """Whether every page Arrow would read of these leaf columns of ``row_group`` matches the CRC in
    its header (data and dictionary pages, as Arrow checks them; pages without one have nothing to
    check), computed here at memory speed (store/crc.py) instead of by Arrow's slower CRC.

    False where a page fails, and also where this walk cannot vouch for the pages Arrow would read
    (a header it cannot parse, a chunk in another file, sizes that do not add up): the caller then
    reads with Arrow's own checks, which raise its error for a damaged page. So a read checked here
    is never refused where Arrow accepts it, and a damaged one still fails with Arrow's error.

    ``walked``, where given, gets each leaf's pages (offsets in ``data``) when all pass, so that
    :func:`plain_binary_column` need not parse their headers again."""
    if problem(metadata, footer_bytes(data)) is not None:
        return False  # a footer pyarrow's getters abort on (store/_footer.py): its read raises its error
    group = metadata.row_group(row_group)
    pages_of: dict[int, list[Page]] = {}
    try:
        for leaf in leaves:
            column = group.column(leaf)
            if column.file_path:
                return False  # the chunk lies in another file
            pages = pages_of[leaf] = list(chunk_pages(data, *chunk_span(column), column.num_values))
            if any(page.kind in _CHECKED and page.fails_its_crc(data) for page in pages):
                return False
    except (FormatError, IndexError, TypeError, struct.error):
        return False
    if walked is not None:
        walked.update(pages_of)
    return True


def binary_leaves(parquet_file: pq.ParquetFile) -> dict[str, int]:
    """Top-level binary columns (Arrow ``binary`` or ``large_binary``, stored as ``BYTE_ARRAY``
    without repetition) by name: their leaf index, what :func:`plain_binary_column` takes. A name
    with a dot is left out: its path could as well be a nested field's."""
    arrow_schema = parquet_file.schema_arrow
    found = {}
    for leaf in range(parquet_file.metadata.num_columns):
        descriptor = parquet_file.metadata.schema.column(leaf)
        name = descriptor.path
        if (descriptor.physical_type == "BYTE_ARRAY" and descriptor.max_repetition_level == 0 and "." not in name
                and arrow_schema.get_field_index(name) >= 0):
            kind = arrow_schema.field(name).type
            if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
                found[name] = leaf
    return found


def plain_binary_column(mapped: pa.Buffer, metadata: pq.FileMetaData, row_group: int, leaf: int,
                        *, verify: bool, origin: int = 0, pages: list[Page] | None = None) -> pa.Array | None:
    """Leaf column ``leaf`` of ``row_group`` as a ``binary_view`` array viewing ``mapped`` (the
    whole file, memory-mapped; or bytes of it from ``origin`` on, fetched), or None where this reader
    declines it (see the module docstring).

    ``leaf`` must be a top-level ``BYTE_ARRAY`` column (no repetition). ``verify``: each page's
    CRC, where it has one, is checked; a page that fails is declined, so pyarrow reads the column
    and raises its checksum error. ``pages``: the chunk's pages as :func:`checksums_pass` walked them
    (offsets in the file), not parsed again.
    """
    if problem(metadata, footer_bytes(mapped) if origin == 0 else None) is not None:
        return None  # pyarrow's read raises its error for it
    column = metadata.row_group(row_group).column(leaf)
    descriptor = metadata.schema.column(leaf)
    if (not SUPPORTED or column.physical_type != "BYTE_ARRAY" or column.compression != "UNCOMPRESSED"
            or column.has_dictionary_page or column.file_path or descriptor.max_repetition_level != 0
            or descriptor.max_definition_level > 1):
        return None  # file_path: the chunk lies in another file
    start, end = (offset - origin for offset in chunk_span(column))
    num_rows = metadata.row_group(row_group).num_rows
    if (start < 0 or end > mapped.size or end - start >= 2**31 or num_rows <= 0 or column.num_values != num_rows
            or sys.byteorder != "little"):
        return None  # int32 offsets in the views; an empty chunk has nothing to save; lengths read natively
    chunk = memoryview(mapped).cast("B")[start:end]
    try:
        starts, lengths = _value_spans(chunk, num_rows, descriptor.max_definition_level, verify, pages, start + origin)
    except (FormatError, IndexError, TypeError, struct.error):
        return None
    return _binary_view(mapped.slice(start, end - start), chunk, starts, lengths)


def _value_spans(chunk: memoryview, num_rows: int, max_definition_level: int, verify: bool,
                 pages: list[Page] | None = None, at: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Each value's offset in ``chunk`` and its length, from the chunk's data pages (``pages``: walked
    already, their offsets ``at`` bytes past the chunk's).

    PLAIN ``BYTE_ARRAY`` values are each a 4-byte little-endian length, then the bytes: a page's are walked
    from length to length (``lengths_at[k]`` is the chunk as int32 from byte ``k``, so the length at ``p`` is
    ``lengths_at[p % 4][p // 4]``: faster than ``struct``), keeping only where each value's length lies; the
    lengths are then gathered in one step. A negative length steps back (an index past the end raises
    IndexError) and is found among the lengths once the walk is done."""
    size = len(chunk)
    lengths_at = [chunk[k:k + (size - k) // 4 * 4].cast("i") for k in range(4)]
    walked: Iterable[Page] = chunk_pages(chunk, 0, size, num_rows) if pages is None else pages
    at = 0 if pages is None else at
    marks: list[int] = []  # where each value's length lies
    mark = marks.append
    for page in walked:
        body, end = page.body - at, page.end - at
        if page.uncompressed != end - body:
            raise FormatError("page sizes")
        if verify and page.fails_its_crc(chunk, at):
            raise FormatError("a page fails its checksum")
        position, count, encoding = _page_values(chunk, page.kind, page.fields, body, end, max_definition_level,
                                                 page.data_header)
        if encoding != _PLAIN or count < 0 or count > (end - position) // _MIN_AVERAGE:
            raise FormatError("not PLAIN, or more (short) values than are worth viewing")
        for _ in range(count):
            mark(position)
            position += 4 + lengths_at[position & 3][position >> 2]
        if position != end:
            raise FormatError("values that do not fill their page")
    if len(marks) != num_rows:
        raise FormatError("values do not add up to the row group's rows")
    at_lengths = np.array(marks, dtype=np.int64)
    lengths = np.frombuffer(chunk, dtype=np.uint8)[at_lengths[:, None] + _LENGTH_BYTES].view("<i4")[:, 0]
    if len(lengths) and lengths.min() < 0:
        raise FormatError("a negative length")
    return at_lengths + 4, lengths.astype(np.int64)


def _page_values(chunk: memoryview, kind: int, header: Fields | None, body: int, end: int,
                 max_definition_level: int, v1: tuple[int, int, int, int] | None = None) -> tuple[int, int, int]:
    """Where a data page's values start (past its definition levels, which must say that every value is
    there), how many it holds, and their encoding; any other page (dictionary, index) is declined.
    ``header``: the page's parsed header; or ``v1``, a v1 data page's fields read at a glance (:func:`_v1_header`)."""
    if v1 is None and header is None:
        raise FormatError("a page without its header")
    if kind == _DATA_PAGE:
        if v1 is None:
            fields = _struct(header, 5)  # type: ignore[arg-type]  # one of the two, checked above
            v1 = (_i32(fields, 1), _i32(fields, 2), _i32(fields, 3), _i32(fields, 4))
        count, encoding, definition, repetition = v1
        if definition not in _LEVEL_ENCODINGS or repetition not in _LEVEL_ENCODINGS:
            raise FormatError("level encodings")
        return _past_levels_v1(chunk, body, end, count, max_definition_level, definition), count, encoding
    if kind == _DATA_PAGE_V2 and header is not None:
        fields = _struct(header, 8)
        count, nulls, rows, encoding, definition, repetition = (_i32(fields, k) for k in range(1, 7))
        if nulls != 0 or rows != count or repetition != 0 or definition < 0 or body + definition > end:
            raise FormatError("nulls or repetition in a v2 page")
        if max_definition_level:
            _all_defined(chunk, body, body + definition, count)
        elif definition:
            raise FormatError("definition levels in a page of a required column")
        return body + definition, count, encoding
    raise FormatError(f"a page of type {kind}")  # a dictionary or index page


def _i32(fields: Fields, field_id: int, default: Any = _REQUIRED) -> Any:
    """Field ``field_id``, an i32; ``default`` where it is absent or of another type (as Thrift
    skips it), or a missing required field declined, as pyarrow refuses the header."""
    found = fields.get(field_id)
    if found is None or found[2] != I32:
        if default is _REQUIRED:
            raise FormatError(f"no i32 field {field_id}")
        return default
    if not -2**31 <= found[0] < 2**31:
        raise FormatError(f"field {field_id} out of the i32 range")
    return found[0]


def _struct(fields: Fields, field_id: int) -> Fields:
    found = fields.get(field_id)
    if found is None or found[2] != STRUCT:
        raise FormatError(f"no struct field {field_id}")
    return found[0]


def _past_levels_v1(chunk: memoryview, body: int, end: int, count: int, max_definition_level: int,
                    level_encoding: int) -> int:
    """Where a v1 data page's values start: past its definition levels (RLE, after their 4-byte
    length), which must say that every one of its ``count`` values is there."""
    if max_definition_level == 0:
        return body
    if level_encoding != _RLE:
        raise FormatError("definition levels not RLE")
    size = _LENGTH.unpack_from(chunk, body)[0]
    if size < 0 or body + 4 + size > end:
        raise FormatError("definition levels past the page")
    _all_defined(chunk, body + 4, body + 4 + size, count)
    return body + 4 + size


def _all_defined(chunk: memoryview, start: int, end: int, count: int) -> None:
    """The definition levels in ``chunk[start:end]`` (bit width 1) must be one RLE run of ``count``
    1s, every value there; anything else (nulls, bit-packed runs) is declined."""
    run, at = varint(chunk, start, 5)  # Arrow reads a run's header in at most 5 bytes
    if run & 1 or run >> 1 != count or at + 1 != end or chunk[at] != 1:
        raise FormatError("nulls in the page")


def _binary_view(data: pa.Buffer, chunk: memoryview, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A ``binary_view`` array of the values at ``starts``/``lengths`` of ``data`` (long values
    referenced, values of up to 12 bytes inlined in their views as the format requires)."""
    n = len(starts)
    views = np.zeros((n, 4), dtype=np.int32)  # length, 4-byte prefix, buffer index, offset
    views[:, 0] = lengths
    as_bytes = views.view(np.uint8).reshape(n, 16)
    raw = np.frombuffer(chunk, dtype=np.uint8)
    long = lengths > _INLINE
    if long.any():
        as_bytes[long, 4:8] = raw[starts[long, None] + np.arange(4)]
        views[long, 3] = starts[long]
    short = ~long
    if short.any():
        inline = np.arange(_INLINE)
        wanted = inline < lengths[short, None]
        picked = np.minimum(starts[short, None] + inline, len(raw) - 1)
        as_bytes[short, 4:16] = np.where(wanted, raw[picked], 0)
    return pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(views), data])


def page_value_spans(page: memoryview, count: int, max_definition_level: int, verify: bool,
                     where: str) -> tuple[list[int], list[int]] | None:
    """The spans (starts, lengths) in ``page`` of the ``count`` values of one data page: ``page`` is
    the page whole, header first, as an offset index locates it (store/page_index.py).

    ``where`` (the file and the page's offset) names the page in errors. FormatError where the
    header cannot be parsed, its sizes disagree with ``page``'s, it is no data page, or its values do
    not fill it; DataCorruptionError where ``verify`` and the page fails its CRC. None where the page
    is of a layout this reader declines (compressed, not PLAIN, nulls): the caller reads its row group.
    Time is bounded by ``len(page)``: at most a value per 4 bytes is walked."""
    header = _v1_header(page)
    fields: Fields | None = None
    v1: tuple[int, int, int, int] | None = None
    if header is None:
        try:
            fields, body = read_struct(page, 0)
            if body > _MAX_HEADER:
                raise FormatError("a page header of more than 64 KiB")
            kind, uncompressed, compressed = _i32(fields, 1), _i32(fields, 2), _i32(fields, 3)
            crc = _i32(fields, 4, None)
        except FormatError as exc:
            raise FormatError(f"{where}: {exc}") from exc
    else:
        kind, uncompressed, compressed, crc, body = _DATA_PAGE, header[1], header[2], header[3], header[8]
        v1 = (header[4], header[5], header[6], header[7])
    size = len(page)
    if body + compressed != size or compressed < 0 or uncompressed < 0:
        raise FormatError(f"{where}: the page header says {body} + {compressed} bytes, the offset index {size}")
    if kind not in _DATA_PAGES:
        raise FormatError(f"{where}: the offset index points at a page of type {kind}, not a data page")
    if verify and crc is not None and crc32(page[body:]) != crc & 0xFFFFFFFF:
        raise DataCorruptionError(f"{where}: the page fails its CRC-32 checksum (its bytes changed since "
                                  "they were written)")
    if uncompressed != compressed or sys.byteorder != "little":
        return None  # compressed (or a v2 page's levels counted otherwise): not what this reader takes
    try:
        start, found, encoding = _page_values(page, kind, fields, body, size, max_definition_level, v1)
    except (FormatError, IndexError, struct.error):
        return None  # nulls, other level encodings: the row group's reader takes them
    if found != count:
        raise FormatError(f"{where}: the page holds {found} values, the offset index says {count} rows")
    if encoding != _PLAIN:
        return None
    return _value_lists(page, start, count, where)


def _value_lists(page: memoryview, start: int, count: int, where: str) -> tuple[list[int], list[int]]:
    """As :func:`_value_spans` walks a page, into lists (a page holds a few values: numpy's calls cost more)."""
    size = len(page)
    if count > (size - start) // 4:
        raise FormatError(f"{where}: {count} values cannot fit in {size - start} bytes")
    lengths_at = [page[k:k + (size - k) // 4 * 4].cast("i") for k in range(4)]
    starts, lengths = [], []
    position = start
    for _ in range(count):
        length = lengths_at[position & 3][position >> 2] if position + 4 <= size else -1
        if length < 0:
            break
        starts.append(position + 4)
        lengths.append(length)
        position += 4 + length
    if position != size or len(starts) != count:
        raise FormatError(f"{where}: PLAIN values that do not fill their page")
    return starts, lengths


#: the page headers Arrow writes for v1 data pages (without statistics): fields 1-4 (type, sizes, CRC)
#: as i32, then field 5 (the DataPageHeader) with its fields 1-4 (values, encodings) as i32, two stops
_V1_HEADER = (0x15, 0x15, 0x15, 0x15, 0x1C, 0x15, 0x15, 0x15, 0x15)


def _v1_header(page: memoryview, position: int = 0) -> list[int] | None:
    """The data page header at ``position`` of ``page``, if laid out as Arrow writes a v1 one with a CRC, read
    at a glance (a sampler reads one per row, a row group's walk one per few images): its type, sizes, CRC,
    count of values, encodings of values and levels and the offset after it, as :func:`read_struct` reads
    them; None for any other layout (read_struct reads it)."""
    values: list[int] = []
    try:
        for head in _V1_HEADER:
            if page[position] != head:
                return None
            position += 1
            if head == 0x1C:
                continue
            byte = page[position]
            position += 1
            zigzag, shift = byte & 0x7F, 7
            while byte & 0x80:
                if shift > 28:
                    return None
                byte = page[position]
                position += 1
                zigzag |= (byte & 0x7F) << shift
                shift += 7
            value = (zigzag >> 1) ^ -(zigzag & 1)
            if not -2**31 <= value < 2**31 or (head == 0x15 and not values and value != _DATA_PAGE):
                return None
            values.append(value)
        if page[position] or page[position + 1]:
            return None
    except IndexError:
        return None
    values.append(position + 2)
    return values
