"""Disks that cannot take a conversion's output: a file too large (EFBIG), no space left (ENOSPC), a
read-only or forbidden destination (EROFS, EACCES). Through the CLI each is one ``unihub: error:``
line naming the destination, exit 1, and nothing left behind -- an HDF5 export included, which
crashed the interpreter (SIGSEGV) after HDF5 failed to close the file.

EFBIG is real: the conversion runs in a subprocess under ``RLIMIT_FSIZE`` with SIGXFSZ ignored.
ENOSPC and EROFS are simulated in-process here; EACCES is real where the tests do not run as root.
A real full disk (a tmpfs) for every writer: ``tests/test_full_disk.py``.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub import ScalarCodec, TensorCodec, Unischema, UnischemaField, write_dataset
from unihub.cli import main

resource = pytest.importorskip("resource")  # POSIX

Frames = Unischema("Frames", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("frame", np.float32, (64, 64), TensorCodec(), False),
])
LIMIT = 1 << 20  # bytes a file may have in the subprocess: a fifth of the output


@pytest.fixture()
def frames(tmp_path: Path) -> Path:
    """A 6.5 MB dataset of incompressible frames."""
    rng = np.random.default_rng(0)
    write_dataset(tmp_path / "src", Frames, ({"id": i, "frame": rng.random((64, 64), dtype=np.float32)}
                                             for i in range(400)))
    return tmp_path / "src"


def _left(tmp_path: Path) -> list[str]:
    """Everything in ``tmp_path`` but the source: outputs and temporaries."""
    return sorted(p.name for p in tmp_path.iterdir() if p.name != "src")


def _limit_file_size() -> None:
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


@pytest.mark.parametrize("target", ["out.h5", "out", "out.tfrecord", "shards.tar"])
def test_a_file_too_large_is_one_line_and_leaves_nothing(frames: Path, tmp_path: Path, target: str) -> None:
    dst = tmp_path / target
    done = subprocess.run([sys.executable, "-m", "unihub.cli", "convert", str(frames), str(dst), "--quiet"],
                          capture_output=True, text=True, timeout=300, preexec_fn=_limit_file_size)
    assert done.returncode == 1, (done.returncode, done.stderr[-3000:])  # HDF5: -11 (SIGSEGV) before
    assert re.match(rf"unihub: error: cannot write {re.escape(str(dst))}: File too large( \(\S+\))?; a file "
                    "reached the largest size", done.stderr), done.stderr[-3000:]
    assert done.stderr.count("\n") == 1
    assert _left(tmp_path) == []


def _no_space(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")


def test_no_space_left_is_one_line_naming_the_destination(frames: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(pq.ParquetWriter, "write_table", _no_space)
    dst = tmp_path / "out"
    assert main(["convert", str(frames), str(dst), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err == f"unihub: error: cannot write {dst}: No space left on device; free some space, or write elsewhere\n"
    assert _left(tmp_path) == []
    with pytest.raises(OSError, match="No space left on device"):  # --verbose: the exception, with its traceback
        main(["convert", str(frames), str(dst), "--quiet", "--verbose"])


@pytest.mark.parametrize(("code", "expected"), [
    (errno.EROFS, "Read-only file system ({temporary}); write elsewhere"),
    (errno.EACCES, "Permission denied ({temporary})")])
def test_a_destination_that_cannot_be_written_is_one_line(frames: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str], code: int,
                                                          expected: str) -> None:
    made = os.makedirs
    tried: list[str] = []

    def refuse(path: Any, *args: Any, **kwargs: Any) -> None:
        if os.path.basename(path).startswith(".out.tfrecord."):  # the export's temporary beside the target
            tried.append(str(path))
            raise OSError(code, os.strerror(code), str(path))
        made(path, *args, **kwargs)

    monkeypatch.setattr(os, "makedirs", refuse)
    dst = tmp_path / "out.tfrecord"
    assert main(["convert", str(frames), str(dst), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err == f"unihub: error: cannot write {dst}: {expected.format(temporary=tried[0])}\n"
    assert _left(tmp_path) == []


def test_a_forbidden_parquet_file_is_one_line(frames: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """pyarrow names the file in its message only: the line still names the destination and the file."""
    tried: list[str] = []

    def refuse(self: Any, where: Any, *args: Any, **kwargs: Any) -> None:
        tried.append(str(where))
        raise OSError(errno.EACCES, f"Failed to open local file '{where}'. Detail: [errno 13] Permission denied")

    monkeypatch.setattr(pq.ParquetWriter, "__init__", refuse)
    dst = tmp_path / "out"
    assert main(["convert", str(frames), str(dst), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err == f"unihub: error: cannot write {dst}: Permission denied ({tried[0]})\n"
    assert _left(tmp_path) == []


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_directory_is_one_line(frames: Path, tmp_path: Path) -> None:
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o555)
    try:
        done = subprocess.run([sys.executable, "-m", "unihub.cli", "convert", str(frames), str(tmp_path / "ro" / "out"),
                               "--quiet"], capture_output=True, text=True, timeout=300)
        assert os.listdir(tmp_path / "ro") == []
    finally:
        (tmp_path / "ro").chmod(0o755)
    assert done.returncode == 1
    assert done.stderr.startswith(f"unihub: error: cannot write {tmp_path / 'ro' / 'out'}: Permission denied")
    assert done.stderr.count("\n") == 1
