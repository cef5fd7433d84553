"""``unihub vacuum`` and ``unihub inspect --versions``: a dataset's versions (:mod:`unihub.store.versions`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from unihub.cli.storage import add_storage_option, storage_options_of
from unihub.readers.filter_text import parse_filter
from unihub.runtime.memory import DEFAULT_PART_SIZE_MB
from unihub.store.compaction import compact_dataset
from unihub.store.dataset import open_dataset
from unihub.store.versions import Version, delete_rows, list_versions, vacuum_dataset


def version_rows(versions: list[Version]) -> list[dict[str, Any]]:
    """One JSON-able row per version: number, timestamp, operation, tag, files, rows added, sources."""
    return [{"version": v.number, "timestamp": v.timestamp, "operation": v.operation, "tag": v.tag,
             "files": len(v.parts), "added_rows": v.added_rows, "sources": len(v.sources),
             "recorded": v.recorded} for v in versions]


def print_versions(path: str, as_json: bool, storage_options: dict[str, Any] | None = None) -> int:
    """Print the versions of the dataset at ``path``, a table (or JSON)."""
    rows = version_rows(list_versions(path, storage_options=storage_options))
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


def _dataset_command(sub: Any, name: str, func: Any, help: str, description: str, *examples: str,
                     tagged: bool = True) -> argparse.ArgumentParser:
    """A subcommand on one dataset (its path or URL, ``--storage-option``; ``tagged``: ``--tag`` for the version it
    makes), its examples under the help; the caller adds its own options."""
    parser = sub.add_parser(name, help=help, description=description,
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog="examples:\n" + "".join(f"  {e}\n" for e in examples))
    parser.add_argument("path", help="dataset directory or URL")
    if tagged:
        parser.add_argument("--tag", help="a name for the version it makes")
    add_storage_option(parser)
    parser.set_defaults(func=func)
    return parser


def add_vacuum_command(sub: Any) -> None:
    vacuum = _dataset_command(sub, "vacuum", cmd_vacuum, "remove a dataset's old versions and the files only they use",
                              "Keep the newest N versions of a dataset that grows (convert --append, "
                              "write_dataset(mode='append')); remove older version records and the files no kept "
                              "version uses (never a live append's).",
                              "unihub vacuum /data/train --keep 10", "unihub inspect /data/train --versions",
                              tagged=False)
    vacuum.add_argument("--keep", type=int, required=True, help="how many of the newest versions to keep (>= 1)")


def cmd_delete(args: argparse.Namespace) -> int:
    options = storage_options_of(args)
    names = open_dataset(args.path, storage_options=options).stored_schema.names  # added columns too
    version = delete_rows(args.path, parse_filter(args.where, names).expression, tag=args.tag,
                          storage_options=options)
    if version is None:
        print(f"no row matched: nothing deleted, no version made: {args.path}")
    else:
        print(f"deleted {-(version.added_rows or 0):,} row(s) as version {version.number}: {args.path}")
    return 0


def add_delete_command(sub: Any) -> None:
    delete = _dataset_command(sub, "delete", cmd_delete, "delete the rows a filter matches, as a new version of the "
                              "dataset", "Rewrite the part files holding rows WHERE matches without them, as a new "
                              "version (older versions still read them until unihub vacuum).",
                              "unihub delete /data/train --where 'id < 100'",
                              "unihub delete /data/train --where 'label in [3, 4]' --tag no-3-4")
    delete.add_argument("--where", required=True, help="the rows to delete, on the stored columns (added ones "
                        "too): a pyarrow expression with bare field names, or pyarrow's DNF list as JSON (as unihub "
                        "show --where)")


def cmd_compact(args: argparse.Namespace) -> int:
    version = compact_dataset(args.path, target_mb=args.target_mb, tag=args.tag,
                              storage_options=storage_options_of(args))
    if version is None:
        print(f"no two parts to join: nothing compacted, no version made: {args.path}")
    else:
        print(f"compacted into {len(version.parts)} part(s) as version {version.number}: {args.path}")
    return 0


def add_compact_command(sub: Any) -> None:
    compact = _dataset_command(sub, "compact", cmd_compact, "join a grown dataset's small parts into fewer, as a new "
                               "version", "Rewrite runs of small part files (many appends) and their column sets' side "
                               "files into parts of up to --target-mb each, as a new version: the rows, their order and "
                               "values unchanged, older versions kept until vacuum.",
                               "unihub compact /data/train", "unihub compact /data/train --target-mb 512 --tag compacted")
    compact.add_argument("--target-mb", type=float, default=DEFAULT_PART_SIZE_MB,
                         help=f"the most megabytes a joined part holds (default {DEFAULT_PART_SIZE_MB:g})")
