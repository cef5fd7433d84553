"""The Thrift compact parser of Parquet's page headers: values as Thrift encodes them, and a
FormatError (never a RecursionError, a hang or a huge allocation) for bytes Thrift would read
otherwise or refuse."""

from __future__ import annotations

import pytest

from unihub.errors import FormatError
from unihub.store._thrift import BINARY, I32, LIST, STRUCT, TRUE, read_struct, varint


def test_a_struct_is_parsed_field_by_field():
    """Integers (zigzag), a boolean, a skipped list and binary, a nested struct, a long-form id."""
    header = bytes([0x15, 0x00,  # 1: i32 0
                    0x15, 0x07,  # 2: i32 -4
                    0x11,  # 3: boolean true
                    0x19, 0x25, 0x02, 0x04,  # 4: list of two i32
                    0x18, 0x02, 0x61, 0x62,  # 5: binary "ab"
                    0x1C, 0x15, 0x06, 0x00,  # 6: struct {1: i32 3}
                    0x05, 0x28, 0x08,  # 20 (long form): i32 4
                    0x00])
    fields, end = read_struct(header, 0)
    assert end == len(header)
    assert fields[1][::2] == (0, I32) and fields[2][0] == -4 and fields[3][::2] == (True, TRUE)
    assert fields[4][::2] == (None, LIST) and fields[5][::2] == (None, BINARY)
    assert fields[6] == ({1: (3, 15, I32)}, 14, STRUCT) and fields[20][0] == 4


BAD = {
    "truncated": bytes([0x15]),
    "a field id past int16": bytes([0x05]) + bytes([0x8A, 0x80, 0x08]) + bytes([0x02, 0x00]),
    "a field twice": bytes([0x15, 0x02, 0x05, 0x02, 0x02, 0x00]),
    "an unknown type": bytes([0x1D, 0x00]),
    "nested too deep": bytes([0x1C]) * 20 + bytes([0x00]) * 21,
    "a huge list": bytes([0x19, 0xF3, 0xA0, 0x9C, 0x01]) + bytes(20_000) + bytes([0x00]),  # 20,000 bytes
    "a binary past the end": bytes([0x18, 0x7F, 0x61, 0x00]),
}


@pytest.mark.parametrize("data", BAD.values(), ids=BAD.keys())
def test_bytes_thrift_would_read_otherwise_are_refused(data):
    with pytest.raises(FormatError):
        read_struct(data, 0)


def test_a_varint_is_bounded():
    assert varint(bytes([0x96, 0x01]), 0) == (150, 2)
    with pytest.raises(FormatError, match="longer than 5 bytes"):
        varint(bytes([0x80] * 6 + [0x01]), 0, 5)
