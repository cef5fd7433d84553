"""``convert`` / ``verify`` and their CLI: ingest, export back, verify, bad input."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from unihub import open_dataset
from unihub.cli import main
from unihub.cli.demo import make_image
from unihub.converters.convert import convert, resolve_target_format
from unihub.converters.verify import verify
from unihub.errors import DatasetExistsError, FormatError, InvalidArgumentError, UnsupportedFormatError
from unihub.images.decoders import encode_image


@pytest.fixture()
def image_folder(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    root = tmp_path / "folder"
    for name in ("cat", "dog", "eel"):
        (root / name).mkdir(parents=True)
        for i in range(4):
            fmt = "jpeg" if name == "eel" else "png"
            (root / name / f"{i}.{'jpg' if fmt == 'jpeg' else 'png'}").write_bytes(
                encode_image(make_image(rng, 12, 10), fmt, quality=90))
    return root


def test_image_folder_ingest_keeps_bytes_labels_and_classes(image_folder: Path, tmp_path: Path) -> None:
    result = convert(image_folder, tmp_path / "ds", progress=False)
    assert (result.from_format, result.to_format, result.rows) == ("imagefolder", "unihub", 12)
    store = open_dataset(tmp_path / "ds")
    assert store.extra_metadata["classes"] == ["cat", "dog", "eel"]
    assert store.extra_metadata["source_format"] == "imagefolder"
    assert verify(image_folder, tmp_path / "ds").equal
    table = store.read_row_group(0)
    paths = table.column("path").to_pylist()
    blobs = table.column("image").to_pylist()
    for path, blob in zip(paths, blobs):
        assert (image_folder / path).read_bytes() == blob  # stored as given, never re-encoded


@pytest.mark.parametrize("fmt, target", [("webdataset", "shards"), ("hdf5", "out.h5"), ("imagefolder", "folder2"),
                                         ("tfrecord", "out.tfrecord")])
def test_export_back_and_ingest_again_verifies_equal(image_folder: Path, tmp_path: Path, fmt: str,
                                                     target: str) -> None:
    convert(image_folder, tmp_path / "ds", progress=False)
    exported = tmp_path / target
    result = convert(tmp_path / "ds", exported, to_format=fmt, progress=False)
    assert result.rows == 12 and result.to_format == fmt
    again = tmp_path / "again"
    convert(exported, again, from_format=fmt, progress=False)
    report = verify(exported, again, from_format=fmt)
    assert report.equal, report.summary()
    report = verify(tmp_path / "ds", again)  # names, schema and values come back: nothing renamed or added
    assert report.equal, report.summary()


def test_existing_target_is_refused_unless_overwrite(image_folder: Path, tmp_path: Path) -> None:
    convert(image_folder, tmp_path / "ds", progress=False)
    before = sorted(os.listdir(tmp_path / "ds"))
    with pytest.raises(DatasetExistsError, match="--overwrite"):
        convert(image_folder, tmp_path / "ds", progress=False)
    assert sorted(os.listdir(tmp_path / "ds")) == before
    assert convert(image_folder, tmp_path / "ds", overwrite=True, progress=False).rows == 12


def test_a_target_inside_the_image_folder_it_reads_is_refused(image_folder: Path, tmp_path: Path) -> None:
    """A dataset written inside the image folder it reads is a class folder of the next read: a first one
    ('aaa') renumbered every label, and inside a flat folder it made the images lie outside any class."""
    before = sorted(p.relative_to(image_folder) for p in image_folder.rglob("*"))
    for inside, append in (("aaa", False), ("zzz/ds", True)):
        with pytest.raises(InvalidArgumentError, match="is inside the source"):
            convert(image_folder, image_folder / inside, append=append, progress=False)
        assert sorted(p.relative_to(image_folder) for p in image_folder.rglob("*")) == before
    flat = image_folder / "cat"
    with pytest.raises(InvalidArgumentError, match="is inside the source"):
        convert(flat, flat / "ds", progress=False)
    assert convert(flat, tmp_path / "flat", progress=False).rows == 4


def test_unknown_format_and_missing_source(tmp_path: Path) -> None:
    odd = tmp_path / "data.xyz"
    odd.write_bytes(b"nothing anyone knows")
    with pytest.raises(UnsupportedFormatError, match="--from"):
        convert(odd, tmp_path / "out", progress=False)
    with pytest.raises(UnsupportedFormatError, match="valid names"):
        convert(odd, tmp_path / "out", from_format="nosuchformat", progress=False)


def test_verify_reports_the_first_differences(image_folder: Path, tmp_path: Path) -> None:
    convert(image_folder, tmp_path / "ds", progress=False)
    other = tmp_path / "other"
    import shutil

    shutil.copytree(image_folder, other)
    rng = np.random.default_rng(99)
    (other / "dog" / "2.png").write_bytes(encode_image(make_image(rng, 12, 10), "png"))
    report = verify(tmp_path / "ds", other)
    assert not report.equal
    assert any("field 'image'" in d for d in report.differences), report.differences


def test_corrupt_record_errors_name_the_file_or_are_skipped(image_folder: Path, tmp_path: Path) -> None:
    bad = image_folder / "dog" / "1.png"
    bad.write_bytes(bad.read_bytes()[:40])  # truncated PNG
    with pytest.raises(FormatError, match="1.png"):
        convert(image_folder, tmp_path / "ds", progress=False)
    assert not (tmp_path / "ds").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".ds")] == []
    result = convert(image_folder, tmp_path / "ds", on_error="skip", progress=False)
    assert result.rows == 11 and len(result.skipped) == 1 and "1.png" in result.skipped[0].path
    assert "skipped 1 (bad records, datasets left out)" in result.summary()


def test_cli_convert_and_verify(image_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["convert", str(image_folder), str(tmp_path / "ds")]) == 0
    assert "converted 12 rows imagefolder -> unihub" in capsys.readouterr().err
    assert main(["convert", str(image_folder), str(tmp_path / "ds")]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "ds"), str(tmp_path / "s"), "--to", "webdataset", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["verify", str(tmp_path / "ds"), str(tmp_path / "s")]) == 0  # checked with tarfile
    assert capsys.readouterr().out.startswith("equal: 12 rows, every value identical (checked against Python's tarfile)")
    assert main(["verify", str(image_folder), str(tmp_path / "ds")]) == 0
    assert capsys.readouterr().out.startswith("equal: 12 rows")


def test_unihub_datasets_are_told_from_folders_without_walking_them(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Parquet at the top or under hive partitions is a unihub dataset; an image folder is not, and
    only its top level is looked at."""
    import pyarrow as pa

    from unihub import ScalarCodec, Unischema, UnischemaField, write_dataset
    from unihub.converters import convert as convert_module

    schema = Unischema("P", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                             UnischemaField("part", np.int64, (), ScalarCodec(pa.int64()), False)])
    write_dataset(tmp_path / "parted", schema, [{"id": i, "part": i % 2} for i in range(6)], partition_by=["part"])
    os.remove(tmp_path / "parted" / "_common_metadata")
    assert convert_module.is_unihub_dataset(str(tmp_path / "parted"))
    folder = tmp_path / "images"
    for c in range(3):
        (folder / f"c{c}").mkdir(parents=True)
        (folder / f"c{c}" / "0.png").write_bytes(encode_image(np.zeros((2, 2, 3), np.uint8), "png"))
    listed = []
    walk = os.walk
    monkeypatch.setattr(convert_module.os, "walk", lambda p: (listed.append(r) or (r, d, n) for r, d, n in walk(p)))
    assert not convert_module.is_unihub_dataset(str(folder))
    assert listed == [str(folder)]


@pytest.mark.parametrize("limit", [0, -1])
def test_verify_needs_room_for_one_difference(limit: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With no difference collected, two different datasets compared equal (exit 0)."""
    import pyarrow as pa

    from unihub import ScalarCodec, Unischema, UnischemaField, write_dataset
    from unihub.errors import InvalidArgumentError

    schema = Unischema("S", [UnischemaField("label", np.int64, (), ScalarCodec(pa.int64()), False)])
    write_dataset(tmp_path / "a", schema, ({"label": i} for i in range(5)))
    write_dataset(tmp_path / "b", schema, ({"label": i + (i == 3)} for i in range(5)))
    assert not verify(tmp_path / "a", tmp_path / "b", max_differences=1).equal
    with pytest.raises(InvalidArgumentError, match=f"max_differences must be a whole number >= 1, got {limit}"):
        verify(tmp_path / "a", tmp_path / "b", max_differences=limit)
    assert main(["verify", str(tmp_path / "a"), str(tmp_path / "b"), "--max-differences", str(limit)]) == 1
    assert capsys.readouterr().err.startswith(f"unihub: error: max_differences must be a whole number >= 1, got {limit}")


@pytest.mark.parametrize("size", [0, -1.0, float("nan"), float("inf")], ids=["0", "-1", "nan", "inf"])
def test_a_row_group_size_no_writer_can_keep_is_refused(size: float, image_folder: Path, tmp_path: Path) -> None:
    """0 or less wrote one row group per row; NaN and inf failed with a traceback as the bytes were counted."""
    from unihub import write_dataset
    from unihub.errors import SchemaError

    with pytest.raises(SchemaError, match="row_group_size_mb must be positive"):
        convert(image_folder, tmp_path / "ds", row_group_size_mb=size, progress=False)
    assert not (tmp_path / "ds").exists()
    convert(image_folder, tmp_path / "ok", progress=False)
    with pytest.raises(SchemaError, match="row_group_size_mb must be positive"):
        write_dataset(tmp_path / "again", open_dataset(tmp_path / "ok").schema, [], row_group_size_mb=size)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "ok"]


@pytest.mark.parametrize("option", ["row_group_size_mb", "part_size_mb"])
def test_an_export_refuses_sizes_no_writer_can_keep_too(option: str, image_folder: Path, tmp_path: Path) -> None:
    """An export to a foreign format took `--part-size-mb nan` without a word (only an ingest checked it)."""
    from unihub.errors import SchemaError

    convert(image_folder, tmp_path / "ds", progress=False)
    with pytest.raises(SchemaError, match=f"{option} must be (a )?positive"):
        convert(tmp_path / "ds", tmp_path / "out", to_format="webdataset", progress=False, **{option: float("nan")})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "folder"]


@pytest.mark.parametrize("name, expected", [("x.tfrecord.gz", "tfrecord"), ("x.TFRecord.zlib", "tfrecord"),
                                            ("x.tar.gz", "webdataset"), ("x.h5", "hdf5"), ("x.gz", "unihub"),
                                            ("x.parquet", "unihub"), ("x", "unihub")])
def test_the_target_format_is_the_name_before_a_compression_suffix(name: str, expected: str) -> None:
    """``convert ds x.tfrecord.gz`` made a unihub dataset (a folder) named ``x.tfrecord.gz``: the format was looked
    up by ``.gz`` alone. ``--to`` still decides where given."""
    assert resolve_target_format(f"/out/{name}", None) == expected
    assert resolve_target_format(f"/out/{name}", "parquet") == "unihub"
