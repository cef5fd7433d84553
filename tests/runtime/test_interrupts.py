"""Signals while a process pool starts (:func:`unihub.runtime.interrupts.deferred`): they land after it started."""

from __future__ import annotations

import subprocess
import sys
import textwrap

POOL_STARTING = textwrap.dedent("""
    import os, signal
    from unihub.formats.base import frozen_for_fork, process_pool
    from unihub.runtime import interrupts

    with interrupts.raised():
        pool = process_pool(2)
        try:
            try:
                with frozen_for_fork():
                    os.kill(os.getpid(), signal.SIGTERM)  # lands in the pool's start, in the command
                    futures = [pool.submit(os.getpid) for _ in range(4)]
                    print("started", flush=True)
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
        except interrupts.Terminated:
            print("terminated after the start", flush=True)
""")

WORKER_HANDLERS = textwrap.dedent("""
    import signal
    from unihub.formats.base import frozen_for_fork, process_pool

    with process_pool(2) as pool:
        with frozen_for_fork():
            futures = [pool.submit(signal.getsignal, number) for number in (signal.SIGINT, signal.SIGTERM)]
        assert [future.result() for future in futures] == [signal.default_int_handler, signal.SIG_DFL]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    print("as before", flush=True)
""")


def _run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)


def test_a_signal_while_a_pool_starts_is_raised_once_it_has_started() -> None:
    """Raised inside ``Thread.start`` of the pool's manager thread, SIGTERM left a thread the shutdown
    could not join (the CLI exited 1, "cannot join thread before it is started", not 143)."""
    done = _run(POOL_STARTING)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["started", "terminated", "after", "the", "start"]
    assert "cannot join" not in done.stderr


def test_workers_forked_while_signals_wait_have_the_handlers_from_before() -> None:
    """A program's pool (not the command): its workers, and the program after the start, answer signals
    as Python has it."""
    done = _run(WORKER_HANDLERS)
    assert done.returncode == 0 and done.stdout.strip() == "as before", done.stderr[-2000:]
