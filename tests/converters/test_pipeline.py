"""The one ingest pipeline (converters/pipeline.py): engines from one registry, tasks that write their part
files straight into the staging area, idempotent task attempts, and a destination on any filesystem."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unihub import open_dataset
from unihub.converters import tasks
from unihub.converters.convert import convert
from unihub.converters.engines import ENGINES, engine_for, local_workers
from unihub.converters.engines.forked import ForkedEngine
from unihub.errors import InvalidArgumentError, UnsupportedFormatError
from unihub.formats.tfrecord.format import TFRecordFormat


@pytest.fixture(scope="module")
def tfrecords(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Three TFRecord files of 30 records, written by tf.io.TFRecordWriter."""
    tf = pytest.importorskip("tensorflow")
    root = tmp_path_factory.mktemp("tfr")
    rng = np.random.default_rng(3)
    paths = []
    for n in range(3):
        path = str(root / f"part-{n}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for i in range(30):
                features = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[n * 100 + i])),
                            "x": tf.train.Feature(float_list=tf.train.FloatList(value=rng.random(4).tolist()))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
        paths.append(path)
    return paths


def _rows(path: Any, **options: Any) -> list[dict[str, Any]]:
    store = open_dataset(path, **options)
    return [row for i in range(len(store.row_groups)) for row in store.read_row_group(i).to_pylist()]


def test_every_engine_is_one_registered_module() -> None:
    assert engine_for("local", workers=1, files=["a", "b"]).name == "inprocess"
    assert engine_for("local", workers=2, files=["a"]).name == "inprocess"
    assert engine_for("local", workers=2, files=["a", "b"]).name == "forked"
    assert {"inprocess", "forked", "spark"} <= set(ENGINES.names())
    with pytest.raises(UnsupportedFormatError, match="valid names: forked, inprocess, spark"):
        engine_for("dask", workers=1, files=[])


def test_workers_start_only_where_the_input_pays_for_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIHUB_FORK_MIN_MB", "100")
    mib = 2**20
    assert local_workers(1, ["a", "b"], 10**12) == (1, None)
    assert local_workers(2, ["a", "b"], 200 * mib) == (2, None)
    assert local_workers(4, ["a"] * 8, 1000 * mib) == (4, None)
    workers, note = local_workers(2, ["a", "b"], 150 * mib)
    assert workers == 1 and note is not None and note.startswith("ran in-process, not in 2 workers: 150 MiB")
    workers, note = local_workers(4, ["a"] * 8, 250 * mib)
    assert workers == 2 and note is not None and note.startswith("ran in 2 workers, not 4")
    assert local_workers(2, ["a"], 10**12) == (1, "ran in-process, not in 2 workers: the input is one file")
    monkeypatch.setenv("UNIHUB_FORK_MIN_MB", "0")
    assert local_workers(2, ["a", "b"], 1) == (2, None)
    monkeypatch.setenv("UNIHUB_FORK_MIN_MB", "lots")
    with pytest.raises(InvalidArgumentError, match="UNIHUB_FORK_MIN_MB='lots' is not a number of MiB"):
        local_workers(2, ["a", "b"], 1)


@pytest.mark.parametrize("least_mb, forked", [("1000", False), ("0.001", True)])
def test_small_inputs_convert_in_process_and_say_so(tfrecords: list[str], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch, least_mb: str,
                                                    forked: bool) -> None:
    monkeypatch.setenv("UNIHUB_FORK_MIN_MB", least_mb)
    ran: list[str] = []
    real_run = ForkedEngine.run
    monkeypatch.setattr(ForkedEngine, "run", lambda self, *a, **k: (ran.append("forked"), real_run(self, *a, **k))[1])
    result = convert(os.path.dirname(tfrecords[0]), tmp_path / "ds", workers=2, progress=False)
    assert result.rows == 90 and ran == (["forked"] if forked else [])
    if forked:
        assert result.notes == []
    else:
        assert result.notes == ["ran in-process, not in 2 workers: 0 MiB of input is too little to pay for more "
                                "(a worker pays off from 1,000 MiB; UNIHUB_FORK_MIN_MB sets that)"]
        assert result.notes[0] in result.summary()
    assert sorted(r["id"] for r in _rows(tmp_path / "ds")) == sorted(n * 100 + i for n in range(3) for i in range(30))


@pytest.mark.parametrize("workers", [1, 2])
def test_tasks_write_their_parts_straight_into_the_staging_area(tfrecords: list[str], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    made: list[str] = []
    real_mkdir = os.mkdir
    monkeypatch.setattr(os, "mkdir", lambda path, *a, **k: (made.append(str(path)), real_mkdir(path, *a, **k))[1])
    result = convert(os.path.dirname(tfrecords[0]), tmp_path / "ds", workers=workers, progress=False,
                     row_group_size_mb=0.0005)
    assert result.rows == 90
    names = sorted(os.listdir(tmp_path / "ds"))
    assert names[0] == "_common_metadata" and all(n.startswith("part-") for n in names[1:])
    assert len({n[:10] for n in names[1:]}) == (1 if workers == 1 else 3)  # part-<task>-<n>: one task per file
    assert not [p for p in made if "_task-" in p or p.endswith("/out")]  # no directory per task
    assert [r["id"] for r in _rows(tmp_path / "ds")] == [n * 100 + i for n in range(3) for i in range(30)]


def test_a_task_attempt_replaces_what_an_earlier_attempt_left(tfrecords: list[str], tmp_path: Path) -> None:
    """A retried task (Spark's) first removes the parts a failed attempt wrote, then writes its own."""
    source = TFRecordFormat(tfrecords)
    schema = source.infer_schema()
    staging = tmp_path / "staging"
    staging.mkdir()
    plan = tasks.TaskPlan(TFRecordFormat, "x", {}, schema, {}, 0.0002, "raise", staging=str(staging),
                          batch_size=4)

    def fail_after_two(task_source: Any, batches: Iterator[Any]) -> Iterator[Any]:
        for n, batch in enumerate(batches):
            if n == 2:
                raise OSError("the disk went away")
            yield batch

    with pytest.raises(OSError, match="disk went away"):
        tasks.run_task(plan, 3, tfrecords, wrap=fail_after_two)
    assert os.listdir(staging) == []  # a failed attempt removes what it wrote
    for n in range(5):  # as if a killed attempt had left more parts than the retry writes
        (staging / tasks.part_name(3).format(n)).write_bytes(b"partial")
    done = tasks.run_task(plan, 3, tfrecords[:1])
    assert sorted(os.listdir(staging)) == sorted(done.parts) and done.rows == 30
    assert all((staging / name).read_bytes()[:4] == b"PAR1" for name in done.parts)


def test_an_ingest_to_s3_goes_through_the_same_pipeline(tfrecords: list[str], tmp_path: Path, s3_server: Any) -> None:
    pytest.importorskip("s3fs")
    url = f"s3://{s3_server.bucket}/pipeline/tfr"
    options = s3_server.storage_options()
    local = convert(os.path.dirname(tfrecords[0]), tmp_path / "local", progress=False)
    for workers in (1, 2):
        result = convert(os.path.dirname(tfrecords[0]), url, workers=workers, progress=False, overwrite=True,
                         storage_options=options)
        assert result.rows == local.rows == 90
        assert _rows(url, storage_options=options) == _rows(tmp_path / "local")
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_server.bucket,
                                                                 Prefix="pipeline/").get("Contents", [])]
    assert keys and all(k.startswith("pipeline/tfr/") for k in keys), keys  # no staging area left
    assert os.listdir(tmp_path) == ["local"]


def _frozen_here(_: Any) -> int:
    import gc

    return gc.get_freeze_count()


def test_forked_workers_leave_this_process_objects_out_of_their_collections() -> None:
    """A worker's garbage collection would touch, and so copy, every page of this process's objects."""
    import gc

    from unihub.formats.base import map_in_workers

    assert gc.get_freeze_count() == 0
    counts = map_in_workers(_frozen_here, [0, 1], 2)
    assert all(count > 10_000 for count in counts)  # the objects that existed when they were forked
    assert gc.get_freeze_count() == 0  # collected here again


@pytest.mark.parametrize("workers", [1, 2])
def test_the_files_an_image_folder_leaves_out_are_said_and_counted_once(tmp_path: Path, workers: int) -> None:
    """In-process, the files outside the class folders were recorded twice (by the driver and by the read of the
    driver's own source: 'skipped 3' for 2 files); in forked workers each worker warned about its own files and
    none about those outside. Now: one warning for the whole conversion, each file once, in any engine."""
    pil = pytest.importorskip("PIL.Image")
    src = tmp_path / "folder"
    for i in range(8):
        (src / f"class{i % 2}").mkdir(parents=True, exist_ok=True)
        pil.fromarray(np.full((4, 4, 3), i, np.uint8)).save(src / f"class{i % 2}" / f"{i}.png")
    (src / "README.txt").write_text("outside the class folders")
    (src / "class0" / "notes.txt").write_text("no image")
    (src / "class1" / "notes.txt").write_text("no image")
    with pytest.warns(UserWarning) as caught:
        result = convert(str(src), str(tmp_path / "ds"), workers=workers, progress=False)
    said = [str(w.message) for w in caught if "left out" in str(w.message)]
    assert len(said) == 1 and "left out 3 file(s)" in said[0] and "README.txt, class0/notes.txt" in said[0], said
    assert result.rows == 8 and sorted(os.path.relpath(s.path, src) for s in result.skipped) == [
        "README.txt", "class0/notes.txt", "class1/notes.txt"]
    assert open_dataset(tmp_path / "ds").extra_metadata["skipped_count"] == 3
