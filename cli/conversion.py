"""``unihub convert``, ``verify``, ``copy`` and ``add-schema``: the commands that turn one dataset into another
(:mod:`unihub.converters`), their options (``--option``, ``--engine``, ``--max-image-pixels``, ...) and Spark's console."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from unihub.cli.parsers import DATASET, QUIET, STORAGE_OPTION, TAG, Arg, add_command, arg, one_of
from unihub.cli.storage import storage_options_of
from unihub.cli.terminal import printable
from unihub.converters.add_schema import add_schema
from unihub.converters.convert import convert, resolve_source_format, resolve_target_format
from unihub.converters.copy import copy_dataset
from unihub.converters.engines import spark
from unihub.converters.engines.spark import parse_stall_timeout
from unihub.converters.meter import ProgressMeter
from unihub.converters.result import UNIHUB
from unihub.converters.verify import verify
from unihub.errors import UnihubError
from unihub.formats.base import FORMATS, parse_options
from unihub.fs import sources
from unihub.runtime.memory import DEFAULT_PART_SIZE_MB, DEFAULT_ROW_GROUP_SIZE_MB
from unihub.schema.image_checks import VALIDATE_IMAGES


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
        print(printable(result.summary()), file=sys.stderr)  # it names source files: see cli/terminal.py
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
                                  master=args.master, overwrite_foreign=args.overwrite_foreign, progress=progress,
                                  storage_options=storage_options_of(args))
    finally:
        meter.close()
    if not args.quiet:
        print(printable(result.summary()), file=sys.stderr)  # it names source files: see cli/terminal.py
    return 0


def cmd_add_schema(args: argparse.Namespace) -> int:
    unischema_class = args.unischema_class
    if unischema_class is not None and "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # 'module.attr' in the current directory, as with python -m
    result = add_schema(args.url, args.schema, unischema_class=unischema_class,
                        petastorm_compatible=args.petastorm_compatible, use_summary_metadata=args.use_summary_metadata,
                        storage_options=storage_options_of(args))
    print(result.summary())
    return 0


def add_convert_command(sub: Any) -> None:
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


def add_verify_command(sub: Any) -> None:
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


def add_copy_command(sub: Any) -> None:
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
                QUIET, STORAGE_OPTION,
                help="copy a dataset, keeping some fields and dropping rows with nulls (petastorm-copy-dataset.py)",
                description="Copy SRC to DST as stored (nothing decoded), in order; the copy is written beside DST "
                            "and renamed on success.",
                examples=["unihub copy /data/train /data/small --field-regex id 'image.*' --not-null-fields label",
                          "unihub copy /data/train /data/train4 --partition-count 4 --row-group-size-mb 64",
                          "unihub copy /data/train /data/copy --engine spark --master spark://host:7077"])


def add_add_schema_command(sub: Any) -> None:
    """``add-schema``, one of Petastorm's three command-line tools (petastorm-generate-metadata.py)."""
    add_command(sub, "add-schema", cmd_add_schema, DATASET.changed("url"),
                one_of(arg("--schema", metavar="FILE", help="a Unischema JSON file (as unihub inspect --json writes)"),
                       arg("--unischema-class", "--unischema_class", metavar="MODULE.ATTR",
                           help="an importable unihub or Petastorm Unischema, e.g. my_pkg.schemas.TrainSchema")),
                _petastorm_compatible("the store"),
                arg("--use-summary-metadata", action="store_true",
                    help="also write _metadata with every file's row groups"), STORAGE_OPTION,
                help="write a Unischema into an existing Parquet store (petastorm-generate-metadata.py)",
                description="Write a Unischema into URL's _common_metadata (atomically; data files are not touched): "
                            "the one given, else the one the store has, else one inferred from the Parquet types. It "
                            "must match the store's columns.",
                examples=["unihub add-schema /data/spark_out                      # inferred",
                          "unihub add-schema /data/spark_out --schema schema.json",
                          "unihub add-schema /data/spark_out --unischema-class my_pkg.schemas.TrainSchema",
                          "unihub add-schema /data/train --petastorm-compatible   # for Petastorm readers too"])


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
