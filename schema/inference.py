"""Inferring Unischema fields from a plain Arrow/Parquet schema (no Unischema metadata).

Native scalars become :class:`ScalarCodec` fields; ``fixed_shape_tensor``, fixed-size and
variable lists of numbers become :class:`TensorCodec` fields (``None`` for dims that vary);
lists of strings/bytes keep codec ``None`` and decode as lists; other structs, maps and
unions have no tensor equivalent and are skipped (or refused) by the caller.
"""

from __future__ import annotations

import pyarrow as pa

from unihub.errors import SchemaError
from unihub.schema import dtypes
from unihub.schema.codecs import ScalarCodec, TensorCodec
from unihub.schema.unischema import UnischemaField


def _is_scalar(arrow_type: pa.DataType) -> bool:
    return not pa.types.is_nested(arrow_type) and not isinstance(arrow_type, pa.BaseExtensionType) \
        and not pa.types.is_null(arrow_type)


def _list_shape(arrow_type: pa.DataType) -> tuple[tuple[int | None, ...], pa.DataType] | None:
    """``(shape, value_type)`` of (nested) list types, or None if not a list of scalars."""
    shape: list[int | None] = []
    while True:
        if pa.types.is_fixed_size_list(arrow_type):
            shape.append(arrow_type.list_size)
        elif pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_list_view(arrow_type):
            shape.append(None)
        else:
            break
        arrow_type = arrow_type.value_type
    return (tuple(shape), arrow_type) if shape and _is_scalar(arrow_type) else None


def infer_field(arrow_field: pa.Field) -> UnischemaField | None:
    """The Unischema field for one Arrow field, or None when there is none."""
    arrow_type = arrow_field.type
    name, nullable = arrow_field.name, arrow_field.nullable
    try:
        if isinstance(arrow_type, pa.FixedShapeTensorType):
            return UnischemaField(name, dtypes.arrow_to_numpy_dtype(arrow_type.value_type),
                                  tuple(arrow_type.shape), TensorCodec(), nullable)
        if pa.types.is_dictionary(arrow_type):
            arrow_type = arrow_type.value_type
        if _is_scalar(arrow_type):
            return UnischemaField(name, dtypes.arrow_to_numpy_dtype(arrow_type), (), ScalarCodec(arrow_type), nullable)
        if pa.types.is_struct(arrow_type) and {f.name for f in arrow_type} == {"data", "shape"}:
            data_shape = _list_shape(arrow_type.field("data").type)
            shape_type = arrow_type.field("shape").type
            if data_shape and pa.types.is_fixed_size_list(shape_type):
                value_dtype = dtypes.arrow_to_numpy_dtype(data_shape[1])
                return UnischemaField(name, value_dtype, (None,) * shape_type.list_size, TensorCodec(), nullable)
        listed = _list_shape(arrow_type)
        if listed is not None:
            shape, value_type = listed
            dtype = dtypes.arrow_to_numpy_dtype(value_type)
            codec = TensorCodec() if dtypes.is_numeric(dtype) else None
            return UnischemaField(name, dtype, shape, codec, nullable)
    except SchemaError:
        return None
    return None
