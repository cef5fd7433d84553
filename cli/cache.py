"""``unihub cache list URL`` and ``unihub cache rm URL ID [VERSION]``."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from unihub.caching.store import list_caches, remove_cache
from unihub.cli.storage import add_storage_option, storage_options_of
from unihub.viewer.describe import local_time

_EXAMPLES = """examples:
  unihub cache list s3://bucket/cache               # id, version, source, build time, rows
  unihub cache rm /data/cache mnist-train 3         # one version (all without VERSION)
  unihub inspect s3://bucket/cache/mnist-train/3    # one cache as a dataset"""


def add_cache_commands(sub: Any) -> None:
    """Register ``unihub cache ...`` on the CLI's subparsers."""
    cache = sub.add_parser("cache", help="list or remove caches made by unihub.cacheable",
                           description="List or remove the caches unihub.cacheable built under a cache root.",
                           formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EXAMPLES)
    verbs = cache.add_subparsers(dest="cache_command", required=True)
    listing = verbs.add_parser("list", help="the caches under a root: id, version, source, build time, rows",
                               formatter_class=argparse.RawDescriptionHelpFormatter,
                               epilog="examples:\n  unihub cache list /data/cache\n"
                                      "  unihub cache list s3://bucket/cache --json")
    listing.add_argument("url", help="cache root (folder or s3://...)")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_storage_option(listing)
    listing.set_defaults(func=cmd_cache_list)
    rm = verbs.add_parser("rm", help="remove one version of a cache, or all its versions",
                          formatter_class=argparse.RawDescriptionHelpFormatter,
                          epilog="examples:\n  unihub cache rm /data/cache mnist-train 3   # one version\n"
                                 "  unihub cache rm s3://bucket/cache mnist-train  # every version")
    rm.add_argument("url", help="cache root (folder or s3://...)")
    rm.add_argument("dataset_id")
    rm.add_argument("version", nargs="?", help="the version to remove (all versions when left out)")
    add_storage_option(rm)
    rm.set_defaults(func=cmd_cache_rm)


def cmd_cache_list(args: argparse.Namespace) -> int:
    caches = list_caches(args.url, storage_options=storage_options_of(args))
    if args.json:
        print(json.dumps([asdict(c) for c in caches], indent=2))
        return 0
    rows = [["id", "version", "source", "built", "rows"]]
    rows += [[c.dataset_id, c.version, c.source_type, local_time(c.built_at), f"{c.num_rows:,}"] for c in caches]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print("\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows))
    return 0


def cmd_cache_rm(args: argparse.Namespace) -> int:
    for version in remove_cache(args.url, args.dataset_id, args.version,
                                storage_options=storage_options_of(args)):
        print(f"removed {args.url.rstrip('/')}/{args.dataset_id}/{version}")
    return 0
