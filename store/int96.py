"""INT96 timestamps (Spark's default ``outputTimestampType``, Hive's, Impala's) read as the instants they hold.

An INT96 value is a Julian day and the nanoseconds into it. pyarrow reads it as ``timestamp[ns]``, whose int64
spans 1677-09-21..2262-04-11: a value outside (a 9999-12-31 "open-ended" placeholder, 1500-01-01) wraps around to
another date without a word. A column chunk holding INT96 is read a second time coerced to microseconds (±290,000
years) and its values are compared there, vectorised: where every one fits nanoseconds, the chunk keeps
``timestamp[ns]`` (what Petastorm 0.13.1 gave), else it comes as ``timestamp[us]``. A value outside nanoseconds
that has digits finer than a microsecond has no exact unit and is a :class:`~unihub.errors.FormatError`.
Files without INT96 (unihub's, and Spark's with ``TIMESTAMP_MICROS``) cost nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from unihub.errors import FormatError
from unihub.schema.arrow_numpy import to_numpy, without_validity
from unihub.schema.codecs.base import valid_mask

#: ``pq.ParquetFile`` option of the second read, whose range holds every INT96 value
COARSE_OPTIONS = {"coerce_int96_timestamp_unit": "us"}
#: microseconds whose every nanosecond (+0..999) an int64 of nanoseconds holds, NaT's -2**63 aside (plain ints:
#: a ``pa.scalar``, and pyarrow.compute's comparisons that make one, import pandas)
_FITS = -(2 ** 63 - 1) // 1000, (2 ** 63 - 1 - 999) // 1000
#: 2**64 modulo 1000: how a nanosecond count that wrapped k times lost its last three digits
_WRAP_MOD_1000 = 2 ** 64 % 1000


def columns(parquet_file: pq.ParquetFile) -> frozenset[str]:
    """The top-level columns of ``parquet_file`` holding an INT96 leaf (none in nearly every file)."""
    arrow = parquet_file.schema_arrow
    if not any(_has_nanoseconds(f.type) for f in arrow):  # INT96 reads as timestamp[ns]: one look at most files
        return frozenset()
    schema = parquet_file.metadata.schema
    paths = [schema.column(i).path for i in range(len(schema)) if schema.column(i).physical_type == "INT96"]
    if not paths:
        return frozenset()
    return frozenset(name for name in arrow.names
                     if any(p == name or p.startswith(name + ".") for p in paths))


def exact(table: pa.Table, coarse: Callable[[], pq.ParquetFile], row_group: int, asked: Sequence[str] | None,
          names: Collection[str], path: str) -> pa.Table:
    """``table`` (row group ``row_group`` read as ``asked``) with each column of ``names`` (INT96, see
    :func:`columns`) that holds a value outside nanoseconds replaced by its read in microseconds from
    ``coarse()`` (the file opened with :data:`COARSE_OPTIONS`)."""
    held = [n for n in table.column_names if n in names]
    if not held:
        return table
    picks = [c for c in (asked if asked is not None else held)
             if c in names or any(c.startswith(n + ".") for n in held)]
    micro = coarse().read_row_group(row_group, columns=picks, use_threads=False)
    for name in held:
        fine, rough = table.column(name), micro.column(name)
        if _fits(fine, rough, name, row_group, path):
            continue
        i = table.column_names.index(name)
        own = table.schema.field(i)
        table = table.set_column(i, pa.field(name, rough.type, own.nullable, own.metadata), rough)
    return table


def _fits(fine: pa.ChunkedArray, rough: pa.ChunkedArray, name: str, row_group: int, path: str) -> bool:
    """Whether every timestamp of ``rough`` (microseconds) fits nanoseconds; where one does not, a check that
    none of those outside has digits finer than a microsecond (``fine``: the same values read wrapped)."""
    values, valid = _ints([leaf for chunk in rough.chunks for leaf in _timestamps(chunk)])
    outside = valid & ((values < _FITS[0]) | (values > _FITS[1]))
    if not outside.any():
        return True
    far = values[outside]
    lost = _ints([leaf for chunk in fine.chunks for leaf in _timestamps(chunk)])[0][outside]
    turns = np.rint((far.astype(np.float64) * 1000 - lost.astype(np.float64)) / 2.0 ** 64).astype(np.int64)
    finer = np.mod(np.mod(lost, 1000) + turns * _WRAP_MOD_1000, 1000)
    if finer.any():
        k = int(np.flatnonzero(finer)[0])
        when = np.datetime64(int(far[k]), "us")
        raise FormatError(f"{path}: row group {row_group}, column {name!r}: the INT96 timestamp {when} and "
                          f"{int(finer[k])} ns lies outside what nanoseconds hold (1677-09-21..2262-04-11) and has "
                          "digits finer than a microsecond: no unit holds it exactly; write it as "
                          "TIMESTAMP_MICROS, or truncated to microseconds", path=path)
    return False


def _ints(leaves: Sequence[pa.Array]) -> tuple[np.ndarray, np.ndarray]:
    """The int64 values of timestamp arrays ``leaves``, joined, and where each is valid: views of their buffers,
    without pyarrow's conversions (which import pandas for an array with nulls)."""
    values = [to_numpy(without_validity(leaf.view(pa.int64()))) for leaf in leaves]
    valid = [np.ones(len(leaf), bool) if not leaf.null_count else valid_mask(leaf) for leaf in leaves]
    if not values:
        return np.empty(0, np.int64), np.empty(0, bool)
    return np.concatenate(values), np.concatenate(valid)  # type: ignore[arg-type]


def _timestamps(array: pa.Array) -> list[pa.Array]:
    """The timestamp arrays in ``array``, through lists, maps and structs."""
    kind = array.type
    if pa.types.is_timestamp(kind):
        return [array]
    if pa.types.is_map(kind):
        return _timestamps(array.keys) + _timestamps(array.items)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _timestamps(array.flatten())
    if pa.types.is_struct(kind):
        return [leaf for i in range(kind.num_fields) for leaf in _timestamps(array.field(i))]
    return []


def _has_nanoseconds(kind: pa.DataType) -> bool:
    """Whether ``kind`` is or holds ``timestamp[ns]``."""
    if pa.types.is_timestamp(kind):
        return kind.unit == "ns"
    return any(_has_nanoseconds(kind.field(i).type) for i in range(kind.num_fields))
