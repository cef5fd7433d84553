"""Fast, checked iteration over the members of a tar archive.

:mod:`tarfile` spends ~70 µs a member (TarInfo objects, PAX and octal parsing in Python,
checksums byte by byte), which dominates WebDataset ingest. This module parses the
512-byte headers itself, with only what reading needs: the name (ustar name + prefix, GNU
``L`` long names, PAX ``path``), the size (octal, GNU base-256, PAX ``size``) and the
type. Plain archives are memory-mapped: their usual headers (ustar, GNU, PAX with only times)
are found with numpy a window of 4 MiB at a time and their checksums checked together, ~2x as
fast as the header loop, which reads anything else and every damaged header, from that member on
(:func:`_parse_mapped`; ``iter_members(parser="reference")`` reads with the loop alone, see
:data:`PARSERS`); gzip, bzip2 and xz archives are streamed through their decompressor, to the end of
the file after the tar's end (:func:`read_to_end`: a gzip member's CRC-32 is checked there).
Every header's checksum is verified (in the loop by ``zlib.adler32`` over three spans, each short
enough that its byte sum cannot wrap), and a bad header or a truncated member raises
:class:`TarFormatError` with the file and the byte offset, where tarfile would stop silently or
report neither. A size field no file can have (negative, past 2^63, a 5,000-digit PAX size) is
such an error too; a size larger than the rest of a plain archive is one before anything is read,
and a compressed archive's members are read a piece at a time, so memory follows the bytes really
there. Links, directories, devices and FIFOs have no data blocks whatever their size field says,
as tarfile reads them. The archive ends at its first zero block, as tarfile's does; a tar header after it
(a header zeroed by damage, tars joined with ``cat``) is an error where tarfile drops the members there.

PAX global headers (typeflag ``g``, which tarfile keeps in ``TarFile.pax_headers``) are not
members; with ``regular_only=False`` they come as members of type ``"g"`` whose data is the
header's records, read with :func:`pax_records` (a unihub export keeps its schema in one).
"""

from __future__ import annotations

import bisect
import bz2
import gzip
import lzma
import mmap
import zlib
from collections.abc import Callable, Iterator
from typing import IO, Any, Literal, NamedTuple, NoReturn, cast

import numpy as np

from unihub.errors import FormatError, InvalidArgumentError
from unihub.fs import sources

BLOCK = 512
_ZERO = bytes(BLOCK)
_COMPRESSED: tuple[tuple[bytes, Callable[..., Any]], ...] = (
    (b"\x1f\x8b", gzip.open), (b"BZh", bz2.open), (b"\xfd7zXZ\x00", lzma.open))
_REGULAR = frozenset(b"0\x007")  # typeflags of regular files: '0', old '\0', contiguous '7'
_NO_DATA = frozenset(b"123456")  # hard/symbolic links, devices, directories, FIFOs: no data blocks follow
_MAX_SIZE = (1 << 63) - 1  # no file is larger: a larger size field is corrupt
#: the names of :data:`PARSERS`
Parser = Literal["fast", "reference"]
_PIECE = 64 << 20  # a member larger than this is read a piece at a time
_DRAIN = 1 << 20  # what :func:`read_to_end` reads at a time
_DIRECTORY, _SPARSE, _GLOBAL = ord("5"), ord("S"), ord("g")


class TarMember(NamedTuple):
    """One member: its name, the offset of its first header (its PAX or GNU long-name header
    when it has one, as tarfile's ``TarInfo.offset``), its bytes (empty unless a regular
    file; a PAX global header's records) and its typeflag (``"0"`` for regular files, ``"5"``
    directories, ``"2"`` symlinks, ``"g"`` PAX global headers)."""

    name: str
    offset: int
    data: bytes
    type: str = "0"

    @property
    def isreg(self) -> bool:
        return self.type == "0"

    @property
    def isdir(self) -> bool:
        return self.type == "5"


class TarFormatError(FormatError):
    """A corrupt or truncated archive; ``member`` names the member being read, if known. ``unsupported``: the
    archive is sound, but holds what this reader does not read (a sparse file)."""

    def __init__(self, path: str, offset: int, reason: str, member: str | None = None, *,
                 unsupported: bool = False) -> None:
        super().__init__(f"{path}: {reason}", path=path, offset=offset)
        self.reason = reason
        self.member = member
        self.unsupported = unsupported


def iter_members(path: str, *, regular_only: bool = True, require_end: bool = False,
                 globals_only: bool = False, parser: Parser = "fast") -> Iterator[TarMember]:
    """The members of tar file ``path``, in order: regular files only unless ``regular_only``
    is False (then other members come with empty data, directory names without their slash).
    ``globals_only``: only the PAX global headers before the first member (none of its data is read).

    The archive ends at a zero block, or at end of file on a block boundary unless
    ``require_end`` (then a missing end-of-archive marker means the file was cut short).
    ``parser``: which of :data:`PARSERS` reads a plain local archive (both give the same).
    """
    if parser not in PARSERS:
        raise InvalidArgumentError(f"parser must be one of {sorted(PARSERS)}, got {parser!r}")
    return cast(Iterator[TarMember], _items(path, regular_only, require_end, globals_only, tables=False,
                                            parser=parser))


def iter_tables(path: str, *, require_end: bool = False) -> Iterator[MemberTable | TarMember]:
    """:func:`iter_members` (``regular_only=False``) a window at a time where it can: in a plain local
    archive, the members :func:`_walk` finds come as one :class:`MemberTable` a window, with no object
    a member; every other member (and every member of a compressed or remote archive) comes alone."""
    return _items(path, False, require_end, False, tables=True)


def _items(path: str, regular_only: bool, require_end: bool, globals_only: bool,
           tables: bool, parser: Parser = "fast") -> Iterator[MemberTable | TarMember]:
    """The archive's members through the reader its bytes call for: decompressed, buffered (remote),
    or memory-mapped and read by ``PARSERS[parser]`` (walked with numpy in tables where ``tables``)."""
    with sources.open_input(path) as raw:
        head = raw.read(6)
        raw.seek(0)
        decompressing = decompressor(raw)
        if decompressing is not None:
            with decompressing as stream:
                read = _guarded(stream, path, raw)
                yield from _parse(read, path, regular_only, require_end, None, globals_only)
                if not globals_only:  # a whole read: the stream's end (gzip's CRC-32 and size) must be intact
                    read_to_end(read)
        elif head and sources.is_url(path):  # a remote file: read through its buffer
            yield from _parse(raw.read, path, regular_only, require_end, sources.getsize(path), globals_only)
        elif head:
            with mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                if globals_only:
                    yield from _parse(mapped.read, path, regular_only, require_end, len(mapped), globals_only)
                elif tables:
                    yield from _mapped_tables(mapped, path, require_end)
                else:
                    yield from PARSERS[parser](mapped, path, regular_only, require_end)
        elif require_end:
            raise TarFormatError(path, 0, "empty file: not a tar archive")


def decompressor(raw: IO[bytes]) -> IO[bytes] | None:
    """A decompressing reader of ``raw`` (at its start) where its first bytes are gzip, bzip2 or xz
    magic, else None (``raw`` is back at its start)."""
    head = raw.read(6)
    raw.seek(0)
    opener = next((o for magic, o in _COMPRESSED if head.startswith(magic)), None)
    return None if opener is None else cast(IO[bytes], opener(raw))


def _guarded(stream: IO[bytes], path: str, raw: IO[bytes]) -> Callable[[int], bytes]:
    """``stream.read`` raising TarFormatError, at the uncompressed offset, for a corrupt stream; the
    message names the compressed file's byte ``raw`` had reached too (where a cut or bad trailer is)."""

    def read(size: int) -> bytes:
        try:
            return stream.read(size)
        except (OSError, EOFError, zlib.error, lzma.LZMAError) as exc:
            offset = stream.tell()
            raise TarFormatError(path, offset, f"corrupt compressed stream near offset {offset} (compressed byte "
                                               f"{raw.tell()}): {exc}") from exc

    return read


def read_to_end(read: Callable[[int], bytes]) -> None:
    """Reads and drops what a decompressing ``read`` holds past the tar's end-of-archive marker (a
    record's zero padding, usually), so that the decompressor checks what only the end of the file
    holds: each gzip member's CRC-32 and size trailer (gzip checks them only when it reaches them), a
    cut, garbage after the last member. Every member of a multi-member gzip is read (RFC 1952)."""
    while read(_DRAIN):
        pass


class _Pending:
    """What the extended headers before a member said about it: the offset of the first of them (the
    member's offset, as tarfile's ``TarInfo.offset``), a GNU long name, PAX records that change what is read."""

    __slots__ = ("first", "name", "pax")

    def __init__(self) -> None:
        self.first: int | None = None
        self.name: str | None = None
        self.pax: dict[bytes, bytes] = {}


#: what reading a member's header gives: the member to yield (None: not wanted), the offset of the next
#: header, and an error to raise once the member is out (the archive ends inside its padding)
_Read = tuple[TarMember | None, int, TarFormatError | None]


def _parse(read: Callable[[int], bytes], path: str, regular_only: bool, require_end: bool,
           total: int | None = None, globals_only: bool = False, start: int = 0) -> Iterator[TarMember]:
    """The header loop over a forward-only ``read`` (of a mmap of ``total`` bytes, or a decompressing
    file, whose size is unknown: None); ``globals_only`` stops at the first member's header. ``start``:
    the offset ``read`` is at, a member's first header (:func:`_parse_mapped` hands over there).

    Each header goes to the function of its kind: an extended header (:data:`_EXTENDED_HEADERS`) notes
    what it says about the next member; a member's header (:data:`_MEMBER_HEADERS`) reads the member."""
    adler32, max_size, extended_headers, member_headers = zlib.adler32, _MAX_SIZE, _EXTENDED_BY_KIND, _MEMBER_BY_KIND
    offset = start  # of the next header
    pending = _Pending()
    while True:
        header = read(BLOCK)
        if len(header) < BLOCK or header == _ZERO:
            _check_end(path, offset, header, pending.first, require_end)
            if header:
                _check_after_end(read, path, offset)
            return
        # the checksum and the size field, inline (a function call here cost 1.5% of the loop's time): adler32's
        # low half is 1 + the byte sum (exact: each span sums below 65521); the checksum field counts as spaces
        found = (adler32(header[:148]) & 0xFFFF) + (adler32(header[156:400]) & 0xFFFF) \
            + (adler32(header[400:]) & 0xFFFF) + 8 * 32 - 3
        if header[148:156] != b"%06o\0 " % found:  # tarfile's and GNU tar's layout; else parse the field
            _check_signed(path, offset, header, found)
        kind = header[156]
        try:
            size = int(header[124:135], 8) if header[135] == 0 else _number(header[124:136])
        except ValueError:  # not plain octal digits: base-256, spaces, ...
            size = _number(header[124:136])
        if not 0 <= size <= max_size:
            _bad_size(path, offset, header, kind, size, pending.name)
        extended = extended_headers[kind]
        if extended is not None:
            member = extended(path, header, offset, _extended_records(read, path, offset, kind, size, total), pending)
            offset += BLOCK + size + (-size % BLOCK)
            if member is not None and not regular_only:
                yield member
            continue
        if globals_only:
            return
        if pending.first is None:  # no extended header before it: the usual member
            first, name = offset, _header_name(header)
        else:
            first, name, size = _pending_member(path, header, size, pending)
            pending = _Pending()
        member, offset, error = member_headers[kind](
            read, path, header, kind, offset, first, name, size, total, regular_only)
        if member is not None:
            yield member
        if error is not None:
            raise error


def _check_end(path: str, offset: int, header: bytes, first: int | None, require_end: bool) -> None:
    """Returns where a short or zero ``header`` at ``offset`` is the archive's proper end; raises where
    it ends after an extended header (at ``first``), inside a header, or without its end-of-archive marker
    where ``require_end``."""
    if first is not None:
        raise TarFormatError(path, first, f"the archive ends after the extended header at offset {first}, "
                                          "before its member")
    if header == _ZERO or not (header or require_end):
        return
    raise TarFormatError(path, offset, f"truncated tar header at offset {offset}: the file ends "
                                       f"{len(header)} bytes into it" if header else
                                       f"the archive ends at offset {offset} without the end-of-archive "
                                       "marker (zero blocks)")


def _check_after_end(read: Callable[[int], bytes], path: str, end: int) -> None:
    """Raises where a tar header follows the end-of-archive marker at ``end``: a zeroed header, or tars joined
    with ``cat``, whose members tarfile and webdataset drop without a word. Zero padding and other bytes pass."""
    offset = end + BLOCK
    while chunk := read(_DRAIN):
        blocks = np.frombuffer(chunk, np.uint8, len(chunk) // BLOCK * BLOCK).reshape(-1, BLOCK)
        candidates = np.flatnonzero(np.isin(blocks[:, 148], np.frombuffer(b" 01234567", np.uint8)) & blocks.any(axis=1))
        heads = blocks[candidates].astype(np.int64)
        sums = heads.sum(axis=1) - heads[:, 148:156].sum(axis=1) + 8 * 32  # the checksum field counts as spaces
        for k, found in zip(candidates.tolist(), sums.tolist()):
            if _number(chunk[k * BLOCK + 148:k * BLOCK + 156]) == found:
                here = offset + k * BLOCK
                raise TarFormatError(path, here, f"a tar header at offset {here} follows the end-of-archive marker "
                                                 f"at offset {end}: a zeroed header, or tars joined with cat (GNU tar "
                                                 "reads those with --ignore-zeros); its members would be lost")
        offset += len(chunk)


def _bad_size(path: str, offset: int, header: bytes, kind: int, size: int, pending_name: str | None) -> NoReturn:
    """Raises for the header at ``offset``, whose size field holds ``size``, no file's size: naming the
    member (``pending_name``: a GNU long name before it) unless the header is an extended one."""
    named = None if kind in _EXTENDED else pending_name or _header_name(header)
    raise TarFormatError(path, offset, f"bad size in the tar header at offset {offset}"
                                       f"{'' if named is None else f' (member {named!r})'}: "
                                       f"{'negative' if size < 0 else f'{size}, larger than any file'}", named)


# ------------------------------------------------------------------ extended headers, one function a kind
def _extended_records(read: Callable[[int], bytes], path: str, here: int, kind: int, size: int,
                      total: int | None) -> bytes:
    """The ``size`` bytes of the extended header at ``here`` (its padding read and dropped); raises
    where the archive ends first (a mapped archive of ``total`` bytes: before reading)."""
    padded = size + (-size % BLOCK)
    body = b"" if total is not None and size > total - here - BLOCK else _read(read, padded)
    if len(body) < size:
        raise TarFormatError(path, here, f"truncated {chr(kind)!r} extended header at offset {here}")
    return body[:size]  # not the padding after them


def _gnu_long_name(path: str, header: bytes, here: int, records: bytes, pending: _Pending) -> None:
    """GNU ``L``: the next member's name."""
    pending.first = here if pending.first is None else pending.first
    pending.name = _nts(records).decode("utf-8", "surrogateescape")


def _gnu_long_link(path: str, header: bytes, here: int, records: bytes, pending: _Pending) -> None:
    """GNU ``K``: the next member's link target, which reading files does not need."""


def _pax_extended(path: str, header: bytes, here: int, records: bytes, pending: _Pending) -> None:
    """PAX ``x`` (``X``: Solaris): records about the next member; only a path, a size or sparse maps
    change what is read (times and owners do not)."""
    pending.first = here if pending.first is None else pending.first
    if b" path=" in records or b" size=" in records or b" GNU.sparse." in records:
        pending.pax.update(_pax_records(records, path, here))


def _pax_global(path: str, header: bytes, here: int, records: bytes, pending: _Pending) -> TarMember:
    """PAX ``g``: records about the whole archive, a member of type ``"g"`` (with ``regular_only=False``)."""
    return TarMember(_header_name(header), here, records, "g")


_ExtendedHeader = Callable[[str, bytes, int, bytes, _Pending], TarMember | None]
#: typeflag -> the reader of an extended header of that kind (they are about the next member, or the archive)
_EXTENDED_HEADERS: dict[int, _ExtendedHeader] = {
    ord("L"): _gnu_long_name, ord("K"): _gnu_long_link, ord("x"): _pax_extended, ord("X"): _pax_extended,
    _GLOBAL: _pax_global}
_EXTENDED = frozenset(_EXTENDED_HEADERS)
_EXTENDED_BY_KIND = tuple(_EXTENDED_HEADERS.get(kind) for kind in range(256))  # indexing: faster than .get


# ------------------------------------------------------------------ member headers, one function a kind
def _pending_member(path: str, header: bytes, size: int, pending: _Pending) -> tuple[int, str, int]:
    """The offset, name and size of a member whose extended headers said something: a GNU long name,
    a PAX path and size (checked), PAX sparse maps (refused)."""
    first = cast(int, pending.first)
    name, pax = pending.name, pending.pax
    if pax:
        name = pax[b"path"].decode("utf-8", "surrogateescape") if b"path" in pax else name
        name = _header_name(header) if name is None else name
        if b"size" in pax:
            size = _decimal(pax[b"size"])
            if not 0 <= size <= _MAX_SIZE:
                raise TarFormatError(path, first, f"member {name!r} at offset {first}: PAX size "
                                                  f"{_clip(pax[b'size'])!r} is not the size of a file", name)
        if b"GNU.sparse" in pax:
            raise TarFormatError(path, first, f"member {name!r} at offset {first} is a sparse file (PAX), "
                                              f"which is not supported; {_NOT_SPARSE}", name, unsupported=True)
    return first, _header_name(header) if name is None else name, size


def _data_member(read: Callable[[int], bytes], path: str, header: bytes, kind: int, here: int, first: int,
                 name: str, size: int, total: int | None, regular_only: bool) -> _Read:
    """A regular file (``0``, old ``\\0``, contiguous ``7``), or a kind unihub does not know, whose data
    is read and dropped: ``size`` bytes follow the header, padded to a block."""
    padded = size + (-size % BLOCK)
    offset = here + BLOCK + padded
    if size <= _PIECE:
        data = read(size)
    elif total is not None and size > total - offset + padded:  # a mapped file: refused before reading
        raise TarFormatError(path, first, f"member {name!r} at offset {first} is truncated: the file holds "
                                          f"{total - offset + padded} of its {size} bytes", name)
    else:
        data = _read(read, size)
    if len(data) < size:
        raise TarFormatError(path, first, f"member {name!r} at offset {first} is truncated: the file holds "
                                          f"{len(data)} of its {size} bytes", name)
    cut = padded != size and len(read(padded - size)) < padded - size
    error = None if not cut else TarFormatError(
        path, offset, f"the archive ends inside the padding of member {name!r}, without the end-of-archive marker",
        name)
    if kind in _REGULAR:
        return TarMember(name, first, data), offset, error
    return (None if regular_only else TarMember(name, first, b"", chr(kind))), offset, error


def _no_data_member(read: Callable[[int], bytes], path: str, header: bytes, kind: int, here: int, first: int,
                    name: str, size: int, total: int | None, regular_only: bool) -> _Read:
    """A hard or symbolic link, device, directory or FIFO: no data blocks, whatever the size field says
    (tarfile's rule; else they would swallow members). A directory's name comes without its slash."""
    if regular_only:
        return None, here + BLOCK, None
    directory = kind in (_DIRECTORY, 0)  # 0: an old-style name ending in '/' (:func:`_old_style_member`)
    member = TarMember(name.rstrip("/") if directory else name, first, b"", "5" if directory else chr(kind))
    return member, here + BLOCK, None


def _old_style_member(read: Callable[[int], bytes], path: str, header: bytes, kind: int, here: int, first: int,
                      name: str, size: int, total: int | None, regular_only: bool) -> _Read:
    """Typeflag ``\\0`` (pre-POSIX tar): a directory where the name ends in ``/`` (tarfile's rule), else
    a regular file."""
    member = _no_data_member if _nts(header[:100]).endswith(b"/") else _data_member
    return member(read, path, header, kind, here, first, name, size, total, regular_only)


def _sparse_member(read: Callable[[int], bytes], path: str, header: bytes, kind: int, here: int, first: int,
                   name: str, size: int, total: int | None, regular_only: bool) -> _Read:
    """GNU ``S``: a sparse file, refused."""
    raise TarFormatError(path, first, f"member {name!r} at offset {first} is a sparse file, which is not supported; "
                                      f"{_NOT_SPARSE}", name, unsupported=True)


_NOT_SPARSE = "write the shard without GNU tar's --sparse (-S)"


_MemberHeader = Callable[[Callable[[int], bytes], str, bytes, int, int, int, str, int, int | None, bool], _Read]
#: typeflag -> the reader of a member of that kind; any other kind is :func:`_data_member`'s
_MEMBER_HEADERS: dict[int, _MemberHeader] = {
    **dict.fromkeys(_NO_DATA, _no_data_member), 0: _old_style_member, _SPARSE: _sparse_member}
_MEMBER_BY_KIND = tuple(_MEMBER_HEADERS.get(kind, _data_member) for kind in range(256))  # indexing: faster than .get


#: blocks of the archive :func:`_walk` looks at a time (4 MiB)
_WINDOW = 8192
_PAX_KINDS = (ord("x"), ord("X"))
_FAST_KINDS = np.array([ord("0"), ord("7"), 0, _DIRECTORY, _GLOBAL, *_PAX_KINDS], np.uint8)
_FAST_KIND = np.isin(np.arange(256), _FAST_KINDS)  # typeflag byte -> the walk reads it
_REGULAR_KIND = np.isin(np.arange(256), list(_REGULAR))  # typeflag byte -> a regular file
_SIZE_WEIGHTS = 8 ** np.arange(10, -1, -1, dtype=np.int64)  # an 11-digit octal size field
_DIGIT_0 = np.uint8(ord("0"))  # ``byte - _DIGIT_0 < 8`` (uint8, wrapping) for an octal digit
_SUM_WEIGHTS = 8 ** np.arange(5, -1, -1, dtype=np.int64)  # a 6-digit octal checksum field


class MemberTable(NamedTuple):
    """The usual members of one window of a memory-mapped plain archive, found by :func:`_walk`, as
    columns: names, the offset of each one's first header (a PAX header, if any; as
    :attr:`TarMember.offset`), of its own header, its typeflag byte and size. Its data is
    ``buffer[own + 512:own + 512 + size]``; ``buffer`` is the mapped archive, valid until the
    iteration that gave the table goes on (copy what you keep)."""

    names: list[str]
    firsts: np.ndarray
    owns: np.ndarray
    kinds: np.ndarray
    sizes: np.ndarray
    buffer: mmap.mmap

    def members(self, regular_only: bool = False, start: int = 0, stop: int | None = None) -> Iterator[TarMember]:
        """The table's members (``start:stop``) as :func:`iter_members` gives them."""
        mapped = self.buffer
        cut = slice(start, stop)
        for name, first, own, kind, size in zip(self.names[cut], self.firsts[cut].tolist(), self.owns[cut].tolist(),
                                                self.kinds[cut].tolist(), self.sizes[cut].tolist()):
            if kind == _DIRECTORY:
                if not regular_only:
                    yield TarMember(name.rstrip("/"), first, b"", "5")
            elif kind != _GLOBAL:
                yield TarMember(name, first, mapped[own + BLOCK:own + BLOCK + size])
            elif not regular_only:
                yield TarMember(name, own, mapped[own + BLOCK:own + BLOCK + size], "g")

    @property
    def regular(self) -> bool:
        """True when every member is a regular file."""
        return bool(_REGULAR_KIND[self.kinds].all())


class _Run(NamedTuple):
    """What :func:`_walk` found, and where the next run starts. ``rest``: from there on only
    :func:`_parse` may read."""

    table: MemberTable
    next: int
    rest: bool


_NONE = np.zeros(0, np.int64)


def _mapped_tables(mapped: mmap.mmap, path: str, require_end: bool) -> Iterator[MemberTable | TarMember]:
    """The tables of :func:`_walk`, then :func:`_parse`'s members from where it stops."""
    total = len(mapped)
    offset = 0
    while True:
        run = _walk(mapped, offset, total)
        if run.table.names:
            yield run.table
        if run.rest:
            mapped.seek(run.next)
            yield from _parse(mapped.read, path, False, require_end, total, start=run.next)
            return
        offset = run.next


def _parse_mapped(mapped: mmap.mmap, path: str, regular_only: bool, require_end: bool) -> Iterator[TarMember]:
    """:func:`_parse` over a memory-mapped plain archive, several times faster on the usual headers:
    ustar, GNU or PAX with only times; regular files, directories and PAX global headers; sizes and
    checksums as tar writes them. :func:`_walk` finds them with numpy a window at a time. At anything
    else -- a long name, a PAX path or size, a checksum that does not hold or is laid out otherwise,
    an odd size field, the end of the archive -- :func:`_parse` reads on from the first header of the
    member there, so every member and every error is exactly :func:`_parse`'s."""
    for item in _mapped_tables(mapped, path, require_end):
        if isinstance(item, MemberTable):
            yield from item.members(regular_only)
        elif not regular_only or item.isreg:
            yield item


def _parse_mapped_reference(mapped: mmap.mmap, path: str, regular_only: bool,
                            require_end: bool) -> Iterator[TarMember]:
    """The header loop alone over a memory-mapped archive, from its start: what :func:`_parse_mapped`
    must give, member for member and error for error."""
    mapped.seek(0)
    return _parse(mapped.read, path, regular_only, require_end, len(mapped))


#: which parser :func:`iter_members` reads a memory-mapped plain archive with (its ``parser=``): the numpy
#: walk that hands anything unusual to the header loop (``"fast"``, :func:`_parse_mapped`), or the header
#: loop alone (``"reference"``). They give the same members, and the same errors at the same offsets:
#: tests/formats/webdataset/test_tarstream_fast.py checks it. Compressed and remote archives have only the loop.
PARSERS: dict[str, Callable[[mmap.mmap, str, bool, bool], Iterator[TarMember]]] = {
    "fast": _parse_mapped, "reference": _parse_mapped_reference}


def _walk(mapped: mmap.mmap, offset: int, total: int) -> _Run:
    """The usual members from ``offset`` (a member's first header) within one window of the archive.

    Every block of the window is read as if it were a header: its size field says where the next
    header would be. Following that from the first block costs a few operations a header; only the
    headers on that chain are then checked (checksums, PAX records, old-style directories)."""
    count = min(_WINDOW, (total - offset) // BLOCK)
    if count == 0:
        return _Run(MemberTable([], _NONE, _NONE, _NONE, _NONE, mapped), offset, True)
    view = np.frombuffer(mapped, np.uint8, count=count * BLOCK, offset=offset).reshape(count, BLOCK)
    try:
        # a size field is 11 octal digits and a NUL: its last two digits and the NUL (one cache line)
        # rule out most data blocks before the whole field and the type are looked at
        ends = view[:, 133:136]
        maybe = np.flatnonzero(((ends[:, 0] - _DIGIT_0) < 8) & ((ends[:, 1] - _DIGIT_0) < 8) & (ends[:, 2] == 0))
        field = view[maybe, 124:135]
        octal = ((field - _DIGIT_0) < 8).all(axis=1) & _FAST_KIND[view[maybe, 156]]
        usual = maybe[octal]
        kinds = view[usual, 156]
        sizes = (field[octal].astype(np.int64) - _DIGIT_0) @ _SIZE_WEIGHTS
        following = np.full(count, -1, np.int64)
        following[usual] = usual + 1 + np.where(kinds == _DIRECTORY, 0, -(-sizes // BLOCK))  # a directory has no data
        on_chain, i = _chain(usual, following, count)
        at = usual[on_chain]
        kinds, sizes = kinds[on_chain], sizes[on_chain]
        headers = view[at]
        pax = np.isin(kinds, _PAX_KINDS)
        short = pax & (sizes <= BLOCK) & (at + 1 < count)  # the records fit in the block after the header
        longest = int(sizes[short].max()) if short.any() else 0
        records = view[at[short] + 1, :longest].tobytes()
    finally:
        del view, ends, field
    ends_inside = i < count
    if len(at) and not ends_inside and int(following[at[-1]]) * BLOCK > total - offset:
        ends_inside = True  # the last member's data (with padding) runs past the end of the file
        at, headers, kinds, sizes, pax, short = at[:-1], headers[:-1], kinds[:-1], sizes[:-1], pax[:-1], short[:-1]
    bad = _unusual(headers)
    if b" path=" in records or b" size=" in records or b" GNU.sparse." in records:
        bad |= short  # one of them changes what is read: _parse reads them all
    for k in np.flatnonzero(pax & ~short).tolist():  # PAX records longer than a block
        here = offset + int(at[k]) * BLOCK
        body = mapped[here + BLOCK:here + BLOCK + int(sizes[k])]
        bad[k] |= b" path=" in body or b" size=" in body or b" GNU.sparse." in body
    for k in np.flatnonzero(kinds == 0).tolist():  # an old-style name ending in '/' is a directory: _parse's
        here = offset + int(at[k]) * BLOCK
        bad[k] |= _nts(mapped[here:here + 100]).endswith(b"/")
    unusual = np.flatnonzero(bad)
    if len(unusual):
        keep = int(unusual[0])
        at, headers, kinds, sizes, pax = at[:keep], headers[:keep], kinds[:keep], sizes[:keep], pax[:keep]
        ends_inside = True
    return _members(mapped, offset, offset + at * BLOCK, headers, kinds, sizes, pax, ends_inside)


def _chain(usual: np.ndarray, following: np.ndarray, count: int) -> tuple[np.ndarray, int]:
    """The headers reached from block 0 by following each one's ``following`` block: their indexes in
    ``usual`` (the blocks that read as usual headers, ascending), and the block the chain stops at
    (a block that is not one, or ``count`` or past it: the window's end).

    Usually every usual block is on the chain, each linking to the next, so the chain is found in a
    few array operations; a block in some member's data that happens to read as a header breaks a
    link, and the chain goes on from where that link really leads."""
    if not len(usual):
        return usual, 0
    nexts = following[usual]
    breaks = np.flatnonzero(nexts[:-1] != usual[1:]).tolist() + [len(usual) - 1]  # last in each linked stretch
    parts: list[np.ndarray] = []
    i = 0
    while i < count:
        k = int(np.searchsorted(usual, i))
        if k == len(usual) or usual[k] != i:
            break  # not a usual header: _parse reads from here
        end = breaks[bisect.bisect_left(breaks, k)]
        parts.append(np.arange(k, end + 1))
        i = int(nexts[end])
    return (np.concatenate(parts) if parts else np.zeros(0, np.int64)), i


def _unusual(headers: np.ndarray) -> np.ndarray:
    """Headers whose checksum does not hold or is not laid out as tar writes it (six octal digits,
    NUL, space): :func:`_parse` reads those."""
    field = headers[:, 148:156]
    sums = headers.sum(axis=1, dtype=np.uint32).astype(np.int64) - field.sum(axis=1, dtype=np.int64) + 8 * 32
    digits = field[:, :6].astype(np.int64) - ord("0")
    laid_out = ((digits >= 0) & (digits <= 7)).all(axis=1) & (field[:, 6] == 0) & (field[:, 7] == ord(" "))
    return ~(laid_out & (digits @ _SUM_WEIGHTS == sums))


def _members(mapped: mmap.mmap, start: int, offsets: np.ndarray, headers: np.ndarray, kinds: np.ndarray,
             sizes: np.ndarray, pax: np.ndarray, ends_inside: bool) -> _Run:
    """The members of the checked headers at ``offsets`` (from ``start``), each with the offset of its
    first header (its PAX header, if any). The run ends before a trailing PAX header whose member
    did not follow, or before a PAX header followed by a PAX global header (rare: :func:`_parse`'s)."""
    if not len(offsets):
        return _Run(MemberTable([], _NONE, _NONE, _NONE, _NONE, mapped), start, True)
    index = np.arange(len(offsets))
    first = np.concatenate([[0], np.maximum.accumulate(np.where(pax, -1, index))[:-1] + 1])  # of each member
    stray = np.flatnonzero((kinds == _GLOBAL) & (first < index))
    end = int(first[stray[0]]) if len(stray) else int(first[-1]) if pax[-1] else len(offsets)
    taken = np.flatnonzero(~pax[:end])
    table = MemberTable(_names(headers[taken]), offsets[first[taken]], offsets[taken], kinds[taken].astype(np.int64),
                        sizes[taken], mapped)
    if end < len(offsets):
        return _Run(table, int(offsets[end]), ends_inside or bool(len(stray)) or end == 0)
    last = end - 1
    after = int(offsets[last]) + BLOCK * (1 + (0 if kinds[last] == _DIRECTORY else -(-int(sizes[last]) // BLOCK)))
    return _Run(table, after, ends_inside)


def _names(headers: np.ndarray) -> list[str]:
    """:func:`_header_name` of each header, decoded together: the names, each ended by a NUL (which
    no UTF-8 sequence holds, so decoding them joined is decoding each), as one string split."""
    count = len(headers)
    fields = np.ascontiguousarray(headers[:, :100]).view("S100").ravel().tolist()  # trailing NULs dropped
    names = b"\0".join(fields).decode("utf-8", "surrogateescape").split("\0")
    if len(names) != count:  # a NUL inside a name field with more bytes after it: cut each at its first NUL
        field = np.zeros((count, 101), np.uint8)
        field[:, :100] = headers[:, :100]
        lengths = (field == 0).argmax(axis=1)  # the first NUL (the added one where the field has none)
        names = field[np.arange(101) <= lengths[:, None]].tobytes().decode("utf-8", "surrogateescape").split("\0")
    prefixed = np.flatnonzero((headers[:, 257:263] == np.frombuffer(b"ustar\0", np.uint8)).all(axis=1)
                              & (headers[:, 345] != 0))
    for k in prefixed.tolist():  # a ustar prefix in front (long names in ustar format): rare
        names[k] = _header_name(headers[k].tobytes())
    return names[:count]

def _number(field: bytes) -> int:
    """A numeric field: octal text (to a NUL), or GNU base-256; -1 when it is neither."""
    if field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        return value - 256 ** (len(field) - 1) if field[0] == 0xFF else value
    try:
        return int(_nts(field).strip() or b"0", 8)
    except ValueError:
        return -1


def _decimal(text: bytes) -> int:
    """A PAX number (decimal text), or -1; more than :data:`_MAX_SIZE` for more digits than a size has
    (never parsed: Python refuses to parse over 4,300 digits)."""
    if not text.isdigit():
        return -1
    return int(text) if len(text.lstrip(b"0")) <= 19 else _MAX_SIZE + 1


def _clip(text: bytes, limit: int = 40) -> bytes:
    """``text``, cut to ``limit`` bytes for a message."""
    return text if len(text) <= limit else text[:limit] + b"..."


def _read(read: Callable[[int], bytes], size: int) -> bytes:
    """``size`` bytes (fewer where the file ends first), a piece at a time past :data:`_PIECE`, so that
    a corrupt size in a compressed archive costs only the bytes really there."""
    if size <= _PIECE:
        return read(size)
    parts: list[bytes] = []
    while size > 0:
        part = read(min(size, _PIECE))
        if not part:
            break
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


def _nts(field: bytes) -> bytes:
    """A NUL-terminated field's bytes."""
    end = field.find(0)
    return field if end < 0 else field[:end]


def _header_name(header: bytes) -> str:
    """The ustar name, with the POSIX ``prefix`` (offset 345) in front when the magic says ustar."""
    name = _nts(header[:100])
    if header[257:263] == b"ustar\x00" and header[345]:
        name = _nts(header[345:500]) + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def _check_signed(path: str, offset: int, header: bytes, unsigned: int) -> None:
    """Old tars summed signed bytes; accept that sum too, else raise with both sums."""
    high = sum(b >= 128 for b in header[:148]) + sum(b >= 128 for b in header[156:])
    signed = unsigned - 256 * high
    stored = _number(header[148:156])
    if stored < 0 or stored not in (unsigned, signed):
        found = "not a number" if stored < 0 else str(stored)
        raise TarFormatError(path, offset, f"bad tar header at offset {offset}: checksum field {found} "
                                           f"(raw {header[148:156]!r}) does not match the header, whose sum is "
                                           f"{unsigned} (or {signed} as signed bytes); the file is corrupt or not a tar")


def pax_records(member: TarMember, path: str) -> dict[str, str]:
    """The records of a PAX global header member (type ``"g"``) of ``path``, as text."""
    records = _pax_records(member.data, path, member.offset)
    return {key.decode("utf-8", "surrogateescape"): value.decode("utf-8", "surrogateescape")
            for key, value in records.items()}


def _pax_records(body: bytes, path: str, offset: int) -> dict[bytes, bytes]:
    """The ``"<length> <key>=<value>\\n"`` records of a PAX extended header."""
    records: dict[bytes, bytes] = {}
    pos = 0
    while pos < len(body) and body[pos]:
        space = body.find(b" ", pos)
        try:
            length = int(body[pos:space])
        except ValueError:
            length = 0
        end = pos + length
        if space < 0 or length <= space - pos or end > len(body) or body[end - 1] != 10 or b"=" not in body[space:end]:
            raise TarFormatError(path, offset, f"malformed PAX record at byte {pos} of the extended header")
        key, _, value = body[space + 1:end - 1].partition(b"=")
        records[b"GNU.sparse" if key.startswith(b"GNU.sparse.") else key] = value
        pos = end
    return records
