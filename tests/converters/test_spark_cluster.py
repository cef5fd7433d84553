"""The Spark engine on a real standalone cluster (a master and a worker on 127.0.0.1, tests/spark_cluster.py).

``unihub convert --engine spark --master spark://...`` in a subprocess and ``convert(...)`` in Python,
on relative and absolute paths, for TFRecord (tf.io.TFRecordWriter), WebDataset (webdataset.TarWriter)
and an image folder (PIL): the output verifies equal to the local engine's, row for row. A retried task
replaces its own partial output; a task that always fails shows its own error. A destination on the
moto S3 server is staged and committed through pyarrow's filesystem from the executors.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unihub import open_dataset
from unihub.converters.convert import convert
from unihub.converters.verify import verify
from unihub.dependencies import is_available
from unihub.errors import FormatError

from ..spark_cluster import cluster_session as start_session
from ..spark_cluster import spark_home

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.skipif(spark_home() is None, reason="a Spark standalone cluster needs pyspark and java"),
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]

import unihub  # noqa: E402

PACKAGE_PARENT = os.path.dirname(os.path.dirname(unihub.__file__))  # the directory holding this `unihub`


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tfr/`` (3 TFRecord files), ``wds/`` (3 tar shards), ``images/`` (3 classes of PNG/JPEG), each
    written by the format's own library."""
    root = tmp_path_factory.mktemp("sources")
    rng = np.random.default_rng(7)
    tf = pytest.importorskip("tensorflow")
    (root / "tfr").mkdir()
    for n in range(3):
        with tf.io.TFRecordWriter(str(root / "tfr" / f"part-{n}.tfrecord")) as writer:
            for i in range(20):
                features = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[n * 100 + i])),
                            "x": tf.train.Feature(float_list=tf.train.FloatList(value=rng.random(3).tolist())),
                            "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"r{n}-{i}".encode()]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    webdataset = pytest.importorskip("webdataset")
    (root / "wds").mkdir()
    for n in range(3):
        with webdataset.TarWriter(str(root / "wds" / f"shard-{n:05d}.tar")) as sink:
            for i in range(8):
                buffer = io.BytesIO()
                np.save(buffer, rng.standard_normal((2, 3)).astype(np.float32))
                sink.write({"__key__": f"{n:03d}{i:04d}", "cls": str(i % 4).encode(), "txt": f"s {n}-{i}".encode(),
                            "npy": buffer.getvalue()})
    from PIL import Image

    for c, name in enumerate(("cat", "dog", "eel")):
        (root / "images" / name).mkdir(parents=True)
        for i in range(5):
            pixels = rng.integers(0, 256, (9 + c, 7, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "images" / name / f"{i:02d}.png")
    return root


def _cli(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``unihub ...`` in a fresh interpreter (its own Spark driver), without PYSPARK_PYTHON set."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    environ.update(PYTHONPATH=PACKAGE_PARENT, SPARK_LOCAL_IP="127.0.0.1", **env)
    return subprocess.run([sys.executable, "-m", "unihub.cli", *args], cwd=cwd, env=environ, capture_output=True,
                          text=True, timeout=300)


def _leftovers(directory: Path) -> list[str]:
    return [n for n in os.listdir(directory) if "unihub-tmp" in n or "unihub-old" in n]


def _rows(store: Any) -> list[dict[str, Any]]:
    """Every stored row of a dataset, in storage order."""
    return [row for i in range(len(store.row_groups)) for row in store.read_row_group(i).to_pylist()]


def _check_same(local: Path, by_spark: Path) -> None:
    report = verify(local, by_spark)
    assert report.equal, report.summary()
    a, b = open_dataset(local), open_dataset(by_spark)
    assert _rows(a) == _rows(b)  # the same rows in the same order
    assert a.schema.to_json() == b.schema.to_json()


@pytest.mark.parametrize("kind, pattern, relative", [("tfrecord", "tfr/*.tfrecord", True),
                                                     ("webdataset", "wds", False),
                                                     ("imagefolder", "images", True)])
def test_cli_converts_on_the_cluster_as_the_local_engine_does(spark_cluster: Any, sources: Path, tmp_path: Path,
                                                              kind: str, pattern: str, relative: bool) -> None:
    work = tmp_path / "work"
    work.mkdir()
    local = tmp_path / "local"
    convert(str(sources / pattern), local, progress=False)
    if relative:  # the CLI runs in a directory of its own; the executors in theirs
        src, dst = os.path.relpath(sources / pattern, work), "out/ds"
    else:
        src, dst = str(sources / pattern), str(tmp_path / "abs")
    done = _cli(["convert", src, dst, "--engine", "spark", "--master", spark_cluster.master, "--quiet"], work)
    assert done.returncode == 0, done.stderr[-3000:]
    out = work / dst if relative else Path(dst)
    _check_same(local, out)
    assert open_dataset(out).extra_metadata["source_format"] == kind
    assert _leftovers(out.parent) == []


def test_convert_in_python_starts_a_session_on_the_master(spark_cluster: Any, sources: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql import SparkSession

    assert SparkSession.getActiveSession() is None
    local = tmp_path / "local"
    convert(sources / "images", local, progress=False)
    monkeypatch.chdir(sources)
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    result = convert("images", tmp_path / "spark", engine="spark", master=spark_cluster.master, progress=False)
    assert result.rows == 15 and result.to_format == "unihub"
    _check_same(local, tmp_path / "spark")
    assert SparkSession.getActiveSession() is None  # the session it started is stopped


@pytest.fixture()
def cluster_session(spark_cluster: Any) -> Iterator[Any]:
    """A session on the cluster that tries each task twice at most (spark.task.maxFailures=2)."""
    session = start_session(spark_cluster.master, **{"spark.task.maxFailures": "2"})
    yield session
    session.stop()


def _flaky_format(marker_dir: Path) -> Any:
    """A TFRecord reader whose first attempt at each file writes a row group, then fails."""
    from unihub.formats.tfrecord.format import TFRecordFormat

    class FlakyTFRecord(TFRecordFormat):
        def read_batches(self, schema: Any, **kwargs: Any) -> Iterator[Any]:
            for n, batch in enumerate(super().read_batches(schema, **kwargs)):
                yield batch
                marker = marker_dir / (os.path.basename(self.sources[0]) + ".failed")
                if n == 0 and not marker.exists():
                    marker.touch()
                    raise OSError("the executor lost its disk (once)")

    return FlakyTFRecord


def test_a_retried_task_replaces_its_partial_output(cluster_session: Any, sources: Path, tmp_path: Path) -> None:
    from pyspark import cloudpickle

    from unihub.formats.base import FORMATS

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test's format travels with the plan
    FORMATS.add("flaky-tfrecord", _flaky_format(tmp_path))
    try:
        local = tmp_path / "local"
        convert(str(sources / "tfr/*.tfrecord"), local, progress=False, batch_size=4, row_group_size_mb=0.0001)
        result = convert(str(sources / "tfr/*.tfrecord"), tmp_path / "spark", from_format="flaky-tfrecord",
                         engine="spark", spark=cluster_session, progress=False, batch_size=4,
                         row_group_size_mb=0.0001)
    finally:
        FORMATS._entries.pop("flaky-tfrecord", None)
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert sorted(p.name for p in tmp_path.glob("*.failed")) == [f"part-{n}.tfrecord.failed" for n in range(3)]
    assert result.rows == 60  # no row twice
    _check_same(local, tmp_path / "spark")
    assert _leftovers(tmp_path) == []


@pytest.fixture(scope="module")
def corrupt(sources: Path) -> Path:
    """Two TFRecord files (tf.io.TFRecordWriter): 1,200 good records (more than the driver's schema
    sample, so the bad one is met by a task), then 20 with a payload byte of record 3 flipped (its data
    CRC no longer matches)."""
    import tensorflow as tf

    root = sources.parent / "corrupt"
    root.mkdir(exist_ok=True)
    for n, count in enumerate((1200, 20)):
        path = root / f"part-{n}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as writer:
            for i in range(count):
                feature = tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))
                writer.write(tf.train.Example(features=tf.train.Features(feature={"id": feature}))
                             .SerializeToString())
    data = bytearray((root / "part-1.tfrecord").read_bytes())
    offset = 0
    for _ in range(3):  # skip 3 records: length (8) + length CRC (4) + data + data CRC (4)
        offset += 16 + int.from_bytes(data[offset:offset + 8], "little")
    data[offset + 12 + 5] ^= 0xFF
    (root / "part-1.tfrecord").write_bytes(bytes(data))
    return root


def test_a_failing_task_shows_its_own_error(spark_cluster: Any, corrupt: Path, tmp_path: Path) -> None:
    with pytest.raises(FormatError) as local_error:
        convert(str(corrupt / "*.tfrecord"), tmp_path / "local", progress=False)
    done = _cli(["convert", str(corrupt / "*.tfrecord"), "out", "--engine", "spark", "--master",
                 spark_cluster.master, "--quiet"], tmp_path,
                PYSPARK_SUBMIT_ARGS="--conf spark.task.maxFailures=2 pyspark-shell")
    assert done.returncode == 1, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("unihub: error:")]
    assert errors == [f"unihub: error: {local_error.value}"], done.stderr[-3000:]
    assert "part-1.tfrecord" in errors[0] and "record 3" in errors[0]
    assert "FileExistsError" not in done.stderr
    # Spark's own output (175 lines of its log and the task's stack traces) went to a log file, named
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("unihub: Spark's log: "), done.stderr[-3000:]
    log = lines[0].rsplit(": ", 1)[1]
    assert "PythonException" in Path(log).read_text(errors="replace")
    os.unlink(log)
    assert sorted(os.listdir(tmp_path)) == []  # nothing left behind: no `out`, no staging area


def test_a_failing_task_raises_its_error_class_in_python(cluster_session: Any, corrupt: Path,
                                                         tmp_path: Path) -> None:
    with pytest.raises(FormatError) as local_error:
        convert(str(corrupt / "*.tfrecord"), tmp_path / "local", progress=False)
    with pytest.raises(type(local_error.value)) as caught:
        convert(str(corrupt / "*.tfrecord"), tmp_path / "spark", engine="spark", spark=cluster_session,
                progress=False)
    assert type(caught.value) is type(local_error.value)
    assert str(caught.value) == str(local_error.value)
    assert vars(caught.value) == vars(local_error.value)  # path, offset: the attributes came too
    assert caught.value.path == str(corrupt / "part-1.tfrecord") and caught.value.offset is not None
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(not is_available("s3fs"), reason="an S3 destination through fsspec needs s3fs")
def test_a_destination_on_s3_is_staged_and_committed_from_the_executors(cluster_session: Any, s3_server: Any,
                                                                        sources: Path, tmp_path: Path) -> None:
    local = tmp_path / "local"
    convert(str(sources / "wds"), local, progress=False)
    url = f"s3://{s3_server.bucket}/cluster/wds"
    options = s3_server.storage_options()
    result = convert(str(sources / "wds"), url, engine="spark", spark=cluster_session, progress=False,
                     storage_options=options)
    assert result.rows == 24
    remote = open_dataset(url, storage_options=options)
    assert _rows(remote) == _rows(open_dataset(local))
    assert remote.schema.to_json() == open_dataset(local).schema.to_json()
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_server.bucket,
                                                                 Prefix="cluster/").get("Contents", [])]
    assert keys and all(k.startswith("cluster/wds/") for k in keys), keys  # no staging area left
    assert os.listdir(tmp_path) == ["local"]  # nothing written locally
