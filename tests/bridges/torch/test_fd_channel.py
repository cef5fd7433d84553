"""Descriptors from forked children to their parent over the inherited socket (bridges/torch/fd_channel.py):
what arrives is the sender's file, a child without its parent's channel is told so, a full queue
refuses instead of blocking, and descriptors nobody asks for are closed once their sender exits."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from unihub.bridges.torch import fd_channel
from unihub.errors import UsageError

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or not Path("/proc/self/fd").exists(),
                                reason="forked children and /proc/self/fd (Linux)")
FORK = multiprocessing.get_context("fork") if hasattr(os, "fork") else None


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _send_files(paths: list[str], conn: Any) -> None:
    tokens = []
    for path in paths:
        with open(path, "rb") as file:  # closed at once: what travels is the descriptor's duplicate
            tokens.append(fd_channel.send(file.fileno()))
    conn.send((fd_channel.to_parent(), tokens))


def _send_files_and_wait(paths: list[str], conn: Any) -> None:
    _send_files(paths, conn)
    conn.recv()  # runs until the parent has received them, as a torch worker does


def _waiting_sender(paths: list[str]) -> tuple[Any, Any, bool, list[bytes]]:
    """A child that sends ``paths`` and runs until told (``conn.send``): (child, conn, could, tokens)."""
    assert FORK is not None
    here, there = FORK.Pipe()
    child = FORK.Process(target=_send_files_and_wait, args=(paths, there))
    child.start()
    assert here.poll(60), "the sender sent nothing"
    could, tokens = here.recv()
    return child, here, could, tokens


def _send_until_refused(path: str, conn: Any) -> None:
    with open(path, "rb") as file:
        tokens = []
        while len(tokens) < 100_000:
            token = fd_channel.send(file.fileno())
            if token is None:
                break
            tokens.append(token)
    conn.send(tokens)


def _grandchild_sends(paths: list[str], conn: Any) -> None:
    could, tokens = _in_child(_send_files, paths)  # this child opened a channel of its own as it forked
    fd = fd_channel.receive(tokens[0])
    conn.send((could, tokens, os.pread(fd, 100, 0)))
    os.close(fd)


def _in_child(target: Any, *args: Any) -> Any:
    assert FORK is not None
    here, there = FORK.Pipe()
    child = FORK.Process(target=target, args=(*args, there))
    child.start()
    assert here.poll(60), f"the child sent nothing (exit code {child.exitcode})"
    got = here.recv()
    child.join(10)
    assert child.exitcode == 0
    return got


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    paths = []
    for i in range(3):
        path = tmp_path / f"file{i}"
        path.write_bytes(f"contents of file {i}".encode())
        paths.append(str(path))
    return paths


def test_a_forked_child_hands_its_parent_the_files_it_opened(files: list[str]) -> None:
    fd_channel.open_here()
    child, here, could, tokens = _waiting_sender(files)
    assert could and all(tokens) and len(set(tokens)) == 3
    before = _open_fds()
    for i, token in reversed(list(enumerate(tokens))):  # in any order
        fd = fd_channel.receive(token)
        try:
            assert os.pread(fd, 100, 0) == f"contents of file {i}".encode()
        finally:
            os.close(fd)
    assert _open_fds() == before  # each received once, and closed by its receiver
    with pytest.raises(UsageError, match=rf"token {tokens[0].decode()}\) did not reach this process"):
        fd_channel.receive(tokens[0])  # each descriptor is received once
    here.send("done")
    child.join(10)
    assert child.exitcode == 0 and fd_channel.pending() == 0
    with pytest.raises(UsageError, match=rf"torch worker \(pid {child.pid}\) that sent a batch exited before"):
        fd_channel.receive(tokens[0])


def test_a_child_whose_parent_opened_no_channel_sends_nothing(files: list[str], monkeypatch) -> None:
    monkeypatch.setattr(fd_channel, "_OWN", None)
    could, tokens = _in_child(_send_files, files[:1])
    assert not could and tokens == [None]  # the caller falls back to torch's way
    with pytest.raises(UsageError, match="did not fork the worker"):
        fd_channel.receive(b"1:00")


def test_a_grandchild_sends_to_its_parent_not_to_its_grandparent(files: list[str]) -> None:
    """A child that inherited a channel and forks opens one of its own first (a rank forked from the
    process that built the dataset, forking its own DataLoader workers): its children send to it."""
    fd_channel.open_here()
    could, tokens, contents = _in_child(_grandchild_sends, files[:1])
    assert could and contents == b"contents of file 0"
    assert fd_channel.pending() == 0  # nothing reached the grandparent


def test_a_full_queue_refuses_the_descriptor_instead_of_blocking(files: list[str]) -> None:
    fd_channel.open_here()
    before = _open_fds()
    tokens = _in_child(_send_until_refused, files[0])
    assert 1000 <= len(tokens) < 100_000  # the parent read none: the sender was refused at last, never blocked
    fd = fd_channel.receive(tokens[0])  # what was queued still arrives
    os.close(fd)
    assert fd_channel.pending() == 0  # the rest, whose sender has exited, are closed
    assert _open_fds() == before


def test_descriptors_nobody_asks_for_are_closed_once_their_sender_exits(files: list[str]) -> None:
    fd_channel.open_here()
    before = _open_fds()
    _, tokens = _in_child(_send_files, files)
    assert len(tokens) == 3
    assert fd_channel.pending() == 0 and _open_fds() == before


def test_a_descriptor_that_does_not_fit_in_the_table_is_an_error_naming_the_limit(tmp_path: Path) -> None:
    """A parent at its open-file limit gets the token without its descriptor: asked for, that is an
    OSError(EMFILE) saying so, not a batch of the wrong memory or a hang. (In a subprocess: it
    lowers its own limit.)"""
    script = tmp_path / "full_table.py"
    script.write_text(textwrap.dedent(f"""
        import errno, multiprocessing, os, resource
        from unihub.bridges.torch import fd_channel

        def child(conn):
            with open({str(tmp_path / "script_data")!r}, "wb") as f:
                conn.send(fd_channel.send(f.fileno()))
            conn.recv()

        fd_channel.open_here()
        fork = multiprocessing.get_context("fork")
        here, there = fork.Pipe()
        process = fork.Process(target=child, args=(there,))
        process.start()
        token = here.recv()
        spare = os.open("/dev/null", os.O_RDONLY)  # the highest descriptor in use, then closed: the table is full
        resource.setrlimit(resource.RLIMIT_NOFILE, (spare, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        os.close(spare)
        try:
            fd_channel.pending()  # a sweep that meets it first notes it lost, as a receive would
            fd_channel.receive(token)
        except OSError as exc:
            assert exc.errno == errno.EMFILE and "too many open files" in str(exc), exc
            print("refused")
        here.send("done")
        process.join()
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "refused", out.stderr[-2000:]


def _held(paths: list[str]) -> list[str]:
    """Which of ``paths`` this process has a descriptor of."""
    inodes = {os.stat(path).st_ino: path for path in paths}
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            held.add(inodes.get(os.fstat(int(fd)).st_ino))
        except OSError:
            pass
    return sorted(p for p in held if p)


def _fds_open_on(paths: list[str], conn: Any) -> None:
    conn.send(_held(paths))


def test_descriptors_waiting_in_the_parent_are_not_inherited_by_its_later_children(files: list[str]) -> None:
    """What the parent took off the socket ahead of need is its own: a child forked meanwhile
    (another loader's worker) would keep that memory for its whole life."""
    fd_channel.open_here()
    sender, here, _, tokens = _waiting_sender(files)
    fd = fd_channel.receive(tokens[2])  # the first two wait in pending
    os.close(fd)
    try:
        assert fd_channel.pending() == 2
        assert _in_child(_fds_open_on, files) == []
    finally:
        here.send("done")
        sender.join(10)
    assert fd_channel.pending() == 0


def test_an_exited_sender_s_descriptors_behind_a_running_one_s_are_closed(files: list[str]) -> None:
    """A datagram of a running sender (a persistent loader's prefetched batch) at the head of the
    socket does not keep those of exited senders behind it: they are closed, it waits in pending."""
    fd_channel.open_here()
    live, here, _, live_tokens = _waiting_sender(files[:1])
    _, dead_tokens = _in_child(_send_files, files[1:])  # sent behind, and exited
    try:
        assert fd_channel.pending() == 1  # the running sender's, taken off on the way
        assert _held(files) == [files[0]] and len(dead_tokens) == 2
        fd = fd_channel.receive(live_tokens[0])
        assert os.pread(fd, 100, 0) == b"contents of file 0"
        os.close(fd)
    finally:
        here.send("done")
        live.join(10)
    assert fd_channel.pending() == 0


def test_the_environment_can_turn_the_channel_off(monkeypatch) -> None:
    """UNIHUB_FD_CHANNEL=0: no channel is opened, so workers hand their storages over torch's way."""
    monkeypatch.setattr(fd_channel, "_OWN", None)
    monkeypatch.setenv(fd_channel.ENVIRONMENT, "0")
    fd_channel.open_here()
    assert fd_channel._OWN is None
    monkeypatch.setenv(fd_channel.ENVIRONMENT, "1")
    fd_channel.open_here()
    assert fd_channel._OWN is not None and fd_channel._OWN.pid == os.getpid()


def test_a_sweep_takes_a_bounded_number_of_running_senders_descriptors(files: list[str]) -> None:
    """Past a running sender's datagrams a sweep takes at most SWEEP_ROOM of them into pending (the
    rest stay in the kernel), each closed on exec."""
    import fcntl

    fd_channel.open_here()
    sender, here, _, tokens = _waiting_sender(files * 70)  # 210 descriptors, the sender still running
    try:
        held = fd_channel.pending()
        assert 1 <= held <= fd_channel.SWEEP_ROOM < len(tokens)
        own = fd_channel._OWN
        assert own is not None
        assert all(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC for fd in own.pending.values())
        fd = fd_channel.receive(tokens[-1])  # behind the rest: taken off in order, as a receive does
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        os.close(fd)
    finally:
        here.send("done")
        sender.join(10)
    assert fd_channel.pending() == 0


def _send_junk_then_a_file(path: str, conn: Any) -> None:
    import socket

    channel = fd_channel._INHERITED
    assert channel is not None
    with open(path, "rb") as file:
        socket.send_fds(channel.child, [b"not a token"], [file.fileno()])
        socket.send_fds(channel.child, [b":"], [file.fileno()])
        conn.send(fd_channel.send(file.fileno()))


def test_datagrams_that_are_not_tokens_are_closed_not_fatal(files: list[str]) -> None:
    """Bytes on the socket that name no sender are taken for an exited sender's: their descriptors
    are closed, and the batch behind them still arrives."""
    fd_channel.open_here()
    before = _open_fds()
    token = _in_child(_send_junk_then_a_file, files[0])
    fd = fd_channel.receive(token)
    assert os.pread(fd, 100, 0) == b"contents of file 0"
    os.close(fd)
    assert fd_channel.pending() == 0 and _open_fds() == before
