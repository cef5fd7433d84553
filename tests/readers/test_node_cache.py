"""One download per node: processes sharing one local-disk cache directory fetch each row group once.

Processes are real forks reading a dataset through :class:`WatchedFileSystem` (``watched_fs.py``),
which logs every read of a data page, so "fetched once" is counted at the filesystem, not by the
cache's own statistics (which are checked against it). A fetcher is held in the middle of a read by
a gate file and killed there with SIGKILL; the others wait for it, then one of them fetches.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unihub import open_dataset, write_dataset
from unihub.readers.local_disk_cache import CacheConfigError, LocalDiskCache
from unihub.readers.reader import make_reader

from .sample import sample_row, sample_schema
from .watched_fs import WatchedFileSystem, data_reads

pytestmark = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")

N = 60
SCHEMA = sample_schema("NodeCache")
MB = 2**20
COLUMNS = ["id", "name", "vec"]
CONTEXT = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
#: how long a step that should take a fraction of a second may take on a loaded machine
BOUND = 60.0


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("node-cache") / "ds"
    write_dataset(path, SCHEMA, (sample_row(i) for i in range(N)), row_group_size_mb=0.001, rows_per_file=20)
    assert len(open_dataset(path).row_groups) >= 6, "the tests need several row groups"
    return path


def cache_args(location: Path, limit: int = 64 * MB, **settings: Any) -> dict[str, Any]:
    return {"cache_type": "local-disk", "cache_location": str(location), "cache_size_limit": limit,
            "cache_extra_settings": {"cleanup": False, **settings}}


def row_values(row: Any) -> tuple[Any, ...]:
    return int(row.id), str(row.name), [float(v) for v in row.vec]


def expected_rows() -> dict[int, tuple[Any, ...]]:
    return {i: (i, f"row-{i}", [float(v) for v in sample_row(i)["vec"]]) for i in range(N)}


def leftovers(location: Path) -> list[str]:
    """Temporary files and fetch locks in the cache directory (none after a clean run)."""
    return sorted(p.name for p in location.iterdir() if p.name.endswith((".tmp", ".fetch")))


# -- processes run here ------------------------------------------------------------------------------
def _read_all(location: str, dataset: str, log: str, delay: float, barrier: Any, results: Any) -> None:
    """Read every row through the shared cache, all row groups in the same order, and report."""
    try:
        fs = WatchedFileSystem(log, delay)
        barrier.wait(BOUND)
        with make_reader(dataset, filesystem=fs, reader_pool_type="dummy", shuffle_row_groups=False,
                         schema_fields=COLUMNS, **cache_args(Path(location))) as reader:
            rows = [row_values(r) for r in reader]
            results.put((os.getpid(), rows, reader.cache_stats))
    except BaseException as exc:  # reported to the test, which fails on it
        results.put((os.getpid(), repr(exc), None))


def _fetch_group(location: str, dataset: str, log: str, gate: str | None, wait: float, results: Any) -> None:
    """Read row group 0 through the shared cache (held in its first data read where ``gate`` is set)."""
    try:
        store = open_dataset(dataset, filesystem=WatchedFileSystem(log, gate=gate))
        cache = LocalDiskCache(location, 64 * MB, cleanup=False, fetch_wait_seconds=wait)
        table = cache.get_row_group(store, 0, COLUMNS)
        results.put((os.getpid(), table.column("id").to_pylist(), cache.summary()))
    except BaseException as exc:
        results.put((os.getpid(), repr(exc), None))


def _hammer(location: str, dataset: str, limit: int, seed: int, results: Any) -> None:
    """Read row groups in a random order through a cache too small for them all; check every value."""
    try:
        store = open_dataset(dataset)
        cache = LocalDiskCache(location, limit, cleanup=False)
        order = np.random.default_rng(seed).permutation(len(store.row_groups) * 3) % len(store.row_groups)
        for group in order:
            table = cache.get_row_group(store, int(group), COLUMNS)
            assert table.equals(store.read_row_group(int(group), COLUMNS))
        results.put((os.getpid(), "ok", None))
    except BaseException as exc:
        results.put((os.getpid(), repr(exc), None))


def start(target: Any, *args: Any) -> Any:
    """A forked daemon process running ``target(*args)`` (daemon: a failed test leaves none behind)."""
    assert CONTEXT is not None
    process = CONTEXT.Process(target=target, args=args, daemon=True)
    process.start()
    return process


def stop(*processes: Any) -> None:
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(BOUND)


def run(target: Any, args_list: list[tuple[Any, ...]]) -> list[tuple[int, Any, Any]]:
    """Start one forked process per argument tuple (each gets the results queue last); their results."""
    assert CONTEXT is not None
    results = CONTEXT.Queue()
    processes = [start(target, *args, results) for args in args_list]
    try:
        found = [results.get(timeout=BOUND) for _ in processes]
        for process in processes:
            process.join(BOUND)
            assert process.exitcode == 0
    finally:
        stop(*processes)
    for pid, value, _ in found:
        assert not isinstance(value, str) or value == "ok", f"process {pid}: {value}"
    return found


def wait_for(path: Path, process: Any) -> None:
    deadline = time.monotonic() + BOUND
    while not path.exists():
        assert time.monotonic() < deadline and process.is_alive(), f"{path.name} never appeared"
        time.sleep(0.01)


# -- one download per node ---------------------------------------------------------------------------
def test_racing_processes_fetch_each_row_group_once(dataset, tmp_path):
    groups = len(open_dataset(dataset).row_groups)
    log = tmp_path / "reads.log"
    run(_read_all, [(str(tmp_path / "alone"), str(dataset), str(log), 0.0, CONTEXT.Barrier(1))])
    once = sorted(data_reads(log))  # what one process reads from the store with a cold cache
    log.unlink()

    location, processes = tmp_path / "shared", 4
    barrier = CONTEXT.Barrier(processes)
    found = run(_read_all, [(str(location), str(dataset), str(log), 0.05, barrier)] * processes)

    assert sorted(data_reads(log)) == once, "a row group was read from the store by more than one process"
    for _, rows, _ in found:
        assert len(rows) == N and {r[0]: r for r in rows} == expected_rows()
    # read once every process ended: a process's own figure was taken before the last of the others' hits
    node = LocalDiskCache(str(location), 64 * MB, cleanup=False).node_stats()
    # every process's misses fetched; every other look-up was served from the directory
    assert (node["fetches"], node["misses"], node["hits"]) == (groups, groups, (processes - 1) * groups)
    assert node["waits"] >= 1 and node["bytes_fetched"] > 0 and node["entries"] == groups
    assert node["bytes_served"] == (processes - 1) * node["bytes_fetched"]
    for _, _, stats in found:  # each reader sees its own counts, which add up to the node's
        assert stats["reader"]["hits"] + stats["reader"]["misses"] == groups
    assert sum(s["reader"]["fetches"] for _, _, s in found) == groups
    assert leftovers(location) == []


def test_a_fetcher_killed_mid_fetch_is_taken_over(dataset, tmp_path):
    assert CONTEXT is not None
    location, log, gate = tmp_path / "cache", tmp_path / "reads.log", tmp_path / "gate"
    results = CONTEXT.Queue()
    holder = start(_fetch_group, str(location), str(dataset), str(log), str(gate), 600.0, results)
    waiter: Any = None
    try:
        wait_for(Path(str(gate) + ".entered"), holder)  # the holder is in the middle of reading row group 0
        waiter = start(_fetch_group, str(location), str(dataset), str(log), None, 600.0, results)
        time.sleep(1.0)
        assert data_reads(log, waiter.pid) == [], "the waiter fetched while another was fetching"
        assert waiter.is_alive(), results.get(timeout=BOUND)

        os.kill(holder.pid, signal.SIGKILL)
        holder.join(BOUND)
        pid, ids, summary = results.get(timeout=BOUND)
        waiter.join(BOUND)
    finally:
        stop(holder, *([waiter] if waiter else []))
    assert pid == waiter.pid and waiter.exitcode == 0, ids
    assert ids == open_dataset(dataset).read_row_group(0, ["id"]).column("id").to_pylist()
    assert data_reads(log, waiter.pid), "the waiter took the fetch over"
    node = summary["node"]
    assert (node["fetches"], node["hits"], node["entries"]) == (1, 0, 1)  # the killed fetch never completed
    assert leftovers(location) == []


def test_a_waiter_fetches_itself_after_fetch_wait_seconds(dataset, tmp_path):
    """A fetcher that is alive but stuck holds the others back ``fetch_wait_seconds`` at most."""
    assert CONTEXT is not None
    location, log, gate = tmp_path / "cache", tmp_path / "reads.log", tmp_path / "gate"
    results = CONTEXT.Queue()
    holder = start(_fetch_group, str(location), str(dataset), str(log), str(gate), 600.0, results)
    try:
        wait_for(Path(str(gate) + ".entered"), holder)
        began = time.monotonic()
        _, ids, summary = run(_fetch_group, [(str(location), str(dataset), str(log), None, 0.5)])[0]
        assert 0.5 <= time.monotonic() - began < BOUND
        assert ids == open_dataset(dataset).read_row_group(0, ["id"]).column("id").to_pylist()
        assert summary["reader"]["waits"] == 0 and summary["reader"]["fetches"] == 1
        gate.touch()  # the holder goes on, and stores the same entry again
        _, held_ids, _ = results.get(timeout=BOUND)
        holder.join(BOUND)
    finally:
        stop(holder)
    assert held_ids == ids and holder.exitcode == 0
    assert leftovers(location) == []


def test_racing_writers_keep_the_cache_under_its_limit(dataset, tmp_path):
    location = tmp_path / "cache"
    store = open_dataset(dataset)
    probe = LocalDiskCache(tmp_path / "probe", 64 * MB)
    probe.get_row_group(store, 0, COLUMNS)
    limit = int(probe.volume() * 3.5)
    run(_hammer, [(str(location), str(dataset), limit, seed) for seed in range(4)])
    entries = sum(p.stat().st_size for p in location.glob("*.arrow"))
    assert 0 < entries <= limit
    assert leftovers(location) == []
    node = LocalDiskCache(location, limit, cleanup=False).node_stats()
    assert node["evictions"] > 0 and node["bytes"] == entries
    assert node["hits"] + node["misses"] == 4 * 3 * len(store.row_groups)


def test_a_process_pool_reports_its_workers_counts(dataset, tmp_path):
    groups = len(open_dataset(dataset).row_groups)
    with make_reader(dataset, reader_pool_type="process", workers_count=2, num_epochs=2, schema_fields=COLUMNS,
                     **cache_args(tmp_path / "cache")) as reader:
        rows = [row_values(r) for r in reader]
        stats = reader.cache_stats
    assert len(rows) == 2 * N
    assert stats["reader"]["misses"] == stats["reader"]["fetches"] == groups
    assert stats["reader"]["hits"] == groups and stats["node"]["entries"] == groups
    assert make_reader(dataset).cache_stats is None  # no local-disk cache, no statistics


def test_ended_processes_are_folded_into_one_file(dataset, tmp_path):
    location = tmp_path / "cache"
    run(_fetch_group, [(str(location), str(dataset), str(tmp_path / "log"), None, 1.0)] * 3)
    # three files, or two: a process that summed the node's counts folds a sibling that had ended (a zombie)
    assert 2 <= len(list((location / ".stats").iterdir())) <= 3
    node = LocalDiskCache(location, 64 * MB, cleanup=False).node_stats()
    assert node["fetches"] + node["hits"] == 3 and node["fetches"] >= 1
    assert [p.name for p in (location / ".stats").iterdir()] == ["node.bin"]
    assert LocalDiskCache(location, 64 * MB, cleanup=False).node_stats() == node


def test_only_processes_known_to_have_ended_are_folded(tmp_path):
    """A stats file names its process after the counters: one of another pid namespace (a container sharing the
    directory) is not asked for by its pid here, where that pid means nothing (its live file was folded and
    removed, and its reader's counts read zero from then on); a pid now of another process is an ended one."""
    import subprocess
    import sys

    from unihub.fs import atomic
    from unihub.readers.local_disk_cache import _STATS_FORMAT
    from unihub.runtime import processes

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    here = atomic._owner().partition("-")[0]
    owners = {"aaaa0001": f"0ther0ns-{gone.pid}-123",  # another namespace: its pid cannot be asked here
              "aaaa0002": f"{here}-{gone.pid}-123",  # this namespace, and gone
              "aaaa0003": f"{here}-{os.getppid()}-{(processes.start_time(os.getppid()) or 0) + 1}"}  # pid reused
    stats = tmp_path / "cache" / ".stats"
    stats.mkdir(parents=True)
    for token, owner in owners.items():
        pid = owner.split("-")[1]
        (stats / f"{token}-{pid}.bin").write_bytes(_STATS_FORMAT.pack(1, *[0] * 8) + owner.encode())
    node = LocalDiskCache(tmp_path / "cache", 64 * MB, cleanup=False).node_stats()
    assert node["hits"] == 3
    assert sorted(p.name for p in stats.iterdir()) == [f"aaaa0001-{gone.pid}.bin", "node.bin"]


def test_a_killed_writers_temporary_file_is_removed_by_the_next_commit(dataset, tmp_path):
    """An entry's temporary file names its writer: one killed while writing leaves it, and the next commit of any
    process removes it (it stayed an hour outside the size limit); a live writer's stays."""
    import subprocess
    import sys

    from unihub.fs import atomic

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    here, _, _ = atomic._owner().partition("-")
    location = tmp_path / "cache"
    location.mkdir()
    dead = location / f".{'a' * 40}.arrow.{here}-{gone.pid}-1.0123abcd.tmp"
    live = location / f".{'b' * 40}.arrow.{atomic._owner()}.0123abcd.tmp"
    for path in (dead, live):
        path.write_bytes(b"half an entry")
    LocalDiskCache(location, 64 * MB).get_row_group(open_dataset(dataset), 0, COLUMNS)
    assert not dead.exists() and live.exists()


def test_cleanup_removes_the_statistics_too(dataset, tmp_path):
    location = tmp_path / "cache"
    cache = LocalDiskCache(location, 64 * MB)
    cache.get_row_group(open_dataset(dataset), 0, COLUMNS)
    assert (location / ".stats").is_dir()
    cache.cleanup()
    assert not location.exists()


def test_fetch_wait_seconds_is_checked(tmp_path):
    with pytest.raises(CacheConfigError, match="fetch_wait_seconds"):
        LocalDiskCache(tmp_path, MB, fetch_wait_seconds=-1)


# -- on an object store -------------------------------------------------------------------------------
BLOB_SCHEMA_ROWS, BLOB_BYTES = 24, 200_000


def blob_schema() -> Any:
    import pyarrow as pa

    from unihub.schema.codecs import NdarrayCodec, ScalarCodec
    from unihub.schema.unischema import Unischema, UnischemaField

    return Unischema("NodeCacheBlobs", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                        UnischemaField("blob", np.uint8, (BLOB_BYTES,), NdarrayCodec(), False)])


def blob(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, BLOB_BYTES, dtype=np.uint8)


def _read_s3(location: str, url: str, barrier: Any, results: Any) -> None:
    try:
        barrier.wait(BOUND)
        with make_reader(url, reader_pool_type="dummy", shuffle_row_groups=False,
                         **cache_args(Path(location))) as reader:
            rows = {int(r.id): bool(np.array_equal(r.blob, blob(int(r.id)))) for r in reader}
            results.put((os.getpid(), rows, reader.cache_stats))
    except BaseException as exc:
        results.put((os.getpid(), repr(exc), None))


def data_gets(s3_server: Any, prefix: str, footers: dict[str, int]) -> list[tuple[str, str]]:
    """The ranged GETs of row-group pages (ending before their file's footer) under ``prefix``."""
    found = []
    for path, byte_range in s3_server.requests.object_reads(f"{s3_server.bucket}/{prefix}"):
        name = path.rsplit("/", 1)[-1]
        if byte_range and name in footers and int(byte_range.split("-")[1]) < footers[name]:
            found.append((name, byte_range))
    return sorted(found)


@pytest.mark.slow
def test_processes_on_an_object_store_fetch_each_row_group_once(s3_server, tmp_path):
    import uuid

    import pyarrow.parquet as pq

    local = tmp_path / "blobs"
    write_dataset(local, blob_schema(), ({"id": i, "blob": blob(i)} for i in range(BLOB_SCHEMA_ROWS)),
                  row_group_size_mb=0.7, rows_per_file=12)
    footers = {}
    for path in local.glob("*.parquet"):
        metadata = pq.ParquetFile(path).metadata
        footers[path.name] = path.stat().st_size - 8 - metadata.serialized_size
    groups = len(open_dataset(local).row_groups)
    assert groups >= 4
    prefix = f"node-cache-{uuid.uuid4().hex[:8]}"
    s3_server.upload_folder(local, prefix)
    # pyarrow's S3 filesystem: no read-ahead buffer, so each row group's pages are the same GETs in any process
    url = f"s3://{s3_server.bucket}/{prefix}?endpoint_override={s3_server.host}:{s3_server.port}&scheme=http"

    s3_server.requests.clear()
    run(_read_s3, [(str(tmp_path / "alone"), url, CONTEXT.Barrier(1))])
    once = data_gets(s3_server, prefix, footers)
    assert len(once) >= groups

    s3_server.requests.clear()
    processes = 3
    found = run(_read_s3, [(str(tmp_path / "shared"), url, CONTEXT.Barrier(processes))] * processes)
    assert data_gets(s3_server, prefix, footers) == once, "a row group was fetched by more than one process"
    for _, rows, _ in found:
        assert rows == dict.fromkeys(range(BLOB_SCHEMA_ROWS), True)
    # read once every process ended: a process's own figure was taken before the last of the others' hits
    node = LocalDiskCache(str(tmp_path / "shared"), 64 * MB, cleanup=False).node_stats()
    assert (node["fetches"], node["hits"]) == (groups, (processes - 1) * groups)
    assert leftovers(tmp_path / "shared") == []


def test_threads_missing_one_row_group_fetch_it_once(dataset, tmp_path):
    """Threads exclude each other too (each takes the lock on its own descriptor); so does ``get``."""
    import threading

    log = tmp_path / "reads.log"
    store = open_dataset(dataset, filesystem=WatchedFileSystem(str(log), delay=0.2))
    cache = LocalDiskCache(tmp_path / "cache", 64 * MB, cleanup=False)
    start = threading.Barrier(4)
    tables: list[Any] = []
    values: list[Any] = []
    calls: list[int] = []

    def read() -> None:
        start.wait()
        tables.append(cache.get_row_group(store, 1, COLUMNS))
        values.append(cache.get("key", lambda: calls.append(1) or time.sleep(0.2) or {"value": 1}))

    threads = [threading.Thread(target=read) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BOUND)
    expected = open_dataset(dataset).read_row_group(1, COLUMNS)
    assert [t.equals(expected) for t in tables] == [True] * 4 and values == [{"value": 1}] * 4
    assert len({(path, offset) for path, offset, _ in data_reads(log)}) == len(data_reads(log)) > 0
    assert calls == [1]
    assert cache.node_stats()["fetches"] == 2 and cache.node_stats()["waits"] >= 1
