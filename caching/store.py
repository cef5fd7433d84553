"""Where caches live, and listing and removing them.

Layout under a cache root (a local folder or an object-store prefix)::

    ROOT/<dataset_id>/<version>/        the cache: a unihub dataset (write_dataset's atomic output)
    ROOT/<dataset_id>/<version>.lease   while a build runs (unihub.caching.lease)
    ROOT/<dataset_id>/<version>.json    written last: the cache is published; id, version,
                                        source type, build time, rows

A cache counts only once its ``.json`` record is there, so a builder killed at any moment
(also in the middle of copying objects on S3) leaves nothing that is read, and the next call
builds again over what it left.
"""

from __future__ import annotations

import os
import posixpath
import re
import time
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow.fs as pafs

from unihub.caching.lease import LeaseFiles, describe, is_stale
from unihub.errors import CacheError
from unihub.fs import publish
from unihub.fs.filesystem import resolve_filesystem
from unihub.runtime.memory import is_amount

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]*")
#: the files that mark a folder as a dataset's: caches under one would be read as its files
_DATASET_MARKERS = frozenset({publish.COMMON_METADATA, "_metadata", publish.VERSIONS_DIR})
#: the files beside version ``V``'s folder: ``V.json`` (its record) and ``V.lease``
_SIBLINGS = (".json", ".lease")


@dataclass(frozen=True)
class CacheInfo:
    """What the ``.json`` record of a published cache says."""

    dataset_id: str
    version: str
    source_type: str
    built_at: float
    build_seconds: float
    num_rows: int
    url: str

    def describe(self) -> str:
        import time

        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.built_at))
        return (f"{self.dataset_id} {self.version}: {self.num_rows:,} rows from {self.source_type}, "
                f"built {when} in {self.build_seconds:.1f} s")


#: the record's keys and the types of their values (numbers: finite, >= 0, and a time the platform can show)
_RECORD_TYPES = {"dataset_id": str, "version": str, "source_type": str, "built_at": float, "build_seconds": float,
                 "num_rows": int, "url": str}


def _checked_record(record: dict[str, Any], dataset_id: str, version: str, path: str) -> CacheInfo:
    """The :class:`CacheInfo` of ``record``, read at ``path``: every key of the type unihub writes, and the id and
    version of its own path (a version of ``../..`` would make a removal delete a folder outside the root)."""
    wrong = [key for key, kind in _RECORD_TYPES.items() if not _of_type(record.get(key), kind)]
    if not wrong and (record["dataset_id"], record["version"]) != (dataset_id, version):
        wrong = ["dataset_id", "version"]
    if wrong:
        raise CacheError(f"{path}: not a cache record unihub writes (its {', '.join(wrong)}: "
                         f"{str({k: record.get(k) for k in wrong})[:200]}); remove it (unihub cache rm ROOT ID "
                         "VERSION) to build the cache again")
    return CacheInfo(**{key: record[key] for key in _RECORD_TYPES})


def _of_type(value: Any, kind: type) -> bool:
    if kind is str:
        return isinstance(value, str)
    if not is_amount(value, zero=True):
        return False
    if kind is int:
        return isinstance(value, int)
    try:
        time.localtime(value)  # built_at: shown as a local time
    except (OverflowError, OSError, ValueError):
        return False
    return True


def check_name(kind: str, value: Any) -> str:
    """A dataset id or version as a path component: letters, digits, ``._=+-``; not hidden. A version
    does not end in ``.json`` or ``.lease``: the folder would be another version's record or lease."""
    text = str(value)
    if not _NAME.fullmatch(text):
        raise CacheError(f"{kind} {value!r} must be letters, digits and . _ = + - (not starting with . or -), "
                         "as it names a folder")
    if kind == "version" and text.endswith(_SIBLINGS):
        raise CacheError(f"version {value!r} cannot end in {' or '.join(_SIBLINGS)}: the folder "
                         f"{text!r} would be version {text.rsplit('.', 1)[0]!r}'s record or lease")
    return text


class CacheRoot:
    """One cache root: paths of its caches and the small records beside them."""

    def __init__(self, url: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None,
                 filesystem: Any = None) -> None:
        self.url = os.fspath(url).rstrip("/")
        self.storage_options = storage_options
        self.filesystem = filesystem
        fs, self.path = resolve_filesystem(self.url, filesystem, storage_options)
        self.fs = fs
        self.files = LeaseFiles(fs, None if isinstance(fs, pafs.LocalFileSystem) else _fsspec_for(self.url, filesystem,
                                                                                                  storage_options))

    def dataset_url(self, dataset_id: str, version: str) -> str:
        return f"{self.url}/{dataset_id}/{version}"

    def _path(self, dataset_id: str, version: str, suffix: str = "") -> str:
        return f"{self.path.rstrip('/')}/{dataset_id}/{version}{suffix}"

    def dataset_path(self, dataset_id: str, version: str) -> str:
        return self._path(dataset_id, version)

    def has_data(self, dataset_id: str, version: str) -> bool:
        """Whether the cache's dataset folder is there (its record may outlive it: a folder removed by hand)."""
        return _exists(self.fs, self.dataset_path(dataset_id, version))

    def lease_path(self, dataset_id: str, version: str) -> str:
        return self._path(dataset_id, version, ".lease")

    def record_path(self, dataset_id: str, version: str) -> str:
        return self._path(dataset_id, version, ".json")

    def info(self, dataset_id: str, version: str) -> CacheInfo | None:
        """The published cache's record, or None while there is none."""
        self._forget_listings()  # a listing cached before another process published it would hide it
        path = self.record_path(dataset_id, version)
        record = self.files.read(path)
        if not record:
            return None
        return _checked_record(record, dataset_id, version, path)

    def publish(self, info: CacheInfo) -> None:
        self.files.write(self.record_path(info.dataset_id, info.version), asdict(info))

    def caches(self) -> list[CacheInfo]:
        """Every published cache under this root, by id then version."""
        found = []
        self._forget_listings()
        try:
            entries = self.fs.get_file_info(pafs.FileSelector(self.path, recursive=True, allow_not_found=True))
        except FileNotFoundError:
            return []
        for entry in entries:
            rel = entry.path[len(self.path.rstrip("/")) + 1:]
            parts = rel.split("/")
            if len(parts) == 2 and parts[1].endswith(".json") and entry.type == pafs.FileType.File:
                info = self.info(parts[0], parts[1][:-5])
                if info is not None:
                    found.append(info)
        return sorted(found, key=lambda i: (i.dataset_id, i.version))

    def remove(self, dataset_id: str, version: str | None = None) -> list[str]:
        """Remove one version of a cache, or all of them; the versions removed."""
        dataset_id = check_name("dataset_id", dataset_id)
        versions = [check_name("version", version)] if version is not None else \
            [i.version for i in self.caches() if i.dataset_id == dataset_id]
        if version is not None and not self._published(dataset_id, versions[0]) and \
                not _exists(self.fs, self.dataset_path(dataset_id, versions[0])):
            raise CacheError(f"no cache {dataset_id!r} version {version!r} under {self.url}")
        if not versions:
            raise CacheError(f"no cache {dataset_id!r} under {self.url}")
        for v in versions:
            lease = self.files.read(self.lease_path(dataset_id, v))
            if lease and not is_stale(lease, float("inf")):
                raise CacheError(f"cache {self.dataset_url(dataset_id, v)} is being built ({describe(lease)}); "
                                 "remove it when the build ends")
        for v in versions:
            self.files.delete(self.record_path(dataset_id, v))  # unpublished first: nobody opens it now
            if _exists(self.fs, self.dataset_path(dataset_id, v)):
                self.fs.delete_dir(self.dataset_path(dataset_id, v))
            self.files.delete(self.lease_path(dataset_id, v))
        if isinstance(self.fs, pafs.LocalFileSystem):  # the id's folder, once empty (object stores have none)
            try:
                os.rmdir(self._path(dataset_id, "").rstrip("/"))
            except OSError:
                pass  # other versions, or a build that began meanwhile: kept
        return versions

    def check_outside_datasets(self) -> None:
        """A :class:`CacheError` where this root is a dataset's folder or lies inside one (a folder holding
        ``_common_metadata``, ``_metadata`` or ``_unihub_versions``): the caches' files would be read as the
        dataset's, which would then not open. A folder that cannot be listed counts as none."""
        path = self.path.rstrip("/")
        while path:
            try:
                found = self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
            except OSError:
                found = []
            if any(posixpath.basename(entry.path) in _DATASET_MARKERS for entry in found):
                raise CacheError(f"cache root {self.url} is inside the dataset in {path}: the caches' files would be "
                                 "read as that dataset's, which would then not open; put the caches elsewhere")
            parent = posixpath.dirname(path)
            path = "" if parent == path else parent

    def _published(self, dataset_id: str, version: str) -> bool:
        """Whether a record is at the version's place; one unihub would not write counts (removing it mends it:
        the paths removed are the checked names', never the record's)."""
        try:
            return self.info(dataset_id, version) is not None
        except CacheError:
            return True

    def _forget_listings(self) -> None:
        """Drop fsspec's cached listings (s3fs keeps them per instance): other processes change the root."""
        handler = getattr(self.fs, "handler", None)
        for fs in (self.files.fsspec_fs, getattr(handler, "fs", None)):
            invalidate = getattr(fs, "invalidate_cache", None)
            if invalidate is not None:
                invalidate()


def _exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def _fsspec_for(url: str, filesystem: Any, storage_options: dict[str, Any] | None) -> Any:
    """An fsspec filesystem for ``url`` (conditional PUTs), or None where fsspec cannot serve it."""
    if filesystem is not None:
        return None if isinstance(filesystem, pafs.FileSystem) else filesystem
    try:
        import fsspec
    except ImportError:
        return None
    options = {k: v for k, v in (storage_options or {}).items() if not k.startswith("unihub_")}
    try:
        return fsspec.core.url_to_fs(url, **options)[0]
    except (ImportError, ValueError):
        return None


def list_caches(url: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None,
                filesystem: Any = None) -> list[CacheInfo]:
    """Every published cache under the cache root ``url``."""
    return CacheRoot(url, storage_options=storage_options, filesystem=filesystem).caches()


def remove_cache(url: str | os.PathLike[str], dataset_id: str, version: str | None = None, *,
                 storage_options: dict[str, Any] | None = None, filesystem: Any = None) -> list[str]:
    """Remove version ``version`` of cache ``dataset_id`` under ``url`` (all versions when None);
    the versions removed. A cache being built is refused with :class:`~unihub.errors.CacheError`."""
    root = CacheRoot(url, storage_options=storage_options, filesystem=filesystem)
    return root.remove(dataset_id, version)
