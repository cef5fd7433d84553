"""The Arrow <-> Spark type mapping, pure: pyspark's types are imported only to build a Spark type.

``Unischema.as_spark_schema()`` and the codecs' ``spark_dtype()`` map their Arrow types here, and the
Spark bridge (:mod:`unihub.bridges.spark.writer`) writes with it; the schema stays below the bridges.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from unihub.dependencies import require
from unihub.errors import SchemaError

_SIMPLE_ARROW_TO_SPARK = {
    "bool": "BooleanType", "int8": "ByteType", "int16": "ShortType", "int32": "IntegerType",
    "int64": "LongType", "uint8": "ShortType", "uint16": "IntegerType", "uint32": "LongType",
    "halffloat": "FloatType", "float": "FloatType", "double": "DoubleType", "string": "StringType",
    "large_string": "StringType", "string_view": "StringType", "binary": "BinaryType",
    "large_binary": "BinaryType", "binary_view": "BinaryType", "date32[day]": "DateType", "null": "NullType",
}
_SPARK_TO_ARROW = {
    "BooleanType": pa.bool_(), "ByteType": pa.int8(), "ShortType": pa.int16(), "IntegerType": pa.int32(),
    "LongType": pa.int64(), "FloatType": pa.float32(), "DoubleType": pa.float64(), "StringType": pa.string(),
    "CharType": pa.string(), "VarcharType": pa.string(),
    "BinaryType": pa.binary(), "DateType": pa.date32(), "TimestampType": pa.timestamp("us", tz="UTC"),
    "TimestampNTZType": pa.timestamp("us"), "NullType": pa.null(),
}


def _types() -> Any:
    return require("pyspark.sql.types", extra="spark", purpose="Spark types")


def arrow_to_spark_type(arrow_type: pa.DataType) -> Any:
    """The pyspark ``DataType`` that stores an Arrow type.

    Spark has no unsigned integers: uint8/16/32 widen to the next signed type and uint64
    becomes ``DecimalType(20, 0)``; extension types (tensors) map through their storage.
    """
    types = _types()
    if isinstance(arrow_type, pa.BaseExtensionType):
        arrow_type = arrow_type.storage_type
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    name = _SIMPLE_ARROW_TO_SPARK.get(str(arrow_type))
    if name is not None:
        return getattr(types, name)()
    if pa.types.is_decimal(arrow_type):
        if arrow_type.precision > 38:
            raise SchemaError(f"Arrow type {arrow_type} has more digits than Spark's DecimalType (38)")
        return types.DecimalType(arrow_type.precision, arrow_type.scale)
    if pa.types.is_uint64(arrow_type):
        return types.DecimalType(20, 0)
    if pa.types.is_timestamp(arrow_type):
        return types.TimestampType() if arrow_type.tz else types.TimestampNTZType()
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type):
        return types.ArrayType(arrow_to_spark_type(arrow_type.value_type), arrow_type.value_field.nullable)
    if pa.types.is_map(arrow_type):
        return types.MapType(arrow_to_spark_type(arrow_type.key_type), arrow_to_spark_type(arrow_type.item_type),
                             arrow_type.item_field.nullable)
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
        return pa.list_(pa.field("item", spark_to_arrow_type(spark_type.elementType), spark_type.containsNull))
    if name == "MapType":
        return pa.map_(spark_to_arrow_type(spark_type.keyType),
                       pa.field("value", spark_to_arrow_type(spark_type.valueType), spark_type.valueContainsNull))
    if name == "StructType":
        return pa.struct([pa.field(f.name, spark_to_arrow_type(f.dataType), f.nullable) for f in spark_type.fields])
    raise SchemaError(f"Spark type {spark_type!r} has no Arrow equivalent in unihub")
