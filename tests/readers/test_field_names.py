"""Field names that are not identifiers, or that clash once cleaned (``a/b`` beside ``a_b``): every
reader and bridge keeps each field's values under its own name, never another field's."""

from __future__ import annotations

from typing import Any

import pytest

from unihub import make_batch_reader, make_reader
from unihub.converters.convert import convert

tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("names")

    def feature(value: int) -> Any:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    with tf.io.TFRecordWriter(str(root / "x.tfrecord")) as writer:
        for i in range(6):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "a/b": feature(i), "a_b": feature(100 + i), "class": feature(200 + i), "__key__": feature(300 + i),
            })).SerializeToString())
    convert(root / "x.tfrecord", root / "ds")
    return str(root / "ds")


EXPECTED = {"__key__": 300, "a/b": 0, "a_b": 100, "class": 200}


def test_rows_give_every_field_its_own_attribute(dataset: str) -> None:
    with make_reader(dataset, shuffle_row_groups=False) as reader:
        row = next(iter(reader))
    assert row.a_b == 100 and row.a_b_2 == 0 and row.class_ == 200 and row.key == 300
    assert row._asdict() == EXPECTED


@pytest.mark.parametrize("selected", [["a/b"], ["a_b_2"]])
def test_schema_fields_takes_the_name_or_the_attribute(dataset: str, selected: list[str]) -> None:
    with make_reader(dataset, schema_fields=selected, shuffle_row_groups=False) as reader:
        assert [r._asdict() for r in reader][:2] == [{"a/b": 0}, {"a/b": 1}]
    with make_batch_reader(dataset, schema_fields=selected + ["a_b"], shuffle_row_groups=False) as reader:
        batch = next(iter(reader))
    assert batch._asdict()["a/b"].tolist() == list(range(6)) and batch.a_b.tolist() == list(range(100, 106))


def test_torch_loaders_key_dicts_by_field_name(dataset: str) -> None:
    from unihub.bridges.torch import BatchedDataLoader, DataLoader

    with DataLoader(make_reader(dataset, shuffle_row_groups=False), batch_size=6) as loader:
        batch = next(iter(loader))
    assert {k: int(v[0]) for k, v in batch.items()} == EXPECTED
    with BatchedDataLoader(make_batch_reader(dataset, shuffle_row_groups=False), batch_size=6) as loader:
        batch = next(iter(loader))
    assert {k: int(v[0]) for k, v in batch.items()} == EXPECTED


def test_make_tf_dataset_keys_by_field_name(dataset: str) -> None:
    from unihub import make_tf_dataset

    batch = next(iter(make_tf_dataset(dataset, 6, workers_count=1)))
    assert {k: int(v[0]) for k, v in batch.items()} == EXPECTED
    rows = make_tf_dataset(dataset, 6, workers_count=1, structure="namedtuple")
    assert int(next(iter(rows)).a_b_2[0]) == 0


def test_an_attribute_means_one_field_whatever_is_selected(tmp_path_factory: pytest.TempPathFactory) -> None:
    import numpy as np
    import pyarrow as pa

    from unihub import ScalarCodec, Unischema, UnischemaField, write_dataset

    schema = Unischema("S", [UnischemaField(n, np.int64, (), ScalarCodec(pa.int64()), False)
                             for n in ("a/b", "a_b", "a.b")])
    url = str(tmp_path_factory.mktemp("views") / "ds")
    write_dataset(url, schema, [{"a/b": 100, "a_b": 200, "a.b": 0}])
    for selected in (None, ["a/b"], ["a_b_2"], ["a.b"], ["a_b", "a.b"], ["a.b", "a/b"]):
        with make_reader(url, schema_fields=selected, workers_count=1) as reader:
            row = next(iter(reader))
        values = {"a_b_2": 100, "a_b": 200, "a_b_3": 0}
        assert all(getattr(row, attribute) == values[attribute] for attribute in row._fields), (selected, row)
