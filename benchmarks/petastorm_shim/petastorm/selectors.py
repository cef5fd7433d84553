"""``petastorm.selectors``: unihub's row-group selectors."""

from unihub import IntersectIndexSelector, RowGroupSelectorBase, SingleIndexSelector, UnionIndexSelector

__all__ = ["IntersectIndexSelector", "RowGroupSelectorBase", "SingleIndexSelector", "UnionIndexSelector"]
