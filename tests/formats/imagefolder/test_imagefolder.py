"""Image folders: class and flat layouts, schema inference, bad files, export and round trips."""

from __future__ import annotations

import io
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from unihub.cli import main
from unihub.errors import DatasetExistsError, FormatError, SchemaError
from unihub.formats.base import FORMATS, parse_list
from unihub.formats.imagefolder.format import ImageFolderFormat
from unihub.images.decoders import decode_image, encode_image
from unihub.schema.codecs import CompressedImageCodec
from unihub.schema.unischema import Unischema, UnischemaField
from unihub.store.writer import write_dataset

PIL = pytest.importorskip("PIL.Image")


def rgb(h: int = 8, w: int = 6, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def gray(h: int = 8, w: int = 6, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w), dtype=np.uint8)


def pillow_bytes(array: np.ndarray, fmt: str) -> bytes:
    buffer = io.BytesIO()
    PIL.fromarray(array).save(buffer, format=fmt)
    return buffer.getvalue()


def put(root: Path, rel: str, data: bytes) -> bytes:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def read_all(source: ImageFolderFormat, **kwargs) -> dict[str, list]:
    schema = kwargs.pop("schema", None) or source.infer_schema()
    rows: dict[str, list] = {name: [] for name in schema.fields}
    for batch in source.read_batches(schema, **kwargs):
        for name in rows:
            rows[name].extend(list(batch[name]))
    return rows


@pytest.fixture
def classes_tree(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """cat/ (unihub PNG + Pillow PNG in a subfolder), dog/ (Pillow JPEG, unihub JPEG), empty/ and hidden noise."""
    root = tmp_path / "train"
    files = {
        "cat/b.png": put(root, "cat/b.png", encode_image(rgb(seed=1), "png")),
        "cat/sub/a.png": put(root, "cat/sub/a.png", pillow_bytes(rgb(seed=2), "PNG")),
        "dog/x.jpg": put(root, "dog/x.jpg", pillow_bytes(rgb(seed=3), "JPEG")),
        "dog/y.jpeg": put(root, "dog/y.jpeg", encode_image(rgb(seed=4), "jpeg")),
        "dog/z.png": put(root, "dog/z.png", encode_image(rgb(seed=5), "png")),
    }
    (root / "empty").mkdir()
    put(root, ".hidden/c.png", encode_image(rgb(), "png"))
    put(root, "cat/.DS_Store", b"\0\0\0\1Bud1")
    put(root, "dog/.ipynb_checkpoints/x.png", encode_image(rgb(), "png"))
    return root, files


def test_registered_with_aliases() -> None:
    assert FORMATS.get("imagefolder") is ImageFolderFormat
    assert FORMATS.get("images") is ImageFolderFormat and FORMATS.get("folder") is ImageFolderFormat


def test_class_layout(classes_tree) -> None:
    root, files = classes_tree
    source = ImageFolderFormat(str(root))
    assert source.metadata() == {"classes": ["cat", "dog", "empty"]}
    schema = source.infer_schema()
    assert list(schema.fields) == ["image", "label", "path"]
    assert schema.image.shape == (8, 6, 3) and schema.image.numpy_dtype is np.uint8
    assert schema.image.codec == CompressedImageCodec("png")  # 3 PNG against 2 JPEG
    assert schema.label.numpy_dtype is np.int64 and schema.path.numpy_dtype is np.str_
    rows = read_all(source, batch_size=2)
    # torchvision's order: class, then directory, then file name; hidden files and dirs ignored
    assert rows["path"] == ["cat/b.png", "cat/sub/a.png", "dog/x.jpg", "dog/y.jpeg", "dog/z.png"]
    assert rows["label"] == [0, 0, 1, 1, 1]
    assert rows["image"] == [files[p] for p in rows["path"]]  # the bytes on disk, not re-encoded
    assert source.report.records == 5 and source.report.skipped == []
    np.testing.assert_array_equal(decode_image(rows["image"][0]), rgb(seed=1))


def test_batches_are_columns(classes_tree) -> None:
    root, _ = classes_tree
    source = ImageFolderFormat(root)
    batches = list(source.read_batches(source.infer_schema(), batch_size=2))
    assert [len(b["path"]) for b in batches] == [2, 2, 1]
    assert batches[0]["label"].dtype == np.int64
    only_paths = source.infer_schema().select(["path"])
    assert [b["path"] for b in source.read_batches(only_paths)] == [[
        "cat/b.png", "cat/sub/a.png", "dog/x.jpg", "dog/y.jpeg", "dog/z.png"]]


def test_flat_layout_has_no_label(tmp_path: Path) -> None:
    put(tmp_path, "2.jpg", encode_image(rgb(seed=2), "jpeg"))
    put(tmp_path, "1.jpg", pillow_bytes(rgb(seed=1), "JPEG"))
    source = ImageFolderFormat(tmp_path)
    schema = source.infer_schema()
    assert list(schema.fields) == ["image", "path"]
    assert schema.image.codec == CompressedImageCodec("jpeg")
    assert source.metadata() == {}
    assert read_all(source)["path"] == ["1.jpg", "2.jpg"]
    with pytest.raises(SchemaError, match="flat"):
        list(source.read_batches(Unischema("s", [*schema, UnischemaField("label", np.int64)])))


def test_grayscale_and_varying_sizes(tmp_path: Path) -> None:
    put(tmp_path, "a/1.png", encode_image(gray(8, 6), "png"))
    put(tmp_path, "a/2.png", pillow_bytes(gray(5, 6), "PNG"))
    put(tmp_path, "b/3.jpg", pillow_bytes(gray(9, 6), "JPEG"))
    schema = ImageFolderFormat(tmp_path).infer_schema()
    assert schema.image.shape == (None, 6)  # all gray: 2-D; heights vary
    put(tmp_path, "b/4.png", encode_image(rgb(4, 4), "png"))
    schema = ImageFolderFormat(tmp_path).infer_schema()
    assert schema.image.shape == (None, None, None)  # gray mixed with RGB: channels vary
    rows = read_all(ImageFolderFormat(tmp_path), schema=schema)
    assert [decode_image(b).shape for b in rows["image"]] == [(8, 6), (5, 6), (9, 6), (4, 4, 3)]


def test_sampled_schema_checks_later_images(tmp_path: Path) -> None:
    put(tmp_path, "a.png", encode_image(rgb(8, 6), "png"))
    put(tmp_path, "b.png", encode_image(rgb(9, 6), "png"))
    source = ImageFolderFormat(tmp_path)
    schema = source.infer_schema(sample_records=1)
    assert schema.image.shape == (8, 6, 3)
    with pytest.raises(FormatError, match="does not fit"):
        list(source.read_batches(schema))
    assert read_all(source, schema=schema, on_error="skip")["path"] == ["a.png"]


def test_sixteen_bit_png(tmp_path: Path) -> None:
    put(tmp_path, "a.png", encode_image(np.arange(12, dtype=np.uint16).reshape(3, 4), "png"))
    schema = ImageFolderFormat(tmp_path).infer_schema()
    assert schema.image.numpy_dtype is np.uint16 and schema.image.shape == (3, 4)
    put(tmp_path, "b.png", encode_image(gray(3, 4), "png"))
    with pytest.raises(FormatError, match="16-bit"):
        ImageFolderFormat(tmp_path).infer_schema()


def test_transparency_after_large_metadata_is_seen(tmp_path: Path) -> None:
    """A palette PNG's tRNS chunk (an alpha channel) after 70 KB of text before it (XMP, an ICC profile) lay
    past the 64 KiB head the schema is inferred from: the schema said 3 channels, the image decodes to 4, and
    converting to another format refused every such image as not fitting (or skipped them all)."""
    from unihub.converters.convert import convert

    image = PIL.fromarray(gray(5, 6) % 4).convert("P")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", transparency=0)
    text = b"tEXt" + b"Comment\0" + b"x" * 70_000
    big = struct.pack(">I", len(text) - 4) + text + struct.pack(">I", zlib.crc32(text))
    data = buffer.getvalue()[:33] + big + buffer.getvalue()[33:]  # right after IHDR
    assert decode_image(data).shape == (5, 6, 4)
    put(tmp_path / "src", "cat/a.png", data)
    put(tmp_path / "src", "dog/b.png", data)
    assert ImageFolderFormat(tmp_path / "src").infer_schema().image.shape == (5, 6, 4)
    assert convert(tmp_path / "src", tmp_path / "wds", to_format="webdataset").rows == 2


def test_images_outside_the_class_folders_are_named_when_none_are_inside(tmp_path: Path) -> None:
    """A flat folder with one stray subfolder (empty, here) is a class layout: its images lie outside the class
    folders and are left out. The error said only "no PNG or JPEG images found", next to three of them."""
    for i in range(3):
        put(tmp_path, f"{i}.png", encode_image(rgb(seed=i), "png"))
    (tmp_path / "thumbs").mkdir()
    with pytest.raises(FormatError, match=r"no PNG or JPEG images found in its class folders \['thumbs'\]; the 3 "
                                          r"file\(s\) directly in it \(\['0.png', '1.png', '2.png'\]\) belong to no class"):
        ImageFolderFormat(tmp_path).infer_schema()


def test_mixed_bit_depths_name_an_image_of_each(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The refusal names files, so a user can find the odd ones out (PIL writes both, as a user's tools would)."""
    from PIL import Image

    from unihub.cli import main

    for name in ("cat", "dog"):
        (tmp_path / "src" / name).mkdir(parents=True)
    for i in range(3):
        Image.fromarray(np.full((4, 5), i, np.uint8)).save(tmp_path / "src" / "cat" / f"{i}.png")
    Image.fromarray(np.full((4, 5), 40_000, np.uint16)).save(tmp_path / "src" / "dog" / "deep.png")
    with pytest.raises(FormatError, match=r"mixes 8-bit and 16-bit PNG images \(8-bit: cat/0.png, 16-bit: "
                                          r"dog/deep.png\)"):
        ImageFolderFormat(tmp_path / "src").infer_schema()
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "ds"), "--quiet"]) == 1  # the one-pass ingest
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "8-bit: cat/0.png, 16-bit: dog/deep.png" in err


def test_format_by_content_not_extension(tmp_path: Path) -> None:
    data = put(tmp_path, "c/actually_jpeg.png", encode_image(rgb(), "jpeg"))
    put(tmp_path, "c/no_extension", encode_image(rgb(seed=9), "png"))
    source = ImageFolderFormat(tmp_path)
    rows = read_all(source)
    assert rows["path"] == ["c/actually_jpeg.png", "c/no_extension"]
    assert rows["image"][0] == data


@pytest.mark.parametrize("corrupt", [
    pytest.param(lambda png, jpg: ("c/bad.png", png[:20]), id="png-header"),
    pytest.param(lambda png, jpg: ("c/bad.png", png[:-20]), id="png-truncated"),
    pytest.param(lambda png, jpg: ("c/bad.jpg", jpg[: len(jpg) // 2]), id="jpeg-truncated"),
    pytest.param(lambda png, jpg: ("c/bad.jpg", b"GIF89a not a jpeg"), id="wrong-content"),
    pytest.param(lambda png, jpg: ("c/bad.gif", b"GIF89a\x01\x00"), id="unsupported-format"),
])
def test_corrupt_image_raises_or_skips(tmp_path: Path, corrupt) -> None:
    png = put(tmp_path, "c/good.png", encode_image(rgb(16, 16), "png"))
    name, data = corrupt(png, pillow_bytes(rgb(32, 32), "JPEG"))
    put(tmp_path, name, data)
    source = ImageFolderFormat(tmp_path)
    schema = source.infer_schema()
    with pytest.raises(FormatError, match="bad") as info:
        list(source.read_batches(schema))
    assert info.value.path == os.path.join(tmp_path, name)
    rows = read_all(source, schema=schema, on_error="skip")
    assert rows["path"] == ["c/good.png"]
    assert source.report.records == 1
    assert [s.path for s in source.report.skipped] == [os.path.join(tmp_path, name)]


def test_verify_decodes_pixel_data(tmp_path: Path) -> None:
    jpeg = bytearray(pillow_bytes(rgb(64, 64), "JPEG"))
    jpeg[len(jpeg) // 2: len(jpeg) // 2 + 200] = b"\xff\xd0" * 100  # entropy data garbled, markers intact
    put(tmp_path, "c/bad.jpg", bytes(jpeg))
    put(tmp_path, "c/good.jpg", pillow_bytes(rgb(64, 64), "JPEG"))
    assert len(read_all(ImageFolderFormat(tmp_path))["path"]) == 2  # header and end marker look fine
    source = ImageFolderFormat(tmp_path, verify=True)
    assert read_all(source, on_error="skip")["path"] == ["c/good.jpg"]


def test_non_images_are_skipped_with_a_warning(classes_tree) -> None:
    root, _ = classes_tree
    put(root, "cat/notes.txt", b"hello")
    put(root, "README.md", b"# in the root, outside any class")
    source = ImageFolderFormat(root)
    with pytest.warns(UserWarning, match="left out 2 file"):
        rows = read_all(source)
    assert len(rows["path"]) == 5
    assert sorted(os.path.basename(s.path) for s in source.report.skipped) == ["README.md", "notes.txt"]


def test_detect(classes_tree, tmp_path: Path) -> None:
    root, _ = classes_tree
    assert ImageFolderFormat.detect(str(root))
    flat = tmp_path / "flat"
    put(flat, "a.png", encode_image(rgb(), "png"))
    assert ImageFolderFormat.detect(str(flat))
    other = tmp_path / "other"
    put(other, "part-0.parquet", b"PAR1....")
    put(other, "_common_metadata", b"PAR1....")
    assert not ImageFolderFormat.detect(str(other))
    assert not ImageFolderFormat.detect(str(flat / "a.png"))
    assert not ImageFolderFormat.detect(str(tmp_path / "missing"))


def test_detect_class_folders_holding_only_folders(tmp_path: Path) -> None:
    """``<class>/<video>/<frame>.jpg``: class folders read recursively, whose files all lie a level or two
    down, were not detected ('cannot tell its format'), so convert and verify needed --from."""
    from unihub.converters.convert import convert
    from unihub.converters.verify import verify

    root = tmp_path / "videos"
    for rel in ("run/v1/0.jpg", "run/v1/1.jpg", "walk/v2/a/0.jpg", "walk/v3/0.jpg"):
        put(root, rel, encode_image(rgb(), "jpeg"))
    (root / "empty").mkdir()
    assert ImageFolderFormat.detect(str(root))
    convert(root, tmp_path / "ds")
    assert verify(root, tmp_path / "ds").equal
    put(tmp_path / "records" / "a" / "b", "part.tfrecord", b"\x00" * 64)
    assert not ImageFolderFormat.detect(str(tmp_path / "records"))


def test_bad_sources(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ImageFolderFormat(tmp_path / "missing")
    with pytest.raises(FormatError, match="one root"):
        ImageFolderFormat([tmp_path, tmp_path])
    with pytest.raises(FormatError, match="no PNG or JPEG"):
        ImageFolderFormat(tmp_path).infer_schema()


def test_round_trip_keeps_labels_classes_paths_and_bytes(classes_tree, tmp_path: Path) -> None:
    root, _ = classes_tree
    source = ImageFolderFormat(root)
    schema = source.infer_schema()
    first = read_all(source)
    out = tmp_path / "export"
    written = ImageFolderFormat.write(str(out), schema, source.read_batches(schema, batch_size=2),
                                      classes=source.metadata()["classes"])
    assert sorted(os.path.relpath(p, out) for p in written) == sorted(
        os.path.join(*p.split("/")) for p in first["path"])
    again = ImageFolderFormat(out)
    assert again.metadata() == source.metadata()  # the empty class folder is kept
    assert again.infer_schema() == schema
    assert read_all(again) == first
    assert not [n for n in os.listdir(tmp_path) if "unihub-tmp" in n]


def test_write_arrays_and_labels_without_paths(tmp_path: Path) -> None:
    schema = Unischema("S", [UnischemaField("img", np.uint8, (8, 6, 3), CompressedImageCodec("jpeg", 95)),
                             UnischemaField("label", np.int64)])
    arrays = np.stack([np.full((8, 6, 3), 40 * i + 20, np.uint8) for i in range(3)])  # JPEG-friendly
    written = ImageFolderFormat.write(tmp_path / "out", schema, [{"img": arrays, "label": np.array([1, 0, 1])}],
                                      classes=["ant", "bee"])
    names = [os.path.relpath(p, tmp_path / "out").replace(os.sep, "/") for p in written]
    assert names == ["bee/00000000.jpg", "ant/00000001.jpg", "bee/00000002.jpg"]
    rows = read_all(ImageFolderFormat(tmp_path / "out"))
    assert rows["label"] == [0, 1, 1]
    assert np.abs(decode_image(rows["image"][0]).astype(int) - arrays[1]).max() <= 2


def test_write_flat_and_string_labels(tmp_path: Path) -> None:
    schema = Unischema("S", [UnischemaField("image", np.uint8, (8, 6, 3), CompressedImageCodec("png")),
                             UnischemaField("kind", np.str_)])
    blobs = [encode_image(rgb(seed=i), "png") for i in range(2)]
    written = ImageFolderFormat.write(tmp_path / "flat", schema, [{"image": blobs, "kind": ["x", "y"]}])
    assert [os.path.basename(p) for p in written] == ["00000000.png", "00000001.png"]
    written = ImageFolderFormat.write(tmp_path / "by_kind", schema, [{"image": blobs, "kind": ["x", "y"]}],
                                      label_field="kind")
    assert ImageFolderFormat(tmp_path / "by_kind").metadata() == {"classes": ["x", "y"]}
    assert [Path(p).read_bytes() for p in written] == blobs


def test_write_is_atomic_and_refuses_bad_input(tmp_path: Path) -> None:
    schema = Unischema("S", [UnischemaField("image", np.uint8, (8, 6, 3), CompressedImageCodec("png")),
                             UnischemaField("path", np.str_)])
    good = encode_image(rgb(), "png")

    def rows(paths):
        yield {"image": [good], "path": [paths[0]]}
        yield {"image": [good], "path": [paths[1]]}

    target = tmp_path / "out"
    for paths, message in [(["a.png", "a.png"], "twice"), (["a.png", "../escape.png"], "relative"),
                           (["a.png", "/abs.png"], "relative"), (["a.png", ".hidden.png"], "relative")]:
        with pytest.raises(FormatError, match=message):
            ImageFolderFormat.write(target, schema, rows(paths))
        assert os.listdir(tmp_path) == []  # neither target nor temp dir left behind
    with pytest.raises(FormatError, match="neither PNG nor JPEG"):
        ImageFolderFormat.write(target, schema, [{"image": [b"nope"], "path": ["a.png"]}])
    with pytest.raises(FormatError, match="outside"):
        ImageFolderFormat.write(target, Unischema("L", [*schema, UnischemaField("label", np.int64)]),
                                [{"image": [good], "path": ["a.png"], "label": [5]}], classes=["a"])
    ImageFolderFormat.write(target, schema, rows(["a.png", "b/c.png"]))
    with pytest.raises(DatasetExistsError):
        ImageFolderFormat.write(target, schema, rows(["a.png", "b.png"]))
    ImageFolderFormat.write(target, schema, rows(["x.png", "y.png"]), overwrite=True)
    assert sorted(os.listdir(target)) == ["x.png", "y.png"]
    with pytest.raises(SchemaError, match="image_field"):
        two = Unischema("T", [UnischemaField("a", np.uint8, (2, 2), CompressedImageCodec()),
                              UnischemaField("b", np.uint8, (2, 2), CompressedImageCodec())])
        ImageFolderFormat.write(tmp_path / "t", two, [])


def test_write_refuses_a_class_name_given_twice(tmp_path: Path) -> None:
    """``classes=cat,cat,dog`` wrote labels 0 and 1 into one folder ``cat/``: read back, they were one class."""
    schema = Unischema("L", [UnischemaField("image", np.uint8, (8, 6, 3), CompressedImageCodec("png")),
                             UnischemaField("label", np.int64)])
    rows = [{"image": [encode_image(rgb(seed=i), "png") for i in range(3)], "label": [0, 1, 2]}]
    with pytest.raises(FormatError, match=r"classes name the folder\(s\) \['cat'\] for more than one label"):
        ImageFolderFormat.write(tmp_path / "out", schema, rows, classes=["cat", "cat", "dog"])
    assert os.listdir(tmp_path) == []
    ImageFolderFormat.write(tmp_path / "out", schema, rows, classes=["cat", "cow", "dog"])
    assert sorted(os.listdir(tmp_path / "out")) == ["cat", "cow", "dog"]


@pytest.mark.parametrize("given", ["cat,,dog", ",cat,dog", "cat,dog,", "cat, ,dog"])
def test_an_empty_item_of_a_list_option_is_refused(given: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``--option classes=cat,,dog`` dropped the blank: dog took cat's next label, every later label shifted."""
    schema = Unischema("L", [UnischemaField("image", np.uint8, (8, 6, 3), CompressedImageCodec("png")),
                             UnischemaField("label", np.int64)])
    write_dataset(tmp_path / "ds", schema, [{"image": rgb(seed=i), "label": i % 2} for i in range(4)])
    assert main(["convert", str(tmp_path / "ds"), str(tmp_path / "out"), "--to", "imagefolder", "--option",
                 f"classes={given}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("unihub: error: imagefolder option classes: item ") and f"of {given!r} is empty" in err
    assert not (tmp_path / "out").exists()
    assert parse_list("") == [] and parse_list(" a , b/c ") == ["a", "b/c"]


def test_an_export_whose_labels_would_read_back_as_others_says_so(classes_tree, tmp_path: Path) -> None:
    """classes out of sorted order, or integer labels named by their number, come back renumbered (an ingest and
    torchvision's ImageFolder sort the folder names). Before: without a word."""
    from unihub.converters.convert import convert

    schema = Unischema("L", [UnischemaField("image", np.uint8, (8, 6, 3), CompressedImageCodec("png")),
                             UnischemaField("label", np.int64)])
    write_dataset(tmp_path / "ds", schema, [{"image": rgb(seed=i), "label": i % 2} for i in range(4)])
    result = convert(tmp_path / "ds", tmp_path / "a", to_format="imagefolder", progress=False,
                     format_options={"classes": ["dog", "cat"]})
    assert result.notes == ["the classes ['dog', 'cat'] are not in sorted order: an ingest and torchvision's "
                            "ImageFolder number the folders ['cat', 'dog'], so the labels read back differ"]
    back = convert(tmp_path / "a", tmp_path / "a_ds", progress=False)
    assert back.rows == 4 and FORMATS.get("imagefolder")(str(tmp_path / "a")).metadata()["classes"] == ["cat", "dog"]
    result = convert(tmp_path / "ds", tmp_path / "b", to_format="imagefolder", progress=False)
    assert len(result.notes) == 1 and "each label's folder is its number" in result.notes[0]
    for name, options in (("c", {"classes": ["cat", "dog"]}), ("d", {})):
        source = tmp_path / "a_ds" if name == "d" else tmp_path / "ds"  # an ingest's classes: sorted
        assert convert(source, tmp_path / name, to_format="imagefolder", progress=False,
                       format_options=options).notes == []


def test_round_trip_through_the_canonical_store(classes_tree, tmp_path: Path) -> None:
    from unihub import make_batch_reader, make_reader, write_dataset

    root, files = classes_tree
    source = ImageFolderFormat(root)
    schema = source.infer_schema()
    write_dataset(tmp_path / "pq", schema, source.read_batches(schema, batch_size=2), batched=True)
    with make_batch_reader(f"file://{tmp_path / 'pq'}", decode_images=False, shuffle_row_groups=False) as reader:
        batches = [batch._asdict() for batch in reader]
    ImageFolderFormat.write(tmp_path / "out", schema, batches, classes=source.metadata()["classes"])
    assert read_all(ImageFolderFormat(tmp_path / "out")) == read_all(source)
    with make_reader(f"file://{tmp_path / 'pq'}", shuffle_row_groups=False) as reader:
        decoded = {row.path: row.image for row in reader}
    np.testing.assert_array_equal(decoded["cat/b.png"], rgb(seed=1))
    np.testing.assert_array_equal(decoded["dog/x.jpg"], decode_image(files["dog/x.jpg"]))


def test_probe_reuses_a_shared_header_but_not_a_wrong_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files probed after others with the same header bytes get the same answer as probed alone."""
    from PIL import Image

    import unihub.formats.imagefolder.format as imagefolder

    rng = np.random.default_rng(4)
    jpeg = encode_image(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8), "jpeg", 90)
    pngs = [encode_image(rng.integers(0, 255, (6, 5, 3), dtype=np.uint8) * (rng.random((6, 5, 1)) < k / 4), "png")
            for k in range(4)]
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (6, 5, 3), dtype=np.uint8)).quantize(8).save(buffer, "PNG", transparency=0)
    files = [jpeg, jpeg[:-2], jpeg, encode_image(rng.integers(0, 255, (16, 8, 3), dtype=np.uint8), "jpeg", 90),
             *pngs, buffer.getvalue(), pngs[0][:-12], pngs[1], jpeg[:200], b"plain text", jpeg]
    names = [f"{i}.{'txt' if f == b'plain text' else 'img'}" for i, f in enumerate(files)]

    def alone(data: bytes, name: str) -> imagefolder._Probe:
        monkeypatch.setattr(imagefolder, "_last_header", None)
        return imagefolder._probe(data, name, complete=True)

    expected = [alone(f, n) for f, n in zip(files, names)]
    monkeypatch.setattr(imagefolder, "_last_header", None)
    assert [imagefolder._probe(f, n, complete=True) for f, n in zip(files, names)] == expected
    assert [p.kind for p in expected] == ["image", "bad", "image", "image", *["image"] * 4, "image", "bad", "image",
                                          "bad", "other", "image"]
    assert expected[8].size == (6, 5, 4) and expected[3].size == (16, 8, 3)


def test_verify_reads_the_files_themselves(tmp_path: Path) -> None:
    from PIL import Image

    from unihub.converters.convert import convert
    from unihub.converters.verify import verify

    rng = np.random.default_rng(0)
    root = tmp_path / "pets"
    for name, (cls, ext) in {"a": ("cat", "png"), "b": ("cat", "jpg"), "sub/c": ("cat", "png"),
                             "d": ("dog", "png"), "e": ("dog", "jpeg")}.items():
        path = root / cls / f"{name}.{ext}"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (8, 6, 3), dtype=np.uint8)).save(path)
    (root / "dog" / "notes.txt").write_text("not an image")
    (root / "empty").mkdir()
    with pytest.warns(UserWarning):
        convert(root, tmp_path / "ds")
    report = verify(root, tmp_path / "ds")
    assert report.equal and "torchvision" in report.summary(), report.summary()
    # the export is checked the same way, and its files are the source's bytes
    convert(tmp_path / "ds", tmp_path / "back", to_format="imagefolder")
    assert verify(tmp_path / "ds", tmp_path / "back").equal
    assert (tmp_path / "back" / "cat" / "sub" / "c.png").read_bytes() == (root / "cat" / "sub" / "c.png").read_bytes()
    # a changed byte in a source file is a difference naming the file
    data = bytearray((root / "dog" / "d.png").read_bytes())
    data[-20] ^= 0xFF
    (root / "dog" / "d.png").write_bytes(bytes(data))
    report = verify(root, tmp_path / "ds")
    assert not report.equal
    assert report.differences[0].startswith("record 3 (dog/d.png), field 'image': expected ")


def test_verify_sees_labels_renumbered_by_an_empty_class_folder(tmp_path: Path) -> None:
    """Labels index the sorted class folders: an empty folder added before the others, or one removed,
    renumbers them although every file is the same, so verify compares the class folders too."""
    from unihub.converters.convert import convert
    from unihub.converters.verify import verify

    root = tmp_path / "pets"
    for rel in ("cat/a.png", "dog/b.png"):
        put(root, rel, encode_image(rgb(), "png"))
    (root / "empty").mkdir()
    convert(root, tmp_path / "ds")
    assert verify(root, tmp_path / "ds").equal
    (root / "bird").mkdir()  # torchvision now labels cat 1, dog 3; the dataset says 0 and 2
    report = verify(root, tmp_path / "ds")
    assert not report.equal
    assert report.differences == ["class folder labels/bird: expected 0, found nothing (missing)"]
    convert(tmp_path / "ds", tmp_path / "back", to_format="imagefolder")
    assert verify(tmp_path / "ds", tmp_path / "back").equal  # the export makes the empty folder too
    (tmp_path / "back" / "empty").rmdir()
    report = verify(tmp_path / "ds", tmp_path / "back")
    assert report.differences == ["class folder labels/empty: expected 2, found nothing (missing)"]


def test_verify_of_an_export_labelled_without_class_names(tmp_path: Path) -> None:
    """A dataset that records no class names exports its labels as folder names: still equal."""
    from unihub.converters.convert import convert
    from unihub.converters.verify import verify
    from unihub.store.writer import write_dataset

    schema = Unischema("S", [UnischemaField("image", np.uint8, (8, 6, 3), CompressedImageCodec("png"), False),
                             UnischemaField("label", np.int64, (), None, False)])
    write_dataset(tmp_path / "ds", schema, [{"image": rgb(), "label": label} for label in (1, 1, 3)])
    convert(tmp_path / "ds", tmp_path / "back", to_format="imagefolder")
    assert sorted(os.listdir(tmp_path / "back")) == ["1", "3"]
    assert verify(tmp_path / "ds", tmp_path / "back").equal


def test_verify_names_a_file_out_of_place_by_its_path(tmp_path: Path) -> None:
    """Records are compared in order: a file moved to another class shifts the ones after it, and the
    difference names the paths, not 'image bytes differ' at the first shifted record."""
    from unihub.converters.convert import convert
    from unihub.converters.verify import verify

    root = tmp_path / "pets"
    for seed, rel in enumerate(("cat/a.png", "cat/b.png", "dog/c.png")):
        put(root, rel, encode_image(rgb(seed=seed), "png"))
    convert(root, tmp_path / "ds")
    (root / "cat" / "b.png").rename(root / "dog" / "b.png")
    report = verify(root, tmp_path / "ds")
    assert report.differences[0] == "record 1 (dog/b.png), field 'path': expected 'dog/b.png', found 'cat/b.png'"


@pytest.mark.parametrize("workers", [1, 2])
def test_an_image_skipped_as_corrupt_is_appended_once_repaired(tmp_path: Path, workers: int) -> None:
    """``convert --append --skip-corrupt`` recorded a corrupt image it skipped as converted: once repaired,
    every later append failed with SourceChangedError ("their rows in the dataset are the old contents",
    of a file that had none). A file that is no image stays recorded: appends do not read it again."""
    from unihub.converters.convert import convert
    from unihub.store.dataset import open_dataset

    src, dst = tmp_path / "src", tmp_path / "ds"
    put(src, "cat/a.png", encode_image(rgb(seed=1), "png"))
    repaired = encode_image(rgb(seed=2), "png")
    put(src, "cat/b.png", repaired[:40])
    put(src, "cat/notes.txt", b"not an image")
    first = convert(src, dst, append=True, on_error="skip", workers=workers)
    assert first.rows == 1 and sorted(os.path.basename(s.path) for s in first.skipped) == ["b.png", "notes.txt"]
    put(src, "cat/b.png", repaired)
    assert convert(src, dst, append=True, workers=workers).rows == 1
    store = open_dataset(dst)
    paths = [p for i in range(len(store.row_groups)) for p in store.read_row_group(i).column("path").to_pylist()]
    assert paths == ["cat/a.png", "cat/b.png"]
    assert convert(src, dst, append=True).rows == 0  # nothing new: notes.txt was recorded


def test_a_file_name_that_is_not_utf8_is_a_format_error(tmp_path: Path) -> None:
    """A name of other bytes (listed as ``'bad\\udcff.png'``) reached the Parquet writer as the path and
    ended the CLI in a UnicodeEncodeError traceback; now it is refused naming the file, or skipped."""
    from unihub.converters.convert import convert

    put(tmp_path / "src", "cat/ok.png", encode_image(rgb(), "png"))
    (tmp_path / "src" / "cat" / os.fsdecode(b"bad\xff.png")).write_bytes(encode_image(rgb(seed=1), "png"))
    with pytest.raises(FormatError, match=r"bad\\udcff\.png' is not UTF-8"):
        convert(tmp_path / "src", tmp_path / "ds")
    assert not (tmp_path / "ds").exists()
    result = convert(tmp_path / "src", tmp_path / "ds", on_error="skip")
    assert result.rows == 1 and [s.reason for s in result.skipped][0].startswith("its path 'cat/bad")
