"""File descriptors from forked workers to the process that forked them, over one inherited socket.

torch hands a shared storage's descriptor to another process through ``multiprocessing``'s
resource sharer: the receiver opens a new connection to a thread the sender starts for it, with an
HMAC challenge each way, and waits while that thread waits for the GIL in a worker busy decoding
(1-2 ms each, 6-14 ms in the main process over an epoch of 20,000 rows with 2 workers, and one per
field of every batch that torch's collate makes). A process that will iterate a torch ``DataLoader``
opens a channel first (:func:`open_here`: a datagram socket pair, which the workers it forks
inherit); a worker whose parent opened it sends each descriptor as one datagram with a token
(:func:`send`, ``SCM_RIGHTS``), before the batch that needs it is written to torch's queue, and the
parent takes it by that token as it unpickles the batch (:func:`receive`). No connection, no
thread, no wait on the worker.

- Only a worker whose parent opened the channel and is the process it works for sends on it (not a
  forkserver's child, nor a spawned one; a process that inherited a channel opens its own before it
  forks, so its children send to it); and only what goes
  to that parent (the caller decides: :mod:`~unihub.bridges.torch.shared_batches` marks torch's result
  queue). Anything else, and a send that fails (the socket's queue is full), goes torch's way.
- The parent takes datagrams off the socket in order until it has the one asked for; those ahead of
  it (another worker's, whose batch comes next) wait in ``pending``, in its descriptor table. The
  rest stay in the kernel, so the parent holds about a batch's descriptors per worker (and a sweep's
  :data:`SWEEP_ROOM` at most), not every descriptor in flight.
- Descriptors nobody will ask for (the batches in flight when an iteration was abandoned, or whose
  worker was killed) are closed once their sender has exited: looked for at most every
  :data:`REAP_SECONDS`, at a receive or after a garbage collection, so not only when another batch comes.
"""

from __future__ import annotations

import array
import errno
import gc
import multiprocessing
import os
import resource
import socket
import threading
import time
from typing import Any

from unihub.errors import UsageError
from unihub.runtime import processes

#: bytes of a token at most: the sender's pid and 16 random hex digits
_TOKEN_BYTES = 64
#: how often, at most, descriptors whose sender has exited are looked for
REAP_SECONDS = 1.0
#: descriptors a sweep takes into ``pending`` past a running sender's, to reach exited senders' behind them
SWEEP_ROOM = 64
#: received descriptors are closed on exec (a child started by ``os.system`` keeps none)
_CLOEXEC = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
_FD = array.array("i")


class _Channel:
    """One process's receiving end (``parent``) and the end its forked workers send on (``child``)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.parent, self.child = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.parent.setblocking(False)
        self.child.setblocking(False)
        try:  # room for many datagrams in flight (the kernel caps it at net.core.wmem_max)
            self.child.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
        except OSError:
            pass
        self.pending: dict[bytes, int] = {}  # token -> descriptor taken off the socket, not yet asked for
        self.lost: set[bytes] = set()  # tokens that came without their descriptor (this process's table was full)
        self.lock = threading.Lock()
        self.reaped_at = time.monotonic()


#: bytes asked for the sending end's buffer (the kernel doubles it, up to net.core.wmem_max; each datagram is
#: charged ~770 bytes: ~10,900 in flight here, against 278 at the default)
_SEND_BUFFER = 4 * 2**20
#: this process's own channel (it receives on it), and the one it inherited from its parent (it sends on it)
_OWN: _Channel | None = None
_INHERITED: _Channel | None = None
_OPEN_LOCK = threading.Lock()


_HELD_FOR_FORK: threading.Lock | None = None  # the receiving lock, held across a fork in the parent


def _before_fork() -> None:
    """A process that sends to its parent and forks workers of its own (a rank forked from a process
    that built the dataset, say) opens a channel for them first. A receive in another thread is let
    finish, so that no descriptor is in this process's table and not yet in ``pending`` (which the
    child closes) as it forks."""
    global _HELD_FOR_FORK
    if _INHERITED is not None and (_OWN is None or _OWN.pid != os.getpid()) and _OPEN_LOCK.acquire(blocking=False):
        try:
            _open()
        except OSError:  # no socket to be had (EMFILE): the children go torch's way
            pass
        finally:
            _OPEN_LOCK.release()
    own = _OWN
    if own is not None and own.pid == os.getpid() and own.lock.acquire(timeout=1.0):
        _HELD_FOR_FORK = own.lock


def _after_fork_in_parent() -> None:
    global _HELD_FOR_FORK
    if _HELD_FOR_FORK is not None:
        _HELD_FOR_FORK.release()
        _HELD_FOR_FORK = None


def _after_fork_in_child() -> None:
    """The parent's own channel is the child's way to it; what the parent had taken off it is not
    the child's (its copies of those descriptors would keep their memory for the child's lifetime)."""
    global _OWN, _INHERITED, _OPEN_LOCK, _HELD_FOR_FORK
    _OPEN_LOCK = threading.Lock()  # a thread of the parent may have held it at the fork
    _HELD_FOR_FORK = None  # (the parent's receiving lock: replaced below)
    parent = _OWN
    _OWN, _INHERITED = None, parent
    if parent is not None:
        for fd in parent.pending.values():
            os.close(fd)
        parent.pending = {}
        parent.lost = set()
        parent.lock = threading.Lock()
        parent.parent.close()  # the receiving end is the parent's alone


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


#: set to 0 to hand every storage over torch's way (an escape hatch, and the baseline of
#: benchmarks/torch_handover.py)
ENVIRONMENT = "UNIHUB_FD_CHANNEL"


def open_here() -> None:
    """Open this process's channel (once): the workers it forks from now on send descriptors on it."""
    with _OPEN_LOCK:
        _open()


def _open() -> None:
    global _OWN
    if os.environ.get(ENVIRONMENT, "1").strip() == "0":
        return
    if _OWN is None or _OWN.pid != os.getpid():
        if _after_collection not in gc.callbacks:  # (a forked child inherits the list)
            gc.callbacks.append(_after_collection)
        _OWN = _Channel()


def to_parent() -> bool:
    """Whether this process can send descriptors to the process it works for: its parent, which
    opened a channel before forking it (a forkserver's children have the forkserver as their parent
    but work for the process that asked for them: those use torch's way)."""
    channel = _INHERITED
    if channel is None or channel.pid != os.getppid():
        return False
    for_whom = multiprocessing.parent_process()
    return for_whom is None or for_whom.pid == channel.pid


def send(fd: int) -> bytes | None:
    """Send a duplicate of ``fd`` to the parent: the token it is received by, or None where it could not go."""
    channel = _INHERITED
    if channel is None or not to_parent():
        return None
    token = f"{os.getpid()}:{os.urandom(8).hex()}".encode()  # never one a dead worker with this pid sent
    try:
        socket.send_fds(channel.child, [token], [fd])
    except OSError:  # the queue is full (the parent is not reading), too many in flight, or no fd passing here
        return None
    return token


def receive(token: bytes) -> int:
    """The descriptor sent with ``token`` (the caller closes it), from this process's channel."""
    channel = _OWN
    if channel is None or channel.pid != os.getpid():
        raise UsageError("a torch worker's batch was unpickled in a process that did not fork the worker: a "
                         "worker's batch is received by the process that iterates its DataLoader")
    with channel.lock:
        fd = channel.pending.pop(token, None)
        lost = token in channel.lost
        if fd is None and not lost:
            fd = _take_until(channel, token)
            lost = token in channel.lost
        channel.lost.discard(token)
        if time.monotonic() - channel.reaped_at >= REAP_SECONDS:
            _reap(channel)
    if fd is not None:
        return fd
    if lost:
        raise OSError(errno.EMFILE, "the shared memory of a torch worker's batch could not be received: this "
                                    "process has too many open files (raise `ulimit -n`)")
    if not _sender_running(token):
        raise UsageError(f"the torch worker (pid {token.split(b':', 1)[0].decode(errors='replace')}) that sent a "
                         "batch exited before the batch was received; its shared memory is gone")
    raise UsageError(f"the shared memory a torch worker's batch was sent in (token {token.decode()}) did not "
                     "reach this process: a worker's batch is received by the process that iterates its DataLoader")


def pending() -> int:
    """Descriptors taken off the socket and not yet asked for, once those of exited senders are
    closed (for tests: it looks for them now)."""
    channel = _OWN
    if channel is None or channel.pid != os.getpid():
        return 0
    with channel.lock:
        _reap(channel)
        return len(channel.pending)


def _recv_one(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One datagram and its descriptor (none where it did not fit), received close-on-exec
    (``socket.recv_fds`` drops its ``flags`` before Python 3.13)."""
    data, ancillary, _, _ = sock.recvmsg(_TOKEN_BYTES, socket.CMSG_LEN(_FD.itemsize), _CLOEXEC)
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


def _names_a_sender(data: bytes) -> bool:
    """Whether ``data`` is a token (``<pid>:<hex>``) at all."""
    pid = data.split(b":", 1)[0]
    return pid.isdigit() and int(pid) > 0


def _sender_running(token: bytes) -> bool:
    """Whether the process a token names still runs (bytes that are not a token name none)."""
    return _names_a_sender(token) and processes.is_running(int(token.split(b":", 1)[0]))


def _file(channel: _Channel, data: bytes, fds: list[int], exited: bool) -> bool:
    """Put a datagram taken off the socket (not the one asked for) where it belongs: closed (its
    sender has exited, or a token seen before), lost (it came without its descriptor: the table was
    full), or waiting in ``pending``; True for the last."""
    if exited or data in channel.pending:
        for fd in fds:
            os.close(fd)
    elif not fds:
        channel.lost.add(data)
    else:
        channel.pending[data] = fds[0]
        return True
    return False


def _take_until(channel: _Channel, token: bytes) -> int | None:
    """Take datagrams off the socket until ``token``'s: its descriptor (None if the socket runs dry
    first, or it came without one); the others wait in ``pending``."""
    while True:
        try:
            data, fds = _recv_one(channel.parent)
        except BlockingIOError:
            return None
        if data == token and fds:
            return fds[0]
        # without its descriptor (EMFILE), a running sender's datagram is lost: asked for, that is an error
        _file(channel, data, fds, exited=not _names_a_sender(data) or (not fds and not _sender_running(data)))
        if data == token:
            return None


def _reap(channel: _Channel) -> None:
    """Close the descriptors of senders that have exited: those taken off the socket, then those
    still on it, taking up to :func:`_sweep_room` of running senders' into ``pending`` on the way (a
    live loader's batch waiting at the head hides nothing behind it). A datagram that comes without
    its descriptor (the table is full) is noted as lost and ends the sweep."""
    channel.reaped_at = time.monotonic()
    running: dict[bytes, bool] = {}

    def exited(token: bytes) -> bool:
        pid = token.split(b":", 1)[0]
        if pid not in running:
            running[pid] = _sender_running(token)
        return not running[pid]

    for token in [t for t in channel.pending if exited(t)]:
        os.close(channel.pending.pop(token))
    channel.lost = {t for t in channel.lost if not exited(t)}
    room = _sweep_room()
    taken = 0
    while True:
        try:
            head = channel.parent.recv(_TOKEN_BYTES, socket.MSG_PEEK)
        except BlockingIOError:
            return
        if not exited(head) and taken >= room:
            return
        try:
            data, fds = _recv_one(channel.parent)
        except BlockingIOError:
            return
        if _file(channel, data, fds, exited(data)):
            taken += 1
        elif not fds and not exited(data):  # lost: this process's table is full; no more now
            return


def _sweep_room() -> int:
    """How many running senders' descriptors a sweep may take: :data:`SWEEP_ROOM`, and at most a
    sixteenth of the open-file limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return SWEEP_ROOM if soft == resource.RLIM_INFINITY else max(1, min(SWEEP_ROOM, soft // 16))


def _after_collection(phase: str, info: dict[str, Any]) -> None:
    """A garbage collection (``gc.callbacks``): now and then, close what exited senders left, so
    that an iteration abandoned for good does not hold its shared memory until the next receive."""
    channel = _OWN
    if phase != "stop" or channel is None or channel.pid != os.getpid() \
            or time.monotonic() - channel.reaped_at < REAP_SECONDS:
        return
    if channel.lock.acquire(blocking=False):  # never waits (a collection may run inside a receive)
        try:
            _reap(channel)
        finally:
            channel.lock.release()
