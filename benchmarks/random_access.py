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

    python benchmarks/random_access.py --rounds 5 [--page-kb 16,32] [--latency-ms 20 --rows 2000]

The datasets are written once into ``--work`` (default ``benchmarks/data/random_access``) from
``peers_20000/content.npz`` (20,000 64x64 JPEGs, a label, a 16-float vector; 44 MB). ``--page-kb``
writes the paged dataset with other image pages (the measurement that chose IMAGE_PAGE_BYTES).
``--latency-ms 20`` reads them through a local fsspec filesystem that waits 20 ms before each read (an
object store's latency; ``--rows``: fewer rows a run, as the row-group path moves a row group a row);
``--s3`` from moto's S3 server started here (not representative of page reads: moto reads the whole
object for each ranged GET, ~27 ms for a 16 KiB range of a 44 MB object).
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


def one(contender: str, dataset: str, cache_mb: float | None, limit: int | None = None) -> dict[str, Any]:
    """One epoch of random 64-row batches of ``dataset`` in this process (its first ``limit`` rows asked,
    where given): CPU seconds, wall, rows, reads. An ``s3://`` dataset is read through s3fs with
    ``$UNIHUB_BENCH_S3_OPTIONS`` (JSON storage options)."""
    import numpy as np

    from unihub.readers.random_access import Dataset

    options = json.loads(os.environ.get("UNIHUB_BENCH_S3_OPTIONS", "{}")) if dataset.startswith("s3://") else None
    latency = float(os.environ.get("UNIHUB_BENCH_LATENCY_MS", "0")) / 1000
    ds = Dataset(dataset, cache_mb=cache_mb, storage_options=options, filesystem=_slow_fs(latency) if latency else None)
    rng = np.random.default_rng(0)
    if contender == "cached":  # fill the cache first: the ceiling is a warm cache
        for start in range(0, len(ds), 1024):
            ds.take(np.arange(start, min(len(ds), start + 1024)))
        ds.take(np.arange(BATCH))
    order = rng.permutation(len(ds))[:limit]
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


def _slow_fs(latency: float) -> Any:
    """A local fsspec filesystem whose every read waits ``latency`` seconds first: an object store's
    request latency, without its server (moto's answers a ranged GET of a 44 MB object in ~27 ms
    whatever the range: it reads the object whole)."""
    from fsspec.implementations.local import LocalFileSystem

    class Slow(LocalFileSystem):  # type: ignore[misc]
        def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
            handle = super()._open(path, mode, **kwargs)
            read = handle.read

            def slow_read(size: int = -1) -> Any:
                time.sleep(latency)
                return read(size)
            handle.read = slow_read
            return handle
    return Slow()


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
    ap.add_argument("--rows", type=int, default=None, help="rows asked a run (default: the whole epoch)")
    ap.add_argument("--latency-ms", type=float, default=0.0, help="read through a local fsspec filesystem that "
                                                                   "waits this long before each read (a remote store)")
    ap.add_argument("--s3", action="store_true", help="read the datasets from a local S3 server (moto, started "
                                                      "here; each request ~ms, no added latency)")
    ap.add_argument("--write", nargs=3, metavar=("CONTENT", "FOLDER", "PAGE_KB"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.write:
        content, folder, kb = args.write
        print(json.dumps(write(Path(content), Path(folder), None if kb == "None" else float(kb))))
        return 0
    if args.one:
        contender, dataset, cache_mb = args.one
        print(json.dumps(one(contender, dataset, None if cache_mb == "default" else float(cache_mb), args.rows)))
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
    located: dict[str, str] = {name: str(folder) for name, (folder, _) in datasets.items()}
    server = _s3(located) if args.s3 else None
    if args.latency_ms:
        os.environ["UNIHUB_BENCH_LATENCY_MS"] = str(args.latency_ms)
    runs = [("cached", next(iter(v for k, v in located.items() if k != "row_groups")), "default")]
    runs += [(name, url, small) for name, url in located.items()]
    try:
        results = _rounds(runs, args.rounds, args.rows)
    finally:
        if server is not None:
            server.stop()
    if results is None:
        return 1
    _report(results, total_mb, small, args.rounds, written)
    return 0


def _s3(located: dict[str, str]) -> Any:
    """moto's S3 server, started here, with the datasets uploaded; ``located`` now names their URLs."""
    import boto3
    from moto.server import ThreadedMotoServer

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
        os.environ[name] = value
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="bench")
    for name, folder in list(located.items()):
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file():
                client.upload_file(str(path), "bench", f"{name}/{path.relative_to(folder).as_posix()}")
        located[name] = f"s3://bench/{name}"
    os.environ["UNIHUB_BENCH_S3_OPTIONS"] = json.dumps({"client_kwargs": {"endpoint_url": endpoint},
                                                        "key": "testing", "secret": "testing"})
    return server


def _rounds(runs: list[tuple[str, str, str]], rounds: int, rows: int | None) -> dict[str, list[dict[str, Any]]] | None:
    """Each contender once a round, in turn; None where a run failed."""
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in runs}
    for rnd in range(rounds):
        for name, folder, cache in runs:
            out = subprocess.run([sys.executable, __file__, "--one", "pages" if name != "cached" else "cached",
                                  str(folder), cache, *(["--rows", str(rows)] if rows else [])],
                                 capture_output=True, text=True, check=False)
            if out.returncode:
                print(out.stderr[-3000:], file=sys.stderr)
                return None
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results[name].append(r)
            print(f"round {rnd + 1} {name:14s} cache_mb={cache:8s} {1e6 * r['cpu'] / r['rows']:6.1f} us/row cpu "
                  f"{r['rows'] / r['wall']:8,.0f} rows/s  reads={r['reads']} pages={r['pages']}", file=sys.stderr,
                  flush=True)
    return results


def _report(results: dict[str, list[dict[str, Any]]], total_mb: float, small: str, rounds: int,
            written: dict[str, dict[str, float]]) -> None:
    ceiling = statistics.median(r["cpu"] / r["rows"] for r in results["cached"])
    print(f"\n{total_mb:.1f} MB dataset, cache_mb={small} for all but 'cached'; {rounds} rounds (min / median / max)")
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


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
