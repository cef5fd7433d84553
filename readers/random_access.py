"""Random access by global row index, through the row-group index: ``Dataset(url).take([i, j])``.

For samplers (torch's ``RandomSampler``, ``DistributedSampler``) and DALI's parallel
external source, which ask for rows by index. Indices are grouped by row group, each
row group is read once per call (only the requested rows are decoded), and results come
back in the order asked. An LRU of encoded row groups, bounded in bytes (``cache_mb``, by default
the memory budget: ``UNIHUB_MEMORY_MB``, 512 MB), makes neighbouring lookups cheap, and a
sampler's random indices over a dataset that fits in it read each row group once, whatever the
row groups' size.

Over a dataset larger than the cache, image columns are read a page at a time instead, where the
file carries Parquet's offset index and keeps them in ``PLAIN`` uncompressed pages (what
``write_dataset`` writes; store/page_index.py): a random row costs one small ranged read of its
image, not a row group. The other columns are read by row group and cached, as before (they are
small); files without an offset index (Petastorm's, plain Parquet, unihub's before it wrote one)
are read by row group whole.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from unihub.errors import CodecError, InvalidArgumentError
from unihub.readers.decode import (
    DecodePolicy,
    decode_column,
    decode_images,
    decoded_images,
    numpy_strings_in_rows,
)
from unihub.readers.loader import located
from unihub.readers.reader import resolve_fields
from unihub.runtime.memory import memory_budget
from unihub.schema.arrow_numpy import fixed_width_cells, from_fixed_width_cells, int64_array, joined_dtype
from unihub.schema.codecs import BinaryCells, CompressedImageCodec, Spans, spans_at
from unihub.schema.unischema import Unischema
from unihub.store.dataset import ParquetStore, open_dataset
from unihub.store.page_index import PageReader


class Dataset:
    """Rows of a dataset by global index: ``len()``, ``ds[i]``, ``ds.take(indices)``.

    Encoded row groups read are kept up to ``cache_mb`` megabytes (the last one read always), and
    at most ``cached_row_groups`` of them where given (0: none kept). ``cache_mb=None`` is the memory
    budget (:func:`~unihub.runtime.memory.memory_budget`: ``UNIHUB_MEMORY_MB``, 512 MB by default):
    over a dataset larger than that, image columns are read page by page where the files have an
    offset index (see the module docstring): a random sampler then reads a small page per image,
    not a row group (files without one: a whole row group for most rows it asks for).
    """

    def __init__(self, url: str | os.PathLike[str] | ParquetStore, schema_fields: Any = None, *,
                 decode_images: bool = True, cached_row_groups: int | None = None, cache_mb: float | None = None,
                 storage_options: dict[str, Any] | None = None, filesystem: Any = None,
                 petastorm_types: bool | None = None) -> None:
        self.store = url if isinstance(url, ParquetStore) else open_dataset(
            url, storage_options=storage_options, filesystem=filesystem)
        self._policy = DecodePolicy.for_store(self.store.schema_source, petastorm_types, batched=True)
        fields, ngram = resolve_fields(self.store.schema, schema_fields)
        if ngram is not None:
            raise TypeError("random access takes field names, not an NGram")
        self.schema = Unischema(self.store.schema.name, fields, attributes=self.store.schema.attribute_names)
        self.decode_images = decode_images
        self._row_type: type[Any] = self.schema._get_namedtuple()  # a namedtuple class made for the schema
        if cached_row_groups is not None and cached_row_groups < 0:
            raise InvalidArgumentError(f"cached_row_groups must be >= 0 or None, got {cached_row_groups}")
        if cache_mb is not None and not cache_mb >= 0:
            raise InvalidArgumentError(f"cache_mb must be >= 0, got {cache_mb}")
        self._cache: OrderedDict[int, _CachedGroup] = OrderedDict()
        self._cache_size = cached_row_groups
        self._cache_bytes = memory_budget().total_bytes if cache_mb is None else int(cache_mb * 2**20)
        self._cached_bytes = 0
        self._lock = threading.Lock()
        #: every row group cached: the whole dataset's cells (see _whole_dataset); refused: cannot be
        self._whole: _WholeDataset | None = None
        self._whole_refused = False
        #: image fields read page by page (where a row group's chunk allows), when the cache cannot hold the dataset
        self._paged = self._page_fields()
        self.pages: PageReader | None = PageReader(self.store) if self._paged else None

    def _page_fields(self) -> frozenset[str]:
        """The image fields worth reading by page: the cache cannot hold every row group (the store's
        bytes on disk or in memory pass ``cache_mb``, or ``cached_row_groups`` is fewer)."""
        groups = self.store.row_groups
        total = max(self.store.total_bytes, sum(rg.total_byte_size for rg in groups))
        if total <= self._cache_bytes and (self._cache_size is None or self._cache_size >= len(groups)):
            return frozenset()
        return frozenset(f.name for f in self.schema if self.decode_images and isinstance(f.codec, CompressedImageCodec)
                         and f.name not in self.store.partition_names)

    def __len__(self) -> int:
        return self.store.num_rows

    def __getitem__(self, index: int) -> Any:
        batch = self.take([index])
        return self._row_type._make(
            np.str_(column[0]) if column[0] is not None and numpy_strings_in_rows(f, self._policy) else column[0]
            for f, column in zip(self.schema, batch))  # a row's strings as make_reader's (readers/decode.py)

    def take(self, indices: Sequence[int] | np.ndarray, into: Mapping[str, np.ndarray] | None = None) -> Any:
        """A batch (namedtuple of column arrays) holding rows ``indices`` in the order given.

        A column is decoded or copied into the array ``into`` names it with, where that array has
        the column's shape and dtype, and that array is returned (a torch worker's shared memory:
        the batch leaves the worker without another copy); otherwise the column is new memory.
        Arrays given for two fields must not share memory.
        """
        idx = self._checked_indices(indices)
        if not idx.size:
            return self._row_type(*(self._empty_column(f) for f in self.schema))
        _check_apart(into)
        try:
            return self._take(idx, into)
        except CodecError as exc:  # a codec counts the rows asked: the file, row group and row named instead
            raise self._located(exc, idx) from exc

    def _located(self, exc: CodecError, idx: np.ndarray) -> CodecError:
        """``exc`` of the ``exc.row``-th row asked (``idx``) with its file, row group and row named."""
        if exc.row is None or not 0 <= exc.row < len(idx):
            return exc
        offsets = self.store._offsets
        group = int(np.searchsorted(offsets, idx[exc.row], side="right") - 1)
        return located(exc, self.store.row_groups[group], idx - offsets[group])

    def _take(self, idx: np.ndarray, into: Mapping[str, np.ndarray] | None) -> Any:
        """:meth:`take` of checked row numbers."""
        whole = self._whole_dataset()
        if whole is not None and not self._paged:
            return self._row_type(*(_copied_into(self._from_whole(whole, f, idx, into), into.get(f.name) if into else None)
                                    for f in self.schema))
        parts, in_order = self._parts(idx)
        if whole is not None:  # the fields not read by page, gathered at once; the paged ones part by part
            decoded = {f.name: self._from_whole(whole, f, idx, into) for f in self.schema if f.name not in self._paged}
            decoded.update(self._decoded_parts(parts, in_order, into, [f for f in self.schema if f.name in self._paged]))
        else:
            decoded = self._decoded_parts(parts, in_order, into, list(self.schema))
        return self._row_type(*(_copied_into(decoded[f.name], into.get(f.name) if into else None)
                                for f in self.schema))

    def _empty_column(self, f: Any) -> np.ndarray:
        """Field ``f``'s column of no rows, shaped as a column of rows is: ``(0, *shape)`` for a fixed shape
        (``(0,)`` for a field of any other, and for images left encoded: their bytes)."""
        encoded = isinstance(f.codec, CompressedImageCodec) and not self.decode_images
        if f.is_fixed_shape and f.dtype != object and not encoded:
            return np.empty((0, *f.shape), dtype=f.dtype)
        return np.empty(0, dtype=object if encoded else f.dtype)

    def _checked_indices(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """``indices`` as int64 row numbers, negative ones counted from the end; refuses what is not a row."""
        raw = np.asarray(indices)
        if raw.size and raw.dtype.kind not in "iu":  # 1.5 or True would silently become a row number
            raise TypeError(f"row indices must be integers, got {raw.dtype} values")
        n = self.store.num_rows
        if raw.dtype.kind == "u" and raw.size and raw.max() >= n:  # a cast to int64 would wrap 2**64 - 1 to -1
            raise IndexError(f"row index {int(raw.max())} is out of range for a dataset of {n} rows")
        given = raw.astype(np.int64).ravel()
        idx = np.where(given < 0, given + n, given)
        bad = given[(idx < 0) | (idx >= n)]  # named as given: -n - 1 is out of range, not -1
        if bad.size:
            raise IndexError(f"row index {int(bad[0])} is out of range for a dataset of {n} rows")
        return idx

    def _parts(self, idx: np.ndarray) -> tuple[list[_Part], np.ndarray]:
        """Each row group the rows ``idx`` fall in, read once, with its rows asked (local numbers), grouped
        in row-group order; and where each asked position's value lands among them (``in_order``)."""
        offsets = self.store._offsets
        groups = np.searchsorted(offsets, idx, side="right") - 1
        by_group = np.argsort(groups, kind="stable")  # positions asked, grouped by row group
        in_order = np.argsort(by_group)  # ...and back: where each position's value lands
        sorted_groups = groups[by_group]
        cuts = (np.flatnonzero(sorted_groups[1:] != sorted_groups[:-1]) + 1).tolist()
        parts: list[_Part] = []
        for a, b in zip([0, *cuts], [*cuts, len(idx)]):
            group = int(sorted_groups[a])
            parts.append(_Part(group, self._row_group(group), idx[by_group[a:b]] - offsets[group]))
        return parts, in_order

    def _decoded_parts(self, parts: list[_Part], in_order: np.ndarray, into: Mapping[str, np.ndarray] | None,
                       fields: list[Any]) -> dict[str, Any]:
        """``fields`` of the rows in ``parts``, decoded in the order asked: images from views of the
        cached bytes or of the pages read, fixed-width cells gathered by numpy, the rest by Arrow's take."""
        decoded: dict[str, Any] = {}
        slow: list[Any] = []
        for f in fields:
            if self.decode_images and isinstance(f.codec, CompressedImageCodec):
                # gathered as views of the cached bytes (Arrow's take would copy every image twice)
                views = [view for part, found in zip(parts, self._image_views(parts, f.name)) for view in found]
                decoded[f.name] = decode_images(f, [views[k] for k in in_order.tolist()], policy=self._policy,
                                                into=into.get(f.name) if into else None)
            elif (cells := self._gathered(f, parts, in_order)) is not None:
                decoded[f.name] = decode_column(f, cells, decode_images=self.decode_images, policy=self._policy)
            else:
                slow.append(f)
        if slow:  # Arrow's take, group by group, then the rows joined in the order asked
            pieces = [part.entry.table.select([f.name for f in slow]).take(int64_array(part.rows)) for part in parts]
            decoded.update(zip((f.name for f in slow), self._decode_in_order(slow, pieces, in_order)))
        return decoded

    def _image_views(self, parts: list[_Part], name: str) -> list[list[memoryview]]:
        """Image field ``name`` of each part's rows: views of its cached row group, or of the pages read
        (where the field is read by page and its chunk allows it; a take's pages are read together)."""
        by_page = [k for k, part in enumerate(parts) if name not in part.entry.table.column_names]
        found: list[list[memoryview] | None] = [None] * len(parts)
        if by_page and self.pages is not None:
            read = self.pages.cells_of(name, [(parts[k].group, parts[k].rows) for k in by_page])
            for k, values in zip(by_page, read):
                found[k] = values
        return [values if values is not None else self._group_views(part, name) for part, values in zip(parts, found)]

    def _group_views(self, part: _Part, name: str) -> list[memoryview]:
        """Image field ``name`` of a part's rows from its row group, read again with this column where
        the page reader declined it."""
        if name not in part.entry.table.column_names:
            with self._lock:
                dropped = self._cache.pop(part.group, None)
                if dropped is not None:
                    self._cached_bytes -= dropped.table.nbytes
                    self._whole, self._whole_refused = None, False
            part.entry = self._row_group(part.group)
        return part.entry.binary(name).at(part.rows)

    def _from_whole(self, whole: _WholeDataset, f: Any, idx: np.ndarray, into: Mapping[str, np.ndarray] | None) -> Any:
        """Field ``f`` of rows ``idx`` decoded from the whole dataset's cells."""
        if f.name in whole.images:
            return decode_images(f, whole.views(f.name, idx), policy=self._policy, into=into.get(f.name) if into else None)
        arrow_type, cells = whole.fixed[f.name]
        return decode_column(f, from_fixed_width_cells(arrow_type, cells[idx]), decode_images=self.decode_images,
                             policy=self._policy)

    def _whole_dataset(self) -> _WholeDataset | None:
        """The whole dataset's cells, where every row group is cached and each field has cells
        :class:`_WholeDataset` can gather; made once (None until then, or where it cannot be)."""
        whole = self._whole
        if whole is not None or self._whole_refused or len(self._cache) < len(self.store.row_groups):
            return whole
        with self._lock:
            if self._whole is None and not self._whole_refused and len(self._cache) == len(self.store.row_groups):
                entries = [self._cache[g] for g in range(len(self.store.row_groups))]
                fields = [f for f in self.schema if f.name not in self._paged]
                self._whole = _WholeDataset.of(entries, fields, self.decode_images, self._cache_bytes // 4)
                self._whole_refused = self._whole is None
            return self._whole

    @staticmethod
    def _gathered(f: Any, parts: list[_Part], in_order: np.ndarray) -> pa.Array | None:
        """Field ``f``'s rows asked, as one Arrow array in the order asked, gathered by numpy from
        the groups' fixed-width cells; None where a group stores it otherwise (nulls, variable width,
        another type than the first group's)."""
        taken, types = [], set()
        for part in parts:
            found = part.entry.fixed_width(f.name)
            if found is None:
                return None
            types.add(found[0])
            taken.append(found[1][part.rows])
        if len(types) != 1:
            return None
        return from_fixed_width_cells(types.pop(), (taken[0] if len(taken) == 1 else np.concatenate(taken))[in_order])

    def _decode_in_order(self, fields: list[Any], pieces: list[pa.Table], positions: np.ndarray) -> list[Any]:
        """``fields`` of the rows taken from each group (``pieces``, joined: their rows at ``positions``
        are the order asked), then each column decoded once (a sampler's random batch touches most row
        groups: a decode per group cost ~2x more)."""
        try:
            table = pa.concat_tables(pieces).take(int64_array(positions)) if len(pieces) > 1 else pieces[0]
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # files that store a column differently: group by group
            decoded = [self._decode(fields, piece) for piece in pieces]
            return [_concat([d[i] for d in decoded])[positions] for i in range(len(fields))]
        return self._decode(fields, table)

    def _decode(self, fields: list[Any], table: pa.Table) -> list[Any]:
        return [decode_column(f, table.column(f.name), decode_images=self.decode_images, policy=self._policy)
                for f in fields]

    def _row_group(self, group: int) -> _CachedGroup:
        with self._lock:
            entry = self._cache.get(group)
            if entry is not None:
                self._cache.move_to_end(group)
                return entry
        pages = self.pages
        fields = [name for name in self.schema.fields
                  if name not in self._paged or pages is None or not pages.takes(group, name)]
        entry = _CachedGroup(self.store.read_row_group(group, fields,
                                                       views=decoded_images(self.schema, self.decode_images)))
        with self._lock:
            if group not in self._cache:
                self._cache[group] = entry
                self._cached_bytes += entry.table.nbytes
            while self._cache_is_over():
                _, dropped = self._cache.popitem(last=False)
                self._cached_bytes -= dropped.table.nbytes
                self._whole, self._whole_refused = None, False
        return entry

    def _cache_is_over(self) -> bool:
        held = len(self._cache)
        if self._cache_size is not None and held > self._cache_size:
            return True
        return held > 1 and self._cached_bytes > self._cache_bytes


class _WholeDataset:
    """Every row group's cells as one array per field, by global row: a take of rows from all over
    the dataset (a sampler's random batch) is one gather per field, not one per row group (64 random
    rows of benchmarks/peers.py's 11 row groups: ~130 -> ~30 us a batch besides decoding). Images are
    the cached groups' spans (no bytes copied); fixed-width fields' cells are copied together, which
    is refused above ``limit`` bytes."""

    def __init__(self, images: dict[str, Spans],
                 fixed: dict[str, tuple[pa.DataType, np.ndarray]]) -> None:
        self.images, self.fixed = images, fixed

    @classmethod
    def of(cls, entries: list[_CachedGroup], schema: Sequence[Any], decode_images: bool,
           limit: int) -> _WholeDataset | None:
        images: dict[str, Spans] = {}
        fixed: dict[str, tuple[pa.DataType, np.ndarray]] = {}
        copied = 0
        for f in schema:
            if decode_images and isinstance(f.codec, CompressedImageCodec):
                spans = [entry.binary(f.name).spans() for entry in entries]
                if any(found is None for found in spans):
                    return None
                buffers: list[memoryview] = []
                which, starts, ends = [], [], []
                for group_buffers, group_which, group_starts, group_ends in spans:  # type: ignore[misc]
                    first = len(buffers)
                    buffers.extend(group_buffers)
                    which.append(np.full(len(group_starts), first, np.int64) if group_which is None
                                 else np.asarray(group_which, np.int64) + first)
                    starts.append(group_starts)
                    ends.append(group_ends)
                images[f.name] = (buffers, np.concatenate(which), np.concatenate(starts), np.concatenate(ends))
                continue
            cells = [entry.fixed_width(f.name) for entry in entries]
            if any(found is None for found in cells) or len({found[0] for found in cells}) != 1:  # type: ignore[index]
                return None
            joined = np.concatenate([found[1] for found in cells])  # type: ignore[index]
            copied += joined.nbytes
            if copied > limit:
                return None
            fixed[f.name] = (cells[0][0], joined)  # type: ignore[index]
        return cls(images, fixed)

    def views(self, name: str, rows: np.ndarray) -> list[memoryview]:
        """Image field ``name``'s values at ``rows``, as views of the cached groups' buffers."""
        return spans_at(self.images[name], rows)


@dataclass
class _Part:
    """A row group a take reads from: its number, its cached columns and the rows asked of it (local numbers)."""

    group: int
    entry: _CachedGroup
    rows: np.ndarray


class _CachedGroup:
    """A row group read, with what lookups in it need made once: its columns' fixed-width cells and
    binary values (views of the table's own buffers, no copies)."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self._fixed: dict[str, tuple[pa.DataType, np.ndarray] | None] = {}
        self._binary: dict[str, BinaryCells] = {}

    def fixed_width(self, name: str) -> tuple[pa.DataType, np.ndarray] | None:
        """Column ``name``'s Arrow type and fixed-width cells; None where it has none."""
        if name not in self._fixed:
            column = self.table.column(name)
            cells = fixed_width_cells(column)
            self._fixed[name] = None if cells is None else (column.type, cells)
        return self._fixed[name]

    def binary(self, name: str) -> BinaryCells:
        cells = self._binary.get(name)
        if cells is None:
            cells = self._binary[name] = BinaryCells(self.table.column(name))
        return cells


def _check_apart(into: Mapping[str, np.ndarray] | None) -> None:
    """Refuse ``into`` arrays that share memory: a field decoded into one would overwrite another's."""
    targets = list((into or {}).items())
    for k, (name, target) in enumerate(targets):
        for other, overlapping in targets[k + 1:]:
            if np.may_share_memory(target, overlapping):
                raise InvalidArgumentError(f"into: the arrays given for {name!r} and {other!r} share memory")


def _copied_into(values: Any, target: np.ndarray | None) -> Any:
    """``values`` copied into ``target`` where it is an array of their shape and dtype (and returned)."""
    if target is None or target is values or not isinstance(values, np.ndarray) or values.dtype == object \
            or values.shape != target.shape or values.dtype != target.dtype or not target.flags.writeable:
        return values
    np.copyto(target, values)
    return target


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    if len(parts) == 1:
        return parts[0]
    if all(p.dtype != object for p in parts) and len({p.shape[1:] for p in parts}) == 1:
        dtype = joined_dtype(parts)  # not numpy's: it wraps a date past 1677-2262 read as microseconds
        if dtype is not None:
            return np.concatenate(parts, dtype=dtype)
    out = np.empty(sum(len(p) for p in parts), dtype=object)
    for i, value in enumerate(value for part in parts for value in part):  # not out[:] = list: arrays would broadcast
        out[i] = value
    return out
