"""Datasets written by Petastorm 0.13.1 open as they are, and decode to what Petastorm decoded.

The fixture (tests/fixtures/petastorm, see its README) was written by Petastorm itself;
``expected.npz`` holds every value as Petastorm's own ``make_reader`` returned it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from unihub import (
    CompressedImageCodec,
    CompressedNdarrayCodec,
    NdarrayCodec,
    ScalarCodec,
    open_dataset,
)
from unihub.images import decoders as images

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm"
#: Petastorm decoded JPEG with OpenCV (libjpeg-turbo); unihub decodes with simplejpeg (also
#: libjpeg-turbo, same IDCT): measured bit-exact on this fixture (max diff 0); the tolerance allows other builds.
JPEG_MAX_ABS_DIFF = 2
JPEG_MEAN_ABS_DIFF = 0.1


def _decoded_rows(url: Path) -> dict[int, dict[str, object]]:
    """Every row as ``make_reader`` decodes it, by id."""
    from unihub import make_reader

    with make_reader(str(url), shuffle_row_groups=False, workers_count=1) as reader:
        return {int(row.id): row._asdict() for row in reader}


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "expected.npz") as data:
        return dict(data)


def test_schema_is_read_from_the_pickle_through_the_allow_list() -> None:
    store = open_dataset(FIXTURES / "unischema")
    assert store.schema_source == "petastorm"
    assert store.num_rows == 60 and len(store.files) == 3
    s = store.schema
    assert list(s.fields) == ["id", "split", "label", "score", "image_png", "image_jpeg", "gray",
                              "embedding", "boxes", "mask", "temps"]
    assert s.id.numpy_dtype is np.int64 and s.id.codec == ScalarCodec(pa.int64())
    assert s.split.numpy_dtype is np.str_ and s.split.codec == ScalarCodec(pa.string())
    assert s.label.codec == ScalarCodec(pa.int32())
    assert s.score.nullable and s.score.codec == ScalarCodec(pa.float64())
    assert s.image_png.shape == (32, 48, 3) and s.image_png.codec == CompressedImageCodec("png")
    assert s.image_jpeg.codec == CompressedImageCodec("jpeg", quality=90)
    assert s.gray.shape == (24, 24)
    assert s.embedding.codec == NdarrayCodec() and s.embedding.numpy_dtype is np.float32
    assert s.boxes.shape == (None, 4)
    assert s.mask.codec == CompressedNdarrayCodec() and s.mask.nullable
    assert s.temps.numpy_dtype is np.float16 and s.temps.shape == (None,) and s.temps.nullable


def test_every_value_decodes_equal_to_petastorm(expected: dict[str, np.ndarray]) -> None:
    rows = _decoded_rows(FIXTURES / "unischema")
    assert sorted(rows) == sorted({int(k.split("/")[0]) for k in expected})
    jpeg_diffs = []
    for row_id, row in rows.items():
        for name, value in row.items():
            key = f"{row_id}/{name}"
            if expected.get(f"{key}.isnull", False):
                assert value is None, key
                continue
            want = expected[key]
            if name == "score" and np.isnan(want):
                # a null float: NaN of the field's dtype, as Petastorm decodes it
                assert isinstance(value, np.float64) and np.isnan(value), key
                continue
            if name == "image_jpeg":
                assert value.shape == want.shape and value.dtype == want.dtype, key
                jpeg_diffs.append(np.abs(value.astype(int) - want.astype(int)))
                continue
            got = np.asarray(value)
            assert got.shape == want.shape, key
            if want.dtype.kind == "U":
                assert str(value) == str(want), key
            else:
                assert got.dtype == want.dtype, key
                assert np.array_equal(got, want), key
    diffs = np.stack(jpeg_diffs)
    assert diffs.max() <= JPEG_MAX_ABS_DIFF, (images.DECODER_NAME, diffs.max())
    assert diffs.mean() <= JPEG_MEAN_ABS_DIFF, (images.DECODER_NAME, diffs.mean())


def test_plain_spark_parquet_gets_an_inferred_schema() -> None:
    store = open_dataset(FIXTURES / "plain")
    assert store.schema_source == "inferred"
    assert store.num_rows == 600
    s = store.schema
    assert set(s.fields) == {"id", "label", "x", "name", "pair"}
    assert s.pair.shape == (None,) and s.pair.numpy_dtype is np.float32
    table = store.read_row_group(0)
    pairs = s.pair.codec.decode_column(s.pair, table.column("pair"))
    assert pairs[0].dtype == np.float32


def test_null_floats_read_as_petastorm_reads_them(tmp_path: Path) -> None:
    from unihub import Dataset, make_batch_reader, make_reader
    from unihub.converters.convert import convert
    from unihub.converters.verify import verify

    url = str(FIXTURES / "unischema")
    with make_batch_reader(url, schema_fields=["id", "score"], shuffle_row_groups=False) as reader:
        batches = list(reader)
    scores = np.concatenate([b.score for b in batches])
    ids = np.concatenate([b.id for b in batches])
    assert scores.dtype == np.float64 and np.isnan(scores[ids % 5 == 0]).all() and not np.isnan(scores[ids % 5 != 0]).any()
    assert np.isnan(Dataset(url).take([0]).score[0])
    with make_reader(url, schema_fields=["id", "score"], petastorm_types=False, workers_count=1) as reader:
        assert all((r.score is None) == (r.id % 5 == 0) for r in reader)
    # a conversion keeps the nulls as nulls, not NaN
    convert(url, tmp_path / "copy")
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "copy", columns=["id", "score"])
    assert table.column("score").null_count == 12 and not np.isnan(table.column("score").drop_null().to_numpy()).any()
    assert verify(url, tmp_path / "copy").equal
    # unihub's own datasets keep None; petastorm_types=True reads them the Petastorm way
    with make_reader(str(tmp_path / "copy"), schema_fields=["id", "score"], workers_count=1) as reader:
        assert all((r.score is None) == (r.id % 5 == 0) for r in reader)
    with make_reader(str(tmp_path / "copy"), schema_fields=["id", "score"], workers_count=1,
                     petastorm_types=True) as reader:
        assert all(np.isnan(r.score) == (r.id % 5 == 0) for r in reader)
