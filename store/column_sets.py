"""Column sets: fields added to a dataset's existing rows without rewriting its part files.

On disk, beside the parts (names starting with '_' are skipped by unihub's listing, by Spark and by
pyarrow's ``ParquetDataset``: they read the parts alone, as before)::

    dataset/
      part-00000.parquet                                        a part, never rewritten
      _unihub_versions/00000002.json                            a version: its parts and its column sets
      _unihub_columns/<set>/unihub-<run>-part-00000.parquet     set <set>'s side file for part-00000

A row is identified by (part file, row index in it); parts are immutable. A side file holds a set's
columns for one part (or several sets' columns: an add folds the part's small side files into the one it
writes, :data:`unihub.store.columns.FOLD_MAX_BYTES`, and the sets' entries name the same file, read once):
the same rows and the same row-group boundaries, so row group g of the part
joins row group g of the side file one to one, with no key join. ``ParquetStore.read_row_group``
(store/dataset.py), which every reader, bridge, random access, ``show`` and export reads through,
reads a side file only when its columns are asked for: a reader that does not select them pays
nothing. Rows of parts a set does not cover (appended later) read as nulls.

The column sets of a dataset are those of its version (:mod:`unihub.store.versions`): each version
record holds them whole (the sets, their fields, each part's side file: a line per part and set) under
``column_sets``, so version N reads the sets of version N. :mod:`unihub.store.columns` writes a set's
side files first (under names no other run uses), then publishes the next version, as an append does.
Side files stay while a version lists them (a backfill's old values too); ``vacuum`` removes them with
the last version that lists them.

A dataset that unihub gave column sets before versions did (``_unihub_columns.json`` beside the parts:
the same sets, read by :func:`read_record`) has them in its version 1; the first commit records that
version and the file goes.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from unihub.errors import DatasetChangedError, FormatError, UnihubError
from unihub.fs import filesystem as fsutil
from unihub.fs import publish, remote
from unihub.schema.codecs import CompressedImageCodec, parquet_tensor_type
from unihub.schema.metadata_json import parse_json
from unihub.schema.unischema import Unischema, UnischemaField
from unihub.store import footer_cache

#: the record of a dataset's sets before versions held them (fs/publish.py's clean-up keeps its files)
RECORD = publish.COLUMNS_RECORD
#: the folder of the side files, at the dataset's root
DIRECTORY = "_unihub_columns"
FORMAT = "unihub.columns"
VERSION = 1
#: a set's name: a folder name on every filesystem
SET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=-]{0,127}")


@dataclass(frozen=True)
class SidePart:
    """A set's side file for one part: its path (relative to the root) and the part it belongs to
    (rows, and size in bytes: a part of that name with another size is another part)."""

    file: str
    rows: int
    part_bytes: int


@dataclass(frozen=True)
class ColumnSet:
    """Fields added together, and their side file for each part they cover (part path relative to the root)."""

    name: str
    fields: tuple[UnischemaField, ...]
    parts: Mapping[str, SidePart]

    def to_json(self) -> dict[str, Any]:
        # "files": the flat list fs/publish.py's record_files keeps (it knows nothing of sets)
        return {"name": self.name, "schema": json.loads(Unischema(self.name, self.fields).to_json()),
                "parts": {rel: {"file": s.file, "rows": s.rows, "part_bytes": s.part_bytes}
                          for rel, s in self.parts.items()},
                "files": [s.file for s in self.parts.values()]}


@dataclass(frozen=True)
class Record:
    """The column sets of a version of a dataset."""

    sets: tuple[ColumnSet, ...] = ()

    @property
    def files(self) -> list[str]:
        """Every side file the record names, relative to the root."""
        return [side.file for s in self.sets for side in s.parts.values()]

    def to_json(self) -> bytes:
        # "files": the flat list fs/publish.py keeps when it cleans up (it knows nothing of sets)
        return json.dumps({"format": FORMAT, "version": VERSION, "sets": [s.to_json() for s in self.sets],
                           "files": self.files}, indent=1).encode()

    def set_of(self, field_name: str) -> ColumnSet | None:
        return next((s for s in self.sets if any(f.name == field_name for f in s.fields)), None)

    def named(self, name: str) -> ColumnSet | None:
        return next((s for s in self.sets if s.name == name), None)

    def as_version(self) -> tuple[dict[str, Any], ...]:
        """The sets as a version record's ``column_sets`` holds them."""
        return tuple(s.to_json() for s in self.sets)


def parse_record(data: bytes, where: str) -> Record:
    """The record in ``data`` (read from ``where``); anything else is a :class:`FormatError`."""
    try:
        found = parse_json(data)
        if found.get("format") != FORMAT or found.get("version") != VERSION:
            raise ValueError(f"format {found.get('format')!r} version {found.get('version')!r}")
    except (ValueError, AttributeError) as exc:
        raise FormatError(f"{where}: not a unihub column-set record this version reads ({exc})", path=where) from exc
    return of_version(found.get("sets"), where)


def of_version(entries: Any, where: str) -> Record:
    """The sets a version record's ``column_sets`` holds (read from ``where``); a :class:`FormatError` otherwise."""
    try:
        sets = []
        for entry in entries:
            schema = Unischema.from_json(json.dumps(entry["schema"]))
            parts = {publish.relative_path(rel, "parts"): SidePart(publish.relative_path(s["file"], "file"),
                                                                   int(s["rows"]), int(s["part_bytes"]))
                     for rel, s in entry["parts"].items()}
            sets.append(ColumnSet(str(entry["name"]), tuple(schema), parts))
        return Record(tuple(sets))
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError, UnihubError) as exc:
        raise FormatError(f"{where}: not unihub column sets this version reads ({exc})", path=where) from exc


def read_record(fs: pafs.FileSystem, root: str) -> tuple[Record, bytes | None]:
    """The record at ``root`` and its bytes (None: there is none, an empty record)."""
    path = fsutil.join(root, RECORD)
    try:
        with fs.open_input_stream(path) as handle:
            data = handle.read()
    except FileNotFoundError:
        return Record(), None
    except OSError:
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return Record(), None
        raise
    return parse_record(data, path), data


def relative(root: str, path: str) -> str:
    """``path`` relative to the dataset root ``root``."""
    return path[len(root.rstrip("/")):].lstrip("/")


def part_of(root: str, path: str) -> str:
    """The part a data file of a version is (relative to ``root``): a file a delete retired beside the records
    is the part it was in the directory."""
    rel = relative(root, path)
    retired = f"{publish.RETIRED_DIR}/"
    return rel[len(retired):] if rel.startswith(retired) else rel


def remove_empty_folders(fs: pafs.FileSystem, root: str) -> None:
    """Local disks keep empty folders: remove those left under the side-file folder."""
    folder = os.path.join(root, DIRECTORY)
    if not fsutil.on_local_disk(fs) or not os.path.isdir(folder):
        return
    for dirpath, _dirs, files in os.walk(folder, topdown=False):
        if not files and not os.listdir(dirpath):
            os.rmdir(dirpath)


class SideColumns:
    """The column sets that apply to an opened dataset: their fields, and each row group's side columns.

    ``parts``: each data file of the store (absolute path) -> (rows, bytes); a set's entry for a part
    applies where both agree. Each thread keeps its side files open between reads."""

    def __init__(self, fs: pafs.FileSystem, root: str, record: Record, parts: Mapping[str, tuple[int, int]],
                 keep_uncovered: bool = False) -> None:
        self._filesystem, self._pid, self.root = fs, os.getpid(), root
        self.sets: list[ColumnSet] = []
        self.files: list[dict[str, str]] = []  # per set: part path -> side file path (absolute)
        relative_parts = [(path, part_of(root, path), rows, size) for path, (rows, size) in parts.items()]
        absolute: dict[str, str] = {}  # sets folded into one file name it once (store/columns.py)
        for column_set in record.sets:
            found = {path: absolute.get(side.file) or absolute.setdefault(side.file, fsutil.join(root, side.file))
                     for path, rel, rows, size in relative_parts
                     if (side := column_set.parts.get(rel)) is not None and (side.rows, side.part_bytes) == (rows, size)}
            if found or keep_uncovered:
                self.sets.append(column_set)
                self.files.append(found)
        self.fields: list[UnischemaField] = [f for s in self.sets for f in s.fields]
        self.set_of: dict[str, int] = {f.name: k for k, s in enumerate(self.sets) for f in s.fields}
        self._storage = {f.name: Unischema(f.name, [f]).as_parquet_schema(with_metadata=False).field(0)
                         for f in self.fields}
        self._open = threading.local()

    @property
    def storage_fields(self) -> list[pa.Field]:
        """The added fields as their side files store them (tensors as fixed-size bytes)."""
        return [self._storage[f.name] for f in self.fields]

    @property
    def filesystem(self) -> pafs.FileSystem:
        """The filesystem of the side files; in a process forked from the one that made this, that
        process's own (its parent's connections are not for it: see unihub.fs.remote.renewed)."""
        return self._filesystem if self._pid == os.getpid() else remote.renewed(self._filesystem)

    def __bool__(self) -> bool:
        return bool(self.sets)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_open": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _open=threading.local(), _pid=os.getpid())

    def identity(self, names: Sequence[str]) -> list[str]:
        """What names the values of the side columns among ``names``: their sets' side-file folders and
        names (a backfill writes new files), for cache keys."""
        wanted = sorted({self.set_of[n] for n in names if n in self.set_of})
        return [f"{self.sets[k].name}:{min(self.files[k].values(), default='-')}" for k in wanted]

    def read(self, path: str, row_group: int, num_rows: int, names: Sequence[str], verify: bool) -> pa.Table:
        """Side columns ``names`` of row group ``row_group`` of part ``path`` (``num_rows`` rows), in
        storage form; nulls for a part their set does not cover."""
        columns: dict[str, pa.ChunkedArray | pa.Array] = {}
        by_file: dict[str | None, list[str]] = {}  # sets folded into one file (store/columns.py): read at once
        for name in names:
            by_file.setdefault(self.files[self.set_of[name]].get(path), []).append(name)
        for side, wanted in by_file.items():
            if side is None:
                columns.update((n, pa.nulls(num_rows, self._storage[n].type)) for n in wanted)
                continue
            with remote.remote_errors(remote.display_url(self.filesystem, side)):
                table = self._read(side, row_group, num_rows, wanted, verify)
            columns.update((n, table.column(n)) for n in wanted)
        return pa.table([columns[n] for n in names],
                        schema=pa.schema([self._storage[n] for n in names]))

    def _read(self, side: str, row_group: int, num_rows: int, names: list[str], verify: bool) -> pa.Table:
        parquet_file = self._file(side, verify)
        metadata = parquet_file.metadata
        if row_group >= metadata.num_row_groups or metadata.row_group(row_group).num_rows != num_rows:
            raise FormatError(f"{side}: its row groups are not its part's (row group {row_group} of {num_rows} rows "
                              f"asked; the file has {metadata.num_row_groups})", path=side)
        try:
            table = parquet_file.read_row_group(row_group, columns=names, use_threads=False)
        except (OSError, pa.ArrowException) as exc:
            if remote.is_remote_failure(exc):
                raise
            raise FormatError(f"{side}: cannot read row group {row_group}: {exc}", path=side) from exc
        missing = [n for n in names if n not in table.column_names]  # pyarrow passes over names a file lacks
        if missing:
            raise FormatError(f"{side}: holds no column {', '.join(map(repr, missing))}, which the dataset's "
                              f"version record lists in its column set", path=side)
        return table

    def _file(self, side: str, verify: bool) -> pq.ParquetFile:
        """This thread's open side file (the last few are kept open)."""
        held = self._open
        if getattr(held, "pid", None) != os.getpid():  # a forked worker: its own handles
            held.pid, held.files = os.getpid(), {}
        found = held.files.get((side, verify))
        if found is not None:
            return found
        if len(held.files) >= 2 * len(self.sets):
            held.files.clear()
        local = fsutil.on_local_disk(self.filesystem)
        try:
            key = footer_cache.stat_key(side) if local else None
            handle = fsutil.open_local(side) if local else self.filesystem.open_input_file(side)
        except FileNotFoundError as exc:
            raise DatasetChangedError(f"{side}: the column set's file is gone since the dataset was opened (a vacuum "
                                      "removed the version read); open the dataset again", path=side) from exc
        footer = footer_cache.FOOTERS.get(key)  # read by an earlier open of this process
        found = held.files[(side, verify)] = pq.ParquetFile(handle, metadata=footer, page_checksum_verification=verify)
        if footer is None:
            footer_cache.FOOTERS.put(key, found.metadata)
        return found


def writer_options(fields: Sequence[UnischemaField], compression: str | None) -> dict[str, Any]:
    """ParquetWriter options of a side file of ``fields``, as write_dataset stores them: images not compressed
    again, tensors and images without dictionaries or statistics."""
    images = {f.name for f in fields if isinstance(f.codec, CompressedImageCodec)}
    plain = [f.name for f in fields if f.name not in images and parquet_tensor_type(f) is None]
    return {"compression": {f.name: "none" if f.name in images else compression or "none" for f in fields},
            "use_dictionary": plain, "write_statistics": plain}


def check_side(fs: pafs.FileSystem, path: str, group_rows: Sequence[int]) -> int:
    """The size of the side file written at ``path``, after checking that its row groups hold
    ``group_rows`` rows (its part's); a :class:`FormatError` otherwise."""
    with fs.open_input_file(path) as handle:
        size = handle.size()
        metadata = pq.read_metadata(handle)
    found = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
    if found != list(group_rows):
        raise FormatError(f"{path}: written with row groups of {found[:8]} rows, its part has {list(group_rows)[:8]}",
                          path=path)
    return size


def side_columns(fs: pafs.FileSystem, root: str, parts: Mapping[str, tuple[int, int]],
                 record: Record | None = None) -> SideColumns | None:
    """The column sets of ``record`` (a version's; by default those of a dataset that records no versions, in
    ``_unihub_columns.json``) that apply to the data files ``parts`` of the dataset at ``root``; None where none do.
    A version's sets are its fields even where a delete left them no covered row (they read as nulls); the sets
    of ``_unihub_columns.json`` only where they cover a part (a dataset overwritten since drops them)."""
    of_version = record is not None
    if record is None:
        record, _ = read_record(fs, root)
    if not record.sets:
        return None
    side = SideColumns(fs, root, record, parts, keep_uncovered=of_version)
    return side if side else None
