"""Petastorm's ``get_schema``, ``load_row_groups`` and ``add_to_dataset_metadata`` on unihub
(store/dataset_metadata.py).

The expected values are what Petastorm 0.13.1 gave on the same datasets, observed by running the same
script in ``.venv-petastorm`` (its functions given ``pq.ParquetDataset(root, validate_schema=False)`` of
pyarrow 14's legacy implementation; here pyarrow's current ``ParquetDataset``, a URL or an open store).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub import (
    ScalarCodec,
    Unischema,
    UnischemaField,
    add_column,
    add_to_dataset_metadata,
    get_schema,
    infer_or_load_unischema,
    load_row_groups,
    open_dataset,
    write_dataset,
)
from unihub.errors import PetastormMetadataError

PETASTORM_WRITTEN = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm" / "unischema"
#: Petastorm's load_row_groups on two files of 10 rows written with row_group_size=4: (file, row group)
PETASTORM_PIECES = [("part-0.parquet", 0), ("part-0.parquet", 1), ("part-0.parquet", 2),
                    ("part-1.parquet", 0), ("part-1.parquet", 1), ("part-1.parquet", 2)]


@pytest.fixture
def plain(tmp_path) -> Path:
    """Plain Parquet, no metadata files: two files of 10 rows in row groups of 4."""
    for i in range(2):
        table = pa.table({"id": list(range(i * 10, i * 10 + 10)), "x": [1.5] * 10})
        pq.write_table(table, tmp_path / f"part-{i}.parquet", row_group_size=4)
    return tmp_path


def _pieces(row_groups, root):
    return [(os.path.relpath(g.path, root), g.row_group) for g in row_groups]


@pytest.mark.parametrize("how", ["ParquetDataset", "url", "store"])
def test_load_row_groups_gives_petastorms_pieces(plain, how):
    dataset = {"ParquetDataset": lambda: pq.ParquetDataset(str(plain)), "url": lambda: f"file://{plain}",
               "store": lambda: open_dataset(str(plain))}[how]()
    assert _pieces(load_row_groups(dataset), plain) == PETASTORM_PIECES


def test_load_row_groups_of_hive_partitions(tmp_path):
    for value in ("b", "a"):
        (tmp_path / f"p={value}").mkdir()
        pq.write_table(pa.table({"id": list(range(5))}), tmp_path / f"p={value}" / "f.parquet", row_group_size=3)
    # Petastorm: p=a/f.parquet 0, 1 then p=b/f.parquet 0, 1 (its partition_keys an index into the values)
    row_groups = load_row_groups(pq.ParquetDataset(str(tmp_path)))
    assert [(os.path.relpath(g.path, tmp_path), g.row_group, g.partition) for g in row_groups] == [
        ("p=a/f.parquet", 0, (("p", "a"),)), ("p=a/f.parquet", 1, (("p", "a"),)),
        ("p=b/f.parquet", 0, (("p", "b"),)), ("p=b/f.parquet", 1, (("p", "b"),))]


def test_add_to_dataset_metadata_writes_common_metadata(plain):
    (plain / "._common_metadata.crc").write_text("stale")
    add_to_dataset_metadata(pq.ParquetDataset(str(plain)), b"my.key", b"value1")
    add_to_dataset_metadata(pq.ParquetDataset(str(plain)), "str.key", "text")
    common = pq.read_metadata(plain / "_common_metadata")
    entries = {k: v for k, v in common.metadata.items() if k != b"ARROW:schema"}
    assert entries == {b"my.key": b"value1", b"str.key": b"text"}  # as Petastorm's left them
    assert common.schema.to_arrow_schema().names == ["id", "x"]
    assert not (plain / "._common_metadata.crc").exists()
    # the data files are read as before: the same row groups
    assert _pieces(load_row_groups(f"file://{plain}"), plain) == PETASTORM_PIECES


def test_add_to_dataset_metadata_refuses_a_list_of_files(plain):
    files = [str(plain / "part-0.parquet"), str(plain / "part-1.parquet")]
    with pytest.raises(ValueError, match="Expected dataset.paths to be a single path, not a list of paths"):
        add_to_dataset_metadata(pq.ParquetDataset(files), b"k", b"v")
    assert not (plain / "_common_metadata").exists()


def test_get_schema_of_plain_parquet_is_petastorms_error(plain):
    with pytest.raises(PetastormMetadataError):
        get_schema(pq.ParquetDataset(str(plain)))
    add_to_dataset_metadata(pq.ParquetDataset(str(plain)), b"my.key", b"value1")
    with pytest.raises(PetastormMetadataError):  # a _common_metadata without a Unischema: the same
        get_schema(pq.ParquetDataset(str(plain)))
    assert list(infer_or_load_unischema(pq.ParquetDataset(str(plain))).fields) == ["id", "x"]


def test_get_schema_reads_petastorms_and_unihubs_schemas(tmp_path):
    assert list(get_schema(pq.ParquetDataset(str(PETASTORM_WRITTEN))).fields)[:3] == ["id", "split", "label"]
    schema = Unischema("S", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False)])
    write_dataset(str(tmp_path / "ds"), schema, ({"id": i} for i in range(3)))
    assert get_schema(pq.ParquetDataset(str(tmp_path / "ds"))) == schema
    assert get_schema(f"file://{tmp_path / 'ds'}") == schema


def test_a_parquet_dataset_of_a_directory_is_read_as_the_directory(tmp_path):
    """Columns added beside the part files (add_column) belong to the dataset a directory's ParquetDataset names."""
    schema = Unischema("S", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False)])
    write_dataset(str(tmp_path / "ds"), schema, ({"id": i} for i in range(3)))
    add_column(str(tmp_path / "ds"), UnischemaField("y", np.float32, (), ScalarCodec(pa.float32()), False),
               np.zeros(3, np.float32))
    assert list(infer_or_load_unischema(pq.ParquetDataset(str(tmp_path / "ds"))).fields) == ["id", "y"]
