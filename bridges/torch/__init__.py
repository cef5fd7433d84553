"""PyTorch: Petastorm's loaders, torch datasets over unihub readers, and the batches workers hand over.

Every public name is here; the modules, one job each:

- ``loaders.py``: ``DataLoader``, ``BatchedDataLoader``, ``InMemBatchedDataLoader`` (Petastorm's), over
  ``base.py`` (what they share: the columnar path, shuffling queue, resume);
- ``datasets.py``: ``TorchIterableDataset``, ``TorchMapDataset`` for torch's own ``DataLoader``;
- ``collate.py``: ``make_collate``, ``decimal_friendly_collate``, padding; ``tensors.py``: numpy columns
  as tensors; ``sampler_rows.py``: the datasets' rows and the collate torch runs on them;
- ``state.py``: exact resume (``state_dict``), ``PerRank``, ``LoaderStateError``; ``stateful.py``: the
  datasets' states (torchdata's ``StatefulDataLoader``) and ``ElasticDistributedSampler``;
- ``shared_batches.py`` and ``fd_channel.py``: how a worker's batches reach the main process;
- ``_torch_private.py``: every use of torch's private API, with why and for which torch.

    from unihub.bridges.torch import BatchedDataLoader, TorchMapDataset

torch is imported when a loader or dataset is used, never when this package is imported.
"""

from __future__ import annotations

from typing import Any

from unihub.bridges.torch import datasets
from unihub.bridges.torch.collate import (
    Collate,
    Variable,
    columns_from_numpy,
    decimal_friendly_collate,
    default_collate_like,
    finalize,
    make_collate,
    pad,
    row_to_tensors,
)
from unihub.bridges.torch.loaders import BatchedDataLoader, DataLoader, InMemBatchedDataLoader
from unihub.bridges.torch.sampler_rows import (
    Run,
    SamplerRow,
    TransformedRow,
    collate_sampler_batch,
    collate_sampler_rows,
    collate_transformed_rows,
)
from unihub.bridges.torch.state import IN_MEMORY_STATE, LOADER_STATE_VERSION, LoaderStateError, PerRank
from unihub.bridges.torch.stateful import ElasticDistributedSampler
from unihub.bridges.torch.tensors import Columns, empty_in_pool, from_worker, in_one_shared_storage

__all__ = [
    "BatchedDataLoader", "Collate", "Columns", "DataLoader", "ElasticDistributedSampler", "IN_MEMORY_STATE", "InMemBatchedDataLoader",
    "LOADER_STATE_VERSION", "LoaderStateError", "PerRank", "Run", "SamplerRow", "TransformedRow", "Variable",
    "collate_sampler_batch", "collate_sampler_rows", "collate_transformed_rows", "columns_from_numpy",
    "decimal_friendly_collate", "default_collate_like", "empty_in_pool", "finalize", "from_worker",
    "in_one_shared_storage", "make_collate", "pad", "row_to_tensors",
]


def __getattr__(name: str) -> Any:
    """``TorchIterableDataset`` and ``TorchMapDataset`` subclass torch's classes: built when first asked for."""
    if name in ("TorchIterableDataset", "TorchMapDataset"):
        return getattr(datasets, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
