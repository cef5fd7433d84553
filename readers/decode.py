"""One stored Arrow column -> the numpy values readers hand out, with Petastorm's types where asked.

Every field decodes through its codec. A field *without* a codec (common in Petastorm schemas:
``UnischemaField('id', np.int64, ())``) decodes as Petastorm decodes it too: scalars as arrays of
the field's numpy dtype (``uint8`` stored as a Spark short comes back ``uint8``), ``np.bytes_``
as bytes, one level of numbers as typed arrays; deeper lists stay Python lists; in rows, strings as
``np.str_`` (Petastorm's ``numpy_dtype(value)``).

**Petastorm's types** (:class:`DecodePolicy` ``petastorm=True``: the default for datasets Petastorm
wrote and plain Parquet, which is what Petastorm's readers read) differ in three places:

- nulls: a null float is NaN of the field's dtype (rows and batches); in batches a nullable
  integer column with nulls is float64 with NaN, and a timestamp column with nulls datetime64 with
  NaT (rows keep None, as Petastorm's rows do);
- lists: in batches, a variable-length 1-D list column whose rows all have one length is one
  ``(n, k)`` array (Petastorm stacks them), not an object array of arrays;
- strings: in rows, every scalar string is a ``np.str_`` (a ``str``), as Petastorm's codecs return
  ``numpy_dtype(value)``; unihub's rows keep ``str`` where a codec decodes them (``np.str_`` costs
  about 0.3 us a value to make: rows of two strings read ~35% more CPU).

unihub's own datasets keep None for nulls and object arrays for ``None`` dims, so a value's type
never depends on its batch's contents.

**An image that fails to decode** (its header and end marker sound, its compressed data corrupt: what
``--validate-images header`` lets through) raises :class:`~unihub.errors.ImageDecodeError` naming the
file, row group, row and field; with ``on_decode_error='skip'`` (``make_reader``, ``make_batch_reader``,
and so the loaders over them) its row is dropped instead, the epoch goes on, and :class:`DecodeSkips`
counts it for the reader's ``diagnostics`` and warns once. A shuffling loader that decodes after the
draw (readers/late_decode.py) drops the row from the batch it was drawn into, which is a row short.
Rows are counted after the drop: a shard (``shard_by='row'``, ``TorchIterableDataset``) holding a
skipped row delivers one row fewer than the others, so distributed training that needs equal shards
should keep ``'raise'`` (or drop the last, short batch of every rank).
"""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from unihub.errors import CodecError, InvalidArgumentError
from unihub.schema import dtypes
from unihub.schema.codecs import CompressedImageCodec, ScalarCodec, column_as_array
from unihub.schema.unischema import UnischemaField

#: what a reader does with an image that fails to decode (see the module docstring)
OnDecodeError = Literal["raise", "skip"]
ON_DECODE_ERROR: tuple[OnDecodeError, ...] = ("raise", "skip")
#: the messages of skipped rows a reader keeps for its diagnostics (the count has them all)
KEPT_SKIP_MESSAGES = 10


@dataclass(frozen=True)
class DecodePolicy:
    """How a reader decodes: Petastorm's types or unihub's (see the module docstring)."""

    petastorm: bool = False
    #: the columns are the output (batches, random access), not rows cut from them
    batched: bool = False
    #: the schema was inferred from the Arrow types (plain Parquet): a ragged list of lists is data, not a
    #: broken tensor, so its rows decode as arrays of arrays (:func:`_ragged_rows`) rather than fail
    inferred: bool = False

    @classmethod
    def for_store(cls, schema_source: str, petastorm_types: bool | None, *, batched: bool) -> DecodePolicy:
        """``petastorm_types=None``: Petastorm's types for datasets Petastorm wrote and plain Parquet."""
        petastorm = schema_source in ("petastorm", "inferred") if petastorm_types is None else bool(petastorm_types)
        return cls(petastorm, batched, schema_source == "inferred")


UNIHUB = DecodePolicy()


def decode_column(f: UnischemaField, column: pa.Array | pa.ChunkedArray, *, decode_images: bool = True,
                  policy: DecodePolicy = UNIHUB) -> Any:
    """One stored column as numpy values of field ``f`` (see the module docstring)."""
    try:
        if f.codec is None:
            values = _codecless(f, column)
        elif isinstance(f.codec, CompressedImageCodec) and not decode_images:
            return f.codec.decode_column(f, column, decode=False)
        else:
            try:
                values = f.codec.decode_column(f, column)
            except CodecError:
                if not (policy.inferred and _is_nested_list(column.type)):
                    raise
                values = _ragged_rows(f, column)
    except CodecError:
        raise
    except (ValueError, TypeError, OverflowError) as exc:  # ArrowInvalid is a ValueError
        raise undescribed_column(f, column, exc) from exc
    if not policy.batched and numpy_strings_in_rows(f, policy):
        values = _numpy_strings(values)
    if not policy.batched and policy.petastorm and f.shape == () and f.dtype.kind in "mM":
        values = _petastorm_row_times(column.type, values)
    return _as_petastorm(f, values, policy) if policy.petastorm else values


def undescribed_column(f: UnischemaField, column: pa.Array | pa.ChunkedArray, exc: BaseException) -> CodecError:
    """The error of a column its field does not describe (strings under an int64 field, ints under an image
    field: a hostile or mistaken schema): numpy's, Arrow's or a codec's raw error, named; the readers add the
    file and row group."""
    shape = f" of shape {f.shape}" if f.shape else ""
    codec = type(f.codec).__name__ if f.codec is not None else "no codec"
    return CodecError(f"field {f.name!r}: its column of {column.type} does not decode as "
                      f"{dtypes.dtype_name(f.numpy_dtype)}{shape} ({codec}): {type(exc).__name__}: {exc}",
                      field=f.name)


def with_policy_types(f: UnischemaField, values: Any, policy: DecodePolicy) -> Any:
    """Field ``f``'s column that a batch transform returned, in the types a read column has under ``policy``
    (Petastorm's: stacked uniform lists, NaN for nulls), as Petastorm converted a transform's output too."""
    return _as_petastorm(f, values, policy) if policy.petastorm else values


def decode_images(f: UnischemaField, blobs: list[Any], *, policy: DecodePolicy = UNIHUB,
                  into: np.ndarray | None = None) -> Any:
    """Image field ``f``'s encoded values (bytes; None for nulls) decoded as :func:`decode_column`
    decodes them stored: for a loader that held them encoded (readers/late_decode.py). A fixed-shape
    column goes into ``into`` where it is the array the column would be (``decode_blobs``)."""
    if not isinstance(f.codec, CompressedImageCodec):
        raise TypeError(f"field {f.name!r} is not an image field")
    values = f.codec.decode_blobs(f, blobs, into)
    return _as_petastorm(f, values, policy) if policy.petastorm else values


def decoded_images(fields: Iterable[UnischemaField], decode_images: bool = True) -> frozenset[str]:
    """The image fields of ``fields`` a reader decodes, now or after a shuffle (readers/late_decode.py;
    none where it does not decode): only decoded, never handed out, so they can be read as views of
    the file (``ParquetStore.read_row_group(views=...)``)."""
    if not decode_images:
        return frozenset()
    return frozenset(f.name for f in fields if isinstance(f.codec, CompressedImageCodec))


def _codecless(f: UnischemaField, column: pa.Array | pa.ChunkedArray) -> Any:
    array = column_as_array(column)
    if f.shape == () and _is_scalar_type(f.numpy_dtype) and not pa.types.is_nested(array.type):
        return ScalarCodec(array.type).decode_column(f, array)  # typed, as Petastorm's numpy_dtype(value)
    values = np.empty(len(array), dtype=object)
    values[:] = array.to_pylist() if len(array) else []
    if len(f.shape) == 1 and f.dtype.kind in "biuf" and _is_flat_list(array.type):
        values[:] = [None if v is None else np.asarray(v, dtype=f.dtype) for v in values]
    return values


def numpy_strings_in_rows(f: UnischemaField, policy: DecodePolicy) -> bool:
    """Whether rows hold ``f``'s strings as ``np.str_`` (see the module docstring)."""
    return f.shape == () and f.numpy_dtype is np.str_ and (f.codec is None or policy.petastorm)


def _numpy_strings(values: Any) -> Any:
    """A row reader's string values as ``np.str_``, the field's numpy type, as Petastorm's rows hold
    ``numpy_dtype(value)`` (see the module docstring); None stays None."""
    if not isinstance(values, np.ndarray) or values.dtype != object:
        return values
    return np.fromiter((None if v is None else np.str_(v) for v in values), dtype=object, count=len(values))


def _is_nested_list(arrow_type: pa.DataType) -> bool:
    is_list = pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or \
        pa.types.is_fixed_size_list(arrow_type)
    return is_list and pa.types.is_nested(arrow_type.value_type)


def _ragged_rows(f: UnischemaField, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An inferred list-of-lists column with ragged rows (which Petastorm's inferred schema left out, ARROW-1644):
    each row an array of field ``f``'s dtype where its lists are even, else an object array of its inner rows,
    each decoded the same way; None stays None."""
    values = np.empty(len(column), dtype=object)
    values[:] = [None if v is None else _ragged(v, f.dtype) for v in column_as_array(column).to_pylist()]
    for i, row in enumerate(values):  # an empty row as the codec gives it: (0, 0) for shape (None, None)
        if row is not None and row.size == 0 and row.ndim < len(f.shape):
            values[i] = row.reshape((0,) * len(f.shape))
    return values


def _ragged(value: list[Any], dtype: np.dtype) -> np.ndarray:
    try:
        return np.asarray(value, dtype=dtype)
    except (ValueError, TypeError):  # inner lists of different lengths (or nulls among them)
        out = np.empty(len(value), dtype=object)
        out[:] = [None if v is None else _ragged(v, dtype) if isinstance(v, list) else v for v in value]
        return out


def _petastorm_row_times(stored: pa.DataType, values: Any) -> Any:
    """A row reader's times in Petastorm's units: its rows held ``numpy_dtype(value)`` of the pandas value,
    so timestamps and durations came in microseconds (``datetime64[us]``, whatever unit they were stored
    in) and dates in days; None stays None. Petastorm dropped finer digits: a column holding any (a
    nanosecond) keeps its stored unit instead, so no value changes."""
    unit = "D" if pa.types.is_date(stored) else "us"
    if not isinstance(values, np.ndarray):
        return values
    if values.dtype != object:
        return _coarser_if_exact(values, unit)
    present = [v for v in values if v is not None]
    if not present:
        return values
    coarse = _coarser_if_exact(np.array(present), unit).dtype
    if coarse == present[0].dtype:
        return values
    return np.fromiter((None if v is None else v.astype(coarse) for v in values), dtype=object, count=len(values))


def _coarser_if_exact(values: np.ndarray, unit: str) -> np.ndarray:
    """``values`` (datetime64/timedelta64) in ``unit`` where that changes none of them, else as they are."""
    coarse = values.astype(f"{values.dtype.kind}8[{unit}]")  # numpy wraps what overflows: checked by the way back
    return coarse if bool((coarse.astype(values.dtype).view(np.int64) == values.view(np.int64)).all()) else values


def _is_scalar_type(numpy_dtype: Any) -> bool:
    return isinstance(numpy_dtype, type) and (issubclass(numpy_dtype, np.generic) or numpy_dtype.__name__ == "Decimal")


def _is_flat_list(arrow_type: pa.DataType) -> bool:
    return (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or
            pa.types.is_fixed_size_list(arrow_type)) and not pa.types.is_nested(arrow_type.value_type)


def _as_petastorm(f: UnischemaField, values: Any, policy: DecodePolicy) -> Any:
    """Petastorm's types: NaN for null floats (and, in batches, ints), NaT for a batch's null times,
    stacked uniform 1-D lists."""
    if not isinstance(values, np.ndarray) or values.dtype != object or not len(values):
        return values
    if policy.batched and f.shape == () and f.dtype.kind in "mM":
        return _nat_for_nulls(f, values)
    if f.shape == () and f.dtype.kind in "fiu":
        return _nan_for_nulls(f, values, policy)
    if policy.batched and len(f.shape) == 1 and f.dtype.kind in "biuf":
        lengths = {len(v) if isinstance(v, np.ndarray) and v.ndim == 1 else -1 for v in values}
        if len(lengths) == 1 and -1 not in lengths:
            return np.stack(list(values)).astype(f.dtype, copy=False)
    return values


def _nan_for_nulls(f: UnischemaField, values: np.ndarray, policy: DecodePolicy) -> np.ndarray:
    """A number column with nulls: NaN of a float field's dtype; float64 with NaN for an int field's batch;
    None kept in an int field's rows (as Petastorm's rows)."""
    # an object array compared with None elementwise; numpy's stubs do not take None as an operand
    nulls = np.equal(values, None)  # type: ignore[call-overload]
    if not nulls.any():
        return values.astype(f.dtype)
    if f.dtype.kind == "f" or policy.batched:
        values = values.copy()
        values[nulls] = np.nan
        return values.astype(f.dtype if f.dtype.kind == "f" else np.float64)
    return values


def _nat_for_nulls(f: UnischemaField, values: np.ndarray) -> np.ndarray:
    """A batch's timestamp (or duration) column with nulls as one datetime64 array with NaT, in the unit
    of its values, as Petastorm's batches (through pandas) had it, rather than an object array with None."""
    # an object array compared with None elementwise; numpy's stubs do not take None as an operand
    nulls = np.equal(values, None)  # type: ignore[call-overload]
    present = values[~nulls]
    dtype = np.asarray(present.tolist()).dtype if len(present) else _stored_time_dtype(f)
    if dtype.kind not in "mM":  # not numpy's times: leave them as they are
        return values
    out = np.full(len(values), np.array("NaT", dtype=dtype))
    out[~nulls] = present.tolist()
    return out


def _stored_time_dtype(f: UnischemaField) -> np.dtype:
    """The numpy type of field ``f``'s stored timestamps or durations, their unit included where known."""
    stored = f.codec.arrow_type(f) if isinstance(f.codec, ScalarCodec) else None
    if stored is not None and (pa.types.is_timestamp(stored) or pa.types.is_duration(stored)):
        return np.dtype(f"{'M' if pa.types.is_timestamp(stored) else 'm'}8[{stored.unit}]")
    return f.dtype


def check_on_decode_error(value: object) -> OnDecodeError:
    """``value`` if it is one of :data:`ON_DECODE_ERROR`, else :class:`InvalidArgumentError`."""
    if value not in ON_DECODE_ERROR:
        raise InvalidArgumentError(f"on_decode_error must be one of {', '.join(map(repr, ON_DECODE_ERROR))}, "
                                   f"got {value!r}")
    return value


def undecodable_rows(fields: Iterable[UnischemaField], blobs_of: Mapping[str, Sequence[Any]]) -> dict[int, CodecError]:
    """Rows whose images fail to decode each on its own, with the first error of each (its ``row`` and
    message counting rows of ``blobs_of``): the image fields among ``fields``, their encoded values in
    ``blobs_of`` (field name -> one value per row). Only asked after a batch failed, so it may be slow."""
    bad: dict[int, CodecError] = {}
    for f in fields:
        if not isinstance(f.codec, CompressedImageCodec) or f.name not in blobs_of:
            continue
        for row, blob in enumerate(blobs_of[f.name]):
            if row in bad or blob is None:
                continue
            try:
                f.codec.decode_blobs(f, [blob])
            except CodecError as exc:
                message = re.sub(r"\brow 0\b", f"row {row}", str(exc), count=1)
                bad[row] = CodecError(message, field=f.name, row=row)
    return bad


class DecodeSkips:
    """The rows a reader dropped for images that failed to decode (``on_decode_error='skip'``): counted,
    the first :data:`KEPT_SKIP_MESSAGES` messages kept, one warning for the first. Shared by the threads
    that decode (a loader's decode-ahead pool), hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.messages: list[str] = []

    def add(self, messages: Sequence[str]) -> None:
        if not messages:
            return
        with self._lock:
            first = self.count == 0
            self.count += len(messages)
            self.messages.extend(messages[:KEPT_SKIP_MESSAGES - len(self.messages)])
        if first:
            warnings.warn(f"on_decode_error='skip': dropped a row whose image does not decode ({messages[0]}); "
                          "further ones are counted in the reader's diagnostics['decode_errors_skipped'] "
                          "without a warning", UserWarning, stacklevel=2)
