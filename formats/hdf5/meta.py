"""An HDF5 ingest's metadata (``unihub.extra`` -> ``hdf5``) and the schema across several files.

The metadata keeps the attributes of the file, of its groups and of its datasets (as JSON values;
in a groups layout, the attributes inside the sample groups are fields instead), the scalar
datasets as JSON values (``scalars``), and what export and verify need to give the source back
exactly: ``layout`` (kind, container, key field, the dtype of every source dataset and where each
field comes from, the splits), ``constants`` (every dataset that is not rows), ``empty_datasets``
(the datasets of units of 0 rows: an empty split, a file of 0 rows), ``attribute_values`` (every
attribute outside the rows), all bit for bit with their dtypes, ``group_paths`` (every group outside
the rows, so that an empty one is written back too), ``storage`` and ``member_storage`` (how each
source dataset is stored: layout, chunks, filters, fill value), ``links`` (every other name of an
object: hard and soft links), ``dimension_scales`` (scales, their names, what each dimension has
attached and its label), ``named_types`` (committed datatypes), ``creation_order`` (the names in an
object outside the units that tracks their creation order, h5py's ``track_order``), ``unit_order`` (the
same inside the splits or sample groups, one for all, with the types of a sample's attributes that their
dtypes do not show, and whether their container tracks it) and ``left_out``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np

from unihub.errors import FormatError, SchemaError
from unihub.formats.hdf5.detect import below_any, corrupt_record, object_key, object_paths, recorded_json
from unihub.formats.hdf5.dtypes import dtype_to_json, encode_constant, h5py_module, note_text, type_notes
from unihub.formats.hdf5.export import FIELD_ORDER_ATTR, SCHEMA_NAME_ATTR
from unihub.formats.hdf5.layout import Plan, is_scale_bookkeeping, unit_roots
from unihub.formats.hdf5.read import attribute_array
from unihub.schema.codecs import ScalarCodec
from unihub.schema.unischema import UnischemaField

#: what :func:`file_metadata` keeps of every file (the first one's, and ``<key>_by_file`` where others differ)
PER_FILE = ("constants", "empty_datasets", "attribute_values", "group_paths", "storage", "member_storage", "links",
            "dimension_scales", "named_types", "creation_order", "unit_order")
#: a dimension scale's own attributes (beside :data:`~unihub.formats.hdf5.layout.SCALE_ATTRIBUTES`), kept as the scale itself
_SCALE_OWN = ("CLASS", "NAME")


def file_metadata(handle: Any, plan: Plan, *, per_file: bool = False) -> dict[str, Any]:
    """The ``hdf5`` metadata of one open file; see the module docstring. ``per_file``: only what
    every file has of its own (:data:`PER_FILE`)."""
    constants = {path: encode_dataset(handle[path]) for path in plan.constants}
    empty = {path: encode_dataset(handle[path]) for path in plan.empty_datasets()}
    units = {plan.unit_path(u) for u in plan.units} if plan.kind == "groups" else set()
    dropped = tuple(plan.unit_path(u) for u in plan.dropped)
    walked = [("", handle), *walk_objects(handle, units, unit_roots(plan))]
    found = _object_attributes(walked, dropped)
    storage, member_storage = storage_records(handle, plan)
    own = {"constants": constants, "empty_datasets": empty, "attribute_values": found.exact,
           "group_paths": found.group_paths, "storage": storage, "member_storage": member_storage,
           "links": {p: link for p, link in plan.links.items() if not in_any(p, dropped)},
           "dimension_scales": dimension_scales(handle, [(p, o) for p, o in walked if not in_any(p, dropped)],
                                                unit_roots(plan)),
           "named_types": named_types(walked),
           "creation_order": creation_orders(walked, plan),
           "unit_order": unit_order(handle, plan, refuse=True)[0]}
    if per_file:
        return own
    left_out = {**plan.left_out, **plan.ignored, **found.left_out}
    scalars = {path: _jsonable(_scalar(handle[path])) for path in plan.constants if not handle[path].shape}
    return {"attributes": _attributes(handle.attrs), "groups": found.groups, "datasets": found.datasets,
            "scalars": scalars, "layout": layout_record(plan), **own, "left_out": left_out}


class _ObjectAttributes(NamedTuple):
    """What :func:`file_metadata` keeps of the attributes and groups of a file's objects."""

    groups: dict[str, dict[str, Any]]  #: a group's path -> its attributes as JSON values
    datasets: dict[str, dict[str, Any]]  #: a dataset's path -> its attributes as JSON values
    exact: dict[str, dict[str, Any]]  #: an object's path -> its attributes encoded exactly
    group_paths: list[str]  #: every group but the root, none in or below a dropped unit
    left_out: dict[str, str]  #: ``path@name`` -> why that attribute cannot be kept exactly


def _object_attributes(walked: list[tuple[str, Any]], dropped: tuple[str, ...]) -> _ObjectAttributes:
    """The attributes of the ``walked`` objects (the root first, at path ``''``) and the groups outside ``dropped``."""
    h5py = h5py_module()
    found = _ObjectAttributes({}, {}, {}, [], {})
    for path, obj in walked:
        if path and isinstance(obj, h5py.Group) and not in_any(path, dropped):
            found.group_paths.append(path)
        attrs = _attributes(obj.attrs)
        if attrs and path:
            (found.datasets if isinstance(obj, h5py.Dataset) else found.groups)[path] = attrs
        values, failed = exact_attributes(obj)
        found.exact.update({path: {name: v[2] for name, v in values.items()}} if values else {})
        found.left_out.update({f"{path}@{name}": reason for name, reason in failed.items()})
    return found


def encode_dataset(dataset: Any) -> dict[str, Any]:
    """A whole dataset exactly (:func:`encode_constant`)."""
    return encode_constant(None if dataset.shape is None else dataset[...], dataset.dtype)


def in_any(path: str, prefixes: tuple[str, ...]) -> bool:
    """True when ``path`` is one of ``prefixes`` or below one."""
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def exact_attributes(owner: Any) -> tuple[dict[str, tuple[Any, Any, Any]], dict[str, str]]:
    """An object's attributes as h5py reads them, ``{name: (value, dtype, encoded exactly)}`` (dtype and
    bytes, as constants are; unihub's own left out, and the dimension-scale API's, kept as scales: see
    :func:`dimension_scales`), and the ones that cannot be kept exactly with why (object references
    are refused before: ``hdf5_layout.unkept_attributes``). The ingest keeps the encodings (with a fixed
    string's padding where it is not h5py's, ``strpad``, and a bitfield: :func:`type_notes`); verify compares the values."""
    attrs = owner.attrs
    scale = is_scale(owner)
    values, failed = {}, {}
    for name in attrs:
        if name.startswith("unihub.") or is_scale_bookkeeping(owner, name) or (scale and name in _SCALE_OWN):
            continue
        try:
            attr = attrs.get_id(name)
            value = None if attr.shape is None else attribute_array(attrs, name)
            dtype = attr.dtype if value is None else value.dtype
            record = {**encode_constant(value, dtype), **type_notes(attr.get_type())}
            values[name] = (value, dtype, record)
        except (SchemaError, OSError, TypeError, ValueError) as exc:
            failed[name] = f"an attribute that cannot be kept exactly ({exc})"
    return values, failed


def creation_orders(walked: Iterable[tuple[str, Any]], plan: Plan) -> dict[str, dict[str, list[str]]]:
    """The ``walked`` objects that track the creation order of their links or attributes (h5py's
    ``track_order``), by path: ``{"links": names, "attributes": names}`` in that order (h5py lists them so),
    where tracked; none left out by the ingest, unihub's own, nor the dimension-scale API's (made again by
    it), nor unihub's own datasets (an export's fields stored its way, and their companions); not of the
    container of splits or sample groups (:func:`unit_order`: its order is the rows'). Why: an untracked
    object lists its names in name order, so an export that does not track them gives ``z, a, m`` back as
    ``a, m, z``."""
    h5py = h5py_module()
    skipped = {*plan.refused, *plan.ignored, *plan.left_out}
    skipped |= {"/".join(p for p in (plan.unit_path(u), rel) if p) for u in plan.units for rel in own_datasets(plan)}
    dropped = tuple(plan.unit_path(u) for u in plan.dropped)
    out: dict[str, dict[str, list[str]]] = {}
    for path, obj in walked:
        if isinstance(obj, h5py.Datatype) or in_any(path, dropped) or (plan.kind != "columns" and path == plan.container):
            continue
        entry = _tracked_names(h5py, obj["/"] if isinstance(obj, h5py.File) else obj, path,
                               lambda full: full in skipped or in_any(full, dropped))
        if entry:
            out[path] = {what: [n for n in names if f"{path}@{n}" not in skipped] if what == "attributes" else names
                         for what, names in entry.items()}
    return out


def own_datasets(plan: Plan) -> set[str]:
    """The paths in a unit of unihub's own datasets (fields an export stored its way, and their companions)."""
    own = {leaf.path for leaf in plan.leaves.values() if leaf.recorded is not None}
    return own | {c for leaf in plan.leaves.values() if leaf.recorded is not None for c in plan.companions.get(leaf.field, ())}


def unit_order(handle: Any, plan: Plan, *, refuse: bool = False) -> tuple[dict[str, Any], str | None]:
    """Whether the container of splits or sample groups tracks creation order, and what
    :func:`creation_orders` is inside the sample groups (none for columns; a split's own is there), one for all
    samples: ``({"container_tracked": bool, "members": {rel: entry}}, None)``, ``rel`` an object's path in
    its unit ('' the unit itself), ``entry`` its ``links`` and ``attributes`` in creation order where it
    tracks them (the source's own: not unihub's datasets), merged over the units (a sample lacking a
    member fits the others' order), and in a groups layout its attributes' :func:`type_notes` by name
    (``notes``: the padding of a fixed string, a bitfield), which sample attributes' fields do not show.
    Where units disagree (one tracks, another not; ``z, a`` in one, ``a, z`` in another; other paddings),
    the second item says so, naming two of them, and ``refuse`` raises it as a FormatError: one order is
    all an export writes. Why: an untracked group lists its names by name, and h5py writes its own
    padding and an integer for a bitfield, which the values alone do not show."""
    if plan.kind == "columns":
        return {}, None
    h5py = h5py_module()
    own = {*plan.refused, *plan.ignored, *plan.left_out}  # a groups export records every field: none is its own
    rels, noted = _sample_objects(plan)
    members: dict[str, Any] = {}
    first: dict[str, str] = {}
    base = handle[plan.container] if plan.container else handle["/"]
    tracked = h5py.h5p.CRT_ORDER_TRACKED
    for unit in plan.units if plan.kind == "groups" else ():
        unit_id = h5py.h5o.open(base.id, unit.encode("utf-8"))  # HDF5's own calls: thousands of samples
        for rel in sorted(r for r in rels if not r or r.encode("utf-8") in unit_id):
            object_id = h5py.h5o.open(unit_id, rel.encode("utf-8")) if rel else unit_id
            plist = object_id.get_create_plist()
            found: dict[str, Any] = {}
            if plist.get_attr_creation_order() & tracked or (
                    isinstance(object_id, h5py.h5g.GroupID) and plist.get_link_creation_order() & tracked):
                found = _tracked_names(h5py, base[unit][rel] if rel else base[unit], rel, lambda full: full in own)
            if noted.get(rel):
                found["notes"] = {a: note_text(type_notes(h5py.h5a.open(object_id, a.encode("utf-8")).get_type()))
                                  for a in sorted(noted[rel]) if h5py.h5a.exists(object_id, a.encode("utf-8"))}
            conflict = _merge_unit(members, first, rel, found, unit)
            if conflict is not None:
                where = f"{plan.path}: the sample groups"
                if refuse:
                    raise FormatError(f"{where} differ: {conflict}; an export writes one for all, so unihub "
                                      "cannot give this file back as it is", path=plan.path)
                return {}, conflict
    container = bool(base.id.get_create_plist().get_link_creation_order() & tracked)
    return {"container_tracked": container, "members": members}, None


def _sample_objects(plan: Plan) -> tuple[set[str], dict[str, set[str]]]:
    """The objects of a sample group whose names or attributes :func:`unit_order` reads (``''`` itself,
    the groups on the way to its fields' datasets, and the objects that have attributes that are fields),
    by their paths in it, and those attributes by owner. A dataset's tracking of its attributes' order is
    in its storage record, so the datasets with no such attribute go unopened."""
    rels = {""}
    noted: dict[str, set[str]] = {}
    for leaf in plan.leaves.values():
        parts = leaf.path.split("/") if leaf.path else []
        rels.update("/".join(parts[:i]) for i in range(1, len(parts)))
        if leaf.attr is not None:
            rels.add(leaf.path)
            noted.setdefault(leaf.path, set()).add(leaf.attr)
    return rels, noted


def _tracked_names(h5py: Any, obj: Any, path: str, unkept: Callable[[str], bool]) -> dict[str, Any]:
    """An object's names in creation order where it tracks them (h5py lists them so): ``links`` (a
    group's, none whose path, ``path/name``, is ``unkept``) and ``attributes`` (:func:`exact_attributes`)."""
    plist = obj.id.get_create_plist()
    found: dict[str, Any] = {}
    if isinstance(obj, h5py.Group) and plist.get_link_creation_order() & h5py.h5p.CRT_ORDER_TRACKED:
        found["links"] = [n for n in obj if not unkept("/".join(p for p in (path, n) if p))]
    if plist.get_attr_creation_order() & h5py.h5p.CRT_ORDER_TRACKED:
        found["attributes"] = list(exact_attributes(obj)[0])
    return found


def _merge_unit(members: dict[str, Any], first: dict[str, str], rel: str, found: dict[str, Any],
                unit: str) -> str | None:
    """Merge one unit's ``found`` for ``rel`` into ``members``; why it cannot be merged, naming two units."""
    known = members.get(rel)
    if known is None:
        members[rel], first[rel] = found, unit
        return None
    where = f"{rel!r} in {first[rel]!r} and in {unit!r}" if rel else f"{first[rel]!r} and {unit!r}"
    for key in ("links", "attributes"):
        if (key in known) != (key in found):
            return f"{where}: one tracks the creation order of its {key}, the other does not"
        if key in known:
            merged = _merged_order(known[key], found[key])
            if merged is None:
                return f"{where}: {key} created in the order {known[key]} and {found[key]}"
            known[key] = merged
    notes = known.setdefault("notes", {}) if "notes" in found else {}
    for name, note in (found.get("notes") or {}).items():
        if notes.setdefault(name, note) != note:
            return f"{where}: attribute {name!r} of types {notes[name]} and {note}"
    return None


def _merged_order(known: list[str], names: list[str]) -> list[str] | None:
    """``known`` with the names of ``names`` it lacks, each after the name before it in ``names``; None
    where the two disagree on the order of the names they share."""
    place = {n: i for i, n in enumerate(known)}
    shared = [place[n] for n in names if n in place]
    if shared != sorted(shared):
        return None
    out = list(known)
    for i, name in enumerate(names):
        if name not in place:
            out.insert(out.index(names[i - 1]) + 1 if i else 0, name)
            place[name] = -1
    return out


def walk_objects(handle: Any, skip: set[str], units: set[str]) -> Iterator[tuple[str, Any]]:
    """Every object of the file but the root, by its first name (:func:`object_paths` of ``units``:
    another name of it is a link), in name order, none in or below ``skip``."""
    for path in sorted(set(object_paths(handle, units).values()) - {""}):
        if not below_any(path, skip):
            yield path, handle[path]


def named_types(objects: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """The named (committed) datatypes among ``objects``, by path: their dtypes as JSON
    (:func:`dtype_to_json`), which an export commits again."""
    h5py = h5py_module()
    return {path: dtype_to_json(obj.dtype) for path, obj in objects if isinstance(obj, h5py.Datatype)}


def is_scale(obj: Any) -> bool:
    """True for a dataset made a dimension scale (``make_scale``)."""
    h5py = h5py_module()
    return isinstance(obj, h5py.Dataset) and bool(h5py.h5ds.is_scale(obj.id))


def dimension_scales(handle: Any, objects: Iterable[tuple[str, Any]], units: set[str]) -> dict[str, Any]:
    """The dimension scales among ``objects`` (``{"scales": {path: name}}``) and every dataset's dimensions
    that have a label or scales attached (``{"dims": {path: [[label, [scale paths in order]], ...]}}``),
    by the objects' first names (:func:`object_paths` of ``units``), as h5py's ``dims`` API reads them."""
    h5py = h5py_module()
    paths = object_paths(handle, units)
    scales: dict[str, str] = {}
    dims: dict[str, list[Any]] = {}
    for path, obj in objects:
        if not isinstance(obj, h5py.Dataset):
            continue
        if is_scale(obj):
            name = h5py.h5ds.get_scale_name(obj.id)
            scales[path] = (name or b"").decode("utf-8", "surrogateescape")
        if not obj.shape or not ({"DIMENSION_LIST", "DIMENSION_LABELS"} & set(obj.attrs)):
            continue
        found = [[dim.label, _attached(dim, paths)] for dim in obj.dims]
        if any(label or attached for label, attached in found):
            dims[path] = found
    return {"scales": scales, "dims": dims} if scales or dims else {}


def _attached(dim: Any, paths: dict[int, str]) -> list[str]:
    """The first names of the scales attached to a dimension, in order (one that cannot be opened, as a
    file whose scale was deleted holds, is named so: it never matches a scale)."""
    try:
        return [paths.get(object_key(scale), f"<outside the file: {scale.name}>") for scale in dim.values()]
    except (RuntimeError, KeyError, OSError, ValueError) as exc:
        return [f"<a scale h5py cannot open: {exc}>"]


# -- how each dataset is stored: layout, chunks, filters, fill value --------------------------------
_LAYOUTS = {0: "compact", 1: "contiguous", 2: "chunked", 3: "virtual"}
#: filter id -> how many of its parameters are the ones given; HDF5 derives the others when a dataset is
#: created, from its chunk and dtype (scale-offset, SZIP, h5py's LZF: the chunk's size in bytes)
GIVEN_PARAMETERS = {6: 2, 4: 2, 32000: 2}


def storage_record(dataset: Any) -> dict[str, Any]:
    """How ``dataset`` is stored, from its creation property list, so that an export creates it alike
    (``hdf5_export.create_stored``): layout, chunk shape and maximum shape (``"="`` where they are the
    dataset's own dim, so that samples of other shapes share a record; None: unlimited), the filter
    pipeline as HDF5 runs it (``[id, flags, [parameters given]]``, :data:`GIVEN_PARAMETERS`: gzip,
    lzf, shuffle, fletcher32, scale-offset ... with their options), the fill value when one was
    set (exactly: :func:`encode_constant`), when it is written, when space is allocated, whether
    times are tracked, a fixed string's padding where it is not h5py's and a bitfield (:func:`type_notes`), and
    whether the creation order of its attributes is tracked (``track_order``, where it is)."""
    h5py = h5py_module()
    dcpl = dataset.id.get_create_plist()
    layout = dcpl.get_layout()
    shape = dataset.shape or ()
    maxshape = dataset.maxshape or ()
    record: dict[str, Any] = {
        "layout": _LAYOUTS.get(layout, str(layout)),
        "chunks": [("=" if c == d else c) for c, d in zip(dcpl.get_chunk(), shape)] if layout == h5py.h5d.CHUNKED
        else None,
        "maxshape": ["=" if m == d else m for m, d in zip(maxshape, shape)],
        "filters": [[int(code), int(flags), [int(v) for v in values[:GIVEN_PARAMETERS.get(code)]]]
                    for code, flags, values, _ in (dcpl.get_filter(i) for i in range(dcpl.get_nfilters()))],
        "fill_time": int(dcpl.get_fill_time()),
        "alloc_time": int(dcpl.get_alloc_time()),
        "track_times": bool(dcpl.get_obj_track_times()),
    }
    if dcpl.fill_value_defined() == h5py.h5d.FILL_VALUE_USER_DEFINED:
        value = np.zeros((1,), dtype=dataset.dtype)
        dcpl.get_fill_value(value)
        record["fillvalue"] = encode_constant(value.reshape(()), dataset.dtype)
    record.update(type_notes(dataset.id.get_type()))
    if dcpl.get_attr_creation_order() & h5py.h5p.CRT_ORDER_TRACKED:
        record["track_order"] = True
    return record


def storage_records(handle: Any, plan: Plan) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(storage, member_storage)``: the :func:`storage_record` of every source dataset an export
    writes back, by path (the rows' datasets, not unihub's own; the constants; those of units of 0
    rows), and in a groups layout each member's in the first group holding it (by its path in the
    group), the groups where it differs by their own path in ``storage``."""
    storage: dict[str, Any] = {}
    members: dict[str, Any] = {}
    paths = [*plan.constants, *plan.empty_datasets()]
    rows = sorted({leaf.path for leaf in plan.leaves.values() if leaf.attr is None and leaf.recorded is None})
    for unit in plan.units:
        group = handle[plan.unit_path(unit)] if plan.unit_path(unit) else handle
        for rel in rows:
            if rel not in group:
                continue
            path = "/".join(p for p in (plan.unit_path(unit), rel) if p)
            if plan.kind != "groups":
                paths.append(path)
                continue
            record = storage_record(group[rel])
            if members.setdefault(rel, record) != record:
                storage[path] = record
    storage.update({path: storage_record(handle[path]) for path in paths})
    return storage, members


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
    order = recorded_json(handle, FIELD_ORDER_ATTR) or []
    if not (isinstance(order, list) and all(isinstance(name, str) for name in order)):
        raise corrupt_record(handle, FIELD_ORDER_ATTR, f"a JSON {type(order).__name__}, not a list of field names")
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
        item = value.item()  # a long double's item() is itself
        return str(item) if isinstance(item, np.generic) else _jsonable(item)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
