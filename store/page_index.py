"""One cell of a binary column without its row group: Parquet's offset index, and pages read by range.

A random sampler over a dataset larger than the row-group cache read a whole row group (megabytes)
for most rows it asked for. Files unihub writes carry Parquet's page index (store/writer.py) and
keep image columns in small pages, so a cell is one small ranged read: the column chunk's
``OffsetIndex`` lists each page's offset, size and first row, and a page of a ``PLAIN``,
uncompressed, null-free binary column is walked by store/_pages.py.

pyarrow does not expose the offset index: where it lies is in the footer's ``ColumnChunk``
(``offset_index_offset`` and ``offset_index_length``, Thrift fields 4 and 5), read here from the
footer's bytes by store/_thrift.py's strict reader, and the index itself is a Thrift
``OffsetIndex`` (field 1: a list of ``PageLocation{1: offset i64, 2: compressed_page_size i32,
3: first_row_index i64}``). All of it is untrusted: sizes are bounded by the file's and the
chunk's, every count by the bytes given, and what does not add up is a :class:`FormatError` naming
the file and the byte offset (a page that fails its CRC: :class:`DataCorruptionError`).

:class:`PageReader` declines (returns None) a column chunk without an offset index or of another
layout (compressed, a dictionary, nulls, another encoding, a chunk in another file): its reader
then reads the row group as before, so Petastorm's datasets and files written before this read as
they always did.
"""

from __future__ import annotations

import os
import struct
import threading
from bisect import bisect_right
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow.parquet as pq

from unihub.errors import DatasetChangedError, FormatError
from unihub.fs import remote
from unihub.store import _footer, _pages
from unihub.store._thrift import I32, I64, LIST, STRUCT, Fields, read_struct, varint

if TYPE_CHECKING:
    from unihub.store.dataset import ParquetStore

_MAGIC = b"PAR1"
_TAIL = 8  # the footer's length (int32) and the magic
#: footers larger than this are not parsed here (their row groups read as before)
MAX_FOOTER_BYTES = 64 * 2**20
#: bytes a PageLocation takes at the least (a field header and a varint for each of three fields, a stop)
_MIN_LOCATION_BYTES = 7
#: ...and at the most (three 10-byte varints, their headers, a stop; and an i64 of field 2 per page)
_MAX_LOCATION_BYTES = 48
#: open files kept per reader (a sampler's rows come from every file)
MAX_OPEN_FILES = 16
#: pages whose bytes lie this close are read in one ranged read (one request instead of two)
COALESCE_GAP = 0
#: ranged reads in flight at once on a remote filesystem
CONCURRENT_READS = 64


@dataclass(frozen=True)
class PageLocations:
    """The pages of one column chunk, from its offset index: each page's file offset (its header's),
    size (header and bytes) and first row in the row group; ``num_rows``: the row group's."""

    offsets: np.ndarray
    sizes: np.ndarray
    first_rows: np.ndarray
    num_rows: int
    #: the same as lists (a take looks up a few rows: bisect on a list costs less than numpy's calls)
    offset_list: list[int] = field(default_factory=list)
    size_list: list[int] = field(default_factory=list)
    first_row_list: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        object.__setattr__(self, "offset_list", self.offsets.tolist())
        object.__setattr__(self, "size_list", self.sizes.tolist())
        object.__setattr__(self, "first_row_list", self.first_rows.tolist())

    def rows_in(self, page: int) -> int:
        """How many rows page ``page`` holds."""
        firsts = self.first_row_list
        return (firsts[page + 1] if page + 1 < len(firsts) else self.num_rows) - firsts[page]


def index_locations(footer: Any, path: str, footer_offset: int) -> list[list[tuple[int, int] | None]]:
    """Where each column chunk's offset index lies, by row group then leaf column: (offset, length),
    or None where the chunk has none. ``footer``: the footer's Thrift bytes (``FileMetaData``), which
    start at byte ``footer_offset`` of ``path`` (named in errors)."""
    view = memoryview(footer).cast("B")
    try:
        fields, _ = read_struct(view, 0, len(view))  # more than 10,000 columns or row groups: still bounded
        groups = []
        for group_at in _list_of_structs(view, fields, 4):
            group, _ = read_struct(view, group_at, len(view))
            columns = []
            for chunk_at in _list_of_structs(view, group, 1):
                chunk, _ = read_struct(view, chunk_at, len(view))
                offset, length = chunk.get(4), chunk.get(5)
                found = offset is not None and length is not None and offset[2] == I64 and length[2] == I32
                columns.append((offset[0], length[0]) if found else None)  # type: ignore[index]
            groups.append(columns)
    except FormatError as exc:
        raise FormatError(f"{path}: a footer this reader cannot parse (at byte {footer_offset}): {exc}",
                          path=path, offset=footer_offset) from exc
    return groups


def _list_of_structs(data: memoryview, fields: Fields, field_id: int) -> list[int]:
    """Where each element of list field ``field_id`` of a parsed struct starts (its elements must be
    structs; read_struct has walked the list already, so it ends within ``data``)."""
    found = fields.get(field_id)
    if found is None:
        return []
    if found[2] != LIST:
        raise FormatError(f"field {field_id} is not a list")
    position = found[1]
    head = data[position]
    count, position = head >> 4, position + 1
    if count == 15:
        count, position = varint(data, position, 5)
    if head & 0x0F != STRUCT:
        raise FormatError(f"list field {field_id} does not hold structs")
    starts = []
    for _ in range(count):
        starts.append(position)
        position = read_struct(data, position, len(data))[1]
    return starts


def parse_offset_index(data: Any, num_rows: int, chunk: tuple[int, int], path: str, offset: int) -> PageLocations:
    """The page locations of an ``OffsetIndex`` (``data``, read from byte ``offset`` of ``path``) of
    a column chunk of ``num_rows`` rows whose pages lie at ``chunk`` (first byte, byte after the
    last). FormatError where it cannot be parsed or does not describe such a chunk: the first page
    at row 0, rows and offsets increasing, pages apart and inside the chunk."""
    view = memoryview(data).cast("B")
    try:
        if view[0] not in (0x19, 0x09):  # field 1, a list: the short form, or the long one with its id
            raise FormatError("no list of page locations (field 1) first")
        position = 1 if view[0] == 0x19 else varint(view, 1, 3)[1]
        head = view[position]
        count, position = head >> 4, position + 1
        if count == 15:
            count, position = varint(view, position, 5)
        if head & 0x0F != STRUCT or not 0 < count <= min(num_rows, len(view) // _MIN_LOCATION_BYTES):
            raise FormatError(f"a list of {count} page locations of type {head & 0x0F} for {num_rows} rows "
                              f"in {len(view)} bytes")
        table = np.empty((count, 3), dtype=np.int64)
        for k in range(count):
            location, position = read_struct(view, position)
            for column, (field_id, kind) in enumerate(((1, I64), (2, I32), (3, I64))):
                value = location.get(field_id)
                if value is None or value[2] != kind:
                    raise FormatError(f"page location {k} lacks field {field_id}")
                table[k, column] = value[0]
    except (IndexError, OverflowError, FormatError) as exc:
        raise FormatError(f"{path}: the offset index at byte {offset} cannot be parsed: {exc}", path=path,
                          offset=offset) from exc
    offsets, sizes, first_rows = table[:, 0].copy(), table[:, 1].copy(), table[:, 2].copy()
    ends = offsets + sizes
    if (first_rows[0] != 0 or (np.diff(first_rows) <= 0).any() or first_rows[-1] >= num_rows or (sizes <= 0).any()
            or sizes.max() >= 2**31 or offsets[0] < chunk[0] or ends[-1] > chunk[1] or (ends[:-1] > offsets[1:]).any()):
        raise FormatError(f"{path}: the offset index at byte {offset} does not describe its column chunk "
                          f"(bytes {chunk[0]}..{chunk[1]}, {num_rows} rows)", path=path, offset=offset)
    return PageLocations(offsets, sizes, first_rows, num_rows)


@dataclass(frozen=True)
class _Chunk:
    """A column chunk the page reader takes: its file, pages and levels."""

    path: str
    column: str
    row_group: int  # in its file
    locations: PageLocations
    max_definition_level: int


class _File:
    """An open file of the dataset, and where its offset indexes lie (from its footer)."""

    def __init__(self, handle: Any, indexes: list[list[tuple[int, int] | None]] | None) -> None:
        self.handle, self.indexes, self.pid = handle, indexes, os.getpid()


def _cells_readable(column: pq.ColumnChunkMetaData, descriptor: pq.ColumnSchema, num_rows: int) -> bool:
    """Whether a column chunk's cells can be read one page at a time by its offset index: plain uncompressed
    byte arrays, not repeated, at most one level of nulls, one value per row, in this file."""
    return not (column.physical_type != "BYTE_ARRAY" or column.compression != "UNCOMPRESSED"
                or column.has_dictionary_page or column.file_path or descriptor.max_repetition_level != 0
                or descriptor.max_definition_level > 1 or not column.has_offset_index
                or column.num_values != num_rows or num_rows <= 0)


class PageReader:
    """Cells of a dataset's binary columns, a ranged read per page (or run of adjacent pages), through
    the store's filesystem. ``reads``, ``bytes_read`` and ``pages_read`` count what it read."""

    def __init__(self, store: ParquetStore) -> None:
        self.store = store
        self.verify = store._verify != "off"
        self.reads = self.bytes_read = self.pages_read = 0
        self._files: OrderedDict[str, _File] = OrderedDict()
        self._chunks: dict[tuple[int, str], _Chunk | None] = {}
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._executor_pid = 0
        self._thread_files = threading.local()  # each pool thread's handles (see _read_in_thread)

    def cells(self, group: int, name: str, rows: np.ndarray) -> list[memoryview] | None:
        """Column ``name``'s values at ``rows`` (numbers in row group ``group`` of the dataset) as views
        of the pages read, in the order given; None where this reader declines the chunk."""
        return self.cells_of(name, [(group, rows)])[0]

    def cells_of(self, name: str, asked: list[tuple[int, np.ndarray]]) -> list[list[memoryview] | None]:
        """:meth:`cells` of several row groups at once (a take's): on a remote filesystem their ranged
        reads go out together (up to :data:`CONCURRENT_READS` at a time), so a batch waits about one
        request's latency, not one per row."""
        plans = [self._plan(group, name, rows) for group, rows in asked]
        reads = [(plan[0].path, run) for plan in plans if plan is not None for run in plan[3]]
        datas = iter(self._read_runs(reads))
        found: list[list[memoryview] | None] = []
        for (group, _), plan in zip(asked, plans):
            if plan is None:
                found.append(None)
                continue
            chunk, rows, pages, runs = plan
            values = self._values(chunk, rows, pages, [(run, next(datas)) for run in runs])
            if values is None:
                with self._lock:
                    self._chunks[(group, name)] = None  # read as a row group from now on
            found.append(values)
        return found

    def _plan(self, group: int, name: str, rows: np.ndarray) -> tuple[_Chunk, list[int], list[int],
                                                                      list[tuple[int, int, list[int]]]] | None:
        """What reading ``rows`` of a chunk takes: its pages, and the runs of them (offset, length,
        pages) each read at once; None where this reader declines the chunk."""
        chunk = self._chunk(group, name)
        if chunk is None:
            return None
        locations = chunk.locations
        asked = rows.tolist()  # a few rows a row group: Python's lists cost less than numpy's calls
        if asked and (min(asked) < 0 or max(asked) >= locations.num_rows):
            raise IndexError(f"rows {min(asked)}..{max(asked)} asked of a row group of {locations.num_rows}")
        firsts, offsets, sizes = locations.first_row_list, locations.offset_list, locations.size_list
        pages = [bisect_right(firsts, row) - 1 for row in asked]
        runs = [(offsets[run[0]], offsets[run[-1]] + sizes[run[-1]] - offsets[run[0]], run)
                for run in _runs(locations, sorted(set(pages)))]
        return chunk, asked, pages, runs

    def _values(self, chunk: _Chunk, rows: list[int], pages: list[int],
                runs: list[tuple[tuple[int, int, list[int]], memoryview]]) -> list[memoryview] | None:
        """The values of ``rows`` from their pages (``runs``: each run read, with its bytes); None where
        a page is of a layout this reader declines."""
        locations = chunk.locations
        spans: dict[int, tuple[memoryview, list[int], list[int]]] = {}
        for (start, _, run), data in runs:
            for page in run:
                at = locations.offset_list[page] - start
                view = data[at:at + locations.size_list[page]]
                found = _pages.page_value_spans(view, locations.rows_in(page), chunk.max_definition_level,
                                                self.verify, f"{chunk.path}: the page at byte {start + at} of "
                                                f"column {chunk.column!r}, row group {chunk.row_group}")
                if found is None:
                    return None
                spans[page] = (view, *found)
        with self._lock:
            self.pages_read += len(spans)
        firsts = locations.first_row_list
        out = []
        for page, row in zip(pages, rows):
            view, starts, lengths = spans[page]
            begin = starts[row - firsts[page]]
            out.append(view[begin:begin + lengths[row - firsts[page]]])
        return out

    def _read_runs(self, reads: list[tuple[str, tuple[int, int, list[int]]]]) -> list[memoryview]:
        """The bytes of each run, read in turn from a local disk, together from anywhere else."""
        if len(reads) < 2 or self.store._is_local:
            return [self._read(path, start, length) for path, (start, length, _) in reads]
        for path in {path for path, _ in reads}:
            self._file(path)  # checked unchanged and its footer read once, before the reads go out
        return list(self._pool().map(lambda read: self._read_in_thread(read[0], *read[1][:2]), reads))

    def _read_in_thread(self, path: str, offset: int, length: int) -> memoryview:
        """A ranged read through this pool thread's own handle of ``path``: an fsspec file (s3fs,
        gcsfs) seeks and reads under one lock, so reads through a shared handle would go one by one."""
        handles: OrderedDict[str, _File] | None = getattr(self._thread_files, "handles", None)
        if handles is None:
            handles = self._thread_files.handles = OrderedDict()
        held = handles.get(path)
        if held is None:
            held = handles[path] = _File(self._opened(path), None)
            while len(handles) > MAX_OPEN_FILES:
                handles.popitem(last=False)
        return self._read_from(held, path, offset, length)

    def _pool(self) -> ThreadPoolExecutor:
        """This process's threads for remote reads (a forked process makes its own)."""
        with self._lock:
            if self._executor is None or self._executor_pid != os.getpid():
                self._executor = ThreadPoolExecutor(CONCURRENT_READS, thread_name_prefix="unihub-pages")
                self._executor_pid = os.getpid()
            return self._executor

    def takes(self, group: int, name: str) -> bool:
        """Whether :meth:`cells` reads column ``name`` of row group ``group`` (so far: a page it
        declines makes this False from then on)."""
        return self._chunk(group, name) is not None

    def _chunk(self, group: int, name: str) -> _Chunk | None:
        key = (group, name)
        with self._lock:
            if key in self._chunks:
                return self._chunks[key]
        found = self._load_chunk(group, name)
        with self._lock:
            self._chunks[key] = found
        return found

    def _load_chunk(self, group: int, name: str) -> _Chunk | None:
        """Column ``name`` of row group ``group``, where its layout is one this reader takes (see the
        module docstring) and it has an offset index (read here: one ranged read)."""
        info = self.store.row_groups[group]
        metadata = self.store._footers.get(info.path)
        if metadata is None:
            metadata = self._metadata(info.path)
        leaf = _leaf(metadata, name)
        if leaf is None or _footer.problem(metadata) is not None:
            return None  # a footer pyarrow's getters abort on (store/_footer.py): the row group's read raises
        column = metadata.row_group(info.row_group).column(leaf)
        descriptor = metadata.schema.column(leaf)
        if not _cells_readable(column, descriptor, info.num_rows):
            return None
        indexes = self._file(info.path).indexes
        if indexes is None:
            return None
        if len(indexes) != metadata.num_row_groups or len(indexes[info.row_group]) != metadata.num_columns:
            raise FormatError(f"{info.path}: the footer's row groups or columns differ from pyarrow's reading of it",
                              path=info.path)
        where = indexes[info.row_group][leaf]
        if where is None:
            return None
        offset, length = where
        size = self._file(info.path).handle.size()
        if offset < 0 or length <= 0 or offset + length > size or length > _MAX_LOCATION_BYTES * info.num_rows + 64:
            raise FormatError(f"{info.path}: column {name!r}, row group {info.row_group}: an offset index of "
                              f"{length} bytes at byte {offset}, in a file of {size}", path=info.path, offset=offset)
        span = _pages.chunk_span(column)
        locations = parse_offset_index(self._read(info.path, offset, length), info.num_rows, span, info.path, offset)
        return _Chunk(info.path, name, info.row_group, locations, descriptor.max_definition_level)

    def _metadata(self, path: str) -> pq.FileMetaData:
        try:
            return pq.read_metadata(self._file(path).handle)
        except OSError as exc:
            failure = remote.as_remote_error(exc, remote.display_url(self.store.filesystem, path))
            if failure is None:
                raise
            raise failure from exc

    def _file(self, path: str) -> _File:
        """The open file ``path`` (kept among the last :data:`MAX_OPEN_FILES`; a forked process opens
        its own), its footer read on opening for where its offset indexes lie."""
        with self._lock:
            held = self._files.get(path)
            if held is not None and held.pid == os.getpid():
                self._files.move_to_end(path)
                return held
        handle = self._opened(path)
        self.store._check_unchanged(path, handle)
        held = _File(handle, None)
        held.indexes = self._footer_indexes(path, held)
        with self._lock:
            self._files[path] = held
            while len(self._files) > MAX_OPEN_FILES:  # closed once no read holds it (a take's reads may)
                self._files.popitem(last=False)
        return held

    def _opened(self, path: str) -> Any:
        """``path`` opened for ranged reads through the store's filesystem."""
        try:
            return self.store.filesystem.open_input_file(path)
        except FileNotFoundError as exc:
            raise DatasetChangedError(f"{path}: the file is gone since {self.store.url} was opened (overwritten or "
                                      "removed while it was read); open the dataset again", path=path) from exc
        except OSError as exc:
            failure = remote.as_remote_error(exc, remote.display_url(self.store.filesystem, path))
            if failure is None:
                raise
            raise failure from exc

    def _footer_indexes(self, path: str, held: _File) -> list[list[tuple[int, int] | None]] | None:
        """Where ``path``'s offset indexes lie, from its footer (two ranged reads); None where the footer
        is encrypted or larger than :data:`MAX_FOOTER_BYTES`."""
        size = held.handle.size()
        tail = bytes(self._read_from(held, path, size - _TAIL, _TAIL)) if size >= 12 else b""
        if len(tail) != _TAIL or tail[4:] != _MAGIC:
            return None  # "PARE": an encrypted footer (pyarrow reads or refuses it), or not Parquet at all
        length = struct.unpack("<i", tail[:4])[0]
        if length <= 0 or length > min(size - 12, MAX_FOOTER_BYTES):
            return None
        start = size - _TAIL - length
        return index_locations(self._read_from(held, path, start, length), path, start)

    def _read(self, path: str, offset: int, length: int) -> memoryview:
        return self._read_from(self._file(path), path, offset, length)

    def _read_from(self, held: _File, path: str, offset: int, length: int) -> memoryview:
        """``length`` bytes at ``offset`` of ``path``: one ranged read, counted."""
        try:
            data = remote.read_retrying(lambda: held.handle.read_at(length, offset),
                                        remote.retries_of(self.store.filesystem))
        except OSError as exc:
            failure = remote.as_remote_error(exc, remote.display_url(self.store.filesystem, path),
                                             detail=f"bytes {offset}-{offset + length - 1}")
            if failure is None:
                raise
            raise failure from exc
        if len(data) != length:
            raise FormatError(f"{path}: {length} bytes at byte {offset} asked, {len(data)} there (the file is "
                              "shorter than its footer says)", path=path, offset=offset)
        with self._lock:
            self.reads += 1
            self.bytes_read += length
        return memoryview(data).cast("B")

    def close(self) -> None:
        with self._lock:
            for held in self._files.values():
                held.handle.close()
            self._files.clear()
            if self._executor is not None and self._executor_pid == os.getpid():
                self._executor.shutdown(wait=False)
            self._executor = None


def _leaf(metadata: pq.FileMetaData, name: str) -> int | None:
    """The leaf column holding top-level field ``name`` on its own, if it is one."""
    schema = metadata.schema
    for leaf in range(metadata.num_columns):
        if schema.column(leaf).path == name:
            return leaf
    return None


def _runs(locations: PageLocations, pages: list[int]) -> list[list[int]]:
    """``pages`` (sorted, unique) as runs of pages next to each other in the file: each run is one
    ranged read."""
    runs: list[list[int]] = []
    offsets, sizes = locations.offset_list, locations.size_list
    for page in pages:
        if runs and runs[-1][-1] == page - 1 and offsets[page] - offsets[page - 1] - sizes[page - 1] <= COALESCE_GAP:
            runs[-1].append(page)
        else:
            runs.append([page])
    return runs
