"""The dataset-level metadata files beside the data: ``_common_metadata`` replaced atomically, Spark's
``_metadata`` summary, and the entries Petastorm 0.13.1 needs to open a dataset.

The store writes them (``write_dataset(petastorm_compatible=True)``, ``add_schema``, Spark's
``materialize_dataset``); Petastorm's pickled form itself is :mod:`unihub.petastorm.pickling`'s.

Petastorm's ``make_reader``/``make_batch_reader`` read two key-value entries of a dataset's
``_common_metadata``: the pickled Unischema (``dataset-toolkit.unischema.v1``, built by
:mod:`unihub.petastorm.pickling`) and the row groups of every data file as JSON
(``dataset-toolkit.num_row_groups_per_file.v1``, ``{"part-00000.parquet": 3, ...}``, paths
relative to the dataset root). Without the second, Petastorm fails with "Could not find row
group metadata". unihub's own reader keeps reading the Unischema JSON beside them.

``_common_metadata`` is replaced atomically (written under a hidden name, then renamed), and a
stale Hadoop checksum (``._common_metadata.crc``) is removed, as Petastorm does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from unihub.fs import filesystem as fsutil
from unihub.fs.publish import SUMMARY_METADATA  # the summary file: every data file's row groups in one footer
from unihub.petastorm.pickling import dumps_petastorm_unischema
from unihub.schema.unischema import Unischema
from unihub.store.dataset import COMMON_METADATA, list_data_files, read_footers, read_metadata
from unihub.store.listings import petastorm_entries, replace_atomically, replace_common_metadata, summary_of


def row_groups_per_file(fs: pafs.FileSystem, root: str, paths: Sequence[str] | None = None) -> dict[str, int]:
    """``{path relative to root: number of row groups}`` of every data file under ``root``."""
    paths = sorted(list_data_files(fs, root)) if paths is None else list(paths)
    footers = read_footers(fs, paths)
    return {path[len(root):].lstrip("/"): footer.num_row_groups for path, footer in zip(paths, footers)}


def petastorm_metadata(schema: Unischema, fs: pafs.FileSystem, root: str,
                       paths: Sequence[str] | None = None) -> dict[bytes, bytes]:
    """The two ``_common_metadata`` entries Petastorm reads, for the dataset at ``root``."""
    pickled = dumps_petastorm_unischema(schema)  # refuses what Petastorm cannot read, before any footer is read
    return petastorm_entries(pickled, row_groups_per_file(fs, root, paths))


def add_petastorm_metadata(fs: pafs.FileSystem, root: str, schema: Unischema) -> None:
    """Add Petastorm's entries to the ``_common_metadata`` a unihub writer left in ``root``."""
    entries = petastorm_metadata(schema, fs, root)
    common = read_metadata(fs, fsutil.join(root, COMMON_METADATA)).schema.to_arrow_schema()
    replace_common_metadata(fs, root, common.with_metadata({**(common.metadata or {}), **entries}))


def write_summary_metadata(fs: Any, root: str, paths: list[str], first: pq.FileMetaData) -> None:
    """``_metadata``: the first file's footer with every file's row groups, paths relative to ``root``."""
    rels = [path[len(root):].lstrip("/") for path in paths]
    combined = summary_of([first, *(read_metadata(fs, path) for path in paths[1:])], rels, root.rstrip("/"))
    if combined is not None:
        replace_atomically(fs, root, SUMMARY_METADATA, combined.write_metadata_file)
