"""processes: a pid and its start time name one process, even after the pid is given to another."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from unihub.runtime import processes

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")


def _state(pid: int) -> str | None:
    found = processes._stat(pid)
    return None if found is None else found[0]


def test_a_running_process_and_its_start_time():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = processes.start_time(child.pid)
        assert started is not None and started >= processes.start_time(os.getpid())  # type: ignore[operator]
        assert processes.is_running(child.pid) and processes.is_running(child.pid, started)
        # the same pid with another start time is another process: the one asked about is gone
        assert not processes.is_running(child.pid, started + 1)
        assert processes.is_running(os.getpid(), processes.start_time(os.getpid()))
    finally:
        child.kill()
        child.wait()
    assert not processes.is_running(child.pid, started)  # reaped (its pid not given out again this soon)


def test_a_zombie_does_not_run():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        started = processes.start_time(child.pid)
        deadline = time.monotonic() + 30
        while _state(child.pid) != "Z":  # exited, not yet reaped
            assert time.monotonic() < deadline, f"state {_state(child.pid)!r}"
            time.sleep(0.01)
        assert not processes.is_running(child.pid) and not processes.is_running(child.pid, started)
    finally:
        child.wait()
    assert processes.start_time(child.pid) is None


def test_the_main_process_lets_go_of_a_pool_whose_pid_names_another_process():
    """A torch worker's pool is kept while the worker runs; after it exits its pid may be given to
    another process, which must not keep the pool's shared memory alive."""
    from unihub.bridges.torch import shared_batches

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        arrivals = shared_batches._Arrivals()
        arrivals.pools["worker"] = shared_batches._PoolRecord(child.pid, None)
        arrivals.pools["earlier worker, same pid"] = reused = shared_batches._PoolRecord(child.pid, None)
        assert reused.started is not None
        reused.started += 1  # as if the pool's worker had started a tick earlier, exited, and its pid reused
        arrivals._forget_exited()
        assert list(arrivals.pools) == ["worker"]
    finally:
        child.kill()
        child.wait()
    arrivals._forget_exited()
    assert not arrivals.pools
