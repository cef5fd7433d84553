"""A small generated dataset with images, tensors and scalars: the README's main job.

Used by ``unihub demo`` and by the benchmarks; the images are smooth gradients with a
little noise, so PNG and JPEG sizes are realistic rather than those of pure noise.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from unihub.schema.codecs import CompressedImageCodec, ScalarCodec, TensorCodec
from unihub.schema.unischema import Unischema, UnischemaField
from unihub.store.writer import WriteResult, write_dataset

DemoSchema = Unischema("DemoSchema", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("image", np.uint8, (64, 64, 3), CompressedImageCodec("png"), False),
    UnischemaField("label", np.int32, (), ScalarCodec(pa.int32()), False),
    UnischemaField("caption", np.str_, (), ScalarCodec(pa.string()), True),
    UnischemaField("embedding", np.float32, (128,), TensorCodec(), False),
    UnischemaField("boxes", np.float32, (None, 4), TensorCodec(), False),
])


def make_image(rng: np.random.Generator, height: int = 64, width: int = 64, channels: int = 3) -> np.ndarray:
    """A smooth random gradient with mild noise, uint8 (H, W, C) or (H, W) when channels == 1."""
    ys = np.linspace(0, 1, height, dtype=np.float32)[:, None, None]
    xs = np.linspace(0, 1, width, dtype=np.float32)[None, :, None]
    a, b, c = rng.random((3, 1, 1, channels), dtype=np.float32)
    image = 255 * (a * ys + b * xs + c * ys * xs) / np.maximum(a + b + c, 1e-3)
    image += rng.normal(0, 6, size=(height, width, channels)).astype(np.float32)
    out = np.clip(image, 0, 255).astype(np.uint8)
    return out[:, :, 0] if channels == 1 else out


def demo_rows(rows: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Rows of :data:`DemoSchema`, deterministic for a seed."""
    rng = np.random.default_rng(seed)
    for i in range(rows):
        yield {
            "id": i,
            "image": make_image(rng),
            "label": np.int32(i % 10),
            "caption": None if i % 7 == 0 else f"sample {i}",
            "embedding": rng.standard_normal(128, dtype=np.float32),
            "boxes": rng.random((i % 4, 4), dtype=np.float32),
        }


def write_demo_dataset(url: str, *, rows: int = 2000, overwrite: bool = False) -> WriteResult:
    """Write :func:`demo_rows` to ``url`` with :func:`write_dataset`."""
    return write_dataset(url, DemoSchema, demo_rows(rows), row_group_size_mb=8, overwrite=overwrite)
