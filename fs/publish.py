"""Putting a written output in place: :func:`commit` (and :func:`settle`, after a killed run) renames it
on a local disk (:mod:`unihub.fs.atomic`) and publishes it on an object store, as below.

Publishing a dataset on an object store (no rename there): parts first, one manifest written last.

Layout of a dataset ``DST`` that unihub wrote on S3, GCS or any filesystem that is not this machine's::

    DST/unihub-<run>-part-00000.parquet   the data files of run <run>, under names no other run uses
    DST/_common_metadata.unihub-<run>     that run's schema and metadata
    DST/_unihub_manifest.json             what is published: {"run", "parts", "common_metadata"}
    DST/_common_metadata                  a copy of the published run's, for readers that know no manifest

``<run>`` is ``<where>-<pid>-<start>-<random>`` (:func:`unihub.fs.atomic.run_id`), so the next run
can tell the files of a live run from those a killed one left. :func:`publish` copies a staged dataset's
files in under their run names, then writes the manifest in one PUT (an object store's one atomic
step), then deletes what the manifest no longer lists. Readers (:func:`unihub.store.dataset.open_dataset`)
read only what the manifest lists, so a kill at any moment leaves the old or the new dataset readable in
full, and :func:`settle` (before the next write) deletes what no published manifest or live run owns: files
named after a dead run, and files that were there before the manifest was written (an overwrite killed before
its clean-up). A file unihub did not name that came after it (another tool's append) is kept, named in a warning.

A destination without a manifest (a first write, Petastorm's or Spark's Parquet) first gets one that
lists what it holds (nothing, for a new destination: readers then see no dataset until the run publishes).
A foreign format's export has no manifest: its files are copied into place one by one and old ones
deleted after (:func:`publish_files`), a window in which a reader may see both.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs as pafs

from unihub.errors import DatasetChangedError, FormatError
from unihub.fs import atomic, remote
from unihub.fs import filesystem as fsutil
from unihub.fs.uploads import abort_uploads, uploading
from unihub.schema.metadata_json import parse_json

MANIFEST = "_unihub_manifest.json"
COMMON_METADATA = "_common_metadata"
#: the summary file Spark and Hadoop tools read (and Petastorm writes): every data file's row groups in one footer
SUMMARY_METADATA = "_metadata"
#: columns added beside the parts (store/column_sets.py): the record lists its files under "files"
COLUMNS_RECORD = "_unihub_columns.json"
#: a dataset's version records (:mod:`unihub.store.versions`): ``<root>/_unihub_versions/<number>.json``
VERSIONS_DIR = "_unihub_versions"
#: where a file a newer version no longer lists is kept for the older ones: ``<root>/_unihub_versions/retired/<rel>``
RETIRED_DIR = f"{VERSIONS_DIR}/retired"
VERSION = 1
_RUN = re.compile(r"unihub-(?P<run>[0-9a-f]{8}-\d+-\d+-[0-9a-f]{6})")


@dataclass(frozen=True)
class Manifest:
    """A published dataset: its data files and ``_common_metadata`` (relative to the dataset root)."""

    run: str | None
    parts: tuple[str, ...]
    common_metadata: str | None

    def to_json(self) -> bytes:
        return json.dumps({"format": "unihub.manifest", "version": VERSION, "run": self.run,
                           "parts": list(self.parts), "common_metadata": self.common_metadata}).encode()


def read_manifest(fs: pafs.FileSystem, root: str, forget_cached: bool = True) -> Manifest | None:
    """The manifest published at ``root``, or None where there is none (a dataset read as before);
    ``forget_cached=False``: what fsspec cached of root is kept (a listing just taken, fresh already)."""
    path = f"{root.rstrip('/')}/{MANIFEST}"
    if forget_cached:
        fresh(fs, root)
    try:
        with fs.open_input_stream(path) as handle:
            data = handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        raise exc
    try:
        found = parse_json(data)
        if found.get("version") != VERSION:
            raise ValueError(f"version {found.get('version')!r}")
        if not isinstance(found.get("run"), (str, type(None))):
            raise ValueError(f"run {found.get('run')!r}")
        parts = tuple(_relative_paths(found["parts"], "parts"))
        common = found.get("common_metadata")
        return Manifest(found.get("run"), parts, None if common is None else relative_path(common, "common_metadata"))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FormatError(f"{path}: not a unihub manifest this version reads ({exc})", path=path) from exc


def relative_path(rel: Any, key: str) -> str:
    """``rel``, a path relative to a dataset root as unihub writes them in manifests and records: names joined by
    '/', none empty, '.' or '..', no NUL. Anything else (an absolute path, one climbing out of the root) is a
    ValueError naming ``key``: a hostile record must not make a vacuum delete, or a reader read, a file outside
    the dataset."""
    if not isinstance(rel, str) or "\0" in rel or any(name in ("", ".", "..") for name in rel.split("/")):
        raise ValueError(f"{key}: {rel!r} is not a path inside the dataset")
    return rel


def _relative_paths(rels: Any, key: str) -> list[str]:
    """A JSON list of paths relative to a dataset root (:func:`relative_path`)."""
    if not isinstance(rels, list):
        raise ValueError(f"{key}: {type(rels).__name__}, not a list")
    return [relative_path(rel, key) for rel in rels]


def _check_record(record: dict[str, Any]) -> None:
    """That a version record's values are of the types unihub writes, and its files are inside the dataset."""
    _relative_paths(record.get("parts"), "parts")
    if record.get("common_metadata") is not None:
        relative_path(record["common_metadata"], "common_metadata")
    for key in ("base", "tag", "timestamp", "operation"):
        if not isinstance(record.get(key), (str, type(None))):
            raise ValueError(f"{key}: {record.get(key)!r}, not a string")
    for key in ("number", "added_rows"):
        if not isinstance(record.get(key), (int, type(None))) or isinstance(record.get(key), bool):
            raise ValueError(f"{key}: {record.get(key)!r}, not a whole number")
    sets, sources = record.get("column_sets", []), record.get("sources", [])
    if not isinstance(sets, list) or not isinstance(sources, list) or not all(
            isinstance(s, dict) for s in [*sets, *sources]):
        raise ValueError("column_sets or sources: not a list of objects")
    for entry in sets:
        _relative_paths(entry.get("files", []), "column_sets' files")
        side = entry.get("parts", {})
        if not isinstance(side, dict) or not all(isinstance(s, dict) for s in side.values()):
            raise ValueError("column_sets' parts: not an object of objects")
        for rel, s in side.items():
            relative_path(rel, "column_sets' parts")
            relative_path(s.get("file"), "column_sets' parts")


def _write_manifest(fs: pafs.FileSystem, root: str, manifest: Manifest) -> None:
    with fs.open_output_stream(f"{root.rstrip('/')}/{MANIFEST}") as handle:
        handle.write(manifest.to_json())


def _files(fs: pafs.FileSystem, root: str) -> list[str]:
    """Every file under ``root``, relative to it (one recursive listing)."""
    return sorted(_file_infos(fs, root))


def _file_infos(fs: pafs.FileSystem, root: str) -> dict[str, pafs.FileInfo]:
    """Every file under ``root`` (relative to it) and its listing entry (one recursive listing)."""
    root = root.rstrip("/")
    fresh(fs, root)
    selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
    try:
        listing = fs.get_file_info(selector)
    except NotADirectoryError:  # fsspec: made between its "is it a folder?" and "does it exist?": ask again
        fresh(fs, root)
        listing = fs.get_file_info(selector)
    return {e.path[len(root):].lstrip("/"): e for e in listing if e.type == pafs.FileType.File}


def _is_data(rel: str) -> bool:
    return not any(part.startswith(("_", ".")) for part in rel.split("/"))


def fresh(fs: pafs.FileSystem, root: str) -> None:
    """Forget what an fsspec filesystem cached about ``root`` (s3fs keeps listings and ETags: a manifest
    replaced since would read as "no longer exists", a listing would miss new parts)."""
    handler = getattr(fs, "handler", None)
    invalidate = getattr(getattr(handler, "fs", None), "invalidate_cache", None)
    if invalidate is not None:
        invalidate(root)


def is_dataset(fs: pafs.FileSystem, staged: str) -> bool:
    """Whether the staged directory holds a Parquet dataset (then :func:`publish`), not an export's files."""
    return any(rel == COMMON_METADATA or rel.endswith(".parquet") for rel in _files(fs, staged))


def publish(fs: pafs.FileSystem, staged: str, target: str) -> list[str]:
    """Publish the dataset staged in ``staged`` at ``target``; see the module docstring.
    Returns the published data files' paths, in reading order; ``staged`` is removed."""
    target = target.rstrip("/")
    run = atomic.run_id()
    staged_files = _files(fs, staged)
    previous = _adopt(fs, target)
    parts: list[str] = []
    common = f"{COMMON_METADATA}.unihub-{run}" if COMMON_METADATA in staged_files else None
    try:
        for rel in sorted(r for r in staged_files if _is_data(r)):
            head, name = posixpath.split(rel)
            published = posixpath.join(head, f"unihub-{run}-{name}")
            parts.append(published)
            fs.copy_file(f"{staged}/{rel}", f"{target}/{published}")
        if common is not None:
            fs.copy_file(f"{staged}/{COMMON_METADATA}", f"{target}/{common}")
        _write_manifest(fs, target, Manifest(run, tuple(parts), common))  # the one step that publishes
    except BaseException:
        # an upload of the manifest whose last step the server runs late would publish the files removed
        # next: aborted first (the old manifest stays published)
        _abort_quietly(fs, f"{target}/{MANIFEST}")
        for rel in [*parts, *([common] if common else [])]:  # this live run's files: no settle removes them
            fsutil.remove(fs, f"{target}/{rel}")
        raise
    if common is not None:
        fs.copy_file(f"{target}/{common}", f"{target}/{COMMON_METADATA}")
    _remove_unlisted(fs, target, replaced=previous.run, overwrote=True)
    fsutil.remove(fs, f"{target}/{SUMMARY_METADATA}")  # the replaced dataset's (it lists the files just removed)
    fsutil.remove(fs, staged)
    return [f"{target}/{p}" for p in parts]


def _abort_quietly(fs: pafs.FileSystem, path: str) -> None:
    """Abort the uploads open at ``path``; where the store fails too, the failure already under way is
    the one to report."""
    try:
        abort_uploads(fs, path)
    except Exception as exc:
        if not remote.is_remote_failure(exc):
            raise


def publish_files(fs: pafs.FileSystem, staged: str, target: str) -> None:
    """Put an export's staged files (a directory) or file at ``target``, replacing what was there: each
    file is one atomic copy; old files the new export does not have are deleted after."""
    info = fs.get_file_info(staged)
    if info.type == pafs.FileType.File:
        if fs.get_file_info(target).type == pafs.FileType.Directory:
            fs.delete_dir(target)
        fs.copy_file(staged, target)
        fs.delete_file(staged)
        return
    target = target.rstrip("/")
    if fs.get_file_info(target).type == pafs.FileType.File:
        fs.delete_file(target)
    new = _files(fs, staged)
    for rel in new:
        fs.copy_file(f"{staged}/{rel}", f"{target}/{rel}")
    keep = set(new)
    for rel in _files(fs, target):
        if rel not in keep:
            fs.delete_file(f"{target}/{rel}")
    fsutil.remove(fs, staged)


def _settle_object_store(fs: pafs.FileSystem, target: str) -> None:
    """Delete what killed runs left at ``target`` on an object store: their staging prefixes beside it
    (multipart uploads still open there aborted), and files inside it that the published manifest does
    not list (never those of a live run)."""
    target = target.rstrip("/")
    parent, name = posixpath.split(target)
    if parent:
        prefix = f".{name}.unihub-tmp-"
        selector = pafs.FileSelector(parent, recursive=False, allow_not_found=True)
        staged = {posixpath.basename(entry.path.rstrip("/")) for entry in fs.get_file_info(selector)}
        # a staging area whose only trace is an upload still open (its parts are no listed object)
        staged |= {path[len(parent) + 1:].split("/")[0] for path in uploading(fs, f"{parent}/{prefix}")}
        for base in sorted(staged):
            if base.startswith(prefix) and not _alive(base[len(prefix):]):
                fsutil.discard(fs, f"{parent}/{base}")  # its open uploads aborted, then its files removed
    manifest = read_manifest(fs, target)
    if manifest is None:
        return
    if _remove_unlisted(fs, target) and not manifest.parts and not version_records(fs, target, manifest.run):
        fsutil.remove(fs, target)  # a first write that was never published: nothing is left of it


def _adopt(fs: pafs.FileSystem, target: str) -> Manifest:
    """``target``'s manifest; one listing what it holds is written first where it has none."""
    found = read_manifest(fs, target)
    if found is not None:
        return found
    present = _files(fs, target)
    parts = tuple(rel for rel in present if _is_data(rel))
    adopted = Manifest(None, parts, COMMON_METADATA if COMMON_METADATA in present else None)
    _write_manifest(fs, target, adopted)
    return adopted


def _remove_unlisted(fs: pafs.FileSystem, target: str, replaced: str | None = None, overwrote: bool = False) -> bool:
    """Delete the files at ``target`` that its manifest does not list and no live run owns (``replaced``:
    a run whose dataset was just replaced, done whether its process lives or not); True when no live run
    has files there. A file unihub did not name after a run is deleted only where ``overwrote`` (the dataset
    was just replaced) or it was there before the manifest was written (a killed overwrite left it): one
    written since is another tool's (a Spark append), kept and named in a warning."""
    manifest = read_manifest(fs, target)
    if manifest is None:
        return False
    present = _file_infos(fs, target)
    published = present[MANIFEST].mtime if MANIFEST in present else None
    # the records read after the listing: an append whose record lands meanwhile keeps its files (one still
    # under way keeps them as a live run)
    listed = {*manifest.parts, MANIFEST, COMMON_METADATA, manifest.common_metadata,
              *versioned_files(fs, target, manifest.run)}
    # the columns added to the dataset (store/column_sets.py) stay through a clean-up; a new dataset drops them,
    # and the replaced history's files, even those a live run (this process: an add, an append) wrote
    columns = _columns_files(fs, target)
    if replaced is None:  # (a _metadata summary stays: every commit rewrites it for its version, store/listings.py)
        listed |= {*columns, SUMMARY_METADATA}
    else:
        columns |= versioned_files(fs, target, replaced)
    live = False
    foreign = []
    for rel, info in sorted(present.items()):
        if rel in listed:
            continue
        found = _RUN.search(posixpath.basename(rel))
        if found is not None and found["run"] not in (manifest.run, replaced) and rel not in columns \
                and _alive(found["run"]):
            live = True
            continue
        if found is None and not overwrote and not _predates(info, published):
            foreign.append(rel)  # another tool's, written since the dataset was published: not unihub's to delete
            continue
        fs.delete_file(f"{target}/{rel}")
    warn_foreign(target, [rel for rel in foreign if is_data(rel)])
    return not live


def _predates(info: pafs.FileInfo, published: Any) -> bool:
    """Whether a file was there before the manifest was written (a file of what that publication replaced); in the
    same second (object stores keep whole seconds) or not known: False, the file is kept."""
    return info.mtime is not None and published is not None and info.mtime < published


def warn_foreign(root: str, files: Sequence[str]) -> None:
    """A warning naming the data files at ``root`` that no version lists and unihub did not write (another tool
    appended them): they are left where they are, and unihub's readers do not read them."""
    if files:
        warnings.warn(f"{root}: {len(files)} data file(s) that no version of the dataset lists and unihub did not "
                      f"write ({', '.join(files[:3])}{', ...' if len(files) > 3 else ''}): left as they are, and not "
                      "read by unihub's readers (plain readers such as Spark's read them). Adopt them as a version "
                      "(unihub adopt, adopt_files), add rows through unihub (write_dataset(mode='append'), unihub "
                      "convert --append), or move the files out",
                      UserWarning, stacklevel=2)


def _columns_files(fs: pafs.FileSystem, target: str) -> set[str]:
    """The column-set record and the files it lists (store/column_sets.py), relative to ``target``."""
    path = f"{target}/{COLUMNS_RECORD}"
    try:
        with fs.open_input_stream(path) as handle:
            files = json.loads(handle.read())["files"]
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) or fs.get_file_info(path).type == pafs.FileType.NotFound:
            return set()
        raise  # not known: nothing is removed
    return {COLUMNS_RECORD, *(str(f) for f in files)}


def run_of(name: str) -> str | None:
    """The run named in a file name unihub gave (``unihub-<run>-...``), else None."""
    found = _RUN.search(posixpath.basename(name))
    return found["run"] if found is not None else None


def run_alive(run: str) -> bool:
    """Whether the run named ``<where>-<pid>-<start>-<random>`` may still be at work."""
    return _alive(run)


def _alive(run: str) -> bool:
    """Whether the run named ``<where>-<pid>-<start>-<random>`` may still be at work."""
    match = re.fullmatch(r"([0-9a-f]{8})-(\d+)-(\d+)-[0-9a-f]{6}", run)
    if match is None:
        return True  # not a name unihub makes: never touched
    return atomic.owner_alive(match[1], int(match[2]), int(match[3]))


# -- version records: the files they keep, and publishing one (the rest is unihub.store.versions) ----------
def record_files(record: dict[str, Any]) -> set[str]:
    """The files (relative to the dataset root) one version record lists: its parts, its
    ``_common_metadata`` copy and the files of its column sets."""
    files = {*record.get("parts", ()), *(f for s in record.get("column_sets", ()) for f in s.get("files", ()))}
    if record.get("common_metadata"):
        files.add(record["common_metadata"])
    return files


def version_records(fs: pafs.FileSystem, root: str, base: str | None) -> dict[str, dict[str, Any]]:
    """The version records at ``root`` (relative path -> parsed JSON) that belong to the published history:
    those whose ``base`` is ``base`` (the manifest's run; an overwrite starts a history of its own). A record
    that is not JSON is a FormatError naming it."""
    found = {}
    for rel in version_record_names(fs, root):
        record = read_version_record(fs, root, rel)
        if record.get("base") == base:
            found[rel] = record
    return found


def version_record_names(fs: pafs.FileSystem, root: str) -> list[str]:
    """The version records at ``root`` (paths relative to it), oldest first (one listing)."""
    root = root.rstrip("/")
    return [f"{VERSIONS_DIR}/{rel}" for rel in files_under(fs, f"{root}/{VERSIONS_DIR}")
            if re.fullmatch(r"\d{8}\.json", rel)]


def read_version_record(fs: pafs.FileSystem, root: str, rel: str) -> dict[str, Any]:
    """One version record (``rel`` from :func:`version_record_names`), parsed; not JSON: a FormatError."""
    path = f"{root.rstrip('/')}/{rel}"
    raw = _read_listed(fs, path)
    try:
        record = parse_json(raw)
        if not isinstance(record, dict):
            raise ValueError("not an object")
        _check_record(record)
    except ValueError as exc:
        raise FormatError(f"{path}: not a unihub version record ({exc})", path=path) from exc
    return record


def _read_listed(fs: pafs.FileSystem, path: str) -> bytes:
    """The bytes of a file a listing just showed; an fsspec filesystem that says it is missing (its cache of
    the folder older than the listing) forgets everything it cached and is asked again."""
    try:
        with fs.open_input_stream(path) as handle:
            return handle.read()
    except FileNotFoundError:
        invalidate = getattr(getattr(getattr(fs, "handler", None), "fs", None), "invalidate_cache", None)
        if invalidate is None:
            raise
        invalidate()
        with fs.open_input_stream(path) as handle:
            return handle.read()


def versioned_files(fs: pafs.FileSystem, root: str, base: str | None) -> set[str]:
    """The records of ``root``'s published history and every file they list (kept by :func:`settle`)."""
    records = version_records(fs, root, base)
    files = {f for record in records.values() for f in record_files(record)}
    return {*records, *files, *(f"{RETIRED_DIR}/{f}" for f in files)}


def files_under(fs: pafs.FileSystem, root: str) -> list[str]:
    """Every file under ``root``, relative to it (one recursive listing; none where it is missing)."""
    return _files(fs, root)


def is_data(rel: str) -> bool:
    """Whether a path relative to a dataset root names a data file (no part starts with '_' or '.')."""
    return _is_data(rel)


def adopt(fs: pafs.FileSystem, target: str) -> Manifest:
    """``target``'s manifest, written first where it has none (listing what it holds: maybe nothing)."""
    return _adopt(fs, target)


#: a claim (:func:`put_if_absent` where the store has no conditional write) older than this is a dead one
CLAIM_STALE_SECONDS = 600.0


def put_if_absent(fs: pafs.FileSystem, path: str, data: bytes) -> bool:
    """Write ``data`` at ``path`` unless something is there; False when something was (or another writer
    claimed it at the same moment). One atomic step where the filesystem has one: a hard link on a local
    disk (``os.link`` refuses an existing name), a conditional PUT (``If-None-Match: *``) through an fsspec
    filesystem whose ``pipe_file`` takes ``mode="create"`` (s3fs). Elsewhere (pyarrow's own S3 and GCS
    clients have no conditional write) a check after writing: the writer PUTs a claim beside ``path``,
    lists the claims, and writes ``path`` only if its claim is the only one and ``path`` is absent (of two
    writers at most one sees only its own claim, the listing being consistent after a write; both may be
    refused, and retry)."""
    if fsutil.on_local_disk(fs):
        return _link_if_absent(path, data)
    handler_fs = getattr(getattr(fs, "handler", None), "fs", None)
    if handler_fs is not None and _creates_exclusively(handler_fs):
        try:
            handler_fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        return True
    return _claim_and_put(fs, path, data)


def _link_if_absent(path: str, data: bytes) -> bool:
    temporary = f"{path}.unihub-{atomic.run_id()}.tmp"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        return True
    finally:
        atomic.remove(temporary)


def _creates_exclusively(handler_fs: Any) -> bool:
    """Whether an fsspec filesystem's ``pipe_file`` names a ``mode`` (``'create'``: refuse an existing file);
    one that only passes ``**kwargs`` on may ignore it, so it does not count."""
    import inspect

    method = getattr(handler_fs, "_pipe_file", None) or getattr(handler_fs, "pipe_file", None)
    if method is None:
        return False
    try:
        return "mode" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def _claim_and_put(fs: pafs.FileSystem, path: str, data: bytes) -> bool:
    import time

    claim = f"{path}.unihub-{atomic.run_id()}.claim"
    parent, name = posixpath.split(path)
    with fs.open_output_stream(claim) as handle:
        handle.write(b"")
    try:
        fresh(fs, parent)
        now = time.time()
        listing = fs.get_file_info(pafs.FileSelector(parent, allow_not_found=True))
        others = [e for e in listing if e.path != claim and posixpath.basename(e.path).startswith(f"{name}.unihub-")
                  and e.path.endswith(".claim")
                  and (e.mtime is None or now - e.mtime.timestamp() < CLAIM_STALE_SECONDS)]
        if others or any(e.path == path for e in listing):
            return False
        with fs.open_output_stream(path) as handle:
            handle.write(data)
        return True
    finally:
        fsutil.remove(fs, claim)


def missing_part(path: str) -> DatasetChangedError:
    """A part the manifest lists is gone: the dataset was overwritten while it was being opened."""
    return DatasetChangedError(f"{path}: listed by the dataset's manifest but gone; the dataset was replaced "
                               "meanwhile: open it again")


# -- putting a written temporary in place: a local rename, or a publish on an object store ----------------
def commit(fs: pafs.FileSystem, temporary: str, target: str) -> list[str] | None:
    """Put ``temporary`` at ``target``, replacing an existing target, which is removed.

    On a local disk the two are swapped atomically where the system can (Linux), else the old
    target is renamed aside and restored by :func:`settle` if a kill stops the commit half-way
    (:mod:`unihub.fs.atomic`). Elsewhere (object stores have no rename) a Parquet dataset is
    published by a manifest written last, and readers read only what it lists; an export's files are
    copied into place one by one (:func:`publish_files`). Returns the data files published
    under new names on an object store, else None (their names inside ``temporary`` hold).
    """
    if fsutil.on_local_disk(fs):
        atomic.replace(temporary, target)
        return None
    if fsutil.is_dir(fs, temporary) and is_dataset(fs, temporary):
        return publish(fs, temporary, target)
    publish_files(fs, temporary, target)
    return None


def settle(fs: pafs.FileSystem, target: str) -> str | None:
    """Finish what runs killed while writing ``target`` left. On a local disk: the old dataset put
    back where a commit stopped half-way, their temporaries removed (:func:`atomic.settle`); returns
    an old copy that could not be put back. Elsewhere: staging prefixes of dead runs removed, and the files no
    published manifest or record lists that a dead run wrote or an overwrite replaced; another tool's files are
    kept (:func:`_settle_object_store`)."""
    if fsutil.on_local_disk(fs):
        return atomic.settle(target)
    with remote.remote_errors(remote.display_url(fs, target)):
        _settle_object_store(fs, target)
    return None


def settle_url(url: str, storage_options: dict[str, Any] | None = None) -> str | None:
    """:func:`settle` for a URL or path."""
    scheme = urlparse(url).scheme if "://" in url else ""
    if scheme in ("", "file"):
        return atomic.settle(os.path.abspath(fsutil.strip_scheme(url)))
    fs, path = fsutil.resolve_filesystem(url, None, storage_options)
    return settle(fs, path)
