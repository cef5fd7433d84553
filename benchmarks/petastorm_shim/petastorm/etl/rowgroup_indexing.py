"""``petastorm.etl.rowgroup_indexing``: unihub's row-group index builder."""

from unihub import build_rowgroup_index, get_row_group_indexes

__all__ = ["build_rowgroup_index", "get_row_group_indexes"]
