"""What page checksums cost: reads and writes with CRC-32 verification on and off, alternating.

Four datasets written into a temporary directory: 1M rows of scalars (id, float, short string),
TensorCodec arrays of 4 KiB, ragged TensorCodec arrays (lists: the value-count check runs on them)
and 256 KiB random blobs standing in for compressed images (the worst case: the CRC runs over every
byte and nothing else is done with them). Each read runs over every row group through
``ParquetStore.read_row_group`` (the Arrow level, where the checks are) and, for the arrays, through
``make_batch_reader``. The clock runs over a reader's second epoch, under ``UNIHUB_PAGE_CHECKSUMS``
"off" (no CRC verification, no value-count check), "always" (every read checked: also what the
first epoch costs under the default) and "once" (the default: the first epoch checked, later ones
not). The three alternate ``--repeats`` times; the best and median of each are reported in MB/s of
file bytes. Writes: CRCs written or not.

    python benchmarks/page_checksums.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa

from unihub import ScalarCodec, TensorCodec, Unischema, UnischemaField, make_batch_reader, open_dataset, write_dataset
from unihub.store import integrity

SCHEMAS = {
    "scalars": Unischema("Scalars", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                     UnischemaField("x", np.float32, (), ScalarCodec(pa.float32()), False),
                                     UnischemaField("s", np.str_, (), ScalarCodec(pa.string()), False)]),
    "arrays": Unischema("Arrays", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                   UnischemaField("a", np.float32, (32, 32), TensorCodec(), False)]),
    "ragged": Unischema("Ragged", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                   UnischemaField("r", np.float32, (None, 16), TensorCodec(), False)]),
    "blobs": Unischema("Blobs", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                 UnischemaField("blob", np.bytes_, (), ScalarCodec(pa.binary()), False)]),
}


def columns(name: str) -> dict[str, object]:
    rng = np.random.default_rng(0)
    if name == "scalars":
        n = 1_000_000
        return {"id": np.arange(n), "x": rng.random(n, dtype=np.float32), "s": [f"r{i % 1000}" for i in range(n)]}
    if name == "arrays":
        n = 50_000
        return {"id": np.arange(n), "a": rng.random((n, 32, 32), dtype=np.float32)}
    if name == "ragged":
        n = 50_000
        return {"id": np.arange(n), "r": [rng.random((i % 64, 16), dtype=np.float32) for i in range(n)]}
    n = 800
    return {"id": np.arange(n), "blob": [rng.bytes(256 * 1024) for _ in range(n)]}


def store_epoch(path: Path) -> float:
    """Seconds of the second epoch over a store's row groups."""
    store = open_dataset(path)
    start = 0.0
    for _epoch in range(2):
        start = time.perf_counter()
        for info in store.row_groups:
            store.read_row_group(info.index)
    return time.perf_counter() - start


def batch_epoch(path: Path) -> float:
    """Seconds of make_batch_reader's second epoch (from the last batch of the first)."""
    rows = open_dataset(path).num_rows
    seen, start = 0, 0.0
    with make_batch_reader(str(path), shuffle_row_groups=False, workers_count=2, num_epochs=2) as reader:
        for batch in reader:
            seen += len(batch[0])
            if seen == rows:
                start = time.perf_counter()
    return time.perf_counter() - start


def alternate(run: Callable[[], float], repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"off": [], "always": [], "once": []}
    run()  # page cache warm
    for _ in range(repeats):
        for mode in times:
            os.environ[integrity.VERIFY_ENV] = mode
            times[mode].append(run())
    os.environ.pop(integrity.VERIFY_ENV)
    return times


def write_times(root: Path, name: str, repeats: int) -> dict[str, list[float]]:
    data = columns(name)
    times: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(repeats):
        for label, on in (("off", False), ("on", True)):  # CRCs written or not
            integrity.WRITE_OPTIONS["write_page_checksum"] = on
            start = time.perf_counter()
            write_dataset(root / f"{name}-w", SCHEMAS[name], data, batched=True, overwrite=True)
            times[label].append(time.perf_counter() - start)
    integrity.WRITE_OPTIONS["write_page_checksum"] = True
    return times


def summary(times: dict[str, list[float]], size: int) -> dict[str, object]:
    """MB/s (best, median) per mode, and each mode's median rate relative to "off"."""
    off = statistics.median(times["off"])
    return {label: [round(size / min(v) / 1e6), round(size / statistics.median(v) / 1e6),
                    f"x{off / statistics.median(v):.2f}"] for label, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in SCHEMAS:
            path = root / name
            write_dataset(path, SCHEMAS[name], columns(name), batched=True)
            size = sum(f.stat().st_size for f in path.glob("*.parquet"))
            results[f"read {name} (store)"] = summary(alternate(partial(store_epoch, path), args.repeats), size)
            if name == "arrays":
                results[f"read {name} (make_batch_reader)"] = summary(
                    alternate(partial(batch_epoch, path), args.repeats), size)
            results[f"write {name}"] = summary(write_times(root, name, args.repeats), size)
    print("MB/s of file bytes: [best, median, median relative to off]")
    for name, result in results.items():
        print(f"{name:32} {json.dumps(result)}")


if __name__ == "__main__":
    main()
