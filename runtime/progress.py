"""Progress on stderr: one switch for all of it, a ``tqdm`` bar when it can, one plain line when not.

HuggingFace datasets' pattern: :func:`disable_progress_bar` / :func:`enable_progress_bar` (or
``UNIHUB_DISABLE_PROGRESS_BAR=1`` in the environment) turn every progress display of unihub off or
on; the switch wins over a caller's ``progress=True``. A shown display is a ``tqdm`` bar when tqdm is
installed (``pip install 'unihub[cli]'``) and the stream is a terminal, else one plain line: rewritten
in place (``\\r``) on a terminal, and at most one line per :data:`PLAIN_PERIOD` seconds plus the last
one into a log file or pipe, so logs get no carriage returns. What is counted is the caller's
(:class:`unihub.converters.meter.ProgressMeter` counts rows, and input bytes where the source
reports them).
"""

from __future__ import annotations

import os
import time
from typing import Any, Protocol, TextIO

#: the environment variable that turns progress off when set to 1/true/yes/on
ENV_DISABLE = "UNIHUB_DISABLE_PROGRESS_BAR"
#: seconds between two plain lines written into something that is not a terminal
PLAIN_PERIOD = 10.0
#: seconds between two redraws on a terminal
TTY_PERIOD = 0.2

_switch: bool | None = None  # None: follow the environment


def disable_progress_bar() -> None:
    """Turn every unihub progress display off (in this process), whatever the callers ask for."""
    global _switch
    _switch = False


def enable_progress_bar() -> None:
    """Turn progress displays back on (where they would show: a terminal, or a caller's ``progress=True``)."""
    global _switch
    _switch = True


def is_progress_bar_enabled() -> bool:
    """False after :func:`disable_progress_bar`, or when ``UNIHUB_DISABLE_PROGRESS_BAR`` is 1/true/yes/on."""
    if _switch is not None:
        return _switch
    return os.environ.get(ENV_DISABLE, "").strip().lower() not in ("1", "true", "yes", "on")


def is_terminal(stream: Any) -> bool:
    """True when ``stream`` is an interactive terminal (a closed or odd stream is not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def should_show(enabled: bool | None, stream: Any) -> bool:
    """Whether to show progress: never when switched off; else ``enabled``, or by default on a terminal."""
    if not is_progress_bar_enabled():
        return False
    return is_terminal(stream) if enabled is None else enabled


class Display(Protocol):
    """Where a meter's state goes: ``show`` as often as the meter likes, ``close`` once."""

    def show(self, done: float, total: float | None, text: str) -> None: ...

    def close(self, done: float, total: float | None, text: str) -> None: ...


class PlainLine:
    """One line of text: rewritten in place on a terminal, else a line per :data:`PLAIN_PERIOD` and the last."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = is_terminal(stream)
        self.period = TTY_PERIOD if self.tty else PLAIN_PERIOD
        self._last = time.perf_counter()

    def show(self, done: float, total: float | None, text: str) -> None:
        now = time.perf_counter()
        if now - self._last >= self.period:
            self._last = now
            self._write(text)

    def close(self, done: float, total: float | None, text: str) -> None:
        self._write(text)
        if self.tty:
            self.stream.write("\n")
        self.stream.flush()

    def _write(self, text: str) -> None:
        self.stream.write(f"\r{text}   " if self.tty else f"{text}\n")
        self.stream.flush()


class TqdmBar:
    """A ``tqdm`` bar of ``done`` out of ``total`` in ``unit`` (bytes are scaled to KB, MB, ...), ``text`` after it."""

    def __init__(self, tqdm: Any, stream: TextIO, *, unit: str, total: float | None) -> None:
        scaled = unit == "B"
        self.bar = tqdm(total=total, unit=unit, unit_scale=scaled, unit_divisor=1024 if scaled else 1000,
                        file=stream, mininterval=TTY_PERIOD, dynamic_ncols=True, leave=True)

    def show(self, done: float, total: float | None, text: str) -> None:
        self._set(done, total, text)
        self.bar.update(0)  # tqdm redraws at most every mininterval

    def close(self, done: float, total: float | None, text: str) -> None:
        self._set(done, total, text)
        self.bar.refresh()
        self.bar.close()

    def _set(self, done: float, total: float | None, text: str) -> None:
        if total != self.bar.total:
            self.bar.total = total
        self.bar.n = done
        self.bar.set_postfix_str(text, refresh=False)


def open_display(stream: TextIO, *, unit: str, total: float | None) -> Display:
    """A :class:`TqdmBar` when tqdm imports and ``stream`` is a terminal, else a :class:`PlainLine`."""
    if is_terminal(stream):
        try:
            from tqdm import tqdm
        except ImportError:
            pass
        else:
            return TqdmBar(tqdm, stream, unit=unit, total=total)
    return PlainLine(stream)
