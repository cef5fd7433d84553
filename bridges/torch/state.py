"""Exact resume: where a loader stands in its reader's stream, as a state that a new loader continues from.

``loader.state_dict()`` after any batch, then ``load_state_dict(state)`` on a loader over a new reader
with the same options, and exactly the rows not yet delivered come next. The state is the reader's
position at (or before) the oldest row the loader holds undelivered, plus the stream offsets of rows
after it that were already delivered. Without a shuffling queue the remaining rows come in the original
order. With one, rows that sat in the queue are re-read from the reader and shuffled again, so the order
differs from an uninterrupted run, but each remaining row still comes exactly once.

The loaders and readers are torch's ``Stateful`` (``torch.distributed.checkpoint.stateful``):
``torch.distributed.checkpoint`` saves them beside the model and optimizer and ``dcp.load`` resumes
them, their states being dicts of fixed keys whose values are ints, strings and lists of ints:

    dcp.save({"model": model.state_dict(), "loader": loader}, checkpoint_id=path)
    dcp.load({"model": model.state_dict(), "loader": loader}, checkpoint_id=path)  # a loader made anew

With several ranks, wrap it as :class:`PerRank` ``(loader)``: DCP keeps one copy of a non-tensor value
that all ranks hold under the same key, so each rank's position needs its own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from unihub.bridges.torch.tensors import load_torch
from unihub.errors import ReaderStateError, UnihubError
from unihub.readers import elastic

LOADER_STATE_VERSION = 1
IN_MEMORY_STATE = "in_memory"  # the "kind" of an InMemBatchedDataLoader's state


class LoaderStateError(UnihubError, ValueError):
    """A loader state that is malformed or was saved by another kind of loader."""


class RowTracker:
    """Stream positions of the rows a loader took from its reader, and reader states to resume them.

    Position ``p`` is the ``p``-th row read since the reader was at ``marks[0]``'s state.
    ``skip`` and ``drop`` come from a loaded state: rows before ``skip`` and at ``drop``
    positions were delivered before the state was saved and are discarded.
    """

    def __init__(self, reader_state: dict[str, Any] | None, pending: Callable[[], np.ndarray], skip: int = 0,
                 drop: Iterable[int] = ()) -> None:
        self.consumed = 0
        self.marks: deque[tuple[int, dict[str, Any] | None]] = deque([(0, reader_state)])
        self.prune_at = 64
        self.pending = pending
        self.skip = skip
        self.drop = set(drop)

    def mark(self, reader_state: dict[str, Any] | None) -> None:
        """The reader is at ``reader_state`` and its next row has position ``consumed``."""
        if self.marks[-1][0] == self.consumed:
            self.marks[-1] = (self.consumed, reader_state)
        else:
            self.marks.append((self.consumed, reader_state))
        if len(self.marks) > self.prune_at:
            base = self._base()
            while len(self.marks) > 1 and self.marks[1][0] <= base:
                self.marks.popleft()
            # marks still needed (a shuffling queue holds old rows) are not looked at again until they double
            self.prune_at = max(64, 2 * len(self.marks))

    def advance(self, n: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Positions of the next ``n`` rows read, and a keep mask (None: keep all)."""
        positions = np.arange(self.consumed, self.consumed + n, dtype=np.int64)
        self.consumed += n
        if self.consumed <= self.skip:
            return positions, np.zeros(n, dtype=bool)
        if positions[0] >= self.skip and not self.drop:
            return positions, None
        keep = positions >= self.skip
        if self.drop:
            keep &= ~np.isin(positions, np.fromiter(self.drop, np.int64, len(self.drop)))
            self.drop = {d for d in self.drop if d >= self.consumed}
        return positions, keep

    def advance_one(self) -> tuple[int, bool]:
        """:meth:`advance` of one row, without arrays: its position, and whether to keep it."""
        position = self.consumed
        self.consumed += 1
        if position < self.skip:
            return position, False
        if self.drop and position in self.drop:
            self.drop.discard(position)
            return position, False
        return position, True

    def _base(self) -> int:
        pending = self.pending()
        base = int(pending.min()) if pending.size else self.consumed
        return max(base, self.skip)

    def state(self) -> dict[str, Any]:
        pending = self.pending()
        base = self._base()
        held = max(0, self.consumed - base)
        if pending.size == held and (not held or int(pending.min()) >= base):
            gone = pending[:0]  # every row since base is still held (in order, no queue): none delivered out of turn
        else:  # a shuffling queue let rows out of turn (20 ms for 83k held rows: only here)
            gone = np.setdiff1d(np.arange(base, max(base, self.consumed), dtype=np.int64), pending)
        exclude = sorted({int(p) - base for p in gone} | {d - base for d in self.drop if d >= base})
        start, reader_state = next(m for m in reversed(self.marks) if m[0] <= base)
        if reader_state is None:
            raise LoaderStateError("this loader's reader keeps no state (it has no state_dict(), or mixes readers "
                                   "that have none), so the loader cannot say where to resume")
        # a copy: torch.distributed.checkpoint's load writes the saved values into the dict it is given
        return {"version": LOADER_STATE_VERSION, "reader": dict(reader_state), "skip": base - start, "exclude": exclude}


def reader_state_of(reader: Any) -> dict[str, Any] | None:
    """``reader.state_dict()``, or None for a reader that keeps none (a mock; a mix of such readers, see
    ``WeightedSamplingReader.keeps_state``): a loader reads it all the same and refuses only its own state."""
    if not getattr(reader, "keeps_state", True) or not callable(getattr(reader, "state_dict", None)):
        return None
    state: dict[str, Any] = reader.state_dict()
    return state


def parse_loader_state(state: Any) -> tuple[dict[str, Any], int, list[int]]:
    """A streaming loader's state as (reader state, rows to skip, offsets after them to drop), or
    :class:`LoaderStateError` saying what is wrong with it."""
    if not isinstance(state, dict) or state.get("version") != LOADER_STATE_VERSION:
        found = state.get("version") if isinstance(state, dict) else type(state).__name__
        raise LoaderStateError(f"loader state version {found!r} is not {LOADER_STATE_VERSION}; "
                               "pass what the loader's state_dict() returned")
    missing = sorted({"reader", "skip", "exclude"} - set(state))
    if missing:
        raise LoaderStateError(f"the loader state lacks {missing}; pass what state_dict() returned")
    skip, exclude = state["skip"], state["exclude"]
    if not elastic.is_count(skip) or not isinstance(exclude, (list, tuple)) or not all(
            elastic.is_count(e) for e in exclude):
        raise LoaderStateError("the loader state's 'skip' is not an int >= 0 or its 'exclude' not a list of them; "
                               "pass what state_dict() returned")
    try:
        elastic.check_passed_over(skip, exclude)
    except ReaderStateError as exc:
        raise LoaderStateError(str(exc)) from None
    return state["reader"], int(skip), [int(e) for e in exclude]


def elastic_reader_states(states: Sequence[Any]) -> list[dict[str, Any]]:
    """Every rank's loader state as the reader state a reader takes in its list form
    (``Reader.load_state_dict([...])``, readers/elastic.py): the position, with the rows after it that the
    loader had already delivered as ``skip`` (the next rows) and ``exclude`` (offsets after those)."""
    if not states:
        raise LoaderStateError("an empty list of loader states: pass every rank's state_dict() of the run")
    out = []
    for state in states:
        reader_state, skip, exclude = parse_loader_state(state)
        out.append(elastic.with_delivered_after(reader_state, skip, exclude))
    check_every_shard(out)
    return out


def check_every_shard(reader_states: Sequence[dict[str, Any]]) -> None:
    """:class:`LoaderStateError` unless the reader states are those of every shard of one run, one each
    (readers/elastic.py's check, as the loaders' error); a mix's states carry no shard record and go on."""
    if any(not isinstance(state.get("shard"), list) for state in reader_states):
        return  # a mix (weighted.py) says itself what it takes
    try:
        elastic.check_every_shard(reader_states)
    except ReaderStateError as exc:
        raise LoaderStateError(str(exc)) from None


class PerRank:
    """A loader's (or reader's) state in ``torch.distributed.checkpoint`` under its rank's own key.

    DCP saves a non-tensor value that every rank has under the same key once, as replicated: with
    ``{"loader": loader}`` in a group of several ranks, one rank's position is saved and every rank
    loads it (a sharded reader refuses it; an unsharded one repeats rows). Under
    ``{"loader": PerRank(loader)}`` each rank's state is kept as ``rank_<k>``, and each loads its own.

        dcp.save({"model": model.state_dict(), "loader": PerRank(loader)}, checkpoint_id=path)
        dcp.load({"model": model.state_dict(), "loader": PerRank(loader)}, checkpoint_id=path)  # same world

    **Another world size** (elastic resume): DCP loads only the keys its template names, so a new rank must
    ask for every old rank's key. :meth:`loading` is that template, read from the checkpoint's metadata
    (the old world size is the number of ``rank_<k>`` keys saved under ``key``); put it where the loader
    was saved, and each new rank resumes its equal share of the rows no old rank delivered, later epochs
    as a fresh run with the new world size (``loader.load_state_dict([state_0, ..., state_n])``):

        per_rank = PerRank(loader)             # the loader's reader has the new cur_shard / shard_count
        dcp.load({"model": model.state_dict(), "loader": per_rank.loading(path)}, checkpoint_id=path)
        per_rank.load_from(path)               # or the loader alone (its key: "loader" unless named)

    With the same world size it loads this rank's own state, which resumes its stream exactly as saved.
    The metadata's keys are the whole saved state, so keys a fresh loader's template lacks (a reader's
    ``done`` after an elastic resume) are loaded too.
    """

    def __init__(self, loader: Any, rank: int | None = None, world_size: int | None = None) -> None:
        self.loader = loader
        rank_now, world_now = rank_and_world()
        self.rank = rank_now if rank is None else rank
        self.world_size = world_now if world_size is None else world_size

    @property
    def key(self) -> str:
        return f"rank_{self.rank}"

    def state_dict(self) -> dict[str, Any]:
        return {self.key: self.loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """This rank's own state where the checkpoint's world size is this one's (or only it was asked
        for), else every old rank's states, as a list (elastic resume)."""
        ranks = saved_ranks(state)
        whole = len(ranks) > 1 and ranks == list(range(len(ranks)))
        if self.key in state and (not whole or len(ranks) == self.world_size):
            self.loader.load_state_dict(state[self.key])
        elif whole:
            self.loader.load_state_dict([state[f"rank_{k}"] for k in ranks])
        else:
            raise LoaderStateError(f"the checkpoint holds no state for {self.key} (it has {sorted(state)}); "
                                   "to resume on another world size, load every rank's: PerRank.loading()")

    def loading(self, checkpoint_id: Any, key: str = "loader") -> CheckpointedRanks:
        """What to put under ``key`` in ``dcp.load``'s state dict: every rank's saved state, into this loader."""
        return CheckpointedRanks(self, checkpoint_template(checkpoint_id, key))

    def load_from(self, checkpoint_id: Any, key: str = "loader") -> None:
        """``dcp.load`` of this loader alone (saved under ``key``), from every rank's state (:meth:`loading`)."""
        dcp = load_torch().distributed.checkpoint
        dcp.load({key: self.loading(checkpoint_id, key)}, checkpoint_id=checkpoint_id)


class CheckpointedRanks:
    """``dcp.load``'s template of every rank's state a checkpoint holds under one key (from its metadata),
    loaded into a :class:`PerRank`; made by :meth:`PerRank.loading`."""

    def __init__(self, per_rank: PerRank, template: dict[str, Any]) -> None:
        self.per_rank, self.template = per_rank, template

    def state_dict(self) -> dict[str, Any]:
        return self.template

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.per_rank.load_state_dict(state)


def saved_ranks(state: dict[str, Any]) -> list[int]:
    """The ranks whose states ``state`` holds (its ``rank_<k>`` keys), in order."""
    return sorted(int(name[5:]) for name in state if name.startswith("rank_") and name[5:].isdigit())


def checkpoint_template(checkpoint_id: Any, key: str) -> dict[str, Any]:
    """Every value a DCP checkpoint saved under ``key`` as nested dicts of None (what ``dcp.load`` fills in),
    from its metadata; :class:`LoaderStateError` where it saved no rank's state there."""
    dcp = load_torch().distributed.checkpoint
    metadata = dcp.FileSystemReader(checkpoint_id).read_metadata()
    paths = metadata.planner_data or {}
    template: dict[str, Any] = {}
    for name in metadata.state_dict_metadata:
        path = paths.get(name, tuple(name.split(".")))
        if len(path) < 2 or path[0] != key:
            continue
        node = template
        for part in path[1:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = None
    ranks = saved_ranks(template)
    if not ranks or ranks != list(range(len(ranks))):
        raise LoaderStateError(f"the checkpoint {checkpoint_id} holds no PerRank states rank_0 ... rank_<n> under "
                               f"{key!r} (it has {sorted(template)}): pass the key the loader was saved under")
    return template


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the world's size in ``torch.distributed``; (0, 1) outside a process group."""
    dist = load_torch().distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
