"""Writing Unischema datasets with PySpark, as Petastorm did, and Spark <-> Arrow types.

``materialize_dataset`` wraps a Spark write: it sets the Parquet row-group size for the
job and, when the job is done, writes ``_common_metadata`` with the Unischema JSON, so
the result opens exactly like a dataset from :func:`unihub.write_dataset`::

    with materialize_dataset(spark, "file:///data/ds", Schema, row_group_size_mb=64):
        rows = spark.sparkContext.parallelize(range(n)).map(lambda i: dict_to_spark_row(Schema, make(i)))
        spark.createDataFrame(rows, Schema.as_spark_schema()).write.parquet("file:///data/ds")

pyspark is imported inside the functions that need it, never at module import.
"""

from __future__ import annotations

import decimal
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from unihub.dependencies import require
from unihub.errors import SchemaError

if TYPE_CHECKING:
    from unihub.formats.schema import Unischema

_SIMPLE_ARROW_TO_SPARK = {
    "bool": "BooleanType", "int8": "ByteType", "int16": "ShortType", "int32": "IntegerType",
    "int64": "LongType", "uint8": "ShortType", "uint16": "IntegerType", "uint32": "LongType",
    "halffloat": "FloatType", "float": "FloatType", "double": "DoubleType", "string": "StringType",
    "large_string": "StringType", "binary": "BinaryType", "large_binary": "BinaryType",
    "date32[day]": "DateType", "null": "NullType",
}
_SPARK_TO_ARROW = {
    "BooleanType": pa.bool_(), "ByteType": pa.int8(), "ShortType": pa.int16(), "IntegerType": pa.int32(),
    "LongType": pa.int64(), "FloatType": pa.float32(), "DoubleType": pa.float64(), "StringType": pa.string(),
    "BinaryType": pa.binary(), "DateType": pa.date32(), "TimestampType": pa.timestamp("us", tz="UTC"),
    "TimestampNTZType": pa.timestamp("us"), "NullType": pa.null(),
}


def _types() -> Any:
    return require("pyspark.sql.types", extra="spark", purpose="Spark types")


def arrow_to_spark_type(arrow_type: pa.DataType) -> Any:
    """The pyspark ``DataType`` that stores an Arrow type (unsigned ints widen)."""
    types = _types()
    if isinstance(arrow_type, pa.ExtensionType):
        arrow_type = arrow_type.storage_type
    name = _SIMPLE_ARROW_TO_SPARK.get(str(arrow_type))
    if name is not None:
        return getattr(types, name)()
    if pa.types.is_decimal(arrow_type):
        return types.DecimalType(arrow_type.precision, arrow_type.scale)
    if pa.types.is_uint64(arrow_type):
        return types.DecimalType(20, 0)
    if pa.types.is_timestamp(arrow_type):
        return types.TimestampType() if arrow_type.tz else types.TimestampNTZType()
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type):
        return types.ArrayType(arrow_to_spark_type(arrow_type.value_type), arrow_type.value_field.nullable)
    if pa.types.is_struct(arrow_type):
        return types.StructType([types.StructField(f.name, arrow_to_spark_type(f.type), f.nullable)
                                 for f in arrow_type])
    raise SchemaError(f"Arrow type {arrow_type} has no Spark equivalent")


def spark_to_arrow_type(spark_type: Any) -> pa.DataType:
    """The Arrow type for a pyspark ``DataType`` instance (read by class name, no import)."""
    name = type(spark_type).__name__
    if name in _SPARK_TO_ARROW:
        return _SPARK_TO_ARROW[name]
    if name == "DecimalType":
        return pa.decimal128(spark_type.precision, spark_type.scale)
    if name == "ArrayType":
        return pa.list_(spark_to_arrow_type(spark_type.elementType))
    if name == "StructType":
        return pa.struct([pa.field(f.name, spark_to_arrow_type(f.dataType), f.nullable) for f in spark_type.fields])
    raise SchemaError(f"Spark type {spark_type!r} has no Arrow equivalent in unihub")


def dict_to_spark_row(unischema: Unischema, row_dict: Mapping[str, Any]) -> Any:
    """Validate and encode one row dict into a ``pyspark.sql.Row`` in schema order (Petastorm's API)."""
    row_cls = require("pyspark.sql", extra="spark", purpose="Spark rows").Row
    unischema.validate(row_dict)
    values = {}
    for field in unischema:
        value = row_dict.get(field.name)
        if value is not None and field.codec is not None:
            value = field.codec.encode(field, value)
        values[field.name] = _to_spark_value(value)
    return row_cls(**values)


def _to_spark_value(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (bytes, memoryview)):
        return bytearray(value)
    if isinstance(value, dict):
        return {k: _to_spark_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_spark_value(v) for v in value]
    if isinstance(value, decimal.Decimal):
        return value
    return value


@contextmanager
def materialize_dataset(spark: Any, dataset_url: str, schema: Unischema, row_group_size_mb: float | None = None,
                        use_summary_metadata: bool = False, filesystem_factory: Any = None) -> Iterator[None]:
    """Context manager around a Spark Parquet write that makes it a Unischema dataset.

    Sets ``parquet.block.size`` for the job (restored afterwards) and, on exit, writes
    ``_common_metadata`` holding the Arrow schema of the written files and the Unischema JSON.
    ``use_summary_metadata`` and ``filesystem_factory`` are accepted for Petastorm
    compatibility; the metadata goes through pyarrow's filesystem for ``dataset_url``.
    """
    hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()
    saved = {key: hadoop_conf.get(key) for key in ("parquet.block.size", "parquet.summary.metadata.level")}
    if row_group_size_mb:
        hadoop_conf.setInt("parquet.block.size", int(row_group_size_mb * 2**20))
    hadoop_conf.set("parquet.summary.metadata.level", "NONE")
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                hadoop_conf.unset(key)
            else:
                hadoop_conf.set(key, value)
    write_common_metadata(dataset_url, schema, filesystem=filesystem_factory() if filesystem_factory else None)


def write_common_metadata(dataset_url: str, schema: Unischema, *, filesystem: Any = None) -> None:
    """Write ``_common_metadata`` with the data files' Arrow schema plus the Unischema JSON."""
    from unihub.formats import filesystem as fsutil
    from unihub.formats.parquet import COMMON_METADATA, _list_data_files, _read_metadata
    from unihub.formats.schema import SCHEMA_METADATA_KEY

    fs, root = fsutil.resolve_filesystem(dataset_url, filesystem)
    paths = sorted(_list_data_files(fs, root))
    if not paths:
        raise SchemaError(f"{dataset_url}: the Spark job wrote no Parquet files; nothing to describe")
    arrow_schema = _read_metadata(fs, paths[0]).schema.to_arrow_schema()
    metadata = dict(arrow_schema.metadata or {})
    metadata[SCHEMA_METADATA_KEY] = schema.to_json().encode()
    pq.write_metadata(arrow_schema.with_metadata(metadata), fsutil.join(root, COMMON_METADATA), filesystem=fs)
