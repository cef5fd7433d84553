"""Compaction: a dataset grown by many small appends rewritten into fewer parts, as a version of its own.

A dataset that grows by a day of data at a time ends as hundreds of small part files, each with its column
sets' side files beside it; a reader then opens and reads two or more files per row group where a dataset
written at once opens one, and that per-file work (opening, footers, Python glue between reads) is what makes
such a dataset slower to read (docs/benchmarks.md, "A dataset that grows"). :func:`compact_dataset` (``unihub
compact``) does what Lance's ``compact_files`` and Delta's ``OPTIMIZE`` do: runs of consecutive small parts
(same folder, same schema, the same column sets covering them) are copied into one part each, row group by row
group (their boundaries kept, so each side file stays aligned 1:1), and the run's side files into one side file
per new part holding every set's columns. The rows, their order and every value stay as they were.

It is a version like a delete (:func:`unihub.store.versions.delete_rows`): the new files are written under
names of this run, the replaced parts are copied beside the records first (``_unihub_versions/retired/``,
a hard link on a local disk), the record is published last by create-if-absent, then the replaced parts leave
the directory (a plain listing stays the latest version). Older versions read their files where they are
kept until ``vacuum`` removes them; a kill at any moment leaves the old version or the new one; another commit
landing meanwhile is a :class:`~unihub.errors.ConcurrentCommitError` and nothing is published.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from unihub.errors import ConcurrentCommitError, FormatError, InvalidArgumentError
from unihub.fs import atomic, remote
from unihub.fs import filesystem as fsutil
from unihub.runtime.memory import DEFAULT_PART_SIZE_MB, is_amount
from unihub.schema.unischema import SCHEMA_METADATA_KEY, Unischema, UnischemaField
from unihub.store import column_sets, file_options, integrity, versions
from unihub.store.column_sets import ColumnSet, SidePart
from unihub.store.dataset import read_metadata


@dataclass(frozen=True)
class _Part:
    """A part of the version compacted: its path (relative), where it is, size, schema, and the column sets
    covering it, each with its side file for the part."""

    rel: str
    path: str
    size: int
    schema: pa.Schema
    sides: tuple[tuple[ColumnSet, str], ...]

    def joins(self, run: Sequence[_Part], target: int) -> bool:
        """Whether this part may join ``run`` (same folder, schema and sets, the whole under ``target`` bytes)."""
        first = run[0]
        return (posixpath.dirname(self.rel) == posixpath.dirname(first.rel) and _same_schema(self.schema, first.schema)
                and [s.name for s, _ in self.sides] == [s.name for s, _ in first.sides]
                and sum(p.size for p in run) + self.size <= target)


def _same_schema(one: pa.Schema, other: pa.Schema) -> bool:
    """The same columns and Unischema; other metadata (a conversion's source, in ``unihub.extra``) may differ: the
    joined part keeps its first part's (the version records keep every conversion's sources)."""
    return one.remove_metadata().equals(other.remove_metadata()) and \
        (one.metadata or {}).get(SCHEMA_METADATA_KEY) == (other.metadata or {}).get(SCHEMA_METADATA_KEY)


@remote.naming_url("url")
def compact_dataset(url: str | os.PathLike[str], *, target_mb: float = DEFAULT_PART_SIZE_MB,
                    tag: str | None = None, storage_options: dict[str, Any] | None = None,
                    filesystem: Any = None) -> versions.Version | None:
    """Rewrite the runs of small parts of the dataset at ``url`` into parts of up to ``target_mb`` each, with their
    column sets' side files joined likewise, as its next version (tagged ``tag``); see the module docstring.
    Returns the version, or None where no two parts could be joined (nothing is written)."""
    if not is_amount(target_mb):
        raise InvalidArgumentError(f"target_mb must be a positive number of megabytes, got {target_mb!r}")
    fs, root = fsutil.resolve_filesystem(os.fspath(url), filesystem, storage_options)
    root = root.rstrip("/")
    with remote.remote_errors(os.fspath(url)):
        current = versions.recorded(fs, root, versions.settled_history(fs, root, os.fspath(url), tag, "compact"))
        versions.retire_unlisted(fs, root, current)
        versions.remove_orphans(fs, root, current)
        try:
            return _compact(fs, root, current[-1], int(target_mb * 2**20), tag)
        except FileNotFoundError as exc:  # a part left the directory: a delete (or compaction) replaced it meanwhile
            raise ConcurrentCommitError(f"{url}: a part of version {current[-1].number} was replaced while it was "
                                        f"being compacted ({exc}); nothing of the compaction was published: run it "
                                        "again") from None


def _compact(fs: pafs.FileSystem, root: str, latest: versions.Version, target: int,
             tag: str | None) -> versions.Version | None:
    record = column_sets.of_version(latest.column_sets, versions.record_path(root, latest.number))
    runs = _runs([_part_of(fs, root, rel, record) for rel in latest.parts], target)
    if not any(len(run) > 1 for run in runs):
        return None
    run_id = atomic.run_id()
    written: list[str] = []
    replaced: dict[str, str] = {}  # a part of latest -> the part it is now in
    new_sides: dict[tuple[str, str], SidePart] = {}  # (set, new part) -> its side file
    try:
        for n, run in enumerate(runs):
            if len(run) > 1:
                new_rel, sides = _write_run(fs, root, run, run_id, n, written)
                replaced.update((p.rel, new_rel) for p in run)
                new_sides.update(((name, new_rel), side) for name, side in sides.items())
    except BaseException:
        versions.discard(fs, root, written)
        raise
    parts = tuple(dict.fromkeys(replaced.get(rel, rel) for rel in latest.parts))
    version = replace(latest, number=latest.number + 1, timestamp=versions.now(), operation="compact", tag=tag,
                      parts=parts, added_rows=0, column_sets=_sets_after(record, replaced, new_sides))
    versions.publish_rewrite(fs, root, version, list(replaced), written)
    return version


def _part_of(fs: pafs.FileSystem, root: str, rel: str, record: column_sets.Record) -> _Part:
    """Part ``rel`` of the version: where it is, its size and schema, the sets covering it."""
    path = versions.located(fs, root, rel)
    info = fs.get_file_info(path)
    size = int(info.size or 0)
    footer = read_metadata(fs, path, size, mtime_ns=info.mtime_ns)  # a damaged footer: a FormatError naming it
    schema = footer.schema.to_arrow_schema()
    sides = tuple((s, side.file) for s in record.sets
                  if (side := s.parts.get(rel)) is not None and (side.rows, side.part_bytes) == (footer.num_rows, size))
    return _Part(rel, path, size, schema, sides)


def _runs(parts: list[_Part], target: int) -> list[list[_Part]]:
    """The parts in order, cut into runs that may be joined (a run of one is left as it is)."""
    runs: list[list[_Part]] = []
    for part in parts:
        if runs and part.joins(runs[-1], target):
            runs[-1].append(part)
        else:
            runs.append([part])
    return runs


def _write_run(fs: pafs.FileSystem, root: str, run: list[_Part], run_id: str, n: int, written: list[str]
               ) -> tuple[str, dict[str, SidePart]]:
    """The parts of ``run`` copied into one new part, row group by row group, and their side files into one
    side file of every covering set's columns; returns the new part and each set's entry for it."""
    head, name = posixpath.split(run[0].rel)
    new_rel = posixpath.join(head, f"unihub-{run_id}-c{n:05d}-{versions.RUN_PREFIX.sub('', name)}")
    covering = [s for s, _ in run[0].sides]
    fields: list[UnischemaField] = [f for s in covering for f in s.fields]
    side_rel = "/".join(p for p in (column_sets.DIRECTORY, covering[0].name, head,
                                    f"unihub-{run_id}-c{n:05d}-{versions.RUN_PREFIX.sub('', name)}") if p) \
        if covering else None
    rows = 0
    with ExitStack() as writing:
        written.append(new_rel)
        parts_out = writing.enter_context(_writer(fs, f"{root}/{new_rel}", run[0]))
        sides_out = None
        if side_rel is not None:
            fs.create_dir(posixpath.dirname(f"{root}/{side_rel}"), recursive=True)
            written.append(side_rel)
            side_schema = Unischema(covering[0].name, fields).as_parquet_schema()
            sides_out = writing.enter_context(pq.ParquetWriter(
                f"{root}/{side_rel}", side_schema, filesystem=fs, store_schema=True,
                **column_sets.writer_options(fields, "snappy"), **integrity.WRITE_OPTIONS))
        for part in run:
            rows += _copy_part(fs, root, part, parts_out, sides_out)
    part_bytes = int(fs.get_file_info(f"{root}/{new_rel}").size or 0)
    if side_rel is None:
        return new_rel, {}
    return new_rel, {s.name: SidePart(side_rel, rows, part_bytes) for s in covering}


def _writer(fs: pafs.FileSystem, path: str, model: _Part) -> pq.ParquetWriter:
    """A writer of a part like ``model``: its schema and metadata, each column's compression, dictionaries, pages."""
    with fs.open_input_file(model.path) as handle:
        options = file_options.like(integrity.open_file(handle, model.path))
    return pq.ParquetWriter(path, model.schema, filesystem=fs, store_schema=True, **options, **integrity.WRITE_OPTIONS)


def _copy_part(fs: pafs.FileSystem, root: str, part: _Part, parts_out: pq.ParquetWriter,
               sides_out: pq.ParquetWriter | None) -> int:
    """Part ``part``'s row groups appended to ``parts_out`` as they are, and its sets' columns, each from its own
    side file, to ``sides_out`` (the same boundaries); returns its rows."""
    with ExitStack() as stack:
        source = integrity.open_file(stack.enter_context(fs.open_input_file(part.path)), part.path)
        by_file: dict[str, tuple[pq.ParquetFile, list[str]]] = {}
        for column_set, rel in part.sides:  # a file may hold a set's old values too (a fold, then a backfill)
            if rel not in by_file:
                by_file[rel] = (integrity.open_file(stack.enter_context(fs.open_input_file(f"{root}/{rel}")),
                                                    f"{root}/{rel}"), [])
            by_file[rel][1].extend(f.name for f in column_set.fields)
        for g in range(source.metadata.num_row_groups):
            group = integrity.read_group(source, part.path, g)
            parts_out.write_table(group, row_group_size=max(1, group.num_rows))
            if sides_out is None:
                continue
            columns: dict[str, pa.ChunkedArray] = {}
            for rel, (side, names) in by_file.items():
                if g >= side.metadata.num_row_groups or side.metadata.row_group(g).num_rows != group.num_rows:
                    raise FormatError(f"{root}/{rel}: its row groups are not its part's ({part.rel}, row group {g})",
                                      path=f"{root}/{rel}")
                table = integrity.read_group(side, f"{root}/{rel}", g, names)
                columns.update((n, table.column(n)) for n in names)
            sides_out.write_table(pa.table([columns[n] for n in sides_out.schema.names], schema=sides_out.schema),
                                  row_group_size=max(1, group.num_rows))
        return source.metadata.num_rows


def _sets_after(record: column_sets.Record, replaced: dict[str, str],
                new_sides: dict[tuple[str, str], SidePart]) -> tuple[dict[str, Any], ...]:
    """``record``'s sets after the compaction: the entries of the parts joined give way to the new part's."""
    sets = []
    for column_set in record.sets:
        parts = {rel: side for rel, side in column_set.parts.items() if rel not in replaced}
        parts.update((new, side) for (name, new), side in new_sides.items() if name == column_set.name)
        sets.append(ColumnSet(column_set.name, column_set.fields, parts))
    return column_sets.Record(tuple(sets)).as_version()
