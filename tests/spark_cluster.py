"""A real Spark standalone cluster on 127.0.0.1: one master and ``workers`` workers from pyspark's install.

``start_spark_cluster`` is a plain context manager (pytest's session fixture in tests/conftest.py
uses it, and so can benchmarks/scale.py): it starts ``spark-class ...deploy.master.Master`` and
``...deploy.worker.Worker`` JVMs on free ports, waits until every worker has registered with the
master (its JSON status page), yields the master URL and stops them all at the end, so no JVM
outlives it.

    with start_spark_cluster(workers=2) as cluster:
        convert("data/*.tfrecord", "out", engine="spark", master=cluster.master)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SparkCluster:
    """A running standalone cluster: ``master`` is its ``spark://127.0.0.1:PORT`` URL."""

    master: str
    webui: str
    workers: int
    work_dir: str
    #: SIGKILLs every worker JVM with its executors and their Python workers (a cluster losing its workers)
    kill_workers: Callable[[], None]


def spark_home() -> str | None:
    """pyspark's package directory (it ships ``bin/spark-class`` and the jars), or None without pyspark/java."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None or shutil.which("java") is None:
        return None
    home = os.path.dirname(spec.origin)
    return home if os.path.exists(os.path.join(home, "bin", "spark-class")) else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def start_spark_cluster(workers: int = 1, *, cores: int = 1, memory: str = "1g",
                        timeout: float = 90.0) -> Iterator[SparkCluster]:
    """Start a master and ``workers`` workers on 127.0.0.1; stop every JVM on exit."""
    home = spark_home()
    if home is None:
        raise RuntimeError("a Spark standalone cluster needs pyspark (with bin/spark-class) and java")
    work_dir = tempfile.mkdtemp(prefix="unihub-spark-cluster-")
    env = {**os.environ, "SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": work_dir,
           "SPARK_WORKER_DIR": os.path.join(work_dir, "work"), "SPARK_NO_DAEMONIZE": "1"}
    spark_class = os.path.join(home, "bin", "spark-class")
    port, webui = free_port(), free_port()
    master = f"spark://127.0.0.1:{port}"
    processes: list[subprocess.Popen[bytes]] = []

    def launch(name: str, *args: str) -> None:
        log = open(os.path.join(work_dir, f"{name}.log"), "wb")  # noqa: SIM115 (closed with the process)
        processes.append(subprocess.Popen([spark_class, *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        log.close()

    try:
        launch("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
               "--webui-port", str(webui))
        for i in range(workers):
            launch(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", master, "--cores", str(cores),
                   "--memory", memory, "--host", "127.0.0.1", "--webui-port", str(free_port()),
                   "--work-dir", os.path.join(work_dir, f"work-{i}"))
        _wait_for_workers(f"http://127.0.0.1:{webui}/json/", workers, timeout, processes, work_dir)

        def kill_workers() -> None:
            for process in processes[1:]:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()

        yield SparkCluster(master, f"http://127.0.0.1:{webui}", workers, work_dir, kill_workers)
    finally:
        _stop(processes)
        shutil.rmtree(work_dir, ignore_errors=True)


def _wait_for_workers(url: str, count: int, timeout: float, processes: list[subprocess.Popen[bytes]],
                      work_dir: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in processes):
            break
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                status = json.load(answer)
            if sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE") >= count:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    logs = ""
    for name in sorted(os.listdir(work_dir)):
        if name.endswith(".log"):
            with open(os.path.join(work_dir, name), errors="replace") as handle:
                logs += f"--- {name}\n{handle.read()[-2000:]}\n"
    raise RuntimeError(f"the Spark cluster did not start within {timeout:.0f} s\n{logs}")


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each JVM's process group (spark-class execs java in it), then SIGKILL what is left."""
    for process in reversed(processes):
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    for process in reversed(processes):
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()


def cluster_session(master: str, **conf: str) -> Any:
    """A SparkSession on ``master`` whose executors run this interpreter with unihub importable (as the
    Spark engine starts its own), with the extra settings ``conf``; the caller stops it."""
    from pyspark.sql import SparkSession

    from unihub.converters.engines.spark import executor_settings, python_for_executors

    builder = SparkSession.builder.master(master).appName("unihub-test")
    for key, value in {**executor_settings(), **conf}.items():
        builder = builder.config(key, value)
    with python_for_executors():
        session = builder.getOrCreate()
    if session.sparkContext.master != master:
        session.stop()
        raise RuntimeError(f"a session on {session.sparkContext.master} was running; stop it first")
    return session
