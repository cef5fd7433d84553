"""TransformSpec: a user function run in the workers, and the schema change it makes.

As in Petastorm: ``TransformSpec(func, edit_fields, removed_fields, selected_fields)``.
``make_reader`` calls ``func(row_dict) -> row_dict`` per row; ``make_batch_reader`` calls
``func(pandas.DataFrame) -> DataFrame`` per batch (Petastorm's contract), or with
``TransformSpec(..., batch_format="numpy")`` ``func(dict of numpy columns) -> dict``.
``edit_fields`` adds or replaces fields (``UnischemaField`` or ``(name, dtype, shape,
nullable)`` tuples), ``removed_fields`` drops them, ``selected_fields`` picks and orders
the output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from unihub.errors import SchemaError
from unihub.formats.schema import Unischema, UnischemaField


@dataclass(frozen=True)
class TransformSpec:
    """What to run on rows or batches in the workers, and how it changes the schema."""

    func: Callable[[Any], Any] | None = None
    edit_fields: Sequence[Any] | None = None
    removed_fields: Sequence[str] | None = None
    selected_fields: Sequence[str] | None = None
    batch_format: Literal["pandas", "numpy"] = "pandas"


def _as_field(spec: Any) -> UnischemaField:
    if isinstance(spec, UnischemaField):
        return spec
    if isinstance(spec, tuple) and len(spec) in (3, 4):
        name, dtype, shape = spec[:3]
        nullable = spec[3] if len(spec) == 4 else False
        return UnischemaField(name, dtype, shape, None, nullable)
    raise SchemaError(f"edit_fields entries are UnischemaField or (name, dtype, shape, nullable), got {spec!r}")


def transform_schema(schema: Unischema, spec: TransformSpec | None) -> Unischema:
    """The schema of what the transform returns."""
    if spec is None:
        return schema
    fields = dict(schema.fields)
    for name in spec.removed_fields or ():
        if name not in fields:
            raise SchemaError(f"TransformSpec removes {name!r}, which is not among the read fields {list(fields)}")
        del fields[name]
    for edit in spec.edit_fields or ():
        field = _as_field(edit)
        fields[field.name] = field
    if spec.selected_fields is not None:
        missing = [n for n in spec.selected_fields if n not in fields]
        if missing:
            raise SchemaError(f"TransformSpec selects {missing}, which the transform does not produce; "
                              f"it produces {list(fields)}")
        fields = {n: fields[n] for n in spec.selected_fields}
    return Unischema(f"{schema.name}_transformed", list(fields.values()))


def apply_to_rows(spec: TransformSpec, out_schema: Unischema, columns: dict[str, Any], num_rows: int) -> dict[str, Any]:
    """Run ``spec.func`` on each row; collect the output fields into columns."""
    names = list(columns)
    outputs: dict[str, list[Any]] = {f: [] for f in out_schema.fields}
    for values in zip(*(columns[n] for n in names)) if names else ((),) * num_rows:
        row = dict(zip(names, values))
        if spec.func is not None:
            row = spec.func(row)
            if not isinstance(row, dict):
                raise SchemaError(f"the transform function must return a dict, it returned {type(row).__name__}")
        for name in outputs:
            if name not in row:
                raise SchemaError(f"the transform's output lacks field {name!r} (it returned {sorted(row)}); "
                                  "declare removed fields in removed_fields")
            outputs[name].append(row[name])
    return {name: _stack(out_schema[name], values) for name, values in outputs.items()}


def apply_to_batch(spec: TransformSpec, out_schema: Unischema, columns: dict[str, Any]) -> dict[str, Any]:
    """Run ``spec.func`` on a whole batch (pandas DataFrame or dict of numpy columns)."""
    if spec.func is None:
        return {name: columns[name] for name in out_schema.fields}
    if spec.batch_format == "numpy":
        result = spec.func(dict(columns))
        if not isinstance(result, dict):
            raise SchemaError(f"the transform function must return a dict, it returned {type(result).__name__}")
    else:
        import pandas as pd

        frame = pd.DataFrame({name: list(values) if getattr(values, "ndim", 1) > 1 else values
                              for name, values in columns.items()})
        result_frame = spec.func(frame)
        if not isinstance(result_frame, pd.DataFrame):
            raise SchemaError(f"the transform function must return a DataFrame, it returned "
                              f"{type(result_frame).__name__}")
        result = {name: result_frame[name].to_numpy() for name in result_frame.columns}
    missing = [n for n in out_schema.fields if n not in result]
    if missing:
        raise SchemaError(f"the transform's output lacks fields {missing}")
    return {name: _stack(out_schema[name], result[name]) for name in out_schema.fields}


def _stack(field: UnischemaField, values: Any) -> Any:
    """Values of one output column as a numpy array: stacked when every row has the field's shape."""
    if isinstance(values, np.ndarray) and values.dtype != object:
        return values
    items = list(values)
    if field.shape and field.is_fixed_shape and items and all(isinstance(v, np.ndarray) for v in items):
        try:
            return np.stack(items)
        except ValueError:
            pass
    if not field.shape and items and all(v is not None for v in items) and field.dtype != object:
        return np.asarray(items, dtype=field.dtype)
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out
