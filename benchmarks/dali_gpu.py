"""JPEG decode throughput: the DALI bridge (``device='mixed'``, nvJPEG) vs unihub's CPU decode.

Writes ``--count`` random-content 256x256 JPEGs with ``write_dataset`` into a temp dir,
then times one full pass of each decoder over the same dataset and prints a markdown table
of images/s. unihub's side reads the raw bytes once and decodes them with
``unihub.images.decoders.decode_image`` in a thread pool of one thread per core; DALI's
side is ``make_dali_pipeline`` (reading included). Without a GPU the DALI CPU decoder is
timed instead and the GPU row says it was skipped.

    python benchmarks/dali_gpu.py [--count 5000] [--batch-size 128] [--device-id 0]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa

from unihub import CompressedImageCodec, ScalarCodec, Unischema, UnischemaField, write_dataset
from unihub.images.decoders import decode_image
from unihub.readers.random_access import Dataset


def write_jpegs(path: Path, count: int, size: int = 256) -> Path:
    """``count`` smooth-plus-noise RGB images (JPEG-like content), quality from the codec's default."""
    schema = Unischema("Jpeg", [
        UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("image", np.uint8, (size, size, 3), CompressedImageCodec("jpeg"), False),
    ])
    y, x = np.mgrid[0:size, 0:size]

    def rows():
        for i in range(count):
            base = np.stack([(x + i) % 256, (y + 3 * i) % 256, ((x + y) // 2 + 7 * i) % 256], axis=-1)
            noise = np.random.default_rng(i).integers(0, 24, (size, size, 3))
            yield {"id": i, "image": np.clip(base + noise, 0, 255).astype(np.uint8)}

    write_dataset(path, schema, rows())
    return path


def time_unihub_cpu(url: Path, threads: int) -> tuple[int, float]:
    """Images and seconds to decode every image with ``decode_image`` on ``threads`` threads."""
    ds = Dataset(url, ["image"], decode_images=False)
    blobs = list(ds.take(np.arange(len(ds))).image)  # read outside the timing: this is decode only
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(decode_image, blobs, chunksize=64):
            pass
    return len(blobs), time.perf_counter() - start


def time_dali(url: Path, batch_size: int, device_id: int | None, threads: int) -> tuple[int, float]:
    """Images and seconds for one epoch of the bridge's pipeline (reading + decode), after a warm-up epoch."""
    from unihub.bridges.dali import iterate_epoch, make_dali_pipeline

    pipe = make_dali_pipeline(url, batch_size, device_id=device_id, num_threads=threads, last_batch="partial")
    try:
        for _ in iterate_epoch(pipe):  # warm-up: allocations, nvJPEG handles
            pass
        start, n = time.perf_counter(), 0
        while True:
            try:
                (images,) = pipe.run()
            except StopIteration:
                pipe.reset()
                break
            n += len(images)
        if device_id is not None:
            images.as_cpu()  # wait for the GPU work of the last batch
        return n, time.perf_counter() - start
    finally:
        pipe.source.close()


def gpu_available() -> bool:
    try:
        from nvidia.dali.backend import GetCUDADeviceCount

        return GetCUDADeviceCount() > 0
    except Exception:  # no driver, no libcuda: no GPU
        return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=5000, help="JPEGs to write (default 5000)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads (default: cores)")
    parser.add_argument("--device-id", type=int, default=0)
    args = parser.parse_args(argv)
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        url = write_jpegs(Path(tmp) / "jpeg", args.count)
        n, s = time_unihub_cpu(url, args.threads)
        rows.append((f"unihub decode_image, {args.threads} threads (CPU)", f"{n / s:,.0f}"))
        n, s = time_dali(url, args.batch_size, None, args.threads)
        rows.append((f"DALI bridge, device='cpu', {args.threads} threads", f"{n / s:,.0f}"))
        if gpu_available():
            n, s = time_dali(url, args.batch_size, args.device_id, args.threads)
            rows.append((f"DALI bridge, device='mixed' (GPU {args.device_id})", f"{n / s:,.0f}"))
        else:
            rows.append(("DALI bridge, device='mixed' (GPU)", "skipped: no GPU"))
    print(f"{args.count} JPEGs of 256x256, batch {args.batch_size}\n")
    print("| decoder | images/s |\n|---|---:|")
    for name, rate in rows:
        print(f"| {name} | {rate} |")


if __name__ == "__main__":
    main()
