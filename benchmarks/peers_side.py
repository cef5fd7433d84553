"""One contender of ``benchmarks/peers.py`` in one process: writes a tool's copy of the content, or times one epoch.

Runs in the contender's own venv (the peers' under ``benchmarks/.venvs/``, unihub and tf.data
in unihub's), so at the top it imports only numpy and simplejpeg; each tool is imported
inside its functions::

    python peers_side.py write TOOL SOURCE.npz TARGET     # the tool's own format, from the content
    python peers_side.py run '{"tool": ..., "data": ..., ...}'   # one epoch; JSON result on stdout

Every pipeline yields batches of (image uint8 [B, side, side, 3], label int64 [B], vec float32
[B, 16]) as torch tensors (tf tensors for the tf.data and make_tf_dataset contenders), images
decoded by simplejpeg (libjpeg-turbo) in every torch contender, as unihub does. The clock
starts after the imports (and Ray's ``ray.init``) when the pipeline is created; time to first
batch and the epoch's time are both measured from there, with the steady-state rate (10th to 90th
percentile of the rows) and the CPU seconds of the process tree (``proc_cpu.tree_cpu_seconds``). The
result also carries the row count, the label sum, and a hash of the pixels and vector of the probe
rows (``vec[0]`` is the row's index in the content), so that ``peers.py`` can check every contender
delivered the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import simplejpeg
from proc_cpu import tree_cpu_seconds  # the benchmarks' one CPU clock (stdlib only)

Batch = tuple[Any, Any, Any]


# --------------------------------------------------------------------------- the content
def load_content(source: str | Path) -> tuple[list[bytes], np.ndarray, np.ndarray]:
    """(JPEG blobs, int64 labels, float32 [n, 16] vectors) of the content file ``peers.py`` wrote."""
    with np.load(source) as npz:
        offsets, blob, labels, vecs = npz["offsets"], npz["blob"], npz["labels"], npz["vecs"]
    raw = blob.tobytes()
    return [raw[offsets[i]:offsets[i + 1]] for i in range(len(labels))], labels, vecs


def decode(blob: bytes) -> np.ndarray:
    return simplejpeg.decode_jpeg(blob, colorspace="RGB")


def decode_many(blobs: Sequence[bytes], count: int, threads: int = 1) -> np.ndarray:
    """``count`` JPEGs decoded into one uint8 [count, H, W, 3] array; with ``threads`` > 1 the batch is
    split between that many threads (simplejpeg releases the GIL while it decodes)."""
    first = decode(blobs[0])
    out = np.empty((count, *first.shape), np.uint8)
    out[0] = first

    def run(start: int, stop: int) -> None:
        for i in range(start, stop):
            simplejpeg.decode_jpeg(blobs[i], colorspace="RGB", buffer=out[i])

    if threads > 1 and count > 8:
        bounds = np.linspace(1, count, threads + 1).astype(int)
        list(_pool(threads).map(run, bounds[:-1], bounds[1:]))
    else:
        run(1, count)
    return out


_POOLS: dict[int, Any] = {}


def _pool(threads: int) -> Any:
    """One thread pool per size in each process (a worker process makes its own)."""
    if threads not in _POOLS:
        from concurrent.futures import ThreadPoolExecutor

        _POOLS[threads] = ThreadPoolExecutor(threads, thread_name_prefix="decode")
    return _POOLS[threads]


def probe_digest(image: np.ndarray, vec: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(image).tobytes() + np.ascontiguousarray(vec).tobytes()).hexdigest()


# --------------------------------------------------------------------------- writers
def write_tfrecord(content: Any, target: Path) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    blobs, labels, vecs = content
    shards = 4
    for s in range(shards):
        with tf.io.TFRecordWriter(str(target / f"part-{s:02d}.tfrecord")) as writer:
            for i in range(s, len(blobs), shards):
                feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[blobs[i]])),
                           "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(labels[i])])),
                           "vec": tf.train.Feature(float_list=tf.train.FloatList(value=vecs[i].tolist()))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def write_unihub(content: Any, target: Path) -> None:
    import pyarrow as pa

    from unihub import CompressedImageCodec, ScalarCodec, TensorCodec, Unischema, UnischemaField, write_dataset

    shape = decode(content[0][0]).shape
    schema = Unischema("PeersBench", [
        UnischemaField("image", np.uint8, shape, CompressedImageCodec("jpeg", quality=90), False),
        UnischemaField("label", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("vec", np.float32, (16,), TensorCodec(), False),
    ])
    blobs, labels, vecs = content
    target.rmdir()  # write_dataset makes the folder itself
    write_dataset(target, schema, {"image": blobs, "label": labels, "vec": vecs}, batched=True)  # default settings


def _arrow_table(content: Any) -> Any:
    import pyarrow as pa

    blobs, labels, vecs = content
    return pa.table({"image": pa.array(blobs, pa.binary()), "label": pa.array(labels, pa.int64()),
                     "vec": pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1), pa.float32()), 16)})


def write_lance(content: Any, target: Path) -> None:
    import lance

    lance.write_dataset(_arrow_table(content), str(target / "data.lance"))


def write_hf(content: Any, target: Path) -> None:
    import datasets

    blobs, labels, vecs = content
    features = datasets.Features({"image": datasets.Value("binary"), "label": datasets.Value("int64"),
                                  "vec": datasets.Sequence(datasets.Value("float32"), length=16)})
    ds = datasets.Dataset.from_dict({"image": blobs, "label": labels, "vec": vecs}, features=features)
    ds.save_to_disk(str(target / "hf"))


def _litdata_item(item: tuple[bytes, int, np.ndarray]) -> dict[str, Any]:
    return {"image": item[0], "label": item[1], "vec": item[2]}


def write_litdata(content: Any, target: Path) -> None:
    import litdata

    blobs, labels, vecs = content
    items = [(blobs[i], int(labels[i]), vecs[i]) for i in range(len(blobs))]
    litdata.optimize(fn=_litdata_item, inputs=items, output_dir=str(target / "litdata"), chunk_bytes=CHUNK,
                     num_workers=1, mode="overwrite")


def write_mosaic(content: Any, target: Path) -> None:
    from streaming import MDSWriter

    blobs, labels, vecs = content
    columns = {"image": "bytes", "label": "int64", "vec": "ndarray:float32:16"}
    with MDSWriter(out=str(target / "mds"), columns=columns, size_limit=CHUNK.lower()) as writer:
        for i in range(len(blobs)):
            writer.write({"image": blobs[i], "label": int(labels[i]), "vec": vecs[i]})


def write_wds(content: Any, target: Path) -> None:
    """Four tar shards, as WebDataset's docs write them (one member per field, keyed by the row)."""
    import webdataset as wds

    blobs, labels, vecs = content
    shards = 4
    for s in range(shards):
        with wds.TarWriter(str(target / f"shard-{s:02d}.tar")) as sink:
            for i in range(s * len(blobs) // shards, (s + 1) * len(blobs) // shards):
                sink.write({"__key__": f"{i:08d}", "jpg": blobs[i], "cls": int(labels[i]), "vec.npy": vecs[i]})


def write_parquet(content: Any, target: Path) -> None:
    """Plain Parquet for Ray Data, one file per 4 MB (as unihub's row groups): Ray reads a file per task."""
    import pyarrow.parquet as pq

    table = _arrow_table(content)
    rows = max(1, int(len(table) * 4e6 / table.nbytes))
    for i, start in enumerate(range(0, len(table), rows)):
        pq.write_table(table.slice(start, rows), str(target / f"part-{i:04d}.parquet"))


#: LitData's chunks and MosaicML's shards are sized like unihub's row groups, so that every worker has several
CHUNK = "4MB"

WRITERS: dict[str, Callable[[Any, Path], None]] = {
    "tfrecord": write_tfrecord, "unihub": write_unihub, "lance": write_lance, "hf": write_hf,
    "litdata": write_litdata, "mosaic": write_mosaic, "wds": write_wds, "parquet": write_parquet,
}


# --------------------------------------------------------------------------- pipelines
def _torch_batch(images: np.ndarray, labels: Any, vecs: Any) -> Batch:
    import torch

    return torch.from_numpy(images), torch.as_tensor(np.asarray(labels)), torch.as_tensor(np.asarray(vecs))


def _unihub_loader(job: dict[str, Any], batched: bool) -> Iterator[Batch]:
    """unihub's ``BatchedDataLoader(make_batch_reader)`` or its row ``DataLoader(make_reader)``."""
    from unihub import make_batch_reader, make_reader
    from unihub.bridges.torch import BatchedDataLoader, DataLoader

    shuffle = job["shuffle"]
    make, loader_class = (make_batch_reader, BatchedDataLoader) if batched else (make_reader, DataLoader)
    with loader_class(make(job["data"], num_epochs=1, shuffle_row_groups=shuffle > 0, seed=0),
                      batch_size=64, shuffling_queue_capacity=shuffle, seed=0) as loader:
        for batch in loader:
            yield batch["image"], batch["label"], batch["vec"]


def unihub_batched(job: dict[str, Any]) -> Iterator[Batch]:
    return _unihub_loader(job, batched=True)


def unihub_rows(job: dict[str, Any]) -> Iterator[Batch]:
    return _unihub_loader(job, batched=False)


def unihub_iterable(job: dict[str, Any]) -> Iterator[Batch]:
    import torch

    from unihub.bridges.torch import TorchIterableDataset

    ds = TorchIterableDataset(job["data"], batch_size=64, seed=0, shuffle_row_groups=job["shuffle"] > 0)
    workers = job["workers"]
    for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers,
                                             persistent_workers=False):
        yield batch["image"], batch["label"], batch["vec"]


def unihub_map(job: dict[str, Any]) -> Iterator[Batch]:
    import torch

    from unihub.bridges.torch import TorchMapDataset

    ds = TorchMapDataset(job["data"])
    loader = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=job["shuffle"] > 0,
                                         num_workers=job["workers"],
                                         generator=torch.Generator().manual_seed(0))
    for batch in loader:
        yield batch["image"], batch["label"], batch["vec"]


def unihub_tf(job: dict[str, Any]) -> Iterator[Batch]:
    from unihub import make_tf_dataset

    ds = make_tf_dataset(job["data"], batch_size=64, shuffle_buffer=job["shuffle"], seed=0,
                         shuffle_row_groups=job["shuffle"] > 0)
    for batch in ds:
        yield batch["image"], batch["label"].numpy(), batch["vec"].numpy()  # images as a model takes them


def _tf_decode(image: Any) -> Any:
    import tensorflow as tf

    return tf.io.decode_jpeg(image, channels=3, dct_method="INTEGER_ACCURATE")


def tfdata(job: dict[str, Any]) -> Iterator[Batch]:
    """tf.data's own TFRecord pipeline, as its performance guide builds it: interleaved shards, then either
    batched ``parse_example`` + ``decode_jpeg`` by ``map_fn`` (variant ``batch``) or a per-record parse + decode
    ``map`` before ``batch`` (variant ``record``); ``deterministic=False`` lets parallel maps hand out what is
    ready first. ``AUTOTUNE`` picks the parallelism."""
    import tensorflow as tf

    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64),
            "vec": tf.io.FixedLenFeature([16], tf.float32)}
    side = job["side"]

    def parse_batch(records: Any) -> Any:
        parsed = tf.io.parse_example(records, spec)
        images = tf.map_fn(_tf_decode, parsed["image"], fn_output_signature=tf.TensorSpec([side, side, 3], tf.uint8))
        return images, parsed["label"], parsed["vec"]

    def parse_record(record: Any) -> Any:
        parsed = tf.io.parse_single_example(record, spec)
        return _tf_decode(parsed["image"]), parsed["label"], parsed["vec"]

    deterministic = not job.get("nondeterministic", False)
    files = sorted(str(p) for p in Path(job["data"]).glob("*.tfrecord"))
    ds = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
    if job["shuffle"]:
        ds = ds.shuffle(job["shuffle"], seed=0)
    if job.get("variant", "batch") == "record":
        ds = ds.map(parse_record, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic).batch(64)
    else:
        ds = ds.batch(64).map(parse_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    for images, labels, vecs in ds.prefetch(tf.data.AUTOTUNE):
        yield images, labels.numpy(), vecs.numpy()  # images as a model takes them


def _lance_batch(rb: Any, threads: int) -> Batch:
    blobs = rb.column("image").to_pylist()
    vecs = rb.column("vec").flatten().to_numpy().reshape(-1, 16)
    return _torch_batch(decode_many(blobs, len(blobs), threads), rb.column("label").to_numpy(), vecs)


def lance_batches(job: dict[str, Any]) -> Iterator[Batch]:
    """Lance's scanner (``to_batches``), each Arrow batch's images decoded in the loop by ``threads`` threads."""
    import lance

    ds = lance.dataset(str(Path(job["data"]) / "data.lance"))
    for rb in ds.to_batches(batch_size=64):
        yield _lance_batch(rb, job.get("threads", 1))


def lance_torch(job: dict[str, Any]) -> Iterator[Batch]:
    """``lance.torch.data.LanceDataset`` (its own batching and read-ahead) with a decoding ``to_tensor_fn`` that
    splits each batch between ``threads`` threads; shuffled, Lance's ``ShardedBatchSampler(randomize=True)``
    (batches in a random order), as its docs recommend for training."""
    from lance.sampler import ShardedBatchSampler
    from lance.torch.data import LanceDataset

    threads = job.get("threads", 1)

    def to_tensor(rb: Any, **_: Any) -> Batch:
        return _lance_batch(rb, threads)

    sampler = ShardedBatchSampler(0, 1, randomize=True, seed=0) if job["shuffle"] else None
    ds = LanceDataset(str(Path(job["data"]) / "data.lance"), batch_size=64, to_tensor_fn=to_tensor, sampler=sampler)
    yield from ds


def _lance_rows_collate(rows: list[dict[str, Any]]) -> Batch:
    blobs = [r["image"] for r in rows]
    return _torch_batch(decode_many(blobs, len(blobs)), [r["label"] for r in rows],
                        np.asarray([r["vec"] for r in rows], np.float32))


def lance_safe(job: dict[str, Any]) -> Iterator[Batch]:
    """Lance's map-style ``SafeLanceDataset`` in its ``get_safe_loader`` (torch ``DataLoader``, spawned
    persistent workers, one ``take`` per batch), decoding in the collate; shuffled by the loader's sampler."""
    import torch
    from lance.torch.data import SafeLanceDataset, get_safe_loader

    ds = SafeLanceDataset(str(Path(job["data"]) / "data.lance"))
    options = {"batch_size": 64, "shuffle": job["shuffle"] > 0, "generator": torch.Generator().manual_seed(0),
               "collate_fn": _lance_rows_collate}
    if job["workers"]:
        yield from get_safe_loader(ds, num_workers=job["workers"], **options)
    else:  # get_safe_loader's spawn context needs workers
        yield from torch.utils.data.DataLoader(ds, **options)


_HF_THREADS = 1


def _hf_transform(batch: dict[str, list[Any]]) -> dict[str, Any]:
    import torch

    images = batch["image"]
    return {"image": torch.from_numpy(decode_many(images, len(images), _HF_THREADS)),
            "label": torch.as_tensor(batch["label"]), "vec": torch.as_tensor(np.asarray(batch["vec"], np.float32))}


def hf(job: dict[str, Any]) -> Iterator[Batch]:
    """HF ``datasets``: ``set_transform`` decoding whole index batches (by ``threads`` threads), torch
    ``DataLoader`` over a BatchSampler (``workers`` processes)."""
    import datasets
    import torch

    global _HF_THREADS
    _HF_THREADS = job.get("threads", 1)
    ds = datasets.load_from_disk(str(Path(job["data"]) / "hf"))
    ds.set_transform(_hf_transform)
    base = (torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(0)) if job["shuffle"]
            else torch.utils.data.SequentialSampler(ds))
    sampler = torch.utils.data.BatchSampler(base, 64, drop_last=False)
    loader = torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=None, num_workers=job["workers"])
    for batch in loader:
        yield batch["image"], batch["label"], batch["vec"]


def _decode_item(item: dict[str, Any]) -> dict[str, Any]:
    return {"image": decode(item["image"]), "label": item["label"], "vec": item["vec"]}


def litdata_(job: dict[str, Any]) -> Iterator[Batch]:
    """LitData: ``StreamingDataset`` with a decoding ``transform``, ``StreamingDataLoader``."""
    import litdata

    ds = litdata.StreamingDataset(str(Path(job["data"]) / "litdata"), shuffle=job["shuffle"] > 0, seed=0,
                                  transform=_decode_item)
    for batch in litdata.StreamingDataLoader(ds, batch_size=64, num_workers=job["workers"]):
        yield batch["image"], batch["label"], batch["vec"]


def _mosaic_class() -> type:
    from streaming import StreamingDataset

    class Decoded(StreamingDataset):  # type: ignore[misc]
        def __getitem__(self, index: Any) -> dict[str, Any]:
            return _decode_item(super().__getitem__(index))

    return Decoded


def mosaic(job: dict[str, Any]) -> Iterator[Batch]:
    """MosaicML Streaming: ``StreamingDataset`` over the local MDS shards, decoding ``__getitem__``."""
    import torch
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    ds = _mosaic_class()(local=str(Path(job["data"]) / "mds"), batch_size=64, shuffle=job["shuffle"] > 0,
                         shuffle_seed=0)
    for batch in torch.utils.data.DataLoader(ds, batch_size=64, num_workers=job["workers"]):
        yield batch["image"], batch["label"], batch["vec"]


def _wds_decode(sample: dict[str, Any]) -> tuple[np.ndarray, int, np.ndarray]:
    import io

    return decode(sample["jpg"]), int(sample["cls"]), np.load(io.BytesIO(sample["vec.npy"]))


def _wds_collate(rows: list[tuple[np.ndarray, int, np.ndarray]]) -> Batch:
    return _torch_batch(np.stack([r[0] for r in rows]), [r[1] for r in rows], np.stack([r[2] for r in rows]))


def wds_(job: dict[str, Any]) -> Iterator[Batch]:
    """WebDataset: shards split by worker, per-sample decode, ``batched(64)`` in the workers, ``WebLoader``."""
    import webdataset as wds

    urls = sorted(str(p) for p in Path(job["data"]).glob("*.tar"))
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    if job["shuffle"]:
        ds = ds.shuffle(job["shuffle"], rng=__import__("random").Random(0))
    ds = ds.map(_wds_decode).batched(64, collation_fn=_wds_collate)
    yield from wds.WebLoader(ds, batch_size=None, num_workers=job["workers"])


def _ray_decode(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    images = list(batch["image"])
    return {"image": decode_many(images, len(images)), "label": batch["label"],
            "vec": np.stack(batch["vec"]).astype(np.float32)}


def ray_(job: dict[str, Any]) -> Iterator[Batch]:
    """Ray Data: ``read_parquet`` over the folder's files (a read task per file) + ``map_batches`` decode,
    ``iter_torch_batches`` (``ray.init`` is before the clock)."""
    import ray

    ds = ray.data.read_parquet(str(job["data"]))
    ds = ds.map_batches(_ray_decode, batch_format="numpy", batch_size=256)
    for batch in ds.iter_torch_batches(batch_size=64, local_shuffle_buffer_size=job["shuffle"] or None):
        yield batch["image"], batch["label"], batch["vec"]


PIPELINES: dict[str, Callable[[dict[str, Any]], Iterator[Batch]]] = {
    "unihub_batched": unihub_batched, "unihub_rows": unihub_rows, "unihub_iterable": unihub_iterable,
    "unihub_map": unihub_map, "unihub_tf": unihub_tf, "tfdata": tfdata, "lance": lance_batches,
    "lance_torch": lance_torch, "lance_safe": lance_safe, "hf": hf, "litdata": litdata_, "mosaic": mosaic, "wds": wds_, "ray": ray_,
}

#: what each pipeline imports before the clock starts (imports are not timed)
IMPORTS: dict[str, str] = {
    "unihub_batched": "torch unihub.bridges.torch.loaders", "unihub_rows": "torch unihub.bridges.torch.loaders",
    "unihub_iterable": "torch unihub.bridges.torch.loaders", "unihub_map": "torch unihub.bridges.torch.loaders",
    "unihub_tf": "tensorflow unihub.bridges.tf.dataset", "tfdata": "tensorflow", "lance": "torch lance",
    "lance_torch": "torch lance lance.torch.data", "lance_safe": "torch lance lance.torch.data", "hf": "torch datasets", "litdata": "torch litdata",
    "mosaic": "torch streaming", "wds": "torch webdataset", "ray": "torch ray ray.data",
}


# --------------------------------------------------------------------------- decode limit
def decode_limit(job: dict[str, Any]) -> dict[str, Any]:
    """Images/s of unihub's JPEG decoder (``images.decoders.decode_image``) on one thread and on one thread per
    core, and the CPU seconds one image costs it in each (decoding on every core at once costs more CPU per
    image than on one: shared caches, a busy host). The all-cores figure is what the contenders, which decode
    on every core, must spend at least; it is subtracted from their CPU per row to give the rest."""
    from concurrent.futures import ThreadPoolExecutor

    from unihub.images import decoders as images

    blobs, _, _ = load_content(job["source"])
    cores = os.cpu_count() or 1
    shape = decode(blobs[0]).shape

    def run(share: list[bytes]) -> int:
        out = np.empty(shape, np.uint8)
        for blob in share:
            images.decode_image(blob, out=out)
        return len(share)

    t0, c0 = time.perf_counter(), time.thread_time()
    run(blobs)
    one, cpu = len(blobs) / (time.perf_counter() - t0), (time.thread_time() - c0) / len(blobs)
    with ThreadPoolExecutor(cores) as pool:
        t0, c0 = time.perf_counter(), time.process_time()
        done = sum(pool.map(run, [blobs[i::cores] for i in range(cores)]))
        every, cpu_every = done / (time.perf_counter() - t0), (time.process_time() - c0) / done
    return {"one_core": one, "all_cores": every, "cores": cores, "decoder": images.DECODER_NAME,
            "cpu_per_image": cpu, "cpu_per_image_all_cores": cpu_every}


# --------------------------------------------------------------------------- one timed epoch
def steady_rate(marks: list[tuple[float, int]], rows: int) -> float | None:
    """Rows/s between the batches that crossed 10% and 90% of the epoch's rows: the rate once start-up is
    over and before the tail drains (None when the epoch had too few batches to tell)."""
    lo = next((m for m in marks if m[1] >= 0.1 * rows), None)
    hi = next((m for m in marks if m[1] >= 0.9 * rows), None)
    if lo is None or hi is None or hi[0] <= lo[0]:
        return None
    return (hi[1] - lo[1]) / (hi[0] - lo[0])


def run_epoch(job: dict[str, Any]) -> dict[str, Any]:
    """Import, start the clock, iterate one epoch; rows/s (whole epoch and steady state), time to first
    batch, CPU seconds of the process tree, and the content checks."""
    import importlib

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    for module in IMPORTS[job["tool"]].split():
        importlib.import_module(module)
    if job["tool"] == "ray":
        import ray

        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 _temp_dir=job["scratch"], logging_level="ERROR")
        ray.data.DataContext.get_current().enable_progress_bars = False
    probes = np.asarray(job["probes"], np.int64)
    rows = label_sum = 0
    digests: dict[str, str] = {}
    marks: list[tuple[float, int]] = []
    shape = None
    cpu_start = tree_cpu_seconds()
    start = time.perf_counter()
    for images, labels, vecs in PIPELINES[job["tool"]](job):
        # images stay the tool's tensors (a TensorFlow tensor's .numpy() costs make_tf_dataset 25% of its rate,
        # and a model never calls it); only the probe rows' pixels are read out
        labels, vecs = np.asarray(labels), np.asarray(vecs)
        rows += len(labels)
        marks.append((time.perf_counter() - start, rows))
        label_sum += int(labels.sum())
        shape = list(images.shape[1:])
        for i in np.flatnonzero(np.isin(vecs[:, 0].astype(np.int64), probes)):
            digests[str(int(vecs[i, 0]))] = probe_digest(np.asarray(images[int(i)]), vecs[i])
    seconds = time.perf_counter() - start
    cpu = tree_cpu_seconds() - cpu_start
    return {"rows": rows, "seconds": seconds, "ttfb": marks[0][0] if marks else None, "label_sum": label_sum,
            "digests": digests, "image_shape": shape, "steady": steady_rate(marks, rows), "cpu_s": cpu}


def main(argv: list[str]) -> int:
    if argv[:1] == ["write"]:
        tool, source, target = argv[1], argv[2], Path(argv[3])
        WRITERS[tool](load_content(source), target)
        return 0
    job = json.loads(argv[0])
    result = decode_limit(job) if job["tool"] == "decode_limit" else run_epoch(job)
    print(json.dumps(result))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
