"""Conversion throughput (issue 4): each foreign format -> unihub and back, next to the format's
own library merely reading the same input.

For TFRecord, HDF5, WebDataset and image folders it writes an input dataset in a temporary
directory (rows of a 64x64x3 JPEG + int label + float32 (16,) tensor; the image folder has
one folder per class), then times, in one run:

- ``raw read``: the format's own library reading every record of that input -- TF's
  ``tf.data.TFRecordDataset`` + ``tf.io.parse_example`` in batches, h5py slices of every
  dataset, ``webdataset.WebDataset(urls)`` iteration over raw samples, ``Path.read_bytes``
  of every file of the image folder;
- ``ingest``: ``unihub.converters.convert.convert(src, dst)`` into a unihub dataset, best of 2;
- ``export``: ``convert(unihub, dst, to_format=...)`` back to the format;
- ``lib write``: the library's own writer writing the input (``tf.io.TFRecordWriter``,
  h5py, ``webdataset.TarWriter``, ``Path.write_bytes``).

The target is ingest >= 0.7x raw read, and export >= 0.7x the library's own writer (the
export's counterpart of a raw read). Ingest runs with ``workers`` = cores (``--workers``);
TFRecord and WebDataset inputs are 4 shards, so each worker reads whole files. TensorFlow and webdataset (which
imports torch) run in subprocesses that report their timings as JSON, so the main process
never imports them. Everything is read from the page cache (each input was just written).

    .venv/bin/python benchmarks/convert.py [--rows 20000] [--only tfrecord,hdf5] [--profile tfrecord]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

from unihub.cli.demo import make_image
from unihub.images.decoders import encode_image

FORMATS = ("tfrecord", "hdf5", "webdataset", "imagefolder")
TARGET = 0.7
CLASSES = 10
SHARDS = 4
IMAGE_POOL = 1000  # distinct images, cycled (encoding 20k images would dominate set-up time)

# -- subprocess jobs: each gets a JSON job on argv[1] and prints one JSON line -----------------
TF_JOB = textwrap.dedent("""
    import json, os, sys, time
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf
    job = json.loads(sys.argv[1])
    out = {}
    if job.get("write"):
        d = job["data"]
        blob = open(os.path.join(d, "images.bin"), "rb").read()
        offsets = np.load(os.path.join(d, "offsets.npy"))
        labels = np.load(os.path.join(d, "labels.npy"))
        vecs = np.load(os.path.join(d, "vecs.npy"))
        n = len(labels)
        files = [os.path.join(job["write"], f"part-{s:05d}.tfrecord") for s in range(job["shards"])]
        per = -(-n // len(files))
        start = time.perf_counter()
        for s, path in enumerate(files):
            with tf.io.TFRecordWriter(path) as w:
                for i in range(s * per, min(n, (s + 1) * per)):
                    feature = {
                        "image": tf.train.Feature(bytes_list=tf.train.BytesList(
                            value=[blob[offsets[i]:offsets[i + 1]]])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(labels[i])])),
                        "vec": tf.train.Feature(float_list=tf.train.FloatList(value=vecs[i])),
                    }
                    w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        out["write_s"] = time.perf_counter() - start
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64),
            "vec": tf.io.FixedLenFeature([16], tf.float32)}
    for name, files in (("read", job.get("read")), ("read_export", job.get("read_export"))):
        if not files:
            continue
        best, rows = float("inf"), 0
        for _ in range(job.get("repeat", 1)):
            start = time.perf_counter()
            ds = tf.data.TFRecordDataset(sorted(files)).batch(256).map(lambda x: tf.io.parse_example(x, spec))
            rows = 0
            for batch in ds:
                rows += int(batch["label"].shape[0])
            best = min(best, time.perf_counter() - start)
        out[name + "_s"], out[name + "_rows"] = best, rows
    print(json.dumps(out))
""")

WDS_JOB = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    import webdataset as wds
    job = json.loads(sys.argv[1])
    out = {}
    if job.get("write"):
        d = job["data"]
        blob = open(os.path.join(d, "images.bin"), "rb").read()
        offsets = np.load(os.path.join(d, "offsets.npy"))
        labels = np.load(os.path.join(d, "labels.npy"))
        vecs = np.load(os.path.join(d, "vecs.npy"))
        n = len(labels)
        per = -(-n // job["shards"])
        start = time.perf_counter()
        for s in range(job["shards"]):
            with wds.TarWriter(os.path.join(job["write"], f"shard-{s:06d}.tar")) as w:
                for i in range(s * per, min(n, (s + 1) * per)):
                    w.write({"__key__": f"{i:08d}", "jpg": blob[offsets[i]:offsets[i + 1]],
                             "cls": int(labels[i]), "npy": vecs[i]})
        out["write_s"] = time.perf_counter() - start
    for name in ("read", "read_export"):
        urls = job.get(name)
        if not urls:
            continue
        best, rows = float("inf"), 0
        for _ in range(job.get("repeat", 1)):
            start = time.perf_counter()
            rows = sum(1 for _ in wds.WebDataset(sorted(urls), shardshuffle=False, empty_check=False))
            best = min(best, time.perf_counter() - start)
        out[name + "_s"], out[name + "_rows"] = best, rows
    print(json.dumps(out))
""")


def run_job(script: str, job: dict) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(job)], capture_output=True, text=True, env=env,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- input data --------------------------------------------------------------------------------
class Data:
    """``rows`` rows: JPEG bytes (a cycled pool), int64 label, float32 (16,) vector."""

    def __init__(self, rows: int, directory: Path) -> None:
        rng = np.random.default_rng(0)
        pool = [encode_image(make_image(rng), "jpeg", quality=90) for _ in range(min(rows, IMAGE_POOL))]
        self.images = [pool[i % len(pool)] for i in range(rows)]
        self.labels = rng.integers(0, CLASSES, rows).astype(np.int64)
        self.vecs = rng.standard_normal((rows, 16), dtype=np.float32)
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "images.bin").write_bytes(b"".join(self.images))
        np.save(directory / "offsets.npy", np.cumsum([0] + [len(b) for b in self.images]))
        np.save(directory / "labels.npy", self.labels)
        np.save(directory / "vecs.npy", self.vecs)

    def __len__(self) -> int:
        return len(self.labels)


def tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# -- per-format set-up and raw reads --------------------------------------------------------------
def tfrecord_case(data: Data, tmp: Path) -> dict:
    src = tmp / "tfrecord"
    src.mkdir()
    files = [str(src / f"part-{s:05d}.tfrecord") for s in range(SHARDS)]  # the names TF_JOB writes
    timings = run_job(TF_JOB, {"data": str(data.dir), "write": str(src), "shards": SHARDS, "read": files,
                               "repeat": 2})
    return {"src": str(src / "*.tfrecord"), "bytes": tree_bytes(src), "raw_s": timings["read_s"],
            "raw_rows": timings["read_rows"], "write_s": timings["write_s"]}


def tfrecord_export_check(dst: Path) -> dict:
    files = sorted(str(p) for p in dst.rglob("*.tfrecord"))
    return run_job(TF_JOB, {"data": "", "read_export": files}) if files else {}


def hdf5_case(data: Data, tmp: Path) -> dict:
    import h5py

    src = tmp / "input.h5"
    rng = np.random.default_rng(0)
    pool = np.stack([make_image(rng) for _ in range(min(len(data), IMAGE_POOL))])
    start = time.perf_counter()
    with h5py.File(src, "w") as f:
        n = len(data)
        images = f.create_dataset("image", (n, 64, 64, 3), np.uint8, chunks=(min(n, 256), 64, 64, 3))
        for lo in range(0, n, 1024):
            hi = min(n, lo + 1024)
            images[lo:hi] = pool[np.arange(lo, hi) % len(pool)]
        f.create_dataset("label", data=data.labels, chunks=(min(n, 4096),))
        f.create_dataset("vec", data=data.vecs, chunks=(min(n, 4096), 16))
    write_s = time.perf_counter() - start
    raw_s, rows = hdf5_raw_read(src)

    def copy() -> int:  # the floor of any conversion that writes the data out again
        shutil.copyfile(src, tmp / "copy.h5")
        (tmp / "copy.h5").unlink()
        return rows

    copy_s, _ = best_of(2, copy)
    return {"src": str(src), "bytes": tree_bytes(src), "raw_s": raw_s, "raw_rows": rows, "write_s": write_s,
            "copy_s": copy_s}


def best_of(repeat: int, read) -> tuple[float, int]:
    """Best wall time of ``read()`` (which returns a row count) over ``repeat`` runs."""
    best, rows = float("inf"), 0
    for _ in range(repeat):
        start = time.perf_counter()
        rows = read()
        best = min(best, time.perf_counter() - start)
    return best, rows


def hdf5_raw_read(path: Path, repeat: int = 2) -> tuple[float, int]:
    """h5py slices (whole chunks) of every dataset sharing the first axis."""
    import h5py

    def read() -> int:
        with h5py.File(path, "r") as f:
            found: list[h5py.Dataset] = []
            f.visititems(lambda _, obj, found=found: found.append(obj) if isinstance(obj, h5py.Dataset) else None)
            datasets = [d for d in found if d.shape]
            for d in datasets:
                step = max(d.chunks[0] if d.chunks else 4096, 1024)
                for lo in range(0, d.shape[0], step):
                    d[lo:lo + step]
            return max(d.shape[0] for d in datasets)

    return best_of(repeat, read)


def webdataset_case(data: Data, tmp: Path) -> dict:
    src = tmp / "wds"
    src.mkdir()
    urls = [str(src / f"shard-{s:06d}.tar") for s in range(SHARDS)]  # the names WDS_JOB writes
    timings = run_job(WDS_JOB, {"data": str(data.dir), "write": str(src), "shards": SHARDS, "read": urls,
                                "repeat": 2})
    return {"src": str(src / f"shard-{{000000..{SHARDS - 1:06d}}}.tar"), "bytes": tree_bytes(src),
            "raw_s": timings["read_s"], "raw_rows": timings["read_rows"], "write_s": timings["write_s"]}


def imagefolder_case(data: Data, tmp: Path) -> dict:
    src = tmp / "folder"
    write_s = float("inf")
    for attempt in range(2):  # best of 2: creating 20k files is much slower on a cold file system
        if attempt:
            shutil.rmtree(src)
        start = time.perf_counter()
        for c in range(CLASSES):
            (src / f"class_{c:02d}").mkdir(parents=True)
        for i, (image, label) in enumerate(zip(data.images, data.labels)):
            (src / f"class_{label:02d}" / f"{i:08d}.jpg").write_bytes(image)
        write_s = min(write_s, time.perf_counter() - start)
    raw_s, rows = folder_raw_read(src)
    return {"src": str(src), "bytes": tree_bytes(src), "raw_s": raw_s, "raw_rows": rows, "write_s": write_s}


def folder_raw_read(root: Path, repeat: int = 2) -> tuple[float, int]:
    """Read every file of the folder tree once."""
    def read() -> int:
        rows = 0
        for directory, _, names in os.walk(root):
            for name in sorted(names):
                Path(directory, name).read_bytes()
                rows += 1
        return rows

    return best_of(repeat, read)


CASES = {"tfrecord": tfrecord_case, "hdf5": hdf5_case, "webdataset": webdataset_case, "imagefolder": imagefolder_case}
EXPORT_TARGET = {"tfrecord": "tfrecord_out", "hdf5": "export.h5", "webdataset": "wds_out", "imagefolder": "folder_out"}


# -- the benchmark -------------------------------------------------------------------------------
def timed_convert(src: str, dst: str, *, profile: bool = False, **kwargs) -> tuple[float, int, str]:
    from unihub.converters.convert import convert

    profiler = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    result = convert(src, dst, progress=False, **kwargs)
    if profiler:
        profiler.disable()
    seconds = time.perf_counter() - start
    report = ""
    if profiler:
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out).strip_dirs()
        stats.sort_stats("tottime").print_stats(18)
        stats.sort_stats("cumulative").print_stats(25)
        report = out.getvalue()
    return seconds, result.rows, report


def warm_up() -> None:
    """Import what ``convert`` imports lazily (~0.5 s), so the first format timed does not pay for it."""
    import h5py  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    import unihub.formats.builtin  # noqa: F401
    from unihub.converters.convert import convert

    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory(prefix="unihub-convert-warm-") as tmp:  # a tiny ingest + export
        for c in range(2):
            Path(tmp, "in", str(c)).mkdir(parents=True)
            Path(tmp, "in", str(c), "0.jpg").write_bytes(encode_image(make_image(rng), "jpeg"))
        convert(f"{tmp}/in", f"{tmp}/uh", from_format="imagefolder", progress=False)
        convert(f"{tmp}/uh", f"{tmp}/out", to_format="imagefolder", progress=False)


def bench(fmt: str, data: Data, tmp: Path, profile: bool, workers: int) -> dict:
    case = CASES[fmt](data, tmp)
    ingest_s, rows, ingest_prof = timed_convert(case["src"], str(tmp / f"{fmt}_unihub"), from_format=fmt,
                                                profile=profile, workers=workers)
    if not profile:  # best of 2, as the raw read
        shutil.rmtree(tmp / f"{fmt}_unihub")
        ingest_s = min(ingest_s, timed_convert(case["src"], str(tmp / f"{fmt}_unihub"), from_format=fmt,
                                               workers=workers)[0])
    if rows != len(data):
        raise AssertionError(f"{fmt}: ingested {rows} rows, expected {len(data)}")
    dst = tmp / EXPORT_TARGET[fmt]
    export_s, export_rows, export_prof = timed_convert(str(tmp / f"{fmt}_unihub"), str(dst), to_format=fmt,
                                                       profile=profile)
    if not profile:  # best of 2, as the library's own write
        again_s, _, _ = timed_convert(str(tmp / f"{fmt}_unihub"), str(dst), to_format=fmt, overwrite_foreign=True)
        export_s = min(export_s, again_s)
    if export_rows != len(data):
        raise AssertionError(f"{fmt}: exported {export_rows} rows, expected {len(data)}")
    if fmt == "tfrecord":  # TF itself must read the export back
        check = tfrecord_export_check(dst)
        if check.get("read_export_rows") != len(data):
            raise AssertionError(f"TF read {check.get('read_export_rows')} rows of the export, expected {len(data)}")
    return {**case, "ingest_s": ingest_s, "export_s": export_s, "rows": len(data), "export_bytes": tree_bytes(dst),
            "profile": (ingest_prof, export_prof)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--only", default=",".join(FORMATS), help="comma-separated formats")
    parser.add_argument("--profile", default="", help="comma-separated formats to run under cProfile")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="convert(workers=N) for ingest (default: one per core)")
    args = parser.parse_args()
    only = [f for f in args.only.split(",") if f]
    profile = {f for f in args.profile.split(",") if f}
    for f in only + list(profile):
        if f not in FORMATS:
            parser.error(f"unknown format {f!r}; one of {', '.join(FORMATS)}")

    start = time.perf_counter()
    warm_up()
    import_s = time.perf_counter() - start
    results = {}
    with tempfile.TemporaryDirectory(prefix="unihub-convert-bench-") as tmp_name:
        tmp = Path(tmp_name)
        data = Data(args.rows, tmp / "data")
        for fmt in only:
            work = tmp / fmt
            work.mkdir()
            start = time.perf_counter()
            results[fmt] = bench(fmt, data, work, fmt in profile, 1 if fmt in profile else args.workers)
            print(f"{fmt}: done in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    assert "tensorflow" not in sys.modules and "tfrecord" not in sys.modules and "webdataset" not in sys.modules

    print(f"\nconvert(), {args.rows:,} rows of 64x64x3 JPEG + int64 label + float32 (16,) "
          f"(HDF5: uint8 pixels), {os.cpu_count()} cores, ingest with workers={args.workers}, page cache warm; "
          f"imports and a warm-up done before timing ({import_s:.2f} s)\n")
    print("| format | input MB | raw read rows/s | unihub ingest rows/s (MB/s) | ratio | export rows/s (MB/s) "
          "| ratio | lib write rows/s | export / lib write | target |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    names = {"tfrecord": "TFRecord", "hdf5": "HDF5", "webdataset": "WebDataset", "imagefolder": "image folder"}
    for fmt, r in results.items():
        mb = r["bytes"] / 2**20
        raw = r["raw_rows"] / r["raw_s"]
        ingest = r["rows"] / r["ingest_s"]
        export = r["rows"] / r["export_s"]
        lib_write = r["rows"] / r["write_s"]
        ok_in, ok_out = ingest / raw >= TARGET, export / lib_write >= TARGET
        verdict = "met" if ok_in and ok_out else ("ingest met, export not" if ok_in else
                                                  ("export met, ingest not" if ok_out else "not met"))
        print(f"| {names[fmt]} | {mb:,.0f} | {raw:,.0f} | {ingest:,.0f} ({mb / r['ingest_s']:,.0f}) "
              f"| {ingest / raw:.2f} | {export:,.0f} ({r['export_bytes'] / 2**20 / r['export_s']:,.0f}) "
              f"| {export / raw:.2f} | {lib_write:,.0f} | {export / lib_write:.2f} | >= {TARGET}x: {verdict} |")
    if "tfrecord" in results and "webdataset" in results:  # the same rows: WebDataset's target is 1/1.5 of TFRecord's
        tfr, tar = (results[f]["rows"] / results[f]["ingest_s"] for f in ("tfrecord", "webdataset"))
        print(f"\nWebDataset ingest / TFRecord ingest (the same rows; target >= {1 / 1.5:.2f}): "
              f"{tar:,.0f} / {tfr:,.0f} rows/s = {tar / tfr:.2f}")
    if "copy_s" in results.get("hdf5", {}):
        r = results["hdf5"]
        print(f"\nHDF5: a plain copy of the input file (shutil.copyfile) runs at {r['rows'] / r['copy_s']:,.0f} rows/s, "
              f"{r['raw_s'] / r['copy_s']:.2f}x the raw read, so no conversion that writes the data again can reach "
              f"{TARGET}x of it; ingest / file copy = {r['copy_s'] / r['ingest_s']:.2f}")
    for fmt, r in results.items():
        for label, text in zip(("ingest", "export"), r["profile"]):
            if text:
                print(f"\n## cProfile: {fmt} {label}\n```\n{text}```")


if __name__ == "__main__":
    main()
