"""``unihub cache list URL`` and ``unihub cache rm URL ID [VERSION]``."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

import pyarrow.fs as pafs

from unihub.caching.store import list_caches, remove_cache
from unihub.cli.parsers import JSON, STORAGE_OPTION, add_command, arg
from unihub.cli.storage import storage_options_of
from unihub.errors import CacheError
from unihub.fs.filesystem import on_local_disk, resolve_filesystem
from unihub.viewer.describe import local_time

#: where unihub.cacheable keeps its caches, the root each of these commands takes
_CACHE_ROOT = arg("url", help="cache root (folder or s3://...)")


def add_cache_commands(sub: Any) -> None:
    """Register ``unihub cache ...`` on the CLI's subparsers."""
    cache = add_command(sub, "cache", None, help="list or remove caches made by unihub.cacheable",
                        description="List or remove the caches unihub.cacheable built under a cache root.",
                        examples=["unihub cache list s3://bucket/cache               # id, version, source, build "
                                  "time, rows",
                                  "unihub cache rm /data/cache mnist-train 3         # one version (all without "
                                  "VERSION)",
                                  "unihub inspect s3://bucket/cache/mnist-train/3    # one cache as a dataset"])
    verbs = cache.add_subparsers(dest="cache_command", required=True)
    add_command(verbs, "list", cmd_cache_list, _CACHE_ROOT, JSON, STORAGE_OPTION,
                help="the caches under a root: id, version, source, build time, rows",
                examples=["unihub cache list /data/cache", "unihub cache list s3://bucket/cache --json"])
    add_command(verbs, "rm", cmd_cache_rm, _CACHE_ROOT, arg("dataset_id"),
                arg("version", nargs="?", help="the version to remove (all versions when left out)"), STORAGE_OPTION,
                help="remove one version of a cache, or all its versions",
                examples=["unihub cache rm /data/cache mnist-train 3   # one version",
                          "unihub cache rm s3://bucket/cache mnist-train  # every version"])


def cmd_cache_list(args: argparse.Namespace) -> int:
    caches = list_caches(args.url, storage_options=storage_options_of(args))
    if not caches:
        _check_root(args)
    if args.json:
        print(json.dumps([asdict(c) for c in caches], indent=2))
        return 0
    rows = [["id", "version", "source", "built", "rows"]]
    rows += [[c.dataset_id, c.version, c.source_type, local_time(c.built_at), f"{c.num_rows:,}"] for c in caches]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print("\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows))
    return 0


def _check_root(args: argparse.Namespace) -> None:
    """Refuse a local cache root that is not there (a mistyped path listed no caches, exit 0); an object store's
    root is a prefix, there as soon as a cache is."""
    fs, path = resolve_filesystem(args.url, None, storage_options_of(args))
    if on_local_disk(fs) and fs.get_file_info(path).type != pafs.FileType.Directory:
        raise CacheError(f"{args.url}: no such folder (a cache root is the url given to unihub.cacheable)")


def cmd_cache_rm(args: argparse.Namespace) -> int:
    for version in remove_cache(args.url, args.dataset_id, args.version,
                                storage_options=storage_options_of(args)):
        print(f"removed {args.url.rstrip('/')}/{args.dataset_id}/{version}")
    return 0
