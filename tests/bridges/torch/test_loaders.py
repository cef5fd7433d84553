"""PyTorch bridge: values and dtypes, padding, shuffling, exact resume, torch datasets and workers.

The dataset has 61 rows (a prime, so no shard count divides it) in row groups of a few
rows over several files. Values are compared exactly with the rows that were written.
"""

from __future__ import annotations

import datetime
import decimal
import itertools
import json
import math
import os
import re
import subprocess
import sys
import textwrap
import time
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import unihub.bridges.torch as tp
from unihub import (
    CompressedImageCodec,
    ScalarCodec,
    TensorCodec,
    UnihubError,
    Unischema,
    UnischemaField,
    open_dataset,
    write_dataset,
)
from unihub.bridges.torch import datasets as torch_datasets
from unihub.bridges.torch import sampler_rows
from unihub.dependencies import is_available
from unihub.errors import InvalidArgumentError
from unihub.readers import reader as reader_module
from unihub.readers.reader import make_batch_reader, make_reader

from .corrupt_images import corrupt_images

pytestmark = pytest.mark.skipif(not is_available("torch"), reason="torch is not installed")
torch = pytest.importorskip("torch")

N = 61
SCHEMA = Unischema("TorchTest", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), False),
    UnischemaField("price", decimal.Decimal, (), ScalarCodec(pa.decimal128(10, 2)), False),
    UnischemaField("vec", np.float32, (4,), TensorCodec(), False),
    UnischemaField("boxes", np.float32, (None, 4), TensorCodec(), False),
    UnischemaField("image", np.uint8, (4, 4, 3), CompressedImageCodec("png"), False),
])
NUMERIC = ["id", "vec", "image"]


def make_row(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    return {"id": i, "name": f"row-{i}", "price": decimal.Decimal(i) / 100,
            "vec": rng.random(4, dtype=np.float32), "boxes": rng.random((i % 4, 4), dtype=np.float32),
            "image": rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)}


ROWS = [make_row(i) for i in range(N)]


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("torch") / "ds"
    write_dataset(path, SCHEMA, (make_row(i) for i in range(N)), row_group_size_mb=0.0005, rows_per_file=20)
    store = open_dataset(path)
    assert len(store.row_groups) >= 10 and max(rg.num_rows for rg in store.row_groups) > 1
    return str(path)


def rows(url: str, **kwargs: Any) -> Any:
    kwargs.setdefault("shuffle_row_groups", False)
    return make_reader(url, reader_pool_type="dummy", **kwargs)


def batches(url: str, **kwargs: Any) -> Any:
    kwargs.setdefault("shuffle_row_groups", False)
    return make_batch_reader(url, reader_pool_type="dummy", **kwargs)


def ids(loader: Any) -> list[int]:
    return [i for batch in loader for i in batch["id"].tolist()]


def check_batch(batch: dict[str, Any], *, padded: bool = False) -> list[int]:
    """Every value of ``batch`` equals what was written; returns its ids."""
    got = batch["id"].tolist()
    assert batch["id"].dtype == torch.int64 and batch["vec"].dtype == torch.float32
    assert batch["image"].dtype == torch.uint8 and batch["image"].shape == (len(got), 4, 4, 3)
    for k, i in enumerate(got):
        want = ROWS[i]
        assert np.array_equal(batch["vec"][k].numpy(), want["vec"])
        assert np.array_equal(batch["image"][k].numpy(), want["image"])
        assert batch["name"][k] == want["name"] and batch["price"][k] == want["price"]
        n = len(want["boxes"])
        if padded:
            assert batch["boxes_mask"][k, :n].all() and not batch["boxes_mask"][k, n:].any()
            assert np.array_equal(batch["boxes"][k, :n].numpy(), want["boxes"])
            assert not batch["boxes"][k, n:].any()
        else:
            assert isinstance(batch["boxes"][k], torch.Tensor) and batch["boxes"][k].dtype == torch.float32
            assert np.array_equal(batch["boxes"][k].numpy(), want["boxes"])
    if padded:
        longest = max(len(ROWS[i]["boxes"]) for i in got)
        assert batch["boxes"].shape == batch["boxes_mask"].shape == (len(got), longest, 4)
        assert batch["boxes_mask"].dtype == torch.bool
    return got


# -- values -----------------------------------------------------------------------------------------
def test_import_does_not_import_torch():
    code = "import sys, unihub.bridges.torch.loaders; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("variable", ["list", "pad"])
def test_dataloader_values_and_dtypes(url, variable):
    with rows(url) as reader:
        loader = tp.DataLoader(reader, batch_size=7, collate_fn=tp.make_collate(variable=variable))
        assert len(loader) == math.ceil(N / 7)
        out = list(loader)
    assert [len(b["id"]) for b in out] == [7] * (N // 7) + [N % 7]
    assert [i for b in out for i in check_batch(b, padded=variable == "pad")] == list(range(N))
    assert isinstance(out[0]["name"], list) and isinstance(out[0]["price"][0], decimal.Decimal)


def _same_batch(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        x, y = a[name], b[name]
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y), name
        else:
            assert isinstance(y, list) and len(x) == len(y), name
            for u, v in zip(x, y):
                assert (torch.equal(u, v) and u.dtype == v.dtype) if isinstance(u, torch.Tensor) else u == v, name


def test_next_and_next_columns_share_one_position(url):
    """Rows taken one by one and as columns from the same reader interleave: each row once, in
    order, and a state saved between them resumes at the next row."""
    state, at = None, 0
    with rows(url) as reader:
        got = [int(next(reader).id) for _ in range(2)]
        while True:
            columns = reader.next_columns(3)
            if columns is None:
                break
            got += [int(i) for i in columns["id"]]
            assert list(columns) == list(SCHEMA.fields) and len(columns["id"]) <= 3
            try:
                got.append(int(next(reader).id))
            except StopIteration:
                break
            if state is None and len(got) >= 20:
                state, at = reader.state_dict(), len(got)
    assert got == list(range(N))
    with rows(url) as reader:
        reader.load_state_dict(state)
        assert int(reader.next_columns(1)["id"][0]) == at
    with batches(url) as reader, pytest.raises(UnihubError, match="row reader"):
        reader.next_columns(3)


@pytest.mark.parametrize("variable", ["list", "pad"])
def test_row_loader_takes_rows_as_columns_with_the_row_paths_values(url, variable, monkeypatch):
    """DataLoader(make_reader) with a make_collate collate takes the reader's rows as columns: the
    same batches, bit for bit, as collating row namedtuples one by one (which a collate that is
    a plain function still gets), and no namedtuple is made per row on the way."""
    collate = tp.make_collate(variable=variable).with_schema(SCHEMA)
    with rows(url) as reader:
        by_rows = list(tp.DataLoader(reader, batch_size=7, collate_fn=lambda r: collate(r)))

    def no_rows(self: Any, index: Any) -> Any:
        raise AssertionError("a row namedtuple was made")

    monkeypatch.setattr(reader_module._Rows, "__getitem__", no_rows)
    with rows(url) as reader:
        by_columns = list(tp.DataLoader(reader, batch_size=7, collate_fn=tp.make_collate(variable=variable)))
    assert len(by_columns) == len(by_rows) == math.ceil(N / 7)
    for a, b in zip(by_columns, by_rows):
        _same_batch(a, b)
    shuffled = []
    for _ in range(2):  # shuffled: every row once, with its values, the same order for the same seed
        with rows(url) as reader:
            shuffled.append(list(tp.DataLoader(reader, batch_size=7, shuffling_queue_capacity=20, seed=1)))
    got = [i for b in shuffled[0] for i in check_batch(b)]
    assert sorted(got) == list(range(N)) and got != list(range(N))
    assert got == ids(shuffled[1])


@pytest.mark.parametrize("variable", ["list", "pad"])
def test_batched_loader_values_transform_and_device(url, variable):
    seen = []

    def transform(batch: dict[str, Any]) -> dict[str, Any]:
        seen.append(len(batch["id"]))
        return batch

    with batches(url) as reader:
        loader = tp.BatchedDataLoader(reader, batch_size=9, batch_transform_fn=transform, device="cpu",
                                      variable=variable)
        assert len(loader) == math.ceil(N / 9)
        out = list(loader)
    assert seen == [9] * (N // 9) + [N % 9]
    assert [i for b in out for i in check_batch(b, padded=variable == "pad")] == list(range(N))


def test_batched_loader_over_row_reader(url):
    with rows(url) as reader:
        out = list(tp.BatchedDataLoader(reader, batch_size=5))
    assert [i for b in out for i in check_batch(b)] == list(range(N))


def test_collate_pads_and_keeps_lists():
    a, b = np.ones((1, 2), np.float32), np.full((3, 2), 2, np.float32)
    batch = tp.make_collate(pad=True)([{"x": a, "s": "p", "n": np.int32(1)}, {"x": b, "s": "q", "n": np.int32(2)}])
    assert batch["x"].shape == (2, 3, 2) and batch["x_mask"].tolist() == [
        [[True, True], [False, False], [False, False]], [[True, True]] * 3]
    assert batch["x"][0].tolist() == [[1, 1], [0, 0], [0, 0]] and batch["x"][1].tolist() == [[2, 2]] * 3
    assert batch["s"] == ["p", "q"] and batch["n"].dtype == torch.int32 and batch["n"].tolist() == [1, 2]
    listed = tp.default_collate_like([{"x": a}, {"x": b}])["x"]
    assert [t.shape for t in listed] == [(1, 2), (3, 2)]


def test_reiterating_resets_the_reader(url):
    with rows(url) as reader:
        loader = tp.DataLoader(reader, batch_size=8)
        assert ids(loader) == ids(loader) == list(range(N))
    with batches(url) as reader:
        loader = tp.BatchedDataLoader(reader, batch_size=8)
        assert ids(loader) == ids(loader) == list(range(N))


# -- shuffling ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["rows", "batched"])
def test_shuffling_queue_is_seeded_and_complete(url, kind):
    def run(seed: int) -> list[int]:
        if kind == "rows":
            with rows(url) as reader:
                return ids(tp.DataLoader(reader, batch_size=4, shuffling_queue_capacity=20, seed=seed))
        with batches(url) as reader:
            return ids(tp.BatchedDataLoader(reader, batch_size=4, shuffling_queue_capacity=20, seed=seed))

    first = run(1)
    assert sorted(first) == list(range(N))
    assert first != list(range(N))
    assert run(1) == first
    assert run(2) != first


def test_in_memory_loader_epochs(url):
    with batches(url) as reader:
        loader = tp.InMemBatchedDataLoader(reader, batch_size=10, num_epochs=3, shuffle=True, seed=3)
        out = list(loader)
    assert len(out) == len(loader) == 3 * math.ceil(N / 10)
    per_epoch = len(out) // 3
    epochs = [[i for b in out[e * per_epoch:(e + 1) * per_epoch] for i in check_batch(b)] for e in range(3)]
    assert all(sorted(e) == list(range(N)) for e in epochs)
    assert epochs[0] != list(range(N)) and epochs[0] != epochs[1]
    with rows(url) as reader:
        capped = list(tp.InMemBatchedDataLoader(reader, batch_size=10, num_epochs=2, rows_capacity=25))
    assert [b["id"].tolist() for b in capped] == [list(range(10)), list(range(10, 20)), list(range(20, 25))] * 2
    with rows(url) as reader:  # Petastorm's positional order: reader, batch_size, transform_fn, num_epochs, seed
        doubled = list(tp.InMemBatchedDataLoader(
            reader, 10, lambda c: torch.as_tensor(c) * 2 if c.dtype.kind in "iuf" else c, 1, 0, 25))
    assert [b["id"].tolist() for b in doubled] == [[2 * i for i in range(k, min(k + 10, 25))] for k in (0, 10, 20)]
    with rows(url) as reader:
        renamed = list(tp.InMemBatchedDataLoader(reader, 10, rows_capacity=25,
                                                 batch_transform_fn=lambda b: {"twice": b["id"] * 2}))
    assert [b["twice"].tolist() for b in renamed] == [[2 * i for i in range(k, min(k + 10, 25))] for k in (0, 10, 20)]


def test_a_seeded_in_memory_loader_shuffles_each_pass_anew_and_the_same_in_every_run(url):
    """``for epoch in range(E): for batch in loader`` over a seeded loader (num_epochs=1) served one order every
    epoch; each pass now shuffles anew, the same orders in every run, and a state resumes its pass's order."""
    def passes(count: int) -> list[list[int]]:
        with batches(url) as reader:
            loader = tp.InMemBatchedDataLoader(reader, batch_size=7, shuffle=True, seed=3)
            return [[i for b in loader for i in check_batch(b)] for _ in range(count)]

    first = passes(3)
    assert all(sorted(p) == list(range(N)) for p in first)
    assert len({tuple(p) for p in first}) == 3 and passes(3) == first
    with batches(url) as reader:
        loader = tp.InMemBatchedDataLoader(reader, batch_size=7, shuffle=True, seed=3)
        list(loader)
        second = iter(loader)
        head = [i for _ in range(2) for i in check_batch(next(second))]
        state = loader.state_dict()
    with batches(url) as reader:
        resumed = tp.InMemBatchedDataLoader(reader, batch_size=7, shuffle=True, seed=3)
        resumed.load_state_dict(json.loads(json.dumps(state)))
        assert head + [i for b in resumed for i in check_batch(b)] == first[1]
        assert [i for b in resumed for i in check_batch(b)] == first[2]  # and the pass after it


@pytest.mark.parametrize("kind", ["batched", "rows", "in memory"])
def test_transform_fn_takes_each_column_as_numpy_in_place_of_as_tensor_as_in_petastorm(url, kind):
    """Petastorm's ``transform_fn`` converts each column of a batch (``torch.as_tensor`` where not given): a migrated
    ``lambda c: torch.as_tensor(c).float()`` failed on the batch dict unihub gave it."""
    seen = []

    def to_float(column: Any) -> Any:
        seen.append(type(column))
        return torch.as_tensor(column).float() if column.dtype.kind in "iuf" else column

    with (batches(url) if kind == "batched" else rows(url)) as reader:
        if kind == "in memory":
            out = list(tp.InMemBatchedDataLoader(reader, batch_size=9, transform_fn=to_float))
        else:
            out = list(tp.BatchedDataLoader(reader, batch_size=9, transform_fn=to_float))
    assert seen and set(seen) == {np.ndarray}
    assert all(b["id"].dtype == torch.float32 for b in out)
    assert [int(i) for b in out for i in b["id"].tolist()] == list(range(N))


# -- resume ---------------------------------------------------------------------------------------
def make_loader(url: str, kind: str, capacity: int) -> Any:
    options = {"num_epochs": 2, "shuffle_row_groups": True, "shuffle_rows": True, "seed": 5}
    if kind == "rows":
        return tp.DataLoader(rows(url, **options), batch_size=6, shuffling_queue_capacity=capacity, seed=9)
    reader = batches(url, **options) if kind == "batched" else rows(url, **options)
    return tp.BatchedDataLoader(reader, batch_size=6, shuffling_queue_capacity=capacity, seed=9)


def run_with_cuts(url: str, kind: str, capacity: int, cuts: list[int]) -> list[list[int]]:
    """Ids per batch, restarting with a new reader + loader from ``state_dict()`` after each cut."""
    out: list[list[int]] = []
    state = None
    for stop in [*cuts, None]:
        loader = make_loader(url, kind, capacity)
        if state is not None:
            loader.load_state_dict(json.loads(json.dumps(state)))
        for batch in loader:
            out.append(check_batch(batch))
            if stop is not None and len(out) == stop:
                break
        state = loader.state_dict()
        loader.terminate()
    return out


@pytest.mark.parametrize("kind", ["rows", "batched", "batched-over-rows"])
def test_resume_without_queue_is_exact(url, kind):
    full = run_with_cuts(url, kind, 0, [])
    assert Counter(i for b in full for i in b) == Counter({i: 2 for i in range(N)})
    flat = [i for b in full for i in b]
    for cuts in ([1], [5], [10, 11], [3, 9, 17], [len(full) - 1]):
        resumed = run_with_cuts(url, kind, 0, cuts)
        assert [i for b in resumed for i in b] == flat, cuts


@pytest.mark.parametrize("kind", ["rows", "batched"])
def test_resume_with_queue_delivers_each_remaining_row_once(url, kind):
    full = run_with_cuts(url, kind, 15, [])
    assert Counter(i for b in full for i in b) == Counter({i: 2 for i in range(N)})
    for cuts in ([1], [4, 5], [2, 8, 14], [len(full) - 2]):
        resumed = run_with_cuts(url, kind, 15, cuts)
        assert resumed[:cuts[0]] == full[:cuts[0]]
        assert Counter(i for b in resumed for i in b) == Counter({i: 2 for i in range(N)}), cuts


def test_state_after_the_end_resumes_to_nothing(url):
    loader = make_loader(url, "batched", 0)
    list(loader)
    state = loader.state_dict()
    again = make_loader(url, "batched", 0)
    again.load_state_dict(state)
    assert list(again) == []


def test_bad_state_and_wrong_reader(url):
    with rows(url) as reader:
        loader = tp.DataLoader(reader)
        with pytest.raises(tp.LoaderStateError, match="version"):
            loader.load_state_dict({"version": 99})
        state = loader.state_dict()
        for tampered in ({"skip": -1}, {"skip": 1.5}, {"skip": None}, {"exclude": 3}, {"exclude": [1, -2]},
                         {"exclude": ["x"]}):  # named, not a raw TypeError nor rows dropped by a wrong count
            with pytest.raises(tp.LoaderStateError, match="skip"):
                loader.load_state_dict(dict(state, **tampered))
    with pytest.raises(UnihubError, match="cur_shard"):
        tp.TorchIterableDataset(url, cur_shard=0)


@pytest.mark.parametrize("key,value", [("skip", None), ("skip", "3"), ("skip", -1), ("skip", float("inf")),
                                       ("skip", 2**70), ("skip", 2**40), ("exclude", 5), ("exclude", ["x"]),
                                       ("exclude", [2**40])])
@pytest.mark.parametrize("elastic", [False, True], ids=["one state", "every rank's"])
def test_a_loader_state_whose_rows_are_not_counts_is_refused_by_name(url, key, value, elastic):
    """Before: int() of them raised raw TypeError/ValueError/OverflowError, and an elastic resume from a skip of
    2**40 a MemoryError (it lists each row passed over)."""
    with rows(url) as reader:
        loader = tp.DataLoader(reader, batch_size=2)
        next(iter(loader))
        state = dict(loader.state_dict(), **{key: value})
    with rows(url) as reader:
        with pytest.raises(tp.LoaderStateError, match="'skip'"):
            tp.DataLoader(reader, batch_size=2).load_state_dict([state] if elastic else state)


def test_data_loader_takes_a_batch_reader_as_petastorm_does(url):
    with rows(url) as reader:
        expected = [i for batch in tp.DataLoader(reader, batch_size=7) for i in batch["id"].tolist()]
    with batches(url) as reader:
        loader = tp.DataLoader(reader, batch_size=7)
        got = [b["id"].tolist() for b in loader]
    assert [i for b in got for i in b] == expected and {len(b) for b in got[:-1]} == {7}
    for cut in (1, 3, len(got) - 1):  # exact resume inside the reader's batches
        with batches(url) as reader:
            loader = tp.DataLoader(reader, batch_size=7)
            iterator = iter(loader)
            head = [next(iterator)["id"].tolist() for _ in range(cut)]
            state = loader.state_dict()
        with batches(url) as reader:
            loader = tp.DataLoader(reader, batch_size=7)
            loader.load_state_dict(state)
            tail = [b["id"].tolist() for b in loader]
        assert head + tail == got


def test_decimal_friendly_collate_is_petastorms():
    import decimal

    collated = tp.decimal_friendly_collate([{"d": decimal.Decimal("1.5"), "s": "a", "x": np.float64(1), "v": [1, 2]},
                                            {"d": decimal.Decimal("2"), "s": "b", "x": np.float64(2), "v": [3, 4]}])
    assert collated["d"] == [decimal.Decimal("1.5"), decimal.Decimal("2")] and collated["s"] == ["a", "b"]
    assert collated["x"].dtype == torch.float64 and collated["x"].tolist() == [1.0, 2.0]
    assert [t.tolist() for t in collated["v"]] == [[1, 3], [2, 4]]


def test_decimal_friendly_collate_keeps_a_position_s_decimals_as_a_tuple():
    """Petastorm's: rows that are sequences collate position by position; decimals stay a tuple."""
    collated = tp.decimal_friendly_collate(([decimal.Decimal("1.0"), 1], [decimal.Decimal("1.1"), 2]))
    assert isinstance(collated, list) and len(collated) == 2
    assert collated[0] == (decimal.Decimal("1.0"), decimal.Decimal("1.1"))
    assert collated[1].tolist() == [1, 2] and collated[1].dtype == torch.int64
    assert tp.decimal_friendly_collate([decimal.Decimal("2"), decimal.Decimal("3")]) == [decimal.Decimal("2"),
                                                                                          decimal.Decimal("3")]



def test_decimal_friendly_collate_stacks_uint64_scalars_and_names_a_field_torch_refuses(tmp_path):
    """Over unihub's DataLoader (rows of numpy scalars), a uint64 field failed in torch's default_collate ("an
    integer is required", for any value), and a null or rows of different shapes failed with torch's words
    alone; Petastorm's TypeError for a null named the field. Now uint64 stacks, and torch's refusal names the
    field in the same built-in exception."""
    table = pa.table({"id": pa.array(range(6), pa.int64()),
                      "big": pa.array([2**64 - 1 - i for i in range(6)], pa.uint64()),
                      "maybe": pa.array([None if i == 2 else i for i in range(6)], pa.int32()),
                      "ragged": pa.array([[0.5] * (i % 3) for i in range(6)], pa.list_(pa.float32()))})
    pq.write_table(table, tmp_path / "part.parquet")

    def first(field: str) -> Any:
        reader = make_reader(tmp_path.as_uri(), num_epochs=1, schema_fields=["id", field], shuffle_row_groups=False,
                             reader_pool_type="dummy")
        return next(iter(tp.DataLoader(reader, batch_size=6, collate_fn=tp.decimal_friendly_collate)))

    big = first("big")["big"]
    assert big.dtype == torch.uint64 and [int(v) for v in big.numpy()] == [2**64 - 1 - i for i in range(6)]
    for field, kind in (("maybe", RuntimeError), ("ragged", RuntimeError)):
        with pytest.raises(kind, match=rf"^field '{field}': .*make_collate\(\) keeps nulls"):
            first(field)
    collated = tp.decimal_friendly_collate([{"x": np.float32(1), "b": np.bool_(True)},
                                            {"x": np.float32(2), "b": np.bool_(False)}])
    assert collated["x"].dtype == torch.float32 and collated["b"].tolist() == [True, False]

def _lists_dataset(directory: Any) -> tuple[str, dict[int, list[int]], dict[int, list[int]]]:
    """Parquet written by pyarrow (no Unischema): a list column of one length in every row, and a
    ragged one; row groups of 4 rows, so loader batches of 3 cross them."""
    fixed = {i: [i, i * 7, -i] for i in range(22)}
    ragged = {i: list(range(i % 3)) for i in range(22)}
    table = pa.table({"id": pa.array(range(22), pa.int64()), "fixed": pa.array(list(fixed.values()), pa.list_(pa.int32())),
                      "ragged": pa.array(list(ragged.values()), pa.list_(pa.int64()))})

    pq.write_table(table, directory / "part-0.parquet", row_group_size=4)
    return directory.as_uri(), fixed, ragged


@pytest.mark.parametrize("variable", ["list", "pad"])
@pytest.mark.parametrize("capacity", [0, 5])
def test_data_loader_over_a_batch_reader_stacks_a_list_column_of_one_length(tmp_path, variable, capacity):
    """Petastorm's DataLoader(make_batch_reader(...)) gives a list column whose rows have one length
    as a (batch, k) tensor (its test_with_batch_reader); ragged ones stay lists (or padded)."""
    dataset, fixed, ragged = _lists_dataset(tmp_path)
    collate = tp.make_collate(variable=variable)
    with tp.DataLoader(batches(dataset, seed=1), batch_size=3, collate_fn=collate,
                       shuffling_queue_capacity=capacity, seed=2) as loader:
        out = list(loader)
    seen = []
    for batch in out:
        got = batch["id"].tolist()
        seen += got
        assert isinstance(batch["fixed"], torch.Tensor) and batch["fixed"].shape == (len(got), 3)
        assert batch["fixed"].dtype == torch.int32 and batch["fixed"].tolist() == [fixed[i] for i in got]
        if variable == "pad":
            assert batch["fixed_mask"].shape == (len(got), 3) and bool(batch["fixed_mask"].all())
            for k, i in enumerate(got):
                n = len(ragged[i])
                assert batch["ragged"][k, :n].tolist() == ragged[i] and bool(batch["ragged_mask"][k, :n].all())
                assert not batch["ragged_mask"][k, n:].any()
        else:
            assert "fixed_mask" not in batch
            assert [t.tolist() for t in batch["ragged"]] == [ragged[i] for i in got]
    assert sorted(seen) == list(range(22)) and [len(b["id"]) for b in out] == [3] * 7 + [1]
    if capacity == 0:
        assert seen == list(range(22))


# -- torch datasets -------------------------------------------------------------------------------
def epoch_ids(loader: Any) -> list[int]:
    return [i for batch in loader for i in batch["id"].tolist()]


def test_each_torch_worker_reads_with_its_share_of_the_cores(url, monkeypatch):
    """A reader decodes with a thread per core; in each of k torch workers it gets cores // k
    (at least one), unless the user chose workers_count."""
    import types

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)  # usable_cores() asks it
    assert [torch_datasets._threads_per_worker(k) for k in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    chosen: list[Any] = []
    real = reader_module.make_batch_reader

    def recording(url: Any, **kwargs: Any) -> Any:
        chosen.append(kwargs.get("workers_count"))
        return real(url, **kwargs)

    monkeypatch.setattr(torch_datasets, "make_batch_reader", recording)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: types.SimpleNamespace(id=1, num_workers=3))
    for kwargs in ({}, {"workers_count": 5}):
        ds = tp.TorchIterableDataset(url, batch_size=8, seed=0, schema_fields=["id"], **kwargs)
        assert sum(len(b["id"]) for b in ds) == math.ceil(N / 3)  # worker 1 of 3: rows 21..41
    assert chosen == [2, 5]


@pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")
@pytest.mark.parametrize("workers, pin", [(0, False), (2, False), (2, True)])
def test_iterable_dataset_rows_exactly_once(url, workers, pin):
    """pin_memory=True pins on a machine with an accelerator; on a CPU-only one torch warns and goes on."""
    ds = tp.TorchIterableDataset(url, seed=4, reader_pool_type="dummy",
                                 schema_fields=["id", "name", "vec", "image"])
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=workers, pin_memory=pin,
                                         persistent_workers=workers > 0)
    first, second = epoch_ids(loader), epoch_ids(loader)
    assert sorted(first) == sorted(second) == list(range(N))
    assert first != second  # each epoch is shuffled with (seed, epoch)


def test_iterable_dataset_keeps_its_local_disk_cache_for_the_next_epoch(url, tmp_path, monkeypatch):
    """The dataset opens a reader per epoch; its with-block removed the cache (Petastorm's cleanup=True) at each
    epoch's end, so every epoch read every row group from the store again."""
    reads = []
    real = reader_module.ParquetStore.read_row_group
    monkeypatch.setattr(reader_module.ParquetStore, "read_row_group",
                        lambda self, *a, **k: reads.append(1) or real(self, *a, **k))
    cache = tmp_path / "cache"
    ds = tp.TorchIterableDataset(url, seed=4, reader_pool_type="dummy", schema_fields=["id", "vec"],
                                 cache_type="local-disk", cache_location=str(cache), cache_size_limit=2**30)
    loader = torch.utils.data.DataLoader(ds, batch_size=8)
    first = epoch_ids(loader)
    fetched = len(reads)
    second = epoch_ids(loader)
    assert sorted(first) == sorted(second) == list(range(N)) and first != second
    assert fetched == len(open_dataset(url).row_groups) and len(reads) == fetched  # the second epoch: all hits
    assert cache.is_dir()


def test_iterable_dataset_batches_with_workers(url):
    ds = tp.TorchIterableDataset(url, batch_size=5, seed=4, reader_pool_type="dummy", variable="pad")
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    for _ in range(2):
        got = [i for batch in loader for i in check_batch(batch, padded=True)]
        assert sorted(got) == list(range(N))


def test_columns_move_into_one_shared_storage_unchanged():
    vec = torch.arange(24, dtype=torch.float32).reshape(4, 6).t()  # not contiguous
    columns = {"id": torch.arange(6), "vec": vec, "half": torch.ones(6, 2, dtype=torch.bfloat16) / 3,
               "image": torch.randint(0, 256, (6, 4, 4, 3), dtype=torch.uint8), "name": [f"n{i}" for i in range(6)]}
    out = tp.in_one_shared_storage(columns)
    for name in ("id", "vec", "half", "image"):
        assert out[name].dtype == columns[name].dtype and out[name].shape == columns[name].shape
        assert torch.equal(out[name], columns[name]), name
        assert out[name].untyped_storage().data_ptr() == out["id"].untyped_storage().data_ptr()
        assert out[name].data_ptr() % 64 == 0
    assert out["id"].untyped_storage().is_shared()
    assert out["name"] is columns["name"]
    again = tp.in_one_shared_storage(out)
    assert all(again[name] is out[name] for name in out)  # already shared: not copied again
    lone = {"id": torch.arange(3), "name": ["a", "b", "c"]}
    assert tp.in_one_shared_storage(lone) is lone  # torch shares a lone tensor in one descriptor itself


def _pooled(pool: Any, value: int) -> Any:
    columns = {"a": torch.full((8,), value, dtype=torch.int64), "b": torch.full((2, 3), value, dtype=torch.uint8)}
    return pool.sending(tp.in_one_shared_storage(columns, pool))


def _arrive(batch: Any) -> Any:
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (torch's reductions of shared storages)

    return ForkingPickler.loads(bytes(ForkingPickler.dumps(batch)))


def test_a_pool_slot_is_refilled_only_once_its_batch_arrived_and_nothing_views_it():
    """The pool's protocol in one process (a pool that is not this process's own acts as a worker's):
    a slot is handed out again only when its batches arrived and no tensor views it; a batch
    carries its storage until the receiver holds it, then only the layout; a batch pickled twice is
    sent twice, bytes unpickled twice count once."""
    from multiprocessing.reduction import ForkingPickler

    from unihub.bridges.torch import shared_batches

    pool = shared_batches.StoragePool(slots=2)
    first = _pooled(pool, 1)
    assert isinstance(first, shared_batches.PooledBatch)
    storage = first.storage
    arrived = _arrive(first)
    assert type(arrived) is dict and int(arrived["a"][0]) == 1 and not arrived["a"].is_shared()
    assert shared_batches.storages_received(pool.id) == 1  # the storage travelled with the first batch
    held = first["a"]  # a view of the slot, kept in the "worker"
    del first
    other = _pooled(pool, 2)
    assert other.storage.data_ptr() != storage.data_ptr()  # viewed: not refilled
    assert int(_arrive(other)["a"][0]) == 2
    del held, other
    second = _pooled(pool, 3)
    assert second.storage.data_ptr() == storage.data_ptr()  # arrived, unviewed: refilled
    data = bytes(ForkingPickler.dumps(second))
    assert shared_batches.storages_received(pool.id) == 2  # the second slot's storage; then layouts only
    assert shared_batches.counters_received(pool.id) == 1  # the counters crossed with the first storage only
    once, twice = ForkingPickler.loads(data), ForkingPickler.loads(data)
    assert int(once["a"][0]) == int(twice["a"][0]) == 3 and torch.equal(once["b"], torch.full((2, 3), 3, dtype=torch.uint8))
    assert shared_batches.storages_received(pool.id) == 2
    counts = shared_batches.counters(pool.id)
    assert counts[0].tolist() == counts[1].tolist()  # sent == released: the second unpickling not counted
    again = bytes(ForkingPickler.dumps(second))  # the same batch sent again: busy until it arrives too
    assert shared_batches.counters(pool.id)[0].sum() == counts[0].sum() + 1
    del second
    assert _pooled(pool, 4).storage.data_ptr() != storage.data_ptr()
    assert int(ForkingPickler.loads(again)["a"][0]) == 3


def test_a_lent_column_holds_its_slot_until_nothing_in_the_main_process_views_it(monkeypatch):
    """A pooled batch's biggest column (from LEND_BYTES on) arrives as a view of its slot, the others
    as copies; the slot is released, and refilled, only once nothing views it, as seen when a later
    batch arrives."""
    from unihub.bridges.torch import shared_batches

    monkeypatch.setattr(shared_batches, "LEND_BYTES", 64)  # "a": 8 int64 (64 bytes), "b": 6 bytes
    pool = shared_batches.StoragePool(slots=2)
    first = _pooled(pool, 1)
    slot_memory = first.storage.data_ptr()
    arrived = _arrive(first)
    assert arrived["a"].is_shared() and not arrived["b"].is_shared()  # lent; copied
    assert arrived["a"].tolist() == [1] * 8
    kept = arrived["a"][2:5]  # a view of the lent column holds the slot too
    del first, arrived
    second = _pooled(pool, 2)
    assert second.storage.data_ptr() != slot_memory  # still viewed in the "main process": not refilled
    assert _arrive(second)["a"].tolist() == [2] * 8  # arrives (and settles): the first slot stays lent
    del second
    assert kept.tolist() == [1] * 3
    counts = shared_batches.counters(pool.id)
    assert counts[0].tolist() == [1, 1] and counts[1].tolist() == [0, 0]  # neither slot released yet
    del kept
    third = _pooled(pool, 3)  # nothing was released since: new memory, outside the slots
    assert not isinstance(third, shared_batches.PooledBatch)
    assert _arrive(_pooled(pool, 4)).keys() == {"a", "b"}  # no free slot: unpooled, torch's way
    shared_batches._arrivals().settle()  # what the next pooled arrival does first
    assert shared_batches.counters(pool.id)[1].tolist() == [1, 1]
    again = _pooled(pool, 5)
    assert again.storage.data_ptr() == slot_memory and _arrive(again)["a"].tolist() == [5] * 8


@pytest.mark.parametrize("how", ["fork", "pickled"])
def test_a_lent_slot_another_process_may_read_is_given_up(monkeypatch, how):
    """A lent column's memory that could reach another process (the main process forks, or pickles a
    tensor viewing it for another process) is never refilled: the worker puts new memory in the slot."""
    from multiprocessing.reduction import ForkingPickler

    from unihub.bridges.torch import shared_batches

    monkeypatch.setattr(shared_batches, "LEND_BYTES", 64)
    pool = shared_batches.StoragePool(slots=1)
    first = _pooled(pool, 1)
    slot_memory = first.storage.data_ptr()
    column = _arrive(first)["a"]
    del first
    if how == "fork":
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    else:
        ForkingPickler.dumps(column[:3])
    del column
    shared_batches._arrivals().settle()
    counts = shared_batches.counters(pool.id)
    assert counts[1].tolist() == [0] and counts[4].tolist() == [1]  # not released: given up (generation 1)
    second = _pooled(pool, 2)
    assert isinstance(second, shared_batches.PooledBatch) and second.storage.data_ptr() != slot_memory
    assert _arrive(second)["a"].tolist() == [2] * 8
    new_memory = second.storage.data_ptr()
    del second
    shared_batches._arrivals().settle()
    third = _pooled(pool, 3)  # the slot's new memory is reused as before
    assert third.storage.data_ptr() == new_memory


def test_a_pooled_batch_pickled_for_anything_else_is_a_plain_dict_of_copies():
    # pickle or torch.save in a worker (a checkpoint of a batch, say): a plain dict of new tensors,
    # and nothing counted as sent (the slot is not held for an arrival that will never come)
    import pickle

    from unihub.bridges.torch import shared_batches

    pool = shared_batches.StoragePool(slots=1)
    batch = _pooled(pool, 7)
    for again in (pickle.loads(pickle.dumps(batch)), torch.load(_saved(batch), weights_only=False)):
        assert type(again) is dict and again.keys() == batch.keys()
        assert torch.equal(again["a"], batch["a"]) and torch.equal(again["b"], batch["b"])
        assert again["a"].untyped_storage().data_ptr() != batch.storage.data_ptr()
    assert pool._counts[0].tolist() == [0]
    del batch, again
    assert isinstance(_pooled(pool, 8), shared_batches.PooledBatch)  # the slot is free again


def test_a_pooled_batch_sent_to_its_own_worker_reads_its_slot_or_is_refused():
    from multiprocessing.reduction import ForkingPickler

    from unihub.bridges.torch import shared_batches
    from unihub.errors import UsageError

    pool = shared_batches.worker_pool()  # this process plays the worker
    try:
        batch = _pooled(pool, 1)
        again = ForkingPickler.loads(bytes(ForkingPickler.dumps(batch)))
        assert int(again["a"][0]) == 1 and torch.equal(again["b"], batch["b"])
        data = bytes(ForkingPickler.dumps(batch))
        ForkingPickler.dumps({"a": batch["a"]})  # the slot's memory leaves on its own: given up
        del batch, again
        _pooled(pool, 2)  # the slot gets new memory
        with pytest.raises(UsageError, match="given up"):
            ForkingPickler.loads(data)  # not the new memory's values, read as the old batch's
    finally:
        shared_batches._POOL = None


def _saved(value: Any) -> Any:
    import io

    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return buffer


class TaggedTensor(torch.Tensor):
    """A tensor subclass a caller's collate or wrapper may make of a batch's column."""


class EachBatch(torch.utils.data.IterableDataset):
    """A caller's wrapping dataset: what ``each(batch)`` yields for every batch of ``inner``."""

    def __init__(self, inner: Any, each: Any) -> None:
        self.inner, self.each = inner, each

    def __iter__(self) -> Any:
        for batch in self.inner:
            yield from self.each(batch)


def _tagged(batch: dict[str, Any]) -> Any:
    batch["image"] = batch["image"].as_subclass(TaggedTensor)
    batch["vec"] = batch["vec"].requires_grad_()
    yield batch


def test_worker_batches_keep_tensor_subclasses_and_requires_grad(url):
    ds = EachBatch(tp.TorchIterableDataset(url, batch_size=4, seed=4, schema_fields=NUMERIC), _tagged)
    held = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1))
    assert sorted(i for b in held for i in b["id"].tolist()) == list(range(N))
    for batch in held:
        assert type(batch["image"]) is TaggedTensor and batch["vec"].requires_grad
        assert type(batch["id"]) is torch.Tensor
        for k, i in enumerate(batch["id"].tolist()):
            assert np.array_equal(batch["image"][k].numpy(), ROWS[i]["image"])
            assert np.array_equal(batch["vec"][k].detach().numpy(), ROWS[i]["vec"])


def test_pool_memory_that_leaves_beside_a_pooled_batch_is_given_up():
    # a tensor viewing a slot, pickled on its own (a collate_fn returning a batch's column beside
    # the batch): its storage now belongs to the receiver and is never refilled
    from unihub.bridges.torch import shared_batches

    pool = shared_batches.StoragePool(slots=1)
    batch = _pooled(pool, 5)
    column = _arrive({"ids": batch["a"]})["ids"]  # through torch's reducer: the slot's memory itself
    storage = batch.storage
    assert int(_arrive(batch)["a"][0]) == 5
    del batch
    counts = shared_batches.counters(pool.id)
    assert counts[0].tolist() == counts[1].tolist() == [1]  # arrived: but given up, not refilled
    refill = _pooled(pool, 6)
    assert refill.storage.data_ptr() != storage.data_ptr()
    assert column.tolist() == [5] * 8


@pytest.mark.parametrize("shuffle_rows", [False, True])
def test_worker_batches_arrive_with_a_storage_per_column(url, shuffle_rows):
    """In torch workers each batch's tensors cross in one shared storage (one descriptor, handed over
    once per slot); they arrive with every value as written, every row once, and each column in
    memory of its own: keeping one column (a metric's labels) keeps only that column."""
    ds = tp.TorchIterableDataset(url, batch_size=7, seed=4, shuffle_rows=shuffle_rows)
    got = []
    for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2):
        got += check_batch(batch)
        storages = {batch[name].untyped_storage().data_ptr() for name in NUMERIC}
        assert len(storages) == len(NUMERIC), storages
        assert batch["id"].untyped_storage().nbytes() == batch["id"].numel() * 8
    assert sorted(got) == list(range(N))


@pytest.mark.parametrize("lend", [False, True], ids=["copied", "lent"])
@pytest.mark.parametrize("hold", [0, 1, 3], ids=["dropped", "held", "every-third-held"])
def test_worker_batches_reuse_shared_memory_and_keep_every_value(url, monkeypatch, hold, lend):
    """A worker refills a batch's shared memory (bridges/torch/shared_batches.py) only once the batch has
    arrived and nothing in the main process views it: each column copied into the main process's own
    memory, or (with a column big enough to lend) the biggest one a view of the worker's slot.
    Batches held to the end keep every value while the workers reuse the slots of those dropped."""
    from unihub.bridges.torch import shared_batches

    if lend:
        monkeypatch.setattr(shared_batches, "LEND_BYTES", 1)  # the images, the biggest column here
    before = set(shared_batches.pools())
    ds = tp.TorchIterableDataset(url, batch_size=3, seed=4)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    held, got, lent, unpooled = [], [], 0, 0
    for _ in range(2):
        for k, batch in enumerate(loader):
            image_memory = batch["image"].untyped_storage().data_ptr()
            if not lend:
                assert not any(batch[name].is_shared() for name in NUMERIC)  # the main process's own memory
            elif batch["id"].is_shared():  # every slot lent to a held batch: new memory, torch's way
                assert batch["id"].untyped_storage().data_ptr() == image_memory
                unpooled += 1
            else:
                assert batch["image"].is_shared() and not batch["vec"].is_shared()
                lent += 1
            if hold and k % hold == 0:
                held.append(batch)
            else:
                got += check_batch(batch)
    for batch in held:  # values read after every later batch was sent
        got += check_batch(batch)
    assert sorted(got) == sorted(list(range(N)) * 2)
    if lend:
        assert lent > 0 and (unpooled == 0 if not hold else unpooled > 0 if hold == 1 else True)
    pools = [p for p in set(shared_batches.pools()) - before]
    assert len(pools) == 2  # one per worker, kept over both epochs
    del batch, held
    with shared_batches._LOCK:
        shared_batches._arrivals().settle()
    counts = [shared_batches.counters(p) for p in pools]
    sent, released, refilled = (sum(int(c[row].sum()) for c in counts) for row in range(3))
    assert sent > 0 and released == sent  # every batch arrived once; every lent slot released once unviewed
    assert refilled == 0 if lend and hold == 1 else refilled > 0  # a slot is refilled only once nothing views it


def test_a_worker_whose_slots_were_all_lent_gets_them_back_once_they_are_dropped(url, monkeypatch):
    """Batches kept past the pool's size leave every slot lent (the worker sends new memory meanwhile);
    once they are dropped, the next batch to arrive, pooled or not, releases the slots, and the worker
    reuses them."""
    from unihub.bridges.torch import shared_batches

    monkeypatch.setattr(shared_batches, "LEND_BYTES", 1)
    ds = tp.TorchIterableDataset(url, batch_size=2, seed=4)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1, persistent_workers=True)

    def lent(batch: Any) -> bool:  # pooled: the images lent, the ids copied
        return batch["image"].is_shared() and not batch["id"].is_shared()

    kept = list(loader)  # every batch held: past SLOTS of them, unpooled
    assert sorted(i for b in kept for i in check_batch(b)) == list(range(N))
    assert sum(map(lent, kept)) == shared_batches.SLOTS < len(kept)
    del kept
    again = [lent(b) for b in loader]
    assert sum(again) >= len(again) - 2  # from the first batch or two on, pooled again


def test_a_batch_held_across_a_fork_keeps_its_values_in_the_child(url, monkeypatch):
    """A child forked while the main process holds a lent column sees that column's values, however
    far the iteration goes on (the slot is given up at the fork, never refilled)."""
    import multiprocessing

    from unihub.bridges.torch import shared_batches

    monkeypatch.setattr(shared_batches, "LEND_BYTES", 1)
    ds = tp.TorchIterableDataset(url, batch_size=2, seed=4)
    loader = iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1))
    batch = next(loader)
    assert batch["image"].is_shared()
    ids = batch["id"].tolist()
    context = multiprocessing.get_context("fork")
    go, result = context.Event(), context.Queue()

    held = [batch]  # the child's copy of this list keeps the batch; the parent's is emptied
    del batch

    def child() -> None:
        go.wait(60)
        result.put(all(np.array_equal(held[0]["image"][k].numpy(), ROWS[i]["image"]) for k, i in enumerate(ids)))

    process = context.Process(target=child)
    process.start()
    held.clear()
    rest = [i for b in loader for i in check_batch(b)]  # the worker goes on, refilling free slots
    go.set()
    assert result.get(timeout=60) is True
    process.join(60)
    assert sorted(ids + rest) == list(range(N))


def test_worker_storages_cross_once_and_exited_workers_pools_are_forgotten(url):
    """A pool's storage crosses to the main process with the first batches it holds; later batches
    carry only their layout. Once a worker has exited with all its batches arrived, the main
    process lets go of its pool when another pool arrives."""
    from unihub.bridges.torch import shared_batches

    before = set(shared_batches.pools())
    ds = tp.TorchIterableDataset(url, batch_size=2, seed=4)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    assert sorted(i for _ in range(3) for batch in loader for i in check_batch(batch)) == sorted(list(range(N)) * 3)
    first = set(shared_batches.pools()) - before
    sent = sum(int(shared_batches.counters(pool)[0].sum()) for pool in first)
    carried = sum(shared_batches.storages_received(pool) for pool in first)
    assert len(first) == 2 and sent == 3 * math.ceil(N / 2 / 2) * 2 - 3 * (math.ceil(N / 2) % 2)
    assert carried <= 2 * (shared_batches.SLOTS + 2) < sent // 4
    # the counters cross with a worker's first storages only: those pickled before it heard one arrived
    assert all(1 <= shared_batches.counters_received(pool) <= shared_batches.storages_received(pool) for pool in first)
    del loader  # its workers exit
    for _ in range(100):
        if not any(shared_batches._arrivals().pools[pool].running() for pool in first):
            break
        time.sleep(0.05)
    again = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    assert sorted(i for batch in again for i in check_batch(batch)) == list(range(N))
    assert not first & set(shared_batches.pools())


def test_a_pooled_batch_unpickled_without_its_memory_is_refused():
    from unihub.bridges.torch import shared_batches
    from unihub.errors import UsageError

    with pytest.raises(UsageError, match="does not hold the shared memory"):
        shared_batches._received(["a"], {"a": (torch.uint8, (3,), (1,), 0)}, {}, "no-such-pool", 1, 0, 1, 1, None)


def _handshakes(monkeypatch) -> list[int]:
    """Counts the descriptors this process takes over torch's way (a connection to the sender's
    resource-sharer thread each)."""
    from multiprocessing import resource_sharer

    count = [0]
    detach = resource_sharer.DupFd.detach

    def counted(self: Any) -> int:
        count[0] += 1
        return detach(self)

    monkeypatch.setattr(resource_sharer.DupFd, "detach", counted)
    return count


def _checked_ids(loader: Any) -> list[int]:
    """The ids of every batch ``loader`` gives, each row's ``vec`` (and ``image``, where loaded) checked."""
    got = []
    for b in loader:
        for k, i in enumerate(b["id"].tolist()):
            assert np.array_equal(b["vec"][k].numpy(), ROWS[i]["vec"])
            if "image" in b:
                assert np.array_equal(b["image"][k].numpy(), ROWS[i]["image"])
        got += b["id"].tolist()
    return got


@pytest.mark.parametrize("channel", [True, False], ids=["channel", "torch-handshakes"])
def test_forked_workers_hand_their_storages_over_the_inherited_channel(url, monkeypatch, channel):
    """The process that built the dataset opened a channel its forked workers inherit: their storages'
    descriptors cross on it, with no handshake (bridges/torch/fd_channel.py). Without it (a dataset built in
    another process) they cross torch's way. Either way every value arrives, and nothing is left over."""
    from unihub.bridges.torch import fd_channel, shared_batches

    handshakes = _handshakes(monkeypatch)
    iterable = tp.TorchIterableDataset(url, batch_size=4, seed=4, schema_fields=NUMERIC)
    mapped = tp.TorchMapDataset(url, schema_fields=NUMERIC)  # columns of other types cross as torch sends them
    if not channel:
        monkeypatch.setattr(fd_channel, "_OWN", None)
    carried = 0

    def new_pools_carried(before: set[str]) -> int:
        pools = set(shared_batches.pools()) - before
        assert len(pools) == 2  # a worker's pool each
        return sum(shared_batches.storages_received(pool) for pool in pools)

    for loader in (torch.utils.data.DataLoader(iterable, batch_size=None, num_workers=2),
                   torch.utils.data.DataLoader(mapped, batch_size=4, num_workers=2)):
        before = set(shared_batches.pools())
        assert sorted(_checked_ids(loader)) == list(range(N))
        carried += new_pools_carried(before)
    assert carried >= 4
    if channel:
        assert handshakes[0] == 0
    else:
        assert handshakes[0] >= carried + 4  # each storage, and each pool's counters at least once
    assert fd_channel.pending() == 0


def _numeric_only(row: dict[str, Any]) -> dict[str, Any]:
    return {name: row[name] for name in NUMERIC}


def _numeric_mapping(row: dict[str, Any]) -> Any:
    from collections import OrderedDict

    return OrderedDict((name, row[name]) for name in NUMERIC)  # not a dict: torch collates it field by field


def test_batches_torch_collates_in_forked_workers_cross_without_a_handshake(url, monkeypatch):
    """Rows collated by torch in a worker (a ``transform``'s mapping other than a dict, or
    ``TorchIterableDataset``'s rows with a text field) are in new shared memory, a storage per field
    per batch: each crosses on the channel, not over a connection of its own (939 handshakes an epoch
    of 20,000 rows before, 0.35-0.58 s of the main process)."""
    from unihub.bridges.torch import fd_channel

    handshakes = _handshakes(monkeypatch)
    received = [0]
    receive = fd_channel.receive

    def counted(token: bytes) -> int:
        received[0] += 1
        return receive(token)

    monkeypatch.setattr(fd_channel, "receive", counted)
    mapped = tp.TorchMapDataset(url, transform=_numeric_mapping)
    rows = tp.TorchIterableDataset(url, seed=4, schema_fields=[*NUMERIC, "name"])
    for loader in (torch.utils.data.DataLoader(mapped, batch_size=4, num_workers=2, shuffle=True),
                   torch.utils.data.DataLoader(rows, batch_size=4, num_workers=2)):
        assert sorted(_checked_ids(loader)) == list(range(N))
    assert handshakes[0] == 0 and fd_channel.pending() == 0
    assert received[0] >= 2 * len(NUMERIC) * math.ceil(N / 4)  # a storage per field per batch


def _many_fields(row: dict[str, Any]) -> list[Any]:
    # a list, not a dict (whose tensors a worker stacks into one pooled storage): torch's collate puts
    # each of the 16 fields of each batch in new shared memory, 16 descriptors a batch
    return [row["vec"] + k for k in range(16)]


def test_the_main_process_looks_for_exited_senders_now_and_then_not_per_storage(url, monkeypatch):
    """16 storages a batch, 2 workers: the check for exited senders' descriptors (a /proc read each)
    runs at most every REAP_SECONDS, not for every pending descriptor at every receive."""
    from unihub.bridges.torch import fd_channel
    from unihub.runtime import processes

    checks = [0]
    is_running = processes.is_running

    def counted(*args: Any, **kwargs: Any) -> bool:
        checks[0] += 1
        return is_running(*args, **kwargs)

    monkeypatch.setattr(processes, "is_running", counted)
    handshakes = _handshakes(monkeypatch)
    ds = tp.TorchMapDataset(url, schema_fields=["id", "vec"], transform=_many_fields)
    loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2, prefetch_factor=4)
    start = time.monotonic()
    batches = list(loader)
    assert len(batches) == math.ceil(N / 2) and handshakes[0] == 0
    assert np.array_equal(torch.cat([b[3] for b in batches]).numpy(), np.stack([r["vec"] + 3 for r in ROWS]))
    assert checks[0] <= 4 * (1 + (time.monotonic() - start) / fd_channel.REAP_SECONDS), checks[0]


def _put_twice(row: dict[str, Any]) -> dict[str, Any]:
    if _SIDE_QUEUE is not None:
        _SIDE_QUEUE.put(torch.as_tensor(row["vec"]) * 2)  # a side process logs some statistics
    return {"id": row["id"], "vec": row["vec"]}


_SIDE_QUEUE: Any = None


def _side_consumer(queue: Any, out: Any, expected: int) -> None:
    # counted, not ended by a sentinel: each worker's queue flushes from a thread of its own, so the
    # main process's sentinel could overtake a worker's last tensor
    got = []
    while len(got) < expected:
        got.append(queue.get(timeout=60).numpy().copy())
    out.put(got)


def test_tensors_a_worker_sends_elsewhere_still_cross_torch_s_way(url, monkeypatch):
    """Only what goes on torch's result queue, to the main process, crosses on its channel: a
    tensor a transform puts on a queue of its own, for another process, crosses as torch sends it."""
    import multiprocessing

    fork = multiprocessing.get_context("fork")
    queue, out = fork.Queue(), fork.Queue()
    monkeypatch.setattr(sys.modules[__name__], "_SIDE_QUEUE", queue)
    side = fork.Process(target=_side_consumer, args=(queue, out, N))
    side.start()
    try:
        ds = tp.TorchMapDataset(url, schema_fields=["id", "vec"], transform=_put_twice)
        loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
        assert [i for b in loader for i in b["id"].tolist()] == list(range(N))
        got = out.get(timeout=90)  # while the workers (persistent) still run, as torch's way needs
        assert len(got) == N
        assert sorted(v.tobytes() for v in got) == sorted((r["vec"] * 2).tobytes() for r in ROWS)
        del loader
    finally:
        side.join(30)
    assert side.exitcode == 0


def test_an_abandoned_iteration_leaves_no_descriptor_behind(url, monkeypatch):
    """Batches in flight when an iteration is abandoned are never asked for: once their workers have
    exited, a garbage collection closes their descriptors (and frees their shared memory), though no
    batch comes again."""
    import gc
    import socket

    from unihub.bridges.torch import fd_channel

    monkeypatch.setattr(fd_channel, "REAP_SECONDS", 0.05)
    ds = tp.TorchMapDataset(url, schema_fields=["id", "vec"], transform=_many_fields)

    def shared_memory_held() -> int:  # descriptors of torch's shared memory ("/dev/shm/torch_..." and deleted)
        return sum("torch_" in os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                   if os.path.exists(f"/proc/self/fd/{fd}"))

    held = shared_memory_held()
    loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2, prefetch_factor=4)
    iterator = iter(loader)
    next(iterator)
    time.sleep(0.5)  # the workers fill their prefetch: 7 batches of 16 storages in flight
    workers = list(iterator._workers)
    del iterator, loader
    for worker in workers:
        worker.join(10)
    time.sleep(0.1)
    gc.collect()
    channel = fd_channel._OWN
    assert channel is not None and not channel.pending
    with pytest.raises(BlockingIOError):
        channel.parent.recv(64, socket.MSG_PEEK)  # nothing left queued
    assert shared_memory_held() <= held  # (earlier tests' pools may be let go of meanwhile)


@pytest.mark.slow
def test_a_dataset_built_in_a_preloaded_forkserver_hands_over_torch_s_way(url, tmp_path):
    """A forkserver that imported a module building a dataset opened a channel of its own: the
    workers it forks work for the process that asked for them, so they use torch's way."""
    (tmp_path / "data_module.py").write_text(textwrap.dedent(f"""
        from unihub.bridges.torch import TorchMapDataset

        def numeric(row):
            return {{"id": row["id"], "vec": row["vec"]}}

        train = TorchMapDataset({url!r}, schema_fields=["id", "vec"], transform=numeric)
    """))
    (tmp_path / "main.py").write_text(textwrap.dedent("""
        import multiprocessing
        import torch

        if __name__ == "__main__":
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["data_module"])
            from data_module import train
            loader = torch.utils.data.DataLoader(train, batch_size=4, num_workers=2, multiprocessing_context=context)
            print(sorted(i for b in loader for i in b["id"].tolist()))
    """))
    out = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == str(list(range(N)))


@pytest.mark.slow
def test_a_low_open_file_limit_holds_with_many_storages_in_flight(url, tmp_path):
    """The main process takes descriptors off the socket only up to the one it needs: 40 storages a
    batch, prefetch 8 and 2 workers (640 in flight) under a limit of 512 open files."""
    script = tmp_path / "limit.py"
    script.write_text(textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        import torch
        from unihub.bridges.torch import TorchMapDataset

        def fields(row):  # a list: torch collates each field into new shared memory (a dict's: one pooled storage)
            return [row["vec"] + k for k in range(40)]

        ds = TorchMapDataset({url!r}, schema_fields=["vec"], transform=fields)
        loader = torch.utils.data.DataLoader(ds, batch_size=1, num_workers=2, prefetch_factor=8)
        print(sum(1 for _ in loader))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == str(N)


class _InAThread(torch.utils.data.Dataset):
    """A dataset whose batches are read in a thread of the worker (a prefetching wrapper, say)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.pool = inner, None

    def __len__(self) -> int:
        return len(self.inner)

    def __getitems__(self, indices: list[int]) -> Any:
        from concurrent.futures import ThreadPoolExecutor

        if self.pool is None:
            self.pool = ThreadPoolExecutor(1)
        return self.pool.submit(self.inner.__getitems__, indices).result()


def _aux_dataset(url: str) -> Any:
    def init(worker_id: int) -> None:
        tp.TorchMapDataset(url, schema_fields=["id"])  # a dataset of the worker's own (lookups, say)

    return init


def test_workers_that_build_datasets_or_read_in_threads_still_send_on_the_channel(url, monkeypatch):
    """A worker that builds a dataset of its own (in worker_init_fn, or lazily) opens a channel for
    its own children but still sends to its parent on the one it inherited; a dataset method run
    in a thread of the worker still finds torch's result queue."""
    handshakes = _handshakes(monkeypatch)
    cases = [(tp.TorchMapDataset(url, schema_fields=NUMERIC), {"worker_init_fn": _aux_dataset(url)}),
             (_InAThread(tp.TorchMapDataset(url, schema_fields=NUMERIC, transform=_numeric_only)), {}),
             (_InAThread(tp.TorchMapDataset(url, schema_fields=NUMERIC)), {})]
    for ds, options in cases:
        loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, **options)
        assert _checked_ids(loader) == list(range(N))
    assert handshakes[0] == 0


def test_worker_batches_cross_with_spawned_workers(url):
    # spawned workers import everything afresh: the pool, the collate registration and the main
    # process's record work without anything inherited
    from unihub.bridges.torch import shared_batches

    before = set(shared_batches.pools())
    iterable = tp.TorchIterableDataset(url, batch_size=4, seed=4)
    got = [check_batch(b) for b in torch.utils.data.DataLoader(iterable, batch_size=None, num_workers=2,
                                                                multiprocessing_context="spawn")]
    assert sorted(i for ids in got for i in ids) == list(range(N))
    mapped = tp.TorchMapDataset(url, schema_fields=NUMERIC)
    out = list(torch.utils.data.DataLoader(mapped, batch_size=4, num_workers=2, multiprocessing_context="spawn"))
    assert [i for b in out for i in b["id"].tolist()] == list(range(N))
    for b in out:
        for k, i in enumerate(b["id"].tolist()):
            assert np.array_equal(b["image"][k].numpy(), ROWS[i]["image"])
            assert np.array_equal(b["vec"][k].numpy(), ROWS[i]["vec"])
    assert len(set(shared_batches.pools()) - before) >= 2  # the map workers' pools at least


def test_worker_batches_of_a_dataset_petastorm_wrote_arrive_whole(tmp_path):
    # Petastorm's own files (PNG and OpenCV JPEG fields, a gray image, NaN floats, ndarrays): through
    # 2 workers and their reused shared memory, every row, field and dtype as in the main process
    from pathlib import Path

    from unihub.bridges.torch import shared_batches

    petastorm = Path(__file__).resolve().parents[2] / "fixtures" / "petastorm" / "unischema"
    fields = ["id", "score", "image_png", "image_jpeg", "gray"]

    def epochs(workers: int) -> list[dict[int, Any]]:
        ds = tp.TorchIterableDataset(str(petastorm), batch_size=4, seed=2, schema_fields=fields, shuffle_rows=True)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers,
                                             persistent_workers=workers > 0)
        held = [list(loader) for _ in range(3)]  # every batch kept while later ones are sent
        out = []
        for batches in held:
            out.append({i: {name: (batch[name].dtype, tuple(batch[name][k].shape), batch[name][k].numpy().tobytes())
                            for name in fields}
                        for batch in batches for k, i in enumerate(batch["id"].tolist())})
        return out

    before = set(shared_batches.pools())
    alone, with_workers = epochs(0)[0], epochs(2)
    assert sorted(alone) == list(range(60))
    assert all(epoch == alone for epoch in with_workers)  # bytes: NaN equals NaN
    pools = [shared_batches.counters(pool) for pool in set(shared_batches.pools()) - before]
    assert len(pools) == 2 and all(c[0].sum() == c[1].sum() > 0 for c in pools)
    assert sum(int(c[2].sum()) for c in pools) > 0  # storages were refilled while batches were held


def _petastorm_rows_dataset(transform: Any = None) -> Any:
    from pathlib import Path

    petastorm = Path(__file__).resolve().parents[2] / "fixtures" / "petastorm" / "unischema"
    fields = ["id", "score", "image_png", "image_jpeg", "gray"]
    if transform is None:
        return tp.TorchIterableDataset(str(petastorm), seed=2, schema_fields=fields, shuffle_rows=True)
    return tp.TorchMapDataset(str(petastorm), schema_fields=fields, transform=transform)


def _by_id(batches: list[dict[str, Any]]) -> dict[int, Any]:
    return {i: {name: (value.dtype, tuple(value[k].shape), value[k].numpy().tobytes()) for name, value in batch.items()}
            for batch in batches for k, i in enumerate(batch["id"].tolist())}


def _petastorm_fields(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "score": row["score"] * 2, "image_png": row["image_png"], "gray": row["gray"]}


@pytest.mark.parametrize("kind", ["iterable rows", "map transform"])
def test_rows_of_a_dataset_petastorm_wrote_collate_as_torch_stacks_them(kind):
    """Petastorm's own files (PNG and OpenCV JPEG fields, a gray image, NaN floats): rows cut from the
    reader's columns, and a transform's dicts, collated into 2 workers' pools give every row, field,
    dtype and byte that torch's stacking of plain dicts gives with no workers."""
    from unihub.bridges.torch import shared_batches

    ds = _petastorm_rows_dataset(None if kind == "iterable rows" else _petastorm_fields)

    def run(workers: int, collate_fn: Any = None) -> dict[int, Any]:
        loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=workers, collate_fn=collate_fn)
        return _by_id(list(loader))  # every batch held

    before = set(shared_batches.pools())
    stacked, pooled = run(0, _as_plain_rows), run(2)
    assert sorted(stacked) == list(range(60)) and pooled == stacked  # bytes: NaN equals NaN
    pools = [shared_batches.counters(pool) for pool in set(shared_batches.pools()) - before]
    assert len(pools) == 2 and all(c[0].sum() == c[1].sum() > 0 for c in pools)


def test_worker_batches_kept_a_column_at_a_time_keep_their_values(url):
    # a padded field is new memory in the worker, the other columns view the pool's; keeping only
    # one column of each batch (a metric, say) must keep its values whatever the others do
    ds = tp.TorchIterableDataset(url, batch_size=3, seed=4, variable="pad")
    kept = [(batch["id"].clone(), batch["vec"]) for batch in
            torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)]
    assert sorted(int(i) for ids, _ in kept for i in ids) == list(range(N))
    for ids, vec in kept:
        assert all(np.array_equal(vec[k].numpy(), ROWS[int(i)]["vec"]) for k, i in enumerate(ids))


def test_worker_batches_rebuilt_by_a_collate_fn_keep_their_memory(url):
    # a collate_fn of the caller's returns plain dicts: the batches cannot report their arrival, and
    # their memory is never refilled
    from unihub.bridges.torch import shared_batches

    before = set(shared_batches.pools())
    ds = tp.TorchIterableDataset(url, batch_size=3, seed=4)
    held = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, collate_fn=lambda batch: dict(batch)))
    assert sorted(i for batch in held for i in check_batch(batch)) == list(range(N))
    assert set(shared_batches.pools()) == before


def test_iterable_dataset_shards_over_ranks(url, monkeypatch):
    delivered = []
    for rank in range(3):
        monkeypatch.setattr(torch_datasets, "rank_and_world", lambda rank=rank: (rank, 3))
        ds = tp.TorchIterableDataset(url, seed=4, reader_pool_type="dummy", schema_fields=["id"])
        delivered.append([int(row["id"]) for row in ds])
    assert sorted(i for share in delivered for i in share) == list(range(N))
    assert [len(share) for share in delivered] == [21, 21, 19]


def test_iterable_dataset_ranks_and_workers_together(url, monkeypatch):
    """2 ranks x 2 workers: four shards (rank * workers + worker), every row exactly once overall."""
    delivered = []
    for rank in range(2):
        monkeypatch.setattr(torch_datasets, "rank_and_world", lambda rank=rank: (rank, 2))
        ds = tp.TorchIterableDataset(url, seed=4, reader_pool_type="dummy", schema_fields=["id"])
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
        delivered.append([int(row["id"]) for row in loader])
    assert sorted(i for share in delivered for i in share) == list(range(N))
    assert not set(delivered[0]) & set(delivered[1])


def test_map_dataset_with_samplers(url, monkeypatch):
    from unihub.readers.random_access import Dataset

    calls = []
    take = Dataset.take
    monkeypatch.setattr(Dataset, "take", lambda self, idx: calls.append(list(idx)) or take(self, idx))
    ds = tp.TorchMapDataset(url, schema_fields=["id", "name", "vec", "image"])
    assert len(ds) == N and int(ds[7]["id"]) == 7 and ds[7]["name"] == "row-7"
    sampler = torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(0))
    calls.clear()
    out = list(torch.utils.data.DataLoader(ds, batch_size=8, sampler=sampler))
    assert [len(c) for c in calls] == [8] * (N // 8) + [N % 8]  # one batched fetch per batch
    got = [i for b in out for i in b["id"].tolist()]
    assert sorted(got) == list(range(N)) and got != list(range(N))
    for b in out:
        for k, i in enumerate(b["id"].tolist()):
            assert np.array_equal(b["image"][k].numpy(), ROWS[i]["image"]) and b["name"][k] == f"row-{i}"
    shares = []
    for rank in range(2):
        dist = torch.utils.data.DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=1)
        shares.append([i for b in torch.utils.data.DataLoader(ds, batch_size=4, sampler=dist)
                       for i in b["id"].tolist()])
    assert len(shares[0]) == len(shares[1]) == 31
    assert set(shares[0]) | set(shares[1]) == set(range(N))  # DistributedSampler pads one repeat


def test_map_dataset_transform_and_workers(url):
    ds = tp.TorchMapDataset(url, schema_fields=["id", "vec"], transform=lambda r: (r["id"] * 2, r["vec"]))
    out = list(torch.utils.data.DataLoader(ds, batch_size=16, num_workers=2))
    assert torch.cat([b[0] for b in out]).tolist() == [2 * i for i in range(N)]
    assert np.array_equal(torch.cat([b[1] for b in out]).numpy(), np.stack([r["vec"] for r in ROWS]))


def _mixed_fields(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "double": row["vec"] * 2, "image": row["image"], "name": row["name"],
            "n": int(row["id"]), "array": row["vec"].numpy() + 1, "pair": (row["id"], row["vec"])}


def _transformed_batch(batch: dict[str, Any]) -> dict[str, Any]:
    """The tensors of a batch of _mixed_fields rows (the names apart)."""
    return {"id": batch["id"], "double": batch["double"], "image": batch["image"], "n": batch["n"],
            "array": batch["array"], "pair0": batch["pair"][0], "pair1": batch["pair"][1]}


@pytest.mark.parametrize("workers", [0, 2])
def test_map_dataset_transformed_rows_collate_into_the_worker_pool_as_torch_collates_them(url, workers):
    """In a worker, the dicts a transform returns are collated with their same-shaped tensor fields
    stacked into the worker's reused shared memory, and every other field as torch collates it: the
    same batches, value for value, as torch's collate of plain dicts."""
    from unihub.bridges.torch import shared_batches

    ds = tp.TorchMapDataset(url, transform=_mixed_fields)

    def run(collate_fn: Any = None) -> list[dict[str, Any]]:
        sampler = torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(3))
        return list(torch.utils.data.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=workers,
                                                collate_fn=collate_fn))

    before = set(shared_batches.pools())
    pooled, plain = run(), run(_as_plain_rows)
    assert len(pooled) == len(plain) == math.ceil(N / 4)
    for got, want in zip(pooled, plain):
        assert got.keys() == want.keys() and got["name"] == want["name"]
        assert _batch_bytes(_transformed_batch(got)) == _batch_bytes(_transformed_batch(want))
        for k, i in enumerate(got["id"].tolist()):
            assert np.array_equal(got["image"][k].numpy(), ROWS[i]["image"])
            assert np.array_equal(got["double"][k].numpy(), ROWS[i]["vec"] * 2)
    pools = [shared_batches.counters(pool) for pool in set(shared_batches.pools()) - before]
    assert len(pools) == workers and all(c[0].sum() == c[1].sum() > 0 for c in pools)


class _TypeNames(torch.utils.data.Dataset):
    """The type of each item another dataset gives, as seen in the worker."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> str:
        return type(self.inner[index]).__name__


def test_map_dataset_items_read_one_at_a_time_in_a_worker_are_plain_dicts(url):
    for ds in (tp.TorchMapDataset(url, schema_fields=NUMERIC), tp.TorchMapDataset(url, transform=_mixed_fields)):
        names = list(torch.utils.data.DataLoader(_TypeNames(ds), batch_size=None, num_workers=1))
        assert names == ["dict"] * N


def _as_plain_rows(rows: list[Any]) -> Any:
    return torch.utils.data.default_collate([dict(row) for row in rows])


def _batch_bytes(batch: dict[str, Any]) -> dict[str, Any]:
    return {name: (type(value).__name__, value.dtype, tuple(value.shape), value.numpy().tobytes())
            for name, value in batch.items()}


@pytest.mark.parametrize("workers", [0, 2])
def test_map_dataset_batches_are_the_stacked_rows(url, workers):
    """torch's default collate hands a sampler batch's columns over whole (in a worker, through its
    reused shared memory): the same keys, dtypes, shapes and bytes as stacking the rows, held or not."""
    from unihub.bridges.torch import shared_batches

    ds = tp.TorchMapDataset(url, schema_fields=NUMERIC)

    def run(collate_fn: Any = None) -> list[dict[str, Any]]:
        sampler = torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(3))
        loader = torch.utils.data.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=workers,
                                             persistent_workers=workers > 0, collate_fn=collate_fn)
        return [batch for _ in range(2) for batch in loader]  # every batch held over two epochs

    before = set(shared_batches.pools())
    whole, stacked = run(), run(_as_plain_rows)
    assert [_batch_bytes(b) for b in whole] == [_batch_bytes(b) for b in stacked]
    assert sorted(i for b in whole for i in b["id"].tolist()) == sorted(list(range(N)) * 2)
    for batch in whole:
        assert type(batch) is dict and not any(batch[name].is_shared() for name in NUMERIC)
        for k, i in enumerate(batch["id"].tolist()):
            assert np.array_equal(batch["image"][k].numpy(), ROWS[i]["image"])
            assert np.array_equal(batch["vec"][k].numpy(), ROWS[i]["vec"])
    pools = [shared_batches.counters(pool) for pool in set(shared_batches.pools()) - before]
    if workers:
        assert len(pools) == workers and all(c[0].sum() == c[1].sum() > 0 for c in pools)
        assert sum(int(c[2].sum()) for c in pools) > 0  # storages refilled while batches were held
    else:
        assert not pools


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("batch_size", [1, 5, 13])
def test_iterable_dataset_rows_collate_as_their_columns_slices(url, monkeypatch, workers, batch_size):
    """Rows of a TorchIterableDataset are cut from the reader's columns: torch's default collate joins
    the runs of them (a batch across reader batches has several) instead of stacking rows, and gives
    the same keys, dtypes, shapes and bytes as stacking the rows (each as row_to_tensors gives it)."""
    from unihub.bridges.torch import shared_batches

    joins: list[int] = []
    join = sampler_rows._joined_runs
    monkeypatch.setattr(sampler_rows, "_joined_runs", lambda runs: joins.append(len(runs)) or join(runs))

    def run(collate_fn: Any = None) -> list[dict[str, Any]]:
        ds = tp.TorchIterableDataset(url, seed=4, schema_fields=NUMERIC)
        loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, num_workers=workers, collate_fn=collate_fn)
        return list(loader)  # every batch held

    before = set(shared_batches.pools())
    joined, stacked = run(), run(_as_plain_rows)
    assert [_batch_bytes(b) for b in joined] == [_batch_bytes(b) for b in stacked]
    assert sorted(i for b in joined for i in b["id"].tolist()) == list(range(N))
    for batch in joined:
        for k, i in enumerate(batch["id"].tolist()):
            assert np.array_equal(batch["image"][k].numpy(), ROWS[i]["image"])
            assert np.array_equal(batch["vec"][k].numpy(), ROWS[i]["vec"])
    pools = [shared_batches.counters(pool) for pool in set(shared_batches.pools()) - before]
    assert len(pools) == workers  # in a worker the batch goes out through its reused shared memory
    assert all(c[0].sum() == c[1].sum() > 0 for c in pools)
    if not workers:  # (a worker's calls happen in the worker)
        assert len(joins) == len(joined) and (max(joins) > 1 if batch_size > 1 else max(joins) == 1)


def test_iterable_dataset_rows_sent_one_by_one_carry_only_their_own_values(url):
    """With batch_size=None each row crosses from the worker on its own: its tensors hold the row's
    values only, not the reader batch's whole columns they were cut from (as pickling a row does)."""
    from multiprocessing.reduction import ForkingPickler

    ds = tp.TorchIterableDataset(url, seed=4, schema_fields=NUMERIC)
    got = []
    for row in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2):
        assert row["image"].untyped_storage().nbytes() == row["image"].nbytes
        assert np.array_equal(row["image"].numpy(), ROWS[int(row["id"])]["image"])
        got.append(int(row["id"]))
    assert sorted(got) == list(range(N))
    row = next(iter(ds))
    assert row["image"].untyped_storage().nbytes() > row["image"].nbytes  # a view of the batch's column
    again = ForkingPickler.loads(bytes(ForkingPickler.dumps(row)))
    assert type(again) is dict and again["image"].untyped_storage().nbytes() == again["image"].nbytes
    assert torch.equal(again["image"], row["image"])


def test_iterable_dataset_rows_are_dicts_like_row_to_tensors(url):
    """What a collate_fn of one's own sees: each row equal to row_to_tensors of the reader's row
    (numeric values as tensors, others as they are); a row changed before collating is collated as it is."""
    ds = tp.TorchIterableDataset(url, seed=4, shuffle_row_groups=False)
    rows_seen = list(ds)
    with make_reader(url, seed=_first_epoch_seed(ds), num_epochs=1, shuffle_row_groups=False) as reader:
        expected = [tp.row_to_tensors(row) for row in reader]
    assert len(rows_seen) == len(expected) == N
    for got, want in zip(rows_seen, expected):
        assert isinstance(got, dict) and list(got) == list(want)
        for name, value in want.items():
            assert type(got[name]) is type(value), name
            if isinstance(value, torch.Tensor):
                assert got[name].dtype == value.dtype and torch.equal(got[name], value), name
            else:
                assert got[name] == value, name
    numeric = [{name: row[name] for name in NUMERIC} for row in list(tp.TorchIterableDataset(url, seed=4))[:4]]
    plain = torch.utils.data.default_collate([dict(row) for row in numeric])
    changed = list(tp.TorchIterableDataset(url, seed=4, schema_fields=NUMERIC))[:4]
    changed[1]["vec"] = changed[1]["vec"] * 0  # no longer the column's cell: stacked as it is
    batch = torch.utils.data.default_collate(changed)
    assert torch.equal(batch["image"], plain["image"]) and not batch["vec"][1].any()
    assert torch.equal(batch["vec"][0], plain["vec"][0])
    assert sampler_rows._row_runs(changed) is None


def test_iterable_dataset_of_ngrams_yields_them_as_the_reader_does(url):
    from unihub.readers.ngram import NGram

    ngram = NGram({0: ["id", "vec"], 1: ["id"]}, 1, "id")
    windows = list(tp.TorchIterableDataset(url, seed=4, schema_fields=ngram, shuffle_row_groups=False))
    assert windows and all(set(w) == {0, 1} and int(w[1].id) == int(w[0].id) + 1 for w in windows)
    assert all(np.array_equal(w[0].vec, ROWS[int(w[0].id)]["vec"]) for w in windows)


def _first_epoch_seed(ds: Any) -> int:
    return torch_datasets._epoch_seed(ds.seed, 0)


def test_map_dataset_batches_keep_their_values_beside_a_column_sent_on_its_own(url):
    # a collate_fn returning the collated batch and one of its columns: that column crosses as torch
    # sends tensors (the slot's memory itself), so the slot is given up, never refilled under it
    def collate(rows: list[Any]) -> dict[str, Any]:
        batch = torch.utils.data.default_collate(rows)
        return {"batch": batch, "ids": batch["id"]}

    ds = tp.TorchMapDataset(url, schema_fields=NUMERIC)
    loader = torch.utils.data.DataLoader(ds, batch_size=3, shuffle=True, num_workers=2, collate_fn=collate,
                                         persistent_workers=True, generator=torch.Generator().manual_seed(1))
    held = [(out["ids"], out["ids"].clone(), out["batch"]) for _ in range(2) for out in loader]
    assert all(torch.equal(ids, snapshot) for ids, snapshot, _ in held)
    assert sorted(i for ids, _, _ in held for i in ids.tolist()) == sorted(list(range(N)) * 2)
    for _, snapshot, batch in held:
        assert torch.equal(batch["id"], snapshot)
        assert all(np.array_equal(batch["vec"][k].numpy(), ROWS[i]["vec"]) for k, i in enumerate(snapshot.tolist()))


def test_map_dataset_collate_is_torchs_for_a_collate_fn_map_of_its_own_and_in_new_memory(url):
    from torch.utils.data._utils.collate import collate, default_collate_fn_map

    ds = tp.TorchMapDataset(url, schema_fields=NUMERIC)
    halves = {**default_collate_fn_map, torch.Tensor: lambda batch, **_: torch.stack(batch).half()}
    out = collate(ds.__getitems__([1, 2, 3]), collate_fn_map=halves)
    assert {out[name].dtype for name in NUMERIC} == {torch.float16}
    rows = ds.__getitems__([1, 2, 3])
    first = torch.utils.data.default_collate(rows)
    first["vec"].sub_(1000)  # the batch is memory of its own, as a stack is: the rows keep their values
    again = torch.utils.data.default_collate(rows)
    assert np.array_equal(again["vec"].numpy(), np.stack([ROWS[i]["vec"] for i in (1, 2, 3)]))
    first["id"].resize_(10)  # resizable, as a stack is


def test_worker_batches_sent_twice_arrive_twice_whole(url):
    # a wrapping dataset that yields each pooled batch twice: each pickling counts as a batch sent,
    # so the slot waits for both copies, even with many prefetched
    ds = EachBatch(tp.TorchIterableDataset(url, batch_size=3, seed=4, schema_fields=NUMERIC), lambda b: (b, b))
    held = []
    for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1, prefetch_factor=8):
        held.append(batch)
        time.sleep(0.002)
    assert len(held) % 2 == 0 and all(torch.equal(a["id"], b["id"]) for a, b in zip(held[::2], held[1::2]))
    assert sorted(i for batch in held[::2] for i in batch["id"].tolist()) == list(range(N))
    for batch in held:
        assert all(np.array_equal(batch["vec"][k].numpy(), ROWS[i]["vec"]) for k, i in enumerate(batch["id"].tolist()))


def test_epochs_stopped_early_leave_no_pools_behind(url):
    from unihub.bridges.torch import shared_batches

    ds = tp.TorchMapDataset(url, schema_fields=NUMERIC)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2)
    before = set(shared_batches.pools())
    for _ in range(4):
        for k, _batch in enumerate(loader):
            if k == 2:
                break  # the iterator is dropped: its workers stop, their queued batches are discarded
        time.sleep(0.2)
    assert len(set(shared_batches.pools()) - before) <= 2  # only the last epoch's workers' pools


@pytest.mark.parametrize("workers", [0, 2])
def test_map_dataset_serves_a_batch_sampler_without_batch_size(url, workers):
    # HF's idiom: the sampler yields index lists and the DataLoader (batch_size=None) asks the
    # dataset for each list at once; every row once, as a batch of columns
    ds = tp.TorchMapDataset(url, schema_fields=["id", "name", "vec", "image"])
    sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(
        ds, generator=torch.Generator().manual_seed(2)), 8, drop_last=False)
    out = list(torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=None, num_workers=workers))
    assert [len(b["id"]) for b in out] == [8] * (N // 8) + [N % 8]
    assert sorted(i for b in out for i in b["id"].tolist()) == list(range(N))
    for b in out:
        assert type(b) is dict and b["image"].dtype == torch.uint8
        for k, i in enumerate(b["id"].tolist()):
            assert np.array_equal(b["image"][k].numpy(), ROWS[i]["image"]) and b["name"][k] == f"row-{i}"
            assert np.array_equal(b["vec"][k].numpy(), ROWS[i]["vec"])
    assert ds[np.array([3, 1])]["id"].tolist() == [3, 1] and int(ds[np.int64(3)]["id"]) == 3
    assert int(ds[torch.tensor(4)]["id"]) == 4 and ds[torch.tensor([4, 5])]["id"].tolist() == [4, 5]
    with pytest.raises(TypeError, match="bool"):
        ds[True]
    doubled = tp.TorchMapDataset(url, schema_fields=["id"], transform=lambda r: int(r["id"]) * 2)
    assert doubled[[1, 2]] == [2, 4] and doubled[3] == 6


def test_map_dataset_batches_of_a_dataset_petastorm_wrote_arrive_whole():
    # Petastorm's own files (PNG and OpenCV JPEG fields, a gray image, NaN floats) through 2 workers'
    # pools and the sampler-batch collate: every row, field, dtype and byte as with no workers
    from pathlib import Path

    petastorm = Path(__file__).resolve().parents[2] / "fixtures" / "petastorm" / "unischema"
    fields = ["id", "score", "image_png", "image_jpeg", "gray"]
    ds = tp.TorchMapDataset(str(petastorm), schema_fields=fields)

    def epochs(workers: int) -> list[dict[int, Any]]:
        sampler = torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(5))
        loader = torch.utils.data.DataLoader(ds, batch_size=7, sampler=sampler, num_workers=workers,
                                             persistent_workers=workers > 0)
        held = [list(loader) for _ in range(2)]  # every batch kept while later ones are sent
        return [{i: {name: (batch[name].dtype, tuple(batch[name][k].shape), batch[name][k].numpy().tobytes())
                     for name in fields}
                 for batch in batches for k, i in enumerate(batch["id"].tolist())} for batches in held]

    from unihub.bridges.torch import shared_batches

    assert sampler_rows._whole_columns(ds.__getitems__([0, 1])) is not None  # the columns handed over whole
    alone = epochs(0)[0]
    assert sorted(alone) == list(range(len(ds)))
    before = set(shared_batches.pools())
    assert all(epoch == alone for epoch in epochs(2))  # bytes: NaN equals NaN
    assert len(set(shared_batches.pools()) - before) == 2  # through the workers' pools


def test_map_dataset_rows_changed_before_collate_are_collated_as_changed(url):
    """A sampler batch whose rows were changed, reordered, repeated or mixed with other rows is
    collated from the rows as they are, not from the columns they were cut from."""
    ds = tp.TorchMapDataset(url, schema_fields=NUMERIC)
    collate = torch.utils.data.default_collate

    def doubled_first(rows: list[Any]) -> list[Any]:
        rows[0]["id"] = rows[0]["id"] * 2
        return rows

    def plus_key(rows: list[Any]) -> list[Any]:
        for row in rows:
            row["extra"] = torch.tensor(1)
        return rows

    changes = {"changed value": doubled_first, "reversed": lambda rows: rows[::-1],
               "repeated": lambda rows: rows[:1] * len(rows), "first row dropped": lambda rows: rows[1:],
               "last row dropped": lambda rows: rows[:-1],
               "mixed": lambda rows: rows[:2] + ds.__getitems__([9, 10]), "a key added": plus_key,
               "plain dicts": lambda rows: [dict(row) for row in rows]}
    for what, change in changes.items():
        got = collate(change(ds.__getitems__([5, 6, 7, 8])))
        want = collate([dict(row) for row in change(ds.__getitems__([5, 6, 7, 8]))])
        assert _batch_bytes(got) == _batch_bytes(want), what
    with pytest.raises(TypeError, match="Decimal"):  # what torch's collate says of plain dicts with decimals
        collate(tp.TorchMapDataset(url, schema_fields=["id", "price"]).__getitems__([1, 2]))
    rows = ds.__getitems__([5, 6])
    rows[0]["image"].fill_(7)  # changed in place: the column it views changed with it
    assert (collate(rows)["image"][0] == 7).all()


def test_map_dataset_rows_are_dicts_that_travel_as_plain_dicts(url):
    import copy
    import pickle

    ds = tp.TorchMapDataset(url, schema_fields=NUMERIC)
    assert type(ds[3]) is dict and int(ds[3]["id"]) == 3
    row = ds.__getitems__([3, 4])[1]
    assert isinstance(row, dict) and int(row["id"]) == 4
    for other in (pickle.loads(pickle.dumps(row)), copy.copy(row)):
        assert type(other) is dict and other.keys() == row.keys() and int(other["id"]) == 4
    out = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))  # rows one at a time
    assert [int(r["id"]) for r in out] == list(range(N)) and all(type(r) is dict for r in out)


def test_batched_loader_splits_big_reader_batches_and_resumes_exactly(tmp_path):
    """Reader batches of 20 rows into loader batches of 6: views of whole batches, the rest carried over."""
    path = tmp_path / "big-groups"
    write_dataset(path, SCHEMA, (make_row(i) for i in range(N)), rows_per_file=20)
    assert min(rg.num_rows for rg in open_dataset(path).row_groups[:-1]) >= 20

    def loader() -> Any:
        return tp.BatchedDataLoader(batches(str(path)), batch_size=6)

    full = [check_batch(b) for b in loader()]
    assert [i for b in full for i in b] == list(range(N))
    assert [len(b) for b in full] == [6] * (N // 6) + ([N % 6] if N % 6 else [])
    for cut in (1, 3, 4, 7):
        first = loader()
        got = []
        for batch in first:
            got.append(check_batch(batch))
            if len(got) == cut:
                break
        state = json.loads(json.dumps(first.state_dict()))
        first.terminate()
        again = loader()
        again.load_state_dict(state)
        got += [check_batch(b) for b in again]
        assert [i for b in got for i in b] == list(range(N)), cut


def test_iterators_never_started_or_closed_early_leave_the_loader_usable(url):
    """Two iterations at once are refused; one that was never started, or was closed, claims nothing."""
    loader = tp.BatchedDataLoader(batches(url), batch_size=9)
    unused = iter(loader)
    del unused
    assert list(zip([], loader)) == []
    first = iter(loader)
    next(first)
    with pytest.raises(UnihubError, match="already being iterated"):
        next(iter(loader))
    with pytest.raises(UnihubError, match="load_state_dict"):
        loader.load_state_dict(loader.state_dict())
    first.close()
    state = loader.state_dict()
    loader.load_state_dict(state)
    assert len(ids(loader)) == N - 9



def test_map_dataset_in_a_worker_decodes_into_its_pool_and_sends_that_memory(url, monkeypatch):
    """In a worker, a sampler batch's fixed-shape numeric columns are decoded (or copied) into one
    storage of the worker's pool, and the batch leaves in that storage: no copy on the way out. The
    other columns are as in the main process."""
    import types

    from unihub.bridges.torch import shared_batches

    ds = tp.TorchMapDataset(url)
    asked = [60, 2, 33, 2, 17]
    plain = ds._columns(asked)  # the main process: columns of their own
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: types.SimpleNamespace(id=0, num_workers=1))
    monkeypatch.setattr(shared_batches, "_POOL", (os.getpid(), shared_batches.StoragePool()))
    pool = shared_batches.worker_pool()
    columns = ds._columns(asked)
    assert list(columns) == list(plain)
    storages = {columns[name].untyped_storage().data_ptr() for name in NUMERIC}
    assert len(storages) == 1 and storages <= set(pool._slots)  # one slot holds them all
    for name in plain:
        if name in NUMERIC:
            assert columns[name].dtype == plain[name].dtype and torch.equal(columns[name], plain[name]), name
        else:
            assert len(columns[name]) == len(plain[name]) and all(
                torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(columns[name], plain[name])), name
    sent = tp.from_worker(columns)
    assert isinstance(sent, shared_batches.PooledBatch) and sent.storage.data_ptr() in storages
    assert all(sent[name] is columns[name] for name in NUMERIC)  # the same tensors: nothing copied
    numeric = tp.TorchMapDataset(url, schema_fields=NUMERIC)
    batch = tp.collate_sampler_rows(numeric.__getitems__(asked))  # torch's collate of the rows
    assert isinstance(batch, shared_batches.PooledBatch)
    assert all(torch.equal(batch[name], plain[name]) for name in NUMERIC)


def test_map_dataset_in_a_worker_keeps_the_image_pixel_limit(url, monkeypatch):
    """No pool memory is asked for images above ``MAX_IMAGE_PIXELS``: the batch is refused as with no workers."""
    import types

    from unihub.bridges.torch import shared_batches
    from unihub.errors import ImageDecodeError
    from unihub.images import decoders as images

    ds = tp.TorchMapDataset(url, schema_fields=NUMERIC)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: types.SimpleNamespace(id=0, num_workers=1))
    monkeypatch.setattr(shared_batches, "_POOL", (os.getpid(), shared_batches.StoragePool()))
    monkeypatch.setattr(images, "MAX_IMAGE_PIXELS", 15)  # the images are 4x4
    asked = []
    real = torch_datasets.empty_in_pool
    monkeypatch.setattr(torch_datasets, "empty_in_pool", lambda shapes: asked.append(sorted(shapes)) or real(shapes))
    with pytest.raises(ImageDecodeError, match="more than the limit of 15"):
        ds.__getitems__([3, 4])
    assert asked == [["id", "vec"]]


def test_torch_default_collate_passes_dates_and_timestamps_as_lists(tmp_path):
    """torch's own DataLoader over TorchIterableDataset rows or TorchMapDataset: a date or timestamp field
    raised torch's TypeError (``default_collate`` knows no ``np.datetime64``); it now comes as a list of the
    values, as unihub's own loaders (and Petastorm's) pass it."""


    stamps = [datetime.datetime(2020, 1, 1, 0, 0, i) for i in range(6)]
    pq.write_table(pa.table({"id": pa.array(range(6)), "ts": pa.array(stamps, pa.timestamp("us")),
                             "day": pa.array([s.date() for s in stamps], pa.date32())}), tmp_path / "part.parquet")
    url = tmp_path.as_uri()
    for dataset in (tp.TorchIterableDataset(url, seed=0, shuffle_rows=False, shuffle_row_groups=False),
                    tp.TorchMapDataset(url)):
        batch = next(iter(torch.utils.data.DataLoader(dataset, batch_size=4)))
        assert batch["id"].tolist() == [0, 1, 2, 3]
        assert batch["ts"] == [np.datetime64(s, "us") for s in stamps[:4]]
        assert batch["day"] == [np.datetime64("2020-01-01", "D")] * 4


def _skipping_loader(url: str, kind: str, capacity: int) -> Any:
    options = dict(num_epochs=1, on_decode_error="skip", seed=0, reader_pool_type="dummy")
    if kind == "rows":
        return tp.DataLoader(make_reader(url, **options), batch_size=1, shuffling_queue_capacity=capacity, seed=1)
    return tp.BatchedDataLoader(make_batch_reader(url, **options), batch_size=1, shuffling_queue_capacity=capacity,
                                seed=1)


@pytest.mark.filterwarnings("ignore:.*on_decode_error='skip'")
def test_a_shuffled_batch_whose_every_image_is_skipped_is_not_yielded(tmp_path):
    """With a shuffling queue the images are decoded after the draw, so ``on_decode_error='skip'`` drops
    rows from a drawn batch: a batch of only undecodable rows came out with no rows (its image field an
    empty list, a loss over it NaN). Such a batch is passed over; every good row still comes once and a
    state saved after any batch resumes to exactly the rest."""
    url, good = corrupt_images(tmp_path)
    for kind in ("rows", "batches"):
        batches = list(_skipping_loader(url, kind, 5))
        assert [len(b["id"]) for b in batches] == [1] * len(good)
        assert all(b["image"].shape == (1, 4, 5, 3) for b in batches)
        assert sorted(i for b in batches for i in b["id"].tolist()) == good
        for cut in (3, 9):
            first = _skipping_loader(url, kind, 5)
            taken = iter(first)
            delivered = [i for b in itertools.islice(taken, cut) for i in b["id"].tolist()]
            state = first.state_dict()
            taken.close()
            second = _skipping_loader(url, kind, 5)
            second.load_state_dict(state)
            assert sorted(delivered + ids(second)) == good


@pytest.mark.filterwarnings("ignore:.*on_decode_error='skip'")
@pytest.mark.parametrize("kind", ["rows", "batches"])
def test_skip_batches_is_refused_where_rows_are_dropped_for_images_that_do_not_decode(tmp_path, kind):
    """skip_batches(n) moved the reader n * batch_size stored rows on: where rows before that point were
    dropped, the next batch was not the one an uninterrupted run gives after n batches (another row, and
    rows passed over that the run delivers). It is refused by name, as with a shuffling queue."""
    url, _ = corrupt_images(tmp_path)
    whole = [b["id"].tolist() for b in _skipping_loader(url, kind, 0)]
    loader = _skipping_loader(url, kind, 0)
    with pytest.raises(InvalidArgumentError, match=r"skip_batches\(\) on a reader with on_decode_error='skip'"):
        loader.skip_batches(8)
    assert [b["id"].tolist() for b in loader] == whole  # nothing moved



_SIZED = {"rows": lambda url, **kw: tp.DataLoader(rows(url, num_epochs=1), **kw),
          "batched": lambda url, **kw: tp.BatchedDataLoader(batches(url, num_epochs=1), **kw),
          "in_memory": lambda url, **kw: tp.InMemBatchedDataLoader(batches(url, num_epochs=1), **kw),
          "iterable": lambda url, **kw: next(iter(tp.TorchIterableDataset(url, kw.pop("batch_size"), **kw)))}


@pytest.mark.parametrize("kind, argument, value", [
    *((kind, "batch_size", True) for kind in _SIZED),
    *((kind, "shuffling_queue_capacity", value) for kind in ("rows", "batched") for value in (2.5, "8", None)),
    *(("in_memory", "rows_capacity", value) for value in (0, -1, 2.5))])
def test_a_bad_size_argument_is_named(url, kind, argument, value):
    """``batch_size=True`` read as 1 (or failed in ``torch.split``), a queue capacity of 2.5, ``"8"`` or None failed
    in numpy ("buffer size must be a multiple of element size") or in a comparison, and ``rows_capacity`` 0 or -1
    held no rows and served empty epochs: each is an InvalidArgumentError naming the argument."""
    with pytest.raises(InvalidArgumentError, match=rf"^{argument} must be .*, got {re.escape(repr(value))}$"):
        _SIZED[kind](url, **{"batch_size": 2, argument: value})


@pytest.mark.parametrize("shard", [{}, {"cur_shard": 1, "shard_count": 3},
                                   {"cur_shard": 2, "shard_count": 3, "shard_by": "row", "shard_remainder": "pad"},
                                   {"cur_shard": 2, "shard_count": 3, "shard_by": "row", "shard_remainder": "drop"}])
@pytest.mark.parametrize("batch_size", [1, 4, N, N + 3])
def test_len_is_the_batches_a_whole_run_yields(url, shard, batch_size):
    """len() of each loader equals the batches it yields (docs/frameworks/pytorch.md), for batch sizes that do
    not divide the rows, shards, a queue and two epochs; after a resume it still counts the whole run."""
    options = dict(shard, num_epochs=2, seed=3, schema_fields=["id"])
    for make in (lambda: tp.DataLoader(rows(url, **options), batch_size=batch_size),
                 lambda: tp.DataLoader(rows(url, **options), batch_size=batch_size, shuffling_queue_capacity=5),
                 lambda: tp.BatchedDataLoader(batches(url, **options), batch_size=batch_size),
                 lambda: tp.BatchedDataLoader(batches(url, **options), batch_size=batch_size, shuffling_queue_capacity=5),
                 lambda: tp.InMemBatchedDataLoader(batches(url, **dict(options, num_epochs=1)), batch_size=batch_size,
                                                   num_epochs=2)):
        loader = make()
        assert len(loader) == sum(1 for _ in loader)
        first = make()
        taken = iter(first)
        next(taken)
        state = first.state_dict()
        taken.close()
        resumed = make()
        resumed.load_state_dict(state)
        assert len(resumed) == len(loader) == sum(1 for _ in resumed) + 1
