"""``unihub verify`` for HDF5 beside the rows: what a file holds that no record carries.

:func:`reference_extras` reads it from the files with h5py; :func:`native_extras` gives what an export
of a unihub dataset writes, from its ``unihub.extra`` metadata and schema. Both are ``{name: value}``
(see :meth:`~unihub.formats.foreign.ForeignFormat.reference_extras`), values in the exact form of
:func:`~unihub.formats.hdf5_types.native`, dtypes as their JSON text (string encodings, enum mappings,
compound layouts: what a value's numpy dtype does not show):

- ``dataset '/p'`` and ``dtype of dataset '/p'``: each dataset that is not rows (a constant), and each
  dataset of a unit of 0 rows (an empty split, a file of 0 rows), whole;
- ``attribute 'a' of '/p'`` and ``dtype of attribute 'a' of '/p'``: each attribute outside the rows,
  of the objects an export writes (not of a dataset left out, nor inside a split not selected);
- ``group '/p'``: a group outside the rows that no dataset written makes (an empty group);
- the datasets holding rows: ``dtype of the rows of '/x'`` and ``shape of a row of '/x'`` (columns;
  ``... of 'x' in the splits``, merged over the splits: ``None`` where they differ) and ``dtype of
  member 'x' in the groups`` (and of their attributes): every dataset of every field and its
  companions, so that one is missed even where no row shows it (no rows; a field that is None in
  every row, which an ingest of the export would lose).

Several files: the first file's entries, then another file's (prefixed ``name.h5: ``), a kind at a
time, where they differ from the first file's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from unihub.formats import sources
from unihub.formats.hdf5_layout import Plan
from unihub.formats.hdf5_meta import PER_FILE, exact_attributes, in_any, walk_objects
from unihub.formats.hdf5_select import plan_file
from unihub.formats.hdf5_storage import ExportSpec, Typed, generic_dtype, storage_of
from unihub.formats.hdf5_types import (
    decode_constant,
    dtype_to_json,
    h5py_module,
    kind,
    leaves_of,
    member_dtype,
    native,
)
from unihub.formats.schema import Unischema

Value = tuple[Any, Any]  #: (value or None for an empty dataspace, dtype) of a dataset or attribute
Entries = dict[str, Any]


# -- what both sides share ----------------------------------------------------------------------
def _sections(datasets: Mapping[str, Value], attributes: Mapping[str, Mapping[str, Value]],
              group_paths: Iterable[str], written: set[str], implied: set[str]) -> dict[str, Entries]:
    """One file's entries by kind: its whole datasets, the attributes of the objects an export writes
    (``written`` datasets and every group), and the groups no written dataset (nor ``implied`` group) makes."""
    groups = list(group_paths)
    made = set(implied)
    for path in {*written, *implied}:
        parts = path.split("/")
        made.update("/".join(parts[:i]) for i in range(1, len(parts)))
    kept = {"", *groups, *written}
    out: dict[str, Entries] = {"datasets": {}, "attributes": {}, "groups": {}}
    for path, (value, dt) in sorted(datasets.items()):
        out["datasets"][f"dataset '/{path}'"] = _native(value, dt)
        out["datasets"][f"dtype of dataset '/{path}'"] = dtype_text(dt)
    for owner, values in attributes.items():
        if owner not in kept:
            continue
        for name, (value, dt) in values.items():
            out["attributes"][f"attribute {name!r} of '/{owner}'"] = _native(value, dt)
            out["attributes"][f"dtype of attribute {name!r} of '/{owner}'"] = dtype_text(dt)
    out["groups"] = {f"group '/{path}'": "empty" for path in groups if path not in made}
    return out


def _native(value: Any, dt: Any) -> Any:
    return None if value is None else native(value, dt)


def dtype_text(dt: np.dtype) -> str:
    """A dtype as the JSON text of :func:`dtype_to_json` (its string encoding, enum mapping ...)."""
    return json.dumps(dtype_to_json(dt))


def _with_files(first: dict[str, Entries], others: Iterable[tuple[str, dict[str, Entries]]]) -> Entries:
    """The first file's entries, and each other file's kinds of entries that differ from the first's."""
    from unihub.converters.verify import first_difference

    out: Entries = {name: value for entries in first.values() for name, value in entries.items()}
    for path, sections in others:
        for key, entries in sections.items():
            same = entries.keys() == first[key].keys() and all(
                first_difference(first[key][n], v) is None for n, v in entries.items())
            if not same:
                out.update({f"{os.path.basename(path)}: {n}": v for n, v in entries.items()})
    return out


# -- the files, read with h5py ------------------------------------------------------------------
def reference_extras(files: list[str], options: Mapping[str, Any]) -> Entries:
    """What ``files`` hold beside their rows, read with h5py; see the module docstring."""
    all_sections: list[tuple[str, dict[str, Entries]]] = []
    rows: dict[str, list[Any]] = {}
    for path in files:
        with sources.open_hdf5(path) as handle:
            plan = plan_file(path, handle, options)
            all_sections.append((path, _file_sections(handle, plan)))
            _row_datasets(handle, plan, rows)
    return {**_with_files(all_sections[0][1], all_sections[1:]), **_row_entries(rows)}


def _file_sections(handle: Any, plan: Plan) -> dict[str, Entries]:
    h5py = h5py_module()
    written = set(plan.constants) | set(plan.empty_datasets())
    implied = {plan.container} if plan.kind == "groups" and plan.container else set()  # made for the units
    if plan.kind != "groups":
        for unit in plan.units:
            group = handle[plan.unit_path(unit)] if plan.unit_path(unit) else handle
            names = {leaf.path for leaf in plan.leaves.values() if leaf.attr is None}
            names.update(c for leaf in plan.leaves.values() if leaf.recorded is not None
                         for c in plan.companions.get(leaf.field, ()))
            written.update("/".join(p for p in (plan.unit_path(unit), n) if p) for n in names if n in group)
    units = {plan.unit_path(u) for u in plan.units} if plan.kind == "groups" else set()
    dropped = tuple(plan.unit_path(u) for u in plan.dropped)
    walked = [(p, obj) for p, obj in [("", handle), *walk_objects(handle, "", units)] if not in_any(p, dropped)]
    datasets = {p: _read(handle[p]) for p in sorted(set(plan.constants) | set(plan.empty_datasets()))}
    attributes = {p: _attributes(obj.attrs) for p, obj in walked}
    groups = [p for p, obj in walked if p and isinstance(obj, h5py.Group)]
    return _sections(datasets, attributes, groups, written, implied)


def _read(dataset: Any) -> Value:
    return (None if dataset.shape is None else dataset[...]), dataset.dtype


def _attributes(attrs: Any) -> dict[str, Value]:
    """An object's attributes as h5py reads them (unihub's own left out, and those that cannot be kept
    exactly, which the conversion lists as left out)."""
    return {name: (value, dtype) for name, (value, dtype, _) in exact_attributes(attrs)[0].items()}


def _row_datasets(handle: Any, plan: Plan, out: dict[str, list[Any]]) -> None:
    """The dtypes (and row shapes) of the datasets holding rows, merged over units and files into ``out``:
    name -> [dtype texts, row shape or None]."""
    if plan.kind == "groups":
        for leaf in plan.leaves.values():
            _note(out, _member_name(leaf.path, leaf.attr), dtype_text(leaf.dtype), None)
        return
    for unit in plan.units:
        group = handle[plan.unit_path(unit)] if plan.unit_path(unit) else handle
        names = {leaf.path for leaf in plan.leaves.values() if leaf.attr is None}
        names.update(c for leaf in plan.leaves.values() if leaf.recorded is not None
                     for c in plan.companions.get(leaf.field, ()))
        for rel in sorted(n for n in names if n in group):
            dataset = group[rel]
            _note(out, _rows_name(plan.kind, rel), dtype_text(dataset.dtype), list(dataset.shape[1:]))


def _note(out: dict[str, list[Any]], name: str, text: str, cell: list[int | None] | None) -> None:
    """Merge one dataset's dtype text and row shape (None where they differ) into ``out[name]``."""
    if name not in out:
        out[name] = [[text], cell]
        return
    texts, known = out[name]
    texts.extend([text] if text not in texts else [])
    if cell is not None and known is not None:
        out[name][1] = [a if a == b else None for a, b in zip(known, cell)] if len(known) == len(cell) else \
            f"ranks differ: {len(known)} and {len(cell)}"


def _row_entries(rows: Mapping[str, list[Any]]) -> Entries:
    out: Entries = {}
    for name, (texts, cell) in rows.items():
        out[f"dtype of {name}"] = texts[0] if len(texts) == 1 else f"differs between units or files: {'; '.join(texts)}"
        if cell is not None:
            out[f"shape of a row of {name.removeprefix('the rows of ')}"] = cell
    return out


def _rows_name(kind_: str, rel: str) -> str:
    return f"the rows of '/{rel}'" if kind_ == "columns" else f"the rows of {rel!r} in the splits"


def _member_name(path: str, attr: str | None) -> str:
    if attr is None:
        return f"member {path!r} in the groups"
    return f"attribute {attr!r} of " + (f"member {path!r} in the groups" if path else "the groups")


# -- a unihub dataset, as an export writes it ---------------------------------------------------------
def native_extras(schema: Unischema, extra: Mapping[str, Any], spec: ExportSpec,
                  options: Mapping[str, Any]) -> Entries:
    """What an export of the dataset (written as ``spec`` says) holds beside its rows; see the module
    docstring. Only an export in the layout of an HDF5 ingest writes back what its source held."""
    source = extra.get("hdf5") if extra.get("source_format") == "hdf5" else None
    recorded = dict((source or {}).get("layout") or {})
    same = source is not None and recorded.get("kind", "columns") == spec.kind
    out: Entries = {}
    if source is not None and same:
        out = _native_files(source, spec, recorded, options)
    rows: dict[str, list[Any]] = {}
    for typed in spec.typed:
        if spec.kind == "groups":
            _note(rows, _member_name(typed.path, typed.attr), dtype_text(typed.dtype), None)
        elif typed.attr is None:
            _note(rows, _rows_name(spec.kind, typed.path), dtype_text(typed.dtype), _typed_cell(schema, typed))
    for f in spec.generic:
        if spec.kind == "groups":
            _note(rows, _member_name(f.name, None), dtype_text(generic_dtype(f, spec.images)), None)
            continue
        for name, (dt, shape) in storage_of(f, spec.images).datasets().items():
            _note(rows, _rows_name(spec.kind, name), dtype_text(dt), list(shape))
    return {**out, **_row_entries(rows)}


def _native_files(source: Mapping[str, Any], spec: ExportSpec, recorded: Mapping[str, Any],
                  options: Mapping[str, Any]) -> Entries:
    """The entries of the source's files, from the metadata (the first file's, and ``<key>_by_file``)."""
    units = recorded.get("units")
    selected = options.get("split")
    selected = [selected] if isinstance(selected, str) else selected
    dropped: tuple[str, ...] = ()
    if spec.kind == "splits" and units is not None and selected is not None:
        dropped = tuple(_join(spec.container, u) for u in units if u not in selected)
        units = [u for u in units if u in selected]
    names = [t.path for t in spec.typed if t.attr is None]
    if spec.kind != "groups":
        names += [n for f in spec.generic for n in storage_of(f, spec.images).datasets()]
    unit_paths = [""] if spec.kind == "columns" else [_join(spec.container, u) for u in units or ()]
    rows = {_join(u, n) for u in unit_paths for n in names} if spec.kind != "groups" else set()
    implied = {spec.container} if spec.kind == "groups" and spec.container else set()  # made for the units

    def sections(own: Mapping[str, Any]) -> dict[str, Entries]:
        datasets = {p: decode_constant(r) for key in ("constants", "empty_datasets")
                    for p, r in (own.get(key) or {}).items() if not in_any(p, dropped)}
        groups = [p for p in (own.get("group_paths") or ()) if not in_any(p, dropped)]
        attributes = {p: {n: decode_constant(r) for n, r in values.items()}
                      for p, values in (own.get("attribute_values") or {}).items() if not in_any(p, dropped)}
        # metadata from before the splits were recorded: every attribute's owner taken as written
        written = set(attributes) if spec.kind == "splits" and units is None else rows
        return _sections(datasets, attributes, groups, written | set(datasets), implied)

    first = {key: source.get(key) for key in PER_FILE}
    others = {path for key in PER_FILE for path in (source.get(f"{key}_by_file") or {})}
    return _with_files(sections(first), [(path, sections({key: (source.get(f"{key}_by_file") or {}).get(
        path, first[key]) for key in PER_FILE})) for path in sorted(others)])


def _join(*parts: str) -> str:
    return "/".join(p for p in parts if p)


def _typed_cell(schema: Unischema, typed: Typed) -> list[int | None]:
    """One row's shape in a source dataset, from its first member's field (whose shape adds the member's
    array dims, and a trailing dim for complex pairs and variable-length sequences)."""
    name, member = typed.members[0]
    dims = {m: d for m, _, d in leaves_of(typed.dtype)}[member]
    trailing = 1 if kind(member_dtype(typed.dtype, member)) in ("complex", "vlen") else 0
    shape = schema[name].shape
    return list(shape[:len(shape) - len(dims) - trailing])
