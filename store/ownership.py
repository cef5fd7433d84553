"""What an overwrite may replace: only what unihub wrote (DESIGN decision 19).

``unihub convert data/*.tfrecord --overwrite`` with two files once took the second input for DST and
replaced it. An output path that exists is now replaced only when unihub can tell it wrote it: a
Parquet dataset whose metadata holds a Unischema (a manifest it published, ``_common_metadata`` or a
file footer with ``unihub.unischema``, or Petastorm's pickled one: unihub is Petastorm's successor, and
``copy_dataset(overwrite_output=True)`` over a Petastorm dataset replaced it there too), an export whose
format marks its writer (:meth:`~unihub.formats.base.ForeignFormat.written_by_unihub`: HDF5's root attributes, the
unihub header of a WebDataset shard), a folder of such files only, or an empty folder. Anything else — a TFRecord
file (it records no writer), a tar of another writer's, an image folder, Spark's or pandas' Parquet — needs
``overwrite_foreign=True`` (``--overwrite-foreign``) as well.
"""

from __future__ import annotations

import os
import posixpath
import tarfile

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from unihub.errors import DatasetExistsError, ForeignOutputError, UnihubError
from unihub.formats.base import FORMATS, ForeignFormat
from unihub.fs.publish import COMMON_METADATA, MANIFEST
from unihub.petastorm.legacy import PETASTORM_UNISCHEMA_KEY
from unihub.schema.unischema import SCHEMA_METADATA_KEY


def check_replaceable(fs: pafs.FileSystem, target: str, url: str, *, overwrite: bool, overwrite_foreign: bool,
                      what: str = "overwrite=True (--overwrite)") -> None:
    """Raise unless writing ``url`` (``target`` on ``fs``) may go ahead: it does not exist, or it may be
    replaced (``overwrite``, and unihub wrote it or ``overwrite_foreign``)."""
    info = fs.get_file_info(target)
    if info.type == pafs.FileType.NotFound or overwrite_foreign:
        return
    if not overwrite:
        raise DatasetExistsError(f"{url} already exists; pass {what} to replace it")
    why = _why_not_unihubs(fs, info)
    if why is not None:
        glob = ("if the shell expanded an unquoted glob into SRC and DST, quote it; "
                if info.type == pafs.FileType.File else "")
        raise ForeignOutputError(
            f"{url} exists and {why}: --overwrite replaces only what unihub wrote, so it was left as it is; "
            f"{glob}to replace it anyway, pass --overwrite-foreign (overwrite_foreign=True)")


def not_unihubs(fs: pafs.FileSystem, path: str) -> str | None:
    """None when unihub wrote what is at ``path`` (or nothing is there, or an empty folder), else why it is
    not known to be."""
    return _why_not_unihubs(fs, fs.get_file_info(path))


def _why_not_unihubs(fs: pafs.FileSystem, info: pafs.FileInfo) -> str | None:
    if info.type == pafs.FileType.NotFound:
        return None
    if info.type == pafs.FileType.Directory:
        return _folder(fs, info.path.rstrip("/"))
    if info.path.endswith((".parquet", ".parq", ".pq")):
        return None if _has_unischema(fs, info.path) else "is a Parquet file without a Unischema in its metadata"
    return _foreign_file(fs, info.path)


def _folder(fs: pafs.FileSystem, root: str) -> str | None:
    entries = _listing(fs, root)
    if not entries:
        return None
    names = {posixpath.basename(e.path): e for e in entries}
    if MANIFEST in names:
        return None
    metadata = names.get(COMMON_METADATA) or _first_parquet(fs, entries)
    if metadata is not None:
        return None if _has_unischema(fs, metadata.path) else \
            "is a Parquet dataset without a Unischema in its metadata (Spark's or another tool's)"
    if all(e.type == pafs.FileType.File and _foreign_file(fs, e.path) is None for e in entries):
        return None  # an export's files, each marked as unihub's (WebDataset shards, HDF5 files)
    return f"is a folder of {len(entries):,} entries that is not a unihub dataset"


def _listing(fs: pafs.FileSystem, root: str) -> list[pafs.FileInfo]:
    return list(fs.get_file_info(pafs.FileSelector(root, recursive=False, allow_not_found=True)))


def _first_parquet(fs: pafs.FileSystem, entries: list[pafs.FileInfo]) -> pafs.FileInfo | None:
    """The first Parquet file among ``entries`` of a dataset: at its top, or under Hive partition folders."""
    for entry in entries:
        name = posixpath.basename(entry.path)
        if name.startswith(("_", ".")):
            continue
        if entry.type == pafs.FileType.File and name.endswith(".parquet"):
            return entry
        if entry.type == pafs.FileType.Directory and "=" in name:
            found = _first_parquet(fs, _listing(fs, entry.path))
            if found is not None:
                return found
    return None


def _has_unischema(fs: pafs.FileSystem, path: str) -> bool:
    try:
        metadata = pq.read_schema(path, filesystem=fs).metadata or {}
    except (OSError, ValueError):  # not Parquet at all (pyarrow's ArrowInvalid is a ValueError)
        return False
    return SCHEMA_METADATA_KEY in metadata or PETASTORM_UNISCHEMA_KEY in metadata


def _foreign_file(fs: pafs.FileSystem, path: str) -> str | None:
    """Ask the format the file's extension names whether unihub wrote it."""
    import unihub.formats.builtin  # noqa: F401  (registers every format; start-up cost: 0.1 s)

    extension = os.path.splitext(path)[1]
    name = FORMATS.by_extension(extension) if extension else None
    if name is None:
        return "is a file that unihub did not write"
    fmt = FORMATS.get(name)
    try:
        if fmt.written_by_unihub(fs, path):
            return None
    except (OSError, UnihubError, tarfile.TarError):
        pass
    marks = getattr(fmt.written_by_unihub, "__func__", None) is not getattr(ForeignFormat.written_by_unihub,
                                                                           "__func__", None)
    why = "it holds no mark of a unihub export" if marks else f"{name} files do not record their writer"
    return f"is a {name} file that unihub cannot tell it wrote ({why})"
