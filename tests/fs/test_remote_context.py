"""The driver's way to its stores (options, URL queries, environment), taken and put back around a task."""

from __future__ import annotations

import os
import pickle

import pytest

from unihub.fs import filesystem as fsutil
from unihub.fs import remote_context, sources


def test_the_drivers_context_is_in_place_within_the_block_and_gone_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "_ORIGINS", {})  # this test's URL queries stay in this test
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "driver-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "driver-secret")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    options = {"unihub_timeout": 7, "unihub_retries": 1}  # unihub's own: they leave the URL's query in force
    with sources.using(options):
        sources.without_query("s3://bucket-a/x/*.tfrecord?endpoint_override=127.0.0.1:9&scheme=http")
        context = pickle.loads(pickle.dumps(remote_context.capture()))  # it travels to executors
    assert context.storage_options == options
    assert context.origins[("s3", "bucket-a")] == "s3://bucket-a/?endpoint_override=127.0.0.1:9&scheme=http"
    assert context.environment == {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ENDPOINT_URL_S3": None,
                                   "AWS_ACCESS_KEY_ID": "driver-key", "AWS_SECRET_ACCESS_KEY": "driver-secret",
                                   "AWS_SESSION_TOKEN": None}  # no region group: the driver sets none

    # an executor: its own environment, another session token, no options, no origins
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "executor-token")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    sources._ORIGINS.clear()
    before = dict(os.environ), dict(sources._ORIGINS), fsutil.current_options()
    with remote_context.restored(context):
        assert fsutil.current_options() == options
        assert sources._ORIGINS[("s3", "bucket-a")].endswith("?endpoint_override=127.0.0.1:9&scheme=http")
        assert os.environ["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9"
        assert os.environ["AWS_ACCESS_KEY_ID"] == "driver-key"
        assert "AWS_SESSION_TOKEN" not in os.environ  # never the driver's key with the executor's token
        assert os.environ["AWS_REGION"] == "eu-west-3"  # a group the driver left alone
    assert (dict(os.environ), dict(sources._ORIGINS), fsutil.current_options()) == before


def test_a_task_that_fails_leaves_the_process_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UNIHUB_REMOTE_TIMEOUT", raising=False)
    context = remote_context.RemoteContext({"anon": True}, {}, {"UNIHUB_REMOTE_TIMEOUT": "3"})
    with pytest.raises(RuntimeError), remote_context.restored(context):
        assert os.environ["UNIHUB_REMOTE_TIMEOUT"] == "3"
        raise RuntimeError("the task failed")
    assert "UNIHUB_REMOTE_TIMEOUT" not in os.environ and fsutil.current_options() is None


def test_a_urls_query_holds_for_its_bucket_until_the_conversion_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "_ORIGINS", {})
    monkeypatch.setattr(sources, "_CACHE", {})
    with sources.using(None):
        assert sources.without_query("s3://bucket-b/x?endpoint_override=127.0.0.1:9&scheme=http") == "s3://bucket-b/x"
        assert sources._ORIGINS[("s3", "bucket-b")].endswith("?endpoint_override=127.0.0.1:9&scheme=http")
        sources.filesystem("s3://bucket-b/y")
    assert ("s3", "bucket-b") not in sources._ORIGINS  # a later conversion of s3://bucket-b/ is not sent there
    assert not sources._CACHE
