"""Reading a dataset grown by many appends against the same rows written at once (issue 42).

Two datasets of the same rows (``id``, a float32[16] tensor, 256 bytes of payload): one written by one
``write_dataset``, one by ``--appends`` appends (``mode="append"``, one version each). Each round reads every
row of each with ``make_batch_reader`` (unshuffled) in this process, the two alternating, and measures the CPU
time (user + system, this process and its threads) and the wall time; min / median / max of the rounds and the
ratio appended/once of the medians are printed::

    python benchmarks/growing.py --rows 200000 --appends 100 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from unihub import ScalarCodec, TensorCodec, Unischema, UnischemaField, make_batch_reader, write_dataset

SCHEMA = Unischema("Grown", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                             UnischemaField("vec", np.float32, (16,), TensorCodec(), False),
                             UnischemaField("payload", np.bytes_, (), ScalarCodec(pa.binary()), False)])


def columns(first: int, count: int) -> dict[str, object]:
    ids = np.arange(first, first + count, dtype=np.int64)
    return {"id": ids, "vec": np.repeat(ids[:, None], 16, axis=1).astype(np.float32),
            "payload": [bytes([i % 251]) * 256 for i in range(first, first + count)]}


def build(root: Path, rows: int, appends: int) -> tuple[str, str]:
    once, grown = str(root / "once"), str(root / "grown")
    write_dataset(once, SCHEMA, columns(0, rows), batched=True)
    step = rows // appends
    for k in range(appends):
        write_dataset(grown, SCHEMA, columns(k * step, step), batched=True, mode="append")
    return once, grown


def read_all(url: str) -> tuple[float, float, int]:
    start_cpu, start_wall = os.times(), time.perf_counter()
    count = 0
    with make_batch_reader(url, shuffle_row_groups=False) as reader:
        for batch in reader:
            count += len(batch.id)
    end_cpu = os.times()
    cpu = (end_cpu.user - start_cpu.user) + (end_cpu.system - start_cpu.system)
    return cpu, time.perf_counter() - start_wall, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--appends", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        once, grown = build(Path(tmp), args.rows, args.appends)
        results: dict[str, list[tuple[float, float]]] = {"once": [], "grown": []}
        for round_ in range(args.rounds):
            for name in (("once", "grown") if round_ % 2 == 0 else ("grown", "once")):
                cpu, wall, count = read_all(once if name == "once" else grown)
                assert count == args.rows, count
                results[name].append((cpu, wall))
        for name, runs in results.items():
            cpus, walls = [c for c, _ in runs], [w for _, w in runs]
            print(f"{name:>5}: CPU s min {min(cpus):.3f} median {statistics.median(cpus):.3f} max {max(cpus):.3f}; "
                  f"wall s min {min(walls):.3f} median {statistics.median(walls):.3f} max {max(walls):.3f}")
        ratio_cpu = statistics.median(c for c, _ in results["grown"]) / statistics.median(c for c, _ in results["once"])
        ratio_wall = statistics.median(w for _, w in results["grown"]) / statistics.median(w for _, w in results["once"])
        print(f"grown/once medians: CPU {ratio_cpu:.2f}x, wall {ratio_wall:.2f}x "
              f"({args.appends} appends of {args.rows // args.appends} rows)")


if __name__ == "__main__":
    main()
