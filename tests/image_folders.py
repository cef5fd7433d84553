"""Small image folders of PNGs (root/<class>/<n>.png) and the rows a conversion of one stores."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from unihub import open_dataset
from unihub.cli.demo import make_image
from unihub.images.decoders import encode_image


def write_image_folder(root: Path, *, seed: int = 1, classes: int = 5, per_class: int = 6,
                       height: int = 12, width: int = 10) -> Path:
    """``classes`` x ``per_class`` random PNGs of ``height`` x ``width`` x 3 under ``root``."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(per_class):
            (root / f"class{c}" / f"{i:02d}.png").write_bytes(encode_image(make_image(rng, height, width), "png"))
    return root


def rows_of(path: Path) -> list[tuple]:
    """(path, label, image bytes) of every stored row of a converted image folder, in order."""
    store = open_dataset(path)
    rows = []
    for i in range(len(store.row_groups)):
        table = store.read_row_group(i)
        rows.extend(zip(*(table.column(n).to_pylist() for n in ("path", "label", "image"))))
    return rows
