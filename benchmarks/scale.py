"""Conversion at scale (issue 13): throughput and peak RSS against row size, per engine.

Input: TFRecord shards of ``tf.train.Example`` records (``id`` int64, ``data`` bytes) with rows of
1 KB, 100 KB and 6 MB (a camera frame), 4 shards per size, written once into ``--data`` (default:
a temporary directory). Each contender converts them into a unihub dataset in a **fresh
subprocess**, and reports its time and the peak RSS of that process above its RSS after the
imports (``VmHWM``; forked workers' peak apart, from ``RUSAGE_CHILDREN``):

- ``local, workers=1`` and ``local, workers=2`` (:func:`unihub.convert`);
- ``S3 (moto)``: the same conversion with its output on ``s3://`` of a moto S3 server that this
  script starts on 127.0.0.1;
- ``Spark standalone, 1 worker`` / ``2 workers``: ``engine='spark'`` against a cluster started by
  ``tests/spark_cluster.py``'s ``start_spark_cluster(workers=...)`` (the executors' JVMs are other
  processes of the cluster: their memory is not in these figures).

A contender that cannot run (no moto, no cluster helper, an error) is a row ``failed: <reason>``,
never left out. Runs alternate between contenders, ``--repeats`` rounds; times are min / median /
max. Then peak RSS against row size for ``write_dataset`` (rows given in Python) and for reading
the converted dataset with ``make_batch_reader``.

    python benchmarks/scale.py [--repeats 3] [--quick] [--only local1,local2,s3,spark1,spark2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

MB = 2**20
#: row size name -> (bytes per row, total input MB full, total input MB with --quick)
SIZES = {"1 KB": (1024, 256, 8), "100 KB": (100 * 1024, 256, 16), "6 MB": (6 * MB, 384, 48)}
SHARDS = 4
BUCKET = "unihub-scale"
CONTENDERS = {"local1": "local, workers=1", "local2": "local, workers=2", "s3": "S3 (moto), workers=1",
              "spark1": "Spark standalone, 1 worker", "spark2": "Spark standalone, 2 workers"}

#: what both child scripts read their memory with: a /proc/self/status field in KiB
KIB = textwrap.dedent("""
    def kib(key):
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
""")

CHILD = KIB + textwrap.dedent("""
    import json, os, resource, sys, time
    from unihub import convert

    job = json.loads(sys.argv[1])
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = kib("VmRSS")
    start = time.perf_counter()
    result = convert(job["src"], job["dst"], **job["kwargs"])
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "rows": result.rows, "peak_mib": (kib("VmHWM") - base) / 1024,
                      "children_peak_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
""")

PROBE = KIB + textwrap.dedent("""
    import json, sys
    import numpy as np
    from unihub import ScalarCodec, Unischema, UnischemaField, make_batch_reader, write_dataset
    import pyarrow as pa

    def reset():
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return kib("VmRSS")

    job = json.loads(sys.argv[1])
    size, rows = job["size"], job["rows"]
    schema = Unischema("Scale", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                 UnischemaField("data", np.bytes_, (), ScalarCodec(pa.binary()), False)])
    value = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8).tobytes()
    if job["what"] == "write":
        base = reset()
        write_dataset(job["dst"], schema, ({"id": i, "data": value} for i in range(rows)), compression=None)
    else:
        base = reset()
        n = 0
        with make_batch_reader(job["dst"], workers_count=2) as reader:
            for batch in reader:
                n += len(batch.id)
        assert n == rows, n
    print(json.dumps({"peak_mib": (kib("VmHWM") - base) / 1024}))
""")


@dataclass
class Outcome:
    """The runs of one contender on one row size."""

    seconds: list[float] = field(default_factory=list)
    peaks: list[float] = field(default_factory=list)
    children: list[float] = field(default_factory=list)
    failed: str | None = None


def write_inputs(root: Path, quick: bool) -> dict[str, tuple[Path, int, int]]:
    """TFRecord shards per row size: name -> (directory, rows, input bytes)."""
    from unihub.formats.tfrecord.example import encode_example, encode_feature
    from unihub.formats.tfrecord.records import write_records

    inputs = {}
    for name, (size, full_mb, quick_mb) in SIZES.items():
        rows = max(SHARDS, (quick_mb if quick else full_mb) * MB // size)
        folder = root / f"tfr-{size}"
        if not folder.exists():
            folder.mkdir(parents=True)
            value = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8).tobytes()
            per = -(-rows // SHARDS)
            for shard in range(SHARDS):
                ids = range(shard * per, min(rows, (shard + 1) * per))
                write_records(str(folder / f"part-{shard}.tfrecord"),
                              (encode_example({"id": encode_feature("int64", [i]),
                                               "data": encode_feature("bytes", [value])}) for i in ids))
        inputs[name] = (folder, rows, sum(p.stat().st_size for p in folder.iterdir()))
    return inputs


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 with bucket ``BUCKET``; yields its endpoint URL."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        _s3_client(endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.stop()


S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
          "AWS_EC2_METADATA_DISABLED": "true"}


def _s3_client(endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                        region_name="us-east-1")


@contextlib.contextmanager
def spark_cluster(workers: int) -> Iterator[str]:
    """A Spark standalone cluster from ``tests/spark_cluster.py`` (the ``pipe`` part of issue 13);
    yields its master URL."""
    try:
        from unihub.tests.spark_cluster import start_spark_cluster  # type: ignore[import-not-found]
    except ImportError as exc:
        raise RuntimeError(f"tests/spark_cluster.py has no start_spark_cluster here ({exc})") from None
    cluster = start_spark_cluster(workers=workers)
    with (cluster if hasattr(cluster, "__enter__") else contextlib.nullcontext(cluster)) as running:
        master = running if isinstance(running, str) else (getattr(running, "master", None)
                                                           or getattr(running, "master_url", None)
                                                           or getattr(running, "url", None))
        if not isinstance(master, str):
            raise RuntimeError(f"start_spark_cluster gave {running!r}, not a master URL")
        yield master
    stop = getattr(cluster, "stop", None)
    if callable(stop) and not hasattr(cluster, "__enter__"):
        stop()


def run_child(job: dict[str, Any], env: dict[str, str], cwd: Path, timeout: float) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(job)], capture_output=True, text=True,
                         env=env, cwd=cwd, timeout=timeout)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(last[:300])
    return json.loads(out.stdout.strip().splitlines()[-1])


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env.update(extra or {})
    return env


def measure(args: argparse.Namespace, inputs: dict[str, tuple[Path, int, int]], work: Path,
            ) -> dict[tuple[str, str], Outcome]:
    """Every contender on every row size, alternated, ``args.repeats`` rounds."""
    chosen = [c for c in args.only.split(",") if c]
    results = {(size, c): Outcome() for size in inputs for c in chosen}
    with contextlib.ExitStack() as stack:
        masters: dict[str, str] = {}
        endpoint = None
        if "s3" in chosen:
            try:
                endpoint = stack.enter_context(moto_server())
            except Exception as exc:  # noqa: BLE001  (reported as the contender's row)
                for size in inputs:
                    results[(size, "s3")].failed = f"moto server: {type(exc).__name__}: {exc}"
        for name, workers in (("spark1", 1), ("spark2", 2)):
            if name in chosen:
                try:
                    masters[name] = stack.enter_context(spark_cluster(workers))
                except Exception as exc:  # noqa: BLE001
                    for size in inputs:
                        results[(size, name)].failed = f"{type(exc).__name__}: {exc}"
        for round_ in range(args.repeats):
            order = chosen if round_ % 2 == 0 else chosen[::-1]
            for size, (folder, rows, _) in inputs.items():
                for contender in order:
                    outcome = results[(size, contender)]
                    if outcome.failed:
                        continue
                    cwd = Path(tempfile.mkdtemp(dir=work, prefix="run-"))  # what a run leaves is removed
                    dst, env = str(cwd / "out"), child_env()
                    kwargs: dict[str, Any] = {"progress": False}
                    if contender in ("local1", "local2", "s3"):
                        kwargs["workers"] = 2 if contender == "local2" else 1
                    if contender == "s3":
                        dst = f"s3://{BUCKET}/run-{round_}-{size.replace(' ', '')}"
                        env = child_env({**S3_ENV, "AWS_ENDPOINT_URL": endpoint or ""})
                    if contender in masters:
                        kwargs.update(engine="spark", master=masters[contender])
                    try:
                        got = run_child({"src": str(folder), "dst": dst, "kwargs": kwargs}, env, cwd, args.timeout)
                        if got["rows"] != rows:
                            raise RuntimeError(f"{got['rows']} rows converted, {rows} in the input")
                        if contender == "s3":
                            check_s3(endpoint or "", dst, cwd)
                        outcome.seconds.append(got["seconds"])
                        outcome.peaks.append(got["peak_mib"])
                        outcome.children.append(got["children_peak_mib"])
                    except Exception as exc:  # noqa: BLE001
                        outcome.failed = f"{type(exc).__name__}: {exc}"
                    finally:
                        shutil.rmtree(cwd, ignore_errors=True)
    return results


def check_s3(endpoint: str, url: str, cwd: Path) -> None:
    """The dataset is in the bucket, and nothing was written locally instead."""
    local = [p.name for p in cwd.iterdir() if p.name != "out"]
    if local:
        raise RuntimeError(f"wrote {local} in the local directory instead of to {url}")
    prefix = url.split(f"s3://{BUCKET}/", 1)[1]
    listing = _s3_client(endpoint).list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")
    if not any(o["Key"].endswith(".parquet") for o in listing.get("Contents", [])):
        raise RuntimeError(f"no Parquet file under {url}")


def probe(what: str, size: int, rows: int, dst: Path, timeout: float) -> float:
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps({"what": what, "size": size, "rows": rows,
                                                                   "dst": str(dst)})],
                         capture_output=True, text=True, env=child_env(), timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1][:300])
    return float(json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"])


def print_table(inputs: dict[str, tuple[Path, int, int]], results: dict[tuple[str, str], Outcome],
                repeats: int) -> None:
    print(f"\nconversion of TFRecord into unihub, {os.cpu_count()} cores, {repeats} round(s), alternated; "
          "peak RSS above the process's RSS after imports\n")
    print("| rows | contender | MB/s (min / median / max) | rows/s (median) | peak RSS MiB (median; max) "
          "| forked workers' peak MiB |")
    print("|---|---|---|---|---|---|")
    for size, (_, rows, nbytes) in inputs.items():
        for (name, contender), outcome in results.items():
            if name != size:
                continue
            label = CONTENDERS[contender]
            if outcome.failed or not outcome.seconds:
                print(f"| {size} | {label} | failed: {outcome.failed or 'no run'} | | | |")
                continue
            speeds = sorted(nbytes / MB / s for s in outcome.seconds)
            workers = (f"{max(outcome.children):,.0f}" if contender == "local2" else
                       "executors not measured" if contender.startswith("spark") else "—")
            print(f"| {size} ({rows:,}) | {label} | {speeds[0]:,.0f} / {statistics.median(speeds):,.0f} / "
                  f"{speeds[-1]:,.0f} | {rows / statistics.median(outcome.seconds):,.0f} | "
                  f"{statistics.median(outcome.peaks):,.0f}; {max(outcome.peaks):,.0f} | {workers} |")


def print_rss_by_row_size(inputs: dict[str, tuple[Path, int, int]], work: Path, timeout: float) -> None:
    from unihub.runtime.memory import DEFAULT_ROW_GROUP_SIZE_MB

    print(f"\npeak RSS (MiB) against row size: write_dataset of rows given in Python ({DEFAULT_ROW_GROUP_SIZE_MB:g} MB "
          "row groups, the default), and make_batch_reader (2 threads) reading them back\n")
    print("| rows | write_dataset | make_batch_reader |")
    print("|---|---|---|")
    for size_name, (_, rows, _) in inputs.items():
        size = SIZES[size_name][0]
        dst = work / f"probe-{size}"
        try:
            written = f"{probe('write', size, rows, dst, timeout):,.0f}"
            read = f"{probe('read', size, rows, dst, timeout):,.0f}"
        except Exception as exc:  # noqa: BLE001
            written = read = f"failed: {exc}"
        finally:
            shutil.rmtree(dst, ignore_errors=True)
        print(f"| {size_name} ({rows:,}) | {written} | {read} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small inputs, one round: a smoke test")
    parser.add_argument("--only", default=",".join(CONTENDERS), help=f"comma-separated: {','.join(CONTENDERS)}")
    parser.add_argument("--data", default="", help="where the inputs are written (kept); default: a temporary dir")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = 1
    unknown = set(args.only.split(",")) - set(CONTENDERS) - {""}
    if unknown:
        parser.error(f"unknown contenders {sorted(unknown)}; choose from {', '.join(CONTENDERS)}")
    with tempfile.TemporaryDirectory(prefix="unihub-scale-") as scratch:
        data = Path(args.data) if args.data else Path(scratch) / "inputs"
        work = Path(scratch) / "work"
        work.mkdir()
        start = time.perf_counter()
        inputs = write_inputs(data, args.quick)
        print(f"inputs: {', '.join(f'{k}: {v[1]:,} rows, {v[2] / MB:,.0f} MB' for k, v in inputs.items())} "
              f"({time.perf_counter() - start:.1f} s)", file=sys.stderr)
        results = measure(args, inputs, work)
        print_table(inputs, results, args.repeats)
        print_rss_by_row_size(inputs, work, args.timeout)


if __name__ == "__main__":
    main()
