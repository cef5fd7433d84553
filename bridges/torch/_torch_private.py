"""Every use of torch's private API in unihub, in one place: what each is for, and where torch keeps it.

The loaders hand a worker's batches to the main process in reused shared memory (``shared_batches.py``)
and collate the datasets' rows as slices of the columns they were cut from (``sampler_rows.py``). torch
has no public API for either, so these functions reach into its internals. Each says which internal it
uses and why; a torch that lacks one raises ``ImportError`` or ``AttributeError`` here, and the callers
fall back to torch's own way where they can (noted at each).

Checked against torch 2.13.0 (the version the tests run with); ``pyproject.toml`` asks for torch >= 2.1, and
the versions in between were not tested here. When torch is upgraded, ``tests/bridges/torch/test_torch_private.py``
checks each of these directly, and the rest of ``tests/bridges/torch/`` exercises them in use (the handover of
pooled batches, the collate of sampler rows and batches, the result-queue channel).

torch is optional: each function imports it when called, never when this module is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


# -- torch.utils.data._utils.collate: the collate that default_collate runs, and its per-type map --------
def default_collate_fn_map() -> dict[Any, Callable[..., Any]]:
    """torch's ``default_collate_fn_map`` (``torch.utils.data._utils.collate``): the documented extension point
    of ``default_collate`` (a type -> its collate function), where the datasets register their row types so
    that torch's default collate hands their columns over whole. ``ImportError`` in a torch without it."""
    from torch.utils.data._utils.collate import default_collate_fn_map as collate_map  # torch is optional

    return collate_map


def collate(batch: Any, collate_fn_map: Any) -> Any:
    """torch's ``collate(batch, collate_fn_map=...)``, the function ``default_collate`` runs: a registered
    collate that leaves part of a batch to torch calls it with the map it was called with."""
    from torch.utils.data._utils.collate import collate as torch_collate  # torch is optional

    return torch_collate(batch, collate_fn_map=collate_fn_map)


def collates_tensors_as_torch(collate_fn_map: Any) -> bool:
    """Whether ``collate_fn_map`` stacks tensors with torch's own ``collate_tensor_fn`` (a map of the user's
    own may stack them otherwise, and then gets the rows as they are)."""
    import torch  # torch is optional
    from torch.utils.data._utils.collate import collate_tensor_fn

    return bool(collate_fn_map.get(torch.Tensor) is collate_tensor_fn)


# -- torch.utils.data._utils.fetch and .worker: who is fetching, and the worker's result queue -----------
def map_fetcher_collating_by_default(caller: Any) -> bool:
    """Whether the frame ``caller`` is ``fetch`` of torch's map-style fetcher (``_MapDatasetFetcher``,
    ``torch.utils.data._utils.fetch``) batching automatically with ``default_collate``: what a dataset's
    ``__getitems__`` returns there goes to that collate and is shown to nothing else, so a sampler batch may
    go as markers (``sampler_rows.SamplerBatch``). False in any torch where this does not hold."""
    fetcher = caller.f_locals.get("self") if caller.f_code.co_name == "fetch" else None
    if type(fetcher).__name__ != "_MapDatasetFetcher" or not getattr(fetcher, "auto_collation", False):
        return False
    try:
        from torch.utils.data._utils.collate import default_collate  # torch is optional
    except ImportError:
        return False
    return getattr(fetcher, "collate_fn", None) is default_collate


def worker_result_queue(frame: Any) -> Any:
    """The result queue (``data_queue``) of torch's worker loop (``_worker_loop``,
    ``torch.utils.data._utils.worker``) found on the stack from ``frame`` outwards, or None where there is
    none (not in a torch worker, or a torch whose loop is named otherwise: storages then go torch's way).
    The worker's batches are wrapped as they are put there, so the thread that pickles them is known."""
    while frame is not None and not (frame.f_code.co_name == "_worker_loop" and "data_queue" in frame.f_locals):
        frame = frame.f_back
    return None if frame is None else frame.f_locals["data_queue"]


# -- storages: shared memory made, shared and counted ----------------------------------------------------
def new_shared_storage(nbytes: int) -> Any:
    """A new untyped storage of ``nbytes`` in shared memory (``UntypedStorage._new_shared``), as torch's
    collate allocates a worker's batch: written in place, it leaves the worker without a copy."""
    import torch  # torch is optional

    return torch.UntypedStorage._new_shared(nbytes)


def counts_storage_uses() -> bool:
    """Whether this torch tells how many references a storage's memory has (``torch._C._storage_Use_Count``);
    without it a pool never knows a slot is free and always takes new memory."""
    import torch  # torch is optional

    return hasattr(torch._C, "_storage_Use_Count")


def storage_use_count(storage: Any) -> int:
    """References to ``storage``'s memory (``torch._C._storage_Use_Count`` of its ``_cdata``): 1 when only
    the pool's own storage object holds it, so nothing can read a slot refilled then."""
    import torch  # torch is optional

    return int(torch._C._storage_Use_Count(storage._cdata))


def untyped_storage(storage: Any) -> Any:
    """A typed storage's untyped one (its ``_untyped_storage``); an untyped storage itself."""
    return getattr(storage, "_untyped_storage", storage)


def share_fd_cpu(storage: Any) -> tuple[int, int]:
    """``storage`` moved into shared memory as torch's reduction does (``_share_fd_cpu_``): its file
    descriptor and size, which the pool sends over its own channel rather than torch's connection."""
    fd, nbytes = storage._share_fd_cpu_()
    return fd, nbytes


# -- torch.multiprocessing.reductions: how ForkingPickler sends tensors and storages ---------------------
def reduce_tensor(tensor: Any) -> tuple[Any, ...]:
    """torch's reduction of a tensor for another process (``torch.multiprocessing.reductions``): the
    pools watch tensors leaving a worker and then pickle them as torch does."""
    from torch.multiprocessing import reductions  # torch is optional

    return reductions.reduce_tensor(tensor)


def reduce_storage(storage: Any) -> tuple[Any, ...]:
    """torch's reduction of an untyped storage for another process."""
    from torch.multiprocessing import reductions  # torch is optional

    return reductions.reduce_storage(storage)


def reduce_typed_storage(storage: Any) -> tuple[Any, ...]:
    """torch's reduction of a typed storage for another process."""
    from torch.multiprocessing import reductions  # torch is optional

    return reductions.reduce_typed_storage(storage)


def rebuilt_from_fd(storage_type: type, fd: Any, nbytes: int) -> tuple[Any, ...]:
    """The reduction torch makes of a storage shared by file descriptor (``rebuild_storage_fd``), with
    ``fd`` standing in for ``multiprocessing``'s ``DupFd`` (anything with ``detach()`` giving the descriptor)."""
    from torch.multiprocessing import reductions  # torch is optional

    return reductions.rebuild_storage_fd, (storage_type, fd, nbytes)
