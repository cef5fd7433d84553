"""Images validated at ingest: a source whose image is corrupt, truncated, a bomb or the wrong shape, but
whose container is sound (TFRecord CRCs hold, the tar is valid), is refused by ``convert`` naming the
file and record, or with ``on_error='skip'`` loses just that record; never converted to fail at read.

Every source format gets the one option, ``validate_images`` (CLI ``--validate-images``): ``header``
(default), ``full`` (decode each image) or ``none``. Sources are written by the formats' own writers:
TensorFlow's ``TFRecordWriter``, ``webdataset.TarWriter``, h5py (through unihub's export), files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pyarrow as pa
import pytest

from unihub import CompressedImageCodec, ScalarCodec, Unischema, UnischemaField, make_reader
from unihub.cli import main
from unihub.converters.convert import convert
from unihub.dependencies import is_available
from unihub.errors import FormatError, ImageDecodeError, InvalidArgumentError
from unihub.images import decoders as images

from ..images.image_bombs import corrupt_scan, image, jpeg_bomb, pil_jpeg, pil_png, png_bomb, truncated

needs_tf = pytest.mark.skipif(not is_available("tensorflow"), reason="tensorflow is not installed")
needs_wds = pytest.mark.skipif(not is_available("webdataset"), reason="webdataset is not installed")


@pytest.fixture(scope="module")
def tf() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return pytest.importorskip("tensorflow")


def _tfrecord(tf: Any, path: Path, blobs: list[bytes], start: int = 0) -> Path:
    """One tf.train.Example per image (``image`` bytes, ``label`` int64 from ``start``), written by TensorFlow."""
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i, blob in enumerate(blobs, start):
            feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[blob])),
                       "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return path


def _jpegs(n: int, bad: dict[int, bytes] | None = None) -> list[bytes]:
    blobs = [pil_jpeg(image(seed=i)) for i in range(n)]
    for i, blob in (bad or {}).items():
        blobs[i] = blob
    return blobs


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], dst: Path) -> str:
    """The CLI's one ``unihub: error:`` line (exit 1), nothing left at or beside ``dst``."""
    capsys.readouterr()
    assert main(argv) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("unihub: error: "), lines
    assert not dst.exists() and not [n for n in os.listdir(dst.parent) if n.startswith(".")], os.listdir(dst.parent)
    return lines[0]


# ----------------------------------------------------------------------------------- TFRecord
@needs_tf
def test_a_tfrecord_with_a_truncated_jpeg_is_refused_naming_file_and_record(
        tf: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _tfrecord(tf, tmp_path / "train.tfrecord", _jpegs(20, {13: truncated(pil_jpeg(image(seed=13)))}))
    line = _refused(["convert", str(src), str(tmp_path / "out")], capsys, tmp_path / "out")
    assert f"{src}: record 13 at byte offset " in line
    assert "feature 'image': truncated JPEG" in line and "no end marker" in line


@needs_tf
def test_a_tfrecord_with_corrupt_jpeg_data_is_refused_with_full_validation(
        tf: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _tfrecord(tf, tmp_path / "train.tfrecord", _jpegs(20, {5: corrupt_scan(pil_jpeg(image(seed=5)))}))
    line = _refused(["convert", str(src), str(tmp_path / "out"), "--validate-images", "full"], capsys,
                    tmp_path / "out")
    assert f"{src}: record 5 at byte offset " in line and "feature 'image': corrupt or truncated JPEG" in line
    # its header and end marker are sound: the default check passes it, and the read fails
    assert main(["convert", str(src), str(tmp_path / "header"), "--quiet"]) == 0
    with make_reader(str(tmp_path / "header"), shuffle_row_groups=False) as reader:
        with pytest.raises(ImageDecodeError, match="row 5"):
            list(reader)


@needs_tf
def test_a_tfrecord_with_an_image_bomb_is_refused(tf: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blobs = [pil_png(image(seed=i)) for i in range(12)]
    blobs[7] = png_bomb()
    src = _tfrecord(tf, tmp_path / "bomb.tfrecord", blobs)
    line = _refused(["convert", str(src), str(tmp_path / "out")], capsys, tmp_path / "out")
    assert f"{src}: record 7 at byte offset " in line and "PNG header claims 200000x200000 pixels" in line
    convert(src, tmp_path / "unchecked", validate_images="none", progress=False)  # the read refuses it then
    with pytest.raises(ImageDecodeError, match="200000x200000"):
        list(make_reader(str(tmp_path / "unchecked"), shuffle_row_groups=False))


@needs_tf
def test_a_given_schema_is_held_to_each_image_naming_file_and_record(tf: Any, tmp_path: Path) -> None:
    src = _tfrecord(tf, tmp_path / "train.tfrecord", _jpegs(6, {2: pil_jpeg(image(8, 8))}))
    schema = Unischema("Given", [UnischemaField("image", np.uint8, (16, 16, 3), CompressedImageCodec("jpeg"), False),
                                 UnischemaField("label", np.int64, (), ScalarCodec(pa.int64()), False)])
    with pytest.raises(FormatError, match=r"train.tfrecord: record 2 at byte offset \d+: feature 'image': JPEG image "
                                          r"of shape \(8, 8, 3\) uint8 does not fit field 'image'"):
        convert(src, tmp_path / "out", schema=schema, progress=False)
    assert not (tmp_path / "out").exists()


@needs_tf
@pytest.mark.parametrize("workers", [1, 2])
def test_skipping_leaves_out_just_the_bad_images(tf: Any, tmp_path: Path, workers: int) -> None:
    """Many records per block (the vectorised path) and bad ones among them; two files in two workers."""
    bad = {3: truncated(pil_jpeg(image(seed=3))), 700: jpeg_bomb(), 1201: b"\xff\xd8\xff\xe0 not a JPEG"}
    blobs = _jpegs(1500, bad)
    _tfrecord(tf, tmp_path / "a.tfrecord", blobs[:1000])
    _tfrecord(tf, tmp_path / "b.tfrecord", blobs[1000:], start=1000)
    result = convert(str(tmp_path / "*.tfrecord"), tmp_path / "out", on_error="skip", workers=workers,
                     progress=False)
    assert result.rows == 1497
    assert [(Path(s.path).name, s.location.split(" at ")[0]) for s in result.skipped] == [
        ("a.tfrecord", "record 3"), ("a.tfrecord", "record 700"), ("b.tfrecord", "record 201")]
    assert "truncated JPEG" in result.skipped[0].reason and "65000x65000" in result.skipped[1].reason
    with make_reader(str(tmp_path / "out"), schema_fields=["label"], shuffle_row_groups=False) as reader:
        assert [row.label for row in reader] == [i for i in range(1500) if i not in bad]


@needs_tf
def test_validation_none_reaches_worker_tasks(tf: Any, tmp_path: Path) -> None:
    blobs = _jpegs(8, {6: truncated(pil_jpeg(image(seed=6)))})
    _tfrecord(tf, tmp_path / "a.tfrecord", blobs[:4])
    _tfrecord(tf, tmp_path / "b.tfrecord", blobs[4:])
    with pytest.raises(FormatError, match="b.tfrecord: record 2 .*truncated JPEG"):
        convert(str(tmp_path / "*.tfrecord"), tmp_path / "checked", workers=2, progress=False)
    result = convert(str(tmp_path / "*.tfrecord"), tmp_path / "unchecked", workers=2, validate_images="none",
                     progress=False)
    assert result.rows == 8


@needs_tf
def test_the_pixel_limit_is_the_conversions_in_forked_workers_too(
        tf: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--max-image-pixels``: a lower limit refuses images, 'none' takes a header over the default
    limit; the workers of a two-file conversion hold the same; this process's setting is left as it was."""
    blobs = [pil_png(image(seed=i)) for i in range(8)]
    blobs[6] = png_bomb(20_000, 15_000)  # 300,000,000 pixels: above the default limit, a sound header
    _tfrecord(tf, tmp_path / "a.tfrecord", blobs[:4])
    _tfrecord(tf, tmp_path / "b.tfrecord", blobs[4:], start=4)
    src = str(tmp_path / "*.tfrecord")
    before = images.MAX_IMAGE_PIXELS
    line = _refused(["convert", src, str(tmp_path / "out"), "--workers", "2"], capsys, tmp_path / "out")
    assert "b.tfrecord: record 2 at byte offset " in line and "more than the limit of 178,956,970" in line
    assert "--max-image-pixels" in line
    line = _refused(["convert", src, str(tmp_path / "out"), "--workers", "2", "--max-image-pixels", "200"], capsys,
                    tmp_path / "out")
    assert "a.tfrecord: record 0 at byte offset " in line and "16x16 pixels (256), more than the limit of 200" in line
    assert main(["convert", src, str(tmp_path / "out"), "--workers", "2", "--max-image-pixels", "none", "--quiet"]) == 0
    with make_reader(str(tmp_path / "out"), schema_fields=["label"], shuffle_row_groups=False) as reader:
        assert [row.label for row in reader] == list(range(8))
    assert images.MAX_IMAGE_PIXELS == before
    with pytest.raises(InvalidArgumentError, match="max_image_pixels must be a number >= 1, or None"):
        convert(src, tmp_path / "zero", max_image_pixels=0, progress=False)
    images.MAX_IMAGE_PIXELS = 1e9  # a setting made as a float, as Pillow's users write it, is taken as it is
    try:
        assert convert(src, tmp_path / "float", workers=2, progress=False).rows == 8
    finally:
        images.MAX_IMAGE_PIXELS = before
    for bad in ("0", "-5", "lots"):
        capsys.readouterr()
        with pytest.raises(SystemExit):
            main(["convert", src, str(tmp_path / "bad"), "--max-image-pixels", bad])
        assert "--max-image-pixels" in capsys.readouterr().err


@needs_tf
def test_a_task_holds_images_to_the_limit_its_plan_carries(tf: Any, tmp_path: Path) -> None:
    """The driver's limit travels in the task plan: a task in a spawned process (nothing inherited, as on
    a Spark executor) refuses images over it, and one whose plan says no limit takes the bomb's header."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from unihub.converters.tasks import TaskPlan, run_task
    from unihub.formats.tfrecord.format import TFRecordFormat

    blobs = [pil_png(image(seed=i)) for i in range(4)] + [png_bomb(20_000, 15_000)]
    src = str(_tfrecord(tf, tmp_path / "a.tfrecord", blobs))
    schema = TFRecordFormat(src).infer_schema()
    plans = {limit: TaskPlan("tfrecord", src, {}, schema, {}, 4, "raise", staging=str(tmp_path / f"staging-{limit}"),
                             max_image_pixels=limit) for limit in (200, None)}
    for plan in plans.values():
        os.makedirs(plan.staging)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        with pytest.raises(FormatError, match="record 0 at byte offset .*more than the limit of 200"):
            pool.submit(run_task, plans[200], 0, [src]).result()
        assert pool.submit(run_task, plans[None], 0, [src]).result().rows == 5


def test_an_unknown_mode_is_refused(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.png").write_bytes(pil_png(image()))
    with pytest.raises(InvalidArgumentError, match="validate_images must be one of header, full, none"):
        convert(tmp_path / "images", tmp_path / "out", validate_images="fast", progress=False)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------- WebDataset
def _shards(root: Path, blobs: list[bytes]) -> Path:
    import webdataset as wds

    root.mkdir()
    path = root / "shard-000000.tar"
    with wds.TarWriter(str(path), encoder=False) as writer:
        for i, blob in enumerate(blobs):
            writer.write({"__key__": f"{i:06d}", "jpg": blob, "cls": str(i).encode()})
    return path


@needs_wds
def test_a_tar_with_a_truncated_jpeg_is_refused_naming_shard_and_member(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shard = _shards(tmp_path / "shards", _jpegs(10, {4: truncated(pil_jpeg(image(seed=4)))}))
    line = _refused(["convert", str(shard), str(tmp_path / "out")], capsys, tmp_path / "out")
    assert f"{shard}: sample '000004' (offset " in line and "member '000004.jpg'" in line and "truncated JPEG" in line


@needs_wds
def test_a_tar_with_corrupt_jpeg_data_is_refused_with_full_validation(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shard = _shards(tmp_path / "shards", _jpegs(10, {7: corrupt_scan(pil_jpeg(image(seed=7)))}))
    line = _refused(["convert", str(shard), str(tmp_path / "out"), "--validate-images=full"], capsys, tmp_path / "out")
    assert f"{shard}: sample '000007' (offset " in line and "member '000007.jpg'" in line
    assert "Corrupt JPEG data" in line
    assert main(["convert", str(shard), str(tmp_path / "header"), "--quiet"]) == 0


# ------------------------------------------------------------------------------- image folders
def test_an_image_folder_checks_bombs_and_with_full_validation_decodes(tmp_path: Path) -> None:
    root = tmp_path / "images"
    (root / "cat").mkdir(parents=True)
    for i in range(4):
        (root / "cat" / f"{i}.jpg").write_bytes(pil_jpeg(image(seed=i)))
    (root / "cat" / "2.jpg").write_bytes(corrupt_scan(pil_jpeg(image(seed=2))))
    (root / "cat" / "9.jpg").write_bytes(jpeg_bomb())
    with pytest.raises(FormatError, match=r"cat/9.jpg: JPEG header claims 65000x65000 pixels"):
        convert(root, tmp_path / "out", progress=False)
    (root / "cat" / "9.jpg").unlink()
    assert convert(root, tmp_path / "header", progress=False).rows == 4
    with pytest.raises(FormatError, match=r"cat/2.jpg: corrupt or truncated JPEG .*Corrupt JPEG data"):
        convert(root, tmp_path / "full", validate_images="full", progress=False)
    assert not (tmp_path / "full").exists()


# ----------------------------------------------------------------------------------------- HDF5
def test_hdf5_images_are_checked_naming_file_and_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from unihub.formats.hdf5.format import HDF5Format

    schema = Unischema("Export", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                  UnischemaField("image", np.uint8, (16, 16, 3), CompressedImageCodec("png"), False)])
    src = tmp_path / "images.h5"
    HDF5Format.write(str(src), schema, [{"id": np.arange(5), "image": [pil_png(image(seed=i)) for i in range(5)]}])
    with h5py.File(src, "r+") as handle:  # row 2 loses its last 40 bytes, as a cut copy would
        handle["image"][2] = np.frombuffer(pil_png(image(seed=2))[:-40], np.uint8)
    line = _refused(["convert", str(src), str(tmp_path / "out")], capsys, tmp_path / "out")
    assert f"{src}: rows 2..2, field 'image': truncated PNG" in line
    result = convert(src, tmp_path / "skipped", on_error="skip", progress=False)
    assert result.rows == 4 and [(s.location, "truncated PNG" in s.reason) for s in result.skipped] == [
        ("rows 2..2", True)]
    with make_reader(str(tmp_path / "skipped"), schema_fields=["id"], shuffle_row_groups=False) as reader:
        assert [row.id for row in reader] == [0, 1, 3, 4]
