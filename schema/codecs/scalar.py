""":class:`ScalarCodec`: one native Arrow scalar per cell (numbers, strings, bytes, decimals, times).

Takes a numpy dtype, an Arrow type or a Spark type; a column decodes to one numpy array of
the field's dtype, or an object array where nulls or decimals need Python values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from unihub.errors import CodecError, CodecTypeError, SchemaError
from unihub.schema import dtypes
from unihub.schema.arrow_numpy import numbers_array, numpy_dtype, to_numpy, without_validity
from unihub.schema.codecs.base import (
    Codec,
    arrow_values,
    column_as_array,
    register_codec,
    temporal_array,
    valid_mask,
    with_nulls,
)
from unihub.schema.spark_types import arrow_to_spark_type, spark_to_arrow_type

if TYPE_CHECKING:
    from unihub.schema.unischema import UnischemaField


@register_codec("scalar")
class ScalarCodec(Codec):
    """A native scalar column. Takes a numpy dtype, an Arrow type or a Spark type.

    ``ScalarCodec(pa.int64())``, ``ScalarCodec(np.float32)``, ``ScalarCodec(LongType())``
    (``spark_type=`` is Petastorm's keyword, whichever type it is given).
    Decoded values take the field's numpy dtype.
    """

    def __init__(self, spark_type: Any = None, *, arrow_type: Any = None) -> None:
        spec = arrow_type if arrow_type is not None else spark_type
        if spec is None:
            raise SchemaError("ScalarCodec needs a numpy dtype, an Arrow type or a Spark type")
        if isinstance(spec, str) and not hasattr(spec, "simpleString"):
            try:
                spec = dtypes.arrow_type_from_json(spec)
            except SchemaError:
                spec = dtypes.numpy_to_arrow_type(dtypes.normalize_dtype(spec))
        if isinstance(spec, pa.DataType):
            self._arrow_type = spec
        elif type_is_spark(spec):
            self._arrow_type = spark_to_arrow_type(spec)
            self._spark_repr = repr(spec)  # Petastorm's str(): ScalarCodec(FloatType())
        else:
            self._arrow_type = dtypes.numpy_to_arrow_type(dtypes.normalize_dtype(spec))

    @property
    def storage_type(self) -> pa.DataType:
        return self._arrow_type

    def arrow_type(self, field: UnischemaField) -> pa.DataType:
        return self._arrow_type

    def spark_dtype(self, field: UnischemaField | None = None) -> Any:
        return arrow_to_spark_type(self._arrow_type)

    def encode(self, field: UnischemaField, value: Any) -> Any:
        if not pa.types.is_nested(self._arrow_type):  # one value per cell, as Petastorm checked
            # Petastorm's order and words: the value's kind (TypeError), then the field's shape (ValueError)
            if isinstance(value, np.ndarray):
                if value.ndim:
                    raise CodecTypeError(f"Expected a scalar as a value for field {field.name!r}: found an array "
                                         f"of shape {value.shape}", field=field.name)
                value = value[()]
            elif isinstance(value, (list, tuple, dict, set)):
                raise CodecTypeError(f"Expected a scalar as a value for field {field.name!r}: found a "
                                     f"{type(value).__name__}", field=field.name)
            if field.shape != ():
                raise CodecError(f"The shape field of unischema_field {field.name!r} must be an empty tuple (i.e. "
                                 f"'()') to indicate a scalar: ScalarCodec({self._arrow_type}) stores scalars, but "
                                 f"the field's shape is {field.shape}; use shape () or a list type", field=field.name)
        if isinstance(value, (np.datetime64, np.timedelta64)):
            return pa.scalar(value, type=self._arrow_type).as_py()  # .item() would lose the unit
        if isinstance(value, np.generic):
            return value.item()
        return value

    def decode(self, field: UnischemaField, value: Any) -> Any:
        if field.numpy_dtype is np.bytes_ and isinstance(value, str):  # bytes stored as a Spark string
            return value.encode("utf-8")
        if field.numpy_dtype in (np.str_, np.bytes_, np.object_) or not issubclass(field.numpy_dtype, np.generic):
            return value
        return field.numpy_dtype(value)

    def encode_arrow(self, field: UnischemaField, array: pa.Array) -> pa.Array:
        return array if array.type == self._arrow_type else super().encode_arrow(field, array)

    def encode_column(self, field: UnischemaField, values: Sequence[Any]) -> pa.Array:
        try:
            temporal = temporal_array(values, self._arrow_type)
            if temporal is not None:
                return temporal
            if isinstance(values, np.ndarray) and values.dtype != object:
                shared = numbers_array(values, self._arrow_type)  # pa.array would import pandas
                return shared if shared is not None else pa.array(values, type=self._arrow_type, from_pandas=False)
            encoded = [self.encode(field, v) for v in values]
            return arrow_values(encoded, self._arrow_type)
        except CodecError:
            raise  # encode()'s own, a CodecTypeError kept as the TypeError it is
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
            raise CodecError(f"field {field.name!r}: cannot store values as {self._arrow_type}: {exc}",
                             field=field.name) from exc

    def decode_column(self, field: UnischemaField, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        array = _plain_values(field, column_as_array(column))
        if pa.types.is_decimal(array.type):
            return _decode_decimals(field, array)
        valid = valid_mask(array)
        if valid is None:
            out = to_numpy(array)
            if field.dtype != object and out.dtype != field.dtype:
                out = _numbers_as(out, field.dtype) if out.dtype != object else _cells_as(out, field.dtype)
            return out
        return _decode_with_nulls(field, array, valid)

    def config(self) -> dict[str, Any]:
        return {"arrow_type": dtypes.arrow_type_to_json(self._arrow_type)}

    def __repr__(self) -> str:
        """``ScalarCodec(FloatType())`` for a Spark type, as Petastorm wrote it; others by their config."""
        spark_repr = self.__dict__.get("_spark_repr")
        return f"ScalarCodec({spark_repr})" if spark_repr else super().__repr__()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ScalarCodec:
        return cls(dtypes.arrow_type_from_json(config["arrow_type"]))


def _numbers_as(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``values`` as ``dtype``, but numbers never as times: numpy makes an int64 column under a datetime64 field
    times of no unit (whose repr fails), where the schema is hostile or mistaken; the readers name the column."""
    if dtype.kind in "mM" and values.dtype.kind not in "mM":
        raise TypeError(f"{values.dtype} values have no time unit to read as {dtype}")
    return values.astype(dtype)


def _cells_as(cells: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """An object array of a list column's cells (an array each), each as ``dtype``: ``astype`` of the whole
    failed ("setting an array element with a sequence") on a row group of lists without a null."""
    out = np.empty(len(cells), dtype=object)
    for k, cell in enumerate(cells):  # one by one: lists of one length would be broadcast into a 2-D array
        out[k] = np.asarray(cell).astype(dtype, copy=False)
    return out


def _plain_values(field: UnischemaField, array: pa.Array) -> pa.Array:
    """``array`` with a dictionary decoded, and as bytes where ``field`` holds bytes stored as text."""
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if field.numpy_dtype is np.bytes_ and pa.types.is_string(array.type):
        array = array.cast(pa.binary())  # np.bytes_ as a Spark string (Petastorm's np.string_): bytes
    return array


def _decode_decimals(field: UnischemaField, array: pa.Array) -> np.ndarray:
    """A decimal column: ``Decimal`` objects for an object field, else the field's numbers (exact via int)."""
    if field.dtype == object:
        return with_nulls(array.to_pylist(), None)
    # a number stored as a decimal (Spark stores uint64 as decimal(20, 0)): exact via int
    cast = int if field.dtype.kind in "iu" else float
    if array.null_count == 0:
        return np.array([cast(v) for v in array.to_pylist()], dtype=field.dtype)
    return with_nulls([None if v is None else field.numpy_dtype(cast(v)) for v in array.to_pylist()], None)


def _decode_with_nulls(field: UnischemaField, array: pa.Array, valid: np.ndarray) -> np.ndarray:
    """A column with nulls (``valid`` False there): an object array of the field's numpy scalars and
    None for numbers, as pyarrow gives it for text and other values."""
    known = numpy_dtype(array.type)  # numbers, booleans and text: no pyarrow conversion needed to tell
    values = None if known is not None else array.to_numpy(zero_copy_only=False)
    numeric = known.kind != "O" if known is not None else values is not None and values.dtype.kind != "O"
    if field.dtype != object and numeric:
        values = to_numpy(without_validity(array) if known is not None else array.fill_null(0))
        values = _numbers_as(values, field.dtype)
        out = np.empty(len(values), dtype=object)
        out[:] = list(values)  # numpy scalars of the field's dtype, as without nulls
        out[~valid] = None
        return out
    return values if values is not None else to_numpy(array)


def type_is_spark(value: Any) -> bool:
    """True for a pyspark ``DataType`` instance, checked without importing pyspark."""
    return type(value).__module__.startswith("pyspark.") and hasattr(value, "simpleString")
