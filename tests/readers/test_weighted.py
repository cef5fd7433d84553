"""WeightedSamplingReader: Petastorm's checks and behaviour, the draws as a pure function of
(seed, draw index), sampling statistics, exact resume, batch and NGram readers.

Two small datasets (ids 0..79 and 1000..1059, row groups of 4 rows over several files) are
written once per module, so a row's id says which reader it came from; Petastorm's own
fixture datasets (``tests/fixtures/petastorm``) are mixed too.
"""

from __future__ import annotations

import itertools
import json
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from unihub import (
    NGram,
    ScalarCodec,
    SchemaError,
    TensorCodec,
    UnihubError,
    Unischema,
    UnischemaField,
    WeightedSamplingReader,
    in_lambda,
    make_batch_reader,
    make_reader,
    write_dataset,
)
from unihub.readers.reader import ReaderStateError
from unihub.readers.weighted import BLOCK, SchemaMismatchError, WeightedSamplingError, draw_choices

from .sample import within

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm"
UNISCHEMA = str(FIXTURES / "unischema")  # 60 rows, ids 0..59, 3 row groups of 20
PLAIN = str(FIXTURES / "plain")  # 600 rows, no Unischema
A_IDS, B_IDS = range(0, 80), range(1000, 1060)

SCHEMA = Unischema("Mix", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("vec", np.float32, (3,), TensorCodec(), False),
    UnischemaField("label", np.int32, (), ScalarCodec(pa.int32()), True),
])


def row(i: int) -> dict[str, Any]:
    return {"id": i, "vec": np.full(3, i, np.float32), "label": None if i % 7 == 0 else i % 5}


def write(path: Path, ids: range, schema: Unischema = SCHEMA) -> str:
    write_dataset(path, schema, (row(i) for i in ids), row_group_size_mb=0.0002, rows_per_file=20)
    return str(path)


@pytest.fixture(scope="module")
def urls(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("weighted")
    return write(root / "a", A_IDS), write(root / "b", B_IDS)


def ids(items: Any) -> list[int]:
    return [int(r.id) for r in items]


def source_of(i: int) -> int:
    return 0 if i < 1000 else 1


class FakeReader:
    """Petastorm's ReaderMock: endless rows ``{'id': value}`` and no state."""

    schema = Unischema("Fake", [UnischemaField("id", np.int64, (), None, False)])
    batched_output = False
    ngram = None

    def __init__(self, value: int) -> None:
        self.value = value
        self.stopped = self.joined = False

    def __next__(self) -> Any:
        return self.schema.make_namedtuple(id=self.value)

    def stop(self) -> None:
        self.stopped = True

    def join(self) -> None:
        self.joined = True


def count_mixed(probabilities: list[float], draws: int, seed: int = 0) -> list[int]:
    readers = [FakeReader(i) for i in range(len(probabilities))]
    counts = [0] * len(probabilities)
    with WeightedSamplingReader(readers, probabilities, seed=seed) as mixer:
        for _ in range(draws):
            counts[next(mixer).id] += 1
    assert all(r.stopped and r.joined for r in readers)
    return counts


# -- Petastorm's behaviour ------------------------------------------------------------------------------
def test_select_only_one_of_readers():
    assert count_mixed([1.0, 0.0], 500) == [500, 0]
    assert count_mixed([0.0, 1.0], 500) == [0, 500]
    assert count_mixed([0.0, 1.0, 0.0], 500) == [0, 500, 0]
    assert count_mixed([0.0, 0.0, 1.0], 500) == [0, 0, 500]


def test_probabilities_are_normalized():
    assert count_mixed([10, 90], 3000, seed=4) == count_mixed([0.1, 0.9], 3000, seed=4)
    mixer = WeightedSamplingReader([FakeReader(0), FakeReader(1)], [1, 3])
    assert mixer.probabilities == (0.25, 0.75)


@pytest.mark.parametrize("readers, probabilities, match", [
    ([FakeReader(1)], [0.1, 0.9], "Two or more readers"),
    ([FakeReader(0), FakeReader(1)], [1.0], "same length"),
    ([FakeReader(0), FakeReader(1)], [0.5, -0.1], ">= 0"),
    ([FakeReader(0), FakeReader(1)], [0.5, float("nan")], "finite"),
    ([FakeReader(0), FakeReader(1)], [0, 0], "not all be 0"),
    ([FakeReader(0), FakeReader(1)], ["a", "b"], "numbers"),
])
def test_bad_arguments(readers, probabilities, match):
    with pytest.raises(WeightedSamplingError, match=match) as info:
        WeightedSamplingReader(readers, probabilities)
    assert isinstance(info.value, ValueError) and isinstance(info.value, UnihubError)


@pytest.mark.parametrize("seed", [-1, 1.5, True, "3"])
def test_bad_seed(seed):
    with pytest.raises(WeightedSamplingError, match="seed"):
        WeightedSamplingReader([FakeReader(0), FakeReader(1)], [1, 1], seed=seed)


def test_schema_mismatch_is_refused():
    with make_reader(UNISCHEMA, schema_fields=["id"]) as a, make_reader(UNISCHEMA, schema_fields=["label"]) as b:
        with pytest.raises(ValueError, match=".*should have the same schema.*") as info:
            WeightedSamplingReader([a, b], [0.5, 0.5])
    assert isinstance(info.value, SchemaMismatchError) and isinstance(info.value, SchemaError)


def test_dtype_mismatch_names_the_field(urls, tmp_path):
    other = Unischema("Other", [SCHEMA.id, UnischemaField("vec", np.float64, (3,), TensorCodec(), False), SCHEMA.label])
    write_dataset(tmp_path / "c", other, ({**row(i), "vec": np.zeros(3)} for i in range(8)))
    with make_reader(urls[0]) as a, make_reader(str(tmp_path / "c")) as c:
        with pytest.raises(SchemaMismatchError, match="field 'vec' is float32 of shape \\(3,\\) in reader 0 and "
                                                      "float64 of shape \\(3,\\) in reader 1"):
            WeightedSamplingReader([a, c], [1, 1])


def test_row_and_batch_readers_do_not_mix(urls):
    with make_reader(urls[0]) as rows, make_batch_reader(urls[1]) as batches:
        with pytest.raises(WeightedSamplingError, match='"batched_output".*row reader.*batch reader'):
            WeightedSamplingReader([rows, batches], [0.5, 0.5])


def test_ends_when_a_drawn_reader_is_exhausted(urls):
    """As Petastorm's: the first draw of an exhausted reader ends the mix, other readers' rows or not."""
    with make_reader(urls[0], num_epochs=None, shuffle_row_groups=False) as a, \
            make_reader(urls[1], shuffle_row_groups=False) as b, WeightedSamplingReader([a, b], [0.5, 0.5], seed=1) as mixer:
        got = ids(mixer)
        with pytest.raises(StopIteration):
            next(mixer)  # stays ended
    picks = draw_choices(1, [0.5, 0.5], 0, len(got) + 1).tolist()
    assert [source_of(i) for i in got] == picks[:-1]
    assert picks[-1] == 1 and sum(picks[:-1]) == len(B_IDS)  # the draw after B's last row ended it
    assert [i for i in got if i >= 1000] == list(B_IDS)


# -- the draws -----------------------------------------------------------------------------------------
def test_draws_are_a_pure_function_of_seed_and_index(urls):
    probabilities = [0.3, 0.7]
    whole = draw_choices(11, probabilities, 0, 3 * BLOCK)
    assert np.array_equal(np.concatenate([draw_choices(11, probabilities, s, min(s + 500, 3 * BLOCK))
                                          for s in range(0, 3 * BLOCK, 500)]), whole)
    assert not np.array_equal(draw_choices(12, probabilities, 0, 3 * BLOCK), whole)
    with make_reader(urls[0], num_epochs=None, schema_fields=["id"]) as a, \
            make_reader(urls[1], num_epochs=None, schema_fields=["id"]) as b:
        mixer = WeightedSamplingReader([a, b], probabilities, seed=11)
        assert [source_of(i) for i in ids(itertools.islice(mixer, 2 * BLOCK + 5))] == whole[:2 * BLOCK + 5].tolist()


def test_draws_are_not_a_readers_stream_seeded_alike():
    """A reader seeded 7 shuffles epoch 0 with default_rng([7, 0]); a mixer seeded 7 must not draw from it."""
    bounds = np.array([0.5, 1.0])
    readers_stream = np.searchsorted(bounds, np.random.default_rng([7, 0]).random(BLOCK), side="right")
    assert not np.array_equal(draw_choices(7, [0.5, 0.5], 0, BLOCK), readers_stream)


def test_same_seed_same_rows(urls):
    def run(seed: int | None) -> list[int]:
        with make_reader(urls[0], seed=1, shuffle_rows=True, workers_count=2) as a, \
                make_reader(urls[1], seed=2, shuffle_rows=True, workers_count=2) as b:
            return ids(WeightedSamplingReader([a, b], [0.4, 0.6], seed=seed))

    assert run(5) == run(5)
    assert run(5) != run(6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shares_follow_the_probabilities(urls, seed):
    """4,000 draws at (0.2, 0.8): each reader's share within 4 standard deviations of the binomial."""
    draws, p = 4000, 0.2
    with make_reader(urls[0], num_epochs=None, schema_fields=["id"], workers_count=1) as a, \
            make_reader(urls[1], num_epochs=None, schema_fields=["id"], workers_count=1) as b:
        got = ids(itertools.islice(WeightedSamplingReader([a, b], [0.2, 0.8], seed=seed), draws))
    from_a = sum(1 for i in got if i < 1000)
    assert len(got) == draws
    assert abs(from_a - draws * p) <= 4 * math.sqrt(draws * p * (1 - p)), from_a  # +-101 rows: 2.5 points


def test_shares_over_petastorm_datasets():
    """Petastorm's test_real_reader on Petastorm's own dataset: even and odd ids mixed 0.2/0.8."""
    draws = 3000
    readers = [make_reader(UNISCHEMA, schema_fields=["id", "label"], num_epochs=None, workers_count=1,
                           predicate=in_lambda(["id"], lambda i, parity=parity: i % 2 == parity)) for parity in (0, 1)]
    with WeightedSamplingReader(readers, [0.2, 0.8], seed=9) as mixer:
        odd = sum(int(r.id) % 2 for r in itertools.islice(mixer, draws))
    assert abs(odd - 0.8 * draws) <= 4 * math.sqrt(draws * 0.2 * 0.8)


# -- exact resume --------------------------------------------------------------------------------------
def shuffling_readers(urls: tuple[str, str], pool: str = "thread") -> list[Any]:
    options = dict(shuffle_rows=True, shuffle_row_groups=True, workers_count=2, reader_pool_type=pool)
    return [make_reader(urls[0], seed=3, num_epochs=2, **options), make_reader(urls[1], seed=4, num_epochs=2, **options)]


def mixer_over(urls: tuple[str, str], pool: str = "thread", **kwargs: Any) -> WeightedSamplingReader:
    return WeightedSamplingReader(shuffling_readers(urls, pool), [0.45, 0.55], seed=kwargs.pop("seed", 21), **kwargs)


@pytest.fixture(scope="module")
def full_order(urls) -> list[int]:
    with mixer_over(urls) as mixer:
        order = ids(mixer)
    assert len(set(order)) < len(order) - len(B_IDS)  # both readers' second epochs repeat ids: cuts cross them
    return order


def serialize(state: dict[str, Any], how: str) -> dict[str, Any]:
    if how == "json":
        return json.loads(json.dumps(state))
    if how == "pickle":
        return pickle.loads(pickle.dumps(state))
    return state


@pytest.mark.parametrize("how", ["resume_from", "load_state_dict", "json", "pickle"])
@pytest.mark.parametrize("cut", [0, 1, 37, 96, "last", "end"])
def test_exact_resume(urls, full_order, cut, how):
    k = {"last": len(full_order) - 1, "end": len(full_order)}.get(cut, cut)
    with mixer_over(urls) as first:
        head = ids(itertools.islice(first, k))
        if cut == "end":
            assert next(first, None) is None
        state = serialize(first.state_dict(), how)
    assert head == full_order[:k]
    if how == "load_state_dict":
        second = mixer_over(urls, seed=99)  # the saved seed wins, as a Reader's does
        second.load_state_dict(state)
    else:
        second = mixer_over(urls, resume_from=state)
    with second:
        assert ids(second) == full_order[k:], f"resumed after {k} rows ({how})"


def test_exact_resume_in_process_pools(urls, full_order):
    with mixer_over(urls) as first:
        head = ids(itertools.islice(first, 50))
        state = first.state_dict()
    with mixer_over(urls, pool="process", resume_from=json.loads(json.dumps(state))) as second:
        assert head + within(60, lambda: ids(second)) == full_order


def test_resume_with_random_seeds(urls):
    """seed=None everywhere: the state carries every seed."""
    def make(**kwargs: Any) -> WeightedSamplingReader:
        readers = [make_reader(u, shuffle_rows=True, workers_count=2, schema_fields=["id"]) for u in urls]
        return WeightedSamplingReader(readers, [0.5, 0.5], **kwargs)

    with make() as first:
        next(first)
        state = first.state_dict()
        rest = ids(first)
    with make(resume_from=json.loads(json.dumps(state))) as second:
        assert ids(second) == rest


def test_load_state_dict_rewinds_a_running_mixer(urls, full_order):
    with mixer_over(urls) as mixer:
        ids(itertools.islice(mixer, 20))
        state = mixer.state_dict()
        ids(itertools.islice(mixer, 30))
        mixer.load_state_dict(state)
        assert ids(mixer) == full_order[20:]


def test_reset_starts_over(urls, full_order):
    with mixer_over(urls) as mixer:
        ids(itertools.islice(mixer, 40))
        mixer.reset()
        assert ids(mixer) == full_order
        mixer.reset()
        assert ids(mixer) == full_order


@pytest.mark.parametrize("change, match", [
    (lambda s: {**s, "version": 9}, "version"),
    (lambda s: {**s, "kind": "reader"}, "WeightedSamplingReader state"),
    (lambda s: {k: v for k, v in s.items() if k != "draws"}, "lacks \\['draws'\\]"),
    (lambda s: {**s, "readers": s["readers"][:1]}, "mix of 1 readers"),
    (lambda s: {**s, "probabilities": [0.5, 0.5]}, "probabilities"),
    (lambda s: {**s, "readers": [s["readers"][0], {**s["readers"][1], "plan": "0"}]}, "another dataset"),
    (lambda s: s["readers"][0], "WeightedSamplingReader state"),
    (lambda s: {**s, "skip": 3, "exclude": [1]}, "rows past its position"),  # once silently delivered again
    (lambda s: {**s, "draws": s["draws"] + 0.5}, "seed, draws and passes"),  # once read as int(): other readers drawn
    (lambda s: {**s, "seed": str(s["seed"])}, "seed, draws and passes"),
    (lambda s: {**s, "draws": None}, "seed, draws and passes"),  # once a raw TypeError
    (lambda s: {**s, "passes": ["x", 0]}, "seed, draws and passes"),  # once a raw ValueError
    (lambda s: {**s, "drained": [1, 0]}, "drained flag"),
    # values state_dict() never writes: raw TypeError, ValueError or OverflowError before
    (lambda s: {**s, "seed": None}, "seed, draws and passes"),
    (lambda s: {**s, "draws": "7"}, "seed, draws and passes"),
    (lambda s: {**s, "draws": math.inf}, "seed, draws and passes"),
    (lambda s: {**s, "passes": None}, "seed, draws and passes"),
    (lambda s: {**s, "drained": [None, 1]}, "seed, draws and passes"),
    (lambda s: {**s, "probabilities": None}, "probabilities"),
    (lambda s: {**s, "probabilities": ["x", "y"]}, "probabilities"),
    (lambda s: {**s, "readers": None}, "'readers'"),
    (lambda s: {**s, "readers": [None, None]}, "'readers'"),
])
def test_a_refused_state_leaves_the_mixer_as_it_was(urls, full_order, change, match):
    with mixer_over(urls) as mixer:
        ids(itertools.islice(mixer, 30))
        bad = change(mixer.state_dict())
        with pytest.raises(ReaderStateError, match=match) as info:
            mixer.load_state_dict(bad)
        assert isinstance(info.value, ValueError)
        assert ids(mixer) == full_order[30:]


@pytest.mark.parametrize("seed", [None, "x", math.inf, -1])
def test_every_ranks_states_with_a_source_seed_not_a_count_are_refused(urls, full_order, seed):
    """Before: the list form took int() of each source's seed first: a raw TypeError, ValueError or OverflowError."""
    with mixer_over(urls) as mixer:
        ids(itertools.islice(mixer, 30))
        state = mixer.state_dict()
        bad = {**state, "readers": [{**state["readers"][0], "seed": seed}, state["readers"][1]]}
        with pytest.raises(ReaderStateError, match="seed"):
            mixer.load_state_dict([bad])
        assert ids(mixer) == full_order[30:]


def test_state_of_readers_without_state_is_refused():
    mixer = WeightedSamplingReader([FakeReader(0), FakeReader(1)], [1, 1])
    with pytest.raises(WeightedSamplingError, match="reader 0 \\(FakeReader\\) has no state_dict"):
        mixer.state_dict()


# -- batch readers, NGram readers, field order -----------------------------------------------------------
def test_batch_readers_mix_and_resume(urls):
    def make(**kwargs: Any) -> WeightedSamplingReader:
        readers = [make_batch_reader(u, seed=s, workers_count=2, shuffle_rows=True) for s, u in enumerate(urls)]
        return WeightedSamplingReader(readers, [0.5, 0.5], seed=2, **kwargs)

    with make() as mixer:
        assert mixer.batched and mixer.batched_output and mixer.is_batched_reader
        batches = [b.id.tolist() for b in mixer]
    assert all(set(map(source_of, b)) in ({0}, {1}) for b in batches)
    assert [source_of(b[0]) for b in batches] == draw_choices(2, [0.5, 0.5], 0, len(batches)).tolist()
    with make() as first:
        head = [b.id.tolist() for b in itertools.islice(first, 5)]
        state = json.loads(json.dumps(first.state_dict()))
    with make(resume_from=state) as second:
        assert head + [b.id.tolist() for b in second] == batches


def test_batch_readers_over_petastorm_plain_parquet():
    readers = [make_batch_reader(PLAIN, predicate=in_lambda(["id"], lambda i, parity=parity: i % 2 == parity),
                                 workers_count=1, num_epochs=None) for parity in (0, 1)]
    with WeightedSamplingReader(readers, [0.5, 0.5], seed=0) as mixer:
        assert list(mixer.schema.fields) == ["id", "label", "x", "name", "pair"]
        for batch in itertools.islice(mixer, 6):
            assert len(set(batch.id % 2)) == 1 and len(batch.id) == len(batch.pair)


def ngram_reader(fields: dict[int, list[str]], **kwargs: Any) -> Any:
    ngram = NGram(fields=fields, delta_threshold=10, timestamp_field="^id$")
    return make_reader(UNISCHEMA, schema_fields=ngram, workers_count=1, **kwargs)


def test_ngram_readers_mix_and_resume():
    """Petastorm's test_ngram_mix on its own dataset: windows {-1: (id), 0: (id, label)} from both readers."""
    fields = {-1: ["id"], 0: ["id", "label"]}

    def make(**kwargs: Any) -> WeightedSamplingReader:
        readers = [ngram_reader(fields, seed=1, shuffle_rows=True), ngram_reader(fields, seed=2, num_epochs=2)]
        return WeightedSamplingReader(readers, [0.5, 0.5], seed=3, **kwargs)

    with make() as mixer:
        assert mixer.ngram is not None
        windows = list(mixer)
    assert windows and all(set(w) == {-1, 0} and w[0]._fields == ("id", "label") for w in windows)
    assert all(w[0].id - w[-1].id <= 10 for w in windows)
    with make() as first:
        head = list(itertools.islice(first, 7))
        state = json.loads(json.dumps(first.state_dict()))
    with make(resume_from=state) as second:
        assert [(w[-1].id, w[0].id) for w in head + list(second)] == [(w[-1].id, w[0].id) for w in windows]


def test_ngram_mismatch_is_refused():
    with ngram_reader({-1: ["id"], 0: ["id", "label"]}) as a, ngram_reader({-1: ["id", "label"], 0: ["id"]}) as b:
        with pytest.raises(WeightedSamplingError, match=".*ngram.*"):
            WeightedSamplingReader([a, b], [0.5, 0.5])
    with ngram_reader({-1: ["id"], 0: ["id", "label"]}) as a, make_reader(UNISCHEMA, schema_fields=["id", "label"]) as b:
        with pytest.raises(WeightedSamplingError, match=".*ngram.*"):
            WeightedSamplingReader([a, b], [0.5, 0.5])


def test_rows_follow_the_first_readers_field_order(urls, tmp_path):
    """A dataset with the same fields in another order: its rows are re-ordered, never read by position wrongly."""
    swapped = Unischema("Swapped", [SCHEMA.label, SCHEMA.id, SCHEMA.vec])
    url = write(tmp_path / "swapped", range(2000, 2010), swapped)
    with make_reader(urls[0], num_epochs=None) as a, make_reader(url) as b:
        mixer = WeightedSamplingReader([a, b], [0.5, 0.5], seed=0)
        rows = list(mixer)
    row_type = mixer.schema._get_namedtuple()
    assert {r.id for r in rows if r.id >= 2000} == set(range(2000, 2010))
    for r in rows:
        assert r._fields == ("id", "vec", "label") and tuple(r) == (r.id, r.vec, r.label)
        assert isinstance(r[1], np.ndarray) and float(r[1][0]) == r.id
    assert any(type(r) is row_type for r in rows if r.id >= 2000)


def test_ngram_windows_follow_the_first_readers_field_order(urls, tmp_path):
    swapped = Unischema("Swapped", [SCHEMA.label, SCHEMA.vec, SCHEMA.id])
    url = write(tmp_path / "swapped", range(2000, 2012), swapped)

    def ngram() -> NGram:
        return NGram({0: ["id", "vec", "label"], 1: ["label", "id"]}, delta_threshold=1, timestamp_field="id")

    with make_reader(urls[0], schema_fields=ngram()) as a, make_reader(url, schema_fields=ngram()) as b:
        windows = list(WeightedSamplingReader([a, b], [0.5, 0.5], seed=0))
    assert any(w[0].id >= 2000 for w in windows)
    for w in windows:
        assert w[0]._fields == ("id", "vec", "label") and w[1]._fields == ("id", "label")
        assert w[0][0] == w[0].id and float(w[0][1][0]) == w[0].id and w[1][0] == w[0].id + 1


def test_a_field_nullable_in_any_reader_is_nullable_in_the_mix(urls, tmp_path):
    strict = Unischema("Strict", [SCHEMA.id, SCHEMA.vec, UnischemaField("label", np.int32, (), ScalarCodec(pa.int32()),
                                                                         False)])
    write_dataset(tmp_path / "s", strict, ({**row(i), "label": 1} for i in range(4)))
    with make_reader(str(tmp_path / "s")) as s, make_reader(urls[0]) as a:
        assert WeightedSamplingReader([s, a], [1, 1]).schema.label.nullable


def test_stop_ends_the_iteration(urls):
    with make_reader(urls[0], num_epochs=None) as a, make_reader(urls[1], num_epochs=None) as b:
        mixer = WeightedSamplingReader([a, b], [0.5, 0.5])
        assert mixer.num_epochs is None and mixer.num_rows_per_epoch is None
        next(mixer)
        mixer.stop()
        mixer.join()
        with pytest.raises(RuntimeError, match="stopped"):
            next(mixer)
        assert mixer.diagnostics["draws"] == 1


def test_exported_from_unihub():
    import unihub
    from unihub.readers.weighted import WeightedSamplingReader as direct

    assert unihub.WeightedSamplingReader is direct and "WeightedSamplingReader" in unihub.__all__
