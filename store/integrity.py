"""Integrity of stored Parquet: page checksums written and verified, nested value counts checked.

Every data page unihub writes carries a CRC-32 of its bytes (the ``crc`` field of the Parquet page
header: :data:`WRITE_OPTIONS`), and reads verify it (``page_checksum_verification``), so a flipped bit
in page data is a :class:`~unihub.errors.DataCorruptionError` naming file, row group and column,
never silently different values. Pages without a CRC (files Petastorm, Spark before parquet-mr
1.12 or other writers made) are read as before: there is nothing to check them against.

A process checks each row group's columns the first time it reads them from an opened dataset
(``UNIHUB_PAGE_CHECKSUMS=once``, the default): later epochs re-read bytes already checked and cost
nothing more. ``always`` checks every read, ``off`` none (a dataset whose storage is trusted). A
local file's row groups of big chunks are checked by unihub (store/_pages.py
``checksums_pass``: ISA-L's CRC with the header walk, ~8 GB/s of one core where Arrow's own check
runs at ~2 GB/s); Arrow checks the rest, and any page that fails or that walk cannot vouch for.

The CRC covers a page's data, not its header. Of the header's fields, only ``num_values`` can
change decoded values without an error: a page of a nested (list) column that claims fewer values
than it holds loses the last elements of its last row. :func:`check_value_counts` counts the level
entries of each nested column read (Parquet's ``num_values``: one per leaf value, null or empty
list) and compares them with the column chunk's count in the footer.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, Literal, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from unihub.errors import DataCorruptionError, FormatError, InvalidArgumentError
from unihub.fs import remote
from unihub.schema.arrow_numpy import to_numpy
from unihub.store import _footer, int96

#: ``pq.ParquetWriter`` options: a CRC-32 in every page header.
WRITE_OPTIONS: dict[str, Any] = {"write_page_checksum": True}
#: ``pq.ParquetFile`` / ``pq.read_table`` options: pages with a CRC are verified as they are read.
READ_OPTIONS: dict[str, Any] = {"page_checksum_verification": True}
#: when reads check pages: "once" (first read of each row group's columns), "always", "off"
VERIFY_ENV = "UNIHUB_PAGE_CHECKSUMS"
Verification = Literal["once", "always", "off"]
#: Spark (parquet-mr) writes a CRC in every page header when this Hadoop setting is true.
SPARK_CHECKSUM_CONF = "parquet.page.write-checksum.enabled"

_CRC_MESSAGE = "CRC checksum verification failed"
#: files opened by :func:`open_file` that hold INT96, each with its twin reading them as microseconds
_COARSE: weakref.WeakKeyDictionary[pq.ParquetFile, pq.ParquetFile] = weakref.WeakKeyDictionary()


def verification() -> Verification:
    """When reads check page checksums and value counts: ``UNIHUB_PAGE_CHECKSUMS``, "once" by default."""
    mode = os.environ.get(VERIFY_ENV, "").strip().lower() or "once"
    if mode not in ("once", "always", "off"):
        raise InvalidArgumentError(f"{VERIFY_ENV}={mode!r}: expected 'once' (the default), 'always' or 'off'")
    return cast(Verification, mode)


def is_checksum_failure(exc: BaseException) -> bool:
    """True for pyarrow's error on a page whose bytes do not match the CRC in its header."""
    return isinstance(exc, OSError) and _CRC_MESSAGE in str(exc)


def open_file(handle: Any, path: str) -> pq.ParquetFile:
    """``handle`` (the file at ``path``) opened as Parquet, its pages' checksums verified as they are read: what a
    rewrite (a delete, a compaction, a fold of column sets) reads through. A file that is not readable Parquet is
    a :class:`FormatError` naming it; a remote failure is raised as it is (the caller's ``remote_errors`` names it)."""
    try:
        found = pq.ParquetFile(handle, **READ_OPTIONS)
        if int96.columns(found):  # its INT96 read again as microseconds, to check them (see read_group)
            _COARSE[found] = pq.ParquetFile(handle, **int96.COARSE_OPTIONS)
        return found
    except (OSError, pa.ArrowException) as exc:
        if remote.as_remote_error(exc, path) is not None:
            raise
        raise FormatError(f"{path}: not a readable Parquet file: {exc}", path=path) from exc


def read_group(parquet_file: pq.ParquetFile, path: str, row_group: int,
               columns: Sequence[str] | None = None) -> pa.Table:
    """Row group ``row_group`` of ``parquet_file`` (opened by :func:`open_file`; ``columns``: all by default): a page
    that fails its CRC is a :class:`DataCorruptionError` naming the file, row group and column, other damage a
    :class:`FormatError` naming the file and row group; a remote failure is raised as it is."""
    try:
        table = parquet_file.read_row_group(row_group, columns=columns)
        coarse = _COARSE.get(parquet_file)
        if coarse is not None:
            _check_int96(table, parquet_file, coarse, row_group, columns, path)
        return table
    except (OSError, pa.ArrowException) as exc:
        if remote.as_remote_error(exc, path) is not None:
            raise
        if is_checksum_failure(exc):
            raise checksum_error(parquet_file, path, row_group, columns, exc) from exc
        raise FormatError(f"{path}: cannot read row group {row_group}: {exc}", path=path) from exc


def _check_int96(table: pa.Table, parquet_file: pq.ParquetFile, coarse: pq.ParquetFile, row_group: int,
                 columns: Sequence[str] | None, path: str) -> None:
    """Refuse to rewrite INT96 timestamps (Spark's default) outside what nanoseconds hold: the rewrite's schema
    is the file's (``timestamp[ns]``), which would hold them wrapped to other dates (store/int96.py)."""
    names = int96.columns(parquet_file)
    read = int96.exact(table, lambda: coarse, row_group, columns, names, path)
    far = [n for n in table.column_names if n in names and read.column(n).type != table.column(n).type]
    if far:
        raise FormatError(f"{path}: row group {row_group}, column {far[0]!r}: INT96 timestamps outside 1677-09-21.."
                          "2262-04-11, which a rewrite (a delete, a compaction, a fold) would write as nanoseconds "
                          "wrapped to other dates; write the file again with TIMESTAMP_MICROS (Spark: "
                          "spark.sql.parquet.outputTimestampType) first", path=path)


def checksum_error(parquet_file: pq.ParquetFile, path: str, row_group: int, columns: Sequence[str] | None,
                   exc: BaseException) -> DataCorruptionError:
    """The error for a CRC failure in ``row_group``, naming the damaged column(s).

    pyarrow names only the page's ordinal, so each column is read again on its own (this runs
    once per damaged row group, never on a healthy read)."""
    names = list(columns) if columns is not None else parquet_file.schema_arrow.names
    damaged = []
    for name in names:
        try:
            parquet_file.read_row_group(row_group, columns=[name], use_threads=False)
        except OSError as again:
            if is_checksum_failure(again):
                damaged.append(name)
    where = f"column {damaged[0]!r}" if len(damaged) == 1 else f"columns {damaged}" if damaged else "a column"
    return DataCorruptionError(
        f"{path}: row group {row_group}, {where}: a data page fails its CRC-32 checksum ({exc}); the file was "
        "damaged after it was written: restore it from a copy or write the dataset again",
        path=path, row_group=row_group, column=damaged[0] if damaged else None)


def nested_leaves(schema: pa.Schema) -> dict[str, tuple[int, int]]:
    """Top-level field name -> (index of its first Parquet leaf column, number of leaves), for nested fields."""
    found, first = {}, 0
    for field in schema:
        count = _leaf_count(field.type)
        if _is_nested(field.type):
            found[field.name] = (first, count)
        first += count
    return found


def check_value_counts(table: pa.Table, footer: pq.FileMetaData, row_group: int,
                       leaves: dict[str, tuple[int, int]], path: str) -> None:
    """Raise :class:`DataCorruptionError` when a nested column of ``table`` (one row group, as read)
    holds another number of level entries than the footer records for its column chunk."""
    if not leaves:
        return
    group = None
    for name in table.column_names:
        where = leaves.get(name)
        if where is None or _leaf_count(table.schema.field(name).type) != where[1]:
            continue  # not nested, or a part of it read by a nested path ("p.x"): its leaves are not these
        if group is None:
            _footer.check(footer, path)
            group = footer.row_group(row_group)
        totals = np.zeros(where[1], dtype=np.int64)
        try:
            for chunk in table.column(name).chunks:
                totals += [len(chunk) if slots is None else int(slots.sum()) for slots in _slots(chunk)]
        except _Uncountable:
            continue
        for k, found in enumerate(totals.tolist()):
            column = group.column(where[0] + k)
            if found != column.num_values:
                raise DataCorruptionError(
                    f"{path}: row group {row_group}, column {column.path_in_schema!r}: its pages decode to "
                    f"{found} values where the column chunk records {column.num_values} (a damaged page "
                    "header); restore the file from a copy or write the dataset again",
                    path=path, row_group=row_group, column=name)


def _storage(data_type: pa.DataType) -> pa.DataType:
    return data_type.storage_type if isinstance(data_type, pa.BaseExtensionType) else data_type


def _is_nested(data_type: pa.DataType) -> bool:
    return pa.types.is_nested(_storage(data_type))


def _children(data_type: pa.DataType) -> list[pa.DataType]:
    data_type = _storage(data_type)
    if pa.types.is_map(data_type):
        return [data_type.key_type, data_type.item_type]
    if pa.types.is_struct(data_type):
        return [data_type.field(i).type for i in range(data_type.num_fields)]
    if pa.types.is_nested(data_type):  # list, large_list, fixed_size_list, list_view
        return [data_type.value_type]
    return []


def _leaf_count(data_type: pa.DataType) -> int:
    children = _children(data_type)
    return sum(_leaf_count(c) for c in children) if children else 1


def _slots(array: pa.Array) -> Iterator[np.ndarray | None]:
    """For each Parquet leaf column under ``array`` (in schema order), the level entries each element
    of ``array`` contributes: one per leaf value, and one for a null or an empty list. None stands
    for one entry per element (a leaf), so leaf values are never counted one by one."""
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    data_type = array.type
    if pa.types.is_struct(data_type):
        nulls = _null_mask(array)
        for i in range(data_type.num_fields):
            for slots in _slots(array.field(i)):
                yield slots if slots is None or nulls is None else np.where(nulls, 1, slots)
        return
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_map(data_type) \
            or pa.types.is_fixed_size_list(data_type):
        offsets = _offsets(array)
        nulls = _null_mask(array)
        for child in _slots(array.values):  # a map's values: the struct of its keys and items
            if child is None:
                slots = offsets[1:] - offsets[:-1]
            else:
                sums = np.concatenate([[0], np.cumsum(child, dtype=np.int64)])
                slots = sums[offsets[1:]] - sums[offsets[:-1]]
            slots[slots == 0] = 1
            if nulls is not None:
                slots[nulls] = 1
            yield slots
        return
    if pa.types.is_nested(data_type):  # a nested type not written by pyarrow or Spark: no count to check
        raise _Uncountable
    yield None


class _Uncountable(Exception):
    pass


def _offsets(array: Any) -> np.ndarray:
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        return (np.arange(len(array) + 1, dtype=np.int64) + array.offset) * size
    return np.asarray(to_numpy(array.offsets), dtype=np.int64)


def _null_mask(array: pa.Array) -> np.ndarray | None:
    if not array.null_count:
        return None
    return np.asarray(to_numpy(array.is_null()), dtype=bool)
