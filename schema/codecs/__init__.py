"""Codecs: how a field's values are stored in an Arrow/Parquet column and decoded back.

Every codec works on **whole columns**: :meth:`Codec.encode_column` turns a sequence of
values into one Arrow array, :meth:`Codec.decode_column` turns an Arrow array into numpy
(one ``(n, *shape)`` array where the shape is fixed, else an object array of per-row
arrays, ``None`` for nulls). Single-value :meth:`encode` / :meth:`decode` keep
Petastorm's signatures. A codec is one class registered by its JSON name in
:data:`CODECS`, so a dataset's schema JSON finds it again. One module per codec:

- ``base``: :class:`Codec`, the registry (:data:`CODECS`, :func:`register_codec`,
  :func:`codec_from_json`) and the column helpers the codecs share.
- ``scalar``: :class:`ScalarCodec`, native Arrow scalars (numbers, strings, bytes, decimals, times).
- ``tensor``: :class:`TensorCodec`, Arrow-native tensors: ``fixed_shape_tensor`` when the shape is
  fixed (a column decodes to one numpy array without a copy); flat values plus shapes
  when some dimension is ``None``.
- ``image``: :class:`CompressedImageCodec`, PNG/JPEG bytes, kept as given, decoded on read;
  ``binary``: zero-copy views of a binary column's values.
- ``ndarray``: :class:`NdarrayCodec`, :class:`CompressedNdarrayCodec`, Petastorm's ``np.save`` /
  ``np.savez_compressed`` cells, byte-compatible both ways.

Every public name of these modules is importable from here, as from the one module this package was.
"""

from __future__ import annotations

from unihub.schema.codecs.base import CODECS, Codec, codec_from_json, column_as_array, register_codec, stack_if_fixed
from unihub.schema.codecs.binary import BinaryCells, Spans, binary_views, spans_at
from unihub.schema.codecs.image import CompressedImageCodec, image_pixels_allowed
from unihub.schema.codecs.ndarray import CompressedNdarrayCodec, NdarrayCodec
from unihub.schema.codecs.scalar import ScalarCodec, type_is_spark
from unihub.schema.codecs.tensor import TensorCodec, parquet_tensor_type, tensor_from_parquet, tensor_to_parquet

__all__ = [
    "CODECS",
    "BinaryCells",
    "Codec",
    "CompressedImageCodec",
    "CompressedNdarrayCodec",
    "NdarrayCodec",
    "ScalarCodec",
    "Spans",
    "TensorCodec",
    "binary_views",
    "codec_from_json",
    "column_as_array",
    "image_pixels_allowed",
    "parquet_tensor_type",
    "register_codec",
    "spans_at",
    "stack_if_fixed",
    "tensor_from_parquet",
    "tensor_to_parquet",
    "type_is_spark",
]
