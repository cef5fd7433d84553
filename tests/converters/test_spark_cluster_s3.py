"""Foreign sources on S3 (moto's server) converted on the Spark standalone cluster (tests/spark_cluster.py).

The endpoint and credentials are given to the driver alone (``--storage-option``, the environment, the
URL's query) and must reach the executors' tasks, whose own environment has no endpoint: the output
verifies equal to the local engine's conversion of the same S3 source, the source is untouched and
nothing is left behind, on S3 or on the local disk.
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

from ..spark_cluster import cluster_session, spark_home

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.skipif(spark_home() is None, reason="a Spark standalone cluster needs pyspark and java"),
    pytest.mark.skipif(not is_available("s3fs"), reason="storage options for S3 go through fsspec (s3fs)"),
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]

import unihub  # noqa: E402

PACKAGE_PARENT = os.path.dirname(os.path.dirname(unihub.__file__))
PREFIX = "spark-s3-source"


@pytest.fixture(scope="module")
def on_s3(s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """``tfr/`` (2 TFRecord files by tf.io.TFRecordWriter), ``wds/`` (2 shards by webdataset.TarWriter) and
    ``images/`` (2 classes of PNG by PIL) under ``PREFIX/`` on the server; returns every key's bytes."""
    tf = pytest.importorskip("tensorflow")
    webdataset = pytest.importorskip("webdataset")
    from PIL import Image

    root = tmp_path_factory.mktemp("s3-sources")
    rng = np.random.default_rng(13)
    (root / "tfr").mkdir()
    for n in range(2):
        with tf.io.TFRecordWriter(str(root / "tfr" / f"part-{n}.tfrecord")) as writer:
            for i in range(15):
                features = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[n * 100 + i])),
                            "x": tf.train.Feature(float_list=tf.train.FloatList(value=rng.random(4).tolist())),
                            "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"r{n}-{i}".encode()]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    (root / "wds").mkdir()
    for n in range(2):
        with webdataset.TarWriter(str(root / "wds" / f"shard-{n:05d}.tar")) as sink:
            for i in range(6):
                buffer = io.BytesIO()
                np.save(buffer, rng.standard_normal((3, 2)).astype(np.float32))
                sink.write({"__key__": f"{n:03d}{i:04d}", "cls": str(i % 3).encode(), "npy": buffer.getvalue()})
    for name in ("ant", "bee"):
        (root / "images" / name).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)).save(root / "images" / name / f"{i}.png")
    client, objects = s3_server.client(), {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        key = f"{PREFIX}/{path.relative_to(root).as_posix()}"
        objects[key] = path.read_bytes()
        client.put_object(Bucket=s3_server.bucket, Key=key, Body=objects[key])
    return objects


@pytest.fixture(scope="module")
def session(spark_cluster: Any) -> Iterator[Any]:
    """One session on the cluster for this module's conversions in Python (its executors' environment
    has no endpoint: the s3_server fixture sets none)."""
    started = cluster_session(spark_cluster.master)
    yield started
    started.stop()


def _keys(s3_server: Any, prefix: str) -> dict[str, bytes]:
    client = s3_server.client()
    listed = client.list_objects_v2(Bucket=s3_server.bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"]: client.get_object(Bucket=s3_server.bucket, Key=o["Key"])["Body"].read() for o in listed}


def _rows(store: Any) -> list[dict[str, Any]]:
    return [row for i in range(len(store.row_groups)) for row in store.read_row_group(i).to_pylist()]


def _check(s3_server: Any, on_s3: dict[str, bytes], local: Path, url: str, out_key: str) -> None:
    """``url`` holds what the local engine wrote to ``local``; the source is untouched, no staging is left."""
    options = s3_server.storage_options()
    report = verify(local, url, storage_options=options)
    assert report.equal, report.summary()
    remote = open_dataset(url, storage_options=options)
    assert _rows(remote) == _rows(open_dataset(local))  # the same rows in the same order
    assert remote.schema.to_json() == open_dataset(local).schema.to_json()
    assert _keys(s3_server, f"{PREFIX}/") == on_s3  # the source unchanged, and nothing else beside it
    parent = out_key.rsplit("/", 1)[0] + "/"
    stored = {k for k, data in _keys(s3_server, parent).items() if not (k == parent and data == b"")}
    assert stored and all(k.startswith(out_key + "/") for k in stored), sorted(stored)  # no staging left


def test_cli_converts_an_s3_source_on_the_cluster(spark_cluster: Any, s3_server: Any, on_s3: dict[str, bytes],
                                                  tmp_path: Path) -> None:
    options = s3_server.storage_options()
    src = f"s3://{s3_server.bucket}/{PREFIX}/tfr/*.tfrecord"
    out_key = "spark-s3-out-tfrecord/ds"
    local = tmp_path / "local"
    convert(src, local, progress=False, storage_options=options)  # the local engine, same source
    work = tmp_path / "work"
    work.mkdir()
    environ = {k: v for k, v in os.environ.items()
               if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")}
    environ.update(PYTHONPATH=PACKAGE_PARENT, SPARK_LOCAL_IP="127.0.0.1")
    done = subprocess.run([sys.executable, "-m", "unihub.cli", "convert", src, f"s3://{s3_server.bucket}/{out_key}",
                           "--engine", "spark", "--master", spark_cluster.master, "--quiet",
                           "--storage-option", f"client_kwargs.endpoint_url={s3_server.endpoint_url}",
                           "--storage-option", f"key={s3_server.key}", "--storage-option", f"secret={s3_server.secret}"],
                          cwd=work, env=environ, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    _check(s3_server, on_s3, local, f"s3://{s3_server.bucket}/{out_key}", out_key)
    assert os.listdir(work) == []  # nothing written locally


@pytest.mark.parametrize("kind, endpoint", [("webdataset", "environment"), ("imagefolder", "url-query")])
def test_an_endpoint_the_driver_alone_was_given_reaches_the_executors(
        session: Any, s3_server: Any, on_s3: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        kind: str, endpoint: str) -> None:
    src = f"s3://{s3_server.bucket}/{PREFIX}/{'wds' if kind == 'webdataset' else 'images'}"
    out_key = f"spark-s3-out-{kind}/ds"
    dst = f"s3://{s3_server.bucket}/{out_key}"
    local = tmp_path / "local"
    convert(src, local, progress=False, storage_options=s3_server.storage_options())
    if endpoint == "environment":  # the driver's; the workers were started without it
        monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    else:  # pyarrow's S3 filesystem, pointed at the server by the URLs' query
        query = f"?endpoint_override={s3_server.host}:{s3_server.port}&scheme=http"
        src, dst = src + query, dst + query
    result = convert(src, dst, engine="spark", spark=session, progress=False)
    assert result.rows == (12 if kind == "webdataset" else 8)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    _check(s3_server, on_s3, local, f"s3://{s3_server.bucket}/{out_key}", out_key)
    assert open_dataset(f"s3://{s3_server.bucket}/{out_key}",
                        storage_options=s3_server.storage_options()).extra_metadata["source_format"] == kind
    assert os.listdir(tmp_path) == ["local"]
