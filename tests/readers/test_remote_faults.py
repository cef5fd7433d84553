"""Remote faults on both S3 paths (fsspec/s3fs and pyarrow's S3FileSystem): a server that stops
answering, one that is killed, one that cuts an answer short. Each is a RemoteStorageError naming
the URL (never its query, which may hold credentials), within the configured time; a transient cut
is retried.

The faults come from :class:`FaultProxy` (``fault_servers.py``) between the client and moto's server
(``s3_server`` in conftest.py), switched before an open or in the middle of a read or a write.
Timeouts are 1 s with 1 retry (``UNIHUB_REMOTE_TIMEOUT``/``UNIHUB_REMOTE_RETRIES``), so a failing
request gives up after about 2 s; before, through fsspec, a frozen server gave no answer in 200 s.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("moto")
pytest.importorskip("boto3")
pytest.importorskip("s3fs")

import pyarrow.fs as pafs  # noqa: E402

from unihub import open_dataset, write_dataset  # noqa: E402
from unihub.cli import main  # noqa: E402
from unihub.converters.convert import convert  # noqa: E402
from unihub.errors import InvalidArgumentError, RemoteStorageError  # noqa: E402
from unihub.fs import filesystem as fsutil  # noqa: E402
from unihub.readers.reader import make_reader  # noqa: E402

from .fault_servers import FaultProxy  # noqa: E402
from .sample import assert_rows_equal, rows_by_id, sample_row, sample_schema  # noqa: E402

TIMEOUT, RETRIES = 1.0, 1
#: a failing request: every attempt waits out the timeout; plus botocore's or the AWS SDK's backoff
#: between attempts and slack for a machine shared by other test runs (5 s failed at 5.2 under load); still
#: well under what the default settings would take ((2 + 1) x 10 s), which is what these tests guard against
BOUND = (RETRIES + 1) * TIMEOUT + 12.0
#: a failed write also closes its open files and removes its temporary, each step bounded the same way
WRITE_BOUND = 4 * BOUND
N = 40
SCHEMA = sample_schema("Faults")
KINDS = ["fsspec", "pyarrow"]
FAULTS = ["freeze", "dead", "cut"]


@pytest.fixture(autouse=True)
def short_timeouts(monkeypatch) -> None:
    monkeypatch.setenv("UNIHUB_REMOTE_TIMEOUT", str(TIMEOUT))
    monkeypatch.setenv("UNIHUB_REMOTE_RETRIES", str(RETRIES))


@pytest.fixture
def proxy(s3_server) -> Iterator[FaultProxy]:
    server = FaultProxy(s3_server.port)
    yield server
    server.close()


@pytest.fixture(scope="module")
def key(s3_server) -> str:
    """A dataset of 40 rows in 3 files of several row groups, written straight to the server."""
    prefix = f"faults-{uuid.uuid4().hex[:8]}"
    write_dataset(f"s3://{s3_server.bucket}/{prefix}", SCHEMA, (sample_row(i) for i in range(N)),
                  row_group_size_mb=0.001, rows_per_file=15, storage_options=s3_server.storage_options())
    return prefix


def through(proxy: FaultProxy, s3_server: Any, kind: str, key: str) -> tuple[str, dict[str, Any]]:
    """(url, options) reaching ``key`` through the proxy: storage_options for fsspec, a URL for pyarrow."""
    if kind == "fsspec":
        options = {"client_kwargs": {"endpoint_url": proxy.endpoint_url}, "key": s3_server.key,
                   "secret": s3_server.secret}
        return f"s3://{s3_server.bucket}/{key}", {"storage_options": options}
    return f"s3://{s3_server.bucket}/{key}?endpoint_override=127.0.0.1:{proxy.port}&scheme=http", {}


class Clock:
    def __enter__(self) -> Clock:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seconds = time.perf_counter() - self.start


# -- reading --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("kind", KINDS)
def test_opening_a_dataset_on_a_failing_server(s3_server, proxy, key, kind, fault):
    url, options = through(proxy, s3_server, kind, key)
    proxy.mode = fault
    with Clock() as clock, pytest.raises(RemoteStorageError) as caught:
        open_dataset(url, **options)
    assert clock.seconds < BOUND, f"{kind}, {fault}: {clock.seconds:.1f} s"
    message = str(caught.value)
    assert message.startswith(f"s3://{s3_server.bucket}/{key}") and "the remote store failed" in message
    assert "endpoint_override" not in message and "\n" not in message
    assert caught.value.url.startswith(f"s3://{s3_server.bucket}/{key}")


@pytest.mark.parametrize("read_ahead_mb", [0, 1e-6])  # a plain read; the read-ahead's GETs (one row group ahead)
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_server_failing_in_the_middle_of_a_read(s3_server, proxy, key, kind, fault, read_ahead_mb):
    url, options = through(proxy, s3_server, kind, key)
    with make_reader(url, reader_pool_type="dummy", shuffle_row_groups=False, read_ahead_mb=read_ahead_mb,
                     **options) as reader:
        next(reader)
        proxy.mode = fault
        with Clock() as clock, pytest.raises(RemoteStorageError,
                                             match=rf"^s3://{s3_server.bucket}/{key}/(unihub-[-0-9a-f]+-)?part-\d+\.parquet: "):
            list(reader)
    assert clock.seconds < BOUND, f"{kind}, {fault}: {clock.seconds:.1f} s"


@pytest.mark.parametrize("kind", KINDS)
def test_a_transient_cut_is_retried(s3_server, proxy, key, kind):
    url, options = through(proxy, s3_server, kind, key)
    expected = rows_by_id(make_reader(f"s3://{s3_server.bucket}/{key}", storage_options=s3_server.storage_options()))
    proxy.mode, proxy.cut_next = "cut", RETRIES  # the first attempts of the next read are cut short, its last is not
    found = rows_by_id(make_reader(url, reader_pool_type="dummy", **options))
    assert proxy.cut_next == 0 and sorted(expected) == list(range(N))
    assert_rows_equal(found, expected)


def test_storage_options_set_the_timeout_and_retries(s3_server, proxy, key, monkeypatch):
    """``unihub_timeout``/``unihub_retries`` in storage_options win over the environment; alone they
    leave an s3:// URL on pyarrow's filesystem."""
    proxy.mode = "freeze"
    monkeypatch.setenv("UNIHUB_REMOTE_TIMEOUT", "30")  # the environment's would take 60 s: the bound below is
    monkeypatch.setenv("UNIHUB_REMOTE_RETRIES", "1")  # generous (a loaded machine took 3 s) and still tells them apart
    for kind in KINDS:
        url, options = through(proxy, s3_server, kind, key)
        storage_options = {**options.get("storage_options", {}), "unihub_timeout": 0.3, "unihub_retries": 0}
        with Clock() as clock, pytest.raises(RemoteStorageError):
            open_dataset(url, storage_options=storage_options)
        assert 0.25 < clock.seconds < 0.3 + 15.0, f"{kind}: {clock.seconds:.1f} s"
    url, _ = through(proxy, s3_server, "pyarrow", key)
    fs, _ = fsutil.resolve_filesystem(url, storage_options={"unihub_timeout": 5})
    assert isinstance(fs, pafs.S3FileSystem)
    options = fs.__reduce__()[1][0]  # type: ignore[index]
    assert options["request_timeout"] == 5 and options["background_writes"] is False  # uploads in bounded memory
    for bad in ({"unihub_timeout": 0}, {"unihub_timeout": "soon"}, {"unihub_retries": -1}):
        with pytest.raises(InvalidArgumentError, match="unihub_"):
            fsutil.resolve_filesystem(url, storage_options=bad)


def test_a_bad_environment_setting_is_named(monkeypatch, s3_server):
    monkeypatch.setenv("UNIHUB_REMOTE_TIMEOUT", "ten")
    with pytest.raises(InvalidArgumentError, match="UNIHUB_REMOTE_TIMEOUT='ten'"):
        open_dataset(f"s3://{s3_server.bucket}/x", storage_options=s3_server.storage_options())


def test_a_filesystem_given_keeps_its_settings_and_its_failures_are_translated(s3_server, proxy, key, monkeypatch):
    """The filesystem's own 0.5 s timeouts hold, not unihub's (the environment's 60 s would take far longer than
    the bound, which leaves room for a loaded machine: 2.5 s failed at 2.55 in a full suite)."""
    import s3fs

    monkeypatch.setenv("UNIHUB_REMOTE_TIMEOUT", "60")

    fsspec_fs = s3fs.S3FileSystem(key=s3_server.key, secret=s3_server.secret, skip_instance_cache=True,
                                  client_kwargs={"endpoint_url": proxy.endpoint_url},
                                  config_kwargs={"connect_timeout": 0.5, "read_timeout": 0.5,
                                                 "retries": {"total_max_attempts": 1}})
    fsspec_fs.retries = 1
    proxy.mode = "freeze"
    given = [pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{proxy.port}", scheme="http", access_key=s3_server.key,
                               secret_key=s3_server.secret, region="us-east-1", connect_timeout=0.5,
                               request_timeout=0.5, retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1)),
             fsspec_fs]
    for filesystem in given:
        with Clock() as clock, pytest.raises(RemoteStorageError, match=f"^s3://{s3_server.bucket}/{key}"):
            open_dataset(f"s3://{s3_server.bucket}/{key}", filesystem=filesystem)
        assert clock.seconds < 15, f"{type(filesystem).__name__}: {clock.seconds:.1f} s"


# -- writing and converting -----------------------------------------------------------------------------
def failing_at(proxy: FaultProxy, fault: str, row: int) -> Iterator[dict[str, Any]]:
    for i in range(N):
        if i == row:
            proxy.mode = fault
        yield sample_row(i)


@pytest.mark.parametrize("fault", ["freeze", "dead"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_server_failing_in_the_middle_of_a_write(s3_server, proxy, kind, fault):
    key = f"written-{uuid.uuid4().hex[:8]}"
    url, options = through(proxy, s3_server, kind, key)
    with Clock() as clock, pytest.raises(RemoteStorageError, match=rf"^s3://{s3_server.bucket}/{key}: "):
        write_dataset(url, SCHEMA, failing_at(proxy, fault, 30), row_group_size_mb=0.001, rows_per_file=10, **options)
    assert clock.seconds < WRITE_BOUND, f"{kind}, {fault}: {clock.seconds:.1f} s"
    proxy.mode = "pass"
    listing = s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix=key).get("Contents", [])
    assert listing == [], "a dataset was published"


def webdataset_tar(path: Path) -> Path:
    """A WebDataset shard written with Python's tarfile: a class and a JSON document per sample."""
    with tarfile.open(path, "w") as tar:
        for i in range(20):
            for ext, data in (("cls", str(i % 3).encode()), ("json", json.dumps({"i": i}).encode())):
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("fault", FAULTS)
def test_convert_from_and_to_a_failing_server(s3_server, proxy, key, fault, tmp_path):
    """``convert`` reaches S3 by URL (pyarrow's filesystem): a unihub dataset on S3 -> local, and a
    local WebDataset shard -> a unihub dataset on S3."""
    source, _ = through(proxy, s3_server, "pyarrow", key)
    target = tmp_path / "local"
    proxy.mode = fault
    with Clock() as clock, pytest.raises(RemoteStorageError, match=rf"^s3://{s3_server.bucket}/{key}"):
        convert(source, target, progress=False)
    assert clock.seconds < BOUND and not target.exists() and list(tmp_path.iterdir()) == []

    proxy.mode = "pass"
    if fault == "cut":
        return  # writing reads no object back: nothing to cut
    shard = webdataset_tar(tmp_path / "shard.tar")
    out_key = f"converted-{uuid.uuid4().hex[:8]}"
    remote_target, _ = through(proxy, s3_server, "pyarrow", out_key)
    proxy.mode = fault
    with Clock() as clock, pytest.raises(RemoteStorageError, match=rf"^s3://{s3_server.bucket}/{out_key}"):
        convert(shard, remote_target, progress=False)
    assert clock.seconds < WRITE_BOUND
    proxy.mode = "pass"
    assert s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix=out_key).get("KeyCount") == 0
    assert convert(shard, remote_target, progress=False).rows == 20  # and with the server back, it converts


@pytest.mark.parametrize("kind", KINDS)
def test_copy_dataset_and_add_schema_name_the_url(s3_server, proxy, key, kind, tmp_path):
    from unihub import add_schema, copy_dataset

    local = tmp_path / "local"
    write_dataset(local, SCHEMA, (sample_row(i) for i in range(N)))
    target, options = through(proxy, s3_server, kind, f"copied-{uuid.uuid4().hex[:8]}")
    source, _ = through(proxy, s3_server, kind, key)
    proxy.mode = "freeze"
    for name, call in (("copy_dataset", lambda: copy_dataset(None, local, target, **options)),
                       ("add_schema", lambda: add_schema(source, **options))):
        with Clock() as clock, pytest.raises(RemoteStorageError, match=f"^s3://{s3_server.bucket}/"):
            call()
        assert clock.seconds < BOUND, f"{name}: {clock.seconds:.1f} s"


def test_cli_names_the_url_in_one_line(s3_server, proxy, key, tmp_path, capsys):
    source, _ = through(proxy, s3_server, "pyarrow", key)
    proxy.mode = "freeze"
    for argv in (["inspect", source], ["convert", source, str(tmp_path / "out")]):
        with Clock() as clock:
            assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"unihub: error: s3://{s3_server.bucket}/{key}") and err.count("\n") == 1, err
        assert "endpoint_override" not in err and clock.seconds < BOUND
