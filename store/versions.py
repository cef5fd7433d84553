"""A dataset that grows: numbered versions, appends, time travel, tags and vacuum, on any filesystem.

A dataset is a sequence of versions (a write, appends, column adds and removals, deletes of rows by a
filter). Each commit after the first write is recorded in one small JSON
file, written once and never changed::

    DST/_unihub_versions/00000001.json   {"number": 1, "operation": "write", "timestamp": ..., "tag": ...,
    DST/_unihub_versions/00000002.json    "parts": [every data file of the version, in reading order],
                                          "common_metadata": its schema file, "sources": [...],
                                          "column_sets": [], "base": ..., "added_rows": ...}

A record lists *all* the files of its version (not a difference), so reading version N reads one record.
``column_sets`` holds the version's column sets whole (:mod:`unihub.store.column_sets`: fields added to
the rows beside the parts, each with its side files): :func:`commit_columns` publishes a version that adds,
backfills or removes one, an append carries them forward, and everything that keeps or removes files
(:func:`vacuum`, :func:`remove_orphans`, ``publish.settle``) counts their files through
:func:`unihub.fs.publish.record_files`, so a backfill's old values stay for the versions that list them.

**Append** (:func:`commit_append`, used by ``write_dataset(mode="append")`` and ``convert --append``): the
rows are staged as a whole dataset (as any write), their schema checked against the latest version's
(:class:`~unihub.errors.AppendSchemaError` otherwise), the staged parts put into the dataset under names
no other run uses (``unihub-<run>-part-....parquet``: a rename on a local disk, a copy on an object store),
then the next version's record published last, in one step that refuses an existing record
(:func:`unihub.fs.publish.put_if_absent`: a hard link locally, a conditional PUT ``If-None-Match: *`` on
S3). Of two concurrent appenders one gets the number; the other reads the new latest version and tries
the next number with its parts added to it, so both land; a schema the winner changed, or 8 refusals in a
row, is a :class:`~unihub.errors.ConcurrentCommitError` and the loser's files are removed. A kill at any
moment leaves the old version or the new one: files put in place before their record are listed by no
version, and the next append or :func:`vacuum` removes them once their run is dead.

A dataset written once, by unihub, Petastorm or Spark, has no record: it is version 1 (implicit) and reads
exactly as before. The first append records version 1 first. An overwrite (``write_dataset(overwrite=True)``)
replaces the whole dataset and starts a new history at version 1 (on an object store the records of the
replaced history name their manifest's run as ``base`` and stop counting).

**Plain Parquet readers** (Spark, ``pyarrow.dataset``): an append only adds part files, so the latest
version is always a superset of the earlier ones and a plain listing of the directory reads the latest
version (files a killed append left are the exception until they are removed). A vacuum removes only files
no kept version lists, so it keeps this property. So does a delete (:func:`delete_rows`): it rewrites the files
holding the rows it deletes, and moves the replaced ones out of the directory into ``_unihub_versions/retired/``,
where older versions (and readers that opened one) find them until a vacuum removes them. Petastorm, which
takes the files' row groups from ``_common_metadata``'s JSON or a ``_metadata`` summary, finds both rewritten for
the new version by every append, delete and compaction (:mod:`unihub.store.listings`).

**Readers pin a version**: :func:`~unihub.store.dataset.open_dataset` reads the latest record's files (or
``version=``/``tag=``'s), so an append while a reader reads is simply not seen.

**Incremental conversion**: a version records, cumulatively, the source files its rows came from (path,
size, modification time, SHA-256); :func:`new_sources` tells which of a conversion's inputs are new.
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
import posixpath
import random
import re
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from unihub.errors import (
    AppendSchemaError,
    ConcurrentCommitError,
    DatasetNotFoundError,
    FilterExpressionError,
    FormatError,
    InvalidArgumentError,
    SourceChangedError,
    UnihubError,
    VersionNotFoundError,
)
from unihub.fs import atomic, publish, remote, sources
from unihub.fs import filesystem as fsutil
from unihub.petastorm.legacy import PETASTORM_UNISCHEMA_KEY, load_petastorm_unischema
from unihub.schema.metadata_json import parse_json
from unihub.schema.unischema import SCHEMA_METADATA_KEY, Unischema
from unihub.store import column_sets, file_options, integrity, listings
from unihub.store.column_sets import ColumnSet, SidePart
from unihub.store.partitions import partition_of, with_partitions

VERSIONS_DIR = publish.VERSIONS_DIR
COMMON_METADATA = publish.COMMON_METADATA
FORMAT = "unihub.version"
RECORD_VERSION = 1
#: how many times an append tries the next number after another writer took the one it wanted
COMMIT_ATTEMPTS = 8


@dataclass(frozen=True)
class SourceFile:
    """A source file a conversion read: its path or URL, size, modification time and SHA-256."""

    path: str
    size: int
    mtime_ns: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class Version:
    """One version of a dataset: its files (relative to the dataset root) and how it came to be."""

    number: int
    timestamp: str
    operation: str
    parts: tuple[str, ...]
    common_metadata: str | None
    tag: str | None = None
    base: str | None = None
    added_rows: int | None = None
    sources: tuple[SourceFile, ...] = ()
    column_sets: tuple[dict[str, Any], ...] = ()
    #: False for version 1 of a dataset that has no record yet (written once, read as it is)
    recorded: bool = True

    def as_record(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": RECORD_VERSION, "number": self.number, "timestamp": self.timestamp,
                "operation": self.operation, "tag": self.tag, "base": self.base, "added_rows": self.added_rows,
                "parts": list(self.parts), "common_metadata": self.common_metadata,
                "column_sets": [dict(s) for s in self.column_sets],
                "sources": [{"path": s.path, "size": s.size, "mtime_ns": s.mtime_ns, "sha256": s.sha256}
                            for s in self.sources]}

    def to_json(self) -> bytes:
        return json.dumps(self.as_record(), indent=1).encode()

    @classmethod
    def from_record(cls, data: dict[str, Any], where: str) -> Version:
        try:
            if data.get("format") != FORMAT or data.get("version") != RECORD_VERSION:
                raise ValueError(f"format {data.get('format')!r} version {data.get('version')!r}")
            return cls(int(data["number"]), str(data["timestamp"]), str(data["operation"]),
                       tuple(str(p) for p in data["parts"]), data.get("common_metadata"), data.get("tag"),
                       data.get("base"), data.get("added_rows"),
                       tuple(SourceFile(s["path"], int(s["size"]), s.get("mtime_ns"), s.get("sha256"))
                             for s in data.get("sources", ())),
                       tuple(data.get("column_sets", ())))
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
            raise FormatError(f"{where}: not a unihub version record this version reads ({exc})",
                              path=where) from exc

    def files(self) -> set[str]:
        """Every file this version reads, relative to the dataset root."""
        return publish.record_files(self.as_record())


def record_path(root: str, number: int) -> str:
    return f"{root.rstrip('/')}/{VERSIONS_DIR}/{number:08d}.json"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


# -- reading the history -----------------------------------------------------------------------------------
def history(fs: pafs.FileSystem, root: str) -> list[Version]:
    """The versions of the dataset at ``root``, oldest first: its records, else (a dataset never appended
    to) its one implicit version 1, else none (nothing there)."""
    root = root.rstrip("/")
    manifest = publish.read_manifest(fs, root)
    base = manifest.run if manifest is not None else None
    records = publish.version_records(fs, root, base)
    if records:
        return sorted((Version.from_record(data, f"{root}/{rel}") for rel, data in records.items()),
                      key=lambda v: v.number)
    implicit = _implicit_first(fs, root, manifest)
    return [implicit] if implicit is not None else []


def _implicit_first(fs: pafs.FileSystem, root: str, manifest: publish.Manifest | None) -> Version | None:
    """Version 1 of a dataset without records: what its manifest lists, else every data file in it."""
    if manifest is not None:
        parts, common = manifest.parts, manifest.common_metadata
    else:
        present = publish.files_under(fs, root)
        # an append's parts (named after its run) before its record: not the first write's
        parts = tuple(rel for rel in present if publish.is_data(rel) and publish.run_of(rel) is None)
        common = COMMON_METADATA if COMMON_METADATA in present else None
    if not parts:
        return None
    stamp = fs.get_file_info(f"{root}/{common or parts[-1]}").mtime
    timestamp = stamp.astimezone(timezone.utc).isoformat(timespec="milliseconds") if stamp else now()
    sets, _ = column_sets.read_record(fs, root)  # sets added before versions held them
    return Version(1, timestamp, "write", tuple(parts), common, base=manifest.run if manifest else None,
                   column_sets=sets.as_version(), recorded=False)


def resolve(fs: pafs.FileSystem, root: str, *, version: int | None = None, tag: str | None = None
            ) -> Version | None:
    """The version to read: ``version``'s or ``tag``'s, else the latest recorded one; None for a dataset
    that has no records and where none was asked (it is read as before: its manifest or its listing)."""
    _check_version_arguments(root, version, tag)
    if tag is None:
        if version is None and not _has_records(fs, root):
            return None
        found = _one_record(fs, root, version)  # one record read, not every one
        if found is not None or version is None:
            return found
    versions = history(fs, root)
    for candidate in versions:
        if (version is not None and candidate.number == version) or (tag is not None and candidate.tag == tag):
            return candidate
    asked = f"version {version}" if version is not None else f"tag {tag!r}"
    there = ", ".join(f"{v.number}" + (f" ({v.tag})" if v.tag else "") for v in versions) or "none"
    raise VersionNotFoundError(f"{root}: no {asked}; versions there: {there} (an overwrite starts a new history; "
                               "unihub vacuum removes old versions)")


def _check_version_arguments(root: str, version: Any, tag: Any) -> None:
    """``version=`` an int (not a bool) and ``tag=`` a str, not both: a named error, not a version read by
    mistake (``version=True`` was version 1)."""
    if version is not None and tag is not None:
        raise VersionNotFoundError(f"{root}: give version= or tag=, not both")
    if version is not None and (isinstance(version, bool) or not isinstance(version, numbers.Integral)):
        raise InvalidArgumentError(f"{root}: version= is a version's number (an int), got {version!r}"
                                   + ("; a version's name is tag=" if isinstance(version, str) else ""))
    if tag is not None and not isinstance(tag, str):
        raise InvalidArgumentError(f"{root}: tag= is a version's name (a str), got {tag!r}")


def _one_record(fs: pafs.FileSystem, root: str, number: int | None) -> Version | None:
    """Version ``number`` (None: the latest) of the published history, reading only its record; None where it
    is not recorded."""
    root = root.rstrip("/")
    manifest = publish.read_manifest(fs, root)
    base = manifest.run if manifest is not None else None
    names = publish.version_record_names(fs, root)
    if number is not None:
        names = [n for n in names if n == f"{VERSIONS_DIR}/{number:08d}.json"]
    for rel in reversed(names):
        record = publish.read_version_record(fs, root, rel)
        if record.get("base") == base:
            return Version.from_record(record, f"{root}/{rel}")
    return None


def _has_records(fs: pafs.FileSystem, root: str) -> bool:
    """Whether ``root`` has a records folder (one listing; most datasets have none)."""
    return fs.get_file_info(f"{root.rstrip('/')}/{VERSIONS_DIR}").type == pafs.FileType.Directory


# -- appending ----------------------------------------------------------------------------------------------
@dataclass
class _Placed:
    """What an append put into the dataset so far (removed again unless its record lands)."""

    parts: list[str] = field(default_factory=list)
    common_metadata: str | None = None


def commit_append(fs: pafs.FileSystem, staging: str, target: str, *, tag: str | None = None,
                  sources: Sequence[SourceFile] = (), added_rows: int | None = None,
                  petastorm: bool = False) -> Version:
    """Add the dataset staged in ``staging`` (part files and ``_common_metadata``) to the dataset at
    ``target`` as its next version; see the module docstring. ``target`` may be missing: the staged
    dataset becomes its version 1. ``sources``: the source files the staged rows came from (kept with the
    earlier versions' in the record). ``petastorm``: Petastorm's entries are added to ``_common_metadata``
    where it lacks them (they are kept true where it has them). ``staging`` is removed. Returns the version
    published."""
    target = target.rstrip("/")
    if fsutil.on_local_disk(fs) and not os.path.lexists(target):
        first = Version(1, now(), "write", _data_files(fs, staging), COMMON_METADATA, tag=tag,
                        added_rows=added_rows, sources=tuple(sources))
        created = _create_locally(staging, target, first)
        if created is not None:
            return created
    base = None if fsutil.on_local_disk(fs) else publish.adopt(fs, target).run  # an empty manifest for a new one
    current = history(fs, target)
    check_tag(current, tag, target)
    staged_common = f"{staging}/{COMMON_METADATA}"
    fit = check_append_schema(fs, staged_common, target, current[-1]) if current else "same"
    if current and not current[-1].recorded:  # version 1 recorded first (another appender may have)
        record_first(fs, target, current[-1])
        current = history(fs, target)
    retire_unlisted(fs, target, current)  # what a killed delete left
    remove_orphans(fs, target, current)
    placed = _Placed()
    try:
        _place(fs, staging, target, placed)
        version = _publish_record(fs, target, placed, base, tag=tag, sources=sources, added_rows=added_rows,
                                  staged_common=staged_common, fit=fit)
    except BaseException:
        for rel in [*placed.parts, *([placed.common_metadata] if placed.common_metadata else [])]:
            fsutil.remove(fs, f"{target}/{rel}")
        raise
    fsutil.remove(fs, staging)
    widened = fit == "wider" and placed.common_metadata and version.common_metadata == placed.common_metadata
    # plain readers read the schema in _common_metadata, and Petastorm the files' row groups there (or in _metadata)
    listings.follow_latest(fs, target, (version.number, version.parts), lambda: latest_parts(fs, target),
                           schema_file=placed.common_metadata if widened else None, petastorm=petastorm)
    return version


def latest_parts(fs: pafs.FileSystem, root: str) -> tuple[int, tuple[str, ...]]:
    """The latest version's number and parts (what :func:`unihub.store.listings.follow_latest` lists): one record
    read, not every one."""
    latest = _one_record(fs, root, None) or history(fs, root)[-1]
    return latest.number, latest.parts


def settled_history(fs: pafs.FileSystem, root: str, url: str, tag: str | None, doing: str) -> list[Version]:
    """The history of the dataset at ``root`` before a commit to it (a delete, a compaction, an adoption): what runs
    killed while writing it left settled first (:func:`unihub.fs.publish.settle`); a
    :class:`~unihub.errors.DatasetNotFoundError` where there is no dataset to ``doing``, and ``tag`` checked."""
    publish.settle(fs, root)
    current = history(fs, root)
    if not current:
        raise DatasetNotFoundError(f"{url}: no dataset to {doing}")
    check_tag(current, tag, root)
    return current


def recorded(fs: pafs.FileSystem, root: str, current: list[Version]) -> list[Version]:
    """``current``, the history of the dataset at ``root``, with its version 1 recorded first where it was written
    once (read again then: another committer may have recorded it)."""
    if current[-1].recorded:
        return current
    record_first(fs, root, current[-1])
    return history(fs, root)


def record_first(fs: pafs.FileSystem, target: str, implicit: Version) -> None:
    """Record version 1 of a dataset written once, with a copy of its ``_common_metadata`` of its own (an
    append that adds a field replaces the plain one)."""
    common = implicit.common_metadata
    if common == COMMON_METADATA:
        common = f"{COMMON_METADATA}.unihub-{atomic.run_id()}"
        fs.copy_file(f"{target}/{COMMON_METADATA}", f"{target}/{common}")
    if not publish.put_if_absent(fs, record_path(target, 1), replace(implicit, common_metadata=common,
                                                                     recorded=True).to_json()):
        if common != implicit.common_metadata:  # another appender recorded it first
            fsutil.remove(fs, f"{target}/{common}")


def _create_locally(staging: str, target: str, first: Version) -> Version | None:
    """A new local dataset: the record written into the staging area, which is renamed onto ``target``
    unless something is there by now (then None: append to it)."""
    common = f"{COMMON_METADATA}.unihub-{atomic.run_id()}"
    shutil.copyfile(f"{staging}/{COMMON_METADATA}", f"{staging}/{common}")
    first = replace(first, common_metadata=common)
    path = record_path(staging, 1)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(first.to_json())
    try:
        atomic.rename_noreplace(staging, target)
    except FileExistsError:
        atomic.remove(os.path.dirname(path))
        atomic.remove(f"{staging}/{common}")
        return None
    return first


def _data_files(fs: pafs.FileSystem, root: str) -> tuple[str, ...]:
    return tuple(rel for rel in publish.files_under(fs, root) if publish.is_data(rel))


def _place(fs: pafs.FileSystem, staging: str, target: str, placed: _Placed) -> None:
    """The staged data files and schema put into ``target`` under this run's names."""
    run = atomic.run_id()
    local = fsutil.on_local_disk(fs)
    for rel in _data_files(fs, staging):
        head, name = posixpath.split(rel)
        dest = posixpath.join(head, f"unihub-{run}-{name}")
        placed.parts.append(dest)
        if local:
            os.makedirs(os.path.dirname(f"{target}/{dest}"), exist_ok=True)
            os.rename(f"{staging}/{rel}", f"{target}/{dest}")
        else:
            fs.copy_file(f"{staging}/{rel}", f"{target}/{dest}")
    if fsutil.exists(fs, f"{staging}/{COMMON_METADATA}"):
        placed.common_metadata = f"{COMMON_METADATA}.unihub-{run}"
        fs.copy_file(f"{staging}/{COMMON_METADATA}", f"{target}/{placed.common_metadata}")


def _publish_record(fs: pafs.FileSystem, target: str, placed: _Placed, base: str | None, *, tag: str | None,
                    sources: Sequence[SourceFile], added_rows: int | None, staged_common: str,
                    fit: str) -> Version:
    """The next version's record, published by :func:`unihub.fs.publish.put_if_absent`; another writer's
    record in the way: read the new latest and try the number after it."""
    for attempt in range(COMMIT_ATTEMPTS):
        current = history(fs, target)
        latest = current[-1] if current else None
        if latest is not None and attempt:  # another append landed: its schema may have changed
            check_tag(current, tag, target)
            fit = check_append_schema(fs, f"{target}/{placed.common_metadata}" if placed.common_metadata
                                        else staged_common, target, latest)
        known = {s.path: s for s in (latest.sources if latest else ())}
        both = sorted(s.path for s in sources if s.path in known)
        if both:  # two incremental conversions at once: the other converted these files, they would be twice
            raise ConcurrentCommitError(f"{target}: another conversion published {len(both)} of these source "
                                        f"files meanwhile ({', '.join(both[:3])}); nothing of this one was "
                                        "published: run it again to convert what is still new")
        known.update((s.path, s) for s in sources)
        version = Version((latest.number if latest else 0) + 1, now(), "append" if latest else "write",
                          (*(latest.parts if latest else ()), *placed.parts),
                          latest.common_metadata if latest is not None and fit == "narrower"
                          else placed.common_metadata, tag=tag,
                          base=base, added_rows=added_rows, sources=tuple(known.values()),
                          column_sets=latest.column_sets if latest else ())
        if publish.put_if_absent(fs, record_path(target, version.number), version.to_json()):
            return version
        time.sleep(random.uniform(0.01, 0.05 * (attempt + 1)))
    raise ConcurrentCommitError(f"{target}: other writers took the next version {COMMIT_ATTEMPTS} times in a row; "
                                "nothing of this append was published: run it again")


# -- column sets ------------------------------------------------------------------------------------------------
def commit_columns(fs: pafs.FileSystem, root: str, base: Version,
                   sets_of: Callable[[Version], tuple[dict[str, Any], ...]], *, operation: str,
                   tag: str | None = None) -> Version:
    """Publish the next version of the dataset at ``root``: the latest's files with the column sets
    ``sets_of(latest)`` (store/columns.py: the change made from ``base``, put onto the latest version, or a
    :class:`~unihub.errors.ConcurrentCommitError` where it no longer fits), by the create-if-absent step appends
    use; another commit taking the number first is read and the next number tried, so both land. A dataset
    written once has its version 1 recorded first. Returns the version published."""
    root = root.rstrip("/")
    for attempt in range(COMMIT_ATTEMPTS):
        current = history(fs, root)
        if current and not current[-1].recorded:
            record_first(fs, root, current[-1])
            current = history(fs, root)
        if not current or current[-1].base != base.base:
            raise ConcurrentCommitError(f"{root}: the dataset was overwritten or removed while its columns were "
                                        f"being changed; nothing of the {operation} was published")
        check_tag(current, tag, root)
        latest = current[-1]
        version = replace(latest, number=latest.number + 1, timestamp=now(), operation=operation, tag=tag,
                          added_rows=0, column_sets=sets_of(latest))
        if latest.common_metadata != base.common_metadata:  # an append changed the parts' schema meanwhile
            _refuse_fields_of_parts(fs, root, latest, version, operation)
        if publish.put_if_absent(fs, record_path(root, version.number), version.to_json()):
            fsutil.remove(fs, f"{root}/{column_sets.RECORD}")  # sets from before versions: version 1 holds them
            return version
        time.sleep(random.uniform(0.01, 0.05 * (attempt + 1)))
    raise ConcurrentCommitError(f"{root}: other writers took the next version {COMMIT_ATTEMPTS} times in a row; "
                                f"nothing of the {operation} was published: run it again")


def _refuse_fields_of_parts(fs: pafs.FileSystem, root: str, latest: Version, version: Version, operation: str) -> None:
    """A :class:`~unihub.errors.ConcurrentCommitError` where a field of ``version``'s column sets is now a column of
    ``latest``'s part files (an append that added it landed meanwhile): published, no version could be opened."""
    stored = _arrow_schema(fs, f"{root}/{latest.common_metadata or latest.parts[0]}").names
    record = column_sets.of_version(version.column_sets, record_path(root, version.number))
    taken = sorted({f.name for s in record.sets for f in s.fields} & set(stored))
    if taken:
        raise ConcurrentCommitError(f"{root}: an append (version {latest.number}) added field(s) {taken} to the part "
                                    f"files meanwhile; nothing of the {operation} was published")


def check_tag(current: Sequence[Version], tag: str | None, target: str) -> None:
    """A :class:`~unihub.errors.VersionNotFoundError` where ``tag`` names one of the versions ``current`` already."""
    if tag is not None and any(v.tag == tag for v in current):
        raise VersionNotFoundError(f"{target}: tag {tag!r} names version "
                                   f"{next(v.number for v in current if v.tag == tag)} already; tags are unique")


def _arrow_schema(fs: pafs.FileSystem, path: str) -> pa.Schema:
    with fs.open_input_file(path) as handle:
        return pq.read_schema(handle)


def check_append_schema(fs: pafs.FileSystem, staged_common: str, target: str, latest: Version) -> str:
    """How the staged rows' schema compares with the latest version's: ``'same'``; ``'wider'``: it adds
    nullable fields (then it becomes the version's schema; the files before read those fields as nulls);
    ``'narrower'``: it lacks only nullable fields of the dataset's (those rows read them as nulls). Anything else (a field of another type, shape, codec or nullability, a new field that is not
    nullable, fields added on both sides, the dataset's fields in another order) is an :class:`~unihub.errors.AppendSchemaError` naming the fields.
    Metadata such as the source's name may differ."""
    old_path = f"{target}/{latest.common_metadata or latest.parts[0]}"
    old, new = _arrow_schema(fs, old_path), _arrow_schema(fs, staged_common)
    old_fields, new_fields = _unischema_fields(old), _unischema_fields(new)
    added = [n for n in new.names if n not in old.names]
    dropped = [n for n in old.names if n not in new.names]
    differ = _differing(old, new, old_fields, new_fields, added, dropped)
    if differ:
        shown = "; ".join(f"{n}: {_describe(old, old_fields, n)} in the dataset, {_describe(new, new_fields, n)} "
                          "appended" for n in sorted(differ)[:8])
        raise AppendSchemaError(f"{target}: the appended rows' schema differs from version {latest.number}'s in "
                                f"{len(differ)} field(s): {shown}. Append rows of the dataset's schema, or add "
                                "nullable fields only (convert --schema, or write_dataset with that Unischema)")
    in_sets = sorted({f.name for c in column_sets.of_version(latest.column_sets, record_path(target, latest.number)).sets
                      for f in c.fields} & set(added))
    if in_sets:  # published, no version after it could be opened
        raise AppendSchemaError(f"{target}: the appended rows hold field(s) {in_sets}, which version "
                                f"{latest.number} has as added columns (unihub columns list); append rows without "
                                "them (they read as nulls, or a backfill writes them), or remove the column set first")
    kept_order = [n for n in new.names if n in old.names]
    if kept_order != [n for n in old.names if n in new.names]:  # rows (namedtuples) would change their order
        raise AppendSchemaError(f"{target}: the appended rows' schema lists the fields of version {latest.number} in "
                                f"another order ({', '.join(kept_order)}; the dataset's: {', '.join(old.names)}). "
                                "Append with the dataset's Unischema (open_dataset(url).schema), new fields anywhere")
    return "wider" if added else "narrower" if dropped else "same"


def _differing(old: pa.Schema, new: pa.Schema, old_fields: dict[str, Any] | None, new_fields: dict[str, Any] | None,
               added: list[str], dropped: list[str]) -> set[str]:
    """The fields an append may not change so: another type, shape, codec or nullability; added or dropped
    where not nullable; added and dropped at once."""
    differ = {f.name for f in old if f.name in new.names and not new.field(f.name).equals(f)}
    if old_fields is not None and new_fields is not None:
        differ |= {n for n in old_fields.keys() & new_fields.keys() if old_fields[n] != new_fields[n]}
    differ |= {n for n in added if not _nullable(new, new_fields, n)}
    differ |= {n for n in dropped if not _nullable(old, old_fields, n)}
    if added and dropped:
        differ |= set(added) | set(dropped)
    return differ


def _nullable(schema: pa.Schema, fields: dict[str, Any] | None, name: str) -> bool:
    """Whether ``name`` may be null, as stored and in the Unischema."""
    return schema.field(name).nullable and (fields is None or name not in fields or bool(fields[name]["nullable"]))


def may_be_null(schema: pa.Schema) -> dict[str, bool]:
    """Whether each field of ``schema`` may be null, as stored and in the Unischema in its metadata."""
    fields = _unischema_fields(schema)
    return {name: _nullable(schema, fields, name) for name in schema.names}


def _unischema_fields(schema: pa.Schema) -> dict[str, Any] | None:
    """The Unischema JSON's fields by name; None where there is none, or none that can be read (the hostile
    kind included: :func:`parse_json` stops at deep nesting)."""
    raw = (schema.metadata or {}).get(SCHEMA_METADATA_KEY)
    if raw is None:
        return None
    try:
        fields = {f["name"]: f for f in parse_json(raw)["fields"]}
        return fields if all(isinstance(f, dict) and "nullable" in f for f in fields.values()) else None
    except (ValueError, KeyError, TypeError):  # SchemaError is a ValueError
        return None


def _describe(schema: pa.Schema, fields: dict[str, Any] | None, name: str) -> str:
    if fields is not None and name in fields:
        f = fields[name]
        return (f"{f['dtype']}{tuple(f['shape'])} {(f.get('codec') or {}).get('type', '')}".strip()
                + (" nullable" if f.get("nullable") else " not null")
                + ("" if name in schema.names else " in partition folders (partition_by)"))
    return str(schema.field(name).type) if name in schema.names else "absent"


# -- removing what no kept version lists -----------------------------------------------------------------
@dataclass(frozen=True)
class VacuumResult:
    """What :func:`vacuum` removed: version numbers, and files (relative to the dataset root)."""

    removed_versions: tuple[int, ...]
    removed_files: tuple[str, ...]
    kept_versions: tuple[int, ...]


def vacuum(fs: pafs.FileSystem, root: str, keep: int) -> VacuumResult:
    """Remove the versions older than the newest ``keep``, then the files only they listed (never one a kept
    version lists), and files a killed append left (named after a dead run). Records go first: a kill
    between leaves files no version lists, which the next vacuum removes."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise VersionNotFoundError(f"keep must be a whole number >= 1 (the newest versions kept), got {keep!r}")
    root = root.rstrip("/")
    current = history(fs, root)
    if not current:
        return VacuumResult((), (), ())
    if not current[-1].recorded:  # never appended to: its one version stays, what a killed column add left goes
        removed = remove_orphans(fs, root, current)
        column_sets.remove_empty_folders(fs, root)
        return VacuumResult((), tuple(removed), (1,))
    kept, dropped = current[-keep:], current[:-keep]
    # a commit killed before it rewrote them left the listings a version behind: rewritten before their files go
    listings.follow_latest(fs, root, (kept[-1].number, kept[-1].parts), lambda: latest_parts(fs, root))
    for version in dropped:
        fsutil.remove(fs, record_path(root, version.number))
    listed = {f for v in kept for f in v.files()}
    # the plain _common_metadata stays: readers that know no versions (Spark, pyarrow) read the schema there
    removed = sorted({f for v in dropped for f in v.files()} - listed - {COMMON_METADATA})
    for rel in removed:
        fsutil.remove(fs, f"{root}/{rel}")
        fsutil.remove(fs, retired_path(root, rel))
    retire_unlisted(fs, root, kept)
    removed += remove_orphans(fs, root, kept)
    column_sets.remove_empty_folders(fs, root)
    return VacuumResult(tuple(v.number for v in dropped), tuple(removed), tuple(v.number for v in kept))


#: besides data files, the files of a run that a killed run leaves: an append's schema file, a column add's side
#: files, the temporary of a listing being rewritten (store/listings.py)
_RUN_FILES = (f"{COMMON_METADATA}.unihub-", f"{column_sets.DIRECTORY}/", f".{COMMON_METADATA}.unihub-",
              f".{publish.SUMMARY_METADATA}.unihub-")


def remove_orphans(fs: pafs.FileSystem, root: str, versions: Sequence[Version]) -> list[str]:
    """Remove the files at ``root`` that no version lists and a dead run of an append or a column add put there
    (named ``unihub-<run>-...``); a live run's are left alone. ``versions``: those to keep (their files and the
    files of every record read after the listing are kept). Returns those removed.

    Of a dataset without records (never appended to) only side files and temporaries go: a dead run's data file
    there may be the one copy of rows whose version records were lost (a copy without ``_unihub_versions/``)."""
    if not versions:
        return []
    recorded = versions[-1].recorded
    present = publish.files_under(fs, root)
    # the history read again after the listing: an append that published meanwhile (and whose process may have
    # ended since) keeps its files
    newest = versions[-1].number
    later = [v for v in history(fs, root) if v.number > newest]
    listed = {f for v in [*versions, *later] for f in v.files()}
    removed = []
    for rel in present:
        if rel in listed or rel.startswith(f"{VERSIONS_DIR}/"):
            continue
        run = publish.run_of(rel)
        leftover = (recorded and publish.is_data(rel)) or rel.startswith(_RUN_FILES)
        if run is not None and leftover and not publish.run_alive(run):
            fsutil.remove(fs, f"{root}/{rel}")
            removed.append(rel)
    if fsutil.on_local_disk(fs):  # (an object store's settle warned already)
        publish.warn_foreign(root, _foreign(present, listed))
    return removed


def foreign_files(fs: pafs.FileSystem, root: str, current: Sequence[Version] | None = None) -> list[str]:
    """The data files in the dataset's folder that no version lists and unihub did not write (another tool's, a
    Spark append: unihub's readers skip them, plain readers read them), by name; ``current``: its history, read
    already. A dataset written once on a local disk has none (every file in it is its version 1)."""
    root = root.rstrip("/")
    present = publish.files_under(fs, root)
    if current is None:
        latest = _one_record(fs, root, None)
        if latest is not None and not _foreign(present, latest.files()):
            return []  # the usual case: the latest record read, not every one
        current = history(fs, root)  # a killed delete's replaced parts are an older version's
    return sorted(_foreign(present, {f for v in current for f in v.files()}))


def _foreign(present: Iterable[str], listed: set[str]) -> list[str]:
    return [rel for rel in present if rel not in listed and publish.run_of(rel) is None and publish.is_data(rel)]


# -- incremental conversion ---------------------------------------------------------------------------------
def describe_source(path: str, *, checksum: bool = True) -> SourceFile:
    """A source file's size, modification time and (``checksum``) SHA-256, read through its filesystem: for a
    URL the conversion's (:func:`unihub.fs.sources.filesystem`), which knows the endpoint its source URL's query
    named (``?endpoint_override=``); the bare file URL alone went to AWS instead."""
    fs, resolved = sources.filesystem(path) if sources.is_url(path) else fsutil.resolve_filesystem(path)
    info = fs.get_file_info(resolved)
    if info.type != pafs.FileType.File:
        raise FormatError(f"{path}: not a file", path=path)
    digest = None
    if checksum:
        sha = hashlib.sha256()
        with fs.open_input_stream(resolved) as handle:
            while chunk := handle.read(8 * 2**20):
                sha.update(chunk)
        digest = sha.hexdigest()
    return SourceFile(path, int(info.size or 0), info.mtime_ns, digest)


def new_sources(paths: Iterable[str], converted: Sequence[SourceFile]) -> list[SourceFile]:
    """The source files of ``paths`` not yet in the dataset (with their checksums), in order; those that
    are unchanged are left out. A file converted before whose size or modification time differs is hashed:
    the same SHA-256 (a file touched or copied again) counts as converted; another is a
    :class:`~unihub.errors.SourceChangedError` naming every such file (the conversion refuses before it
    writes anything: the dataset cannot hold both contents of one file, and dropping the new one silently
    would lose rows). Only new files and changed-looking ones are read for their checksum."""
    known = {s.path: s for s in converted}
    fresh_files, changed = [], []
    for path in paths:
        before = known.get(path)
        if before is None:
            fresh_files.append(describe_source(path))
            continue
        now = describe_source(path, checksum=False)
        if (now.size, now.mtime_ns) == (before.size, before.mtime_ns):
            continue
        digest = describe_source(path).sha256
        if before.sha256 is None or digest != before.sha256:
            changed.append(f"{path} ({before.size:,} bytes when converted, {now.size:,} now)")
    if changed:
        raise SourceChangedError(f"{len(changed)} source file(s) changed since they were converted: "
                                 f"{'; '.join(changed[:10])}. Their rows in the dataset are the old contents; "
                                 "convert the new contents under a new file name (or rewrite the dataset)")
    return fresh_files


def converted_sources(fs: pafs.FileSystem, root: str) -> list[SourceFile]:
    """The source files the dataset's latest version holds rows of (none where it records none)."""
    current = history(fs, root)  # (a missing root has none)
    return list(current[-1].sources) if current else []


# -- by URL (the CLI's and the public API's) ---------------------------------------------------------------
def list_versions(url: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None,
                  filesystem: Any = None) -> list[Version]:
    """The versions of the dataset at ``url``, oldest first (one, implicit, for a dataset never appended to)."""
    fs, root = fsutil.resolve_filesystem(os.fspath(url), filesystem, storage_options)
    with remote.remote_errors(os.fspath(url)):
        publish.fresh(fs, root)
        if fs.get_file_info(root).type == pafs.FileType.NotFound:
            raise DatasetNotFoundError(f"{os.fspath(url)}: no such dataset")
        return history(fs, root)


def vacuum_dataset(url: str | os.PathLike[str], keep: int, *, storage_options: dict[str, Any] | None = None,
                   filesystem: Any = None) -> VacuumResult:
    """:func:`vacuum` the dataset at ``url`` (what killed runs left is settled first)."""
    fs, root = fsutil.resolve_filesystem(os.fspath(url), filesystem, storage_options)
    with remote.remote_errors(os.fspath(url)):
        publish.fresh(fs, root)
        if fs.get_file_info(root).type == pafs.FileType.NotFound:
            raise DatasetNotFoundError(f"{os.fspath(url)}: no such dataset")
        publish.settle(fs, root)
        return vacuum(fs, root, keep)


# -- deleting rows ---------------------------------------------------------------------------------------------
#: where a file that a newer version no longer lists is moved, beside the records (readers of older versions
#: find it there): ``<root>/_unihub_versions/retired/<its path>``
RETIRED_DIR = publish.RETIRED_DIR


def retired_path(root: str, rel: str) -> str:
    return f"{root.rstrip('/')}/{RETIRED_DIR}/{rel}"


def delete_rows(url: str | os.PathLike[str], where: Any, *, tag: str | None = None,
                storage_options: dict[str, Any] | None = None, filesystem: Any = None) -> Version | None:
    """Delete the rows for which ``where`` (a ``pyarrow.compute`` expression on the stored columns, e.g.
    ``pc.field("id") < 100``, added ones too, null where a set does not cover a part; a null result keeps the row)
    holds, as a new version: each part file holding such rows is rewritten without them under a new name, files
    left empty are dropped, the version's record is published last, and the replaced files move to
    ``_unihub_versions/retired/`` (older versions read them there, and ``vacuum`` removes them), so a plain listing
    of the directory stays the latest version. The side files of the version's column sets for a rewritten part
    are rewritten too, without the same rows and with the new part's row groups; the replaced ones stay where
    they are (``_unihub_columns/`` is no part of a plain listing) for the older versions, until ``vacuum``. Returns the new
    version, or None where no row matched (nothing is written). Another commit landing meanwhile (its rows not
    looked at) is a :class:`~unihub.errors.ConcurrentCommitError`, and nothing of the delete is published."""
    if not isinstance(where, pc.Expression):  # group.filter would take a mask, or say 'should be array-like'
        raise FilterExpressionError(f"{os.fspath(url)}: delete_rows takes a pyarrow.compute expression "
                                    f"(pc.field('id') < 100), not {type(where).__name__} {where!r} (text such as "
                                    "'id < 100' is for the command line's unihub delete --where)")
    fs, root = fsutil.resolve_filesystem(os.fspath(url), filesystem, storage_options)
    root = root.rstrip("/")
    with remote.remote_errors(os.fspath(url)):
        current = recorded(fs, root, settled_history(fs, root, os.fspath(url), tag, "delete rows from"))
        retire_unlisted(fs, root, current)
        remove_orphans(fs, root, current)
        return _delete(fs, root, current[-1], where, tag)


def _delete(fs: pafs.FileSystem, root: str, latest: Version, where: Any, tag: str | None) -> Version | None:
    run = atomic.run_id()
    record = column_sets.of_version(latest.column_sets, record_path(root, latest.number))
    replaced: dict[str, str | None] = {}  # a part of latest -> its rewritten file (None: no row left)
    sides: dict[tuple[str, str], SidePart] = {}  # (set, rewritten part) -> its rewritten side file
    written: list[str] = []
    removed = 0
    seen = _FilterColumns.of(fs, root, latest)
    try:
        for n, rel in enumerate(latest.parts):
            head, name = posixpath.split(rel)
            new_rel = posixpath.join(head, f"unihub-{run}-d{n:05d}-{RUN_PREFIX.sub('', name)}")
            rewrite = _PartRewrite(fs, root, rel, new_rel, _side_targets(record, rel, run, n), seen)
            kept, dropped = rewrite.run(where, written)
            if dropped:
                replaced[rel] = new_rel if kept else None
                removed += dropped
                sides.update(((s, new_rel), entry) for s, entry in rewrite.new_sides.items())
    except BaseException:
        discard(fs, root, written)
        raise
    if not replaced:
        return None
    parts = tuple(p for p in (replaced.get(rel, rel) for rel in latest.parts) if p is not None)
    version = replace(latest, number=latest.number + 1, timestamp=now(), operation="delete", tag=tag,
                      parts=parts, added_rows=-removed, column_sets=_sets_after(record, replaced, sides))
    publish_rewrite(fs, root, version, list(replaced), written)
    return version


def publish_rewrite(fs: pafs.FileSystem, root: str, version: Version, replaced: Sequence[str],
                    written: Sequence[str]) -> None:
    """Publish ``version``, whose new files (``written``, relative to ``root``: a delete's or a compaction's) replace
    the parts ``replaced`` of the version before it: a copy of each replaced part beside the records first (a kill
    leaves every version readable), the record by create-if-absent, then the replaced parts out of the directory (a
    plain listing is the latest version). Another commit taking the number first is a
    :class:`~unihub.errors.ConcurrentCommitError`; on any failure the new files go, and the copies that no other
    commit needs."""
    retired: list[str] = []
    try:
        for rel in replaced:
            retired.append(rel)
            try:
                retire(fs, root, rel)
            except FileNotFoundError:  # out of the directory: a commit that replaced it published meanwhile
                raise ConcurrentCommitError(f"{root}: another commit replaced {rel} meanwhile; nothing of this "
                                            f"{version.operation} was published: run it again") from None
        if not publish.put_if_absent(fs, record_path(root, version.number), version.to_json()):
            raise ConcurrentCommitError(f"{root}: another commit published version {version.number} meanwhile; "
                                        f"nothing of this {version.operation} was published: run it again")
    except BaseException:
        discard(fs, root, written, _still_listed(fs, root, retired))
        raise
    # before the files they list now go
    listings.follow_latest(fs, root, (version.number, version.parts), lambda: latest_parts(fs, root))
    for rel in replaced:
        # the copy again: a refused rewrite of the same part (a delete or compaction at once) may have removed the
        # one this found in place, while the latest version still listed the part
        with suppress(FileNotFoundError):  # (gone: another commit retired it, its copy in place)
            retire(fs, root, rel)
        fsutil.remove(fs, f"{root}/{rel}")


def _still_listed(fs: pafs.FileSystem, root: str, retired: Sequence[str]) -> list[str]:
    """Of the parts a refused rewrite retired, those the latest version still lists (still in the directory: their
    copies are no version's). A part the commit that won replaced keeps its copy, the same file its older versions
    read now; where the latest cannot be read, every copy stays (a vacuum removes it with its part)."""
    try:
        latest = _one_record(fs, root, None)
    except (OSError, UnihubError):
        return []
    return [rel for rel in retired if latest is not None and rel in latest.parts]


def discard(fs: pafs.FileSystem, root: str, written: Sequence[str], retired: Sequence[str] = ()) -> None:
    """Remove what a rewrite that is not published left: its new files, and the copies of parts it retired (those
    parts are still in the directory: the copies are no version's)."""
    for rel in written:
        fsutil.remove(fs, f"{root}/{rel}")
    for rel in retired:
        fsutil.remove(fs, retired_path(root, rel))
    column_sets.remove_empty_folders(fs, root)


#: the prefix of a file this run wrote (a delete's d00000-, a compaction's c00000-): what a rewrite's name drops
RUN_PREFIX = re.compile(r"^unihub-[0-9a-f]{8}-\d+-\d+-[0-9a-f]{6}-([dc]\d{5}-)?")


@dataclass(frozen=True)
class _SideTarget:
    """A column set of the version a delete starts from, for one part: its side file (None: the set does not cover
    the part), where the side file's rewrite goes, and the set's fields as stored (nulls where it does not cover)."""

    name: str
    side: SidePart | None
    new_rel: str
    storage: pa.Schema


def _side_targets(record: column_sets.Record, rel: str, run: str, n: int) -> list[_SideTarget]:
    """Each column set of ``record`` for the part ``rel`` (the ``n``-th of the version), its rewrite named for ``run``."""
    targets = []
    for column_set in record.sets:
        side = column_set.parts.get(rel)
        folder = posixpath.dirname(side.file) if side is not None else column_sets.DIRECTORY
        base = RUN_PREFIX.sub("", posixpath.basename(side.file if side is not None else rel))
        storage = Unischema(column_set.name, column_set.fields).as_parquet_schema(with_metadata=False)
        targets.append(_SideTarget(column_set.name, side, f"{folder}/unihub-{run}-d{n:05d}-{base}", storage))
    return targets


def _sets_after(record: column_sets.Record, replaced: dict[str, str | None],
                sides: dict[tuple[str, str], SidePart]) -> tuple[dict[str, Any], ...]:
    """``record``'s column sets after a delete: the entries of the ``replaced`` parts give way to those of their
    rewrites (``sides``: set and new part -> side file); a part left with no row has none."""
    sets = []
    for column_set in record.sets:
        parts: dict[str, SidePart] = {}
        for rel, side in column_set.parts.items():
            if rel not in replaced:
                parts[rel] = side
                continue
            new_rel = replaced[rel]
            if new_rel is not None and (column_set.name, new_rel) in sides:
                parts[new_rel] = sides[(column_set.name, new_rel)]
        sets.append(ColumnSet(column_set.name, column_set.fields, parts))
    return column_sets.Record(tuple(sets)).as_version()


@dataclass
class _SideRewrite:
    """A side file of the part being rewritten (opened), the sets that read it (several where small sets were folded
    into one file: store/columns.py), their columns in it, and where its rewrite goes."""

    targets: list[_SideTarget]
    file: pq.ParquetFile
    path: str

    @property
    def names(self) -> list[str]:
        return [n for t in self.targets for n in t.storage.names]

    @property
    def new_rel(self) -> str:
        return self.targets[0].new_rel  # the same for every set of the file (its folder and name)


class _PartRewrite:
    """One part of the version a delete starts from, joined 1:1 by row group with its column sets' side files (the
    sets' fields null where a set does not cover it, as reading does): the predicate sees the added columns too, and
    the part and each of its side files are rewritten without the same rows, their row groups still aligned."""

    def __init__(self, fs: pafs.FileSystem, root: str, rel: str, new_rel: str, targets: list[_SideTarget],
                 seen: _FilterColumns) -> None:
        self.fs, self.root, self.rel, self.new_rel, self.targets, self.seen = fs, root, rel, new_rel, targets, seen
        #: set name -> the side file written for the rewritten part (sets that covered the part)
        self.new_sides: dict[str, SidePart] = {}
        #: where the part is (in the directory, or retired beside the records for an older version)
        self.source_path = f"{root}/{rel}"

    def run(self, where: Any, written: list[str]) -> tuple[int, int]:
        """Write the rows for which ``where`` does not hold (a null result keeps the row) to the new part and side
        files, row group by row group (one in memory at a time), with each file's schema, metadata and
        compression; ``written`` grows by each file before it is written. (rows kept, rows dropped); nothing is
        written where none matched, nor where none is left."""
        fs = self.fs
        with ExitStack() as stack:
            self.source_path = located(fs, self.root, self.rel)
            source = self._open(stack, self.source_path)
            size = fs.get_file_info(self.source_path).size
            by_file: dict[str, list[_SideTarget]] = {}
            for t in self.targets:
                if t.side is not None and (t.side.rows, t.side.part_bytes) == (source.metadata.num_rows, size):
                    by_file.setdefault(t.side.file, []).append(t)
            covered = [_SideRewrite(ts, self._open(stack, f"{self.root}/{file}"), f"{self.root}/{file}")
                       for file, ts in by_file.items()]
            uncovered = [t for t in self.targets if not any(t is x for c in covered for x in c.targets)]
            needs_sides = bool(self.targets) and _names_added(source.schema_arrow, where)
            counts = [self._matching(self._group(source, i, covered if needs_sides else [],
                                                 uncovered if needs_sides else []), where)
                      for i in range(source.metadata.num_row_groups)]
            dropped = sum(counts)
            kept = source.metadata.num_rows - dropped
            if not dropped or not kept:
                return kept, dropped
            self._write(source, covered, uncovered if needs_sides else [], counts, where, written)
            part_bytes = int(fs.get_file_info(f"{self.root}/{self.new_rel}").size or 0)
            self.new_sides.update((t.name, SidePart(side.new_rel, kept, part_bytes))
                                  for side in covered for t in side.targets)
        return kept, dropped

    def _matching(self, group: pa.Table, where: Any) -> int:
        """The rows of ``group`` for which ``where`` holds; a filter that cannot be evaluated on them (a name
        that is no field, a comparison of other types) is a :class:`~unihub.errors.FilterExpressionError`."""
        try:
            return int(group.filter(where).num_rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise FilterExpressionError(f"{self.root}: the delete's filter {where} cannot be evaluated on the rows "
                                        f"of {self.rel}: {exc}") from None

    def _open(self, stack: ExitStack, path: str) -> pq.ParquetFile:
        return integrity.open_file(stack.enter_context(self.fs.open_input_file(path)), path)

    def _group(self, source: pq.ParquetFile, i: int, covered: list[_SideRewrite],
               uncovered: list[_SideTarget]) -> pa.Table:
        """Row group ``i`` of the part with the columns of the ``covered`` sets' side files and nulls for those of
        the ``uncovered`` sets, in storage form."""
        group = integrity.read_group(source, self.source_path, i)
        for side in covered:
            if i >= side.file.metadata.num_row_groups or side.file.metadata.row_group(i).num_rows != group.num_rows:
                raise FormatError(f"{side.path}: its row groups are not its part's ({self.rel}, row group {i})",
                                  path=side.path)
            table = integrity.read_group(side.file, side.path, i, side.names)
            for name in side.names:
                group = group.append_column(table.schema.field(name), table.column(name))
        for target in uncovered:
            for fld in target.storage:
                group = group.append_column(fld, pa.nulls(group.num_rows, fld.type))
        return self.seen.complete(group, self.rel)

    def _write(self, source: pq.ParquetFile, covered: list[_SideRewrite], uncovered: list[_SideTarget],
               counts: list[int], where: Any, written: list[str]) -> None:
        keep = ~where | where.is_null()
        # each file as it was: its schema (a side file's columns of the sets that read it), compression
        outputs = [(self.new_rel, source, source.schema_arrow, False)] + [
            (side.new_rel, side.file, pa.schema([side.file.schema_arrow.field(n) for n in side.names],
                                                metadata=side.file.schema_arrow.metadata), True)
            for side in covered]
        with ExitStack() as writing:  # closed (the files complete) before their sizes are read
            writers = []
            for rel, model, schema, is_side in outputs:
                written.append(rel)
                if is_side:
                    self.fs.create_dir(posixpath.dirname(f"{self.root}/{rel}"), recursive=True)
                writers.append(writing.enter_context(pq.ParquetWriter(
                    f"{self.root}/{rel}", schema, filesystem=self.fs, store_schema=True, **file_options.like(model),
                    **integrity.WRITE_OPTIONS)))
            for i, matched in enumerate(counts):
                group = self._group(source, i, covered, uncovered if matched else [])
                group = group.filter(keep) if matched else group
                if not group.num_rows:
                    continue
                for writer, (_, _, schema, _) in zip(writers, outputs):
                    writer.write_table(pa.table([group.column(n) for n in schema.names], schema=schema),
                                       row_group_size=group.num_rows)


@dataclass(frozen=True)
class _FilterColumns:
    """What a delete's filter sees of a part beside its own and its sets' columns, as reading shows them: the
    version's stored fields the part lacks (an append added them after it, or lacked them) as nulls, and the
    values of its partition folders. (The files written keep only their own columns.)"""

    stored: pa.Schema
    schema: Unischema | None

    @classmethod
    def of(cls, fs: pafs.FileSystem, root: str, latest: Version) -> _FilterColumns:
        stored = _arrow_schema(fs, f"{root}/{latest.common_metadata or latest.parts[0]}")
        raw = (stored.metadata or {}).get(SCHEMA_METADATA_KEY)
        pickled = (stored.metadata or {}).get(PETASTORM_UNISCHEMA_KEY)
        try:
            schema = Unischema.from_json(raw) if raw is not None else \
                load_petastorm_unischema(pickled) if pickled is not None else None
        except UnihubError:
            schema = None  # partition values are then not seen: a filter naming one fails as before
        return cls(stored, schema)

    def complete(self, group: pa.Table, rel: str) -> pa.Table:
        for fld in self.stored:
            if fld.name not in group.column_names:
                group = group.append_column(fld.with_nullable(True), pa.nulls(group.num_rows, fld.type))
        return with_partitions(group, self.schema, partition_of("", rel)) if self.schema is not None else group


def _names_added(schema: pa.Schema, where: Any) -> bool:
    """Whether ``where`` names a column the part files do not hold (an added one: the side files are read)."""
    try:
        schema.empty_table().filter(where)
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError):
        return True
    return False


def retire(fs: pafs.FileSystem, root: str, rel: str) -> None:
    """A copy of ``rel`` beside the records (a hard link on a local disk: the same file, no bytes copied)."""
    target = retired_path(root, rel)
    if fsutil.on_local_disk(fs):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            os.link(f"{root}/{rel}", target)
        except FileExistsError:
            pass
        return
    if not fsutil.exists(fs, target):
        fs.copy_file(f"{root}/{rel}", target)


def located(fs: pafs.FileSystem, root: str, rel: str) -> str:
    """Where the file ``rel`` of some version is: in the directory, else retired beside the records."""
    path = f"{root.rstrip('/')}/{rel}"
    if fs.get_file_info(path).type == pafs.FileType.File:
        return path
    return retired_path(root, rel)


def retire_unlisted(fs: pafs.FileSystem, root: str, versions: Sequence[Version]) -> list[str]:
    """Finish what a delete killed after publishing left: files in the directory that the latest version no
    longer lists but an older one does, and that have their retired copy, leave the directory."""
    if not versions or not versions[-1].recorded:
        return []
    latest = set(versions[-1].parts)
    older = {p for v in versions[:-1] for p in v.parts} - latest
    moved = []
    for rel in sorted(older):
        if fsutil.exists(fs, f"{root}/{rel}") and fsutil.exists(fs, retired_path(root, rel)):
            fsutil.remove(fs, f"{root}/{rel}")
            moved.append(rel)
    return moved
