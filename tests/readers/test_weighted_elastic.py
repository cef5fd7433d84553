"""WeightedSamplingReader resumed elastically: every rank's mix state resumes on any other number of ranks.

Each rank of a run mixes its shards of three sources (``cur_shard``/``shard_count``); the new ranks are
given the states of all old ranks (``resume_from=[...]``). Checked on row ids, per source, pass
(``"cycle"``) and epoch: the new ranks deliver exactly the rows no old rank delivered (``pad``: all of them,
ranks equal by wrapping round; ``drop``: each at most once, ranks equal), none again; the weights in force
(a curriculum's change) carry over; the new ranks draw as ``draw_choices`` says from the most draws of any
old rank on; two resumes from the same states give the same rows.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter, defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unihub import WeightedSamplingReader, make_batch_reader, make_reader
from unihub.readers.reader import ReaderStateError
from unihub.readers.weighted import OnExhausted, draw_choices

from .test_weighted import write

#: three sources of other sizes; a row's id says which (id // 1000)
SIZES = (29, 17, 43)
SOURCE_SEEDS = (11, 12, 13)
MIX_SEED = 5


@pytest.fixture(scope="module")
def urls(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("weighted_elastic")
    return [write(root / f"s{k}", range(1000 * k, 1000 * k + n)) for k, n in enumerate(SIZES)]


def make_mix(urls: list[str], rank: int, ranks: int, weights: list[float], mode: OnExhausted, *,
             remainder: str = "pad", epochs: int = 1, seed: int = MIX_SEED, resume_from: Any = None,
             sources: int = 3) -> WeightedSamplingReader:
    readers = [make_reader(url, seed=SOURCE_SEEDS[k], shuffle_rows=True, shuffle_row_groups=True, num_epochs=epochs,
                           reader_pool_type="dummy", schema_fields=["id"], cur_shard=rank, shard_count=ranks,
                           shard_by="row", shard_remainder=remainder)
               for k, url in enumerate(urls[:sources])]
    return WeightedSamplingReader(readers, weights[:sources], seed=seed, on_exhausted=mode, resume_from=resume_from)


Tagged = tuple[int, int, int, int]  # (source, pass, epoch, id)


def take(mix: WeightedSamplingReader, count: int | None, until_pass: list[int] | None = None) -> list[Tagged]:
    """The next ``count`` rows (all: None) as (source, pass, epoch, id); with ``until_pass``, until every
    source has started that pass."""
    out: list[Tagged] = []
    while count is None or len(out) < count:
        if until_pass is not None and all(p >= q for p, q in zip(mix._passes, until_pass)):
            break
        row = next(mix, None)
        if row is None:
            break
        source = int(row.id) // 1000
        out.append((source, mix._passes[source], mix.readers[source]._current[0], int(row.id)))
    return out


def run_old(urls: list[str], ranks: int, stops: list[int], weights: list[float], mode: OnExhausted,
            change: tuple[int, list[float]] | None, resume_from: Any = None, **options: Any
            ) -> tuple[list[list[Tagged]], list[dict[str, Any]]]:
    """Each rank's rows up to its stop (weights changed at draw ``change[0]`` where it gets there), and its
    state there (through JSON, as a checkpoint keeps it)."""
    rows, states = [], []
    for k in range(ranks):
        with make_mix(urls, k, ranks, weights, mode, resume_from=resume_from, **options) as mix:
            mine = []
            if change is not None and change[0] < stops[k]:
                mine = take(mix, change[0])
                mix.set_weights(change[1])
            mine += take(mix, stops[k] - len(mine))
            rows.append(mine)
            states.append(json.loads(json.dumps(mix.state_dict())))
    return rows, states


def check_rest(before: list[list[Tagged]], after: list[list[Tagged]], groups: list[tuple[int, int, int]],
               remainder: str, whole: bool, starts: dict[tuple[int, int], int]) -> None:
    """For each (source, pass, epoch) of ``groups``: ``after`` (each new rank's rows) holds none of the rows
    ``before`` (every old rank's) delivered, and where read ``whole``, exactly the rest (pad/drop), ranks equal.
    An epoch before the one the new ranks start a source's pass in is over (every old rank had delivered its
    share: with ``drop`` the rows left over stay undelivered, as in a run without resume)."""
    old = defaultdict(set)
    for rows in before:
        for s, p, e, i in rows:
            old[s, p, e].add(i)
    for group in groups:
        s = group[0]
        gone = old[group]
        new = [[i for t in rows if t[:3] == group for i in [t[3]]] for rows in after]
        flat = [i for rows in new for i in rows]
        assert not set(flat) & gone, f"{group}: rows delivered again"
        assert all(len(rows) == len(set(rows)) for rows in new), f"{group}: a rank delivered a row twice"
        if group[2] < starts[group[:2]]:
            assert not flat, f"{group}: rows of an epoch the old ranks had finished"
            continue
        if not whole:
            continue
        rest = set(range(1000 * s, 1000 * s + SIZES[s])) - gone
        assert len({len(rows) for rows in new}) == 1, f"{group}: ranks not equal {[len(r) for r in new]}"
        if remainder == "pad":
            assert set(flat) == rest and len(flat) == len(new) * math.ceil(len(rest) / len(new)), group
        else:
            assert len(flat) == len(set(flat)) == len(new) * (len(rest) // len(new)) and set(flat) <= rest, group


def lead_weights(states: list[dict[str, Any]]) -> list[float]:
    """The weights of the state that drew most (the first of them)."""
    return max(states, key=lambda s: s["draws"])["weights"]


weights_strategy = st.lists(st.floats(0.25, 1.0), min_size=3, max_size=3)
change_strategy = st.none() | st.tuples(st.integers(0, 60), weights_strategy)
elastic_settings = settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck),
                            derandomize=True)


def resume_and_check(urls: list[str], before: list[list[Tagged]], states: list[dict[str, Any]], new: int,
                     weights: list[float], mode: OnExhausted, remainder: str, epochs: int
                     ) -> list[list[Tagged]]:
    """Resume ``states`` on ``new`` ranks, read each to the end (``"cycle"``: through the next pass of every
    source) and check the rows, the weights, the draws and that a second resume gives the same rows."""
    start = [min(s["passes"][k] for s in states) for k in range(3)]
    draws = max(s["draws"] for s in states)
    after, starts = [], set()
    for k in range(new):
        with make_mix(urls, k, new, weights, mode, remainder=remainder, epochs=epochs, resume_from=states) as mix:
            assert list(mix.probabilities) == pytest.approx(lead_weights(states), abs=1e-12)
            assert mix._passes == start
            starts.add(tuple((s, p, epoch) for s, r in enumerate(mix.readers) for p, epoch in (
                (start[s], r._where()[0]), (start[s] + 1, mix._carry[s]["epoch"] if mix._carry[s] else 0))))
            until = [p + 2 for p in start] if mode == "cycle" else None
            rows = take(mix, None if mode != "stop" else 400, until)
            weights_now = list(mix.probabilities)
        after.append(rows)
        if mode != "drain":  # nothing drained, no weight change to come: the draws are draw_choices' from `draws`
            picks = draw_choices(MIX_SEED, weights_now, draws, draws + len(rows)).tolist()
            assert [s for s, _, _, _ in rows] == picks
    with make_mix(urls, new - 1, new, weights, mode, remainder=remainder, epochs=epochs, resume_from=states) as again:
        assert take(again, len(after[-1])) == after[-1], "two resumes from the same states differ"
    passes = [(s, p) for s in range(3) for p in ([start[s], start[s] + 1] if mode == "cycle" else [0])]
    groups = [(s, p, e) for s, p in passes for e in range(epochs)]
    assert len(starts) == 1, "the new ranks start a source in different epochs"
    check_rest(before, after, groups, remainder, mode != "stop", {(s, p): e for s, p, e in starts.pop()})
    return after


@elastic_settings
@given(old=st.integers(1, 16), new=st.integers(1, 16), data=st.data(), weights=weights_strategy,
       change=change_strategy, mode=st.sampled_from(["stop", "drain"]), remainder=st.sampled_from(["pad", "drop"]),
       epochs=st.sampled_from([1, 2]))
def test_any_world_size_resumes_on_any_other(urls, old, new, data, weights, change, mode, remainder, epochs):
    """``"stop"`` and ``"drain"``: each source's rows of every epoch, once across the resume."""
    total = sum(SIZES) * epochs
    stops = data.draw(st.lists(st.integers(0, total // old + 2), min_size=old, max_size=old))
    before, states = run_old(urls, old, stops, weights, mode, change, remainder=remainder, epochs=epochs)
    resume_and_check(urls, before, states, new, weights, mode, remainder, epochs)


def passes_apart(states: list[dict[str, Any]]) -> int:
    return max(max(s["passes"][k] for s in states) - min(s["passes"][k] for s in states) for k in range(3))


@elastic_settings
@given(old=st.integers(1, 16), new=st.integers(1, 16), base=st.integers(0, 200), data=st.data(),
       weights=weights_strategy, change=change_strategy, remainder=st.sampled_from(["pad", "drop"]),
       epochs=st.sampled_from([1, 2]))
def test_cycle_resumes_on_any_world_size_ranks_a_pass_apart_too(urls, old, new, base, data, weights, change,
                                                               remainder, epochs):
    """``"cycle"``: the rest of each source's pass, and of the next where ranks had begun it."""
    jitter = data.draw(st.sampled_from([0, 3, 20]))
    stops = [base + data.draw(st.integers(0, jitter)) for _ in range(old)]
    before, states = run_old(urls, old, stops, weights, "cycle", change, remainder=remainder, epochs=epochs)
    if passes_apart(states) > 1:
        with pytest.raises(ReaderStateError, match="passes apart"):
            make_mix(urls, 0, new, weights, "cycle", remainder=remainder, epochs=epochs, resume_from=states)
        return
    resume_and_check(urls, before, states, new, weights, "cycle", remainder, epochs)


@pytest.mark.parametrize("remainder", ["pad", "drop"])
@pytest.mark.parametrize("old, new", [(2, 3), (3, 2), (4, 1), (1, 5)])
def test_ranks_a_pass_apart_resume_the_next_pass_exactly(urls, old, new, remainder):
    """Rank 0 stops just after source 1 started over, the others just before: the new ranks deliver the rest
    of the pass, then the rest of the next (what rank 0 carried of it is not delivered again)."""
    weights = [0.3, 1.0, 0.3]
    with make_mix(urls, 0, old, weights, "cycle", remainder=remainder) as probe:
        rows = take(probe, None, [0, 1, 0])
    first_of_next = len(rows) + 3
    before, states = run_old(urls, old, [first_of_next] + [len(rows) - 1] * (old - 1), weights, "cycle", None,
                             remainder=remainder)
    assert [s["passes"][1] for s in states] == [1] + [0] * (old - 1)
    assert states[0]["ended"][1] is not None
    resume_and_check(urls, before, states, new, weights, "cycle", remainder, 1)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(sizes=st.lists(st.integers(1, 9), min_size=3, max_size=3), data=st.data(),
       mode=st.sampled_from(["cycle", "drain"]))
def test_a_resumed_mix_resumes_again_on_a_third_world_size(urls, sizes, data, mode):
    first, second, third = sizes
    weights = [1.0, 0.5, 0.8]
    base = data.draw(st.integers(0, 120))
    stops = [base + data.draw(st.integers(0, 2)) for _ in range(first)]
    rows_a, states_a = run_old(urls, first, stops, weights, mode, None, remainder="drop")
    if passes_apart(states_a) > 1:
        return
    base = data.draw(st.integers(0, 120))
    stops = [base + data.draw(st.integers(0, 2)) for _ in range(second)]
    rows_b, states_b = run_old(urls, second, stops, weights, mode, None, resume_from=states_a, remainder="drop")
    if passes_apart(states_b) > 1:
        return
    resume_and_check(urls, rows_a + rows_b, states_b, third, weights, mode, "drop", 1)


def test_a_state_saved_after_the_resume_resumes_one_by_one(urls):
    _, states = run_old(urls, 3, [20, 25, 30], [1, 1, 1], "cycle", None)
    with make_mix(urls, 1, 2, [1, 1, 1], "cycle", resume_from=states) as mix:
        take(mix, 80)
        state = json.loads(json.dumps(mix.state_dict()))
        tail = take(mix, 150)
    with make_mix(urls, 1, 2, [1, 1, 1], "cycle", resume_from=state) as mix:
        assert take(mix, 150) == tail


def test_the_weights_in_force_carry_over(urls):
    """A curriculum's change made mid-run is in the states: the new ranks draw with it."""
    before, states = run_old(urls, 2, [30, 30], [1, 1, 1], "cycle", (10, [0.0, 1.0, 3.0]))
    with make_mix(urls, 0, 3, [1, 1, 1], "cycle", resume_from=states) as mix:
        assert list(mix.probabilities) == pytest.approx([0.0, 0.25, 0.75])
        assert {s for s, _, _, _ in take(mix, 100)} == {1, 2}


# -- refused by name --------------------------------------------------------------------------------------------
def test_states_that_are_not_one_run_are_refused_by_name(urls):
    _, states = run_old(urls, 2, [5, 9], [1, 1, 1], "cycle", None)

    def resume(states: Any, mode: OnExhausted = "cycle", **options: Any) -> Any:
        return make_mix(urls, 0, 3, [1, 1, 1], mode, resume_from=states, **options)

    with pytest.raises(ReaderStateError, match="holds no state"):
        resume([])
    with pytest.raises(ReaderStateError, match="state 1 of the list: .*on_exhausted='stop'"):
        resume([states[0], run_old(urls, 2, [5, 5], [1, 1, 1], "stop", None)[1][1]], "cycle")
    with pytest.raises(ReaderStateError, match="state 0 of the list: .*on_exhausted='cycle'"):
        resume(states, "drain")
    with pytest.raises(ReaderStateError, match="different seeds"):
        resume([states[0], dict(states[1], seed=MIX_SEED + 1)])
    two = run_old(urls, 2, [5, 5], [1, 1, 1], "cycle", None, sources=2)[1]
    with pytest.raises(ReaderStateError, match="state 0 of the list: .*mix of 2 readers, this one has 3"):
        resume(two)
    with pytest.raises(ReaderStateError, match="probabilities"):
        make_mix(urls, 0, 3, [1, 2, 1], "cycle", resume_from=states)
    bad = json.loads(json.dumps(states))
    bad[1]["readers"][2]["seed"] += 1  # the source's ranks were not one run
    with pytest.raises(ReaderStateError, match="source 2: .*different seeds"):
        resume(bad)
    with pytest.raises(ReaderStateError, match="skip, exclude"):
        resume([dict(states[0], skip=3, exclude=[]), states[1]])
    make_mix(urls, 0, 3, [1, 1, 1], "cycle", resume_from=[dict(states[0], skip=0, exclude=[]), states[1]]).stop()


def test_ranks_more_than_a_pass_apart_are_refused_by_name(urls):
    _, states = run_old(urls, 2, [0, 400], [1, 1, 1], "cycle", None)
    assert passes_apart(states) > 1
    with pytest.raises(ReaderStateError, match="source .*passes apart"):
        make_mix(urls, 0, 3, [1, 1, 1], "cycle", resume_from=states)


def test_a_refused_list_leaves_the_mix_as_it_was(urls):
    _, states = run_old(urls, 2, [5, 9], [1, 1, 1], "cycle", None)
    with make_mix(urls, 0, 2, [1, 1, 1], "cycle") as mix, make_mix(urls, 0, 2, [1, 1, 1], "cycle") as whole:
        take(mix, 40)
        bad = json.loads(json.dumps(states))
        bad[1]["readers"][2]["seed"] += 1
        with pytest.raises(ReaderStateError):
            mix.load_state_dict(bad)
        assert take(mix, 60) == take(whole, 100)[40:]


def test_one_rank_list_is_the_state_itself(urls):
    """``[state]`` on the world size that saved it: the rows it had not delivered, in the same order."""
    with make_mix(urls, 0, 1, [1, 2, 3], "drain") as mix:
        take(mix, 33)
        state = json.loads(json.dumps(mix.state_dict()))
        tail = take(mix, None)
    with make_mix(urls, 0, 1, [1, 2, 3], "drain", resume_from=[state]) as mix:
        assert Counter(take(mix, None)) == Counter(tail)


@pytest.mark.parametrize("old, new", [(3, 2), (2, 5)])
def test_batch_reader_mixes_resume_elastically(urls, old, new):
    """Batches of each source's shard: the rows no old rank delivered, once (``drop``), ranks equal."""
    def mix(rank: int, ranks: int, resume_from: Any = None) -> WeightedSamplingReader:
        readers = [make_batch_reader(url, seed=SOURCE_SEEDS[k], shuffle_rows=True, num_epochs=1,
                                     reader_pool_type="dummy", cur_shard=rank, shard_count=ranks, shard_by="row",
                                     shard_remainder="drop") for k, url in enumerate(urls)]
        return WeightedSamplingReader(readers, [1, 2, 1], seed=3, on_exhausted="drain", resume_from=resume_from)

    gone, states = [], []
    for k in range(old):
        with mix(k, old) as m:
            gone += [i for batch in itertools.islice(m, k + 1) for i in batch.id.tolist()]
            states.append(json.loads(json.dumps(m.state_dict())))
    after = []
    for k in range(new):
        with mix(k, new, states) as m:
            after.append([i for batch in m for i in batch.id.tolist()])
    for s, size in enumerate(SIZES):
        rest = set(range(1000 * s, 1000 * s + size)) - set(gone)
        new_rows = [[i for i in rows if i // 1000 == s] for rows in after]
        flat = [i for rows in new_rows for i in rows]
        assert len({len(rows) for rows in new_rows}) == 1
        assert len(flat) == len(set(flat)) == new * (len(rest) // new) and set(flat) <= rest
