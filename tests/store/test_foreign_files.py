"""Data files another tool wrote into a versioned dataset (Spark's ``mode("append")``, a copy by hand) are left
where they are and named in a warning at the next commit: no version lists them, so unihub's readers do not read
them, while plain readers do. On an object store a settle deleted every file its manifest and records did not list:
such a file was lost at the next append. What an overwrite replaced (files already there when its manifest was
written) is still removed.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from unihub import compact_dataset, delete_rows, open_dataset, write_dataset
from unihub.fs import filesystem as fsutil
from unihub.store.metadata_files import write_summary_metadata

from .test_versions import SCHEMA, ids, rows

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm" / "unischema"
SPARKS = "part-00001-0f1e2d3c-c000.snappy.parquet"  # as Spark names an appended file


def test_a_file_another_tool_appended_is_kept_and_named_at_the_next_commit(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 6))
    write_dataset(url, SCHEMA, rows(6, 8), mode="append")
    shutil.copyfile(open_dataset(url).files[0].path, tmp_path / "ds" / SPARKS)
    with pytest.warns(UserWarning, match=rf"1 data file\(s\) that no version of the dataset lists .*\({SPARKS}\)"):
        write_dataset(url, SCHEMA, rows(8, 9), mode="append")
    assert (tmp_path / "ds" / SPARKS).exists() and ids(url) == list(range(9))
    assert pq.read_table(url).num_rows == 9 + 6  # a plain reader reads it


def test_inspect_names_the_files_no_version_lists(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from unihub.cli import main
    from unihub.viewer.describe import describe_dataset

    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 6))
    assert "foreign_files" not in describe_dataset(url)  # written once: every file is version 1's
    write_dataset(url, SCHEMA, rows(6, 8), mode="append")
    shutil.copyfile(open_dataset(url).files[0].path, tmp_path / "ds" / SPARKS)
    assert describe_dataset(url)["foreign_files"] == [SPARKS]
    assert main(["inspect", url]) == 0
    assert f"not in any version: 1 data file(s) another tool wrote ({SPARKS}); unihub's readers skip them" in \
        capsys.readouterr().out


def test_a_plain_dataset_written_once_has_no_foreign_file(tmp_path: Path, recwarn: pytest.WarningsRecorder) -> None:
    """Before its first record every file in it is version 1's (a dataset Spark or Petastorm wrote)."""
    url = tmp_path / "ds"
    shutil.copytree(FIXTURE, url)
    write_dataset(url, open_dataset(url).schema, [], mode="append")
    assert not [w for w in recwarn if "no version of the dataset lists" in str(w.message)]


def test_on_s3_a_file_another_tool_appended_outlives_appends_deletes_and_compactions(s3_server: Any) -> None:
    url = f"s3://{s3_server.bucket}/foreign-{uuid.uuid4().hex[:8]}/ds"
    options = s3_server.storage_options()
    fs, root = fsutil.resolve_filesystem(url, None, options)
    write_dataset(url, SCHEMA, rows(0, 6), storage_options=options)
    fs.copy_file(open_dataset(url, storage_options=options).files[0].path, f"{root}/{SPARKS}")
    for commit in (lambda: write_dataset(url, SCHEMA, rows(6, 8), mode="append", storage_options=options),
                   lambda: delete_rows(url, pc.field("id") == 7, storage_options=options),
                   lambda: compact_dataset(url, storage_options=options)):
        with pytest.warns(UserWarning, match=rf"no version of the dataset lists .*\({SPARKS}\): left as they are"):
            commit()
        assert fsutil.exists(fs, f"{root}/{SPARKS}")
    assert ids(url, storage_options=options) == [0, 1, 2, 3, 4, 5, 6]


def test_on_s3_an_overwrite_of_a_foreign_dataset_still_removes_its_files_and_summary(s3_server: Any) -> None:
    """Petastorm's dataset with a ``_metadata`` summary, replaced: its files go, and the summary that listed them
    (a settle keeps a summary: every commit rewrites it, store/listings.py)."""
    url = f"s3://{s3_server.bucket}/replaced-{uuid.uuid4().hex[:8]}/ds"
    options = s3_server.storage_options()
    fs, root = fsutil.resolve_filesystem(url, None, options)
    local = pafs.LocalFileSystem()
    for path in sorted(FIXTURE.iterdir()):
        pafs.copy_files(str(path), f"{root}/{path.name}", source_filesystem=local, destination_filesystem=fs)
    paths = [f.path for f in open_dataset(url, storage_options=options).files]
    with fs.open_input_file(paths[0]) as handle:
        write_summary_metadata(fs, root, paths, pq.read_metadata(handle))
    write_dataset(url, SCHEMA, rows(0, 3), overwrite_foreign=True, storage_options=options)
    left = [info.path for info in fs.get_file_info(pafs.FileSelector(root)) if info.path.endswith(".snappy.parquet")]
    assert left == [] and not fsutil.exists(fs, f"{root}/_metadata") and ids(url, storage_options=options) == [0, 1, 2]
