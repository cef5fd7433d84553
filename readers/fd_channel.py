"""File descriptors from forked workers to the process that forked them, over one inherited socket.

torch hands a shared storage's descriptor to another process through ``multiprocessing``'s
resource sharer: the receiver opens a new connection to a thread the sender starts for it, with an
HMAC challenge each way, and waits while that thread waits for the GIL in a worker busy decoding
(1-2 ms each, 6-14 ms in the main process over an epoch of 20,000 rows with 2 workers). A process
that will iterate a torch ``DataLoader`` opens a channel first (:func:`open_here`: a datagram
socket pair, which the workers it forks inherit); a worker whose parent opened it sends each
descriptor as one datagram with a token (:func:`send`, ``SCM_RIGHTS``), before the batch that needs
it is written to torch's queue, and the parent picks it up by that token as it unpickles the batch
(:func:`receive`). No connection, no thread, no wait on the worker.

A worker without its parent's channel (spawned, forked from another process) or whose send fails
(the parent stopped reading: the socket's queue is full) uses torch's way, so this is only ever
faster. Descriptors the parent never asked for (the batches in flight when an iteration was
abandoned) are closed once their sender has exited, at the parent's next receive.
"""

from __future__ import annotations

import errno
import os
import socket
import threading

from unihub import processes
from unihub.errors import UsageError

#: bytes of a token at most: the sender's pid and 16 random hex digits
_TOKEN_BYTES = 64


class _Channel:
    """One process's receiving end (``parent``) and the end its forked workers send on (``child``)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.parent, self.child = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.parent.setblocking(False)
        self.child.setblocking(False)
        self.pending: dict[bytes, int] = {}  # token -> descriptor received and not yet asked for
        self.lost: set[bytes] = set()  # tokens that came without their descriptor
        self.lock = threading.Lock()


_CHANNEL: _Channel | None = None
_OPEN_LOCK = threading.Lock()


def _new_lock_after_fork() -> None:
    global _OPEN_LOCK
    _OPEN_LOCK = threading.Lock()  # a thread of the parent may have held it at the fork


os.register_at_fork(after_in_child=_new_lock_after_fork)


def open_here() -> None:
    """Open this process's channel (once): the workers it forks from now on send descriptors on it."""
    global _CHANNEL
    with _OPEN_LOCK:
        if _CHANNEL is None or _CHANNEL.pid != os.getpid():
            _CHANNEL = _Channel()


def to_parent() -> bool:
    """Whether this process can send descriptors to its parent: the parent opened a channel before forking it."""
    channel = _CHANNEL
    return channel is not None and channel.pid == os.getppid()


def send(fd: int) -> bytes | None:
    """Send a duplicate of ``fd`` to the parent: the token it is received by, or None where it could not go."""
    channel = _CHANNEL
    if channel is None or channel.pid != os.getppid():
        return None
    token = f"{os.getpid()}:{os.urandom(8).hex()}".encode()  # never one a dead worker with this pid sent
    try:
        socket.send_fds(channel.child, [token], [fd])
    except OSError:  # the queue is full (the parent is not reading), or descriptors cannot pass here
        return None
    return token


def receive(token: bytes) -> int:
    """The descriptor sent with ``token`` (the caller closes it), from this process's channel."""
    channel = _CHANNEL
    if channel is None or channel.pid != os.getpid():
        raise UsageError("a torch worker's batch was unpickled in a process that did not fork the worker: a "
                         "worker's batch is received by the process that iterates its DataLoader")
    with channel.lock:
        _drain(channel)
        fd = channel.pending.pop(token, None)
        lost = token in channel.lost
        channel.lost.discard(token)
        _close_orphans(channel)
    if lost:
        raise OSError(errno.EMFILE, "the shared memory of a torch worker's batch could not be received: this "
                                    "process has too many open files (raise `ulimit -n`)")
    if fd is None:
        raise UsageError(f"the shared memory a torch worker's batch was sent in (token {token.decode()}) did not "
                         "reach this process: a worker's batch is received by the process that iterates its DataLoader")
    return fd


def pending() -> int:
    """Descriptors received and not yet asked for, from senders still running (for tests)."""
    channel = _CHANNEL
    if channel is None or channel.pid != os.getpid():
        return 0
    with channel.lock:
        _drain(channel)
        _close_orphans(channel)
        return len(channel.pending)


def _drain(channel: _Channel) -> None:
    """Move every datagram waiting on the socket into ``pending``."""
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(channel.parent, _TOKEN_BYTES, 1)
        except BlockingIOError:
            return
        if not fds:  # its descriptor did not fit in this process's table (EMFILE): asked for, it is an error
            channel.lost.add(data)
            continue
        if data in channel.pending:  # a token is never sent twice; keep the first
            os.close(fds[0])
            continue
        channel.pending[data] = fds[0]


def _close_orphans(channel: _Channel) -> None:
    """Close the descriptors whose sender has exited: nothing will ask for them."""
    for token in [t for t in channel.pending if not processes.is_running(int(t.split(b":")[0]))]:
        os.close(channel.pending.pop(token))
