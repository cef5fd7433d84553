"""Framework loaders side by side with Petastorm 0.13.1's, in one run, as ratios (issue 5).

Same files, same batch sizes; Petastorm runs in its own virtualenv (``petastorm_side.py``)
with its best reliable pool here (thread pool, 2 workers; a run that returns a short count
is discarded, as its thread pool sometimes does). Every timing runs from creating the reader
to the last batch (start-up included) and keeps the best of ``--repeats``.

Targets:

- PyTorch ``DataLoader`` over the 10,000-row 64x64 PNG dataset Petastorm wrote (id, image,
  label, embedding: Petastorm's default collate cannot stack the ragged ``boxes``), batch 64:
  >= 2x Petastorm's ``petastorm.pytorch.DataLoader``;
- the same with a 4,096-row shuffling queue: >= 3x Petastorm's (shuffled), and within 20%
  of unihub's own unshuffled rate;
- ``BatchedDataLoader`` over the 1M-row scalar Parquet, batch 1,024: >= 1.5x Petastorm's;
- tf.data over the image dataset, batches of 64: >= 2x Petastorm's
  ``make_petastorm_dataset(reader).batch(64)``.

    python benchmarks/loaders.py [--repeats 3] [--only torch,shuffled,batched,tf]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_reference_data import make_petastorm_images, make_plain_1m  # noqa: E402
from petastorm_env import ensure_petastorm_venv  # noqa: E402
from reader import best_time, petastorm, print_ratios  # noqa: E402

from unihub import make_batch_reader, make_reader  # noqa: E402

IMAGE_ROWS, PLAIN_ROWS = 10_000, 1_000_000
#: every field but the variable-shape ``boxes``, which Petastorm's default collate cannot stack
FIELDS = ["id", "image", "label", "embedding"]
CASES = ("torch", "shuffled", "batched", "tf")


def torch_rows(url: str, shuffling_queue_capacity: int = 0) -> int:
    from unihub.bridges.torch import DataLoader

    rows = 0
    with DataLoader(make_reader(url, schema_fields=FIELDS, workers_count=2), batch_size=64,
                    shuffling_queue_capacity=shuffling_queue_capacity) as loader:
        for batch in loader:
            rows += len(batch["id"])
    return rows


def batched_rows(url: str) -> int:
    from unihub.bridges.torch import BatchedDataLoader

    rows = 0
    with BatchedDataLoader(make_batch_reader(url, workers_count=2), batch_size=1024) as loader:
        for batch in loader:
            rows += len(batch["id"])
    return rows


def tf_rows(url: str) -> int:
    from unihub.bridges.tf.dataset import make_tf_dataset

    rows = 0
    with make_reader(url, schema_fields=FIELDS, workers_count=2) as reader:
        for batch in make_tf_dataset(reader, batch_size=64):
            rows += int(batch.id.shape[0])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default=",".join(CASES), help=f"comma-separated: {', '.join(CASES)}")
    args = parser.parse_args()
    only = [c for c in args.only.split(",") if c]
    python = ensure_petastorm_venv()
    images, plain = make_petastorm_images(), make_plain_1m()
    images_url, plain_url = f"file://{images}", f"file://{plain}"
    pet = {"url": images_url, "reader_pool_type": "thread", "workers_count": 2, "repeats": args.repeats,
           "expected_rows": IMAGE_ROWS, "batch_size": 64, "schema_fields": FIELDS}
    rows = []

    def ours(fn, expected: int) -> float:
        seconds, count = best_time(args.repeats, fn)
        assert count == expected, (fn, count, expected)
        return count / seconds

    if "torch" in only or "shuffled" in only:
        import torch  # noqa: F401  (imported before timing, as in a training script)

        import unihub.bridges.torch.loaders  # noqa: F401
    plain_rate = None
    if "torch" in only or "shuffled" in only:
        plain_rate = ours(lambda: torch_rows(images_url), IMAGE_ROWS)
    if "torch" in only:
        theirs = petastorm(python, {**pet, "kind": "pytorch_dataloader"})
        rows.append(("PyTorch DataLoader, 64x64 PNG, batch 64", plain_rate, theirs, 2.0, ""))
    if "shuffled" in only:
        shuffled = ours(lambda: torch_rows(images_url, 4096), IMAGE_ROWS)
        theirs = petastorm(python, {**pet, "kind": "pytorch_dataloader", "shuffling_queue_capacity": 4096})
        rows.append(("... with a 4,096-row shuffling queue", shuffled, theirs, 3.0,
                     f"{shuffled / plain_rate:.2f}x of unihub unshuffled (target >= 0.8x): "
                     f"{'ok' if shuffled / plain_rate >= 0.8 else 'MISSED'}"))
    if "batched" in only:
        import torch  # noqa: F401,F811

        mine = ours(lambda: batched_rows(plain_url), PLAIN_ROWS)
        theirs = petastorm(python, {**pet, "kind": "pytorch_batched_dataloader", "url": plain_url,
                                    "batch_size": 1024, "expected_rows": PLAIN_ROWS, "schema_fields": None})
        rows.append(("BatchedDataLoader, 1M-row scalar Parquet, batch 1,024", mine, theirs, 1.5, ""))
    if "tf" in only:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        import tensorflow  # noqa: F401

        import unihub.bridges.tf.dataset  # noqa: F401
        mine = ours(lambda: tf_rows(images_url), IMAGE_ROWS)
        theirs = petastorm(python, {**pet, "kind": "tf_dataset"})
        rows.append(("tf.data, 64x64 PNG, batch 64", mine, theirs, 2.0, ""))

    print_ratios(f"unihub loaders vs Petastorm 0.13.1's, {os.cpu_count()} cores, best of {args.repeats}", rows,
                 peer="Petastorm", note="note")


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"\n({time.perf_counter() - start:.0f} s)")
