"""The rows the torch datasets hand torch's ``default_collate``, and the collate functions registered for them.

Rows cut from a batch's columns (:class:`SamplerRow`), the dicts a ``TorchMapDataset``'s ``transform``
returns in a worker (:class:`TransformedRow`) and a whole sampler batch sent as markers
(:class:`SamplerBatch`) are registered in torch's ``default_collate_fn_map``: its default collate then
hands their columns over as slices (or stacks them) into one storage of the worker's reused shared memory
(``shared_batches.py``), rather than stacking every field of every row into new shared memory. The
batches are the ones torch's collate of plain dicts gives (same keys, dtypes, shapes and values); rows
that were changed, mixed or reordered, and collate maps of the user's own, get torch's collate.

torch is imported when a function is called, never when this module is imported.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from unihub.bridges.torch import _torch_private as torch_private
from unihub.bridges.torch.shared_batches import worker_pool
from unihub.bridges.torch.tensors import Columns, copy_into, empty_in_pool, from_worker, load_torch
from unihub.readers.batching import columns_length


class _CompactWhenPickled(dict[str, Any]):
    """A dict whose tensors may view a whole batch's columns: pickled, a plain dict of tensors that
    hold only their own values (torch would send a view's whole storage)."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return dict, (_compact_row(self),)


class _Row(_CompactWhenPickled):
    """A row the datasets hand torch's collate; copied, a plain dict, or in a torch worker one that
    pickles compact: torch's ``default_convert`` copies each item a worker sends without collating
    it (``batch_size=None``), puts the row's values back into the copy, and pickles that."""

    __slots__ = ()

    def __copy__(self) -> dict[str, Any]:
        return _CompactWhenPickled(self) if load_torch().utils.data.get_worker_info() is not None else dict(self)


class SamplerRow(_Row):
    """A row cut from a batch's columns (``TorchMapDataset``'s sampler batch, ``TorchIterableDataset``'s
    reader batch): a dict that also knows the columns it was cut from and where, so that torch's
    default collate can hand those columns over in runs (:func:`collate_sampler_rows`) instead of
    stacking the rows back into new memory. It pickles and copies as a plain dict."""

    __slots__ = ("columns", "cells", "index")
    columns: Columns  # the batch the row was cut from
    cells: dict[str, Sequence[Any]]  # its columns cut into rows: the cells every row holds
    index: int  # the row's place in them


def _compact_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` as a plain dict whose tensors hold only their own values: a row's tensors view its
    batch's whole columns, and pickled for another process torch would send those whole storages."""
    torch = load_torch()
    return {name: value.clone() if isinstance(value, torch.Tensor) and
            value.untyped_storage().nbytes() > value.nbytes else value for name, value in row.items()}


def rows_of_columns(columns: Columns, count: int, row_type: type[dict[str, Any]]) -> list[Any]:
    """``count`` rows of ``columns`` as dicts of ``row_type`` (tensor rows are views of the columns)."""
    cells = {name: (list(col.unbind(0)) if isinstance(col, load_torch().Tensor) else col) for name, col in columns.items()}
    rows = []
    for i in range(count):
        row = row_type({name: values[i] for name, values in cells.items()})
        if isinstance(row, SamplerRow):
            row.columns, row.cells, row.index = columns, cells, i
        rows.append(row)
    return rows


Run = tuple[Columns, int, int]  # columns, first row, row after the last


def _row_runs(rows: Sequence[Any]) -> list[Run] | None:
    """``rows`` as runs of consecutive rows of tensor columns, when each row is a :class:`SamplerRow`
    exactly as cut (the same cell objects, no key added or removed) and every run's columns have the
    first's names, dtypes and row shapes: then stacking the rows would rebuild those slices. Otherwise None."""
    torch = load_torch()
    runs: list[list[Any]] = []
    first: Columns | None = None
    for row in rows:
        if type(row) is not SamplerRow:
            return None
        columns, cells, index = row.columns, row.cells, row.index
        if not runs or columns is not runs[-1][0] or index != runs[-1][2]:
            if not all(isinstance(c, torch.Tensor) for c in columns.values()):
                return None
            if first is None:
                first = columns
            elif list(columns) != list(first) or any(
                    columns[n].dtype != first[n].dtype or columns[n].shape[1:] != first[n].shape[1:] for n in first):
                return None
            runs.append([columns, index, index])
        if len(row) != len(cells):
            return None
        for name, values in cells.items():
            if row.get(name) is not values[index]:
                return None
        runs[-1][2] += 1
    return [(columns, start, stop) for columns, start, stop in runs]


def _whole_columns(rows: Sequence[Any]) -> Columns | None:
    """The columns ``rows`` were cut from, when ``rows`` are all of them, in order (see :func:`_row_runs`)."""
    runs = _row_runs(rows) if rows else None
    return None if runs is None else _whole(runs)


def _whole(runs: list[Run]) -> Columns | None:
    """The columns of ``runs`` when they are one run of all their rows, in order."""
    if len(runs) != 1:
        return None
    columns, start, stop = runs[0]
    return columns if start == 0 and stop == columns_length(columns) else None


def _joined_runs(runs: list[Run]) -> Columns:
    """The runs' rows as columns: in a torch worker, in one storage of its pool (one copy, and the
    batch leaves the worker without another); elsewhere in new memory, as stacking gives."""
    torch = load_torch()
    total = sum(stop - start for _, start, stop in runs)
    first = runs[0][0]
    shapes = {name: (first[name].dtype, (total, *first[name].shape[1:])) for name in first}
    in_worker = torch.utils.data.get_worker_info() is not None
    out = empty_in_pool(shapes) if in_worker else {name: torch.empty(shape, dtype=dtype)
                                                   for name, (dtype, shape) in shapes.items()}
    for name, tensor in out.items():
        at = 0
        for columns, start, stop in runs:
            copy_into(tensor[at:at + stop - start], columns[name][start:stop])
            at += stop - start
    return worker_pool().sending(out) if in_worker else out


def collate_sampler_rows(rows: Sequence[Any], *, collate_fn_map: Any = None) -> Any:
    """torch's default collate for :class:`SamplerRow` batches: the slices of the columns the rows
    were cut from, joined (equal to the stacked rows: same dtypes, shapes and values), in a torch
    worker into the worker's reused shared memory (shared_batches.py) rather than the new
    shared memory torch's collate allocates for every field of every batch. Rows that were changed,
    mixed or reordered, and a ``collate_fn_map`` that collates tensors its own way, get torch's
    collate of plain dicts."""
    collate_fn_map, tensors_as_torch = _collate_map(collate_fn_map)
    runs = _row_runs(rows) if rows and tensors_as_torch else None
    if runs is None:
        return _torch_collate(rows, collate_fn_map)
    whole = _whole(runs)
    if whole is not None and load_torch().utils.data.get_worker_info() is not None:
        return from_worker(dict(whole))  # whole columns (a sampler batch): copied into the pool once
    return _joined_runs(runs)


class TransformedRow(_Row):
    """A row a ``TorchMapDataset``'s ``transform`` returned (a dict), in a torch worker: torch's
    default collate stacks its same-shaped tensors into one storage of the worker's reused shared
    memory (:func:`collate_transformed_rows`), not into new shared memory per field. It pickles and
    copies as a plain dict."""

    __slots__ = ()


def collate_transformed_rows(rows: Sequence[Any], *, collate_fn_map: Any = None) -> Any:
    """torch's default collate for :class:`TransformedRow` batches in a worker: the fields whose
    values are CPU tensors of one dtype and shape are stacked (``torch.stack``, as torch does) into one
    storage of the worker's pool; the others are torch's collate of them. Equal to torch's collate of
    plain dicts, which rows of different keys, other collate maps and the main process get."""
    torch = load_torch()
    collate_fn_map, tensors_as_torch = _collate_map(collate_fn_map)
    keys = list(rows[0]) if rows else []
    if (not rows or not tensors_as_torch or torch.utils.data.get_worker_info() is None
            or any(not isinstance(row, dict) or list(row) != keys for row in rows)):
        return _torch_collate(rows, collate_fn_map)
    shapes = {}
    for key in keys:
        first = rows[0][key]
        if _stacks_into_pool(first, (row[key] for row in rows)):
            shapes[key] = (first.dtype, (len(rows), *first.shape))
    if not shapes:
        return _torch_collate(rows, collate_fn_map)
    stacked = empty_in_pool(shapes)
    for key, out in stacked.items():
        torch.stack([row[key] for row in rows], 0, out=out)
    return worker_pool().sending({key: stacked[key] if key in stacked else
                                  torch_private.collate([row[key] for row in rows], collate_fn_map) for key in keys})


def _stacks_into_pool(first: Any, values: Iterable[Any]) -> bool:
    """Whether a transformed field's ``values`` (``first`` the first row's) stack into the pool as torch's
    collate stacks them: plain strided CPU tensors of one dtype and shape, none requiring grad."""
    torch = load_torch()
    return type(first) is torch.Tensor and first.device.type == "cpu" and not first.requires_grad and \
        first.layout == torch.strided and all(
            type(value) is torch.Tensor and value.dtype == first.dtype and value.shape == first.shape
            and value.device.type == "cpu" and not value.requires_grad for value in values)


def _collate_map(collate_fn_map: Any) -> tuple[Any, bool]:
    """The collate map torch's collate was called with (its default for None), and whether it collates
    tensors as torch's default does (otherwise the rows are left to it)."""
    collate_fn_map = torch_private.default_collate_fn_map() if collate_fn_map is None else collate_fn_map
    return collate_fn_map, torch_private.collates_tensors_as_torch(collate_fn_map)


def _torch_collate(rows: Sequence[Any], collate_fn_map: Any) -> Any:
    """torch's own collate of ``rows``, this module's rows as the plain dicts they stand for."""
    return torch_private.collate([dict(row) if isinstance(row, _Row) else row for row in rows], collate_fn_map)


class SamplerBatch:
    """A ``TorchMapDataset`` sampler batch that goes from ``__getitems__`` straight to torch's
    ``default_collate`` in a worker, as the list of one such marker per row: the collate
    (:func:`collate_sampler_batch`) hands its columns over whole, as collating its rows would, without
    cutting them into 64 row dicts to join back (~115 µs a batch, ~7% of a map worker's time)."""

    __slots__ = ("columns",)

    def __init__(self, columns: Columns) -> None:
        self.columns = columns


def straight_to_default_collate(caller: Any) -> bool:
    """Whether ``caller`` (a frame) is torch's map fetcher in a worker, which collates what it gets with
    ``default_collate`` and shows it to nothing else: then a sampler batch may go as markers."""
    if not torch_private.map_fetcher_collating_by_default(caller):
        return False
    try:
        collate_fn_map = torch_private.default_collate_fn_map()
    except ImportError:  # a torch without the collate map: rows, which its collate takes as dicts
        return False
    return _collate_map(None)[1] and collate_fn_map.get(SamplerBatch) is collate_sampler_batch


def collate_sampler_batch(markers: Sequence[Any], *, collate_fn_map: Any = None) -> Any:
    """torch's default collate of a sampler batch sent as :class:`SamplerBatch` markers: its columns,
    into the worker's pool, exactly what :func:`collate_sampler_rows` gives for its rows; anything else
    (markers of several batches, a collate map that stacks tensors its own way) as those rows."""
    torch = load_torch()
    first = markers[0]
    if all(m is first for m in markers) and len(markers) == columns_length(first.columns) \
            and all(isinstance(c, torch.Tensor) for c in first.columns.values()) \
            and _collate_map(collate_fn_map)[1] and torch.utils.data.get_worker_info() is not None:
        return from_worker(dict(first.columns))  # what collate_sampler_rows gives a whole batch's rows
    cut: dict[int, list[Any]] = {}  # each batch's rows, cut once
    rows = []
    for i, marker in enumerate(markers):
        if id(marker) not in cut:
            cut[id(marker)] = rows_of_columns(marker.columns, columns_length(marker.columns), SamplerRow)
        rows.append(cut[id(marker)][i])
    return collate_sampler_rows(rows, collate_fn_map=collate_fn_map)


def register_sampler_collate() -> None:
    """Teach torch's ``default_collate`` :class:`SamplerRow` (its documented extension point,
    ``default_collate_fn_map``); a torch without it collates the rows as plain dicts."""
    try:
        default_collate_fn_map = torch_private.default_collate_fn_map()
    except ImportError:
        return
    default_collate_fn_map.setdefault(SamplerRow, collate_sampler_rows)
    default_collate_fn_map.setdefault(TransformedRow, collate_transformed_rows)
    default_collate_fn_map.setdefault(SamplerBatch, collate_sampler_batch)
    default_collate_fn_map.setdefault(np.datetime64, collate_times)
    default_collate_fn_map.setdefault(np.timedelta64, collate_times)


def collate_times(values: Sequence[Any], *, collate_fn_map: Any = None) -> list[Any]:
    """torch's default collate of a date, timestamp or duration field: the values as a list, as unihub's
    loaders (and Petastorm's) pass them; torch has no such type, and refused numpy's with a ``TypeError``."""
    return list(values)
