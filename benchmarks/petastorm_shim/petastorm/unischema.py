"""``petastorm.unischema``: unihub's schema classes."""

from unihub import Unischema, UnischemaField, dict_to_spark_row, match_unischema_fields

__all__ = ["Unischema", "UnischemaField", "dict_to_spark_row", "match_unischema_fields"]
