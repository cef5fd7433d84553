"""Pickling a Unischema the way Petastorm 0.13.1 stores it, without importing Petastorm.

Petastorm reads a dataset's schema by unpickling ``dataset-toolkit.unischema.v1`` from
``_common_metadata`` (see :mod:`unihub.petastorm.legacy` for what that pickle holds). To let
real Petastorm open a dataset unihub wrote, :func:`dumps_petastorm_unischema` builds that
pickle from stand-in classes whose pickled names are Petastorm's own
(``petastorm.unischema.Unischema``, ``petastorm.codecs.NdarrayCodec``,
``pyspark.sql.types.LongType``, ``numpy.int64`` ...). Nothing from petastorm or pyspark is
imported: a small pure-Python pickler writes each stand-in class as the global it names and
refuses every other global, so the output names only what unihub's own allow-list reader
(:func:`unihub.petastorm.legacy.load_petastorm_unischema`) also accepts.

Only fields Petastorm can decode are written: ScalarCodec, CompressedImageCodec (PNG/JPEG,
grayscale or RGB), NdarrayCodec, CompressedNdarrayCodec, and one-dimensional lists with no
codec. A TensorCodec of fixed shape is stored as raw bytes Petastorm cannot decode, so
:func:`check_petastorm_compatible` refuses it with a :class:`PetastormCompatibilityError`
that suggests NdarrayCodec.
"""

from __future__ import annotations

import collections
import decimal
import io
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from unihub.errors import PetastormCompatibilityError
from unihub.schema.codecs import (
    CompressedImageCodec,
    CompressedNdarrayCodec,
    NdarrayCodec,
    ScalarCodec,
    TensorCodec,
    parquet_tensor_type,
)
from unihub.schema.unischema import Unischema, UnischemaField

__all__ = ["check_petastorm_compatible", "dumps_petastorm_unischema"]

#: the pickle protocol Petastorm's readers (any Python 3, even 2) can load
PROTOCOL = 2

#: numpy scalar types by the name numpy 1.x exports them under (numpy 2 pickles np.bool_ as
#: ``numpy.bool``, which numpy 1.24-1.26 lacks)
_NUMPY_NAMES: dict[Any, str] = {
    np.bool_: "bool_", np.int8: "int8", np.int16: "int16", np.int32: "int32", np.int64: "int64",
    np.uint8: "uint8", np.uint16: "uint16", np.uint32: "uint32", np.uint64: "uint64",
    np.float16: "float16", np.float32: "float32", np.float64: "float64",
    np.complex64: "complex64", np.complex128: "complex128",
    np.str_: "str_", np.bytes_: "bytes_", np.datetime64: "datetime64", np.timedelta64: "timedelta64",
}

#: Arrow type (as ``str``) -> the pyspark type ScalarCodec carries for it (Spark has no unsigned types)
_SPARK_NAMES = {
    "bool": "BooleanType", "int8": "ByteType", "int16": "ShortType", "int32": "IntegerType",
    "int64": "LongType", "uint8": "ShortType", "uint16": "IntegerType", "uint32": "LongType",
    "halffloat": "FloatType", "float": "FloatType", "double": "DoubleType", "string": "StringType",
    "large_string": "StringType", "binary": "BinaryType", "large_binary": "BinaryType", "date32[day]": "DateType",
}

#: names a Petastorm Unischema has as attributes already: it does not set a field of that name
_UNISCHEMA_ATTRIBUTES = frozenset(dir(object)) | {
    "_name", "_fields", "__dict__", "__module__", "__weakref__", "__getattr__", "create_schema_view",
    "_get_namedtuple", "fields", "as_spark_schema", "make_namedtuple", "make_namedtuple_tf", "from_arrow_schema",
}


# -- stand-ins: pickled under Petastorm's (and pyspark's, numpy's) names --------------------
class _StandIn:
    """An object pickled as ``NEWOBJ(cls)`` + ``BUILD(__dict__)``, as the real classes are."""

    def __init__(self, **state: Any) -> None:
        self.__dict__.update(state)


class _Field(tuple):
    """``petastorm.unischema.UnischemaField``: a namedtuple, pickled as ``NEWOBJ(cls, values)``."""

    __slots__ = ()

    def __getnewargs__(self) -> tuple[Any, ...]:
        return tuple(self)


def _class(module: str, name: str, base: type = _StandIn) -> type:
    return type(name, (base,), {"__module__": module, "__qualname__": name, **({"__slots__": ()} if base is _Field
                                                                                 else {})})


_UNISCHEMA = _class("petastorm.unischema", "Unischema")
_FIELD = _class("petastorm.unischema", "UnischemaField", _Field)
_CODECS = {name: _class("petastorm.codecs", name)
           for name in ("ScalarCodec", "CompressedImageCodec", "NdarrayCodec", "CompressedNdarrayCodec")}
_SPARK = {name: _class("pyspark.sql.types", name)
          for name in {*_SPARK_NAMES.values(), "DecimalType", "TimestampType", "TimestampNTZType", "ArrayType"}}

#: every global the pickle may name: object -> (module, name)
_GLOBALS: dict[Any, tuple[str, str]] = {
    **{cls: (cls.__module__, cls.__qualname__) for cls in (_UNISCHEMA, _FIELD, *_CODECS.values(), *_SPARK.values())},
    **{dtype: ("numpy", name) for dtype, name in _NUMPY_NAMES.items()},
    decimal.Decimal: ("decimal", "Decimal"),
    collections.OrderedDict: ("collections", "OrderedDict"),
}


class _Pickler(pickle._Pickler):  # the pure-Python pickler: its save_global can be replaced
    """Writes the stand-ins as the globals they name; any other global is refused."""

    # pickle._Pickler's own (set in its __init__, a method), which typeshed leaves out as undocumented
    write: Callable[[bytes], Any]
    memoize: Callable[[Any], None]

    def save_global(self, obj: Any, name: str | None = None) -> None:
        try:
            module, qualname = _GLOBALS[obj]
        except (KeyError, TypeError):
            raise pickle.PicklingError(f"{obj!r} has no place in a Petastorm Unischema pickle") from None
        self.write(pickle.GLOBAL + f"{module}\n{qualname}\n".encode("ascii"))
        self.memoize(obj)


# -- unihub field -> stand-ins ---------------------------------------------------------------
def _spark_type(arrow_type: pa.DataType, field: str) -> Any:
    if isinstance(arrow_type, pa.BaseExtensionType):
        arrow_type = arrow_type.storage_type
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    name = _SPARK_NAMES.get(str(arrow_type))
    if name == "StringType":
        return _SPARK[name](collation="UTF8_BINARY")  # pyspark 4 reads it; older pysparks ignore it
    if name is not None:
        return _SPARK[name]()
    if pa.types.is_decimal(arrow_type) and arrow_type.precision <= 38:
        return _SPARK["DecimalType"](precision=arrow_type.precision, scale=arrow_type.scale, hasPrecisionInfo=True)
    if pa.types.is_uint64(arrow_type):
        return _SPARK["DecimalType"](precision=20, scale=0, hasPrecisionInfo=True)
    if pa.types.is_timestamp(arrow_type):
        return _SPARK["TimestampType" if arrow_type.tz else "TimestampNTZType"]()
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return _SPARK["ArrayType"](elementType=_spark_type(arrow_type.value_type, field),
                                   containsNull=arrow_type.value_field.nullable)
    raise PetastormCompatibilityError(f"field {field!r}: Arrow type {arrow_type} has no pyspark type for "
                                      "Petastorm's ScalarCodec")


def _is_flat_list(arrow_type: pa.DataType) -> bool:
    return (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)) and \
        not pa.types.is_nested(arrow_type.value_type)


def _codec(field: UnischemaField) -> Any:
    """The Petastorm codec stand-in for ``field`` (None: no codec), or a PetastormCompatibilityError."""
    codec = field.codec
    if isinstance(codec, ScalarCodec):
        if field.shape != ():
            raise PetastormCompatibilityError(f"field {field.name!r}: a ScalarCodec field of shape {field.shape} "
                                              "cannot be read by Petastorm, whose ScalarCodec holds scalars")
        return _CODECS["ScalarCodec"](_spark_type=_spark_type(codec.storage_type, field.name))
    if isinstance(codec, CompressedImageCodec):
        if not (len(field.shape) == 2 or (len(field.shape) == 3 and field.shape[2] in (3, None))):
            raise PetastormCompatibilityError(f"field {field.name!r}: Petastorm decodes images of shape (H, W) or "
                                              f"(H, W, 3), not {field.shape}")
        return _CODECS["CompressedImageCodec"](_image_codec="." + codec.image_codec, _quality=codec.quality)
    if isinstance(codec, NdarrayCodec):
        return _CODECS["NdarrayCodec"]()
    if isinstance(codec, CompressedNdarrayCodec):
        return _CODECS["CompressedNdarrayCodec"]()
    if isinstance(codec, TensorCodec) or codec is None:
        # a flat list (shape (None,) or (), no codec) is what Petastorm reads without a codec
        stored = parquet_tensor_type(field) or field.arrow_type()
        if field.shape == (None,) and _is_flat_list(stored):
            return None
        if codec is None and field.shape == () and not pa.types.is_nested(stored):
            return None
        raise PetastormCompatibilityError(
            f"field {field.name!r}: {type(codec).__name__ if codec else 'no codec'} with shape {field.shape} is "
            f"stored as {stored}, which Petastorm cannot decode; use NdarrayCodec() for it to be readable by "
            "Petastorm (or write without petastorm_compatible)")
    raise PetastormCompatibilityError(f"field {field.name!r}: Petastorm has no codec like {type(codec).__name__}")


def _dtype(field: UnischemaField) -> Any:
    if field.numpy_dtype not in _GLOBALS:
        raise PetastormCompatibilityError(f"field {field.name!r}: dtype {field.numpy_dtype!r} cannot be written "
                                          "into a Petastorm Unischema")
    return field.numpy_dtype


def _field(field: UnischemaField) -> Any:
    shape = tuple(None if d is None else int(d) for d in field.shape)
    return _FIELD((field.name, _dtype(field), shape, _codec(field), bool(field.nullable)))


def check_petastorm_compatible(schema: Unischema) -> None:
    """Raise :class:`PetastormCompatibilityError` naming every field Petastorm 0.13.1 could not read."""
    problems = []
    for field in schema:
        try:
            _field(field)
        except PetastormCompatibilityError as exc:
            problems.append(str(exc))
    if problems:
        raise PetastormCompatibilityError(f"Unischema {schema.name!r} cannot be written for Petastorm: "
                                          + "; ".join(problems))


def dumps_petastorm_unischema(schema: Unischema) -> bytes:
    """``pickle.dumps`` of the ``petastorm.unischema.Unischema`` equal to ``schema``, made without Petastorm."""
    check_petastorm_compatible(schema)
    fields = [_field(f) for f in schema]
    state: dict[str, Any] = {"_name": schema.name, "_fields": collections.OrderedDict((f[0], f) for f in fields)}
    for f in fields:
        if f[0] not in _UNISCHEMA_ATTRIBUTES and f[0] not in state:
            state[f[0]] = f
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=PROTOCOL).dump(_UNISCHEMA(**state))
    return buffer.getvalue()
