"""fs/atomic.py: atomic replacement of local datasets, and finishing interrupted commits.

Kill trials (a real run SIGKILLed at every step) are in tests/converters/test_kill_trials.py.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from unihub import DatasetExistsError, DatasetNotFoundError, ScalarCodec, Unischema, UnischemaField, open_dataset
from unihub import write_dataset as write
from unihub.fs import atomic, publish

SCHEMA = Unischema("S", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False)])


def write_ids(path: Path, ids: range, **options) -> None:
    write(path, SCHEMA, [{"id": np.array(ids, dtype=np.int64)}], batched=True, **options)


def ids_of(path: Path) -> list[int]:
    store = open_dataset(path)
    return [v for i in range(len(store.row_groups)) for v in store.read_row_group(i).column("id").to_pylist()]


def hidden(parent: Path) -> list[str]:
    return sorted(n for n in os.listdir(parent) if ".unihub-" in n)


@functools.lru_cache(maxsize=1)
def dead_owner() -> str:
    """An owner token of this host whose process has exited (a child that ran and was reaped)."""
    code = "from unihub.fs import atomic; print(atomic._owner())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    return done.stdout.strip()


@pytest.fixture(params=["exchange", "two-step"])
def mode(request, monkeypatch) -> str:
    """Both ways of committing: renameat2 swaps, and the fallback where the system cannot."""
    if request.param == "two-step":
        monkeypatch.setattr(atomic, "_renameat2", lambda src, dest, flags: False)
    return request.param


def test_overwrite_replaces_directory_and_leaves_no_sibling(tmp_path: Path, mode: str) -> None:
    write_ids(tmp_path / "ds", range(10))
    write_ids(tmp_path / "ds", range(100, 105), overwrite=True)
    assert ids_of(tmp_path / "ds") == list(range(100, 105))
    assert hidden(tmp_path) == []
    with pytest.raises(DatasetExistsError):
        write_ids(tmp_path / "ds", range(3))


def test_replace_swaps_files_and_directories_of_either_kind(tmp_path: Path, mode: str) -> None:
    target = tmp_path / "out"
    target.write_bytes(b"old file")
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / "x").write_bytes(b"new")
    atomic.replace(str(staged), str(target))  # a file replaced by a directory
    assert (target / "x").read_bytes() == b"new" and not staged.exists()
    staged.write_bytes(b"a file again")
    atomic.replace(str(staged), str(target))  # and back
    assert target.read_bytes() == b"a file again" and not staged.exists()
    assert hidden(tmp_path) == []


def test_exchange_is_used_where_the_system_has_it(tmp_path: Path, monkeypatch) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("renameat2 is Linux's")
    calls = []
    real = atomic._renameat2
    monkeypatch.setattr(atomic, "_renameat2", lambda *a: calls.append(a[2]) or real(*a))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "old").touch()
    atomic.replace(str(tmp_path / "a"), str(tmp_path / "b"))
    assert calls == [atomic._RENAME_EXCHANGE]
    assert os.listdir(tmp_path / "b") == [] and hidden(tmp_path) == []


def test_a_failed_second_rename_puts_the_old_target_back(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(atomic, "_renameat2", lambda src, dest, flags: False)
    write_ids(tmp_path / "ds", range(4))
    real = os.rename

    def rename(src, dest):
        if "unihub-tmp" in str(src):
            raise OSError(5, "Input/output error")
        return real(src, dest)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="Input/output"):
        write_ids(tmp_path / "ds", range(50, 52), overwrite=True)
    monkeypatch.setattr(os, "rename", real)
    assert ids_of(tmp_path / "ds") == list(range(4))
    assert hidden(tmp_path) == []


def test_open_puts_back_the_old_dataset_a_killed_commit_left_aside(tmp_path: Path) -> None:
    """The state a kill between the two renames of a two-step commit leaves: no dataset, its old copy aside."""
    write_ids(tmp_path / "ds", range(7))
    aside = tmp_path / f".ds.unihub-old-{dead_owner()}-abcdef"
    os.rename(tmp_path / "ds", aside)
    staged = tmp_path / f".ds.unihub-tmp-{dead_owner()}-123456"
    staged.mkdir()
    assert ids_of(tmp_path / "ds") == list(range(7))  # open_dataset settles
    assert hidden(tmp_path) == []


def test_a_run_removes_what_killed_runs_left_and_keeps_what_live_runs_use(tmp_path: Path) -> None:
    write_ids(tmp_path / "ds", range(3))
    dead = dead_owner()
    (tmp_path / f".ds.unihub-tmp-{dead}-aaaaaa").mkdir()  # a killed run's staging area
    (tmp_path / f".ds.unihub-tmp-{dead}-bbbbbb").write_bytes(b"x")  # one of a file export
    (tmp_path / f".ds.unihub-old-{dead}-cccccc").mkdir()  # old copy of a commit that finished its swap
    mine = Path(atomic.sibling(str(tmp_path / "ds")))  # this live process's, as another thread's write
    mine.mkdir()
    live = Path(atomic.sibling(str(tmp_path / "ds"), "old"))
    live.mkdir()
    other_host = tmp_path / ".ds.unihub-tmp-00000000-1-1-dddddd"  # another host's: cannot be asked
    other_host.mkdir()
    unrelated = [tmp_path / ".ds.unihub-tmp-notours", tmp_path / ".dsx.unihub-tmp-00000000-1-1-eeeeee"]
    for path in unrelated:
        path.mkdir()
    with pytest.raises(DatasetExistsError):
        write_ids(tmp_path / "ds", range(3))
    assert hidden(tmp_path) == sorted(p.name for p in (mine, live, other_host, *unrelated))
    assert ids_of(tmp_path / "ds") == [0, 1, 2]


def test_legacy_siblings_are_removed_once_they_stopped_changing(tmp_path: Path) -> None:
    """Siblings of unihub versions that did not record their owner: `.ds.unihub-tmp-<12 hex>`."""
    write_ids(tmp_path / "ds", range(3))
    stale, fresh = tmp_path / ".ds.unihub-tmp-0123456789ab", tmp_path / ".ds.unihub-tmp-ba9876543210"
    stale.mkdir()
    fresh.mkdir()
    hour_ago = time.time() - atomic.LEGACY_GRACE_SECONDS["tmp"] - 60
    os.utime(stale, (hour_ago, hour_ago))
    publish.settle_url(str(tmp_path / "ds"))
    assert hidden(tmp_path) == [fresh.name]


def test_legacy_old_copy_is_put_back_when_the_dataset_is_missing(tmp_path: Path, monkeypatch) -> None:
    """What the commit of earlier versions left when killed between its renames (issue 12)."""
    write_ids(tmp_path / "ds", range(5))
    aside = tmp_path / ".ds.unihub-old-0123456789ab"
    os.rename(tmp_path / "ds", aside)
    with pytest.raises(DatasetNotFoundError):  # just renamed aside: such a run may be about to rename in
        open_dataset(tmp_path / "ds")
    monkeypatch.setitem(atomic.LEGACY_GRACE_SECONDS, "old", 0.0)  # (ctime cannot be set back)
    assert ids_of(tmp_path / "ds") == list(range(5))
    assert hidden(tmp_path) == []


def test_the_newest_of_several_old_copies_is_put_back(tmp_path: Path) -> None:
    dead = dead_owner()
    for n, tag in ((3, "aaaaaa"), (4, "bbbbbb")):
        write_ids(tmp_path / "ds", range(n), overwrite=True)
        os.rename(tmp_path / "ds", tmp_path / f".ds.unihub-old-{dead}-{tag}")
        time.sleep(0.02)
    assert ids_of(tmp_path / "ds") == list(range(4))
    assert hidden(tmp_path) == []


def test_a_missing_dataset_whose_old_copy_cannot_be_put_back_is_named(tmp_path: Path, monkeypatch) -> None:
    write_ids(tmp_path / "ds", range(2))
    aside = tmp_path / f".ds.unihub-old-{dead_owner()}-abcdef"
    os.rename(tmp_path / "ds", aside)

    def refuse(src, dest):
        raise PermissionError(13, "Permission denied", src)

    monkeypatch.setattr(atomic, "_rename_noreplace", refuse)
    with pytest.raises(DatasetNotFoundError, match=r"interrupted overwrite left the previous dataset in .*"
                                                   + aside.name):
        open_dataset(tmp_path / "ds")


def test_owner_liveness(tmp_path: Path) -> None:
    where, pid, start = atomic._owner().split("-")
    assert atomic.owner_alive(where, int(pid), int(start))
    assert not atomic.owner_alive(where, int(pid), int(start) + 1)  # the same pid, another process
    dead_where, dead_pid, dead_start = dead_owner().split("-")
    assert dead_where == where
    assert not atomic.owner_alive(where, int(dead_pid), int(dead_start))
    assert atomic.owner_alive("00000000", int(dead_pid), int(dead_start))  # another host: not ours to judge


def test_a_filesystem_refusing_the_swap_falls_back_to_two_renames(tmp_path: Path, monkeypatch) -> None:
    """renameat2 answering EINVAL (a filesystem without RENAME_EXCHANGE) or ENOSYS: the two-step commit."""
    import ctypes
    import errno

    for code in (errno.EINVAL, errno.ENOSYS):
        def refusing(*args, code=code):
            ctypes.set_errno(code)
            return -1

        monkeypatch.setattr(atomic, "_libc_renameat2", lambda refusing=refusing: refusing)
        write_ids(tmp_path / "ds", range(3), overwrite=True)
        write_ids(tmp_path / "ds", range(10, 13), overwrite=True)
        assert ids_of(tmp_path / "ds") == [10, 11, 12] and hidden(tmp_path) == []

    def failing(*args):
        ctypes.set_errno(errno.EXDEV)
        return -1

    monkeypatch.setattr(atomic, "_libc_renameat2", lambda: failing)
    with pytest.raises(OSError, match="cross-device"):  # a real failure is not taken for "unsupported"
        write_ids(tmp_path / "ds", range(5), overwrite=True)
    monkeypatch.undo()
    assert ids_of(tmp_path / "ds") == [10, 11, 12] and hidden(tmp_path) == []
