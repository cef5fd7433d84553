"""A single reader state with ``skip``/``exclude`` (rows after its position that a loader, a shuffled TF dataset
or a torch worker had delivered all the same) resumes exactly: the reader delivers the rest of its stream without
those rows, in the order a fresh run gives, none twice, and a state saved after that resumes as exactly.

Checked on row ids against a fresh run's stream (rows, or batch readers' rows in their batches' order).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unihub import NdarrayCodec, ScalarCodec, Unischema, UnischemaField, open_dataset, write_dataset
from unihub.errors import ReaderStateError
from unihub.readers.ngram import NGram
from unihub.readers.reader import Reader, make_batch_reader, make_reader

N = 203  # rows: row groups of ~8 rows in files of 50, so shards cut row groups and files
SCHEMA = Unischema("Drops", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                             UnischemaField("pad", np.uint8, (64,), NdarrayCodec(), False)])


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: Any) -> Path:
    path = tmp_path_factory.mktemp("drops") / "ds"
    write_dataset(path, SCHEMA, ({"id": i, "pad": np.full(64, i % 256, np.uint8)} for i in range(N)),
                  row_group_size_mb=0.0008, rows_per_file=50)
    assert len(open_dataset(path).row_groups) >= 20
    return path


def _open(dataset: Path, batched: bool, resume_from: Any = None, **options: Any) -> Reader:
    make = make_batch_reader if batched else make_reader
    return make(dataset, schema_fields=["id"], resume_from=resume_from, **options)


def _take(reader: Reader, items: int | None) -> list[int]:
    """Row ids of the next ``items`` items (all: None); a batch reader's batches are never empty."""
    ids: list[int] = []
    for count, item in enumerate(reader):
        if reader.batched:
            assert len(item.id), "an empty batch"
            ids += [int(i) for i in item.id]
        else:
            ids.append(int(item.id))
        if items is not None and count + 1 >= items:
            break
    return ids


def _dropped(skip: int, exclude: list[int]) -> set[int]:
    return set(range(skip)) | {skip + x for x in exclude}


def _json(state: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(state))


def _check(dataset: Path, batched: bool, options: dict[str, Any], stop: int, skip: int, exclude: list[int],
           again: int) -> None:
    """Stop after ``stop`` items, resume from that state with ``skip``/``exclude``, read ``again`` items, and
    resume again from the state then: both resumes deliver exactly the fresh stream's rest."""
    with _open(dataset, batched, **options) as reader:
        fresh = _take(reader, None)
    with _open(dataset, batched, **options) as reader:
        head = _take(reader, stop) if stop else []
        state = dict(_json(reader.state_dict()), skip=skip, exclude=exclude)
    gone = {len(head) + offset for offset in _dropped(skip, exclude)}
    expected = [row for at, row in enumerate(fresh) if at >= len(head) and at not in gone]
    with _open(dataset, batched, state, **options) as reader:
        middle = _take(reader, again) if again else []
        later = _json(reader.state_dict())
        rest = _take(reader, None)
    assert middle + rest == expected
    with _open(dataset, batched, **options) as reader:  # load_state_dict on a reader made anew: the same
        reader.load_state_dict(later)
        assert _take(reader, None) == rest
    if "shard_count" not in options:  # the state's rows to pass over are those an elastic resume counts too
        with _open(dataset, batched, [later], **options) as reader:
            assert _take(reader, None) == rest


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(batched=st.booleans(), shuffle_rows=st.booleans(), seed=st.integers(0, 9), data=st.data(),
       shard=st.sampled_from([None, (0, 3, "row", "pad"), (2, 3, "row_group", "pad"), (1, 4, "row", "drop")]),
       pool=st.sampled_from(["dummy", "thread"]))
def test_a_state_with_rows_to_pass_over_resumes_exactly(dataset: Path, batched: bool, shuffle_rows: bool, seed: int,
                                                         data: Any, shard: Any, pool: str) -> None:
    options: dict[str, Any] = dict(shuffle_row_groups=True, shuffle_rows=shuffle_rows, seed=seed, num_epochs=2,
                                   reader_pool_type=pool, workers_count=2)
    if shard is not None:
        options.update(cur_shard=shard[0], shard_count=shard[1], shard_by=shard[2], shard_remainder=shard[3])
    stop = data.draw(st.integers(0, 12 if batched else 2 * N // (shard[1] if shard else 1)), label="stop")
    skip = data.draw(st.integers(0, 12), label="skip")
    exclude = data.draw(st.lists(st.integers(0, 120), max_size=20, unique=True), label="exclude")
    again = data.draw(st.integers(0, 6 if batched else 80), label="again")
    _check(dataset, batched, options, stop, skip, exclude, again)


@pytest.mark.parametrize("batched", [False, True])
def test_rows_to_pass_over_in_a_process_pool_and_across_epochs(dataset: Path, batched: bool) -> None:
    options = dict(shuffle_rows=True, seed=3, num_epochs=3, reader_pool_type="process", workers_count=2,
                   cur_shard=1, shard_count=2, shard_by="row")
    _check(dataset, batched, options, 3, 5, [0, 2, 3, 90, 95, 140, 250], 2)  # offsets past the epoch's end


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(batched=st.booleans(), data=st.data(),
       shard=st.sampled_from([None, (1, 3, "row", "pad"), (0, 2, "row_group", "drop")]))
def test_skip_rows_after_a_resume_counts_only_rows_delivered(dataset: Path, batched: bool, data: Any,
                                                            shard: Any) -> None:
    """skip_rows(n) passes over the next n rows the reader would deliver: the rows its resumed state passes over
    are not among them, and are still passed over after (a state saved there resumes as exactly)."""
    options: dict[str, Any] = dict(shuffle_rows=True, seed=4, num_epochs=2, reader_pool_type="dummy")
    if shard is not None:
        options.update(cur_shard=shard[0], shard_count=shard[1], shard_by=shard[2], shard_remainder=shard[3])
    with _open(dataset, batched, **options) as reader:
        fresh = _take(reader, None)
    with _open(dataset, batched, **options) as reader:
        head = _take(reader, data.draw(st.integers(0, 3 if batched else 40), label="stop"))
        skip = data.draw(st.integers(0, 10), label="skip")
        exclude = data.draw(st.lists(st.integers(0, 100), max_size=15, unique=True), label="exclude")
        state = dict(_json(reader.state_dict()), skip=skip, exclude=exclude)
    gone = {len(head) + offset for offset in _dropped(skip, exclude)}
    expected = [row for at, row in enumerate(fresh) if at >= len(head) and at not in gone]
    count = data.draw(st.integers(0, len(expected) + 3), label="count")
    with _open(dataset, batched, state, **options) as reader:
        assert reader.skip_rows(count) == min(count, len(expected))
        later = _json(reader.state_dict())
        assert _take(reader, None) == expected[count:]
    with _open(dataset, batched, later, **options) as reader:
        if not batched:  # a batch reader's state is at its task's start; skip_rows' cut is not in it
            assert _take(reader, None) == expected[count:]


def test_a_state_says_the_rows_it_still_passes_over(dataset: Path) -> None:
    """Until they are passed, the rows to pass over are in every state (as skip and exclude after its position);
    then none are; a fresh reader's state has none."""
    options = dict(shuffle_row_groups=False, num_epochs=1)
    with _open(dataset, False, **options) as reader:
        assert (reader.state_dict()["skip"], reader.state_dict()["exclude"]) == (0, [])
        start = reader.state_dict()
    with _open(dataset, False, dict(start, skip=2, exclude=[1, 5]), **options) as reader:
        assert (reader.state_dict()["skip"], reader.state_dict()["exclude"]) == (2, [1, 5])
        assert _take(reader, 2) == [2, 4]  # rows 0, 1, 3 and 7 passed over
        assert (reader.state_dict()["skip"], reader.state_dict()["exclude"]) == (0, [2])  # row 7, two after row 5
        assert _take(reader, 3) == [5, 6, 8]
        assert (reader.state_dict()["skip"], reader.state_dict()["exclude"]) == (0, [])


def test_states_that_cannot_pass_over_rows_are_refused_by_name(dataset: Path, tmp_path: Path) -> None:
    with _open(dataset, False, shuffle_row_groups=False) as reader:
        next(reader)
        state = reader.state_dict()
        for bad in (dict(state, skip=-1), dict(state, exclude=[1, "2"]), dict(state, exclude=3)):
            with pytest.raises(ReaderStateError, match="'skip'"):
                reader.load_state_dict(bad)
        assert int(next(reader).id) == 1  # a refused state leaves the reader as it was
    ngram = NGram({0: ["id"], 1: ["id"]}, delta_threshold=10, timestamp_field="id")
    with make_reader(dataset, schema_fields=ngram, shuffle_row_groups=False) as reader:
        with pytest.raises(ReaderStateError, match="n-gram"):
            reader.load_state_dict(dict(reader.state_dict(), skip=1))


#: values of a state's counts that state_dict() never writes (JSON's own, and a number past int64)
HOSTILE_COUNTS = [None, "x", "5", -1, 1.5, True, float("inf"), float("nan"), [1], 2**70]


@pytest.mark.parametrize(("key", "as_list"), [
    *((key, as_list) for key in ("seed", "epoch", "task", "offset", "skip") for as_list in (False, True)),
    ("done_from", True),  # read only by an elastic resume
], ids=lambda value: {False: "one state", True: "every rank's"}.get(value, value) if isinstance(value, bool)
    else value)
def test_a_state_whose_counts_are_not_counts_is_refused_by_name(dataset: Path, key: str, as_list: bool) -> None:
    """Before: int() of them raised a raw TypeError, ValueError or OverflowError (and a position of -2**63 an
    IndexError) from load_state_dict."""
    with _open(dataset, False, shuffle_row_groups=False) as reader:
        next(reader)
        state = reader.state_dict()
        for value in HOSTILE_COUNTS:
            bad = dict(state, **{key: value})
            with pytest.raises(ReaderStateError, match=f"'{key}'"):
                reader.load_state_dict([bad] if as_list else bad)
        assert int(next(reader).id) == 1  # a refused state leaves the reader as it was


def test_an_elastic_state_naming_more_rows_passed_over_than_a_loader_holds_is_refused(dataset: Path) -> None:
    """Before: every rank's state with a skip of 2**40 was a MemoryError (each row passed over was listed)."""
    with _open(dataset, False, shuffle_row_groups=False, cur_shard=0, shard_count=1) as reader:
        next(reader)
        state = reader.state_dict()
        for bad in (dict(state, skip=2**40), dict(state, skip=2, exclude=[2**40])):
            with pytest.raises(ReaderStateError, match="'skip', 'exclude'"):
                reader.load_state_dict([bad])
        assert int(next(reader).id) == 1


@settings(max_examples=200, deadline=None, derandomize=True)
@given(own=st.tuples(st.integers(0, 5), st.lists(st.integers(0, 30), max_size=6, unique=True)),
       loader=st.tuples(st.integers(0, 5), st.lists(st.integers(0, 30), max_size=6, unique=True)))
def test_rows_a_loader_delivered_add_to_those_its_reader_state_passes_over(own: Any, loader: Any) -> None:
    """A loader's skip/exclude count the rows its reader delivers: where the reader's state passes over rows of
    its own, the loader's are the reader's after those (elastic.with_delivered_after, the torch loaders' list)."""
    from unihub.readers.elastic import with_delivered_after

    passed = _dropped(*own)
    delivered = [at for at in range(200) if at not in passed]
    state = with_delivered_after({"seed": 1, "skip": own[0], "exclude": own[1]}, *loader)
    assert state["seed"] == 1
    assert _dropped(state["skip"], state["exclude"]) == passed | {delivered[i] for i in _dropped(*loader)}
