"""The ``unihub`` command line: a thin layer over the library, one subcommand per function (``unihub.cli.main``).

Examples::

    unihub inspect /data/train            # schema, rows, files, row groups, bytes
    unihub inspect /data/train --json     # the same as JSON
    unihub show /data/train --open        # one HTML page: sampled images, statistics, provenance
    unihub demo /tmp/unihub-demo          # the main job: write, convert TFRecord + images, inspect, train
    unihub convert 'train-*.tfrecord' /data/train          # TFRecord -> unihub (format detected)
    unihub convert 'raw/*.tfrecord' /data/train --append   # only the files not converted yet, a new version
    unihub inspect /data/train --versions                  # the versions; unihub vacuum /data/train --keep 10
    unihub convert /data/train shards/ --to webdataset     # unihub -> WebDataset tar shards
    unihub verify /data/images /data/train                 # exit 0 only when equal
    unihub copy /data/train /data/small --field-regex 'id' 'image.*' --not-null-fields label
    unihub add-schema /data/spark_out --schema schema.json --petastorm-compatible
    unihub throughput /data/train --field-regex image label -w 4 -n 2000
    unihub COMMAND --help                  # each command's options and examples
    eval "$(unihub completion bash)"       # complete commands, options and formats (pip install 'unihub[cli]')

A :class:`~unihub.errors.UnihubError` prints as one line and exits 1 (``--verbose`` shows the
traceback); usage errors exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from unihub.bridges.throughput import ReadMethod, WorkerPoolType, reader_throughput
from unihub.cli.cache import add_cache_commands
from unihub.cli.columns import add_columns_commands
from unihub.cli.completion import add_completion_command, autocomplete
from unihub.cli.main_job import run
from unihub.cli.parsers import DATASET, DATASET_OR_FILE, JSON, QUIET, STORAGE_OPTION, TAG, Arg, add_command, arg, one_of
from unihub.cli.storage import storage_options_of
from unihub.cli.versions import add_compact_command, add_delete_command, add_vacuum_command, print_versions
from unihub.converters.add_schema import add_schema
from unihub.converters.convert import convert, resolve_source_format, resolve_target_format
from unihub.converters.copy import copy_dataset
from unihub.converters.engines import spark
from unihub.converters.engines.spark import parse_stall_timeout
from unihub.converters.meter import ProgressMeter
from unihub.converters.result import UNIHUB
from unihub.converters.verify import verify
from unihub.errors import SchemaMismatchError, UnihubError
from unihub.formats.base import FORMATS, parse_options
from unihub.fs import sources
from unihub.fs.outputs import DISK_ERRORS, output_error, path_of
from unihub.runtime import interrupts
from unihub.runtime.memory import DEFAULT_PART_SIZE_MB, DEFAULT_ROW_GROUP_SIZE_MB
from unihub.runtime.progress import Display, open_display, should_show
from unihub.schema.image_checks import VALIDATE_IMAGES
from unihub.version import package_version
from unihub.viewer import DEFAULT_REPORT, show
from unihub.viewer.describe import describe_dataset, format_description


def cmd_inspect(args: argparse.Namespace) -> int:
    if args.versions:
        return print_versions(args.path, args.json, storage_options_of(args))
    info = describe_dataset(args.path)
    print(json.dumps(info, indent=2) if args.json else format_description(info))
    if info.get("missing_fields"):  # described, and refused as make_reader refuses it
        raise SchemaMismatchError(info["schema_problem"])
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    out = args.out or DEFAULT_REPORT
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):  # before the pass over the dataset, not after
        raise UnihubError(f"cannot write {out}: {folder} is not a directory")

    display: Display | None = None
    state = (0, 0, "")

    def progress(done: int, total: int) -> None:  # the pass over the row groups, on a terminal
        nonlocal display, state
        if display is None:
            display = open_display(sys.stderr, unit="row group", total=total)
        state = (done, total, f"{done:,}/{total:,} row groups read")
        display.show(*state)

    try:
        report = show(args.path, rows=args.rows, seed=args.seed, first=args.first, where=args.where,
                      storage_options=storage_options_of(args),
                      progress=progress if should_show(False if args.quiet else None, sys.stderr) else None)
    finally:
        if display is not None:
            display.close(*state)
    report.save(out)
    if not args.quiet:
        print(f"wrote {out}: {report.report.description['rows']:,} rows, {len(report.report.sample)} shown",
              file=sys.stderr)
    if args.open:
        import pathlib
        import webbrowser

        webbrowser.open(pathlib.Path(out).resolve().as_uri())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    run(args.path, rows=args.rows, steps=args.steps, say=lambda line: print(line, flush=True))
    return 0


def _pixel_limit(text: str) -> int | None:
    """``--max-image-pixels``: a whole number >= 1, or 'none' for no limit."""
    if text.strip().lower() == "none":
        return None
    try:
        value = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of pixels or 'none', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of pixels >= 1 or 'none', got {text!r}")
    return value


def _format_options(args: argparse.Namespace, *, verifying: bool = False) -> dict[str, Any]:
    """``--option KEY=VALUE`` pairs, typed by the format they are for: the foreign source's reading
    options, or for an export (and for verify, the foreign side's) the target's."""
    if not args.option:
        return {}

    source = resolve_source_format(args.src, args.from_format)
    if verifying:
        target = resolve_source_format(args.dst, args.to_format)
        name, writing = (source if source != UNIHUB else target), False
    else:
        target = resolve_target_format(args.dst, args.to_format)
        name, writing = (source, False) if source != UNIHUB else (target, True)
    if name == UNIHUB or (not verifying and source != UNIHUB and target != UNIHUB):
        raise UnihubError(f"--option is for a foreign format's reading or writing; {source} -> {target} "
                          "has none to give it to" if name == UNIHUB else
                          "--option would be ambiguous between two foreign formats: convert to unihub first")
    return parse_options(FORMATS.get(name), args.option, writing=writing)


def _with_follow_links(options: dict[str, Any], follow: bool) -> dict[str, Any]:
    """``--follow-links`` as the image folder's ``follow_links`` option (other formats have no links to follow)."""
    return {**options, "follow_links": True} if follow else options


def cmd_convert(args: argparse.Namespace) -> int:
    with sources.using(storage_options_of(args)):
        return _cmd_convert(args)


@contextmanager
def _spark_console(args: argparse.Namespace) -> Iterator[None]:
    """For ``--engine spark``: the stall timeout given, and Spark's own output in a log file unless
    ``--verbose``, named on a line of its own when the command fails (see ``engines.spark.console``)."""
    if args.engine != "spark":
        yield
        return

    previous = os.environ.get(spark.STALL_TIMEOUT_ENV)
    if args.spark_stall_timeout is not None:
        os.environ[spark.STALL_TIMEOUT_ENV] = args.spark_stall_timeout
    try:
        with spark.console(args.verbose) as log:
            try:
                yield
            except BaseException:
                if log is not None and os.path.exists(log):
                    print(f"unihub: Spark's log: {log}", file=sys.stderr)
                raise
    finally:
        if args.spark_stall_timeout is not None:
            if previous is None:
                os.environ.pop(spark.STALL_TIMEOUT_ENV, None)
            else:
                os.environ[spark.STALL_TIMEOUT_ENV] = previous


def _cmd_convert(args: argparse.Namespace) -> int:
    with _spark_console(args):
        result = convert(args.src, args.dst, from_format=args.from_format, to_format=args.to_format,
                         schema=args.schema, overwrite=args.overwrite,
                         overwrite_foreign=args.overwrite_foreign, row_group_size_mb=args.row_group_size_mb,
                         part_size_mb=args.part_size_mb, on_error="skip" if args.skip_corrupt else "raise",
                         progress=False if args.quiet else None,
                         engine=args.engine, master=args.master, workers=args.workers,
                         format_options=_with_follow_links(_format_options(args), args.follow_links),
                         validate_images=args.validate_images,
                         max_image_pixels=getattr(args, "max_image_pixels", "current"),
                         storage_options=storage_options_of(args), append=args.append, tag=args.tag)
    if not args.quiet:
        print(result.summary(), file=sys.stderr)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    with sources.using(storage_options_of(args)):
        report = verify(args.src, args.dst, from_format=args.from_format, to_format=args.to_format,
                        max_differences=args.max_differences, options=_format_options(args, verifying=True),
                        storage_options=storage_options_of(args))
    print(report.summary())
    return 0 if report.equal else 1


def cmd_copy(args: argparse.Namespace) -> int:
    meter = ProgressMeter(enabled=False if args.quiet else None)

    def progress(rows: int, total: int) -> None:
        meter.total_rows = total
        meter.advance(rows - meter.rows, 0)

    try:
        with _spark_console(args):
            result = copy_dataset(None, args.src, args.dst, args.field_regex, args.not_null_fields, args.overwrite,
                                  args.partition_count, args.row_group_size_mb,
                                  petastorm_compatible=args.petastorm_compatible, engine=args.engine,
                                  master=args.master, overwrite_foreign=args.overwrite_foreign, progress=progress)
    finally:
        meter.close()
    if not args.quiet:
        print(result.summary(), file=sys.stderr)
    return 0


def cmd_add_schema(args: argparse.Namespace) -> int:
    unischema_class = args.unischema_class
    if unischema_class is not None and "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # 'module.attr' in the current directory, as with python -m
    result = add_schema(args.url, args.schema, unischema_class=unischema_class,
                        petastorm_compatible=args.petastorm_compatible, use_summary_metadata=args.use_summary_metadata)
    print(result.summary())
    return 0


def cmd_throughput(args: argparse.Namespace) -> int:
    if not args.quiet:
        fields = " ".join(args.field_regex) if args.field_regex else "all fields"
        print(f"reading {args.url} ({fields}) with {args.workers_count} {args.pool_type} worker(s), "
              f"{args.read_method}: {args.warmup_cycles:,} warmup rows, then {args.measure_cycles:,} measured",
              file=sys.stderr, flush=True)
    result = reader_throughput(args.url, args.field_regex, warmup_cycles_count=args.warmup_cycles,
                               measure_cycles_count=args.measure_cycles, pool_type=args.pool_type,
                               loaders_count=args.workers_count, profile_threads=args.profile_threads,
                               read_method=args.read_method, shuffling_queue_size=args.shuffling_queue_size,
                               min_after_dequeue=args.min_after_dequeue or int(0.8 * args.shuffling_queue_size),
                               spawn_new_process=not args.in_process, progress=not args.quiet,
                               reader_extra_args=_throughput_reader_args(args))
    if args.json:
        print(json.dumps({"url": args.url, "time_mean": result.time_mean,
                          "samples_per_second": result.samples_per_second,
                          "memory_info": result.memory_info._asdict(), "cpu": result.cpu,
                          **({"cache": result.cache_stats} if result.cache_stats else {})}, indent=2))
    else:  # Petastorm's result line, word for word
        print(f"Average sample read rate: {result.samples_per_second:1.2f} samples/sec; "
              f"RAM {result.memory_info.rss / 2 ** 20:1.2f} MB (rss); CPU {result.cpu:1.2f}%")
        if result.cache_stats:
            print(cache_lines(result.cache_stats))
    return 0


def _throughput_reader_args(args: argparse.Namespace) -> dict[str, Any]:
    """``make_reader`` arguments of ``unihub throughput``'s ``--cache-location`` and ``--storage-option``."""
    extra: dict[str, Any] = {}
    if args.storage_option:
        extra["storage_options"] = storage_options_of(args)
    if args.cache_location:
        extra.update(cache_type="local-disk", cache_location=args.cache_location,
                     cache_size_limit=int(args.cache_size_limit_mb * 2**20),
                     cache_extra_settings={"cleanup": False})  # kept for the other ranks and the next run
    return extra


def cache_lines(stats: dict[str, Any]) -> str:
    """Two lines on a local-disk cache: what this run did, and what every process on this node did."""
    reader, node = stats["reader"], stats["node"]

    def counts(c: dict[str, int]) -> str:
        return (f"{c['hits']:,} hits ({c['waits']:,} after waiting for another's fetch), {c['misses']:,} misses, "
                f"{c['fetches']:,} row groups fetched ({c['bytes_fetched'] / 2**20:,.1f} MB), "
                f"{c['bytes_served'] / 2**20:,.1f} MB served from the cache, {c['evictions']:,} evicted")

    return (f"Cache {stats['location']}: this run {counts(reader)}\n"
            f"  node (every process using it): {counts(node)}; holds {node['entries']:,} entries, "
            f"{node['bytes'] / 2**20:,.1f} of {node['size_limit_bytes'] / 2**20:,.1f} MB")


def _add_inspect_command(sub: Any) -> None:
    add_command(sub, "inspect", cmd_inspect, DATASET_OR_FILE, JSON,
                arg("--versions", action="store_true", help="list the dataset's versions (number, time, operation, "
                    "files, rows added, tag) instead"), STORAGE_OPTION,
                help="show a dataset's schema, rows, files, row groups and bytes",
                description="Show a dataset's schema (field, dtype, shape, codec, nullable), rows, files, row groups "
                            "and bytes.",
                examples=["unihub inspect /data/train",
                          "unihub inspect /data/train --json > schema.json   # a --schema file for convert",
                          "unihub inspect s3://bucket/train --storage-option endpoint_url=http://host:9000"])


def _add_show_command(sub: Any) -> None:
    """``show``: one self-contained HTML page of a dataset (see :mod:`unihub.viewer`)."""
    add_command(sub, "show", cmd_show, DATASET_OR_FILE,
                arg("--rows", type=int, default=16, metavar="N", help="rows to show (default 16)"),
                one_of(arg("--seed", type=int, default=0, help="seed of the random sample (default 0)"),
                       arg("--first", action="store_true", help="show the first N rows instead of a random sample")),
                arg("--where", metavar="EXPR",
                    help="only rows matching this filter, in pyarrow's expression syntax (label >= 3 and "
                         "pc.field('split') == 'train') or filters='s DNF as JSON; the statistics cover them too"),
                arg("--out", metavar="FILE", help="the HTML file to write (default report.html; replaced)"),
                arg("--open", action="store_true", help="open the page in the platform's browser"),
                QUIET.changed(help="no progress bar or summary line"), STORAGE_OPTION,
                help="write one self-contained HTML page of a dataset: schema, counts, provenance, sampled images, "
                     "statistics",
                description="Write one HTML file (no network needed to open it) with the schema and codecs; rows, "
                            "files, row groups, bytes and row-group sizes; the conversion's provenance (source, "
                            "skipped records); a grid of sampled rows with image thumbnails; and per-field statistics "
                            "over every row (or those matching --where), read one row group at a time.",
                examples=["unihub show /data/train                                   # report.html",
                          "unihub show /data/train --rows 48 --seed 7 --out train.html --open",
                          "unihub show /data/train --first --where 'label == 3 and split != \"test\"'",
                          "unihub show /data/train --where '[[\"label\", \"in\", [1, 2]]]'   # DNF, as filters=",
                          "unihub show s3://bucket/train --storage-option client_kwargs.endpoint_url=http://host:9000"])


def _add_demo_command(sub: Any) -> None:
    add_command(sub, "demo", cmd_demo,
                arg("path", nargs="?", default="unihub-demo", help="where to write (replaced if present)"),
                arg("--rows", type=int, default=2000, help="rows of each dataset (default 2000)"),
                arg("--steps", type=int, default=60, help="training steps of batch 64 (default 60)"),
                help="the main job on generated data: write, convert, inspect, train",
                description="Write a dataset with images, tensors and scalars; generate TFRecord shards and an image "
                            "folder and convert them; inspect all three; read them with the PyTorch loaders and train "
                            "a tiny model for a few steps; print throughput.",
                examples=["unihub demo /tmp/unihub-demo",
                          "unihub demo /tmp/unihub-demo --rows 500 --steps 10   # a quicker run"])


def _add_convert_command(sub: Any) -> None:
    formats = _format_names()
    add_command(sub, "convert", cmd_convert, arg("src", help="source files, directory, glob or brace pattern"),
                arg("dst", help="target path"),
                arg("--from", dest="from_format", choices=formats, help="source format (default: detected)"),
                arg("--to", dest="to_format", choices=formats,
                    help="target format (default: from DST's extension, else unihub)"),
                arg("--schema", help="a Unischema JSON file to use instead of the inferred schema"),
                arg("--overwrite", action="store_true", help="replace DST if it exists and unihub wrote it (a unihub "
                    "dataset, an HDF5 export); anything else is refused"),
                arg("--append", action="store_true", help="add the rows to DST (made if missing) as its next version; "
                    "from a foreign source only the files not converted before (a changed one is an error)"),
                TAG.changed(help="with --append: a name for the version it makes (make_reader(tag=...))"),
                arg("--overwrite-foreign", action="store_true", help="replace DST whatever it is (a file or folder "
                    "unihub did not write, such as another tool's TFRecord shards)"),
                arg("--row-group-size-mb", type=float, default=DEFAULT_ROW_GROUP_SIZE_MB,
                    help="Parquet row-group size (default %(default)g)"),
                arg("--part-size-mb", type=float, default=DEFAULT_PART_SIZE_MB,
                    help="most megabytes of one Parquet part file (default %(default)g)"),
                arg("--skip-corrupt", action="store_true", help="skip bad records, count and list them"),
                arg("--validate-images", choices=VALIDATE_IMAGES, default="header",
                    help="check each source image before storing it: header (default: header, pixel limit, shape, "
                         "end marker), full (also decode it) or none"),
                arg("--max-image-pixels", type=_pixel_limit, default=argparse.SUPPRESS, metavar="N|none",
                    help="the most pixels (width x height) an image may have: more is refused as a likely "
                         "decompression bomb (default 178,956,970, Pillow's; 'none': no limit)"),
                QUIET,
                arg("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="a format option (repeatable), e.g. --option compression=gzip; listed below"),
                arg("--follow-links", action="store_true",
                    help="image folders: follow symbolic links out of the folder and into folders, as tar -h does "
                         "(never into a loop); by default only links to files inside it are read"),
                arg("--workers", type=int, default=1,
                    help="processes reading the input files in parallel (default 1; 0: one per core)"),
                *_engine_options("run in this process (local) or as Spark tasks, one or more input files each"),
                STORAGE_OPTION,
                help="convert a dataset between TFRecord, HDF5, WebDataset, image folders and unihub Parquet",
                description="Convert SRC to DST, streaming; the output is written beside DST and renamed on success.",
                examples=_CONVERT_EXAMPLES, notes=_options_help())


def _add_verify_command(sub: Any) -> None:
    formats = _format_names()
    add_command(sub, "verify", cmd_verify, arg("src"), arg("dst"),
                arg("--from", dest="from_format", choices=formats, help="SRC's format (default: detected)"),
                arg("--to", dest="to_format", choices=formats, help="DST's format (default: detected)"),
                arg("--max-differences", type=int, default=10, help="differences to report (default 10)"),
                arg("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="a reading option of the foreign side (repeatable), as for convert"),
                STORAGE_OPTION,
                help="compare two datasets row by row; exit 0 only when equal",
                description="Compare SRC and DST row by row (values, shapes, dtypes; images as bytes).",
                examples=["unihub verify train-00000.tfrecord /data/train   # against TensorFlow's own reading",
                          "unihub verify shards/ /data/train --max-differences 50",
                          "unihub verify data.h5 /data/train --option layout=groups"])


def _petastorm_compatible(default_when: str) -> Arg:
    """``--petastorm-compatible`` of copy and add-schema: by default, when ``default_when`` has Petastorm's metadata."""
    return arg("--petastorm-compatible", action=argparse.BooleanOptionalAction, default=None,
               help=f"also write the metadata Petastorm 0.13.1 reads (default: when {default_when} has Petastorm's)")


def _add_copy_command(sub: Any) -> None:
    """``copy``, one of Petastorm's three command-line tools (petastorm-copy-dataset.py)."""
    add_command(sub, "copy", cmd_copy, arg("src", help="source dataset (unihub, Petastorm or plain Parquet)"),
                arg("dst", help="target dataset directory"),
                arg("--field-regex", nargs="+", metavar="REGEX",
                    help="copy only the fields whose names fully match one of these (names or regexes)"),
                arg("--not-null-fields", nargs="+", metavar="FIELD", help="drop the rows where any of these fields "
                    "is null"),
                arg("--partition-count", "--partitions-count", type=int, metavar="N",
                    help="write N files of equal rows (default: one per source file, partitions kept)"),
                arg("--row-group-size-mb", type=float,
                    help=f"Parquet row-group size (default {DEFAULT_ROW_GROUP_SIZE_MB:g})"),
                arg("--overwrite", "--overwrite-output", action="store_true",
                    help="replace DST if it exists and is a dataset unihub wrote"),
                arg("--overwrite-foreign", action="store_true", help="replace DST whatever it is"),
                _petastorm_compatible("SRC"),
                *_engine_options("copy in this process (local) or as Spark tasks, one per source file or partition"),
                QUIET,
                help="copy a dataset, keeping some fields and dropping rows with nulls (petastorm-copy-dataset.py)",
                description="Copy SRC to DST as stored (nothing decoded), in order; the copy is written beside DST "
                            "and renamed on success.",
                examples=["unihub copy /data/train /data/small --field-regex id 'image.*' --not-null-fields label",
                          "unihub copy /data/train /data/train4 --partition-count 4 --row-group-size-mb 64",
                          "unihub copy /data/train /data/copy --engine spark --master spark://host:7077"])


def _add_add_schema_command(sub: Any) -> None:
    """``add-schema``, one of Petastorm's three command-line tools (petastorm-generate-metadata.py)."""
    add_command(sub, "add-schema", cmd_add_schema, DATASET.changed("url"),
                one_of(arg("--schema", metavar="FILE", help="a Unischema JSON file (as unihub inspect --json writes)"),
                       arg("--unischema-class", "--unischema_class", metavar="MODULE.ATTR",
                           help="an importable unihub or Petastorm Unischema, e.g. my_pkg.schemas.TrainSchema")),
                _petastorm_compatible("the store"),
                arg("--use-summary-metadata", action="store_true",
                    help="also write _metadata with every file's row groups"),
                help="write a Unischema into an existing Parquet store (petastorm-generate-metadata.py)",
                description="Write a Unischema into URL's _common_metadata (atomically; data files are not touched): "
                            "the one given, else the one the store has, else one inferred from the Parquet types. It "
                            "must match the store's columns.",
                examples=["unihub add-schema /data/spark_out                      # inferred",
                          "unihub add-schema /data/spark_out --schema schema.json",
                          "unihub add-schema /data/spark_out --unischema-class my_pkg.schemas.TrainSchema",
                          "unihub add-schema /data/train --petastorm-compatible   # for Petastorm readers too"])


def _add_throughput_command(sub: Any) -> None:
    """``throughput``, one of Petastorm's three command-line tools (petastorm-throughput.py)."""
    add_command(sub, "throughput", cmd_throughput, DATASET.changed("url"),
                arg("--field-regex", nargs="+", metavar="REGEX", help="read only these fields (names or regexes)"),
                arg("-w", "--workers-count", type=int, default=3, help="reader workers (default 3)"),
                arg("-p", "--pool-type", "--reader-pool-type", choices=[str(t) for t in WorkerPoolType],
                    default="thread", help="the reader's worker pool (default thread)"),
                arg("-m", "--warmup-cycles", type=int, default=200, help="rows read before timing (default 200)"),
                arg("-n", "--measure-cycles", type=int, default=1000, help="rows timed (default 1000)"),
                arg("--profile-threads", action="store_true", help="accepted for Petastorm's CLI; no effect"),
                arg("-d", "--read-method", choices=[str(m) for m in ReadMethod], default="python",
                    help="python: next(reader); tf: through make_petastorm_dataset (default python)"),
                arg("-q", "--shuffling-queue-size", type=int, default=500,
                    help="tf: rows in the tf.data shuffle buffer (default 500)"),
                arg("--min-after-dequeue", type=int, help="accepted for Petastorm's CLI; tf.data has no such setting"),
                arg("--in-process", action="store_true",
                    help="measure in this process (default: a fresh one, so memory is the reader's alone)"),
                arg("--cache-location", metavar="DIR",
                    help="read through a local-disk cache in DIR (shared by every process that names it: each row "
                         "group is fetched once per node; kept afterwards) and print its hits, misses and bytes, "
                         "this run's and the node's"),
                arg("--cache-size-limit-mb", type=float, default=10240.0,
                    help="the cache's size limit, least recently used entries evicted (default 10240)"),
                STORAGE_OPTION, JSON.changed(help="print the result as JSON"), QUIET.changed(help="no progress line"),
                help="measure a reader's rows per second (petastorm-throughput.py)",
                description="Read URL with make_reader (num_epochs=None) and time one row per cycle after the warmup "
                            "cycles; prints Petastorm's result line (or --json) and a progress line on stderr.",
                examples=["unihub throughput /data/train",
                          "unihub throughput /data/train --field-regex 'image.*' label -w 8 -p process",
                          "unihub throughput /data/train -m 100 -n 5000 --read-method tf --json",
                          "unihub throughput s3://bucket/train --cache-location /tmp/train-cache"])


def _format_names() -> list[str]:
    import unihub.formats.builtin  # noqa: F401  (registers every format; start-up cost: 0.1 s)

    return ["unihub", "parquet", *FORMATS.names()]


def _options_help() -> str:
    """Every format's options, for ``unihub convert --help``."""
    import unihub.formats.builtin  # noqa: F401  (registers every format; start-up cost: 0.1 s)

    lines = ["format options (--option KEY=VALUE, repeatable; reading options when the format is the source,",
             "writing options when it is the target):"]
    for name in FORMATS:
        fmt = FORMATS.get(name)
        for title, declared in (("reading", fmt.OPTIONS), ("writing", fmt.WRITE_OPTIONS)):
            if declared:
                lines.append(f"  {name}, {title}:")
                lines.extend(f"    {key:<18} {option.help}" for key, option in declared.items())
    return "\n".join(lines)


_CONVERT_EXAMPLES = (
    "unihub convert 'data/train-{0000..0099}.tfrecord' /data/train    # TFRecord -> unihub (format detected)",
    "unihub convert data/h5/train.h5 /data/train --overwrite           # HDF5",
    "unihub convert 'shards/shard-{00000..00009}.tar' /data/train      # WebDataset tar shards",
    "unihub convert images/ /data/train --skip-corrupt                 # root/<class>/<file>.png|jpg",
    "unihub convert /data/train export/ --to webdataset                # and back",
    "unihub convert 'tfrecords/*.tfrecord' /data/train --workers 0     # one process per core",
    "unihub convert 'gz/*.tfrecord' /data/train --option compression=gzip    # GZIP-compressed TFRecord",
    "unihub convert 'tfrecords/*.tfrecord' /data/train --engine spark --master spark://host:7077",
)


def _top_examples() -> str:
    """The examples of this module's docstring, as ``unihub --help`` shows them."""
    import textwrap

    block = (__doc__ or "").split("Examples::\n\n", 1)[-1].split("\n\n", 1)[0]
    return "examples:\n" + textwrap.indent(textwrap.dedent(block), "  ")


#: each subcommand's registration, in the order ``unihub --help`` lists them
_COMMANDS = (add_cache_commands, add_columns_commands, add_completion_command, _add_inspect_command,
             _add_show_command, _add_demo_command, _add_convert_command, _add_verify_command, _add_copy_command,
             _add_add_schema_command, _add_throughput_command, add_vacuum_command, add_delete_command,
             add_compact_command)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="unihub", description=__doc__.split("\n\n")[0],
                                     epilog=_top_examples(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verbose", action="store_true", help="show tracebacks of errors (also after the command)")
    parser.add_argument("--version", action="version", version=f"unihub {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add_commands in _COMMANDS:
        add_commands(sub)
    return parser


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush does not fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (captured): nothing to flush into a closed pipe
        pass


def _one_line_warnings(verbose: bool) -> Any:
    """Warnings printed as ``unihub: warning: ...`` lines (with ``--verbose``, Python's usual form with the
    source line); only their format changes, so a caller's recorder (pytest, a notebook) still gets them.
    Returns the previous ``warnings.formatwarning`` to restore."""
    import warnings

    previous = warnings.formatwarning
    if not verbose:
        def one_line(message: Any, category: Any, filename: str, lineno: int, line: Any = None) -> str:
            return f"unihub: warning: {message}\n"

        warnings.formatwarning = one_line
    return previous


def _accept_verbose_after_the_command(parser: argparse.ArgumentParser) -> None:
    """``unihub convert A B --verbose`` as well as ``unihub --verbose convert A B``."""
    for action in parser._subparsers._group_actions if parser._subparsers else []:  # noqa: SLF001
        for sub in getattr(action, "choices", {}).values():
            sub.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                             help="show tracebacks of errors")


def _engine_options(engine_help: str) -> tuple[Arg, ...]:
    """``--engine``, ``--master`` and ``--spark-stall-timeout``, as convert and copy take them."""
    return (arg("--engine", choices=("local", "spark"), default="local", help=engine_help),
            arg("--master", default="local[2]",
                help="Spark master URL for --engine spark (default local[2]; a running session is reused)"),
            arg("--spark-stall-timeout", metavar="SECONDS", type=_stall_seconds,
                help="give up when no Spark task has run for this long: the cluster lost its workers or has no free "
                     "cores (default 120, or UNIHUB_SPARK_STALL_TIMEOUT; 0: never)"))


def _stall_seconds(text: str) -> str:
    """``--spark-stall-timeout``, checked as the engine checks ``UNIHUB_SPARK_STALL_TIMEOUT``."""
    try:
        parse_stall_timeout(text, "--spark-stall-timeout")
    except UnihubError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``unihub`` console script."""
    import warnings

    parser = build_parser()
    _accept_verbose_after_the_command(parser)
    autocomplete(parser)  # answers the shell and exits, when the shell is asking
    args, extra = parser.parse_known_args(argv)
    if extra:
        _refuse_extra_arguments(parser, args, extra, argv)
    previous = _one_line_warnings(args.verbose)
    try:
        with interrupts.raised():  # Ctrl-C and SIGTERM unwind the command, which removes what it staged
            return _run(args)
    except KeyboardInterrupt as stop:  # one landing between _run's own lines
        print(interrupts.last_line(stop), file=sys.stderr)
        return interrupts.exit_code(stop)
    finally:
        warnings.formatwarning = previous


#: the commands that take exactly two paths, SRC then DST
_TWO_PATHS = ("convert", "verify")


def _refuse_extra_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str],
                            argv: Sequence[str] | None) -> None:
    """argparse's usage error (exit 2) for arguments no command takes; for paths past SRC and DST,
    one that says why it happens: a glob the shell expanded, which must be quoted."""
    paths = [arg for arg in extra if not arg.startswith("-")]
    if getattr(args, "command", None) in _TWO_PATHS and paths:
        given = [args.src, args.dst, *paths]
        shown = " ".join(given[:4]) + (" ..." if len(given) > 4 else "")
        parser.exit(2, f"unihub: error: {args.command} takes one SRC and one DST, but {len(given)} paths were given "
                       f"({shown}): the shell expanded an unquoted glob; quote it so that unihub expands it, e.g. "
                       f"unihub {args.command} '{_glob_of(given)}' DST\n")
    parser.parse_args(argv)  # argparse's own message for the rest (it exits)


def _glob_of(paths: list[str]) -> str:
    """A glob matching what the shell listed, to show in the message: their directory and extension."""
    folder = os.path.dirname(paths[0])
    exts = {os.path.splitext(p)[1] for p in paths}
    pattern = "*" + (exts.pop() if len(exts) == 1 else "")
    return os.path.join(folder, pattern) if folder else pattern


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args) or 0)
    except UnihubError as exc:
        if args.verbose:
            raise
        print(f"unihub: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM (interrupts.Terminated), once the command unwound
        print(interrupts.last_line(stop), file=sys.stderr)
        return interrupts.exit_code(stop)
    except BrokenPipeError:  # the reader went away (``unihub inspect DS | head``): stop quietly
        _silence_stdout()
        return 141  # 128 + SIGPIPE, as a program the pipe killed
    except OSError as exc:  # a full disk, a read-only destination, a file too large
        if args.verbose:
            raise
        print(f"unihub: error: {_os_error_line(exc, args)}", file=sys.stderr)
        return 1


#: the argument naming what each command writes
_WRITES = {"convert": "dst", "copy": "dst", "add-schema": "url", "demo": "path", "show": "out"}


def _os_error_line(exc: OSError, args: argparse.Namespace) -> str:
    """One line for an OSError: as :func:`~unihub.fs.outputs.output_error` words it when it is
    the command's destination that could not be written, else the path and the reason."""
    target = getattr(args, _WRITES.get(args.command, ""), None)
    named = output_error(exc, target) if target else None
    if named is not None:
        return str(named)
    path, reason = path_of(exc), os.strerror(exc.errno) if exc.errno else ""
    hint = DISK_ERRORS.get(exc.errno or 0)
    line = f"{path}: {reason}" if path is not None and reason else \
        (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{line}; {hint}" if hint else line


if __name__ == "__main__":
    sys.exit(main())
