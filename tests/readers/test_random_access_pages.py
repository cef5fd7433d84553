"""Random access through Parquet's page index: over a dataset larger than its cache, ``Dataset.take``
reads an image a page at a time (store/page_index.py), not a row group a row; values are those of
the row-group path, bit for bit; files without an offset index (Petastorm's, plain pyarrow's) take
the row-group path; damaged indexes and pages are named errors."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem

from unihub import write_dataset
from unihub.errors import DataCorruptionError, FormatError
from unihub.readers.random_access import Dataset
from unihub.schema.codecs import CompressedImageCodec, ScalarCodec
from unihub.schema.unischema import Unischema, UnischemaField
from unihub.store import page_index

N = 600
SHAPE = (24, 24, 3)
SCHEMA = Unischema("Paged", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("image", np.uint8, SHAPE, CompressedImageCodec("png"), False),
    UnischemaField("label", np.str_, (), ScalarCodec(pa.string()), False),
])
PETASTORM = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm" / "unischema"
TINY = 1e-6  # cache_mb: the last row group only


def make_row(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    return {"id": i, "image": rng.integers(0, 256, SHAPE, dtype=np.uint8), "label": f"l{i % 7}"}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: Any) -> Path:
    path = tmp_path_factory.mktemp("paged") / "ds"
    write_dataset(path, SCHEMA, (make_row(i) for i in range(N)), row_group_size_mb=0.25, rows_per_file=400)
    return path


def parquet_files(path: Path) -> list[Path]:
    return sorted(path.rglob("*.parquet"))


def assert_batches_equal(found: Any, expected: Any) -> None:
    for name in expected._fields:
        a, b = getattr(found, name), getattr(expected, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        if a.dtype == object:
            for x, y in zip(a, b):
                if isinstance(y, np.ndarray):
                    assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name
                else:
                    assert type(x) is type(y) and (x == y or (x is None and y is None)), name
        else:
            assert a.tobytes() == b.tobytes(), name


class CountingFS(LocalFileSystem):
    """A local fsspec filesystem counting the bytes read through it (a stand-in for a remote store)."""

    bytes_read = 0

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        handle = super()._open(path, mode, **kwargs)
        if "r" in mode:
            original = handle.read

            def read(size: int = -1) -> bytes:
                data = original(size)
                CountingFS.bytes_read += len(data)
                return data
            handle.read = read
        return handle


def test_files_carry_an_offset_index_and_small_image_pages(dataset: Path) -> None:
    for path in parquet_files(dataset):
        metadata = pq.read_metadata(path)
        assert metadata.num_row_groups >= 2
        for g in range(metadata.num_row_groups):
            group = metadata.row_group(g)
            for c in range(group.num_columns):
                assert group.column(c).has_offset_index, (path, g, c)
    ds = Dataset(dataset, cache_mb=TINY)
    assert ds.pages is not None and ds._paged == {"image"}
    chunk = ds.pages._chunk(0, "image")
    assert chunk is not None and len(chunk.locations.sizes) > 10  # pages of a few images, not one per group
    assert max(chunk.locations.size_list) < 3 * 16 * 2**10


def recording_row_group_reads(ds: Dataset) -> list[list[str]]:
    """The columns of each row-group read of ``ds`` from now on."""
    asked: list[list[str]] = []
    original = ds.store.read_row_group

    def read_row_group(index: int, columns: Any = None, **kwargs: Any) -> Any:
        asked.append(list(columns))
        return original(index, columns, **kwargs)
    ds.store.read_row_group = read_row_group  # type: ignore[method-assign]
    return asked


def test_take_reads_pages_not_row_groups(dataset: Path) -> None:
    """k random rows: at most k pages read (a ranged read each, or fewer where adjacent), the image
    column never read by row group; the row-group path reads a group's images for each row group."""
    rng = np.random.default_rng(1)
    for k in (8, 32):
        ds = Dataset(dataset, cache_mb=TINY)
        asked = recording_row_group_reads(ds)
        rows = rng.choice(N, size=k, replace=False)
        ds.take(rows)
        pages = ds.pages
        assert pages is not None and 0 < pages.pages_read <= k
        groups = len(ds.store.row_groups)
        files = len(ds.store.files)
        # the pages' reads, plus per file its footer's tail and footer, plus an offset index per group
        assert pages.reads <= k + 2 * files + groups
        assert all("image" not in columns for columns in asked) and asked
        assert pages.bytes_read <= k * 3 * 16 * 2**10 + 2 * sum(f.stat().st_size for f in parquet_files(dataset)) // 100


def test_page_bytes_read_through_the_filesystem(dataset: Path) -> None:
    """Through a filesystem that is not pyarrow's local one (as a remote store is reached), a take of k
    rows moves about k pages' bytes, far less than the row groups the rows lie in."""
    fs = CountingFS()
    paged = Dataset(str(dataset), cache_mb=TINY, filesystem=fs)
    rows = np.random.default_rng(2).choice(N, size=16, replace=False)
    paged.take(rows[:1])  # footers, offset indexes and the small columns' first group
    CountingFS.bytes_read = 0
    found = paged.take(rows)
    moved = CountingFS.bytes_read
    whole = Dataset(str(dataset), cache_mb=TINY, filesystem=fs)
    whole._paged, whole.pages = frozenset(), None  # the row-group path
    CountingFS.bytes_read = 0
    expected = whole.take(rows)
    assert_batches_equal(found, expected)
    assert moved * 4 < CountingFS.bytes_read, (moved, CountingFS.bytes_read)


def test_values_bit_exact_against_the_row_group_path(dataset: Path) -> None:
    paged = Dataset(dataset, cache_mb=TINY)
    cached = Dataset(dataset)  # the whole dataset fits: no pages
    assert cached.pages is None
    order = np.random.default_rng(3).permutation(N)
    for start in range(0, N, 64):
        rows = order[start:start + 64]
        assert_batches_equal(paged.take(rows), cached.take(rows))
    assert paged.pages is not None and paged.pages.pages_read > 0
    for i in (0, 1, N - 1, 399, 400):  # rows by themselves, at file and group ends
        assert_batches_equal(paged.take([i]), cached.take([i]))
    # the raw cells against pyarrow's reading of the row group
    store = paged.store
    for group in range(len(store.row_groups)):
        column = store.read_row_group(group, ["image"]).column("image").to_pylist()
        rows = np.arange(store.row_groups[group].num_rows)
        cells = paged.pages.cells(group, "image", rows)
        assert cells is not None and [bytes(c) for c in cells] == column


def test_decode_images_off_and_duplicates(dataset: Path) -> None:
    paged = Dataset(dataset, cache_mb=TINY)
    cached = Dataset(dataset)
    rows = [5, 5, 599, 0, 5, 300, -1]
    assert_batches_equal(paged.take(rows), cached.take(rows))
    raw = Dataset(dataset, cache_mb=TINY, decode_images=False)
    assert raw.pages is None  # encoded bytes: read with their row group
    assert list(raw.take([3]).image) == list(Dataset(dataset, decode_images=False).take([3]).image)


def rewrite(source: Path, target: Path, **options: Any) -> Path:
    """``source`` rewritten file by file by pyarrow with ``options`` (the schema metadata kept)."""
    shutil.copytree(source, target)
    for path in parquet_files(target):
        table = pq.read_table(path)
        rows = pq.read_metadata(path).row_group(0).num_rows
        pq.write_table(table, path, row_group_size=rows, **options)
    return target


@pytest.mark.parametrize("options", [
    {},  # plain pyarrow: no offset index
    {"write_page_index": True, "compression": "snappy"},  # an index, compressed pages
    {"write_page_index": True, "compression": "none", "use_dictionary": True},  # an index, a dictionary
], ids=["no-index", "compressed", "dictionary"])
def test_files_pages_cannot_serve_take_the_row_group_path(dataset: Path, tmp_path: Path, options: dict[str, Any]) -> None:
    other = rewrite(dataset, tmp_path / "ds", **options)
    paged = Dataset(other, cache_mb=TINY)
    rows = np.random.default_rng(4).choice(N, size=40, replace=False)
    assert_batches_equal(paged.take(rows), Dataset(dataset).take(rows))
    assert paged.pages is not None and paged.pages.pages_read == 0
    assert not any(paged.pages.takes(g, "image") for g in range(len(paged.store.row_groups)))


def test_petastorm_dataset_takes_the_row_group_path() -> None:
    small = Dataset(PETASTORM, cache_mb=TINY)
    whole = Dataset(PETASTORM)
    rows = list(range(len(whole)))[::-1]
    assert_batches_equal(small.take(rows), whole.take(rows))
    assert small.pages is None or small.pages.pages_read == 0


def test_pages_with_nulls_fall_back_to_the_row_group(tmp_path: Path) -> None:
    """A nullable image column: a page holding a null is declined, its chunk then read by row group."""
    schema = Unischema("Nullable", [
        UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("image", np.uint8, SHAPE, CompressedImageCodec("png"), True),
    ])
    rows = [{"id": i, "image": None if i % 50 == 7 else make_row(i)["image"]} for i in range(300)]
    write_dataset(tmp_path / "ds", schema, rows, row_group_size_mb=0.25)
    paged, whole = Dataset(tmp_path / "ds", cache_mb=TINY), Dataset(tmp_path / "ds")
    order = np.random.default_rng(5).permutation(300)
    for start in range(0, 300, 32):
        a, b = paged.take(order[start:start + 32]), whole.take(order[start:start + 32])
        assert list(a.id) == list(b.id)
        for x, y in zip(a.image, b.image):
            assert (x is None and y is None) or x.tobytes() == y.tobytes()


def damaged_copy(dataset: Path, tmp_path: Path) -> tuple[Path, Path, Dataset]:
    """A copy of the dataset, its first file, and a Dataset over it that has located its pages."""
    copy = tmp_path / "ds"
    shutil.copytree(dataset, copy)
    first = parquet_files(copy)[0]
    return copy, first, Dataset(copy, cache_mb=TINY)


def overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


def image_index(ds: Dataset, group: int) -> tuple[int, int]:
    pages = ds.pages
    assert pages is not None
    info = ds.store.row_groups[group]
    indexes = pages._file(info.path).indexes
    assert indexes is not None
    leaf = [pq.read_metadata(info.path).schema.column(c).path for c in range(3)].index("image")
    found = indexes[info.row_group][leaf]
    assert found is not None
    return found


@pytest.mark.parametrize("garbage", [b"\x00", b"\xff", b"\x19\x0c", b"\x19\xfc\xff\xff\xff\xff\x0f"])
def test_a_damaged_offset_index_is_a_named_error(dataset: Path, tmp_path: Path, garbage: bytes) -> None:
    copy, first, probe = damaged_copy(dataset, tmp_path)
    offset, length = image_index(probe, 0)
    overwrite(first, offset, (garbage * length)[:length])
    ds = Dataset(copy, cache_mb=TINY)
    with pytest.raises(FormatError) as caught:
        ds.take([0])
    assert str(first) in str(caught.value) and caught.value.path == str(first)
    assert f"byte {offset}" in str(caught.value)


def test_an_offset_index_that_points_elsewhere_is_a_named_error(dataset: Path, tmp_path: Path) -> None:
    """A well-formed index whose pages lie outside the chunk, or whose rows do not start at 0."""
    copy, first, probe = damaged_copy(dataset, tmp_path)
    offset, length = image_index(probe, 0)
    original = first.read_bytes()[offset:offset + length]
    parsed = page_index.parse_offset_index(original, probe.store.row_groups[0].num_rows, (0, 2**40), "x", 0)
    # the second page's first row set to the first's: same length (a one-byte varint 0 for the first
    # page stays), rows no longer increasing
    second_first = int(parsed.first_rows[1])
    encoded = encode_offset_index(parsed.offsets.tolist(), parsed.sizes.tolist(),
                                  [0, 0] + parsed.first_rows.tolist()[2:])
    assert second_first > 0 and len(encoded) <= length
    overwrite(first, offset, encoded + b"\x00" * (length - len(encoded)))
    ds = Dataset(copy, cache_mb=TINY)
    with pytest.raises(FormatError, match="does not describe its column chunk") as caught:
        ds.take([0])
    assert caught.value.path == str(first) and caught.value.offset == offset


def test_a_damaged_page_header_is_a_named_error(dataset: Path, tmp_path: Path) -> None:
    copy, first, probe = damaged_copy(dataset, tmp_path)
    chunk = probe.pages._chunk(0, "image")  # type: ignore[union-attr]
    assert chunk is not None
    page_at = chunk.locations.offset_list[0]
    overwrite(first, page_at, b"\x15\x00\x15\x02\x15\x04\x00")  # a header that claims a 2-byte page
    ds = Dataset(copy, cache_mb=TINY)
    with pytest.raises(FormatError) as caught:
        ds.take([0])
    assert str(first) in str(caught.value) and f"byte {page_at}" in str(caught.value)
    assert not isinstance(caught.value, DataCorruptionError)


def test_a_flipped_bit_in_a_page_is_a_data_corruption_error(dataset: Path, tmp_path: Path) -> None:
    copy, first, probe = damaged_copy(dataset, tmp_path)
    chunk = probe.pages._chunk(0, "image")  # type: ignore[union-attr]
    assert chunk is not None
    end = chunk.locations.offset_list[0] + chunk.locations.size_list[0]
    data = first.read_bytes()
    overwrite(first, end - 10, bytes([data[end - 10] ^ 0x04]))
    ds = Dataset(copy, cache_mb=TINY)
    with pytest.raises(DataCorruptionError, match="CRC") as caught:
        ds.take([0])
    assert str(first) in str(caught.value)


def test_torch_map_dataset_reads_pages(dataset: Path) -> None:
    torch = pytest.importorskip("torch")
    from unihub.bridges.torch import TorchMapDataset

    mapped = TorchMapDataset(str(dataset), cache_mb=TINY)
    loader = torch.utils.data.DataLoader(mapped, batch_size=50, shuffle=True, num_workers=0,
                                         generator=torch.Generator().manual_seed(0))
    whole = Dataset(dataset)
    seen = 0
    for batch in loader:
        ids = batch["id"].numpy()
        expected = whole.take(ids)
        assert batch["image"].numpy().tobytes() == expected.image.tobytes()
        seen += len(ids)
    assert seen == N and mapped._dataset.pages.pages_read > 0


def encode_offset_index(offsets: list[int], sizes: list[int], first_rows: list[int]) -> bytes:
    """An ``OffsetIndex`` in Thrift's compact protocol, as Arrow writes it."""
    def varint(value: int) -> bytes:
        out = bytearray()
        while True:
            byte = value & 0x7F
            value >>= 7
            if value:
                out.append(byte | 0x80)
            else:
                out.append(byte)
                return bytes(out)

    def zigzag(value: int) -> bytes:
        return varint((value << 1) ^ (value >> 63))

    n = len(offsets)
    out = bytearray(b"\x19")
    out += bytes([(n << 4) | 0x0C]) if n < 15 else b"\xfc" + varint(n)
    for offset, size, first in zip(offsets, sizes, first_rows):
        out += b"\x16" + zigzag(offset) + b"\x15" + zigzag(size) + b"\x16" + zigzag(first) + b"\x00"
    return bytes(out + b"\x00")


@pytest.mark.parametrize("kind", ["fsspec", "pyarrow"])
def test_take_on_s3_gets_a_range_per_page(s3_server: Any, dataset: Path, kind: str) -> None:
    """On an object store (moto's server), a take of k rows asks for about k ranges of images, each a
    page's bytes, besides the small columns' row groups; values as read locally."""
    pytest.importorskip("moto")
    import uuid

    prefix = f"paged-{uuid.uuid4().hex[:8]}"
    remote = Dataset(s3_server.upload_folder(dataset, prefix), cache_mb=TINY, **s3_server.access(kind))
    assert remote.pages is not None
    rows = np.random.default_rng(6).choice(N, size=24, replace=False)
    remote.take(rows[:1])  # footers, offset indexes, the first group's small columns
    s3_server.requests.clear()
    found = remote.take(rows)
    assert_batches_equal(found, Dataset(dataset).take(rows))
    gets = s3_server.requests.object_reads(prefix)
    groups = len(remote.store.row_groups)
    assert remote.pages.pages_read > 0 and len(gets) <= 24 + 3 * groups, gets
