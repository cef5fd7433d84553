"""Checking encoded images against their field at ingest, so that a conversion never stores one that fails at read.

A foreign source's image bytes are stored as they are (never re-encoded), so a corrupt image
would convert with exit 0 and fail only when a reader decodes it. Every format's reader checks
each image with :func:`image_problem` (or, a column at a time, :func:`bad_images`) at the level
``convert(validate_images=...)`` / ``unihub convert --validate-images`` asks for:

- ``'header'`` (the default; ~1 us an image, headers shared by a column's images parsed once): a PNG
  or JPEG header that parses, no more than :data:`~unihub.images.decoders.MAX_IMAGE_PIXELS` pixels,
  the shape and bit depth of the field (where it fixes them), and the end marker (PNG ``IEND``,
  JPEG ``EOI`` after the scan: a truncated file lacks it);
- ``'full'``: the header checks, then a decode of every image (catches corrupt compressed data
  behind a sound header; costs a decode per image);
- ``'none'``: no check (images are still refused at read, by the same checks).

Why ``'header'`` is the default, measured (``benchmarks/validate_images.py``: 300 JPEGs cut from real
photographs at ImageNet's sizes, 22 KiB each, one core): the header check costs 6.8 us an image, a
decode 424 us, so ``'full'`` makes a whole image-folder conversion 5.3x the CPU time (0.10 -> 0.53 ms an
image). An image whose compressed data is corrupt behind a sound header (which only a decode finds)
is then named at read time instead, by file, row group, row and field, and a reader or loader made
with ``on_decode_error='skip'`` drops its row and goes on (readers/decode.py). Ask for ``'full'`` where a
dataset must be proven decodable before it is published.

A problem is a reason string; the format names the file and record and raises it as a
:class:`~unihub.errors.FormatError`, or with ``on_error='skip'`` leaves the record out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa

from unihub.errors import InvalidArgumentError
from unihub.images import decoders as images
from unihub.schema.codecs import CompressedImageCodec
from unihub.schema.shapes import shape_matches

if TYPE_CHECKING:
    from unihub.schema.unischema import UnischemaField

ValidateImages = Literal["header", "full", "none"]
VALIDATE_IMAGES: tuple[ValidateImages, ...] = ("header", "full", "none")
_PNG_END = b"IEND\xaeB`\x82"  # the IEND chunk's type and CRC: the last 8 bytes of a whole PNG
_JPEG_EOI = b"\xff\xd9"


def check_mode(mode: object) -> ValidateImages:
    """``mode`` if it is one of :data:`VALIDATE_IMAGES`, else :class:`InvalidArgumentError`."""
    if mode not in VALIDATE_IMAGES:
        raise InvalidArgumentError(f"validate_images must be one of {', '.join(VALIDATE_IMAGES)}, got {mode!r}")
    return mode


def image_problem(data: images.Buffer, field: UnischemaField, mode: ValidateImages, *,
                  fit: bool = True) -> str | None:
    """Why ``data`` cannot be stored as an image of ``field`` (see the module docstring), or None.

    ``fit=False`` leaves out the shape and bit-depth checks (a provisional schema's shapes are
    not final yet); the pixel limit, header, end marker and (``'full'``) decode still apply.
    """
    if mode == "none":
        return None
    fmt = images.detect_format(data)
    size = images.image_size(data) if fmt is not None else None
    if fmt is None or size is None:
        return _header_problem(data, field, fit)
    problem = images.pixel_limit_problem(size[0], size[1], fmt)
    if problem is None and fit:
        problem = _fit_problem(data, fmt, size, field)
    return problem if problem is not None else body_problem(data, fmt, mode)


def body_problem(data: images.Buffer, fmt: str, mode: ValidateImages) -> str | None:
    """What :func:`image_problem` checks past a sound header (format ``fmt``): the end marker, and
    for ``'full'`` a decode."""
    if mode == "none":
        return None
    if not has_end(data):
        return f"truncated {fmt.upper()} ({len(data)} bytes, no end marker)"
    if mode == "full":
        try:
            images.decode_image(data)
        except images.ImageDecodeError as exc:
            return str(exc)
    return None


def bad_images(buffer: np.ndarray, starts: np.ndarray, ends: np.ndarray, field: UnischemaField,
               mode: ValidateImages, *, fit: bool = True) -> np.ndarray:
    """Which of the images ``buffer[starts[i]:ends[i]]`` :func:`image_problem` finds a problem with,
    as a bool array: one header check per group of images with equal headers
    (:func:`images.image_size_groups`) and the end markers compared in numpy; only the images
    that fail these are looked at one by one (``'full'`` decodes each)."""
    bad = np.zeros(len(starts), bool)
    if mode == "none" or not len(starts):
        return bad
    buffer = np.asarray(buffer, np.uint8)
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    view = memoryview(buffer.data)
    fmts = np.zeros(len(starts), np.int8)  # 1 PNG, 2 JPEG
    for size, fmt, rows in images.image_size_groups(buffer, starts, ends):
        first = int(rows[0])
        if size is None or _header_problem(view[starts[first]:ends[first]], field, fit) is not None:
            bad[rows] = True
        else:
            fmts[rows] = 1 if fmt == "png" else 2
    ended = np.zeros(len(starts), bool)
    for code, marker in ((1, _PNG_END), (2, _JPEG_EOI)):
        rows = np.flatnonzero(fmts == code)  # a header parsed: longer than the marker
        if len(rows):
            last = ends[rows] - len(marker)
            same = buffer[last] == marker[0]
            for k in range(1, len(marker)):
                same &= buffer[last + k] == marker[k]
            ended[rows[same]] = True
    for i in np.flatnonzero(~bad & ((mode == "full") | ~ended)).tolist():  # trailing bytes, truncation; decodes
        bad[i] = image_problem(view[starts[i]:ends[i]], field, mode, fit=fit) is not None
    return bad


def batch_problems(batch: Mapping[str, Any], fields: Sequence[UnischemaField],
                   mode: ValidateImages) -> list[tuple[int, str, str]]:
    """``(row, field name, reason)`` for each image of ``batch`` (a column batch: field name -> one value
    per row) in the image fields among ``fields`` that fails :func:`image_problem`; None passes."""
    found: list[tuple[int, str, str]] = []
    if mode == "none":
        return found
    for f in fields:
        values = batch.get(f.name) if isinstance(f.codec, CompressedImageCodec) else None
        if values is None:
            continue
        for row, value in enumerate(values.to_pylist() if isinstance(values, pa.Array) else values):
            problem = None if value is None else image_problem(value, f, mode)
            if problem is not None:
                found.append((row, f.name, problem))
    return found


def drop_rows(batch: Mapping[str, Any], rows: Iterable[int]) -> dict[str, Any]:
    """``batch`` without ``rows``, whatever its columns are (numpy arrays, lists, Arrow arrays)."""
    columns = dict(batch)
    n = len(next(iter(columns.values()))) if columns else 0
    keep = np.ones(n, bool)
    keep[list(rows)] = False
    for name, values in columns.items():
        if isinstance(values, np.ndarray):
            columns[name] = values[keep]
        elif isinstance(values, pa.Array):
            columns[name] = values.filter(pa.array(keep))
        else:
            columns[name] = [v for v, k in zip(values, keep.tolist()) if k]
    return columns


def has_end(data: images.Buffer) -> bool:
    """True when the image ends with its end marker (PNG: the ``IEND`` chunk; JPEG: ``EOI``), or has
    one further in, followed by bytes the decoders ignore (a JPEG's after its first top-level scan,
    not an EXIF thumbnail's)."""
    png = data[:1] == b"\x89"
    marker = _PNG_END if png else _JPEG_EOI
    if isinstance(data, bytes):
        if data.endswith(marker):  # the usual case: no copy, no walk
            return True
        whole = data
    else:
        view = images._bytes_view(data)
        if len(view) >= len(marker) and view[len(view) - len(marker):] == marker:
            return True
        whole = bytes(view)
    if png:
        return whole.rfind(marker) >= 0
    sos = jpeg_scan_start(whole)
    return sos is not None and whole.rfind(marker) > sos


def jpeg_scan_start(data: images.Buffer) -> int | None:
    """Offset of the first top-level SOS marker, walking segment lengths (skips EXIF thumbnails)."""
    pos, end = 2, len(data)
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xDA:
            return pos
        if marker == 0xFF:
            pos += 1
        elif 0xD0 <= marker <= 0xD8 or marker == 0x01:
            pos += 2
        else:
            pos += 2 + ((data[pos + 2] << 8) | data[pos + 3])
    return None


def _header_problem(data: images.Buffer, field: UnischemaField, fit: bool) -> str | None:
    """The header checks of :func:`image_problem`: a PNG/JPEG header, the pixel limit, the field's shape and depth."""
    fmt = images.detect_format(data)
    if fmt is None:
        return f"not a PNG or JPEG image ({len(data)} bytes starting {bytes(data[:8])!r})"
    size = images.image_size(data)
    if size is None:
        return f"corrupt or unsupported {fmt.upper()} header ({len(data)} bytes)"
    problem = images.pixel_limit_problem(size[0], size[1], fmt)
    return problem if problem is not None or not fit else _fit_problem(data, fmt, size, field)


def _fit_problem(data: images.Buffer, fmt: str, size: tuple[int, int, int], field: UnischemaField) -> str | None:
    """An image of ``size`` (from its header) that the field's fixed dimensions or dtype do not hold."""
    height, width, channels = size
    found = (height, width) if channels == 1 and len(field.shape) == 2 else size
    dtype = np.dtype(np.uint16 if fmt == "png" and data[24] == 16 else np.uint8)
    if not shape_matches(found, field.shape) or dtype != field.dtype:
        return (f"{fmt.upper()} image of shape {found} {dtype.name} does not fit field {field.name!r} "
                f"({field.shape} {np.dtype(field.dtype).name})")
    return None
