"""``unihub convert SRC DST --append`` (incremental: only new source files, idempotent, a changed one named),
``unihub inspect --versions`` and ``unihub vacuum``, with TFRecord files written by ``tf.io.TFRecordWriter``."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unihub import write_dataset
from unihub.cli import main
from unihub.store import versions
from unihub.store.dataset import open_dataset

tf = pytest.importorskip("tensorflow")


def write_tfrecord(path: Path, first: int, count: int = 5) -> None:
    """``count`` records with ids from ``first``, written by TensorFlow's own writer."""
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(first, first + count):
            feature = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                       "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i / 3, -i / 7]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def tf_ids(paths: list[Path]) -> list[int]:
    """The ids TensorFlow parses from ``paths``."""
    spec = {"id": tf.io.FixedLenFeature([], tf.int64)}
    return sorted(int(tf.io.parse_single_example(raw, spec)["id"]) for p in paths
                  for raw in tf.data.TFRecordDataset(str(p)))


def ids(url: str, **options: Any) -> list[int]:
    store = open_dataset(url, **options)
    return sorted(i for g in range(len(store.row_groups)) for i in store.read_row_group(g, ["id"])["id"].to_pylist())


def test_incremental_conversion_converts_only_new_files_and_is_idempotent(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    raw, dst = tmp_path / "raw", str(tmp_path / "ds")
    raw.mkdir()
    write_tfrecord(raw / "day-1.tfrecord", 0)
    write_tfrecord(raw / "day-2.tfrecord", 100)
    pattern = str(raw / "*.tfrecord")
    assert main(["convert", pattern, dst, "--append", "--tag", "first", "--quiet"]) == 0
    assert ids(dst) == tf_ids([raw / "day-1.tfrecord", raw / "day-2.tfrecord"])
    first = versions.list_versions(dst)
    assert [(v.number, v.tag, len(v.sources)) for v in first] == [(1, "first", 2)]
    assert all(s.sha256 and s.size == (raw / Path(s.path).name).stat().st_size for s in first[0].sources)
    assert main(["convert", pattern, dst, "--append"]) == 0  # the same command again: nothing to do
    assert "nothing new" in capsys.readouterr().err
    assert [v.number for v in versions.list_versions(dst)] == [1]
    write_tfrecord(raw / "day-3.tfrecord", 200)
    os.utime(raw / "day-1.tfrecord", ns=(time.time_ns(), time.time_ns() + 10**9))  # touched, not changed
    assert main(["convert", pattern, dst, "--append", "--quiet"]) == 0
    history = versions.list_versions(dst)
    assert [(v.number, v.added_rows, len(v.sources)) for v in history] == [(1, 10, 2), (2, 5, 3)]
    assert ids(dst) == tf_ids(sorted(raw.glob("*.tfrecord")))
    assert ids(dst, version=1) == tf_ids([raw / "day-1.tfrecord", raw / "day-2.tfrecord"])
    assert main(["convert", pattern, dst, "--append", "--quiet"]) == 0
    assert len(versions.list_versions(dst)) == 2

    assert main(["inspect", dst, "--versions"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["version", "timestamp", "operation", "files", "rows", "added", "tag"]
    assert table[1].split()[0::2] == ["1", "write", "10"] and table[1].split()[-1] == "first"
    assert main(["inspect", dst, "--versions", "--json"]) == 0
    assert [v["added_rows"] for v in json.loads(capsys.readouterr().out)] == [10, 5]
    assert main(["vacuum", dst, "--keep", "1"]) == 0
    assert "removed 1 version(s)" in capsys.readouterr().out
    # vacuumed: the latest version still knows every source file, so nothing is converted twice
    assert main(["convert", pattern, dst, "--append", "--quiet"]) == 0
    assert ids(dst) == tf_ids(sorted(raw.glob("*.tfrecord")))


def test_a_changed_source_file_is_reported_by_name_and_nothing_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    raw, dst = tmp_path / "raw", str(tmp_path / "ds")
    raw.mkdir()
    write_tfrecord(raw / "a.tfrecord", 0)
    assert main(["convert", str(raw / "*.tfrecord"), dst, "--append", "--quiet"]) == 0
    write_tfrecord(raw / "a.tfrecord", 50, count=7)  # rewritten with other records
    write_tfrecord(raw / "b.tfrecord", 500)
    assert main(["convert", str(raw / "*.tfrecord"), dst, "--append", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "SourceChangedError" in err or "changed since they were converted" in err
    assert "a.tfrecord" in err and "b.tfrecord" not in err
    assert ids(dst) == list(range(5)) and len(versions.list_versions(dst)) == 1


def test_append_conversion_refuses_a_dataset_that_records_no_sources(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    raw, dst = tmp_path / "raw", str(tmp_path / "ds")
    raw.mkdir()
    write_tfrecord(raw / "a.tfrecord", 0)
    assert main(["convert", str(raw / "a.tfrecord"), dst, "--quiet"]) == 0  # a plain conversion: no record
    assert main(["convert", str(raw / "a.tfrecord"), dst, "--append", "--quiet"]) == 1
    assert "records no source files" in capsys.readouterr().err
    assert ids(dst) == list(range(5))
    assert main(["convert", str(raw / "a.tfrecord"), dst, "--append", "--overwrite", "--quiet"]) == 1


def test_incremental_conversion_on_s3(tmp_path: Path, s3_server: Any) -> None:
    pytest.importorskip("s3fs")
    raw = tmp_path / "raw"
    raw.mkdir()
    write_tfrecord(raw / "a.tfrecord", 0)
    prefix = f"inc-{uuid.uuid4().hex[:8]}"
    src = s3_server.upload_folder(raw, f"{prefix}/raw")
    dst = f"s3://{s3_server.bucket}/{prefix}/ds"
    endpoint = ["--storage-option", f"client_kwargs.endpoint_url={s3_server.endpoint_url}"]
    assert main(["convert", f"{src}/*.tfrecord", dst, "--append", "--quiet", *endpoint]) == 0
    assert main(["convert", f"{src}/*.tfrecord", dst, "--append", "--quiet", *endpoint]) == 0
    write_tfrecord(raw / "b.tfrecord", 100)
    s3_server.client().upload_file(str(raw / "b.tfrecord"), s3_server.bucket, f"{prefix}/raw/b.tfrecord")
    assert main(["convert", f"{src}/*.tfrecord", dst, "--append", "--quiet", *endpoint]) == 0
    options = {"storage_options": s3_server.storage_options()}
    assert [v.number for v in versions.list_versions(dst, **options)] == [1, 2]
    assert ids(dst, **options) == list(range(5)) + list(range(100, 105))
    assert ids(dst, version=1, **options) == list(range(5))


def test_two_conversions_of_the_same_new_files_at_once_publish_them_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    raw, dst = tmp_path / "raw", str(tmp_path / "ds")
    raw.mkdir()
    write_tfrecord(raw / "a.tfrecord", 0)
    assert main(["convert", str(raw / "*.tfrecord"), dst, "--append", "--quiet"]) == 0
    write_tfrecord(raw / "b.tfrecord", 100)
    assert main(["convert", str(raw / "*.tfrecord"), dst, "--append", "--quiet"]) == 0
    # a second conversion that listed the sources before the first published (it saw b.tfrecord as new)
    before = versions.list_versions(dst)[0]
    monkeypatch.setattr(versions, "converted_sources", lambda fs, root: list(before.sources))
    assert main(["convert", str(raw / "*.tfrecord"), dst, "--append", "--quiet"]) == 1
    assert "another conversion published 1 of these source files meanwhile" in capsys.readouterr().err
    assert ids(dst) == list(range(5)) + list(range(100, 105)) and len(versions.list_versions(dst)) == 2


def test_versions_of_a_dataset_written_before_it_had_records_say_version_1s_rows(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Version 1 of a dataset written once (no record), then appended to (its record made then, without a count):
    'rows added' was '?' (null in JSON); its parts' footers say."""
    raw, dst = tmp_path / "raw", str(tmp_path / "ds")
    raw.mkdir()
    write_tfrecord(raw / "day-1.tfrecord", 0, count=7)
    assert main(["convert", str(raw / "day-1.tfrecord"), dst, "--quiet"]) == 0  # no --append: no record
    assert main(["inspect", dst, "--versions", "--json"]) == 0
    assert [(v["added_rows"], v["recorded"]) for v in json.loads(capsys.readouterr().out)] == [(7, False)]
    store = open_dataset(dst)
    write_dataset(dst, store.schema, ({"id": 100 + i, "x": np.zeros(2, np.float32)} for i in range(5)),
                  mode="append")
    assert main(["inspect", dst, "--versions"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert [line.split()[4] for line in table[1:]] == ["7", "5"], table
