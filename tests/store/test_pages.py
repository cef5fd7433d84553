"""Binary columns read as views of the memory-mapped file (store/_pages.py): the same
values as pyarrow reads, from files pyarrow, Spark (Petastorm's) and unihub wrote; declined (None)
wherever the layout is another, including hostile bytes; never a value pyarrow would not give."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub.errors import DataCorruptionError, FormatError
from unihub.schema.arrow_numpy import take_table, take_views
from unihub.schema.codecs import BinaryCells, CompressedImageCodec, binary_views
from unihub.schema.unischema import Unischema, UnischemaField
from unihub.store import _pages
from unihub.store._pages import _value_spans, binary_leaves, chunk_pages, chunk_span, plain_binary_column
from unihub.store.dataset import open_dataset
from unihub.store.writer import write_dataset

PETASTORM = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm" / "unischema"


def _values(n: int, seed: int = 0) -> list[bytes]:
    """Lengths 0 to 40 (inline in a view up to 12) and a few long ones, random bytes."""
    rng = random.Random(seed)
    return [rng.randbytes(rng.choice([0, 1, 4, 11, 12, 13, 16, 40, 3000])) for _ in range(n)]


def _viewed(path: Path, column: str = "b", *, verify: bool = False, mapped: list[pa.Buffer] | None = None
            ) -> list[pa.Array | None]:
    """Each row group's ``column`` as plain_binary_column reads it (None: declined); the file's
    map is appended to ``mapped`` where given."""
    handle = pa.memory_map(str(path))
    parquet_file = pq.ParquetFile(handle)
    whole = handle.read_buffer(handle.size())
    if mapped is not None:
        mapped.append(whole)
    leaf = binary_leaves(parquet_file).get(column)
    assert leaf is not None
    return [plain_binary_column(whole, parquet_file.metadata, g, leaf, verify=verify)
            for g in range(parquet_file.metadata.num_row_groups)]


def _write(path: Path, values: list[Any], *, nullable: bool = False, kind: pa.DataType = pa.binary(),
           **options: Any) -> Path:
    table = pa.table({"b": pa.array(values, kind), "i": pa.array(range(len(values)), pa.int64())},
                     schema=pa.schema([pa.field("b", kind, nullable), pa.field("i", pa.int64())]))
    settings = {"compression": "none", "use_dictionary": False, "row_group_size": 100, **options}
    pq.write_table(table, str(path), **settings)
    return path


LAYOUTS_READ = {
    "v1 pages": {},
    "v2 pages": {"data_page_version": "2.0"},
    "many small pages": {"data_page_size": 512},
    "page checksums": {"write_page_checksum": True},
    "no Arrow schema stored": {"store_schema": False},
}


@pytest.mark.parametrize("options", LAYOUTS_READ.values(), ids=LAYOUTS_READ.keys())
@pytest.mark.parametrize("nullable", [False, True], ids=["required", "optional, no nulls"])
def test_plain_uncompressed_columns_read_as_views_of_the_file(tmp_path, options, nullable):
    values = _values(250)
    path = _write(tmp_path / "f.parquet", values, nullable=nullable, **options)
    maps: list[pa.Buffer] = []
    arrays = _viewed(path, verify=True, mapped=maps)
    assert all(a is not None for a in arrays)
    assert [v for a in arrays for v in a.to_pylist()] == values  # type: ignore[union-attr]
    mapped = maps[0]
    for array in arrays:
        assert array.type == pa.binary_view()
        data = array.buffers()[2]  # type: ignore[union-attr]
        assert mapped.address <= data.address < mapped.address + mapped.size  # the file's own pages
        assert [bytes(v) for v in BinaryCells(array).at()] == array.to_pylist()  # type: ignore[union-attr]


LAYOUTS_DECLINED = {
    "compressed": {"compression": "snappy"},
    "dictionary": {"use_dictionary": True},
    "delta encoded": {"column_encoding": {"b": "DELTA_LENGTH_BYTE_ARRAY"}},
}


@pytest.mark.parametrize("options", LAYOUTS_DECLINED.values(), ids=LAYOUTS_DECLINED.keys())
def test_other_layouts_are_declined(tmp_path, options):
    path = _write(tmp_path / "f.parquet", _values(250) if "use_dictionary" not in options else [b"x" * 20] * 250,
                  **options)
    assert _viewed(path) == [None, None, None]


def test_nulls_are_declined_and_a_group_without_them_is_not(tmp_path):
    values: list[bytes | None] = _values(200)
    values[150] = None
    arrays = _viewed(_write(tmp_path / "f.parquet", values, nullable=True))
    assert arrays[1] is None
    assert arrays[0] is not None and arrays[0].to_pylist() == values[:100]


def test_spark_and_petastorm_files_read_the_same_through_the_store():
    """Petastorm's fixture (Spark wrote it, snappy): declined, and the store's reads with views
    asked equal those without."""
    store = open_dataset(PETASTORM)
    images = {f.name for f in store.schema if isinstance(f.codec, CompressedImageCodec)}
    assert images
    for g in range(len(store.row_groups)):
        plain = store.read_row_group(g)
        viewed = store.read_row_group(g, views=images)
        assert viewed.column_names == plain.column_names
        for name in plain.column_names:
            assert viewed.column(name).to_pylist() == plain.column(name).to_pylist()


def _image_dataset(tmp_path: Path, n: int = 120) -> Path:
    schema = Unischema("Images", [
        UnischemaField("id", np.int64, ()),
        UnischemaField("image", np.uint8, (8, 8, 3), CompressedImageCodec("png"), False),
    ])
    rng = np.random.default_rng(0)
    rows = ({"id": i, "image": rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)} for i in range(n))
    write_dataset(tmp_path / "ds", schema, rows, row_group_size_mb=0.01)
    return tmp_path / "ds"


def test_unihub_s_images_come_as_views_and_equal_pyarrow_s_read(tmp_path):
    store = open_dataset(_image_dataset(tmp_path))
    assert len(store.row_groups) > 2
    for g in range(len(store.row_groups)):
        plain = store.read_row_group(g, ["image", "id"])
        viewed = store.read_row_group(g, ["image", "id"], views={"image"})
        assert viewed.schema.field("image").type == pa.binary_view()
        assert viewed.column_names == ["image", "id"] and viewed.column("id") == plain.column("id")
        assert viewed.column("image").to_pylist() == plain.column("image").to_pylist()
        assert store.read_row_group(g, ["id"], views={"image"}).column_names == ["id"]


def test_fetched_images_come_as_views_of_the_fetched_bytes(tmp_path):
    """A row group fetched ahead (readers/prefetch.py) reads its images as views of the fetched part, not
    through pyarrow's copy, unmarked as views of the file (a value held pins the part): the values pyarrow
    reads. A chunk cut between two parts is read by pyarrow, as before."""
    from unihub.store.dataset import FetchedRanges, views_the_file

    store = open_dataset(_image_dataset(tmp_path))
    for g in range(len(store.row_groups)):
        info = store.row_groups[g]
        spans = store.chunk_spans(g, ["image", "id"])
        start, stop = min(s for s, _ in spans), max(e for _, e in spans)
        data = Path(info.path).read_bytes()
        plain = store.read_row_group(g, ["image", "id"])
        whole = FetchedRanges(store.filesystem, info.path, [(start, data[start:stop])], len(data))
        middle = (start + stop) // 2
        cut = FetchedRanges(store.filesystem, info.path, [(start, data[start:middle]), (middle, data[middle:stop])],
                            len(data))
        for fetched, kind in ((whole, pa.binary_view()), (cut, pa.binary())):
            read = store.read_row_group(g, ["image", "id"], views={"image"}, fetched=fetched)
            assert read.schema.field("image").type == kind and not views_the_file(read.schema.field("image"))
            assert read.column_names == ["image", "id"] and read.column("id") == plain.column("id")
            assert read.column("image").to_pylist() == plain.column("image").to_pylist()
            assert fetched.missed == 0


def test_views_outlive_the_file_s_mapping(tmp_path):
    store = open_dataset(_image_dataset(tmp_path))
    kept = [store.read_row_group(g, ["image"], views={"image"}) for g in range(len(store.row_groups))]
    store._close_file()
    expected = [store.read_row_group(g, ["image"]).column("image").to_pylist() for g in range(len(kept))]
    assert [t.column("image").to_pylist() for t in kept] == expected


def test_a_page_that_fails_its_checksum_is_declined_and_the_store_names_it(tmp_path):
    path = _write(tmp_path / "f.parquet", _values(100, seed=1), write_page_checksum=True)
    column = pq.ParquetFile(str(path)).metadata.row_group(0).column(0)
    start, end = chunk_span(column)
    data = bytearray(path.read_bytes())
    data[end - 2] ^= 0xFF  # the last value's last byte
    path.write_bytes(bytes(data))
    assert _viewed(path, verify=True) == [None]
    assert _viewed(path, verify=False)[0] is not None  # as pyarrow, unchecked: the bytes as they are
    store = open_dataset(tmp_path)
    with pytest.raises(DataCorruptionError, match="f.parquet"):
        store.read_row_group(0, views={"b"})


HOSTILE_LAYOUTS = {
    "required, v1": {},
    "optional, v1": {"nullable": True},
    "optional, v2, checksums": {"nullable": True, "data_page_version": "2.0", "write_page_checksum": True},
}


@pytest.mark.parametrize("options", HOSTILE_LAYOUTS.values(), ids=HOSTILE_LAYOUTS.keys())
def test_hostile_bytes_are_declined_or_read_as_pyarrow_reads_them(tmp_path, options):
    """Random bytes flipped in the chunk (headers, levels, lengths, values): the reader returns in
    bounded time, and anything it returns is what pyarrow reads of the same bytes (a header pyarrow
    refuses, levels that do not match, are declined)."""
    verify = bool(options.get("write_page_checksum"))  # checked as pyarrow checks them, then
    clean = _write(tmp_path / "clean.parquet", _values(60, seed=2), data_page_size=256, row_group_size=60,
                   **options)
    start, end = chunk_span(pq.ParquetFile(str(clean)).metadata.row_group(0).column(0))
    original = clean.read_bytes()
    rng = random.Random(3)
    returned = declined = 0
    for trial in range(300):
        data = bytearray(original)
        for _ in range(rng.choice([1, 2, 8])):
            data[rng.randrange(start, min(end, start + 400) if trial % 2 else end)] = rng.randrange(256)
        path = tmp_path / f"t{trial}.parquet"
        path.write_bytes(bytes(data))
        array = _viewed(path, verify=verify)[0]
        if array is None:
            declined += 1
        else:
            returned += 1
            expected = pq.read_table(str(path), columns=["b"], page_checksum_verification=verify).column("b")
            assert array.to_pylist() == expected.to_pylist()
        path.unlink()
    assert returned and declined  # both kinds of damage met


def _walk(data: bytes, span: tuple[int, int], count: int) -> list[tuple[int, ...]] | str:
    """What chunk_pages makes of a chunk: each page's offsets, type, CRC, count and size, or its error."""
    try:
        return [page[:7] for page in chunk_pages(memoryview(data), *span, count)]
    except (FormatError, IndexError) as exc:
        return type(exc).__name__


@pytest.mark.parametrize("options", [
    {"write_page_checksum": True, "write_statistics": False},
    {"write_page_checksum": True, "write_statistics": False, "nullable": True},
    {"write_page_checksum": True, "write_statistics": False, "data_page_version": "2.0"},
    {"write_page_checksum": True}, {"write_statistics": False}],
    ids=["checksums", "checksums, optional", "v2 pages", "statistics", "no checksums"])
def test_headers_read_at_a_glance_are_read_as_thrift_reads_them(tmp_path, monkeypatch, options):
    """Arrow's v1 data page headers are read without the Thrift parser (a row group's walk meets one per few
    images): on clean and damaged chunks the pages found, or the error, are those of the full parse."""
    path = _write(tmp_path / "f.parquet", _values(200, seed=4), data_page_size=256, row_group_size=200, **options)
    original = path.read_bytes()
    column = pq.ParquetFile(str(path)).metadata.row_group(0).column(0)
    span, count = chunk_span(column), column.num_values
    glanced = []
    real = _pages._v1_header
    monkeypatch.setattr(_pages, "_v1_header", lambda *args: glanced.append(real(*args)) or glanced[-1])
    rng = random.Random(5)
    for trial in range(151):
        data = bytearray(original)
        for at in rng.sample(range(span[0], span[0] + 300), 2) if trial else ():
            data[at] = rng.randrange(256)
        quick = _walk(data, span, count)
        monkeypatch.setattr(_pages, "_v1_header", lambda *args: None)
        assert _walk(data, span, count) == quick
        monkeypatch.setattr(_pages, "_v1_header", lambda *args: glanced.append(real(*args)) or glanced[-1])
    assert isinstance(_walk(original, span, count), list)
    glances = [found for found in glanced if found is not None]
    # Arrow's layout (a CRC, no statistics in the header: how unihub writes image columns) is read at a glance
    assert bool(glances) == (options.get("write_page_checksum", False) and options.get("write_statistics") is False
                             and "data_page_version" not in options)


def _i32(value: int) -> bytes:
    return _varint((value << 1) ^ (value >> 63))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append(value & 0x7F | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _page(values: list[bytes], *, extra: bytes = b"", levels: bytes | None = None) -> bytes:
    """A v1 PLAIN data page (header + body) by hand: ``extra`` goes in the header before its stop
    byte; ``levels``: an optional column's RLE definition levels (after their 4-byte length)."""
    body = b"".join(len(v).to_bytes(4, "little") + v for v in values)
    if levels is not None:
        body = len(levels).to_bytes(4, "little") + levels + body
    data_page = b"\x15" + _i32(len(values)) + b"\x15" + _i32(0) + b"\x15" + _i32(3) + b"\x15" + _i32(3) + b"\x00"
    header = (b"\x15" + _i32(0) + b"\x15" + _i32(len(body)) + b"\x15" + _i32(len(body)) + b"\x2c" + data_page
              + extra + b"\x00")
    return header + body


IMAGES = [bytes([i]) * (100 + i) for i in range(5)]


def test_a_page_made_by_hand_is_walked_value_by_value():
    chunk = _page(IMAGES) + _page(IMAGES[:2])
    starts, lengths = _value_spans(memoryview(chunk), 7, 0, verify=True)
    assert [chunk[a:a + n] for a, n in zip(starts.tolist(), lengths.tolist())] == IMAGES + IMAGES[:2]
    levels = _varint(5 << 1) + b"\x01"  # one RLE run: 5 values, all there
    starts, lengths = _value_spans(memoryview(_page(IMAGES, levels=levels)), 5, 1, verify=False)
    assert lengths.tolist() == [len(v) for v in IMAGES]


HOSTILE_HEADERS = {
    # the data page header again, under an id Thrift keeps as int16 5 (65541): pyarrow reads this one
    "a field id past int16": b"\x0c" + _varint(65541 << 1) + b"\x15" + _i32(999) + b"\x00",
    "a field given twice": b"\x04" + _varint(4 << 1) + b"\x04" + _varint(4 << 1),  # crc, i32 then bool
    "lists nested 5,000 deep": b"\x09" + _varint(15 << 1) + b"\x19" * 5000,
    "a list of 20,000 elements": b"\x09" + _varint(15 << 1) + b"\xf3" + _varint(20_000) + b"\x00" * 20_000,
    "an empty list of an unknown type": b"\x09" + _varint(15 << 1) + b"\x0e",
    "a header of over 64 KiB": b"\x08" + _varint(15 << 1) + _varint(70_000) + b"x" * 70_000,
}


@pytest.mark.parametrize("extra", HOSTILE_HEADERS.values(), ids=HOSTILE_HEADERS.keys())
def test_headers_thrift_or_pyarrow_would_read_otherwise_are_declined(extra):
    with pytest.raises(FormatError):
        _value_spans(memoryview(_page(IMAGES, extra=extra)), 5, 0, verify=True)


HOSTILE_PAGES = {
    "a run header of 6 bytes (Arrow reads 5 at most)": _page(IMAGES, levels=b"\x8a\x80\x80\x80\x80\x00\x01"),
    "a run of 4 of 5 values": _page(IMAGES, levels=_varint(4 << 1) + b"\x01"),
    "a null in the levels": _page(IMAGES, levels=_varint(5 << 1) + b"\x00"),
    "values under 16 bytes on average": _page([b"tiny"] * 5, levels=_varint(5 << 1) + b"\x01"),
}


@pytest.mark.parametrize("chunk", HOSTILE_PAGES.values(), ids=HOSTILE_PAGES.keys())
def test_levels_that_are_not_one_run_of_values_are_declined(chunk):
    with pytest.raises(FormatError):
        _value_spans(memoryview(chunk), 5, 1, verify=False)


def test_binary_cells_read_views_made_by_arrow_too():
    """Arrow's own binary_view arrays: inline and referenced values, several data buffers, slices
    and nulls."""
    values = [b"short", None, b"a long value past twelve bytes", b"", b"x" * 5000] * 20
    array = pa.array(values, pa.binary()).cast(pa.binary_view())
    joined = pa.concat_arrays([array, pa.array(values[::-1], pa.binary()).cast(pa.binary_view())])
    for candidate in (array, array.slice(3, 50), joined):
        expected = candidate.to_pylist()
        assert [None if v is None else bytes(v) for v in binary_views(candidate)] == expected
        rows = np.random.default_rng(0).permutation(len(candidate))[:30]
        got = BinaryCells(candidate).at(rows)
        assert [None if v is None else bytes(v) for v in got] == [expected[i] for i in rows]
        taken = take_views(candidate, rows)
        taken.validate(full=True)
        assert taken.to_pylist() == [expected[i] for i in rows]
    with pytest.raises(IndexError):
        take_views(array, np.array([len(array)]))


def test_a_table_with_views_is_taken_column_by_column():
    table = pa.table({"n": [1, 2, 3], "b": pa.array([b"a" * 20, b"b", None]).cast(pa.binary_view()),
                      "s": ["x", "y", "z"]})
    taken = take_table(table, np.array([2, 0, 0]))
    assert taken.schema == table.schema
    assert taken.to_pylist() == [table.to_pylist()[i] for i in (2, 0, 0)]
    only_views = take_table(table.select(["b"]), np.array([1]))
    assert only_views.num_rows == 1 and only_views.column("b").to_pylist() == [b"b"]



def test_a_column_parquet_mr_wrote_reads_as_views(spark, tmp_path):
    """Spark's parquet-mr (v1 pages with statistics, an optional column's RLE levels): the same
    values as pyarrow reads, as views, not declined."""
    from pyspark.sql.types import BinaryType, LongType, StructField, StructType

    values = [bytes([i % 256]) * (200 + 37 * i) for i in range(300)]
    schema = StructType([StructField("i", LongType(), False), StructField("b", BinaryType(), True)])
    frame = spark.createDataFrame([(i, bytearray(v)) for i, v in enumerate(values)], schema).coalesce(1)
    frame.write.option("compression", "none").option("parquet.enable.dictionary", "false").parquet(
        (tmp_path / "spark").as_uri())
    (path,) = sorted((tmp_path / "spark").glob("*.parquet"))
    arrays = _viewed(path, verify=True)
    assert arrays and all(a is not None for a in arrays)
    read = [v for a in arrays for v in a.to_pylist()]  # type: ignore[union-attr]
    assert read == pq.read_table(str(path), columns=["b"]).column("b").to_pylist()
    assert sorted(read) == sorted(values)
