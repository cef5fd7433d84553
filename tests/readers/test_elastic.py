"""Elastic resume: the states of every rank of a run resume on any other number of ranks.

Every property is checked on row ids: what the new ranks deliver of the epoch the run stopped in
is exactly the rows no old rank delivered (``pad``: all of them, ranks equal by wrapping round;
``drop``: each at most once, ranks equal), and later epochs are a fresh run's with the new shard count.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unihub import NdarrayCodec, ScalarCodec, Unischema, UnischemaField, open_dataset, write_dataset
from unihub.errors import InvalidArgumentError, ReaderStateError
from unihub.readers.plan import (
    GlobalOrder,
    PlanConfig,
    RankProgress,
    complement,
    delivered_before,
    epoch_plan,
    merge_intervals,
    rank_plan,
)
from unihub.readers.reader import Reader, make_batch_reader, make_reader

from ..elastic_rest import check_rest_of_epoch

N = 203  # rows: row groups of ~8 rows in files of 50, so shards cut row groups and files
SCHEMA = Unischema("Elastic", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                               UnischemaField("pad", np.uint8, (64,), NdarrayCodec(), False)])
OPTIONS = dict(shuffle_row_groups=True, shuffle_rows=True, seed=7, num_epochs=2, reader_pool_type="dummy",
               schema_fields=["id"])


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("elastic") / "ds"
    write_dataset(path, SCHEMA, ({"id": i, "pad": np.full(64, i % 256, np.uint8)} for i in range(N)),
                  row_group_size_mb=0.0008, rows_per_file=50)
    assert len(open_dataset(path).row_groups) >= 20
    return path


# -- the plan: pure functions of the global order ---------------------------------------------------------
SIZES = (7, 3, 10, 1, 0, 8, 5, 9, 4, 6, 2, 11)


def global_ids(config: PlanConfig, epoch: int, tasks: list[Any]) -> list[tuple[int, int]]:
    """(row group, row of its delivery order) of each row the tasks deliver: comparable across plans."""
    return [(t.row_group, r) for t in tasks for r in range(t.start, t.stop)]


@pytest.mark.parametrize("shard_by", ["row", "row_group"])
@pytest.mark.parametrize("partitions", [1, 3])
def test_every_rank_task_is_a_slice_of_the_global_order(shard_by, partitions):
    base = PlanConfig(SIZES, seed=2, shuffle_row_groups=True, shuffle_rows=True,
                      shuffle_row_drop_partitions=partitions, shard_by=shard_by, task_rows=3, first_task_rows=1)
    order = GlobalOrder(base, 1)
    seen: list[int] = []
    for k in range(3):
        config = PlanConfig(**{**base.__dict__, "cur_shard": k, "shard_count": 3})
        for task in epoch_plan(config, 1):
            a, b = order.span(task)
            assert b - a == task.num_rows
            assert global_ids(config, 1, order.tasks_of(a, b)) == global_ids(config, 1, [task])
            seen.extend(range(a, b))
    assert sorted(seen) == list(range(order.total)) or shard_by == "row"  # row shards pad round the end


def test_intervals_merge_and_complement():
    assert merge_intervals([(5, 7), (0, 2), (2, 3), (6, 9), (4, 4)]) == [(0, 3), (5, 9)]
    assert complement([(0, 3), (5, 9)], 12) == [(3, 5), (9, 12)]
    assert complement([], 4) == [(0, 4)] and complement([(0, 4)], 4) == []


@pytest.mark.parametrize("remainder", ["pad", "drop"])
@pytest.mark.parametrize("count", [1, 2, 3, 5, 7])
def test_the_rest_is_cut_into_equal_contiguous_runs(remainder, count):
    config = PlanConfig(SIZES, seed=4, shuffle_row_groups=True, shuffle_rows=True, shard_by="row",
                        shard_remainder=remainder)
    order = GlobalOrder(config, 0)
    done = {0: [(3, 10), (20, 31), (50, order.total)]}
    rest = [p for a, b in complement(done[0], order.total) for p in range(a, b)]
    runs = []
    for k in range(count):
        tasks = rank_plan(PlanConfig(**{**config.__dict__, "cur_shard": k, "shard_count": count}), 0, done)
        runs.append([p for t in tasks for p in range(*order.span(t))])
    assert len({len(run) for run in runs}) == 1
    flat = [p for run in runs for p in run]
    if remainder == "pad":
        assert set(flat) == set(rest) and len(runs[0]) == -(-len(rest) // count)
    else:
        assert len(flat) == len(set(flat)) == count * (len(rest) // count) and set(flat) <= set(rest)
    assert flat[:len(rest)] == rest[:len(flat)]  # in the global order, rank after rank


def test_delivered_before_joins_ranks_and_skips_finished_epochs():
    config = PlanConfig(SIZES, seed=1, shuffle_row_groups=True, shard_by="row", cur_shard=0, shard_count=2)
    other = PlanConfig(**{**config.__dict__, "cur_shard": 1})
    total = sum(SIZES)
    half = -(-total // 2)
    # rank 0 finished epoch 0 and read 5 rows of epoch 1; rank 1 read all but 4 rows of epoch 0 and 2 rows more
    epoch, done = delivered_before([RankProgress(config, {}, 1, 5), RankProgress(other, {}, 0, half - 4, (1, 3))], 3)
    assert epoch == 0
    assert done[0] == [(0, total - 4), (total - 3, total - 2), (total - 1, total)]
    assert done[1] == [(0, 5)]
    epoch, done = delivered_before([RankProgress(config, {}, 1, 5), RankProgress(other, {}, 1, 0)], 3)
    assert (epoch, done) == (1, {1: [(0, 5)]})
    assert delivered_before([RankProgress(config, {}, 3, 0), RankProgress(other, {}, 3, 0)], 3) == (3, {})


# -- readers: the rows themselves ----------------------------------------------------------------------
def read_with_epochs(reader: Reader, count: int | None = None) -> list[tuple[int, int]]:
    """(epoch, id) of the next ``count`` rows (all: None)."""
    out: list[tuple[int, int]] = []
    sizes: dict[int, int] = {}
    while count is None or len(out) < count:
        epoch, task, _ = reader._where()
        while epoch < (reader.num_epochs or epoch + 1) and \
                task >= sizes.setdefault(epoch, len(reader.plan_of(epoch))):
            epoch, task = epoch + 1, 0
        try:
            row = next(reader)
        except StopIteration:
            break
        out.append((epoch, int(row.id)))
    return out


def fresh_epoch(dataset: Path, epoch: int, shard: int, count: int, **options: Any) -> list[int]:
    with make_reader(dataset, cur_shard=shard, shard_count=count, **{**OPTIONS, **options}) as reader:
        return [i for e, i in read_with_epochs(reader) if e == epoch]


def check_resumed_epochs(dataset: Path, before: list[list[tuple[int, int]]], after: list[list[tuple[int, int]]],
                         new_remainder: str, start: int, **options: Any) -> None:
    """``after`` (each new rank's rows from epoch ``start`` on) continues ``before`` (every old rank's) as an
    elastic resume must."""
    count = len(after)
    old = Counter((e, i) for rows in before for e, i in rows)
    for epoch in range(start, OPTIONS["num_epochs"]):
        gone = {i for e, i in old if e == epoch}
        new = [[i for e, i in rows if e == epoch] for rows in after]
        if not gone:  # nothing of it was delivered: planned afresh for the new shard count
            for k, rows in enumerate(new):
                assert rows == fresh_epoch(dataset, epoch, k, count, shard_remainder=new_remainder, **options)
            continue
        check_rest_of_epoch(gone, new, N, new_remainder, f"epoch {epoch}: ")


Rows = list[list[tuple[int, int]]]


def run_ranks(dataset: Path, count: int, stops: list[int | None], resume_from: Any, remainder: str,
              **options: Any) -> tuple[Rows, list[dict[str, Any]], int]:
    """Each rank's (epoch, id) rows up to its stop, its state there, and the epoch the ranks started in."""
    rows, states, starts = [], [], set()
    for k in range(count):
        with make_reader(dataset, cur_shard=k, shard_count=count, shard_remainder=remainder,
                         resume_from=resume_from, **{**OPTIONS, **options}) as reader:
            starts.add(reader._where()[0])
            rows.append(read_with_epochs(reader, stops[k]))
            states.append(json.loads(json.dumps(reader.state_dict())))
    assert len(starts) == 1
    return rows, states, starts.pop()


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(old=st.integers(1, 16), new=st.integers(1, 16), data=st.data(),
       old_remainder=st.sampled_from(["pad", "drop"]), new_remainder=st.sampled_from(["pad", "drop"]),
       shard_by=st.sampled_from(["row", "row_group"]))
def test_any_world_size_resumes_on_any_other(dataset, old, new, data, old_remainder, new_remainder, shard_by):
    stops = data.draw(st.lists(st.integers(0, 2 * N // old + 2), min_size=old, max_size=old))
    before, states, _ = run_ranks(dataset, old, stops, None, old_remainder, shard_by=shard_by)
    after, _, start = run_ranks(dataset, new, [None] * new, states, new_remainder, shard_by=shard_by)
    check_resumed_epochs(dataset, before, after, new_remainder, start, shard_by=shard_by)


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(sizes=st.lists(st.integers(1, 9), min_size=3, max_size=3), data=st.data())
def test_a_resumed_run_resumes_again_on_a_third_world_size(dataset, sizes, data):
    first, second, third = sizes
    stops = data.draw(st.lists(st.integers(0, N // first), min_size=first, max_size=first))
    rows_a, states_a, _ = run_ranks(dataset, first, stops, None, "drop", shard_by="row")
    stops = data.draw(st.lists(st.integers(0, N // second), min_size=second, max_size=second))
    rows_b, states_b, _ = run_ranks(dataset, second, stops, states_a, "drop", shard_by="row")
    rows_c, _, start = run_ranks(dataset, third, [None] * third, states_b, "drop", shard_by="row")
    check_resumed_epochs(dataset, rows_a + rows_b, rows_c, "drop", start, shard_by="row")


def test_batch_readers_resume_elastically(dataset):
    states, seen = [], []
    for k in range(3):
        with make_batch_reader(dataset, cur_shard=k, shard_count=3, shard_by="row",
                               **{**OPTIONS, "num_epochs": 1}) as reader:
            for batch in itertools.islice(reader, k + 1):
                seen.extend(batch.id.tolist())
            states.append(reader.state_dict())
    assert len(seen) == len(set(seen)) > 0
    rest = []
    for k in range(2):
        with make_batch_reader(dataset, cur_shard=k, shard_count=2, shard_by="row", resume_from=states,
                               **{**OPTIONS, "num_epochs": 1}) as reader:
            rest.append([i for batch in reader for i in batch.id.tolist()])
    assert len(rest[0]) == len(rest[1])
    flat = rest[0] + rest[1]
    assert set(flat) == set(range(N)) - set(seen) and len(flat) - len(set(flat)) <= 1  # pad: one row twice at most


def test_a_state_keeps_what_was_done_so_it_resumes_one_by_one_too(dataset):
    _, states, _ = run_ranks(dataset, 3, [10, 20, 30], None, "pad", shard_by="row")
    with make_reader(dataset, cur_shard=1, shard_count=2, shard_by="row", resume_from=states, **OPTIONS) as reader:
        head = [int(r.id) for r in itertools.islice(reader, 17)]
        state = reader.state_dict()
        tail = [int(r.id) for r in reader]
    assert "done" in state and len(json.dumps(state)) < 1000
    with make_reader(dataset, cur_shard=1, shard_count=2, shard_by="row", resume_from=state, **OPTIONS) as reader:
        assert [int(r.id) for r in reader] == tail
    assert len(head) == 17


def test_states_of_another_run_are_refused_by_name(dataset, tmp_path):
    _, states, _ = run_ranks(dataset, 2, [5, 5], None, "pad", shard_by="row")
    options = dict(OPTIONS, shard_by="row", cur_shard=0, shard_count=3)
    with pytest.raises(ReaderStateError, match="different seeds"):
        make_reader(dataset, resume_from=[states[0], dict(states[1], seed=8)], **options)
    with pytest.raises(ReaderStateError, match="another dataset or other reader options"):
        make_reader(dataset, resume_from=states, **dict(options, shuffle_rows=False))
    with pytest.raises(ReaderStateError, match="lacks"):
        make_reader(dataset, resume_from=[{k: v for k, v in s.items() if k != "order"} for s in states], **options)
    with pytest.raises(ReaderStateError, match="every rank of the run, one each"):  # rank 1's rows again
        make_reader(dataset, resume_from=[states[0]], **options)
    with pytest.raises(ReaderStateError, match="every rank of the run, one each"):
        make_reader(dataset, resume_from=[states[0], states[0], states[1]], **options)
    with pytest.raises(ReaderStateError, match="holds no state"):
        make_reader(dataset, resume_from=[], **options)
    with pytest.raises(ReaderStateError, match="position"):
        make_reader(dataset, resume_from=[dict(states[0], task=10_000), states[1]], **options)
    with pytest.raises(ReaderStateError, match="done"):
        make_reader(dataset, resume_from=[dict(states[0], done=[0, 5]), states[1]], **options)
    for tampered in ({"skip": -1}, {"exclude": [-1]}, {"done_from": "x"}, {"done_from": -1}):  # once unchecked
        with pytest.raises(ReaderStateError, match="not (an int|ints) >= 0"):
            make_reader(dataset, resume_from=[dict(states[0], **tampered), states[1]], **options)
    with pytest.raises(InvalidArgumentError, match="rows of an epoch known"):
        make_reader(dataset, resume_from=states, predicate=None, filters=[("id", ">", 3)], **options)


def test_a_state_saved_before_the_dataset_grew_names_its_version_and_resumes_on_it(tmp_path):
    """An append (a delete, a compaction) changes the latest version's row groups: the state of a run on the
    version before is refused by name, saying which version to pin, and resumes exactly there."""
    from unihub.store.compaction import compact_dataset

    url = tmp_path / "ds"
    write_dataset(url, SCHEMA, ({"id": i, "pad": np.zeros(64, np.uint8)} for i in range(40)), row_group_size_mb=0.0008)
    write_dataset(url, SCHEMA, ({"id": i, "pad": np.zeros(64, np.uint8)} for i in range(40, 60)), mode="append")
    options = dict(OPTIONS, num_epochs=1)
    with make_reader(url, **options) as reader:
        whole = [int(row.id) for row in reader]
    with make_reader(url, **options) as reader:
        first = [int(next(reader).id) for _ in range(17)]
        state = reader.state_dict()
    assert state["dataset_version"] == 2
    write_dataset(url, SCHEMA, ({"id": i, "pad": np.zeros(64, np.uint8)} for i in range(60, 70)), mode="append")
    compact_dataset(url, target_mb=1)
    hint = r"saved reading version 2 of the dataset, and this reader reads version 4: make_reader\(url, version=2"
    with pytest.raises(ReaderStateError, match=hint):
        make_reader(url, resume_from=state, **options)
    with pytest.raises(ReaderStateError, match=hint):
        make_reader(url, resume_from=[state], **dict(options, shard_count=1, cur_shard=0))
    with make_reader(url, version=2, resume_from=state, **options) as reader:
        assert first + [int(row.id) for row in reader] == whole


def test_a_rank_at_the_end_of_its_share_counts_as_in_the_next_epoch(dataset):
    """Whether a rank's next() has found the end of its share or not, the run resumes alike: ``drop`` left
    rows out of the epoch, and the resumed run goes on with the next one, as the run itself would have."""
    options = dict(OPTIONS, shard_by="row", shard_remainder="drop")
    states = {}
    for found_end in (False, True):
        states[found_end] = []
        for k in range(3):
            with make_reader(dataset, cur_shard=k, shard_count=3, **options) as reader:
                rows = read_with_epochs(reader, N // 3 + (1 if found_end else 0))
                assert {e for e, _ in rows} == ({0, 1} if found_end else {0})
                if found_end:  # one row into epoch 1: back to the end of epoch 0 by the reader's own state
                    reader.load_state_dict(dict(reader.state_dict(), epoch=1, task=0, offset=0))
                states[found_end].append(reader.state_dict())
    starts = []
    for found_end in (False, True):
        with make_reader(dataset, cur_shard=0, shard_count=2, resume_from=states[found_end], **options) as reader:
            starts.append(reader._where()[:2])
    assert starts == [(1, 0), (1, 0)]
