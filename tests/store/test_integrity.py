"""Parquet page checksums: written by every unihub writer, verified by every read path, and a
damaged page is a DataCorruptionError naming file, row group and column, never other values.

Pages are located with :mod:`.parquet_pages` (pyarrow does not expose them). Before checksums,
67 of the 150 single-bit flips below in the sample dataset's column chunks, and 119 of 150 in the
image dataset's, decoded silently to other values.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub import (
    CompressedImageCodec,
    FormatError,
    ScalarCodec,
    Unischema,
    UnischemaField,
    copy_dataset,
    make_batch_reader,
    make_reader,
    open_dataset,
    write_dataset,
)
from unihub.cli import main
from unihub.errors import DataCorruptionError, InvalidArgumentError
from unihub.readers.random_access import Dataset
from unihub.store import dataset as parquet_module
from unihub.store import integrity

from .parquet_pages import Page, pages

FLIPS = 150


@pytest.fixture(autouse=True, params=["walked here", "checked by Arrow"])
def page_checks(request, monkeypatch):
    """Every test both ways: pages walked and checked by unihub (the small test files' chunks too),
    and left to Arrow's check (store/dataset.py WALK_MIN_CHUNK_BYTES)."""
    monkeypatch.setattr(parquet_module, "WALK_MIN_CHUNK_BYTES", 0 if request.param == "walked here" else 2**62)

ImageSchema = Unischema("Images", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("image", np.uint8, (8, 8, 3), CompressedImageCodec("png"), False),
    UnischemaField("values", np.float32, (None,), None, False),  # a codec-less list column
    UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), True),
])


def image_row(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    return {"id": i, "image": rng.integers(0, 255, (8, 8, 3), dtype=np.uint8),
            "values": rng.random(i % 5, dtype=np.float32), "name": None if i % 4 == 0 else f"row {i}"}


@pytest.fixture
def datasets(write_sample, tmp_path) -> dict[str, Path]:
    """Two datasets of many small row groups: every non-image codec, and images with a plain list column."""
    sample, _ = write_sample(300, row_group_size_mb=0.01)
    images = tmp_path / "images"
    write_dataset(images, ImageSchema, (image_row(i) for i in range(200)), row_group_size_mb=0.005)
    return {"sample": sample, "images": images}


def data_file(dataset: Path) -> Path:
    (path,) = sorted(dataset.glob("*.parquet"))
    return path


def flip(path: Path, offset: int, bit: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ (1 << bit)]))


def read_group(dataset: Path, index: int) -> pa.Table:
    return open_dataset(dataset).read_row_group(index)


def payload_flip(path: Path, avoid: str = "") -> Page:
    """Flip a bit in the middle of a data page's bytes (of the first row group, a column other than
    ``avoid``); the page it was in."""
    page = next(p for p in pages(str(path)) if p.num_values is not None and p.end - p.body > 16
                and p.column.split(".")[0] != avoid)
    flip(path, (page.body + page.end) // 2, 3)
    return page


# -- every flip is detected or harmless ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["sample", "images"])
def test_single_bit_flips_in_column_chunks_never_change_values_silently(datasets, name):
    """150 single-bit flips anywhere in the column chunks (page headers and page bytes): each is a
    named error or reads back identical; a flip in page bytes (what the CRC covers) is always a
    DataCorruptionError naming file, row group and column."""
    dataset = datasets[name]
    path = data_file(dataset)
    original = path.read_bytes()
    store = open_dataset(dataset)
    assert len(store.row_groups) >= 8
    expected = [store.read_row_group(i) for i in range(len(store.row_groups))]
    found = pages(str(path))
    assert all(p.has_crc for p in found)
    sizes = np.array([p.end - p.header for p in found])
    rng = np.random.default_rng(2026)
    outcomes = {"identical": 0, "corruption": 0, "format": 0}
    for _ in range(FLIPS):
        page = found[rng.choice(len(found), p=sizes / sizes.sum())]
        offset = int(rng.integers(page.header, page.end))
        flip(path, offset, int(rng.integers(8)))
        try:
            table = read_group(dataset, page.row_group)
        except DataCorruptionError as exc:
            outcomes["corruption"] += 1
            assert str(path) in str(exc) and f"row group {page.row_group}," in str(exc)
            assert exc.path == str(path) and exc.row_group == page.row_group
            assert exc.column == page.column.split(".")[0], (exc, page)
        except FormatError as exc:  # a damaged header: Thrift or the decoder refuse it
            outcomes["format"] += 1
            assert offset < page.body, f"a flip in page bytes at {offset} was not caught by the CRC: {exc}"
            assert str(path) in str(exc) and f"row group {page.row_group}" in str(exc)
        else:
            assert table.equals(expected[page.row_group]), \
                f"flip at byte {offset} ({page.column}, row group {page.row_group}) changed values silently"
            outcomes["identical"] += 1
        path.write_bytes(original)
    assert outcomes["corruption"] > FLIPS // 2, outcomes


def test_a_damaged_value_count_in_a_nested_page_header_is_detected(datasets, monkeypatch):
    """The CRC does not cover page headers: a data page of a list column that claims fewer values
    than it holds loses the last elements of its last row, silently but for the value count check."""
    dataset = datasets["images"]
    path = data_file(dataset)
    original = path.read_bytes()
    expected = [read_group(dataset, i) for i in range(len(open_dataset(dataset).row_groups))]
    check = integrity.check_value_counts
    monkeypatch.setattr(integrity, "check_value_counts", lambda *args: None)
    for page in (p for p in pages(str(path)) if p.column.startswith("values.") and p.num_values):
        low_bit = (page.num_values & -page.num_values).bit_length() - 1  # the count's lowest set bit
        if low_bit > 5:
            continue
        flip(path, page.num_values_at, low_bit + 1)  # zigzag: the count's bit k is the varint's bit k + 1
        try:
            silent = not read_group(dataset, page.row_group).equals(expected[page.row_group])
        except FormatError:  # pyarrow notices when whole rows go missing
            silent = False
        if silent:
            break
        path.write_bytes(original)
    else:
        pytest.fail("no page whose damaged count changes values silently")
    monkeypatch.setattr(integrity, "check_value_counts", check)
    with pytest.raises(DataCorruptionError, match=rf"row group {page.row_group}, column 'values\.list\.element'"
                                                  rf": its pages decode to \d+ values where the column chunk "
                                                  rf"records \d+") as caught:
        read_group(dataset, page.row_group)
    assert caught.value.column == "values" and caught.value.path == str(path)


def test_each_row_group_is_checked_once_per_opened_dataset_unless_asked_always(corrupt_later, monkeypatch):
    """``UNIHUB_PAGE_CHECKSUMS``: "once" (default) checks a row group's columns on their first read by an
    opened dataset; "always" on every read; "off" never."""
    dataset, damage = corrupt_later
    store = open_dataset(dataset)
    store.read_row_group(0, ["id"])  # only this column is checked
    page = damage()
    assert page.row_group == 0 and page.column != "id"
    store.read_row_group(0, ["id"])  # checked already: not again
    with pytest.raises(DataCorruptionError):
        store.read_row_group(0)  # the other columns: checked on their first read
    monkeypatch.setenv("UNIHUB_PAGE_CHECKSUMS", "always")
    always = open_dataset(dataset)
    for _ in range(2):
        with pytest.raises(DataCorruptionError):
            always.read_row_group(0)
    monkeypatch.setenv("UNIHUB_PAGE_CHECKSUMS", "off")
    try:
        open_dataset(dataset).read_row_group(0)  # decoded as it is, or refused by the decoder
    except DataCorruptionError:
        pytest.fail("UNIHUB_PAGE_CHECKSUMS=off still checked the page")
    except FormatError as exc:
        assert "CRC" not in str(exc)
    monkeypatch.setenv("UNIHUB_PAGE_CHECKSUMS", "sometimes")
    with pytest.raises(InvalidArgumentError, match="UNIHUB_PAGE_CHECKSUMS='sometimes'"):
        open_dataset(dataset)


def test_what_a_forked_process_checked_is_not_checked_again_by_its_siblings(corrupt_later):
    """torch forks new workers from the process that opened the dataset each epoch: a row group one of
    them read whole and checked is not checked again by the others or the next epoch's (shared memory);
    a copy unpickled in another process, or the dataset opened again, checks for itself."""
    import pickle

    dataset, damage = corrupt_later
    store = open_dataset(dataset)
    child = os.fork()
    if child == 0:  # a worker: reads row group 0 whole (checked), and row group 1's ids only
        try:
            store.read_row_group(0)
            store.read_row_group(1, ["id"])
        finally:
            os._exit(0)
    assert os.waitpid(child, 0)[1] == 0
    assert not store._needs_check(0, None) and store._needs_check(1, None)
    unpickled = pickle.loads(pickle.dumps(store))
    assert unpickled._needs_check(0, None)
    damage()
    with pytest.raises(DataCorruptionError):
        open_dataset(dataset).read_row_group(0)


@pytest.fixture
def corrupt_later(write_sample) -> tuple[Path, Any]:
    dataset, _ = write_sample(300, row_group_size_mb=0.01)
    return dataset, lambda: payload_flip(data_file(dataset), avoid="id")


# -- what reads and writes ----------------------------------------------------------------------------
def test_files_without_page_checksums_read_as_before(tmp_path):
    """Plain Parquet from another writer, with no CRC in its page headers (Petastorm's datasets too:
    tests/petastorm/test_fixture.py), nested columns and nulls included."""
    root = tmp_path / "plain"
    root.mkdir()
    table = pa.table({"id": pa.array(np.arange(100)),
                      "pairs": pa.array([None if i % 7 == 0 else [[float(i)] * (i % 3)] * (i % 4) for i in range(100)],
                                        type=pa.list_(pa.list_(pa.float64()))),
                      "tags": pa.array([[(f"k{j}", j) for j in range(i % 3)] for i in range(100)],
                                       type=pa.map_(pa.string(), pa.int32()))})
    pq.write_table(table, root / "part-0.parquet", row_group_size=30, write_page_checksum=False)
    assert not any(p.has_crc for p in pages(str(root / "part-0.parquet")))
    store = open_dataset(root)
    assert pa.concat_tables(store.read_row_group(i) for i in range(len(store.row_groups))).equals(table)


def test_every_writer_puts_a_checksum_in_every_page(write_sample, tmp_path):
    from unihub.converters.convert import convert
    from unihub.store.writer import restamp_schema

    source, _ = write_sample(120, row_group_size_mb=0.01, partition_by=["split"])
    copied = tmp_path / "copied"
    copy_dataset(None, source, copied, field_regex=["id", "vec", "boxes", "split"])
    converted = tmp_path / "converted"
    convert(source, converted, progress=False)
    restamped = data_file(copied / "split=train")
    import pyarrow.fs as pafs

    from unihub.schema.unischema import SCHEMA_METADATA_KEY

    view = open_dataset(copied).schema.create_schema_view(["id", "vec", "boxes"])
    assert restamp_schema(pafs.LocalFileSystem(), str(restamped), {SCHEMA_METADATA_KEY: view.to_json().encode()})
    outputs = [sorted(root.rglob("*.parquet")) for root in (source, copied, converted)]
    assert all(outputs) and restamped in outputs[1]
    for path in (p for files in outputs for p in files):
        found = pages(str(path))
        assert found and all(p.has_crc for p in found), path


def test_spark_writes_page_checksums(spark, tmp_path):
    """materialize_dataset sets parquet-mr's page checksums for the job; a flipped bit then fails the read."""
    from unihub import dict_to_spark_row, materialize_dataset

    url = (tmp_path / "spark").as_uri()
    with materialize_dataset(spark, url, ImageSchema, row_group_size_mb=1):
        rows = [dict_to_spark_row(ImageSchema, image_row(i)) for i in range(30)]
        spark.createDataFrame(rows, _spark_schema_with_codecless_lists()).coalesce(1).write.parquet(url)
    (path,) = sorted((tmp_path / "spark").glob("*.parquet"))
    assert all(p.has_crc for p in pages(str(path)))
    page = payload_flip(path)
    with pytest.raises(DataCorruptionError, match="fails its CRC-32 checksum"):
        read_group(tmp_path / "spark", page.row_group)


def _spark_schema_with_codecless_lists() -> Any:
    """ImageSchema's Spark schema, its codec-less list column as a Spark array (as_spark_schema refuses a
    non-scalar field without a codec, as Petastorm's did)."""
    from pyspark.sql.types import ArrayType, FloatType, StructField, StructType

    with_codecs = Unischema("WithCodecs", [f for f in ImageSchema if f.codec is not None]).as_spark_schema()
    given = {f.name: f for f in with_codecs.fields}
    return StructType([given.get(name) or StructField(name, ArrayType(FloatType(), False), False)
                       for name in ImageSchema.fields])


@pytest.fixture
def corrupt(write_sample) -> tuple[Path, Page]:
    dataset, _ = write_sample(300, row_group_size_mb=0.01)
    return dataset, payload_flip(data_file(dataset))


@pytest.mark.parametrize("how", ["make_reader", "process pool", "make_batch_reader", "random access",
                                 "local-disk cache"])
def test_every_read_path_raises_data_corruption_error(corrupt, how, tmp_path):
    dataset, page = corrupt
    message = rf"row group {page.row_group}, column '{page.column.split('.')[0]}': a data page fails its CRC-32"
    with pytest.raises(DataCorruptionError, match=message):
        if how == "random access":
            ds = Dataset(dataset)
            ds.take(list(range(len(ds))))
        elif how == "make_batch_reader":
            with make_batch_reader(dataset, shuffle_row_groups=False) as reader:
                list(reader)
        else:
            options: dict[str, Any] = {"process pool": {"reader_pool_type": "process", "workers_count": 2},
                                       "local-disk cache": {"cache_type": "local-disk",
                                                            "cache_location": str(tmp_path / "cache"),
                                                            "cache_size_limit": 2**26}}.get(how, {})
            with make_reader(dataset, shuffle_row_groups=False, **options) as reader:
                list(reader)


def test_cli_reports_a_damaged_page_in_one_line(corrupt, tmp_path, capsys):
    dataset, page = corrupt
    target = tmp_path / "out"
    assert main(["convert", str(dataset), str(target)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("unihub: error: ") and err.count("\n") == 1
    assert f"{data_file(dataset)}: row group {page.row_group}, column" in err and "CRC-32" in err
    assert not target.exists() and not list(tmp_path.glob(".out*"))
