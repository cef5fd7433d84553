"""Per-field statistics, accumulated one row group at a time in bounded memory.

Each field gets one accumulator by kind: numbers (count, nulls, NaNs, min, max, mean, an exact
histogram and, for integers and booleans of few values, class counts), strings (class counts while
there are few distinct values, and a histogram of lengths), tensors (the distribution of shapes where
the field has ``None`` dims, and a histogram of the values) and images (null counts and encoded sizes:
images are decoded for the sampled rows alone, and their bytes are not read at all where the
field is not nullable or the Parquet footers count its nulls). Memory per field is a fixed number of bins and at most
:data:`MAX_CLASSES` distinct values, whatever the dataset's size.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from unihub.readers.decode import decode_column
from unihub.schema.codecs import CompressedImageCodec, ScalarCodec, column_as_array
from unihub.schema.unischema import UnischemaField

#: bins of a histogram
BINS = 24
#: distinct values counted as classes (more: the field is not a class field) and shapes listed
MAX_CLASSES = 32

Kind = Literal["number", "string", "tensor", "image", "other"]


class Histogram:
    """Exact counts in ``BINS`` equal bins whose width doubles (merging neighbours) when a value
    falls outside them, so the bins are known without a first pass over the data."""

    def __init__(self, bins: int = BINS, *, integer: bool = False) -> None:
        self.bins, self.integer = bins, integer
        self.lo = 0.0
        self.width = 0.0  # 0 until the first value
        self.counts = np.zeros(bins, dtype=np.int64)
        self.too_wide = False  # values apart by more than a float64 holds (-1e308 and 1e308): no bins

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64).ravel()
        values = values[np.isfinite(values)]
        if not values.size or self.too_wide:
            return
        low, high = float(values.min()), float(values.max())
        if self.width == 0:
            self.lo = np.floor(low) if self.integer else low
            span = (high - self.lo) or 1.0
            self.width = max(np.ceil((span + 1) / self.bins), 1.0) if self.integer else span / self.bins * (1 + 1e-9)
        while low < self.lo:  # grow to the left: the span doubles, pairs of bins merge
            self.lo -= self.width * self.bins
            self._merge(np.concatenate([np.zeros(self.bins, np.int64), self.counts]))
        while high >= self.lo + self.width * self.bins:
            self._merge(np.concatenate([self.counts, np.zeros(self.bins, np.int64)]))
        if not np.isfinite(self.lo + self.width * self.bins):  # the bins' edges overflowed
            self.too_wide, self.counts = True, np.zeros(self.bins, dtype=np.int64)
            return
        index = np.minimum(((values - self.lo) // self.width).astype(np.int64), self.bins - 1)
        self.counts += np.bincount(index, minlength=self.bins)

    def _merge(self, doubled: np.ndarray) -> None:
        self.counts = doubled.reshape(self.bins, 2).sum(axis=1)
        self.width *= 2

    def edges_and_counts(self) -> list[tuple[float, float, int]]:
        """``(low, high, count)`` of each bin from the first to the last non-empty one."""
        filled = np.flatnonzero(self.counts)
        if not filled.size:
            return []
        return [(self.lo + i * self.width, self.lo + (i + 1) * self.width, int(self.counts[i]))
                for i in range(int(filled[0]), int(filled[-1]) + 1)]


class ClassCounts:
    """Counts of distinct values while there are at most ``MAX_CLASSES``; after that, none."""

    def __init__(self) -> None:
        self.counts: Counter[Any] = Counter()
        self.too_many = False

    def add(self, array: pa.Array) -> None:
        if self.too_many:
            return
        valid = array.drop_null()
        if len(valid) > 4 * 1024 and len(pc.value_counts(valid.slice(0, 4 * 1024))) > MAX_CLASSES:
            self.too_many, self.counts = True, Counter()  # a cheap look at the head: ids, not classes
            return
        counted = pc.value_counts(valid)
        if len(counted) > MAX_CLASSES:  # decided before any value becomes a Python object
            self.too_many, self.counts = True, Counter()
            return
        for value, count in zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist()):
            self.counts[value] += count
        if len(self.counts) > MAX_CLASSES:
            self.too_many, self.counts = True, Counter()


@dataclass
class FieldStats:
    """What one field's values looked like over the rows read."""

    name: str
    kind: Kind
    rows: int = 0
    nulls: int | None = 0
    nans: int = 0
    minimum: float | None = None
    maximum: float | None = None
    total: float = 0.0
    counted: int = 0  # values behind minimum/maximum/total
    histogram: Histogram | None = None
    classes: ClassCounts | None = None
    lengths: Histogram | None = None
    shapes: Counter[tuple[int, ...]] = field(default_factory=Counter)
    more_shapes: bool = False

    @property
    def mean(self) -> float | None:
        return self.total / self.counted if self.counted else None

    def add_numbers(self, values: np.ndarray) -> None:
        """Numeric values (nulls already removed); NaNs are counted apart."""
        values = np.asarray(values).ravel()
        if values.dtype.kind == "f":
            nan = np.isnan(values)
            self.nans += int(nan.sum())
            values = values[~nan & np.isfinite(values)]
        if not values.size:
            return
        low, high = float(values.min()), float(values.max())
        self.minimum = low if self.minimum is None else min(self.minimum, low)
        self.maximum = high if self.maximum is None else max(self.maximum, high)
        self.total += float(values.sum(dtype=np.float64))
        self.counted += values.size
        if self.histogram is None:
            self.histogram = Histogram(integer=values.dtype.kind in "iub")
        self.histogram.add(values)

    def add_shapes(self, shapes: list[tuple[int, ...]]) -> None:
        self.shapes.update(shapes)
        if len(self.shapes) > MAX_CLASSES:  # keep the most common ones: the distribution's head
            self.shapes = Counter(dict(self.shapes.most_common(MAX_CLASSES)))
            self.more_shapes = True


def kind_of(f: UnischemaField, arrow_type: pa.DataType) -> Kind:
    """Which accumulator a field gets, from its codec, shape and stored Arrow type."""
    if isinstance(f.codec, CompressedImageCodec):
        return "image"
    if (f.codec is not None and not isinstance(f.codec, ScalarCodec)) or f.shape:
        return "tensor"
    if pa.types.is_dictionary(arrow_type):  # pandas' categoricals: counted by their values
        arrow_type = arrow_type.value_type
    if pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type) or pa.types.is_boolean(arrow_type):
        return "number"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "string"
    return "other"


class StatsAccumulator:
    """The statistics of ``fields``, fed one (filtered) row group at a time."""

    def __init__(self, fields: list[UnischemaField], arrow_schema: pa.Schema) -> None:
        self.fields = fields
        self.stats = {f.name: FieldStats(f.name, kind_of(f, _arrow_type(arrow_schema, f.name))) for f in fields}
        self.unread: dict[str, int | None] = {}  # image fields whose nulls the footers gave: not read

    @property
    def columns(self) -> list[str]:
        """The stored columns the statistics read: every field's but the images the footers described."""
        return [f.name for f in self.fields if f.name not in self.unread]

    def add(self, table: pa.Table) -> None:
        """Fold in the rows of ``table`` (the row group's :attr:`columns`, rows already filtered)."""
        for f in self.fields:
            stats = self.stats[f.name]
            stats.rows += table.num_rows
            if f.name in self.unread:
                continue
            column = column_as_array(table.column(f.name))
            if pa.types.is_dictionary(column.type) and stats.kind in ("number", "string"):
                column = column.dictionary_decode()
            stats.nulls = (stats.nulls or 0) + column.null_count
            if stats.kind == "image":  # the encoded sizes; nothing decoded
                _add_lengths(stats, pc.binary_length(column.drop_null()))
            elif stats.kind == "number":
                _add_number_column(stats, column)
            elif stats.kind == "string":
                _add_string_column(stats, column)
            elif stats.kind == "tensor":
                _add_tensor_column(stats, f, decode_column(f, column))

    def skip_image(self, name: str, nulls: int) -> None:
        """Take an image field's null count from the Parquet footers and leave its bytes unread."""
        self.unread[name] = nulls
        self.stats[name].nulls = nulls


def _arrow_type(schema: pa.Schema, name: str) -> pa.DataType:
    index = schema.get_field_index(name)
    return schema.field(index).type if index >= 0 else pa.null()


def _add_number_column(stats: FieldStats, column: pa.Array) -> None:
    valid = column.drop_null()
    if pa.types.is_boolean(valid.type) or pa.types.is_integer(valid.type):
        if stats.classes is None:
            stats.classes = ClassCounts()
        stats.classes.add(valid)
    stats.add_numbers(valid.to_numpy(zero_copy_only=False))


def _add_string_column(stats: FieldStats, column: pa.Array) -> None:
    valid = column.drop_null()
    if stats.classes is None:
        stats.classes = ClassCounts()
    stats.classes.add(valid)
    _add_lengths(stats, pc.utf8_length(valid))


def _add_lengths(stats: FieldStats, lengths: pa.Array) -> None:
    if stats.lengths is None:
        stats.lengths = Histogram(integer=True)
    stats.lengths.add(lengths.to_numpy(zero_copy_only=False))


def _add_tensor_column(stats: FieldStats, f: UnischemaField, values: Any) -> None:
    """Decoded tensors: their shapes where the field has ``None`` dims, and their values."""
    array = np.asarray(values) if not isinstance(values, np.ndarray) else values
    if array.dtype != object:  # one (n, *shape) array
        if array.dtype.kind in "iufb":
            stats.add_numbers(array)
        return
    present = [v for v in array if v is not None]
    if any(d is None for d in f.shape):
        stats.add_shapes([tuple(np.shape(v)) for v in present])
    numeric = [np.asarray(v).ravel() for v in present if np.asarray(v).dtype.kind in "iufb"]
    if numeric:
        stats.add_numbers(np.concatenate(numeric))
