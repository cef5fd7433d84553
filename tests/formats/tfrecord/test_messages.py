"""What TFRecord conversions and ``unihub verify`` say: a feature of two kinds names a record of each,
verify names the file, record and feature of each difference, and TensorFlow's log lines stay out of
``unihub verify``'s output.

Every input is written by TensorFlow's own ``tf.io.TFRecordWriter``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from unihub.converters.convert import convert
from unihub.converters.verify import verify
from unihub.errors import SchemaError
from unihub.formats.tfrecord.format import TFRecordFormat
from unihub.formats.tfrecord.parsers import EXAMPLE_PARSERS

tf = pytest.importorskip("tensorflow")

REPO = Path(__file__).resolve().parents[3]


def _example(i: int, value: float | int, text: bytes = b"t") -> bytes:
    number = tf.train.Feature(float_list=tf.train.FloatList(value=[value, 0.25])) if isinstance(value, float) else \
        tf.train.Feature(int64_list=tf.train.Int64List(value=[value, 1]))
    return tf.train.Example(features=tf.train.Features(feature={
        "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])), "x": number,
        "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[text])),
    })).SerializeToString()


def _write(path: Path, records: list[bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)
    return path


# -- a feature of two kinds ---------------------------------------------------------------------
@pytest.fixture
def two_kinds(tmp_path: Path) -> Path:
    """``x`` is int64 in a.tfrecord and in b.tfrecord's first records, float from b.tfrecord's record 3 on."""
    _write(tmp_path / "src" / "a.tfrecord", [_example(i, i) for i in range(5)])
    _write(tmp_path / "src" / "b.tfrecord", [_example(i, i) if i < 3 else _example(i, i / 2) for i in range(6)])
    return tmp_path / "src"


@pytest.mark.parametrize("parser", list(EXAMPLE_PARSERS))
def test_a_feature_of_two_kinds_names_a_record_of_each(two_kinds: Path, parser: str) -> None:
    a, b = two_kinds / "a.tfrecord", two_kinds / "b.tfrecord"
    with pytest.raises(SchemaError, match=re.escape(f"feature 'x' holds float in some records ({b} record 3) and "
                                                    f"int64 in others ({a} record 0)")):
        TFRecordFormat(str(two_kinds), parser=parser).infer_schema()


def test_a_feature_of_two_kinds_in_forked_scans_and_the_cli(two_kinds: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    from unihub.cli import main

    b = two_kinds / "b.tfrecord"
    source = TFRecordFormat(str(two_kinds))
    source.workers = 2  # a file a process, the statistics merged
    with pytest.raises(SchemaError, match=re.escape(f"float in some records ({b} record 3) and int64 in others (")):
        source.infer_schema()
    assert main(["convert", str(two_kinds), str(tmp_path / "ds"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"float in some records ({b} record 3) and int64 in others ({two_kinds / 'a.tfrecord'} record 0)" in err


# -- verify names file, record and feature ------------------------------------------------------
def test_verify_names_the_file_record_and_feature_of_each_difference(tmp_path: Path) -> None:
    records = [[_example(i, i / 4) for i in range(4)], [_example(i, i / 4) for i in range(4, 9)]]
    for n, part in enumerate(records):
        _write(tmp_path / "src" / f"part-{n}.tfrecord", part)
    convert(tmp_path / "src", tmp_path / "ds")
    assert verify(tmp_path / "src", tmp_path / "ds").equal
    changed = [list(records[0]), list(records[1])]
    changed[1][2] = _example(6, 6 / 4 + 1)  # another float
    changed[1][4] = _example(8, 8 / 4, b"T")  # another byte
    for n, part in enumerate(changed):
        _write(tmp_path / "other" / f"part-{n}.tfrecord", part)
    report = verify(tmp_path / "other", tmp_path / "ds")
    assert not report.equal and "TensorFlow" in report.summary()
    assert [d.split(":")[0] for d in report.differences] == [
        "record 6 (part-1.tfrecord record 2), field 'features'/x",
        "record 8 (part-1.tfrecord record 4), field 'features'/text[0]"]
    assert report.differences[0].endswith("first at index (0,): 2.5 vs 1.5")


# -- TensorFlow's log lines ---------------------------------------------------------------------
_TF_LOG = re.compile(r"^[IWEF]\d{4} |absl::InitializeLog|cpu_feature_guard|rebuild TensorFlow", re.M)


def _cli_verify(src: Path, ds: Path, level: str | None) -> tuple[str, str, str]:
    """``unihub verify src ds`` in a fresh process: stdout, stderr, and the log level it ran TensorFlow at."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    if level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = level
    script = ("import os, sys\nfrom unihub.cli import main\nrc = main(sys.argv[1:])\n"
              "print('level', os.environ.get('TF_CPP_MIN_LOG_LEVEL'), 'tensorflow' in sys.modules)\nsys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", script, "verify", str(src), str(ds)], capture_output=True,
                          text=True, timeout=300, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    *out, last = done.stdout.strip().splitlines()
    return "\n".join(out), done.stderr, last


def test_verify_keeps_tensorflows_log_lines_out_and_a_users_level_in(tmp_path: Path) -> None:
    src = _write(tmp_path / "a.tfrecord", [_example(i, i) for i in range(3)])
    convert(src, tmp_path / "ds")
    out, err, level = _cli_verify(src, tmp_path / "ds", None)
    assert out.startswith("equal: 3 rows") and "TensorFlow" in out
    assert not _TF_LOG.search(err), err
    # level 3: errors too (TensorFlow's error lines, such as CUDA's on a machine without a GPU, repeat what
    # unihub's own message says, or nothing verify needs)
    assert level == "level 3 True"
    out, err, level = _cli_verify(src, tmp_path / "ds", "0")  # the user's own level wins
    assert out.startswith("equal: 3 rows") and level == "level 0 True"
    assert _TF_LOG.search(err), err


def test_tensorflows_import_noise_is_dropped_and_anything_else_written_kept(capfd: pytest.CaptureFixture[str]) -> None:
    """What TensorFlow's import writes to fd 2 before its logging reads TF_CPP_MIN_LOG_LEVEL (absl's notice, a
    C++ info line: on processors oneDNN tunes for) is dropped; any other line written there is passed on."""
    from unihub.formats.tfrecord import verify

    with verify._native_stderr_without(verify._TF_IMPORT_NOISE):
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n")
        os.write(2, b"I0000 00:00:1796628745.084954    2043 port.cc:153] oneDNN custom operations are on.\n")
        os.write(2, b"a line of its own\n")
    err = capfd.readouterr().err
    assert err == "a line of its own\n"
