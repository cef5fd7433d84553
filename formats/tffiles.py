"""Which files of a TFRecord source hold records: shard names, TFDS layouts, splits, missing shards.

TFRecord files carry no fixed extension. What real datasets look like::

    imagenet/train-00000-of-01024            TensorFlow's shard names, no extension
    imagenet/validation-00000-of-00128       (a second split in the same folder)
    mnist/3.0.1/mnist-train.tfrecord-00000-of-00001    TFDS: <name>-<split>.tfrecord-<i>-of-<n>
    mnist/3.0.1/dataset_info.json, features.json      TFDS metadata beside them (not records)
    data/part-0.tfrecord.gz, data/part-1.tfrecords    plain names, any compression

A file named by the user (a path, or a glob or brace pattern) is read as given. A directory
contributes the files that are named like TFRecord files (``.tfrecord``/``.tfrecords``/``.tfrec``,
or ``-NNNNN-of-NNNNN``) or whose first bytes are a TFRecord record (any compression); other
files (JSON, text, images) are not records and are listed in the dataset's metadata.

Files named ``<stem>-<i>-of-<n><suffix>`` form a *shard set*: a set with a shard missing is an
error naming it (the missing shard's records would otherwise vanish without a word), and a
directory holding several sets (``train`` and ``validation``) converts one, chosen with the
``split`` option, rather than mixing them.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from unihub.errors import FormatError
from unihub.formats import sources as fsrc
from unihub.formats.foreign import expand_braces, expand_sources

TFRECORD_EXTENSIONS = (".tfrecord", ".tfrecords", ".tfrec")
_SHARD = re.compile(r"^(?P<stem>.+)-(?P<index>\d+)-of-(?P<count>\d+)(?P<suffix>(?:\.[A-Za-z0-9]+)*)$")
TFDS_METADATA = ("dataset_info.json", "features.json")
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


def named_like_tfrecord(name: str) -> bool:
    """True for ``x.tfrecord``, ``x.tfrecords.gz``, ``x.tfrecord-00000-of-00004``, ``train-00000-of-01024``."""
    base = name.removesuffix(".gz").removesuffix(".zlib").removesuffix(".zz")
    return base.endswith(TFRECORD_EXTENSIONS) or _SHARD.match(base) is not None or \
        any(ext + "-" in base for ext in TFRECORD_EXTENSIONS)


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
    listing.files = sorted(dict.fromkeys(listing.files))
    if split is not None:
        _choose_split(listing, split, sources)
    elif len(listing.splits) > 1:
        sets = "; ".join(f"{name!r} ({len(files)} files)" for name, files in sorted(listing.splits.items())[:6])
        raise FormatError(f"{sources[0]}: holds {len(listing.splits)} shard sets ({sets}); converting them together "
                          "would mix splits: choose one with --option split=NAME (e.g. split="
                          f"{split_name(sorted(listing.splits)[0])}), or convert each", path=sources[0])
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
            if name in TFDS_METADATA:
                _keep_tfds(listing, path, name)
                listing.ignored.append(path)
            elif named_like_tfrecord(name) or is_record_file(path):
                records.append(path)
            else:
                listing.ignored.append(path)
    listing.files.extend(records)
    _note_sets(listing, records, None)


def _keep_tfds(listing: Listing, path: str, name: str) -> None:
    try:
        if fsrc.getsize(path) <= _METADATA_LIMIT:
            with fsrc.open_input(path) as handle:
                listing.tfds[name.removesuffix(".json")] = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError):
        pass  # provenance only: an unreadable JSON file changes no record


def _note_sets(listing: Listing, paths: Sequence[str], glob: str | None) -> None:
    """Group shard-named ``paths`` into sets; ``glob`` lists them (None: a directory, '': named one by one)."""
    for path in paths:
        match = _SHARD.match(os.path.basename(path))
        if match is not None:
            key = os.path.join(os.path.dirname(path), f"{match['stem']}-*-of-{match['count']}{match['suffix']}")
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
    one, or a glob for some shards only, are what the user chose)."""
    for key, files in sorted(listing.splits.items()):
        globs = listing.globs.get(key)
        if not globs:
            continue
        present = {os.path.basename(p) for p in files}
        match = _SHARD.match(os.path.basename(files[0]))
        if match is None:  # never: only shard names were noted
            continue
        width, count = len(match["index"]), int(match["count"])
        names = {i: f"{match['stem']}-{i:0{width}d}-of-{match['count']}{match['suffix']}" for i in range(count)}
        missing = [i for i, name in names.items() if name not in present and
                   any(g is None or fnmatch.fnmatch(os.path.join(os.path.dirname(files[0]), name), g) for g in globs)]
        if missing:
            shown = ", ".join(str(i) for i in missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            raise FormatError(f"{key}: shard set of {count} files lacks {len(missing)} (shard {shown}): their "
                              "records would be missing; restore them, or name the files you want explicitly",
                              path=key)
