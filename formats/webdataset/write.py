"""Writing WebDataset shards: a unihub dataset's rows as ``<key>.<extension>`` members.

Each shard is a PAX tar starting with a global header whose ``comment`` is the
:class:`~unihub.formats.webdataset.tar.ShardHeader` JSON (the Unischema, which extension holds
which field, the shard's first row), then each sample's members in field order; null values
leave their member out; a row's :data:`~unihub.formats.webdataset.spelling.SPELLING_FIELD` (an ingest's record
of members spelled otherwise than the export would write them) is no member, but spells the row's members
back as the source had them. Members are reproducible (mode 0444, mtime 0). Each shard is a stream of
:class:`~unihub.fs.outputs.Outputs`: written beside its final name and renamed into place when
complete where the writer is given a local path, streamed straight to its place in an export that
``convert`` stages and commits as one (on any filesystem).
"""

from __future__ import annotations

import io
import posixpath
import tarfile
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from unihub.errors import CodecError, SchemaError, UnsupportedFormatError
from unihub.formats.base import ColumnBatch, python_columns
from unihub.formats.webdataset.fields import ALIASES, member_encoder
from unihub.formats.webdataset.spelling import SPELLING_FIELD, RowSpeller
from unihub.formats.webdataset.tar import KEY_FIELD, ShardHeader, escaping_reason, is_meta, row_key, split_name
from unihub.fs.outputs import Outputs, outputs_for
from unihub.schema.unischema import Unischema

#: the one member of an export of no rows (a ``__name__`` member: metadata, which every reader skips)
EMPTY_MEMBER = "__empty__"


#: samples a shard of a folder of shards holds when ``samples_per_shard`` is not given
DEFAULT_SAMPLES_PER_SHARD = 10000
#: what a one-file target's shard header records as its samples per shard: it holds every sample
_ONE_SHARD = 2**62


def write_shards(target: str | Outputs, schema: Unischema, batches: Iterable[ColumnBatch], *,
                 samples_per_shard: int | None, pattern: str, image_extensions: str, **options: Any) -> list[str]:
    """Shards of ``samples_per_shard`` samples in directory ``target``, or every sample in the one tar file
    ``target`` names (``x.tar``, where ``samples_per_shard`` is not given); see
    :meth:`~unihub.formats.webdataset.format.WebDatasetFormat.write`."""
    outputs = outputs_for(target)
    single = samples_per_shard is None and _one_file(outputs.root)
    per_shard = _ONE_SHARD if single else samples_per_shard or DEFAULT_SAMPLES_PER_SHARD
    _check_write_options(options, per_shard, pattern, image_extensions)
    members = _member_fields(schema, image_extensions)
    speller = RowSpeller(schema, image_extensions)
    if KEY_FIELD in schema and (schema[KEY_FIELD].numpy_dtype is not np.str_ or schema[KEY_FIELD].shape != ()):
        raise SchemaError(f"field {KEY_FIELD!r} of {schema.name!r} is {schema[KEY_FIELD].numpy_dtype.__name__} "
                          f"of shape {schema[KEY_FIELD].shape}; a WebDataset key is a str")
    header = ShardHeader(schema, members, image_extensions, KEY_FIELD not in schema, per_shard)
    if not single:
        outputs.makedirs()
    writer = _ShardSet(outputs, "" if single else pattern, per_shard, header)
    try:
        previous_key = None
        for index, row in enumerate(_rows(batches)):
            shard = writer.shard_for(index)
            if index % per_shard == 0:
                previous_key = None  # a new shard: webdataset ends a sample at a shard's end
            key = _checked_key(row.get(KEY_FIELD), index, previous_key, KEY_FIELD in schema)
            previous_key = key
            written = 0
            try:
                for _, extension, data in speller.members(row):
                    shard.add(_checked_member(f"{key}.{extension}", index, key), data)
                    written += 1
            except CodecError as exc:
                raise CodecError(f"row {index} (key {key!r}): {exc}", field=exc.field, row=index) from exc
            if not written:
                raise SchemaError(f"row {index} (key {key!r}): every field is null, so the sample would have no "
                                  "member and vanish from the export (a null leaves its member out); give the row "
                                  "a value, or export to another format")
        return writer.close()
    except BaseException:
        writer.abort()
        raise


def _one_file(root: str) -> bool:
    """Whether the export's target names one tar file (``x.tar``) rather than a folder of shards; a compressed
    name is refused, since the export writes plain tar (a ``.tar.gz`` holding plain tar would lie)."""
    name = posixpath.basename(root.rstrip("/")).lower()
    if name.endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")):
        raise UnsupportedFormatError(f"{posixpath.basename(root.rstrip('/'))}: a WebDataset export writes plain tar; "
                                     "name the one shard x.tar, or a "
                                     "folder for shards of samples_per_shard samples (compress them afterwards)")
    return name.endswith(".tar")


def _check_write_options(options: Mapping[str, Any], samples_per_shard: int, pattern: str,
                         image_extensions: str) -> None:
    if options:
        raise UnsupportedFormatError(f"unknown WebDataset write options: {sorted(options)}")
    if not isinstance(samples_per_shard, int) or samples_per_shard <= 0:
        raise SchemaError(f"samples_per_shard must be a positive whole number, got {samples_per_shard!r}")
    if image_extensions not in ("content", "name"):
        raise UnsupportedFormatError(f"image_extensions must be 'content' or 'name', got {image_extensions!r}")
    try:
        first, second = pattern % 0, pattern % 1
    except TypeError as exc:
        raise SchemaError(f"pattern must hold one %d-style field for the shard number, got {pattern!r}") from exc
    reason = _shard_name_problem(first, second)
    if reason is not None:
        raise SchemaError(f"pattern {pattern!r} names the first shards {first!r} and {second!r}: {reason}")


def _shard_name_problem(first: str, second: str) -> str | None:
    """Why shards named ``first``, ``second``, ... would not all read back from the export's folder, or None."""
    if first == second:
        return "every shard gets that one name, so each would replace the one before"
    outside = escaping_reason(first)
    if outside is not None:
        return f"shards must stay inside the export's folder, and {outside}"
    if any(part in ("", ".") or part.startswith((".", "_")) for part in first.split("/")):
        return "a name or folder that is empty, '.', or starts with '.' or '_' is left out when a folder is read"
    if not first.endswith(".tar"):
        return "the export writes uncompressed tar files, named .tar so that reading the folder finds them"
    return None


def _member_fields(schema: Unischema, image_extensions: str) -> dict[str, str]:
    """``member extension -> field`` (checked: one field per extension, in lower case as ingest reads it)."""
    members: dict[str, str] = {}
    for f in schema:
        if f.name in (KEY_FIELD, SPELLING_FIELD):
            continue
        extensions, _ = member_encoder(f, image_extensions)
        for extension in extensions:
            lowered = extension.lower()  # as webdataset and ingest read it
            if lowered.startswith("_") or lowered in members:
                taken = f"field {members[lowered]!r}" if lowered in members else "webdataset metadata"
                raise SchemaError(f"field {f.name!r} of {schema.name!r} maps to the member extension {extension!r}, "
                                  f"which {taken} takes too; rename the field")
            members[lowered] = f.name
    for extension, name in list(members.items()):  # a member spelled as an alias (c.jpeg) of its field's (jpg)
        for alias, main in ALIASES.items():
            if extension.rpartition(".")[2] == main:
                members.setdefault(f"{extension[:len(extension) - len(main)]}{alias}", name)
    return members


def _rows(batches: Iterable[ColumnBatch]) -> Iterator[dict[str, Any]]:
    for batch in batches:
        columns = python_columns(batch)
        n = len(next(iter(columns.values()))) if columns else 0
        for i in range(n):
            yield {name: values[i] for name, values in columns.items()}


def _checked_key(value: Any, index: int, previous: str | None, keyed: bool) -> str:
    """The sample key: ``__key__`` or the zero-padded row index, checked to read back alike."""
    if keyed and value is None:
        raise SchemaError(f"row {index}: {KEY_FIELD!r} is null; a sample needs a key (an export would make one up "
                          "that ingest could not tell from a real one)")
    key = row_key(index) if not keyed else str(value)
    if split_name(f"{key}.x") != (key, "x") or is_meta(f"{key}.x"):
        raise SchemaError(f"row {index}: key {key!r} would not read back: a key's last path component must be "
                          "non-empty and hold no dot, and no component may be a __name__ (webdataset metadata)")
    if key == previous:
        raise SchemaError(f"row {index}: key {key!r} repeats the previous row's in one shard; webdataset would merge "
                          "the two")
    return key


def _checked_member(name: str, index: int, key: str) -> str:
    """``name``, unless an extractor would write it outside its folder: refused, never rewritten, so that what
    an export writes is what the source held (a key from a hostile shard, ``../../x``, ``/etc/x``)."""
    reason = escaping_reason(name)
    if reason is not None:
        raise SchemaError(f"row {index}: key {key!r} would be written as member {name!r}, outside the folder the "
                          f"shard is extracted into ({reason}); a WebDataset export refuses it: give the row "
                          f"another {KEY_FIELD!r}, or export to another format")
    return name


class _ShardWriter:
    """One shard, a tar streamed into a file of ``outputs``."""

    def __init__(self, outputs: Outputs, name: str, header: str) -> None:
        self.outputs, self.name = outputs, name
        self.file = outputs.open(name)  # closed in commit/abort
        self.tar = tarfile.open(fileobj=self.file, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": header})

    def add(self, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), 0o444, 0  # reproducible shards
        self.tar.addfile(info, io.BytesIO(data))  # shares data's buffer (no copy)

    def commit(self) -> str:
        self.tar.close()
        self.file.close()
        return self.outputs.path(self.name)

    def abort(self) -> None:
        self.outputs.discard(self.file, self.name)


class _ShardSet:
    """The shards of one export: a new one every ``per_shard`` rows, each with its header."""

    def __init__(self, outputs: Outputs, pattern: str, per_shard: int, header: ShardHeader) -> None:
        self.outputs, self.pattern, self.per_shard, self.header = outputs, pattern, per_shard, header
        self.current: _ShardWriter | None = None
        self.written: list[str] = []
        self.names: set[str] = set()  # of the shards begun

    def shard_for(self, index: int) -> _ShardWriter:
        if index % self.per_shard == 0:
            self._commit()
            name = self.pattern % (index // self.per_shard) if self.pattern else ""  # '': the target itself
            if name in self.names:  # 's-%.1s.tar': shard 10 would replace shard 1
                raise SchemaError(f"pattern {self.pattern!r} names shard {index // self.per_shard} {name!r}, as it "
                                  "named one before, which it would replace; give the shard number in full (%d)")
            self.names.add(name)
            self.current = _ShardWriter(self.outputs, name, self.header.at(index).to_text())
        return self.current  # type: ignore[return-value]

    def _commit(self) -> None:
        if self.current is not None:
            self.written.append(self.current.commit())
            self.current = None

    def close(self) -> list[str]:
        if not self.written and self.current is None:  # no rows: one shard, so the schema still reads back,
            self.shard_for(0).add(EMPTY_MEMBER, b"")  # with a metadata member (tarfile fails on a header alone)
        self._commit()
        return self.written

    def abort(self) -> None:
        if self.current is not None:
            self.current.abort()
            self.current = None
