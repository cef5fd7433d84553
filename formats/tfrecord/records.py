"""TFRecord files as records: framing, checksums and compression, reading and writing.

On disk a TFRecord file is a sequence of records, each framed as::

    uint64 length (little endian) | uint32 masked_crc32c(length bytes) | data[length] | uint32 masked_crc32c(data)

TensorFlow writes such a file plain, as one GZIP stream (``compression_type='GZIP'``) or as one
zlib stream (``'ZLIB'``: a 2-byte zlib header, deflate data, an Adler-32 trailer). Nothing in a
file's name says which, and one directory may mix them, so each file's compression is found from
its first bytes: a valid plain record header (its length CRC holds) means plain; otherwise the
GZIP magic, or a zlib header whose first decompressed record header is valid, decide.

What the records hold (Examples, SequenceExamples, tensors) is for :mod:`unihub.formats.tfrecord.format`;
the fast block framing for :mod:`unihub.formats.tfrecord.framing`. Only ``crc32c`` (a core dependency) is needed, for the
checksums.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import struct
import zlib
from collections.abc import Iterable, Iterator
from typing import IO, Any, Literal

from crc32c import crc32c  # a core dependency: TFRecord's checksums need nothing more than pip install unihub

from unihub.errors import FormatError, UnsupportedFormatError
from unihub.formats.base import OnError, ReadReport, SkippedRecord
from unihub.fs import sources
from unihub.fs.outputs import Outputs, outputs_for

Compression = Literal["none", "gzip", "zlib"]
#: what users may pass as the ``compression`` option (TensorFlow's spellings included)
COMPRESSION_NAMES = {"": "none", "none": "none", "gzip": "gzip", "zlib": "zlib", "auto": None}
_GZIP_MAGIC = b"\x1f\x8b"
_RAW_CHUNK = 1 << 20
#: a record longer than this is checked against what its stream can hold, then read a piece at a time
LONG_RECORD = 16 << 20
#: deflate (GZIP, ZLIB) gives at most 1032 bytes per compressed byte (a 258-byte match in 2 bits)
_DEFLATE_MAX_RATIO = 1032


def normalize_compression(option: str | None) -> Compression | None:
    """The compression an option names (None: detect from each file), or an error listing the valid ones."""
    if option is None:
        return None
    key = str(option).strip().lower()
    if key not in COMPRESSION_NAMES:
        raise UnsupportedFormatError(f"TFRecord compression must be auto, none, gzip or zlib, not {option!r}")
    return COMPRESSION_NAMES[key]  # type: ignore[return-value]


def _looks_like_zlib(head: bytes) -> bool:
    return len(head) >= 2 and head[0] & 0x0F == 8 and head[0] >> 4 <= 7 and (head[0] << 8 | head[1]) % 31 == 0


def detect_compression(head: bytes) -> Compression:
    """The compression of a file starting with ``head`` (its first KBs)."""
    if len(head) >= 12 and _header_ok(head[:12]):
        return "none"  # a valid plain header, even if it happens to start like gzip or zlib
    if head[:2] == _GZIP_MAGIC:
        return "gzip"
    if _looks_like_zlib(head):
        try:
            first = zlib.decompressobj().decompress(head, 12)
        except zlib.error:
            return "none"
        if not first or (len(first) == 12 and _header_ok(first)):
            return "zlib"
    return "none"


def file_compression(path: str, option: str | None) -> Compression:
    """``option`` when it names a compression, else the one :func:`detect_compression` finds in ``path``."""
    named = normalize_compression(option)
    if named is not None:
        return named
    try:
        with sources.open_input(path) as f:
            head = f.read(4096)
    except OSError as exc:
        raise FormatError(f"{path}: cannot read ({exc})", path=path) from exc
    return detect_compression(head)


class ZlibReader(io.RawIOBase):
    """A zlib stream (TensorFlow's ``ZLIB`` TFRecord compression) read as its decompressed bytes."""

    def __init__(self, path: str) -> None:
        self.fileobj: IO[bytes] = sources.open_input(path)  # closed by close()
        self._inflate = zlib.decompressobj()
        self._pending = b""
        self._eof = False

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` decompressed bytes (all of them for -1); never more than ``size`` in memory."""
        out = bytearray(self._pending)
        self._pending = b""
        while (size < 0 or len(out) < size) and not self._eof:
            chunk = self._inflate.unconsumed_tail or self.fileobj.read(_RAW_CHUNK)
            if not chunk:
                if not self._inflate.eof:
                    raise EOFError("the zlib stream ends before its end marker (truncated file)")
                self._eof = True
                break
            out += self._inflate.decompress(chunk, 0 if size < 0 else size - len(out))
            self._eof = self._inflate.eof
        if 0 <= size < len(out):
            self._pending = bytes(out[size:])
            del out[size:]
        return bytes(out)

    def close(self) -> None:
        self.fileobj.close()
        super().close()


def open_records(path: str, compression: Compression) -> IO[bytes]:
    """A binary stream of the decompressed bytes of ``path``."""
    if compression == "gzip":
        stream = gzip.GzipFile(fileobj=sources.open_input(path), mode="rb")
        stream.myfileobj = stream.fileobj  # type: ignore[assignment]  # closed with the stream, as gzip.open's is
        return stream  # type: ignore[return-value]
    if compression == "zlib":
        return ZlibReader(path)  # type: ignore[return-value]
    return sources.open_input(path)


class ZlibWriter(io.RawIOBase):
    """Writes a zlib stream (as TensorFlow's ``ZLIB`` compression does) into ``raw``."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self._deflate = zlib.compressobj()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.raw.write(self._deflate.compress(data))
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self.raw.write(self._deflate.flush())
        super().close()


_MASK_DELTA = 0xA282EAD8
_U64 = struct.Struct("<Q")
#: a record header whose length CRC fails: no later record can be found, so (with --skip-corrupt too)
#: the rest of the file is lost, which the reason says rather than list one record
LENGTH_CRC_MISMATCH = ("length CRC mismatch (corrupt file, or not a TFRecord file): nothing from here to the end of "
                       "the file can be framed")
_U32 = struct.Struct("<I")


# -- framing -------------------------------------------------------------------------------
def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C of ``data``."""
    return _mask(crc32c(data))


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _header_ok(header: bytes) -> bool:
    """True when 12 bytes are a record header whose length CRC holds."""
    return masked_crc(header[:8]) == _U32.unpack_from(header, 8)[0]


def _open(path: str, compression: str | None) -> IO[bytes]:
    return open_records(path, file_compression(path, compression))


def iter_records(path: str, *, compression: str | None = None, on_error: OnError = "raise",
                 report: ReadReport | None = None) -> Iterator[tuple[int, int, bytes]]:
    """``(record index, byte offset, data)`` for each record of one TFRecord file.

    Offsets count uncompressed bytes. A bad data CRC skips one record; a truncated record or
    a bad length CRC ends the file (nothing after it can be framed) -- with ``on_error='skip'``
    both are noted in ``report``, otherwise they raise :class:`FormatError`.
    """
    crc = crc32c
    index = offset = 0
    with _open(path, compression) as f:
        while True:
            data, size, error = _next_record(f, crc)
            if error is not None:
                _fail(path, index, offset, error, on_error, report)
                if not size:
                    return  # the rest of the file cannot be framed
            elif data is None:
                return
            else:
                yield index, offset, data
            index, offset = index + 1, offset + size


def _next_record(f: IO[bytes], crc: Any) -> tuple[bytes | None, int, str | None]:
    """``(data, framed size, error)``: ``(None, 0, None)`` at the end, size 0 when unframeable."""
    try:
        header = f.read(12)
        if not header:
            return None, 0, None
        if len(header) < 12:
            return None, 0, f"truncated record header ({len(header)} of 12 bytes)"
        if _mask(crc(header[:8])) != _U32.unpack_from(header, 8)[0]:
            return None, 0, LENGTH_CRC_MISMATCH
        length = _U64.unpack_from(header)[0]
        body: bytes | str = f.read(length + 4) if length < LONG_RECORD else _read_long(f, length + 4)
    except (OSError, EOFError, zlib.error) as exc:  # a gzip/zlib stream cut short or corrupt
        return None, 0, f"unreadable compressed stream ({exc})"
    if isinstance(body, str):
        return None, 0, body
    if len(body) < length + 4:
        return None, 0, f"truncated record: {len(body)} of {length + 4} bytes after the header"
    data = body[:length]
    if _mask(crc(data)) != _U32.unpack_from(body, length)[0]:
        return None, 16 + length, "data CRC mismatch"
    return data, 16 + length, None


def room_left(f: IO[bytes]) -> tuple[int, bool] | None:
    """``(bound, exact)``: the bytes a record stream has left to give -- exactly, for a plain file; at
    most, for a GZIP or zlib one (deflate's largest ratio times the compressed file's size) -- or None
    where nothing bounds them (not a regular file)."""
    raw = getattr(f, "fileobj", None)
    try:
        info = os.fstat((f if raw is None else raw).fileno())
        if not stat.S_ISREG(info.st_mode):
            return None
        if raw is None:
            return info.st_size - f.tell(), True
        return _DEFLATE_MAX_RATIO * info.st_size, False
    except (OSError, ValueError, AttributeError):
        return None


def _read_long(f: IO[bytes], size: int) -> bytes | str:
    """``size`` bytes of ``f`` for a record longer than :data:`LONG_RECORD`, or why it cannot hold them.

    A corrupt length (2^64-1, 2^50) must not become an allocation: it is first checked against what
    the stream has left, then read a piece at a time, so memory follows the bytes really there.
    """
    room = room_left(f)
    if room is not None and size > room[0]:
        left, exact = room
        return (f"truncated record: {left} of {size} bytes after the header" if exact else
                f"record length {size - 4} is more than the whole compressed stream can hold "
                f"(at most {left} bytes): the length is corrupt")
    parts: list[bytes] = []
    have = 0
    while have < size:
        part = f.read(min(LONG_RECORD, size - have))
        if not part:
            break
        parts.append(part)
        have += len(part)
    return b"".join(parts)


def _fail(path: str, index: int, offset: int, reason: str, on_error: OnError,
          report: ReadReport | None, feature: str | None = None) -> None:
    where = f"record {index} at byte offset {offset}" + (f", feature {feature!r}" if feature else "")
    if on_error == "skip":
        if report is not None:
            report.skipped.append(SkippedRecord(path, where, reason))
        return
    raise FormatError(f"{path}: {where}: {reason}", path=path, offset=offset)


def write_records(path: str, records: Iterable[bytes], *, compression: str | None = None) -> str:
    """Frame serialized records (any payload) into one TFRecord file, atomically; returns ``path``."""
    writer = _ShardWriter(outputs_for(path), True, normalize_compression(compression) or "none", None)
    try:
        for record in records:
            writer.write(record)
        return writer.close()[0]
    except BaseException:
        writer.abort()
        raise


_SUFFIXES: dict[Compression, str] = {"none": "", "gzip": ".gz", "zlib": ".zlib"}


def _stem(path: str) -> str:
    """``path`` without a compression suffix (``.gz``, ``.zlib``)."""
    return path.removesuffix(".gz").removesuffix(".zlib")


def named_compression(path: str) -> Compression | None:
    """The compression ``path``'s name says (``x.tfrecord.gz``: gzip, ``x.tfrecord.zlib``: zlib), or None."""
    return next((kind for kind, suffix in _SUFFIXES.items() if suffix and path.endswith(suffix)), None)


class _ShardWriter:
    """Writes framed records into one file (``single``: the root of ``outputs``) or into ``part-NNNNN``
    shards of ``per_file`` records in it, each a stream of ``outputs`` (a local file, or an upload
    straight to an object store: see :mod:`unihub.fs.outputs`)."""

    def __init__(self, outputs: Outputs, single: bool, compression: Compression, per_file: int | None) -> None:
        self.outputs, self.single, self.compression, self.per_file = outputs, single, compression, per_file
        self.done: list[str] = []
        self.name = ""
        self.raw: IO[bytes] | None = None
        self.stream: IO[bytes] | gzip.GzipFile | ZlibWriter | None = None
        self.count = 0
        self.crc = crc32c
        if not single:
            outputs.makedirs()

    def _name(self, shard: int) -> str:
        return "" if self.single else f"part-{shard:05d}.tfrecord{_SUFFIXES[self.compression]}"

    def _open(self) -> None:
        self.name = self._name(len(self.done))
        self.raw = self.outputs.open(self.name)
        if self.compression == "gzip":
            self.stream = gzip.GzipFile(fileobj=self.raw, mode="wb", mtime=0)
        else:
            self.stream = ZlibWriter(self.raw) if self.compression == "zlib" else self.raw

    def write(self, data: bytes) -> None:
        if self.stream is None:
            self._open()
        length = _U64.pack(len(data))
        self.stream.write(length + _U32.pack(_mask(self.crc(length))) + data  # type: ignore[union-attr]
                          + _U32.pack(_mask(self.crc(data))))
        self.count += 1
        if self.per_file is not None and self.count == self.per_file:
            self._finish()

    def _finish(self) -> None:
        if self.stream is not self.raw:
            self.stream.close()  # type: ignore[union-attr]  # its trailer (gzip, zlib) into raw
        self.raw.close()  # type: ignore[union-attr]
        self.stream = self.raw = None
        self.done.append(self.outputs.path(self.name))
        self.count = 0

    def close(self) -> list[str]:
        if self.stream is None and not self.done:
            self._open()  # no records: still write one (empty) file
        if self.stream is not None:
            self._finish()
        return self.done

    def abort(self) -> None:
        if self.raw is not None:
            self.outputs.discard(self.raw, self.name)
            self.stream = self.raw = None
