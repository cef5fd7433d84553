"""``adopt_files``: the data files another tool put into a dataset's folder, made part of it as a new version.

A Spark job (``df.write.mode("append").parquet(url)``), pandas or a copy can put Parquet files into the folder of a
dataset that records versions: plain readers read them, unihub's readers do not (no version lists them; every
commit warns of them, and ``unihub inspect`` counts them). :func:`adopt_files` checks each against the latest
version's schema and publishes the next version with them added (operation ``adopt``), by the create-if-absent step
every commit uses (:func:`unihub.fs.publish.put_if_absent`), then rewrites the listings Petastorm and Spark read
(:mod:`unihub.store.listings`). The files are neither moved nor rewritten: the version lists them where they are.

A file fits where it holds the dataset's columns, in the dataset's order, each of the same Arrow type (a list's
element name aside: Spark calls it ``element``), or lacks some that are nullable (its rows read nulls there); a
column the dataset holds without nulls may be stored nullable (Spark stores every column so) where the file holds
no null in it. Hive partition folders (``key=value/``) must name the keys the dataset's files do. Anything else is an
:class:`~unihub.errors.AppendSchemaError` naming the file and its columns, a file that is not Parquet a
:class:`~unihub.errors.FormatError` naming it, and nothing is published.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from unihub.errors import AppendSchemaError, ConcurrentCommitError, FormatError
from unihub.fs import filesystem as fsutil
from unihub.fs import publish, remote
from unihub.store import _footer, listings, versions
from unihub.store.dataset import partition_of, same_type_nulls_aside
from unihub.store.versions import COMMIT_ATTEMPTS, Version

#: how many of a file's misfits an error names
_SHOWN = 6


def adopt_files(url: str | os.PathLike[str], *, tag: str | None = None, storage_options: dict[str, Any] | None = None,
                filesystem: Any = None) -> Version | None:
    """Add the data files in the dataset's folder that no version lists and unihub did not write to the dataset at
    ``url``, as its next version (see the module docstring); a dataset written once by unihub is recorded as version
    1 first. Returns the version published, or None where there is no such file (nothing is written)."""
    fs, root = fsutil.resolve_filesystem(os.fspath(url), filesystem, storage_options)
    root = root.rstrip("/")
    with remote.remote_errors(os.fspath(url)):
        current = versions.settled_history(fs, root, os.fspath(url), tag, "adopt files into")
        if not versions.foreign_files(fs, root, current):
            return None
        current = versions.recorded(fs, root, current)
        for attempt in range(COMMIT_ATTEMPTS):
            version = _next_version(fs, root, current, tag)
            if version is None:
                return None
            if publish.put_if_absent(fs, versions.record_path(root, version.number), version.to_json()):
                listings.follow_latest(fs, root, (version.number, version.parts),
                                       lambda: versions.latest_parts(fs, root))
                return version
            time.sleep(random.uniform(0.01, 0.05 * (attempt + 1)))
            current = versions.history(fs, root)
            versions.check_tag(current, tag, root)
    raise ConcurrentCommitError(f"{root}: other writers took the next version {COMMIT_ATTEMPTS} times in a row; "
                                "no file was adopted: run it again")


def _next_version(fs: pafs.FileSystem, root: str, current: Sequence[Version], tag: str | None) -> Version | None:
    """The version after ``current[-1]`` with the unlisted files added (each checked), or None where there are none
    left (another run adopted them)."""
    latest = current[-1]
    found = versions.foreign_files(fs, root, current)
    if not found:
        return None
    schema = _schema_of(fs, f"{root}/{latest.common_metadata or latest.parts[0]}")
    keys = [key for key, _ in partition_of(root, f"{root}/{latest.parts[0]}")] if latest.parts else None
    rows = sum(_checked_rows(fs, root, rel, schema, keys) for rel in found)
    return replace(latest, number=latest.number + 1, timestamp=versions.now(), operation="adopt", tag=tag,
                   parts=(*latest.parts, *found), added_rows=rows)


def _schema_of(fs: pafs.FileSystem, path: str) -> pa.Schema:
    with fs.open_input_file(path) as handle:
        return pq.read_schema(handle)


def _checked_rows(fs: pafs.FileSystem, root: str, rel: str, schema: pa.Schema, keys: list[str] | None) -> int:
    """The rows of the file ``rel``, after checking that it fits ``schema`` (see the module docstring); ``keys``: the
    partition keys of the dataset's files (None: it has none yet)."""
    path = f"{root}/{rel}"
    try:
        with fs.open_input_file(path) as handle:
            parquet_file = pq.ParquetFile(handle)
            _footer.remember_from(parquet_file.metadata, handle)  # a footer pyarrow cannot read is not adopted
            _footer.check(parquet_file.metadata, path)
            misfits = _misfits(parquet_file, schema)
            if keys is not None and [key for key, _ in partition_of(root, path)] != keys:
                misfits.append(f"partition folders {rel.rsplit('/', 1)[0] if '/' in rel else '(none)'}: the "
                               f"dataset's files are under {'/'.join(f'{k}=...' for k in keys) or 'none'}")
            rows = parquet_file.metadata.num_rows
    except (OSError, pa.ArrowException) as exc:
        raise FormatError(f"{path}: not a Parquet file unihub can adopt ({exc!s:.300})", path=path) from exc
    if misfits:
        shown = "; ".join(misfits[:_SHOWN]) + (f"; and {len(misfits) - _SHOWN} more" if len(misfits) > _SHOWN else "")
        raise AppendSchemaError(f"{path}: does not fit the dataset's schema, so no file was adopted: {shown}")
    return rows


def _misfits(parquet_file: pq.ParquetFile, schema: pa.Schema) -> list[str]:
    """How the file's columns differ from ``schema``'s (see the module docstring); none where it fits."""
    stored = parquet_file.schema_arrow
    names = [n for n in schema.names if n in stored.names]
    misfits = [f"{n}: not a column of the dataset" for n in stored.names if n not in schema.names]
    if not misfits and stored.names != names:
        misfits.append(f"columns in the order {stored.names}, the dataset's {schema.names}")
    nullable = versions.may_be_null(schema)
    for field in schema:
        if field.name not in stored.names:
            if not nullable[field.name]:
                misfits.append(f"{field.name}: missing, and the dataset's may not be null")
            continue
        found = stored.field(field.name)
        if not same_type_nulls_aside(found.type, field.type):
            misfits.append(f"{field.name}: {found.type} in the file, {field.type} in the dataset")
        elif (found.nullable and not nullable[field.name] or not found.type.equals(field.type)) and \
                _nulls_not_allowed(parquet_file, field.name, field.type, nullable[field.name]):
            misfits.append(f"{field.name}: nulls in the file where the dataset's may not be null")
    return misfits


def _nulls_not_allowed(parquet_file: pq.ParquetFile, name: str, wanted: pa.DataType, nullable: bool) -> bool:
    """Whether column ``name`` holds a null where ``wanted`` (the dataset's type, ``nullable`` or not) allows none: in
    a value, or in a list's element or a struct's field. From the footer's statistics where the column is one leaf
    and every row group has them, else read."""
    metadata = parquet_file.metadata
    leaves = [k for k in range(metadata.num_columns) if metadata.schema.column(k).path == name]
    if leaves and not nullable and _footer.problem(metadata) is None:
        counts = [metadata.row_group(g).column(leaves[0]).statistics for g in range(metadata.num_row_groups)]
        if all(s is not None and s.has_null_count for s in counts):
            return any(s.null_count for s in counts)
    return _holds_null(parquet_file.read(columns=[name]).column(name).combine_chunks(), wanted, nullable)


def _holds_null(values: pa.Array, wanted: pa.DataType, nullable: bool) -> bool:
    """Whether ``values`` hold a null where ``wanted`` allows none (see :func:`_nulls_not_allowed`)."""
    if not nullable and values.null_count:
        return True
    if pa.types.is_list(wanted) or pa.types.is_large_list(wanted) or pa.types.is_fixed_size_list(wanted):
        return _holds_null(values.flatten(), wanted.value_type, wanted.value_field.nullable)
    if pa.types.is_struct(wanted):
        return any(_holds_null(values.field(k), child.type, child.nullable) for k, child in enumerate(wanted))
    return False
