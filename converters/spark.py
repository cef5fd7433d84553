"""``convert`` as Spark tasks: foreign source -> unihub dataset, one or more input files per task.

The driver lists the input files, infers the schema (or takes the given one) and hands the
file list to Spark in contiguous slices; each task reads its files with the format module
and writes its own Parquet part files with :func:`unihub.write_dataset`, named
``part-<task>-<n>.parquet`` so the dataset reads back in input-file order (the order the
local engine writes). Everything goes to a hidden directory beside ``dst``; the driver
writes ``_common_metadata`` and renames it onto ``dst`` when every task succeeded. A failed
task fails the job, and neither ``dst`` nor the temporary directory is left behind.

    from unihub.converters.spark import convert_with_spark
    convert_with_spark("data/shard-{000..099}.tar", "data/train", master="local[8]")

The input files must be readable by the executors at the same paths, and the temporary
directory beside ``dst`` must be writable by them (a shared file system on a cluster).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow.fs as pafs

from unihub.converters.convert import UNIHUB, ConvertResult, load_schema, resolve_source_format
from unihub.converters.tasks import TaskPlan, driver_skips, finish, layout_of, remove_tree, run_task
from unihub.errors import DatasetExistsError, FormatError, UnsupportedFormatError
from unihub.formats import filesystem as fsutil
from unihub.formats.foreign import FORMATS, OnError, SkippedRecord, check_on_error
from unihub.formats.image_checks import ValidateImages, check_mode
from unihub.formats.schema import Unischema


def convert_with_spark(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, from_format: str | None = None,
                       schema: Unischema | str | os.PathLike[str] | None = None, overwrite: bool = False,
                       master: str = "local[2]", spark: Any = None, row_group_size_mb: float = 32,
                       on_error: OnError = "raise", format_options: Mapping[str, Any] | None = None,
                       validate_images: ValidateImages = "header") -> ConvertResult:
    """Convert the foreign dataset ``src`` into the unihub dataset ``dst`` with Spark.

    ``spark`` is an existing SparkSession (left running); without one a session is started
    on ``master`` and stopped at the end. The other arguments are those of
    :func:`unihub.converters.convert.convert`.
    """
    import unihub.formats.formats_all  # noqa: F401  (registers every format)

    src, dst = os.fspath(src), os.path.abspath(os.fspath(dst))
    source_format = resolve_source_format(src, from_format)
    if source_format == UNIHUB:
        raise UnsupportedFormatError(f"{src} is already a unihub dataset; the Spark engine converts foreign "
                                     "formats into unihub (use the local engine to rewrite it)")
    check_on_error(on_error)
    fsutil.settle_url(dst)  # a killed run's old dataset back in place, its temporaries removed
    if os.path.exists(dst) and not overwrite:
        raise DatasetExistsError(f"{dst} already exists; pass --overwrite (overwrite=True) to replace it")
    start = time.perf_counter()
    options = dict(format_options or {})
    source = FORMATS.get(source_format)(src, **options)
    source.on_error = on_error
    source.validate_images = check_mode(validate_images)
    files = source.files()
    out_schema = load_schema(schema) if schema is not None else source.infer_schema()
    source.prepare(out_schema)
    extra = {"source_format": source_format, "source": src, **source.metadata()}
    # the source's options after inference: it may have added what its tasks need (feature lists)
    plan = TaskPlan(source_format, src, dict(source.options), out_schema, extra, row_group_size_mb, on_error,
                    layout_of(source), validate=schema is not None, validate_images=validate_images)
    skipped = driver_skips(source)
    bytes_read = sum(os.path.getsize(f) for f in files if os.path.isfile(f))

    os.makedirs(os.path.dirname(dst), exist_ok=True)
    temporary = fsutil.temporary_sibling(dst)
    os.makedirs(temporary)
    session, created = _session(spark, master)
    try:
        rows, task_skips = _run_tasks(session, plan, files, temporary)
        skipped.extend(SkippedRecord(*s) for s in task_skips)
        finish(temporary, out_schema, extra)
        fsutil.commit(pafs.LocalFileSystem(), temporary, dst)
    except BaseException:
        remove_tree(temporary)
        raise
    finally:
        if created:
            session.stop()
    return ConvertResult(src, dst, source_format, UNIHUB, rows, time.perf_counter() - start,
                         bytes_read=bytes_read, skipped=skipped)


def _session(spark: Any, master: str) -> tuple[Any, bool]:
    if spark is not None:
        return spark, False
    from unihub.dependencies import require

    sql = require("pyspark.sql", extra="spark", purpose="the Spark conversion engine")
    running = sql.SparkSession.getActiveSession()
    if running is None and require("pyspark").SparkContext._active_spark_context is not None:
        running = sql.SparkSession.builder.getOrCreate()  # this process's context, started elsewhere
    if running is not None:  # someone else's session: use it, leave it running
        return running, False
    builder = (sql.SparkSession.builder.master(master).appName("unihub-convert")
               .config("spark.ui.showConsoleProgress", "false"))
    return builder.getOrCreate(), True


def _run_tasks(session: Any, plan: TaskPlan, files: list[str], temporary: str) -> tuple[int, list[tuple]]:
    """Run one task per slice of ``files``; their part files land in ``temporary``."""
    if not files:
        return 0, []
    sc = session.sparkContext
    slices = max(1, min(len(files), sc.defaultParallelism * 2))
    group = f"unihub-convert-{uuid.uuid4().hex[:12]}"
    sc.setJobGroup(group, f"unihub convert {plan.src}", interruptOnCancel=True)
    try:
        results = sc.parallelize(files, numSlices=slices).mapPartitionsWithIndex(
            lambda index, part: iter([run_task(plan, temporary, index, part)])).collect()
    except Exception as exc:
        sc.cancelJobGroup(group)
        raise FormatError(f"Spark conversion of {plan.src} failed: {_task_error(exc)}", path=plan.src) from exc
    rows = sum(r[0] for r in results)
    skipped = [s for r in results for s in r[1]]
    return rows, skipped


def _task_error(exc: BaseException) -> str:
    """The Python exception line of a failed task, out of Spark's Java stack trace."""
    text = str(exc)
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("unihub.errors.") or "Error: " in stripped and not stripped.startswith(
                ("py4j", "org.apache", "java.", "at ")):
            return stripped
    return text.splitlines()[0] if text else type(exc).__name__
