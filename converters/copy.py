"""``copy_dataset``: Petastorm's ``petastorm-copy-dataset.py``, embedded or on Spark.

Copies a dataset (unihub's, Petastorm's or plain Parquet), optionally keeping only the
fields that match ``field_regex`` and dropping the rows where any of ``not_null_fields`` is
null, as Petastorm does. Rows are copied as stored (images and arrays stay encoded: nothing
is decoded and re-encoded) and in order. Each task copies a contiguous range of rows into its
own part files: one task per source file (the copy has the source's file layout, Hive
partitions included), or ``partitions_count`` tasks of equal row ranges, one output file each
(Petastorm's ``repartition(partitions_count)``). Tasks run in this process (embedded, the
default) or as Spark tasks when a SparkSession is given. Everything is written into a hidden
directory beside the target and renamed onto it at the end: a failure leaves nothing behind.

    from unihub import copy_dataset
    copy_dataset(None, "/data/train", "/data/train_small", field_regex=["id", "image.*"],
                 not_null_fields=["label"], overwrite_output=False, partitions_count=4,
                 row_group_size_mb=64)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from unihub.errors import FormatError, NoMatchingFieldsError, SchemaError, SparkStalledError, UnsupportedFormatError
from unihub.fs import filesystem as fsutil
from unihub.fs import publish, remote
from unihub.fs.outputs import names_output_errors
from unihub.petastorm.pickling import check_petastorm_compatible
from unihub.runtime.memory import DEFAULT_ROW_GROUP_SIZE_MB
from unihub.schema.unischema import Unischema, select_unischema_fields
from unihub.store.dataset import ParquetStore, list_data_files, open_dataset
from unihub.store.ownership import check_replaceable
from unihub.store.writer import check_row_group_size, finish_parts, write_parts


@dataclass(frozen=True)
class CopyResult:
    """What :func:`copy_dataset` did."""

    source: str
    target: str
    rows_read: int
    rows: int
    files: int
    seconds: float
    schema: Unischema

    def summary(self) -> str:
        dropped = self.rows_read - self.rows
        text = f"copied {self.rows:,} of {self.rows_read:,} rows"
        if dropped:
            text += f" ({dropped:,} with nulls dropped)"
        return (f"{text}, {len(self.schema)} fields, into {self.files} file(s) in {self.seconds:.1f} s: "
                f"{self.target}")


@dataclass(frozen=True)
class _Plan:
    """What every copy task needs (pickled to Spark executors)."""

    store: ParquetStore
    schema: Unischema
    not_null: tuple[str, ...]
    partition_by: tuple[str, ...]
    row_group_size_mb: float
    filesystem: pafs.FileSystem
    temporary: str


@remote.naming_url("target_url")  # the source's failures name the source (open_dataset)
@names_output_errors("target_url")  # a full disk, a read-only destination: OutputError naming ``target_url``
def copy_dataset(spark: Any, source_url: str | os.PathLike[str], target_url: str | os.PathLike[str],
                 field_regex: Sequence[str] | None = None, not_null_fields: Sequence[str] | None = None,
                 overwrite_output: bool = False, partitions_count: int | None = None,
                 row_group_size_mb: float | None = None, hdfs_driver: str = "libhdfs3", *,
                 petastorm_compatible: bool | None = None, engine: str | None = None, master: str = "local[2]",
                 storage_options: dict[str, Any] | None = None, overwrite_foreign: bool = False,
                 progress: Callable[[int, int], None] | None = None) -> CopyResult:
    """Copy ``source_url`` to ``target_url`` with Petastorm's arguments; see the module docstring.

    ``spark``: a SparkSession to run the copy as Spark tasks, or None to copy in this process
    (``engine="spark"`` without a session starts one on ``master`` and stops it afterwards).
    ``field_regex``: names or full-match regular expressions of the fields to keep (all when
    empty); ``not_null_fields``: rows with a null in any of them are dropped (they need not be
    kept). ``row_group_size_mb`` defaults to :data:`~unihub.runtime.memory.DEFAULT_ROW_GROUP_SIZE_MB`. ``petastorm_compatible``: also write the
    metadata Petastorm 0.13.1 reads; None (default) does so when the source has Petastorm's.
    ``hdfs_driver`` is accepted for Petastorm's signature; pyarrow picks the HDFS driver.
    ``progress(rows_read, total_rows)`` is called as rows are copied. ``overwrite_output`` replaces
    only a dataset unihub wrote; ``overwrite_foreign`` anything (:mod:`unihub.store.ownership`).
    """
    start = time.perf_counter()
    engine = engine or ("spark" if spark is not None else "local")
    if engine not in ("local", "spark"):
        raise UnsupportedFormatError(f"engine must be 'local' or 'spark', got {engine!r}")
    if partitions_count is not None and (not isinstance(partitions_count, int) or partitions_count < 1):
        raise SchemaError(f"partitions_count must be a positive integer, got {partitions_count!r}")
    row_group_size_mb = DEFAULT_ROW_GROUP_SIZE_MB if row_group_size_mb is None else row_group_size_mb
    check_row_group_size(row_group_size_mb)
    source_url, target_url = os.fspath(source_url), os.fspath(target_url)
    store = open_dataset(source_url, storage_options=storage_options)
    schema = _target_schema(store.schema, field_regex)
    not_null = tuple(not_null_fields or ())
    unknown = [name for name in not_null if name not in store.schema]
    if unknown:
        raise SchemaError(f"not_null_fields {unknown} are not fields of {source_url}; "
                          f"fields: {list(store.schema.fields)}")
    if petastorm_compatible is None:
        petastorm_compatible = store.schema_source == "petastorm"
    if petastorm_compatible:
        check_petastorm_compatible(schema)
    fs, target = fsutil.resolve_filesystem(target_url, None, storage_options)
    fsutil.check_bucket(fs, target, target_url)
    publish.settle(fs, target)  # a killed run's old dataset back in place, its temporaries removed
    check_replaceable(fs, target, target_url, overwrite=overwrite_output, overwrite_foreign=overwrite_foreign,
                      what="overwrite_output=True (--overwrite)")
    partition_by = () if partitions_count else tuple(k for k in store.partition_names if k in schema)
    temporary = fsutil.temporary_sibling(target)
    plan = _Plan(store, schema, not_null, partition_by, row_group_size_mb, fs, temporary)
    ranges = _row_ranges(store, partitions_count)
    try:
        fs.create_dir(temporary, recursive=True)  # inside: a Ctrl-C right after it removes it too
        if engine == "spark":
            rows_read, rows = _run_on_spark(spark, master, plan, ranges)
        else:
            rows_read, rows = _run_here(plan, ranges, progress)
        files = _finish(plan, petastorm_compatible, store.extra_metadata)
        publish.commit(fs, temporary, target)
    except BaseException:
        fsutil.discard(fs, temporary)  # the last step: open uploads aborted, then the staging area removed
        raise
    return CopyResult(source_url, target_url, rows_read, rows, files, time.perf_counter() - start, schema)


def _target_schema(schema: Unischema, field_regex: Sequence[str] | None) -> Unischema:
    """The source schema, or its view of the fields ``field_regex`` matches (each pattern must match one)."""
    if not field_regex:
        return schema
    if isinstance(field_regex, str):
        field_regex = [field_regex]
    fields, unmatched = select_unischema_fields(schema, field_regex)
    if unmatched:  # Petastorm refused only when none matched; a copy refuses any typo
        raise NoMatchingFieldsError(f"Regular expressions {unmatched} do not match any fields "
                                    f"({list(schema.fields)}): no field of Unischema {schema.name!r} matches "
                                    f"{', '.join(map(repr, unmatched))} (each field_regex must match a whole name)")
    return Unischema(f"{schema.name}_view", fields)


def _row_ranges(store: ParquetStore, partitions_count: int | None) -> list[tuple[int, int]]:
    """Global row ranges, one per task: each source file's, or ``partitions_count`` equal ones."""
    total = store.num_rows
    if partitions_count:
        bounds = [round(i * total / partitions_count) for i in range(partitions_count + 1)]
        return list(zip(bounds[:-1], bounds[1:]))
    ranges, first = [], 0
    for info in store.files:
        ranges.append((first, first + info.num_rows))
        first += info.num_rows
    return ranges


def _tables(plan: _Plan, start: int, stop: int, counted: Callable[[int], None]) -> Iterator[pa.Table]:
    """The rows ``[start, stop)`` as stored, nulls in ``not_null`` dropped, the kept columns in schema order."""
    store = plan.store
    names = list(plan.schema.fields)
    columns = names + [n for n in plan.not_null if n not in plan.schema]
    first = max(0, int(np.searchsorted(store._offsets, start, side="right")) - 1)
    for info in store.row_groups[first:]:
        if info.first_row >= stop:
            break
        end = info.first_row + info.num_rows
        if end <= start or info.num_rows == 0:
            continue
        table = store.read_row_group(info.index, columns)
        lo = max(start, info.first_row) - info.first_row
        table = table.slice(lo, min(stop, end) - info.first_row - lo)
        counted(table.num_rows)
        if plan.not_null:
            keep = reduce(pc.and_, [pc.is_valid(table.column(n)) for n in plan.not_null])
            table = table.filter(keep)
        yield table.select(names)


def copy_task(plan: _Plan, index: int, start: int, stop: int,
              counted: Callable[[int], None] = lambda rows: None) -> tuple[int, int]:
    """Copy rows ``[start, stop)`` into ``part-<index>-<n>.parquet`` files of ``plan.temporary``
    (under their partition directories), as a conversion task writes its parts; returns (rows read,
    rows written)."""
    from unihub.converters.tasks import part_name  # start-up cost: 11 ms (the image folder format with it)

    read = [0]

    def count(rows: int) -> None:
        read[0] += rows
        counted(rows)

    try:
        result = write_parts(plan.filesystem, plan.temporary, plan.schema, _tables(plan, start, stop, count),
                             batched=True, part_name=part_name(index), row_group_size_mb=plan.row_group_size_mb,
                             partition_by=plan.partition_by, validate=False,
                             extra_metadata=plan.store.extra_metadata or None)
    except SchemaError as exc:  # the source's columns are not what its schema says: name the source and rows
        raise SchemaError(f"{plan.store.url}, rows {start:,} to {stop:,}: {exc}") from exc
    finally:
        plan.store._close_file()  # this thread's open source file
    return read[0], result.num_rows


def _run_here(plan: _Plan, ranges: list[tuple[int, int]],
              progress: Callable[[int, int], None] | None) -> tuple[int, int]:
    total, done = plan.store.num_rows, [0]

    def counted(rows: int) -> None:
        done[0] += rows
        if progress is not None:
            progress(done[0], total)

    results = [copy_task(plan, i, a, b, counted) for i, (a, b) in enumerate(ranges)]
    return sum(r[0] for r in results), sum(r[1] for r in results)


def _run_on_spark(spark: Any, master: str, plan: _Plan, ranges: list[tuple[int, int]]) -> tuple[int, int]:
    """One Spark task per row range; the executors read the source and write beside the target."""
    from unihub.converters.engines.spark import run_job  # start-up cost: 9 ms, for Spark runs only
    from unihub.converters.engines.spark import session as _session  # start-up cost (as above)
    from unihub.converters.engines.spark import task_error_text as _task_error  # start-up cost (as above)

    session, created = _session(spark, master)
    sc = session.sparkContext
    jobs = list(enumerate(ranges))
    try:
        results = run_job(sc, f"unihub copy {plan.store.url}", lambda: sc.parallelize(
            jobs, numSlices=max(1, len(jobs))).map(lambda job: copy_task(plan, job[0], *job[1])).collect())
    except SparkStalledError:
        raise
    except Exception as exc:
        raise FormatError(f"Spark copy of {plan.store.url} failed: {_task_error(exc)}", path=plan.store.url) from exc
    finally:
        if created:
            session.stop()
    return sum(r[0] for r in results), sum(r[1] for r in results)


def _finish(plan: _Plan, petastorm_compatible: bool, extra: dict[str, Any]) -> int:
    """``_common_metadata`` (and an empty part file when no row was kept); returns the data files."""
    from unihub.converters.tasks import part_name  # start-up cost: 11 ms (the image folder format with it)

    fs = plan.filesystem
    empty = not list_data_files(fs, plan.temporary)
    finish_parts(fs, plan.temporary, plan.schema, extra_metadata=extra or None, partition_by=plan.partition_by,
                 empty=empty, empty_part=part_name(0).format(0), petastorm_compatible=petastorm_compatible)
    return len(list_data_files(fs, plan.temporary))
