"""One contender of ``benchmarks/streaming.py`` in one process: one epoch read from the S3 proxy.

Runs in the contender's own venv, like ``peers_side.py``, whose timing (``run_epoch``), decoding and
checks it reuses: it adds each tool's pipeline over object storage to ``peers_side.PIPELINES``.
The job carries ``endpoint`` (the proxy, ``http://127.0.0.1:PORT``), ``bucket`` and ``data`` (the
copy's prefix in the bucket); credentials are moto's dummy ones, in the environment.

    python streaming_side.py '{"tool": "s3_unihub_batched", "endpoint": ..., "bucket": ..., "data": ...}'
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = str(Path(__file__).resolve().parent)
sys.path.insert(0, HERE)

import peers_side  # noqa: E402
from peers_side import Batch, _decode_item  # noqa: E402

# this folder's streaming.py (the benchmark) would hide MosaicML's ``streaming`` package
sys.path[:] = [p for p in sys.path if p not in ("", HERE)]


def _s3_url(job: dict[str, Any], *parts: str) -> str:
    return "/".join([f"s3://{job['bucket']}", job["data"], *parts])


def _http_url(job: dict[str, Any], *parts: str) -> str:
    return "/".join([job["endpoint"], job["bucket"], job["data"], *parts])


def _keys(job: dict[str, Any], suffix: str) -> list[str]:
    """The keys under the copy's prefix that end with ``suffix`` (one unsigned ListObjectsV2 through the
    proxy: not every peer's venv has an S3 client)."""
    import urllib.parse
    import urllib.request
    import xml.etree.ElementTree as ET

    query = urllib.parse.urlencode({"list-type": "2", "prefix": job["data"] + "/", "max-keys": "1000"})
    with urllib.request.urlopen(f"{job['endpoint']}/{job['bucket']}?{query}", timeout=60) as answer:
        root = ET.fromstring(answer.read())
    keys = [e.text or "" for e in root.iter() if e.tag.endswith("}Key") or e.tag == "Key"]
    return sorted(k for k in keys if k.endswith(suffix))


def _s3fs_options(job: dict[str, Any]) -> dict[str, Any]:
    return {"client_kwargs": {"endpoint_url": job["endpoint"]}, "key": "testing", "secret": "testing"}


def unihub_s3(job: dict[str, Any]) -> Iterator[Batch]:
    """unihub's ``BatchedDataLoader(make_batch_reader)`` (or its row ``DataLoader(make_reader)``) over s3fs
    (``storage_options``), or pyarrow's S3 filesystem (``filesystem: pyarrow``: the endpoint in the URL)."""
    from unihub import make_batch_reader, make_reader
    from unihub.bridges.torch import BatchedDataLoader, DataLoader

    batched = job.get("variant", "batched") == "batched"  # "rows": make_reader
    make, loader_class = (make_batch_reader, BatchedDataLoader) if batched else (make_reader, DataLoader)
    options: dict[str, Any] = {"num_epochs": 1, "shuffle_row_groups": False, "seed": 0}
    url = _s3_url(job, job.get("copy", "")).rstrip("/")
    if job.get("filesystem") == "pyarrow":  # pyarrow's own S3 filesystem, the endpoint in the URL
        url += f"?endpoint_override={job['endpoint'].split('://')[1]}&scheme=http"
    else:
        options["storage_options"] = _s3fs_options(job)
    if job.get("cache_dir"):
        options.update(cache_type="local-disk", cache_location=job["cache_dir"], cache_size_limit=10 << 30,
                       cache_extra_settings={"cleanup": False})
    options.update(job.get("reader_options", {}))
    if job.get("shard_count"):
        options.update(cur_shard=job["rank"], shard_count=job["shard_count"])
    with loader_class(make(url, **options), batch_size=64) as loader:
        for batch in loader:
            yield batch["image"], batch["label"], batch["vec"]


def ray_s3(job: dict[str, Any]) -> Iterator[Batch]:
    """Ray Data ``read_parquet`` over pyarrow's S3 filesystem pointed at the proxy."""
    import pyarrow.fs as pafs
    import ray

    fs = pafs.S3FileSystem(endpoint_override=job["endpoint"], access_key="testing", secret_key="testing",
                           region="us-east-1")
    ds = ray.data.read_parquet(f"{job['bucket']}/{job['data']}", filesystem=fs)
    ds = ds.map_batches(peers_side._ray_decode, batch_format="numpy", batch_size=256)
    for batch in ds.iter_torch_batches(batch_size=64):
        yield batch["image"], batch["label"], batch["vec"]


def lance_s3(job: dict[str, Any]) -> Iterator[Batch]:
    """Lance's scanner over its own object-store client (``storage_options`` with the endpoint)."""
    import lance

    options = {"endpoint": job["endpoint"], "allow_http": "true", "aws_access_key_id": "testing",
               "aws_secret_access_key": "testing", "region": "us-east-1"}
    ds = lance.dataset(_s3_url(job, "data.lance"), storage_options=options)
    for rb in ds.to_batches(batch_size=64):
        yield peers_side._lance_batch(rb, job.get("threads", 2))


def hf_s3(job: dict[str, Any]) -> Iterator[Batch]:
    """HF ``datasets``, ``load_dataset("arrow", data_files="s3://...", streaming=True)`` over s3fs (installed
    beside its venv for this benchmark): ``iter(batch_size=64)`` decoding each batch by ``threads`` threads,
    or (``workers``) a torch ``DataLoader`` whose workers decode rows."""
    import datasets
    import torch

    files = [f"s3://{job['bucket']}/{key}" for key in _keys(job, ".arrow")]
    ds = datasets.load_dataset("arrow", data_files=files, split="train", streaming=True,
                               storage_options=_s3fs_options(job))
    peers_side._HF_THREADS = job.get("threads", 2)
    if job.get("workers"):  # rows decoded in the loader's workers, collated by it
        ds = ds.map(peers_side._decode_item)
        loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=job["workers"])
        for batch in loader:
            yield batch["image"], batch["label"], batch["vec"]
        return
    for rows in ds.iter(batch_size=64):  # batches of 64 rows, decoded by ``threads`` threads
        batch = peers_side._hf_transform(rows)
        yield batch["image"], batch["label"], batch["vec"]


def litdata_s3(job: dict[str, Any]) -> Iterator[Batch]:
    """LitData ``StreamingDataset`` over ``s3://`` (its S3 client pointed at the proxy), ``StreamingDataLoader``."""
    import litdata
    from litdata.streaming import downloader

    # its chunk GETs go through obstore, which refuses plain http unless told (the proxy is http; S3 is https)
    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}
    ds = litdata.StreamingDataset(_s3_url(job, "litdata"), shuffle=False, seed=0, transform=_decode_item,
                                  cache_dir=os.path.join(job["scratch"], "litdata-cache"),
                                  storage_options={"endpoint_url": job["endpoint"]})
    for batch in litdata.StreamingDataLoader(ds, batch_size=64, num_workers=job.get("workers", 2)):
        yield batch["image"], batch["label"], batch["vec"]


def mosaic_s3(job: dict[str, Any]) -> Iterator[Batch]:
    """MosaicML Streaming: ``StreamingDataset(remote=s3://..., local=scratch)`` (boto3; ``S3_ENDPOINT_URL``)."""
    import torch
    from streaming.base.util import clean_stale_shared_memory

    os.environ["S3_ENDPOINT_URL"] = job["endpoint"]
    clean_stale_shared_memory()
    ds = peers_side._mosaic_class()(remote=_s3_url(job, "mds"), local=os.path.join(job["scratch"], "mds"),
                                    batch_size=64, shuffle=False)
    for batch in torch.utils.data.DataLoader(ds, batch_size=64, num_workers=job.get("workers", 2)):
        yield batch["image"], batch["label"], batch["vec"]


def wds_s3(job: dict[str, Any]) -> Iterator[Batch]:
    """WebDataset over ``pipe:curl`` of each shard's URL (its documented way to stream from a store)."""
    import webdataset as wds

    urls = [f"pipe:curl -s -f {job['endpoint']}/{job['bucket']}/{key}" for key in _keys(job, ".tar")]
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False, nodesplitter=wds.split_by_node)
    ds = ds.map(peers_side._wds_decode).batched(64, collation_fn=peers_side._wds_collate)
    yield from wds.WebLoader(ds, batch_size=None, num_workers=job.get("workers", 2))


def _register() -> None:
    peers_side.PIPELINES.update({"s3_unihub": unihub_s3, "s3_ray": ray_s3, "s3_lance": lance_s3, "s3_hf": hf_s3,
                                 "s3_litdata": litdata_s3, "s3_mosaic": mosaic_s3, "s3_wds": wds_s3})
    peers_side.IMPORTS.update({"s3_unihub": "torch unihub.bridges.torch.loaders s3fs", "s3_ray": "torch ray ray.data",
                               "s3_lance": "torch lance", "s3_hf": "torch datasets", "s3_litdata": "torch litdata",
                               "s3_mosaic": "torch streaming", "s3_wds": "torch webdataset"})


def _before_clock(argv: list[str]) -> None:
    """What ``peers_side.run_epoch`` does before its clock for its own Ray contender: ``ray.init``."""
    if argv and not argv[0] == "write" and json.loads(argv[0]).get("tool") == "s3_ray":
        import ray

        job = json.loads(argv[0])
        # Ray's workers unpickle this module's pipeline functions by reference (peers_side._ray_decode): they
        # import it from this folder, which their sys.path has only through PYTHONPATH
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 _temp_dir=job.get("scratch"), logging_level="ERROR")
        ray.data.DataContext.get_current().enable_progress_bars = False


if __name__ == "__main__":
    _extra = json.loads(sys.argv[1]).get("extra_path") if len(sys.argv) > 1 and sys.argv[1] != "write" else None
    if _extra:
        sys.path.append(_extra)  # packages this benchmark adds beside a peer's venv (s3fs for HF), after its own
    _register()
    _before_clock(sys.argv[1:])
    raise SystemExit(peers_side.main(sys.argv[1:]))
