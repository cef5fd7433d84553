"""Which rows of its reader a shuffled :func:`~unihub.bridges.tf.dataset.make_tf_dataset` handed out, in order.

A dataset over a reader given to it, with a ``shuffle_buffer``, hands its rows out in another order than
the reader's: the model's first ``n`` rows are not the reader's first ``n``. The dataset records here the
stream position (the row's place in the reader's output since the iteration began) of each row it hands
out, and :class:`~unihub.bridges.tf.checkpoint.ReaderPosition` turns the rows the model took into the
reader's position and the rows past it already taken (a reader state's ``skip`` and ``exclude``), so that
the rows that sat in the buffer are read again, and no others. No TensorFlow here: the dataset module
imports it.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np


class Emitted:
    """The stream positions of the rows handed out since the iteration began, in order: 8 bytes a row
    handed out since the last :meth:`taken` (a position saved), which folds them into what it returns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: a shuffled dataset's iteration records here (else the rows reach the model in the reader's order)
        self.active = False
        self.reset()

    def start(self) -> None:
        """A shuffled dataset's new iteration: its positions count from the reader's position then."""
        self.reset()
        self.active = True

    def reset(self) -> None:
        """Nothing handed out (the reader was put elsewhere); not :attr:`active` until an iteration starts."""
        with self._lock:
            self.active = False
            self._chunks: list[np.ndarray] = []
            self._folded_rows = 0  # rows handed out that :meth:`taken` folded into the next two
            self._low = 0  # every position below it was handed out among those rows
            self._above: np.ndarray = np.empty(0, np.int64)  # and these above it

    def add(self, positions: np.ndarray) -> None:
        with self._lock:
            self._chunks.append(np.asarray(positions, np.int64))

    def taken(self, rows: int) -> tuple[int, np.ndarray]:
        """The first ``rows`` rows handed out as ``(low, above)``: every position below ``low``, and the
        positions ``above`` (sorted, all > ``low``); ``rows`` may not go back below an earlier call's."""
        with self._lock:
            if rows < self._folded_rows:
                raise ValueError(f"{rows} rows taken, fewer than the {self._folded_rows} counted before")
            parts, left = [self._above], rows - self._folded_rows
            while left and self._chunks:
                chunk = self._chunks[0]
                parts.append(chunk[:left])
                if left < len(chunk):
                    self._chunks[0] = chunk[left:]
                    left = 0
                else:
                    self._chunks.pop(0)
                    left -= len(chunk)
            if left:
                raise ValueError(f"{rows} rows taken, more than the {rows - left} handed out")
            held = np.unique(np.concatenate(parts))
            held = held[held >= self._low]
            # the run of consecutive positions from low on joins the part below it
            gaps = np.flatnonzero(held != self._low + np.arange(len(held)))
            run = int(gaps[0]) if len(gaps) else len(held)
            self._low, self._above, self._folded_rows = self._low + run, held[run:], rows
            return self._low, self._above.copy()


_emitted: weakref.WeakKeyDictionary[Any, Emitted] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def emitted_for(reader: Any) -> Emitted:
    """The record of ``reader``'s rows, made with a ReaderPosition of it: shuffled datasets over the reader
    record into it (none is kept for a reader no position counts)."""
    with _registry_lock:
        if reader not in _emitted:
            _emitted[reader] = Emitted()
        return _emitted[reader]


def emitted_of(reader: Any) -> Emitted | None:
    """The record of ``reader``'s rows where a ReaderPosition counts them; None where none does."""
    with _registry_lock:
        return _emitted.get(reader)

