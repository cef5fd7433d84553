"""Row-group selectors, Petastorm's ``petastorm.selectors``: which row groups a reader reads.

Pass one as ``make_reader(..., rowgroup_selector=...)``. A selector names the indexes it
needs (:meth:`~RowGroupSelectorBase.get_index_names`) and picks row groups from them
(:meth:`~RowGroupSelectorBase.select_row_groups`); the reader then plans, shuffles and
shards only those. Selection is by row group: a selected row group is read whole, so
rows without the value come too (add a ``predicate`` to drop them).

    reader = make_reader(url, rowgroup_selector=IntersectIndexSelector([
        SingleIndexSelector("camera_idx", ["front"]), SingleIndexSelector("label_idx", [3, 7])]))

Any object with Petastorm's two methods works, Petastorm's own selectors included.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from unihub.readers.rowgroup_indexers import RowGroupIndexError


class RowGroupSelectorBase(ABC):
    """Petastorm's selector contract."""

    @abstractmethod
    def get_index_names(self) -> list[str]:
        """The names of the indexes the selector needs."""

    @abstractmethod
    def select_row_groups(self, index_dict: Mapping[str, Any]) -> set[int]:
        """The selected row groups, given ``{index name: indexer}``."""


class SingleIndexSelector(RowGroupSelectorBase):
    """Row groups holding any of ``values_list`` in the index ``index_name``.

    On a ``FieldNotNullIndexer`` index: the row groups where its field is not null, for any
    (non-empty) ``values_list``.
    """

    def __init__(self, index_name: str, values_list: Iterable[Any]) -> None:
        if not isinstance(index_name, str) or not index_name:
            raise RowGroupIndexError(f"index_name must be a non-empty string, got {index_name!r}")
        if isinstance(values_list, (str, bytes)) or not isinstance(values_list, Iterable):
            raise RowGroupIndexError(f"values_list must be a list of values, got {values_list!r:.80} "
                                     f"(for one value, pass [{values_list!r:.40}])")
        self._index_name = index_name
        self._values_to_select = list(values_list)

    def get_index_names(self) -> list[str]:
        return [self._index_name]

    def select_row_groups(self, index_dict: Mapping[str, Any]) -> set[int]:
        indexer = index_dict[self._index_name]
        row_groups: set[int] = set()
        for value in self._values_to_select:
            row_groups |= set(indexer.get_row_group_indexes(value))
        return row_groups

    def __repr__(self) -> str:
        return f"SingleIndexSelector({self._index_name!r}, {self._values_to_select!r})"


class _CombinedSelector(RowGroupSelectorBase):
    def __init__(self, single_index_selectors: Sequence[Any]) -> None:
        selectors = list(single_index_selectors) if isinstance(single_index_selectors, Iterable) else None
        if not selectors:
            raise RowGroupIndexError(f"{type(self).__name__} needs a non-empty list of selectors, "
                                     f"got {single_index_selectors!r:.80}")
        for selector in selectors:
            check_selector(selector)
        self._single_index_selectors = selectors

    def get_index_names(self) -> list[str]:
        """Every index the selectors need (Petastorm listed only each one's first)."""
        names: list[str] = []
        for selector in self._single_index_selectors:
            names.extend(n for n in selector.get_index_names() if n not in names)
        return names

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._single_index_selectors!r})"


class IntersectIndexSelector(_CombinedSelector):
    """Row groups that every one of the selectors selects."""

    def select_row_groups(self, index_dict: Mapping[str, Any]) -> set[int]:
        first, *rest = self._single_index_selectors
        row_groups = set(first.select_row_groups(index_dict))
        for selector in rest:
            row_groups &= set(selector.select_row_groups(index_dict))
        return row_groups


class UnionIndexSelector(_CombinedSelector):
    """Row groups that at least one of the selectors selects."""

    def select_row_groups(self, index_dict: Mapping[str, Any]) -> set[int]:
        row_groups: set[int] = set()
        for selector in self._single_index_selectors:
            row_groups |= set(selector.select_row_groups(index_dict))
        return row_groups


def check_selector(selector: Any) -> Any:
    """``selector`` if it has Petastorm's selector methods, else a :class:`RowGroupIndexError`."""
    if not (callable(getattr(selector, "get_index_names", None))
            and callable(getattr(selector, "select_row_groups", None))):
        raise RowGroupIndexError(f"rowgroup_selector must be a row-group selector (SingleIndexSelector, "
                                 f"IntersectIndexSelector, UnionIndexSelector or a RowGroupSelectorBase), "
                                 f"got {type(selector).__name__}")
    return selector
