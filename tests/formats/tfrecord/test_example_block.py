"""The vectorised TFRecord reader gives exactly what the record-by-record reader gives."""

from __future__ import annotations

import gzip
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tests.formats.tfrecord.reads import assert_same, read_all
from unihub import ScalarCodec, TensorCodec, Unischema, UnischemaField
from unihub.dependencies import is_available
from unihub.errors import FormatError
from unihub.formats.tfrecord import example_block as tfbatch
from unihub.formats.tfrecord import format as tfr
from unihub.formats.tfrecord import framing as tframe
from unihub.formats.tfrecord.example import _packed_varints, encode_example, encode_feature, parse_example
from unihub.formats.tfrecord.format import TFRecordFormat
from unihub.formats.tfrecord.parsers import EXAMPLE_PARSERS
from unihub.formats.tfrecord.records import iter_records, write_records
from unihub.images import decoders as images

REPO = Path(__file__).resolve().parents[3]


def _jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return images.encode_image(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8), "jpeg", 90)


def _write(path: Path, rows: list[dict[str, tuple[str, Any]]], *, gz: bool = False) -> str:
    examples = [encode_example({k: encode_feature(kind, v) for k, (kind, v) in row.items()}) for row in rows]
    return write_records(str(path), examples, compression="GZIP" if gz else None)


def _check(files: Any, schema: Unischema | None = None, batch_sizes: tuple[int, ...] = (1, 3, 256),
           on_error: tuple[str, ...] = ("raise", "skip")) -> dict[str, Any]:
    """The fast and the per-record reads agree for each batch size and error mode; the last fast read."""
    fast: dict[str, Any] = {}
    for size in batch_sizes:
        for mode in on_error:
            fast = read_all(files, schema, "block", size, mode)
            assert_same(fast, read_all(files, schema, "record", size, mode))
    _check_observed(files, schema)
    return fast


def _check_observed(files: Any, schema: Unischema | None) -> None:
    """A single pass's statistics (both read paths) equal a separate schema scan's, or it says it outgrew."""
    from unihub.formats.base import SchemaOutgrown

    scanned = tfr._scan_files({"on_error": "skip"}, TFRecordFormat(files).files())
    for parser in EXAMPLE_PARSERS:
        source = TFRecordFormat(files, parser=parser)
        source.observe = True
        try:
            list(source.read_batches(schema or TFRecordFormat(files, parser=parser).infer_schema(), on_error="skip"))
        except SchemaOutgrown:
            continue
        except FormatError:
            continue  # no schema to read with (nothing readable, or features of two kinds)
        stats, total = source.report.observed
        assert total == scanned[1]
        assert {k: vars(v) for k, v in stats.items()} == {k: vars(v) for k, v in scanned[0].items()}


def _uniform(i: int) -> dict[str, tuple[str, Any]]:
    return {"image": ("bytes", [_jpeg(i % 3)]), "label": ("int64", [i % 10]),
            "vec": ("float", np.arange(16, dtype=np.float32) * i)}


def test_uniform_records_go_the_fast_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "u.tfrecord", [_uniform(i) for i in range(50)])
    slow_parses = []
    monkeypatch.setattr(tfbatch, "parse_example", lambda data: slow_parses.append(1) or parse_example(data))
    got = _check(path, batch_sizes=(7, 256))
    assert not slow_parses
    batch = got["batches"][0]
    assert batch["vec"].shape == (50, 16) and batch["vec"].dtype == np.float32
    assert batch["label"].dtype == np.int64 and batch["label"].tolist() == [i % 10 for i in range(50)]
    assert batch["image"].type == pa.binary() and batch["image"][4].as_py() == _jpeg(1)


def test_missing_features_other_orders_and_list_lengths(tmp_path: Path) -> None:
    rows = []
    for i in range(40):
        row = _uniform(i)
        if i % 3 == 0:
            row["maybe"] = ("int64", [i])
        if i % 5 == 0:
            row = dict(reversed(row.items()))
        row["var"] = ("float", [0.5] * (i % 4))
        row["ints"] = ("int64", list(range(i % 3 + 1)))
        row["words"] = ("bytes", [b"w%d" % j for j in range(i % 2 + 1)])
        row["name"] = ("bytes", [f"ünï-{i}".encode()])
        rows.append(row)
    path = _write(tmp_path / "m.tfrecord", rows)
    got = _check(path)
    assert [len(b["label"]) for b in got["batches"]] == [40]


@pytest.mark.parametrize("values", [[128], [300], [-1], [2**63 - 1, -(2**63)], [5, 200, -7]])
def test_large_and_negative_int64(tmp_path: Path, values: list[int]) -> None:
    rows = [{"s": ("int64", [values[0] if i == 3 else i]), "t": ("int64", values if i % 2 else [1] * len(values))}
            for i in range(9)]
    got = _check(_write(tmp_path / "i.tfrecord", rows))
    assert got["batches"][0]["s"][3] == values[0]


@pytest.mark.parametrize("size", [127, 128, 16383, 16384, 2**21])
def test_payloads_that_change_the_length_varint_width(tmp_path: Path, size: int) -> None:
    rows = [{"b": ("bytes", [b"x" * (size + (i % 3) - 1)]), "k": ("int64", [i])} for i in range(7)]
    _check(_write(tmp_path / "w.tfrecord", rows), batch_sizes=(2, 256))


def test_gzip_and_small_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [_uniform(i) for i in range(30)]
    _check(_write(tmp_path / "g.tfrecord.gz", rows, gz=True))
    files = [_write(tmp_path / "a.tfrecord", rows), _write(tmp_path / "b.tfrecord", rows[:4])]
    _check(files)  # mapped
    monkeypatch.setattr(tframe, "MAP_FILES", False)
    monkeypatch.setattr(tframe, "CHUNK", 100)  # read in chunks that records straddle
    _check(files)


@pytest.mark.parametrize("mapped", [True, False])
def test_corrupt_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mapped: bool) -> None:
    monkeypatch.setattr(tframe, "MAP_FILES", mapped)
    monkeypatch.setattr(tframe, "CHUNK", tframe.CHUNK if mapped else 300)
    path = Path(_write(tmp_path / "c.tfrecord", [_uniform(i) for i in range(20)]))
    good = path.read_bytes()
    schema = TFRecordFormat(str(path)).infer_schema()
    offsets = [offset for _, offset, _ in iter_records(str(path))]
    data = bytearray(good)
    data[offsets[7] + 20] ^= 0xFF  # record 7's payload: that record is skipped
    path.write_bytes(bytes(data))
    got = _check(str(path), schema, batch_sizes=(3, 256))
    assert got["skipped"] == [(str(path), f"record 7 at byte offset {offsets[7]}", "data CRC mismatch")]
    assert got["records"] == 19
    raised = read_all(str(path), schema, "block", 256, "raise")["error"]
    assert raised[0].endswith(f"record 7 at byte offset {offsets[7]}: data CRC mismatch") and raised[2] == offsets[7]
    data[offsets[12] + 3] ^= 0x01  # record 12's length: nothing after it can be framed
    path.write_bytes(bytes(data))
    got = _check(str(path), schema, batch_sizes=(3, 256))
    assert got["records"] == 11 and "length CRC mismatch" in got["skipped"][1][2]
    for cut in (5, len(good) - offsets[19] - 3):  # a truncated record, a truncated header
        path.write_bytes(good[:-cut])
        assert "truncated" in _check(str(path), schema, batch_sizes=(4, 256))["skipped"][0][2]
    gz = tmp_path / "cut.tfrecord.gz"
    gz.write_bytes(gzip.compress(good)[:-40])
    _check(str(gz), schema, batch_sizes=(4, 256))


@pytest.mark.parametrize("block", [1, 4, 1024])
def test_records_that_do_not_fit_the_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    monkeypatch.setattr(tfbatch, "BLOCK", block)  # batches within and across the blocks parsed
    rows = [{"x": ("int64", [i]), "s": ("bytes", [b"ok" if i != 4 else b"\xff"]), "f": ("float", [0.5, 1.5])}
            for i in range(10)]
    rows[6]["x"] = ("int64", [1, 2])
    rows[8] = {"s": ("bytes", [b"x"]), "f": ("float", [1.0, 2.0])}  # x missing
    records = [encode_example({k: encode_feature(kind, v) for k, (kind, v) in row.items()}) for row in rows]
    records[2] = b"\x0a\x05\x0a"  # not an Example
    path = write_records(str(tmp_path / "s.tfrecord"), records)
    schema = Unischema("s", [UnischemaField("x", np.int64, (), ScalarCodec(pa.int64()), False),
                             UnischemaField("s", np.str_, (), ScalarCodec(pa.string()), True),
                             UnischemaField("f", np.float32, (2,), TensorCodec(), False),
                             UnischemaField("g", np.float32, (None,), TensorCodec(), True)])
    got = _check(path, schema, batch_sizes=(1, 2, 3, 5, 256))
    assert [s[1].split(" at ")[0] for s in got["skipped"]] == [f"record {i}" for i in (2, 4, 6, 8)]
    for dtype in (np.int32, np.float64):  # another dtype than the file's: converted as before
        _check(path, Unischema("d", [UnischemaField("x", dtype, (), ScalarCodec(pa.from_numpy_dtype(dtype)), True),
                                     UnischemaField("f", dtype, (2,), TensorCodec(), False)]))


@pytest.mark.skipif(not is_available("tensorflow"), reason="tensorflow is not installed")
def test_records_written_by_tensorflow(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import tensorflow as tf
        for name, options in (("t.tfrecord", None), ("t.tfrecord.gz", "GZIP")):
            with tf.io.TFRecordWriter({str(tmp_path)!r} + "/" + name, options=options) as w:
                for i in range(30):
                    f = {{"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i - 3])),
                         "big": tf.train.Feature(int64_list=tf.train.Int64List(value=[-(2**62), 2**62 + i])),
                         "vec": tf.train.Feature(float_list=tf.train.FloatList(value=[i, i + 0.5, -1.25])),
                         "var": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5] * (i % 4))),
                         "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"n-{{i}}".encode()])),
                         "blob": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"x" * (120 + i)]))}}
                    if i % 2:
                        f["maybe"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))
                    w.write(tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString())
    """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=REPO.parent, capture_output=True)
    for name in ("t.tfrecord", "t.tfrecord.gz"):
        got = _check(str(tmp_path / name), batch_sizes=(4, 256))
        assert got["batches"][0]["id"].tolist() == [i - 3 for i in range(30)]


# -- schema inference ------------------------------------------------------------------------
def _scan(files: list[str], parser: str, sample: int | None, on_error: str = "raise") -> Any:
    try:
        stats, total = tfr._scan_files({"on_error": on_error, "parser": parser}, files, sample)
    except FormatError as exc:
        return str(exc)
    for stat in stats.values():
        if not stat.all_images:  # what was seen before the first non-image depends on the order
            stat.images, stat.sizes = set(), set()
    return stats, total


def _check_scan(files: list[str], samples: tuple[int | None, ...] = (None, 0, 1, 5, 17)) -> None:
    for sample in samples:
        for mode in ("raise", "skip"):
            assert _scan(files, "block", sample, mode) == _scan(files, "record", sample, mode)


def test_schema_scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = []
    for i in range(60):
        row = _uniform(i)
        if i % 3 == 0:
            row["maybe"] = ("int64", [i * 1000, -i])
        if i % 7 == 0:
            row = dict(reversed(row.items()))
        row["var"] = ("float", [0.5] * (i % 4))
        row["words"] = ("bytes", [b"w%d" % j for j in range(i % 2 + 1)] + ([b"\xff"] if i == 50 else []))
        row["t"] = ("float", [0.0] * (2 * (i % 2 + 1)))
        row["t/shape"] = ("int64", [i % 2 + 1, 2])
        row["img"] = ("bytes", [_jpeg(0) if i != 40 else b"nope"])
        rows.append(row)
    path = _write(tmp_path / "s.tfrecord", rows)
    _check_scan([path])
    monkeypatch.setattr(tfbatch, "SCAN_BLOCK", 8)
    _check_scan([path, _write(tmp_path / "g.tfrecord.gz", rows[:9], gz=True)])
    schema = TFRecordFormat(path).infer_schema()
    assert schema.t.shape == (None, 2) and schema.maybe.nullable and schema.img.codec == ScalarCodec(pa.binary())
    assert schema.words.numpy_dtype is np.bytes_ and schema.image.shape == (8, 8, 3)
    records = [encode_example({k: encode_feature(kind, v) for k, (kind, v) in row.items()}) for row in rows[:20]]
    records[6] = b"\x0a\x05\x0a"  # not an Example
    records[9] = records[9][:-1] + b"\x80"  # the last int64 varint cut short
    bad = write_records(str(tmp_path / "b.tfrecord"), records)
    assert "record 6" in _scan([bad], "block", None)
    _check_scan([bad, path])


def test_schema_scan_of_records_that_all_fail(tmp_path: Path) -> None:
    records = [encode_example({"x": encode_feature("int64", [300 + i])})[:-1] + b"\x82" for i in range(5)]
    path = write_records(str(tmp_path / "f.tfrecord"), records)  # each ends inside a varint
    _check_scan([path], samples=(None, 2))
    assert _scan([path], "block", None, "skip") == ({}, 0)


@pytest.mark.parametrize("width", [1, 2, 3, 8])
def test_int_columns_decode_varint_runs_as_the_per_record_parser(width: int) -> None:
    """Packed int64 runs of every shape (one-byte and 10-byte varints, over-long ones, runs cut inside a
    varint, empty runs, other counts), decoded all at once: the values and the rows refused are what
    _packed_varints gives run by run."""
    rng = np.random.default_rng(width)
    runs = []
    for _ in range(3000):
        ints = rng.integers(-(2**63), 2**63 - 1, rng.integers(0, width + 2), dtype=np.int64)
        run = b"".join(encode_feature("int64", [v])[4:] for v in ints.tolist())  # the varints alone
        shape = rng.integers(0, 8)
        if shape == 0 and run:  # cut inside a varint, or anywhere
            run = run[:rng.integers(0, len(run))]
        elif shape == 1:  # an over-long varint (more than 10 bytes)
            run += bytes([0x80] * int(rng.integers(10, 14))) + bytes([int(rng.integers(0, 128))])
        elif shape == 2:  # one-byte varints only
            run = bytes(rng.integers(0, 128, width).tolist())
        runs.append(run)
    data = b"".join(runs)
    arr = np.frombuffer(data, np.uint8)
    sizes = np.array([len(r) for r in runs], np.int64)
    starts = np.cumsum(sizes) - sizes
    bad = np.zeros(len(runs), bool)
    values = tfbatch._int_values(data, arr, starts, sizes, width, bad)
    for i, run in enumerate(runs):
        try:
            expected = np.asarray(_packed_varints(run, 0, len(run)), np.int64)
        except ValueError:
            expected = None
        fits = expected is not None and expected.size == width
        assert bad[i] == (not fits), (i, run)
        if fits:
            assert values[i].tolist() == expected.tolist(), (i, run)
    assert 0 < bad.sum() < len(runs)


def test_binary_columns_are_built_straight_from_the_buffer() -> None:
    """Values of every length (inline views up to 12 bytes, buffer views past that), anywhere in it."""
    rng = np.random.default_rng(9)
    values = [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in [0, 1, 4, 11, 12, 13, 40, 3, 0, 700]]
    gaps = [bytes(rng.integers(0, 256, 5, dtype=np.uint8)) for _ in values]
    data = b"".join(g + v for g, v in zip(gaps, values)) + b"tail"
    sizes = np.array([len(v) for v in values])
    starts = np.cumsum([len(g) for g in gaps]) + np.concatenate([[0], np.cumsum(sizes)[:-1]])
    arr = np.frombuffer(data, np.uint8)
    column = tfbatch._binary_column(data, arr, starts, sizes, text=False)
    column.validate(full=True)
    assert column.type == pa.binary() and column.to_pylist() == values
    picked = np.array([9, 2, 6])  # out of order, not starting at the buffer's start
    assert tfbatch._binary_column(data, arr, starts[picked], sizes[picked], text=False).to_pylist() == \
        [values[i] for i in picked]
    text = [s.encode() for s in ["", "ü", "twelve bytes", "thirteen byte", "ab" * 30]]
    data = b"".join(text)
    sizes = np.array([len(t) for t in text])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    column = tfbatch._binary_column(data, np.frombuffer(data, np.uint8), starts, sizes, text=True)
    assert column.type == pa.string() and column.to_pylist() == [t.decode() for t in text]
    bad = b"ok\xff"
    assert tfbatch._binary_column(bad, np.frombuffer(bad, np.uint8), np.array([0]), np.array([3]), text=True) is None


def test_batches_with_arrow_columns_export_to_every_format(tmp_path: Path) -> None:
    """read_batches' Arrow bytes/text columns go through every writer as their values."""
    from unihub.converters.verify import verify

    rows = [{"image": ("bytes", [_jpeg(i % 3)]), "name": ("bytes", [f"n{i}".encode()]), "id": ("int64", [i])}
            for i in range(12)]
    src = _write(tmp_path / "in.tfrecord", rows)
    schema = TFRecordFormat(src).infer_schema()
    batch = next(iter(TFRecordFormat(src).read_batches(schema)))
    assert isinstance(batch["image"], pa.Array) and isinstance(batch["name"], pa.Array)
    for fmt, target in [("tfrecord", "out.tfrecord"), ("hdf5", "out.h5"), ("webdataset", "wds"),
                        ("imagefolder", "folder")]:
        from unihub.formats.base import FORMATS

        fields = schema if fmt != "imagefolder" else Unischema("s", [schema.image])
        source = TFRecordFormat(src, fields=list(fields.fields))  # a narrower schema says what it leaves out
        FORMATS.get(fmt).write(str(tmp_path / target), fields, source.read_batches(fields))
        if fmt in ("tfrecord", "hdf5"):
            report = verify(src, tmp_path / target)
            assert report.equal, (fmt, report.summary())
    wds = FORMATS.get("webdataset")(str(tmp_path / "wds"))
    back = {k: v for b in wds.read_batches(wds.infer_schema()) for k, v in b.items()}
    assert list(back["image"]) == [_jpeg(i % 3) for i in range(12)]
    assert list(back["name"]) == [f"n{i}" for i in range(12)]
    assert sorted(p.read_bytes() for p in (tmp_path / "folder").rglob("*.jpg")) == \
        sorted(_jpeg(i % 3) for i in range(12))
