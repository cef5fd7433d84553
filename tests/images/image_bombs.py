"""Hostile and broken images for tests, made from real files that Pillow writes.

- :func:`jpeg_bomb`: a small JPEG whose SOF0 header is patched to claim 65000 x 65000 pixels
  (631 bytes; a decoder allocates 11.8 GiB for it before it finds the data missing);
- :func:`png_bomb`: a small PNG whose IHDR claims 200000 x 200000 pixels, its CRC recomputed;
- :func:`truncated`: an image cut short (a partial download: no end marker);
- :func:`corrupt_scan`: a JPEG whose header and end marker are intact but whose entropy-coded
  data is zeroed in the middle (bit rot): only a decode finds it.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image


def image(height: int = 16, width: int = 16, seed: int = 0) -> np.ndarray:
    """A noisy RGB image (every pixel differs, so the encoded data is not trivial)."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def pil_jpeg(array: np.ndarray, quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def pil_png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "PNG")
    return buffer.getvalue()


def jpeg_bomb(width: int = 65000, height: int = 65000) -> bytes:
    """A real 8x8 baseline JPEG with its SOF0 frame header patched to ``width`` x ``height``."""
    data = bytearray(pil_jpeg(np.zeros((8, 8, 3), np.uint8)))
    sof = data.find(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


def png_bomb(width: int = 200_000, height: int = 200_000) -> bytes:
    """A real 8x8 RGB PNG with its IHDR patched to ``width`` x ``height`` and the chunk's CRC recomputed."""
    data = bytearray(pil_png(np.zeros((8, 8, 3), np.uint8)))
    struct.pack_into(">II", data, 16, width, height)
    struct.pack_into(">I", data, 29, zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def truncated(data: bytes) -> bytes:
    """The first two thirds of an image file."""
    return data[:len(data) * 2 // 3]


def corrupt_scan(data: bytes) -> bytes:
    """A JPEG with 40 bytes in the middle of its entropy-coded data zeroed: header and EOI intact."""
    sos = data.find(b"\xff\xda")
    middle = (sos + len(data)) // 2
    return data[:middle] + bytes(40) + data[middle + 40:]
