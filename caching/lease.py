"""The build lease: of many processes asking for one cache at once, exactly one builds.

The lease is one small JSON object beside the cache, ``ROOT/<id>/<version>.lease``, holding its
owner (host, pid, process start time), a random token, when the build started and a heartbeat
the builder rewrites every ``HEARTBEAT_SECONDS``. It is taken by an exclusive create: ``O_EXCL``
on local disks, a conditional PUT (``If-None-Match: *``, through fsspec's ``"xb"`` mode) on S3 and
other object stores that support it. A lease is stale when its owner runs on this host and is
gone (a SIGKILLed builder: seen at once; one alive there holds its lease), or when its heartbeat is
older than ``stale_after`` seconds (a builder on another host). A waiter breaks a stale lease by deleting it after reading
the same token twice, then competes for a new one by exclusive create; the window where two
waiters both break the same stale lease and one deletes the other's new lease is between that
second read and the delete (milliseconds): the two then both build, each atomically, and the
cache holds one complete build.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs

from unihub.fs import atomic
from unihub.schema.metadata_json import parse_json

#: how often a builder rewrites its lease
HEARTBEAT_SECONDS = 5.0


@dataclass
class LeaseFiles:
    """Reads, writes and exclusive creates of small objects on one filesystem."""

    fs: pafs.FileSystem
    fsspec_fs: Any = None  # for conditional PUTs on object stores; None on local disks

    def read(self, path: str) -> dict[str, Any] | None:
        try:
            with self.fs.open_input_stream(path) as handle:
                data = handle.read()
        except (FileNotFoundError, OSError):
            return None
        try:
            record = parse_json(data)
        except ValueError:  # a heartbeat being rewritten: read again later
            return {}
        return record if isinstance(record, dict) else {}

    def write(self, path: str, record: dict[str, Any]) -> None:
        data = json.dumps(record).encode()
        if isinstance(self.fs, pafs.LocalFileSystem):
            temporary = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
            try:
                with open(temporary, "wb") as handle:
                    handle.write(data)
                os.replace(temporary, path)  # readers never see half a record
            except BaseException:  # a full disk: no temporary left per failed heartbeat
                if os.path.exists(temporary):
                    os.unlink(temporary)
                raise
            return
        with self.fs.open_output_stream(path) as handle:  # one PUT: atomic on object stores
            handle.write(data)

    def create(self, path: str, record: dict[str, Any]) -> bool:
        """Write ``record`` at ``path`` only if nothing is there; False if something was."""
        data = json.dumps(record).encode()
        if isinstance(self.fs, pafs.LocalFileSystem):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
            except BaseException:  # a full disk: an empty lease nobody could judge would block every caller
                os.unlink(path)
                raise
            return True
        if self.fsspec_fs is not None:
            try:
                with self.fsspec_fs.open(path, "xb") as handle:
                    handle.write(data)
                return True
            except FileExistsError:
                return False
            except (NotImplementedError, ValueError):  # no exclusive create here: check, then write
                pass
        if self.read(path) is not None:
            return False
        self.write(path, record)
        return (self.read(path) or {}).get("token") == record["token"]

    def delete(self, path: str) -> None:
        try:
            self.fs.delete_file(path)
        except FileNotFoundError:
            pass


def new_record() -> dict[str, Any]:
    """A lease record for this process."""
    now = time.time()
    return {"owner": atomic._owner(), "host": socket.gethostname(), "pid": os.getpid(),
            "token": uuid.uuid4().hex, "started": now, "heartbeat": now}


def is_stale(record: dict[str, Any], stale_after: float) -> bool:
    """Whether the lease's builder is gone: dead on this host, or on another host silent for ``stale_after`` s.

    A builder on this host is asked directly: alive, its lease holds however old its heartbeat (a
    heartbeat thread kept from the GIL, or ``stale_after`` below ``HEARTBEAT_SECONDS``, would otherwise
    start a second build of the same cache beside it)."""
    owner = str(record.get("owner", ""))
    where, _, rest = owner.partition("-")
    pid, _, start = rest.partition("-")
    if pid.isdigit() and start.isdigit() and where == atomic._owner().partition("-")[0]:
        return not atomic.owner_alive(where, int(pid), int(start))
    heartbeat = record.get("heartbeat")
    return isinstance(heartbeat, (int, float)) and time.time() - heartbeat > stale_after


def describe(record: dict[str, Any]) -> str:
    """Who holds a lease, for error messages."""
    started = record.get("started")
    beat = record.get("heartbeat")
    since = "?"
    if isinstance(started, (int, float)) and not isinstance(started, bool):
        try:
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
        except (OverflowError, OSError, ValueError):  # 1e300, NaN: a lease is another process's JSON
            pass
    ago = f"{time.time() - beat:.0f} s ago" if isinstance(beat, (int, float)) else "never"
    return f"pid {record.get('pid', '?')} on {record.get('host', '?')}, building since {since}, last heartbeat {ago}"


@dataclass
class Lease:
    """A held lease; ``release()`` when the build ends, whichever way."""

    files: LeaseFiles
    path: str
    record: dict[str, Any]
    interval: float = HEARTBEAT_SECONDS
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Lease:
        self._thread = threading.Thread(target=self._beat, name="unihub-cache-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            current = self.files.read(self.path)
            if current is None or (current and current.get("token") != self.record["token"]):
                return  # broken by a waiter that took us for dead: nothing more to renew
            self.record["heartbeat"] = time.time()
            try:
                self.files.write(self.path, self.record)
            except OSError:
                pass  # a missed beat; the next one may get through

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        current = self.files.read(self.path)
        if current is not None and current.get("token") == self.record["token"]:
            self.files.delete(self.path)


def try_acquire(files: LeaseFiles, path: str, *, interval: float = HEARTBEAT_SECONDS) -> Lease | None:
    """The lease at ``path`` if nobody holds it, heartbeat running; else None."""
    record = new_record()
    if not files.create(path, record):
        return None
    return Lease(files, path, record, interval).start()


def break_if_stale(files: LeaseFiles, path: str, record: dict[str, Any], stale_after: float) -> bool:
    """Delete the lease ``record`` if its builder is gone and it is still the same lease."""
    if not record or not is_stale(record, stale_after):
        return False
    again = files.read(path)
    if again is None or again.get("token") != record.get("token"):
        return False
    files.delete(path)
    return True
