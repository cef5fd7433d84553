"""The Petastorm 0.13.1 half of the side-by-side benchmarks. Runs INSIDE ``.venv-petastorm``.

It cannot import unihub (that venv has the old pyarrow/numpy Petastorm needs), so the
unihub side drives it as a subprocess: a JSON job in, a JSON result out (the result is
the only thing written to stdout; everything Petastorm, Spark or TF print goes to stderr).

    .venv-petastorm/bin/python benchmarks/petastorm_side.py '{"kind": "make_reader", "url": "file:///..."}'
    echo '{"kind": "make_batch_reader", "url": "file:///..."}' | .venv-petastorm/bin/python benchmarks/petastorm_side.py
    .venv-petastorm/bin/python benchmarks/petastorm_side.py sweep --url file:///... [--tries 10]

Job keys (defaults in brackets):

* ``kind``: ``make_reader`` | ``make_batch_reader`` | ``pytorch_dataloader`` |
  ``pytorch_batched_dataloader`` | ``tf_dataset``
* ``url``: dataset URL (``file:///...``); required
* ``schema_fields`` [null = all]: list of field names (regex patterns, as Petastorm takes them)
* ``reader_pool_type`` ["process"]: ``thread`` | ``process`` | ``dummy``
* ``workers_count`` [2], ``num_epochs`` [1], ``shuffle`` [false] (shuffle_row_groups),
  ``results_queue_size`` [Petastorm's default], ``reader_kwargs`` [{}]: more make_reader kwargs
* ``repeats`` [1]: run the whole thing this many times, report the best
* ``expected_rows`` [null]: when set, a run that yields another count is marked ``ok: false``
* ``timeout_s`` [600]: a run still going after this is abandoned (``timed_out: true``)
* ``batch_size`` [64], ``shuffling_queue_capacity`` [0]: for the loader kinds

Each run is timed from creating the reader to the end of iteration (reader creation and
worker start-up included: that is what a user pays; imports are not). No warm-up run.
Result::

    {"kind": ..., "rows": n, "seconds": t, "rows_per_s": r,   # best run (fastest ok run)
     "cpu_s": c,   # user + system CPU seconds of the process tree over the best run
     "runs": [{"rows": n, "seconds": t, "cpu_s": c, "ok": bool, "error": str|null}, ...], "ok": bool}

``ok`` is true when every run was ok. ``rows`` counts rows (for the batch kinds, the sum of
batch lengths), times ``num_epochs``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
import warnings

from proc_cpu import tree_cpu_seconds  # stdlib only: the process tree's CPU, as unihub's side measures it

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Petastorm 0.13.1 on pyarrow 14 warns (FutureWarning/DeprecationWarning) on every row group.
os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning,ignore::DeprecationWarning")
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=DeprecationWarning)

DEFAULTS = {
    "schema_fields": None,
    "reader_pool_type": "process",
    "workers_count": 2,
    "num_epochs": 1,
    "shuffle": False,
    "results_queue_size": None,
    "reader_kwargs": {},
    "repeats": 1,
    "expected_rows": None,
    "timeout_s": 600,
    "batch_size": 64,
    "shuffling_queue_capacity": 0,
}


class _Timeout(Exception):
    pass


def _on_alarm(signum, frame):  # noqa: ARG001
    raise _Timeout()


def _reader_kwargs(job: dict) -> dict:
    kw = {
        "reader_pool_type": job["reader_pool_type"],
        "workers_count": job["workers_count"],
        "num_epochs": job["num_epochs"],
        "shuffle_row_groups": bool(job["shuffle"]),
    }
    if job["schema_fields"] is not None:
        kw["schema_fields"] = list(job["schema_fields"])
    if job["results_queue_size"] is not None:
        kw["results_queue_size"] = job["results_queue_size"]
    kw.update(job["reader_kwargs"] or {})
    return kw


def _run_make_reader(job: dict) -> int:
    from petastorm import make_reader

    rows = 0
    with make_reader(job["url"], **_reader_kwargs(job)) as reader:
        fields = None
        for row in reader:
            if fields is None:
                fields = row._fields
            for f in fields:  # touch every field
                getattr(row, f)
            rows += 1
    return rows


def _run_make_batch_reader(job: dict) -> int:
    from petastorm import make_batch_reader

    rows = 0
    with make_batch_reader(job["url"], **_reader_kwargs(job)) as reader:
        for batch in reader:
            n = len(batch[0])
            for col in batch:  # touch every column
                assert len(col) == n
            rows += n
    return rows


def _run_torch_loader(job: dict, batched: bool) -> int:
    """petastorm.pytorch.DataLoader over make_reader, or BatchedDataLoader over make_batch_reader."""
    import petastorm
    import petastorm.pytorch

    make = petastorm.make_batch_reader if batched else petastorm.make_reader
    loader_class = petastorm.pytorch.BatchedDataLoader if batched else petastorm.pytorch.DataLoader
    rows = 0
    with loader_class(make(job["url"], **_reader_kwargs(job)), batch_size=job["batch_size"],
                      shuffling_queue_capacity=job["shuffling_queue_capacity"]) as loader:
        for batch in loader:
            rows += len(next(iter(batch.values())))
    return rows


def _run_pytorch_dataloader(job: dict) -> int:
    return _run_torch_loader(job, batched=False)


def _run_pytorch_batched_dataloader(job: dict) -> int:
    return _run_torch_loader(job, batched=True)


def _run_tf_dataset(job: dict) -> int:
    import tensorflow as tf  # noqa: F401
    from petastorm import make_reader
    from petastorm.tf_utils import make_petastorm_dataset

    rows = 0
    with make_reader(job["url"], **_reader_kwargs(job)) as reader:
        ds = make_petastorm_dataset(reader)
        if job["shuffling_queue_capacity"]:
            ds = ds.shuffle(job["shuffling_queue_capacity"])
        for batch in ds.batch(job["batch_size"]):
            rows += int(batch[0].shape[0])
    return rows


KINDS = {
    "make_reader": _run_make_reader,
    "make_batch_reader": _run_make_batch_reader,
    "pytorch_dataloader": _run_pytorch_dataloader,
    "pytorch_batched_dataloader": _run_pytorch_batched_dataloader,
    "tf_dataset": _run_tf_dataset,
}


def run_job(job: dict) -> dict:
    job = {**DEFAULTS, **job}
    if job.get("kind") not in KINDS:
        raise ValueError(f"unknown kind {job.get('kind')!r}; one of {sorted(KINDS)}")
    if not job.get("url"):
        raise ValueError("job needs a 'url'")
    fn = KINDS[job["kind"]]
    # Import outside the timed region (a user's process has them imported already).
    import petastorm  # noqa: F401
    import petastorm.reader  # noqa: F401
    if job["kind"] in ("pytorch_dataloader", "pytorch_batched_dataloader"):
        import petastorm.pytorch  # noqa: F401
    if job["kind"] == "tf_dataset":
        import petastorm.tf_utils  # noqa: F401

    runs = []
    old = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        for _ in range(max(1, int(job["repeats"]))):
            run = {"rows": None, "seconds": None, "ok": False, "error": None, "timed_out": False}
            signal.alarm(int(job["timeout_s"]))
            cpu0, t0 = tree_cpu_seconds(), time.perf_counter()
            try:
                run["rows"] = fn(job)
                run["seconds"] = time.perf_counter() - t0
                run["cpu_s"] = round(tree_cpu_seconds() - cpu0, 3)
                run["ok"] = job["expected_rows"] is None or run["rows"] == job["expected_rows"]
                if not run["ok"]:
                    run["error"] = f"expected {job['expected_rows']} rows, got {run['rows']}"
            except _Timeout:
                run["seconds"] = time.perf_counter() - t0
                run["timed_out"] = True
                run["error"] = f"timed out after {job['timeout_s']}s"
            except Exception as exc:  # noqa: BLE001 - reported, not raised
                run["seconds"] = time.perf_counter() - t0
                run["error"] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc(file=sys.stderr)
            finally:
                signal.alarm(0)
            runs.append(run)
            if run["timed_out"]:
                break  # the abandoned reader may still hold workers; do not pile more on
    finally:
        signal.signal(signal.SIGALRM, old)

    good = [r for r in runs if r["ok"]]
    best = min(good, key=lambda r: r["seconds"]) if good else runs[-1]
    seconds = best["seconds"] or 0.0
    return {
        "kind": job["kind"],
        "reader_pool_type": job["reader_pool_type"],
        "workers_count": job["workers_count"],
        "schema_fields": job["schema_fields"],
        "rows": best["rows"],
        "seconds": round(seconds, 4),
        "cpu_s": best.get("cpu_s"),
        "rows_per_s": round(best["rows"] / seconds, 1) if best["rows"] and seconds else 0.0,
        "ok": len(good) == len(runs),
        "runs": [{**r, "seconds": round(r["seconds"], 4) if r["seconds"] is not None else None} for r in runs],
    }


def versions() -> dict:
    import numpy
    import petastorm
    import pyarrow

    v = {"petastorm": petastorm.__version__, "pyarrow": pyarrow.__version__, "numpy": numpy.__version__}
    try:
        import torch
        v["torch"] = torch.__version__
    except ImportError:
        v["torch"] = None
    return v


# --------------------------------------------------------------------------------------
# sweep: which pool setting is best here, and how reliable is each
# --------------------------------------------------------------------------------------

def sweep(argv: list[str]) -> int:
    """Run a reader over pool types x workers, each try in a fresh process; print a table.

    The table goes to stderr as it fills; one JSON summary line goes to stdout at the end.
    """
    import argparse

    ap = argparse.ArgumentParser(prog="petastorm_side.py sweep")
    ap.add_argument("--url", required=True)
    ap.add_argument("--kind", default="make_reader", choices=sorted(KINDS))
    ap.add_argument("--expected-rows", type=int, default=10_000)
    ap.add_argument("--tries", type=int, default=10, help="fresh-process tries per setting")
    ap.add_argument("--pools", default="thread,process,dummy")
    ap.add_argument("--workers", default="1,2,3,4")
    ap.add_argument("--fields", action="append", default=None,
                    help="comma-separated schema_fields; repeat for several sets; 'all' = every field")
    ap.add_argument("--timeout-s", type=int, default=120)
    ap.add_argument("--json-out", help="also write all results to this JSON file")
    args = ap.parse_args(argv)

    field_sets = [None if f == "all" else f.split(",") for f in (args.fields or ["all", "id,label"])]
    results = []
    print("| fields | pool | workers | ok tries | best rows/s | median rows/s | failures |", file=sys.stderr)
    print("|---|---|---:|---:|---:|---:|---|", file=sys.stderr)
    for fields in field_sets:
        for pool in args.pools.split(","):
            for workers in ([1] if pool == "dummy" else [int(w) for w in args.workers.split(",")]):
                job = {"kind": args.kind, "url": args.url, "schema_fields": fields,
                       "reader_pool_type": pool, "workers_count": workers,
                       "expected_rows": args.expected_rows, "timeout_s": args.timeout_s}
                tries = []
                for _ in range(args.tries):
                    try:
                        proc = subprocess.run([sys.executable, __file__, json.dumps(job)], capture_output=True,
                                              text=True, timeout=args.timeout_s + 60)
                        out = json.loads(proc.stdout.strip().splitlines()[-1])
                        tries.append(out["runs"][0])
                    except (subprocess.TimeoutExpired, IndexError, json.JSONDecodeError) as exc:
                        tries.append({"rows": None, "seconds": None, "ok": False, "error": repr(exc)[:200]})
                ok = [t for t in tries if t["ok"]]
                rates = sorted(t["rows"] / t["seconds"] for t in ok)
                fails = {}
                for t in tries:
                    if not t["ok"]:
                        key = f"rows={t['rows']}" if t.get("rows") is not None else (t["error"] or "?")[:60]
                        fails[key] = fails.get(key, 0) + 1
                rec = {"fields": fields or "all", "pool": pool, "workers": workers, "tries": len(tries),
                       "ok_tries": len(ok), "best_rows_per_s": round(rates[-1], 1) if rates else 0.0,
                       "median_rows_per_s": round(rates[len(rates) // 2], 1) if rates else 0.0,
                       "failures": fails, "runs": tries}
                results.append(rec)
                print(f"| {','.join(fields) if fields else 'all'} | {pool} | {workers} | {len(ok)}/{len(tries)} "
                      f"| {rec['best_rows_per_s']:,.0f} | {rec['median_rows_per_s']:,.0f} | {fails or ''} |",
                      file=sys.stderr, flush=True)
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"versions": versions(), "results": results}, fh, indent=2)
    print(json.dumps({"versions": versions(), "results": [{k: v for k, v in r.items() if k != "runs"}
                                                           for r in results]}))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "sweep":
        return sweep(argv[1:])
    if argv and argv[0] == "versions":
        print(json.dumps(versions()))
        return 0
    text = argv[0] if argv else sys.stdin.read()
    job = json.loads(text)
    # Only the result goes to the real stdout: anything else (Petastorm, Spark, TF, worker
    # processes that inherit fd 1) is sent to stderr.
    real_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        result = run_job(job)
    finally:
        sys.stdout.flush()
        os.dup2(real_stdout, 1)
        os.close(real_stdout)
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
