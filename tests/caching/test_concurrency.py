"""Many processes on one cache, locally and on the S3 test server: one builds, the others wait and read;
a SIGKILLed builder leaves nothing that is read and the next call builds again; waiting is bounded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from unihub import cacheable
from unihub.caching import list_caches
from unihub.caching.lease import LeaseFiles, new_record, try_acquire
from unihub.errors import CacheTimeoutError

ROWS = 2000
_CALLER = """
import json, os, sys, time
import numpy as np
from unihub import cacheable, make_reader
root, log, delay, options = sys.argv[1], sys.argv[2], float(sys.argv[3]), json.loads(sys.argv[4]) or None
n = int(sys.argv[5])

def rows():
    with open(log, "a") as handle:
        handle.write(f"{os.getpid()}\\n")
    for i in range(n):
        if delay and i % 100 == 0:
            time.sleep(delay)
        yield {"id": i, "v": np.full(4, i, np.int32)}

ds = cacheable(root, dataset_id="shared", version="1", storage_options=options, wait_timeout=120,
               row_group_size_mb=0.01)(rows)()
with make_reader(ds.url, storage_options=options, workers_count=1) as reader:
    ids = sorted(int(r.id) for r in reader)
print(json.dumps({"rows": len(ds), "exact": ids == list(range(n))}))
"""


def _call(root: str, log: Path, *, delay: float = 0.0, options: dict[str, Any] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _CALLER, root, str(log), str(delay), json.dumps(options), str(ROWS)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _results(procs: list[subprocess.Popen]) -> list[dict[str, Any]]:
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, stderr
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def _builds(log: Path) -> int:
    return len(log.read_text().split()) if log.exists() else 0


def _wait_for_build_to_start(log: Path) -> None:
    deadline = time.monotonic() + 60
    while _builds(log) == 0:
        assert time.monotonic() < deadline, "no build started"
        time.sleep(0.05)


def _many_callers_one_builder(root: str, log: Path, options: dict[str, Any] | None) -> None:
    procs = [_call(root, log, delay=0.02, options=options) for _ in range(4)]
    assert _results(procs) == [{"rows": ROWS, "exact": True}] * 4
    assert _builds(log) == 1


def _killed_builder_then_rebuild(root: str, log: Path, options: dict[str, Any] | None) -> None:
    builder = _call(root, log, delay=0.5, options=options)
    _wait_for_build_to_start(log)
    time.sleep(1.0)  # some row groups written into its temporary
    builder.send_signal(signal.SIGKILL)
    builder.wait()
    assert list_caches(root, storage_options=options) == []  # nothing published
    assert _results([_call(root, log, options=options)]) == [{"rows": ROWS, "exact": True}]
    assert _builds(log) == 2  # the next call built again
    assert [(c.dataset_id, c.num_rows) for c in list_caches(root, storage_options=options)] == [("shared", ROWS)]


@pytest.mark.slow
def test_local_many_processes_one_builds(tmp_path: Path) -> None:
    _many_callers_one_builder(str(tmp_path / "cache"), tmp_path / "builds.log", None)
    assert sorted(os.listdir(tmp_path / "cache" / "shared")) == ["1", "1.json"]


@pytest.mark.slow
def test_local_sigkilled_builder_leaves_nothing_and_the_next_call_builds(tmp_path: Path) -> None:
    _killed_builder_then_rebuild(str(tmp_path / "cache"), tmp_path / "builds.log", None)
    assert sorted(os.listdir(tmp_path / "cache" / "shared")) == ["1", "1.json"]  # no lease, no temporary


@pytest.mark.slow
def test_s3_many_processes_one_builds(tmp_path: Path, s3_server) -> None:
    _many_callers_one_builder(f"s3://{s3_server.bucket}/cache-{uuid.uuid4().hex[:8]}", tmp_path / "builds.log",
                              s3_server.storage_options())


@pytest.mark.slow
def test_s3_sigkilled_builder_leaves_nothing_and_the_next_call_builds(tmp_path: Path, s3_server) -> None:
    prefix = f"cache-{uuid.uuid4().hex[:8]}"
    _killed_builder_then_rebuild(f"s3://{s3_server.bucket}/{prefix}", tmp_path / "builds.log",
                                 s3_server.storage_options())
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_server.bucket,
                                                                Prefix=prefix).get("Contents", [])]
    assert f"{prefix}/shared/1.json" in keys and f"{prefix}/shared/1.lease" not in keys
    # the killed builder's staging objects were removed by the rebuild (a dead run's, settled before writing)
    assert not [k for k in keys if "unihub-tmp" in k], keys


def test_waiting_is_bounded_and_names_the_cache_and_its_builder(tmp_path: Path) -> None:
    from unihub.caching.store import CacheRoot

    root = CacheRoot(tmp_path)
    lease = try_acquire(root.files, root.lease_path("held", "1"))
    assert lease is not None
    try:
        started = time.monotonic()
        with pytest.raises(CacheTimeoutError) as caught:
            cacheable(tmp_path, dataset_id="held", version="1", wait_timeout=0.5)(lambda: [{"a": 1}])()
        assert time.monotonic() - started < 5
        message = str(caught.value)
        assert f"{tmp_path}/held/1" in message and f"pid {os.getpid()}" in message and "last heartbeat" in message
    finally:
        lease.release()
    assert len(cacheable(tmp_path, dataset_id="held", version="1")(lambda: [{"a": 1}])()) == 1


def test_a_lease_whose_heartbeat_stopped_is_taken_over(tmp_path: Path) -> None:
    files = LeaseFiles(__import__("pyarrow.fs", fromlist=["LocalFileSystem"]).LocalFileSystem())
    (tmp_path / "other").mkdir()
    record = dict(new_record(), owner="0badc0de-4242-1", host="elsewhere", heartbeat=time.time() - 120)
    files.write(str(tmp_path / "other" / "1.lease"), record)  # a builder on another host, silent for 2 minutes
    ds = cacheable(tmp_path, dataset_id="other", version="1", stale_after=60, wait_timeout=10)(lambda: [{"a": 1}])()
    assert len(ds) == 1 and sorted(os.listdir(tmp_path / "other")) == ["1", "1.json"]


def test_a_live_builder_on_this_host_keeps_its_lease_whatever_its_heartbeat(tmp_path: Path) -> None:
    """Its heartbeat late (a thread kept from the GIL, or ``stale_after`` below the heartbeat's interval),
    a builder that is alive here is not built beside: a second build could publish other rows under
    readers of the first."""
    files = LeaseFiles(__import__("pyarrow.fs", fromlist=["LocalFileSystem"]).LocalFileSystem())
    (tmp_path / "live").mkdir()
    files.write(str(tmp_path / "live" / "1.lease"), dict(new_record(), heartbeat=time.time() - 120))  # this process
    calls = []
    with pytest.raises(CacheTimeoutError, match=f"pid {os.getpid()}"):
        cacheable(tmp_path, dataset_id="live", version="1", stale_after=1, wait_timeout=1)(
            lambda: calls.append(1) or [{"a": 1}])()
    assert calls == [] and sorted(os.listdir(tmp_path / "live")) == ["1.lease"]


def test_a_lease_that_could_not_be_written_is_not_left_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Created but not written (a full disk), an empty lease holds no owner nor heartbeat to judge it by:
    every later caller would wait ``wait_timeout`` for it. It is removed and the error goes up."""
    import errno

    from unihub.caching import lease

    real_fdopen = os.fdopen

    def full_disk(fd: int, *args: Any, **kwargs: Any):
        handle = real_fdopen(fd, *args, **kwargs)
        handle.write = lambda data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device"))
        return handle

    monkeypatch.setattr(lease.os, "fdopen", full_disk)
    with pytest.raises(OSError, match="No space left"):
        cacheable(tmp_path, dataset_id="full", version="1")(lambda: [{"a": 1}])()
    monkeypatch.undo()
    assert os.listdir(tmp_path / "full") == []
    assert len(cacheable(tmp_path, dataset_id="full", version="1", wait_timeout=2)(lambda: [{"a": 1}])()) == 1


def test_a_record_that_could_not_be_written_leaves_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A heartbeat or a publish that fails (a full disk) leaves no ``.tmp`` beside the lease, one per beat."""
    from unihub.caching import lease

    files = LeaseFiles(__import__("pyarrow.fs", fromlist=["LocalFileSystem"]).LocalFileSystem())

    def refuse(*args: Any) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(lease.os, "replace", refuse)
    with pytest.raises(OSError, match="No space left"):
        files.write(str(tmp_path / "1.json"), {"a": 1})
    assert os.listdir(tmp_path) == []
