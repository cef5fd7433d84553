"""The writers' default row-group size, chosen by measurement (issue 15).

A row group is what a reader reads at once: the reader's memory holds whole raw row groups
(several decode tasks share one), a predicate skips whole row groups, and each group costs a
footer entry, a read call and a fresh dictionary/compression start. This benchmark writes the
same content with each ``--sizes`` value of ``row_group_size_mb`` and reads it back:

- **images**: the peers content (``peers.py``: 64x64 JPEG + int64 label + float32[16], 20,000 rows),
  read one epoch in batches of 64 by ``BatchedDataLoader(make_batch_reader)`` unshuffled and with a
  4,096-row shuffling queue (``shuffle_row_groups``), and by ``DataLoader(make_reader)``;
- **scalars**: 2,000,000 rows of int64 id, float64 x, int32 label, a short string, read by
  ``make_batch_reader`` (Arrow batches, no decoding: what row groups cost where nothing else does).

Every read and every write is a fresh process (``peers.run_child``: peak RSS of the process
polled from ``/proc``), contenders alternated, ``--rounds`` rounds, min / median / max. Written
bytes and the write's seconds come from the writes of every round (each round writes anew).

    python benchmarks/row_groups.py [--rounds 3] [--sizes 2,4,8,16,32,64]
    python benchmarks/row_groups.py --quick     # 2k image rows, 100k scalar rows, sizes 1 and 32, 1 round
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peers  # noqa: E402

SCALAR_ROWS = 2_000_000
IMAGE_READS = {"batched": ("unihub_batched", 0), "batched, shuffled": ("unihub_batched", 4096),
               "DataLoader(make_reader)": ("unihub_rows", 0)}


# --------------------------------------------------------------------------- the side (a fresh process)
def _scalar_columns(rows: int) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    words = np.array([f"item-{i:05d}" for i in range(5000)], dtype=object)
    return {"id": np.arange(rows, dtype=np.int64), "x": rng.standard_normal(rows),
            "label": rng.integers(0, 1000, rows).astype(np.int32), "name": words[rng.integers(0, 5000, rows)]}


def write(job: dict[str, Any]) -> dict[str, Any]:
    """Write one copy (images from the peers content, or the scalar table) with ``row_group_size_mb``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from unihub import CompressedImageCodec, ScalarCodec, TensorCodec, Unischema, UnischemaField, write_dataset

    target = Path(job["target"])
    if job["kind"] == "images":
        blobs, labels, vecs = peers.load_content(job["content"])
        schema = Unischema("RowGroups", [
            UnischemaField("image", np.uint8, (64, 64, 3), CompressedImageCodec("jpeg", quality=90), False),
            UnischemaField("label", np.int64, (), ScalarCodec(pa.int64()), False),
            UnischemaField("vec", np.float32, (16,), TensorCodec(), False)])
        columns: dict[str, Any] = {"image": blobs, "label": labels, "vec": vecs}
    else:
        schema = Unischema("Scalars", [
            UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
            UnischemaField("x", np.float64, (), ScalarCodec(pa.float64()), False),
            UnischemaField("label", np.int32, (), ScalarCodec(pa.int32()), False),
            UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), False)])
        columns = _scalar_columns(job["rows"])
    start = time.perf_counter()
    write_dataset(target, schema, columns, batched=True, row_group_size_mb=job["size_mb"])
    seconds = time.perf_counter() - start
    files = sorted(target.glob("*.parquet"))
    groups = sum(pq.ParquetFile(f).metadata.num_row_groups for f in files)
    return {"rows": len(columns["label"]), "seconds": seconds, "ttfb": 0.0, "groups": groups,
            "bytes": sum(f.stat().st_size for f in files)}


def read_scalars(job: dict[str, Any]) -> dict[str, Any]:
    """One epoch of ``make_batch_reader`` over the scalar copy: rows/s and time to first batch."""
    from unihub import make_batch_reader

    rows = id_sum = 0
    first = None
    start = time.perf_counter()
    with make_batch_reader(job["data"], num_epochs=1) as reader:
        for batch in reader:
            if first is None:
                first = time.perf_counter() - start
            rows += len(batch.id)
            id_sum += int(batch.id.sum())
    return {"rows": rows, "seconds": time.perf_counter() - start, "ttfb": first, "id_sum": id_sum}


SIDE_JOBS = {"write": write, "scalars": read_scalars}


# --------------------------------------------------------------------------- the run
def _summary(values: list[float], fmt: str = "{:,.0f}") -> str:
    if not values:
        return "failed"
    return " / ".join([fmt.format(min(values)), "**" + fmt.format(statistics.median(values)) + "**",
                       fmt.format(max(values))])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=None, help="3 (1 with --quick)")
    ap.add_argument("--sizes", default=None, help="row_group_size_mb values, comma-separated (2,4,8,16,32,64)")
    ap.add_argument("--rows", type=int, default=None, help="image rows (the peers content): 20,000")
    ap.add_argument("--scalar-rows", type=int, default=None, help=f"{SCALAR_ROWS:,}")
    ap.add_argument("--data", type=Path, default=None, help="where the copies go (benchmarks/data/row_groups)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: small inputs, two sizes, one round")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args(argv)
    quick = args.quick
    args.rounds = args.rounds or (1 if quick else 3)
    args.sizes = args.sizes or ("1,32" if quick else "2,4,8,16,32,64")
    args.rows = args.rows or (2_000 if quick else 20_000)
    args.scalar_rows = args.scalar_rows or (100_000 if quick else SCALAR_ROWS)
    args.data = args.data or HERE / "data" / ("row_groups_quick" if quick else "row_groups")
    sizes = [float(s) for s in args.sizes.split(",") if s]
    python = Path(sys.executable)
    args.data.mkdir(parents=True, exist_ok=True)
    content = peers.make_content(args.data / f"content_{args.rows}.npz", args.rows)
    _, labels, _ = peers.load_content(content)
    label_sum, id_sum = int(labels.sum()), args.scalar_rows * (args.scalar_rows - 1) // 2
    results: dict[tuple[str, float], list[dict[str, Any]]] = {}
    t_start = time.perf_counter()

    def run(key: tuple[str, float], job: dict[str, Any], check: tuple[str, int] | None = None) -> None:
        result = peers.run_child(python, job, args.timeout, side=Path(__file__))
        if "error" not in result and check is not None and result.get(check[0]) != check[1]:
            result = {"error": f"wrong content: {check[0]} {result.get(check[0])} (want {check[1]})"}
        print(f"  {key[0]} @ {key[1]:g} MB: " + (result.get("error") or
              f"{result['rows'] / result['seconds']:,.0f} rows/s, first {result['ttfb']:.2f}s, "
              f"peak RSS {result['peak_rss_mib']:.0f} MiB"), file=sys.stderr, flush=True)
        if "error" not in result:
            results.setdefault(key, []).append(result)

    def copies(size: float) -> Iterator[tuple[str, Path, dict[str, Any]]]:
        yield "images", args.data / f"images_{size:g}", {"content": str(content)}
        yield "scalars", args.data / f"scalars_{size:g}", {"rows": args.scalar_rows}

    for rnd in range(args.rounds):
        print(f"round {rnd + 1}/{args.rounds}", file=sys.stderr, flush=True)
        for size in sizes:  # writes: each round writes every copy anew
            for kind, target, extra in copies(size):
                shutil.rmtree(target, ignore_errors=True)
                run((f"write {kind}", size), dict(extra, side="write", kind=kind, target=str(target), size_mb=size))
        for size in sizes:
            images, scalars = args.data / f"images_{size:g}", args.data / f"scalars_{size:g}"
            for label, (tool, shuffle) in IMAGE_READS.items():
                run((label, size), {"tool": tool, "data": f"file://{images}", "workers": 0, "shuffle": shuffle,
                                    "probes": [0]}, ("label_sum", label_sum))
            run(("scalars", size), {"side": "scalars", "data": f"file://{scalars}"}, ("id_sum", id_sum))

    print(f"\n`python benchmarks/row_groups.py --rounds {args.rounds} --sizes {args.sizes}` "
          f"({time.perf_counter() - t_start:.0f} s; {os.cpu_count()} cores; rows/s min / **median** / max; "
          f"first batch and peak RSS of the process: medians)\n")
    print("| row_group_size_mb | contender | rows/s | first batch s | peak RSS MiB |")
    print("|---|---|---|---|---|")
    for size in sizes:
        for label in [*IMAGE_READS, "scalars"]:
            runs = results.get((label, size), [])
            rates = [r["rows"] / r["seconds"] for r in runs]
            ttfb = statistics.median(r["ttfb"] for r in runs) if runs else float("nan")
            rss = statistics.median(r["peak_rss_mib"] for r in runs) if runs else float("nan")
            name = label if label != "scalars" else f"make_batch_reader, {args.scalar_rows:,} scalar rows"
            print(f"| {size:g} | {name} | {_summary(rates)} | {ttfb:.2f} | {rss:,.0f} |")
    print("\n| row_group_size_mb | copy | row groups | MB on disk | write rows/s (median) | write peak RSS MiB |")
    print("|---|---|---|---|---|---|")
    for size in sizes:
        for kind in ("images", "scalars"):
            runs = results.get((f"write {kind}", size), [])
            if not runs:
                print(f"| {size:g} | {kind} | failed | | | |")
                continue
            rate = statistics.median(r["rows"] / r["seconds"] for r in runs)
            print(f"| {size:g} | {kind} | {runs[-1]['groups']} | {runs[-1]['bytes'] / 1e6:,.1f} | {rate:,.0f} | "
                  f"{statistics.median(r['peak_rss_mib'] for r in runs):,.0f} |")
    return 0


def side_main(argv: list[str]) -> int:
    """A fresh process's one job (``peers.run_child`` passes it as JSON): a write, or a read."""
    job = json.loads(argv[0])
    if "side" in job:
        result = SIDE_JOBS[job["side"]](job)
    else:  # an image read: peers_side's epoch, which checks the content
        import peers_side

        result = peers_side.run_epoch(job)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("{"):
        raise SystemExit(side_main(sys.argv[1:]))
    raise SystemExit(main())
