"""``petastorm.etl.rowgroup_indexers``: unihub's row-group indexers."""

from unihub import FieldNotNullIndexer, RowGroupIndexerBase, SingleFieldIndexer

__all__ = ["FieldNotNullIndexer", "RowGroupIndexerBase", "SingleFieldIndexer"]
