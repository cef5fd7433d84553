"""S3 fixtures: moto's S3 server on 127.0.0.1, started once per session, with a request log
(``s3_server``, made a fixture of every test by tests/conftest.py).

Tests that use ``s3_server`` are skipped when moto or boto3 is not installed. The server
runs in a thread of the test process; every HTTP request it answers is recorded, so a
test can assert how many object reads (GETs of a key) a reader made.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

BUCKET = "unihub-test"


@dataclass
class RequestLog:
    """Requests the server answered: ``(method, path, range header)``."""

    entries: list[tuple[str, str, str | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

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

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
                            aws_access_key_id=self.key, aws_secret_access_key=self.secret)


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
