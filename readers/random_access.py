"""Random access by global row index, through the row-group index: ``Dataset(url).take([i, j])``.

For samplers (torch's ``RandomSampler``, ``DistributedSampler``) and DALI's parallel
external source, which ask for rows by index. Indices are grouped by row group, each
row group is read once per call (only the requested rows are decoded), and results come
back in the order asked. An LRU of encoded row groups, bounded in bytes (``cache_mb``), makes
neighbouring lookups cheap, and a sampler's random indices over a dataset that fits in it read
each row group once, whatever the row groups' size.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from unihub.errors import InvalidArgumentError
from unihub.formats.arrow_numpy import int64_array
from unihub.formats.codecs import CompressedImageCodec, binary_views_at
from unihub.formats.parquet import ParquetStore, open_dataset
from unihub.formats.schema import Unischema
from unihub.readers.decode import DecodePolicy, decode_column, decode_images
from unihub.readers.reader import _resolve_fields


class Dataset:
    """Rows of a dataset by global index: ``len()``, ``ds[i]``, ``ds.take(indices)``.

    Encoded row groups read are kept up to ``cache_mb`` megabytes (the last one read always), and
    at most ``cached_row_groups`` of them where given (0: none kept).
    """

    def __init__(self, url: str | os.PathLike[str] | ParquetStore, schema_fields: Any = None, *,
                 decode_images: bool = True, cached_row_groups: int | None = None, cache_mb: float = 128,
                 storage_options: dict[str, Any] | None = None, filesystem: Any = None,
                 petastorm_types: bool | None = None) -> None:
        self.store = url if isinstance(url, ParquetStore) else open_dataset(
            url, storage_options=storage_options, filesystem=filesystem)
        self._policy = DecodePolicy.for_store(self.store.schema_source, petastorm_types, batched=True)
        fields, ngram = _resolve_fields(self.store.schema, schema_fields)
        if ngram is not None:
            raise TypeError("random access takes field names, not an NGram")
        self.schema = Unischema(self.store.schema.name, fields, attributes=self.store.schema.attribute_names)
        self.decode_images = decode_images
        self._row_type: type[Any] = self.schema._get_namedtuple()  # a namedtuple class made for the schema
        if cached_row_groups is not None and cached_row_groups < 0:
            raise InvalidArgumentError(f"cached_row_groups must be >= 0 or None, got {cached_row_groups}")
        if not cache_mb >= 0:
            raise InvalidArgumentError(f"cache_mb must be >= 0, got {cache_mb}")
        self._cache: OrderedDict[int, pa.Table] = OrderedDict()
        self._cache_size = cached_row_groups
        self._cache_bytes = int(cache_mb * 2**20)
        self._cached_bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.store.num_rows

    def __getitem__(self, index: int) -> Any:
        batch = self.take([index])
        return self._row_type._make(column[0] for column in batch)

    def take(self, indices: Sequence[int] | np.ndarray) -> Any:
        """A batch (namedtuple of column arrays) holding rows ``indices`` in the order given."""
        raw = np.asarray(indices)
        if raw.size and raw.dtype.kind not in "iu":  # 1.5 or True would silently become a row number
            raise TypeError(f"row indices must be integers, got {raw.dtype} values")
        idx = raw.astype(np.int64).ravel()
        n = self.store.num_rows
        idx = np.where(idx < 0, idx + n, idx)
        bad = idx[(idx < 0) | (idx >= n)]
        if bad.size:
            raise IndexError(f"row index {int(bad[0])} is out of range for a dataset of {n} rows")
        if not idx.size:
            return self._row_type(*(np.empty(0, dtype=f.dtype) for f in self.schema))
        offsets = self.store._offsets
        groups = np.searchsorted(offsets, idx, side="right") - 1
        # images to decode are gathered as views of the cached row groups' bytes, in the order
        # asked (Arrow's take would copy every image twice: per group, then into that order)
        images = {f.name for f in self.schema if self.decode_images and isinstance(f.codec, CompressedImageCodec)}
        rest = [f for f in self.schema if f.name not in images]
        blobs: dict[str, list[Any]] = {name: [None] * len(idx) for name in images}
        pieces: list[pa.Table] = []
        order: list[np.ndarray] = []
        for group in np.unique(groups):
            where = np.flatnonzero(groups == group)
            local = idx[where] - offsets[group]
            table = self._row_group(int(group))
            for name in images:
                gathered = blobs[name]
                for k, view in zip(where.tolist(), binary_views_at(table.column(name), local)):
                    gathered[k] = view
            if rest:
                pieces.append(table.select([f.name for f in rest]).take(int64_array(local)))
            order.append(where)
        decoded = dict(zip((f.name for f in rest), self._decode_in_order(rest, pieces, order))) if rest else {}
        for f in self.schema:
            if f.name in images:
                decoded[f.name] = decode_images(f, blobs[f.name], policy=self._policy)
        return self._row_type(*(decoded[f.name] for f in self.schema))

    def _decode_in_order(self, fields: list[Any], pieces: list[pa.Table], order: list[np.ndarray]) -> list[Any]:
        """``fields`` of the rows taken from each group (``pieces``, at positions ``order``) put in the
        order asked, then each column decoded once (a sampler's random batch touches most row groups:
        a decode per group cost ~2x more)."""
        positions = np.argsort(np.concatenate(order), kind="stable")
        try:
            table = pa.concat_tables(pieces).take(int64_array(positions)) if len(pieces) > 1 else pieces[0]
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # files that store a column differently: group by group
            decoded = [self._decode(fields, piece) for piece in pieces]
            return [_concat([d[i] for d in decoded])[positions] for i in range(len(fields))]
        return self._decode(fields, table)

    def _decode(self, fields: list[Any], table: pa.Table) -> list[Any]:
        return [decode_column(f, table.column(f.name), decode_images=self.decode_images, policy=self._policy)
                for f in fields]

    def _row_group(self, group: int) -> pa.Table:
        with self._lock:
            table = self._cache.get(group)
            if table is not None:
                self._cache.move_to_end(group)
                return table
        table = self.store.read_row_group(group, list(self.schema.fields))
        with self._lock:
            if group not in self._cache:
                self._cache[group] = table
                self._cached_bytes += table.nbytes
            while self._cache_is_over():
                _, dropped = self._cache.popitem(last=False)
                self._cached_bytes -= dropped.nbytes
        return table

    def _cache_is_over(self) -> bool:
        held = len(self._cache)
        if self._cache_size is not None and held > self._cache_size:
            return True
        return held > 1 and self._cached_bytes > self._cache_bytes


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    if len(parts) == 1:
        return parts[0]
    if all(p.dtype != object for p in parts) and len({p.shape[1:] for p in parts}) == 1:
        return np.concatenate(parts)
    out = np.empty(sum(len(p) for p in parts), dtype=object)
    for i, value in enumerate(value for part in parts for value in part):  # not out[:] = list: arrays would broadcast
        out[i] = value
    return out
