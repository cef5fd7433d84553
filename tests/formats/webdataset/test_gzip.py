"""Gzipped WebDataset shards whose gzip end is damaged: cut 1 to 8 bytes short (the ISIZE and CRC-32
trailer), a flipped CRC, size or data byte, garbage after the stream. The tar inside ends before the
damage, so only reading the stream to its end finds it; convert, verify and the remote path must,
each with a FormatError naming the shard and the offset (``--skip-corrupt``: the shard listed as
skipped), nothing left behind. A multi-member gzip (RFC 1952) is read whole, zero padding after the
stream allowed, as gzip itself reads both.

Shards are written by webdataset's TarWriter (``.tar.gz``: it compresses), tarfile's ``w:gz`` and GNU
``tar czf``, then damaged byte by byte.
"""

from __future__ import annotations

import gzip
import io
import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from unihub.converters.convert import convert
from unihub.errors import FormatError
from unihub.formats.webdataset.tarstream import TarFormatError, iter_members

wds = pytest.importorskip("webdataset")

SAMPLES: list[dict[str, Any]] = [
    {"__key__": f"{i:04d}", "cls": str(i).encode(), "txt": f"sample {i} ".encode() * (i + 1)} for i in range(5)]
MEMBERS: list[tuple[str, bytes]] = [(f"{s['__key__']}.{ext}", s[ext]) for s in SAMPLES for ext in ("cls", "txt")]


def _tar_writer(path: Path) -> Path:
    with wds.TarWriter(str(path), encoder=False, compress=True) as writer:
        for sample in SAMPLES:
            writer.write(sample)
    return path


def _tarfile(path: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in MEMBERS:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _gnu_tar(path: Path) -> Path:
    if shutil.which("tar") is None:
        pytest.skip("no tar command")
    files = path.parent / "files"
    files.mkdir()
    for name, data in MEMBERS:
        (files / name).write_bytes(data)
    subprocess.run(["tar", "czf", str(path), "-C", str(files), *[n for n, _ in MEMBERS]], check=True)
    shutil.rmtree(files)
    return path


WRITERS = {"TarWriter": _tar_writer, "tarfile": _tarfile, "tar czf": _gnu_tar}


def _damaged(raw: bytes, damage: str) -> bytes:
    """``raw`` (one gzip member) damaged as ``damage`` says: ``cut-N`` (the last N bytes gone), ``crc``
    / ``isize`` (a trailer byte flipped), ``data`` (a deflate byte near the end flipped), ``garbage``."""
    if damage.startswith("cut-"):
        return raw[:-int(damage[4:])]
    flip = {"crc": len(raw) - 8, "isize": len(raw) - 1, "data": len(raw) - 10}.get(damage)
    if flip is not None:
        return raw[:flip] + bytes([raw[flip] ^ 0x01]) + raw[flip + 1:]
    assert damage == "garbage"
    return raw + b"garbage after the gzip stream"


DAMAGES = [f"cut-{n}" for n in range(1, 9)] + ["crc", "isize", "data", "garbage"]


def _left(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if "ds" in p.name)


def _shard(tmp_path: Path, writer: str, damage: str | None) -> tuple[Path, bytes]:
    """A shard of SAMPLES written by ``writer``, damaged by ``damage``; and its intact bytes."""
    intact = WRITERS[writer](tmp_path / "written.tar.gz").read_bytes()
    assert intact[:2] == b"\x1f\x8b"
    path = tmp_path / "shard.tar.gz"
    path.write_bytes(intact if damage is None else _damaged(intact, damage))
    return path, intact


def _tar_end(intact: bytes) -> int:
    """The offset of the end-of-archive marker in the decompressed tar: the damage lies after it."""
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(intact))) as tar:
        last = tar.getmembers()[-1]
    return last.offset_data + last.size + (-last.size % 512)


@pytest.mark.parametrize("writer", list(WRITERS))
@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_gzip_end_is_a_format_error(tmp_path: Path, writer: str, damage: str) -> None:
    path, intact = _shard(tmp_path, writer, damage)
    assert _tar_end(intact) < len(gzip.decompress(intact))  # every member is whole: only the gzip end is hurt
    with pytest.raises(TarFormatError, match=r"shard\.tar\.gz: corrupt compressed stream near offset \d+ "
                                             r"\(compressed byte \d+\)") as info:
        list(iter_members(str(path), require_end=True))
    assert info.value.path == str(path) and (info.value.offset or 0) >= _tar_end(intact)
    with pytest.raises(FormatError, match=r"shard\.tar\.gz: truncated or corrupt tar after offset \d+: corrupt "
                                          r"compressed stream") as converting:
        convert(path, tmp_path / "ds", progress=False)
    assert converting.value.path == str(path) and converting.value.offset is not None
    assert _left(tmp_path) == []


@pytest.mark.parametrize("writer", list(WRITERS))
def test_intact_shards_convert_every_sample(tmp_path: Path, writer: str) -> None:
    path, _ = _shard(tmp_path, writer, None)
    assert convert(path, tmp_path / "ds", progress=False).rows == len(SAMPLES)
    table = pq.read_table(tmp_path / "ds").sort_by("__key__")
    assert table.column("txt").to_pylist() == [s["txt"].decode() for s in SAMPLES]


def test_skip_corrupt_lists_the_shard_and_keeps_the_others(tmp_path: Path) -> None:
    """As for a shard cut inside its tar: its complete samples kept, the damage listed with the offset."""
    path, intact = _shard(tmp_path, "tarfile", "crc")
    good = tmp_path / "shards" / "a.tar.gz"
    good.parent.mkdir()
    good.write_bytes(intact)
    path.rename(tmp_path / "shards" / "b.tar.gz")
    result = convert(tmp_path / "shards", tmp_path / "ds", progress=False, on_error="skip")
    assert [(s.path, s.location) for s in result.skipped] == [(str(tmp_path / "shards" / "b.tar.gz"),
                                                               f"offset {len(gzip.decompress(intact))}")]
    assert "CRC check failed" in result.skipped[0].reason
    assert result.rows == 2 * len(SAMPLES) - 1  # b's last sample is unproven: as a cut shard's last one


def test_a_multi_member_gzip_is_read_whole(tmp_path: Path) -> None:
    """Concatenated gzip members are one stream (RFC 1952): every member read, each one's CRC checked."""
    plain = gzip.decompress(_tarfile(tmp_path / "written.tar.gz").read_bytes())
    cut = 3 * 512 + 7  # inside a member's data: no member boundary lines up with a tar block
    members = [gzip.compress(plain[:cut]), gzip.compress(plain[cut:cut + 1000]), gzip.compress(plain[cut + 1000:])]
    path = tmp_path / "multi.tar.gz"
    path.write_bytes(b"".join(members) + bytes(64))  # zero padding after the stream: gzip ignores it too
    assert [m.name for m in iter_members(str(path))] == [n for n, _ in MEMBERS]
    assert convert(path, tmp_path / "ds", progress=False).rows == len(SAMPLES)
    last = _damaged(members[-1], "crc")  # the tar's end lies in the last member's first bytes: its CRC after
    path.write_bytes(b"".join(members[:-1]) + last)
    with pytest.raises(TarFormatError, match=r"multi\.tar\.gz: corrupt compressed stream .*CRC check failed"):
        list(iter_members(str(path)))


@pytest.mark.parametrize("damage", ["cut-4", "crc"])
def test_verify_checks_the_gzip_end(tmp_path: Path, damage: str) -> None:
    """verify's reference (tarfile, whose ``r|gz`` never checks the CRC) reads the stream to its end too."""
    from unihub.converters.verify import verify

    path, intact = _shard(tmp_path, "TarWriter", None)
    convert(path, tmp_path / "ds", progress=False)
    assert verify(path, tmp_path / "ds", from_format="webdataset").equal
    path.write_bytes(_damaged(intact, damage))
    with pytest.raises(FormatError, match=r"shard\.tar\.gz: Python's tarfile cannot read the archive at or after "
                                          r"the member at offset \d+ \((EOFError|BadGzipFile): "):
        verify(path, tmp_path / "ds", from_format="webdataset")


def test_the_cli_prints_one_line_and_exits_1(tmp_path: Path) -> None:
    path, intact = _shard(tmp_path, "tar czf", "cut-4")
    done = subprocess.run([sys.executable, "-m", "unihub.cli", "convert", str(path), str(tmp_path / "ds")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"unihub: error: {path}: truncated or corrupt tar after offset "), done.stderr
    assert f"(compressed byte {len(intact) - 4}): Compressed file ended before the end-of-stream" in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert _left(tmp_path) == []


def test_a_remote_shard_is_checked_to_its_end(tmp_path: Path, s3_server: Any) -> None:
    """The same read over S3 (moto): a shard cut 4 bytes short is an error there too."""
    path, intact = _shard(tmp_path, "TarWriter", "cut-4")
    key = f"{uuid.uuid4().hex[:8]}/shard.tar.gz"
    s3_server.client().put_object(Bucket=s3_server.bucket, Key=key, Body=path.read_bytes())
    url = f"s3://{s3_server.bucket}/{key}"
    with pytest.raises(FormatError, match=r"shard\.tar\.gz: truncated or corrupt tar after offset \d+: corrupt "
                                          r"compressed stream .*Compressed file ended"):
        convert(url, tmp_path / "ds", progress=False, storage_options=s3_server.storage_options())
    assert _left(tmp_path) == []
