"""``tf.train.Example`` parsing: protobuf's generated classes against unihub's parsers, CPU per record.

Two questions, one script:

``--part parsers``: the same serialized Examples (an image's bytes, a label, a few floats and ints)
parsed record by record by protobuf's own classes -- built from ``example.proto``'s descriptor in a
*private* ``DescriptorPool``, since TensorFlow and the ``tfrecord`` package each register
``tensorflow.Example`` in the default pool and a second registration fails -- against unihub's
hand-written per-record parser (:func:`~unihub.formats.tfrecord.example.parse_example`) and its block
parser (:mod:`~unihub.formats.tfrecord.example_block`, a block of 1,024 records at once, into columns).
Rounds alternate the parsers; each figure is the best round's CPU time per record.

``--part ingest``: a TFRecord file read whole by ``TFRecordFormat.read_batches`` (framing, CRCs, parsing,
columns), CPU per record, best of the rounds: the hot path of an ingest. Run it on two checkouts in turn
(``PYTHONPATH``) to compare them.

    python benchmarks/example_parsers.py [--records 100000] [--rounds 5] [--part parsers|ingest|all] [--large-ints]

The figures of 2026-12-06 and the decision they led to (the hand-written parsers stay) are in the
docstring of :mod:`unihub.formats.tfrecord.parsers`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import unihub
from unihub.formats.tfrecord.example import encode_example, encode_feature, parse_example
from unihub.formats.tfrecord.example_block import BLOCK, _parse_block
from unihub.formats.tfrecord.format import TFRecordFormat
from unihub.formats.tfrecord.framing import Block
from unihub.formats.tfrecord.records import write_records
from unihub.formats.tfrecord.schema import _Plan
from unihub.images import decoders as images


def examples(count: int, large_ints: bool = False, seed: int = 0) -> list[bytes]:
    """``count`` serialized Examples: a 32x32 JPEG (one of 16), a label, 4 floats and 8 ints, below 128
    (one byte on the wire each) or ``large_ints`` (up to 2^40 either sign: 6 to 10 bytes each)."""
    rng = np.random.default_rng(seed)
    jpegs = [images.encode_image(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8), "jpeg", 90) for _ in range(16)]
    floats = rng.standard_normal((count, 4)).astype(np.float32)
    ints = rng.integers(-(2**40), 2**40, (count, 8)) if large_ints else rng.integers(0, 128, (count, 8))
    labels = rng.integers(0, 100, count)
    return [encode_example({"image": encode_feature("bytes", [jpegs[i % 16]]),
                            "label": encode_feature("int64", [labels[i]]),
                            "box": encode_feature("float", floats[i]),
                            "ids": encode_feature("int64", ints[i])}) for i in range(count)]


def example_class() -> Any:
    """protobuf's ``tensorflow.Example`` class from a private pool (example.proto and feature.proto)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    feature = descriptor_pb2.FileDescriptorProto(name="tensorflow/core/example/feature.proto",
                                                 package="tensorflow", syntax="proto3")
    label = descriptor_pb2.FieldDescriptorProto
    for name, kind, packed in (("BytesList", label.TYPE_BYTES, False), ("FloatList", label.TYPE_FLOAT, True),
                               ("Int64List", label.TYPE_INT64, True)):
        message = feature.message_type.add(name=name)
        field = message.field.add(name="value", number=1, type=kind, label=label.LABEL_REPEATED)
        if packed:
            field.options.packed = True
    message = feature.message_type.add(name="Feature")
    message.oneof_decl.add(name="kind")
    for number, (name, kind) in enumerate((("bytes_list", "BytesList"), ("float_list", "FloatList"),
                                           ("int64_list", "Int64List")), 1):
        message.field.add(name=name, number=number, type=label.TYPE_MESSAGE, type_name=f".tensorflow.{kind}",
                          label=label.LABEL_OPTIONAL, oneof_index=0)
    message = feature.message_type.add(name="Features")
    entry = message.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=label.TYPE_STRING, label=label.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=label.TYPE_MESSAGE, type_name=".tensorflow.Feature",
                    label=label.LABEL_OPTIONAL)
    message.field.add(name="feature", number=1, type=label.TYPE_MESSAGE,
                      type_name=".tensorflow.Features.FeatureEntry", label=label.LABEL_REPEATED)
    example = descriptor_pb2.FileDescriptorProto(name="tensorflow/core/example/example.proto",
                                                 package="tensorflow", syntax="proto3",
                                                 dependency=[feature.name])
    example.message_type.add(name="Example").field.add(name="features", number=1, type=label.TYPE_MESSAGE,
                                                         type_name=".tensorflow.Features",
                                                         label=label.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(feature)
    pool.Add(example)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


def protobuf_parser(cls: Any) -> Callable[[bytes], dict[str, tuple[str, Any]]]:
    """Records parsed by protobuf, into what parse_example gives (bytes lists, float32 / int64 arrays)."""
    def parse(data: bytes) -> dict[str, tuple[str, Any]]:
        out: dict[str, tuple[str, Any]] = {}
        for name, feature in cls.FromString(data).features.feature.items():
            kind = feature.WhichOneof("kind")
            if kind == "bytes_list":
                out[name] = ("bytes", list(feature.bytes_list.value))
            elif kind == "float_list":
                out[name] = ("float", np.array(feature.float_list.value, np.float32))
            elif kind == "int64_list":
                out[name] = ("int64", np.array(feature.int64_list.value, np.int64))
        return out
    return parse


def protobuf_columns(cls: Any, records: list[bytes]) -> Callable[[], int]:
    """protobuf at its best in a columnar read: each record parsed by ``FromString``, its values appended
    to per-feature Python lists, each list made a numpy column once per 1,024 records."""
    def parse() -> int:
        for first in range(0, len(records), BLOCK):
            images_: list[bytes] = []
            labels: list[int] = []
            boxes: list[float] = []
            ids: list[int] = []
            for data in records[first:first + BLOCK]:
                feature = cls.FromString(data).features.feature
                images_.append(feature["image"].bytes_list.value[0])
                labels.append(feature["label"].int64_list.value[0])
                boxes.extend(feature["box"].float_list.value)
                ids.extend(feature["ids"].int64_list.value)
            columns = (np.array(labels, np.int64), np.array(boxes, np.float32).reshape(-1, 4),
                       np.array(ids, np.int64).reshape(-1, 8))
            assert len(columns[0]) == len(images_)
        return len(records)
    return parse


def cpu_per_record(fn: Callable[[], int]) -> float:
    """CPU seconds per record of ``fn()`` (which returns how many records it handled)."""
    start = time.process_time()
    count = fn()
    return (time.process_time() - start) / count


def block_parser(records: list[bytes]) -> Callable[[], int]:
    """The block parser over ``records``, 1,024 at a time, into the columns of their inferred schema
    (images not checked: the other parsers do not check them either)."""
    with tempfile.TemporaryDirectory() as tmp:
        schema = TFRecordFormat(write_records(f"{tmp}/sample.tfrecord", records[:1000])).infer_schema()
    plans = [_Plan.of(field, "none") for field in schema]
    blocks = []
    for first in range(0, len(records), BLOCK):
        chunk = records[first:first + BLOCK]
        ends = np.cumsum([len(r) for r in chunk])
        starts = ends - [len(r) for r in chunk]
        blocks.append(Block(b"".join(chunk), list(range(len(chunk))), starts.tolist(), starts, ends))

    def parse() -> int:
        count = 0
        for block in blocks:
            at, _, failures = _parse_block(block, plans)
            assert not failures
            count += len(at)
        return count

    return parse


def compare_parsers(records: list[bytes], rounds: int) -> dict[str, float]:
    """Best CPU µs per record of each parser, the parsers alternated round by round."""
    cls = example_class()
    by_protobuf = protobuf_parser(cls)
    reference, expected = parse_example(records[0]), by_protobuf(records[0])
    assert list(reference) == list(expected) or sorted(reference) == sorted(expected)
    for name in reference:
        assert reference[name][0] == expected[name][0]
        assert np.array_equal(np.asarray(reference[name][1]), np.asarray(expected[name][1]))
    contenders: dict[str, Callable[[], int]] = {
        "protobuf FromString only": lambda: sum(1 for r in records if cls.FromString(r) is not None),
        "protobuf FromString + values out (a dict of lists / arrays, as parse_example)":
            lambda: sum(1 for r in records if by_protobuf(r) is not None),
        "protobuf FromString into columns (1,024 records)": protobuf_columns(cls, records),
        "unihub per record (parse_example)": lambda: sum(1 for r in records if parse_example(r) is not None),
        "unihub block (1,024 records into columns)": block_parser(records),
    }
    best = {name: float("inf") for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            best[name] = min(best[name], cpu_per_record(fn))
    return best


def ingest(records: list[bytes], rounds: int) -> float:
    """Best CPU µs per record of reading a TFRecord file of ``records`` whole through read_batches."""
    with tempfile.TemporaryDirectory() as tmp:
        path = write_records(f"{tmp}/bench.tfrecord", records)
        schema = TFRecordFormat(path).infer_schema()

        def read() -> int:
            return sum(len(batch["label"]) for batch in TFRecordFormat(path).read_batches(schema, batch_size=256))

        return min(cpu_per_record(read) for _ in range(rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--part", choices=("parsers", "ingest", "all"), default="all")
    parser.add_argument("--large-ints", action="store_true", help="ingest: ints up to 2^40 (default: below 128)")
    args = parser.parse_args()
    print(f"unihub from {os.path.dirname(unihub.__file__)}")
    records = examples(args.records)
    if args.part in ("parsers", "all"):
        large = compare_parsers(examples(args.records, large_ints=True), args.rounds)
        small = compare_parsers(records, args.rounds)
        print(f"{args.records:,} records, best of {args.rounds} alternated rounds, CPU µs per record\n")
        print("| parser | ints < 128 | ints up to 2^40 |")
        print("|---|---|---|")
        for name, seconds in small.items():
            print(f"| {name} | {seconds * 1e6:.2f} | {large[name] * 1e6:.2f} |")
    if args.part in ("ingest", "all"):
        ints = "ints up to 2^40" if args.large_ints else "ints < 128"
        data = examples(args.records, large_ints=True) if args.large_ints else records
        print(f"ingest (read_batches, {args.records:,} records, {ints}, best of {args.rounds}): "
              f"{ingest(data, args.rounds) * 1e6:.2f} CPU µs per record")


if __name__ == "__main__":
    main()
