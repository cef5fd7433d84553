"""Field dtypes: normalising what users pass, naming them in JSON, mapping them to Arrow.

A Unischema field's dtype is a numpy scalar type (``np.int64``, ``np.str_``,
``np.bytes_``, ...) or ``decimal.Decimal``, as in Petastorm, so ``field.numpy_dtype(v)``
keeps working; :func:`normalize_dtype` accepts the many spellings users write.
"""

from __future__ import annotations

import base64
import decimal
from typing import Any

import numpy as np
import pyarrow as pa

from unihub.errors import SchemaError
from unihub.schema.arrow_numpy import numpy_dtype

#: dtype name used in the JSON form -> numpy scalar type (or Decimal).
_SPECIAL_NAMES: dict[str, Any] = {
    "str": np.str_,
    "bytes": np.bytes_,
    "decimal": decimal.Decimal,
    "object": np.object_,
    "datetime64": np.datetime64,
    "timedelta64": np.timedelta64,
}
_PY_TYPES: dict[Any, Any] = {
    str: np.str_, bytes: np.bytes_, bool: np.bool_, int: np.int64, float: np.float64,
    bytearray: np.bytes_, object: np.object_,
}


def normalize_dtype(dtype: Any) -> Any:
    """The numpy scalar type (or ``decimal.Decimal``) for any spelling of a dtype."""
    if dtype is decimal.Decimal:
        return dtype
    if dtype in _PY_TYPES:
        return _PY_TYPES[dtype]
    if isinstance(dtype, str) and dtype in _SPECIAL_NAMES:
        return _SPECIAL_NAMES[dtype]
    if isinstance(dtype, pa.DataType):
        return arrow_to_numpy_dtype(dtype)
    try:
        return np.dtype(dtype).type
    except TypeError as exc:
        raise SchemaError(f"{dtype!r} is not a dtype unihub understands") from exc


def dtype_name(dtype: Any) -> str:
    """The JSON name of a normalised dtype: ``'int64'``, ``'str'``, ``'decimal'``, ..."""
    for name, special in _SPECIAL_NAMES.items():
        if dtype is special:
            return name
    return np.dtype(dtype).name


def fits(found: np.dtype, expected: np.dtype) -> bool:
    """Arrays of dtype ``found`` are stored in a field of dtype ``expected`` as they are: the same dtype, or any
    unit of a datetime64/timedelta64 field that names none (``np.datetime64``)."""
    return found == expected or (expected.kind in "Mm" and found.kind == expected.kind
                                 and np.datetime_data(expected)[0] == "generic")


def found_label(found: np.dtype) -> str:
    """``found`` in a dtype error, saying so where only its byte order is not the machine's (h5py, FITS and
    ``np.frombuffer(..., '>i4')`` give such arrays): ``int32 in big-endian byte order ('>i4'): ...``."""
    if found.byteorder not in "<>":  # '=' native, '|' none
        return str(found)
    native = found.newbyteorder("=")
    order = "big" if found.byteorder == ">" else "little"
    return (f"{native} in {order}-endian byte order ({found.str!r}): values are stored in the machine's order, "
            f"so give values.astype({native.str!r})")


def dtype_from_name(name: str) -> Any:
    """Inverse of :func:`dtype_name`."""
    if name in _SPECIAL_NAMES:
        return _SPECIAL_NAMES[name]
    try:
        return np.dtype(name).type
    except TypeError as exc:
        raise SchemaError(f"unknown dtype name {name!r} in schema JSON") from exc


def is_string(dtype: Any) -> bool:
    return dtype is np.str_


def is_bytes(dtype: Any) -> bool:
    return dtype is np.bytes_


def is_numeric(dtype: Any) -> bool:
    """Numbers and booleans: what a tensor can hold."""
    return dtype is not decimal.Decimal and np.dtype(dtype).kind in "biufc"


def numpy_to_arrow_type(dtype: Any) -> pa.DataType:
    """The Arrow type that stores one value of ``dtype``."""
    if dtype is np.str_:
        return pa.string()
    if dtype is np.bytes_:
        return pa.binary()
    if dtype is decimal.Decimal:
        return pa.decimal128(38, 18)
    if dtype is np.datetime64:
        return pa.timestamp("us")
    if dtype is np.timedelta64:
        return pa.duration("us")
    try:
        return pa.from_numpy_dtype(np.dtype(dtype))
    except (pa.ArrowNotImplementedError, TypeError) as exc:
        raise SchemaError(f"no Arrow type stores numpy dtype {dtype!r}") from exc


def arrow_to_numpy_dtype(arrow_type: pa.DataType) -> Any:
    """The numpy scalar type a value of ``arrow_type`` decodes to."""
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_string_view(arrow_type):
        return np.str_
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type) or pa.types.is_fixed_size_binary(arrow_type) or pa.types.is_binary_view(arrow_type):
        return np.bytes_
    if pa.types.is_decimal(arrow_type):
        return decimal.Decimal
    if pa.types.is_dictionary(arrow_type):
        return arrow_to_numpy_dtype(arrow_type.value_type)
    if pa.types.is_date32(arrow_type) or pa.types.is_date64(arrow_type) or pa.types.is_timestamp(arrow_type):
        return np.datetime64
    if pa.types.is_duration(arrow_type):
        return np.timedelta64
    try:
        return _empty_numpy_dtype(arrow_type).type
    except (NotImplementedError, TypeError, pa.ArrowNotImplementedError, pa.ArrowInvalid) as exc:
        raise SchemaError(f"Arrow type {arrow_type} has no numpy dtype") from exc


def arrow_type_to_json(arrow_type: pa.DataType) -> str:
    """A string that :func:`arrow_type_from_json` turns back into exactly ``arrow_type``.

    Simple types are kept readable (``'int64'``, ``'timestamp[ms]'``); anything else is the
    base64 of a one-field Arrow IPC schema, prefixed ``'ipc:'``.
    """
    text = str(arrow_type)
    try:
        if pa.type_for_alias(text) == arrow_type:
            return text
    except (ValueError, KeyError):
        pass
    blob = pa.schema([pa.field("t", arrow_type)]).serialize().to_pybytes()
    return "ipc:" + base64.b64encode(blob).decode("ascii")


def arrow_type_from_json(text: str) -> pa.DataType:
    """Inverse of :func:`arrow_type_to_json`."""
    try:
        if text.startswith("ipc:"):
            return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text[4:]))).field(0).type
        return pa.type_for_alias(text)
    except (ValueError, KeyError, pa.ArrowInvalid) as exc:
        raise SchemaError(f"cannot read Arrow type {text!r} from schema JSON") from exc


def _empty_numpy_dtype(arrow_type: pa.DataType) -> np.dtype:
    """The numpy dtype pyarrow converts ``arrow_type`` to, found without importing pandas."""
    known = numpy_dtype(arrow_type)  # without pyarrow's pandas bridge (~0.3 s of import)
    return known if known is not None else pa.array([], type=arrow_type).to_numpy(zero_copy_only=False).dtype


class InexactCast(ValueError):
    """A value that the target dtype cannot hold exactly (overflow, lost precision, NaN as an int)."""


def cast_exactly(values: np.ndarray, dtype: Any) -> np.ndarray:
    """``values`` as ``dtype`` when every value survives the cast, else :class:`InexactCast` naming the
    first that does not (a schema asking for int32 must not wrap 2**40, nor float16 make 1e9 inf)."""
    target = np.dtype(dtype)
    values = np.asarray(values)
    if values.dtype == target or values.dtype.kind == "O" or target.kind == "O":
        return values.astype(target, copy=False)
    with np.errstate(all="ignore"):
        out = values.astype(target)
        back = out.astype(values.dtype)
        # both ways: the round trip misses a sign flip (uint8 200 -> int8 -56 -> uint8 200), the
        # promoted comparison misses rounding both sides share (int64 2**60 + 1 vs float32)
        same = (back == values) & (out == values)
    if values.dtype.kind in "fc":
        same |= np.isnan(values) & np.isnan(back)
    if not same.all():
        bad = values[~same].ravel()[0]
        raise InexactCast(f"{bad!r} ({values.dtype}) does not fit dtype {target} exactly")
    return out
