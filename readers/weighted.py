"""``WeightedSamplingReader``: rows (or batches) drawn from several readers at given probabilities.

Petastorm's ``petastorm.weighted_sampling_reader.WeightedSamplingReader`` with its arguments,
checks and end (by default the mix ends when a drawn reader has nothing left), plus ``seed``,
exact resume, ``on_exhausted="cycle"|"drain"`` (start a reader that ran out over, or take it out
and renormalise the weights), weights changed mid-run (:meth:`~WeightedSamplingReader.set_weights`)
and :meth:`~WeightedSamplingReader.skip_rows`, and elastic resume (the states of every rank of a run, each
mixing its shards of the sources, resumed on any number of ranks:
:meth:`~WeightedSamplingReader.load_state_dict` of a list). Which reader the ``k``-th draw takes is a pure
function of ``(seed, k)`` and the weights in force (:func:`draw_choices`): uniforms come in blocks
of :data:`BLOCK` from a generator seeded ``(seed, block, stream tag)``, so the sampler's whole
state is its seed, draw count, weights and drained readers, and
:meth:`WeightedSamplingReader.state_dict` is that plus each reader's own ``state_dict()``.

    evens = make_reader(url, predicate=in_lambda(["id"], lambda i: i % 2 == 0), num_epochs=None)
    odds = make_reader(url, predicate=in_lambda(["id"], lambda i: i % 2 == 1), num_epochs=None)
    with WeightedSamplingReader([evens, odds], [0.2, 0.8], seed=0) as mixer:
        for row in itertools.islice(mixer, 1000):
            ...

The mixer has what the loaders and bridges use of a reader (``schema``, ``batched``,
``ngram``, ``state_dict``/``load_state_dict``, ``reset``, ``stop``/``join``), so PyTorch's
``DataLoader``/``BatchedDataLoader`` and ``make_petastorm_dataset``/``make_tf_dataset`` take it.
"""

from __future__ import annotations

import copy
import numbers
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple, get_args

import numpy as np

from unihub.errors import SchemaError, UnihubError
from unihub.readers import elastic
from unihub.readers.reader import Reader, ReaderStateError, next_pass_seed, random_seed, start_over
from unihub.schema.unischema import Unischema, UnischemaField

#: draws whose uniforms one seeded generator makes at once
BLOCK = 1024
#: the last word of the draws' seed: without it, ``(seed, block)`` would be the stream a reader
#: seeded alike shuffles with (``plan.py`` seeds ``(seed, epoch)``), and the draws would follow its order
_STREAM = 0x57535231
STATE_VERSION = 2
STATE_KIND = "weighted_sampling"


class WeightedSamplingError(UnihubError, ValueError):
    """Readers or probabilities that cannot be mixed (Petastorm raised ``ValueError``)."""


class SchemaMismatchError(WeightedSamplingError, SchemaError):
    """The readers' rows do not share one schema: other field names, dtypes or shapes."""


class WeightsError(WeightedSamplingError):
    """Probabilities (weights) that cannot be drawn from: NaN or inf, negative, all 0, or not one per reader."""


# -- the sampling order: pure functions of (seed, draw index) ---------------------------------------
def normalize_probabilities(probabilities: Sequence[float], count: int) -> np.ndarray:
    """``probabilities`` scaled to sum to 1, checked: one per reader, finite, >= 0, not all 0
    (:class:`WeightsError` naming which)."""
    try:
        p = np.asarray(probabilities, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise WeightsError(f"probabilities must be numbers, got {probabilities!r}") from exc
    if p.ndim != 1 or len(p) != count:
        raise WeightsError(f"readers and probabilities are expected to be lists of the same length: "
                           f"{count} readers, probabilities {probabilities!r}")
    if not np.all(np.isfinite(p)):
        raise WeightsError(f"probabilities must be finite (no NaN or inf), got {probabilities!r}")
    if np.any(p < 0):
        raise WeightsError(f"probabilities must be >= 0, got {probabilities!r}")
    total = p.sum()
    if total <= 0:
        raise WeightsError(f"probabilities must not all be 0, got {probabilities!r}")
    return p / total


def _cumulative(probabilities: np.ndarray) -> np.ndarray:
    """Upper bounds of each reader's share of [0, 1); the last drawable one's (and those after it, of
    weight 0) exactly 1, so every uniform lands on a reader that can be drawn."""
    bounds = np.cumsum(probabilities)
    bounds[int(np.flatnonzero(probabilities > 0)[-1]):] = 1.0
    return bounds


def _block_uniforms(seed: int, block: int) -> np.ndarray:
    """The uniforms of draws ``block * BLOCK`` to ``(block + 1) * BLOCK - 1``."""
    return np.random.default_rng([seed, block, _STREAM]).random(BLOCK)


def _uniforms(seed: int, start: int, stop: int) -> np.ndarray:
    """The uniforms of draws ``start <= k < stop``."""
    if stop <= start:
        return np.empty(0, dtype=np.float64)
    first, last = start // BLOCK, (stop - 1) // BLOCK
    values = np.concatenate([_block_uniforms(seed, b) for b in range(first, last + 1)])
    return values[start - first * BLOCK:stop - first * BLOCK]


def draw_choices(seed: int, probabilities: Sequence[float], start: int, stop: int) -> np.ndarray:
    """Reader index of each draw ``start <= k < stop`` for ``seed`` and (normalised) ``probabilities``.

    What the mixer follows while the weights stay and no reader runs out; it depends on nothing
    else (not on the readers, their workers or how often the mixer was resumed). Draw ``k`` takes
    the reader whose share of [0, 1) holds the ``k``-th uniform, so weights changed at draw ``k``
    change the choices from ``k`` on and nothing before.
    """
    bounds = _cumulative(normalize_probabilities(probabilities, len(probabilities)))
    return np.searchsorted(bounds, _uniforms(seed, start, stop), side="right")  # Petastorm's rule: first bound > u


def _check_seed(seed: Any) -> int:
    if seed is None:
        return random_seed()
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise WeightedSamplingError(f"seed must be a non-negative integer or None, got {seed!r}")
    return int(seed)


# -- what makes readers mixable ----------------------------------------------------------------------
def _is_batched(reader: Any) -> bool:
    """unihub's ``batched``, or Petastorm's ``is_batched_reader``/``batched_output``."""
    for name in ("batched", "is_batched_reader", "batched_output"):
        value = getattr(reader, name, None)
        if value is not None:
            return bool(value)
    raise WeightedSamplingError(f"{type(reader).__name__} is not a reader: it has no batched, is_batched_reader "
                                "or batched_output attribute")


def _ngram_key(ngram: Any) -> Any:
    """What makes two NGrams mix (Petastorm's ``NGram.__eq__``): the same fields at the same offsets."""
    if ngram is None:
        return None
    return {offset: frozenset(getattr(f, "name", f) for f in fields) for offset, fields in ngram.fields.items()}


def _check_same_schema(first: Unischema, other: Unischema, index: int) -> None:
    names, other_names = set(first.fields), set(other.fields)
    if names != other_names:
        raise SchemaMismatchError(
            f"All readers passed to WeightedSamplingReader should have the same schema: reader {index} has fields "
            f"{sorted(other_names - names)} that reader 0 lacks and lacks {sorted(names - other_names)}; "
            "choose the same fields with schema_fields=")
    for name in first.fields:
        a, b = first[name], other[name]
        if a.numpy_dtype != b.numpy_dtype or a.shape != b.shape:
            raise SchemaMismatchError(
                f"All readers passed to WeightedSamplingReader should have the same schema: field {name!r} is "
                f"{_describe(a)} in reader 0 and {_describe(b)} in reader {index}; make them agree with a "
                "TransformSpec")


def _describe(field: UnischemaField) -> str:
    return f"{getattr(field.numpy_dtype, '__name__', field.numpy_dtype)} of shape {field.shape}"


def _check_mixable(readers: Sequence[Any]) -> None:
    """Petastorm's checks, in its order: row or batch alike, one schema, one NGram layout."""
    first = readers[0]
    for index, other in enumerate(readers[1:], start=1):
        if _is_batched(first) != _is_batched(other):
            raise WeightedSamplingError(
                'All readers passed to WeightedSamplingReader should have the same value of "batched_output" '
                f"attribute: reader 0 is a {_kind(first)} reader and reader {index} a {_kind(other)} reader; "
                "mix make_reader readers or make_batch_reader readers, not both")
        _check_same_schema(first.schema, other.schema, index)
        if _ngram_key(getattr(first, "ngram", None)) != _ngram_key(getattr(other, "ngram", None)):
            raise WeightedSamplingError(
                f"All readers passed to WeightedSamplingReader should have the same ngram spec: reader 0 has "
                f"{getattr(first, 'ngram', None)!r}, reader {index} {getattr(other, 'ngram', None)!r}")


def _kind(reader: Any) -> str:
    return "batch" if _is_batched(reader) else "row"


def _mixed_schema(schema: Unischema, schemas: Sequence[Unischema]) -> Unischema:
    """The first reader's schema; a field nullable in any reader is nullable in the mix."""
    nullable = {name for s in schemas for name, f in s.fields.items() if f.nullable}
    if all(f.nullable == (f.name in nullable) for f in schema):
        return schema
    return Unischema(schema.name, [UnischemaField(f.name, f.numpy_dtype, f.shape, f.codec, f.name in nullable)
                                   for f in schema])


def _reorder(source: Unischema, target: Unischema) -> Callable[[Any], Any] | None:
    """Rows of ``source``'s field order as rows of ``target``'s, or None when the orders agree."""
    names = list(source.fields)
    if names == list(target.fields):
        return None
    index = [names.index(name) for name in target.fields]
    row_type: type[Any] = target._get_namedtuple()  # a namedtuple class made for the schema
    return lambda row: row_type._make([row[i] for i in index])


def _converter(reader: Any, schema: Unischema, ngram: Any) -> Callable[[Any], Any] | None:
    """How an item of ``reader`` becomes one of the mix: positions follow the mix's field order, so
    consumers that read rows by position (the TensorFlow bridge) never swap columns."""
    if ngram is None:
        return _reorder(reader.schema, schema)
    reorders = {offset: _reorder(reader.ngram.get_schema_at_timestep(reader.schema, offset),
                                 ngram.get_schema_at_timestep(schema, offset)) for offset in ngram.fields}
    per_offset = {offset: fn for offset, fn in reorders.items() if fn is not None}
    if not per_offset:
        return None
    return lambda window: {k: per_offset[k](v) if k in per_offset else v for k, v in window.items()}


# -- the reader ---------------------------------------------------------------------------------------
#: what the mix does when a drawn reader has no row left (``on_exhausted=``)
OnExhausted = Literal["stop", "cycle", "drain"]
_MODES: tuple[str, ...] = get_args(OnExhausted)
_NEVER = 2**63  # the draw of "no weight change to come"


class WeightedSamplingReader:
    """Each ``next()`` draws a reader with the given probabilities and returns its next row (or batch).

    Petastorm's class and arguments: ``readers`` (two or more, all row readers or all batch
    readers, with the same fields, and the same NGram layout if any) and ``probabilities``
    (one per reader, normalised). Added:

    - ``seed``: the draws are a pure function of ``(seed, draw index)`` (None picks one, kept in the state);
    - ``on_exhausted``, what happens when the drawn reader has nothing left: ``"stop"`` (Petastorm's, the
      default) ends the mix; ``"cycle"`` starts that reader's next pass and takes its first row, so the mix
      never ends: a unihub reader's epochs again, each pass in an order of its own (its state at the start,
      ordered by :func:`~unihub.readers.reader.next_pass_seed` of the last pass's seed), another reader's
      ``start_over()``, else ``reset()``;
      ``"drain"`` takes that reader out and draws again with the weights renormalised over the others, so
      every row of every reader (of weight > 0) comes exactly once and the mix ends when all are drained;
    - :meth:`set_weights` mid-run (a curriculum): from the next draw on;
    - exact resume: :meth:`state_dict` after any item (it holds the weights in force, the drained
      readers and each reader's position, mid-cycle too), then :meth:`load_state_dict` or ``resume_from=`` on
      a mixer over new readers made with the same options, and the items not yet delivered come next, in
      the same order;
    - :meth:`skip_rows`: pass over rows at the cost of a resume, reading none of them;
    - elastic resume: where each rank mixes its shards of the sources (each reader made with
      ``cur_shard``/``shard_count``), ``resume_from=[state_0, ..., state_n]`` (every rank's state) on a mix of
      readers with any other shard count delivers its share of each source's rows no old rank delivered
      (:meth:`_load_states` says how the weights, passes and draws carry over).

        with WeightedSamplingReader([web, books], [0.8, 0.2], seed=0, on_exhausted="cycle") as mixer:
            for step, row in enumerate(mixer):
                if step == 10_000:
                    mixer.set_weights([0.5, 0.5])
    """

    def __init__(self, readers: Sequence[Any], probabilities: Sequence[float], seed: int | None = None, *,
                 on_exhausted: OnExhausted = "stop",
                 resume_from: dict[str, Any] | Sequence[dict[str, Any]] | None = None) -> None:
        readers = list(readers)
        if len(readers) <= 1:
            raise WeightedSamplingError(f"Two or more readers must be specified. Got {len(readers)}.")
        if on_exhausted not in _MODES:
            raise WeightedSamplingError(f"on_exhausted must be one of {list(_MODES)}, got {on_exhausted!r}")
        normalized = normalize_probabilities(probabilities, len(readers))
        _check_mixable(readers)
        self._readers = readers
        #: the seeds unihub's readers order their first pass by (each later one by next_pass_seed of the last's)
        self._first_seeds = [reader.seed if isinstance(reader, Reader) else None for reader in readers]
        self.on_exhausted: OnExhausted = on_exhausted
        #: the constructor's probabilities: a state saved by a mix made with others is refused
        self._initial: tuple[float, ...] = tuple(float(p) for p in normalized)
        self.probabilities: tuple[float, ...] = self._initial
        self._drained = [False] * len(readers)
        self._passes = [0] * len(readers)
        #: "cycle", for an elastic resume (:meth:`load_state_dict` of a list): each reader's state where its last
        #: pass ended, and what ranks of an earlier run delivered of its next pass (a reader state to load then)
        self._ended: list[dict[str, Any] | None] = [None] * len(readers)
        self._carry: list[dict[str, Any] | None] = [None] * len(readers)
        self._bounds: list[float] | None = _cumulative(normalized).tolist()
        self.seed = _check_seed(seed)
        self.batched = _is_batched(readers[0])
        self.ngram = getattr(readers[0], "ngram", None)
        self.schema = _mixed_schema(readers[0].schema, [r.schema for r in readers])
        self._convert = [_converter(r, self.schema, self.ngram) for r in readers]
        self._draws = 0
        #: this run's weight changes, (draw, weights), in order: those made here by set_weights, and those a
        #: loaded state brought (made after the position it saved: a loader reads ahead); _due is the next
        #: one not yet in force, _next_change its draw
        self._changes: list[tuple[int, tuple[float, ...]]] = []
        self._due, self._next_change = 0, _NEVER
        self._block = -1  # the block of draws whose choices (with the bounds in force) are in _choices
        self._choices: list[int] = []
        if resume_from is not None:
            self.load_state_dict(resume_from)

    # -- Petastorm's attributes -----------------------------------------------------------------------
    @property
    def readers(self) -> list[Any]:
        return list(self._readers)

    @property
    def batched_output(self) -> bool:
        return self.batched

    @property
    def is_batched_reader(self) -> bool:
        return self.batched

    @property
    def num_rows_per_epoch(self) -> None:
        """Unknown: where the mix ends depends on the draws."""
        return None

    @property
    def num_epochs(self) -> int | None:
        """None when the mix never ends (``"cycle"``, or a reader it can draw reads forever), else 1: one pass."""
        if self.on_exhausted == "cycle":
            return None
        drawable = [r for r, p in zip(self._readers, self.probabilities) if p > 0]
        forever = [getattr(r, "num_epochs", 1) is None for r in drawable]
        return None if (all(forever) if self.on_exhausted == "stop" else any(forever)) else 1

    # -- the weights ----------------------------------------------------------------------------------
    def set_weights(self, weights: Sequence[float]) -> None:
        """Draw with ``weights`` (one per reader, normalised) from the next draw on: a curriculum.

        Part of the state: a mix saved after the change resumes with it. Refused with
        :class:`WeightsError` (the weights in force stay) for NaN or inf, a negative weight, all 0
        or not one per reader. A weight on a drained reader (``"drain"``) draws nothing; when only
        drained readers have weight, the mix ends. A loader reading ahead of its consumer (its
        shuffling queue, the rows it gathers) has drawn those rows with the weights of then, and its
        ``state_dict()`` carries the change (:meth:`with_later_changes`), so a resumed loader changes the
        weights at the same draw. Changes a loaded state brought that are not yet in force are dropped.
        """
        normalized = tuple(float(p) for p in normalize_probabilities(weights, len(self._readers)))
        del self._changes[self._due:]
        self._changes.append((self._draws, normalized))
        self._due, self._next_change = len(self._changes), _NEVER
        self._use_weights(normalized)

    def _use_weights(self, weights: tuple[float, ...]) -> None:
        self.probabilities = weights
        self._bounds, self._block = self._drawable_bounds(), -1

    def _apply_due_changes(self) -> None:
        """Put in force the changes whose draw has come (those a loaded state brought)."""
        while self._due < len(self._changes) and self._changes[self._due][0] <= self._draws:
            self._use_weights(self._changes[self._due][1])
            self._due += 1
        self._next_change = self._changes[self._due][0] if self._due < len(self._changes) else _NEVER

    def with_later_changes(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` (saved by this mix earlier in this run) with the weight changes made since it was saved:
        what a loader that read ahead saves, so that its resume changes the weights where this run did."""
        draws = int(state.get("draws", 0))
        later = [(draw, weights) for draw, weights in self._changes if draw >= draws]
        if not later:
            return state
        earlier = [change for change in state.get("changes", ()) if int(change[0]) < later[0][0]]
        return dict(state, changes=earlier + [[draw, list(weights)] for draw, weights in later])

    def _drawable_bounds(self) -> list[float] | None:
        """The bounds the draws follow now: the weights without drained readers, renormalised (None: none left)."""
        weights = np.asarray(self.probabilities, dtype=np.float64)
        weights[np.asarray(self._drained)] = 0.0
        if not weights.sum() > 0:
            return None
        return _cumulative(weights / weights.sum()).tolist()

    # -- iteration ------------------------------------------------------------------------------------
    def __iter__(self) -> WeightedSamplingReader:
        return self

    def __next__(self) -> Any:
        draw = self._draws
        if draw >= self._next_change:
            self._apply_due_changes()
        block, i = divmod(draw, BLOCK)
        if block != self._block:  # a new block, or the bounds changed (weights set, a reader drained)
            if self._bounds is None:  # "drain": every reader that has weight is drained
                raise StopIteration
            uniforms = _block_uniforms(self.seed, block)
            self._choices = np.searchsorted(self._bounds, uniforms, side="right").tolist()  # first bound > u
            self._block = block
        source = self._choices[i]
        try:
            item = next(self._readers[source])
        except StopIteration:
            # "stop" (and a reader stopped from outside) ends the mix; the draw is not used up
            if self.on_exhausted == "stop" or getattr(self._readers[source], "stopped", False):
                raise
            if self.on_exhausted == "drain":
                self._drain(source)
                return self.__next__()  # as deep as there are readers to drain
            item = self._first_of_next_pass(source)
        self._draws = draw + 1
        convert = self._convert[source]
        return item if convert is None else convert(item)

    def next(self) -> Any:
        return self.__next__()

    def _first_of_next_pass(self, source: int) -> Any:
        """``"cycle"``: the first item of the next pass of ``source``, which ran out. A pass carried over an
        elastic resume may leave this rank nothing (other ranks delivered it): then the pass after it."""
        while True:
            fresh = self._start_pass(source)
            try:
                return next(self._readers[source])
            except StopIteration:
                if fresh:
                    raise _empty(source) from None

    def _start_pass(self, source: int) -> bool:
        """``"cycle"``: the reader that ran out starts its next pass (its own epochs, in that pass's order); True unless it
        starts the rest of a pass that ranks of an earlier run began (an elastic resume's carry)."""
        reader = self._readers[source]
        if callable(getattr(reader, "state_dict", None)):
            self._ended[source] = reader.state_dict()  # what an elastic resume counts this pass by
        carry, self._carry[source] = self._carry[source], None
        self._passes[source] += 1
        if carry is None:
            if isinstance(reader, Reader):  # its next pass in an order of its own
                reader.load_state_dict(reader.state_at_start(next_pass_seed(reader.seed)))
            else:
                start_over(reader)
            return True
        reader.load_state_dict(carry)  # a state of this reader, made by _load_source
        return False

    def _drain(self, source: int) -> None:
        """``"drain"``: the reader that ran out leaves the mix; its draw's uniform is used up."""
        self._drained[source] = True
        self._draws += 1
        self._bounds, self._block = self._drawable_bounds(), -1

    # -- skipping ahead -------------------------------------------------------------------------------
    def skip_rows(self, count: int) -> int:
        """Pass over the next ``count`` rows as if read and dropped, reading none of them; returns the rows
        skipped (fewer where the mix ends first).

        The draws are known from ``(seed, draw index)``, so each reader skips its share with its own
        ``skip_rows`` (a resume's cost: unihub's readers compute the position from their plan); a reader
        that runs out in between stops, restarts or leaves the mix as ``next()`` would have it. Row mixers of
        readers that can skip (unihub's, without predicate, filters or n-grams) only:
        :class:`WeightedSamplingError` otherwise.
        """
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
            raise WeightedSamplingError(f"skip_rows() takes a count >= 0, got {count!r}")
        if self.batched or self.ngram is not None:
            raise WeightedSamplingError("skip_rows() skips rows of a row mix; this mix draws batches or n-gram "
                                        "windows, whose rows are known only by reading them")
        for index, reader in enumerate(self._readers):
            if not callable(getattr(reader, "skip_rows", None)):
                raise WeightedSamplingError(f"reader {index} ({type(reader).__name__}) has no skip_rows(); "
                                            "skipping without reading needs unihub readers")
        skipped, left, restarted = 0, int(count), -1
        while left:
            self._apply_due_changes()
            if self._bounds is None:
                break
            span = min(left, self._next_change - self._draws)  # not past a weight change
            choices = np.searchsorted(self._bounds, _uniforms(self.seed, self._draws, self._draws + span),
                                      side="right")
            short = self._skip_shares(choices)
            if short is None:
                self._draws += span
                skipped, left = skipped + span, left - span
                continue
            ran_out = int(choices[short])  # draw `short` takes a reader that has nothing left
            self._skip_shares(choices[:short])
            self._draws += short
            skipped, left = skipped + short, left - short
            if self.on_exhausted == "stop":
                break
            if self.on_exhausted == "cycle":
                if restarted == ran_out and short == 0:
                    raise _empty(ran_out)
                restarted = ran_out if self._start_pass(ran_out) else -1
            else:
                self._drain(ran_out)
        return skipped

    def _skip_shares(self, choices: np.ndarray) -> int | None:
        """Each reader skips the draws ``choices`` give it; None when all could, else (every reader put back
        where it was) the first draw whose reader had nothing left."""
        counts = np.bincount(choices, minlength=len(self._readers))
        before = [reader.state_dict() for reader in self._readers]
        short: list[int] = []
        for source, reader in enumerate(self._readers):
            if counts[source]:
                got = reader.skip_rows(int(counts[source]))
                if got < counts[source]:
                    short.append(int(np.flatnonzero(choices == source)[got]))
        if not short:
            return None
        for reader, state in zip(self._readers, before):
            reader.load_state_dict(state)
        return min(short)

    # -- position -------------------------------------------------------------------------------------
    @property
    def keeps_state(self) -> bool:
        """Whether every reader mixed has a ``state_dict()`` (Petastorm's test mocks have none): the PyTorch
        loaders then track the mix's position; without it they read it, and only their ``state_dict()`` refuses."""
        return all(callable(getattr(reader, "state_dict", None)) for reader in self._readers)

    def state_dict(self) -> dict[str, Any]:
        """The position after the last delivered item (JSON-able): the draw count, seed, weights in force,
        drained readers, passes each reader started over, weight changes still to come (a loaded state's) and
        each reader's own state; with ``"cycle"``, where each reader's last pass ended and what ranks of an
        earlier run delivered of its next pass (``ended``, ``carry``: what an elastic resume needs)."""
        states = []
        for index, reader in enumerate(self._readers):
            if not callable(getattr(reader, "state_dict", None)):
                raise WeightedSamplingError(f"reader {index} ({type(reader).__name__}) has no state_dict(); "
                                            "exact resume needs unihub readers")
            states.append(reader.state_dict())
        return {"version": STATE_VERSION, "kind": STATE_KIND, "seed": self.seed, "draws": self._draws,
                "probabilities": list(self._initial), "weights": list(self.probabilities),
                "on_exhausted": self.on_exhausted, "drained": list(self._drained), "passes": list(self._passes),
                "changes": [[draw, list(weights)] for draw, weights in self._changes[self._due:]],
                "readers": states, "ended": copy.deepcopy(self._ended), "carry": copy.deepcopy(self._carry)}

    def load_state_dict(self, state: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        """Continue from ``state``: the next item is the first one not delivered before it was saved.

        The state's weights (a curriculum's change) replace those in force. A refused state (another
        version, other probabilities at construction, another ``on_exhausted`` or other readers) leaves
        the mixer as it was.

        Given a list, the states every rank of a run saved (each rank mixing its shards of the sources),
        this mix resumes the run elastically, with its readers' shard count whatever it was
        (:meth:`_load_states`).
        """
        if isinstance(state, (list, tuple)):
            self._load_states(state)
            return
        parsed = self._parse_state(state)
        self._load_readers(lambda index, reader: reader.load_state_dict(parsed.readers[index]))
        self._resume(parsed, parsed.draws, parsed.passes, parsed.drained)
        self._ended, self._carry = parsed.ended, parsed.carry

    def _load_states(self, states: Sequence[Any]) -> None:
        """Elastic resume: :meth:`load_state_dict` of every rank's state of a run, on any number of ranks.

        Each reader gets the list of its source's states of all old ranks (the reader's list form), so it
        delivers its equal share of that source's rows no old rank delivered in its epoch (``pad``/``drop`` as
        its options say), later epochs as a fresh run with its shard count. With ``"cycle"`` ranks can be a pass
        apart: a rank that started the source over counts with the state where its pass ended, and what it
        delivered of the next pass is kept (``carry``) for the new ranks' next pass; states further apart are
        refused. The weights in force and the changes still due are those of the rank that drew most (ranks
        draw alike; a later state holds a curriculum's latest change). The draws: every new rank draws as
        :func:`draw_choices` says for the run's seed from draw ``D`` on, ``D`` the most draws of any old rank,
        so they are a function of the seed and the states resumed, the same on every new rank and every resume
        from them. Nothing is drained (a source whose share of the rest is empty drains at its first draw);
        each source's pass count is the lowest of the old ranks'. Refused (:class:`ReaderStateError`, the
        mixer as it was): states of mixes of other sizes, probabilities, modes or seeds, sources more than a
        pass apart, and what each reader refuses of its list (named by its source).
        """
        if not states:
            raise ReaderStateError("resume_from=[] holds no state: pass every rank's state_dict() of the run")
        parsed = []
        for k, state in enumerate(states):
            try:
                parsed.append(self._parse_state(state))
            except ReaderStateError as exc:
                raise ReaderStateError(f"state {k} of the list: {exc}") from None
            if isinstance(state, dict) and (state.get("skip") or state.get("exclude")):
                raise ReaderStateError(f"state {k} of the list carries rows a loader delivered after it (skip, "
                                       "exclude): which source's rows they are is not known here; a mix resumes "
                                       "elastically from its own states (a loader's without rows read ahead)")
        seeds = sorted({p.seed for p in parsed})
        if len(seeds) > 1:
            raise ReaderStateError(f"the ranks' mix states have different seeds {seeds}: their draws were not one "
                                   "stream; pass the same seed= to the mix on every rank")
        count = len(self._readers)
        lists = [_source_lists(parsed, source, _pass_start(reader)) for source, reader in enumerate(self._readers)]
        carry = self._load_readers(lambda index, reader: _load_source(reader, index, *lists[index]))
        lead = max(parsed, key=lambda p: p.draws)  # the first of those that drew most
        self._resume(lead, lead.draws, [min(p.passes[s] for p in parsed) for s in range(count)], [False] * count)
        self._ended, self._carry = [None] * count, carry

    def _load_readers(self, load: Callable[[int, Any], Any]) -> list[Any]:
        """``load(index, reader)`` of each reader, and what each returned; where one raises, every reader is put
        back where it was (a refused state leaves the mixer as it was)."""
        before = [reader.state_dict() for reader in self._readers]
        out = []
        for index, reader in enumerate(self._readers):
            try:
                out.append(load(index, reader))
            except Exception:
                for loaded, old in zip(self._readers[:index + 1], before):
                    loaded.load_state_dict(old)
                raise
        return out

    def _resume(self, saved: _Saved, draws: int, passes: list[int], drained: list[bool]) -> None:
        """The sampler as ``saved`` has it (seed, weights, changes due), at ``draws``."""
        self.seed, self._draws, self._block = saved.seed, draws, -1
        self._drained, self._passes = list(drained), list(passes)
        self._changes, self._due = list(saved.changes), 0
        self._use_weights(saved.weights)
        self._apply_due_changes()

    def _parse_state(self, state: Any) -> _Saved:
        """``state`` checked against this mix (readers, probabilities at construction, ``on_exhausted``);
        a :class:`ReaderStateError` says what does not fit."""
        _check_state_keys(state)
        count = len(self._readers)
        if not isinstance(state["readers"], list) or not all(isinstance(s, dict) for s in state["readers"]):
            raise ReaderStateError("the state's 'readers' is not a list of reader states; pass what state_dict() "
                                   "returned")
        states = list(state["readers"])
        if len(states) != count:
            raise ReaderStateError(f"the state was saved by a mix of {len(states)} readers, this one has {count}")
        try:
            saved = np.asarray(state["probabilities"], dtype=np.float64)
        except (TypeError, ValueError):
            raise ReaderStateError(f"the state's probabilities {state['probabilities']!r} are not numbers; pass what "
                                   "state_dict() returned") from None
        if saved.shape != (count,) or not np.allclose(saved, self._initial, rtol=0, atol=1e-12):
            raise ReaderStateError(f"the state was saved with probabilities {saved.tolist()}, this mix has "
                                   f"{list(self._initial)}")
        mode = state.get("on_exhausted", "stop")  # version 1: Petastorm's end, the only one then
        if mode != self.on_exhausted:
            raise ReaderStateError(f"the state was saved by a mix with on_exhausted={mode!r}, this one has "
                                   f"{self.on_exhausted!r}")
        weights, changes = _saved_weights(state, saved, count)
        seed, draws, drained, passes = _saved_progress(state, count)
        if [draw for draw, _ in changes] != sorted(draw for draw, _ in changes):
            raise ReaderStateError("the state's weight changes are not in draw order; pass what state_dict() returned")
        return _Saved(seed, draws, weights, drained, passes, changes, states,
                      _reader_states(state, "ended", count), _reader_states(state, "carry", count))

    # -- lifecycle ------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Start every reader and the draws over (what the PyTorch loaders call to iterate again)."""
        self.start_over()

    def start_over(self) -> None:
        """:meth:`reset`, from anywhere: the other readers stopped mid-epoch when one ran out. The weights
        in force stay (a curriculum's change is not undone); drained readers come back."""
        for reader, seed in zip(self._readers, self._first_seeds):
            start_over(reader)
            if seed is not None and reader.seed != seed:  # the first pass's order again
                reader.load_state_dict(reader.state_at_start(seed))
        self._draws = 0
        self._changes, self._due, self._next_change = [], 0, _NEVER  # a new run: its own changes
        self._drained = [False] * len(self._readers)
        self._passes = [0] * len(self._readers)
        self._ended, self._carry = [None] * len(self._readers), [None] * len(self._readers)
        self._bounds, self._block = self._drawable_bounds(), -1

    def stop(self) -> None:
        """Stop every reader; a ``next()`` then raises :class:`~unihub.errors.UsageError` (a RuntimeError,
        as Petastorm's readers raise after ``stop()``)."""
        for reader in self._readers:
            reader.stop()

    def join(self) -> None:
        for reader in self._readers:
            reader.join()

    def __enter__(self) -> WeightedSamplingReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        self.join()

    @property
    def diagnostics(self) -> dict[str, Any]:
        return {"draws": self._draws, "seed": self.seed, "weights": list(self.probabilities),
                "on_exhausted": self.on_exhausted, "drained": list(self._drained), "passes": list(self._passes),
                "readers": [getattr(r, "diagnostics", None) for r in self._readers]}


def _check_state_keys(state: Any) -> None:
    """Refuse what is not a WeightedSamplingReader state of a known version with all of its keys."""
    if not isinstance(state, dict) or state.get("kind") != STATE_KIND or \
            state.get("version") not in (1, STATE_VERSION):
        found = (state.get("kind"), state.get("version")) if isinstance(state, dict) else type(state).__name__
        raise ReaderStateError(f"not a WeightedSamplingReader state of version {STATE_VERSION} (found {found!r}); "
                               "pass what its state_dict() returned")
    keys = {"seed", "draws", "probabilities", "readers"} | \
        ({"weights", "on_exhausted", "drained", "passes"} if state["version"] == STATE_VERSION else set())
    missing = sorted(keys - set(state))
    if missing:
        raise ReaderStateError(f"the WeightedSamplingReader state lacks {missing}; pass what state_dict() returned")
    if state.get("skip") or state.get("exclude"):  # a loader's rows past the position: its own to pass over
        raise ReaderStateError("the WeightedSamplingReader state names rows past its position to pass over "
                               "(skip, exclude): a mix does not; load the loader's state into the loader that saved it")


def _saved_weights(state: dict[str, Any], saved: np.ndarray, count: int
                   ) -> tuple[tuple[float, ...], list[tuple[int, tuple[float, ...]]]]:
    """The state's weights in force (its probabilities at construction in version 1) and its weight changes
    still due, each normalized, the changes checked to be in draw order."""
    try:
        weights = normalize_probabilities(state.get("weights", saved), count)
    except WeightsError as exc:
        raise ReaderStateError(f"the state's weights are not usable: {exc}") from None
    try:
        changes = [(int(draw), tuple(float(w) for w in normalize_probabilities(weights, count)))
                   for draw, weights in state.get("changes", ())]
    except (TypeError, ValueError) as exc:
        raise ReaderStateError(f"the state's weight changes are not usable: {exc}") from None
    return tuple(float(w) for w in weights), changes


def _saved_progress(state: dict[str, Any], count: int) -> tuple[int, int, list[bool], list[int]]:
    """The state's seed, draws, and each reader's drained flag and passes (version 1: none drained, no pass)."""
    drained, passes = state.get("drained", [False] * count), state.get("passes", [0] * count)
    seed, draws = state["seed"], state["draws"]
    if not (elastic.is_count(seed) and elastic.is_count(draws) and isinstance(drained, list) and isinstance(passes, list)
            and len(drained) == count and len(passes) == count and all(isinstance(d, bool) for d in drained)
            and all(elastic.is_count(p) for p in passes)):
        raise ReaderStateError(f"a state's seed, draws and passes are >= 0 and it has a drained flag and pass "
                               f"count per reader, got seed={seed}, draws={draws}, drained={drained}, "
                               f"passes={passes}")
    return int(seed), int(draws), list(drained), [int(p) for p in passes]


class _Saved(NamedTuple):
    """A checked :meth:`WeightedSamplingReader.state_dict`."""

    seed: int
    draws: int
    weights: tuple[float, ...]
    drained: list[bool]
    passes: list[int]
    changes: list[tuple[int, tuple[float, ...]]]
    readers: list[dict[str, Any]]
    ended: list[dict[str, Any] | None]
    carry: list[dict[str, Any] | None]


def _reader_states(state: dict[str, Any], key: str, count: int) -> list[dict[str, Any] | None]:
    """The state's ``ended`` or ``carry``: a reader state or None per reader (None: states saved before them)."""
    values = state.get(key, [None] * count)
    if not isinstance(values, list) or len(values) != count or \
            not all(v is None or isinstance(v, dict) for v in values):
        raise ReaderStateError(f"the state's {key!r} is not a reader state or None per reader; pass what "
                               "state_dict() returned")
    return [copy.deepcopy(v) for v in values]


# -- elastic resume: the sources' lists of states -------------------------------------------------------
def _pass_start(reader: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The state at the start of the pass after a state's, for the shard that saved it: ordered by the next pass's
    seed (a unihub reader's), else the same (readers that start over in their one order)."""
    if isinstance(reader, Reader):
        return lambda state: reader.state_at_start(next_pass_seed(elastic.seed_of(state)), state)
    return lambda state: elastic.at_start(state, *state.get("shard", (0, 1)), fresh=True)


def _source_lists(parsed: Sequence[_Saved], source: int, next_start: Callable[[dict[str, Any]], dict[str, Any]]
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The reader states of ``source`` to resume its current pass from (one per old rank), and those of its
    next pass where ranks had begun it (None: it starts afresh).

    The current pass is the lowest of the ranks'. A rank a pass ahead counts in it with the state where its
    pass ended, and in the next with its own; a rank in it counts in the next with what it carried of it (an
    earlier elastic resume's) or as having delivered none of it (its state at the start).
    """
    passes = [p.passes[source] for p in parsed]
    first = min(passes)
    if max(passes) > first + 1:
        raise ReaderStateError(f"source {source}: the ranks' states are {max(passes) - first} passes apart "
                               f"(on_exhausted='cycle' started it over {first} to {max(passes)} times); an elastic "
                               "resume takes ranks at most a pass apart: resume from states saved closer together")
    now, after, begun = [], [], False
    for k, p in enumerate(parsed):
        state, ended, carry = p.readers[source], p.ended[source], p.carry[source]
        if passes[k] == first:
            now.append(state)
            after.append(carry if carry is not None else next_start(state))
            begun = begun or carry is not None
            continue
        if ended is None:
            raise ReaderStateError(f"source {source}: state {k} of the list started pass {passes[k]} but keeps no "
                                   f"state of where pass {first} ended (saved before elastic resume of mixes)")
        now.append(ended)
        after.append(state)
        begun = True
    return now, after if begun else None


def _load_source(reader: Any, source: int, now: list[dict[str, Any]], after: list[dict[str, Any]] | None
                 ) -> dict[str, Any] | None:
    """``reader`` (of ``source``) at its share of the rest of the current pass; returns, where ranks had begun
    the next pass, a state of the reader that delivers its share of the rest of that one (the carry)."""
    if not callable(getattr(reader, "load_state_dict", None)):
        raise ReaderStateError(f"source {source} ({type(reader).__name__}) has no load_state_dict(); "
                               "elastic resume needs unihub readers")
    try:
        carry = None
        if after is not None:
            reader.load_state_dict(after)
            carry = reader.state_dict()
        reader.load_state_dict(now)
    except ReaderStateError as exc:
        raise ReaderStateError(f"source {source}: {exc}") from None
    return carry


def _empty(source: int) -> WeightedSamplingError:
    return WeightedSamplingError(f'reader {source} has no rows: on_exhausted="cycle" would start it over forever; '
                                 "leave it out of the mix, or give it rows")
