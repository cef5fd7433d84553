"""``unihub verify`` for HDF5: the file as h5py reads it, and a unihub dataset in that same form.

:func:`reference_records` reads every row with h5py itself (slices of datasets, whole members of a
group, attributes as stored), none of unihub's conversions, and gives each value in the exact form of
:func:`~unihub.formats.hdf5.dtypes.native`: a record is ``{name: value}``, with one entry per
compound member (``tracks.x``), per attribute of a groups layout (``@label``, ``image@units``), per
companion dataset of unihub's own exports (``x__isnull``), and the split or group name under the key
field. :func:`native_records` turns a unihub dataset's rows into those records with the functions an
export writes with (:mod:`hdf5_storage`), so a value the ingest changed, a field it dropped or an
enum mapping it lost shows up as a difference.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from types import EllipsisType
from typing import Any

import numpy as np

from unihub.errors import FormatError
from unihub.formats.hdf5.dtypes import extract, member_dtype, native, to_h5
from unihub.formats.hdf5.files import open_hdf5
from unihub.formats.hdf5.layout import Plan
from unihub.formats.hdf5.read import attribute_array
from unihub.formats.hdf5.selection import matches, plan_file
from unihub.formats.hdf5.storage import ExportSpec, asked_of, export_spec, generic_value, storage_of, storage_rows
from unihub.schema.unischema import Unischema

_ROWS = 256  # rows read or converted at a time
Record = dict[str, Any]


def reference_records(files: Iterable[str], options: Mapping[str, Any]) -> Iterator[tuple[str, Record]]:
    """Every row of ``files`` as h5py reads it, in ingest order: ``(where, record)``."""
    for path in files:
        with open_hdf5(path) as handle:
            plan = plan_file(path, handle, options)
            if plan.kind == "groups":
                yield from _group_records(path, handle, plan)
            else:
                for unit in plan.units:
                    yield from _slice_records(path, handle, plan, unit)


def _read(path: str, dataset: Any, rows: slice | EllipsisType) -> Any:
    """``dataset[rows]``; what h5py cannot read (a damaged chunk) is a FormatError naming the file,
    the dataset and the rows."""
    try:
        return dataset[rows]
    except OSError as exc:
        where = "" if rows is Ellipsis else f" rows {rows.start}..{rows.stop - 1}"
        raise FormatError(f"{path}: h5py cannot read dataset {dataset.name!r}{where}: {exc}", path=path) from exc


def _slice_records(path: str, handle: Any, plan: Plan, unit: str) -> Iterator[tuple[str, Record]]:
    name = os.path.basename(path)
    group = handle[plan.unit_path(unit)] if plan.unit_path(unit) else handle
    where = f"{name} split {unit!r} row" if plan.kind == "splits" else f"{name} row"
    present = [leaf for leaf in plan.leaves.values() if leaf.path in group]
    companions = [c for leaf in present if leaf.recorded is not None for c in plan.companions.get(leaf.field, ())
                  if c in group]
    for start in range(0, plan.rows(unit), _ROWS):
        stop = min(start + _ROWS, plan.rows(unit))
        data = {p: _read(path, group[p], slice(start, stop)) for p in {leaf.path for leaf in present} | set(companions)}
        for j in range(stop - start):
            record: Record = {plan.key_field: unit} if plan.key_field else {}
            for leaf in present:
                record[leaf.field] = native(extract(data[leaf.path], leaf.member)[j, ...], leaf.value_dtype)
            for companion in companions:
                record[companion] = native(data[companion][j, ...], group[companion].dtype)
            yield f"{where} {start + j}", record


def _group_records(path: str, handle: Any, plan: Plan) -> Iterator[tuple[str, Record]]:
    name = os.path.basename(path)
    base = handle[plan.container] if plan.container else handle
    for unit in plan.units:
        group = base[unit]
        record: Record = {plan.key_field: unit} if plan.key_field else {}
        for leaf in plan.leaves.values():
            if leaf.path and leaf.path not in group:
                continue
            if leaf.attr is None:
                raw = _read(path, group[leaf.path], ...)
            else:
                owner = group[leaf.path] if leaf.path else group
                if leaf.attr not in owner.attrs:
                    continue
                raw = attribute_array(owner.attrs, leaf.attr)
            record[leaf.field] = native(extract(raw, leaf.member), leaf.value_dtype)
        yield f"{name} group {unit!r}", record


# -- unihub rows in the same form ------------------------------------------------------------------
def verify_spec(schema: Unischema, extra: Mapping[str, Any], options: Mapping[str, Any]) -> ExportSpec:
    """How an export of the dataset is written (the options: the reading options of the HDF5 side and
    what that file says it was written with), narrowed to the fields the reading options select."""
    source = extra.get("hdf5") if extra.get("source_format") == "hdf5" else None
    recorded = dict((source or {}).get("layout") or {})
    layout = options["layout"] if options.get("layout") not in (None, "auto") else recorded.get("kind", "columns")
    spec = export_spec(schema, layout=layout, key_field=options.get("key_field"), source=source,
                       images=options.get("images") or "bytes")
    spec.asked = asked_of(options)
    spec.generic = [f for f in spec.generic if _wanted(f.name, options)]
    spec.typed = [t for t in spec.typed if all(_wanted(name, options) for name, _ in t.members)]
    return spec


def native_records(schema: Unischema, rows: Iterable[Mapping[str, Any]], extra: Mapping[str, Any],
                   options: Mapping[str, Any]) -> Iterator[Record]:
    """The rows of a unihub dataset as :func:`reference_records` reads an export of them."""
    spec = verify_spec(schema, extra, options)
    splits = options.get("split")
    splits = [splits] if isinstance(splits, str) else splits
    key = spec.key_field  # None for the columns layout, which split= does not apply to
    if spec.kind == "groups" and key is not None and key not in schema.fields:  # the writer names the groups
        rows = ({**row, key: f"sample_{i:08d}"} for i, row in enumerate(rows))
    chunk: list[Mapping[str, Any]] = []
    for row in rows:
        if splits is None or (key is not None and row.get(key) in splits):
            chunk.append(row)
        if len(chunk) == _ROWS:
            yield from _chunk_records(spec, chunk)
            chunk = []
    yield from _chunk_records(spec, chunk)


def _wanted(name: str, options: Mapping[str, Any]) -> bool:
    fields = options.get("fields")
    if fields is None:
        return True
    return any(matches(name, item.strip("/")) for item in ([fields] if isinstance(fields, str) else fields))


def _typed_values(records: list[Record], chunk: list[Mapping[str, Any]], name: str, dt: Any, apart: bool) -> None:
    """The values of the typed leaf ``name`` of dtype ``dt`` into ``records``; one row at a time where each
    row is a dataset of its own (``apart``: groups), or where the rows' shapes differ (the files of a folder
    or the splits of a file, whose datasets differ in shape), else the chunk's rows as one dataset."""
    present = [i for i, row in enumerate(chunk) if row.get(name) is not None]
    if apart or len({np.shape(chunk[i][name]) for i in present}) > 1:
        for i in present:
            records[i][name] = native(to_h5([chunk[i][name]], dt, f"field {name!r}")[0, ...], dt)
        return
    values = to_h5([chunk[i][name] for i in present], dt, f"field {name!r}")
    for k, i in enumerate(present):
        records[i][name] = native(values[k, ...], dt)


def _chunk_records(spec: ExportSpec, chunk: list[Mapping[str, Any]]) -> Iterator[Record]:
    """A chunk of rows as records: each typed leaf and each stored dataset, None rows left out."""
    if not chunk:
        return
    records: list[Record] = [{spec.key_field: row.get(spec.key_field)} if spec.key_field else {} for row in chunk]
    for typed in spec.typed:
        for name, member in typed.members:
            _typed_values(records, chunk, name, member_dtype(typed.dtype, member), spec.kind == "groups")
    for f in spec.generic:
        if spec.kind == "groups":
            for record, row in zip(records, chunk):
                if row.get(f.name) is not None:
                    value = generic_value(f, row[f.name], spec.images)
                    record[f.name] = native(value, value.dtype)
            continue
        storage = storage_of(f, spec.images)
        datasets = storage.datasets()
        for dataset, stored in storage_rows(storage, [row.get(f.name) for row in chunk], len(chunk)).items():
            for j, record in enumerate(records):
                record[dataset] = native(stored[j, ...], datasets[dataset][0])
    yield from records

