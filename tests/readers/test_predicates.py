"""Predicates and filters: row semantics, columnar == per-row, Petastorm's split rule, and the reader end to end."""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from unihub import (
    CodecError,
    CompressedImageCodec,
    NdarrayCodec,
    ScalarCodec,
    SchemaError,
    Unischema,
    UnischemaField,
    write_dataset,
)
from unihub.errors import FilterExpressionError
from unihub.readers.predicates import (
    PredicateBase,
    in_intersection,
    in_lambda,
    in_negate,
    in_pseudorandom_split,
    in_reduce,
    in_set,
)
from unihub.readers.reader import make_batch_reader, make_reader

SPLITS = ("train", "val", "test")
NUM_ROWS = 60
POOLS = ("thread", "process", "dummy")

Schema = Unischema("Pred", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("label", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), False),
    UnischemaField("tags", np.int32, (None,), NdarrayCodec(), False),
    UnischemaField("split", np.str_, (), ScalarCodec(pa.string()), False),
])


def make_row(i: int) -> dict:
    return {"id": i, "label": i % 5, "name": f"row-{i}", "tags": np.arange(i % 4, dtype=np.int32) + i % 7,
            "split": SPLITS[i % 3]}


ROWS = [make_row(i) for i in range(NUM_ROWS)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    url = str(tmp_path_factory.mktemp("pred") / "plain")
    write_dataset(url, Schema, ROWS, rows_per_file=10)
    return url


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory) -> str:
    url = str(tmp_path_factory.mktemp("pred") / "by_split")
    write_dataset(url, Schema, ROWS, rows_per_file=10, partition_by=["split"])
    return url


def read_ids(url: str, **kwargs) -> list[int]:
    with make_reader(url, shuffle_row_groups=False, **kwargs) as reader:
        return [int(row.id) for row in reader]


def columns_of(rows: list[dict]) -> dict[str, np.ndarray]:
    """Decoded-style columns: numeric columns as numpy arrays, the rest as object arrays."""
    out = {}
    for name in rows[0]:
        values = [r[name] for r in rows]
        if isinstance(values[0], (int, np.integer)):
            out[name] = np.asarray(values, dtype=np.int64)
        else:
            column = np.empty(len(values), dtype=object)
            column[:] = values
            out[name] = column
    return out


def assert_evaluate_matches_do_include(predicate: PredicateBase, rows: list[dict]) -> np.ndarray:
    mask = np.asarray(predicate.evaluate(columns_of(rows), len(rows)))
    assert mask.dtype == bool and mask.shape == (len(rows),)
    expected = [bool(predicate.do_include({f: row[f] for f in predicate.get_fields()})) for row in rows]
    assert mask.tolist() == expected
    return mask


def petastorm_in_split(value: str, fractions: list[float], index: int) -> bool:
    """Petastorm's ``in_pseudorandom_split.do_include``, restated from its source."""
    borders = [sum(fractions[:i + 1]) for i in range(len(fractions))]
    low = borders[index - 1] if index else 0
    bucket = int(hashlib.md5(value.encode("utf-8")).hexdigest(), 16) % sys.maxsize
    return low * (sys.maxsize - 1) <= bucket < borders[index] * (sys.maxsize - 1)


# -- predicates on values ---------------------------------------------------------------------------
def test_in_set_row_and_columns():
    predicate = in_set({1, 3}, "label")
    assert predicate.get_fields() == {"label"}
    assert predicate.do_include({"label": 3}) and not predicate.do_include({"label": 2})
    mask = assert_evaluate_matches_do_include(predicate, ROWS)
    assert mask.sum() == sum(1 for r in ROWS if r["label"] in (1, 3))
    assert_evaluate_matches_do_include(in_set(["row-4", "row-9", "nope"], "name"), ROWS)
    assert not in_set([], "label").evaluate(columns_of(ROWS), NUM_ROWS).any()


def test_in_set_does_not_cast_values_to_the_column_dtype():
    # 2.5 is not 2: the columnar form must agree with Python's `in`
    mask = assert_evaluate_matches_do_include(in_set([2.5, 4.0], "label"), ROWS)
    assert {ROWS[i]["label"] for i in np.flatnonzero(mask)} == {4}
    assert_evaluate_matches_do_include(in_set([2, "2"], "label"), ROWS)


def test_in_intersection():
    predicate = in_intersection([2, 9], "tags")
    assert predicate.do_include({"tags": np.array([1, 2])})
    assert not predicate.do_include({"tags": np.array([3, 4])})
    assert not predicate.do_include({"tags": np.array([], dtype=np.int32)})
    assert not predicate.do_include({"tags": None})
    mask = assert_evaluate_matches_do_include(predicate, ROWS)
    assert 0 < mask.sum() < NUM_ROWS


def test_in_lambda_with_and_without_state():
    assert_evaluate_matches_do_include(in_lambda(["id"], lambda i: i % 4 == 1), ROWS)
    seen = []

    def at_least(i, label, state):
        seen.append(state)
        return i + label >= state["min"]

    predicate = in_lambda(["id", "label"], at_least, state_arg={"min": 30})
    assert predicate.get_fields() == {"id", "label"}
    mask = assert_evaluate_matches_do_include(predicate, ROWS)
    assert mask.tolist() == [r["id"] + r["label"] >= 30 for r in ROWS]
    assert seen and all(s == {"min": 30} for s in seen)
    with pytest.raises(SchemaError):
        in_lambda("id", lambda i: True)


def test_in_negate():
    base = in_set({0, 1}, "label")
    negated = in_negate(base)
    assert negated.get_fields() == {"label"}
    mask = assert_evaluate_matches_do_include(negated, ROWS)
    assert mask.tolist() == [r["label"] not in (0, 1) for r in ROWS]
    with pytest.raises(SchemaError):
        in_negate(lambda row: True)


@pytest.mark.parametrize("reduce_func, expected", [
    (all, lambda a, b: a and b),
    (any, lambda a, b: a or b),
    (lambda results: sum(results) == 1, lambda a, b: a != b),
])
def test_in_reduce(reduce_func, expected):
    first, second = in_set({0, 1, 2}, "label"), in_lambda(["id"], lambda i: i >= 30)
    predicate = in_reduce([first, second], reduce_func)
    assert predicate.get_fields() == {"label", "id"}
    mask = assert_evaluate_matches_do_include(predicate, ROWS)
    assert mask.tolist() == [expected(r["label"] in (0, 1, 2), r["id"] >= 30) for r in ROWS]
    with pytest.raises(SchemaError):
        in_reduce([first, "label"], all)


def test_in_pseudorandom_split_is_petastorms_md5_rule():
    values = [f"guid-{i}" for i in range(2000)]
    fractions = [0.3, 0.7]
    subsets = [in_pseudorandom_split(fractions, k, "guid") for k in range(2)]
    masks = []
    for k, predicate in enumerate(subsets):
        got = [predicate.do_include({"guid": v}) for v in values]
        assert got == [petastorm_in_split(v, fractions, k) for v in values]
        masks.append(np.array(got))
    assert not (masks[0] & masks[1]).any()          # disjoint
    assert (masks[0] | masks[1]).all()              # covering
    assert abs(masks[0].mean() - 0.3) < 0.05        # about the asked proportions
    # deterministic: a fresh predicate agrees, and the columnar form agrees with the row form
    again = in_pseudorandom_split(fractions, 0, "guid")
    for column in (np.array(values), np.array(values, dtype=object)):
        assert again.evaluate({"guid": column}, len(values)).tolist() == masks[0].tolist()


def test_in_pseudorandom_split_three_way_and_validation():
    values = [f"v{i}" for i in range(600)]
    fractions = [0.5, 0.2, 0.3]
    masks = np.array([[in_pseudorandom_split(fractions, k, "f").do_include({"f": v}) for v in values]
                      for k in range(3)])
    assert (masks.sum(axis=0) == 1).all()
    assert masks.tolist() == [[petastorm_in_split(v, fractions, k) for v in values] for k in range(3)]
    with pytest.raises(ValueError):
        in_pseudorandom_split([0.5, 0.5], 2, "f")


def test_in_pseudorandom_split_hashes_bytes_as_petastorm_did(tmp_path: Path):
    """Petastorm 0.13.1 hashed ``str(value)`` of its ``np.bytes_`` values (``"b'guid'"``); unihub decoded bytes as
    UTF-8 first, so a split over a binary column kept other rows than Petastorm's (175 vs 106 of 240 rows)."""
    import pyarrow.parquet as pq

    values = [f"guid-{i}".encode() for i in range(300)]
    wanted = [petastorm_in_split(str(v), [0.5, 0.5], 0) for v in values]
    predicate = in_pseudorandom_split([0.5, 0.5], 0, "guid")
    assert [predicate.do_include({"guid": v}) for v in values] == wanted
    for column in (np.array(values, dtype=object), np.array(values)):
        assert predicate.evaluate({"guid": column}, len(values)).tolist() == wanted
    pq.write_table(pa.table({"id": np.arange(300), "guid": pa.array(values, pa.binary())}), tmp_path / "part.parquet")
    assert read_ids(str(tmp_path), predicate=predicate) == [i for i in range(300) if wanted[i]]


def test_in_pseudorandom_split_on_int_column_matches_rows():
    predicate = in_pseudorandom_split([0.4, 0.6], 1, "id")
    mask = assert_evaluate_matches_do_include(predicate, ROWS)
    assert mask.tolist() == [petastorm_in_split(str(r["id"]), [0.4, 0.6], 1) for r in ROWS]


# -- the reader ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("pool", POOLS)
def test_make_reader_returns_exactly_the_matching_rows(dataset, pool):
    predicate = in_reduce([in_set({1, 2}, "label"), in_lambda(["name"], lambda n: not n.endswith("7"))], all)
    with make_reader(dataset, predicate=predicate, reader_pool_type=pool, workers_count=2,
                     shuffle_row_groups=False) as reader:
        rows = list(reader)
    expected = [r for r in ROWS if r["label"] in (1, 2) and not r["name"].endswith("7")]
    assert [int(r.id) for r in rows] == [r["id"] for r in expected]
    for got, want in zip(rows, expected):
        assert got.name == want["name"] and got.split == want["split"]
        np.testing.assert_array_equal(got.tags, want["tags"])


def test_make_batch_reader_with_predicate(dataset):
    with make_batch_reader(dataset, predicate=in_lambda(["id"], lambda i: i % 3 == 0),
                           shuffle_row_groups=False) as reader:
        ids = np.concatenate([batch.id for batch in reader])
    assert ids.tolist() == list(range(0, NUM_ROWS, 3))


def test_predicate_on_partition_column_prunes_files(partitioned):
    with make_reader(partitioned) as everything:
        total_groups = everything.diagnostics["row_groups"]
    with make_reader(partitioned, predicate=in_set({"val"}, "split"), shuffle_row_groups=False) as reader:
        rows = list(reader)
        kept = reader.diagnostics["row_groups"]
        paths = {reader.store.row_groups[g].path for g in reader._groups}
    assert kept < total_groups and kept == 2
    assert all("split=val" in p for p in paths)
    assert sorted(int(r.id) for r in rows) == [r["id"] for r in ROWS if r["split"] == "val"]
    assert {r.split for r in rows} == {"val"}


def test_partition_predicate_mixed_with_other_fields_still_filters_rows(partitioned):
    predicate = in_reduce([in_set({"train"}, "split"), in_lambda(["label"], lambda x: x == 0)], all)
    ids = sorted(read_ids(partitioned, predicate=predicate))
    assert ids == [r["id"] for r in ROWS if r["split"] == "train" and r["label"] == 0]


def test_unknown_predicate_field_is_a_schema_error_naming_it(dataset):
    with make_reader(dataset, predicate=in_set({1}, "no_such_field")) as reader:  # raised when read, as Petastorm
        with pytest.raises(SchemaError, match="no_such_field"):
            next(reader)


def test_predicate_columns_are_read_first_and_excluded_rows_never_decoded(tmp_path: Path):
    schema = Unischema("Img", [
        UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("image", np.uint8, (4, 4, 3), CompressedImageCodec("png"), False),
    ])
    image = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)
    good = schema.image.codec.encode(schema.image, image)
    table = pa.table({"id": pa.array(range(12), pa.int64()),
                      "image": pa.array([good if i % 3 else b"definitely not a png" for i in range(12)],
                                        schema.image.arrow_type())})
    url = str(tmp_path / "img")
    write_dataset(url, schema, table, batched=True)
    with make_reader(url, predicate=in_lambda(["id"], lambda i: i % 3 != 0), shuffle_row_groups=False) as reader:
        rows = list(reader)
    assert [int(r.id) for r in rows] == [i for i in range(12) if i % 3]
    for row in rows:
        np.testing.assert_array_equal(row.image, image)
    with pytest.raises(CodecError):
        with make_reader(url) as reader:
            list(reader)


# -- pyarrow filters ----------------------------------------------------------------------------------
@pytest.mark.parametrize("filters, wanted", [
    ([("label", "<", 3)], lambda r: r["label"] < 3),
    ([("label", "<", 3), ("id", ">=", 20)], lambda r: r["label"] < 3 and r["id"] >= 20),
    ([[("label", "=", 0)], [("id", ">", 55)]], lambda r: r["label"] == 0 or r["id"] > 55),
    ([("name", "in", {"row-1", "row-2", "row-59"})], lambda r: r["name"] in ("row-1", "row-2", "row-59")),
])
def test_filters_select_rows(dataset, filters, wanted):
    assert read_ids(dataset, filters=filters) == [r["id"] for r in ROWS if wanted(r)]


def test_filters_and_predicate_combine(dataset):
    ids = read_ids(dataset, filters=[("label", "!=", 4)], predicate=in_lambda(["id"], lambda i: i < 20))
    assert ids == [r["id"] for r in ROWS if r["label"] != 4 and r["id"] < 20]


@pytest.mark.parametrize("make", [make_reader, make_batch_reader])
def test_filters_on_an_unknown_column_or_of_the_wrong_type_say_which(partitioned, make):
    """A filter on no field raised pyarrow's ``ArrowInvalid`` ('No match for FieldRef.Name(nope) in ', the
    schema cut off) only at the first read; a literal of the wrong type its bare 'no kernel matching input
    types'. Both are now ``FilterExpressionError`` (a ValueError) naming the column, the dataset or the types."""
    with pytest.raises(FilterExpressionError, match=r"'nope', which is not a field of .*; its fields: id"):
        make(partitioned, filters=[("label", "<", 3), ("nope", "=", 1)])
    for filters, column in ([("split", "=", 1)], "split (string)"), ([("label", "=", "x")], "label (int"):
        with pytest.raises(FilterExpressionError, match=re.escape(column)):
            with make(partitioned, filters=filters, workers_count=1) as reader:
                next(iter(reader))


def test_filter_on_partition_column_prunes_files(partitioned):
    with make_reader(partitioned) as everything:
        total_groups = everything.diagnostics["row_groups"]
    with make_reader(partitioned, filters=[("split", "in", {"train", "test"})], shuffle_row_groups=False) as reader:
        ids = sorted(int(r.id) for r in reader)
        kept = reader.diagnostics["row_groups"]
    assert kept < total_groups and kept == 4
    assert ids == [r["id"] for r in ROWS if r["split"] in ("train", "test")]
    with make_reader(partitioned, filters=[[("split", "=", "val")], [("label", "=", 1)]]) as reader:
        ids = sorted(int(r.id) for r in reader)
        assert reader.diagnostics["row_groups"] == total_groups  # an OR with a data column cannot prune
    assert ids == [r["id"] for r in ROWS if r["split"] == "val" or r["label"] == 1]
