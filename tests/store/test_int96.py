"""INT96 timestamps (Spark's default, Hive's, Impala's) read as the instants they hold (store/int96.py): a row group
whose values all fit nanoseconds keeps ``timestamp[ns]``, one holding a date outside 1677-2262 comes in
microseconds, never wrapped around to another date; one that no unit holds exactly is a FormatError."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from unihub import Dataset, compact_dataset, delete_rows, make_batch_reader, make_reader, open_dataset
from unihub.errors import FormatError
from unihub.store.dataset import FetchedRanges

D = datetime.datetime
FAR = [D(2020, 1, 2, 3, 4, 5, 678901), None, D(9999, 12, 31, 23, 59, 59, 999999), D(1500, 1, 1), D(1000, 3, 1, 12),
       D(1970, 1, 1)]
NEAR = np.array(["2021-01-01T00:00:00.123456789", "1677-09-22", "NaT"], "M8[ns]")


def write_int96(path: Path, ids: list[int], values: Any, unit: str = "us", **options: Any) -> None:
    table = pa.table({"id": pa.array(ids, pa.int64()), "ts": pa.array(values, pa.timestamp(unit)),
                      "many": pa.array([[v, None] for v in values], pa.list_(pa.timestamp(unit)))})
    pq.write_table(table, path, use_deprecated_int96_timestamps=True, **options)


@pytest.fixture
def far_and_near(tmp_path: Path) -> Path:
    """part-0: two row groups holding dates outside nanoseconds; part-1: nanoseconds with digits finer than 1 us."""
    write_int96(tmp_path / "part-0.parquet", list(range(6)), FAR, row_group_size=3)
    write_int96(tmp_path / "part-1.parquet", [6, 7, 8], NEAR, unit="ns")
    return tmp_path


def test_dates_outside_nanoseconds_read_as_they_are(far_and_near: Path) -> None:
    """pyarrow reads INT96 as nanoseconds: 9999-12-31 came back as 1816-03-30 and 1500-01-01 as 2084-07-20."""
    store = open_dataset(str(far_and_near))
    tables = [store.read_row_group(i) for i in range(len(store.row_groups))]
    assert [t.schema.field("ts").type for t in tables] == [pa.timestamp("us")] * 2 + [pa.timestamp("ns")]
    assert [t.schema.field("many").type.value_type for t in tables] == [pa.timestamp("us")] * 2 + [pa.timestamp("ns")]
    assert tables[0]["ts"].to_pylist() + tables[1]["ts"].to_pylist() == FAR
    assert tables[0]["many"].to_pylist() + tables[1]["many"].to_pylist() == [[v, None] for v in FAR]
    assert tables[2]["ts"].cast(pa.int64()).to_pylist() == [None if np.isnat(v) else int(v.view(np.int64))
                                                            for v in NEAR]
    with make_batch_reader(str(far_and_near), shuffle_row_groups=False, workers_count=1) as reader:
        batches = list(reader)
    assert [b.ts.dtype for b in batches] == [np.dtype("M8[us]")] * 2 + [np.dtype("M8[ns]")]  # Petastorm's ns kept
    assert np.concatenate([b.ts[:3] for b in batches[:2]]).tolist() == FAR
    assert batches[2].ts.tolist()[:2] == NEAR.tolist()[:2]
    with make_reader(str(far_and_near), shuffle_row_groups=False, workers_count=1) as reader:
        rows = list(reader)
    assert [None if r.ts is None else r.ts.item() for r in rows[:6]] == FAR
    assert rows[6].ts == NEAR[0]


def test_a_row_group_read_ahead_is_read_the_same(far_and_near: Path) -> None:
    """The read-ahead's path (``fetched=``, remote stores) reads INT96 as the open file does."""
    store = open_dataset(str(far_and_near))
    path = store.row_groups[0].path
    fetched = FetchedRanges(pafs.LocalFileSystem(), path, [(0, Path(path).read_bytes())])
    assert store.read_row_group(0, ["ts"], fetched=fetched)["ts"].to_pylist() == FAR[:3]


def test_rows_taken_across_row_groups_of_two_units_keep_their_dates(far_and_near: Path) -> None:
    """numpy joined nanoseconds and microseconds in nanoseconds, wrapping 9999-12-31 to 1816-03-30."""
    dataset = Dataset(str(far_and_near))
    assert dataset.take([7, 2, 3]).ts.tolist()[1:] == [FAR[2], FAR[3]]
    assert dataset.take([7, 2]).ts.dtype == np.dtype("M8[us]")
    joined = dataset.take([6, 0]).ts
    assert joined.dtype == np.dtype("M8[ns]") and joined.tolist() == [int(NEAR[0].view(np.int64)),
                                                                       int(np.datetime64(FAR[0], "ns").view(np.int64))]


def test_a_far_date_finer_than_a_microsecond_is_refused(tmp_path: Path) -> None:
    """No unit holds 10214-01-.. and 1 ns: the file's INT96 bytes are patched to a Julian day past nanoseconds."""
    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"ts": pa.array(np.array(["2000-01-01T00:00:00.000000001"], "M8[ns]"))}), path,
                   use_deprecated_int96_timestamps=True, compression="none", use_dictionary=False)
    data = path.read_bytes()
    value = (1).to_bytes(8, "little") + (2451545).to_bytes(4, "little")
    assert data.count(value) == 1
    path.write_bytes(data.replace(value, (1).to_bytes(8, "little") + (2451545 + 3_000_000).to_bytes(4, "little")))
    with pytest.raises(FormatError, match=r"column 'ts'.*and 1 ns lies outside"):
        open_dataset(str(tmp_path)).read_row_group(0)


def test_a_file_without_int96_is_read_as_before(tmp_path: Path) -> None:
    """INT64 timestamps of every unit, with and without a zone, come back exactly in their own unit."""
    moment = D(2020, 1, 2, 3, 4, 5, 678000)
    table = pa.table({unit: pa.array([moment, None], pa.timestamp(unit)) for unit in ("ms", "us", "ns")}
                     | {"utc": pa.array([moment, None], pa.timestamp("us", tz="UTC")),
                        "far": pa.array([D(9999, 12, 31), None], pa.timestamp("us"))})
    pq.write_table(table, tmp_path / "part-0.parquet")
    assert open_dataset(str(tmp_path)).read_row_group(0).equals(table)


def test_a_rewrite_of_dates_outside_nanoseconds_is_refused(far_and_near: Path) -> None:
    """A delete or a compaction rewrote INT96 read as nanoseconds: 9999-12-31 was written back as 1816-03-30."""
    for rewrite in (lambda: delete_rows(str(far_and_near), pc.field("id") == 1),
                    lambda: compact_dataset(str(far_and_near))):
        with pytest.raises(FormatError, match=r"part-0.parquet: row group 0, column 'ts': INT96 timestamps outside"):
            rewrite()
        assert pq.read_table(far_and_near / "part-0.parquet", coerce_int96_timestamp_unit="us")["ts"].to_pylist() == FAR
        assert sorted(p.name for p in far_and_near.glob("*.parquet")) == ["part-0.parquet", "part-1.parquet"]


def test_a_rewrite_of_int96_within_nanoseconds_keeps_every_value(tmp_path: Path) -> None:
    write_int96(tmp_path / "part-0.parquet", [0, 1, 2], NEAR, unit="ns")
    delete_rows(str(tmp_path), pc.field("id") == 1)
    with make_batch_reader(str(tmp_path), workers_count=1) as reader:
        (kept,) = [b.ts for b in reader]
    assert kept.tolist() == [NEAR.tolist()[0], None]


@pytest.mark.spark
def test_spark_default_int96_output_reads_as_spark_shows_it(spark: Any, tmp_path: Path) -> None:
    """Plain ``df.write.parquet`` (INT96, not rebased): dates outside nanoseconds, before 1582, null, in a list;
    by the readers and a converter over the folder."""
    from pyspark.sql import types as T

    from unihub import make_spark_converter

    utc = datetime.timezone.utc
    stamps = [D(1500, 6, 1, 12, tzinfo=utc), D(9999, 12, 31, 23, 59, 59, 999999, tzinfo=utc),
              D(2020, 1, 2, 3, 4, 5, 678901, tzinfo=utc), None, D(1000, 1, 1, tzinfo=utc)]
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("ts", T.TimestampType()),
                           T.StructField("many", T.ArrayType(T.TimestampType()))])
    keys = {"spark.sql.parquet.outputTimestampType": "INT96", "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
            "spark.sql.session.timeZone": "UTC"}
    saved = {key: spark.conf.get(key, None) for key in keys}
    for key, setting in keys.items():
        spark.conf.set(key, setting)
    try:
        frame = spark.createDataFrame([(i, t, [t, None]) for i, t in enumerate(stamps)], schema)
        frame.coalesce(1).write.parquet(str(tmp_path / "out"))
    finally:
        for key, setting in saved.items():
            spark.conf.unset(key) if setting is None else spark.conf.set(key, setting)
    (part,) = (tmp_path / "out").glob("*.parquet")
    assert pq.ParquetFile(part).metadata.schema.column(1).physical_type == "INT96"
    naive = [None if t is None else t.replace(tzinfo=None) for t in stamps]
    url = (tmp_path / "out").as_uri()
    for source in (url, make_spark_converter(url).cache_dir_url):
        with make_batch_reader(source, workers_count=1) as reader:
            (batch,) = list(reader)
        assert batch.ts.dtype == np.dtype("M8[us]") and batch.ts.tolist() == naive
        assert [list(v) for v in batch.many] == [[t, None] for t in naive]
    with make_reader(url, workers_count=1) as reader:
        assert [None if r.ts is None else r.ts.item() for r in reader] == naive
