"""Elastic resume: the states every rank of a run saved, resumed on any number of ranks.

Every rank's share of an epoch is a part of one global order (:func:`unihub.readers.plan.global_plan`),
so what a run delivered is a set of intervals of it whatever its shard count. A reader given the
states of all ranks (``resume_from=[state_0, ..., state_n]``) takes its equal contiguous run of the
rest (:func:`unihub.readers.plan.rank_plan`); later epochs are planned as a fresh run with the new
shard count would plan them. A state keeps what was delivered of its epoch before it (``done``), so a
run resumed this way can be resumed again, on yet another number of ranks.

The functions here read and write the state's keys for this; :class:`~unihub.readers.reader.Reader`
uses them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from unihub.errors import ReaderStateError
from unihub.readers import plan as planning

#: the keys a state needs for an elastic resume (states saved before it lack them)
ELASTIC_KEYS = ("shard", "shard_by", "shard_remainder", "order")


def shard_keys(config: planning.PlanConfig) -> dict[str, Any]:
    """The state's record of the shard it was saved by (an unsharded reader: shard 0 of 1)."""
    return {"shard": [config.cur_shard or 0, config.shard_count or 1], "shard_by": config.shard_by,
            "shard_remainder": config.shard_remainder}


def done_keys(done: Mapping[int, planning.Intervals], epoch: int) -> dict[str, Any]:
    """The state's record of ``done`` for a reader in ``epoch``: the intervals of this epoch and later ones,
    and of the last (a rank one epoch behind may be resumed with this one), as a flat list of ints
    ``[epoch, start, stop, ...]``; ``done_from`` says from which epoch on it is whole where older epochs are
    left out (0: none is). Both are in every state, empty or not: ``torch.distributed.checkpoint`` loads only
    the keys its template (a reader made anew) has, and would drop them otherwise."""
    kept_from = max(0, epoch - 1)
    return {"done": [value for e in sorted(done) if e >= kept_from for a, b in done[e] for value in (e, a, b)],
            "done_from": kept_from if any(e < kept_from for e in done) else 0}


def at_start(state: Mapping[str, Any], shard: int, count: int, epoch: int = 0, *,
             fresh: bool = False) -> dict[str, Any]:
    """The state shard ``shard`` of ``count`` of the run ``state`` belongs to had before it delivered anything
    of ``epoch``: for a list of every shard's states where a shard never started (a torch worker that was
    not yet asked for rows). What runs before delivered (``done``) is the same for every shard of a run;
    ``fresh``: a run started over (``start_over``: a mix's next pass), which nothing was delivered of."""
    dropped = ("skip", "exclude", "done", "done_from") if fresh else ("skip", "exclude")
    kept = {key: value for key, value in state.items() if key not in dropped}
    return {**kept, "shard": [shard, count], "epoch": epoch, "task": 0, "offset": 0}


def check_every_shard(states: Sequence[Mapping[str, Any]]) -> None:
    """:class:`ReaderStateError` unless ``states`` are those of every shard of one run, one each (their
    ``shard`` records ``[k, count]``): a rank left out would have its rows delivered again."""
    try:
        shards = sorted((int(state["shard"][0]), int(state["shard"][1])) for state in states)
    except (KeyError, TypeError, ValueError, IndexError):
        raise ReaderStateError("a state of the list has no shard record [k, count]; pass what state_dict() "
                               "returned") from None
    counts = {count for _, count in shards}
    if len(counts) != 1 or [k for k, _ in shards] != list(range(counts.pop())):
        raise ReaderStateError(f"the list holds the states of shards {shards}: pass the states of every rank of "
                               "the run, one each")


def check_epochs_known(states: Sequence[Mapping[str, Any]], progress: Sequence[planning.RankProgress]) -> None:
    """:class:`ReaderStateError` where a rank's plan of an epoch the resume needs was left out of its state
    (:func:`done_keys`: ranks more than an epoch apart after an elastic resume)."""
    first = min(p.epoch for p in progress)
    for k, state in enumerate(states):
        done_from = state.get("done_from", 0)
        if not is_count(done_from):
            raise ReaderStateError(f"state {k} of the list: its 'done_from' {done_from!r} is not an int >= 0; pass "
                                   "what state_dict() returned")
        if first < int(done_from):
            raise ReaderStateError(f"state {k} of the list is more than an epoch ahead of another after an elastic "
                                   f"resume (epoch {state['epoch']} and {first}); its plan of epoch {first} is no "
                                   "longer kept: resume from states saved closer together")


def decode_done(values: Any) -> dict[int, planning.Intervals]:
    """A state's ``done`` back as intervals per epoch; :class:`ReaderStateError` where it is malformed."""
    if not isinstance(values, list) or len(values) % 3 or \
            not all(isinstance(v, int) and is_count(v) for v in values):
        raise ReaderStateError("the reader state's 'done' is not a list of [epoch, start, stop] ints >= 0; "
                               "pass what state_dict() returned")
    done: dict[int, list[tuple[int, int]]] = {}
    for k in range(0, len(values), 3):
        epoch, a, b = values[k:k + 3]
        if b <= a:
            raise ReaderStateError(f"the reader state's 'done' has an empty interval [{a}, {b}) of epoch {epoch}")
        done.setdefault(epoch, []).append((a, b))
    return {epoch: planning.merge_intervals(intervals) for epoch, intervals in done.items()}


def rank_config(state: Mapping[str, Any], config: planning.PlanConfig) -> planning.PlanConfig:
    """``config`` as the rank that saved ``state`` had it: its seed and shard."""
    try:
        shard, count = (int(v) for v in state["shard"])
        return dataclasses.replace(config, seed=int(state["seed"]), cur_shard=shard, shard_count=count,
                                   shard_by=state["shard_by"], shard_remainder=state["shard_remainder"])
    except (TypeError, ValueError) as exc:  # PlanError is a ValueError: a shard that cannot be
        raise ReaderStateError(f"the reader state's shard is not usable: {exc}") from None


def seed_of(state: Mapping[str, Any]) -> int:
    """A state's ``seed``; :class:`ReaderStateError` where it is not an int >= 0 (what numpy's generators take)."""
    seed: Any = state.get("seed")
    if not is_count(seed):
        raise ReaderStateError(f"the reader state's seed {seed!r} is not an int >= 0; pass what state_dict() "
                               "returned")
    return int(seed)


def position_of(state: Mapping[str, Any]) -> tuple[int, int, int]:
    """A state's ``(epoch, task, offset)``; :class:`ReaderStateError` where one is not an int >= 0 (a tampered
    state: read as it stands, it would resume at rows no reader delivered from)."""
    position = tuple(state[key] for key in ("epoch", "task", "offset"))
    if not all(is_count(value) for value in position):
        raise ReaderStateError(f"the reader state's position (epoch, task, offset) = {position} is not three ints "
                               ">= 0; pass what state_dict() returned")
    return tuple(int(value) for value in position)  # type: ignore[return-value]


def checked_done(state: Mapping[str, Any], config: planning.PlanConfig) -> dict[int, planning.Intervals]:
    """:func:`decode_done` of ``state``, each interval within its epoch's global order under ``config``."""
    done = decode_done(state.get("done", []))
    for epoch, intervals in done.items():
        if intervals and intervals[-1][1] > planning.GlobalOrder(config, epoch).total:
            raise ReaderStateError(f"the reader state's 'done' names rows up to {intervals[-1][1]} of epoch {epoch}, "
                                   "beyond the rows of the epoch; pass what state_dict() returned")
    return done


def check_position(position: tuple[int, int, int], tasks: Sequence[planning.ReadTask], batched: bool,
                   num_epochs: int | None) -> None:
    """:class:`ReaderStateError` unless ``position`` is one a reader of the plan ``tasks`` (its epoch's) is at:
    in a task or at the epoch's end, a batch reader's at a task's start, no later than the last epoch's end."""
    epoch, task, offset = position
    if task > len(tasks) or offset > (tasks[task].num_rows if task < len(tasks) else 0) or (batched and offset) \
            or (num_epochs is not None and (epoch > num_epochs or (epoch == num_epochs and (task or offset)))):
        raise ReaderStateError(f"the reader state's position (epoch {epoch}, task {task}, offset {offset}) is not "
                               "one of its plan's; pass what state_dict() returned")


def progress_of(state: Mapping[str, Any], config: planning.PlanConfig, batched: bool,
                num_epochs: int | None = None) -> planning.RankProgress:
    """What the rank that saved ``state`` (under ``config``: :func:`rank_config`) had delivered. A state may
    carry rows delivered after its position, as a loader's does: the next ``skip`` rows, and the rows
    ``exclude`` offsets after those."""
    done = checked_done(state, config)
    epoch, task, offset = position_of(state)
    tasks = planning.rank_plan(config, epoch, done)
    check_position((epoch, task, offset), tasks, batched, num_epochs)
    Drops.of_state(state)  # skip and exclude checked
    skip = int(state.get("skip", 0))
    extra = tuple(range(skip)) + tuple(skip + int(x) for x in state.get("exclude", ()))
    if task == len(tasks):  # its whole share delivered, whether or not a next() has since found the end
        return planning.RankProgress(config, done, epoch + 1, 0, extra)
    rows = sum(t.num_rows for t in tasks[:task]) + offset
    return planning.RankProgress(config, done, epoch, rows, extra)


class Drops:
    """Rows of a reader's stream, after the position of the state it resumed from, to pass over: those a loader
    had delivered ahead of the position (a state's ``skip``: the next rows; ``exclude``: the rows at ``skip + x``
    offsets). Offsets count the rows the reader would deliver from that position on, across batches and epochs;
    :attr:`next` is the offset of the next row a batch is read from (or of the position while none is)."""

    __slots__ = ("below", "rows", "next")

    def __init__(self, skip: int, rows: np.ndarray) -> None:
        self.below = skip  # every offset below this is dropped
        self.rows = rows  # and these (sorted, unique, each >= below)
        self.next = 0

    @classmethod
    def of_state(cls, state: Mapping[str, Any]) -> Drops | None:
        """The rows ``state`` says to pass over; None where it says none. :class:`ReaderStateError` where its
        ``skip`` is not an int >= 0 or its ``exclude`` not a list of them."""
        skip, exclude = state.get("skip", 0), state.get("exclude", [])
        if not is_count(skip) or not isinstance(exclude, (list, tuple)) or not all(is_count(x) for x in exclude):
            raise ReaderStateError("the reader state's 'skip' is not an int >= 0 or its 'exclude' not a list of "
                                   "them; pass what state_dict() returned")
        if not skip and not exclude:
            return None
        return cls(int(skip), np.unique(np.asarray(exclude, dtype=np.int64)) + int(skip))

    def within(self, start: int, stop: int) -> np.ndarray | None:
        """Offsets (from ``start``) of the rows to drop among the stream's rows ``[start, stop)``, None where
        there is none; those before ``start`` are forgotten (passed)."""
        rows = self.rows
        if rows.size and rows[0] < start:
            rows = self.rows = rows[np.searchsorted(rows, start):]
        head = max(0, min(self.below, stop) - start)
        inside = rows[:np.searchsorted(rows, stop)] - start
        if not head and not inside.size:
            return None
        return np.concatenate([np.arange(head, dtype=np.int64), inside]) if head else inside

    def passed(self, at: int) -> bool:
        """Whether no row at offset ``at`` or after it is to drop."""
        return self.below <= at and (not self.rows.size or int(self.rows[-1]) < at)

    def state_keys(self, at: int) -> dict[str, Any]:
        """``skip`` and ``exclude`` of a state whose position is offset ``at``."""
        rows = self.rows[np.searchsorted(self.rows, at):] - at
        skip = max(0, self.below - at)
        run = int(np.searchsorted(rows - np.arange(rows.size), skip, side="right")) if rows.size else 0
        skip += run  # rows at skip, skip + 1, ... right after the skipped ones are skipped too
        return {"skip": skip, "exclude": (rows[run:] - skip).tolist()}

    def kept(self, delivered: np.ndarray) -> np.ndarray:
        """The offsets of the rows delivered ``delivered``-th (counts from 0 of the rows not dropped)."""
        rows = self.rows - self.below
        return self.below + delivered + np.searchsorted(rows - np.arange(rows.size), delivered, side="right")


def with_delivered_after(state: Mapping[str, Any], skip: int, exclude: Sequence[int]) -> dict[str, Any]:
    """``state`` with the rows a loader delivered after it added to those it passes over: the next ``skip`` rows and
    those ``exclude`` offsets after them, counted in the rows the reader delivers (past those ``state`` passes over
    already, if it names any)."""
    rows = np.union1d(np.arange(skip, dtype=np.int64), skip + np.asarray(exclude, dtype=np.int64))
    drops = Drops.of_state(state)
    if drops is not None:  # the loader's rows are the reader's after the rows it passed over
        rows = np.union1d(np.union1d(drops.kept(rows), drops.rows), np.arange(drops.below, dtype=np.int64))
    if not rows.size:
        return dict(state, skip=0, exclude=[])
    return dict(state, **Drops(0, rows).state_keys(0))


#: rows a state may name as delivered after its position (skip + the largest exclude offset): a loader's buffers
#: hold far fewer; an elastic resume lists each of them (a hostile 10**9 was a MemoryError)
MAX_PASSED_OVER = 2**24


def check_passed_over(skip: int, exclude: Sequence[int]) -> None:
    """:class:`ReaderStateError` where ``skip`` and ``exclude`` (ints >= 0) name more than :data:`MAX_PASSED_OVER`
    rows after a position."""
    if skip + max(exclude, default=0) > MAX_PASSED_OVER:
        raise ReaderStateError(f"the state names rows up to {skip + max(exclude, default=0)} after its position "
                               f"as delivered ('skip', 'exclude'): more than {MAX_PASSED_OVER} is not a state "
                               "state_dict() returns")


def is_count(value: Any) -> bool:
    """Whether ``value`` is an int >= 0 (not a bool) that numpy's int64 holds."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and bool(0 <= value < 2**63)


def other_version(state: Mapping[str, Any], dataset_version: int | None) -> str:
    """Where a state was saved on another version of a dataset that grew (an append, a delete, a compaction
    changes its row groups) than the reader reads: how to resume it (that version, pinned), else nothing."""
    saved = state.get("dataset_version")
    if type(saved) is not int or dataset_version is None or saved == dataset_version:
        return ""
    return (f". The state was saved reading version {saved} of the dataset, and this reader reads version "
            f"{dataset_version}: make_reader(url, version={saved}, resume_from=state) resumes it exactly")


def check_one_run(states: Sequence[Any], version: int, order_of: Any, dataset_version: int | None = None) -> int:
    """The seed the states share, once each is a state of this reader's version with the elastic keys and
    the global order ``order_of(seed)`` fingerprints; :class:`ReaderStateError` saying what does not fit
    (``dataset_version``: the version of the dataset the reader reads, named where the states' differs)."""
    if not states:
        raise ReaderStateError("resume_from=[] holds no state: pass every rank's state_dict() of the run")
    seeds = set()
    for k, state in enumerate(states):
        if not isinstance(state, dict) or state.get("version") != version:
            found = state.get("version") if isinstance(state, dict) else type(state).__name__
            raise ReaderStateError(f"state {k} of the list: reader state version {found!r} is not {version}")
        missing = sorted({"seed", "epoch", "task", "offset", *ELASTIC_KEYS} - set(state))
        if missing:
            raise ReaderStateError(f"state {k} of the list lacks {missing}: states saved before elastic resume "
                                   "resume only one by one, on the world size that saved them")
        wrong = [key for key in ("seed", "epoch", "task", "offset", "done_from") if key in state
                 and not is_count(state[key])]
        if wrong:
            raise ReaderStateError(f"state {k} of the list: its {wrong} are not ints >= 0; pass what state_dict() "
                                   "returned")
        Drops.of_state(state)  # its skip and exclude: ints >= 0
        check_passed_over(state.get("skip", 0), state.get("exclude", []))
        seeds.add(int(state["seed"]))
    if len(seeds) > 1:
        raise ReaderStateError(f"the ranks' states have different seeds {sorted(seeds)}: their epochs were not one "
                               "order, so what is left of it is not known; pass the same seed= on every rank")
    check_every_shard(states)
    seed = seeds.pop()
    for state in states:
        if state["order"] != order_of(seed):
            raise ReaderStateError("a state of the list belongs to another dataset or other reader options "
                                   "(row groups, shuffling, epochs, fields or batching differ)"
                                   + other_version(state, dataset_version))
    return seed
