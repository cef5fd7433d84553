"""The datasets the report's tests look at: images written by PIL (RGB, RGBA, 16-bit gray, a JPEG photo
that needs shrinking), tensors with ``None`` dims, nulls; and reading the report's sample grid back."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from unihub import CompressedImageCodec, ScalarCodec, TensorCodec, Unischema, UnischemaField, write_dataset

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm"
N = 40

SCHEMA = Unischema("Images", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("label", np.int32, (), ScalarCodec(pa.int32()), False),
    UnischemaField("score", np.float32, (), ScalarCodec(pa.float32()), True),
    UnischemaField("rgb", np.uint8, (24, 32, 3), CompressedImageCodec("png"), False),
    UnischemaField("rgba", np.uint8, (24, 32, 4), CompressedImageCodec("png"), False),
    UnischemaField("gray16", np.uint16, (None, None), CompressedImageCodec("png"), False),
    UnischemaField("photo", np.uint8, (300, 200, 3), CompressedImageCodec("jpeg"), True),
    UnischemaField("boxes", np.float32, (None, 4), TensorCodec(), False),
])


def pil(array: np.ndarray, fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def pixels(i: int) -> dict[str, np.ndarray]:
    """Row ``i``'s images: smooth gradients (JPEG keeps them close), each a function of ``i``."""
    y, x = np.mgrid[0:24, 0:32]
    rgb = np.stack([x * 8, y * 10, np.full_like(x, i * 6)], axis=-1).astype(np.uint8)
    rgba = np.concatenate([rgb, np.full((24, 32, 1), 40 + i, np.uint8)], axis=-1)
    gray16 = ((x[: 10 + i % 5] * 2000 + i * 100) % 65536).astype(np.uint16)
    py, px = np.mgrid[0:300, 0:200]
    photo = np.stack([px, py * 0.8, np.full_like(px, i * 6)], axis=-1).astype(np.uint8)
    return {"rgb": rgb, "rgba": rgba, "gray16": gray16, "photo": photo}


def image_row(i: int) -> dict[str, Any]:
    images = pixels(i)
    return {"id": i, "label": i % 4, "score": None if i % 5 == 0 else i / 8,
            "rgb": pil(images["rgb"], "PNG"), "rgba": pil(images["rgba"], "PNG"),
            "gray16": pil(images["gray16"], "PNG"), "photo": None if i == 7 else pil(images["photo"], "JPEG"),
            "boxes": np.full((i % 3, 4), i, np.float32)}


@pytest.fixture(scope="session")
def images_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("show") / "images"
    write_dataset(path, SCHEMA, (image_row(i) for i in range(N)), rows_per_file=10)
    return path


def cards(page: str) -> dict[int, list[tuple[str, bytes]]]:
    """Row index -> its thumbnails as (format, bytes), from the page's sample grid."""
    found = {}
    for card in page.split('<div class="card">')[1:]:
        row = int(re.search(r"<dt>row</dt><dd>(\d+)</dd>", card).group(1))
        found[row] = [(fmt, base64.b64decode(data)) for fmt, data in
                      re.findall(r'<img class="thumb" src="data:image/(png|jpeg);base64,([^"]+)"', card)]
    return found


def decoded(blob: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(blob)))


