"""Spark: Petastorm's materialize_dataset, datasets as RDDs, and make_spark_converter."""
