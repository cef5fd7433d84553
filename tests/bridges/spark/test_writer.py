"""``materialize_dataset`` / ``dict_to_spark_row`` with a real local Spark, and Spark <-> Arrow types.

The same rows are written twice, by Spark (Petastorm's recipe) and by
:func:`unihub.write_dataset`, and both datasets must open to the same Unischema and
decode to the same values, bit for bit. Tests that need the JVM are marked ``spark``
and skipped without pyspark or java; the rest need only pyspark's pure-Python types.
One ``local[2]`` session serves the whole run.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import unihub
from unihub import (
    CompressedImageCodec,
    CompressedNdarrayCodec,
    NdarrayCodec,
    ScalarCodec,
    TensorCodec,
    Unischema,
    UnischemaField,
    ValidationError,
    dict_to_spark_row,
    materialize_dataset,
    open_dataset,
    write_dataset,
)
from unihub.dependencies import is_available
from unihub.errors import CodecError, SchemaError
from unihub.schema.spark_types import arrow_to_spark_type, spark_to_arrow_type
from unihub.schema.unischema import SCHEMA_METADATA_KEY

HAVE_PYSPARK = is_available("pyspark")
HAVE_JAVA = shutil.which("java") is not None

needs_pyspark = pytest.mark.skipif(not HAVE_PYSPARK, reason="pyspark is not installed")
needs_spark = [
    pytest.mark.spark,
    pytest.mark.skipif(not (HAVE_PYSPARK and HAVE_JAVA), reason="a local Spark needs pyspark and java"),
]

N_ROWS = 200

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning")


# -- the schema and rows ----------------------------------------------------------------
def make_schema() -> Unischema:
    from pyspark.sql.types import IntegerType

    return Unischema("SparkSample", [
        UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("label", np.int32, (), ScalarCodec(IntegerType()), False),
        UnischemaField("weight", np.float64, (), ScalarCodec(pa.float64()), True),
        UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), False),
        UnischemaField("vec", np.float32, (8,), TensorCodec(), False),
        UnischemaField("boxes", np.float32, (None, 4), TensorCodec(), False),
        UnischemaField("mask", np.uint8, (4, 4), TensorCodec(), False),
        UnischemaField("grid", np.uint16, (None, None), TensorCodec(), False),
        UnischemaField("counts", np.int32, (None,), NdarrayCodec(), False),
        UnischemaField("packed", np.float64, (2, 3), CompressedNdarrayCodec(), True),
        UnischemaField("png", np.uint8, (16, 16, 3), CompressedImageCodec("png"), False),
        UnischemaField("jpeg", np.uint8, (16, 16, 3), CompressedImageCodec("jpeg", 90), False),
    ])


def make_row(i: int) -> dict[str, Any]:
    """Row ``i``: a deterministic function of ``i``, with nulls, empty and ragged tensors."""
    rng = np.random.default_rng(1000 + i)
    yy, xx = np.mgrid[0:16, 0:16]
    smooth = np.stack([yy * 12 + i % 32, xx * 12 + (3 * i) % 32, (yy + xx) * 8], axis=-1)  # gradients, 0..240
    return {
        "id": i,
        "label": np.int32(i * 7 - 300),
        "weight": None if i % 7 == 3 else float(rng.standard_normal()),
        "name": f"row-{i}-é",
        "vec": rng.standard_normal(8).astype(np.float32),
        "boxes": rng.random((i % 4, 4), dtype=np.float32),
        "mask": rng.integers(0, 256, (4, 4), dtype=np.uint8),  # values above 127: Spark has no uint8
        "grid": rng.integers(0, 65536, (i % 3 + 1, i % 2 + 1), dtype=np.uint16),
        "counts": np.arange(i % 6, dtype=np.int32) * i,
        "packed": None if i % 5 == 2 else rng.standard_normal((2, 3)),
        "png": rng.integers(0, 256, (16, 16, 3), dtype=np.uint8),
        "jpeg": smooth.astype(np.uint8),
    }


def decoded_rows(url: str | Path) -> tuple[unihub.ParquetStore, dict[int, dict[str, Any]]]:
    """Open a dataset and decode every row group, column by column: id -> {field: value}."""
    store = open_dataset(str(url))
    rows: dict[int, dict[str, Any]] = {}
    for index in range(len(store.row_groups)):
        table = store.read_row_group(index)
        columns = {f.name: f.codec.decode_column(f, table.column(f.name)) for f in store.schema}
        assert all(len(c) == table.num_rows for c in columns.values())
        for j in range(table.num_rows):
            row = {name: column[j] for name, column in columns.items()}
            key = int(row["id"])
            assert key not in rows, f"id {key} appears twice in {url}"
            rows[key] = row
    return store, rows


def assert_same(found: Any, expected: Any, where: str) -> None:
    """Bit-exact: same type, dtype, shape and bytes for arrays; same type and value for scalars."""
    if expected is None:
        assert found is None, f"{where}: expected None, found {found!r}"
        return
    assert type(found) is type(expected), f"{where}: {type(found)} != {type(expected)}"
    if isinstance(expected, np.ndarray):
        assert found.dtype == expected.dtype, f"{where}: dtype {found.dtype} != {expected.dtype}"
        assert found.shape == expected.shape, f"{where}: shape {found.shape} != {expected.shape}"
        assert found.tobytes() == expected.tobytes(), f"{where}: values differ"
    else:
        assert found == expected, f"{where}: {found!r} != {expected!r}"


def spark_write(spark: Any, url: str, schema: Unischema, rows: list[dict[str, Any]], *,
                row_group_size_mb: float | None = 1, files: int = 2, **options: Any) -> None:
    """Petastorm's recipe: rows -> dict_to_spark_row on the executors -> DataFrame -> Parquet."""
    with materialize_dataset(spark, url, schema, row_group_size_mb, **options):
        rdd = spark.sparkContext.parallelize(rows, 2).map(functools.partial(dict_to_spark_row, schema))
        spark.createDataFrame(rdd, schema.as_spark_schema()).coalesce(files) \
            .write.mode("overwrite").parquet(url)


# -- fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def written(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The sample rows written by Spark and by unihub, opened and decoded."""
    schema = make_schema()
    rows = [make_row(i) for i in range(N_ROWS)]
    root = tmp_path_factory.mktemp("spark_vs_unihub")
    spark_write(spark, "file://" + str(root / "by_spark"), schema, rows, row_group_size_mb=0.1)
    write_dataset(root / "by_unihub", schema, rows)
    by_spark, spark_rows = decoded_rows(root / "by_spark")
    by_unihub, unihub_rows = decoded_rows(root / "by_unihub")
    return {"schema": schema, "rows": rows, "root": root, "spark": by_spark, "unihub": by_unihub,
            "spark_rows": spark_rows, "unihub_rows": unihub_rows}


# -- Spark writes what unihub writes -----------------------------------------------------
class TestSparkMatchesUnihub:
    pytestmark = needs_spark

    def test_same_schema_and_rows(self, written: dict[str, Any]) -> None:
        schema = written["schema"]
        for which in ("spark", "unihub"):
            store = written[which]
            assert store.schema == schema, which
            assert store.schema_source == "unihub", which
            assert store.num_rows == N_ROWS, which
            assert sorted(written[f"{which}_rows"]) == list(range(N_ROWS)), which
        assert len(written["spark"].files) == 2  # coalesce(2)

    def test_every_value_decodes_equal(self, written: dict[str, Any]) -> None:
        schema, spark_rows, unihub_rows = written["schema"], written["spark_rows"], written["unihub_rows"]
        for i in range(N_ROWS):
            for field in schema:
                where = f"row {i}, field {field.name!r}"
                assert_same(spark_rows[i][field.name], unihub_rows[i][field.name], where)

    def test_values_are_what_was_written(self, written: dict[str, Any]) -> None:
        """Lossless fields come back as given (JPEG is lossy: the same decoded pixels both ways)."""
        spark_rows = written["spark_rows"]
        for i, row in enumerate(written["rows"]):
            for name, value in row.items():
                if name == "jpeg":
                    continue
                found = spark_rows[i][name]
                if isinstance(value, np.ndarray) or value is None:
                    assert_same(found, value, f"row {i}, field {name!r}")
                else:
                    assert found == value, f"row {i}, field {name!r}: {found!r} != {value!r}"
            jpeg = spark_rows[i]["jpeg"]
            assert jpeg.dtype == np.uint8 and jpeg.shape == (16, 16, 3)
            assert np.abs(jpeg.astype(int) - row["jpeg"].astype(int)).mean() < 4

    def test_decoded_dtypes(self, written: dict[str, Any]) -> None:
        row = written["spark_rows"][5]
        assert isinstance(row["id"], np.int64) and isinstance(row["label"], np.int32)
        assert isinstance(row["name"], str)
        for name, dtype, shape in [("vec", np.float32, (8,)), ("boxes", np.float32, (1, 4)),
                                   ("mask", np.uint8, (4, 4)), ("grid", np.uint16, (3, 2)),
                                   ("counts", np.int32, (5,)), ("packed", np.float64, (2, 3)),
                                   ("png", np.uint8, (16, 16, 3)), ("jpeg", np.uint8, (16, 16, 3))]:
            assert row[name].dtype == dtype and row[name].shape == shape, name

    def test_unsigned_values_survive_signed_spark_types(self, written: dict[str, Any]) -> None:
        """Spark stores uint8 as int16 and uint16 as int32; the Unischema brings the dtype back."""
        arrow = written["spark"].arrow_schema
        assert arrow.field("mask").type.value_type == pa.int16()
        assert arrow.field("grid").type.field("data").type.value_type == pa.int32()
        masks = np.stack([written["spark_rows"][i]["mask"] for i in range(N_ROWS)])
        grids = np.concatenate([written["spark_rows"][i]["grid"].ravel() for i in range(N_ROWS)])
        assert masks.dtype == np.uint8 and masks.max() > 127
        assert grids.dtype == np.uint16 and grids.max() > 32767

    def test_common_metadata_holds_the_unischema(self, written: dict[str, Any]) -> None:
        root = written["root"] / "by_spark"
        assert (root / "_common_metadata").is_file()
        assert not (root / "_metadata").exists()  # only with use_summary_metadata
        metadata = pq.read_schema(root / "_common_metadata").metadata
        assert Unischema.from_json(metadata[SCHEMA_METADATA_KEY]) == written["schema"]
        names = pq.read_schema(root / "_common_metadata").names
        assert names == list(written["schema"].fields)


# -- row groups and the Spark configuration ---------------------------------------------
WIDE_VALUES = 1024  # float32 values per row: 4 KiB


def _row_group_schema() -> Unischema:
    return Unischema("Wide", [
        UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("values", np.float32, (WIDE_VALUES,), TensorCodec(), False),
    ])


def _wide_rows(n: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(7)
    return [{"id": i, "values": rng.random(WIDE_VALUES, dtype=np.float32)} for i in range(n)]


@pytest.mark.spark
@pytest.mark.parametrize("session_value", [None, str(128 * 2**20)], ids=["hadoop-conf", "session-conf-set"])
def test_row_group_size_takes_effect(spark: Any, tmp_path: Path, session_value: str | None) -> None:
    """~0.1 MiB row groups of 4 KiB rows: several per file, though parquet-mr measures every 100 rows
    by default; a ``parquet.block.size`` the session sets itself does not win over the argument."""
    schema, rows = _row_group_schema(), _wide_rows(N_ROWS)
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    hadoop.set("parquet.block.size", str(64 * 2**20))
    if session_value is not None:
        spark.conf.set("parquet.block.size", session_value)
    try:
        url = "file://" + str(tmp_path / "wide")
        spark_write(spark, url, schema, rows, row_group_size_mb=0.1, files=1, use_summary_metadata=True)
        assert hadoop.get("parquet.block.size") == str(64 * 2**20)
        assert hadoop.get("parquet.page.size.row.check.min") is None
        assert spark.conf.get("parquet.block.size", None) == session_value
    finally:
        hadoop.unset("parquet.block.size")
        spark.conf.unset("parquet.block.size")
    store = open_dataset(tmp_path / "wide")
    assert len(store.files) == 1 and store.num_rows == N_ROWS
    assert len(store.row_groups) >= 4, [rg.num_rows for rg in store.row_groups]
    assert all(rg.num_rows < 50 for rg in store.row_groups), [rg.num_rows for rg in store.row_groups]
    assert all(rg.total_byte_size <= 0.15 * 2**20 for rg in store.row_groups)
    # use_summary_metadata: a _metadata file listing every row group of every file
    summary = pq.read_metadata(tmp_path / "wide" / "_metadata")
    assert summary.num_row_groups == len(store.row_groups) and summary.num_rows == N_ROWS
    assert summary.row_group(0).column(0).file_path == os.path.basename(store.files[0].path)
    _, decoded = decoded_rows(tmp_path / "wide")
    for row in rows:
        assert_same(decoded[row["id"]]["values"], row["values"], f"row {row['id']}")


@pytest.mark.spark
def test_configuration_restored_after_an_error(spark: Any, tmp_path: Path) -> None:
    """Inside the block the job's settings apply; after a failing block they are back and no metadata
    is written."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    before = {key: hadoop.get(key) for key in ("parquet.block.size", "parquet.page.size.row.check.min",
                                               "parquet.summary.metadata.level")}
    timestamps_before = spark.conf.get("spark.sql.parquet.outputTimestampType")
    url = "file://" + str(tmp_path / "failed")
    with pytest.raises(RuntimeError, match="job failed"):
        with materialize_dataset(spark, url, _row_group_schema(), 16):
            assert hadoop.get("parquet.block.size") == str(16 * 2**20)
            assert hadoop.get("parquet.summary.metadata.level") == "NONE"
            assert spark.conf.get("spark.sql.parquet.outputTimestampType") == "TIMESTAMP_MICROS"
            raise RuntimeError("job failed")
    assert {key: hadoop.get(key) for key in before} == before
    assert spark.conf.get("spark.sql.parquet.outputTimestampType") == timestamps_before
    assert not (tmp_path / "failed").exists()


@pytest.mark.spark
def test_no_files_written_is_an_error(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SchemaError, match="wrote no Parquet files"):
        with materialize_dataset(spark, str(tmp_path / "empty"), _row_group_schema()):
            pass


# -- more types through Spark ------------------------------------------------------------
def _typed_schema() -> Unischema:
    return Unischema("Typed", [
        UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("flag", np.bool_, (), ScalarCodec(pa.bool_()), True),
        UnischemaField("small", np.int8, (), ScalarCodec(pa.int8()), False),
        UnischemaField("half", np.float16, (3,), TensorCodec(), False),
        UnischemaField("price", decimal.Decimal, (), ScalarCodec(pa.decimal128(10, 2)), True),
        UnischemaField("when", np.datetime64, (), ScalarCodec(pa.timestamp("us", tz="UTC")), True),
        UnischemaField("local", np.datetime64, (), ScalarCodec(pa.timestamp("us")), False),
        UnischemaField("day", np.datetime64, (), ScalarCodec(pa.date32()), False),
        UnischemaField("raw", np.bytes_, (), ScalarCodec(pa.binary()), False),
        UnischemaField("big", np.uint64, (), ScalarCodec(pa.uint64()), False),
        UnischemaField("ragged", np.uint8, (None, None), TensorCodec(), True),
    ])


def _typed_row(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "flag": None if i % 4 == 1 else bool(i % 2),
        "small": np.int8(i % 256 - 128),
        "half": np.array([i, -i, 0.5], dtype=np.float16),
        "price": None if i % 6 == 5 else decimal.Decimal(i * 37) / 100,
        "when": None if i % 5 == 4 else np.datetime64("2024-03-10T01:30:00", "us") + np.timedelta64(i, "h"),
        "local": np.datetime64("2024-03-10T01:30:00.123456", "us") + np.timedelta64(i, "m"),
        "day": np.datetime64("2024-02-27", "D") + np.timedelta64(i, "D"),
        "raw": bytes([i % 256, 0, 255]) * (i % 3),
        "big": np.uint64(2**63 + i),
        "ragged": None if i % 7 == 3 else np.full((i % 3 + 1, i % 2 + 2), i, dtype=np.uint8),
    }


@pytest.fixture(scope="module")
def typed(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    schema = _typed_schema()
    rows = [_typed_row(i) for i in range(40)]
    root = tmp_path_factory.mktemp("typed")
    spark_write(spark, "file://" + str(root / "by_spark"), schema, rows, files=1)
    write_dataset(root / "by_unihub", schema, rows)
    stores = {which: open_dataset(root / which) for which in ("by_spark", "by_unihub")}
    return {"schema": schema, "rows": rows, "stores": stores}


def _decode_field(store: unihub.ParquetStore, name: str) -> dict[int, Any]:
    field = store.schema[name]
    out: dict[int, Any] = {}
    for index in range(len(store.row_groups)):
        table = store.read_row_group(index, columns=["id", name])
        ids = table.column("id").to_pylist()
        values = field.codec.decode_column(field, table.column(name))
        out.update(zip(ids, list(values), strict=True))
    return out


@pytest.mark.spark
@pytest.mark.parametrize("name", list(_typed_schema().fields))
def test_more_types_through_spark(typed: dict[str, Any], name: str) -> None:
    """Spark's storage differs (uint64 as decimal(20,0), shapes as array<int>, ...); the values do not."""
    by_spark = _decode_field(typed["stores"]["by_spark"], name)
    by_unihub = _decode_field(typed["stores"]["by_unihub"], name)
    assert typed["stores"]["by_spark"].schema == typed["schema"]
    for i in range(len(typed["rows"])):
        found, expected = by_spark[i], by_unihub[i]
        if isinstance(expected, np.ndarray):
            assert_same(found, expected, f"row {i}, {name}")
        else:
            assert found == expected and type(found) is type(expected), f"row {i}, {name}: {found!r} != {expected!r}"


@pytest.mark.spark
def test_timestamps_are_utc_instants(typed: dict[str, Any]) -> None:
    """A naive datetime64 in a ``timestamp[us, tz=UTC]`` field is UTC, whatever the machine's zone."""
    when = typed["stores"]["by_spark"].arrow_schema.field("when").type
    assert when == pa.timestamp("us", tz="UTC")  # INT64 micros, not Spark's default INT96
    values = _decode_field(typed["stores"]["by_spark"], "when")
    assert values[0] == np.datetime64("2024-03-10T01:30:00", "us")


@pytest.mark.spark
def test_old_dates_are_not_rebased_whatever_the_session_says(spark: Any, tmp_path: Path) -> None:
    """Under a session's LEGACY rebase mode Spark wrote Julian-calendar days, which unihub (and pyarrow, and
    Petastorm) read 5 days off: 1000-01-01 came back as 1000-01-06. The job writes them as they are."""
    schema = Unischema("Old", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                               UnischemaField("day", np.datetime64, (), ScalarCodec(pa.date32()), False),
                               UnischemaField("when", np.datetime64, (), ScalarCodec(pa.timestamp("us")), False)])
    rows = [{"id": 0, "day": np.datetime64("1000-01-01"), "when": np.datetime64("1500-06-01T12:00:00", "us")},
            {"id": 1, "day": np.datetime64("2020-01-02"), "when": np.datetime64("2020-01-02T03:04:05", "us")}]
    key = "spark.sql.parquet.datetimeRebaseModeInWrite"
    spark.conf.set(key, "LEGACY")
    try:
        spark_write(spark, (tmp_path / "old").as_uri(), schema, rows, files=1)
        assert spark.conf.get(key) == "LEGACY"  # the session's own setting back
    finally:
        spark.conf.unset(key)
    store = open_dataset(tmp_path / "old")
    for name in ("day", "when"):
        values = _decode_field(store, name)
        assert [values[i] for i in range(2)] == [row[name] for row in rows], name


# -- dict_to_spark_row without the JVM -------------------------------------------------------
@needs_pyspark
def test_dict_to_spark_row_encodes_in_schema_order() -> None:
    from pyspark.sql import Row

    schema = make_schema()
    source = make_row(3)
    row = dict_to_spark_row(schema, dict(reversed(list(source.items()))))
    assert isinstance(row, Row)
    assert list(row.asDict()) == list(schema.fields)
    assert row.id == 3 and type(row.id) is int
    assert row.label == -279 and type(row.label) is int
    assert row.weight is None  # 3 % 7 == 3
    assert row.vec == source["vec"].tolist()
    assert row.boxes == source["boxes"].ravel().tolist() and len(row.boxes) == 12
    assert row.mask == source["mask"].ravel().tolist()
    assert row.grid == {"data": source["grid"].ravel().tolist(), "shape": list(source["grid"].shape)}
    assert isinstance(row.counts, bytearray) and isinstance(row.png, bytearray)
    assert bytes(row.png[:8]) == b"\x89PNG\r\n\x1a\n" and bytes(row.jpeg[:3]) == b"\xff\xd8\xff"
    # Spark's own type check accepts it
    schema.as_spark_schema().toInternal(row)


@needs_pyspark
def test_dict_to_spark_row_special_values() -> None:
    row = dict_to_spark_row(_typed_schema(), _typed_row(1))
    assert row.big == decimal.Decimal(2**63 + 1)
    assert row.when == datetime.datetime(2024, 3, 10, 2, 30, tzinfo=datetime.timezone.utc)
    assert row.local == datetime.datetime(2024, 3, 10, 1, 31, 0, 123456) and row.local.tzinfo is None
    assert row.day == datetime.date(2024, 2, 28)
    assert row.flag is None and row.small == -127
    assert row.raw == bytearray(b"\x01\x00\xff")
    ns = dict(_typed_row(2), when=np.datetime64("2024-01-01T00:00:00.000001000", "ns"))
    assert dict_to_spark_row(_typed_schema(), ns).when == datetime.datetime(2024, 1, 1, 0, 0, 0, 1,
                                                                            tzinfo=datetime.timezone.utc)
    # Spark keeps microseconds: a finer value is refused (as write_dataset does), not cut
    with pytest.raises(CodecError, match="'when'.*precision") as info:
        dict_to_spark_row(_typed_schema(), dict(ns, when=np.datetime64("2024-01-01T00:00:00.000001999", "ns")))
    assert info.value.field == "when"
    _typed_schema().as_spark_schema().toInternal(row)


@needs_pyspark
def test_dict_to_spark_row_missing_nullable_field_is_none() -> None:
    source = make_row(1)
    del source["weight"], source["packed"]
    row = dict_to_spark_row(make_schema(), source)
    assert row.weight is None and row.packed is None


def _bad_rows() -> list[tuple[str, str, Any]]:
    return [
        ("vec", "dtype", np.zeros(8, np.float64)),
        ("vec", "shape", np.zeros(7, np.float32)),
        ("boxes", "shape", np.zeros((2, 5), np.float32)),
        ("mask", "dtype", np.zeros((4, 4), np.int16)),
        ("counts", "dtype", np.zeros(3, np.int64)),
        ("packed", "shape", np.zeros((3, 2))),
        ("png", "shape", np.zeros((8, 16, 3), np.uint8)),
        ("jpeg", "dtype", np.zeros((16, 16, 3), np.float32)),
        ("id", "None", None),
        ("vec", "None", None),
        ("png", "None", None),
        ("label", "scalar", 2**40),
        ("name", "scalar", 12),
        ("weight", "scalar", "heavy"),
        ("vec", "array", [0.0] * 8),
    ]


@needs_pyspark
@pytest.mark.parametrize(("name", "what", "value"), _bad_rows(),
                         ids=[f"{n}-{w}-{i}" for i, (n, w, _) in enumerate(_bad_rows())])
def test_dict_to_spark_row_validates(name: str, what: str, value: Any) -> None:
    row = dict(make_row(1), **{name: value})
    with pytest.raises(ValidationError, match=repr(name)) as info:
        dict_to_spark_row(make_schema(), row)
    assert info.value.field == name


@needs_pyspark
def test_dict_to_spark_row_rejects_unknown_fields_and_non_mappings() -> None:
    with pytest.raises(SchemaError, match="extra"):
        dict_to_spark_row(make_schema(), dict(make_row(0), extra=1))
    with pytest.raises(SchemaError, match="mapping"):
        dict_to_spark_row(make_schema(), [1, 2, 3])
    named = make_schema().make_namedtuple(**make_row(0))  # a namedtuple row is taken as a mapping
    assert dict_to_spark_row(make_schema(), named).id == 0


# -- schemas and types -------------------------------------------------------------------------
@needs_pyspark
def test_as_spark_schema() -> None:
    from pyspark.sql import types as T

    spark_schema = make_schema().as_spark_schema()
    assert isinstance(spark_schema, T.StructType)
    assert spark_schema.names == list(make_schema().fields)
    fields = {f.name: f for f in spark_schema.fields}
    assert fields["id"].dataType == T.LongType() and not fields["id"].nullable
    assert fields["label"].dataType == T.IntegerType()
    assert fields["weight"].dataType == T.DoubleType() and fields["weight"].nullable
    assert fields["name"].dataType == T.StringType()
    assert fields["vec"].dataType == T.ArrayType(T.FloatType())
    assert fields["boxes"].dataType == T.ArrayType(T.FloatType())
    assert fields["mask"].dataType == T.ArrayType(T.ShortType())  # no unsigned types in Spark
    assert fields["grid"].dataType == T.StructType([
        T.StructField("data", T.ArrayType(T.IntegerType())),
        T.StructField("shape", T.ArrayType(T.IntegerType())),
    ])
    for name in ("counts", "packed", "png", "jpeg"):
        assert fields[name].dataType == T.BinaryType(), name
    assert fields["packed"].nullable and not fields["png"].nullable
    typed = {f.name: f.dataType for f in _typed_schema().as_spark_schema().fields}
    assert typed["price"] == T.DecimalType(10, 2) and typed["big"] == T.DecimalType(20, 0)
    assert typed["when"] == T.TimestampType() and typed["local"] == T.TimestampNTZType()
    assert typed["day"] == T.DateType() and typed["half"] == T.ArrayType(T.FloatType())


ROUND_TRIP_ARROW = [
    pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.float32(), pa.float64(),
    pa.string(), pa.binary(), pa.date32(), pa.timestamp("us", tz="UTC"), pa.timestamp("us"),
    pa.decimal128(10, 2), pa.decimal128(38, 0), pa.list_(pa.float32()), pa.list_(pa.list_(pa.int64())),
    pa.struct([pa.field("a", pa.int32(), nullable=False), pa.field("b", pa.list_(pa.string()))]),
    pa.map_(pa.string(), pa.float64()),
]


@needs_pyspark
@pytest.mark.parametrize("arrow_type", ROUND_TRIP_ARROW, ids=str)
def test_arrow_spark_arrow_round_trip(arrow_type: pa.DataType) -> None:
    assert spark_to_arrow_type(arrow_to_spark_type(arrow_type)) == arrow_type


@needs_pyspark
def test_spark_arrow_spark_round_trip() -> None:
    from pyspark.sql import types as T

    for spark_type in [T.BooleanType(), T.ByteType(), T.ShortType(), T.IntegerType(), T.LongType(),
                       T.FloatType(), T.DoubleType(), T.StringType(), T.BinaryType(), T.DateType(),
                       T.TimestampType(), T.TimestampNTZType(), T.DecimalType(12, 3),
                       T.ArrayType(T.IntegerType(), containsNull=False), T.ArrayType(T.StringType()),
                       T.MapType(T.StringType(), T.LongType()),
                       T.StructType([T.StructField("x", T.DoubleType(), False),
                                     T.StructField("y", T.ArrayType(T.ByteType()))])]:
        assert arrow_to_spark_type(spark_to_arrow_type(spark_type)) == spark_type, spark_type


@needs_pyspark
def test_widening_and_unsupported_types() -> None:
    from pyspark.sql import types as T

    assert arrow_to_spark_type(pa.uint8()) == T.ShortType()
    assert arrow_to_spark_type(pa.uint16()) == T.IntegerType()
    assert arrow_to_spark_type(pa.uint32()) == T.LongType()
    assert arrow_to_spark_type(pa.uint64()) == T.DecimalType(20, 0)
    assert arrow_to_spark_type(pa.float16()) == T.FloatType()
    assert arrow_to_spark_type(pa.large_string()) == T.StringType()
    assert arrow_to_spark_type(pa.dictionary(pa.int32(), pa.string())) == T.StringType()
    assert arrow_to_spark_type(pa.fixed_shape_tensor(pa.float32(), [2, 3])) == T.ArrayType(T.FloatType())
    assert spark_to_arrow_type(T.VarcharType(10)) == pa.string()
    with pytest.raises(SchemaError, match="no Spark equivalent"):
        arrow_to_spark_type(pa.duration("s"))
    with pytest.raises(SchemaError, match="no Arrow equivalent"):
        spark_to_arrow_type(T.CalendarIntervalType())
    # a Spark type in ScalarCodec is stored as its Arrow type: the schema JSON never holds pyspark
    assert ScalarCodec(T.IntegerType()) == ScalarCodec(pa.int32())


@pytest.mark.spark
def test_bytes_stored_as_text_as_petastorm_does(spark: Any, tmp_path: Path) -> None:
    """Petastorm's np.string_ idiom: ScalarCodec(StringType()) or no codec, given str; read back as bytes."""
    from pyspark.sql import types as T

    schema = Unischema("Text", [
        UnischemaField("id", np.int64, (), ScalarCodec(T.LongType()), False),
        UnischemaField("sb", np.bytes_, (), ScalarCodec(T.StringType()), False),
        UnischemaField("plain", np.bytes_, (), None, True),
    ])
    fields = {f.name: f.dataType for f in schema.as_spark_schema().fields}
    assert fields["sb"] == T.StringType() and fields["plain"] == T.StringType()  # Petastorm's mapping
    rows = [{"id": i, "sb": f"s{i}" if i % 2 else f"s{i}".encode(), "plain": None if i == 3 else f"p{i}"}
            for i in range(6)]
    spark_write(spark, "file://" + str(tmp_path / "ds"), schema, rows, files=1)
    with unihub.make_reader(str(tmp_path / "ds"), shuffle_row_groups=False, workers_count=1) as reader:
        got = sorted((int(r.id), r.sb, r.plain) for r in reader)
    assert got == [(i, f"s{i}".encode(), None if i == 3 else f"p{i}".encode()) for i in range(6)]
    with pytest.raises(CodecError, match=r"field 'sb': b'\\xff' is not UTF-8.*ScalarCodec\(BinaryType\(\)\)"):
        dict_to_spark_row(schema, {"id": 1, "sb": b"\xff", "plain": None})
