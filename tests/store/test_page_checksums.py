"""Page checksums checked by unihub at memory speed (parquet_pages.checksums_pass, store/crc.py)
instead of by Arrow: the same pages as Arrow checks, the same verdict on every damaged page, and
Arrow's own check (and error) wherever the walk cannot vouch for a page.

Files are written by pyarrow itself in every page layout it writes (v1 and v2 data pages,
dictionaries, compression, nesting), and by Petastorm through Spark (parquet-mr, with checksums).
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
from unihub.store import _pages as parquet_pages
from unihub.store import crc
from unihub.store import dataset as parquet_module
from unihub.store.dataset import _leaves_by_name

from .parquet_pages import pages

ROWS = 600
PETASTORM = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm"


@pytest.fixture(autouse=True)
def walk_small_chunks(monkeypatch):
    """These files' chunks are small: the store walks them anyway, so that the walk is what is tested."""
    monkeypatch.setattr(parquet_module, "WALK_MIN_CHUNK_BYTES", 0)


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
    parquet_file = pq.ParquetFile(path)
    if name is None:
        return list(range(parquet_file.metadata.num_columns))
    return _leaves_by_name(parquet_file)[name]


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


def test_the_leaves_checked_for_a_name_hold_every_leaf_pyarrow_reads_for_it(written):
    parquet_file = pq.ParquetFile(written)
    by_name = _leaves_by_name(parquet_file)
    for name in [*parquet_file.schema_arrow.names, "point.x", "values.list", "tags.key_value.key", "a"]:
        assert set(parquet_file._get_column_indices([name])) <= set(by_name.get(name, ()))  # pyarrow's selection
    assert by_name["point"] == [5, 6] and by_name["tags"] == [7, 8] and by_name["a.b"] == [9]


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
    column_of = {metadata.schema.column(i).path: n for n in names for i in _leaves(written, n)}
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


OVERLAPS = {
    # a top-level name with a dot beside a nested field of that path: pyarrow reads both for it
    "a.b beside struct a": (pa.table({"a": pa.array([{"b": i, "c": i} for i in range(ROWS)]),
                                      "a.b": pa.array(np.arange(ROWS))}), ["a.b", "a", "a.c"]),
    "v.list beside list v": (pa.table({"v": pa.array([[i, i] for i in range(ROWS)]),
                                       "v.list": pa.array(np.arange(ROWS))}), ["v.list", "v"]),
    "m.key_value beside map m": (pa.table({"m": pa.array([[("k", i)] for i in range(ROWS)],
                                                         pa.map_(pa.string(), pa.int64())),
                                           "m.key_value": pa.array(np.arange(ROWS))}), ["m.key_value", "m"]),
}


@pytest.mark.parametrize("case", list(OVERLAPS), ids=list(OVERLAPS))
def test_a_damaged_leaf_behind_a_dotted_name_is_never_read_unchecked(case, tmp_path):
    """Every leaf damaged in turn, every name read: unihub refuses exactly where pyarrow's verified read
    does (before this walk named leaves by prefix, ``a.b`` checked its own leaf and read struct a's
    unchecked: 199 came back as 1099511627975)."""
    table, names = OVERLAPS[case]
    file = tmp_path / "part-0.parquet"
    pq.write_table(table, file, write_page_checksum=True, use_dictionary=False, compression="NONE")
    original = file.read_bytes()
    metadata = pq.read_metadata(file)
    for leaf in range(metadata.num_columns):
        chunk = metadata.row_group(0).column(leaf)
        damaged = bytearray(original)
        damaged[chunk.data_page_offset + chunk.total_compressed_size - 3] ^= 0x01  # in its last value
        file.write_bytes(damaged)
        for name in names:
            refused = _arrow_refuses(file, 0, name)
            store = open_dataset(tmp_path)  # a new store: nothing checked yet
            if refused:
                with pytest.raises(DataCorruptionError):
                    store.read_row_group(0, [name])
            else:
                assert store.read_row_group(0, [name]).equals(pq.ParquetFile(file).read_row_group(0, columns=[name]))
    file.write_bytes(original)


def test_a_nested_path_read_marks_only_what_it_checked(tmp_path, monkeypatch):
    """Reading ``p.x`` checks the leaf ``p.x`` and returns a column ``p``; a later read of ``p`` must
    still check ``p.y`` (it was counted as checked with the column ``p`` once)."""
    monkeypatch.delenv("UNIHUB_PAGE_CHECKSUMS", raising=False)  # "once", the default
    file = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"p": pa.array([{"x": i, "y": i} for i in range(ROWS)])}), file,
                   write_page_checksum=True, use_dictionary=False, compression="NONE")
    chunk = pq.read_metadata(file).row_group(0).column(1)  # leaf p.y
    damaged = bytearray(file.read_bytes())
    damaged[chunk.data_page_offset + chunk.total_compressed_size - 3] ^= 0x01
    file.write_bytes(damaged)
    store = open_dataset(tmp_path)
    assert store.read_row_group(0, ["p.x"]).column("p").to_pylist()[-1] == {"x": ROWS - 1}
    with pytest.raises(DataCorruptionError, match="column 'p'"):
        store.read_row_group(0, ["p"])


def test_a_nested_path_of_a_struct_of_lists_reads_without_a_false_count_error(tmp_path):
    """``p.x`` of a struct of two lists comes back as a column ``p`` holding ``x`` only: its values
    are not counted against ``p.y``'s chunk (they were, and a healthy file was refused)."""
    table = pa.table({"p": pa.array([{"x": [1, 2, 3], "y": [i]} for i in range(ROWS)])})
    pq.write_table(table, tmp_path / "part-0.parquet", write_page_checksum=True)
    store = open_dataset(tmp_path)
    assert store.read_row_group(0, ["p.x"]).column("p").to_pylist()[0] == {"x": [1, 2, 3]}
    assert store.read_row_group(0, ["p"]).equals(table)


def test_row_groups_of_small_chunks_are_left_to_arrows_check(tmp_path, monkeypatch):
    """Where a row group's chunks average under WALK_MIN_CHUNK_BYTES (a wide table of small columns),
    the walk would cost more than Arrow's CRC: Arrow checks, and a damaged page is still named."""
    monkeypatch.setattr(parquet_module, "WALK_MIN_CHUNK_BYTES", 64 * 2**10)
    calls: list[bool] = []
    real = parquet_pages.checksums_pass
    monkeypatch.setattr(parquet_pages, "checksums_pass", lambda *args: calls.append(real(*args)) or calls[-1])
    rng = np.random.default_rng(5)
    wide = pa.table({f"c{i}": rng.random(2_000, dtype=np.float32) for i in range(50)})  # 8 KB chunks
    narrow = pa.table({"blob": [rng.bytes(4_000) for _ in range(2_000)]})  # one 8 MB chunk
    for name, table in (("wide", wide), ("narrow", narrow)):
        (tmp_path / name).mkdir()
        pq.write_table(table, tmp_path / name / "part-0.parquet", write_page_checksum=True)
    store = open_dataset(tmp_path / "wide")
    assert store.read_row_group(0).equals(wide)
    assert calls == [] and True in store._open.files  # Arrow checked
    store = open_dataset(tmp_path / "narrow")
    assert store.read_row_group(0).equals(narrow)
    assert calls == [True] and True not in store._open.files  # walked
    file = tmp_path / "wide" / "part-0.parquet"
    page = next(p for p in pages(str(file)) if p.column == "c7")
    damaged = bytearray(file.read_bytes())
    damaged[(page.body + page.end) // 2] ^= 0x04
    file.write_bytes(damaged)
    with pytest.raises(DataCorruptionError, match="column 'c7'"):
        open_dataset(tmp_path / "wide").read_row_group(0)
