"""Row-group indexes against real Petastorm: its pickled index read, unihub's own built, both selecting
what Petastorm selects; the reader with a selector (shuffle, shards, resume, predicates); errors.

``tests/fixtures/petastorm/rowgroup_index`` was written and indexed by Petastorm 0.13.1 on Spark
(``make_rowgroup_index.py``); ``rowgroup_index_expected.json`` holds, per selector, the row groups
Petastorm's selector picked and the ids Petastorm's ``make_reader`` yielded with it.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub import (
    FieldNotNullIndexer,
    IntersectIndexSelector,
    ScalarCodec,
    SingleFieldIndexer,
    SingleIndexSelector,
    UnionIndexSelector,
    Unischema,
    UnischemaField,
    UnsafeMetadataError,
    build_rowgroup_index,
    get_row_group_indexes,
    in_lambda,
    make_batch_reader,
    make_reader,
    open_dataset,
    write_dataset,
)
from unihub.cli import main
from unihub.petastorm.legacy import PETASTORM_ROWGROUPS_INDEX_KEY
from unihub.readers.reader import ReaderStateError
from unihub.readers.rowgroup_index import ROWGROUP_INDEX_KEY, read_rowgroup_indexes
from unihub.readers.rowgroup_indexers import RowGroupIndexError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm"
DATASET = FIXTURES / "rowgroup_index"
EXPECTED = json.loads((FIXTURES / "rowgroup_index_expected.json").read_text())
SELECTORS = EXPECTED["selectors"]
#: the indexers Petastorm built the fixture's index with (make_rowgroup_index.py: INDEXES)
INDEXERS = [SingleFieldIndexer("animal_idx", "animal"), SingleFieldIndexer("label_idx", "label"),
            SingleFieldIndexer("tags_idx", "tags"), SingleFieldIndexer("split_idx", "split"),
            FieldNotNullIndexer("caption_notnull", "caption")]


def selector(desc: list) -> Any:
    """A selector from its description in the expected JSON."""
    if desc[0] == "single":
        return SingleIndexSelector(desc[1], desc[2])
    parts = [selector(d) for d in desc[1]]
    return IntersectIndexSelector(parts) if desc[0] == "intersect" else UnionIndexSelector(parts)


def ids(url: Any, **options: Any) -> list[int]:
    options.setdefault("reader_pool_type", "dummy")
    with make_reader(url, schema_fields=["id"], **options) as reader:
        return [int(row.id) for row in reader]


@pytest.fixture(scope="module")
def unihub_indexed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture with its index rebuilt by unihub in this process (JSON beside Petastorm's pickle)."""
    path = tmp_path_factory.mktemp("indexed") / "ds"
    shutil.copytree(DATASET, path)
    build_rowgroup_index(str(path), None, INDEXERS)
    return path


@pytest.fixture(scope="module")
def all_rows() -> dict[int, Any]:
    with make_reader(DATASET, reader_pool_type="dummy") as reader:
        return {int(row.id): row for row in reader}


# -- Petastorm's index, and unihub's built on the same dataset ------------------------------------
def test_petastorm_index_is_read_from_its_pickle() -> None:
    stored = read_rowgroup_indexes(open_dataset(DATASET))
    assert stored.source == "petastorm" and stored.stale is None
    assert sorted(stored.indexes) == sorted(EXPECTED["indexes"])
    for name, info in EXPECTED["indexes"].items():
        assert stored.indexes[name].index_field == info["field"]
        assert len(stored.indexes[name].indexed_values) == info["values"]


@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_selects_what_petastorm_selects_from_its_index(name: str) -> None:
    expected = SELECTORS[name]
    indexes = get_row_group_indexes(str(DATASET))
    assert sorted(selector(expected["selector"]).select_row_groups(indexes)) == expected["row_groups"]
    with pytest.warns(UserWarning, match="selected no row groups") if not expected["ids"] else nullcontext():
        assert sorted(ids(DATASET, rowgroup_selector=selector(expected["selector"]))) == expected["ids"]


@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_index_built_by_unihub_selects_the_same(unihub_indexed: Path, name: str) -> None:
    expected = SELECTORS[name]
    indexes = get_row_group_indexes(str(unihub_indexed))
    assert sorted(selector(expected["selector"]).select_row_groups(indexes)) == expected["row_groups"]
    if expected["ids"]:
        assert sorted(ids(unihub_indexed, rowgroup_selector=selector(expected["selector"]))) == expected["ids"]


def test_index_built_by_unihub_equals_petastorms(unihub_indexed: Path) -> None:
    ours = read_rowgroup_indexes(open_dataset(unihub_indexed))
    theirs = read_rowgroup_indexes(open_dataset(DATASET))
    assert ours.source == "unihub" and ours.stale is None
    assert ours.indexes == theirs.indexes
    # Petastorm's pickle is left as it was: Petastorm still reads its own index of the dataset
    assert (pq.read_metadata(unihub_indexed / "_common_metadata").metadata[PETASTORM_ROWGROUPS_INDEX_KEY]
            == pq.read_metadata(DATASET / "_common_metadata").metadata[PETASTORM_ROWGROUPS_INDEX_KEY])


def test_batch_reader_with_a_selector() -> None:
    expected = SELECTORS["cat_and_label_3_7"]
    with make_batch_reader(DATASET, schema_fields=["id"], rowgroup_selector=selector(expected["selector"]),
                           reader_pool_type="dummy") as reader:
        got = sorted(int(i) for batch in reader for i in batch.id)
    assert got == expected["ids"]


def test_petastorm_selector_objects_work_too() -> None:
    class PetastormStyle:  # any object with Petastorm's two methods, as petastorm.selectors' are
        def get_index_names(self) -> list[str]:
            return ["label_idx"]

        def select_row_groups(self, index_dict: dict[str, Any]) -> set[int]:
            return index_dict["label_idx"].get_row_group_indexes(3) | index_dict["label_idx"].get_row_group_indexes(7)

    assert sorted(ids(DATASET, rowgroup_selector=PetastormStyle())) == SELECTORS["label_3_7"]["ids"]


# -- the selector in the reader: predicates, shuffling, shards, resume ----------------------------
def test_selector_with_a_predicate(all_rows: dict[int, Any]) -> None:
    expected = SELECTORS["tags_t5"]
    got = ids(DATASET, rowgroup_selector=selector(expected["selector"]),
              predicate=in_lambda(["animal"], lambda animal: animal == "cat"))
    assert sorted(got) == [i for i in expected["ids"] if all_rows[i].animal == "cat"]


def test_selector_after_a_partition_predicate() -> None:
    train = in_lambda(["split"], lambda split: split == "train")
    expected = SELECTORS["label_3_7"]
    assert sorted(ids(DATASET, rowgroup_selector=selector(expected["selector"]), predicate=train)) == \
        [i for i in expected["ids"] if (i // 30) % 4 != 0]  # make_rowgroup_index.py: split of row i
    with pytest.warns(UserWarning, match="selected no row groups"):
        assert ids(DATASET, rowgroup_selector=SingleIndexSelector("split_idx", ["test"]), predicate=train) == []


@pytest.mark.parametrize("shard_count", [2, 3])
def test_shuffled_shards_cover_the_selection_once_per_epoch(shard_count: int) -> None:
    expected = SELECTORS["tags_or_caption"]
    options = {"rowgroup_selector": selector(expected["selector"]), "shuffle_row_groups": True,
               "shuffle_rows": True, "seed": 11, "shard_count": shard_count, "num_epochs": 2}
    per_shard = [ids(DATASET, cur_shard=k, **options) for k in range(shard_count)]
    for shard in per_shard:
        first, second = shard[:len(shard) // 2], shard[len(shard) // 2:]
        assert sorted(first) == sorted(second) and first != second  # each epoch whole, reshuffled
    assert sorted(i for shard in per_shard for i in shard[:len(shard) // 2]) == expected["ids"]


@pytest.mark.parametrize("cut", [0, 1, 37, 150])
def test_resume_with_a_selector_yields_exactly_the_rest(cut: int) -> None:
    expected = SELECTORS["caption_not_null"]
    options = {"rowgroup_selector": selector(expected["selector"]), "shuffle_row_groups": True,
               "shuffle_rows": True, "seed": 5, "num_epochs": 2, "schema_fields": ["id"]}
    with make_reader(DATASET, **options) as reader:
        everything = [int(row.id) for row in reader]
    assert sorted(everything) == sorted(expected["ids"] * 2)
    with make_reader(DATASET, **options) as reader:
        head = [int(next(reader).id) for _ in range(cut)]
        state = json.loads(json.dumps(reader.state_dict()))
    with make_reader(DATASET, resume_from=state, **options) as reader:
        rest = [int(row.id) for row in reader]
    assert head + rest == everything


def test_a_state_saved_with_another_selection_is_refused() -> None:
    with make_reader(DATASET, rowgroup_selector=selector(SELECTORS["tags_t5"]["selector"])) as reader:
        next(reader)
        state = reader.state_dict()
    with pytest.raises(ReaderStateError, match="row groups"):
        make_reader(DATASET, rowgroup_selector=selector(SELECTORS["label_3_7"]["selector"]), resume_from=state)


# -- errors -----------------------------------------------------------------------------------------
def test_unknown_index_names_the_index_and_the_dataset() -> None:
    with pytest.raises(RowGroupIndexError, match=r"\['no_such_idx'\].*rowgroup_index") as info:
        make_reader(DATASET, rowgroup_selector=IntersectIndexSelector([SingleIndexSelector("animal_idx", ["cat"]),
                                                                       SingleIndexSelector("no_such_idx", [1])]))
    assert isinstance(info.value, ValueError)
    assert "animal_idx" in str(info.value)  # the indexes it does have


def test_dataset_without_indexes() -> None:
    plain = FIXTURES / "unischema"
    with pytest.raises(ValueError, match=rf"\['label_idx'\].*{plain}.*no row-group indexes.*build_rowgroup_index"):
        make_reader(plain, rowgroup_selector=SingleIndexSelector("label_idx", [1]))
    with pytest.raises(RowGroupIndexError, match="no row-group indexes"):
        get_row_group_indexes(str(plain))


def test_not_a_selector() -> None:
    with pytest.raises(RowGroupIndexError, match="must be a row-group selector.*got str"):
        make_reader(DATASET, rowgroup_selector="animal_idx")


def _with_index_pickle(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "ds"
    shutil.copytree(DATASET, path)
    arrow_schema = pq.read_metadata(path / "_common_metadata").schema.to_arrow_schema()
    pq.write_metadata(arrow_schema.with_metadata({**arrow_schema.metadata, PETASTORM_ROWGROUPS_INDEX_KEY: data}),
                      path / "_common_metadata")
    return path


class _Reduce:
    def __init__(self, func: Any, args: tuple) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple:
        return self.func, self.args


@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_a_malicious_index_pickle_is_refused_without_running_it(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "pwned"
    attack = {"animal_idx": _Reduce(os.system, (f"touch {marker}",))}
    path = _with_index_pickle(tmp_path, pickle.dumps(attack, protocol=protocol))
    with pytest.raises(UnsafeMetadataError, match="nothing from the pickle was executed"):
        make_reader(path, rowgroup_selector=SingleIndexSelector("animal_idx", ["cat"]))
    assert main(["inspect", str(path)]) == 0  # the dataset still opens; the index is reported unreadable
    assert len(ids(path)) == 240  # and reads without a selector
    assert not marker.exists()


def test_a_stale_index_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ds"
    shutil.copytree(DATASET, path)
    build_rowgroup_index(str(path), None, INDEXERS[:1])
    extra = next((path / "split=test").glob("*.parquet"))
    shutil.copy(extra, extra.with_name("part-99999.parquet"))
    stored = read_rowgroup_indexes(open_dataset(path))
    assert stored.stale is not None and "6 files" in stored.stale
    with pytest.raises(RowGroupIndexError, match="stale.*rebuild"):
        make_reader(path, rowgroup_selector=SingleIndexSelector("animal_idx", ["cat"]))


# -- inspect ----------------------------------------------------------------------------------------
def test_inspect_lists_petastorm_indexes(capsys: pytest.CaptureFixture) -> None:
    assert main(["inspect", str(DATASET)]) == 0
    out = capsys.readouterr().out
    assert "row-group indexes (Petastorm pickle, allow-listed):" in out
    rows = {line.split()[0]: line.split() for line in out.split("row-group indexes")[1].splitlines()[2:]}
    assert rows["tags_idx"] == ["tags_idx", "single_field", "tags", "29", "19"]
    assert rows["caption_notnull"] == ["caption_notnull", "field_not_null", "caption", "-", "13"]
    assert main(["inspect", str(DATASET), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["rowgroup_index_source"] == "petastorm" and info["rowgroup_index_problem"] is None
    listed = {i["name"]: i for i in info["rowgroup_indexes"]}
    for name, expected in EXPECTED["indexes"].items():
        assert listed[name]["field"] == expected["field"]
        if listed[name]["kind"] == "single_field":
            assert listed[name]["values"] == expected["values"]


def test_inspect_without_indexes(capsys: pytest.CaptureFixture) -> None:
    assert main(["inspect", str(FIXTURES / "unischema")]) == 0
    assert "row-group indexes" not in capsys.readouterr().out
    assert main(["inspect", str(FIXTURES / "unischema"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["rowgroup_indexes"] == [] and info["rowgroup_index_source"] is None


def test_inspect_shows_unihub_indexes(unihub_indexed: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["inspect", str(unihub_indexed)]) == 0
    assert "row-group indexes (unihub JSON):" in capsys.readouterr().out


# -- on Spark ---------------------------------------------------------------------------------------
@pytest.mark.spark
def test_built_on_spark_equals_built_in_process(spark: Any, tmp_path: Path, unihub_indexed: Path) -> None:
    path = tmp_path / "ds"
    shutil.copytree(DATASET, path)
    built = build_rowgroup_index(str(path), spark.sparkContext, INDEXERS)
    assert sorted(built) == sorted(i.index_name for i in INDEXERS)
    assert read_rowgroup_indexes(open_dataset(path)).indexes == read_rowgroup_indexes(
        open_dataset(unihub_indexed)).indexes
    stored = pq.read_metadata(path / "_common_metadata").metadata[ROWGROUP_INDEX_KEY]
    assert stored == pq.read_metadata(unihub_indexed / "_common_metadata").metadata[ROWGROUP_INDEX_KEY]


# -- on S3 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fsspec", "pyarrow"])
def test_built_and_selected_on_s3(s3_server: Any, kind: str) -> None:
    access = s3_server.access(kind)
    prefix = f"indexed-{kind}"
    url = s3_server.upload_folder(DATASET, prefix)
    client = s3_server.client()
    build_rowgroup_index(url, None, INDEXERS, **access)
    keys = sorted(e["Key"] for e in client.list_objects_v2(Bucket=s3_server.bucket, Prefix=prefix)["Contents"])
    assert [k for k in keys if "/_" in k] == [f"{prefix}/_common_metadata"]  # no temporary left
    assert read_rowgroup_indexes(open_dataset(url, **access)).source == "unihub"
    expected = SELECTORS["cat_and_label_3_7"]
    assert sorted(ids(url, rowgroup_selector=selector(expected["selector"]), **access)) == expected["ids"]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_an_index_built_after_an_append_is_read_by_the_version_it_was_built_over(
        tmp_path: Path, where: str, request: pytest.FixtureRequest) -> None:
    """A grown dataset's version reads its own ``_common_metadata`` copy (the append's): the index went into the
    plain file only, and the build was followed by "has no row-group indexes"."""
    schema = Unischema("Grown", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                 UnischemaField("label", np.int64, (), ScalarCodec(pa.int64()), False)])
    access: dict[str, Any] = {}
    url = str(tmp_path / "ds")
    if where == "s3":
        server = request.getfixturevalue("s3_server")
        access = server.access("fsspec")
        url = f"s3://{server.bucket}/grown-index"
    write_dataset(url, schema, [{"id": i, "label": i // 5} for i in range(10)], rows_per_file=5, **access)
    write_dataset(url, schema, [{"id": i, "label": i // 5} for i in range(10, 20)], rows_per_file=5, mode="append",
                  **access)
    build_rowgroup_index(url, None, [SingleFieldIndexer("label_idx", "label")], **access)
    assert sorted(ids(url, rowgroup_selector=SingleIndexSelector("label_idx", [1, 3]), **access)) == [
        *range(5, 10), *range(15, 20)]
    assert list(get_row_group_indexes(url, **access)) == ["label_idx"]
