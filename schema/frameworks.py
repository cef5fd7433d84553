"""Rendering fields to framework dtypes: TensorFlow dtypes/TensorSpecs and torch dtypes.

Each function imports its framework when called, never at module import.
"""

from __future__ import annotations

import decimal
from typing import TYPE_CHECKING, Any

import numpy as np

from unihub.dependencies import require

if TYPE_CHECKING:
    from unihub.schema.unischema import UnischemaField


def tf_dtype(field: UnischemaField) -> Any:
    """The ``tf.DType`` of a field's decoded values (strings, bytes, decimals: ``tf.string``)."""
    tf = require("tensorflow", extra="tf", purpose="TensorFlow dtypes")
    if field.numpy_dtype in (np.str_, np.bytes_, np.object_) or field.numpy_dtype is decimal.Decimal:
        return tf.string
    if field.numpy_dtype is np.datetime64:
        return tf.int64
    return tf.as_dtype(np.dtype(field.numpy_dtype))


def tf_spec(field: UnischemaField, *, batched: bool = False) -> Any:
    """A ``tf.TensorSpec`` with the field's shape, ``None`` dims kept ``None``."""
    tf = require("tensorflow", extra="tf", purpose="TensorFlow specs")
    shape = ((None,) if batched else ()) + tuple(field.shape)
    return tf.TensorSpec(shape=shape, dtype=tf_dtype(field), name=field.name)


_TORCH_NAMES = {
    "bool": "bool", "uint8": "uint8", "int8": "int8", "int16": "int16", "int32": "int32",
    "int64": "int64", "float16": "float16", "float32": "float32", "float64": "float64",
    "complex64": "complex64", "complex128": "complex128", "uint16": "uint16", "uint32": "uint32",
    "uint64": "uint64",
}


def torch_dtype(field: UnischemaField) -> Any:
    """The ``torch.dtype`` of a field's values, or None where torch has none (strings, decimals)."""
    torch = require("torch", extra="torch", purpose="torch dtypes")
    if field.numpy_dtype in (np.str_, np.bytes_, np.object_) or field.numpy_dtype is decimal.Decimal:
        return None
    name = _TORCH_NAMES.get(np.dtype(field.numpy_dtype).name)
    return getattr(torch, name, None) if name else None
