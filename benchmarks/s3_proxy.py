"""A local S3 server (moto, server mode) behind a proxy that makes it behave like a distant object store.

Used by ``benchmarks/streaming.py``; standard library only (and moto's ``moto_server`` script in
unihub's venv). The proxy forwards every request to moto over kept-alive connections and adds:

- ``latency`` seconds before each request is forwarded (a real store's time to first byte: S3 answers
  a GET in about 10-30 ms within a region);
- a bandwidth cap in bytes/s shared by all connections (a token bucket), on answers and on uploads;
- GETs of the objects it was told of (:meth:`Proxy.serve`) answered from the local files they were
  uploaded from, by byte range, with moto's ETag and date: moto reads a whole object for every ranged
  GET (23 ms of CPU for 16 KiB of a 45 MB object, 4 ms for a 4 MB one), a cost no real store has,
  which would charge tools that read one big object by many ranged GETs for the server's work on
  these 2 shared cores. Everything else (listings, HEADs, other requests) goes to moto;
- a log of requests: method, path, Range, bytes sent, start and end times, and the label of the tool
  running (``Proxy.label``), from which the benchmark counts GETs and bytes per tool and draws GET timelines.

Anyone may read from moto without signing requests (it checks no signatures by default), so tools
without an S3 client (WebDataset's ``pipe:curl``, fsspec's HTTP filesystem) read the same objects
through plain ``http://HOST:PORT/BUCKET/KEY`` URLs.
"""

from __future__ import annotations

import ctypes
import http.client
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_CHUNK = 256 << 10
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


@dataclass
class Request:
    """One request through the proxy."""

    label: str
    method: str
    path: str
    range: str | None
    status: int
    nbytes: int
    start: float
    end: float


class _Bucket:
    """A token bucket of ``rate`` bytes/s shared by every connection (None: no cap)."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self._lock = threading.Lock()
        self._next = time.monotonic()

    def take(self, nbytes: int) -> None:
        if not self.rate:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + nbytes / self.rate
            wait = self._next - now
        if wait > 0:
            time.sleep(wait)


class Proxy:
    """The latency/bandwidth proxy in front of ``upstream`` ("host:port"), served from a thread."""

    def __init__(self, upstream: str, latency: float = 0.0, bandwidth: float | None = None) -> None:
        self.upstream = upstream
        self.latency = latency
        self.bucket = _Bucket(bandwidth)
        self.label = ""
        self.log: list[Request] = []
        self.files: dict[str, tuple[Path, dict[str, str]]] = {}  # "/bucket/key" -> (local file, headers)
        self._log_lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-proxy", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def serve(self, objects: dict[str, Path]) -> None:
        """Answer GETs of ``objects`` ("/bucket/key" -> the local file uploaded there) from the files,
        with the ETag, Last-Modified and Content-Type moto gives them (one HEAD each, now)."""
        host, port = self.upstream.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        for path, local in objects.items():
            conn.request("HEAD", path)
            answer = conn.getresponse()
            answer.read()
            if answer.status != 200:
                raise RuntimeError(f"moto: HEAD {path}: {answer.status}")
            headers = {k: v for k, v in answer.getheaders() if k.lower() in ("etag", "last-modified", "content-type")}
            self.files[path] = (local, headers)
        conn.close()

    def record(self, request: Request) -> None:
        with self._log_lock:
            self.log.append(request)

    def take_log(self) -> list[Request]:
        """The requests since the last call (and forget them)."""
        with self._log_lock:
            log, self.log = self.log, []
        return log

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(proxy: Proxy) -> type[BaseHTTPRequestHandler]:
    local = threading.local()

    def upstream() -> http.client.HTTPConnection:
        conn = getattr(local, "conn", None)
        if conn is None:
            host, port = proxy.upstream.rsplit(":", 1)
            conn = local.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        return conn

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _forward(self) -> None:
            start = time.monotonic()
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if body:
                proxy.bucket.take(len(body))
            if proxy.latency:
                time.sleep(proxy.latency)
            served = proxy.files.get(self.path) if self.command == "GET" else None
            if served is not None:
                self._serve_file(start, *served)
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            answer = self._upstream_answer(headers, body)
            self.send_response_only(answer.status, answer.reason)
            for key, value in answer.getheaders():
                if key.lower() not in _HOP_BY_HOP:
                    self.send_header(key, value)
            self.end_headers()
            sent = 0
            if self.command != "HEAD":
                while True:
                    chunk = answer.read(_CHUNK)
                    if not chunk:
                        break
                    proxy.bucket.take(len(chunk))
                    self.wfile.write(chunk)
                    sent += len(chunk)
            self.wfile.flush()
            proxy.record(Request(proxy.label, self.command, self.path, self.headers.get("Range"),
                                 answer.status, sent, start, time.monotonic()))

        def _serve_file(self, start: float, local: Path, headers: dict[str, str]) -> None:
            size = local.stat().st_size
            first, last = _byte_range(self.headers.get("Range"), size)
            if first > last:
                self.send_response_only(416, "Range Not Satisfiable")
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            ranged = self.headers.get("Range") is not None
            self.send_response_only(206 if ranged else 200, "Partial Content" if ranged else "OK")
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(last - first + 1))
            if ranged:
                self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
            self.end_headers()
            sent = 0
            with open(local, "rb") as f:
                f.seek(first)
                while sent < last - first + 1:
                    chunk = f.read(min(_CHUNK, last - first + 1 - sent))
                    if not chunk:
                        break
                    proxy.bucket.take(len(chunk))
                    self.wfile.write(chunk)
                    sent += len(chunk)
            self.wfile.flush()
            proxy.record(Request(proxy.label, "GET", self.path, self.headers.get("Range"), 206 if ranged else 200,
                                 sent, start, time.monotonic()))

        def _upstream_answer(self, headers: dict[str, str], body: bytes | None) -> http.client.HTTPResponse:
            for attempt in range(2):  # a kept-alive connection moto closed: once more on a new one
                conn = upstream()
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    return conn.getresponse()
                except (http.client.HTTPException, OSError):
                    conn.close()
                    local.conn = None
                    if attempt:
                        raise
            raise AssertionError("unreachable")

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    return Handler


def _byte_range(header: str | None, size: int) -> tuple[int, int]:
    """(first, last) byte of a ``Range: bytes=a-b`` header (``a-``, ``-n`` too) in an object of ``size``."""
    if not header or not header.startswith("bytes="):
        return 0, size - 1
    first_text, _, last_text = header[len("bytes="):].split(",")[0].strip().partition("-")
    if not first_text:
        return max(0, size - int(last_text)), size - 1
    return int(first_text), min(size - 1, int(last_text)) if last_text else size - 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_us() -> None:
    """In the server's process before exec (Linux): SIGKILL it when the benchmark dies, however it dies
    (a benchmark killed by a timeout left moto servers behind)."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (AttributeError, OSError):
        pass


class MotoServer:
    """``moto_server`` on 127.0.0.1 in its own process (so its CPU is not the benchmark's), one bucket."""

    def __init__(self, moto: Path, bucket: str = "bench") -> None:
        self.port = free_port()
        self.bucket = bucket
        self._proc = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(self.port)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                      preexec_fn=_die_with_us)
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    self.close()
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)
        self._request("PUT", f"/{bucket}")

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> str:
        return f"http://{self.address}"

    def _request(self, method: str, path: str, body: Any = None, length: int | None = None) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        # public-read: tools without an S3 client (curl, fsspec's HTTP) GET the objects unsigned
        headers = {"Content-Length": str(length), "x-amz-acl": "public-read"} if length is not None else {}
        conn.request(method, path, body=body, headers=headers)
        answer = conn.getresponse()
        answer.read()
        conn.close()
        if answer.status >= 300:
            raise RuntimeError(f"moto: {method} {path}: {answer.status}")

    def upload_folder(self, folder: Path, prefix: str) -> dict[str, Path]:
        """Every file under ``folder`` as ``prefix/...`` in the bucket (unsigned PUTs); "/bucket/key" ->
        the local file, for each."""
        uploaded = {}
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file():
                key = f"/{self.bucket}/{prefix}/{path.relative_to(folder).as_posix()}"
                with open(path, "rb") as f:
                    self._request("PUT", key, body=f, length=os.fstat(f.fileno()).st_size)
                uploaded[key] = path
        return uploaded

    def close(self) -> None:
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()


def moto_script(python: str) -> Path:
    """The ``moto_server`` script beside ``python`` (unihub's venv), else on PATH."""
    beside = Path(python).parent / "moto_server"
    if beside.exists():
        return beside
    found = shutil.which("moto_server")
    if found is None:
        raise RuntimeError("moto_server is not installed (pip install 'moto[server]')")
    return Path(found)
