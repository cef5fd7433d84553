"""Conversion tasks: a slice of a foreign source's files -> Parquet part files in a staging area.

Every engine (:mod:`unihub.converters.engines`) runs the same task, in this process, in forked
workers or on Spark executors. Task ``i`` writes ``part-<i>-<n>.parquet`` straight into the
staging area of the conversion (a hidden sibling of the target, on whatever filesystem the
target's URL names), so the dataset reads back in input-file order. A task attempt is
idempotent: it first removes what an earlier attempt of the same task left, and a failed
attempt removes its own files. :mod:`unihub.converters.pipeline` plans the tasks and commits.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from unihub.formats.base import FORMATS, ForeignFormat, OnError, ReadReport, SkippedRecord
from unihub.formats.imagefolder.format import ImageFolderFormat
from unihub.fs import filesystem as fsutil
from unihub.images import decoders as images
from unihub.runtime.memory import DEFAULT_PART_SIZE_MB
from unihub.schema.image_checks import ValidateImages
from unihub.schema.unischema import Unischema
from unihub.store.writer import write_parts


def part_name(task: int) -> str:
    """The name template of task ``task``'s part files: ``part-<task>-{n}.parquet``."""
    return f"part-{task:05d}-{{:05d}}.parquet"


@dataclass
class TaskResult:
    """What a task did: rows written, records skipped as (path, location, reason), what an observing
    read saw (single-pass conversions; see ForeignFormat.provisional_schema) and the part files'
    names (in the staging area)."""

    rows: int
    skipped: list[tuple[str, str, str]]
    observed: Any
    parts: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # files passed over (ReadReport.left_out)
    unread: list[str] = field(default_factory=list)  # files skipped whole as bad (:func:`unread_files`)


@dataclass
class TaskPlan:
    """What every task needs (pickled to executors or inherited by forked workers).

    ``fmt`` is the format's registered name or its class (a class travels with the plan, so an
    executor needs no registration). ``staging`` is the URL of the staging area (absolute: tasks
    run in other working directories), ``storage_options`` those of its filesystem."""

    fmt: str | type[ForeignFormat]
    src: str
    options: dict[str, Any]
    schema: Unischema
    extra: dict[str, Any]
    row_group_size_mb: float
    on_error: OnError
    layout: Any = None  # image folders: (root, classes) to label files without listing the root
    validate: bool = True  # False when the source inferred the schema it is read with
    observe: bool = False  # single pass: the schema is provisional, the read observes
    validate_images: ValidateImages = "header"  # how the source checks images (schema/image_checks.py)
    staging: str = ""
    storage_options: dict[str, Any] | None = None
    batch_size: int = 256
    #: in this process, read the next batches in a thread while the writer writes (h5py, tar parsing
    #: release the GIL); off for a single pass's observing read, whose Python-bound parsing only
    #: contends with the writer (TFRecord: measured slower)
    read_ahead: bool = True
    batch_bytes: int | None = None  # the sources' batch bound in bytes (None: unihub.runtime.memory's default)
    #: the image pixel limit the tasks hold images to (images/decoders.py), as the driver had it;
    #: "current": the task's process's own setting
    max_image_pixels: int | None | str = "current"
    part_size_mb: float = DEFAULT_PART_SIZE_MB  # the bound of a part file's size (store/writer.py)


def layout_of(source: ForeignFormat) -> Any:
    """An image folder's (absolute root, classes), so a task labels its files without listing the root."""
    if isinstance(source, ImageFolderFormat):
        return (absolute(source.root), source._listing.classes)
    return None


def absolute(path: str) -> str:
    """A local path made absolute (executors and workers have their own working directory); URLs as they are."""
    return path if "://" in path else os.path.abspath(path)


def driver_skips(source: ForeignFormat) -> list[SkippedRecord]:
    """Files the source leaves out before reading any (image folders: files outside the class folders),
    which no task sees (a task's read leaves them to the driver: ``in_task``)."""
    if isinstance(source, ImageFolderFormat):
        return [SkippedRecord(os.path.join(source.root, rel), "file", "outside the class folders (class layout)")
                for rel in source._listing.outside]
    return []


def unread_files(source: ForeignFormat) -> list[str]:
    """The files a read skipped whole as bad (an image folder's corrupt images, ``on_error='skip'``), not those
    it left out as no images: they gave no rows, so ``convert --append`` does not record them as converted
    (once repaired, the next append converts them; recorded, their new contents read as changed)."""
    if not isinstance(source, ImageFolderFormat):
        return []
    passed_over = {os.path.join(source.root, rel) for rel in source.report.left_out}
    return [absolute(s.path) for s in source.report.skipped if s.location == "file" and s.path not in passed_over]


def warn_left_out(source: ForeignFormat, results: Sequence[TaskResult]) -> None:
    """One warning for the files the whole conversion left out (its tasks' reads say nothing: a forked worker
    each said its own, and the driver's files outside the class folders were said by none)."""
    if isinstance(source, ImageFolderFormat):
        source.warn_left_out([*source._listing.outside, *(rel for r in results for rel in r.left_out)])


def file_slices(files: list[str], count: int) -> list[list[str]]:
    """``files`` cut into at most ``count`` contiguous, nearly equal slices (none empty)."""
    count = max(1, min(count, len(files)))
    bounds = [round(i * len(files) / count) for i in range(count + 1)]
    return [files[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def run_task(plan: TaskPlan, index: int, files: list[str], *, source: ForeignFormat | None = None,
             wrap: Callable[[ForeignFormat, Iterator[Any]], Iterator[Any]] | None = None) -> TaskResult:
    """Read ``files`` and write them as ``part-<index>-<n>.parquet`` into the plan's staging area.

    ``source`` reads them where the caller has one already (in-process); ``wrap(source, batches)``
    may watch the batches on their way (a progress bar, read-ahead).
    """
    import unihub.formats.builtin  # noqa: F401  (registers every format; start-up cost: 0.1 s)

    files = list(files)
    if not files:
        return TaskResult(0, [], None)
    fs, staging = fsutil.resolve_filesystem(plan.staging, storage_options=plan.storage_options)
    remove_attempt(fs, staging, index)
    if source is None:
        source = task_source(plan, files)
    source.report = ReadReport()
    source.in_task = True  # the driver records and says what the whole source left out (warn_left_out)
    source.on_error = plan.on_error
    source.observe = plan.observe
    source.validate_images = plan.validate_images
    if plan.batch_bytes:
        source.batch_bytes = plan.batch_bytes
    given = plan.max_image_pixels
    with images.pixel_limit(images.MAX_IMAGE_PIXELS if given == "current" else images.pixel_limit_of(given)):
        batches = source.read_batches(plan.schema, batch_size=plan.batch_size, on_error=plan.on_error)
        if wrap is not None:
            batches = wrap(source, batches)
        try:
            result = write_parts(fs, staging, plan.schema, batches, batched=True, part_name=part_name(index),
                                 row_group_size_mb=plan.row_group_size_mb, extra_metadata=plan.extra,
                                 validate=plan.validate, part_size_mb=plan.part_size_mb)
        finally:
            getattr(batches, "close", lambda: None)()  # a failed write stops a read-ahead now
    parts = [p.rsplit("/", 1)[-1] for p in result.files]
    return TaskResult(result.num_rows, [(s.path, s.location, s.reason) for s in source.report.skipped],
                      source.report.observed, parts, list(source.report.left_out), unread_files(source))


def remove_attempt(fs: Any, staging: str, index: int) -> None:
    """Remove the part files an earlier attempt of task ``index`` left (a retried Spark task): they are
    numbered from 0 without gaps, so this looks no further than the first one missing."""
    n = 0
    while fsutil.exists(fs, path := fsutil.join(staging, part_name(index).format(n))):
        fsutil.remove(fs, path)
        n += 1


def task_source(plan: TaskPlan, files: list[str]) -> ForeignFormat:
    """The format module reading just ``files`` (an image folder keeps the labels of the whole root)."""
    fmt = FORMATS.get(plan.fmt) if isinstance(plan.fmt, str) else plan.fmt
    if plan.layout is None:
        return fmt(files, **plan.options)

    root, classes = plan.layout  # only an image folder has a layout (layout_of)
    return cast("type[ImageFolderFormat]", fmt).of_files(root, classes, files, **plan.options)
