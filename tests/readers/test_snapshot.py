"""A reader sees one snapshot: files overwritten after it opened the dataset are refused, never mixed in.

Issue 12: a reader opened before an overwrite that keeps the file names yielded the old rows,
then the new files' rows under the old footers, with no error. Each file is now checked when a
worker opens it (size and modification time against the listing the reader was opened with).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from unihub import ScalarCodec, Unischema, UnischemaField, make_batch_reader, make_reader, write_dataset
from unihub.errors import DatasetChangedError
from unihub.store import integrity

SCHEMA = Unischema("S", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False)])
NEW = 100_000


def write(path: Path, first: int, rows: int = 4000, rows_per_file: int = 500) -> dict[str, int]:
    """Files of ``rows_per_file`` ids from ``first``, small row groups, no compression (so an overwrite
    with other ids of the same count gives files of the very same names and sizes); name -> size."""
    write_dataset(path, SCHEMA, [{"id": np.arange(first, first + rows, dtype=np.int64)}], batched=True,
                  overwrite=True, rows_per_file=rows_per_file, row_group_size_mb=0.001, compression=None)
    return {p.name: p.stat().st_size for p in path.glob("*.parquet")}


def read_until_changed(reader, overwrite, after: int) -> tuple[list[int], DatasetChangedError]:
    ids: list[int] = []
    with pytest.raises(DatasetChangedError) as caught:
        for item in reader:
            ids.extend(np.atleast_1d(item.id).tolist())
            if overwrite is not None and len(ids) >= after:
                overwrite()
                overwrite = None
    return ids, caught.value


@pytest.mark.parametrize("pool", ["thread", "process", "dummy"])
@pytest.mark.parametrize("batched", [False, True])
def test_an_overwrite_keeping_file_names_and_sizes_is_refused_not_mixed(tmp_path: Path, pool: str, batched: bool,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # page CRCs are varints in the page headers: other ids would change the files' sizes by a byte or two
    monkeypatch.setitem(integrity.WRITE_OPTIONS, "write_page_checksum", False)
    ds = tmp_path / "ds"
    before = write(ds, 0)
    opened = (make_batch_reader if batched else make_reader)(ds, shuffle_row_groups=False, workers_count=2,
                                                             reader_pool_type=pool)
    with opened as reader:
        after = {}
        ids, error = read_until_changed(reader, lambda: after.update(write(ds, NEW)), 1500)
    assert after == before  # the same names and sizes: only the contents differ
    assert ids and all(i < NEW for i in ids), "rows of the new dataset were mixed into the old one"
    assert ids == list(range(len(ids)))
    message = str(error)
    assert "part-" in message and str(ds) in message
    assert "changed since" in message and "open the dataset again" in message
    with make_reader(ds, shuffle_row_groups=False, workers_count=2) as reader:  # opened again: the new rows
        assert [int(row.id) for row in reader] == list(range(NEW, NEW + 4000))


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_files_gone_after_an_overwrite_are_named(tmp_path: Path, pool: str) -> None:
    ds = tmp_path / "ds"
    write(ds, 0)
    with make_reader(ds, shuffle_row_groups=False, workers_count=1, reader_pool_type=pool,
                     results_queue_size=2) as reader:
        ids, error = read_until_changed(reader, lambda: write(ds, NEW, rows_per_file=4000), 600)
    assert ids and all(i < NEW for i in ids)
    assert "is gone since" in str(error) and "part-0000" in str(error)
    assert sorted(os.listdir(ds)) == ["_common_metadata", "part-00000.parquet"]


def test_the_error_names_the_file(tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    write(ds, 0)
    with make_reader(ds, shuffle_row_groups=False, workers_count=1, reader_pool_type="dummy") as reader:
        ids, error = read_until_changed(reader, lambda: write(ds, NEW), 1)
    assert error.path is not None and error.path.startswith(str(ds)) and error.path.endswith(".parquet")
    assert isinstance(error, RuntimeError)  # as a concurrent modification is in Python
