"""Fuzzing every hand-written parser of untrusted bytes, for a bounded time.

Each target starts from files written by the format's own library (TensorFlow's ``TFRecordWriter``,
webdataset's ``TarWriter``, ``np.save``, Petastorm's pickled metadata, PIL) and applies a few
mutations (bit flips, extreme integers, cuts, insertions; some with the format's checksums made
good again, so that the mutation reaches the parser behind them). Whatever the bytes, a parser
may only succeed or raise the named error it documents, within a few seconds; a conversion of a
mutated file either succeeds or raises a :class:`UnihubError` and leaves nothing at the destination.

Three runs of the same targets (:data:`TARGETS`):

- ``test_quick``: ``UNIHUB_FUZZ_EXAMPLES`` inputs per target (default 60) drawn by Hypothesis, which shrinks a
  failure to a small input; deterministic unless ``UNIHUB_FUZZ_RANDOM`` is set.
- ``test_deep`` (``slow``, run in CI): ``UNIHUB_FUZZ_DEEP_EXAMPLES`` inputs per target (default 5,000) from the same
  mutations drawn by a seeded ``random.Random`` (``UNIHUB_FUZZ_SEED``, default 37): Hypothesis' own cost per
  input is several times what most parsers take. All targets took 42 s of CPU (2026-12-06; 5 minutes of wall
  time on a shared 2-core host at load 16), two thirds of it in the conversions and format detection.
- ``test_corpus``: the inputs these runs found that once broke a parser (:data:`CORPUS`), kept as fast tests.

Each target's inputs go to ``<target>.check(data, choice)`` (``choice``: the check's options), so the three runs
check the same thing.
"""

from __future__ import annotations

import gzip
import io
import os
import random
import struct
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from unihub.errors import (  # noqa: E402
    CodecError,
    FormatError,
    PetastormMetadataError,
    UnihubError,
    UnsafeMetadataError,
)

pytestmark = pytest.mark.fuzz

EXAMPLES = int(os.environ.get("UNIHUB_FUZZ_EXAMPLES", "60"))
DEEP_EXAMPLES = int(os.environ.get("UNIHUB_FUZZ_DEEP_EXAMPLES", "5000"))
DEEP_SEED = int(os.environ.get("UNIHUB_FUZZ_SEED", "37"))
SECONDS_PER_INPUT = 10.0  # generous: the machine is shared; a bomb takes minutes or never ends
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize=not os.environ.get("UNIHUB_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
FIXTURES = Path(__file__).parent / "fixtures" / "petastorm"

# ------------------------------------------------------------------ mutations

#: integers that break parsers: zero, signs, powers of two and their neighbours, all ones
EXTREMES = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
            2**50, 2**63 - 1, 2**63, 2**64 - 1]


def _apply(seed: bytes, ops: list[tuple[Any, ...]]) -> bytes:
    data = bytearray(seed)
    for op in ops:
        kind, at = op[0], op[1] % (len(data) + 1)
        if kind == "flip" and at < len(data):
            data[at] ^= 1 << op[2]
        elif kind == "byte" and at < len(data):
            data[at] = op[2]
        elif kind == "int":
            width, value = op[2], op[3] & ((1 << (8 * op[2])) - 1)
            data[at:at + width] = value.to_bytes(width, op[4])
        elif kind == "varint":  # protobuf lengths and tags
            data[at:at + 1] = _varint(op[2])
        elif kind == "cut":
            del data[at:]
        elif kind == "insert":
            data[at:at] = op[2]
        elif kind == "delete":
            del data[at:at + op[2]]
    return bytes(data)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


#: a byte string of 1 to 24 random bytes (the argument of an insertion)
INSERTED = "inserted bytes"
#: each mutation's arguments after its position: the values each is drawn from
OPS: dict[str, tuple[Any, ...]] = {
    "flip": (range(8),),
    "byte": (range(256),),
    "int": ((1, 2, 4, 8), EXTREMES, ("little", "big")),
    "varint": (EXTREMES,),
    "cut": (),
    "insert": (INSERTED,),
    "delete": (range(1, 65),),
}
_POSITIONS = 1 << 20  # a position is scaled to the seed's length: this many steps over it
_RANDOM_BYTES = 256  # an input that is no mutation: up to this many random bytes


def _place(seed: bytes, ops: list[tuple[Any, ...]]) -> bytes:
    """``seed`` with ``ops`` applied, their positions scaled from ``[0, _POSITIONS)`` to its length."""
    scale = max(len(seed), 1)
    return _apply(seed, [(o[0], o[1] * scale // _POSITIONS, *o[2:]) for o in ops])


def _strategy(values: Any) -> st.SearchStrategy[Any]:
    return st.binary(min_size=1, max_size=24) if values is INSERTED else st.sampled_from(list(values))


def mutated(seeds: list[bytes]) -> st.SearchStrategy[bytes]:
    """One of ``seeds`` with one to four mutations at positions spread over it, or random bytes."""
    op = st.one_of(*(st.tuples(st.just(kind), st.integers(0, _POSITIONS - 1), *map(_strategy, args))
                     for kind, args in OPS.items()))
    return st.one_of(st.builds(_place, st.sampled_from(seeds), st.lists(op, min_size=1, max_size=4)),
                     st.binary(max_size=_RANDOM_BYTES))


def random_mutated(rng: random.Random, seeds: list[bytes]) -> bytes:
    """What :func:`mutated` draws, drawn by ``rng``: the deep run's inputs."""
    if rng.random() < 0.1:
        return rng.randbytes(rng.randrange(_RANDOM_BYTES + 1))
    ops = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(list(OPS))
        args = [rng.randbytes(rng.randint(1, 24)) if values is INSERTED else rng.choice(values)
                for values in OPS[kind]]
        ops.append((kind, rng.randrange(_POSITIONS), *args))
    return _place(rng.choice(seeds), ops)


def bounded(call: Callable[[], Any], allowed: tuple[type[BaseException], ...]) -> Any:
    """Run ``call``: it returns, or raises one of ``allowed``, within :data:`SECONDS_PER_INPUT`."""
    start = time.monotonic()
    try:
        return call()
    except allowed:
        return None
    finally:
        assert time.monotonic() - start < SECONDS_PER_INPUT, "a parser took too long on fuzzed bytes"


# ------------------------------------------------------------------ seeds, written by the formats' libraries

def _tf() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return pytest.importorskip("tensorflow")


def _examples() -> list[bytes]:
    tf = _tf()
    f = tf.train.Feature
    example = tf.train.Example(features=tf.train.Features(feature={
        "id": f(int64_list=tf.train.Int64List(value=[7, -1])),
        "x": f(float_list=tf.train.FloatList(value=[1.5, -0.0, float("nan")])),
        "name": f(bytes_list=tf.train.BytesList(value=[b"abc", b""])),
    })).SerializeToString()
    sequence = tf.train.SequenceExample(
        context=tf.train.Features(feature={"id": f(int64_list=tf.train.Int64List(value=[3]))}),
        feature_lists=tf.train.FeatureLists(feature_list={"steps": tf.train.FeatureList(feature=[
            f(float_list=tf.train.FloatList(value=[1.0, 2.0])), f(float_list=tf.train.FloatList(value=[3.0, 4.0]))])}),
    ).SerializeToString()
    tensor = tf.io.serialize_tensor(tf.constant(np.arange(6, dtype=np.int32).reshape(2, 3))).numpy()
    strings = tf.io.serialize_tensor(tf.constant([b"a", b"bc"])).numpy()
    return [example, sequence, tensor, strings]


@pytest.fixture(scope="module")
def tf_payloads() -> list[bytes]:
    return _examples()


def _framed(records: list[bytes]) -> bytes:
    """TFRecord framing with good CRCs, as TFRecordWriter writes it."""
    from unihub.formats.tfrecord.records import masked_crc

    out = bytearray()
    for record in records:
        length = struct.pack("<Q", len(record))
        out += length + struct.pack("<I", masked_crc(length)) + record + struct.pack("<I", masked_crc(record))
    return bytes(out)


@pytest.fixture(scope="module")
def tfrecord_files(tmp_path_factory: pytest.TempPathFactory, tf_payloads: list[bytes]) -> list[bytes]:
    """TFRecord files as TensorFlow writes them: plain, GZIP and ZLIB."""
    tf = _tf()
    root = tmp_path_factory.mktemp("tfrecord-seeds")
    files = []
    for compression in ("", "GZIP", "ZLIB"):
        path = root / f"seed-{compression or 'plain'}.tfrecord"
        with tf.io.TFRecordWriter(str(path), options=compression or None) as writer:
            for _ in range(3):
                writer.write(tf_payloads[0])
        files.append(path.read_bytes())
    return files


@pytest.fixture(scope="module")
def tar_files(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """WebDataset shards written by webdataset's TarWriter, and a PAX/GNU tar written by tarfile."""
    wds = pytest.importorskip("webdataset")
    root = tmp_path_factory.mktemp("tar-seeds")
    path = root / "shard.tar"
    with wds.TarWriter(str(path)) as sink:
        for i in range(3):
            sink.write({"__key__": f"s{i:03d}", "cls": str(i).encode(), "txt": "é" * i,
                        "npy": np.arange(i + 1, dtype=np.int16)})
    files = [path.read_bytes()]
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
            for name, data in ((f"{'d/' * 60}s000.cls", b"1"), ("s000.txt", b"x" * 600)):
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), 1.5
                tar.addfile(info, io.BytesIO(data))
        files.append(buffer.getvalue())
    return files


def _fix_tar_checksums(data: bytes) -> bytes:
    """Make every header's checksum good again, walking headers as a reader would."""
    out, at = bytearray(data), 0
    while at + 512 <= len(out):
        block = out[at:at + 512]
        if not any(block):
            break
        block[148:156] = b"        "
        out[at + 148:at + 156] = b"%06o\0 " % (sum(block) & 0o777777)
        try:
            size = int(bytes(block[124:136]).split(b"\0")[0].strip() or b"0", 8)
        except ValueError:
            break
        at += 512 + (size + 511) // 512 * 512
    return bytes(out)


# ------------------------------------------------------------------ targets

@dataclass(frozen=True)
class Target:
    """One parser under fuzz: the seeds its inputs are mutated from, and the check of one input. ``choice``
    (0-63) picks the check's options (checksums made good again, gzipped, where a bad record sits, ...)."""

    seeds: list[bytes]
    check: Callable[[bytes, int], None]


#: name -> how to make the target, from the test's fixtures and a folder of its own
TARGETS: dict[str, Callable[[pytest.FixtureRequest, Path], Target]] = {}


def target(make: Callable[[pytest.FixtureRequest, Path], Target]) -> Callable[[pytest.FixtureRequest, Path], Target]:
    TARGETS[make.__name__] = make
    return make


def _consume_records(path: Path) -> None:
    from unihub.formats.tfrecord.records import iter_records

    for _ in iter_records(str(path)):
        pass


@target
def tfrecord_framing(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    path = tmp_path / "fuzzed.tfrecord"

    def check(data: bytes, choice: int) -> None:
        path.write_bytes(data)
        bounded(lambda: _consume_records(path), (FormatError,))

    return Target(request.getfixturevalue("tfrecord_files"), check)


@target
def example_protobufs(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    from unihub.formats.tfrecord.example import parse_example
    from unihub.formats.tfrecord.sequence import Mismatch, parse_sequence_example
    from unihub.formats.tfrecord.tensor_proto import TensorProtoError, parse_tensor

    def check(data: bytes, choice: int) -> None:
        # their contract: ValueError (NotAnExample and TensorProtoError are ValueErrors), which the
        # format turns into a FormatError naming file and record (tfrecord_conversion)
        bounded(lambda: parse_example(data), (ValueError,))
        bounded(lambda: parse_sequence_example(data), (ValueError, Mismatch))
        bounded(lambda: parse_tensor(data), (TensorProtoError,))

    return Target(request.getfixturevalue("tf_payloads"), check)


def _nothing_left(root: Path, keep: set[str]) -> None:
    assert sorted(p.name for p in root.iterdir()) == sorted(keep), "a failed conversion left something behind"


def _convert_or_refuse(src: Path, dst: Path, **options: Any) -> None:
    from unihub.converters.convert import convert

    start = time.monotonic()
    try:
        convert(src, dst, progress=False, **options)
    except UnihubError:
        _nothing_left(dst.parent, {src.name})
    else:
        import shutil

        shutil.rmtree(dst)
    assert time.monotonic() - start < SECONDS_PER_INPUT * 3


@target
def format_detection(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    """Detection by content, which every format's ``detect`` does on a file whose name says nothing: a format's
    name, None, or a UnihubError (a GZIP stream cut short once went through tarfile as a raw EOFError)."""
    from unihub.formats.base import detect_format

    path = tmp_path / "data"

    def check(data: bytes, choice: int) -> None:
        path.write_bytes(gzip.compress(data, mtime=0)[:len(data) + 18 - choice] if choice & 1 else data)
        bounded(lambda: detect_format(str(path)), (UnihubError,))

    return Target(request.getfixturevalue("tfrecord_files") + request.getfixturevalue("tar_files"), check)


@target
def tfrecord_conversion(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    """Records with good framing but fuzzed payloads, converted: a dataset or a UnihubError."""
    src, dst = tmp_path / "records.tfrecord", tmp_path / "out"
    seeds = request.getfixturevalue("tf_payloads")[:3]  # an Example, a SequenceExample, a tensor

    def check(bad: bytes, choice: int) -> None:
        good = seeds[choice % 3]
        records = [good, good]
        records.insert(choice // 3 % 3, bad)
        src.write_bytes(_framed(records))
        _convert_or_refuse(src, dst)

    return Target(seeds, check)


@target
def tar_members(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    from unihub.formats.webdataset.tarstream import iter_members

    path = tmp_path / "fuzzed.tar"

    def check(data: bytes, choice: int) -> None:
        gzipped = bool(choice & 2)
        if choice & 1:
            data = _fix_tar_checksums(data)
        target = path.with_suffix(".tar.gz") if gzipped else path
        target.write_bytes(gzip.compress(data, mtime=0) if gzipped else data)

        def read_all() -> None:
            for member in iter_members(str(target), require_end=False):
                assert len(member.data) >= 0 and member.name is not None

        bounded(read_all, (FormatError,))

    return Target(request.getfixturevalue("tar_files"), check)


@target
def tar_fast_path(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    """The numpy walk over a mapped archive gives the header loop's members, or its error."""
    from tests.formats.webdataset.test_tarstream_fast import fast_and_reference

    path = tmp_path / "fuzzed.tar"

    def check(data: bytes, choice: int) -> None:
        if choice & 1:
            data = _fix_tar_checksums(data)
        if not data:
            return
        path.write_bytes(data)
        fast, slow = bounded(lambda: fast_and_reference(path, bool(choice & 2), True), ())
        assert fast == slow

    return Target(request.getfixturevalue("tar_files"), check)


@target
def webdataset_conversion(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    src, dst = tmp_path / "shard.tar", tmp_path / "out"

    def check(data: bytes, choice: int) -> None:
        src.write_bytes(_fix_tar_checksums(data))
        _convert_or_refuse(src, dst, from_format="webdataset")

    return Target(request.getfixturevalue("tar_files")[:1], check)


@target
def npy_headers(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    from unihub.schema.npy import load_npy

    seeds = []
    for array in (np.arange(6, dtype="<i4").reshape(2, 3), np.array([1.5], dtype=">f8"), np.zeros((0, 2), np.uint8),
                  np.asfortranarray(np.arange(4, dtype=np.int16).reshape(2, 2)), np.array(["ab"], dtype="<U2")):
        buffer = io.BytesIO()
        np.save(buffer, array)
        seeds.append(buffer.getvalue())

    def check(data: bytes, choice: int) -> None:
        bounded(lambda: load_npy(data), (FormatError, CodecError))

    return Target(seeds, check)


@target
def petastorm_pickles(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    import pyarrow.parquet as pq

    from unihub.petastorm.legacy import PETASTORM_UNISCHEMA_KEY, load_petastorm_unischema

    seeds = [pq.read_metadata(FIXTURES / name / "_common_metadata").metadata[PETASTORM_UNISCHEMA_KEY]
             for name in ("unischema", "codecless", "pyspark_restore")]

    def check(data: bytes, choice: int) -> None:
        bounded(lambda: load_petastorm_unischema(data), (UnsafeMetadataError, PetastormMetadataError))

    return Target(seeds, check)


@target
def parquet_page_index(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    """The footer's offset-index locations and an OffsetIndex (store/page_index.py, random access by page), from
    a file pyarrow wrote with its page index: locations, or a FormatError naming the file and offset."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from unihub.store import page_index

    path = tmp_path / "seed.parquet"
    blobs = [bytes(range(n % 256)) * 3 for n in range(40)]
    pq.write_table(pa.table({"image": pa.array(blobs, pa.binary()), "id": pa.array(range(40), pa.int64())}), path,
                   row_group_size=20, compression="none", write_page_index=True, data_page_size=512,
                   write_batch_size=4)
    data = path.read_bytes()
    length = struct.unpack("<i", data[-8:-4])[0]
    footer_at = len(data) - 8 - length
    footer = data[footer_at:footer_at + length]
    offset, size = page_index.index_locations(footer, str(path), footer_at)[0][0] or (0, 0)

    def check(fuzzed: bytes, choice: int) -> None:
        if choice & 1:
            bounded(lambda: page_index.index_locations(fuzzed, "f", 3), (FormatError,))
        else:
            bounded(lambda: page_index.parse_offset_index(fuzzed, 1 + choice % 40, (0, len(data)), "f", 3),
                    (FormatError,))

    return Target([footer, data[offset:offset + size]], check)


def _images() -> Iterator[bytes]:
    from unihub.images.decoders import encode_image

    rgb = np.random.default_rng(0).integers(0, 255, (12, 10, 3), dtype=np.uint8)
    yield encode_image(rgb, "png")
    yield encode_image(rgb, "jpeg")
    yield encode_image(rgb[..., 0], "jpeg")
    yield encode_image(rgb[..., 0].astype(np.uint16) * 257, "png")


@target
def images(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    from unihub.images.decoders import decode_image, image_size

    def check(data: bytes, choice: int) -> None:
        size = bounded(lambda: image_size(data), (CodecError,))
        image = bounded(lambda: decode_image(data), (CodecError,))
        if image is not None and size is not None:
            assert image.shape[:2] == size[:2]

    return Target(list(_images()), check)


#: inputs that once broke a target, found by these runs: ``<target>/<what it is>.c<choice>.bin``, each checked on
#: every run (test_corpus)
CORPUS = Path(__file__).parent / "fixtures" / "fuzz_corpus"


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_quick(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """:data:`EXAMPLES` inputs, drawn (and a failure shrunk) by Hypothesis."""
    fuzzed = TARGETS[name](request, tmp_path)

    @FUZZ
    @given(mutated(fuzzed.seeds), st.integers(0, 63))
    def check(data: bytes, choice: int) -> None:
        fuzzed.check(data, choice)

    check()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TARGETS))
def test_deep(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """:data:`DEEP_EXAMPLES` inputs, seeded by (:data:`DEEP_SEED`, target): the same inputs on every run."""
    fuzzed = TARGETS[name](request, tmp_path)
    rng = random.Random(f"{DEEP_SEED}/{name}")
    for number in range(DEEP_EXAMPLES):
        data, choice = random_mutated(rng, fuzzed.seeds), rng.randrange(64)
        try:
            fuzzed.check(data, choice)
        except Exception as exc:
            kept = tmp_path / f"failing.c{choice}.bin"
            kept.write_bytes(data)
            raise AssertionError(f"{name}: input {number} of seed {DEEP_SEED} failed: {exc!r}; the input is {kept}: "
                                 f"fix the parser, then keep the input in {CORPUS / name}") from exc


@pytest.mark.parametrize("found", sorted(CORPUS.glob("*/*.bin")), ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_corpus(found: Path, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    choice = int(found.suffixes[-2].removeprefix(".c"))
    TARGETS[found.parent.name](request, tmp_path).check(found.read_bytes(), choice)


def test_mutations_reach_past_the_checksums(tmp_path: Path, tf_payloads: list[bytes], tar_files: list[bytes]) -> None:
    """The harness itself: re-framed records and re-summed tar headers read as valid, so mutations
    behind the checksums reach the parsers."""
    from unihub.formats.webdataset.tarstream import iter_members

    records = tmp_path / "framed.tfrecord"
    records.write_bytes(_framed(tf_payloads[:2]))
    from unihub.formats.tfrecord.records import iter_records

    assert [data for _, _, data in iter_records(str(records))] == tf_payloads[:2]
    original, renamed = tmp_path / "original.tar", tmp_path / "renamed.tar"
    original.write_bytes(tar_files[0])
    with tarfile.open(original) as tar:
        header = tar.getmembers()[0].offset_data - 512  # the first member's own header, after any PAX header
    altered = bytearray(tar_files[0])
    altered[header] = ord("t")  # its name: its checksum no longer holds ...
    renamed.write_bytes(_fix_tar_checksums(bytes(altered)))  # ... until it is summed again
    names = [m.name for m in iter_members(str(original))]
    assert [m.name for m in iter_members(str(renamed))] == ["t" + names[0][1:], *names[1:]]
