"""unihub: convert datasets to Parquet with a Unischema and serve them to deep-learning frameworks.

The successor of Petastorm, with its names and arguments::

    from unihub import Unischema, UnischemaField, CompressedImageCodec, TensorCodec, write_dataset

``import unihub`` needs only numpy, pyarrow and the image decoder; frameworks are imported
where they are used.
"""

from __future__ import annotations

import os as _os
import sys as _sys

# The ``unihub`` command answers Ctrl-C and SIGTERM from here on, before the imports below take their
# second or more (unihub/interrupts.py); a program that imports unihub keeps its own handlers.
from unihub.runtime import interrupts as _interrupts

if _interrupts.is_command():
    _interrupts.install_at_start()

# pyarrow's default allocator (mimalloc) keeps arenas committed per worker thread, so a
# reader's peak memory grew ~1.7x with dataset size; with jemalloc it stays flat (see
# tests/readers/test_reader.py). The choice is read when pyarrow starts, so it is made here,
# before unihub imports pyarrow; an explicit ARROW_DEFAULT_MEMORY_POOL, or
# UNIHUB_KEEP_ARROW_MEMORY_POOL=1, wins.
if "pyarrow" not in _sys.modules and not _os.environ.get("UNIHUB_KEEP_ARROW_MEMORY_POOL"):
    _os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")

from unihub.bridges.spark.writer import dict_to_spark_row, materialize_dataset
from unihub.bridges.throughput import reader_throughput
from unihub.caching import CachedDataset, cacheable
from unihub.converters.add_schema import add_schema, generate_petastorm_metadata
from unihub.converters.convert import convert
from unihub.converters.copy import copy_dataset
from unihub.converters.result import ConvertResult
from unihub.converters.verify import verify
from unihub.errors import (
    AppendSchemaError,
    CacheError,
    CacheTimeoutError,
    CodecError,
    CodecTypeError,
    ColumnSetError,
    ConcurrentCommitError,
    DataCorruptionError,
    DatasetChangedError,
    DatasetExistsError,
    DatasetNotFoundError,
    DatasetUrlError,
    DecodeFieldError,
    FieldTypeError,
    FormatError,
    MissingDependencyError,
    NoMatchingFieldsError,
    PetastormCompatibilityError,
    PetastormMetadataError,
    ReaderResetError,
    ReaderStateError,
    RemoteStorageError,
    SchemaError,
    SchemaMismatchError,
    SourceChangedError,
    UnihubError,
    UnsafeMetadataError,
    UnsupportedFormatError,
    ValidationError,
    VersionNotFoundError,
)
from unihub.fs.resolver import FilesystemResolver, get_dataset_path, get_filesystem_and_path_or_paths, normalize_dir_url
from unihub.readers.ngram import NGram
from unihub.readers.predicates import (
    PredicateBase,
    in_intersection,
    in_lambda,
    in_negate,
    in_pseudorandom_split,
    in_reduce,
    in_set,
)
from unihub.readers.random_access import Dataset
from unihub.readers.reader import Reader, make_batch_reader, make_reader
from unihub.readers.rowgroup_index import build_rowgroup_index, get_row_group_indexes
from unihub.readers.rowgroup_indexers import (
    FieldNotNullIndexer,
    RowGroupIndexerBase,
    RowGroupIndexError,
    SingleFieldIndexer,
)
from unihub.readers.selectors import (
    IntersectIndexSelector,
    RowGroupSelectorBase,
    SingleIndexSelector,
    UnionIndexSelector,
)
from unihub.readers.transform import TransformSpec
from unihub.readers.weighted import WeightedSamplingReader
from unihub.runtime.progress import disable_progress_bar, enable_progress_bar, is_progress_bar_enabled
from unihub.schema.codecs import (
    CODECS,
    Codec,
    CompressedImageCodec,
    CompressedNdarrayCodec,
    NdarrayCodec,
    ScalarCodec,
    TensorCodec,
)
from unihub.schema.unischema import (
    Unischema,
    UnischemaField,
    decode_row,
    insert_explicit_nulls,
    match_unischema_fields,
)
from unihub.store.adoption import adopt_files
from unihub.store.columns import ColumnsResult, add_column, add_columns, list_columns, remove_columns
from unihub.store.compaction import compact_dataset
from unihub.store.dataset import (
    ParquetStore,
    RowGroupInfo,
    get_schema_from_dataset_url,
    infer_or_load_unischema,
    open_dataset,
)
from unihub.store.dataset_metadata import add_to_dataset_metadata, get_schema, load_row_groups
from unihub.store.versions import Version, delete_rows, list_versions, vacuum_dataset
from unihub.store.writer import WriteResult, write_dataset
from unihub.version import package_version

__version__ = package_version()

__all__ = [
    "CODECS", "Codec", "CodecError", "CompressedImageCodec", "CompressedNdarrayCodec", "DataCorruptionError", "DatasetChangedError", "DatasetExistsError",
    "DatasetNotFoundError", "FormatError", "MissingDependencyError", "NdarrayCodec", "ParquetStore",
    "PetastormCompatibilityError", "PetastormMetadataError", "RemoteStorageError", "SchemaMismatchError",
    "RowGroupInfo", "ScalarCodec", "SchemaError", "TensorCodec", "UnihubError", "Unischema", "UnischemaField",
    "UnsafeMetadataError", "UnsupportedFormatError", "ValidationError", "WriteResult", "__version__",
    "ConvertResult", "convert", "verify", "dict_to_spark_row", "match_unischema_fields", "materialize_dataset", "open_dataset", "write_dataset",
    "Dataset", "NGram", "PredicateBase", "Reader", "TransformSpec", "in_intersection", "in_lambda", "in_negate",
    "in_pseudorandom_split", "in_reduce", "in_set", "make_batch_reader", "make_reader", "WeightedSamplingReader",
    "FieldNotNullIndexer", "IntersectIndexSelector", "RowGroupIndexError", "RowGroupIndexerBase",
    "RowGroupSelectorBase", "SingleFieldIndexer", "SingleIndexSelector", "UnionIndexSelector",
    "build_rowgroup_index", "get_row_group_indexes",
    # petastorm.unischema's helper, and unihub's classes that are also the built-ins Petastorm raised
    "insert_explicit_nulls", "decode_row", "DecodeFieldError", "CodecTypeError", "DatasetUrlError", "FieldTypeError", "NoMatchingFieldsError",
    "ReaderResetError", "ReaderStateError",
    # Petastorm's tools: petastorm-copy-dataset.py, petastorm-generate-metadata.py, petastorm-throughput.py
    "add_schema", "copy_dataset", "generate_petastorm_metadata", "reader_throughput",
    # petastorm.etl.dataset_metadata's schema look-ups, petastorm.utils.add_to_dataset_metadata
    "get_schema_from_dataset_url", "infer_or_load_unischema", "get_schema", "load_row_groups",
    "add_to_dataset_metadata",
    # petastorm.fs_utils
    "FilesystemResolver", "get_dataset_path", "get_filesystem_and_path_or_paths", "normalize_dir_url",
    # columns added to existing rows without rewriting the parts (store/columns.py)
    "ColumnSetError", "ColumnsResult", "add_column", "add_columns", "list_columns", "remove_columns",
    # a dataset that grows: appends, versions, deletes, vacuum (store/versions.py)
    "AppendSchemaError", "ConcurrentCommitError", "SourceChangedError", "Version", "VersionNotFoundError",
    "adopt_files", "compact_dataset", "delete_rows", "list_versions", "vacuum_dataset",
    # yogadl-style caching of any data loader
    "CacheError", "CacheTimeoutError", "CachedDataset", "cacheable",
    # one switch for every progress bar (HuggingFace datasets' names)
    "disable_progress_bar", "enable_progress_bar", "is_progress_bar_enabled",
]

#: framework bridges, imported on first use so ``import unihub`` loads no framework
_BRIDGES = {
    "make_petastorm_dataset": "unihub.bridges.tf.dataset", "make_tf_dataset": "unihub.bridges.tf.dataset",
    "tf_tensors": "unihub.bridges.tf.graph",
    "make_spark_converter": "unihub.bridges.spark.converter",
    "SparkDatasetConverter": "unihub.bridges.spark.converter",
    "register_delete_dir_handler": "unihub.bridges.spark.converter",
    "make_dali_pipeline": "unihub.bridges.dali",
    "dataset_as_rdd": "unihub.bridges.spark.rdd",
    # ``unihub show``'s report, for notebooks (HTML rendering and image thumbnails load on first use)
    "show": "unihub.viewer", "ShowReport": "unihub.viewer",
}


def __getattr__(name: str):
    module = _BRIDGES.get(name)
    if module is None:
        raise AttributeError(f"module 'unihub' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
