"""S3 end to end against moto's server: write, open, inspect and read through fsspec/s3fs and
through pyarrow's own S3 filesystem; the local-disk cache makes a second epoch read nothing remote.

The server (``s3_server`` in conftest.py) logs every request, so "no remote reads" is
checked where it matters: no GET of an object reached the server.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("moto")
pytest.importorskip("boto3")

from unihub import (  # noqa: E402
    DatasetChangedError,
    DatasetNotFoundError,
    Unischema,
    UnischemaField,
    open_dataset,
    write_dataset,
)
from unihub.cli import main  # noqa: E402
from unihub.readers.reader import make_batch_reader, make_reader  # noqa: E402

from .sample import assert_rows_equal, rows_by_id, sample_schema  # noqa: E402

N = 40
SCHEMA = sample_schema("S3Test")
WRITE_OPTIONS = {"row_group_size_mb": 0.001, "rows_per_file": 15}
FILESYSTEMS = ["fsspec", "pyarrow"]


def make_row(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    return {"id": i, "name": f"row-{i}", "score": None if i % 5 == 0 else float(np.float32(i / 3)),
            "vec": rng.random(3, dtype=np.float32), "boxes": rng.random((i % 3, 4), dtype=np.float32),
            "emb": rng.standard_normal(2)}


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("s3-local") / "ds"
    write_dataset(path, SCHEMA, (make_row(i) for i in range(N)), **WRITE_OPTIONS)
    return path


@pytest.fixture(scope="module")
def local_rows(local_dataset) -> dict[int, Any]:
    return rows_by_id(make_reader(local_dataset))


@pytest.fixture(scope="module")
def s3_url(s3_server, local_dataset) -> str:
    """The local dataset uploaded object by object with boto3."""
    prefix = f"uploaded-{uuid.uuid4().hex[:8]}"
    return s3_server.upload_folder(local_dataset, prefix)


def object_keys(s3_server: Any, prefix: str) -> list[str]:
    found = s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix=prefix).get("Contents", [])
    return sorted(entry["Key"] for entry in found)


# -- reading ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", FILESYSTEMS)
def test_make_reader_on_s3_equals_the_local_read(s3_server, s3_url, local_rows, kind):
    assert_rows_equal(rows_by_id(make_reader(s3_url, workers_count=4, **s3_server.access(kind))), local_rows)


@pytest.mark.parametrize("kind", FILESYSTEMS)
def test_make_batch_reader_on_s3_equals_the_local_read(s3_server, s3_url, local_dataset, kind):
    def columns(url: Any, **options: Any) -> dict[str, np.ndarray]:
        with make_batch_reader(url, shuffle_row_groups=False, **options) as reader:
            batches = list(reader)
        return {name: np.concatenate([getattr(b, name) for b in batches]) for name in ("id", "vec", "score")}

    expected = columns(local_dataset)
    for name, values in columns(s3_url, **s3_server.access(kind)).items():
        np.testing.assert_array_equal(values, expected[name])


@pytest.mark.parametrize("kind", FILESYSTEMS)
def test_open_dataset_on_s3(s3_server, s3_url, local_dataset, kind):
    store = open_dataset(s3_url, **s3_server.access(kind))
    local = open_dataset(local_dataset)
    assert store.schema == local.schema and store.schema_source == "unihub"
    assert store.num_rows == N and len(store.row_groups) == len(local.row_groups) > 3
    assert [f.size_bytes for f in store.files] == [f.size_bytes for f in local.files]


def test_inspect_on_s3(s3_server, s3_url, capsys, monkeypatch):
    url = f"{s3_url}?endpoint_override={s3_server.host}:{s3_server.port}&scheme=http"
    assert main(["inspect", url, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["rows"] == N and info["schema_name"] == "S3Test" and info["files"] == 3

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)  # the AWS SDK's own setting
    assert main(["inspect", s3_url]) == 0
    assert "S3Test" in capsys.readouterr().out


def test_cli_storage_options_reach_inspect_copy_and_add_schema(s3_server, s3_url, capsys, monkeypatch):
    """``--storage-option`` is the endpoint of every command: inspect ignored it (and asked AWS), copy and
    add-schema refused it."""
    # without the endpoint: no long wait on AWS; with it, moto on a loaded machine once took over 2 s to list
    monkeypatch.setenv("UNIHUB_REMOTE_TIMEOUT", "15")
    monkeypatch.setenv("UNIHUB_REMOTE_RETRIES", "1")
    options = [f"--storage-option=client_kwargs.endpoint_url={s3_server.endpoint_url}",
               f"--storage-option=key={s3_server.key}", f"--storage-option=secret={s3_server.secret}"]
    copy = f"s3://{s3_server.bucket}/copied-{uuid.uuid4().hex[:8]}"
    assert main(["inspect", s3_url, "--json", *options]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == N
    assert main(["copy", s3_url, copy, "--field-regex", "id", "vec", "--quiet", *options]) == 0
    assert main(["add-schema", copy, *options]) == 0
    capsys.readouterr()
    assert main(["inspect", copy, "--json", *options]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["rows"] == N and [f["name"] for f in info["fields"]] == ["id", "vec"]


@pytest.mark.parametrize("kind", FILESYSTEMS)
def test_missing_bucket_or_key_is_dataset_not_found(s3_server, kind):
    for url in (f"s3://{s3_server.bucket}/no-such-dataset", "s3://no-such-bucket/ds"):
        with pytest.raises(DatasetNotFoundError, match=url):
            open_dataset(url, **s3_server.access(kind))
        with pytest.raises(DatasetNotFoundError, match=url):
            make_reader(url, **s3_server.access(kind))


def test_inspect_missing_dataset_is_one_line(s3_server, capsys):
    url = f"s3://{s3_server.bucket}/no-such-dataset?endpoint_override={s3_server.host}:{s3_server.port}&scheme=http"
    assert main(["inspect", url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("unihub: error:") and "no-such-dataset" in err and err.count("\n") == 1


def test_a_foreign_file_is_detected_through_the_endpoint_of_its_url(s3_server):
    """detect_format keeps the URL's query (``endpoint_override``) for its bucket: it dropped it, so that
    ``unihub inspect`` of a missing dataset asked AWS instead of the given endpoint (6 s a format here,
    with no network) and never found what is there."""
    from unihub.formats.base import detect_format

    key = f"foreign-{uuid.uuid4().hex[:8]}/data"
    s3_server.client().put_object(Bucket=s3_server.bucket, Key=key, Body=b"\x89HDF\r\n\x1a\n" + bytes(504))
    url = f"s3://{s3_server.bucket}/{key}?endpoint_override={s3_server.host}:{s3_server.port}&scheme=http"
    s3_server.requests.clear()
    assert detect_format(url) == "hdf5"
    assert s3_server.requests.object_reads(f"{s3_server.bucket}/{key}")  # read from the given endpoint



def test_an_object_overwritten_while_read_through_s3fs_is_a_dataset_change(s3_server, tmp_path):
    """s3fs reads an object with the ETag it listed (``If-Match``); one overwritten meanwhile failed as a
    RemoteStorageError saying to raise the timeouts and retries. It is a DatasetChangedError, as on a
    local disk (tests/readers/test_snapshot.py), with no row of the new objects. Without read-ahead:
    its ranged reads (``cat_file``) carry no ETag."""
    schema = Unischema("Snap", [UnischemaField("id", np.int64, ())])
    prefix = f"snapshot-{uuid.uuid4().hex[:8]}"
    for name, first in (("old", 0), ("new", 100_000)):
        write_dataset(tmp_path / name, schema, [{"id": np.arange(first, first + 2000)}], batched=True,
                      rows_per_file=500, row_group_size_mb=0.001)
    url = s3_server.upload_folder(tmp_path / "old", prefix)
    ids: list[int] = []
    with make_reader(url, shuffle_row_groups=False, reader_pool_type="dummy", read_ahead_mb=0,
                     storage_options=s3_server.storage_options()) as reader:
        with pytest.raises(DatasetChangedError, match="changed since the dataset was opened.*open the dataset again"):
            for row in reader:
                ids.append(int(row.id))
                if len(ids) == 600:  # in the second file
                    s3_server.upload_folder(tmp_path / "new", prefix)
    assert ids[:600] == list(range(600)) and all(i < 100_000 for i in ids)


@pytest.mark.parametrize("kind", FILESYSTEMS)
@pytest.mark.parametrize("change", ["removed", "smaller", "larger"])
@pytest.mark.parametrize("read", ["row group", "read-ahead"])
def test_an_object_removed_or_replaced_after_the_open_is_a_dataset_change(s3_server, tmp_path, kind, change, read):
    """A part removed or replaced by another of another size after the dataset was opened is a
    DatasetChangedError naming it, through either client: through s3fs it was a FormatError ('cannot read row
    group 0: The specified key does not exist', or the old footer's offsets applied to the new bytes), through
    pyarrow's S3 a removed one read through the read-ahead failed 'after the retries' (its ranged reads carry no
    ETag)."""
    schema = Unischema("Gone", [UnischemaField("id", np.int64, ())])
    prefix = f"gone-{uuid.uuid4().hex[:8]}"
    sizes = {"removed": 0, "smaller": 50, "larger": 5000}
    for name, rows in (("old", 1000), ("new", sizes[change])):
        write_dataset(tmp_path / name, schema, [{"id": np.arange(100_000, 100_000 + rows)}], batched=True,
                      rows_per_file=rows or None, row_group_size_mb=0.001)
    url = s3_server.upload_folder(tmp_path / "old", prefix)
    store = open_dataset(url, **s3_server.access(kind))
    part = store.row_groups[0].path
    key = part.split("/", 1)[1]
    if change == "removed":
        s3_server.client().delete_object(Bucket=s3_server.bucket, Key=key)
    else:
        replacement = next((tmp_path / "new").glob("*.parquet")).read_bytes()
        s3_server.client().put_object(Bucket=s3_server.bucket, Key=key, Body=replacement)
    with pytest.raises(DatasetChangedError, match=f"{part.split('/')[-1]}.*(gone|changed) since"):
        if read == "row group":
            store.read_row_group(0)
        else:
            with make_batch_reader(store, shuffle_row_groups=False, reader_pool_type="dummy") as reader:
                assert reader.read_ahead is not None
                for _ in reader:
                    pass


# -- writing ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", FILESYSTEMS)
def test_write_dataset_to_s3(s3_server, local_rows, kind):
    prefix = f"written-{kind}-{uuid.uuid4().hex[:8]}"
    url = f"s3://{s3_server.bucket}/{prefix}"
    result = write_dataset(url, SCHEMA, (make_row(i) for i in range(N)), **WRITE_OPTIONS, **s3_server.access(kind))
    assert result.num_rows == N
    keys = object_keys(s3_server, prefix)
    assert f"{prefix}/_common_metadata" in keys and len([k for k in keys if k.endswith(".parquet")]) == 3
    assert not object_keys(s3_server, f".{prefix}"), "the temporary sibling was left behind"
    assert_rows_equal(rows_by_id(make_reader(url, **s3_server.access(kind))), local_rows)

    write_dataset(url, SCHEMA, (make_row(i) for i in range(5)), overwrite=True, **s3_server.access(kind))
    assert open_dataset(url, **s3_server.access(kind)).num_rows == 5
    assert not object_keys(s3_server, f".{prefix}")


# -- the local-disk cache over S3 -------------------------------------------------------------------
@pytest.mark.parametrize("kind", FILESYSTEMS)
def test_cache_second_epoch_makes_no_remote_reads(s3_server, s3_url, local_rows, tmp_path, kind):
    key_prefix = s3_url[len("s3://"):]
    cache = {"cache_type": "local-disk", "cache_location": str(tmp_path / "cache"), "cache_size_limit": 2**26,
             "cache_extra_settings": {"cleanup": False}}  # kept after the reader, for the next one
    reader = make_reader(s3_url, reader_pool_type="dummy", num_epochs=2, shuffle_row_groups=False, **cache,
                         **s3_server.access(kind))
    s3_server.requests.clear()
    with reader:
        first = {int(row.id): row for row in (next(reader) for _ in range(N))}
        assert s3_server.requests.object_reads(key_prefix), "the first epoch should read S3"
        s3_server.requests.clear()
        second = {int(row.id): row for row in reader}
    assert s3_server.requests.object_reads(key_prefix) == [], "the second epoch read S3"
    assert_rows_equal(first, local_rows)
    assert_rows_equal(second, local_rows)

    reader = make_reader(s3_url, workers_count=4, **cache, **s3_server.access(kind))  # a new reader, warm cache
    s3_server.requests.clear()
    assert_rows_equal(rows_by_id(reader), local_rows)
    assert s3_server.requests.object_reads(key_prefix) == []


@pytest.mark.parametrize("kind", FILESYSTEMS)
def test_cache_with_process_pool_on_s3(s3_server, s3_url, local_rows, tmp_path, kind):
    """The pool forks: s3fs refuses a forked instance (re-created from its options), the AWS SDK is re-used."""
    cache = {"cache_type": "local-disk", "cache_location": str(tmp_path / "cache"), "cache_size_limit": 2**26,
             "cache_extra_settings": {"cleanup": False}}  # kept after the reader, for the next one
    options = s3_server.access(kind)
    key_prefix = s3_url[len("s3://"):]
    cold = rows_by_id(make_reader(s3_url, reader_pool_type="process", workers_count=2, **cache, **options))
    reader = make_reader(s3_url, reader_pool_type="process", workers_count=2, **cache, **options)
    s3_server.requests.clear()
    warm = rows_by_id(reader)
    assert s3_server.requests.object_reads(key_prefix) == []
    assert_rows_equal(cold, local_rows)
    assert_rows_equal(warm, local_rows)
