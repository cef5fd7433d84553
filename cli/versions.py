"""``unihub vacuum`` and ``unihub inspect --versions``: a dataset's versions (:mod:`unihub.store.versions`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from unihub.cli.parsers import DATASET, STORAGE_OPTION, TAG, add_command, arg
from unihub.cli.storage import storage_options_of
from unihub.readers.filter_text import parse_filter
from unihub.runtime.memory import DEFAULT_PART_SIZE_MB
from unihub.store.adoption import adopt_files
from unihub.store.compaction import compact_dataset
from unihub.store.dataset import open_dataset
from unihub.store.versions import Version, delete_rows, list_versions, vacuum_dataset


def version_rows(versions: list[Version], first_rows: int | None = None) -> list[dict[str, Any]]:
    """One JSON-able row per version: number, timestamp, operation, tag, files, rows added, sources.
    ``first_rows``: version 1's rows, where its record does not say (it was written before it had one)."""
    return [{"version": v.number, "timestamp": v.timestamp, "operation": v.operation, "tag": v.tag,
             "files": len(v.parts), "sources": len(v.sources), "recorded": v.recorded,
             "added_rows": first_rows if v.added_rows is None and v.number == 1 else v.added_rows}
            for v in versions]


def print_versions(path: str, as_json: bool, storage_options: dict[str, Any] | None = None) -> int:
    """Print the versions of the dataset at ``path``, a table (or JSON)."""
    versions = list_versions(path, storage_options=storage_options)
    first_rows = None
    if versions and versions[0].number == 1 and versions[0].added_rows is None:  # its parts' footers say
        first_rows = open_dataset(path, storage_options=storage_options, version=1).num_rows
    rows = version_rows(versions, first_rows)
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'version':>7}  {'timestamp':<29}  {'operation':<14}  {'files':>5}  {'rows added':>10}  tag")
    for row in rows:
        added = "?" if row["added_rows"] is None else f"{row['added_rows']:,}"
        print(f"{row['version']:>7}  {row['timestamp']:<29}  {row['operation']:<14}  {row['files']:>5}  "
              f"{added:>10}  {row['tag'] or ''}")
    return 0


def cmd_vacuum(args: argparse.Namespace) -> int:
    result = vacuum_dataset(args.path, args.keep, storage_options=storage_options_of(args))
    print(f"removed {len(result.removed_versions)} version(s) and {len(result.removed_files)} file(s); kept "
          f"version(s) {', '.join(map(str, result.kept_versions)) or 'none'}: {args.path}")
    return 0


def add_vacuum_command(sub: Any) -> None:
    add_command(sub, "vacuum", cmd_vacuum, DATASET, STORAGE_OPTION,
                arg("--keep", type=int, required=True, help="how many of the newest versions to keep (>= 1)"),
                help="remove a dataset's old versions and the files only they use",
                description="Keep the newest N versions of a dataset that grows (convert --append, "
                            "write_dataset(mode='append')); remove older version records and the files no kept "
                            "version uses (never a live append's).",
                examples=["unihub vacuum /data/train --keep 10", "unihub inspect /data/train --versions"])


def cmd_delete(args: argparse.Namespace) -> int:
    options = storage_options_of(args)
    store = open_dataset(args.path, storage_options=options)
    names = [*store.stored_schema.names, *store.partition_names]  # added columns and partition keys too
    version = delete_rows(args.path, parse_filter(args.where, names).expression, tag=args.tag,
                          storage_options=options)
    if version is None:
        print(f"no row matched: nothing deleted, no version made: {args.path}")
    else:
        print(f"deleted {-(version.added_rows or 0):,} row(s) as version {version.number}: {args.path}")
    return 0


def add_delete_command(sub: Any) -> None:
    add_command(sub, "delete", cmd_delete, DATASET, TAG, STORAGE_OPTION,
                arg("--where", required=True, help="the rows to delete, on the stored columns (added ones too): a "
                    "pyarrow expression with bare field names, or pyarrow's DNF list as JSON (as unihub show --where)"),
                help="delete the rows a filter matches, as a new version of the dataset",
                description="Rewrite the part files holding rows WHERE matches without them, as a new version (older "
                            "versions still read them until unihub vacuum).",
                examples=["unihub delete /data/train --where 'id < 100'",
                          "unihub delete /data/train --where 'label in [3, 4]' --tag no-3-4"])


def cmd_compact(args: argparse.Namespace) -> int:
    version = compact_dataset(args.path, target_mb=args.target_mb, tag=args.tag,
                              storage_options=storage_options_of(args))
    if version is None:
        print(f"no two parts to join: nothing compacted, no version made: {args.path}")
    else:
        print(f"compacted into {len(version.parts)} part(s) as version {version.number}: {args.path}")
    return 0


def add_compact_command(sub: Any) -> None:
    add_command(sub, "compact", cmd_compact, DATASET, TAG, STORAGE_OPTION,
                arg("--target-mb", type=float, default=DEFAULT_PART_SIZE_MB,
                    help=f"the most megabytes a joined part holds (default {DEFAULT_PART_SIZE_MB:g})"),
                help="join a grown dataset's small parts into fewer, as a new version",
                description="Rewrite runs of small part files (many appends) and their column sets' side files into "
                            "parts of up to --target-mb each, as a new version: the rows, their order and values "
                            "unchanged, older versions kept until vacuum.",
                examples=["unihub compact /data/train", "unihub compact /data/train --target-mb 512 --tag compacted"])



def cmd_adopt(args: argparse.Namespace) -> int:
    options = storage_options_of(args)
    version = adopt_files(args.path, tag=args.tag, storage_options=options)
    if version is None:
        print(f"no data file that no version lists: nothing adopted, no version made: {args.path}")
        return 0
    before = {rel for v in list_versions(args.path, storage_options=options) if v.number == version.number - 1
              for rel in v.parts}
    adopted = [rel for rel in version.parts if rel not in before]
    print(f"adopted {len(adopted)} file(s), {version.added_rows or 0:,} row(s), as version {version.number}: "
          f"{args.path}")
    for rel in adopted:
        print(f"  {rel}")
    return 0


def add_adopt_command(sub: Any) -> None:
    add_command(sub, "adopt", cmd_adopt, DATASET, TAG, STORAGE_OPTION,
                help="add the data files another tool put into a dataset (a Spark append) as a new version",
                description="Check each data file in the dataset's folder that no version lists and unihub did not "
                            "write (Spark's mode('append'), a copy) against the latest version's schema, and publish "
                            "the next version with them, where they are: unihub's readers read them from then on. A "
                            "file that does not fit is an error naming its columns, and nothing is adopted.",
                examples=["unihub inspect /data/train", "unihub adopt /data/train --tag spark-backfill"])
