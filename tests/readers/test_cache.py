"""The local-disk cache: hits instead of store reads, identical values, eviction, corruption, pools.

Store reads are counted by wrapping ``ParquetStore.read_row_group`` so that each call appends
a line to a file: the count is right for the thread pool and for forked worker processes.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from unihub import (
    UnihubError,
    in_lambda,
    open_dataset,
    write_dataset,
)
from unihub.readers.local_disk_cache import CacheConfigError, LocalDiskCache
from unihub.readers.reader import make_batch_reader, make_cache, make_reader
from unihub.store import footer_cache
from unihub.store.dataset import ParquetStore

from .sample import assert_rows_equal, rows_by_id, sample_schema

N = 60
SCHEMA = sample_schema("CacheTest")
MB = 2**20


def make_row(i: int, salt: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(i + 1000 * salt)
    return {"id": i, "name": f"row-{i}-{salt}", "score": None if i % 5 == 0 else float(np.float32(i / 3 + salt)),
            "vec": rng.random(3, dtype=np.float32), "boxes": rng.random((i % 3, 4), dtype=np.float32),
            "emb": rng.standard_normal(2)}


def write(path: Path, n: int = N, salt: int = 0, **options: Any) -> Path:
    write_dataset(path, SCHEMA, (make_row(i, salt) for i in range(n)), row_group_size_mb=0.001, rows_per_file=20,
                  **options)
    return path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    path = write(tmp_path_factory.mktemp("cache") / "ds")
    assert len(open_dataset(path).row_groups) >= 10, "the tests need many row groups"
    return path


@pytest.fixture
def store_reads(monkeypatch, tmp_path) -> Callable[[], int]:
    """``store_reads()``: how many row-group reads reached the store (any thread or forked process)."""
    log = tmp_path / "store-reads.log"
    log.touch()
    original = ParquetStore.read_row_group

    def counting(self: ParquetStore, index: int, columns: Any = None, **kwargs: Any) -> pa.Table:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, f"{index}\n".encode())
        finally:
            os.close(fd)
        return original(self, index, columns, **kwargs)

    monkeypatch.setattr(ParquetStore, "read_row_group", counting)
    return lambda: len(log.read_text().split())


def cache_args(location: Path, limit: int = 64 * MB, **settings: Any) -> dict[str, Any]:
    """A local-disk cache that outlives its reader (``cleanup=False``), so tests can look into it."""
    return {"cache_type": "local-disk", "cache_location": str(location), "cache_size_limit": limit,
            "cache_extra_settings": {"cleanup": False, **settings}}


def entries(location: Path) -> list[Path]:
    return sorted(location.glob("*.arrow"))


def directory_bytes(location: Path) -> int:
    return sum(p.stat().st_size for p in location.iterdir() if p.is_file())


# -- hits -------------------------------------------------------------------------------------------
def test_second_epoch_is_served_from_the_cache(dataset, tmp_path, store_reads):
    groups = len(open_dataset(dataset).row_groups)
    reader = make_reader(dataset, reader_pool_type="dummy", num_epochs=2, shuffle_row_groups=False,
                         **cache_args(tmp_path / "cache"))
    with reader:
        first = [next(reader) for _ in range(N)]
        assert store_reads() == groups
        second = list(reader)
    assert store_reads() == groups, "the second epoch read the store"
    assert len(entries(tmp_path / "cache")) == groups
    assert_rows_equal({int(r.id): r for r in second}, {int(r.id): r for r in first})

    again = rows_by_id(make_reader(dataset, **cache_args(tmp_path / "cache")))  # a new reader, the same cache
    assert store_reads() == groups
    assert_rows_equal(again, {int(r.id): r for r in first})


@pytest.mark.parametrize("settings", [{}, {"compression": "lz4"}, {"compression": "zstd"}])
def test_values_are_identical_with_and_without_the_cache(dataset, tmp_path, store_reads, settings):
    def batches(**options: Any) -> dict[str, np.ndarray]:
        with make_batch_reader(dataset, shuffle_row_groups=False, **options) as reader:
            found = list(reader)
        return {name: np.concatenate([getattr(b, name) for b in found]) for name in ("id", "vec", "score")}

    plain, plain_batches = rows_by_id(make_reader(dataset)), batches()
    cold = rows_by_id(make_reader(dataset, **cache_args(tmp_path / "cache", **settings)))
    reads = store_reads()
    warm = rows_by_id(make_reader(dataset, **cache_args(tmp_path / "cache", **settings)))
    warm_batches = batches(**cache_args(tmp_path / "cache", **settings))
    assert store_reads() == reads
    assert_rows_equal(cold, plain)
    assert_rows_equal(warm, plain)
    for name, values in warm_batches.items():
        np.testing.assert_array_equal(values, plain_batches[name])


def test_cached_table_equals_the_stored_one(dataset, tmp_path):
    store = open_dataset(dataset)
    cache = LocalDiskCache(tmp_path / "cache", 64 * MB)
    columns = ["vec", "id", "name"]
    for _ in range(2):
        table = cache.get_row_group(store, 3, columns)
        expected = store.read_row_group(3, columns)
        assert table.column_names == columns
        assert table.equals(expected) and table.schema.equals(expected.schema, check_metadata=True)
    assert (cache.stats.hits, cache.stats.misses, cache.stats.writes) == (1, 1, 1)


def test_column_selections_do_not_collide(dataset, tmp_path, store_reads):
    store = open_dataset(dataset)
    cache = LocalDiskCache(tmp_path / "cache", 64 * MB)
    only_id = cache.get_row_group(store, 0, ["id"])
    two = cache.get_row_group(store, 0, ["vec", "id"])
    assert only_id.column_names == ["id"] and two.column_names == ["vec", "id"]
    assert store_reads() == 2 and len(entries(tmp_path / "cache")) == 2
    swapped = cache.get_row_group(store, 0, ["id", "vec"])  # the same selection in another order: a hit
    assert swapped.column_names == ["id", "vec"] and swapped.equals(two.select(["id", "vec"]))
    assert store_reads() == 2
    other_group = cache.get_row_group(store, 1, ["id"])
    assert other_group.column("id").to_pylist() != only_id.column("id").to_pylist()

    ids = rows_by_id(make_reader(dataset, schema_fields=["id"], **cache_args(tmp_path / "cache2")))
    full = rows_by_id(make_reader(dataset, **cache_args(tmp_path / "cache2")))
    assert set(ids) == set(full) == set(range(N))
    assert all(row._fields == ("id",) for row in ids.values())
    assert_rows_equal(full, rows_by_id(make_reader(dataset)))


def test_predicate_reads_are_cached_too(dataset, tmp_path, store_reads):
    predicate = in_lambda(["id"], lambda i: i % 3 == 0)
    expected = rows_by_id(make_reader(dataset, predicate=predicate))
    reads = store_reads()
    cold = rows_by_id(make_reader(dataset, predicate=predicate, **cache_args(tmp_path / "cache")))
    after_cold = store_reads()
    warm = rows_by_id(make_reader(dataset, predicate=predicate, **cache_args(tmp_path / "cache")))
    assert store_reads() == after_cold > reads
    assert_rows_equal(cold, expected)
    assert_rows_equal(warm, expected)


def test_rewritten_dataset_is_not_served_stale(tmp_path, store_reads):
    path = write(tmp_path / "ds", 20)
    before = rows_by_id(make_reader(path, **cache_args(tmp_path / "cache")))
    write(path, 20, salt=1, overwrite=True)
    after = rows_by_id(make_reader(path, **cache_args(tmp_path / "cache")))
    assert after[1].name == "row-1-1" and before[1].name == "row-1-0"
    assert_rows_equal(after, rows_by_id(make_reader(path)))



def test_a_file_rewritten_at_its_size_and_time_is_not_served_stale(tmp_path, store_reads):
    """Object stores report modification times in whole seconds: a part rewritten within the second at
    its size keeps its (size, mtime) there. Simulated on a local disk by putting the time back (and by
    forgetting the footers of local files this process read, as another process would)."""
    path = write(tmp_path / "ds", 20, compression=None)  # uncompressed: the salt keeps each file's size
    other = write(tmp_path / "other", 20, salt=1, compression=None)
    parts = sorted(p.name for p in path.glob("*.parquet"))
    assert parts == sorted(p.name for p in other.glob("*.parquet"))
    assert [(path / p).stat().st_size for p in parts] == [(other / p).stat().st_size for p in parts]
    before = rows_by_id(make_reader(path, **cache_args(tmp_path / "cache")))
    for name in parts:
        times = (path / name).stat()
        shutil.copyfile(other / name, path / name)
        os.utime(path / name, ns=(times.st_atime_ns, times.st_mtime_ns))
    footer_cache.FOOTERS.clear()
    after = rows_by_id(make_reader(path, **cache_args(tmp_path / "cache")))
    assert before[1].name == "row-1-0" and after[1].name == "row-1-1"
    assert_rows_equal(after, rows_by_id(make_reader(other)))


# -- eviction ---------------------------------------------------------------------------------------
def test_eviction_keeps_the_directory_under_the_limit(dataset, tmp_path, store_reads):
    store = open_dataset(dataset)
    location = tmp_path / "cache"
    probe = LocalDiskCache(tmp_path / "probe", 64 * MB)
    probe.get_row_group(store, 0, list(SCHEMA.fields))
    entry_size = probe.volume()
    limit = int(entry_size * 3.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        reader_rows = rows_by_id(make_reader(dataset, num_epochs=2, **cache_args(location, limit)))
    assert set(reader_rows) == set(range(N))
    assert 0 < directory_bytes(location) <= limit
    assert 1 <= len(entries(location)) <= 3
    assert not list(location.glob(".*.tmp"))


def test_eviction_is_least_recently_used(dataset, tmp_path):
    store = open_dataset(dataset)
    columns = ["id", "vec"]
    probe = LocalDiskCache(tmp_path / "probe", MB)
    for g in range(4):
        probe.get_row_group(store, g, columns)
    assert len({p.stat().st_size for p in entries(tmp_path / "probe")}) == 1, "the test needs equal row groups"
    probe = LocalDiskCache(tmp_path / "probe2", MB)
    probe.get_row_group(store, 0, columns)
    cache = LocalDiskCache(tmp_path / "cache", int(probe.volume() * 3.5))
    names = {}
    for g in (0, 1, 2):
        cache.get_row_group(store, g, columns)
        names[g] = set(p.name for p in entries(tmp_path / "cache")) - set().union(*names.values())
    cache.get_row_group(store, 0, columns)  # a hit: 0 is now the most recently used
    cache.get_row_group(store, 3, columns)  # evicts 1, the least recently used
    left = {p.name for p in entries(tmp_path / "cache")}
    names[3] = left - names[0] - names[2]
    assert names[0] <= left and names[2] <= left and not names[1] & left and len(names[3]) == 1
    assert cache.stats.evictions == 1

    stored = LocalDiskCache(tmp_path / "lrs", int(probe.volume() * 3.5), eviction_policy="least-recently-stored")
    for g in (0, 1, 2, 0, 3):  # the hit on 0 does not count: 0 is the least recently stored
        stored.get_row_group(store, g, columns)
    assert {p.name for p in entries(tmp_path / "lrs")} == names[1] | names[2] | names[3]
    assert stored.stats.hits == 1

    none = LocalDiskCache(tmp_path / "none", int(probe.volume() * 3.5), eviction_policy="none")
    for g in (0, 1, 2, 3, 0, 3):
        none.get_row_group(store, g, columns)
    assert len(entries(tmp_path / "none")) == 3 and none.stats.evictions == 0 and none.stats.hits == 1


def test_entry_larger_than_the_limit_is_not_stored(dataset, tmp_path, store_reads):
    rows = rows_by_id(make_reader(dataset, **cache_args(tmp_path / "cache", limit=64)))
    assert set(rows) == set(range(N))
    assert entries(tmp_path / "cache") == []


def test_files_not_the_caches_are_neither_counted_nor_evicted_nor_cleaned_up(dataset, tmp_path):
    """A cache_location that holds other files (a user's own Arrow file, an old ``.tmp``): eviction, the
    stale-file sweep and cleanup() keep to the names the cache gives its own files."""
    location = tmp_path / "cache"
    location.mkdir()
    mine = location / "mydata.arrow"
    with pa.OSFile(str(mine), "wb") as sink, pa.ipc.new_file(sink, pa.schema([("a", pa.int64())])) as writer:
        writer.write_table(pa.table({"a": np.arange(50_000)}))
    notes = location / "notes.tmp"
    notes.write_text("mine")
    for path in (mine, notes):
        os.utime(path, (1, 1))  # older than anything the cache writes, and than its stale-file age
    cache = LocalDiskCache(location, mine.stat().st_size // 2)
    store = open_dataset(dataset)
    for group in range(3):
        cache.get_row_group(store, group, ["id", "vec"])
    assert mine.exists() and notes.exists()
    assert cache.stats.evictions == 0 and len(entries(location)) == 4
    assert cache.node_stats()["entries"] == 3 and cache.volume() < mine.stat().st_size
    cache.cleanup()
    assert sorted(p.name for p in location.iterdir()) == ["mydata.arrow", "notes.tmp"]


# -- damaged entries --------------------------------------------------------------------------------
def test_corrupt_or_partial_entries_are_read_again(dataset, tmp_path, store_reads):
    location = tmp_path / "cache"
    expected = rows_by_id(make_reader(dataset, **cache_args(location)))
    files = entries(location)
    reads = store_reads()
    damaged = files[:4]
    data = damaged[0].read_bytes()
    damaged[0].write_bytes(data[: len(data) // 2])  # truncated: no footer
    damaged[1].write_bytes(b"")  # empty
    damaged[2].write_bytes(os.urandom(len(data)))  # garbage
    damaged[3].write_bytes(files[4].read_bytes())  # a valid entry under another entry's name
    again = rows_by_id(make_reader(dataset, **cache_args(location)))
    assert_rows_equal(again, expected)
    assert store_reads() == reads + 4
    assert entries(location) == files  # rewritten
    rows_by_id(make_reader(dataset, **cache_args(location)))
    assert store_reads() == reads + 4


def test_unwritable_entries_warn_and_read_on(dataset, tmp_path, store_reads, monkeypatch):
    import pyarrow.ipc

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pyarrow.ipc, "new_file", fail)
    with pytest.warns(RuntimeWarning, match="cannot write"):
        rows = rows_by_id(make_reader(dataset, reader_pool_type="dummy", **cache_args(tmp_path / "cache")))
    assert set(rows) == set(range(N))
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.name not in (".lock", ".stats")] == []


# -- pools and processes ----------------------------------------------------------------------------
@pytest.mark.parametrize("pool", ["thread", "process"])
def test_pools_fill_and_hit_the_cache(dataset, tmp_path, store_reads, pool):
    groups = len(open_dataset(dataset).row_groups)
    location = tmp_path / "cache"
    expected = rows_by_id(make_reader(dataset))
    base = store_reads()
    cold = rows_by_id(make_reader(dataset, reader_pool_type=pool, workers_count=3, **cache_args(location)))
    assert store_reads() - base == groups
    warm = rows_by_id(make_reader(dataset, reader_pool_type=pool, workers_count=3, **cache_args(location)))
    assert store_reads() - base == groups
    assert_rows_equal(cold, expected)
    assert_rows_equal(warm, expected)
    assert len(entries(location)) == groups and not list(location.glob(".*.tmp"))


def test_process_pool_under_eviction_pressure(dataset, tmp_path):
    location = tmp_path / "cache"
    store = open_dataset(dataset)
    probe = LocalDiskCache(tmp_path / "probe", 64 * MB)
    probe.get_row_group(store, 0, list(SCHEMA.fields))
    limit = int(probe.volume() * 4.5)
    expected = rows_by_id(make_reader(dataset))
    with make_reader(dataset, reader_pool_type="process", workers_count=3, num_epochs=3,
                     **cache_args(location, limit)) as reader:
        rows = list(reader)
    assert len(rows) == 3 * N
    assert_rows_equal({int(r.id): r for r in rows[-N:]}, expected)
    assert 0 < directory_bytes(location) <= limit


def _hammer(location: str, dataset: str, limit: int, seed: int) -> list[int]:
    store = open_dataset(dataset)
    cache = LocalDiskCache(location, limit)
    order = np.random.default_rng(seed).permutation(len(store.row_groups) * 3) % len(store.row_groups)
    out = []
    for g in order:
        table = cache.get_row_group(store, int(g), ["id", "vec"])
        assert table.column("id").to_pylist() == store.read_row_group(int(g), ["id"]).column("id").to_pylist()
        out.append(int(g))
    return out


def test_concurrent_processes_share_one_directory(dataset, tmp_path):
    location = tmp_path / "cache"
    store = open_dataset(dataset)
    probe = LocalDiskCache(tmp_path / "probe", 64 * MB)
    probe.get_row_group(store, 0, ["id", "vec"])
    limit = int(probe.volume() * 5.5)
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with context.Pool(4) as pool:
        results = pool.starmap(_hammer, [(str(location), str(dataset), limit, seed) for seed in range(4)])
    assert all(len(r) == 3 * len(store.row_groups) for r in results)
    assert 0 < directory_bytes(location) <= limit
    assert not list(location.glob(".*.tmp"))


# -- configuration ----------------------------------------------------------------------------------
def test_cache_location_is_required(dataset):
    with pytest.raises(CacheConfigError, match="cache_location") as info:
        make_reader(dataset, cache_type="local-disk", cache_size_limit=MB)
    assert isinstance(info.value, UnihubError) and isinstance(info.value, ValueError)
    with pytest.raises(CacheConfigError, match="cache_size_limit"):
        make_cache("local-disk", "/tmp/unused-cache", None)
    with pytest.raises(CacheConfigError, match="local directory"):
        LocalDiskCache("s3://bucket/cache", MB)
    with pytest.raises(CacheConfigError, match="unknown cache_extra_settings"):
        LocalDiskCache("/tmp/unused-cache", MB, colour="blue")
    with pytest.raises(CacheConfigError, match="compression"):
        LocalDiskCache("/tmp/unused-cache", MB, compression="gzip")
    with pytest.raises(CacheConfigError, match="5 rows"):
        LocalDiskCache("/tmp/unused-cache", 100, 50)


def test_the_size_check_is_petastorms_per_shard_and_off_without_eviction(tmp_path):
    """Petastorm's check: ``size_limit_bytes / shards >= 5 * expected_row_size_bytes``, a ValueError in
    its words; skipped with ``eviction_policy='none'``, which never evicts a new entry."""
    words = "Condition 'size_limit_bytes / shards < 5 \\* expected_row_size_bytes' needs to hold"
    with pytest.raises(ValueError, match=words) as info:
        LocalDiskCache(tmp_path / "a", 5000, 200, shards=10)  # 500 bytes a shard < 1000
    assert isinstance(info.value, CacheConfigError) and "500 per shard of 10" in str(info.value)
    with pytest.raises(CacheConfigError, match=words):
        LocalDiskCache(tmp_path / "b", 1000, 500)
    assert LocalDiskCache(tmp_path / "c", 5000, 200).get("k", lambda: "v") == "v"  # one shard: 5000 >= 1000
    with pytest.raises(CacheConfigError, match="shards must be a positive integer"):
        LocalDiskCache(tmp_path / "d", 5000, 200, shards=0)
    unchecked = LocalDiskCache(tmp_path / "e", 1000, 500, shards=1, eviction_policy="none")
    assert unchecked.get("k", lambda: "v") == "v" and unchecked.get("k", lambda: "other") == "v"
    made = make_cache("local-disk", str(tmp_path / "f"), 1000, 500, {"eviction_policy": "none", "shards": 6})
    assert isinstance(made, LocalDiskCache)


def test_cleanup_that_cannot_remove_the_directory_prints_petastorms_line(tmp_path, monkeypatch, capsys):
    cache = LocalDiskCache(tmp_path / "cache", MB)
    cache.get("k", lambda: "v")

    def refuse(path: Any, *args: Any, **kwargs: Any) -> None:
        raise OSError(16, "Device or resource busy", str(path))

    monkeypatch.setattr(shutil, "rmtree", refuse)
    cache.cleanup()  # does not raise
    assert capsys.readouterr().out == f"Error during rmtree: [Errno 16] Device or resource busy: '{tmp_path / 'cache'}'\n"
    monkeypatch.undo()
    cache.cleanup()
    assert not (tmp_path / "cache").exists() and capsys.readouterr().out == ""
    cache.cleanup()  # already gone: nothing printed
    assert capsys.readouterr().out == ""


def test_petastorm_arguments_are_accepted(dataset, tmp_path):
    reader = make_reader(dataset, cache_type="local-disk", cache_location=str(tmp_path / "c"), cache_size_limit=MB,
                         cache_row_size_estimate=100, cache_extra_settings={"shards": 6, "cleanup": True})
    assert len(rows_by_id(reader)) == N
    cache = make_cache("local-disk", f"file://{tmp_path / 'c2'}", MB, None, {"shards": 2})
    assert isinstance(cache, LocalDiskCache) and cache.location == str(tmp_path / "c2")


def test_cleanup_removes_the_cache(dataset, tmp_path):
    cache = LocalDiskCache(tmp_path / "cache", 64 * MB)
    cache.get_row_group(open_dataset(dataset), 0, ["id"])
    cache.cleanup()
    assert not (tmp_path / "cache").exists()
    cache.cleanup()  # twice is fine

    (tmp_path / "notes.txt").write_text("not the cache's")  # a directory shared with other files
    shared = LocalDiskCache(tmp_path, 64 * MB)
    shared.get_row_group(open_dataset(dataset), 0, ["id"])
    assert entries(tmp_path)
    shared.cleanup()
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_cache_is_picklable(tmp_path):
    import pickle

    cache = pickle.loads(pickle.dumps(LocalDiskCache(tmp_path / "cache", MB, compression="lz4")))
    assert cache.location == str(tmp_path / "cache") and cache.compression == "lz4"



def test_petastorms_cache_contract(dataset, tmp_path):
    """Reader.cache, cleanup_cache(), the cache removed when the with-block ends (Petastorm's default
    cleanup=True), and get(key, fill_cache_func) for any value."""
    from unihub.readers.cache import CacheBase, NullCache

    with make_reader(dataset, cache_type="local-disk", cache_location=str(tmp_path / "c"),
                     cache_size_limit=64 * MB) as reader:
        assert isinstance(reader.cache, LocalDiskCache) and isinstance(reader.cache, CacheBase)
        assert len(list(reader)) == N and entries(tmp_path / "c")
    assert not (tmp_path / "c").exists()  # removed as the reader ended
    with make_reader(dataset) as reader:
        assert isinstance(reader.cache, NullCache) and reader.cache.get("k", lambda: 7) == 7
        reader.cleanup_cache()  # nothing to remove
    cache = LocalDiskCache(tmp_path / "g", 64 * MB)
    calls = []
    value = {"a": np.arange(3), "b": "text"}
    for _ in range(2):
        got = cache.get(("key", 1), lambda: calls.append(1) or value)
        assert got["b"] == "text" and got["a"].tolist() == [0, 1, 2]
    table = pa.table({"x": [1, 2]}).replace_schema_metadata({"mine": "kept"})
    assert cache.get("t", lambda: table).equals(table, check_metadata=True)
    assert cache.get("t", lambda: None).equals(table, check_metadata=True)  # a hit: the cache's mark taken off
    assert calls == [1] and cache.stats.hits == 2
    cache.cleanup()
    assert not (tmp_path / "g").exists()


def test_get_tells_apart_keys_whose_repr_is_the_same(tmp_path):
    """Keys that print alike are other keys (diskcache, under Petastorm's cache, compares their pickles): a long
    numpy array whose middle differs, an object whose repr shows no state."""
    cache = LocalDiskCache(tmp_path / "g", 64 * MB)
    first = np.arange(2000)
    second = first.copy()
    second[1000] = -1
    assert repr(first) == repr(second)
    assert cache.get(("ids", first), lambda: "first") == "first"
    assert cache.get(("ids", second), lambda: "second") == "second"
    assert cache.get(("ids", first.copy()), lambda: "again") == "first"
    assert [cache.get(key, lambda key=key: repr(key)) for key in (1, 1.0, True, "1", b"1")] == \
        ["1", "1.0", "True", "'1'", "b'1'"]


def test_diskcache_size_limit_setting_is_the_bound_as_in_petastorm(dataset, tmp_path):
    """Petastorm passed cache_extra_settings through to diskcache, whose ``size_limit`` then replaced
    cache_size_limit (under eviction_policy='none' Petastorm kept checking cache_size_limit); it was refused
    as an unknown setting."""
    store = open_dataset(dataset)
    probe = LocalDiskCache(tmp_path / "probe", 64 * MB)
    probe.get_row_group(store, 0, ["id", "vec"])
    limit = int(probe.volume() * 2.5)
    reader = make_reader(dataset, **cache_args(tmp_path / "cache", 64 * MB, size_limit=limit))
    assert len(rows_by_id(reader)) == N and 0 < directory_bytes(tmp_path / "cache") <= limit
    assert LocalDiskCache(tmp_path / "none", MB, size_limit=10, eviction_policy="none").size_limit_bytes == MB
    with pytest.raises(CacheConfigError, match="cache_extra_settings' size_limit must be a positive number"):
        LocalDiskCache(tmp_path / "bad", MB, size_limit=-1)


@pytest.mark.parametrize("inside", ["", "sub/cache", "other"])
def test_a_cache_location_inside_a_dataset_is_refused_before_anything_is_written(tmp_path, inside):
    """cache_location set to the dataset's folder (or one inside it, or inside another dataset) wrote the entries
    among its parts: the reader read on, and the dataset no longer opened (FormatError: an .arrow entry is not a
    Parquet file)."""
    dataset = write(tmp_path / "ds", n=20)
    other = write(tmp_path / "other", n=5)
    parts = sorted(p.name for p in dataset.iterdir())
    location = other / "cache" if inside == "other" else dataset / inside if inside else dataset
    inside_of = other if inside == "other" else dataset
    with pytest.raises(CacheConfigError, match=f"cache_location {location} is inside the dataset in {inside_of}: "):
        make_reader(f"file://{dataset}/", **cache_args(location))
    assert sorted(p.name for p in dataset.iterdir()) == parts and not (other / "cache").exists()
    assert len(rows_by_id(make_reader(dataset))) == 20 and len(rows_by_id(make_reader(other))) == 5
    beside = rows_by_id(make_reader(dataset, **cache_args(tmp_path / "ds-cache")))  # beside it: fine
    assert_rows_equal(beside, rows_by_id(make_reader(dataset)))
