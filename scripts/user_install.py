"""The install a user makes, checked end to end: the built wheel in a clean venv, without the test extra.

    .venv/bin/python scripts/user_install.py [--keep DIR]

1. builds the wheel from the checkout's files (copied: nothing is written into the checkout);
2. makes a fresh venv and ``pip install``s ``unihub[hdf5]`` from that wheel, its dependencies from the
   package index as a user's pip would get them (no torch, TensorFlow, tfrecord, webdataset or pytest);
3. writes sources with the formats' own libraries, in *this* interpreter (the project's .venv):
   TFRecord plain and GZIP with TensorFlow's ``TFRecordWriter``, WebDataset shards with webdataset's
   ``TarWriter``, an HDF5 file with h5py (gzip and shuffle filters), an image folder with PIL;
4. in the clean venv, with its ``unihub`` command: converts each in, reads the dataset with
   ``make_reader`` / ``make_batch_reader`` (images decoded), exports it back to its format;
5. here again: ``unihub verify`` source against dataset and dataset against export (each against the
   format's own library) and compares the exported TFRecord records, tar members and image files
   byte for byte with the sources.

Exits non-zero, naming the step, on any failure. ``.ci/run`` runs it after the tests.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: what the clean venv must not have: the user installed no test extra and no framework
NOT_INSTALLED = ("torch", "tensorflow", "tfrecord", "webdataset", "pytest", "pyspark", "PIL")

READ_SCRIPT = """
import json, sys
import numpy as np
from unihub import make_batch_reader, make_reader
url, expected = sys.argv[1], int(sys.argv[2])
with make_reader(url, shuffle_row_groups=False, reader_pool_type="dummy") as reader:
    rows = list(reader)
with make_batch_reader(url, shuffle_row_groups=False, reader_pool_type="dummy") as reader:
    batched = sum(len(next(iter(b._asdict().values()))) for b in reader)
assert len(rows) == expected == batched, (len(rows), batched, expected)
images = [v for r in rows for v in r._asdict().values()  # decoded pixels, whatever the field's name
          if isinstance(v, np.ndarray) and v.dtype == np.uint8 and v.ndim == 3 and v.shape[2] == 3]
missing = [m for m in {not_installed!r} if __import__("importlib").util.find_spec(m) is not None]
assert not missing, f"the clean venv has {{missing}}"
print(json.dumps({{"rows": len(rows), "images": len(images)}}))
"""


def run(step: str, command: list[str], **kwargs: object) -> str:
    """Run ``command``; on failure print its output and exit naming ``step``."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        print(f"user_install: FAILED: {step} (exit {done.returncode})\n$ {' '.join(command)}\n"
              f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}", file=sys.stderr)
        sys.exit(1)
    print(f"user_install: ok: {step} ({time.perf_counter() - start:.1f} s)", flush=True)
    return str(done.stdout)


def build_wheel(work: Path) -> Path:
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    source = work / "src"
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    run("build the wheel", [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(work / "dist"), str(source)])
    (wheel,) = (work / "dist").glob("unihub-*.whl")
    return wheel


def make_venv(work: Path, wheel: Path) -> Path:
    venv = work / "user-venv"
    run("create a clean venv", [sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    run("pip install unihub[hdf5] from the wheel", [str(python), "-m", "pip", "install", "-q",
                                                   "--disable-pip-version-check", f"{wheel}[hdf5]"])
    return venv


def write_sources(src: Path) -> dict[str, tuple[Path, int]]:
    """Each format's source, written by its own library: name -> (path, rows)."""
    import h5py
    import numpy as np
    import tensorflow as tf
    import webdataset as wds
    from PIL import Image

    rng = np.random.default_rng(0)
    src.mkdir(parents=True)

    def jpeg(seed: int, mode: str = "RGB") -> bytes:
        pixels = np.random.default_rng(seed).integers(0, 255, (12, 10, 3), np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels).convert(mode).save(out, format="JPEG", quality=90)
        return out.getvalue()

    for name, options in (("plain.tfrecord", None), ("zipped.tfrecord.gz", "GZIP")):
        with tf.io.TFRecordWriter(str(src / name), options=options) as writer:
            for i in range(40):
                feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg(i)])),
                           "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 7])),
                           "vec": tf.train.Feature(float_list=tf.train.FloatList(value=rng.random(4).tolist()))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    (src / "shards").mkdir()
    with wds.TarWriter(str(src / "shards" / "shard-000000.tar")) as sink:
        for i in range(30):
            sink.write({"__key__": f"sample{i:04d}", "jpg": jpeg(100 + i), "cls": str(i % 5).encode(),
                        "json": json.dumps({"i": i, "name": f"n{i}"}).encode()})
    with h5py.File(src / "data.h5", "w") as handle:
        handle.create_dataset("x", data=rng.random((50, 3)).astype(np.float32), compression="gzip", shuffle=True,
                              chunks=(10, 3))
        handle.create_dataset("y", data=np.arange(50, dtype=np.int64))
    for label in ("cat", "dog"):
        (src / "images" / label).mkdir(parents=True)
        for i in range(6):
            pixels = rng.integers(0, 255, (8, 9, 3), np.uint8)
            Image.fromarray(pixels).save(src / "images" / label / f"{i}.png")
    return {"tfrecord": (src / "plain.tfrecord", 40), "tfrecord.gz": (src / "zipped.tfrecord.gz", 40),
            "webdataset": (src / "shards", 30), "hdf5": (src / "data.h5", 50), "imagefolder": (src / "images", 12)}


#: where each source is exported back to, and with which --to
EXPORTS = {"tfrecord": ("back.tfrecord", "tfrecord"), "tfrecord.gz": ("back.tfrecord", "tfrecord"),
           "webdataset": ("back-shards", "webdataset"), "hdf5": ("back.h5", "hdf5"),
           "imagefolder": ("back-images", "imagefolder")}


def tfrecord_payloads(path: Path) -> list[bytes]:
    import tensorflow as tf

    return [r.numpy() for r in tf.data.TFRecordDataset(str(path), compression_type="GZIP"
                                                        if path.suffix == ".gz" else "")]


def tar_members(folder: Path) -> list[tuple[str, bytes]]:
    members = []
    for shard in sorted(folder.rglob("*.tar")):
        with tarfile.open(shard) as archive:
            members += [(m.name, archive.extractfile(m).read()) for m in archive if m.isfile()]  # type: ignore[union-attr]
    return members


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def hdf5_datasets(path: Path) -> dict[str, tuple[object, ...]]:
    """Each dataset's dtype, shape, filters, chunks, fill value and bytes, as h5py reads them."""
    import h5py

    found: dict[str, tuple[object, ...]] = {}
    with h5py.File(path, "r") as handle:
        def visit(name: str, obj: object) -> None:
            if isinstance(obj, h5py.Dataset):
                found[name] = (obj.dtype.str, obj.shape, obj.compression, obj.compression_opts, obj.shuffle,
                               obj.chunks, obj.fillvalue.tobytes() if hasattr(obj.fillvalue, "tobytes") else
                               obj.fillvalue, obj[()].tobytes())
        handle.visititems(visit)
    return found


def check_bytes(name: str, source: Path, export: Path) -> None:
    """The export holds the source's records, members, files or datasets (with their filters and chunks)
    byte for byte, as the format's own library reads them."""
    if name.startswith("tfrecord"):
        same = tfrecord_payloads(source) == tfrecord_payloads(export)
    elif name == "webdataset":
        same = tar_members(source) == tar_members(export)
    elif name == "imagefolder":
        same = files_of(source) == files_of(export)
    else:
        same = hdf5_datasets(source) == hdf5_datasets(export)
    if not same:
        print(f"user_install: FAILED: {name}: the export's bytes differ from the source's", file=sys.stderr)
        sys.exit(1)
    print(f"user_install: ok: {name}: exported bytes equal the source's", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", help="work in this folder and leave it (default: a temporary one, removed)")
    args = parser.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="unihub-user-install-"))
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        venv = make_venv(work, build_wheel(work))
        user_unihub, user_python = str(venv / "bin" / "unihub"), str(venv / "bin" / "python")
        here_unihub = str(Path(sys.executable).parent / "unihub")
        clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        sources = write_sources(work / "sources")
        reader = READ_SCRIPT.format(not_installed=NOT_INSTALLED)
        for name, (source, rows) in sources.items():
            dataset = work / "datasets" / name
            run(f"{name}: convert in (clean venv)", [user_unihub, "convert", str(source), str(dataset), "--quiet"],
                env=clean_env, cwd=work)
            got = json.loads(run(f"{name}: read (clean venv)", [user_python, "-c", reader, str(dataset), str(rows)],
                                 env=clean_env, cwd=work).strip().splitlines()[-1])
            if name in ("tfrecord", "tfrecord.gz", "webdataset", "imagefolder") and got["images"] != rows:
                print(f"user_install: FAILED: {name}: {got['images']} images decoded of {rows}", file=sys.stderr)
                return 1
            target, fmt = EXPORTS[name]
            export = work / "exports" / name / target
            export.parent.mkdir(parents=True)
            run(f"{name}: export back (clean venv)", [user_unihub, "convert", str(dataset), str(export), "--to", fmt,
                                                      "--quiet"], env=clean_env, cwd=work)
            run(f"{name}: verify source = dataset", [here_unihub, "verify", str(source), str(dataset)], cwd=work)
            run(f"{name}: verify dataset = export", [here_unihub, "verify", str(dataset), str(export)], cwd=work)
            check_bytes(name, source, export)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"user_install: passed in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
