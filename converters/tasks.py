"""Conversion tasks: a slice of a foreign source's files -> Parquet part files, for parallel engines.

Both parallel engines run the same task: the Spark engine on executors
(:mod:`unihub.converters.spark`) and the local engine's ``workers=N`` in forked worker
processes (:func:`run_local`). The driver infers the schema (or takes the given one), cuts
the input files into contiguous slices and runs :func:`run_task` on each; task ``i`` writes
``part-<i>-<n>.parquet`` into a hidden directory beside the target, so the dataset reads back
in input-file order. :func:`finish` adds ``_common_metadata`` once every task succeeded, and
the caller renames the directory onto the target; a failure removes it (:func:`remove_tree`).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from unihub.formats.foreign import FORMATS, ForeignFormat, OnError, SkippedRecord
from unihub.formats.image_checks import ValidateImages
from unihub.formats.schema import Unischema

TASK_DIR = "_task-{:05d}"
PART = "part-{:05d}-{:05d}.parquet"
#: what a task returns: rows written, the records it skipped as (path, location, reason), and
#: what an observing read saw (single-pass conversions; see ForeignFormat.provisional_schema)
TaskResult = tuple[int, list[tuple[str, str, str]], Any]


class TaskPlan:
    """What every task needs (pickled to executors or inherited by forked workers)."""

    def __init__(self, fmt: str, src: str, options: dict[str, Any], schema: Unischema, extra: dict[str, Any],
                 row_group_size_mb: float, on_error: OnError, layout: Any, validate: bool = True,
                 observe: bool = False, validate_images: ValidateImages = "header") -> None:
        self.fmt, self.src, self.options = fmt, src, options
        self.schema, self.extra = schema, extra
        self.row_group_size_mb, self.on_error = row_group_size_mb, on_error
        self.layout = layout  # image folders: (root, classes) to label files without listing the root
        self.validate = validate  # False when the source inferred the schema it is read with
        self.observe = observe  # single pass: the schema is provisional, the read observes
        self.validate_images = validate_images  # how the source checks images (formats/image_checks.py)
        self.batch_bytes: int | None = None  # the sources' batch bound in bytes (None: unihub.memory's default)


def layout_of(source: ForeignFormat) -> Any:
    from unihub.formats.imagefolder import ImageFolderFormat

    if isinstance(source, ImageFolderFormat):
        return (source.root, source._listing.classes)
    return None


def driver_skips(source: ForeignFormat) -> list[SkippedRecord]:
    """Files the source leaves out before reading any (image folders: files outside the class folders)."""
    from unihub.formats.imagefolder import ImageFolderFormat

    if isinstance(source, ImageFolderFormat):
        return [SkippedRecord(os.path.join(source.root, rel), "file", "outside the class folders (class layout)")
                for rel in source._listing.outside]
    return []


def file_slices(files: list[str], count: int) -> list[list[str]]:
    """``files`` cut into at most ``count`` contiguous, nearly equal slices (none empty)."""
    count = max(1, min(count, len(files)))
    bounds = [round(i * len(files) / count) for i in range(count + 1)]
    return [files[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def run_task(plan: TaskPlan, temporary: str, index: int, files: Iterable[str],
             wrap: Callable[[ForeignFormat, Iterator[Any]], Iterator[Any]] | None = None) -> TaskResult:
    """Read ``files`` and write them as ``part-<index>-<n>.parquet`` into ``temporary``.

    ``wrap(source, batches)`` may watch the batches on their way (a progress bar in-process).
    """
    import unihub.formats.formats_all  # noqa: F401  (registers every format in the worker)
    from unihub.formats.writer import write_dataset

    files = list(files)
    if not files:
        return 0, [], None
    work = os.path.join(temporary, TASK_DIR.format(index))
    os.mkdir(work)  # not makedirs: a job being torn down must not recreate the temporary directory
    source = task_source(plan, files)
    source.observe = plan.observe
    source.validate_images = plan.validate_images
    if getattr(plan, "batch_bytes", None):  # (plans pickled by an older driver lack it)
        source.batch_bytes = plan.batch_bytes  # type: ignore[assignment]
    batches = source.read_batches(plan.schema, on_error=plan.on_error)
    if wrap is not None:
        batches = wrap(source, batches)
    out = os.path.join(work, "out")
    result = write_dataset(out, plan.schema, batches, batched=True, row_group_size_mb=plan.row_group_size_mb,
                           extra_metadata=plan.extra, validate=plan.validate)
    if result.num_rows:
        written = sorted(os.path.join(out, p) for p in os.listdir(out) if p.endswith(".parquet"))
        for n, path in enumerate(written):
            os.replace(path, os.path.join(temporary, PART.format(index, n)))
    shutil.rmtree(work)
    return result.num_rows, [(s.path, s.location, s.reason) for s in source.report.skipped], source.report.observed


def task_source(plan: TaskPlan, files: list[str]) -> ForeignFormat:
    """The format module reading just ``files`` (an image folder keeps the labels of the whole root)."""
    fmt = FORMATS.get(plan.fmt)
    if plan.layout is None:
        return fmt(files, **plan.options)
    from unihub.formats.imagefolder import _Entry, _Listing

    root, classes = plan.layout
    source = fmt(root, **plan.options)
    prefix = os.path.join(root, "")
    label_of = {name: i for i, name in enumerate(classes or ())}
    entries = []
    for path in files:
        # the files come from the source's listing (root + relative path); relpath is slow
        rel = (path[len(prefix):] if path.startswith(prefix) else os.path.relpath(path, root)).replace(os.sep, "/")
        label = None if classes is None else label_of[rel.split("/", 1)[0]]
        entries.append(_Entry(rel, label))
    source.__dict__["_listing"] = _Listing(classes, tuple(entries), ())
    return source


def finish(temporary: str, schema: Unischema, extra: Mapping[str, Any]) -> None:
    """``_common_metadata`` (and one empty part file when no task wrote rows); part files written
    with another schema (a single pass's provisional one) get ``schema`` in their footers."""
    from unihub.formats.spark import write_common_metadata
    from unihub.formats.writer import restamp_schema, write_dataset

    for name in sorted(os.listdir(temporary)):
        if name.endswith(".parquet"):
            restamp_schema(os.path.join(temporary, name), schema)

    if not any(n.endswith(".parquet") for n in os.listdir(temporary)):
        empty = os.path.join(temporary, "_empty")
        write_dataset(empty, schema, [], batched=True, extra_metadata=extra)
        os.replace(os.path.join(empty, "part-00000.parquet"), os.path.join(temporary, PART.format(0, 0)))
        shutil.rmtree(empty)
    write_common_metadata(temporary, schema)


def remove_tree(path: str) -> None:
    """Remove ``path``; a cancelled task still running may write into it once more, so look again."""
    shutil.rmtree(path, ignore_errors=True)
    for _ in range(3):
        time.sleep(0.2)
        if os.path.lexists(path):
            shutil.rmtree(path, ignore_errors=True)


def run_local(plan: TaskPlan, files: list[str], temporary: str, workers: int,
              on_done: Callable[[int, list[str]], None] | None = None) -> tuple[int, list[tuple], list[Any]]:
    """Run the tasks in ``workers`` forked processes; ``on_done(rows, files)`` after each task.

    Slices are a few per worker so that workers finish together; results are collected in
    task order. Ctrl-C or a failing task cancels what has not started and waits for the
    running workers to exit before returning the error, so the caller can remove
    ``temporary`` without a worker writing into it afterwards.
    """
    import unihub.formats.formats_all  # noqa: F401  (imported once here, not in every forked worker)
    import unihub.formats.writer  # noqa: F401
    from unihub.formats.foreign import process_pool

    slices = file_slices(files, workers * 4)
    pool = process_pool(workers)
    rows, skipped, observed = 0, [], []
    try:
        futures = [pool.submit(run_task, plan, temporary, index, part) for index, part in enumerate(slices)]
        for part, future in zip(slices, futures):
            done, part_skipped, part_observed = future.result()
            rows += done
            skipped.extend(part_skipped)
            observed.append(part_observed)
            if on_done is not None:
                on_done(done, part)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return rows, skipped, observed
