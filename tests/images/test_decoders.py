"""PNG / JPEG encode and decode: round trips, ``out=``, corrupt data, and files from other libraries.

Files written by Pillow and OpenCV check that unihub reads standard files (and that
the files it writes are standard); OpenCV's own JPEG decode is the reference that
Petastorm datasets were decoded with.
"""

from __future__ import annotations

import io
import itertools
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from unihub.images.decoders import (
    DECODER_NAME,
    ImageDecodeError,
    decode_image,
    decode_images_into,
    detect_format,
    encode_image,
    image_size,
    image_sizes,
)

#: unihub and OpenCV both decode with libjpeg-turbo's accurate IDCT and fancy upsampling;
#: measured max abs difference on OpenCV-written JPEGs is 0 (bit-exact). Allow a little
#: so that a different libjpeg-turbo build (SIMD path) does not fail the suite.
OPENCV_JPEG_MAX_ABS_DIFF = 2
OPENCV_JPEG_MEAN_ABS_DIFF = 0.1


def smooth_image(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Gradients and low-frequency waves plus mild noise (sigma 1): what JPEG handles well."""
    rng = np.random.default_rng(seed)
    h, w = shape[:2]
    channels = shape[2] if len(shape) == 3 else 1
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    planes = [  # periods of 40-120 pixels, whatever the image size
        rng.uniform(60, 190)
        + 50 * np.sin(2 * np.pi * x / rng.uniform(40, 120)) * np.cos(2 * np.pi * y / rng.uniform(40, 120))
        + 0.2 * x
        + rng.normal(0, 1, (h, w))
        for _ in range(channels)
    ]
    image = np.clip(np.stack(planes, -1), 0, 255).astype(np.uint8)
    return image if len(shape) == 3 else image[..., 0]


def pil_bytes(image, fmt: str, **options) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **options)
    return buf.getvalue()


def cv2_bytes(array: np.ndarray, ext: str, params: list[int] | None = None) -> bytes:
    cv2 = pytest.importorskip("cv2")
    if array.ndim == 3:
        code = cv2.COLOR_RGB2BGR if array.shape[2] == 3 else cv2.COLOR_RGBA2BGRA
        array = cv2.cvtColor(array, code)
    ok, buf = cv2.imencode(ext, array, params or [])
    assert ok
    return buf.tobytes()


SHAPES = [(32, 48, 3), (32, 48, 4), (32, 48), (1, 1, 3), (7, 300)]


# ----------------------------------------------------------------- round trips
@pytest.mark.parametrize("shape", SHAPES)
def test_png_round_trip_is_exact(shape: tuple[int, ...]) -> None:
    image = np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)
    data = encode_image(image, "png")
    decoded = decode_image(data)
    assert decoded.dtype == np.uint8 and decoded.shape == shape
    np.testing.assert_array_equal(decoded, image)


def test_png_round_trip_gray_alpha_and_16_bit() -> None:
    gray_alpha = np.random.default_rng(2).integers(0, 256, (9, 5, 2), dtype=np.uint8)
    np.testing.assert_array_equal(decode_image(encode_image(gray_alpha, "png")), gray_alpha)
    deep = np.random.default_rng(3).integers(0, 65536, (9, 5, 3), dtype=np.uint16)
    decoded = decode_image(encode_image(deep, "png"))
    assert decoded.dtype == np.uint16
    np.testing.assert_array_equal(decoded, deep)


@pytest.mark.parametrize(("shape", "dtype"), [((300, 1), np.uint8), ((300, 2), np.uint8), ((300, 1), np.uint16),
                                              ((2000, 1, 3), np.uint8), ((1, 1), np.uint8)])
def test_png_round_trip_of_narrow_noise(shape: tuple[int, ...], dtype: type) -> None:
    """Incompressible narrow images grow when deflated: imagecodecs' own buffer estimate was too
    small for them, and encoding raised its PngError ("output stream too small")."""
    image = np.random.default_rng(4).integers(0, np.iinfo(dtype).max + 1, shape, dtype=dtype)
    decoded = decode_image(encode_image(image, "png"))
    np.testing.assert_array_equal(decoded, image.reshape(decoded.shape))
    assert decoded.shape == image.shape


def test_single_channel_is_gray() -> None:
    image = smooth_image((16, 16, 1))
    decoded = decode_image(encode_image(image, "png"))
    assert decoded.shape == (16, 16)
    np.testing.assert_array_equal(decoded, image[..., 0])


@pytest.mark.parametrize("shape", [(64, 64, 3), (256, 256, 3), (64, 64), (33, 17, 3)])
@pytest.mark.parametrize("quality", [80, 90])
def test_jpeg_round_trip_is_close(shape: tuple[int, ...], quality: int) -> None:
    image = smooth_image(shape, seed=quality)
    data = encode_image(image, "jpeg", quality=quality)
    decoded = decode_image(data)
    assert decoded.dtype == np.uint8 and decoded.shape == shape
    assert np.abs(decoded.astype(np.int16) - image).mean() < 3


def test_jpeg_quality_trades_size() -> None:
    image = smooth_image((64, 64, 3))
    assert len(encode_image(image, "jpeg", quality=30)) < len(encode_image(image, "jpeg", quality=95))


# ----------------------------------------------------------------------- out=
@pytest.mark.parametrize("fmt", ["png", "jpeg"])
@pytest.mark.parametrize("shape", [(24, 40, 3), (24, 40)])
def test_decode_into_a_column(fmt: str, shape: tuple[int, ...]) -> None:
    images = [smooth_image(shape, seed) for seed in range(4)]
    blobs = [encode_image(image, fmt) for image in images]
    column = np.zeros((4, *shape), np.uint8)
    for row, blob in enumerate(blobs):
        row_view = column[row]
        assert decode_image(blob, out=row_view) is row_view
    np.testing.assert_array_equal(column, np.stack([decode_image(blob) for blob in blobs]))
    if fmt == "png":
        np.testing.assert_array_equal(column, np.stack(images))


def test_decode_images_into_mixes_formats_and_names_the_bad_row() -> None:
    images = [smooth_image((24, 40, 3), seed) for seed in range(4)]
    blobs = [encode_image(images[0], "png"), memoryview(encode_image(images[1], "jpeg")),
             memoryview(encode_image(images[2], "png")), encode_image(images[3], "png")]
    column = np.zeros((4, 24, 40, 3), np.uint8)
    assert decode_images_into(blobs, column) is column
    np.testing.assert_array_equal(column[[0, 2, 3]], np.stack([images[0], images[2], images[3]]))
    np.testing.assert_array_equal(column[1], decode_image(blobs[1]))

    truncated = blobs[:2] + [encode_image(images[2], "png")[:60]] + blobs[3:]
    with pytest.raises(ImageDecodeError, match="corrupt or truncated PNG") as info:
        decode_images_into(truncated, column)
    assert info.value.row == 2
    gray = [encode_image(images[0][:, :, 0], "png")]
    with pytest.raises(ImageDecodeError, match=r"PNG image is \(24, 40\) uint8 but out is \(24, 40, 3\)"):
        decode_images_into(gray, column[:1])


def test_decode_images_into_takes_jpegs_as_decode_image_does() -> None:
    # an RGB column's JPEGs whose header says its shape go straight to TurboJPEG; every other JPEG
    # (and every failure) gets decode_image's checks: the same pixels, the same errors
    Image = pytest.importorskip("PIL.Image")
    rgb = [smooth_image((24, 40, 3), seed) for seed in range(3)]
    good = [encode_image(rgb[0], "jpeg"), memoryview(pil_bytes(Image.fromarray(rgb[1]), "JPEG", quality=90,
                                                              progressive=True)),
            pil_bytes(Image.fromarray(rgb[2]).convert("CMYK"), "JPEG", quality=95)]  # 4 components: checked path
    column = np.zeros((3, 24, 40, 3), np.uint8)
    decode_images_into(good, column)
    np.testing.assert_array_equal(column, np.stack([decode_image(blob) for blob in good]))
    cases = {
        "truncated after a matching header": (good[0][: len(good[0]) // 2], "corrupt or truncated JPEG"),
        "gray": (encode_image(rgb[0][:, :, 0], "jpeg"), r"JPEG image is \(24, 40\) uint8 but out is \(24, 40, 3\)"),
        "another size": (encode_image(rgb[0][:, :20], "jpeg"), r"JPEG image is \(24, 20, 3\) uint8"),
        "garbage after the SOI": (b"\xff\xd8\xff\xe0" + b"\x00" * 40, "corrupt, truncated or unsupported JPEG"),
    }
    for name, (bad, message) in cases.items():
        with pytest.raises(ImageDecodeError, match=message) as info:
            decode_images_into([good[0], bad], np.zeros((2, 24, 40, 3), np.uint8))
        assert info.value.row == 1, name
        with pytest.raises(ImageDecodeError, match=message):
            decode_image(bad, out=np.zeros((24, 40, 3), np.uint8))


def test_decode_images_into_checks_each_jpeg_header_that_differs() -> None:
    # one encoder's images share their bytes up to the frame header, which is checked once; a row
    # whose leading bytes differ anywhere up to the end of that header is checked again
    images = [smooth_image((24, 40, 3), seed) for seed in range(6)]
    blobs = [encode_image(image, "jpeg", quality=q) for image, q in zip(images, [80, 80, 95, 80, 95, 80])]
    column = np.zeros((6, 24, 40, 3), np.uint8)
    decode_images_into(blobs, column)
    np.testing.assert_array_equal(column, np.stack([decode_image(blob) for blob in blobs]))
    for row, height in itertools.product(range(1, 6), [8, 16, 32]):
        # the same encoder and quality, another height: the leading bytes differ only in the frame
        # header (TurboJPEG would decode a shorter image into the top of the row and say nothing)
        other = encode_image(smooth_image((height, 40, 3), row), "jpeg", quality=[80, 80, 95, 80, 95, 80][row])
        edited = blobs[:row] + [other] + blobs[row + 1:]
        with pytest.raises(ImageDecodeError, match=rf"JPEG image is \({height}, 40, 3\) uint8 but out is \(24, 40, 3\)") \
                as info:
            decode_images_into(edited, np.zeros((6, 24, 40, 3), np.uint8))
        assert info.value.row == row


@pytest.mark.parametrize("fmt", ["png", "jpeg"])
def test_out_is_returned_and_may_be_strided(fmt: str) -> None:
    image = smooth_image((20, 30, 3))
    blob = encode_image(image, fmt)
    out = np.empty((20, 30, 3), np.uint8)
    assert decode_image(blob, out=out) is out
    strided = np.zeros((20, 60, 3), np.uint8)[:, ::2]
    assert decode_image(blob, out=strided) is strided
    np.testing.assert_array_equal(strided, out)


@pytest.mark.parametrize("fmt", ["png", "jpeg"])
@pytest.mark.parametrize("bad", [((20, 31, 3), np.uint8), ((20, 30), np.uint8), ((20, 30, 4), np.uint8),
                                 ((20, 30, 3), np.uint16), ((40, 60, 3), np.uint8)])
def test_out_of_the_wrong_shape_or_dtype_raises(fmt: str, bad: tuple[tuple[int, ...], type]) -> None:
    blob = encode_image(smooth_image((20, 30, 3)), fmt)
    shape, dtype = bad
    with pytest.raises(ImageDecodeError, match=r"image is \(20, 30, 3\) uint8 but out is"):
        decode_image(blob, out=np.empty(shape, dtype))


# -------------------------------------------------------------- corrupt data
def _damage(blob: bytes, damage: str) -> bytes:
    middle = len(blob) // 2
    return {
        "half": lambda: blob[:middle],
        "header only": lambda: blob[:30],
        "signature only": lambda: blob[:8],
        # PNG: zlib's checksum and the chunk CRCs catch flipped pixel data
        "zeroed middle": lambda: blob[:middle] + bytes(16) + blob[middle + 16:],
        # JPEG has no checksum: only a missing end, or a broken header, is detectable
        "no end marker": lambda: blob[:-2],
        "broken header": lambda: blob[:20] + b"\xff\xff\x00\x00" + blob[24:],
    }[damage]()


@pytest.mark.parametrize(("fmt", "damage"), [
    *[("png", d) for d in ("half", "header only", "signature only", "zeroed middle")],
    *[("jpeg", d) for d in ("half", "header only", "signature only", "no end marker", "broken header")],
])
def test_corrupt_or_truncated_data_raises(fmt: str, damage: str) -> None:
    data = _damage(encode_image(smooth_image((64, 64, 3)), fmt, quality=90), damage)
    with pytest.raises(ImageDecodeError, match=fmt.upper()):
        decode_image(data)
    with pytest.raises(ImageDecodeError):
        decode_image(data, out=np.empty((64, 64, 3), np.uint8))


@pytest.mark.parametrize("data", [b"", b"garbage", b"GIF89a" + bytes(40), np.arange(50, dtype=np.uint8).tobytes()])
def test_unknown_bytes_raise(data: bytes) -> None:
    assert detect_format(data) is None and image_size(data) is None
    with pytest.raises(ImageDecodeError, match="not a PNG or JPEG"):
        decode_image(data)


def test_image_decode_error_is_a_value_error() -> None:
    assert issubclass(ImageDecodeError, ValueError)


# -------------------------------------------------- files from other libraries
def test_files_written_by_pillow() -> None:
    Image = pytest.importorskip("PIL.Image")
    rgb, gray = smooth_image((30, 20, 3)), smooth_image((30, 20))
    cases = {
        "RGB png": (pil_bytes(Image.fromarray(rgb), "PNG"), "png", (30, 20, 3), rgb),
        "RGBA png": (pil_bytes(Image.fromarray(np.dstack([rgb, gray])), "PNG"), "png", (30, 20, 4),
                     np.dstack([rgb, gray])),
        "L png": (pil_bytes(Image.fromarray(gray), "PNG"), "png", (30, 20, 1), gray),
        "LA png": (pil_bytes(Image.fromarray(np.dstack([gray, rgb[..., 0]]), "LA"), "PNG"), "png", (30, 20, 2),
                   np.dstack([gray, rgb[..., 0]])),
        "I;16 png": (pil_bytes(Image.fromarray(gray.astype(np.uint16) * 257), "PNG"), "png", (30, 20, 1),
                     gray.astype(np.uint16) * 257),
        "P png": (pil_bytes(Image.fromarray(rgb).quantize(16), "PNG"), "png", (30, 20, 3),
                  np.asarray(Image.fromarray(rgb).quantize(16).convert("RGB"))),
        "P+tRNS png": (pil_bytes(Image.fromarray(rgb).quantize(16), "PNG", transparency=0), "png", (30, 20, 4),
                       None),
        "RGB jpeg": (pil_bytes(Image.fromarray(rgb), "JPEG", quality=90), "jpeg", (30, 20, 3), rgb),
        "L jpeg": (pil_bytes(Image.fromarray(gray), "JPEG", quality=90), "jpeg", (30, 20, 1), gray),
        "progressive jpeg": (pil_bytes(Image.fromarray(rgb), "JPEG", quality=90, progressive=True), "jpeg",
                             (30, 20, 3), rgb),
        "CMYK jpeg": (pil_bytes(Image.fromarray(rgb).convert("CMYK"), "JPEG", quality=95), "jpeg", (30, 20, 3),
                      rgb),
    }
    for name, (data, fmt, size, want) in cases.items():
        assert detect_format(data) == fmt, name
        assert image_size(data) == size, name
        decoded = decode_image(data)
        assert decoded.shape == (size[:2] if size[2] == 1 else size), name
        if want is None:
            continue
        if fmt == "png":
            np.testing.assert_array_equal(decoded, want, err_msg=name)
        else:
            assert np.abs(decoded.astype(np.int16) - want).mean() < 3, name
            pillow = np.asarray(Image.open(io.BytesIO(data)).convert("RGB" if size[2] == 3 else "L"))
            assert np.abs(decoded.astype(np.int16) - pillow).max() <= 3, name


def test_interlaced_png() -> None:
    """Adam7-interlaced PNG, built by hand (neither Pillow nor OpenCV writes one)."""
    image = np.random.default_rng(4).integers(0, 256, (13, 11, 3), dtype=np.uint8)
    raw = b"".join(
        b"\x00" + row.tobytes()
        for y0, x0, dy, dx in [(0, 0, 8, 8), (0, 4, 8, 8), (4, 0, 8, 4), (0, 2, 4, 4), (2, 0, 4, 2), (0, 1, 2, 2),
                               (1, 0, 2, 1)]
        for row in image[y0::dy, x0::dx]
        if row.size
    )

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    data = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 11, 13, 8, 2, 0, 0, 1))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    assert image_size(data) == (13, 11, 3)
    np.testing.assert_array_equal(decode_image(data), image)


@pytest.mark.parametrize("shape", [(32, 48, 3), (32, 48, 4), (24, 24)])
def test_png_written_by_opencv(shape: tuple[int, ...]) -> None:
    image = smooth_image(shape)
    data = cv2_bytes(image, ".png")
    assert detect_format(data) == "png"
    assert image_size(data) == (shape if len(shape) == 3 else (*shape, 1))
    np.testing.assert_array_equal(decode_image(data), image)


@pytest.mark.parametrize("shape", [(32, 48, 3), (256, 256, 3), (24, 24), (37, 53, 3)])
@pytest.mark.parametrize("quality", [50, 90])
def test_jpeg_written_by_opencv_matches_opencv_decode(shape: tuple[int, ...], quality: int) -> None:
    cv2 = pytest.importorskip("cv2")
    image = smooth_image(shape, seed=quality)
    data = cv2_bytes(image, ".jpg", [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert detect_format(data) == "jpeg"
    assert image_size(data) == (shape if len(shape) == 3 else (*shape, 1))
    reference = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if reference.ndim == 3:
        reference = cv2.cvtColor(reference, cv2.COLOR_BGR2RGB)
    diff = np.abs(decode_image(data).astype(np.int16) - reference)
    assert diff.max() <= OPENCV_JPEG_MAX_ABS_DIFF
    assert diff.mean() <= OPENCV_JPEG_MEAN_ABS_DIFF


@pytest.mark.parametrize("shape", [(32, 48, 3), (32, 48, 4), (24, 24)])
@pytest.mark.parametrize("fmt", ["png", "jpeg"])
def test_our_files_are_standard(shape: tuple[int, ...], fmt: str) -> None:
    """Pillow and OpenCV read what encode_image writes, in RGB order."""
    Image = pytest.importorskip("PIL.Image")
    image = smooth_image(shape)
    if fmt == "jpeg" and len(shape) == 3 and shape[2] == 4:
        with pytest.raises(ValueError, match="no alpha"):
            encode_image(image, fmt)
        return
    data = encode_image(image, fmt, quality=95)
    pillow = np.asarray(Image.open(io.BytesIO(data)))
    cv2 = pytest.importorskip("cv2")
    opencv = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if opencv.ndim == 3:
        opencv = cv2.cvtColor(opencv, cv2.COLOR_BGR2RGB if shape[2] == 3 else cv2.COLOR_BGRA2RGBA)
    for other in (pillow, opencv):
        assert other.shape == shape
        if fmt == "png":
            np.testing.assert_array_equal(other, image)
        else:
            assert np.abs(other.astype(np.int16) - image).mean() < 3


# ----------------------------------------------------------- misc behaviour
@pytest.mark.parametrize("fmt", ["png", "jpeg"])
def test_any_byte_buffer_is_accepted(fmt: str) -> None:
    """bytes, bytearray, memoryview slices, numpy arrays and Arrow buffers (signed bytes)."""
    pa = pytest.importorskip("pyarrow")
    data = encode_image(smooth_image((5, 9, 3)), fmt)
    want = decode_image(data)
    arrow = pa.array([b"xx", data], pa.binary())
    for buffer in (bytearray(data), memoryview(b"xx" + data)[2:], np.frombuffer(data, np.uint8),
                   pa.py_buffer(data), memoryview(pa.py_buffer(data)), arrow[1].as_buffer()):
        assert detect_format(buffer) == fmt and image_size(buffer) == (5, 9, 3)
        np.testing.assert_array_equal(decode_image(buffer), want)


def test_encode_rejects_what_it_cannot_write() -> None:
    with pytest.raises(ValueError, match="unknown image format"):
        encode_image(np.zeros((4, 4, 3), np.uint8), "gif")
    with pytest.raises(ValueError, match="uint8"):
        encode_image(np.zeros((4, 4, 3), np.float32), "jpeg")
    with pytest.raises(ValueError, match="non-empty"):
        encode_image(np.zeros((0, 4, 3), np.uint8), "png")
    with pytest.raises(ValueError, match="1-4 channels"):
        encode_image(np.zeros((4, 4, 5), np.uint8), "png")
    with pytest.raises(ValueError, match="quality"):
        encode_image(np.zeros((4, 4, 3), np.uint8), "jpeg", quality=101)
    for fraction_or_flag in (50.7, True):  # were cut to 50 / taken as 1 without a word
        with pytest.raises(ValueError, match="whole number"):
            encode_image(np.zeros((4, 4, 3), np.uint8), "jpeg", quality=fraction_or_flag)
    assert encode_image(np.zeros((4, 4, 3), np.uint8), "jpeg", quality=90.0) == \
        encode_image(np.zeros((4, 4, 3), np.uint8), "jpeg", quality=90)
    assert detect_format(encode_image(np.zeros((4, 4, 3), np.uint8), "JPG")) == "jpeg"


@pytest.mark.parametrize("fmt", ["png", "jpeg"])
def test_concurrent_decoding_matches_sequential(fmt: str) -> None:
    blobs = [encode_image(smooth_image((48, 48, 3), seed), fmt) for seed in range(32)]
    want = [decode_image(blob) for blob in blobs]
    column = np.empty((len(blobs), 48, 48, 3), np.uint8)
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(decode_image, blobs * 4))
        list(pool.map(lambda row: decode_image(blobs[row], out=column[row]), range(len(blobs))))
    for i, image in enumerate(got):
        np.testing.assert_array_equal(image, want[i % len(blobs)])
    np.testing.assert_array_equal(column, np.stack(want))


def test_decoder_name_names_the_backends() -> None:
    assert "png" in DECODER_NAME.lower() and "jpeg" in DECODER_NAME.lower()


def test_image_sizes_of_many_values_equal_image_size_of_each() -> None:
    """Grouping by header gives what image_size and detect_format say of every value, counted."""
    from collections import Counter

    from PIL import Image

    rng = np.random.default_rng(5)
    rgb = rng.integers(0, 255, (6, 5, 3), dtype=np.uint8)
    jpeg_a = encode_image(smooth_image((8, 8, 3)), "jpeg", 90)
    jpeg_b = encode_image(smooth_image((16, 8, 3)), "jpeg", 90)
    values = [jpeg_a] * 20 + [jpeg_b] * 12 + [
        encode_image(smooth_image((4, 7)), "png"),  # gray
        pil_bytes(Image.fromarray(rgb).quantize(16), "PNG", transparency=0),  # palette + tRNS: 4 channels
        jpeg_a[:40],  # truncated before the frame header
        jpeg_a[:100] + b"\x00" * 5,  # same start, header cut
        b"",
        b"not an image at all",
    ] + [jpeg_a] * 3 + [encode_image(smooth_image((3, 3, 3)), "png")] * 9
    buffer = np.frombuffer(b"".join(values), np.uint8)
    ends = np.cumsum([len(v) for v in values])
    starts = ends - [len(v) for v in values]
    expected = Counter((image_size(v), detect_format(v) if image_size(v) is not None else None) for v in values)
    got: Counter = Counter()
    for size, fmt, count in image_sizes(buffer, starts, ends):
        got[(size, fmt)] += count
    assert got == expected
    assert got[((8, 8, 3), "jpeg")] == 23 and got[((6, 5, 4), "png")] == 1


def test_image_sizes_parses_one_header_per_group(monkeypatch: pytest.MonkeyPatch) -> None:
    import unihub.images.decoders as images

    calls = []
    original = images.image_size_spans
    monkeypatch.setattr(images, "image_size_spans", lambda v: calls.append(1) or original(v))
    blob = encode_image(smooth_image((8, 8, 3)), "jpeg", 90)
    buffer = np.frombuffer(blob * 500, np.uint8)
    starts = np.arange(500) * len(blob)
    assert list(image_sizes(buffer, starts, starts + len(blob))) == [((8, 8, 3), "jpeg", 500)]
    assert len(calls) == 1


def test_image_sizes_groups_pngs_whose_data_lengths_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PNG's size does not depend on its first IDAT chunk's length, so noise images group too."""
    import unihub.images.decoders as images

    calls = []
    original = images.image_size_spans
    monkeypatch.setattr(images, "image_size_spans", lambda v: calls.append(1) or original(v))
    rng = np.random.default_rng(1)
    blobs = [encode_image(rng.integers(0, 255, (6, 7, 3), dtype=np.uint8) * (rng.random((6, 7, 1)) < k / 40),
                          "png") for k in range(40)]  # more noise, longer data
    assert len({len(b) for b in blobs}) > 1
    ends = np.cumsum([len(b) for b in blobs])
    assert list(image_sizes(np.frombuffer(b"".join(blobs), np.uint8), ends - [len(b) for b in blobs], ends)) == \
        [((6, 7, 3), "png", 40)]
    assert len(calls) == 1


def test_leading_bytes_of_values_of_any_length() -> None:
    from unihub.images.decoders import leading_bytes

    values = [b"", b"a", b"abcdef", b"0123456789", b"xy"]
    buffer = np.frombuffer(b"".join(values), np.uint8)
    sizes = np.array([len(v) for v in values])
    starts = np.cumsum(sizes) - sizes
    got = leading_bytes(buffer, starts, sizes, 4)
    assert [bytes(row) for row in got] == [v[:4].ljust(4, b"\0") for v in values]
    assert leading_bytes(np.zeros(0, np.uint8), np.array([0]), np.array([0]), 3).tolist() == [[0, 0, 0]]


def test_a_gray_png_decoded_into_a_channel_axis_returns_that_array() -> None:
    """Decoded in place into ``out`` of shape (H, W, 1), the call returns ``out`` itself (imagecodecs gives its
    own (H, W) view back), as the docstring promises and a caller using the result relies on. PIL writes it."""
    from PIL import Image

    pixels = np.arange(64 * 48, dtype=np.uint32).reshape(64, 48).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buffer, format="PNG")
    out = np.zeros((64, 48, 1), np.uint8)
    got = decode_image(buffer.getvalue(), out)
    assert got is out and got.shape == (64, 48, 1) and np.array_equal(got[..., 0], pixels)


def _png_of(chunks: list[tuple[bytes, bytes]], crc_of: bytes = b"") -> bytes:
    """A PNG of ``chunks`` (type, data), each with its CRC, but a wrong one for the chunk type ``crc_of``."""
    return b"\x89PNG\r\n\x1a\n" + b"".join(
        struct.pack(">I", len(data)) + kind + data
        + struct.pack(">I", (zlib.crc32(kind + data) ^ (kind == crc_of)) & 0xFFFFFFFF)
        for kind, data in chunks)


@pytest.mark.parametrize(("color_type", "plte", "trns", "crc_of", "channels"), [
    (2, b"", b"\x00\x01\x00\x02\x00\x03", b"", 4),  # a valid tRNS: alpha added
    (2, b"", b"\x00\x01\x00\x02\x00\x03", b"tRNS", 3),  # its CRC wrong: libpng drops it
    (2, b"", b"\x00\x01", b"", 3),  # too short for RGB
    (0, b"", b"\x00\x01\x00", b"", 1),  # too long for gray
    (3, bytes(6), b"\x00\x10\x20", b"", 3),  # more entries than the palette's 2
    (3, bytes(6), b"\x00\x10", b"", 4),
], ids=["valid", "bad-crc", "short-rgb", "long-gray", "long-palette", "palette"])
def test_png_size_agrees_with_libpng_on_an_invalid_trns(color_type: int, plte: bytes, trns: bytes, crc_of: bytes,
                                                      channels: int) -> None:
    """libpng decodes without alpha when it drops a tRNS chunk (wrong CRC or length, only a warning):
    image_size said 4 channels for such an RGB image and the column's ``out`` did not fit it."""
    samples = {0: 1, 2: 3, 3: 1}[color_type]
    ihdr = struct.pack(">IIBBBBB", 3, 2, 8, color_type, 0, 0, 0)
    chunks = [(b"IHDR", ihdr)] + ([(b"PLTE", plte)] if plte else []) + [
        (b"tRNS", trns), (b"IDAT", zlib.compress(bytes(2 * (1 + 3 * samples)))), (b"IEND", b"")]
    blob = _png_of(chunks, crc_of)
    decoded = decode_image(blob)
    assert image_size(blob) == (2, 3, channels)
    assert decoded.shape == ((2, 3) if channels == 1 else (2, 3, channels))
    column = np.empty((2,) + decoded.shape, np.uint8)
    np.testing.assert_array_equal(decode_images_into([blob, blob], column)[1], decoded)


@pytest.mark.parametrize("sof", [b"\xff\xc0", b"\xff\xc1"])
def test_12_bit_jpeg_is_refused_as_unsupported_not_corrupt(sof: bytes) -> None:
    """A 12-bit JPEG is a valid file TurboJPEG's 8-bit API cannot decode: the error said it was corrupt."""
    jpeg = encode_image(smooth_image((8, 8, 3)), "jpeg")
    at = jpeg.index(b"\xff\xc0")
    deep = jpeg[:at] + sof + jpeg[at + 2:at + 4] + b"\x0c" + jpeg[at + 5:]
    with pytest.raises(ImageDecodeError, match="unsupported JPEG .*12-bit samples"):
        decode_image(deep)
    with pytest.raises(ImageDecodeError, match="unsupported JPEG .*12-bit samples") as info:
        decode_images_into([jpeg, deep], np.empty((2, 8, 8, 3), np.uint8))
    assert info.value.row == 1


@pytest.mark.parametrize("fmt", ["png", "jpeg"])
def test_decode_images_into_takes_uint8_arrays(fmt: str) -> None:
    """Encoded images as uint8 arrays (how a reader with ``decode_images=False`` may hand out views of its
    file) decode as bytes do: their slices compared to bytes elementwise and raised a raw ValueError."""
    image = smooth_image((6, 5, 3))
    blob = encode_image(image, fmt)
    out = np.zeros((2, 6, 5, 3), np.uint8)
    decode_images_into([np.frombuffer(blob, np.uint8)] * 2, out)
    np.testing.assert_array_equal(out[1], decode_image(blob))
