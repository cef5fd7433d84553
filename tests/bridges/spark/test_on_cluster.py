"""``materialize_dataset`` and ``make_spark_converter`` on a real standalone cluster (tests/spark_cluster.py):
executors on their own JVM and Python workers write and read the datasets."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unihub import dict_to_spark_row, make_reader, materialize_dataset

from ...conftest import make_row, make_schema
from ...spark_cluster import cluster_session, spark_home

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.skipif(spark_home() is None, reason="a Spark standalone cluster needs pyspark and java"),
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]


@pytest.fixture(scope="module")
def session(spark_cluster: Any) -> Iterator[Any]:
    spark = cluster_session(spark_cluster.master)
    yield spark
    spark.stop()


def test_materialize_dataset_on_the_cluster_reads_back_equal(session: Any, tmp_path: Path, value_equal: Any) -> None:
    schema, rows = make_schema(), [make_row(i) for i in range(40)]
    url = (tmp_path / "ds").as_uri()
    with materialize_dataset(session, url, schema, 0.01):
        rdd = session.sparkContext.parallelize(rows, 3).map(functools.partial(dict_to_spark_row, schema))
        session.createDataFrame(rdd, schema.as_spark_schema()).write.mode("overwrite").parquet(url)
    with make_reader(url, shuffle_row_groups=False, workers_count=1) as reader:
        found = {int(row.id): row._asdict() for row in reader}
    assert sorted(found) == list(range(40))
    for i, row in enumerate(rows):
        for name, value in row.items():
            value_equal(found[i][name], value, where=f"row {i} {name}")


def test_spark_converter_on_the_cluster_feeds_torch_and_tf(session: Any, tmp_path: Path) -> None:
    from unihub.bridges.spark.converter import SparkDatasetConverter, make_spark_converter

    session.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, (tmp_path / "cache").as_uri())
    df = session.createDataFrame([(i, i / 4, [float(i)] * 3) for i in range(30)], "id int, x double, v array<double>")
    converter = make_spark_converter(df.repartition(3))
    assert len(converter) == 30
    with converter.make_torch_dataloader(batch_size=8, num_epochs=1, workers_count=1) as loader:
        batches = list(loader)
    ids = np.concatenate([np.asarray(b["id"]) for b in batches])
    assert sorted(ids.tolist()) == list(range(30))
    np.testing.assert_array_equal(np.concatenate([np.asarray(b["x"]) for b in batches]), np.float32(ids / 4))
    pytest.importorskip("tensorflow")
    with converter.make_tf_dataset(batch_size=8, num_epochs=1, workers_count=1, shuffle_row_groups=False) as ds:
        tf_ids = np.concatenate([b.id.numpy() for b in ds])
    assert sorted(tf_ids.tolist()) == list(range(30))
    converter.delete()
    session.conf.unset(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)
