"""Which layout an HDF5 file has, and where each field's values live in it (layouts: ``formats/hdf5.py``).

:func:`plan_file` reads only the file's structure (names, dtypes, shapes, attributes), never its
data, and returns a :class:`Plan`: the layout, its *units* (the file itself, one group per split,
or one group per sample), the :class:`Leaf` each field is read from, the datasets that are not rows
(*constants*, kept in the metadata) and what was refused or left out, and why.

Detection (``layout='auto'``): a unihub export says its layout in the root attribute
``unihub.layout``. Otherwise unihub looks for sibling groups with datasets in common (at the root,
or below a chain of single child groups). They are samples when there are more than
:data:`MAX_SPLITS` of them, their names are numbered (``sample_0017``), or a member is a scalar
or members differ in length within a group; otherwise, when every dataset of the file has the
same length, the file is plain columns; otherwise the groups are splits.
"""

from __future__ import annotations

import json
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from unihub.errors import FormatError, SchemaError
from unihub.formats.hdf5_types import (
    Member,
    dtype_to_json,
    h5py_module,
    leaves_of,
    member_dtype,
    refusal,
)
from unihub.formats.schema import Unischema, UnischemaField

LAYOUTS = ("auto", "columns", "groups", "splits")
#: more sibling groups than this are samples, never splits
MAX_SPLITS = 16
#: datasets that are not rows are kept exactly in the metadata up to this many bytes in all
CONSTANT_BYTES = 1 << 20
KEY_FIELDS = {"groups": "group", "splits": "split"}
FIELD_ATTR = "unihub.field"
LAYOUT_ATTR = "unihub.layout"
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

    def unit_path(self, unit: str) -> str:
        return "/".join(p for p in (self.container, unit) if p)

    def rows(self, unit: str) -> int:
        """Rows of a columns or splits unit (of its selected datasets; 0 when it has none)."""
        paths = {leaf.path for leaf in self.leaves.values()}
        return next((n for (u, p), n in self.lengths.items() if u == unit and p in paths), 0)


def some(names: Iterable[Any], limit: int = 5) -> str:
    """``'a', 'b', 'c' and 12 more``: a bounded list for messages."""
    items = list(names)
    text = ", ".join(repr(n) for n in items[:limit])
    return text + (f" and {len(items) - limit} more" if len(items) > limit else "")


def plan_file(path: str, handle: Any, options: Mapping[str, Any], *, only: Iterable[str] | None = None) -> Plan:
    """The :class:`Plan` of the open file ``handle``, with the options ``fields``, ``split``,
    ``ignore_unsupported`` and ``ignore_mismatched`` applied: what cannot be ingested is refused.
    ``only``: the fields of a given schema; the plan keeps just those and refuses nothing else."""
    kind, container, units = detect_layout(path, handle, options.get("layout") or "auto")
    key = options.get("key_field") or KEY_FIELDS.get(kind)
    if kind == "columns":
        plan = _plan_columns(path, handle)
    else:
        plan = _plan_units(path, handle, kind, container, units, key)
    _keep_constants(plan, handle)
    _select(plan, options, strict=only is None)
    _select_splits(plan, options.get("split"))
    ignore_mismatched = bool(options.get("ignore_mismatched", False))
    if only is not None and not ignore_mismatched:
        _keep_only(plan, only)
    _check_lengths(plan, ignore_mismatched, warn=only is None)
    if only is not None:
        _keep_only(plan, only)
    return plan


def _keep_only(plan: Plan, names: Iterable[str]) -> None:
    wanted = set(names)
    plan.leaves = {name: leaf for name, leaf in plan.leaves.items() if name in wanted}


# -- detection ----------------------------------------------------------------------------------
def detect_layout(path: str, handle: Any, layout: str) -> tuple[str, str, list[str]]:
    """``(kind, container, unit names)``; see the module docstring."""
    if layout not in LAYOUTS:
        raise FormatError(f"{path}: layout must be one of {', '.join(LAYOUTS)}, got {layout!r}", path=path)
    recorded = _recorded_layout(handle)
    if layout == "auto" and recorded is not None:
        kind, container = recorded.get("kind", "columns"), recorded.get("container", "")
        if kind == "columns":
            return "columns", "", [""]
        base = handle[container] if container else handle
        return kind, container, [n for n in base if base.get(n, getclass=True) is h5py_module().Group]
    if layout == "columns":
        return "columns", "", [""]
    found = _sibling_groups(handle)
    if found is None:
        if layout != "auto":
            raise FormatError(f"{path}: layout={layout} needs sibling groups with datasets in common "
                              "(one per sample or per split); found none", path=path)
        return "columns", "", [""]
    container, units = found
    if layout != "auto":
        return layout, container, units
    base = handle[container] if container else handle
    if _looks_like_samples(base, units):
        return "groups", container, units
    if len(_first_axes(handle)) <= 1:
        return "columns", "", [""]
    return "splits", container, units


def _recorded_layout(handle: Any) -> dict[str, Any] | None:
    text = handle.attrs.get(LAYOUT_ATTR)
    if text is None:
        return None
    try:
        return json.loads(text.decode() if isinstance(text, bytes) else text)
    except ValueError:
        return None


def _sibling_groups(handle: Any) -> tuple[str, list[str]] | None:
    """The first group (the root, or down a chain of single child groups) with at least two child
    groups that share datasets: ``(its path, the alike groups' names in h5py's order)``."""
    h5py = h5py_module()
    group, path = handle, ""
    while True:
        children = [name for name in group if group.get(name, getclass=True) is h5py.Group]
        if len(children) == 1:
            group, path = group[children[0]], "/".join(p for p in (path, children[0]) if p)
            continue
        if len(children) < 2:
            return None
        members = {name: frozenset(_datasets(group[name])) for name in children}
        common = Counter(members.values()).most_common(1)[0][0]
        alike = [name for name in children if members[name] & common]
        return (path, alike) if len(alike) >= 2 and common else None


def _looks_like_samples(base: Any, units: list[str]) -> bool:
    """Many groups, numbered names, a scalar member or members of different lengths: samples."""
    if len(units) > MAX_SPLITS:
        return True
    numbered = [re.fullmatch(r"(.*?)(\d+)", name) for name in units]
    if all(numbered) and len({m.group(1) for m in numbered if m}) == 1:
        return True
    for name in units:
        shapes = [d.shape for d in _datasets(base[name]).values()]
        if any(not shape for shape in shapes) or len({shape[0] for shape in shapes}) > 1:
            return True
    return False


def _first_axes(handle: Any) -> set[int]:
    return {d.shape[0] for d in _datasets(handle).values() if d.shape}


def _datasets(group: Any) -> dict[str, Any]:
    """Every dataset below ``group`` by relative path, in h5py's name order."""
    h5py = h5py_module()
    found: dict[str, Any] = {}
    group.visititems(lambda name, obj: found.__setitem__(name, obj) if isinstance(obj, h5py.Dataset) else None)
    return found


# -- columns ------------------------------------------------------------------------------------
def _plan_columns(path: str, handle: Any) -> Plan:
    """Every dataset whose first axis is the row count; scalars are constants."""
    plan = Plan(path, "columns")
    found = _datasets(handle)
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
        text = dataset.attrs.get(FIELD_ATTR)
        if text is not None:
            data = json.loads(text.decode() if isinstance(text, bytes) else text)
            out[name] = UnischemaField.from_json({**data, "name": name})
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


def _plan_units(path: str, handle: Any, kind: str, container: str, units: list[str], key: str | None) -> Plan:
    """Groups (one row per unit, each member whole) or splits (rows along each member's first axis)."""
    plan = Plan(path, kind, container, units, key)
    base = handle[container] if container else handle
    seen: dict[tuple[str, ...], _Seen] = {}
    recorded: dict[str, UnischemaField] = {}
    for unit in units:
        found = _datasets(base[unit])
        recorded.update(_recorded_fields(found))
        if kind == "groups":
            _note_attributes(seen, unit, "", base[unit].attrs)
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
    elif _dtype_key(dt) != _dtype_key(entry.dtype):
        entry.conflict = f"dtype {_dtype_text(entry.dtype)} in {entry.first!r} but {_dtype_text(dt)} in {unit!r}"
    elif len(shape) != len(entry.shape):
        entry.conflict = f"{len(entry.shape)} dimensions in {entry.first!r} but {len(shape)} in {unit!r}"
    else:
        entry.shape = tuple(a if a == b else None for a, b in zip(entry.shape, shape))


def _note_attributes(seen: dict[tuple[str, ...], _Seen], unit: str, rel: str, attrs: Any) -> None:
    for name in attrs:
        if not name.startswith("unihub."):
            attr = attrs.get_id(name)
            _note(seen, ("a", rel, name), unit, attr.dtype, attr.shape)


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
            _add_leaf(plan, Leaf(leaf_name, rel, entry.dtype, member, key[2], (*entry.shape, *dims), nullable))


def _recorded_schema(handle: Any) -> dict[str, UnischemaField]:
    """The fields a unihub groups export recorded at the root (attribute ``unihub.schema``)."""
    text = handle.attrs.get(SCHEMA_ATTR)
    if text is None:
        return {}
    schema = Unischema.from_json(text.decode() if isinstance(text, bytes) else text)
    return dict(schema.fields)



# -- constants, selection, lengths ----------------------------------------------------------------
def _keep_constants(plan: Plan, handle: Any) -> None:
    """Datasets that are not rows (scalars; in groups and splits layouts, everything outside the units)
    become constants, kept exactly in the metadata; too many bytes of them, or a dtype that cannot
    be kept, are refused."""
    if plan.kind != "columns":
        plan.constants.extend(_outside_units(handle, plan))
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
            if name in skip:
                continue
            obj = group[name]
            if isinstance(obj, h5py.Dataset):
                found.append(prefix + name)
            elif isinstance(obj, h5py.Group):
                found.extend(f"{prefix}{name}/{rel}" for rel in _datasets(obj))
        if depth < len(chain):
            group, prefix = group[chain[depth]], f"{prefix}{chain[depth]}/"
    return found


def matches(name: str, item: str) -> bool:
    return name == item or name.startswith((item + "/", item + ".", item + "@"))


def _select(plan: Plan, options: Mapping[str, Any], *, strict: bool) -> None:
    """Option ``fields`` (names or prefixes of fields) and ``ignore_unsupported``; refuse the rest
    (``strict``: nothing else chose the fields)."""
    wanted = options.get("fields")
    if wanted is not None:
        chosen: set[str] = set()
        for raw in [wanted] if isinstance(wanted, str) else wanted:
            item = raw.strip("/")
            if item == plan.key_field:
                continue
            refused = {n: r for n, r in plan.refused.items() if matches(n, item)}
            if refused:
                raise FormatError(refusal_message(plan.path, refused), path=plan.path)
            hits = [n for n in plan.leaves if matches(n, item)]
            if not hits:
                raise FormatError(f"{plan.path}: no dataset or group {item!r}; fields: {some(plan.leaves, 10)}",
                                  path=plan.path)
            chosen.update(hits)
        plan.left_out.update({n: "not selected by fields=" for n in plan.leaves if n not in chosen})
        plan.left_out.update({n: f"not selected by fields= ({r})" for n, r in plan.refused.items()})
        plan.leaves = {n: leaf for n, leaf in plan.leaves.items() if n in chosen}
        plan.refused = {}
    elif plan.refused and options.get("ignore_unsupported", False):
        if strict:
            warnings.warn(f"{plan.path}: left out (ignore_unsupported): {some(plan.refused)}", stacklevel=4)
        plan.ignored.update(plan.refused)
        plan.refused = {}
    elif plan.refused and strict:
        raise FormatError(refusal_message(plan.path, plan.refused), path=plan.path)


def refusal_message(path: str, refused: Mapping[str, str]) -> str:
    """What cannot be ingested and why (a few named, then how many more), and the ways out."""
    items = list(refused.items())
    text = "; ".join(f"{name!r}: {reason}" for name, reason in items[:5])
    if len(items) > 5:
        text += f"; and {len(items) - 5} more"
    return (f"{path}: cannot convert {len(items)} HDF5 value(s) exactly ({text}); leave them out with "
            "ignore_unsupported=true (they are then listed), or choose fields with fields=...")


def _select_splits(plan: Plan, split: Any) -> None:
    """Option ``split``: the splits to read (in the file's order)."""
    if split is None:
        return
    names = [split] if isinstance(split, str) else list(split)
    if plan.kind != "splits":
        raise FormatError(f"{plan.path}: split= selects groups of a file with one group per split, but this "
                          f"file's layout is {plan.kind!r}", path=plan.path)
    unknown = [n for n in names if n not in plan.units]
    if unknown:
        raise FormatError(f"{plan.path}: no split {some(unknown)}; its splits: {some(plan.units, 10)}",
                          path=plan.path)
    dropped = [plan.unit_path(unit) + "/" for unit in plan.units if unit not in names]
    plan.left_out.update({c: "not selected by split=" for c in plan.constants if c.startswith(tuple(dropped))})
    plan.constants = [c for c in plan.constants if not c.startswith(tuple(dropped))]
    plan.units = [unit for unit in plan.units if unit in names]


def _check_lengths(plan: Plan, ignore_mismatched: bool, *, warn: bool = True) -> None:
    """Columns: the selected datasets must share one length (``ignore_mismatched`` keeps the most
    common); splits: within each split."""
    if plan.kind == "groups":
        return
    for unit in plan.units:
        lengths = {leaf.path: plan.lengths[unit, leaf.path] for leaf in plan.leaves.values()
                   if (unit, leaf.path) in plan.lengths}
        if len(set(lengths.values())) <= 1:
            continue
        where = plan.path if plan.kind == "columns" else f"{plan.path}, split {unit!r}"
        if plan.kind == "splits" or not ignore_mismatched:
            hint = " or skip the others with ignore_mismatched=True" if plan.kind == "columns" else ""
            raise FormatError(mismatch_message(where, lengths) + f"; choose datasets of one length with "
                              f"fields=[...]{hint}", path=plan.path)
        rows = Counter(lengths.values()).most_common(1)[0][0]
        skipped = {n: k for n, k in lengths.items() if k != rows}
        if warn:
            warnings.warn(f"{plan.path}: skipping datasets whose length is not {rows}: "
                          f"{', '.join(f'{n!r}: {k}' for n, k in list(skipped.items())[:10])}", stacklevel=4)
        for name, leaf in list(plan.leaves.items()):
            if leaf.path in skipped:
                plan.ignored[name] = f"{skipped[leaf.path]} rows, not {rows} (ignore_mismatched)"
                del plan.leaves[name]


def mismatch_message(where: str, lengths: Mapping[str, int]) -> str:
    """``x.h5: HDF5 datasets differ in length along the first axis (10 rows: 'a', 'b'; 7 rows: 'c')``."""
    by_length: dict[int, list[str]] = {}
    for name, n in lengths.items():
        by_length.setdefault(n, []).append(name)
    groups = sorted(by_length.items())
    parts = "; ".join(f"{n} rows: {some(names)}" for n, names in groups[:6])
    if len(groups) > 6:
        parts += f"; and {len(groups) - 6} more lengths"
    return f"{where}: HDF5 datasets differ in length along the first axis ({parts})"
