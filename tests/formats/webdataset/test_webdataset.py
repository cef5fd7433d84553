"""WebDataset tar shards: key rule, schema inference, reading, bad input, export that webdataset reads back."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unihub import CompressedImageCodec, FormatError, ScalarCodec, SchemaError, TensorCodec, Unischema, UnischemaField
from unihub.cli import main
from unihub.converters.convert import convert
from unihub.converters.verify import verify
from unihub.formats.base import FORMATS, python_columns
from unihub.formats.webdataset.format import WebDatasetFormat, split_name
from unihub.images import decoders as images
from unihub.store.dataset import open_dataset
from unihub.store.writer import write_dataset

wds = pytest.importorskip("webdataset")

from .wds_helpers import tar_writer_shards  # noqa: E402  (after the skip: it imports webdataset)

SHARDS, PER_SHARD = 3, 5


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def make_sample(i: int) -> dict[str, Any]:
    """Sample ``i``: fixed PNG, JPEG of varying size, fixed and ragged tensors, optional text."""
    rng = np.random.default_rng(i)
    sample = {
        "__key__": f"{i:06d}",
        "png": images.encode_image(rng.integers(0, 255, (8, 6, 3), dtype=np.uint8), "png"),
        "seg.png": images.encode_image(np.full((8, 6), i, np.uint8), "png"),
        "jpg": images.encode_image(rng.integers(0, 255, (8 + i % 3, 8, 3), dtype=np.uint8), "jpeg"),
        "npy": npy(np.arange(4, dtype=np.float32) * i),
        "boxes.npy": npy(np.full((i % 3, 2), i, dtype=np.int16)),
        "cls": str(i % 4).encode(),
        "json": json.dumps({"id": i, "tags": ["a", "b"][: i % 3]}).encode(),
        "bin": bytes([i, 0, 255]),
    }
    if i % 2 == 0:
        sample["txt"] = f"caption {i} ünï".encode()
    return sample


def write_shards(root: Path, samples: list[dict[str, Any]], per_shard: int = PER_SHARD) -> list[Path]:
    return tar_writer_shards(root, samples, per_shard)


@pytest.fixture()
def shards(tmp_path: Path) -> Path:
    write_shards(tmp_path / "wds", [make_sample(i) for i in range(SHARDS * PER_SHARD)])
    return tmp_path / "wds"


def read_rows(source: WebDatasetFormat, schema: Unischema | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    schema = schema or source.infer_schema()
    rows = []
    for batch in map(python_columns, source.read_batches(schema, **kwargs)):  # Arrow columns as lists
        n = len(next(iter(batch.values())))
        rows.extend({name: values[i] for name, values in batch.items()} for i in range(n))
    return rows


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


# ------------------------------------------------------------------------- key rule
@pytest.mark.parametrize("name", ["a.png", "dir/000.seg.png", "a.b/c.JPG", ".hidden", "noext", "x.", "d.d/.x"])
def test_key_rule_is_webdatasets(name: str) -> None:
    key, ext = wds.tariterators.base_plus_ext(name)
    assert split_name(name) == (None if key is None else (key, ext.lower()))


def test_registered_by_name_alias_and_extension() -> None:
    assert FORMATS.get("wds") is WebDatasetFormat and FORMATS.get("tar") is WebDatasetFormat
    assert FORMATS.by_extension(".tar") == "webdataset"


# ------------------------------------------------------------------------ inference
def test_infer_schema(shards: Path) -> None:
    schema = WebDatasetFormat(str(shards / "shard-{000000..000002}.tar")).infer_schema()
    fields = schema.fields
    assert list(fields) == ["__key__", "bin", "boxes.npy", "cls", "jpg", "json", "npy", "png", "seg.png", "txt"]
    assert fields["__key__"] == UnischemaField("__key__", np.str_, (), ScalarCodec(np.str_), False)
    assert fields["png"] == UnischemaField("png", np.uint8, (8, 6, 3), CompressedImageCodec("png"), False)
    assert fields["seg.png"].shape == (8, 6)
    assert fields["jpg"].shape == (None, 8, 3) and fields["jpg"].codec == CompressedImageCodec("jpeg")
    assert fields["npy"] == UnischemaField("npy", np.float32, (4,), TensorCodec(), False)
    assert fields["boxes.npy"] == UnischemaField("boxes.npy", np.int16, (None, 2), TensorCodec(), False)
    assert fields["cls"].numpy_dtype is np.int64
    assert fields["json"].numpy_dtype is np.str_ and fields["txt"].numpy_dtype is np.str_
    assert fields["bin"].numpy_dtype is np.bytes_
    assert fields["txt"].nullable and not fields["cls"].nullable


def test_infer_from_a_sample_of_records(shards: Path) -> None:
    schema = WebDatasetFormat(str(shards)).infer_schema(sample_records=1)
    assert schema["jpg"].shape == (8, 8, 3) and not schema["txt"].nullable


def test_text_classes_that_are_not_ints(tmp_path: Path) -> None:
    write_tar(tmp_path / "a.tar", [("0.cls", b"1.5"), ("0.idx", b"x"), ("1.cls", b"2"), ("1.idx", b"7")])
    schema = WebDatasetFormat(str(tmp_path / "a.tar")).infer_schema()
    assert schema["cls"].numpy_dtype is np.float64 and schema["idx"].numpy_dtype is np.str_


# -------------------------------------------------------------------------- reading
def test_read_values(shards: Path) -> None:
    source = WebDatasetFormat(str(shards / "shard-{000000..000002}.tar"))
    schema = source.infer_schema()
    batches = list(source.read_batches(schema, batch_size=4))
    assert [len(b["__key__"]) for b in batches] == [4, 4, 4, 3]
    assert batches[0]["npy"].shape == (4, 4) and batches[0]["cls"].dtype == np.int64
    assert all(type(v) is bytes for v in batches[0]["png"])  # encoded, never a numpy bytes_ array
    assert isinstance(batches[0]["boxes.npy"], list) and isinstance(batches[1]["txt"], list)
    rows = read_rows(source, schema)
    assert source.report.records == 2 * SHARDS * PER_SHARD and not source.report.skipped
    for i, row in enumerate(rows):
        expected = make_sample(i)
        assert row["__key__"] == expected["__key__"]
        for ext in ("png", "seg.png", "jpg", "bin"):
            assert row[ext] == expected[ext]
        np.testing.assert_array_equal(row["npy"], np.arange(4, dtype=np.float32) * i)
        assert row["boxes.npy"].shape == (i % 3, 2) and row["boxes.npy"].dtype == np.int16
        assert row["cls"] == i % 4
        assert json.loads(row["json"]) == json.loads(expected["json"])
        assert row["txt"] == (expected["txt"].decode() if i % 2 == 0 else None)


def test_reads_what_webdataset_reads(shards: Path) -> None:
    pattern = str(shards / "shard-{000000..000002}.tar")
    theirs = list(wds.WebDataset(pattern, shardshuffle=False))
    ours = read_rows(WebDatasetFormat(pattern))
    assert [s["__key__"] for s in theirs] == [r["__key__"] for r in ours]
    for sample, row in zip(theirs, ours):
        for ext in ("png", "jpg", "seg.png", "bin"):
            assert sample[ext] == row[ext]


def test_sources_directory_glob_and_list(shards: Path) -> None:
    (shards / "README.md").write_text("not a shard")
    names = sorted(str(p) for p in shards.glob("*.tar"))
    assert WebDatasetFormat(str(shards)).files() == names
    assert WebDatasetFormat(str(shards / "*.tar")).files() == names
    assert WebDatasetFormat(names[::-1]).files() == names
    # the folder in a brace list, and one of its shards spelt another way: the shards (no README), each
    # once, or its samples were stored twice
    assert WebDatasetFormat(f"{{{shards},{shards}/./{os.path.basename(names[0])}}}").files() == names
    assert WebDatasetFormat.detect(str(shards)) and WebDatasetFormat.detect(names[0])
    assert WebDatasetFormat(str(shards)).metadata() == {"webdataset": {"shards": [os.path.basename(n) for n in names],
                                                                       "image_extensions": "name"}}


def test_gzipped_shard(tmp_path: Path) -> None:
    with tarfile.open(tmp_path / "a.tar.gz", "w:gz") as tar:
        for name, data in [("k1.cls", b"3"), ("k2.cls", b"4")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    rows = read_rows(WebDatasetFormat(str(tmp_path / "a.tar.gz")))
    assert [(r["__key__"], r["cls"]) for r in rows] == [("k1", 3), ("k2", 4)]


# ------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("bad, lacks", [("noext", "key"), (".hidden", "key"), ("a.", "extension")])
def test_a_member_without_key_or_extension_is_named_and_skippable(tmp_path: Path, bad: str, lacks: str) -> None:
    """``k.``: webdataset's rule gives it a key and an empty extension, which names no field; the inference
    raised a bare SchemaError (``a field name must be a non-empty string, got ''``) naming no shard or member."""
    path = write_tar(tmp_path / "bad.tar", [("a.cls", b"1"), (bad, b"?"), ("b.cls", b"2")])
    source = WebDatasetFormat(str(path))
    schema = source.infer_schema()
    assert list(schema.fields) == ["__key__", "cls"]
    with pytest.raises(FormatError, match=rf"bad\.tar: member '{re.escape(bad)}' at offset 1024 has no {lacks}") as info:
        read_rows(source, schema)
    assert info.value.path == str(path) and info.value.offset == 1024
    skipping = WebDatasetFormat(str(path))
    assert [r["cls"] for r in read_rows(skipping, schema, on_error="skip")] == [1, 2]
    assert [(s.path, s.location) for s in skipping.report.skipped] == [(str(path), "offset 1024")]


def test_directories_and_metadata_members_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "dirs.tar"
    with tarfile.open(path, "w") as tar:
        tar.addfile(tarfile.TarInfo("__index__"), io.BytesIO(b""))
        folder = tarfile.TarInfo("train")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        info = tarfile.TarInfo("train/x.cls")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"5"))
    assert [(r["__key__"], r["cls"]) for r in read_rows(WebDatasetFormat(str(path)))] == [("train/x", 5)]


def test_duplicate_extension_in_a_sample(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "dup.tar", [("a.cls", b"1"), ("a.cls", b"2")])
    with pytest.raises(FormatError, match="dup.tar: member 'a.cls' at offset 1024: key 'a' already has a .cls"):
        read_rows(WebDatasetFormat(str(path)))


@pytest.mark.parametrize(("cut", "kept"), [(3072 + 700, ["000", "001"]), (3072 + 100, ["000"]), (3072, ["000"])])
def test_truncated_tar(tmp_path: Path, cut: int, kept: list[str]) -> None:
    """Cut inside member 2's data, inside its header, and exactly before it (1536 bytes a member).

    Only the first cut proves sample '001' complete (member 2 starts another key); otherwise
    the last sample may have lost members and is left out too.
    """
    members = [(f"{i:03d}.bin", bytes(1000)) for i in range(5)]
    whole = write_tar(tmp_path / "whole.tar", members).read_bytes()
    path = tmp_path / "cut.tar"
    path.write_bytes(whole[:cut])
    with pytest.raises(FormatError, match=r"cut\.tar: truncated or corrupt tar after offset 3072") as info:
        read_rows(WebDatasetFormat(str(path)), WebDatasetFormat(str(tmp_path / "whole.tar")).infer_schema())
    assert info.value.path == str(path) and info.value.offset == 3072
    source = WebDatasetFormat(str(path))
    assert [r["__key__"] for r in read_rows(source, on_error="skip")] == kept
    assert [s.location for s in source.report.skipped] == ["offset 3072"]


def test_not_a_tar(tmp_path: Path) -> None:
    (tmp_path / "junk.tar").write_bytes(b"junk" * 300)
    with pytest.raises(FormatError, match="junk.tar"):
        read_rows(WebDatasetFormat(str(tmp_path / "junk.tar")),
                  Unischema("S", [UnischemaField("__key__", np.str_, (), ScalarCodec(np.str_))]))


def test_corrupt_npy_and_image(tmp_path: Path) -> None:
    good = make_sample(0)
    samples = [good, {**make_sample(1), "npy": b"\x93NUMPY garbage"}, {**make_sample(2), "png": b"\x89PNG\r\n\x1a\nxx"}]
    write_shards(tmp_path, samples, per_shard=3)
    shard = str(tmp_path / "shard-000000.tar")
    schema = WebDatasetFormat(shard).infer_schema()  # corrupt values do not change the schema
    assert schema["npy"].shape == (4,) and schema["png"].shape == (8, 6, 3)
    with pytest.raises(FormatError, match=r"shard-000000\.tar: sample '000001' \(offset \d+\), member '000001\.npy'"):
        read_rows(WebDatasetFormat(shard), schema)
    source = WebDatasetFormat(shard)
    assert [r["__key__"] for r in read_rows(source, schema, on_error="skip")] == ["000000"]
    assert [s.location for s in source.report.skipped] == ["key 000001", "key 000002"]
    assert "not a readable PNG" in source.report.skipped[1].reason


def test_missing_member_of_a_required_field(shards: Path) -> None:
    source = WebDatasetFormat(str(shards))
    inferred = source.infer_schema()
    schema = Unischema("S", [f._replace(nullable=False) if f.name == "txt" else f for f in inferred])
    with pytest.raises(FormatError, match=r"sample '000001' .* has no member for field 'txt', which is not nullable"):
        read_rows(source, schema)


# -------------------------------------------------------------------------- writing
def test_export_reads_back_with_webdataset(shards: Path, tmp_path: Path) -> None:
    source = WebDatasetFormat(str(shards))
    schema = source.infer_schema()
    files = WebDatasetFormat.write(str(tmp_path / "out"), schema, source.read_batches(schema, batch_size=4),
                                   samples_per_shard=6)
    assert [os.path.basename(f) for f in files] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert sorted(os.listdir(tmp_path / "out")) == [os.path.basename(f) for f in files]  # no temporaries
    theirs = list(wds.WebDataset(str(tmp_path / "out" / "shard-{000000..000002}.tar"), shardshuffle=False))
    assert len(theirs) == SHARDS * PER_SHARD
    for i, sample in enumerate(theirs):
        expected = make_sample(i)
        assert sorted(k for k in sample if not k.startswith("__")) == sorted(k for k in expected if k != "__key__")
        for ext, data in expected.items():
            if ext in ("npy", "boxes.npy"):
                np.testing.assert_array_equal(np.load(io.BytesIO(sample[ext])), np.load(io.BytesIO(data)))
            elif ext == "__key__":
                assert sample[ext] == data
            else:
                assert sample[ext] == data, ext
    decoded = next(iter(wds.WebDataset(files[0], shardshuffle=False).decode("rgb8")))
    assert decoded["png"].shape == (8, 6, 3) and decoded["cls"] == 0 and decoded["npy"].shape == (4,)


def test_an_export_to_a_file_named_x_tar_is_that_one_shard(shards: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``convert ds out.tar`` made a folder named out.tar holding shard-000000.tar, and out.tar.gz a
    folder of plain tars."""
    convert(str(shards), tmp_path / "ds", progress=False)
    assert main(["convert", str(tmp_path / "ds"), str(tmp_path / "out.tar"), "--quiet"]) == 0
    assert (tmp_path / "out.tar").is_file() and tarfile.is_tarfile(tmp_path / "out.tar")
    theirs = list(wds.WebDataset(str(tmp_path / "out.tar"), shardshuffle=False))
    assert len(theirs) == SHARDS * PER_SHARD
    for i, sample in enumerate(theirs):
        assert all(sample[ext] == data for ext, data in make_sample(i).items() if ext not in ("npy", "boxes.npy"))
    assert verify(str(shards), str(tmp_path / "out.tar")).equal
    assert convert(tmp_path / "out.tar", tmp_path / "back", progress=False).rows == SHARDS * PER_SHARD
    # with samples_per_shard given, a folder of shards as before, whatever its name
    convert(tmp_path / "ds", tmp_path / "many.tar", format_options={"samples_per_shard": 6}, progress=False)
    assert sorted(os.listdir(tmp_path / "many.tar")) == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    for name in ("out.tar.gz", "out.tgz"):
        assert main(["convert", str(tmp_path / "ds"), str(tmp_path / name), "--quiet"]) == 1
        assert capsys.readouterr().err == (f"unihub: error: {name}: a WebDataset export writes plain tar; name the "
                                           "one shard x.tar, or a folder for shards of samples_per_shard samples "
                                           "(compress them afterwards)\n")
        assert not (tmp_path / name).exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no staging left


def test_overwrite_replaces_unihubs_own_shards_and_no_other_tar(shards: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Before: --overwrite refused a folder of shards, or a tar, that unihub's own export wrote (a tar 'records no
    writer'), though each shard's PAX header is unihub's."""
    convert(str(shards), tmp_path / "ds", progress=False)
    for target in ("out", "out.tar"):
        assert main(["convert", str(tmp_path / "ds"), str(tmp_path / target), "--to", "webdataset", "--quiet"]) == 0
        assert main(["convert", str(tmp_path / "ds"), str(tmp_path / target), "--to", "webdataset", "--quiet",
                     "--overwrite"]) == 0, capsys.readouterr().err
    theirs = tmp_path / "out" / "theirs.tar"
    with tarfile.open(theirs, "w") as tar:  # a tar of another writer's beside the shards: the folder is not ours
        tar.add(shards / os.listdir(shards)[0], arcname="x.tar")
    for target, why in (("out", "is a folder of 2 entries that is not a unihub dataset"),
                        ("out/theirs.tar", "is a webdataset file that unihub cannot tell it wrote (it holds no mark "
                                           "of a unihub export)")):
        before = theirs.read_bytes()
        assert main(["convert", str(tmp_path / "ds"), str(tmp_path / target), "--to", "webdataset", "--quiet",
                     "--overwrite"]) == 1
        assert why in capsys.readouterr().err and theirs.read_bytes() == before


def test_a_folder_of_shards_in_several_folders_says_so_and_reads_uppercase_tar(shards: Path, tmp_path: Path) -> None:
    """Before: train/ and val/ under one folder were merged into one dataset without a word, and a shard named
    x.TAR was left out of its folder (as was detecting the folder as WebDataset)."""
    names = sorted(os.listdir(shards))
    for folder, name in (("train", names[0]), ("val", names[1])):
        (tmp_path / "two" / folder).mkdir(parents=True)
        os.link(shards / name, tmp_path / "two" / folder / name)
    result = convert(str(tmp_path / "two"), tmp_path / "ds", from_format="webdataset", progress=False)
    assert result.rows == 2 * PER_SHARD
    assert result.notes == [f"the shards come from 2 folders ({tmp_path / 'two' / 'train'}, {tmp_path / 'two' / 'val'}),"
                            " read as one dataset: convert each folder on its own to keep them apart"]
    assert convert(str(tmp_path / "two" / "val"), tmp_path / "val", progress=False).notes == []
    (tmp_path / "upper").mkdir()
    os.link(shards / names[2], tmp_path / "upper" / "LAST.TAR")
    result = convert(str(tmp_path / "upper"), tmp_path / "upper_ds", progress=False)
    assert result.from_format == "webdataset" and result.rows == PER_SHARD


def _parquet_batches(root: Path):
    store = open_dataset(str(root))
    for index in range(len(store.row_groups)):
        table = store.read_row_group(index)
        yield {f.name: (f.codec.decode_column(f, table[f.name], decode=False) if isinstance(f.codec, CompressedImageCodec)
                        else f.codec.decode_column(f, table[f.name])) for f in store.schema}


def test_ingest_to_parquet_export_ingest(shards: Path, tmp_path: Path) -> None:
    source = WebDatasetFormat(str(shards))
    schema = source.infer_schema()
    write_dataset(str(tmp_path / "pq"), schema, source.read_batches(schema, batch_size=4), batched=True)
    WebDatasetFormat.write(str(tmp_path / "back"), schema, _parquet_batches(tmp_path / "pq"), samples_per_shard=4)
    again = WebDatasetFormat(str(tmp_path / "back"))
    assert again.infer_schema() == schema
    before, after = read_rows(WebDatasetFormat(str(shards)), schema), read_rows(again, schema)
    assert len(before) == len(after) == SHARDS * PER_SHARD
    for a, b in zip(before, after):
        assert a.keys() == b.keys()
        for name in a:
            if isinstance(a[name], np.ndarray):
                np.testing.assert_array_equal(a[name], b[name])
                assert a[name].dtype == b[name].dtype
            else:
                assert a[name] == b[name], name


def test_export_of_other_field_names(tmp_path: Path) -> None:
    schema = Unischema("Other", [
        UnischemaField("image", np.uint8, (4, 4, 3), CompressedImageCodec("jpeg"), False),
        UnischemaField("boxes", np.float32, (None, 4), TensorCodec(), False),
        UnischemaField("label", np.int32, (), ScalarCodec(np.int32), False),
        UnischemaField("score", np.float32, (), ScalarCodec(np.float32), True),
        UnischemaField("caption", np.str_, (), ScalarCodec(np.str_), False),
        UnischemaField("group/blob", np.bytes_, (), ScalarCodec(np.bytes_), False),
    ])
    batch = {
        "image": [np.zeros((4, 4, 3), np.uint8)] * 3,
        "boxes": [np.ones((i, 4), np.float32) for i in range(3)],
        "label": np.arange(3, dtype=np.int32),
        "score": [0.5, None, 1.5],
        "caption": ["a", "b", "c"],
        "group/blob": [b"x", b"y", b"z"],
    }
    files = WebDatasetFormat.write(str(tmp_path / "o"), schema, [batch], samples_per_shard=2, pattern="p-%d.tar")
    assert [os.path.basename(f) for f in files] == ["p-0.tar", "p-1.tar"]
    with tarfile.open(files[0]) as tar:
        assert sorted(tar.getnames())[:6] == ["000000000.boxes.npy", "000000000.caption.txt", "000000000.group.blob",
                                              "000000000.image.jpg", "000000000.label.cls", "000000000.score.npy"]
    source = WebDatasetFormat(str(tmp_path / "o"))
    assert source.infer_schema() == schema  # the export's header gives the schema back, names included
    rows = read_rows(source)
    assert [r["label"] for r in rows] == [0, 1, 2] and all(type(r["label"]) is np.int32 for r in rows)
    assert [r["score"] for r in rows] == [0.5, None, 1.5] and type(rows[0]["score"]) is np.float32
    assert [r["boxes"].shape for r in rows] == [(0, 4), (1, 4), (2, 4)]
    assert [r["group/blob"] for r in rows] == [b"x", b"y", b"z"]
    assert images.decode_image(rows[0]["image"]).shape == (4, 4, 3)
    by_extension = WebDatasetFormat(str(tmp_path / "o"), unihub_schema=False)  # as any WebDataset
    rows = read_rows(by_extension)
    assert [r["label.cls"] for r in rows] == [0, 1, 2]
    assert [r["score.npy"] for r in rows] == [0.5, None, 1.5]
    assert [r["boxes.npy"].shape for r in rows] == [(0, 4), (1, 4), (2, 4)]
    assert images.decode_image(rows[0]["image.jpg"]).shape == (4, 4, 3)


@pytest.mark.parametrize(("keys", "message"), [(["a", "a.b"], "would not read back"), (["a", "a"], "repeats")])
def test_export_refuses_keys_that_do_not_read_back(tmp_path: Path, keys: list[str], message: str) -> None:
    schema = Unischema("K", [UnischemaField("__key__", np.str_, (), ScalarCodec(np.str_)),
                             UnischemaField("cls", np.int64, (), ScalarCodec(np.int64))])
    with pytest.raises(ValueError, match=message):
        WebDatasetFormat.write(str(tmp_path / "k"), schema, [{"__key__": keys, "cls": [1, 2]}])
    assert os.listdir(tmp_path / "k") == []  # the partial shard was removed


def test_a_key_split_across_two_shards_exports_where_a_shard_ends_between(tmp_path: Path) -> None:
    """``k.txt`` ending one source shard and ``k.cls`` starting the next are two samples to webdataset (it ends
    a sample at a shard's end) and two rows here; an export that puts a shard boundary between them wrote
    nothing ('key repeats the previous row's'), one that puts them in one shard must refuse."""
    tar_writer_shards(tmp_path / "src", [{"__key__": "j", "txt": b"0"}, {"__key__": "k", "txt": b"1"},
                                         {"__key__": "k", "cls": b"2"}], per_shard=2)
    convert(str(tmp_path / "src"), str(tmp_path / "ds"), progress=False)
    convert(str(tmp_path / "ds"), str(tmp_path / "out"), to_format="webdataset", progress=False,
            format_options={"samples_per_shard": 2})
    found = [{k: v for k, v in s.items() if k not in ("__url__", "__local_path__")} for s in
             wds.WebDataset(sorted(str(p) for p in (tmp_path / "out").glob("*.tar")), shardshuffle=False)]
    assert found == [{"__key__": "j", "txt": b"0"}, {"__key__": "k", "txt": b"1"}, {"__key__": "k", "cls": b"2"}]
    with pytest.raises(SchemaError, match="key 'k' repeats the previous row's in one shard"):
        convert(str(tmp_path / "ds"), str(tmp_path / "one"), to_format="webdataset", progress=False)


def test_schema_scan_in_workers_equals_the_serial_scan(tmp_path: Path) -> None:
    """Whole shards scanned in forked workers; the per-extension statistics merge to the same schema."""
    gray = images.encode_image(np.zeros((4, 6), np.uint8), "png")
    color = images.encode_image(np.zeros((5, 6, 3), np.uint8), "png")
    paths = [
        write_tar(tmp_path / "a.tar", [("k0.png", color), ("k0.cls", b"3"), ("k0.npy", npy(np.zeros(4, np.int32)))]),
        write_tar(tmp_path / "b.tar", [("k1.png", gray), ("k1.cls", b"2.5"), ("k1.npy", npy(np.zeros(7, np.int32)))]),
        write_tar(tmp_path / "c.tar", [("k2.png", color), ("k2.txt", b"hello")]),
    ]
    serial = WebDatasetFormat([str(p) for p in paths]).infer_schema()
    parallel = WebDatasetFormat([str(p) for p in paths])
    parallel.workers = 2
    assert parallel.infer_schema() == serial
    by_name = {f.name: f for f in serial}
    assert by_name["cls"].numpy_dtype is np.float64 and by_name["cls"].nullable  # "2.5"; missing in c
    assert by_name["npy"].shape == (None,) and by_name["npy"].numpy_dtype is np.int32
    assert by_name["png"].shape == (None, 6, None) and by_name["txt"].nullable
