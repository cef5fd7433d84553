"""tarstream and WebDataset ingest under hostile bytes: size fields no file can have (GNU base-256,
PAX, 5,000 digits), huge sizes in compressed archives, link/directory entries with a size (members
equal tarfile's), non-UTF-8 member names. Each is a FormatError naming file and offset, found in
bounded time and memory; through the CLI one ``unihub: error:`` line and exit 1.

Archives are written by Python's tarfile, then damaged: header bytes patched and the header
checksum recomputed, so that only the field under test is wrong.
"""

from __future__ import annotations

import gzip
import io
import subprocess
import sys
import tarfile
import tracemalloc
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from unihub.converters.convert import convert
from unihub.errors import FormatError
from unihub.formats.webdataset.tarstream import TarFormatError, iter_members

SAMPLES = [("0001.cls", b"1"), ("0001.txt", b"one"), ("0002.cls", b"2"), ("0002.txt", b"two"),
           ("0003.cls", b"3"), ("0003.txt", b"three")]


def _member(name: str, data: bytes = b"", pax: dict[str, str] | None = None) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.pax_headers = pax or {}
    return info, data


def _special(name: str, kind: bytes, size: int, linkname: str = "") -> tuple[tarfile.TarInfo, bytes]:
    """A header-only member (link, directory, device, FIFO) whose size field says ``size``."""
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, size, linkname
    return info, b""


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]], fmt: int = tarfile.GNU_FORMAT, **kw: str) -> Path:
    with tarfile.open(path, "w", format=fmt, **kw) as tar:  # type: ignore[call-overload]
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def _offsets(path: Path) -> dict[str, int]:
    with tarfile.open(path, encoding="utf-8", errors="surrogateescape") as tar:
        return {m.name: m.offset for m in tar}


def _patch(raw: bytes, offset: int, fields: dict[int, bytes]) -> bytes:
    """``raw`` with the header at ``offset`` holding each value at its start, its checksum recomputed."""
    header = bytearray(raw[offset:offset + 512])
    for start, value in fields.items():
        header[start:start + len(value)] = value
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return raw[:offset] + bytes(header) + raw[offset + 512:]


def _store(tmp_path: Path, raw: bytes, compressed: bool, name: str = "shard") -> Path:
    path = tmp_path / (f"{name}.tar.gz" if compressed else f"{name}.tar")
    path.write_bytes(gzip.compress(raw) if compressed else raw)
    return path


def _left(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if "ds" in p.name)


def _size_damaged(tmp_path: Path, field: bytes) -> tuple[bytes, int]:
    """The sample shard with 0002.cls's size field set to ``field`` (12 bytes), and its offset."""
    plain = _tar(tmp_path / "written.tar", [_member(n, d) for n, d in SAMPLES])
    offset = _offsets(plain)["0002.cls"]
    return _patch(plain.read_bytes(), offset, {124: field}), offset


@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize(("field", "reason"), [
    (b"\x80" + b"\xff" * 11, r"bad size in the tar header at offset 2048 \(member '0002\.cls'\): "
                             r"309485009821345068724781055, larger than any file"),
    (b"\xff" * 12, r"bad size in the tar header at offset 2048 \(member '0002\.cls'\): negative"),
    (b"\x80" + (2 ** 62).to_bytes(11, "big"), r"member '0002\.cls' at offset 2048 is truncated: the file holds "
                                              r"\d+ of its 4611686018427387904 bytes")],
    ids=["base256-2^88", "base256-negative", "base256-2^62"])
def test_base256_sizes_no_file_can_have(tmp_path: Path, compressed: bool, field: bytes, reason: str) -> None:
    raw, offset = _size_damaged(tmp_path, field)
    assert offset == 2048
    path = _store(tmp_path, raw, compressed)
    tracemalloc.start()
    try:
        with pytest.raises(TarFormatError, match=reason) as info:
            list(iter_members(str(path)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.offset == 2048 and info.value.member == "0002.cls" and info.value.path == str(path)
    assert peak < 256 << 20  # a 2^62 size in a .tar.gz is read a piece at a time, never allocated whole
    with pytest.raises(FormatError, match=rf"{path.name}: truncated or corrupt tar after offset 2048: {reason}"):
        convert(path, tmp_path / "ds", progress=False)
    assert _left(tmp_path) == []


@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("size", ["1" + "0" * 30, "9" * 5000, "-5", "12x"],
                         ids=["10^30", "5000-digits", "negative", "not-a-number"])
def test_pax_sizes_no_file_can_have(tmp_path: Path, compressed: bool, size: str) -> None:
    members = [_member(n, d) for n, d in SAMPLES]
    members[2] = _member("0002.cls", b"2", {"size": size})
    raw = _tar(tmp_path / "written.tar", members, tarfile.PAX_FORMAT).read_bytes()
    path = _store(tmp_path, raw, compressed)
    shown = size if len(size) <= 40 else size[:40] + "..."
    with pytest.raises(TarFormatError, match=rf"member '0002\.cls' at offset 2048: PAX size b'{shown}' is not "
                                             "the size of a file") as info:
        list(iter_members(str(path)))
    assert info.value.offset == 2048
    with pytest.raises(FormatError, match=r"truncated or corrupt tar after offset 2048: member '0002\.cls'"):
        convert(path, tmp_path / "ds", progress=False)
    assert _left(tmp_path) == []


def _with_special_members(tmp_path: Path, compressed: bool) -> Path:
    """Regular members between links, directories, devices and FIFOs whose size fields are not 0,
    and an old-style directory (typeflag NUL, name ending in '/') with a size."""
    members = [_special("0000", tarfile.DIRTYPE, 3000), _member(*SAMPLES[0]), _member(*SAMPLES[1]),
               _special("0001.lnk", tarfile.SYMTYPE, 1500, "0001.cls"), _member(*SAMPLES[2]),
               _special("0002.hl", tarfile.LNKTYPE, 700, "0001.cls"), _member(*SAMPLES[3]),
               _special("fifo", tarfile.FIFOTYPE, 600), _special("tty", tarfile.CHRTYPE, 512),
               _member("olddir/"), _member(*SAMPLES[4]), _member(*SAMPLES[5])]
    path = _tar(tmp_path / "written.tar", members)
    raw = path.read_bytes()
    olddir = raw.index(b"olddir/\0")
    return _store(tmp_path, _patch(raw, olddir, {124: b"%011o\0" % 2000, 156: b"\0"}), compressed, "special")


@pytest.mark.parametrize("compressed", [False, True])
def test_link_and_directory_sizes_skip_no_data_as_tarfile_reads_them(tmp_path: Path, compressed: bool) -> None:
    path = _with_special_members(tmp_path, compressed)
    with tarfile.open(path) as tar:
        expected = [(m.name, m.offset, m.type.decode() if m.type != tarfile.AREGTYPE else "0",
                     tar.extractfile(m).read() if m.isreg() else b"") for m in tar]  # type: ignore[union-attr]
    assert len(expected) == 12 and ("olddir", "5") in [(name, kind) for name, _, kind, _ in expected]
    ours = [(m.name, m.offset, m.type, m.data) for m in iter_members(str(path), regular_only=False, require_end=True)]
    assert ours == expected
    assert [(m.name, m.data) for m in iter_members(str(path))] == SAMPLES


def test_directories_with_a_size_keep_every_sample(tmp_path: Path) -> None:
    members = [_special("0000", tarfile.DIRTYPE, 3000), *(_member(n, d) for n, d in SAMPLES[:4]),
               _special("0002", tarfile.DIRTYPE, 1 << 20), *(_member(n, d) for n, d in SAMPLES[4:])]
    src = _tar(tmp_path / "shard.tar", members)
    convert(src, tmp_path / "ds", progress=False)
    rows = pq.read_table(tmp_path / "ds").sort_by("__key__").to_pylist()
    assert [(row["__key__"], row["txt"]) for row in rows] == [("0001", "one"), ("0002", "two"), ("0003", "three")]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["gnu", "pax"])
def test_non_utf8_member_names_are_refused_at_ingest(tmp_path: Path, fmt: int) -> None:
    members = [_member("0001.cls", b"1"), _member("0001.t\udcffxt", b"x"), _member("00\udcfe2.cls", b"2")]
    src = _tar(tmp_path / "shard.tar", members, fmt, encoding="utf-8", errors="surrogateescape")
    offset = _offsets(src)["0001.t\udcffxt"]
    with pytest.raises(FormatError, match=rf"shard\.tar: member b'0001\.t\\xffxt' at offset {offset}: its name is "
                                          "not UTF-8") as info:
        convert(src, tmp_path / "ds", progress=False)
    assert info.value.offset == offset
    assert _left(tmp_path) == []


@pytest.mark.parametrize(("case", "expected"), [
    ("size", "truncated or corrupt tar after offset 2048: bad size in the tar header at offset 2048"),
    ("name", "member b'0001.t\\xffxt' at offset 1024: its name is not UTF-8")], ids=["size", "name"])
def test_the_cli_prints_one_line_and_exits_1(tmp_path: Path, case: str, expected: str) -> None:
    if case == "size":
        src = _store(tmp_path, _size_damaged(tmp_path, b"\x80" + b"\xff" * 11)[0], True)
    else:
        src = _tar(tmp_path / "shard.tar", [_member("0001.cls", b"1"), _member("0001.t\udcffxt", b"x")],
                   encoding="utf-8", errors="surrogateescape")
    done = subprocess.run([sys.executable, "-m", "unihub.cli", "convert", str(src), str(tmp_path / "ds")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"unihub: error: {src}: {expected}"), done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert _left(tmp_path) == []


def test_a_shard_whose_every_sample_is_damaged_names_the_first_fault(tmp_path: Path) -> None:
    plain = _tar(tmp_path / "written.tar", [_member(n, d) for n, d in SAMPLES[:2]])
    path = _store(tmp_path, _patch(plain.read_bytes(), 0, {124: b"\xff" * 12}), False)
    with pytest.raises(FormatError, match=r"shard\.tar: truncated or corrupt tar after offset 0: bad size in the tar "
                                          r"header at offset 0 \(member '0001\.cls'\): negative"):
        convert(path, tmp_path / "ds", progress=False)  # not 'no samples in ...: the shards are empty'
    assert _left(tmp_path) == []


@pytest.mark.parametrize("compressed", [False, True])
def test_verify_against_a_damaged_shard_is_a_format_error(tmp_path: Path, compressed: bool) -> None:
    """verify's reference reader (Python's tarfile) fails on the same bytes with a ReadError: a FormatError."""
    from unihub.converters.verify import verify

    convert(_tar(tmp_path / "intact.tar", [_member(n, d) for n, d in SAMPLES]), tmp_path / "ds", progress=False)
    path = _store(tmp_path, _size_damaged(tmp_path, b"\x80" + b"\xff" * 11)[0], compressed)
    with pytest.raises(FormatError, match=rf"{path.name}: Python's tarfile cannot read the archive at or after the "
                                          r"member at offset 2048 \(ReadError: .*\): it is corrupt or truncated"):
        verify(path, tmp_path / "ds", from_format="webdataset")


def test_a_unihub_header_nested_past_pythons_limit_is_a_format_error(tmp_path: Path) -> None:
    # json.loads raised RecursionError, which escaped ShardHeader.from_text as it was.
    comment = '{"format":"unihub.webdataset","x":' + "[" * 100_000 + "]" * 100_000 + "}"
    src = _tar(tmp_path / "shard.tar", [_member(n, d) for n, d in SAMPLES], tarfile.PAX_FORMAT,
               pax_headers={"comment": comment})
    with pytest.raises(FormatError, match=r"shard\.tar: the unihub header \(PAX global comment\) is corrupt: "
                                          "maximum recursion depth exceeded"):
        convert(src, tmp_path / "ds", progress=False)
    assert _left(tmp_path) == []


def _joined(tmp_path: Path, case: str) -> tuple[bytes, int, int]:
    """The sample shard with members after its end-of-archive marker: two tars joined with cat, or the header
    of 0002.cls zeroed (a lone zero block, 0002.cls's data, then 0002.txt's header); with the offsets of the
    marker and of the first header after it."""
    plain = _tar(tmp_path / "written.tar", [_member(n, d) for n, d in SAMPLES])
    offsets = _offsets(plain)
    raw = plain.read_bytes()
    if case == "cat":
        end = offsets["0003.txt"] + 1024
        return raw + _tar(tmp_path / "more.tar", [_member("0004.cls", b"4")]).read_bytes(), end, len(raw)
    end = offsets["0002.cls"]
    return raw[:end] + bytes(512) + raw[end + 512:], end, offsets["0002.txt"]


@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("parser", ["fast", "reference"])
@pytest.mark.parametrize("case", ["cat", "zeroed"])
def test_members_after_the_end_of_archive_marker_are_an_error(tmp_path: Path, case: str, parser: str,
                                                             compressed: bool) -> None:
    """tarfile (so webdataset) stops at the first zero block: two tars joined with cat, or a header zeroed in the
    middle of a shard, lost every member after it without a word (exit 0, verify 'equal')."""
    raw, end, header = _joined(tmp_path, case)
    path = _store(tmp_path, raw, compressed)
    with pytest.raises(TarFormatError, match=rf"a tar header at offset {header} follows the end-of-archive marker "
                                             rf"at offset {end}: ") as info:
        list(iter_members(str(path), parser=parser))  # type: ignore[arg-type]
    assert info.value.offset == header
    with pytest.raises(FormatError, match=f"follows the end-of-archive marker at offset {end}"):
        convert(path, tmp_path / "ds", progress=False)
    assert _left(tmp_path) == []


def test_zero_padding_and_other_bytes_after_the_end_pass(tmp_path: Path) -> None:
    """Past the marker only a tar header is refused: padding to any record size and bytes that are no header pass."""
    raw = _tar(tmp_path / "written.tar", [_member(n, d) for n, d in SAMPLES]).read_bytes()
    for tail in (bytes(1 << 21), b"not a tar header" * 100):
        path = _store(tmp_path, raw + tail, False)
        assert [(m.name, m.data) for m in iter_members(str(path), require_end=True)] == SAMPLES


@pytest.mark.parametrize("group_keys", [False, True])
def test_a_member_larger_than_a_parquet_value_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      group_keys: bool) -> None:
    """A member over 2 GiB - 1 (here over a lowered limit: the real one needs 4 GiB of memory) reached the store
    writer, whose pyarrow ArrowCapacityError came out as a traceback naming no shard or member."""
    from unihub.formats.webdataset import tar

    monkeypatch.setattr(tar, "MAX_BINARY", 4, raising=False)
    src = _tar(tmp_path / "shard.tar", [_member(n, d) for n, d in SAMPLES])
    offset = _offsets(src)["0003.txt"]
    with pytest.raises(FormatError, match=rf"shard\.tar: member '0003\.txt' at offset {offset} holds 5 bytes, more "
                                          r"than one value of a Parquet column holds \(4\)") as info:
        convert(src, tmp_path / "ds", progress=False, format_options={"group_keys": group_keys})
    assert info.value.offset == offset
    assert _left(tmp_path) == []


def test_a_sparse_member_is_not_called_damage(tmp_path: Path) -> None:
    """A GNU sparse member (typeflag S; tar --sparse) is sound but unread: the error said 'truncated or corrupt tar'."""
    plain = _tar(tmp_path / "written.tar", [_member(n, d) for n, d in SAMPLES])
    offset = _offsets(plain)["0002.cls"]
    path = _store(tmp_path, _patch(plain.read_bytes(), offset, {156: b"S"}), False)
    with pytest.raises(FormatError, match=rf"shard\.tar: unreadable tar after offset {offset}: member '0002\.cls' at "
                                          rf"offset {offset} is a sparse file, which is not supported; write the "
                                          r"shard without GNU tar's --sparse"):
        convert(path, tmp_path / "ds", progress=False)
    assert _left(tmp_path) == []
