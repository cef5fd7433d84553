"""WebDataset ingest loses nothing: every member converts exactly, or the shard is refused with an
error naming shard and key (issue 10). Inputs are written by webdataset's own TarWriter (tarfile
and ``tar cf`` for member orders TarWriter never writes)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest

from unihub import FormatError, ScalarCodec, TensorCodec, Unischema, UnischemaField
from unihub.cli import main
from unihub.converters.convert import convert
from unihub.converters.verify import verify
from unihub.formats.webdataset.format import WebDatasetFormat
from unihub.store.dataset import open_dataset

from .wds_helpers import batch_rows, npy, reader_rows, refused, same, tar_writer_shards, tarfile_shard


def keyed(i: int, **members: bytes) -> dict[str, bytes | str]:
    return {"__key__": f"{i:06d}", **members}


# ------------------------------------------------------------------------- .npy dtypes
def test_npy_dtypes_that_differ_are_refused_naming_shard_and_key(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    """int64 then float64 members: one float64 field would round 2**53 + 1; refused, never promoted."""
    big = np.array([2**53 + 1], np.int64)
    samples = [keyed(i, **{"x.npy": npy(big if i < 5 else np.array([0.5]))}) for i in range(7)]
    tar_writer_shards(tmp_path / "wds", samples, per_shard=4)
    message = (r"field 'x\.npy': \.npy members of different dtypes: int64 in \S+shard-000000\.tar key '000000', "
               r"float64 in \S+shard-000001\.tar key '000005'")
    with pytest.raises(FormatError, match=message) as info:
        WebDatasetFormat(str(tmp_path / "wds")).infer_schema()
    assert info.value.path.endswith("shard-000001.tar")
    parallel = WebDatasetFormat(str(tmp_path / "wds"))
    parallel.workers = 2  # whole shards scanned apart: the same two members are named
    with pytest.raises(FormatError, match=message):
        parallel.infer_schema()
    line = refused(["convert", str(tmp_path / "wds"), str(tmp_path / "ds")], capsys, tmp_path / "ds")
    assert "key '000005'" in line and "shard-000001.tar" in line


def test_npy_ranks_that_differ_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    samples = [keyed(0, **{"x.npy": npy(np.zeros(3, np.float32))}), keyed(1, **{"x.npy": npy(np.zeros((2, 3), np.float32))})]
    tar_writer_shards(tmp_path / "wds", samples)
    line = refused(["convert", str(tmp_path / "wds"), str(tmp_path / "ds")], capsys, tmp_path / "ds")
    assert "different ranks: rank 1 in" in line and "key '000000'" in line and "rank 2 in" in line
    assert "key '000001'" in line


def test_a_given_schema_of_another_dtype_is_refused_naming_member(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    """No silent astype: a member whose dtype is not the field's stops the read at that member."""
    tar_writer_shards(tmp_path / "wds", [keyed(i, **{"x.npy": npy(np.arange(3, dtype=np.int64) + 2**60)})
                                         for i in range(3)])
    schema = Unischema("S", [UnischemaField("__key__", np.str_, (), ScalarCodec(np.str_)),
                             UnischemaField("x.npy", np.float64, (3,), TensorCodec())])
    (tmp_path / "schema.json").write_text(schema.to_json())
    line = refused(["convert", str(tmp_path / "wds"), str(tmp_path / "ds"), "--schema", str(tmp_path / "schema.json")],
                   capsys, tmp_path / "ds")
    assert "shard-000000.tar: sample '000000'" in line and "member '000000.x.npy'" in line
    assert "the .npy holds int64, the field is float64" in line


def test_big_endian_and_fortran_npy_read_back_as_the_same_values(tmp_path: Path) -> None:
    """A byte-order swap (and memory order) changes no value: native-order arrays, bit for bit."""
    values = [np.arange(6, dtype=">f4").reshape(2, 3) * i + 0.1 for i in range(3)]
    tar_writer_shards(tmp_path / "wds", [keyed(i, **{"x.npy": npy(np.asfortranarray(v) if i == 1 else v)})
                                         for i, v in enumerate(values)])
    convert(str(tmp_path / "wds"), str(tmp_path / "ds"), progress=False)
    assert open_dataset(str(tmp_path / "ds")).schema["x.npy"] == UnischemaField("x.npy", np.float32, (2, 3), TensorCodec())
    for row, value in zip(reader_rows(tmp_path / "ds"), values):
        same(row["x.npy"], value.astype("<f4"))
    assert verify(str(tmp_path / "wds"), str(tmp_path / "ds")).equal


# --------------------------------------------------------------------- zero-size arrays
ZERO = {  # member -> the arrays of samples 0..2
    "a.npy": [np.zeros((0,), np.int16)] * 3,
    "b.npy": [np.zeros((i, 0), np.float32) for i in range(3)],
    "c.npy": [np.zeros((3, 0), np.uint8)] * 3,
    "d.npy": [np.arange(i, dtype=np.int64) for i in range(3)],
}


def test_zero_size_arrays_convert_and_read_back_exactly(tmp_path: Path) -> None:
    samples = [keyed(i, **{m: npy(arrays[i]) for m, arrays in ZERO.items()}) for i in range(3)]
    tar_writer_shards(tmp_path / "wds", samples)
    convert(str(tmp_path / "wds"), str(tmp_path / "ds"), progress=False)
    schema = open_dataset(str(tmp_path / "ds")).schema
    assert [(schema[m].numpy_dtype, schema[m].shape) for m in ZERO] == [
        (np.int16, (0,)), (np.float32, (None, 0)), (np.uint8, (3, 0)), (np.int64, (None,))]
    for rows in (reader_rows(tmp_path / "ds"), batch_rows(tmp_path / "ds")):
        assert [r["__key__"] for r in rows] == ["000000", "000001", "000002"]
        for i, row in enumerate(rows):
            for member, arrays in ZERO.items():
                same(row[member], arrays[i], member)
    assert verify(str(tmp_path / "wds"), str(tmp_path / "ds")).equal


# ------------------------------------------------------------------------ text numbers
def test_text_numbers_are_typed_only_where_exact(tmp_path: Path) -> None:
    """int64 where every text is one; float64 where each float prints back as its text; else text."""
    texts = {"a.cls": [b"3", b" 7\n", b"-2"], "b.cls": [b"2.5", b"3", b"1e3"],
             "c.cls": [b"2.5", b"9007199254740993", b"1"],  # 2**53 + 1 is no float64
             "d.cls": [b"1", b"99999999999999999999", b"2"],  # no int64
             "g.cls": [b"2.5", b"10000000000000000", b"-1"],  # 1e16 > 2**53, but a float64 prints it back
             "e.idx": [b"1", b"x", b"2"], "f.txt": [b"ok", b"\xff\xfe not utf-8", b"ok"]}
    samples = [keyed(i, **{m: t[i] for m, t in texts.items()}) for i in range(3)]
    tar_writer_shards(tmp_path / "wds", samples)
    convert(str(tmp_path / "wds"), str(tmp_path / "ds"), progress=False)
    schema = open_dataset(str(tmp_path / "ds")).schema
    assert {m: schema[m].numpy_dtype for m in texts} == {"a.cls": np.int64, "b.cls": np.float64, "c.cls": np.str_,
                                                         "d.cls": np.str_, "e.idx": np.str_, "f.txt": np.bytes_,
                                                         "g.cls": np.float64}
    rows = reader_rows(tmp_path / "ds")
    assert [r["a.cls"] for r in rows] == [3, 7, -2] and [r["b.cls"] for r in rows] == [2.5, 3.0, 1000.0]
    assert [r["c.cls"] for r in rows] == ["2.5", "9007199254740993", "1"]
    assert [r["g.cls"] for r in rows] == [2.5, 1e16, -1.0]
    assert [r["f.txt"] for r in rows] == texts["f.txt"]
    assert verify(str(tmp_path / "wds"), str(tmp_path / "ds")).equal


# ---------------------------------------------------------------- keys that are not adjacent
def scattered(tmp_path: Path) -> Path:
    """All .cls members, then all .jpg ones: what ``tar cf shard.tar *.cls *.jpg`` writes."""
    from unihub.images import decoders as images

    jpg = [images.encode_image(np.full((4, 4, 3), 40 * i, np.uint8), "jpeg") for i in range(3)]
    members = [(f"{i:04d}.cls", str(i).encode()) for i in range(3)] + [(f"{i:04d}.jpg", jpg[i]) for i in range(3)]
    return tarfile_shard(tmp_path / "wds" / "shard-000000.tar", members)


def member_offsets(path: Path) -> dict[str, int]:
    with tarfile.open(path) as tar:
        return {m.name: m.offset for m in tar}


def test_keys_that_are_not_adjacent_are_refused_naming_both_runs(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    shard = scattered(tmp_path)
    offsets = member_offsets(shard)
    message = (rf"shard-000000\.tar: key '0000' has members at offset 0 and again at offset {offsets['0000.jpg']}, "
               r"with other keys between: .* --option group_keys=true")
    with pytest.raises(FormatError, match=message) as info:
        list(WebDatasetFormat(str(shard)).samples())
    assert info.value.offset == offsets["0000.jpg"]
    line = refused(["convert", str(tmp_path / "wds"), str(tmp_path / "ds")], capsys, tmp_path / "ds")
    assert f"key '0000' has members at offset 0 and again at offset {offsets['0000.jpg']}" in line


def test_group_keys_gathers_them(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    scattered(tmp_path)
    assert main(["convert", str(tmp_path / "wds"), str(tmp_path / "ds"), "--option", "group_keys=true",
                 "--quiet"]) == 0
    rows = reader_rows(tmp_path / "ds")
    assert [(r["__key__"], r["cls"]) for r in rows] == [("0000", 0), ("0001", 1), ("0002", 2)]
    assert all(r["jpg"][:3] == b"\xff\xd8\xff" for r in rows)
    assert not verify(str(tmp_path / "wds"), str(tmp_path / "ds")).equal  # tarfile's runs: 6 samples
    report = verify(str(tmp_path / "wds"), str(tmp_path / "ds"), options={"group_keys": True})
    assert report.equal and report.rows_source == 3, report.summary()
    assert main(["verify", str(tmp_path / "wds"), str(tmp_path / "ds"), "--option", "group_keys=true"]) == 0


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs the tar command")
def test_tar_cf_of_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``tar cf`` with the files as a shell glob lists them: every .cls before every .jpg."""
    folder = tmp_path / "files"
    folder.mkdir()
    for i in range(3):
        (folder / f"{i:04d}.cls").write_text(str(i))
        (folder / f"{i:04d}.jpg").write_bytes(b"\xff\xd8\xff" + bytes([i]) * 9)
    (tmp_path / "wds").mkdir()
    names = sorted(p.name for p in folder.glob("*.cls")) + sorted(p.name for p in folder.glob("*.jpg"))
    subprocess.run(["tar", "cf", str(tmp_path / "wds" / "a.tar"), *names], cwd=folder, check=True)
    line = refused(["convert", str(tmp_path / "wds"), str(tmp_path / "ds")], capsys, tmp_path / "ds")
    assert "a.tar: key '0000' has members at offset 0 and again at offset" in line
    convert(str(tmp_path / "wds"), str(tmp_path / "ds"), format_options={"group_keys": True}, progress=False)
    rows = reader_rows(tmp_path / "ds")
    assert [(r["__key__"], r["cls"], r["jpg"]) for r in rows] == [
        (f"{i:04d}", i, b"\xff\xd8\xff" + bytes([i]) * 9) for i in range(3)]


def test_skipping_a_repeated_run_reports_it(tmp_path: Path) -> None:
    shard = scattered(tmp_path)
    source = WebDatasetFormat(str(shard))
    assert [sorted(s.members) for s in source.samples(on_error="skip")] == [["cls"]] * 3
    offsets = member_offsets(shard)
    assert [s.location for s in source.report.skipped] == [f"offset {offsets[f'{i:04d}.jpg']}" for i in range(3)]


def test_a_key_in_two_shards_is_two_samples(tmp_path: Path) -> None:
    """The adjacency rule is per shard, as webdataset's: shards are read apart."""
    tar_writer_shards(tmp_path / "wds", [keyed(0, cls=b"1"), keyed(1, cls=b"2")], per_shard=1)
    tar_writer_shards(tmp_path / "more", [keyed(0, cls=b"3")], per_shard=1)
    shutil.copy(tmp_path / "more" / "shard-000000.tar", tmp_path / "wds" / "shard-000002.tar")
    assert [s.key for s in WebDatasetFormat(str(tmp_path / "wds")).samples()] == ["000000", "000001", "000000"]


def test_json_and_text_stay_byte_exact(tmp_path: Path) -> None:
    text = [json.dumps({"a": i, "b": "ü"}, indent=i).encode() for i in range(3)]
    tar_writer_shards(tmp_path / "wds", [keyed(i, json=text[i], txt=text[i][::-1]) for i in range(3)])
    convert(str(tmp_path / "wds"), str(tmp_path / "ds"), progress=False)
    rows = reader_rows(tmp_path / "ds")
    assert [r["json"].encode() for r in rows] == text and [r["txt"].encode() for r in rows] == [t[::-1] for t in text]


def test_a_member_the_given_schema_lacks_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    tar_writer_shards(tmp_path / "wds", [keyed(i, cls=b"1", **({"extra.txt": b"late"} if i == 2 else {}))
                                         for i in range(3)])
    schema = Unischema("S", [UnischemaField("__key__", np.str_, (), ScalarCodec(np.str_)),
                             UnischemaField("cls", np.int64, (), ScalarCodec(np.int64))])
    (tmp_path / "schema.json").write_text(schema.to_json())
    line = refused(["convert", str(tmp_path / "wds"), str(tmp_path / "ds"), "--schema", str(tmp_path / "schema.json")],
                   capsys, tmp_path / "ds")
    assert "shard-000000.tar: sample '000002'" in line and "member '000002.extra.txt' has no field" in line


def test_sixteen_bit_pngs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A 16-bit PNG decodes to uint16: the field says so; 8- and 16-bit members in one field are refused."""
    from unihub import make_reader
    from unihub.images import decoders as images

    deep = [np.arange(60, dtype=np.uint16).reshape(4, 5, 3) * 1000 + i for i in range(2)]
    tar_writer_shards(tmp_path / "wds", [keyed(i, png=images.encode_image(deep[i], "png")) for i in range(2)])
    convert(str(tmp_path / "wds"), str(tmp_path / "ds"), progress=False)
    assert open_dataset(str(tmp_path / "ds")).schema["png"].numpy_dtype is np.uint16
    with make_reader(str(tmp_path / "ds"), shuffle_row_groups=False) as reader:
        for row, expected in zip(reader, deep):
            same(row.png, expected)
    shallow = images.encode_image(np.zeros((4, 5, 3), np.uint8), "png")
    tar_writer_shards(tmp_path / "mixed", [keyed(0, png=images.encode_image(deep[0], "png")), keyed(1, png=shallow)])
    line = refused(["convert", str(tmp_path / "mixed"), str(tmp_path / "ds2")], capsys, tmp_path / "ds2")
    assert "images of different bit depths: 16-bit in" in line and "8-bit in" in line and "key '000001'" in line


@pytest.mark.parametrize(("texts", "dtype"), [
    ([b"1", b"3\n", b" 7 ", b"003"], "int64"),  # the numbers they spell, as webdataset's int() reads them
    ([b"1", b"-0", b"7"], "float64"),           # -0 is no int: float64 keeps its sign
])
def test_integer_text_keeps_the_number_it_spells(tmp_path: Path, texts: list[bytes],
                                                                   dtype: str) -> None:
    tar_writer_shards(tmp_path / "src", [{"__key__": f"{i:04d}", "cls": t} for i, t in enumerate(texts)])
    convert(tmp_path / "src", tmp_path / "ds")
    field = open_dataset(str(tmp_path / "ds")).schema["cls"]
    assert getattr(field.numpy_dtype, "__name__", "") == dtype or np.dtype(field.numpy_dtype).name == dtype
    report = verify(tmp_path / "src", tmp_path / "ds")
    assert report.equal, report.summary()
