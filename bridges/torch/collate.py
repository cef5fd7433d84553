"""Rows and columns collated into the batches the loaders yield: dicts of field name -> tensor.

Numeric fields stack into tensors; strings, decimals, bytes and nullable cells pass through as lists.
Fields with ``None`` dims are lists of tensors, or with ``variable="pad"`` a zero-padded tensor plus a
boolean ``<field>_mask`` of the same shape. :func:`make_collate` is the loaders' default collate (also a
``collate_fn`` for torch's own ``DataLoader``); :func:`decimal_friendly_collate` is Petastorm's.

torch is imported when a function is called, never when this module is imported.
"""

from __future__ import annotations

import decimal
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from unihub.bridges.torch.tensors import NUMERIC_KINDS, Columns, as_tensor, load_torch
from unihub.errors import InvalidArgumentError, SchemaError

Variable = Literal["list", "pad"]


def check_variable(variable: str) -> None:
    """:class:`~unihub.errors.InvalidArgumentError` unless ``variable`` is one of :data:`Variable`'s."""
    if variable not in ("list", "pad"):
        raise InvalidArgumentError(f"variable must be 'list' or 'pad', got {variable!r}")


def _cell(value: Any) -> Any:
    """One cell of a non-numeric column: a numeric ndarray becomes a tensor, anything else stays."""
    if isinstance(value, np.ndarray) and value.dtype.kind in NUMERIC_KINDS:
        return as_tensor(value)
    return value


def _column(values: Sequence[Any], ragged: bool) -> Any:
    """Row values of one field as a tensor when they stack (same shape, numeric), else a list."""
    torch = load_torch()
    if not values:
        return []
    first = values[0]
    if not ragged:
        if isinstance(first, torch.Tensor):
            if all(isinstance(v, torch.Tensor) and v.shape == first.shape for v in values):
                return torch.stack(list(values))
        elif isinstance(first, (np.ndarray, np.generic)) and first.dtype.kind in NUMERIC_KINDS:
            shape, kind = np.shape(first), first.dtype.kind
            if all(isinstance(v, (np.ndarray, np.generic)) and v.shape == shape and v.dtype.kind == kind
                   for v in values):
                return torch.from_numpy(np.stack(values))
        elif isinstance(first, (bool, int, float)) and all(type(v) is type(first) for v in values):
            return torch.tensor(list(values))
    return [_cell(v) for v in values]


def columns_from_numpy(columns: Mapping[str, Any], cell: Callable[[Any], Any] = _cell) -> Columns:
    """Reader columns as tensors (numeric arrays, no per-row work) or lists (everything else, each
    value through ``cell``)."""
    out: Columns = {}
    for name, column in columns.items():
        if isinstance(column, np.ndarray) and column.dtype.kind in NUMERIC_KINDS:
            out[name] = as_tensor(column)
        else:
            out[name] = [cell(v) for v in column]
    return out


def pad(tensors: Sequence[Any]) -> tuple[Any, Any]:
    """Zero-pad same-rank tensors to the largest size in each dim: ``(padded, mask)``; mask is True on data."""
    torch = load_torch()
    ranks = {t.dim() for t in tensors}
    if len(ranks) != 1:
        raise SchemaError(f"cannot pad tensors of different ranks {sorted(ranks)} into one batch")
    shape = tuple(max(t.shape[d] for t in tensors) for d in range(ranks.pop()))
    out = torch.zeros((len(tensors), *shape), dtype=tensors[0].dtype)
    mask = torch.zeros((len(tensors), *shape), dtype=torch.bool)
    for i, t in enumerate(tensors):
        region = (i, *(slice(0, s) for s in t.shape))
        out[region] = t
        mask[region] = True
    return out, mask


def finalize(columns: Columns, variable: Variable = "list", device: Any = None,
             ragged: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The batch a loader yields: padding (``variable="pad"``) and the move to ``device``.

    With ``variable="pad"``, a ``ragged`` field (``None`` dims) that came as one tensor (a batch
    reader's ``(n, k)`` array) gets an all-True mask, so every batch of it has its ``<field>_mask``."""
    torch = load_torch()
    out: dict[str, Any] = {}
    for name, col in columns.items():
        if isinstance(col, torch.Tensor):
            out[name] = col.to(device) if device is not None else col
            if variable == "pad" and name in ragged:
                out[f"{name}_mask"] = torch.ones(col.shape, dtype=torch.bool, device=out[name].device)
            continue
        if variable == "pad" and col and all(isinstance(v, torch.Tensor) for v in col):
            padded, mask = pad(col)
            if device is not None:
                padded, mask = padded.to(device), mask.to(device)
            out[name], out[f"{name}_mask"] = padded, mask
        elif device is not None:
            out[name] = [v.to(device) if isinstance(v, torch.Tensor) else v for v in col]
        else:
            out[name] = col
    return out


class Collate:
    """Rows (dicts or namedtuples) -> a batch dict; see :func:`make_collate`."""

    def __init__(self, variable: Variable = "list", ragged: Iterable[str] = ()) -> None:
        check_variable(variable)
        self.variable = variable
        self.ragged = frozenset(ragged)

    def with_schema(self, schema: Any) -> Collate:
        """The same collate, told which fields have ``None`` dims so they never stack by chance."""
        ragged = {f.name for f in schema if any(d is None for d in (f.shape or ()))}
        return Collate(self.variable, self.ragged | ragged)

    def columns(self, rows: Sequence[Any]) -> Columns:
        dicts = [r._asdict() if hasattr(r, "_asdict") else r for r in rows]
        if not dicts:
            return {}
        return {name: _column([d[name] for d in dicts], name in self.ragged) for name in dicts[0]}

    def from_columns(self, columns: Mapping[str, Sequence[Any]]) -> Columns:
        """What :meth:`columns` gives for the rows of these columns, without cutting them into
        rows: a numeric array is the tensor its rows would stack into (sharing its memory)."""
        out: Columns = {}
        for name, column in columns.items():
            ragged = name in self.ragged
            if not ragged and isinstance(column, np.ndarray) and column.dtype.kind in NUMERIC_KINDS and len(column):
                out[name] = as_tensor(column)
            else:
                out[name] = _column(list(column), ragged)
        return out

    def __call__(self, rows: Sequence[Any]) -> dict[str, Any]:
        return finalize(self.columns(rows), self.variable, ragged=self.ragged)


def make_collate(*, variable: Variable = "list", pad: bool | None = None) -> Collate:
    """A collate function: numeric fields stacked into tensors, others as lists.

    Variable-shape fields are lists of tensors (``variable="list"``, the default) or padded
    with zeros to the batch maximum plus a ``<field>_mask`` bool tensor (``variable="pad"``
    or ``pad=True``). Also works as ``collate_fn`` of torch's own DataLoader.
    """
    if pad is not None:
        variable = "pad" if pad else "list"
    return Collate(variable)


default_collate_like = make_collate()


def decimal_friendly_collate(batch: Sequence[Any]) -> Any:
    """Petastorm's default collate: torch's ``default_collate``, with ``decimal.Decimal`` values and
    strings kept as they come (torch cannot stack them), mappings and sequences collated item by item.

    Sequences are collated position by position into a list; the decimals or strings at one
    position come as a tuple (of the rows' values), as Petastorm's do; a list of rows of them as a list."""
    torch = load_torch()
    first = batch[0]
    if isinstance(first, decimal.Decimal) or isinstance(first, (str, bytes)):
        return batch if isinstance(batch, tuple) else list(batch)
    if isinstance(first, Mapping):
        return {key: _collated_field(key, [row[key] for row in batch]) for key in first}
    if hasattr(first, "_asdict"):  # a row namedtuple: a dict of its fields, as Petastorm's loaders give
        return decimal_friendly_collate([row._asdict() for row in batch])
    if isinstance(first, Sequence):
        return [decimal_friendly_collate(samples) for samples in zip(*batch)]
    if isinstance(first, np.generic) and first.dtype.kind in NUMERIC_KINDS and \
            all(isinstance(v, np.generic) and v.dtype == first.dtype for v in batch):
        # numpy scalars as one array: torch's default_collate goes through Python ints, and a uint64 past
        # int64's range failed ("an integer is required")
        return torch.from_numpy(np.asarray(batch))
    return torch.utils.data.default_collate(list(batch))


def _collated_field(name: str, values: list[Any]) -> Any:
    """One field's values through :func:`decimal_friendly_collate`; torch's refusal (a null, rows of
    different shapes) names the field, as Petastorm's ``TypeError`` for a null did, in the same built-in."""
    try:
        return decimal_friendly_collate(values)
    except (TypeError, RuntimeError, ValueError) as exc:
        if type(exc) not in (TypeError, RuntimeError, ValueError):
            raise  # one of unihub's, or another with its own arguments: as it is
        raise type(exc)(f"field {name!r}: {exc} (torch's default_collate cannot stack it; make_collate() "
                        "keeps nulls and variable shapes as lists)") from exc


def row_to_tensors(row: Any) -> dict[str, Any]:
    """One row as a dict: numeric values as tensors, others unchanged (for torch's default_collate)."""
    values = row._asdict() if hasattr(row, "_asdict") else dict(row)
    return {name: row_value(value) for name, value in values.items()}


def row_value(value: Any) -> Any:
    """A row's value as :func:`row_to_tensors` gives it: a numeric array or scalar as a tensor."""
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in NUMERIC_KINDS:
        return as_tensor(np.asarray(value))
    return value
