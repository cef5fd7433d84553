"""Numpy columns into the flat arrays that cross into TensorFlow through ``Dataset.from_generator``: a
dense column, or flat values plus nested row lengths, for each field, then the nullable fields' masks.

Values TensorFlow cannot take (a null without a mask, a date outside int64 nanoseconds, rows of
different shapes in a dense field) are a :class:`~unihub.errors.ValidationError` or
:class:`~unihub.errors.SchemaError` naming the field and row.
"""

from __future__ import annotations

import decimal
from collections.abc import Sequence
from typing import Any

import numpy as np

from unihub.bridges.tf.plans import PRESENT_SUFFIX, Columns, FieldPlan, fill_value, load_tf
from unihub.errors import SchemaError, UnihubError, ValidationError
from unihub.schema.arrow_numpy import joined_dtype
from unihub.schema.validation import shape_matches


def null_error(name: str, row: int) -> ValidationError:
    """A null that TensorFlow cannot take (no mask with Petastorm's types), naming the field, the row and the ways out."""
    return ValidationError(f"field {name!r}, row {row} of a batch read: a null, which TensorFlow tensors cannot hold, "
                           "and Petastorm's types (petastorm_types=True) give it no mask; read with "
                           f"petastorm_types=False (nulls filled, and a '{name}{PRESENT_SUFFIX}' mask), fill it with a "
                           "TransformSpec, or leave the field out with schema_fields=", field=name, row=row)


def present_mask(column: Any) -> np.ndarray:
    """Where ``column`` holds a value: only an object column holds nulls (None)."""
    if isinstance(column, np.ndarray) and column.dtype == object:
        return np.fromiter((v is not None for v in column), dtype=bool, count=len(column))
    return np.ones(len(column), dtype=bool)


def rows_to_columns(plans: Sequence[FieldPlan], rows: list[Any]) -> Columns:
    """A chunk of row namedtuples as numpy columns (dense where the field's shape is fixed; nulls as
    None in an object column)."""
    columns: Columns = {}
    for plan, values in zip(plans, zip(*rows)):
        dense = not plan.ragged_rank and not any(v is None for v in values)
        if plan.field.shape and dense:  # fixed shape (numbers or strings): one dense array
            columns[plan.name] = _stacked(plan, values)
        elif plan.np_dtype is not None and dense:
            columns[plan.name] = np.asarray(values)
        else:
            column = np.empty(len(values), dtype=object)
            for i, value in enumerate(values):
                column[i] = value
            columns[plan.name] = column
    return columns


def encode_values(plan: FieldPlan, column: np.ndarray) -> np.ndarray:
    """A dense column in the field's transport dtype (tf.string values as an object array)."""
    if column.dtype == object and not (present := present_mask(column)).all():
        raise null_error(plan.name, int(np.flatnonzero(~present)[0]))
    if column.dtype == object and plan.field.shape and column.ndim == 1 and len(column) and \
            isinstance(column[0], (np.ndarray, list, tuple)):  # not a ragged field's flat values (bytes kept whole)
        column = _stacked(plan, list(column))  # fixed-shape arrays one per row
    if plan.np_dtype is None:
        if plan.field.numpy_dtype is decimal.Decimal:
            return np.array([str(v) for v in column.ravel()], dtype=object).reshape(column.shape)
        return column
    return _as_numbers(plan, column, plan.np_dtype)


def _as_numbers(plan: FieldPlan, column: np.ndarray, np_dtype: np.dtype) -> np.ndarray:
    """A dense column of a numeric field (dates and durations as int64 nanoseconds) in ``np_dtype``."""
    if column.dtype == object and plan.field.numpy_dtype in (np.datetime64, np.timedelta64) and len(column):
        # their scalars (numpy's, datetime.date/datetime/timedelta, or pandas' Timestamp/Timedelta, which a list of
        # ns values holds: numpy reads those as datetimes, to the microsecond) as one typed array, in a unit holding
        # each (numpy's own pick, the finest, wraps a date past 1677-2262 of a row group read in microseconds)
        scalars = [np.asarray(v.to_numpy() if hasattr(v, "to_numpy") else v, dtype=plan.field.numpy_dtype)
                   for v in column.ravel()]
        column = np.asarray(scalars, dtype=joined_dtype(scalars) or _finest_failing(plan, scalars)).reshape(
            column.shape)
    if column.dtype.kind in "mM":
        return _nanoseconds(plan, column)
    if column.dtype == object and not len(column):
        column = np.empty((0, *(d or 0 for d in plan.field.shape)), np_dtype)
    if column.dtype.kind == "f" and np_dtype.kind in "biu" and (nan := np.isnan(column)).any():
        # a batch reader with Petastorm's types gives nulls of int fields as NaN
        raise null_error(plan.name, int(np.flatnonzero(nan.reshape(len(column), -1).any(axis=1))[0]))
    return column.astype(np_dtype, copy=False)


def _finest_failing(plan: FieldPlan, scalars: Sequence[np.ndarray]) -> np.dtype:
    """Never returns: date or duration scalars no one unit holds exactly hold a value the finest of their units
    cannot (numpy would wrap it), which int64 nanoseconds cannot either."""
    finest = np.result_type(*scalars)
    row = next(i for i, s in enumerate(scalars) if s.astype(finest).astype(s.dtype).view(np.int64) != s.view(np.int64))
    raise ValidationError(f"field {plan.name!r}, row {row} of a batch read: {scalars[row]} cannot be int64 nanoseconds "
                          "(the unit of dates and durations in TensorFlow: years 1677-2262, nothing finer than 1 ns); "
                          "convert it with a TransformSpec or leave the field out with schema_fields=",
                          field=plan.name, row=row)


#: nanoseconds in one unit of the datetime64/timedelta64 units Arrow's dates, times and durations come in
NANOSECONDS_PER_UNIT = {"W": 7 * 86_400 * 10**9, "D": 86_400 * 10**9, "h": 3_600 * 10**9, "m": 60 * 10**9,
                        "s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}


def _nanoseconds(plan: FieldPlan, column: np.ndarray) -> np.ndarray:
    """Dates and times as int64 nanoseconds since the Unix epoch, durations as int64 nanoseconds, whatever
    unit they are stored in (a date32 column's days too), as Petastorm gives them to TensorFlow; NaT stays
    int64's minimum. A value int64 nanoseconds cannot hold (outside the years 1677-2262, or finer than a
    nanosecond) is a ValidationError naming the field and row, not a number wrapped by numpy's cast."""
    unit, count = np.datetime_data(column.dtype)
    absent = np.isnat(column)
    if unit in NANOSECONDS_PER_UNIT:  # exact integer arithmetic (numpy's own cast back from ns overflows near the ends)
        factor = NANOSECONDS_PER_UNIT[unit] * count
        ticks = column.view(np.int64)
        lost = (np.abs(ticks) > np.iinfo(np.int64).max // factor) & ~absent
        nanoseconds = np.where(absent, ticks, ticks * factor) if factor > 1 else ticks
    else:  # years, months, or finer than ns: numpy's cast, checked by the way back
        converted = column.astype(f"{column.dtype.kind}8[ns]")
        lost = (converted.astype(column.dtype) != column) & ~absent
        nanoseconds = converted.view(np.int64)
    if lost.any():
        row = int(np.flatnonzero(lost.reshape(len(column), -1).any(axis=1))[0])
        raise ValidationError(f"field {plan.name!r}, row {row} of a batch read: {column.reshape(len(column), -1)[row]} "
                              "cannot be int64 nanoseconds (the unit of dates and durations in TensorFlow: years "
                              "1677-2262, nothing finer than 1 ns); convert it with a TransformSpec or leave the "
                              "field out with schema_fields=", field=plan.name, row=row)
    return nanoseconds


def _stacked(plan: FieldPlan, values: Sequence[Any]) -> np.ndarray:
    """One array of the rows' arrays; rows of different shapes are a SchemaError saying what to do."""
    try:
        if any(isinstance(v, (list, tuple)) for v in values):  # Python's bytes/str kept whole (see _array)
            return np.stack([_array(v) for v in values])
        return np.stack(values)
    except ValueError:
        raise SchemaError(f"field {plan.name!r}: rows of different lengths ({sorted({np.shape(v) for v in values})[:4]}) "
                          "in a field read as a dense tensor, as Petastorm reads lists; read with "
                          "petastorm_types=False to get a RaggedTensor") from None


def encode_columns(plans: Sequence[FieldPlan], columns: Columns) -> tuple[np.ndarray, ...]:
    """Flat arrays for ``from_generator``: a dense column, or flat values + nested row lengths, for
    each field, then the nullable fields' masks. Values TensorFlow cannot take are a ValidationError
    naming the field."""
    out: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    for plan in plans:
        column = columns[plan.name]
        present = present_mask(column)
        if not plan.masked and not present.all():
            raise null_error(plan.name, int(np.flatnonzero(~present)[0]))
        try:
            if plan.ragged_rank:
                out.extend(_ragged(plan, column))
            else:
                out.append(_dense(plan, column, present))
        except UnihubError:
            raise
        except (ValueError, TypeError, OverflowError) as exc:  # numpy's, on values the schema does not describe
            raise ValidationError(f"field {plan.name!r}: values that do not make a {plan.field.shape} "
                                  f"{plan.tf_dtype.name} tensor ({type(exc).__name__}: {exc})", field=plan.name) from exc
        if plan.masked:
            masks.append(present)
    return tuple(out + masks)


def _dense(plan: FieldPlan, column: np.ndarray, present: np.ndarray) -> np.ndarray:
    """A field of fixed shape as one array, its nulls filled."""
    if present.all():
        values = encode_values(plan, column)
    else:
        fill = fill_value(plan.field)
        kept = encode_values(plan, column[present]) if present.any() else fill[np.newaxis]
        values = np.empty((len(column), *kept.shape[1:]), dtype=kept.dtype)
        values[~present] = fill
        values[present] = kept
    if not shape_matches(values.shape[1:], plan.field.shape):
        raise SchemaError(f"field {plan.name!r}: values of shape {values.shape[1:]} where the schema "
                          f"says {plan.field.shape}")
    return values


def _ragged(plan: FieldPlan, column: np.ndarray) -> list[np.ndarray]:
    """A field with ``None`` dims as its flat values and the row lengths of each ragged dim; a null
    row is a row of no values (its mask says it was null), a null inside a row a ValidationError."""
    given = [None if r is None else _array(r) for r in column]
    if any(r is not None and r.dtype == object for r in given):
        return _ragged_nested(plan, given)
    return _ragged_even(plan, given)


def _ragged_even(plan: FieldPlan, given: list[np.ndarray | None]) -> list[np.ndarray]:
    """:func:`_ragged` of rows that are each an n-D array of the field's rank."""
    ndim = len(plan.field.shape)
    for row, value in enumerate(given):
        if value is not None and value.ndim != ndim:
            raise ValidationError(f"field {plan.name!r}, row {row} of a batch read: a value of shape {value.shape} "
                                  f"where the schema says {plan.field.shape}", field=plan.name, row=row)
    empty = fill_value(plan.field)
    like = next((r for r in given if r is not None), None)
    empty = empty if like is None else empty.astype(like.dtype)
    rows = [empty if r is None else r for r in given]
    rank = plan.ragged_rank
    inner = tuple(d for d in plan.field.shape[rank:] if d is not None)
    assert len(inner) == len(plan.field.shape) - rank  # ragged_rank is past the field's last None dim
    shapes = np.array([r.shape[:rank] for r in rows], dtype=np.int64).reshape(len(rows), rank)
    flat = [r.reshape(-1, *inner) for r in rows]
    flat_values = np.concatenate(flat) if flat else np.empty((0, *inner), dtype=object)
    if flat_values.shape[1:] != inner:
        raise SchemaError(f"field {plan.name!r}: rows of shape {rows[0].shape} where the schema says "
                          f"{plan.field.shape}")
    out = [encode_values(plan, flat_values)]
    for level in range(rank):
        out.append(np.repeat(shapes[:, level], np.prod(shapes[:, :level], axis=1)))
    return out


def _ragged_nested(plan: FieldPlan, given: list[np.ndarray | None]) -> list[np.ndarray]:
    """:func:`_ragged` for rows whose inner lists differ in length (an object array of arrays: a plain Parquet
    list of lists, readers/decode.py ``_ragged_rows``): the row lengths of each level walked row by row."""
    rank = plan.ragged_rank
    inner = tuple(d for d in plan.field.shape[rank:] if d is not None)
    levels: list[list[np.ndarray]] = [[] for _ in range(rank)]
    leaves: list[np.ndarray] = []
    for row, value in enumerate(given):
        try:
            _walk(np.zeros((0,) * rank + inner, np.int64) if value is None else value, 0, rank, inner, levels, leaves)
        except _NullInside:
            raise ValidationError(f"field {plan.name!r}, row {row} of a batch read: a null inside the row's lists, "
                                  "which a tf.RaggedTensor cannot hold (it has no nulls, and a mask says only which "
                                  "rows are null); fill it with a TransformSpec or leave the field out with "
                                  "schema_fields=", field=plan.name, row=row) from None
        except ValueError as exc:
            raise ValidationError(f"field {plan.name!r}, row {row} of a batch read: {exc} where the schema says "
                                  f"{plan.field.shape}", field=plan.name, row=row) from None
    like = next((leaf for leaf in leaves if leaf.size), None)
    flat_values = np.concatenate([leaf.astype(like.dtype if like is not None else plan.field.dtype) for leaf in leaves])
    return [encode_values(plan, flat_values)] + [np.concatenate(level).astype(np.int64) for level in levels]


def _walk(value: np.ndarray, depth: int, rank: int, inner: tuple[int, ...], levels: list[list[np.ndarray]],
          leaves: list[np.ndarray]) -> None:
    """Row lengths (into ``levels``) and flat values (into ``leaves``) of one value at ragged level ``depth``."""
    if value.dtype != object:  # even from here down: its shape gives the lengths
        if value.shape == (0,):  # an empty Python list, of no known depth
            value = value.reshape((0,) * (rank - depth) + inner)
        if value.ndim != rank - depth + len(inner):
            raise ValueError(f"a value of shape {value.shape} at depth {depth}")
        shape = value.shape[:rank - depth]
        for k in range(rank - depth):
            levels[depth + k].append(np.full(int(np.prod(shape[:k])), shape[k]))
        leaves.append(value.reshape(-1, *inner))
        return
    if any(item is None for item in value):  # an empty list would say something else
        raise _NullInside
    if depth + 1 >= rank and not inner:  # the last ragged level: Python scalars (dates, durations, decimals)
        if any(isinstance(item, (list, tuple, np.ndarray)) for item in value):
            raise ValueError(f"nested values at depth {depth}")
        levels[depth].append(np.array([len(value)]))
        leaves.append(value)  # typed by encode_values, as a dense field's are
        return
    levels[depth].append(np.array([len(value)]))
    for item in value:
        _walk(_array(item), depth + 1, rank, inner, levels, leaves)


def _array(value: Any) -> np.ndarray:
    """``value`` as an array; Python lists of lists of different lengths (a list of lists of dates or
    decimals reads as them) as an object array of the lists, which :func:`_walk` goes down; Python
    bytes and str as objects."""
    try:
        array = np.asarray(value)
    except ValueError:  # numpy's 'inhomogeneous shape'
        items = np.empty(len(value), dtype=object)
        for i, item in enumerate(value):
            items[i] = item
        return items
    if array.dtype.kind in "SU" and not isinstance(value, np.ndarray):
        # numpy's fixed-width strings drop trailing NULs (b"\xff\x00" became b"\xff"): keep Python's as they are
        return np.array(value, dtype=object)
    return array


class _NullInside(Exception):
    """:func:`_walk` met a null below a row's top level (an inner list, or a string in a list)."""


def flat_signature(plans: Sequence[FieldPlan]) -> tuple[Any, ...]:
    """The ``tf.TensorSpec`` s of what :func:`encode_columns` gives, in its order."""
    tf = load_tf()
    specs: list[Any] = []
    for plan in plans:
        inner = tuple(plan.field.shape[plan.ragged_rank:])
        specs.append(tf.TensorSpec((None, *inner), plan.tf_dtype))
        specs.extend(tf.TensorSpec((None,), tf.int64) for _ in range(plan.ragged_rank))
    specs.extend(tf.TensorSpec((None,), tf.bool) for plan in plans if plan.masked)
    return tuple(specs)
