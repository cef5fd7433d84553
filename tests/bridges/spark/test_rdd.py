"""``dataset_as_rdd`` on the local Spark session: Petastorm's fixture and a unihub dataset, decoded row by row.

The expected values of Petastorm's fixture are what Petastorm's own reader decoded
(``expected.npz``); its ``dataset_as_rdd`` gives the same values with a null as None.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import unihub
from unihub.bridges.spark.rdd import dataset_as_rdd
from unihub.errors import InvalidArgumentError, PetastormMetadataError

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning")
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "petastorm"
#: Petastorm decoded JPEG with OpenCV; unihub's decoder is bit-exact on this fixture, other builds may differ
JPEG_MAX_ABS_DIFF = 2


@pytest.mark.spark
def test_petastorm_dataset_rows_and_a_view(spark: Any) -> None:
    url = (FIXTURES / "unischema").as_uri()
    rdd = unihub.dataset_as_rdd(url, spark)
    assert rdd.getNumPartitions() == spark.sparkContext.defaultParallelism  # 3 small row groups, 2 cores
    rows = rdd.collect()
    with np.load(FIXTURES / "expected.npz") as data:
        expected = dict(data)
    assert len(rows) == 60 and sorted(int(r.id) for r in rows) == list(range(60))
    assert rows[0]._fields == tuple(unihub.get_schema_from_dataset_url(url).fields)
    for row in rows:
        for name, value in row._asdict().items():
            key = f"{int(row.id)}/{name}"
            want = expected[key]
            if expected.get(f"{key}.isnull", False) or (name == "score" and np.isnan(want)):
                assert value is None, key  # Petastorm's dataset_as_rdd: None, where its reader gives NaN
            elif want.dtype.kind == "U":
                assert type(value) is str and value == str(want), key
            elif name == "image_jpeg":
                assert value.dtype == want.dtype and value.shape == want.shape, key
                assert np.abs(value.astype(int) - want.astype(int)).max() <= JPEG_MAX_ABS_DIFF, key
            else:
                assert np.asarray(value).dtype == want.dtype and np.array_equal(value, want), key
    assert isinstance(rows[1].id, np.int64) and isinstance(rows[1].score, np.float64)

    schema = unihub.get_schema_from_dataset_url(url)
    view = dataset_as_rdd(url, spark, schema_fields=[schema.label, "id", "image_.*"], hdfs_driver="libhdfs")
    picked = sorted(view.map(lambda r: (int(r.id), int(r.label), r.image_png.shape, r._fields)).collect())
    # the view's order (create_schema_view, as Petastorm's dataset_as_rdd): the field given as a field first, then
    # what names and regexes select, in schema order
    assert picked == [(i, int(expected[f"{i}/label"]), (32, 48, 3), ("label", "id", "image_png", "image_jpeg"))
                      for i in range(60)]


@pytest.mark.spark
def test_unihub_dataset_rows_in_order(spark: Any, write_sample: Any, sample_row: Any, value_equal: Any) -> None:
    path, _ = write_sample(90, rows_per_file=30, row_group_size_mb=0.002, partition_by=["split"])
    groups = len(unihub.open_dataset(path).row_groups)
    assert groups > spark.sparkContext.defaultParallelism
    rows = dataset_as_rdd(str(path), spark.sparkContext).collect()
    with unihub.make_reader(path, schema_fields=["id"], shuffle_row_groups=False, workers_count=1) as reader:
        store_order = [int(r.id) for r in reader]
    assert [int(r.id) for r in rows] == store_order and sorted(store_order) == list(range(90))
    for row in rows:
        want = sample_row(int(row.id))
        for name, value in row._asdict().items():
            value_equal(value, want[name], where=f"{int(row.id)}/{name}")


def test_what_is_not_an_rdd_source(plain_parquet: Path) -> None:
    class NotSpark:
        sparkContext = object()

    with pytest.raises(InvalidArgumentError, match="SparkSession"):
        dataset_as_rdd(str(FIXTURES / "unischema"), NotSpark())
    with pytest.raises(PetastormMetadataError, match="add-schema"):
        dataset_as_rdd(str(plain_parquet), _FakeContext())
    with pytest.raises(InvalidArgumentError, match=r"\['id'\]"):
        dataset_as_rdd(str(FIXTURES / "unischema"), _FakeContext(), schema_fields="id")
    with pytest.raises(InvalidArgumentError, match="no field"):
        dataset_as_rdd(str(FIXTURES / "unischema"), _FakeContext(), schema_fields=[])


class _FakeContext:
    """Enough of a SparkContext to get past the argument checks."""

    defaultParallelism = 1

    def parallelize(self, *args: Any) -> None:
        raise AssertionError("not reached")
