"""Memory bounded by bytes (:mod:`unihub.memory`): the one setting, batches cut by bytes in every
source, and the peak RSS of writing, ingest, export and reading rows of camera frames (1200x1920x3
uint8, 6.9 MB) and lidar clouds ((N, 4) float32, N ~ 100k), measured in fresh interpreters."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.memory_probe import needs_proc, peak_growth_mib
from unihub.dependencies import is_available
from unihub.errors import InvalidArgumentError
from unihub.memory import BatchCut, batch_nbytes, memory_budget, rows_for, value_nbytes

MB = 2**20
ROW_GROUP_MB = 32
#: what a process grows by whatever it reads or writes: Arrow's and the allocators' pools, threads
OVERHEAD_MB = 64


# -- the setting ------------------------------------------------------------------------------
def test_budget_comes_from_the_argument_then_the_environment_then_the_default(monkeypatch) -> None:
    monkeypatch.delenv("UNIHUB_MEMORY_MB", raising=False)
    default = memory_budget()
    assert default.total_bytes == 512 * MB
    assert (default.batch_bytes, default.read_ahead_bytes, default.queue_bytes) == (16 * MB, 32 * MB, 128 * MB)
    monkeypatch.setenv("UNIHUB_MEMORY_MB", "64")
    assert memory_budget().batch_bytes == 2 * MB
    assert memory_budget(1024).batch_bytes == 32 * MB  # the argument wins


@pytest.mark.parametrize("value", [0, -5, float("nan"), float("inf"), "12", True])
def test_a_budget_that_is_not_a_positive_number_is_refused(value: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="memory_budget_mb must be a positive number"):
        memory_budget(value)


def test_a_bad_environment_value_is_named(monkeypatch) -> None:
    monkeypatch.setenv("UNIHUB_MEMORY_MB", "lots")
    with pytest.raises(InvalidArgumentError, match="UNIHUB_MEMORY_MB must be a number of megabytes, got 'lots'"):
        memory_budget()
    monkeypatch.setenv("UNIHUB_MEMORY_MB", "-1")
    with pytest.raises(InvalidArgumentError, match="UNIHUB_MEMORY_MB must be a positive number"):
        memory_budget()


def test_a_batch_ends_at_its_rows_or_its_bytes_whichever_first() -> None:
    cut = BatchCut(4, 100)
    assert [cut.add(10) for _ in range(4)] == [False, False, False, True]
    cut.reset()
    assert [cut.add(60), cut.add(60)] == [False, True]
    cut.reset()
    assert cut.add(10_000)  # one row over the budget is still a batch of one row, never split
    assert rows_for(256, 16 * MB, 7 * MB) == 2 and rows_for(256, 16 * MB, 100) == 256
    assert rows_for(256, 16 * MB, 40 * MB) == 1


def test_sizes_count_arrays_bytes_and_sample_long_lists() -> None:
    frame = np.zeros((1200, 1920, 3), np.uint8)
    assert value_nbytes(frame) == frame.nbytes
    assert value_nbytes([b"x" * 100] * 10) == 1000
    many = [b"x" * 100] * 10_000  # sampled, and exact for equal items
    assert value_nbytes(many) == 1_000_000
    cells = np.empty(1000, object)
    cells[:] = [np.zeros(250, np.float32) for _ in range(1000)]
    assert value_nbytes(cells) == 1_000_000
    assert batch_nbytes({"id": np.arange(10), "frame": np.stack([frame] * 2)}) == 80 + 2 * frame.nbytes


# -- every source cuts its batches by bytes -----------------------------------------------------
ROWS, VALUE = 20, MB  # 20 records of about 1 MB each; batches of 3 MB


def _payload(i: int) -> bytes:
    return np.random.default_rng(i).integers(0, 255, VALUE, dtype=np.uint8).tobytes()


def _tensorflow_writes(path: Path, count: int, size: int) -> Path:
    """``count`` tf.train.Examples (``id``, ``data``: ``size`` random bytes) written by TensorFlow."""
    if not is_available("tensorflow"):
        pytest.skip("tensorflow is not installed")
    script = textwrap.dedent(f"""
        import os
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
        import numpy as np
        import tensorflow as tf

        with tf.io.TFRecordWriter({str(path)!r}) as w:
            for i in range({count}):
                data = np.random.default_rng(i).integers(0, 255, {size}, dtype=np.uint8).tobytes()
                w.write(tf.train.Example(features=tf.train.Features(feature={{
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                    "data": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data]))}})).SerializeToString())
    """)
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, timeout=300)
    return path


@pytest.fixture(scope="module")
def tf_small(tmp_path_factory) -> Path:
    """20 records of 1 MB, written by TensorFlow."""
    return _tensorflow_writes(tmp_path_factory.mktemp("tf") / "small.tfrecord", ROWS, VALUE)


@pytest.fixture(scope="module")
def tf_big(tmp_path_factory) -> Path:
    """75 records of 4 MB (300 MB), written by TensorFlow."""
    return _tensorflow_writes(tmp_path_factory.mktemp("tf") / "big.tfrecord", 75, 4 * MB)


def _webdataset_shard(root: Path) -> Path:
    import webdataset

    path = root / "shard-000.tar"
    with webdataset.TarWriter(str(path)) as sink:
        for i in range(ROWS):
            sink.write({"__key__": f"{i:04d}", "bin": _payload(i), "cls": i})
    return path


def _hdf5_file(root: Path) -> Path:
    import h5py

    path = root / "data.h5"
    with h5py.File(path, "w") as f:
        f["id"] = np.arange(ROWS)
        f["data"] = np.stack([np.frombuffer(_payload(i), np.uint8) for i in range(ROWS)])
    return path


def _image_folder(root: Path) -> Path:
    from PIL import Image

    for i in range(ROWS):
        (root / "folder" / "noise").mkdir(parents=True, exist_ok=True)
        pixels = np.frombuffer(_payload(i)[: 600 * 580 * 3], np.uint8).reshape(600, 580, 3)
        Image.fromarray(pixels).save(root / "folder" / "noise" / f"{i:03d}.png")  # ~1 MB of noise
    return root / "folder"


@pytest.mark.parametrize("fmt", ["tfrecord", "webdataset", "hdf5", "imagefolder"])
def test_every_source_cuts_batches_at_its_byte_budget(fmt: str, tf_small: Path, tmp_path: Path) -> None:
    import unihub.formats.formats_all  # noqa: F401
    from unihub.formats.foreign import FORMATS

    path = {"tfrecord": lambda: tf_small, "webdataset": lambda: _webdataset_shard(tmp_path),
            "hdf5": lambda: _hdf5_file(tmp_path), "imagefolder": lambda: _image_folder(tmp_path)}[fmt]()
    source = FORMATS.get(fmt)(str(path))
    schema = source.infer_schema()
    source.batch_bytes = 3 * MB
    batches = list(source.read_batches(schema, batch_size=256))
    sizes = [len(next(iter(b.values()))) for b in batches]
    assert sum(sizes) == ROWS
    assert max(sizes) <= 4 and len(batches) >= 5, sizes  # not one batch of 20 rows (20 MB)
    for batch in batches:
        assert batch_nbytes(batch) <= 3 * MB + 1.2 * MB  # the budget, and at most one row past it
    source.batch_bytes = 64 * MB  # rows still end a batch when bytes do not
    assert [len(next(iter(b.values()))) for b in source.read_batches(schema, batch_size=7)][:2] in ([7, 7], [1, 7])


def test_tfrecord_batches_hold_the_same_records_whatever_the_budget(tf_small: Path) -> None:
    from unihub.formats.tfrecord import TFRecordFormat

    source = TFRecordFormat(str(tf_small))
    schema = source.infer_schema()
    source.batch_bytes = 64 * MB
    whole = [b for b in source.read_batches(schema)]
    source.batch_bytes = 2 * MB + 1
    cut = [b for b in source.read_batches(schema)]
    assert len(whole) == 1 and [len(b["id"]) for b in cut] == [2] * 10  # records are a little over 1 MB
    assert np.array_equal(np.concatenate([b["id"] for b in cut]), whole[0]["id"])
    assert b"".join(bytes(v) for b in cut for v in b["data"].to_pylist()) == b"".join(
        bytes(v) for v in whole[0]["data"].to_pylist())


# -- peak RSS: a small multiple of the row group, whatever the rows ----------------------------
LIMIT_MB = 6 * ROW_GROUP_MB + OVERHEAD_MB  # 256 MB
WRITE_SETUP = """
import numpy as np
from unihub import TensorCodec, Unischema, UnischemaField, write_dataset
rng = np.random.default_rng(0)
frame = rng.integers(0, 255, (1200, 1920, 3), dtype=np.uint8)
cloud = rng.random((102_000, 4), dtype=np.float32)
FIELDS = [UnischemaField("id", np.int64, ()), UnischemaField("frame", np.uint8, (1200, 1920, 3), TensorCodec(), False)]
LIDAR = UnischemaField("lidar", np.float32, (None, 4), TensorCodec(), False)
"""


@pytest.fixture(scope="module")
def frames(tmp_path_factory) -> tuple[Path, float]:
    """240 camera frames (1.6 GB) written by write_dataset, and how much the writing process grew."""
    path = tmp_path_factory.mktemp("frames") / "frames"
    grown = peak_growth_mib(WRITE_SETUP, f"""
        write_dataset({str(path)!r}, Unischema("Frames", FIELDS),
                      ({{"id": i, "frame": frame.copy()}} for i in range(240)), compression=None)
    """)
    return path, grown


@pytest.mark.slow
@needs_proc
def test_writing_240_camera_frames_grows_by_a_few_row_groups(frames: tuple[Path, float]) -> None:
    path, grown = frames
    from unihub import open_dataset

    assert open_dataset(path).num_rows == 240
    print(f"writing 240 frames (1.6 GB) grew the process by {grown:.0f} MB")
    assert grown < LIMIT_MB, f"writing 240 frames (1.6 GB) grew the process by {grown:.0f} MB"


@pytest.mark.slow
@needs_proc
def test_writing_frames_with_lidar_clouds_grows_by_a_few_row_groups(tmp_path: Path) -> None:
    path = tmp_path / "log"
    grown = peak_growth_mib(WRITE_SETUP, f"""
        write_dataset({str(path)!r}, Unischema("Log", FIELDS + [LIDAR]),
                      ({{"id": i, "frame": frame.copy(), "lidar": cloud[: 90_000 + 37 * i].copy()}}
                       for i in range(300)), compression=None)
    """)
    from unihub import make_batch_reader

    with make_batch_reader(str(path), schema_fields=["id", "lidar"], shuffle_row_groups=False) as reader:
        batches = list(reader)
    ids = np.concatenate([b.id for b in batches])
    clouds = [c for b in batches for c in b.lidar]
    assert ids.tolist() == list(range(300)) and [len(c) for c in clouds] == [90_000 + 37 * i for i in range(300)]
    rng = np.random.default_rng(0)
    rng.integers(0, 255, (1200, 1920, 3), dtype=np.uint8)
    cloud = rng.random((102_000, 4), dtype=np.float32)  # as the writing process drew it
    assert np.array_equal(clouds[299], cloud[: 90_000 + 37 * 299])
    print(f"writing 300 frames + lidar clouds (2.4 GB) grew the process by {grown:.0f} MB")
    assert grown < LIMIT_MB, f"writing 300 frames + lidar clouds (2.4 GB) grew the process by {grown:.0f} MB"


@pytest.fixture(scope="module")
def ingested(tf_big: Path, tmp_path_factory) -> tuple[Path, float]:
    """The 300 MB TFRecord of 4 MB records converted, and how much the converting process grew."""
    path = tmp_path_factory.mktemp("ingest") / "big"
    grown = peak_growth_mib("from unihub import convert", f"""
        result = convert({str(tf_big)!r}, {str(path)!r}, row_group_size_mb={ROW_GROUP_MB})
        assert result.rows == 75, result
    """)
    return path, grown


@pytest.mark.slow
@needs_proc
def test_tfrecord_ingest_of_4mb_records_grows_by_a_few_row_groups(ingested: tuple[Path, float]) -> None:
    path, grown = ingested
    from unihub import open_dataset

    store = open_dataset(path)
    table = store.read_row_group(0)
    assert store.num_rows == 75 and table.column("id").to_pylist()[0] == 0
    assert table.column("data")[0].as_py() == np.random.default_rng(0).integers(
        0, 255, 4 * MB, dtype=np.uint8).tobytes()
    print(f"ingesting 300 MB of 4 MB records grew the process by {grown:.0f} MB (was ~800)")
    assert grown < LIMIT_MB, f"ingesting 300 MB of 4 MB records grew the process by {grown:.0f} MB (was ~800)"


@pytest.mark.slow
@needs_proc
@pytest.mark.parametrize("fmt", ["tfrecord", "webdataset"])
def test_export_of_4mb_records_grows_by_a_few_row_groups(fmt: str, ingested: tuple[Path, float],
                                                         tmp_path: Path) -> None:
    source, _ = ingested
    target = tmp_path / ("out.tfrecord" if fmt == "tfrecord" else "shards")
    grown = peak_growth_mib("from unihub import convert", f"""
        result = convert({str(source)!r}, {str(target)!r}, to_format={fmt!r})
        assert result.rows == 75, result
    """)
    if fmt == "webdataset":
        with tarfile.open(next(target.glob("*.tar"))) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith(".data"))
            first = tar.extractfile(member).read()  # type: ignore[union-attr]
        assert first == np.random.default_rng(0).integers(0, 255, 4 * MB, dtype=np.uint8).tobytes()
    else:
        assert target.stat().st_size > 300 * MB
    print(f"exporting 300 MB of 4 MB records to {fmt} grew the process by {grown:.0f} MB")
    assert grown < LIMIT_MB, f"exporting 300 MB of 4 MB records to {fmt} grew the process by {grown:.0f} MB"


@pytest.mark.slow
@needs_proc
@pytest.mark.parametrize("batched", [False, True], ids=["make_reader", "make_batch_reader"])
@pytest.mark.parametrize("pool", ["thread", "process"])
def test_reading_camera_frames_grows_by_a_few_row_groups(frames: tuple[Path, float], batched: bool,
                                                         pool: str) -> None:
    """A consumer slower than the workers (as in training) lets the results queue fill: it holds
    32 MB of decoded frames (UNIHUB_MEMORY_MB=128), never fewer than one row group per worker, where
    it held 2 x workers + 2 row groups whatever their size (~370 MB with threads, ~280 MB with processes)."""
    path, _ = frames
    make = "make_batch_reader" if batched else "make_reader"
    slow = (20, 0.05) if batched else (64, 0.02)  # the first items come slower than the workers read them
    grown = peak_growth_mib(f"import time; from unihub import {make}", f"""
        total = 0
        with {make}({str(path)!r}, reader_pool_type={pool!r}, workers_count=2) as reader:
            for i, item in enumerate(reader):
                total += len(item.id) if {batched} else 1
                if i < {slow[0]}:
                    time.sleep({slow[1]})
        assert total == 240, total
    """, env={"UNIHUB_MEMORY_MB": "128"})
    print(f"{make} ({pool} pool) over 240 frames grew the process by {grown:.0f} MB")
    assert grown < LIMIT_MB, f"{make} ({pool} pool) over 240 frames grew the process by {grown:.0f} MB"


def test_the_probe_sees_memory_held_by_the_work() -> None:
    held = peak_growth_mib("import numpy as np", "kept = np.ones(200 * 2**20 // 8)")
    assert 190 < held < 260, held



@pytest.mark.slow
@needs_proc
def test_scale_benchmark_quick_runs_the_local_contenders(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "scale.py"
    out = subprocess.run([sys.executable, str(script), "--quick", "--only", "local1,local2"], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "local, workers=" in line]
    assert len(rows) == 6 and not any("failed" in line for line in rows), out.stdout
    sizes = [line for line in out.stdout.splitlines() if line.startswith(("| 1 KB", "| 100 KB", "| 6 MB"))]
    assert len(sizes) == 9, out.stdout  # 6 conversion rows, then 3 rows of peak RSS against row size
    assert list(tmp_path.iterdir()) == []  # the benchmark leaves nothing behind
