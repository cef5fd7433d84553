"""WebDataset samples -> column batches a field at a time, and the statistics of a single pass.

:class:`~unihub.formats.webdataset.format.WebDatasetFormat` gathers a batch of samples, then turns each
field's members into one column in a few vectorised steps rather than value by value: keys,
text and bytes become one Arrow array; integer text is checked by one regular expression and
parsed by one Arrow cast; ``.npy`` members of one header are read as one ``(n, *shape)`` array
(:func:`unihub.schema.npy.load_npy_column`); images are checked a header group at a time
(:func:`unihub.schema.image_checks.bad_images`). What this fast path cannot vouch for (a value
it would have to look at alone, a missing or extra member, a failed check) makes it give the
batch up: :class:`~unihub.formats.webdataset.format._SampleReader` then reads it row by row, so every
error and skip is exactly the row reader's.

A single-pass conversion (``observe``) also gathers per extension the :class:`FieldStats` a
schema scan would, from the same arrays (:func:`observe`), so the shards are read once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from unihub.formats.webdataset.blocks import SampleBlock
from unihub.formats.webdataset.fields import FieldStats, Where, field_extension, native_order, npy_header
from unihub.formats.webdataset.spelling import SPELLING_FIELD
from unihub.formats.webdataset.tar import KEY_FIELD
from unihub.images import decoders as images
from unihub.schema import image_checks
from unihub.schema.arrow_numpy import string_array, to_numpy
from unihub.schema.codecs import CompressedImageCodec
from unihub.schema.image_checks import ValidateImages
from unihub.schema.npy import load_npy_column
from unihub.schema.shapes import shape_matches
from unihub.schema.unischema import UnischemaField

#: integer text as an int64 field writes it back (no sign but a minus, no leading zero or space, no
#: newline: '-0', '007', '+3' and '3\n' keep their spelling, row by row), short enough for float64 too
_PLAIN_INT = r"^(0|-?[1-9][0-9]{0,14})$"


class _Values:
    """One extension's members in a batch (none missing), as one Arrow binary array; what the
    column and the statistics both need is computed once."""

    def __init__(self, array: pa.Array) -> None:
        self.array = array

    @cached_property
    def spans(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(buffer, starts, ends)`` of the values in the array's data buffer."""
        array = self.array
        offsets = np.frombuffer(array.buffers()[1], np.int32, len(array) + 1, array.offset * 4).astype(np.int64)
        data = array.buffers()[2]
        buffer = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
        return buffer, offsets[:-1], offsets[1:]

    @cached_property
    def image_sizes(self) -> list[tuple[int, int, int] | None]:
        """``(height, width, channels)`` of each run of images with one header (None: unreadable)."""
        return [size for size, _, _ in images.image_size_groups(*self.spans)]

    @cached_property
    def depths(self) -> dict[int, np.ndarray]:
        """``{bit depth: rows}`` of the images."""
        return _depths(*self.spans)

    @cached_property
    def plain_ints(self) -> bool:
        """True when every value is integer text that int64 and float64 both hold exactly."""
        return bool(pc.all(pc.match_substring_regex(self.array, _PLAIN_INT)).as_py())

    @cached_property
    def npy(self) -> np.ndarray | None:
        """The values as one array when they share one ``.npy`` header (else None)."""
        try:
            return load_npy_column(self.array)
        except Exception:  # a corrupt header: the row reader says which and why
            return None

    @cached_property
    def plain_npy(self) -> bool:
        """True when the shared ``.npy`` header is the one an export writes for the values (native byte
        order, C order, np.save's padding): the members come back from the values alone."""
        array = self.npy
        if array is None:
            return False
        header = npy_header(array.dtype, array.shape[1:])
        buffer, starts, ends = self.spans
        first = int(starts[0])
        return array.dtype.isnative and buffer[first:first + len(header)].tobytes() == header


def _gather(block: SampleBlock, extension: str) -> _Values | None:
    """The ``extension`` members of every sample, or None when one lacks it."""
    array = block.column(extension)
    return None if array is None else _Values(array)


def observe(stats: dict[str, FieldStats], block: SampleBlock, cache: dict[str, _Values | None]) -> None:
    """Add the samples of ``block`` to ``stats`` as :func:`~unihub.formats.webdataset.format._scan_shards` would,
    sample by sample: a whole column at a time where its values allow, else member by member."""
    for extension in block.extensions():
        stat = stats.get(extension)
        if stat is None:
            stat = stats[extension] = FieldStats(extension)
        if extension not in cache:
            cache[extension] = _gather(block, extension)
        values = cache[extension]
        if block.columns is None and any(extension in sample.spelled for sample in block.samples()):
            stat.respelled = True  # a member named in capitals (blocks of columns hold none)
        if field_extension(extension) != extension and _beside(block, extension, field_extension(extension)):
            stat.beside_alias = True  # 'a.jpeg' and 'a.jpg' in one sample: two fields
        if values is None or not _observe_column(stat, values, lambda i: _where(block, i)):
            for sample in block.samples():
                data = sample.members.get(extension)
                if data is not None:
                    stat.add(data, sample.url, sample.offset, sample.key, respelled=extension in sample.spelled)


def _beside(block: SampleBlock, extension: str, other: str) -> bool:
    """True when a sample of ``block`` holds members of both extensions."""
    if block.columns is not None:
        return extension in block.columns and other in block.columns
    return any(extension in sample.members and other in sample.members for sample in block.samples())


def _where(block: SampleBlock, i: int) -> Where:
    return block.urls[i], block.offsets[i], block.keys[i]


def _observe_column(stat: FieldStats, values: _Values, where: Callable[[int], Where]) -> bool:
    """Add a full column to ``stat`` in a few steps; False (nothing added) where it must go member by member."""
    n = len(values.array)
    if stat.kind == "int" and stat.all_int and values.plain_ints:
        stat.count += n  # every value is an int64, a float64 and UTF-8 alike, printed as an int64 prints it
        stat.plain_float_text = False  # a float64 field would print '2.0'
        return True
    if stat.kind == "npy":
        array = values.npy
        if array is None:
            return False
        dtype = native_order(array.dtype)
        stat.dtypes.setdefault(dtype, where(0))
        stat.plain_npy = stat.plain_npy and values.plain_npy
        stat.ranks.setdefault(array.ndim - 1, where(0))
        stat.shapes.add(array.shape[1:])
        stat.count += n
        return True
    if stat.kind == "image":
        for size in values.image_sizes:
            if size is None:
                continue  # corrupt: counted, no shape (as FieldStats.add)
            height, width, channels = size
            stat.shapes.add((height, width) if channels == 1 else (height, width, channels))
        for depth, rows in values.depths.items():
            stat.depths.setdefault(depth, where(int(rows[0])))
        stat.count += n
        return True
    return False


def _depths(buffer: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> dict[int, np.ndarray]:
    """``{bit depth: rows}`` (:func:`~unihub.formats.webdataset.fields.bit_depth` of each value)."""
    heads = images.leading_bytes(buffer, starts, ends - starts, 25)
    sixteen = (heads[:, 0] == 0x89) & (heads[:, 1] == ord("P")) & (heads[:, 2] == ord("N")) & \
        (heads[:, 3] == ord("G")) & (ends - starts > 24) & (heads[:, 24] == 16)
    return {depth: rows for depth, rows in ((8, np.flatnonzero(~sixteen)), (16, np.flatnonzero(sixteen)))
            if len(rows)}


class ColumnReader:
    """Batches of samples -> columns of one schema, fields named by extension (no export header).

    :meth:`columns` returns None where any value needs the row reader: a missing or extra member, a
    value the fast checks refuse or cannot vouch for.
    """

    def __init__(self, fields: Sequence[UnischemaField], validate_images: ValidateImages, *, fit: bool) -> None:
        self.fields = [f for f in fields if f.name not in (KEY_FIELD, SPELLING_FIELD)]
        self.keys = any(f.name == KEY_FIELD for f in fields)
        self.spellings = any(f.name == SPELLING_FIELD for f in fields)  # null here: every member is canonical
        self.order = [f.name for f in fields]
        self.validate_images, self.fit = validate_images, fit

    def columns(self, block: SampleBlock, cache: dict[str, _Values | None]) -> dict[str, Any] | None:
        if block.member_count() != len(self.fields) * len(block):
            return None  # a member missing (null, or an error) or one no field reads
        if block.columns is None and any(sample.spelled for sample in block.samples()):
            return None  # a member named in capitals: the row reader keeps its spelling
        out: dict[str, Any] = {}
        if self.keys:
            out[KEY_FIELD] = string_array(block.keys)
        if self.spellings:
            out[SPELLING_FIELD] = pa.nulls(len(block), pa.string())
        for f in self.fields:
            if f.name not in cache:
                cache[f.name] = _gather(block, f.name)
            values = cache[f.name]
            column = None if values is None else self._column(f, values)
            if column is None:
                return None
            out[f.name] = column
        return {name: out[name] for name in self.order}

    def _column(self, f: UnischemaField, values: _Values) -> Any:
        """One field's column, or None (the row reader decides)."""
        if isinstance(f.codec, CompressedImageCodec):
            return values.array if self._images_fit(f, values) else None
        kind = f.dtype.kind
        if f.shape == () and f.numpy_dtype is np.bytes_:
            return values.array
        if f.shape == () and f.numpy_dtype is np.str_:
            try:
                return values.array.cast(pa.string())  # checks UTF-8
            except pa.ArrowInvalid:
                return None
        if f.shape == () and f.dtype == np.int64 and values.plain_ints:
            return to_numpy(pc.cast(values.array.cast(pa.string()), pa.int64()))
        if f.shape != () and kind in "biufc":
            array = values.npy
            if array is None or array.dtype != f.dtype or not shape_matches(array.shape[1:], f.shape) or \
                    not values.plain_npy:
                return None  # another byte order or header: the row reader keeps its spelling
            return array if f.is_fixed_shape else list(array)
        return None

    def _images_fit(self, f: UnischemaField, values: _Values) -> bool:
        """True when every image passes what the row reader's image check would: a readable header, the
        field's shape and bit depth (unless ``fit`` is off: a provisional schema), the pixel limit and
        end marker (as ``validate_images`` says)."""
        buffer, starts, ends = values.spans
        if self.fit:
            depth = 16 if f.dtype == np.uint16 else 8
            if set(values.depths) != {depth}:
                return False
        for size in values.image_sizes:
            if size is None:
                return False
            height, width, channels = size
            found = (height, width) if channels == 1 and len(f.shape) == 2 else (height, width, channels)
            if self.fit and not shape_matches(found, f.shape):
                return False
        if self.validate_images == "none":
            return True
        return not image_checks.bad_images(buffer, starts, ends, f, self.validate_images, fit=False).any()
