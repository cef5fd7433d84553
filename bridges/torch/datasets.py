"""torch-native datasets over unihub readers, for torch's own ``DataLoader``: ``TorchIterableDataset``
(rows or column batches, each torch worker of each rank reading its own shard) and ``TorchMapDataset``
(rows by index, for any sampler).

Both subclass torch's dataset classes, so they are built when first asked for (this module's
``__getattr__``), and torch is never imported when this module is. Their rows go to torch's
``default_collate`` as the types of ``sampler_rows.py``, which hand their columns over whole.

    loader = torch.utils.data.DataLoader(TorchIterableDataset(url, batch_size=64), num_workers=4)
    loader = torch.utils.data.DataLoader(TorchMapDataset(url), batch_size=64, shuffle=True, num_workers=2)
"""

from __future__ import annotations

import itertools
import math
import operator
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from unihub.bridges.torch.collate import Variable, check_variable, columns_from_numpy, row_to_tensors, row_value
from unihub.bridges.torch.loaders import BatchedDataLoader
from unihub.bridges.torch.sampler_rows import (
    SamplerBatch,
    SamplerRow,
    TransformedRow,
    register_sampler_collate,
    rows_of_columns,
    straight_to_default_collate,
)
from unihub.bridges.torch.shared_batches import in_torch_worker, receive_here, worker_pool
from unihub.bridges.torch.state import rank_and_world
from unihub.bridges.torch.tensors import Columns, empty_in_pool, from_worker, load_torch, torch_dtype
from unihub.errors import InvalidArgumentError
from unihub.readers.batching import columns_length, numpy_view
from unihub.readers.random_access import Dataset
from unihub.readers.reader import Reader, make_batch_reader, make_reader, random_seed
from unihub.readers.workers import usable_cores
from unihub.schema.codecs import CompressedImageCodec, image_pixels_allowed


def _epoch_seed(seed: int, epoch: int) -> int:
    """The reader seed of ``epoch``: one per (seed, epoch), the same in every rank and worker (so shards agree)."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1, np.uint64)[0] >> 1)


def _exact_share(reader: Any, shard: int, count: int) -> int:
    """Rows of a ``shard_remainder='pad'`` row shard that are not wrap-around repeats."""
    if reader.num_rows_per_epoch is None:
        raise InvalidArgumentError("TorchIterableDataset with several workers or ranks needs the row count to shard "
                          "rows exactly once; predicate=, filters= and batch transforms are not supported there")
    total = reader.store.num_rows
    per = math.ceil(total / count)
    return max(0, min(per, total - shard * per))


def _threads_per_worker(workers: int) -> int:
    """Decoding threads for the reader of each of ``workers`` torch worker processes: their share
    of the cores (a reader's default is one thread per core, and every worker starting that many
    had 2 x workers threads contending for the cores)."""
    return max(1, usable_cores() // workers)


_RESERVED = ("cur_shard", "shard_count", "shard_by", "shard_remainder", "num_epochs", "resume_from")


def _build_iterable_dataset(torch: Any) -> type:
    class TorchIterableDataset(torch.utils.data.IterableDataset):
        """Rows (``batch_size=None``) or column batches of a dataset for torch's own DataLoader.

        Each torch worker of each rank reads its own shard: ``cur_shard = rank * num_workers +
        worker_id`` of ``world_size * num_workers``, cut by row so every row of an epoch is
        delivered exactly once. Each ``iter()`` is one epoch; the order is seeded by
        ``(seed, epoch)``, and ``set_epoch`` sets the epoch (needed when workers are not
        persistent). Pass the same ``seed`` on every rank. With ``batch_size``, use torch's
        ``DataLoader(ds, batch_size=None)``. ``reader_kwargs`` go to ``make_reader``/``make_batch_reader``.

        ``url`` may also be a row reader, such as ``CachedDataset.stream(...)``: it is served as it is
        (its shard, order, offset and epochs), once, in the process that iterates (torch's
        ``num_workers=0``): one position in one order cannot be split among torch workers.
        """

        def __init__(self, url: Any, batch_size: int | None = None, *, seed: int | None = None,
                     variable: Variable = "list", **reader_kwargs: Any) -> None:
            super().__init__()
            receive_here()  # the workers torch forks hand this process their shared memory
            reserved = sorted(set(reader_kwargs) & set(_RESERVED))
            if reserved:
                raise InvalidArgumentError(f"TorchIterableDataset sets {reserved} itself (one epoch per iter(), sharded "
                                  "by torch worker and rank); leave them out")
            check_variable(variable)
            self.stream = url if isinstance(url, Reader) else None
            if self.stream is not None and (reader_kwargs or self.stream.batched):
                raise InvalidArgumentError("a reader given to TorchIterableDataset is served as it is: pass a row "
                                           "reader (make_reader, CachedDataset.stream) and no reader options")
            self.url, self.batch_size, self.variable = url, batch_size, variable
            if seed is None:
                seed = random_seed()
            self.seed = int(seed)
            self.reader_kwargs = reader_kwargs
            self.epoch = 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __iter__(self) -> Iterator[Any]:
            info = torch.utils.data.get_worker_info()
            if info is not None:
                in_torch_worker()
            if self.stream is not None:
                yield from self._serve_stream(info)
                return
            worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
            rank, world = rank_and_world()
            shard, count = rank * workers + worker, world * workers
            kwargs = dict(self.reader_kwargs, seed=_epoch_seed(self.seed, self.epoch), num_epochs=1)
            if workers > 1 and "workers_count" not in kwargs:
                kwargs["workers_count"] = _threads_per_worker(workers)
            self.epoch += 1
            if count > 1:
                kwargs.update(cur_shard=shard, shard_count=count, shard_by="row", shard_remainder="pad")
            make = make_reader if self.batch_size is None else make_batch_reader
            with make(self.url, **kwargs) as reader:
                limit = _exact_share(reader, shard, count) if count > 1 else None
                if self.batch_size is None and reader.ngram is None:
                    yield from _cut_rows(reader, limit)
                elif self.batch_size is None:  # an n-gram a row: torch collates them as they are
                    for row in itertools.islice(reader, limit):
                        yield row_to_tensors(row)
                else:
                    loader = BatchedDataLoader(reader, batch_size=self.batch_size, variable=self.variable)
                    loader._max_rows = limit
                    if info is None:
                        yield from loader
                        return
                    pool = loader._shared_batches = worker_pool()
                    for batch in loader:
                        yield pool.sending(batch)

        def _serve_stream(self, info: Any) -> Iterator[Any]:
            if info is not None:
                raise InvalidArgumentError("a reader (a stream) is one position in one order and cannot be split "
                                           "among torch workers: use num_workers=0, or pass the dataset's URL so "
                                           "that each worker reads its own shard")
            assert self.stream is not None
            if self.batch_size is None:
                for row in self.stream:
                    yield row_to_tensors(row)
            else:
                yield from BatchedDataLoader(self.stream, batch_size=self.batch_size, variable=self.variable)

    register_sampler_collate()

    TorchIterableDataset.__module__ = __name__
    TorchIterableDataset.__qualname__ = "TorchIterableDataset"
    return TorchIterableDataset


def _cut_rows(reader: Any, limit: int | None) -> Iterator[Any]:
    """A row reader's rows as :func:`row_to_tensors` gives them (at most ``limit``), cut from its
    columns (:meth:`~unihub.readers.reader.Reader.next_columns`) as :class:`SamplerRow`: torch's
    collate hands runs of them over as slices of those columns, not stacked row by row."""
    left = limit
    while left is None or left > 0:
        columns = reader.next_columns(left if left is not None else 2**31)
        if columns is None:
            return
        converted = columns_from_numpy(columns, cell=row_value)
        count = columns_length(converted)
        if left is not None:
            left -= count
        yield from rows_of_columns(converted, count, SamplerRow)


def _build_map_dataset(torch: Any) -> type:
    class TorchMapDataset(torch.utils.data.Dataset):
        """Rows by index (``random_access.Dataset``) for samplers: ``RandomSampler``, ``DistributedSampler``.

        Items are dicts (numeric values as tensors), passed through ``transform`` if given.
        ``__getitems__`` reads a whole sampler batch at once, each row group once.
        """

        def __init__(self, url: Any, schema_fields: Any = None, transform: Callable[[dict[str, Any]], Any] | None = None,
                     **dataset_kwargs: Any) -> None:
            receive_here()  # the workers torch forks hand this process their shared memory
            self.url, self.schema_fields, self.transform = url, schema_fields, transform
            self.dataset_kwargs = dataset_kwargs
            self._dataset: Any = None
            self._pool_fields: list[tuple[Any, Any]] | None = None
            self._len = len(self._open())

        def _open(self) -> Any:
            if self._dataset is None:
                self._dataset = Dataset(self.url, self.schema_fields, **self.dataset_kwargs)
            return self._dataset

        def __getstate__(self) -> dict[str, Any]:
            return dict(self.__dict__, _dataset=None)  # reopened in each worker process

        def __len__(self) -> int:
            return self._len

        def __getitem__(self, index: Any) -> Any:
            """A row for an int index. For a sequence of indices (a ``BatchSampler`` as the
            ``sampler`` with ``batch_size=None``, HF's idiom), their batch: columns (numeric ones as
            tensors), or with ``transform`` the list of transformed rows."""
            if isinstance(index, bool):
                raise TypeError("a row index must be an int, not a bool")
            try:
                position = operator.index(index)
            except TypeError:
                return self._batch(index)
            row = self.__getitems__([position])[0]
            return dict(row) if type(row) in (SamplerRow, TransformedRow) else row

        def _batch(self, indices: Any) -> Any:
            indices = indices.tolist() if hasattr(indices, "tolist") else list(indices)
            if self.transform is not None:
                return self.__getitems__(indices)
            columns = self._columns(indices)
            return columns if torch.utils.data.get_worker_info() is None else from_worker(columns)

        def __getitems__(self, indices: Sequence[int]) -> list[Any]:
            if torch.utils.data.get_worker_info() is not None:
                in_torch_worker()
            if self.transform is not None:
                columns = columns_from_numpy(self._open().take(list(indices))._asdict())
                rows = [self.transform(row) for row in rows_of_columns(columns, len(indices), dict)]
                if torch.utils.data.get_worker_info() is None:
                    return rows
                # dicts the transform made: collated into the worker's reused shared memory
                return [TransformedRow(row) if type(row) is dict else row for row in rows]
            columns = self._columns(list(indices))
            if indices and torch.utils.data.get_worker_info() is not None and \
                    all(isinstance(c, torch.Tensor) for c in columns.values()) and \
                    straight_to_default_collate(sys._getframe(1)):
                return [SamplerBatch(columns)] * len(indices)
            return rows_of_columns(columns, len(indices), SamplerRow)

        def _columns(self, indices: list[int]) -> Columns:
            """Rows ``indices`` as columns (numeric ones as tensors). In a torch worker the
            fixed-shape numeric columns are decoded (or copied) straight into one storage of the
            worker's pool, in which the batch then leaves the worker without another copy."""
            dataset = self._open()
            in_worker = bool(indices) and torch.utils.data.get_worker_info() is not None
            shapes = {f.name: (dtype, (len(indices), *f.shape)) for f, dtype in self._pooled_fields()
                      if not isinstance(f.codec, CompressedImageCodec) or image_pixels_allowed(f)} if in_worker else {}
            if not shapes:
                return columns_from_numpy(dataset.take(indices)._asdict())
            tensors = empty_in_pool(shapes)
            arrays = {name: numpy_view(tensor) for name, tensor in tensors.items()}
            batch = dataset.take(indices, into=arrays)._asdict()
            columns = columns_from_numpy({name: v for name, v in batch.items() if v is not arrays.get(name)})
            return {name: tensors[name] if v is arrays.get(name) else columns[name] for name, v in batch.items()}

        def _pooled_fields(self) -> list[tuple[Any, Any]]:
            """(field, torch dtype) of the fixed-shape numeric fields a worker decodes into its pool."""
            if self._pool_fields is None:
                self._pool_fields = [(f, dtype) for f in self._open().schema
                                     if f.is_fixed_shape and (dtype := torch_dtype(f.dtype)) is not None]
            return self._pool_fields

    register_sampler_collate()

    TorchMapDataset.__module__ = __name__
    TorchMapDataset.__qualname__ = "TorchMapDataset"
    return TorchMapDataset


_BUILDERS = {"TorchIterableDataset": _build_iterable_dataset, "TorchMapDataset": _build_map_dataset}


def __getattr__(name: str) -> Any:
    """The torch dataset classes subclass torch's, so they are built when first asked for."""
    builder = _BUILDERS.get(name)
    if builder is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = builder(load_torch())
    globals()[name] = cls
    return cls
