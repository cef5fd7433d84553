"""Query parameters of ``s3://`` and ``gs://`` URLs: those pyarrow's filesystems take work, any other is
refused by name (never by value: a query may hold a secret), in Python and on the command line."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from typing import Any

import numpy as np
import pytest

from unihub import Unischema, UnischemaField, write_dataset
from unihub.errors import InvalidArgumentError
from unihub.fs.filesystem import resolve_filesystem
from unihub.readers.reader import make_reader

SCHEMA = Unischema("UrlParameters", [UnischemaField("id", np.int64, ())])


@pytest.mark.parametrize("url", ["s3://bucket/ds?foo=1", "s3://bucket/ds?region=us-east-1&foo=1&access_key=SECRET",
                                 "gs://bucket/ds?foo=1"])
def test_an_unsupported_query_parameter_is_named(url: str) -> None:
    scheme = url.split(":")[0]
    with pytest.raises(InvalidArgumentError, match=rf"^{scheme}://bucket/ds: unsupported query parameter .*'foo'"
                                                   rf".*pyarrow's {scheme}:// filesystem takes .*endpoint_override"
                       ) as info:
        resolve_filesystem(url)
    assert "SECRET" not in str(info.value)
    with pytest.raises(InvalidArgumentError, match="unsupported query parameter"):
        make_reader(url)


def test_a_value_pyarrow_refuses_is_named() -> None:
    with pytest.raises(InvalidArgumentError, match=r"^s3://bucket/ds: a query parameter pyarrow refuses: .*'maybe'"):
        resolve_filesystem("s3://bucket/ds?region=us-east-1&allow_bucket_creation=maybe")


@pytest.mark.parametrize("command", [["inspect", "s3://bucket/ds?foo=1"],
                                     ["convert", "s3://bucket/ds?foo=1", "out"],
                                     ["convert", "SOURCE", "s3://bucket/ds?foo=1"]])
def test_the_cli_says_so_in_one_line(command: list[str], tmp_path: Any) -> None:
    source = tmp_path / "source"
    write_dataset(source, SCHEMA, ({"id": i} for i in range(3)))
    command = [str(source) if arg == "SOURCE" else str(tmp_path / arg) if arg == "out" else arg for arg in command]
    done = subprocess.run([sys.executable, "-m", "unihub.cli", *command], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "AWS_EC2_METADATA_DISABLED": "true"})
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("unihub: error: s3://bucket/"), done.stderr
    assert "unsupported query parameter 'foo'" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"]


def test_supported_parameters_reach_the_server(s3_server: Any) -> None:
    """A dataset written and read through a URL whose query alone points pyarrow at the server."""
    url = (f"s3://{s3_server.bucket}/{uuid.uuid4().hex}?endpoint_override={s3_server.host}:{s3_server.port}"
           "&scheme=http&region=us-east-1")
    write_dataset(url, SCHEMA, ({"id": i} for i in range(5)))
    with make_reader(url, shuffle_row_groups=False) as reader:
        assert sorted(row.id for row in reader) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("kind", ["fsspec", "pyarrow", "url"])
def test_a_hash_in_the_path_is_refused_not_cut(s3_server: Any, kind: str, tmp_path: Any) -> None:
    """URL parsing ends the path at '#': ``.../runs#3`` wrote and read ``.../runs``, another folder than the one
    named, through storage_options and filesystem= (and the endpoint of a query after it was lost)."""
    prefix = uuid.uuid4().hex
    url, access = _url_and_access(s3_server, kind, f"{prefix}/runs#3")
    with pytest.raises(InvalidArgumentError, match=rf"/{prefix}/runs#\.\.\.: a URL's path ends at '#'"):
        write_dataset(url, SCHEMA, ({"id": i} for i in range(3)), **access)
    with pytest.raises(InvalidArgumentError, match="a URL's path ends at '#'"):
        make_reader(url, **access)
    assert not s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix=prefix).get("Contents")
    with pytest.raises(InvalidArgumentError, match="a URL's path ends at '#'"):
        resolve_filesystem(f"file://{tmp_path}/runs#3")


@pytest.mark.parametrize("kind", ["fsspec", "pyarrow", "url"])
def test_a_key_is_taken_as_written_whichever_client(s3_server: Any, kind: str) -> None:
    """``%20`` and a space in a URL's key name the objects so named, through the URL's own query as through
    storage_options and filesystem=: pyarrow's URL parse decoded ``a%20b`` to ``a b`` (one URL, two objects by
    client) and refused a space as 'a query parameter pyarrow refuses'."""
    prefix = uuid.uuid4().hex
    for name in ("pct%20x", "a b"):
        url, access = _url_and_access(s3_server, kind, f"{prefix}/{name}")
        write_dataset(url, SCHEMA, ({"id": i} for i in range(3)), **access)
        with make_reader(url, shuffle_row_groups=False, **access) as reader:
            assert [row.id for row in reader] == [0, 1, 2]
    keys = {o["Key"].split("/")[1] for o in
            s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix=prefix)["Contents"]}
    assert keys - {""} == {"pct%20x", "a b"}  # "": the folder marker pyarrow's S3 filesystem writes


def _url_and_access(s3_server: Any, kind: str, key: str) -> tuple[str, dict[str, Any]]:
    """``s3://bucket/key`` and the keyword arguments reaching the server: ``kind`` "url" puts the endpoint in the
    URL's query (pyarrow's own parse), "fsspec"/"pyarrow" give storage_options / filesystem=."""
    url = f"s3://{s3_server.bucket}/{key}"
    if kind == "url":
        return f"{url}?endpoint_override={s3_server.host}:{s3_server.port}&scheme=http&region=us-east-1", {}
    return url, s3_server.access(kind)


@pytest.mark.parametrize("kind", ["fsspec", "pyarrow"])
def test_a_query_beside_storage_options_or_a_filesystem_is_refused(s3_server: Any, kind: str) -> None:
    """A URL's query is how pyarrow's filesystem is set; with storage_options or filesystem= it was dropped
    silently, so ``?endpoint_override=`` of another store read and wrote the one the options named."""
    prefix = uuid.uuid4().hex
    url = f"s3://{s3_server.bucket}/{prefix}/ds?endpoint_override=elsewhere:9&access_key=SECRET"
    access = s3_server.access(kind)
    given = "storage_options" if kind == "fsspec" else "a filesystem"
    match = rf"^s3://{s3_server.bucket}/{prefix}/ds: the URL's query \('access_key', 'endpoint_override'\) and {given}"
    with pytest.raises(InvalidArgumentError, match=match) as info:
        write_dataset(url, SCHEMA, ({"id": i} for i in range(3)), **access)
    assert "SECRET" not in str(info.value) and "elsewhere" not in str(info.value)
    with pytest.raises(InvalidArgumentError, match=match):
        make_reader(url, **access)
    assert not s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix=prefix).get("Contents")
    fs, path = resolve_filesystem(url.split("?")[0], **access)  # the URL alone names the same store
    assert path == f"{s3_server.bucket}/{prefix}/ds"


def test_unihub_settings_alone_keep_the_query() -> None:
    """``unihub_timeout``/``unihub_retries`` are not fsspec options: with only them the query still sets pyarrow's
    filesystem."""
    fs, path = resolve_filesystem("s3://bucket/ds?region=eu-west-1&scheme=http",
                                  storage_options={"unihub_timeout": 5})
    assert (path, fs.type_name, fs.region) == ("bucket/ds", "s3", "eu-west-1")


def test_gcs_retries_are_bounded_by_the_remote_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyarrow's GCS client retried an unreachable store for minutes, deaf to Ctrl-C and SIGTERM (`unihub show
    gs://...` without a network: killed with -9 after 14 minutes); its retries now end after the timeout times
    the attempts (UNIHUB_REMOTE_TIMEOUT / _RETRIES), unless the URL sets its own limit."""
    pytest.importorskip("pyarrow._gcsfs")
    monkeypatch.setenv("UNIHUB_REMOTE_TIMEOUT", "2")
    monkeypatch.setenv("UNIHUB_REMOTE_RETRIES", "1")
    fs, path = resolve_filesystem("gs://bucket/ds")
    assert path == "bucket/ds" and fs.__reduce__()[1][0]["retry_time_limit"].total_seconds() == 4
    fs, _ = resolve_filesystem("gs://bucket/ds?retry_limit_seconds=7")
    assert fs.__reduce__()[1][0]["retry_time_limit"].total_seconds() == 7


@pytest.mark.parametrize(("options", "said"), [
    ("client_kwargs.endpoint_url=http://127.0.0.1:9", None),  # well formed: reaches the store
    ("nonsense_option=1", "unexpected keyword argument 'nonsense_option'"),
    ("client_kwargs.endpoint_url=nothttp", "Invalid endpoint: nothttp"),
    ("client_kwargs=3", "AttributeError"),
    ("key=KEYONLY", "Partial credentials"),
])
def test_storage_options_s3fs_refuses_are_one_named_line(options: str, said: str | None, tmp_path: Any) -> None:
    """Storage options s3fs or botocore refuse are an InvalidArgumentError naming the URL, in Python and as one CLI
    line: they were a TypeError, ValueError or AttributeError from inside s3fs at the first request (a traceback
    in the CLI), or a PartialCredentialsError 'after the retries' telling to raise the timeout."""
    pytest.importorskip("s3fs")
    key, _, value = options.partition("=")
    nested = {key.split(".")[0]: {key.split(".")[1]: value}} if "." in key else {key: int(value) if value.isdigit()
                                                                                 else value}
    extra = {"unihub_timeout": 1, "unihub_retries": 0}
    if said is not None:
        with pytest.raises(InvalidArgumentError, match="^s3://bucket/ds: storage options that s3:// refuses"):
            resolve_filesystem("s3://bucket/ds", storage_options={**nested, **extra})
    done = subprocess.run([sys.executable, "-m", "unihub.cli", "show", "s3://bucket/ds", "--storage-option", options,
                           "--storage-option", "unihub_timeout=1", "--storage-option", "unihub_retries=0"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "AWS_EC2_METADATA_DISABLED": "true", "AWS_ACCESS_KEY_ID": "testing",
                               "AWS_SECRET_ACCESS_KEY": "testing"})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("unihub: error: s3://bucket/ds"), done.stderr
    if said is not None:
        assert said in lines[0], lines[0]


def test_storage_options_must_be_a_mapping() -> None:
    with pytest.raises(InvalidArgumentError, match="storage_options must be a mapping of fsspec's options, got str"):
        resolve_filesystem("s3://bucket/ds", storage_options="endpoint_url=http://127.0.0.1:9")  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["fsspec", "pyarrow"])
def test_a_refusal_of_the_credentials_names_the_url_and_the_credentials(s3_server: Any, kind: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 403 is a RemoteStorageError naming the URL and the credentials: through s3fs it was a bare
    PermissionError('Forbidden'), through pyarrow's S3 a failure 'after the retries' that told to raise the timeout."""
    from unihub import open_dataset
    from unihub.errors import RemoteStorageError

    url = f"s3://{s3_server.bucket}/{uuid.uuid4().hex}"
    write_dataset(url, SCHEMA, ({"id": i} for i in range(3)), storage_options=s3_server.storage_options())
    if kind == "fsspec":
        pytest.importorskip("s3fs")
        access: dict[str, Any] = {"storage_options": {"client_kwargs": {"endpoint_url": s3_server.endpoint_url},
                                                      "anon": True}}
    else:  # no credentials anywhere: moto refuses the unsigned requests
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
        url += f"?endpoint_override={s3_server.host}:{s3_server.port}&scheme=http&region=us-east-1"
        access = {}
    with pytest.raises(RemoteStorageError, match=rf"^s3://{s3_server.bucket}/.*: the remote store refused access "
                                                 r"\(.*\); check the credentials") as info:
        open_dataset(url, **access)
    assert "gave up after the retries" not in str(info.value)


@pytest.mark.parametrize("url", ["s3://AKIAKEY:SECRETXYZ@bucket/ds", "gs://user:SECRETXYZ@bucket/ds",
                                 "s3://AKIAKEY:SECRETXYZ@bucket/ds?endpoint_override=127.0.0.1:9&scheme=http"])
def test_credentials_in_the_url_are_refused_without_showing_them(url: str, tmp_path: Any) -> None:
    """pyarrow's URL form with credentials took 'KEY:SECRET@bucket' for the bucket: every call was a raw ArrowInvalid
    (a CLI traceback) showing the secret. It is an InvalidArgumentError that names the URL without them."""
    from unihub import convert, open_dataset

    calls = [lambda: resolve_filesystem(url), lambda: open_dataset(url),
             lambda: write_dataset(url, SCHEMA, ({"id": i} for i in range(3))),
             lambda: convert(str(tmp_path / "source"), url, to_format="tfrecord")]
    write_dataset(tmp_path / "source", SCHEMA, ({"id": i} for i in range(3)))
    for call in calls:
        with pytest.raises(InvalidArgumentError, match=r"^(s3|gs)://bucket/ds: credentials in the URL") as info:
            call()
        assert "SECRETXYZ" not in str(info.value)
    done = subprocess.run([sys.executable, "-m", "unihub.cli", "inspect", url], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "AWS_EC2_METADATA_DISABLED": "true"})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "credentials in the URL" in lines[0], done.stderr
    assert "SECRETXYZ" not in done.stderr + done.stdout
