"""tarstream: the members tarfile reads, in every tar format, and errors with file and offset."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from unihub import FormatError
from unihub.formats.webdataset.format import WebDatasetFormat
from unihub.formats.webdataset.tarstream import iter_members

LONG = "deep/" * 25 + "long-name.bin"  # > 100 characters: a PAX path, a GNU 'L' header, a ustar prefix
FILES = [("a.txt", b"hello"), (LONG, b"x" * 700), ("ünïcødé/ß.cls", b"7"), ("empty.bin", b""),
         ("big.bin", bytes(range(256)) * 9)]


def write(path: Path, fmt: int, mode: str = "w") -> Path:
    with tarfile.open(path, mode, format=fmt) as tar:
        for name, data in FILES[:2]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        folder = tarfile.TarInfo("folder")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        link = tarfile.TarInfo("link.txt")
        link.type, link.linkname = tarfile.SYMTYPE, "a.txt"
        tar.addfile(link)
        for name, data in FILES[2:]:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1.5  # a float mtime makes a PAX header in PAX format
            tar.addfile(info, io.BytesIO(data))
    return path


def tarfile_members(path: Path) -> list[tuple[str, int, bytes]]:
    with tarfile.open(path) as tar:
        return [(m.name, m.offset, tar.extractfile(m).read()) for m in tar if m.isreg()]  # type: ignore[union-attr]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_members_equal_tarfiles(tmp_path: Path, fmt: int) -> None:
    path = write(tmp_path / "a.tar", fmt)
    ours = [(m.name, m.offset, m.data) for m in iter_members(str(path))]
    assert ours == tarfile_members(path)
    assert [(name, data) for name, _, data in ours] == FILES
    assert all(type(m.data) is bytes for m in iter_members(str(path)))


def test_non_regular_members_on_request(tmp_path: Path) -> None:
    path = write(tmp_path / "a.tar", tarfile.PAX_FORMAT)
    members = list(iter_members(str(path), regular_only=False))
    assert [(m.name, m.type) for m in members if not m.isreg] == [("folder", "5"), ("link.txt", "2")]
    assert members[2].isdir and members[3].data == b""


@pytest.mark.parametrize("mode", ["w:gz", "w:bz2", "w:xz"])
def test_compressed(tmp_path: Path, mode: str) -> None:
    path = write(tmp_path / "a.tar.x", tarfile.PAX_FORMAT, mode)
    assert [(m.name, m.offset, m.data) for m in iter_members(str(path))] == tarfile_members(path)


def test_base256_size_and_end_of_file_at_a_block_boundary(tmp_path: Path) -> None:
    path = write(tmp_path / "a.tar", tarfile.GNU_FORMAT)
    raw = bytearray(path.read_bytes())
    offset = next(m.offset for m in iter_members(str(path)) if m.name == "a.txt")
    raw[offset + 124:offset + 136] = b"\x80" + (5).to_bytes(11, "big")  # GNU binary size
    raw[offset + 148:offset + 156] = b" " * 8
    raw[offset + 148:offset + 156] = b"%06o\0 " % sum(raw[offset:offset + 512])
    end = max(m.offset for m in iter_members(str(path))) + 512 + 512 * 5  # after big.bin's data
    (tmp_path / "b.tar").write_bytes(bytes(raw[:end]))
    assert [(m.name, m.data) for m in iter_members(str(tmp_path / "b.tar"))] == FILES
    with pytest.raises(FormatError, match="without the end-of-archive marker"):
        list(iter_members(str(tmp_path / "b.tar"), require_end=True))


def test_bad_checksum_names_file_and_offset(tmp_path: Path) -> None:
    path = write(tmp_path / "a.tar", tarfile.USTAR_FORMAT)
    offset = next(m.offset for m in iter_members(str(path)) if m.name == "ünïcødé/ß.cls")
    raw = bytearray(path.read_bytes())
    raw[offset + 10] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match=rf"a\.tar: bad tar header at offset {offset}: checksum field \d+ .* sum is "
                                          r"\d+") as info:
        list(iter_members(str(path)))
    assert info.value.path == str(path) and info.value.offset == offset


def test_truncated_member_names_it(tmp_path: Path) -> None:
    path = write(tmp_path / "a.tar", tarfile.PAX_FORMAT)
    start = next(m.offset for m in iter_members(str(path)) if m.name == "big.bin")
    path.write_bytes(path.read_bytes()[:start + 2048 + 100])  # PAX header, its records, the header, 1 KiB
    members = iter_members(str(path))
    with pytest.raises(FormatError, match=rf"a\.tar: member 'big\.bin' at offset {start} is truncated") as info:
        list(members)
    assert info.value.offset == start and info.value.member == "big.bin"  # type: ignore[attr-defined]


def test_webdataset_reads_what_webdataset_reads(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    rng = np.random.default_rng(0)
    for s in range(2):
        with wds.TarWriter(str(tmp_path / f"s-{s}.tar"), encoder=False) as writer:
            for i in range(s * 20, s * 20 + 20):
                sample = {"__key__": f"k{i:04d}", "jpg": rng.bytes(int(rng.integers(1, 3000))), "cls": str(i).encode()}
                if i % 3:
                    sample["seg.npy"] = rng.bytes(i)
                writer.write(sample)
    pattern = str(tmp_path / "s-{0..1}.tar")
    theirs = [{k: v for k, v in s.items() if k == "__key__" or not k.startswith("__")}
              for s in wds.WebDataset(pattern, shardshuffle=False)]
    ours = [{"__key__": s.key, **s.members} for s in WebDatasetFormat(pattern).samples()]
    assert len(ours) == 40 and ours == theirs


def test_pax_global_header_on_request(tmp_path: Path) -> None:
    """A PAX global header is no member; asked for, it comes as type 'g' with its records (tarfile's pax_headers)."""
    from unihub.formats.webdataset.tarstream import pax_records

    path = tmp_path / "g.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "ünï {\"a\": 1}"}) as tar:
        info = tarfile.TarInfo("a.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    with tarfile.open(path) as tar:
        expected = tar.pax_headers
    assert [(m.name, m.data) for m in iter_members(str(path))] == [("a.txt", b"hello")]
    members = list(iter_members(str(path), regular_only=False))
    assert [m.type for m in members] == ["g", "0"] and members[0].offset == 0
    assert pax_records(members[0], str(path)) == expected == {"comment": "ünï {\"a\": 1}"}
