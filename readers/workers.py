"""Worker pools: thread (default), process, and dummy, all with the same ordered, bounded map.

:meth:`Pool.imap` runs a function over an iterator of tasks with at most ``window`` tasks
in flight and yields results **in task order**, so the delivery order never depends on
the pool type or worker count. Memory is bounded by the window, however long (or
endless) the task iterator is, and by bytes where ``max_bytes`` is given: big results (row
groups of camera frames) keep fewer tasks in flight, never fewer than one per worker. An exception in a worker is re-raised in the consumer
with its original traceback; :meth:`Pool.stop` cancels what has not started.

- ``thread``: pyarrow reads and the image decoders release the GIL, so threads scale.
- ``process``: for Python-heavy transforms and predicates. Uses ``fork`` where available,
  so the loader (with its lambdas) reaches the workers without pickling; results come back
  as numpy arrays (pickle protocol 5 moves their buffers without per-row work).
- ``dummy``: runs each task in the consumer's thread when its result is needed (debugging).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import (
    BrokenExecutor,
    CancelledError,
    Executor,
    Future,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
)
from typing import Any, Literal, TypeVar

import numpy as np

from unihub.errors import InvalidArgumentError
from unihub.runtime.lifeline import die_with_parent

T = TypeVar("T")
R = TypeVar("R")
PoolType = Literal["thread", "process", "dummy"]
#: how long :meth:`Pool.join` lets process workers finish their task before terminating them
JOIN_TIMEOUT_SECONDS = 30.0

_PROCESS_FUNCTION: Callable[[Any], Any] | None = None
_NO_TASK: Any = object()


def _install_function(fn: Callable[[Any], Any], parent: int | None = None) -> None:
    """A process worker's initializer: keep ``fn``, and end with the reader's process ``parent``
    (polled: the thread that forked the workers may end before the reader is done)."""
    global _PROCESS_FUNCTION
    _PROCESS_FUNCTION = fn
    if parent is not None:
        die_with_parent(parent, kernel=False)


def _call_installed(task: Any) -> Any:
    assert _PROCESS_FUNCTION is not None, "worker started without its function"
    return _PROCESS_FUNCTION(task)


def check_pool_arguments(pool_type: Any, workers_count: Any) -> None:
    """Refuse a pool that cannot be made, when the reader is made (not at its first row)."""
    if pool_type not in ("thread", "process", "dummy"):
        raise InvalidArgumentError(f"Unknown reader_pool_type: {pool_type!r}; reader_pool_type must be 'thread', "
                                   "'process' or 'dummy'")  # Petastorm's words first
    if not isinstance(workers_count, (int, np.integer)) or isinstance(workers_count, bool) or workers_count < 1:
        raise InvalidArgumentError(f"workers_count must be an int >= 1 (or None: chosen for the dataset), "
                                   f"got {workers_count!r}")


class Pool:
    """Ordered, bounded parallel map over a task iterator."""

    def __init__(self, pool_type: PoolType = "thread", workers_count: int = 4) -> None:
        check_pool_arguments(pool_type, workers_count)
        self.pool_type = pool_type
        self.workers_count = workers_count
        self._executor: Executor | None = None
        self._pending: deque[Future[Any]] = deque()
        self._stopped = False
        self._submitted = 0  # tasks handed to the workers (counted by the consumer's thread only)
        self._yielded = 0  # results handed to the consumer
        #: what join() waits for: the worker processes and the executor's manager thread, noted
        #: before a shutdown without waiting drops the executor's own references to them
        self._processes: list[Any] = []
        self._threads: list[threading.Thread] = []

    def _start(self, fn: Callable[[Any], Any]) -> Executor | None:
        if self.pool_type == "thread":
            return ThreadPoolExecutor(self.workers_count, thread_name_prefix="unihub-worker")
        if self.pool_type == "process":
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            return ProcessPoolExecutor(self.workers_count, mp_context=multiprocessing.get_context(method),
                                       initializer=_install_function, initargs=(fn, os.getpid()))
        return None

    def imap(self, fn: Callable[[T], R], tasks: Iterable[T], window: int, *, max_bytes: int | None = None,
             size_of: Callable[[R], int] | None = None) -> Iterator[R]:
        """Yield ``fn(task)`` for each task, in order, keeping at most ``window`` in flight.

        With ``max_bytes`` and ``size_of`` (a result's bytes), tasks in flight are also held to
        about ``max_bytes`` at the largest result size seen so far, never fewer than one per worker;
        until a result is seen, one per worker.
        """
        window = max(1, window)
        limit = window if max_bytes is None or size_of is None else min(window, self.workers_count)
        largest = 0
        self._executor = self._start(fn)
        if self._stopped:  # stop() came before the first next(): start nothing (join() may be over)
            self.stop()
            return
        task_iter = iter(tasks)
        if self._executor is None:
            for task in task_iter:
                if self._stopped:
                    return
                self._submitted += 1
                result = fn(task)
                self._yielded += 1
                yield result
            return
        submit = self._submitter(fn)
        try:
            for task in task_iter:
                self._pending.append(submit(task))
                if len(self._pending) >= limit:
                    break
            while self._pending and not self._stopped:
                try:
                    future = self._pending.popleft()
                except IndexError:  # stop() from another thread emptied it since the check
                    return
                try:
                    result = future.result()
                except (CancelledError, BrokenExecutor):
                    if self._stopped:  # stop() from another thread cancelled the task we waited for
                        return  # (or join() terminated the worker that ran it)
                    raise
                if size_of is not None and max_bytes is not None:
                    largest = max(largest, size_of(result))
                    limit = max(min(self.workers_count, window), min(window, max_bytes // max(1, largest)))
                while not self._stopped and len(self._pending) < limit:
                    task = next(task_iter, _NO_TASK)
                    if task is _NO_TASK:
                        break
                    self._pending.append(submit(task))
                self._yielded += 1
                yield result
        finally:
            self.stop()

    def _submitter(self, fn: Callable[[Any], Any]) -> Callable[[Any], Future[Any]]:
        executor = self._executor
        assert executor is not None
        target = _call_installed if self.pool_type == "process" else fn

        def submit(task: Any) -> Future[Any]:
            try:
                future = executor.submit(target, task)
            except RuntimeError:
                if not self._stopped:
                    raise
                cancelled: Future[Any] = Future()  # stop() from another thread shut the executor down
                cancelled.cancel()                 # between the consumer's check and this submit
                return cancelled
            self._submitted += 1
            return future
        return submit

    def threads_to_share(self) -> Executor | None:
        """The pool's worker threads, for more work of the reader's (decoding images drawn from a
        shuffling queue, readers/late_decode.py): None for processes or no pool, before it started and
        once it stopped. Its stop cancels what is queued there (submit then raises RuntimeError)."""
        executor = self._executor
        return executor if self.pool_type == "thread" and not self._stopped else None

    def stop(self) -> None:
        """Cancel tasks not yet started and release the workers (does not wait for running ones)."""
        self._stopped = True
        for future in list(self._pending):  # a snapshot: the consumer may be popping in another thread
            future.cancel()
        self._pending.clear()
        executor = self._executor  # once: join() in another thread may be letting go of it
        if executor is not None:
            self._note_workers(executor)
            executor.shutdown(wait=False, cancel_futures=True)

    def join(self, timeout: float = JOIN_TIMEOUT_SECONDS) -> None:
        """Wait for the workers to exit: threads, and processes, which finish the task they run.

        Process workers still running after ``timeout`` seconds (a transform that never returns)
        are terminated, so that this returns only when none is left.
        """
        executor = self._executor
        if executor is not None:
            self._note_workers(executor)
            executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for process in self._processes:
            if not _exits(process, max(0.0, deadline - time.monotonic())):
                process.terminate()
                if not _exits(process, 1.0):
                    process.kill()  # gone now: reaped here, or by the manager thread
                    process.join()
        self._processes, self._threads = [], []

    def _note_workers(self, executor: Executor) -> None:
        """Remember a process pool's workers and manager thread (CPython keeps them in private
        attributes and forgets them at a shutdown that does not wait). Read under the executor's
        lock, which a submit holds while it starts workers: a worker started but not yet recorded
        (a stop() from another thread at that moment) is waited for, not missed."""
        with getattr(executor, "_shutdown_lock", None) or contextlib.nullcontext():
            processes = getattr(executor, "_processes", None) or {}
            self._processes.extend(p for p in list(processes.values()) if p not in self._processes)
            manager = getattr(executor, "_executor_manager_thread", None)
        if manager is not None and manager not in self._threads:
            self._threads.append(manager)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def diagnostics(self) -> dict[str, int]:
        """Petastorm's pool counters, of this pool's tasks: ``items_consumed`` handed to the workers,
        ``items_produced`` done by them, ``items_inprocess`` handed out and not done yet,
        ``output_queue_size`` done and waiting for the consumer."""
        pending = list(self._pending)  # a snapshot: the consumer may be popping in another thread
        waiting = sum(1 for future in pending if future.done() and not future.cancelled())
        return {"items_consumed": self._submitted, "items_produced": self._yielded + waiting,
                "items_inprocess": self._submitted - self._yielded - waiting, "output_queue_size": waiting}


def _exits(process: Any, timeout: float) -> bool:
    """Whether ``process`` has exited within ``timeout`` seconds. Its sentinel says so without reaping
    it (the executor's manager thread may be joining it at the same moment, and two threads waiting on
    one child race: one reaps it, the other sees no such child and takes it for running); its exit code,
    where the sentinel cannot (a child it forked holds the sentinel's pipe open after it is gone)."""
    from multiprocessing.connection import wait

    deadline = time.monotonic() + timeout
    try:
        while True:
            if wait([process.sentinel], min(0.05, max(0.0, deadline - time.monotonic()))) or \
                    process.exitcode is not None:
                process.join(0)  # reaped here, unless the manager thread got to it first
                return True
            if time.monotonic() >= deadline:
                return False
    except ValueError:  # closed: it was joined and released
        return True


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS says, else every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
