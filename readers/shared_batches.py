"""Shared memory that a torch ``DataLoader`` worker reuses for the batches it sends to the main process.

A worker's batch crosses to the main process in shared memory (``in_one_shared_storage``: one
storage per batch or reader chunk). Fresh shared memory is expensive: allocating and first
touching its pages cost ~1 µs per KB on the development machine (12 ms to fill a new 12 MB storage,
against 1.1 ms to copy into memory already touched), two thirds of a worker's main thread with
64x64 images. :class:`StoragePool` keeps a few storages and refills one only when nothing can
still read what it holds:

- in the worker, no tensor views it any more (the pool holds the only reference), and
- every batch sent from it has arrived in the main process, which copies a pooled batch's shared
  tensors into memory of its own as it unpickles it (:func:`_received`). The caller never holds
  pool memory, so keeping batches, passing them to other processes or slicing them is safe.

Arrivals are counted with one writer per counter, in a small shared tensor: the worker counts the
batches it sends from each slot (``sent``), the main process those it received and copied
(``released``, once per batch: a batch carries its ticket). A slot is free when the two are equal.
A batch that does not arrive as sent (a ``collate_fn`` of the caller's that rebuilds it, an
iteration abandoned) leaves its slot busy for good, and the pool allocates fresh memory, as torch
does.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from unihub.formats.arrow_numpy import arrow_backed_empty
from unihub.readers.batching import numpy_view

#: storages a worker keeps: its reader chunk being cut, and the few batches torch prefetches
SLOTS = 4
#: rows of a pool's counters: batches sent (the worker writes), batches received and copied (the
#: main process writes), times a slot's storage was handed out again (the worker writes; for tests
#: and tuning)
_SENT, _RELEASED, _REFILLED = 0, 1, 2


def _torch() -> Any:
    import torch

    return torch


def in_one_storage(columns: dict[str, Any], names: Sequence[str], new_storage: Callable[[int], Any]) -> dict[str, Any]:
    """``columns`` with the CPU tensors ``names`` copied into views of one storage from
    ``new_storage(nbytes)``, each 64-byte aligned."""
    torch = _torch()
    offsets, total = {}, 0
    for name in names:
        total = -(-total // 64) * 64
        offsets[name] = total
        total += columns[name].numel() * columns[name].element_size()
    storage = new_storage(total)
    out = dict(columns)
    for name in names:
        tensor = columns[name]
        view = torch.empty(0, dtype=tensor.dtype).set_(storage, offsets[name] // tensor.element_size(), tensor.shape)
        target, source = numpy_view(view), numpy_view(tensor)
        if isinstance(target, np.ndarray) and isinstance(source, np.ndarray):
            np.copyto(target, source)  # not torch's copy: its threads would spin beside the decoders
        else:
            view.copy_(tensor)
        out[name] = view
    return out


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
        :class:`PooledBatch` that the main process copies, and counts as arrived, when it unpickles it."""
        torch = _torch()
        values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (tuple, list)) else ()
        addresses = {v.untyped_storage().data_ptr() for v in values if isinstance(v, torch.Tensor)}
        slots = {self._slots[address] for address in addresses if address in self._slots}
        for slot in slots:
            self._counts[_SENT, slot] += 1  # before it leaves: from now on the slot is busy
        if len(slots) != 1 or type(batch) is not dict:
            return batch  # nothing pooled, or a batch that cannot carry its slot back: it stays busy
        slot = slots.pop()
        counters = None if self._counters_sent else self._counters
        self._counters_sent = True  # the main process keeps them from the first batch on
        return PooledBatch(batch, self.id, slot, int(self._counts[_SENT, slot]), counters)


_POOL: tuple[int, StoragePool] | None = None


def worker_pool() -> StoragePool:
    """This process's pool (a forked process makes its own)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), StoragePool())
    return _POOL[1]


class PooledBatch(dict[str, Any]):
    """A batch (dict of columns) that tells the main process which pool slot its tensors view."""

    __slots__ = ("pool", "slot", "ticket", "counters")

    def __init__(self, columns: dict[str, Any], pool: str, slot: int, ticket: int, counters: Any) -> None:
        super().__init__(columns)
        self.pool, self.slot, self.ticket, self.counters = pool, slot, ticket, counters

    def __copy__(self) -> PooledBatch:  # torch's default_convert copies the batch in the worker
        return PooledBatch(self, self.pool, self.slot, self.ticket, self.counters)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        import copy

        return copy.deepcopy(dict(self), memo)  # new memory, not the slot's (which stays busy)

    def __reduce__(self) -> tuple[Any, ...]:
        return _received, (dict(self), self.pool, self.slot, self.ticket, self.counters)


# ------------------------------------------------------------------------------ the main process
_KEEP_POOLS = 64  # pools whose counters are kept, newest last; an evicted pool's slots stay busy
_LOCK = threading.Lock()


class _Arrivals:
    """The main process's record of pools: their counters, and the tickets of batches that arrived."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.counters: OrderedDict[str, Any] = OrderedDict()
        self.tickets: dict[tuple[str, int], deque[int]] = {}

    def arrived(self, pool: str, slot: int, ticket: int, counters: Any) -> None:
        """Count a batch's arrival once (a batch unpickled twice is one arrival)."""
        if counters is not None:
            self.counters[pool] = counters
            while len(self.counters) > _KEEP_POOLS:
                old, _ = self.counters.popitem(last=False)
                self.tickets = {key: seen for key, seen in self.tickets.items() if key[0] != old}
        if pool not in self.counters:
            return  # its counters never came, or were evicted: the slot stays busy
        seen = self.tickets.setdefault((pool, slot), deque(maxlen=64))
        if ticket not in seen:
            seen.append(ticket)
            self.counters[pool].numpy()[_RELEASED, slot] += 1


_ARRIVALS = _Arrivals()


def _arrivals() -> _Arrivals:
    """This process's record (a process forked from one that had a record starts its own)."""
    global _ARRIVALS
    if _ARRIVALS.pid != os.getpid():
        _ARRIVALS = _Arrivals()
    return _ARRIVALS


def _private_storage(nbytes: int) -> Any:
    """A storage in this process's own memory (Arrow's pool: pages reused, not new)."""
    return _torch().from_numpy(arrow_backed_empty((max(nbytes, 1),), np.uint8)).untyped_storage()


def _received(columns: dict[str, Any], pool: str, slot: int, ticket: int, counters: Any) -> dict[str, Any]:
    """Unpickled in the main process: the batch with its shared tensors copied into private memory,
    then its arrival counted (the worker may refill the slot from then on)."""
    torch = _torch()
    if _POOL is not None and _POOL[1].id == pool:
        return columns  # pickled and unpickled in the worker itself: the batch has not left
    shared = [name for name, value in columns.items()
              if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.is_shared()]
    out = in_one_storage(columns, shared, _private_storage)
    with _LOCK:
        _arrivals().arrived(pool, slot, ticket, counters)
    return out


def counters(pool: str) -> Any:
    """A pool's counters as the main process sees them (rows: sent, released, refilled; a column per slot)."""
    with _LOCK:
        return _arrivals().counters[pool].numpy().copy()


def pools() -> list[str]:
    """The pools whose counters this process holds, oldest first."""
    with _LOCK:
        return list(_arrivals().counters)
