"""Exact, elastic resume for torch's own ``DataLoader``: the states of ``TorchIterableDataset`` workers, and
:class:`ElasticDistributedSampler` for ``TorchMapDataset`` (or any map-style dataset).

Both are torch's ``Stateful`` (``state_dict()`` / ``load_state_dict()``), so torchdata's
``StatefulDataLoader`` checkpoints them as it does its own datasets and samplers: it asks each worker's
dataset for its state after every batch and keeps the states as of the last batch it delivered (what
workers prefetched is not in them), and asks the sampler in the main process likewise.

Elastic: given the states of **every** rank (and worker) of a run, as a list, either resumes on any other
number of ranks and workers. What the old run delivered of the epoch is known exactly (every shard's part
is a part of one global order of the epoch), and the rest is cut into equal contiguous runs, one per new
rank (and worker); later epochs are a fresh run's with the new world size.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence, Sized
from typing import Any

import numpy as np

from unihub.bridges.torch.state import LoaderStateError, rank_and_world
from unihub.readers import elastic
from unihub.readers.plan import complement, positions_in, runs_of
from unihub.schema.metadata_json import parse_json

STATEFUL_VERSION = 1
ITERABLE_KIND = "torch_iterable_dataset"
STREAM_KIND = "torch_iterable_stream"  # a TorchIterableDataset over a reader: the reader's (or loader's) position
SAMPLER_KIND = "elastic_sampler"


def find_states(found: Any, kind: str) -> list[dict[str, Any]]:
    """Every state of ``kind`` in ``found``: a state, a list of them, or what holds them (torchdata's
    ``StatefulDataLoader.state_dict()`` keeps each worker's dataset state and the sampler's in its own
    nested dicts), however nested; in the order met."""
    if isinstance(found, dict):
        if found.get("kind") == kind:
            return [found]
        return [state for value in found.values() for state in find_states(value, kind)]
    if isinstance(found, (list, tuple)):
        return [state for value in found for state in find_states(value, kind)]
    return []


def states_of(found: Any, kind: str, what: str) -> list[dict[str, Any]]:
    """:func:`find_states`, each of this version; :class:`LoaderStateError` where there is none."""
    states = find_states(found, kind)
    if not states:
        raise LoaderStateError(f"no {what} state in what was given (a {type(found).__name__}): pass the "
                               f"{what}'s state_dict(), a StatefulDataLoader's, or a list of those of every rank")
    for state in states:
        if state.get("version") != STATEFUL_VERSION:
            raise LoaderStateError(f"{what} state version {state.get('version')!r} is not {STATEFUL_VERSION}")
    return states


def one_value(states: Sequence[dict[str, Any]], key: str, what: str) -> Any:
    """The value every state has under ``key``; :class:`LoaderStateError` where they differ."""
    values = {repr(state[key]): state[key] for state in states}
    if len(values) > 1:
        raise LoaderStateError(f"the {what} states of the list differ in {key!r} ({sorted(values)}): they are "
                               "not the states of one run at one point; pass every rank's state of one checkpoint")
    return next(iter(values.values()))


def unique_by_shard(states: Sequence[dict[str, Any]], key: str, what: str) -> list[dict[str, Any]]:
    """``states`` with repeats of one state dropped; :class:`LoaderStateError` for two different states of one
    shard (the states of two checkpoints mixed)."""
    by_shard: dict[tuple[int, ...], dict[str, Any]] = {}
    for state in states:
        shard = tuple(int(v) for v in state[key])
        if shard in by_shard and by_shard[shard] != state:
            raise LoaderStateError(f"two different {what} states of {key} {list(shard)}: pass the states of one "
                                   "checkpoint, one per rank (and worker)")
        by_shard[shard] = state
    return list(by_shard.values())


def current_epoch(states: Sequence[dict[str, Any]], finished: Sequence[bool], what: str
                  ) -> tuple[int, list[dict[str, Any]]]:
    """The epoch the ranks of ``states`` resume in, and the states of it. A state that had finished its epoch
    is the next one's start, so with ranks about to begin epoch ``e`` (finished ``e - 1``) and ranks in it,
    the epoch is ``e`` and the first ones delivered nothing of it; ranks more than that apart are refused."""
    epoch = min(int(state["epoch"]) + done for state, done in zip(states, finished))
    if any(int(state["epoch"]) > epoch for state in states):
        raise LoaderStateError(f"the {what} states of the list are of epochs "
                               f"{sorted({int(state['epoch']) for state in states})}, some ranks more than an epoch "
                               "ahead of others: pass every rank's state of one checkpoint")
    return epoch, [state for state in states if int(state["epoch"]) == epoch]


def exact_share(rows: int, shard: int, count: int) -> int:
    """Rows of shard ``shard`` of ``count`` equal contiguous runs (``ceil(rows / count)`` each, the last
    ones wrapping round) that are not wrap-around repeats: every row once over all shards."""
    per = math.ceil(rows / count) if rows else 0
    return max(0, min(per, rows - shard * per))


# -- TorchIterableDataset --------------------------------------------------------------------------
def iterable_state(*, seed: int, epoch: int, shard: tuple[int, int], before: int, rows: int, finished: bool,
                   reader: dict[str, Any]) -> dict[str, Any]:
    """One worker's state of a ``TorchIterableDataset``: its shard ``[rank * workers + worker, world * workers]``
    of epoch ``epoch``, the rows of the epoch runs before this one delivered (``before``, the same in every
    shard), the rows this shard delivered (``rows``), whether it delivered all of its share (``finished``) and
    its reader's state after them, with ``skip``/``exclude`` as a loader's (``{}``: it had not started).

    The keys are the same whatever the state, and the reader's state (whose keys vary: ``done`` after an
    elastic resume) is kept as its JSON text: ``torch.distributed.checkpoint`` loads a state into the keys of
    the state a fresh dataset gives, so a key that only some states have would be lost on the way."""
    return {"version": STATEFUL_VERSION, "kind": ITERABLE_KIND, "seed": seed, "epoch": epoch,
            "shard": [shard[0], shard[1]], "before": before, "rows": rows, "finished": finished,
            "reader": json.dumps(reader, sort_keys=True) if reader else ""}


def state_json(text: Any, what: str) -> Any:
    """The value a state kept as its JSON text (``{}`` for ''): a reader's state, a stream's position. Not text, or
    not JSON, is a :class:`LoaderStateError` naming ``what``."""
    if isinstance(text, str):
        try:
            return parse_json(text) if text else {}
        except ValueError:
            pass
    raise LoaderStateError(f"{what} is not the JSON text of a reader state; pass what state_dict() returned")


def reader_of(state: dict[str, Any]) -> dict[str, Any]:
    """The reader state (with ``skip``/``exclude``) a :func:`iterable_state` keeps; ``{}`` where it had not started."""
    found = state_json(state["reader"], "the TorchIterableDataset state's 'reader'")
    if not isinstance(found, dict):
        raise LoaderStateError("the TorchIterableDataset state's 'reader' is not a reader state")
    return found


def _checked_sampler(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``states``, once each has ``ElasticDistributedSampler.state_dict()``'s keys with values it could have given
    (ints >= 0, a rank ``[k, world]`` with ``0 <= k < world``, ``done`` as ``[start, stop, ...]`` pairs); else
    :class:`LoaderStateError`: a tampered count would resume at other indices."""
    for state in states:
        rank, done = state.get("rank"), state.get("done")
        if not all(elastic.is_count(state.get(key)) for key in ("seed", "epoch", "yielded")) or \
                not isinstance(state.get("finished", False), bool) or not _shard(rank) or \
                not isinstance(done, (list, tuple)) or len(done) % 2 or not all(elastic.is_count(v) for v in done) or \
                any(done[k] >= done[k + 1] for k in range(0, len(done), 2)):
            raise LoaderStateError("an ElasticDistributedSampler state's seed, epoch, rank, done, yielded or finished "
                                   "is not what state_dict() gives (ints >= 0, a rank [k, world], [start, stop] "
                                   "pairs, a bool); pass what state_dict() returned")
    return states


def _shard(value: Any) -> bool:
    """Whether ``value`` is a shard ``[k, count]``: ints, ``0 <= k < count``."""
    return isinstance(value, (list, tuple)) and len(value) == 2 and all(elastic.is_count(v) for v in value) and \
        value[0] < value[1]


def _checked_iterable(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``states``, once each has :func:`iterable_state`'s keys with values it could have given (ints >= 0, a shard
    ``[k, count]`` with ``0 <= k < count``, ``finished`` a bool); :class:`LoaderStateError` else: a tampered count
    would resume at other rows."""
    for state in states:
        if not all(elastic.is_count(state.get(key)) for key in ("seed", "epoch", "before", "rows")) or \
                not isinstance(state.get("finished"), bool) or not _shard(state.get("shard")):
            raise LoaderStateError("a TorchIterableDataset state's seed, epoch, shard, before, rows or finished is "
                                   "not what state_dict() gives (ints >= 0, a shard [k, count], a bool); pass what "
                                   "state_dict() returned")
    return states


class IterableResume:
    """What a ``TorchIterableDataset`` resumes from: one worker's own state (``own``) or every shard's
    (``readers``: the reader states of the shards that had started, for an elastic resume), of ``epoch``."""

    def __init__(self, epoch: int, seed: int, own: dict[str, Any] | None = None,
                 readers: list[dict[str, Any]] | None = None, before: int = 0) -> None:
        self.epoch, self.seed, self.own, self.readers, self.before = epoch, seed, own, readers, before


def iterable_resume(found: Any, in_worker: bool) -> IterableResume | tuple[int, int]:
    """What to resume from, given a worker's state, or the states of every rank and worker of a run (in a
    list, or in StatefulDataLoader states); ``(epoch, seed)`` where that is simply a fresh epoch (every shard
    had finished the last, or none had started this one). A state that had finished its share is the
    next epoch's start, but in a torch worker (``in_worker``) it is one worker's: the others may have rows
    of that epoch left, and it delivers none of them."""
    if isinstance(found, dict) and found.get("kind") == ITERABLE_KIND:
        state = _checked_iterable(states_of(found, ITERABLE_KIND, "TorchIterableDataset"))[0]
        if state["finished"] and not in_worker:
            return int(state["epoch"]) + 1, int(state["seed"])
        if not state["reader"]:
            return int(state["epoch"]), int(state["seed"])
        return IterableResume(int(state["epoch"]), int(state["seed"]), own=state)
    states = unique_by_shard(_checked_iterable(states_of(found, ITERABLE_KIND, "TorchIterableDataset")), "shard",
                             "TorchIterableDataset")
    seed = int(one_value(states, "seed", "TorchIterableDataset"))
    epoch, states = current_epoch(states, [bool(state["finished"]) for state in states], "TorchIterableDataset")
    started = [state for state in states if state["reader"]]
    if not started:
        return epoch, seed
    one_value(started, "before", "TorchIterableDataset")
    if len({int(state["shard"][1]) for state in started}) > 1:
        raise LoaderStateError("the TorchIterableDataset states of the list were saved with different numbers of "
                               "shards (rank and worker counts): pass every rank's state of one checkpoint")
    before = int(started[0]["before"]) + sum(int(state["rows"]) for state in started)
    readers = [reader_of(state) for state in started]
    count = int(started[0]["shard"][1])
    begun = {int(state["shard"][0]) for state in started}
    # a shard that never started (its worker not yet asked for rows) delivered nothing: the reader takes every
    # shard's state, so it gets its state at the start
    readers += [elastic.at_start(readers[0], shard, count) for shard in range(count) if shard not in begun]
    return IterableResume(epoch, seed, readers=readers, before=before)


# -- ElasticDistributedSampler ---------------------------------------------------------------------
def _intervals(flat: Sequence[int]) -> list[tuple[int, int]]:
    return [(int(flat[k]), int(flat[k + 1])) for k in range(0, len(flat), 2)]


def _flat(intervals: Sequence[tuple[int, int]]) -> list[int]:
    return [int(v) for interval in intervals for v in interval]


class ElasticDistributedSampler:
    """``DistributedSampler`` that resumes exactly, on any number of ranks: the indices of one rank.

    Each epoch's order is one global permutation of ``(seed, epoch)`` (``arange`` without ``shuffle``), cut
    into ``world_size`` equal contiguous blocks, rank ``k`` taking block ``k`` (``drop_last=False`` pads the
    last blocks by wrapping round, so ranks stay equal; ``True`` leaves the remainder out), as MosaicML
    Streaming's *elastic determinism*. ``state_dict()`` says how far this rank got; ``load_state_dict`` takes
    this rank's own state (same rank and world size), or the list of every rank's states (or their
    ``StatefulDataLoader`` states), saved with any world size: the rows no old rank delivered of that epoch
    are then cut into equal contiguous blocks for the new world size, and later epochs are a fresh run's.

        sampler = ElasticDistributedSampler(dataset, seed=0)   # rank, world_size: torch.distributed's
        loader = StatefulDataLoader(dataset, sampler=sampler, batch_size=64, num_workers=4)
        ...  # checkpoint {"loader": loader.state_dict()} per rank
        sampler.load_state_dict([state_0, ..., state_n])      # on a new world size, before iterating

    Call ``set_epoch(epoch)`` before each epoch, as with torch's sampler; a loaded state applies to the epoch
    it was saved in. ``state_dict()`` counts the indices this sampler gave out: under torch's plain
    ``DataLoader`` with workers that runs ahead of the batches delivered (prefetching), so pass
    ``delivered=`` (indices of the batches the training loop got) there; ``StatefulDataLoader`` keeps the
    sampler's state as of the last batch delivered by itself.
    """

    def __init__(self, dataset: Sized | int, *, rank: int | None = None, world_size: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        self.size = dataset if isinstance(dataset, int) else len(dataset)
        if rank is None or world_size is None:
            found_rank, found_world = rank_and_world()
            rank = found_rank if rank is None else rank
            world_size = found_world if world_size is None else world_size
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank {rank} of {world_size}")
        self.rank, self.world_size = int(rank), int(world_size)
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.epoch = 0
        #: the epoch a loaded state applies to, the intervals of its permutation delivered before this run,
        #: and how many indices of this rank's block this run had given out
        self._resume: tuple[int, list[tuple[int, int]], int] | None = None
        #: the epoch being (or last) iterated, the intervals delivered before it, and this rank's block length
        self._iterating: tuple[int, list[tuple[int, int]], int] = (0, [], -1)
        self.yielded = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.size, dtype=np.int64)
        return np.random.default_rng([self.seed, epoch]).permutation(self.size)

    def _block(self, done: Sequence[tuple[int, int]], rank: int, world: int) -> np.ndarray:
        """Positions (in the permutation) of rank ``rank`` of ``world``'s block of what ``done`` leaves."""
        rest = positions_in(complement(list(done), self.size))
        per = (rest.size // world if self.drop_last else math.ceil(rest.size / world)) if rest.size else 0
        return rest[(rank * per + np.arange(per, dtype=np.int64)) % rest.size] if per else rest[:0]

    def _planned(self) -> tuple[list[tuple[int, int]], int]:
        resume = self._resume
        if resume is not None and resume[0] == self.epoch:
            return resume[1], resume[2]
        return [], 0

    def __len__(self) -> int:
        done, start = self._planned()
        return max(0, len(self._block(done, self.rank, self.world_size)) - start)

    def __iter__(self) -> Iterator[int]:
        # a generator: an iterator torch makes and never starts consumes no loaded state
        done, start = self._planned()
        self._resume = None
        epoch = self.epoch
        block = self._block(done, self.rank, self.world_size)
        self._iterating, self.yielded = (epoch, done, block.size), start
        indices = self._order(epoch)[block[start:]]
        for index in indices.tolist():
            self.yielded += 1
            yield index

    def state_dict(self, delivered: int | None = None) -> dict[str, Any]:
        """Where this rank stands in its epoch: after ``delivered`` indices of its block (default: all it gave
        out). JSON-able (ints, strings, bools, lists of ints)."""
        epoch, done, length = self._iterating
        yielded = self.yielded
        if self._resume is not None:  # loaded, not yet iterated: the loaded position
            epoch, done, yielded = self._resume
            length = -1
        elif epoch != self.epoch:  # set_epoch since: that epoch, not begun
            epoch, done, yielded, length = self.epoch, [], 0, -1
        if delivered is not None:
            yielded = int(delivered)
        return {"version": STATEFUL_VERSION, "kind": SAMPLER_KIND, "seed": self.seed, "size": self.size,
                "shuffle": self.shuffle, "drop_last": self.drop_last, "epoch": epoch,
                "rank": [self.rank, self.world_size], "done": _flat(done), "yielded": yielded,
                "finished": yielded == length}

    def load_state_dict(self, state: Any) -> None:
        """Resume from this rank's own state, or from the list of every rank's (any world size; or
        ``StatefulDataLoader`` states holding them): see the class."""
        states = unique_by_shard(_checked_sampler(states_of(state, SAMPLER_KIND, "ElasticDistributedSampler")),
                                 "rank", "ElasticDistributedSampler")
        for key, mine in (("size", self.size), ("shuffle", self.shuffle), ("drop_last", self.drop_last)):
            if one_value(states, key, "ElasticDistributedSampler") != mine:
                raise LoaderStateError(f"the sampler state's {key} {states[0][key]!r} is not this sampler's {mine!r}: "
                                       "it belongs to another dataset or sampler options")
        seed = int(one_value(states, "seed", "ElasticDistributedSampler"))
        saved = [int(v) for v in states[0]["rank"]]
        epoch, states = current_epoch(states, [bool(s.get("finished")) for s in states],
                                      "ElasticDistributedSampler")
        done = _intervals(one_value(states, "done", "ElasticDistributedSampler")) if states else []
        if isinstance(state, dict) and state.get("kind") == SAMPLER_KIND and saved[1] > 1:
            if saved != [self.rank, self.world_size]:
                raise LoaderStateError(f"the sampler state is rank {saved[0]} of {saved[1]}'s, not rank {self.rank} of "
                                       f"{self.world_size}'s: pass the list of every rank's state to resume on "
                                       "another world size")
            # a finished epoch: the next one, fresh
            yielded = self._delivered(state, done).size if states else 0  # within its block: checked there
            self.seed, self.epoch, self._resume = seed, epoch, (epoch, done, yielded) if states else None
            return
        self.seed, self.epoch = seed, epoch
        delivered = [self._delivered(s, done) for s in states]
        joined = np.unique(np.concatenate([positions_in(done), *delivered]))
        self._resume = (epoch, runs_of(joined), 0)

    def _delivered(self, state: dict[str, Any], done: list[tuple[int, int]]) -> np.ndarray:
        rank, world = (int(v) for v in state["rank"])
        block = self._block(done, rank, world)
        yielded = int(state["yielded"])
        if not 0 <= yielded <= block.size:
            raise LoaderStateError(f"the sampler state of rank {rank} of {world} gave out {yielded} indices of a "
                                   f"block of {block.size}: it belongs to another run")
        return block[:yielded]
