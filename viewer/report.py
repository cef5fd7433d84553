"""Everything a report shows, gathered from a dataset: what ``unihub inspect`` says, the provenance,
the statistics and the decoded sample. Rendering is :mod:`unihub.viewer.html`'s job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.compute as pc

from unihub.errors import UnihubError
from unihub.images import decoders as images
from unihub.readers.filter_text import parse_filter
from unihub.readers.random_access import Dataset
from unihub.schema.codecs import CompressedImageCodec
from unihub.schema.unischema import UnischemaField
from unihub.store import _footer
from unihub.store.dataset import ParquetStore
from unihub.viewer.describe import describe_dataset
from unihub.viewer.sample import Sampling, scan
from unihub.viewer.stats import FieldStats, StatsAccumulator
from unihub.viewer.thumbs import data_uri

#: characters of a value shown under a thumbnail or in the sample table
VALUE_CHARS = 120


@dataclass(frozen=True)
class Thumb:
    """One image of a sampled row: its thumbnail URI, or why there is none."""

    field: str
    uri: str | None
    shape: tuple[int, ...] = ()
    problem: str | None = None


@dataclass(frozen=True)
class SampleRow:
    """One sampled row: its index in the dataset, its images and its other values as text."""

    index: int
    thumbs: tuple[Thumb, ...]
    values: tuple[tuple[str, str], ...]


@dataclass
class Report:
    """The gathered report of one dataset (see :func:`gather`)."""

    url: str
    description: dict[str, Any]
    provenance: dict[str, Any]
    row_group_rows: list[int]
    sampling: Sampling
    where: str | None
    matched: int
    stats: list[FieldStats]
    sample: list[SampleRow] = field(default_factory=list)
    image_fields: tuple[str, ...] = ()


def gather(store: ParquetStore, url: str, sampling: Sampling, *, where: str | pc.Expression | None = None,
           progress: Callable[[int, int], None] | None = None) -> Report:
    """Read ``store`` once for the statistics and the sample (rows matching ``where``), then decode
    the sampled rows."""
    expression: pc.Expression | None = None
    where_columns: tuple[str, ...] | None = ()
    if isinstance(where, str):
        expression, where_columns = parse_filter(where, list(store.schema.fields))
    elif where is not None:  # an expression built in Python: which fields it reads is not known
        expression, where_columns = where, None
    stats = StatsAccumulator(list(store.schema), store.stored_schema)
    images = tuple(f.name for f in store.schema if isinstance(f.codec, CompressedImageCodec))
    for f in store.schema:  # image bytes unread where the nulls are known without them
        if f.name in images:
            nulls = 0 if not f.nullable else _footer_nulls(store, f.name) if expression is None else None
            if nulls is not None:
                stats.skip_image(f.name, nulls)
    result = scan(store, stats, sampling, expression, where_columns, progress=progress)
    return Report(url=url, description=describe_dataset(url, store=store), provenance=store.extra_metadata,
                  row_group_rows=[rg.num_rows for rg in store.row_groups], sampling=sampling,
                  where=None if where is None else str(where), matched=result.matched,
                  stats=[stats.stats[f.name] for f in store.schema],
                  sample=sample_rows(store, result.indices), image_fields=images)


def sample_rows(store: ParquetStore, indices: np.ndarray) -> list[SampleRow]:
    """The rows ``indices`` decoded: image fields as thumbnails (a bad image as its reason), the
    rest as short text."""
    if not len(indices):
        return []
    # one row group at a time; unihub's types, whoever wrote the dataset: Petastorm's would show a null
    # as NaN and a nullable integer as a float (2**53 + 1 as 9007199254740992.0)
    batch = Dataset(store, decode_images=False, cached_row_groups=0, petastorm_types=False).take(indices)
    fields = list(store.schema)
    rows = []
    for i, index in enumerate(indices):
        thumbs, values = [], []
        for f, column in zip(fields, batch):
            if isinstance(f.codec, CompressedImageCodec):
                thumbs.append(_thumb(f, column[i]))
            else:
                values.append((f.name, value_text(column[i])))
        rows.append(SampleRow(int(index), tuple(thumbs), tuple(values)))
    return rows


def _thumb(f: UnischemaField, blob: Any) -> Thumb:
    if blob is None:
        return Thumb(f.name, None, problem="null")
    try:
        image = images.decode_image(blob)
        return Thumb(f.name, data_uri(image), tuple(image.shape))
    except (UnihubError, ValueError) as exc:  # one bad image is shown as such, not the end of the report
        return Thumb(f.name, None, problem=str(exc))


def value_text(value: Any) -> str:
    """A value in a few words: a scalar as itself, a tensor as its dtype and shape (and its values
    when there are few), bytes by their length."""
    if value is None:
        return "null"
    if isinstance(value, (bytes, bytearray)):
        text = f"{len(value)} bytes"
    elif isinstance(value, np.ndarray) and value.ndim > 0:
        head = f"{value.dtype} {tuple(value.shape)}"
        text = f"{head} {np.array2string(value, threshold=8, edgeitems=2)}" if value.size <= 8 else head
    elif isinstance(value, (np.floating, np.datetime64, np.timedelta64)):  # numpy's own text: .item() widens a
        text = str(value)  # float32 (0.1 -> 0.10000000149011612) and makes a datetime64[ns] an int
    else:
        text = str(value.item() if isinstance(value, np.generic) else value)
    return text if len(text) <= VALUE_CHARS else text[:VALUE_CHARS - 1] + "…"


def _footer_nulls(store: ParquetStore, name: str) -> int | None:
    """An unread column's nulls from the Parquet footers' statistics (None where a footer has none)."""
    import pyarrow.parquet as pq

    total = 0
    footers: dict[str, pq.FileMetaData] = store._footers  # noqa: SLF001 - read by open_dataset already
    for info in store.row_groups:
        footer = footers.get(info.path)
        if footer is None or _footer.problem(footer) is not None:
            return None
        group = footer.row_group(info.row_group)
        column = next((group.column(j) for j in range(group.num_columns)
                       if group.column(j).path_in_schema == name), None)
        if column is None or column.statistics is None or column.statistics.null_count is None:
            return None
        total += column.statistics.null_count
    return total
