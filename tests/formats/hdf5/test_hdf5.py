"""HDF5 ingest and export (formats/hdf5/format.py) on real h5py files made in tmp_path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from unihub import (
    CompressedImageCodec,
    NdarrayCodec,
    ScalarCodec,
    TensorCodec,
    Unischema,
    UnischemaField,
    make_reader,
    write_dataset,
)
from unihub.converters.convert import convert
from unihub.converters.verify import verify
from unihub.dependencies import is_available
from unihub.errors import DatasetExistsError, FormatError, SchemaError
from unihub.formats.base import FORMATS, detect_format
from unihub.formats.hdf5 import read as hdf5_read

pytestmark = pytest.mark.skipif(not is_available("h5py"), reason="h5py is not installed")
h5py = pytest.importorskip("h5py")

from unihub.formats.hdf5.format import HDF5Format  # noqa: E402

N = 25


def read_all(fmt: HDF5Format, schema: Unischema, batch_size: int = 7) -> dict[str, list]:
    """Every row of every field, as lists (ragged and object columns compare row by row)."""
    out: dict[str, list] = {f.name: [] for f in schema}
    for batch in fmt.read_batches(schema, batch_size=batch_size):
        assert set(batch) == set(out)
        for name, values in batch.items():
            out[name].extend(list(values))
    return out


def assert_rows_equal(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if x is None or y is None:
            assert x is None and y is None
        elif isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray) and x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_array_equal(x, y)
        else:
            assert type(x) is type(y) and x == y


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    """Flat and nested groups, many dtypes, strings, vlen numbers, chunked and contiguous, attributes."""
    path = tmp_path / "sample.h5"
    with h5py.File(path, "w") as f:
        f.attrs.update({"title": "demo", "version": np.int32(3), "scale": 0.5, "ids": np.arange(3),
                        "raw": np.bytes_(b"abc")})
        f["f16"] = np.arange(N, dtype=np.float16) / 4
        f["i8"] = (np.arange(N) - 12).astype(np.int8)
        f["flag"] = np.arange(N) % 3 == 0
        f.create_dataset("images/pixels", data=np.arange(N * 6, dtype=np.uint16).reshape(N, 2, 3), chunks=(4, 2, 3))
        f["images/meta/label"] = np.arange(N, dtype=np.int64) * 10
        f["images"].attrs["source"] = "camera"
        f["images/pixels"].attrs.update({"units": "counts", "range": np.array([0, 65535], dtype=np.uint16)})
        f.create_dataset("text/vlen", data=[f"zoë {i}" for i in range(N)], dtype=h5py.string_dtype())
        f.create_dataset("text/fixed", data=np.array([b"row%02d" % i for i in range(N)], dtype="S5"))
        f.create_dataset("text/fixed_utf8", data=[f"é{i}".encode() for i in range(N)],
                         dtype=h5py.string_dtype("utf-8", 8))
        f["text/binary"] = np.array([b"\xff\xfe%d" % i for i in range(N)], dtype="S4")
        f.create_dataset("text/pairs", data=[[f"a{i}", f"b{i}"] for i in range(N)], dtype=h5py.string_dtype())
        vlen = f.create_dataset("ragged", (N,), dtype=h5py.vlen_dtype(np.float32))
        for i in range(N):
            vlen[i] = np.arange(i % 4, dtype=np.float32) + i
        f["count"] = 7  # scalar dataset: metadata
        f["count"].attrs["note"] = "a scalar"
    return path


def test_infers_flat_and_nested_fields(sample: Path) -> None:
    schema = HDF5Format(str(sample)).infer_schema()
    assert schema.name == "sample"
    assert list(schema.fields) == sorted(schema.fields)  # h5py visits names in order
    assert "count" not in schema.fields
    assert schema["f16"] == UnischemaField("f16", np.float16, (), ScalarCodec(np.float16))
    assert schema["i8"] == UnischemaField("i8", np.int8, (), ScalarCodec(np.int8))
    assert schema["flag"] == UnischemaField("flag", np.bool_, (), ScalarCodec(np.bool_))
    assert schema["images/pixels"] == UnischemaField("images/pixels", np.uint16, (2, 3), TensorCodec())
    assert schema["images/meta/label"].numpy_dtype is np.int64
    assert schema["ragged"] == UnischemaField("ragged", np.float32, (None,), TensorCodec())

    rows = read_all(HDF5Format(str(sample)), schema)
    np.testing.assert_array_equal(np.array(rows["f16"]), np.arange(N, dtype=np.float16) / 4)
    assert np.array(rows["i8"]).dtype == np.int8 and rows["i8"][0] == -12
    assert np.array(rows["flag"]).dtype == np.bool_
    np.testing.assert_array_equal(np.stack(rows["images/pixels"]), np.arange(N * 6, dtype=np.uint16).reshape(N, 2, 3))
    assert rows["images/meta/label"][3] == 30
    assert_rows_equal(rows["ragged"], [np.arange(i % 4, dtype=np.float32) + i for i in range(N)])


def test_batches_are_numpy_columns_of_batch_size(sample: Path) -> None:
    fmt = HDF5Format(sample)
    schema = fmt.infer_schema()
    batches = list(fmt.read_batches(schema, batch_size=10))
    assert [len(b["i8"]) for b in batches] == [10, 10, 5]
    assert batches[0]["images/pixels"].shape == (10, 2, 3)
    assert batches[0]["f16"].dtype == np.float16
    assert fmt.report.records == N


def test_strings_vlen_and_fixed(sample: Path) -> None:
    fmt = HDF5Format(sample, fields=["text"])
    schema = fmt.infer_schema()
    assert list(schema.fields) == ["text/binary", "text/fixed", "text/fixed_utf8", "text/pairs", "text/vlen"]
    for name in ("text/vlen", "text/fixed", "text/fixed_utf8"):
        assert schema[name] == UnischemaField(name, np.str_, (), ScalarCodec(pa.string()))
    assert schema["text/binary"] == UnischemaField("text/binary", np.bytes_, (), ScalarCodec(pa.binary()))
    assert schema["text/pairs"] == UnischemaField("text/pairs", np.str_, (2,), None)
    rows = read_all(fmt, schema)
    assert rows["text/vlen"][:2] == ["zoë 0", "zoë 1"]
    assert rows["text/fixed"][3] == "row03"
    assert rows["text/fixed_utf8"][4] == "é4"
    assert rows["text/binary"][5] == b"\xff\xfe5"
    assert rows["text/pairs"][6].tolist() == ["a6", "b6"]


def test_attributes_and_scalars_are_metadata(sample: Path) -> None:
    meta = HDF5Format(sample).metadata()["hdf5"]
    json.dumps(meta)  # JSON-able
    assert meta["attributes"] == {"title": "demo", "version": 3, "scale": 0.5, "ids": [0, 1, 2], "raw": "abc"}
    assert meta["datasets"]["images/pixels"] == {"units": "counts", "range": [0, 65535]}
    assert meta["datasets"]["count"] == {"note": "a scalar"}
    assert meta["groups"] == {"images": {"source": "camera"}}
    assert meta["scalars"] == {"count": 7}


def test_reads_chunk_sized_slices_never_the_whole_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.h5"
    n = 10_000
    with h5py.File(path, "w") as f:
        f.create_dataset("chunked", data=np.arange(n * 4, dtype=np.float64).reshape(n, 4), chunks=(500, 4))
        f.create_dataset("contiguous", data=np.arange(n, dtype=np.int32))  # no chunks
    requests: dict[str, list[tuple[int, int]]] = {"chunked": [], "contiguous": []}
    real = hdf5_read._read_rows

    def watched(dataset, start, stop):
        requests[dataset.name.lstrip("/")].append((start, stop))
        return real(dataset, start, stop)

    monkeypatch.setattr(hdf5_read, "_read_rows", watched)
    fmt = HDF5Format(path, slice_mb=0.01)  # ~10 KB slices: 327 rows of 32 B, 2621 rows of 4 B
    schema = fmt.infer_schema()
    total = {"chunked": 0, "contiguous": 0}
    for batch in fmt.read_batches(schema, batch_size=300):
        total["chunked"] += len(batch["chunked"])
        total["contiguous"] += len(batch["contiguous"])
    assert total == {"chunked": n, "contiguous": n}
    # chunked: whole chunks (at least one), each read once, in order
    assert requests["chunked"] == [(s, s + 500) for s in range(0, n, 500)]
    # contiguous: ~10 KB slices, each read once
    step = int(0.01 * (1 << 20)) // 4
    assert requests["contiguous"] == [(s, min(s + step, n)) for s in range(0, n, step)]
    assert all(stop - start < n for reqs in requests.values() for start, stop in reqs)


def test_mismatched_lengths_name_file_datasets_and_lengths(tmp_path: Path) -> None:
    path = tmp_path / "mixed.h5"
    with h5py.File(path, "w") as f:
        f["a"] = np.arange(10)
        f["g/b"] = np.arange(10.0)
        f["c"] = np.arange(7)
    with pytest.raises(FormatError) as info:
        HDF5Format(path).infer_schema()
    message = str(info.value)
    assert str(path) in message and info.value.path == str(path)
    assert "10 rows: 'a', 'g/b'" in message and "7 rows: 'c'" in message
    assert "fields=" in message and "ignore_mismatched" in message

    assert list(HDF5Format(path, fields=["a", "g"]).infer_schema().fields) == ["a", "g/b"]
    with pytest.warns(UserWarning, match="'c': 7"):
        schema = HDF5Format(path, ignore_mismatched=True).infer_schema()
    assert list(schema.fields) == ["a", "g/b"]
    with pytest.raises(FormatError, match="no dataset or group 'nope'"):
        HDF5Format(path, fields=["nope"]).infer_schema()
    # a schema naming datasets of different lengths is refused at read time too
    schema = Unischema("s", [UnischemaField("a", np.int64, ()), UnischemaField("c", np.int64, ())])
    with pytest.raises(FormatError, match="7 rows: 'c'"):
        next(HDF5Format(path).read_batches(schema))


def test_corrupt_or_foreign_file_is_a_format_error_naming_it(tmp_path: Path, sample: Path) -> None:
    text = tmp_path / "notes.h5"
    text.write_text("this is not HDF5\n" * 10)
    with pytest.raises(FormatError) as info:
        HDF5Format(text).infer_schema()
    assert str(text) in str(info.value) and info.value.path == str(text)
    assert not HDF5Format.detect(str(text))

    truncated = tmp_path / "truncated.h5"
    data = sample.read_bytes()
    truncated.write_bytes(data[: len(data) // 3])
    with pytest.raises(FormatError, match="truncated.h5"):
        fmt = HDF5Format(truncated)
        list(fmt.read_batches(fmt.infer_schema()))


def test_registered_and_detected(sample: Path, tmp_path: Path) -> None:
    assert FORMATS.get("h5") is HDF5Format and FORMATS.get("hdf5") is HDF5Format
    assert FORMATS.by_extension(".h5") == FORMATS.by_extension(".hdf5") == FORMATS.by_extension(".he5") == "hdf5"
    assert HDF5Format.detect(str(sample))
    renamed = tmp_path / "data.bin"
    renamed.write_bytes(sample.read_bytes())
    assert HDF5Format.detect(str(renamed))


def test_a_folder_of_hdf5_files_is_detected(sample: Path, tmp_path: Path) -> None:
    """A folder of HDF5 files converts without --from (it needed ``--from hdf5``); a folder where any of the
    first files is something else is not claimed (the folder is read whole, every file in it)."""
    folder = tmp_path / "parts"
    (folder / "nested").mkdir(parents=True)
    (folder / "a.h5").write_bytes(sample.read_bytes())
    (folder / "nested" / "b.data").write_bytes(sample.read_bytes())
    (folder / ".hidden.txt").write_text("left out, as a folder's listing leaves it out")
    assert detect_format(str(folder)) == "hdf5"
    convert(str(folder), str(tmp_path / "out"))
    with make_reader(str(tmp_path / "out"), shuffle_row_groups=False) as reader:
        assert sorted(int(row.i8) for row in reader) == sorted(2 * list(range(-12, N - 12)))
    (folder / "notes.txt").write_text("not HDF5")
    assert not HDF5Format.detect(str(folder)) and detect_format(str(folder)) is None
    assert not HDF5Format.detect(str(tmp_path / "empty")) and not HDF5Format.detect(str(tmp_path / "out"))


def test_ingest_export_ingest_round_trip(sample: Path, tmp_path: Path) -> None:
    fmt = HDF5Format(sample)
    schema = fmt.infer_schema()
    target = tmp_path / "out" / "export.h5"
    target.parent.mkdir()
    assert HDF5Format.write(str(target), schema, fmt.read_batches(schema, batch_size=6)) == [str(target)]
    again = HDF5Format(target)
    assert again.infer_schema() == schema  # name, dtypes (float16, int8, uint16, bool), shapes, codecs
    first, second = read_all(HDF5Format(sample), schema), read_all(again, schema, batch_size=11)
    for name in schema.fields:
        assert_rows_equal(first[name], second[name])
    with h5py.File(target) as f:  # plain h5py reads it
        assert f["images/pixels"].shape == (N, 2, 3) and f["images/pixels"].dtype == np.uint16
        assert f["images/pixels"].chunks is not None and f["images/pixels"].maxshape == (None, 2, 3)
        assert h5py.check_string_dtype(f["text/vlen"].dtype).encoding == "utf-8"
        assert f["text/vlen"].asstr()[1] == "zoë 1"
        assert f["flag"].dtype == np.bool_
    assert os.listdir(target.parent) == ["export.h5"]


def png(i: int) -> bytes:
    from unihub.images.decoders import encode_image

    return encode_image(np.full((4, 5, 3), i, dtype=np.uint8), "png", 80)


EXPORT_SCHEMA = Unischema("Export", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("score", np.float32, (), ScalarCodec(pa.float32()), True),
    UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), True),
    UnischemaField("blob", np.bytes_, (), ScalarCodec(pa.binary()), False),
    UnischemaField("boxes", np.float32, (None, 4), TensorCodec(), False),
    UnischemaField("ragged", np.uint8, (None, None), TensorCodec(), True),
    UnischemaField("bits", np.bool_, (None,), TensorCodec(), False),
    UnischemaField("nested/vec", np.float16, (3,), TensorCodec(), True),
    UnischemaField("image", np.uint8, (4, 5, 3), CompressedImageCodec("png"), False),
])


def export_batches(n: int = 9, batch_size: int = 4):
    for start in range(0, n, batch_size):
        rows = range(start, min(start + batch_size, n))
        yield {
            "id": np.array(list(rows), dtype=np.int64),
            "score": [None if i % 3 == 0 else np.float32(i / 2) for i in rows],
            "name": [None if i == 4 else f"n{i}" for i in rows],
            "blob": [bytes([i, 0, 255]) for i in rows],
            "boxes": [np.full((i % 3, 4), i, dtype=np.float32) for i in rows],
            "ragged": [None if i == 5 else np.full((i % 2 + 1, i % 3), i, dtype=np.uint8) for i in rows],
            "bits": [np.arange(i) % 2 == 0 for i in rows],
            "nested/vec": [None if i == 2 else np.arange(3, dtype=np.float16) + i for i in rows],
            "image": [png(i) for i in rows],
        }


def test_write_ragged_nullable_images_and_read_back(tmp_path: Path) -> None:
    target = str(tmp_path / "export.h5")
    HDF5Format.write(target, EXPORT_SCHEMA, export_batches())
    with h5py.File(target) as f:
        assert h5py.check_vlen_dtype(f["boxes"].dtype) == np.float32
        assert "boxes__shape" in f and f["ragged__shape"].shape == (9, 2) and "bits__shape" not in f
        np.testing.assert_array_equal(f["score__isnull"][:], np.arange(9) % 3 == 0)
        assert bytes(f["image"][3].tobytes()) == png(3)  # encoded bytes kept
        assert f["nested"]["vec"].shape == (9, 3)
    fmt = HDF5Format(target)
    assert fmt.infer_schema() == EXPORT_SCHEMA
    got = read_all(fmt, EXPORT_SCHEMA, batch_size=5)
    want: dict[str, list] = {f.name: [] for f in EXPORT_SCHEMA}
    for batch in export_batches():
        for name, values in batch.items():
            want[name].extend(list(values))
    for name in ("boxes", "ragged", "bits", "nested/vec", "blob", "name"):
        assert_rows_equal(got[name], want[name])
    assert got["image"] == [png(i) for i in range(9)]
    assert got["score"] == [None if i % 3 == 0 else np.float32(i / 2) for i in range(9)]
    assert got["id"] == list(range(9))
    assert "boxes__shape" not in fmt.metadata()["hdf5"]["datasets"]


def test_write_images_as_pixels(tmp_path: Path) -> None:
    target = str(tmp_path / "pixels.h5")
    schema = EXPORT_SCHEMA.select(["id", "image"])
    HDF5Format.write(target, schema, ({k: b[k] for k in ("id", "image")} for b in export_batches()), images="pixels")
    with h5py.File(target) as f:
        assert f["image"].shape == (9, 4, 5, 3) and f["image"].dtype == np.uint8
        assert (f["image"][7] == 7).all()
    back = HDF5Format(target).infer_schema()
    assert back["image"] == UnischemaField("image", np.uint8, (4, 5, 3), TensorCodec())


def test_write_is_atomic_and_refuses_an_existing_target(tmp_path: Path) -> None:
    target = tmp_path / "out.h5"

    def failing():
        yield from export_batches(4)
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        HDF5Format.write(str(target), EXPORT_SCHEMA, failing())
    assert os.listdir(tmp_path) == []
    HDF5Format.write(str(target), EXPORT_SCHEMA, export_batches())
    with pytest.raises(DatasetExistsError):
        HDF5Format.write(str(target), EXPORT_SCHEMA, export_batches())
    HDF5Format.write(str(target), EXPORT_SCHEMA, export_batches(3), overwrite=True)
    with h5py.File(target) as f:
        assert f["id"].shape == (3,)
    assert os.listdir(tmp_path) == ["out.h5"]


def test_a_shape_hdf5_cannot_hold_is_a_named_error_and_nothing_is_written(tmp_path: Path) -> None:
    """A field of rows of shape (2**32,) (a Unischema may say any shape): h5py's raw ValueError ('All chunk dimensions
    must be less than 2^32') escaped the export."""
    schema = Unischema("Big", [UnischemaField("t", np.uint8, (2**32,), NdarrayCodec(), False)])
    write_dataset(tmp_path / "ds", schema, iter([]))
    with pytest.raises(SchemaError, match=r"HDF5 dataset 't': rows of shape \(4294967296,\) cannot be stored in HDF5 "
                                          r"\(All chunk dimensions must be less than 2\^32"):
        convert(str(tmp_path / "ds"), str(tmp_path / "out.h5"), to_format="hdf5", progress=False)
    assert sorted(os.listdir(tmp_path)) == ["ds"]


def test_a_string_holding_nul_is_a_named_error_and_bytes_keep_theirs(tmp_path: Path) -> None:
    """HDF5's variable-length strings cannot hold '\\x00': the export failed with h5py's raw ValueError; it names
    the dataset and row now, and writes nothing. Bytes fields keep their NULs (opaque, byte for byte)."""
    schema = Unischema("Nul", [UnischemaField("raw", np.bytes_, (), None, False),
                               UnischemaField("s", np.str_, (), None, False)])
    write_dataset(tmp_path / "ds", schema, [{"raw": b"\xff\x00" * i + b"\x00", "s": "a\x00b" if i == 3 else "ab"}
                                            for i in range(5)])
    with pytest.raises(SchemaError, match=r"HDF5 dataset '/s', row 3: a variable-length HDF5 string cannot hold a "
                                          r"NUL character"):
        convert(str(tmp_path / "ds"), str(tmp_path / "out.h5"), to_format="hdf5", progress=False)
    assert sorted(os.listdir(tmp_path)) == ["ds"]
    bytes_only = Unischema("Nul", [schema.fields["raw"]])
    write_dataset(tmp_path / "raw", bytes_only, [{"raw": b"\xff\x00" * i + b"\x00"} for i in range(5)])
    convert(str(tmp_path / "raw"), str(tmp_path / "raw.h5"), to_format="hdf5", progress=False)
    with h5py.File(tmp_path / "raw.h5") as f:
        assert [bytes(v) for v in f["raw"][:]] == [b"\xff\x00" * i + b"\x00" for i in range(5)]


def test_batches_feed_the_parquet_writer(sample: Path, tmp_path: Path) -> None:
    from unihub import make_reader, write_dataset

    fmt = HDF5Format(sample)
    schema = fmt.infer_schema()
    result = write_dataset(tmp_path / "pq", schema, fmt.read_batches(schema, batch_size=8), batched=True)
    assert result.num_rows == N
    with make_reader(str(tmp_path / "pq"), shuffle_row_groups=False, reader_pool_type="dummy") as reader:
        rows = [dict(zip(schema.fields, row)) for row in reader]  # 'group/name' is no identifier: by position
    expected = read_all(HDF5Format(sample), schema)
    for name in schema.fields:
        if name == "text/pairs":  # the reader decodes codec-less string lists as lists
            assert [row[name] for row in rows] == [v.tolist() for v in expected[name]]
        else:
            assert_rows_equal([row[name] for row in rows], expected[name])


def test_module_imports_without_h5py(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['h5py'] = None\n"
            "from unihub.formats.hdf5.format import HDF5Format\n"
            "from unihub.errors import MissingDependencyError\n"
            f"try:\n    HDF5Format({str(tmp_path / 'x.h5')!r}).infer_schema()\n"
            "except MissingDependencyError as e:\n    print('MISSING', e)\n")
    (tmp_path / "x.h5").write_bytes(b"")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "MISSING" in out and "unihub[hdf5]" in out


def test_exports_the_shared_sample_schema(tmp_path: Path, schema: Unischema, rows) -> None:
    """Every codec of tests/conftest.py's schema (decimals, NdarrayCodec, nulls, ragged) round-trips."""
    source = list(rows(30))
    batches = ({f.name: [r[f.name] for r in source[i:i + 8]] for f in schema} for i in range(0, 30, 8))
    target = str(tmp_path / "sample.h5")
    HDF5Format.write(target, schema, batches)
    fmt = HDF5Format(target)
    assert fmt.infer_schema() == schema
    got = read_all(fmt, schema, batch_size=9)
    for f in schema:
        for i, (found, expected) in enumerate(zip(got[f.name], (r[f.name] for r in source))):
            if isinstance(expected, np.ndarray) or expected is None:
                assert_rows_equal([found], [expected])
            else:
                assert found == expected, (f.name, i)


def test_read_errors_raise_or_are_skipped(sample: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = hdf5_read._read_rows

    def flaky(dataset, start, stop):
        if dataset.name == "/i8" and start <= 10 < stop:
            raise OSError("Can't read data (inflate() failed)")
        return real(dataset, start, stop)

    monkeypatch.setattr(hdf5_read, "_read_rows", flaky)
    fmt = HDF5Format(sample, fields=["i8", "f16"], slice_mb=1e-5)  # 10-byte slices: 10 rows of int8
    schema = fmt.infer_schema()
    with pytest.raises(FormatError, match=r"sample.h5: cannot read rows 10\.\.14: .*inflate"):
        list(fmt.read_batches(schema, batch_size=5))
    fmt = HDF5Format(sample, fields=["i8", "f16"], slice_mb=1e-5)
    batches = list(fmt.read_batches(schema, batch_size=5, on_error="skip"))
    # the unreadable slice (rows 10..19 of 'i8') is read again for each batch it feeds, just that batch's
    # rows: the one holding row 10 is skipped, the other still comes
    assert np.concatenate([b["i8"] for b in batches]).tolist() == [i - 12 for i in range(N) if not 10 <= i < 15]
    assert [s.location for s in fmt.report.skipped] == ["rows 10..14"]
    assert "dataset '/i8' rows 10..14: " in fmt.report.skipped[0].reason
    assert "inflate" in fmt.report.skipped[0].reason and fmt.report.records == N - 5


def test_a_damaged_chunk_is_named_and_costs_only_the_batches_it_feeds(tmp_path: Path) -> None:
    """A file whose one gzip chunk is damaged (rows 500..599 of 'x'): the read of the aligned 8 MB slice
    holding every row failed, so the error named rows 0..255 (which read well), and ``on_error='skip'``
    skipped every batch: nothing was converted. The slice is read again a chunk at a time."""
    src = tmp_path / "damaged.h5"
    with h5py.File(src, "w") as f:
        f.create_dataset("x", data=np.arange(10_000.0).reshape(1000, 10), chunks=(100, 10), compression="gzip")
        f["y"] = np.arange(1000)
        chunk = f["x"].id.get_chunk_info(5)
        assert chunk.chunk_offset == (500, 0)
    data = bytearray(src.read_bytes())
    data[chunk.byte_offset + 10:chunk.byte_offset + 40] = bytes(30)
    src.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=r"damaged\.h5: cannot read rows 256\.\.511: dataset '/x' rows 500\.\.599: "):
        convert(src, tmp_path / "ds", progress=False)
    result = convert(src, tmp_path / "ds", on_error="skip", progress=False)
    assert [s.location for s in result.skipped] == ["rows 256..511", "rows 512..767"]
    with make_reader(str(tmp_path / "ds"), shuffle_row_groups=False) as reader:
        assert [row.y for row in reader] == [*range(256), *range(768, 1000)]
    # verify, reading with h5py itself, raised h5py's bare OSError, naming no file
    with pytest.raises(FormatError, match=r"damaged\.h5: h5py cannot read dataset '/x' rows 256\.\.511: "):
        verify(src, tmp_path / "ds")
