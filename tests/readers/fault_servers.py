"""A TCP proxy in front of moto's S3 server that fails on command, for the remote-fault tests.

Modes (``proxy.mode = ...``, switched at any time, also between an open and a read):

- ``"pass"``: every request goes to the server and the whole answer comes back;
- ``"freeze"``: connections are accepted and requests read, and nothing is ever answered (a hung
  server or a network that drops packets);
- ``"cut"``: a GET of an object gets its headers and half its body, then the connection closes
  (a server or load balancer that dies mid-answer); ``cut_next=n`` cuts only the next n such GETs
  and passes the rest (a transient fault);
- ``"dead"``: the listening socket and every open connection are closed: connecting is refused
  (a killed server; the port stays unused while the proxy is dead).

Two more faults, in any mode but ``"dead"`` and ``"freeze"``:

- ``bytes_per_second=r``: each request is answered ``len(body) / r`` seconds late (a slow link or a
  server slow to store what it is sent: time in proportion to the bytes of one request);
- ``late=(seconds, predicate)``: a request for which ``predicate(method, target)`` holds is passed to
  the server only ``seconds`` after it came, or as soon as :meth:`wait_late` is called, whichever comes
  first (the client has given up on it by then: a last step the server runs late; a test calls
  ``wait_late`` once the client's call has failed, rather than sleeping out ``seconds``);
  ``late_requests`` lists ``(method, target, status)`` of those passed on, and :meth:`wait_late`
  waits for them.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

MODES = ("pass", "freeze", "cut", "dead")


class FaultProxy:
    """HTTP/1.1 proxy on 127.0.0.1 to ``upstream_port``; see the module docstring."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.cut_next: int | None = None  # with mode "cut": how many GETs still to cut (None: all)
        self.bytes_per_second: float | None = None
        self.late: tuple[float, Callable[[str, str], bool]] | None = None
        self.late_requests: list[tuple[str, str, int]] = []
        self._late_pending = 0
        self._release_late = threading.Event()
        self._mode = "pass"
        self._lock = threading.Lock()
        self._connections: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self._listener.getsockname()[1]
        self._serve_forever()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        with self._lock:
            previous, self._mode = self._mode, mode
            connections, self._connections = self._connections, []
        for connection in connections:  # a new mode starts on fresh connections
            _close(connection)
        if mode == "dead":
            _close(self._listener)
        elif previous == "dead":
            self._listener = socket.create_server(("127.0.0.1", self.port), backlog=64)
            self._serve_forever()

    def close(self) -> None:
        self.mode = "dead"

    def wait_late(self, timeout: float = 30.0) -> None:
        """Pass every request held back by ``late`` to the server now, and wait until each is answered."""
        self._release_late.set()
        deadline = time.monotonic() + timeout
        while self._late_pending and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not self._late_pending, f"{self._late_pending} late requests still held"
        self._release_late.clear()

    # -- serving ----------------------------------------------------------------------------------
    def _serve_forever(self) -> None:
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # closed: the proxy is dead
                return
            with self._lock:
                self._connections.append(connection)
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        try:
            reader = connection.makefile("rb")
            while True:
                request = _read_request(reader, connection)
                if request is None or self._mode == "dead":
                    return  # (a connection accepted as the proxy died, after its connections were closed)
                if self._mode == "freeze":
                    continue  # read, never answered
                if not self._answer(connection, *request):
                    return
        except OSError:
            pass
        finally:
            _close(connection)

    def _answer(self, connection: socket.socket, method: str, target: str, headers: dict[str, str],
                body: bytes) -> bool:
        """Forward one request and send the answer back (cut if so asked); False: connection closed."""
        late = self.late
        held = late is not None and late[1](method, target)
        if held:
            with self._lock:
                self._late_pending += 1
            self._release_late.wait(late[0])  # type: ignore[index]
        elif self.bytes_per_second:
            time.sleep(len(body) / self.bytes_per_second)
        upstream = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=30)
        status = 0
        try:
            upstream.request(method, target, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            status = response.status
        finally:
            upstream.close()
            if held:
                with self._lock:
                    self.late_requests.append((method, target, status))
                    self._late_pending -= 1
        cut = self._should_cut(method, target, data)
        head = [f"HTTP/1.1 {response.status} {response.reason}"]
        head += [f"{k}: {v}" for k, v in response.getheaders() if k.lower() not in ("transfer-encoding", "connection")]
        if cut:
            head.append("Connection: close")
        connection.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (data[:len(data) // 2] if cut else data))
        return not cut

    def _should_cut(self, method: str, target: str, data: bytes) -> bool:
        is_object_get = method == "GET" and "/" in target.split("?")[0].strip("/") and len(data) > 1
        with self._lock:
            if self._mode != "cut" or not is_object_get:
                return False
            if self.cut_next is None:
                return True
            if self.cut_next <= 0:
                return False
            self.cut_next -= 1
            return True


def _read_request(reader: BinaryIO, connection: socket.socket) -> tuple[str, str, dict[str, str], bytes] | None:
    line = reader.readline()
    if not line.strip():
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        header = reader.readline().decode("latin-1")
        if header in ("\r\n", "\n", ""):
            break
        key, _, value = header.partition(":")
        headers[key.strip()] = value.strip()
    lower = {k.lower(): v for k, v in headers.items()}
    if lower.get("expect", "").lower() == "100-continue":  # as a server does (curl waits 1 s for it otherwise)
        connection.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        headers = {k: v for k, v in headers.items() if k.lower() != "expect"}
    if "chunked" in lower.get("transfer-encoding", ""):  # forwarded as it came, chunk framing and all
        body = b""
        while True:
            size_line = reader.readline()
            body += size_line
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, up to the empty line
                    trailer = reader.readline()
                    body += trailer
                    if trailer in (b"\r\n", b"\n", b""):
                        return method, target, headers, body
            body += reader.read(size + 2)
    return method, target, headers, reader.read(int(lower.get("content-length", 0) or 0))


def _close(sock: Any) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
