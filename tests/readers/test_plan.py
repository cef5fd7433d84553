"""Planning is pure: permutations, determinism, disjoint covering shards, equal row shards.

No I/O here: a plan is a function of row-group sizes, seed, epoch and shard, and every
property is checked on the global row ids the tasks deliver.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from unihub.errors import NoDataAvailableError
from unihub.readers.plan import PlanConfig, PlanError, ReadTask, epoch_plan, merged_tasks, rows_per_epoch, task_rows

SIZES = (7, 3, 10, 1, 0, 8, 5, 9, 4, 6, 2, 11)  # uneven, with an empty row group
TOTAL = sum(SIZES)


def delivered(config: PlanConfig, epoch: int) -> np.ndarray:
    """Global row ids the plan delivers, in delivery order."""
    offsets = np.concatenate([[0], np.cumsum(config.row_group_sizes)])
    out = []
    for task in epoch_plan(config, epoch):
        n = config.row_group_sizes[task.row_group]
        rows = task_rows(task, config.seed, epoch, n)
        local = np.arange(n) if rows is None else rows
        assert len(local) == task.num_rows
        out.append(offsets[task.row_group] + local)
    return np.concatenate(out) if out else np.empty(0, np.int64)


SHUFFLES = [
    dict(),
    dict(shuffle_row_groups=True),
    dict(shuffle_rows=True),
    dict(shuffle_row_groups=True, shuffle_rows=True),
    dict(shuffle_row_groups=True, shuffle_rows=True, shuffle_row_drop_partitions=3),
]


@pytest.mark.parametrize("options", SHUFFLES)
@pytest.mark.parametrize("epoch", [0, 1, 5])
def test_each_epoch_is_a_permutation_of_all_rows(options, epoch):
    config = PlanConfig(SIZES, seed=3, **options)
    rows = delivered(config, epoch)
    assert len(rows) == TOTAL
    assert sorted(rows.tolist()) == list(range(TOTAL))
    assert rows_per_epoch(config) == TOTAL


def test_no_shuffle_is_natural_order():
    rows = delivered(PlanConfig(SIZES), 0)
    assert rows.tolist() == list(range(TOTAL))


def test_no_empty_tasks():
    for options in SHUFFLES:
        assert all(t.num_rows > 0 for t in epoch_plan(PlanConfig(SIZES, **options), 0))


@pytest.mark.parametrize("options", SHUFFLES[1:])
def test_plans_are_deterministic_and_vary_with_epoch_and_seed(options):
    config = PlanConfig(SIZES, seed=11, **options)
    a = delivered(config, 2)
    assert np.array_equal(a, delivered(PlanConfig(SIZES, seed=11, **options), 2))
    assert epoch_plan(config, 2) == epoch_plan(config, 2)
    assert not np.array_equal(a, delivered(config, 3)), "epochs must be shuffled differently"
    assert not np.array_equal(a, delivered(PlanConfig(SIZES, seed=12, **options), 2)), "seeds must differ"
    assert not np.array_equal(a, np.arange(TOTAL))


def test_shuffle_row_groups_keeps_rows_of_a_group_together():
    config = PlanConfig(SIZES, seed=5, shuffle_row_groups=True)
    tasks = epoch_plan(config, 0)
    assert sorted(t.row_group for t in tasks) == [g for g, n in enumerate(SIZES) if n]
    assert all(t.start == 0 and t.stop == SIZES[t.row_group] for t in tasks)
    assert [t.row_group for t in tasks] != sorted(t.row_group for t in tasks)


def test_shuffle_rows_permutes_inside_each_row_group():
    config = PlanConfig(SIZES, seed=5, shuffle_rows=True)
    offsets = np.concatenate([[0], np.cumsum(SIZES)])
    rows = delivered(config, 0)
    # row groups stay in order, each one's rows permuted
    pos = 0
    changed = False
    for g, n in enumerate(SIZES):
        chunk = rows[pos:pos + n]
        assert sorted(chunk.tolist()) == list(range(offsets[g], offsets[g] + n))
        changed |= chunk.tolist() != sorted(chunk.tolist())
        pos += n
    assert changed


@pytest.mark.parametrize("options", SHUFFLES)
@pytest.mark.parametrize("shard_count", [1, 2, 3, 5, 11])
def test_row_group_shards_are_disjoint_and_cover_every_row(options, shard_count):
    seen: list[int] = []
    for shard in range(shard_count):
        config = PlanConfig(SIZES, seed=2, cur_shard=shard, shard_count=shard_count, **options)
        rows = delivered(config, 1)
        groups = {t.row_group for t in epoch_plan(config, 1)}
        assert groups <= set(range(shard, len(SIZES), shard_count)), "Petastorm's row-group assignment"
        seen += rows.tolist()
    assert sorted(seen) == list(range(TOTAL))


@pytest.mark.parametrize("remainder", ["pad", "drop"])
@pytest.mark.parametrize("shard_count", [2, 3, 4, 7, 13, 80])
@pytest.mark.parametrize("options", [dict(), dict(shuffle_row_groups=True, shuffle_rows=True)])
def test_row_shards_are_equal_and_contiguous(remainder, shard_count, options):
    expected = math.ceil(TOTAL / shard_count) if remainder == "pad" else TOTAL // shard_count
    whole = delivered(PlanConfig(SIZES, seed=9, **options), 4).tolist()
    union: list[int] = []
    for shard in range(shard_count):
        config = PlanConfig(SIZES, seed=9, cur_shard=shard, shard_count=shard_count, shard_by="row",
                            shard_remainder=remainder, **options)
        rows = delivered(config, 4).tolist()
        assert len(rows) == expected, f"shard {shard}"
        assert rows_per_epoch(config) == expected
        # block ``shard`` of the unsharded epoch order, wrapping around for padding
        block = [whole[(shard * expected + i) % TOTAL] for i in range(expected)]
        assert rows == block
        union += rows
    if remainder == "pad":
        assert set(union) == set(range(TOTAL))
        assert len(union) - TOTAL < shard_count
    else:
        assert len(set(union)) == len(union), "'drop' shards never overlap"
        assert TOTAL - len(union) < shard_count


@pytest.mark.parametrize("shard_count", [len(SIZES) + 1, 40, TOTAL + 3])
def test_more_shards_than_row_groups_gives_equal_counts(shard_count):
    with pytest.raises(NoDataAvailableError, match=f"{shard_count} shards of {len(SIZES)} row groups"):
        PlanConfig(SIZES, seed=1, cur_shard=0, shard_count=shard_count)  # row-group shards: some would be empty
    counts, union = [], set()
    for shard in range(shard_count):
        config = PlanConfig(SIZES, seed=1, cur_shard=shard, shard_count=shard_count, shuffle_row_groups=True,
                            shard_by="row")
        rows = delivered(config, 0)
        counts.append(len(rows))
        union |= set(rows.tolist())
    assert len(set(counts)) == 1 and counts[0] >= 1, counts
    assert union == set(range(TOTAL))


def test_single_shard_is_the_whole_epoch():
    config = PlanConfig(SIZES, seed=4, shuffle_rows=True, cur_shard=0, shard_count=1)
    assert np.array_equal(delivered(config, 0), delivered(PlanConfig(SIZES, seed=4, shuffle_rows=True), 0))


@pytest.mark.parametrize("k", [2, 3, 4, 20])
@pytest.mark.parametrize("shuffle_rows", [False, True])
def test_drop_partitions_split_each_row_group_into_k_tasks(k, shuffle_rows):
    config = PlanConfig(SIZES, seed=8, shuffle_row_drop_partitions=k, shuffle_rows=shuffle_rows)
    tasks = epoch_plan(config, 0)
    for g, n in enumerate(SIZES):
        mine = sorted((t for t in tasks if t.row_group == g), key=lambda t: t.start)
        assert len(mine) == min(k, n), f"row group {g} of {n} rows"
        covered: list[int] = []
        for t in mine:
            rows = task_rows(t, 8, 0, n)
            covered += (np.arange(n) if rows is None else rows).tolist()
        assert sorted(covered) == list(range(n))
        sizes = [t.num_rows for t in mine]
        assert not sizes or max(sizes) - min(sizes) <= 1
    assert sorted(delivered(config, 0).tolist()) == list(range(TOTAL))


def test_task_rows_none_means_whole_row_group():
    assert task_rows(ReadTask(0, 0, 5), seed=0, epoch=0, num_rows=5) is None
    assert task_rows(ReadTask(0, 1, 4), seed=0, epoch=0, num_rows=5).tolist() == [1, 2, 3]
    shuffled = task_rows(ReadTask(0, 0, 5, shuffle_rows=True), seed=0, epoch=0, num_rows=5)
    assert sorted(shuffled.tolist()) == [0, 1, 2, 3, 4]


def test_empty_plan():
    assert epoch_plan(PlanConfig(()), 0) == []
    assert epoch_plan(PlanConfig((0, 0)), 0) == []
    assert epoch_plan(PlanConfig((0, 0), cur_shard=1, shard_count=3, shard_by="row"), 0) == []


@pytest.mark.parametrize("options, words", [
    (dict(cur_shard=3, shard_count=3), ["cur_shard", "[0, 3)", "3"]),
    (dict(cur_shard=5, shard_count=2), ["cur_shard", "5"]),
    (dict(cur_shard=-1, shard_count=2), ["cur_shard", "-1"]),
    (dict(cur_shard=0), ["cur_shard", "shard_count", "both"]),
    (dict(shard_count=2), ["cur_shard", "shard_count", "both"]),
    (dict(cur_shard=0, shard_count=0), ["shard_count", "0"]),
    (dict(cur_shard=0, shard_count=-2), ["shard_count", "-2"]),
    (dict(shuffle_row_drop_partitions=0), ["shuffle_row_drop_partitions", "0"]),
    (dict(shuffle_row_drop_partitions=-1), ["shuffle_row_drop_partitions", "-1"]),
    (dict(shard_by="file"), ["shard_by", "file"]),
    (dict(shard_remainder="wrap"), ["shard_remainder", "wrap"]),
    (dict(task_rows=0), ["task_rows", "0"]),
    (dict(task_rows=5, first_task_rows=0), ["first_task_rows", "0"]),
    (dict(first_task_rows=2), ["first_task_rows", "task_rows"]),
])
def test_bad_options_raise_plan_error(options, words):
    with pytest.raises(PlanError) as info:
        PlanConfig(SIZES, **options)
    for word in words:
        assert word in str(info.value)
    assert isinstance(info.value, ValueError)


def test_negative_row_group_size():
    with pytest.raises(PlanError, match="negative"):
        PlanConfig((3, -1))


@pytest.mark.parametrize("most", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("options", SHUFFLES + [dict(shuffle_row_groups=True, cur_shard=1, shard_count=3, shard_by="row"),
                                                dict(shuffle_rows=True, cur_shard=2, shard_count=3)])
def test_task_rows_cuts_long_tasks_without_changing_the_rows_or_their_order(options, most):
    whole = PlanConfig(SIZES, seed=3, **options)
    cut = PlanConfig(SIZES, seed=3, task_rows=most, **options)
    for epoch in (0, 2):
        np.testing.assert_array_equal(delivered(cut, epoch), delivered(whole, epoch))
        tasks = epoch_plan(cut, epoch)
        assert all(0 < t.num_rows <= most for t in tasks)
        longest = max(t.num_rows for t in epoch_plan(whole, epoch))
        assert len(tasks) >= sum(math.ceil(t.num_rows / most) for t in epoch_plan(whole, epoch))
        if longest > most:  # pieces of one task are near-equal: no tiny tail
            pieces = [t.num_rows for t in tasks]
            assert min(pieces) >= min(most // 2, min(t.num_rows for t in epoch_plan(whole, epoch)))
    assert rows_per_epoch(cut) == rows_per_epoch(whole)


@pytest.mark.parametrize("first", [1, 2, 3])
@pytest.mark.parametrize("options", SHUFFLES + [dict(shuffle_row_groups=True, cur_shard=1, shard_count=3, shard_by="row")])
def test_the_first_task_ramps_up_without_changing_the_rows_or_their_order(options, first):
    """The epoch's first task comes as pieces of first, 2 x first, ... rows: the first rows are decoded
    after a few images rather than a whole task; every other task is as task_rows cut it."""
    cut = PlanConfig(SIZES, seed=3, task_rows=7, **options)
    ramped = PlanConfig(SIZES, seed=3, task_rows=7, first_task_rows=first, **options)
    for epoch in (0, 1):
        np.testing.assert_array_equal(delivered(ramped, epoch), delivered(cut, epoch))
        plain, tasks = epoch_plan(cut, epoch), epoch_plan(ramped, epoch)
        head = [t for t in tasks if t.row_group == plain[0].row_group and t.stop <= plain[0].stop
                and t.start >= plain[0].start]
        assert tasks[len(head):] == plain[1:]
        sizes = [t.num_rows for t in head]
        assert sum(sizes) == plain[0].num_rows
        growing = sizes[:-1]  # then what is left of the task
        assert growing == [first * 2 ** k for k in range(len(growing))] and all(n < 7 for n in growing)
        if plain[0].num_rows > first:
            assert sizes[0] == first
    assert rows_per_epoch(ramped) == rows_per_epoch(cut)


def _rows_of(tasks: list[ReadTask], config: PlanConfig, epoch: int) -> list[np.ndarray]:
    out = []
    for task in tasks:
        n = config.row_group_sizes[task.row_group]
        rows = task_rows(task, config.seed, epoch, n)
        out.append(np.arange(n) if rows is None else rows)
    return out


@pytest.mark.parametrize("options", SHUFFLES + [dict(shuffle_row_groups=True, cur_shard=1, shard_count=3, shard_by="row"),
                                                dict(shuffle_rows=True, cur_shard=2, shard_count=3)])
def test_merged_tasks_read_each_run_of_pieces_as_one_task_with_the_same_rows(options):
    """A reader whose tasks are cheap reads a row group's consecutive pieces as one task: the same rows
    in the same order, and ``pieces`` saying which tasks of the plan it stands for (its position)."""
    config = PlanConfig(SIZES, seed=3, task_rows=3, first_task_rows=1, **options)
    for epoch in (0, 1):
        plan = epoch_plan(config, epoch)
        for start in (0, 1, 2, len(plan) // 2):  # from a resumed position too: mid-way through a row group
            merged = list(merged_tasks(plan, start))
            indices = [index for index, _ in merged]
            assert indices[0] == start and all(
                b == a + task.plan_tasks for (a, task), b in zip(merged, indices[1:] + [len(plan)]))
            for index, task in merged:
                parts = plan[index:index + task.plan_tasks]
                assert task.num_rows == sum(p.num_rows for p in parts)
                assert task.pieces == (tuple(p.num_rows for p in parts) if len(parts) > 1 else ())
                assert {p.row_group for p in parts} == {task.row_group}
                np.testing.assert_array_equal(np.concatenate(_rows_of([task], config, epoch)),
                                              np.concatenate(_rows_of(parts, config, epoch)))
            for (_, a), (_, b) in zip(merged, merged[1:]):  # nothing left to join
                assert not (a.row_group == b.row_group and a.stop == b.start)
        assert len(list(merged_tasks(plan, 0))) < len(plan)  # pieces were joined
    assert list(merged_tasks([], 0)) == []
