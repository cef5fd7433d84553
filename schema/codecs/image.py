""":class:`CompressedImageCodec`: PNG/JPEG bytes, kept as given, decoded on read.

Images are decoded by :mod:`unihub.images.decoders` (imported on first use: the decoders load
native libraries a process that never decodes an image does not need).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from unihub.errors import CodecError, SchemaError
from unihub.images import decoders as images
from unihub.images.decoders import leading_bytes
from unihub.schema.arrow_numpy import arrow_backed_empty
from unihub.schema.codecs.base import Codec, arrow_values, column_as_array, register_codec, with_nulls
from unihub.schema.codecs.binary import binary_views
from unihub.schema.shapes import fixed_dims, shape_matches

if TYPE_CHECKING:
    from unihub.schema.unischema import UnischemaField


_JPEG_MAGIC = np.frombuffer(b"\xff\xd8\xff", np.uint8)
_PNG_MAGIC = np.frombuffer(b"\x89PNG\r\n\x1a\n", np.uint8)


def _not_images(array: pa.BinaryArray) -> np.ndarray:
    """Rows of a binary array (no nulls) that start with neither the JPEG nor the PNG magic."""
    n = len(array)
    offsets = np.frombuffer(array.buffers()[1], np.int32)[array.offset:array.offset + n + 1]
    data = array.buffers()[2]
    body = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1].astype(np.int64), np.diff(offsets)
    heads = leading_bytes(body, starts, lengths, 8)
    jpeg = (lengths >= 3) & (heads[:, :3] == _JPEG_MAGIC).all(1)
    png = (lengths >= 8) & (heads == _PNG_MAGIC).all(1)
    return np.flatnonzero(~(jpeg | png))


@register_codec("compressed_image")
class CompressedImageCodec(Codec):
    """PNG (lossless) or JPEG (``quality``) images in a binary column.

    ``encode`` takes a uint8 array (H, W), (H, W, 3) or (H, W, 4) in RGB(A) order, or bytes
    that already hold a PNG/JPEG file, stored as given (no re-encode). Decoded images are
    RGB(A)/grayscale, as Petastorm returned them (it swapped OpenCV's BGR back to RGB).
    """

    field_free_type = pa.binary()

    def __init__(self, image_codec: str = "png", quality: int = 80) -> None:
        fmt = image_codec.lower().lstrip(".")
        fmt = {"jpg": "jpeg"}.get(fmt, fmt)
        if fmt not in ("png", "jpeg"):
            raise SchemaError(f"CompressedImageCodec supports 'png' and 'jpeg', not {image_codec!r}")
        if not images.quality_ok(quality):
            raise SchemaError(f"JPEG quality must be within 0..100, got {quality!r} (a whole number)")
        self.image_codec = fmt
        self.quality = int(quality)

    def arrow_type(self, field: UnischemaField) -> pa.DataType:
        return pa.binary()

    def encode(self, field: UnischemaField, value: Any) -> bytes:
        if isinstance(value, (bytes, bytearray, memoryview)):
            if images.detect_format(value) is None:
                raise CodecError(f"field {field.name!r}: {len(value)} bytes are neither PNG nor JPEG",
                                 field=field.name)
            return bytes(value)
        array = np.asarray(value)
        if array.dtype != field.dtype:  # Petastorm's words first
            raise CodecError(f"Unexpected type of {field.name!r} feature: expected an image of dtype {field.dtype}, "
                             f"found {array.dtype}", field=field.name)
        if not shape_matches(array.shape, field.shape):
            raise CodecError(f"Unexpected dimensions of {field.name!r} feature: expected an image of shape "
                             f"{field.shape}, found {array.shape}", field=field.name)
        return images.encode_image(array, self.image_codec, self.quality)

    def decode(self, field: UnischemaField, value: Any) -> np.ndarray:
        return images.decode_image(value)

    def encode_column(self, field: UnischemaField, values: Sequence[Any]) -> pa.Array:
        """Bytes that are PNG/JPEG go in as they are, in one step; anything else value by value."""
        if len(values) and all(type(v) is bytes for v in values):
            return self.encode_arrow(field, arrow_values(values, pa.binary()))
        return super().encode_column(field, values)

    def encode_arrow(self, field: UnischemaField, array: pa.Array) -> pa.Array:
        """Binary values that are all PNG/JPEG are stored as they are."""
        if not pa.types.is_binary(array.type) or array.null_count:
            return super().encode_arrow(field, array)
        bad = _not_images(array)
        if len(bad):
            row = int(bad[0])
            raise CodecError(f"field {field.name!r}, row {row}: {len(array[row].as_py())} bytes are neither PNG "
                             "nor JPEG", field=field.name, row=row)
        return array

    def decode_column(self, field: UnischemaField, column: pa.Array | pa.ChunkedArray,
                      *, decode: bool = True) -> np.ndarray:
        """Decode every image; ``decode=False`` returns the encoded bytes (e.g. for DALI)."""
        array = column_as_array(column)
        if not decode:
            return with_nulls(array.to_pylist(), None)
        return self.decode_blobs(field, binary_views(array))

    def decode_blobs(self, field: UnischemaField, blobs: Sequence[Any], into: np.ndarray | None = None) -> np.ndarray:
        """Decode each encoded image of ``blobs`` (bytes-like; None for a null) as :meth:`decode_column`
        decodes a stored column: the column's views, or the bytes a shuffling queue held. A fixed-shape
        column is decoded into ``into`` where given, when it is the ``(n, *shape)`` array of the
        field's dtype that the column would be (a torch worker's shared memory)."""
        n = len(blobs)
        fixed = field.is_fixed_shape and n > 0 and not any(blob is None for blob in blobs)
        if fixed and into is not None and into.shape == (n, *fixed_dims(field.shape)) and \
                into.dtype == np.dtype(field.dtype) and into.flags.c_contiguous and into.flags.writeable:
            _refuse_too_many_pixels(field)
            out = into
        else:
            out = _image_column(field, n) if fixed else np.empty(n, dtype=object)
        row = 0
        try:
            if fixed:  # the decoders check each header against the row of ``out`` before decoding
                images.decode_images_into(blobs, out)
                return out
            # checked against each header before decoding; a gray image takes the field's rank
            shape = field.shape or None
            for row, blob in enumerate(blobs):
                out[row] = None if blob is None else images.decode_image(blob, shape=shape)
        except images.ImageDecodeError as exc:
            row = row if exc.row is None else exc.row
            # the image's own format: a folder mixing PNG and JPEG keeps each file's bytes under one codec
            fmt = images.detect_format(blobs[row]) if 0 <= row < n and blobs[row] is not None else None
            raise images.ImageDecodeError(f"field {field.name!r}, row {row}: corrupt or mismatched "
                                          f"{(fmt or self.image_codec).upper()} image (the field holds {field.shape} "
                                          f"{np.dtype(field.dtype).name}): {exc}", field=field.name, row=row) from exc
        return out

    def config(self) -> dict[str, Any]:
        return {"image_codec": self.image_codec, "quality": self.quality}

    def __repr__(self) -> str:
        """``CompressedImageCodec('png', 80)``: Petastorm's form, itself the call that makes this codec."""
        return f"{type(self).__name__}({self.image_codec!r}, {self.quality})"


def image_pixels_allowed(field: UnischemaField) -> bool:
    """Whether a fixed-shape image field's images are within ``images.MAX_IMAGE_PIXELS`` (a loader
    that allocates their memory ahead of decoding asks first)."""
    height, width = _height_width(field)
    return images.MAX_IMAGE_PIXELS is None or height * width <= images.MAX_IMAGE_PIXELS


def _height_width(field: UnischemaField) -> tuple[int, int]:
    height, width = (list(fixed_dims(field.shape)) + [1, 1])[:2]
    return height, width


def _refuse_too_many_pixels(field: UnischemaField) -> None:
    if not image_pixels_allowed(field):
        height, width = _height_width(field)
        raise images.ImageDecodeError(
            f"field {field.name!r} holds images of {width}x{height} pixels, more than the limit of "
            f"{images.MAX_IMAGE_PIXELS:,}; raise unihub.images.decoders.MAX_IMAGE_PIXELS, or set it to None, to decode "
            "images this large", field=field.name)


def _image_column(field: UnischemaField, n: int) -> np.ndarray:
    """The ``(n, *shape)`` array a fixed-shape image column decodes into, refused (ImageDecodeError)
    when the field's images are above ``images.MAX_IMAGE_PIXELS`` or the column does not fit in memory."""
    _refuse_too_many_pixels(field)
    try:
        return arrow_backed_empty((n, *fixed_dims(field.shape)), field.dtype)
    except MemoryError as exc:
        raise images.ImageDecodeError(f"field {field.name!r}: out of memory for {n} images of shape {field.shape}: "
                                      f"{exc}", field=field.name) from None
