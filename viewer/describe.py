"""What a dataset holds, as data and as text: ``unihub inspect``'s report, the viewer's header.

:func:`describe_dataset` gathers the schema, counts, sizes, row-group indexes and cache facts of a
dataset into a JSON-able dict; :func:`format_description` writes it for people. The command line
(``cli/reading.py``), the HTML viewer and the demo's main job all describe datasets through here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from unihub.errors import DatasetNotFoundError, FormatError, UnihubError, UnsupportedFormatError
from unihub.formats.base import detect_format
from unihub.fs import filesystem as fsutil
from unihub.fs import sources
from unihub.readers.rowgroup_index import describe_rowgroup_indexes
from unihub.store import versions
from unihub.store.dataset import missing_fields_message, open_dataset

if TYPE_CHECKING:
    from unihub.store.dataset import ParquetStore


def human_bytes(n: float) -> str:
    """A byte count for people: ``512 B``, ``3.4 MB``."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def describe_dataset(url: str, *, store: ParquetStore | None = None) -> dict[str, Any]:
    """What ``unihub inspect`` reports, as a JSON-able dict (of ``store`` when given: ``url`` opened)."""
    if store is None:
        try:
            store = open_dataset(url)
        except (FormatError, DatasetNotFoundError) as exc:
            foreign = foreign_source(url)
            if foreign is None:
                raise
            raise UnsupportedFormatError(foreign) from exc
    missing = store.missing_fields
    return {
        # the Unischema's own JSON keys first: ``unihub inspect --json DS > s.json`` is a --schema file
        **{k: v for k, v in json.loads(store.schema.to_json()).items() if k != "fields"},
        "url": url,
        "schema_name": store.schema.name,
        "schema_source": store.schema_source,
        "rows": store.num_rows,
        "files": len(store.files),
        "row_groups": len(store.row_groups),
        "bytes": store.total_bytes,
        "partitions": list(store.partition_names),
        "fields": [f.to_json() for f in store.schema],
        **({"missing_fields": list(missing), "schema_problem": missing_fields_message(store, missing)} if missing else {}),
        **({"column_sets": {s.name: [f.name for f in s.fields] for s in store.side.sets}} if store.side else {}),
        **describe_rowgroup_indexes(store),
        **describe_cache(store),
        **({"foreign_files": outside} if (outside := _foreign_files(store)) else {}),
    }


def _foreign_files(store: ParquetStore) -> list[str]:
    """Data files in a dataset's folder that no version lists (another tool appended them): none in a local one
    without records (every file in it is its version 1), those its manifest does not list on an object store."""
    if store.version is None and (fsutil.on_local_disk(store.filesystem) or not store.files
                                  or store.files[0].path == store.path):  # a single file is no folder
        return []
    return versions.foreign_files(store.filesystem, store.path)


def foreign_source(url: str, command: str = "inspect") -> str | None:
    """What a path that is no unihub dataset is, when a foreign format claims it, and how to convert it
    (and then ``command`` the result)."""
    import os

    try:
        name = detect_format(url)
    except (OSError, UnihubError):
        return None
    if name is None:
        return None
    what = "folder" if sources.isdir(url) else "file"
    stem = os.path.splitext(os.path.basename(url.rstrip("/")))[0] or "dataset"
    return (f"{url}: a {what} in the {name} format, not a unihub dataset; convert it first, e.g. "
            f"unihub convert {url} {stem}_unihub, then {command} that")


def _format_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)


def format_description(info: dict[str, Any]) -> str:
    """The human-readable form of :func:`describe_dataset`."""
    source = {"unihub": "unihub metadata", "petastorm": "Petastorm metadata (pickle, allow-listed)",
              "inferred": "inferred from Parquet types"}[info["schema_source"]]
    lines = [
        f"dataset: {info['url']}",
        f"schema:  {info['schema_name']} ({source})",
        f"rows: {info['rows']:,}   files: {info['files']}   row groups: {info['row_groups']}   "
        f"bytes: {human_bytes(info['bytes'])}",
    ]
    lines += format_cache(info)
    if info["partitions"]:
        lines.append(f"partitions: {', '.join(info['partitions'])}")
    if info.get("foreign_files"):
        files = info["foreign_files"]
        lines.append(f"not in any version: {len(files)} data file(s) another tool wrote ({', '.join(files[:3])}"
                     f"{', ...' if len(files) > 3 else ''}); unihub's readers skip them, plain readers read them "
                     "(unihub adopt adds them as a version)")
    if info.get("column_sets"):  # store/column_sets.py
        lines.append("column sets (added beside the parts): "
                     + "; ".join(f"{name}: {', '.join(fields)}" for name, fields in info["column_sets"].items()))
    table = [["field", "dtype", "shape", "codec", "nullable"]]
    missing = set(info.get("missing_fields", ()))
    for f in info["fields"]:
        codec = "-" if f["codec"] is None else codec_label(f["codec"])
        name = f"{f['name']} (no column in the files)" if f["name"] in missing else f["name"]
        table.append([name, f["dtype"], shape_label(f["shape"]), codec, "yes" if f["nullable"] else "no"])
    return "\n".join(lines) + "\n\n" + _format_table(table) + _format_indexes(info)


def _format_indexes(info: dict[str, Any]) -> str:
    """The row-group indexes section of :func:`format_description` ('' when there are none)."""
    indexes, problem = info.get("rowgroup_indexes") or [], info.get("rowgroup_index_problem")
    if not indexes and not problem:
        return ""
    source = {"unihub": "unihub JSON", "petastorm": "Petastorm pickle, allow-listed"}.get(
        info.get("rowgroup_index_source") or "", "")
    text = f"\n\nrow-group indexes ({source}):" if source else "\n\nrow-group indexes:"
    if problem:
        text += f"\n{problem}"
    if indexes:
        table = [["index", "kind", "field", "values", "row groups"]]
        table += [[i["name"], i["kind"], i["field"], "-" if i["values"] is None else str(i["values"]),
                   str(i["row_groups"])] for i in indexes]
        text += "\n" + _format_table(table)
    return text


def shape_label(shape: Sequence[int | None]) -> str:
    """A field's shape as Python writes it, ``None`` for any size: ``(None, 4)``, ``(16,)``, ``()``."""
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def codec_label(codec: dict[str, Any]) -> str:
    """A codec's JSON form as one label: ``CompressedImageCodec(image_codec=png)``."""
    args = ", ".join(f"{k}={v}" for k, v in codec.items() if k != "type" and not str(v).startswith("ipc:"))
    return f"{codec['type']}({args})" if args else codec["type"]


def describe_cache(store: Any) -> dict[str, Any]:
    """``{"cache": {...}}`` for ``unihub inspect`` of a cache (id, version, source, build time), else {}."""
    found = store.extra_metadata.get("cache")
    if not isinstance(found, dict):
        return {}
    return {"cache": {k: found.get(k) for k in ("dataset_id", "version", "source_type", "built_at")}}


def format_cache(info: dict[str, Any]) -> list[str]:
    """The ``cache:`` line of ``unihub inspect``'s table ([] for other datasets)."""
    cache = info.get("cache")
    if not cache:
        return []
    built = cache.get("built_at")
    when = local_time(built) if isinstance(built, (int, float)) else "?"
    return [f"cache: {cache.get('dataset_id')} version {cache.get('version')}, from {cache.get('source_type')}, "
            f"built {when}, {info['rows']:,} rows"]


def local_time(seconds: float) -> str:
    """A time as `unihub cache list` and `inspect` print it."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))
