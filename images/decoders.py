"""PNG and JPEG bytes <-> numpy arrays, decoded in worker threads without the GIL.

Images stay encoded on disk (PNG lossless, JPEG with a quality) and are decoded
here, usually straight into one row of an ``(n, H, W, C)`` column via ``out=``.
Arrays are always RGB / RGBA / gray ``(H, W)``, never OpenCV's BGR; EXIF
orientation is ignored (the stored pixel order is returned, as Petastorm did).

Backends, measured with ``benchmarks/image_decoders.py`` (2-core AMD EPYC VM;
smooth gradients plus noise; PNG as OpenCV writes it, JPEG quality 90;
rows/s in one thread for 64x64x3 / 256x256x3 / 64x64 gray):

- **PNG: imagecodecs (libpng)**, 12.7k / 1.07k / 25.2k, 1.9-2.0x on two
  threads, into ``out=`` at the same speed. OpenCV is 4-14% slower and BGR,
  imagecodecs' libspng 2-5% slower and rejects gray+alpha and 16-bit
  gray / RGB, Pillow 20-55% slower and keeps the GIL on gray (1.2x). pyspng
  is 3-5% faster in one thread but keeps the GIL (1.0x on two threads: half
  libpng's throughput there) and returns 16-bit gray as two channels.
  In a column (:func:`decode_images_into`), 8-bit PNGs whose rows are all
  SUB-filtered (OpenCV's and :func:`encode_image`'s) skip libpng: libdeflate
  inflates them and numpy undoes the filter for many at once, the same pixels
  for ~30% less CPU (``images/png_sub.py``).
- **JPEG: simplejpeg (libjpeg-turbo's TurboJPEG API)**, 48k / 4.8k / 65k,
  into ``out=`` 41k / 4.75k / 61k; 2.0x on two threads at 256x256, 1.8-1.9x
  at 64x64 on a quiet machine. It is 29% faster than imagecodecs' jpeg8 (the
  same libjpeg-turbo) at 256x256x3 and 54% faster into ``out=`` at 64x64x3,
  and jpeg8 silences libjpeg's warnings, so a truncated JPEG decodes without
  error, its missing rows filled grey, where simplejpeg raises (``strict``).
  OpenCV is 10-40% slower, Pillow 1.5-5x slower and mostly keeps the GIL.
  simplejpeg is bit-exact with OpenCV's decode (same IDCT and upsampling).

So two libraries rather than one: the JPEG gap is over 25% and the PNG
alternatives are slower, incomplete or GIL-bound. This module's own checks
(format sniffing, header parse, ``out`` shape) cost about 1 us per PNG and
2-4 us per JPEG: 10-15% of a 64x64 JPEG decode, 2% at 256x256.

Encoding uses the same two libraries. PNG is written with zlib level 1, the
RLE strategy and the SUB filter (OpenCV's default): photographs encode 2.1x
faster than level 1 with adaptive filters, 10% smaller, and decode 20%
faster. Flat synthetic images (masks, smooth gradients) come out 1.2-26x
larger than with zlib's default strategy, still far below raw size. JPEG uses
4:2:0 chroma subsampling, like OpenCV and Pillow.

Every function is stateless (each call makes its own libpng / TurboJPEG
handle), so all of them are safe to call from many threads at once.
"""

from __future__ import annotations

import contextlib
import functools
import struct
import zlib
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import cast

import numpy as np
import simplejpeg

from unihub.errors import ImageDecodeError, InvalidArgumentError
from unihub.images.png_sub import decode_sub_pngs


@functools.cache
def _imagecodecs() -> ModuleType:
    """imagecodecs, imported on the first PNG (~0.1 s, on the way to the first batch of a JPEG dataset otherwise)."""
    import imagecodecs

    return imagecodecs


__all__ = [
    "DECODER_NAME",
    "MAX_IMAGE_PIXELS",
    "MAX_IMAGE_FILE_BYTES",
    "ImageDecodeError",
    "pixel_limit",
    "decode_image",
    "detect_format",
    "encode_image",
    "image_size",
]

DECODER_NAME = "imagecodecs (libpng; libdeflate for SUB-filtered PNG columns) for PNG, simplejpeg (libjpeg-turbo) for JPEG"

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_SOI = b"\xff\xd8\xff"
# PNG colour type -> channels decoded, without and with a tRNS chunk (libpng
# expands tRNS to an alpha channel; palette images become RGB(A)).
_PNG_CHANNELS = {0: (1, 2), 2: (3, 4), 3: (3, 4), 4: (2, 2), 6: (4, 4)}
# JPEG start-of-frame markers: SOF0-3, 5-7, 9-11, 13-15 (C4 DHT, C8 JPG, CC DAC are not).
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_STANDALONE = frozenset(range(0xD0, 0xD9)) | {0x01}  # RSTn, SOI, TEM: no length
# zlib level 1, Z_RLE, PNG SUB filter: see the module docstring.
_PNG_LEVEL, _PNG_STRATEGY_RLE, _PNG_FILTER_SUB = 1, 3, 16

Buffer = bytes | bytearray | memoryview

#: The most pixels (width x height) an image's header may claim before it is decoded; more raises
#: :class:`ImageDecodeError` at once. Decoders allocate the pixels a header claims before reading
#: any data, so a 631-byte JPEG claiming 65000 x 65000 would take 11.8 GiB. Pillow's threshold for
#: its ``DecompressionBombError`` (twice ``PIL.Image.MAX_IMAGE_PIXELS``); set it at run time
#: (``unihub.images.decoders.MAX_IMAGE_PIXELS = 10**9``), or to None to turn the check off.
MAX_IMAGE_PIXELS: int | None = 178_956_970

#: The most bytes an image file of a source folder may have: a larger one is refused (or skipped) before
#: any of it is read, so a link to ``/dev/zero`` or a stray multi-GB file cannot exhaust memory. 256 MiB
#: holds any image within :data:`MAX_IMAGE_PIXELS` as such files are written (a 100-megapixel photo is
#: 20-60 MB as JPEG, ~150 MB as PNG). Set it at run time, or per source with the image folder's option
#: ``max_file_mb`` (``--option max_file_mb=1024``); None turns the check off.
MAX_IMAGE_FILE_BYTES: int | None = 256 * 2**20


def pixel_limit_of(limit: object) -> int | None:
    """``limit`` checked as a :data:`MAX_IMAGE_PIXELS` value: a number >= 1 (``10**9`` or ``1e9``), or
    None (no limit)."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, (int, float, np.integer, np.floating)) or not limit >= 1:
        raise InvalidArgumentError(f"max_image_pixels must be a number >= 1, or None for no limit; got {limit!r}")
    return None if limit == float("inf") else int(limit)  # a float setting (1e9) as the whole number it stands for


@contextlib.contextmanager
def pixel_limit(limit: int | None) -> Iterator[None]:
    """:data:`MAX_IMAGE_PIXELS` set to ``limit`` while the block runs, then put back (a setting of this
    process: its threads, and workers it forks meanwhile, see it too). The setting it has already is
    left alone, not set and put back: blocks in other threads that keep it never undo each other."""
    global MAX_IMAGE_PIXELS
    limit = pixel_limit_of(limit)
    before = MAX_IMAGE_PIXELS
    if limit == before:
        yield
        return
    MAX_IMAGE_PIXELS = limit
    try:
        yield
    finally:
        MAX_IMAGE_PIXELS = before


def detect_format(data: Buffer) -> str | None:
    """Return ``'png'`` or ``'jpeg'`` from the magic bytes, else None."""
    head = bytes(data[:8])
    if head == _PNG_SIGNATURE:
        return "png"
    if head[:3] == _JPEG_SOI:
        return "jpeg"
    return None


def image_size(data: Buffer) -> tuple[int, int, int] | None:
    """Return ``(height, width, channels)`` from the header, without decoding pixels.

    ``channels`` is what :func:`decode_image` returns, so the result can size
    an ``out`` array: PNG gray 1, gray+alpha 2, RGB and palette 3, RGBA 4, and
    one more (alpha) for gray / RGB / palette images with a tRNS chunk; JPEG 1
    or 3 (CMYK / YCCK JPEGs decode to RGB, so they report 3). Returns None if
    the header is missing, truncated or not PNG / JPEG.

    >>> image_size(encode_image(np.zeros((4, 6, 3), np.uint8), "png"))
    (4, 6, 3)
    """
    fmt = detect_format(data)
    if fmt == "png":
        header = _png_header(data)
        return None if header is None else header[:3]
    if fmt == "jpeg":
        return _jpeg_channels(_jpeg_frame(data))
    return None


#: byte ranges ``(start, end)`` of a value that decide its header: values equal on them have equal sizes
Spans = tuple[tuple[int, int], ...]


def image_size_spans(data: Buffer) -> tuple[tuple[int, int, int] | None, Spans | None]:
    """:func:`image_size`, and the byte ranges it was decided from (None: not only leading bytes).

    Another value equal to ``data`` on those ranges has the same size and format: the key that
    lets many images from one encoder share one header parse.
    """
    fmt = detect_format(data)
    if fmt == "png":
        header, spans = _png_walk(data)
        return (None if header is None else header[:3]), spans
    if fmt == "jpeg":
        frame, spans = _jpeg_walk(data)
        return _jpeg_channels(frame), spans
    return None, None


def leading_bytes(buffer: np.ndarray, starts: np.ndarray, sizes: np.ndarray, width: int) -> np.ndarray:
    """The first ``width`` bytes of each value ``buffer[starts[i]:starts[i] + sizes[i]]`` as rows of
    an ``(n, width)`` uint8 array, zeros past a shorter value's end (nothing is read past it)."""
    if not len(starts) or not len(buffer):
        return np.zeros((len(starts), width), np.uint8)
    column = np.arange(width)
    within = np.minimum(column, np.maximum(sizes - 1, 0)[:, None])
    heads = buffer[np.minimum(starts[:, None] + within, len(buffer) - 1)]
    return heads * (column < sizes[:, None])


#: a header template must match at least this many of the images left, or the rest are parsed one by one
_MIN_GROUP = 8
_MAX_EXTENT = 4096


def image_sizes(buffer: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Iterator[
        tuple[tuple[int, int, int] | None, str | None, int]]:
    """``(size, format, count)`` groups covering the images ``buffer[starts[i]:ends[i]]``.

    What :func:`image_size` and :func:`detect_format` say of each image, one header parse
    per group rather than per image: images from one encoder at one size have byte-equal
    headers up to the frame size, so the rest of a group is matched with one numpy compare.
    ``size`` None marks a value that is not a PNG/JPEG (or whose header is corrupt).
    """
    for size, fmt, rows in image_size_groups(buffer, starts, ends):
        yield size, fmt, len(rows)


def image_size_groups(buffer: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Iterator[
        tuple[tuple[int, int, int] | None, str | None, np.ndarray]]:
    """:func:`image_sizes` with each group's members: ``(size, format, rows)``, ``rows`` ascending
    indices into ``starts``. The images of a group are byte-equal on every byte their header was
    read from (:func:`image_size_spans`), so whatever the header of ``rows[0]`` says holds for all."""
    buffer = np.asarray(buffer, np.uint8)
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    view = buffer.data  # memoryview(buffer); numpy's stubs give ndarray no __buffer__ before Python 3.12
    left = np.arange(len(starts))
    while len(left):
        first = int(left[0])
        value = view[starts[first]:ends[first]]
        size, spans = image_size_spans(value)
        fmt = detect_format(value) if size is not None else None
        extent = max(b for _, b in spans) if spans else 0
        if size is None or not spans or extent > _MAX_EXTENT:
            yield size, fmt, left[:1]
            left = left[1:]
            continue
        columns = np.concatenate([np.arange(a, b) for a, b in spans])
        long_enough = left[ends[left] - starts[left] >= extent]
        heads = np.lib.stride_tricks.sliding_window_view(buffer, extent)[starts[long_enough]]
        heads = heads[:, spans[0][0]:extent] if len(spans) == 1 else heads[:, columns]  # JPEG: one span, a view
        same = long_enough[(heads == buffer[starts[first] + columns]).all(1)]
        yield size, fmt, same
        if len(same) == len(left):  # the usual case: one encoder, one size
            return
        left = np.setdiff1d(left, same, assume_unique=True)
        if len(same) < _MIN_GROUP:  # headers vary: one by one
            for i in left.tolist():
                value = view[starts[i]:ends[i]]
                size = image_size(value)
                yield size, (detect_format(value) if size is not None else None), np.array([i])
            return


def pixel_limit_problem(height: int, width: int, fmt: str) -> str | None:
    """Why an image of ``width x height`` pixels is refused under :data:`MAX_IMAGE_PIXELS`, or None."""
    limit = MAX_IMAGE_PIXELS
    if limit is None or height * width <= limit:
        return None
    return (f"{fmt.upper()} header claims {width}x{height} pixels ({height * width:,}), more than the limit of "
            f"{limit:,} (a decompression bomb?); to read images this large, raise the limit or set it to None: "
            "unihub.images.decoders.MAX_IMAGE_PIXELS, or for a conversion --max-image-pixels (max_image_pixels=)")


def check_pixels(height: int, width: int, fmt: str) -> None:
    """Raise :class:`ImageDecodeError` for an image above :data:`MAX_IMAGE_PIXELS`, before any decoding."""
    problem = pixel_limit_problem(height, width, fmt)
    if problem is not None:
        raise ImageDecodeError(problem)


def decode_image(data: Buffer, out: np.ndarray | None = None, *,
                 shape: tuple[int | None, ...] | None = None) -> np.ndarray:
    """Decode PNG or JPEG bytes to an RGB / RGBA / gray ``(H, W)`` array.

    The dtype is uint8, or uint16 for a 16-bit PNG. With ``out`` (a row of a
    column array, say) the pixels are decoded into it and ``out`` is returned;
    its shape and dtype must be the image's (see :func:`image_size`), no
    conversion is made (a gray image also goes into ``(H, W, 1)``). Without
    ``out``, ``shape`` (a field's, ``None`` dims for any size) is what the
    image must be, and a gray image takes its rank (:func:`gray_in_rank_3`).
    Raises :class:`ImageDecodeError` for data that is not PNG / JPEG, is corrupt or truncated, uses an
    unsupported variant (12-bit JPEG, say), claims more than
    :data:`MAX_IMAGE_PIXELS`, or does not fit ``out`` or ``shape`` (all
    checked from the header, before decoding).

    >>> decode_image(encode_image(np.full((2, 3), 7, np.uint8), "png"))
    array([[7, 7, 7],
           [7, 7, 7]], dtype=uint8)
    """
    if not isinstance(data, bytes):
        data = _bytes_view(data)  # the backends want unsigned bytes; Arrow buffers are signed
    fmt = detect_format(data)
    if fmt == "png":
        image = _decode_png(data, out, shape)
    elif fmt == "jpeg":
        image = _decode_jpeg(data, out, shape)
    else:
        raise ImageDecodeError(
            f"not a PNG or JPEG image: {len(data)} bytes starting {bytes(data[:8])!r}"
        )
    return image[..., np.newaxis] if out is None and image.ndim == 2 and gray_in_rank_3(shape) else image


def gray_in_rank_3(shape: tuple[int | None, ...] | None) -> bool:
    """Whether a gray image is ``(H, W, 1)`` in ``shape`` (a field's, or an ``out`` array's): a rank-3
    shape whose channel dim is 1, or None (a folder mixing gray and colour images), so that every
    value of the field has its rank. Elsewhere it is ``(H, W)``; a gray image where 3 channels are
    asked for is refused, as converting an image folder refuses it (to RGB is the caller's choice)."""
    return shape is not None and len(shape) == 3 and shape[2] in (None, 1)


def decode_images_into(blobs: Sequence[Buffer], out: np.ndarray) -> np.ndarray:
    """Decode ``blobs[i]`` into ``out[i]`` for every i; ``out`` is a C-contiguous ``(n, H, W[, C])`` array.

    The column loop of the readers: PNGs go straight to libpng with no per-image checks
    (the decoder checks ``out`` itself), which keeps the GIL-holding work per image small
    so that decoding threads scale. Anything else, and any failure, takes
    :func:`decode_image`'s path for its checks and messages; the error's ``row`` is ``i``.
    """
    blobs = _as_buffers(blobs)
    png_decode = None
    # an RGB column: a JPEG whose frame header says exactly its shape (3 components: YCbCr or RGB)
    # goes straight to TurboJPEG, as decode_image would send it, without its per-image checks
    rgb = out.shape[1:] if out.ndim == 4 and out.shape[3] == 3 and out.dtype == np.uint8 and \
        out.flags.c_contiguous else None
    # the bytes up to the end of the last such frame header: one encoder's images share them, and
    # an image that starts with them has that frame (the header walk reads nothing after them)
    known: bytes | None = None
    # SUB-filtered 8-bit PNGs of the column's shape (OpenCV's and encode_image's): libdeflate and a batched
    # unfilter, 1.6x libpng (png_sub.py); the rest below
    done = decode_sub_pngs(blobs, out) if len(blobs) and blobs[0][:8] == _PNG_SIGNATURE else None
    for row, blob in enumerate(blobs):
        if done is not None and done[row]:
            continue
        target = out[row]
        try:
            jpeg = False
            if rgb is not None:
                if known is not None and blob[:len(known)] == known:
                    jpeg = True
                else:
                    leading = _jpeg_frame_bytes(blob, rgb)
                    if leading is not None:
                        known, jpeg = leading, True
            if jpeg:
                try:
                    simplejpeg.decode_jpeg(blob, colorspace="RGB", buffer=target, strict=True)
                    continue
                except (ValueError, RuntimeError, MemoryError):
                    pass  # decode_image below raises with the details
            elif blob[:8] == _PNG_SIGNATURE:
                png_decode = png_decode or _imagecodecs().png_decode
                try:
                    png_decode(blob, out=target)
                    continue
                except (ValueError, RuntimeError):
                    pass  # decode_image below raises with the details
            decode_image(blob, out=target)
        except ImageDecodeError as exc:
            exc.row = row
            raise
    return out


def _as_buffers(blobs: Sequence[Buffer]) -> Sequence[Buffer]:
    """``blobs`` with uint8 arrays (the encoded images a reader hands out as views of its file) as
    memoryviews: an array's slice compares to bytes elementwise, which raised "truth value of an array
    is ambiguous" in :func:`decode_images_into`."""
    if len(blobs) and isinstance(blobs[0], np.ndarray):
        return [_bytes_view(blob) if isinstance(blob, np.ndarray) else blob for blob in blobs]
    return blobs


def encode_image(array: np.ndarray, fmt: str, quality: int = 80) -> bytes:
    """Encode an RGB / RGBA / gray array as a standard ``'png'`` or ``'jpeg'`` file.

    Accepts ``(H, W)``, ``(H, W, 1)``, ``(H, W, 3)`` and ``(H, W, 4)`` uint8
    arrays (PNG also takes gray+alpha ``(H, W, 2)`` and uint16). ``quality``
    (0-100, libjpeg's scale) applies to JPEG only; PNG is lossless at a fixed fast setting.
    JPEG has no alpha channel: RGBA raises rather than silently dropping it.

    >>> encode_image(np.zeros((8, 8, 3), np.uint8), "jpeg", quality=90)[:3]
    b'\\xff\\xd8\\xff'
    """
    image = np.asarray(array)
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[:, :, 0]
    channels = 1 if image.ndim == 2 else image.shape[2] if image.ndim == 3 else 0
    if channels == 0 or image.shape[0] == 0 or image.shape[1] == 0:
        raise ValueError(f"expected a non-empty (H, W) or (H, W, C) image, got shape {image.shape}")
    fmt = fmt.lower()
    if fmt == "png":
        if image.dtype not in (np.uint8, np.uint16) or channels > 4:
            raise ValueError(
                f"PNG needs uint8 or uint16 with 1-4 channels, got {image.dtype} {image.shape}"
            )
        image = np.ascontiguousarray(image)
        # imagecodecs' own output estimate is too small for narrow incompressible images (300x1 noise
        # raised "output stream too small"), so size the buffer for the worst case: the filtered rows
        # stored uncompressed, plus zlib's and the IDAT chunks' overhead (an int ``out`` returns bytes)
        filtered = image.shape[0] * (1 + image.nbytes // image.shape[0])
        return cast(bytes, _imagecodecs().png_encode(
            image,
            level=_PNG_LEVEL,
            strategy=_PNG_STRATEGY_RLE,
            filter=_PNG_FILTER_SUB,
            out=filtered + (filtered >> 6) + 1024,
        ))
    if fmt in ("jpeg", "jpg"):
        if image.dtype != np.uint8 or channels not in (1, 3):
            hint = " (JPEG has no alpha: pass array[..., :3] or use PNG)" if channels == 4 else ""
            raise ValueError(f"JPEG needs uint8 gray or RGB, got {image.dtype} {image.shape}{hint}")
        if not quality_ok(quality):
            raise ValueError(f"JPEG quality must be a whole number 0-100, got {quality!r}")
        gray = channels == 1
        return simplejpeg.encode_jpeg(
            np.ascontiguousarray(image.reshape(image.shape[0], image.shape[1], channels)),
            quality=int(quality),
            colorspace="GRAY" if gray else "RGB",
            colorsubsampling="Gray" if gray else "420",
        )
    raise ValueError(f"unknown image format {fmt!r}; expected 'png' or 'jpeg'")


def quality_ok(quality: object) -> bool:
    """Whether ``quality`` is a JPEG quality: a whole number 0-100 (``90`` or ``90.0``), not a bool (True
    was taken as 1) nor a fraction (50.7 was cut to 50 without a word)."""
    if isinstance(quality, bool) or not isinstance(quality, (int, float, np.integer, np.floating)):
        return False
    return float(quality).is_integer() and 0 <= float(quality) <= 100


# --------------------------------------------------------------------- decoding
def _decode_png(data: Buffer, out: np.ndarray | None, shape: tuple[int | None, ...] | None) -> np.ndarray:
    """libpng into ``out`` directly when it is contiguous, else decode and copy."""
    direct = out is not None and out.flags.c_contiguous and out.flags.writeable
    if not direct:  # libpng allocates what the header claims (into ``out`` it checks the shape first)
        header = _png_header(data)
        if header is not None:
            check_pixels(header[0], header[1], "png")
            if shape is not None and out is None:
                check_shape(header[:3], shape, "PNG")
    try:
        image = _imagecodecs().png_decode(data, out=out if direct else None)
    except MemoryError as exc:
        raise ImageDecodeError(f"PNG ({len(data)} bytes): out of memory decoding it: {exc}") from None
    except (ValueError, RuntimeError) as exc:  # PngError is a RuntimeError
        if out is not None:
            header = _png_header(data)
            if header is not None:
                _check_out(out, header[:3], np.uint16 if header[3] == 16 else np.uint8, "PNG")
        raise ImageDecodeError(f"corrupt or truncated PNG ({len(data)} bytes): {exc}") from exc
    if out is None:
        return image
    if direct:
        return out  # decoded in place: imagecodecs returns a gray image into (H, W, 1) as (H, W)
    return _copy_into(image, out, "PNG")


def _decode_jpeg(data: Buffer, out: np.ndarray | None, shape: tuple[int | None, ...] | None) -> np.ndarray:
    """TurboJPEG (strict: warnings such as a truncated stream are errors)."""
    frame = _jpeg_frame(data)
    size = _jpeg_channels(frame)
    if frame is None or size is None:
        problem = "no complete frame header (SOF)" if frame is None else f"{frame[2]} components"
        raise ImageDecodeError(f"corrupt, truncated or unsupported JPEG ({len(data)} bytes): {problem}")
    height, width, channels = size
    if out is not None:
        _check_out(out, size, np.uint8, "JPEG")
    else:
        check_pixels(height, width, "jpeg")
        if shape is not None:
            check_shape(size, shape, "JPEG")
    # simplejpeg converts CMYK to RGB itself, through a 4-channel temporary
    direct = out is not None and out.flags.c_contiguous and frame[2] != 4
    try:
        image = simplejpeg.decode_jpeg(
            data,
            colorspace="GRAY" if channels == 1 else "RGB",
            buffer=out if direct else None,
            strict=True,
        )
    except MemoryError as exc:
        raise ImageDecodeError(f"JPEG ({len(data)} bytes) of {width}x{height} pixels: out of memory decoding it: "
                               f"{exc}") from None
    except (ValueError, RuntimeError) as exc:
        raise ImageDecodeError(_jpeg_problem(data, exc)) from exc
    if channels == 1:
        image = image.reshape(height, width)
    if out is None:
        return image
    return out if direct else _copy_into(image, out, "JPEG")


def _jpeg_problem(data: Buffer, exc: Exception) -> str:
    """What is wrong with a JPEG TurboJPEG refused: 12-bit samples (a valid file it cannot decode, not a
    corrupt one) said as such, else corrupt or truncated."""
    spans = _jpeg_walk(data)[1]
    precision = data[spans[0][1] - 6] if spans else 8  # the SOF's sample precision, 4 bytes past its marker
    if precision != 8:
        return f"unsupported JPEG ({len(data)} bytes): {precision}-bit samples, only 8-bit JPEGs decode ({exc})"
    return f"corrupt or truncated JPEG ({len(data)} bytes): {exc}"


def check_shape(size: tuple[int, int, int], shape: tuple[int | None, ...], fmt: str) -> None:
    """Raise ImageDecodeError unless an image of ``size`` (from its header) has the fixed dims of ``shape``."""
    height, width, channels = size
    found = (height, width) if channels == 1 and len(shape) == 2 else size
    if channels == 1 and gray_in_rank_3(shape):
        found = (height, width, 1)
    if len(found) == len(shape):
        for dim, expected in zip(found, shape):
            if expected is not None and expected != dim:
                break
        else:
            return
    raise ImageDecodeError(f"{fmt} image of shape {found}, expected {shape}")


def _check_out(out: np.ndarray, size: tuple[int, int, int], dtype: type, fmt: str) -> None:
    """Raise ImageDecodeError unless ``out`` has exactly the decoded shape and dtype."""
    height, width, channels = size
    shape = (height, width) if channels == 1 else size
    if channels == 1 and gray_in_rank_3(out.shape):
        shape = (height, width, 1)
    if out.shape != shape or out.dtype != dtype:
        raise ImageDecodeError(
            f"{fmt} image is {shape} {np.dtype(dtype).name} but out is {out.shape} {out.dtype}"
        )
    if not out.flags.writeable:
        raise ValueError("out is read-only")


def _copy_into(image: np.ndarray, out: np.ndarray, fmt: str) -> np.ndarray:
    """Copy a decoded image into a non-contiguous ``out`` after checking it fits."""
    channels = 1 if image.ndim == 2 else image.shape[2]
    _check_out(out, (image.shape[0], image.shape[1], channels), image.dtype.type, fmt)
    np.copyto(out, image.reshape(out.shape))  # a gray (H, W) into (H, W, 1) too
    return out


# ---------------------------------------------------------------------- headers
def _bytes_view(data: Buffer) -> memoryview:
    """A flat unsigned-byte view of any contiguous buffer (bytearray, numpy, Arrow)."""
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _png_header(data: Buffer) -> tuple[int, int, int, int] | None:
    """``(height, width, decoded channels, bit depth)`` from IHDR and the chunks before IDAT."""
    return _png_walk(data)[0]


def _png_walk(data: Buffer) -> tuple[tuple[int, int, int, int] | None, Spans | None]:
    """:func:`_png_header`, and the bytes it depends on: all before the chunk it stopped at, and
    that chunk's type, not its length (None: it read to the end)."""
    view = data if isinstance(data, bytes) else _bytes_view(data)
    if len(view) < 33 or view[12:16] != b"IHDR":
        return None, None
    width, height, depth, color_type = struct.unpack_from(">IIBB", view, 16)
    if color_type not in _PNG_CHANNELS or width == 0 or height == 0:
        return None, None
    palette = 0
    pos = 33
    while pos + 8 <= len(view):  # tRNS, if any, comes before the first IDAT
        length, kind = struct.unpack_from(">I4s", view, pos)
        if kind in (b"IDAT", b"IEND"):
            break
        if kind == b"PLTE":
            palette = length // 3
        elif kind == b"tRNS" and _trns_valid(view, pos, length, color_type, palette):
            return (height, width, _PNG_CHANNELS[color_type][True], depth), ((0, pos + 12 + length),)
        pos += 12 + length
    else:
        return (height, width, _PNG_CHANNELS[color_type][False], depth), None
    return (height, width, _PNG_CHANNELS[color_type][False], depth), ((0, pos), (pos + 4, pos + 8))


def _trns_valid(view: Buffer, pos: int, length: int, color_type: int, palette: int) -> bool:
    """Whether libpng keeps the tRNS chunk at ``pos`` (and so adds an alpha channel): it drops one whose
    CRC is wrong or whose length does not fit the colour type (2 bytes gray, 6 RGB, 1 to the palette's
    entries), with only a warning, and decodes the image without alpha."""
    if pos + 12 + length > len(view):
        return False
    if zlib.crc32(view[pos + 4:pos + 8 + length]) != struct.unpack_from(">I", view, pos + 8 + length)[0]:
        return False
    return length == {0: 2, 2: 6}.get(color_type, 0) or (color_type == 3 and 0 < length <= palette)


def _jpeg_frame_bytes(data: Buffer, frame: tuple[int, int, int]) -> bytes | None:
    """The bytes of JPEG ``data`` up to the end of its frame header, when that header says ``frame``."""
    if data[:3] != _JPEG_SOI:
        return None
    found, spans = _jpeg_walk(data)
    if found != frame or spans is None:
        return None
    return bytes(data[:spans[0][1]])


def _jpeg_frame(data: Buffer) -> tuple[int, int, int] | None:
    """``(height, width, components)`` from the SOF segment, walking the markers before it."""
    return _jpeg_walk(data)[0]


def _jpeg_walk(data: Buffer) -> tuple[tuple[int, int, int] | None, Spans | None]:
    """:func:`_jpeg_frame`, and the leading bytes it read (None when it found no frame)."""
    view = data if isinstance(data, bytes) else _bytes_view(data)
    pos, end = 2, len(view)
    while pos + 4 <= end:
        if view[pos] != 0xFF:
            return None, None  # not at a marker: corrupt
        marker = view[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
        elif marker in _JPEG_STANDALONE:
            pos += 2
        elif marker in _JPEG_SOF:
            if pos + 10 > end:
                return None, None
            height, width, components = struct.unpack_from(">HHB", view, pos + 5)
            # height 0 means a DNL marker, which TurboJPEG rejects
            return ((height, width, components) if height and width else None), ((0, pos + 10),)
        elif marker in (0xD9, 0xDA):  # EOI or start of scan before any frame header
            return None, None
        else:
            pos += 2 + ((view[pos + 2] << 8) | view[pos + 3])
    return None, None


def _jpeg_channels(frame: tuple[int, int, int] | None) -> tuple[int, int, int] | None:
    """Decoded ``(height, width, channels)``: gray 1, YCbCr / RGB 3, CMYK / YCCK to RGB 3."""
    if frame is None or frame[2] not in (1, 3, 4):
        return None
    return frame[0], frame[1], 1 if frame[2] == 1 else 3
