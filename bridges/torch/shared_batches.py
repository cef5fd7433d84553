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
  storage carry only their tensors' layout. That once, and every other storage a worker sends,
  goes over the socket its parent opened before forking it (:func:`_reduce_storage`,
  :mod:`~unihub.bridges.torch.fd_channel`), not over a connection of its own.

A slot is refilled only when

- in the worker, no tensor views it any more (the pool holds the only reference), and
- every batch sent from it has arrived in the main process and is done with there. As it unpickles
  a pooled batch (:func:`_received`), the main process copies the batch's columns into memory of its
  own (a column each), all but the biggest: that one (at least :data:`LEND_BYTES`) is *lent*, a view
  of the slot. The slot is released when nothing in the main process views it any more, which the
  main process checks as each later batch arrives (:meth:`_Arrivals.settle`). So keeping batches or
  slicing them is safe (the slot stays lent while anything views it: the worker takes new memory),
  and keeping one small column (a metric's labels) keeps only that column. A lent slot that could
  reach another process is *given up* instead (:meth:`_Arrivals.give_up`): when the main process
  forks, or pickles a tensor viewing it for another process (``ForkingPickler``: torch's queues). The
  worker then puts new memory in that slot and never writes the old one again.

Both processes write a small shared tensor of counters, each counter with one writer: the worker
counts the batches it sends from each slot (``sent``, as ``ForkingPickler`` pickles them: a batch
sent twice counts twice), the main process those it received and is done with (``released``, once
per sending: each carries a ticket), the generation of each slot's storage it holds (``known``: until
it equals the slot's, batches carry the storage; the counters themselves cross with the storages only
until the main process says it holds one) and the generation it gave up (``given up``: the worker
counts what was lent of it as never to be released). A slot is free when sent equals released (less
what was given up); a batch sent and never received (an iteration abandoned) leaves its slot busy for
good, and the pool allocates fresh memory, as torch does. The main process releases lent slots as any
item of a worker's arrives (:func:`_same`), pooled or not: a worker whose slots were all lent sends
new memory until one is released. A pool tensor that leaves the worker outside a pooled batch
(a ``collate_fn`` that rebuilds the batch, or returns a column beside it) is seen by torch's pickler,
and its storage is given up to its receiver, never refilled. Any other pickling of a pooled batch
(``pickle``, ``torch.save``) gives a plain dict of copies. The main process forgets a pool once its
worker has exited.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import uuid
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import numpy as np

from unihub.bridges.torch import _torch_private as torch_private
from unihub.bridges.torch import fd_channel
from unihub.errors import UsageError
from unihub.readers.batching import numpy_view
from unihub.runtime import processes
from unihub.schema.arrow_numpy import arrow_backed_empty

#: batches a worker's loader fills at once: an unshuffled loader decodes its images straight into a
#: slot, the batch being handed out and those decoding ahead of it (bridges/torch/base.py)
FILLING = 3
#: storages a worker keeps: the batches torch prefetches, those being filled, and the one or two
#: the main process is still reading (lent)
SLOTS = 5 + FILLING
#: a pooled batch's biggest column is lent to the main process rather than copied from this size
#: on (a copy of a batch of 64x64 JPEGs was ~40% of the main process's time with 2 workers)
LEND_BYTES = 64 * 2**10
#: rows of a pool's counters, a column per slot: batches sent (the worker writes), batches
#: received and done with (the main process writes), times a slot's storage was handed out again (the
#: worker writes; for tests and tuning), the generation of the slot's storage that the main process
#: holds (the main process writes; 0: none), the generation the main process gave up (it writes)
_SENT, _RELEASED, _REFILLED, _KNOWN, _GIVEN_UP = 0, 1, 2, 3, 4


def _torch() -> Any:
    import torch

    return torch


def _storage_of(tensor_or_storage: Any) -> Any:
    """The untyped storage a tensor views, or a (typed or untyped) storage's own."""
    obj = tensor_or_storage
    return obj.untyped_storage() if isinstance(obj, _torch().Tensor) else torch_private.untyped_storage(obj)


def _use_count(storage: Any) -> int:
    """References to ``storage``'s memory: 1 when only the pool's own storage object holds it."""
    return torch_private.storage_use_count(storage)


class StoragePool:
    """A worker's shared storages, each refilled only once nothing can see its contents (see the module)."""

    def __init__(self, slots: int = SLOTS) -> None:
        torch = _torch()
        self.id = uuid.uuid4().hex
        self.pid = os.getpid()
        self._counters = torch.zeros((5, slots), dtype=torch.int64).share_memory_()
        self._counts = self._counters.numpy()
        self._storages: list[Any] = [None] * slots
        self._generations = [0] * slots  # of each slot's storage: a new storage, a new generation
        #: batches sent from each slot that will never count as released (lent, then given up)
        self._lost = [0] * slots
        self._slots: dict[int, int] = {}  # a storage's data address -> its slot
        #: storages a tensor left the worker in other than as a pooled batch: given up, never refilled
        self._escaped: set[int] = set()
        self._sent_lock = threading.Lock()  # batches are counted as sent where they are pickled (any thread)
        #: a torch without the use count of a storage: no slot is ever known free, all memory is new
        self._reuse = torch_private.counts_storage_uses()
        _watch_tensors_leaving()
        _POOLS_HERE.add(self)

    def storage(self, nbytes: int) -> Any:
        """A shared storage of at least ``nbytes``: a free slot's (refilled by the caller), or new memory."""
        if not self._reuse:
            return torch_private.new_shared_storage(max(nbytes, 1))
        for i, held in enumerate(self._storages):
            if held is None:
                continue
            given_up = bool(self._counts[_GIVEN_UP, i] == self._generations[i])  # by the main process
            if given_up or held.data_ptr() in self._escaped:  # its owner is whoever holds it now
                if given_up:
                    self._lost[i] = int(self._counts[_SENT, i] - self._counts[_RELEASED, i])
                self._escaped.discard(held.data_ptr())
                del self._slots[held.data_ptr()]
                self._storages[i] = None
        free = [i for i, held in enumerate(self._storages) if held is None or self._free(i)]
        for i in free:
            held = self._storages[i]
            if held is not None and nbytes <= held.nbytes() <= 2 * nbytes:
                self._counts[_REFILLED, i] += 1
                return held
        storage = torch_private.new_shared_storage(max(nbytes, 1))
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
        storage = self._storages[slot]
        # the use count first: once nothing in this process views the slot, whatever pickled a view
        # of it (a pooled batch counting itself sent, torch's reducer giving it up) has done so
        if _use_count(storage) != 1 or storage.data_ptr() in self._escaped:
            return False
        if self._counts[_SENT, slot] - self._counts[_RELEASED, slot] != self._lost[slot]:
            return False
        # read after the release: the main process says it gave a slot up before it would release it
        return bool(self._counts[_GIVEN_UP, slot] != self._generations[slot])

    def known(self, slot: int, generation: int) -> bool:
        """Whether the main process holds generation ``generation`` of ``slot``'s storage."""
        return bool(self._counts[_KNOWN, slot] == generation)

    def counters_known(self) -> bool:
        """Whether the main process holds this pool's counters (it has said it holds some storage)."""
        return bool((self._counts[_KNOWN] > 0).any())

    def count_sent(self, slot: int) -> int:
        """Count one more batch sent from ``slot`` (busy until it arrives); its ticket."""
        with self._sent_lock:
            self._counts[_SENT, slot] += 1
            return int(self._counts[_SENT, slot])

    def leaving(self, tensor_or_storage: Any) -> None:
        """A tensor or storage is being pickled other than inside a pooled batch: if it views a slot,
        that slot's storage is given up (the receiver may keep it) and the slot gets new memory."""
        address = _storage_of(tensor_or_storage).data_ptr()
        if address in self._slots:
            self._escaped.add(address)

    def sending(self, batch: Any) -> Any:
        """``batch`` as it should leave the worker: a :class:`PooledBatch` when its tensors view one
        slot (the main process copies or borrows its columns, and counts it, when it unpickles it)."""
        torch = _torch()
        values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (tuple, list)) else ()
        addresses = {v.untyped_storage().data_ptr() for v in values if isinstance(v, torch.Tensor)}
        slots = {self._slots[address] for address in addresses if address in self._slots}
        if len(slots) != 1 or type(batch) is not dict:
            return batch  # nothing pooled, or a batch that cannot carry its slot: its tensors leave as torch's
        return PooledBatch(batch, self, slots.pop())


def receive_here() -> None:
    """Where a torch dataset is built (the process that will iterate its ``DataLoader``): the workers
    this process forks from now on hand it their storages over :mod:`~unihub.bridges.torch.fd_channel`."""
    fd_channel.open_here()


_POOL: tuple[int, StoragePool] | None = None


def worker_pool() -> StoragePool:
    """This process's pool (a forked process makes its own)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), StoragePool())
        _mark_result_queue()
    return _POOL[1]


class PooledBatch(dict[str, Any]):
    """A batch (dict of columns) some of whose tensors view one slot of a worker's pool. Sent to
    another process (``ForkingPickler``: torch's queues) it travels as those tensors' layout in the
    slot's storage, with the storage itself only until the main process holds it, and each sending
    counts as one batch sent, with a ticket of its own. Any other pickling (``pickle``,
    ``torch.save``) gives a plain dict of copies."""

    __slots__ = ("pool", "slot", "storage", "generation")

    def __init__(self, columns: dict[str, Any], pool: StoragePool, slot: int,
                 storage: Any = None, generation: int | None = None) -> None:
        super().__init__(columns)
        self.pool, self.slot = pool, slot
        self.storage = pool._storages[slot] if storage is None else storage
        self.generation = pool._generations[slot] if generation is None else generation

    def __copy__(self) -> PooledBatch:  # torch's default_convert copies the batch in the worker
        return PooledBatch(self, self.pool, self.slot, self.storage, self.generation)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        import copy

        return copy.deepcopy(dict(self), memo)  # new memory, not the slot's (which stays busy)

    def _pooled(self) -> list[str]:
        """The columns that travel as their layout: plain CPU tensors viewing the slot's storage
        (a tensor subclass, or one that requires grad, travels as torch sends it, with its type)."""
        torch = _torch()
        address = self.storage.data_ptr()
        return [name for name, value in self.items()
                if type(value) is torch.Tensor and not value.requires_grad
                and value.untyped_storage().data_ptr() == address]

    def __reduce__(self) -> tuple[Any, ...]:
        pooled = set(self._pooled())
        return dict, ({name: value.clone() if name in pooled else value for name, value in self.items()},)


def _reduce_pooled_batch(batch: PooledBatch) -> tuple[Any, ...]:
    """``ForkingPickler``'s reduction of a :class:`PooledBatch` (see the class)."""
    pooled = set(batch._pooled())
    layout = {name: (value.dtype, tuple(value.shape), value.stride(), value.storage_offset())
              for name, value in batch.items() if name in pooled}
    others = {name: value for name, value in batch.items() if name not in pooled}
    pool = batch.pool
    ticket = pool.count_sent(batch.slot)  # busy until this copy arrives (a batch sent twice: two)
    # read as it is pickled (in the queue's feeder thread): the latest word from the main process. The
    # counters cross with the storages until the main process holds some (each crossing is a descriptor
    # handed over a new connection)
    send = None if pool.known(batch.slot, batch.generation) else \
        (_ShippedStorage(batch.storage), None if pool.counters_known() else _ShippedStorage(pool._counters))
    return _received, (list(batch), layout, others, pool.id, pool.pid, batch.slot, batch.generation, ticket, send)


class _ShippedStorage:
    """A pool's storage (or counters tensor) as a pooled batch ships it: pickled by torch's own
    reducer (a storage: :func:`_reduce_storage`) directly, not through :func:`_watch_tensors_leaving`'s
    (which would give it up)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        return torch_private.reduce_tensor(self.value) if isinstance(self.value, _torch().Tensor) else \
            _reduce_storage(self.value)


def _reduce_storage(storage: Any) -> tuple[Any, ...]:
    """torch's reduction of an untyped storage; pickled for torch's result queue (by its feeder thread,
    see :func:`_mark_result_queue`), its descriptor goes over the channel to the parent where there is
    one (:mod:`~unihub.bridges.torch.fd_channel`): no connection, no handshake."""
    import torch.multiprocessing  # torch is optional

    if getattr(_FOR_PARENT, "on", False) and storage.device.type == "cpu" and storage.nbytes() > 0 \
            and torch.multiprocessing.get_sharing_strategy() == "file_descriptor":
        fd, nbytes = torch_private.share_fd_cpu(storage)  # into shared memory first, as torch's reduction does
        token = fd_channel.send(fd)
        if token is not None:
            return torch_private.rebuilt_from_fd(type(storage), _SentFd(token), nbytes)
    return torch_private.reduce_storage(storage)


class _SentFd:
    """Stands in for ``multiprocessing``'s ``DupFd`` in torch's ``rebuild_storage_fd``: the
    descriptor comes from the channel, by its token."""

    __slots__ = ("token",)

    def __init__(self, token: bytes) -> None:
        self.token = token

    def __reduce__(self) -> tuple[Any, ...]:
        return _SentFd, (self.token,)

    def detach(self) -> int:
        return fd_channel.receive(self.token)


_WATCHING = False
_POOLS_HERE: weakref.WeakSet[StoragePool] = weakref.WeakSet()  # the pools this process made


def in_torch_worker() -> None:
    """Called by the datasets in a torch worker: every storage the worker sends its parent in torch's
    result queue crosses on the parent's channel (:mod:`~unihub.bridges.torch.fd_channel`), pooled or not
    (a ``transform``'s rows, which torch's collate puts in new shared memory for each field of each
    batch: a handshake each, 0.35-0.58 s of the main process's time over 20,000 rows)."""
    _watch_tensors_leaving()
    _mark_result_queue()


#: ``on`` in the thread that pickles torch's result queue (its feeder thread), and only there: what
#: it pickles goes to the parent, so storages may cross on the parent's channel
_FOR_PARENT = threading.local()
_MARKED_IN = 0  # the process whose result queue is marked


def _mark_result_queue() -> None:
    """Wrap what this torch worker puts on its result queue (``data_queue`` of torch's worker loop,
    found on the stack, once per process) so that the thread pickling it says so (:class:`_ForParent`).
    Storages pickled for anything else (a queue of the user's own, a child) go torch's way, as does
    everything where torch's loop is not found."""
    global _MARKED_IN
    if _MARKED_IN == os.getpid():
        return
    # torch's loop runs in the worker's main thread; a dataset method may run in another
    frame: Any = sys._getframe(1) if threading.current_thread() is threading.main_thread() else \
        sys._current_frames().get(threading.main_thread().ident or 0)
    result_queue = torch_private.worker_result_queue(frame)
    _MARKED_IN = os.getpid()
    if result_queue is None:
        return
    put = result_queue.put

    def put_for_parent(obj: Any, block: bool = True, timeout: float | None = None) -> None:
        put(_ForParent(obj), block, timeout)

    result_queue.put = put_for_parent


class _ForParent:
    """An item of torch's result queue: pickled, it marks the pickling thread (the queue's own
    feeder) as the one whose storages go to the parent, and unpickles as the item itself."""

    __slots__ = ("item",)

    def __init__(self, item: Any) -> None:
        self.item = item

    def __reduce__(self) -> tuple[Any, ...]:
        _FOR_PARENT.on = True
        return _same, (self.item,)


def _same(item: Any) -> Any:
    """An item of a worker's result queue, unpickled in the main process: lent slots nothing views
    any more are released here too, not only when a pooled batch arrives (a worker whose slots were
    all lent sends unpooled batches until one is released)."""
    if _lending_here():
        with _LOCK:
            _ARRIVALS.settle()
    return item


def _watch_tensors_leaving() -> None:
    """In a torch worker (a process with a pool, or :func:`in_torch_worker`): every tensor or storage
    pickled for another process (by torch's reducers, which ``ForkingPickler`` calls) is first shown
    to this process's pools, so that memory leaving outside a pooled batch (a ``collate_fn`` returning
    a batch's column beside the batch, say) is never refilled under its receiver; storages then cross
    as :func:`_reduce_storage` sends them. In the main process (once a slot was lent) it is shown to
    the lent slots the same way (:func:`_lent_leaving`)."""
    global _WATCHING
    if _WATCHING:
        return
    from multiprocessing.reduction import ForkingPickler

    torch = _torch()
    for kind, original in ((torch.Tensor, torch_private.reduce_tensor), (torch.UntypedStorage, _reduce_storage),
                           (torch.TypedStorage, torch_private.reduce_typed_storage)):
        def watched(obj: Any, original: Callable[[Any], Any] = original) -> Any:
            for pool in list(_POOLS_HERE):
                if pool.pid == os.getpid():  # not a forked parent's
                    pool.leaving(obj)
            _lent_leaving(obj)
            return original(obj)

        ForkingPickler.register(kind, watched)
    ForkingPickler.register(PooledBatch, _reduce_pooled_batch)
    _WATCHING = True


# ------------------------------------------------------------------------------ the main process
_LOCK = threading.Lock()


def _new_lock_after_fork() -> None:
    global _LOCK
    _LOCK = threading.Lock()  # a thread of the parent may have held it at the fork
    _HELD_ACROSS_FORK.lock = None


os.register_at_fork(after_in_child=_new_lock_after_fork)


class _PoolRecord:
    """What the main process holds of one worker's pool: its counters, the storages it was sent
    (slot -> (generation, storage)) and the tickets of the batches that arrived."""

    def __init__(self, pid: int, counters: Any) -> None:
        self.pid, self.counters = pid, counters
        # with the pid, the worker's start time names it: a pid given to a later process after the
        # worker exited does not keep the record (and its storages) alive
        self.started = processes.start_time(pid)
        self.storages: dict[int, tuple[int, Any]] = {}
        self.tickets: dict[int, deque[int]] = {}
        #: slot -> batches of it that arrived with a column lent (released once nothing views the slot)
        self.lent: dict[int, int] = {}
        self.storages_received = 0  # batches that carried their storage (for tests and tuning)
        self.counters_received = 0  # batches that carried the counters too

    def running(self) -> bool:
        """Whether the worker still runs (an exited one, a zombie, or a later process given its pid: no)."""
        return processes.is_running(self.pid, self.started)


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
            if record is None and counters is not None:
                self._forget_exited()
                record = self.pools[pool] = _PoolRecord(pid, counters)
            if record is None:
                raise UsageError(f"a batch from torch worker {pid} was unpickled in process {os.getpid()}, which "
                                 "does not hold its pool: a worker's batch is received by the process that "
                                 "iterates its DataLoader")
            if counters is not None:
                record.counters_received += 1
            if slot in record.lent and record.storages[slot][0] != generation:
                # the worker gave the old storage up (a tensor left with it): it never writes it again
                record.counters.numpy()[_RELEASED, slot] += record.lent.pop(slot)
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

    def arrived(self, pool: str, slot: int, ticket: int, lent: bool) -> None:
        """Count a batch's arrival once (a batch unpickled twice is one arrival): released now, or,
        with a column ``lent``, once nothing views the slot (:meth:`settle`)."""
        record = self.pools[pool]
        seen = record.tickets.setdefault(slot, deque(maxlen=64))
        if ticket not in seen:
            seen.append(ticket)
            if lent:
                record.lent[slot] = record.lent.get(slot, 0) + 1
                _watch_tensors_leaving()  # a lent slot pickled for another process is given up
            else:
                record.counters.numpy()[_RELEASED, slot] += 1

    def settle(self) -> None:
        """Release every lent slot that nothing in this process views any more (the record's own
        storage object is its only user)."""
        for record in self.pools.values():
            for slot, count in list(record.lent.items()):
                if _use_count(record.storages[slot][1]) == 1:
                    record.counters.numpy()[_RELEASED, slot] += count
                    del record.lent[slot]

    def give_up(self, storage: Any = None) -> None:
        """Give up the lent slots still viewed (``storage``'s only, if given): something may read them
        from another process, so the worker never refills them (it puts new memory in the slot).

        Not released, so that the worker's only word is the generation (one counter: no ordering to
        trust between two). The worker counts a give-up of the slot's current storage as never to be
        released; one of a storage it had already dropped (a tensor left with it) before its next
        storage arrived here leaves that slot busy for good (new memory each batch instead)."""
        self.settle()
        address = None if storage is None else storage.data_ptr()
        for record in self.pools.values():
            for slot in list(record.lent):
                generation, held = record.storages[slot]
                if address is None or held.data_ptr() == address:
                    record.counters.numpy()[_GIVEN_UP, slot] = generation
                    del record.lent[slot]

    def lending(self) -> bool:
        return any(record.lent for record in list(self.pools.values()))  # list(): one step, no switch

    def _forget_exited(self) -> None:
        """Drop the pools of workers that have exited. Nothing more of theirs can arrive: torch
        reads every batch a worker sent before it stops the worker, or discards its queue."""
        for pool, record in list(self.pools.items()):
            if not record.running():
                del self.pools[pool]


_ARRIVALS = _Arrivals()


def _lending_here() -> bool:
    """Whether this process (not a forked parent) has slots lent to it right now."""
    return _ARRIVALS.pid == os.getpid() and _ARRIVALS.lending()


def _arrivals() -> _Arrivals:
    """This process's record (a process forked from one that had a record starts its own)."""
    global _ARRIVALS
    if _ARRIVALS.pid != os.getpid():
        _ARRIVALS = _Arrivals()
    return _ARRIVALS


def _private_copy(tensor: Any) -> Any:
    """``tensor`` copied into memory of this process's own (Arrow's pool: pages reused, not new), a
    storage of its own: keeping one column of a batch keeps only that column, as torch's batches do."""
    source = numpy_view(tensor)
    if not isinstance(source, np.ndarray):
        return tensor.clone()  # a dtype numpy lacks (bfloat16, say)
    target = arrow_backed_empty(source.shape, source.dtype)
    np.copyto(target, source)  # not torch's copy: its threads would spin beside the decoders
    return _torch().from_numpy(target)


def _view(storage: Any, dtype: Any, shape: tuple[int, ...], stride: tuple[int, ...], offset: int) -> Any:
    return _torch().empty(0, dtype=dtype).set_(storage, offset, shape, stride)


def _lent_column(layout: dict[str, tuple[Any, ...]]) -> str | None:
    """The pooled column a batch lends rather than copies: its biggest, from :data:`LEND_BYTES` on."""
    sizes = {name: math.prod(shape) * dtype.itemsize for name, (dtype, shape, *_) in layout.items()}
    biggest = max(sizes, key=sizes.__getitem__, default=None)
    return biggest if biggest is not None and sizes[biggest] >= LEND_BYTES else None


def _received(names: list[str], layout: dict[str, tuple[Any, ...]], others: dict[str, Any], pool: str, pid: int,
              slot: int, generation: int, ticket: int, send: tuple[Any, Any] | None) -> dict[str, Any]:
    """Unpickled in the main process: the batch with its pooled tensors copied into private memory
    but the biggest, which is lent (a view of the slot), then its arrival counted (the worker may
    refill the slot once nothing views it)."""
    if _POOL is not None and _POOL[1].id == pool:  # sent and received in the worker itself: not left
        own = _POOL[1]
        if own._generations[slot] != generation or own._storages[slot] is None:  # given up since
            raise UsageError(f"a batch of this worker's slot {slot} was received here after its memory was given up")
        views = {name: _view(own._storages[slot], *layout[name]) for name in layout}
        return {name: views[name] if name in views else others[name] for name in names}  # the slot stays busy
    with _LOCK:
        _arrivals().settle()
        storage = _arrivals().storage(pool, pid, slot, generation, send)
    lent = _lent_column(layout)
    columns = {name: _view(storage, *layout[name]) if name == lent else _private_copy(_view(storage, *layout[name]))
               for name in layout}
    out = {name: columns[name] if name in columns else others[name] for name in names}
    with _LOCK:
        _arrivals().arrived(pool, slot, ticket, lent is not None)
    return out


_HELD_ACROSS_FORK = threading.local()


def _give_up_before_fork() -> None:
    """A forked child would see a lent slot's memory change under it once the slot is released:
    the slots lent at a fork are given up (the worker puts new memory in them). The lock is held
    until the fork is done, so that nothing is lent between the give-up and the fork (other hooks
    may wait in between)."""
    if not _lending_here():
        return
    if not _LOCK.acquire(timeout=1.0):  # another thread holds it for more than a second: not ours to wait on
        return
    _HELD_ACROSS_FORK.lock = _LOCK
    _ARRIVALS.give_up()


def _release_after_fork_in_parent() -> None:
    lock = getattr(_HELD_ACROSS_FORK, "lock", None)
    if lock is not None:
        _HELD_ACROSS_FORK.lock = None
        lock.release()


def _lent_leaving(tensor_or_storage: Any) -> None:
    """A tensor or storage pickled for another process in the main process: a lent slot it views is given up."""
    if _lending_here():
        with _LOCK:
            _ARRIVALS.give_up(_storage_of(tensor_or_storage))


os.register_at_fork(before=_give_up_before_fork, after_in_parent=_release_after_fork_in_parent)


def counters(pool: str) -> Any:
    """A pool's counters as the main process sees them (rows: sent, released, refilled, known, given up;
    a column per slot)."""
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


def counters_received(pool: str) -> int:
    """How many of a pool's batches carried its counters (the first storage's batch, and any sent before the
    worker heard it arrived)."""
    with _LOCK:
        return _arrivals().pools[pool].counters_received
