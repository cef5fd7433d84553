"""How unihub values are stored in HDF5: the layout and dtypes a dataset came from, or unihub's own.

:func:`export_spec` decides, field by field, how a schema is written: fields the metadata of an
HDF5 ingest describes (``unihub.extra`` -> ``hdf5.layout``) rebuild their source datasets exactly
(compounds from their members' fields, enums, complex numbers, fixed-length strings, attributes);
every other field is stored unihub's way (:func:`storage_of`: companions for ragged and nullable
fields, the field recorded in ``unihub.field``). The row functions here (:func:`storage_rows`,
:func:`assemble`, :func:`generic_value`) are shared with ``verify``'s :func:`native_records`, so
that what verify expects is what an export writes.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from unihub.errors import SchemaError
from unihub.formats.hdf5.dtypes import (
    Member,
    dtype_from_json,
    field_for,
    h5py_module,
    leaves_of,
    member_dtype,
    object_array,
    to_h5,
)
from unihub.formats.hdf5.layout import ISNULL_SUFFIX, KEY_FIELDS, SHAPE_SUFFIX
from unihub.schema import dtypes
from unihub.schema.codecs import CompressedImageCodec, TensorCodec
from unihub.schema.shapes import fixed_dims
from unihub.schema.unischema import Unischema, UnischemaField

_VLEN_ROW_BYTES = 64


@dataclass
class Typed:
    """A source dataset (or attribute) rebuilt from the fields of its leaves."""

    path: str  #: relative to the unit; an attribute's owner ('' = the unit)
    dtype: np.dtype
    attr: str | None = None
    members: list[tuple[str, Member]] = field(default_factory=list)  #: (field name, member path)
    group: bool = False  #: an attribute of a group inside each sample group (made when no dataset made it)


@dataclass
class ExportSpec:
    """How a schema is written: layout, key field, source datasets rebuilt, fields stored unihub's way."""

    kind: str = "columns"
    container: str = ""
    key_field: str | None = None
    typed: list[Typed] = field(default_factory=list)
    generic: list[UnischemaField] = field(default_factory=list)
    constants: dict[str, Any] = field(default_factory=dict)  #: path -> a dataset that is not rows
    attributes: dict[str, Any] = field(default_factory=dict)  #: object path -> {name: attribute}
    empty: dict[str, Any] = field(default_factory=dict)  #: path -> a dataset of a unit of 0 rows
    groups: list[str] = field(default_factory=list)  #: the groups outside the rows (empty ones included)
    units: list[str] = field(default_factory=list)  #: the source's splits (an empty one has no rows)
    images: str = "bytes"
    #: path -> how the source stored that dataset (``hdf5_meta.storage_record``); a groups layout's members
    #: by their path in the group (``member_storage``), the groups where one differs by their own path
    storage: dict[str, Any] = field(default_factory=dict)
    member_storage: dict[str, Any] = field(default_factory=dict)
    links: dict[str, Any] = field(default_factory=dict)  #: path -> the source's other name of an object
    scales: dict[str, Any] = field(default_factory=dict)  #: the source's dimension scales and attachments
    named_types: dict[str, Any] = field(default_factory=dict)  #: path -> a named datatype's dtype (JSON)
    #: path -> the names in an object that tracks their creation order (``hdf5_meta.creation_orders``)
    creation_order: dict[str, Any] = field(default_factory=dict)
    #: the same inside the units, and whether their container tracks it (``hdf5_meta.unit_order``); None:
    #: not recorded (an ingest before it, or no HDF5 source): the container and splits tracked, samples not
    unit_order: dict[str, Any] | None = None
    #: what the export was asked for beyond the source (``compression``, ``chunk_rows``): the datasets of rows
    #: stored so instead of as the source stored them (columns and splits layouts)
    asked: dict[str, Any] = field(default_factory=dict)


#: the export options that store the datasets of rows otherwise than the source did (:attr:`ExportSpec.asked`)
ASKED = ("compression", "chunk_rows")


def asked_of(options: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`ASKED` options of ``options`` that are set (not None): an export's, a verify's, or what an
    export recorded in its layout attribute."""
    return {key: options[key] for key in ASKED if options.get(key) is not None}


def export_spec(schema: Unischema, *, layout: str = "columns", key_field: str | None = None,
                source: Mapping[str, Any] | None = None, images: str = "bytes") -> ExportSpec:
    """The :class:`ExportSpec` of ``schema``; ``source`` is the ``hdf5`` metadata of an HDF5 ingest,
    used where its layout is the one written."""
    source = source or {}
    recorded = dict(source.get("layout") or {})
    same = recorded.get("kind", "columns") == layout
    if not same:
        recorded = {}
    key = key_field or recorded.get("key_field") or KEY_FIELDS.get(layout)
    spec = ExportSpec(layout, recorded.get("container", ""), key if layout != "columns" else None, images=images)
    if same:
        _take_source(spec, source, recorded)
    for t in _typed_fields(schema, spec, recorded).values():
        if _complete(schema, t):
            spec.typed.append(t)
        else:  # a subset or changed fields: stored unihub's way, never padded with invented values
            spec.generic.extend(schema[name] for name, _ in t.members)
    return spec


def _take_source(spec: ExportSpec, source: Mapping[str, Any], recorded: Mapping[str, Any]) -> None:
    """Give ``spec`` what the ingest recorded of its source beyond the rows (written in the same layout)."""
    def recorded_mapping(key: str) -> dict[str, Any]:
        return dict(source.get(key) or {})

    spec.constants = recorded_mapping("constants")
    spec.attributes = recorded_mapping("attribute_values")
    spec.empty = recorded_mapping("empty_datasets")
    spec.groups = list(source.get("group_paths") or ())
    spec.units = list(recorded.get("units") or ())
    spec.storage = recorded_mapping("storage")
    spec.member_storage = recorded_mapping("member_storage")
    spec.links = recorded_mapping("links")
    spec.scales = recorded_mapping("dimension_scales")
    spec.named_types = recorded_mapping("named_types")
    spec.creation_order = recorded_mapping("creation_order")
    spec.unit_order = source.get("unit_order")


def _typed_fields(schema: Unischema, spec: ExportSpec,
                  recorded: Mapping[str, Any]) -> dict[tuple[str, str | None], Typed]:
    """The source datasets (and attributes) the fields of ``schema`` came from, by (path, attribute), with
    their fields; a field of no recorded dataset goes to ``spec.generic`` (the key field to neither)."""
    typed: dict[tuple[str, str | None], Typed] = {}
    for f in schema:
        entry = recorded.get("fields", {}).get(f.name)
        if f.name == spec.key_field:
            continue
        if entry is None or (entry.get("attr") is None and entry["dataset"] not in recorded.get("datasets", {})):
            spec.generic.append(f)
            continue
        path, attr = entry.get("dataset", entry.get("object", "")), entry.get("attr")
        dt = dtype_from_json(entry["dtype"] if attr is not None else recorded["datasets"][path])
        typed.setdefault((path, attr), Typed(path, dt, attr, group=bool(entry.get("group")))).members.append(
            (f.name, tuple(entry.get("member", ()))))
    return typed


def _complete(schema: Unischema, typed: Typed) -> bool:
    """Every leaf of the source dtype has its field, of the type an ingest gives."""
    wanted = {member for member, _, _ in leaves_of(typed.dtype)}
    if wanted != {member for _, member in typed.members}:
        return False
    for name, member in typed.members:
        expected = field_for(name, member_dtype(typed.dtype, member), ())
        found = schema[name].numpy_dtype
        if found != expected.numpy_dtype and not (expected.numpy_dtype is np.str_ and found is np.bytes_):
            return False
    return True


def assemble(typed: Typed, columns: Mapping[str, Any], where: str) -> np.ndarray:
    """The source dataset's rows ``(n, *cell)`` from its fields' columns (no None): a compound is
    filled member by member."""
    if typed.dtype.names is None:
        name, _ = typed.members[0]
        return to_h5(columns[name], typed.dtype, f"{where}field {name!r}")
    dims_of = {member: dims for member, _, dims in leaves_of(typed.dtype)}
    leaves = {member: (to_h5(columns[name], member_dtype(typed.dtype, member), f"{where}field {name!r}"),
                       dims_of[member]) for name, member in typed.members}
    shapes = {values.shape[:values.ndim - len(dims)] for values, dims in leaves.values()}
    if len(shapes) > 1:
        raise SchemaError(f"{where}the members of {typed.path!r} have rows of different shapes {sorted(shapes)[:3]}")
    out = np.zeros(shapes.pop(), dtype=typed.dtype)
    for member, (values, _) in leaves.items():
        target = out
        for name in member[:-1]:
            target = target[name]
        target[member[-1]] = values
    return out


# -- unihub's own storage -------------------------------------------------------------------------
@dataclass(frozen=True)
class Storage:
    """How unihub stores a field no source dtype describes (see ``formats/hdf5/format.py``, export)."""

    field: UnischemaField
    kind: str  #: 'fixed', 'str', 'bytes' or 'ragged'
    dtype: np.dtype
    shape: tuple[int, ...]
    image_bytes: bool = False
    decode_images: bool = False

    def datasets(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        """Dataset name -> (dtype, cell shape): the field's and its companions."""
        name = self.field.name
        out = {name: (self.dtype, self.shape)}
        if self.kind == "ragged" and len(self.field.shape) > 1:
            out[name + SHAPE_SUFFIX] = (np.dtype(np.int64), (len(self.field.shape),))
        if self.field.nullable:
            out[name + ISNULL_SUFFIX] = (np.dtype(np.bool_), ())
        return out

    def recorded(self) -> UnischemaField:
        """The field recorded in ``unihub.field`` (decoded images become a tensor field)."""
        return self.field._replace(codec=TensorCodec()) if self.decode_images else self.field


def storage_of(f: UnischemaField, images: str = "bytes") -> Storage:
    """The :class:`Storage` of a field, or a SchemaError when HDF5 cannot hold it."""
    h5py = h5py_module()
    image = isinstance(f.codec, CompressedImageCodec)
    dtype = f.numpy_dtype
    if (image and images == "bytes") or dtype is np.bytes_:
        if f.shape and not image:
            raise SchemaError(f"field {f.name!r}: HDF5 export stores bytes fields of shape () only")
        return Storage(f, "bytes", h5py.vlen_dtype(np.uint8), (), image_bytes=image)
    if dtype is np.str_ or dtype is decimal.Decimal:  # decimals as their exact text
        if not f.is_fixed_shape or (dtype is decimal.Decimal and f.shape):
            raise SchemaError(f"field {f.name!r}: HDF5 export cannot store strings of shape {f.shape}")
        return Storage(f, "str", h5py.string_dtype("utf-8"), fixed_dims(f.shape))
    if isinstance(dtype, type) and issubclass(dtype, np.generic) and dtypes.is_numeric(dtype) \
            and np.dtype(dtype).kind != "c":
        if f.is_fixed_shape:
            return Storage(f, "fixed", np.dtype(dtype), fixed_dims(f.shape), decode_images=image)
        base = np.uint8 if np.dtype(dtype) == np.bool_ else dtype
        return Storage(f, "ragged", h5py.vlen_dtype(np.dtype(base)), (), decode_images=image)
    raise SchemaError(f"field {f.name!r}: HDF5 export cannot store dtype {dtypes.dtype_name(dtype)}")


def storage_rows(storage: Storage, values: Any, n: int, first_row: int = 0) -> dict[str, np.ndarray]:
    """A column's rows in each of its datasets (the field's, ``__shape``, ``__isnull``)."""
    f = storage.field
    if values is None:
        values = [None] * n
    plain = isinstance(values, np.ndarray) and values.dtype != object
    isnull = np.zeros(n, dtype=bool) if plain else np.fromiter((v is None for v in values), dtype=bool, count=n)
    if isnull.any() and not f.nullable:
        raise SchemaError(f"field {f.name!r} is not nullable but row {first_row + int(np.argmax(isnull))} is None")
    if storage.decode_images:
        values = [f.codec.decode(f, v) if isinstance(v, (bytes, bytearray, memoryview)) else v  # type: ignore[union-attr]
                  for v in values]
    out = {f.name: _stored(storage, values, n)}
    if storage.kind == "ragged":
        out[f.name], shapes = out[f.name]
        if f.name + SHAPE_SUFFIX in storage.datasets():
            out[f.name + SHAPE_SUFFIX] = shapes
    if f.nullable:
        out[f.name + ISNULL_SUFFIX] = isnull
    return out


def _stored(storage: Storage, values: Any, n: int) -> Any:
    f = storage.field
    if storage.kind == "fixed":
        if isinstance(values, np.ndarray) and values.dtype != object:
            return values.astype(f.dtype, copy=False).reshape((n, *storage.shape))
        out = np.zeros((n, *storage.shape), dtype=f.dtype)
        for i, v in enumerate(values):
            if v is not None:
                out[i] = v
        return out
    if storage.kind == "str":
        out = np.full((n, *storage.shape), "", dtype=object)
        for i, v in enumerate(values):
            if v is not None:
                out[i] = np.asarray(v, dtype=object) if f.shape else v.decode("utf-8") if isinstance(v, bytes) else str(v)
        return out
    if storage.kind == "bytes":
        encode = f.codec.encode if storage.image_bytes else (lambda _, v: bytes(v))  # type: ignore[union-attr]
        return object_array([np.empty(0, np.uint8) if v is None
                             else np.frombuffer(encode(f, v), dtype=np.uint8) for v in values])
    arrays = [np.zeros((0,) * len(f.shape), f.dtype) if v is None else np.asarray(v, dtype=f.dtype) for v in values]
    metadata = storage.dtype.metadata
    assert metadata is not None, "a ragged field's dtype is h5py's vlen dtype"
    base = metadata["vlen"]
    flat = object_array([a.ravel().astype(base, copy=False) for a in arrays])
    return flat, np.array([a.shape for a in arrays], dtype=np.int64).reshape(n, len(f.shape))


def generic_value(f: UnischemaField, value: Any, images: str = "bytes") -> np.ndarray:
    """One value of a field stored unihub's way in a groups layout: a dataset's whole value (bytes
    and encoded images as uint8 arrays, strings and decimals as UTF-8 strings)."""
    h5py = h5py_module()
    if isinstance(f.codec, CompressedImageCodec):
        if images == "pixels":
            return np.asarray(f.codec.decode(f, value) if isinstance(value, (bytes, bytearray)) else value, np.uint8)
        return np.frombuffer(f.codec.encode(f, value), dtype=np.uint8)
    if f.numpy_dtype is np.bytes_:
        return np.frombuffer(bytes(value), dtype=np.uint8)
    if f.numpy_dtype is np.str_ or f.numpy_dtype is decimal.Decimal:
        return to_h5([value], h5py.string_dtype("utf-8"), f"field {f.name!r}")[0, ...]
    storage_of(f)  # refuses what HDF5 cannot hold
    return np.asarray(value, dtype=f.dtype)


def generic_dtype(f: UnischemaField, images: str = "bytes") -> np.dtype:
    """The dtype of the datasets :func:`generic_value` gives for a field."""
    if isinstance(f.codec, CompressedImageCodec) or f.numpy_dtype is np.bytes_:
        return np.dtype(np.uint8)
    if f.numpy_dtype is np.str_ or f.numpy_dtype is decimal.Decimal:
        return h5py_module().string_dtype("utf-8")
    return np.dtype(f.dtype)


def chunk_rows_for(dtype: np.dtype, shape: tuple[int, ...], chunk_rows: int | None) -> int:
    """Rows per chunk: given, or about 1 MB."""
    row_bytes = (_VLEN_ROW_BYTES if dtype.hasobject else dtype.itemsize) * math.prod(shape)
    return chunk_rows or max(1, min(65536, (1 << 20) // max(1, row_bytes)))



def sample_values(spec: ExportSpec, row: Mapping[str, Any], where: str) -> list[tuple[str, str | None, np.ndarray]]:
    """One row of a groups layout as ``(path, attribute or None, value)``: its datasets first, then
    the attributes on them; a None (an absent member) writes nothing."""
    out = []
    for typed in spec.typed:
        values = [row.get(name) for name, _ in typed.members]
        if all(v is None for v in values):
            continue
        if any(v is None for v in values):
            missing = [name for (name, _), v in zip(typed.members, values) if v is None]
            raise SchemaError(f"{where}: {typed.path!r} needs every member, fields {missing[:5]} are None")
        value = assemble(typed, {name: [row[name]] for name, _ in typed.members}, f"{where}, ")[0, ...]
        out.append((typed.path, typed.attr, value))
    for f in spec.generic:
        if row.get(f.name) is not None:
            out.append((f.name, None, generic_value(f, row[f.name], spec.images)))
    return sorted(out, key=lambda item: item[1] is not None)
