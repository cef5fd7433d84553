"""tarstream's two parsers of a memory-mapped archive (``tarstream.PARSERS``: the numpy walk,
``parser="fast"``, and the header loop alone, ``parser="reference"``) give exactly the same: the same
members, or the same error at the same offset, on archives written by tarfile in every format and by
webdataset's TarWriter, whole and damaged, with windows small enough that members, PAX headers and
their records straddle them; on random archives drawn by hypothesis too."""

from __future__ import annotations

import io
import random
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unihub.errors import InvalidArgumentError
from unihub.formats.webdataset import tarstream
from unihub.formats.webdataset.tarstream import TarFormatError, TarMember, iter_members

Outcome = tuple[list[tuple[Any, ...]], tuple[Any, ...] | None]


def _outcome(members: Callable[[], Iterator[TarMember]]) -> Outcome:
    got: list[tuple[Any, ...]] = []
    try:
        for member in members():
            got.append(tuple(member))
    except TarFormatError as exc:
        return got, (str(exc), exc.offset, exc.member)
    return got, None


def fast_and_reference(path: Path, regular_only: bool, require_end: bool) -> tuple[Outcome, Outcome]:
    """What ``iter_members`` gives for ``path`` with each of the two parsers: fast, then reference."""
    def read_with(parser: tarstream.Parser) -> Outcome:
        return _outcome(lambda: iter_members(str(path), regular_only=regular_only, require_end=require_end,
                                             parser=parser))

    return read_with("fast"), read_with("reference")


def _add(tar: tarfile.TarFile, name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, mtime: float = 0,
         link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mtime, info.linkname = kind, mtime, link
    info.size = len(data) if kind in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
    tar.addfile(info, io.BytesIO(data) if info.size else None)


def random_archive(path: Path, rng: random.Random, members: int) -> Path:
    """Members of every kind unihub meets, in one of tarfile's formats."""
    fmt = rng.choice([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
    extra = {"comment": "unihub"} if fmt == tarfile.PAX_FORMAT and rng.random() < 0.5 else {}
    with tarfile.open(path, "w", format=fmt, pax_headers=extra) as tar:
        for i in range(members):
            roll = rng.random()
            name = f"{i:05d}.{rng.choice(['jpg', 'cls', 'npy', 'seg.png'])}"
            if roll < 0.06:
                name = "deep/" * 22 + name  # a GNU long name, a PAX path, a ustar prefix
            elif roll < 0.09 and fmt != tarfile.USTAR_FORMAT:
                name = f"ünï/{i}.txt"
            elif roll < 0.12 and fmt != tarfile.PAX_FORMAT:
                name = f"caf\udce9-{i}.cls"  # the byte 0xE9 alone: not UTF-8 (a PAX archive would hold a PAX path)
            size = rng.choice([0, 1, 3, 100, 511, 512, 513, 1024, 2300, 9000])
            mtime = rng.choice([0, 1_700_000_000, 1_700_000_000.25])  # a float: a PAX header in PAX format
            if roll > 0.95:
                _add(tar, f"dir{i}", kind=tarfile.DIRTYPE)
            elif roll > 0.93:
                _add(tar, f"link{i}", kind=tarfile.SYMTYPE, link="a")
            else:
                _add(tar, name, bytes(rng.getrandbits(8) for _ in range(size)), mtime=mtime)
    return path


def webdataset_shard(path: Path, samples: int) -> Path:
    webdataset = pytest.importorskip("webdataset")
    with webdataset.TarWriter(str(path)) as sink:
        for i in range(samples):
            sink.write({"__key__": f"{i:06d}", "jpg": bytes([i % 256]) * (700 + i % 900), "cls": i % 10,
                        "npy": np.full(4, i, np.float32)})
    return path


def _rechecksum(raw: bytearray, header: int) -> None:
    raw[header + 148:header + 156] = b" " * 8
    raw[header + 148:header + 156] = b"%06o\0 " % sum(raw[header:header + 512])


def damaged(raw: bytes, rng: random.Random) -> bytes:
    """One kind of damage: a byte changed (a header's checksum made good again, half the time),
    the file cut, or bytes inserted."""
    out = bytearray(raw)
    roll = rng.random()
    if roll < 0.5:
        header = 512 * rng.randrange(len(out) // 512)
        spot = header + rng.choice([rng.randrange(512), 124 + rng.randrange(12), 156, 135, 0, 257, 345, 512])
        if spot < len(out):
            out[spot] = rng.choice([0, 0x30, 0x37, 0x20, 0x78, 0x67, 0x80, 0xFF, rng.getrandbits(8)])
        if rng.random() < 0.5 and header + 512 <= len(out):
            _rechecksum(out, header)
    elif roll < 0.8:
        del out[rng.randrange(len(out)):]
    else:
        at = rng.randrange(len(out))
        out[at:at] = bytes(rng.choice([1, 100, 512, 1024]))
    return bytes(out)


def damaged_copies(source: Path, rng: random.Random, cases: int) -> Iterator[tuple[int, Path]]:
    """``cases`` damaged copies of ``source`` (:func:`damaged`), each written over the last one."""
    raw = source.read_bytes()
    path = source.with_name("damaged.tar")
    for case in range(cases):
        data = damaged(raw, rng)
        if data:
            path.write_bytes(data)
            yield case, path


@pytest.fixture(params=[2, 7, 64, tarstream._WINDOW], ids=lambda w: f"window{w}")
def window(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(tarstream, "_WINDOW", request.param)
    return request.param


@pytest.mark.parametrize("seed", range(6))
def test_written_archives_read_alike(tmp_path: Path, window: int, seed: int) -> None:
    rng = random.Random(seed)
    path = random_archive(tmp_path / "a.tar", rng, rng.choice([1, 5, 40, 300]))
    for regular_only in (True, False):
        for require_end in (True, False):
            fast, reference = fast_and_reference(path, regular_only, require_end)
            assert fast == reference
            assert reference[1] is None  # whole archives read to the end


def test_webdataset_shards_read_alike_and_whole(tmp_path: Path, window: int) -> None:
    path = webdataset_shard(tmp_path / "shard.tar", 700)  # ~4,200 headers: several default windows
    fast, reference = fast_and_reference(path, False, True)
    assert fast == reference and reference[1] is None and len(fast[0]) == 3 * 700
    with tarfile.open(path) as tar:
        expected = [(m.name, m.offset, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]
    assert [(m.name, m.offset, m.data) for m in iter_members(str(path))] == expected


@pytest.mark.parametrize("seed", range(4))
def test_damaged_archives_fail_alike(tmp_path: Path, window: int, seed: int) -> None:
    rng = random.Random(100 + seed)
    source = random_archive(tmp_path / "a.tar", rng, 60) if seed % 2 else webdataset_shard(tmp_path / "w.tar", 40)
    failures = 0
    for case, path in damaged_copies(source, rng, 60):
        for regular_only in (True, False):
            fast, reference = fast_and_reference(path, regular_only, True)
            assert fast == reference, f"case {case}: {fast[1]} != {reference[1]}"
            failures += reference[1] is not None
    assert failures > 20  # the damage reached the parser


def test_a_member_larger_than_the_window(tmp_path: Path) -> None:
    path = tmp_path / "big.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "0.cls", b"1", mtime=1.5)
        _add(tar, "0.bin", bytes(range(256)) * (tarstream._WINDOW * 3), mtime=1.5)  # 3 windows of data
        _add(tar, "1.cls", b"2", mtime=1.5)
    fast, reference = fast_and_reference(path, True, True)
    assert fast == reference and [m[0] for m in fast[0]] == ["0.cls", "0.bin", "1.cls"]


def test_pax_records_that_change_what_is_read_go_to_the_header_loop(tmp_path: Path) -> None:
    """A PAX path or size after many plain members: the fast path hands over at that member."""
    path = tmp_path / "a.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(50):
            _add(tar, f"{i:03d}.cls", b"%d" % i, mtime=1.5)
        info = tarfile.TarInfo("050.cls")
        info.size, info.pax_headers = 2, {"path": "renamed.cls"}
        tar.addfile(info, io.BytesIO(b"50"))
        _add(tar, "051.cls", b"51", mtime=1.5)
    fast, reference = fast_and_reference(path, True, True)
    assert fast == reference and [m[0] for m in fast[0]][-3:] == ["049.cls", "renamed.cls", "051.cls"]


def _header(name: bytes, kind: bytes, size: int) -> bytes:
    block = bytearray(512)
    block[:len(name)] = name
    block[100:108], block[108:116], block[116:124] = b"0000644\0", b"0000000\0", b"0000000\0"
    block[124:136], block[136:148], block[156:157] = b"%011o\0" % size, b"00000000000\0", kind
    block[257:263], block[263:265] = b"ustar\0", b"00"
    _rechecksum(block, 0)
    return bytes(block)


@pytest.mark.parametrize("length", [10, 600], ids=["records-in-one-block", "records-past-one-block"])
def test_a_path_record_in_the_padding_after_pax_records_is_not_one(tmp_path: Path, window: int, length: int) -> None:
    """Only a PAX header's records count, not the padding after them: the loop searched the padded
    body too, and read (and refused as malformed) records it otherwise skips."""
    body = b"g" * length  # not records in PAX's syntax: skipped, as records with only times are
    padded = bytearray(body + bytes(-length % 512))
    padded[-20:-9] = b" path=evil\n"
    data = b"".join([_header(b"PaxHeaders/a", b"x", length), bytes(padded), _header(b"a", b"0", 3),
                     b"abc" + bytes(509), bytes(1024)])
    path = tmp_path / "a.tar"
    path.write_bytes(data)
    fast, reference = fast_and_reference(path, True, True)
    assert fast == reference == ([("a", 0, b"abc", "0")], None)


# ------------------------------------------------------------------ the pair, on archives hypothesis draws
_KINDS = ("file", "empty", "long name", "non-ascii name", "pax path", "float mtime", "directory", "symlink",
          "long link", "hard link")

_members = st.lists(st.tuples(st.sampled_from(_KINDS), st.binary(max_size=1200)), min_size=1, max_size=12)
DAMAGES = st.one_of(  # what damaged_as does to an archive
    st.none(),
    st.tuples(st.just("cut"), st.integers(0, 1 << 20)),
    st.tuples(st.just("byte"), st.integers(0, 1 << 20), st.sampled_from([None, 0, 124, 130, 135, 148, 156, 257, 345]),
              st.integers(0, 255), st.booleans()),
    st.tuples(st.just("insert"), st.integers(0, 1 << 20), st.sampled_from([1, 100, 512, 1024])))


def _drawn_archive(fmt: int, global_header: bool, members: list[tuple[str, bytes]]) -> bytes:
    """A tarfile-written archive of ``members`` (kind, data) in ``fmt``; kinds that ``fmt`` cannot
    write (a PAX path outside PAX, a non-ASCII name in ustar) are written as plain files."""
    buffer = io.BytesIO()
    extra = {"comment": "unihub"} if global_header and fmt == tarfile.PAX_FORMAT else {}
    with tarfile.open(fileobj=buffer, mode="w", format=fmt, pax_headers=extra) as tar:
        for i, (kind, data) in enumerate(members):
            name = f"{i:04d}.bin"
            info = tarfile.TarInfo("deep/" * 22 + name if kind == "long name" else
                                   f"ünï/{name}" if kind == "non-ascii name" and fmt != tarfile.USTAR_FORMAT else name)
            if kind == "pax path" and fmt == tarfile.PAX_FORMAT:
                info.pax_headers = {"path": f"renamed/{name}"}
            info.mtime = 1_700_000_000.5 if kind == "float mtime" else 1_700_000_000
            info.type = {"directory": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "long link": tarfile.SYMTYPE,
                         "hard link": tarfile.LNKTYPE}.get(kind, tarfile.REGTYPE)
            info.linkname = "target/" * 20 if kind == "long link" and fmt != tarfile.USTAR_FORMAT else "0000.bin"
            payload = b"" if kind == "empty" or info.type != tarfile.REGTYPE else data
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def damaged_as(raw: bytes, damage: tuple[Any, ...] | None) -> bytes:
    """``raw`` cut, with a byte changed (in a header field, the header's checksum made good again where
    asked), or with zero bytes inserted, as ``damage`` says."""
    if damage is None:
        return raw
    out = bytearray(raw)
    at = damage[1] % len(out)
    if damage[0] == "cut":
        del out[at:]
    elif damage[0] == "insert":
        out[at:at] = bytes(damage[2])
    else:
        _, _, field, value, rechecksum = damage
        header = at - at % 512
        out[at if field is None else header + field] = value
        if rechecksum:
            _rechecksum(out, header)
    return bytes(out)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT]),
       global_header=st.booleans(), members=_members, damage=DAMAGES,
       window=st.sampled_from([2, 7, 64, tarstream._WINDOW]), regular_only=st.booleans())
def test_the_two_parsers_give_the_same_on_drawn_archives(
        tmp_path: Path, fmt: int, global_header: bool, members: list[tuple[str, bytes]],
        damage: tuple[Any, ...] | None, window: int, regular_only: bool) -> None:
    """``PARSERS["fast"]`` and ``PARSERS["reference"]``: the same members (names, offsets, data, kinds)
    and the same error (message, offset, member), on whole archives and on cut or damaged ones; on a
    whole archive, the regular members tarfile reads."""
    raw = _drawn_archive(fmt, global_header, members)
    path = tmp_path / "drawn.tar"
    path.write_bytes(damaged_as(raw, damage))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tarstream, "_WINDOW", window)
        fast, reference = fast_and_reference(path, regular_only, True)
    assert fast == reference
    if damage is None:
        assert reference[1] is None
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            expected = [(m.name, m.offset, tar.extractfile(m).read()) for m in tar if m.isreg()]  # type: ignore[union-attr]
        assert [(name, offset, data) for name, offset, data, kind in reference[0] if kind == "0"] == expected


def test_the_parsers_are_named_in_one_place(tmp_path: Path) -> None:
    """``iter_members(parser=...)`` takes the names of ``PARSERS``, and refuses another naming the valid ones."""
    assert sorted(tarstream.PARSERS) == ["fast", "reference"]
    path = random_archive(tmp_path / "a.tar", random.Random(3), 5)
    with pytest.raises(InvalidArgumentError, match=r"\['fast', 'reference'\]"):
        iter_members(str(path), parser="quick")  # type: ignore[arg-type]
