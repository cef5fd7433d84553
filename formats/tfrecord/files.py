"""Which files of a TFRecord source hold records: shard names, TFDS layouts, splits, missing shards.

TFRecord files carry no fixed extension. What real datasets look like::

    imagenet/train-00000-of-01024            TensorFlow's shard names, no extension
    imagenet/validation-00000-of-00128       (a second split in the same folder)
    mnist/3.0.1/mnist-train.tfrecord-00000-of-00001    TFDS: <name>-<split>.tfrecord-<i>-of-<n>
    mnist/3.0.1/dataset_info.json, features.json      TFDS metadata beside them (not records): the
    mnist/3.0.1/label.labels.txt                      fields TFDS declares (:mod:`unihub.formats.tfrecord.tfds`)
    data/part-0.tfrecord.gz, data/part-1.tfrecords    plain names, any compression

A file named by the user (a path, or a glob or brace pattern) is read as given. A directory
contributes the files that are named like TFRecord files (``.tfrecord``/``.tfrecords``/``.tfrec``,
or ``-NNNNN-of-NNNNN``) or whose first bytes are a TFRecord record (any compression); other
files (JSON, text, images) are not records and are listed in the dataset's metadata.

Files named ``<stem>-<i>-of-<n><suffix>`` form a *shard set* (its stem and ``n``, whatever each
file's compression suffix: ``train-00000-of-00002.tfrecord`` and ``train-00001-of-00002.tfrecord.gz``
are one set). A set that a directory or glob lists with a shard missing (or one shard under two
names) is an error naming it: the missing shard's records would otherwise vanish without a word. A
directory or glob holding several sets (``train`` and ``validation``) converts one, chosen with the
``split`` option, rather than mixing them; files named one by one are taken as named.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from unihub.errors import FormatError
from unihub.formats.base import expand_braces, expand_sources, unique_files
from unihub.fs import sources as fsrc
from unihub.schema.metadata_json import parse_json

TFRECORD_EXTENSIONS = (".tfrecord", ".tfrecords", ".tfrec")
COMPRESSION_SUFFIXES = (".gz", ".gzip", ".zlib", ".zz")  # what a shard's name may end with, one file not another
_SHARD = re.compile(r"^(?P<stem>.+)-(?P<index>\d+)-of-(?P<count>\d+)(?P<suffix>(?:\.[A-Za-z0-9]+)*)$")
TFDS_METADATA = ("dataset_info.json", "features.json")
TFDS_LABELS = ".labels.txt"  # a ClassLabel's names, one a line: ``label.labels.txt``, ``objects-kind.labels.txt``
_METADATA_LIMIT = 1 << 20  # bytes of a TFDS JSON file kept in the dataset's metadata


@dataclass
class Listing:
    """The record files of a source, and what was seen beside them."""

    files: list[str]
    ignored: list[str] = field(default_factory=list)  # files in the directories that hold no records
    splits: dict[str, list[str]] = field(default_factory=dict)  # shard set ('dir/stem-*-of-n') -> its files
    #: shard set -> the globs that listed it (None: a directory, which lists every file)
    globs: dict[str, set[str | None]] = field(default_factory=dict)
    tfds: dict[str, Any] = field(default_factory=dict)  # TFDS JSON files found beside the records
    #: TFDS ClassLabel names found beside the records: file stem (``objects-kind``) -> names
    class_names: dict[str, list[str]] = field(default_factory=dict)
    looked_beside: bool = False  # tfds_beside ran


def named_like_tfrecord(name: str) -> bool:
    """True for ``x.tfrecord``, ``x.tfrecords.gz``, ``x.tfrecord-00000-of-00004``, ``train-00000-of-01024``."""
    base = _uncompressed(name)
    return base.endswith(TFRECORD_EXTENSIONS) or _SHARD.match(base) is not None or \
        any(ext + "-" in base for ext in TFRECORD_EXTENSIONS)


def _uncompressed(name: str) -> str:
    """``name`` without its compression suffix (``x.tfrecord.gz`` -> ``x.tfrecord``)."""
    for suffix in COMPRESSION_SUFFIXES:
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name


def split_name(key: str) -> str:
    """The split a shard set names: ``d/mnist-train.tfrecord-*-of-4`` -> ``train``, ``d/validation-*-of-8`` -> itself."""
    stem = _stem(key)
    for ext in TFRECORD_EXTENSIONS:
        stem = stem.removesuffix(ext)
    return stem.rsplit("-", 1)[-1]


def _stem(key: str) -> str:
    return os.path.basename(key).split("-*-of-")[0]


def list_files(sources: Sequence[str], *, split: str | None, is_record_file: Callable[[str], bool]) -> Listing:
    """The record files named by ``sources`` (sorted), checked for missing shards; see the module docstring."""
    listing = Listing([])
    for source in sources:
        for pattern in expand_braces(fsrc.without_query(source)):
            if fsrc.isdir(pattern):
                _add_directory(listing, pattern, is_record_file)
            else:  # a file named one by one (a task's slice, say) is what was chosen; a glob is checked
                matched = expand_sources([pattern])
                listing.files.extend(matched)
                _note_sets(listing, matched, pattern if any(c in pattern for c in "*?[") else "")
    listing.files = unique_files(listing.files)
    if split is not None:
        _choose_split(listing, split, sources)
    elif len(listed := {key: files for key, files in listing.splits.items() if listing.globs.get(key)}) > 1:
        # files named one by one are what the user chose; a directory or glob mixing splits is refused
        sets = "; ".join(f"{name!r} ({len(files)} files)" for name, files in sorted(listed.items())[:6])
        raise FormatError(f"{sources[0]}: holds {len(listed)} shard sets ({sets}); converting them together "
                          "would mix splits: choose one with --option split=NAME (e.g. split="
                          f"{split_name(sorted(listed)[0])}), or convert each", path=sources[0])
    _check_complete(listing)
    return listing


def _add_directory(listing: Listing, root: str, is_record_file: Callable[[str], bool]) -> None:
    records: list[str] = []
    for directory, dirs, names in fsrc.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        for name in sorted(names):
            path = fsrc.join(directory, name)
            if name.startswith((".", "_")):
                continue
            if name in TFDS_METADATA or name.endswith(TFDS_LABELS):
                _keep_tfds(listing, path, name)
                listing.ignored.append(path)
            elif named_like_tfrecord(name) or is_record_file(path):
                records.append(path)
            else:
                listing.ignored.append(path)
    listing.files.extend(records)
    _note_sets(listing, records, None)


def _keep_tfds(listing: Listing, path: str, name: str) -> None:
    """Keep a TFDS JSON file (``features.json`` -> ``tfds["features"]``) or a ClassLabel's names (read as
    TFDS reads them: one a line, stripped, blank lines left out)."""
    try:
        if fsrc.getsize(path) <= _METADATA_LIMIT:
            with fsrc.open_input(path) as handle:
                text = handle.read().decode("utf-8")
            if name.endswith(TFDS_LABELS):
                listing.class_names[name.removesuffix(TFDS_LABELS)] = [n.strip() for n in text.split("\n") if n.strip()]
            else:
                listing.tfds[name.removesuffix(".json")] = parse_json(text)
    except (OSError, ValueError):  # not JSON (nested past Python's limit too)
        pass  # an unreadable file changes no record: the fields are inferred from the records


def tfds_beside(listing: Listing) -> None:
    """Record files named one by one or by a glob (``mnist/3.0.1/mnist-train.tfrecord-*``): keep the TFDS
    files of their one directory too (features.json, dataset_info.json, labels), as a directory's listing
    does. Looked for once, when the schema or the metadata needs them, not by every slice of a conversion."""
    if listing.looked_beside or listing.tfds or not listing.files:
        return
    listing.looked_beside = True
    directories = {os.path.dirname(path) for path in listing.files}
    if len(directories) != 1:
        return
    directory = directories.pop()
    try:
        if not fsrc.isfile(fsrc.join(directory, "features.json")):
            return
        names = fsrc.listdir(directory)
    except OSError:
        return  # no TFDS files to be read: the fields are inferred from the records
    for name in sorted(names):
        if name in TFDS_METADATA or name.endswith(TFDS_LABELS):
            _keep_tfds(listing, fsrc.join(directory, name), name)


def _note_sets(listing: Listing, paths: Sequence[str], glob: str | None) -> None:
    """Group shard-named ``paths`` into sets; ``glob`` lists them (None: a directory, '': named one by one)."""
    for path in paths:
        match = _SHARD.match(os.path.basename(path))
        if match is not None:
            key = os.path.join(os.path.dirname(path), f"{match['stem']}-*-of-{match['count']}"
                               f"{_uncompressed(match['suffix'])}")
            listing.splits.setdefault(key, []).append(path)
            if glob != "":
                listing.globs.setdefault(key, set()).add(glob)


def _choose_split(listing: Listing, split: str, sources: Sequence[str]) -> None:
    chosen = {key: files for key, files in listing.splits.items() if split in (_stem(key), split_name(key))}
    if not chosen:
        names = sorted({split_name(key) for key in listing.splits})
        raise FormatError(f"{sources[0]}: no shard set named {split!r}; its splits: {', '.join(names) or 'none'}",
                          path=sources[0])
    keep = {path for files in chosen.values() for path in files}
    listing.files = [f for f in listing.files if f in keep]
    listing.splits = chosen


def _check_complete(listing: Listing) -> None:
    """Refuse a shard set that lacks a shard its directory or glob would have listed (files named one by
    one, or a glob for some shards only, are what the user chose), or holds one twice."""
    for key, files in sorted(listing.splits.items()):
        globs = listing.globs.get(key)
        if not globs:
            continue
        shards = [m for m in (_SHARD.match(os.path.basename(p)) for p in files) if m is not None]
        indices = [int(m["index"]) for m in shards]
        if len(set(indices)) < len(indices):  # x-00001-of-00002.tfrecord beside x-00001-of-00002.tfrecord.gz
            twice = sorted(m.string for m, i in zip(shards, indices) if indices.count(i) > 1)
            raise FormatError(f"{key}: a shard is there under two names ({', '.join(twice[:4])}): its records "
                              "would be read twice; remove one, or name the files you want explicitly", path=key)
        missing = _missing(shards, os.path.dirname(files[0]), globs)
        if missing:
            shown = ", ".join(str(i) for i in missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            raise FormatError(f"{key}: shard set of {int(shards[0]['count'])} files lacks "
                              f"{len(missing)} (shard {shown}): their records would be missing; restore them, or "
                              "name the files you want explicitly", path=key)


def _missing(shards: list[re.Match[str]], directory: str, globs: set[str | None]) -> list[int]:
    """The shards of a set (``shards``: its files' name matches) that are absent although a directory
    or one of ``globs`` would list them, under any of the names the set's files have
    (``x-00001-of-00002.tfrecord`` or ``x-00001-of-00002.tfrecord.gz``)."""
    if not shards:  # never: only shard names were noted
        return []
    first = shards[0]
    present = {int(m["index"]) for m in shards}
    suffixes = sorted({m["suffix"] for m in shards})
    width, count = len(first["index"]), first["count"]
    missing = []
    for i in range(int(count)):
        names = [os.path.join(directory, f"{first['stem']}-{i:0{width}d}-of-{count}{suffix}") for suffix in suffixes]
        if i not in present and any(g is None or any(fnmatch.fnmatch(n, g) for n in names) for g in globs):
            missing.append(i)
    return missing
