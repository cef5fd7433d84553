"""Conversions with sources and targets on S3 (moto's server on 127.0.0.1), every format, both directions.

Sources are written by the formats' own libraries (``tf.io.TFRecordWriter``, h5py, ``webdataset.TarWriter``,
Pillow) and uploaded; each S3 -> S3 conversion and export runs with its working directory and TMPDIR set to
fresh empty directories that must stay empty (and no ``s3:`` directory may appear), and gives the rows (or
files) the same conversion gives locally, bit for bit.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("moto")
pytest.importorskip("boto3")
pytest.importorskip("s3fs")

from unihub import (  # noqa: E402
    ScalarCodec,
    Unischema,
    UnischemaField,
    convert,
    open_dataset,
    verify,
    write_dataset,
)
from unihub.cli import main  # noqa: E402
from unihub.errors import DatasetChangedError, UnsupportedFilesystemError  # noqa: E402
from unihub.readers.reader import make_batch_reader  # noqa: E402

_SCHEMA = Unischema("Ids", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False)])
FORMATS = ["tfrecord", "tfrecord-gzip", "tfrecord-zlib", "hdf5", "webdataset", "webdataset-gz", "imagefolder"]
EXPORTS = {"tfrecord": "tfrecord", "hdf5": "hdf5", "webdataset": "webdataset", "imagefolder": "imagefolder"}


# -- sources written by the formats' own libraries ---------------------------------------------------
def _png(i: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.full((4, 5, 3), i * 20 % 256, np.uint8)).save(out, format="PNG")
    return out.getvalue()


def write_source(kind: str, root: Path) -> tuple[str, str]:
    """Write a small source of ``kind`` under ``root``; returns (the path to convert, what to upload)."""
    root.mkdir(parents=True)
    if kind.startswith("tfrecord"):
        import tensorflow as tf

        compression = {"tfrecord": "", "tfrecord-gzip": "GZIP", "tfrecord-zlib": "ZLIB"}[kind]
        for shard in range(3):
            with tf.io.TFRecordWriter(str(root / f"part-{shard}.tfrecord"), options=compression) as writer:
                for i in range(4):
                    n = shard * 4 + i
                    feature = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[n])),
                               "x": tf.train.Feature(float_list=tf.train.FloatList(value=[n / 3, -n / 7])),
                               "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"r{n}".encode()]))}
                    writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        return str(root), str(root)
    if kind == "hdf5":
        import h5py

        with h5py.File(root / "data.h5", "w") as handle:
            handle["id"] = np.arange(30, dtype=np.int64)
            handle["x"] = np.random.default_rng(0).standard_normal((30, 3)).astype(np.float32)
            handle.attrs["version"] = 3
        return str(root / "data.h5"), str(root)
    if kind.startswith("webdataset"):
        import webdataset as wds

        suffix = ".tar.gz" if kind.endswith("gz") else ".tar"
        for shard in range(2):
            with wds.TarWriter(str(root / f"shard-{shard}{suffix}")) as sink:
                for i in range(5):
                    n = shard * 5 + i
                    sink.write({"__key__": f"s{n:04d}", "png": _png(n), "cls": str(n % 3).encode()})
        return str(root), str(root)
    if kind == "imagefolder":
        for label in ("cat", "dog"):
            (root / label).mkdir()
            for i in range(3):
                (root / label / f"{i}.png").write_bytes(_png(i + (10 if label == "dog" else 0)))
        return str(root), str(root)
    raise AssertionError(kind)


def upload(s3: Any, local: str, prefix: str) -> None:
    s3.upload_folder(Path(local), prefix)


def keys(s3: Any, prefix: str) -> list[str]:
    found, token = [], None
    while True:
        page = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=prefix, **({"ContinuationToken": token} if token
                                                                             else {}))
        found.extend(o["Key"] for o in page.get("Contents", []))
        token = page.get("NextContinuationToken")
        if not token:
            return sorted(found)


def rows_of(url: str, **options: Any) -> list[dict[str, Any]]:
    """Every row in storage order, images as stored bytes."""
    store = open_dataset(url, **options)
    rows: list[dict[str, Any]] = []
    with make_batch_reader(store, shuffle_row_groups=False, decode_images=False, workers_count=1) as reader:
        names = list(reader.schema.fields)
        for batch in reader:
            columns = dict(zip(names, batch))
            rows.extend({n: columns[n][i] for n in names} for i in range(len(columns[names[0]])))
    return rows


def assert_same_rows(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b) and a
    for left, right in zip(a, b):
        assert left.keys() == right.keys()
        for name in left:
            x, y = left[name], right[name]
            if name in ("source", "path"):  # where the row came from: the local or the remote path
                continue
            if isinstance(x, np.ndarray):
                assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name
            else:
                assert x == y, name


@pytest.fixture
def nothing_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run with the working directory and TMPDIR fresh and empty, and assert they stay so."""
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmpdir"
    cwd.mkdir()
    tmp.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    yield
    assert list(cwd.iterdir()) == [] and list(tmp.iterdir()) == []
    assert not any(p.name.startswith("s3:") for p in tmp_path.rglob("*"))


@pytest.fixture(scope="module")
def sources_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("remote-sources")


@pytest.mark.parametrize("kind", FORMATS)
def test_s3_to_s3_every_format_matches_local(kind: str, s3_server: Any, sources_dir: Path, tmp_path: Path,
                                             request: pytest.FixtureRequest) -> None:
    """Ingest S3 -> S3, export S3 -> S3 and verify on S3, each equal to the same thing done locally,
    with nothing written to the local disk."""
    local_src, upload_dir = write_source(kind, sources_dir / kind)
    run = uuid.uuid4().hex[:8]
    upload(s3_server, upload_dir, f"{run}/src")
    remote_src = f"s3://{s3_server.bucket}/{run}/src" + local_src[len(upload_dir):]
    options = {"storage_options": s3_server.storage_options()}
    local_out = tmp_path / "local.unihub"
    convert(local_src, local_out, progress=False)
    expected = rows_of(str(local_out))

    request.getfixturevalue("nothing_local")
    out = f"s3://{s3_server.bucket}/{run}/out"
    result = convert(remote_src, out, progress=False, **options)
    assert result.rows == len(expected)
    assert_same_rows(rows_of(out, **options), expected)
    assert verify(remote_src, out, **options).equal

    family = kind.split("-")[0]
    suffix = ".h5" if family == "hdf5" else ""
    exported = f"s3://{s3_server.bucket}/{run}/export{suffix}"
    convert(out, exported, to_format=EXPORTS[family], progress=False, **options)
    assert verify(exported, out, **options).equal
    assert keys(s3_server, f"{run}/.") == []  # no staging prefix left beside the outputs


def test_local_export_matches_s3_export_bytes(s3_server: Any, sources_dir: Path, tmp_path: Path) -> None:
    """A TFRecord export to S3 holds the very bytes of the same export to a local disk."""
    local_src, _ = write_source("tfrecord", sources_dir / "bytes")
    run = uuid.uuid4().hex[:8]
    options = {"storage_options": s3_server.storage_options()}
    convert(local_src, tmp_path / "ds", progress=False)
    convert(tmp_path / "ds", tmp_path / "export", to_format="tfrecord", progress=False)
    convert(tmp_path / "ds", f"s3://{s3_server.bucket}/{run}/export", to_format="tfrecord", progress=False, **options)
    client = s3_server.client()
    for path in sorted((tmp_path / "export").iterdir()):
        body = client.get_object(Bucket=s3_server.bucket, Key=f"{run}/export/{path.name}")["Body"].read()
        assert body == path.read_bytes()
    assert len(keys(s3_server, f"{run}/export/")) == len(list((tmp_path / "export").iterdir()))


def test_globs_and_brace_lists_on_s3(s3_server: Any, sources_dir: Path, nothing_local: None) -> None:
    local_src, upload_dir = write_source("tfrecord", sources_dir / "globs")
    run = uuid.uuid4().hex[:8]
    upload(s3_server, upload_dir, f"{run}/tfr")
    options = {"storage_options": s3_server.storage_options()}
    base = f"s3://{s3_server.bucket}/{run}"
    shard = {k: list(range(4 * k, 4 * k + 4)) for k in range(3)}
    cases = {f"{base}/tfr/*.tfrecord": [0, 1, 2], f"{base}/tfr/part-{{0..1}}.tfrecord": [0, 1],
             f"{base}/tfr/part-{{0,2}}.tfrecord": [0, 2], f"{base}/tfr/part-[12].tfrecord": [1, 2],
             f"{base}/tfr": [0, 1, 2], f"{base}/t*/part-0.tfrecord": [0]}
    for n, (pattern, shards) in enumerate(cases.items()):
        out = f"{base}/out{n}"
        expected = [i for k in shards for i in shard[k]]
        assert convert(pattern, out, progress=False, **options).rows == len(expected), pattern
        assert [int(r["id"]) for r in rows_of(out, **options)] == expected, pattern


def test_workers_read_s3_with_storage_options(s3_server: Any, sources_dir: Path, tmp_path: Path) -> None:
    """Forked workers open the S3 files with the conversion's storage options (no endpoint in the env)."""
    local_src, upload_dir = write_source("tfrecord-gzip", sources_dir / "workers")
    run = uuid.uuid4().hex[:8]
    upload(s3_server, upload_dir, f"{run}/tfr")
    result = convert(f"s3://{s3_server.bucket}/{run}/tfr/*.tfrecord", tmp_path / "out", workers=2, progress=False,
                     storage_options=s3_server.storage_options())
    assert result.rows == 12
    assert sorted(int(r["id"]) for r in rows_of(str(tmp_path / "out"))) == list(range(12))


def test_a_remote_source_counts_its_bytes_for_the_workers(s3_server: Any, sources_dir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """An S3 source's size is what decides the forked workers, as a local one's: it counted 0 bytes, so every
    conversion from a store ran in-process ("too little input") and reported bytes_read 0."""
    local_src, upload_dir = write_source("tfrecord", sources_dir / "sized")
    size = sum(p.stat().st_size for p in Path(local_src).iterdir())
    run = uuid.uuid4().hex[:8]
    upload(s3_server, upload_dir, f"{run}/tfr")
    monkeypatch.setenv("UNIHUB_FORK_MIN_MB", str(size / 2 / 2**20))  # the input pays for exactly two workers
    local = convert(local_src, tmp_path / "local", workers=2, progress=False)
    remote = convert(f"s3://{s3_server.bucket}/{run}/tfr", tmp_path / "remote", workers=2, progress=False,
                     storage_options=s3_server.storage_options())
    assert (remote.bytes_read, remote.notes) == (local.bytes_read, local.notes) == (size, [])
    assert sorted(int(r["id"]) for r in rows_of(str(tmp_path / "remote"))) == list(range(12))


def test_a_write_to_a_missing_bucket_is_named_and_makes_no_bucket(s3_server: Any, sources_dir: Path,
                                                                    tmp_path: Path) -> None:
    """Every writer refuses a bucket that does not exist with one OutputError naming it, and makes none: through
    s3fs a misspelled bucket was created (and written), through pyarrow's S3 a bare OSError or, in an export, a
    RemoteStorageError blaming the retries."""
    from unihub import copy_dataset
    from unihub.errors import OutputError

    client = s3_server.client()
    buckets = lambda: sorted(b["Name"] for b in client.list_buckets()["Buckets"])  # noqa: E731
    before = buckets()
    run = uuid.uuid4().hex[:8]
    local_src, upload_dir = write_source("tfrecord", sources_dir / "nobucket")
    upload(s3_server, upload_dir, f"{run}/tfr")
    good = f"s3://{s3_server.bucket}/{run}/ds"
    convert(f"s3://{s3_server.bucket}/{run}/tfr", good, storage_options=s3_server.storage_options())
    options = s3_server.storage_options()
    pyarrow_url = f"?endpoint_override={s3_server.host}:{s3_server.port}&scheme=http"
    writes = {
        "write_dataset, s3fs": lambda url: write_dataset(url, _SCHEMA, ({"id": i} for i in range(3)),
                                                          storage_options=options),
        "write_dataset, pyarrow": lambda url: write_dataset(url, _SCHEMA, ({"id": i} for i in range(3)),
                                                             filesystem=s3_server.pyarrow_filesystem()),
        "ingest": lambda url: convert(f"s3://{s3_server.bucket}/{run}/tfr", url, storage_options=options),
        "export, s3fs": lambda url: convert(good, url, to_format="webdataset", storage_options=options),
        "export, pyarrow": lambda url: convert(good + pyarrow_url, url + pyarrow_url, to_format="tfrecord"),
        "copy_dataset": lambda url: copy_dataset(None, good, url, storage_options=options),
    }
    for what, write in writes.items():
        with pytest.raises(OutputError, match=f"cannot write s3://no-{run}/x: the bucket 'no-{run}' does not exist"):
            write(f"s3://no-{run}/x")
        assert buckets() == before, what
    # a URL that asks pyarrow to make its bucket still does
    write_dataset(f"s3://made-{run}/x{pyarrow_url}&allow_bucket_creation=true", _SCHEMA, [{"id": 1}])
    assert f"made-{run}" in buckets()


def _tfrecord(ids: range, tag: int = 0) -> bytes:
    """A TFRecord file of one Example per id (``id``, ``tag``), as tf.io.TFRecordWriter writes it."""
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as holder:
        path = os.path.join(holder, "f.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for n in ids:
                feature = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[n])),
                           "tag": tf.train.Feature(int64_list=tf.train.Int64List(value=[tag]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        return Path(path).read_bytes()


@pytest.mark.parametrize("kind", ["fsspec", "query"])
def test_incremental_conversions_in_one_process_see_the_source_as_it_is_now(s3_server: Any, kind: str) -> None:
    """convert --append from S3 run again in the same process (a job that converts as files arrive) lists the
    source afresh: through s3fs the listing an earlier conversion cached was used, so a file added since was
    'not a file' and one rewritten since 'changed since the dataset was opened', not a SourceChangedError.
    Through a URL whose query names the endpoint, the source files' checksums were read from AWS instead."""
    from unihub.errors import SourceChangedError

    client, run = s3_server.client(), uuid.uuid4().hex[:8]
    for n in range(2):
        client.put_object(Bucket=s3_server.bucket, Key=f"{run}/src/p{n}.tfrecord", Body=_tfrecord(range(n * 10, n * 10 + 10)))
    src, dst = f"s3://{s3_server.bucket}/{run}/src", f"s3://{s3_server.bucket}/{run}/ds"
    query = f"?endpoint_override={s3_server.host}:{s3_server.port}&scheme=http"
    access: dict[str, Any] = {"storage_options": s3_server.storage_options()} if kind == "fsspec" else {}
    if kind == "query":
        src, dst = src + query, dst + query

    def append() -> int:
        return convert(src, dst, append=True, progress=False, **access).rows

    assert (append(), append()) == (20, 0)
    client.put_object(Bucket=s3_server.bucket, Key=f"{run}/src/p2.tfrecord", Body=_tfrecord(range(20, 25)))
    assert append() == 5
    assert sorted(int(r["id"]) for r in rows_of(dst, **access)) == list(range(25))
    client.put_object(Bucket=s3_server.bucket, Key=f"{run}/src/p0.tfrecord", Body=_tfrecord(range(10), tag=7))
    with pytest.raises(SourceChangedError, match=rf"s3://{s3_server.bucket}/{run}/src/p0.tfrecord \(\d+ bytes"):
        append()
    assert [int(r["tag"]) for r in rows_of(dst, **access)] == [0] * 25


def _cli_env(s3: Any) -> dict[str, str]:
    return {**os.environ, "AWS_ENDPOINT_URL": s3.endpoint_url, "AWS_ACCESS_KEY_ID": s3.key,
            "AWS_SECRET_ACCESS_KEY": s3.secret, "AWS_DEFAULT_REGION": "us-east-1"}


CLI = "import sys; from unihub.cli import main; sys.exit(main())"


def test_cli_s3_glob_to_s3_with_endpoint_from_env(s3_server: Any, sources_dir: Path, tmp_path: Path) -> None:
    local_src, upload_dir = write_source("tfrecord", sources_dir / "cli")
    run = uuid.uuid4().hex[:8]
    upload(s3_server, upload_dir, f"{run}/tfr")
    (tmp_path / "cwd").mkdir()
    out = f"s3://{s3_server.bucket}/{run}/out"
    done = subprocess.run([sys.executable, "-c", CLI, "convert", f"s3://{s3_server.bucket}/{run}/tfr/*.tfrecord",
                           out, "--quiet"], env=_cli_env(s3_server), cwd=tmp_path / "cwd", capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert list((tmp_path / "cwd").iterdir()) == []
    assert sorted(int(r["id"]) for r in rows_of(out, storage_options=s3_server.storage_options())) == list(range(12))
    done = subprocess.run([sys.executable, "-c", CLI, "verify", f"s3://{s3_server.bucket}/{run}/tfr", out],
                          env=_cli_env(s3_server), cwd=tmp_path / "cwd", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout


def test_cli_storage_option_and_url_query(s3_server: Any, sources_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                          nothing_local: None, capsys: pytest.CaptureFixture[str]) -> None:
    """The endpoint from ``--storage-option`` (nested key, JSON value) and from the URL's query."""
    local_src, upload_dir = write_source("webdataset", sources_dir / "query")
    run = uuid.uuid4().hex[:8]
    upload(s3_server, upload_dir, f"{run}/wds")
    base = f"s3://{s3_server.bucket}/{run}"
    assert main(["convert", f"{base}/wds/shard-{{0..1}}.tar", f"{base}/a", "--quiet",
                 "--storage-option", f"client_kwargs.endpoint_url={s3_server.endpoint_url}",
                 "--storage-option", "key=testing", "--storage-option", "secret=testing",
                 "--storage-option", "unihub_retries=1"]) == 0
    query = f"?endpoint_override={s3_server.host}:{s3_server.port}&scheme=http"
    assert main(["convert", f"{base}/wds/shard-*.tar{query}", f"{base}/b{query}", "--quiet"]) == 0
    options = {"storage_options": s3_server.storage_options()}
    assert_same_rows(rows_of(f"{base}/a", **options), rows_of(f"{base}/b", **options))


@pytest.mark.parametrize("what", ["bucket", "key", "glob", "dir"])
def test_bad_remote_paths_are_one_error_line(what: str, s3_server: Any, monkeypatch: pytest.MonkeyPatch,
                                             nothing_local: None, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    source = {"bucket": "s3://no-such-bucket-here/x.tfrecord",
              "key": f"s3://{s3_server.bucket}/no/such/key.tfrecord",
              "glob": f"s3://{s3_server.bucket}/no/such/*.tfrecord",
              "dir": f"s3://{s3_server.bucket}/no-such-dir/"}[what]
    code = main(["convert", source, f"s3://{s3_server.bucket}/bad-{what}", "--from", "tfrecord", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith("unihub: error:"), err
    assert source.rstrip("/").split("/")[-1] in err[0] or source in err[0], err
    assert keys(s3_server, f"bad-{what}") == [] and keys(s3_server, f".bad-{what}") == []


def test_a_scheme_is_never_a_local_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             sources_dir: Path) -> None:
    local_src, _ = write_source("tfrecord", sources_dir / "scheme")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsupportedFilesystemError, match="nosuchfs://bucket/out"):
        convert(local_src, "nosuchfs://bucket/out", progress=False)
    with pytest.raises(UnsupportedFilesystemError, match="nosuchfs://bucket/in"):
        convert("nosuchfs://bucket/in/a.tfrecord", tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# -- atomic overwrite on the object store ----------------------------------------------------------
def _dataset(n: int, start: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {"id": start + i, "x": np.full(64, start + i, np.float32)}


def _schema() -> Any:
    import pyarrow as pa

    from unihub import ScalarCodec, TensorCodec, Unischema, UnischemaField

    return Unischema("Kill", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                              UnischemaField("x", np.float32, (64,), TensorCodec(), False)])


KILL_CHILD = """
import sys
import numpy as np
import pyarrow as pa
from unihub import ScalarCodec, TensorCodec, Unischema, UnischemaField, write_dataset
schema = Unischema("Kill", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                            UnischemaField("x", np.float32, (64,), TensorCodec(), False)])
start = int(sys.argv[2])
rows = ({"id": start + i, "x": np.full(64, start + i, np.float32)} for i in range(400))
write_dataset(sys.argv[1], schema, rows, overwrite=True, rows_per_file=20,
              storage_options={"client_kwargs": {"endpoint_url": sys.argv[3]}, "key": "testing", "secret": "testing"})
"""


@pytest.mark.slow
def test_overwrite_on_s3_survives_kills(s3_server: Any, tmp_path: Path) -> None:
    """SIGKILL an overwrite to S3 at several moments: the dataset reads as the old or the new one in full,
    and the next run removes what the killed one left."""
    run = uuid.uuid4().hex[:8]
    url = f"s3://{s3_server.bucket}/{run}/ds"
    options = {"storage_options": s3_server.storage_options()}
    write_dataset(url, _schema(), _dataset(400, 0), rows_per_file=20, **options)
    versions = {tuple(range(400))}
    full = time.perf_counter()
    child = subprocess.run([sys.executable, "-c", KILL_CHILD, url, "1000", s3_server.endpoint_url],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    full = time.perf_counter() - full
    versions.add(tuple(range(1000, 1400)))
    seen = set()
    for trial, moment in enumerate(np.linspace(0.1, 1.4, 8)):  # past 1: the last kills come after the publish
        start = 2000 + 1000 * trial
        proc = subprocess.Popen([sys.executable, "-c", KILL_CHILD, url, str(start), s3_server.endpoint_url], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(moment * full)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        versions.add(tuple(range(start, start + 400)))
        ids = tuple(int(r["id"]) for r in rows_of(url, **options))
        assert ids in versions, f"kill at {moment:.2f} of a run: {len(ids)} rows of no single version"
        seen.add(ids)
    assert len(seen) >= 2  # some kills landed before the publish, some after
    write_dataset(url, _schema(), _dataset(400, 99000), rows_per_file=20, overwrite=True, **options)
    assert [int(r["id"]) for r in rows_of(url, **options)] == list(range(99000, 99400))
    from unihub.fs.filesystem import resolve_filesystem
    from unihub.fs.publish import read_manifest

    fs, path = resolve_filesystem(url, None, s3_server.storage_options())
    manifest = read_manifest(fs, path)
    assert manifest is not None
    left = keys(s3_server, f"{run}/")
    expected = {f"{run}/ds/{p}" for p in manifest.parts} | {f"{run}/ds/_common_metadata",
                                                           f"{run}/ds/{manifest.common_metadata}",
                                                           f"{run}/ds/_unihub_manifest.json"}
    assert set(left) == expected


@pytest.mark.parametrize("read_ahead_mb", [0, None])
def test_reader_opened_before_an_s3_overwrite_never_mixes(s3_server: Any, read_ahead_mb: float | None) -> None:
    """Without read-ahead the next read finds the files replaced; with it, the row groups it fetched before
    the overwrite (here, perhaps all) are the old dataset's: either way never a row of the new one."""
    run = uuid.uuid4().hex[:8]
    url = f"s3://{s3_server.bucket}/{run}/ds"
    options = {"storage_options": s3_server.storage_options()}
    write_dataset(url, _schema(), _dataset(100, 0), rows_per_file=10, row_group_size_mb=0.001, **options)
    ids: list[int] = []
    with make_batch_reader(url, shuffle_row_groups=False, workers_count=1, read_ahead_mb=read_ahead_mb,
                           **options) as reader:
        batches = iter(reader)
        ids.extend(int(i) for i in next(batches).id)
        write_dataset(url, _schema(), _dataset(100, 500), rows_per_file=10, row_group_size_mb=0.001, overwrite=True,
                      **options)
        try:
            for batch in batches:
                ids.extend(int(i) for i in batch.id)
        except DatasetChangedError:
            pass
        else:
            assert read_ahead_mb is None and sorted(ids) == list(range(100)), "the overwrite went unnoticed"
    assert all(i < 100 for i in ids)  # never a row of the new dataset
    assert [int(r["id"]) for r in rows_of(url, **options)] == list(range(500, 600))


def test_unpublished_parts_are_invisible_and_removed(s3_server: Any) -> None:
    """Parts a dead run copied in without publishing are not read, and the next write removes them;
    parts of a live run stay."""
    from unihub.fs import atomic

    run = uuid.uuid4().hex[:8]
    url = f"s3://{s3_server.bucket}/{run}/ds"
    options = {"storage_options": s3_server.storage_options()}
    write_dataset(url, _schema(), _dataset(30, 0), rows_per_file=10, **options)
    client = s3_server.client()
    first = keys(s3_server, f"{run}/ds/unihub-")[0]
    body = client.get_object(Bucket=s3_server.bucket, Key=first)["Body"].read()
    where = atomic.run_id().split("-")[0]
    dead = f"{run}/ds/unihub-{where}-999999999-1-abcdef-part-00000.parquet"
    live = f"{run}/ds/unihub-{atomic.run_id()}-part-00000.parquet"
    for key in (dead, live):
        client.put_object(Bucket=s3_server.bucket, Key=key, Body=body)
    assert [int(r["id"]) for r in rows_of(url, **options)] == list(range(30))
    write_dataset(url, _schema(), _dataset(30, 100), rows_per_file=10, overwrite=True, **options)
    left = keys(s3_server, f"{run}/ds/")
    assert dead not in left and live in left
    assert [int(r["id"]) for r in rows_of(url, **options)] == list(range(100, 130))


def test_metadata_updates_reach_the_published_copy(s3_server: Any) -> None:
    """Entries set in ``_common_metadata`` (row-group indexes, add-schema) are read back on S3, where
    readers read the copy the manifest names."""
    from unihub.store.dataset import update_common_metadata

    url = f"s3://{s3_server.bucket}/{uuid.uuid4().hex[:8]}/ds"
    options = {"storage_options": s3_server.storage_options()}
    write_dataset(url, _schema(), _dataset(10, 0), **options)
    update_common_metadata(open_dataset(url, **options), {b"unihub.test": b"kept"})
    assert open_dataset(url, **options).metadata[b"unihub.test"] == b"kept"
