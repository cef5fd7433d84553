"""Checking one value against its field: dtype, shape (``None`` dims match any size), nulls.

Errors name the field, the row (when known), what was expected and what was found.
Image fields accept already-encoded PNG/JPEG bytes, whose size is read from the header.
"""

from __future__ import annotations

import decimal
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from unihub.errors import FieldTypeError, SchemaError, ValidationError
from unihub.images import decoders as images
from unihub.schema.codecs import CompressedImageCodec
from unihub.schema.dtypes import dtype_name, fits, found_label
from unihub.schema.shapes import shape_matches

if TYPE_CHECKING:
    from unihub.schema.unischema import Unischema, UnischemaField

# Which Python scalar types each numpy kind accepts (numpy arrays must match exactly).
_KIND_ACCEPTS: dict[str, tuple[type, ...]] = {
    "b": (bool, np.bool_),
    "i": (int, np.integer),
    "u": (int, np.unsignedinteger, np.integer),
    "f": (float, int, np.floating, np.integer),
    "c": (complex, float, int, np.number),
    "M": (np.datetime64,),
    "m": (np.timedelta64,),
}


def _where(field: UnischemaField, row: int | None) -> str:
    return f"field {field.name!r}" + (f", row {row}" if row is not None else "")


def validate_value(field: UnischemaField, value: Any, *, row: int | None = None) -> None:
    """Raise :class:`ValidationError` unless ``value`` can be stored in ``field``."""
    if value is None:
        if not field.nullable:
            raise ValidationError(f"{_where(field, row)}: expected a value, found None "
                                  "(the field is not nullable)", field=field.name, row=row)
        return

    if isinstance(field.codec, CompressedImageCodec) and isinstance(value, (bytes, bytearray, memoryview)):
        _validate_encoded_image(field, value, row)
    elif field.shape == ():
        _validate_scalar(field, value, row)
    else:
        _validate_array(field, value, row)


def _validate_scalar(field: UnischemaField, value: Any, row: int | None) -> None:
    dtype = field.numpy_dtype
    if isinstance(value, np.ndarray):
        if value.shape != ():  # not a scalar at all: Petastorm's TypeError
            raise FieldTypeError(f"{_where(field, row)}: expected a scalar of {np.dtype(field.dtype)}, "
                                 f"found an array of shape {value.shape}", field=field.name, row=row)
        value = value[()]
    if isinstance(value, (np.datetime64, np.timedelta64)) and np.isnat(value) and not field.nullable:
        raise ValidationError(f"{_where(field, row)}: expected a value, found NaT (a null; the field is not "
                              "nullable)", field=field.name, row=row)  # else pyarrow's raw error, no row named
    if dtype is np.str_:
        ok = isinstance(value, str)
    elif dtype is np.bytes_:  # str too where the bytes are stored as text (Petastorm's np.string_ idiom)
        ok = isinstance(value, (bytes, bytearray, memoryview)) or (isinstance(value, str) and stored_as_text(field))
    elif dtype is decimal.Decimal:
        ok = isinstance(value, (decimal.Decimal, str, int))
    elif dtype is np.object_:
        ok = True
    else:
        ok = _is_number_of(value, dtype)
    if not ok:
        # a list or a dict where one scalar belongs is the wrong kind of value (Petastorm's TypeError)
        error = FieldTypeError if isinstance(value, (list, tuple, dict, set)) else ValidationError
        raise error(f"{_where(field, row)}: expected a scalar of dtype "
                    f"{_dtype_label(dtype)}, found {_describe(value)}", field=field.name, row=row)


def _is_number_of(value: Any, dtype: Any) -> bool:
    """Whether ``value`` (a Python or numpy scalar) fits a field of the numeric ``dtype``: of a kind it
    accepts, not a bool unless ``dtype`` is, and an integer within its range."""
    kind = np.dtype(dtype).kind
    accepted = _KIND_ACCEPTS.get(kind, (np.generic,))
    ok = isinstance(value, accepted) and not (kind != "b" and isinstance(value, (bool, np.bool_)))
    if ok and isinstance(value, np.generic) and kind in "iu" and value.dtype.kind in "iu":
        ok = np.can_cast(value.dtype, dtype) or _int_fits(int(value), dtype)
    elif ok and isinstance(value, int) and kind in "iu":
        ok = _int_fits(value, dtype)
    return bool(ok)


def stored_as_text(field: UnischemaField) -> bool:
    """A ``np.bytes_`` scalar kept as a string: ``ScalarCodec(StringType())``, or no codec (which
    Spark stores as a string, as Petastorm maps ``np.string_``)."""
    if field.numpy_dtype is not np.bytes_ or field.shape != ():
        return False
    if field.codec is None:
        return True
    storage = getattr(field.codec, "storage_type", None)
    return storage is not None and (str(storage) in ("string", "large_string"))


def _int_fits(value: int, dtype: Any) -> bool:
    info = np.iinfo(dtype)
    return info.min <= value <= info.max


def _validate_array(field: UnischemaField, value: Any, row: int | None) -> None:
    if field.codec is None and isinstance(value, (list, tuple)):
        _validate_nested(field, value, field.shape, row)  # Arrow's nested lists: ragged is fine
        return
    if not isinstance(value, np.ndarray):
        raise ValidationError(f"{_where(field, row)}: expected a numpy array of dtype "
                              f"{_dtype_label(field.numpy_dtype)} and shape {field.shape}, found "
                              f"{_describe(value)}", field=field.name, row=row)
    expected = field.dtype
    if field.numpy_dtype is np.str_:
        dtype_ok = value.dtype.kind in "UO"
    elif field.numpy_dtype is np.bytes_:
        dtype_ok = value.dtype.kind in "SO"
    else:
        dtype_ok = fits(value.dtype, expected)
    if not dtype_ok:
        raise ValidationError(f"{_where(field, row)}: expected dtype {_dtype_label(field.numpy_dtype)}, "
                              f"found {found_label(value.dtype)}", field=field.name, row=row)
    if not shape_matches(value.shape, field.shape):
        raise ValidationError(f"{_where(field, row)}: expected shape {_shape_label(field.shape)}, "
                              f"found {value.shape}", field=field.name, row=row)


def _validate_nested(field: UnischemaField, value: Any, shape: tuple[int | None, ...], row: int | None) -> None:
    """A codec-less field's value given as nested lists (each level one dimension; sizes may differ
    between items where the dimension is None); arrays stand for the dimensions left."""
    if not shape:
        _validate_scalar(field._replace(shape=()), value, row)
        return
    if isinstance(value, np.ndarray):
        _validate_array(field._replace(shape=shape, codec=None), value, row)
        return
    if not isinstance(value, (list, tuple)) or (shape[0] is not None and len(value) != shape[0]):
        raise ValidationError(f"{_where(field, row)}: expected nested lists of shape {_shape_label(field.shape)}, "
                              f"found {_describe(value)} where {_shape_label(shape)} was due", field=field.name, row=row)
    for item in value:
        _validate_nested(field, item, shape[1:], row)


def _validate_encoded_image(field: UnischemaField, value: bytes | bytearray | memoryview, row: int | None) -> None:
    fmt = images.detect_format(value)
    if fmt is None:
        raise ValidationError(f"{_where(field, row)}: expected PNG or JPEG bytes or a uint8 array, "
                              f"found {len(value)} bytes that are neither", field=field.name, row=row)
    size = images.image_size(value)
    if size is None:
        return
    height, width, channels = size
    found = (height, width) if channels == 1 and len(field.shape) == 2 else (height, width, channels)
    if not shape_matches(found, field.shape):
        raise ValidationError(f"{_where(field, row)}: expected an image of shape {_shape_label(field.shape)}, "
                              f"found {fmt.upper()} bytes of shape {found}", field=field.name, row=row)
    depth = np.dtype(np.uint16 if fmt == "png" and value[24] == 16 else np.uint8)  # IHDR's bit depth
    if depth != field.dtype:  # stored as given, it failed only when read
        raise ValidationError(f"{_where(field, row)}: expected an image of dtype {np.dtype(field.dtype).name}, "
                              f"found {fmt.upper()} bytes of {depth.name} pixels", field=field.name, row=row)


def _dtype_label(dtype: Any) -> str:
    return dtype_name(dtype)


def _shape_label(shape: tuple[int | None, ...]) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of dtype {value.dtype} and shape {value.shape}"
    if isinstance(value, np.generic):
        return f"a numpy {value.dtype} scalar {value!r}"
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def column_length(schema: Unischema, columns: Mapping[str, Any]) -> int:
    """Rows of a column batch of ``schema``; unknown columns and unequal lengths are SchemaErrors."""
    unknown = set(columns) - set(schema.fields)
    if unknown:
        raise SchemaError(f"columns {sorted(unknown)} are not fields of {schema.name!r}")
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        raise SchemaError(f"columns of one batch must have equal lengths, found {lengths}")
    return next(iter(lengths.values()), 0)
