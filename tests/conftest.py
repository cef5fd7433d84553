"""Shared fixtures: a representative Unischema, deterministic rows, datasets written into tmp_path.

Every fixture generates its data into ``tmp_path``; nothing is read from the network or
from outside the test's own directory (the Petastorm fixtures live in ``tests/fixtures``).

S3: ``s3_server`` is moto's S3 server on 127.0.0.1, started once per session, with a request log.
Tests that use it are skipped when moto or boto3 is not installed. The server runs in a thread of
the test process; every HTTP request it answers is recorded, so a test can assert how many object
reads (GETs of a key) a reader made.
"""

from __future__ import annotations

import decimal
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from unihub import (
    CompressedNdarrayCodec,
    NdarrayCodec,
    ScalarCodec,
    TensorCodec,
    Unischema,
    UnischemaField,
    write_dataset,
)

SPLITS = ("train", "val", "test")

# readers shard by a distributed job's RANK/WORLD_SIZE (runtime/world.py): a suite run under a launcher that
# sets them must still read whole datasets; tests of the detection set them themselves
for _variable in ("RANK", "WORLD_SIZE"):
    os.environ.pop(_variable, None)


def make_schema() -> Unischema:
    """Every non-image codec, fixed and ``None`` dims, nullable fields and a partition key."""
    return Unischema("Sample", [
        UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("split", np.str_, (), ScalarCodec(pa.string()), False),
        UnischemaField("score", np.float32, (), ScalarCodec(pa.float32()), True),
        UnischemaField("price", decimal.Decimal, (), ScalarCodec(pa.decimal128(10, 2)), False),
        UnischemaField("vec", np.float32, (4,), TensorCodec(), False),
        UnischemaField("mat", np.int16, (2, 3), TensorCodec(), False),
        UnischemaField("boxes", np.float32, (None, 4), TensorCodec(), False),
        UnischemaField("ragged", np.uint8, (None, None), TensorCodec(), True),
        UnischemaField("emb", np.float64, (3,), NdarrayCodec(), False),
        UnischemaField("temps", np.float16, (None,), NdarrayCodec(), True),
        UnischemaField("mask", np.int32, (2, 2), CompressedNdarrayCodec(), True),
    ])


def make_row(i: int) -> dict[str, Any]:
    """Row ``i`` of :func:`make_schema`: every value a deterministic function of ``i``."""
    rng = np.random.default_rng(i)
    n_boxes = i % 4
    return {
        "id": i,
        "split": SPLITS[i % 3],
        "score": None if i % 5 == 0 else float(np.float32(i / 7)),
        "price": decimal.Decimal(i * 25) / 100,
        "vec": np.arange(4, dtype=np.float32) + i,
        "mat": (np.arange(6, dtype=np.int16) * (i % 50)).reshape(2, 3),
        "boxes": rng.random((n_boxes, 4), dtype=np.float32),
        "ragged": None if i % 7 == 3 else np.full((i % 3 + 1, i % 2 + 2), i % 256, dtype=np.uint8),
        "emb": rng.standard_normal(3),
        "temps": None if i % 6 == 1 else np.linspace(0, i, i % 5, dtype=np.float16),
        "mask": None if i % 4 == 2 else np.array([[i, -i], [2 * i, 7]], dtype=np.int32),
    }


def assert_value_equal(found: Any, expected: Any, *, where: str = "") -> None:
    """Exact equality: dtype, shape and values for arrays, type and value for scalars, None for None."""
    if expected is None:
        assert found is None, f"{where}: expected None, found {found!r}"
        return
    if isinstance(expected, np.ndarray):
        assert isinstance(found, np.ndarray), f"{where}: expected an ndarray, found {type(found)}"
        assert found.dtype == expected.dtype, f"{where}: dtype {found.dtype} != {expected.dtype}"
        assert found.shape == expected.shape, f"{where}: shape {found.shape} != {expected.shape}"
        np.testing.assert_array_equal(found, expected, err_msg=where)
        return
    assert found == expected, f"{where}: {found!r} != {expected!r}"


@pytest.fixture(autouse=True)
def _fork_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests convert small inputs: forked workers start whenever a test asks for them (the break-even
    that keeps small conversions in-process has its own tests, which set UNIHUB_FORK_MIN_MB)."""
    monkeypatch.setenv("UNIHUB_FORK_MIN_MB", "0")


@pytest.fixture
def schema() -> Unischema:
    return make_schema()


@pytest.fixture
def rows() -> Callable[[int], Iterator[dict[str, Any]]]:
    """``rows(n)``: a generator of the first ``n`` rows of :func:`make_row`."""

    def generate(n: int) -> Iterator[dict[str, Any]]:
        return (make_row(i) for i in range(n))

    return generate


@pytest.fixture
def write_sample(tmp_path: Path) -> Callable[..., tuple[Path, Any]]:
    """``write_sample(n, name="ds", **write_options)`` -> (path, WriteResult) of ``n`` sample rows."""

    def write(n: int, name: str = "ds", **options: Any) -> tuple[Path, Any]:
        path = tmp_path / name
        result = write_dataset(path, make_schema(), (make_row(i) for i in range(n)), **options)
        return path, result

    return write


@pytest.fixture
def sample_dataset(write_sample) -> Path:
    """50 sample rows in one file (several row groups would need bigger rows)."""
    path, _ = write_sample(50)
    return path


@pytest.fixture
def plain_parquet(tmp_path: Path) -> Path:
    """A directory with plain Parquet (no Unischema metadata), as Spark or pandas write it."""
    import pyarrow.parquet as pq

    root = tmp_path / "plain"
    root.mkdir()
    table = pa.table({
        "id": pa.array(np.arange(10, dtype=np.int64)),
        "name": pa.array([f"n{i}" for i in range(10)]),
        "pair": pa.array([[float(i), float(i) + 0.5] for i in range(10)], type=pa.list_(pa.float32())),
    })
    pq.write_table(table.slice(0, 6), root / "part-00000.parquet", row_group_size=3)
    pq.write_table(table.slice(6), root / "part-00001.parquet")
    (root / "_SUCCESS").write_bytes(b"")
    return root


def read_back(store: Any) -> dict[str, list[Any]]:
    """Every row of an opened dataset, decoded by the fields' codecs: field -> list of values."""
    columns: dict[str, list[Any]] = {name: [] for name in store.schema.fields}
    for info in store.row_groups:
        table = store.read_row_group(info.index)
        assert table.num_rows == info.num_rows
        for field in store.schema:
            column = table.column(field.name)
            if field.codec is None:
                columns[field.name].extend(column.to_pylist())
            else:
                columns[field.name].extend(field.codec.decode_column(field, column))
    return columns


# Test modules get the helpers as fixtures (with --import-mode=importlib, conftest is not importable).
@pytest.fixture
def sample_row() -> Callable[[int], dict[str, Any]]:
    return make_row


@pytest.fixture
def decode_dataset() -> Callable[[Any], dict[str, list[Any]]]:
    return read_back


@pytest.fixture
def value_equal() -> Callable[..., None]:
    return assert_value_equal


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session (``local[2]``) for every test that needs it; skipped without pyspark/java."""
    import os
    import shutil
    import sys

    from unihub.dependencies import is_available

    if not (is_available("pyspark") and shutil.which("java")):
        pytest.skip("a local Spark needs pyspark and java")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors import numpy and unihub
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("unihub-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.driver.memory", "1g")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


# -- S3 (moto's server) ------------------------------------------------------------------------------
BUCKET = "unihub-test"


@dataclass
class RequestLog:
    """Requests the server answered: ``(method, path, range header)``."""

    entries: list[tuple[str, str, str | None]] = dataclass_field(default_factory=list)
    lock: threading.Lock = dataclass_field(default_factory=threading.Lock)

    def record(self, environ: dict[str, Any]) -> None:
        with self.lock:
            self.entries.append((environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), environ.get("HTTP_RANGE")))

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()

    def object_reads(self, prefix: str = "") -> list[tuple[str, str | None]]:
        """GETs of an object (``/bucket/key``), not listings; ``prefix`` filters on ``bucket/key``."""
        with self.lock:
            return [(path, byte_range) for method, path, byte_range in self.entries
                    if method == "GET" and "/" in path.strip("/") and path.lstrip("/").startswith(prefix)]


@dataclass
class S3Server:
    endpoint_url: str
    host: str
    port: int
    requests: RequestLog
    bucket: str = BUCKET
    key: str = "testing"
    secret: str = "testing"

    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs options for ``storage_options=``."""
        return {"client_kwargs": {"endpoint_url": self.endpoint_url}, "key": self.key, "secret": self.secret}

    def pyarrow_filesystem(self) -> Any:
        """pyarrow's own S3 filesystem pointed at the server (for ``filesystem=``)."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(endpoint_override=f"{self.host}:{self.port}", scheme="http", access_key=self.key,
                                 secret_key=self.secret, region="us-east-1")

    def access(self, kind: str) -> dict[str, Any]:
        """The reading arguments for the server through ``kind``: ``"fsspec"`` (s3fs's ``storage_options=``) or
        ``"pyarrow"`` (its own S3 filesystem as ``filesystem=``); the test is skipped where that client is missing."""
        if kind == "fsspec":
            pytest.importorskip("s3fs")
            return {"storage_options": self.storage_options()}
        try:
            return {"filesystem": self.pyarrow_filesystem()}
        except ImportError:
            pytest.skip("this pyarrow build has no S3 support")

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
                            aws_access_key_id=self.key, aws_secret_access_key=self.secret)

    def upload_folder(self, folder: Path, prefix: str) -> str:
        """Every file below ``folder`` under ``prefix`` in the bucket; returns the ``s3://`` URL of the copy."""
        client = self.client()
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file():
                client.upload_file(str(path), self.bucket, f"{prefix}/{path.relative_to(folder).as_posix()}")
        return f"s3://{self.bucket}/{prefix}"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server with one bucket (``BUCKET``) and dummy credentials in the environment."""
    pytest.importorskip("boto3")
    server_module = pytest.importorskip("moto.server")
    werkzeug_log = logging.getLogger("werkzeug")
    level = werkzeug_log.level
    werkzeug_log.setLevel(logging.ERROR)  # one line per request otherwise
    with pytest.MonkeyPatch.context() as env:
        for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                            "AWS_EC2_METADATA_DISABLED": "true"}.items():
            env.setenv(name, value)
        for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            env.delenv(name, raising=False)
        server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            log = RequestLog()
            _record_requests(server, log)
            s3 = S3Server(f"http://{host}:{port}", host, port, log)
            s3.client().create_bucket(Bucket=s3.bucket)
            yield s3
        finally:
            server.stop()
            werkzeug_log.setLevel(level)


def _record_requests(server: Any, log: RequestLog) -> None:
    """Wrap the server's WSGI app so every request is logged (werkzeug reads ``server.app`` per request)."""
    wsgi_server = getattr(server, "_server", None)
    if wsgi_server is None or not hasattr(wsgi_server, "app"):
        pytest.skip("this moto version hides its WSGI server; requests cannot be counted")
    app = wsgi_server.app

    def recording_app(environ: dict[str, Any], start_response: Any) -> Any:
        log.record(environ)
        return app(environ, start_response)

    wsgi_server.app = recording_app


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[Any]:
    """A Spark standalone master and one worker on 127.0.0.1 (tests/spark_cluster.py), stopped at the end
    of the session; skipped without pyspark or java. A process holds one SparkContext: the tests that use
    the cluster run last (see pytest_collection_modifyitems), and the local session is stopped first."""
    from .spark_cluster import spark_home, start_spark_cluster

    if spark_home() is None:
        pytest.skip("a Spark standalone cluster needs pyspark and java")
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    with start_spark_cluster(workers=1) as cluster:
        yield cluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests on the Spark cluster after every other (the local ``spark`` session is stopped for them)."""
    items.sort(key=lambda item: "spark_cluster" in getattr(item, "fixturenames", ()))
