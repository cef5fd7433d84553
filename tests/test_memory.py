"""Memory bounded by bytes (:mod:`unihub.runtime.memory`): the one setting, batches cut by bytes in every
source, and the peak RSS of writing camera frames (1200x1920x3 uint8, 6.9 MB) with lidar clouds
((N, 4) float32, N ~ 100k), measured in a fresh interpreter. Writing and reading frames alone is in
``test_memory_frames.py``, ingest and export of 4 MB records in ``test_memory_records.py``: each module's
data is removed when it ends, so that the suite never holds more than one of them on disk."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.memory_probe import CAMERA_SETUP, LIMIT_MB, MB, needs_proc, needs_room, peak_growth_mib, tensorflow_writes
from unihub.errors import InvalidArgumentError
from unihub.runtime.memory import BatchCut, batch_nbytes, memory_budget, rows_for, value_nbytes


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



@pytest.fixture(scope="module")
def tf_small(tmp_path_factory) -> Path:
    """20 records of 1 MB, written by TensorFlow."""
    return tensorflow_writes(tmp_path_factory.mktemp("tf") / "small.tfrecord", ROWS, VALUE)


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
    import unihub.formats.builtin  # noqa: F401
    from unihub.formats.base import FORMATS

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
    from unihub.formats.tfrecord.format import TFRecordFormat

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
@pytest.mark.slow
@needs_proc
def test_writing_frames_with_lidar_clouds_grows_by_a_few_row_groups(tmp_path: Path) -> None:
    needs_room(tmp_path, 2500)
    path = tmp_path / "log"
    grown = peak_growth_mib(CAMERA_SETUP, f"""
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
