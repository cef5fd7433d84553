"""Where the pages of a Parquet file lie, for the integrity tests (pyarrow does not expose them).

Pages are walked by unihub.store._pages.chunk_pages (headers parsed by
unihub.store._thrift): each column chunk runs from its dictionary (or first data) page for
``total_compressed_size`` bytes, and is a sequence of (PageHeader, page bytes); a header's
``compressed_page_size`` (field 3) gives the length of the bytes after it, ``crc`` (field 4) is the
checksum, and a v1 data page header (field 5) holds ``num_values`` (its field 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.parquet as pq

from unihub.store._pages import chunk_pages, chunk_span
from unihub.store._thrift import read_struct


@dataclass(frozen=True)
class Page:
    row_group: int
    column: str  # path in schema: "ragged.data.list.element"
    header: int  # offset of the page header in the file
    body: int  # offset of the page bytes (the CRC covers body .. end)
    end: int
    has_crc: bool
    num_values: int | None  # a data page's count (None for a dictionary page)
    num_values_at: int | None  # offset of the first byte of that count's varint


def pages(path: str) -> list[Page]:
    """Every page of the Parquet file at ``path``, in file order."""
    data = open(path, "rb").read()
    metadata = pq.read_metadata(path)
    found = []
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            column = group.column(c)
            for page in chunk_pages(data, *chunk_span(column), column.num_values):
                data_page = read_struct(data, page.header)[0].get(5)
                num_values = data_page[0].get(1) if data_page else None
                found.append(Page(g, column.path_in_schema, page.header, page.body, page.end, page.crc is not None,
                                  num_values[0] if num_values else None, num_values[1] if num_values else None))
    return found
