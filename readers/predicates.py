"""Row predicates, as Petastorm spells them, evaluated a column at a time.

A predicate names the fields it needs (:meth:`PredicateBase.get_fields`); the reader reads
and decodes only those columns first, evaluates the predicate on them, and reads the
rest only for the rows that pass. :meth:`PredicateBase.do_include` is Petastorm's per-row
test (a dict of field values); :meth:`PredicateBase.evaluate` is the column-wise form,
vectorised where the predicate allows (``in_set``, ``in_pseudorandom_split``) and a loop
over ``do_include`` otherwise.

    make_reader(url, predicate=in_lambda(["label"], lambda label: label < 5))
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from unihub.errors import SchemaError


class PredicateBase:
    """Base class: subclasses define :meth:`get_fields` and :meth:`do_include`."""

    def get_fields(self) -> set[str]:
        raise NotImplementedError

    def do_include(self, values: Mapping[str, Any]) -> bool:
        raise NotImplementedError

    def evaluate(self, columns: Mapping[str, Any], num_rows: int) -> np.ndarray:
        """Boolean mask over ``num_rows`` rows given decoded ``columns`` (at least :meth:`get_fields`)."""
        names = sorted(self.get_fields())
        missing = [n for n in names if n not in columns]
        if missing:
            raise SchemaError(f"predicate needs fields {missing}, which were not read")
        cols = [columns[n] for n in names]
        return np.fromiter((bool(self.do_include(dict(zip(names, vals)))) for vals in zip(*cols)),
                           dtype=bool, count=num_rows) if names else np.ones(num_rows, dtype=bool)


def _check_field(name: Any) -> str:
    if not isinstance(name, str):
        raise SchemaError(f"a predicate field must be a field name, got {name!r}")
    return name


class in_set(PredicateBase):  # noqa: N801 - Petastorm's name
    """Rows whose ``predicate_field`` value is in ``inclusion_values``."""

    def __init__(self, inclusion_values: Iterable[Any], predicate_field: str) -> None:
        self._inclusion_values = set(inclusion_values)
        self._predicate_field = _check_field(predicate_field)

    def get_fields(self) -> set[str]:
        return {self._predicate_field}

    def do_include(self, values: Mapping[str, Any]) -> bool:
        return values[self._predicate_field] in self._inclusion_values

    def evaluate(self, columns: Mapping[str, Any], num_rows: int) -> np.ndarray:
        column = columns[self._predicate_field]
        if isinstance(column, np.ndarray) and column.dtype != object and column.ndim == 1:
            wanted = [v for v in self._inclusion_values if v is not None]
            try:
                return np.isin(column, np.asarray(wanted, dtype=column.dtype) if wanted else np.empty(0, column.dtype))
            except (TypeError, ValueError):
                pass
        return super().evaluate(columns, num_rows)


class in_intersection(PredicateBase):  # noqa: N801
    """Rows whose list-valued ``predicate_field`` shares at least one value with ``inclusion_values``."""

    def __init__(self, inclusion_values: Iterable[Any], predicate_field: str) -> None:
        self._inclusion_values = set(inclusion_values)
        self._predicate_field = _check_field(predicate_field)

    def get_fields(self) -> set[str]:
        return {self._predicate_field}

    def do_include(self, values: Mapping[str, Any]) -> bool:
        value = values[self._predicate_field]
        if value is None:
            return False
        return not self._inclusion_values.isdisjoint(np.asarray(value).ravel().tolist())


class in_lambda(PredicateBase):  # noqa: N801
    """Rows for which ``predicate_func(*field_values[, state_arg])`` is true."""

    def __init__(self, predicate_fields: Sequence[str], predicate_func: Callable[..., Any],
                 state_arg: Any = None) -> None:
        if isinstance(predicate_fields, str):
            raise SchemaError("in_lambda takes a list of field names, e.g. in_lambda(['label'], f)")
        self._predicate_fields = [_check_field(f) for f in predicate_fields]
        self._predicate_func = predicate_func
        self._state_arg = state_arg

    def get_fields(self) -> set[str]:
        return set(self._predicate_fields)

    def do_include(self, values: Mapping[str, Any]) -> bool:
        args = [values[f] for f in self._predicate_fields]
        if self._state_arg is not None:
            args.append(self._state_arg)
        return bool(self._predicate_func(*args))

    def evaluate(self, columns: Mapping[str, Any], num_rows: int) -> np.ndarray:
        cols = [columns[f] for f in self._predicate_fields]
        func, state = self._predicate_func, self._state_arg
        if state is None:
            return np.fromiter((bool(func(*vals)) for vals in zip(*cols)), dtype=bool, count=num_rows)
        return np.fromiter((bool(func(*vals, state)) for vals in zip(*cols)), dtype=bool, count=num_rows)


class in_negate(PredicateBase):  # noqa: N801
    """Rows that ``predicate`` excludes."""

    def __init__(self, predicate: PredicateBase) -> None:
        self._predicate = predicate

    def get_fields(self) -> set[str]:
        return self._predicate.get_fields()

    def do_include(self, values: Mapping[str, Any]) -> bool:
        return not self._predicate.do_include(values)

    def evaluate(self, columns: Mapping[str, Any], num_rows: int) -> np.ndarray:
        return ~np.asarray(self._predicate.evaluate(columns, num_rows), dtype=bool)


class in_reduce(PredicateBase):  # noqa: N801
    """Combines predicates with ``reduce_func`` over their results, e.g. ``all`` or ``any``."""

    def __init__(self, predicate_list: Sequence[PredicateBase], reduce_func: Callable[[list[bool]], bool]) -> None:
        self._predicate_list = list(predicate_list)
        self._reduce_func = reduce_func

    def get_fields(self) -> set[str]:
        fields: set[str] = set()
        for predicate in self._predicate_list:
            fields |= predicate.get_fields()
        return fields

    def do_include(self, values: Mapping[str, Any]) -> bool:
        return bool(self._reduce_func([p.do_include(values) for p in self._predicate_list]))

    def evaluate(self, columns: Mapping[str, Any], num_rows: int) -> np.ndarray:
        masks = np.stack([np.asarray(p.evaluate(columns, num_rows), dtype=bool) for p in self._predicate_list]) \
            if self._predicate_list else np.ones((0, num_rows), dtype=bool)
        if self._reduce_func is all:
            return masks.all(axis=0)
        if self._reduce_func is any:
            return masks.any(axis=0)
        return np.fromiter((bool(self._reduce_func(list(col))) for col in masks.T), dtype=bool, count=num_rows)


def _string_to_bucket(value: str, bucket_num: int) -> int:
    return int(hashlib.md5(value.encode("utf-8")).hexdigest(), 16) % bucket_num


class in_pseudorandom_split(PredicateBase):  # noqa: N801
    """Deterministic split of rows into subsets by hashing ``predicate_field`` (Petastorm's md5 scheme).

    ``in_pseudorandom_split([0.8, 0.2], 0, "id")`` keeps the 80% subset; index 1 the rest.
    """

    _BUCKETS = 2 ** 32

    def __init__(self, fraction_list: Sequence[float], subset_index: int, predicate_field: str) -> None:
        fractions = [float(f) for f in fraction_list]
        if not 0 <= subset_index < len(fractions):
            raise SchemaError(f"subset_index {subset_index} is out of range for {len(fractions)} fractions")
        if any(f < 0 for f in fractions) or sum(fractions) > 1 + 1e-9:
            raise SchemaError(f"fractions must be non-negative and sum to at most 1, got {fractions}")
        self._predicate_field = _check_field(predicate_field)
        self._low = sum(fractions[:subset_index])
        self._high = self._low + fractions[subset_index]

    def get_fields(self) -> set[str]:
        return {self._predicate_field}

    def do_include(self, values: Mapping[str, Any]) -> bool:
        value = values[self._predicate_field]
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        bucket = _string_to_bucket(str(value), self._BUCKETS)
        return self._low * self._BUCKETS <= bucket < self._high * self._BUCKETS
