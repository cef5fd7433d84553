"""``dataset_as_rdd``: a dataset as a Spark RDD of decoded rows (Petastorm's ``petastorm.spark_utils``).

The rows are namedtuples of the dataset's Unischema (or of the view ``schema_fields`` selects),
every value decoded by its field's codec: images and tensors as numpy arrays, scalars as numpy
scalars, a null as None (as Petastorm's ``dataset_as_rdd`` gives it)::

    rdd = dataset_as_rdd("file:///data/ds", spark, schema_fields=["id", "image"])
    rdd.map(lambda row: row.image.mean()).take(3)

Spark tasks read the row groups with pyarrow, as unihub's readers do, rather than through
Spark's Parquet reader (which reads none of the Arrow types Spark lacks, such as unsigned
integers or tensors), and decode each column of a row group at once. So executors need the
filesystem access a reader needs (credentials in their environment, libhdfs for HDFS). The
store's row-group index is broadcast once; the RDD holds the rows in the dataset's order.

pyspark is imported by the caller's session, never here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any

from unihub.errors import InvalidArgumentError
from unihub.readers.decode import decode_column
from unihub.schema.unischema import Unischema, UnischemaField
from unihub.store.dataset import ParquetStore, open_dataset, stored_schema

#: Spark's default ``spark.sql.files.maxPartitionBytes``: partitions hold about this much Parquet
_PARTITION_BYTES = 128 * 2**20


def dataset_as_rdd(dataset_url: Any, spark_session: Any, schema_fields: Iterable[UnischemaField | str] | None = None,
                   hdfs_driver: str = "libhdfs3", *, storage_options: dict[str, Any] | None = None,
                   filesystem: Any = None) -> Any:
    """An RDD of the dataset's rows as namedtuples, decoded by the codecs (Petastorm's function).

    ``dataset_url``: what :func:`unihub.open_dataset` takes; the dataset must store a Unischema
    (plain Parquet is a :class:`~unihub.errors.PetastormMetadataError`, as in Petastorm: use
    ``spark.read.parquet`` there). ``spark_session``: a ``SparkSession`` (or ``SparkContext``).
    ``schema_fields``: UnischemaFields, names or regular expressions, or None for every field.
    ``hdfs_driver`` is accepted for Petastorm's signature; pyarrow picks the HDFS client.
    """
    context = getattr(spark_session, "sparkContext", spark_session)
    if not hasattr(context, "parallelize"):
        raise InvalidArgumentError(f"dataset_as_rdd needs a SparkSession (or SparkContext) as spark_session, "
                                   f"got {type(spark_session).__name__}")
    store = open_dataset(dataset_url, filesystem=filesystem, storage_options=storage_options)
    schema = stored_schema(store)
    if schema_fields is not None:
        if isinstance(schema_fields, (str, UnischemaField)):
            raise InvalidArgumentError(f"schema_fields is a list of fields, names or patterns; got {schema_fields!r} "
                                       f"(write [{schema_fields!r}])")
        schema = schema.create_schema_view(schema_fields)
        if not schema.fields:
            raise InvalidArgumentError("schema_fields selects no field; pass None for every field")
    count = len(store.row_groups)
    slices = max(1, min(count, max(context.defaultParallelism, math.ceil(store.total_bytes / _PARTITION_BYTES))))
    shared = context.broadcast(store)  # lives as long as the RDD that refers to it
    return context.parallelize(range(count), slices).mapPartitions(partial(_decoded_rows, shared, schema))


def _decoded_rows(shared: Any, schema: Unischema, groups: Iterator[int]) -> Iterator[Any]:
    """The rows of row groups ``groups``, one namedtuple each (runs in the Spark tasks)."""
    store: ParquetStore = shared.value
    row_type: type[Any] = schema._get_namedtuple()  # a namedtuple class made for the schema
    names = list(schema.fields)
    for group in groups:
        table = store.read_row_group(group, names)
        columns = [decode_column(field, table.column(field.name)) for field in schema]
        yield from map(row_type._make, zip(*columns))
