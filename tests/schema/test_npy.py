"""``.npy`` headers from anywhere: every malformed or hostile header is a CodecError naming the byte, before
anything is allocated; what np.save writes still loads, as fast as before."""

from __future__ import annotations

import contextlib
import io
import re
import tarfile
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from unihub.cli import main
from unihub.errors import CodecError
from unihub.formats.webdataset.verify import tarfile_records
from unihub.schema import npy


def saved(array: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    buffer = io.BytesIO()
    if version is None:
        np.save(buffer, array)
    else:
        np.lib.format.write_array(buffer, array, version=version)
    return buffer.getvalue()


def crafted(header: str, data: bytes = b"", *, version: int = 1, length: int | None = None) -> bytes:
    """``.npy`` bytes with this header text (padded as np.save pads) and data; ``length`` overrides the
    header length field."""
    size_field = 2 if version == 1 else 4
    text = header.encode("latin-1")
    text += b" " * (-(6 + 2 + size_field + len(text) + 1) % 64) + b"\n"
    declared = len(text) if length is None else length
    return b"\x93NUMPY" + bytes([version, 0]) + declared.to_bytes(size_field, "little") + text + data


@contextlib.contextmanager
def small(megabytes: float = 20.0) -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < megabytes * 2**20, f"allocated {peak / 2**20:.0f} MiB at the peak"


def refused(blob: bytes, message: str) -> CodecError:
    """``load_npy(blob)`` raises exactly a CodecError matching ``message`` (no ValueError, MemoryError,
    OverflowError of numpy's), without allocating."""
    with small(), pytest.raises(Exception) as info:  # noqa: B017, PT011  (the exact class is asserted below)
        npy.load_npy(blob)
    assert type(info.value) is CodecError, repr(info.value)
    assert info.match(message)
    return info.value


def f8(shape: str, extra: str = "") -> str:
    """A float64 header with this shape text."""
    return "{'descr': '<f8', 'fortran_order': False, 'shape': " + shape + ", " + extra + "}"


@pytest.mark.parametrize("header, data, message", [
    (f8("(-2, -3)"), b"\0" * 48, r"at byte 10: shape \(-2, -3\) is not a tuple of at most 64 "
                                                   "non-negative ints"),
    (f8("(-1,)"), b"\0" * 80, r"shape \(-1,\) is not a tuple"),  # np.frombuffer: -1 is "all"
    (f8("(2.5,)"), b"\0" * 16, "is not a tuple"),
    (f8("(True,)"), b"\0" * 8, "is not a tuple"),
    (f8("[4]"), b"\0" * 32, "is not a tuple"),
    (f8("(" + "1," * 65 + ")"), b"\0" * 8, "at most 64"),
    ("{'descr': 'V0', 'fortran_order': False, 'shape': (3,), }", b"", "descr 'V0' is a dtype np.save never writes "
                                                                       r"\(no size\)"),
    ("{'descr': '(2,)<f4', 'fortran_order': False, 'shape': (3,), }", b"\0" * 24, r"\(a sub-array\)"),
    ("{'descr': 'not a dtype', 'fortran_order': False, 'shape': (3,), }", b"", "descr 'not a dtype' is not a numpy"),
    ("{'descr': '<f8', 'fortran_order': 'yes', 'shape': (2,), }", b"\0" * 16, "fortran_order 'yes' is not True or "
                                                                              "False"),
    ("{'descr': '<f8', 'fortran_order': 1, 'shape': (2,), }", b"\0" * 16, "fortran_order 1 is not True"),
    ("{'descr': '<f8', 'shape': (2,), }", b"\0" * 16, "not a dict of exactly 'descr', 'fortran_order' and 'shape'"),
    (f8("(2,)", "'extra': 1"), b"\0" * 16, "not a dict of exactly"),
    ("[1, 2, 3]", b"", "not a dict of exactly"),
    ("__import__('os').system('true')", b"", r"malformed .npy header at byte 10 \(ValueError\)"),
    (f8("(" + "9" * 5000 + ",)"), b"", "malformed .npy header"),  # over int's 4300 digits
    ("(" * 1000 + ")" * 1000, b"", "malformed .npy header"),  # nesting beyond the parser's limit
    # the data does not match the header: too short (a giant shape, an overflowing product), too long
    (f8("(10**12,)"), b"\0" * 8, "malformed"),  # an expression, not a literal
    (f8("(1000000000000,)"), b"\0" * 8, r"truncated: shape \(1000000000000,\) of float64 is "
                                                          "8,000,000,000,000 bytes, found 8"),
    (f8("(4294967296, 4294967296)"), b"", "147,573,952,589,676,412,928 bytes, found 0"),
    (f8("(3,)"), b"\0" * 16, "truncated: shape"),
    (f8("(2,)"), b"\0" * 24, r"followed by other bytes: shape \(2,\) of float64 is 16 bytes, "
                                               "found 24"),
])
def test_hostile_headers_are_codec_errors(header: str, data: bytes, message: str) -> None:
    refused(crafted(header, data), message)


def test_header_lengths_beyond_the_limit_or_the_bytes() -> None:
    refused(crafted(f8("(1,)"), b"\0" * 8, version=2, length=2**31),
            "header length 2,147,483,648 at byte 8 is over the limit of 65,535 bytes")
    refused(crafted(f8("(1,)"), version=1, length=65_000), "claims 65000 bytes but the .npy has")
    refused(b"\x93NUMPY\x02\x00\x01\x00", "truncated: 10 bytes end inside the header length at byte 8")
    refused(b"\x93NUMPY\x09\x00" + b"\0" * 20, r"format version 9 is not supported \(byte 6\)")
    refused(b"PK\x03\x04 a zip", "not .npy bytes")


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4)),
    np.zeros((0, 5), np.uint8),
    np.float64(2.5).reshape(()),
    np.array([1.5, -2.0], dtype=">f8"),
    np.array(["ab", "c"]),
    np.array([b"x", b"yz"]),
    np.array(["2024-01-01", "NaT"], dtype="M8[s]"),
    np.zeros(3, dtype=[("a", "<f4"), ("b", "<i8", (2,))]),
    np.ones((2, 2), np.complex128),
])
@pytest.mark.parametrize("version", [None, (2, 0), (3, 0)])
def test_what_np_save_writes_loads_exactly(array: np.ndarray, version: tuple[int, int] | None) -> None:
    loaded = npy.load_npy(saved(array, version))
    assert loaded.dtype == array.dtype and loaded.shape == array.shape
    assert loaded.tobytes() == array.tobytes()  # in C order, values and bits
    assert loaded.flags.writeable


def test_header_mismatch_reasons() -> None:
    f4 = np.dtype(np.float32)
    assert npy.header_mismatch(f4, (3, 4), f4, (None, 4)) is None
    assert npy.header_mismatch(np.dtype(">f4"), (3,), f4, (3,)) is None  # byte order is no contradiction
    assert npy.header_mismatch(np.dtype("M8[ns]"), (2,), np.dtype("M8"), (2,)) is None  # a generic unit takes any
    assert npy.header_mismatch(np.dtype("<U3"), (2,), np.dtype(object), (2,)) is None
    assert npy.header_mismatch(np.dtype("f8"), (3,), f4, (3,)) == "the stored array is float64, the field is float32"
    assert npy.header_mismatch(f4, (3, 5), f4, (None, 4)) == "the stored array has shape (3, 5), the field (None, 4)"
    assert npy.header_mismatch(f4, (3,), f4, (3, 1)) == "the stored array has shape (3,), the field (3, 1)"


def test_verify_does_not_trust_a_giant_shape(tmp_path: Path) -> None:
    # np.load allocates the declared shape before reading: here 8 GB for 8 bytes of data; verify compares
    # WebDataset members as the bytes tarfile reads (issue 36), never loading them
    blob = crafted(f8("(1000000000,)"), b"\0" * 8)
    shard = tmp_path / "a.tar"
    with tarfile.open(shard, "w") as tar:
        info = tarfile.TarInfo("a.x.npy")
        info.size = len(blob)
        tar.addfile(info, io.BytesIO(blob))
    with small():
        ((_, record),) = list(tarfile_records([str(shard)]))
    assert record == {"__key__": "a", "x.npy": {"a.x.npy": blob}}


# -- through WebDataset shards written by webdataset's TarWriter, and the CLI -------------------------
@pytest.mark.parametrize("hostile, message", [
    (crafted("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", b"\0" * 24), r"shape \(-1,\) is not a tuple"),
    (crafted("{'descr': 'V0', 'fortran_order': False, 'shape': (4,), }"), "descr 'V0'"),
    (crafted("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }", b"\0" * 16), "truncated"),
])
def test_a_hostile_npy_member_is_one_error_line_naming_shard_key_and_member(
        tmp_path: Path, capsys: pytest.CaptureFixture, hostile: bytes, message: str) -> None:
    wds = pytest.importorskip("webdataset")
    shard = tmp_path / "shards" / "shard-000000.tar"
    shard.parent.mkdir()
    with wds.TarWriter(str(shard), encoder=False) as writer:
        for key, member in (("a", saved(np.zeros(4, np.float32))), ("b", hostile), ("c", saved(np.ones(4, np.float32)))):
            writer.write({"__key__": key, "x.npy": member})
    with tarfile.open(shard) as tar:
        offset = tar.getmember("b.x.npy").offset  # where Python's tarfile finds the sample
    assert main(["convert", str(shard), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"unihub: error: {shard}: sample 'b' (offset {offset}), member "
                                                   "'b.x.npy': ")
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()
