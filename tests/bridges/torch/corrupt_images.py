"""A dataset whose images do not all decode, for the loaders' on_decode_error='skip' tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from unihub import CompressedImageCodec, ScalarCodec, Unischema, UnischemaField, write_dataset

#: the rows whose PNGs are cut short
BAD_ROWS = (5, 11, 12)


def corrupt_images(directory: Path) -> tuple[str, list[int]]:
    """A dataset of 20 rows whose PNGs 5, 11 and 12 are cut short (they still start as PNGs, so the writer
    stores them), in row groups of a few rows: its URL and the ids of the good rows."""
    schema = Unischema("Corrupt", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                   UnischemaField("image", np.uint8, (4, 5, 3), CompressedImageCodec("png"), False)])
    rng = np.random.default_rng(0)
    blobs = [CompressedImageCodec("png").encode(schema.image, rng.integers(0, 256, (4, 5, 3), dtype=np.uint8))
             for _ in range(20)]
    for bad in BAD_ROWS:
        blobs[bad] = blobs[bad][:40]
    write_dataset(directory / "ds", schema, [{"id": i, "image": b} for i, b in enumerate(blobs)],
                  row_group_size_mb=0.0003)
    return (directory / "ds").as_uri(), sorted(set(range(20)) - set(BAD_ROWS))
