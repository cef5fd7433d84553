"""``petastorm.spark.spark_dataset_converter``: unihub's Spark DataFrame converter."""

from unihub.bridges.spark.converter import SparkDatasetConverter, make_spark_converter, register_delete_dir_handler

__all__ = ["SparkDatasetConverter", "make_spark_converter", "register_delete_dir_handler"]
