"""``WeightedSamplingReader``: rows (or batches) drawn from several readers at given probabilities.

Petastorm's ``petastorm.weighted_sampling_reader.WeightedSamplingReader`` with its arguments,
checks and end (the mix ends when a drawn reader has nothing left), plus ``seed`` and exact
resume. Which reader the ``k``-th draw takes is a pure function of ``(seed, k)``
(:func:`draw_choices`): uniforms come in blocks of :data:`BLOCK` from a generator seeded
``(seed, block, stream tag)``, so the sampler's whole state is its seed and draw count, and
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

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from unihub.errors import SchemaError, UnihubError
from unihub.formats.schema import Unischema, UnischemaField
from unihub.readers.reader import ReaderStateError, random_seed, start_over

#: draws whose uniforms one seeded generator makes at once
BLOCK = 1024
#: the last word of the draws' seed: without it, ``(seed, block)`` would be the stream a reader
#: seeded alike shuffles with (``plan.py`` seeds ``(seed, epoch)``), and the draws would follow its order
_STREAM = 0x57535231
STATE_VERSION = 1
STATE_KIND = "weighted_sampling"


class WeightedSamplingError(UnihubError, ValueError):
    """Readers or probabilities that cannot be mixed (Petastorm raised ``ValueError``)."""


class SchemaMismatchError(WeightedSamplingError, SchemaError):
    """The readers' rows do not share one schema: other field names, dtypes or shapes."""


# -- the sampling order: pure functions of (seed, draw index) ---------------------------------------
def normalize_probabilities(probabilities: Sequence[float], count: int) -> np.ndarray:
    """``probabilities`` scaled to sum to 1, checked: one per reader, finite, >= 0, not all 0."""
    try:
        p = np.asarray(probabilities, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise WeightedSamplingError(f"probabilities must be numbers, got {probabilities!r}") from exc
    if p.ndim != 1 or len(p) != count:
        raise WeightedSamplingError(f"readers and probabilities are expected to be lists of the same length: "
                                    f"{count} readers, probabilities {probabilities!r}")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise WeightedSamplingError(f"probabilities must be finite and >= 0, got {probabilities!r}")
    total = p.sum()
    if total <= 0:
        raise WeightedSamplingError(f"probabilities must not all be 0, got {probabilities!r}")
    return p / total


def _cumulative(probabilities: np.ndarray) -> np.ndarray:
    """Upper bounds of each reader's share of [0, 1); the last is exactly 1 so every uniform lands."""
    bounds = np.cumsum(probabilities)
    bounds[-1] = 1.0
    return bounds


def _block_choices(seed: int, bounds: np.ndarray, block: int) -> np.ndarray:
    """Reader index of draws ``block * BLOCK`` to ``(block + 1) * BLOCK - 1``."""
    uniforms = np.random.default_rng([seed, block, _STREAM]).random(BLOCK)
    return np.searchsorted(bounds, uniforms, side="right")  # Petastorm's rule: first bound > u


def draw_choices(seed: int, probabilities: Sequence[float], start: int, stop: int) -> np.ndarray:
    """Reader index of each draw ``start <= k < stop`` for ``seed`` and (normalised) ``probabilities``.

    What the mixer follows; it depends on nothing else (not on the readers, their workers or
    how often the mixer was resumed).
    """
    bounds = _cumulative(normalize_probabilities(probabilities, len(probabilities)))
    if stop <= start:
        return np.empty(0, dtype=np.int64)
    first, last = start // BLOCK, (stop - 1) // BLOCK
    picks = np.concatenate([_block_choices(seed, bounds, b) for b in range(first, last + 1)])
    return picks[start - first * BLOCK:stop - first * BLOCK]


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
class WeightedSamplingReader:
    """Each ``next()`` draws a reader with the given probabilities and returns its next row (or batch).

    Petastorm's class and arguments: ``readers`` (two or more, all row readers or all batch
    readers, with the same fields, and the same NGram layout if any) and ``probabilities``
    (one per reader, normalised). The iteration ends when the drawn reader has nothing left,
    as Petastorm's. Added: ``seed`` (the draws are a pure function of ``(seed, draw index)``;
    None picks one, kept in the state) and exact resume: :meth:`state_dict` after any item,
    then :meth:`load_state_dict` or ``resume_from=`` on a mixer over new readers made with the
    same options, and the items not yet delivered come next, in the same order.
    """

    def __init__(self, readers: Sequence[Any], probabilities: Sequence[float], seed: int | None = None, *,
                 resume_from: dict[str, Any] | None = None) -> None:
        readers = list(readers)
        if len(readers) <= 1:
            raise WeightedSamplingError(f"Two or more readers must be specified. Got {len(readers)}.")
        normalized = normalize_probabilities(probabilities, len(readers))
        _check_mixable(readers)
        self._readers = readers
        self.probabilities: tuple[float, ...] = tuple(float(p) for p in normalized)
        self._bounds = _cumulative(normalized)
        self.seed = _check_seed(seed)
        self.batched = _is_batched(readers[0])
        self.ngram = getattr(readers[0], "ngram", None)
        self.schema = _mixed_schema(readers[0].schema, [r.schema for r in readers])
        self._convert = [_converter(r, self.schema, self.ngram) for r in readers]
        self._draws = 0
        self._block = -1
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
        """None when the mix never ends (every reader it can draw reads forever), else 1: one pass."""
        drawable = [r for r, p in zip(self._readers, self.probabilities) if p > 0]
        return None if all(getattr(r, "num_epochs", 1) is None for r in drawable) else 1

    # -- iteration ------------------------------------------------------------------------------------
    def __iter__(self) -> WeightedSamplingReader:
        return self

    def __next__(self) -> Any:
        draw = self._draws
        block, i = divmod(draw, BLOCK)
        if block != self._block:
            self._choices = _block_choices(self.seed, self._bounds, block).tolist()
            self._block = block
        source = self._choices[i]
        item = next(self._readers[source])  # its StopIteration ends the mix; the draw is not used up
        self._draws = draw + 1
        convert = self._convert[source]
        return item if convert is None else convert(item)

    def next(self) -> Any:
        return self.__next__()

    # -- position -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The position after the last delivered item: the draw count, seed and each reader's state (JSON-able)."""
        states = []
        for index, reader in enumerate(self._readers):
            if not callable(getattr(reader, "state_dict", None)):
                raise WeightedSamplingError(f"reader {index} ({type(reader).__name__}) has no state_dict(); "
                                            "exact resume needs unihub readers")
            states.append(reader.state_dict())
        return {"version": STATE_VERSION, "kind": STATE_KIND, "seed": self.seed, "draws": self._draws,
                "probabilities": list(self.probabilities), "readers": states}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next item is the first one not delivered before it was saved.

        A refused state (another version, other probabilities or readers) leaves the mixer as it was.
        """
        seed, draws, states = self._parse_state(state)
        before = [reader.state_dict() for reader in self._readers]
        for index, (reader, reader_state) in enumerate(zip(self._readers, states)):
            try:
                reader.load_state_dict(reader_state)
            except Exception:
                for loaded, old in zip(self._readers[:index], before):
                    loaded.load_state_dict(old)
                raise
        self.seed, self._draws, self._block = seed, draws, -1

    def _parse_state(self, state: Any) -> tuple[int, int, list[dict[str, Any]]]:
        if not isinstance(state, dict) or state.get("kind") != STATE_KIND or state.get("version") != STATE_VERSION:
            found = (state.get("kind"), state.get("version")) if isinstance(state, dict) else type(state).__name__
            raise ReaderStateError(f"not a WeightedSamplingReader state of version {STATE_VERSION} (found {found!r}); "
                                   "pass what its state_dict() returned")
        missing = sorted({"seed", "draws", "probabilities", "readers"} - set(state))
        if missing:
            raise ReaderStateError(f"the WeightedSamplingReader state lacks {missing}; pass what state_dict() returned")
        states = list(state["readers"])
        if len(states) != len(self._readers):
            raise ReaderStateError(f"the state was saved by a mix of {len(states)} readers, this one has "
                                   f"{len(self._readers)}")
        saved = np.asarray(state["probabilities"], dtype=np.float64)
        if saved.shape != (len(self._readers),) or not np.allclose(saved, self.probabilities, rtol=0, atol=1e-12):
            raise ReaderStateError(f"the state was saved with probabilities {list(saved)}, this mix has "
                                   f"{list(self.probabilities)}")
        seed, draws = int(state["seed"]), int(state["draws"])
        if seed < 0 or draws < 0:
            raise ReaderStateError(f"a state's seed and draws are >= 0, got seed={seed}, draws={draws}")
        return seed, draws, states

    # -- lifecycle ------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Start every reader and the draws over (what the PyTorch loaders call to iterate again)."""
        self.start_over()

    def start_over(self) -> None:
        """:meth:`reset`, from anywhere: the other readers stopped mid-epoch when one ran out."""
        for reader in self._readers:
            start_over(reader)
        self._draws = 0

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
        return {"draws": self._draws, "seed": self.seed,
                "readers": [getattr(r, "diagnostics", None) for r in self._readers]}
