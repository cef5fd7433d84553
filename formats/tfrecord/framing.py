"""TFRecord framing: records from a file a block at a time, with every check ``iter_records`` makes.

A plain file is memory-mapped (records are framed, CRC-checked and later parsed where the page
cache holds them: copying into fresh memory costs more in page faults than the read itself) or,
where it cannot be mapped, read in chunks of :data:`CHUNK`; a GZIP or zlib file is framed by the
streaming reader, so a corrupt stream fails at the same record. Known record headers skip the
length CRC. Errors come in file order, after the records before them, with the same messages. A
record length longer than the rest of the file is an error before anything is read or allocated.
"""

from __future__ import annotations

import mmap
import os
import stat
from dataclasses import dataclass
from typing import IO

import numpy as np
from crc32c import crc32c

from unihub.formats.tfrecord.records import (
    _MASK_DELTA,
    _U32,
    _U64,
    LENGTH_CRC_MISMATCH,
    _mask,
    _next_record,
    file_compression,
    open_records,
)

__all__ = ["Block", "Error", "Framer"]

CHUNK = 16 << 20  # bytes of a plain file read at a time when it is not mapped
MAP_FILES = True  # map plain files (False: read them in chunks)
_UNKNOWN = 1 << 64  # what is left of a stream whose size is unknown: more than any record length
_RELEASE_BYTES = 8 << 20  # mapped bytes read between two releases of their pages (Framer._release)
_BREAK, _REFILLED, _RETURN = range(3)  # what Framer._take_plain does after an unusual record (Framer._unusual)


@dataclass
class Block:
    """Consecutive good records: ``data[starts[i]:ends[i]]`` is record ``indices[i]``."""

    data: bytes | mmap.mmap
    indices: list[int]
    offsets: list[int]
    starts: np.ndarray
    ends: np.ndarray


@dataclass
class Error:
    """A record that cannot be read: where, why, and the feature at fault if any."""

    index: int
    offset: int
    reason: str
    feature: str | None = None


class Framer:
    """Takes records from one file a block at a time, with :func:`iter_records`' checks and messages.

    An error is returned on its own, after the records before it, so that the caller reports it
    in file order.
    """

    def __init__(self, path: str, compression: str | None) -> None:
        kind = file_compression(path, compression)
        self.gz = kind != "none"  # a GZIP or zlib stream: framed as it is decompressed, in order
        self.f: IO[bytes] = open_records(path, kind)
        self.crc = crc32c
        self.buf: bytes | mmap.mmap = b""
        if not self.gz and MAP_FILES:
            # a plain file is mapped, not read: records are framed, checked and parsed where the page
            # cache holds them, with no copy into fresh memory (whose page faults cost more than the read)
            try:
                self.buf = mmap.mmap(self.f.fileno(), 0, access=mmap.ACCESS_READ)
            except (ValueError, OSError):  # empty, or not mappable: read in chunks
                pass
        self.size = _regular_size(self.f) if not self.gz else None  # None: unknown (not a regular file)
        self.pos = self.index = self.offset = 0
        self.released = 0  # the mapped bytes before this offset are dropped from the process (_release)
        self.pending: Error | None = None
        self.headers: dict[bytes, int] = {}  # record headers whose length CRC is good -> length
        self.done = False

    def close(self) -> None:
        if isinstance(self.buf, mmap.mmap):
            try:
                self.buf.close()
            except BufferError:  # a block still views it: the map goes when the last view does
                pass
        self.f.close()

    def consumed(self) -> int:
        """Bytes of the file (compressed, for GZIP and zlib) taken so far: progress against its size."""
        if self.gz:
            raw = getattr(self.f, "fileobj", None)
            return raw.tell() if raw is not None else 0
        return self.offset

    def take(self, k: int, max_bytes: int = _UNKNOWN) -> Block | Error | None:
        """Up to ``k`` records (fewer at a chunk's end), an error, or None at the end.

        A block ends early once its records hold ``max_bytes`` (it still has at least one record).
        """
        if self.pending is not None:
            error, self.pending = self.pending, None
            return error
        if self.done:
            return None
        self._release()
        return self._take_gz(k, max_bytes) if self.gz else self._take_plain(k, max_bytes)

    def _release(self) -> None:
        """Drop the mapped pages of records already taken from this process's memory (the page cache
        keeps them): a mapped file read to its end would otherwise stay resident as a whole. The
        blocks taken before stay valid (their pages read back from the cache if touched again)."""
        if not isinstance(self.buf, mmap.mmap) or self.pos - self.released < _RELEASE_BYTES:
            return
        end = self.pos - self.pos % mmap.PAGESIZE
        try:
            self.buf.madvise(mmap.MADV_DONTNEED, self.released, end - self.released)
        except (AttributeError, OSError, ValueError):  # no madvise here: the pages stay until the file closes
            self.released = len(self.buf)
            return
        self.released = end

    def _stop(self, got: list[int], error: Error, dead: bool) -> Error | None:
        self.done = self.done or dead
        if got:
            self.pending = error
            return None
        return error

    def _fill(self, need: int) -> bool:
        """Read more of the file into the buffer (at least ``need`` bytes in all when there are); where
        the file's size is unknown, a chunk at a time, so memory follows the bytes really there."""
        if isinstance(self.buf, mmap.mmap):
            return False  # the whole file is mapped
        parts = [self.buf[self.pos:]]
        have = start = len(parts[0])
        while True:
            more = self.f.read(CHUNK if self.size is None else max(CHUNK, need - have))
            parts.append(more)
            have += len(more)
            if not more or have >= need:
                break
        self.buf, self.pos = b"".join(parts), 0
        return have > start

    def _left(self, avail: int) -> int:
        """Bytes of the file from the current record on, ``avail`` of them in the buffer."""
        if isinstance(self.buf, mmap.mmap):
            return avail
        return _UNKNOWN if self.size is None else self.size - self.offset

    def _take_plain(self, k: int, max_bytes: int) -> Block | Error | None:
        crc, u64, u32, known = self.crc, _U64.unpack_from, _U32.unpack_from, self.headers
        starts: list[int] = []
        ends: list[int] = []
        first_pos, first_offset, first_index = self.pos, self.offset, self.index
        end_offset = self.offset + max_bytes  # the block ends at the first record past this offset
        error: Error | None = None
        while True:
            # the usual record, in a tight loop: a header seen before, a good data CRC
            buf, pos = self.buf, self.pos
            size, view, got = len(buf), memoryview(buf), len(starts)
            limit = pos + (end_offset - self.offset)
            while got < k and pos + 12 <= size and pos < limit:
                header = buf[pos:pos + 12]
                length = known.get(header)
                if length is None:
                    if len(known) > 4096:
                        known.clear()
                    if _mask(crc(header[:8])) != u32(header, 8)[0]:
                        break
                    length = known[header] = u64(header)[0]
                end = pos + 12 + length
                if end + 4 > size:
                    break
                value = crc(view[pos + 12:end])
                if (((value >> 15) | (value << 17)) + _MASK_DELTA) & 0xFFFFFFFF != u32(buf, end)[0]:
                    break
                starts.append(pos + 12)
                ends.append(end)
                pos = end + 4
                got += 1
            self.offset += pos - self.pos
            self.index = first_index + got
            self.pos = pos
            if got == k or pos >= limit:
                break
            # anything else, with iter_records' checks and messages
            action, outcome = self._unusual(starts)
            if action == _REFILLED:
                first_pos, first_offset, first_index = 0, self.offset, self.index
                continue
            if action == _RETURN:
                return outcome
            error = outcome
            break
        if not starts:
            return error
        starts_ = np.array(starts, np.int64)
        return Block(self.buf, list(range(first_index, first_index + len(starts))),
                      (starts_ - (12 + first_pos) + first_offset).tolist(), starts_, np.array(ends, np.int64))

    def _unusual(self, starts: list[int]) -> tuple[int, Error | None]:
        """What comes at ``self.pos`` when it is not the usual record (``starts``: the records taken so
        far): ``(_BREAK, error or None)`` to end the block, ``(_REFILLED, None)`` to go on in a buffer read
        further, ``(_RETURN, error or None)`` to return that instead of a block (none taken)."""
        buf, pos, crc, u32 = self.buf, self.pos, self.crc, _U32.unpack_from
        avail = len(buf) - pos
        if avail < 12:
            if starts:
                return _BREAK, None
            if self._fill(12):
                return _REFILLED, None
            self.done = True
            if avail == 0:
                return _RETURN, None
            return _RETURN, Error(self.index, self.offset, f"truncated record header ({avail} of 12 bytes)")
        if _mask(crc(buf[pos:pos + 8])) != u32(buf, pos + 8)[0]:
            return _BREAK, self._stop(starts, Error(self.index, self.offset, LENGTH_CRC_MISMATCH), True)
        length = _U64.unpack_from(buf, pos)[0]
        if avail < length + 16:
            if starts:
                return _BREAK, None
            left = self._left(avail)  # a corrupt length (2^64-1) is refused here, before any read
            if length + 16 <= left and self._fill(length + 16):
                return _REFILLED, None
            self.done = True
            held = left if length + 16 > left else avail
            return _RETURN, Error(self.index, self.offset,
                                  f"truncated record: {held - 12} of {length + 4} bytes after the header")
        error = self._stop(starts, Error(self.index, self.offset, "data CRC mismatch"), False)
        self.pos = pos + length + 16
        self.index += 1
        self.offset += length + 16
        return _BREAK, error

    def _take_gz(self, k: int, max_bytes: int) -> Block | Error | None:
        parts: list[bytes] = []
        offsets: list[int] = []
        indices: list[int] = []
        error: Error | None = None
        held = 0
        while len(parts) < k and held < max_bytes:
            data, size, reason = _next_record(self.f, self.crc)
            if reason is not None:
                error = self._stop(parts, Error(self.index, self.offset, reason), not size)  # type: ignore[arg-type]
                if not size:
                    break
            elif data is None:
                self.done = True
                break
            else:
                parts.append(data)
                held += len(data)
                offsets.append(self.offset)
                indices.append(self.index)
            self.index += 1
            self.offset += size
            if reason is not None:
                break
        if not parts:
            return error
        lengths = np.fromiter(map(len, parts), np.int64, len(parts))
        ends = np.cumsum(lengths)
        return Block(b"".join(parts), indices, offsets, ends - lengths, ends)


def _regular_size(f: IO[bytes]) -> int | None:
    """The size of a regular file, else None."""
    try:
        info = os.fstat(f.fileno())
    except (OSError, ValueError):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None
