"""Write throughput of ``write_dataset``: 64x64 PNG images + float32 (128,) tensors.

Two inputs, as users have them: images already encoded as PNG bytes (stored as given, no
re-encode), and raw uint8 arrays that unihub encodes to PNG. Reports rows/s and MB/s of
files written.

    python benchmarks/write_throughput.py [--rows 20000]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import pyarrow as pa

from unihub import CompressedImageCodec, ScalarCodec, TensorCodec, Unischema, UnischemaField, write_dataset
from unihub.cli.demo import make_image
from unihub.images.decoders import encode_image

Schema = Unischema("WriteBench", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("image", np.uint8, (64, 64, 3), CompressedImageCodec("png"), False),
    UnischemaField("embedding", np.float32, (128,), TensorCodec(), False),
])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    images = [make_image(rng) for _ in range(min(args.rows, 1000))]
    encoded = [encode_image(img, "png") for img in images]
    embeddings = rng.standard_normal((args.rows, 128), dtype=np.float32)

    print(f"write_dataset, {args.rows:,} rows of id + 64x64x3 PNG + float32 (128,)\n")
    print("| input | rows/s | MB/s written | dataset MB |")
    print("|---|---|---|---|")
    for label, pool in (("PNG bytes (stored as given)", encoded), ("uint8 arrays (encoded to PNG)", images)):
        rows = ({"id": i, "image": pool[i % len(pool)], "embedding": embeddings[i]} for i in range(args.rows))
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            result = write_dataset(f"{tmp}/ds", Schema, rows)
            seconds = time.perf_counter() - start
        mb = result.bytes_written / 2**20
        print(f"| {label} | {args.rows / seconds:,.0f} | {mb / seconds:,.1f} | {mb:,.1f} |")


if __name__ == "__main__":
    main()
