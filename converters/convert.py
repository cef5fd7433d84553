"""Whole-dataset conversion: source -> canonical (Unischema Parquet) -> sink, streaming.

``convert(src, dst)`` ingests a foreign dataset (TFRecord, HDF5, WebDataset, image folder)
into a unihub dataset, exports a unihub dataset back to a foreign format, or rewrites a
unihub dataset. Formats are detected from paths and contents unless given. Output is atomic
(each writer writes beside the target and renames on success), the source is only read.

    from unihub.converters.convert import convert
    convert("data/train-*.tfrecord", "data/train")                 # TFRecord -> unihub
    convert("data/train", "export/shards", to_format="webdataset")  # unihub -> tar shards
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow.fs as pafs

from unihub.converters.meter import ProgressMeter
from unihub.converters.readahead import read_ahead
from unihub.converters.result import UNIHUB, ConvertResult, all_skipped, total_size
from unihub.converters.tasks import absolute
from unihub.errors import (
    AppendSchemaError,
    DatasetExistsError,
    DatasetNotFoundError,
    InvalidArgumentError,
    SchemaError,
    UnsupportedFormatError,
)
from unihub.formats.base import (
    FORMATS,
    ColumnBatch,
    ForeignFormat,
    OnError,
    SkippedRecord,
    check_options,
    detect_format,
    expand_braces,
)
from unihub.fs import filesystem as fsutil
from unihub.fs import publish, remote, sources
from unihub.fs.outputs import FileSystemOutputs, LocalOutputs, Outputs, names_output_errors
from unihub.images import decoders as images
from unihub.readers.reader import make_batch_reader
from unihub.runtime.memory import (
    DEFAULT_PART_SIZE_MB,
    DEFAULT_ROW_GROUP_SIZE_MB,
    MemoryBudget,
    batch_nbytes,
    memory_budget,
    rows_for,
)
from unihub.schema.image_checks import ValidateImages, check_mode
from unihub.schema.unischema import Unischema
from unihub.store import versions
from unihub.store.dataset import open_dataset
from unihub.store.ownership import check_replaceable
from unihub.store.writer import check_part_size, check_row_group_size, write_dataset


def is_unihub_dataset(path: str) -> bool:
    """A directory holding Parquet files (or ``_common_metadata``, a manifest), or a ``.parquet`` file."""
    base = expand_braces(os.fspath(path))[0]
    if sources.is_url(base):
        return _is_remote_dataset(base)
    if os.path.isfile(base):
        return base.endswith((".parquet", ".parq", ".pq"))
    if not os.path.isdir(base):
        return "://" in base and not base.startswith("file://")
    for _root, dirs, names in os.walk(base):
        if any(n == "_common_metadata" or n.endswith(".parquet") for n in names):
            return True
        dirs[:] = [d for d in dirs if "=" in d]  # only hive partitions hold a dataset's files: not every image
    return False


def _is_remote_dataset(url: str) -> bool:
    """:func:`is_unihub_dataset` for a URL, from one listing of it (a glob is never a dataset)."""
    url = sources.without_query(url)
    if any(c in url for c in "*?["):
        return False
    if sources.isfile(url):
        return url.endswith((".parquet", ".parq", ".pq"))
    try:
        entries = sources.scandir(url)
    except FileNotFoundError:
        return False
    names = {name for name, _ in entries}
    if names & {"_common_metadata", "_unihub_manifest.json"} or any(n.endswith(".parquet") for n in names):
        return True
    return any("=" in name and is_dir and _is_remote_dataset(f"{url.rstrip('/')}/{name}") for name, is_dir in entries)


def resolve_source_format(src: str, from_format: str | None) -> str:
    """The format of ``src``: ``from_format`` when given, else unihub's own or the foreign format that
    claims it; a path that names nothing is a :class:`DatasetNotFoundError` saying so."""
    missing = _names_nothing(src)
    if missing is not None:
        raise DatasetNotFoundError(missing)
    if from_format:
        return UNIHUB if from_format in (UNIHUB, "parquet") else FORMATS.canonical(from_format)
    if is_unihub_dataset(src):
        return UNIHUB
    name = detect_format(src)
    if name is None:
        raise UnsupportedFormatError(f"{src}: cannot tell its format from the name or contents; pass --from "
                                     f"(one of: {', '.join([UNIHUB, *FORMATS.names()])})")
    return name


def _names_nothing(src: str) -> str | None:
    """Why ``src`` (paths, a brace list, globs, URLs) names nothing, or None. Every glob is listed once
    (a glob matching nothing is said so), but of the plain paths only the first is looked up: a brace list
    of thousands of objects costs no request each here, and a later missing one fails where it is read,
    naming it."""
    bare = sources.without_query(os.fspath(src))  # a URL's query holds for its bucket from now on
    for index, part in enumerate(expand_braces(bare)):
        within = f" (in {bare})" if part != bare else ""
        if any(c in part for c in "*?["):
            if not sources.glob(part):
                return f"{part}: the glob matches no file{within}"
        elif index == 0 and not sources.exists(part):
            return f"{part}: no such file or directory{within}"
    return None


def resolve_target_format(dst: str, to_format: str | None) -> str:
    if to_format:
        return UNIHUB if to_format in (UNIHUB, "parquet") else FORMATS.canonical(to_format)
    import unihub.formats.builtin  # noqa: F401  (registers every format; start-up cost: 0.1 s)

    stem, ext = os.path.splitext(dst)
    if ext.lower() in _COMPRESSED_SUFFIXES:  # x.tfrecord.gz, x.tar.gz: the format is the name's before it
        ext = os.path.splitext(stem)[1]
    name = FORMATS.by_extension(ext) if ext and ext != ".parquet" else None
    return name or UNIHUB


#: the suffixes of a compressed file's name, after the format's own (``train.tfrecord.gz``)
_COMPRESSED_SUFFIXES = (".gz", ".gzip", ".zlib")


@names_output_errors("dst")  # a full disk, a read-only destination: OutputError naming ``dst``
def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, from_format: str | None = None,
            to_format: str | None = None, schema: Unischema | str | os.PathLike[str] | None = None,
            overwrite: bool = False, overwrite_foreign: bool = False,
            row_group_size_mb: float = DEFAULT_ROW_GROUP_SIZE_MB, part_size_mb: float = DEFAULT_PART_SIZE_MB,
            batch_size: int = 256, on_error: OnError = "raise", progress: bool | None = None, format_options: Mapping[str, Any] | None = None,
            engine: str = "local", master: str = "local[2]", spark: Any = None, workers: int = 1,
            validate_images: ValidateImages = "header", max_image_pixels: int | None | str = "current",
            storage_options: Mapping[str, Any] | None = None, memory_budget_mb: float | None = None,
            append: bool = False, tag: str | None = None) -> ConvertResult:
    """Convert ``src`` to ``dst``; see the module docstring. ``schema`` is a Unischema or a JSON file.

    ``append=True`` adds the rows to the unihub dataset ``dst`` (made if missing) as its next version
    (``tag`` names it; :mod:`unihub.store.versions`). From a foreign source it is incremental: only the
    source files not yet in ``dst`` are converted (each version records its source files with size,
    modification time and SHA-256), so running the same command again converts nothing; a file converted
    before that has changed since is a :class:`~unihub.errors.SourceChangedError` before anything is
    written. ``dst`` must have been started by ``append=True`` (else nothing says which files it holds).

    ``workers`` > 1 reads a foreign source of several files in that many forked processes,
    each writing the part files of its slice of the input (0: one per core); a single
    input file, an export or a unihub source is converted in this process.

    ``validate_images`` says how a foreign source's images are checked before they are stored
    (:mod:`unihub.schema.image_checks`): ``'header'`` (header, pixel limit, the field's shape, end
    marker), ``'full'`` (also decode each one) or ``'none'``. A bad image is a FormatError naming
    the file and record, or with ``on_error='skip'`` a skipped record.

    ``max_image_pixels`` is the most pixels an image may have (:data:`unihub.images.decoders.MAX_IMAGE_PIXELS`,
    which guards against decompression bombs) for this conversion, in this process, its workers and
    Spark's executors alike: a whole number, None for no limit, or ``'current'`` (this process's setting).

    ``src`` and ``dst`` may be URLs of any filesystem pyarrow or fsspec reaches (``s3://bucket/x``);
    ``storage_options`` (fsspec's, and unihub's remote settings) hold for every file either side opens,
    in forked workers too (:mod:`unihub.fs.sources`). A foreign source converted into unihub goes
    through the one ingest pipeline (:mod:`unihub.converters.pipeline`) on the engine named (``'local'``
    or ``'spark'``, on ``master`` or the session ``spark``).

    ``memory_budget_mb`` (default ``UNIHUB_MEMORY_MB``, else 512) bounds what waits between the stages
    in bytes (:mod:`unihub.runtime.memory`): a batch ends at ``batch_size`` rows or at 1/32 of it, whichever
    comes first, and the read-ahead holds at most 1/16 of it; rows of megabytes cost no more memory
    than small ones.
    """
    limit = images.MAX_IMAGE_PIXELS if max_image_pixels == "current" else images.pixel_limit_of(max_image_pixels)
    with sources.using(storage_options), images.pixel_limit(limit):
        return _convert(os.fspath(src), os.fspath(dst), from_format=from_format, to_format=to_format, schema=schema,
                        overwrite=overwrite, overwrite_foreign=overwrite_foreign,
                        row_group_size_mb=row_group_size_mb, part_size_mb=part_size_mb, batch_size=batch_size,
                        on_error=on_error, progress=progress, format_options=format_options, engine=engine,
                        master=master, spark=spark, workers=workers, validate_images=validate_images,
                        storage_options=storage_options, memory_budget_mb=memory_budget_mb, append=append, tag=tag)


def _check_destination(src: str, dst: str, source_format: str, target_format: str, engine: str, *, append: bool,
                       overwrite: bool, overwrite_foreign: bool) -> None:
    """Refuse, before anything is read or written, a destination inside the source it would land among, an append
    to anything but a unihub dataset, and (not appending) what :func:`_check_request` refuses."""
    if source_format in (UNIHUB, target_format) or FORMATS.get(source_format).SUBFOLDERS_ARE_DATA:
        _refuse_inside_source(src, dst)
    if append and (target_format != UNIHUB or overwrite or overwrite_foreign):
        raise UnsupportedFormatError("--append (append=True) adds rows to a unihub dataset, without --overwrite; "
                                     f"not to {target_format}")
    if not append:
        _check_request(dst, source_format, target_format, engine, overwrite=overwrite,
                       overwrite_foreign=overwrite_foreign)


def _convert(src: str, dst: str, *, from_format: str | None, to_format: str | None,
             schema: Unischema | str | os.PathLike[str] | None, overwrite: bool, overwrite_foreign: bool,
             row_group_size_mb: float, part_size_mb: float, batch_size: int, on_error: OnError,
             progress: bool | None, format_options: Mapping[str, Any] | None,
             engine: str, master: str, spark: Any, workers: int, validate_images: ValidateImages,
             storage_options: Mapping[str, Any] | None, memory_budget_mb: float | None, append: bool = False,
             tag: str | None = None) -> ConvertResult:
    import unihub.formats.builtin  # noqa: F401  (registers every format; start-up cost: 0.1 s)

    _settle(src, dst)
    source_format = resolve_source_format(src, from_format)
    target_format = resolve_target_format(dst, to_format)
    workers, validate_images, budget = _run_options(engine, workers, validate_images, memory_budget_mb)
    check_row_group_size(row_group_size_mb)  # whatever the target: an export's too (NaN was taken without a word)
    check_part_size(part_size_mb)
    _check_destination(src, dst, source_format, target_format, engine, append=append, overwrite=overwrite,
                       overwrite_foreign=overwrite_foreign)
    start = time.perf_counter()
    given = load_schema(schema) if schema is not None else None
    options = dict(format_options or {})
    _check_format_options(source_format, target_format, options)
    if source_format == UNIHUB:
        batches, out_schema, extra, total_rows = unihub_batches(src, given, batch_size, budget)
        meter = ProgressMeter(enabled=progress, total_rows=total_rows)
        report = None
        input_bytes = 0
    else:
        source = FORMATS.get(source_format)(src, **options)
        fresh: list[versions.SourceFile] = []
        if append:
            new_files, fresh = _unconverted(source, dst)
            if new_files is None:
                return ConvertResult(src, dst, source_format, target_format, 0, time.perf_counter() - start,
                                     notes=["nothing new: every source file is in the dataset already"])
            source = new_files
        source.workers = workers
        source.on_error = on_error
        source.validate_images = validate_images
        source.batch_bytes = budget.batch_bytes
        if target_format == UNIHUB:  # the one ingest pipeline, whatever the engine
            from unihub.converters.pipeline import ingest  # start-up cost: 6 ms, for ingests only


            return ingest(source, dst, schema=given, engine=engine, workers=workers, master=master, spark=spark,
                          overwrite=overwrite, overwrite_foreign=overwrite_foreign,
                          row_group_size_mb=row_group_size_mb, part_size_mb=part_size_mb, batch_size=batch_size,
                          on_error=on_error, validate_images=validate_images, progress=progress,
                          storage_options=dict(storage_options) if storage_options else None,
                          append=append, tag=tag, sources=fresh)
        batches, out_schema, extra, input_bytes = _foreign_batches(source, src, source_format, given,
                                                                   batch_size=batch_size, on_error=on_error,
                                                                   budget=budget)
        report = source
        meter = ProgressMeter(enabled=progress, total_bytes=input_bytes, bytes_read=lambda: source.report.bytes_read)
    if target_format != UNIHUB:  # checked before anything is written
        write_options = _export_options(target_format, extra, out_schema, overwrite,
                                        options if source_format == UNIHUB else {})
    counted = meter.count(batches)
    if report is not None:  # every record skipped as bad: an error before anything is committed
        counted = _refuse_all_skipped(counted, meter, lambda: report.report.skipped)
    try:
        if target_format == UNIHUB:
            # a schema the source inferred from these records fits them; a given one is checked row by row
            result = write_dataset(dst, out_schema, counted, batched=True, row_group_size_mb=row_group_size_mb,
                                   part_size_mb=part_size_mb, overwrite=overwrite, overwrite_foreign=overwrite_foreign, extra_metadata=extra,
                                   validate=report is None or given is not None,
                                   mode="append" if append else "write", tag=tag)
            rows = result.num_rows
            notes = []
        else:
            _export(dst, target_format, out_schema, counted, write_options)
            rows, notes = meter.rows, FORMATS.get(target_format).export_caveats(out_schema, write_options)
    finally:
        getattr(batches, "close", lambda: None)()  # a failed write stops the source's read-ahead now
        meter.close()
    return ConvertResult(src, dst, source_format, target_format, rows, time.perf_counter() - start,
                         bytes_read=input_bytes, notes=notes,
                         skipped=list(getattr(getattr(report, "report", None), "skipped", []) or []))


def _run_options(engine: str, workers: Any, validate_images: ValidateImages,
                 memory_budget_mb: float | None) -> tuple[int, ValidateImages, MemoryBudget]:
    """The engine checked, the workers' count (0: one per core), the image check's mode and the memory budget."""
    if engine not in ("local", "spark"):
        raise UnsupportedFormatError(f"engine must be 'local' or 'spark', got {engine!r}")
    if not isinstance(workers, int) or workers < 0:
        raise SchemaError(f"workers must be a whole number >= 0 (0: one per core), got {workers!r}")
    return workers or (os.cpu_count() or 1), check_mode(validate_images), memory_budget(memory_budget_mb)


def _refuse_inside_source(src: str, dst: str) -> None:
    """Refuse a ``dst`` inside the folder ``src`` when it is written in the source's format (a unihub
    dataset, or a foreign format converted to itself), or the source is an image folder: its files would
    land among the source's own, which every later read takes for part files, shards or a class (the
    source broken, its rows doubled, or its labels renumbered)."""
    if sources.is_url(src) or sources.is_url(dst) or not os.path.isdir(src):
        return
    inner = os.path.relpath(os.path.abspath(dst), os.path.abspath(src))
    if inner != "." and inner.split(os.sep)[0] != "..":
        raise InvalidArgumentError(f"{dst} is inside the source {src}: its files would be read as the source's "
                                   "own; write it outside that folder")


def _check_request(dst: str, source_format: str, target_format: str, engine: str, *, overwrite: bool,
                   overwrite_foreign: bool) -> None:
    """Refuse, before anything is read, a conversion the engine cannot run and a ``dst`` that may not be
    replaced (an ingest checks it where it writes it)."""
    if engine == "spark" and (source_format == UNIHUB or target_format != UNIHUB):
        raise UnsupportedFormatError("--engine spark (engine='spark') converts a foreign format into unihub; "
                                     f"use the local engine for {source_format} -> {target_format}")
    if target_format != UNIHUB or source_format == UNIHUB:  # an ingest checks DST where it writes it
        fs, target = (sources.filesystem(dst) if sources.is_url(dst)
                      else (pafs.LocalFileSystem(), os.path.abspath(dst)))
        check_replaceable(fs, target, dst, overwrite=overwrite, overwrite_foreign=overwrite_foreign)


def _check_format_options(source_format: str, target_format: str, options: dict[str, Any]) -> None:
    """Refuse format options that name no one foreign format (one side must be unihub, the other not)."""
    if source_format != UNIHUB and target_format != UNIHUB and options:
        raise UnsupportedFormatError(f"format options are ambiguous between {source_format} and {target_format}; "
                                     "convert to unihub first, then export")
    if source_format == UNIHUB and target_format == UNIHUB and options:
        raise UnsupportedFormatError(f"a unihub -> unihub conversion takes no format options, got {sorted(options)}")


def _foreign_batches(source: Any, src: str, source_format: str, given: Unischema | None, *, batch_size: int,
                     on_error: OnError, budget: MemoryBudget
                     ) -> tuple[Iterator[ColumnBatch], Unischema, dict[str, Any], int]:
    """A foreign source's batches (read ahead while the writer writes), their schema (given, else inferred),
    the metadata the export keeps, and the bytes of the source's files."""
    files = source.files()
    input_bytes = total_size(files)
    out_schema = given or source.infer_schema()
    source.prepare(out_schema)
    extra = {"source_format": source_format, "source": src, **source.metadata()}
    # the source reads its next batches while the writer writes (it releases the GIL)
    batches = read_ahead(source.read_batches(out_schema, batch_size=batch_size, on_error=on_error),
                         max_bytes=budget.read_ahead_bytes)
    return batches, out_schema, extra, input_bytes


def _unconverted(source: ForeignFormat, dst: str) -> tuple[ForeignFormat | None, list[versions.SourceFile]]:
    """For ``convert --append``: a source of only the files not yet in ``dst`` (None: none), and those
    files described (:func:`unihub.store.versions.new_sources`, which refuses a changed one)."""
    fs, target = fsutil.resolve_filesystem(dst)
    converted = versions.converted_sources(fs, target)
    if not converted and versions.history(fs, target):
        raise DatasetExistsError(f"{dst}: the dataset records no source files (it was not made by convert "
                                 "--append), so the files already in it are unknown and converting them again "
                                 "would repeat their rows; start an incremental dataset with convert --append, or "
                                 "add rows with write_dataset(mode='append')")
    for pattern in source.sources:  # a process that converted before lists the sources anew (fsspec caches)
        if sources.is_url(pattern):
            fs_src, inner = sources.filesystem(pattern)
            publish.fresh(fs_src, re.split(r"[*?\[{]", inner, maxsplit=1)[0].rsplit("/", 1)[0])
    fresh = versions.new_sources([absolute(f) for f in source.files()], converted)
    if not fresh:
        return None, []
    if converted and type(source).append_conflict is not ForeignFormat.append_conflict:
        # only a format that checks (image folders' labels) pays for opening the dataset (every part's footer)
        conflict = source.append_conflict(open_dataset(dst).extra_metadata)
        if conflict:
            raise AppendSchemaError(f"{dst}: the new files of {source.where} cannot be appended: {conflict}; "
                                    "nothing was written. Convert the source into a new dataset instead")
    if len(fresh) == len(source.files()):
        return source, fresh
    return source.subset([f.path for f in fresh]), fresh


def _settle(src: str, dst: str) -> None:
    """Finish what killed runs left at ``dst`` (its old dataset back in place, their temporaries
    removed), and at ``src`` where a killed run left it missing (see :mod:`unihub.fs.atomic`); a ``dst``
    in a bucket that does not exist is refused first (:func:`unihub.fs.filesystem.check_bucket`)."""
    if sources.is_url(dst):
        fs, target = fsutil.resolve_filesystem(dst)
        fsutil.check_bucket(fs, target, dst)
    publish.settle_url(dst)
    if "://" not in src and not os.path.lexists(src):
        publish.settle_url(src)


def _refuse_all_skipped(batches: Iterator[ColumnBatch], meter: ProgressMeter,
                        skipped: Callable[[], list[SkippedRecord]]) -> Iterator[ColumnBatch]:
    """``batches``, raising at their end when none had a row and records were skipped (never 0 rows
    with exit 0 from a source whose every record was bad)."""
    yield from batches
    if meter.rows == 0 and skipped():
        raise all_skipped(list(skipped()))


def _export(dst: str, target_format: str, schema: Unischema, batches: Iterator[ColumnBatch],
            options: dict[str, Any]) -> None:
    """Write the export into a hidden place beside ``dst`` (a directory, or a prefix on an object store)
    and put it in place at the end (:func:`unihub.fs.publish.commit`), whatever the format writes
    (one file or many shards): an error or Ctrl-C leaves neither a partial ``dst`` nor the staged files,
    and an overwrite replaces every old shard. The writers stream into it through
    :class:`~unihub.fs.outputs.Outputs`, so an export to a URL writes nothing locally (HDF5 aside,
    which h5py needs as a local file: see ``HDF5Format.write``)."""
    import posixpath

    if not sources.is_url(dst):
        target = os.path.abspath(dst)
        holder = fsutil.temporary_sibling(target)
        try:
            os.makedirs(holder)  # inside: a Ctrl-C right after it removes it too
            written = os.path.join(holder, os.path.basename(target))  # the same name: formats go by its extension
            FORMATS.get(target_format).write(LocalOutputs(written), schema, batches, **options)
            publish.commit(pafs.LocalFileSystem(), written, target)
        finally:
            shutil.rmtree(holder, ignore_errors=True)
        return
    fs, target = fsutil.resolve_filesystem(dst)
    target = target.rstrip("/")
    holder = fsutil.temporary_sibling(target)
    written = fsutil.join(holder, posixpath.basename(target))
    outputs: Outputs = FileSystemOutputs(fs, written)
    try:
        with remote.remote_errors(dst):
            FORMATS.get(target_format).write(outputs, schema, batches, **options)
            publish.commit(fs, written, target)
    except BaseException:
        _remove_quietly(fs, holder)  # the export's own error is the one to report, not a failed clean-up's
        raise
    with remote.remote_errors(dst):
        fsutil.remove(fs, holder)  # what the commit's copies leave of it (empty directories)


def _remove_quietly(fs: Any, path: str) -> None:
    try:
        fsutil.discard(fs, path)  # uploads left open by the export aborted first
    except Exception:  # noqa: BLE001 (a server that failed the export may fail this too)
        pass


def _export_options(target_format: str, extra: Mapping[str, Any], schema: Unischema, overwrite: bool,
                    given: Mapping[str, Any]) -> dict[str, Any]:
    """The sink's write options: what the source's metadata implies (class names, a TFRecord
    payload kind), then the options the user gave (checked: a format never ignores one)."""
    import inspect

    sink = FORMATS.get(target_format)
    check_options(sink, given, writing=True)
    options: dict[str, Any] = {**sink.export_options(extra, schema), **given}
    if "overwrite" in inspect.signature(sink.write).parameters:
        options["overwrite"] = overwrite
    return options


def unihub_batches(src: str, given: Unischema | None, batch_size: int, budget: MemoryBudget | None = None):
    """Column batches of a unihub dataset, images as their stored bytes, in storage order: row groups
    read within ``budget``, cut into batches of at most ``batch_size`` rows and about
    ``budget.batch_bytes`` (slices: no copy), so that an export converts a little at a time."""
    budget = budget or memory_budget()
    store = open_dataset(src)
    schema = given or store.schema
    extra = dict(store.extra_metadata)

    def batches() -> Iterator[ColumnBatch]:
        if store.num_rows == 0:  # an empty dataset exports (and verifies) as empty
            return
        # An export's Python encoding is far slower than reading Parquet: one worker reads ahead, within
        # the read-ahead's share of the budget; row groups bigger than a batch are read when needed, so
        # that one is held at a time, not two
        big = store.total_bytes > budget.batch_bytes * max(1, len(store.row_groups))
        with make_batch_reader(store, schema_fields=list(schema.fields), shuffle_row_groups=False,
                               decode_images=False, workers_count=1, reader_pool_type="dummy" if big else "thread",
                               petastorm_types=False, memory_budget_mb=4 * budget.read_ahead_bytes / 2**20) as reader:
            names = list(reader.schema.fields)  # field names need not be identifiers (``image.png``)
            for batch in reader:
                columns = dict(zip(names, batch))
                rows = len(batch[0]) if len(batch) else 0
                step = rows_for(batch_size, budget.batch_bytes, batch_nbytes(columns) / max(1, rows))
                if step >= rows:
                    yield columns
                else:
                    for start in range(0, rows, step):
                        yield {name: values[start:start + step] for name, values in columns.items()}
                del batch, columns  # the row group goes before the next is read

    return batches(), schema, extra, store.num_rows


def load_schema(schema: Unischema | str | os.PathLike[str]) -> Unischema:
    """A Unischema, or one read from a JSON file (``Unischema.to_json()`` output)."""
    if isinstance(schema, Unischema):
        return schema
    path = os.fspath(schema)
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise SchemaError(f"cannot read schema file {path}: {exc}") from exc
    try:
        return Unischema.from_json(text)
    except (SchemaError, ValueError) as exc:
        raise SchemaError(f"schema file {path}: {exc}") from exc
