"""TFRecord ingest and export: framing, inference, bad input, TensorFlow interop."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from unihub import ScalarCodec, TensorCodec, Unischema, UnischemaField, convert, open_dataset, verify, write_dataset
from unihub.dependencies import is_available
from unihub.errors import CodecError, FormatError, SchemaError
from unihub.formats.base import FORMATS, detect_format
from unihub.formats.tfrecord.example import encode_example, encode_feature
from unihub.formats.tfrecord.format import PROVISIONAL_SAMPLE, TFRecordFormat
from unihub.formats.tfrecord.records import iter_records, write_records
from unihub.images import decoders as images
from unihub.schema.codecs import CompressedImageCodec

REPO = Path(__file__).resolve().parents[3]
needs_tf = pytest.mark.skipif(not is_available("tensorflow"), reason="tensorflow is not installed")


@pytest.fixture(scope="module")
def tf() -> Any:
    """TensorFlow, imported once for the module (slow), or the test is skipped."""
    return pytest.importorskip("tensorflow")


def _png(h: int, w: int, c: int = 3, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    shape = (h, w) if c == 1 else (h, w, c)
    return images.encode_image(rng.integers(0, 255, shape, dtype=np.uint8), "png")


def _jpeg(h: int, w: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return images.encode_image(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), "jpeg", 90)


def _write_own(path: Path, rows: list[dict[str, tuple[str, Any]]], *, gz: bool = False) -> Path:
    """Frame ``rows`` ({name: (kind, values)}) into a TFRecord file with this module's encoder."""
    examples = (encode_example({k: encode_feature(kind, v) for k, (kind, v) in row.items()}) for row in rows)
    write_records(str(path), examples, compression="GZIP" if gz else None)
    return path


def _tf_example(tf: Any, i: int) -> bytes:
    feature = {
        "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i - 3])),
        "big": tf.train.Feature(int64_list=tf.train.Int64List(value=[-(2**62), 2**62 + i])),
        "vec": tf.train.Feature(float_list=tf.train.FloatList(value=[i, i + 0.5, -1.25])),
        "var": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5] * i)),
        "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"ünï-{i}".encode()])),
        "blob": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes([255, i, 0])])),
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[_png(4 + i % 2, 6, seed=i)])),
    }
    if i % 2:
        feature["maybe"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _tf_file(tf: Any, path: Path, n: int, start: int = 0, gzip_: bool = False) -> Path:
    with tf.io.TFRecordWriter(str(path), options="GZIP" if gzip_ else None) as writer:
        for i in range(start, start + n):
            writer.write(_tf_example(tf, i))
    return path


def _read_all(source: TFRecordFormat, schema: Unischema, **kwargs: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {f.name: [] for f in schema}
    for batch in source.read_batches(schema, **kwargs):
        for name, values in batch.items():
            out[name].extend(values.to_pylist() if isinstance(values, pa.Array) else list(values))
    return out


# -- TensorFlow-written input ----------------------------------------------------------------
@needs_tf
def test_reads_what_tensorflow_writes(tf: Any, tmp_path: Path) -> None:
    path = _tf_file(tf, tmp_path / "train.tfrecord", 5)
    source = TFRecordFormat(str(path))
    schema = source.infer_schema()
    assert schema.id == UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False)
    assert schema.big == UnischemaField("big", np.int64, (2,), TensorCodec(), False)
    assert schema.vec == UnischemaField("vec", np.float32, (3,), TensorCodec(), False)
    assert schema.var == UnischemaField("var", np.float32, (None,), TensorCodec(), False)
    assert schema["name"] == UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), False)
    assert schema.blob == UnischemaField("blob", np.bytes_, (), ScalarCodec(pa.binary()), False)
    assert schema.maybe.nullable and schema.maybe.shape == ()
    assert schema.image.codec == CompressedImageCodec("png") and schema.image.shape == (None, 6, 3)

    batches = list(source.read_batches(schema, batch_size=2))
    assert [len(b["id"]) for b in batches] == [2, 2, 1]
    first = batches[0]
    assert first["id"].dtype == np.int64 and first["vec"].dtype == np.float32
    assert first["vec"].shape == (2, 3) and first["big"].shape == (2, 2)
    values = _read_all(TFRecordFormat(str(path)), schema)
    assert values["id"] == [-3, -2, -1, 0, 1]
    assert values["big"][4].tolist() == [-(2**62), 2**62 + 4]
    assert [len(v) for v in values["var"]] == [0, 1, 2, 3, 4]
    assert values["name"][2] == "ünï-2" and values["blob"][1] == b"\xff\x01\x00"
    assert values["maybe"] == [None, 1, None, 3, None]
    assert values["image"][3] == _png(5, 6, seed=3)
    assert source.report.records == 5 and source.report.skipped == []


@needs_tf
def test_gzip_and_many_shards(tf: Any, tmp_path: Path) -> None:
    for shard in range(3):
        _tf_file(tf, tmp_path / f"part-{shard}.tfrecord.gz", 4, start=shard * 4, gzip_=True)
    source = TFRecordFormat(str(tmp_path / "part-{0..2}.tfrecord.gz"))
    schema = source.infer_schema(sample_records=6)
    assert _read_all(source, schema)["id"] == [i - 3 for i in range(12)]
    forced = TFRecordFormat(str(tmp_path), compression="GZIP")  # a directory, compression given
    assert _read_all(forced, schema)["id"] == [i - 3 for i in range(12)]
    with pytest.raises(FormatError, match="CRC"):  # GZIP files read as plain
        list(TFRecordFormat(str(tmp_path), compression="").read_batches(schema))


# -- inference -------------------------------------------------------------------------------
def test_inference_cases(tmp_path: Path) -> None:
    rows = []
    for i in range(4):
        row = {
            "scalar_f": ("float", [i / 2]),
            "fixed_i": ("int64", [i, -i, 7]),
            "ragged_i": ("int64", list(range(i))),
            "jpeg": ("bytes", [_jpeg(8, 8 + 8 * (i % 2), seed=i)]),
            "gray": ("bytes", [_png(5, 7, c=1, seed=i)]),
            "rgba": ("bytes", [_png(3, 3, c=4, seed=i)]),
            "text": ("bytes", [f"t{i}".encode()]),
            "tags": ("bytes", [b"a", b"bb"][: 1 + i % 2]),
            "pair": ("bytes", [b"\xff\x00", b"x"]),
            "zero_or_one": ("int64", [i] if i % 2 else []),
        }
        if i != 2:
            row["sometimes"] = ("bytes", [b"here"])
        rows.append(row)
    schema = TFRecordFormat(str(_write_own(tmp_path / "x.tfrec", rows))).infer_schema()
    assert schema.scalar_f == UnischemaField("scalar_f", np.float32, (), ScalarCodec(pa.float32()), False)
    assert schema.fixed_i == UnischemaField("fixed_i", np.int64, (3,), TensorCodec(), False)
    assert schema.ragged_i == UnischemaField("ragged_i", np.int64, (None,), TensorCodec(), False)
    assert schema.jpeg == UnischemaField("jpeg", np.uint8, (8, None, 3), CompressedImageCodec("jpeg"), False)
    assert schema.gray == UnischemaField("gray", np.uint8, (5, 7), CompressedImageCodec("png"), False)
    assert schema.rgba.shape == (3, 3, 4)
    assert schema.text == UnischemaField("text", np.str_, (), ScalarCodec(pa.string()), False)
    assert schema.tags == UnischemaField("tags", np.str_, (None,), None, False)
    assert schema.pair == UnischemaField("pair", np.bytes_, (2,), None, False)
    assert schema.zero_or_one == UnischemaField("zero_or_one", np.int64, (), ScalarCodec(pa.int64()), True)
    assert schema.sometimes == UnischemaField("sometimes", np.str_, (), ScalarCodec(pa.string()), True)

    values = _read_all(TFRecordFormat(str(tmp_path / "x.tfrec")), schema)
    assert values["zero_or_one"] == [None, 1, None, 3]
    assert values["sometimes"] == ["here", "here", None, "here"]
    assert [list(t) for t in values["tags"]] == [["a"], ["a", "bb"], ["a"], ["a", "bb"]]
    assert values["pair"][0].tolist() == [b"\xff\x00", b"x"]
    # what read_batches yields is what write_dataset takes
    result = write_dataset(tmp_path / "pq", schema, TFRecordFormat(str(tmp_path / "x.tfrec")).read_batches(schema),
                           batched=True)
    assert result.num_rows == 4


def test_conflicting_kinds_and_empty_input(tmp_path: Path) -> None:
    path = _write_own(tmp_path / "mixed.tfrecord", [{"a": ("int64", [1])}, {"a": ("float", [1.0])}])
    with pytest.raises(SchemaError, match="'a'"):
        TFRecordFormat(str(path)).infer_schema()
    empty = _write_own(tmp_path / "empty.tfrecord", [])
    with pytest.raises(FormatError, match="no readable TFRecord records"):
        TFRecordFormat(str(empty)).infer_schema()


# -- bad input -------------------------------------------------------------------------------
def _three_records(tmp_path: Path) -> Path:
    return _write_own(tmp_path / "bad.tfrecord", [{"x": ("int64", [i]), "s": ("bytes", [b"abc" * i])}
                                                  for i in range(3)])


def test_truncated_file(tmp_path: Path) -> None:
    path = _three_records(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:-5])
    source = TFRecordFormat(str(path), fields=["x"])  # a schema of x alone: the other features left out
    schema = Unischema("s", [UnischemaField("x", np.int64, (), ScalarCodec(pa.int64()), False)])
    with pytest.raises(FormatError, match=r"bad\.tfrecord: record 2 at byte offset \d+: truncated") as info:
        list(source.read_batches(schema))
    assert info.value.path == str(path) and info.value.offset > 0
    batches = list(source.read_batches(schema, on_error="skip"))
    assert batches[0]["x"].tolist() == [0, 1]
    assert len(source.report.skipped) == 1 and "record 2" in source.report.skipped[0].location
    # a cut gzip stream is a truncated file too
    gz = tmp_path / "cut.tfrecord.gz"
    gz.write_bytes(gzip.compress(data)[:-12])
    with pytest.raises(FormatError, match="cut.tfrecord.gz"):
        list(TFRecordFormat(str(gz), fields=["x"]).read_batches(schema))


def test_bad_crc(tmp_path: Path) -> None:
    path = _three_records(tmp_path)
    data = bytearray(path.read_bytes())
    offsets = [offset for _, offset, _ in iter_records(str(path))]
    data[offsets[1] + 14] ^= 0xFF  # a byte of record 1's payload
    path.write_bytes(bytes(data))
    schema = Unischema("s", [UnischemaField("x", np.int64, (), ScalarCodec(pa.int64()), False)])
    with pytest.raises(FormatError, match=f"record 1 at byte offset {offsets[1]}: data CRC mismatch"):
        list(TFRecordFormat(str(path), fields=["x"]).read_batches(schema))
    source = TFRecordFormat(str(path), fields=["x"])
    assert [v for b in source.read_batches(schema, on_error="skip") for v in b["x"]] == [0, 2]
    assert source.report.records == 2 and source.report.skipped[0].reason == "data CRC mismatch"
    data[offsets[2] + 2] ^= 0x01  # record 2's length: the rest of the file cannot be framed
    data += data[offsets[0]:offsets[1]]  # ... and a sound record after it is lost too, which the reason says
    path.write_bytes(bytes(data))
    for parser in ("block", "record"):
        source = TFRecordFormat(str(path), fields=["x"], parser=parser)
        assert [v for b in source.read_batches(schema, on_error="skip") for v in b["x"]] == [0]
        assert [s.location for s in source.report.skipped] == [f"record {i} at byte offset {offsets[i]}" for i in (1, 2)]
        assert source.report.skipped[1].reason.startswith("length CRC mismatch")
        assert "nothing from here to the end of the file can be framed" in source.report.skipped[1].reason


def test_corrupt_images(tmp_path: Path) -> None:
    good = _png(4, 4)
    bad_header = good[:12]  # PNG signature, header cut: a bad image (one of them no longer makes the field bytes)
    bad_body = good[:40] + b"\x00" * 10 + good[50:]  # header intact, pixels corrupt: an image field
    path = _write_own(tmp_path / "img.tfrecord", [{"a": ("bytes", [good]), "b": ("bytes", [bad_body])},
                                                  {"a": ("bytes", [bad_header]), "b": ("bytes", [good])}])
    schema = TFRecordFormat(str(path)).infer_schema()
    assert isinstance(schema.a.codec, CompressedImageCodec) and isinstance(schema.b.codec, CompressedImageCodec)
    with pytest.raises(FormatError, match=r"img.tfrecord: record 1 at byte offset \d+: feature 'a': "):
        convert(path, tmp_path / "refused", progress=False)
    result = convert(path, tmp_path / "skipped", on_error="skip", progress=False)
    assert result.rows == 1 and [s.location.split(" at ")[0] for s in result.skipped] == ["record 1"]
    no_signature = _write_own(tmp_path / "mixed.tfrecord", [{"a": ("bytes", [good])}, {"a": ("bytes", [b"text"])}])
    assert TFRecordFormat(str(no_signature)).infer_schema().a.numpy_dtype is np.bytes_  # not an image: bytes
    stored = open_dataset(str(tmp_path / "skipped")).read_row_group(0).column("b").to_pylist()
    assert stored == [bad_body]  # its header is sound: kept as it is
    with pytest.raises(CodecError, match="'b', row 0"):  # the error comes when the image is decoded
        schema.b.codec.decode_column(schema.b, pa.array(stored, pa.binary()))


@pytest.mark.parametrize("parser", ["block", "record"])
@pytest.mark.parametrize("validate", ["header", "none"])
def test_a_non_image_past_the_sample_makes_the_field_bytes_as_within_it(tmp_path: Path, parser: str,
                                                                       validate: str) -> None:
    """A value with no PNG/JPEG header past the first 1,000 records was refused as a bad image (or, with
    ``--validate-images none``, by the store), though within them it makes the field bytes: the
    conversion now starts over with the full schema, so the result does not depend on the sample."""
    good = _png(2, 2)
    for late, at in ((False, 15), (True, PROVISIONAL_SAMPLE + 500)):
        rows = [{"img": ("bytes", [b"not an image" if i == at else good])} for i in range(PROVISIONAL_SAMPLE + 600)]
        src = _write_own(tmp_path / f"{late}.tfrecord", rows)
        result = convert(src, tmp_path / f"ds{late}", progress=False, validate_images=validate,
                         format_options={"parser": parser})
        assert result.rows == len(rows)
        field = open_dataset(str(tmp_path / f"ds{late}")).schema.img
        assert field.numpy_dtype is np.bytes_ and isinstance(field.codec, ScalarCodec)
        assert verify(src, tmp_path / f"ds{late}").equal


def test_schema_that_does_not_match(tmp_path: Path) -> None:
    path = _three_records(tmp_path)
    wrong_len = Unischema("s", [UnischemaField("x", np.int64, (2,), TensorCodec(), False)])
    with pytest.raises(FormatError, match=r"record 0 at byte offset 0, feature 'x': expected 2 values"):
        list(TFRecordFormat(str(path), fields=["x"]).read_batches(wrong_len))
    missing = Unischema("s", [UnischemaField("nope", np.int64, (), ScalarCodec(pa.int64()), False)])
    with pytest.raises(FormatError, match="feature 'nope': missing"):
        list(TFRecordFormat(str(path), fields=["nope"]).read_batches(missing))
    wrong_kind = Unischema("s", [UnischemaField("s", np.float32, (None,), TensorCodec(), False)])
    with pytest.raises(FormatError, match="feature 's': holds a bytes list"):
        list(TFRecordFormat(str(path), fields=["s"]).read_batches(wrong_kind))
    source = TFRecordFormat(str(path), fields=["nope"])
    assert list(source.read_batches(missing, on_error="skip")) == []
    assert len(source.report.skipped) == 3


# -- export ----------------------------------------------------------------------------------
def _export_schema() -> Unischema:
    return Unischema("Export", [
        UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("score", np.float32, (), ScalarCodec(pa.float32()), True),
        UnischemaField("mat", np.float32, (2, 3), TensorCodec(), False),
        UnischemaField("boxes", np.int32, (None, 2), TensorCodec(), False),
        UnischemaField("ragged", np.uint8, (None, None), TensorCodec(), False),
        UnischemaField("label", np.str_, (), ScalarCodec(pa.string()), False),
        UnischemaField("raw", np.bytes_, (), ScalarCodec(pa.binary()), False),
        UnischemaField("image", np.uint8, (4, 5, 3), CompressedImageCodec("png"), False),
    ])


def _export_batch(n: int, start: int = 0) -> dict[str, Any]:
    ids = np.arange(start, start + n)
    return {
        "id": ids,
        "score": [None if i % 3 == 0 else np.float32(i / 4) for i in ids],
        "mat": np.stack([np.arange(6, dtype=np.float32).reshape(2, 3) * i for i in ids]),
        "boxes": [np.full((i % 3, 2), i, np.int32) for i in ids],
        "ragged": [np.full((1 + i % 2, 2 + i % 3), i, np.uint8) for i in ids],
        "label": [f"label-{i}" for i in ids],
        "raw": [bytes([i % 256, 0]) for i in ids],
        "image": [_png(4, 5, seed=int(i)) for i in ids],
    }


@needs_tf
@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_export_is_read_by_tensorflow(tf: Any, tmp_path: Path, compression: str | None) -> None:
    schema = _export_schema()
    files = TFRecordFormat.write(str(tmp_path / "out"), schema, [_export_batch(4), _export_batch(3, 4)],
                                 compression=compression, records_per_file=3)
    assert [os.path.basename(f) for f in files] == [f"part-0000{i}.tfrecord" + (".gz" if compression else "")
                                                    for i in range(3)]
    assert not [n for n in os.listdir(tmp_path / "out") if n.startswith(".")]  # no temp files left
    spec = {
        "id": tf.io.FixedLenFeature([], tf.int64),
        "score": tf.io.FixedLenFeature([], tf.float32, default_value=-1.0),
        "mat": tf.io.FixedLenFeature([2, 3], tf.float32),
        "boxes": tf.io.VarLenFeature(tf.int64),
        "ragged": tf.io.VarLenFeature(tf.int64),
        "ragged/shape": tf.io.FixedLenFeature([2], tf.int64),
        "label": tf.io.FixedLenFeature([], tf.string),
        "raw": tf.io.FixedLenFeature([], tf.string),
        "image": tf.io.FixedLenFeature([], tf.string),
    }
    dataset = tf.data.TFRecordDataset(files, compression_type=compression or "").batch(7)
    parsed = tf.io.parse_example(next(iter(dataset)), spec)
    expected = _export_batch(7)
    assert parsed["id"].numpy().tolist() == list(range(7))
    assert parsed["score"].numpy().tolist() == [-1.0 if s is None else float(s) for s in expected["score"]]
    np.testing.assert_array_equal(parsed["mat"].numpy(), expected["mat"])
    assert [b.decode() for b in parsed["label"].numpy()] == expected["label"]
    assert parsed["raw"].numpy().tolist() == expected["raw"] and parsed["image"].numpy().tolist() == expected["image"]
    assert tf.io.decode_png(parsed["image"][2]).shape == (4, 5, 3)
    boxes = tf.sparse.to_dense(parsed["boxes"]).numpy()
    assert boxes[5].tolist()[:4] == [5, 5, 5, 5]
    assert parsed["ragged/shape"].numpy()[4].tolist() == [1, 3]


@pytest.mark.parametrize(("name", "compression", "magic"), [
    ("x.tfrecord.gz", None, b"\x1f\x8b"), ("x.tfrecord.zlib", None, b"\x78"), ("x.tfrecord", None, b"\x0e\x00"),
    ("x.tfrecord.gz", "none", b"\x0e\x00")])
def test_an_export_to_one_file_named_gz_is_gzip(tmp_path: Path, name: str, compression: str | None,
                                                magic: bytes) -> None:
    """``convert ds x.tfrecord.gz --to tfrecord`` wrote a plain file under a GZIP name, which
    ``TFRecordDataset(..., compression_type="GZIP")`` and ``gunzip`` refuse: the name now says the
    compression, unless the ``compression`` option says otherwise."""
    schema = Unischema("s", [UnischemaField("x", np.int64, (), ScalarCodec(pa.int64()), False)])
    [path] = TFRecordFormat.write(str(tmp_path / name), schema, [{"x": np.arange(3)}], compression=compression)
    assert path == str(tmp_path / name) and Path(path).read_bytes().startswith(magic)
    assert [v for b in TFRecordFormat(path).read_batches(schema) for v in b["x"]] == [0, 1, 2]


def test_ingest_export_ingest_round_trip(tmp_path: Path) -> None:
    schema = _export_schema()
    TFRecordFormat.write(str(tmp_path / "a.tfrecord"), schema, [_export_batch(5)])
    inferred = TFRecordFormat(str(tmp_path / "a.tfrecord")).infer_schema()
    assert inferred.ragged == UnischemaField("ragged", np.int64, (None, None), TensorCodec(), False)
    assert inferred.image == UnischemaField("image", np.uint8, (4, 5, 3), CompressedImageCodec("png"), False)
    assert inferred.score.nullable and inferred.mat.shape == (6,)  # flat: the shape lives in the Unischema
    first = _read_all(TFRecordFormat(str(tmp_path / "a.tfrecord")), schema)
    TFRecordFormat.write(str(tmp_path / "b.tfrecord.gz"), schema, TFRecordFormat(str(tmp_path / "a.tfrecord"))
                         .read_batches(schema, batch_size=2), compression="GZIP")
    second = _read_all(TFRecordFormat(str(tmp_path / "b.tfrecord.gz")), schema)
    expected = _export_batch(5)
    for name in ("id", "label", "raw", "image", "score"):
        assert first[name] == second[name] == list(expected[name]), name
    for name in ("mat", "boxes", "ragged"):
        for a, b, e in zip(first[name], second[name], expected[name]):
            np.testing.assert_array_equal(a, e)
            np.testing.assert_array_equal(b, e)
            assert a.dtype == b.dtype == schema[name].dtype and a.shape == e.shape


def test_write_refuses_what_it_cannot_store(tmp_path: Path) -> None:
    schema = Unischema("s", [UnischemaField("t", np.datetime64, (), None, False)])
    with pytest.raises(SchemaError, match="'t'"):
        TFRecordFormat.write(str(tmp_path / "t.tfrecord"), schema, [{"t": [np.datetime64("2020-01-01")]}])
    assert os.listdir(tmp_path) == []  # the temporary file is gone


@pytest.mark.parametrize("shape", [(), (2,)])
def test_a_uint64_past_int64_is_refused_not_wrapped(tmp_path: Path, shape: tuple[int, ...]) -> None:
    """2**64 - 1 was written as the varint TFRecord's int64 list reads as -1; TensorFlow's Int64List refuses it."""
    schema = Unischema("s", [UnischemaField("u", np.uint64, shape, TensorCodec() if shape else None, False)])
    fits = np.full(shape, 2**63 - 1, np.uint64)
    TFRecordFormat.write(str(tmp_path / "ok.tfrecord"), schema, [{"u": [fits]}])
    with pytest.raises(SchemaError, match=r"field 'u': 18446744073709551615 does not fit TFRecord's int64"):
        TFRecordFormat.write(str(tmp_path / "t.tfrecord"), schema, [{"u": [fits, np.full(shape, 2**64 - 1, np.uint64)]}])
    assert os.listdir(tmp_path) == ["ok.tfrecord"]


def test_registry_and_detection(tmp_path: Path) -> None:
    assert FORMATS.get("tfrecords") is TFRecordFormat
    path = _three_records(tmp_path)
    assert detect_format(str(path)) == "tfrecord"
    renamed = tmp_path / "data.bin"
    renamed.write_bytes(gzip.compress(path.read_bytes()))
    assert TFRecordFormat.detect(str(renamed))
    (tmp_path / "other.bin").write_bytes(b"not a tfrecord file at all")
    assert not TFRecordFormat.detect(str(tmp_path / "other.bin"))


# -- TensorFlow and the tfrecord package in one process ----------------------------------------
def _run(script: str) -> str:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
@needs_tf
@pytest.mark.skipif(not is_available("tfrecord"), reason="the tfrecord package is not installed")
def test_with_tensorflow_and_tfrecord_in_one_process(tmp_path: Path) -> None:
    pkg, back = str(tmp_path / "pkg.tfrecord"), str(tmp_path / "back.tfrecord")
    out = _run(f"""
        import sys, numpy as np
        from tfrecord.reader import tfrecord_loader
        from tfrecord.writer import TFRecordWriter
        from unihub.formats.tfrecord.format import PROVISIONAL_SAMPLE, TFRecordFormat
        w = TFRecordWriter({pkg!r})
        for i in range(3):
            w.write({{"x": (np.array([i, i + 1]), "int"), "s": (f"s{{i}}".encode(), "byte")}})
        w.close()
        source = TFRecordFormat({pkg!r})
        schema = source.infer_schema()
        TFRecordFormat.write({back!r}, schema, source.read_batches(schema))
        print([r["x"].tolist() for r in tfrecord_loader({back!r}, None)], "tensorflow" in sys.modules)
        try:
            import tensorflow  # registers the same protobuf names as tfrecord: fails after it
        except TypeError as exc:
            print("clash:", "duplicate symbol" in str(exc))
        print([v for b in source.read_batches(schema) for v in b["s"].to_pylist()])
        print("back", [v for b in TFRecordFormat({back!r}).read_batches(schema) for v in b["s"].to_pylist()])
    """)
    assert "[[0, 1], [1, 2], [2, 3]] False" in out and "['s0', 's1', 's2']" in out and "back ['s0', 's1', 's2']" in out
    out = _run(f"""
        import tensorflow as tf
        try:
            import tfrecord  # fails after tensorflow, for the same reason
        except TypeError as exc:
            print("clash:", "duplicate symbol" in str(exc))
        from unihub.formats.tfrecord.format import PROVISIONAL_SAMPLE, TFRecordFormat
        source = TFRecordFormat({pkg!r})
        schema = source.infer_schema()
        files = TFRecordFormat.write({str(tmp_path / "out")!r}, schema, source.read_batches(schema))
        spec = {{"x": tf.io.FixedLenFeature([2], tf.int64), "s": tf.io.FixedLenFeature([], tf.string)}}
        got = tf.io.parse_example(next(iter(tf.data.TFRecordDataset(files).batch(3))), spec)
        print(got["x"].numpy().tolist(), got["s"].numpy().tolist())
    """)
    assert "[[0, 1], [1, 2], [2, 3]] [b's0', b's1', b's2']" in out


def test_malformed_example_payload(tmp_path: Path) -> None:
    good = encode_example({"x": encode_feature("int64", [1])})
    path = tmp_path / "m.tfrecord"
    write_records(str(path), [good, b"\x0a\x05\x0a", good])  # framing fine, record 1 not an Example
    schema = Unischema("s", [UnischemaField("x", np.int64, (), ScalarCodec(pa.int64()), False)])
    with pytest.raises(FormatError, match="record 1 at byte offset 30: malformed tf.train.Example"):
        list(TFRecordFormat(str(path)).read_batches(schema))
    source = TFRecordFormat(str(path))
    assert [v for b in source.read_batches(schema, on_error="skip") for v in b["x"]] == [1, 1]
    assert [s.location for s in source.report.skipped] == ["record 1 at byte offset 30"]


def test_schema_scan_in_workers_equals_the_serial_scan(tmp_path: Path) -> None:
    """Whole files scanned in forked workers; the per-feature statistics merge to the same schema."""
    files = [
        _write_own(tmp_path / "a.tfrecord", [{"x": ("int64", [i, i]), "s": ("bytes", [b"text"]),
                                             "img": ("bytes", [_png(4, 5)])} for i in range(5)]),
        _write_own(tmp_path / "b.tfrecord", [{"x": ("int64", [i, i, i]), "s": ("bytes", [b"\xff\xfe"]),
                                             "img": ("bytes", [_png(6, 5)])} for i in range(4)]),
        _write_own(tmp_path / "c.tfrecord", [{"x": ("int64", [i]), "img": ("bytes", [_png(4, 5)]),
                                             "f": ("float", [0.5] * 3)} for i in range(3)]),
    ]
    serial = TFRecordFormat([str(f) for f in files]).infer_schema()
    parallel = TFRecordFormat([str(f) for f in files])
    parallel.workers = 2
    assert parallel.infer_schema() == serial
    by_name = {f.name: f for f in serial}
    assert by_name["x"].shape == (None,) and not by_name["x"].nullable
    assert by_name["s"].numpy_dtype is np.bytes_ and by_name["s"].nullable  # not UTF-8 in b, missing in c
    assert by_name["img"].shape == (None, 5, 3) and by_name["f"].nullable and by_name["f"].shape == (3,)
