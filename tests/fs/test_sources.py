"""Foreign source files read from an object store (fs/sources.py): an object another writer replaces while it
is read in several requests is a DatasetChangedError, through pyarrow's S3 as through s3fs."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from unihub.errors import DatasetChangedError
from unihub.fs import sources

pytest.importorskip("moto")
pytest.importorskip("boto3")

SIZE = 3 * sources.READ_BUFFER + 123  # read in four requests


@pytest.mark.parametrize("kind", ["pyarrow", "fsspec"])
@pytest.mark.parametrize("replacement", ["same size", "larger"])
def test_an_object_replaced_while_read_is_a_dataset_change(s3_server: Any, kind: str, replacement: str) -> None:
    """pyarrow's ranged reads carry no ETag: the bytes read after the replacement were the new object's, the
    reader saw one file of both (a tar's members, an HDF5 file's chunks, with nothing to tell)."""
    if kind == "fsspec":
        pytest.importorskip("s3fs")
    client, key = s3_server.client(), f"sources-{uuid.uuid4().hex[:8]}/a.bin"
    client.put_object(Bucket=s3_server.bucket, Key=key, Body=b"\x01" * SIZE)
    url = f"s3://{s3_server.bucket}/{key}"
    if kind == "pyarrow":
        url += f"?endpoint_override={s3_server.host}:{s3_server.port}&scheme=http"
    with sources.using(s3_server.storage_options() if kind == "fsspec" else None):
        with pytest.raises(DatasetChangedError, match=rf"s3://{s3_server.bucket}/{key}: the object changed"):
            with sources.open_input(url) as handle:
                first = handle.read(sources.READ_BUFFER)
                time.sleep(1.1)  # a later second: the store's modification times are whole seconds
                client.put_object(Bucket=s3_server.bucket, Key=key,
                                  Body=b"\x02" * (SIZE if replacement == "same size" else 2 * SIZE))
                rest = handle.read()
                assert set(first) == {1}
                if kind == "pyarrow":
                    assert 2 in set(rest)  # what was read mixes both: refused when the file is closed


def test_an_object_read_whole_in_one_request_is_not_looked_at_again(s3_server: Any) -> None:
    """The check costs no request where one GET read the whole object (an image of an image folder)."""
    key = f"sources-{uuid.uuid4().hex[:8]}/small.bin"
    s3_server.client().put_object(Bucket=s3_server.bucket, Key=key, Body=b"x" * 1000)
    url = f"s3://{s3_server.bucket}/{key}?endpoint_override={s3_server.host}:{s3_server.port}&scheme=http"
    with sources.using(None):
        s3_server.requests.clear()
        with sources.open_input(url) as handle:
            assert handle.read() == b"x" * 1000
    assert s3_server.requests.entries[-1][0] == "GET", s3_server.requests.entries  # no look after the read


@pytest.mark.parametrize("files", [3, 12])
def test_total_size_of_remote_files(s3_server: Any, files: int) -> None:
    """A request per file where a folder holds few of them, one listing where it holds many; both sum the same."""
    client, prefix = s3_server.client(), f"sizes-{uuid.uuid4().hex[:8]}"
    for n in range(files):
        client.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/a/{n}.bin", Body=b"x" * (n + 1))
    client.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/b/other.bin", Body=b"x" * 1000)
    client.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/a/not-asked.bin", Body=b"x" * 1000)
    urls = [f"s3://{s3_server.bucket}/{prefix}/a/{n}.bin" for n in range(files)]
    with sources.using(s3_server.storage_options()):
        assert sources.total_size(urls + [f"s3://{s3_server.bucket}/{prefix}/b/other.bin",
                                          f"s3://{s3_server.bucket}/{prefix}/a/gone.bin"]) == \
            sum(range(1, files + 1)) + 1000
