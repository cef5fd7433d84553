"""Hostile version records, manifests and column-set records (JSON unihub writes beside a dataset and reads back):
every value of the wrong type, or a path outside the dataset root, is a FormatError naming the file; nothing outside
the root is read, and a vacuum never deletes a file outside it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tests.store.test_versions import SCHEMA, ids, rows
from unihub import ScalarCodec, UnischemaField, make_reader, open_dataset, write_dataset
from unihub.errors import FormatError
from unihub.fs import publish
from unihub.store import column_sets, versions
from unihub.store.columns import add_columns

ESCAPING = "../victim.txt"
#: (key, value) written into version 1's record: each a record unihub never writes
HOSTILE = [("parts", [ESCAPING]), ("parts", ["part-00000.parquet", "sub/../../victim.txt"]), ("parts", ["."]),
           ("parts", [""]), ("parts", ["a\0b"]), ("parts", ESCAPING), ("parts", [1]), ("parts", [{}]),
           ("common_metadata", ESCAPING), ("common_metadata", 5), ("common_metadata", [1]),
           ("column_sets", "x"), ("column_sets", [1]), ("column_sets", [{"files": [ESCAPING]}]),
           ("column_sets", [{"name": "s", "schema": {}, "files": [],
                             "parts": {"part-00000.parquet": {"file": ESCAPING, "rows": 1, "part_bytes": 1}}}]),
           ("number", float("inf")), ("added_rows", "5"), ("base", [1]), ("tag", {}), ("sources", [{"path": "x", "size": 1e400}])]


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset of three versions (the first tagged by its append's record, "t2" the second)."""
    root = tmp_path_factory.mktemp("grown")
    url = str(root / "ds")
    write_dataset(url, SCHEMA, rows(0, 10), rows_per_file=4)
    write_dataset(url, SCHEMA, rows(10, 15), mode="append", tag="t2")
    write_dataset(url, SCHEMA, rows(15, 20), mode="append")
    return root


def _hostile_copy(grown: Path, tmp_path: Path, key: str, value: Any) -> str:
    shutil.copytree(grown, tmp_path / "copy")
    (tmp_path / "copy" / "victim.txt").write_text("precious")
    record = tmp_path / "copy" / "ds" / publish.VERSIONS_DIR / "00000001.json"
    found = json.loads(record.read_text())
    found[key] = value
    record.write_text(json.dumps(found))
    return str(tmp_path / "copy" / "ds")


OPERATIONS: dict[str, Callable[[str], Any]] = {
    "versions": versions.list_versions,
    "read version 1": lambda url: ids(url, version=1),
    "append": lambda url: write_dataset(url, SCHEMA, rows(20, 22), mode="append"),
    "vacuum": lambda url: versions.vacuum_dataset(url, 1),
}


@pytest.mark.parametrize("key,value", HOSTILE, ids=[f"{k}={v!r}"[:40] for k, v in HOSTILE])
@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_a_hostile_version_record_is_a_named_error_and_nothing_outside_is_touched(
        grown: Path, tmp_path: Path, key: str, value: Any, operation: str) -> None:
    url = _hostile_copy(grown, tmp_path, key, value)
    with pytest.raises(FormatError, match="00000001.json"):
        OPERATIONS[operation](url)
    assert (tmp_path / "copy" / "victim.txt").read_text() == "precious"


def test_a_vacuum_never_deletes_a_file_a_record_lists_outside_the_dataset(grown: Path, tmp_path: Path) -> None:
    """Before: a dropped version's record listing ``../victim.txt`` made ``vacuum --keep 1`` delete it."""
    url = _hostile_copy(grown, tmp_path, "parts", ["part-00000.parquet", ESCAPING])
    with pytest.raises(FormatError, match="not a path inside the dataset"):
        versions.vacuum_dataset(url, 1)
    assert (tmp_path / "copy" / "victim.txt").exists()
    assert sorted(p.name for p in (tmp_path / "copy" / "ds" / publish.VERSIONS_DIR).glob("*.json")) == [
        "00000001.json", "00000002.json", "00000003.json"]


@pytest.mark.parametrize("parts", [[ESCAPING], ["/etc/passwd"], "part-00000.parquet", [3]])
def test_a_manifest_listing_files_outside_the_dataset_is_a_named_error(tmp_path: Path, parts: Any) -> None:
    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 4))
    (tmp_path / "ds" / publish.MANIFEST).write_text(json.dumps(
        {"format": "unihub.manifest", "version": publish.VERSION, "run": None, "parts": parts,
         "common_metadata": None}))
    with pytest.raises(FormatError, match=publish.MANIFEST):
        open_dataset(url)


def test_a_column_set_record_naming_a_side_file_outside_the_dataset_is_a_named_error(tmp_path: Path) -> None:
    record = {"format": column_sets.FORMAT, "version": column_sets.VERSION, "files": [],
              "sets": [{"name": "s", "schema": json.loads(SCHEMA.to_json()), "files": [],
                        "parts": {"part-00000.parquet": {"file": ESCAPING, "rows": 1, "part_bytes": 1}}}]}
    with pytest.raises(FormatError, match="not a path inside the dataset"):
        column_sets.parse_record(json.dumps(record).encode(), "x/_unihub_columns.json")


def test_a_column_set_naming_a_field_its_side_file_lacks_is_a_named_error(tmp_path: Path) -> None:
    """Before: pyarrow read the side file without the column it lacks, and table.column raised a KeyError."""
    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 4))
    add_columns(url, [UnischemaField("y", np.int64, (), ScalarCodec(pa.int64()), False)], {"y": np.arange(4)},
                name="extra")
    record = tmp_path / "ds" / publish.VERSIONS_DIR / "00000002.json"
    found = json.loads(record.read_text())
    found["column_sets"][0]["schema"]["fields"][0]["name"] = "zz"
    record.write_text(json.dumps(found))
    with pytest.raises(FormatError, match=r"_unihub_columns/extra/.*\.parquet: holds no column 'zz', which the "
                                          r"dataset's version record lists"):
        with make_reader(url, reader_pool_type="dummy") as reader:
            list(reader)
