"""TFRecord files written by TensorFlow with GZIP or ZLIB compression, then cut short anywhere (in the gzip
header, in the first record, mid-file, in the trailer): ``convert``, ``inspect`` and ``verify`` each end in one
``unihub: error:`` line naming the file (and, once a record can be framed, its index and byte offset), exit 1,
nothing left behind and the source untouched -- whatever the file is named, so that format detection by
content (which tries every format, tarfile's included) sees the cut stream too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from unihub.cli import main

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")

RECORDS = 200


@pytest.fixture(scope="module", params=["GZIP", "ZLIB"])
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bytes, Path]:
    """``(compression, the file's bytes, a unihub dataset of the whole file)``."""
    root = tmp_path_factory.mktemp(f"tfrecord-{request.param}")
    path = root / "whole.tfrecord"
    with tf.io.TFRecordWriter(str(path), options=request.param) as writer:
        for i in range(RECORDS):
            feature = tf.train.Feature(int64_list=tf.train.Int64List(value=range(i, i + 40)))
            writer.write(tf.train.Example(features=tf.train.Features(feature={"x": feature})).SerializeToString())
    assert main(["convert", str(path), str(root / "whole_ds"), "--quiet"]) == 0
    return request.param, path.read_bytes(), root / "whole_ds"


def _one_error_line(capsys: pytest.CaptureFixture, command: list[str], source: Path) -> str:
    assert main(command) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"unihub: error: {source}: "), lines
    return lines[0]


@pytest.mark.parametrize("name", ["records.tfrecord", "records.gz", "records"])
@pytest.mark.parametrize("cut", [3, 10, 30, 60, 0.5, -4])
def test_a_cut_file_is_one_named_error(written: tuple[str, bytes, Path], name: str, cut: float, tmp_path: Path,
                                       capsys: pytest.CaptureFixture) -> None:
    compression, data, whole = written
    end = int(len(data) * cut) if isinstance(cut, float) else cut % len(data)
    source = tmp_path / name
    source.write_bytes(data[:end])
    framed = r"record \d+ at byte offset \d+: unreadable compressed stream \(.*(ended|ends) before"
    for extra in ([], ["--from", "tfrecord"]):
        line = _one_error_line(capsys, ["convert", str(source), str(tmp_path / "ds"), "--quiet", *extra], source)
        if extra or name.endswith(".tfrecord") or end > len(data) // 4:  # named or read as TFRecord: which
            assert re.search(framed, line), line  # record, and where
        else:  # too few bytes to tell a TFRecord by its contents
            assert re.search(framed, line) or "cannot tell its format from the name or contents; pass --from" in line
    _one_error_line(capsys, ["inspect", str(source)], source)
    _one_error_line(capsys, ["verify", str(source), str(whole)], source)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # nothing left behind
    assert source.read_bytes() == data[:end]  # the source untouched


def test_no_traceback_reaches_the_terminal(written: tuple[str, bytes, Path], tmp_path: Path) -> None:
    compression, data, _ = written
    source = tmp_path / "records"
    source.write_bytes(data[:30])  # the shortest cut: only format detection reads it
    done = subprocess.run([sys.executable, "-m", "unihub.cli", "convert", str(source), str(tmp_path / "ds")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"unihub: error: {source}: ") and "Traceback" not in done.stderr
