""":class:`NdarrayCodec` and :class:`CompressedNdarrayCodec`: Petastorm's per-cell ``np.save`` /
``np.savez_compressed`` bytes, byte-compatible both ways.

Kept for Petastorm datasets; decoding parses the ``.npy`` header and never unpickles.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from unihub.errors import CodecError
from unihub.schema import npy
from unihub.schema.codecs.base import Codec, column_as_array, register_codec, stack_if_fixed, with_nulls
from unihub.schema.dtypes import fits, found_label
from unihub.schema.shapes import shape_matches

if TYPE_CHECKING:
    from unihub.schema.unischema import UnischemaField


@register_codec("ndarray")
class NdarrayCodec(Codec):
    """Petastorm's ``np.save`` bytes per cell; kept for compatibility, both ways.

    Decoding parses the ``.npy`` header directly and never unpickles; a column whose
    cells share one header is decoded in one vectorised step.
    """

    field_free_type = pa.binary()

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
            return fast if field.is_fixed_shape else with_nulls(list(fast), None)
        return stack_if_fixed(field, [None if v is None else _load_cell(field, v, row)
                                      for row, v in enumerate(array.to_pylist())])


@register_codec("compressed_ndarray")
class CompressedNdarrayCodec(Codec):
    """Petastorm's ``np.savez_compressed(arr=...)`` bytes per cell."""

    field_free_type = pa.binary()

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
    if isinstance(value, np.generic) and not field.shape:
        value = np.asarray(value)  # a numpy scalar for a shape () field, as validation takes it: its 0-d array
    if not isinstance(value, np.ndarray):
        raise CodecError(f"field {field.name!r}: expected a numpy array of {field.dtype}, found {type(value).__name__}",
                         field=field.name)
    if not fits(value.dtype, field.dtype) and field.dtype != object:
        raise CodecError(f"field {field.name!r}: expected dtype {field.dtype}, found {found_label(value.dtype)}",
                         field=field.name)
    if not shape_matches(value.shape, field.shape):
        raise CodecError(f"field {field.name!r}: expected shape {field.shape}, found {value.shape}", field=field.name)
    return value
