"""unihub -> WebDataset -> unihub gives the dataset back exactly: field names, the Unischema (dtypes,
shapes, codecs, nullability) and every value; and WebDataset -> unihub -> WebDataset gives the
shards' members back. The export records the schema in a PAX global header that webdataset and
tar ignore (issue 10)."""

from __future__ import annotations

import decimal
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from unihub import (
    CompressedImageCodec,
    FormatError,
    NdarrayCodec,
    ScalarCodec,
    SchemaError,
    TensorCodec,
    Unischema,
    UnischemaField,
    write_dataset,
)
from unihub.cli import main
from unihub.converters.convert import convert
from unihub.converters.verify import verify
from unihub.formats.webdataset.format import WebDatasetFormat
from unihub.images import decoders as images
from unihub.store.dataset import open_dataset

from .wds_helpers import batch_rows, npy, reader_rows, refused, same, tar_writer_shards, tarfile_shard, wds

ROWS = 7
PNG = [images.encode_image(np.full((4, 5, 3), 30 * i, np.uint8), "png") for i in range(ROWS)]
JPG = [images.encode_image(np.full((4, 5, 3), 30 * i, np.uint8), "jpeg") for i in range(ROWS)]

SCHEMA = Unischema("Everything", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("image", np.uint8, (4, 5, 3), CompressedImageCodec("png"), False),  # JPEG cells too
    UnischemaField("photo", np.uint8, (None, 5, 3), CompressedImageCodec("jpeg", 90), True),
    UnischemaField("seg.png", np.uint8, (4, 5, 3), CompressedImageCodec("png"), False),
    UnischemaField("jpg", np.uint8, (4, 5, 3), CompressedImageCodec("jpeg"), False),
    UnischemaField("boxes", np.float32, (None, 4), TensorCodec(), False),
    UnischemaField("empty", np.int16, (3, 0), TensorCodec(), False),
    UnischemaField("ragged0", np.float64, (None, 0), TensorCodec(), True),
    UnischemaField("emb", np.float16, (3,), NdarrayCodec(), False),
    UnischemaField("label", np.int32, (), ScalarCodec(pa.int32()), False),
    UnischemaField("huge", np.uint64, (), ScalarCodec(pa.uint64()), False),
    UnischemaField("score", np.float32, (), ScalarCodec(pa.float32()), True),
    UnischemaField("cls", np.float64, (), ScalarCodec(pa.float64()), False),
    UnischemaField("flag", np.bool_, (), ScalarCodec(pa.bool_()), False),
    UnischemaField("caption", np.str_, (), ScalarCodec(pa.string()), True),
    UnischemaField("group/blob", np.bytes_, (), ScalarCodec(pa.binary()), False),
    UnischemaField("price", decimal.Decimal, (), ScalarCodec(pa.decimal128(10, 3)), False),
    UnischemaField("when", np.datetime64, (), ScalarCodec(pa.timestamp("us")), False),
])


def row(i: int) -> dict[str, Any]:
    return {
        "id": i, "image": JPG[i] if i % 2 else PNG[i], "photo": None if i == 3 else JPG[i],
        "seg.png": PNG[i], "jpg": JPG[i],
        "boxes": np.arange(4 * (i % 3), dtype=np.float32).reshape(-1, 4) / 3,
        "empty": np.zeros((3, 0), np.int16), "ragged0": None if i == 2 else np.zeros((i, 0), np.float64),
        "emb": np.array([i, -0.0, np.inf], np.float16), "label": np.int32(-i), "huge": np.uint64(2**64 - 1 - i),
        "score": None if i == 1 else np.float32(i / 3), "cls": [np.nan, -0.0, 0.1, 2.5, 1e300, -np.inf, -np.nan][i],
        "flag": bool(i % 2), "caption": None if i == 4 else f"caption {i} ü\n", "group/blob": bytes([i, 0, 255]),
        "price": decimal.Decimal(i * 1001) / 1000, "when": np.datetime64(1_600_000_000_000_000 + i, "us"),
    }


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    write_dataset(str(tmp_path / "ds"), SCHEMA, [row(i) for i in range(ROWS)])
    return tmp_path / "ds"


def assert_rows_equal(a: Path, b: Path) -> None:
    for read in (reader_rows, batch_rows):
        before, after = read(a), read(b)
        assert len(before) == len(after) == ROWS
        for x, y in zip(before, after):
            assert x.keys() == y.keys()
            for name in x:
                same(y[name], x[name], name)


def test_unihub_webdataset_unihub_gives_the_dataset_back(dataset: Path, tmp_path: Path) -> None:
    convert(str(dataset), str(tmp_path / "shards"), to_format="webdataset", format_options={"samples_per_shard": 3},
            progress=False)
    assert sorted(os.listdir(tmp_path / "shards")) == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    convert(str(tmp_path / "shards"), str(tmp_path / "back"), progress=False)
    assert open_dataset(str(tmp_path / "back")).schema == SCHEMA  # names, dtypes, shapes, codecs, nullability
    assert_rows_equal(dataset, tmp_path / "back")
    assert verify(str(dataset), str(tmp_path / "shards")).equal  # the export, against tarfile's reading
    assert verify(str(tmp_path / "shards"), str(tmp_path / "back")).equal  # the ingest, likewise
    assert verify(str(dataset), str(tmp_path / "back")).equal  # unihub against unihub, row by row
    convert(str(tmp_path / "shards"), str(tmp_path / "parallel"), workers=2, progress=False)
    assert_rows_equal(dataset, tmp_path / "parallel")


def test_image_members_say_their_bytes(dataset: Path, tmp_path: Path) -> None:
    """A png field holding JPEG cells writes .jpg members; names that say the format stay."""
    convert(str(dataset), str(tmp_path / "shards"), to_format="webdataset", progress=False)
    with tarfile.open(tmp_path / "shards" / "shard-000000.tar") as tar:
        names = tar.getnames()
    assert [n for n in names if ".image." in n] == [f"{i:09d}.image.{'jpg' if i % 2 else 'png'}" for i in range(ROWS)]
    assert f"{0:09d}.seg.png" in names and f"{0:09d}.jpg" in names and f"{0:09d}.photo.jpg" in names
    for name, data in _members(tmp_path / "shards" / "shard-000000.tar").items():
        if name.endswith((".png", ".jpg")):
            assert images.detect_format(data) == ("png" if name.endswith(".png") else "jpeg"), name


def test_webdataset_and_tar_see_only_the_samples(dataset: Path, tmp_path: Path) -> None:
    convert(str(dataset), str(tmp_path / "shards"), to_format="webdataset", progress=False)
    shard = str(tmp_path / "shards" / "shard-000000.tar")
    theirs = list(wds.WebDataset(shard, shardshuffle=False))
    assert [s["__key__"] for s in theirs] == [f"{i:09d}" for i in range(ROWS)]
    assert sorted(k for k in theirs[0] if not k.startswith("__")) == sorted(
        ["id", "image.png", "photo.jpg", "seg.png", "jpg", "boxes.npy", "empty.npy", "ragged0.npy", "emb.npy",
         "label.cls", "huge.cls", "score.npy", "cls", "flag.npy", "caption.txt", "group.blob", "price.txt",
         "when.npy"])
    decode = wds.autodecode.Decoder([wds.autodecode.imagehandler("rgb8")])
    decoded = decode({k: theirs[1][k] for k in ("__key__", "image.jpg", "label.cls", "boxes.npy", "caption.txt")})
    assert decoded["image.jpg"].shape == (4, 5, 3) and decoded["label.cls"] == -1
    assert decoded["boxes.npy"].shape == (1, 4) and decoded["caption.txt"] == "caption 1 ü\n"
    if shutil.which("tar"):
        listing = subprocess.run(["tar", "tf", shard], capture_output=True, text=True, check=True)
        assert listing.stdout.split() == _names(shard) and not listing.stderr
        subprocess.run(["tar", "xf", shard, "-C", str(tmp_path)], check=True, capture_output=True)
        assert sorted(p.name for p in tmp_path.glob("0000*")) == sorted(_names(shard))


def test_a_subset_of_the_shards_keeps_its_keys(dataset: Path, tmp_path: Path) -> None:
    """Without the first shards the export's row keys are no row numbers: they become ``__key__``."""
    convert(str(dataset), str(tmp_path / "shards"), to_format="webdataset", format_options={"samples_per_shard": 3},
            progress=False)
    tail = str(tmp_path / "shards" / "shard-00000{1..2}.tar")
    convert(tail, str(tmp_path / "tail"), progress=False)
    schema = open_dataset(str(tmp_path / "tail")).schema
    assert list(schema.fields)[0] == "__key__" and Unischema("Everything", list(schema)[1:]) == SCHEMA
    assert [r["__key__"] for r in reader_rows(tmp_path / "tail")] == [f"{i:09d}" for i in range(3, ROWS)]
    assert verify(tail, str(tmp_path / "tail")).equal


def test_no_rows_still_export_the_schema(tmp_path: Path) -> None:
    files = WebDatasetFormat.write(str(tmp_path / "shards"), SCHEMA, [])
    assert [os.path.basename(f) for f in files] == os.listdir(tmp_path / "shards") == ["shard-000000.tar"]
    assert list(wds.WebDataset(files[0], shardshuffle=False, empty_check=False)) == []
    convert(str(tmp_path / "shards"), str(tmp_path / "back"), progress=False)
    store = open_dataset(str(tmp_path / "back"))
    assert store.schema == SCHEMA and store.num_rows == 0


# ----------------------------------------------------------- shards changed after export
def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isreg()}  # type: ignore[union-attr]


def _names(path: str | Path) -> list[str]:
    with tarfile.open(path) as tar:
        return tar.getnames()


def _rewrite(path: Path, members: dict[str, bytes]) -> None:
    """The shard with other members, its unihub header kept."""
    with tarfile.open(path) as tar:
        header = dict(tar.pax_headers)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, pax_headers=header) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("change", ["member added", "sample removed"])
def test_a_shard_changed_after_export_is_refused(dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                 change: str) -> None:
    convert(str(dataset), str(tmp_path / "shards"), to_format="webdataset", progress=False)
    shard = tmp_path / "shards" / "shard-000000.tar"
    members = _members(shard)
    if change == "member added":
        members["000000002.extra.txt"] = b"new"
        expected = "member '000000002.extra.txt' is not in the Unischema the unihub export recorded"
    else:
        members = {n: d for n, d in members.items() if not n.startswith("000000002.")}
        expected = "sample '000000003' (offset"
    _rewrite(shard, dict(sorted(members.items())))
    line = refused(["convert", str(tmp_path / "shards"), str(tmp_path / "back")], capsys, tmp_path / "back")
    assert "shard-000000.tar" in line and expected in line and "unihub_schema=false" in line
    convert(str(tmp_path / "shards"), str(tmp_path / "back"), format_options={"unihub_schema": False}, progress=False)
    assert "image.png" in open_dataset(str(tmp_path / "back")).schema.fields  # named by extension


def test_shards_of_two_exports_or_of_none_are_not_mixed(dataset: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    convert(str(dataset), str(tmp_path / "shards"), to_format="webdataset", progress=False)
    tar_writer_shards(tmp_path / "plain", [{"__key__": "k", "cls": b"1"}])
    shutil.copy(tmp_path / "plain" / "shard-000000.tar", tmp_path / "shards" / "shard-000001.tar")
    line = refused(["convert", str(tmp_path / "shards"), str(tmp_path / "back")], capsys, tmp_path / "back")
    assert "shard-000000.tar holds the Unischema of a unihub export but" in line and "shard-000001.tar" in line


# ----------------------------------------------------------------- WebDataset round trip
def test_webdataset_unihub_webdataset_keeps_member_names(tmp_path: Path) -> None:
    """Fields ingested by extension (``seg.png``, ``jpg``, a .png member holding a JPEG) export under
    the same extensions: the shards' members come back."""
    samples = [{"__key__": f"{i:04d}", "jpg": JPG[i], "seg.png": PNG[i], "png": JPG[i] if i == 2 else PNG[i],
                "cls": str(i).encode(), "boxes.npy": npy(np.zeros((i, 2), np.int16))} for i in range(5)]
    tar_writer_shards(tmp_path / "wds", samples, per_shard=5)
    convert(str(tmp_path / "wds"), str(tmp_path / "ds"), progress=False)
    assert list(open_dataset(str(tmp_path / "ds")).schema.fields) == ["__key__", "boxes.npy", "cls", "jpg", "png",
                                                                      "seg.png"]
    convert(str(tmp_path / "ds"), str(tmp_path / "out"), to_format="webdataset", progress=False)
    theirs = list(wds.WebDataset(str(tmp_path / "out" / "shard-000000.tar"), shardshuffle=False))
    for sample, expected in zip(theirs, samples):
        assert {k: v for k, v in sample.items() if k == "__key__" or not k.startswith("__")} == expected
    assert verify(str(tmp_path / "ds"), str(tmp_path / "out")).equal
    assert verify(str(tmp_path / "wds"), str(tmp_path / "ds")).equal
    convert(str(tmp_path / "out"), str(tmp_path / "again"), progress=False)
    assert open_dataset(str(tmp_path / "again")).schema == open_dataset(str(tmp_path / "ds")).schema


# ------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(("field", "value", "message"), [
    (UnischemaField("tags", np.str_, (None,), None, False), np.array(["a", "b"]),
     "field 'tags' .* has no WebDataset member form"),
    (UnischemaField("a.b", np.int64, (), ScalarCodec(pa.int64()), False), 1, "field 'a.b' .* 'a.b.cls', which field 'a/b'"),
    (UnischemaField("__key__", np.str_, (), ScalarCodec(pa.string()), True), None, "'__key__' is null"),
])
def test_exports_that_would_not_read_back_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                      field: UnischemaField, value: Any, message: str) -> None:
    schema = Unischema("R", [UnischemaField("a/b", np.int64, (), ScalarCodec(pa.int64()), False), field])
    write_dataset(str(tmp_path / "ds"), schema, [{"a/b": 1, field.name: value}])
    line = refused(["convert", str(tmp_path / "ds"), str(tmp_path / "out"), "--to", "webdataset"], capsys,
                   tmp_path / "out", SchemaError)
    with pytest.raises(SchemaError, match=message) as info:
        WebDatasetFormat.write(str(tmp_path / "direct"), schema, [{"a/b": [1], field.name: [value]}])
    assert line == f"unihub: error: {info.value}"
    assert not (tmp_path / "direct").exists() or os.listdir(tmp_path / "direct") == []


def test_no_header_member_or_sample_for_third_party_readers(tmp_path: Path) -> None:
    """A unihub header in the middle of a shard (two exports joined) is refused."""
    write_dataset(str(tmp_path / "ds"), Unischema("S", [UnischemaField("x", np.int64, ())]), [{"x": 1}])
    convert(str(tmp_path / "ds"), str(tmp_path / "a"), to_format="webdataset", progress=False)
    raw = (tmp_path / "a" / "shard-000000.tar").read_bytes()
    with tarfile.open(tmp_path / "a" / "shard-000000.tar") as tar:
        end = max(m.offset_data + ((m.size + 511) // 512) * 512 for m in tar)
    joined = tarfile_shard(tmp_path / "j" / "j.tar", [])
    joined.write_bytes(raw[:end] + raw)  # tar -A style: the second archive's headers follow the first's members
    with pytest.raises(FormatError, match=r"j\.tar: a unihub header at offset \d+ follows samples"):
        list(WebDatasetFormat(str(joined)).samples())


def test_shards_read_back_in_export_order_whatever_their_names(tmp_path: Path) -> None:
    """``p-10.tar`` sorts before ``p-2.tar``; the header's first row puts it back in its place."""
    schema = Unischema("S", [UnischemaField("x", np.int64, (), ScalarCodec(pa.int64()), False)])
    write_dataset(str(tmp_path / "ds"), schema, [{"x": i} for i in range(12)])
    convert(str(tmp_path / "ds"), str(tmp_path / "shards"), to_format="webdataset",
            format_options={"samples_per_shard": 1, "pattern": "p-%d.tar"}, progress=False)
    assert sorted(os.listdir(tmp_path / "shards"))[:3] == ["p-0.tar", "p-1.tar", "p-10.tar"]
    for workers in (1, 2):
        convert(str(tmp_path / "shards"), str(tmp_path / f"back{workers}"), workers=workers, progress=False)
        assert open_dataset(str(tmp_path / f"back{workers}")).schema == schema
        assert [r["x"] for r in reader_rows(tmp_path / f"back{workers}")] == list(range(12))
    assert verify(str(tmp_path / "shards"), str(tmp_path / "back1")).equal


def test_an_export_repeating_a_key_in_a_shard_reads_back(tmp_path: Path) -> None:
    """Two shards that each number their keys from 0 export into one shard with each key twice, apart;
    the export wrote each row's members together, so ingest reads each run as its row (as webdataset
    and verify do), where a tar made by ``tar cf`` would be refused."""
    for shard in range(2):
        tarfile_shard(tmp_path / "wds" / f"s{shard}.tar",
                      [(f"{key}.{ext}", f"{shard}{key}".encode()) for key in ("3", "1") for ext in ("txt", "cls")])
    convert(str(tmp_path / "wds"), str(tmp_path / "ds"), progress=False)
    convert(str(tmp_path / "ds"), str(tmp_path / "out"), to_format="webdataset", progress=False)
    shards = sorted(str(p) for p in (tmp_path / "out").iterdir())
    assert [s["__key__"] for s in wds.WebDataset(shards, shardshuffle=False)] == ["3", "1", "3", "1"]
    convert(str(tmp_path / "out"), str(tmp_path / "again"), progress=False)
    assert [(r["__key__"], r["txt"]) for r in reader_rows(tmp_path / "again")] == [
        ("3", "03"), ("1", "01"), ("3", "13"), ("1", "11")]
    assert verify(str(tmp_path / "out"), str(tmp_path / "again")).equal
    assert verify(str(tmp_path / "ds"), str(tmp_path / "again")).equal


def test_a_row_of_nulls_is_refused_not_dropped(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A null leaves its member out, so a row with every field null would be a sample of no member:
    it vanished from the export (exit 0, a row fewer)."""
    schema = Unischema("N", [UnischemaField("x", np.int64, (), ScalarCodec(pa.int64()), True)])
    write_dataset(str(tmp_path / "ds"), schema, [{"x": 1}, {"x": None}, {"x": 3}])
    line = refused(["convert", str(tmp_path / "ds"), str(tmp_path / "out"), "--to", "webdataset"], capsys,
                   tmp_path / "out", SchemaError)
    assert "row 1 (key '000000001'): every field is null" in line


@pytest.mark.parametrize(("pattern", "message"), [
    ("../x-%d.tar", "shards must stay inside the export's folder, and it has a '..' component"),
    ("/tmp/x-%d.tar", "shards must stay inside the export's folder, and it is an absolute path"),
    ("x%.0s.tar", "every shard gets that one name"),
    ("x-%.1s.tar", r"names shard 10 'x-1\.tar', as it named one before"),
    ("_x-%d.tar", "starts with '.' or '_' is left out"),
    ("x-%d", "named .tar so that reading the folder finds them"),
    ("x-%d.tar.gz", "named .tar so that reading the folder finds them"),
])
def test_a_pattern_whose_shards_would_not_read_back_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                              pattern: str, message: str) -> None:
    """A pattern with '..' wrote the shards beside the staged export, which was published empty (exit 0,
    'converted 12 rows'), or outside it; one naming two shards alike kept only the last one's rows."""
    schema = Unischema("S", [UnischemaField("x", np.int64, (), ScalarCodec(pa.int64()), False)])
    write_dataset(str(tmp_path / "ds"), schema, [{"x": i} for i in range(12)])
    (tmp_path / "out").mkdir()
    argv = ["convert", str(tmp_path / "ds"), str(tmp_path / "out" / "export"), "--to", "webdataset",
            "--option", "samples_per_shard=1", "--option", f"pattern={pattern}"]
    with pytest.raises(SchemaError, match=message):
        main(["--verbose", *argv])
    assert main(argv) == 1
    assert "unihub: error: pattern " in capsys.readouterr().err
    assert list((tmp_path / "out").iterdir()) == [] and sorted(os.listdir(tmp_path)) == ["ds", "out"]
