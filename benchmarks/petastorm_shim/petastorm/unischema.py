"""``petastorm.unischema``: unihub's schema classes."""

from unihub import Unischema, UnischemaField, dict_to_spark_row, insert_explicit_nulls, match_unischema_fields

__all__ = ["Unischema", "UnischemaField", "dict_to_spark_row", "insert_explicit_nulls", "match_unischema_fields"]
