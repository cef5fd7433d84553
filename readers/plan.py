"""Planning a read: which rows of which row groups, in which order, for one shard and epoch.

Pure functions of ``(row-group sizes, seed, epoch, shard)``: no I/O, no framework imports,
no time- or pid-based seeds, so the order never depends on worker count or pool type,
and a reader's position is a small state that resumes exactly.

A plan is a list of :class:`ReadTask`; a task names a row group and a slice of that
row group's *delivery order* (``arange(n)``, or a permutation seeded by
``(seed, epoch, row_group)`` when ``shuffle_rows``). Sharding:

- ``shard_by="row_group"`` (Petastorm's way): shard ``k`` of ``S`` owns row groups
  ``k, k+S, k+2S, ...``; counts per shard may differ by a row group.
- ``shard_by="row"``: all rows of the epoch in one sequence (row groups in plan order,
  rows in delivery order), cut into ``S`` equal contiguous blocks so each rank reads few
  row groups. ``shard_remainder="pad"`` wraps around so every rank gets ``ceil(N/S)``
  rows; ``"drop"`` gives every rank ``floor(N/S)``.

Elastic resume: every rank's share of an epoch is a part of one *global order*, the plan of
an unsharded reader (:func:`global_plan`), whatever the shard count or ``shard_by``. What
ranks delivered is a set of intervals of that order (:class:`GlobalOrder`); the rest of the
epoch, cut into equal contiguous runs for a new shard count, is :func:`rank_plan` with ``done``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.random  # noqa: F401  (loaded on first use otherwise: ~5 ms of each first batch, and each worker's)

from unihub.errors import InvalidArgumentError, NoDataAvailableError

ShardBy = Literal["row_group", "row"]
ShardRemainder = Literal["pad", "drop"]


class PlanError(InvalidArgumentError):
    """Options that cannot make a plan (a bad shard, a negative size, ...)."""


@dataclass(frozen=True)
class ReadTask:
    """Read rows ``order[start:stop]`` of ``row_group``, where ``order`` is its delivery order."""

    row_group: int
    start: int
    stop: int
    shuffle_rows: bool = False
    #: a task that stands for consecutive tasks of the plan (:func:`merged_tasks`): their rows, in
    #: order (empty: it is one task of the plan)
    pieces: tuple[int, ...] = ()

    @property
    def num_rows(self) -> int:
        return self.stop - self.start

    @property
    def plan_tasks(self) -> int:
        """How many tasks of the plan this task is."""
        return max(1, len(self.pieces))


@dataclass(frozen=True)
class PlanConfig:
    """Everything a plan depends on besides the epoch."""

    row_group_sizes: tuple[int, ...]
    seed: int = 0
    shuffle_row_groups: bool = False
    shuffle_rows: bool = False
    shuffle_row_drop_partitions: int = 1
    cur_shard: int | None = None
    shard_count: int | None = None
    shard_by: ShardBy = "row_group"
    shard_remainder: ShardRemainder = "pad"
    #: cut tasks longer than this into consecutive pieces (None: a task per row group): the
    #: rows and their order stay the same, but decoding a big row group spreads over the workers
    task_rows: int | None = None
    #: with ``task_rows``: the epoch's first task is cut into pieces of this many rows, then twice
    #: as many, and so on below ``task_rows``, so that the first rows are decoded after a few
    #: images rather than a whole task's (the rows and their order stay the same)
    first_task_rows: int | None = None
    #: the row groups of the whole dataset where a predicate, filters or a selector chose fewer (None: the
    #: same as ``row_group_sizes``): Petastorm's rule holds shards to the dataset's row groups, so a shard the
    #: choice leaves without one is empty, not an error
    dataset_row_groups: int | None = None

    def __post_init__(self) -> None:
        if any(n < 0 for n in self.row_group_sizes):
            raise PlanError("row-group sizes cannot be negative")
        if (self.cur_shard is None) != (self.shard_count is None):
            raise PlanError("cur_shard and shard_count go together: pass both or neither")
        if self.shard_count is not None:
            if self.shard_count < 1:
                raise PlanError(f"shard_count must be >= 1, got {self.shard_count}")
            if not 0 <= self.cur_shard < self.shard_count:  # type: ignore[operator]
                raise PlanError(f"cur_shard must be in [0, shard_count) = [0, {self.shard_count}), "
                                f"got {self.cur_shard}")
        if self.shuffle_row_drop_partitions < 1:
            raise PlanError(f"shuffle_row_drop_partitions must be >= 1, got {self.shuffle_row_drop_partitions}")
        if self.shard_by not in ("row_group", "row"):
            raise PlanError(f"shard_by must be 'row_group' or 'row', got {self.shard_by!r}")
        if self.shard_remainder not in ("pad", "drop"):
            raise PlanError(f"shard_remainder must be 'pad' or 'drop', got {self.shard_remainder!r}")
        if self.task_rows is not None and self.task_rows < 1:
            raise PlanError(f"task_rows must be >= 1 or None, got {self.task_rows}")
        if self.first_task_rows is not None and (self.first_task_rows < 1 or self.task_rows is None):
            raise PlanError(f"first_task_rows must be >= 1 and come with task_rows, got {self.first_task_rows}")
        row_groups = len(self.row_group_sizes) if self.dataset_row_groups is None else self.dataset_row_groups
        if self.shard_by == "row_group" and self.shard_count is not None and self.shard_count > row_groups:
            raise NoDataAvailableError(
                "Number of row-groups in the dataset must be greater or equal to the number of requested shards. "
                f"Otherwise, some of the shards will end up being empty: {self.shard_count} shards of "
                f"{row_groups} row groups, some shards would be empty "
                "(shards own whole row groups); use fewer shards, write smaller row groups, or shard_by='row'")


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch])


def row_order(seed: int, epoch: int, row_group: int, num_rows: int, shuffle: bool) -> np.ndarray:
    """The delivery order of a row group's rows: a seeded permutation, or ``arange``."""
    if not shuffle:
        return np.arange(num_rows)
    return np.random.default_rng([seed, epoch, row_group]).permutation(num_rows)


def task_rows(task: ReadTask, seed: int, epoch: int, num_rows: int) -> np.ndarray | None:
    """Row indices a task delivers, in order; None means the whole row group in natural order."""
    if not task.shuffle_rows and task.start == 0 and task.stop == num_rows:
        return None
    return row_order(seed, epoch, task.row_group, num_rows, task.shuffle_rows)[task.start:task.stop]


def epoch_plan(config: PlanConfig, epoch: int) -> list[ReadTask]:
    """The tasks of one epoch for the configured shard, in delivery order."""
    sizes = config.row_group_sizes
    rng = epoch_rng(config.seed, epoch)
    sharded = config.shard_count is not None and config.shard_count > 1
    if sharded and config.shard_by == "row_group":
        groups = np.arange(config.cur_shard, len(sizes), config.shard_count)  # type: ignore[arg-type]
    else:
        groups = np.arange(len(sizes))
    tasks = _split_for_drop_partitions(groups, sizes, config)
    if config.shuffle_row_groups and len(tasks) > 1:
        tasks = [tasks[i] for i in rng.permutation(len(tasks))]
    tasks = [t for t in tasks if t.num_rows > 0]
    if sharded and config.shard_by == "row":
        tasks = _row_shard(tasks, config.cur_shard, config.shard_count, config.shard_remainder)  # type: ignore[arg-type]
    return _cut_for_decoding(tasks, config)


def _cut_for_decoding(tasks: list[ReadTask], config: PlanConfig) -> list[ReadTask]:
    """``tasks`` cut as ``task_rows`` and ``first_task_rows`` say (the rows and their order unchanged)."""
    if config.task_rows is not None:
        tasks = _cut_long_tasks(tasks, config.task_rows)
        if config.first_task_rows is not None and tasks:
            tasks = _ramp(tasks[0], config.first_task_rows, config.task_rows) + tasks[1:]
    return tasks


def merged_tasks(tasks: list[ReadTask], start: int) -> Iterator[tuple[int, ReadTask]]:
    """``(index, task)`` from ``tasks[start]`` on, each run of consecutive pieces of one row group's
    delivery order (as :func:`_cut_long_tasks` cuts them) joined into one task that reads the same
    rows in the same order, with ``pieces`` saying which tasks of the plan it stands for: for a
    reader whose tasks are cheap (images decoded later), where cutting only costs."""
    index = start
    while index < len(tasks):
        first = end = tasks[index]
        count = 1
        while index + count < len(tasks) and _continues(end, tasks[index + count]):
            end = tasks[index + count]
            count += 1
        if count == 1:
            yield index, first
        else:
            yield index, ReadTask(first.row_group, first.start, end.stop, first.shuffle_rows,
                                  tuple(t.num_rows for t in tasks[index:index + count]))
        index += count


def _continues(task: ReadTask, following: ReadTask) -> bool:
    return (following.row_group == task.row_group and following.start == task.stop
            and following.shuffle_rows == task.shuffle_rows)


def _ramp(task: ReadTask, first: int, most: int) -> list[ReadTask]:
    """``task`` as pieces of ``first``, ``2 * first``, ... rows (each below ``most``) and the rest."""
    out: list[ReadTask] = []
    start, size = task.start, first
    while size < most and task.stop - start > size:
        out.append(ReadTask(task.row_group, start, start + size, task.shuffle_rows))
        start, size = start + size, 2 * size
    return out + [ReadTask(task.row_group, start, task.stop, task.shuffle_rows)]


def _cut_long_tasks(tasks: list[ReadTask], most: int) -> list[ReadTask]:
    """Each task of more than ``most`` rows as consecutive near-equal pieces of at most ``most``:
    the epoch's rows and their order are unchanged (a task is a slice of a delivery order)."""
    out: list[ReadTask] = []
    for task in tasks:
        if task.num_rows <= most:
            out.append(task)
            continue
        pieces = math.ceil(task.num_rows / most)
        bounds = [task.start + (task.num_rows * k) // pieces for k in range(pieces + 1)]
        out.extend(ReadTask(task.row_group, a, b, task.shuffle_rows) for a, b in zip(bounds[:-1], bounds[1:]))
    return out


def _split_for_drop_partitions(groups: np.ndarray, sizes: tuple[int, ...], config: PlanConfig) -> list[ReadTask]:
    """One task per row group, or ``k`` tasks each taking a ``1/k`` slice of its delivery order."""
    parts = config.shuffle_row_drop_partitions
    tasks = []
    for g in groups:
        n = sizes[g]
        bounds = np.linspace(0, n, parts + 1).astype(np.int64) if parts > 1 else (0, n)
        for a, b in zip(bounds[:-1], bounds[1:]):
            tasks.append(ReadTask(int(g), int(a), int(b), config.shuffle_rows))
    return tasks


def _row_shard(tasks: list[ReadTask], shard: int, count: int, remainder: ShardRemainder) -> list[ReadTask]:
    """Cut the epoch's row sequence into ``count`` equal contiguous blocks; keep block ``shard``."""
    total = sum(t.num_rows for t in tasks)
    if total == 0:
        return []
    per_shard = math.ceil(total / count) if remainder == "pad" else total // count
    start = shard * per_shard
    return _take_cyclic(tasks, start % total, per_shard, total)


def _take_cyclic(tasks: list[ReadTask], start: int, count: int, total: int) -> list[ReadTask]:
    """Tasks covering positions ``[start, start + count)`` of the sequence, wrapping around."""
    out: list[ReadTask] = []
    ends = np.cumsum([t.num_rows for t in tasks])
    pos, left = start, count
    while left > 0:
        i = int(np.searchsorted(ends, pos, side="right"))
        task = tasks[i]
        begin = int(ends[i]) - task.num_rows
        a = task.start + (pos - begin)
        b = min(task.stop, a + left)
        out.append(ReadTask(task.row_group, a, b, task.shuffle_rows))
        left -= b - a
        pos = (pos + (b - a)) % total
    return out


def rows_per_epoch(config: PlanConfig) -> int:
    """Rows one epoch delivers for the configured shard (before predicates)."""
    return sum(t.num_rows for t in epoch_plan(config, 0))


# -- elastic resume: the global order, and what is left of an epoch ----------------------------------------
#: disjoint ``[start, stop)`` intervals of an epoch's global order, sorted
Intervals = list[tuple[int, int]]


def global_plan(config: PlanConfig, epoch: int) -> list[ReadTask]:
    """The epoch's tasks in the order every rank's share is a part of: the plan of an unsharded reader,
    uncut. Each task of any rank's plan is a slice of one of these tasks."""
    return epoch_plan(dataclasses.replace(config, cur_shard=None, shard_count=None, task_rows=None,
                                          first_task_rows=None), epoch)


class GlobalOrder:
    """Where the rows of an epoch's tasks sit in its global order (:func:`global_plan`)."""

    def __init__(self, config: PlanConfig, epoch: int) -> None:
        self.tasks = global_plan(config, epoch)
        sizes = np.array([t.num_rows for t in self.tasks], dtype=np.int64)
        self.ends = np.cumsum(sizes)
        self.total = int(self.ends[-1]) if len(sizes) else 0
        by_group: dict[int, list[tuple[int, int, int]]] = {}
        for task, end in zip(self.tasks, self.ends.tolist()):
            by_group.setdefault(task.row_group, []).append((task.start, task.stop, end - task.num_rows))
        self._by_group = {g: sorted(spans) for g, spans in by_group.items()}

    def span(self, task: ReadTask) -> tuple[int, int]:
        """The interval of the global order that ``task`` (a slice of one global task) delivers."""
        for start, stop, position in self._by_group.get(task.row_group, ()):
            if start <= task.start and task.stop <= stop:
                first = position + task.start - start
                return first, first + task.num_rows
        raise PlanError(f"a task of row group {task.row_group} rows [{task.start}, {task.stop}) is in no task of the "
                        "epoch's global order")

    def positions(self, tasks: Sequence[ReadTask], rows: np.ndarray) -> np.ndarray:
        """Global positions of the rows at ``rows`` (indices into the rows ``tasks`` deliver, in order)."""
        if not len(rows):
            return np.empty(0, np.int64)
        sizes = np.array([t.num_rows for t in tasks], dtype=np.int64)
        ends = np.cumsum(sizes)
        which = np.searchsorted(ends, rows, side="right")
        firsts = np.array([self.span(t)[0] for t in tasks], dtype=np.int64)
        return firsts[which] + rows - (ends - sizes)[which]

    def prefix(self, tasks: Sequence[ReadTask], rows: int) -> Intervals:
        """The intervals of the first ``rows`` rows ``tasks`` deliver."""
        out: Intervals = []
        for task in tasks:
            if rows <= 0:
                break
            first, stop = self.span(task)
            out.append((first, min(stop, first + rows)))
            rows -= task.num_rows
        return merge_intervals(out)

    def tasks_of(self, start: int, stop: int) -> list[ReadTask]:
        """The positions ``[start, stop)`` of the global order as tasks (a slice of each global task met)."""
        out: list[ReadTask] = []
        i = int(np.searchsorted(self.ends, start, side="right"))
        while start < stop:
            task = self.tasks[i]
            begin = int(self.ends[i]) - task.num_rows
            a = task.start + start - begin
            b = min(task.stop, a + stop - start)
            out.append(ReadTask(task.row_group, a, b, task.shuffle_rows))
            start += b - a
            i += 1
        return out


def merge_intervals(intervals: Sequence[tuple[int, int]]) -> Intervals:
    """``intervals`` sorted, with overlapping and touching ones joined, empty ones dropped."""
    out: Intervals = []
    for a, b in sorted((int(a), int(b)) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def runs_of(positions: np.ndarray) -> Intervals:
    """Sorted unique ``positions`` as the intervals they fill (one per run of consecutive positions)."""
    if not positions.size:
        return []
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [positions.size]])
    return [(int(positions[a]), int(positions[b - 1]) + 1) for a, b in zip(starts, stops)]


def positions_in(intervals: Sequence[tuple[int, int]]) -> np.ndarray:
    """Every position of ``intervals``, in order: the inverse of :func:`runs_of`."""
    if not intervals:
        return np.empty(0, np.int64)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in intervals])


def complement(done: Intervals, total: int) -> Intervals:
    """The intervals of ``[0, total)`` outside ``done`` (merged)."""
    out: Intervals = []
    cursor = 0
    for a, b in done:
        if a > cursor:
            out.append((cursor, min(a, total)))
        cursor = max(cursor, b)
    if cursor < total:
        out.append((cursor, total))
    return [(a, b) for a, b in out if b > a]


def rank_plan(config: PlanConfig, epoch: int, done: Mapping[int, Intervals]) -> list[ReadTask]:
    """The configured shard's tasks of ``epoch``: :func:`epoch_plan`, or where ``done`` says what ranks
    delivered of that epoch before a resume, an equal contiguous run of the rest of its global order
    (``pad``: ``ceil(rest / shards)`` rows each, wrapping round the rest; ``drop``: ``floor``)."""
    if epoch not in done:
        return epoch_plan(config, epoch)
    order = GlobalOrder(config, epoch)
    rest = complement(done[epoch], order.total)
    left = sum(b - a for a, b in rest)
    count = config.shard_count or 1
    per_shard = (math.ceil(left / count) if config.shard_remainder == "pad" else left // count) if left else 0
    pieces = [ReadTask(-1, a, b) for a, b in rest]  # the rest as a sequence of intervals, cut as a row shard is
    run = _take_cyclic(pieces, ((config.cur_shard or 0) * per_shard) % left, per_shard, left) if per_shard else []
    return _cut_for_decoding([t for piece in run for t in order.tasks_of(piece.start, piece.stop)], config)


@dataclass(frozen=True)
class RankProgress:
    """What one rank had delivered when its state was saved: the first ``rows`` rows of ``epoch`` as its
    plan (``config``, ``done``) orders them, and the rows at ``extra`` offsets after those in its stream
    (rows a shuffling loader had delivered ahead of its reader's position)."""

    config: PlanConfig
    done: Mapping[int, Intervals]
    epoch: int
    rows: int
    extra: tuple[int, ...] = ()


def delivered_before(progress: Sequence[RankProgress], num_epochs: int | None) -> tuple[int, dict[int, Intervals]]:
    """What the ranks of ``progress`` delivered together, as the ``done`` of :func:`rank_plan` that gives the
    rest to any shard count: the first epoch they did not deliver whole, and the intervals of its global order
    (and of later epochs') that they did. Epochs nothing was delivered of are left out (planned afresh)."""
    first = min(p.epoch for p in progress)
    done: dict[int, Intervals] = {}

    def add(epoch: int, intervals: Intervals) -> None:
        done[epoch] = done.get(epoch, []) + intervals

    orders: dict[int, GlobalOrder] = {}

    def order_of(epoch: int) -> GlobalOrder:
        if epoch not in orders:
            orders[epoch] = GlobalOrder(progress[0].config, epoch)
        return orders[epoch]

    for p in progress:
        for epoch, intervals in p.done.items():  # what runs before it delivered
            if epoch >= first:
                add(epoch, list(intervals))
        for epoch in range(first, p.epoch):
            tasks = rank_plan(p.config, epoch, p.done)
            add(epoch, [order_of(epoch).span(t) for t in tasks])
        if num_epochs is not None and p.epoch >= num_epochs:
            continue
        tasks = rank_plan(p.config, p.epoch, p.done)
        add(p.epoch, order_of(p.epoch).prefix(tasks, p.rows))
        _add_extra(p, tasks, add, order_of, num_epochs)
    epoch = first
    while epoch in done and (num_epochs is None or epoch < num_epochs) and \
            merge_intervals(done[epoch]) == [(0, order_of(epoch).total)]:
        epoch += 1
    kept = {e: merge_intervals(iv) for e, iv in done.items() if e >= epoch}
    return epoch, {e: iv for e, iv in kept.items() if iv}


def _add_extra(p: RankProgress, tasks: list[ReadTask], add: Callable[[int, Intervals], None],
               order_of: Callable[[int], GlobalOrder], num_epochs: int | None) -> None:
    """The intervals of ``p.extra``'s rows, epoch by epoch of ``p``'s stream."""
    rows = np.array(sorted(set(p.extra)), dtype=np.int64) + p.rows
    epoch = p.epoch
    while rows.size and (num_epochs is None or epoch < num_epochs):
        size = sum(t.num_rows for t in tasks)
        here = rows[rows < size]
        positions = order_of(epoch).positions(tasks, here)
        add(epoch, runs_of(np.unique(positions)))
        rows = rows[rows >= size] - size
        epoch += 1
        tasks = rank_plan(p.config, epoch, p.done)
        if not size and not tasks:
            break  # nothing in this epoch nor the next: an empty dataset
