"""``petastorm.spark``: unihub's Spark DataFrame converter."""

from petastorm.spark import spark_dataset_converter

from unihub.bridges.spark.converter import SparkDatasetConverter, make_spark_converter

__all__ = ["SparkDatasetConverter", "make_spark_converter", "spark_dataset_converter"]
