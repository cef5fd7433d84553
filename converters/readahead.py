"""Read ahead: produce the next batches in a thread while the caller writes this one.

Conversions alternate reading the source (h5py, a tar parser) and writing the target
(pyarrow's Parquet writer, file creation), and the writing side releases the GIL. Pulling
the source's batches from a background thread overlaps the two.

    for batch in read_ahead(source.read_batches(schema), depth=2):
        writer.write(batch)
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

_DONE = object()


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def read_ahead(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """``items``, produced up to ``depth`` ahead in a daemon thread.

    An exception in the producer is raised here, at the point it happened in the sequence.
    Closing this iterator early (a writer error, Ctrl-C) stops the producer after the item
    it is working on, and waits for it, so nothing reads the source afterwards.
    """
    handoff: queue.Queue[object] = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as exc:  # noqa: BLE001  (handed to the consumer, raised there)
            put(_Failed(exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None and stop.is_set():
                close()

    thread = threading.Thread(target=produce, name="unihub-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item = handoff.get()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        thread.join()
