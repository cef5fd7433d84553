"""Single-pass TFRecord ingest: read once with the schema of a sample, end with the schema of every record.

``convert`` starts from ``provisional_schema()`` (the first PROVISIONAL_SAMPLE records), gathers
the statistics of every record while it writes, and then either restamps the footers (the
full schema stores data the same way) or converts again with the full schema (a record the
sample's schema cannot hold). Either way the dataset must equal a two-pass conversion's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from unihub import Unischema, open_dataset
from unihub.converters.convert import convert
from unihub.converters.verify import verify
from unihub.formats.tfrecord import format as tfr
from unihub.formats.tfrecord import records as tfio
from unihub.formats.tfrecord.example import encode_example, encode_feature
from unihub.images import decoders as images
from unihub.schema.unischema import SCHEMA_METADATA_KEY

SAMPLE = 10


@pytest.fixture(autouse=True)
def small_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tfr, "PROVISIONAL_SAMPLE", SAMPLE)


@pytest.fixture
def full_scans(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """The ``sample_records`` of every TFRecord schema scan in this process."""
    calls: list[int | None] = []
    original = tfr.TFRecordFormat.infer_schema

    def spy(self: Any, *, sample_records: int | None = None) -> Unischema:
        calls.append(sample_records)
        return original(self, sample_records=sample_records)

    monkeypatch.setattr(tfr.TFRecordFormat, "infer_schema", spy)
    return calls


def _jpeg(h: int, w: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return images.encode_image(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), "jpeg", 90)


def _write(directory: Path, rows: list[dict[str, tuple[str, Any]]], shards: int = 1) -> str:
    directory.mkdir()
    per = -(-len(rows) // shards)
    for s in range(shards):
        examples = [encode_example({k: encode_feature(kind, v) for k, (kind, v) in row.items()})
                    for row in rows[s * per:(s + 1) * per]]
        tfio.write_records(str(directory / f"part-{s:03d}.tfrecord"), examples)
    return str(directory / "*.tfrecord")


def _rows(n: int, late: dict[int, dict[str, tuple[str, Any]]] | None = None) -> list[dict[str, tuple[str, Any]]]:
    image = _jpeg(8, 6, 0)
    rows = [{"id": ("int64", [i]), "vec": ("float", [i * 0.5] * 4), "name": ("bytes", [f"n{i}".encode()]),
             "image": ("bytes", [image])} for i in range(n)]
    for i, change in (late or {}).items():
        rows[i] = {**rows[i], **change}
        rows[i] = {k: v for k, v in rows[i].items() if v is not None}
    return rows


def _check(src: str, dst: Path, workers: int) -> Unischema:
    """convert(src) equals the two-pass result: the full scan's schema in every footer, the same values."""
    full = tfr.TFRecordFormat(src).infer_schema()
    result = convert(src, dst, progress=False, workers=workers)
    store = open_dataset(dst)
    assert store.schema == full
    for f in store.files:
        assert Unischema.from_json(pq.read_metadata(f.path).metadata[SCHEMA_METADATA_KEY]) == full
    assert result.rows == store.num_rows
    report = verify(src, dst)
    assert report.equal, report.summary()
    return full


@pytest.mark.parametrize("workers", [1, 2])
def test_sample_that_fits_every_record_reads_once(tmp_path: Path, workers: int, full_scans: list) -> None:
    src = _write(tmp_path / "in", _rows(60), shards=3)
    schema = _check(src, tmp_path / "ds", workers)
    full_scans.clear()
    convert(src, tmp_path / "again", progress=False, workers=workers)
    assert full_scans == [SAMPLE]  # the sample only: no full scan before or after
    assert schema.vec.shape == (4,) and schema.image.shape == (8, 6, 3)


@pytest.mark.parametrize("workers", [1, 2])
def test_longer_list_after_the_sample_converts_again_with_the_full_schema(tmp_path: Path, workers: int,
                                                                            full_scans: list) -> None:
    src = _write(tmp_path / "in", _rows(60, {45: {"vec": ("float", [1.0] * 5)}}), shards=3)
    full_scans.clear()
    schema = _check(src, tmp_path / "ds", workers)
    assert schema.vec.shape == (None,)
    assert open_dataset(tmp_path / "ds").num_rows == 60


@pytest.mark.parametrize("workers", [1, 2])
def test_feature_missing_after_the_sample_becomes_nullable(tmp_path: Path, workers: int) -> None:
    src = _write(tmp_path / "in", _rows(40, {30: {"id": None}}), shards=2)
    assert _check(src, tmp_path / "ds", workers).id.nullable


@pytest.mark.parametrize("workers", [1, 2])
def test_feature_new_after_the_sample_is_added(tmp_path: Path, workers: int) -> None:
    src = _write(tmp_path / "in", _rows(40, {33: {"extra": ("int64", [7, 8])}}), shards=2)
    schema = _check(src, tmp_path / "ds", workers)
    assert schema.extra.nullable and schema.extra.shape == (2,)


def test_text_that_is_not_utf8_after_the_sample_becomes_binary(tmp_path: Path) -> None:
    src = _write(tmp_path / "in", _rows(30, {25: {"name": ("bytes", [b"\xff\xfe"])}}))
    assert _check(src, tmp_path / "ds", 1)["name"].numpy_dtype is np.bytes_


@pytest.mark.parametrize("workers", [1, 2])
def test_other_image_size_after_the_sample_only_restamps(tmp_path: Path, workers: int, full_scans: list) -> None:
    """Image bytes are stored as given, so a new size changes the schema, not the files: no second pass."""
    src = _write(tmp_path / "in", _rows(40, {36: {"image": ("bytes", [_jpeg(5, 6, 1)])}}), shards=2)
    full = tfr.TFRecordFormat(src).infer_schema()
    assert full.image.shape == (None, 6, 3)
    full_scans.clear()
    convert(src, tmp_path / "ds", progress=False, workers=workers)
    assert full_scans == [SAMPLE]
    assert open_dataset(tmp_path / "ds").schema == full
    assert verify(src, tmp_path / "ds").equal


def test_bad_records_are_still_skipped_and_reported_once(tmp_path: Path) -> None:
    directory = tmp_path / "in"
    src = _write(directory, _rows(30))
    path = directory / "part-000.tfrecord"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # the last record's data CRC no longer matches
    path.write_bytes(bytes(data))
    result = convert(src, tmp_path / "ds", progress=False, on_error="skip")
    assert result.rows == 29
    assert len(result.skipped) == 1 and "CRC" in result.skipped[0].reason
