"""Row-group indexers, Petastorm's ``petastorm.etl.rowgroup_indexers``: which row groups hold a value.

An indexer maps values of one field to the numbers of the row groups that hold them
(:class:`SingleFieldIndexer`), or records the row groups where a field is not null
(:class:`FieldNotNullIndexer`). :func:`~unihub.readers.rowgroup_index.build_rowgroup_index`
fills them; a selector (:mod:`unihub.readers.selectors`) asks them for row groups; a reader
reads only those. Row groups are numbered in the dataset's order (files sorted by path,
then row groups within a file), the order Petastorm numbers its pieces in.

Values are kept as Python values (``np.int32(3)`` as ``3``, ``np.str_`` as ``str``), so a
selector's values match them by Python equality, as they match Petastorm's numpy keys;
a list (1-D) field indexes each element, as Petastorm's indexer does. Indexes are stored
as JSON (:meth:`SingleFieldIndexer.to_json`), never pickled.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import numpy as np

from unihub.errors import UnihubError


class RowGroupIndexError(UnihubError, ValueError):
    """A row-group index that is missing, stale or malformed, or an indexer or selector that cannot work."""


#: Python types an index value may have (after :func:`index_key`)
_KEY_TYPES = (str, bytes, bool, int, float, decimal.Decimal, np.datetime64)


def index_key(value: Any) -> Any:
    """``value`` as an index key: numpy scalars as Python values; dates and datetimes as ``np.datetime64``."""
    if isinstance(value, np.generic) and not isinstance(value, np.datetime64):
        value = value.item()
    if isinstance(value, (datetime.datetime, datetime.date)):
        return np.datetime64(value)
    if not isinstance(value, _KEY_TYPES):
        raise RowGroupIndexError(f"cannot index a value of type {type(value).__name__} ({value!r:.60}); indexes "
                                 "hold strings, bytes, numbers, booleans, decimals and dates")
    return value


def encode_key(key: Any) -> Any:
    """A key as JSON: strings, ints, finite floats and booleans as themselves, the rest tagged."""
    if isinstance(key, (str, int)):  # bool is an int
        return key
    if isinstance(key, float):
        return key if math.isfinite(key) else {"float": repr(key)}
    if isinstance(key, bytes):
        return {"bytes": base64.b64encode(key).decode("ascii")}
    if isinstance(key, decimal.Decimal):
        return {"decimal": str(key)}
    if isinstance(key, np.datetime64):
        return {"datetime64": str(key)}
    raise RowGroupIndexError(f"cannot store an index value of type {type(key).__name__}")


_DECODERS: dict[str, Callable[[str], Any]] = {
    "float": float,
    "bytes": lambda text: base64.b64decode(text.encode("ascii"), validate=True),
    "decimal": decimal.Decimal,
    "datetime64": np.datetime64,
}


def decode_key(item: Any) -> Any:
    """The inverse of :func:`encode_key`."""
    if isinstance(item, (str, int, float)):
        return item
    if isinstance(item, dict) and len(item) == 1:
        (tag, text), = item.items()
        if tag in _DECODERS and isinstance(text, str):
            try:
                return _DECODERS[tag](text)
            except (ValueError, decimal.InvalidOperation) as exc:
                raise RowGroupIndexError(f"malformed index value {item!r}: {exc}") from exc
    raise RowGroupIndexError(f"malformed index value {item!r:.80}")


def _row_groups(items: Any, where: str) -> set[int]:
    if not isinstance(items, (list, tuple, set, frozenset)) or not all(
            isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in items):
        raise RowGroupIndexError(f"{where}: row groups must be a list of non-negative ints, got {items!r:.80}")
    return set(items)


class RowGroupIndexerBase(ABC):
    """Petastorm's indexer contract: a name, the columns it reads, its values and their row groups."""

    #: the ``kind`` of the indexer in the stored JSON
    kind: ClassVar[str] = ""

    def __init__(self, index_name: str, index_field: str) -> None:
        if not isinstance(index_name, str) or not index_name:
            raise RowGroupIndexError(f"index_name must be a non-empty string, got {index_name!r}")
        if not isinstance(index_field, str) or not index_field:
            raise RowGroupIndexError(f"index_field must be a field name, got {index_field!r}")
        self._index_name = index_name
        self._column_name = index_field

    @property
    def index_name(self) -> str:
        """The index's unique name, what selectors ask for."""
        return self._index_name

    @property
    def column_names(self) -> list[str]:
        """The fields the index is built from (one)."""
        return [self._column_name]

    @property
    def index_field(self) -> str:
        return self._column_name

    def empty_copy(self) -> RowGroupIndexerBase:
        """A new indexer of the same kind, name and field, holding nothing."""
        return type(self)(self._index_name, self._column_name)

    def _check_addable(self, other: Any) -> None:
        if not isinstance(other, type(self)):
            raise TypeError(f"cannot combine a {type(self).__name__} with a {type(other).__name__}")
        if other._column_name != self._column_name:
            raise RowGroupIndexError(f"cannot combine indexes of different fields ({self._column_name!r} and "
                                     f"{other._column_name!r})")

    @property
    @abstractmethod
    def indexed_values(self) -> list[Any]:
        """The values the index holds."""

    @abstractmethod
    def get_row_group_indexes(self, value_key: Any = None) -> set[int]:
        """The row groups holding ``value_key`` (a new set)."""

    @abstractmethod
    def add(self, row_group: int, values: Iterable[Any]) -> None:
        """Index ``values``, the field's values (None for a null) in row group ``row_group``."""

    @abstractmethod
    def __add__(self, other: Any) -> RowGroupIndexerBase:
        """Merge ``other``'s entries into this indexer (Petastorm's reduce step); returns self."""

    @abstractmethod
    def to_json(self) -> dict[str, Any]:
        """The JSON-able form stored in the dataset's metadata."""

    def build_index(self, decoded_rows: Iterable[Mapping[str, Any]], piece_index: int) -> Any:
        """Petastorm's entry point: index the rows (field -> decoded value) of row group ``piece_index``."""
        self.add(piece_index, [row[self._column_name] for row in decoded_rows])
        return self._index_data  # type: ignore[attr-defined]

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and other.to_json() == self.to_json())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self._index_name!r}, {self._column_name!r}) "
                f"<{len(self.indexed_values)} values>")


class SingleFieldIndexer(RowGroupIndexerBase):
    """Index every value of one field (each element of a list field) to the row groups holding it.

    Nulls and NaNs are not indexed (no selector value can equal them).
    """

    kind = "single_field"

    def __init__(self, index_name: str, index_field: str) -> None:
        super().__init__(index_name, index_field)
        self._index_data: dict[Any, set[int]] = {}

    @property
    def indexed_values(self) -> list[Any]:
        return list(self._index_data)

    def get_row_group_indexes(self, value_key: Any = None) -> set[int]:
        return set(self._index_data.get(value_key, ()))

    def add(self, row_group: int, values: Iterable[Any]) -> None:
        for key in _flat_keys(values):
            self._index_data.setdefault(key, set()).add(row_group)

    def __add__(self, other: Any) -> SingleFieldIndexer:
        self._check_addable(other)
        for key, groups in other._index_data.items():
            self._index_data.setdefault(key, set()).update(groups)
        return self

    def to_json(self) -> dict[str, Any]:
        items = sorted(([encode_key(k), sorted(v)] for k, v in self._index_data.items()),
                       key=lambda item: repr(item[0]))
        return {"name": self._index_name, "kind": self.kind, "field": self._column_name, "values": items}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SingleFieldIndexer:
        indexer = cls(data.get("name"), data.get("field"))  # type: ignore[arg-type]
        values = data.get("values")
        if not isinstance(values, list):
            raise RowGroupIndexError(f"index {indexer.index_name!r}: 'values' must be a list")
        for item in values:
            if not isinstance(item, list) or len(item) != 2:
                raise RowGroupIndexError(f"index {indexer.index_name!r}: malformed entry {item!r:.80}")
            key = decode_key(item[0])
            indexer._index_data.setdefault(key, set()).update(_row_groups(item[1], f"index {indexer.index_name!r}"))
        return indexer


class FieldNotNullIndexer(RowGroupIndexerBase):
    """Record the row groups where a field has at least one value that is not null."""

    kind = "field_not_null"

    def __init__(self, index_name: str, index_field: str) -> None:
        super().__init__(index_name, index_field)
        self._index_data: set[int] = set()

    @property
    def indexed_values(self) -> list[Any]:
        return ["Field is Not Null"]

    def get_row_group_indexes(self, value_key: Any = None) -> set[int]:
        """The row groups with a value in the field, whatever ``value_key`` is (as in Petastorm)."""
        return set(self._index_data)

    def add(self, row_group: int, values: Iterable[Any]) -> None:
        if any(value is not None for value in values):
            self._index_data.add(row_group)

    def __add__(self, other: Any) -> FieldNotNullIndexer:
        self._check_addable(other)
        self._index_data.update(other._index_data)
        return self

    def to_json(self) -> dict[str, Any]:
        return {"name": self._index_name, "kind": self.kind, "field": self._column_name,
                "row_groups": sorted(self._index_data)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FieldNotNullIndexer:
        indexer = cls(data.get("name"), data.get("field"))  # type: ignore[arg-type]
        indexer._index_data = _row_groups(data.get("row_groups"), f"index {indexer.index_name!r}")
        return indexer


#: stored ``kind`` -> indexer class
INDEXERS: dict[str, type[SingleFieldIndexer] | type[FieldNotNullIndexer]] = {
    SingleFieldIndexer.kind: SingleFieldIndexer, FieldNotNullIndexer.kind: FieldNotNullIndexer}


def indexer_from_json(data: Any) -> RowGroupIndexerBase:
    """An indexer from its :meth:`~RowGroupIndexerBase.to_json` form."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in INDEXERS:
        raise RowGroupIndexError(f"unknown row-group index kind {kind!r} (this unihub reads {sorted(INDEXERS)}); "
                                 "upgrade unihub or rebuild the index")
    return INDEXERS[kind].from_json(data)


def _flat_keys(values: Iterable[Any]) -> set[Any]:
    """The distinct keys of a field's values: nulls and NaNs left out, arrays (list fields) by element."""
    keys: set[Any] = set()
    for value in values:
        if value is None:
            continue
        if isinstance(value, (np.ndarray, list)):
            array = np.asarray(value)
            if array.ndim != 1:
                raise RowGroupIndexError(f"cannot index a value of shape {array.shape}: SingleFieldIndexer indexes "
                                         "scalars and the elements of 1-D (list) fields")
            keys.update(index_key(v) for v in array if v is not None)
        else:
            keys.add(index_key(value))
    return {k for k in keys if not _is_nan(k)}


def _is_nan(key: Any) -> bool:
    return (isinstance(key, float) and math.isnan(key)) or (isinstance(key, decimal.Decimal) and key.is_nan())
