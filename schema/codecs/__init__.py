"""Codecs: how a field's values are stored in an Arrow/Parquet column and decoded back.

Every codec works on **whole columns**: :meth:`Codec.encode_column` turns a sequence of
values into one Arrow array, :meth:`Codec.decode_column` turns an Arrow array into numpy
(one ``(n, *shape)`` array where the shape is fixed, else an object array of per-row
arrays, ``None`` for nulls). Single-value :meth:`encode` / :meth:`decode` keep
Petastorm's signatures. A codec is one class registered by its JSON name in
:data:`CODECS`, so a dataset's schema JSON finds it again.

- :class:`ScalarCodec`: native Arrow scalars (numbers, strings, bytes, decimals, times).
- :class:`TensorCodec`: Arrow-native tensors: ``fixed_shape_tensor`` when the shape is
  fixed (a column decodes to one numpy array without a copy); flat values plus shapes
  when some dimension is ``None``.
- :class:`CompressedImageCodec`: PNG/JPEG bytes, kept as given, decoded on read.
- :class:`NdarrayCodec`, :class:`CompressedNdarrayCodec`: Petastorm's ``np.save`` /
  ``np.savez_compressed`` cells, byte-compatible both ways.
"""

from __future__ import annotations

import io
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa

from unihub.errors import CodecError, CodecTypeError, SchemaError
from unihub.images import decoders as images
from unihub.images.decoders import leading_bytes
from unihub.registry import Registry
from unihub.schema import dtypes, npy
from unihub.schema.arrow_numpy import (
    arrow_backed_empty,
    binary_array,
    int64_array,
    is_binary_view,
    is_view,
    numbers_array,
    numpy_dtype,
    string_array,
    take_views,
    to_numpy,
    view_records,
    without_validity,
)
from unihub.schema.shapes import fixed_dims, shape_matches
from unihub.schema.spark_types import arrow_to_spark_type, spark_to_arrow_type

if TYPE_CHECKING:
    from unihub.schema.unischema import UnischemaField

CODECS: Registry[type[Codec]] = Registry("codec")


def register_codec(name: str):
    """Class decorator: register a codec class under its JSON name."""

    def add(cls: type[Codec]) -> type[Codec]:
        cls.json_name = name
        CODECS.add(name, cls)
        return cls

    return add


def codec_from_json(data: Mapping[str, Any]) -> Codec:
    """The codec described by ``{"type": name, ...config}``."""
    if "type" not in data:
        raise SchemaError(f"codec JSON {dict(data)!r} has no 'type'")
    cls = CODECS.get(data["type"])
    return cls.from_config({k: v for k, v in data.items() if k != "type"})


def column_as_array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One contiguous Arrow array from an array or chunked array (copies only if chunked)."""
    if isinstance(column, pa.ChunkedArray):
        if column.num_chunks == 1:
            return column.chunk(0)
        if column.num_chunks == 0:
            return pa.array([], type=column.type)
        return column.combine_chunks()
    return column


def _storage(array: pa.Array) -> pa.Array:
    return array.storage if isinstance(array, pa.ExtensionArray) else array


def _with_nulls(values: list[Any] | np.ndarray, valid: np.ndarray | None) -> np.ndarray:
    """An object array holding ``values`` where valid and None elsewhere."""
    out = np.empty(len(valid) if valid is not None else len(values), dtype=object)
    if valid is None:
        out[:] = list(values) if not isinstance(values, np.ndarray) else [v for v in values]
        return out
    it = iter(values)
    for i, ok in enumerate(valid):
        out[i] = next(it) if ok else None
    return out


def _valid_mask(array: pa.Array) -> np.ndarray | None:
    """Boolean validity per row, or None when the array has no nulls."""
    if array.null_count == 0:
        return None
    return np.asarray(to_numpy(array.is_valid()), dtype=bool)


class Codec(ABC):
    """Base class: stores one field's values in one Arrow column."""

    json_name: ClassVar[str] = ""

    @abstractmethod
    def arrow_type(self, field: UnischemaField) -> pa.DataType:
        """The Arrow type of the stored column."""

    @abstractmethod
    def encode(self, field: UnischemaField, value: Any) -> Any:
        """One value to what is stored (Petastorm's signature)."""

    @abstractmethod
    def decode(self, field: UnischemaField, value: Any) -> Any:
        """One stored value back to numpy (Petastorm's signature)."""

    def encode_arrow(self, field: UnischemaField, array: pa.Array) -> pa.Array:
        """:meth:`encode_column` of values given as an Arrow array (a format read them straight
        from its input buffer); codecs that store such arrays as they are override this."""
        return self.encode_column(field, array.to_pylist())

    def encode_column(self, field: UnischemaField, values: Sequence[Any]) -> pa.Array:
        """A column of values to one Arrow array (``None`` stays null)."""
        stored: list[Any] = []
        for row, value in enumerate(values):
            if value is None:
                stored.append(None)
                continue
            try:
                stored.append(self.encode(field, value))
            except CodecError:
                raise
            except Exception as exc:  # a library error: name the field and row
                raise CodecError(f"field {field.name!r}, row {row}: cannot encode with {self!r}: {exc}",
                                 field=field.name, row=row) from exc
        return pa.array(stored, type=self.arrow_type(field))

    def decode_column(self, field: UnischemaField, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """An Arrow column to numpy: ``(n, *shape)`` when every row has the same shape."""
        array = column_as_array(column)
        values = array.to_pylist()
        decoded: list[Any] = []
        for row, value in enumerate(values):
            if value is None:
                decoded.append(None)
                continue
            try:
                decoded.append(self.decode(field, value))
            except CodecError:
                raise
            except Exception as exc:
                raise CodecError(f"field {field.name!r}, row {row}: cannot decode with {self!r}: {exc}",
                                 field=field.name, row=row) from exc
        return stack_if_fixed(field, decoded)

    def spark_dtype(self, field: UnischemaField | None = None) -> Any:
        """The pyspark type of the stored column (imports pyspark)."""
        if field is None:
            raise SchemaError(f"{type(self).__name__}.spark_dtype needs the field")
        return arrow_to_spark_type(self.arrow_type(field))

    def config(self) -> dict[str, Any]:
        """The constructor arguments, JSON-able."""
        return {}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Codec:
        return cls(**config)

    def to_json(self) -> dict[str, Any]:
        return {"type": self.json_name, **self.config()}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.config() == self.config()

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted((k, repr(v)) for k, v in self.config().items()))))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"


def stack_if_fixed(field: UnischemaField, decoded: list[Any]) -> np.ndarray:
    """Stack per-row arrays into ``(n, *shape)`` when all are present and the shape is fixed."""
    if field.shape and field.is_fixed_shape and decoded and all(v is not None for v in decoded):
        try:
            return np.stack(decoded)
        except ValueError as exc:
            shapes = sorted({np.shape(v) for v in decoded})
            raise CodecError(f"field {field.name!r}: rows have shapes {shapes[:4]}, expected {field.shape}",
                             field=field.name) from exc
    out = np.empty(len(decoded), dtype=object)
    for i, v in enumerate(decoded):
        out[i] = v
    if not field.shape and decoded and all(v is not None for v in decoded):
        return out.astype(field.dtype) if field.dtype != object else out
    return out


# ---------------------------------------------------------------------------------------
@register_codec("scalar")
class ScalarCodec(Codec):
    """A native scalar column. Takes a numpy dtype, an Arrow type or a Spark type.

    ``ScalarCodec(pa.int64())``, ``ScalarCodec(np.float32)``, ``ScalarCodec(LongType())``.
    Decoded values take the field's numpy dtype.
    """

    def __init__(self, type: Any = None, *, arrow_type: Any = None) -> None:  # noqa: A002
        spec = arrow_type if arrow_type is not None else type
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
            if isinstance(values, np.ndarray) and values.dtype != object:
                shared = numbers_array(values, self._arrow_type)  # pa.array would import pandas
                return shared if shared is not None else pa.array(values, type=self._arrow_type, from_pandas=False)
            temporal = [v for v in values if isinstance(v, (np.datetime64, np.timedelta64))]
            if temporal and len(temporal) == sum(v is not None for v in values):
                # np.datetime64.item() gives date, datetime or int by unit: go through numpy instead
                mask = np.array([v is None for v in values], dtype=bool)
                stacked = np.array([temporal[0] if v is None else v for v in values])
                return pa.array(stacked, type=self._arrow_type, mask=mask if mask.any() else None)
            encoded = [self.encode(field, v) for v in values]
            return _arrow_values(encoded, self._arrow_type)
        except CodecError:
            raise  # encode()'s own, a CodecTypeError kept as the TypeError it is
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
            raise CodecError(f"field {field.name!r}: cannot store values as {self._arrow_type}: {exc}",
                             field=field.name) from exc

    def decode_column(self, field: UnischemaField, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        array = column_as_array(column)
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        if field.numpy_dtype is np.bytes_ and pa.types.is_string(array.type):
            array = array.cast(pa.binary())  # np.bytes_ as a Spark string (Petastorm's np.string_): bytes
        if pa.types.is_decimal(array.type):
            if field.dtype == object:
                return _with_nulls(array.to_pylist(), None)
            # a number stored as a decimal (Spark stores uint64 as decimal(20, 0)): exact via int
            cast = int if field.dtype.kind in "iu" else float
            if array.null_count == 0:
                return np.array([cast(v) for v in array.to_pylist()], dtype=field.dtype)
            return _with_nulls([None if v is None else field.numpy_dtype(cast(v)) for v in array.to_pylist()], None)
        valid = _valid_mask(array)
        if valid is None:
            out = to_numpy(array)
            if field.dtype != object and out.dtype != field.dtype:
                out = out.astype(field.dtype)
            return out
        known = numpy_dtype(array.type)  # numbers, booleans and text: no pyarrow conversion needed to tell
        values = None if known is not None else array.to_numpy(zero_copy_only=False)
        numeric = known.kind != "O" if known is not None else values is not None and values.dtype.kind != "O"
        if field.dtype != object and numeric:
            values = to_numpy(without_validity(array) if known is not None else array.fill_null(0))
            values = values.astype(field.dtype)
            out = np.empty(len(values), dtype=object)
            out[:] = list(values)  # numpy scalars of the field's dtype, as without nulls
            out[~valid] = None
            return out
        return values if values is not None else to_numpy(array)

    def config(self) -> dict[str, Any]:
        return {"arrow_type": dtypes.arrow_type_to_json(self._arrow_type)}

    def __repr__(self) -> str:
        """``ScalarCodec(FloatType())`` for a Spark type, as Petastorm wrote it; others by their config."""
        spark_repr = self.__dict__.get("_spark_repr")
        return f"ScalarCodec({spark_repr})" if spark_repr else super().__repr__()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ScalarCodec:
        return cls(dtypes.arrow_type_from_json(config["arrow_type"]))


def type_is_spark(value: Any) -> bool:
    """True for a pyspark ``DataType`` instance, checked without importing pyspark."""
    return type(value).__module__.startswith("pyspark.") and hasattr(value, "simpleString")


# ---------------------------------------------------------------------------------------
@register_codec("tensor")
class TensorCodec(Codec):
    """Arrow-native tensors.

    Fixed shape ``(d0, d1, ...)``: Arrow's canonical ``fixed_shape_tensor`` extension type;
    a column decodes to one ``(n, d0, d1, ...)`` numpy array that shares the Arrow buffer.
    In the Parquet files, numeric fixed-shape tensors are stored as ``FIXED_LEN_BYTE_ARRAY``
    values of the tensor's little-endian bytes (:func:`tensor_to_parquet`): Parquet has no
    fixed-size list, and its list encoding (a repetition level per value; uint8 widened to
    INT32) wrote ~10x and read ~20x slower. Reading turns them back into ``fixed_shape_tensor``
    without a copy (:func:`tensor_from_parquet`); list-stored tensors still decode.
    Only the first dimension ``None`` (``(None, 4)``): a list of the flat values, the first
    dimension follows from the length. Other ``None`` dims, and any shape with a zero
    dimension (``(0,)``, ``(3, 0)``, ``(None, 0)``: Arrow has no fixed-size list of size 0,
    and an empty list does not tell the other dims): a struct of the flat values (``data``)
    and the row's shape (``shape``). Lists that Spark or others wrote
    (``list<T>``, ``fixed_size_list<T>``, nested lists) decode too.
    """

    def arrow_type(self, field: UnischemaField) -> pa.DataType:
        value_type = self._value_type(field)
        layout = _tensor_layout(field)
        if layout == "scalar":
            return value_type
        if layout == "fixed":
            return pa.fixed_shape_tensor(value_type, list(field.shape))
        if layout == "list":
            return pa.list_(value_type)
        return pa.struct([pa.field("data", pa.list_(value_type)),
                          pa.field("shape", pa.list_(pa.int32(), len(field.shape)))])

    @staticmethod
    def _value_type(field: UnischemaField) -> pa.DataType:
        if not dtypes.is_numeric(field.numpy_dtype):
            raise SchemaError(f"field {field.name!r}: TensorCodec stores numbers and booleans, "
                              f"not {dtypes.dtype_name(field.numpy_dtype)}; use ScalarCodec or NdarrayCodec")
        return dtypes.numpy_to_arrow_type(field.numpy_dtype)

    def encode(self, field: UnischemaField, value: Any) -> Any:
        array = np.asarray(value, dtype=field.dtype)
        if _tensor_layout(field) in ("fixed", "list"):
            return array.ravel().tolist()
        return {"data": array.ravel().tolist(), "shape": list(array.shape)}

    def decode(self, field: UnischemaField, value: Any) -> Any:
        if isinstance(value, dict):
            return np.asarray(value["data"], dtype=field.dtype).reshape(value["shape"])
        return _reshape_flat(field, np.asarray(value, dtype=field.dtype))

    def encode_column(self, field: UnischemaField, values: Sequence[Any]) -> pa.Array:
        arrow_type = self.arrow_type(field)
        if field.shape == ():
            return pa.array(np.asarray(values, dtype=field.dtype) if not _has_none(values) else list(values),
                            type=arrow_type)
        layout = _tensor_layout(field)
        if (layout == "fixed" and isinstance(values, np.ndarray) and values.dtype == field.dtype
                and values.shape[1:] == field.shape):
            # a whole column as one array (HDF5 slices, numpy batches): no per-row work
            flat = np.ascontiguousarray(values).reshape(-1)
            flat_column = numbers_array(flat, pa.from_numpy_dtype(flat.dtype))
            flat_column = pa.array(flat) if flat_column is None else flat_column
            return pa.ExtensionArray.from_storage(
                arrow_type, pa.FixedSizeListArray.from_arrays(flat_column, math.prod(fixed_dims(field.shape))))
        present = [i for i, v in enumerate(values) if v is not None]
        arrays = [_as_array(field, values[i], i) for i in present]
        mask = None
        if len(present) != len(values):
            mask = np.ones(len(values), dtype=bool)
            mask[present] = False
        if layout == "fixed":
            size = int(np.prod(fixed_dims(field.shape)))
            flat = _fill_rows(arrays, present, len(values), size, field.dtype)
            storage = pa.FixedSizeListArray.from_arrays(pa.array(flat), size,
                                                        mask=pa.array(mask) if mask is not None else None)
            return pa.ExtensionArray.from_storage(arrow_type, storage)
        lengths = np.zeros(len(values), dtype=np.int64)
        lengths[present] = [a.size for a in arrays]
        offsets = np.zeros(len(values) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.concatenate([a.ravel() for a in arrays]) if arrays else np.empty(0, field.dtype)
        data = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat),
                                        mask=pa.array(mask) if mask is not None else None)
        if pa.types.is_list(arrow_type):
            return data
        shapes = np.zeros((len(values), len(field.shape)), dtype=np.int32)
        if arrays:
            shapes[present] = [a.shape for a in arrays]
        shape_col = pa.FixedSizeListArray.from_arrays(pa.array(shapes.ravel()), len(field.shape))
        return pa.StructArray.from_arrays([data, shape_col], names=["data", "shape"],
                                          mask=pa.array(mask) if mask is not None else None)

    def decode_column(self, field: UnischemaField, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        array = column_as_array(column)
        if field.shape == ():
            return ScalarCodec(array.type).decode_column(field, array)
        if pa.types.is_fixed_size_binary(array.type) and parquet_tensor_type(field) == array.type:
            array = tensor_from_parquet(field, array)
        storage = _storage(array)
        valid = _valid_mask(storage)
        if pa.types.is_struct(storage.type):
            return _decode_struct_tensors(field, storage, valid)
        if field.is_fixed_shape and valid is None:
            flat, offsets = _flatten_lists(storage)
            size = int(np.prod(fixed_dims(field.shape)))
            if offsets is not None and not np.all(np.diff(offsets) == size):
                bad = int(np.argmax(np.diff(offsets) != size))
                raise CodecError(f"field {field.name!r}, row {bad}: expected {size} values for shape "
                                 f"{field.shape}, found {int(np.diff(offsets)[bad])}", field=field.name, row=bad)
            return _numpy_values(flat, field).reshape((len(storage), *field.shape))
        if field.shape.count(None) > 1 and _is_list_of_lists(storage.type):
            return _decode_nested_lists(field, storage)
        flat, offsets = _flatten_lists(storage)
        if offsets is None:  # fixed_size_list with nulls
            size = storage.type.list_size
            offsets = np.arange(len(storage) + 1, dtype=np.int64) * size
        if flat.null_count and valid is not None:
            flat = _fill_values_of_null_rows(field, flat, offsets, valid)
        values = _numpy_values(flat, field)
        if valid is None and field.shape[0] is None and None not in field.shape[1:]:
            fast = _split_leading_dim(field, values, offsets)
            if fast is not None:
                return fast
        rows = [None if valid is not None and not valid[i]
                else _reshape_flat(field, values[offsets[i]:offsets[i + 1]], row=i)
                for i in range(len(storage))]
        return stack_if_fixed(field, rows)

    def spark_dtype(self, field: UnischemaField | None = None) -> Any:
        """Spark has no tensor type: fixed shapes are stored as flat arrays."""
        if field is None:
            raise SchemaError("TensorCodec.spark_dtype needs the field")
        arrow_type = self.arrow_type(field)
        if isinstance(arrow_type, pa.FixedShapeTensorType):
            arrow_type = pa.list_(arrow_type.value_type)
        return arrow_to_spark_type(arrow_type)


def _tensor_layout(field: UnischemaField) -> str:
    """How :class:`TensorCodec` stores ``field``: ``'scalar'``, ``'fixed'`` (fixed_shape_tensor),
    ``'list'`` (only the first dim varies) or ``'struct'`` (flat values and each row's shape).

    A zero dimension always takes the struct: Arrow refuses (or crashes on) fixed-size lists of
    size 0, and an empty list cannot tell ``(None, 0)``'s first dimension.
    """
    if field.shape == ():
        return "scalar"
    if 0 in field.shape:
        return "struct"
    if field.is_fixed_shape:
        return "fixed"
    return "list" if field.shape[0] is None and None not in field.shape[1:] else "struct"


def parquet_tensor_type(field: UnischemaField) -> pa.DataType | None:
    """``fixed_size_binary(nbytes)`` when ``field``'s tensors are stored as bytes in Parquet, else None.

    That is a fixed-shape, non-empty :class:`TensorCodec` field of numbers (booleans are
    bit-packed in Arrow, so they keep the list layout).
    """
    if not isinstance(field.codec, TensorCodec) or field.shape == () or not field.is_fixed_shape:
        return None
    dtype = np.dtype(field.dtype)
    size = math.prod(field.shape)  # type: ignore[arg-type]
    if dtype.kind not in "iuf" or size == 0:
        return None
    return pa.binary(size * dtype.itemsize)


def tensor_to_parquet(field: UnischemaField, array: pa.Array) -> pa.Array:
    """A ``fixed_shape_tensor`` column as ``fixed_size_binary`` rows of its values' bytes (no copy)."""
    width = parquet_tensor_type(field)
    assert width is not None, field
    storage = _storage(array)
    size = storage.type.list_size
    values = storage.values
    if values.null_count:
        raise CodecError(f"field {field.name!r}: tensor values contain {values.null_count} nulls", field=field.name)
    start = (values.offset + storage.offset * size) * values.type.byte_width
    data = values.buffers()[1].slice(start, len(storage) * size * values.type.byte_width)
    validity = None
    if storage.null_count:
        validity = pa.array(storage.is_valid().to_numpy(zero_copy_only=False)).buffers()[1]
    return pa.Array.from_buffers(width, len(storage), [validity, data], null_count=storage.null_count)


def tensor_from_parquet(field: UnischemaField, array: pa.Array) -> pa.ExtensionArray:
    """``fixed_size_binary`` rows read from Parquet, back as the field's ``fixed_shape_tensor`` (no copy)."""
    tensor_type = field.codec.arrow_type(field)  # type: ignore[union-attr]
    size = math.prod(field.shape)  # type: ignore[arg-type]
    validity, data = array.buffers()
    covered = (array.offset + len(array)) * size
    values = pa.Array.from_buffers(tensor_type.value_type, covered, [None, data])
    storage = pa.Array.from_buffers(tensor_type.storage_type, len(array), [validity], null_count=array.null_count,
                                    offset=array.offset, children=[values])
    return pa.ExtensionArray.from_storage(tensor_type, storage)


def _fill_values_of_null_rows(field: UnischemaField, flat: pa.Array, offsets: np.ndarray,
                              valid: np.ndarray) -> pa.Array:
    """Zeros for the null values that Parquet gives a null fixed-size row; a null inside a row is an error."""
    in_valid_row = np.repeat(valid, np.diff(offsets)[:len(valid)])
    null_value = ~np.asarray(to_numpy(flat.is_valid()), dtype=bool)[:len(in_valid_row)]
    if np.any(null_value & in_valid_row):
        raise CodecError(f"field {field.name!r}: tensor values contain nulls", field=field.name)
    return flat.fill_null(0)


def _has_none(values: Sequence[Any]) -> bool:
    return any(v is None for v in values)


def _as_array(field: UnischemaField, value: Any, row: int) -> np.ndarray:
    array = value if isinstance(value, np.ndarray) else np.asarray(value, dtype=field.dtype)
    if array.dtype != field.dtype:
        raise CodecError(f"field {field.name!r}, row {row}: expected dtype {field.dtype}, found {array.dtype}",
                         field=field.name, row=row)
    if not shape_matches(array.shape, field.shape):
        raise CodecError(f"field {field.name!r}, row {row}: expected shape {field.shape}, found {array.shape}",
                         field=field.name, row=row)
    return array


def _fill_rows(arrays: list[np.ndarray], present: list[int], n: int, size: int, dtype: np.dtype) -> np.ndarray:
    if len(present) == n:
        return np.stack(arrays).reshape(-1) if arrays else np.empty(0, dtype)
    flat = np.zeros((n, size), dtype=dtype)
    for i, a in zip(present, arrays):
        flat[i] = a.ravel()
    return flat.reshape(-1)


def _flatten_lists(storage: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
    """Innermost values of (nested) list storage, and per-row offsets into them.

    Offsets are None for a null-free ``fixed_size_list`` (every row has list_size values).
    """
    if pa.types.is_fixed_size_list(storage.type):
        if storage.null_count == 0 and not pa.types.is_nested(storage.type.value_type):
            return storage.flatten(), None
        size = storage.type.list_size
        start = storage.offset * size
        inner = storage.values.slice(start, len(storage) * size)
        offsets = np.arange(len(storage) + 1, dtype=np.int64) * size
    elif pa.types.is_list(storage.type) or pa.types.is_large_list(storage.type):
        offsets = np.asarray(to_numpy(storage.offsets), dtype=np.int64)
        inner = storage.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        offsets = offsets - offsets[0]
    else:
        return storage, np.arange(len(storage) + 1, dtype=np.int64)
    if pa.types.is_nested(inner.type):
        flat, inner_offsets = _flatten_lists(inner)
        if inner_offsets is not None:
            offsets = inner_offsets[offsets]
        else:
            offsets = offsets * inner.type.list_size
        return flat, offsets
    return inner, offsets


def _numpy_values(flat: pa.Array, field: UnischemaField) -> np.ndarray:
    """Numpy view of flat tensor values (zero-copy for numbers without nulls)."""
    if flat.null_count:
        raise CodecError(f"field {field.name!r}: tensor values contain {flat.null_count} nulls", field=field.name)
    values = to_numpy(flat)
    return values if values.dtype == field.dtype else values.astype(field.dtype)


def _split_leading_dim(field: UnischemaField, values: np.ndarray, offsets: np.ndarray) -> np.ndarray | None:
    """Rows of a ``(None, d1, ...)`` list column as views of one reshaped array (no per-row reshape).

    Returns None when some row's length is not a multiple of ``d1*...`` (the slow path reports it).
    """
    rest = field.shape[1:]
    inner = math.prod(rest)  # type: ignore[arg-type]
    if inner == 0 or np.any(offsets % inner):
        return None
    block = values[offsets[0]:offsets[-1]].reshape((-1, *rest))
    bounds = ((offsets - offsets[0]) // inner).tolist()
    out = np.empty(len(offsets) - 1, dtype=object)
    # plain slices, item by item: np.split costs ~10x more per piece, and assigning a list
    # would let numpy broadcast equal-shaped pieces into one array
    for i, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
        out[i] = block[start:stop]
    return out


def _reshape_flat(field: UnischemaField, values: np.ndarray, row: int | None = None) -> np.ndarray:
    """Give flat values the field's shape, solving the one ``None`` dim if there is one."""
    known = [d for d in field.shape if d is not None]
    unknown = len(field.shape) - len(known)
    if unknown == 0:
        shape = field.shape
    elif unknown == 1:
        rest = int(np.prod(known)) if known else 1
        if rest == 0 or values.size % rest:
            raise CodecError(f"field {field.name!r}, row {row}: {values.size} values do not fill shape {field.shape}",
                             field=field.name, row=row)
        shape = tuple(values.size // rest if d is None else d for d in field.shape)
    else:
        raise CodecError(f"field {field.name!r}: a list column cannot hold shape {field.shape} without the row "
                         "shapes", field=field.name)
    try:
        return values.reshape(shape)
    except ValueError as exc:
        raise CodecError(f"field {field.name!r}, row {row}: {values.size} values do not fit shape {field.shape}",
                         field=field.name, row=row) from exc


def _is_list_of_lists(arrow_type: pa.DataType) -> bool:
    is_list = pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or \
        pa.types.is_fixed_size_list(arrow_type)
    return is_list and pa.types.is_nested(arrow_type.value_type)


def _decode_nested_lists(field: UnischemaField, storage: pa.Array) -> np.ndarray:
    """Nested lists (as Spark writes ``array<array<T>>``) whose rows vary in more than one dim."""
    rows: list[Any] = []
    for i, value in enumerate(storage.to_pylist()):
        if value is None:
            rows.append(None)
            continue
        try:
            row = np.asarray(value, dtype=field.dtype)
        except (ValueError, TypeError) as exc:
            raise CodecError(f"field {field.name!r}, row {i}: nested lists are ragged, not a tensor of shape "
                             f"{field.shape}: {exc}", field=field.name, row=i) from exc
        if row.size == 0 and row.ndim < len(field.shape):
            row = row.reshape(row.shape + (0,) * (len(field.shape) - row.ndim))
        if not shape_matches(row.shape, field.shape):
            raise CodecError(f"field {field.name!r}, row {i}: expected shape {field.shape}, found {row.shape}",
                             field=field.name, row=i)
        rows.append(row)
    return stack_if_fixed(field, rows)


def _decode_struct_tensors(field: UnischemaField, storage: pa.StructArray, valid: np.ndarray | None) -> np.ndarray:
    data = storage.field("data")
    shapes_arr = storage.field("shape")
    flat, offsets = _flatten_lists(data)
    if offsets is None:  # data as a null-free fixed_size_list: list_size values a row
        offsets = np.arange(len(storage) + 1, dtype=np.int64) * data.type.list_size
    values = _numpy_values(flat, field)
    # Spark writes the shapes as array<int> (a list, empty in null rows), unihub as fixed_size_list
    shape_flat, shape_offsets = _flatten_lists(shapes_arr)
    shapes = to_numpy(shape_flat.fill_null(0)).astype(np.int64)
    if shape_offsets is None:
        shape_offsets = np.arange(len(storage) + 1, dtype=np.int64) * shapes_arr.type.list_size
    rows: list[Any] = []
    for i in range(len(storage)):
        if valid is not None and not valid[i]:
            rows.append(None)
            continue
        shape = tuple(int(d) for d in shapes[shape_offsets[i]:shape_offsets[i + 1]])
        try:
            rows.append(values[offsets[i]:offsets[i + 1]].reshape(shape))
        except ValueError as exc:
            raise CodecError(f"field {field.name!r}, row {i}: {offsets[i + 1] - offsets[i]} values do not fit "
                             f"the stored shape {shape}", field=field.name, row=i) from exc
    return stack_if_fixed(field, rows)


# ---------------------------------------------------------------------------------------
_JPEG_MAGIC = np.frombuffer(b"\xff\xd8\xff", np.uint8)
_PNG_MAGIC = np.frombuffer(b"\x89PNG\r\n\x1a\n", np.uint8)


def _not_images(array: pa.BinaryArray) -> np.ndarray:
    """Rows of a binary array (no nulls) that start with neither the JPEG nor the PNG magic."""
    n = len(array)
    offsets = np.frombuffer(array.buffers()[1], np.int32)[array.offset:array.offset + n + 1]
    data = array.buffers()[2]
    body = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)

    starts, lengths = offsets[:-1].astype(np.int64), np.diff(offsets)
    heads = leading_bytes(body, starts, lengths, 8)
    jpeg = (lengths >= 3) & (heads[:, :3] == _JPEG_MAGIC).all(1)
    png = (lengths >= 8) & (heads == _PNG_MAGIC).all(1)
    return np.flatnonzero(~(jpeg | png))


@register_codec("compressed_image")
class CompressedImageCodec(Codec):
    """PNG (lossless) or JPEG (``quality``) images in a binary column.

    ``encode`` takes a uint8 array (H, W), (H, W, 3) or (H, W, 4) in RGB(A) order, or bytes
    that already hold a PNG/JPEG file, stored as given (no re-encode). Decoded images are
    RGB(A)/grayscale, as Petastorm returned them (it swapped OpenCV's BGR back to RGB).
    """

    def __init__(self, image_codec: str = "png", quality: int = 80) -> None:
        fmt = image_codec.lower().lstrip(".")
        fmt = {"jpg": "jpeg"}.get(fmt, fmt)
        if fmt not in ("png", "jpeg"):
            raise SchemaError(f"CompressedImageCodec supports 'png' and 'jpeg', not {image_codec!r}")
        if not 0 <= int(quality) <= 100:
            raise SchemaError(f"JPEG quality must be within 0..100, got {quality}")
        self.image_codec = fmt
        self.quality = int(quality)

    def arrow_type(self, field: UnischemaField) -> pa.DataType:
        return pa.binary()

    def encode(self, field: UnischemaField, value: Any) -> bytes:
        if isinstance(value, (bytes, bytearray, memoryview)):
            if images.detect_format(value) is None:
                raise CodecError(f"field {field.name!r}: {len(value)} bytes are neither PNG nor JPEG",
                                 field=field.name)
            return bytes(value)
        array = np.asarray(value)
        if array.dtype != field.dtype:  # Petastorm's words first
            raise CodecError(f"Unexpected type of {field.name!r} feature: expected an image of dtype {field.dtype}, "
                             f"found {array.dtype}", field=field.name)
        if not shape_matches(array.shape, field.shape):
            raise CodecError(f"Unexpected dimensions of {field.name!r} feature: expected an image of shape "
                             f"{field.shape}, found {array.shape}", field=field.name)
        return images.encode_image(array, self.image_codec, self.quality)

    def decode(self, field: UnischemaField, value: Any) -> np.ndarray:
        return images.decode_image(value)

    def encode_column(self, field: UnischemaField, values: Sequence[Any]) -> pa.Array:
        """Bytes that are PNG/JPEG go in as they are, in one step; anything else value by value."""
        if len(values) and all(type(v) is bytes for v in values):
            return self.encode_arrow(field, _arrow_values(values, pa.binary()))
        return super().encode_column(field, values)

    def encode_arrow(self, field: UnischemaField, array: pa.Array) -> pa.Array:
        """Binary values that are all PNG/JPEG are stored as they are."""
        if not pa.types.is_binary(array.type) or array.null_count:
            return super().encode_arrow(field, array)
        bad = _not_images(array)
        if len(bad):
            row = int(bad[0])
            raise CodecError(f"field {field.name!r}, row {row}: {len(array[row].as_py())} bytes are neither PNG "
                             "nor JPEG", field=field.name, row=row)
        return array

    def decode_column(self, field: UnischemaField, column: pa.Array | pa.ChunkedArray,
                      *, decode: bool = True) -> np.ndarray:
        """Decode every image; ``decode=False`` returns the encoded bytes (e.g. for DALI)."""
        array = column_as_array(column)
        if not decode:
            return _with_nulls(array.to_pylist(), None)
        return self.decode_blobs(field, binary_views(array))

    def decode_blobs(self, field: UnischemaField, blobs: Sequence[Any], into: np.ndarray | None = None) -> np.ndarray:
        """Decode each encoded image of ``blobs`` (bytes-like; None for a null) as :meth:`decode_column`
        decodes a stored column: the column's views, or the bytes a shuffling queue held. A fixed-shape
        column is decoded into ``into`` where given, when it is the ``(n, *shape)`` array of the
        field's dtype that the column would be (a torch worker's shared memory)."""
        n = len(blobs)
        fixed = field.is_fixed_shape and n > 0 and not any(blob is None for blob in blobs)
        if fixed and into is not None and into.shape == (n, *fixed_dims(field.shape)) and \
                into.dtype == np.dtype(field.dtype) and into.flags.c_contiguous and into.flags.writeable:
            _refuse_too_many_pixels(field)
            out = into
        else:
            out = _image_column(field, n) if fixed else np.empty(n, dtype=object)
        row = 0
        try:
            if fixed:  # the decoders check each header against the row of ``out`` before decoding
                images.decode_images_into(blobs, out)
                return out
            # checked against each header before decoding; a gray image takes the field's rank
            shape = field.shape or None
            for row, blob in enumerate(blobs):
                out[row] = None if blob is None else images.decode_image(blob, shape=shape)
        except images.ImageDecodeError as exc:
            row = row if exc.row is None else exc.row
            raise images.ImageDecodeError(f"field {field.name!r}, row {row}: corrupt or mismatched "
                                          f"{self.image_codec.upper()} image (the field holds {field.shape} "
                                          f"{np.dtype(field.dtype).name}): {exc}", field=field.name, row=row) from exc
        return out

    def config(self) -> dict[str, Any]:
        return {"image_codec": self.image_codec, "quality": self.quality}

    def __repr__(self) -> str:
        """``CompressedImageCodec('png', 80)``: Petastorm's form, itself the call that makes this codec."""
        return f"{type(self).__name__}({self.image_codec!r}, {self.quality})"


def image_pixels_allowed(field: UnischemaField) -> bool:
    """Whether a fixed-shape image field's images are within ``images.MAX_IMAGE_PIXELS`` (a loader
    that allocates their memory ahead of decoding asks first)."""
    height, width = _height_width(field)
    return images.MAX_IMAGE_PIXELS is None or height * width <= images.MAX_IMAGE_PIXELS


def _height_width(field: UnischemaField) -> tuple[int, int]:
    height, width = (list(fixed_dims(field.shape)) + [1, 1])[:2]
    return height, width


def _refuse_too_many_pixels(field: UnischemaField) -> None:
    if not image_pixels_allowed(field):
        height, width = _height_width(field)
        raise images.ImageDecodeError(
            f"field {field.name!r} holds images of {width}x{height} pixels, more than the limit of "
            f"{images.MAX_IMAGE_PIXELS:,}; raise unihub.images.decoders.MAX_IMAGE_PIXELS, or set it to None, to decode "
            "images this large", field=field.name)


def _image_column(field: UnischemaField, n: int) -> np.ndarray:
    """The ``(n, *shape)`` array a fixed-shape image column decodes into, refused (ImageDecodeError)
    when the field's images are above ``images.MAX_IMAGE_PIXELS`` or the column does not fit in memory."""
    _refuse_too_many_pixels(field)
    try:
        return arrow_backed_empty((n, *fixed_dims(field.shape)), field.dtype)
    except MemoryError as exc:
        raise images.ImageDecodeError(f"field {field.name!r}: out of memory for {n} images of shape {field.shape}: "
                                      f"{exc}", field=field.name) from None


def _binary_spans(array: pa.Array) -> Spans | None:
    """Where each value of a binary array lies: (buffers as unsigned bytes, each value's buffer
    (None: all in the first), start, end); None for other types. Arrow's buffers export signed
    chars, which the image decoders refuse."""
    if pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
        offset_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
        _, offsets_buf, data_buf = array.buffers()
        offsets = np.frombuffer(offsets_buf, dtype=offset_type, count=len(array) + 1,
                                offset=array.offset * np.dtype(offset_type).itemsize)
        data = memoryview(data_buf).cast("B") if data_buf is not None else memoryview(b"")
        return [data], None, offsets[:-1], offsets[1:]
    if not is_binary_view(array.type):
        return None
    views = view_records(array)  # a read at formats/parquet_pages.py: one buffer, few values inline
    lengths = views[:, 0].astype(np.int64)
    referenced = lengths > 12
    buffers = [memoryview(b).cast("B") for b in array.buffers()[2:]]
    if referenced.all():
        starts = views[:, 3].astype(np.int64)
        return buffers, (None if len(buffers) == 1 else views[:, 2]), starts, starts + lengths
    # a short value lies in its own view, 4 bytes in: the views are the first buffer
    inline = 16 * np.arange(array.offset, array.offset + len(array), dtype=np.int64) + 4
    starts = np.where(referenced, views[:, 3], inline)
    which = np.where(referenced, views[:, 2] + 1, 0)
    return [memoryview(array.buffers()[1]).cast("B"), *buffers], which, starts, starts + lengths


def binary_views(array: pa.Array) -> list[memoryview | None]:
    """Zero-copy views of each value of a binary column (None for nulls); ``to_pylist`` would copy."""
    if not (pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type) or is_binary_view(array.type)):
        return array.to_pylist()
    return BinaryCells(array).at()


#: where a binary column's values lie: (buffers, each value's buffer or None: the first, starts, ends)
Spans = tuple[list[memoryview], np.ndarray | None, np.ndarray, np.ndarray]


def spans_at(spans: Spans, rows: np.ndarray | None = None) -> list[memoryview]:
    """The values ``spans`` (``(buffers, each value's buffer or None: the first, starts, ends)``) place
    at ``rows`` (every value where None), as zero-copy views of their buffers."""
    buffers, which, starts, ends = spans
    if rows is not None:
        starts, ends = starts[rows], ends[rows]
        which = None if which is None else which[rows]
    if which is None:
        data = buffers[0]
        return [data[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
    return [buffers[k][a:b] for k, a, b in zip(which.tolist(), starts.tolist(), ends.tolist())]


class BinaryCells:
    """A binary column's values by row, as zero-copy views (None for nulls): ``cells.at(rows)`` is
    what ``binary_views(column.take(rows))`` gives, without copying the values twice. Made once per
    column, it serves any number of lookups (a row group cached for random access). Binary, large
    binary and ``binary_view`` columns (images read without a copy: formats/parquet_pages.py)."""

    def __init__(self, column: pa.Array | pa.ChunkedArray) -> None:
        array = column.chunk(0) if isinstance(column, pa.ChunkedArray) and column.num_chunks == 1 else column
        self._column = column
        self._spans = _binary_spans(array) if isinstance(array, pa.Array) else None
        self._valid: np.ndarray | None = None
        if self._spans is not None and array.null_count:
            self._valid = to_numpy(array.is_valid())

    def spans(self) -> Spans | None:
        """Where each value lies, ``(buffers, each value's buffer or None: the first, starts, ends)``;
        None where :meth:`at` takes with Arrow (several chunks, not binary) or a value is null."""
        return self._spans if self._valid is None else None

    def at(self, rows: np.ndarray | None = None) -> list[Any]:
        """The values at ``rows``, in that order; every value where ``rows`` is None."""
        if self._spans is None:  # several chunks, or not binary: Arrow's take
            if rows is None:
                column = self._column
            elif is_view(self._column.type):
                column = take_views(self._column, rows)
            else:
                column = self._column.take(int64_array(rows))
            return binary_views(column_as_array(column))
        views: list[Any] = spans_at(self._spans, rows)
        if self._valid is not None:
            for i in np.flatnonzero(~(self._valid if rows is None else self._valid[rows])).tolist():
                views[i] = None
        return views


# ---------------------------------------------------------------------------------------
@register_codec("ndarray")
class NdarrayCodec(Codec):
    """Petastorm's ``np.save`` bytes per cell; kept for compatibility, both ways.

    Decoding parses the ``.npy`` header directly and never unpickles; a column whose
    cells share one header is decoded in one vectorised step.
    """

    def arrow_type(self, field: UnischemaField) -> pa.DataType:
        return pa.binary()

    def encode(self, field: UnischemaField, value: Any) -> bytes:
        array = _checked_ndarray(field, value)
        memfile = io.BytesIO()
        np.save(memfile, array)
        return memfile.getvalue()

    def decode(self, field: UnischemaField, value: Any) -> np.ndarray:
        return _load_cell(field, value, None)

    def decode_column(self, field: UnischemaField, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        array = column_as_array(column)
        if pa.types.is_large_binary(array.type):
            array = array.cast(pa.binary())
        fast = npy.load_npy_column(array) if array.null_count == 0 and len(array) else None
        if fast is not None:
            _check_stored(field, fast.dtype, fast.shape[1:], 0)  # one header for the whole column
            return fast if field.is_fixed_shape else _with_nulls(list(fast), None)
        return stack_if_fixed(field, [None if v is None else _load_cell(field, v, row)
                                      for row, v in enumerate(array.to_pylist())])


@register_codec("compressed_ndarray")
class CompressedNdarrayCodec(Codec):
    """Petastorm's ``np.savez_compressed(arr=...)`` bytes per cell."""

    def arrow_type(self, field: UnischemaField) -> pa.DataType:
        return pa.binary()

    def encode(self, field: UnischemaField, value: Any) -> bytes:
        array = _checked_ndarray(field, value)
        memfile = io.BytesIO()
        np.savez_compressed(memfile, arr=array)
        return memfile.getvalue()

    def decode(self, field: UnischemaField, value: Any) -> np.ndarray:
        return _load_cell(field, value, None, npz=True)

    def decode_column(self, field: UnischemaField, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        return stack_if_fixed(field, [None if v is None else _load_cell(field, v, row, npz=True)
                                      for row, v in enumerate(column_as_array(column).to_pylist())])


def _load_cell(field: UnischemaField, value: Any, row: int | None, *, npz: bool = False) -> np.ndarray:
    """One ``np.save`` (or, with ``npz``, ``np.savez_compressed``) cell of ``field``, its header checked
    against the field before any data is copied; errors name the field and ``row``."""
    try:
        load = npy.load_npz_member if npz else npy.load_npy
        return load(value, expected_dtype=field.dtype, expected_shape=field.shape)
    except (CodecError, ValueError, TypeError) as exc:
        where = f"field {field.name!r}" + ("" if row is None else f", row {row}")
        raise CodecError(f"{where}: {exc}", field=field.name, row=row) from exc


def _check_stored(field: UnischemaField, dtype: np.dtype, shape: tuple[int, ...], row: int | None) -> None:
    """Refuse an ``np.save`` cell whose dtype or shape contradicts ``field`` (header values: no per-element work)."""
    if (dtype == field.dtype or field.dtype.kind == "O") and shape_matches(shape, field.shape):
        return  # the common case, decided without building a message
    reason = npy.header_mismatch(dtype, shape, field.dtype, field.shape)
    if reason is not None:
        where = f"field {field.name!r}" + ("" if row is None else f", row {row}")
        raise CodecError(f"{where}: {reason}", field=field.name, row=row)


def _checked_ndarray(field: UnischemaField, value: Any) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise CodecError(f"field {field.name!r}: expected a numpy array of {field.dtype}, found {type(value).__name__}",
                         field=field.name)
    if value.dtype != field.dtype and field.dtype != object:
        raise CodecError(f"field {field.name!r}: expected dtype {field.dtype}, found {value.dtype}", field=field.name)
    if not shape_matches(value.shape, field.shape):
        raise CodecError(f"field {field.name!r}: expected shape {field.shape}, found {value.shape}", field=field.name)
    return value


def _arrow_values(values: Sequence[Any], arrow_type: pa.DataType) -> pa.Array:
    """``pa.array(values, arrow_type)``; all ``bytes`` into binary or all ``str`` into string without
    it, since it imports pandas (~0.3 s a process)."""
    try:
        if pa.types.is_binary(arrow_type) and all(type(v) is bytes for v in values):
            return binary_array(values)
        if pa.types.is_string(arrow_type) and all(type(v) is str for v in values):
            return string_array(values)
    except (ValueError, UnicodeEncodeError):
        pass  # more bytes than one array holds, or text that is not UTF-8: pyarrow's own answer
    return pa.array(values, type=arrow_type)
