"""Reading an HDF5 file's rows by its :class:`~unihub.formats.hdf5.layout.Plan`: fields, then batches.

Columns and splits are read in slices of whole chunks (about ``slice_bytes``, never a whole
dataset at once), one read per dataset shared by the fields of a compound's members. Groups are
read one group at a time, each member whole. Values convert with :mod:`hdf5_types`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from unihub.errors import FormatError
from unihub.formats.hdf5.dtypes import extract, field_for, h5py_module, is_text, kind, object_array, to_unihub
from unihub.formats.hdf5.layout import Leaf, Plan
from unihub.runtime.memory import rows_for
from unihub.schema.codecs import ScalarCodec
from unihub.schema.unischema import Unischema, UnischemaField

_VLEN_ROW_BYTES = 64  # a guess at one variable-length row, to size slices


def _read_rows(dataset: Any, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of an h5py dataset: where columns and splits are read (tests watch it)."""
    return dataset[start:stop]


def read_whole(dataset: Any) -> np.ndarray:
    """A whole dataset as an array (``()``-shaped for a scalar one)."""
    return dataset[...]


def attribute_array(attrs: Any, name: str) -> np.ndarray:
    """An attribute exactly as stored: an array of its dtype (h5py's ``attrs[name]`` gives ``str`` for
    variable-length strings and numpy scalars that drop the trailing NULs of fixed ones)."""
    h5py = h5py_module()
    attr = attrs.get_id(name)
    dt, shape = attr.dtype, attr.shape
    if dt.subdtype is not None:
        dt, shape = dt.subdtype[0], (*shape, *dt.subdtype[1])
    out = np.zeros(shape, dtype=dt)
    attr.read(out, mtype=h5py.h5t.py_create(attr.dtype))
    return out


def key_field(name: str) -> UnischemaField:
    return UnischemaField(name, np.str_, (), ScalarCodec(np.str_))


# -- fields -------------------------------------------------------------------------------------
def infer_fields(plan: Plan, handle: Any, sample_records: int | None) -> list[UnischemaField]:
    """The Unischema fields of ``plan``: the key field first, then one per leaf (the field a unihub
    export recorded, or one inferred from the leaf's dtype; strings are str when UTF-8)."""
    fields = [key_field(plan.key_field)] if plan.key_field else []
    for leaf in plan.leaves.values():
        if leaf.recorded is not None:
            fields.append(leaf.recorded._replace(name=leaf.field, nullable=leaf.recorded.nullable or leaf.nullable))
            continue
        text = kind(leaf.value_dtype) != "string" or _is_text(plan, handle, leaf, sample_records)
        fields.append(field_for(leaf.field, leaf.value_dtype, leaf.cell, nullable=leaf.nullable, text=text))
    return fields


def _is_text(plan: Plan, handle: Any, leaf: Leaf, sample_records: int | None) -> bool:
    """True when the leaf's strings (of the first ``sample_records`` rows) all decode as UTF-8."""
    budget = math.inf if sample_records is None else sample_records
    for unit in plan.units:
        group = _group(handle, plan, unit)
        if plan.kind == "groups":
            values = _group_value(group, leaf)
            if values is not None and not is_text(extract(values, leaf.member)):
                return False
            budget -= 1
        elif leaf.path in group:
            dataset = group[leaf.path]
            n = int(min(budget, dataset.shape[0]))
            step = slice_rows(dataset, 8 << 20)
            for start in range(0, n, step):
                if not is_text(extract(np.asarray(_read_rows(dataset, start, min(start + step, n))), leaf.member)):
                    return False
            budget -= n
        if budget <= 0:
            break
    return True


def _group(handle: Any, plan: Plan, unit: str) -> Any:
    path = plan.unit_path(unit)
    return handle[path] if path else handle


def _group_value(group: Any, leaf: Leaf, cache: dict[str, np.ndarray] | None = None) -> np.ndarray | None:
    """A groups-layout leaf's whole value in one group (dataset or attribute), or None where absent."""
    if cache is not None and leaf.attr is None and leaf.path in cache:
        return cache[leaf.path]
    try:  # one lookup: "in" and then [] would look twice, for every member of every group
        owner = group[leaf.path] if leaf.path else group
    except KeyError:
        return None
    if leaf.attr is not None:
        return attribute_array(owner.attrs, leaf.attr) if leaf.attr in owner.attrs else None
    value = read_whole(owner)
    if cache is not None:
        cache[leaf.path] = value
    return value


# -- slices ---------------------------------------------------------------------------------------
def row_bytes(dataset: Any) -> int:
    """Bytes of one row of ``dataset`` (a guess for variable-length values)."""
    variable = dataset.dtype.hasobject
    return max(1, (_VLEN_ROW_BYTES if variable else dataset.dtype.itemsize) * math.prod(dataset.shape[1:]))


def slice_rows(dataset: Any, target_bytes: int) -> int:
    """Rows per read: whole chunks adding up to about ``target_bytes`` (at least one chunk)."""
    rows = max(1, target_bytes // row_bytes(dataset))
    if dataset.chunks:
        chunk = dataset.chunks[0]
        rows = max(chunk, rows // chunk * chunk)
    return max(1, min(rows, dataset.shape[0]))


class _Slices:
    """Rows of a dataset, read one aligned slice (:func:`slice_rows`) at a time."""

    def __init__(self, dataset: Any, slice_bytes: int) -> None:
        self.dataset = dataset
        self.step = slice_rows(dataset, slice_bytes)
        self.cached: tuple[int, np.ndarray] | None = None

    def rows(self, start: int, stop: int) -> np.ndarray:
        parts = []
        position = start
        while position < stop:
            first = position // self.step * self.step
            end = min(stop, first + self.step)
            if self.cached is None or self.cached[0] != first:
                self.cached = None  # drop the old slice before reading the next
                try:
                    self.cached = (first, np.asarray(_read_rows(self.dataset, first,
                                                                min(first + self.step, self.dataset.shape[0]))))
                except OSError:  # a damaged chunk somewhere in the slice: read just these rows, a chunk at a time
                    parts.append(self._by_chunk(position, end))
                    position = end
                    continue
            parts.append(self.cached[1][position - first:end - first])
            position = end
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _by_chunk(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` read a chunk at a time, where the slice holding them cannot be read: the rows
        of other chunks are not lost with it, and the error names the dataset and the rows that fail."""
        step = self.dataset.chunks[0] if self.dataset.chunks else stop - start
        parts = []
        for first in range(start // step * step, stop, step):
            try:
                parts.append(np.asarray(_read_rows(self.dataset, max(start, first), min(stop, first + step))))
            except OSError as exc:
                last = min(first + step, self.dataset.shape[0]) - 1
                raise OSError(f"dataset {self.dataset.name!r} rows {first}..{last}: {exc}") from exc
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


# -- units ----------------------------------------------------------------------------------------
def unit_readers(path: str, handle: Any, plan: Plan, schema: Unischema, slice_bytes: int) -> list[Any]:
    """One reader per unit: the file (columns), each split, or all the groups together."""
    if plan.kind == "groups":
        return [_GroupsReader(path, handle, plan, schema)]
    return [_SlicesReader(path, handle, plan, unit, schema, slice_bytes) for unit in plan.units]


def _missing(path: str, field: UnischemaField, where: str) -> FormatError:
    return FormatError(f"{path}: no dataset {field.name!r} for field {field.name!r}{where}", path=path)


class _SlicesReader:
    """The rows of the file (columns layout) or of one split: each field read in aligned slices."""

    def __init__(self, path: str, handle: Any, plan: Plan, unit: str, schema: Unischema, slice_bytes: int) -> None:
        self.plan, self.unit = plan, unit
        group = _group(handle, plan, unit)
        self.length = plan.rows(unit)
        slices: dict[str, _Slices] = {}
        self.columns: dict[str, Any] = {}
        #: bytes of a row, from the datasets' shapes and dtypes (what batches_of starts from)
        self.row_nbytes = 0
        for field in schema:
            leaf = plan.leaves.get(field.name)
            if field.name == plan.key_field:
                self.columns[field.name] = lambda start, stop: [unit] * (stop - start)
            elif leaf is None or leaf.path not in group:
                if not (field.nullable and plan.kind == "splits"):
                    raise _missing(path, field, f" in split {unit!r}" if unit else "")
                self.columns[field.name] = lambda start, stop: [None] * (stop - start)
            else:
                if leaf.path not in slices:
                    slices[leaf.path] = _Slices(group[leaf.path], slice_bytes)
                    self.row_nbytes += row_bytes(group[leaf.path])
                self.columns[field.name] = _column_reader(group, leaf, field, slices[leaf.path], slice_bytes)

    def where(self, start: int, stop: int) -> str:
        rows = f"rows {start}..{stop - 1}"
        return f"split {self.unit!r} {rows}" if self.plan.kind == "splits" else rows

    def rows(self, start: int, stop: int) -> dict[str, Any]:
        return {name: read(start, stop) for name, read in self.columns.items()}


def _column_reader(group: Any, leaf: Leaf, field: UnischemaField, data: _Slices, slice_bytes: int) -> Any:
    """``(start, stop) -> column`` of one field; unihub's own exports add shapes and null masks."""
    dt = leaf.value_dtype
    if leaf.recorded is None:
        return lambda start, stop: to_unihub(extract(data.rows(start, stop), leaf.member), dt, field)
    shapes = group.get(leaf.path + "__shape")
    isnull = group.get(leaf.path + "__isnull")
    shapes_slices = _Slices(shapes, slice_bytes) if shapes is not None else None
    isnull_slices = _Slices(isnull, slice_bytes) if isnull is not None else None

    def read(start: int, stop: int) -> Any:
        values = to_unihub(data.rows(start, stop), dt, field)
        if shapes_slices is not None:
            values = object_array([v.reshape(s) for v, s in zip(values, shapes_slices.rows(start, stop))])
        if isnull_slices is not None:
            nulls = isnull_slices.rows(start, stop)
            if nulls.any():
                values = object_array([None if null else v for v, null in zip(values, nulls)])
        return values

    return read


class _GroupsReader:
    """The rows of a groups layout: one group each, its members read whole."""

    def __init__(self, path: str, handle: Any, plan: Plan, schema: Unischema) -> None:
        self.path, self.plan, self.schema = path, plan, schema
        self.base = _group(handle, plan, "")
        self.length = len(plan.units)
        for field in schema:
            if field.name != plan.key_field and field.name not in plan.leaves and not field.nullable:
                raise _missing(path, field, " in its per-sample groups")

    def where(self, start: int, stop: int) -> str:
        units = self.plan.units
        return f"group {units[start]!r}" if stop - start == 1 else f"groups {units[start]!r}..{units[stop - 1]!r}"

    def rows(self, start: int, stop: int) -> dict[str, Any]:
        columns: dict[str, list[Any]] = {field.name: [] for field in self.schema}
        for unit in self.plan.units[start:stop]:
            group = self.base[unit]
            cache: dict[str, np.ndarray] = {}
            for field in self.schema:
                columns[field.name].append(self._value(unit, group, field, cache))
        return {field.name: _column(field, columns[field.name]) for field in self.schema}

    def _value(self, unit: str, group: Any, field: UnischemaField, cache: dict[str, np.ndarray]) -> Any:
        if field.name == self.plan.key_field:
            return unit
        leaf = self.plan.leaves.get(field.name)
        raw = _group_value(group, leaf, cache) if leaf is not None else None
        if leaf is None or raw is None:
            if not field.nullable:
                raise FormatError(f"{self.path}: group {unit!r} has no {field.name!r}, and field "
                                  f"{field.name!r} is not nullable", path=self.path)
            return None
        return to_unihub(extract(raw, leaf.member)[np.newaxis], leaf.value_dtype, field)[0]


def _column(field: UnischemaField, values: list[Any]) -> Any:
    """Per-row values as a column: one array for fixed-shape numbers without nulls, else per row."""
    if values and field.is_fixed_shape and field.dtype != object and all(v is not None for v in values):
        return np.stack(values) if field.shape else np.array(values, dtype=field.dtype)
    return object_array(values)


class batches_of:  # noqa: N801  (used as a function: ``for start, stop in batches_of(...)``)
    """``(start, stop)`` row ranges of ``reader``: ``batch_size`` rows, or fewer when the rows seen so
    far (:meth:`seen`), or the reader's ``row_nbytes`` before any, say that many would hold more than
    ``batch_bytes``. Without either, the first range is one row."""

    def __init__(self, reader: Any, batch_size: int, batch_bytes: int) -> None:
        self.length, self.batch_size, self.batch_bytes = reader.length, batch_size, batch_bytes
        known = getattr(reader, "row_nbytes", 0)
        self.step = rows_for(batch_size, batch_bytes, known) if known else 1

    def __iter__(self) -> Iterator[tuple[int, int]]:
        start = 0
        while start < self.length:
            stop = min(start + self.step, self.length)
            yield start, stop
            start = stop

    def seen(self, rows: int, nbytes: int) -> None:
        """The last range read held ``rows`` rows of ``nbytes`` bytes."""
        self.step = rows_for(self.batch_size, self.batch_bytes, nbytes / max(1, rows))
