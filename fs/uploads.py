"""Multipart uploads that a failed write left open on S3, found and aborted.

Both S3 clients unihub writes through upload a file of more than one part (pyarrow's: 10 MB
parts; s3fs: :data:`UPLOAD_PART_BYTES`) as a multipart upload, and neither aborts it when the write
fails: pyarrow's stream completes it when closed (also from its destructor), s3fs leaves it open
when its last step fails. An open upload keeps its parts (billed, invisible to listings), and its
last step (CompleteMultipartUpload), when the server runs it after the client gave up on it (a
timeout, a retry arriving late), creates the object after unihub removed everything else. So a
failed write's cleanup aborts every upload still open under its staging prefix first
(:func:`abort_uploads`): a late completion then fails (``NoSuchUpload``) instead of creating a
file, and only then deletes what the write left (:func:`unihub.fs.filesystem.discard`).

Listing and aborting uploads needs an S3 API call that pyarrow's filesystem does not have: with
s3fs it goes through s3fs's own client, with pyarrow's filesystem through botocore (installed
with the ``fsspec`` extra) made with the same endpoint, credentials and timeouts; without
botocore, uploads are left to the bucket's lifecycle rule (and a late completion to the next run's
:func:`unihub.fs.publish.settle`).
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow.fs as pafs

from unihub.fs import remote

#: the size of the parts s3fs uploads a file in (its default, 50 MB, made one request of every part
#: file under 50 MB and read 50 MB ahead of every ranged read); S3 takes parts of 5 MiB and up
UPLOAD_PART_BYTES = 8 * 2**20
#: how far s3fs reads beyond what was asked, for a file opened for reading (ranged reads of what the
#: caller asks, plus this): one buffer of this size per open file
READ_AHEAD_BYTES = 2**20


def abort_uploads(fs: pafs.FileSystem, path: str) -> list[str]:
    """Abort the multipart uploads open on S3 for ``path`` or any key under it (``bucket/prefix``);
    returns their keys. Nothing for a filesystem that is not S3 (or an S3 without botocore)."""
    client = _client(fs)
    bucket, _, key = path.strip("/").partition("/")
    if client is None or not bucket or not key:
        return []  # never a whole bucket's uploads
    aborted = []
    for upload in _open_uploads(client, bucket, key):
        if upload["Key"] != key and not upload["Key"].startswith(key + "/"):
            continue  # a sibling whose name only starts like this one
        try:
            client("abort_multipart_upload", Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
        except Exception as exc:
            if "NoSuchUpload" not in f"{type(exc).__name__} {exc}":  # completed or aborted meanwhile: fine
                raise
        aborted.append(upload["Key"])
    return aborted


def uploading(fs: pafs.FileSystem, prefix: str) -> set[str]:
    """The paths (``bucket/key``) of the multipart uploads open on S3 whose key starts with ``prefix``
    (``bucket/start of a key``): what no listing of objects shows."""
    client = _client(fs)
    bucket, _, key = prefix.strip("/").partition("/")
    if client is None or not bucket or not key:
        return set()
    return {f"{bucket}/{upload['Key']}" for upload in _open_uploads(client, bucket, key)}


def _open_uploads(client: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
    """The uploads open in ``bucket`` under ``prefix``; none where the bucket is missing or the
    credentials may not list uploads (``s3:ListBucketMultipartUploads``: a cleanup does what it may)."""
    uploads: list[dict[str, Any]] = []
    options: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
    while True:
        try:
            page = client("list_multipart_uploads", **options)
        except Exception as exc:
            if isinstance(exc, (FileNotFoundError, PermissionError)) or any(
                    code in str(exc) for code in ("NoSuchBucket", "AccessDenied")):
                return uploads
            raise
        uploads += page.get("Uploads") or []
        if not page.get("IsTruncated"):
            return uploads
        options.update(KeyMarker=page.get("NextKeyMarker"), UploadIdMarker=page.get("NextUploadIdMarker"))


def _client(fs: pafs.FileSystem) -> Any:
    """``call(operation, **arguments)`` on the S3 API behind ``fs``, or None."""
    if isinstance(fs, getattr(pafs, "S3FileSystem", ())):
        return _botocore_client(fs)
    fsspec_fs = getattr(getattr(fs, "handler", None), "fs", None)
    if fsspec_fs is not None and remote.is_s3fs(fsspec_fs) and hasattr(fsspec_fs, "call_s3"):
        return fsspec_fs.call_s3
    return None


def _botocore_client(fs: pafs.FileSystem) -> Any:
    """A botocore S3 client reaching the store of pyarrow's ``fs`` (its endpoint, keys, region, timeouts);
    one per store and process (making one loads botocore's S3 model: 0.2-0.5 s)."""
    try:
        import botocore.config
        import botocore.session
    except ImportError:  # optional: comes with s3fs (the fsspec extra)
        return None
    options = dict(fs.__reduce__()[1][0])  # the constructor's keyword arguments, as pickling uses them
    endpoint = options.get("endpoint_override") or None
    if endpoint and "://" not in endpoint:
        endpoint = f"{options.get('scheme') or 'https'}://{endpoint}"
    timeout = max(options.get("request_timeout") or remote.DEFAULT_TIMEOUT, 0.1)
    keys = {}
    if options.get("access_key"):
        keys = {"aws_access_key_id": options["access_key"], "aws_secret_access_key": options.get("secret_key"),
                "aws_session_token": options.get("session_token") or None}
    anonymous = bool(options.get("anonymous"))
    cache_key = (os.getpid(), endpoint, options.get("region"), timeout, anonymous, tuple(sorted(keys.items())))
    client = _CLIENTS.get(cache_key)
    if client is None:
        config = botocore.config.Config(connect_timeout=timeout, read_timeout=timeout,
                                        retries={"mode": "standard", "total_max_attempts": 2},
                                        signature_version=botocore.UNSIGNED if anonymous else None)
        client = _CLIENTS[cache_key] = botocore.session.get_session().create_client(
            "s3", endpoint_url=endpoint, config=config, region_name=options.get("region") or None, **keys)

    def call(operation: str, **arguments: Any) -> Any:
        return getattr(client, operation)(**arguments)

    return call


#: botocore clients made by :func:`_botocore_client`, by process and store
_CLIENTS: dict[tuple[Any, ...], Any] = {}
