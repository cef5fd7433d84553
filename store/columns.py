"""Adding columns to a dataset's existing rows without rewriting its part files: :func:`add_column`.

A label, an embedding or a train/val split computed after the images were written is stored as a
column set beside the parts (the layout and the reading: :mod:`unihub.store.column_sets`): one side
file per part, with the part's rows and row-group boundaries, holding only the new columns. The bytes
written are the new columns' own (a float32[512] embedding for 1M rows: ~2 GB, whatever the images
weigh); the parts are not touched. Writing a set again under its name (``replace=True``) backfills it:
the new set replaces the old one in one step.

Example::

    add_column("/data/ds", UnischemaField("split", np.str_, (), ScalarCodec(pa.string()), True),
               np.where(np.random.rand(n) < 0.9, "train", "val"))
    with make_reader("/data/ds", schema_fields=["image", "split"]) as reader: ...
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from unihub.errors import ColumnSetError
from unihub.fs import atomic, remote
from unihub.fs import filesystem as fsutil
from unihub.schema.codecs import CompressedImageCodec, parquet_tensor_type, tensor_to_parquet
from unihub.schema.unischema import Unischema, UnischemaField
from unihub.store import column_sets, integrity
from unihub.store.column_sets import ColumnSet, Record, SidePart
from unihub.store.dataset import ParquetStore, RowGroupInfo, open_dataset
from unihub.store.writer import _encode_columns, _validate_column

#: values of the new fields: one array (or sequence) per field, aligned with the dataset's rows (its
#: part files in order), or a function of each row group's ``inputs`` columns (an Arrow table, as
#: stored) returning the group's values (a mapping, or an array where one field is added)
Values = Union[Mapping[str, Any], Callable[[pa.Table], Any]]

_RUN_FILE = re.compile(r"unihub-(?P<where>[0-9a-f]{8})-(?P<pid>\d+)-(?P<start>\d+)-[0-9a-f]{6}-")


@dataclass(frozen=True)
class ColumnsResult:
    """What :func:`add_columns` wrote: the set, its fields, its side files and the bytes written."""

    url: str
    name: str
    fields: tuple[str, ...]
    files: tuple[str, ...]
    num_rows: int
    bytes_written: int


def add_column(url: str | os.PathLike[str], field: UnischemaField, values: Any, *, name: str | None = None,
               replace: bool = False, inputs: Sequence[str] = (), **options: Any) -> ColumnsResult:
    """Add (or with ``replace=True`` backfill) one field for the existing rows of the dataset at ``url``;
    ``values`` is an array aligned with its rows or a function of each row group's ``inputs`` columns.
    The set is named ``name`` (by default the field's). See :func:`add_columns`."""
    given = values if callable(values) else {field.name: values}
    return add_columns(url, [field], given, name=name or field.name, replace=replace, inputs=inputs, **options)


@remote.naming_url("url")
def add_columns(url: str | os.PathLike[str], fields: Sequence[UnischemaField], values: Values, *, name: str,
                replace: bool = False, inputs: Sequence[str] = (), compression: str | None = "snappy",
                filesystem: Any = None, storage_options: dict[str, Any] | None = None) -> ColumnsResult:
    """Add fields to the existing rows of the dataset at ``url`` as column set ``name``, without rewriting
    its part files (:mod:`unihub.store.column_sets`); readers see them from their next open.

    ``values``: field name -> an array (or sequence) of the dataset's row count, in its row order; or a
    function called with each row group's ``inputs`` columns (an Arrow table in storage form) that
    returns that group's values (a mapping, or an array where one field is added). The fields are made
    nullable: rows appended later read as null. ``replace=True`` replaces the set ``name`` (a backfill);
    otherwise a field name already in the dataset is a :class:`~unihub.errors.ColumnSetError`, as are
    values of the wrong length (checked before anything is written); values of the wrong dtype or shape
    are a ``ValidationError``. On any error nothing stays written.
    """
    url = os.fspath(url)
    store = open_dataset(url, filesystem=filesystem, storage_options=storage_options)
    fs, root = store.filesystem, store.path
    if not fsutil.is_dir(fs, root):
        raise ColumnSetError(f"{url}: columns are added to a dataset directory, not a single file")
    record, before = column_sets.read_record(fs, root)
    added = tuple(f if f.nullable else UnischemaField(f.name, f.numpy_dtype, f.shape, f.codec, True) for f in fields)
    _check_new(store, record, name, added, replace)
    if not callable(values):
        _check_values(store, added, values)
    run = atomic.run_id()
    _sweep(fs, root, record)
    written: list[str] = []
    try:
        parts, size = _write_sides(store, name, added, values, inputs, run, written, compression)
        # sets that cover none of the parts (an overwrite on an object store replaced them) are dropped
        live = {s.name for s in store.side.sets} if store.side is not None else set()
        new = Record(tuple(s for s in record.sets if s.name != name and s.name in live) + (ColumnSet(name, added, parts),))
        size += column_sets.publish_record(fs, root, new, before)  # the one step that publishes
    except BaseException:
        for path in written:
            fsutil.discard(fs, path)
        _remove_empty_folders(fs, root)
        raise
    _remove_unlisted(fs, root, record, new)
    return ColumnsResult(url, name, tuple(f.name for f in added), tuple(written), store.num_rows, size)


@remote.naming_url("url")
def remove_columns(url: str | os.PathLike[str], name: str, *, filesystem: Any = None,
                   storage_options: dict[str, Any] | None = None) -> None:
    """Remove column set ``name`` from the dataset at ``url`` (its record first, then its files)."""
    fs, root = fsutil.resolve_filesystem(os.fspath(url), filesystem, storage_options)
    record, before = column_sets.read_record(fs, root)
    if not any(s.name == name for s in record.sets):
        raise ColumnSetError(f"{url}: no column set {name!r} (it has {[s.name for s in record.sets]})")
    new = Record(tuple(s for s in record.sets if s.name != name))
    column_sets.publish_record(fs, root, new, before)
    _remove_unlisted(fs, root, record, new)


def list_columns(url: str | os.PathLike[str], *, filesystem: Any = None,
                 storage_options: dict[str, Any] | None = None) -> dict[str, list[str]]:
    """The column sets of the dataset at ``url``: set name -> its field names."""
    fs, root = fsutil.resolve_filesystem(os.fspath(url), filesystem, storage_options)
    record, _ = column_sets.read_record(fs, root)
    return {s.name: [f.name for f in s.fields] for s in record.sets}


def _check_new(store: ParquetStore, record: Record, name: str, fields: Sequence[UnischemaField],
               replace: bool) -> None:
    """Refuse a set name that is no folder name, and fields the dataset already has (but for the
    set ``name`` itself, with ``replace``)."""
    if not isinstance(name, str) or not column_sets.SET_NAME.fullmatch(name):
        raise ColumnSetError(f"column set name {name!r}: letters, digits and '_.=-', starting with a letter "
                             "or digit, at most 128")
    if not fields:
        raise ColumnSetError(f"column set {name!r}: no fields given")
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise ColumnSetError(f"column set {name!r}: a field is named twice in {names}")
    existing = next((s for s in record.sets if s.name == name), None)
    if existing is not None and not replace:
        raise ColumnSetError(f"{store.url}: column set {name!r} exists (fields {[f.name for f in existing.fields]}); "
                             "pass replace=True to backfill it")
    for f in fields:
        holder = record.set_of(f.name)
        if f.name in store.arrow_schema.names or f.name in store.partition_names or \
                (f.name in store.schema.fields and (holder is None or holder.name != name)):
            raise ColumnSetError(f"{store.url}: field {f.name!r} exists in the dataset"
                                 + (f" (column set {holder.name!r})" if holder is not None else "")
                                 + "; choose another name" + (", or replace its set" if holder is not None else ""))


def _check_values(store: ParquetStore, fields: Sequence[UnischemaField], values: Any) -> None:
    """Values given as arrays: one per field, each of the dataset's length; numpy arrays checked for
    dtype and shape at once (other sequences value by value as they are written)."""
    if not isinstance(values, Mapping):
        raise ColumnSetError(f"values: a mapping of field name -> array, or a function of a row group's "
                             f"columns; got {type(values).__name__}")
    unknown = set(values) - {f.name for f in fields}
    missing = [f.name for f in fields if f.name not in values]
    if unknown or missing:
        raise ColumnSetError(f"values name fields {sorted(unknown)} that are not added" if unknown
                             else f"no values for field(s) {missing}")
    for f in fields:
        column = values[f.name]
        try:
            length = len(column)
        except TypeError as exc:
            raise ColumnSetError(f"field {f.name!r}: values must be an array or sequence, got "
                                 f"{type(column).__name__}") from exc
        if length != store.num_rows:
            raise ColumnSetError(f"{store.url}: field {f.name!r}: {length} values for a dataset of "
                                 f"{store.num_rows} rows (one per row, in the dataset's row order)")
        if isinstance(column, np.ndarray) and column.dtype != object:
            _validate_column(f, column, 0)


def _groups_by_file(store: ParquetStore) -> Iterator[tuple[str, list[RowGroupInfo]]]:
    """Each part file with its row groups, in the dataset's row order."""
    current: list[RowGroupInfo] = []
    for info in store.row_groups:
        if current and current[0].path != info.path:
            yield current[0].path, current
            current = []
        current.append(info)
    if current:
        yield current[0].path, current
    indexed = {info.path for info in store.row_groups}
    for f in store.files:  # parts of no row group still get a side file: the record covers every part
        if f.path not in indexed:
            yield f.path, []


def _write_sides(store: ParquetStore, name: str, fields: tuple[UnischemaField, ...], values: Values,
                 inputs: Sequence[str], run: str, written: list[str],
                 compression: str | None) -> tuple[dict[str, SidePart], int]:
    """Write one side file per part (``written`` grows as they are); returns the record's entries and
    the bytes written."""
    fs, root = store.filesystem, store.path
    schema = Unischema(name, fields)
    file_schema = schema.as_parquet_schema()
    storage = schema.as_arrow_schema(with_metadata=False)
    sizes = {f.path: f for f in store.files}
    # as write_dataset stores them: images not compressed again, tensors and images without dictionaries
    images = {f.name for f in fields if isinstance(f.codec, CompressedImageCodec)}
    plain = [f.name for f in fields if f.name not in images and parquet_tensor_type(f) is None]
    compressions = {f.name: "none" if f.name in images else compression or "none" for f in fields}
    parts: dict[str, SidePart] = {}
    total = 0
    for path, groups in _groups_by_file(store):
        rel = column_sets.relative(root, path)
        head, _, base = rel.rpartition("/")
        side_rel = "/".join(p for p in (column_sets.DIRECTORY, name, head, f"unihub-{run}-{base}") if p)
        side = fsutil.join(root, side_rel)
        fs.create_dir(side.rpartition("/")[0], recursive=True)
        written.append(side)
        with pq.ParquetWriter(side, file_schema, filesystem=fs, store_schema=True, compression=compressions,
                              use_dictionary=plain, write_statistics=plain, **integrity.WRITE_OPTIONS) as writer:
            for info in groups:
                batch = _group_values(store, info, schema, storage, values, inputs)
                writer.write_table(pa.Table.from_batches([batch], schema=file_schema),
                                   row_group_size=max(1, info.num_rows))
        footer = column_sets.check_side(fs, side, [info.num_rows for info in groups])
        info_ = sizes[path]
        parts[rel] = SidePart(side_rel, info_.num_rows, info_.size_bytes)
        total += footer
    return parts, total


def _group_values(store: ParquetStore, info: RowGroupInfo, schema: Unischema, storage: pa.Schema,
                  values: Values, inputs: Sequence[str]) -> pa.RecordBatch:
    """Row group ``info``'s values of the new fields, encoded and checked."""
    n = info.num_rows
    if callable(values):
        computed = values(store.read_row_group(info.index, list(inputs)))
        if not isinstance(computed, Mapping):
            if len(schema) != 1:
                raise ColumnSetError(f"the values function returned a {type(computed).__name__}; with "
                                     f"{len(schema)} fields it must return a mapping of field name -> values")
            computed = {next(iter(schema)).name: computed}
        for f in schema:
            found = computed.get(f.name)
            if found is None or len(found) != n:
                raise ColumnSetError(f"the values function gave {0 if found is None else len(found)} values of "
                                     f"{f.name!r} for row group {info.index} of {n} rows")
        chunk = computed
    else:
        chunk = {f.name: values[f.name][info.first_row:info.first_row + n] for f in schema}
    batch = _encode_columns(schema, chunk, storage, info.first_row, n, validate=True)
    return pa.RecordBatch.from_arrays([tensor_to_parquet(f, column) if parquet_tensor_type(f) is not None else column
                                       for f, column in zip(schema, batch.columns)], names=batch.schema.names)


def _sweep(fs: pafs.FileSystem, root: str, record: Record) -> None:
    """Remove side files a killed add left (named by a run no longer alive, listed by no record), and
    records a kill left half written (locally: their temporary names)."""
    listed = set(record.files)
    temporaries = [column_sets.relative(root, e.path) for e in fs.get_file_info(pafs.FileSelector(root))
                   if posixpath.basename(e.path).startswith(f"{column_sets.RECORD}.")] \
        if fsutil.on_local_disk(fs) else []
    for rel in [*_side_files(fs, root), *temporaries]:
        found = _RUN_FILE.search(rel.rpartition("/")[2])
        if rel not in listed and found is not None and \
                not atomic.owner_alive(found["where"], int(found["pid"]), int(found["start"])):
            fs.delete_file(fsutil.join(root, rel))
    _remove_empty_folders(fs, root)


def _remove_unlisted(fs: pafs.FileSystem, root: str, old: Record, new: Record) -> None:
    """After a publish: remove the side files the ``old`` record listed and the ``new`` one does not
    (a backfill's old values; readers that opened the old record before see DatasetChangedError)."""
    for rel in sorted(set(old.files) - set(new.files)):
        fsutil.remove(fs, fsutil.join(root, rel))
    _remove_empty_folders(fs, root)


def _side_files(fs: pafs.FileSystem, root: str) -> list[str]:
    """Every file under the side-file folder, relative to ``root``."""
    folder = fsutil.join(root, column_sets.DIRECTORY)
    selector = pafs.FileSelector(folder, recursive=True, allow_not_found=True)
    return [column_sets.relative(root, e.path) for e in fs.get_file_info(selector) if e.type == pafs.FileType.File]


def _remove_empty_folders(fs: pafs.FileSystem, root: str) -> None:
    """Local disks keep empty folders: remove those left under the side-file folder."""
    folder = os.path.join(root, column_sets.DIRECTORY)
    if not fsutil.on_local_disk(fs) or not os.path.isdir(folder):
        return
    for dirpath, _dirs, files in os.walk(folder, topdown=False):
        if not files and not os.listdir(dirpath):
            os.rmdir(dirpath)
