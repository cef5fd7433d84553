"""read_ahead: the same items in order, errors where they happened, and a producer that stops."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from unihub.converters.readahead import read_ahead


def test_items_come_in_order_and_ahead_in_another_thread() -> None:
    threads: list[str] = []

    def items() -> Iterator[int]:
        for i in range(50):
            threads.append(threading.current_thread().name)
            yield i

    assert list(read_ahead(items(), depth=3)) == list(range(50))
    assert set(threads) == {"unihub-read-ahead"}


def test_an_error_is_raised_after_the_items_before_it() -> None:
    def items() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("record 3 is bad")

    got = []
    with pytest.raises(ValueError, match="record 3 is bad"):
        for item in read_ahead(items()):
            got.append(item)
    assert got == [1, 2]


def test_closing_early_stops_the_producer_and_closes_the_source() -> None:
    produced = []
    closed = threading.Event()

    def items() -> Iterator[int]:
        try:
            for i in range(10_000):
                produced.append(i)
                yield i
        finally:
            closed.set()

    stream = read_ahead(items(), depth=2)
    assert next(stream) == 0
    stream.close()  # what a writer error or Ctrl-C does to the generator
    assert closed.wait(2)
    count = len(produced)
    time.sleep(0.2)
    assert len(produced) == count < 10  # nothing read after the close
