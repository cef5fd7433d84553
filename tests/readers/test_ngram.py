"""NGram: Petastorm's window rules, checked against a brute-force restatement, and through make_reader."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from unihub import (
    ScalarCodec,
    SchemaError,
    TensorCodec,
    UnihubError,
    Unischema,
    UnischemaField,
    in_lambda,
    write_dataset,
)
from unihub.errors import InvalidArgumentError
from unihub.readers.loader import Batch
from unihub.readers.ngram import NGram
from unihub.readers.reader import make_batch_reader, make_reader

POOLS = ("thread", "process", "dummy")
GROUP = 20      # rows per row group (one file each)
NUM_ROWS = 120
DELTA = 3

Schema = Unischema("Seq", [
    UnischemaField("idx", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("ts", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("value", np.float32, (), ScalarCodec(pa.float32()), False),
    UnischemaField("vec", np.float32, (2,), TensorCodec(), False),
    UnischemaField("sensor", np.str_, (), ScalarCodec(pa.string()), False),
])


def make_timestamps() -> np.ndarray:
    """Increasing timestamps: steps of 1-3 (within DELTA) and some of 10 (gaps that break windows)."""
    steps = np.random.default_rng(7).choice([1, 2, 3, 10], size=NUM_ROWS, p=[0.4, 0.25, 0.2, 0.15])
    return np.cumsum(steps).astype(np.int64)


TS = make_timestamps()


def make_row(i: int) -> dict:
    return {"idx": i, "ts": int(TS[i]), "value": float(i) / 2, "vec": np.array([i, -i], dtype=np.float32),
            "sensor": f"s{i % 4}"}


def brute_force(ts_groups: list[list], length: int, delta, overlap: bool = True) -> list[tuple]:
    """Petastorm's ``form_ngram`` loop, restated: windows (as tuples of timestamps) per sorted group."""
    out = []
    for group in ts_groups:
        group = sorted(group)
        prev_end = None
        for i in range(len(group) - length + 1):
            window = group[i:i + length]
            if not overlap and prev_end is not None and window[0] <= prev_end:
                continue
            if all(b - a <= delta for a, b in zip(window[:-1], window[1:])):
                out.append(tuple(window))
                if not overlap:
                    prev_end = window[-1]
    return out


def expected_windows(length: int, overlap: bool = True) -> list[tuple]:
    groups = [TS[g:g + GROUP].tolist() for g in range(0, NUM_ROWS, GROUP)]
    return brute_force(groups, length, DELTA, overlap)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    """Row groups of GROUP rows, in timestamp order across groups but shuffled inside each group."""
    url = str(tmp_path_factory.mktemp("ngram") / "seq")
    rng = np.random.default_rng(3)
    order = np.concatenate([g + rng.permutation(GROUP) for g in range(0, NUM_ROWS, GROUP)])
    write_dataset(url, Schema, [make_row(int(i)) for i in order], rows_per_file=GROUP)
    return url


def batch_of(ts, **columns) -> Batch:
    ts = np.asarray(ts)
    return Batch({"ts": ts, **{k: np.asarray(v) for k, v in columns.items()}}, len(ts))


def ts_only_schema() -> Unischema:
    return Unischema("S", [UnischemaField("ts", np.int64, (), ScalarCodec(pa.int64())),
                           UnischemaField("x", np.float32, (), ScalarCodec(pa.float32()))])


def resolved(fields, delta, overlap=True, schema=None) -> NGram:
    ngram = NGram(fields, delta, "ts", timestamp_overlap=overlap)
    ngram.resolve_regex_field_names(schema or ts_only_schema())
    return ngram


def window_ts(windows: list[dict], key: int = 0) -> list:
    return [int(w[key].ts) for w in windows]


# -- the object ------------------------------------------------------------------------------------------
def test_attributes_and_timesteps():
    ngram = NGram({1: ["x"], -1: ["ts", "x"]}, 5, "ts")
    assert ngram.length == 3
    assert ngram.delta_threshold == 5 and ngram.timestamp_overlap is True
    ngram.resolve_regex_field_names(ts_only_schema())
    assert ngram.timestamp_field == ts_only_schema().ts
    assert sorted(ngram.fields) == [-1, 1]
    assert ngram.fields[-1] == [ts_only_schema().ts, ts_only_schema().x]
    assert ngram.get_field_names_at_timestep(0) == []
    assert sorted(ngram.get_field_names_at_all_timesteps()) == ["ts", "x"]
    view = ngram.get_schema_at_timestep(ts_only_schema(), 1)
    assert list(view.fields) == ["x"]
    assert list(ngram.get_schema_at_timestep(ts_only_schema(), 0).fields) == []


def test_equality_is_by_fields_per_offset_timestamp_threshold_and_overlap():
    schema = ts_only_schema()
    ngram = NGram({0: ["ts", "x"], 1: ["x"]}, 5, "ts")
    same = NGram({1: [schema.x], 0: ["x", schema.ts]}, 5, schema.ts)
    assert ngram == same and hash(ngram) == hash(same) and not ngram != same
    before = hash(ngram)
    ngram.resolve_regex_field_names(schema)
    assert hash(ngram) == before and ngram == same  # resolving changes neither
    assert ngram != NGram({0: ["ts", "x"], 1: ["ts"]}, 5, "ts")
    assert ngram != NGram({0: ["ts", "x"], 2: ["x"]}, 5, "ts")
    assert ngram != NGram({0: ["ts", "x"], 1: ["x"]}, 6, "ts")
    assert ngram != NGram({0: ["ts", "x"], 1: ["x"]}, 5, "ts", timestamp_overlap=False)
    assert ngram != {0: ["ts", "x"], 1: ["x"]}
    assert len({ngram, same}) == 1


def test_timestamp_field_is_read_even_when_no_offset_lists_it():
    ngram = resolved({0: ["x"], 1: ["x"]}, 1)
    assert sorted(ngram.get_field_names_at_all_timesteps()) == ["ts", "x"]
    windows = ngram.form_windows(batch_of([0, 1, 5], x=np.float32([10, 11, 15])), ts_only_schema())
    assert [(float(w[0].x), float(w[1].x)) for w in windows] == [(10.0, 11.0)]
    assert windows[0][0]._fields == ("x",)


@pytest.mark.parametrize("kwargs", [
    {"fields": {}},
    {"fields": None},
    {"fields": [["ts"]]},
    {"fields": {0.5: ["ts"]}},
    {"fields": {0: "ts"}},
    {"fields": {0: [3]}},
    {"delta_threshold": "5"},
    {"delta_threshold": None},
    {"delta_threshold": True},
    {"delta_threshold": -1},
    {"delta_threshold": float("nan")},
    {"timestamp_field": 3},
    {"timestamp_field": None},
    {"timestamp_overlap": "no"},
    {"timestamp_overlap": None},
])
def test_bad_arguments_are_schema_errors(kwargs):
    arguments = {"fields": {0: ["ts"], 1: ["ts"]}, "delta_threshold": 5, "timestamp_field": "ts",
                 "timestamp_overlap": True, **kwargs}
    with pytest.raises(SchemaError):
        NGram(**arguments)


def test_resolution_errors_name_the_problem():
    with pytest.raises(SchemaError, match="time_stamp"):
        NGram({0: ["ts"]}, 1, "time_stamp").resolve_regex_field_names(ts_only_schema())
    with pytest.raises(SchemaError, match="nope"):
        NGram({0: ["nope"]}, 1, "ts").resolve_regex_field_names(ts_only_schema())
    with pytest.raises(SchemaError, match="exactly one"):
        NGram({0: ["ts"]}, 1, "ts|x").resolve_regex_field_names(ts_only_schema())
    with pytest.raises(SchemaError, match="sensor"):
        NGram({0: ["ts"]}, 1, "sensor").resolve_regex_field_names(Schema)


# -- forming windows from one batch --------------------------------------------------------------------
def test_petastorm_docstring_cases():
    ts = [0, 3, 8, 10, 11, 20, 30]
    fields = {-1: ["ts", "x"], 0: ["ts"]}
    batch = batch_of(ts, x=np.float32(ts))
    windows = resolved(fields, 4).form_windows(batch, ts_only_schema())
    assert [(int(w[-1].ts), int(w[0].ts)) for w in windows] == [(0, 3), (8, 10), (10, 11)]
    assert windows[0][-1]._fields == ("ts", "x") and windows[0][0]._fields == ("ts",)
    assert resolved(fields, 4).form_windows(batch_of([0, 10, 20, 30], x=np.zeros(4)), ts_only_schema()) == []


def test_threshold_is_inclusive_and_unsorted_rows_are_sorted():
    ngram = resolved({0: ["ts"], 1: ["ts"], 2: ["ts"]}, 2)
    windows = ngram.form_windows(batch_of([9, 5, 1, 3, 7, 10]), ts_only_schema())
    assert [tuple(int(w[k].ts) for k in range(3)) for w in windows] == [(1, 3, 5), (3, 5, 7), (5, 7, 9), (7, 9, 10)]


def test_non_contiguous_offsets_have_an_empty_middle():
    windows = resolved({-1: ["ts"], 1: ["x"]}, 1).form_windows(batch_of([0, 1, 2, 3], x=np.float32([0, 1, 2, 3])),
                                                               ts_only_schema())
    assert len(windows) == 2
    assert list(windows[0]) == [-1, 0, 1]
    assert windows[0][0] == () and windows[0][0]._fields == ()
    assert [(int(w[-1].ts), float(w[1].x)) for w in windows] == [(0, 2.0), (1, 3.0)]


def test_no_overlap_follows_petastorms_timestamp_rule():
    # duplicate timestamps: a window starting at a timestamp the previous window ended on is skipped
    ts = [0, 1, 1, 2, 3, 3, 4, 5, 9, 10, 11, 12]
    ngram = resolved({0: ["ts"], 1: ["ts"]}, 1, overlap=False)
    windows = ngram.form_windows(batch_of(ts), ts_only_schema())
    got = [(int(w[0].ts), int(w[1].ts)) for w in windows]
    assert got == brute_force([ts], 2, 1, overlap=False) == [(0, 1), (2, 3), (4, 5), (9, 10), (11, 12)]
    ngram3 = resolved({0: ["ts"], 1: ["ts"], 2: ["ts"]}, 2, overlap=False)
    got3 = [tuple(int(w[k].ts) for k in range(3)) for w in ngram3.form_windows(batch_of(ts), ts_only_schema())]
    assert got3 == brute_force([ts], 3, 2, overlap=False)


@pytest.mark.parametrize("length, delta, overlap", [(1, 0, True), (2, 1, True), (3, 2, True), (4, 3, False),
                                                    (3, 0, True), (2, 2, False)])
def test_random_batches_match_brute_force(length, delta, overlap):
    rng = np.random.default_rng(length * 10 + delta)
    for _ in range(20):
        ts = rng.integers(0, 40, size=int(rng.integers(0, 30)))
        ngram = resolved({k: ["ts"] for k in range(length)}, delta, overlap)
        windows = ngram.form_windows(batch_of(ts.astype(np.int64)), ts_only_schema())
        got = [tuple(int(w[k].ts) for k in range(length)) for w in windows]
        assert got == brute_force([ts.tolist()], length, delta, overlap)


def test_null_timestamps_are_in_no_window():
    ts = np.empty(5, dtype=object)
    ts[:] = [np.int64(0), None, np.int64(1), np.int64(2), None]
    windows = resolved({0: ["ts"], 1: ["ts"]}, 1).form_windows(batch_of(ts), ts_only_schema())
    assert [(int(w[0].ts), int(w[1].ts)) for w in windows] == [(0, 1), (1, 2)]


def test_float_timestamps_and_a_missing_timestamp_column():
    windows = resolved({0: ["ts"], 1: ["ts"]}, 0.5).form_windows(batch_of([0.0, 0.5, 1.2, 1.6]), ts_only_schema())
    assert [(float(w[0].ts), float(w[1].ts)) for w in windows] == [(0.0, 0.5), (1.2, 1.6)]
    with pytest.raises(SchemaError, match="ts"):
        resolved({0: ["x"]}, 1).form_windows(Batch({"x": np.zeros(3)}, 3), ts_only_schema())


# -- make_reader --------------------------------------------------------------------------------------------
FIELDS = {-2: ["ts", "vec"], 0: ["idx", "sensor"], 1: ["idx"]}


def check_window(window: dict) -> tuple:
    """Assert a window holds consecutive rows of one row group; return its timestamps."""
    assert list(window) == [-2, -1, 0, 1]
    start = int(np.searchsorted(TS, int(window[-2].ts)))
    assert TS[start] == window[-2].ts
    assert window[-1] == ()
    assert int(window[0].idx) == start + 2 and int(window[1].idx) == start + 3
    assert window[0].sensor == f"s{(start + 2) % 4}"
    np.testing.assert_array_equal(window[-2].vec, [start, -start])
    assert start // GROUP == (start + 3) // GROUP, "a window crosses a row group"
    assert all(TS[k + 1] - TS[k] <= DELTA for k in range(start, start + 3))
    return tuple(int(t) for t in TS[start:start + 4])


def read_windows(url: str, ngram: NGram, **kwargs) -> list[dict]:
    kwargs.setdefault("shuffle_row_groups", False)
    with make_reader(url, schema_fields=ngram, **kwargs) as reader:
        return list(reader)


@pytest.mark.parametrize("pool", POOLS)
def test_reader_windows_match_brute_force_in_every_pool(dataset, pool):
    windows = read_windows(dataset, NGram(FIELDS, DELTA, "ts"), reader_pool_type=pool, workers_count=2)
    assert [check_window(w) for w in windows] == expected_windows(4)
    assert len(windows) > 10


def test_reader_pools_agree_with_shuffled_row_groups(dataset):
    results = [[check_window(w) for w in read_windows(dataset, NGram(FIELDS, DELTA, "ts"), reader_pool_type=pool,
                                                      workers_count=3, shuffle_row_groups=True, seed=11)]
               for pool in POOLS]
    assert results[0] == results[1] == results[2]
    assert sorted(results[0]) == sorted(expected_windows(4))


def test_reader_schema_and_gaps(dataset):
    with make_reader(dataset, schema_fields=NGram(FIELDS, DELTA, "ts")) as reader:
        assert set(reader.schema.fields) == {"idx", "ts", "vec", "sensor"}
        assert reader.num_rows_per_epoch is None
    assert any(TS[k] - TS[k - 1] > DELTA for k in range(1, NUM_ROWS)), "the data must contain gaps"
    # a threshold above every step: every run of 4 rows inside a row group, none across groups
    wide = read_windows(dataset, NGram(FIELDS, 10, "ts"))
    assert len(wide) == (NUM_ROWS // GROUP) * (GROUP - 3)
    assert {int(w[-2].ts) for w in wide} == {int(TS[g + k]) for g in range(0, NUM_ROWS, GROUP) for k in range(GROUP - 3)}
    narrow = read_windows(dataset, NGram(FIELDS, DELTA, "ts"))
    assert 0 < len(narrow) < len(wide)  # check_window (in the other tests) asserts no window spans a gap


def test_reader_without_overlap(dataset):
    ngram = NGram({0: ["ts"], 1: ["ts"], 2: ["ts"]}, DELTA, "ts", timestamp_overlap=False)
    windows = read_windows(dataset, ngram)
    got = [tuple(int(w[k].ts) for k in range(3)) for w in windows]
    assert got == expected_windows(3, overlap=False)
    flat = [t for window in got for t in window]
    assert len(flat) == len(set(flat))


def test_reader_with_regex_field_names(dataset):
    ngram = NGram({0: ["v.*", "t."], 1: ["^idx$"]}, DELTA, "t[s]")
    windows = read_windows(dataset, ngram)
    assert windows[0][0]._fields == ("ts", "value", "vec") and windows[0][1]._fields == ("idx",)
    got = [(int(w[0].ts), int(w[1].idx)) for w in windows]
    expected = [(w[0], int(np.searchsorted(TS, w[1]))) for w in expected_windows(2)]
    assert got == expected
    assert all(float(w[0].value) == float(np.searchsorted(TS, w[0].ts)) / 2 for w in windows)


def test_shuffle_rows_still_gives_sorted_windows(dataset):
    windows = read_windows(dataset, NGram(FIELDS, DELTA, "ts"), shuffle_rows=True, seed=5)
    assert sorted(check_window(w) for w in windows) == sorted(expected_windows(4))


@pytest.mark.parametrize("shuffle_rows", [False, True])
def test_resume_mid_epoch_delivers_the_remaining_windows(dataset, shuffle_rows):
    options = {"shuffle_row_groups": True, "shuffle_rows": shuffle_rows, "seed": 21}
    full = [check_window(w) for w in read_windows(dataset, NGram(FIELDS, DELTA, "ts"), **options)]
    with make_reader(dataset, schema_fields=NGram(FIELDS, DELTA, "ts"), **options) as reader:
        head = [check_window(next(reader)) for _ in range(7)]
        state = reader.state_dict()
    with make_reader(dataset, schema_fields=NGram(FIELDS, DELTA, "ts"), resume_from=state, **options) as reader:
        tail = [check_window(w) for w in reader]
    assert head + tail == full


def test_two_epochs_repeat_the_windows(dataset):
    windows = read_windows(dataset, NGram(FIELDS, DELTA, "ts"), num_epochs=2)
    once = expected_windows(4)
    assert [check_window(w) for w in windows] == once + once


def test_one_ngram_object_serves_two_datasets(dataset, tmp_path):
    ngram = NGram({0: ["ts"], 1: ["ts"]}, DELTA, "ts")
    read_windows(dataset, ngram)
    other_schema = Unischema("Other", [UnischemaField("ts", np.int64, (), ScalarCodec(pa.int64()), False)])
    url = str(tmp_path / "other")
    write_dataset(url, other_schema, ({"ts": t} for t in [0, 1, 2, 10]))
    windows = read_windows(url, ngram)
    assert [(int(w[0].ts), int(w[1].ts)) for w in windows] == [(0, 1), (1, 2)]


def test_batch_reader_refuses_ngrams(dataset):
    with pytest.raises(UnihubError, match="NGram"):
        make_batch_reader(dataset, schema_fields=NGram(FIELDS, DELTA, "ts"))


@pytest.fixture(scope="module")
def sorted_dataset(tmp_path_factory) -> str:
    """The rows in timestamp order, as NGram readers expect (Petastorm's requirement too)."""
    url = str(tmp_path_factory.mktemp("ngram_sorted") / "seq")
    write_dataset(url, Schema, [make_row(i) for i in range(NUM_ROWS)], rows_per_file=GROUP)
    return url


@pytest.mark.parametrize("pool", POOLS)
def test_drop_partitions_lose_no_window_at_their_cuts(sorted_dataset, pool):
    """Each partition reads NGram length - 1 rows past its end, so windows across a cut survive."""
    whole = expected_windows(4)
    for parts in (2, 3, 7):
        windows = read_windows(sorted_dataset, NGram(FIELDS, DELTA, "ts"), shuffle_row_drop_partitions=parts,
                               reader_pool_type=pool)
        assert [check_window(w) for w in windows] == whole, parts


def test_row_shards_together_give_every_window_once(sorted_dataset):
    whole = expected_windows(4)
    got = []
    for shard in range(7):  # 17 rows each: cuts inside row groups; the dropped last row starts no window
        got += [check_window(w) for w in read_windows(sorted_dataset, NGram(FIELDS, DELTA, "ts"), cur_shard=shard,
                                                      shard_count=7, shard_by="row", shard_remainder="drop")]
    assert got == whole


def test_shuffled_rows_lose_no_window_at_the_cuts_of_partitions_or_row_shards(sorted_dataset):
    """``shuffle_rows=True`` cut a row group's *shuffled* rows into partitions or row shards, so a window's
    rows fell into different tasks and most windows were lost (92 of 291 on a dataset Petastorm wrote).
    Windows are sorted by timestamp anyway: the cuts now take consecutive rows and every window comes once."""
    whole = expected_windows(4)
    windows = read_windows(sorted_dataset, NGram(FIELDS, DELTA, "ts"), shuffle_rows=True, seed=3,
                           shuffle_row_drop_partitions=3)
    assert sorted(check_window(w) for w in windows) == sorted(whole)
    got = []
    for shard in range(3):
        got += [check_window(w) for w in read_windows(sorted_dataset, NGram(FIELDS, DELTA, "ts"), shuffle_rows=True,
                                                      seed=3, cur_shard=shard, shard_count=3, shard_by="row")]
    assert sorted(got) == sorted(whole)


def test_no_overlap_windows_over_row_groups_cut_into_parts_are_refused(sorted_dataset):
    """``timestamp_overlap=False`` keeps windows apart inside each task; with a row group cut into parts (drop
    partitions, row shards) windows on both sides of a cut shared timestamps (16 on a dataset Petastorm wrote,
    3 partitions). Petastorm refused the combination; so does unihub now, in Petastorm's words."""
    ngram = NGram({0: ["ts"], 1: ["ts"], 2: ["ts"]}, DELTA, "ts", timestamp_overlap=False)
    with pytest.raises(InvalidArgumentError, match="timestamp_overlap=False is not implemented with"):
        make_reader(sorted_dataset, schema_fields=ngram, shuffle_row_drop_partitions=3)
    with pytest.raises(InvalidArgumentError, match="shard_by='row'"):
        make_reader(sorted_dataset, schema_fields=ngram, cur_shard=0, shard_count=3, shard_by="row", seed=1)
    got = []
    for shard in range(3):  # shards of whole row groups keep each row group's windows apart
        got += [tuple(int(w[k].ts) for k in range(3)) for w in read_windows(sorted_dataset, ngram, cur_shard=shard,
                                                                             shard_count=3)]
    assert sorted(got) == sorted(expected_windows(3, overlap=False))


def test_the_overlap_rows_pass_the_predicate_first(sorted_dataset):
    """A predicate drops rows of the overlap too; windows are formed from the rows it keeps."""
    keep_even_groups = in_lambda(["idx"], lambda idx: (idx // GROUP) % 2 == 0)
    windows = read_windows(sorted_dataset, NGram(FIELDS, DELTA, "ts"), shuffle_row_drop_partitions=3,
                           predicate=keep_even_groups)
    assert [check_window(w) for w in windows] == [w for w in expected_windows(4)
                                                  if int(np.searchsorted(TS, w[0])) // GROUP % 2 == 0]
