"""``unihub verify`` for HDF5 beside the rows: what a file holds that no record carries.

:func:`reference_extras` reads it from the files with h5py; :func:`native_extras` gives what an export
of a unihub dataset writes, from its ``unihub.extra`` metadata and schema. Both are ``{name: value}``
(see :meth:`~unihub.formats.base.ForeignFormat.reference_extras`), values in the exact form of
:func:`~unihub.formats.hdf5.dtypes.native`, dtypes as their JSON text (string encodings, enum mappings,
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
  every row, which an ingest of the export would lose);
- ``storage of dataset '/p'`` (and ``storage of member 'x' in the groups``, where not h5py's default):
  how each of the source's datasets is stored, as h5py's own properties describe it
  (:func:`storage_description`: layout, chunks, maximum shape, compression and its options,
  shuffle, fletcher32, scale-offset, the filter pipeline, fill value and times); on the unihub
  side, from a dataset made in memory from the metadata's record the way an export makes it;
- ``link '/p'``: every other name of an object (a second hard link, a soft link) and what it names;
- ``dimension scale '/p'`` (its name) and ``dimensions of '/p'`` (each dimension's label and the
  scales attached to it, in order), as h5py's ``dims`` API reads them; ``named datatype '/p'``;
- ``creation order of the links of '/p'`` and ``... of the attributes of '/p'``: the names of an
  object outside the units that tracks their creation order (h5py's ``track_order``), in it; inside
  the sample groups, one for all (``... of each sample group``, ``... of 'p' in each sample group``),
  with ``type of attribute 'a' of each sample group`` (a padding, a bitfield);
- ``dataset '/p'`` of the file that the conversion holds nowhere nor lists as left out (read from
  the file: no unihub dataset has such an entry, so a dataset dropped without a word shows).

Several files: the first file's entries, then another file's (prefixed ``name.h5: ``), a kind at a
time, where they differ from the first file's.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from unihub.formats.compare import first_difference
from unihub.formats.hdf5.detect import recorded_layout
from unihub.formats.hdf5.dtypes import (
    decode_constant,
    dtype_to_json,
    h5py_module,
    kind,
    leaves_of,
    member_dtype,
    native,
    note_text,
    string_padding,
    type_notes,
)
from unihub.formats.hdf5.export import create_stored
from unihub.formats.hdf5.files import open_hdf5
from unihub.formats.hdf5.layout import Plan, find_links, unit_roots
from unihub.formats.hdf5.meta import (
    GIVEN_PARAMETERS,
    PER_FILE,
    creation_orders,
    dimension_scales,
    exact_attributes,
    in_any,
    unit_order,
    walk_objects,
)
from unihub.formats.hdf5.selection import plan_file
from unihub.formats.hdf5.storage import ExportSpec, Typed, asked_of, generic_dtype, storage_of
from unihub.schema.unischema import Unischema

Value = tuple[Any, Any]  #: (value or None for an empty dataspace, dtype) of a dataset or attribute
#: (value, dtype, a fixed string's padding where it is not h5py's, a bitfield: :func:`note_text`) of an attribute
AttrValue = tuple[Any, Any, str | None]
Entries = dict[str, Any]


# -- what both sides share ----------------------------------------------------------------------
def _sections(datasets: Mapping[str, Value], attributes: Mapping[str, Mapping[str, AttrValue]],
              group_paths: Iterable[str], written: set[str], implied: set[str],
              structure: Mapping[str, Any] | None = None) -> dict[str, Entries]:
    """One file's entries by kind: its whole datasets, the attributes of the objects an export writes
    (``written`` datasets and every group), the groups no written dataset (nor ``implied`` group) makes,
    and its ``structure``: ``storage`` (named entries, :func:`storage_description`), ``links`` and
    ``scales`` (as ``hdf5_meta`` records them), of the objects written (below ``implied`` in a groups
    layout: its samples)."""
    groups = list(group_paths)
    made = set(implied)
    for path in {*written, *implied}:
        parts = path.split("/")
        made.update("/".join(parts[:i]) for i in range(1, len(parts)))
    kept = {"", *groups, *written}
    structure = structure or {}

    below = structure.get("units_below")  # a groups layout's container: its samples are written

    def is_kept(path: str) -> bool:
        return path in kept or (below is not None and (below == "" or path.startswith(below + "/")))

    out: dict[str, Entries] = {"datasets": {}, "attributes": {}, "groups": {}, "storage": dict(structure.get("storage") or {}),
                               "links": {}, "scales": {}}
    out["types"] = {f"named datatype '/{path}'": json.dumps(dt)
                    for path, dt in sorted((structure.get("named_types") or {}).items())}
    out["links"] = _link_entries(structure.get("links") or {}, is_kept)
    out["scales"] = _scale_entries(structure.get("scales") or {}, is_kept)
    out["order"] = _order_entries(structure.get("creation_order") or {}, is_kept)
    out["order"].update(_unit_entries(structure.get("unit_order"), structure.get("unit_kind")))
    for path, (value, dt) in sorted(datasets.items()):
        out["datasets"][f"dataset '/{path}'"] = _native(value, dt)
        out["datasets"][f"dtype of dataset '/{path}'"] = dtype_text(dt)
    for owner, values in attributes.items():
        if owner not in kept:
            continue
        for name, (value, dt, padding) in values.items():
            out["attributes"][f"attribute {name!r} of '/{owner}'"] = _native(value, dt)
            out["attributes"][f"dtype of attribute {name!r} of '/{owner}'"] = \
                dtype_text(dt) if padding is None else f"{dtype_text(dt)} ({padding})"
    out["groups"] = {f"group '/{path}'": "empty" for path in groups if path not in made}
    return out


def _link_entries(links: Mapping[str, Any], is_kept: Callable[[str], bool]) -> Entries:
    """``link '/p'``: each other name (``hdf5_meta``'s ``links``) of an object written (``is_kept``)."""
    out: Entries = {}
    for path, link in sorted(links.items()):
        target = link.get("hard", link.get("object", ""))
        if is_kept(target):
            out[f"link '/{path}'"] = f"hard link to '/{target}'" if "hard" in link \
                else f"soft link to {link['soft']!r} ('/{target}')"
    return out


def _order_entries(orders: Mapping[str, Any], is_kept: Callable[[str], bool]) -> Entries:
    """``creation order of the links in '/p'`` and ``... of the attributes of '/p'`` (``hdf5_meta``'s
    ``creation_order``) of the objects written (``is_kept``) that track it: an object that does not lists
    its names in name order, which verify would not see in the names alone."""
    out: Entries = {}
    for path, entry in sorted(orders.items()):
        if is_kept(path):
            for what, names in sorted(entry.items()):
                if names:  # tracked with none of the source's names: nothing to list out of order
                    out[f"creation order of the {what} of '/{path}'"] = list(names)
    return out


def _unit_entries(record: Mapping[str, Any] | str | None, kind_: str | None) -> Entries:
    """``creation order of the links of each sample group`` (``... of 'p' in each sample group``, of the
    attributes too) and ``type of attribute 'a' of ...`` (a padding, a bitfield) from ``hdf5_meta``'s
    ``unit_order`` (``members``), and whether the container of the splits or sample groups (``kind_``)
    tracks creation order; or the text saying how the samples of a file differ."""
    if record is None:
        return {}
    if isinstance(record, str):
        return {"creation order and attribute types in the sample groups": f"the samples differ: {record}"}
    units = "splits" if kind_ == "splits" else "sample groups"
    out: Entries = {f"creation order tracked by the container of the {units}": bool(record.get("container_tracked"))}
    for rel, entry in sorted((record.get("members") or {}).items()):
        where = f"{rel!r} in each sample group" if rel else "each sample group"
        for what in ("links", "attributes"):
            if entry.get(what):
                out[f"creation order of the {what} of {where}"] = list(entry[what])
        for name, note in sorted((entry.get("notes") or {}).items()):
            if note is not None:
                out[f"type of attribute {name!r} of {where}"] = note
    return out


def _scale_entries(scales: Mapping[str, Any], is_kept: Callable[[str], bool]) -> Entries:
    """``dimension scale '/p'`` and ``dimensions of '/p'`` (``hdf5_meta``'s ``dimension_scales``) of the
    objects written (``is_kept``): a dataset's dimensions where one has a label or a scale written."""
    out: Entries = {}
    for path, name in sorted((scales.get("scales") or {}).items()):
        if is_kept(path):
            out[f"dimension scale '/{path}'"] = name
    for path, dims in sorted((scales.get("dims") or {}).items()):
        found = [[label, [f"/{scale}" for scale in attached if is_kept(scale)]] for label, attached in dims]
        if is_kept(path) and any(label or attached for label, attached in found):
            out[f"dimensions of '/{path}'"] = found
    return out


_LAYOUT_NAMES = {0: "compact", 1: "contiguous", 2: "chunked", 3: "virtual"}



def storage_description(dataset: Any) -> dict[str, Any]:
    """How h5py says ``dataset`` is stored: its public properties (chunks, compression and its options,
    shuffle, fletcher32, scale-offset, fill value) and from its creation property list the layout, the
    filter pipeline as HDF5 runs it (the parameters given, not those derived at creation:
    :data:`~unihub.formats.hdf5.meta.GIVEN_PARAMETERS`),
    when it is filled and allocated (not whether times are tracked, which
    h5py sets by its own defaults), a fixed string's padding where it is not h5py's, whether its type is a
    bitfield (h5py reads one as an unsigned integer), and the files holding its raw data where they are
    external (``external``: an export writes such a dataset into the file; the layout alone says contiguous).
    The maximum shape is ``"="`` where it is the dataset's own dim (None: unlimited), and so is a chunk's, so that datasets of other row
    counts compare."""
    h5py = h5py_module()
    dcpl = dataset.id.get_create_plist()
    filters = [dcpl.get_filter(i) for i in range(dcpl.get_nfilters())]
    fill: Any = "default"
    if dcpl.fill_value_defined() == h5py.h5d.FILL_VALUE_USER_DEFINED:
        fill = _native(np.asarray(dataset.fillvalue, dtype=dataset.dtype), dataset.dtype)
    return {"layout": _LAYOUT_NAMES.get(dcpl.get_layout(), str(dcpl.get_layout())),
            "chunks": [("=" if c == d else c) for c, d in zip(dataset.chunks, dataset.shape)] if dataset.chunks
            else None,
            "maxshape": ["=" if m == d else m for m, d in zip(dataset.maxshape or (), dataset.shape or ())],
            "compression": dataset.compression, "compression_opts": dataset.compression_opts,
            "shuffle": dataset.shuffle, "fletcher32": dataset.fletcher32, "scaleoffset": dataset.scaleoffset,
            "filters": [[name.decode("ascii", "replace"), int(flags), [int(v) for v in values[:GIVEN_PARAMETERS.get(code)]]]
                        for code, flags, values, name in filters],
            "fillvalue": fill, "fill_time": int(dcpl.get_fill_time()), "alloc_time": int(dcpl.get_alloc_time()),
            "strpad": string_padding(dataset.id.get_type()),
            "bitfield": dataset.id.get_type().get_class() == h5py.h5t.BITFIELD,
            "members": type_notes(dataset.id.get_type()).get("members"),
            "external": [[name, int(offset), int(size)] for name, offset, size in dataset.external or ()] or None}


#: what an export's ``compression`` / ``chunk_rows`` (storage.ASKED) set in the storage of a dataset of rows
_ASKED_KEYS = ("layout", "chunks", "maxshape", "compression", "compression_opts", "shuffle", "fletcher32",
               "scaleoffset", "filters")


def as_asked_description(description: Mapping[str, Any]) -> dict[str, Any]:
    """A storage description of a dataset of rows written as an export's ``compression`` / ``chunk_rows``
    asked: what those set is the user's choice, not the source's, and is left out of the comparison; the
    type's notes, the fill value and times are still compared."""
    return {**description, **{key: "as the export was asked" for key in _ASKED_KEYS}}


def _is_default(description: Mapping[str, Any], dtype: np.dtype) -> bool:
    """True for the storage h5py gives a dataset of ``dtype`` created with no storage options (contiguous,
    no filters, no fill value set), of any shape. HDF5 writes the fill value of a type holding
    variable-length values (strings, sequences) when space is allocated, of others only where one is set."""
    h5py = h5py_module()
    variable = bool(dtype.hasobject)
    if variable not in _DEFAULTS:
        with h5py.File(f"unihub-{uuid.uuid4().hex}.h5", "w", driver="core", backing_store=False) as memory:
            _DEFAULTS[variable] = storage_description(memory.create_dataset(
                "dataset", shape=(1,), dtype=h5py.string_dtype() if variable else "u1"))
    return all(m == "=" for m in description["maxshape"]) and all(
        description[k] == v for k, v in _DEFAULTS[variable].items() if k != "maxshape")


_DEFAULTS: dict[bool, dict[str, Any]] = {}


def _storage_entries(datasets: Mapping[str, Any], members: Mapping[str, Any],
                     exceptions: Mapping[str, tuple[str, Any]], dtypes: Mapping[str, np.dtype]) -> Entries:
    """Named entries of storage descriptions: each dataset's by path; in a groups layout each member's
    (in the first group holding it; of dtype ``dtypes[member]``) unless it is h5py's default (the groups
    of an export hold fields stored unihub's way too, which are, and which the file does not tell apart),
    and ``exceptions`` (``path: (member, description)``) where they differ from their member's."""
    out = {f"storage of dataset '/{path}'": d for path, d in sorted(datasets.items())}
    out.update({f"storage of member {rel!r} in the groups": d for rel, d in sorted(members.items())
                if not _is_default(d, dtypes[rel])})
    for path, (rel, description) in sorted(exceptions.items()):
        if rel not in members or first_difference(members[rel], description) is not None:
            out[f"storage of dataset '/{path}'"] = description
    return out


def _native(value: Any, dt: Any) -> Any:
    return None if value is None else native(value, dt)


def dtype_text(dt: np.dtype) -> str:
    """A dtype as the JSON text of :func:`dtype_to_json` (its string encoding, enum mapping ...)."""
    return json.dumps(dtype_to_json(dt))


def _with_files(first: dict[str, Entries], others: Iterable[tuple[str, dict[str, Entries]]]) -> Entries:
    """The first file's entries, and each other file's kinds of entries that differ from the first's."""
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
        with open_hdf5(path) as handle:
            plan = plan_file(path, handle, options)
            all_sections.append((path, _file_sections(handle, plan)))
            _row_datasets(handle, plan, rows)
    return {**_with_files(all_sections[0][1], all_sections[1:]), **_row_entries(rows)}


def _file_sections(handle: Any, plan: Plan) -> dict[str, Entries]:
    """One file's entries by kind (:func:`_sections`), read with h5py, and the datasets it holds that
    the conversion neither holds nor lists as left out (``unconverted``)."""
    h5py = h5py_module()
    written = _written_paths(handle, plan)
    implied = {plan.container} if plan.kind == "groups" and plan.container else set()  # made for the units
    units = {plan.unit_path(u) for u in plan.units} if plan.kind == "groups" else set()
    dropped = tuple(plan.unit_path(u) for u in plan.dropped)
    roots = unit_roots(plan)
    walked = [(p, obj) for p, obj in [("", handle), *walk_objects(handle, units, roots)] if not in_any(p, dropped)]
    datasets = {p: _read(handle[p]) for p in sorted(set(plan.constants) | set(plan.empty_datasets()))}
    skipped = {*plan.refused, *plan.ignored, *plan.left_out}  # listed as left out by the conversion
    attributes = {p: _attributes(obj, p, skipped) for p, obj in walked}
    groups = [p for p, obj in walked if p and isinstance(obj, h5py.Group)]
    sections = _sections(datasets, attributes, groups, written, implied,
                         _file_structure(handle, plan, walked, dropped, skipped))
    sections["unconverted"] = _unconverted(plan, walked, written, skipped)
    return sections


def _row_dataset_names(plan: Plan) -> set[str]:
    """The datasets of a unit (columns: of the file) that hold rows: the fields' and their companions'."""
    names = {leaf.path for leaf in plan.leaves.values() if leaf.attr is None}
    names.update(c for leaf in plan.leaves.values() if leaf.recorded is not None
                 for c in plan.companions.get(leaf.field, ()))
    return names


def _written_paths(handle: Any, plan: Plan) -> set[str]:
    """The datasets of the file that the conversion holds whole: constants, datasets of units of 0 rows,
    and (but in a groups layout) the datasets of the rows in every unit."""
    written = set(plan.constants) | set(plan.empty_datasets())
    if plan.kind != "groups":
        names = _row_dataset_names(plan)
        for unit in plan.units:
            group = handle[plan.unit_path(unit)] if plan.unit_path(unit) else handle
            written.update("/".join(p for p in (plan.unit_path(unit), n) if p) for n in names if n in group)
    return written


def _file_structure(handle: Any, plan: Plan, walked: list[tuple[str, Any]], dropped: tuple[str, ...],
                    skipped: set[str]) -> dict[str, Any]:
    """The ``structure`` of :func:`_sections` read from the file: storage, links, dimension scales and
    named datatypes, of the ``walked`` objects (none in a dropped unit nor listed as left out)."""
    h5py = h5py_module()
    roots = unit_roots(plan)
    links = {p: link for p, link in find_links(handle, roots)[0].items() if p not in skipped and not in_any(p, dropped)}
    return {"storage": _file_storage(handle, plan), "links": links,
            "scales": dimension_scales(handle, walked, roots),
            "units_below": plan.container if plan.kind == "groups" else None,
            "named_types": {p: dtype_to_json(obj.dtype) for p, obj in walked if isinstance(obj, h5py.Datatype)
                            and p not in skipped},
            "creation_order": creation_orders(walked, plan),
            "unit_order": _file_unit_order(handle, plan), "unit_kind": plan.kind}


def _file_unit_order(handle: Any, plan: Plan) -> dict[str, Any] | str | None:
    """``hdf5_meta.unit_order`` of the file (splits or sample groups), or how its samples differ; None for
    a columns layout."""
    if plan.kind == "columns":
        return None
    record, conflict = unit_order(handle, plan)
    return conflict if conflict is not None else record


def _unconverted(plan: Plan, walked: list[tuple[str, Any]], written: set[str], skipped: set[str]) -> Entries:
    """Every dataset h5py finds (outside the sample groups, whose every member is a
    field or refused) that the conversion neither holds (rows, their companions, constants, datasets
    of empty units) nor lists as left out (refused, ignored, not selected): an entry no unihub
    dataset has, so that verify names what an ingest dropped without a word."""
    h5py = h5py_module()
    units = sorted(unit_roots(plan), key=len, reverse=True)

    def listed(name: str) -> bool:
        return any(s == name or s.startswith((name + ".", name + "@")) for s in skipped)

    out: Entries = {}
    for path, obj in walked:
        if not isinstance(obj, h5py.Dataset) or path in written or listed(path):
            continue
        unit = next((u for u in units if u and path.startswith(u + "/")), None)
        if unit is not None and listed(path[len(unit) + 1:]):
            continue
        out[f"dataset '/{path}'"] = "in the file, but in no row, constant or link of the conversion, nor listed as left out"
    return out


def _file_storage(handle: Any, plan: Plan) -> Entries:
    """The storage entries of the source's datasets an export writes back (the rows' datasets, not
    unihub's own; the constants; those of units of 0 rows), as h5py describes them."""
    datasets = {p: storage_description(handle[p]) for p in (*plan.constants, *plan.empty_datasets())}
    members: dict[str, Any] = {}
    dtypes: dict[str, np.dtype] = {}
    exceptions: dict[str, tuple[str, Any]] = {}
    rows = sorted({leaf.path for leaf in plan.leaves.values()  # a groups export records all its fields
                   if leaf.attr is None and (leaf.recorded is None or plan.kind == "groups")})
    asked = bool(asked_of(recorded_layout(handle) or {}))
    for unit in plan.units:
        group = handle[plan.unit_path(unit)] if plan.unit_path(unit) else handle
        for rel in (r for r in rows if r in group):
            path = "/".join(p for p in (plan.unit_path(unit), rel) if p)
            description = storage_description(group[rel])
            if plan.kind != "groups":
                datasets[path] = as_asked_description(description) if asked else description
            elif members.setdefault(rel, description) is not description:
                exceptions[path] = (rel, description)
            else:
                dtypes[rel] = group[rel].dtype
    return _storage_entries(datasets, members, exceptions, dtypes)


def _read(dataset: Any) -> Value:
    return (None if dataset.shape is None else dataset[...]), dataset.dtype


def _attributes(owner: Any, path: str, skipped: set[str]) -> dict[str, AttrValue]:
    """An object's attributes as h5py reads them (unihub's own left out, those of the dimension-scale
    API, compared as scales); one that cannot be kept exactly is its reason, unless ``skipped`` lists
    it as left out, so that no unihub dataset matches it."""
    values, failed = exact_attributes(owner)
    found = {name: (value, dtype, note_text(record)) for name, (value, dtype, record) in values.items()}
    found.update({name: (np.array(reason), np.dtype(str), None) for name, reason in failed.items()
                  if f"{path}@{name}" not in skipped})
    return found


def _row_datasets(handle: Any, plan: Plan, out: dict[str, list[Any]]) -> None:
    """The dtypes (and row shapes) of the datasets holding rows, merged over units and files into ``out``:
    name -> [dtype texts, row shape or None]."""
    if plan.kind == "groups":
        for leaf in plan.leaves.values():
            _note(out, _member_name(leaf.path, leaf.attr), dtype_text(leaf.dtype), None)
        return
    names = _row_dataset_names(plan)
    for unit in plan.units:
        group = handle[plan.unit_path(unit)] if plan.unit_path(unit) else handle
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
    elif spec.kind != "columns":  # the export's own container lists the units as written
        out = _unit_entries({"container_tracked": True}, spec.kind)
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
    units, dropped = _selected_units(spec, recorded, options)
    export = _Export(spec, dropped, rows=_export_rows(spec, units),
                     implied={spec.container} if spec.kind == "groups" and spec.container else set(),  # for the units
                     owners_written=spec.kind == "splits" and units is None)
    first = {key: source.get(key) for key in PER_FILE}
    by_file = {key: source.get(f"{key}_by_file") or {} for key in PER_FILE}
    others = {path for key in PER_FILE for path in by_file[key]}
    return _with_files(export.sections(first), [
        (path, export.sections({key: by_file[key].get(path, first[key]) for key in PER_FILE}))
        for path in sorted(others)])


def _export_rows(spec: ExportSpec, units: list[str] | None) -> set[str]:
    """The paths of the datasets holding rows that an export writes (none in a groups layout, whose
    rows are sample groups)."""
    if spec.kind == "groups":
        return set()
    names = [t.path for t in spec.typed if t.attr is None]
    names += [n for f in spec.generic for n in storage_of(f, spec.images).datasets()]
    unit_paths = [""] if spec.kind == "columns" else [_join(spec.container, u) for u in units or ()]
    return {_join(u, n) for u in unit_paths for n in names}


def _selected_units(spec: ExportSpec, recorded: Mapping[str, Any],
                    options: Mapping[str, Any]) -> tuple[list[str] | None, tuple[str, ...]]:
    """The recorded units an export writes (None: not recorded) and the paths of those the option
    ``split`` leaves out."""
    units = recorded.get("units")
    selected = options.get("split")
    selected = [selected] if isinstance(selected, str) else selected
    dropped: tuple[str, ...] = ()
    if spec.kind == "splits" and units is not None and selected is not None:
        dropped = tuple(_join(spec.container, u) for u in units if u not in selected)
        units = [u for u in units if u in selected]
    return units, dropped


@dataclass(frozen=True)
class _Export:
    """What an export writes of a source's file, to read its entries from the metadata."""

    spec: ExportSpec
    dropped: tuple[str, ...]  #: the units not written (option ``split``)
    rows: set[str]  #: the datasets of the rows (but in a groups layout)
    implied: set[str]  #: the groups made for the units
    #: metadata from before the splits were recorded: every attribute's owner taken as written
    owners_written: bool

    def sections(self, own: Mapping[str, Any]) -> dict[str, Entries]:
        """:func:`_sections` of one file's own metadata (the keys of :data:`PER_FILE`)."""
        spec = self.spec
        datasets = {p: decode_constant(r) for key in ("constants", "empty_datasets")
                    for p, r in self._kept(own, key).items()}
        groups = [p for p in (own.get("group_paths") or ()) if not in_any(p, self.dropped)]
        attributes = {p: {n: (*decode_constant(r), note_text(r)) for n, r in values.items()}
                      for p, values in self._kept(own, "attribute_values").items()}
        written = set(attributes) if self.owners_written else self.rows
        structure = {"storage": _recorded_storage(own, spec, datasets, self.rows, self.dropped),
                     "links": self._kept(own, "links"),
                     "scales": own.get("dimension_scales") or {},
                     "units_below": spec.container if spec.kind == "groups" else None,
                     "named_types": self._kept(own, "named_types"),
                     "creation_order": self._kept(own, "creation_order"),
                     # metadata from before it was kept: the container tracked, as the export makes it
                     "unit_order": None if spec.kind == "columns" else own.get("unit_order") or {"container_tracked": True},
                     "unit_kind": spec.kind}
        return _sections(datasets, attributes, groups, written | set(datasets), self.implied, structure)

    def _kept(self, own: Mapping[str, Any], key: str) -> dict[str, Any]:
        """``own[key]`` (by object path) without the objects of the units not written."""
        return {p: value for p, value in (own.get(key) or {}).items() if not in_any(p, self.dropped)}


def _recorded_storage(own: Mapping[str, Any], spec: ExportSpec, datasets: Mapping[str, Value], rows: set[str],
                      dropped: tuple[str, ...]) -> Entries:
    """The storage entries of what an export writes as its source stored it (``storage`` and
    ``member_storage`` of the metadata): each record made into a dataset in memory, the way the export
    makes it, and described as h5py describes the file's (:func:`storage_description`)."""
    recorded = {p: r for p, r in (own.get("storage") or {}).items() if not in_any(p, dropped)}
    typed = {t.path: t.dtype for t in spec.typed if t.attr is None}
    described: dict[str, Any] = {}
    exceptions: dict[str, tuple[str, Any]] = {}
    for path, record in recorded.items():
        if path in datasets:
            value, dt = datasets[path]
            described[path] = _described(record, dt, None if value is None else value.shape)
            continue
        rel = _member_of(spec, path)
        if rel in typed and (spec.kind == "groups" or path in rows):
            if spec.kind == "groups":
                exceptions[path] = (rel, _described(record, typed[rel]))
            else:
                description = _described(record, typed[rel])
                described[path] = as_asked_description(description) if spec.asked else description
    members = {rel: _described(record, typed[rel]) for rel, record in (own.get("member_storage") or {}).items()
               if rel in typed} if spec.kind == "groups" else {}
    return _storage_entries(described, members, exceptions, typed)


def _member_of(spec: ExportSpec, path: str) -> str:
    """The path of a dataset inside its unit (columns: the file)."""
    inside = path[len(spec.container) + 1:] if spec.container else path
    return inside if spec.kind == "columns" else inside.split("/", 1)[-1]


def _described(record: Mapping[str, Any], dtype: np.dtype, shape: tuple[int, ...] | None | str = "rows") -> Any:
    """:func:`storage_description` of a dataset an export creates from ``record`` (in a file in memory):
    of ``shape``, or for rows one longer than a chunk in each dim. Alike records (the members of
    thousands of sample groups) are made once."""
    key = json.dumps([record, dtype_text(dtype), shape], sort_keys=True)
    if key not in _DESCRIBED:
        if len(_DESCRIBED) >= 4096:
            _DESCRIBED.clear()
        _DESCRIBED[key] = _describe_new(record, dtype, shape)
    return _DESCRIBED[key]


_DESCRIBED: dict[str, Any] = {}


def _describe_new(record: Mapping[str, Any], dtype: np.dtype, shape: tuple[int, ...] | None | str) -> Any:
    h5py = h5py_module()
    if shape == "rows":
        # a dim longer than its chunk (a chunk that spans its dim: 1), within a fixed maximum
        chunks = [0 if c == "=" else c for c in record.get("chunks") or [0] * len(record.get("maxshape") or ())]
        shape = tuple(c + 1 if m in ("=", None) else min(c + 1, int(m))
                      for c, m in zip(chunks, record.get("maxshape") or ()))
    with h5py.File(f"unihub-{uuid.uuid4().hex}.h5", "w", driver="core", backing_store=False) as memory:
        return storage_description(create_stored(memory, "dataset", dtype, shape, record))  # type: ignore[arg-type]


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
