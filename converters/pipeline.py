"""The one ingest pipeline: foreign source -> plan of file slices -> an engine runs the tasks -> one commit.

Every engine (in this process, forked workers, Spark; :mod:`unihub.converters.engines`) goes through
:func:`ingest`: the driver lists the input files and settles the schema (a single pass's provisional
one where the format has it), the engine's tasks write part files straight into a staging area beside
the target (:func:`unihub.fs.filesystem.temporary_sibling`, on the filesystem the target's URL
names), the driver refines the schema from what the tasks saw, writes ``_common_metadata`` once and
commits (:func:`unihub.fs.publish.commit`). A failure or Ctrl-C removes the staging area;
the source is only read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import urlparse

from unihub.converters.engines import Engine, engine_for, local_workers
from unihub.converters.meter import ProgressMeter
from unihub.converters.result import UNIHUB, ConvertResult, all_skipped, total_size
from unihub.converters.tasks import TaskPlan, TaskResult, absolute, driver_skips, layout_of, part_name, warn_left_out
from unihub.formats.base import ForeignFormat, OnError, SchemaOutgrown, SkippedRecord, same_storage
from unihub.fs import filesystem as fsutil
from unihub.fs import publish, remote
from unihub.images import decoders as images
from unihub.runtime.memory import DEFAULT_PART_SIZE_MB, DEFAULT_ROW_GROUP_SIZE_MB
from unihub.schema.image_checks import ValidateImages
from unihub.schema.unischema import Unischema
from unihub.store import versions
from unihub.store.dataset import list_data_files
from unihub.store.ownership import check_replaceable
from unihub.store.writer import check_part_size, check_row_group_size, finish_parts


@remote.naming_url("dst")
def ingest(source: ForeignFormat, dst: str, *, schema: Unischema | None, engine: str = "local", workers: int = 1,
           master: str = "local[2]", spark: Any = None, overwrite: bool = False,
           overwrite_foreign: bool = False, row_group_size_mb: float = DEFAULT_ROW_GROUP_SIZE_MB,
           part_size_mb: float = DEFAULT_PART_SIZE_MB, batch_size: int = 256, on_error: OnError = "raise", validate_images: ValidateImages = "header",
           progress: bool | None = None, storage_options: dict[str, Any] | None = None, append: bool = False,
           tag: str | None = None, sources: Sequence[versions.SourceFile] = ()) -> ConvertResult:
    """Convert the foreign ``source`` into the unihub dataset ``dst`` (a path or URL) with ``engine``
    (``'local'``: forked workers for ``workers`` > 1 and several files holding enough bytes to pay for
    them, else this process, as ``notes`` in the result says; ``'spark'``).
    ``schema`` is the given one (records checked against it) or None (the source's). Each task writes
    part files of at most ``part_size_mb`` (:func:`unihub.store.writer.write_parts`). ``append``: the rows
    are published as the next version of ``dst`` (``tag``, the ``sources`` they came from recorded with it:
    :func:`unihub.store.versions.commit_append`) instead of replacing it."""
    check_part_size(part_size_mb)
    check_row_group_size(row_group_size_mb)
    start = time.perf_counter()
    fs, target = fsutil.resolve_filesystem(dst, storage_options=storage_options)
    publish.settle(fs, target)  # a killed run's old dataset back in place, its temporaries removed
    if not append:
        check_replaceable(fs, target, dst, overwrite=overwrite, overwrite_foreign=overwrite_foreign)
    commit = _committer(append, tag, sources)
    files = [absolute(f) for f in source.files()]  # tasks run in other working directories
    input_bytes = total_size(files)
    notes: list[str] = []
    if engine == "local":  # forked workers only where the input pays for them
        workers, note = local_workers(workers, files, input_bytes)
        source.workers = min(source.workers, max(1, workers))
        notes += [note] if note else []
    provisional = source.provisional_schema() if schema is None else None  # single pass where the format can
    out_schema = schema or provisional or source.infer_schema()
    out_schema = source.prepare(out_schema) or out_schema  # a field more the source needs (TFRecord's order)
    provenance = {"source_format": source.format_name, "source": ",".join(source.sources), "source_files": len(files)}
    extra = {**provenance, **source.metadata()}
    # the source's options after prepare: it may have added what its tasks need (feature lists)
    plan = TaskPlan(type(source), ",".join(source.sources), dict(source.options), out_schema, extra,
                    row_group_size_mb, on_error, layout_of(source), validate=schema is not None,
                    observe=provisional is not None, validate_images=validate_images,
                    storage_options=storage_options, batch_size=batch_size, read_ahead=provisional is None,
                    batch_bytes=source.batch_bytes, max_image_pixels=images.MAX_IMAGE_PIXELS,
                    part_size_mb=part_size_mb)
    with engine_for(engine, workers=workers, files=files, master=master, spark=spark) as runner:
        try:
            rows, skipped = _run(runner, source, files, fs, dst, target, plan, progress, input_bytes, commit)
        except SchemaOutgrown as exc:  # the sample's schema did not fit: again with the whole input's
            if not plan.observe:
                raise
            full = exc.schema or source.infer_schema()
            # the metadata of every record (the sample's would miss what only later records hold)
            rows, skipped = _run(runner, source, files, fs, dst, target,
                                 replace(plan, schema=full, observe=False, extra={**provenance, **source.metadata()}),
                                 progress, input_bytes, commit)
    return ConvertResult(plan.src, dst, source.format_name, UNIHUB, rows, time.perf_counter() - start,
                         bytes_read=input_bytes, skipped=skipped, notes=notes + source.caveats())


def _committer(append: bool, tag: str | None, sources: Sequence[versions.SourceFile]) -> Callable[..., Any]:
    """How a run puts its staging area in place: replacing the target, or as its next version."""
    if not append:
        return lambda fs, staging, target, rows, unread: publish.commit(fs, staging, target)

    def commit(fs: Any, staging: str, target: str, rows: int, unread: set[str]) -> Any:
        # a file skipped whole as bad gave no rows: not recorded as converted (see tasks.unread_files)
        kept = [s for s in sources if s.path not in unread]
        return versions.commit_append(fs, staging, target, tag=tag, sources=kept, added_rows=rows)

    return commit


def _run(runner: Engine, source: ForeignFormat, files: list[str], fs: Any, dst: str, target: str, plan: TaskPlan,
         progress: bool | None, input_bytes: int, commit: Callable[..., Any]) -> tuple[int, list[SkippedRecord]]:
    """Stage, run the tasks, finish and commit; the staging area is removed on any failure."""
    staging = fsutil.temporary_sibling(target)
    plan = replace(plan, staging=_url_of(dst, staging))
    meter = ProgressMeter(enabled=progress, total_bytes=input_bytes)

    def watch(task_source: ForeignFormat, batches: Any) -> Any:
        meter.bytes_read = lambda: task_source.report.bytes_read
        return meter.count(batches)

    def task_done(result: TaskResult, part: list[str]) -> None:
        meter.advance(result.rows, total_size(part))

    try:
        fs.create_dir(staging, recursive=True)  # inside: a Ctrl-C right after it removes it too
        results = runner.run(plan, files, source=source, wrap=watch, on_done=task_done)
        rows = sum(r.rows for r in results)
        skipped = driver_skips(source) + [SkippedRecord(*s) for r in results for s in r.skipped]
        warn_left_out(source, results)
        if rows == 0 and skipped:  # never 0 rows with exit 0 from a source whose every record was bad
            raise all_skipped(skipped)
        schema, extra = plan.schema, plan.extra
        if plan.observe:
            schema = source.refine_schema([r.observed for r in results if r.observed is not None])
            if not same_storage(schema, plan.schema):
                raise SchemaOutgrown(f"the whole input needs schema {schema}, the sample gave {plan.schema}", schema)
            extra = {**extra, **source.metadata()}  # what the source knows after seeing every record
        parts = [fsutil.join(staging, name) for r in results for name in r.parts]
        _drop_strays(fs, staging, set(parts))
        changed = schema.to_json() != plan.schema.to_json() or extra != plan.extra
        # the skipped records go to _common_metadata only (footers are not rewritten for them)
        extra = {**extra, **skipped_metadata(skipped)}
        finish_parts(fs, staging, schema, extra_metadata=extra, empty=not parts,
                     empty_part=part_name(0).format(0), restamp=parts if changed else ())
        # an old target is moved aside, and back if this fails
        commit(fs, staging, target, rows, {path for r in results for path in r.unread})
    except BaseException:
        fsutil.discard(fs, staging)  # the last step: open uploads aborted, then the staging area removed
        raise
    finally:
        meter.close()
    return rows, skipped


#: skipped records listed in a dataset's ``unihub.extra`` (all are counted)
SKIPPED_LISTED = 100


def skipped_metadata(skipped: list[SkippedRecord]) -> dict[str, Any]:
    """What ``unihub.extra`` keeps of the records a conversion skipped (``unihub show`` lists them):
    their count and the first :data:`SKIPPED_LISTED`, each with file, location and reason."""
    if not skipped:
        return {}
    return {"skipped_count": len(skipped),
            "skipped": [{"path": s.path, "location": s.location, "reason": s.reason} for s in skipped[:SKIPPED_LISTED]]}


def _url_of(dst: str, staging: str) -> str:
    """The staging area as a URL the tasks resolve to the same filesystem: an absolute local path, or
    ``dst``'s scheme (and query: an endpoint may be given there) around the path on its filesystem."""
    parsed = urlparse(dst) if "://" in dst else None
    if parsed is None or parsed.scheme in ("", "file"):
        return staging
    return f"{parsed.scheme}://{staging}" + (f"?{parsed.query}" if parsed.query else "")


def _drop_strays(fs: Any, staging: str, parts: set[str]) -> None:
    """Remove data files no task reported (what a failed attempt of a Spark task left beside the retry's)."""
    for path in list_data_files(fs, staging):
        if path not in parts:
            fsutil.remove(fs, path)

