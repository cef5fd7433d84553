"""The README's main job, end to end on generated data (``unihub demo``).

1. write a dataset with images, tensors and scalars (:func:`unihub.cli.demo.write_demo_dataset`);
2. generate the legacy sources a team has: TFRecord shards (JPEG + label + float vector) and
   an image folder (``root/<class>/<file>.png``);
3. convert both into unihub datasets (``convert``, one worker per core) and inspect them;
4. read the image dataset with the PyTorch ``DataLoader`` (shuffled) and train a tiny
   convolutional model for a few steps; read the TFRecord one with ``BatchedDataLoader``;
5. print what each step cost, with throughput.

Everything lands under one directory (an earlier demo's is replaced; one holding other files is refused)::

    unihub demo /tmp/unihub-demo

:func:`run` is the story; :func:`add_demo_command` registers the command that tells it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from unihub.bridges.torch.loaders import BatchedDataLoader, DataLoader
from unihub.cli.demo import make_image, write_demo_dataset
from unihub.cli.parsers import add_command, arg
from unihub.converters.convert import convert
from unihub.dependencies import is_available
from unihub.errors import InvalidArgumentError
from unihub.formats.imagefolder.format import ImageFolderFormat
from unihub.formats.tfrecord.format import TFRecordFormat
from unihub.images.decoders import encode_image
from unihub.readers.reader import make_batch_reader, make_reader
from unihub.schema.codecs import CompressedImageCodec, ScalarCodec, TensorCodec
from unihub.schema.unischema import Unischema, UnischemaField
from unihub.viewer.describe import describe_dataset, format_description

CLASSES = [f"class_{k}" for k in range(10)]

SourceSchema = Unischema("Source", [
    UnischemaField("image", np.uint8, (64, 64, 3), CompressedImageCodec("jpeg", quality=90), False),
    UnischemaField("label", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("vec", np.float32, (16,), TensorCodec(), False),
])


#: one colour per class: a tiny model learns the classes in a few dozen steps
_PALETTE = np.array([[230, 25, 75], [60, 180, 75], [255, 225, 25], [0, 130, 200], [245, 130, 48],
                     [145, 30, 180], [70, 240, 240], [240, 50, 230], [128, 128, 0], [0, 0, 128]], np.float32)


def _class_image(rng: np.random.Generator, label: int) -> np.ndarray:
    """A random gradient tinted with the class's colour."""
    return (0.4 * make_image(rng) + 0.6 * _PALETTE[label]).astype(np.uint8)


def _source_batches(rows: int, fmt: str, seed: int, batch: int = 256) -> Iterator[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    for start in range(0, rows, batch):
        labels = (np.arange(start, min(rows, start + batch)) % len(CLASSES)).astype(np.int64)
        yield {"image": [encode_image(_class_image(rng, int(k)), fmt, **({"quality": 90} if fmt == "jpeg" else {}))
                         for k in labels],
               "label": labels,
               "vec": rng.standard_normal((len(labels), 16), dtype=np.float32)}


def write_sources(root: str, rows: int) -> tuple[str, str]:
    """TFRecord shards and an image folder of ``rows`` rows each; returns their paths."""
    tfrecords = os.path.join(root, "sources", "tfrecord")
    folder = os.path.join(root, "sources", "images")
    TFRecordFormat.write(tfrecords, SourceSchema, _source_batches(rows, "jpeg", seed=1),
                         records_per_file=max(1, -(-rows // 4)))
    image_only = Unischema("Images", [UnischemaField("image", np.uint8, (64, 64, 3), CompressedImageCodec("png"), False),
                                      SourceSchema.label])
    ImageFolderFormat.write(folder, image_only, ({"image": b["image"], "label": b["label"]}
                                                 for b in _source_batches(rows, "png", seed=2)), classes=CLASSES)
    return os.path.join(tfrecords, "*.tfrecord"), folder


def train_a_few_steps(url: str, steps: int, say: Callable[[str], None]) -> None:
    """A tiny conv net on the image dataset, fed by unihub's PyTorch DataLoader (shuffled)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 5, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                          nn.Linear(8 * 16, len(CLASSES)))
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
    losses: list[float] = []
    seen = 0
    start = time.perf_counter()
    reader = make_reader(url, schema_fields=["image", "label"], num_epochs=None, seed=0)
    # an image folder is stored class by class: a queue of a few row groups mixes the classes
    with DataLoader(reader, batch_size=64, shuffling_queue_capacity=2048, seed=0) as loader:
        for step, batch in enumerate(loader):
            if step == steps:
                break
            images = batch["image"].permute(0, 3, 1, 2).float() / 255
            loss = nn.functional.cross_entropy(model(images), batch["label"].long())
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            losses.append(float(loss.detach()))
            seen += len(images)
    seconds = time.perf_counter() - start
    say(f"trained {len(losses)} steps of batch 64 on {url}: loss {np.mean(losses[:5]):.3f} -> "
        f"{np.mean(losses[-5:]):.3f}, {seen / seconds:,.0f} rows/s including the model")


#: what a demo writes in its folder (and the staging areas beside them, ``.NAME.unihub-...``)
DEMO_ENTRIES = frozenset({"demo", "sources", "tfrecord_unihub", "images_unihub"})


def _clear(root: str) -> None:
    """Make ``root`` an empty folder: an earlier demo's is emptied, any other that holds something is refused
    (removing it would delete someone's files: ``unihub demo .``)."""
    if os.path.isdir(root):
        foreign = sorted(name for name in os.listdir(root) if name not in DEMO_ENTRIES and ".unihub-" not in name)
        if foreign:
            shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
            raise InvalidArgumentError(f"{root} holds files no demo wrote ({shown}): the demo replaces its folder; "
                                       "name a new or empty one, or an earlier demo's")
        shutil.rmtree(root, ignore_errors=True)  # '.' itself stays
    os.makedirs(root, exist_ok=True)


def run(root: str, *, rows: int = 2000, steps: int = 60, say: Callable[[str], None] = print) -> None:
    """Every step of the main job under ``root`` (a new or empty folder, or an earlier demo's, which is
    replaced); ``say`` gets each report line."""
    for name, value, least in (("rows", rows, 1), ("steps", steps, 0)):  # steps=-1 would train forever
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InvalidArgumentError(f"{name} must be a whole number >= {least}, got {value!r}")
    _clear(root)

    def timed(what: str, fn: Callable[[], Any], count: int) -> Any:
        start = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - start
        say(f"{what}: {count:,} rows in {seconds:.2f} s ({count / seconds:,.0f} rows/s)")
        return result

    demo = os.path.join(root, "demo")
    timed(f"write_dataset {demo} (images, tensors, scalars)", lambda: write_demo_dataset(demo, rows=rows), rows)
    tfrecords, folder = timed("generate TFRecord shards and an image folder",
                              lambda: write_sources(root, rows), 2 * rows)
    datasets = {}
    for name, src in (("tfrecord", tfrecords), ("images", folder)):
        dst = os.path.join(root, f"{name}_unihub")
        timed(f"convert {src} -> {dst}", partial(convert, src, dst, workers=0, progress=False), rows)
        datasets[name] = dst
    for url in (demo, *datasets.values()):
        say("\n" + format_description(describe_dataset(url)) + "\n")
    if not is_available("torch"):
        say("PyTorch is not installed: pip install 'unihub[torch]' to read with the PyTorch loaders")
        return
    import torch  # noqa: F401  (imported before the timings, as a training script has it)

    def read_rows() -> int:
        with DataLoader(make_reader(datasets["images"]), batch_size=64) as loader:
            return sum(len(b["label"]) for b in loader)

    def read_batches() -> int:
        with BatchedDataLoader(make_batch_reader(datasets["tfrecord"]), batch_size=256) as loader:
            return sum(len(b["label"]) for b in loader)

    timed(f"PyTorch DataLoader, batch 64, decoded PNG: {datasets['images']}", read_rows, rows)
    timed(f"PyTorch BatchedDataLoader, batch 256, decoded JPEG + tensors: {datasets['tfrecord']}", read_batches, rows)
    train_a_few_steps(datasets["images"], steps, say)


def cmd_demo(args: argparse.Namespace) -> int:
    run(args.path, rows=args.rows, steps=args.steps, say=lambda line: print(line, flush=True))
    return 0


def add_demo_command(sub: Any) -> None:
    add_command(sub, "demo", cmd_demo,
                arg("path", nargs="?", default="unihub-demo",
                    help="where to write: a new or empty folder, or an earlier demo's (replaced)"),
                arg("--rows", type=int, default=2000, help="rows of each dataset (default 2000)"),
                arg("--steps", type=int, default=60, help="training steps of batch 64 (default 60)"),
                help="the main job on generated data: write, convert, inspect, train",
                description="Write a dataset with images, tensors and scalars; generate TFRecord shards and an image "
                            "folder and convert them; inspect all three; read them with the PyTorch loaders and train "
                            "a tiny model for a few steps; print throughput.",
                examples=["unihub demo /tmp/unihub-demo",
                          "unihub demo /tmp/unihub-demo --rows 500 --steps 10   # a quicker run"])
