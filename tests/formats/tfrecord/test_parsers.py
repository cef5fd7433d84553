"""The two Example parsers (``parsers.EXAMPLE_PARSERS``: ``block`` and ``record``) give the same schema
scans, batches (values and dtypes), errors and reports, on Examples TensorFlow serialized and on corrupted
ones; the record parser's values are TensorFlow's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.formats.tfrecord.reads import assert_same, read_all
from unihub.errors import UnihubError
from unihub.formats.tfrecord import format as tfr
from unihub.formats.tfrecord.example import parse_example
from unihub.formats.tfrecord.format import TFRecordFormat
from unihub.formats.tfrecord.parsers import DEFAULT_PARSER, EXAMPLE_PARSERS
from unihub.formats.tfrecord.records import write_records
from unihub.schema.unischema import Unischema

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

tf = pytest.importorskip("tensorflow")

KINDS = ("bytes", "float", "int64")
NAMES = ("a", "b", "c", "d")


def _schema_or_error(files: list[str], parser: str,
                     sample_records: int | None = None) -> tuple[Unischema | None, str | None]:
    try:
        return TFRecordFormat(files, parser=parser).infer_schema(sample_records=sample_records), None
    except UnihubError as exc:
        return None, f"{type(exc).__name__}: {exc}"


def _scan(files: list[str], parser: str, on_error: str) -> Any:
    try:
        stats, total = tfr._scan_files({"on_error": on_error, "parser": parser}, files)
    except UnihubError as exc:
        return f"{type(exc).__name__}: {exc}"
    return {name: vars(stat) for name, stat in stats.items()}, stats.empty_features, total


# -- generated Examples --------------------------------------------------------------------------
_INT64 = st.one_of(st.integers(0, 127), st.integers(128, 2**14), st.integers(-(2**63), 2**63 - 1))
_VALUES = {
    "bytes": st.one_of(st.binary(max_size=6), st.text(max_size=4).map(str.encode)),
    "float": st.floats(width=32),  # NaN, infinities, subnormals, the largest float32s
    "int64": _INT64,
}


@st.composite
def datasets(draw: Any) -> tuple[list[bytes], list[tuple[str, int, int]]]:
    """Serialized Examples (TensorFlow's ``SerializeToString``), and what to corrupt.

    Each feature name has one kind in the dataset (or, rarely, a feature set to no kind); a record may
    lack any feature (missing), hold an empty list, or one to three values, or be ``tf.train.Example()``
    (``b''``: no features field) or hold an empty features field (``0a 00``); some records' int64 lists
    are re-encoded unpacked (one tag per value, as proto2 writers do), checked equal by TensorFlow.
    """
    kinds = {name: draw(st.sampled_from(KINDS)) for name in draw(st.sets(st.sampled_from(NAMES), min_size=1))}
    lengths = st.sampled_from([0, 1, 1, 1, 1, 2, 3])
    records = []
    for _ in range(draw(st.integers(1, 12))):
        values = {name: [draw(_VALUES[kind]) for _ in range(draw(lengths))]
                  for name, kind in kinds.items() if draw(st.integers(0, 5))}  # ~1 in 6 missing
        kindless = {name for name in values if not draw(st.integers(0, 19))}
        example = _tf_example(kinds, values, kindless)
        data = example.SerializeToString()
        if draw(st.booleans()) and any(kinds[name] == "int64" for name in values):
            data = _unpacked(example)
            assert tf.train.Example.FromString(data) == example
        if not draw(st.integers(0, 15)):  # tf.train.Example(), no features field at all
            data = tf.train.Example().SerializeToString()
        records.append(data)
    damage = draw(st.lists(st.tuples(st.sampled_from(["flip", "cut", "insert"]), st.integers(0, 10**6),
                                     st.integers(0, 255)), max_size=2))
    return records, damage


def _tf_example(kinds: dict[str, str], values: dict[str, list[Any]], kindless: set[str]) -> Any:
    features = {}
    for name, items in values.items():
        kind = kinds[name]
        if name in kindless:
            features[name] = tf.train.Feature()
        elif kind == "bytes":
            features[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=items))
        elif kind == "float":
            features[name] = tf.train.Feature(float_list=tf.train.FloatList(value=items))
        else:
            features[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=items))
    return tf.train.Example(features=tf.train.Features(feature=features))


def _ld(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out) + bytes([value])


def _unpacked(example: Any) -> bytes:
    """``example`` serialized with each int64 list unpacked (tag 0x08 before each value), the rest as TF does."""
    entries = b""
    for name, feature in example.features.feature.items():
        if feature.WhichOneof("kind") == "int64_list":
            body = _ld(0x1A, b"".join(b"\x08" + _varint(v) for v in feature.int64_list.value))
        else:
            body = feature.SerializeToString()
        entries += _ld(0x0A, _ld(0x0A, name.encode()) + _ld(0x12, body))
    return _ld(0x0A, entries)


def _damaged(records: list[bytes], damage: list[tuple[str, int, int]]) -> list[bytes]:
    """``records`` with a byte flipped, a record cut short, or a byte inserted (the framing's CRCs are
    computed over the damaged bytes, so the parsers see the damage)."""
    records = list(records)
    for how, where, byte in damage:
        i = where % len(records)
        data = records[i]
        at = (where // len(records)) % (len(data) + 1)
        if how == "flip" and data:
            at %= len(data)
            records[i] = data[:at] + bytes([data[at] ^ (byte or 1)]) + data[at + 1:]
        elif how == "cut":
            records[i] = data[:at]
        else:
            records[i] = data[:at] + bytes([byte]) + data[at:]
    return records


def _comparable(kind: str | None, values: Any) -> tuple[str | None, Any]:
    """A feature's values in a form ``==`` compares exactly (floats by their float32 bits: NaN too)."""
    if kind == "float":
        return kind, np.asarray(values, np.float32).tobytes()
    if kind == "int64":
        return kind, np.asarray(values, np.int64).tolist()
    return kind, [bytes(v) for v in values]


def _tf_values(data: bytes) -> dict[str, tuple[str | None, Any]]:
    """TensorFlow's parse of a serialized Example, as parse_example's kinds and values."""
    out: dict[str, tuple[str | None, Any]] = {}
    for name, feature in tf.train.Example.FromString(data).features.feature.items():
        kind = feature.WhichOneof("kind")
        out[name] = _comparable(kind and kind.split("_")[0], getattr(feature, kind).value if kind else [])
    return out


# -- the properties ------------------------------------------------------------------------------
def test_the_pair_is_named_once_and_block_is_the_default() -> None:
    assert set(EXAMPLE_PARSERS) == {"block", "record"} and DEFAULT_PARSER == "block"
    assert TFRecordFormat("x.tfrecord").parser == "block"
    assert TFRecordFormat("x.tfrecord", parser="record").parser == "record"
    assert "parser" in TFRecordFormat.OPTIONS


@settings(max_examples=40, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(data=datasets(), batch_size=st.sampled_from([1, 3, 256]))
def test_both_parsers_read_generated_examples_alike(tmp_path: Path, data: Any, batch_size: int) -> None:
    """Generated Examples, then the same damaged: the two parsers scan, infer, read and fail alike."""
    records, damage = data
    for record in records:  # the record parser reads what TensorFlow reads
        assert {name: _comparable(*feature) for name, feature in parse_example(record).items()} == _tf_values(record)
    for label, items in (("clean", records), ("damaged", _damaged(records, damage))):
        path = write_records(str(tmp_path / f"{label}.tfrecord"), items)
        for on_error in ("raise", "skip"):
            assert _scan([path], "block", on_error) == _scan([path], "record", on_error)
        block_schema, block_error = _schema_or_error([path], "block")
        record_schema, record_error = _schema_or_error([path], "record")
        assert block_error == record_error
        assert (block_schema and block_schema.to_json()) == (record_schema and record_schema.to_json())
        if block_schema is None:
            continue
        # the whole file's schema, and the first record's (later records may not fit it: errors)
        for schema in (block_schema, _schema_or_error([path], "record", sample_records=1)[0]):
            for on_error in ("raise", "skip"):
                assert_same(read_all(path, schema, "block", batch_size, on_error),
                            read_all(path, schema, "record", batch_size, on_error))
