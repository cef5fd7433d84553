"""``petastorm.pytorch``: unihub's PyTorch loaders."""

from unihub.bridges.torch import BatchedDataLoader, DataLoader, InMemBatchedDataLoader, decimal_friendly_collate

__all__ = ["BatchedDataLoader", "DataLoader", "InMemBatchedDataLoader", "decimal_friendly_collate"]
