"""TFRecord framing under hostile bytes: corrupt record lengths (2^64-1, 2^50) and corrupt or cut
GZIP/ZLIB streams are FormatErrors naming the file, record and offset, found before any allocation
the bytes cannot back; records longer than a read piece still read whole.

Every input is written by TensorFlow's own ``tf.io.TFRecordWriter``, then damaged: a record's length
replaced together with its masked CRC (so the length CRC holds), a stream cut or a byte flipped.
"""

from __future__ import annotations

import gzip
import os
import struct
import subprocess
import sys
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from unihub.converters.convert import convert
from unihub.errors import FormatError
from unihub.formats.tfrecord import framing as tframe
from unihub.formats.tfrecord.records import LONG_RECORD, iter_records, masked_crc

tf = pytest.importorskip("tensorflow")

COMPRESS: dict[str | None, Callable[[bytes], bytes]] = {
    None: lambda raw: raw, "GZIP": gzip.compress, "ZLIB": zlib.compress}


def _example(i: int, blob: bytes = b"") -> bytes:
    return tf.train.Example(features=tf.train.Features(feature={
        "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
        "blob": tf.train.Feature(bytes_list=tf.train.BytesList(value=[blob or f"row {i}".encode()])),
    })).SerializeToString()


def _records(path: Path, records: list[bytes], compression: str | None = None) -> Path:
    with tf.io.TFRecordWriter(str(path), options=compression) as writer:
        for record in records:
            writer.write(record)
    return path


def _plain(tmp_path: Path, n: int = 20, blob: Callable[[int], bytes] = lambda i: b"") -> bytes:
    """The bytes of a plain TFRecord file of ``n`` Examples, as TensorFlow writes it."""
    return _records(tmp_path / "written.tfrecord", [_example(i, blob(i)) for i in range(n)]).read_bytes()


def _with_length(raw: bytes, record: int, length: int) -> tuple[bytes, int]:
    """``raw`` with record ``record``'s length replaced (its length CRC made to hold), and its offset."""
    offset = 0
    for _ in range(record):
        offset += 16 + struct.unpack_from("<Q", raw, offset)[0]
    field = struct.pack("<Q", length)
    return raw[:offset] + field + struct.pack("<I", masked_crc(field)) + raw[offset + 12:], offset


def _left(tmp_path: Path) -> list[str]:
    """Outputs or temporaries of a conversion into ``tmp_path / 'ds'``."""
    return sorted(p.name for p in tmp_path.iterdir() if "ds" in p.name)


def _peak_of(call: Callable[[], Any]) -> int:
    """The peak of Python's allocations (bytes) while ``call`` runs."""
    tracemalloc.start()
    try:
        call()
    except FormatError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
@pytest.mark.parametrize("length", [2 ** 64 - 1, 2 ** 50])
def test_a_huge_record_length_is_a_format_error(tmp_path: Path, compression: str | None, length: int) -> None:
    raw, offset = _with_length(_plain(tmp_path), 3, length)
    src = tmp_path / "x.tfrecord"
    src.write_bytes(COMPRESS[compression](raw))
    reason = "truncated record: " if compression is None else "more than the whole compressed stream can hold"
    with pytest.raises(FormatError, match=rf"x\.tfrecord: record 3 at byte offset {offset}: .*{reason}") as info:
        convert(src, tmp_path / "ds", progress=False)
    assert info.value.path == str(src) and info.value.offset == offset
    assert _left(tmp_path) == []


@pytest.mark.parametrize("length", [2 ** 64 - 1, 2 ** 50])
def test_a_huge_record_length_in_chunked_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, length: int) -> None:
    """Plain files read in chunks (not memory-mapped) check a length against the file's size."""
    monkeypatch.setattr(tframe, "MAP_FILES", False)
    raw, offset = _with_length(_plain(tmp_path), 3, length)
    src = tmp_path / "x.tfrecord"
    src.write_bytes(raw)
    held = len(raw) - offset - 12
    with pytest.raises(FormatError, match=rf"x\.tfrecord: record 3 at byte offset {offset}: truncated record: "
                                          rf"{held} of {length + 4} bytes after the header"):
        convert(src, tmp_path / "ds", progress=False)
    with pytest.raises(FormatError, match=rf"record 3 at byte offset {offset}: truncated record: {held} of"):
        list(iter_records(str(src)))
    assert _left(tmp_path) == []


@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_a_corrupt_length_allocates_only_what_the_file_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            compression: str | None) -> None:
    """A 1 GiB length in a 2 MB file: refused, or read a piece at a time, never allocated whole."""
    monkeypatch.setattr(tframe, "MAP_FILES", False)
    raw, _ = _with_length(_plain(tmp_path, 200, lambda i: os.urandom(10_000)), 100, 2 ** 30)
    src = tmp_path / "x.tfrecord"
    src.write_bytes(COMPRESS[compression](raw))
    assert 1032 * src.stat().st_size > 2 ** 30  # within deflate's bound: the GZIP reader must read in pieces
    for read in (lambda: convert(src, tmp_path / "ds", progress=False), lambda: list(iter_records(str(src)))):
        assert _peak_of(read) < 2 * LONG_RECORD + 8 * len(raw)
    assert _left(tmp_path) == []


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_records_longer_than_a_read_piece_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     compression: str | None) -> None:
    big = [os.urandom(LONG_RECORD + 12_345), b"small", os.urandom(LONG_RECORD // 2)]
    src = _records(tmp_path / "x.tfrecord", big, compression)
    assert [data for _, _, data in iter_records(str(src))] == big
    monkeypatch.setattr(tframe, "MAP_FILES", False)
    framer = tframe.Framer(str(src), None)
    try:
        found = []
        while (block := framer.take(10)) is not None:
            assert isinstance(block, tframe.Block)
            found += [bytes(block.data[s:e]) for s, e in zip(block.starts, block.ends)]
    finally:
        framer.close()
    assert found == big


def _cut(data: bytes) -> bytes:
    return data[:len(data) // 2]


def _flip(data: bytes) -> bytes:
    return data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0x55]) + data[len(data) // 2 + 1:]


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
@pytest.mark.parametrize(("damage", "reason"), [
    (_cut, "unreadable compressed stream"), (_flip, "length CRC mismatch|data CRC mismatch|unreadable compressed stream"),
    (lambda data: data[:12], "unreadable compressed stream"),
    (lambda data: data[:-8] + bytes(8), "data CRC mismatch|unreadable compressed stream")])
def test_a_corrupt_or_truncated_stream_is_a_format_error(tmp_path: Path, compression: str, damage: Any,
                                                         reason: str) -> None:
    data = _records(tmp_path / "written.tfrecord", [_example(i) for i in range(300)], compression).read_bytes()
    src = tmp_path / "x.tfrecord"
    src.write_bytes(damage(data))
    with pytest.raises(FormatError, match=rf"x\.tfrecord: record \d+ at byte offset \d+: ({reason})"):
        convert(src, tmp_path / "ds", progress=False, from_format="tfrecord",
                format_options={"compression": compression})
    assert _left(tmp_path) == []


@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_the_cli_prints_one_line_and_exits_1(tmp_path: Path, compression: str | None) -> None:
    raw, offset = _with_length(_plain(tmp_path), 2, 2 ** 64 - 1)
    src = tmp_path / "x.tfrecord"
    src.write_bytes(COMPRESS[compression](raw))
    done = subprocess.run([sys.executable, "-m", "unihub.cli", "convert", str(src), str(tmp_path / "ds")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"unihub: error: {src}: record 2 at byte offset {offset}: ")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert _left(tmp_path) == []
