"""Petastorm's pickled row-group index, read through the allow-list: every pickle protocol, every
value type Petastorm's indexers produce, and refusals (nothing in the pickle is ever run)."""

from __future__ import annotations

import collections
import decimal
import io
import os
import pickle
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from unihub import SingleIndexSelector, make_reader, open_dataset
from unihub.errors import PetastormMetadataError, UnsafeMetadataError
from unihub.petastorm import legacy
from unihub.petastorm.legacy import PETASTORM_ROWGROUPS_INDEX_KEY, safe_unpickle
from unihub.readers.rowgroup_index import read_rowgroup_indexes
from unihub.readers.rowgroup_indexers import RowGroupIndexError

DATASET = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm" / "rowgroup_index"


def _fake_indexers() -> types.ModuleType:
    """``petastorm.etl.rowgroup_indexers`` look-alikes that pickle exactly as Petastorm's classes do."""
    module = types.ModuleType("petastorm.etl.rowgroup_indexers")

    class SingleFieldIndexer:
        def __init__(self, index_name: str, index_field: str) -> None:
            self._index_name, self._column_name = index_name, index_field
            self._index_data: collections.defaultdict = collections.defaultdict(set)

    class FieldNotNullIndexer:
        def __init__(self, index_name: str, index_field: str) -> None:
            self._index_name, self._column_name = index_name, index_field
            self._index_data: set = set()

    for cls in (SingleFieldIndexer, FieldNotNullIndexer):
        cls.__module__, cls.__qualname__ = module.__name__, cls.__name__
        setattr(module, cls.__name__, cls)
    return module


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = _fake_indexers()
    for name in ("petastorm", "petastorm.etl"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def _index(fake: types.ModuleType) -> dict[str, Any]:
    """What Petastorm's build_rowgroup_index pickles: keys as its decode_row makes them."""
    values = fake.SingleFieldIndexer("values_idx", "v")
    for key, groups in [(np.int32(3), {0, 2}), (np.int64(2**40), {1}), (np.str_("cat"), {2}), ("dog", {3}),
                        (np.bytes_(b"\x00raw"), {4}), (decimal.Decimal("1.25"), {5}), (np.float64(0.5), {6}),
                        (np.bool_(True), {7}), (np.datetime64("2024-01-02"), {8}), (np.float64("nan"), {9}),
                        (np.datetime64("2024-01-02T03:04:05.123456789"), {10})]:
        values._index_data[key].update(groups)
    not_null = fake.FieldNotNullIndexer("v_ok", "v")
    not_null._index_data.update({1, 4})
    return {"values_idx": values, "v_ok": not_null}


def _dataset_with(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "ds"
    shutil.copytree(DATASET, path)
    schema = pq.read_metadata(path / "_common_metadata").schema.to_arrow_schema()
    pq.write_metadata(schema.with_metadata({**schema.metadata, PETASTORM_ROWGROUPS_INDEX_KEY: data}),
                      path / "_common_metadata")
    return path


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_protocol_and_value_type(fake: types.ModuleType, tmp_path: Path, protocol: int) -> None:
    path = _dataset_with(tmp_path, pickle.dumps(_index(fake), protocol=protocol))
    stored = read_rowgroup_indexes(open_dataset(path))
    assert stored.source == "petastorm" and stored.stale is None
    index = stored.indexes["values_idx"]
    assert index.index_field == "v" and stored.indexes["v_ok"].get_row_group_indexes("x") == {1, 4}
    expected = {3: {0, 2}, 2**40: {1}, "cat": {2}, "dog": {3}, b"\x00raw": {4}, decimal.Decimal("1.25"): {5},
                0.5: {6}, True: {7}, np.datetime64("2024-01-02"): {8},
                np.datetime64("2024-01-02T03:04:05.123456789"): {10}}
    for key, groups in expected.items():
        assert index.get_row_group_indexes(key) == groups, key
    assert len(index.indexed_values) == len(expected)  # the NaN key, which nothing can select, is left out
    with make_reader(path, schema_fields=["id"], rowgroup_selector=SingleIndexSelector("values_idx", ["cat", 3]),
                     shuffle_row_groups=False, reader_pool_type="dummy") as reader:
        got = [int(row.id) for row in reader]
    store = open_dataset(path)
    assert len(got) == sum(store.row_groups[g].num_rows for g in (0, 2))


def test_the_fixture_references_only_index_globals() -> None:
    class Recording(legacy._SafeUnpickler):
        seen: set[str] = set()

        def find_class(self, module: str, name: str) -> Any:
            self.seen.add(f"{module}.{name}")
            return super().find_class(module, name)

    data = pq.read_metadata(DATASET / "_common_metadata").metadata[PETASTORM_ROWGROUPS_INDEX_KEY]
    Recording(io.BytesIO(data)).load()
    assert Recording.seen == {"petastorm.etl.rowgroup_indexers.SingleFieldIndexer",
                              "petastorm.etl.rowgroup_indexers.FieldNotNullIndexer", "collections.defaultdict",
                              "builtins.set", "numpy.core.multiarray.scalar", "numpy.dtype"}


class _Reduce:
    def __init__(self, func: Any, args: tuple) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple:
        return self.func, self.args


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_a_malicious_value_inside_a_valid_index(fake: types.ModuleType, tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "pwned"
    index = _index(fake)
    index["values_idx"]._index_data[np.int32(1)] = _Reduce(os.system, (f"touch {marker}",))
    path = _dataset_with(tmp_path, pickle.dumps(index, protocol=protocol))
    with pytest.raises(UnsafeMetadataError, match="system"):
        read_rowgroup_indexes(open_dataset(path))
    assert not marker.exists()


@pytest.mark.parametrize("data, message", [
    (b"ccollections\ndefaultdict\n(ccollections\nOrderedDict\ntR.", "defaultdict' with the factory"),
    (b"c__builtin__\nset\n(S'abc'\ntR.", "'builtins.set' called with str"),
    (b"cdecimal\nDecimal\n(I12\ntR.", "'decimal.Decimal' other than with one decimal string"),
    (b"cdecimal\nDecimal\n(S'" + b"9" * 200 + b"'\ntR.", "'decimal.Decimal' other than with one decimal string"),
    (b"ccollections\ndefaultdict\n(c__builtin__\nlist\ntR.", "'__builtin__.list'"),
])
def test_the_new_allow_list_entries_accept_only_what_indexes_use(data: bytes, message: str) -> None:
    with pytest.raises(UnsafeMetadataError, match=message):
        safe_unpickle(data)


@pytest.mark.parametrize("make, error, message", [
    (lambda fake: [1, 2], PetastormMetadataError, "is a list, expected a dict"),
    (lambda fake: {"a": "not an indexer"}, PetastormMetadataError, "not an indexer"),
    (lambda fake: {"a": _with(fake.SingleFieldIndexer("a", "v"), {"x": ["0"]})}, PetastormMetadataError,
     "not a set of non-negative ints"),
    (lambda fake: {"a": _with(fake.FieldNotNullIndexer("a", "v"), [1])}, PetastormMetadataError, "expected a set"),
    (lambda fake: {"a": _with(fake.SingleFieldIndexer("a", "v"), {(1, 2): {0}})}, RowGroupIndexError,
     "shape|type tuple"),
])
def test_malformed_indexes(fake: types.ModuleType, tmp_path: Path, make: Any, error: type, message: str) -> None:
    path = _dataset_with(tmp_path, pickle.dumps(make(fake), protocol=4))
    with pytest.raises(error, match=message):
        read_rowgroup_indexes(open_dataset(path))


def _with(indexer: Any, data: Any) -> Any:
    indexer._index_data = data
    return indexer


def test_row_groups_beyond_the_dataset_make_the_index_stale(fake: types.ModuleType, tmp_path: Path) -> None:
    index = fake.SingleFieldIndexer("a", "v")
    index._index_data["x"].add(19)  # the fixture has 19 row groups: 0..18
    path = _dataset_with(tmp_path, pickle.dumps({"a": index}))
    assert "row group 19" in read_rowgroup_indexes(open_dataset(path)).stale
    with pytest.raises(RowGroupIndexError, match="stale"):
        make_reader(path, rowgroup_selector=SingleIndexSelector("a", ["x"]))
