"""``convert_with_spark``: the Spark engine's output verifies equal to the local engine's.

Marked ``spark``; skipped without pyspark or java. One ``local[2]`` session serves the module.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unihub import open_dataset
from unihub.cli.demo import make_image
from unihub.converters.convert import convert
from unihub.converters.spark import convert_with_spark
from unihub.converters.verify import verify
from unihub.dependencies import is_available
from unihub.errors import DatasetExistsError, ForeignOutputError, FormatError
from unihub.images.decoders import encode_image

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(not (is_available("pyspark") and shutil.which("java")),
                       reason="a local Spark needs pyspark and java"),
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("images") / "folder"
    for name in ("ant", "bee", "cat", "dog", "eel"):
        (root / name).mkdir(parents=True)
        for i in range(5):
            fmt = "jpeg" if name == "eel" else "png"
            (root / name / f"{i:02d}.{'jpg' if fmt == 'jpeg' else 'png'}").write_bytes(
                encode_image(make_image(rng, 12, 10), fmt, quality=90))
    return root


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(1)
    root = tmp_path_factory.mktemp("wds")
    for shard in range(6):
        with tarfile.open(root / f"shard-{shard:05d}.tar", "w") as tar:
            for i in range(7):
                key = f"{shard:03d}{i:04d}"
                _add(tar, f"{key}.png", encode_image(make_image(rng, 8, 8), "png"))
                _add(tar, f"{key}.cls", str((shard * 7 + i) % 10).encode())
                _add(tar, f"{key}.txt", f"sample {shard}-{i}".encode())
                buffer = io.BytesIO()
                np.save(buffer, rng.standard_normal((i % 3 + 1, 4)).astype(np.float32))
                _add(tar, f"{key}.npy", buffer.getvalue())
    return root


def _leftovers(directory: Path) -> list[str]:
    return [n for n in os.listdir(directory) if "unihub-tmp" in n or "unihub-old" in n]


def _check_same(local: Path, by_spark: Path) -> None:
    report = verify(local, by_spark)
    assert report.equal, report.summary()
    a, b = open_dataset(local), open_dataset(by_spark)
    assert a.schema.to_json() == b.schema.to_json()
    assert a.extra_metadata == b.extra_metadata


def test_image_folder_matches_local_engine(spark: Any, image_folder: Path, tmp_path: Path) -> None:
    local = convert(image_folder, tmp_path / "local", progress=False)
    result = convert_with_spark(image_folder, tmp_path / "spark", spark=spark)
    assert (result.from_format, result.to_format, result.rows) == ("imagefolder", "unihub", local.rows) == \
        ("imagefolder", "unihub", 25)
    _check_same(tmp_path / "local", tmp_path / "spark")
    assert open_dataset(tmp_path / "spark").extra_metadata["classes"] == ["ant", "bee", "cat", "dog", "eel"]
    parts = sorted(p for p in os.listdir(tmp_path / "spark") if p.endswith(".parquet"))
    assert len(parts) > 1 and "_common_metadata" in os.listdir(tmp_path / "spark")
    # the image bytes are the files' own bytes
    table = open_dataset(tmp_path / "spark").read_row_group(0)
    first = table.column("path")[0].as_py()
    assert table.column("image")[0].as_py() == (image_folder / first).read_bytes()
    assert verify(image_folder, tmp_path / "spark").equal
    assert _leftovers(tmp_path) == []


def test_webdataset_shards_match_local_engine(spark: Any, shards: Path, tmp_path: Path) -> None:
    pattern = str(shards / "shard-{00000..00005}.tar")
    convert(pattern, tmp_path / "local", progress=False)
    result = convert_with_spark(pattern, tmp_path / "spark", spark=spark)
    assert (result.from_format, result.rows) == ("webdataset", 42)
    _check_same(tmp_path / "local", tmp_path / "spark")
    assert _leftovers(tmp_path) == []


def test_existing_target_is_refused_unless_overwrite(spark: Any, shards: Path, tmp_path: Path) -> None:
    dst = tmp_path / "ds"
    dst.mkdir()
    (dst / "old.txt").write_text("old")
    with pytest.raises(DatasetExistsError):
        convert_with_spark(shards, dst, spark=spark)
    with pytest.raises(ForeignOutputError):  # a folder unihub did not write
        convert_with_spark(shards, dst, spark=spark, overwrite=True)
    result = convert_with_spark(shards, dst, spark=spark, overwrite_foreign=True)
    assert result.rows == 42 and not (dst / "old.txt").exists()
    assert convert_with_spark(shards, dst, spark=spark, overwrite=True).rows == 42  # now unihub's own
    assert _leftovers(tmp_path) == []


def test_failing_task_leaves_nothing_behind(spark: Any, image_folder: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(image_folder, broken)
    data = (broken / "dog" / "03.png").read_bytes()
    (broken / "dog" / "03.png").write_bytes(data[: len(data) // 2])  # truncated: no IEND
    out = tmp_path / "out"
    with pytest.raises(FormatError, match="03.png") as caught:
        convert_with_spark(broken, out, spark=spark)
    assert "truncated PNG" in str(caught.value) and "org.apache" not in str(caught.value)
    assert not out.exists()
    assert _leftovers(tmp_path) == []
    # the session still works, and skipping the bad file converts the rest
    result = convert_with_spark(broken, out, spark=spark, on_error="skip")
    assert result.rows == 24
    assert [s.path for s in result.skipped] == [str(broken / "dog" / "03.png")]


def test_without_a_session_argument_reuses_the_running_one(spark: Any, shards: Path, tmp_path: Path) -> None:
    result = convert_with_spark(shards, tmp_path / "ds")  # no spark=: the module's session is found
    assert result.rows == 42
    assert spark.sparkContext.parallelize([1, 2]).count() == 2  # and left running


def test_cli_engine_spark_verifies_equal_to_local(spark: Any, image_folder: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    from unihub.cli import main

    assert main(["convert", str(image_folder), str(tmp_path / "local")]) == 0
    assert main(["convert", str(image_folder), str(tmp_path / "spark"), "--engine", "spark"]) == 0
    assert "imagefolder -> unihub" in capsys.readouterr().err
    assert main(["verify", str(tmp_path / "local"), str(tmp_path / "spark")]) == 0
    assert main(["convert", str(tmp_path / "local"), str(tmp_path / "x"), "--to", "webdataset",
                 "--engine", "spark"]) == 1
    assert "--engine spark (engine='spark') converts a foreign format into unihub" in capsys.readouterr().err


@pytest.mark.parametrize("late", [{}, {45: {"vec": ("float", [1.0] * 5)}}], ids=["sample-fits", "sample-outgrown"])
def test_spark_engine_reads_once_with_the_sample_schema(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        late: dict[int, Any]) -> None:
    """The single pass the local engine makes: the sample's schema, refined from what the tasks saw;
    a record the sample's schema cannot hold converts again with the whole input's (as locally)."""
    from unihub.formats.tfrecord import format as tfr

    from .test_single_pass import SAMPLE, _rows, _write

    monkeypatch.setattr(tfr, "PROVISIONAL_SAMPLE", SAMPLE)
    scans: list[int | None] = []
    original = tfr.TFRecordFormat.infer_schema
    monkeypatch.setattr(tfr.TFRecordFormat, "infer_schema",
                        lambda self, *, sample_records=None: scans.append(sample_records) or original(
                            self, sample_records=sample_records))
    src = _write(tmp_path / "in", _rows(60, late), shards=3)
    result = convert_with_spark(src, tmp_path / "spark", spark=spark)
    assert scans == ([SAMPLE] if not late else [SAMPLE, None])  # no full scan unless the sample was outgrown
    full = original(tfr.TFRecordFormat(src), sample_records=None)
    assert open_dataset(tmp_path / "spark").schema == full and result.rows == 60
    assert verify(src, tmp_path / "spark").equal
    _check_same(Path(str(convert(src, tmp_path / "local", progress=False).target)), tmp_path / "spark")
    assert _leftovers(tmp_path) == []


_SPECULATING = """
import sys
from pyspark import SparkContext
from pyspark.sql import SparkSession
from unihub.cli import main
from unihub.converters.convert import convert
from unihub.errors import SparkSettingError

src = sys.argv[1]
# unihub starts the session (spark.speculation=true from PYSPARK_SUBMIT_ARGS): refused, and stopped
print("cli:", main(["convert", src, "cli", "--engine", "spark", "--master", "local[2]", "--quiet"]))
print("stopped:", SparkContext._active_spark_context is None)
own = SparkSession.builder.master("local[2]").getOrCreate()
try:  # the caller's session: refused, and left running
    convert(src, "given", engine="spark", spark=own, progress=False)
except SparkSettingError as exc:
    print("given:", type(exc).__name__)
print("alive:", own.sparkContext.parallelize([1, 2]).count())
own.stop()
"""


@pytest.mark.slow
def test_speculative_execution_is_refused_before_anything_is_written(shards: Path, tmp_path: Path) -> None:
    """Two attempts of one task at once would write and delete the same part files: refused up front,
    by the CLI with one line, whoever started the session; nothing is written."""
    import subprocess
    import sys

    import unihub

    environ = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    environ.update(PYTHONPATH=os.path.dirname(os.path.dirname(unihub.__file__)), SPARK_LOCAL_IP="127.0.0.1",
                   PYSPARK_SUBMIT_ARGS="--conf spark.speculation=true --conf spark.ui.enabled=false pyspark-shell")
    done = subprocess.run([sys.executable, "-c", _SPECULATING, str(shards)], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["cli: 1", "stopped: True", "given: SparkSettingError", "alive: 2"]
    errors = [line for line in done.stderr.splitlines() if line.startswith("unihub: error:")]
    assert len(errors) == 1 and errors[0].startswith("unihub: error: spark.speculation=true: "), done.stderr[-3000:]
    assert "run it with spark.speculation=false" in errors[0]
    assert os.listdir(tmp_path) == []  # no target, no staging area


def test_a_job_keeps_the_callers_local_properties(spark: Any) -> None:
    """run_job runs the action in a thread of its own (so that a Ctrl-C cancels it); a plain thread lost the
    caller's local properties (its scheduler pool, job description) with PySpark's pinned threads."""
    from pyspark import TaskContext

    from unihub.converters.engines.spark import run_job

    sc = spark.sparkContext
    sc.setLocalProperty("spark.scheduler.pool", "unihub-audit")
    try:
        seen = run_job(sc, "local properties", lambda: sc.parallelize([0], 1).map(
            lambda _: TaskContext.get().getLocalProperty("spark.scheduler.pool")).collect())
    finally:
        sc.setLocalProperty("spark.scheduler.pool", None)
    assert seen == ["unihub-audit"]
