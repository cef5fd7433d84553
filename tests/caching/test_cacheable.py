"""cacheable: built once, versions, failures that leave nothing, stream() on the reader's exact plan, bridges, CLI."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from unihub import ScalarCodec, Unischema, UnischemaField, cacheable, make_reader, write_dataset
from unihub.caching import list_caches, remove_cache
from unihub.cli import main
from unihub.errors import CacheError, InvalidArgumentError

from ..elastic_rest import check_rest_of_epoch

N = 1000


def _rows(n: int = N):
    return ({"id": i, "vec": np.full(3, i, np.float32)} for i in range(n))


@pytest.fixture
def cached(tmp_path: Path):
    return cacheable(tmp_path, dataset_id="toy", version="1", row_group_size_mb=0.005)(_rows)()


def test_the_loader_runs_once_and_later_calls_open_the_cache(tmp_path: Path) -> None:
    calls = []

    @cacheable(tmp_path, dataset_id="once", version="1")
    def make():
        calls.append(1)
        return _rows(10)

    first, second = make(), make()
    assert calls == [1] and len(first) == len(second) == 10 and first.url == second.url
    assert first.take([5, 9]).id.tolist() == [5, 9]
    assert cacheable(tmp_path, dataset_id="once", version="2")(make.__wrapped__)().url.endswith("/once/2")
    assert calls == [1, 1]  # another version builds a new cache
    assert [(c.dataset_id, c.version, c.num_rows) for c in list_caches(tmp_path)] == [("once", "1", 10), ("once", "2", 10)]


def test_a_loader_that_fails_midway_leaves_no_cache_and_the_next_call_builds(tmp_path: Path) -> None:
    def broken():
        for row in _rows(100):
            if row["id"] == 60:
                raise RuntimeError("source went away")
            yield row

    with pytest.raises(RuntimeError, match="source went away"):
        cacheable(tmp_path, dataset_id="ds", version="1")(broken)()
    assert os.listdir(tmp_path / "ds") == []  # no dataset, no temporary, no lease, no record
    assert len(cacheable(tmp_path, dataset_id="ds", version="1")(_rows)()) == N


def test_progress_reports_rows_and_rate(tmp_path: Path) -> None:
    seen: list[tuple[int, float]] = []
    cacheable(tmp_path, dataset_id="p", version="1", progress=lambda rows, rate: seen.append((rows, rate)))(_rows)()
    assert seen[-1][0] == N and seen[-1][1] > 0


@pytest.mark.parametrize("bad", ["../up", ".hidden", "a/b", ""])
def test_ids_and_versions_must_be_folder_names(tmp_path: Path, bad: str) -> None:
    with pytest.raises(CacheError, match="must be letters"):
        cacheable(tmp_path, dataset_id=bad, version="1")
    with pytest.raises(CacheError, match="must be letters"):
        cacheable(tmp_path, dataset_id="ok", version=bad)


@pytest.mark.parametrize("version", ["2.lease", "2.json"])
def test_a_version_cannot_be_another_versions_record_or_lease(tmp_path: Path, version: str) -> None:
    """Version ``2.lease``'s folder would be version 2's lease (version 2 then waited for it an hour, and the
    timeout said to delete it); ``2.json``'s, version 2's record."""
    with pytest.raises(CacheError, match=f"version '{version}' cannot end in .json or .lease"):
        cacheable(tmp_path, dataset_id="ok", version=version)
    with pytest.raises(CacheError, match="cannot end in"):
        remove_cache(tmp_path, "ok", version)
    assert len(cacheable(tmp_path, dataset_id="ok.json", version="2")(_rows)()) == N  # an id may: no sibling


def _ids(reader) -> list[int]:
    with reader:
        return [int(r.id) for r in reader]


@pytest.mark.parametrize("shuffle, world, drop", [(False, 1, False), (True, 1, False), (True, 3, False),
                                                  (True, 3, True), (False, 7, True)])
def test_stream_start_offset_continues_the_exact_order(cached, shuffle: bool, world: int, drop: bool) -> None:
    shards = []
    for rank in range(world):
        full = _ids(cached.stream(shuffle=shuffle, seed=7, shard_rank=rank, num_shards=world, drop_shard_remainder=drop))
        stream = cached.stream(shuffle=shuffle, seed=7, shard_rank=rank, num_shards=world, drop_shard_remainder=drop)
        assert len(stream) == len(full) == (N // world if drop else -(-N // world))
        for offset in (1, 37, len(full) // 2, len(full) - 1):
            assert _ids(cached.stream(offset, shuffle=shuffle, seed=7, shard_rank=rank, num_shards=world,
                                      drop_shard_remainder=drop)) == full[offset:]
        shards.append(full)
    if drop:
        assert len(set().union(*map(set, shards))) == sum(map(len, shards))  # disjoint
    else:
        assert set().union(*map(set, shards)) == set(range(N))  # every row
    if shuffle:
        assert shards[0] != sorted(shards[0])


def test_stream_is_reshuffled_per_epoch_and_offset_applies_to_the_first(cached) -> None:
    ids = _ids(cached.stream(10, shuffle=True, seed=3, num_epochs=2))
    assert len(ids) == 2 * N - 10 and sorted(ids[N - 10:]) == list(range(N)) and ids[:N - 10] != ids[N:2 * N - 10]


def test_stream_refuses_bad_arguments(cached) -> None:
    with pytest.raises(InvalidArgumentError, match="shard_rank"):
        cached.stream(shard_rank=3, num_shards=3)
    with pytest.raises(InvalidArgumentError, match="beyond"):
        cached.stream(start_offset=N)


def test_stream_works_with_every_bridge(cached) -> None:
    pytest.importorskip("torch")
    from unihub.bridges.torch import BatchedDataLoader, DataLoader, TorchIterableDataset

    expected = _ids(cached.stream(100, shuffle=True, seed=1, shard_rank=1, num_shards=2))
    got = [int(i) for b in DataLoader(cached.stream(100, shuffle=True, seed=1, shard_rank=1, num_shards=2),
                                      batch_size=64) for i in b["id"]]
    assert got == expected
    got = [int(i) for b in BatchedDataLoader(cached.stream(100, shuffle=True, seed=1, shard_rank=1, num_shards=2),
                                             batch_size=64) for i in b["id"]]
    assert got == expected
    got = sorted(int(r["id"]) for r in TorchIterableDataset(cached.url, seed=0))
    assert got == list(range(N))
    got = [int(r["id"]) for r in TorchIterableDataset(cached.stream(100, shuffle=True, seed=1, shard_rank=1,
                                                                     num_shards=2))]
    assert got == expected
    import torch

    stream = cached.stream(100, shuffle=True, seed=1, shard_rank=1, num_shards=2)
    batches = torch.utils.data.DataLoader(TorchIterableDataset(stream, batch_size=64), batch_size=None)
    assert [int(i) for b in batches for i in b["id"]] == expected
    with pytest.raises(InvalidArgumentError, match="cannot be split among torch workers"):
        list(torch.utils.data.DataLoader(TorchIterableDataset(cached.stream()), num_workers=1))
    with pytest.raises(InvalidArgumentError, match="served as it is"):
        TorchIterableDataset(cached.stream(), seed=3, shuffle_rows=True)
    from unihub.dependencies import is_available

    if is_available("nvidia.dali"):  # DALI's source takes the same arguments, on the same plan
        from unihub.bridges.dali import DaliBatchSource

        with DaliBatchSource(cached.url, 64, ["id"], shuffle=True, seed=1, shard_id=1, num_shards=2,
                             start_offset=100, last_batch="partial") as source:
            assert [int(i) for (ids,) in source for i in ids] == expected  # one iter(): the first epoch
    pytest.importorskip("tensorflow")
    from unihub.bridges.tf.dataset import make_tf_dataset

    tf_ds = make_tf_dataset(cached.stream(100, shuffle=True, seed=1, shard_rank=1, num_shards=2), batch_size=64)
    assert [int(i) for b in tf_ds for i in b["id"].numpy()] == expected


def test_a_cache_reads_with_make_reader_sharding_and_shuffling(cached) -> None:
    seen = []
    for rank in range(2):
        with make_reader(cached.url, shuffle_rows=True, seed=0, cur_shard=rank, shard_count=2) as reader:
            seen += [int(r.id) for r in reader]
    assert sorted(seen) == list(range(N))


def test_cli_cache_list_rm_and_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for version in ("1", "2"):
        cacheable(tmp_path, dataset_id="cli", version=version)(lambda: _rows(5))()
    assert main(["cache", "list", str(tmp_path), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(c["dataset_id"], c["version"], c["num_rows"], c["source_type"]) for c in listed] == \
        [("cli", "1", 5, "iterable"), ("cli", "2", 5, "iterable")]
    assert main(["inspect", str(tmp_path / "cli" / "2")]) == 0
    assert "cache: cli version 2, from iterable, built " in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "cli" / "2"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cache"]["dataset_id"] == "cli"
    assert main(["cache", "rm", str(tmp_path), "cli", "1"]) == 0
    assert sorted(os.listdir(tmp_path / "cli")) == ["2", "2.json"]
    assert main(["cache", "rm", str(tmp_path), "cli", "9"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"unihub: error: no cache 'cli' version '9' under {tmp_path}"]
    assert main(["cache", "rm", str(tmp_path), "cli"]) == 0
    assert not (tmp_path / "cli").exists()  # the id's folder too, once no version is left in it
    with pytest.raises(CacheError, match="no cache 'cli'"):
        remove_cache(tmp_path, "cli")


@pytest.mark.parametrize("change", [{"version": "../../victim"}, {"dataset_id": "other"}, {"built_at": 1e300},
                                    {"num_rows": "5"}, {"built_at": float("nan")}, {"url": None}])
def test_a_hostile_cache_record_is_a_named_error_and_nothing_outside_the_root_is_removed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict) -> None:
    """Before: a record whose version climbed out of the root made ``unihub cache rm`` delete that folder; one with a
    time the platform cannot show, or values of other types, was a raw OverflowError, ValueError or TypeError."""
    root = tmp_path / "root"
    cacheable(root, dataset_id="cli", version="1")(lambda: _rows(5))()
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "file").write_text("precious")
    record = root / "cli" / "1.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), **change}))
    for argv in (["cache", "list", str(root)], ["cache", "list", str(root), "--json"], ["cache", "rm", str(root), "cli"]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"unihub: error: {record}: not a cache record unihub writes (its ") and err.count("\n") == 1
    assert (tmp_path / "victim" / "file").read_text() == "precious" and (root / "cli" / "1").is_dir()
    assert main(["cache", "rm", str(root), "cli", "1"]) == 0  # the named version: how the error says to mend it
    assert not record.exists() and not (root / "cli" / "1").exists()
    assert (tmp_path / "victim" / "file").read_text() == "precious"
    cacheable(root, dataset_id="cli", version="1")(lambda: _rows(5))()
    record.write_text("[" * 100_000)  # not a record: as if none were published (was a RecursionError)
    assert list_caches(root) == []


def test_a_cache_whose_folder_was_removed_by_hand_is_named_and_built_again_after_rm(tmp_path: Path) -> None:
    """Before: its record still served it, and every read failed with 'no such file or directory'."""
    make = cacheable(tmp_path, dataset_id="gone", version="1")(lambda: _rows(5))
    assert len(make()) == 5
    shutil.rmtree(tmp_path / "gone" / "1")
    with pytest.raises(CacheError, match=re.escape(f"cache {tmp_path / 'gone' / '1'} is recorded but its folder is "
                                                   f"gone; remove the record (unihub cache rm {tmp_path} gone 1)")):
        make()
    assert main(["cache", "rm", str(tmp_path), "gone", "1"]) == 0
    assert len(make()) == 5 and (tmp_path / "gone" / "1").is_dir()


def test_cli_cache_list_of_a_folder_that_is_not_there_is_an_error(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Before: a mistyped root printed an empty table and exited 0; an empty root still lists no caches."""
    for argv in (["cache", "list", str(tmp_path / "typo")], ["cache", "list", str(tmp_path / "typo"), "--json"]):
        assert main(argv) == 1
        assert capsys.readouterr().err == (f"unihub: error: {tmp_path / 'typo'}: no such folder (a cache root is "
                                           "the url given to unihub.cacheable)\n")
    assert not (tmp_path / "typo").exists()
    assert main(["cache", "list", str(tmp_path), "--json"]) == 0 and json.loads(capsys.readouterr().out) == []


def test_a_lease_started_at_a_time_the_platform_cannot_show_is_still_named(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A live build on another host holds the cache; its lease's start of 1e300 was a raw OverflowError."""
    cacheable(tmp_path, dataset_id="cli", version="1")(lambda: _rows(5))()
    (tmp_path / "cli" / "1.lease").write_text(json.dumps({"owner": "elsewhere-1-1", "host": "elsewhere", "pid": 1,
                                                          "started": 1e300, "heartbeat": 1e300, "token": "t"}))
    assert main(["cache", "rm", str(tmp_path), "cli"]) == 1
    assert capsys.readouterr().err.startswith(f"unihub: error: cache {tmp_path / 'cli' / '1'} is being built (pid 1 "
                                              "on elsewhere, building since ?, ")


def test_cli_cache_list_and_rm_on_s3_with_storage_options(s3_server, capsys: pytest.CaptureFixture[str]) -> None:
    """The endpoint only in ``--storage-option`` (the fixture clears AWS_ENDPOINT_URL): without it, no listing."""
    import uuid

    root = f"s3://{s3_server.bucket}/cli-{uuid.uuid4().hex[:8]}"
    cacheable(root, dataset_id="remote", version=1, storage_options=s3_server.storage_options())(lambda: _rows(4))()
    endpoint = ["--storage-option", f"client_kwargs.endpoint_url={s3_server.endpoint_url}"]
    assert main(["cache", "list", root, "--json", *endpoint]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(c["dataset_id"], c["version"], c["num_rows"]) for c in listed] == [("remote", "1", 4)]
    assert main(["cache", "rm", root, "remote", *endpoint]) == 0
    assert capsys.readouterr().out.strip() == f"removed {root}/remote/1"
    assert list_caches(root, storage_options=s3_server.storage_options()) == []


def _read(reader, count: int | None = None) -> list[int]:
    """The ids of the reader's next ``count`` rows (all: None); the reader stays open."""
    out = []
    for row in reader:
        out.append(int(row.id))
        if count is not None and len(out) >= count:
            break
    return out


def _check_rest(taken: list[int], after: list[list[int]], drop: bool) -> None:
    """The new ranks' rows (``after``) are exactly the rows of the epoch not in ``taken``, ranks equal."""
    check_rest_of_epoch(taken, after, N, "drop" if drop else "pad")


@pytest.mark.parametrize("example", range(12))
def test_stream_resumes_every_ranks_offsets_or_states_on_another_world_size(cached, example: int) -> None:
    """Seeded examples over world sizes 1..8 and stop points: a run of ``old`` ranks stops anywhere in the
    epoch; ``new`` ranks resume from every rank's offset (``start_offset=[...]``) or state (``resume_from=``)
    and read exactly the rows none of the old ranks read, each once (``pad``: all; ``drop``: ranks equal)."""
    rng = np.random.default_rng(example)
    old, new, drop, by_state = int(rng.integers(1, 9)), int(rng.integers(1, 9)), bool(example % 2), example % 3 == 0
    per_rank = N // old if drop else -(-N // old)
    stops = [int(s) for s in rng.integers(0, per_rank + 1, old)]
    args = dict(shuffle=True, seed=11, drop_shard_remainder=drop)
    taken, states = [], []
    for rank, stop in enumerate(stops):
        with cached.stream(shard_rank=rank, num_shards=old, **args) as reader:
            taken += _read(reader, stop) if stop else []
            states.append(reader.state_dict())
    if drop:  # the rows past floor(N / old) * old were never any rank's: the resume reads them
        assert len(taken) == len(set(taken))
    after = []
    for rank in range(new):
        resume = dict(resume_from=states) if by_state else dict(start_offset=stops)
        with cached.stream(shard_rank=rank, num_shards=new, **args, **resume) as reader:
            after.append(_read(reader))
    _check_rest(taken, after, drop)


def test_stream_refuses_two_starts_and_offsets_past_a_shard(cached) -> None:
    with cached.stream(shuffle=True, seed=1) as reader:
        _read(reader, 5)
        state = reader.state_dict()
    with pytest.raises(InvalidArgumentError, match="start_offset and resume_from"):
        cached.stream(3, shuffle=True, seed=1, resume_from=state)
    with pytest.raises(InvalidArgumentError, match="start_offset and resume_from"):  # every rank's, even at 0
        cached.stream([0, 0], shuffle=True, seed=1, resume_from=state)
    with pytest.raises(InvalidArgumentError, match="beyond the 500 rows of shard 1"):
        cached.stream([10, 501], shuffle=True, seed=1)
    with pytest.raises(InvalidArgumentError, match="list of them"):
        cached.stream([], shuffle=True, seed=1)
    with cached.stream(shuffle=True, seed=1, resume_from=state) as reader:  # one state: its own rank goes on
        assert len(_read(reader)) == N - 5


def test_stream_takes_numpy_integers_as_ints(cached) -> None:
    """Offsets and ranks read back from a checkpoint are often numpy integers: the same stream as Python ints."""
    args = dict(shuffle=True, seed=2, drop_shard_remainder=True)
    expected = _ids(cached.stream(7, shard_rank=1, num_shards=3, **args))
    assert _ids(cached.stream(np.int64(7), shard_rank=np.int32(1), num_shards=np.int64(3), **args)) == expected
    assert _ids(cached.stream([np.int64(5), 9], shard_rank=1, num_shards=3, **args)) == \
        _ids(cached.stream([5, 9], shard_rank=1, num_shards=3, **args))


@pytest.mark.parametrize("inside", ["", "sub/caches"])
def test_a_cache_root_inside_a_dataset_is_refused_before_anything_is_written(tmp_path: Path, inside: str) -> None:
    """A cache root that is a dataset's folder, or lies inside one: the cache's parts and records became files of
    that dataset, which then did not open (FormatError on the record's .json)."""
    dataset = tmp_path / "ds"
    write_dataset(dataset, Unischema("d", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False)]),
                  ({"id": i} for i in range(5)))
    before = sorted(p.relative_to(dataset) for p in dataset.rglob("*"))
    root = dataset / inside if inside else dataset
    with pytest.raises(CacheError, match=f"cache root {root} is inside the dataset in {dataset}"):
        cacheable(root, dataset_id="c", version="1")(lambda: _rows(5))()
    assert sorted(p.relative_to(dataset) for p in dataset.rglob("*")) == before
    with make_reader(dataset) as reader:
        assert sorted(int(r.id) for r in reader) == list(range(5))
    assert len(cacheable(tmp_path / "caches", dataset_id="c", version="1")(lambda: _rows(5))()) == 5


def test_stream_from_every_ranks_offsets_keeps_a_shared_local_disk_cache(cached, tmp_path: Path) -> None:
    """The readers opened to turn every rank's offsets into states were closed, which removed a local-disk cache
    passed through (Petastorm's cleanup=True default) under the stream's own reader and the other ranks."""
    location = tmp_path / "node-cache"
    options = dict(cache_type="local-disk", cache_location=str(location), cache_size_limit=2**30)
    with cached.stream(shuffle=True, seed=1, shard_rank=1, num_shards=2, **options) as other_rank:
        _read(other_rank, 50)
        entries = sorted(location.glob("*.arrow"))
        assert entries
        with cached.stream([10, 20], shuffle=True, seed=1, **options) as resumed:
            _read(resumed, 5)
            assert set(entries) <= set(location.glob("*.arrow"))
