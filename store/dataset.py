"""The canonical store: a directory of Parquet files described by a Unischema.

On disk::

    dataset/
      _common_metadata          Arrow schema + key-value metadata, no rows
      part-00000.parquet        row groups; the footer repeats the schema metadata
      split=train/part-00000.parquet   (Hive partitions, when written with partition_by)

The Unischema is JSON under ``unihub.unischema`` in ``_common_metadata`` and in every
file footer, so a single file describes itself. Datasets Petastorm wrote carry a pickled
Unischema under ``dataset-toolkit.unischema.v1`` instead, read through the allow-list of
:mod:`unihub.petastorm.legacy`; plain Parquet gets a Unischema inferred from Arrow types.

:func:`open_dataset` reads only footers: the schema and a row-group index
(file, row group, rows), never data pages. The first read of each row group verifies the CRC-32
of every page that has one and the value counts of nested columns (:mod:`unihub.store.integrity`):
damaged bytes are a ``DataCorruptionError``, a remote failure a ``RemoteStorageError`` naming the
URL. Petastorm's look-ups are here too:
:func:`get_schema_from_dataset_url` (the stored Unischema, an error for plain Parquet) and
:func:`infer_or_load_unischema` (the stored one, else one inferred from the Parquet types). :func:`update_common_metadata` changes entries of
``_common_metadata`` in place, atomically (row-group indexes are kept there).
"""

from __future__ import annotations

import copy
import mmap
import os
import posixpath
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from unihub.errors import (
    DatasetChangedError,
    DatasetNotFoundError,
    DatasetUrlError,
    FormatError,
    PetastormMetadataError,
    SchemaError,
    SchemaMismatchError,
    UnihubError,
    VersionNotFoundError,
)
from unihub.fs import filesystem as fsutil
from unihub.fs import publish, remote, sources
from unihub.petastorm import legacy
from unihub.schema.codecs import ScalarCodec, parquet_tensor_type, tensor_from_parquet
from unihub.schema.metadata_json import EXTRA_METADATA_KEY, load_metadata_json
from unihub.schema.unischema import SCHEMA_METADATA_KEY, Unischema, UnischemaField
from unihub.store import _footer, column_sets, footer_cache, int96, integrity, versions
from unihub.store import _pages as parquet_pages
from unihub.store.partitions import keyed_partitions, partition_of, partition_value

COMMON_METADATA = "_common_metadata"
SchemaSource = Literal["unihub", "petastorm", "inferred"]


#: field metadata of a column ``read_row_group(views=...)`` read as views of the memory-mapped file
#: (its values are the file's pages: holding one pins no memory of its own)
VIEWS_OF_FILE = b"unihub.views_of_file"

#: bytes read through one kept-open file before it is reopened (see ParquetStore._open_file)
_MAPPED_BYTES_BEFORE_REOPEN = 8 * 2**20
#: a row group's page checksums are checked here only where its column chunks average this many
#: bytes: the walk costs ~40 us a chunk in Python, Arrow's CRC ~0.5 ns a byte (a table of 2,000
#: float columns in 5 MB groups read 2x slower walked than checked by Arrow; 4 MB of images 1.8x faster)
WALK_MIN_CHUNK_BYTES = 64 * 2**10


@dataclass(frozen=True)
class RowGroupInfo:
    """One row group of the dataset: where it is and how many rows it holds."""

    index: int
    path: str
    row_group: int
    num_rows: int
    first_row: int
    total_byte_size: int
    partition: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class FileInfo:
    path: str
    num_rows: int
    num_row_groups: int
    size_bytes: int
    partition: tuple[tuple[str, str], ...] = ()
    mtime_ns: int | None = None  # when the filesystem reports it (the local-disk cache keys on it)


@dataclass
class ParquetStore:
    """An opened dataset: its Unischema, files and row-group index."""

    url: str
    filesystem: pafs.FileSystem
    path: str
    schema: Unischema
    arrow_schema: pa.Schema
    files: list[FileInfo]
    row_groups: list[RowGroupInfo]
    metadata: dict[bytes, bytes]
    schema_source: SchemaSource
    partition_names: tuple[str, ...] = ()
    #: the version read (:mod:`unihub.store.versions`); None for a dataset that records no versions
    version: int | None = None
    #: file -> the nullable columns of ``arrow_schema`` it lacks (written before an append added them):
    #: read as nulls
    _absent: dict[str, frozenset[str]] = field(default_factory=dict, repr=False, compare=False)
    #: file -> the fields of ``arrow_schema`` its own differ from in nullability only (a file another tool wrote, as
    #: Spark writes every column nullable, that ``unihub adopt`` found without nulls there): read as those
    _conform: dict[str, dict[str, pa.Field]] = field(default_factory=dict, repr=False, compare=False)
    _offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64), repr=False)
    #: footers read by open_dataset, reused so a row-group read does not fetch the footer again
    _footers: dict[str, pq.FileMetaData] = field(default_factory=dict, repr=False)
    #: each thread's open file (see _open_file); not pickled
    _open: threading.local = field(default_factory=threading.local, repr=False, compare=False)
    #: the ``unihub.extra`` metadata, parsed and checked by open_dataset (see extra_metadata)
    _extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: path -> its FileInfo, to check at each open that the file is still the one indexed
    _indexed: dict[str, FileInfo] = field(default_factory=dict, repr=False, compare=False)
    #: when page checksums and value counts are checked (see unihub.store.integrity)
    _verify: integrity.Verification = field(default="once", repr=False, compare=False)
    #: row group -> its columns read and checked (with _verify "once", not checked again); the
    #: column sets are shared between row groups (_column_sets), so memory stays one entry per group
    _verified: dict[int, frozenset[str]] = field(default_factory=dict, repr=False, compare=False)
    _column_sets: dict[frozenset[str], frozenset[str]] = field(default_factory=dict, repr=False, compare=False)
    #: a byte per row group, 1 once all its stored columns were read and checked, in shared memory:
    #: processes forked from this one (torch workers, new each epoch) see what any of them checked
    _checked_whole: mmap.mmap | None = field(default=None, repr=False, compare=False)
    #: remote files kept open where opening costs a request (pyarrow's S3: a HEAD), shared by the
    #: footers' reads and the read-ahead's (fs.remote.read_range); not pickled, nor kept in a forked process
    _remote_handles: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: columns added beside the part files (store/column_sets.py), joined by read_row_group; None: none
    side: column_sets.SideColumns | None = field(default=None, repr=False, compare=False)
    #: what ``filesystem`` reads (set through it), and the process it is for (see _in_this_process)
    _filesystem: pafs.FileSystem = field(init=False, repr=False, compare=False)
    _pid: int = field(default_factory=os.getpid, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._indexed = {f.path: f for f in self.files}
        self._checked_whole = mmap.mmap(-1, max(len(self.row_groups), 1))  # anonymous and shared, zeroed

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_open"] = None
        state["_checked_whole"] = None  # unpickled elsewhere: that process checks for itself
        state["_remote_handles"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _open=threading.local(), _pid=os.getpid())  # an unpickled filesystem is new
        self._checked_whole = mmap.mmap(-1, max(len(self.row_groups), 1))

    def _get_filesystem(self) -> pafs.FileSystem:
        self._in_this_process()
        return self._filesystem

    def _set_filesystem(self, filesystem: pafs.FileSystem) -> None:
        self._filesystem, self._pid = filesystem, os.getpid()

    @property
    def remote_handles(self) -> dict[str, Any]:
        """Remote files kept open (path -> pyarrow file), of this process."""
        self._in_this_process()
        return self._remote_handles

    @remote_handles.setter
    def remote_handles(self, handles: dict[str, Any]) -> None:
        self._in_this_process()
        self._remote_handles = handles

    def _in_this_process(self) -> None:
        """In a process forked from the one that opened the dataset (a reader's process workers, torch's
        DataLoader workers), the first use renews what holds the parent's connections: the filesystem
        (pyarrow's S3 would send this process's requests on sockets its parent and siblings use, and
        answer with whatever comes first: another file's size or bytes; see fs.remote.renewed), the
        remote files kept open, and the file that the forking thread held open."""
        if self._pid == os.getpid():
            return
        self._filesystem = remote.renewed(self._filesystem)
        self._remote_handles, self._open = {}, threading.local()
        self._pid = os.getpid()

    @property
    def num_rows(self) -> int:
        return sum(rg.num_rows for rg in self.row_groups)

    @property
    def extra_metadata(self) -> dict[str, Any]:
        """The JSON ``extra_metadata`` given to write_dataset (source format, class names, ...), as checked
        when the dataset was opened (a copy: the store's own stays as read)."""
        return copy.deepcopy(self._extra)

    @property
    def stored_schema(self) -> pa.Schema:
        """The Arrow schema of the stored columns: the part files' (``arrow_schema``), then the columns added
        beside them (store/column_sets.py), as stored."""
        if self.side is None:
            return self.arrow_schema
        return pa.schema([*self.arrow_schema, *self.side.storage_fields], metadata=self.arrow_schema.metadata)

    @property
    def missing_fields(self) -> tuple[str, ...]:
        """Fields the schema lists that the data files hold no column for (nor a partition directory). A store of no
        rows misses none: no row reads a column, and a partitioned dataset of no rows has no partition directory
        (written empty, or every row deleted)."""
        if not self.row_groups:
            return ()
        present = set(self.arrow_schema.names) | set(self.partition_names) | set(self.side.set_of if self.side else ())
        return tuple(name for name in self.schema.fields if name not in present)

    def require_fields(self, names: Collection[str]) -> None:
        """A :class:`~unihub.errors.SchemaMismatchError` naming the file and the fields, unless the files hold
        every field of ``names`` that the schema lists (the reader reads those columns)."""
        missing = [name for name in self.missing_fields if name in names]
        if missing:
            raise SchemaMismatchError(missing_fields_message(self, missing))

    @property
    def _is_local(self) -> bool:
        return isinstance(self.filesystem, pafs.LocalFileSystem)

    @property
    def total_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    def row_group_of(self, row: int) -> tuple[RowGroupInfo, int]:
        """The row group holding global row ``row`` and the row's index inside it."""
        if not 0 <= row < self.num_rows:
            raise IndexError(f"row {row} is out of range for a dataset of {self.num_rows} rows")
        i = int(np.searchsorted(self._offsets, row, side="right") - 1)
        return self.row_groups[i], row - int(self._offsets[i])

    def read_row_group(self, index: int, columns: Sequence[str] | None = None, *,
                       views: Collection[str] = (), fetched: FetchedRanges | None = None) -> pa.Table:
        """The stored (encoded) columns of one row group, partition columns and added columns included.

        Binary columns named in ``views`` (images a reader decodes) come as ``binary_view`` arrays
        viewing the memory-mapped file, not copied, where the file is local and their pages are
        plain and uncompressed (store/_pages.py); otherwise as stored. ``fetched``: the row group's
        bytes fetched ahead (readers/prefetch.py), read from memory instead of the store. Columns added
        beside the parts (store/column_sets.py) are read from their side files only when asked for (or
        ``columns`` is None)."""
        side = self.side
        added = [] if side is None else list(side.set_of) if columns is None \
            else [c for c in columns if c in side.set_of]
        if not added:
            return self._read_part(index, columns, views, fetched)
        table = self._read_part(index, None if columns is None else [c for c in columns if c not in added], views,
                                fetched)
        info = self.row_groups[index]
        joined = self._restore_tensors(side.read(info.path, info.row_group, info.num_rows,  # type: ignore[union-attr]
                                                 added, self._verify != "off"))
        for name in added:
            table = table.append_column(joined.schema.field(name), joined.column(name))
        return table

    def _read_part(self, index: int, columns: Sequence[str] | None, views: Collection[str],
                   fetched: FetchedRanges | None) -> pa.Table:
        """:meth:`read_row_group` of the part file's own columns (and the partition columns)."""
        info = self.row_groups[index]
        stored = [c for c in columns if c not in self.partition_names] if columns is not None else None
        stored, wanted, absent = self._without_absent(info, stored)
        verify = self._needs_check(index, stored)
        try:
            if fetched is not None and info.path in self._footers:
                footer = self._footers[info.path]
                parquet_file = fetched.parquet_file(footer, verify)
                table = _read_fetched(parquet_file, fetched, info.row_group, stored, views, verify)
                if held96 := int96.columns(parquet_file):
                    table = int96.exact(table, lambda: fetched.parquet_file(footer, False, coarse=True),
                                        info.row_group, stored, held96, info.path)
            else:
                parquet_file, table = self._read_opened(info, stored, views, verify)
        except (OSError, pa.ArrowException) as exc:
            error = self.read_error(exc, info, stored)
            self._close_file()
            raise error from exc
        if verify:
            leaves = integrity.nested_leaves(parquet_file.schema_arrow) if fetched is not None else self._open.leaves
            if leaves:  # nested columns: their value counts against the footer's
                integrity.check_value_counts(table, parquet_file.metadata, info.row_group, leaves, info.path)
            if self._verify == "once":
                # the names asked for: a nested path ("p.x") comes back as column "p", but checked only its leaf
                checked = self._verified.get(index, frozenset()) | frozenset(table.column_names if stored is None
                                                                              else stored) | absent
                self._verified[index] = self._column_sets.setdefault(checked, checked)
                if self._checked_whole is not None and checked.issuperset(self.arrow_schema.names):
                    self._checked_whole[index] = 1
        table = _with_nulls(table, wanted, absent, self.arrow_schema)
        if self._conform and info.path in self._conform:
            table = _conformed(table, self._conform[info.path])
        return self._add_partitions(self._restore_tensors(table), info.partition, columns)

    def _read_opened(self, info: RowGroupInfo, stored: Sequence[str] | None, views: Collection[str],
                     verify: bool) -> tuple[pq.ParquetFile, pa.Table]:
        """The row group read through this thread's open file (see ``_open_file``)."""
        walked: dict[int, list[parquet_pages.Page]] = {}  # the pages the checksums' walk parsed, by leaf
        arrow_checks = verify and not self._checksums_pass(info, stored, walked)
        parquet_file = self._open_file(info.path, arrow_checks)
        names = stored if stored is not None else parquet_file.schema_arrow.names
        viewed = self._viewed_columns(parquet_file, info, [n for n in names if n in views], arrow_checks,
                                      walked) if views else {}
        rest = [c for c in names if c not in viewed] if viewed else stored
        # one thread per read: readers parallelise across row groups already
        table = parquet_file.read_row_group(info.row_group, columns=rest, use_threads=False)
        if self._open.int96:  # Spark's default timestamps: the instants they hold, none wrapped
            table = int96.exact(table, lambda: self._open_file(info.path, False, coarse=True), info.row_group, rest,
                                self._open.int96, info.path)
        if viewed:
            table = _with_viewed(table, names, viewed, parquet_file.schema_arrow)
        self._open.bytes_read += info.total_byte_size
        return parquet_file, table

    def chunk_spans(self, index: int, columns: Sequence[str] | None = None) -> list[tuple[int, int]]:
        """``(start, stop)`` in its file of each column chunk of row group ``index`` that a read of
        ``columns`` (None: all) reads, from the footer read at opening (none where there is none)."""
        info = self.row_groups[index]
        footer = self._footers.get(info.path)
        if footer is None:
            return []
        _footer.check(footer, info.path)
        group = footer.row_group(info.row_group)
        wanted = None if columns is None else [c for c in columns if c not in self.partition_names]
        spans = []
        for i in range(group.num_columns):
            chunk = group.column(i)
            path = chunk.path_in_schema
            if wanted is not None and not any(path == name or path.startswith(name + ".") for name in wanted):
                continue
            start = chunk.data_page_offset
            if chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < start:
                start = chunk.dictionary_page_offset
            spans.append((start, start + chunk.total_compressed_size))
        return spans

    def file_size(self, path: str) -> int | None:
        """The size of a data file as listed when the dataset was opened (None where unknown)."""
        indexed = self._indexed.get(path)
        return indexed.size_bytes if indexed is not None and indexed.size_bytes else None

    def _without_absent(self, info: RowGroupInfo, stored: list[str] | None
                        ) -> tuple[list[str] | None, list[str] | None, frozenset[str]]:
        """(the columns to read from ``info``'s file, the columns wanted, those it lacks): a file from before an
        append added nullable fields lacks them (see open_dataset), and they are read as nulls."""
        absent = self._absent.get(info.path, frozenset()) if self._absent else frozenset()
        if not absent:
            return stored, stored, absent
        wanted = stored if stored is not None else list(self.arrow_schema.names)
        return [c for c in wanted if c not in absent], wanted, absent

    def _viewed_columns(self, parquet_file: pq.ParquetFile, info: RowGroupInfo, names: Sequence[str],
                        verify: bool, walked: Mapping[int, list[parquet_pages.Page]]) -> dict[str, pa.Array]:
        """The columns of ``names`` that :func:`parquet_pages.plain_binary_column` reads from this
        thread's memory map of the file (only local files are mapped); ``walked``: pages the checksums'
        walk parsed, by leaf."""
        if not self._is_local or not names:
            return {}
        mapped = self._mapped()
        held = self._open
        if held.binary_leaves is None:
            held.binary_leaves = parquet_pages.binary_leaves(parquet_file)
        found = {}
        for name in names:
            leaf = held.binary_leaves.get(name)
            if leaf is not None:
                array = parquet_pages.plain_binary_column(mapped, parquet_file.metadata, info.row_group, leaf,
                                                          verify=verify, pages=walked.get(leaf))
                if array is not None:
                    found[name] = array
        return found

    def _checksums_pass(self, info: RowGroupInfo, stored: Sequence[str] | None,
                        walked: dict[int, list[parquet_pages.Page]] | None = None) -> bool:
        """Whether the pages of the ``stored`` columns (None: all) of a row group of a local file
        were checked here, against their CRCs at memory speed (parquet_pages.checksums_pass), and
        pass; Arrow's own check (~2 GB/s) then need not run. False elsewhere: Arrow checks, and
        names a damaged page in its error."""
        if not self._is_local:
            return False
        footer = self._footers.get(info.path)  # decided before opening: a group left to Arrow opens one file
        if footer is not None and not self._worth_walking(footer, info.row_group):
            return False
        parquet_file = self._open_file(info.path, False)
        metadata = parquet_file.metadata
        if footer is None and not self._worth_walking(metadata, info.row_group):
            return False
        if stored is None:
            leaves: Collection[int] = range(metadata.num_columns)
        else:
            held = self._open
            if held.leaves_by_name is None:
                held.leaves_by_name = _leaves_by_name(parquet_file)
            leaves = {leaf for name in stored for leaf in held.leaves_by_name.get(name, ())}
        data = memoryview(self._mapped()).cast("B")
        return parquet_pages.checksums_pass(data, metadata, info.row_group, leaves, walked)

    @staticmethod
    def _worth_walking(metadata: pq.FileMetaData, row_group: int) -> bool:
        """Whether a row group's chunks are big enough for the walk to cost less than Arrow's CRC."""
        return metadata.row_group(row_group).total_byte_size >= WALK_MIN_CHUNK_BYTES * metadata.num_columns

    def _mapped(self) -> pa.Buffer:
        """This thread's open local file as one buffer of its memory map (not copied)."""
        held = self._open
        if held.mapped is None:
            held.handle.seek(0)
            held.mapped = held.handle.read_buffer(held.handle.size())
        return held.mapped

    def _needs_check(self, index: int, stored: Sequence[str] | None) -> bool:
        """Whether this read verifies page checksums and value counts (see ``_verify``)."""
        if self._verify != "once":
            return self._verify == "always"
        if self._checked_whole is not None and self._checked_whole[index]:
            return False
        checked = self._verified.get(index)
        if checked is None:
            return True
        return any(name not in checked for name in (self.arrow_schema.names if stored is None else stored))

    def read_error(self, exc: BaseException, info: RowGroupInfo, stored: Sequence[str] | None) -> UnihubError:
        """What a failed row-group read raises: the remote store's failure, a page that fails its
        checksum, or a file that is not readable Parquet; on an object store first the object removed or
        replaced since the dataset was opened (:meth:`_changed_since_opened`)."""
        changed = self._changed_since_opened(exc, info.path)
        if changed is not None:
            return changed
        failure = remote.as_remote_error(exc, remote.display_url(self.filesystem, info.path),
                                         detail=_row_group_bytes(self._footers.get(info.path), info.row_group))
        if failure is not None:
            return failure
        parquet_file = (getattr(self._open, "files", None) or {}).get(True)
        if integrity.is_checksum_failure(exc) and parquet_file is not None:
            return integrity.checksum_error(parquet_file, info.path, info.row_group, stored, exc)
        return FormatError(f"{info.path}: cannot read row group {info.row_group}: {exc}", path=info.path)

    def _changed_since_opened(self, exc: BaseException, path: str) -> DatasetChangedError | None:
        """The error of a remote read that failed because its object was removed or replaced since the dataset was
        opened, else None. Such a read failed as a FormatError ('cannot read row group: The specified key does
        not exist', or the old footer's offsets applied to the new bytes: the read-ahead's ranged reads carry no
        ETag) or, through pyarrow's S3, as a store that failed 'after the retries'. One request, only where the
        read failed for no failure of the store itself (or with its "not found")."""
        if self._is_local or isinstance(exc, DatasetChangedError) or \
                (remote.is_remote_failure(exc) and not any(code in str(exc) for code in _NOT_FOUND)):
            return None
        try:
            publish.fresh(self.filesystem, path)  # s3fs would answer from the listing it holds
            now = self.filesystem.get_file_info(path)
        except Exception:  # noqa: BLE001  (the read's own error says what failed)
            return None
        indexed = self._indexed.get(path)
        if now.type == pafs.FileType.NotFound:
            return DatasetChangedError(f"{path}: the file is gone since {self.url} was opened (overwritten or "
                                       "removed while it was read); open the dataset again to read what is there "
                                       "now", path=path)
        if indexed is None or not indexed.size_bytes or \
                (now.size, now.mtime_ns if indexed.mtime_ns is not None else None) == (indexed.size_bytes,
                                                                                       indexed.mtime_ns):
            return None
        return DatasetChangedError(f"{path}: the file changed since {self.url} was opened: it was overwritten "
                                   "while it was read, and rows of two versions would mix; open the dataset again "
                                   "to read what is there now", path=path)

    def _restore_tensors(self, table: pa.Table) -> pa.Table:
        """Tensors stored as fixed-size bytes (see TensorCodec) back as ``fixed_shape_tensor`` columns."""
        for i, name in enumerate(table.column_names):
            column = table.column(i)
            if not pa.types.is_fixed_size_binary(column.type) or name not in self.schema.fields:
                continue
            field_ = self.schema[name]
            if parquet_tensor_type(field_) != column.type:
                continue
            chunks = [tensor_from_parquet(field_, chunk) for chunk in column.chunks]
            tensor_type = field_.codec.arrow_type(field_)  # type: ignore[union-attr]
            table = table.set_column(i, pa.field(name, tensor_type, table.schema.field(i).nullable),
                                     pa.chunked_array(chunks, type=tensor_type))
        return table

    def _open_file(self, path: str, verify: bool, coarse: bool = False) -> pq.ParquetFile:
        """This thread's open ``ParquetFile`` for ``path`` (verifying page checksums or not; ``coarse``: reading
        INT96 as microseconds, see store/int96.py), kept between reads of the same file.

        Opening costs about as much as reading a small row group (the Arrow schema is
        rebuilt from the footer), so each thread keeps its last file open. Local files are
        memory-mapped (one copy fewer per read); the mapping is renewed after
        ``_MAPPED_BYTES_BEFORE_REOPEN`` bytes so mapped pages do not pile up in the
        process's resident memory over an epoch.
        """
        self._in_this_process()
        held = self._open
        current = getattr(held, "path", None)
        if current != path or held.bytes_read >= _MAPPED_BYTES_BEFORE_REOPEN:
            self._close_file()
            try:
                handle, opened = self._open_handle(path)
            except FileNotFoundError as exc:
                raise DatasetChangedError(f"{path}: the file is gone since {self.url} was opened (overwritten or "
                                          "removed while it was read); open the dataset again to read what is "
                                          "there now", path=path) from exc
            self._check_unchanged(path, handle, opened)
            held.handle, held.path, held.bytes_read, held.files, held.leaves = handle, path, 0, {}, None
            held.mapped = held.binary_leaves = held.leaves_by_name = held.int96 = None
        key = "coarse" if coarse else verify
        found = held.files.get(key)
        if found is None:
            # pre-buffering coalesces remote reads; on a memory map it is only an extra copy
            found = held.files[key] = pq.ParquetFile(held.handle, metadata=self._footers.get(path),
                                                     pre_buffer=not self._is_local, page_checksum_verification=verify,
                                                     **(int96.COARSE_OPTIONS if coarse else {}))
            _footer.share(found.metadata, self._footers.get(path))
            if held.leaves is None:
                held.leaves = integrity.nested_leaves(found.schema_arrow)
            if held.int96 is None:
                held.int96 = int96.columns(found)
        return found

    def _open_handle(self, path: str) -> tuple[Any, str]:
        """``path`` opened (memory-mapped where local), and the path opened: of a version (``self.version``),
        a file that a delete took out of the directory since is read where it is kept for older versions."""
        try:
            return (pa.memory_map(path) if self._is_local else self.filesystem.open_input_file(path)), path
        except FileNotFoundError:
            root = self.path.rstrip("/")
            if self.version is None or not path.startswith(root + "/"):
                raise
            kept = fsutil.join(root, publish.RETIRED_DIR, path[len(root) + 1:])
            return (pa.memory_map(kept) if self._is_local else self.filesystem.open_input_file(kept)), kept

    def _check_unchanged(self, path: str, handle: Any, opened: str | None = None) -> None:
        """Refuse a file that is not the one indexed when the dataset was opened: its footer (row-group
        offsets) would be applied to other bytes. One ``stat`` per open on a local disk (size and
        modification time); elsewhere the size the open file reports (no extra request)."""
        indexed = self._indexed.get(path)
        if indexed is None or not indexed.size_bytes:  # a listing that gave no size: nothing to compare
            return
        if self._is_local:
            stat = os.stat(opened or path)
            now: tuple[int, int | None] = (stat.st_size, stat.st_mtime_ns if indexed.mtime_ns is not None else None)
        else:
            now = (handle.size(), indexed.mtime_ns)
        if now == (indexed.size_bytes, indexed.mtime_ns):
            return
        handle.close()
        change = (f"{indexed.size_bytes:,} bytes then, {now[0]:,} now" if now[0] != indexed.size_bytes
                  else "same size, modified since")
        raise DatasetChangedError(f"{path}: the file changed since {self.url} was opened ({change}): it was "
                                  "overwritten while it was read, and rows of two versions would mix; open the "
                                  "dataset again to read what is there now", path=path)

    def _close_file(self) -> None:
        held = self._open
        if getattr(held, "path", None) is not None:
            held.handle.close()
            held.files, held.handle, held.path, held.mapped = {}, None, None, None

    def _add_partitions(self, table: pa.Table, partition: tuple[tuple[str, str], ...],
                        columns: Sequence[str] | None) -> pa.Table:
        for key, raw in partition:
            if columns is not None and key not in columns:
                continue
            field_ = self.schema[key]
            value = partition_value(field_, raw)
            table = table.append_column(field_.arrow_field(), pa.array([value] * table.num_rows,
                                                                       type=field_.arrow_type()))
        return table


#: ``filesystem`` stays the dataclass's field (the constructor's argument) and reads as this process's:
#: every use of ``store.filesystem`` (the readers', the page index's, the read-ahead's) goes through it
ParquetStore.filesystem = property(
    ParquetStore._get_filesystem, ParquetStore._set_filesystem,
    doc="The filesystem the dataset is read through; in a process forked from the one that opened it, that "
        "process's own (see ``_in_this_process``).")


class FetchedRanges:
    """Byte ranges of a data file fetched ahead of a read (readers/prefetch.py), read as that file:
    what lies in them from memory, anything else (a page the footer's offsets left out) from the store."""

    def __init__(self, filesystem: pafs.FileSystem, path: str, parts: Sequence[tuple[int, Any]],
                 size: int | None = None) -> None:
        self.filesystem, self.path, self.size = filesystem, path, size
        self.parts = sorted(((offset, memoryview(data).cast("B")) for offset, data in parts), key=lambda p: p[0])
        self.missed = 0  # reads that went to the store

    @property
    def nbytes(self) -> int:
        return sum(len(data) for _, data in self.parts)

    def read_at(self, offset: int, nbytes: int) -> bytes:
        """``nbytes`` at ``offset``: from the parts where they cover it (one after another), else the store."""
        pieces, position, stop = [], offset, offset + nbytes
        for start, data in self.parts:
            if start <= position < start + len(data):
                pieces.append(data[position - start:min(stop, start + len(data)) - start])
                position = start + len(data)
                if position >= stop:
                    return b"".join(pieces)
        self.missed += 1
        return bytes(remote.read_range(self.filesystem, self.path, offset, offset + nbytes))

    def part_holding(self, start: int, stop: int) -> tuple[int, pa.Buffer] | None:
        """(its offset, its bytes) of the fetched part that holds bytes ``start:stop`` whole; None where none does."""
        for offset, data in self.parts:
            if offset <= start and stop <= offset + len(data):
                return offset, pa.py_buffer(data)
        return None

    def parquet_file(self, footer: pq.FileMetaData, verify: bool, coarse: bool = False) -> pq.ParquetFile:
        """A ``ParquetFile`` reading the fetched bytes (and the store for the rest), with ``footer``; ``coarse``:
        reading INT96 as microseconds (store/int96.py)."""
        from pyarrow import PythonFile

        size = self.size if self.size is not None else footer.serialized_size + max(
            (start + len(data) for start, data in self.parts), default=0)
        found = pq.ParquetFile(PythonFile(_RangesFile(self, size), mode="r"), metadata=footer, pre_buffer=False,
                               page_checksum_verification=verify, **(int96.COARSE_OPTIONS if coarse else {}))
        _footer.share(found.metadata, footer)
        return found


def _read_fetched(parquet_file: pq.ParquetFile, fetched: FetchedRanges, row_group: int, stored: Sequence[str] | None,
                  views: Collection[str], verify: bool) -> pa.Table:
    """A row group read from its fetched bytes: the binary columns of ``views`` (images the reader decodes)
    whose chunk lies in one fetched part as views of it (store/_pages.py, as a local file's are of its
    memory map; not marked :data:`VIEWS_OF_FILE`: a value held pins the part), the rest by pyarrow."""
    names = stored if stored is not None else parquet_file.schema_arrow.names
    wanted = [n for n in names if n in views] if views else []
    viewed = {}
    if wanted and _footer.problem(parquet_file.metadata) is None:
        leaves = parquet_pages.binary_leaves(parquet_file)
        metadata = parquet_file.metadata
        for name in wanted:
            leaf = leaves.get(name)
            if leaf is None:
                continue
            held = fetched.part_holding(*parquet_pages.chunk_span(metadata.row_group(row_group).column(leaf)))
            array = parquet_pages.plain_binary_column(held[1], metadata, row_group, leaf, verify=verify,
                                                      origin=held[0]) if held is not None else None
            if array is not None:
                viewed[name] = array
    if not viewed:
        return parquet_file.read_row_group(row_group, columns=stored, use_threads=False)
    table = parquet_file.read_row_group(row_group, columns=[c for c in names if c not in viewed], use_threads=False)
    for position, name in enumerate(names):
        if name in viewed:
            stored_field = parquet_file.schema_arrow.field(name)
            table = table.add_column(position, pa.field(name, pa.binary_view(), stored_field.nullable,
                                                        stored_field.metadata), viewed[name])
    return table


class _RangesFile:
    """The file object a ``PythonFile`` reads :class:`FetchedRanges` through."""

    def __init__(self, ranges: FetchedRanges, size: int) -> None:
        self.ranges, self.size, self.position, self.closed = ranges, size, 0, False

    def read(self, nbytes: int = -1) -> bytes:
        if nbytes < 0:
            nbytes = self.size - self.position
        data = self.ranges.read_at(self.position, nbytes)
        self.position += len(data)
        return data

    def seek(self, position: int, whence: int = 0) -> int:
        self.position = position if whence == 0 else self.position + position if whence == 1 else self.size + position
        return self.position

    def tell(self) -> int:
        return self.position

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


def _with_viewed(table: pa.Table, names: Sequence[str], viewed: Mapping[str, pa.Array],
                 file_schema: pa.Schema) -> pa.Table:
    """``table`` (the columns read by pyarrow) with the ``viewed`` ones put back in ``names``' order,
    each marked :data:`VIEWS_OF_FILE`."""
    for position, name in enumerate(names):
        if name in viewed:
            stored = file_schema.field(name)
            metadata = {**(stored.metadata or {}), VIEWS_OF_FILE: b"1"}
            table = table.add_column(position, pa.field(name, pa.binary_view(), stored.nullable, metadata),
                                     viewed[name])
    return table


def _with_nulls(table: pa.Table, names: Sequence[str] | None, absent: frozenset[str], schema: pa.Schema) -> pa.Table:
    """``table`` with the columns of ``names`` it lacks (``absent``) as nulls of ``schema``'s types, in ``names``'
    order; ``table`` itself where none are absent."""
    if not absent or names is None:
        return table
    columns = [table.column(n) if n in table.column_names else pa.nulls(table.num_rows, schema.field(n).type)
               for n in names]
    fields = [table.schema.field(n) if n in table.column_names else schema.field(n) for n in names]
    return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=table.schema.metadata))


def _conformed(table: pa.Table, fields: Mapping[str, pa.Field]) -> pa.Table:
    """``table`` with its columns of ``fields`` flagged nullable as those are (lists' elements too: a cast, which copies
    nothing); a column read as views of the file (binary) keeps its type."""
    columns, flagged = [], []
    for name, column in zip(table.column_names, table.columns):
        target = fields.get(name)
        own = table.schema.field(name)
        if target is not None:
            if not column.type.equals(target.type) and not pa.types.is_binary_view(column.type):
                column = column.cast(target.type)
            own = pa.field(name, column.type, target.nullable, own.metadata)
        columns.append(column)
        flagged.append(own)
    return pa.Table.from_arrays(columns, schema=pa.schema(flagged, metadata=table.schema.metadata))


def same_type_nulls_aside(found: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether two Arrow types hold the same values but for where nulls may be: lists' and structs' fields compared
    whatever their nullability (Spark writes every one nullable)."""
    if pa.types.is_list(found) and pa.types.is_list(wanted) or \
            pa.types.is_large_list(found) and pa.types.is_large_list(wanted):
        return same_type_nulls_aside(found.value_type, wanted.value_type)
    if pa.types.is_fixed_size_list(found) and pa.types.is_fixed_size_list(wanted):
        return found.list_size == wanted.list_size and same_type_nulls_aside(found.value_type, wanted.value_type)
    if pa.types.is_struct(found) and pa.types.is_struct(wanted):
        return [f.name for f in found] == [f.name for f in wanted] and \
            all(same_type_nulls_aside(a.type, b.type) for a, b in zip(found, wanted))
    return found.equals(wanted)


def _leaves_by_name(parquet_file: pq.ParquetFile) -> dict[str, list[int]]:
    """The Parquet leaf columns pyarrow may read for each name it is asked for: every leaf whose
    dotted path is the name or starts with the name and a dot. pyarrow selects leaves by the same
    prefixes, taken at its path's component boundaries, so this is that selection or more (a
    top-level name with a dot in it: ``a.b`` beside a struct ``a`` with a field ``b`` names both),
    and checking what it names never leaves out a leaf pyarrow reads."""
    found: dict[str, list[int]] = {}
    schema = parquet_file.metadata.schema
    for leaf in range(len(schema)):
        path = schema.column(leaf).path
        found.setdefault(path, []).append(leaf)
        dot = path.find(".")
        while dot >= 0:
            found.setdefault(path[:dot], []).append(leaf)
            dot = path.find(".", dot + 1)
    return found


def views_the_file(column_field: pa.Field) -> bool:
    """Whether a column of a table ``read_row_group`` returned is views of the file (:data:`VIEWS_OF_FILE`)."""
    return bool(column_field.metadata) and VIEWS_OF_FILE in column_field.metadata


@remote.naming_url("url")
def open_dataset(url: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, filesystem: Any = None,
                 storage_options: dict[str, Any] | None = None, version: int | None = None,
                 tag: str | None = None) -> ParquetStore:
    """Open a dataset (a directory of Parquet files, one file, or a list of files of one dataset on
    one filesystem, as Petastorm's ``make_batch_reader`` takes) and index its row groups.

    A dataset that records versions (:mod:`unihub.store.versions`) is read at its latest version, or at
    ``version=`` (a number) or ``tag=``; the store keeps to it (``store.version``): files appended later
    are not seen."""
    if not isinstance(url, (str, os.PathLike)):
        if version is not None or tag is not None:
            raise VersionNotFoundError("version=/tag= name a version of a dataset directory, not of a "
                                                "list of files")
        return _open_files([os.fspath(u) for u in url], filesystem, storage_options)
    url = os.fspath(url)
    fs, root = fsutil.resolve_filesystem(url, filesystem, storage_options)
    listing = RemoteListing.of(fs, root)  # remote: the whole open's one listing (it is a directory)
    info = pafs.FileInfo(root, pafs.FileType.Directory) if listing is not None else fs.get_file_info(root)
    if info.type == pafs.FileType.NotFound:
        left = publish.settle(fs, root)  # an overwrite a kill stopped half-way: its old dataset put back
        info = fs.get_file_info(root)
    if info.type == pafs.FileType.NotFound:
        hint = f" (an interrupted overwrite left the previous dataset in {left}; rename it to {root})" if left else ""
        # a path without a scheme: also Petastorm's ValueError (it refused scheme-less URLs)
        missing = DatasetNotFoundError if "://" in url else DatasetUrlError
        raise missing(f"{url}: no such file or directory{hint}")
    pinned = None
    if info.type == pafs.FileType.File:
        if version is not None or tag is not None:
            raise VersionNotFoundError(f"{url}: a single Parquet file has no versions")
        paths, common = [root], None
        sizes = {root: info}
        base = os.path.dirname(root)
    else:
        paths, sizes, common_path, pinned, listing = _published_files(fs, root, version, tag, listing)
        base = root
        if not paths and pinned is None:
            raise DatasetNotFoundError(f"{url}: the directory holds no Parquet data files "
                                       "(is it a dataset? files starting with '_' or '.' are ignored)")
        handles: dict[str, Any] = {}
        common, footers = _read_all_metadata(fs, common_path, paths, sizes, handles, listing)
        store = _store(url, fs, root, base, paths, sizes, common, footers, evolved=pinned is not None)
        store.remote_handles = handles
        store.version = pinned.number if pinned is not None else None
        record = column_sets.of_version(pinned.column_sets, versions.record_path(root, pinned.number)) \
            if pinned is not None else None
        if record is None and listing is not None and not listing.has(column_sets.RECORD):
            return store  # no column sets: the listing says so, no request
        return _with_column_sets(store, record)
    return _store(url, fs, root, base, paths, sizes, None)


def _read_all_metadata(fs: pafs.FileSystem, common_path: str, paths: list[str], sizes: Mapping[str, pafs.FileInfo],
                       handles: dict[str, Any], listing: RemoteListing | None = None
                       ) -> tuple[pq.FileMetaData | None, list[pq.FileMetaData]]:
    """``_common_metadata`` (None where there is none) and the data files' footers; on an object store
    at once, each footer one ranged GET of the file's tail (the listing gave its size): a dataset opens
    in the round trips of its listing and one more (pyarrow's own filesystems: two, a HEAD to open the file
    first); ``_common_metadata`` is not asked for where the ``listing`` lacks it, and read as a footer is
    where it has it."""
    if isinstance(fs, pafs.LocalFileSystem):
        common = read_metadata(fs, common_path) if fsutil.exists(fs, common_path) else None
        return common, read_footers(fs, paths, sizes)
    common_entry = listing.entry(common_path) if listing is not None else None
    with ThreadPoolExecutor(max_workers=1) as pool:
        common = pool.submit(_common_or_none, fs, common_path, common_entry.size if common_entry else None) \
            if listing is None or common_entry is not None else None
        footers = read_footers(fs, paths, sizes, at_once=True, handles=handles)
        return common.result() if common is not None else None, footers


def _common_or_none(fs: pafs.FileSystem, path: str, size: int | None = None) -> pq.FileMetaData | None:
    try:
        return read_metadata(fs, path, size)
    except (FileNotFoundError, DatasetChangedError):
        return None
    except FormatError as exc:
        if isinstance(exc.__cause__, FileNotFoundError) or not fsutil.exists(fs, path):
            return None
        raise


def _with_column_sets(store: ParquetStore, record: column_sets.Record | None) -> ParquetStore:
    """``store`` with the column sets of its version (``record``; None: a dataset that records no versions,
    those in its ``_unihub_columns.json`` if any; store/column_sets.py) that apply to its parts joined: their
    fields added to its schema, their side files read by ``read_row_group``."""
    side = column_sets.side_columns(store.filesystem, store.path,
                                    {f.path: (f.num_rows, f.size_bytes) for f in store.files}, record)
    if side is None:
        return store
    clash = [f.name for f in side.fields if f.name in store.schema.fields or f.name in store.arrow_schema.names]
    if clash:
        raise SchemaError(f"{store.url}: column set field(s) {clash} are also columns of the part files; remove the "
                          f"set (unihub.remove_columns) or rename the field")
    store.side = side
    store.schema = Unischema(store.schema.name, [*store.schema, *side.fields],
                             attributes=store.schema.attribute_names)
    return store


def get_schema_from_dataset_url(dataset_url_or_urls: Any, hdfs_driver: str = "libhdfs3",
                                storage_options: dict[str, Any] | None = None, filesystem: Any = None) -> Unischema:
    """The Unischema stored in a dataset's metadata, unihub's or Petastorm's (Petastorm's function).

    Takes what :func:`open_dataset` takes: a directory URL or a list of file URLs. Plain
    Parquet, with no Unischema stored, is a :class:`~unihub.errors.PetastormMetadataError`,
    as in Petastorm (:func:`infer_or_load_unischema` infers one instead). ``hdfs_driver`` is
    accepted for Petastorm's signature; pyarrow picks the HDFS client::

        fields = match_unischema_fields(get_schema_from_dataset_url("file:///data/ds"), ["image.*"])
    """
    return stored_schema(open_dataset(dataset_url_or_urls, filesystem=filesystem, storage_options=storage_options))


def stored_schema(store: ParquetStore) -> Unischema:
    """``store``'s Unischema if its metadata holds one; for plain Parquet an error that says what to do."""
    if store.schema_source != "inferred":
        return store.schema
    raise PetastormMetadataError(
        f"{store.url}: no Unischema in the dataset's metadata (plain Parquet: neither unihub's "
        f"{SCHEMA_METADATA_KEY!r} nor Petastorm's 'dataset-toolkit.unischema.v1'). Store one with "
        f"`unihub add-schema {store.url}` (unihub.add_schema, which infers it from the Parquet types unless "
        "given one), or read the files as they are with make_batch_reader")


def infer_or_load_unischema(dataset: Any) -> Unischema:
    """The dataset's stored Unischema, or one inferred from its Parquet types (Petastorm's function).

    ``dataset``: an open :class:`ParquetStore`, a ``pyarrow.parquet.ParquetDataset``, or what
    :func:`open_dataset` takes (a URL, a path, a list of file URLs).
    """
    return store_of(dataset).schema


def store_of(dataset: Any) -> ParquetStore:
    """``dataset`` as a store, for Petastorm's functions that took a ``pyarrow.parquet.ParquetDataset``:
    an open :class:`ParquetStore` as it is; a ``ParquetDataset`` (pyarrow's current one) by its directory
    where it was made from one (so its ``_common_metadata`` and versions count), else by its files; else
    what :func:`open_dataset` takes (a URL, a path, a list of file URLs)."""
    if isinstance(dataset, ParquetStore):
        return dataset
    if isinstance(dataset, pq.ParquetDataset):
        base = getattr(dataset, "_base_dir", None)  # pyarrow's attribute for a dataset made from a directory
        if isinstance(base, str):
            return open_dataset(_absolute(dataset.filesystem, base), filesystem=dataset.filesystem)
        return open_dataset([_absolute(dataset.filesystem, f) for f in dataset.files], filesystem=dataset.filesystem)
    return open_dataset(dataset)


def _absolute(fs: pafs.FileSystem, path: str) -> str:
    """A local file's absolute path (a ``ParquetDataset`` keeps paths as given); other paths as they are."""
    return os.path.abspath(path) if isinstance(fs, pafs.LocalFileSystem) else path


def _open_files(urls: list[str], filesystem: Any, storage_options: dict[str, Any] | None) -> ParquetStore:
    """Several Parquet files (of one dataset, on one filesystem) as one store, in the order given."""
    if not urls:
        raise DatasetUrlError("dataset url list must be non-empty: an empty list of dataset URLs has nothing to "
                              "read")  # Petastorm's words and ValueError
    schemes = {(urlparse(u).scheme if "://" in u else "") or "file" for u in urls}
    if len(schemes) > 1:
        raise DatasetNotFoundError(f"dataset URLs must share one scheme (filesystem), got {sorted(schemes)}")
    fs, _ = fsutil.resolve_filesystem(urls[0], filesystem, storage_options)
    paths = [fsutil.resolve_filesystem(u, filesystem, storage_options)[1] for u in urls]
    sizes = {}
    for url, path in zip(urls, paths):
        info = fs.get_file_info(path)
        if info.type != pafs.FileType.File:
            raise DatasetNotFoundError(f"{url}: not a Parquet file (a list of URLs names files; pass a directory "
                                       "alone to read all of it)")
        sizes[path] = info
    base = posixpath.commonpath([posixpath.dirname(p) for p in paths]) if len(paths) > 1 else posixpath.dirname(paths[0])
    common_path = fsutil.join(base, COMMON_METADATA)
    common = read_metadata(fs, common_path) if fsutil.exists(fs, common_path) else None
    return _store(urls[0], fs, base, base, paths, sizes, common)  # a file listed twice is read twice (Petastorm)


def _store(url: str, fs: pafs.FileSystem, root: str, base: str, paths: list[str],
           sizes: dict[str, pafs.FileInfo], common: pq.FileMetaData | None,
           footers: list[pq.FileMetaData] | None = None, evolved: bool = False) -> ParquetStore:
    """The store of data files ``paths`` (their partitions relative to ``base``; ``footers``: read already);
    ``evolved``: a version of a dataset whose appends may have added nullable fields, whose schema is its
    ``common``'s."""
    if footers is None:
        footers = read_footers(fs, paths)
    partitions = [partition_of(base, p) for p in paths]
    keyed = keyed_partitions(paths, partitions, [footer.num_rows for footer in footers])
    stored = [footer.schema.to_arrow_schema() for footer in footers]
    evolving = evolved and common is not None and bool(paths)  # the files' columns checked against the version's
    file_schema, absent = _columns_of(url, paths, stored, common, evolving)
    kv = dict(common.metadata or {}) if common is not None else {}
    found_in = {key: fsutil.join(root, COMMON_METADATA) for key in kv}
    for key, value in ((footers[0].metadata if footers else None) or {}).items():
        kv.setdefault(key, value)
        found_in.setdefault(key, paths[0])
    schema, source = resolve_schema(kv, file_schema, keyed, url, found_in)
    raw_extra = kv.get(EXTRA_METADATA_KEY)
    extra = load_metadata_json(raw_extra, EXTRA_METADATA_KEY, where=found_in[EXTRA_METADATA_KEY]) \
        if raw_extra else {}
    if not evolving:
        check_files_agree(paths, footers, file_schema, stored)
    # a version's files only: another tool's file joins one by adopt_files, which checked it holds no null where
    # the version's schema has none (a dataset without versions may hold nulls under any flag: left as it is)
    conform = _nulls_to_conform(paths, stored, file_schema) if evolving else {}
    files, row_groups, offsets = _index(paths, footers, partitions, sizes)
    names = tuple(k for k, _ in keyed[0]) if keyed else ()
    return ParquetStore(url=url, filesystem=fs, path=root, schema=schema, arrow_schema=file_schema,
                        files=files, row_groups=row_groups, metadata=kv, schema_source=source,
                        partition_names=names, _offsets=offsets, _footers=dict(zip(paths, footers)),
                        _verify=integrity.verification(), _extra=extra, _absent=absent, _conform=conform)


def _columns_of(url: str, paths: list[str], stored: list[pa.Schema], common: pq.FileMetaData | None, evolving: bool
                ) -> tuple[pa.Schema, dict[str, frozenset[str]]]:
    """The columns of the files ``paths`` (``stored``: each file's own) and those each file lacks: the first file's, a
    version's whose appends evolved its schema (``evolving``, :func:`_evolved_schema`), or, for a version without files
    (a delete of every row), its schema file's."""
    if common is not None and (evolving or not stored):
        version_schema = common.schema.to_arrow_schema()
        return _evolved_schema(paths, stored, version_schema) if stored else (version_schema, {})
    if not stored:
        raise DatasetNotFoundError(f"{url}: its version lists no data files, and its schema file is gone")
    return stored[0], {}


def _evolved_schema(paths: list[str], stored: list[pa.Schema], version_schema: pa.Schema
                    ) -> tuple[pa.Schema, dict[str, frozenset[str]]]:
    """The columns of a version whose appends added nullable fields, or appended rows without some: its schema
    file's, with the files that lack some of them (those must be nullable, and a file may hold no other column),
    else the first file's (``stored``: each file's own)."""
    names = list(version_schema.names)
    first = stored[0]
    absent = {}
    reordered = False  # a file after the first with the same columns in another order
    for k, (path, own) in enumerate(zip(paths, stored)):
        found = own.names
        if found == names:
            continue
        missing = [n for n in names if n not in found]
        if any(n not in names for n in found) or any(not version_schema.field(n).nullable for n in missing):
            raise FormatError(f"{path}: columns {found} do not fit the version's {version_schema.names}", path=path)
        if missing:
            absent[path] = frozenset(missing)
        reordered = reordered or (k > 0 and not missing)
    schema = first if names == first.names and not absent else \
        pa.schema([version_schema.field(n) for n in names], metadata=first.metadata)
    if reordered and not absent:
        check_files_agree(paths, [], schema, stored)  # raises, naming the file
    return schema, absent


def _nulls_to_conform(paths: list[str], stored: list[pa.Schema], schema: pa.Schema) -> dict[str, dict[str, pa.Field]]:
    """The files (``stored``: their schemas) whose fields differ from ``schema``'s in nullability only, with those
    fields as ``schema`` has them (``ParquetStore._conform``)."""
    conform = {}
    for path, own in zip(paths, stored):
        if own.equals(schema):  # the usual case: one comparison in C++
            continue
        differing = {n: schema.field(n) for n in own.names if _nulls_differ(own.field(n), schema.field(n))}
        if differing:
            conform[path] = differing
    return conform


def _nulls_differ(found: pa.Field, wanted: pa.Field) -> bool:
    """Whether a file's field differs from the version's in where nulls may be, and in nothing else."""
    return (found.nullable != wanted.nullable or not found.type.equals(wanted.type)) and \
        same_type_nulls_aside(found.type, wanted.type)


def missing_fields_message(store: ParquetStore, missing: Sequence[str]) -> str:
    """What a reader (or ``unihub inspect``) says of fields the schema lists but the files lack."""
    shown = ", ".join(repr(name) for name in missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10
                                                              else "")
    first = store.files[0].path if store.files else store.url
    return (f"{store.url}: the schema ({store.schema_source} metadata) lists {len(missing)} field(s) that the data "
            f"files hold no column for: {shown} (e.g. {first} has columns {store.arrow_schema.names[:8]}); "
            "read the other fields (schema_fields=), or store a schema that matches the files "
            "(unihub add-schema)")


def update_common_metadata(store: ParquetStore, entries: Mapping[bytes, bytes | None]) -> None:
    """Set (or, for a None value, remove) key-value entries of ``store``'s ``_common_metadata``.

    The new file is written beside the old one, under a name starting with '_' so no reader
    takes it for data, and renamed onto it: readers see the old file or the new one, never a
    part. Without ``_common_metadata`` one is made from the first data file's schema, as
    Petastorm does; Hadoop's checksum of the old file (``._common_metadata.crc``) is removed.
    """
    with remote.remote_errors(store.url):
        _update_common_metadata(store, entries)


def _update_common_metadata(store: ParquetStore, entries: Mapping[bytes, bytes | None]) -> None:
    fs, root = store.filesystem, store.path
    if not fsutil.is_dir(fs, root):
        raise FormatError(f"{store.url}: a single Parquet file has no _common_metadata to keep metadata in; "
                          "use a dataset directory", path=root)
    target = fsutil.join(root, COMMON_METADATA)
    if fsutil.exists(fs, target):
        arrow_schema = read_metadata(fs, target).schema.to_arrow_schema()
    else:
        arrow_schema = store._footers[store.files[0].path].schema.to_arrow_schema()
    _write_entries(fs, root, target, arrow_schema, entries, lambda temporary: fs.move(temporary, target))
    _update_published_copy(fs, root, target)
    _update_version_copy(store, entries)
    fsutil.remove(fs, fsutil.join(root, f".{COMMON_METADATA}.crc"))


def _write_entries(fs: pafs.FileSystem, root: str, target: str, arrow_schema: pa.Schema,
                   entries: Mapping[bytes, bytes | None], put: Callable[[str], None]) -> None:
    """``arrow_schema`` with ``entries`` set (or removed, for None) written to ``target``: under a temporary
    name starting with '_' first, which ``put`` puts in place."""
    metadata = dict(arrow_schema.metadata or {})
    for key, value in entries.items():
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    temporary = fsutil.join(root, f"{COMMON_METADATA}.unihub-tmp-{uuid.uuid4().hex[:12]}")
    try:
        pq.write_metadata(arrow_schema.with_metadata(metadata), temporary, filesystem=fs)
        put(temporary)
    finally:
        fsutil.remove(fs, temporary)


def _update_version_copy(store: ParquetStore, entries: Mapping[bytes, bytes | None]) -> None:
    """Where the version ``store`` read names a ``_common_metadata`` copy of its own (an append's, the schema its
    rows were written with), that copy is what unihub's readers of the version read: it gets the entries too
    (a row-group index built over its files, else invisible to them), moved or copied in place in one step."""
    if store.version is None:
        return
    fs, root = store.filesystem, store.path
    pinned = versions.resolve(fs, root, version=store.version)
    named = pinned.common_metadata if pinned is not None else None
    if named is None or named == COMMON_METADATA:
        return
    own = fsutil.join(root, named)
    local = fsutil.on_local_disk(fs)
    _write_entries(fs, root, own, read_metadata(fs, own).schema.to_arrow_schema(), entries,
                   lambda temporary: fs.move(temporary, own) if local else fs.copy_file(temporary, own))


def _update_published_copy(fs: pafs.FileSystem, root: str, common: str) -> None:
    """Where a manifest names its run's own ``_common_metadata`` (object stores), that copy is what readers
    read: it gets the new entries too (one object copy, atomic)."""
    manifest = publish.read_manifest(fs, root)
    if manifest is not None and manifest.common_metadata not in (None, COMMON_METADATA):
        fs.copy_file(common, fsutil.join(root, manifest.common_metadata))


_Published = tuple[list[str], dict[str, pafs.FileInfo], str, "versions.Version | None", "RemoteListing | None"]


def _published_files(fs: pafs.FileSystem, root: str, version: int | None = None, tag: str | None = None,
                     listing: RemoteListing | None = None) -> _Published:
    """(data files in reading order, their listing entries, the ``_common_metadata`` path, the version, the
    ``listing`` where they were found in it, else None) of a dataset directory: what its version record lists
    where it records versions (``version``/``tag``'s, else the latest), else what its manifest lists where it
    has one (an object store's: :mod:`unihub.fs.publish`), else every data file. A manifest replaced while
    this runs is read again. ``listing`` (a remote directory's, taken first): a dataset without records is
    read from it, its manifest only where it holds one (the first time: a retry lists again)."""
    # a dataset with version records (or a version asked for) is read as before: the records name its parts
    versioned = listing is None or version is not None or tag is not None or listing.holds_under(publish.VERSIONS_DIR)
    missing = ""
    for attempt in range(3):
        found = _published_once(fs, root, version, tag, None if versioned or attempt else listing)
        if not isinstance(found, str):
            return found
        missing = found
    raise publish.missing_part(missing)


def _published_once(fs: pafs.FileSystem, root: str, version: int | None, tag: str | None,
                    known: RemoteListing | None) -> _Published | str:
    """One try of :func:`_published_files` (with ``known``: from that listing); a part the version or the
    manifest names that is not there (replaced meanwhile: try again) instead."""
    pinned = versions.resolve(fs, root, version=version, tag=tag) if known is None else None
    manifest = _manifest(fs, root, known)
    sizes = list_data_files(fs, root) if known is None else known.data_files()
    if manifest is None and pinned is None:
        return sorted(sizes), sizes, fsutil.join(root, COMMON_METADATA), None, known
    listed = {p.lstrip("/"): p for p in sizes}  # (fsspec's memory filesystem lists "/x" for "x")
    chosen: versions.Version | publish.Manifest = pinned if pinned is not None else manifest  # type: ignore[assignment]
    wanted = [fsutil.join(root, p).lstrip("/") for p in chosen.parts]
    if pinned is not None and any(p not in listed for p in wanted):
        wanted = _with_retired(fs, root, sizes, listed, wanted)
    absent = next((p for p in wanted if p not in listed), None)
    if absent is not None:
        return absent
    paths = [listed[p] for p in wanted]
    common = fsutil.join(root, chosen.common_metadata or COMMON_METADATA)
    if known is not None and known.entry(common) is None and chosen.common_metadata:
        known = None  # a manifest naming a schema file the listing lacks: it is read all the same
    return paths, {p: sizes[p] for p in paths}, common, pinned, known


def _manifest(fs: pafs.FileSystem, root: str, known: RemoteListing | None) -> publish.Manifest | None:
    """The dataset's manifest: read only where ``known`` (a listing) holds one; what fsspec cached of root is
    forgotten first, unless it is that listing's."""
    if known is not None and not known.has(publish.MANIFEST):
        return None
    return publish.read_manifest(fs, root, forget_cached=known is None)


def _with_retired(fs: pafs.FileSystem, root: str, sizes: dict[str, pafs.FileInfo], listed: dict[str, str],
                  wanted: list[str]) -> list[str]:
    """``wanted`` with the files an older version lists that a delete took out of the directory found where they
    are kept (``sizes`` and ``listed`` get their entries)."""
    retired = _retired_files(fs, root)
    sizes.update(retired)
    listed.update((p.lstrip("/"), p) for p in retired)
    return [p if p in listed else _retired(root, p) for p in wanted]


def _retired_files(fs: pafs.FileSystem, root: str) -> dict[str, pafs.FileInfo]:
    """The files kept beside a dataset's version records for its older versions (path -> listing entry)."""
    selector = pafs.FileSelector(fsutil.join(root, publish.RETIRED_DIR), recursive=True, allow_not_found=True)
    return {e.path: e for e in fs.get_file_info(selector) if e.type == pafs.FileType.File}


def _retired(root: str, wanted: str) -> str:
    """Where the file ``wanted`` (a path under ``root``, as listed) is kept once a delete retired it."""
    bare = root.lstrip("/")
    return fsutil.join(bare, publish.RETIRED_DIR, wanted[len(bare):].lstrip("/"))


@dataclass(frozen=True)
class RemoteListing:
    """Every file under a remote dataset directory, from one recursive listing (one LIST request on S3 for
    up to 1,000 files) taken first when it is opened: whether it is a directory, and whether it holds
    version records, a manifest, ``_common_metadata`` or column sets, are read from it instead of asking
    the store for each (pyarrow's directory check alone is a HEAD and a LIST, one after the other)."""

    root: str
    files: dict[str, pafs.FileInfo]  # path relative to root -> its entry (files only)

    @classmethod
    def of(cls, fs: pafs.FileSystem, root: str) -> RemoteListing | None:
        """The listing of ``root`` on a remote filesystem; None locally, where nothing is under ``root``
        (then a file, or nothing: asked as before), or where the listing names paths in another form."""
        if isinstance(fs, pafs.LocalFileSystem):
            return None
        publish.fresh(fs, root)  # what fsspec cached of root is forgotten
        try:
            found = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
        except (FileNotFoundError, NotImplementedError):
            return None
        bare = root.strip("/") + "/"
        files = {}
        for entry in found:
            path = entry.path.lstrip("/")
            if not path.startswith(bare):
                return None
            if entry.type == pafs.FileType.File:
                files[path[len(bare):]] = entry
        return cls(root, files) if found else None

    def has(self, name: str) -> bool:
        """Whether the file ``name`` (relative to the root) is listed."""
        return name in self.files

    def holds_under(self, folder: str) -> bool:
        """Whether any file is listed under ``folder`` (relative to the root)."""
        prefix = folder.rstrip("/") + "/"
        return any(rel.startswith(prefix) for rel in self.files)

    def entry(self, path: str) -> pafs.FileInfo | None:
        """The entry of ``path`` (a full path under the root), or None where it is not listed."""
        bare, stripped = self.root.strip("/") + "/", path.lstrip("/")
        return self.files.get(stripped[len(bare):]) if stripped.startswith(bare) else None

    def data_files(self) -> dict[str, pafs.FileInfo]:
        """As :func:`list_data_files` finds them."""
        return _data_entries(self.root, self.files.values())


def list_data_files(fs: pafs.FileSystem, root: str) -> dict[str, pafs.FileInfo]:
    """Data file path -> its listing entry; names starting with '_' or '.' (metadata, CRCs) are skipped."""
    if isinstance(fs, pafs.LocalFileSystem):  # Arrow's recursive listing follows links into loops forever
        listing = fs.get_file_info(_local_tree(root))
    else:
        listing = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    return _data_entries(root, listing)


def _data_entries(root: str, listing: Iterable[pafs.FileInfo]) -> dict[str, pafs.FileInfo]:
    """The data files among the entries of a listing of ``root``."""
    paths = {}
    for entry in listing:
        rel = entry.path[len(root):].lstrip("/")
        if entry.type != pafs.FileType.File or any(part.startswith(("_", ".")) for part in rel.split("/")):
            continue
        paths[entry.path] = entry
    return paths


def _local_tree(root: str) -> list[str]:
    """Every path under the local directory ``root``, links followed as Arrow follows them, except a
    link back into a directory the walk is inside (``a/l -> .``): what a loop adds is never data.
    Names starting with '_' or '.' are neither listed nor walked into (list_data_files skips them): a
    dataset's side files and version records are not stat'ed at each open."""
    found: list[str] = []
    for dirpath, dirnames, filenames in sources.walk_following_links(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(("_", "."))]  # os.walk descends into what is left
        found.extend(os.path.join(dirpath, name) for name in dirnames + filenames if not name.startswith(("_", ".")))
    return found


def read_metadata(fs: pafs.FileSystem, path: str, size: int | None = None,
                  handles: dict[str, Any] | None = None, mtime_ns: int | None = None) -> pq.FileMetaData:
    """The Parquet footer of the file at ``path``; an unreadable or truncated one is a named error.
    With its ``size`` (from a listing), a remote file's footer is one ranged GET of its tail (the
    file kept open in ``handles`` where opening costs a request: ``remote.read_range``); with its size
    and ``mtime_ns`` too, a local file's footer read before in this process is not read again
    (store/footer_cache.py)."""
    key = footer_cache.key_of(path, size, mtime_ns) if isinstance(fs, pafs.LocalFileSystem) else None
    found = footer_cache.FOOTERS.get(key)
    if found is not None:
        return found
    footer = _read_metadata(fs, path, size, handles)
    footer_cache.FOOTERS.put(key, footer)
    return footer


def _read_metadata(fs: pafs.FileSystem, path: str, size: int | None, handles: dict[str, Any] | None
                   ) -> pq.FileMetaData:
    try:
        footer = None
        if size is not None and size >= _FOOTER_TAIL and not isinstance(fs, pafs.LocalFileSystem):
            footer = _footer_from_tail(fs, path, size, handles)
        if footer is None:
            with fs.open_input_file(path) as handle:
                footer = pq.read_metadata(handle)
                _footer.remember_from(footer, handle)  # its bytes, for store/_footer.py's check
    except (OSError, pa.ArrowException, UnicodeDecodeError) as exc:  # UnicodeDecodeError: a column name
        failure = remote.as_remote_error(exc, remote.display_url(fs, path))
        if failure is not None:
            raise failure from exc
        size = fs.get_file_info(path).size
        raise FormatError(f"{path}: not a readable Parquet file ({size} bytes): {exc}", path=path) from exc
    return footer


#: what pyarrow's S3 filesystem says of an object that is not there (a read's GET, not its open's HEAD)
_NOT_FOUND = ("NO_SUCH_KEY", "RESOURCE_NOT_FOUND")


def _row_group_bytes(footer: pq.FileMetaData | None, row_group: int) -> str:
    """``"row group 3, bytes 4-1027"``: where a row group's column chunks lie in its file (for errors)."""
    if footer is None or _footer.problem(footer) is not None:
        return f"row group {row_group}"
    group = footer.row_group(row_group)
    spans = []
    for i in range(group.num_columns):
        chunk = group.column(i)
        start = chunk.data_page_offset
        if chunk.has_dictionary_page and chunk.dictionary_page_offset:
            start = min(start, chunk.dictionary_page_offset)
        spans.append((start, start + chunk.total_compressed_size))
    if not spans:
        return f"row group {row_group}"
    return f"row group {row_group}, bytes {min(s for s, _ in spans)}-{max(e for _, e in spans) - 1}"


#: the tail of a remote file read for its footer: the footer's length, the magic, and most footers
_FOOTER_READ = 64 << 10
_FOOTER_TAIL = 12  # the least a Parquet file holds: "PAR1" + footer length + "PAR1"
#: a local dataset's footers read one after another up to this many files (see read_footers)
_LOCAL_SERIAL_FOOTERS = 256


def _footer_from_tail(fs: pafs.FileSystem, path: str, size: int,
                      handles: dict[str, Any] | None = None) -> pq.FileMetaData | None:
    """The footer parsed from ranged reads of the file's tail (one, or two for a footer over
    ``_FOOTER_READ``); None where the tail is no Parquet footer (the plain read then says why)."""
    tail = remote.read_range(fs, path, max(0, size - _FOOTER_READ), size, handles)
    if len(tail) < 8 or bytes(tail[-4:]) != b"PAR1":
        return None
    length = int.from_bytes(bytes(tail[-8:-4]), "little")
    if length + 8 > len(tail):
        if length + 8 > size:
            return None
        tail = remote.read_range(fs, path, size - length - 8, size, handles)
    footer = pq.read_metadata(pa.BufferReader(pa.py_buffer(tail)))
    _footer.remember(footer, memoryview(tail)[-8 - length:-8])
    return footer


def read_footers(fs: pafs.FileSystem, paths: list[str], sizes: Mapping[str, pafs.FileInfo] | None = None, *,
                 at_once: bool = False, handles: dict[str, Any] | None = None) -> list[pq.FileMetaData]:
    """The footers of ``paths``, in order (read in threads: on object stores each is a request;
    ``at_once``: in threads however few; ``sizes``: listing entries, for one GET per remote footer). On
    a local disk up to ``_LOCAL_SERIAL_FOOTERS`` are read in this thread: each is mostly parsing, which
    threads contending for the GIL make dearer (100 footers: ~19 ms of CPU in threads, ~12 ms here)."""
    def read(path: str) -> pq.FileMetaData:
        entry = sizes.get(path) if sizes is not None else None
        return read_metadata(fs, path, entry.size if entry is not None and entry.size else None, handles,
                             entry.mtime_ns if entry is not None else None)

    serial = 1 if at_once else _LOCAL_SERIAL_FOOTERS if isinstance(fs, pafs.LocalFileSystem) else 4
    if len(paths) <= serial:
        return [read(p) for p in paths]
    with ThreadPoolExecutor(max_workers=min(16, len(paths))) as pool:
        return list(pool.map(read, paths))


def resolve_schema(kv: dict[bytes, bytes], file_schema: pa.Schema, partitions: list[tuple[tuple[str, str], ...]],
                    url: str, found_in: dict[bytes, str] | None = None) -> tuple[Unischema, SchemaSource]:
    """The stored Unischema (unihub's JSON, else Petastorm's pickle), else one inferred; ``found_in`` names
    the file each metadata key was read from, for errors."""
    if SCHEMA_METADATA_KEY in kv:
        where = (found_in or {}).get(SCHEMA_METADATA_KEY, url)
        try:
            return Unischema.from_json(kv[SCHEMA_METADATA_KEY]), "unihub"
        except UnihubError as exc:  # an unknown codec's name too
            raise SchemaError(f"{where}: metadata key {SCHEMA_METADATA_KEY.decode()!r}: {exc}") from exc

    if legacy.PETASTORM_UNISCHEMA_KEY in kv:
        key = legacy.PETASTORM_UNISCHEMA_KEY
        where = (found_in or {}).get(key, url)
        return legacy.load_petastorm_unischema(kv[key], source=f"{where} ({key.decode()})"), "petastorm"
    inferred = Unischema.from_arrow_schema(file_schema, name=os.path.basename(url.rstrip("/")) or "dataset")
    extra = [_infer_partition_field(k, [dict(p).get(k, "") for p in partitions])
             for k, _ in (partitions[0] if partitions else ()) if k not in inferred]
    if extra:
        inferred = Unischema(inferred.name, [*inferred, *extra])
    return inferred, "inferred"


def _infer_partition_field(name: str, values: list[str]) -> UnischemaField:
    present = [v for v in values if v != "__HIVE_DEFAULT_PARTITION__"]
    try:
        numbers = [int(v) for v in present]
    except ValueError:
        numbers = None
    if numbers is not None and all(-2**63 <= n < 2**63 for n in numbers):  # else text, not an int64 overflow
        return UnischemaField(name, np.int64, (), ScalarCodec(pa.int64()), len(present) != len(values))
    return UnischemaField(name, np.str_, (), ScalarCodec(pa.string()), len(present) != len(values))


def check_files_agree(paths: list[str], footers: list[pq.FileMetaData], expected: pa.Schema,
                      schemas: Sequence[pa.Schema] | None = None) -> None:
    """A FormatError naming the first file whose columns are not ``expected``'s (the first file's); ``schemas``: the
    files' Arrow schemas, read from their ``footers`` already."""
    names = expected.names
    for k, path in enumerate(paths[1:], 1):
        found = (schemas[k] if schemas is not None else footers[k].schema.to_arrow_schema()).names
        if found != names:
            missing, extra = sorted(set(names) - set(found)), sorted(set(found) - set(names))
            raise FormatError(f"{path}: columns differ from {paths[0]} (missing {missing}, extra {extra})", path=path)


def _index(paths: list[str], footers: list[pq.FileMetaData], partitions: list[tuple[tuple[str, str], ...]],
           sizes: dict[str, pafs.FileInfo]) -> tuple[list[FileInfo], list[RowGroupInfo], np.ndarray]:
    files: list[FileInfo] = []
    groups: list[RowGroupInfo] = []
    first = 0
    for path, footer, partition in zip(paths, footers, partitions):
        entry = sizes.get(path)
        files.append(FileInfo(path, footer.num_rows, footer.num_row_groups, (entry.size or 0) if entry else 0, partition,
                              entry.mtime_ns if entry else None))
        for i in range(footer.num_row_groups):
            rg = footer.row_group(i)
            groups.append(RowGroupInfo(len(groups), path, i, rg.num_rows, first, rg.total_byte_size, partition))
            first += rg.num_rows
    offsets = np.array([g.first_row for g in groups] + [first], dtype=np.int64)
    return files, groups, offsets
