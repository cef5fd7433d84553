"""Shared memory that a torch ``DataLoader`` worker reuses for the batches it sends to the main process.

A worker's batch crosses to the main process in shared memory (``in_one_shared_storage``: one
storage per batch or reader chunk). Fresh shared memory is expensive: allocating and first
touching its pages cost ~1 µs per KB on the development machine (12 ms to fill a new 12 MB storage,
against 1.1 ms to copy into memory already touched), two thirds of a worker's main thread with
64x64 images. :class:`StoragePool` keeps a few storages and refills one only when nothing can
still see what it holds:

- in the worker, no tensor views it any more (the pool holds the only reference), and
- in the main process, every batch sent from it has arrived and has been freed.

The second is counted with one writer per counter, in a small shared tensor: the worker counts
the batches it sends from each slot (``sent``), and the main process counts those it received and
then saw freed (``released``). A slot is free when the two are equal. A batch that never arrives as
sent (a ``collate_fn`` of the caller's that rebuilds it, an iteration abandoned) leaves its slot busy
for good. The pool then allocates fresh memory, as torch would.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections import OrderedDict
from typing import Any

#: storages a worker keeps: its reader chunk being cut, and the few batches torch prefetches
SLOTS = 4
#: rows of a pool's counters: batches sent (the worker writes), batches released (the main process
#: writes), times a slot's storage was handed out again (the worker writes; for tests and tuning)
_SENT, _RELEASED, _REFILLED = 0, 1, 2


def _torch() -> Any:
    import torch

    return torch


def _use_count(storage: Any) -> int:
    """References to ``storage``'s memory: 1 when only the pool's own storage object holds it."""
    return int(_torch()._C._storage_Use_Count(storage._cdata))


class StoragePool:
    """A worker's shared storages, each refilled only once nothing can see its contents (see the module)."""

    def __init__(self, slots: int = SLOTS) -> None:
        torch = _torch()
        self.id = uuid.uuid4().hex
        self._counters = torch.zeros((3, slots), dtype=torch.int64).share_memory_()
        self._counts = self._counters.numpy()
        self._storages: list[Any] = [None] * slots
        self._slots: dict[int, int] = {}  # a storage's data address -> its slot
        self._counters_sent = False
        #: a torch without the use count of a storage: no slot is ever known free, all memory is new
        self._reuse = hasattr(torch._C, "_storage_Use_Count")

    def storage(self, nbytes: int) -> Any:
        """A shared storage of at least ``nbytes``: a free slot's (refilled by the caller), or new memory."""
        torch = _torch()
        if not self._reuse:
            return torch.UntypedStorage._new_shared(max(nbytes, 1))
        free = [i for i, held in enumerate(self._storages) if held is None or self._free(i)]
        for i in free:
            held = self._storages[i]
            if held is not None and nbytes <= held.nbytes() <= 2 * nbytes:
                self._counts[_REFILLED, i] += 1
                return held
        storage = torch.UntypedStorage._new_shared(max(nbytes, 1))
        if free:  # an empty slot, or a free one of the wrong size: it holds the new storage
            i = next((i for i in free if self._storages[i] is None), free[0])
            old = self._storages[i]
            if old is not None:
                del self._slots[old.data_ptr()]
            self._storages[i] = storage
            self._slots[storage.data_ptr()] = i
        return storage

    def _free(self, slot: int) -> bool:
        sent, released = self._counts[_SENT, slot], self._counts[_RELEASED, slot]
        return bool(sent == released) and _use_count(self._storages[slot]) == 1

    def sending(self, batch: Any) -> Any:
        """``batch`` as it should leave the worker: counted against the slots its tensors view, and a
        :class:`PooledBatch` that the main process releases when it frees the batch."""
        torch = _torch()
        values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (tuple, list)) else ()
        addresses = {v.untyped_storage().data_ptr() for v in values if isinstance(v, torch.Tensor)}
        slots = {self._slots[address] for address in addresses if address in self._slots}
        for slot in slots:
            self._counts[_SENT, slot] += 1  # before it leaves: from now on the slot is busy
        if len(slots) != 1 or type(batch) is not dict:
            return batch  # nothing pooled, or a batch that cannot carry its slot back: it stays busy
        counters = None if self._counters_sent else self._counters
        self._counters_sent = True  # the main process keeps them from the first batch on
        return PooledBatch(batch, self.id, slots.pop(), counters)


_POOL: tuple[int, StoragePool] | None = None


def worker_pool() -> StoragePool:
    """This process's pool (a forked process makes its own)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), StoragePool())
    return _POOL[1]


class PooledBatch(dict[str, Any]):
    """A batch (dict of columns) that tells the main process which pool slot its tensors view."""

    __slots__ = ("pool", "slot", "counters")

    def __init__(self, columns: dict[str, Any], pool: str, slot: int, counters: Any) -> None:
        super().__init__(columns)
        self.pool, self.slot, self.counters = pool, slot, counters

    def __copy__(self) -> PooledBatch:  # torch's default_convert copies the batch in the worker
        return PooledBatch(self, self.pool, self.slot, self.counters)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        import copy

        return copy.deepcopy(dict(self), memo)  # new memory, not the slot's (which stays busy)

    def __reduce__(self) -> tuple[Any, ...]:
        return _received, (dict(self), self.pool, self.slot, self.counters)


# ------------------------------------------------------------------------------ the main process
#: pools' counters, newest last; an evicted pool's slots are never released (it allocates afresh)
_COUNTERS: OrderedDict[str, Any] = OrderedDict()
_KEEP_POOLS = 64
#: batches received and not yet seen freed: (weak reference to their storage, pool, slot)
_OUTSTANDING: list[tuple[Any, str, int]] = []
_LOCK = threading.Lock()


def _received(columns: dict[str, Any], pool: str, slot: int, counters: Any) -> dict[str, Any]:
    """Unpickled in the main process: note the batch's storage, release the slots of batches freed since."""
    from torch.multiprocessing.reductions import StorageWeakRef

    torch = _torch()
    if _POOL is not None and _POOL[1].id == pool:
        return columns  # pickled and unpickled in the worker itself: not a batch the main process holds
    with _LOCK:
        if counters is not None:
            _COUNTERS[pool] = counters
            while len(_COUNTERS) > _KEEP_POOLS:
                _COUNTERS.popitem(last=False)
        _release_freed()
        storage = next(v.untyped_storage() for v in columns.values() if isinstance(v, torch.Tensor))
        if pool in _COUNTERS:
            _OUTSTANDING.append((StorageWeakRef(storage), pool, slot))
    return columns


def counters(pool: str) -> Any:
    """A pool's counters as the main process sees them (rows: sent, released, refilled; a column per slot)."""
    with _LOCK:
        return _COUNTERS[pool].numpy().copy()


def _release_freed() -> None:
    """Count as released the batches received whose memory the main process has freed."""
    kept = []
    for ref, pool, slot in _OUTSTANDING:
        if not ref.expired():
            kept.append((ref, pool, slot))
        elif pool in _COUNTERS:
            _COUNTERS[pool].numpy()[_RELEASED, slot] += 1
    _OUTSTANDING[:] = kept
