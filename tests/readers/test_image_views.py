"""Readers decode images read as views of the memory-mapped file (store/_pages.py) to the
same values as images pyarrow copied: rows, shuffled rows (taken from views), batches, random
access; and the views are what they read, not a silent fallback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unihub import make_batch_reader, make_reader
from unihub.readers.random_access import Dataset
from unihub.schema.codecs import CompressedImageCodec
from unihub.schema.unischema import Unischema, UnischemaField
from unihub.store import _pages as parquet_pages
from unihub.store.writer import write_dataset

N = 300


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PNG and JPEG fields (one nullable, no nulls: definition levels), several row groups."""
    schema = Unischema("Views", [
        UnischemaField("id", np.int64, ()),
        UnischemaField("png", np.uint8, (16, 16, 3), CompressedImageCodec("png"), False),
        UnischemaField("jpeg", np.uint8, (16, 16), CompressedImageCodec("jpeg", quality=90), True),
    ])
    rng = np.random.default_rng(0)
    rows = ({"id": i, "png": rng.integers(0, 255, (16, 16, 3), dtype=np.uint8),
             "jpeg": rng.integers(0, 255, (16, 16), dtype=np.uint8)} for i in range(N))
    path = tmp_path_factory.mktemp("views") / "ds"
    write_dataset(path, schema, rows, row_group_size_mb=0.1)
    return path


@pytest.fixture
def viewed_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the columns read as views (in this process)."""
    read = parquet_pages.plain_binary_column
    made: list[int] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        array = read(*args, **kwargs)
        made.extend([] if array is None else [len(array)])
        return array

    monkeypatch.setattr(parquet_pages, "plain_binary_column", counting)
    return made


def _copied(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parquet_pages, "plain_binary_column", lambda *args, **kwargs: None)


def _by_id(rows: list[Any]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    return {int(r.id): (r.png, r.jpeg) for r in rows}


def _same(found: dict[int, Any], expected: dict[int, Any]) -> None:
    assert found.keys() == expected.keys() and len(found) == N
    for key, values in expected.items():
        for got, want in zip(found[key], values):
            assert got.dtype == want.dtype and np.array_equal(got, want)


OPTIONS = {
    "in order": {"shuffle_row_groups": False},
    "shuffled rows (taken from views)": {"shuffle_rows": True, "seed": 3},
    "decode tasks of a row group": {"shuffle_rows": True, "seed": 3, "workers_count": 2},
}


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_rows_decode_the_same_from_views(images, monkeypatch, viewed_reads, options):
    with make_reader(images, **options) as reader:
        viewed = _by_id(list(reader))
    assert sum(viewed_reads) == 2 * N  # both image fields of every row group came as views
    with monkeypatch.context() as patch:
        _copied(patch)
        with make_reader(images, **options) as reader:
            copied = _by_id(list(reader))
    _same(viewed, copied)


def test_batches_and_random_access_decode_the_same_from_views(images, monkeypatch, viewed_reads):
    with make_batch_reader(images, shuffle_row_groups=False) as reader:
        batches = [(b.id, b.png, b.jpeg) for b in reader]
    order = np.random.default_rng(1).permutation(N)
    taken = Dataset(images).take(order)
    assert sum(viewed_reads) == 4 * N
    _copied(monkeypatch)
    with make_batch_reader(images, shuffle_row_groups=False) as reader:
        for (ids, png, jpeg), b in zip(batches, reader, strict=True):
            assert np.array_equal(ids, b.id) and np.array_equal(png, b.png) and np.array_equal(jpeg, b.jpeg)
    copied = Dataset(images).take(order)
    for name in ("id", "png", "jpeg"):
        assert np.array_equal(getattr(taken, name), getattr(copied, name))


def test_images_not_decoded_are_not_read_as_views(images, viewed_reads):
    """``decode_images=False`` hands out the stored bytes: read as pyarrow reads them."""
    with make_reader(images, decode_images=False, shuffle_row_groups=False) as reader:
        first = next(iter(reader))
    assert isinstance(first.png, bytes) and viewed_reads == []


def test_a_read_parses_each_page_header_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checksums' walk hands the pages it parsed to the view of the image column: each page header is
    parsed once per read (Thrift in Python, under the GIL: twice was ~4% of a 64x64 JPEG epoch's GIL time)."""
    import pyarrow.parquet as pq

    from unihub.store.dataset import open_dataset

    schema = Unischema("Pages", [UnischemaField("id", np.int64, ()),
                                 UnischemaField("jpeg", np.uint8, (64, 64, 3), CompressedImageCodec("jpeg"), False)])
    rng = np.random.default_rng(1)
    write_dataset(tmp_path / "ds", schema, ({"id": i, "jpeg": rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)}
                                            for i in range(400)), row_group_size_mb=1)
    store = open_dataset(tmp_path / "ds")
    info = store.row_groups[0]
    metadata = pq.ParquetFile(info.path).metadata
    data = memoryview(open(info.path, "rb").read())
    group = metadata.row_group(info.row_group)
    pages = sum(len(list(parquet_pages.chunk_pages(data, *parquet_pages.chunk_span(group.column(leaf)),
                                                   group.column(leaf).num_values)))
                for leaf in range(metadata.num_columns))
    assert pages > 20
    parsed: list[int] = []  # the headers parsed in full, or read at a glance (Arrow's v1 layout)
    real, glance = parquet_pages.read_struct, parquet_pages._v1_header

    def counting(*args: Any) -> Any:
        parsed.append(args[1])
        return real(*args)

    def glancing(page: Any, position: int = 0) -> Any:
        found = glance(page, position)
        if found is not None:
            parsed.append(position)
        return found

    monkeypatch.setattr(parquet_pages, "read_struct", counting)
    monkeypatch.setattr(parquet_pages, "_v1_header", glancing)
    table = store.read_row_group(0, views=("jpeg",))
    assert str(table.schema.field("jpeg").type) == "binary_view"  # the view, not pyarrow's copy
    assert sorted(parsed) == sorted(set(parsed)) and len(parsed) == pages
    assert table.column("jpeg").to_pylist() == pq.read_table(info.path).column("jpeg").to_pylist()[:table.num_rows]
