"""Row-group indexes, Petastorm's ``petastorm.etl.rowgroup_indexing``: build, store, read, select.

:func:`build_rowgroup_index` reads only the indexed columns, row group by row group, in this
process (``spark_context=None``) or as Spark tasks (a ``SparkContext``: same result), and
stores the indexes in the dataset's ``_common_metadata``, where Petastorm keeps its own:

* unihub writes versioned JSON under :data:`ROWGROUP_INDEX_KEY` (``unihub.rowgroup_index``)::

      {"format": "unihub.rowgroup_index", "version": 1,
       "files": [["split=a/part-0.parquet", 3], ...],          # what the index was built over
       "indexes": [{"name": "label_idx", "kind": "single_field", "field": "label",
                    "values": [[3, [0, 4]], ["cat", [1]], [{"bytes": "AAE="}, [2]], ...]},
                   {"name": "caption_ok", "kind": "field_not_null", "field": "caption",
                    "row_groups": [1, 2]}]}

  A build replaces every index stored before (Petastorm's behaviour). If the dataset's files
  change afterwards, the index is *stale* and a selector using it is refused.
* Indexes Petastorm built are read from its pickle (``dataset-toolkit.rowgroups_index.v1``)
  through the allow-list unpickler of :mod:`unihub.petastorm.legacy` (exact class names, nothing
  run) when there is no unihub index; unihub never writes that pickle, so Petastorm still reads
  its own index of the dataset.

Row groups are numbered in the dataset's order, files sorted by path: the order Petastorm's
pieces have, so both select the same row groups from the same index.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from unihub.errors import PetastormMetadataError, SchemaError, UnihubError
from unihub.petastorm import legacy
from unihub.readers.loader import decode_column
from unihub.readers.rowgroup_indexers import (
    FieldNotNullIndexer,
    RowGroupIndexerBase,
    RowGroupIndexError,
    SingleFieldIndexer,
    indexer_from_json,
)
from unihub.readers.selectors import check_selector
from unihub.schema.codecs import CompressedImageCodec, ScalarCodec, column_as_array
from unihub.schema.metadata_json import parse_json
from unihub.schema.unischema import UnischemaField
from unihub.store.dataset import ParquetStore, open_dataset, update_common_metadata

ROWGROUP_INDEX_KEY = b"unihub.rowgroup_index"
ROWGROUP_INDEX_FORMAT = "unihub.rowgroup_index"
ROWGROUP_INDEX_VERSION = 1
#: most Spark tasks one build is split into (Petastorm's PARALLEL_SLICE_NUM)
PARALLEL_SLICE_NUM = 2000


@dataclass(frozen=True)
class StoredIndexes:
    """The row-group indexes a dataset holds, where they came from, and why they are stale (if so)."""

    indexes: dict[str, RowGroupIndexerBase] = field(default_factory=dict)
    source: Literal["unihub", "petastorm", "none"] = "none"
    stale: str | None = None


# -- building ----------------------------------------------------------------------------------
def build_rowgroup_index(dataset_url: Any, spark_context: Any = None, indexers: Sequence[Any] | None = None,
                         hdfs_driver: str = "libhdfs3", *, storage_options: dict[str, Any] | None = None,
                         filesystem: Any = None) -> dict[str, RowGroupIndexerBase]:
    """Index ``dataset_url`` with ``indexers`` and store the indexes in its ``_common_metadata``.

    ``spark_context`` None builds in this process; a ``SparkContext`` (or ``SparkSession``)
    spreads the row groups over Spark tasks. ``hdfs_driver`` is accepted for Petastorm's
    signature and ignored (pyarrow picks the HDFS client). Replaces the indexes stored before;
    returns ``{index name: indexer}``.

        build_rowgroup_index("file:///data/ds", None, [SingleFieldIndexer("label_idx", "label"),
                                                       FieldNotNullIndexer("caption_ok", "caption")])
    """
    store = dataset_url if isinstance(dataset_url, ParquetStore) else open_dataset(
        dataset_url, filesystem=filesystem, storage_options=storage_options)
    specs = _check_indexers(store, indexers)
    groups = range(len(store.row_groups))
    if spark_context is None or not groups:
        built = index_row_groups(store, specs, groups)
    else:
        built = _index_on_spark(spark_context, store, specs)
    write_rowgroup_indexes(store, built)
    return {indexer.index_name: indexer for indexer in built}


def _check_indexers(store: ParquetStore, indexers: Sequence[Any] | None) -> list[RowGroupIndexerBase]:
    """Empty copies of ``indexers`` (Petastorm's own indexer objects accepted), checked against the schema."""
    if isinstance(indexers, RowGroupIndexerBase) or not isinstance(indexers, Iterable):
        raise RowGroupIndexError(f"indexers must be a list of SingleFieldIndexer/FieldNotNullIndexer, got {indexers!r}")
    specs = [_as_unihub_indexer(i) for i in indexers]
    if not specs:
        raise RowGroupIndexError("indexers is empty: pass at least one SingleFieldIndexer or FieldNotNullIndexer")
    names = [s.index_name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise RowGroupIndexError(f"index names must be unique; repeated: {duplicates}")
    for spec in specs:
        if spec.index_field not in store.schema.fields:
            raise RowGroupIndexError(f"index {spec.index_name!r}: {store.url} has no field {spec.index_field!r}; "
                                     f"fields: {list(store.schema.fields)}")
        f = store.schema[spec.index_field]
        if isinstance(spec, SingleFieldIndexer) and (len(f.shape) > 1 or isinstance(f.codec, CompressedImageCodec)):
            raise RowGroupIndexError(f"index {spec.index_name!r}: SingleFieldIndexer indexes scalar and 1-D (list) "
                                     f"fields; {f.name!r} has shape {f.shape} ({f.codec!r})")
    return specs


def _as_unihub_indexer(indexer: Any) -> RowGroupIndexerBase:
    if isinstance(indexer, (SingleFieldIndexer, FieldNotNullIndexer)):
        return indexer.empty_copy()
    kind = type(indexer).__name__
    if type(indexer).__module__.startswith("petastorm.") and kind in ("SingleFieldIndexer", "FieldNotNullIndexer"):
        cls = SingleFieldIndexer if kind == "SingleFieldIndexer" else FieldNotNullIndexer
        return cls(indexer.index_name, indexer.column_names[0])
    raise RowGroupIndexError(f"cannot store a {kind} index: unihub stores SingleFieldIndexer and "
                             "FieldNotNullIndexer indexes (as JSON)")


def index_row_groups(store: ParquetStore, specs: Sequence[RowGroupIndexerBase],
                     groups: Iterable[int]) -> list[RowGroupIndexerBase]:
    """New indexers like ``specs``, filled from row groups ``groups``; reads only the indexed columns."""
    indexers = [spec.empty_copy() for spec in specs]
    columns = list(dict.fromkeys(i.index_field for i in indexers))
    for group in groups:
        table = store.read_row_group(group, columns)
        if table.num_rows == 0:
            continue
        for indexer in indexers:
            column = table.column(indexer.index_field)
            if isinstance(indexer, FieldNotNullIndexer):
                indexer.add(group, [True] if column.null_count < len(column) else [])
            else:
                indexer.add(group, _column_values(store.schema[indexer.index_field], column))
    return indexers


def _column_values(f: UnischemaField, column: pa.ChunkedArray) -> Iterable[Any]:
    """What :meth:`SingleFieldIndexer.add` takes: a scalar column's distinct values (list columns
    flattened), or the decoded values of a column another codec stores (arrays for list fields)."""
    if f.codec is not None and not isinstance(f.codec, ScalarCodec):
        return decode_column(f, column)
    array = column_as_array(column)
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type) or pa.types.is_fixed_size_list(array.type):
        array = pc.list_flatten(array)
    try:
        return pc.unique(array.drop_null()).to_pylist()
    except pa.ArrowNotImplementedError as exc:
        raise RowGroupIndexError(f"cannot index field {f.name!r} of Arrow type {array.type}: {exc}") from exc


def _index_on_spark(spark_context: Any, store: ParquetStore,
                    specs: Sequence[RowGroupIndexerBase]) -> list[RowGroupIndexerBase]:
    """:func:`index_row_groups` as Spark tasks (the store broadcast once), merged on the driver."""
    context = getattr(spark_context, "sparkContext", spark_context)
    count = len(store.row_groups)
    shared = context.broadcast(store)
    try:
        parts = context.parallelize(range(count), min(count, PARALLEL_SLICE_NUM)).mapPartitions(
            partial(_index_partition, shared, list(specs))).collect()
    finally:
        shared.unpersist()
    merged = [spec.empty_copy() for spec in specs]
    for part in parts:
        for total, piece in zip(merged, part):
            total + piece  # noqa: B018 -- merges into ``total`` (Petastorm's reduce)
    return merged


def _index_partition(shared: Any, specs: list[RowGroupIndexerBase], groups: Iterator[int]) -> Iterator[Any]:
    yield index_row_groups(shared.value, specs, list(groups))


# -- storing and reading -----------------------------------------------------------------------
def _files_built_over(store: ParquetStore) -> list[list[Any]]:
    return [[f.path[len(store.path):].lstrip("/"), f.num_row_groups] for f in store.files]


def write_rowgroup_indexes(store: ParquetStore, indexers: Sequence[RowGroupIndexerBase]) -> None:
    """Store ``indexers`` as JSON in ``store``'s ``_common_metadata`` (replacing the indexes there)."""
    document = {"format": ROWGROUP_INDEX_FORMAT, "version": ROWGROUP_INDEX_VERSION,
                "files": _files_built_over(store), "indexes": [i.to_json() for i in indexers]}
    text = json.dumps(document, separators=(",", ":"), allow_nan=False)
    update_common_metadata(store, {ROWGROUP_INDEX_KEY: text.encode()})


def read_rowgroup_indexes(store: ParquetStore) -> StoredIndexes:
    """The indexes ``store`` holds: unihub's JSON, else Petastorm's pickle (allow-listed), else none."""
    raw = store.metadata.get(ROWGROUP_INDEX_KEY)
    if raw is not None:
        return _from_json(store, raw)
    raw = store.metadata.get(legacy.PETASTORM_ROWGROUPS_INDEX_KEY)
    if raw is not None:
        return _from_petastorm(store, raw)
    return StoredIndexes()


def _from_json(store: ParquetStore, raw: bytes) -> StoredIndexes:
    try:
        document = parse_json(raw)  # strictly UTF-8, nesting bounded: hostile bytes are a named error
    except SchemaError as exc:
        raise RowGroupIndexError(f"{store.url}: the row-group index metadata is {exc}") from exc
    if not isinstance(document, dict) or document.get("format") != ROWGROUP_INDEX_FORMAT:
        raise RowGroupIndexError(f"{store.url}: {ROWGROUP_INDEX_KEY.decode()} does not hold a unihub row-group index")
    if document.get("version") != ROWGROUP_INDEX_VERSION:
        raise RowGroupIndexError(f"{store.url}: row-group index version {document.get('version')!r} is not "
                                 f"supported (this unihub reads version {ROWGROUP_INDEX_VERSION}); upgrade unihub "
                                 "or rebuild the index")
    items = document.get("indexes")
    if not isinstance(items, list):
        raise RowGroupIndexError(f"{store.url}: the row-group index has no list of indexes")
    indexes: dict[str, RowGroupIndexerBase] = {}
    for item in items:
        try:
            indexer = indexer_from_json(item)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:  # a stored index of the wrong shape
            if isinstance(exc, RowGroupIndexError):
                raise
            raise RowGroupIndexError(f"{store.url}: a row-group index entry is malformed ({exc}): "
                                     f"{json.dumps(item)[:200]}") from exc
        if indexer.index_name in indexes:
            raise RowGroupIndexError(f"{store.url}: the row-group index {indexer.index_name!r} is stored twice")
        indexes[indexer.index_name] = indexer
    stale = None
    built_over, now = document.get("files"), _files_built_over(store)
    if not (isinstance(built_over, list) and all(isinstance(f, list) and len(f) == 2 and isinstance(f[0], str)
                                                 and type(f[1]) is int and f[1] >= 0 for f in built_over)):
        raise RowGroupIndexError(f"{store.url}: the row-group index's files are not [path, row groups] pairs: "
                                 f"{json.dumps(built_over)[:200]}")
    if built_over != now:
        count = sum(n for _, n in built_over)
        stale = (f"they were built over {len(built_over or [])} files ({count} row groups); the dataset now has "
                 f"{len(now)} files ({len(store.row_groups)} row groups)")
    return StoredIndexes(indexes, "unihub", stale)


def _from_petastorm(store: ParquetStore, raw: bytes) -> StoredIndexes:
    """Petastorm's pickled ``{name: indexer}``, read into stand-ins (nothing run) and converted."""
    loaded = legacy.safe_unpickle(raw, source=f"{store.url} ({legacy.PETASTORM_ROWGROUPS_INDEX_KEY.decode()})")
    if not isinstance(loaded, dict):
        raise PetastormMetadataError(f"{store.url}: Petastorm's row-group index is a {type(loaded).__name__}, "
                                     "expected a dict of indexers")
    indexes: dict[str, RowGroupIndexerBase] = {}
    for name, stand_in in loaded.items():
        name = _plain(name)
        if not isinstance(name, str):
            raise PetastormMetadataError(f"{store.url}: Petastorm's row-group index is named {legacy.brief(name)}, "
                                         "not a string")
        indexes[name] = _convert_petastorm_indexer(name, stand_in)
    top = max((max(i.get_row_group_indexes(v), default=-1) for i in indexes.values() for v in i.indexed_values),
              default=-1)
    stale = None
    if top >= len(store.row_groups):
        stale = f"they refer to row group {top} but the dataset has {len(store.row_groups)} row groups"
    return StoredIndexes(indexes, "petastorm", stale)


def _convert_petastorm_indexer(name: str, stand_in: Any) -> RowGroupIndexerBase:
    if not isinstance(stand_in, (legacy.PetastormSingleFieldIndexer, legacy.PetastormFieldNotNullIndexer)):
        raise PetastormMetadataError(f"Petastorm's row-group index {legacy.brief(name)} is {legacy.brief(stand_in)}, "
                                     "not an indexer")
    state = stand_in.state_dict()
    column, data = _plain(state.get("_column_name")), state.get("_index_data")
    if isinstance(stand_in, legacy.PetastormFieldNotNullIndexer):
        indexer: RowGroupIndexerBase = FieldNotNullIndexer(name, column)
        if not isinstance(data, set):
            raise PetastormMetadataError(f"Petastorm's row-group index {legacy.brief(name)} holds "
                                         f"{legacy.brief(data)}, expected a set")
        for group in _groups(data, name):
            indexer.add(group, [True])
        return indexer
    indexer = SingleFieldIndexer(name, column)
    if not isinstance(data, dict):
        raise PetastormMetadataError(f"Petastorm's row-group index {legacy.brief(name)} holds {legacy.brief(data)}, "
                                     "expected a dict")
    for key, groups in data.items():
        for group in _groups(groups, name):
            indexer.add(group, [_plain(key)])
    return indexer


def _plain(value: Any) -> Any:
    """A pickled numpy scalar as numpy's own (``index_key`` makes it a Python value, a datetime64 kept)."""
    return value.to_numpy() if isinstance(value, legacy.NumpyScalar) else value


def _groups(items: Any, name: str) -> list[int]:
    if not isinstance(items, (set, frozenset, list, tuple)) or not all(
            isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in items):
        raise PetastormMetadataError(f"Petastorm's row-group index {legacy.brief(name)}: row groups "
                                     f"{legacy.brief(items)} are not a set of non-negative ints")
    return sorted(items)


def get_row_group_indexes(dataset: Any, *, storage_options: dict[str, Any] | None = None,
                          filesystem: Any = None) -> dict[str, RowGroupIndexerBase]:
    """``{index name: indexer}`` of a dataset (a URL or an opened store), as Petastorm's function of that name."""
    store = dataset if isinstance(dataset, ParquetStore) else open_dataset(
        dataset, filesystem=filesystem, storage_options=storage_options)
    stored = read_rowgroup_indexes(store)
    if not stored.indexes:
        raise RowGroupIndexError(f"{store.url} has no row-group indexes; build them with build_rowgroup_index")
    return stored.indexes


# -- selecting -----------------------------------------------------------------------------------
def apply_rowgroup_selector(store: ParquetStore, selector: Any, row_groups: Sequence[int]) -> list[int]:
    """``row_groups`` (in their order) that ``selector`` selects from ``store``'s indexes."""
    check_selector(selector)
    names = list(selector.get_index_names())
    stored = read_rowgroup_indexes(store)
    if not stored.indexes:
        raise RowGroupIndexError(f"rowgroup_selector needs the index(es) {names}, but {store.url} has no row-group "
                                 "indexes; build them with build_rowgroup_index(url, None, [SingleFieldIndexer(...)])")
    missing = [n for n in names if n not in stored.indexes]
    if missing:
        raise RowGroupIndexError(f"rowgroup_selector needs the index(es) {missing}, which {store.url} does not have; "
                                 f"its indexes: {sorted(stored.indexes)}")
    if stored.stale:
        raise RowGroupIndexError(f"the row-group indexes of {store.url} are stale: {stored.stale}; rebuild them "
                                 "with build_rowgroup_index")
    try:
        selected = selector.select_row_groups(stored.indexes)
    except KeyError as exc:
        raise RowGroupIndexError(f"rowgroup_selector needs the index {exc.args[0]!r}, which {store.url} does not "
                                 f"have; its indexes: {sorted(stored.indexes)}") from exc
    if not isinstance(selected, Iterable):
        raise RowGroupIndexError(f"rowgroup_selector returned {selected!r:.80}, not a set of row groups")
    selected = set(selected)
    kept = [g for g in row_groups if g in selected]
    if not kept:
        warnings.warn(f"rowgroup_selector selected no row groups of {store.url} (after partition filters): "
                      "the reader yields nothing", stacklevel=5)
    return kept


def describe_rowgroup_indexes(store: ParquetStore) -> dict[str, Any]:
    """What ``unihub inspect`` shows of a dataset's indexes (JSON-able); a stale or unreadable
    index is reported in ``rowgroup_index_problem`` rather than raised."""
    try:
        stored = read_rowgroup_indexes(store)
    except UnihubError as exc:
        return {"rowgroup_indexes": [], "rowgroup_index_source": None,
                "rowgroup_index_problem": f"unreadable: {exc}"}
    indexes = []
    for name, indexer in stored.indexes.items():
        single = isinstance(indexer, SingleFieldIndexer)
        groups = set().union(*(indexer.get_row_group_indexes(v) for v in indexer.indexed_values))
        indexes.append({"name": name, "kind": indexer.kind, "field": indexer.index_field,
                        "values": len(indexer.indexed_values) if single else None, "row_groups": len(groups)})
    return {"rowgroup_indexes": indexes, "rowgroup_index_source": None if stored.source == "none" else stored.source,
            "rowgroup_index_problem": f"stale: {stored.stale}" if stored.stale else None}
