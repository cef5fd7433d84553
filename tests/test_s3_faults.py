"""Object stores at scale (issue 37): part files bounded by bytes, uploads in parts each with its own
timeout, a failed upload that leaves nothing (no open multipart upload, no staging object, even when
its last step reaches the server late), reads of a large object in bounded memory.

Each runs against moto's S3 server (``s3_server`` in conftest.py) on both S3 clients unihub writes
through: s3fs (``storage_options``) and pyarrow's S3FileSystem (an ``s3://`` URL). Slow and late
requests come from the :class:`FaultProxy` between them (``tests/readers/fault_servers.py``).
Sizes are tens of MB with timeouts of 1-2 s, scaled down from the 484 MB and 10 s of the issue.
"""

from __future__ import annotations

import io
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("moto")
pytest.importorskip("boto3")
pytest.importorskip("s3fs")

from unihub import TensorCodec, Unischema, UnischemaField, write_dataset  # noqa: E402
from unihub.cli import main  # noqa: E402
from unihub.converters.convert import convert  # noqa: E402
from unihub.errors import RemoteStorageError  # noqa: E402
from unihub.readers.reader import make_reader  # noqa: E402

from .memory_probe import needs_proc, peak_growth_mib  # noqa: E402
from .readers.fault_servers import FaultProxy  # noqa: E402

MB = 2**20
KINDS = ["fsspec", "pyarrow"]
ROW_BYTES = 256 * 2**10
SCHEMA = Unischema("Blobs", [UnischemaField("id", np.int64, ()),
                             UnischemaField("blob", np.uint8, (ROW_BYTES,), TensorCodec(), False)])


def blob(i: int) -> np.ndarray:
    """Row ``i``'s payload: random bytes (incompressible, so a file's size is its payload's)."""
    return np.random.default_rng(i).integers(0, 255, ROW_BYTES, dtype=np.uint8)


def rows(count: int) -> Iterator[dict[str, Any]]:
    return ({"id": i, "blob": blob(i)} for i in range(count))


@pytest.fixture
def proxy(s3_server) -> Iterator[FaultProxy]:
    server = FaultProxy(s3_server.port)
    yield server
    server.late = None
    server.close()


def through(s3_server: Any, kind: str, key: str, endpoint: tuple[str, int] | None = None) -> tuple[str, dict[str, Any]]:
    """(url, keyword arguments) reaching ``key`` on the server (or ``endpoint``, a proxy's host and port):
    storage_options for s3fs, a URL for pyarrow's filesystem."""
    host, port = endpoint or (s3_server.host, s3_server.port)
    if kind == "fsspec":
        options = {"client_kwargs": {"endpoint_url": f"http://{host}:{port}"}, "key": s3_server.key,
                   "secret": s3_server.secret}
        return f"s3://{s3_server.bucket}/{key}", {"storage_options": options}
    return f"s3://{s3_server.bucket}/{key}?endpoint_override={host}:{port}&scheme=http", {}


def objects(s3_server: Any, prefix: str) -> dict[str, int]:
    """Every object whose key starts with ``prefix``, with its size."""
    client = s3_server.client()
    found: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=s3_server.bucket, Prefix=prefix):
        found.update({entry["Key"]: entry["Size"] for entry in page.get("Contents", [])})
    return found


def open_uploads(s3_server: Any, prefix: str) -> list[str]:
    listing = s3_server.client().list_multipart_uploads(Bucket=s3_server.bucket, Prefix=prefix)
    return [upload["Key"] for upload in listing.get("Uploads", [])]


def webdataset_shard(path: Path, count: int) -> Path:
    """A WebDataset shard written with Python's tarfile: a class and ``ROW_BYTES`` random bytes per sample."""
    with tarfile.open(path, "w") as tar:
        for i in range(count):
            for ext, data in (("cls", str(i % 3).encode()), ("bin", blob(i).tobytes())):
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


# -- (a) part files bounded by bytes ----------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_a_conversion_to_s3_writes_part_files_under_the_bound(s3_server, kind, tmp_path):
    """12 MiB of samples with ``part_size_mb=2``: several part files, each under 2 MiB, every byte
    read back. Before, the in-process engine wrote one file of the whole input, whatever its size."""
    shard = webdataset_shard(tmp_path / "shard.tar", 48)
    key = f"parts-{uuid.uuid4().hex[:8]}"
    url, options = through(s3_server, kind, key)
    assert convert(shard, url, part_size_mb=2, progress=False, **options).rows == 48
    data = {k: size for k, size in objects(s3_server, key + "/").items() if k.endswith(".parquet")}
    assert len(data) >= 6 and max(data.values()) <= 2 * MB, data
    found = {}
    with make_reader(url, reader_pool_type="dummy", shuffle_row_groups=False, **options) as reader:
        for row in reader:
            values = row._asdict()  # a namedtuple renames the field "__key__"
            found[int(values.get("__key__", row[0]))] = bytes(row.bin)
    assert found == {i: blob(i).tobytes() for i in range(48)}


def test_write_dataset_bounds_part_files_on_a_local_disk(tmp_path):
    """The same bound on a local disk: 12 MiB in files of at most 2 MiB, row groups of at most half that."""
    result = write_dataset(tmp_path / "ds", SCHEMA, rows(48), part_size_mb=2)
    sizes = [Path(path).stat().st_size for path in result.files]
    assert len(sizes) >= 6 and max(sizes) <= 2 * MB and sum(pq.ParquetFile(p).metadata.num_rows
                                                          for p in result.files) == 48
    assert max(pq.ParquetFile(p).metadata.row_group(0).total_byte_size for p in result.files) <= MB + 2**16
    with pytest.raises(Exception, match="part_size_mb must be a positive number"):
        write_dataset(tmp_path / "bad", SCHEMA, rows(1), part_size_mb=0)


def test_cli_convert_bounds_part_files(tmp_path, capsys):
    """``unihub convert --part-size-mb``: the same bound from the command line; 0 is one error line."""
    shard = webdataset_shard(tmp_path / "shard.tar", 24)
    assert main(["convert", str(shard), str(tmp_path / "out"), "--part-size-mb", "1", "--quiet"]) == 0
    sizes = [path.stat().st_size for path in (tmp_path / "out").glob("*.parquet")]
    assert len(sizes) >= 6 and max(sizes) <= MB, sizes
    capsys.readouterr()
    assert main(["convert", str(shard), str(tmp_path / "bad"), "--part-size-mb", "0", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("unihub: error: part_size_mb must be a positive number") and err.count("\n") == 1, err
    assert not (tmp_path / "bad").exists()


# -- (b) a slow server: a timeout per request, not per object --------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_a_slow_server_takes_a_large_file_in_parts(s3_server, proxy, kind, monkeypatch):
    """A server that answers each request a second per 12 MB it was sent, with a 2 s timeout: a file of
    40 MiB sent in one request (s3fs did so for any file under its 50 MB part size) times out, in parts
    of at most 12 MB each request ends in time and the write succeeds."""
    timeout, rate, count = 2.0, 12 * MB, 160
    assert count * ROW_BYTES / rate > timeout + 1  # one request of the whole file would time out
    monkeypatch.setenv("UNIHUB_REMOTE_TIMEOUT", str(timeout))
    monkeypatch.setenv("UNIHUB_REMOTE_RETRIES", "1")
    key = f"slow-{uuid.uuid4().hex[:8]}"
    url, options = through(s3_server, kind, key, ("127.0.0.1", proxy.port))
    proxy.bytes_per_second = rate
    result = write_dataset(url, SCHEMA, rows(count), **options)
    proxy.bytes_per_second = None
    assert result.num_rows == count and len(result.files) == 1
    data = [size for k, size in objects(s3_server, key + "/").items() if k.endswith(".parquet")]
    assert data and data[0] > count * ROW_BYTES


# -- (c) a failing upload leaves nothing, even when its last step comes late ----------------------------
def completes_upload(method: str, target: str) -> bool:
    """CompleteMultipartUpload: the last step of an upload in parts."""
    return method == "POST" and "uploadId=" in target


#: how late an upload's last step reaches the server at the latest: after the client gave up on it (1 s
#: timeout, no retry). pyarrow's AWS SDK gives up on an unanswered request only after about 7 s, whatever its
#: timeout. A test's ``proxy.wait_late()`` passes it on as soon as the write has failed (and cleaned up)
LATE = {"fsspec": 4.0, "pyarrow": 16.0}


@pytest.mark.parametrize("kind", KINDS)
def test_a_failing_upload_leaves_no_upload_and_no_object(s3_server, proxy, kind, monkeypatch):
    """Every upload's last step reaches the server late, after the client gave up on it: a
    RemoteStorageError naming the URL, and once the server has run those late steps, no multipart
    upload open and no object, staged or published (before: the late step created the staged part file
    after the cleanup)."""
    monkeypatch.setenv("UNIHUB_REMOTE_TIMEOUT", "1")
    monkeypatch.setenv("UNIHUB_REMOTE_RETRIES", "0")
    key = f"late-{uuid.uuid4().hex[:8]}"
    url, options = through(s3_server, kind, key, ("127.0.0.1", proxy.port))
    proxy.late = (LATE[kind], completes_upload)
    with pytest.raises(RemoteStorageError, match=rf"^s3://{s3_server.bucket}/{key}: "):
        write_dataset(url, SCHEMA, rows(96), **options)  # 24 MiB: uploaded in parts by either client
    proxy.late = None
    proxy.wait_late()
    assert proxy.late_requests, "no upload reached its last step"
    assert open_uploads(s3_server, f".{key}") == [] and open_uploads(s3_server, key) == []
    assert objects(s3_server, f".{key}") == {} and objects(s3_server, key) == {}


def test_a_manifest_written_late_never_publishes_removed_files(s3_server, proxy, monkeypatch):
    """An overwrite whose manifest upload (the one step that publishes) reaches the server after the
    client gave up: the write fails, and the late step must not publish the new run's part files, which
    its cleanup removed; the old dataset stays whole (before: the late manifest listed removed files)."""
    monkeypatch.setenv("UNIHUB_REMOTE_TIMEOUT", "1")
    monkeypatch.setenv("UNIHUB_REMOTE_RETRIES", "0")
    key = f"manifest-{uuid.uuid4().hex[:8]}"
    url, _ = through(s3_server, "pyarrow", key, ("127.0.0.1", proxy.port))
    write_dataset(url, SCHEMA, rows(4), overwrite=True)
    proxy.late = (LATE["pyarrow"], lambda method, target: completes_upload(method, target)
                  and "_unihub_manifest.json" in target)
    with pytest.raises(RemoteStorageError, match=rf"^s3://{s3_server.bucket}/{key}"):
        write_dataset(url, SCHEMA, ({"id": 100 + i, "blob": blob(i)} for i in range(6)), overwrite=True)
    proxy.late = None
    proxy.wait_late()
    assert proxy.late_requests, "the manifest upload never reached its last step"
    with make_reader(url, reader_pool_type="dummy") as reader:
        assert sorted(int(row.id) for row in reader) == [0, 1, 2, 3]
    assert open_uploads(s3_server, key) == []


def test_cli_a_failing_upload_is_one_line_and_leaves_nothing(s3_server, proxy, monkeypatch, tmp_path, capsys):
    """The same through ``unihub convert`` (the one ingest pipeline, pyarrow's filesystem): exit 1, one
    ``unihub: error:`` line naming the target, nothing left on the server."""
    monkeypatch.setenv("UNIHUB_REMOTE_TIMEOUT", "1")
    monkeypatch.setenv("UNIHUB_REMOTE_RETRIES", "0")
    shard = webdataset_shard(tmp_path / "shard.tar", 96)
    key = f"late-cli-{uuid.uuid4().hex[:8]}"
    url, _ = through(s3_server, "pyarrow", key, ("127.0.0.1", proxy.port))
    proxy.late = (LATE["pyarrow"], completes_upload)
    assert main(["convert", str(shard), url, "--quiet"]) == 1
    proxy.late = None
    err = capsys.readouterr().err
    assert err.startswith(f"unihub: error: s3://{s3_server.bucket}/{key}") and err.count("\n") == 1, err
    proxy.wait_late()
    assert open_uploads(s3_server, f".{key}") == [] and objects(s3_server, f".{key}") == {}
    assert objects(s3_server, key) == {}


# -- (d) reading a large object in bounded memory --------------------------------------------------
@needs_proc
@pytest.mark.parametrize("kind", KINDS)
def test_reading_a_large_object_holds_a_bounded_buffer(s3_server, kind):
    """One 64 MiB part file of 2 MiB row groups, read row by row: peak RSS grows by less than half the
    object (before, through s3fs, every ranged read fetched 50 MB ahead, to the end of this file)."""
    key = f"large-{uuid.uuid4().hex[:8]}"
    url, options = through(s3_server, kind, key)
    write_dataset(url, SCHEMA, rows(256), row_group_size_mb=2, part_size_mb=128, **options)
    data = [size for k, size in objects(s3_server, key + "/").items() if k.endswith(".parquet")]
    assert len(data) == 1 and data[0] > 64 * MB
    setup = f"""
from unihub import open_dataset
from unihub.readers.reader import make_reader
url, options = {url!r}, {options!r}
open_dataset(url, **options)  # the S3 client made and its API model loaded (tens of MB) before the count
"""
    work = """
with make_reader(url, reader_pool_type="dummy", shuffle_row_groups=False, memory_budget_mb=16, **options) as reader:
    count = sum(int(row.blob[0]) >= 0 for row in reader)
assert count == 256, count
"""
    growth = peak_growth_mib(setup, work, timeout=240)
    assert growth < 32, f"{kind}: reading a 64 MiB object grew RSS by {growth:.0f} MiB"


@pytest.mark.parametrize("kind", KINDS)
def test_the_next_write_aborts_the_upload_a_killed_run_left_open(s3_server, kind):
    """A run killed in the middle of an upload leaves it open, its parts in no listing of objects: the
    next write to the same target aborts it (its run is dead), and leaves a live run's upload alone."""
    from unihub.fs import atomic

    key = f"killed-{uuid.uuid4().hex[:8]}"
    url, options = through(s3_server, kind, key)
    where = atomic.run_id().split("-")[0]  # this machine: a pid that is not running here is dead
    dead, live = f".{key}.unihub-tmp-{where}-999999999-1-abcdef", f".{key}.unihub-tmp-{atomic.run_id()}"
    client = s3_server.client()
    for staging in (dead, live):
        upload = client.create_multipart_upload(Bucket=s3_server.bucket, Key=f"{staging}/part-00000.parquet")
        client.upload_part(Bucket=s3_server.bucket, Key=f"{staging}/part-00000.parquet", PartNumber=1,
                           UploadId=upload["UploadId"], Body=b"\0" * 5 * MB)
    write_dataset(url, SCHEMA, rows(2), **options)
    assert open_uploads(s3_server, f".{key}") == [f"{live}/part-00000.parquet"]
    client.abort_multipart_upload(Bucket=s3_server.bucket, Key=f"{live}/part-00000.parquet", UploadId=upload["UploadId"])
