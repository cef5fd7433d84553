"""Reading a dataset grown by many appends and added columns against the same rows written at once (issue 42).

Two datasets of the same rows (``id``, a float32[16] tensor, 256 bytes of payload, and ``--columns`` more
fields: a label, a float32[8] embedding, a train/val split): one written by one ``write_dataset`` with every
field, one by ``--appends`` appends (``mode="append"``, one version each) of the first three fields, then the
``--columns`` fields added to every row as column sets (``add_column``: side files, joined on read, the parts
not rewritten); and a copy of that grown dataset compacted (``compact_dataset``: its 100 parts and their side
files joined into parts of up to 64 MB, as a version of its own). Each round reads every row of each with
``make_batch_reader`` (unshuffled) in this process, the three alternating (the order reversed every other round),
and measures the CPU time (user + system, this process and its threads) and the wall time; min / median / max of
the rounds and the ratios to the dataset written at once of the medians are printed::

    python benchmarks/growing.py --rows 1000000 --appends 100 --columns 3 --rounds 9
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from unihub import (
    ScalarCodec,
    TensorCodec,
    Unischema,
    UnischemaField,
    add_column,
    compact_dataset,
    make_batch_reader,
    write_dataset,
)

SCHEMA = Unischema("Grown", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                             UnischemaField("vec", np.float32, (16,), TensorCodec(), False),
                             UnischemaField("payload", np.bytes_, (), ScalarCodec(pa.binary()), False)])
#: the fields added to the grown dataset's rows afterwards (written with the others in the dataset written once)
ADDED = [UnischemaField("label", np.int64, (), ScalarCodec(pa.int64()), True),
         UnischemaField("emb", np.float32, (8,), TensorCodec(), True),
         UnischemaField("split", np.str_, (), ScalarCodec(pa.string()), True)]


def added_values(rows: int) -> dict[str, object]:
    ids = np.arange(rows, dtype=np.int64)
    return {"label": ids % 10, "emb": np.repeat(ids[:, None], 8, axis=1).astype(np.float32),
            "split": np.where(ids % 10 == 0, "val", "train")}


def columns(first: int, count: int) -> dict[str, object]:
    ids = np.arange(first, first + count, dtype=np.int64)
    return {"id": ids, "vec": np.repeat(ids[:, None], 16, axis=1).astype(np.float32),
            "payload": [bytes([i % 251]) * 256 for i in range(first, first + count)]}


def build(root: Path, rows: int, appends: int, added: int) -> tuple[str, str, str]:
    once, grown, compacted = str(root / "once"), str(root / "grown"), str(root / "compacted")
    fields = ADDED[:added]
    extra = added_values(rows)
    write_dataset(once, Unischema("Grown", [*SCHEMA.fields.values(), *fields]),
                  {**columns(0, rows), **{f.name: extra[f.name] for f in fields}}, batched=True)
    step = rows // appends
    for k in range(appends):
        write_dataset(grown, SCHEMA, columns(k * step, step), batched=True, mode="append")
    for field in fields:  # in the appended rows' order: parts in order
        add_column(grown, field, extra[field.name])
    shutil.copytree(grown, compacted)
    compact_dataset(compacted)
    return once, grown, compacted


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
    parser.add_argument("--columns", type=int, default=3, choices=range(len(ADDED) + 1),
                        help="fields added to the grown dataset's rows as column sets")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        urls = dict(zip(("once", "grown", "compacted"), build(Path(tmp), args.rows, args.appends, args.columns)))
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in urls}
        for round_ in range(args.rounds):
            for name in (list(urls) if round_ % 2 == 0 else list(reversed(urls))):
                cpu, wall, count = read_all(urls[name])
                assert count == args.rows, count
                results[name].append((cpu, wall))
        for name, runs in results.items():
            cpus, walls = [c for c, _ in runs], [w for _, w in runs]
            print(f"{name:>9}: CPU s min {min(cpus):.3f} median {statistics.median(cpus):.3f} max {max(cpus):.3f}; "
                  f"wall s min {min(walls):.3f} median {statistics.median(walls):.3f} max {max(walls):.3f}")
        for name in ("grown", "compacted"):
            ratio_cpu = statistics.median(c for c, _ in results[name]) / \
                statistics.median(c for c, _ in results["once"])
            ratio_wall = statistics.median(w for _, w in results[name]) / \
                statistics.median(w for _, w in results["once"])
            print(f"{name}/once medians: CPU {ratio_cpu:.2f}x, wall {ratio_wall:.2f}x "
                  f"({args.appends} appends of {args.rows // args.appends} rows, {args.columns} added columns)")


if __name__ == "__main__":
    main()
