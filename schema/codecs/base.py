"""The codec contract and registry, and the column helpers every codec shares.

A codec is one :class:`Codec` subclass registered by its JSON name in :data:`CODECS`
(``@register_codec("tensor")``), so a dataset's schema JSON (``{"type": "tensor", ...}``)
finds it again through :func:`codec_from_json`. Every codec works on whole columns:
:meth:`Codec.encode_column` turns a sequence of values into one Arrow array and
:meth:`Codec.decode_column` turns an Arrow array into numpy (one ``(n, *shape)`` array where
the shape is fixed, else an object array of per-row arrays, ``None`` for nulls).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa

from unihub.errors import CodecError, SchemaError
from unihub.registry import Registry
from unihub.schema.arrow_numpy import binary_array, string_array, to_numpy
from unihub.schema.spark_types import arrow_to_spark_type

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


def extension_storage(array: pa.Array) -> pa.Array:
    """The storage array of an extension array (a ``fixed_shape_tensor`` column's fixed-size lists), else ``array``."""
    return array.storage if isinstance(array, pa.ExtensionArray) else array


def with_nulls(values: list[Any] | np.ndarray, valid: np.ndarray | None) -> np.ndarray:
    """An object array holding ``values`` where valid and None elsewhere."""
    out = np.empty(len(valid) if valid is not None else len(values), dtype=object)
    if valid is None:
        out[:] = list(values) if not isinstance(values, np.ndarray) else [v for v in values]
        return out
    it = iter(values)
    for i, ok in enumerate(valid):
        out[i] = next(it) if ok else None
    return out


def valid_mask(array: pa.Array) -> np.ndarray | None:
    """Boolean validity per row, or None when the array has no nulls."""
    if array.null_count == 0:
        return None
    return np.asarray(to_numpy(array.is_valid()), dtype=bool)


class Codec(ABC):
    """Base class: stores one field's values in one Arrow column."""

    json_name: ClassVar[str] = ""
    #: the stored column's Arrow type where no field changes it (Petastorm's per-cell bytes), so
    #: :meth:`spark_dtype` needs no field, as Petastorm's ``codec.spark_dtype()`` took none
    field_free_type: ClassVar[pa.DataType | None] = None

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
            if self.field_free_type is None:
                raise SchemaError(f"{type(self).__name__}.spark_dtype needs the field")
            return arrow_to_spark_type(self.field_free_type)
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


def temporal_array(values: Sequence[Any], arrow_type: pa.DataType) -> pa.Array | None:
    """``values`` of numpy datetime64/timedelta64 scalars (and None), or such a 1-d array, as ``arrow_type``
    through numpy, or None where they are not: ``np.datetime64.item()`` gives a date, datetime or int by unit, and
    ``pa.array`` of the scalars themselves refuses any unit but the type's (a raw ArrowNotImplementedError)."""
    mask: np.ndarray | None = None
    if isinstance(values, np.ndarray):
        if values.dtype.kind not in "Mm" or values.ndim != 1:
            return None
        stacked = values
    else:
        temporal = [v for v in values if isinstance(v, (np.datetime64, np.timedelta64))]
        if not temporal or len(temporal) != sum(v is not None for v in values):
            return None
        mask = np.array([v is None for v in values], dtype=bool)
        stacked = np.array([temporal[0] if v is None else v for v in values])
    return _cast_temporal(_in_arrow_unit(stacked), mask if mask is not None and mask.any() else None, arrow_type)


def _in_arrow_unit(stacked: np.ndarray) -> np.ndarray:
    """``stacked`` in a unit Arrow converts (days, seconds to nanoseconds): years to minutes in seconds (exact)."""
    unit = np.datetime_data(stacked.dtype)[0]
    if unit in ("ps", "fs", "as"):
        raise pa.ArrowInvalid(f"{stacked.dtype} is finer than Arrow's nanoseconds")
    if unit not in ("s", "ms", "us", "ns") and not (stacked.dtype.kind == "M" and unit == "D"):
        return stacked.astype(f"{stacked.dtype.kind}8[s]")
    return stacked


def _cast_temporal(stacked: np.ndarray, mask: np.ndarray | None, arrow_type: pa.DataType) -> pa.Array:
    """In Arrow's own unit, then a safe cast (refuses a lost digit or an overflow): ``pa.array(type=)`` straight
    from datetime64[D] with a mask stored 1970-01-01 for every value after the first."""
    try:
        return pa.array(stacked, mask=mask).cast(arrow_type)
    except pa.ArrowInvalid as exc:
        if "lose data" not in str(exc):
            raise
        kind, numpy_type = ("timestamp", "datetime64") if stacked.dtype.kind == "M" else ("duration", "timedelta64")
        raise pa.ArrowInvalid(f"{exc} (the field stores {arrow_type}, np.{numpy_type}'s default: for finer values "
                              f"give it ScalarCodec(pa.{kind}('ns')))") from None


def arrow_values(values: Sequence[Any], arrow_type: pa.DataType) -> pa.Array:
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
