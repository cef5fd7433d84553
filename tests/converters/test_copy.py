"""``copy_dataset`` / ``unihub copy``: Petastorm's copy tool, on datasets Petastorm itself wrote.

Values are compared with the source's exactly, images as their stored bytes (a copy
decodes nothing); failures leave neither the target nor a temporary directory behind.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from unihub import copy_dataset, make_reader, open_dataset
from unihub.cli import main
from unihub.errors import DatasetExistsError, FormatError, PetastormCompatibilityError, SchemaError
from unihub.petastorm.legacy import PETASTORM_ROW_GROUPS_KEY, PETASTORM_UNISCHEMA_KEY, load_petastorm_unischema
from unihub.schema.unischema import SCHEMA_METADATA_KEY
from unihub.store.dataset import ParquetStore

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm"
PETASTORM = FIXTURES / "unischema"
PLAIN = FIXTURES / "plain"


def rows_by_id(url: Any, **options: Any) -> dict[int, dict[str, Any]]:
    """Every row as stored (images as bytes, nulls as None), keyed by id."""
    with make_reader(url, shuffle_row_groups=False, workers_count=1, decode_images=False, petastorm_types=False,
                     **options) as reader:
        return {int(row.id): dict(zip(reader.schema.fields, row)) for row in reader}


def ids_in_order(url: Any) -> list[int]:
    with make_reader(url, shuffle_row_groups=False, workers_count=1, schema_fields=["id"]) as reader:
        return [int(row.id) for row in reader]


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if "unihub-tmp" in p.name or "unihub-old" in p.name)


def test_copy_petastorm_dataset_with_field_regex_and_not_null_fields(tmp_path, value_equal):
    result = copy_dataset(None, PETASTORM, tmp_path / "copy", field_regex=["id", "image_.*", "mask", "score"],
                          not_null_fields=["score", "mask"], overwrite_output=False, partitions_count=None,
                          row_group_size_mb=None)
    source = rows_by_id(PETASTORM)
    kept = [i for i, row in sorted(source.items()) if row["score"] is not None and row["mask"] is not None]
    assert (result.rows_read, result.rows, result.files) == (60, len(kept), 3)
    assert 0 < len(kept) < 60
    store = open_dataset(tmp_path / "copy")
    assert store.schema.name == "FixtureSchema_view"
    assert list(store.schema.fields) == ["id", "score", "image_png", "image_jpeg", "mask"]
    assert [store.schema[f] for f in store.schema.fields] == [open_dataset(PETASTORM).schema[f]
                                                               for f in store.schema.fields]
    copied = rows_by_id(tmp_path / "copy")
    assert sorted(copied) == kept
    for i, row in copied.items():
        for name, value in row.items():
            value_equal(value, source[i][name], where=f"row {i} {name}")
    assert ids_in_order(tmp_path / "copy") == kept  # row order kept
    assert leftovers(tmp_path) == []


def test_copy_of_a_petastorm_dataset_stays_readable_by_petastorm(tmp_path):
    copy_dataset(None, PETASTORM, tmp_path / "copy", ["id", "embedding"], None, False, None, None)
    metadata = pq.read_metadata(tmp_path / "copy" / "_common_metadata").metadata
    view = load_petastorm_unischema(metadata[PETASTORM_UNISCHEMA_KEY])
    assert view == open_dataset(tmp_path / "copy").schema
    counts = json.loads(metadata[PETASTORM_ROW_GROUPS_KEY])
    assert counts == {p.name: pq.read_metadata(p).num_row_groups for p in (tmp_path / "copy").glob("*.parquet")}
    copy_dataset(None, PETASTORM, tmp_path / "plain_copy", ["id"], None, False, None, None,
                 petastorm_compatible=False)
    metadata = pq.read_metadata(tmp_path / "plain_copy" / "_common_metadata").metadata
    assert PETASTORM_UNISCHEMA_KEY not in metadata and SCHEMA_METADATA_KEY in metadata


def test_partitions_count_writes_files_of_equal_rows(tmp_path, value_equal):
    result = copy_dataset(None, PLAIN, tmp_path / "four", None, None, False, 4, 1)
    store = open_dataset(tmp_path / "four")
    assert result.files == 4 and [f.num_rows for f in store.files] == [150] * 4
    assert ids_in_order(tmp_path / "four") == ids_in_order(PLAIN)
    source, copied = rows_by_id(PLAIN), rows_by_id(tmp_path / "four")
    assert copied.keys() == source.keys()
    for i in source:
        for name in source[i]:
            value_equal(copied[i][name], source[i][name], where=f"row {i} {name}")
    assert store.schema == open_dataset(PLAIN).schema


def test_not_null_fields_need_not_be_copied(tmp_path):
    copy_dataset(None, PETASTORM, tmp_path / "ids", ["id"], ["score"], False, None, None)
    source = rows_by_id(PETASTORM)
    assert ids_in_order(tmp_path / "ids") == [i for i in sorted(source) if source[i]["score"] is not None]
    assert list(open_dataset(tmp_path / "ids").schema.fields) == ["id"]


def test_hive_partitions_are_kept_unless_repartitioned(write_sample, tmp_path):
    source, _ = write_sample(30, name="parted", partition_by=["split"])
    copy_dataset(None, source, tmp_path / "copy", ["id", "split", "emb"], None, False, None, None)
    assert sorted(p.name for p in (tmp_path / "copy").iterdir() if p.is_dir()) == \
        ["split=test", "split=train", "split=val"]
    assert open_dataset(tmp_path / "copy").partition_names == ("split",)
    copied, original = rows_by_id(tmp_path / "copy"), rows_by_id(source)
    assert copied.keys() == original.keys()
    for i in copied:
        assert copied[i]["split"] == original[i]["split"]
        np.testing.assert_array_equal(copied[i]["emb"], original[i]["emb"])
    copy_dataset(None, source, tmp_path / "flat", ["id", "split"], None, False, 2, None)
    flat = open_dataset(tmp_path / "flat")
    assert flat.partition_names == () and len(flat.files) == 2 and flat.num_rows == 30


def test_every_row_dropped_leaves_an_empty_dataset_with_the_schema(write_sample, tmp_path):
    source, _ = write_sample(3)  # row 0 has no score, row 1 no temps, row 2 no mask
    result = copy_dataset(None, source, tmp_path / "none", None, ["score", "temps", "mask"], False, None, None)
    store = open_dataset(tmp_path / "none")
    assert (result.rows_read, result.rows, result.files) == (3, 0, 1)
    assert store.num_rows == 0 and store.schema == open_dataset(source).schema


def test_refusals_write_nothing(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    with pytest.raises(DatasetExistsError, match="already exists"):
        copy_dataset(None, PETASTORM, tmp_path / "taken", None, None, False, None, None)
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"
    with pytest.raises(SchemaError, match="no field of Unischema 'FixtureSchema' matches 'nope'"):
        copy_dataset(None, PETASTORM, tmp_path / "x", ["id", "nope"], None, False, None, None)
    with pytest.raises(SchemaError, match=r"not_null_fields \['nope'\] are not fields"):
        copy_dataset(None, PETASTORM, tmp_path / "x", None, ["nope"], False, None, None)
    with pytest.raises(SchemaError, match="partitions_count must be a positive integer"):
        copy_dataset(None, PETASTORM, tmp_path / "x", None, None, False, 0, None)
    with pytest.raises(PetastormCompatibilityError, match="'pair'.*use NdarrayCodec"):
        _copy_fixed_tensor(tmp_path)
    assert not (tmp_path / "x").exists() and leftovers(tmp_path) == []


def _copy_fixed_tensor(tmp_path: Path) -> None:
    """A dataset with a fixed-shape TensorCodec field, copied for Petastorm: refused before writing."""
    from unihub import TensorCodec, Unischema, UnischemaField, write_dataset

    schema = Unischema("T", [UnischemaField("id", np.int64, (), None, False),
                             UnischemaField("pair", np.float32, (2,), TensorCodec(), False)])
    write_dataset(tmp_path / "tensors", schema, [{"id": 1, "pair": np.zeros(2, np.float32)}])
    copy_dataset(None, tmp_path / "tensors", tmp_path / "x", None, None, False, None, None, petastorm_compatible=True)


def test_a_failure_midway_leaves_nothing_behind(tmp_path, monkeypatch):
    shutil.copytree(PETASTORM, tmp_path / "old")
    calls = []
    original = ParquetStore.read_row_group

    def failing(self, index, columns=None, **kwargs):
        calls.append(index)
        if len(calls) == 2:
            raise FormatError("disk on fire")
        return original(self, index, columns, **kwargs)

    monkeypatch.setattr(ParquetStore, "read_row_group", failing)
    with pytest.raises(FormatError, match="disk on fire"):
        copy_dataset(None, PETASTORM, tmp_path / "new", None, None, False, None, None)
    with pytest.raises(FormatError, match="disk on fire"):
        calls.clear()
        copy_dataset(None, PETASTORM, tmp_path / "old", ["id"], None, True, None, None)
    assert not (tmp_path / "new").exists() and leftovers(tmp_path) == []
    monkeypatch.undo()
    assert open_dataset(tmp_path / "old").schema == open_dataset(PETASTORM).schema  # the old target is intact


def test_overwrite_replaces_the_target(tmp_path):
    copy_dataset(None, PETASTORM, tmp_path / "t", None, None, False, None, None)
    copy_dataset(None, PETASTORM, tmp_path / "t", ["id", "label"], None, True, 1, None)
    store = open_dataset(tmp_path / "t")
    assert list(store.schema.fields) == ["id", "label"] and len(store.files) == 1 and store.num_rows == 60
    assert leftovers(tmp_path) == []


def test_cli_copy(tmp_path, capsys):
    assert main(["copy", str(PETASTORM), str(tmp_path / "c"), "--field-regex", "id", "label",
                 "--not-null-fields", "score", "--partition-count", "2", "--row-group-size-mb", "0.5"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("copied 48 of 60 rows (12 with nulls dropped), 2 fields, into 2 file(s)")
    assert open_dataset(tmp_path / "c").num_rows == 48
    assert main(["copy", str(PETASTORM), str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("unihub: error: ") and "already exists" in err
    assert main(["copy", str(PETASTORM), str(tmp_path / "c"), "--overwrite-output", "--quiet"]) == 0
    assert capsys.readouterr().err == "" and open_dataset(tmp_path / "c").num_rows == 60


def test_cli_copy_help_has_examples(capsys):
    with pytest.raises(SystemExit):
        main(["copy", "--help"])
    out = capsys.readouterr().out
    assert "--not-null-fields" in out and "examples:" in out and "unihub copy /data/train" in out


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning")
def test_spark_engine_copies_what_the_embedded_engine_copies(spark, tmp_path):
    """Petastorm's call, ``copy_dataset(spark, ...)``: Spark tasks write the same rows, files and schema."""
    args = (["id", "label", "image_png", "boxes"], ["score"], False, 2, None)
    on_spark = copy_dataset(spark, PETASTORM, tmp_path / "spark", *args)
    here = copy_dataset(None, PETASTORM, tmp_path / "here", *args)
    assert (on_spark.rows_read, on_spark.rows, on_spark.files) == (here.rows_read, here.rows, here.files) == (60, 48, 2)
    assert open_dataset(tmp_path / "spark").schema == open_dataset(tmp_path / "here").schema
    assert ids_in_order(tmp_path / "spark") == ids_in_order(tmp_path / "here")
    spark_rows, local_rows = rows_by_id(tmp_path / "spark"), rows_by_id(tmp_path / "here")
    for i in local_rows:
        assert spark_rows[i]["image_png"] == local_rows[i]["image_png"]
        np.testing.assert_array_equal(spark_rows[i]["boxes"], local_rows[i]["boxes"])
    assert leftovers(tmp_path) == []
    assert not spark.sparkContext._jsc.sc().isStopped()  # a session given is left running
