"""Training straight from object storage: unihub and its peers reading one epoch from a local S3 (issue 41).

One command starts a moto S3 server (server mode, its own process) on 127.0.0.1 and, in this process, a
proxy in front of it (``s3_proxy.py``) that adds a per-request latency (``--latency``, ms, each value a
separate set of rounds) and a bandwidth cap (``--bandwidth`` MB/s, all connections together), and logs
every request. The same content as ``peers.py`` (``benchmarks/data/peers_<rows>[_<side>px]``, its copies
written by each tool in its own format: run ``peers.py --prepare`` first) is uploaded once, and each tool
reads one epoch, batch 64, images decoded by simplejpeg, through the proxy, in a fresh process in its own
venv (``streaming_side.py``; ``peers_env.py`` builds the peers' venvs):

- unihub: ``BatchedDataLoader(make_batch_reader("s3://..."))`` over s3fs (and the same copy read from the
  local disk, the "local" row, for the ">= 0.8x its local rate" target);
- LitData ``StreamingDataset``, MosaicML Streaming ``StreamingDataset(remote=...)`` (boto3; the stand-in
  torchvision of ``peers_env.py``), Lance's scanner over its object-store client, Ray Data ``read_parquet``
  over pyarrow's S3 filesystem, WebDataset over ``pipe:curl``, HF ``datasets`` ``streaming=True`` over
  fsspec's HTTP filesystem (the peers' venvs have no s3fs; moto needs no signature, so plain URLs of the
  same objects work).

Per run: rows/s (from creating the pipeline), time to first batch, CPU per 1,000 rows (process tree),
peak RSS of the tree (polled every 20 ms), and from the proxy's log the GET requests and bytes fetched;
rounds alternate the contenders; min / median / max. ``--ranks 2`` adds unihub as two processes (one shard
each) sharing one local-disk cache directory. ``--timeline TOOL`` writes each GET of that tool's last run
(start, end, bytes, range) as JSON lines to ``--out``.

    python benchmarks/streaming.py [--rounds 3] [--latency 0,20] [--bandwidth 200] [--rows 20000]
    python benchmarks/streaming.py --quick      # 1 round, 20 ms only, unihub and the peers whose venvs exist
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peers_env  # noqa: E402
from peers import copy_name, run_child  # noqa: E402
from proc_cpu import tree_cpu_seconds  # noqa: E402
from s3_proxy import MotoServer, Proxy, Request, moto_script  # noqa: E402

SIDE = HERE / "streaming_side.py"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true"}


@dataclass(frozen=True)
class Tool:
    """One contender: a streaming_side pipeline, the venv it runs in (a peers_env name or unihub), its copy."""

    label: str
    tool: str
    venv: str
    fmt: str
    options: dict[str, Any] = field(default_factory=dict)
    local: bool = False  # unihub reading the copy from the local disk (no proxy)
    ranks: int = 1


#: packages a peer needs to read from S3 that its venv (peers_env.py) lacks, installed beside it with
#: ``pip install --target benchmarks/.venvs/NAME-s3`` (its own packages stay first on its path)
S3_EXTRAS = {"hf": ("s3fs",)}


def extra_path(venv: str, python: Path) -> str | None:
    """The folder of ``S3_EXTRAS[venv]``, installed there by ``python``'s pip the first time."""
    packages = S3_EXTRAS.get(venv)
    if not packages:
        return None
    target = peers_env.VENVS / f"{venv}-s3"
    if not (target / ".complete").exists():
        subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "--target",
                        str(target), *packages], check=True, timeout=1800)
        (target / ".complete").write_text(" ".join(packages))
    return str(target)


TOOLS = [
    Tool("unihub BatchedDataLoader(make_batch_reader), pyarrow S3", "s3_unihub", "unihub", "unihub",
         {"filesystem": "pyarrow"}),
    Tool("unihub BatchedDataLoader(make_batch_reader), s3fs", "s3_unihub", "unihub", "unihub"),
    Tool("unihub, local disk (reference, no proxy)", "unihub_batched", "unihub", "unihub", local=True),
    Tool("LitData StreamingDataset, 2 workers", "s3_litdata", "litdata", "litdata", {"workers": 2}),
    Tool("MosaicML StreamingDataset, 2 workers", "s3_mosaic", "mosaic", "mosaic", {"workers": 2}),
    Tool("WebDataset pipe:curl, 2 workers", "s3_wds", "wds", "wds", {"workers": 2}),
    Tool("HF datasets streaming=True (s3fs)", "s3_hf", "hf", "hf", {"workers": 0, "threads": 2}),
    Tool("Ray Data read_parquet (pyarrow S3)", "s3_ray", "ray", "parquet"),
    Tool("Lance to_batches over S3", "s3_lance", "lance", "lance", {"threads": 2}),
]
RANKED = Tool("unihub, 2 ranks (2 processes), one local-disk cache", "s3_unihub", "unihub", "unihub",
              {"filesystem": "pyarrow"}, ranks=2)


def python_of(venv: str) -> Path | None:
    if venv == "unihub":
        return Path(sys.executable)
    path = peers_env.venv_python(venv)
    return path if path.exists() else None


@dataclass
class Tally:
    tool: Tool
    runs: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    def values(self, key: str) -> list[float]:
        return [float(r[key]) for r in self.runs if r.get(key) is not None]


def _gets(log: list[Request]) -> tuple[int, int]:
    gets = [r for r in log if r.method == "GET"]
    return len(gets), sum(r.nbytes for r in gets)


def run_ranked(python: Path, jobs: list[dict[str, Any]], timeout: float) -> dict[str, Any]:
    """``jobs`` (one per rank) at once, each in its own process; rows summed, time the slowest rank's."""
    results: list[dict[str, Any]] = [{} for _ in jobs]

    def one(i: int) -> None:
        results[i] = run_child(python, jobs[i], timeout, side=SIDE, pss=False)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        return {"error": errors[0]}
    seconds = max(r["seconds"] for r in results)
    return {"rows": sum(r["rows"] for r in results), "seconds": seconds, "ttfb": max(r["ttfb"] for r in results),
            "cpu_s": sum(r["cpu_s"] for r in results), "peak_rss_mib": sum(r["peak_rss_mib"] for r in results)}


def run_one(tool: Tool, python: Path, proxy: Proxy, moto: MotoServer, copies: dict[str, str],
            args: Any) -> dict[str, Any]:
    job = {"tool": tool.tool, "bucket": args.bucket, "endpoint": proxy.endpoint, "probes": [], "shuffle": 0,
           "workers": 0, "extra_path": extra_path(tool.venv, python), **tool.options}
    if tool.local:
        job["data"] = f"file://{copies['local:' + tool.fmt]}"
    else:
        job["data"] = copies[tool.fmt]
    proxy.label = tool.label
    proxy.take_log()
    server_cpu = tree_cpu_seconds(moto.pid) + time.process_time()  # moto's process, and the proxy (this one)
    if tool.ranks > 1:
        with tempfile.TemporaryDirectory(prefix="uh-stream-cache-") as cache:
            jobs = [dict(job, rank=r, shard_count=tool.ranks, cache_dir=cache) for r in range(tool.ranks)]
            result = run_ranked(python, jobs, args.timeout)
    else:
        result = run_child(python, job, args.timeout, side=SIDE, pss=False)
    log = proxy.take_log()
    result["server_cpu_s"] = tree_cpu_seconds(moto.pid) + time.process_time() - server_cpu
    result["gets"], result["get_bytes"] = _gets(log)
    result["log"] = log
    return result


def upload(moto: MotoServer, root: Path, tools: list[Tool]) -> tuple[dict[str, str], dict[str, Path]]:
    """Each copy the tools read, uploaded once: fmt -> its prefix in the bucket (and ``local:fmt`` -> its
    folder); and every object's local file (``Proxy.serve``)."""
    copies: dict[str, str] = {}
    objects: dict[str, Path] = {}
    for fmt in sorted({t.fmt for t in tools}):
        folder = root / copy_name(fmt)
        if not folder.exists():
            raise SystemExit(f"{folder} is missing: run `python benchmarks/peers.py --prepare --rows ...` first")
        objects.update(moto.upload_folder(folder, copy_name(fmt)))
        copies[fmt] = copy_name(fmt)
        copies["local:" + fmt] = str(folder)
    return copies, objects


def _fmt(values: list[float], digits: int = 0) -> str:
    if not values:
        return "-"
    values = sorted(values)
    return f"{values[0]:,.{digits}f} / {statistics.median(values):,.{digits}f} / {values[-1]:,.{digits}f}"


def report(tallies: dict[tuple[str, int], Tally], latencies: list[int], args: Any) -> list[str]:
    lines = [f"rows {args.rows}, side {args.side or 64}px, bandwidth cap {args.bandwidth} MB/s, "
             f"{args.rounds} round(s); figures min / median / max", "",
             "| tool | latency | rows/s | steady rows/s | first batch (s) | CPU ms / 1k rows | server CPU ms / 1k rows "
             "| GETs | MB fetched | peak RSS (MiB) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for latency in latencies:
        for (label, lat), t in tallies.items():
            if lat != latency:
                continue
            if t.error and not t.runs:
                lines.append(f"| {label} | {latency} ms | {t.error} | | | | | | | |")
                continue
            rates = [r["rows"] / r["seconds"] for r in t.runs]
            cpu = [1e6 * r["cpu_s"] / r["rows"] for r in t.runs if r.get("cpu_s")]
            server = [1e6 * r["server_cpu_s"] / r["rows"] for r in t.runs if r.get("gets")]
            lines.append(f"| {label} | {latency} ms | {_fmt(rates)} | {_fmt(t.values('steady'))} | "
                         f"{_fmt(t.values('ttfb'), 2)} | {_fmt(cpu)} | {_fmt(server)} | "
                         f"{_fmt(t.values('gets'))} | {_fmt([b / 1e6 for b in t.values('get_bytes')], 1)} | "
                         f"{_fmt(t.values('peak_rss_mib'))} |")
    lines += ["", *targets(tallies, latencies)]
    return lines


def targets(tallies: dict[tuple[str, int], Tally], latencies: list[int]) -> list[str]:
    """The issue's targets at the highest latency, on medians (unihub: its faster filesystem)."""
    latency = max(latencies)

    def median_rate(t: Tally) -> float:
        return statistics.median(r["rows"] / r["seconds"] for r in t.runs)

    at = {label: t for (label, lat), t in tallies.items() if lat == latency and t.runs}
    ours_all = [t for t in at.values() if t.tool.venv == "unihub" and not t.tool.local and t.tool.ranks == 1]
    local = next((t for t in at.values() if t.tool.local), None)  # run in the same rounds
    peers = [t for t in at.values() if t.tool.venv != "unihub"]
    if not ours_all:
        return ["targets: unihub did not run"]
    ours = max(ours_all, key=median_rate)
    out = []
    if peers:
        fastest = max(peers, key=median_rate)
        ratio = median_rate(ours) / median_rate(fastest)
        out.append(f"- rows/s at {latency} ms: {ours.tool.label} {median_rate(ours):,.0f} = {ratio:.2f}x the fastest "
                   f"peer ({fastest.tool.label}, {median_rate(fastest):,.0f}); target >= 1.3x: "
                   f"{'met' if ratio >= 1.3 else 'MISSED'}")
        ttfb, theirs = statistics.median(ours.values("ttfb")), statistics.median(fastest.values("ttfb"))
        out.append(f"- time to first batch at {latency} ms: {ttfb:.2f} s, the fastest peer's {theirs:.2f} s; "
                   f"target <=: {'met' if ttfb <= theirs else 'MISSED'}")
    if local is not None:
        ratio = median_rate(ours) / median_rate(local)
        out.append(f"- at {latency} ms = {ratio:.2f}x unihub's local rate ({median_rate(local):,.0f} rows/s); "
                   f"target >= 0.8x: {'met' if ratio >= 0.8 else 'MISSED'}")
    return out


def write_timeline(log: list[Request], path: Path) -> None:
    t0 = min((r.start for r in log), default=0.0)
    with open(path, "w") as f:
        for r in log:
            f.write(json.dumps({"method": r.method, "path": r.path, "range": r.range, "status": r.status,
                                "bytes": r.nbytes, "start_ms": round(1000 * (r.start - t0), 1),
                                "end_ms": round(1000 * (r.end - t0), 1)}) + "\n")


def parse(argv: list[str] | None) -> Any:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--side", type=int, default=0, help="image side of the content (0: peers.py's 64 px)")
    ap.add_argument("--latency", default="0,20", help="ms added to each request, comma-separated")
    ap.add_argument("--bandwidth", type=float, default=200.0, help="MB/s, all connections together (0: no cap)")
    ap.add_argument("--only", default="", help="comma-separated venv names (unihub, litdata, mosaic, wds, hf, ray, "
                                               "lance)")
    ap.add_argument("--ranks", type=int, default=2, help="unihub ranks sharing one cache (1: leave that row out)")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--timeline", default="", help="a tool label prefix whose GET timeline to write")
    ap.add_argument("--out", default="", help="folder for timelines and the report (default: a temp folder)")
    ap.add_argument("--moto-gets", action="store_true",
                    help="send object GETs to moto too (it reads the whole object for each ranged GET)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--bucket", default="bench")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.latency = 1, "20"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    latencies = [int(v) for v in args.latency.split(",") if v.strip()]
    root = HERE / "data" / (f"peers_{args.rows}" + (f"_{args.side}px" if args.side else ""))
    only = {v for v in args.only.split(",") if v}
    tools = [t for t in TOOLS if not only or t.venv in only] + ([RANKED] if args.ranks > 1 and
                                                                 (not only or "unihub" in only) else [])
    pythons = {t.venv: python_of(t.venv) for t in tools}
    out = Path(args.out or tempfile.mkdtemp(prefix="uh-streaming-"))
    out.mkdir(parents=True, exist_ok=True)
    os.environ.update(CREDENTIALS)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(name, None)
    moto = MotoServer(moto_script(sys.executable), args.bucket)
    tallies: dict[tuple[str, int], Tally] = {}
    try:
        copies, objects = upload(moto, root, tools)
        for latency in latencies:
            proxy = Proxy(moto.address, latency / 1000, args.bandwidth * 1e6 if args.bandwidth else None)
            if not args.moto_gets:
                proxy.serve(objects)
            try:
                for round_ in range(args.rounds):
                    for tool in tools:
                        tally = tallies.setdefault((tool.label, latency), Tally(tool))
                        python = pythons[tool.venv]
                        if python is None:
                            tally.error = f"no venv ({peers_env.__name__}.py {tool.venv} builds it)"
                            continue
                        result = run_one(tool, python, proxy, moto, copies, args)
                        log = result.pop("log")
                        if "error" in result:
                            tally.error = result["error"]
                            print(f"  {tool.label} @ {latency} ms: {result['error']}", flush=True)
                            continue
                        tally.runs.append(result)
                        print(f"  round {round_ + 1} {tool.label} @ {latency} ms: "
                              f"{result['rows'] / result['seconds']:,.0f} rows/s, ttfb {result['ttfb']:.2f} s, "
                              f"{result['gets']} GETs, {result['get_bytes'] / 1e6:.1f} MB, "
                              f"{result['peak_rss_mib']:.0f} MiB", flush=True)
                        if args.timeline and tool.label.startswith(args.timeline):
                            write_timeline(log, out / f"timeline-{tool.tool}-{latency}ms.jsonl")
            finally:
                proxy.close()
    finally:
        moto.close()
    lines = report(tallies, latencies, args)
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\n(written to {out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
