"""A column of plain 8-bit PNGs whose rows all use the SUB filter, decoded without libpng.

OpenCV (so Petastorm's CompressedImageCodec('png')) and :func:`~unihub.images.decoders.encode_image`
write every row with the SUB filter. Such an image is undone in two steps that are faster apart
than libpng's row-by-row loop: libdeflate inflates the IDAT stream (1.6x zlib 1.2.13, which
imagecodecs' libpng is linked with), and the SUB filter, a running sum of each channel along the
row modulo 256, is undone for many images at once by log2(width) shifted numpy adds. On 64x64x3
images with noise (Petastorm's reference dataset) that is 55-60 us an image against libpng's
~92 us (CPU time, one thread; ``benchmarks/reader.py``).

Anything else is left to libpng (the caller's path): other colour types or bit depths, interlace,
palettes and ``tRNS``, ancillary chunks that may change pixels, other filters, a CRC or Adler-32
that does not match, a stream of the wrong length. So the pixels are libpng's, bit for bit, and
every error keeps libpng's message.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: channels of the column -> PNG colour type (gray, gray + alpha, RGB, RGBA)
_COLOUR = {1: 0, 2: 4, 3: 2, 4: 6}
#: ancillary chunks libpng reads without changing the pixels it returns (no transforms are asked for)
_HARMLESS = frozenset({b"pHYs", b"sRGB", b"gAMA", b"cHRM", b"iCCP", b"tEXt", b"zTXt", b"iTXt", b"tIME"})
_SUB = 1
#: rows inflated at a time: their staging buffer is bounded to about this many bytes
_CHUNK_BYTES = 4 << 20


def _idat(blob: Any, ihdr: bytes) -> bytes | None:
    """The concatenated IDAT data of ``blob`` when its IHDR is ``ihdr`` and it holds only IDAT, IEND
    and harmless chunks, every CRC right; else None."""
    view = memoryview(blob)
    if bytes(view[:8]) != _SIGNATURE or bytes(view[8:33]) != ihdr:
        return None
    parts: list[memoryview] = []
    pos, end, crc32 = 33, len(view), zlib.crc32
    while pos + 12 <= end:
        length, kind = struct.unpack_from(">I4s", view, pos)
        stop = pos + 12 + length
        if stop > end:
            return None
        if kind == b"IEND":
            return b"".join(parts) if parts else None
        if kind == b"IDAT":
            if crc32(view[pos + 4:stop - 4]) != struct.unpack_from(">I", view, stop - 4)[0]:
                return None
            parts.append(view[pos + 8:stop - 4])
        elif kind not in _HARMLESS or parts:  # no ancillary chunk between or after IDATs either
            return None
        pos = stop
    return None


def _inflated_sub(blob: Any, ihdr: bytes, staging: np.ndarray, inflate: Any) -> bool:
    """Whether ``blob`` is a plain PNG with header ``ihdr`` whose IDAT stream inflated into ``staging``
    (``(H, 1 + W * C)``) fills it exactly with every row SUB-filtered."""
    data = _idat(blob, ihdr)
    if data is None:
        return False
    try:
        got = inflate(data, out=staging.reshape(-1))
    except Exception:  # noqa: BLE001 - corrupt: libpng raises with its message
        return False
    return len(got) == staging.size and bool((staging[:, 0] == _SUB).all())


def _undo_sub(rows: np.ndarray, channels: int) -> None:
    """Undo the SUB filter of ``(n, H, W * C)`` uint8 image rows in place (each row's last axis
    contiguous): a running sum of each channel along the row, by log2(W) shifted adds. The adds
    overlap their output; numpy computes them as if the input had been copied first."""
    width, shift = rows.shape[2], channels
    while shift < width:
        np.add(rows[:, :, shift:], rows[:, :, :-shift], out=rows[:, :, shift:])
        shift *= 2


def decode_sub_pngs(blobs: Sequence[Any], out: np.ndarray) -> np.ndarray | None:
    """Decode each of ``blobs`` that is a plain SUB-filtered 8-bit PNG of ``out``'s row shape into its
    row of ``out`` (a C-contiguous uint8 ``(n, H, W)`` or ``(n, H, W, C)`` array); the mask of the rows
    done, or None when the column's shape or type rules the path out."""
    if out.dtype != np.uint8 or not out.flags.c_contiguous or out.ndim not in (3, 4) or not len(blobs):
        return None
    n, height, width = out.shape[:3]
    channels = out.shape[3] if out.ndim == 4 else 1
    if channels not in _COLOUR or height == 0 or width == 0:
        return None
    import imagecodecs

    head = struct.pack(">I4sIIBBBBB", 13, b"IHDR", width, height, 8, _COLOUR[channels], 0, 0, 0)
    ihdr = head + struct.pack(">I", zlib.crc32(head[4:]))
    stride = width * channels + 1
    pixels_out = out.reshape(n, height, width, channels)
    done = np.zeros(n, bool)
    step = max(1, _CHUNK_BYTES // (height * stride))
    staging = np.empty((min(step, n), height, stride), np.uint8)
    for first in range(0, n, step):
        rows = range(first, min(n, first + step))
        ok = np.zeros(len(rows), bool)
        for i, row in enumerate(rows):
            ok[i] = _inflated_sub(blobs[row], ihdr, staging[i], imagecodecs.deflate_decode)
            if row == 0 and not ok[0]:
                # another encoder's column (Pillow's adaptive filters, say): all of it to libpng, rather
                # than inflating every image twice (here, then in libpng)
                return None
        if ok.all():
            rows_done = staging[:len(rows), :, 1:]  # a view: the filter bytes left out
            _undo_sub(rows_done, channels)
            pixels_out[first:first + len(rows)] = rows_done.reshape(len(rows), height, width, channels)
            done[first:first + len(rows)] = True
        elif ok.any():
            sel = np.flatnonzero(ok)
            rows_done = staging[sel, :, 1:]  # a copy (fancy index)
            _undo_sub(rows_done, channels)
            pixels_out[first + sel] = rows_done.reshape(len(sel), height, width, channels)
            done[first + sel] = True
    return done
