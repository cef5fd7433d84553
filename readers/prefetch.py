"""Read-ahead from object storage: the row groups the plan reads next, fetched in parallel ranged GETs.

A reader over a remote filesystem spends most of a row group's time waiting for the store (a
request's latency, then the bytes at what one connection carries), so its workers would wait
in turn. :class:`RowGroupPrefetcher` walks the task sequence ahead of the workers, in the
plan's order, and fetches each row group's column chunks (the columns the reader reads,
coalesced where they lie close, cut in parts of ``part_bytes``) with ranged GETs from a pool of
``threads``; a worker then decodes from memory (``ParquetStore.read_row_group(fetched=...)``).

- **Bounded by bytes**: row groups fetched or being fetched and not yet taken by a worker are held
  to ``max_bytes`` (``read_ahead_mb`` of ``make_reader``; by default a sixteenth of the memory
  budget, 32 MiB), however big the objects are; one row group always goes, however big.
- **First batch first**: the first row group is fetched alone, in parts at once, before any other,
  so the first batch waits for one row group's bytes, not for the window's.
- **Order and resume unchanged**: it only moves bytes earlier. The tasks go to the workers in the
  order they come; a row group not fetched (or fetched and dropped) is read as without it.
- **Stopped with the reader**: :meth:`close` cancels the fetches not started and drops what was
  fetched; :meth:`join` waits for the GETs under way (each bounded by the remote timeout).

:class:`ByteBudget` is the byte bound itself, shared with the conversions' read-ahead
(``converters/readahead.py``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from unihub.fs import remote
from unihub.store.dataset import FetchedRanges, ParquetStore

T = TypeVar("T")

#: the most bytes one ranged GET asks for (a row group's chunks are cut in parts of this size)
PART_BYTES = 8 << 20
#: the first row group's parts, all fetched at once, so that the first batch comes early (1 MiB parts
#: made it later here: each request costs the server more than 1 MB at 200 MB/s; a real store's
#: connection carries 50-100 MB/s, where smaller parts would pay)
FIRST_PART_BYTES = 4 << 20
#: chunks closer than this are fetched in one GET (the bytes between are read and dropped)
HOLE_BYTES = 1 << 20
#: parallel ranged GETs
DEFAULT_THREADS = 8
#: a fetched row group no task took within this many tasks after the last that reads it is dropped
STALE_AFTER_TASKS = 256
#: the most tasks pulled ahead of those handed on (row groups cut in many small tasks share one fetch)
MAX_TASKS_AHEAD = 4096
#: how long a worker waits for its row group's fetch to start before it reads the row group itself
STALL_SECONDS = 2.0


class ByteBudget:
    """Bytes held by items produced and not yet consumed, bounded: :meth:`acquire` waits (or
    :meth:`try_acquire` refuses) while ``max_bytes`` would be passed, unless nothing is held (one
    item always goes, however big). ``peak`` is the most ever held."""

    def __init__(self, max_bytes: int | None) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        self.peak = 0
        self.changed = threading.Condition()

    def fits(self, nbytes: int) -> bool:
        return self.max_bytes is None or self.held == 0 or self.held + nbytes <= self.max_bytes

    def try_acquire(self, nbytes: int) -> bool:
        with self.changed:
            if not self.fits(nbytes):
                return False
            self._add(nbytes)
            return True

    def acquire(self, nbytes: int, stop: threading.Event | None = None, poll: float = 0.1,
                full: Callable[[], bool] | None = None) -> bool:
        """Hold ``nbytes`` once they fit (and, with ``full``, once it says False); False when ``stop``
        is set first."""
        with self.changed:
            while not self.fits(nbytes) or (full is not None and full()):
                if stop is not None and stop.is_set():
                    return False
                self.changed.wait(poll)
            if stop is not None and stop.is_set():
                return False
            self._add(nbytes)
            return True

    def _add(self, nbytes: int) -> None:
        self.held += nbytes
        self.peak = max(self.peak, self.held)
        self.changed.notify_all()

    def release(self, nbytes: int) -> None:
        with self.changed:
            self.held -= nbytes
            self.changed.notify_all()


@dataclass
class _Fetch:
    """One row group's fetch: its parts' futures, bytes, and the last task (sequence number) reading it."""

    row_group: int
    nbytes: int
    parts: list[Future[tuple[int, Any]]]
    last_task: int
    taken: bool = False


@dataclass
class PrefetchStats:
    """What the read-ahead did: row groups and bytes fetched, GETs, the most bytes held at once,
    row groups taken by the workers, and those fetched for nothing (dropped unread)."""

    row_groups: int = 0
    bytes: int = 0
    requests: int = 0
    peak_bytes: int = 0
    taken: int = 0
    dropped: int = 0


class RowGroupPrefetcher:
    """Fetches the row groups of the tasks that :meth:`tasks` hands on, ahead of the workers."""

    def __init__(self, store: ParquetStore, columns: Sequence[str] | None, max_bytes: int,
                 threads: int = DEFAULT_THREADS, part_bytes: int = PART_BYTES) -> None:
        self.store = store
        self.columns = list(columns) if columns is not None else None
        self.budget = ByteBudget(max(1, max_bytes))
        self.part_bytes = max(1, part_bytes)
        self.stats = PrefetchStats()
        self._executor = ThreadPoolExecutor(max(1, threads), thread_name_prefix="unihub-prefetch")
        self._changed = threading.Condition(threading.RLock())
        self._fetches: dict[int, deque[_Fetch]] = {}
        self._order: deque[_Fetch] = deque()  # fetches in task order, for dropping stale ones
        self._source: Iterator[Any] | None = None
        self._to_hand: deque[Any] = deque()  # tasks pulled from the source, not yet handed on
        self._unscheduled: deque[tuple[int, int]] = deque()  # (sequence number, row group) pulled, not fetched
        self._pulled = 0  # tasks pulled from the source
        self._handed = 0  # tasks handed on to the workers
        self._last: _Fetch | None = None  # the last fetch started (tasks cut from its row group share it)
        self._first: _Fetch | None = None
        self._closed = False
        self._handles = store.remote_handles  # open files, where opening costs a request (remote.read_range)
        self._opening = threading.Lock()

    # -- the task sequence ----------------------------------------------------------------------
    def begin(self, tasks: Iterable[Any]) -> None:
        """Start fetching the row groups of ``tasks`` now, before :meth:`tasks` hands any on (a reader's
        read-ahead begins when the reader is made): the first row group's GETs go out at once."""
        with self._changed:
            self._source = iter(tasks)
            self._fill()

    def tasks(self, tasks: Iterable[T] | None = None) -> Iterator[T]:
        """``tasks`` (None: those given to :meth:`begin`) as they come, the row groups of those ahead
        fetched meanwhile (``job[2].row_group`` of a reader's ``(epoch, index, ReadTask)`` jobs)."""
        if tasks is not None:
            self._source = iter(tasks)
        while True:
            with self._changed:
                self._fill()
                if not self._to_hand and not self._pull():
                    return
                task = self._to_hand.popleft()
                self._handed += 1
                self._drop_stale()
                self._changed.notify_all()
            yield task

    def _pull(self) -> bool:
        """One more task from the source; False at its end, when closed, or too far ahead."""
        if self._closed or self._source is None or self._pulled - self._handed >= MAX_TASKS_AHEAD:
            return False
        task = next(self._source, None)
        if task is None:
            self._source = None
            return False
        self._to_hand.append(task)
        self._unscheduled.append((self._pulled, task[2].row_group))
        self._pulled += 1
        return True

    def _fill(self) -> None:
        """Start fetches for the tasks ahead, in order, while the budget allows (only the first row
        group's until it has arrived)."""
        while not self._closed:
            if self._first is not None and not all(p.done() for p in self._first.parts):
                return
            if not self._unscheduled and not self._pull():
                return
            sequence, row_group = self._unscheduled[0]
            if self._last is not None and self._last.row_group == row_group:
                self._last.last_task = sequence  # tasks cut from one row group: one fetch
                self._unscheduled.popleft()
                continue
            ranges = self._ranges(row_group)
            nbytes = sum(stop - start for start, stop in ranges)
            if not self.budget.try_acquire(nbytes):
                return
            self._unscheduled.popleft()
            self._start(row_group, ranges, nbytes, sequence)

    def _ranges(self, row_group: int) -> list[tuple[int, int]]:
        """The byte ranges of the row group's column chunks (those read), coalesced and cut in parts."""
        spans = self.store.chunk_spans(row_group, self.columns)
        merged: list[list[int]] = []
        for start, stop in sorted(spans):
            if merged and start - merged[-1][1] <= HOLE_BYTES:
                merged[-1][1] = max(merged[-1][1], stop)
            else:
                merged.append([start, stop])
        part = FIRST_PART_BYTES if self._first is None else self.part_bytes
        return [(offset, min(stop, offset + part)) for start, stop in merged for offset in range(start, stop, part)]

    def _start(self, row_group: int, ranges: list[tuple[int, int]], nbytes: int, sequence: int) -> None:
        path = self.store.row_groups[row_group].path
        parts = [self._executor.submit(self._get, path, start, stop) for start, stop in ranges]
        fetch = _Fetch(row_group, nbytes, parts, sequence)
        self._fetches.setdefault(row_group, deque()).append(fetch)
        self._order.append(fetch)
        self._last = fetch
        self.stats.row_groups += 1
        self.stats.requests += len(parts)
        self.stats.peak_bytes = self.budget.peak
        if self._first is None:
            self._first = fetch
            for part in parts:
                part.add_done_callback(self._refill)
        self._changed.notify_all()

    def _get(self, path: str, start: int, stop: int) -> tuple[int, Any]:
        with self._opening:  # one open file per path (pyarrow's S3: a HEAD request each), however many threads
            if path not in self._handles and not remote.reads_ranges(self.store.filesystem):
                remote.read_range(self.store.filesystem, path, start, start, self._handles)
        data = remote.read_range(self.store.filesystem, path, start, stop, self._handles)
        with self._changed:
            self.stats.bytes += len(data)
        return start, data

    def _refill(self, _: Future[Any]) -> None:
        with self._changed:
            if not self._closed:
                self._fill()
            self._changed.notify_all()

    def _drop_stale(self) -> None:
        """Drop fetched row groups no task took although the tasks reading them are long handed on
        (a task served by another read: the loader's recent reads, or a retry after an error)."""
        while self._order and (self._order[0].taken or self._order[0].last_task + STALE_AFTER_TASKS < self._handed):
            fetch = self._order.popleft()
            if not fetch.taken:
                self._discard(fetch)
                self.stats.dropped += 1

    def _discard(self, fetch: _Fetch, cancel: bool = True) -> None:
        """Forget ``fetch`` (taken by a worker, or dropped: then its GETs not started are cancelled)."""
        fetch.taken = True
        queue = self._fetches.get(fetch.row_group)
        if queue is not None and fetch in queue:
            queue.remove(fetch)
            if not queue:
                del self._fetches[fetch.row_group]
        if cancel:
            for part in fetch.parts:
                part.cancel()
        self.budget.release(fetch.nbytes)

    # -- the workers' side ----------------------------------------------------------------------
    def take(self, row_group: int) -> FetchedRanges | None:
        """The fetched bytes of ``row_group`` (waiting for its GETs under way), or None where it is not
        fetched for a task handed on; a failed GET raises here, in the worker, as the read would have.

        A task handed on before its row group's fetch could start (the first row group was still
        arriving, or the budget was full) waits for it to start: the tasks before it free the budget
        as they take theirs. After ``STALL_SECONDS`` without it, the worker reads the row group itself."""
        deadline = time.monotonic() + STALL_SECONDS
        with self._changed:
            while True:
                queue = self._fetches.get(row_group)
                if queue:
                    fetch = queue[0]
                    self._discard(fetch, cancel=False)
                    self.stats.taken += 1
                    self._fill()
                    break
                waiting = next((i for i, (sequence, group) in enumerate(self._unscheduled)
                                if group == row_group and sequence < self._handed), None)
                if waiting is None or self._closed:
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    del self._unscheduled[waiting]  # read by the worker: not fetched
                    return None
                self._changed.wait(min(left, 0.1))
        info = self.store.row_groups[row_group]
        try:
            parts = [part.result() for part in fetch.parts]
        except (OSError, pa.ArrowException) as exc:  # named as the store's own read would be: file, row group, bytes
            raise self.store.read_error(exc, info, self.columns) from exc
        return FetchedRanges(self.store.filesystem, info.path, parts, self.store.file_size(info.path))

    # -- stopping -------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (it fetches nothing more)."""
        return self._closed

    def close(self) -> None:
        """Cancel the fetches not started, drop what was fetched (the GETs under way finish)."""
        with self._changed:
            self._closed = True
            for fetch in list(self._order):
                if not fetch.taken:
                    self._discard(fetch)
            self._order.clear()
            self._to_hand.clear()
            self._unscheduled.clear()
            self._changed.notify_all()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def join(self) -> None:
        """Wait for the fetch threads to exit (after :meth:`close`)."""
        self.close()
        self._executor.shutdown(wait=True, cancel_futures=True)
