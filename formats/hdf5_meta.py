"""An HDF5 ingest's metadata (``unihub.extra`` -> ``hdf5``) and the schema across several files.

The metadata keeps the attributes of the file, of its groups and of its datasets (as JSON values;
in a groups layout, the attributes inside the sample groups are fields instead), the scalar
datasets as JSON values (``scalars``), and what export and verify need to give the source back
exactly: ``layout`` (kind, container, key field, the dtype of every source dataset and where each
field comes from, the splits), ``constants`` (every dataset that is not rows), ``empty_datasets``
(the datasets of units of 0 rows: an empty split, a file of 0 rows), ``attribute_values`` (every
attribute outside the rows), all bit for bit with their dtypes, ``group_paths`` (every group outside
the rows, so that an empty one is written back too) and ``left_out``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from unihub.errors import FormatError, SchemaError
from unihub.formats.codecs import ScalarCodec
from unihub.formats.hdf5_export import FIELD_ORDER_ATTR, SCHEMA_NAME_ATTR
from unihub.formats.hdf5_layout import Plan
from unihub.formats.hdf5_read import attribute_array
from unihub.formats.hdf5_types import dtype_to_json, encode_constant, h5py_module
from unihub.formats.schema import UnischemaField

#: what :func:`file_metadata` keeps of every file (the first one's, and ``<key>_by_file`` where others differ)
PER_FILE = ("constants", "empty_datasets", "attribute_values", "group_paths")


def file_metadata(handle: Any, plan: Plan, *, per_file: bool = False) -> dict[str, Any]:
    """The ``hdf5`` metadata of one open file; see the module docstring. ``per_file``: only what
    every file has of its own (:data:`PER_FILE`)."""
    constants = {path: encode_dataset(handle[path]) for path in plan.constants}
    empty = {path: encode_dataset(handle[path]) for path in plan.empty_datasets()}
    h5py = h5py_module()
    units = {plan.unit_path(u) for u in plan.units} if plan.kind == "groups" else set()
    dropped = tuple(plan.unit_path(u) for u in plan.dropped)
    groups: dict[str, dict[str, Any]] = {}
    datasets: dict[str, dict[str, Any]] = {}
    exact: dict[str, dict[str, Any]] = {}
    group_paths: list[str] = []
    left_out = {**plan.left_out, **plan.ignored}
    for path, obj in [("", handle), *walk_objects(handle, "", units)]:
        if path and isinstance(obj, h5py.Group) and not in_any(path, dropped):
            group_paths.append(path)
        attrs = _attributes(obj.attrs)
        if attrs and path:
            (datasets if isinstance(obj, h5py.Dataset) else groups)[path] = attrs
        values, failed = exact_attributes(obj.attrs)
        exact.update({path: {name: v[2] for name, v in values.items()}} if values else {})
        left_out.update({f"{path}@{name}": reason for name, reason in failed.items()})
    own = {"constants": constants, "empty_datasets": empty, "attribute_values": exact, "group_paths": group_paths}
    if per_file:
        return own
    scalars = {path: _jsonable(_scalar(handle[path])) for path in plan.constants if not handle[path].shape}
    return {"attributes": _attributes(handle.attrs), "groups": groups, "datasets": datasets, "scalars": scalars,
            "layout": layout_record(plan), **own, "left_out": left_out}


def encode_dataset(dataset: Any) -> dict[str, Any]:
    """A whole dataset exactly (:func:`encode_constant`)."""
    return encode_constant(None if dataset.shape is None else dataset[...], dataset.dtype)


def in_any(path: str, prefixes: tuple[str, ...]) -> bool:
    """True when ``path`` is one of ``prefixes`` or below one."""
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def exact_attributes(attrs: Any) -> tuple[dict[str, tuple[Any, Any, Any]], dict[str, str]]:
    """An object's attributes as h5py reads them, ``{name: (value, dtype, encoded exactly)}`` (dtype and
    bytes, as constants are; unihub's own left out), and the ones that cannot be kept exactly (object
    references, ...) with why. The ingest keeps the encodings; verify compares the values."""
    values, failed = {}, {}
    for name in attrs:
        if name.startswith("unihub."):
            continue
        try:
            attr = attrs.get_id(name)
            value = None if attr.shape is None else attribute_array(attrs, name)
            dtype = attr.dtype if value is None else value.dtype
            values[name] = (value, dtype, encode_constant(value, dtype))
        except (SchemaError, OSError, TypeError, ValueError) as exc:
            failed[name] = f"an attribute that cannot be kept exactly ({exc})"
    return values, failed


def walk_objects(group: Any, prefix: str, skip: set[str]) -> Iterator[tuple[str, Any]]:
    """Every object below ``group`` by path (name order), not descending into ``skip``."""
    h5py = h5py_module()
    for name in sorted(group):
        path = f"{prefix}{name}"
        if path in skip:
            continue
        obj = group[name]
        yield path, obj
        if isinstance(obj, h5py.Group):
            yield from walk_objects(obj, path + "/", skip)


def layout_record(plan: Plan) -> dict[str, Any]:
    """Where each field comes from, and the dtype of each source dataset (not unihub's own exports')."""
    fields: dict[str, Any] = {}
    datasets: dict[str, Any] = {}
    for leaf in plan.leaves.values():
        if leaf.recorded is not None:
            continue
        if leaf.attr is not None:
            fields[leaf.field] = {"object": leaf.path, "attr": leaf.attr, "member": list(leaf.member),
                                  "dtype": dtype_to_json(leaf.dtype), **({"group": True} if leaf.group_owner else {})}
        else:
            fields[leaf.field] = {"dataset": leaf.path, "member": list(leaf.member)}
            datasets[leaf.path] = dtype_to_json(leaf.dtype)
    record = {"kind": plan.kind, "container": plan.container, "key_field": plan.key_field,
              "datasets": datasets, "fields": fields}
    return {**record, "units": list(plan.units)} if plan.kind == "splits" else record


def schema_name(path: str, handle: Any) -> tuple[str, list[str]]:
    """The schema name (recorded by unihub's export, else the file's stem) and a recorded field order."""
    order = json.loads(handle.attrs.get(FIELD_ORDER_ATTR, "[]"))
    name = handle.attrs.get(SCHEMA_NAME_ATTR) or os.path.splitext(os.path.basename(path))[0] or "hdf5"
    return (name.decode() if isinstance(name, bytes) else str(name)), order


def merge_fields(merged: dict[str, UnischemaField], fields: list[UnischemaField], path: str, *,
                 first: bool) -> dict[str, UnischemaField]:
    """The fields so far and one more file's: shapes that differ become ``None`` dims, str that is
    bytes elsewhere becomes bytes, a field some files lack becomes nullable; other differences are
    refused naming the file."""
    new = {f.name: f for f in fields}
    if first:
        return new
    out = {}
    for name in [*merged, *(n for n in new if n not in merged)]:
        a, b = merged.get(name), new.get(name)
        out[name] = (a if a is not None else new[name])._replace(nullable=True) if a is None or b is None \
            else _merge_two(a, b, path)
    return out


def _merge_two(a: UnischemaField, b: UnischemaField, path: str) -> UnischemaField:
    if a == b:
        return a
    nullable = a.nullable or b.nullable
    if {a.numpy_dtype, b.numpy_dtype} == {np.str_, np.bytes_} and a.shape == b.shape:
        return UnischemaField(a.name, np.bytes_, a.shape, None if a.shape else ScalarCodec(np.bytes_), nullable)
    if a.numpy_dtype == b.numpy_dtype and len(a.shape) == len(b.shape) and type(a.codec) is type(b.codec):
        shape = tuple(x if x == y else None for x, y in zip(a.shape, b.shape))
        return UnischemaField(a.name, a.numpy_dtype, shape, a.codec, nullable)
    raise FormatError(f"{path}: field {a.name!r} is {b!r} there but {a!r} in the files before; "
                      "convert the files apart, or choose fields with fields=...", path=path)


def _scalar(dataset: Any) -> Any:
    if dataset.shape is None:  # an empty dataspace
        return None
    value = dataset[()]
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def _attributes(attrs: Any) -> dict[str, Any]:
    out = {}
    for key in attrs:
        if key.startswith("unihub."):
            continue
        try:
            out[key] = _jsonable(attrs[key])
        except (OSError, TypeError) as exc:  # an attribute h5py cannot read
            out[key] = f"<unreadable: {exc}>"
    return out


def _jsonable(value: Any) -> Any:
    """Attribute values as JSON types: numpy scalars and arrays to Python, bytes to text."""
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()] if value.dtype != object else [_jsonable(v) for v in value]
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("utf-8", "backslashreplace")
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
