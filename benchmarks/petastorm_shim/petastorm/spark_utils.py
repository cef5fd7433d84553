"""``petastorm.spark_utils``: unihub's Spark RDD reader."""

from unihub.bridges.spark.rdd import dataset_as_rdd

__all__ = ["dataset_as_rdd"]
