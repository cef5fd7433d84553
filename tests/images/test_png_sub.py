"""``images/png_sub.py``: SUB-filtered PNG columns decoded without libpng, bit for bit libpng's, and
everything else (other filters, tRNS, bad CRCs, truncation) left to libpng with its errors."""

from __future__ import annotations

import struct
import zlib

import imagecodecs
import numpy as np
import pytest

from unihub.images.decoders import ImageDecodeError, decode_images_into, encode_image
from unihub.images.png_sub import decode_sub_pngs


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png(image: np.ndarray, filters: bytes, extra: bytes = b"", idat_parts: int = 1) -> bytes:
    """An 8-bit PNG of ``image`` written by hand with the given filter byte per row (the rows' bytes
    filtered accordingly: 0 none, 1 SUB), ``extra`` chunks before the IDATs."""
    h, w = image.shape[:2]
    c = 1 if image.ndim == 2 else image.shape[2]
    colour = {1: 0, 2: 4, 3: 2, 4: 6}[c]
    rows = image.reshape(h, w * c).astype(np.int16)
    raw = b""
    for y in range(h):
        row = rows[y].copy()
        if filters[y] == 1:
            row[c:] = (rows[y][c:] - rows[y][:-c]) % 256
        raw += bytes([filters[y]]) + row.astype(np.uint8).tobytes()
    stream = zlib.compress(raw, 6)
    cut = [len(stream) * i // idat_parts for i in range(idat_parts + 1)]
    idats = b"".join(_chunk(b"IDAT", stream[a:b]) for a, b in zip(cut, cut[1:]))
    ihdr = _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, colour, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + ihdr + extra + idats + _chunk(b"IEND", b"")


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_sub_filtered_columns_decode_without_libpng_to_libpngs_pixels(channels: int) -> None:
    rng = np.random.default_rng(channels)
    shape = (5, 17, 33) + ((channels,) if channels > 1 else ())
    images = rng.integers(0, 256, shape, dtype=np.uint8)
    blobs = [encode_image(im, "png") for im in images[:3]]  # encode_image writes every row SUB-filtered
    blobs += [_png(images[3], b"\x01" * 17, extra=_chunk(b"tEXt", b"k\x00v"), idat_parts=3),
              _png(images[4], b"\x01" * 17)]
    out = np.zeros(shape, np.uint8)
    done = decode_sub_pngs(blobs, out)
    assert done is not None and done.all()
    np.testing.assert_array_equal(out, images)
    expected = np.stack([imagecodecs.png_decode(b).reshape(shape[1:]) for b in blobs])
    np.testing.assert_array_equal(out, expected)


def test_other_pngs_are_left_to_libpng_and_a_mixed_column_decodes_whole() -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 8, 12, 3), dtype=np.uint8)
    sub = encode_image(images[0], "png")
    mixed_filters = _png(images[1], b"\x01\x00" * 4)  # a row with no filter: libpng's
    with_trns = _png(images[2], b"\x01" * 8, extra=_chunk(b"tRNS", b"\x00\x01\x00\x02\x00\x03"))
    other_size = encode_image(images[3][:4], "png")
    jpeg = encode_image(images[4], "jpeg")
    blobs = [sub, mixed_filters, sub, with_trns, other_size, jpeg]
    done = decode_sub_pngs(blobs, np.zeros((6, 8, 12, 3), np.uint8))
    assert done is not None and done.tolist() == [True, False, True, False, False, False]
    column = np.zeros((3, 8, 12, 3), np.uint8)
    decode_images_into([sub, mixed_filters, sub], column)
    np.testing.assert_array_equal(column, images[[0, 1, 0]])
    assert decode_sub_pngs(blobs, np.zeros((6, 8, 12, 3), np.uint16)) is None  # 16-bit: libpng's


@pytest.mark.parametrize("damage", ["crc", "stream", "truncated"])
def test_a_damaged_png_goes_to_libpng_and_raises_its_error_naming_the_row(damage: str) -> None:
    image = np.random.default_rng(1).integers(0, 256, (8, 12, 3), dtype=np.uint8)
    good = _png(image, b"\x01" * 8)
    start = good.index(b"IDAT") + 4
    if damage == "crc":  # a flipped bit in the IDAT data: its CRC no longer matches
        bad = good[:start + 5] + bytes([good[start + 5] ^ 1]) + good[start + 6:]
    elif damage == "stream":  # CRC made right again: libdeflate's Adler-32 (or the stream) refuses it
        length = struct.unpack(">I", good[start - 8:start - 4])[0]
        data = bytearray(good[start:start + length])
        data[len(data) // 2] ^= 0xFF
        bad = good[:start] + bytes(data) + struct.pack(">I", zlib.crc32(b"IDAT" + bytes(data))) + \
            good[start + length + 4:]
    else:
        bad = good[:len(good) // 2]
    column = np.zeros((2, 8, 12, 3), np.uint8)
    done = decode_sub_pngs([good, bad], column)
    assert done is not None and done.tolist() == [True, False]
    with pytest.raises(ImageDecodeError) as info:
        decode_images_into([good, bad], column)
    assert info.value.row == 1


def test_a_column_led_by_another_encoders_png_goes_to_libpng_without_inflating_it_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (5, 8, 12, 3), dtype=np.uint8)
    adaptive = [_png(image, b"\x00\x01" * 4) for image in images]  # rows not all SUB: Pillow-like filters
    inflated: list[int] = []
    real = imagecodecs.deflate_decode

    def counting(data: bytes, out: np.ndarray) -> bytes:
        inflated.append(len(data))
        return real(data, out=out)

    monkeypatch.setattr(imagecodecs, "deflate_decode", counting)
    column = np.zeros((5, 8, 12, 3), np.uint8)
    assert decode_sub_pngs(adaptive + [encode_image(images[0], "png")], np.zeros((6, 8, 12, 3), np.uint8)) is None
    assert len(inflated) == 1  # the first image only: the column is libpng's
    decode_images_into(adaptive, column)
    np.testing.assert_array_equal(column, images)
