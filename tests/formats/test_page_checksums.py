"""Page checksums checked by unihub at memory speed (parquet_pages.checksums_pass, formats/crc.py)
instead of by Arrow: the same pages as Arrow checks, the same verdict on every damaged page, and
Arrow's own check (and error) wherever the walk cannot vouch for a page.

Files are written by pyarrow itself in every page layout it writes (v1 and v2 data pages,
dictionaries, compression, nesting), and by Petastorm (no checksums).
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub import open_dataset
from unihub.errors import DataCorruptionError
from unihub.formats import crc, parquet_pages
from unihub.formats.parquet import _leaf_ranges

from .parquet_pages import pages

ROWS = 600
PETASTORM = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm"


def _table() -> pa.Table:
    rng = np.random.default_rng(7)
    lists = [rng.random(i % 4).astype(np.float32).tolist() if i % 9 else None for i in range(ROWS)]
    return pa.table({
        "id": pa.array(np.arange(ROWS, dtype=np.int64)),
        "word": pa.array([f"w{i % 13}" if i % 5 else None for i in range(ROWS)]),  # dictionary-friendly
        "blob": pa.array([rng.bytes(40 + i % 30) for i in range(ROWS)]),
        "vec": pa.array([rng.bytes(24) for _ in range(ROWS)], pa.binary(24)),
        "values": pa.array(lists, pa.list_(pa.float32())),
        "point": pa.array([{"x": float(i), "tag": f"t{i % 3}"} for i in range(ROWS)]),
        "tags": pa.array([[(f"k{i % 4}", i)] for i in range(ROWS)], pa.map_(pa.string(), pa.int64())),
        "a.b": pa.array(np.arange(ROWS, dtype=np.int32)),  # a dot in a top-level name
    })


LAYOUTS = {
    "v1 plain uncompressed": dict(data_page_version="1.0", compression="NONE", use_dictionary=False),
    "v1 dictionary snappy": dict(data_page_version="1.0", compression="SNAPPY", use_dictionary=True),
    "v2 plain zstd": dict(data_page_version="2.0", compression="ZSTD", use_dictionary=False),
    "v2 dictionary uncompressed": dict(data_page_version="2.0", compression="NONE", use_dictionary=True),
}


@pytest.fixture(params=list(LAYOUTS), ids=list(LAYOUTS))
def written(request, tmp_path) -> Path:
    """A file pyarrow wrote with a CRC in every page, small pages (several per chunk), 3 row groups."""
    (tmp_path / request.param).mkdir()
    path = tmp_path / request.param / "data.parquet"
    pq.write_table(_table(), path, row_group_size=ROWS // 3, data_page_size=256, write_page_checksum=True,
                   **LAYOUTS[request.param])
    return path


def written_layout(path: Path) -> dict[str, object]:
    return LAYOUTS[path.parent.name]


def _leaves(path: Path, name: str | None = None) -> list[int]:
    ranges = _leaf_ranges(pq.ParquetFile(path))
    picked = ranges.values() if name is None else [ranges[name]]
    return [leaf for first, count in picked for leaf in range(first, first + count)]


def _arrow_refuses(path: Path, row_group: int, column: str) -> bool:
    try:
        pq.ParquetFile(path, page_checksum_verification=True).read_row_group(row_group, columns=[column])
    except OSError as exc:
        assert "CRC checksum verification failed" in str(exc)
        return True
    return False


def test_crc32_is_zlibs():
    data = os.urandom(100_003)
    view = memoryview(data)
    for start, end in [(0, 0), (0, 1), (3, 99_001), (0, len(data))]:
        assert crc.crc32(view[start:end]) == zlib.crc32(data[start:end])
    assert crc.IMPLEMENTATION == "isal"  # a dependency: the fast one is what runs here


def test_leaf_ranges_follow_the_files_leaves(written):
    parquet_file = pq.ParquetFile(written)
    ranges = _leaf_ranges(parquet_file)
    assert list(ranges) == parquet_file.schema_arrow.names
    paths = [parquet_file.metadata.schema.column(i).path for i in range(parquet_file.metadata.num_columns)]
    for name, (first, count) in ranges.items():
        assert all(p == name or p.startswith(name + ".") for p in paths[first:first + count])
    assert sum(count for _, count in ranges.values()) == len(paths)
    assert ranges["point"][1] == 2 and ranges["tags"][1] == 2 and ranges["a.b"][1] == 1


def test_every_damaged_page_fails_here_as_it_fails_in_arrow(written):
    """A flipped bit in any page's bytes (what its CRC covers) fails the check of its column, as
    Arrow's verified read of that column fails; the other columns of the group still pass."""
    original = written.read_bytes()
    metadata = pq.read_metadata(written)
    found = pages(str(written))
    assert len(found) > 3 * metadata.num_columns  # several pages a chunk
    chunks = [metadata.row_group(g).column(c) for g in range(metadata.num_row_groups)
              for c in range(metadata.num_columns)]
    kinds = {page.kind for chunk in chunks
             for page in parquet_pages.chunk_pages(original, *parquet_pages.chunk_span(chunk), chunk.num_values)}
    dictionary = written_layout(written)["use_dictionary"]
    assert kinds == ({2} if dictionary else set()) | {0 if written_layout(written)["data_page_version"] == "1.0" else 3}
    names = pq.ParquetFile(written).schema_arrow.names
    column_of = {metadata.schema.column(i).path: n for n in names for i in range(metadata.num_columns)
                 if i in _leaves(written, n)}
    assert parquet_pages.checksums_pass(memoryview(original), metadata, 0, _leaves(written))
    rng = np.random.default_rng(3)
    for page in found:
        assert page.has_crc
        damaged = bytearray(original)
        damaged[int(rng.integers(page.body, page.end))] ^= 1 << int(rng.integers(8))
        written.write_bytes(damaged)
        name = column_of[page.column]
        assert not parquet_pages.checksums_pass(memoryview(damaged), metadata, page.row_group, _leaves(written, name))
        assert _arrow_refuses(written, page.row_group, name)
        others = [leaf for n in names if n != name for leaf in _leaves(written, n)]
        assert parquet_pages.checksums_pass(memoryview(damaged), metadata, page.row_group, others)
    written.write_bytes(original)


def test_no_mutation_lets_a_page_arrow_refuses_through(written):
    """Random bytes changed anywhere in the column chunks (headers included): where the check passes,
    Arrow's verified read finds no damaged page either, and reads what the unverified read reads."""
    original = written.read_bytes()
    metadata = pq.read_metadata(written)
    spans = [parquet_pages.chunk_span(metadata.row_group(g).column(c))
             for g in range(metadata.num_row_groups) for c in range(metadata.num_columns)]
    rng = np.random.default_rng(11)
    passed = 0
    for _ in range(150):
        g = int(rng.integers(metadata.num_row_groups))
        start, end = spans[g * metadata.num_columns + int(rng.integers(metadata.num_columns))]
        damaged = bytearray(original)
        for offset in rng.integers(start, end, int(rng.integers(1, 4))):
            damaged[int(offset)] = int(rng.integers(256))
        if not parquet_pages.checksums_pass(memoryview(damaged), metadata, g, _leaves(written)):
            continue
        passed += 1
        written.write_bytes(damaged)
        try:
            checked = pq.ParquetFile(written, page_checksum_verification=True).read_row_group(g)
        except OSError as exc:
            assert "CRC checksum verification failed" not in str(exc), "a damaged page passed the check"
            continue  # a header Arrow cannot read: the read fails either way
        assert checked.equals(pq.ParquetFile(written).read_row_group(g))
    written.write_bytes(original)
    assert passed  # some mutations leave the pages intact (a byte changed to itself, an unread field)


def test_a_local_read_checks_pages_here_and_arrow_only_where_this_declines(tmp_path, monkeypatch):
    path = tmp_path / "ds"
    path.mkdir()
    pq.write_table(_table(), path / "part-0.parquet", row_group_size=ROWS // 3, write_page_checksum=True)
    calls: list[bool] = []
    real = parquet_pages.checksums_pass

    def counted(*args, **kwargs):
        calls.append(real(*args, **kwargs))
        return calls[-1]

    monkeypatch.setattr(parquet_pages, "checksums_pass", counted)
    store = open_dataset(path)
    tables = [store.read_row_group(g) for g in range(3)]
    assert calls == [True] * 3
    assert True not in store._open.files  # Arrow was never asked to check
    assert pa.concat_tables(tables).select(_table().column_names).equals(_table())

    monkeypatch.setattr(parquet_pages, "checksums_pass", lambda *args: False)  # e.g. a header it cannot parse
    store = open_dataset(path)
    assert pa.concat_tables([store.read_row_group(g) for g in range(3)]).select(_table().column_names) \
        .equals(_table())
    assert True in store._open.files


def test_a_damaged_page_is_named_by_column_when_read(tmp_path):
    path = tmp_path / "ds"
    path.mkdir()
    file = path / "part-0.parquet"
    pq.write_table(_table(), file, row_group_size=ROWS // 3, write_page_checksum=True, data_page_size=256)
    page = next(p for p in pages(str(file)) if p.row_group == 1 and p.column.startswith("point."))
    damaged = bytearray(file.read_bytes())
    damaged[(page.body + page.end) // 2] ^= 0x10
    file.write_bytes(damaged)
    store = open_dataset(path)
    assert store.read_row_group(1, ["id", "a.b", "tags"]).num_rows == ROWS // 3  # the damage is elsewhere
    with pytest.raises(DataCorruptionError, match="row group 1, column 'point'") as caught:
        store.read_row_group(1)
    assert caught.value.column == "point" and caught.value.path == str(file)


def test_files_petastorm_and_spark_wrote_pass_as_they_pass_in_arrow():
    """Petastorm's fixtures (Spark's parquet-mr writes a CRC in its pages, as it is set here) pass the
    check, and every page that has a CRC was checked: changing one byte of any fails it."""
    files = sorted(PETASTORM.rglob("*.parquet"))
    with_crc = 0
    for file in files:
        metadata = pq.read_metadata(file)
        data = file.read_bytes()
        for g in range(metadata.num_row_groups):
            assert parquet_pages.checksums_pass(memoryview(data), metadata, g, range(metadata.num_columns))
            pq.ParquetFile(file, page_checksum_verification=True).read_row_group(g)
        for page in pages(str(file)):
            if page.has_crc and page.end > page.body:
                with_crc += 1
                damaged = bytearray(data)
                damaged[page.body] ^= 0x01
                assert not parquet_pages.checksums_pass(memoryview(damaged), metadata, page.row_group,
                                                        range(metadata.num_columns))
    assert len(files) >= 4 and with_crc > 10
