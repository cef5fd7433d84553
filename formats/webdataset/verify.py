"""``unihub verify`` for WebDataset: the shards as Python's :mod:`tarfile` reads them, and a
unihub dataset's rows as an export of them would hold them -- member names and bytes, exactly.

The reference never goes through :mod:`unihub.formats.webdataset.tarstream`'s parser, the sample stage or the
decoders the conversion used: members come from ``tarfile.open(fileobj, "r|")`` (as webdataset streams
them; a compressed shard through Python's gzip, bz2 or lzma reader, read to its end so that gzip's
CRC-32 and size are checked, which tarfile's own ``r|gz`` never does),
are grouped into samples by webdataset's key rule (adjacent runs; with ``group_keys`` every member
of a key in its shard), and each sample becomes ``{"__key__": key, ext: {member name: bytes}}``,
``ext`` being the extension in lower case (the name webdataset gives the field) and the member name
exactly as the tar holds it. The unihub side is each row as the export writes it
(:class:`~unihub.formats.webdataset.spelling.RowSpeller`: the values, spelled as the source had them),
in the same form. Nothing is normalised: ``007`` is not ``7``, a big-endian ``.npy`` is not its
little-endian twin, ``b.JPG`` is not ``b.jpg``. A difference names the shard, the key, the field and
the member: ``record 1 (shard-000000.tar key '000001'), field 'jpg'/000001.JPG: expected ..., found
nothing (missing)``.
"""

from __future__ import annotations

import lzma
import os
import re
import tarfile
import zlib
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any

from unihub.errors import FormatError
from unihub.formats.webdataset.spelling import RowSpeller
from unihub.formats.webdataset.tar import KEY_FIELD, row_key
from unihub.formats.webdataset.tarstream import decompressor
from unihub.fs import sources
from unihub.schema.unischema import Unischema

Record = dict[str, Any]
_BASE_PLUS_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset.tariterators.base_plus_ext
_SKIP_META = re.compile(r"__[^/]*__($|/)")  # webdataset.tariterators.tar_file_iterator's skip_meta


def tarfile_records(files: Iterable[str], *, group_keys: bool = False) -> Iterator[tuple[str, Record]]:
    """``(where, record)`` for every sample of ``files``, in order, read with :mod:`tarfile`."""
    for path in files:
        records: dict[str, Record] = {}  # with group_keys: the shard's samples, in first-seen order
        current: Record | None = None
        for name, data in _tar_members(path):
            match = _BASE_PLUS_EXT.match(name)
            if match is None:
                continue  # webdataset skips names without a key
            key, extension = match.group(1), match.group(2).lower()
            if group_keys:
                record = records.setdefault(key, {KEY_FIELD: key})
            else:
                if current is not None and current[KEY_FIELD] != key:
                    yield _where(path, current[KEY_FIELD]), current
                    current = None
                record = current = current or {KEY_FIELD: key}
            members = record.setdefault(extension, {})
            if name in members:
                raise FormatError(f"{path}: key {key!r} has two members named {name!r}", path=path)
            members[name] = data
        if current is not None:
            yield _where(path, current[KEY_FIELD]), current
        for key, record in records.items():
            yield _where(path, key), record


def _tar_members(path: str) -> Iterator[tuple[str, bytes]]:
    """``(name, bytes)`` of the regular, non-metadata members, as webdataset's tar_file_iterator;
    what tarfile cannot read (a corrupt header or stream, a size past what it can seek) is a
    FormatError naming the file and the last member read."""
    last: int | None = None  # offset of the last member tarfile read
    try:
        with sources.open_input(path) as raw, _decompressed(raw) as plain, \
                tarfile.open(fileobj=plain, mode="r|") as stream:
            for info in stream:
                name, last = info.name, info.offset
                if not info.isreg() or ("/" not in name and name.startswith("__") and name.endswith("__")):
                    continue
                if _SKIP_META.match(name):
                    continue
                handle = stream.extractfile(info)
                yield name, handle.read() if handle is not None else b""
                stream.members = []  # type: ignore[attr-defined]  # streaming: keep no TarInfo list (typeshed lacks it)
            if plain is not raw:  # gzip checks each member's CRC-32 and size only where it reaches them
                while plain.read(1 << 20):
                    pass
    except (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError, OverflowError, ValueError) as exc:
        where = "at its first header" if last is None else f"at or after the member at offset {last}"
        raise FormatError(f"{path}: Python's tarfile cannot read the archive {where} ({type(exc).__name__}: "
                          f"{exc}): it is corrupt or truncated", path=path, offset=last) from exc


def _decompressed(raw: IO[bytes]) -> IO[bytes]:
    """``raw``, or Python's gzip, bz2 or lzma reader of it where its first bytes say it is compressed
    (tarfile's own ``r|gz`` never checks the CRC-32)."""
    return decompressor(raw) or raw


def _where(path: str, key: str) -> str:
    return f"{os.path.basename(path)} key {key!r}"


def native_records(schema: Unischema, rows: Iterable[Mapping[str, Any]], *,
                   image_extensions: str = "content") -> Iterator[Record]:
    """Rows of a unihub dataset as :func:`tarfile_records` would read an export of them: each member
    named and encoded as the export writes it (:class:`~unihub.formats.webdataset.spelling.RowSpeller`)."""
    speller = RowSpeller(schema, image_extensions)
    keyed = KEY_FIELD in schema
    for index, row in enumerate(rows):
        key = str(row[KEY_FIELD]) if keyed else row_key(index)
        record: Record = {KEY_FIELD: key}
        for _, extension, data in speller.members(row):
            record.setdefault(extension.lower(), {})[f"{key}.{extension}"] = data
        yield record
