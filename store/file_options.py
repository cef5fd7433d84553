"""Parquet writer options: the pages every unihub file is written with, and those of a file rewritten as it was.

Every file gets Parquet's page index (a cell is read by its page: store/page_index.py) and, where it holds
images, image pages of about :data:`IMAGE_PAGE_BYTES`. A file rewritten by a delete, a compaction or a new
schema stamp (store/versions.py, store/compaction.py, ``writer.restamp_schema``) keeps each column's
compression, dictionary use and page sizes: :func:`like`.
"""

from __future__ import annotations

from typing import Any

import pyarrow.parquet as pq

from unihub.errors import FormatError
from unihub.store import _footer

#: Parquet's page index is written in every file: a reader finds the page holding a row from a column
#: chunk's offset index (store/page_index.py), so ``Dataset.take`` reads one cell without its row group.
#: Where the schema has image columns, their pages hold about this many bytes (at least one image;
#: pyarrow's default is 1 MiB), see :func:`page_options` (the writer's
#: ``_DatasetWriter._page_options``). Chosen by
#: benchmarks/random_access.py (20,000 64x64 JPEGs, a random take over a cache a tenth of the dataset,
#: CPU per row, median of 2 rounds: 8 KiB 73.9 us, 16 KiB 73.5, 32 KiB 76.8, 64 KiB 99.7, the whole
#: dataset cached 42.4; of 5: 16 KiB 74.0 (71.1-76.7), 32 KiB 78.4 (76.8-79.8); the files 0.5%, 0.25%,
#: 0.14%, 0.07% larger than without an index). Smaller pages cost the writer more batches: 16 KiB wrote
#: those 20,000 rows with 0.087 s of CPU against 0.071 s without an index (+23%, 0.8 us a row).
IMAGE_PAGE_BYTES = 16 * 2**10


def page_options(image_bytes: float | None) -> dict[str, Any]:
    """ParquetWriter options: the page index, and where a file has image columns (``image_bytes``: the
    widest one's average value), image pages of about :data:`IMAGE_PAGE_BYTES`.

    Arrow closes a page once it holds ``data_page_size`` bytes, checked every ``write_batch_size``
    values (1,024 by default: a page of 1,024 images). Batches of as many images as fill
    :data:`IMAGE_PAGE_BYTES`, with pages closed at half of it, make an image page of one batch; other
    columns' batches stay as long (a batch of one value wrote numbers 5x slower) and their pages about
    half as big."""
    if image_bytes is None:
        return {"write_page_index": True}
    batch_rows = int(max(1, min(1024, -(-IMAGE_PAGE_BYTES // max(1, int(image_bytes))))))
    return {"write_page_index": True, "data_page_size": IMAGE_PAGE_BYTES // 2, "write_batch_size": batch_rows}


def like(parquet_file: pq.ParquetFile) -> dict[str, Any]:
    """ParquetWriter options that write a file as ``parquet_file`` was (from its first row group): each column's
    compression, dictionary use, and the page index with image pages where it stores plain, uncompressed bytes
    (images)."""
    compression: dict[str, str] = {}
    dictionary: list[str] = []
    plain_binary: list[float] = []  # image bytes: stored uncompressed, without a dictionary
    trouble = _footer.problem(parquet_file.metadata)
    if trouble is not None:
        raise FormatError(f"not a readable Parquet file: {trouble}")
    if parquet_file.metadata.num_row_groups:
        first = parquet_file.metadata.row_group(0)
        for j in range(first.num_columns):
            column = first.column(j)
            name = column.path_in_schema.split(".")[0]
            compression[name] = column.compression.lower() if column.compression != "UNCOMPRESSED" else "none"
            if any("DICTIONARY" in e for e in column.encodings):
                dictionary.append(name)
            elif compression[name] == "none" and column.physical_type == "BYTE_ARRAY" and first.num_rows:
                plain_binary.append(column.total_uncompressed_size / first.num_rows)
    return {"compression": compression or "snappy", "use_dictionary": dictionary,
            **page_options(max(plain_binary) if plain_binary else None)}
