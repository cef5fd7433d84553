"""The offset index and one page read by store/page_index.py and store/_pages.py: what Arrow writes is
read as the page walker finds it; hostile bytes are a FormatError (a DataCorruptionError for a page
that fails its CRC), or a page declined, in time bounded by the bytes."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub.errors import DataCorruptionError, FormatError
from unihub.store import _pages, page_index
from unihub.store._pages import chunk_pages, chunk_span
from unihub.store._thrift import read_struct

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ = settings(max_examples=int(os.environ.get("UNIHUB_FUZZ_EXAMPLES", "60")) * 5, deadline=None, database=None,
                derandomize=not os.environ.get("UNIHUB_FUZZ_RANDOM"))
ROWS = 200


def write_file(path: Path, **options: Any) -> Path:
    rng = np.random.default_rng(0)
    blobs = [rng.integers(0, 256, int(rng.integers(0, 900)), dtype=np.uint8).tobytes() for _ in range(ROWS)]
    table = pa.table({"image": pa.array(blobs, pa.binary()), "id": pa.array(range(ROWS), pa.int64())})
    pq.write_table(table, path, row_group_size=ROWS // 2, compression={"image": "none", "id": "snappy"},
                   use_dictionary=["id"], write_page_index=True, write_page_checksum=True, data_page_size=2048,
                   write_batch_size=4, **options)
    return path


@pytest.fixture(scope="module")
def parquet_file(tmp_path_factory: Any) -> Path:
    return write_file(tmp_path_factory.mktemp("pages") / "f.parquet")


def footer_of(data: bytes) -> tuple[bytes, int]:
    length = struct.unpack("<i", data[-8:-4])[0]
    start = len(data) - 8 - length
    return data[start:start + length], start


def locations_of(path: Path) -> list[tuple[int, int, page_index.PageLocations]]:
    """(row group, leaf, its parsed offset index) for every column chunk of the file."""
    data = path.read_bytes()
    footer, start = footer_of(data)
    where = page_index.index_locations(footer, str(path), start)
    metadata = pq.read_metadata(path)
    found = []
    for g, columns in enumerate(where):
        for leaf, location in enumerate(columns):
            assert location is not None
            offset, length = location
            column = metadata.row_group(g).column(leaf)
            found.append((g, leaf, page_index.parse_offset_index(
                data[offset:offset + length], metadata.row_group(g).num_rows, chunk_span(column), str(path), offset)))
    return found


def test_the_offset_index_lists_the_pages_the_walker_finds(parquet_file: Path) -> None:
    data = parquet_file.read_bytes()
    metadata = pq.read_metadata(parquet_file)
    found = locations_of(parquet_file)
    assert len(found) == metadata.num_row_groups * metadata.num_columns
    for g, leaf, locations in found:
        column = metadata.row_group(g).column(leaf)
        pages = [p for p in chunk_pages(data, *chunk_span(column), column.num_values) if p.kind in (0, 3)]
        assert locations.offset_list == [p.header for p in pages]
        assert locations.size_list == [p.end - p.header for p in pages]
        counts = [p.num_values for p in pages]
        assert [locations.rows_in(k) for k in range(len(pages))] == counts
        assert locations.first_row_list == np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()


def test_each_page_of_values_is_read_as_pyarrow_reads_it(parquet_file: Path) -> None:
    data = memoryview(parquet_file.read_bytes())
    table = pq.read_table(parquet_file)
    images = table.column("image").to_pylist()
    for g, leaf, locations in locations_of(parquet_file):
        if leaf != 0:
            continue
        values = []
        for k, (offset, size) in enumerate(zip(locations.offset_list, locations.size_list)):
            page = data[offset:offset + size]
            assert _pages._v1_header(page) is not None  # Arrow's layout: the quick reading
            fields, body = read_struct(page, 0)
            quick = _pages._v1_header(page)
            assert quick[:4] == [fields[k][0] for k in (1, 2, 3, 4)] and quick[8] == body  # type: ignore[index]
            spans = _pages.page_value_spans(page, locations.rows_in(k), 1, True, "x")
            assert spans is not None
            values += [bytes(page[s:s + n]) for s, n in zip(*spans)]
        assert values == images[g * (ROWS // 2):(g + 1) * (ROWS // 2)]


def test_a_footer_of_more_than_10000_columns_or_row_groups_is_read(tmp_path: Path) -> None:
    """The footer's lists grow with its columns and row groups: Thrift's per-container limit of 10,000 refused a
    wide table's footer ('a footer this reader cannot parse'), and random access to it with it."""
    for name, table, rows_per_group in (
            ("wide", pa.table({f"c{i}": pa.array([b"x", b"yz"], pa.binary()) for i in range(10_001)}), 2),
            ("long", pa.table({"image": pa.array([b"v%d" % i for i in range(10_001)], pa.binary())}), 1)):
        path = tmp_path / f"{name}.parquet"
        pq.write_table(table, path, row_group_size=rows_per_group, compression="none", use_dictionary=False,
                       write_page_index=True, write_statistics=False)
        footer, start = footer_of(path.read_bytes())
        where = page_index.index_locations(footer, str(path), start)
        metadata = pq.read_metadata(path)
        assert (len(where), len(where[0])) == (metadata.num_row_groups, metadata.num_columns)
        assert all(location is not None for location in where[-1])


def test_compressed_pages_are_declined(tmp_path: Path) -> None:
    path = write_file(tmp_path / "f.parquet")
    path = tmp_path / "z.parquet"
    table = pq.read_table(tmp_path / "f.parquet")
    pq.write_table(table, path, compression="zstd", write_page_index=True, data_page_size=2048, write_batch_size=4)
    data = memoryview(path.read_bytes())
    _, _, locations = locations_of(path)[0]
    page = data[locations.offset_list[0]:locations.offset_list[0] + locations.size_list[0]]
    assert _pages.page_value_spans(page, locations.rows_in(0), 1, True, "x") is None


BAD_INDEXES = {
    "first row not 0": ([100, 200], [100, 100], [1, 5]),
    "rows not increasing": ([100, 200], [100, 100], [0, 0]),
    "a row past the group": ([100, 200], [100, 100], [0, 50]),
    "pages overlapping": ([100, 150], [100, 100], [0, 5]),
    "a page before the chunk": ([10, 200], [100, 100], [0, 5]),
    "a page past the chunk": ([100, 900], [100, 200], [0, 5]),
    "an empty page": ([100, 200], [0, 100], [0, 5]),
    "a negative offset": ([-5, 200], [100, 100], [0, 5]),
}


@pytest.mark.parametrize("name", sorted(BAD_INDEXES))
def test_an_offset_index_that_does_not_describe_its_chunk_is_refused(name: str) -> None:
    from tests.readers.test_random_access_pages import encode_offset_index

    encoded = encode_offset_index(*BAD_INDEXES[name])
    with pytest.raises(FormatError, match="f.parquet") as caught:
        page_index.parse_offset_index(encoded, 10, (50, 1000), "f.parquet", 1234)
    assert caught.value.offset == 1234 and caught.value.path == "f.parquet"


def test_hand_made_index_bytes() -> None:
    from tests.readers.test_random_access_pages import encode_offset_index

    good = encode_offset_index([100, 200], [100, 100], [0, 5])
    parsed = page_index.parse_offset_index(good, 10, (100, 300), "f", 0)
    assert parsed.offset_list == [100, 200] and parsed.rows_in(1) == 5
    many = encode_offset_index(list(range(100, 100 + 20 * 10, 10)), [10] * 20, list(range(20)))
    assert page_index.parse_offset_index(many, 20, (100, 300), "f", 0).rows_in(19) == 1  # a long list header
    for broken in (b"", good[:5], good[:-3], b"\x19\x1c\x00", b"\x29" + good[1:], good.replace(b"\x15", b"\x16", 1)):
        with pytest.raises(FormatError):
            page_index.parse_offset_index(broken, 10, (100, 300), "f", 0)
    with pytest.raises(FormatError, match="20 page locations"):  # more pages than rows
        page_index.parse_offset_index(many, 10, (100, 300), "f", 0)


def timed(call: Any) -> Any:
    start = time.perf_counter()
    try:
        return call()
    finally:
        assert time.perf_counter() - start < 1.0


@FUZZ
@given(data=st.binary(max_size=400), rows=st.integers(1, 50))
def test_fuzzed_offset_index_bytes_are_locations_or_a_named_error(data: bytes, rows: int) -> None:
    try:
        parsed = timed(lambda: page_index.parse_offset_index(data, rows, (0, 10_000), "f", 7))
    except FormatError as exc:
        assert exc.path == "f" and exc.offset == 7
        return
    assert parsed.first_row_list[0] == 0 and len(parsed.offset_list) <= rows


@FUZZ
@given(data=st.binary(max_size=400))
def test_fuzzed_footer_bytes_are_locations_or_a_named_error(data: bytes) -> None:
    try:
        timed(lambda: page_index.index_locations(data, "f", 9))
    except FormatError as exc:
        assert exc.path == "f" and exc.offset == 9


class RealPages:
    """The image pages of a file written once (not a fixture: hypothesis would print them whole)."""

    found: list[tuple[bytes, int]] = []

    @classmethod
    def get(cls, tmp_path_factory: Any) -> list[tuple[bytes, int]]:
        if not cls.found:
            path = write_file(tmp_path_factory.mktemp("real-pages") / "f.parquet")
            data = path.read_bytes()
            for _, leaf, locations in locations_of(path):
                if leaf == 0:
                    cls.found += [(data[o:o + s], locations.rows_in(k))
                                  for k, (o, s) in enumerate(zip(locations.offset_list, locations.size_list))]
        return cls.found


@pytest.fixture(scope="module")
def pages_of_a_file(tmp_path_factory: Any) -> None:
    RealPages.get(tmp_path_factory)


@FUZZ
@given(choice=st.integers(0, 10**6), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=4),
       cut=st.integers(0, 64))
@pytest.mark.usefixtures("pages_of_a_file")
def test_damaged_pages_are_values_declined_or_named_errors(choice: int, flips: list[tuple[int, int]], cut: int) -> None:
    """A real page with bytes flipped (mostly in its header) or cut short: its values, declined (None),
    a FormatError, or a DataCorruptionError where its CRC fails; never another error, never slowly."""
    real_pages = RealPages.found
    page, count = real_pages[choice % len(real_pages)]
    damaged = bytearray(page)
    for at, mask in flips:
        damaged[at % min(len(damaged), 48)] ^= mask
    damaged = damaged[:len(damaged) - cut] if cut < len(damaged) else damaged
    try:
        spans = timed(lambda: _pages.page_value_spans(memoryview(bytes(damaged)), count, 1, True, "f: a page"))
    except FormatError as exc:
        assert str(exc).startswith("f: a page")
        return
    if spans is not None:
        starts, lengths = spans
        assert len(starts) == count and all(0 <= s and s + n <= len(damaged) for s, n in zip(starts, lengths))


@pytest.mark.usefixtures("pages_of_a_file")
def test_a_page_failing_its_crc() -> None:
    page, count = RealPages.found[0]
    damaged = bytearray(page)
    damaged[-1] ^= 1
    with pytest.raises(DataCorruptionError, match="CRC"):
        _pages.page_value_spans(memoryview(bytes(damaged)), count, 1, True, "f")
    assert _pages.page_value_spans(memoryview(bytes(damaged)), count, 1, False, "f") is not None  # not verified


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=4),
       cut=st.integers(0, 8))
def test_damaged_offset_indexes_are_locations_or_named_errors(flips: list[tuple[int, int]], cut: int) -> None:
    from tests.readers.test_random_access_pages import encode_offset_index

    encoded = bytearray(encode_offset_index([100 + 300 * k for k in range(20)], [300] * 20, [5 * k for k in range(20)]))
    for at, mask in flips:
        encoded[at % len(encoded)] ^= mask
    data = bytes(encoded[:len(encoded) - cut])
    try:
        parsed = timed(lambda: page_index.parse_offset_index(data, 100, (100, 6100), "f", 3))
    except FormatError as exc:
        assert exc.path == "f" and exc.offset == 3
        return
    ends = [o + s for o, s in zip(parsed.offset_list, parsed.size_list)]
    assert parsed.first_row_list[0] == 0 and parsed.first_row_list == sorted(set(parsed.first_row_list))
    assert parsed.offset_list[0] >= 100 and ends[-1] <= 6100
    assert all(end <= nxt for end, nxt in zip(ends, parsed.offset_list[1:]))
