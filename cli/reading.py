"""``unihub inspect``, ``show`` and ``throughput``: the commands that read a dataset and report on it, as text
or JSON (:mod:`unihub.viewer.describe`), as one HTML page (:mod:`unihub.viewer`) or as rows per second
(:mod:`unihub.bridges.throughput`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from typing import Any

from unihub.bridges.throughput import ReadMethod, WorkerPoolType, reader_throughput
from unihub.cli.parsers import DATASET, DATASET_OR_FILE, JSON, QUIET, STORAGE_OPTION, add_command, arg, one_of
from unihub.cli.storage import storage_options_of
from unihub.cli.versions import print_versions
from unihub.errors import SchemaMismatchError, UnihubError
from unihub.fs import sources
from unihub.readers.reader import resolve_fields
from unihub.runtime.progress import Display, open_display, should_show
from unihub.store.dataset import open_dataset
from unihub.viewer import DEFAULT_REPORT, refuse_directory, show
from unihub.viewer.describe import describe_dataset, format_description


def cmd_inspect(args: argparse.Namespace) -> int:
    if args.versions:
        return print_versions(args.path, args.json, storage_options_of(args))
    with sources.using(storage_options_of(args)):  # the open and, for a foreign path, the format's detection
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
    refuse_directory(out)
    _refuse_the_datasets_own_file(out, args.path)

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


def _refuse_the_datasets_own_file(out: str, dataset: str) -> None:
    """Refuse an ``--out`` that is the dataset (one Parquet file) or a file already in its folder: the page
    would replace a part or its metadata (``unihub show data.parquet --out data.parquet``)."""
    local = sources.local_path(dataset)
    if sources.is_url(dataset) or not os.path.exists(local) or not os.path.lexists(out):
        return
    report, source = os.path.realpath(out), os.path.realpath(local)
    if report == source or report.startswith(source.rstrip(os.sep) + os.sep):
        raise UnihubError(f"cannot write {out}: it is a file of the dataset {dataset}, which the page would replace; "
                          "write it elsewhere")


def cmd_throughput(args: argparse.Namespace) -> int:
    _check_throughput_dataset(args)
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


def _check_throughput_dataset(args: argparse.Namespace) -> None:
    """Refuse a dataset that does not open, or fields it lacks, before the banner: the error is then the one line
    on stderr, as every command's (the measuring child would find them only after the banner)."""
    store = open_dataset(args.url, storage_options=storage_options_of(args))
    with warnings.catch_warnings():  # names that match nothing beside others: the child warns of them
        warnings.simplefilter("ignore")
        resolve_fields(store.schema, args.field_regex, args.url, store.stored_schema)


def _throughput_reader_args(args: argparse.Namespace) -> dict[str, Any]:
    """``make_reader`` arguments of ``unihub throughput``'s ``--cache-location`` and ``--storage-option``."""
    extra: dict[str, Any] = {}
    if args.storage_option:
        extra["storage_options"] = storage_options_of(args)
    if args.cache_location:
        extra.update(cache_type="local-disk", cache_location=args.cache_location,
                     cache_size_limit=args.cache_size_limit_mb * 2**20,  # NaN and inf refused there
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


def add_inspect_command(sub: Any) -> None:
    add_command(sub, "inspect", cmd_inspect, DATASET_OR_FILE, JSON,
                arg("--versions", action="store_true", help="list the dataset's versions (number, time, operation, "
                    "files, rows added, tag) instead"), STORAGE_OPTION,
                help="show a dataset's schema, rows, files, row groups and bytes",
                description="Show a dataset's schema (field, dtype, shape, codec, nullable), rows, files, row groups "
                            "and bytes.",
                examples=["unihub inspect /data/train",
                          "unihub inspect /data/train --json > schema.json   # a --schema file for convert",
                          "unihub inspect s3://bucket/train --storage-option endpoint_url=http://host:9000"])


def add_show_command(sub: Any) -> None:
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


def add_throughput_command(sub: Any) -> None:
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
