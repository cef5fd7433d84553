"""A slow tf.data pipeline read directly vs through ``unihub.cacheable`` (issue 14).

    python benchmarks/cacheable.py [--rows 20000] [--epochs 3] [--repeat 3] [--offset 15000]

The pipeline decodes and resizes JPEG files (128x128 -> 64x64, one call at a time: the kind of
loader that has no random access). ``direct`` reads it ``--epochs`` times; ``cached`` builds the
cache once (first epoch = the build plus one read) and then reads ``make_tf_dataset(stream)``.
``offset`` compares the time to the first batch from row ``--offset``: ``tf.data``'s
``skip(N)`` (which decodes the N rows before) vs ``stream(start_offset=N)`` (the reader's plan).
Runs alternate direct/cached and repeat ``--repeat`` times; the table shows min / median / max
seconds. Images are made with ``make_reference_data._make_image`` (smooth gradients + noise).
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

BATCH = 64


def write_jpegs(folder: Path, rows: int) -> list[str]:
    """``rows`` 128x128 JPEG files (quality 90) in ``folder``."""
    import numpy as np
    from make_reference_data import _make_image
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for i in range(rows):
        out = io.BytesIO()
        Image.fromarray(_make_image(rng, 128, 128)).save(out, format="JPEG", quality=90)
        path = folder / f"{i:06d}.jpg"
        path.write_bytes(out.getvalue())
        paths.append(str(path))
    return paths


def slow_pipeline(paths: list[str]) -> Any:
    """read -> decode_jpeg -> resize, sequentially: the loader being cached."""
    import tensorflow as tf

    def load(path: Any, label: Any) -> dict[str, Any]:
        image = tf.image.decode_jpeg(tf.io.read_file(path), channels=3)
        image = tf.cast(tf.image.resize(image, (64, 64)), tf.uint8)
        return {"image": tf.ensure_shape(image, (64, 64, 3)), "label": label}

    labels = [i % 10 for i in range(len(paths))]
    return tf.data.Dataset.from_tensor_slices((paths, labels)).map(load, num_parallel_calls=1)


def _epoch(dataset: Any) -> int:
    rows = 0
    for batch in dataset:
        rows += int(batch["label"].shape[0])
    return rows


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def one_run(paths: list[str], cache_root: str, *, epochs: int, offset: int, run: int) -> dict[str, list[float]]:
    from unihub import cacheable, make_tf_dataset

    times: dict[str, list[float]] = {}

    def direct_phase() -> None:
        direct = slow_pipeline(paths).batch(BATCH)
        times["direct"] = [_timed(lambda: _epoch(direct)) for _ in range(epochs)]
        times["skip"] = [_timed(lambda: next(iter(slow_pipeline(paths).skip(offset).batch(BATCH))))]

    def cached_phase() -> None:
        make = cacheable(cache_root, dataset_id="bench", version=str(run))(lambda: slow_pipeline(paths))
        build = _timed(make)
        cached = make()

        def read() -> None:
            assert _epoch(make_tf_dataset(cached.stream(shuffle=True, seed=run), batch_size=BATCH)) == len(paths)

        times["cached"] = [build + _timed(read)] + [_timed(read) for _ in range(epochs - 1)]
        times["build"] = [build]
        times["start_offset"] = [_timed(lambda: next(iter(make_tf_dataset(cached.stream(offset), batch_size=BATCH))))]

    for phase in (direct_phase, cached_phase) if run % 2 == 0 else (cached_phase, direct_phase):  # alternate
        phase()
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--offset", type=int, default=15_000)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    work = Path(tempfile.mkdtemp(prefix="unihub-bench-cacheable-"))
    try:
        (work / "jpegs").mkdir()
        paths = write_jpegs(work / "jpegs", args.rows)
        runs = [one_run(paths, str(work / "cache"), epochs=args.epochs, offset=min(args.offset, args.rows - 1), run=r)
                for r in range(args.repeat)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.rows:,} JPEGs (128x128 -> 64x64), batch {BATCH}, {args.repeat} runs; seconds min / median / max\n")
    print("| | " + " | ".join(f"epoch {e + 1}" for e in range(args.epochs)) + " |")
    print("|---" * (args.epochs + 1) + "|")
    for name in ("direct", "cached"):
        cells = []
        for e in range(args.epochs):
            values = [r[name][e] for r in runs]
            cells.append(f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    speedups = [statistics.median([r["direct"][e] / r["cached"][e] for r in runs]) for e in range(args.epochs)]
    print("| speed-up (median) | " + " | ".join(f"{s:.1f}x" for s in speedups) + " |")
    build = sorted(r["build"][0] for r in runs)
    print(f"\nbuild alone: {build[0]:.2f} / {statistics.median(build):.2f} / {build[-1]:.2f} s")
    for name, label in (("skip", f"tf.data skip({args.offset}) + first batch"),
                        ("start_offset", f"stream(start_offset={args.offset}) + first batch")):
        values = sorted(r[name][0] for r in runs)
        print(f"{label}: {values[0]:.3f} / {statistics.median(values):.3f} / {values[-1]:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
