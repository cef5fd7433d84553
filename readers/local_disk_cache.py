"""``cache_type='local-disk'``: stored row groups kept on local disk as Arrow IPC files.

On disk::

    cache_location/
      3f9a...c1.arrow                  one entry: the stored (encoded) columns of one row group
                                       for one column selection, as an Arrow IPC file
      .3f9a...c1.arrow.<writer>.<random>.tmp  an entry being written (by <writer>: host, pid, start), renamed
                                       onto its name when complete; removed by others once its writer is gone
      .lock                            serialises commits and eviction between threads and processes
      .3f9a...c1.fetch                 held (``flock``) by the one thread or process reading that row group
                                       from the store; the others wait for it, then read the entry
      .stats/<token>-<pid>.bin         what each process's cache did (hits, misses, bytes...), summed by
                                       :meth:`LocalDiskCache.node_stats`

An entry's name is a hash of its key: the dataset URL, the data file's path, size and
modification time (where the filesystem reports one), a digest of its Parquet footer, the row
group's index in the file, its rows and bytes, any Hive partition values, and the sorted column
names. A rewritten dataset therefore misses instead of serving stale rows, and column selections
never collide. The footer tells apart a file rewritten at the same size within the same second:
object stores report modification times in whole seconds (a rewrite whose footer is byte for byte
the same -- row counts, chunk sizes and offsets, statistics -- is not told apart).

Entries are written to a temporary file and renamed into place, so no reader (thread or
process) ever sees a partial entry; they are uncompressed by default so a hit memory-maps
the file instead of reading it (``compression='lz4'`` or ``'zstd'`` trades CPU for disk).
A file that does not open as the expected entry (truncated, corrupt, someone else's) is
removed and the row group read from the store again.

One download per node: any number of threads, worker processes and ranks on one machine may share
one ``cache_location``. A miss takes the entry's ``.fetch`` lock before it reads the store, so a row
group missing everywhere is read from the store once: the others wait for the lock (at most
``fetch_wait_seconds``, 120 by default, then they read it themselves) and are served the entry. A
fetcher that dies (even by SIGKILL) releases its lock with its last descriptor: the next waiter
takes the row group over. Where ``fcntl`` is missing (Windows) every miss reads the store.

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
import operator
import os
import pickle
import pickletools
import re
import secrets
import shutil
import struct
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, Literal

import pyarrow as pa
import pyarrow.fs as pafs

from unihub.errors import UnihubError
from unihub.fs import atomic
from unihub.readers.cache import CacheBase
from unihub.runtime import processes
from unihub.runtime.memory import is_amount
from unihub.store.dataset import FileInfo, ParquetStore

try:
    import fcntl
except ImportError:  # Windows: no inter-process lock, one lock per process
    fcntl = None  # type: ignore[assignment]

EvictionPolicy = Literal["least-recently-used", "least-recently-stored", "none"]

_KEY_VERSION = 2
_DIGEST_KEY = b"unihub.cache.digest"
_SUFFIX = ".arrow"
_STALE_TEMP_SECONDS = 3600
_POLICIES = ("least-recently-used", "least-recently-stored", "none")
_COMPRESSIONS = (None, "lz4", "zstd")
# diskcache settings Petastorm passed through: accepted and unused.
_IGNORED_SETTINGS = {"disk_pickle_protocol", "statistics", "tag_index", "cull_limit", "timeout"}
_FETCH_SUFFIX = ".fetch"
#: the names the cache gives its files: only these are counted, evicted or cleaned up (cache_location may
#: hold other files, a user's own Arrow files among them)
_ENTRY_NAME = re.compile(r"[0-9a-f]{40}\.arrow")
_WORK_NAME = re.compile(r"\.[0-9a-f]{40}(\.arrow\.(?P<writer>[0-9a-f]{8}-[0-9]+-[0-9]+|[0-9]+)\.[0-9a-f]{8}\.tmp|\.fetch)")
_STATS_DIR = ".stats"
_FOLDED_STATS = "node.bin"  # the counts of processes that have ended, folded into one file
DEFAULT_FETCH_WAIT_SECONDS = 120.0
_KIND_KEY = b"unihub.cache.kind"  # entries of get(key, fill_cache_func): an Arrow table, or a pickled value
_IGNORED_PREFIXES = ("sqlite_", "disk_")
#: the files that mark a folder as a dataset's (refuse_inside)
_DATASET_MARKERS = ("_common_metadata", "_metadata", "_unihub_versions")


class CacheConfigError(UnihubError, ValueError):
    """Invalid ``cache_*`` arguments for the local-disk cache."""


@dataclass
class CacheStats:
    """What this process's cache object did (approximate under threads; each process counts its own,
    and :meth:`LocalDiskCache.node_stats` sums them over the machine).

    ``hits``: look-ups served from the directory (``waits`` of them after waiting for another's
    fetch); ``misses``: look-ups that were not, ``fetches`` of which read the store; ``bytes_fetched``
    and ``bytes_served``: the Arrow buffers' bytes read from the store and served from the directory
    (``get_total_buffer_size``: ``nbytes`` costs 30 us a table, a sixth of a hit)."""

    hits: int = 0
    misses: int = 0
    writes: int = 0
    evictions: int = 0
    discarded: int = 0
    fetches: int = 0
    waits: int = 0
    bytes_fetched: int = 0
    bytes_served: int = 0


_COUNTERS = tuple(f.name for f in fields(CacheStats))
_VALUES = operator.attrgetter(*_COUNTERS)
_STATS_FORMAT = struct.Struct(f"<{len(_COUNTERS)}Q")


class LocalDiskCache(CacheBase):
    """Row groups cached on local disk; see the module docstring for the layout and policies.

    ``path`` is a local directory (created if missing; :attr:`location` after); ``size_limit_bytes`` bounds the
    entries' total size. ``expected_row_size_bytes`` (:attr:`row_size_estimate` after) only
    checks that the limit holds at least 5 rows per shard (``shards``, Petastorm's diskcache shard
    count, 1 unless given: unihub's cache is one directory, so the count only divides the limit
    in this check), as Petastorm's does unless ``eviction_policy='none'``, which never evicts.
    ``settings``: ``compression`` (None, ``'lz4'``, ``'zstd'``), ``eviction_policy`` and Petastorm's
    ``cleanup`` (True, its default: :meth:`cleanup` -- which a reader calls when its with-block
    ends -- removes the entries; False keeps them for later readers); diskcache's ``size_limit``, which
    Petastorm passed through, replaces ``size_limit_bytes`` as the bound, and its other settings
    (``sqlite_*``, ...) are accepted and ignored. :meth:`get` is Petastorm's ``CacheBase``
    contract.
    """

    def __init__(self, path: str | os.PathLike[str] | None, size_limit_bytes: int | None,
                 expected_row_size_bytes: int | None = None, shards: int = 1, cleanup: bool = True, *,
                 compression: str | None = None, eviction_policy: EvictionPolicy = "least-recently-used",
                 fetch_wait_seconds: float = DEFAULT_FETCH_WAIT_SECONDS, **settings: Any) -> None:
        self.location = _local_directory(path)
        size_limit = _checked_size_limit(size_limit_bytes, shards, expected_row_size_bytes, eviction_policy)
        size_limit = _diskcache_size_limit(size_limit, settings, eviction_policy)
        compression = _checked_options(compression, eviction_policy, settings)
        self.size_limit_bytes = size_limit
        self.row_size_estimate = expected_row_size_bytes
        self.cleanup_on_exit = bool(cleanup)
        self.compression = compression
        self.eviction_policy: EvictionPolicy = eviction_policy
        self.fetch_wait_seconds = _checked_wait(fetch_wait_seconds)
        self.stats = CacheStats()
        self._token = secrets.token_hex(4)  # names the stats files of this object and its copies in workers
        self._stats_fd: int | None = None
        self._stats_pid = os.getpid()
        self._lock_path = os.path.join(self.location, ".lock")
        self._write_options = pa.ipc.IpcWriteOptions(compression=compression)
        self._files: dict[int, tuple[ParquetStore, dict[str, FileInfo]]] = {}
        self._footer_digests: dict[tuple[int, str], tuple[ParquetStore, str]] = {}
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
        num_rows = store.row_groups[row_group].num_rows
        table = self._load(path, digest, columns, num_rows)
        if table is not None:
            self._count(hits=1, bytes_served=table.get_total_buffer_size())
            return table
        with _fetch_lock(path, self.fetch_wait_seconds) as waited:
            table = self._load(path, digest, columns, num_rows)  # another's fetch may have stored it meanwhile
            if table is not None:
                self._count(hits=1, waits=int(waited), bytes_served=table.get_total_buffer_size())
                return table
            self._count(misses=1)
            table = store.read_row_group(row_group, columns)
            self._count(fetches=1, bytes_fetched=table.get_total_buffer_size())
            self._store(path, digest, table)
        return table

    def get(self, key: Any, fill_cache_func: Callable[[], Any]) -> Any:
        """Petastorm's contract: the value cached under ``key``, else ``fill_cache_func()`` cached and
        returned. Arrow tables are stored as they are, other values pickled (the cache directory is
        this process's own working data: keep it where only you write). Keys are told apart by their
        pickle, as diskcache's are (a key that cannot be pickled raises)."""
        digest = _value_digest(key)
        path = os.path.join(self.location, digest[:40] + _SUFFIX)
        table = self._load(path, digest)
        if table is not None:
            self._count(hits=1, bytes_served=table.get_total_buffer_size())
            return _value_of(table)
        with _fetch_lock(path, self.fetch_wait_seconds) as waited:
            table = self._load(path, digest)
            if table is not None:
                self._count(hits=1, waits=int(waited), bytes_served=table.get_total_buffer_size())
                return _value_of(table)
            self._count(misses=1)
            value = fill_cache_func()
            if isinstance(value, pa.Table):
                entry = value.replace_schema_metadata({**(value.schema.metadata or {}), _KIND_KEY: b"table"})
            else:
                entry = pa.table({"value": pa.array([pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)])})
                entry = entry.replace_schema_metadata({_KIND_KEY: b"pickle"})
            self._count(fetches=1, bytes_fetched=entry.get_total_buffer_size())
            self._store(path, digest, entry)
        return value

    def key(self, store: ParquetStore, row_group: int, columns: Sequence[str]) -> str:
        """The identity of (dataset file, row group, column selection), as a JSON string."""
        info = store.row_groups[row_group]
        file = self._file_info(store, info.path)
        key = [_KEY_VERSION, store.url, info.path, file.size_bytes if file else None,
               getattr(file, "mtime_ns", None), self._footer_digest(store, info.path), info.row_group,
               info.num_rows, info.total_byte_size, [list(p) for p in info.partition], sorted(set(columns))]
        added = store.side.identity(columns) if store.side is not None else []
        return json.dumps(key + [added] if added else key, separators=(",", ":"))  # a backfill: new side files

    # -- statistics ---------------------------------------------------------------------------------
    def node_stats(self) -> dict[str, int]:
        """What every process that used this directory did, summed (:class:`CacheStats`' counters),
        with the ``entries`` and ``bytes`` now on disk and the ``size_limit_bytes``; the files of
        processes that have ended are folded into one on the way."""
        self._fold_ended()
        totals = _sum_stats(self._stats_files())
        entries = list(self._entries())
        return {**totals, "entries": len(entries), "bytes": sum(size for _, _, size in entries),
                "size_limit_bytes": self.size_limit_bytes}

    def reader_stats(self) -> dict[str, int]:
        """What this cache object and its copies in worker processes did, summed (until another process
        folds the files of those that ended into the node's)."""
        return _sum_stats(p for p in self._stats_files() if os.path.basename(p).startswith(self._token + "-"))

    def summary(self) -> dict[str, Any]:
        """``{"location", "reader": reader_stats(), "node": node_stats()}``: what ``Reader.cache_stats`` shows."""
        return {"location": self.location, "reader": self.reader_stats(), "node": self.node_stats()}

    def _count(self, **deltas: int) -> None:
        """Add to this process's counters and write them to its stats file (one ``pwrite``)."""
        if self._stats_pid != os.getpid():  # a forked or unpickled copy counts from zero in its own file
            self.stats, self._stats_fd, self._stats_pid = CacheStats(), None, os.getpid()
        stats = self.stats
        for name, value in deltas.items():
            setattr(stats, name, getattr(stats, name) + value)
        fd = self._stats_fd if self._stats_fd is not None else self._open_stats()
        if fd is not None:
            try:
                os.pwrite(fd, _STATS_FORMAT.pack(*_VALUES(stats)), 0)
            except OSError:
                pass

    def _open_stats(self) -> int | None:
        directory = os.path.join(self.location, _STATS_DIR)
        try:
            os.makedirs(directory, exist_ok=True)
            self._stats_fd = os.open(os.path.join(directory, f"{self._token}-{os.getpid()}.bin"),
                                     os.O_RDWR | os.O_CREAT, 0o644)
            # after the counters: who writes them (host, boot and pid namespace, pid, start), for _ended
            os.pwrite(self._stats_fd, atomic._owner().encode(), _STATS_FORMAT.size)
        except OSError:
            self._stats_fd = -1  # statistics are best effort: reading goes on without them
        return self._stats_fd if self._stats_fd >= 0 else None

    def _stats_files(self) -> list[str]:
        directory = os.path.join(self.location, _STATS_DIR)
        try:
            return [os.path.join(directory, name) for name in os.listdir(directory) if name.endswith(".bin")]
        except OSError:
            return []

    def _fold_ended(self) -> None:
        """Add the counts of processes that have ended (other than this object's copies) to ``node.bin``
        and remove their files, so the directory holds one stats file per live process."""
        ended = [p for p in self._stats_files() if _ended(p, self._token)]
        if not ended or fcntl is None:
            return
        folded = os.path.join(self.location, _STATS_DIR, _FOLDED_STATS)
        with _directory_lock(self._lock_path):
            ended = [p for p in ended if os.path.exists(p)]
            totals = _sum_stats([folded, *ended])
            temporary = f"{folded}.{os.getpid()}.tmp"
            try:
                with open(temporary, "wb") as handle:
                    handle.write(_STATS_FORMAT.pack(*(totals[name] for name in _COUNTERS)))
                os.replace(temporary, folded)
            except OSError:
                _remove_quietly(temporary)
                return
            for path in ended:
                _remove_quietly(path)

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
                    if name == _STATS_DIR:
                        shutil.rmtree(os.path.join(self.location, name), ignore_errors=True)
                    _remove_quietly(os.path.join(self.location, name))
        except FileNotFoundError:
            pass  # already gone
        except OSError as exc:
            print(f"Error during rmtree: {exc}", flush=True)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_files"], state["_footer_digests"] = {}, {}
        state["_stats_fd"], state["_stats_pid"] = None, None  # the copy counts in its own file
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

    def _footer_digest(self, store: ParquetStore, path: str) -> str | None:
        """A digest of the footer ``store`` read for the file at ``path`` (None where it kept none), once per file."""
        known = self._footer_digests.get((id(store), path))
        if known is None or known[0] is not store:
            footer = store._footers.get(path)
            if footer is None:
                return None
            sink = pa.BufferOutputStream()
            footer.write_metadata_file(sink)
            known = (store, hashlib.sha256(sink.getvalue()).hexdigest()[:32])
            self._footer_digests[(id(store), path)] = known
        return known[1]

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
            self._count(discarded=1)
            _remove_quietly(path)  # truncated, corrupt or foreign: read the row group again
            return None
        if self.eviction_policy == "least-recently-used":
            _touch(path)
        table = table.replace_schema_metadata(metadata or None)
        return table if columns is None or table.column_names == columns else table.select(columns)

    def _store(self, path: str, digest: str, table: pa.Table) -> None:
        if table.nbytes > self.size_limit_bytes and self.compression is None:
            return
        temporary = os.path.join(self.location,  # named by its writer: once that is gone, anyone may remove it
                                 f".{os.path.basename(path)}.{atomic._owner()}.{secrets.token_hex(4)}.tmp")
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
            self._count(writes=1)
            if self.eviction_policy != "none":
                self._evict(keep=os.path.basename(path))

    def _entries(self) -> Iterator[tuple[int, str, int]]:
        """``(last use in ns, name, bytes)`` of each entry; stale temporary files are removed on the way."""
        now = time.time()
        with os.scandir(self.location) as scan:
            for entry in scan:
                try:
                    if _ENTRY_NAME.fullmatch(entry.name):
                        stat = entry.stat()
                        yield stat.st_mtime_ns, entry.name, stat.st_size
                    elif (work := _WORK_NAME.fullmatch(entry.name)) is not None and \
                            (now - entry.stat().st_mtime > _STALE_TEMP_SECONDS or _writer_gone(work["writer"])):
                        _remove_quietly(entry.path)  # left by a writer or fetcher that died
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
                self._count(evictions=1)
            except FileNotFoundError:
                pass
            except OSError:
                continue  # e.g. in use on Windows: it still counts
            total -= size


def _checked_size_limit(size_limit_bytes: Any, shards: Any, row_size_estimate: int | None,
                        eviction_policy: str) -> int:
    """The size limit in bytes; refuses a size limit or shard count that cannot be, and a limit too small for 5 estimated rows per
    shard (new entries could be evicted at once; Petastorm's condition) where entries are evicted."""
    if not is_amount(size_limit_bytes):
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


def _diskcache_size_limit(size_limit: int, settings: dict[str, Any], eviction_policy: str) -> int:
    """The bound entries are evicted to: diskcache's ``size_limit`` setting where given (Petastorm passed its settings
    through, so one replaced ``cache_size_limit`` there; it is taken out of ``settings``), else ``size_limit``. Under
    ``eviction_policy='none'`` diskcache evicts nothing and Petastorm checked ``cache_size_limit``: it stays."""
    if "size_limit" not in settings:
        return size_limit
    given = settings.pop("size_limit")
    if not is_amount(given):
        raise CacheConfigError(f"cache_extra_settings' size_limit must be a positive number of bytes, got {given!r}")
    return size_limit if eviction_policy == "none" else int(given)


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
        raise CacheConfigError(f"unknown cache_extra_settings {unknown}; valid: 'compression', 'eviction_policy', "
                               f"'fetch_wait_seconds', 'cleanup' (and Petastorm's diskcache settings, which are "
                               f"ignored)")
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


def refuse_inside(location: str | os.PathLike[str] | None, store: ParquetStore) -> None:
    """A :class:`CacheConfigError` where ``location`` is a dataset's folder or lies inside one: ``store``'s (a local
    directory), or any folder up its path holding ``_common_metadata``, ``_metadata`` or ``_unihub_versions``. The
    entries would become files of that dataset, which would no longer open (``*.arrow`` files are not Parquet)."""
    if location is None:
        return
    cache = folder = os.path.realpath(_local_directory(location))
    local = isinstance(store.filesystem, pafs.LocalFileSystem) and os.path.isdir(store.path)
    dataset = os.path.realpath(store.path) if local else None
    while True:
        if folder == dataset or any(os.path.exists(os.path.join(folder, name)) for name in _DATASET_MARKERS):
            raise CacheConfigError(f"cache_location {cache} is inside the dataset in {folder}: its entries would "
                                   "become files of that dataset, which would then not open; give the cache a folder "
                                   "outside it")
        parent = os.path.dirname(folder)
        if parent == folder:
            return
        folder = parent


def _is_own_file(name: str) -> bool:
    """Whether a name in the cache directory is the cache's: an entry, a temporary file, a fetch lock,
    the lock or the statistics."""
    return bool(_ENTRY_NAME.fullmatch(name) or _WORK_NAME.fullmatch(name)) or name in (".lock", _STATS_DIR)


def _checked_wait(seconds: Any) -> float:
    if not is_amount(seconds, zero=True):
        raise CacheConfigError(f"fetch_wait_seconds must be a number of seconds >= 0, got {seconds!r}")
    return float(seconds)


def _value_digest(key: Any) -> str:
    """The digest of a :meth:`LocalDiskCache.get` key: of its pickle, not its ``repr``, which two keys may share
    (numpy elides the middle of a long array, a class may show no state)."""
    return hashlib.sha256(b"value\0" + pickletools.optimize(pickle.dumps(key, protocol=4))).hexdigest()


def _value_of(table: pa.Table) -> Any:
    """What :meth:`LocalDiskCache.get` stored: the table (with its own metadata, without the cache's mark), or the
    pickled value in it."""
    metadata = dict(table.schema.metadata or {})
    kind = metadata.pop(_KIND_KEY, None)
    return pickle.loads(table.column(0)[0].as_py()) if kind == b"pickle" else \
        table.replace_schema_metadata(metadata or None)


def _sum_stats(paths: Iterable[str]) -> dict[str, int]:
    """The counters of these stats files, summed (a file missing or short counts what it has)."""
    totals = dict.fromkeys(_COUNTERS, 0)
    for path in paths:
        try:
            with open(path, "rb") as handle:
                data = handle.read(_STATS_FORMAT.size)
        except OSError:
            continue
        data = data.ljust(_STATS_FORMAT.size, b"\0")
        for name, value in zip(_COUNTERS, _STATS_FORMAT.unpack(data)):
            totals[name] += value
    return totals


def _ended(path: str, token: str) -> bool:
    """Whether the stats file at ``path`` (``<token>-<pid>.bin``) is of another object's process that has ended.

    The process is the one the file names after its counters (``<where>-<pid>-<start>``): one in another pid
    namespace (a container sharing the directory) or on another host cannot be asked and is taken as alive, and
    a pid reused since is another process. A file without that name (an older unihub's) goes by its pid."""
    owner, _, pid = os.path.basename(path)[:-len(".bin")].partition("-")
    if owner == token or not pid.isdigit():
        return False
    try:
        with open(path, "rb") as handle:
            handle.seek(_STATS_FORMAT.size)
            named = handle.read(100).decode("ascii", "replace")
    except OSError:
        return False
    where, _, rest = named.partition("-")
    number, _, start = rest.partition("-")
    if number == pid and start.isdigit():
        return not atomic.owner_alive(where, int(pid), int(start))
    return not processes.is_running(int(pid))


def _writer_gone(writer: str | None) -> bool:
    """Whether the process that named a temporary file (``<where>-<pid>-<start>``) is known to have ended: one
    killed in the middle of writing an entry, whose file is then removed at once rather than after an hour."""
    if writer is None or writer.isdigit():  # a fetch marker, or an older unihub's name: by age alone
        return False
    where, pid, start = writer.split("-")
    return not atomic.owner_alive(where, int(pid), int(start))


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


@contextmanager
def _fetch_lock(path: str, wait_seconds: float) -> Iterator[bool]:
    """Hold the ``.fetch`` lock of the entry at ``path`` (yields whether another held it first).

    An exclusive ``flock`` on ``.<entry>.fetch``, polled for at most ``wait_seconds``; after that the
    caller goes on without it (it reads the store itself). The holder removes the file before it lets
    go, so one that locks a file no longer at its name (removed by the previous holder) tries again; a
    holder that died left the file, and the next locks it. Where ``fcntl`` is missing: no lock."""
    if fcntl is None:
        yield False
        return
    directory, name = os.path.split(path)
    marker = os.path.join(directory, f".{name[:-len(_SUFFIX)]}{_FETCH_SUFFIX}")
    fd, waited = _take_fetch_lock(marker, time.monotonic() + wait_seconds)
    try:
        yield waited
    finally:
        if fd is not None:
            _remove_quietly(marker)  # before letting go: the next fetcher makes a fresh one
            _HELD_LOCK_FDS.discard(fd)
            os.close(fd)


def _take_fetch_lock(marker: str, deadline: float) -> tuple[int | None, bool]:
    """``(descriptor holding the lock, or None past the deadline; whether another held it)``."""
    waited, delay = False, 0.001
    while True:
        try:
            fd = os.open(marker, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return None, waited  # cannot lock here (directory gone, read-only): read without
        _HELD_LOCK_FDS.add(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_ino == os.stat(marker).st_ino:
                return fd, waited
        except (BlockingIOError, FileNotFoundError) as exc:
            waited = waited or isinstance(exc, BlockingIOError)
        _HELD_LOCK_FDS.discard(fd)
        os.close(fd)
        if waited and time.monotonic() >= deadline:
            return None, waited
        if waited:
            time.sleep(delay)
            delay = min(2 * delay, 0.01)  # a waiter is served at most 10 ms after the fetch


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
