"""A Spark cluster that cannot run a conversion's tasks: the conversion gives up, named, in bounded time.

Each test starts its own standalone cluster (tests/spark_cluster.py), since they take its workers away:
one whose only worker is SIGKILLed (with its executor and Python workers) while ``unihub convert
--engine spark`` runs, and one that never had a worker. Without the stall watcher both conversions
waited for executors forever, printing nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from unihub.converters.convert import convert
from unihub.errors import SparkStalledError

from ..spark_cluster import cluster_session, spark_home, start_spark_cluster

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.skipif(spark_home() is None, reason="a Spark standalone cluster needs pyspark and java"),
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]

import unihub  # noqa: E402

PACKAGE_PARENT = os.path.dirname(os.path.dirname(unihub.__file__))


@pytest.fixture(scope="module")
def many_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 TFRecord files of 3,000 records (tf.io.TFRecordWriter): enough tasks that a worker killed once its
    executor is up dies with the job unfinished."""
    tf = pytest.importorskip("tensorflow")
    root = tmp_path_factory.mktemp("many")
    for n in range(40):
        with tf.io.TFRecordWriter(str(root / f"part-{n:02d}.tfrecord")) as writer:
            for i in range(3000):
                feature = tf.train.Feature(int64_list=tf.train.Int64List(value=[n * 10_000 + i]))
                writer.write(tf.train.Example(features=tf.train.Features(feature={"id": feature}))
                             .SerializeToString())
    return root


def _executors_granted(webui: str) -> int:
    with urllib.request.urlopen(f"{webui}/json/", timeout=5) as answer:
        status = json.load(answer)
    return sum(int(app.get("cores", 0)) for app in status.get("activeapps", []))


def test_a_cluster_that_loses_its_workers_mid_convert_is_a_named_error(many_files: Path, tmp_path: Path) -> None:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": PACKAGE_PARENT}
    with start_spark_cluster(workers=1) as cluster:
        process = subprocess.Popen(
            [sys.executable, "-m", "unihub.cli", "convert", str(many_files / "*.tfrecord"), "out", "--engine",
             "spark", "--master", cluster.master, "--spark-stall-timeout", "15", "--quiet"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 300
            while _executors_granted(cluster.webui) == 0:  # the job's executor is up: tasks are running
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "no executor started"
                time.sleep(0.2)
            cluster.kill_workers()
            killed = time.monotonic()
            _, stderr = process.communicate(timeout=300)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    waited = time.monotonic() - killed
    assert process.returncode == 1, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("unihub: error:")]
    assert len(errors) == 1, stderr[-3000:]
    assert "no Spark task ran for 15 s on spark://127.0.0.1" in errors[0], errors[0]
    assert "--spark-stall-timeout" in errors[0] and "UNIHUB_SPARK_STALL_TIMEOUT" in errors[0]
    assert waited >= 15, waited  # not before the timeout ...
    assert waited < 15 + 120, waited  # ... and not much after it (generous: a loaded machine)
    assert "Traceback" not in stderr and len(stderr.splitlines()) <= 3, stderr[-3000:]
    _remove_named_log(stderr)
    assert os.listdir(tmp_path) == []  # no `out`, no staging area


def test_a_cluster_without_workers_is_a_named_error_in_python(many_files: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              spark_cluster: object) -> None:
    """In this process: ``spark_cluster`` (unused) orders the test with the cluster tests, last, once the
    suite's local session is stopped (a process holds one SparkContext)."""
    monkeypatch.setenv("UNIHUB_SPARK_STALL_TIMEOUT", "5")
    with start_spark_cluster(workers=0) as cluster:
        session = cluster_session(cluster.master)
        raised: list[BaseException] = []

        def run() -> None:
            try:
                convert(str(many_files / "part-0[01].tfrecord"), tmp_path / "out", engine="spark", spark=session,
                        progress=False)
            except BaseException as exc:
                raised.append(exc)

        try:
            converting = threading.Thread(target=run, daemon=True)
            converting.start()
            converting.join(timeout=5 + 120)  # generous: a loaded machine
            assert not converting.is_alive(), "the conversion still waits for executors"
            # the session is left usable: the stalled job was cancelled, not the context
            assert session.sparkContext.statusTracker().getActiveJobsIds() == []
        finally:
            session.stop()  # also ends a conversion still waiting
    assert len(raised) == 1 and isinstance(raised[0], SparkStalledError), raised
    assert re.search(r"no Spark task ran for 5 s on spark://\S+ \(0 executors registered\)", str(raised[0]))
    assert os.listdir(tmp_path) == []


def test_the_stall_timeout_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from unihub.converters.engines.spark import STALL_TIMEOUT_S, stall_timeout
    from unihub.errors import InvalidArgumentError

    monkeypatch.delenv("UNIHUB_SPARK_STALL_TIMEOUT", raising=False)
    assert stall_timeout() == STALL_TIMEOUT_S == 120
    for text, expected in (("30", 30.0), ("0.5", 0.5), ("0", None), ("none", None), (" None ", None)):
        monkeypatch.setenv("UNIHUB_SPARK_STALL_TIMEOUT", text)
        assert stall_timeout() == expected
    for bad in ("-1", "nan", "soon"):
        monkeypatch.setenv("UNIHUB_SPARK_STALL_TIMEOUT", bad)
        with pytest.raises(InvalidArgumentError, match="UNIHUB_SPARK_STALL_TIMEOUT"):
            stall_timeout()


def _remove_named_log(stderr: str) -> None:
    """The CLI keeps Spark's log of a failed run and names it; the test removes it."""
    logs = [line.rsplit(": ", 1)[1] for line in stderr.splitlines() if line.startswith("unihub: Spark's log: ")]
    assert len(logs) == 1 and os.path.exists(logs[0]), stderr[-3000:]
    assert "Lost executor" in Path(logs[0]).read_text(errors="replace") or os.path.getsize(logs[0]) > 0
    os.unlink(logs[0])


def test_the_stall_timeout_option_is_checked_as_the_variable_is(capsys: pytest.CaptureFixture[str]) -> None:
    from unihub.cli import main

    with pytest.raises(SystemExit) as done:
        main(["convert", "a", "b", "--engine", "spark", "--spark-stall-timeout", "-3"])
    assert done.value.code == 2
    assert "--spark-stall-timeout='-3' is not a number of seconds" in capsys.readouterr().err
