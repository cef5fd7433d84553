"""make_reader / make_batch_reader side by side with Petastorm 0.13.1 and their limits, in one run, as ratios.

Petastorm runs in its own virtualenv (``benchmarks/petastorm_env.py``) on the same files;
the reference data is written by Petastorm itself (``benchmarks/make_reference_data.py``).

make_reader vs Petastorm (issue 39), alternated as ``benchmarks/peers.py`` does: every round runs
each contender once as a fresh process (``reader_side.py`` for unihub, ``petastorm_side.py`` in
Petastorm's venv, both started by ``peers.run_child``), the contenders alternated round by round
(the order within a pair flips every round), imports excluded. Each run is timed from creating the
reader to leaving its ``with`` block after the last row (worker start-up and shut-down included),
touching every field of every row; beside rows/s it records the CPU of the run's whole process tree
over the same span (user + system, from ``/proc``: ``proc_cpu.tree_cpu_seconds``), printed as
CPU ms per 1,000 rows. Figures are min / median / max over ``--rounds``; the targets are decided
on the medians. Petastorm gets its best pool setting on this machine (measured by
``petastorm_side.py sweep``: thread pool, 2 workers for all fields, 1 for id + label); unihub
runs with its defaults.

The other two rows run in this process, their sides alternated within each round:
TensorCodec vs the decode limit, make_batch_reader vs pyarrow.

Targets, each a ratio of medians from this one run:

- make_reader, all fields, Petastorm's dataset: >= 3x Petastorm (issue 39)
- make_reader, id + label only: >= 5x Petastorm (issue 39)
- make_reader, unihub's own TensorCodec dataset: >= 85% of the decode limit
  (the readers' PNG column decode alone, one thread per core, on the same images; one core's
  rate x cores is printed beside it: on a shared VM the cores seldom scale that far)
- make_batch_reader, 1M-row plain Parquet: >= 0.8x pyarrow.parquet.read_table + to_numpy

    python benchmarks/reader.py [--rounds 5] [--cases petastorm,decode,batch]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_reference_data import make_petastorm_images, make_plain_1m  # noqa: E402
from peers import run_child  # noqa: E402
from petastorm_env import ensure_petastorm_venv  # noqa: E402
from proc_cpu import tree_cpu_seconds  # noqa: E402

from unihub import (  # noqa: E402
    CompressedImageCodec,
    ScalarCodec,
    TensorCodec,
    Unischema,
    UnischemaField,
    make_batch_reader,
    make_reader,
    write_dataset,
)
from unihub.images import decoders as images  # noqa: E402

CASES = ("petastorm", "decode", "batch")
PETASTORM_ROWS = 10_000

UnihubImages = Unischema("UnihubImages", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("image", np.uint8, (64, 64, 3), CompressedImageCodec("png"), False),
    UnischemaField("label", np.int32, (), ScalarCodec(pa.int32()), False),
    UnischemaField("embedding", np.float32, (128,), TensorCodec(), False),
    UnischemaField("boxes", np.float32, (None, 4), TensorCodec(), False),
])


@dataclass
class Side:
    """One contender of a row: its runs' rows/s and CPU seconds per row."""

    name: str
    rates: list[float] = field(default_factory=list)
    cpu_per_row: list[float] = field(default_factory=list)

    def add(self, rows: int, seconds: float, cpu_s: float | None) -> None:
        self.rates.append(rows / seconds)
        if cpu_s is not None:
            self.cpu_per_row.append(cpu_s / rows)

    def rate(self) -> float:
        return statistics.median(self.rates) if self.rates else float("nan")

    def cpu_ms_per_1k(self) -> list[float]:
        return [c * 1e6 for c in self.cpu_per_row]


@dataclass
class Row:
    """A line of the table: unihub's side, the other side, the target ratio of their medians."""

    label: str
    ours: Side
    theirs: Side
    target: float
    note: str = ""


def timed(fn: Callable[[], int]) -> tuple[int, float, float]:
    """(rows, wall seconds, process-tree CPU seconds) of ``fn()`` run here."""
    cpu0, start = tree_cpu_seconds(), time.perf_counter()
    rows = fn()
    return rows, time.perf_counter() - start, tree_cpu_seconds() - cpu0


def count_rows(url: str, **kwargs: Any) -> int:
    with make_reader(url, **kwargs) as reader:
        return sum(1 for _ in reader)


def petastorm_rows(python: Path, url: str, rounds: int, timeout: float) -> list[Row]:
    """make_reader vs Petastorm's on all fields and on id + label: each run a fresh process, the two
    contenders alternated (unihub first in even rounds, Petastorm first in odd ones)."""
    cases = [("make_reader, all fields, Petastorm's dataset", None, 2, 3.0),
             ("make_reader, id + label only", ["id", "label"], 1, 5.0)]
    rows = [Row(label, Side("unihub"), Side("Petastorm"), target,
                f"Petastorm: thread pool, {workers} worker{'s' if workers > 1 else ''}")
            for label, _, workers, target in cases]
    for rnd in range(rounds):
        print(f"round {rnd + 1}/{rounds}", file=sys.stderr, flush=True)
        for row, (_, fields, workers, _) in zip(rows, cases):
            ours = (Path(sys.executable), {"url": url, "schema_fields": fields}, HERE / "reader_side.py", row.ours)
            theirs = (python, {"kind": "make_reader", "url": url, "schema_fields": fields, "reader_pool_type": "thread",
                               "workers_count": workers, "expected_rows": PETASTORM_ROWS},
                      HERE / "petastorm_side.py", row.theirs)
            for exe, job, side_script, side in ([ours, theirs] if rnd % 2 == 0 else [theirs, ours]):
                result = run_child(exe, job, timeout, side=side_script, pss=False)
                if "error" in result or result["rows"] != PETASTORM_ROWS:
                    raise RuntimeError(f"{side.name}, {row.label}: {result.get('error') or result['rows']} "
                                       f"(want {PETASTORM_ROWS:,} rows)")
                side.add(result["rows"], result["seconds"], result.get("cpu_s"))
                print(f"  {row.label}, {side.name}: {side.rates[-1]:,.0f} rows/s, "
                      f"{side.cpu_ms_per_1k()[-1]:.1f} CPU ms / 1k rows", file=sys.stderr, flush=True)
    return rows


def write_tensor_copy(source: Path, target: Path) -> Path:
    """The same rows as Petastorm's dataset, written by write_dataset with TensorCodec (PNG bytes as given)."""
    if target.exists():
        return target
    def rows():
        with make_reader(str(source), decode_images=False, shuffle_row_groups=False) as reader:
            for row in reader:
                yield {"id": row.id, "image": row.image, "label": row.label, "embedding": row.embedding,
                       "boxes": row.boxes}
    # 2 MB row groups (~240 rows): 10k rows make ~40 tasks, so two workers finish together
    write_dataset(target, UnihubImages, rows(), row_group_size_mb=2)
    return target


def decode_limit_row(url: Path, rounds: int) -> Row:
    """make_reader on unihub's TensorCodec copy vs the decode limit: the readers' PNG column decode
    (``decode_images_into``) alone in one thread per core, each into its own array (what the machine can decode with nothing else to do). One core's
    rate is timed too; the three alternate within each round, so that a noisy spell hits all alike."""
    blobs = pq.read_table(url, columns=["image"]).column("image").to_pylist()
    cores = os.cpu_count() or 1

    def decode(share: list[bytes]) -> int:
        # the readers' column decode (libdeflate + batched unfilter for SUB-filtered PNGs, else libpng)
        images.decode_images_into(share, np.empty((len(share), 64, 64, 3), np.uint8))
        return len(share)

    def decode_on_every_core() -> int:
        with ThreadPoolExecutor(cores) as pool:
            return sum(pool.map(decode, [blobs[i::cores] for i in range(cores)]))

    one, every, reader = Side("one core"), Side("decode limit"), Side("unihub")
    for _ in range(rounds):
        one.add(*timed(lambda: decode(blobs)))
        every.add(*timed(decode_on_every_core))
        reader.add(*timed(lambda: count_rows(str(url))))
    return Row(f"make_reader, unihub TensorCodec dataset (decode limit: {cores} threads decoding; "
               f"one core {one.rate():,.0f}, x {cores} = {one.rate() * cores:,.0f})", reader, every, 0.85,
               "decode limit")


def batch_row(plain: Path, rounds: int) -> Row:
    """make_batch_reader vs pyarrow's read_table + to_numpy on 1M rows of plain Parquet, alternated in this process."""
    columns = pq.read_schema(next(plain.glob("*.parquet"))).names

    def raw_read() -> int:
        table = pq.read_table(plain, columns=columns)
        return len([table.column(c).to_numpy() for c in columns]) and table.num_rows

    def batch_read() -> int:
        n = 0
        with make_batch_reader(f"file://{plain}", shuffle_row_groups=False) as reader:
            for batch in reader:
                n += len(batch.id)
        return n

    ours, theirs = Side("unihub"), Side("pyarrow")
    for _ in range(rounds):
        for side, fn in ((ours, batch_read), (theirs, raw_read)):
            rows, seconds, cpu = timed(fn)
            assert rows == 1_000_000, (side.name, rows)
            side.add(rows, seconds, cpu)
    return Row("make_batch_reader, 1M-row plain Parquet", ours, theirs, 0.8, "pyarrow read_table + to_numpy")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", "--repeats", dest="rounds", type=int, default=5,
                        help="rounds (every contender once a round); 5")
    parser.add_argument("--cases", default=",".join(CASES),
                        help="comma-separated: petastorm (make_reader vs Petastorm), decode (vs the decode limit), "
                             "batch (make_batch_reader vs pyarrow)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per fresh-process run")
    args = parser.parse_args(argv)
    cases = {c for c in args.cases.split(",") if c}
    if cases - set(CASES):
        parser.error(f"unknown case(s) {sorted(cases - set(CASES))}; choose from {', '.join(CASES)}")
    pet_images = make_petastorm_images()
    rows: list[Row] = []
    if "petastorm" in cases:
        rows += petastorm_rows(ensure_petastorm_venv(), f"file://{pet_images}", args.rounds, args.timeout)
    if "decode" in cases:
        rows.append(decode_limit_row(write_tensor_copy(pet_images, HERE / "data" / "unihub_images"), args.rounds))
    if "batch" in cases:
        rows.append(batch_row(make_plain_1m(), args.rounds))
    print_ratios(f"unihub vs Petastorm 0.13.1 and the limits, {os.cpu_count()} cores, {args.rounds} rounds "
                 "(min / **median** / max; ratios and verdicts on the medians)", rows)
    return 0


def _fmt(values: list[float], digits: int = 0) -> str:
    if not values:
        return "-"
    return f"{min(values):,.{digits}f} / **{statistics.median(values):,.{digits}f}** / {max(values):,.{digits}f}"


def print_ratios(title: str, rows: list[Row]) -> None:
    """A markdown table: each row's two sides (rows/s and CPU ms per 1,000 rows, min / median / max), the
    ratio of the medians against its target, and the per-round ratios' spread."""
    print(f"\n{title}\n")
    print("| case | unihub rows/s | other rows/s | ratio (per-round min-max) | target | | "
          "unihub CPU ms / 1k rows | other CPU ms / 1k rows | other |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        ratio = row.ours.rate() / row.theirs.rate()
        paired = [a / b for a, b in zip(row.ours.rates, row.theirs.rates)]
        print(f"| {row.label} | {_fmt(row.ours.rates)} | {_fmt(row.theirs.rates)} | "
              f"**{ratio:.2f}x** ({min(paired):.2f}-{max(paired):.2f}) | >= {row.target}x | "
              f"{'ok' if ratio >= row.target else 'MISSED'} | {_fmt(row.ours.cpu_ms_per_1k(), 1)} | "
              f"{_fmt(row.theirs.cpu_ms_per_1k(), 1)} | {row.note} |")


if __name__ == "__main__":
    raise SystemExit(main())
