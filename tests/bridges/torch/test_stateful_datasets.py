"""Exact, elastic resume of ``TorchIterableDataset`` and ``ElasticDistributedSampler`` (over ``TorchMapDataset``)
inside torch's own DataLoader and torchdata's ``StatefulDataLoader``, with and without worker processes.

Ranks are simulated in one process (``rank=``/``world_size=``). Every check is on row ids: the rows delivered
before the stop and after the resume are every row of the epoch once, each new rank gets its exact share, and
later epochs are a fresh run's with the new world size.
"""

from __future__ import annotations

import itertools
import json
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unihub import NdarrayCodec, ScalarCodec, Unischema, UnischemaField, make_reader, write_dataset
from unihub.bridges.torch import LoaderStateError

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata 0.11 under torch 2.13

from unihub.bridges.torch.datasets import TorchIterableDataset, TorchMapDataset  # noqa: E402
from unihub.bridges.torch.stateful import ElasticDistributedSampler, exact_share  # noqa: E402

from .corrupt_images import corrupt_images  # noqa: E402

N = 203  # rows, in row groups of ~8 rows in files of 50: shards cut row groups and files
SCHEMA = Unischema("Stateful", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                UnischemaField("pad", np.uint8, (64,), NdarrayCodec(), False)])
OPTIONS = dict(schema_fields=["id"], shuffle_rows=True, shuffle_row_groups=True)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("stateful") / "ds"
    write_dataset(path, SCHEMA, ({"id": i, "pad": np.full(64, i % 256, np.uint8)} for i in range(N)),
                  row_group_size_mb=0.0008, rows_per_file=50)
    return path


def stateful_loader() -> Any:
    return pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader


def ids(batch: Any) -> list[int]:
    return [int(i) for i in batch["id"]]


# -- TorchIterableDataset --------------------------------------------------------------------------------
def iterable(path: Path, rank: int, world: int, batched: bool, workers: int, state: Any = None,
             epoch: int = 0) -> tuple[Any, Any]:
    """A StatefulDataLoader over rank ``rank`` of ``world``'s TorchIterableDataset (batches of 8 rows, or rows
    collated by 5); ``state``: the dataset resumes from it (a list: every old rank's loader state)."""
    dataset = TorchIterableDataset(path, 8 if batched else None, seed=3, rank=rank, world_size=world, **OPTIONS)
    dataset.set_epoch(epoch)
    if state is not None:
        dataset.load_state_dict(state)
    return dataset, stateful_loader()(dataset, batch_size=None if batched else 5, num_workers=workers)


def run_ranks(path: Path, world: int, workers: int, stops: list[int | None], batched: bool,
              states: Any = None) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """Each rank's ids up to its stop (batches), and its loader's state there (through JSON, as saved)."""
    rows, saved = [], []
    for rank in range(world):
        _, loader = iterable(path, rank, world, batched, workers, states)
        rows.append([i for batch in itertools.islice(loader, stops[rank]) for i in ids(batch)])
        saved.append(json.loads(json.dumps(loader.state_dict())))
    return rows, saved


def fresh_epoch(path: Path, world: int, workers: int, batched: bool, epoch: int) -> list[list[int]]:
    return [[i for batch in iterable(path, rank, world, batched, workers, epoch=epoch)[1] for i in ids(batch)]
            for rank in range(world)]


def check_rest(before: list[int], after: list[list[int]], workers: int) -> None:
    """``after`` (each new rank's rows) is every row ``before`` left, once, each rank its exact share."""
    flat = [i for rows in after for i in rows]
    assert Counter(before + flat) == Counter(range(N)), "rows missing or delivered twice"
    world, count = len(after), len(after) * max(1, workers)
    rest = N - len(before)
    shares = [sum(exact_share(rest, rank * max(1, workers) + w, count) for w in range(max(1, workers)))
              for rank in range(world)]
    assert [len(rows) for rows in after] == shares


ELASTIC = [  # (old world, old workers, new world, new workers, batched)
    (1, 0, 2, 0, False),
    (2, 0, 3, 0, True),
    pytest.param(2, 2, 3, 0, False, marks=pytest.mark.slow),
    pytest.param(1, 2, 2, 2, True, marks=pytest.mark.slow),
    pytest.param(3, 0, 1, 2, False, marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("world", "workers", "new_world", "new_workers", "batched"), ELASTIC)
def test_iterable_resumes_on_other_ranks_and_workers(dataset, world, workers, new_world, new_workers, batched):
    before, states = run_ranks(dataset, world, workers, [2 + 3 * rank for rank in range(world)], batched)
    after, _ = run_ranks(dataset, new_world, new_workers, [None] * new_world, batched, states)
    check_rest([i for rows in before for i in rows], after, new_workers)
    # the next epoch is a fresh run's with the new world size
    later = []
    for rank in range(new_world):
        ds, loader = iterable(dataset, rank, new_world, batched, new_workers, states)
        ds.set_epoch(1)
        later.append([i for batch in loader for i in ids(batch)])
    assert later == fresh_epoch(dataset, new_world, new_workers, batched, 1)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(old=st.integers(1, 8), new=st.integers(1, 8), batch=st.sampled_from([None, 1, 4, 13]), data=st.data())
def test_any_world_and_batch_size_resumes_on_any_other(dataset, old, new, batch, data):
    """Torch's own DataLoader, no worker processes, no torchdata: each rank's dataset state_dict() after its
    stop. (Workers are shards like ranks: rank * workers + worker of world * workers.)"""
    stops = data.draw(st.lists(st.integers(0, 40 // (batch or 1) + 1), min_size=old, max_size=old))
    new_batch = data.draw(st.sampled_from([1, 3, 8] if batch is None else [2, 8]))
    before, states = [], []
    for rank in range(old):
        ds = TorchIterableDataset(dataset, batch, seed=11, rank=rank, world_size=old, **OPTIONS)
        loader = torch.utils.data.DataLoader(ds, batch_size=5 if batch is None else None)
        before += [i for b in itertools.islice(loader, stops[rank]) for i in ids(b)]
        states.append(json.loads(json.dumps(ds.state_dict())))
    after = []
    for rank in range(new):
        ds = TorchIterableDataset(dataset, None if batch is None else new_batch, rank=rank, world_size=new, **OPTIONS)
        ds.load_state_dict(states)
        loader = torch.utils.data.DataLoader(ds, batch_size=new_batch if batch is None else None)
        after.append([i for b in loader for i in ids(b)])
    if len(before) == N:  # every rank had finished the epoch: the next one, whole
        assert Counter(i for rows in after for i in rows) == Counter(range(N))
        return
    check_rest(before, after, 0)


def test_a_resumed_run_resumes_again_and_finished_ranks_count(dataset):
    first, states = run_ranks(dataset, 2, 0, [None, 4], batched=False)  # rank 0 delivered its whole share
    assert len(first[0]) == exact_share(N, 0, 2)
    second, states = run_ranks(dataset, 3, 0, [1, 0, 6], batched=False, states=states)
    third, _ = run_ranks(dataset, 2, 0, [None, None], batched=False, states=states)
    check_rest([i for rows in first + second for i in rows], third, 0)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("batched", [False, True])
def test_stateful_dataloader_resumes_its_own_state(dataset, workers, batched):
    """The same world and workers: StatefulDataLoader's own load_state_dict gives each worker its state back,
    and the rest comes in the order of the run that was not stopped."""
    whole = [ids(batch) for batch in iterable(dataset, 1, 2, batched, workers)[1]]
    _, loader = iterable(dataset, 1, 2, batched, workers)
    head = [ids(batch) for batch in itertools.islice(loader, 5)]
    state = json.loads(json.dumps(loader.state_dict()))
    _, loader = iterable(dataset, 1, 2, batched, workers)
    loader.load_state_dict(state)
    assert head + [ids(batch) for batch in loader] == whole


@pytest.mark.slow
def test_a_worker_that_finished_stays_finished_when_another_has_rows_left(dataset):
    """Rank 7 of 8 with two workers: shards 14 and 15 of 16, 13 and 8 rows, in batches of 2 (7 and 4 of them).
    Stopped after 10 batches, worker 1 had ended its share; resumed, it must not start the next epoch."""
    def loader() -> Any:
        ds = TorchIterableDataset(dataset, 2, seed=3, rank=7, world_size=8, **OPTIONS)
        return stateful_loader()(ds, batch_size=None, num_workers=2)

    whole = [ids(batch) for batch in loader()]
    running = loader()
    head = [ids(batch) for batch in itertools.islice(running, 10)]
    state = json.loads(json.dumps(running.state_dict()))
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + [ids(batch) for batch in resumed] == whole


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_loader_saved_at_the_end_of_an_epoch_resumes_at_the_next(dataset, workers):
    def loader() -> Any:
        ds = TorchIterableDataset(dataset, None, seed=3, rank=0, world_size=1, **OPTIONS)
        return stateful_loader()(ds, batch_size=5, num_workers=workers, persistent_workers=workers > 0)

    running = loader()
    epochs = [[ids(batch) for batch in running] for _ in range(2)]
    assert epochs[0] != epochs[1]
    running = loader()
    for _ in running:
        pass
    state = json.loads(json.dumps(running.state_dict()))
    resumed = loader()
    resumed.load_state_dict(state)
    assert [ids(batch) for batch in resumed] == epochs[1]


def test_the_state_protocol_under_torchs_own_dataloader(dataset):
    """No torchdata: with ``num_workers=0`` the dataset's own state_dict() is the position after the batches
    the loop got, and load_state_dict continues there, on this shard or (a list) on other ranks."""
    dataset_ = TorchIterableDataset(dataset, 8, seed=5, **OPTIONS)
    loader = torch.utils.data.DataLoader(dataset_, batch_size=None)
    head = [i for batch in itertools.islice(loader, 4) for i in ids(batch)]
    state = json.loads(json.dumps(dataset_.state_dict()))
    assert state["rows"] == len(head) == 32 and not state["finished"]
    resumed = TorchIterableDataset(dataset, 8, seed=0, **OPTIONS)  # the state's seed is the run's
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state  # before iterating: where it will resume
    tail = [i for batch in torch.utils.data.DataLoader(resumed, batch_size=None) for i in ids(batch)]
    assert Counter(head + tail) == Counter(range(N))
    assert resumed.state_dict()["finished"] and resumed.epoch == 1
    after = []
    for rank in range(3):  # the single rank's state is every rank's: it resumes on three too, in other batches
        ds = TorchIterableDataset(dataset, 5, rank=rank, world_size=3, **OPTIONS)
        ds.load_state_dict(state)
        after.append([i for batch in torch.utils.data.DataLoader(ds, batch_size=None) for i in ids(batch)])
    check_rest(head, after, 0)


@pytest.mark.parametrize("batch_size", [None, 8])
def test_a_stream_resumes_from_its_own_state(dataset, batch_size):
    """Over a reader (served as it is), the state is the reader's position after what was yielded, or the
    loader's of its batches: StatefulDataLoader resumes it in place of a fast-forward."""
    def served() -> Any:
        stream = TorchIterableDataset(make_reader(dataset, seed=1, num_epochs=1, **OPTIONS), batch_size)
        return stream, stateful_loader()(stream, batch_size=5 if batch_size is None else None)

    whole = [i for batch in served()[1] for i in ids(batch)]
    _, loader = served()
    head = [i for batch in itertools.islice(loader, 3) for i in ids(batch)]
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["dataset_state"]["kind"] == "torch_iterable_stream"  # a position, not a count to fast-forward
    _, loader = served()
    loader.load_state_dict(state)
    assert head + [i for batch in loader for i in ids(batch)] == whole
    with pytest.raises(LoaderStateError, match="own"):
        served()[0].load_state_dict([state])


@pytest.mark.parametrize("batch_size", [None, 8])
def test_filtered_rows_resume_on_one_rank(dataset, batch_size):
    """Filters leave rows known only by reading them: one rank still resumes exactly (no elastic resume)."""
    def served() -> Any:
        ds = TorchIterableDataset(dataset, batch_size, seed=2, filters=[("id", ">", 50)], **OPTIONS)
        return ds, torch.utils.data.DataLoader(ds, batch_size=5 if batch_size is None else None)

    ds, loader = served()
    head = [i for batch in itertools.islice(loader, 7) for i in ids(batch)]
    state = json.loads(json.dumps(ds.state_dict()))
    ds, loader = served()
    ds.load_state_dict(state)
    assert Counter(head + [i for batch in loader for i in ids(batch)]) == Counter(range(51, N))



@pytest.mark.parametrize("workers", [0, 2])
def test_rows_skipped_for_images_that_do_not_decode_resume_exactly_in_batches(tmp_path, workers):
    """With ``batch_size`` and ``on_decode_error='skip'`` the state was worked out from the plan's row counts,
    which count the rows dropped as delivered: a resume after the first batch delivered a row of it again
    (and left one out). The rest now comes as in the run that was not stopped, on one rank and on two."""
    url, good_ids = corrupt_images(tmp_path)
    good = Counter(good_ids)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for world in (1, 2):
            delivered: Counter[int] = Counter()
            for rank in range(world):
                def loader(rank: int = rank, world: int = world) -> Any:
                    ds = TorchIterableDataset(url, 3, seed=1, rank=rank, world_size=world,
                                              on_decode_error="skip", shuffle_rows=True)
                    return stateful_loader()(ds, batch_size=None, num_workers=workers)

                whole = [ids(batch) for batch in loader()]
                for cut in (1, 2):
                    stopped = loader()
                    head = [ids(batch) for batch in itertools.islice(stopped, cut)]
                    state = json.loads(json.dumps(stopped.state_dict()))
                    resumed = loader()
                    resumed.load_state_dict(state)
                    assert head + [ids(batch) for batch in resumed] == whole, (world, rank, cut)
                delivered.update(i for batch in whole for i in batch)
            assert delivered == good

def test_finished_epochs_resume_at_the_next(dataset):
    ds = TorchIterableDataset(dataset, None, seed=5, rank=0, world_size=2, **OPTIONS)
    everything = list(torch.utils.data.DataLoader(ds, batch_size=50))
    assert sum(len(batch["id"]) for batch in everything) == exact_share(N, 0, 2)
    finished = [ds.state_dict(), TorchIterableDataset(dataset, None, seed=5, rank=1, world_size=2, **OPTIONS)]
    other = finished[1]
    for _ in torch.utils.data.DataLoader(other, batch_size=50):
        pass
    finished[1] = other.state_dict()
    resumed = TorchIterableDataset(dataset, None, rank=0, world_size=1, **OPTIONS)
    resumed.load_state_dict(finished)
    assert (resumed.epoch, resumed.seed) == (1, 5)


def test_torch_distributed_checkpoint_keeps_them(dataset, tmp_path):
    """``dcp.save``/``dcp.load`` (one process): DCP loads into the keys of a fresh object's state, so a state
    with more keys (a resumed run's reader keeps ``done``) must come back whole."""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    before, states = run_ranks(dataset, 2, 0, [3, 5], batched=False)
    ds = TorchIterableDataset(dataset, None, seed=3, rank=0, world_size=1, **OPTIONS)
    ds.load_state_dict(states)
    loader = torch.utils.data.DataLoader(ds, batch_size=5)
    head = [i for batch in itertools.islice(loader, 4) for i in ids(batch)]
    sampler = ElasticDistributedSampler(N, rank=0, world_size=1)
    sampler.load_state_dict([ElasticDistributedSampler(N, rank=k, world_size=2).state_dict(delivered=k + 3)
                             for k in range(2)])
    first = sampled(sampler, 10)
    with warnings.catch_warnings():  # no process group: DCP warns that it runs in one process
        warnings.simplefilter("ignore")
        dcp.save({"dataset": ds, "sampler": sampler}, checkpoint_id=tmp_path / "ckpt")
    ds = TorchIterableDataset(dataset, None, seed=3, rank=0, world_size=1, **OPTIONS)
    sampler = ElasticDistributedSampler(N, rank=0, world_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load({"dataset": ds, "sampler": sampler}, checkpoint_id=tmp_path / "ckpt")
    tail = [i for batch in torch.utils.data.DataLoader(ds, batch_size=5) for i in ids(batch)]
    assert Counter([i for rows in before for i in rows] + head + tail) == Counter(range(N))
    assert Counter(first + sampled(sampler)) == Counter(set(range(N)) - set(sampled_before(N)))


def sampled_before(size: int) -> list[int]:
    """The indices two ranks had given out in the sampler part of the DCP test (3 and 4 of their blocks)."""
    return [i for k in range(2) for i in sampled(ElasticDistributedSampler(size, rank=k, world_size=2), k + 3)]


def test_ranks_an_epoch_apart_resume_in_the_later_one(dataset):
    """A rank that finished epoch 0 and had not begun epoch 1 delivered nothing of it; the other rank had."""
    ranks = [TorchIterableDataset(dataset, None, seed=3, rank=k, world_size=2, **OPTIONS) for k in range(2)]
    for ds in ranks:
        for _ in torch.utils.data.DataLoader(ds, batch_size=50):
            pass
    head = [i for batch in itertools.islice(torch.utils.data.DataLoader(ranks[1], batch_size=5), 3) for i in ids(batch)]
    states = [ds.state_dict() for ds in ranks]
    assert [(s["epoch"], s["finished"]) for s in states] == [(0, True), (1, False)]
    after = []
    for rank in range(3):
        ds = TorchIterableDataset(dataset, None, rank=rank, world_size=3, **OPTIONS)
        ds.load_state_dict(states)
        assert ds.epoch == 1
        after.append([i for batch in torch.utils.data.DataLoader(ds, batch_size=5) for i in ids(batch)])
    check_rest(head, after, 0)
    samplers = [ElasticDistributedSampler(N, rank=k, world_size=2) for k in range(2)]
    for sampler in samplers:  # epoch 0 whole, then epoch 1: rank 0 not begun, rank 1 nine indices in
        sampled(sampler)
        sampler.set_epoch(1)
    head = sampled(samplers[1], 9)
    resumed = ElasticDistributedSampler(N, rank=0, world_size=1)
    resumed.load_state_dict([s.state_dict() for s in samplers])
    assert resumed.epoch == 1 and Counter(head + sampled(resumed)) == Counter(range(N))


def test_states_that_do_not_fit_are_refused(dataset):
    _, states = run_ranks(dataset, 2, 0, [2, 3], batched=False)
    worker_states = [s["dataset_state"] for s in states]
    lone = TorchIterableDataset(dataset, None, rank=0, world_size=3, **OPTIONS)
    lone.load_state_dict(worker_states[1])  # rank 1 of 2's own state on rank 0 of 3
    with pytest.raises(LoaderStateError, match="list of every rank"):
        next(iter(lone))
    with pytest.raises(LoaderStateError, match="more than an epoch ahead"):
        lone.load_state_dict([worker_states[0], dict(worker_states[1], epoch=1)])
    with pytest.raises(LoaderStateError, match="two different"):
        lone.load_state_dict([worker_states[0], dict(worker_states[0], rows=1)])
    with pytest.raises(LoaderStateError, match="no TorchIterableDataset state"):
        lone.load_state_dict([])
    with pytest.raises(LoaderStateError, match="not of one run"):  # a rank's rows missing from what was delivered
        lone.load_state_dict([worker_states[0], dict(worker_states[1], rows=0)])
        next(iter(lone))


@pytest.mark.parametrize(("key", "value"), [("rows", -1), ("before", "0"), ("epoch", None), ("seed", 1.5),
                                          ("shard", [2, 2]), ("shard", 1), ("finished", 1)])
def test_a_tampered_state_is_refused_by_name(dataset, key, value):
    """A count that is not an int >= 0, a shard outside its count: a named error, not a raw TypeError or
    rows cut by a wrong count; one worker's state or the list of every rank's."""
    _, states = run_ranks(dataset, 2, 0, [2, 3], batched=False)
    worker_states = [dict(s["dataset_state"]) for s in states]
    tampered = dict(worker_states[1], **{key: value})
    with pytest.raises(LoaderStateError, match="pass what state_dict"):
        TorchIterableDataset(dataset, None, rank=1, world_size=2, **OPTIONS).load_state_dict(tampered)
    with pytest.raises(LoaderStateError, match="pass what state_dict"):
        TorchIterableDataset(dataset, None, rank=0, world_size=3, **OPTIONS).load_state_dict(
            [worker_states[0], tampered])


# -- ElasticDistributedSampler ---------------------------------------------------------------------------
def sampled(sampler: ElasticDistributedSampler, count: int | None = None) -> list[int]:
    return list(itertools.islice(iter(sampler), count))


@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_cuts_one_permutation_into_equal_blocks(drop_last):
    blocks = [sampled(ElasticDistributedSampler(N, rank=k, world_size=4, seed=2, drop_last=drop_last))
              for k in range(4)]
    assert len({len(b) for b in blocks}) == 1 and len(blocks[0]) == (N // 4 if drop_last else -(-N // 4))
    order = list(np.random.default_rng([2, 0]).permutation(N))
    flat = [i for b in blocks for i in b]
    assert flat[:min(N, len(flat))] == order[:len(flat)]
    assert set(flat) == set(range(N)) or drop_last


@pytest.mark.parametrize(("world", "new_world"), [(4, 3), (3, 5), (2, 1), (1, 2)])
def test_sampler_resumes_on_any_world_size(world, new_world):
    samplers = [ElasticDistributedSampler(N, rank=k, world_size=world, seed=9) for k in range(world)]
    for sampler in samplers:
        sampler.set_epoch(2)
    before = [sampled(s, 7 * k + 3) for k, s in enumerate(samplers)]
    states = [json.loads(json.dumps(s.state_dict())) for s in samplers]
    resumed = [ElasticDistributedSampler(N, rank=k, world_size=new_world) for k in range(new_world)]
    for sampler in resumed:
        sampler.load_state_dict(states)
        sampler.set_epoch(2)
    middle = [sampled(s, 5) for s in resumed]
    states = [s.state_dict() for s in resumed]  # resumed again, on the old world size
    again = [ElasticDistributedSampler(N, rank=k, world_size=world) for k in range(world)]
    for sampler in again:
        sampler.load_state_dict(states)
    after = [sampled(s) for s in again]
    assert len({len(rows) for rows in after}) == 1, "ranks not equal"
    delivered = Counter(i for part in (before, middle, after) for rows in part for i in rows)
    assert set(delivered) == set(range(N))
    assert sum(delivered.values()) - N < world + new_world + world  # only each cut's padding repeats
    fresh = [ElasticDistributedSampler(N, rank=k, world_size=world, seed=9) for k in range(world)]
    for sampler in again + fresh:  # later epochs: a fresh run's
        sampler.set_epoch(3)
    assert [sampled(s) for s in again] == [sampled(s) for s in fresh]


def test_sampler_refuses_another_ranks_state_alone():
    state = ElasticDistributedSampler(N, rank=1, world_size=2).state_dict()
    with pytest.raises(LoaderStateError, match="rank 1 of 2"):
        ElasticDistributedSampler(N, rank=0, world_size=3).load_state_dict(state)
    with pytest.raises(LoaderStateError, match="size"):
        ElasticDistributedSampler(N + 1, rank=0, world_size=3).load_state_dict([state])


@pytest.mark.parametrize(("key", "value"), [("yielded", -5), ("yielded", 10**6), ("yielded", 2.5), ("epoch", "1"),
                                          ("seed", None), ("done", [5]), ("rank", [5, 2]), ("finished", "yes")])
def test_sampler_refuses_a_tampered_state_by_name(key, value):
    """Its own state (rank 1 of 2 again) or in the list of every rank's: a named error, not indices from the end
    of the block (``yielded=-5`` gave the last 5), none at all, or a raw TypeError."""
    sampler = ElasticDistributedSampler(N, rank=1, world_size=2, seed=0)
    sampled(sampler, 7)
    state = dict(sampler.state_dict(), **{key: value})
    with pytest.raises(LoaderStateError, match="state_dict|another run"):
        ElasticDistributedSampler(N, rank=1, world_size=2, seed=0).load_state_dict(state)
    other = dict(ElasticDistributedSampler(N, rank=0, world_size=2, seed=0).state_dict(), **{key: value})
    with pytest.raises(LoaderStateError, match="state_dict|another run"):
        ElasticDistributedSampler(N, rank=0, world_size=3, seed=0).load_state_dict([other, state])


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_sampler_in_a_stateful_dataloader_over_the_map_dataset(dataset, workers):
    data = TorchMapDataset(dataset, ["id"])

    def loader(rank: int, world: int, state: Any = None) -> Any:
        sampler = ElasticDistributedSampler(data, rank=rank, world_size=world, seed=4)
        if state is not None:
            sampler.load_state_dict(state)
        return stateful_loader()(data, sampler=sampler, batch_size=6, num_workers=workers)

    before, states = [], []
    for rank in range(2):
        running = loader(rank, 2)
        before += [i for batch in itertools.islice(running, 3 + 4 * rank) for i in ids(batch)]
        states.append(json.loads(json.dumps(running.state_dict())))
    after = [[i for batch in loader(rank, 3, states) for i in ids(batch)] for rank in range(3)]
    assert len({len(rows) for rows in after}) == 1
    flat = before + [i for rows in after for i in rows]
    assert set(flat) == set(range(N)) and len(flat) - N <= 2 + 1  # padding repeats of each cut only
    resumed = loader(0, 2)  # the same world size: StatefulDataLoader's own resume
    resumed.load_state_dict(states[0])
    assert before[:18] + [i for batch in resumed for i in ids(batch)] == \
        [i for batch in loader(0, 2) for i in ids(batch)]


@pytest.mark.parametrize("remainder", ["exact", "pad", "drop"])
@pytest.mark.parametrize("batched", [False, True])
def test_shard_remainder_keeps_ranks_equal_also_after_an_elastic_resume(dataset, remainder, batched):
    """'exact' delivers each row once with the last shard short; 'pad' and 'drop' keep every rank's
    count equal (DDP waits for the slowest rank): 203 rows on 8 ranks, then 2 ranks resumed on 3."""
    def rows(rank: int, world: int, state: Any = None) -> tuple[list[int], Any]:
        ds = TorchIterableDataset(dataset, 4 if batched else None, seed=3, rank=rank, world_size=world,
                                  shard_remainder=remainder, **OPTIONS)
        if state is not None:
            ds.load_state_dict(state)
        loader = stateful_loader()(ds, batch_size=None if batched else 4)
        return [i for batch in loader for i in ids(batch)], loader

    counts = [len(rows(rank, 8)[0]) for rank in range(8)]
    flat = [i for rank in range(8) for i in rows(rank, 8)[0]]
    expected = {"exact": [26] * 7 + [21], "pad": [26] * 8, "drop": [25] * 8}[remainder]
    assert counts == expected
    assert set(flat) == set(range(N)) if remainder != "drop" else len(set(flat)) == len(flat) == 200
    seen, states = [], []
    for rank in range(2):
        ds = TorchIterableDataset(dataset, 4 if batched else None, seed=3, rank=rank, world_size=2,
                                  shard_remainder=remainder, **OPTIONS)
        loader = stateful_loader()(ds, batch_size=None if batched else 4)
        seen += [i for batch in itertools.islice(loader, 5 + rank) for i in ids(batch)]
        states.append(json.loads(json.dumps(loader.state_dict())))
    after = [rows(rank, 3, states)[0] for rank in range(3)]
    rest = N - len(seen)
    assert [len(r) for r in after] == {"exact": [exact_share(rest, k, 3) for k in range(3)],
                                       "pad": [-(-rest // 3)] * 3, "drop": [rest // 3] * 3}[remainder]
    assert not set(seen) & {i for r in after for i in r}


@pytest.mark.parametrize("text", ["not json", "[" * 100_000, 5, None])
def test_a_state_whose_json_text_is_not_json_is_a_loader_state_error(dataset, text):
    """The reader's state and a stream's position are kept as JSON text: text that is not JSON (or nested past
    Python's limit) was json.loads' JSONDecodeError or RecursionError, a missing or non-text position a KeyError or
    TypeError."""
    iterable_ = TorchIterableDataset(dataset, 8, seed=5, **OPTIONS)
    next(iter(torch.utils.data.DataLoader(iterable_, batch_size=None)))
    state = dict(iterable_.state_dict(), reader=text)
    resumed = TorchIterableDataset(dataset, 8, seed=5, **OPTIONS)
    if text is not None:  # a reader of None is one not started yet, as ''
        with pytest.raises(LoaderStateError, match="'reader' is not the JSON text of a reader state"):
            resumed.load_state_dict(state)
            next(iter(torch.utils.data.DataLoader(resumed, batch_size=None)))
    stream = TorchIterableDataset(make_reader(dataset, seed=1, num_epochs=1, **OPTIONS), None)
    state = dict(stream.state_dict(), position=text)
    with pytest.raises(LoaderStateError, match="'position' is not the JSON text of a reader state"):
        stream.load_state_dict(state)
    stream.stream.stop()


def test_drop_shares_saved_at_their_end_resume_at_the_next_epoch(dataset):
    """With ``'drop'``, ranks that each delivered their whole share (203 // 3 = 67 rows, one row dropped) and
    were saved before they saw its end resume, on any world size, at the next epoch as a fresh run's: the list
    of their states was refused ('the states say 201 of 203 rows ... were delivered')."""
    def loader(rank: int, world: int, states: Any = None) -> Any:
        ds = TorchIterableDataset(dataset, 67, seed=3, rank=rank, world_size=world, shard_remainder="drop", **OPTIONS)
        if states is not None:
            ds.load_state_dict(states)
        return stateful_loader()(ds, batch_size=None)

    states = []
    for rank in range(3):
        old = loader(rank, 3)
        assert len(ids(next(iter(old)))) == 67  # the whole share, its end not yet seen
        states.append(json.loads(json.dumps(old.state_dict())))
    for world in (3, 2):
        fresh = [[i for batch in loader(rank, world) for i in ids(batch)] for rank in range(world)]
        fresh_next = []
        for rank in range(world):
            ds = TorchIterableDataset(dataset, 67, seed=3, rank=rank, world_size=world, shard_remainder="drop",
                                      **OPTIONS)
            ds.set_epoch(1)
            fresh_next.append([i for batch in stateful_loader()(ds, batch_size=None) for i in ids(batch)])
        resumed = [[i for batch in loader(rank, world, states) for i in ids(batch)] for rank in range(world)]
        assert resumed == fresh_next != fresh


@pytest.mark.parametrize("stop", [101, 91])
def test_pad_repeats_are_not_counted_as_rows_delivered(dataset, stop):
    """203 rows on 2 ``'pad'`` ranks: rank 1's share of 102 ends with a wrap-around repeat of rank 0's first
    row. Rank 0 stopped ``stop`` rows into its 102, rank 1 at the end of its share: the new ranks deliver rank
    0's rows left. Counted with the repeat, the old ranks had delivered one row more than they had: stopped one
    row short (101), the epoch counted as done and its last row was lost; stopped earlier, the states were
    refused ('the states say 193 of 203 rows ... were delivered')."""
    def rows(rank: int, world: int, states: Any = None, limit: int | None = None) -> tuple[list[int], Any]:
        ds = TorchIterableDataset(dataset, None, seed=3, rank=rank, world_size=world, shard_remainder="pad",
                                  **OPTIONS)
        if states is not None:
            ds.load_state_dict(states)
        loader = stateful_loader()(ds, batch_size=None)
        return [int(row["id"]) for row in itertools.islice(loader, limit)], loader

    seen, states = [], []
    for rank, limit in enumerate([stop, 102]):
        got, loader = rows(rank, 2, limit=limit)
        seen += got
        states.append(json.loads(json.dumps(loader.state_dict())))
    assert len(seen) == stop + 102 and len(set(seen)) == stop + 101  # rank 1's last row: rank 0's first
    for world in (2, 3):
        after = [rows(rank, world, states)[0] for rank in range(world)]
        rest = set(range(N)) - set(seen)
        assert {i for r in after for i in r} == rest
        assert [len(r) for r in after] == [-(-len(rest) // world)] * world


def test_a_worker_not_yet_asked_after_a_finished_epoch_saves_the_next_epochs_start(dataset):
    """Three ranks saved at the end of their shares (an epoch's last step: the loader had not seen the end)
    resume on one rank of two workers; one batch later (worker 0's), it is saved and resumed again. Worker 1,
    never asked for rows, had saved a state of the epoch that was over: resumed, it delivered nothing, and its
    half of the next epoch was lost (saved with worker 0's, the list was refused as epochs apart)."""
    def dataset_of(rank: int, world: int) -> Any:
        return TorchIterableDataset(dataset, 8, seed=3, rank=rank, world_size=world, **OPTIONS)

    states = []
    for rank in range(3):
        loader = stateful_loader()(dataset_of(rank, 3), batch_size=None)
        share = sum(len(ids(batch)) for batch in itertools.islice(loader, -(-exact_share(N, rank, 3) // 8)))
        assert share == exact_share(N, rank, 3)  # every row of its share, its end not yet seen
        states.append(json.loads(json.dumps(loader.state_dict())))
    resumed = dataset_of(0, 1)
    resumed.load_state_dict(states)
    loader = stateful_loader()(resumed, batch_size=None, num_workers=2)
    seen = ids(next(iter(loader)))
    state = json.loads(json.dumps(loader.state_dict()))
    again = dataset_of(0, 1)
    loader = stateful_loader()(again, batch_size=None, num_workers=2)
    loader.load_state_dict(state)
    rest = [i for batch in loader for i in ids(batch)]
    assert Counter(seen + rest) == Counter(range(N))
