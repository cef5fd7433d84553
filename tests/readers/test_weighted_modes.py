"""WeightedSamplingReader's ends (``on_exhausted``), weights changed mid-run, and skipping ahead.

Property-style: seeded random sources (sizes, seeds, epochs), weights, modes and stop points,
checked against what the readers deliver on their own and against uninterrupted runs. Skips
are checked to read nothing by counting the row groups the store reads.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unihub import WeightedSamplingReader, in_lambda, make_batch_reader, make_reader
from unihub.errors import InvalidArgumentError, UnihubError, UsageError
from unihub.readers.reader import ReaderStateError, next_pass_seed
from unihub.readers.weighted import (
    STATE_KIND,
    OnExhausted,
    WeightedSamplingError,
    WeightsError,
    draw_choices,
)
from unihub.store.dataset import ParquetStore

from .test_weighted import write

#: three sources of other sizes; a row's id says which (id // 1000)
SIZES = (37, 23, 61)
MODES: tuple[OnExhausted, ...] = ("stop", "cycle", "drain")


@pytest.fixture(scope="module")
def urls(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("weighted_modes")
    return [write(root / f"s{k}", range(1000 * k, 1000 * k + n)) for k, n in enumerate(SIZES)]


def source_reader(url: str, k: int, *, epochs: int | None = 1, pool: str = "dummy", seed: int = 0,
                  **kwargs: Any) -> Any:
    return make_reader(url, seed=seed + k, shuffle_rows=True, shuffle_row_groups=True, num_epochs=epochs,
                       reader_pool_type=pool, workers_count=1 if pool == "dummy" else 2, schema_fields=["id"],
                       **kwargs)


def mixer(urls: list[str], weights: list[float], seed: int, mode: OnExhausted, *, epochs: int | None = 1,
          pool: str = "dummy", **kwargs: Any) -> WeightedSamplingReader:
    readers = [source_reader(u, k, epochs=epochs, pool=pool, seed=seed) for k, u in enumerate(urls)]
    return WeightedSamplingReader(readers, weights, seed=seed, on_exhausted=mode, **kwargs)


def ids(items: Any) -> list[int]:
    return [int(r.id) for r in items]


def own_order(url: str, k: int, seed: int, epochs: int | None = 1) -> list[int]:
    """What source ``k`` delivers on its own: the order the mix must keep for its rows."""
    with source_reader(url, k, epochs=epochs, seed=seed) as reader:
        return ids(reader)


def take(mix: WeightedSamplingReader, count: int | None) -> list[int]:
    return ids(mix if count is None else itertools.islice(mix, count))


#: how many rows a run of each mode is cut at ("cycle" never ends)
LENGTH = {"stop": None, "cycle": 400, "drain": None}

weights_strategy = st.lists(st.floats(0.05, 1.0), min_size=3, max_size=3)
run_settings = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def row_group_reads(monkeypatch) -> Iterator[list[int]]:
    """Every row group the stores read, in order (the skips must read none)."""
    reads: list[int] = []
    original = ParquetStore.read_row_group

    def counting(self: ParquetStore, index: int, *args: Any, **kwargs: Any) -> Any:
        reads.append(index)
        return original(self, index, *args, **kwargs)

    monkeypatch.setattr(ParquetStore, "read_row_group", counting)
    yield reads


# -- the ends -------------------------------------------------------------------------------------------
@run_settings
@given(seed=st.integers(0, 2**32), weights=weights_strategy, mode=st.sampled_from(MODES))
def test_same_seed_same_rows(urls, seed, weights, mode):
    with mixer(urls, weights, seed, mode) as a, mixer(urls, weights, seed, mode) as b:
        first = take(a, LENGTH[mode])
        assert first == take(b, LENGTH[mode])
    with mixer(urls, weights, seed + 1, mode) as c:
        assert take(c, LENGTH[mode]) != first


@run_settings
@given(seed=st.integers(0, 2**32), weights=weights_strategy)
def test_stop_ends_at_the_first_drawn_reader_with_nothing_left(urls, seed, weights):
    """The default, Petastorm's: the draws as draw_choices says, until a drawn reader has no row."""
    with mixer(urls, weights, seed, "stop") as mix:
        got = ids(mix)
        assert mix.num_epochs == 1
    picks = draw_choices(seed, weights, 0, len(got) + 1).tolist()
    assert [i // 1000 for i in got] == picks[:-1]
    ended = picks[-1]
    assert sum(1 for i in got if i // 1000 == ended) == SIZES[ended]
    assert all(sum(1 for i in got if i // 1000 == k) <= SIZES[k] for k in range(3))


@run_settings
@given(seed=st.integers(0, 2**32), weights=weights_strategy, epochs=st.sampled_from([1, 2]))
def test_cycle_delivers_each_source_in_its_own_order_pass_after_pass(urls, seed, weights, epochs):
    with mixer(urls, weights, seed, "cycle", epochs=epochs) as mix:
        assert mix.num_epochs is None
        got = take(mix, 900)
        passes = mix.diagnostics["passes"]
    orders = []
    for k, url in enumerate(urls):
        mine = [i for i in got if i // 1000 == k]
        alone, pass_seed = [], seed + k  # pass after pass: all its epochs, each pass in its own seeded order
        while sum(map(len, alone)) <= len(mine):  # the passes the mix's rows reach into, and one more
            with source_reader(url, 0, epochs=epochs, seed=pass_seed) as reader:
                alone.append(ids(reader))
            pass_seed = next_pass_seed(pass_seed)
        assert mine == [i for rows in alone for i in rows][:len(mine)], f"source {k}"
        assert passes[k] == (len(mine) - 1) // len(alone[0])  # a pass starts when a drawn source ran out
        orders += alone[:passes[k] + 1]
        assert all(sorted(rows) == sorted(alone[0]) for rows in alone)  # every pass: all of the source's rows
    assert sum(passes) > 0
    assert len({tuple(rows) for rows in orders}) == len(orders)  # no pass in another's order


@run_settings
@given(seed=st.integers(0, 2**32), weights=weights_strategy)
def test_drain_delivers_every_row_of_every_source_once(urls, seed, weights):
    with mixer(urls, weights, seed, "drain") as mix:
        got = ids(mix)
        assert mix.diagnostics["drained"] == [True, True, True]
        assert next(mix, None) is None
    assert sorted(got) == sorted(itertools.chain(*(range(1000 * k, 1000 * k + n) for k, n in enumerate(SIZES))))
    for k, url in enumerate(urls):
        assert [i for i in got if i // 1000 == k] == own_order(url, k, seed)


def test_drain_renormalises_the_weights_over_the_readers_left(urls):
    """Once source 0 (weight 0.98) is drained, the others share the draws 1:3 as their weights say."""
    with mixer(urls, [0.98, 0.005, 0.015], 3, "drain") as mix:
        got = ids(mix)
    head = got[:SIZES[0] + 5]
    assert sum(1 for i in head if i < 1000) >= SIZES[0] - 2  # source 0 goes first, nearly alone
    drained_at = max(n for n, i in enumerate(got) if i < 1000)
    tail = [i // 1000 for i in got[drained_at + 1:]]
    picks = draw_choices(3, [0, 0.25, 0.75], 0, 4000)
    assert abs(tail[:40].count(2) / 40 - float(np.mean(picks == 2))) < 0.3


def test_a_drawn_source_without_rows_is_named_in_cycle_mode(urls, tmp_path):
    empty = make_reader(urls[1], predicate=in_lambda(["id"], lambda i: False), workers_count=1,
                        reader_pool_type="dummy", schema_fields=["id"])
    with empty, source_reader(urls[0], 0) as full:
        mix = WeightedSamplingReader([full, empty], [0.5, 0.5], seed=1, on_exhausted="cycle")
        with pytest.raises(WeightedSamplingError, match="reader 1 has no rows"):
            take(mix, 50)


def test_on_exhausted_is_checked(urls):
    with source_reader(urls[0], 0) as a, source_reader(urls[1], 1) as b:
        with pytest.raises(WeightedSamplingError, match="on_exhausted must be one of"):
            WeightedSamplingReader([a, b], [1, 1], on_exhausted="all")


# -- exact resume, in every mode ---------------------------------------------------------------------------
@run_settings
@given(seed=st.integers(0, 2**32), weights=weights_strategy, mode=st.sampled_from(MODES),
       cut=st.floats(0, 1), epochs=st.sampled_from([1, 2]))
def test_resume_at_any_point_is_the_uninterrupted_run(urls, seed, weights, mode, cut, epochs):
    with mixer(urls, weights, seed, mode, epochs=epochs) as whole:
        full = take(whole, LENGTH[mode])
    k = int(cut * len(full))
    with mixer(urls, weights, seed, mode, epochs=epochs) as first:
        head = take(first, k)
        state = json.loads(json.dumps(first.state_dict()))
    rest = None if LENGTH[mode] is None else len(full) - k
    with mixer(urls, weights, seed + 7, mode, epochs=epochs, resume_from=state) as second:  # the state's seed wins
        assert head + take(second, rest) == full


def test_resume_mid_cycle_in_thread_pools(urls):
    """Saved after sources started over (passes > 0), resumed with threads: the same rows."""
    with mixer(urls, [0.2, 0.5, 0.3], 5, "cycle", pool="thread") as whole:
        full = take(whole, 300)
    with mixer(urls, [0.2, 0.5, 0.3], 5, "cycle", pool="thread") as first:
        head = take(first, 170)
        state = json.loads(json.dumps(first.state_dict()))
    assert state["passes"][1] > 0
    with mixer(urls, [0.2, 0.5, 0.3], 5, "cycle", pool="thread", resume_from=state) as second:
        assert head + take(second, 130) == full


def test_start_over_goes_back_to_the_first_pass_and_its_order(urls):
    """After passes each in their own order, start_over() (a loader's next iteration) gives the first pass's rows
    again, in its order, and the passes after it as before."""
    with mixer(urls, [0.2, 0.5, 0.3], 5, "cycle") as mix:
        full = take(mix, 300)
        assert max(mix.diagnostics["passes"]) > 1
        mix.start_over()
        assert mix.diagnostics["passes"] == [0, 0, 0]
        assert take(mix, 300) == full


def test_a_state_of_another_mode_is_refused(urls):
    with mixer(urls, [1, 1, 1], 0, "cycle") as mix:
        take(mix, 5)
        state = mix.state_dict()
    with mixer(urls, [1, 1, 1], 0, "drain") as other:
        with pytest.raises(ReaderStateError, match="on_exhausted='cycle'"):
            other.load_state_dict(state)
        assert take(other, 3) == take(mixer(urls, [1, 1, 1], 0, "drain"), 3)


def test_a_state_of_version_1_still_loads(urls):
    """States saved before the modes (Petastorm's end, the constructor's weights) resume as they did."""
    with mixer(urls, [1, 2, 3], 4, "stop") as whole:
        full = take(whole, None)
    with mixer(urls, [1, 2, 3], 4, "stop") as first:
        head = take(first, 20)
        state = first.state_dict()
    old = {key: state[key] for key in ("seed", "draws", "probabilities", "readers")}
    with mixer(urls, [1, 2, 3], 4, "stop", resume_from={**old, "version": 1, "kind": STATE_KIND}) as second:
        assert head + take(second, None) == full


# -- weights changed mid-run ---------------------------------------------------------------------------------
def run_with_change(urls: list[str], mode: OnExhausted, seed: int, change_at: int, weights: list[float],
                    stop_at: int | None, resume_from: dict[str, Any] | None = None) -> tuple[list[int], Any]:
    """Rows of a mix whose weights change after ``change_at`` rows; its state after ``stop_at`` rows."""
    mix = mixer(urls, [0.2, 0.3, 0.5], seed, mode, resume_from=resume_from)
    got: list[int] = []
    with mix:
        while len(got) < 500:
            if len(got) == change_at and resume_from is None:
                mix.set_weights(weights)
            if len(got) == stop_at:
                return got, json.loads(json.dumps(mix.state_dict()))
            row = next(mix, None)
            if row is None:
                break
            got.append(int(row.id))
    return got, None


@run_settings
@given(seed=st.integers(0, 2**32), mode=st.sampled_from(MODES), weights=weights_strategy,
       change=st.floats(0, 1), stop=st.floats(0, 1))
def test_a_weight_change_resumes_exactly(urls, seed, mode, weights, change, stop):
    full, _ = run_with_change(urls, mode, seed, 10 ** 9, weights, None)  # the length, never changed
    change_at = int(change * (len(full) - 1))
    full, _ = run_with_change(urls, mode, seed, change_at, weights, None)
    stop_at = change_at + 1 + int(stop * (len(full) - change_at - 1))
    head, state = run_with_change(urls, mode, seed, change_at, weights, stop_at)
    if state is None:  # the mix ended before stop_at
        return
    assert state["weights"] == pytest.approx(list(np.asarray(weights) / sum(weights)))
    rest, _ = run_with_change(urls, mode, seed, change_at, weights, None, resume_from=state)
    assert (head + rest)[:len(full)] == full


def test_a_weight_change_changes_the_draws_from_the_next_row_on(urls):
    with mixer(urls, [1, 1, 1], 2, "cycle") as mix:
        before = take(mix, 30)
        mix.set_weights([0, 0, 5])
        assert mix.probabilities == (0.0, 0.0, 1.0)
        after = take(mix, 200)
    with mixer(urls, [1, 1, 1], 2, "cycle") as same:
        assert take(same, 30) == before
    assert {i // 1000 for i in after} == {2}


@pytest.mark.parametrize("weights, match", [
    ([0.5, float("nan"), 0.1], "finite"),
    ([0.5, float("inf"), 0.1], "finite"),
    ([0.5, -0.1, 0.1], ">= 0"),
    ([0, 0, 0], "not all be 0"),
    ([0.5, 0.5], "same length: 3 readers"),
    (["a", 1, 1], "numbers"),
])
def test_bad_weights_are_refused_and_the_weights_stay(urls, weights, match):
    with mixer(urls, [1, 2, 1], 6, "cycle") as mix:
        with pytest.raises(WeightsError, match=match) as info:
            mix.set_weights(weights)
        assert isinstance(info.value, WeightedSamplingError) and isinstance(info.value, ValueError)
        assert isinstance(info.value, UnihubError)
        assert mix.probabilities == (0.25, 0.5, 0.25)
        assert take(mix, 100) == take(mixer(urls, [1, 2, 1], 6, "cycle"), 100)


def test_drain_ends_when_only_drained_readers_have_weight(urls):
    with mixer(urls, [0.9, 0.05, 0.05], 0, "drain") as mix:
        while not mix.diagnostics["drained"][0]:
            next(mix)
        mix.set_weights([1, 0, 0])
        assert next(mix, None) is None


# -- skipping ahead --------------------------------------------------------------------------------------------
@run_settings
@given(seed=st.integers(0, 2**32), weights=weights_strategy, mode=st.sampled_from(MODES),
       before=st.integers(0, 60), skip=st.integers(0, 250), epochs=st.sampled_from([1, 2]))
def test_mix_skip_rows_then_read_is_read_then_read(urls, row_group_reads, seed, weights, mode, before, skip, epochs):
    with mixer(urls, weights, seed, mode, epochs=epochs) as reading:
        take(reading, before)
        read = take(reading, skip)
        after_read = take(reading, 60)
        state_read = reading.state_dict()
    with mixer(urls, weights, seed, mode, epochs=epochs) as skipping:
        take(skipping, before)
        reads = len(row_group_reads)
        assert skipping.skip_rows(skip) == len(read)
        assert len(row_group_reads) == reads, "skip_rows() read row groups"
        assert take(skipping, 60) == after_read
        state_skipped = skipping.state_dict()
        if mode == "cycle":
            assert skipping.diagnostics["passes"] == reading.diagnostics["passes"]
    assert {k: v for k, v in state_skipped.items() if k != "readers"} == \
        {k: v for k, v in state_read.items() if k != "readers"}
    if state_skipped != state_read:
        # A source the skip ran to its very end may keep another encoding of that end than the one reading
        # it left (drain mode, seed 272: epoch 1 task 0 against the last task's end): both must resume alike
        with mixer(urls, weights, seed, mode, epochs=epochs) as read_on, \
                mixer(urls, weights, seed, mode, epochs=epochs) as skipped_on:
            read_on.load_state_dict(state_read)
            skipped_on.load_state_dict(state_skipped)
            assert take(skipped_on, LENGTH[mode]) == take(read_on, LENGTH[mode])


def test_mix_skip_rows_is_refused_where_rows_are_known_only_by_reading(urls):
    with make_batch_reader(urls[0]) as a, make_batch_reader(urls[1]) as b:
        with pytest.raises(WeightedSamplingError, match="skips rows of a row mix"):
            WeightedSamplingReader([a, b], [1, 1]).skip_rows(3)
    odd = in_lambda(["id"], lambda i: i % 2 == 1)
    with source_reader(urls[0], 0) as a, source_reader(urls[1], 1, predicate=odd) as b:
        mix = WeightedSamplingReader([a, b], [1, 1], seed=0)
        with pytest.raises(InvalidArgumentError, match="known in advance"):
            mix.skip_rows(40)
        with pytest.raises(WeightedSamplingError, match="count >= 0"):
            mix.skip_rows(-1)


def reader_options(draw_seed: int) -> dict[str, Any]:
    """Seeded random reader options: shuffling, epochs, sharding (by row group or row)."""
    rng = np.random.default_rng(draw_seed)
    options: dict[str, Any] = dict(seed=int(rng.integers(100)), shuffle_rows=bool(rng.integers(2)),
                                   shuffle_row_groups=bool(rng.integers(2)), num_epochs=int(rng.integers(1, 4)),
                                   shuffle_row_drop_partitions=int(rng.integers(1, 3)))
    if rng.integers(2):
        count = int(rng.integers(2, 4))
        options.update(cur_shard=int(rng.integers(count)), shard_count=count,
                       shard_by=str(rng.choice(["row_group", "row"])), shard_remainder=str(rng.choice(["pad", "drop"])))
    return options


@pytest.mark.parametrize("draw_seed", range(12))
def test_reader_skip_rows_then_read_is_read_then_read(urls, row_group_reads, draw_seed):
    options = reader_options(draw_seed)
    rng = np.random.default_rng(1000 + draw_seed)

    def make() -> Any:
        return make_reader(urls[2], schema_fields=["id"], reader_pool_type="dummy", workers_count=1, **options)

    with make() as whole:
        full = ids(whole)
    for _ in range(4):
        before, skip = int(rng.integers(0, len(full) + 1)), int(rng.integers(0, len(full) + 5))
        with make() as reader:
            take(reader, before)
            reads = len(row_group_reads)
            assert reader.skip_rows(skip) == min(skip, len(full) - before)
            assert len(row_group_reads) == reads and reader.diagnostics["items_delivered"] == before
            state = json.loads(json.dumps(reader.state_dict()))
            assert ids(reader) == full[before + skip:], (options, before, skip)
        with make() as resumed:
            resumed.load_state_dict(state)
            assert ids(resumed) == full[before + skip:]


def test_reader_skip_rows_reads_only_the_task_it_lands_in(urls, row_group_reads):
    with make_reader(urls[2], schema_fields=["id"], reader_pool_type="dummy", workers_count=1, num_epochs=None,
                     shuffle_row_groups=False) as reader:
        assert reader.skip_rows(10**9 + 5) == 10**9 + 5  # forever: whole epochs are counted, not walked
        assert reader.state_dict()["epoch"] == 10**9 // SIZES[2]
        first = ids(itertools.islice(reader, 1))
        assert len(row_group_reads) == 1
    assert first == [2000 + (10**9 + 5) % SIZES[2]]


def test_batch_reader_skip_rows_starts_the_next_batch_there(urls, row_group_reads):
    def make() -> Any:
        return make_batch_reader(urls[0], schema_fields=["id"], seed=1, shuffle_rows=True, num_epochs=2,
                                 reader_pool_type="dummy", workers_count=1)

    with make() as whole:
        full = [i for batch in whole for i in batch.id.tolist()]
    for skip in (0, 1, 5, SIZES[0], SIZES[0] + 3, 2 * SIZES[0], 2 * SIZES[0] + 9):
        with make() as reader:
            reads = len(row_group_reads)
            assert reader.skip_rows(skip) == min(skip, 2 * SIZES[0])
            assert len(row_group_reads) == reads
            assert [i for batch in reader for i in batch.id.tolist()] == full[skip:]


def test_reader_skip_rows_is_refused_where_rows_are_known_only_by_reading(urls):
    with make_reader(urls[0], predicate=in_lambda(["id"], lambda i: i > 3)) as reader:
        with pytest.raises(InvalidArgumentError, match="known in advance"):
            reader.skip_rows(2)
    with make_reader(urls[0]) as reader:
        for bad in (-1, 1.5, True):
            with pytest.raises(InvalidArgumentError, match="count >= 0"):
                reader.skip_rows(bad)


# -- the loaders' skip_batches -----------------------------------------------------------------------------------
def loaders() -> Any:
    pytest.importorskip("torch")
    from unihub.bridges.torch import loaders as pytorch

    return pytorch


def batch_ids(batches: Any) -> list[list[int]]:
    return [batch["id"].tolist() for batch in batches]


@pytest.mark.parametrize("kind", ["row", "batch", "mix"])
@pytest.mark.parametrize("batch_size", [1, 7])
def test_loader_skip_batches_then_iterate_is_iterate_then_iterate(urls, row_group_reads, kind, batch_size):
    pytorch = loaders()

    def make() -> Any:
        reader: Any
        if kind == "row":
            reader = make_reader(urls[2], schema_fields=["id"], seed=4, shuffle_rows=True, num_epochs=2,
                                 reader_pool_type="dummy", workers_count=1)
        elif kind == "batch":
            reader = make_batch_reader(urls[2], schema_fields=["id"], seed=4, shuffle_rows=True, num_epochs=2,
                                       reader_pool_type="dummy", workers_count=1)
        else:
            reader = mixer(urls, [1, 2, 3], 4, "cycle")
        loader_type = pytorch.BatchedDataLoader if kind == "batch" else pytorch.DataLoader
        return loader_type(reader, batch_size=batch_size)

    with make() as loader:
        full = batch_ids(itertools.islice(loader, 40))
    for before, skip in ((0, 3), (2, 11), (5, 0), (1, 30)):
        with make() as loader:
            head = batch_ids(itertools.islice(loader, before))
            reads = len(row_group_reads)
            loader.skip_batches(skip)
            assert len(row_group_reads) == reads
            state = json.loads(json.dumps(loader.state_dict()))
            assert head + batch_ids(itertools.islice(loader, 40 - before - skip)) == full[:before] + full[before + skip:]
        with make() as resumed:
            resumed.load_state_dict(state)
            assert batch_ids(itertools.islice(resumed, 40 - before - skip)) == full[before + skip:]


def test_loader_skip_batches_is_refused_where_it_would_have_to_read(urls):
    pytorch = loaders()
    with make_reader(urls[0], schema_fields=["id"], workers_count=1) as reader:
        shuffled = pytorch.DataLoader(reader, batch_size=4, shuffling_queue_capacity=10, seed=0)
        with pytest.raises(InvalidArgumentError, match="shuffling queue"):
            shuffled.skip_batches(2)
    with make_reader(urls[0], schema_fields=["id"], workers_count=1) as reader:
        loader = pytorch.DataLoader(reader, batch_size=4)
        iterator = iter(loader)
        next(iterator)
        with pytest.raises(UsageError, match="while the loader is being iterated"):
            loader.skip_batches(1)
        iterator.close()
        with pytest.raises(InvalidArgumentError, match="count >= 0"):
            loader.skip_batches(-2)


def test_mix_skip_rows_needs_readers_that_skip():
    from .test_weighted import FakeReader

    mix = WeightedSamplingReader([FakeReader(0), FakeReader(1)], [1, 1], seed=0)
    with pytest.raises(WeightedSamplingError, match="reader 0 \\(FakeReader\\) has no skip_rows"):
        mix.skip_rows(5)
    assert mix.diagnostics["draws"] == 0


def test_num_epochs_says_whether_the_mix_ends(urls):
    def mix(mode: OnExhausted, epochs: list[int | None]) -> WeightedSamplingReader:
        readers = [source_reader(u, k, epochs=e) for k, (u, e) in enumerate(zip(urls, epochs))]
        return WeightedSamplingReader(readers, [1, 1, 1], on_exhausted=mode)

    assert mix("stop", [1, None, None]).num_epochs == 1  # the first one ends it
    assert mix("stop", [None, None, None]).num_epochs is None
    assert mix("drain", [1, None, 1]).num_epochs is None  # one never drains
    assert mix("drain", [1, 2, 1]).num_epochs == 1
    assert mix("cycle", [1, 1, 1]).num_epochs is None


@pytest.mark.parametrize("mode, capacity", [("stop", 0), ("cycle", 0), ("drain", 0), ("stop", 40)])
def test_a_weight_change_through_a_loader_resumes_exactly(urls, mode, capacity):
    """The loader reads rows ahead of the batch where the weights change (its shuffling queue); its state
    still carries the change. In order: the same batches. Shuffled (the queue's draws start over on
    resume, as for any reader): the same rows, which the weights choose."""
    pytorch = loaders()

    def run(stop_at: int | None, state: dict[str, Any] | None = None) -> tuple[list[list[int]], Any]:
        mix = mixer(urls, [0.6, 0.3, 0.1], 9, mode)
        loader = pytorch.DataLoader(mix, batch_size=5, shuffling_queue_capacity=capacity, seed=2)
        if state is not None:
            loader.load_state_dict(state)
        got: list[list[int]] = []
        with loader:
            for batch in loader:
                got.append(batch["id"].tolist())
                if len(got) == 3 and state is None:
                    mix.set_weights([0.05, 0.15, 0.8])
                if len(got) == stop_at:
                    return got, json.loads(json.dumps(loader.state_dict()))
                if len(got) == 60:
                    break
        return got, None

    full, _ = run(None)
    head, state = run(7)
    assert bool(state["reader"]["changes"]) == (capacity > 0), "the change the queue read ahead of is in the state"
    rest, _ = run(None, state)
    if capacity == 0:
        assert (head + rest)[:len(full)] == full
    else:
        assert sorted(itertools.chain(*head, *rest)) == sorted(itertools.chain(*full))


@pytest.mark.parametrize("mode", MODES)
def test_a_state_saved_before_a_change_carries_it_for_reads_and_skips(urls, row_group_reads, mode):
    """with_later_changes(): a state saved at row 10, the weights changed at row 30, resumed by reading or by
    skip_rows() across the change: the rows of the uninterrupted run."""
    with mixer(urls, [0.5, 0.3, 0.2], 12, mode) as whole:
        before = take(whole, 10)
        early = whole.state_dict()
        middle = take(whole, 20)
        whole.set_weights([0.1, 0.1, 0.8])
        after = take(whole, 60)
        carried = json.loads(json.dumps(whole.with_later_changes(early)))
    full = before + middle + after
    assert carried["changes"] == [[30, [0.1, 0.1, 0.8]]] and early.get("changes") == []
    with mixer(urls, [0.5, 0.3, 0.2], 12, mode, resume_from=carried) as read:
        assert take(read, 80) == full[10:]
    with mixer(urls, [0.5, 0.3, 0.2], 12, mode, resume_from=carried) as skipping:
        reads = len(row_group_reads)
        assert skipping.skip_rows(40) == 40 and len(row_group_reads) == reads
        assert skipping.probabilities == pytest.approx((0.1, 0.1, 0.8))
        assert take(skipping, 40) == full[50:]
