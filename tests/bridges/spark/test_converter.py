"""``make_spark_converter`` on a local Spark: caching, dtype conversion, and the torch / tf loaders.

One small DataFrame (int, double, string, array<double>, ML vector) serves every Spark test; each
test points the cache conf at its own ``tmp_path``. The loaders go through the real PyTorch and TensorFlow bridges.
Converters over existing Parquet (a URL for ``df``) and ``register_delete_dir_handler`` need no Spark.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import unihub
from unihub import make_batch_reader
from unihub.bridges.spark import converter as spark_converter
from unihub.bridges.spark.converter import (
    MARKER,
    ConverterConfigError,
    SparkDatasetConverter,
    make_spark_converter,
    register_delete_dir_handler,
)
from unihub.dependencies import is_available
from unihub.errors import DatasetNotFoundError, InvalidArgumentError, UnsupportedFormatError

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning")
#: tests that start the local Spark session (its fixture skips them without pyspark and java)
spark_test = pytest.mark.spark
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "petastorm"

N_ROWS = 20
KEYS = (SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, SparkDatasetConverter.UNIHUB_PARENT_CACHE_DIR_URL_CONF)


def expected_row(i: int) -> dict[str, Any]:
    return {"id": i, "x": i / 3, "name": f"n{i}", "arr": [i + 0.1] * (i % 3 + 1), "vec": [i / 7, -i / 7, 0.5]}


@pytest.fixture(scope="module")
def df(spark: Any) -> Any:
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql import types as T

    schema = T.StructType([
        T.StructField("id", T.IntegerType(), False), T.StructField("x", T.DoubleType(), False),
        T.StructField("name", T.StringType(), False), T.StructField("arr", T.ArrayType(T.DoubleType()), False),
        T.StructField("vec", VectorUDT(), False),
    ])
    rows = []
    for i in range(N_ROWS):
        row = expected_row(i)
        rows.append((row["id"], row["x"], row["name"], row["arr"], Vectors.dense(row["vec"])))
    return spark.createDataFrame(rows, schema).repartition(2)


@pytest.fixture
def cache_parent(spark: Any, tmp_path: Path) -> Any:
    """The converter's parent cache directory, set in the Spark conf for one test."""
    parent = tmp_path / "cache"
    spark.conf.set(KEYS[0], parent.as_uri())
    yield parent
    for key in KEYS:
        spark.conf.unset(key)


def read_columns(url: str) -> dict[str, np.ndarray]:
    """Every column of a cached directory, rows ordered by id."""
    with make_batch_reader(url, num_epochs=1, workers_count=1, shuffle_row_groups=False) as reader:
        batches = list(reader)
    columns = {name: np.concatenate([getattr(b, name) for b in batches]) for name in batches[0]._fields}
    order = np.argsort(columns["id"])
    return {name: values[order] for name, values in columns.items()}


@spark_test
def test_values_vectors_and_float32(df: Any, cache_parent: Path) -> None:
    converter = make_spark_converter(df)
    assert len(converter) == converter.dataset_size == df.count() == N_ROWS
    assert converter.cache_dir_url.startswith(cache_parent.as_uri())
    assert converter.file_urls and all(u.startswith("file://") and u.endswith(".parquet")
                                       for u in converter.file_urls)
    assert [p.name for p in cache_parent.iterdir()] == [converter.cache_dir_url.rsplit("/", 1)[1]]  # no temp dir
    columns = read_columns(converter.cache_dir_url)
    assert columns["x"].dtype == np.float32
    for i in range(N_ROWS):
        row = expected_row(i)
        assert columns["id"][i] == i and columns["name"][i] == row["name"]
        assert columns["x"][i] == np.float32(row["x"])
        for name in ("arr", "vec"):
            value = columns[name][i]
            assert value.dtype == np.float32, name
            np.testing.assert_array_equal(value, np.asarray(row[name], dtype=np.float32))


@spark_test
def test_dtype_none_keeps_float64(df: Any, cache_parent: Path) -> None:
    converter = make_spark_converter(df, dtype=None)
    columns = read_columns(converter.cache_dir_url)
    assert columns["x"].dtype == np.float64
    np.testing.assert_array_equal(columns["x"], [expected_row(i)["x"] for i in range(N_ROWS)])
    assert columns["arr"][4].dtype == np.float64 and columns["vec"][4].dtype == np.float64
    np.testing.assert_array_equal(columns["vec"][4], expected_row(4)["vec"])
    assert converter.cache_dir_url != make_spark_converter(df).cache_dir_url


@spark_test
def test_same_dataframe_reuses_the_cache(df: Any, cache_parent: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = make_spark_converter(df)
    marker = Path(first.cache_dir_url.removeprefix("file://")) / MARKER
    written_at = marker.stat().st_mtime_ns
    other = {make_spark_converter(df, parquet_row_group_size_bytes=1 << 20).cache_dir_url,
             make_spark_converter(df, compression_codec="gzip").cache_dir_url}
    assert len(other) == 2 and first.cache_dir_url not in other

    def no_write(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the cached directory should have been reused")

    monkeypatch.setattr(spark_converter, "_write", no_write)
    again = make_spark_converter(df)
    assert again.cache_dir_url == first.cache_dir_url and len(again) == N_ROWS
    monkeypatch.setattr(spark_converter, "_REGISTRY", {})  # a fresh registry finds the complete directory
    assert make_spark_converter(df).cache_dir_url == first.cache_dir_url
    assert marker.stat().st_mtime_ns == written_at


@spark_test
def test_a_cache_missing_a_data_file_is_written_again(spark: Any, cache_parent: Path) -> None:
    """The marker alone made a cache hit: with a part file removed since (a /tmp cleaner), the converter
    said 100 rows and its loaders served 75, without a word."""
    frame = spark.range(100).repartition(4)
    first = make_spark_converter(frame)
    Path(first.file_urls[0].removeprefix("file://")).unlink()
    again = make_spark_converter(frame)
    assert again.cache_dir_url == first.cache_dir_url and len(again.file_urls) == 4
    with make_batch_reader(again.cache_dir_url, num_epochs=1, workers_count=1) as reader:
        ids = sorted(i for batch in reader for i in batch.id.tolist())
    assert ids == list(range(100)) and len(again) == 100


@spark_test
def test_dataframes_differing_in_a_late_column_of_a_wide_plan_are_not_one_cache(spark: Any,
                                                                                 cache_parent: Path) -> None:
    """Spark shortens a plan's text after 25 fields: the key must still see the 32nd column's expression."""
    from pyspark.sql import functions

    wide = spark.range(4).select("id", *[functions.col("id").alias(f"c{i}") for i in range(30)])
    spark.conf.set("spark.sql.debug.maxToStringFields", "20")  # the user's own setting is kept
    try:
        ones = make_spark_converter(wide.withColumn("z", functions.lit(1)))
        twos = make_spark_converter(wide.withColumn("z", functions.lit(2)))
        assert spark.conf.get("spark.sql.debug.maxToStringFields") == "20"
    finally:
        spark.conf.unset("spark.sql.debug.maxToStringFields")
    assert ones.cache_dir_url != twos.cache_dir_url
    assert read_columns(ones.cache_dir_url)["z"].tolist() == [1] * 4
    assert read_columns(twos.cache_dir_url)["z"].tolist() == [2] * 4


@spark_test
def test_a_null_vector_is_a_null_array(spark: Any, cache_parent: Path) -> None:
    """vector_to_array refuses a null: a nullable vector column (an outer join's) failed the whole conversion."""
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql import types as T

    schema = T.StructType([T.StructField("id", T.IntegerType(), False), T.StructField("vec", VectorUDT(), True)])
    frame = spark.createDataFrame([(0, Vectors.dense([0.5, 1.5])), (1, None), (2, Vectors.sparse(2, [1], [2.5]))],
                                  schema)
    with make_batch_reader(make_spark_converter(frame).cache_dir_url, num_epochs=1, workers_count=1) as reader:
        vec = {int(i): v for batch in reader for i, v in zip(batch.id, batch.vec)}
    assert vec[1] is None
    np.testing.assert_array_equal(vec[0], np.asarray([0.5, 1.5], np.float32))
    np.testing.assert_array_equal(vec[2], np.asarray([0, 2.5], np.float32))


@spark_test
def test_column_names_with_backticks_dots_and_spaces(spark: Any, cache_parent: Path) -> None:
    """Every column is selected by its quoted name: a backtick in a name (legal in Spark) made the conversion
    fail with Spark's INVALID_ATTRIBUTE_NAME_SYNTAX, where Petastorm converts it."""
    from pyspark.sql import functions as F

    names = ["a`b", "a.b", "a b", "``"]
    frame = spark.range(4).select(F.col("id"), *[(F.col("id") * (k + 2)).alias(n) for k, n in enumerate(names)],
                                  (F.col("id") / 2).alias("x`y"))
    import pyarrow.parquet as pq

    converter = make_spark_converter(frame)
    table = pq.read_table([url.removeprefix("file://") for url in converter.file_urls]).sort_by("id")
    assert table.column_names == ["id", *names, "x`y"] and table.num_rows == len(converter) == 4
    for k, name in enumerate(names):
        assert table[name].to_pylist() == [i * (k + 2) for i in range(4)]
    assert table.schema.field("x`y").type == "float"  # cast by dtype='float32' like any double column
    assert table["x`y"].to_pylist() == [i / 2 for i in range(4)]


@spark_test
def test_times_outside_nanoseconds_and_old_dates_read_back_as_spark_shows_them(spark: Any, cache_parent: Path) -> None:
    """Spark's default INT96 timestamps are read as nanoseconds, so 1500-06-01 12:00 came back as
    2084-12-19T11:34:33.7 (and 9999-12-31 as another wrapped date), and under the LEGACY rebase mode the date
    1000-01-01 came back as 1000-01-06; the converter writes INT64 microseconds, not rebased."""
    import datetime

    from pyspark.sql import types as T

    utc = datetime.timezone.utc
    times = [datetime.datetime(1500, 6, 1, 12, tzinfo=utc), datetime.datetime(9999, 12, 31, 23, 59, 59, tzinfo=utc),
             datetime.datetime(2020, 1, 2, 3, 4, 5, 678901, tzinfo=utc)]
    dates = [datetime.date(1000, 1, 1), datetime.date(9999, 12, 31), datetime.date(2020, 1, 2)]
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("d", T.DateType()),
                           T.StructField("ts", T.TimestampType())])
    frame = spark.createDataFrame(list(zip(range(3), dates, times)), schema)
    keys = ("spark.sql.parquet.outputTimestampType", "spark.sql.parquet.datetimeRebaseModeInWrite")
    before = spark.conf.get(keys[0], None)
    spark.conf.set(keys[1], "LEGACY")
    try:
        converter = make_spark_converter(frame)
        assert spark.conf.get(keys[0], None) == before and spark.conf.get(keys[1]) == "LEGACY"  # put back
    finally:
        spark.conf.unset(keys[1])
    with make_batch_reader(converter.cache_dir_url, num_epochs=1, workers_count=1) as reader:
        batches = list(reader)
    order = np.argsort(np.concatenate([b.id for b in batches]))
    stored_d = np.concatenate([b.d for b in batches])[order]
    stored_ts = np.concatenate([b.ts for b in batches])[order]
    assert stored_d.tolist() == dates
    assert stored_ts.tolist() == [t.replace(tzinfo=None) for t in times]


@spark_test
def test_a_parent_url_with_a_trailing_slash_is_the_same_cache(df: Any, spark: Any, cache_parent: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Petastorm's test_df_caching: parents differing only by a trailing '/' share the cache."""
    first = make_spark_converter(df)
    assert first.cache_dir_url.startswith(cache_parent.as_uri() + "/unihub-converter-")

    def no_write(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the cached directory should have been reused")

    monkeypatch.setattr(spark_converter, "_write", no_write)
    for spelling in (cache_parent.as_uri() + "/", cache_parent.as_uri() + "//"):
        spark.conf.set(KEYS[0], spelling)
        assert make_spark_converter(df).cache_dir_url == first.cache_dir_url
    assert spark_converter._without_trailing_slash("file:///") == "file:///"
    assert spark_converter._without_trailing_slash("s3a://bucket/") == "s3a://bucket"


@spark_test
def test_delete_removes_the_files(df: Any, cache_parent: Path) -> None:
    converter = make_spark_converter(df)
    path = Path(converter.cache_dir_url.removeprefix("file://"))
    assert path.is_dir()
    converter.delete()
    assert not path.exists()
    assert converter.cache_dir_url not in spark_converter._REGISTRY.values()
    again = make_spark_converter(df)  # written anew
    assert again.cache_dir_url == converter.cache_dir_url and (path / MARKER).is_file()


@spark_test
def test_the_cache_is_removed_when_the_process_exits(spark: Any, tmp_path: Path) -> None:
    """Petastorm's test_atexit: a process that made a converter and exits leaves no cache directory behind
    (one deleted before exit is no error); the FilesystemResolver look-up is the test's own."""
    script = f"""
import sys
from pyspark.sql import SparkSession
from unihub import make_spark_converter
from unihub.bridges.spark.converter import SparkDatasetConverter
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1").getOrCreate())
spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, {tmp_path.as_uri()!r})
kept = make_spark_converter(spark.createDataFrame([(1, 2), (4, 5)], ["col1", "col2"]))
deleted = make_spark_converter(spark.createDataFrame([(1, 2, 3)], ["a", "b", "c"]))
deleted.delete()
print(kept.cache_dir_url)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    url = proc.stdout.split()[-1]
    assert url.startswith(tmp_path.as_uri())
    resolver = unihub.FilesystemResolver(url)
    assert not resolver.filesystem().exists(resolver.get_dataset_path())
    assert "failed" not in proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == []


@spark_test
def test_missing_or_bad_conf_is_a_clear_error(df: Any, spark: Any) -> None:
    for key in KEYS:
        spark.conf.unset(key)
    with pytest.raises(ConverterConfigError, match=KEYS[0].replace(".", r"\.")):
        make_spark_converter(df)
    spark.conf.set(KEYS[1], "/tmp/no-scheme")
    try:
        with pytest.raises(ConverterConfigError, match="file:///"):
            make_spark_converter(df)
    finally:
        spark.conf.unset(KEYS[1])


@spark_test
def test_bad_dtype(df: Any) -> None:
    with pytest.raises(UnsupportedFormatError, match="float16"):
        make_spark_converter(df, dtype="float16")


@pytest.mark.skipif(not is_available("torch"), reason="torch is not installed")
@spark_test
def test_torch_dataloader(df: Any, cache_parent: Path) -> None:
    converter = make_spark_converter(df)
    with converter.make_torch_dataloader(batch_size=8, num_epochs=1, workers_count=1,
                                         schema_fields=["id", "x", "vec"]) as loader:
        batches = list(loader)
    sizes = [len(b["id"]) for b in batches]
    assert sum(sizes) == N_ROWS and all(s == 8 for s in sizes[:-1])
    ids = np.concatenate([np.asarray(b["id"]) for b in batches])
    assert sorted(ids.tolist()) == list(range(N_ROWS))
    np.testing.assert_array_equal(np.concatenate([np.asarray(b["x"]) for b in batches]), np.float32(ids / 3))
    vec = np.concatenate([np.asarray(b["vec"]) for b in batches])  # fixed-length vectors: (rows, 3) float32
    assert vec.dtype == np.float32 and vec.shape == (N_ROWS, 3)
    np.testing.assert_array_equal(vec, np.float32([expected_row(i)["vec"] for i in ids]))


@pytest.mark.skipif(not is_available("torch"), reason="torch is not installed")
@spark_test
def test_data_loader_fn_gets_every_argument_by_keyword_as_in_petastorm(df: Any, cache_parent: Path) -> None:
    """Petastorm calls data_loader_fn(reader=..., batch_size=..., shuffling_queue_capacity=...): a
    ``lambda **kwargs`` written for it failed with TypeError when the reader came positionally."""
    from unihub.bridges.torch.loaders import BatchedDataLoader

    seen: dict[str, Any] = {}

    def make_loader(**kwargs: Any) -> Any:
        seen.update(kwargs)
        return BatchedDataLoader(**kwargs)

    converter = make_spark_converter(df)
    with converter.make_torch_dataloader(batch_size=6, num_epochs=1, workers_count=1, data_loader_fn=make_loader,
                                         schema_fields=["id"]) as loader:
        ids = [i for batch in loader for i in batch["id"].tolist()]
    assert sorted(seen) == ["batch_size", "reader", "shuffling_queue_capacity"] and seen["batch_size"] == 6
    assert sorted(ids) == list(range(N_ROWS))


@pytest.mark.skipif(not is_available("tensorflow"), reason="tensorflow is not installed")
@pytest.mark.parametrize("shuffle", [None, 64])
@spark_test
def test_tf_dataset(df: Any, cache_parent: Path, shuffle: int | None) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    converter = make_spark_converter(df)
    with converter.make_tf_dataset(batch_size=8, num_epochs=1, workers_count=1, schema_fields=["id", "x"],
                                   shuffling_queue_capacity=shuffle, shuffle_row_groups=False) as ds:
        batches = list(ds)
    sizes = [int(b.id.shape[0]) for b in batches]
    assert sum(sizes) == N_ROWS and all(s == 8 for s in sizes[:-1])
    ids = np.concatenate([b.id.numpy() for b in batches])
    xs = np.concatenate([b.x.numpy() for b in batches])
    assert sorted(ids.tolist()) == list(range(N_ROWS)) and xs.dtype == np.float32
    np.testing.assert_array_equal(xs, np.float32(ids / 3))
    with make_batch_reader(converter.cache_dir_url, schema_fields=["id"], shuffle_row_groups=False) as reader:
        stored = [i for batch in reader for i in batch.id.tolist()]
    assert (ids.tolist() == stored) == (shuffle is None)  # the queue shuffles across the reader's batches


@pytest.mark.skipif(not is_available("tensorflow"), reason="tensorflow is not installed")
@spark_test
def test_tf_dataset_batch_size_none_is_32_rows_as_in_petastorm(spark: Any, cache_parent: Path) -> None:
    """Petastorm's make_tf_dataset documents and uses 32 rows for batch_size=None; it gave the reader's batches
    (a whole row group per batch: 35, 34, 34 rows here)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    converter = make_spark_converter(spark.range(103).repartition(3))
    with converter.make_tf_dataset(batch_size=None, num_epochs=1, workers_count=1) as ds:
        batches = [b.id.numpy() for b in ds]
    assert [len(b) for b in batches] == [32, 32, 32, 7]
    assert sorted(np.concatenate(batches).tolist()) == list(range(103))


@spark_test
def test_compression_codec_reaches_the_files(df: Any, cache_parent: Path) -> None:
    import pyarrow.parquet as pq

    def files(converter: SparkDatasetConverter) -> list[Any]:
        root = Path(converter.cache_dir_url.removeprefix("file://"))
        return [pq.ParquetFile(p) for p in sorted(root.rglob("*.parquet"))]

    # Petastorm 0.13.1's default wrote uncompressed files (checked against it), though Spark's default is snappy
    default = files(make_spark_converter(df))
    assert {f.metadata.row_group(0).column(0).compression for f in default} == {"UNCOMPRESSED"}
    snappy = files(make_spark_converter(df, compression_codec="snappy"))
    assert {f.metadata.row_group(0).column(0).compression for f in snappy} == {"SNAPPY"}
    gzip = files(make_spark_converter(df, compression_codec="gzip"))
    assert {f.metadata.row_group(i).column(0).compression for f in gzip for i in range(f.num_row_groups)} == {"GZIP"}
    assert sum(f.metadata.num_rows for f in gzip) == N_ROWS


# -- a URL for df: Parquet that is already written (no Spark) ------------------------------------------
def batches_of(converter: SparkDatasetConverter, **reader_kwargs: Any) -> dict[str, np.ndarray]:
    """Every column the converter's loader reads, rows ordered by id (the reader itself as the loader)."""
    with converter.make_torch_dataloader(num_epochs=1, workers_count=1, shuffle_row_groups=False,
                                         data_loader_fn=lambda reader, **_: reader, **reader_kwargs) as reader:
        batches = list(reader)
    columns = {name: np.concatenate([getattr(b, name) for b in batches]) for name in batches[0]._fields}
    order = np.argsort(columns["id"], kind="stable")
    return {name: values[order] for name, values in columns.items()}


@pytest.mark.parametrize("spelling", ["uri", "path", "hadoop"])
def test_a_url_wraps_existing_parquet(spelling: str) -> None:
    import pickle

    root = FIXTURES / "plain"
    url = {"uri": root.as_uri(), "path": str(root), "hadoop": "file:" + str(root)}[spelling]
    converter = make_spark_converter(url, dtype="float64", compression_codec="gzip")  # ignored, as in Petastorm
    assert converter.cache_dir_url == (root.as_uri() if spelling == "hadoop" else url)
    parts = sorted(p.name for p in root.glob("part-*.parquet"))
    assert converter.file_urls == [converter.cache_dir_url + "/" + name for name in parts]
    expected = pickle.loads((FIXTURES / "plain_expected.pkl").read_bytes())  # Petastorm's make_batch_reader
    assert len(converter) == converter.dataset_size == len(expected["id"]["values"]) == 600
    columns = batches_of(converter, schema_fields=["id", "x", "name"])
    order = np.argsort(expected["id"]["values"], kind="stable")
    for name in ("id", "x", "name"):
        if name != "name":  # strings are str objects here, a '<U' array in Petastorm
            assert columns[name].dtype.str == expected[name]["dtype"], name
        assert columns[name].tolist() == np.asarray(expected[name]["values"], dtype=object)[order].tolist(), name


def test_a_url_of_a_unihub_dataset_and_delete_keeps_it(write_sample: Any, sample_row: Any) -> None:
    path, _ = write_sample(12)
    before = sorted(p.name for p in path.iterdir())
    converter = unihub.make_spark_converter(path)
    assert converter.cache_dir_url == str(path) and len(converter) == 12
    columns = batches_of(converter, schema_fields=["id", "vec", "split"])
    assert columns["id"].tolist() == list(range(12))
    for i in range(12):
        np.testing.assert_array_equal(columns["vec"][i], sample_row(i)["vec"])
        assert columns["split"][i] == sample_row(i)["split"]
    with pytest.warns(UserWarning, match="leaves it in place"):
        converter.delete()
    assert sorted(p.name for p in path.iterdir()) == before and len(unihub.make_spark_converter(path)) == 12


def test_an_unknown_reader_argument_is_python_s_type_error() -> None:
    """Petastorm's test_torch_unexpected_param: the reader's TypeError in Python's own words."""
    converter = make_spark_converter((FIXTURES / "plain").as_uri())
    with pytest.raises(TypeError, match=r"^make_batch_reader\(\) got an unexpected keyword argument 'xyz'$"):
        with converter.make_torch_dataloader(xyz=1):
            pass
    with pytest.raises(TypeError, match=r"unexpected keyword arguments 'abc', 'xyz'$"):
        make_batch_reader(converter.cache_dir_url, xyz=1, abc=2)


def test_a_url_that_is_not_a_dataset_or_not_a_url(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="no such file"):
        make_spark_converter((tmp_path / "missing").as_uri())
    with pytest.raises(InvalidArgumentError, match="DataFrame or the URL"):
        make_spark_converter(42)


# -- register_delete_dir_handler -----------------------------------------------------------------------
def test_register_delete_dir_handler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert unihub.register_delete_dir_handler is register_delete_dir_handler
    cache = tmp_path / "unihub-converter-abc"
    cache.mkdir()
    (cache / "part-0.parquet").write_bytes(b"x")
    url = cache.as_uri()
    monkeypatch.setattr(spark_converter, "_REGISTRY", {"abc": url, "other": "file:///elsewhere"})
    deleted: list[str] = []
    register_delete_dir_handler(deleted.append)
    try:
        SparkDatasetConverter(url, [url + "/part-0.parquet"], 1).delete()
        assert deleted == [url] and cache.is_dir()  # the handler decides; the default did not run
        assert spark_converter._REGISTRY == {"other": "file:///elsewhere"}  # forgotten all the same
        with pytest.raises(InvalidArgumentError, match="function of a directory URL"):
            register_delete_dir_handler("rm -rf")
    finally:
        register_delete_dir_handler(None)
    SparkDatasetConverter(url, [], 1).delete()  # the default handler again
    assert not cache.exists() and deleted == [url]
