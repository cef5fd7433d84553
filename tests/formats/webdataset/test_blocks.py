"""WebDataset samples in blocks (``formats/webdataset/blocks.py``) are exactly the samples of the member
by member grouper (``iter_samples``): the same samples, keys, offsets, positions and bytes, the same
error at the same offset, the same skips; on webdataset's TarWriter shards and on tarfile archives
with every hazard a shard meets (random ones and ones hypothesis draws), whole and damaged, with
windows small enough that samples straddle them. And the columnar path is really taken on plain shards."""

from __future__ import annotations

import io
import random
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from unihub.errors import FormatError
from unihub.formats.base import SkippedRecord
from unihub.formats.webdataset import tarstream
from unihub.formats.webdataset.blocks import SampleBlock, iter_blocks
from unihub.formats.webdataset.tar import Sample, iter_samples
from unihub.schema.arrow_numpy import binary_array, numbers_array, string_array

from .test_tarstream_fast import DAMAGES, damaged_as, damaged_copies, webdataset_shard

DEFAULT_WINDOW = tarstream._WINDOW
Outcome = tuple[list[tuple[Any, ...]], tuple[Any, ...] | None, list[SkippedRecord]]


def _row(sample: Sample) -> tuple[Any, ...]:
    return sample.url, sample.key, sample.offset, sample.index, sorted(sample.members.items())


def _outcome(read: Any, path: Path, **options: Any) -> Outcome:
    skipped: list[SkippedRecord] = []
    rows: list[tuple[Any, ...]] = []
    try:
        for item in read(str(path), skipped=skipped, **options):
            rows.extend(_row(s) for s in (item.samples() if isinstance(item, SampleBlock) else [item]))
    except FormatError as exc:
        return rows, (str(exc), exc.offset), skipped
    return rows, None, skipped


def blocks_and_samples(path: Path, **options: Any) -> tuple[Outcome, Outcome]:
    return _outcome(iter_blocks, path, **options), _outcome(iter_samples, path, **options)


@pytest.fixture(params=[2, 3, 7, 64, DEFAULT_WINDOW], ids=lambda w: f"window{w}")
def window(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(tarstream, "_WINDOW", request.param)
    return request.param


def _add(tar: tarfile.TarFile, name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mtime = kind, 1_700_000_000.5  # a float: a PAX header in PAX format
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if info.size else None)


def hazardous_shard(path: Path, rng: random.Random, samples: int) -> Path:
    """Samples of one usual layout (``jpg``, ``cls``, ``npy``), now and then one of what a shard may hold
    besides: a member missing or extra, a key again later, an extension twice, upper-case extensions,
    metadata and directory members, names without a key, in a directory, not ASCII, a PAX global
    header, a link."""
    fmt = rng.choice([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
    with tarfile.open(path, "w", format=fmt) as tar:
        for i in range(samples):
            key = f"{i:06d}"
            members = [("jpg", bytes([i % 256]) * rng.choice([0, 1, 300, 511, 512, 513, 2000])), ("cls", b"%d" % i),
                       ("npy", bytes(rng.getrandbits(8) for _ in range(40)))]
            roll = rng.random()
            if roll < 0.03:
                members.pop(rng.randrange(3))
            elif roll < 0.05:
                members.append(("txt", b"extra"))
            elif roll < 0.06:
                key = f"{max(0, i - 3):06d}"  # a key seen before, with others between
            elif roll < 0.07:
                members.append(("cls", b"7"))
            elif roll < 0.08:
                members = [(e.upper(), d) for e, d in members]
            elif roll < 0.09:
                _add(tar, "__meta__", b"{}")
            elif roll < 0.10:
                _add(tar, f"dir{i}", kind=tarfile.DIRTYPE)
            elif roll < 0.11:
                _add(tar, f"nokey{i}", b"x")
            elif roll < 0.12:
                key = f"sub/{key}"
            elif roll < 0.13 and fmt != tarfile.USTAR_FORMAT:
                key = f"ünï{i}"
            elif roll < 0.14 and fmt == tarfile.PAX_FORMAT:
                info = tarfile.TarInfo("global")
                info.type = tarfile.XGLTYPE
                info.pax_headers = {"comment": "hello"}
                tar.addfile(info)
            elif roll < 0.15:
                info = tarfile.TarInfo(f"{key}.lnk")
                info.type, info.linkname = tarfile.SYMTYPE, "x"
                tar.addfile(info)
            for extension, data in members:
                _add(tar, f"{key}.{extension}", data)
    return path


@pytest.mark.parametrize("seed", range(8))
def test_hazardous_shards_read_alike(tmp_path: Path, window: int, seed: int) -> None:
    rng = random.Random(seed)
    path = hazardous_shard(tmp_path / "h.tar", rng, rng.choice([1, 3, 30, 200]))
    for group_keys in (False, True):
        for on_error in ("raise", "skip"):
            blocks, samples = blocks_and_samples(path, group_keys=group_keys, on_error=on_error)
            assert blocks == samples, (group_keys, on_error)


@pytest.mark.parametrize("seed", range(4))
def test_damaged_shards_read_alike(tmp_path: Path, window: int, seed: int) -> None:
    rng = random.Random(50 + seed)
    source = hazardous_shard(tmp_path / "h.tar", rng, 40) if seed % 2 else webdataset_shard(tmp_path / "w.tar", 60)
    failures = 0
    for case, path in damaged_copies(source, rng, 40):
        for on_error in ("raise", "skip"):
            blocks, samples = blocks_and_samples(path, on_error=on_error)
            assert blocks == samples, f"case {case}, {on_error}"
            failures += samples[1] is not None
    assert failures > 10  # the damage reached the parser


def test_tar_writer_shards_go_out_as_columns(tmp_path: Path, window: int) -> None:
    path = webdataset_shard(tmp_path / "w.tar", 300)
    blocks = list(iter_blocks(str(path)))
    blocks_again, samples = blocks_and_samples(path)
    assert blocks_again == samples and samples[1] is None and len(samples[0]) == 300
    columnar = sum(len(b) for b in blocks if b.columns is not None)
    if window == 64:  # ~5 samples a window: all but the one straddling each window
        assert columnar >= 200
    if window == DEFAULT_WINDOW:  # one window: all but the last sample, which only the shard's end completes
        assert columnar == 299
    for block in blocks:
        if block.columns is not None:
            assert sorted(block.columns) == ["cls", "jpg", "npy"]
            assert all(array.type == pa.binary() and len(array) == len(block) for array in block.columns.values())
    assert [i for b in blocks for i in b.indexes] == list(range(300))


def test_a_compressed_shard_reads_as_samples(tmp_path: Path) -> None:
    plain = webdataset_shard(tmp_path / "w.tar", 20)
    packed = tmp_path / "w.tar.gz"
    with tarfile.open(plain) as source, tarfile.open(packed, "w:gz") as target:
        for member in source:
            target.addfile(member, source.extractfile(member))
    blocks, samples = blocks_and_samples(packed)
    assert blocks == samples and len(samples[0]) == 20
    assert all(b.columns is None for b in iter_blocks(str(packed)))


def test_slices_and_concatenation_keep_every_sample(tmp_path: Path, window: int) -> None:
    rng = random.Random(3)
    path = hazardous_shard(tmp_path / "h.tar", rng, 120)
    blocks = list(iter_blocks(str(path), on_error="skip", skipped=[]))
    expected = [_row(s) for b in blocks for s in b.samples()]
    pieces = [b.slice(start, min(len(b), start + 5)) for b in blocks for start in range(0, len(b), 5)]
    joined = SampleBlock.concat(pieces)
    assert [_row(s) for s in joined.samples()] == expected
    assert joined.sample_bytes() == [sum(map(len, s.members.values())) for s in joined.samples()]
    uniform = [b for b in iter_blocks(str(webdataset_shard(tmp_path / "w.tar", 80)))]
    together = SampleBlock.concat(uniform)
    if window >= 64:  # windows hold whole samples: member-by-member samples of one layout join the columns
        assert any(b.columns is None for b in uniform) and together.columns is not None
    assert [_row(s) for s in together.samples()] == [_row(s) for b in uniform for s in b.samples()]


def test_arrays_built_without_pyarrow_conversion_equal_its_own() -> None:
    values = [b"", b"a", bytes(range(256)), b"\0\0"]
    assert binary_array(values).equals(pa.array(values, pa.binary()))
    assert binary_array([memoryview(v) for v in values]).equals(pa.array(values, pa.binary()))
    assert string_array(["", "ké", "x" * 1000]).equals(pa.array(["", "ké", "x" * 1000], pa.string()))
    numbers = np.arange(10, dtype=np.float32)[::2]
    assert numbers_array(numbers, pa.float32()).equals(pa.array(numbers, pa.float32()))  # type: ignore[union-attr]
    assert numbers_array(numbers, pa.float64()) is None
    assert numbers_array(numbers.astype(">f4"), pa.float32()) is None


@pytest.mark.parametrize("second", ["cls", "CLS"])
def test_every_sample_with_an_extension_twice_is_refused_alike(tmp_path: Path, second: str) -> None:
    """One layout in every sample, but with two members of one extension: the grouper's error, not a
    column of either."""
    path = tmp_path / "twice.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(20):
            _add(tar, f"{i:04d}.cls", b"1")
            _add(tar, f"{i:04d}.{second}", b"2")
    for on_error in ("raise", "skip"):
        blocks, samples = blocks_and_samples(path, on_error=on_error)
        assert blocks == samples
    rows, error, skips = samples  # on_error='skip': one report a sample, each sample with its first .cls
    assert error is None and len(skips) == 20 and all("already has a .cls member" in s.reason for s in skips)
    assert [dict(r[4]) for r in rows] == [{"cls": b"1"}] * 20


@pytest.mark.parametrize("batch_size", [1, 7, 256])
def test_batches_hold_at_most_batch_size_rows_in_order(tmp_path: Path, batch_size: int) -> None:
    """Columns are made several batches at a time, then cut: every batch still at most ``batch_size``."""
    from unihub.formats.webdataset.format import WebDatasetFormat

    path = webdataset_shard(tmp_path / "w.tar", 700)  # several windows, straddling samples included
    source = WebDatasetFormat(str(path))
    schema = source.infer_schema()
    batches = list(source.read_batches(schema, batch_size=batch_size))
    assert all(0 < len(b["__key__"]) <= batch_size for b in batches)
    keys = [k for b in batches for k in b["__key__"].to_pylist()]
    assert keys == [f"{i:06d}" for i in range(700)]
    images = [bytes(v) for b in batches for v in b["jpg"].to_pylist()]
    assert images == [bytes([i % 256]) * (700 + i % 900) for i in range(700)]
    assert [int(v) for b in batches for v in b["cls"]] == [i % 10 for i in range(700)]
    assert source.report.records == 700


_HAZARDS = ("none", "none", "none", "member missing", "member extra", "key again", "extension twice", "capitals",
            "metadata", "directory", "no key", "in a folder", "non-ascii key", "global header", "link")


def _drawn_shard(fmt: int, samples: list[tuple[str, int]]) -> bytes:
    """A shard of ``samples`` (hazard, jpg size) in the usual layout (``jpg``, ``cls``, ``npy``), each with
    its hazard (see :func:`hazardous_shard`); hazards ``fmt`` cannot write are left out."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for i, (hazard, size) in enumerate(samples):
            key = {"key again": f"{max(0, i - 2):06d}", "in a folder": f"sub/{i:06d}",
                   "non-ascii key": f"ünï{i}" if fmt != tarfile.USTAR_FORMAT else f"{i:06d}"}.get(hazard, f"{i:06d}")
            members = [("jpg", bytes([i % 256]) * size), ("cls", b"%d" % i), ("npy", bytes(range(40)))]
            members = {"member missing": members[1:], "member extra": [*members, ("txt", b"extra")],
                       "extension twice": [*members, ("cls", b"7")],
                       "capitals": [(e.upper(), d) for e, d in members]}.get(hazard, members)
            if hazard == "metadata":
                _add(tar, "__meta__", b"{}")
            elif hazard == "directory":
                _add(tar, f"dir{i}", kind=tarfile.DIRTYPE)
            elif hazard == "no key":
                _add(tar, f"nokey{i}", b"x")
            elif hazard == "global header" and fmt == tarfile.PAX_FORMAT:
                info = tarfile.TarInfo("global")
                info.type, info.pax_headers = tarfile.XGLTYPE, {"comment": "hello"}
                tar.addfile(info)
            elif hazard == "link":
                info = tarfile.TarInfo(f"{key}.lnk")
                info.type, info.linkname = tarfile.SYMTYPE, "x"
                tar.addfile(info)
            for extension, data in members:
                _add(tar, f"{key}.{extension}", data)
    return buffer.getvalue()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT]),
       samples=st.lists(st.tuples(st.sampled_from(_HAZARDS), st.sampled_from([0, 1, 300, 511, 512, 513, 2000])),
                        min_size=1, max_size=30),
       damage=st.one_of(st.none(), st.none(), DAMAGES), window=st.sampled_from([2, 3, 7, 64]),
       group_keys=st.booleans(), on_error=st.sampled_from(["raise", "skip"]))
# found by this test: a window ending on whole samples and then a member the grouper refuses (no key, or a key seen
# before) sent the last sample out before the error, where the grouper (still holding it open) raised first
@example(fmt=tarfile.GNU_FORMAT, samples=[("none", 0), ("no key", 0)], damage=None, window=7, group_keys=False,
         on_error="raise")
@example(fmt=tarfile.GNU_FORMAT, samples=[("none", 0), ("no key", 0)], damage=None, window=7, group_keys=False,
         on_error="skip")
@example(fmt=tarfile.GNU_FORMAT, samples=[("none", 0), ("metadata", 0), ("key again", 0)], damage=None, window=7,
         group_keys=False, on_error="raise")
def test_blocks_and_samples_alike_on_drawn_shards(tmp_path: Path, fmt: int, samples: list[tuple[str, int]],
                                                  damage: tuple[Any, ...] | None, window: int, group_keys: bool,
                                                  on_error: str) -> None:
    """The columnar blocks and the member-by-member grouper: the same samples, errors and skips on shards
    hypothesis draws (hazards, damage, windows that samples straddle)."""
    path = tmp_path / "drawn.tar"
    path.write_bytes(damaged_as(_drawn_shard(fmt, samples), damage))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tarstream, "_WINDOW", window)
        blocks, samples_read = blocks_and_samples(path, group_keys=group_keys, on_error=on_error)
    assert blocks == samples_read
