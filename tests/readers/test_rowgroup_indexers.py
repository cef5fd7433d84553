"""Indexers, selectors and index storage on datasets unihub writes: value types, list fields,
nulls, the JSON in ``_common_metadata`` (versioned, written atomically), rebuilds and refusals."""

from __future__ import annotations

import datetime
import decimal
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub import (
    CompressedImageCodec,
    FieldNotNullIndexer,
    FormatError,
    IntersectIndexSelector,
    NdarrayCodec,
    ScalarCodec,
    SingleFieldIndexer,
    SingleIndexSelector,
    TensorCodec,
    UnionIndexSelector,
    Unischema,
    UnischemaField,
    build_rowgroup_index,
    get_row_group_indexes,
    make_reader,
    open_dataset,
    write_dataset,
)
from unihub.readers.rowgroup_index import ROWGROUP_INDEX_KEY, read_rowgroup_indexes
from unihub.readers.rowgroup_indexers import RowGroupIndexError, decode_key, encode_key, indexer_from_json

ROWS, PER_GROUP = 60, 10  # six row groups, one per file

Typed = Unischema("Typed", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), False),
    UnischemaField("raw", np.bytes_, (), ScalarCodec(pa.binary()), False),
    UnischemaField("price", decimal.Decimal, (), ScalarCodec(pa.decimal128(6, 2)), False),
    UnischemaField("flag", np.bool_, (), ScalarCodec(pa.bool_()), False),
    UnischemaField("score", np.float32, (), ScalarCodec(pa.float32()), True),
    UnischemaField("day", np.datetime64, (), ScalarCodec(pa.date32()), False),
    UnischemaField("words", np.str_, (None,), ScalarCodec(pa.list_(pa.string())), True),
    UnischemaField("codes", np.int32, (None,), NdarrayCodec(), True),
    UnischemaField("vec", np.int16, (3,), TensorCodec(), False),
    UnischemaField("image", np.uint8, (4, 4, 3), CompressedImageCodec("png"), True),
])


def typed_row(i: int) -> dict[str, Any]:
    group = i // PER_GROUP
    return {
        "id": i, "name": f"n{group}", "raw": bytes([group, 255]), "price": decimal.Decimal(group) / 4,
        "flag": group == 2, "score": None if group == 1 else (float("nan") if group == 3 else float(i)),
        "day": np.datetime64("2024-01-01") + group,
        "words": None if i % 7 == 0 else np.array([f"w{group}", f"w{i % 3}"][: i % 3], np.str_),
        "codes": None if group == 4 else np.array([group * 100, i], np.int32),
        "vec": np.array([group, -group, 7], np.int16),
        "image": None if group != 5 else np.zeros((4, 4, 3), np.uint8),
    }


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    path = tmp_path / "typed"
    write_dataset(path, Typed, (typed_row(i) for i in range(ROWS)), rows_per_file=PER_GROUP)
    assert len(open_dataset(path).row_groups) == ROWS // PER_GROUP
    return path


INDEXERS = [SingleFieldIndexer(f"{f}_idx", f) for f in ("name", "raw", "price", "flag", "score", "day", "words",
                                                           "codes", "vec")] + [
    FieldNotNullIndexer("score_ok", "score"), FieldNotNullIndexer("image_ok", "image"),
    FieldNotNullIndexer("codes_ok", "codes")]


def groups(path: Path, index: str, values: list[Any]) -> list[int]:
    return sorted(SingleIndexSelector(index, values).select_row_groups(get_row_group_indexes(str(path))))


# -- values of every kind ---------------------------------------------------------------------
def test_every_value_type_selects_its_row_groups(dataset: Path) -> None:
    build_rowgroup_index(str(dataset), None, INDEXERS)
    assert groups(dataset, "name_idx", ["n2", "n4"]) == [2, 4]
    assert groups(dataset, "raw_idx", [bytes([3, 255])]) == [3]
    assert groups(dataset, "price_idx", [decimal.Decimal("0.25"), decimal.Decimal("1.25")]) == [1, 5]
    assert groups(dataset, "flag_idx", [True]) == [2] and groups(dataset, "flag_idx", [False]) == [0, 1, 3, 4, 5]
    assert groups(dataset, "score_idx", [25.0, 0.0]) == [0, 2]
    assert groups(dataset, "score_idx", [float("nan")]) == []  # NaN equals nothing
    assert groups(dataset, "day_idx", [np.datetime64("2024-01-03")]) == [2]
    assert groups(dataset, "words_idx", ["w5"]) == [5]  # a list field: each element
    assert groups(dataset, "words_idx", ["w2"]) == [0, 1, 2, 3, 4, 5]
    assert groups(dataset, "codes_idx", [300, 1]) == [0, 3]  # an NdarrayCodec 1-D field: each element
    assert groups(dataset, "vec_idx", [-3]) == [3]  # a fixed 1-D tensor: each element
    assert groups(dataset, "vec_idx", [7]) == list(range(6))
    assert groups(dataset, "name_idx", ["absent"]) == []


def test_python_equality_matches_values_as_petastorms_numpy_keys_do(dataset: Path) -> None:
    build_rowgroup_index(str(dataset), None, INDEXERS[:1] + [SingleFieldIndexer("id_idx", "id")])
    assert groups(dataset, "id_idx", [np.int32(12), 13.0, np.int64(59)]) == [1, 5]
    assert groups(dataset, "name_idx", [np.str_("n1")]) == [1]


def test_not_null_indexes(dataset: Path) -> None:
    build_rowgroup_index(str(dataset), None, INDEXERS)
    assert groups(dataset, "score_ok", ["whatever"]) == [0, 2, 3, 4, 5]  # NaN is a value, null is not
    assert groups(dataset, "image_ok", [None]) == [5]
    assert groups(dataset, "codes_ok", [1]) == [0, 1, 2, 3, 5]
    assert groups(dataset, "codes_ok", []) == []  # no values asked for, as in Petastorm


def test_selectors_combine() -> None:
    index = {"a": SingleFieldIndexer("a", "a"), "b": SingleFieldIndexer("b", "b")}
    for group, (a, b) in enumerate([("x", 1), ("x", 2), ("y", 1), ("z", 3)]):
        index["a"].add(group, [a])
        index["b"].add(group, [b])
    x, one = SingleIndexSelector("a", ["x"]), SingleIndexSelector("b", [1])
    assert IntersectIndexSelector([x, one]).select_row_groups(index) == {0}
    assert UnionIndexSelector([x, one]).select_row_groups(index) == {0, 1, 2}
    nested = UnionIndexSelector([IntersectIndexSelector([x, one]), SingleIndexSelector("b", [3])])
    assert nested.select_row_groups(index) == {0, 3}
    assert nested.get_index_names() == ["a", "b"]
    before = index["a"].get_row_group_indexes("x")
    IntersectIndexSelector([x, one]).select_row_groups(index)
    assert index["a"].get_row_group_indexes("x") == before == {0, 1}  # selecting changes no index


@pytest.mark.parametrize("make, message", [
    (lambda: SingleIndexSelector("a", "cat"), r"values_list must be a list.*\['cat'\]"),
    (lambda: SingleIndexSelector("", [1]), "index_name"),
    (lambda: IntersectIndexSelector([]), "non-empty list of selectors"),
    (lambda: UnionIndexSelector([SingleIndexSelector("a", [1]), "b"]), "must be a row-group selector"),
])
def test_selector_arguments_are_checked(make: Any, message: str) -> None:
    with pytest.raises(RowGroupIndexError, match=message):
        make()


def test_petastorm_indexer_api() -> None:
    a = SingleFieldIndexer("tags_idx", "tags")
    a.build_index([{"tags": np.array(["x", "y"])}, {"tags": None}, {"tags": np.array([], np.str_)}], 0)
    b = SingleFieldIndexer("tags_idx", "tags")
    b.build_index([{"tags": np.array(["y"])}], 3)
    merged = a + b
    assert merged is a and sorted(a.indexed_values) == ["x", "y"] and a.get_row_group_indexes("y") == {0, 3}
    assert a.index_name == "tags_idx" and a.column_names == ["tags"]
    assert a.get_row_group_indexes("absent") == set()
    with pytest.raises(TypeError):
        a + FieldNotNullIndexer("tags_idx", "tags")  # noqa: B018
    with pytest.raises(RowGroupIndexError, match="different fields"):
        a + SingleFieldIndexer("tags_idx", "other")  # noqa: B018
    n = FieldNotNullIndexer("ok", "tags")
    n.build_index([{"tags": None}], 1)
    n.build_index([{"tags": None}, {"tags": 5}], 2)
    assert n.indexed_values == ["Field is Not Null"] and n.get_row_group_indexes() == {2}


@pytest.mark.parametrize("key", ["cat", "", 3, -2**70, 2.5, True, float("inf"), float("-inf"), b"\x00\xff",
                                 decimal.Decimal("1.50"), np.datetime64("2024-02-03"),
                                 np.datetime64("2024-02-03T04:05:06.000007")])
def test_keys_round_trip_through_json(key: Any) -> None:
    back = decode_key(json.loads(json.dumps(encode_key(key), allow_nan=False)))
    assert back == key and type(back) is type(key)


def test_index_json_round_trip() -> None:
    index = SingleFieldIndexer("i", "f")
    index.add(2, [b"a", 1, "1", 1.5, None, decimal.Decimal("2"), datetime.date(2020, 1, 2)])
    index.add(0, [np.int8(1), np.float64("nan")])
    assert indexer_from_json(json.loads(json.dumps(index.to_json()))) == index
    assert index.get_row_group_indexes(1) == {0, 2} and index.get_row_group_indexes(np.datetime64("2020-01-02")) == {2}


def test_unindexable_values_and_fields(dataset: Path) -> None:
    with pytest.raises(RowGroupIndexError, match="shape"):
        SingleFieldIndexer("i", "f").add(0, [np.zeros((2, 2))])
    with pytest.raises(RowGroupIndexError, match="cannot index a value of type dict"):
        SingleFieldIndexer("i", "f").add(0, [{"a": 1}])
    with pytest.raises(RowGroupIndexError, match="'image' has shape"):
        build_rowgroup_index(str(dataset), None, [SingleFieldIndexer("img", "image")])
    with pytest.raises(RowGroupIndexError, match=r"no field 'nope'.*fields: \['id'"):
        build_rowgroup_index(str(dataset), None, [SingleFieldIndexer("x", "nope")])
    with pytest.raises(RowGroupIndexError, match=r"unique.*\['x'\]"):
        build_rowgroup_index(str(dataset), None, [SingleFieldIndexer("x", "id"), FieldNotNullIndexer("x", "name")])
    with pytest.raises(RowGroupIndexError, match="is empty"):
        build_rowgroup_index(str(dataset), None, [])
    with pytest.raises(RowGroupIndexError, match="a list of"):
        build_rowgroup_index(str(dataset), None, SingleFieldIndexer("x", "id"))
    with pytest.raises(RowGroupIndexError, match="cannot store a MyIndexer"):
        build_rowgroup_index(str(dataset), None, [type("MyIndexer", (), {})()])
    assert ROWGROUP_INDEX_KEY not in pq.read_metadata(dataset / "_common_metadata").metadata


# -- storage ------------------------------------------------------------------------------------
def test_stored_as_versioned_json_beside_the_schema(dataset: Path) -> None:
    before = pq.read_metadata(dataset / "_common_metadata")
    build_rowgroup_index(str(dataset), None, INDEXERS[:2])
    after = pq.read_metadata(dataset / "_common_metadata")
    assert after.schema.to_arrow_schema().remove_metadata() == before.schema.to_arrow_schema().remove_metadata()
    kept = {k: v for k, v in after.metadata.items() if k not in (ROWGROUP_INDEX_KEY, b"ARROW:schema")}
    assert kept == {k: v for k, v in before.metadata.items() if k != b"ARROW:schema"}
    after = after.metadata
    document = json.loads(after[ROWGROUP_INDEX_KEY])
    assert document["format"] == "unihub.rowgroup_index" and document["version"] == 1
    assert [n for _, n in document["files"]] == [1] * 6 and document["files"][0][0].endswith(".parquet")
    assert document["indexes"][0] == {"name": "name_idx", "kind": "single_field", "field": "name",
                                      "values": [[f"n{g}", [g]] for g in range(6)]}
    assert [{"bytes": "AP8="}, [0]] in document["indexes"][1]["values"]  # bytes([0, 255])
    assert sorted(p.name for p in dataset.iterdir() if p.name.startswith(("_", "."))) == ["_common_metadata"]


def test_a_rebuild_replaces_the_indexes(dataset: Path) -> None:
    build_rowgroup_index(str(dataset), None, INDEXERS[:2])
    build_rowgroup_index(str(dataset), None, [FieldNotNullIndexer("image_ok", "image")])
    assert list(get_row_group_indexes(str(dataset))) == ["image_ok"]


def test_a_failed_write_leaves_the_metadata_as_it_was(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build_rowgroup_index(str(dataset), None, INDEXERS[:1])
    before = (dataset / "_common_metadata").read_bytes()

    def fail(schema: Any, where: Any, filesystem: Any = None) -> None:
        filesystem.open_output_stream(where).write(b"PAR1 half")
        raise OSError("disk full")

    monkeypatch.setattr("unihub.store.dataset.pq.write_metadata", fail)
    with pytest.raises(OSError, match="disk full"):
        build_rowgroup_index(str(dataset), None, INDEXERS[1:2])
    assert (dataset / "_common_metadata").read_bytes() == before
    assert sorted(p.name for p in dataset.iterdir() if p.name.startswith("_")) == ["_common_metadata"]


def test_hadoop_checksum_of_the_old_metadata_is_removed(dataset: Path) -> None:
    (dataset / "._common_metadata.crc").write_bytes(b"crc of the old file")
    build_rowgroup_index(str(dataset), None, INDEXERS[:1])
    assert not (dataset / "._common_metadata.crc").exists()


def test_plain_parquet_without_common_metadata(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    for k in range(3):
        pq.write_table(pa.table({"id": list(range(k * 5, k * 5 + 5)), "kind": [f"k{k}"] * 5}),
                       tmp_path / "plain" / f"part-{k}.parquet")
    build_rowgroup_index(str(tmp_path / "plain"), None, [SingleFieldIndexer("kind_idx", "kind")])
    assert (tmp_path / "plain" / "_common_metadata").exists()
    assert open_dataset(tmp_path / "plain").schema_source == "inferred"
    with make_reader(tmp_path / "plain", rowgroup_selector=SingleIndexSelector("kind_idx", ["k1"])) as reader:
        assert sorted(int(r.id) for r in reader) == list(range(5, 10))


def test_a_single_file_cannot_hold_an_index(dataset: Path) -> None:
    with pytest.raises(FormatError, match="single Parquet file"):
        build_rowgroup_index(str(next(dataset.glob("*.parquet"))), None, INDEXERS[:1])


def test_an_index_from_a_newer_unihub_is_refused(dataset: Path) -> None:
    from unihub.store.dataset import update_common_metadata

    update_common_metadata(open_dataset(dataset), {ROWGROUP_INDEX_KEY: json.dumps(
        {"format": "unihub.rowgroup_index", "version": 2, "files": [], "indexes": []}).encode()})
    with pytest.raises(RowGroupIndexError, match="version 2 is not supported"):
        read_rowgroup_indexes(open_dataset(dataset))
