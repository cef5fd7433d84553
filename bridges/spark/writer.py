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

import datetime
import decimal
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from unihub.dependencies import require
from unihub.errors import CodecError, SchemaError
from unihub.fs import filesystem as fsutil
from unihub.petastorm.pickling import check_petastorm_compatible
from unihub.schema.unischema import SCHEMA_METADATA_KEY
from unihub.schema.validation import stored_as_text
from unihub.store.dataset import COMMON_METADATA, list_data_files, read_metadata
from unihub.store.integrity import SPARK_CHECKSUM_CONF
from unihub.store.metadata_files import petastorm_metadata, write_summary_metadata
from unihub.store.writer import check_row_group_size

if TYPE_CHECKING:
    from unihub.schema.unischema import Unischema, UnischemaField

#: Hadoop configuration keys ``materialize_dataset`` sets for the job and restores afterwards.
#: ``parquet.page.size.row.check.min`` is how many rows parquet-mr buffers before it first
#: measures a row group (100 by default): without lowering it, rows larger than
#: ``row_group_size_mb / 100`` give row groups of at least 100 rows, whatever the size asked.
_BLOCK_SIZE = "parquet.block.size"
_ROW_CHECK_MIN = "parquet.page.size.row.check.min"
_SUMMARY_LEVEL = "parquet.summary.metadata.level"
_ROW_CHECK_MIN_VALUE = 3  # Petastorm's value
#: Spark SQL settings for the job: timestamps as INT64 microseconds (what the Unischema's
#: ``timestamp[us]`` says) rather than Spark's default, the deprecated INT96; dates and times not rebased
#: to the Julian calendar (a session's LEGACY mode shifts old dates by days for every reader but Spark).
_SQL_CONF = {"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
             "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
             "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED"}


# -- rows ----------------------------------------------------------------------------------
def dict_to_spark_row(unischema: Unischema, row_dict: Mapping[str, Any]) -> Any:
    """Validate and encode one row dict into a ``pyspark.sql.Row`` in schema order (Petastorm's API).

    Every value is checked against its field first (a wrong dtype or shape, or ``None`` in a
    non-nullable field, raises :class:`~unihub.errors.ValidationError` naming the field), then
    encoded by the field's codec into the Python values Spark takes for
    :meth:`Unischema.as_spark_schema`: lists for tensors, ``bytearray`` for bytes,
    ``Decimal`` for uint64, UTC-aware ``datetime`` for ``timestamp`` with a time zone.
    Fields missing from ``row_dict`` are ``None`` (so they must be nullable).
    """
    row_cls = require("pyspark.sql", extra="spark", purpose="Spark rows").Row
    if not isinstance(row_dict, Mapping):
        if hasattr(row_dict, "_asdict"):
            row_dict = row_dict._asdict()
        else:
            raise SchemaError(f"dict_to_spark_row expects a mapping of field name -> value, "
                              f"got {type(row_dict).__name__}")
    unischema.validate(row_dict)
    values = {}
    for field, convert in _row_plan(unischema):
        values[field.name] = convert(row_dict.get(field.name))
    return row_cls(**values)


_Converter = Callable[[Any], Any]
_PLANS: dict[int, tuple[Unischema, list[tuple[UnischemaField, _Converter]]]] = {}


def _row_plan(unischema: Unischema) -> list[tuple[UnischemaField, _Converter]]:
    """Per field, a function from the row's value to the Spark value (cached per schema object)."""
    cached = _PLANS.get(id(unischema))
    if cached is not None and cached[0] is unischema:
        return cached[1]
    plan = [(field, _field_converter(field)) for field in unischema]
    if len(_PLANS) > 64:
        _PLANS.clear()
    _PLANS[id(unischema)] = (unischema, plan)  # holding the schema keeps its id from being reused
    return plan


def _field_converter(field: UnischemaField) -> _Converter:
    if stored_as_text(field):  # np.bytes_ as a Spark string (Petastorm's np.string_): str or UTF-8 bytes
        return lambda value: _as_text(field, value)
    arrow_type = field.arrow_type()
    to_spark = _value_converter(arrow_type)
    codec = field.codec
    # a np.datetime64 scalar skips the codec, whose ``.item()`` makes an int of a ns value
    temporal = field.shape == () and (pa.types.is_timestamp(arrow_type) or pa.types.is_date(arrow_type))

    def convert(value: Any) -> Any:
        if value is None:
            return None
        try:
            if codec is None or (temporal and isinstance(value, np.datetime64)):
                return to_spark(value)
            return to_spark(codec.encode(field, value))
        except CodecError as exc:
            if exc.field is not None:
                raise
            raise CodecError(f"field {field.name!r}: {exc}", field=field.name) from exc
        except (ValueError, TypeError, OverflowError, decimal.InvalidOperation) as exc:
            raise CodecError(f"field {field.name!r}: cannot convert {type(value).__name__} for Spark: {exc}",
                             field=field.name) from exc

    return convert


def _as_text(field: UnischemaField, value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CodecError(f"field {field.name!r}: {bytes(value)[:20]!r} is not UTF-8, and the field is stored as a "
                         "Spark string; give it ScalarCodec(BinaryType()) to store any bytes", field=field.name) from exc


def _value_converter(arrow_type: pa.DataType) -> _Converter:
    """A function from a codec-encoded value of ``arrow_type`` to what pyspark accepts for it."""
    if isinstance(arrow_type, pa.BaseExtensionType):
        arrow_type = arrow_type.storage_type
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    return _scalar_converter(arrow_type) or _nested_converter(arrow_type) or _plain


def _scalar_converter(arrow_type: pa.DataType) -> _Converter | None:
    """The converter of a scalar type pyspark takes as another Python type than numpy gives; None for the others."""
    if pa.types.is_uint64(arrow_type) or pa.types.is_decimal(arrow_type):
        return _to_decimal
    if pa.types.is_timestamp(arrow_type):
        return _to_aware_datetime if arrow_type.tz else _to_naive_datetime
    if pa.types.is_date(arrow_type):
        return _to_date
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type) or \
            pa.types.is_fixed_size_binary(arrow_type) or str(arrow_type) == "binary_view":
        return _to_bytearray
    return None


def _nested_converter(arrow_type: pa.DataType) -> _Converter | None:
    """The converter of a list, map or struct type, its children's converters inside; None for other types."""
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type):
        item = _value_converter(arrow_type.value_type)
        if item is _plain:  # numbers and strings: one ``tolist()``, no per-element Python
            return _to_list
        return lambda value: None if value is None else [None if v is None else item(v) for v in _to_list(value)]
    if pa.types.is_map(arrow_type):
        key, item = _value_converter(arrow_type.key_type), _value_converter(arrow_type.item_type)
        return lambda value: {key(k): None if v is None else item(v)
                              for k, v in (value.items() if isinstance(value, Mapping) else value)}
    if pa.types.is_struct(arrow_type):
        children = [(f.name, _value_converter(f.type)) for f in arrow_type]
        return lambda value: {name: None if value.get(name) is None else convert(value.get(name))
                              for name, convert in children}
    return None


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def _to_list(value: Any) -> Any:
    """A list of plain Python values (codecs already return lists, kept as they are)."""
    if value is None or isinstance(value, list):
        return value
    if isinstance(value, np.ndarray):
        return value.tolist()
    return [_plain(v) for v in value]


def _to_decimal(value: Any) -> Any:
    if isinstance(value, decimal.Decimal):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return decimal.Decimal(int(value))
    if isinstance(value, str):
        return decimal.Decimal(value)
    return value


def _datetime_of(value: Any) -> Any:
    """A ``datetime`` for np.datetime64 (Spark keeps microseconds: finer values are refused, not cut)."""
    if isinstance(value, np.datetime64):
        if np.isnat(value):
            return None
        micros = value.astype("datetime64[us]")
        if micros != value:
            raise CodecError(f"{value} has more precision than Spark's microseconds")
        return micros.item()
    return value


def _to_naive_datetime(value: Any) -> Any:
    return _datetime_of(value)


def _to_aware_datetime(value: Any) -> Any:
    """Naive datetimes are UTC (as in Arrow): Spark would otherwise read them in local time."""
    value = _datetime_of(value)
    if isinstance(value, datetime.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=datetime.timezone.utc)
    return value


def _to_date(value: Any) -> Any:
    if isinstance(value, np.datetime64):
        return value.astype("datetime64[D]").item()
    if isinstance(value, datetime.datetime):
        return value.date()
    return value


def _to_bytearray(value: Any) -> Any:
    if isinstance(value, (bytes, memoryview, np.bytes_)):
        return bytearray(value)
    return value


# -- writing ---------------------------------------------------------------------------------
@contextmanager
def materialize_dataset(spark: Any, dataset_url: str, schema: Unischema, row_group_size_mb: float | None = None,
                        use_summary_metadata: bool = False, filesystem_factory: Any = None,
                        petastorm_compatible: bool = False) -> Iterator[None]:
    """Context manager around a Spark Parquet write that makes it a Unischema dataset.

    For the job it sets ``parquet.block.size`` to ``row_group_size_mb`` (and lowers the row
    count parquet-mr waits for before measuring a row group, so large rows still give row
    groups of about that size), turns parquet-mr's own summary files off and has Spark
    write timestamps as INT64 microseconds, dates and times not rebased; every setting is restored on exit,
    error or not.
    When the block exits normally it writes ``_common_metadata`` holding the Arrow schema of
    the written files and the Unischema JSON; with ``use_summary_metadata`` also a
    ``_metadata`` file with every file's row groups (written by pyarrow, as Petastorm's
    option asked of parquet-mr). ``filesystem_factory`` (Petastorm's argument) returns the
    pyarrow or fsspec filesystem to write the metadata with; by default it is resolved
    from ``dataset_url``. ``petastorm_compatible=True`` also writes what Petastorm 0.13.1 needs
    to open the dataset (its pickled Unischema and the row groups per file), so readers not yet
    moved to unihub keep working; a field Petastorm cannot read is refused before the job runs.
    """
    if row_group_size_mb is not None:
        check_row_group_size(row_group_size_mb)
    if petastorm_compatible:
        check_petastorm_compatible(schema)
    job_hadoop = {_SUMMARY_LEVEL: "NONE", SPARK_CHECKSUM_CONF: "true"}  # a CRC-32 in every page header
    if row_group_size_mb:
        job_hadoop[_BLOCK_SIZE] = str(int(row_group_size_mb * 2**20))
        job_hadoop[_ROW_CHECK_MIN] = str(_ROW_CHECK_MIN_VALUE)
    hadoop_conf = _hadoop_conf(spark)
    # Spark builds each job's Hadoop conf from the SparkContext's and then the session's
    # settings, so a key the session sets itself wins: set it there too (and everything
    # there on Spark Connect, which has no Hadoop conf on the client).
    job_sql = dict(_SQL_CONF)
    job_sql.update({key: value for key, value in job_hadoop.items()
                    if hadoop_conf is None or spark.conf.get(key, None) is not None})
    saved_hadoop = {key: hadoop_conf.get(key) for key in job_hadoop} if hadoop_conf is not None else {}
    saved_sql = {key: spark.conf.get(key, None) for key in job_sql}
    try:
        for key in saved_hadoop:
            hadoop_conf.set(key, job_hadoop[key])
        for key, value in job_sql.items():
            spark.conf.set(key, value)
        yield
    finally:
        for key, value in saved_hadoop.items():
            if value is None:
                hadoop_conf.unset(key)
            else:
                hadoop_conf.set(key, value)
        for key, value in saved_sql.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
    filesystem = filesystem_factory() if filesystem_factory is not None else None
    write_common_metadata(normalize_url(dataset_url), schema, filesystem=filesystem,
                          summary=use_summary_metadata, petastorm_compatible=petastorm_compatible)


def _hadoop_conf(spark: Any) -> Any:
    """The SparkContext's Hadoop configuration, or None where there is none (Spark Connect)."""
    try:
        return spark.sparkContext._jsc.hadoopConfiguration()
    except Exception:  # pyspark raises its own NotImplemented error for Connect sessions
        return None


def normalize_url(url: str) -> str:
    """``file:/x`` (Hadoop's spelling) -> ``file:///x``."""
    url = str(url)
    if url.startswith("file:") and not url.startswith("file://"):
        return "file://" + "/" + url[len("file:"):].lstrip("/")
    return url


def write_common_metadata(dataset_url: str, schema: Unischema, *, filesystem: Any = None,
                          summary: bool = False, petastorm_compatible: bool = False) -> None:
    """Write ``_common_metadata`` with the data files' Arrow schema plus the Unischema JSON.

    With ``summary``, also ``_metadata``: the same schema and every data file's row groups.
    With ``petastorm_compatible``, also Petastorm's pickled Unischema and row groups per file.
    """
    fs, root = fsutil.resolve_filesystem(normalize_url(dataset_url), filesystem)
    if not fsutil.is_dir(fs, root):
        raise SchemaError(f"{dataset_url}: no such directory; did the Spark job write to another URL?")
    paths = sorted(list_data_files(fs, root))
    if not paths:
        raise SchemaError(f"{dataset_url}: the Spark job wrote no Parquet files; nothing to describe")
    first = read_metadata(fs, paths[0])
    arrow_schema = first.schema.to_arrow_schema()
    metadata = dict(arrow_schema.metadata or {})
    metadata[SCHEMA_METADATA_KEY] = schema.to_json().encode()
    if petastorm_compatible:
        metadata.update(petastorm_metadata(schema, fs, root, paths))
    arrow_schema = arrow_schema.with_metadata(metadata)
    pq.write_metadata(arrow_schema, fsutil.join(root, COMMON_METADATA), filesystem=fs)
    if summary:
        write_summary_metadata(fs, root, paths, first)
