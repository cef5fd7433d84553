"""TensorProto bytes (``formats/tfrecord/tensor_proto.py``) as TensorFlow writes them and as an attacker would: cut anywhere,
values of the wrong wire type, shapes whose padding would take all memory -- each a ``TensorProtoError``, and in a
conversion a ``FormatError`` naming file and record."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unihub.converters.convert import convert
from unihub.errors import FormatError
from unihub.formats.tfrecord.tensor_proto import MAX_PADDED_BYTES, TensorProtoError, parse_tensor

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")


def _tensor(value: Any) -> bytes:
    return tf.io.serialize_tensor(tf.constant(value)).numpy()


def _records(path: Path, records: list[bytes]) -> Path:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)
    return path


@pytest.mark.parametrize("value", [np.arange(6, dtype=np.int32).reshape(2, 3), [[b"a", b"bc"], [b"", b"d"]]])
def test_every_cut_of_a_tensor_parses_or_is_a_tensor_proto_error(value: Any) -> None:
    whole = _tensor(value)
    assert parse_tensor(whole).tolist() == np.asarray(value).tolist()
    for end in range(len(whole)):
        try:
            parse_tensor(whole[:end])
        except TensorProtoError:
            pass


def test_a_shape_cut_inside_a_varint_is_named() -> None:
    # dtype float; shape { dim { size = <varint cut short> } }
    with pytest.raises(TensorProtoError, match="malformed TensorProto: it ends inside a varint"):
        parse_tensor(b"\x08\x01\x12\x03\x12\x01\x08")
    with pytest.raises(TensorProtoError, match="it ends inside a varint"):
        parse_tensor(b"\x08\x01\x12\x01\x80")
    with pytest.raises(TensorProtoError, match="malformed TensorProto: truncated varint"):  # packed int_val
        parse_tensor(b"\x08\x03\x12\x04\x12\x02\x08\x01\x3a\x01\x80")


def test_a_conversion_names_the_file_and_record(tmp_path: Path) -> None:
    good = _tensor(np.arange(3, dtype=np.float32))
    cut = good[:2] + b"\x12\x03\x12\x01\x08"  # its shape ends inside a dimension's varint
    src = _records(tmp_path / "t.tfrecord", [good, good, cut])
    with pytest.raises(FormatError, match=r"t\.tfrecord: record 2 at byte offset \d+: malformed TensorProto: "
                                          "it ends inside a varint"):
        convert(src, tmp_path / "ds", progress=False)
    done = subprocess.run([sys.executable, "-m", "unihub.cli", "convert", str(src), str(tmp_path / "ds")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("unihub: error: ") and "record 2 at byte offset" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.tfrecord"]


@pytest.mark.parametrize("values, shape, dtype", [
    ([1.5], [4], tf.float32), ([7], [2, 3], tf.int64), ([b"a"], [3], tf.string), ([b"a", b"b"], [2, 2], tf.string),
    ([True], [5], tf.bool), ([0.25], [3], tf.float16),
])
def test_padded_values_read_as_tf_make_ndarray_reads_them(values: list[Any], shape: list[int], dtype: Any) -> None:
    proto = tf.make_tensor_proto(values, dtype=dtype, shape=shape)
    expected = tf.make_ndarray(proto)
    got = parse_tensor(proto.SerializeToString())
    assert got.dtype == expected.dtype and got.shape == expected.shape and got.tolist() == expected.tolist()


@pytest.mark.parametrize("dtype", [tf.float32, tf.string])
def test_a_shape_padding_would_blow_up_is_refused_at_once(dtype: Any) -> None:
    """A dozen bytes that claim 2**40 values: refused before anything is allocated (TensorFlow's own
    ``make_ndarray`` would fill them all)."""
    proto = tf.make_tensor_proto([b"a"] if dtype == tf.string else [1.5], dtype=dtype, shape=[2**20, 2**20])
    data = proto.SerializeToString()
    assert len(data) < 40
    before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic()
    with pytest.raises(TensorProtoError, match=rf"shape \(1048576, 1048576\) of \w+ needs \d+ bytes once its "
                                               rf"{len(data)} bytes are padded .* {MAX_PADDED_BYTES} bytes at most"):
        parse_tensor(data)
    assert time.monotonic() - start < 1.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB: nothing was filled


def test_verify_reads_the_same_bomb_with_tensorflow_in_bounded_memory(tmp_path: Path) -> None:
    """verify parses the source with TensorFlow's own messages, whose ``make_ndarray`` would fill the 2**40
    values: the same bound applies there, as a FormatError naming file and record."""
    from unihub.converters.verify import verify

    good = _tensor(np.arange(2, dtype=np.float32))
    convert(_records(tmp_path / "good.tfrecord", [good, good]), tmp_path / "ds", progress=False)
    bomb = tf.make_tensor_proto([1.5], dtype=tf.float32, shape=[2**20, 2**20]).SerializeToString()
    src = _records(tmp_path / "bomb.tfrecord", [good, bomb])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(FormatError, match=r"bomb\.tfrecord: record 1: shape \(1048576, 1048576\) of float32 needs "
                                          r"4398046511104 bytes"):
        verify(src, tmp_path / "ds")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 * 1024  # KiB
