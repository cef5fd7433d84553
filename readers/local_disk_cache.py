"""``cache_type='local-disk'``: stored row groups kept on local disk as Arrow IPC files.

On disk::

    cache_location/
      3f9a...c1.arrow                  one entry: the stored (encoded) columns of one row group
                                       for one column selection, as an Arrow IPC file
      .3f9a...c1.<pid>.<random>.tmp    an entry being written, renamed onto its name when complete
      .lock                            serialises commits and eviction between threads and processes

An entry's name is a hash of its key: the dataset URL, the data file's path, size and
modification time (where the filesystem reports one), the row group's index in the file,
its rows and bytes, any Hive partition values, and the sorted column names. A rewritten
dataset therefore misses instead of serving stale rows, and column selections never collide.

Entries are written to a temporary file and renamed into place, so no reader (thread or
process) ever sees a partial entry; they are uncompressed by default so a hit memory-maps
the file instead of reading it (``compression='lz4'`` or ``'zstd'`` trades CPU for disk).
A file that does not open as the expected entry (truncated, corrupt, someone else's) is
removed and the row group read from the store again.

After each commit the directory is trimmed to ``size_limit_bytes``, least recently used
entries first: a hit refreshes the entry's modification time, which serves as the access
clock (``atime`` is unreliable under ``relatime``/``noatime``). With
``eviction_policy='least-recently-stored'`` hits do not refresh it; with ``'none'`` nothing
is evicted and new entries are dropped once the cache is full.

    reader = make_reader("s3://bucket/train", cache_type="local-disk",
                         cache_location="/tmp/train-cache", cache_size_limit=20 * 2**30)
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import secrets
import shutil
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from unihub.errors import UnihubError
from unihub.readers.cache import CacheBase
from unihub.store.dataset import FileInfo, ParquetStore

try:
    import fcntl
except ImportError:  # Windows: no inter-process lock, one lock per process
    fcntl = None  # type: ignore[assignment]

EvictionPolicy = Literal["least-recently-used", "least-recently-stored", "none"]

_KEY_VERSION = 1
_DIGEST_KEY = b"unihub.cache.digest"
_SUFFIX = ".arrow"
_STALE_TEMP_SECONDS = 3600
_POLICIES = ("least-recently-used", "least-recently-stored", "none")
_COMPRESSIONS = (None, "lz4", "zstd")
# diskcache settings Petastorm passed through: accepted and unused.
_IGNORED_SETTINGS = {"disk_pickle_protocol", "statistics", "tag_index", "cull_limit", "timeout"}
_KIND_KEY = b"unihub.cache.kind"  # entries of get(key, fill_cache_func): an Arrow table, or a pickled value
_IGNORED_PREFIXES = ("sqlite_", "disk_")


class CacheConfigError(UnihubError, ValueError):
    """Invalid ``cache_*`` arguments for the local-disk cache."""


@dataclass
class CacheStats:
    """What this process's cache object did (approximate under threads; each process counts its own)."""

    hits: int = 0
    misses: int = 0
    writes: int = 0
    evictions: int = 0
    discarded: int = 0


class LocalDiskCache(CacheBase):
    """Row groups cached on local disk; see the module docstring for the layout and policies.

    ``location`` is a local directory (created if missing); ``size_limit_bytes`` bounds the
    entries' total size. ``row_size_estimate`` (Petastorm's ``expected_row_size_bytes``) only
    checks that the limit holds at least 5 rows per shard (``shards``, Petastorm's diskcache shard
    count, 1 unless given: unihub's cache is one directory, so the count only divides the limit
    in this check), as Petastorm's does unless ``eviction_policy='none'``, which never evicts.
    ``settings``: ``compression`` (None, ``'lz4'``, ``'zstd'``), ``eviction_policy`` and Petastorm's
    ``cleanup`` (True, its default: :meth:`cleanup` -- which a reader calls when its with-block
    ends -- removes the entries; False keeps them for later readers); Petastorm's other diskcache
    settings (``sqlite_*``, ...) are accepted and ignored. :meth:`get` is Petastorm's ``CacheBase``
    contract.
    """

    def __init__(self, location: str | os.PathLike[str] | None, size_limit_bytes: int | None,
                 row_size_estimate: int | None = None, shards: int = 1, cleanup: bool = True, *,
                 compression: str | None = None, eviction_policy: EvictionPolicy = "least-recently-used",
                 **settings: Any) -> None:
        self.location = _local_directory(location)
        size_limit = _checked_size_limit(size_limit_bytes, shards, row_size_estimate, eviction_policy)
        compression = _checked_options(compression, eviction_policy, settings)
        self.size_limit_bytes = size_limit
        self.row_size_estimate = row_size_estimate
        self.cleanup_on_exit = bool(cleanup)
        self.compression = compression
        self.eviction_policy: EvictionPolicy = eviction_policy
        self.stats = CacheStats()
        self._lock_path = os.path.join(self.location, ".lock")
        self._write_options = pa.ipc.IpcWriteOptions(compression=compression)
        self._files: dict[int, tuple[ParquetStore, dict[str, FileInfo]]] = {}
        self._warned = False
        try:
            os.makedirs(self.location, exist_ok=True)
        except OSError as exc:
            raise CacheConfigError(f"cannot create cache_location {self.location}: {exc}") from exc

    # -- the Cache protocol -------------------------------------------------------------------------
    def get_row_group(self, store: ParquetStore, row_group: int, columns: Sequence[str]) -> pa.Table:
        """The stored columns of one row group: from the cache, or read from ``store`` and cached."""
        columns = list(columns)
        key = self.key(store, row_group, columns)
        digest = hashlib.sha256(key.encode()).hexdigest()
        path = os.path.join(self.location, digest[:40] + _SUFFIX)
        table = self._load(path, digest, columns, store.row_groups[row_group].num_rows)
        if table is not None:
            self.stats.hits += 1
            return table
        self.stats.misses += 1
        table = store.read_row_group(row_group, columns)
        self._store(path, digest, table)
        return table

    def get(self, key: Any, fill_cache_func: Callable[[], Any]) -> Any:
        """Petastorm's contract: the value cached under ``key``, else ``fill_cache_func()`` cached and
        returned. Arrow tables are stored as they are, other values pickled (the cache directory is
        this process's own working data: keep it where only you write)."""
        digest = hashlib.sha256(json.dumps(["value", repr(key)]).encode()).hexdigest()
        path = os.path.join(self.location, digest[:40] + _SUFFIX)
        table = self._load(path, digest)
        if table is not None:
            self.stats.hits += 1
            kind = (table.schema.metadata or {}).get(_KIND_KEY)
            return pickle.loads(table.column(0)[0].as_py()) if kind == b"pickle" else table
        self.stats.misses += 1
        value = fill_cache_func()
        if isinstance(value, pa.Table):
            entry = value.replace_schema_metadata({**(value.schema.metadata or {}), _KIND_KEY: b"table"})
        else:
            entry = pa.table({"value": pa.array([pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)])})
            entry = entry.replace_schema_metadata({_KIND_KEY: b"pickle"})
        self._store(path, digest, entry)
        return value

    def key(self, store: ParquetStore, row_group: int, columns: Sequence[str]) -> str:
        """The identity of (dataset file, row group, column selection), as a JSON string."""
        info = store.row_groups[row_group]
        file = self._file_info(store, info.path)
        key = [_KEY_VERSION, store.url, info.path, file.size_bytes if file else None,
               getattr(file, "mtime_ns", None), info.row_group, info.num_rows, info.total_byte_size,
               [list(p) for p in info.partition], sorted(set(columns))]
        added = store.side.identity(columns) if store.side is not None else []
        return json.dumps(key + [added] if added else key, separators=(",", ":"))  # a backfill: new side files

    # -- maintenance --------------------------------------------------------------------------------
    def volume(self) -> int:
        """Total bytes of the entries now on disk (diskcache's name for it)."""
        return sum(size for _, _, size in self._entries())

    def cleanup(self) -> None:
        """Remove every entry, temporary file and the lock, and the directory with them when nothing
        else is in it (unless the cache was made with ``cleanup=False``, as Petastorm's).

        Files that are not the cache's stay, and the directory with them (Petastorm removed the whole
        directory). A directory already gone is fine; one that cannot be removed prints Petastorm's
        line ("Error during rmtree: ...") and cleanup goes on, as Petastorm's did, rather than raising.
        """
        if not self.cleanup_on_exit:
            return
        try:
            names = os.listdir(self.location)
            own = [name for name in names if _is_own_file(name)]
            if len(own) == len(names):
                shutil.rmtree(self.location)
            else:
                for name in own:
                    _remove_quietly(os.path.join(self.location, name))
        except FileNotFoundError:
            pass  # already gone
        except OSError as exc:
            print(f"Error during rmtree: {exc}", flush=True)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_files"] = {}
        state.pop("_write_options")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._write_options = pa.ipc.IpcWriteOptions(compression=self.compression)

    def __repr__(self) -> str:
        return (f"LocalDiskCache({self.location!r}, size_limit_bytes={self.size_limit_bytes}, "
                f"compression={self.compression!r}, eviction_policy={self.eviction_policy!r})")

    # -- reading and writing entries ----------------------------------------------------------------
    def _file_info(self, store: ParquetStore, path: str) -> FileInfo | None:
        known = self._files.get(id(store))
        if known is None or known[0] is not store:
            known = (store, {f.path: f for f in store.files})
            self._files[id(store)] = known
        return known[1].get(path)

    def _load(self, path: str, digest: str, columns: list[str] | None = None,
              num_rows: int | None = None) -> pa.Table | None:
        try:
            with pa.memory_map(path, "r") as source:
                reader = pa.ipc.open_file(source)
                metadata = dict(reader.schema.metadata or {})
                table = reader.read_all()
            if metadata.pop(_DIGEST_KEY, None) != digest.encode():
                raise ValueError("the entry belongs to another key")
            if columns is not None and (table.num_rows != num_rows or
                                        sorted(table.column_names) != sorted(set(columns))):
                raise ValueError(f"{table.num_rows} rows of {table.column_names}, expected {num_rows} of {columns}")
            table.validate()
        except FileNotFoundError:
            return None
        except (OSError, ValueError, pa.ArrowException):
            self.stats.discarded += 1
            _remove_quietly(path)  # truncated, corrupt or foreign: read the row group again
            return None
        if self.eviction_policy == "least-recently-used":
            _touch(path)
        table = table.replace_schema_metadata(metadata or None)
        return table if columns is None or table.column_names == columns else table.select(columns)

    def _store(self, path: str, digest: str, table: pa.Table) -> None:
        if table.nbytes > self.size_limit_bytes and self.compression is None:
            return
        temporary = os.path.join(self.location, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            if any(pa.types.is_dictionary(f.type) for f in table.schema):
                table = table.unify_dictionaries()
            metadata = {**(table.schema.metadata or {}), _DIGEST_KEY: digest.encode()}
            table = table.replace_schema_metadata(metadata)
            with pa.OSFile(temporary, "wb") as sink, \
                    pa.ipc.new_file(sink, table.schema, options=self._write_options) as writer:
                writer.write_table(table)
            size = os.path.getsize(temporary)
            if size > self.size_limit_bytes:
                _remove_quietly(temporary)
                return
            self._commit(temporary, path, size)
        except (OSError, pa.ArrowException) as exc:
            _remove_quietly(temporary)
            if not self._warned:
                self._warned = True
                warnings.warn(f"local-disk cache {self.location}: cannot write an entry ({exc}); reading on "
                              "without caching it", RuntimeWarning, stacklevel=3)

    def _commit(self, temporary: str, path: str, size: int) -> None:
        with _directory_lock(self._lock_path):
            if self.eviction_policy == "none" and self.volume() + size > self.size_limit_bytes:
                _remove_quietly(temporary)
                return
            os.replace(temporary, path)
            _touch(path)
            self.stats.writes += 1
            if self.eviction_policy != "none":
                self._evict(keep=os.path.basename(path))

    def _entries(self) -> Iterator[tuple[int, str, int]]:
        """``(last use in ns, name, bytes)`` of each entry; stale temporary files are removed on the way."""
        now = time.time()
        with os.scandir(self.location) as scan:
            for entry in scan:
                try:
                    if entry.name.endswith(_SUFFIX) and not entry.name.startswith("."):
                        stat = entry.stat()
                        yield stat.st_mtime_ns, entry.name, stat.st_size
                    elif entry.name.endswith(".tmp") and now - entry.stat().st_mtime > _STALE_TEMP_SECONDS:
                        _remove_quietly(entry.path)  # left by a writer that died
                except FileNotFoundError:
                    continue  # evicted or discarded meanwhile

    def _evict(self, keep: str) -> None:
        """Remove the least recently used entries until the total fits ``size_limit_bytes``."""
        entries = sorted(self._entries())
        total = sum(size for _, _, size in entries)
        for _, name, size in entries:
            if total <= self.size_limit_bytes:
                break
            if name == keep:
                continue
            try:
                os.remove(os.path.join(self.location, name))
                self.stats.evictions += 1
            except FileNotFoundError:
                pass
            except OSError:
                continue  # e.g. in use on Windows: it still counts
            total -= size


def _checked_size_limit(size_limit_bytes: Any, shards: Any, row_size_estimate: int | None,
                        eviction_policy: str) -> int:
    """The size limit in bytes; refuses a size limit or shard count that cannot be, and a limit too small for 5 estimated rows per
    shard (new entries could be evicted at once; Petastorm's condition) where entries are evicted."""
    if isinstance(size_limit_bytes, bool) or not isinstance(size_limit_bytes, (int, float)) \
            or not 0 < size_limit_bytes < float("inf"):
        raise CacheConfigError(f"cache_size_limit must be a positive number of bytes for cache_type='local-disk', "
                               f"got {size_limit_bytes!r} (e.g. cache_size_limit=10 * 2**30 for 10 GiB)")
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise CacheConfigError(f"shards must be a positive integer, got {shards!r}")
    if row_size_estimate is not None and eviction_policy != "none" \
            and size_limit_bytes / shards < 5 * row_size_estimate:
        per_shard = f", {size_limit_bytes / shards:g} per shard of {shards}" if shards > 1 else ""
        raise CacheConfigError(
            f"cache_size_limit ({size_limit_bytes} bytes{per_shard}) must hold at least 5 rows of "
            f"cache_row_size_estimate ({row_size_estimate} bytes), or new entries could be evicted at once: "
            f"raise cache_size_limit (Petastorm's words: Condition 'size_limit_bytes / shards < "
            f"5 * expected_row_size_bytes' needs to hold)")
    return int(size_limit_bytes)


def _checked_options(compression: str | None, eviction_policy: Any, settings: dict[str, Any]) -> str | None:
    """The entries' compression (None for ``'none'``/``'uncompressed'``), once it, the eviction policy and
    the other settings are known to be valid (Petastorm's diskcache settings are accepted and ignored)."""
    compression = None if compression in ("none", "uncompressed") else compression
    if compression not in _COMPRESSIONS:
        raise CacheConfigError(f"cache compression must be one of {list(_COMPRESSIONS)}, got {compression!r}")
    if compression is not None and not pa.Codec.is_available(compression):
        raise CacheConfigError(f"this pyarrow build has no {compression} codec; use compression=None")
    if eviction_policy not in _POLICIES:
        raise CacheConfigError(f"eviction_policy must be one of {list(_POLICIES)}, got {eviction_policy!r}")
    unknown = sorted(k for k in settings if k not in _IGNORED_SETTINGS and not k.startswith(_IGNORED_PREFIXES))
    if unknown:
        raise CacheConfigError(f"unknown cache_extra_settings {unknown}; valid: 'compression', "
                               f"'eviction_policy' (and Petastorm's diskcache settings, which are ignored)")
    return compression


def _local_directory(location: str | os.PathLike[str] | None) -> str:
    if location is None or os.fspath(location) == "":
        raise CacheConfigError("cache_type='local-disk' needs cache_location: a local directory for the cached "
                               "row groups, e.g. make_reader(url, cache_type='local-disk', "
                               "cache_location='/tmp/unihub-cache', cache_size_limit=10 * 2**30)")
    location = os.fspath(location)
    if location.startswith("file://"):
        location = location[len("file://"):]
    elif "://" in location:
        raise CacheConfigError(f"cache_location must be a local directory, got the URL {location!r}")
    return os.path.abspath(os.path.expanduser(location))


def _is_own_file(name: str) -> bool:
    """Whether a name in the cache directory is the cache's: an entry, a temporary file or the lock."""
    return (name.endswith(_SUFFIX) and not name.startswith(".")) or \
        (name.startswith(".") and name.endswith(".tmp")) or name == ".lock"


def _touch(path: str) -> None:
    """Mark an entry as used now, at the clock's full resolution (file times are only jiffy-precise)."""
    now = time.time_ns()
    try:
        os.utime(path, ns=(now, now))
    except OSError:
        pass  # evicted meanwhile; a table already read from it stays valid


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


# -- one lock for commits and eviction, shared by threads and processes ----------------------------
_HELD_LOCK_FDS: set[int] = set()
_PROCESS_LOCK = threading.Lock()  # only where fcntl is missing (no fork there)


@contextmanager
def _directory_lock(path: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``path``; each use opens its own descriptor, so threads exclude each other too."""
    if fcntl is None:
        with _PROCESS_LOCK:
            yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    _HELD_LOCK_FDS.add(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        _HELD_LOCK_FDS.discard(fd)
        os.close(fd)  # releases the lock


def _close_inherited_locks() -> None:
    """In a forked child: drop the descriptors of locks other parent threads held, or they would stay locked."""
    for fd in list(_HELD_LOCK_FDS):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD_LOCK_FDS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited_locks)
