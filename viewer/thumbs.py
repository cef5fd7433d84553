"""Decoded images -> small thumbnails as ``data:`` URIs, so a report opens without any file beside it.

Gray, gray+alpha, RGB and RGBA, 8- or 16-bit (16-bit is shown with its top 8 bits) are shrunk by
averaging whole blocks of pixels until the longer side is at most ``max_side``, then embedded as JPEG
(RGB and gray: small) or PNG (with alpha: JPEG has none).
"""

from __future__ import annotations

import base64
import math

import numpy as np

from unihub.images import decoders as images

#: the longer side of a thumbnail, in pixels
MAX_SIDE = 128


def thumbnail(image: np.ndarray, *, max_side: int = MAX_SIDE) -> np.ndarray:
    """``image`` as uint8 ``(H, W)`` or ``(H, W, C)``, its longer side at most ``max_side``."""
    array = np.asarray(image)
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim not in (2, 3) or array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"not an image: shape {array.shape}")
    if array.dtype == np.uint16:
        array = (array >> 8).astype(np.uint8)
    elif array.dtype != np.uint8:
        raise ValueError(f"not an 8- or 16-bit image: dtype {array.dtype}")
    step = math.ceil(max(array.shape[:2]) / max_side)
    if step > 1:  # the mean of each step x step block; the last partial blocks are padded with edge pixels
        height, width = math.ceil(array.shape[0] / step) * step, math.ceil(array.shape[1] / step) * step
        pad = [(0, height - array.shape[0]), (0, width - array.shape[1])] + [(0, 0)] * (array.ndim - 2)
        padded = np.pad(array, pad, mode="edge").astype(np.uint32)
        blocks = padded.reshape(height // step, step, width // step, step, *array.shape[2:])
        array = ((blocks.sum(axis=(1, 3)) + step * step // 2) // (step * step)).astype(np.uint8)
    return np.ascontiguousarray(array)


def data_uri(image: np.ndarray, *, max_side: int = MAX_SIDE) -> str:
    """A ``data:image/...;base64,`` URI of ``image``'s thumbnail."""
    small = thumbnail(image, max_side=max_side)
    with_alpha = small.ndim == 3 and small.shape[2] in (2, 4)
    fmt = "png" if with_alpha else "jpeg"
    encoded = images.encode_image(small, fmt, quality=85)
    return f"data:image/{fmt};base64,{base64.b64encode(encoded).decode('ascii')}"
