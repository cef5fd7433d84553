"""WebDataset ingest in a single pass: each shard read once, a schema that outgrows its sample, values
bit-exact against webdataset's own reader (shards written by webdataset's TarWriter)."""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from unihub import FormatError
from unihub.converters.convert import convert
from unihub.formats.webdataset import (
    blocks as webdataset_blocks,
)
from unihub.formats.webdataset import (
    format as webdataset,
)
from unihub.formats.webdataset import (
    tar as webdataset_tar,
)
from unihub.formats.webdataset import (
    tarstream,
)
from unihub.formats.webdataset.tarstream import TarMember
from unihub.images.decoders import encode_image
from unihub.store.dataset import open_dataset

from .wds_helpers import npy, tar_writer_shards, wds

SAMPLE = 8  # the provisional schema's sample, in samples (PROVISIONAL_SAMPLE is 1,000)


def jpeg(seed: int, size: int = 16) -> bytes:
    rng = np.random.default_rng(seed)
    return encode_image(rng.integers(0, 255, (size, size, 3), dtype=np.uint8), "jpeg", quality=90)


def samples(n: int, *, start: int = 0) -> list[dict[str, Any]]:
    return [{"__key__": f"{i:06d}", "jpg": jpeg(i), "cls": str(i % 7).encode(),
             "npy": npy(np.arange(16, dtype=np.float32) * i - 0.5)} for i in range(start, start + n)]


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[str, str]]:
    """Counts, per shard, the full reads (members one by one or in tables), the partial ones (the
    schema's sample) and the header peeks;
    a small sample, so that the test's few shards are more than the sample."""
    counted: Counter[tuple[str, str]] = Counter()
    real = webdataset_tar.iter_members

    def reading(read: Any) -> Any:
        """``read`` (members or tables of a shard), counted as a full or a partial read."""

        def counting(path: str, **kwargs: Any) -> Iterator[Any]:
            finished = False
            try:
                yield from read(path, **kwargs)
                finished = True
            finally:
                counted[(Path(path).name, "full" if finished else "partial")] += 1

        return counting

    def counting(path: str, **kwargs: Any) -> Iterator[TarMember]:
        if kwargs.get("globals_only"):
            data = sum(len(m.data) for m in real(path, **kwargs) if m.type != "g")
            counted[(Path(path).name, "peek")] += 1
            assert data == 0  # a peek reads no member
            yield from real(path, **kwargs)
            return
        yield from reading(real)(path, **kwargs)

    counting_tables = reading(webdataset_blocks.iter_tables)

    monkeypatch.setattr(webdataset_tar, "iter_members", counting)
    monkeypatch.setattr(tarstream, "_WINDOW", 16)  # tables of 8 KiB: the schema's sample ends inside the shard
    monkeypatch.setattr(webdataset_blocks, "iter_tables", counting_tables)
    monkeypatch.setattr(webdataset, "PROVISIONAL_SAMPLE", SAMPLE)
    return counted


def webdataset_rows(paths: list[Path]) -> list[dict[str, Any]]:
    """The samples as webdataset's own reader gives them (raw bytes)."""
    return list(wds.WebDataset([str(p) for p in paths], shardshuffle=False, empty_check=False))


def assert_same_as_webdataset(dataset: Path, paths: list[Path]) -> None:
    """Each value as webdataset reads the member: image bytes equal, the int text's number, the .npy's
    array bit for bit (dtype, shape, bytes)."""
    from unihub import make_reader

    expected = webdataset_rows(paths)
    with make_reader(str(dataset), shuffle_row_groups=False, decode_images=False, workers_count=1) as reader:
        found = [row._asdict() for row in reader]
    assert len(found) == len(expected)
    for row, sample in zip(found, expected):
        assert row["__key__"] == sample["__key__"]
        assert bytes(row["jpg"]) == sample["jpg"]
        assert row["cls"] == int(sample["cls"])
        array = np.load(io.BytesIO(sample["npy"]))
        value = np.asarray(row["npy"])
        assert (value.dtype, value.shape) == (array.dtype, array.shape)
        assert value.tobytes() == array.tobytes()


def test_each_shard_is_read_once(tmp_path: Path, reads: Counter[tuple[str, str]]) -> None:
    paths = tar_writer_shards(tmp_path / "in", samples(40), per_shard=10)
    result = convert(str(tmp_path / "in"), str(tmp_path / "out"), from_format="webdataset", progress=False)
    assert result.rows == 40
    names = [p.name for p in paths]
    assert {name: reads[(name, "full")] for name in names} == dict.fromkeys(names, 1)
    # the schema's sample: the first SAMPLE samples of the first shard, nothing of the others
    assert [reads[(name, "partial")] for name in names] == [1, 0, 0, 0]
    assert_same_as_webdataset(tmp_path / "out", paths)


def test_values_are_bit_exact_against_webdataset(tmp_path: Path) -> None:
    """A single pass over TarWriter shards (batches of many samples: the columnar path) gives every
    value back exactly as webdataset reads it."""
    paths = tar_writer_shards(tmp_path / "in", samples(300), per_shard=100)
    convert(str(tmp_path / "in"), str(tmp_path / "out"), from_format="webdataset", progress=False)
    schema = open_dataset(str(tmp_path / "out")).schema
    assert (schema["npy"].shape, schema["jpg"].shape, schema["cls"].nullable) == ((16,), (16, 16, 3), False)
    assert_same_as_webdataset(tmp_path / "out", paths)


def test_a_new_member_after_the_sample_converts_whole(tmp_path: Path, reads: Counter[tuple[str, str]]) -> None:
    """A member the sample never saw: the single pass starts over with the whole input's schema (the
    member a nullable field), and nothing is lost."""
    rows = samples(30)
    rows[25]["txt"] = b"late caption"
    paths = tar_writer_shards(tmp_path / "in", rows, per_shard=10)
    result = convert(str(tmp_path / "in"), str(tmp_path / "out"), from_format="webdataset", progress=False)
    assert result.rows == 30
    store = open_dataset(str(tmp_path / "out"))
    assert store.schema["txt"].nullable
    captions = pq.read_table(str(tmp_path / "out"), columns=["txt"]).column("txt").to_pylist()
    assert captions == [None] * 25 + ["late caption"] + [None] * 4
    assert_same_as_webdataset(tmp_path / "out", paths)


def test_a_longer_npy_after_the_sample_converts_whole(tmp_path: Path) -> None:
    """A later ``.npy`` of another length changes how the field is stored: the conversion starts over
    with the whole input's schema (a variable length) and every array comes back bit for bit."""
    rows = samples(30)
    longer = np.linspace(-1, 1, 20, dtype=np.float32)
    rows[27]["npy"] = npy(longer)
    tar_writer_shards(tmp_path / "in", rows, per_shard=10)
    webdataset.PROVISIONAL_SAMPLE, old = SAMPLE, webdataset.PROVISIONAL_SAMPLE
    try:
        convert(str(tmp_path / "in"), str(tmp_path / "out"), from_format="webdataset", progress=False)
    finally:
        webdataset.PROVISIONAL_SAMPLE = old
    store = open_dataset(str(tmp_path / "out"))
    assert store.schema["npy"].shape == (None,)
    from unihub import make_reader

    with make_reader(str(tmp_path / "out"), shuffle_row_groups=False, workers_count=1) as reader:
        arrays = [row.npy for row in reader]
    assert arrays[27].tobytes() == longer.tobytes()
    assert all(a.tobytes() == (np.arange(16, dtype=np.float32) * i - 0.5).tobytes()
               for i, a in enumerate(arrays) if i != 27)


def test_images_of_another_size_after_the_sample_restamp(tmp_path: Path, reads: Counter[tuple[str, str]]) -> None:
    """Images stored as bytes whatever their size: a later size only widens the schema's shape, which the
    footers get at the end (a restamp), still one read of each shard."""
    rows = samples(30)
    rows[29]["jpg"] = jpeg(99, size=24)
    paths = tar_writer_shards(tmp_path / "in", rows, per_shard=10)
    convert(str(tmp_path / "in"), str(tmp_path / "out"), from_format="webdataset", progress=False)
    assert open_dataset(str(tmp_path / "out")).schema["jpg"].shape == (None, None, 3)
    assert [reads[(p.name, "full")] for p in paths] == [1, 1, 1]
    assert_same_as_webdataset(tmp_path / "out", paths)


def test_mixed_npy_dtypes_after_the_sample_name_both(tmp_path: Path, reads: Counter[tuple[str, str]]) -> None:
    """What a whole scan refuses is refused the same way when it comes after the sample."""
    rows = samples(30)
    rows[28]["npy"] = npy(np.arange(16, dtype=np.float64))
    tar_writer_shards(tmp_path / "in", rows, per_shard=10)
    with pytest.raises(FormatError, match=r"'npy': \.npy members of different dtypes: float32 .* float64"):
        convert(str(tmp_path / "in"), str(tmp_path / "out"), from_format="webdataset", progress=False)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["in"]


def test_a_corrupt_image_after_the_sample_is_skipped_in_one_pass(tmp_path: Path,
                                                                  reads: Counter[tuple[str, str]]) -> None:
    """Bad input under the provisional schema is bad input, not a schema that outgrew its sample:
    --skip-corrupt reports it with shard and key, and the shards are still read once."""
    rows = samples(30)
    rows[22]["jpg"] = rows[22]["jpg"][:40]
    paths = tar_writer_shards(tmp_path / "in", rows, per_shard=10)
    result = convert(str(tmp_path / "in"), str(tmp_path / "out"), from_format="webdataset", progress=False,
                     on_error="skip")
    assert result.rows == 29
    assert [(Path(s.path).name, s.location) for s in result.skipped] == [(paths[2].name, "key 000022")]
    assert [reads[(p.name, "full")] for p in paths] == [1, 1, 1]
