"""runtime/lifeline.py: forked workers end when their parent is killed, instead of waiting forever.

Issue 12: after SIGKILL of ``unihub convert --workers 2``, workers lived on, blocked on their
task queue, holding the parent's pipes (every time, in this reproduction). Reader process
pools had the same fault.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from unihub import ScalarCodec, Unischema, UnischemaField, write_dataset

from ..image_folders import write_image_folder

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds processes through /proc")

SLOW_CONVERT = """
import sys, time
import unihub.formats.imagefolder.format as imagefolder
real_read = imagefolder._read_and_probe
def slow_read(*args, **kwargs):  # the data pass: in the workers
    print("reading", flush=True)
    time.sleep(0.02)
    return real_read(*args, **kwargs)
imagefolder._read_and_probe = slow_read
from unihub.cli import main
sys.exit(main(["convert", sys.argv[1], sys.argv[2], "--workers", "2", "--quiet"]))
"""

READER = """
import multiprocessing, sys, time
from unihub import make_reader
reader = make_reader(sys.argv[1], reader_pool_type="process", workers_count=2, num_epochs=None)
next(reader)
print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
time.sleep(600)
"""

FORKED = """
import os, sys, time
from unihub.runtime.lifeline import die_with_parent
parent = os.getpid()
child = os.fork()
if child == 0:
    die_with_parent(parent, kernel=sys.argv[1] == "kernel")
    time.sleep(600)
    os._exit(0)
print(child, flush=True)
time.sleep(600)
"""


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    fields = handle.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


@contextmanager
def reaping(pids: list[int]) -> Iterator[None]:
    """Kill whatever of ``pids`` still runs at the end, so a failing test leaves no process behind."""
    try:
        yield
    finally:
        for pid in pids:
            if running(pid):
                os.kill(pid, signal.SIGKILL)


def survivors(pids: list[int], within: float = 5.0) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in pids if running(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if running(p)]


@pytest.fixture()
def image_folder(tmp_path: Path) -> Path:
    """4 classes x 30 PNGs: about 2.5 s of (slowed) reading in two workers."""
    return write_image_folder(tmp_path / "folder", classes=4, per_class=30, height=16, width=12)


@pytest.mark.parametrize("trial", range(5))
def test_conversion_workers_die_with_a_killed_parent(image_folder: Path, tmp_path: Path, trial: int) -> None:
    parent = subprocess.Popen([sys.executable, "-c", SLOW_CONVERT, str(image_folder), str(tmp_path / "ds")],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert parent.stdout is not None
    workers: list[int] = []
    with reaping(workers):
        reads = 0
        while reads < 4 + 9 * trial:  # workers busy, at a different point each trial
            line = parent.stdout.readline()
            assert line, "the conversion ended before it was killed"
            reads += line.count("reading")
        workers.extend(children_of(parent.pid))
        assert len(workers) == 2
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert survivors(workers) == []


def test_reader_process_workers_die_with_a_killed_parent(tmp_path: Path) -> None:
    schema = Unischema("S", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False)])
    write_dataset(tmp_path / "ds", schema, [{"id": np.arange(1000)}], batched=True, row_group_size_mb=0.001)
    for _ in range(3):
        parent = subprocess.Popen([sys.executable, "-c", READER, str(tmp_path / "ds")], stdout=subprocess.PIPE,
                                  text=True)
        assert parent.stdout is not None
        workers = [int(p) for p in parent.stdout.readline().split()]
        with reaping(workers):
            assert len(workers) == 2 and all(running(p) for p in workers)
            parent.send_signal(signal.SIGKILL)
            parent.wait()
            assert survivors(workers) == []


@pytest.mark.parametrize("way", ["kernel", "poll"])
def test_die_with_parent(way: str) -> None:
    """The kernel's parent-death signal (Linux), and the parent-pid poll used elsewhere and by readers."""
    parent = subprocess.Popen([sys.executable, "-c", FORKED, way], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    with reaping([child]):
        time.sleep(0.2)
        assert running(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert survivors([child]) == []


def test_a_parent_gone_before_the_call_ends_the_worker_at_once() -> None:
    code = ("import os, sys\nfrom unihub.runtime.lifeline import die_with_parent\n"
            "die_with_parent(os.getppid() + 1, kernel=sys.argv[1] == 'kernel')\nprint('still here')\n")
    for way in ("kernel", "poll"):
        done = subprocess.run([sys.executable, "-c", code, way], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and "still here" not in done.stdout
