"""Reader columns as torch tensors, and a batch's tensors in one shared storage.

Numeric numpy columns become tensors that share their memory (one conversion per column, no per-row
work). A batch that leaves a torch ``DataLoader`` worker is cheapest as views of one shared storage,
from the worker's pool where it has one (``shared_batches.py``).

torch is imported when a function is called, never when this module is imported.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from unihub.bridges.torch._torch_private import new_shared_storage
from unihub.bridges.torch.shared_batches import StoragePool, worker_pool
from unihub.dependencies import require
from unihub.readers.batching import columns_length, numpy_view

Columns = dict[str, Any]  # field name -> torch.Tensor (numeric) or list (anything else)
NUMERIC_KINDS = "biufc"  # numpy dtype kinds that become tensors


def load_torch() -> Any:
    """torch, or :class:`~unihub.errors.MissingDependencyError` with the install hint."""
    return require("torch", extra="torch", purpose="the PyTorch loaders")


def as_tensor(array: np.ndarray) -> Any:
    """A tensor sharing memory with ``array``; read-only or strided arrays (Arrow buffers) are copied."""
    if not array.flags.writeable or not array.flags.c_contiguous:
        array = np.array(array, order="C")
    return load_torch().from_numpy(array)


def torch_dtype(dtype: Any) -> Any:
    """The torch dtype of a numeric numpy ``dtype``; None for one torch does not have (or not numeric)."""
    if np.dtype(dtype).kind not in NUMERIC_KINDS:
        return None
    try:
        return load_torch().from_numpy(np.empty(0, dtype)).dtype
    except TypeError:
        return None


def split_columns(columns: Columns, size: int) -> list[Columns]:
    """``columns`` cut into consecutive pieces of ``size`` rows: tensor views (one ``torch.split``
    per column, not a slice per piece), lists sliced."""
    torch = load_torch()
    n = columns_length(columns)
    cut = {name: (torch.split(col, size) if isinstance(col, torch.Tensor) else
                  [col[i:i + size] for i in range(0, n, size)]) for name, col in columns.items()}
    return [dict(zip(cut, piece)) for piece in zip(*cut.values())]


def in_one_shared_storage(columns: Columns, pool: StoragePool | None = None) -> Columns:
    """Numeric CPU tensor columns as views of one shared-memory storage (copied in once; from
    ``pool`` where given: shared_batches.py).

    A torch ``DataLoader`` worker hands each tensor of a batch to the main process as a
    shared-memory file descriptor, passed over a socket with a handshake per descriptor, after
    copying the tensor's storage into shared memory. Tensors that are views of one shared storage
    cost one descriptor per batch and no copy (1.35-1.5x the batches per second of three separate
    tensors on this machine). From ``pool``, a storage's descriptor crosses once, and later
    batches in it carry only their layout. Columns already in one shared storage come back as they are.
    """
    torch = load_torch()
    tensors = {name: col for name, col in columns.items()
               if isinstance(col, torch.Tensor) and col.device.type == "cpu" and not col.requires_grad}
    if not tensors or (len(tensors) < 2 and pool is None):
        return columns  # torch shares a lone tensor in one descriptor anyway
    storages = {t.untyped_storage().data_ptr() for t in tensors.values()}
    if len(storages) == 1 and next(iter(tensors.values())).untyped_storage().is_shared():
        return columns
    shapes = {name: (tensor.dtype, tuple(tensor.shape)) for name, tensor in tensors.items()}
    offsets, total = _packed(shapes)
    storage = pool.storage(total) if pool is not None else new_shared_storage(max(total, 1))
    out = dict(columns)
    for name, view in _views(storage, shapes, offsets).items():
        copy_into(view, tensors[name])
        out[name] = view
    return out


def copy_into(target: Any, source: Any) -> None:
    """``source``'s values into ``target`` (same shape), not by torch's copy, whose threads would spin
    beside the decoders: one ``memmove`` where both are contiguous, else numpy's copy where
    ``target`` is shared memory (a numpy view would make new memory unresizable, unlike a stack)."""
    if target.is_contiguous() and source.is_contiguous() and target.dtype == source.dtype and \
            target.shape == source.shape:
        ctypes.memmove(target.data_ptr(), source.data_ptr(), source.nbytes)
        return
    into, values = numpy_view(target), numpy_view(source)
    if target.untyped_storage().is_shared() and isinstance(into, np.ndarray) and isinstance(values, np.ndarray):
        np.copyto(into, values)
    else:
        target.copy_(source)


def _packed(shapes: Mapping[str, tuple[Any, tuple[int, ...]]]) -> tuple[dict[str, int], int]:
    """Where each column of ``shapes`` (name: torch dtype, shape) starts in one storage, each
    64-byte aligned, and the storage's size in bytes."""
    offsets, total = {}, 0
    for name, (dtype, shape) in shapes.items():
        total = -(-total // 64) * 64
        offsets[name] = total
        total += math.prod(shape) * dtype.itemsize
    return offsets, total


def _views(storage: Any, shapes: Mapping[str, tuple[Any, tuple[int, ...]]], offsets: Mapping[str, int]) -> dict[str, Any]:
    torch = load_torch()
    return {name: torch.empty(0, dtype=dtype).set_(storage, offsets[name] // dtype.itemsize, shape)
            for name, (dtype, shape) in shapes.items()}


def empty_in_pool(shapes: Mapping[str, tuple[Any, tuple[int, ...]]], pool: StoragePool | None = None) -> dict[str, Any]:
    """Uninitialised tensors (name: torch dtype, shape) in one storage of ``pool`` (default: this worker's):
    a batch written there leaves the worker without a copy (:func:`from_worker` finds them in one storage)."""
    offsets, total = _packed(shapes)
    return _views((pool if pool is not None else worker_pool()).storage(total), shapes, offsets)


def from_worker(columns: Columns) -> Any:
    """A batch as a torch worker sends it: in one storage of the worker's pool, which crosses to the
    main process once (shared_batches.py)."""
    pool = worker_pool()
    return pool.sending(in_one_shared_storage(columns, pool))
