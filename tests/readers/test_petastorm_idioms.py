"""Petastorm's public-API idioms, on datasets real Petastorm 0.13.1 wrote (``fixtures/petastorm``):
code written for Petastorm runs unchanged, and misuse raises the built-in exceptions Petastorm users
catch (``ValueError``, ``RuntimeError``) as unihub errors."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from unihub import (
    CodecError,
    UnihubError,
    Unischema,
    make_batch_reader,
    make_reader,
)
from unihub.errors import NoDataAvailableError, UsageError
from unihub.readers.predicates import PredicateBase

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm"
WITH_SCHEMA = FIXTURES / "unischema"  # 60 rows in 3 row groups, Petastorm's Unischema
PLAIN = FIXTURES / "plain"  # 600 rows in 2 row groups, Spark's Parquet without a Unischema


class EvenIds(PredicateBase):
    """As Petastorm's users wrote them: get_fields() returns a list, not a set."""

    def get_fields(self) -> list[str]:
        return ["id"]

    def do_include(self, values: dict[str, Any]) -> bool:
        return values["id"] % 2 == 0


def ids(reader: Any) -> list[int]:
    return sorted(int(i) for item in reader for i in np.atleast_1d(item.id))


def test_a_predicate_whose_fields_are_a_list() -> None:
    with make_reader(WITH_SCHEMA, predicate=EvenIds(), workers_count=1) as reader:
        assert ids(reader) == list(range(0, 60, 2))
    with make_batch_reader(PLAIN, predicate=EvenIds(), workers_count=1) as reader:
        assert ids(reader) == list(range(0, 600, 2))


def test_batch_reader_arguments_and_a_list_of_file_urls() -> None:
    files = [f"file://{f}" for f in sorted(PLAIN.glob("*.parquet"))]
    with make_batch_reader(files, convert_early_to_numpy=True, workers_count=1) as reader:
        assert ids(reader) == list(range(600))
    with make_batch_reader(files[:1], workers_count=1) as reader:
        assert 0 < len(ids(reader)) < 600


def test_from_arrow_schema_of_a_parquet_dataset() -> None:
    schema = Unischema.from_arrow_schema(pq.ParquetDataset(str(PLAIN)))
    with make_batch_reader(PLAIN) as reader:
        assert list(schema.fields) == list(reader.schema.fields)
        assert [f.numpy_dtype for f in schema] == [f.numpy_dtype for f in reader.schema]


def test_the_torch_loader_takes_a_batch_reader() -> None:
    from unihub.bridges.torch import DataLoader

    with DataLoader(make_batch_reader(PLAIN, shuffle_row_groups=False, workers_count=1), batch_size=64) as loader:
        batches = list(loader)
    assert [len(b["id"]) for b in batches] == [64] * 9 + [24]
    in_files = [i for f in sorted(PLAIN.glob("*.parquet")) for i in pq.read_table(f, columns=["id"])["id"].to_pylist()]
    assert [i for b in batches for i in b["id"].tolist()] == in_files


def test_reader_cache_and_cleanup(tmp_path: Path) -> None:
    location = tmp_path / "cache"
    with make_reader(WITH_SCHEMA, cache_type="local-disk", cache_location=str(location), cache_size_limit=2**30,
                     cache_row_size_estimate=1000, workers_count=1, schema_fields=["id", "embedding"]) as reader:
        assert ids(reader) == list(range(60))
        assert reader.cache is not None and any(location.iterdir())
    assert not location.exists()  # Petastorm's default: the cache goes with the reader


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_epochs=-10), "num_epochs"),
    (dict(cur_shard="0", shard_count=2), "cur_shard"),
    (dict(cur_shard=0, shard_count=0), "shard_count"),
    (dict(workers_count=0), "workers_count"),
    (dict(workers_count=2.5), "workers_count"),
    (dict(reader_pool_type="gpu"), "reader_pool_type"),
    (dict(results_queue_size=0), "results_queue_size"),
])
def test_bad_arguments_are_value_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        make_reader(WITH_SCHEMA, **kwargs)
    assert isinstance(info.value, UnihubError)


def test_no_dataset_url_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="dataset_url"):
        make_reader(None)


def test_more_shards_than_row_groups_is_no_data_available() -> None:
    with pytest.raises(NoDataAvailableError, match="4 shards of 3 row groups"):
        make_reader(WITH_SCHEMA, cur_shard=3, shard_count=4)
    every: list[int] = []
    for shard in range(3):  # as many shards as row groups: each its own, none repeated
        with make_reader(WITH_SCHEMA, cur_shard=shard, shard_count=3, schema_fields=["id"]) as reader:
            every += ids(reader)
    assert sorted(every) == list(range(60))


def test_misuse_is_a_runtime_error() -> None:
    from unihub.bridges.torch import DataLoader

    reader = make_reader(WITH_SCHEMA, schema_fields=["id"], workers_count=1)
    next(reader)
    reader.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        next(reader)
    reader.join()
    with DataLoader(make_reader(WITH_SCHEMA, schema_fields=["id"], workers_count=1), batch_size=4) as loader:
        first = iter(loader)
        next(first)
        with pytest.raises(UsageError):
            next(iter(loader))  # a second loop while the first is running


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_eight_threads_share_a_reader(pool: str) -> None:
    reader = make_reader(WITH_SCHEMA, reader_pool_type=pool, workers_count=2, num_epochs=3,
                         schema_fields=["id", "image_png"])
    taken: list[int] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            for row in reader:
                assert row.image_png.shape == (32, 48, 3)
                with lock:
                    taken.append(int(row.id))
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=consume, daemon=True) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    reader.stop()
    reader.join()
    assert not errors
    assert sorted(taken) == sorted(list(range(60)) * 3)


def test_codecs_refuse_values_that_do_not_fit_the_field() -> None:
    with make_reader(WITH_SCHEMA) as reader:
        ident, image = reader.schema.fields["id"], reader.schema.fields["image_png"]
    with pytest.raises(CodecError, match="Expected a scalar"):
        ident.codec.encode(ident, [1, 2])
    with pytest.raises(TypeError, match="Expected a scalar"):
        ident.codec.encode(ident, np.array([1]))
    with pytest.raises(CodecError, match=r"Unexpected dimensions.*expected an image of shape \(32, 48, 3\)"):
        image.codec.encode(image, np.zeros((16, 48, 3), np.uint8))
    assert image.codec.encode(image, np.zeros((32, 48, 3), np.uint8))[:4] == b"\x89PNG"
