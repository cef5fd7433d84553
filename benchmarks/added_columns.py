"""Reading columns added without a rewrite (store/columns.py) against the same rows written at once.

Two datasets of the same 20,000 rows (``peers_20000/content.npz``: 64x64 JPEGs, a label, a 16-float
vector) plus a float32[64] embedding and a train/val split:

* ``at_once``: every field written by one ``write_dataset``;
* ``added``: id, image and vector written, then label, embedding and split added as three column sets
  (``add_column``: one side file per part and set, joined on read).

Contenders, each a fresh process per round, alternated, several rounds; the figure is the process's CPU
time (user + system) per row, as the machine is shared:

* ``reader``: one epoch of ``make_reader`` over every field (images decoded, 2 threads);
* ``parts_only``: the same over id, image and vector (a reader that does not select the added fields);
* ``take``: one epoch of ``Dataset.take`` in random 64-row batches (every field).

    python benchmarks/added_columns.py --rounds 5

A child run: ``python benchmarks/added_columns.py --one CONTENDER DATASET`` prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

HERE = Path(__file__).resolve().parent
CONTENT = Path("/work/main/benchmarks/data/peers_20000/content.npz")
if not CONTENT.exists():
    CONTENT = HERE / "data" / "peers_20000" / "content.npz"


def _fields() -> dict[str, Any]:
    from unihub import CompressedImageCodec, ScalarCodec, TensorCodec, UnischemaField

    return {
        "id": UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
        "image": UnischemaField("image", np.uint8, (64, 64, 3), CompressedImageCodec("jpeg"), False),
        "vec": UnischemaField("vec", np.float32, (16,), TensorCodec(), False),
        "label": UnischemaField("label", np.int64, (), ScalarCodec(pa.int64()), True),
        "emb": UnischemaField("emb", np.float32, (64,), TensorCodec(), True),
        "split": UnischemaField("split", np.str_, (), ScalarCodec(pa.string()), True),
    }


def write(work: Path) -> dict[str, Any]:
    """Both datasets into ``work``; the bytes each wrote."""
    from unihub import Unischema, add_column, open_dataset, write_dataset

    with np.load(CONTENT, allow_pickle=False) as data:
        offsets, blob, labels, vecs = data["offsets"], data["blob"], data["labels"], data["vecs"]
    n = len(labels)
    images = [blob[offsets[i]:offsets[i + 1]].tobytes() for i in range(n)]
    emb = np.random.default_rng(0).standard_normal((n, 64)).astype(np.float32)
    split = np.where(np.arange(n) % 10 == 0, "val", "train")
    fields = _fields()
    full = {"id": np.arange(n), "image": images, "vec": vecs, "label": labels, "emb": emb, "split": split}
    at_once = write_dataset(work / "at_once", Unischema("Bench", list(fields.values())), full, batched=True,
                            overwrite=True)
    base = ["id", "image", "vec"]
    parts = write_dataset(work / "added", Unischema("Bench", [fields[k] for k in base]),
                          {k: full[k] for k in base}, batched=True, overwrite=True)
    store = open_dataset(work / "added")
    order = np.concatenate([store.read_row_group(g, ["id"]).column("id").to_numpy()
                            for g in range(len(store.row_groups))])
    added = {k: add_column(work / "added", fields[k], full[k][order] if k != "split" else split[order]).bytes_written
             for k in ("label", "emb", "split")}
    return {"at_once": at_once.bytes_written, "parts": parts.bytes_written, "added": added,
            "row_groups": len(store.row_groups), "rows": n}


def one(contender: str, dataset: str) -> dict[str, Any]:
    from unihub import Dataset, make_reader

    start, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    rows = 0
    if contender in ("reader", "parts_only"):
        fields = ["id", "image", "vec"] if contender == "parts_only" else None
        with make_reader(dataset, schema_fields=fields, workers_count=2, seed=1) as reader:
            for _ in reader:
                rows += 1
    else:
        ds = Dataset(dataset)
        order = np.random.default_rng(1).permutation(len(ds))
        for k in range(0, len(order), 64):
            rows += len(ds.take(order[k:k + 64]).id)
    end = resource.getrusage(resource.RUSAGE_SELF)
    cpu = end.ru_utime - start.ru_utime + end.ru_stime - start.ru_stime
    return {"rows": rows, "cpu_us_per_row": cpu / rows * 1e6, "wall_s": time.perf_counter() - wall}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", nargs=2, metavar=("CONTENDER", "DATASET"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", default=str(HERE / "data" / "added_columns"))
    ap.add_argument("--contenders", default="reader,parts_only,take")
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(*args.one)))
        return 0
    work = Path(args.work)
    if not (work / "added" / "_unihub_versions").exists():  # each add a version (store/versions.py)
        print(json.dumps(write(work)), file=sys.stderr)
    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for contender in args.contenders.split(","):
            for dataset in ("at_once", "added"):  # alternated
                out = subprocess.run([sys.executable, __file__, "--one", contender, str(work / dataset)],
                                     capture_output=True, text=True, check=True)
                results.setdefault((contender, dataset), []).append(
                    json.loads(out.stdout.strip().splitlines()[-1])["cpu_us_per_row"])
    for (contender, dataset), values in results.items():
        print(f"{contender:11s} {dataset:8s} CPU us/row min {min(values):7.1f} median {statistics.median(values):7.1f} "
              f"max {max(values):7.1f}")
    for contender in args.contenders.split(","):
        ratio = statistics.median(results[(contender, "added")]) / statistics.median(results[(contender, "at_once")])
        print(f"{contender}: added / at_once (medians) {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
