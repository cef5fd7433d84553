"""TFRecord records that are not plain Examples: SequenceExamples, serialized tensors, opaque bytes;
and Examples whose empty lists and absent features must stay apart. Every input is written by
TensorFlow itself; every conversion is checked value by value, exported back, and verified against
TensorFlow's own reading."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from unihub import ScalarCodec, TensorCodec, Unischema, UnischemaField, make_reader, write_dataset
from unihub.cli import main
from unihub.converters.convert import convert
from unihub.converters.verify import verify
from unihub.errors import FormatError
from unihub.formats.tfrecord.format import PROVISIONAL_SAMPLE
from unihub.store.dataset import open_dataset

tf = pytest.importorskip("tensorflow")


def _records(path: Path, records: list[bytes], compression: str | None = None) -> Path:
    with tf.io.TFRecordWriter(str(path), options=compression) as writer:
        for record in records:
            writer.write(record)
    return path


def _read(path: Path) -> list[bytes]:
    return [r.numpy() for r in tf.data.TFRecordDataset(str(path))]


def _rows(dataset: Path) -> list[Any]:
    with make_reader(str(dataset), shuffle_row_groups=False) as reader:
        return list(reader)


def _left(tmp_path: Path, name: str) -> list[str]:
    return [p.name for p in tmp_path.iterdir() if name in p.name]


def _f(values: Any, kind: str) -> Any:
    if kind == "int64":
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    if kind == "float":
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))


# -- SequenceExample ------------------------------------------------------------------------------
def _sequence(i: int) -> bytes:
    context = {"id": _f([i], "int64"), "video": _f([f"clip-{i}".encode()], "bytes"),
               "length": _f([i % 4], "int64")}
    lists = {
        "frames": [_f([i + s, -s, 0.5], "float") for s in range(i % 4)],      # k = 3, some with 0 steps
        "labels": [_f([s * i], "int64") for s in range(i % 4 + 1)],          # one value a step
        "boxes": [_f([0.25] * (2 * (s % 3)), "float") for s in range(i % 3 + 1)],  # ragged
        "words": [_f([b"w%d" % j for j in range(s + 1)], "bytes") for s in range(i % 3)],  # ragged text
        "length": [_f([s], "int64") for s in range(2)],                       # collides with a context name
    }
    if i % 5 != 2:
        lists["raw"] = [_f([bytes([255, s, i % 256])], "bytes") for s in range(2)]  # not UTF-8; some records lack it
    # deterministic: map entries in key order in every record (else their order follows the process's hash seed,
    # records of one file differ, and the conversion rightly keeps each record's order in __feature_order__)
    return tf.train.SequenceExample(
        context=tf.train.Features(feature=context),
        feature_lists=tf.train.FeatureLists(feature_list={k: tf.train.FeatureList(feature=v) for k, v in lists.items()}),
    ).SerializeToString(deterministic=True)


@pytest.fixture
def sequences(tmp_path: Path) -> Path:
    return _records(tmp_path / "video.tfrecord", [_sequence(i) for i in range(23)])


def test_sequence_examples_keep_their_feature_lists(sequences: Path, tmp_path: Path) -> None:
    convert(sequences, tmp_path / "ds")
    schema = open_dataset(str(tmp_path / "ds")).schema
    shapes = {f.name: (np.dtype(f.numpy_dtype).name if f.numpy_dtype not in (np.str_, np.bytes_) else
                       f.numpy_dtype.__name__, f.shape, f.nullable) for f in schema}
    assert shapes == {
        "id": ("int64", (), False), "video": ("str_", (), False), "length": ("int64", (), False),
        "frames": ("float32", (None, 3), False), "labels": ("int64", (None,), False),
        "boxes": ("float32", (None, None), False), "words": ("str_", (None, None), False),
        "feature_lists/length": ("int64", (None,), False), "raw": ("bytes_", (None,), True),
    }
    rows = _rows(tmp_path / "ds")
    assert len(rows) == 23
    for i, row in enumerate(rows):
        source = tf.train.SequenceExample.FromString(_sequence(i))
        lists = source.feature_lists.feature_list
        assert row.id == i and row.video == f"clip-{i}" and row.length == i % 4
        expected_frames = np.array([list(f.float_list.value) for f in lists["frames"].feature], np.float32)
        assert row.frames.dtype == np.float32 and row.frames.shape == (i % 4, 3)
        np.testing.assert_array_equal(row.frames, expected_frames.reshape(-1, 3))
        assert row.labels.dtype == np.int64 and row.labels.tolist() == [s * i for s in range(i % 4 + 1)]
        assert [list(step) for step in row.boxes] == [[0.25] * (2 * (s % 3)) for s in range(i % 3 + 1)]
        assert row.words == [[f"w{j}" for j in range(s + 1)] for s in range(i % 3)]
        assert list(row.feature_lists_length) == [0, 1]
        assert row.raw == (None if i % 5 == 2 else [bytes([255, s, i]) for s in range(2)])
    report = verify(sequences, tmp_path / "ds")
    assert report.equal, report.summary()
    assert "TensorFlow" in report.summary()


def test_sequence_examples_export_back_equal(sequences: Path, tmp_path: Path) -> None:
    convert(sequences, tmp_path / "ds")
    assert main(["convert", str(tmp_path / "ds"), str(tmp_path / "back.tfrecord"), "--quiet"]) == 0
    back = [tf.train.SequenceExample.FromString(r) for r in _read(tmp_path / "back.tfrecord")]
    source = [tf.train.SequenceExample.FromString(r) for r in _read(sequences)]
    assert back == source
    report = verify(tmp_path / "ds", tmp_path / "back.tfrecord")
    assert report.equal, report.summary()


def test_sequence_examples_in_workers(tmp_path: Path) -> None:
    for part in range(3):
        _records(tmp_path / f"part-{part}.tfrecord", [_sequence(i) for i in range(part * 7, part * 7 + 7)], "GZIP")
    assert main(["convert", str(tmp_path / "part-*.tfrecord"), str(tmp_path / "ds"), "--workers", "2",
                 "--quiet"]) == 0
    assert [r.id for r in _rows(tmp_path / "ds")] == list(range(21))
    report = verify(str(tmp_path / "part-*.tfrecord"), tmp_path / "ds")
    assert report.equal, report.summary()


def _lists_only(i: int, context: bool) -> bytes:
    """A SequenceExample with feature lists and no context feature: TensorFlow writes no context field unless
    one was set (``context=tf.train.Features()``), which then is an empty one."""
    lists = tf.train.FeatureLists(feature_list={"x": tf.train.FeatureList(feature=[_f([i, s], "int64")
                                                                                    for s in range(i % 3)])})
    if context:
        return tf.train.SequenceExample(context=tf.train.Features(), feature_lists=lists).SerializeToString()
    return tf.train.SequenceExample(feature_lists=lists).SerializeToString()


@pytest.mark.parametrize("with_context", [False, True])
def test_sequence_examples_without_context_export_back_byte_for_byte(tmp_path: Path, with_context: bool) -> None:
    """The export wrote an empty context into every SequenceExample (``0a 00``), where TensorFlow writes none
    unless one was set: equal messages, other bytes. The ingest notes which the records hold."""
    records = [_lists_only(i, with_context) for i in range(7)]
    assert records[0].startswith(b"\n\x00") == with_context
    source = _records(tmp_path / "lists.tfrecord", records)
    convert(source, tmp_path / "ds")
    assert main(["convert", str(tmp_path / "ds"), str(tmp_path / "back.tfrecord"), "--quiet"]) == 0
    assert _read(tmp_path / "back.tfrecord") == records
    report = verify(source, tmp_path / "ds")
    assert report.equal, report.summary()


def test_sequence_examples_that_disagree_on_an_empty_context_say_so(tmp_path: Path) -> None:
    records = [_lists_only(i, i % 2 == 0) for i in range(6)]
    source = _records(tmp_path / "lists.tfrecord", records)
    result = convert(source, tmp_path / "ds")
    assert any("empty context" in note for note in result.notes), result.notes
    convert(tmp_path / "ds", tmp_path / "back.tfrecord")
    assert _read(tmp_path / "back.tfrecord") == [_lists_only(i, True) for i in range(6)]  # as the caveat says
    assert main(["convert", str(tmp_path / "ds"), str(tmp_path / "bare.tfrecord"), "--quiet",
                 "--option", "empty_context=false"]) == 0
    assert _read(tmp_path / "bare.tfrecord") == [_lists_only(i, False) for i in range(6)]


def _example(i: int) -> bytes:
    return tf.train.Example(features=tf.train.Features(feature={"id": _f([i], "int64")})).SerializeToString()


def test_a_file_mixing_examples_and_sequence_examples_is_refused(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    mixed = _records(tmp_path / "mixed.tfrecord", [_example(0), _example(1), _sequence(2), _example(3)])
    assert main(["convert", str(mixed), str(tmp_path / "ds"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mixed.tfrecord: record 2 at byte offset" in err
    assert "tf.train.SequenceExample (it has feature_lists), among tf.train.Examples" in err
    other = _records(tmp_path / "other.tfrecord", [_sequence(0), _sequence(1), _example(2)])
    with pytest.raises(FormatError, match=r"other\.tfrecord: record 2 at byte offset \d+: a tf\.train\.Example "
                                          r"\(no feature_lists\), among tf\.train\.SequenceExamples"):
        convert(other, tmp_path / "ds")
    assert not _left(tmp_path, "ds")
    # said explicitly: an Example is a SequenceExample without feature lists
    convert(other, tmp_path / "ds", format_options={"payload": "sequence_example"})
    rows = _rows(tmp_path / "ds")
    assert [r.id for r in rows] == [0, 1, 2] and rows[2].frames is None and rows[1].frames.shape == (1, 3)
    report = verify(other, tmp_path / "ds", options={"payload": "sequence_example"})
    assert report.equal, report.summary()


def test_verify_notices_lost_feature_lists(sequences: Path, tmp_path: Path) -> None:
    # what converting a SequenceExample file as Examples used to give: the context only
    schema = open_dataset(str(_converted(sequences, tmp_path / "full"))).schema
    context_only = schema.create_schema_view(["id", "video", "length"])
    (tmp_path / "schema.json").write_text(context_only.to_json())
    convert(tmp_path / "full", tmp_path / "lossy", schema=tmp_path / "schema.json")
    report = verify(sequences, tmp_path / "lossy")
    assert not report.equal
    assert report.differences[0] == ("record 0 (video.tfrecord record 0), field 'feature_lists'/boxes: "
                                     "expected [float32[0] []], found nothing (missing)")


def _converted(src: Path, dst: Path) -> Path:
    convert(src, dst)
    return dst


# -- TensorProto ----------------------------------------------------------------------------------
def _tensor(value: Any, dtype: Any = None) -> bytes:
    return tf.io.serialize_tensor(tf.constant(value, dtype=dtype)).numpy()


@pytest.mark.parametrize("make, dtype, shape", [
    (lambda i: np.arange(6, dtype=np.float32).reshape(2, 3) * i, "float32", (2, 3)),
    (lambda i: np.full((i % 3 + 1, 4), i, np.int64), "int64", (None, 4)),
    (lambda i: np.uint8(i), "uint8", ()),
    (lambda i: np.array([i % 2 == 0, True]), "bool", (2,)),
    (lambda i: np.float16(i) / 3, "float16", ()),
])
def test_serialized_tensors_become_a_tensor_field(tmp_path: Path, make: Any, dtype: str, shape: tuple) -> None:
    values = [make(i) for i in range(12)]
    src = _records(tmp_path / "t.tfrecord", [_tensor(v) for v in values])
    convert(src, tmp_path / "ds")
    field = open_dataset(str(tmp_path / "ds")).schema.tensor
    assert np.dtype(field.numpy_dtype).name == dtype and field.shape == shape
    for row, value in zip(_rows(tmp_path / "ds"), values):
        got = np.asarray(row.tensor)
        assert got.dtype == np.asarray(value).dtype and got.shape == np.shape(value)
        assert got.tobytes() == np.asarray(value).tobytes()
    report = verify(src, tmp_path / "ds")
    assert report.equal, report.summary()
    convert(tmp_path / "ds", tmp_path / "back.tfrecord")
    assert _read(tmp_path / "back.tfrecord") == _read(src)  # byte for byte what TensorFlow wrote


def test_string_tensors(tmp_path: Path) -> None:
    values = [[[b"a", b"bc"], [f"{i}".encode(), b""]] for i in range(5)]
    src = _records(tmp_path / "s.tfrecord", [_tensor(v) for v in values])
    convert(src, tmp_path / "ds")
    field = open_dataset(str(tmp_path / "ds")).schema.tensor
    assert field.numpy_dtype is np.str_ and field.shape == (2, 2)
    assert [r.tensor for r in _rows(tmp_path / "ds")][3] == [["a", "bc"], ["3", ""]]
    report = verify(src, tmp_path / "ds")
    assert report.equal, report.summary()
    convert(tmp_path / "ds", tmp_path / "back.tfrecord")
    assert _read(tmp_path / "back.tfrecord") == _read(src)


@pytest.mark.parametrize("make", [
    lambda i: np.arange(i % 3, dtype=np.int16) - 1,                  # one value (typed), or several, or none
    lambda i: np.array([i % 2 == 0] * (i % 3 + 1)),                  # bools: typed values always
    lambda i: np.float32(i) / 3,                                     # scalars: typed values
    lambda i: np.full((1, i % 2 + 1), i, np.float16),                # half_val, or tensor_content
    lambda i: np.array([2**64 - 1 - i], np.uint64),
])
def test_tensors_of_make_tensor_proto_export_back_byte_for_byte(tmp_path: Path, make: Any) -> None:
    """``tf.make_tensor_proto`` writes a tensor of one value, and every bool tensor, as typed values
    (``int_val``, ``bool_val``, ``half_val``, ...), where the export wrote ``tensor_content``: the same tensors,
    other bytes. The ingest notes which way the records were written, and the export writes them so."""
    records = [tf.make_tensor_proto(make(i)).SerializeToString() for i in range(6)]
    src = _records(tmp_path / "t.tfrecord", records)
    result = convert(src, tmp_path / "ds")
    assert not result.notes
    report = verify(src, tmp_path / "ds")
    assert report.equal, report.summary()
    convert(tmp_path / "ds", tmp_path / "back.tfrecord")
    assert _read(tmp_path / "back.tfrecord") == records
    assert main(["convert", str(tmp_path / "ds"), str(tmp_path / "plain.tfrecord"), "--quiet",
                 "--option", "tensor_encoding=serialize_tensor"]) == 0
    assert _read(tmp_path / "plain.tfrecord") == [_tensor(make(i)) for i in range(6)]


def test_tensors_written_neither_way_say_so(tmp_path: Path) -> None:
    versioned = tf.make_tensor_proto(np.arange(3, dtype=np.int32))
    versioned.version_number = 1
    src = _records(tmp_path / "t.tfrecord", [_tensor(np.arange(3, dtype=np.int32)), versioned.SerializeToString()])
    result = convert(src, tmp_path / "ds")
    assert any("written otherwise than tf.io.serialize_tensor and tf.make_tensor_proto(array)" in n
               for n in result.notes)
    # make_tensor_proto itself writes one value over a shape: the note said it did not
    broadcast = _records(tmp_path / "b.tfrecord", [tf.make_tensor_proto(1.5, shape=[3]).SerializeToString()] * 2)
    result = convert(broadcast, tmp_path / "bds")
    assert any("one value over a shape, as make_tensor_proto(value, shape=...) writes" in n for n in result.notes)
    assert verify(broadcast, tmp_path / "bds").equal


def test_tensors_of_different_dtypes_or_unstorable_ones_are_refused(tmp_path: Path) -> None:
    mixed = _records(tmp_path / "m.tfrecord", [_tensor([1.0]), _tensor([1.0]), _tensor([1], tf.int32)])
    with pytest.raises(FormatError, match=r"m\.tfrecord: record 2 at byte offset \d+ holds a int32 rank-1 tensor, "
                                          r"record 0 of .*m\.tfrecord a float32 rank-1 one"):
        convert(mixed, tmp_path / "ds")
    complex_ = _records(tmp_path / "c.tfrecord", [_tensor([1 + 2j])])
    for options in ({}, {"payload": "tensor"}):  # refused by its dtype, by name
        with pytest.raises(FormatError, match=r"c\.tfrecord: record 0 at byte offset 0: a tensor of dtype complex128, "
                                              "which has no exact numpy/Arrow equivalent"):
            convert(complex_, tmp_path / "ds", format_options=options)
    bfloat = _records(tmp_path / "bf.tfrecord", [_tensor([1.0], tf.bfloat16)])
    with pytest.raises(FormatError, match="record 0 at byte offset 0: a tensor of dtype bfloat16"):
        convert(bfloat, tmp_path / "ds")
    assert not _left(tmp_path, "ds")


# -- opaque records -------------------------------------------------------------------------------
def test_records_that_are_no_known_message_are_refused_or_kept_as_bytes(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    payloads = [b"plain text %d" % i for i in range(5)] + [bytes(range(256)), b""]
    src = _records(tmp_path / "raw.tfrecord", payloads)
    assert main(["convert", str(src), str(tmp_path / "ds"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "raw.tfrecord: record 0 at byte offset 0 is not a tf.train.Example, SequenceExample or TensorProto" in err
    assert "--option payload=bytes" in err and err.count("\n") == 1
    assert not _left(tmp_path, "ds")

    assert main(["convert", str(src), str(tmp_path / "ds"), "--option", "payload=bytes", "--quiet"]) == 0
    assert [r.record for r in _rows(tmp_path / "ds")] == payloads
    report = verify(src, tmp_path / "ds", options={"payload": "bytes"})
    assert report.equal, report.summary()
    convert(tmp_path / "ds", tmp_path / "back.tfrecord")
    assert _read(tmp_path / "back.tfrecord") == payloads


def test_empty_examples_are_never_a_silent_zero_row_dataset(tmp_path: Path) -> None:
    src = _records(tmp_path / "empty.tfrecord", [tf.train.Example().SerializeToString()] * 4)
    with pytest.raises(FormatError, match="all 4 records are empty tf.train.Examples"):
        convert(src, tmp_path / "ds")
    assert not _left(tmp_path, "ds")


# -- Examples: empty lists and absent features -----------------------------------------------------
def test_empty_lists_and_absent_features_stay_apart(tmp_path: Path) -> None:
    def example(i: int) -> bytes:
        feature = {"id": _f([i], "int64"),
                   "label": _f([i] if i % 3 else [], "int64"),       # one value or an empty list
                   "score": _f([i / 2] if i % 4 else [], "float")}   # ... and below, sometimes absent too
        if i % 5 == 0:
            del feature["score"]
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    src = _records(tmp_path / "e.tfrecord", [example(i) for i in range(20)])
    convert(src, tmp_path / "ds")
    schema = open_dataset(str(tmp_path / "ds")).schema
    assert schema.label.shape == () and schema.label.nullable
    assert schema.score.shape == (None,) and schema.score.nullable  # absent (None) and empty ([]) differ
    rows = _rows(tmp_path / "ds")
    assert [r.label for r in rows[:4]] == [None, 1, 2, None]
    assert rows[0].score is None and rows[4].score.tolist() == [] and rows[1].score.tolist() == [0.5]
    extra = open_dataset(str(tmp_path / "ds")).extra_metadata["tfrecord"]
    assert extra["empty_as_null"] == ["label"]
    report = verify(src, tmp_path / "ds")
    assert report.equal, report.summary()
    convert(tmp_path / "ds", tmp_path / "back.tfrecord")
    back = [tf.train.Example.FromString(r) for r in _read(tmp_path / "back.tfrecord")]
    assert back == [tf.train.Example.FromString(r) for r in _read(src)]


def test_verify_names_a_lost_field(tmp_path: Path) -> None:
    src = _records(tmp_path / "a.tfrecord", [tf.train.Example(features=tf.train.Features(feature={
        "id": _f([i], "int64"), "text": _f([b"x" * i], "bytes")})).SerializeToString() for i in range(3)])
    schema = {"format": "unihub.unischema", "version": 1, "name": "S", "fields": [
        {"name": "id", "dtype": "int64", "shape": [], "codec": {"type": "scalar", "arrow_type": "int64"},
         "nullable": False}]}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    with pytest.raises(FormatError, match="feature 'text': has no field in the schema, and its values would be lost"):
        convert(src, tmp_path / "ds", schema=tmp_path / "s.json")
    # left out on purpose (--option fields=id): converted, and verify names what the dataset lacks
    convert(src, tmp_path / "ds", schema=tmp_path / "s.json", format_options={"fields": ["id"]})
    report = verify(src, tmp_path / "ds")
    assert not report.equal
    assert report.differences[0] == ("record 0 (a.tfrecord record 0), field 'features'/text: "
                                     "expected [b''], found nothing (missing)")


# -- <name>/shape features ------------------------------------------------------------------------
def test_shape_features_are_kept_and_written_back(tmp_path: Path) -> None:
    def example(h: int) -> bytes:
        return tf.train.Example(features=tf.train.Features(feature={
            "img/data": _f(list(range(h * 6)), "float"), "img/data/shape": _f([h, 2, 3], "int64"),
            "fixed": _f([1, 2, 3, 4], "int64"), "fixed/shape": _f([2, 2], "int64"),     # always one shape
            "x": _f([1.0, 2.0, 3.0, 4.0], "float"), "x/shape": _f([2.0, 2.0], "float"),  # not int64: a field
            "b": _f([b"a", b"b"], "bytes"), "b/shape": _f([2], "int64"),                 # beside bytes: a field
            "n": _f([1, 2], "int64"), "n/shape": _f([-1, 2], "int64"),                   # negative: a field
        })).SerializeToString()

    src = _records(tmp_path / "shape.tfrecord", [example(h) for h in (1, 2, 3)])
    convert(src, tmp_path / "ds")
    schema = open_dataset(str(tmp_path / "ds")).schema
    assert schema["img/data"].shape == (None, 2, 3) and schema.fixed.shape == (2, 2)
    assert {"x/shape", "b/shape", "n/shape"} <= set(schema.fields) and "img/data/shape" not in schema.fields
    rows = _rows(tmp_path / "ds")
    assert rows[1]._asdict()["img/data"].shape == (2, 2, 3) and rows[0]._asdict()["x/shape"].tolist() == [2.0, 2.0]
    report = verify(src, tmp_path / "ds")
    assert report.equal, report.summary()
    convert(tmp_path / "ds", tmp_path / "back.tfrecord")
    back = [tf.train.Example.FromString(r) for r in _read(tmp_path / "back.tfrecord")]
    assert back == [tf.train.Example.FromString(r) for r in _read(src)]  # the /shape features included
    assert verify(src, tmp_path / "back.tfrecord").equal  # two TFRecord files: both read by TensorFlow


@pytest.mark.parametrize("case", ["constant", "late", "negative"])
def test_a_shape_feature_that_does_not_count_the_values_is_a_field(tmp_path: Path, case: str) -> None:
    """``x/shape`` says 2x2 where ``x`` holds 3 values: it is not ``x``'s shape, so both are fields (the
    conversion was refused: "expected 4 values for shape (2, 2), found 3"). ``late``: only one record past
    the 1,000 the conversion starts from disagrees, so it starts over with the full schema. ``negative``: a
    ``x/shape`` field (a negative size) beside a varying ``x`` was still read as ``x``'s shape."""
    def example(n: int, shape: list[int]) -> bytes:
        return tf.train.Example(features=tf.train.Features(feature={
            "x": _f([1.0] * n, "float"), "x/shape": _f(shape, "int64")})).SerializeToString()

    records = {"constant": [example(3, [2, 2])] * 5,
               "late": [example(4, [2, 2])] * (PROVISIONAL_SAMPLE + 5) + [example(3, [2, 2])],
               "negative": [example(i % 2 + 1, [-1, 2]) for i in range(5)]}[case]
    src = _records(tmp_path / "x.tfrecord", records)
    convert(src, tmp_path / "ds")
    schema = open_dataset(str(tmp_path / "ds")).schema
    assert schema.x.shape == ((3,) if case == "constant" else (None,)) and schema["x/shape"].shape == (2,)
    assert verify(src, tmp_path / "ds").equal
    convert(tmp_path / "ds", tmp_path / "back.tfrecord")
    assert _read(tmp_path / "back.tfrecord") == records


@pytest.mark.parametrize("payload", ["example", "sequence_example"])
def test_verify_names_float64_values_an_export_rounds_to_float32(tmp_path: Path, payload: str) -> None:
    """An export writes a float64 field in TFRecord's float32 list, as ``tf.train.FloatList`` holds it;
    verify compared that rounding with itself and said "equal: every value identical" of 0.1 and
    0.10000000149. Values float32 holds exactly still compare equal."""
    schema = Unischema("S", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                             UnischemaField("x", np.float64, (None,), TensorCodec(), False)])
    options = {"payload": payload, "feature_lists": ["x"]} if payload == "sequence_example" else {}
    for name, value in (("exact", 0.5), ("rounded", 0.1)):
        write_dataset(str(tmp_path / name), schema, [{"id": i, "x": np.full(i, value)} for i in range(3)])
        convert(tmp_path / name, tmp_path / f"{name}.tfrecord", format_options=options)
        report = verify(tmp_path / name, tmp_path / f"{name}.tfrecord", options=options)
        assert report.equal == (name == "exact"), report.summary()
    place = "'features'/x" if payload == "example" else "'feature_lists'/x[0]"
    assert report.differences[0] == (f"record 1 (rounded.tfrecord record 1), field {place}: "
                                     "expected float64[1] [0.1], found float32[1] [0.1]")


@pytest.mark.parametrize("payload", ["example", "sequence_example", "tensor"])
def test_an_export_that_rounds_float64_says_so_in_its_summary(
        tmp_path: Path, payload: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the export rounded float64 fields to float32 without a word (only a verify found it)."""
    fields = [UnischemaField("x", np.float64, (None,), TensorCodec(), False)]
    if payload != "tensor":
        fields.insert(0, UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False))
    rows = [{"id": i, "x": np.full(i, 0.1)} for i in range(3)]
    write_dataset(str(tmp_path / "ds"), Unischema("S", fields), [{f.name: row[f.name] for f in fields} for row in rows])
    options = {"sequence_example": ["--option", "payload=sequence_example", "--option", "feature_lists=x"],
               "tensor": ["--option", "payload=tensor"]}.get(payload, [])
    assert main(["convert", str(tmp_path / "ds"), str(tmp_path / "x.tfrecord"), *options]) == 0
    said = "the float64 fields ['x'] are written as float32 (a FloatList holds no float64): values float32 does not"
    assert (said in capsys.readouterr().err) == (payload != "tensor")
    result = convert(tmp_path / "ds", tmp_path / "y.tfrecord",
                     format_options={"payload": payload, **({"feature_lists": ["x"]} if payload[0] == "s" else {})})
    assert bool(result.notes) == (payload != "tensor") and all(said in note for note in result.notes)


def test_verify_of_two_tfrecord_files_reads_both_with_tensorflow(tmp_path: Path) -> None:
    a = _records(tmp_path / "a.tfrecord", [tf.train.Example(features=tf.train.Features(feature={
        "x": _f([1.0, 2.0], "float"), "x/shape": _f([2], "int64")})).SerializeToString()])
    b = _records(tmp_path / "b.tfrecord", [tf.train.Example(features=tf.train.Features(feature={
        "x": _f([1.0, 2.0], "float")})).SerializeToString()])
    report = verify(a, b)
    assert not report.equal and "TensorFlow" in report.summary()
    assert report.differences[0] == ("record 0 (a.tfrecord record 0), field 'features'/x/shape: "
                                     "expected int64[1] [2], found nothing (missing)")


def test_a_given_schema_keeps_empty_lists_and_shape_features(tmp_path: Path) -> None:
    def example(i: int) -> bytes:
        return tf.train.Example(features=tf.train.Features(feature={
            "emp": _f([] if i % 2 == 0 else [1.0], "float"),
            "img": _f(list(range(i * 2)), "int64"), "img/shape": _f([i, 2], "int64")})).SerializeToString()

    src = _records(tmp_path / "e.tfrecord", [example(i) for i in range(4)])
    convert(src, tmp_path / "ds")
    (tmp_path / "s.json").write_text(open_dataset(str(tmp_path / "ds")).schema.to_json())
    convert(src, tmp_path / "given", schema=tmp_path / "s.json")
    extra = open_dataset(str(tmp_path / "given")).extra_metadata["tfrecord"]
    assert extra["empty_as_null"] == ["emp"] and extra["shape_features"] == ["img"]
    convert(tmp_path / "given", tmp_path / "back.tfrecord")
    assert [tf.train.Example.FromString(r) for r in _read(tmp_path / "back.tfrecord")] == \
        [tf.train.Example.FromString(r) for r in _read(src)]


def test_feature_lists_whose_steps_are_all_empty(tmp_path: Path) -> None:
    records = [tf.train.SequenceExample(
        context=tf.train.Features(feature={"id": _f([r], "int64")}),
        feature_lists=tf.train.FeatureLists(feature_list={"x": tf.train.FeatureList(feature=[_f([], "int64")] * 2)}),
    ).SerializeToString() for r in range(3)]
    src = _records(tmp_path / "c.tfrecord", records)
    convert(src, tmp_path / "ds")
    assert all(r.x.shape == (2, 0) and r.x.dtype == np.int64 for r in _rows(tmp_path / "ds"))
    assert verify(src, tmp_path / "ds").equal
    convert(tmp_path / "ds", tmp_path / "back.tfrecord")
    assert [tf.train.SequenceExample.FromString(r) for r in _read(tmp_path / "back.tfrecord")] == \
        [tf.train.SequenceExample.FromString(r) for r in records]


def test_every_record_skipped_is_an_error_not_an_empty_dataset(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    good = tf.train.Example(features=tf.train.Features(feature={"id": _f([1], "int64")})).SerializeToString()
    src = _records(tmp_path / "bad.tfrecord", [good, good])
    data = bytearray(src.read_bytes())
    data[20] ^= 0xFF  # record 0's data CRC
    data[-6] ^= 0xFF  # record 1's
    src.write_bytes(bytes(data))
    for workers in ("1", "2"):
        assert main(["convert", str(src), str(tmp_path / "ds"), "--skip-corrupt", "--quiet",
                     "--workers", workers]) == 1
        err = capsys.readouterr().err
        assert "unihub: error:" in err and ("every record was skipped as bad" in err or "no readable" in err)
        assert not _left(tmp_path, "ds")
    # records that parse, none of which fits a given schema: skipped, then refused before the commit
    src = _records(tmp_path / "other.tfrecord", [good, good])
    schema = {"format": "unihub.unischema", "version": 1, "name": "S", "fields": [
        {"name": "x", "dtype": "int64", "shape": [], "codec": {"type": "scalar", "arrow_type": "int64"},
         "nullable": False}]}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    with pytest.raises(FormatError, match=r"every record was skipped as bad \(2\).*feature 'x': missing"):
        convert(src, tmp_path / "ds", schema=tmp_path / "s.json", on_error="skip", format_options={"fields": ["x"]})
    assert not _left(tmp_path, "ds")
