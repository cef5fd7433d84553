"""Benchmark PNG and JPEG decoders (and encoders) for uint8 images.

Run ``python benchmarks/image_decoders.py [--rows N] [--format png|jpeg]``
(about 40 s on 2 cores; needs opencv-python-headless, which writes the test
files as Petastorm did; other candidates are timed when installed). For each
format (PNG, JPEG quality 90) and image shape (64x64x3, 256x256x3, 64x64
gray) it times every candidate decoding ``N`` encoded rows:

- ``1 thread``: one loop in a pool worker thread, as in the reader;
- ``2 threads``: the same rows split in two halves decoded by a
  ``ThreadPoolExecutor(2)``. A decoder that releases the GIL gets close to
  2x on two cores; one that holds it stays at ~1x.

Every decoder produces RGB / gray channel order (OpenCV pays for its BGR->RGB
swap), so the numbers compare what :mod:`unihub.images.decoders` needs.
Variants marked ``out=`` decode into a preallocated ``(n, H, W, C)`` column,
the way a reader fills a whole batch; ``unihub decode_image`` is the chosen
backend behind the module's own checks. A second table times the encoders
(one thread) and the encoded size, to choose the PNG compression level.

Each cell sums ``--layouts`` memory layouts (see :func:`bench_decoder`), each
the best of ``--repeat`` timings. Other processes still skew the numbers:
the script warns when the load average is high, and the 2-thread column
needs both cores idle.

The ``chosen`` column marks the backend :mod:`images/decoders.py` uses. The
images are smooth gradients plus mild noise: neither constant (which
flatters PNG) nor white noise (which no camera produces).
"""

from __future__ import annotations

import argparse
import io
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

# Idle OpenBLAS (numpy) and OpenCV pool threads spin-wait after use and steal
# CPU from the decoding threads: on the 2-core machine this halved some
# single-thread numbers at random. Pin them before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

Decode = Callable[[bytes], np.ndarray]
DecodeInto = Callable[[bytes, np.ndarray], object]

SHAPES: dict[str, tuple[int, ...]] = {
    "64x64x3": (64, 64, 3),
    "256x256x3": (256, 256, 3),
    "64x64 gray": (64, 64),
}
JPEG_QUALITY = 90
CHOSEN = {"png": "imagecodecs.png", "jpeg": "simplejpeg"}


def make_image(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Smooth gradients and low-frequency waves plus Gaussian noise (sigma 3)."""
    rng = np.random.default_rng(seed)
    h, w = shape[:2]
    channels = shape[2] if len(shape) == 3 else 1
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    planes = []
    for _ in range(channels):
        fx, fy, phase = rng.uniform(0.5, 3.0), rng.uniform(0.5, 3.0), rng.uniform(0, 6.3)
        base = rng.uniform(40, 200)
        plane = (
            base
            + 40 * np.sin(2 * np.pi * fx * x / w + phase) * np.cos(2 * np.pi * fy * y / h)
            + 30 * (x / w - 0.5)
            + 20 * (y / h - 0.5)
            + rng.normal(0, 3, (h, w))
        )
        planes.append(plane)
    image = np.clip(np.stack(planes, -1), 0, 255).astype(np.uint8)
    return image if len(shape) == 3 else image[..., 0]


def encode_reference(image: np.ndarray, fmt: str) -> bytes:
    """Encode with OpenCV defaults (what Petastorm wrote): PNG level 1, JPEG q90 4:2:0."""
    import cv2

    bgr = image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
    params = [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY] if fmt == "jpeg" else []
    ok, buf = cv2.imencode("." + fmt, bgr, params)
    assert ok
    return buf.tobytes()


# ---------------------------------------------------------------- decoders
def png_decoders() -> dict[str, tuple[Decode, DecodeInto | None]]:
    """Candidate PNG decoders that are importable, name -> (decode, decode_into)."""
    found: dict[str, tuple[Decode, DecodeInto | None]] = {}
    try:
        import imagecodecs

        found["imagecodecs.png"] = (
            imagecodecs.png_decode,
            lambda d, o: imagecodecs.png_decode(d, out=o),
        )
        found["imagecodecs.spng"] = (
            imagecodecs.spng_decode,
            lambda d, o: imagecodecs.spng_decode(d, out=o),
        )
    except ImportError:
        pass
    try:
        import pyspng

        found["pyspng"] = (pyspng.load, None)
    except ImportError:
        pass
    found.update(_cv2_decoders(jpeg=False))
    found.update(_pil_decoders())
    found.update(_unihub_decoders())
    return found


def jpeg_decoders(gray: bool) -> dict[str, tuple[Decode, DecodeInto | None]]:
    """Candidate JPEG decoders that are importable, name -> (decode, decode_into)."""
    found: dict[str, tuple[Decode, DecodeInto | None]] = {}
    try:
        import simplejpeg

        space = "GRAY" if gray else "RGB"

        def sj_into(data: bytes, out: np.ndarray) -> object:
            return simplejpeg.decode_jpeg(data, colorspace=space, buffer=out)

        found["simplejpeg"] = (lambda d: simplejpeg.decode_jpeg(d, colorspace=space), sj_into)
    except ImportError:
        pass
    try:
        import imagecodecs

        found["imagecodecs.jpeg8"] = (
            imagecodecs.jpeg8_decode,
            lambda d, o: imagecodecs.jpeg8_decode(d, out=o),
        )
    except ImportError:
        pass
    found.update(_cv2_decoders(jpeg=True, gray=gray))
    found.update(_pil_decoders())
    found.update(_unihub_decoders())
    return found


def _unihub_decoders() -> dict[str, tuple[Decode, DecodeInto | None]]:
    """The chosen backend behind unihub's own checks (format sniffing, header, ``out`` shape)."""
    try:
        from unihub.images.decoders import decode_image
    except ImportError:
        return {}
    return {"unihub decode_image": (decode_image, lambda d, o: decode_image(d, out=o))}


def _cv2_decoders(jpeg: bool, gray: bool = False) -> dict[str, tuple[Decode, DecodeInto | None]]:
    try:
        import cv2
    except ImportError:
        return {}

    if jpeg:
        flag = cv2.IMREAD_GRAYSCALE if gray else cv2.IMREAD_COLOR_RGB

        def decode(data: bytes) -> np.ndarray:
            return cv2.imdecode(np.frombuffer(data, np.uint8), flag)

    else:

        def decode(data: bytes) -> np.ndarray:
            image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
            if image.ndim == 3:
                image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
            return image

    return {"cv2": (decode, None)}


def _pil_decoders() -> dict[str, tuple[Decode, DecodeInto | None]]:
    try:
        from PIL import Image
    except ImportError:
        return {}

    def decode(data: bytes) -> np.ndarray:
        with Image.open(io.BytesIO(data)) as image:
            return np.asarray(image)

    return {"pillow": (decode, None)}


# ---------------------------------------------------------------- timing
def elapsed(work: Callable[[int, int], object], n: int, threads: int, pool: ThreadPoolExecutor) -> float:
    """Seconds for ``work(start, stop)`` over n rows, split evenly across threads."""
    bounds = np.linspace(0, n, threads + 1).astype(int)
    spans = list(zip(bounds[:-1], bounds[1:], strict=True))
    start = time.perf_counter()
    if threads == 1:
        pool.submit(work, 0, n).result()  # a worker thread, as in the reader
    else:
        list(pool.map(lambda span: work(*span), spans))
    return time.perf_counter() - start


def bench_decoder(
    blobs: Sequence[bytes],
    shape: tuple[int, ...],
    decode: Decode,
    decode_into: DecodeInto | None,
    pool: ThreadPoolExecutor,
    layouts: int,
    repeat: int,
) -> tuple[float, float]:
    """(rows/s one thread, rows/s two threads) for one decoder, over several memory layouts.

    libjpeg-turbo's SIMD colour conversion slows down up to 2x when the output
    rows and its scratch buffers sit at the same offset modulo 4 KiB (4K
    aliasing), so one layout can flatter or punish a decoder by chance. Each
    layout moves the output column and the heap, and keeps the best of
    ``repeat`` timings (other processes only ever slow a run down); rows/s is
    total rows over the summed times, the throughput expected over layouts.
    """
    n = len(blobs)
    rng = np.random.default_rng(0)
    row_bytes = int(np.prod(shape))
    seconds = [0.0, 0.0]
    for _ in range(layouts):
        spacer = bytearray(int(rng.integers(1, 64)) * 64)  # noqa: F841 -- shifts later mallocs
        column = None
        if decode_into is not None:
            raw = np.empty(n * row_bytes + 4096, np.uint8)
            offset = (-raw.ctypes.data) % 64 + int(rng.integers(0, 64)) * 64
            column = raw[offset : offset + n * row_bytes].reshape(n, *shape)
        work = _decode_rows(blobs, decode, decode_into, column)
        work(0, min(n, 8))  # warm up: imports, lazily built tables, page faults
        seconds[0] += min(elapsed(work, n, 1, pool) for _ in range(repeat))
        seconds[1] += min(elapsed(work, n, 2, pool) for _ in range(repeat))
    return n * layouts / seconds[0], n * layouts / seconds[1]


def _decode_rows(
    blobs: Sequence[bytes], decode: Decode, decode_into: DecodeInto | None, column: np.ndarray | None
) -> Callable[[int, int], None]:
    """``work(lo, hi)`` decoding rows lo..hi, into ``column`` when given."""

    def work(lo: int, hi: int) -> None:
        if column is None or decode_into is None:
            for i in range(lo, hi):
                decode(blobs[i])
        else:
            for i in range(lo, hi):
                decode_into(blobs[i], column[i])

    return work


def check_output(name: str, decode: Decode, blob: bytes, image: np.ndarray, lossless: bool) -> None:
    """Fail loudly if a candidate returns the wrong shape or channel order."""
    got = np.asarray(decode(blob)).reshape(image.shape)
    diff = np.abs(got.astype(np.int16) - image).mean()
    if diff > (0 if lossless else 4):
        raise SystemExit(f"{name} decodes wrongly (mean abs diff {diff:.2f})")


def decode_table(
    formats: Sequence[str], rows: int, layouts: int, repeat: int, pool: ThreadPoolExecutor
) -> list[str]:
    """Markdown rows for every (format, shape, decoder)."""
    lines = [
        "| format | size | decoder | rows/s 1 thread | rows/s 2 threads | 2T speedup | chosen |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for fmt in formats:
        for label, shape in SHAPES.items():
            images = [make_image(shape, seed) for seed in range(16)]
            blobs = [encode_reference(images[i % 16], fmt) for i in range(rows)]
            gray = len(shape) == 2
            candidates = png_decoders() if fmt == "png" else jpeg_decoders(gray)
            for name, (decode, decode_into) in candidates.items():
                check_output(name, decode, blobs[0], images[0], lossless=fmt == "png")
                variants = [(name, None)]
                if decode_into is not None:
                    variants.append((name + " out=", decode_into))
                for vname, into in variants:
                    one, two = bench_decoder(blobs, shape, decode, into, pool, layouts, repeat)
                    mark = "yes" if name == CHOSEN[fmt] else "(wraps it)" if name.startswith("unihub") else ""
                    lines.append(
                        f"| {fmt} | {label} | {vname} | {one:,.0f} | {two:,.0f} "
                        f"| {two / one:.2f}x | {mark} |"
                    )
    return lines


# ---------------------------------------------------------------- encoders
def encoders(fmt: str, gray: bool) -> dict[str, Callable[[np.ndarray], bytes]]:
    """Candidate encoders taking RGB / gray arrays."""
    found: dict[str, Callable[[np.ndarray], bytes]] = {}
    try:
        import cv2

        def cv2_encode(params: list[int]) -> Callable[[np.ndarray], bytes]:
            def encode(a: np.ndarray) -> bytes:
                bgr = a if a.ndim == 2 else cv2.cvtColor(a, cv2.COLOR_RGB2BGR)
                return cv2.imencode("." + fmt, bgr, params)[1].tobytes()

            return encode

        if fmt == "png":  # an explicit level would switch OpenCV to zlib's default strategy
            found["cv2 default (level 1, RLE, SUB)"] = cv2_encode([])
        else:
            found["cv2"] = cv2_encode([cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    except ImportError:
        pass
    try:
        import imagecodecs

        if fmt == "png":
            for level in (1, 3, 6):
                found[f"imagecodecs.png level={level}"] = (
                    lambda a, lv=level: imagecodecs.png_encode(a, level=lv)
                )
            found["imagecodecs.png level=1 rle+sub"] = lambda a: imagecodecs.png_encode(
                a, level=1, strategy=3, filter=16
            )
            found["imagecodecs.spng level=1"] = lambda a: imagecodecs.spng_encode(a, level=1)
        else:
            found["imagecodecs.jpeg8"] = lambda a: imagecodecs.jpeg8_encode(
                a, level=JPEG_QUALITY
            )
    except ImportError:
        pass
    if fmt == "jpeg":
        try:
            import simplejpeg

            space = "GRAY" if gray else "RGB"
            sub = "Gray" if gray else "420"
            found["simplejpeg"] = lambda a: simplejpeg.encode_jpeg(
                a.reshape(a.shape[0], a.shape[1], -1), JPEG_QUALITY, space, sub
            )
        except ImportError:
            pass
    try:
        from PIL import Image

        def pil_encode(a: np.ndarray) -> bytes:
            buf = io.BytesIO()
            options = {"compress_level": 1} if fmt == "png" else {"quality": JPEG_QUALITY}
            Image.fromarray(a).save(buf, format=fmt.upper(), **options)
            return buf.getvalue()

        found["pillow level=1" if fmt == "png" else "pillow"] = pil_encode
    except ImportError:
        pass
    return found


def encode_table(formats: Sequence[str], rows: int, repeat: int) -> list[str]:
    """Markdown rows: encoder speed (one thread, best of ``repeat``) and mean encoded size."""
    lines = [
        "| format | size | encoder | rows/s 1 thread | mean bytes |",
        "|---|---|---|---:|---:|",
    ]
    for fmt in formats:
        for label, shape in SHAPES.items():
            images = [make_image(shape, seed) for seed in range(16)]
            for name, encode in encoders(fmt, len(shape) == 2).items():
                size = np.mean([len(encode(image)) for image in images])
                best = float("inf")
                for _ in range(repeat):
                    start = time.perf_counter()
                    for i in range(rows):
                        encode(images[i % 16])
                    best = min(best, time.perf_counter() - start)
                lines.append(f"| {fmt} | {label} | {name} | {rows / best:,.0f} | {size:,.0f} |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100, help="images decoded per timing")
    parser.add_argument("--layouts", type=int, default=5, help="memory layouts per decoder cell")
    parser.add_argument("--repeat", type=int, default=3, help="timings per layout, best kept")
    parser.add_argument("--format", choices=["png", "jpeg"], help="only this format (default: both)")
    parser.add_argument("--no-encode", action="store_true", help="skip the encoder table")
    args = parser.parse_args(argv)
    formats = [args.format] if args.format else ["png", "jpeg"]
    start = time.perf_counter()
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"warning: load average {load:.1f} before starting; other processes will skew the timings\n")
    try:
        import cv2

        cv2.setNumThreads(1)  # one thread per call, like every other candidate
    except ImportError:
        pass
    with ThreadPoolExecutor(2) as pool:
        print("\n".join(decode_table(formats, args.rows, args.layouts, args.repeat, pool)))
    if not args.no_encode:
        print()
        print("\n".join(encode_table(formats, max(args.rows // 4, 16), args.repeat)))
    print(
        f"\n({time.perf_counter() - start:.0f} s; {args.rows} rows x {args.layouts} memory layouts "
        f"x best of {args.repeat} per decoder cell; {os.cpu_count()} CPUs; load average {load:.1f} at start, "
        f"{os.getloadavg()[0]:.1f} at end)"
    )


if __name__ == "__main__":
    main()
