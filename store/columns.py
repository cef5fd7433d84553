"""Adding columns to a dataset's existing rows without rewriting its part files: :func:`add_column`.

A label, an embedding or a train/val split computed after the images were written is stored as a
column set beside the parts (the layout and the reading: :mod:`unihub.store.column_sets`): one side
file per part, with the part's rows and row-group boundaries, holding the new columns and those of the
part's other sets whose side files are small (:data:`FOLD_MAX_BYTES`: folded in, so a part's small sets are
one file to open and read). The bytes written are the new columns' own and at most those small files'
(a float32[512] embedding for 1M rows: ~2 GB, whatever the images weigh); the parts are not touched. Writing a set again under its name (``replace=True``) backfills it:
the new set replaces the old one in one step.

Every add, backfill and removal is a version of the dataset (:func:`unihub.store.versions.commit_columns`,
operations ``"add_columns"`` and ``"remove_columns"``, with an optional tag): the side files are written
first under names no other run uses, then the next version's record, holding the version's column sets
whole, is published by the create-if-absent step appends use. A kill at any moment leaves the old version
or the new one (the files of a killed add are removed by the next commit or vacuum); of an add and a
commit at once both land (an append or an add of another set is put under this one), or one is refused by
name (:class:`~unihub.errors.ConcurrentCommitError`: the same set changed, or a delete rewrote its parts).
A backfill or a removal keeps the files it replaced while a version lists them: readers of an older
version (one opened before, or ``open_dataset(version=N)``) read its values; ``vacuum`` removes them.

Example::

    add_column("/data/ds", UnischemaField("split", np.str_, (), ScalarCodec(pa.string()), True),
               np.where(np.random.rand(n) < 0.9, "train", "val"))
    with make_reader("/data/ds", schema_fields=["image", "split"]) as reader: ...
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from unihub.errors import ColumnSetError, ConcurrentCommitError, DatasetNotFoundError, FormatError
from unihub.fs import atomic, publish, remote
from unihub.fs import filesystem as fsutil
from unihub.schema.codecs import parquet_tensor_type, tensor_to_parquet
from unihub.schema.unischema import Unischema, UnischemaField
from unihub.store import column_sets, integrity, versions
from unihub.store.column_sets import ColumnSet, Record, SidePart
from unihub.store.dataset import ParquetStore, RowGroupInfo, open_dataset
from unihub.store.writer import encode_columns, validate_column

#: values of the new fields: one array (or sequence) per field, aligned with the dataset's rows (its
#: part files in order), or a function of each row group's ``inputs`` columns (an Arrow table, as
#: stored) returning the group's values (a mapping, or an array where one field is added)
Values = Union[Mapping[str, Any], Callable[[pa.Table], Any]]


@dataclass(frozen=True)
class ColumnsResult:
    """What :func:`add_columns` wrote: the set, its fields, its side files, the bytes written (the side files
    and the version's record) and the version it made."""

    url: str
    name: str
    fields: tuple[str, ...]
    files: tuple[str, ...]
    num_rows: int
    bytes_written: int
    version: int


def add_column(url: str | os.PathLike[str], field: UnischemaField, values: Any, *, name: str | None = None,
               replace: bool = False, inputs: Sequence[str] = (), tag: str | None = None,
               **options: Any) -> ColumnsResult:
    """Add (or with ``replace=True`` backfill) one field for the existing rows of the dataset at ``url``;
    ``values`` is an array aligned with its rows or a function of each row group's ``inputs`` columns.
    The set is named ``name`` (by default the field's). See :func:`add_columns`."""
    given = values if callable(values) else {field.name: values}
    return add_columns(url, [field], given, name=name or field.name, replace=replace, inputs=inputs, tag=tag,
                       **options)


@remote.naming_url("url")
def add_columns(url: str | os.PathLike[str], fields: Sequence[UnischemaField], values: Values, *, name: str,
                replace: bool = False, inputs: Sequence[str] = (), compression: str | None = "snappy",
                tag: str | None = None, filesystem: Any = None,
                storage_options: dict[str, Any] | None = None) -> ColumnsResult:
    """Add fields to the existing rows of the dataset at ``url`` as column set ``name``, without rewriting
    its part files (:mod:`unihub.store.column_sets`), as the dataset's next version (tagged ``tag``);
    readers see them from their next open.

    ``values``: field name -> an array (or sequence) of the dataset's row count, in its row order; or a
    function called with each row group's ``inputs`` columns (an Arrow table in storage form) that
    returns that group's values (a mapping, or an array where one field is added). The fields are made
    nullable: rows appended later read as null. ``replace=True`` replaces the set ``name`` (a backfill);
    otherwise a field name already in the dataset is a :class:`~unihub.errors.ColumnSetError`, as are
    values of the wrong length (checked before anything is written); values of the wrong dtype or shape
    are a ``ValidationError``. On any error nothing stays written.
    """
    url = os.fspath(url)
    fs, root, current = _history(url, filesystem, storage_options)
    base = current[-1]
    store = open_dataset(url, filesystem=filesystem, storage_options=storage_options, version=base.number)
    record = column_sets.of_version(base.column_sets, versions.record_path(root, base.number))
    added = tuple(f if f.nullable else UnischemaField(f.name, f.numpy_dtype, f.shape, f.codec, True) for f in fields)
    _check_new(store, record, name, added, replace)
    if not callable(values):
        _check_values(store, added, values)
    versions.check_tag(current, tag, url)
    run = atomic.run_id()
    versions.remove_orphans(fs, root, current)  # what killed adds and appends left
    written: list[str] = []
    try:
        parts, folds, size = _write_sides(store, record, name, added, values, inputs, run, written, compression)
        change = _SetChange(root, name, record.named(name), ColumnSet(name, added, parts), folds)
        version = versions.commit_columns(fs, root, base, change.onto, operation="add_columns", tag=tag)
    except BaseException:
        for path in written:
            fsutil.discard(fs, path)
        column_sets.remove_empty_folders(fs, root)
        raise
    size += len(version.to_json())
    return ColumnsResult(url, name, tuple(f.name for f in added), tuple(written), store.num_rows, size,
                         version.number)


@remote.naming_url("url")
def remove_columns(url: str | os.PathLike[str], name: str, *, tag: str | None = None, filesystem: Any = None,
                   storage_options: dict[str, Any] | None = None) -> int:
    """Remove column set ``name`` from the dataset at ``url`` as its next version (tagged ``tag``); returns its
    number. Its files stay for the versions that list them (``vacuum`` removes them)."""
    fs, root, current = _history(os.fspath(url), filesystem, storage_options)
    base = current[-1]
    record = column_sets.of_version(base.column_sets, versions.record_path(root, base.number))
    if record.named(name) is None:
        raise ColumnSetError(f"{url}: no column set {name!r} (it has {[s.name for s in record.sets]})")
    versions.check_tag(current, tag, os.fspath(url))
    change = _SetChange(root, name, record.named(name), None)
    return versions.commit_columns(fs, root, base, change.onto, operation="remove_columns", tag=tag).number


def list_columns(url: str | os.PathLike[str], *, version: int | None = None, tag: str | None = None,
                 filesystem: Any = None, storage_options: dict[str, Any] | None = None) -> dict[str, list[str]]:
    """The column sets of the dataset at ``url`` (its latest version, or ``version``'s or ``tag``'s): set name ->
    its field names."""
    fs, root = fsutil.resolve_filesystem(os.fspath(url), filesystem, storage_options)
    with remote.remote_errors(os.fspath(url)):
        pinned = versions.resolve(fs, root, version=version, tag=tag)
        record = column_sets.read_record(fs, root)[0] if pinned is None else \
            column_sets.of_version(pinned.column_sets, versions.record_path(root, pinned.number))
    return {s.name: [f.name for f in s.fields] for s in record.sets}


def _history(url: str, filesystem: Any, storage_options: dict[str, Any] | None
             ) -> tuple[pafs.FileSystem, str, list[versions.Version]]:
    """The filesystem, root and versions (at least one; version 1 maybe not recorded yet) of the dataset
    directory at ``url``."""
    fs, root = fsutil.resolve_filesystem(url, filesystem, storage_options)
    root = root.rstrip("/")
    with remote.remote_errors(url):
        publish.fresh(fs, root)
        info = fs.get_file_info(root)
        if info.type == pafs.FileType.File:
            raise ColumnSetError(f"{url}: columns are added to a dataset directory, not a single file")
        current = versions.history(fs, root) if info.type == pafs.FileType.Directory else []
    if not current:
        raise DatasetNotFoundError(f"{url}: no dataset there (a directory of Parquet data files)")
    return fs, root, current


@dataclass(frozen=True)
class _SetChange:
    """Set ``name`` changed from ``before`` (as the version the change was made from had it; None: none) to
    ``after`` (None: removed), put onto whatever version is the latest when it is published."""

    root: str
    name: str
    before: ColumnSet | None
    after: ColumnSet | None
    #: other sets' side files for a part folded into this set's new one: set name -> part -> (its entry in the
    #: version the change was made from, its entry now: the new file)
    folds: Mapping[str, Mapping[str, tuple[SidePart, SidePart]]] = field(default_factory=dict)

    def onto(self, latest: versions.Version) -> tuple[dict[str, Any], ...]:
        """``latest``'s column sets with the change; a :class:`ConcurrentCommitError` where another commit changed
        the same set meanwhile, took one of its fields, or rewrote a part it covers (a delete)."""
        record = column_sets.of_version(latest.column_sets, versions.record_path(self.root, latest.number))
        now = record.named(self.name)
        if (now.to_json() if now else None) != (self.before.to_json() if self.before else None):
            raise ConcurrentCommitError(f"{self.root}: column set {self.name!r} was changed by another commit "
                                        f"(version {latest.number}) meanwhile; nothing of this one was published: "
                                        "run it again")
        if self.after is None:
            return Record(tuple(s for s in record.sets if s.name != self.name)).as_version()
        taken = sorted({f.name for f in self.after.fields} & {f.name for s in record.sets if s.name != self.name
                                                             for f in s.fields})
        gone = sorted(set(self.after.parts) - set(latest.parts))
        if taken or gone:
            raise ConcurrentCommitError(f"{self.root}: another commit (version {latest.number}) "
                                        + (f"added field(s) {taken}" if taken else f"rewrote part(s) {gone[:3]}")
                                        + f" meanwhile; nothing of column set {self.name!r} was published: run it again")
        return Record(tuple(self._folded(s) for s in record.sets if s.name != self.name) + (self.after,)).as_version()

    def _folded(self, column_set: ColumnSet) -> ColumnSet:
        """``column_set`` reading the parts whose side file was folded into this set's new file from there, where
        its entry is still the one folded (a commit meanwhile that rewrote it keeps its own: the copy is unused)."""
        moved = self.folds.get(column_set.name)
        if not moved:
            return column_set
        parts = {rel: moved[rel][1] if rel in moved and moved[rel][0] == side else side
                 for rel, side in column_set.parts.items()}
        return ColumnSet(column_set.name, column_set.fields, parts)


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
            validate_column(f, column, 0)


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


#: another set's side file for a part up to this size is folded into the file a new set writes for the part
#: (its columns copied in; the set then reads them from there): a part's small sets end in one file, opened
#: and read once instead of once per set. Larger ones (embeddings) stay where they are: not written again.
FOLD_MAX_BYTES = 4 << 20


@dataclass
class _Fold:
    """Side files of other sets for one part, copied into the new set's file: each file open, the sets (and
    their entries) read from it, the columns to copy."""

    file: pq.ParquetFile
    path: str
    sets: list[tuple[ColumnSet, SidePart]]
    names: list[str]


def _folds_for(store: ParquetStore, record: Record, name: str, rel: str, rows: int, part_bytes: int,
               stack: ExitStack) -> list[_Fold]:
    """The side files of ``record``'s other sets for part ``rel`` (``rows``, ``part_bytes``: the part as it is)
    small enough to fold (``FOLD_MAX_BYTES``), opened in ``stack``."""
    by_file: dict[str, list[tuple[ColumnSet, SidePart]]] = {}
    for column_set in record.sets:
        side = column_set.parts.get(rel)
        if column_set.name != name and side is not None and (side.rows, side.part_bytes) == (rows, part_bytes):
            by_file.setdefault(side.file, []).append((column_set, side))
    folds = []
    for side_rel, sets in by_file.items():
        path = fsutil.join(store.path, side_rel)
        handle = stack.enter_context(store.filesystem.open_input_file(path))
        if handle.size() > FOLD_MAX_BYTES:
            continue
        names = [f.name for column_set, _ in sets for f in column_set.fields]
        folds.append(_Fold(integrity.open_file(handle, path), path, sets, names))
    return folds


def _folded_columns(folds: Sequence[_Fold], info: RowGroupInfo) -> list[pa.ChunkedArray]:
    """The folded sets' columns of the part's row group ``info``, as stored."""
    group = info.row_group
    columns: list[pa.ChunkedArray] = []
    for fold in folds:
        metadata = fold.file.metadata
        if group >= metadata.num_row_groups or metadata.row_group(group).num_rows != info.num_rows:
            raise FormatError(f"{fold.path}: its row groups are not its part's (row group {group} of {info.num_rows} "
                              f"rows; the file has {metadata.num_row_groups})", path=fold.path)
        table = integrity.read_group(fold.file, fold.path, group, fold.names)
        columns.extend(table.column(n) for n in fold.names)
    return columns


def _write_sides(store: ParquetStore, record: Record, name: str, fields: tuple[UnischemaField, ...], values: Values,
                 inputs: Sequence[str], run: str, written: list[str], compression: str | None
                 ) -> tuple[dict[str, SidePart], dict[str, dict[str, tuple[SidePart, SidePart]]], int]:
    """Write one side file per part (``written`` grows as they are), with the columns of ``record``'s other sets
    whose side file for the part is small folded in (``FOLD_MAX_BYTES``); returns the set's entries, the
    folded sets' (set -> part -> (old entry, new)) and the bytes written."""
    fs, root = store.filesystem, store.path
    sizes = {f.path: f for f in store.files}
    parts: dict[str, SidePart] = {}
    folded: dict[str, dict[str, tuple[SidePart, SidePart]]] = {}
    total = 0
    for path, groups in _groups_by_file(store):
        rel = column_sets.relative(root, path)
        head, _, base = rel.rpartition("/")
        side_rel = "/".join(p for p in (column_sets.DIRECTORY, name, head, f"unihub-{run}-{base}") if p)
        side = fsutil.join(root, side_rel)
        part = sizes[path]
        with ExitStack() as stack:
            folds = _folds_for(store, record, name, rel, part.num_rows, part.size_bytes, stack)
            others = [f for fold in folds for column_set, _ in fold.sets for f in column_set.fields]
            schema = Unischema(name, fields)
            file_schema = Unischema(name, [*fields, *others]).as_parquet_schema()
            storage = schema.as_arrow_schema(with_metadata=False)
            fs.create_dir(side.rpartition("/")[0], recursive=True)
            written.append(side)
            with pq.ParquetWriter(side, file_schema, filesystem=fs, store_schema=True,
                                  **column_sets.writer_options([*fields, *others], compression),
                                  **integrity.WRITE_OPTIONS) as writer:
                for info in groups:
                    batch = _group_values(store, info, schema, storage, values, inputs)
                    writer.write_table(pa.table([*batch.columns, *_folded_columns(folds, info)],
                                                schema=file_schema), row_group_size=max(1, info.num_rows))
        total += column_sets.check_side(fs, side, [info.num_rows for info in groups])
        parts[rel] = SidePart(side_rel, part.num_rows, part.size_bytes)
        for fold in folds:
            for column_set, entry in fold.sets:
                folded.setdefault(column_set.name, {})[rel] = (entry, SidePart(side_rel, entry.rows, entry.part_bytes))
    return parts, folded, total


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
    batch = encode_columns(schema, chunk, storage, info.first_row, n, validate=True)
    return pa.RecordBatch.from_arrays([tensor_to_parquet(f, column) if parquet_tensor_type(f) is not None else column
                                       for f, column in zip(schema, batch.columns)], names=batch.schema.names)
