"""Descriptors from forked children to their parent over the inherited socket (readers/fd_channel.py):
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

from unihub.errors import UsageError
from unihub.readers import fd_channel

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


def _send_until_refused(path: str, conn: Any) -> None:
    with open(path, "rb") as file:
        tokens = []
        while len(tokens) < 10_000:
            token = fd_channel.send(file.fileno())
            if token is None:
                break
            tokens.append(token)
    conn.send(tokens)


def _grandchild_sends(paths: list[str], conn: Any) -> None:
    conn.send(_in_child(_send_files, paths))


def _in_child(target: Any, *args: Any) -> Any:
    assert FORK is not None
    here, there = FORK.Pipe()
    child = FORK.Process(target=target, args=(*args, there))
    child.start()
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
    assert FORK is not None
    here, there = FORK.Pipe()
    child = FORK.Process(target=_send_files_and_wait, args=(files, there))
    child.start()
    could, tokens = here.recv()
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
    monkeypatch.setattr(fd_channel, "_CHANNEL", None)
    could, tokens = _in_child(_send_files, files[:1])
    assert not could and tokens == [None]  # the caller falls back to torch's way
    with pytest.raises(UsageError, match="did not fork the worker"):
        fd_channel.receive(b"1:00")


def test_a_grandchild_does_not_send_to_its_grandparent(files: list[str]) -> None:
    """The channel is its opener's: a child that forks without opening its own gives its children none."""
    fd_channel.open_here()
    could, tokens = _in_child(_grandchild_sends, files[:1])
    assert not could and tokens == [None]


def test_a_full_queue_refuses_the_descriptor_instead_of_blocking(files: list[str]) -> None:
    fd_channel.open_here()
    before = _open_fds()
    tokens = _in_child(_send_until_refused, files[0])
    assert 10 <= len(tokens) < 10_000  # the parent read none of them: the sender was refused, never blocked
    fd = fd_channel.receive(tokens[-1])  # what was queued still arrives
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
        from unihub.readers import fd_channel

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
            fd_channel.receive(token)
        except OSError as exc:
            assert exc.errno == errno.EMFILE and "too many open files" in str(exc), exc
            print("refused")
        here.send("done")
        process.join()
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "refused", out.stderr[-2000:]
