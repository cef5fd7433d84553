""":class:`TensorCodec`: Arrow-native tensors, and their fixed-size bytes in Parquet.

A fixed shape is Arrow's ``fixed_shape_tensor`` (a column decodes to one numpy array without a
copy), stored in Parquet as ``fixed_size_binary`` rows (:func:`tensor_to_parquet`,
:func:`tensor_from_parquet`); only the first dimension ``None``: a list of the flat values;
other shapes: a struct of the flat values and each row's shape (see :class:`TensorCodec`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from unihub.errors import CodecError, SchemaError
from unihub.schema import dtypes
from unihub.schema.arrow_numpy import numbers_array, to_numpy
from unihub.schema.codecs.base import (
    Codec,
    column_as_array,
    extension_storage,
    register_codec,
    stack_if_fixed,
    valid_mask,
)
from unihub.schema.codecs.scalar import ScalarCodec
from unihub.schema.shapes import fixed_dims, shape_matches
from unihub.schema.spark_types import arrow_to_spark_type

if TYPE_CHECKING:
    from unihub.schema.unischema import UnischemaField


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
            try:
                return pa.fixed_shape_tensor(value_type, list(field.shape))
            except (OverflowError, pa.ArrowInvalid) as exc:  # more values than a fixed-size list holds
                raise SchemaError(f"field {field.name!r}: shape {field.shape} is larger than an Arrow tensor "
                                  f"holds ({exc})") from None
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
            return _encode_block(field, values, arrow_type)
        present = [i for i, v in enumerate(values) if v is not None]
        arrays = [_as_array(field, values[i], i) for i in present]
        mask = None
        if len(present) != len(values):
            mask = np.ones(len(values), dtype=bool)
            mask[present] = False
        if layout == "fixed":
            return _encode_fixed_rows(field, arrays, present, mask, arrow_type, len(values))
        return _encode_varying_rows(field, arrays, present, mask, arrow_type, len(values))

    def decode_column(self, field: UnischemaField, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        array = column_as_array(column)
        if field.shape == ():
            return ScalarCodec(array.type).decode_column(field, array)
        if pa.types.is_fixed_size_binary(array.type) and parquet_tensor_type(field) == array.type:
            array = tensor_from_parquet(field, array)
        elif pa.types.is_fixed_size_binary(array.type):  # bytes of another width: another shape or dtype
            raise CodecError(f"field {field.name!r}: its column holds tensors of {array.type.byte_width} bytes, not "
                             f"{dtypes.dtype_name(field.numpy_dtype)} of shape {field.shape}: the schema does not "
                             "describe the column", field=field.name)
        storage = extension_storage(array)
        valid = valid_mask(storage)
        if pa.types.is_struct(storage.type):
            return _decode_struct_tensors(field, storage, valid)
        if field.is_fixed_shape and valid is None:
            return _decode_fixed_lists(field, storage)
        if field.shape.count(None) > 1 and _is_list_of_lists(storage.type):
            return _decode_nested_lists(field, storage)
        return _decode_lists(field, storage, valid)

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


#: the widest ``fixed_size_binary`` Arrow has (an int32 byte width): a larger tensor keeps the list layout
_MAX_BINARY_WIDTH = 2**31 - 1


def parquet_tensor_type(field: UnischemaField) -> pa.DataType | None:
    """``fixed_size_binary(nbytes)`` when ``field``'s tensors are stored as bytes in Parquet, else None.

    That is a fixed-shape, non-empty :class:`TensorCodec` field of numbers (booleans are
    bit-packed in Arrow, so they keep the list layout).
    """
    if not isinstance(field.codec, TensorCodec) or field.shape == () or not field.is_fixed_shape:
        return None
    dtype = np.dtype(field.dtype)
    size = math.prod(field.shape)  # type: ignore[arg-type]
    if dtype.kind not in "iuf" or size == 0 or size * dtype.itemsize > _MAX_BINARY_WIDTH:
        return None
    return pa.binary(size * dtype.itemsize)


def tensor_to_parquet(field: UnischemaField, array: pa.Array) -> pa.Array:
    """A ``fixed_shape_tensor`` column as ``fixed_size_binary`` rows of its values' bytes (no copy)."""
    width = parquet_tensor_type(field)
    assert width is not None, field
    storage = extension_storage(array)
    size = storage.type.list_size
    values = storage.values
    nulls = _nulls_in_valid_rows(storage, values, size) if values.null_count else 0
    if nulls:
        raise CodecError(f"field {field.name!r}: tensor values contain {nulls} nulls", field=field.name)
    start = (values.offset + storage.offset * size) * values.type.byte_width
    data = values.buffers()[1].slice(start, len(storage) * size * values.type.byte_width)
    validity = None
    if storage.null_count:
        validity = pa.array(storage.is_valid().to_numpy(zero_copy_only=False)).buffers()[1]
    return pa.Array.from_buffers(width, len(storage), [validity, data], null_count=storage.null_count)


def _nulls_in_valid_rows(storage: pa.FixedSizeListArray, values: pa.Array, size: int) -> int:
    """Null values of ``storage``'s rows that are not null themselves: a null row's values are null where Arrow
    made it from a None (``pa.array([[1, 2, 3], None], pa.list_(pa.float32(), 3))``), and stored as no value."""
    first = storage.offset * size
    null_value = ~to_numpy(values.is_valid())[first:first + len(storage) * size]
    return int(np.count_nonzero(null_value & np.repeat(to_numpy(storage.is_valid()), size)))


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


def _encode_block(field: UnischemaField, values: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    """A whole fixed-shape column given as one ``(n, *shape)`` array (HDF5 slices, numpy batches): no per-row work."""
    flat = np.ascontiguousarray(values).reshape(-1)
    flat_column = numbers_array(flat, pa.from_numpy_dtype(flat.dtype))
    flat_column = pa.array(flat) if flat_column is None else flat_column
    return pa.ExtensionArray.from_storage(
        arrow_type, pa.FixedSizeListArray.from_arrays(flat_column, math.prod(fixed_dims(field.shape))))


def _encode_fixed_rows(field: UnischemaField, arrays: list[np.ndarray], present: list[int], mask: np.ndarray | None,
                       arrow_type: pa.DataType, n: int) -> pa.Array:
    """The ``fixed_shape_tensor`` column of ``n`` rows: ``arrays`` at rows ``present``, null where ``mask``."""
    size = int(np.prod(fixed_dims(field.shape)))
    flat = _fill_rows(arrays, present, n, size, field.dtype)
    storage = pa.FixedSizeListArray.from_arrays(pa.array(flat), size, mask=pa.array(mask) if mask is not None else None)
    return pa.ExtensionArray.from_storage(arrow_type, storage)


def _encode_varying_rows(field: UnischemaField, arrays: list[np.ndarray], present: list[int], mask: np.ndarray | None,
                         arrow_type: pa.DataType, n: int) -> pa.Array:
    """The list (or, with each row's shape, struct) column of ``n`` rows: ``arrays`` at rows ``present``,
    null where ``mask``."""
    lengths = np.zeros(n, dtype=np.int64)
    lengths[present] = [a.size for a in arrays]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate([a.ravel() for a in arrays]) if arrays else np.empty(0, field.dtype)
    data = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat),
                                    mask=pa.array(mask) if mask is not None else None)
    if pa.types.is_list(arrow_type):
        return data
    shapes = np.zeros((n, len(field.shape)), dtype=np.int32)
    if arrays:
        shapes[present] = [a.shape for a in arrays]
    shape_col = pa.FixedSizeListArray.from_arrays(pa.array(shapes.ravel()), len(field.shape))
    return pa.StructArray.from_arrays([data, shape_col], names=["data", "shape"],
                                      mask=pa.array(mask) if mask is not None else None)


def _decode_fixed_lists(field: UnischemaField, storage: pa.Array) -> np.ndarray:
    """A fixed-shape column without nulls, stored as (nested) lists: one ``(n, *shape)`` array."""
    flat, offsets = _flatten_lists(storage)
    size = int(np.prod(fixed_dims(field.shape)))
    if offsets is not None and not np.all(np.diff(offsets) == size):
        bad = int(np.argmax(np.diff(offsets) != size))
        raise CodecError(f"field {field.name!r}, row {bad}: expected {size} values for shape "
                         f"{field.shape}, found {int(np.diff(offsets)[bad])}", field=field.name, row=bad)
    return _numpy_values(flat, field).reshape((len(storage), *field.shape))


def _decode_lists(field: UnischemaField, storage: pa.Array, valid: np.ndarray | None) -> np.ndarray:
    """A list column whose rows are null where ``valid`` is False, or vary in at most one dimension."""
    flat, offsets = _flatten_lists(storage)
    flat = _null_floats_as_nan(field, flat)
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
        raise CodecError(f"field {field.name!r}, row {row}: expected dtype {field.dtype}, "
                         f"found {dtypes.found_label(array.dtype)}", field=field.name, row=row)
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


def _null_floats_as_nan(field: UnischemaField, flat: pa.Array) -> pa.Array:
    """Null values inside rows of a float list (Parquet that others wrote) as NaN, as Petastorm read them;
    a null inside an integer list stays an error (Petastorm's too)."""
    if flat.null_count and np.dtype(field.dtype).kind == "f":
        return flat.fill_null(float("nan"))
    return flat


def _numpy_values(flat: pa.Array, field: UnischemaField) -> np.ndarray:
    """Numpy view of flat tensor values (zero-copy for numbers without nulls; null floats as NaN)."""
    flat = _null_floats_as_nan(field, flat)
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
