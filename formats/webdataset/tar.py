"""WebDataset's tar stage: a shard's members grouped into samples by webdataset's key rule,
and the header in which a unihub export records its Unischema.

A sample is a run of adjacent members sharing a key (the member name up to the first dot of
its base name; the rest, lower-cased, is the extension: webdataset's ``base_plus_ext``).
Members named ``__name__`` are metadata and skipped, as webdataset skips them; so are
directories. A key whose members are *not* adjacent (``0001.cls 0002.cls 0001.jpg``, as
``tar cf`` may order a directory) would read as two samples with one key, so it is an error
naming both runs, unless ``group_keys`` gathers each key's members from the whole shard.

A unihub export starts each shard with a PAX global extended header whose ``comment``
record (the POSIX keyword every tar tool ignores) is the JSON of :class:`ShardHeader`: the
dataset's Unischema, which member extension holds which field, and how keys were made.
webdataset, tarfile and GNU tar read past it; unihub's ingest uses it to give the exported
dataset back exactly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from unihub.errors import FormatError, SchemaError
from unihub.formats.base import OnError, SkippedRecord
from unihub.formats.webdataset.tarstream import TarFormatError, TarMember, iter_members, pax_records
from unihub.fs import sources
from unihub.schema.arrow_numpy import MAX_BINARY
from unihub.schema.metadata_json import parse_json
from unihub.schema.unischema import Unischema

KEY_FIELD = "__key__"
#: reports a malformed member: raises, or records the skip (``on_error``)
Fail = Callable[[str, int | None], None]
#: webdataset.tariterators.base_plus_ext: key = up to the first dot of the base name.
_KEY_RULE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META_RULE = re.compile(r"__[^/]*__($|/)")
HEADER_FORMAT = "unihub.webdataset"
HEADER_VERSION = 1
_HEADER_PREFIX = '{"format":"' + HEADER_FORMAT + '"'


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member name by webdataset's rule, or None when it has no key."""
    match = _KEY_RULE.match(name)
    return None if match is None else (match.group(1), match.group(2).lower())


def is_meta(name: str) -> bool:
    """webdataset skips ``__name__`` members (at the top level or as a directory prefix)."""
    return _META_RULE.match(name) is not None


def escaping_reason(name: str) -> str | None:
    """Why a member ``name`` would be written outside the folder a tar is extracted into, by an extractor that
    does not filter names (``tarfile.extractall`` without a filter, GNU tar without its default checks,
    extractors on Windows), or None where it stays inside."""
    if name.startswith("/"):
        return "it is an absolute path"
    if ".." in name.split("/"):
        return "it has a '..' component, which climbs out of the folder"
    if "\\" in name:
        return "it holds a backslash, a path separator to Windows extractors"
    if "\0" in name:
        return "it holds a NUL byte, where tar headers end a name"
    return None


def row_key(index: int) -> str:
    """The key an export gives row ``index`` of a dataset without a ``__key__`` field."""
    return f"{index:09d}"


# ------------------------------------------------------------------------------ the header
@dataclass(frozen=True)
class ShardHeader:
    """What a unihub export records in each shard (the JSON of a PAX global ``comment``).

    ``members`` maps each member extension the export may write to its field (an image field
    has two: ``image.png`` and ``image.jpg``, by each cell's bytes); ``image_extensions`` is
    the export's rule for them. ``first_row`` is the dataset row of the shard's first sample
    (shards read back in export order, whatever their names sort as); ``row_keys`` says the
    dataset had no ``__key__`` field, so the keys are row numbers (:func:`row_key`).
    """

    schema: Unischema
    members: dict[str, str]
    image_extensions: str
    row_keys: bool
    samples_per_shard: int
    first_row: int = 0

    def to_text(self) -> str:
        return json.dumps({"format": HEADER_FORMAT, "version": HEADER_VERSION,
                           "schema": json.loads(self.schema.to_json()), "members": self.members,
                           "image_extensions": self.image_extensions, "keys": "rows" if self.row_keys else KEY_FIELD,
                           "samples_per_shard": self.samples_per_shard, "first_row": self.first_row},
                          separators=(",", ":"))

    def at(self, first_row: int) -> ShardHeader:
        """This header for the shard starting at row ``first_row``."""
        return ShardHeader(self.schema, self.members, self.image_extensions, self.row_keys, self.samples_per_shard,
                           first_row)

    @classmethod
    def from_text(cls, text: str, path: str) -> ShardHeader | None:
        """The header in a PAX ``comment``, or None when the comment is not a unihub header."""
        if not text.startswith(_HEADER_PREFIX):
            return None
        try:
            body = parse_json(text)
        except ValueError as exc:
            raise _corrupt(path, exc) from exc
        if body.get("version") != HEADER_VERSION:
            raise FormatError(f"{path}: unihub header version {body.get('version')!r} is not supported (this unihub "
                              f"reads version {HEADER_VERSION}); upgrade unihub", path=path, offset=0)
        try:
            return cls(Unischema.from_json(json.dumps(body["schema"])), dict(body["members"]),
                       str(body["image_extensions"]), body["keys"] == "rows", int(body["samples_per_shard"]),
                       int(body["first_row"]))
        except (ValueError, KeyError, TypeError, SchemaError) as exc:
            raise _corrupt(path, exc) from exc

    def same_dataset(self, other: ShardHeader) -> bool:
        """True when both shards come from one export (all but the first row agree)."""
        return self.at(0) == other.at(0)


def _corrupt(path: str, exc: Exception) -> FormatError:
    return FormatError(f"{path}: the unihub header (PAX global comment) is corrupt: {exc}; read the shard with "
                       "--option unihub_schema=false to name fields by member extension", path=path, offset=0)


def _header_of(member: TarMember, path: str) -> ShardHeader | None:
    comment = pax_records(member, path).get("comment")
    return None if comment is None else ShardHeader.from_text(comment, path)


def is_unihub_comment(comment: str | None) -> bool:
    """Whether a shard's PAX global ``comment`` is the header a unihub export writes."""
    return comment is not None and comment.startswith(_HEADER_PREFIX)


def read_header(path: str) -> ShardHeader | None:
    """The unihub header of shard ``path`` (a PAX global header before its first member), or None;
    reads no member's data (ingest reads each shard once)."""
    for member in iter_members(path, regular_only=False, globals_only=True):
        header = _header_of(member, path)
        if header is not None:
            return header
    return None


# ----------------------------------------------------------------------------- samples
@dataclass
class Sample:
    """One sample: its shard, key, the offset of its first member, and ``extension -> bytes`` (the
    extension in lower case, as webdataset names it; ``spelled`` holds the ones spelled otherwise)."""

    url: str
    key: str
    offset: int
    members: dict[str, bytes] = field(default_factory=dict)
    #: the sample's position in its shard (0, 1, ...)
    index: int = 0
    #: ``extension -> the extension as the member's name spells it``, where not in lower case (``JPG``)
    spelled: dict[str, str] = field(default_factory=dict)


class Grouper:
    """Members -> samples for one shard: adjacent runs (a repeated key is an error), or with
    ``group_keys`` every member of a key, wherever it is, held until the shard ends."""

    def __init__(self, path: str, group_keys: bool, fail: Fail) -> None:
        self.path, self.group_keys, self.fail = path, group_keys, fail
        self.started = False  # a member (not a PAX global header) was seen
        self.offset: int | None = 0  # of the last member taken
        self.current: Sample | None = None
        self.runs: dict[str, int] = {}  # key -> offset of its first member (a run's, or the group's)
        self.held: dict[str, Sample] = {}  # group_keys: every sample of the shard, in first-seen order
        self.skipping: str | None = None  # the key of a repeated run being skipped (on_error='skip')
        self.exported = False  # a unihub export's shard: a row's members are adjacent, so a key seen again is a row

    def take(self, member: TarMember) -> Sample | None:
        """Add one member of the shard (any kind); returns the sample it completed, if any."""
        offset = self.offset = member.offset
        if member.type == "g":
            if self.started and _header_of(member, self.path) is not None:
                self.fail(f"a unihub header at offset {offset} follows samples: exports were joined into one "
                          "tar; split them, or pass --option unihub_schema=false", offset)
            comment = pax_records(member, self.path).get("comment")
            self.exported = self.exported or (comment is not None and comment.startswith(_HEADER_PREFIX))
            return None
        self.started = True
        name = member.name
        if member.type == "0" and "/" not in name and name[:2] != "__" and name.isascii():
            key, dot, extension = name.partition(".")  # the key rule, for the usual plain names
            parts = (key, extension.lower()) if key and extension else _member_parts(member, self.fail)
        elif member.isdir or is_meta(name):
            return None
        else:
            parts = _member_parts(member, self.fail)
        return None if parts is None else self.add(name, parts[0], parts[1], offset, member.data)

    def add(self, name: str, key: str, extension: str, offset: int, data: bytes) -> Sample | None:
        """Add a member; returns the sample it completed, if any."""
        if self.group_keys:
            sample = self.held.get(key)
            if sample is None:
                sample = self.held[key] = Sample(self.path, key, offset)
            self._put(sample, name, extension, offset, data)
            return None
        done = None
        if self.current is not None and self.current.key != key:
            done, self.current = self.current, None
        if self.current is None and key != self.skipping:
            self.skipping = None
            first = None if self.exported else self.runs.get(key)
            if first is not None:
                self.skipping = key
                self.fail(f"key {key!r} has members at offset {first} and again at offset {offset}, with other "
                          "keys between: webdataset would read two samples with one key (a tar made from a "
                          "directory with tar cf may order members so); pass --option group_keys=true to gather "
                          "each key's members from the whole shard", offset)
                return done
            self.runs[key] = offset
            self.current = Sample(self.path, key, offset)
        if key != self.skipping:
            self._put(self.current, name, extension, offset, data)  # type: ignore[arg-type]
        return done

    def _put(self, sample: Sample, name: str, extension: str, offset: int, data: bytes) -> None:
        if len(data) > MAX_BINARY:  # else pyarrow's own error, naming no shard, once the row is stored
            self.fail(f"member {name!r} at offset {offset} holds {len(data)} bytes, more than one value of a "
                      f"Parquet column holds ({MAX_BINARY}); leave it out of the shard", offset)
            return
        if extension in sample.members:
            first = f"{sample.key}.{sample.spelled.get(extension, extension)}"
            self.fail(f"member {name!r} at offset {offset}: key {sample.key!r} already has a .{extension} "
                      f"member ({first!r}; samples are runs of members with one key, and webdataset reads "
                      "extensions in lower case)", offset)
            return
        sample.members[extension] = data
        spelled = name[len(sample.key) + 1:]
        if spelled != extension:
            sample.spelled[extension] = spelled

    def finish(self) -> list[Sample]:
        """The samples still open at the end of the shard."""
        if self.group_keys:
            return list(self.held.values())
        return [self.current] if self.current is not None else []


def iter_samples(path: str, *, on_error: OnError = "raise", skipped: list[SkippedRecord] | None = None,
                 group_keys: bool = False) -> Iterator[Sample]:
    """The samples of one shard, in order; malformed members raise or are listed in ``skipped``."""
    grouper = Grouper(path, group_keys, failer(path, on_error, skipped))
    count = 0
    try:
        for member in iter_members(path, regular_only=False, require_end=True):
            done = grouper.take(member)
            if done is not None:
                done.index, count = count, count + 1
                yield done
    except (TarFormatError, OSError) as exc:
        complete, report = after_damage(exc, grouper)
        for done in complete:
            done.index = count
            yield done
        report()
        return
    for index, done in enumerate(grouper.finish(), start=count):
        done.index = index
        yield done


def failer(path: str, on_error: OnError, skipped: list[SkippedRecord] | None) -> Fail:
    """What reports a malformed member of shard ``path``: raises, or lists the skip in ``skipped``."""

    def fail(message: str, offset: int | None) -> None:
        where = f"offset {offset}" if offset is not None else "shard"
        if on_error == "raise":
            raise FormatError(f"{path}: {message}", path=path, offset=offset)
        if skipped is not None:
            skipped.append(SkippedRecord(path, where, message))

    return fail


def _member_parts(member: TarMember, fail: Fail) -> tuple[str, str] | None:
    """``(key, extension)`` of a regular member, or None (reported) for links, keyless names and names
    without an extension (which would name no field)."""
    if not member.isreg:
        fail(f"member {member.name!r} at offset {member.offset} is not a regular file (link or device); "
             "a WebDataset member holds the bytes of one field", member.offset)
        return None
    if not sources.utf8_name(member.name):
        fail(f"member {member.name.encode('utf-8', 'surrogateescape')!r} at offset {member.offset}: its name is not "
             "UTF-8, and a WebDataset key and extension are text; rename the member (convmv -f <charset> -t utf8)",
             member.offset)
        return None
    parts = split_name(member.name)
    if parts is None:
        fail(f"member {member.name!r} at offset {member.offset} has no key: a member is named "
             "<key>.<extension>, with a key before the first dot", member.offset)
    elif not parts[1]:
        fail(f"member {member.name!r} at offset {member.offset} has no extension: a member is named "
             "<key>.<extension>, and the extension names its field", member.offset)
        return None
    return parts


def after_damage(exc: Exception, grouper: Grouper) -> tuple[list[Sample], Callable[[], None]]:
    """A corrupt or cut shard: the samples proven complete (to yield first), and what reports the rest
    (raises, or lists the skip)."""
    offset = grouper.offset
    complete: list[Sample] = []
    current = None if grouper.group_keys else grouper.current
    if isinstance(exc, TarFormatError):
        offset = exc.offset
        parts = None if exc.member is None or is_meta(exc.member) else split_name(exc.member)
        if current is not None and parts is not None and parts[0] != current.key:
            complete.append(current)  # the damaged member starts another key: this sample is complete
            current = None
    reason = exc.reason if isinstance(exc, TarFormatError) else str(exc)
    pending = f"; sample {current.key!r} is incomplete" if current is not None else ""
    if grouper.group_keys and grouper.held:
        pending = (f"; the {len(grouper.held)} samples read so far are left out (with group_keys a key's "
                   "members may come later)")
    unsupported = isinstance(exc, TarFormatError) and exc.unsupported  # not damage: no 'truncated or corrupt'
    message = f"{'unreadable' if unsupported else 'truncated or corrupt'} tar after offset {offset}: {reason}{pending}"
    return complete, lambda: grouper.fail(message, offset)
