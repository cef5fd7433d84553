"""Image dimension bombs and out-of-memory decodes: refused from the header, before any pixel is allocated.

A header may claim any size; the decoders allocate what it claims before reading the data, so
every decode path (``decode_image``, the codec's columns, the readers, the DALI sources) checks
the claimed size against ``images.MAX_IMAGE_PIXELS`` and against the field's fixed dimensions
first, and no ``MemoryError`` escapes a decode.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from unihub import (
    CompressedImageCodec,
    Dataset,
    ScalarCodec,
    Unischema,
    UnischemaField,
    make_batch_reader,
    write_dataset,
)
from unihub.errors import InvalidArgumentError
from unihub.images import decoders as images
from unihub.images.decoders import ImageDecodeError, decode_image, decode_images_into, image_size
from unihub.schema.codecs import image as image_codec

from .image_bombs import image, jpeg_bomb, pil_jpeg, pil_png, png_bomb


def _field(shape: tuple[int | None, ...], codec: str = "jpeg") -> UnischemaField:
    return UnischemaField("image", np.uint8, shape, CompressedImageCodec(codec), False)


def _dataset(path: Path, blobs: list[bytes], shape: tuple[int | None, ...] = (None, None, 3)) -> Path:
    schema = Unischema("Bombs", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                 _field(shape, "png")])
    write_dataset(path, schema, ({"id": i, "image": blob} for i, blob in enumerate(blobs)))
    return path


def test_the_bombs_claim_what_their_headers_say() -> None:
    assert len(jpeg_bomb()) < 1000 and image_size(jpeg_bomb()) == (65000, 65000, 3)
    assert len(png_bomb()) < 200 and image_size(png_bomb()) == (200_000, 200_000, 3)


@pytest.mark.parametrize("bomb, fmt, claim", [(png_bomb(), "PNG", "200000x200000"),
                                              (jpeg_bomb(12_000, 16_000), "JPEG", "12000x16000")], ids=["png", "jpeg"])
def test_decode_refuses_a_bomb_from_its_header_fast_and_small(bomb: bytes, fmt: str, claim: str) -> None:
    """(The JPEG claims 0.58 GiB here, so that today's code fails fast; the 65000 x 65000 one is
    decoded under a memory limit in a subprocess below.)"""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(ImageDecodeError) as caught:
            decode_image(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 0.5 and peak < 1 << 20, peak
    message = str(caught.value)
    assert f"{fmt} header claims {claim} pixels" in message and "more than the limit of 178,956,970" in message
    assert "MAX_IMAGE_PIXELS" in message


def test_max_image_pixels_is_settable_and_none_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    png = pil_png(image(8, 8))
    monkeypatch.setattr(images, "MAX_IMAGE_PIXELS", 63)
    with pytest.raises(ImageDecodeError, match="claims 8x8 pixels .64., more than the limit of 63"):
        decode_image(png)
    with pytest.raises(ImageDecodeError, match="more than the limit of 63"):
        decode_image(pil_jpeg(image(8, 8)))
    monkeypatch.setattr(images, "MAX_IMAGE_PIXELS", 64)
    assert decode_image(png).shape == (8, 8, 3)
    monkeypatch.setattr(images, "MAX_IMAGE_PIXELS", None)
    assert decode_image(png).shape == (8, 8, 3)


def test_pixel_limit_holds_for_its_block_and_puts_the_setting_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "MAX_IMAGE_PIXELS", 1000)
    small = pil_png(image(8, 8))  # 64 pixels
    with images.pixel_limit(63):
        with pytest.raises(ImageDecodeError, match="more than the limit of 63"):
            decode_image(small)
    assert images.MAX_IMAGE_PIXELS == 1000
    with pytest.raises(RuntimeError), images.pixel_limit(None):
        assert images.MAX_IMAGE_PIXELS is None
        raise RuntimeError("the block fails")
    assert images.MAX_IMAGE_PIXELS == 1000  # put back after an error too
    with images.pixel_limit(1000):  # the setting it has: left alone, so another thread's change stays
        images.MAX_IMAGE_PIXELS = 5
    assert images.MAX_IMAGE_PIXELS == 5
    for bad in (0, -1, 0.5, True, float("nan"), "many"):
        with pytest.raises(InvalidArgumentError, match="max_image_pixels must be a number >= 1, or None"):
            images.pixel_limit_of(bad)
    assert images.pixel_limit_of(1e9) == 10**9 and images.pixel_limit_of(float("inf")) is None  # float settings


def test_a_fixed_shape_field_larger_than_the_limit_is_refused_before_its_column_is_allocated(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "MAX_IMAGE_PIXELS", 63)
    column = pa.array([pil_png(image(8, 8))], pa.binary())
    with pytest.raises(ImageDecodeError, match="field 'image' holds images of 8x8 pixels, more than the limit of 63"):
        CompressedImageCodec("png").decode_column(_field((8, 8, 3), "png"), column)


def test_no_memory_error_escapes_a_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    def out_of_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError("Unable to allocate 11.8 GiB")

    monkeypatch.setattr(images.simplejpeg, "decode_jpeg", out_of_memory)
    monkeypatch.setattr(images._imagecodecs(), "png_decode", out_of_memory)
    for blob, fmt in ((pil_jpeg(image()), "JPEG"), (pil_png(image()), "PNG")):
        with pytest.raises(ImageDecodeError, match=f"{fmt} .* out of memory decoding it: Unable to allocate"):
            decode_image(blob)
    monkeypatch.setattr(image_codec, "arrow_backed_empty", out_of_memory)
    with pytest.raises(ImageDecodeError, match=r"field 'image': out of memory for 1 images of shape \(16, 16, 3\)"):
        CompressedImageCodec("png").decode_column(_field((16, 16, 3)), pa.array([pil_png(image())]))


def test_fixed_dimensions_are_checked_against_the_header_before_decoding() -> None:
    column = pa.array([pil_jpeg(image(8, 8)), jpeg_bomb()], pa.binary())
    with pytest.raises(ImageDecodeError) as caught:
        CompressedImageCodec("jpeg").decode_column(_field((8, 8, 3)), column)
    assert caught.value.field == "image" and caught.value.row == 1
    assert "field 'image', row 1" in str(caught.value) and "(65000, 65000, 3)" in str(caught.value)
    assert "holds (8, 8, 3) uint8" in str(caught.value)
    out = np.zeros((1, 8, 8, 3), np.uint8)
    with pytest.raises(ImageDecodeError, match=r"\(200000, 200000, 3\) uint8 but out is \(8, 8, 3\)"):
        decode_images_into([png_bomb()], out)


def test_partly_fixed_dimensions_are_checked_too() -> None:
    gray = pil_jpeg(image(8, 8)[:, :, 0])
    column = pa.array([pil_jpeg(image(8, 8)), gray], pa.binary())
    with pytest.raises(ImageDecodeError, match=r"row 1: .*JPEG image of shape \(8, 8, 1\), expected \(None, None, 3\)"):
        CompressedImageCodec("jpeg").decode_column(_field((None, None, 3)), column)
    values = CompressedImageCodec("jpeg").decode_column(_field((None, None, None)), column)
    assert values[1].shape == (8, 8, 1)  # a gray image has the field's rank
    rgba = images.encode_image(np.zeros((4, 8, 4), np.uint8), "png")
    with pytest.raises(ImageDecodeError, match=r"PNG image of shape \(4, 8, 4\), expected \(None, 8, 3\)"):
        decode_image(rgba, shape=(None, 8, 3))
    assert decode_image(rgba, shape=(4, None, 4)).shape == (4, 8, 4)


def test_a_reader_names_the_file_and_row_of_a_bomb(tmp_path: Path) -> None:
    url = _dataset(tmp_path / "ds", [pil_png(image()), png_bomb()])
    with make_batch_reader(str(url), shuffle_row_groups=False, workers_count=1) as reader:
        with pytest.raises(ImageDecodeError) as caught:
            next(iter(reader))
    message = str(caught.value)
    assert ".parquet, row group 0 (row 1 of the dataset): field 'image', row 1" in message
    assert "PNG header claims 200000x200000 pixels" in message


@pytest.mark.parametrize("cached", [False, True], ids=["read", "cached-whole"])
def test_random_access_names_the_file_and_row_of_a_bomb(cached: bool, tmp_path: Path) -> None:
    """Before: ``Dataset(url)[3]`` said 'field 'image', row 0' (the first row asked), naming no file."""
    schema = Unischema("Bombs", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                 _field((None, None, 3), "png")])
    blobs = [pil_png(image()), pil_png(image()), pil_png(image()), png_bomb(), pil_png(image())]
    write_dataset(tmp_path / "ds", schema, ({"id": i, "image": b} for i, b in enumerate(blobs)), rows_per_file=2)
    ds = Dataset(str(tmp_path / "ds"))
    if cached:  # every row group in memory: the whole dataset's cells serve a take
        ds.take([0, 1, 2, 4])
    for asked in ([3], [4, 0, 3], [-2]):
        with pytest.raises(ImageDecodeError) as caught:
            ds.take(asked)
        assert "part-00001.parquet, row group 0 (row 3 of the dataset): field 'image', row 1:" in str(caught.value)
        assert caught.value.row == 1 and caught.value.field == "image"


def test_the_dali_sources_refuse_a_bomb_before_dali_allocates_it(tmp_path: Path) -> None:
    from unihub.bridges.dali import DaliBatchSource, DaliSampleSource

    url = _dataset(tmp_path / "ds", [pil_png(image()), png_bomb()])
    with DaliBatchSource(str(url), batch_size=2, fields=["id", "image"]) as source:
        with pytest.raises(ImageDecodeError, match="field 'image': PNG header claims 200000x200000 pixels"):
            next(iter(source))

    class Info:
        epoch_idx, idx_in_epoch, idx_in_batch = 0, 1, 1

    with pytest.raises(ImageDecodeError, match="field 'image': PNG header claims 200000x200000 pixels"):
        DaliSampleSource(str(url), ["id", "image"])(Info())


_UNDER_A_MEMORY_LIMIT = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # the bombs claim 11.8 and 112 GiB
sys.path.insert(0, {here!r})
from image_bombs import jpeg_bomb, png_bomb
from unihub import make_batch_reader
from unihub.images.decoders import decode_image

results = {{}}
for name, run in [("jpeg", lambda: decode_image(jpeg_bomb())), ("png", lambda: decode_image(png_bomb())),
                  ("reader", lambda: next(iter(make_batch_reader({url!r}, workers_count=1))))]:
    start = time.perf_counter()
    try:
        run()
        results[name] = ["no error", 0]
    except BaseException as exc:
        results[name] = [type(exc).__name__, time.perf_counter() - start]
print(json.dumps(results))
"""


def test_bombs_under_a_memory_limit_raise_image_decode_errors_not_memory_errors(tmp_path: Path) -> None:
    url = _dataset(tmp_path / "ds", [jpeg_bomb()])
    script = textwrap.dedent(_UNDER_A_MEMORY_LIMIT.format(here=str(Path(__file__).parent), url=str(url)))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for name, (error, seconds) in results.items():
        assert error == "ImageDecodeError" and seconds < 1.0, (name, error, seconds)
