"""Generate the reference datasets the side-by-side benchmarks read, into ``benchmarks/data/``.

    python benchmarks/make_reference_data.py           # both, skipping what is already there
    python benchmarks/make_reference_data.py --force   # regenerate
    python benchmarks/make_reference_data.py --only petastorm_images

* ``petastorm_images/``: 10,000 rows written by **Petastorm 0.13.1 itself**
  (``materialize_dataset`` + ``dict_to_spark_row`` on a ``local[2]`` Spark session, inside
  ``.venv-petastorm``): ``id`` int64 ScalarCodec(LongType), ``image`` uint8 (64, 64, 3)
  CompressedImageCodec('png'), ``label`` int32 ScalarCodec(IntegerType), ``embedding``
  float32 (128,) NdarrayCodec, ``boxes`` float32 (None, 4) NdarrayCodec. 8 MB row groups,
  4 files. This is a dataset "as Petastorm users have it", with the pickled legacy
  Unischema in ``_common_metadata``.
* ``plain_1m/``: plain Parquet (no Unischema), 1,000,000 rows of ``id`` int64, ``label``
  int32, ``f0..f7`` float32, in 4 files of 250,000 rows, row groups of 100,000 rows.
  Written with pyarrow in the calling interpreter; read by ``make_batch_reader``.

Both are deterministic (fixed seeds). Each is built in a temporary sibling directory and
renamed into place when complete, so an interrupted run leaves nothing half-written.
The script itself only needs the standard library + pyarrow/numpy; run it with unihub's
venv (``.venv/bin/python``). The Petastorm part is re-run by this same file inside the
Petastorm venv (``--petastorm-write-images DIR``), which is created on first use.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA_DIR = HERE / "data"
IMAGE_ROWS = 10_000
PLAIN_ROWS = 1_000_000


def _log(msg: str) -> None:
    print(f"[make_reference_data] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# Petastorm side: runs inside .venv-petastorm (imports petastorm, pyspark)
# --------------------------------------------------------------------------------------

def _make_image(rng, height=64, width=64, channels=3):
    """Same generator as ``unihub.cli.demo.make_image``: a smooth random gradient + mild noise."""
    import numpy as np

    ys = np.linspace(0, 1, height, dtype=np.float32)[:, None, None]
    xs = np.linspace(0, 1, width, dtype=np.float32)[None, :, None]
    a, b, c = rng.random((3, 1, 1, channels), dtype=np.float32)
    image = 255 * (a * ys + b * xs + c * ys * xs) / np.maximum(a + b + c, 1e-3)
    image += rng.normal(0, 6, size=(height, width, channels)).astype(np.float32)
    out = np.clip(image, 0, 255).astype(np.uint8)
    return out[:, :, 0] if channels == 1 else out


def _petastorm_schema():
    import numpy as np
    from petastorm.codecs import CompressedImageCodec, NdarrayCodec, ScalarCodec
    from petastorm.unischema import Unischema, UnischemaField
    from pyspark.sql.types import IntegerType, LongType

    return Unischema("PetastormImages", [
        UnischemaField("id", np.int64, (), ScalarCodec(LongType()), False),
        UnischemaField("image", np.uint8, (64, 64, 3), CompressedImageCodec("png"), False),
        UnischemaField("label", np.int32, (), ScalarCodec(IntegerType()), False),
        UnischemaField("embedding", np.float32, (128,), NdarrayCodec(), False),
        UnischemaField("boxes", np.float32, (None, 4), NdarrayCodec(), False),
    ])


def _image_row(i: int) -> dict:
    """Row ``i`` of petastorm_images; deterministic (seeded by the row id)."""
    import numpy as np

    rng = np.random.default_rng([20240601, i])
    return {
        "id": np.int64(i),
        "image": _make_image(rng),
        "label": np.int32(i % 10),
        "embedding": rng.standard_normal(128, dtype=np.float32),
        "boxes": rng.random((i % 4, 4), dtype=np.float32),
    }


def petastorm_write_images(out_dir: str, rows: int, files: int = 4, row_group_size_mb: int = 8) -> None:
    """Write the image dataset with Petastorm's own Spark path. Runs in .venv-petastorm."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from petastorm.etl.dataset_metadata import materialize_dataset
    from petastorm.unischema import dict_to_spark_row
    from pyspark.sql import SparkSession

    schema = _petastorm_schema()
    url = Path(out_dir).resolve().as_uri()
    spark = (SparkSession.builder.master("local[2]").appName("petastorm_images")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "2g")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", str(files))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with materialize_dataset(spark, url, schema, row_group_size_mb):
            rdd = (spark.sparkContext.parallelize(range(rows), files)
                   .map(_image_row)
                   .map(lambda r: dict_to_spark_row(schema, r)))
            (spark.createDataFrame(rdd, schema.as_spark_schema())
             .write.mode("overwrite").parquet(url))
    finally:
        spark.stop()


# --------------------------------------------------------------------------------------
# Main side: runs in unihub's venv
# --------------------------------------------------------------------------------------

def _fresh_tmp(final: Path) -> Path:
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    return tmp


def make_petastorm_images(force: bool = False, rows: int = IMAGE_ROWS) -> Path:
    final = DATA_DIR / "petastorm_images"
    if final.exists() and not force:
        _log(f"{final} exists, skipping")
        return final
    sys.path.insert(0, str(HERE))
    from petastorm_env import ensure_petastorm_venv

    python = ensure_petastorm_venv()
    tmp = _fresh_tmp(final)
    t0 = time.perf_counter()
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONWARNINGS="ignore")
    env.pop("PYTHONPATH", None)
    # not from the repository's root (nor with it on PYTHONPATH): Spark's Python workers put their working
    # folder on sys.path, where unihub's own petastorm/ package would stand in for Petastorm's
    subprocess.run([str(python), str(Path(__file__).resolve()), "--petastorm-write-images", str(tmp),
                    "--rows", str(rows)], check=True, env=env, cwd=DATA_DIR)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    seconds = time.perf_counter() - t0
    parquet = sorted(final.glob("*.parquet"))
    size = sum(p.stat().st_size for p in parquet)
    _log(f"petastorm_images: {rows:,} rows, {len(parquet)} files, {size / 1e6:.1f} MB in {seconds:.1f}s")
    return final


def make_plain_1m(force: bool = False, rows: int = PLAIN_ROWS, files: int = 4, row_group_rows: int = 100_000) -> Path:
    final = DATA_DIR / "plain_1m"
    if final.exists() and not force:
        _log(f"{final} exists, skipping")
        return final
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = _fresh_tmp(final)
    tmp.mkdir(parents=True)
    t0 = time.perf_counter()
    rng = np.random.default_rng(1)
    per_file = -(-rows // files)
    for k in range(files):
        lo, hi = k * per_file, min(rows, (k + 1) * per_file)
        ids = np.arange(lo, hi, dtype=np.int64)
        cols = {"id": ids, "label": (ids % 10).astype(np.int32)}
        for j in range(8):
            cols[f"f{j}"] = rng.standard_normal(hi - lo, dtype=np.float32)
        pq.write_table(pa.table(cols), tmp / f"part-{k:05d}.parquet", row_group_size=row_group_rows)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    size = sum(p.stat().st_size for p in final.glob("*.parquet"))
    _log(f"plain_1m: {rows:,} rows, {files} files, {size / 1e6:.1f} MB in {time.perf_counter() - t0:.1f}s")
    return final


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--force", action="store_true", help="regenerate even if present")
    ap.add_argument("--only", choices=["petastorm_images", "plain_1m"], help="make only this one")
    ap.add_argument("--rows", type=int, default=None, help="override the row count (for tests)")
    ap.add_argument("--petastorm-write-images", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.petastorm_write_images:  # inside .venv-petastorm
        petastorm_write_images(args.petastorm_write_images, args.rows or IMAGE_ROWS)
        return 0

    DATA_DIR.mkdir(parents=True, exist_ok=True)
    if args.only in (None, "plain_1m"):
        make_plain_1m(args.force, **({"rows": args.rows} if args.rows else {}))
    if args.only in (None, "petastorm_images"):
        make_petastorm_images(args.force, **({"rows": args.rows} if args.rows else {}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
