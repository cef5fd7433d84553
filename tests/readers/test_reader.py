"""make_reader / make_batch_reader: values, epochs, order, exact resume, shards, lifecycle, errors.

Datasets are written into a temporary directory with tiny row groups (4 rows) and several
files, so every read crosses many row groups and files. Values are compared bit-exactly
with the rows that were written.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub import (
    CodecError,
    DatasetNotFoundError,
    FormatError,
    ScalarCodec,
    SchemaError,
    TensorCodec,
    UnihubError,
    Unischema,
    UnischemaField,
    WeightedSamplingReader,
    open_dataset,
    write_dataset,
)
from unihub.errors import InvalidArgumentError, NoDataAvailableError, UsageError
from unihub.images.decoders import decode_image
from unihub.readers.plan import PlanError
from unihub.readers.predicates import in_lambda, in_set
from unihub.readers.reader import ReaderStateError, make_batch_reader, make_reader

from .sample import sample_schema, within

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm"
POOLS = ["thread", "process", "dummy"]
N = 150  # rows of the main dataset: 38 row groups of <= 4 rows in 4 files

SCHEMA = sample_schema("ReaderTest", image_shape=(8, 8, 3))


def make_row(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    return {
        "id": i,
        "name": f"row-{i}",
        "score": None if i % 5 == 0 else float(np.float32(i / 3)),
        "vec": rng.random(3, dtype=np.float32),
        "boxes": rng.random((i % 3, 4), dtype=np.float32),
        "emb": rng.standard_normal(2),
        "image": rng.integers(0, 256, (8, 8, 3), dtype=np.uint8),
    }


def write(path: Path, n: int, *, rows_per_file: int = 40, **options: Any) -> Path:
    write_dataset(path, SCHEMA, (make_row(i) for i in range(n)), row_group_size_mb=0.002,
                  rows_per_file=rows_per_file, **options)
    return path


def assert_row_equal(row: Any, expected: dict[str, Any]) -> None:
    where = f"row {expected['id']}"
    for name in row._fields:
        found, want = getattr(row, name), expected[name]
        if want is None:
            assert found is None, f"{where}.{name}: {found!r} is not None"
        elif isinstance(want, np.ndarray):
            assert isinstance(found, np.ndarray), f"{where}.{name}: {type(found)}"
            assert found.dtype == want.dtype and found.shape == want.shape, f"{where}.{name}"
            assert found.tobytes() == want.tobytes(), f"{where}.{name}: values differ"
        else:
            field = SCHEMA[name]
            if field.dtype != object and field.numpy_dtype is not np.str_:
                assert np.asarray(found).dtype == field.dtype, f"{where}.{name}: {type(found)}"
                assert np.asarray(found).tobytes() == np.asarray(want, dtype=field.dtype).tobytes(), where
            assert found == want, f"{where}.{name}: {found!r} != {want!r}"


def ids_of(reader: Any) -> list[int]:
    return [int(row.id) for row in reader]


def batch_ids(reader: Any) -> list[list[int]]:
    return [batch.id.tolist() for batch in reader]


def worker_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("unihub-worker")}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    path = write(tmp_path_factory.mktemp("reader") / "ds", N)
    store = open_dataset(path)
    assert len(store.row_groups) >= 30 and len(store.files) >= 4, "the tests need many row groups"
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("tiny") / "ds", 30, rows_per_file=12)


@pytest.fixture(scope="module")
def expected_rows() -> list[dict[str, Any]]:
    return [make_row(i) for i in range(N)]


# -- values and epochs ----------------------------------------------------------------------------
@pytest.mark.parametrize("pool", POOLS)
def test_rows_are_decoded_bit_exactly_in_natural_order(dataset, expected_rows, pool):
    with make_reader(dataset, shuffle_row_groups=False, reader_pool_type=pool, workers_count=2) as reader:
        rows = list(reader)
    assert [int(r.id) for r in rows] == list(range(N))
    assert type(rows[0]).__name__.startswith("ReaderTest")
    assert rows[0]._fields == tuple(SCHEMA.fields)
    for row in rows:
        assert_row_equal(row, expected_rows[int(row.id)])


def test_shuffled_epoch_has_every_row_once(dataset, expected_rows):
    with make_reader(dataset, shuffle_row_groups=True, shuffle_rows=True, seed=3) as reader:
        rows = list(reader)
    ids = [int(r.id) for r in rows]
    assert sorted(ids) == list(range(N))
    assert ids != list(range(N))
    for row in rows[::7]:
        assert_row_equal(row, expected_rows[int(row.id)])


def test_three_epochs(dataset):
    with make_reader(dataset, num_epochs=3, seed=1, shuffle_rows=True) as reader:
        ids = ids_of(reader)
    assert len(ids) == 3 * N
    for epoch in range(3):
        assert sorted(ids[epoch * N:(epoch + 1) * N]) == list(range(N)), f"epoch {epoch}"
    assert ids[:N] != ids[N:2 * N], "each epoch is shuffled anew"


@pytest.mark.parametrize("pool", POOLS)
def test_num_epochs_none_keeps_going(dataset, pool):
    def take() -> list[int]:
        reader = make_reader(dataset, num_epochs=None, reader_pool_type=pool, workers_count=2, seed=0,
                             schema_fields=["id"])
        ids = [int(row.id) for row in itertools.islice(reader, 4 * N + 7)]
        reader.stop()
        reader.join()
        return ids

    ids = within(30, take)
    assert len(ids) == 4 * N + 7
    assert Counter(ids[:4 * N]) == Counter({i: 4 for i in range(N)})


def test_bad_num_epochs(dataset):
    for bad in (0, -1, 1.5):
        with pytest.raises(UnihubError, match="num_epochs"):
            make_reader(dataset, num_epochs=bad)


def test_a_seed_that_cannot_be_one_is_named_when_the_reader_is_made(dataset):
    """seed=-1 failed at the first read with numpy's bare 'expected non-negative integer', seed='x' with
    int()'s 'invalid literal'; both are now an InvalidArgumentError naming the seed. A numpy integer is a seed,
    and a numpy epoch count an epoch count, as numpy integers are shards."""
    for bad in (-1, "x", 1.5):
        with pytest.raises(InvalidArgumentError, match=f"seed must be a non-negative int or None.*got {bad!r}"):
            make_reader(dataset, seed=bad, shuffle_rows=True)
    with make_reader(dataset, seed=np.int64(3), num_epochs=np.int64(2), schema_fields=["id"], workers_count=1) as reader:
        assert len(ids_of(reader)) == 2 * N


# -- field selection --------------------------------------------------------------------------------
@pytest.mark.parametrize("schema_fields, names", [
    (["id", "vec"], ("id", "vec")),
    (["vec", "id"], ("id", "vec")),
    ("name", ("name",)),
    ([r"^(id|e.*)$"], ("id", "emb")),
    (["v.c", "image"], ("vec", "image")),
    ([SCHEMA["boxes"], SCHEMA["id"]], ("id", "boxes")),
    ([SCHEMA["score"], "na.*"], ("name", "score")),  # a regex matches the whole name, as in Petastorm
])
def test_schema_fields(dataset, expected_rows, schema_fields, names):
    with make_reader(dataset, schema_fields=schema_fields, shuffle_row_groups=False) as reader:
        assert tuple(reader.schema.fields) == names
        rows = list(reader)
    assert len(rows) == N
    assert set(rows[0]._fields) == set(names)
    for index in range(0, N, 11):  # natural order: position == id
        assert_row_equal(rows[index], expected_rows[index])


def test_missing_field_is_left_out_with_a_warning_and_no_field_at_all_is_a_schema_error(dataset):
    with pytest.warns(UserWarning, match="nope"):  # left out, as Petastorm's readers leave it out
        reader = make_reader(dataset, schema_fields=["id", "nope"])
    with reader:
        assert list(reader.schema.fields) == ["id"]
    with pytest.raises(SchemaError, match="zzz"):
        make_batch_reader(dataset, schema_fields=["^zzz.*"])


# -- reliability and order --------------------------------------------------------------------------
@pytest.mark.parametrize("pool", POOLS)
def test_repeated_reads_always_give_every_row(tiny, pool):
    counts = []
    for i in range(50):
        with make_reader(tiny, reader_pool_type=pool, workers_count=2, schema_fields=["id"], seed=i) as reader:
            counts.append(sum(1 for _ in reader))
    assert counts == [30] * 50


@pytest.mark.parametrize("batched", [False, True])
def test_order_does_not_depend_on_pool_or_workers(dataset, batched):
    options = dict(shuffle_row_groups=True, shuffle_rows=True, seed=42, num_epochs=2, schema_fields=["id", "vec"],
                   shuffle_row_drop_partitions=2)
    make = make_batch_reader if batched else make_reader
    orders = {}
    for pool, workers in [("dummy", 1), ("thread", 1), ("thread", 2), ("thread", 4), ("process", 1),
                          ("process", 2), ("process", 4)]:
        with make(dataset, reader_pool_type=pool, workers_count=workers, **options) as reader:
            orders[pool, workers] = batch_ids(reader) if batched else ids_of(reader)
    reference = orders["dummy", 1]
    for key, order in orders.items():
        assert order == reference, f"{key} delivered another order"
    flat = list(itertools.chain.from_iterable(reference)) if batched else reference
    assert sorted(flat) == sorted(list(range(N)) * 2)
    with make(dataset, **{**options, "seed": 43}) as reader:
        assert (batch_ids(reader) if batched else ids_of(reader)) != reference


def test_seed_none_still_reads_everything(dataset):
    with make_reader(dataset, seed=None, shuffle_rows=True, schema_fields=["id"]) as reader:
        assert sorted(ids_of(reader)) == list(range(N))


# -- exact resume -----------------------------------------------------------------------------------
RESUME_OPTIONS = dict(shuffle_row_groups=True, shuffle_rows=True, seed=5, num_epochs=2, schema_fields=["id", "vec"])


def cut_points(dataset: Path) -> dict[str, int]:
    """Positions to cut at: first row, mid row group, row-group boundary, epoch boundary, second epoch."""
    with make_reader(dataset, **RESUME_OPTIONS) as reader:
        offsets = []
        for _ in range(2 * N):
            next(reader)
            offsets.append(reader.state_dict()["offset"])
    boundary = next(k + 1 for k, o in enumerate(offsets) if o == 0 and k + 1 > 5)
    middle = next(k + 1 for k, o in enumerate(offsets) if o != 0 and k + 1 > boundary)
    second_epoch_mid = next(k + 1 for k, o in enumerate(offsets) if o != 0 and k + 1 > N + 10)
    return {"start": 0, "first row": 1, "mid row group": middle, "row-group boundary": boundary,
            "epoch boundary": N, "one past epoch": N + 1, "second epoch": second_epoch_mid,
            "last row": 2 * N - 1, "end": 2 * N}


@pytest.fixture(scope="module")
def full_order(dataset) -> list[int]:
    with make_reader(dataset, **RESUME_OPTIONS) as reader:
        order = ids_of(reader)
    assert sorted(order) == sorted(list(range(N)) * 2)
    return order


@pytest.mark.parametrize("how", ["resume_from", "load_state_dict", "json"])
@pytest.mark.parametrize("cut", ["start", "first row", "mid row group", "row-group boundary", "epoch boundary",
                                 "one past epoch", "second epoch", "last row", "end"])
def test_exact_resume(dataset, full_order, cut, how):
    k = cut_points(dataset)[cut]
    with make_reader(dataset, **RESUME_OPTIONS) as first:
        delivered = [int(next(first).id) for _ in range(k)]
        state = first.state_dict()
    assert delivered == full_order[:k]
    if how == "json":
        state = json.loads(json.dumps(state))
    if how == "load_state_dict":
        second = make_reader(dataset, **RESUME_OPTIONS)
        second.load_state_dict(state)
    else:
        second = make_reader(dataset, resume_from=state, **RESUME_OPTIONS)
    with second:
        rest = ids_of(second)
    assert rest == full_order[k:], f"resume at {cut} ({k})"


@pytest.mark.parametrize("pool, workers", [("process", 2), ("dummy", 1), ("thread", 4)])
def test_resume_in_another_pool_type(dataset, full_order, pool, workers):
    k = cut_points(dataset)["mid row group"] + N
    with make_reader(dataset, reader_pool_type="thread", workers_count=3, **RESUME_OPTIONS) as first:
        for _ in range(k):
            next(first)
        state = first.state_dict()
    with make_reader(dataset, reader_pool_type=pool, workers_count=workers, resume_from=state,
                     **RESUME_OPTIONS) as second:
        assert ids_of(second) == full_order[k:]


def test_resume_with_a_random_seed(dataset):
    options = dict(RESUME_OPTIONS, seed=None)
    with make_reader(dataset, **options) as first:
        head = [int(next(first).id) for _ in range(N + 9)]
        state = first.state_dict()
        rest = ids_of(first)
    with make_reader(dataset, resume_from=state, **options) as second:
        assert ids_of(second) == rest
    assert sorted(head + rest) == sorted(list(range(N)) * 2)


def test_load_state_dict_rewinds_a_running_reader(dataset, full_order):
    with make_reader(dataset, **RESUME_OPTIONS) as reader:
        for _ in range(17):
            next(reader)
        state = reader.state_dict()
        for _ in range(40):
            next(reader)
        reader.load_state_dict(state)
        assert ids_of(reader) == full_order[17:]


def test_state_dict_is_small_and_json_able(dataset):
    with make_reader(dataset, **RESUME_OPTIONS) as reader:
        next(reader)
        state = reader.state_dict()
    assert len(json.dumps(state)) < 500


@pytest.mark.parametrize("cut_batches", [0, 1, 7, 20, 37, 38, 39, 60, 76])
def test_exact_resume_of_batch_reader(dataset, cut_batches):
    options = dict(RESUME_OPTIONS, shuffle_row_drop_partitions=2)
    with make_batch_reader(dataset, **options) as reader:
        full = batch_ids(reader)
    assert sorted(itertools.chain.from_iterable(full)) == sorted(list(range(N)) * 2)
    assert cut_batches <= len(full)
    with make_batch_reader(dataset, **options) as first:
        for _ in range(cut_batches):
            next(first)
        state = first.state_dict()
    with make_batch_reader(dataset, resume_from=state, **options) as second:
        assert batch_ids(second) == full[cut_batches:]


@pytest.mark.parametrize("shards", [None, (1, 3)])
@pytest.mark.parametrize("row", [0, 1, 13, 37, 49])
def test_seek_goes_to_a_row_of_the_epoch_reading_only_its_task(dataset, row, shards, monkeypatch):
    from unihub.readers.loader import RowGroupLoader

    options = dict(RESUME_OPTIONS, num_epochs=2, shard_by="row")
    if shards:
        options.update(cur_shard=shards[0], shard_count=shards[1])
    with make_reader(dataset, **options) as reader:
        full = ids_of(reader)
        per_epoch = reader.num_rows_per_epoch
    with make_batch_reader(dataset, **options) as reader:
        full_batches = batch_ids(reader)
    assert list(itertools.chain.from_iterable(full_batches)) == full
    loaded = []
    original = RowGroupLoader.__call__
    monkeypatch.setattr(RowGroupLoader, "__call__", lambda self, job: loaded.append(job) or original(self, job))
    with make_reader(dataset, **options) as reader:
        reader.seek(row)
        assert next(reader).id == full[row]
        assert len(loaded) <= 2 * reader._workers_count + 2  # the task of the row and read-ahead, not the ones before
        state = reader.state_dict()
        rest = ids_of(reader)
    assert rest == full[row + 1:]
    with make_reader(dataset, resume_from=state, **options) as reader:
        assert ids_of(reader) == full[row + 1:]
    with make_batch_reader(dataset, **options) as reader:
        reader.seek(row)
        got = batch_ids(reader)
    assert list(itertools.chain.from_iterable(got)) == full[row:]
    assert len(got) <= len(full_batches)
    assert per_epoch is not None and row < per_epoch


def test_seek_is_refused_beyond_the_epoch_and_where_rows_are_not_known(dataset):
    with make_reader(dataset, **RESUME_OPTIONS) as reader:
        with pytest.raises(InvalidArgumentError, match=f"beyond this shard's {N} rows"):
            reader.seek(N)
        with pytest.raises(InvalidArgumentError, match="row number"):
            reader.seek(-1)
        first = int(next(reader).id)
    with make_reader(dataset, **RESUME_OPTIONS) as reader:
        assert ids_of(reader)[0] == first
    with make_reader(dataset, filters=[("id", ">", 3)], **RESUME_OPTIONS) as reader:
        with pytest.raises(InvalidArgumentError, match="known in advance"):
            reader.seek(1)


def test_a_state_of_other_fields_says_fields_may_differ(dataset):
    """A state resumed with other ``schema_fields`` was refused naming every option but the fields."""
    with make_reader(dataset, **dict(RESUME_OPTIONS, schema_fields=["id"])) as reader:
        next(reader)
        state = reader.state_dict()
    with make_reader(dataset, **dict(RESUME_OPTIONS, schema_fields=["id", "vec"])) as reader:
        with pytest.raises(ReaderStateError, match=r"other reader options \(.*fields, predicate"):
            reader.load_state_dict(state)


def test_a_state_another_object_saved_is_named_not_a_version(dataset):
    """A mix's, a loader's or a TF position's state given to a reader says whose it is: a mix's state was refused
    as 'reader state version 2 is not 1', as if saved by another unihub, and a loader's as lacking keys."""
    options = dict(RESUME_OPTIONS, schema_fields=["id"])
    with WeightedSamplingReader([make_reader(dataset, **options), make_reader(dataset, **options)], [0.5, 0.5],
                                seed=0) as mixer:
        next(mixer)
        mixed = mixer.state_dict()
    with make_reader(dataset, **options) as reader:
        next(reader)
        state = reader.state_dict()
    loader = {"version": 1, "reader": state, "skip": 1, "exclude": []}
    position = {"version": 1, "reader": state, "row": 1}
    for saved, owner in [(mixed, "WeightedSamplingReader"), (loader, "loader"), (position, "ReaderPosition")]:
        with pytest.raises(ReaderStateError, match=f"the state is a {owner}'s, not a reader's"):
            make_reader(dataset, resume_from=saved, **options)


def test_state_of_another_dataset_or_options_is_refused(dataset, tmp_path):
    other = write(tmp_path / "other", 90)
    with make_reader(dataset, **RESUME_OPTIONS) as reader:
        for _ in range(10):
            next(reader)
        state = reader.state_dict()
    with pytest.raises(ReaderStateError):
        make_reader(other, resume_from=state, **RESUME_OPTIONS)
    with pytest.raises(ReaderStateError):
        make_reader(dataset, resume_from=state, **{**RESUME_OPTIONS, "shuffle_rows": False})
    with pytest.raises(ReaderStateError):
        make_reader(dataset, resume_from=state, **{**RESUME_OPTIONS, "num_epochs": 3})
    with pytest.raises(ReaderStateError):
        make_reader(dataset, resume_from=state, cur_shard=0, shard_count=2, **RESUME_OPTIONS)
    with pytest.raises(ReaderStateError):
        make_batch_reader(dataset, resume_from=state, **RESUME_OPTIONS)
    with pytest.raises(ReaderStateError, match="version"):
        make_reader(dataset, resume_from={**state, "version": 99}, **RESUME_OPTIONS)
    with pytest.raises(ReaderStateError, match="offset"):
        make_reader(dataset, resume_from={k: v for k, v in state.items() if k != "offset"}, **RESUME_OPTIONS)
    assert issubclass(ReaderStateError, UnihubError)


TAMPERED = [("offset", 10**6), ("offset", -1), ("offset", 2.5), ("task", 10**6), ("task", "3"), ("task", True),
            ("epoch", 3), ("epoch", -1), ("epoch", None), ("seed", "5"), ("done", [0, 0, 10**6])]


@pytest.mark.parametrize(("key", "value"), TAMPERED)
def test_a_tampered_state_is_refused_by_name(dataset, key, value):
    """A position no reader of the plan is at (beyond its task, its epoch or the last epoch, not an int >= 0)
    is a named error, not rows resumed from somewhere else or a raw ValueError; one state or a list of them."""
    with make_reader(dataset, **RESUME_OPTIONS) as reader:
        for _ in range(10):
            next(reader)
        state = dict(reader.state_dict(), **{key: value})
    with pytest.raises(ReaderStateError):
        make_reader(dataset, resume_from=state, **RESUME_OPTIONS)
    with pytest.raises(ReaderStateError):
        make_reader(dataset, resume_from=[state], **RESUME_OPTIONS)


def test_a_state_of_another_predicate_or_filters_is_refused(dataset):
    """A position counts the rows a predicate or filters keep: read without them (or with others) it would
    resume at other rows."""
    odd = in_lambda(["id"], lambda i: i % 2 == 1)
    states = {}
    for name, options in {"plain": {}, "predicate": {"predicate": odd}, "filters": {"filters": [("id", ">", 3)]},
                          "other filters": {"filters": [("id", ">", 4)]}}.items():
        with make_reader(dataset, **RESUME_OPTIONS, **options) as reader:
            next(reader)
            states[name] = (reader.state_dict(), options)
    for name, (state, _) in states.items():
        for other, (_, options) in states.items():
            if other != name:
                with pytest.raises(ReaderStateError, match="predicate or filters"):
                    make_reader(dataset, resume_from=state, **RESUME_OPTIONS, **options)
        with make_reader(dataset, resume_from=state, **RESUME_OPTIONS, **states[name][1]) as reader:
            next(reader)
        # a state saved before the predicate and filters were recorded (no "kept_by") resumes with them
        legacy = {k: v for k, v in state.items() if k != "kept_by"}
        with make_reader(dataset, resume_from=legacy, **RESUME_OPTIONS, **states[name][1]) as reader:
            next(reader)


def test_refused_state_leaves_the_reader_unchanged(dataset, full_order):
    with make_reader(dataset, **{**RESUME_OPTIONS, "shuffle_rows": False, "seed": 9}) as foreign:
        next(foreign)
        state = foreign.state_dict()
    reader = make_reader(dataset, **RESUME_OPTIONS)
    with pytest.raises(ReaderStateError):
        reader.load_state_dict(state)
    with reader:
        assert ids_of(reader) == full_order


def test_the_plan_fingerprint_is_computed_once_per_plan(dataset, monkeypatch):
    """A loader asks for a state per reader batch: the fingerprint is worked out once per plan, and a
    state loaded with another seed (another plan) gets its own, which a fresh reader accepts."""
    from unihub.readers.reader import Reader

    calls: list[int] = []
    original = Reader._compute_fingerprint
    monkeypatch.setattr(Reader, "_compute_fingerprint", lambda self, config: calls.append(1) or original(self, config))
    with make_reader(dataset, **RESUME_OPTIONS) as reader:
        states = [reader.state_dict() for _ in range(5)]
        assert len(calls) == 2 and len({s["plan"] for s in states}) == 1  # the plan's, and its global order's
        other = dict(states[0], seed=states[0]["seed"] + 1)
        with make_reader(dataset, **{**RESUME_OPTIONS, "seed": other["seed"]}) as twin:
            other["plan"] = twin.state_dict()["plan"]
        reader.load_state_dict(other)
        assert reader.state_dict()["plan"] == other["plan"] != states[0]["plan"]


# -- sharding ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("remainder", ["pad", "drop"])
@pytest.mark.parametrize("ranks", [3, 4, 7])
def test_row_shards_are_equal_and_cover_every_row(dataset, remainder, ranks):
    per_rank = -(-N // ranks) if remainder == "pad" else N // ranks
    union: list[int] = []
    for rank in range(ranks):
        with make_reader(dataset, cur_shard=rank, shard_count=ranks, shard_by="row", shard_remainder=remainder,
                         schema_fields=["id"], seed=2, shuffle_rows=True) as reader:
            ids = ids_of(reader)
            assert len(reader) == per_rank
        assert len(ids) == per_rank, f"rank {rank}"
        union += ids
    if remainder == "pad":
        assert set(union) == set(range(N))
    else:
        assert len(set(union)) == len(union) == per_rank * ranks


def test_row_group_shards_are_disjoint_and_cover_every_row(dataset):
    union: list[int] = []
    for rank in range(3):
        with make_reader(dataset, cur_shard=rank, shard_count=3, schema_fields=["id"], seed=1) as reader:
            union += ids_of(reader)
    assert sorted(union) == list(range(N))


def test_shards_are_held_to_the_datasets_row_groups_not_to_those_a_predicate_leaves(tmp_path: Path):
    """Petastorm compares ``shard_count`` with the dataset's row groups, before a partition predicate (or a
    ``rowgroup_selector``) leaves fewer; unihub compared with those left, so a job Petastorm ran (6 ranks, a
    predicate leaving 4 of 12 row groups) failed on every rank with NoDataAvailableError. Now the shards left
    without a row group are empty, with Petastorm's warning, and together the ranks read every row once."""
    keys = np.repeat(np.array(["a", "b", "c"]), 20)
    pq.write_to_dataset(pa.table({"id": np.arange(60), "key": keys}), str(tmp_path), partition_cols=["key"],
                        row_group_size=5)
    url = str(tmp_path)
    assert len(open_dataset(url).row_groups) == 12
    union, empty = [], 0
    for rank in range(6):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with make_reader(url, cur_shard=rank, shard_count=6, seed=0, predicate=in_set(["a"], "key")) as reader:
                ids = ids_of(reader)
        union += ids
        if not ids:
            empty += 1
            assert any("No matching data is available" in str(w.message) for w in caught)
    assert sorted(union) == list(range(20)) and empty == 2
    with pytest.raises(NoDataAvailableError, match="13 shards of 12 row groups"):  # the dataset's own count
        make_reader(url, cur_shard=0, shard_count=13, predicate=in_set(["a"], "key"))


def test_more_shards_than_row_groups(tiny):
    count = len(open_dataset(tiny).row_groups) + 3
    with pytest.raises(NoDataAvailableError, match="some shards would be empty"):  # Petastorm's error
        make_reader(tiny, cur_shard=0, shard_count=count)
    with pytest.raises(ValueError, match="pass the same seed= on every rank"):  # else ranks' blocks overlap
        make_reader(tiny, cur_shard=0, shard_count=count, shard_by="row")
    lengths = set()
    union = set()
    for rank in range(count):
        with make_reader(tiny, cur_shard=rank, shard_count=count, schema_fields=["id"], seed=0,
                         shard_by="row") as reader:
            ids = ids_of(reader)
        lengths.add(len(ids))
        union |= set(ids)
    assert lengths == {-(-30 // count)}
    assert union == set(range(30))


@pytest.mark.parametrize("options, words", [
    (dict(cur_shard=3, shard_count=3), ["cur_shard", "3"]),
    (dict(cur_shard=0), ["shard_count"]),
    (dict(cur_shard=0, shard_count=0), ["shard_count"]),
])
def test_bad_shard_options(dataset, options, words):
    with pytest.raises(PlanError) as info:
        make_reader(dataset, **options)
    for word in words:
        assert word in str(info.value)


# -- lifecycle --------------------------------------------------------------------------------------
def test_reset_starts_over(dataset):
    with make_reader(dataset, seed=4, shuffle_rows=True, schema_fields=["id"]) as reader:
        first = [int(next(reader).id) for _ in range(23)]
        with pytest.raises(NotImplementedError, match="in the middle of iteration"):  # Petastorm's
            reader.reset()
        reader.start_over()  # from anywhere
        again = ids_of(reader)
        reader.reset()  # after the last row, as in Petastorm
        third = ids_of(reader)
    assert again[:23] == first
    assert sorted(again) == list(range(N))
    assert third == again


def test_len(dataset):
    with make_reader(dataset, num_epochs=3) as reader:
        assert len(reader) == 3 * N
    with make_reader(dataset, cur_shard=1, shard_count=4, shard_by="row", shard_remainder="drop", seed=0) as reader:
        assert len(reader) == N // 4 == len(list(reader))
    with make_batch_reader(dataset, num_epochs=2) as reader:
        assert len(reader) == len(list(reader)) == 2 * len(open_dataset(dataset).row_groups)
    with make_reader(dataset, num_epochs=None) as reader:
        with pytest.raises(TypeError):
            len(reader)


def test_petastorm_transport_arguments_are_accepted_and_change_nothing(dataset):
    knobs = dict(pyarrow_serialize=True, hdfs_driver="libhdfs", zmq_copy_buffers=False, shard_seed=7,
                 cache_row_size_estimate=100)
    with pytest.warns(UserWarning, match="shard_seed was deprecated"), \
            make_reader(dataset, shuffle_row_groups=False, **knobs) as reader:
        assert ids_of(reader) == list(range(N))
    with pytest.warns(UserWarning, match="shard_seed was deprecated"), \
            make_batch_reader(dataset, shuffle_row_groups=False, convert_early_to_numpy=True, **knobs) as reader:
        assert [int(i) for batch in reader for i in batch.id] == list(range(N))
    with pytest.raises(TypeError, match=r"^make_reader\(\) got an unexpected keyword argument 'colour'$"):
        make_reader(dataset, colour="blue")


@pytest.mark.parametrize("pool", POOLS)
def test_stop_mid_epoch_is_prompt_and_workers_exit(dataset, pool):
    before = worker_threads()

    def run() -> float:
        reader = make_reader(dataset, reader_pool_type=pool, workers_count=3, num_epochs=None)
        for _ in range(10):
            next(reader)
        started = time.monotonic()
        reader.stop()
        reader.join()
        return time.monotonic() - started

    assert within(20, run) < 5
    assert not (worker_threads() - before), "worker threads outlived join()"


@pytest.mark.parametrize("pool", POOLS)
def test_stop_from_another_thread_ends_iteration_and_keeps_the_position(dataset, full_order, pool):
    reader = make_reader(dataset, reader_pool_type=pool, workers_count=2, **RESUME_OPTIONS)
    delivered: list[int] = []

    def consume() -> None:
        try:
            for row in reader:
                delivered.append(int(row.id))
                time.sleep(0.001)
        except UsageError:  # a next() after stop(): the loop ends, loudly, as Petastorm's RuntimeError
            pass

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    while len(delivered) < 30:
        time.sleep(0.005)
    reader.stop()
    consumer.join(10)
    assert not consumer.is_alive(), "the consumer did not end after stop()"
    assert 30 <= len(delivered) < 2 * N
    assert delivered == full_order[:len(delivered)]
    with pytest.raises(UsageError, match="next\\(\\) on a reader that was stopped"):
        next(reader)  # a read after stop() is an error (Petastorm's RuntimeError), not a silent end
    state = reader.state_dict()
    reader.join()
    with make_reader(dataset, resume_from=state, **RESUME_OPTIONS) as resumed:
        assert ids_of(resumed) == full_order[len(delivered):]


@pytest.mark.parametrize("pool", ["thread", "process"])
@pytest.mark.parametrize("batched", [False, True], ids=["rows", "batches"])
def test_eight_threads_sharing_one_reader_get_every_row_once(dataset, pool, batched):
    # Petastorm's readers were shared by the threads of a feeding loop: each next() hands out one
    # item to one thread, none twice or lost, and the position counts every item handed out.
    make = make_batch_reader if batched else make_reader
    reader = make(dataset, reader_pool_type=pool, workers_count=2, **RESUME_OPTIONS)
    taken: list[list[int]] = [[] for _ in range(8)]
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def consume(mine: list[int]) -> None:
        start.wait()
        try:
            for item in reader:
                mine.extend(np.atleast_1d(item.id).tolist())
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(mine,), daemon=True) for mine in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    every = sorted(i for mine in taken for i in mine)
    assert every == sorted(list(range(N)) * 2)
    assert sum(1 for mine in taken if mine) > 1  # the threads really shared the work
    state = reader.state_dict()
    reader.stop()
    reader.join()
    with make(dataset, resume_from=state, **RESUME_OPTIONS) as resumed:
        assert list(resumed) == []  # everything handed out was counted


def test_stop_from_another_thread_as_the_workers_start_ends_the_iteration(dataset, full_order, monkeypatch):
    # stop() in another thread may come between next() starting the workers and taking their first
    # batch: that next() ends the iteration (StopIteration), as stop() promises, rather than failing
    # on the iterator stop() dropped
    reader = make_reader(dataset, reader_pool_type="thread", workers_count=2, **RESUME_OPTIONS)
    start = reader._start

    def start_then_stop() -> Any:
        started = start()
        reader.stop()  # what the other thread's stop() does at that moment
        return started

    monkeypatch.setattr(reader, "_start", start_then_stop)
    with pytest.raises(StopIteration):
        next(reader)
    state = reader.state_dict()
    reader.join()
    assert (state["epoch"], state["task"], state["offset"]) == (0, 0, 0)
    with make_reader(dataset, resume_from=state, **RESUME_OPTIONS) as resumed:
        assert ids_of(resumed) == full_order


def test_a_stopped_reader_stays_stopped_until_reset(dataset):
    reader = make_reader(dataset, schema_fields=["id"], seed=0)
    first = [int(next(reader).id) for _ in range(5)]
    reader.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        next(reader)
    with pytest.raises(RuntimeError):
        list(reader)
    reader.reset()
    again = ids_of(reader)
    reader.join()
    assert again[:5] == first and sorted(again) == list(range(N))


@pytest.mark.parametrize("pool", POOLS)
def test_context_manager_stops_workers(dataset, pool):
    before = worker_threads()

    def run() -> int:
        with make_reader(dataset, reader_pool_type=pool, workers_count=3, num_epochs=None) as reader:
            return int(next(reader).id) + int(next(reader).id)

    within(20, run)
    assert not (worker_threads() - before)


def test_diagnostics(dataset):
    with make_reader(dataset, workers_count=2, schema_fields=["id"]) as reader:
        next(reader)
        info = reader.diagnostics
    assert info["items_delivered"] == 1
    assert info["row_groups"] == len(open_dataset(dataset).row_groups)


# -- errors from workers ----------------------------------------------------------------------------
CORRUPT_ROW = 13


@pytest.fixture(scope="module")
def corrupt_dataset(tmp_path_factory) -> Path:
    def rows():
        for i in range(40):
            row = make_row(i)
            if i == CORRUPT_ROW:  # a PNG signature followed by garbage
                row["image"] = b"\x89PNG\r\n\x1a\n" + b"garbage" * 10
            yield row

    path = tmp_path_factory.mktemp("corrupt") / "ds"
    write_dataset(path, SCHEMA, rows(), row_group_size_mb=0.002, rows_per_file=20)
    return path


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("shuffle_rows", [False, True])
def test_corrupt_image_raises_codec_error_naming_field_and_row(corrupt_dataset, pool, shuffle_rows):
    store = open_dataset(corrupt_dataset)
    info, local = store.row_group_of(CORRUPT_ROW)
    before = worker_threads()
    delivered: list[int] = []

    def run() -> CodecError:
        with make_reader(corrupt_dataset, reader_pool_type=pool, workers_count=2, shuffle_row_groups=False,
                         shuffle_rows=shuffle_rows, num_epochs=None) as reader:
            with pytest.raises(CodecError) as caught:
                for row in reader:
                    delivered.append(int(row.id))
            return caught.value

    error = within(20, run)
    assert error.field == "image"
    assert error.row == local, "the row index inside its row group"
    message = str(error)
    assert "'image'" in message
    assert Path(info.path).name in message
    assert re.search(rf"\brow {local}\b", message), message
    assert f"row group {info.row_group}" in message
    assert str(CORRUPT_ROW) in message, "the dataset row"
    assert error.__cause__ is not None, "the worker's original error and traceback are chained"
    assert CORRUPT_ROW not in delivered
    assert len(delivered) <= info.first_row
    assert not (worker_threads() - before)


def test_corrupt_image_with_decode_images_false_is_read(corrupt_dataset):
    with make_reader(corrupt_dataset, schema_fields=["id", "image"], decode_images=False,
                     shuffle_row_groups=False) as reader:
        rows = list(reader)
    assert rows[CORRUPT_ROW].image.startswith(b"\x89PNG")


def test_decode_images_false_yields_png_bytes(dataset, expected_rows):
    with make_reader(dataset, schema_fields=["id", "image"], decode_images=False, shuffle_row_groups=False) as reader:
        rows = list(reader)
    for row in rows[:10]:
        assert isinstance(row.image, bytes) and row.image[:8] == b"\x89PNG\r\n\x1a\n"
        assert np.array_equal(decode_image(row.image), expected_rows[int(row.id)]["image"])


# -- other stores -----------------------------------------------------------------------------------
def test_batch_reader_reads_plain_parquet_fixture():
    root = FIXTURES / "plain"
    files = sorted(root.glob("*.parquet"))
    table = pa.concat_tables([pq.read_table(f) for f in files])
    with make_batch_reader(root, shuffle_row_groups=False) as reader:
        batches = list(reader)
    assert tuple(reader.schema.fields) == tuple(table.column_names)
    assert sum(len(b.id) for b in batches) == table.num_rows == 600
    for name in table.column_names:
        found = list(itertools.chain.from_iterable(getattr(b, name) for b in batches))
        expected = table.column(name).to_pylist()
        if name == "pair":
            assert [list(np.asarray(v, dtype=np.float64)) for v in found] == expected
        else:
            assert [v.item() if isinstance(v, np.generic) else v for v in found] == expected, name


@pytest.mark.parametrize("fixture", ["plain", "unischema"])
def test_batch_reader_matches_make_reader_on_fixtures(fixture):
    root = FIXTURES / fixture
    with make_reader(root, shuffle_row_groups=False) as reader:
        rows = list(reader)
    with make_batch_reader(root, shuffle_row_groups=False) as reader:
        batches = list(reader)
    fields = rows[0]._fields
    assert batches[0]._fields == fields
    flat = {name: list(itertools.chain.from_iterable(getattr(b, name) for b in batches)) for name in fields}
    assert len(flat["id"]) == len(rows) > 0
    for i, row in enumerate(rows):
        for name in fields:
            a, b = getattr(row, name), flat[name][i]
            if isinstance(a, np.ndarray):
                assert isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b), (i, name)
            elif isinstance(a, list):
                assert list(a) == list(b), (i, name)
            else:
                assert (a is None and b is None) or a == b or (np.isnan(a) and np.isnan(b)), (i, name, a, b)


def test_petastorm_fixture_values_match_petastorm(tmp_path):
    expected = np.load(FIXTURES / "expected.npz")
    with make_reader(FIXTURES / "unischema", schema_fields=["id", "label", "embedding", "boxes", "image_png"],
                     seed=3, shuffle_rows=True, workers_count=2) as reader:
        rows = list(reader)
    assert len(rows) == 60
    for row in rows:
        key = int(row.id)
        assert int(row.label) == int(expected[f"{key}/label"])
        np.testing.assert_array_equal(row.embedding, expected[f"{key}/embedding"])
        np.testing.assert_array_equal(row.boxes, expected[f"{key}/boxes"])
        np.testing.assert_array_equal(row.image_png, expected[f"{key}/image_png"])


def test_hive_partitions_are_fields(tmp_path):
    schema = Unischema("Parted", [
        UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("split", np.str_, (), ScalarCodec(pa.string()), False),
        UnischemaField("fold", np.int32, (), ScalarCodec(pa.int32()), False),
        UnischemaField("vec", np.float32, (2,), TensorCodec(), False),
    ])
    rows = [{"id": i, "split": ("train", "val")[i % 2], "fold": i % 3, "vec": np.full(2, i, np.float32)}
            for i in range(60)]
    write_dataset(tmp_path / "parted", schema, rows, partition_by=["split", "fold"], row_group_size_mb=0.001)
    assert (tmp_path / "parted" / "split=train").is_dir()
    with make_reader(tmp_path / "parted", workers_count=2) as reader:
        got = list(reader)
    assert sorted(int(r.id) for r in got) == list(range(60))
    for r in got:
        i = int(r.id)
        assert r.split == ("train", "val")[i % 2]
        assert int(r.fold) == i % 3 and np.asarray(r.fold).dtype == np.int32
        assert np.array_equal(r.vec, np.full(2, i, np.float32))
    with make_batch_reader(tmp_path / "parted", schema_fields=["id", "split"]) as reader:
        for batch in reader:
            assert list(batch.split) == [("train", "val")[i % 2] for i in batch.id]


# -- bad stores -------------------------------------------------------------------------------------
def test_truncated_file_is_a_format_error_naming_it(tmp_path):
    path = write(tmp_path / "ds", 60, rows_per_file=20)
    victim = sorted(path.rglob("*.parquet"))[1]
    data = victim.read_bytes()
    victim.write_bytes(data[:len(data) // 2])
    with pytest.raises(FormatError) as info:
        with make_reader(path) as reader:
            list(reader)
    assert victim.name in str(info.value)


def test_non_parquet_file_is_a_format_error_naming_it(tmp_path):
    path = write(tmp_path / "ds", 30, rows_per_file=20)
    (path / "part-99999.parquet").write_text("this is not parquet at all\n" * 10)
    with pytest.raises(FormatError, match="part-99999.parquet"):
        make_batch_reader(path)


def test_corrupt_data_page_is_a_format_error_from_next(tmp_path):
    path = write(tmp_path / "ds", 40, rows_per_file=40, compression=None)
    victim = sorted(path.rglob("*.parquet"))[0]
    data = bytearray(victim.read_bytes())
    footer_len = int.from_bytes(data[-8:-4], "little")
    for i in range(4, len(data) - footer_len - 8):  # every data page byte; the footer stays readable
        data[i] = 0xFF
    victim.write_bytes(bytes(data))

    def run() -> None:
        with make_reader(path, workers_count=2) as reader:
            list(reader)

    with pytest.raises(UnihubError) as info:
        within(20, run)
    assert isinstance(info.value, (FormatError, CodecError)), repr(info.value)
    if isinstance(info.value, FormatError):
        assert victim.name in str(info.value)


def test_empty_dataset_reads_no_rows_and_a_missing_one_is_a_clear_error(tmp_path):
    """Parquet files of 0 rows read as no rows, as Petastorm 0.13.1 read them (both readers; endless epochs
    end too, where Petastorm's spun on an empty row group); more shards than row groups stay its error."""
    root = tmp_path / "empty"
    root.mkdir()
    pq.write_table(SCHEMA.as_arrow_schema().empty_table(), root / "part-00000.parquet")
    for make in (make_reader, make_batch_reader):
        for num_epochs in (1, 3, None):
            with make(root, num_epochs=num_epochs, workers_count=1) as reader:
                assert within(30, lambda: list(reader)) == []
    write_dataset(tmp_path / "written", SCHEMA, [])  # no row group at all
    with pytest.warns(UserWarning, match=f"data was sharded: {re.escape(str(tmp_path / 'written'))} holds no rows; "
                                         "the reader yields nothing"):  # not the filters it was not given
        make_batch_reader(tmp_path / "written").stop()
    with pytest.raises(NoDataAvailableError):
        make_batch_reader(root, cur_shard=0, shard_count=2)
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    with pytest.raises(DatasetNotFoundError, match="no Parquet"):
        make_batch_reader(nothing)
    with pytest.raises(DatasetNotFoundError):
        make_reader(tmp_path / "missing")


# -- bounded memory ---------------------------------------------------------------------------------
MEMORY_CHILD = r"""
import gc, json, sys, threading, time
from unihub import open_dataset
from unihub.readers.reader import make_batch_reader, make_reader


def anonymous_kib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])


url, pool, batched, keep = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1"
store = open_dataset(url)
gc.collect()
base = peak = anonymous_kib()
done = threading.Event()


def sample():
    global peak
    while not done.wait(0.001):
        peak = max(peak, anonymous_kib())


sampler = threading.Thread(target=sample)
sampler.start()
kept = []
with (make_batch_reader if batched else make_reader)(store, reader_pool_type=pool) as reader:
    for i, item in enumerate(reader):
        if keep:
            kept.append(item)
        if batched or i % 8 == 0:
            time.sleep(0.004)  # a consumer slower than the workers, as in training: the queue fills up
done.set()
sampler.join()
print(json.dumps({"delta_kib": max(peak, anonymous_kib()) - base, "items": len(kept)}))
"""


def peak_anonymous_delta(path: Path, pool: str, *, batched: bool = False, keep: bool = False) -> float:
    """Peak growth (MiB) of a fresh interpreter's anonymous memory while it reads ``path`` with default
    options, sampled every millisecond.

    Anonymous, not all of RSS (VmHWM): file-backed pages in RSS are the memory-mapped Parquet files
    and the code of libraries loaded on the first read. How many of a file's pages stay mapped
    depends on how its row groups are spread over files, not on what the reader holds (one 300-row
    file: +9 MiB; the same rows in 5 files read shuffled: +4 MiB), and it made the comparison flaky.
    """
    # Default options: the reader picks jemalloc for Arrow (pyarrow's mimalloc keeps per-thread
    # arenas committed, which grew peak RSS ~1.8x with dataset size).
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(path), pool, str(int(batched)), str(int(keep))],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["delta_kib"] / 1024


DEFAULT_WINDOW = 2 * 10 + 2  # workers_count=10: 22 row groups in flight


@pytest.fixture(scope="module")
def memory_datasets(tmp_path_factory) -> tuple[Path, Path]:
    """Two datasets that both fill the reader's window: one of ~2 windows of row groups, one 10x larger
    (48 MB). A reader whose memory is bounded by its window peaks alike on both."""
    schema = Unischema("Memory", [
        UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("x", np.float32, (4096,), TensorCodec(), False),
    ])
    root = tmp_path_factory.mktemp("memory")
    rng = np.random.default_rng(0)

    def batches(n: int):
        for start in range(0, n, 64):
            k = min(64, n - start)
            yield {"id": np.arange(start, start + k), "x": rng.random((k, 4096), dtype=np.float32)}

    for name, n in (("small", 300), ("big", 3000)):
        write_dataset(root / name, schema, batches(n), batched=True, row_group_size_mb=0.1, rows_per_file=300)
    small, big = open_dataset(root / "small"), open_dataset(root / "big")
    assert 2 * DEFAULT_WINDOW <= len(small.row_groups) and 10 * len(small.row_groups) <= len(big.row_groups)
    assert big.total_bytes > 40 * 2**20
    return root / "small", root / "big"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc to measure memory")
def test_peak_memory_does_not_grow_with_dataset_size(memory_datasets):
    small, big = memory_datasets
    for pool, batched in (("thread", False), ("thread", True), ("dummy", False)):
        base = peak_anonymous_delta(small, pool, batched=batched)
        large = peak_anonymous_delta(big, pool, batched=batched)
        # 1 MiB of slack: the peaks are 0.3-2 MiB, and a reader that held a tenth of the big dataset holds 4.8
        assert large <= 1.5 * base + 1, f"{pool} pool, batched={batched}: {large:.1f} MiB vs {base:.1f} MiB"
    # the measurement itself can see a reader that holds on to what it read
    hoarded = peak_anonymous_delta(big, "dummy", keep=True)
    assert hoarded > 5 * peak_anonymous_delta(small, "dummy", keep=True), "the measurement is not sensitive"
