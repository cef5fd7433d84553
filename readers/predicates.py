"""Row predicates, as Petastorm spells them, evaluated a column at a time.

A predicate names the fields it needs (:meth:`PredicateBase.get_fields`); the reader reads
and decodes only those columns first, evaluates the predicate on them, and reads the
rest only for the rows that pass. :meth:`PredicateBase.do_include` is Petastorm's test;
:meth:`PredicateBase.evaluate` is the column-wise form, vectorised where the predicate allows
(``in_set``, ``in_pseudorandom_split``) and a loop over ``do_include`` otherwise.

Petastorm's contract for a predicate of one's own, which defines only ``do_include``:
``make_reader`` calls it per row with a dict of values; ``make_batch_reader`` calls it once per
row group with the predicate's columns, and takes a boolean mask back (:func:`per_row_group`;
Petastorm gave a pandas DataFrame, unihub gives numpy columns shaped alike). unihub's own
predicates define ``evaluate`` and work alike in both.

    make_reader(url, predicate=in_lambda(["label"], lambda label: label < 5))
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from unihub.errors import InvalidArgumentError, SchemaError, UnihubError


class PredicateBase:
    """Base class: subclasses define :meth:`get_fields` and :meth:`do_include`."""

    def get_fields(self) -> set[str]:
        raise NotImplementedError

    def do_include(self, values: Any) -> Any:
        """Petastorm's test: ``values`` is a row's dict (``make_reader``: return a bool), or a row group's
        :class:`RowGroupColumns` (``make_batch_reader``, for a predicate without ``evaluate``: return a
        boolean mask)."""
        raise NotImplementedError

    def evaluate(self, columns: Mapping[str, Any], num_rows: int) -> np.ndarray:
        """Boolean mask over ``num_rows`` rows given decoded ``columns`` (at least :meth:`get_fields`)."""
        names = sorted(predicate_fields(self))
        missing = [n for n in names if n not in columns]
        if missing:
            raise SchemaError(f"predicate needs fields {missing}, which were not read")
        cols = [columns[n] for n in names]
        return np.fromiter((bool(self.do_include(dict(zip(names, vals)))) for vals in zip(*cols)),
                           dtype=bool, count=num_rows) if names else np.ones(num_rows, dtype=bool)


def predicate_fields(predicate: PredicateBase) -> set[str]:
    """The fields ``predicate.get_fields()`` names, as a set (a user's predicate may return a list or
    tuple, as Petastorm's documentation examples do)."""
    fields = predicate.get_fields()
    if isinstance(fields, str) or not isinstance(fields, Iterable):
        raise SchemaError(f"{type(predicate).__name__}.get_fields() must return field names, got {fields!r}")
    return {_check_field(name) for name in fields}


def unusable_predicate(predicate: PredicateBase, field_names: Iterable[str], dataset: str) -> UnihubError | None:
    """Why ``predicate`` cannot select rows of ``dataset`` (fields ``field_names``), or None.

    The reader raises it at the first read, as Petastorm's workers did (a ValueError in its words).
    """
    names = list(field_names)
    wanted = predicate_fields(predicate)
    kind = type(predicate).__name__
    if not wanted:
        return InvalidArgumentError(f"At least one field name must be returned by predicate's get_field() method: "
                                    f"{kind}.get_fields() names no field of {dataset}, so it cannot test a row")
    unknown = sorted(wanted - set(names))
    if unknown:
        return SchemaError(f"At least some column names requested by the predicate ({', '.join(unknown)}) are not "
                           f"valid schema names: ({', '.join(names)}): {kind} tests fields that {dataset} "
                           "does not have")
    return None


def per_row_group(predicate: PredicateBase) -> PredicateBase:
    """``predicate`` as ``make_batch_reader`` evaluates it: through its own ``evaluate`` where its class
    defines one (unihub's predicates), else one ``do_include`` call per row group with the columns of
    the row group, as Petastorm's ``make_batch_reader`` called it (:class:`_ColumnsPredicate`)."""
    if not isinstance(predicate, PredicateBase) or type(predicate).evaluate is not PredicateBase.evaluate:
        return predicate
    return _ColumnsPredicate(predicate)


class RowGroupColumns:
    """The columns a predicate of one's own gets from ``make_batch_reader``, shaped as the pandas DataFrame
    Petastorm gave it: ``values[name]`` is a column (a numpy array, one entry per row; an object array of
    arrays for a tensor field), iterating gives the names, and ``len(values)`` is the number of rows."""

    def __init__(self, columns: Mapping[str, Any], names: Sequence[str], num_rows: int) -> None:
        self._columns = {name: columns[name] for name in names}
        self._num_rows = num_rows

    def __getitem__(self, name: str) -> np.ndarray:
        column = self._columns[name]
        if isinstance(column, np.ndarray) and column.ndim == 1:
            return column
        cells = np.empty(self._num_rows, dtype=object)  # a row's tensor is one cell, as in a DataFrame
        cells[:] = list(column)
        return cells

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def __len__(self) -> int:
        return self._num_rows

    def __contains__(self, name: object) -> bool:
        return name in self._columns

    @property
    def columns(self) -> list[str]:
        return list(self._columns)


class _ColumnsPredicate(PredicateBase):
    """A predicate of one's own that defines only ``do_include``, called once per row group with a
    :class:`RowGroupColumns`; it returns a boolean mask of the rows to keep (Petastorm's batch contract)."""

    def __init__(self, predicate: PredicateBase) -> None:
        self.predicate = predicate

    def get_fields(self) -> set[str]:
        return predicate_fields(self.predicate)

    def do_include(self, values: Mapping[str, Any]) -> Any:
        return self.predicate.do_include(values)

    def evaluate(self, columns: Mapping[str, Any], num_rows: int) -> np.ndarray:
        if not num_rows:
            return np.zeros(0, dtype=bool)
        names = sorted(self.get_fields())
        kind = type(self.predicate).__name__
        what = (f"make_batch_reader calls {kind}.do_include once per row group with its columns {names} "
                f"(values[name] a numpy array of {num_rows} rows, len(values) the rows) and takes a boolean "
                "mask back, as Petastorm's make_batch_reader did; a predicate that tests one row at a time "
                "works with make_reader, or defines evaluate(columns, num_rows)")
        try:
            mask = np.asarray(self.predicate.do_include(RowGroupColumns(columns, names, num_rows)))
        except Exception as exc:
            if hasattr(exc, "add_note"):  # Python 3.11+: the user's own error, with how it was called
                exc.add_note(what)
            raise
        if mask.shape != (num_rows,) or mask.dtype.kind not in "bO":
            raise InvalidArgumentError(f"{kind}.do_include returned {mask.dtype} of shape {mask.shape}, not "
                                       f"{num_rows} booleans: {what}")
        return mask.astype(bool)


def _check_predicate(predicate: Any) -> PredicateBase:
    if not isinstance(predicate, PredicateBase):
        raise SchemaError(f"expected a predicate (a PredicateBase such as in_set or in_lambda), got {predicate!r}")
    return predicate


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
        if isinstance(column, np.ndarray) and column.ndim == 1 and column.dtype.kind in "biuf":
            wanted = _numeric_array(self._inclusion_values)
            # compare as numbers; never cast the wanted values to the column's dtype (2.5 must not match 2)
            if wanted is not None and (wanted.dtype.kind in "biu" or column.dtype.kind == "f"):
                return np.isin(column, wanted)
        return super().evaluate(columns, num_rows)


def _numeric_array(values: set[Any]) -> np.ndarray | None:
    """``values`` as a numeric numpy array, or None when some value is not a plain number."""
    if not all(isinstance(v, (bool, int, float, np.bool_, np.integer, np.floating)) for v in values):
        return None
    try:
        array = np.asarray(list(values)) if values else np.empty(0, dtype=np.int64)
    except (OverflowError, TypeError, ValueError):
        return None
    return array if array.dtype.kind in "biuf" else None


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

    def evaluate(self, columns: Mapping[str, Any], num_rows: int) -> np.ndarray:
        """Row by row in both readers (defined here so that :func:`per_row_group` keeps it)."""
        return super().evaluate(columns, num_rows)


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
        self._predicate = _check_predicate(predicate)

    def get_fields(self) -> set[str]:
        return predicate_fields(self._predicate)

    def do_include(self, values: Mapping[str, Any]) -> bool:
        return not self._predicate.do_include(values)

    def evaluate(self, columns: Mapping[str, Any], num_rows: int) -> np.ndarray:
        return ~np.asarray(self._predicate.evaluate(columns, num_rows), dtype=bool)


class in_reduce(PredicateBase):  # noqa: N801
    """Combines predicates with ``reduce_func`` over their results, e.g. ``all`` or ``any``."""

    def __init__(self, predicate_list: Sequence[PredicateBase], reduce_func: Callable[[list[bool]], bool]) -> None:
        self._predicate_list = [_check_predicate(p) for p in predicate_list]
        self._reduce_func = reduce_func

    def get_fields(self) -> set[str]:
        fields: set[str] = set()
        for predicate in self._predicate_list:
            fields |= predicate_fields(predicate)
        return fields

    def do_include(self, values: Mapping[str, Any]) -> bool:
        return bool(self._reduce_func([p.do_include(values) for p in self._predicate_list]))

    def evaluate(self, columns: Mapping[str, Any], num_rows: int) -> np.ndarray:
        masks = np.stack([np.asarray(p.evaluate(columns, num_rows), dtype=bool) for p in self._predicate_list]) \
            if self._predicate_list else np.ones((0, num_rows), dtype=bool)
        if self._reduce_func is all:
            # np.all, not masks.all: the method's stub cannot see that a 2-D reduction is an array
            return np.all(masks, axis=0)
        if self._reduce_func is any:
            return np.any(masks, axis=0)
        return np.fromiter((bool(self._reduce_func(list(col))) for col in masks.T), dtype=bool, count=num_rows)


def _string_to_bucket(value: str, bucket_num: int) -> int:
    return int(hashlib.md5(value.encode("utf-8")).hexdigest(), 16) % bucket_num


class in_pseudorandom_split(PredicateBase):  # noqa: N801 - Petastorm's name
    """Deterministic split of rows into subsets by hashing ``predicate_field`` (Petastorm's md5 scheme).

    ``in_pseudorandom_split([0.8, 0.2], 0, "id")`` keeps the 80% subset; index 1 the rest.
    The value's md5 (as an integer) modulo ``sys.maxsize`` falls in subset ``i`` when it lies in
    ``[cdf[i-1], cdf[i]) * (sys.maxsize - 1)``, exactly as Petastorm computes it, so a split
    made with Petastorm selects the same rows. Values are hashed as ``str`` gives them (bytes as
    ``"b'...'"``, as Petastorm 0.13.1 hashed its ``np.bytes_`` values); each distinct value is hashed
    once per batch.
    """

    def __init__(self, fraction_list: Sequence[float], subset_index: int, predicate_field: str) -> None:
        fractions = [f.item() if isinstance(f, np.generic) else f for f in fraction_list]
        if any(isinstance(f, bool) or not isinstance(f, (int, float, np.integer, np.floating)) for f in fractions):
            raise SchemaError(f"fractions must be numbers, got {fractions}")
        if not 0 <= subset_index < len(fractions):
            raise SchemaError(f"subset_index {subset_index} is out of range for {len(fractions)} fractions")
        if any(f < 0 for f in fractions) or sum(fractions) > 1 + 1e-9:
            raise SchemaError(f"fractions must be non-negative and sum to at most 1, got {fractions}")
        self._predicate_field = _check_field(predicate_field)
        high_borders = [sum(fractions[:i + 1]) for i in range(len(fractions))]
        low = high_borders[subset_index - 1] if subset_index else 0
        self._bucket_low = low * (sys.maxsize - 1)
        self._bucket_high = high_borders[subset_index] * (sys.maxsize - 1)

    def get_fields(self) -> set[str]:
        return {self._predicate_field}

    def _includes(self, value: Any) -> bool:
        bucket = _string_to_bucket(str(value), sys.maxsize)
        return bool(self._bucket_low <= bucket < self._bucket_high)

    def do_include(self, values: Mapping[str, Any]) -> bool:
        if self._predicate_field not in values:
            raise SchemaError(f"in_pseudorandom_split: the values lack the split field {self._predicate_field!r}")
        return self._includes(values[self._predicate_field])

    def evaluate(self, columns: Mapping[str, Any], num_rows: int) -> np.ndarray:
        column = columns[self._predicate_field]
        if isinstance(column, np.ndarray) and column.ndim == 1 and column.dtype.kind in "iuUS":
            uniques, inverse = np.unique(column, return_inverse=True)
            # str(np.str_/np.int64) is the same text as str() of the Python value
            keep = np.fromiter((self._includes(v.item() if isinstance(v, np.generic) else v) for v in uniques),
                               dtype=bool, count=len(uniques))
            return keep[inverse.reshape(-1)]
        return super().evaluate(columns, num_rows)
