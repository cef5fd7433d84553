"""What a conversion or copy has done so far (rows, input bytes), shown through :mod:`unihub.runtime.progress`."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from unihub.runtime import progress as _progress
from unihub.runtime.memory import batch_nbytes


class ProgressMeter:
    """Counts rows (and bytes) through the pipeline and shows them on stderr.

    Shows rows, MB, rows/s and an ETA. MB is input bytes when the source reports them
    (``bytes_read()``, or :meth:`advance` from the worker engine) against ``total_bytes`` (a
    tqdm bar then fills by bytes), else the in-memory size of the batches (the bar fills by
    rows against ``total_rows``). Shown on a terminal by default; ``enabled=True`` shows it
    anywhere (plain lines where stderr is not a terminal), ``enabled=False`` (``--quiet``) and
    :func:`unihub.runtime.progress.disable_progress_bar` never.
    """

    def __init__(self, *, enabled: bool | None = None, total_rows: int | None = None, total_bytes: int | None = None,
                 bytes_read: Callable[[], int] | None = None, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = _progress.should_show(enabled, self.stream)
        self.total_rows = total_rows
        self.total_bytes = total_bytes or None
        self.bytes_read = bytes_read
        self.rows = 0
        self.batch_bytes = 0
        self.input_bytes = 0
        self.start = time.perf_counter()
        self._last = 0.0
        self._display: _progress.Display | None = None
        self._by_bytes = False

    def count(self, batches: Iterable[Any]) -> Iterator[Any]:
        """``batches`` as they are, counted on their way."""
        for batch in batches:
            self.rows += _batch_rows(batch)
            if self.enabled:  # the bar's MB until the source has counted input bytes
                self.batch_bytes += batch_nbytes(batch)
                self._draw()
            yield batch

    def advance(self, rows: int, input_bytes: int) -> None:
        """Record work done elsewhere (a finished worker task)."""
        self.rows += rows
        self.input_bytes += input_bytes
        self._draw()

    def done_bytes(self) -> int:
        """Input bytes read so far, where the source (or the worker engine) counts them; else 0."""
        return max(self.input_bytes, self.bytes_read() if self.bytes_read is not None else 0)

    def line(self) -> str:
        """``'12,288 rows, 48.0/120.5 MB, 9,812 rows/s, ETA 8 s'``."""
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        rate = self.rows / elapsed
        done_bytes = self.done_bytes()
        text = f"{self.rows:,} rows"
        eta = None
        if done_bytes and self.total_bytes:
            text += f", {done_bytes / 2**20:,.1f}/{self.total_bytes / 2**20:,.1f} MB"
            eta = (self.total_bytes - done_bytes) / (done_bytes / elapsed)
        else:
            text += f", {self.batch_bytes / 2**20:,.1f} MB"
        if self.total_rows and rate:
            eta = (self.total_rows - self.rows) / rate
        text += f", {rate:,.0f} rows/s"
        if eta is not None:
            text += f", ETA {max(0.0, eta):,.0f} s"
        return text

    def _draw(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or (not force and now - self._last < _progress.TTY_PERIOD):
            return
        self._last = now
        display = self._open()
        done, total, text = self._state(display)
        (display.close if force else display.show)(done, total, text)

    def _open(self) -> _progress.Display:
        """The display, opened at the first draw: by then the source has said whether it counts bytes."""
        if self._display is None:
            self._by_bytes = bool(self.total_bytes and self.done_bytes())
            unit, total = ("B", self.total_bytes) if self._by_bytes else ("rows", self.total_rows)
            self._display = _progress.open_display(self.stream, unit=unit, total=total)
        return self._display

    def _state(self, display: _progress.Display) -> tuple[float, float | None, str]:
        """What the display shows: the plain line, or a tqdm bar's position, total and text after it."""
        if isinstance(display, _progress.PlainLine):
            return 0, None, self.line()
        if self._by_bytes:
            return self.done_bytes(), self.total_bytes, f"{self.rows:,} rows"
        return self.rows, self.total_rows, f"{self.batch_bytes / 2**20:,.1f} MB"

    def close(self) -> None:
        """Draw the last state and end the line (nothing when the meter is off)."""
        if self.enabled:
            self._draw(force=True)


def _batch_rows(batch: Any) -> int:
    """Rows of a column batch (a mapping of equal-length columns) or of an Arrow batch or table."""
    if hasattr(batch, "num_rows"):
        return int(batch.num_rows)
    for values in (batch.values() if hasattr(batch, "values") else []):
        return len(values)
    return 0
