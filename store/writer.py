"""Writing a Unischema dataset with pyarrow alone: streaming, validated, atomic.

Rows (mappings) or column batches are validated against the Unischema, encoded column
by column by each field's codec, gathered into row groups of about ``row_group_size_mb``
of Arrow memory and written as they fill, so memory stays bounded by one row group per
open partition. A data file ends before it would pass ``part_size_mb`` on disk (the next row
group's size estimated from the compression seen so far), so a dataset of any size is files of a
bounded size: each uploaded to an object store in parts, and copied on publish, in bounded time. Everything goes to a hidden sibling directory that is renamed onto
``url`` only when every file is complete: a failure (or Ctrl-C) leaves nothing behind. Every
data page carries a CRC-32 of its bytes, verified on read (:mod:`unihub.store.integrity`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from unihub.errors import CodecError, SchemaError, ValidationError
from unihub.fs import filesystem as fsutil
from unihub.fs import publish, remote
from unihub.fs.outputs import names_output_errors
from unihub.petastorm.pickling import check_petastorm_compatible
from unihub.runtime.memory import DEFAULT_PART_SIZE_MB, DEFAULT_ROW_GROUP_SIZE_MB, is_amount
from unihub.schema.codecs import CompressedImageCodec, parquet_tensor_type, tensor_to_parquet
from unihub.schema.codecs.base import temporal_array
from unihub.schema.dtypes import fits, found_label
from unihub.schema.metadata_json import EXTRA_METADATA_KEY, load_metadata_json  # described there, with what it holds
from unihub.schema.shapes import shape_matches
from unihub.schema.unischema import Unischema, UnischemaField
from unihub.schema.validation import column_length
from unihub.store import file_options, integrity, versions
from unihub.store.dataset import COMMON_METADATA
from unihub.store.file_options import page_options
from unihub.store.metadata_files import add_petastorm_metadata
from unihub.store.ownership import check_replaceable
from unihub.store.partitions import folder_value

#: Rows are encoded in chunks of at most this many rows and about this much Arrow memory, so that
#: memory follows bytes, not rows: 256 small rows at a time, one or two camera frames at a time.
_ENCODE_CHUNK_ROWS = 256
_ENCODE_CHUNK_BYTES = 8 * 2**20
#: room left in a part file for its footer (a few KB per row group of a wide schema)
_FOOTER_ALLOWANCE = 64 * 2**10


@dataclass(frozen=True)
class WriteResult:
    """What :func:`write_dataset` wrote."""

    url: str
    num_rows: int
    files: tuple[str, ...]
    num_row_groups: int
    bytes_written: int


@dataclass
class _OpenFile:
    writer: pq.ParquetWriter
    path: str
    rows: int = 0
    written: int = 0  # bytes in the file so far (its row groups; the footer comes at close)


@dataclass
class _PartitionSink:
    """Buffers encoded batches for one partition and writes row groups / files as they fill."""

    directory: str
    pending: list[pa.RecordBatch] = field(default_factory=list)
    pending_bytes: int = 0
    current: _OpenFile | None = None
    file_count: int = 0


@remote.naming_url("url")
@names_output_errors("url")  # a full disk, a read-only destination: OutputError naming ``url``
def write_dataset(url: str | os.PathLike[str], schema: Unischema, rows_or_batches: Any, *,
                  batched: bool = False, row_group_size_mb: float = DEFAULT_ROW_GROUP_SIZE_MB, rows_per_file: int | None = None,
                  part_size_mb: float = DEFAULT_PART_SIZE_MB, compression: str | None = "snappy", partition_by: Sequence[str] = (),
                  overwrite: bool = False, overwrite_foreign: bool = False, validate: bool = True, filesystem: Any = None,
                  storage_options: dict[str, Any] | None = None,
                  extra_metadata: Mapping[str, Any] | None = None,
                  petastorm_compatible: bool = False, mode: str = "write", tag: str | None = None) -> WriteResult:
    """Write rows (mappings of field -> value) or column batches as a Unischema dataset.

    ``rows_or_batches`` is an iterable of row mappings; with ``batched=True`` an iterable of
    column mappings (field -> array or sequence, one entry per row) or Arrow record
    batches/tables already in storage form; a single column mapping or table also works.
    ``extra_metadata`` (JSON-able) is kept under ``unihub.extra`` beside the schema, e.g. the
    class names of a converted image folder. ``petastorm_compatible=True`` also writes the
    metadata Petastorm 0.13.1 needs to open the dataset (its pickled Unischema and the row
    groups per file; see :mod:`unihub.store.metadata_files`), for readers not yet moved to
    unihub; a field Petastorm cannot read is refused before anything is written.
    ``part_size_mb`` bounds each data file's size (see the module docstring; a file holds at least one
    row group, and row groups are at most half of it); ``rows_per_file`` bounds its rows.
    ``overwrite=True`` replaces an existing ``url`` only when unihub wrote it (its schema metadata
    is there) or it is an empty folder; ``overwrite_foreign=True`` replaces anything
    (:mod:`unihub.store.ownership`).
    ``mode="append"`` adds the rows to the dataset at ``url`` (made if missing) as its next version, new
    part files published atomically beside the existing ones, the schema the dataset's (else an
    ``AppendSchemaError``); ``tag`` names the version it makes (:mod:`unihub.store.versions`). Petastorm's
    metadata, where the dataset has it (and with ``petastorm_compatible=True``, where it has not), then lists
    the new version's files (:mod:`unihub.store.listings`).

    Example::

        write_dataset("/data/ds", Schema, ({"id": i, "image": img} for i, img in enumerate(images)))
    """
    _check_arguments(schema, row_group_size_mb=row_group_size_mb, rows_per_file=rows_per_file,
                     part_size_mb=part_size_mb, partition_by=partition_by, petastorm_compatible=petastorm_compatible,
                     mode=mode, tag=tag, overwrite=overwrite or overwrite_foreign)
    url = os.fspath(url)
    fs, target = fsutil.resolve_filesystem(url, filesystem, storage_options)
    fsutil.check_bucket(fs, target, url)
    publish.settle(fs, target)  # a killed run's old dataset back in place, its temporaries removed
    if mode == "write":
        check_replaceable(fs, target, url, overwrite=overwrite, overwrite_foreign=overwrite_foreign)
    staging = fsutil.temporary_sibling(target)
    try:
        fs.create_dir(staging, recursive=True)  # inside: a Ctrl-C right after it removes it too
        result = write_parts(fs, staging, schema, rows_or_batches, batched=batched,
                             row_group_size_mb=row_group_size_mb, rows_per_file=rows_per_file,
                             part_size_mb=part_size_mb, compression=compression, partition_by=partition_by,
                             validate=validate, extra_metadata=extra_metadata)
        empty = finish_parts(fs, staging, schema, extra_metadata=extra_metadata, partition_by=partition_by,
                             empty=not result.files, petastorm_compatible=petastorm_compatible)
        if mode == "append":
            appended = versions.commit_append(fs, staging, target, tag=tag, added_rows=result.num_rows,
                                              petastorm=petastorm_compatible)
            added = appended.parts[len(appended.parts) - len(result.files or empty):]
            published: list[str] | None = [fsutil.join(target, p) for p in added]
        else:
            published = publish.commit(fs, staging, target)  # new names on an object store
    except BaseException:
        fsutil.discard(fs, staging)  # the last step: open uploads aborted, then the staging area removed
        raise
    files = tuple(published if published is not None else
                  (fsutil.join(target, p[len(staging):].lstrip("/")) for p in (result.files or empty)))
    return WriteResult(url, result.num_rows, files, result.num_row_groups, result.bytes_written)


def _check_arguments(schema: Unischema, *, row_group_size_mb: float, rows_per_file: int | None,
                     part_size_mb: float, partition_by: Sequence[str], petastorm_compatible: bool, mode: str,
                     tag: str | None, overwrite: bool) -> None:
    """:func:`write_dataset`'s arguments checked before anything is written (a SchemaError naming the one)."""
    check_row_group_size(row_group_size_mb)
    if rows_per_file is not None and (isinstance(rows_per_file, bool) or not isinstance(rows_per_file, (int, np.integer))
                                      or rows_per_file <= 0):  # True was 1 row a file; 2.5 a TypeError mid-write
        raise SchemaError(f"rows_per_file must be a positive whole number of rows, got {rows_per_file!r}")
    check_part_size(part_size_mb)
    for key in partition_by:
        if key not in schema:
            raise SchemaError(f"partition_by names {key!r}, which is not a field of {schema.name!r}")
        if schema[key].shape != ():
            raise SchemaError(f"partition_by field {key!r} must be a scalar, its shape is {schema[key].shape}")
        if schema[key].numpy_dtype is np.bytes_:
            raise SchemaError(f"partition_by field {key!r} holds bytes, which have no text form for a "
                              "directory name; partition by a str or number field")
    if petastorm_compatible:
        check_petastorm_compatible(schema)
    if mode not in ("write", "append"):
        raise SchemaError(f"mode must be 'write' or 'append', got {mode!r}")
    if mode == "append" and overwrite:
        raise SchemaError("mode='append' adds a version: not with overwrite (which replaces the dataset)")
    if tag is not None and mode != "append":
        raise SchemaError("tag= names the version an append makes (mode='append'); a write makes version 1")


#: the name of the n-th part file one writer writes; conversion tasks put their index in it too
PART_NAME = "part-{:05d}.parquet"


def write_parts(fs: pafs.FileSystem, directory: str, schema: Unischema, rows_or_batches: Any, *,
                batched: bool = False, part_name: str = PART_NAME, row_group_size_mb: float = DEFAULT_ROW_GROUP_SIZE_MB,
                rows_per_file: int | None = None, part_size_mb: float = DEFAULT_PART_SIZE_MB,
                compression: str | None = "snappy", partition_by: Sequence[str] = (), validate: bool = True,
                extra_metadata: Mapping[str, Any] | None = None) -> WriteResult:
    """Write rows or column batches as part files into ``directory`` (a staging area), under their
    final names (``part_name.format(n)``), and nothing else: :func:`finish_parts` then writes the
    dataset's metadata once, and :func:`~unihub.fs.publish.commit` publishes it. The same
    steps serve :func:`write_dataset` and every conversion task. A failure removes what this call
    wrote, so that a retried task starts from a clean slate."""
    part_bytes = int(part_size_mb * 2**20)
    writer = _DatasetWriter(fs, directory, schema, partition_by=tuple(partition_by),
                            row_group_bytes=max(1, min(int(row_group_size_mb * 2**20), part_bytes // 2)),
                            rows_per_file=rows_per_file, part_bytes=part_bytes, compression=compression, validate=validate, extra_metadata=extra_metadata,
                            part_name=part_name)
    try:
        for batch in _batches(schema, rows_or_batches, batched=batched, validate=validate):
            writer.add(batch)
        return writer.close()
    except BaseException:
        writer.abort()
        for path in writer.files:
            fsutil.discard(fs, path)
        raise


def check_row_group_size(row_group_size_mb: float) -> None:
    """A ``row_group_size_mb`` a writer can keep: a finite number of megabytes > 0 (else ``SchemaError``; inf
    and NaN would fail as the byte count is made, and 0 or less made one row group per row)."""
    if not is_amount(row_group_size_mb):
        raise SchemaError(f"row_group_size_mb must be positive, got {row_group_size_mb}")


def check_part_size(part_size_mb: float) -> None:
    """A ``part_size_mb`` a writer can keep: a number of megabytes > 0 (else ``SchemaError``)."""
    if not is_amount(part_size_mb):
        raise SchemaError(f"part_size_mb must be a positive number of megabytes, got {part_size_mb!r}")


def finish_parts(fs: pafs.FileSystem, directory: str, schema: Unischema, *,
                 extra_metadata: Mapping[str, Any] | None = None, partition_by: Sequence[str] = (),
                 empty: bool = False, empty_part: str = PART_NAME.format(0), restamp: Sequence[str] = (),
                 petastorm_compatible: bool = False) -> tuple[str, ...]:
    """Make the part files in ``directory`` a dataset: with ``empty`` (no part was written) one empty
    part file named ``empty_part``, the files of ``restamp`` given ``schema`` and ``extra_metadata`` in their footers
    where they were written with others (a single pass's provisional schema), then
    ``_common_metadata``, written once. Returns the empty file's path, if one was written."""
    file_schema = _file_schema(schema, extra_metadata, tuple(partition_by))
    written: tuple[str, ...] = ()
    if empty:
        path = fsutil.join(directory, empty_part)
        with pq.ParquetWriter(path, file_schema, filesystem=fs, store_schema=True, **integrity.WRITE_OPTIONS):
            pass
        written = (path,)
    for path in restamp:
        restamp_schema(fs, path, file_schema.metadata or {})
    pq.write_metadata(file_schema, fsutil.join(directory, COMMON_METADATA), filesystem=fs)
    if petastorm_compatible:
        add_petastorm_metadata(fs, directory, schema)
    return written


def _file_schema(schema: Unischema, extra_metadata: Mapping[str, Any] | None,
                 partition_by: tuple[str, ...]) -> pa.Schema:
    """The Arrow schema of the data files: storage columns (numeric fixed-shape tensors as fixed-size
    bytes, see TensorCodec; no partition keys), the Unischema JSON and ``extra_metadata``."""
    full = schema.as_parquet_schema()
    metadata = dict(full.metadata or {})
    if extra_metadata:
        metadata[EXTRA_METADATA_KEY] = extra_metadata_json(extra_metadata)
    return pa.schema([f for f in full if f.name not in partition_by], metadata=metadata)


def extra_metadata_json(extra_metadata: Mapping[str, Any]) -> bytes:
    """``extra_metadata`` as the JSON stored under ``unihub.extra``, checked as a reader checks it
    (:func:`~unihub.schema.metadata_json.load_metadata_json`): what no reader would open (nested deeper than 64,
    unihub's own keys of another type: ``{"source": 5}``) is a SchemaError before anything is written, not a
    dataset every open refuses. numpy values are stored as their numbers (an array's ``str`` cut them to
    ``'[0 1 2 ... 997 998 999]'``); other values that are no JSON, by their ``str``."""
    if not isinstance(extra_metadata, Mapping):
        raise SchemaError(f"extra_metadata must be a mapping (a dict of JSON values), got "
                          f"{type(extra_metadata).__name__}")
    text = json.dumps(dict(extra_metadata), default=_json_value).encode()
    try:
        load_metadata_json(text, EXTRA_METADATA_KEY, where="extra_metadata")
    except SchemaError as exc:
        raise SchemaError(f"{exc}; a reader would refuse it, so nothing was written") from None
    return text


def _json_value(value: Any) -> Any:
    return value.tolist() if isinstance(value, (np.ndarray, np.generic)) else str(value)


# -- input -> validated column chunks ------------------------------------------------------
def _batches(schema: Unischema, data: Any, *, batched: bool, validate: bool) -> Iterator[pa.RecordBatch]:
    """Encoded record batches of at most a few hundred rows from rows or column batches."""
    storage_schema = schema.as_arrow_schema(with_metadata=False)
    if isinstance(data, (pa.Table, pa.RecordBatch)) or (batched and isinstance(data, Mapping)):
        data = [data]
        batched = True
    if not batched:
        yield from _row_chunks(schema, data, storage_schema, validate)
        return
    first_row = 0
    for item in data:
        if isinstance(item, (pa.Table, pa.RecordBatch)):
            table = item if isinstance(item, pa.Table) else pa.Table.from_batches([item])
            yield from _conform_table(table, storage_schema, first_row).to_batches()
            first_row += table.num_rows
        elif isinstance(item, Mapping):
            n = column_length(schema, item)
            yield encode_columns(schema, item, storage_schema, first_row, n, validate)
            first_row += n
        else:
            raise SchemaError(f"batched=True expects column mappings or Arrow tables, got {type(item).__name__}")


def _row_chunks(schema: Unischema, rows: Iterable[Any], storage_schema: pa.Schema,
                validate: bool) -> Iterator[pa.RecordBatch]:
    """Encoded batches of rows; the first holds one row, later ones as many as fit
    :data:`_ENCODE_CHUNK_BYTES` at the encoded size per row seen so far (rows of 6 MB are not
    gathered 256 at a time)."""
    chunk: list[Mapping[str, Any]] = []
    first_row, chunk_rows = 0, 1
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            row = row._asdict() if hasattr(row, "_asdict") else row
            if not isinstance(row, Mapping):
                raise SchemaError(f"row {index} is a {type(row).__name__}, expected a mapping of field -> value "
                                  "(pass batched=True for column batches)")
        if validate:
            schema.validate(row, row_index=index)
        chunk.append(row)
        if len(chunk) >= chunk_rows:
            batch = _encode_rows(schema, chunk, storage_schema, first_row)
            first_row += len(chunk)
            chunk = []
            yield batch
            row_bytes = max(1, batch.nbytes // max(1, batch.num_rows))
            chunk_rows = max(1, min(_ENCODE_CHUNK_ROWS, _ENCODE_CHUNK_BYTES // row_bytes))
    if chunk:
        yield _encode_rows(schema, chunk, storage_schema, first_row)


def _encode_rows(schema: Unischema, rows: list[Mapping[str, Any]], storage_schema: pa.Schema,
                 first_row: int) -> pa.RecordBatch:
    columns = {f.name: [row.get(f.name) for row in rows] for f in schema}
    return encode_columns(schema, columns, storage_schema, first_row, len(rows), validate=False)


def encode_columns(schema: Unischema, columns: Mapping[str, Any], storage_schema: pa.Schema,
                   first_row: int, n: int, validate: bool) -> pa.RecordBatch:
    """``n`` rows of ``columns`` (field name -> values; a missing field is nulls) encoded by their codecs into a
    batch of ``storage_schema``, each checked first where ``validate``; errors name rows from ``first_row``
    (used by the writer and by store/columns.py, which adds columns to existing rows)."""
    arrays = []
    for f in schema:
        values = columns.get(f.name)
        if values is None:
            values = [None] * n
        if isinstance(values, pa.ChunkedArray):  # what pyarrow.compute returns for a table's column
            values = values.combine_chunks()
        if isinstance(values, pa.Array) and (validate or f.codec is None):
            values = values.to_pylist()  # checked and stored value by value
        if validate:
            validate_column(f, values, first_row)
        if f.codec is None:
            array = _arrow_storage(f, values)
        else:
            array = _encode_with_rows(f, values, first_row)
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, schema=storage_schema)


def _arrow_storage(f: UnischemaField, values: Any) -> pa.Array:
    """Values of a field without a codec in Arrow's own type: datetime64/timedelta64 through numpy, arrays of 2
    or more dims as lists of lists; what Arrow refuses (a nanosecond in a microsecond field) a CodecError naming
    the field, not pyarrow's raw error."""
    arrow_type = f.arrow_type()
    try:
        temporal = temporal_array(values, arrow_type) if not isinstance(values, pa.Array) else None
        if temporal is not None:
            return temporal
        return pa.array([v.tolist() if isinstance(v, np.ndarray) and v.ndim > 1 else v for v in values],
                        type=arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError) as exc:
        raise CodecError(f"field {f.name!r}: cannot store values as {arrow_type}: {exc}", field=f.name) from exc


def _encode_with_rows(f: UnischemaField, values: Any, first_row: int) -> pa.Array:
    try:
        if isinstance(values, pa.Array):  # bytes a format read straight from its input buffer
            return f.codec.encode_arrow(f, values)  # type: ignore[union-attr]
        return f.codec.encode_column(f, values)  # type: ignore[union-attr]
    except CodecError as exc:
        if exc.row is not None:
            raise CodecError(str(exc).replace(f"row {exc.row}", f"row {first_row + exc.row}"),
                             field=exc.field, row=first_row + exc.row) from exc
        raise


def validate_column(f: UnischemaField, values: Any, first_row: int) -> None:
    """Vectorised check for an ndarray column, per-row check otherwise."""
    if isinstance(values, np.ndarray) and values.dtype != object and values.ndim == len(f.shape) + 1:
        if not fits(values.dtype, f.dtype) and f.dtype != object:
            raise ValidationError(f"field {f.name!r}: expected dtype {f.dtype}, found a column of "
                                  f"{found_label(values.dtype)}", field=f.name)
        if not shape_matches(values.shape[1:], f.shape):
            raise ValidationError(f"field {f.name!r}: expected rows of shape {f.shape}, "
                                  f"found a column of shape {values.shape}", field=f.name)
        if values.dtype.kind in "mM" and f.shape == () and not f.nullable and np.isnat(values).any():
            row = int(np.flatnonzero(np.isnat(values))[0])
            f.validate(values[row], row=first_row + row)  # a NaT is a null: its error names the row
        return
    for i, value in enumerate(values):
        f.validate(value, row=first_row + i)


def _conform_table(table: pa.Table, storage_schema: pa.Schema, first_row: int) -> pa.Table:
    missing = [n for n in storage_schema.names if n not in table.column_names]
    if missing:
        raise SchemaError(f"Arrow batch at row {first_row} lacks columns {missing}")
    unknown = [n for n in table.column_names if n not in storage_schema.names]
    if unknown:  # dropped silently before, while a column mapping's unknown names are refused
        raise SchemaError(f"Arrow batch at row {first_row} has columns {unknown}, which are not fields of the "
                          "schema; select the schema's columns first (table.select(...))")
    table = table.select(storage_schema.names)
    try:
        return table.cast(storage_schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:  # ValueError: nulls, not nullable
        raise SchemaError(f"Arrow batch at row {first_row} does not match the schema: {exc}") from exc


# -- encoded batches -> files ---------------------------------------------------------------
class _DatasetWriter:
    """Routes encoded batches to partition sinks and writes row groups and files."""

    def __init__(self, fs: pafs.FileSystem, root: str, schema: Unischema, *, partition_by: tuple[str, ...],
                 row_group_bytes: int, rows_per_file: int | None, compression: str | None, validate: bool,
                 extra_metadata: Mapping[str, Any] | None = None, part_name: str = PART_NAME,
                 part_bytes: int | None = None) -> None:
        self.fs, self.root, self.schema = fs, root, schema
        self.partition_by = partition_by
        self.row_group_bytes = row_group_bytes
        self.rows_per_file = rows_per_file
        self.part_bytes = part_bytes
        self.disk_bytes = self.arrow_bytes = 0  # of the row groups written: their ratio estimates the next's size
        self.compression = compression
        self.part_name = part_name
        self.tensor_columns = {f.name: f for f in schema
                               if f.name not in partition_by and parquet_tensor_type(f) is not None}
        self.file_schema = _file_schema(schema, extra_metadata, partition_by)
        self.sinks: dict[tuple[Any, ...], _PartitionSink] = {}
        self.files: list[str] = []
        self.num_rows = 0
        self.num_row_groups = 0  # the root exists already: a task being torn down must not make it again

    def add(self, batch: pa.RecordBatch) -> None:
        if not self.partition_by:
            self._route(self._sink(()), batch)
            return
        keys = [batch.column(k).to_pylist() for k in self.partition_by]
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, key in enumerate(zip(*keys)):
            groups.setdefault(key, []).append(i)
        for key, rows in groups.items():
            self._route(self._sink(key), batch.take(pa.array(rows)))

    def _sink(self, key: tuple[Any, ...]) -> _PartitionSink:
        sink = self.sinks.get(key)
        if sink is None:
            parts = [f"{name}={folder_value(v)}" for name, v in zip(self.partition_by, key)]
            sink = self.sinks[key] = _PartitionSink(fsutil.join(self.root, *parts))
        return sink

    def _route(self, sink: _PartitionSink, batch: pa.RecordBatch) -> None:
        if self.partition_by:
            batch = batch.drop_columns(list(self.partition_by))
        if self.tensor_columns:
            batch = pa.RecordBatch.from_arrays(
                [tensor_to_parquet(self.tensor_columns[name], column) if name in self.tensor_columns else column
                 for name, column in zip(batch.schema.names, batch.columns)], schema=self.file_schema)
        sink.pending.append(batch)
        sink.pending_bytes += batch.nbytes
        pending_rows = sum(b.num_rows for b in sink.pending)
        room = self._room(sink)
        if sink.pending_bytes >= self.row_group_bytes or (room is not None and pending_rows >= room):
            self._flush(sink)

    def _room(self, sink: _PartitionSink) -> int | None:
        if self.rows_per_file is None:
            return None
        return self.rows_per_file - (sink.current.rows if sink.current else 0)

    def _flush(self, sink: _PartitionSink, *, final: bool = False) -> None:
        """Write pending rows as row groups of about ``row_group_bytes``, new files at ``rows_per_file``.

        Unless ``final``, a last partial row group stays pending, so row groups come out even
        instead of one full group and one small remainder per flush.
        """
        if not sink.pending:
            return
        table = pa.Table.from_batches(sink.pending, schema=self.file_schema)
        # big rows: one encode chunk can hold many row groups' worth of bytes, so split it
        group_rows = max(1, self.row_group_bytes // max(1, table.nbytes // max(1, table.num_rows)))
        while table.num_rows:
            room = self._room(sink)
            take = min(group_rows, table.num_rows) if room is None else min(group_rows, room, table.num_rows)
            if not final and take == table.num_rows and take < group_rows and (room is None or take < room):
                break  # a partial row group waits for more rows
            group = table.slice(0, take)
            if sink.current is not None and self._would_pass_part_size(sink.current, group.nbytes):
                sink.current.writer.close()
                sink.current = None
            current = sink.current or self._open(sink)
            self._write_group(current, group)
            current.rows += take
            self.num_rows += take
            self.num_row_groups += 1
            table = table.slice(take)
            if room is not None and current.rows >= self.rows_per_file:  # type: ignore[operator]
                current.writer.close()
                sink.current = None
        sink.pending = table.to_batches() if table.num_rows else []
        sink.pending_bytes = table.nbytes if table.num_rows else 0

    def _would_pass_part_size(self, current: _OpenFile, group_bytes: int) -> bool:
        """Whether a row group of ``group_bytes`` (Arrow memory) would take ``current`` past the part
        size, at the ratio of bytes on disk to bytes in memory seen so far (1 before any)."""
        if self.part_bytes is None:
            return False
        ratio = self.disk_bytes / self.arrow_bytes if self.arrow_bytes else 1.0
        return current.written + group_bytes * ratio + _FOOTER_ALLOWANCE > self.part_bytes

    def _write_group(self, current: _OpenFile, group: pa.Table) -> None:
        """Write one row group and count the bytes it took in the file."""
        current.writer.write_table(group, row_group_size=group.num_rows)
        handle = current.writer.file_handle
        written = handle.tell() if handle is not None else current.written + group.nbytes
        self.disk_bytes += written - current.written
        self.arrow_bytes += group.nbytes
        current.written = written

    def _open(self, sink: _PartitionSink) -> _OpenFile:
        if sink.directory != self.root:
            self.fs.create_dir(sink.directory, recursive=True)
        path = fsutil.join(sink.directory, self.part_name.format(sink.file_count))
        sink.file_count += 1
        writer = pq.ParquetWriter(path, self.file_schema, filesystem=self.fs, store_schema=True,
                                  compression=self._column_compression(), use_dictionary=self._dictionary_columns(),
                                  write_statistics=self._dictionary_columns(), **self._page_options(sink),
                                  **integrity.WRITE_OPTIONS)
        sink.current = _OpenFile(writer, path)
        self.files.append(path)
        return sink.current

    def _page_options(self, sink: _PartitionSink) -> dict[str, Any]:
        """:func:`page_options` for this file: its image columns' widest average value, from the rows
        pending (the first row group's)."""
        images = [name for name in self._already_compressed() if name in self.file_schema.names]
        if not images or not sink.pending:
            return page_options(None)
        rows = sum(batch.num_rows for batch in sink.pending)
        return page_options(max(sum(batch.column(name).nbytes for batch in sink.pending) for name in images)
                            / max(1, rows))

    def _already_compressed(self) -> set[str]:
        """Columns of PNG/JPEG bytes: compressing them again costs reads and writes and saves nothing."""
        return {f.name for f in self.schema if isinstance(f.codec, CompressedImageCodec)}

    def _no_dictionary(self) -> set[str]:
        """Image bytes, and tensors as bytes: whole tensors rarely repeat, and trying costs time; nor do
        their min/max statistics serve a filter (they took 2-4x the write time of 6.9 MB camera frames)."""
        return self._already_compressed() | set(self.tensor_columns)

    def _column_compression(self) -> dict[str, str] | str:
        codec = self.compression or "none"
        skip = self._already_compressed()
        if not skip or codec == "none":
            return codec
        return {name: "none" if name in skip else codec for name in self.file_schema.names}

    def _dictionary_columns(self) -> list[str] | bool:
        skip = self._no_dictionary()
        return [name for name in self.file_schema.names if name not in skip] if skip else True

    def close(self) -> WriteResult:
        for sink in self.sinks.values():
            self._flush(sink, final=True)
            if sink.current is not None:
                sink.current.writer.close()
                sink.current = None
        size = sum(self.fs.get_file_info(p).size or 0 for p in self.files)
        return WriteResult(self.root, self.num_rows, tuple(self.files), self.num_row_groups, size)

    def abort(self) -> None:
        for sink in self.sinks.values():
            if sink.current is not None:
                try:
                    sink.current.writer.close()
                except Exception:  # the write already failed; closing is best effort
                    pass
                sink.current = None


def restamp_schema(fs: pafs.FileSystem, path: str, metadata: Mapping[bytes, bytes]) -> bool:
    """Rewrite one Parquet file of a staged dataset with ``metadata`` (the Unischema JSON and the extra
    metadata) in its footer; False if it already holds it.

    For a single-pass conversion whose schema was refined after the files were written: the
    stored columns are the same, only the metadata changes. Row groups, compression and
    dictionary use are kept. The file is rewritten beside itself and moved over it (inside a
    staging area that nothing reads before the commit).
    """
    with fs.open_input_file(path) as handle:
        parquet_file = pq.ParquetFile(handle, **integrity.READ_OPTIONS)
        old = dict(parquet_file.schema_arrow.metadata or {})
        wanted = {**old, **metadata}
        if not metadata.get(EXTRA_METADATA_KEY):
            wanted.pop(EXTRA_METADATA_KEY, None)
        if wanted == old:
            return False
        arrow_schema = parquet_file.schema_arrow.with_metadata(wanted)
        temporary = f"{path}.restamp-tmp"
        try:
            with pq.ParquetWriter(temporary, arrow_schema, filesystem=fs, store_schema=True,
                                  **file_options.like(parquet_file), **integrity.WRITE_OPTIONS) as writer:
                for i in range(parquet_file.metadata.num_row_groups):
                    table = parquet_file.read_row_group(i)
                    writer.write_table(table.replace_schema_metadata(wanted), row_group_size=table.num_rows)
        except BaseException:
            fsutil.discard(fs, temporary)
            raise
    fsutil.move(fs, temporary, path)
    return True
