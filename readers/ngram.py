"""NGram: read windows of consecutive rows (by a timestamp field) instead of single rows.

Petastorm's ``NGram(fields, delta_threshold, timestamp_field, timestamp_overlap=True)``,
passed to :func:`~unihub.readers.reader.make_reader` as ``schema_fields``. ``fields``
maps integer offsets to the fields wanted at that offset; the reader then yields dicts
``{offset: namedtuple}`` with one entry for every offset from ``min(fields)`` to
``max(fields)`` (an offset that is not a key gets an empty namedtuple).

    ngram = NGram({-1: ["image", "speed"], 0: ["speed"]}, delta_threshold=10, timestamp_field="ts")
    with make_reader(url, schema_fields=ngram) as reader:
        for window in reader:
            previous, current = window[-1], window[0]

Rules (Petastorm's):

- Windows are formed inside one task's rows (a row group, or a slice of one), sorted by
  ``timestamp_field``; no window spans two row groups, so row groups should hold many
  more rows than :attr:`NGram.length`.
- Consecutive rows of a window differ by at most ``delta_threshold`` (inclusive).
- ``timestamp_overlap=False``: a window is skipped unless its first timestamp is greater
  than the last timestamp of the previous window that was kept, so no timestamp appears
  in two windows. Not with row groups cut into parts (``shuffle_row_drop_partitions > 1``,
  ``shard_by='row'``): each part keeps only its own windows apart, so it is refused there.

Differences from Petastorm: rows are sorted by timestamp here (Petastorm raised on
unsorted rows), so ``shuffle_rows=True`` still gives valid windows (it changes nothing: a task
cut from a row group keeps consecutive rows, so no window is lost at the cut); the timestamp field
is read even when no offset lists it; rows with a null timestamp are in no window.
"""

from __future__ import annotations

import datetime
import decimal
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np

from unihub.errors import NoMatchingFieldsError, SchemaError
from unihub.schema.unischema import Unischema, UnischemaField, select_unischema_fields

FieldSpec: TypeAlias = "UnischemaField | str"


class NGram:
    """Windows of rows consecutive in ``timestamp_field``; see the module docstring."""

    def __init__(self, fields: Mapping[int, Sequence[FieldSpec]], delta_threshold: Any,
                 timestamp_field: FieldSpec, timestamp_overlap: bool = True) -> None:
        _validate(fields, delta_threshold, timestamp_field, timestamp_overlap)
        self._field_specs: dict[int, list[FieldSpec]] = {int(k): list(fields[k]) for k in sorted(fields)}
        self._fields: dict[int, list[Any]] = {k: list(v) for k, v in self._field_specs.items()}
        self._timestamp_spec = timestamp_field
        self._timestamp_field: Any = timestamp_field
        self._delta_threshold = delta_threshold
        self.timestamp_overlap = timestamp_overlap
        self._views: dict[tuple[Unischema, int], Unischema] = {}

    # -- Petastorm's attributes ---------------------------------------------------------------
    @property
    def length(self) -> int:
        """Rows per window: ``max(offset) - min(offset) + 1``."""
        return max(self._fields) - min(self._fields) + 1

    @property
    def fields(self) -> dict[int, list[Any]]:
        """Offset -> fields (``UnischemaField`` once resolved against a schema)."""
        return self._fields

    @property
    def delta_threshold(self) -> Any:
        """The largest allowed timestamp step between consecutive rows of a window."""
        return self._delta_threshold

    @property
    def timestamp_field(self) -> Any:
        """The timestamp field (a ``UnischemaField`` once resolved)."""
        return self._timestamp_field

    @property
    def _timestamp_name(self) -> str:
        ts = self._timestamp_field
        return ts.name if isinstance(ts, UnischemaField) else ts

    def __eq__(self, other: object) -> bool:
        """Equal when they ask for the same fields at the same offsets (in any order), with the
        same timestamp field, threshold and overlap rule (Petastorm compared the fields only)."""
        if not isinstance(other, NGram):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[Any, ...]:
        """What the NGram was made of (fields and regexes as given, by name), not what they resolved to,
        so that its hash does not change when a reader resolves it."""
        def name(spec: FieldSpec) -> str:
            return spec.name if isinstance(spec, UnischemaField) else spec

        fields = frozenset((k, frozenset(map(name, specs))) for k, specs in self._field_specs.items())
        return fields, name(self._timestamp_spec), self._delta_threshold, self.timestamp_overlap

    # -- resolution against a dataset's schema -----------------------------------------------
    def resolve_regex_field_names(self, schema: Unischema) -> None:
        """Turn names and regexes into ``schema``'s fields; called by the reader on open.

        Always starts from the arguments given to the constructor, so one NGram can be
        used with several datasets.
        """
        resolved = {}
        for offset, specs in self._field_specs.items():
            matched, unmatched = select_unischema_fields(schema, specs)
            if unmatched:  # a window without a field asked for: refused (Petastorm left the field out)
                raise NoMatchingFieldsError(f"No fields matching the criteria {unmatched} were found: NGram "
                                            f"fields[{offset}] names no field of Unischema {schema.name!r} (by name, "
                                            f"or as a regex matching the whole name); fields: {list(schema.fields)}")
            resolved[offset] = [schema[f.name] for f in matched]
        timestamp, _ = select_unischema_fields(schema, [self._timestamp_spec])
        if len(timestamp) != 1:
            raise SchemaError(f"NGram timestamp_field {self._timestamp_spec!r} matches {len(timestamp)} fields "
                              f"{[f.name for f in timestamp]}; it must name exactly one")
        ts = timestamp[0]
        if ts.shape != () or ts.dtype.kind == "b" or (ts.dtype == object and ts.numpy_dtype is not decimal.Decimal):
            raise SchemaError(f"NGram timestamp_field {ts.name!r} must be a numeric or datetime scalar, "
                              f"it is {ts!r}")
        self._fields, self._timestamp_field = resolved, ts
        self._views.clear()

    def get_field_names_at_timestep(self, timestep: int) -> list[str]:
        """Names of the fields wanted at ``timestep`` (empty for an offset without fields)."""
        return [f.name if isinstance(f, UnischemaField) else f for f in self._fields.get(timestep, [])]

    def get_field_names_at_all_timesteps(self) -> list[str]:
        """Names of every field the reader must read: those of all offsets, and the timestamp.

        (Petastorm returned the fields themselves and did not add the timestamp field.)
        """
        names: dict[str, None] = {}
        for offset in self._fields:
            names.update(dict.fromkeys(self.get_field_names_at_timestep(offset)))
        names[self._timestamp_name] = None
        return list(names)

    def get_schema_at_timestep(self, schema: Unischema, timestep: int) -> Unischema:
        """The view of ``schema`` holding the fields wanted at ``timestep``, in schema order."""
        key = (schema, timestep)
        view = self._views.get(key)
        if view is None:
            wanted = set(self.get_field_names_at_timestep(timestep))
            view = schema.create_schema_view([f for f in schema if f.name in wanted])
            self._views[key] = view
        return view

    def make_namedtuple(self, schema: Unischema, ngram_as_dicts: Mapping[int, Mapping[str, Any]]) -> dict[int, Any]:
        """``{offset: {name: value}}`` -> ``{offset: namedtuple}`` (Petastorm's helper)."""
        return {k: self.get_schema_at_timestep(schema, k).make_namedtuple(**v) for k, v in ngram_as_dicts.items()}

    # -- forming windows ----------------------------------------------------------------------
    def window_starts(self, timestamps: np.ndarray) -> np.ndarray:
        """Start positions of the windows in ``timestamps`` (already sorted ascending)."""
        n, length = len(timestamps), self.length
        if n < length:
            return np.empty(0, dtype=np.int64)
        if length == 1:
            starts = np.arange(n)
        else:
            step_ok = np.diff(timestamps) <= self._delta_threshold
            bad = np.concatenate([[0], np.cumsum(~np.asarray(step_ok, dtype=bool))])
            starts = np.flatnonzero(bad[length - 1:] == bad[:n - length + 1])
        if self.timestamp_overlap or len(starts) == 0:
            return starts
        return _non_overlapping(timestamps, starts, length)

    def form_windows(self, batch: Any, schema: Unischema) -> list[dict[int, Any]]:
        """The windows of one decoded batch (``batch.columns``: name -> numpy array, one entry per row).

        ``schema`` is the reader's schema; each offset's namedtuple type comes from
        :meth:`get_schema_at_timestep`.
        """
        name = self._timestamp_name
        if name not in batch.columns:
            raise SchemaError(f"NGram timestamp field {name!r} is not among the columns read "
                              f"{list(batch.columns)}; a transform must keep it")
        rows, timestamps = _sorted_timestamps(batch.columns[name], name)
        starts = self.window_starts(timestamps)
        own_rows = getattr(batch, "own_rows", None)
        if own_rows is not None:  # rows past the task's end only finish windows that start in it
            starts = starts[rows[starts] < own_rows]
        if len(starts) == 0:
            return []
        base = min(self._fields)
        per_offset = []
        for offset in range(base, base + self.length):
            view = self.get_schema_at_timestep(schema, offset)
            row_type: type[Any] = view._get_namedtuple()  # a namedtuple class made for the schema
            positions = rows[starts + (offset - base)]
            if len(view) == 0:
                per_offset.append([row_type()] * len(starts))
                continue
            columns = [_as_array(batch.columns[f])[positions] for f in view.fields]
            per_offset.append([row_type._make(values) for values in zip(*columns)])
        offsets = range(base, base + self.length)
        return [dict(zip(offsets, items)) for items in zip(*per_offset)]

    def __repr__(self) -> str:
        return (f"NGram(fields={self._field_specs!r}, delta_threshold={self._delta_threshold!r}, "
                f"timestamp_field={self._timestamp_name!r}, timestamp_overlap={self.timestamp_overlap!r})")


def _non_overlapping(timestamps: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """Greedy, in order: keep a window when its first timestamp is after the last kept window's end."""
    kept = [int(starts[0])]
    while True:
        end = timestamps[kept[-1] + length - 1]
        first_after = max(int(np.searchsorted(timestamps, end, side="right")), kept[-1] + 1)
        i = int(np.searchsorted(starts, first_after, side="left"))
        if i >= len(starts):
            return np.asarray(kept, dtype=np.int64)
        kept.append(int(starts[i]))


def _as_array(values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray):
        return values
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


def _sorted_timestamps(column: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(row positions sorted by timestamp, their timestamps); rows with a null timestamp left out."""
    values = np.asarray(column)
    rows = np.arange(len(values))
    if values.dtype == object:
        present = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
        rows = rows[present]
        items = values[present].tolist()
        values = np.asarray(items) if items else np.empty(0)
        if values.dtype == object and len(values) and not all(isinstance(v, numbers.Number) for v in items):
            raise SchemaError(f"NGram timestamp field {name!r} holds values that are not numbers")
    if values.ndim != 1:
        raise SchemaError(f"NGram timestamp field {name!r} must hold one scalar per row, got shape {values.shape}")
    if len(values) > 1 and not np.all(values[1:] >= values[:-1]):
        order = np.argsort(values, kind="stable")
        rows, values = rows[order], values[order]
    return rows, values


def _validate(fields: Any, delta_threshold: Any, timestamp_field: Any, timestamp_overlap: Any) -> None:
    if not isinstance(fields, Mapping) or not fields:
        raise SchemaError("NGram fields must be a non-empty dict {offset: [fields, names or regexes]}, "
                          f"got {fields!r}")
    for offset, specs in fields.items():
        if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
            raise SchemaError(f"NGram offsets must be integers, got {offset!r}")
        if not isinstance(specs, (list, tuple)):
            raise SchemaError(f"NGram fields[{offset}] must be a list of UnischemaField, names or regexes, "
                              f"got {specs!r}")
        for spec in specs:
            if not isinstance(spec, (UnischemaField, str)):
                raise SchemaError(f"NGram fields[{offset}] holds {spec!r}; use UnischemaField, names or regexes")
    is_timedelta = isinstance(delta_threshold, (datetime.timedelta, np.timedelta64))
    is_number = isinstance(delta_threshold, (numbers.Real, decimal.Decimal))  # Decimal: Petastorm's tests use it
    if isinstance(delta_threshold, bool) or not (is_number or is_timedelta):
        raise SchemaError(f"NGram delta_threshold must be a number (or a timedelta for datetime timestamps), "
                          f"got {delta_threshold!r}")
    if not is_timedelta and (_is_nan(delta_threshold) or delta_threshold < 0):
        raise SchemaError(f"NGram delta_threshold must be >= 0, got {delta_threshold!r}")
    if not isinstance(timestamp_field, (UnischemaField, str)):
        raise SchemaError(f"NGram timestamp_field must be a UnischemaField or a field name, got {timestamp_field!r}")
    if not isinstance(timestamp_overlap, bool):
        raise SchemaError(f"NGram timestamp_overlap must be True or False, got {timestamp_overlap!r}")


def _is_nan(number: numbers.Real | decimal.Decimal) -> bool:
    """NaN, of a float or a Decimal (whose signalling NaN float() refuses)."""
    return number.is_nan() if isinstance(number, decimal.Decimal) else math.isnan(number)
