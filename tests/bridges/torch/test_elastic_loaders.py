"""Elastic resume of the loaders: the states every rank's loader saved resume on any other number of ranks.

``loader.load_state_dict([state_0, ..., state_n])`` on a loader whose reader has another ``cur_shard`` /
``shard_count`` (any batch size, with a shuffling queue or without): what the new ranks deliver of the epoch
is exactly the rows no old rank delivered (``pad``: all of them, ranks equal by wrapping round; ``drop``:
each at most once, ranks equal), and later epochs are a fresh run's with the new world size. Checked on
row ids, as tests/readers/test_elastic.py checks the readers.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unihub import NdarrayCodec, ScalarCodec, Unischema, UnischemaField, write_dataset
from unihub.bridges.torch import InMemBatchedDataLoader, LoaderStateError
from unihub.dependencies import is_available
from unihub.readers.reader import make_batch_reader, make_reader

from ...elastic_rest import check_rest_of_epoch

pytestmark = pytest.mark.skipif(not is_available("torch"), reason="torch is not installed")

N = 203  # rows: row groups of ~8 rows in files of 50, so shards cut row groups and files
SCHEMA = Unischema("ElasticLoaders", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                      UnischemaField("pad", np.uint8, (64,), NdarrayCodec(), False)])
OPTIONS = dict(shuffle_row_groups=True, shuffle_rows=True, seed=7, reader_pool_type="dummy", schema_fields=["id"])


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("elastic_loaders") / "ds"
    write_dataset(path, SCHEMA, ({"id": i, "pad": np.full(64, i % 256, np.uint8)} for i in range(N)),
                  row_group_size_mb=0.0008, rows_per_file=50)
    return path


def _row_collate(rows: list[Any]) -> Any:
    from unihub.bridges.torch import make_collate
    return make_collate()(rows)  # a plain function: the loader's row-at-a-time path


#: (loader, reader, extra loader arguments) of each kind of loader and reader the loaders take
KINDS: dict[str, tuple[str, Callable[..., Any], dict[str, Any]]] = {
    "DataLoader(rows as columns)": ("DataLoader", make_reader, {}),
    "DataLoader(rows one by one)": ("DataLoader", make_reader, {"collate_fn": _row_collate}),
    "DataLoader(batch reader)": ("DataLoader", make_batch_reader, {}),
    "BatchedDataLoader(batch reader)": ("BatchedDataLoader", make_batch_reader, {}),
    "BatchedDataLoader(row reader)": ("BatchedDataLoader", make_reader, {}),
}


def make_loader(dataset: Path, kind: str, shard: int, count: int, batch_size: int, capacity: int,
                **options: Any) -> Any:
    from unihub.bridges import torch as tp
    name, make, extra = KINDS[kind]
    reader = make(dataset, cur_shard=shard, shard_count=count, **{**OPTIONS, **options})
    return getattr(tp, name)(reader, batch_size=batch_size, shuffling_queue_capacity=capacity, seed=shard, **extra)


def run_ranks(dataset: Path, kind: str, count: int, stops: list[int | None], resume_from: Any, batch_size: int,
              capacity: int, **options: Any) -> tuple[list[list[int]], list[dict[str, Any]], list[int]]:
    """Each rank's ids up to its stop (batches), its loader's state there (through JSON, as a checkpoint
    keeps it), and its rows of the epoch it resumed in (its reader's plan after the load)."""
    ids, states, resumed = [], [], []
    for k in range(count):
        with make_loader(dataset, kind, k, count, batch_size, capacity, **options) as loader:
            if resume_from is not None:
                loader.load_state_dict(resume_from)
            resumed.append(sum(t.num_rows for t in loader.reader.plan_of(loader.reader._where()[0])))
            iterator = iter(loader)
            ids.append([i for batch in itertools.islice(iterator, stops[k]) for i in batch["id"].tolist()])
            states.append(json.loads(json.dumps(loader.state_dict())))
            iterator.close()
    return ids, states, resumed


def check_the_rest(gone: set[int], new: list[list[int]], remainder: str) -> None:
    """``new`` (each new rank's rows of the epoch) is the rest of an epoch of which ``gone`` was delivered."""
    check_rest_of_epoch(gone, new, N, remainder)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(old=st.integers(1, 16), new=st.integers(1, 16), kind=st.sampled_from(sorted(KINDS)), data=st.data(),
       batch_sizes=st.tuples(st.integers(1, 16), st.integers(1, 16)),
       capacities=st.tuples(st.sampled_from([0, 0, 1, 5, 17, 40]), st.sampled_from([0, 3, 33])),
       remainders=st.tuples(st.sampled_from(["pad", "drop"]), st.sampled_from(["pad", "drop"])),
       shard_by=st.sampled_from(["row", "row_group"]))
def test_loaders_resume_on_any_other_world_size(dataset, old, new, kind, data, batch_sizes, capacities, remainders,
                                                shard_by):
    """One epoch: the old ranks stop anywhere (a queue holding rows they took and did not deliver); the new
    ranks, with another batch size and queue, deliver every row no old rank did, once (or as pad/drop say)."""
    stops = data.draw(st.lists(st.integers(0, N // (old * batch_sizes[0]) + 2), min_size=old, max_size=old))
    before, states, _ = run_ranks(dataset, kind, old, stops, None, batch_sizes[0], capacities[0], num_epochs=1,
                                  shard_by=shard_by, shard_remainder=remainders[0])
    gone = [i for rows in before for i in rows]
    assert len(gone) == len(set(gone)) or remainders[0] == "pad"
    options = dict(num_epochs=1, shard_by=shard_by, shard_remainder=remainders[1])
    after, _, _ = run_ranks(dataset, kind, new, [None] * new, states, batch_sizes[1], capacities[1], **options)
    if gone:
        check_the_rest(set(gone), after, remainders[1])
    else:  # nothing delivered: the epoch is planned afresh for the new world size (row groups: ranks unequal)
        fresh, _, _ = run_ranks(dataset, kind, new, [None] * new, None, batch_sizes[1], capacities[1], **options)
        assert [sorted(rows) for rows in after] == [sorted(rows) for rows in fresh]


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(old=st.integers(1, 16), new=st.integers(1, 16), kind=st.sampled_from(sorted(KINDS)), data=st.data(),
       batch_size=st.integers(1, 12), remainder=st.sampled_from(["pad", "drop"]))
def test_the_epoch_after_an_elastic_resume_is_a_fresh_runs(dataset, old, new, kind, data, batch_size, remainder):
    """Two epochs, in order (no queue): after the rest of epoch 0, each new rank's epoch 1 is what the same
    rank of a fresh run with the new world size delivers."""
    options = dict(num_epochs=2, shard_by="row", shard_remainder=remainder)
    per_rank = -(-N // old) if remainder == "pad" else N // old
    stops = data.draw(st.lists(st.integers(0, (per_rank - 1) // batch_size), min_size=old, max_size=old))
    before, states, _ = run_ranks(dataset, kind, old, stops, None, batch_size, 0, **options)
    after, _, rest = run_ranks(dataset, kind, new, [None] * new, states, batch_size, 0, **options)
    check_the_rest({i for rows in before for i in rows}, [rows[:n] for rows, n in zip(after, rest)], remainder)
    fresh, _, firsts = run_ranks(dataset, kind, new, [None] * new, None, batch_size, 0, **options)
    for k in range(new):
        assert after[k][rest[k]:] == fresh[k][firsts[k]:]


def test_a_resumed_run_resumes_again_on_a_third_world_size(dataset):
    kind, options = "BatchedDataLoader(batch reader)", dict(num_epochs=1, shard_by="row", shard_remainder="drop")
    first, states, _ = run_ranks(dataset, kind, 3, [1, 2, 3], None, 5, 11, **options)
    second, states, _ = run_ranks(dataset, kind, 5, [2, 0, 1, 3, 2], states, 4, 0, **options)
    third, _, _ = run_ranks(dataset, kind, 2, [None, None], states, 7, 9, **options)
    gone = [i for rows in first + second for i in rows]
    assert len(gone) == len(set(gone))
    check_the_rest(set(gone), third, "drop")


def test_a_list_that_leaves_a_rank_out_is_refused(dataset):
    from unihub.bridges.torch import LoaderStateError
    kind = "DataLoader(rows as columns)"
    _, states, _ = run_ranks(dataset, kind, 3, [1, 1, 1], None, 4, 0, num_epochs=1)
    with make_loader(dataset, kind, 0, 2, 4, 0, num_epochs=1) as loader:
        with pytest.raises(LoaderStateError, match="every rank"):
            loader.load_state_dict(states[:2])
        with pytest.raises(LoaderStateError, match="every rank"):
            loader.load_state_dict([states[0], states[0], states[2]])
        with pytest.raises(LoaderStateError, match="empty"):
            loader.load_state_dict([])


# -- InMemBatchedDataLoader: each rank holds its shard's rows; the epoch the old ranks were in is served from
# -- each new rank's share of what they left, later epochs from its own shard's rows -----------------------
def in_memory_ranks(dataset: Path, count: int, stop: int | None, resume_from: Any, batch_size: int, shuffle: bool,
                    remainder: str) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """Each rank's ids of its first ``stop`` batches (all: None) of 3 epochs, and its state there."""
    from unihub.bridges.torch import InMemBatchedDataLoader
    ids, states = [], []
    for k in range(count):
        reader = make_reader(dataset, cur_shard=k, shard_count=count, shard_by="row", shard_remainder=remainder,
                             num_epochs=1, **OPTIONS)
        loader = InMemBatchedDataLoader(reader, batch_size=batch_size, num_epochs=3, shuffle=shuffle, seed=11)
        if resume_from is not None:
            loader.load_state_dict(resume_from)
        iterator = iter(loader)
        ids.append([i for batch in itertools.islice(iterator, stop) for i in batch["id"].tolist()])
        states.append(json.loads(json.dumps(loader.state_dict())))
        iterator.close()
    return ids, states


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(old=st.integers(1, 8), new=st.integers(1, 8), batch_sizes=st.tuples(st.integers(1, 12), st.integers(1, 12)),
       shuffle=st.booleans(), remainders=st.tuples(st.sampled_from(["pad", "drop"]), st.sampled_from(["pad", "drop"])),
       data=st.data())
def test_in_memory_loaders_resume_on_any_other_world_size(dataset, old, new, batch_sizes, shuffle, remainders, data):
    """The old ranks stop together (as DDP's do) anywhere in 3 epochs; the new ranks serve the rest of that
    epoch once (or as pad/drop say), ranks equal, then the later epochs a fresh run with the new world size
    serves."""
    rows = -(-N // old) if remainders[0] == "pad" else N // old
    stop = data.draw(st.integers(0, 3 * -(-rows // batch_sizes[0])))
    before, states = in_memory_ranks(dataset, old, stop, None, batch_sizes[0], shuffle, remainders[0])
    epoch, row = states[0]["epoch"], states[0]["row"]
    assert all((s["epoch"], s["row"]) == (epoch, row) for s in states)
    after, resumed = in_memory_ranks(dataset, new, None, states, batch_sizes[1], shuffle, remainders[1])
    fresh, _ = in_memory_ranks(dataset, new, None, None, batch_sizes[1], shuffle, remainders[1])
    n = len(fresh[0]) // 3  # each new rank's own rows
    if not row:  # nothing of the epoch delivered: as a fresh run from it
        assert after == [rows[epoch * n:] for rows in fresh]
        return
    rest = [json.loads(s["rest"])["rows"] for s in resumed]
    check_the_rest({i for rows in before for i in rows[-row:]}, [rows[:r] for rows, r in zip(after, rest)],
                   remainders[1])
    assert [rows[r:] for rows, r in zip(after, rest)] == [rows[(epoch + 1) * n:] for rows in fresh]


def test_an_in_memory_loader_resumed_elastically_resumes_again(dataset):
    """Stopped in the epoch served from what older ranks left, on the same world size (its own state) and
    on another (every rank's): each row of the epoch once."""
    first, states = in_memory_ranks(dataset, 3, 5, None, 4, True, "drop")  # 20 of each rank's 67 rows
    second, states = in_memory_ranks(dataset, 2, 7, states, 5, True, "drop")  # 35 of each rank's share, 71
    again, _ = in_memory_ranks(dataset, 2, None, states, 3, True, "drop")
    gone = [i for rows in first + second for i in rows]
    assert len(gone) == len(set(gone)) == 130
    check_the_rest(set(gone), [rows[:36] for rows in again], "drop")
    third, _ = in_memory_ranks(dataset, 4, None, states, 3, True, "drop")
    check_the_rest(set(gone), [rows[:len(rows) - 2 * 50] for rows in third], "drop")


def test_in_memory_elastic_resume_refuses_what_it_cannot_know(dataset):
    _, states = in_memory_ranks(dataset, 2, 3, None, 4, False, "pad")
    def reader() -> Any:
        return make_reader(dataset, cur_shard=0, shard_count=3, shard_by="row", num_epochs=1, **OPTIONS)

    with pytest.raises(LoaderStateError, match="rows_capacity=None"):
        InMemBatchedDataLoader(reader(), batch_size=4, rows_capacity=500).load_state_dict(
            [dict(s, rows_capacity=500) for s in states])
    loader = InMemBatchedDataLoader(reader(), batch_size=4)
    with pytest.raises(LoaderStateError, match="one epoch"):
        loader.load_state_dict([states[0], dict(states[1], epoch=1, row=4)])
    with pytest.raises(LoaderStateError, match="every rank"):
        loader.load_state_dict(states[:1] * 2)
    with pytest.raises(LoaderStateError, match="lacks"):
        loader.load_state_dict([{k: v for k, v in s.items() if k != "rows"} for s in states])


def test_an_in_memory_state_whose_rest_is_not_json_is_a_loader_state_error(dataset):
    """Before: json.loads' RecursionError for a 'rest' nested past Python's limit escaped as it was."""
    _, states = in_memory_ranks(dataset, 2, 3, None, 4, False, "pad")
    _, resumed = in_memory_ranks(dataset, 3, 1, states, 4, False, "pad")
    assert resumed[0]["rest"]
    reader = make_reader(dataset, cur_shard=0, shard_count=3, shard_by="row", shard_remainder="pad", num_epochs=1,
                         **OPTIONS)
    loader = InMemBatchedDataLoader(reader, batch_size=4, num_epochs=3, seed=11)
    for rest in ("[" * 100_000, "not json", "[1]"):
        with pytest.raises(LoaderStateError, match="'rest' is not what state_dict"):
            loader.load_state_dict(dict(resumed[0], rest=rest))
