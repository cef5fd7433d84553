"""Files write_dataset writes carry Parquet's page index, and image columns in small pages, so one
image can be read without its row group (store/page_index.py); a restamped file keeps them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from unihub import write_dataset
from unihub.schema.codecs import CompressedImageCodec, ScalarCodec, TensorCodec
from unihub.schema.unischema import Unischema, UnischemaField
from unihub.store._pages import chunk_pages, chunk_span
from unihub.store.file_options import IMAGE_PAGE_BYTES, page_options
from unihub.store.writer import restamp_schema

SHAPE = (32, 32, 3)
SCHEMA = Unischema("Pages", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("image", np.uint8, SHAPE, CompressedImageCodec("png"), False),
    UnischemaField("vec", np.float32, (8,), TensorCodec(), False),
])


def rows(n: int) -> list[dict[str, object]]:
    rng = np.random.default_rng(0)
    return [{"id": i, "image": rng.integers(0, 256, SHAPE, dtype=np.uint8), "vec": rng.random(8, dtype=np.float32)}
            for i in range(n)]


def data_pages(path: Path, group: int, leaf: int) -> list[int]:
    """The sizes of a column chunk's data pages (header and bytes)."""
    data = path.read_bytes()
    column = pq.read_metadata(path).row_group(group).column(leaf)
    return [p.end - p.header for p in chunk_pages(data, *chunk_span(column), column.num_values) if p.kind in (0, 3)]


def check_pages(path: Path) -> None:
    metadata = pq.read_metadata(path)
    for g in range(metadata.num_row_groups):
        for c in range(metadata.num_columns):
            assert metadata.row_group(g).column(c).has_offset_index, (path, g, c)
    image = [metadata.schema.column(c).path for c in range(metadata.num_columns)].index("image")
    sizes = data_pages(path, 0, image)
    # a page is one batch of the images that fill IMAGE_PAGE_BYTES: about that size, a few images each
    assert len(sizes) > 3 and max(sizes) < 2 * IMAGE_PAGE_BYTES and np.median(sizes) > IMAGE_PAGE_BYTES / 2, sizes
    assert metadata.row_group(0).column(image).compression == "UNCOMPRESSED"


def test_write_dataset_writes_a_page_index_and_small_image_pages(tmp_path: Path) -> None:
    result = write_dataset(tmp_path / "ds", SCHEMA, rows(400), row_group_size_mb=1)
    for path in result.files:
        check_pages(Path(path))


def test_a_restamped_file_keeps_its_page_index(tmp_path: Path) -> None:
    result = write_dataset(tmp_path / "ds", SCHEMA, rows(300), row_group_size_mb=1)
    path = Path(result.files[0])
    assert restamp_schema(pafs.LocalFileSystem(), str(path), {b"unihub.test": b"1"})
    assert pq.read_metadata(path).metadata[b"unihub.test"] == b"1"
    check_pages(path)


def test_page_options() -> None:
    assert page_options(None) == {"write_page_index": True}  # no images: pyarrow's pages, with an index
    small = page_options(100)
    assert small["write_batch_size"] * 100 >= IMAGE_PAGE_BYTES and small["data_page_size"] < IMAGE_PAGE_BYTES
    assert page_options(10 * IMAGE_PAGE_BYTES)["write_batch_size"] == 1  # big images: one a page
    assert page_options(1)["write_batch_size"] == 1024  # tiny ones: Arrow's own batches
