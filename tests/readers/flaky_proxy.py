"""A proxy in front of moto's S3 server whose GETs of objects fail on a schedule, for the retry tests.

:class:`FlakyProxy` is :class:`~tests.readers.fault_servers.FaultProxy` (mode ``"pass"``) that counts
the GETs of objects (``object_gets``) and fails those that ``fail(n)`` (n counts from 0) names:

- ``"503"``: ``503 Slow Down`` with S3's XML error body (what S3 answers when throttling);
- ``"500"``: ``500 Internal Error``;
- ``"reset"``: the connection is reset (TCP RST) once the request is read, before any answer.

``fail_first(n, fault)``, ``fail_every(k, fault)``, ``fail_each_once(fault)`` (the first attempt of
each distinct request: object and byte range) and ``fail_always(fault)`` set the schedule;
``heal()`` passes everything again. ``failed`` counts the GETs failed on purpose. ``requests`` lists
``(client port, method, target)`` of every request, in order: which connection each came on.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable

from .fault_servers import FaultProxy

_REASONS = {"503": ("503 Slow Down", "SlowDown", "Please reduce your request rate."),
            "500": ("500 Internal Server Error", "InternalError", "We encountered an internal error.")}


class FlakyProxy(FaultProxy):
    """See the module docstring."""

    def __init__(self, upstream_port: int) -> None:
        self.object_gets = 0
        self.failed = 0
        self.requests: list[tuple[int, str, str]] = []
        self._schedule: Callable[[int, tuple[str, str]], str | None] = lambda n, request: None
        self._count_lock = threading.Lock()
        super().__init__(upstream_port)

    def fail_first(self, count: int, fault: str) -> None:
        start = self.object_gets
        self._schedule = lambda n, request: fault if n - start < count else None

    def fail_every(self, period: int, fault: str) -> None:
        self._schedule = lambda n, request: fault if n % period == period - 1 else None

    def fail_each_once(self, fault: str) -> None:
        seen: set[tuple[str, str]] = set()

        def schedule(n: int, request: tuple[str, str]) -> str | None:
            if request in seen:
                return None
            seen.add(request)
            return fault

        self._schedule = schedule

    def fail_always(self, fault: str) -> None:
        self._schedule = lambda n, request: fault

    def heal(self) -> None:
        self._schedule = lambda n, request: None

    def _answer(self, connection: socket.socket, method: str, target: str, headers: dict[str, str],
                body: bytes) -> bool:
        self.requests.append((connection.getpeername()[1], method, target))
        if method == "GET" and "/" in target.split("?")[0].strip("/"):
            with self._count_lock:
                number = self.object_gets
                self.object_gets += 1
                byte_range = next((v for k, v in headers.items() if k.lower() == "range"), "")
                fault = self._schedule(number, (target, byte_range))
                self.failed += fault is not None
            if fault == "reset":
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return False  # closed with linger 0: the client sees a connection reset
            if fault is not None:
                status, code, message = _REASONS[fault]
                error = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{message}"
                         f"</Message><RequestId>flaky</RequestId></Error>").encode()
                connection.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/xml\r\n"
                                   f"Content-Length: {len(error)}\r\n\r\n".encode() + error)
                return True
        return super()._answer(connection, method, target, headers, body)
