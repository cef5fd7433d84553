"""Ctrl-C and SIGTERM in the ``unihub`` command: one line, exit 130 or 143, nothing left behind.

Wherever the signal lands, the command prints ``unihub: interrupted`` (SIGINT) or ``unihub:
terminated`` (SIGTERM) as its last line and exits 128 + the signal's number, with no traceback:

- from the first lines of ``unihub/__init__`` until the command starts (:func:`install_at_start`):
  importing unihub takes a second or more (pyarrow, numpy), and nothing has been written yet, so the
  process ends there and then. The console script imports the package before ``cli.main`` runs,
  so this is installed by the package itself, for the ``unihub`` command only (:func:`is_command`):
  a program that imports unihub keeps its own handlers;
- while the command runs (:func:`raised`), SIGINT raises ``KeyboardInterrupt`` and SIGTERM
  :class:`Terminated` (a ``KeyboardInterrupt``), so every writer's clean-up runs as the stack unwinds
  and removes its staged output. Later signals are ignored until that is done: a second Ctrl-C
  does not cut the clean-up short (SIGKILL does, and the next run removes what is left). Where
  Python drops the exception (it landed in an at-fork or weakref callback, a ``__del__``: "Exception
  ignored in ..."), the signal is sent again, to land elsewhere. Processes forked meanwhile
  (workers) ignore both: the command stops them as it unwinds, and a worker that died of a signal
  while holding its pool's queue would leave the others, and the command waiting for them, hung.
  Workers still there when the command has unwound (a signal that landed while their pool was
  starting leaves them waiting for work) are killed, as Python would otherwise wait for them at exit.
- while a pool starts its workers (:func:`deferred`), both signals wait: landing inside
  ``Thread.start`` of the pool's manager thread, one left a thread that the pool's shutdown could not
  join ("cannot join thread before it is started", exit 1 instead of 143).

A signal a shell set to be ignored (SIGINT of a job started in the background) stays ignored. A
signal that arrives before the interpreter runs unihub's first line ends the process as Python
itself has it (by the signal, with nothing written).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

#: the signals the command answers, with the word it prints
WORDS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


class Terminated(KeyboardInterrupt):
    """SIGTERM while the command runs: a KeyboardInterrupt, so that the same clean-up runs as for Ctrl-C."""

    signal_number = signal.SIGTERM


def exit_code(stop: BaseException) -> int:
    """The exit status of a command stopped by ``stop``: 128 + the signal's number."""
    return 128 + int(getattr(stop, "signal_number", signal.SIGINT))


def last_line(stop: BaseException) -> str:
    """What the command prints last when ``stop`` ended it."""
    return f"unihub: {WORDS[signal.Signals(exit_code(stop) - 128)]}"


def is_command() -> bool:
    """Whether this process is the ``unihub`` command: its console script, ``python -m unihub`` or
    ``python -m unihub.cli``."""
    script = os.path.basename(sys.argv[0]) if sys.argv else ""
    if script in ("unihub", "unihub.exe", "unihub-script.py"):
        return True
    argv = list(getattr(sys, "orig_argv", ()))  # sys.argv[0] is '-m' while the package is imported
    if script == "-m":
        for index, arg in enumerate(argv[1:], 1):
            if arg.startswith("-m"):
                return (arg[2:] or (argv[index + 1] if index + 1 < len(argv) else "")) in ("unihub", "unihub.cli")
    return False


def install_at_start() -> None:
    """End the process at once on SIGINT or SIGTERM, saying so, until :func:`raised` takes over (the
    ``unihub`` command only: see the module docstring)."""
    _install(_exit_now, {})


@contextmanager
def raised() -> Iterator[None]:
    """While the block runs, SIGINT raises KeyboardInterrupt and SIGTERM :class:`Terminated` (see the
    module docstring); the handlers before it are put back after. Where signals cannot be handled
    (a thread other than the main one), nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    global _FORKED_IGNORE
    before: dict[int, Any] = {}
    unraisable = sys.unraisablehook
    try:  # a signal may land at any line of these: the finally puts everything back
        _RECEIVED.clear()
        _FORKED_IGNORE = True
        sys.unraisablehook = functools.partial(_raise_again, unraisable)
        _install(_raise, before)
        yield
    finally:
        _FORKED_IGNORE = False
        sys.unraisablehook = unraisable
        for number, handler in before.items():
            signal.signal(number, handler)
        if _RECEIVED:
            _kill_children()


def _install(handler: Any, replaced: dict[int, Any]) -> None:
    """``handler`` for SIGINT and SIGTERM where they are not ignored; the handlers it replaces go to
    ``replaced`` (each before it is replaced)."""
    for number in WORDS:
        current = signal.getsignal(number)
        if current is not signal.SIG_IGN:
            replaced[number] = current
            signal.signal(number, handler)


def _exit_now(number: int, frame: FrameType | None) -> None:
    """Nothing to clean up yet (or any more): say so and end the process."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 (a stream closed or mid-write: what it held is lost)
            pass
    os.write(2, f"unihub: {WORDS[signal.Signals(number)]}\n".encode())
    os._exit(128 + number)


def _raise_again(hook: Callable[[Any], object], unraisable: Any) -> None:
    """An exception Python drops: when it is one :func:`_raise` raised, send its signal again."""
    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
        hook(unraisable)
        return
    number = getattr(unraisable.exc_value, "signal_number", signal.SIGINT)
    signal.signal(number, _raise)
    # from another thread, a moment later: sent from here, it would be raised (and dropped) in here
    threading.Timer(0.01, os.kill, (os.getpid(), number)).start()


def _kill_children() -> None:
    """Kill the worker processes this process still has (they ignore SIGINT and SIGTERM)."""
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None:  # never imported: no workers
        return
    children = multiprocessing.active_children()
    for child in children:
        child.kill()
    for child in children:
        child.join(timeout=10)


def _raise(number: int, frame: FrameType | None) -> None:
    """The first signal raises; the ones after are ignored while the clean-up it starts runs."""
    _RECEIVED.append(number)
    for other in WORDS:
        signal.signal(other, signal.SIG_IGN)
    if number == signal.SIGTERM:
        raise Terminated()
    raise KeyboardInterrupt()


#: True while :func:`raised` is in force: a process forked then is a worker of the command
_FORKED_IGNORE = False
#: the signals :func:`_raise` raised for while :func:`raised` is in force
_RECEIVED: list[int] = []


@contextmanager
def deferred() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block ends, then go to the handlers before it: for code that
    must not be cut in two, such as a process pool starting its workers and its manager thread.
    (Blocking them would not do: a thread of pyarrow's that does not block them takes a signal sent to
    the process.) Processes forked meanwhile get the handlers before it. In a thread other than the
    main one, nothing changes."""
    global _DEFERRED
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before: dict[int, Any] = {}
    held: list[int] = []
    try:  # a signal may land at any line of these: the finally puts everything back
        _DEFERRED = before
        _install(lambda number, frame: held.append(number), before)
        yield
    finally:
        _DEFERRED = None
        for number, handler in before.items():
            signal.signal(number, handler)
        for number in dict.fromkeys(held):
            signal.raise_signal(number)  # to the handler before: raised (or the default) here


#: the handlers :func:`deferred` replaced while it holds the signals back (a process forked then restores them)
_DEFERRED: dict[int, Any] | None = None


def _in_forked_child() -> None:
    """A worker forked by the command leaves SIGINT and SIGTERM to the command, which stops its workers
    (and whose end ends them: :mod:`unihub.runtime.lifeline`). A program run by ``subprocess`` is left alone:
    an ignored signal would stay ignored in it."""
    global _DEFERRED
    if _DEFERRED is not None:  # forked inside deferred(): the handlers before it, as in any other process
        for number, handler in _DEFERRED.items():
            signal.signal(number, handler)
        _DEFERRED = None
    if _FORKED_IGNORE and _forked_by_multiprocessing():
        sys.unraisablehook = sys.__unraisablehook__
        try:
            for number in WORDS:
                signal.signal(number, signal.SIG_IGN)
        except ValueError:  # not this interpreter's main thread: as Python has it
            pass


def _forked_by_multiprocessing() -> bool:
    """Whether the fork being finished was asked for by :mod:`multiprocessing` (a pool's worker)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if f"{os.sep}multiprocessing{os.sep}" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_forked_child)
