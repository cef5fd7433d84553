"""Kill trials: ``unihub convert --overwrite`` SIGKILLed at every step leaves the old or the new dataset.

A child process runs the conversion with the filesystem calls that change the tree wrapped
(``os.rename``/``replace``/``unlink``/``mkdir``/``rmdir``, ``shutil.rmtree``, renameat2,
unihub's ``filesystem.move``/``remove``, and pyarrow's Parquet file opens, closes and metadata writes): at its N-th call it stops, the test kills it with SIGKILL, and
checks that the destination holds every row of the old dataset or every row of the new one,
and that the next run on the destination removes what the killed one left. N goes up until a
run finishes. The same is done where the system cannot swap atomically (the two-step commit),
and, in a slow test, at random moments of whole runs.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from unihub import DatasetExistsError
from unihub.converters.convert import convert

from ..image_folders import rows_of, write_image_folder

CHILD = r"""
import os, shutil, sys, time
from unihub.cli import main
from unihub.fs import filesystem

step, only_commit = int(os.environ["KILL_AT"]), os.environ.get("KILL_IN_COMMIT") == "1"
target = os.path.abspath(sys.argv[2])
seen = {"count": 0, "commit": not only_commit}

def pause(args):
    if not seen["commit"] and any(str(a).rstrip("/") == target for a in args[:2]):
        seen["commit"] = True  # the first call that names the destination starts the commit
    if not seen["commit"]:
        return
    seen["count"] += 1
    if seen["count"] == step:
        print("paused", flush=True)
        time.sleep(600)

def wrap(module, name):
    real = getattr(module, name, None)
    if real is None:
        return
    def wrapped(*args, **kwargs):
        pause(args)
        return real(*args, **kwargs)
    setattr(module, name, wrapped)

for name in ("rename", "replace", "unlink", "rmdir", "mkdir"):
    wrap(os, name)
wrap(shutil, "rmtree")
wrap(filesystem, "move")
wrap(filesystem, "remove")
import pyarrow.parquet as pq  # tasks and the commit write through pyarrow's filesystem, not os.*
wrap(pq.ParquetWriter, "__init__")
wrap(pq.ParquetWriter, "close")
wrap(pq, "write_metadata")
try:
    from unihub.fs import atomic
except ImportError:
    atomic = None
if atomic is not None:
    if os.environ.get("NO_EXCHANGE") == "1":  # as on a system or filesystem without renameat2
        atomic._renameat2 = lambda src, dest, flags: False
    wrap(atomic, "_renameat2")
print("ready", flush=True)
sys.exit(main(["convert", sys.argv[1], sys.argv[2], "--overwrite", "--quiet", *sys.argv[3:]]))
"""


def image_folder(root: Path, seed: int, classes: int = 3, per_class: int = 4) -> Path:
    return write_image_folder(root, seed=seed, classes=classes, per_class=per_class)


def leftovers(parent: Path) -> list[str]:
    return sorted(n for n in os.listdir(parent) if ".unihub-" in n)


@pytest.fixture()
def sources(tmp_path: Path) -> dict[str, object]:
    old = image_folder(tmp_path / "old", seed=1)
    new = image_folder(tmp_path / "new", seed=2, per_class=5)
    convert(old, tmp_path / "ref-old", progress=False)
    convert(new, tmp_path / "ref-new", progress=False)
    out = tmp_path / "out"
    out.mkdir()
    return {"old": old, "new": new, "old_rows": rows_of(tmp_path / "ref-old"),
            "new_rows": rows_of(tmp_path / "ref-new"), "dst": out / "ds"}


def run_child(src: Path, dst: Path, env: dict[str, str], extra: list[str]) -> tuple[bool, str]:
    """Run the child until it pauses (then SIGKILL it: True) or finishes (False)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(src), str(dst), *extra], env={**os.environ, **env},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert child.stdout is not None
    paused = False
    for line in child.stdout:
        if "paused" in line:  # two workers may print it on one line
            paused = True
            os.killpg(child.pid, signal.SIGKILL)
            break
    _, err = child.communicate(timeout=120)
    if not paused:
        assert child.returncode == 0, err
    return paused, err


def check_after_kill(sources: dict[str, object], *, never_missing: bool) -> str:
    """The destination holds the old or the new dataset, whole; the next run removes what is left."""
    dst = sources["dst"]
    assert isinstance(dst, Path)
    if never_missing:
        assert dst.is_dir(), f"no dataset at the destination: {os.listdir(dst.parent)}"
    rows = rows_of(dst)  # open_dataset finishes a commit stopped half-way
    assert rows in (sources["old_rows"], sources["new_rows"]), "a mix of the old and the new dataset"
    with pytest.raises(DatasetExistsError):  # the next run on the destination
        convert(sources["new"], dst, progress=False)
    assert leftovers(dst.parent) == []
    return "old" if rows == sources["old_rows"] else "new"


def kill_at_each_step(sources: dict[str, object], env: dict[str, str], args: list[str], steps: int) -> list[str]:
    """Over the old dataset, a run killed at step 1, 2, ... until a run gets through: what each kill left
    (``check_after_kill``); a run that never gets through in ``steps`` steps fails the test."""
    dst = sources["dst"]
    assert isinstance(dst, Path)
    seen = []
    for step in range(1, steps):
        convert(sources["old"], dst, progress=False, overwrite=True)
        paused, _ = run_child(sources["new"], dst, {**env, "KILL_AT": str(step)}, args)
        if not paused:
            return seen
        seen.append(check_after_kill(sources, never_missing=env["NO_EXCHANGE"] == "0"))
    pytest.fail("the conversion never finished")


@pytest.mark.parametrize("swap", ["exchange", "two-step"])
def test_kill_at_every_step_of_the_commit(sources: dict[str, object], swap: str) -> None:
    dst = sources["dst"]
    assert isinstance(dst, Path)
    env = {"KILL_IN_COMMIT": "1", "NO_EXCHANGE": "1" if swap == "two-step" else "0"}
    seen = kill_at_each_step(sources, env, [], 30)
    assert rows_of(dst) == sources["new_rows"]
    assert "old" in seen and "new" in seen and len(seen) >= 2, seen
    assert leftovers(dst.parent) == []


@pytest.mark.slow
@pytest.mark.parametrize("swap", ["exchange", "two-step"])
def test_kill_at_every_step_of_a_run_with_workers(sources: dict[str, object], swap: str) -> None:
    """Every step from the first directory made, in the parent and in its two workers (their part files)."""
    dst = sources["dst"]
    assert isinstance(dst, Path)
    env = {"KILL_IN_COMMIT": "0", "NO_EXCHANGE": "1" if swap == "two-step" else "0"}
    seen = kill_at_each_step(sources, env, ["--workers", "2"], 200)
    assert rows_of(dst) == sources["new_rows"]
    # each process counts its own calls, so the kills land in the workers' steps (the parent commits
    # after they are done): the old dataset every time, and whatever they left removed by the next run.
    # A task writes its part files straight into the staging area (a file's open and close: two steps
    # each, four tasks per worker), with no directory of its own to make, rename and remove
    assert len(seen) >= 6 and "old" in seen, seen


@pytest.mark.slow
def test_kill_at_random_moments(sources: dict[str, object], tmp_path: Path) -> None:
    """30 whole runs (one or two workers) SIGKILLed at a random moment after start-up."""
    big = image_folder(tmp_path / "big", seed=3, classes=4, per_class=60)
    convert(big, tmp_path / "ref-big", progress=False)
    sources = {**sources, "new": big, "new_rows": rows_of(tmp_path / "ref-big")}
    dst = sources["dst"]
    assert isinstance(dst, Path)
    start = time.perf_counter()
    run_child(big, tmp_path / "timing", {"KILL_AT": "0"}, [])
    duration = time.perf_counter() - start
    rng = random.Random(12)
    seen = []
    for trial in range(30):
        convert(sources["old"], dst, progress=False, overwrite=True)
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(big), str(dst), "--workers", str(1 + trial % 2)],
                                 env={**os.environ, "KILL_AT": "0"}, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0, duration))
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate(timeout=60)
        seen.append(check_after_kill(sources, never_missing=True))
    assert "old" in seen and "new" in seen, seen
