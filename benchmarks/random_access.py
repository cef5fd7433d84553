"""Random access over a dataset 10x larger than the cache: ``Dataset.take`` with a uniform random sampler.

Contenders, each a fresh process per round, alternated, several rounds (issue 41's random access):

* ``cached``: the whole dataset in the row-group cache (``cache_mb`` at its default, 512 MB; an
  epoch read first to fill it, not counted): the ceiling.
* ``pages``: ``cache_mb`` a tenth of the dataset, files written by this ``write_dataset`` (an offset
  index, image pages of about ``IMAGE_PAGE_BYTES``): images read a page at a time (store/page_index.py).
* ``row_groups``: the same cache over the same rows written without an offset index (the files
  ``write_dataset`` wrote before it): a row group read for most rows.

One epoch of 64-row batches in a random order (a permutation, as torch's ``RandomSampler``), images
decoded. The figure is CPU time (user + system) of the process per row, and rows/s; the machine is
shared, so CPU per row decides::

    python benchmarks/random_access.py --rounds 5 [--page-kb 32] [--data FOLDER]

The datasets are written once into ``--work`` (default ``benchmarks/data/random_access``) from
``peers_20000/content.npz`` (20,000 64x64 JPEGs, a label, a 16-float vector; 44 MB). ``--page-kb``
writes the paged dataset with other image pages (the measurement that chose IMAGE_PAGE_BYTES).
A child run: ``python benchmarks/random_access.py --one CONTENDER DATASET CACHE_MB`` prints one JSON line
(``--write CONTENT FOLDER PAGE_KB``: writes one dataset).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("UNIHUB_PEERS_DATA", HERE / "data" / "peers_20000"))
BATCH = 64


def write(content: Path, target: Path, page_kb: float | None) -> dict[str, float]:
    """Write the content as a unihub dataset at ``target`` (``page_kb``: image pages of that many KiB,
    -1 write_dataset's own; None: no offset index, unihub's files before it wrote one). Returns its size and the write's CPU."""
    sys.path.insert(0, str(HERE))
    import peers_side  # type: ignore[import-not-found]

    from unihub.store import writer

    original_open = writer.pq.ParquetWriter
    if page_kb is None:
        def without_index(*args: Any, **kwargs: Any) -> Any:
            for key in ("write_page_index", "data_page_size", "write_batch_size"):
                kwargs.pop(key, None)
            return original_open(*args, **kwargs)
        writer.pq.ParquetWriter = without_index  # type: ignore[misc]
    elif page_kb > 0:
        writer.IMAGE_PAGE_BYTES = int(page_kb * 1024)
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    content_rows = peers_side.load_content(content)
    c0, t0 = time.process_time(), time.perf_counter()
    peers_side.write_unihub(content_rows, target)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    writer.pq.ParquetWriter = original_open  # type: ignore[misc]
    size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    return {"bytes": size, "write_cpu": cpu, "write_wall": wall}


def one(contender: str, dataset: str, cache_mb: float | None) -> dict[str, Any]:
    """One epoch of random 64-row batches of ``dataset`` in this process: CPU seconds, wall, rows, reads."""
    import numpy as np

    from unihub.readers.random_access import Dataset

    ds = Dataset(dataset, cache_mb=cache_mb)
    rng = np.random.default_rng(0)
    if contender == "cached":  # fill the cache first: the ceiling is a warm cache
        for start in range(0, len(ds), 1024):
            ds.take(np.arange(start, min(len(ds), start + 1024)))
        ds.take(np.arange(BATCH))
    order = rng.permutation(len(ds))
    c0, t0 = time.process_time(), time.perf_counter()
    rows = 0
    for start in range(0, len(order), BATCH):
        batch = ds.take(order[start:start + BATCH])
        rows += len(batch[0])
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    pages = ds.pages
    return {"rows": rows, "cpu": cpu, "wall": wall, "paged": sorted(ds._paged),
            "reads": pages.reads if pages else 0, "pages": pages.pages_read if pages else 0,
            "bytes_read": pages.bytes_read if pages else 0}


def _mmm(values: list[float]) -> str:
    return f"{min(values):7.1f} {statistics.median(values):7.1f} {max(values):7.1f}"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", nargs=3, metavar=("CONTENDER", "DATASET", "CACHE_MB"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--content", default=str(DATA / "content.npz"))
    ap.add_argument("--work", default=str(HERE / "data" / "random_access"))
    ap.add_argument("--page-kb", default="", help="image page sizes to compare (KiB, comma separated; "
                                                  "default: write_dataset's own)")
    ap.add_argument("--rewrite", action="store_true", help="write the datasets again")
    ap.add_argument("--write", nargs=3, metavar=("CONTENT", "FOLDER", "PAGE_KB"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.write:
        content, folder, kb = args.write
        print(json.dumps(write(Path(content), Path(folder), None if kb == "None" else float(kb))))
        return 0
    if args.one:
        contender, dataset, cache_mb = args.one
        print(json.dumps(one(contender, dataset, None if cache_mb == "default" else float(cache_mb))))
        return 0
    work = Path(args.work)
    sizes = [float(k) for k in args.page_kb.split(",") if k] or [None]
    # name -> (folder, page KiB: None no offset index, -1 write_dataset's own)
    datasets: dict[str, tuple[Path, float | None]] = {"row_groups": (work / "no_index", None)}
    for kb in sizes:
        name = "pages" if kb is None else f"pages_{kb:g}k"
        datasets[name] = (work / name, -1.0 if kb is None else kb)
    written = {}
    for name, (folder, kb) in datasets.items():
        if args.rewrite or not (folder / "_common_metadata").exists():
            out = subprocess.run([sys.executable, __file__, "--write", args.content, str(folder), str(kb)],
                                 capture_output=True, text=True, check=True)
            written[name] = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"wrote {name}: {written[name]}", file=sys.stderr)
    total_mb = sum(f.stat().st_size for f in datasets["row_groups"][0].rglob("*") if f.is_file()) / 2**20
    small = f"{total_mb / 10:.3f}"
    runs = [("cached", next(iter(v[0] for k, v in datasets.items() if k != "row_groups")), "default")]
    runs += [(name, folder, small) for name, (folder, _) in datasets.items()]
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in runs}
    for rnd in range(args.rounds):
        for name, folder, cache in runs:
            out = subprocess.run([sys.executable, __file__, "--one", "pages" if name != "cached" else "cached",
                                  str(folder), cache], capture_output=True, text=True, check=False)
            if out.returncode:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results[name].append(r)
            print(f"round {rnd + 1} {name:14s} cache_mb={cache:8s} {1e6 * r['cpu'] / r['rows']:6.1f} us/row cpu "
                  f"{r['rows'] / r['wall']:8,.0f} rows/s  reads={r['reads']} pages={r['pages']}", file=sys.stderr,
                  flush=True)
    ceiling = statistics.median(r["cpu"] / r["rows"] for r in results["cached"])
    print(f"\n{total_mb:.1f} MB dataset, cache_mb={small} for all but 'cached'; {args.rounds} rounds (min / median / max)")
    print(f"{'contender':14s} {'CPU us/row':>23s} {'rows/s':>26s}  {'x cached (CPU)':>14s}  {'reads/row':>9s}  "
          f"{'KB read/row':>11s}")
    for name, found in results.items():
        cpu = [1e6 * r["cpu"] / r["rows"] for r in found]
        rate = [r["rows"] / r["wall"] for r in found]
        r0 = found[0]
        print(f"{name:14s} {_mmm(cpu)} {_mmm(rate)}  {ceiling * 1e6 / statistics.median(cpu):14.2f}  "
              f"{r0['reads'] / r0['rows']:9.2f}  {r0['bytes_read'] / r0['rows'] / 1024:11.1f}")
    for name, w in written.items():
        print(f"written {name}: {w['bytes'] / 2**20:.2f} MB, write CPU {w['write_cpu']:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
