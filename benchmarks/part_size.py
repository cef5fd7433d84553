"""The writers' default part-file size, chosen by measurement (issue 37).

A part file is what a writer uploads as one object and what publishing on an object store copies
in one request: its size bounds how long the longest request of a write takes (a CopyObject of the
whole file is one request, however the upload was split). Smaller files cost a footer read, an
open and a listing entry each. This benchmark writes the same content (``--mib`` MiB of random
256 KiB rows, 4 MB row groups: incompressible, so bytes on disk are the payload) with each
``--sizes`` value of ``part_size_mb`` (0: no bound, one file) to a local disk and to moto's S3 server
(a separate process, through pyarrow's S3 filesystem), then reads it back with
``make_batch_reader`` (Arrow batches, nothing decoded: what the files cost where nothing else does).

Every read is a fresh process; ``--rounds`` rounds, min / median / max MB/s, and the seconds of the
write (one per size and target; on S3 its publishing copies each part file in one request).

    python benchmarks/part_size.py [--rounds 3] [--mib 256] [--sizes 8,32,128,0]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROW_BYTES = 256 * 2**10
READ = r"""
import json, sys, time
from unihub import make_batch_reader
url, options = sys.argv[1], json.loads(sys.argv[2])
start = time.perf_counter()
rows = 0
with make_batch_reader(url, shuffle_row_groups=False, num_epochs=1, **options) as reader:
    for batch in reader:
        rows += len(batch.id)
print(json.dumps({"rows": rows, "seconds": time.perf_counter() - start}))
"""


def write(url: str, mib: int, part_size_mb: float, options: dict[str, Any]) -> float:
    import numpy as np

    from unihub import TensorCodec, Unischema, UnischemaField, write_dataset

    schema = Unischema("Blobs", [UnischemaField("id", np.int64, ()),
                                 UnischemaField("blob", np.uint8, (ROW_BYTES,), TensorCodec(), False)])
    rng = np.random.default_rng(0)
    payloads = [rng.integers(0, 255, ROW_BYTES, dtype=np.uint8) for _ in range(16)]
    rows = ({"id": i, "blob": payloads[i % 16]} for i in range(mib * 2**20 // ROW_BYTES))
    start = time.perf_counter()
    write_dataset(url, schema, rows, overwrite=True, part_size_mb=part_size_mb or 2**20, **options)
    return time.perf_counter() - start


def read(url: str, options: dict[str, Any]) -> float:
    out = subprocess.run([sys.executable, "-c", READ, url, json.dumps(options)], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def moto(port: int) -> subprocess.Popen[bytes]:
    server = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return server
        time.sleep(0.1)
    raise RuntimeError("moto_server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--sizes", default="8,32,128,0")
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
        os.environ[name] = value
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    server = moto(port)
    root = Path(tempfile.mkdtemp(prefix="part-size-"))
    try:
        import boto3

        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1").create_bucket(Bucket="bench")
        results = []
        for size in sizes:
            targets = {"local": (str(root / f"ds-{size:g}"), {}),
                       "s3 (moto)": (f"s3://bench/ds-{size:g}?endpoint_override=127.0.0.1:{port}&scheme=http", {})}
            for where, (url, options) in targets.items():
                written = write(url, args.mib, size, options)
                reads = [args.mib * 2**20 / 1e6 / read(url, options) for _ in range(args.rounds)]
                results.append({"part_size_mb": size or "none", "where": where, "write_s": round(written, 2),
                                "read_MBps": [round(min(reads)), round(statistics.median(reads)), round(max(reads))]})
                print(json.dumps(results[-1]), flush=True)
        print("| part_size_mb | where | write s | read MB/s (min / median / max) |")
        print("|---|---|---|---|")
        for r in results:
            low, mid, high = r["read_MBps"]
            print(f"| {r['part_size_mb']} | {r['where']} | {r['write_s']} | {low} / **{mid}** / {high} |")
    finally:
        server.terminate()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
