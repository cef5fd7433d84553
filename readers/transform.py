"""TransformSpec: a user function run in the workers, and the schema change it makes.

As in Petastorm: ``TransformSpec(func, edit_fields, removed_fields, selected_fields)``.
``make_reader`` calls ``func(row_dict) -> row_dict`` per row; ``make_batch_reader`` calls
``func(pandas.DataFrame) -> DataFrame`` per batch (Petastorm's contract), or with
``TransformSpec(..., batch_format="numpy")`` ``func(dict of numpy columns) -> dict``.
``edit_fields`` adds or replaces fields (``UnischemaField`` or ``(name, dtype, shape,
nullable)`` tuples, see :func:`edit_field`), ``removed_fields`` drops them, ``selected_fields``
picks and orders the output (pass one of ``removed_fields`` and ``selected_fields``).

The output schema follows Petastorm's ``transform_schema``: the fields kept in their order,
then the edited fields in ``edit_fields`` order; names in ``removed_fields`` or
``selected_fields`` that are not there are ignored with a warning.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from unihub.errors import SchemaError
from unihub.schema.unischema import Unischema, UnischemaField


@dataclass(frozen=True)
class TransformSpec:
    """What to run on rows or batches in the workers, and how it changes the schema."""

    func: Callable[[Any], Any] | None = None
    edit_fields: Sequence[Any] | None = None
    removed_fields: Sequence[str] | None = None
    selected_fields: Sequence[str] | None = None
    batch_format: Literal["pandas", "numpy"] = "pandas"

    def __post_init__(self) -> None:
        if self.removed_fields is not None and self.selected_fields is not None:
            raise SchemaError("TransformSpec takes removed_fields or selected_fields, not both")
        if self.batch_format not in ("pandas", "numpy"):
            raise SchemaError(f"TransformSpec batch_format must be 'pandas' or 'numpy', got {self.batch_format!r}")
        if self.func is not None and not callable(self.func):
            raise SchemaError(f"TransformSpec func must be callable, got {self.func!r}")


def edit_field(name: str, numpy_dtype: Any, shape: Sequence[int | None], nullable: bool = False) -> tuple[Any, ...]:
    """An ``edit_fields`` entry: ``(name, numpy_dtype, shape, nullable)`` (Petastorm's helper)."""
    return name, numpy_dtype, tuple(shape), nullable


def _as_field(spec: Any) -> UnischemaField:
    if isinstance(spec, UnischemaField):
        return spec
    if isinstance(spec, tuple) and len(spec) in (3, 4):
        name, dtype, shape = spec[:3]
        nullable = spec[3] if len(spec) == 4 else False
        return UnischemaField(name, dtype, shape, None, nullable)
    raise SchemaError(f"edit_fields entries are UnischemaField or (name, dtype, shape, nullable), got {spec!r}")


def transform_schema(schema: Unischema, transform_spec: TransformSpec | None) -> Unischema:
    """The schema of what the transform returns (Petastorm's argument names)."""
    spec = transform_spec
    if spec is None:
        return schema
    removed = set(spec.removed_fields or ())
    unknown = sorted(removed - set(schema.fields))
    if unknown:
        warnings.warn("remove_fields specified some field names that are not part of the schema. These field "
                      f"names will be ignored: TransformSpec removed_fields names {unknown}, which are not among "
                      f"the read fields {list(schema.fields)}", stacklevel=3)
    edits = [_as_field(edit) for edit in spec.edit_fields or ()]
    excluded = removed | {f.name for f in edits}
    fields = [f for f in schema if f.name not in excluded] + edits
    if spec.selected_fields is not None:
        selected = list(spec.selected_fields)
        unknown = sorted(set(selected) - {f.name for f in fields})
        if unknown:
            warnings.warn("selected_fields specified some field names that are not part of the schema. These "
                          f"field names will be ignored: TransformSpec selected_fields names {unknown}, which the "
                          f"transform does not produce (it produces {[f.name for f in fields]})", stacklevel=3)
        by_name = {f.name: f for f in fields}
        fields = [by_name[n] for n in dict.fromkeys(selected) if n in by_name]
    return Unischema(f"{schema.name}_transformed", fields, attributes=schema.attribute_names)


def apply_to_rows(spec: TransformSpec, out_schema: Unischema, columns: dict[str, Any], num_rows: int) -> dict[str, Any]:
    """Run ``spec.func`` on each row; collect the output fields into columns."""
    if spec.func is None:
        return _select(columns, out_schema)
    names = list(columns)
    outputs: dict[str, list[Any]] = {f: [] for f in out_schema.fields}
    for values in zip(*(columns[n] for n in names)) if names else ((),) * num_rows:
        row = spec.func(dict(zip(names, values)))
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
        return _select(columns, out_schema)
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


def _select(columns: dict[str, Any], out_schema: Unischema) -> dict[str, Any]:
    missing = [n for n in out_schema.fields if n not in columns]
    if missing:
        raise SchemaError(f"TransformSpec without func cannot produce the edited fields {missing}")
    return {name: columns[name] for name in out_schema.fields}


def _declared(natural: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Numbers in the declared ``dtype`` where they fit it (Python ints into an int32 field; floats into float32,
    rounded as a cast rounds); numbers out of its range stay as the function returned them, as Petastorm passed
    them on, rather than raise ``OverflowError`` or overflow to inf (a plain ``astype`` would wrap ints round)."""
    with np.errstate(over="ignore", invalid="ignore"):
        cast = natural.astype(dtype)
    fits = np.array_equal(cast, natural) if dtype.kind in "iu" else \
        np.array_equal(np.isinf(cast), np.isinf(natural)) if dtype.kind == "f" else True
    return cast if fits else natural


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
        natural = np.asarray(items)
        # the declared type where that keeps the values (Python ints into an int32 field); a value of another
        # kind (a float where the field says int, a string) stays as the function returned it, as Petastorm
        # passed it on and as a batch transform's columns stay: a cast would change it silently
        if natural.dtype != object and not np.can_cast(natural.dtype, field.dtype, casting="same_kind"):
            return natural
        return _declared(natural, field.dtype) if natural.dtype.kind in "iuf" else np.asarray(items, dtype=field.dtype)
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out
