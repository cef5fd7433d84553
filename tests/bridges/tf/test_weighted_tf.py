"""WeightedSamplingReader through the TensorFlow bridge: ``make_petastorm_dataset`` over row
and batch mixers (Petastorm's test_with_tf_data_api), ``make_tf_dataset`` given a mixer."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from unihub import UnihubError, WeightedSamplingReader, make_batch_reader, make_reader
from unihub.readers.weighted import draw_choices

from ...readers.test_weighted import A_IDS, B_IDS, UNISCHEMA, write

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
from unihub.bridges.tf.dataset import make_petastorm_dataset, make_tf_dataset  # noqa: E402


@pytest.fixture(scope="module")
def urls(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("weighted_tf")
    return write(root / "a", A_IDS), write(root / "b", B_IDS)


def mixer(urls: tuple[str, str], make: Any = make_reader, **options: Any) -> WeightedSamplingReader:
    readers = [make(u, seed=s, shuffle_rows=True, workers_count=2, schema_fields=["id", "vec"], **options)
               for s, u in enumerate(urls)]
    return WeightedSamplingReader(readers, [0.4, 0.6], seed=8)


def expected_rows(urls: tuple[str, str], make: Any = make_reader) -> list[int]:
    with mixer(urls, make) as m:
        return [i for item in m for i in np.atleast_1d(item.id).tolist()]


def test_make_petastorm_dataset_over_row_readers(urls):
    with mixer(urls) as m:
        rows = list(make_petastorm_dataset(m))
    assert [int(r.id) for r in rows] == expected_rows(urls)
    assert rows[0].vec.dtype == tf.float32 and rows[0].vec.shape == (3,)
    assert all(float(r.vec[0]) == float(r.id) for r in rows)


def test_make_petastorm_dataset_over_batch_readers(urls):
    with mixer(urls, make_batch_reader) as m:
        batches = list(make_petastorm_dataset(m))
    assert [i for b in batches for i in b.id.numpy().tolist()] == expected_rows(urls, make_batch_reader)
    assert all(len({int(i) >= 1000 for i in b.id}) == 1 for b in batches)  # each batch from one reader


def test_make_tf_dataset_given_a_mixer(urls):
    with mixer(urls) as m:
        batches = list(make_tf_dataset(m, batch_size=16))
    assert [b["vec"].shape[0] for b in batches[:-1]] == [16] * (len(batches) - 1)
    assert [i for b in batches for i in b["id"].numpy().tolist()] == expected_rows(urls)


def test_make_tf_dataset_refuses_reader_options_with_a_mixer(urls):
    with mixer(urls) as m:
        with pytest.raises(UnihubError, match="apply to a URL"):
            make_tf_dataset(m, batch_size=4, num_epochs=2)


def test_with_tf_data_api_over_petastorm_dataset():
    """Petastorm's test_with_tf_data_api on its own dataset: the second reader reads one shard (row
    groups 0 and 2: 40 rows), so the mix ends at the first draw of it after its 40th row."""
    fields = ["id", "label", "image_png"]
    readers = [make_reader(UNISCHEMA, schema_fields=fields, workers_count=1, num_epochs=None),
               make_reader(UNISCHEMA, schema_fields=fields, workers_count=1, cur_shard=0, shard_count=2)]
    with WeightedSamplingReader(readers, [0.5, 0.5], seed=42) as m:
        rows = list(make_petastorm_dataset(m))
    assert rows[0].image_png.shape == (32, 48, 3) and rows[0].image_png.dtype == tf.uint8
    ends_at = np.flatnonzero(draw_choices(42, [0.5, 0.5], 0, 1000) == 1)[40]  # the shard's 41st draw
    assert len(rows) == ends_at
