"""The ``tf.train.Example`` wire format codec: round trips, edge cases, malformed input."""

from __future__ import annotations

import numpy as np
import pytest

from unihub.formats.tfrecord.example import NotAnExample, encode_example, encode_feature, parse_example


def test_wire_format_edge_cases() -> None:
    values = np.array([0, 1, 127, 128, 300, -1, -(2**63), 2**63 - 1], np.int64)
    parsed = parse_example(encode_example({"v": encode_feature("int64", values)}))
    assert parsed["v"][0] == "int64" and parsed["v"][1].tolist() == values.tolist()
    # unpacked repeated values (proto2 writers) are read too
    unpacked = bytes([0x08, 0x05, 0x08, 0x7F])  # Int64List{value: 5, value: 127}, not packed
    feature = bytes([0x1A, len(unpacked)]) + unpacked
    entry = bytes([0x0A, 1]) + b"u" + bytes([0x12, len(feature)]) + feature
    features = bytes([0x0A, len(entry)]) + entry
    assert parse_example(bytes([0x0A, len(features)]) + features)["u"][1].tolist() == [5, 127]
    # a field an Example does not have would be lost: refused, saying what the record looks like
    with pytest.raises(NotAnExample, match="holds protobuf field 2 \\(wire type 0\\)"):
        parse_example(bytes([0x0A, len(features)]) + features + b"\x10\x01")
    with pytest.raises(NotAnExample, match="SequenceExample \\(it has feature_lists\\)"):
        parse_example(bytes([0x0A, len(features)]) + features + b"\x12\x00")
    with pytest.raises(NotAnExample, match="starts like a TensorProto"):
        parse_example(b"\x08\x01\x12\x00")
    with pytest.raises(ValueError, match="malformed"):
        parse_example(b"\x0a\x05\x0a")


@pytest.mark.parametrize("values", [[300], [5, 300, -1], list(range(100, 200)), list(range(-40, 40))])
def test_int64_lists_round_trip_as_int64(values: list[int]) -> None:
    kind, parsed = parse_example(encode_example({"v": encode_feature("int64", values)}))["v"]
    assert kind == "int64" and np.asarray(parsed).tolist() == values
    assert isinstance(parsed, np.ndarray) and parsed.dtype == np.int64  # values >= 128: an int64 array


def test_small_lists_and_lengths() -> None:
    blob = bytes(range(256)) * 3  # a two-byte length
    parsed = parse_example(encode_example({"b": encode_feature("bytes", [blob, b""]), "f": encode_feature("float", [1.5]),
                                           "i": encode_feature("int64", [7]), "e": encode_feature("float", [])}))
    assert parsed["b"] == ("bytes", [blob, b""])
    assert parsed["f"][0] == "float" and parsed["f"][1].tolist() == [1.5]
    assert parsed["i"] == ("int64", [7])
    assert parsed["e"][0] == "float" and len(parsed["e"][1]) == 0


@pytest.mark.parametrize("buf, reason", [
    (b"\x0a\x05\x0a", "index out of range"),
    (bytes([0x0A, 8, 0x0A, 6, 0x0A, 1]) + b"v" + bytes([0x12, 1, 0x1A, 0]), "a field runs past the end"),
    (bytes([0x0A, 11, 0x0A, 9, 0x0A, 1]) + b"v" + bytes([0x12, 4, 0x1A, 2, 0x0A, 1, 0x80]), "truncated varint"),
    (bytes([0x0A, 7, 0x0A, 5, 0x0A, 3, 0xFF, 0xFE, 0xFD]), "codec can't decode"),
])
def test_malformed(buf: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=f"malformed tf.train.Example: .*{reason}"):
        parse_example(buf)
