"""``make_spark_converter``: a Spark DataFrame cached as Parquet and served to PyTorch or TensorFlow.

Petastorm's ``petastorm.spark`` API. The DataFrame is written once under the parent cache
directory named by the Spark conf ``petastorm.spark.converter.parentCacheDirUrl`` (or
``unihub.spark.converter.parentCacheDirUrl``); each conversion gets its own directory::

    {parent}/unihub-converter-{key}/part-*.parquet     Spark's files (row groups of about
                                                        ``parquet_row_group_size_bytes``)
    {parent}/unihub-converter-{key}/_SUCCESS            Spark's job marker
    {parent}/unihub-converter-{key}/_unihub_converter.json
                                                        written last: the directory is complete
                                                        (row count, data files, options, the plan's hash)

``key`` hashes the DataFrame's analyzed plan, the Spark application id and the options,
so converting the same DataFrame again (same plan, same options) in the same application
reuses the directory instead of writing again. Spark writes into a hidden sibling that is
renamed into place (atomic on local disks), and the JSON marker is written only after the
rename, so a half-written directory is never taken as a cache hit. The directories a process wrote are
removed when it exits (Petastorm's atexit clean-up), or earlier by ``converter.delete()``.

    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, "file:///tmp/cache")
    converter = make_spark_converter(df)
    with converter.make_torch_dataloader(batch_size=64, num_epochs=1) as loader:
        for batch in loader:
            ...
    converter.delete()

``make_spark_converter("file:///data/parquet_dir")`` (a URL or path string, as in Petastorm) wraps
Parquet that is already written: nothing is cached or converted, no cache directory is needed,
and ``delete()`` leaves those files alone. ``register_delete_dir_handler(fn)`` makes ``delete()``
remove the cache directories it wrote with ``fn(url)`` (None: back to unihub's own removal).

pyspark, torch and tensorflow are imported inside the functions that need them.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlparse

from unihub.bridges.spark.writer import normalize_url
from unihub.dependencies import require
from unihub.errors import InvalidArgumentError, UnihubError, UnsupportedFormatError
from unihub.fs import filesystem as fsutil
from unihub.fs import publish
from unihub.readers.reader import make_batch_reader
from unihub.runtime.memory import DEFAULT_ROW_GROUP_SIZE_MB
from unihub.store.dataset import list_data_files, open_dataset
from unihub.store.integrity import SPARK_CHECKSUM_CONF

if TYPE_CHECKING:
    from unihub.readers.reader import Reader

Dtype = Literal["float32", "float64"]

#: Written into a cache directory after everything else: its presence means "complete".
MARKER = "_unihub_converter.json"
MARKER_VERSION = 1
_DIR_PREFIX = "unihub-converter-"
#: rows per batch of ``make_tf_dataset(batch_size=None)``: Petastorm's converter documents and uses 32
_TF_BATCH_SIZE = 32

_REGISTRY: dict[str, str] = {}  # conversion key -> cache_dir_url, for this process
_REGISTRY_LOCK = threading.Lock()
#: cache directories this process wrote and has not deleted -> its pid: removed when it exits, as Petastorm did
#: (no later process reuses them: the conversion key holds the Spark application id)
_WRITTEN: dict[str, int] = {}
_EXIT_HOOK: list[bool] = []  # one entry once the exit hook is registered
_KEY_LOCKS: dict[str, threading.Lock] = {}
#: Spark's cap on the items of a list in a plan's text (see ``_plan_text``)
_MAX_FIELDS_CONF = "spark.sql.debug.maxToStringFields"
_PLAN_TEXT_LOCK = threading.Lock()
#: Spark SQL settings of a converter's write (see ``_job_sql_conf``), and per session conf: writers, saved values
_JOB_SQL_CONF = {"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
                 "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
                 "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED"}
_JOB_SQL_USERS: dict[int, list[Any]] = {}


class ConverterConfigError(UnihubError, ValueError):
    """The Spark converter's cache directory is not configured, or not a usable URL."""


class SparkDatasetConverter:
    """A DataFrame materialized as Parquet: its location, size and framework loaders (Petastorm's class)."""

    PARENT_CACHE_DIR_URL_CONF = "petastorm.spark.converter.parentCacheDirUrl"
    UNIHUB_PARENT_CACHE_DIR_URL_CONF = "unihub.spark.converter.parentCacheDirUrl"

    def __init__(self, cache_dir_url: str, file_urls: list[str], dataset_size: int) -> None:
        self.cache_dir_url = cache_dir_url
        self.file_urls = file_urls
        self.dataset_size = dataset_size
        #: False for a converter over Parquet the caller wrote (``make_spark_converter(url)``):
        #: ``delete()`` keeps those files
        self.owns_files = True

    def __len__(self) -> int:
        """Rows in the materialized DataFrame."""
        return self.dataset_size

    def __repr__(self) -> str:
        return f"SparkDatasetConverter({self.cache_dir_url!r}, rows={self.dataset_size})"

    def _reader(self, num_epochs: int | None, workers_count: int | None, kwargs: dict[str, Any]) -> Reader:
        return make_batch_reader(self.cache_dir_url, num_epochs=num_epochs, workers_count=workers_count, **kwargs)

    @contextlib.contextmanager
    def make_torch_dataloader(self, batch_size: int = 32, num_epochs: int | None = None,
                              workers_count: int | None = None, shuffling_queue_capacity: int = 0,
                              data_loader_fn: Callable[..., Any] | None = None,
                              **petastorm_reader_kwargs: Any) -> Iterator[Any]:
        """A context manager yielding a PyTorch loader over the cached files; the reader stops on exit.

        ``data_loader_fn(reader=..., batch_size=..., shuffling_queue_capacity=...)`` builds the
        loader (default :class:`unihub.bridges.torch.loaders.BatchedDataLoader`); other keyword
        arguments go to :func:`unihub.make_batch_reader` (``schema_fields``, ``cur_shard``,
        ``shard_count``, ``seed``, ...). ``num_epochs=None`` repeats forever, as in Petastorm.
        """
        if data_loader_fn is None:
            data_loader_fn = _bridge("unihub.bridges.torch.loaders", "BatchedDataLoader", "torch", "torch")
        reader = self._reader(num_epochs, workers_count, petastorm_reader_kwargs)
        try:
            # every argument by keyword, as Petastorm passes them: a ``lambda **kwargs: ...`` works
            yield data_loader_fn(reader=reader, batch_size=batch_size, shuffling_queue_capacity=shuffling_queue_capacity)
        finally:
            reader.stop()
            reader.join()

    @contextlib.contextmanager
    def make_tf_dataset(self, batch_size: int = 32, prefetch: int | None = None, num_epochs: int | None = None,
                        workers_count: int | None = None, shuffling_queue_capacity: int | None = None,
                        **petastorm_reader_kwargs: Any) -> Iterator[Any]:
        """A context manager yielding a ``tf.data.Dataset`` of batches of ``batch_size`` rows (None: 32, as in Petastorm).

        Built by :func:`unihub.bridges.tf.dataset.make_tf_dataset`: the reader's batches are re-batched in
        numpy, shuffled across them in a buffer of ``shuffling_queue_capacity`` rows when given,
        and prefetched (``prefetch=None`` is ``tf.data.AUTOTUNE``, 0 turns it off). Other keyword
        arguments go to :func:`unihub.make_batch_reader`.
        """
        make_tf_dataset = _bridge("unihub.bridges.tf.dataset", "make_tf_dataset", "tensorflow", "tf")
        reader = self._reader(num_epochs, workers_count, petastorm_reader_kwargs)
        try:
            yield make_tf_dataset(reader, _TF_BATCH_SIZE if batch_size is None else batch_size,
                                  shuffle_buffer=shuffling_queue_capacity or 0,
                                  structure="namedtuple",  # Petastorm's converter yields namedtuples
                                  **({} if prefetch is None else {"prefetch": prefetch}))
        finally:
            reader.stop()
            reader.join()

    def delete(self) -> None:
        """Remove the cached directory (through the handler of :func:`register_delete_dir_handler`)
        and forget it, so the next conversion writes afresh.

        A converter made from a URL (``make_spark_converter(url)``) never deletes: those files are
        the caller's data, not a cache (Petastorm's delete() removed them), so it only warns.
        """
        if not self.owns_files:
            warnings.warn(f"{self.cache_dir_url} was given to make_spark_converter as existing Parquet, not "
                          "written as a cache: delete() leaves it in place", UserWarning, stacklevel=2)
            return
        with _REGISTRY_LOCK:
            for key in [k for k, url in _REGISTRY.items() if url == self.cache_dir_url]:
                del _REGISTRY[key]
            _WRITTEN.pop(self.cache_dir_url, None)
        _delete_dir_handler(self.cache_dir_url)


# -- deleting cache directories -----------------------------------------------------------------
def _delete_at_exit(url: str) -> None:
    """Have the cache directory ``url``, just written, removed when this process exits (unless ``delete()``
    removed it first)."""
    with _REGISTRY_LOCK:
        _WRITTEN[url] = os.getpid()
        if not _EXIT_HOOK:
            atexit.register(_delete_written)
            _EXIT_HOOK.append(True)


def _delete_written() -> None:
    """At exit: remove the cache directories this process wrote (through the registered handler); a process
    forked from it inherits the hook and removes nothing. A failure is a warning, as in Petastorm."""
    with _REGISTRY_LOCK:
        urls = [url for url, pid in _WRITTEN.items() if pid == os.getpid()]
        _WRITTEN.clear()
    for url in urls:
        try:
            _delete_dir_handler(url)
        except Exception as exc:  # any handler's failure: the process is ending, the others still go
            warnings.warn(f"Delete cache data {url} failed due to {exc!r}", UserWarning, stacklevel=1)


def _default_delete_dir_handler(dataset_url: str) -> None:
    """Remove ``dataset_url`` and everything under it, on whatever filesystem its scheme names."""
    fs, path = fsutil.resolve_filesystem(dataset_url)
    fsutil.remove(fs, path)


_delete_dir_handler: Callable[[str], Any] = _default_delete_dir_handler


def register_delete_dir_handler(handler: Callable[[str], Any] | None) -> None:
    """Have :meth:`SparkDatasetConverter.delete` remove cache directories with ``handler(url)`` (Petastorm's API).

    For filesystems pyarrow and fsspec cannot delete on (a cluster's own client, DBFS through
    ``dbutils``). ``handler`` takes the directory's URL; None restores the default handler::

        register_delete_dir_handler(lambda url: dbutils.fs.rm(url, recurse=True))
    """
    global _delete_dir_handler
    if handler is not None and not callable(handler):
        raise InvalidArgumentError(f"register_delete_dir_handler takes a function of a directory URL, or None "
                                   f"for the default; got {handler!r}")
    _delete_dir_handler = _default_delete_dir_handler if handler is None else handler


def _bridge(module: str, name: str, framework: str, extra: str) -> Any:
    """``name`` from a unihub framework bridge module, with an error that says what is missing."""
    import importlib

    require(framework, extra=extra, purpose=f"{module}.{name}")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise UnihubError(f"{module}.{name} is not available in this unihub ({exc}); "
                          f"pass data_loader_fn= or iterate the reader yourself") from exc


# -- converting ---------------------------------------------------------------------------------
def make_spark_converter(df: Any, parquet_row_group_size_bytes: int = int(DEFAULT_ROW_GROUP_SIZE_MB * 2**20),
                         compression_codec: str | None = None,
                         dtype: Dtype | None = "float32") -> SparkDatasetConverter:
    """Materialize ``df`` as Parquet under the configured cache directory (or reuse it) and wrap it.

    ML ``Vector`` columns become arrays; float and double columns, and arrays of them,
    become ``dtype`` ('float32', 'float64', or None to keep them as they are).
    ``compression_codec`` is Spark's Parquet codec name; None writes uncompressed files, as
    Petastorm 0.13.1's converter did (its ``option("compression", None)`` left them uncompressed,
    whatever ``spark.sql.parquet.compression.codec`` says).

    ``df`` may also be the URL (or local path) of a directory of Parquet files, as Petastorm
    allows: the converter then reads those files as they are; the other arguments are ignored
    (no cache is written, so nothing is converted) and ``delete()`` does not remove them.
    """
    if isinstance(df, (str, os.PathLike)):
        return _converter_over(os.fspath(df))
    if not hasattr(df, "sparkSession"):
        raise InvalidArgumentError(f"make_spark_converter takes a pyspark.sql.DataFrame or the URL of a directory "
                                   f"of Parquet files (e.g. 'file:///data/train'), got {type(df).__name__}")
    if dtype not in ("float32", "float64", None):
        raise UnsupportedFormatError(f"dtype {dtype} is not supported. Use 'float32' or float64 (or None, which "
                                     f"keeps every type); got {dtype!r}")  # Petastorm's words first
    if not isinstance(parquet_row_group_size_bytes, int) or parquet_row_group_size_bytes <= 0:
        raise ConverterConfigError(f"parquet_row_group_size_bytes must be a positive integer, "
                                   f"got {parquet_row_group_size_bytes!r}")
    spark = df.sparkSession
    parent = _parent_cache_dir_url(spark)
    options = {"row_group_size": parquet_row_group_size_bytes, "compression": compression_codec, "dtype": dtype}
    key = _conversion_key(df, spark, parent, options)
    with _key_lock(key):
        with _REGISTRY_LOCK:
            url = _REGISTRY.get(key) or parent + ("" if parent.endswith("/") else "/") + _DIR_PREFIX + key
        marker = _read_marker(url)  # also checked on a registry hit: the files may have been removed
        if marker is None:
            _write(_prepare(df, dtype), url, parquet_row_group_size_bytes, compression_codec, key, options)
            _delete_at_exit(url)
            marker = _read_marker(url)
            if marker is None:
                raise UnihubError(f"{url}: the Spark job finished but {MARKER} is missing")
        with _REGISTRY_LOCK:
            _REGISTRY[key] = url
    return SparkDatasetConverter(url, _file_urls(url), int(marker["rows"]))


def _converter_over(url: str) -> SparkDatasetConverter:
    """A converter over Parquet files the caller wrote: counted from the footers, no Spark job."""
    url = normalize_url(url)  # Hadoop's 'file:/x'
    store = open_dataset(url)  # a DatasetNotFoundError names a missing or empty directory
    converter = SparkDatasetConverter(url, _as_urls(url, store.path, (f.path for f in store.files)), store.num_rows)
    converter.owns_files = False
    return converter


def _parent_cache_dir_url(spark: Any) -> str:
    """The parent cache directory from the Spark conf, checked to be a URL with a scheme."""
    keys = (SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, SparkDatasetConverter.UNIHUB_PARENT_CACHE_DIR_URL_CONF)
    url = next((value for value in (spark.conf.get(k, None) for k in keys) if value), None)
    if not url:
        raise ConverterConfigError(
            f"the Spark converter needs a cache directory: set the Spark conf {keys[0]!r} (or {keys[1]!r}), "
            f"e.g. spark.conf.set({keys[0]!r}, 'file:///tmp/unihub-cache')")
    url = normalize_url(url)
    if not urlparse(url).scheme or "://" not in url:
        raise ConverterConfigError(f"{keys[0]} must be a URL such as 'file:///tmp/cache' or 's3a://bucket/cache', "
                                   f"got {url!r}")
    return _without_trailing_slash(url)


def _without_trailing_slash(url: str) -> str:
    """``url`` without trailing '/' (a root such as ``file:///`` keeps its own), so the same parent
    directory spelled with and without one gives the same conversion key, as in Petastorm."""
    scheme, separator, rest = url.partition("://")
    stripped = rest.rstrip("/")
    return scheme + separator + stripped if stripped else url


def _conversion_key(df: Any, spark: Any, parent: str, options: dict[str, Any]) -> str:
    """A hash of the analyzed plan, the application, the parent directory and the options.

    The plan's text names columns by expression ids, which restart in every JVM, and does
    not show in-memory data (``LocalRelation``), so the application id is part of the key:
    a new application never mistakes another DataFrame's files for this one's. It is written
    with every field (:func:`_plan_text`): Spark's shortened text of a wide plan would give two
    DataFrames that differ only in a late column the same key.
    """
    try:
        plan = _plan_text(df, spark)
    except Exception:  # Spark Connect has no _jdf; semanticHash is the canonical plan's hash
        plan = f"semantic:{df.semanticHash()}"
    text = json.dumps({"plan": plan, "app": spark.conf.get("spark.app.id", None), "parent": parent,
                       "options": options,
                       "schema": df.schema.json()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _plan_text(df: Any, spark: Any) -> str:
    """The analyzed plan of ``df`` as text, no list in it cut short.

    Spark writes at most ``spark.sql.debug.maxToStringFields`` (25) items of a list and then "... n more
    fields", so a projection's late columns (``withColumn`` on a wide DataFrame) would not show; the conf
    is raised while the text is made, then restored."""
    conf = spark.conf
    with _PLAN_TEXT_LOCK:  # threads converting at once would otherwise restore each other's raised value
        saved = conf.get(_MAX_FIELDS_CONF, None)
        conf.set(_MAX_FIELDS_CONF, str(2**31 - 1))
        try:
            return str(df._jdf.queryExecution().analyzed().toString())
        finally:
            if saved is None:
                conf.unset(_MAX_FIELDS_CONF)
            else:
                conf.set(_MAX_FIELDS_CONF, saved)


def _key_lock(key: str) -> threading.Lock:
    with _REGISTRY_LOCK:
        return _KEY_LOCKS.setdefault(key, threading.Lock())


def _prepare(df: Any, dtype: Dtype | None) -> Any:
    """``df`` with ML vectors as arrays (a null vector as a null) and floating-point columns (and arrays of
    them) cast to ``dtype``."""
    types = require("pyspark.sql.types", extra="spark")
    functions = require("pyspark.sql.functions", extra="spark")
    columns = []
    for field in df.schema.fields:
        column = functions.col("`" + field.name.replace("`", "``") + "`")  # any name: dots, spaces, backticks
        if _is_vector(field.dataType):
            ml_functions = require("pyspark.ml.functions", extra="spark", purpose="converting ML vectors")
            # a null vector stays null (vector_to_array refuses a null and would fail the whole job)
            column = functions.when(column.isNotNull(), ml_functions.vector_to_array(column, dtype or "float64"))
        else:
            target = _cast_type(field.dataType, dtype, types)
            if target is not None:
                column = column.cast(target)
        columns.append(column.alias(field.name))
    return df.select(*columns)


def _is_vector(data_type: Any) -> bool:
    """True for ``pyspark.ml.linalg.VectorUDT`` and the older ``pyspark.mllib.linalg.VectorUDT``."""
    return type(data_type).__name__ == "VectorUDT"


def _cast_type(data_type: Any, dtype: Dtype | None, types: Any) -> Any:
    """The type to cast ``data_type`` to for ``dtype``, or None when it stays as it is."""
    if dtype is None:
        return None
    wanted = types.FloatType() if dtype == "float32" else types.DoubleType()
    if isinstance(data_type, (types.FloatType, types.DoubleType)):
        return None if data_type == wanted else wanted
    if isinstance(data_type, types.ArrayType):
        element = _cast_type(data_type.elementType, dtype, types)
        return None if element is None else types.ArrayType(element, data_type.containsNull)
    return None


def _write(df: Any, url: str, row_group_size: int, compression: str | None, key: str,
           options: dict[str, Any]) -> None:
    """Write ``df`` into a hidden sibling of ``url``, rename it into place, then write the marker."""
    fs, path = fsutil.resolve_filesystem(url)
    temporary_url = url.rsplit("/", 1)[0] + "/" + fsutil.temporary_sibling(path).rsplit("/", 1)[-1]
    writer = (df.write.mode("overwrite").option("parquet.block.size", str(row_group_size))
              .option(SPARK_CHECKSUM_CONF, "true"))  # a CRC-32 in every page header, verified on read
    writer = writer.option("compression", "uncompressed" if compression is None else compression)  # Petastorm's
    try:
        with _job_sql_conf(df.sparkSession):
            writer.parquet(temporary_url)
        _, temporary = fsutil.resolve_filesystem(temporary_url)
        publish.commit(fs, temporary, path)
    except BaseException:
        with contextlib.suppress(Exception):
            fsutil.remove(fs, fsutil.resolve_filesystem(temporary_url)[1])
        raise
    rows = open_dataset(url).num_rows
    marker = {"version": MARKER_VERSION, "key": key, "rows": rows, "options": options, "files": _file_names(url)}
    with fs.open_output_stream(fsutil.join(path, MARKER)) as out:
        out.write(json.dumps(marker, sort_keys=True).encode())


@contextlib.contextmanager
def _job_sql_conf(spark: Any) -> Iterator[None]:
    """While converters write: timestamps as INT64 microseconds, dates and times not rebased to the Julian
    calendar, then the session's own settings back once the last of them ends.

    Spark's default INT96 is read as nanoseconds, whose range (1677-2262) wraps a timestamp such as
    1500-06-01 or the 9999-12-31 of an open-ended validity to another date without a word, and the LEGACY
    rebase modes shift old dates by days for any reader but Spark. These are session settings (Spark sets
    the job's from them), so converters writing at once share them, counted."""
    conf = spark.conf
    with _REGISTRY_LOCK:
        users = _JOB_SQL_USERS.setdefault(id(conf), [0, {}])
        if users[0] == 0:
            users[1] = {key: conf.get(key, None) for key in _JOB_SQL_CONF}
            for key, value in _JOB_SQL_CONF.items():
                conf.set(key, value)
        users[0] += 1
    try:
        yield
    finally:
        with _REGISTRY_LOCK:
            users[0] -= 1
            if users[0] == 0:
                for key, saved in _JOB_SQL_USERS.pop(id(conf))[1].items():
                    if saved is None:
                        conf.unset(key)
                    else:
                        conf.set(key, saved)


def _read_marker(url: str) -> dict[str, Any] | None:
    """The completion marker of a cache directory, or None when the directory is absent or incomplete."""
    fs, path = fsutil.resolve_filesystem(url)
    try:
        with fs.open_input_stream(fsutil.join(path, MARKER)) as handle:
            marker = json.loads(handle.read())
    except (OSError, ValueError):  # absent, unreadable or not JSON: not a complete directory
        return None
    if not isinstance(marker, dict) or marker.get("version") != MARKER_VERSION or "rows" not in marker:
        return None
    if "files" in marker and marker["files"] != _file_names(url):  # a data file removed since (a /tmp cleaner)
        return None
    return marker


def _file_names(url: str) -> list[str]:
    """The data files of a cache directory, as names relative to it (what its marker lists)."""
    return [file_url[len(url.rstrip("/")) + 1:] for file_url in _file_urls(url)]


def _file_urls(url: str) -> list[str]:
    """The Parquet data files of a cache directory, as URLs with the directory's scheme."""
    fs, path = fsutil.resolve_filesystem(url)
    return _as_urls(url, path, list_data_files(fs, path))


def _as_urls(url: str, root: str, paths: Iterable[str]) -> list[str]:
    """Filesystem paths under ``root`` (the path of ``url``) as URLs spelled like ``url``, sorted."""
    base = url.rstrip("/")
    return sorted(base + "/" + p[len(root):].lstrip("/") if p != root else url for p in paths)
