"""Petastorm's metadata look-ups on an opened dataset: ``petastorm.etl.dataset_metadata``'s ``get_schema`` and
``load_row_groups``, and ``petastorm.utils.add_to_dataset_metadata``.

Petastorm's took a ``pyarrow.parquet.ParquetDataset`` of pyarrow's legacy implementation, which pyarrow 15
removed; these take pyarrow's current ``ParquetDataset``, an open :class:`~unihub.store.dataset.ParquetStore`,
or a URL (:func:`~unihub.store.dataset.store_of`), and work through the store's own reading and writing of
the metadata::

    ds = pq.ParquetDataset("/data/train")
    add_to_dataset_metadata(ds, b"my.key", b"value")      # into /data/train/_common_metadata
    schema = get_schema(ds)                                # the stored Unischema (PetastormMetadataError if none)
"""

from __future__ import annotations

from typing import Any

import pyarrow.parquet as pq

from unihub.errors import InvalidArgumentError
from unihub.schema.unischema import Unischema
from unihub.store.dataset import RowGroupInfo, store_of, stored_schema, update_common_metadata


def get_schema(dataset: Any) -> Unischema:
    """The Unischema stored in the dataset's metadata (unihub's or Petastorm's pickled one); plain Parquet
    is a :class:`~unihub.errors.PetastormMetadataError`, as in Petastorm (``infer_or_load_unischema``
    infers one instead)."""
    return stored_schema(store_of(dataset))


def load_row_groups(dataset: Any) -> list[RowGroupInfo]:
    """One entry per row group of the dataset, each with Petastorm's piece attributes ``path`` and
    ``row_group`` (and ``num_rows``, ``partition`` as ``((key, value), ...)``), in reading order.

    Petastorm gave pyarrow's ``ParquetDatasetPiece`` objects (removed in pyarrow 15), and refused a
    dataset whose ``_common_metadata`` lacks its row-group counts; unihub reads them from the footers.
    """
    return list(store_of(dataset).row_groups)


def add_to_dataset_metadata(dataset: Any, key: bytes | str, value: bytes | str) -> None:
    """Set ``key`` to ``value`` in the dataset's ``_common_metadata`` (made from a data file's schema where
    there is none), atomically; a stale Hadoop checksum (``._common_metadata.crc``) is removed, as
    Petastorm did. ``str`` keys and values are stored as UTF-8, as pyarrow stores them."""
    if isinstance(dataset, pq.ParquetDataset) and getattr(dataset, "_base_dir", None) is None or \
            isinstance(dataset, (list, tuple)):
        raise InvalidArgumentError("Expected dataset.paths to be a single path, not a list of paths: metadata goes "
                                   "in the _common_metadata of a dataset directory")  # Petastorm's words first
    update_common_metadata(store_of(dataset), {_utf8(key): _utf8(value)})


def _utf8(text: bytes | str) -> bytes:
    return text.encode("utf-8") if isinstance(text, str) else bytes(text)
