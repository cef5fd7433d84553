"""What ``--validate-images full`` costs over ``header`` at ingest, on real photographs.

The JPEGs are cut from the photographs scikit-image ships in its wheel (``skimage/data``: astronaut,
chelsea, coffee, rocket, motorcycle, hubble, retina, ...), at ImageNet's typical sizes (crops of 200 to
500 pixels a side, quality 75 to 95, written by Pillow), so the entropy-coded data is that of real
photographs, not of noise. Point ``--photos`` at that folder (``pip download scikit-image --no-deps``,
unzip ``skimage/data/*``) or at any folder of PNG/JPEG photographs.

Reports, per image: the CPU time of the check alone (:func:`unihub.schema.image_checks.image_problem`
in each mode) and of a whole conversion of the folder (``convert(validate_images=...)``, process CPU
time, the median of ``--repeat`` runs).

    python -m unihub.benchmarks.validate_images --photos /tmp/skimage/data --images 300
"""

from __future__ import annotations

import argparse
import io
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


def make_jpegs(photos: Path, root: Path, count: int, seed: int = 0) -> list[bytes]:
    """``count`` JPEGs cut from the photographs in ``photos``, written under ``root/<class>/``."""
    from PIL import Image

    sources = []
    for path in sorted(photos.iterdir()):
        if path.suffix.lower() in (".png", ".jpg", ".jpeg"):
            image = Image.open(path).convert("RGB")
            if min(image.size) >= 200:
                sources.append(image)
    rng = np.random.default_rng(seed)
    written = []
    for i in range(count):
        image = sources[i % len(sources)]
        width, height = image.size
        w, h = (int(rng.integers(200, min(500, width) + 1)), int(rng.integers(200, min(500, height) + 1)))
        x, y = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
        buffer = io.BytesIO()
        image.crop((x, y, x + w, y + h)).save(buffer, "JPEG", quality=int(rng.integers(75, 96)))
        data = buffer.getvalue()
        folder = root / f"class{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:05d}.jpg").write_bytes(data)
        written.append(data)
    return written


def check_cost(blobs: list[bytes], mode: str) -> float:
    """CPU seconds per image of :func:`image_problem` in ``mode``."""
    from unihub.schema.codecs import CompressedImageCodec
    from unihub.schema.image_checks import image_problem
    from unihub.schema.unischema import UnischemaField

    field = UnischemaField("image", np.uint8, (None, None, 3), CompressedImageCodec("jpeg"), False)
    start = time.process_time()
    for blob in blobs:
        assert image_problem(blob, field, mode) is None  # type: ignore[arg-type]
    return (time.process_time() - start) / len(blobs)


def convert_cost(root: Path, mode: str, repeat: int) -> float:
    """CPU seconds per image of a whole conversion of ``root`` (the median of ``repeat`` runs)."""
    from unihub import convert

    times = []
    count = sum(1 for _ in root.rglob("*.jpg"))
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as out:
            start = time.process_time()
            convert(str(root), f"{out}/ds", validate_images=mode, progress=False)
            times.append(time.process_time() - start)
    return float(np.median(times)) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photos", type=Path, required=True)
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="unihub-validate-"))
    try:
        blobs = make_jpegs(args.photos, root / "photos", args.images)
        print(f"{len(blobs)} JPEGs, {np.mean([len(b) for b in blobs]) / 1024:.0f} KiB each on average")
        for mode in ("header", "full"):
            print(f"{mode:>6}: check {check_cost(blobs, mode) * 1e6:8.1f} us/image, whole conversion "
                  f"{convert_cost(root / 'photos', mode, args.repeat) * 1e3:6.2f} ms CPU/image")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
