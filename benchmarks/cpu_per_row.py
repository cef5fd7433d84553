"""CPU per row of unihub's torch paths, and how much of it is not the JPEG decode (issue 39).

Each unihub torch path of ``peers_side.py`` (batched, rows, iterable, map; unshuffled and
shuffled) runs one epoch in a fresh process, several rounds, the paths alternating. The figure
is the CPU time (user + system) of the whole process tree per 1,000 rows: the process's own
``utime + stime``, its reaped children's ``cutime + cstime`` and the live descendants' four,
read from ``/proc`` at the start and the end of the epoch (after the imports). A pure decode
loop of the same images with unihub's decoder (``decode_image(blob, out=...)``) is measured
the same way, so non-decode CPU = path - decode; ``decode_raw`` is simplejpeg's own call alone
(without decode_image's header checks, as the readers' column loop mostly calls it)::

    python benchmarks/cpu_per_row.py --rounds 5 [--paths unihub_batched,unihub_map] [--shuffle 4096]

The data folder defaults to ``benchmarks/data/peers_20000`` (``$UNIHUB_PEERS_DATA`` overrides it).
``--paths torch_floor`` adds a reference that is not a unihub path: torch's DataLoader, 2 workers,
decoding the content's JPEGs itself and sending tensors by torch's own IPC (what a peer built on
torch workers pays besides its reading). A child run: ``python benchmarks/cpu_per_row.py --one PATH SHUFFLE DATA SOURCE`` prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("UNIHUB_PEERS_DATA", HERE / "data" / "peers_20000"))
PATHS = ("unihub_batched", "unihub_rows", "unihub_iterable", "unihub_map")
sys.path.insert(0, str(HERE))

from proc_cpu import own_cpu_seconds, tree_cpu_seconds  # noqa: E402


def torch_floor(job: dict[str, Any]) -> Any:
    """A reference, not a unihub path: torch's DataLoader with 2 workers over an IterableDataset that
    decodes the content's JPEGs (simplejpeg, into a fresh batch array; no storage read) into 64-row
    batches of tensors, sent by torch's own IPC (a new shared-memory file per tensor)."""
    import numpy as np
    import peers_side
    import simplejpeg
    import torch

    blobs, labels, vecs = peers_side.load_content(job["source"])
    shape = peers_side.decode(blobs[0]).shape

    class Floor(torch.utils.data.IterableDataset):  # type: ignore[misc]
        def __iter__(self) -> Any:
            info = torch.utils.data.get_worker_info()
            share = -(-len(blobs) // info.num_workers)
            lo, hi = info.id * share, min(len(blobs), (info.id + 1) * share)
            for start in range(lo, hi, 64):
                stop = min(hi, start + 64)
                out = np.empty((stop - start, *shape), np.uint8)
                for i in range(start, stop):
                    simplejpeg.decode_jpeg(blobs[i], colorspace="RGB", buffer=out[i - start], strict=True)
                yield torch.from_numpy(out), torch.from_numpy(labels[start:stop]), torch.from_numpy(vecs[start:stop])

    return iter(torch.utils.data.DataLoader(Floor(), batch_size=None, num_workers=job["workers"]))


def _time_decodes(folder: str) -> None:
    """Count the CPU (thread time) each process spends in the readers' column decode loop
    (``decode_images_into``: the JPEG decoder and its small per-image loop), into ``folder``, a
    file per process: the decode the path itself does, as against the reference loop's."""
    from unihub.images import decoders

    original = decoders.decode_images_into
    lock = threading.Lock()
    totals: dict[int, list[float]] = {}

    def timed(blobs: Any, out: Any) -> Any:
        start = time.thread_time()
        try:
            return original(blobs, out)
        finally:
            spent = time.thread_time() - start
            with lock:
                mine = totals.setdefault(os.getpid(), [0.0, 0])  # a forked worker starts its own
                mine[0] += spent
                mine[1] += len(blobs)
                Path(folder, str(os.getpid())).write_text(json.dumps(mine))

    decoders.decode_images_into = timed


def _decoded(folder: str) -> tuple[float, int]:
    """(CPU seconds, images) that every process of the run spent in ``decode_images_into``."""
    found = [json.loads(f.read_text()) for f in Path(folder).iterdir()]
    return sum(f[0] for f in found), sum(f[1] for f in found)


def one(path: str, shuffle: int, data: str, source: str) -> dict[str, Any]:
    """One epoch of ``path`` (or the decode loop) in this process; CPU seconds of the tree and rows."""
    sys.path.insert(0, str(HERE))
    import numpy as np
    import peers_side  # type: ignore[import-not-found]

    if path in ("decode", "decode_raw"):
        import simplejpeg

        from unihub.images.decoders import decode_image

        blobs, _, _ = peers_side.load_content(source)
        out = np.empty(peers_side.decode(blobs[0]).shape, np.uint8)
        c0, t0 = tree_cpu_seconds(), time.perf_counter()
        if path == "decode":
            for blob in blobs:
                decode_image(blob, out=out)
        else:  # the decoder alone, as the readers' column loop calls it (decode_images_into)
            for blob in blobs:
                simplejpeg.decode_jpeg(blob, colorspace="RGB", buffer=out, strict=True)
        cpu = tree_cpu_seconds() - c0
        return {"rows": len(blobs), "cpu": cpu, "wall": time.perf_counter() - t0, "steady_cpu": cpu,
                "main_cpu": cpu, "decode_cpu": cpu, "decoded": len(blobs)}
    import importlib

    pipelines = dict(peers_side.PIPELINES, torch_floor=torch_floor)
    for module in peers_side.IMPORTS.get(path, "torch").split():
        importlib.import_module(module)
    job = {"tool": path, "data": data, "workers": 2, "shuffle": shuffle, "source": source}
    rows, first = 0, None
    with tempfile.TemporaryDirectory() as folder:
        _time_decodes(folder)
        c0, t0, m0 = tree_cpu_seconds(), time.perf_counter(), own_cpu_seconds()
        for _images, labels, _vecs in pipelines[path](job):
            if first is None:
                first = (tree_cpu_seconds() - c0, len(labels))
            rows += len(labels)
        cpu = tree_cpu_seconds() - c0
        wall, main_cpu = time.perf_counter() - t0, own_cpu_seconds() - m0
        decode_cpu, decoded = _decoded(folder)
    steady = (cpu - first[0]) / (rows - first[1]) * rows if first and rows > first[1] else cpu
    return {"rows": rows, "cpu": cpu, "wall": wall, "steady_cpu": steady, "main_cpu": main_cpu,
            "decode_cpu": decode_cpu, "decoded": decoded}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", nargs=4, metavar=("PATH", "SHUFFLE", "DATA", "SOURCE"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--shuffle", default="0,4096", help="shuffle buffers to run, comma separated")
    ap.add_argument("--data", default=str(DATA / "unihub-rg4mb"))
    ap.add_argument("--source", default=str(DATA / "content.npz"))
    args = ap.parse_args(argv)
    if args.one:
        path, shuffle, data, source = args.one
        print(json.dumps(one(path, int(shuffle), data, source)))
        return 0
    runs = [("decode", 0), ("decode_raw", 0)] + [(p, int(s)) for p in args.paths.split(",") for s in args.shuffle.split(",")]
    results: dict[tuple[str, int], list[dict[str, Any]]] = {r: [] for r in runs}
    for rnd in range(args.rounds):
        for path, shuffle in runs:
            out = subprocess.run([sys.executable, __file__, "--one", path, str(shuffle), args.data, args.source],
                                 capture_output=True, text=True, check=False)
            if out.returncode:
                print(out.stderr[-2000:], file=sys.stderr)
                return 1
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results[(path, shuffle)].append(r)
            print(f"round {rnd + 1} {path:16s} shuffle={shuffle:<5d} rows={r['rows']} "
                  f"cpu={r['cpu']:.2f}s (main process {r.get('main_cpu', r['cpu']):.2f}s) wall={r['wall']:.2f}s  {1000 * 1000 * r['cpu'] / r['rows']:.1f} ms/1k rows",
                  file=sys.stderr, flush=True)
    report(results, args.rounds)
    return 0


def _mmm(values: list[float]) -> str:
    return f"{min(values):6.1f} {statistics.median(values):6.1f} {max(values):6.1f}"


def report(results: dict[tuple[str, int], list[dict[str, Any]]], rounds: int) -> None:
    """The table: CPU ms per 1,000 rows, whole epoch; its non-decode part against the reference
    decode loop and against the decode the path itself did; the main process's own share."""
    dec = statistics.median(1e6 * r["cpu"] / r["rows"] for r in results[("decode", 0)])
    print(f"\nCPU ms per 1,000 rows, {rounds} rounds (min / median / max). non-decode = total - the decode_image "
          f"loop's median ({dec:.1f}); in-path decode = CPU in decode_images_into during the path; "
          "non-decode' = total - in-path decode; main = the main process's own CPU")
    print(f"{'path':26s} {'total':>20s}  {'non-decode':>20s}  {'in-path decode':>20s}  {'non-decode prime':>20s}"
          f"  {'main':>6s} {'rows/s':>8s}")
    for (path, shuffle), runs in results.items():
        total = [1e6 * r["cpu"] / r["rows"] for r in runs]
        inpath = [1e6 * r["decode_cpu"] / r["rows"] for r in runs]
        own = [t - d for t, d in zip(total, inpath)]
        main = statistics.median(1e6 * r["main_cpu"] / r["rows"] for r in runs)
        rate = statistics.median(r["rows"] / r["wall"] for r in runs)
        label = f"{path}{' shuffled' if shuffle else ''}"
        print(f"{label:26s} {_mmm(total)}  {_mmm([t - dec for t in total])}  {_mmm(inpath)}  {_mmm(own)}"
              f"  {main:6.1f} {rate:8,.0f}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
