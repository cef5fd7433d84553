"""Opening TFRecord files: which compression each file uses, found from its bytes, and a reader for it.

TensorFlow writes TFRecord files plain, as one GZIP stream (``compression_type='GZIP'``) or as one
zlib stream (``'ZLIB'``: a 2-byte zlib header, deflate data, an Adler-32 trailer). Nothing in a
file's name says which, and one directory may mix them, so each file's compression is found from
its first bytes: a valid plain record header (its length CRC holds) means plain; otherwise the
GZIP magic, or a zlib header whose first decompressed record header is valid, decide.
"""

from __future__ import annotations

import gzip
import io
import zlib
from typing import IO, Literal

from unihub.errors import FormatError, UnsupportedFormatError

Compression = Literal["none", "gzip", "zlib"]
#: what users may pass as the ``compression`` option (TensorFlow's spellings included)
COMPRESSION_NAMES = {"": "none", "none": "none", "gzip": "gzip", "zlib": "zlib", "auto": None}
_GZIP_MAGIC = b"\x1f\x8b"
_RAW_CHUNK = 1 << 20


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


def detect_compression(head: bytes, header_ok: object) -> Compression:
    """The compression of a file starting with ``head`` (its first KBs); ``header_ok(b12)`` tells
    whether 12 bytes are a valid record header (length CRC holds)."""
    if len(head) >= 12 and header_ok(head[:12]):  # type: ignore[operator]
        return "none"  # a valid plain header, even if it happens to start like gzip or zlib
    if head[:2] == _GZIP_MAGIC:
        return "gzip"
    if _looks_like_zlib(head):
        try:
            first = zlib.decompressobj().decompress(head, 12)
        except zlib.error:
            return "none"
        if not first or (len(first) == 12 and header_ok(first)):  # type: ignore[operator]
            return "zlib"
    return "none"


def compression_of(path: str, option: str | None, header_ok: object) -> Compression:
    """``option`` when it names a compression, else the one :func:`detect_compression` finds in ``path``."""
    named = normalize_compression(option)
    if named is not None:
        return named
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as exc:
        raise FormatError(f"{path}: cannot read ({exc})", path=path) from exc
    return detect_compression(head, header_ok)


class ZlibReader(io.RawIOBase):
    """A zlib stream (TensorFlow's ``ZLIB`` TFRecord compression) read as its decompressed bytes."""

    def __init__(self, path: str) -> None:
        self.fileobj: IO[bytes] = open(path, "rb")  # noqa: SIM115  (closed by close())
        self._inflate = zlib.decompressobj()
        self._pending = b""
        self._eof = False

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:  # type: ignore[override]
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
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if compression == "zlib":
        return ZlibReader(path)  # type: ignore[return-value]
    return open(path, "rb")  # noqa: SIM115


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
