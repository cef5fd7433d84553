"""The listings of a dataset's files that readers knowing no versions go by, kept true at every commit.

Petastorm 0.13.1 reads the data files a listing of the directory finds, and takes their row groups from a
``_metadata`` summary where there is one (every file's row groups in one footer, as Spark and Petastorm's
``materialize_dataset`` write it: a file the summary lacks is skipped, its rows silently missing), else from the
``dataset-toolkit.num_row_groups_per_file.v1`` JSON in ``_common_metadata`` (a file it lacks fails the read
with a ``KeyError``). An append, a delete and a compaction change the files, so after each publishes its version
:func:`follow_latest` rewrites both for the latest version's parts: the JSON where ``_common_metadata`` has it
(with a pickled Unischema of the fields every part stores: Petastorm reads each of its fields from every file),
the summary where there is one
(removed where the parts' schemas differ, so it cannot list them all: Petastorm then goes by the JSON). Each is
replaced atomically. A dataset with neither is not touched (one small read of ``_common_metadata`` per commit).

A kill after a version is published and before its listings are rewritten leaves them listing the version
before (a plain reader fails on or misses the new files) until the next commit or vacuum of the dataset rewrites
them (a vacuum does before it removes any file); a failure to rewrite them is a warning, not an error: the
version is published, and running the commit again would add its rows twice.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from unihub.errors import SchemaError, UnihubError
from unihub.fs import atomic
from unihub.fs import filesystem as fsutil
from unihub.fs.publish import COMMON_METADATA, SUMMARY_METADATA
from unihub.petastorm.legacy import PETASTORM_ROW_GROUPS_KEY, PETASTORM_UNISCHEMA_KEY, load_petastorm_unischema
from unihub.petastorm.pickling import dumps_petastorm_unischema
from unihub.schema.metadata_json import parse_json
from unihub.schema.unischema import SCHEMA_METADATA_KEY, Unischema
from unihub.store import _footer

#: the two ``_common_metadata`` entries Petastorm 0.13.1 reads: its pickled Unischema and the row groups per file
PETASTORM_KEYS = (PETASTORM_UNISCHEMA_KEY, PETASTORM_ROW_GROUPS_KEY)

#: how often :func:`follow_latest` rewrites the listings for a version that another commit overtook meanwhile
_FOLLOW_ATTEMPTS = 8


def follow_latest(fs: pafs.FileSystem, root: str, published: tuple[int, Sequence[str]],
                  latest: Callable[[], tuple[int, Sequence[str]]], *, schema_file: str | None = None,
                  petastorm: bool = False) -> None:
    """Rewrite the listings of the dataset at ``root`` for ``published`` (a version's number and parts, relative to
    ``root``), then again for ``latest()`` (the latest version's) until it is the version they list: another
    commit's rewrite may have been of an older version (its writer asked before this one landed). A dataset with
    no listing is not looked at further (its history is not read). ``schema_file`` (relative to ``root``): an
    append widened the schema to this file's, which becomes the plain ``_common_metadata``. ``petastorm``: add
    Petastorm's entries where ``_common_metadata`` lacks them (``write_dataset(mode="append",
    petastorm_compatible=True)``)."""
    number, parts = published
    try:
        if schema_file is None and not petastorm and not has_listings(fs, root):
            return
        for _ in range(_FOLLOW_ATTEMPTS):
            rewrite_listings(fs, root, parts, schema_file=schema_file, petastorm=petastorm)
            newest, parts = latest()
            if newest == number:
                return
            number = newest
    except (OSError, pa.ArrowException, UnihubError) as exc:
        warnings.warn(f"{root}: version {number} is published, but the listings Petastorm and Spark read "
                      f"({COMMON_METADATA}, {SUMMARY_METADATA}) could not be rewritten for it: {exc}. They list an "
                      "older version until the next commit or vacuum of the dataset", UserWarning, stacklevel=3)


def has_listings(fs: pafs.FileSystem, root: str) -> bool:
    """Whether the dataset at ``root`` has a ``_metadata`` summary or Petastorm's row-group JSON."""
    root = root.rstrip("/")
    if fsutil.exists(fs, f"{root}/{SUMMARY_METADATA}"):
        return True
    common_path = f"{root}/{COMMON_METADATA}"
    return fsutil.exists(fs, common_path) and PETASTORM_ROW_GROUPS_KEY in (_schema_of(fs, common_path).metadata or {})


def rewrite_listings(fs: pafs.FileSystem, root: str, parts: Sequence[str], *, schema_file: str | None = None,
                     petastorm: bool = False) -> None:
    """The listings of :func:`follow_latest`, rewritten for ``parts`` (a dataset without any is left as it is, but
    for ``schema_file``, which replaces ``_common_metadata`` all the same)."""
    root = root.rstrip("/")
    common_path = f"{root}/{COMMON_METADATA}"
    plain = _schema_of(fs, common_path) if fsutil.exists(fs, common_path) else None
    new = _schema_of(fs, f"{root}/{schema_file}") if schema_file is not None else plain
    entries = dict(plain.metadata or {}) if plain is not None else {}
    listed = new is not None and (PETASTORM_ROW_GROUPS_KEY in entries or petastorm)
    footers = _Footers(fs, root)
    if fsutil.exists(fs, f"{root}/{SUMMARY_METADATA}"):
        _replace_summary(fs, root, parts, footers)
    if new is None or (not listed and schema_file is None):
        return
    kept = {k: v for k, v in (new.metadata or {}).items() if k not in PETASTORM_KEYS}
    if listed:
        known = _known_counts(entries)
        lacking = _lacking(footers, [rel for rel in parts if rel not in known], new.names)
        pickled = _without(entries.get(PETASTORM_UNISCHEMA_KEY), lacking) or _petastorm_unischema(kept, root, lacking)
        kept.update(_petastorm_entries(parts, known, pickled, footers))
    replace_common_metadata(fs, root, new.with_metadata(kept))


def _lacking(footers: _Footers, parts: Sequence[str], stored: Sequence[str]) -> frozenset[str]:
    """The ``stored`` columns (the dataset's, partition keys aside) that one of ``parts`` lacks: Petastorm reads
    every field of its Unischema from every file, and a part an append wrote without a nullable field, or a part
    from before an append added one, fails its read (its rows cannot be made)."""
    lacking: set[str] = set()
    for footer in footers.of(parts).values():
        lacking |= set(stored) - set(footer.schema.to_arrow_schema().names)
    return frozenset(lacking)


def _without(pickled: bytes | None, lacking: frozenset[str]) -> bytes | None:
    """Petastorm's pickled Unischema without the ``lacking`` fields (``pickled`` itself where it has none of them);
    None where there is none, or it cannot be read to take them out."""
    if pickled is None or not lacking:
        return pickled
    try:
        schema = load_petastorm_unischema(pickled)
        return dumps_petastorm_unischema(Unischema(schema.name, [f for f in schema if f.name not in lacking]))
    except UnihubError:
        return None


def _petastorm_entries(parts: Sequence[str], known: Mapping[str, int], pickled: bytes | None,
                       footers: _Footers) -> dict[bytes, bytes]:
    """Petastorm's two entries: ``pickled`` (its Unischema) and the row groups of each of ``parts`` (``known`` ones
    as listed, the others from their footers); none where there is no ``pickled``."""
    if pickled is None:
        return {}
    read = footers.row_groups([rel for rel in parts if rel not in known])
    return petastorm_entries(pickled, {rel: known[rel] if rel in known else read[rel] for rel in parts})


def petastorm_entries(pickled: bytes, counts: Mapping[str, int]) -> dict[bytes, bytes]:
    """The entries of :data:`PETASTORM_KEYS`: the pickled Unischema, and ``counts`` (row groups per file, paths
    relative to the dataset root) as Petastorm's JSON."""
    return {PETASTORM_UNISCHEMA_KEY: pickled, PETASTORM_ROW_GROUPS_KEY: json.dumps(dict(counts)).encode()}


def _known_counts(entries: Mapping[bytes, bytes]) -> dict[str, int]:
    """The row groups per file the JSON lists already (a part's name is never reused for other rows); nothing where
    it is not such a JSON object."""
    try:
        counts = parse_json(entries.get(PETASTORM_ROW_GROUPS_KEY, b"{}"))
    except SchemaError:  # not UTF-8, not JSON, nested past the recursion limit: every count read again
        return {}
    if not isinstance(counts, dict):
        return {}
    return {k: v for k, v in counts.items() if isinstance(k, str) and type(v) is int and v >= 0}


def _petastorm_unischema(entries: Mapping[bytes, bytes], root: str, lacking: frozenset[str]) -> bytes | None:
    """Petastorm's pickled Unischema of the schema whose unihub JSON is in ``entries``, without the ``lacking``
    fields; None (with a warning) where there is none or Petastorm cannot read one of its fields: Petastorm then
    refuses to open the dataset by name."""
    try:
        schema = Unischema.from_json(entries[SCHEMA_METADATA_KEY])
        return dumps_petastorm_unischema(Unischema(schema.name, [f for f in schema if f.name not in lacking]))
    except (KeyError, UnihubError) as exc:
        warnings.warn(f"{root}: Petastorm's metadata is removed from {COMMON_METADATA}: the dataset's new schema has "
                      f"no form Petastorm 0.13.1 reads ({exc!s:.300})", UserWarning, stacklevel=4)
        return None


def _schema_of(fs: pafs.FileSystem, path: str) -> pa.Schema:
    with fs.open_input_file(path) as handle:
        return pq.read_schema(handle)


def _footers(fs: pafs.FileSystem, root: str, parts: Sequence[str]) -> dict[str, pq.FileMetaData]:
    """The footers of ``parts`` (relative to ``root``), read in threads (each is a request on an object store)."""
    def read(rel: str) -> pq.FileMetaData:
        with fs.open_input_file(f"{root}/{rel}") as handle:
            return pq.read_metadata(handle)

    if len(parts) <= 1:
        return {rel: read(rel) for rel in parts}
    with ThreadPoolExecutor(max_workers=min(16, len(parts))) as pool:
        return dict(zip(parts, pool.map(read, parts)))


class _Footers:
    """The footers of a dataset's parts, each read once in a rewrite of its listings (the summary and Petastorm's
    JSON both want a new part's)."""

    def __init__(self, fs: pafs.FileSystem, root: str) -> None:
        self._fs, self._root = fs, root
        self._read: dict[str, pq.FileMetaData] = {}
        self._row_groups: dict[str, int] = {}  # as read: a summary grows the footer it starts from

    def of(self, parts: Sequence[str]) -> dict[str, pq.FileMetaData]:
        """The footers of ``parts`` (relative to the root), in their order; those not read yet read now."""
        read = _footers(self._fs, self._root, [rel for rel in parts if rel not in self._read])
        self._read.update(read)
        self._row_groups.update((rel, footer.num_row_groups) for rel, footer in read.items())
        return {rel: self._read[rel] for rel in parts}

    def row_groups(self, parts: Sequence[str]) -> dict[str, int]:
        """How many row groups each of ``parts`` holds."""
        self.of(parts)
        return {rel: self._row_groups[rel] for rel in parts}


def _replace_summary(fs: pafs.FileSystem, root: str, parts: Sequence[str], footers: _Footers) -> None:
    """``_metadata`` listing the row groups of ``parts``: the summary there is, grown by the parts it lacks where it
    lists the ones before them (an append's), else made from every part's footer (the summary is made by changing
    the footers it joins, so they are read here); removed where their schemas differ (no summary can list them all)
    or there are none."""
    try:
        combined = _grown_summary(fs, root, parts, footers)
        if combined is None:
            combined = summary_of(list(footers.of(parts).values()), parts, root)
    except SchemaError:
        combined = None
    if combined is None:
        fsutil.remove(fs, f"{root}/{SUMMARY_METADATA}")
        return
    replace_atomically(fs, root, SUMMARY_METADATA, combined.write_metadata_file)


def _grown_summary(fs: pafs.FileSystem, root: str, parts: Sequence[str], footers: _Footers) -> pq.FileMetaData | None:
    """The ``_metadata`` summary at ``root`` with the row groups of the parts it lacks appended (their footers
    read, not the others': a dataset that grows by appends reads one summary and the new footers per commit),
    where it lists, in order, the first of ``parts`` and nothing else; None where it does not (a delete's or a
    compaction's parts, a summary another tool wrote of other files, or none that can be read)."""
    try:
        with fs.open_input_file(f"{root}/{SUMMARY_METADATA}") as handle:
            combined = pq.read_metadata(handle)
        if _footer.problem(combined) is not None:
            return None
        listed: list[str] = []  # the files in the order of their row groups
        for k in range(combined.num_row_groups):
            group = combined.row_group(k)
            path = group.column(0).file_path if group.num_columns else ""
            if not listed or listed[-1] != path:
                listed.append(path)
    except (OSError, pa.ArrowException):
        return None
    if not listed or listed != list(parts[:len(listed)]):
        return None
    new = parts[len(listed):]
    return _appended(combined, list(footers.of(new).values()), new, root, listed[0])


def summary_of(footers: Sequence[pq.FileMetaData], paths: Sequence[str], root: str) -> pq.FileMetaData | None:
    """One footer holding the row groups of every file, each marked with its path (relative to the dataset
    ``root``), as a ``_metadata`` summary holds them; None for no files. A :class:`SchemaError` naming the file
    whose schema differs from the first's. The footers given are changed (their row groups' paths)."""
    if not footers:
        return None
    footers[0].set_file_path(paths[0])
    return _appended(footers[0], footers[1:], paths[1:], root, paths[0])


def _appended(combined: pq.FileMetaData, footers: Sequence[pq.FileMetaData], paths: Sequence[str], root: str,
              first: str) -> pq.FileMetaData:
    """``combined`` (a summary whose first file is ``first``) with the row groups of ``footers`` appended, marked
    with ``paths``; a :class:`SchemaError` naming a file whose schema differs."""
    for footer, path in zip(footers, paths):
        footer.set_file_path(path)
        try:
            combined.append_row_groups(footer)
        except (RuntimeError, ValueError, pa.ArrowException) as exc:  # "AppendRowGroups requires equal schemas"
            raise SchemaError(f"{root}/{path}: its Parquet schema differs from {root}/{first}'s, so no "
                              f"{SUMMARY_METADATA} file can list both: {exc}") from exc
    return combined


def replace_common_metadata(fs: pafs.FileSystem, root: str, arrow_schema: pa.Schema) -> None:
    """Write ``root/_common_metadata`` (the schema and its key-value metadata, no rows), atomically; a stale Hadoop
    checksum (``._common_metadata.crc``) is removed, as Petastorm does."""
    replace_atomically(fs, root, COMMON_METADATA, lambda out: pq.write_metadata(arrow_schema, out))
    fsutil.remove(fs, fsutil.join(root, f".{COMMON_METADATA}.crc"))


def replace_atomically(fs: pafs.FileSystem, root: str, name: str, write: Callable[[pa.NativeFile], None]) -> None:
    """``root/name`` replaced by what ``write`` writes: under a hidden name of this run first (the next commit
    removes one a killed run left: :func:`unihub.store.versions.remove_orphans`), then moved onto it."""
    target = fsutil.join(root, name)
    temporary = fsutil.join(root, f".{name}.unihub-{atomic.run_id()}.tmp")
    try:
        with fs.open_output_stream(temporary) as out:
            write(out)
        fs.move(temporary, target)
    except BaseException:
        fsutil.remove(fs, temporary)
        raise
