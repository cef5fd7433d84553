"""Read ahead: produce the next batches in a thread while the caller writes this one.

Conversions alternate reading the source (h5py, a tar parser) and writing the target
(pyarrow's Parquet writer, file creation), and the writing side releases the GIL. Pulling
the source's batches from a background thread overlaps the two. What waits between the two
is bounded by items and by bytes, so batches of camera frames do not pile up:

    for batch in read_ahead(source.read_batches(schema), depth=2, max_bytes=64 << 20):
        writer.write(batch)
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from unihub.readers.prefetch import ByteBudget
from unihub.runtime.memory import batch_nbytes

T = TypeVar("T")

_DONE = object()


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def read_ahead(items: Iterable[T], depth: int = 2, max_bytes: int | None = None,
               size_of: Callable[[Any], int] = batch_nbytes) -> Iterator[T]:
    """``items``, produced up to ``depth`` items and ``max_bytes`` bytes ahead in a daemon thread.

    The bytes of an item are ``size_of(item)`` (a column batch's bytes by default); one item is
    always let through, however big. An exception in the producer is raised here, at the point
    it happened in the sequence. Closing this iterator early (a writer error, Ctrl-C) stops the
    producer after the item it is working on, and waits for it, so nothing reads the source
    afterwards.
    """
    depth = max(1, depth)
    ready: deque[tuple[object, int]] = deque()
    budget = ByteBudget(max_bytes)  # the bytes of the items in ``ready`` (the remote read-ahead's bound too)
    changed = budget.changed
    stop = threading.Event()

    def put(item: object, nbytes: int) -> bool:
        if not budget.acquire(nbytes, stop, full=lambda: len(ready) >= depth):
            return False
        with changed:
            ready.append((item, nbytes))
            changed.notify_all()
        return True

    def produce() -> None:
        try:
            for item in items:
                if not put(item, size_of(item) if max_bytes is not None else 0):
                    return
            put(_DONE, 0)
        except BaseException as exc:  # noqa: BLE001  (handed to the consumer, raised there)
            put(_Failed(exc), 0)
        finally:
            close = getattr(items, "close", None)
            if close is not None and stop.is_set():
                close()

    thread = threading.Thread(target=produce, name="unihub-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            with changed:
                while not ready:
                    changed.wait()
                item, nbytes = ready.popleft()
                budget.release(nbytes)
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        with changed:
            changed.notify_all()
        thread.join()
