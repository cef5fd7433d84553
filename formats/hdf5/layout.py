"""Where each field's values live in an HDF5 file (the layouts are described in ``formats/hdf5/format.py``).

:func:`discover` reads only the file's structure (names, dtypes, shapes, attributes), never its
data, and returns a :class:`Plan`: the layout (``hdf5_detect.py``), its *units* (the file itself,
one group per split, or one group per sample), the :class:`Leaf` each field is read from, the
datasets that are not rows (*constants*, kept in the metadata) and what is refused, and why. The
reading options then select from it (``hdf5_select.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from unihub.errors import FormatError, SchemaError
from unihub.formats.hdf5.detect import (
    below_any,
    corrupt_record,
    datasets_below,
    detect_layout,
    members_below,
    object_paths,
    recorded_json,
    recorded_layout,
    visit_links,
)
from unihub.formats.hdf5.dtypes import Member, dtype_to_json, h5py_module, kind, leaves_of, member_dtype, refusal
from unihub.schema.unischema import Unischema, UnischemaField

#: datasets that are not rows are kept exactly in the metadata up to this many bytes in all
CONSTANT_BYTES = 1 << 20
KEY_FIELDS = {"groups": "group", "splits": "split"}
FIELD_ATTR = "unihub.field"
SCHEMA_ATTR = "unihub.schema"
SHAPE_SUFFIX = "__shape"
ISNULL_SUFFIX = "__isnull"
Shape = tuple[int | None, ...]


@dataclass
class Leaf:
    """Where one field's values live inside a unit: a dataset, a member of a compound one, or an attribute."""

    field: str
    path: str  #: dataset path relative to the unit; for an attribute, its object's ('' = the unit itself)
    dtype: np.dtype  #: the dataset's dtype (a whole compound), or the attribute's
    member: Member = ()
    attr: str | None = None
    cell: Shape = ()  #: one row's shape (None: varies), array-member dims included
    nullable: bool = False  #: absent from some units
    recorded: UnischemaField | None = None  #: the field a unihub export recorded for this dataset
    group_owner: bool = False  #: an attribute of a group inside each sample group (not of a dataset)

    @property
    def value_dtype(self) -> np.dtype:
        """The leaf's own dtype (a compound member's, an array's base)."""
        return member_dtype(self.dtype, self.member)


@dataclass
class Plan:
    """How one file maps to rows; see the module docstring."""

    path: str
    kind: str  #: 'columns', 'groups' or 'splits'
    container: str = ""  #: the group holding the units ('' = the root)
    units: list[str] = field(default_factory=lambda: [""])
    key_field: str | None = None
    leaves: dict[str, Leaf] = field(default_factory=dict)
    #: columns and splits: (unit, dataset path) -> rows
    lengths: dict[tuple[str, str], int] = field(default_factory=dict)
    #: recorded field -> its companion datasets (``x__shape``, ``x__isnull``) in unihub's own exports
    companions: dict[str, list[str]] = field(default_factory=dict)
    constants: list[str] = field(default_factory=list)  #: absolute paths of datasets that are not rows
    refused: dict[str, str] = field(default_factory=dict)  #: leaf -> why it cannot be ingested
    #: leaf -> why: left out by ``ignore_unsupported`` / ``ignore_mismatched`` (listed as skipped)
    ignored: dict[str, str] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)  #: leaf -> not selected by ``fields=``
    dropped: list[str] = field(default_factory=list)  #: splits not selected by ``split=``
    #: every other name of an object (:func:`find_links`): path -> ``{"hard": path}`` or ``{"soft": ..., "object": ...}``
    links: dict[str, dict[str, str]] = field(default_factory=dict)

    def unit_path(self, unit: str) -> str:
        return "/".join(p for p in (self.container, unit) if p)

    def rows(self, unit: str) -> int:
        """Rows of a columns or splits unit (of its selected datasets; 0 when it has none)."""
        paths = {leaf.path for leaf in self.leaves.values()}
        return next((n for (u, p), n in self.lengths.items() if u == unit and p in paths), 0)

    def empty_datasets(self) -> list[str]:
        """Absolute paths of the source's datasets in the units of 0 rows (columns and splits): no
        row holds their dtype and shape, so the metadata keeps them (and export writes them back)."""
        if self.kind == "groups":
            return []
        paths = sorted({leaf.path for leaf in self.leaves.values() if leaf.attr is None and leaf.recorded is None})
        return ["/".join(p for p in (self.unit_path(unit), rel) if p) for unit in self.units if not self.rows(unit)
                for rel in paths if (unit, rel) in self.lengths]


def some(names: Iterable[Any], limit: int = 5) -> str:
    """``'a', 'b', 'c' and 12 more``: a bounded list for messages."""
    items = list(names)
    text = ", ".join(repr(n) for n in items[:limit])
    return text + (f" and {len(items) - limit} more" if len(items) > limit else "")


def discover(path: str, handle: Any, options: Mapping[str, Any]) -> Plan:
    """The file's structure as a :class:`Plan` (options ``layout`` and ``key_field``): every leaf,
    constant and refusal, before the options that select (``hdf5_select.select``)."""
    kind, container, units = detect_layout(path, handle, options.get("layout") or "auto")
    recorded = recorded_layout(handle) or {}  # a unihub export's key field, as it was written
    key = options.get("key_field") or (recorded.get("key_field") if recorded.get("kind") == kind else None) \
        or KEY_FIELDS.get(kind)
    if kind == "columns":
        plan = _plan_columns(path, handle)
    else:
        plan = _plan_units(path, handle, kind, container, units, key)
    roots = unit_roots(plan)
    links, refused = find_links(handle, roots)
    for path, link in links.items():  # a unit's members are read by h5py's visit of it: a link there would be read twice
        if below_any(path, roots):
            refused[path] = (f"a link inside {plan.kind} unit /{path.rsplit('/', 1)[0]} "
                             f"({'hard link to' if 'hard' in link else 'soft link to'} /{link.get('hard') or link['soft']}); "
                             "links are kept only outside the units")
        else:
            plan.links[path] = link
    plan.refused.update(refused)
    plan.refused.update(unkept_attributes(handle, roots if plan.kind == "groups" else [], roots))
    plan.refused.update(_unkept_types(handle, roots))
    _keep_constants(plan, handle)
    return plan


#: attributes the HDF5 dimension-scale API writes: kept as scales and attachments, not as attributes
SCALE_ATTRIBUTES = ("REFERENCE_LIST", "DIMENSION_LIST", "DIMENSION_LABELS")


def is_scale_bookkeeping(owner: Any, name: str) -> bool:
    """Whether attribute ``name`` of ``owner`` is the dimension-scale API's own: one of its names on a
    dataset with dimensions (where :func:`~unihub.formats.hdf5.meta.dimension_scales` reads them back).
    The same name on a group or a scalar dataset is a user's attribute, kept or refused like any other."""
    return name in SCALE_ATTRIBUTES and bool(getattr(owner, "shape", None))


def unit_roots(plan: Plan) -> set[str]:
    """The paths of a plan's splits or sample groups, selected or not (none for columns)."""
    return set() if plan.kind == "columns" else {plan.unit_path(u) for u in (*plan.units, *plan.dropped)}


def find_links(handle: Any, units: set[str]) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Every name that is not an object's first (:func:`object_paths` of ``units``): ``(links, refused)``. A hard
    link is recorded as ``{"hard": first name}``, a soft link to an object of the file as ``{"soft":
    its target as written, "object": the object's first name}``; a link into another file, a dangling
    one and a user-defined one are refused by path (a conversion of this file alone would lose them)."""
    h5py = h5py_module()
    h5l = h5py.h5l
    links_found = visit_links(handle)
    paths = object_paths(handle, units, links_found)
    own_file = h5py.h5o.get_info(handle.id).fileno
    links: dict[str, dict[str, str]] = {}
    refused: dict[str, str] = {}
    for path, kind_, address in links_found:
        if kind_ == h5l.TYPE_HARD:
            if paths[address] != path:
                links[path] = {"hard": paths[address]}
            continue
        link = handle.get(path, getlink=True)
        if kind_ == h5l.TYPE_EXTERNAL:
            refused[path] = (f"an external link to {link.filename}:{link.path}, whose data is in another file; "
                             "convert that file too")
        elif kind_ != h5l.TYPE_SOFT:
            refused[path] = "a user-defined link, which h5py cannot follow"
        else:
            target = handle.get(path)
            info = None if target is None else h5py.h5o.get_info(target.id)
            if info is None or info.fileno != own_file:
                where = "does not exist (a dangling link)" if target is None else "is outside the file"
                refused[path] = f"a soft link to {link.path}, which {where}"
            else:
                links[path] = {"soft": link.path, "object": paths[info.addr]}
    return links, refused


def _unkept_types(handle: Any, units: set[str]) -> dict[str, str]:
    """Named (committed) datatypes outside ``units`` (whose every member is a field) whose dtype has no
    exact record (references, ...), by path."""
    h5py = h5py_module()
    refused = {}
    for path in sorted(set(object_paths(handle, units).values()) - {""}):
        if not below_any(path, units) and handle.get(path, getclass=True) is h5py.Datatype:
            try:
                dtype_to_json(handle[path].dtype)
            except SchemaError as exc:
                refused[path] = f"a named datatype that cannot be kept ({exc})"
    return refused


def unkept_attributes(handle: Any, skip: Iterable[str], units: set[str]) -> dict[str, str]:
    """Attributes (outside ``skip``, the units whose attributes are fields; objects by their first names
    among ``units``) that no exact record holds, by ``path@name``, with why: object or region references
    point into this file's structure, and variable-length values that are not strings (of numbers, or
    inside a compound) have no exact JSON form (:func:`~unihub.formats.hdf5.dtypes.encode_constant`).
    The dimension-scale API's own are kept as scales instead."""
    h5py = h5py_module()
    paths = object_paths(handle, units)
    roots = set(skip)
    refused = {}
    for path in sorted(set(paths.values())):
        if below_any(path, roots):
            continue
        obj = handle[path] if path else handle
        for name in obj.attrs:
            if is_scale_bookkeeping(obj, name) or name.startswith("unihub."):
                continue
            dt = obj.attrs.get_id(name).dtype
            if any(h5py.check_ref_dtype(leaf) is not None for _, leaf, _ in leaves_of(dt)):
                refused[f"{path}@{name}"] = (f"attribute {name!r} of /{path} holds object or region references "
                                             f"(h5py.ref_dtype), which point into the file and cannot be kept")
            elif dt.hasobject and kind(dt) != "string":
                refused[f"{path}@{name}"] = (f"attribute {name!r} of /{path} has dtype {dt}: variable-length "
                                             "values that are not strings cannot be kept exactly")
    return refused


# -- columns ------------------------------------------------------------------------------------
def _plan_columns(path: str, handle: Any) -> Plan:
    """Every dataset whose first axis is the row count; scalars are constants."""
    plan = Plan(path, "columns")
    found = datasets_below(handle)
    recorded = _recorded_fields(found)
    companions = {name + suffix for name in recorded for suffix in (SHAPE_SUFFIX, ISNULL_SUFFIX)}
    for name, dataset in found.items():
        if name in companions:
            plan.companions.setdefault(name.rsplit("__", 1)[0], []).append(name)
        elif not dataset.shape:
            plan.constants.append(name)
        else:
            plan.lengths["", name] = dataset.shape[0]
            _add_dataset(plan, name, dataset.dtype, dataset.shape[1:], recorded.get(name))
    return plan


def _recorded_fields(datasets: Mapping[str, Any]) -> dict[str, UnischemaField]:
    """The Unischema fields unihub's exports record on their datasets (attribute ``unihub.field``)."""
    out = {}
    for name, dataset in datasets.items():
        data = recorded_json(dataset, FIELD_ATTR)
        if data is not None:
            try:
                out[name] = UnischemaField.from_json({**data, "name": name})
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:  # SchemaError too
                raise corrupt_record(dataset, FIELD_ATTR, exc) from None
    return out


def _add_dataset(plan: Plan, rel: str, dt: np.dtype, cell: Shape, recorded: UnischemaField | None,
                 nullable: bool = False) -> None:
    """The leaves of one dataset (one per compound member), or why they are refused."""
    if recorded is not None:
        _add_leaf(plan, Leaf(rel, rel, dt, cell=tuple(cell), nullable=nullable, recorded=recorded))
        return
    for member, leaf_dtype, dims in leaves_of(dt):
        name = rel + "".join("." + m for m in member)
        reason = refusal(leaf_dtype, len(cell) + len(dims))
        if reason is not None:
            plan.refused[name] = reason
        else:
            _add_leaf(plan, Leaf(name, rel, dt, member, cell=(*cell, *dims), nullable=nullable))


def _add_leaf(plan: Plan, leaf: Leaf) -> None:
    if leaf.field in plan.leaves or leaf.field == plan.key_field:
        what = "the key field (choose another with key_field=...)" if leaf.field == plan.key_field else "another"
        raise FormatError(f"{plan.path}: {leaf.field!r} names both a value in {leaf.path or '/'!r} and {what}",
                          path=plan.path)
    plan.leaves[leaf.field] = leaf


# -- groups and splits ----------------------------------------------------------------------------
@dataclass
class _Seen:
    """One member (dataset or attribute) across the units: its dtype, merged shape and where it is."""

    dtype: np.dtype
    shape: Shape
    first: str
    units: int = 1
    conflict: str | None = None
    group: bool = False  #: an attribute of a group inside the units


def _plan_units(path: str, handle: Any, kind: str, container: str, units: list[str], key: str | None) -> Plan:
    """Groups (one row per unit, each member whole) or splits (rows along each member's first axis)."""
    plan = Plan(path, kind, container, units, key)
    base = handle[container] if container else handle
    seen: dict[tuple[str, ...], _Seen] = {}
    recorded: dict[str, UnischemaField] = {}
    for unit in units:
        found, inner = members_below(base[unit]) if kind == "groups" else (datasets_below(base[unit]), {})
        recorded.update(_recorded_fields(found))
        if kind == "groups":
            _note_attributes(seen, unit, "", base[unit].attrs)
            for rel, group in inner.items():  # a group inside a sample: its attributes are fields too
                _note_attributes(seen, unit, rel, group.attrs, group=True)
        for rel, dataset in found.items():
            if kind == "groups":
                _note(seen, ("d", rel), unit, dataset.dtype, dataset.shape)
                _note_attributes(seen, unit, rel, dataset.attrs)
            elif rel.rsplit("__", 1)[0] in recorded and rel.endswith((SHAPE_SUFFIX, ISNULL_SUFFIX)):
                companions = plan.companions.setdefault(rel.rsplit("__", 1)[0], [])
                companions.extend([rel] if rel not in companions else [])
            elif not dataset.shape:
                plan.constants.append(f"{plan.unit_path(unit)}/{rel}")
            else:
                plan.lengths[unit, rel] = dataset.shape[0]
                _note(seen, ("d", rel), unit, dataset.dtype, dataset.shape[1:])
    recorded.update(_recorded_schema(handle))
    for key_, entry in sorted(seen.items(), key=lambda item: (item[0][0] == "a", item[0][1:])):  # datasets first
        _add_seen(plan, key_, entry, entry.units < len(units), recorded)
    return plan


def _note(seen: dict[tuple[str, ...], _Seen], key: tuple[str, ...], unit: str, dt: np.dtype,
          shape: tuple[int, ...] | None) -> None:
    entry = seen.get(key)
    if entry is None:
        seen[key] = _Seen(dt, tuple(shape) if shape is not None else (), unit,
                          conflict=f"an empty dataspace in {unit!r}" if shape is None else None)
        return
    entry.units += 1
    if entry.conflict is not None:
        return
    if shape is None:
        entry.conflict = f"an empty dataspace in {unit!r}"
    elif not _same_dtype(dt, entry.dtype):
        entry.conflict = f"dtype {_dtype_text(entry.dtype)} in {entry.first!r} but {_dtype_text(dt)} in {unit!r}"
    elif len(shape) != len(entry.shape):
        entry.conflict = f"{len(entry.shape)} dimensions in {entry.first!r} but {len(shape)} in {unit!r}"
    else:
        entry.shape = tuple(a if a == b else None for a, b in zip(entry.shape, shape))


def _note_attributes(seen: dict[tuple[str, ...], _Seen], unit: str, rel: str, attrs: Any,
                     group: bool = False) -> None:
    for name in attrs:
        if not name.startswith("unihub."):
            attr = attrs.get_id(name)
            _note(seen, ("a", rel, name), unit, attr.dtype, attr.shape)
            seen["a", rel, name].group |= group


def _same_dtype(a: np.dtype, b: np.dtype) -> bool:
    """The same HDF5 type (numpy's ``==`` ignores h5py's metadata: enum mappings, string encodings)."""
    if a.names is None and a.metadata is None and b.metadata is None:
        return a == b and a.str == b.str
    return _dtype_key(a) == _dtype_key(b)


def _dtype_key(dt: np.dtype) -> str:
    try:
        return json.dumps(dtype_to_json(dt))
    except SchemaError:
        return str(dt)


def _dtype_text(dt: np.dtype) -> str:
    key = _dtype_key(dt)
    return key if len(key) <= 60 else key[:57] + "..."


def _add_seen(plan: Plan, key: tuple[str, ...], entry: _Seen, nullable: bool,
              recorded: Mapping[str, UnischemaField]) -> None:
    rel = key[1]
    name = rel if key[0] == "d" else f"{rel}@{key[2]}"
    if entry.conflict is not None:
        plan.refused[name] = f"{entry.conflict} (one field needs one dtype and rank)"
        return
    if key[0] == "d":
        _add_dataset(plan, rel, entry.dtype, entry.shape, recorded.get(rel), nullable)
        return
    for member, leaf_dtype, dims in leaves_of(entry.dtype):
        leaf_name = name + "".join("." + m for m in member)
        reason = refusal(leaf_dtype, len(entry.shape) + len(dims))
        if reason is not None:
            plan.refused[leaf_name] = reason
        else:
            _add_leaf(plan, Leaf(leaf_name, rel, entry.dtype, member, key[2], (*entry.shape, *dims), nullable,
                                 group_owner=entry.group))


def _recorded_schema(handle: Any) -> dict[str, UnischemaField]:
    """The fields a unihub groups export recorded at the root (attribute ``unihub.schema``)."""
    text = handle.attrs.get(SCHEMA_ATTR)
    if text is None:
        return {}
    schema = Unischema.from_json(text.decode() if isinstance(text, bytes) else text)
    return dict(schema.fields)



# -- constants ----------------------------------------------------------------------------------
def _keep_constants(plan: Plan, handle: Any) -> None:
    """Datasets that are not rows (scalars; in groups and splits layouts, everything outside the units)
    become constants, kept exactly in the metadata; too many bytes of them, or a dtype that cannot
    be kept, are refused."""
    if plan.kind != "columns":
        plan.constants.extend(_outside_units(handle, plan))
    plan.constants = [name for name in plan.constants if name not in plan.links]  # another name, kept as a link
    total = 0
    for name in plan.constants:
        dataset = handle[name]
        dt = dataset.dtype
        size = int(np.prod(dataset.shape)) * dt.itemsize if dataset.shape is not None else 0
        total += size
        try:
            dtype_to_json(dt)
            kept = not dt.hasobject or h5py_module().check_string_dtype(dt) is not None
        except SchemaError:
            kept = False
        if not kept:
            plan.refused[name] = f"dtype {dt} (a dataset that is not rows, kept in the metadata) cannot be kept"
        elif total > CONSTANT_BYTES:
            plan.refused[name] = (f"{size:,} bytes: datasets that are not rows are kept in the metadata, "
                                  f"{CONSTANT_BYTES:,} bytes at most")
    plan.constants = [name for name in plan.constants if name not in plan.refused]


def _outside_units(handle: Any, plan: Plan) -> list[str]:
    """Datasets outside the units: beside the container (at every level above it), and in the
    container's other children."""
    h5py = h5py_module()
    chain = plan.container.split("/") if plan.container else []
    group, prefix, found = handle, "", []
    for depth in range(len(chain) + 1):
        skip = {chain[depth]} if depth < len(chain) else set(plan.units)
        for name in group:
            if name in skip or prefix + name in plan.links or prefix + name in plan.refused:
                continue
            obj = group[name]
            if isinstance(obj, h5py.Dataset):
                found.append(prefix + name)
            elif isinstance(obj, h5py.Group):
                found.extend(f"{prefix}{name}/{rel}" for rel in datasets_below(obj))
        if depth < len(chain):
            group, prefix = group[chain[depth]], f"{prefix}{chain[depth]}/"
    return found


