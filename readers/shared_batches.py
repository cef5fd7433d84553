"""Shared memory that a torch ``DataLoader`` worker reuses for the batches it sends to the main process.

A worker's batch crosses to the main process in shared memory (``in_one_shared_storage``: one
storage per batch). Two things made that expensive, and a :class:`StoragePool` avoids both:

- Fresh shared memory: allocating and first touching its pages cost ~1 µs per KB on the
  development machine (12 ms to fill a new 12 MB storage, against 1.1 ms to copy into memory
  already touched). The pool keeps a few storages and refills one only when nothing can still
  read what it holds.
- Passing a storage's file descriptor: torch hands each one over a new socket connection, with an
  HMAC challenge each way, that the worker's resource-sharer thread must accept while its decoding
  threads hold the GIL; more than half of the main process's time with 2 workers. The pool sends
  each storage once; the main process keeps it (:class:`_PoolRecord`), and later batches from that
  storage carry only their tensors' layout.

A slot is refilled only when

- in the worker, no tensor views it any more (the pool holds the only reference), and
- every batch sent from it has arrived in the main process, which copies a pooled batch's tensors
  into memory of its own as it unpickles it (:func:`_received`). The caller never holds pool
  memory, so keeping batches, passing them to other processes or slicing them is safe.

Both processes write a small shared tensor of counters, each counter with one writer: the worker
counts the batches it sends from each slot (``sent``), the main process those it received and
copied (``released``, once per batch: a batch carries its ticket) and the generation of each slot's
storage it holds (``known``: until it equals the slot's, batches carry the storage). A slot is free
when sent equals released. A batch that does not arrive as sent (a ``collate_fn`` of the caller's
that rebuilds it, an iteration abandoned) leaves its slot busy for good, and the pool allocates
fresh memory, as torch does. The main process forgets a pool once its worker has exited with every
batch it sent arrived.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from unihub.errors import UsageError
from unihub.formats.arrow_numpy import arrow_backed_empty
from unihub.readers.batching import numpy_view

#: storages a worker keeps: the batches torch prefetches, and the one being filled
SLOTS = 4
#: rows of a pool's counters, a column per slot: batches sent (the worker writes), batches
#: received and copied (the main process writes), times a slot's storage was handed out again (the
#: worker writes; for tests and tuning), the generation of the slot's storage that the main process
#: holds (the main process writes; 0: none)
_SENT, _RELEASED, _REFILLED, _KNOWN = 0, 1, 2, 3
#: exited workers' pools whose batches did not all arrive (an iteration abandoned), kept in case
#: they still do; beyond this many, the oldest are forgotten
_KEEP_UNFINISHED = 64


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
        self.pid = os.getpid()
        self._counters = torch.zeros((4, slots), dtype=torch.int64).share_memory_()
        self._counts = self._counters.numpy()
        self._storages: list[Any] = [None] * slots
        self._generations = [0] * slots  # of each slot's storage: a new storage, a new generation
        self._slots: dict[int, int] = {}  # a storage's data address -> its slot
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
            self._generations[i] = max(self._generations) + 1
            self._slots[storage.data_ptr()] = i
        return storage

    def _free(self, slot: int) -> bool:
        sent, released = self._counts[_SENT, slot], self._counts[_RELEASED, slot]
        return bool(sent == released) and _use_count(self._storages[slot]) == 1

    def known(self, slot: int, generation: int) -> bool:
        """Whether the main process holds generation ``generation`` of ``slot``'s storage."""
        return bool(self._counts[_KNOWN, slot] == generation)

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
        return PooledBatch(batch, self, slot, int(self._counts[_SENT, slot]))


_POOL: tuple[int, StoragePool] | None = None


def worker_pool() -> StoragePool:
    """This process's pool (a forked process makes its own)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), StoragePool())
    return _POOL[1]


class PooledBatch(dict[str, Any]):
    """A batch (dict of columns) some of whose tensors view one slot of a worker's pool: it pickles
    as those tensors' layout in the slot's storage, with the storage itself only until the main
    process holds it."""

    __slots__ = ("pool", "slot", "ticket", "storage", "generation")

    def __init__(self, columns: dict[str, Any], pool: StoragePool, slot: int, ticket: int) -> None:
        super().__init__(columns)
        self.pool, self.slot, self.ticket = pool, slot, ticket
        self.storage, self.generation = pool._storages[slot], pool._generations[slot]

    def __copy__(self) -> PooledBatch:  # torch's default_convert copies the batch in the worker
        return PooledBatch(self, self.pool, self.slot, self.ticket)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        import copy

        return copy.deepcopy(dict(self), memo)  # new memory, not the slot's (which stays busy)

    def __reduce__(self) -> tuple[Any, ...]:
        torch = _torch()
        address = self.storage.data_ptr()
        layout, others = {}, {}
        for name, value in self.items():
            if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() == address:
                layout[name] = (value.dtype, tuple(value.shape), value.stride(), value.storage_offset())
            else:
                others[name] = value
        pool = self.pool
        # read as it is pickled (in the queue's feeder thread): the latest word from the main process
        send = None if pool.known(self.slot, self.generation) else (self.storage, pool._counters)
        return _received, (list(self), layout, others, pool.id, pool.pid, self.slot, self.generation,
                           self.ticket, send)


# ------------------------------------------------------------------------------ the main process
_LOCK = threading.Lock()


class _PoolRecord:
    """What the main process holds of one worker's pool: its counters, the storages it was sent
    (slot -> (generation, storage)) and the tickets of the batches that arrived."""

    def __init__(self, pid: int, counters: Any) -> None:
        self.pid, self.counters = pid, counters
        self.storages: dict[int, tuple[int, Any]] = {}
        self.tickets: dict[int, deque[int]] = {}
        self.storages_received = 0  # batches that carried their storage (for tests and tuning)

    def finished(self) -> bool:
        """Its worker has exited and every batch it sent has arrived."""
        counts = self.counters.numpy()
        return not _alive(self.pid) and bool((counts[_SENT] == counts[_RELEASED]).all())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Arrivals:
    """The main process's record of pools, newest last."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.pools: OrderedDict[str, _PoolRecord] = OrderedDict()

    def storage(self, pool: str, pid: int, slot: int, generation: int, send: tuple[Any, Any] | None) -> Any:
        """The storage a batch from ``pool``'s ``slot`` views: the one it carries (kept, and the
        worker told), or the one kept from an earlier batch."""
        record = self.pools.get(pool)
        if send is not None:
            storage, counters = send
            if record is None:
                self._forget_finished()
                record = self.pools[pool] = _PoolRecord(pid, counters)
            record.storages[slot] = (generation, storage)
            record.storages_received += 1
            record.counters.numpy()[_KNOWN, slot] = generation  # from now on it sends the layout only
            return storage
        held = record.storages.get(slot) if record is not None else None
        if held is None or held[0] != generation:
            raise UsageError(f"a batch from torch worker {pid} was unpickled in process {os.getpid()}, which does "
                             f"not hold the shared memory it was sent in (slot {slot}): a worker's batch is "
                             "received by the process that iterates its DataLoader")
        return held[1]

    def arrived(self, pool: str, slot: int, ticket: int) -> None:
        """Count a batch's arrival once (a batch unpickled twice is one arrival)."""
        record = self.pools[pool]
        seen = record.tickets.setdefault(slot, deque(maxlen=64))
        if ticket not in seen:
            seen.append(ticket)
            record.counters.numpy()[_RELEASED, slot] += 1

    def _forget_finished(self) -> None:
        """Drop the pools of exited workers whose batches all arrived, and the oldest of the rest
        beyond ``_KEEP_UNFINISHED`` exited ones."""
        exited = []
        for pool, record in list(self.pools.items()):
            if record.finished():
                del self.pools[pool]
            elif not _alive(record.pid):
                exited.append(pool)
        for pool in exited[:max(0, len(exited) - _KEEP_UNFINISHED)]:
            del self.pools[pool]


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


def _view(storage: Any, dtype: Any, shape: tuple[int, ...], stride: tuple[int, ...], offset: int) -> Any:
    return _torch().empty(0, dtype=dtype).set_(storage, offset, shape, stride)


def _received(names: list[str], layout: dict[str, tuple[Any, ...]], others: dict[str, Any], pool: str, pid: int,
              slot: int, generation: int, ticket: int, send: tuple[Any, Any] | None) -> dict[str, Any]:
    """Unpickled in the main process: the batch with its pooled tensors copied into private memory,
    then its arrival counted (the worker may refill the slot from then on)."""
    if _POOL is not None and _POOL[1].id == pool:  # pickled and unpickled in the worker itself: not left
        storage = _POOL[1]._storages[slot]
        views = {name: _view(storage, *layout[name]) for name in layout}
        return {name: views[name] if name in views else others[name] for name in names}
    with _LOCK:
        storage = _arrivals().storage(pool, pid, slot, generation, send)
    views = {name: _view(storage, *layout[name]) for name in layout}
    out = in_one_storage({name: views[name] if name in views else others[name] for name in names},
                         list(layout), _private_storage)
    with _LOCK:
        _arrivals().arrived(pool, slot, ticket)
    return out


def counters(pool: str) -> Any:
    """A pool's counters as the main process sees them (rows: sent, released, refilled, known; a column per slot)."""
    with _LOCK:
        return _arrivals().pools[pool].counters.numpy().copy()


def pools() -> list[str]:
    """The pools this process holds, oldest first."""
    with _LOCK:
        return list(_arrivals().pools)


def storages_received(pool: str) -> int:
    """How many of a pool's batches carried their storage (the others carried only its layout)."""
    with _LOCK:
        return _arrivals().pools[pool].storages_received
