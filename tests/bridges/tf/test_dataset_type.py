"""bridges/tf/dataset_type.py: the datasets of the TensorFlow bridge answer TF1's idioms, as the
``tf.compat.v1.data.Dataset`` Petastorm returned did (``make_one_shot_iterator``,
``make_initializable_iterator``, ``output_shapes``/``output_types``/``output_classes``, on the dataset
and on every dataset made from it), in a ``tf.Graph`` with ``tf.compat.v1.Session`` as Petastorm's own
tests use them, while keeping TF2's semantics and unihub's errors in eager code."""

from __future__ import annotations

import functools
import operator
import os
from typing import Any

import pytest

from unihub import in_lambda, make_batch_reader, make_reader
from unihub.errors import ValidationError

from .tf_expected import URL

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
from unihub.bridges.tf.dataset import make_petastorm_dataset, make_tf_dataset  # noqa: E402

ORDERED = {"workers_count": 1, "shuffle_row_groups": False}


def run_to_the_end(session: Any, next_element: Any) -> list[Any]:
    """Every element ``session.run`` gives until TensorFlow's OutOfRangeError ends the iteration."""
    elements = []
    with pytest.raises(tf.errors.OutOfRangeError):
        while True:
            elements.append(session.run(next_element))
    return elements


def one_id_reader(wanted: int) -> Any:
    return make_reader(URL["unischema"], schema_fields=["id"],
                       predicate=in_lambda(["id"], functools.partial(operator.eq, wanted)), **ORDERED)


def test_datasets_made_from_it_answer_tf1_idioms_in_a_graph() -> None:
    """Petastorm's test_some_processing_functions: prefetch, concatenate, map and batch, then a one-shot
    iterator run in a TF1 session (each step's dataset was TF2's own, without make_one_shot_iterator)."""
    with tf.Graph().as_default(), one_id_reader(1) as reader1, one_id_reader(2) as reader2:
        dataset = make_petastorm_dataset(reader1).prefetch(10).concatenate(make_petastorm_dataset(reader2)) \
            .map(lambda row: row.id).batch(2)
        assert dataset.output_types == tf.int64 and dataset.output_shapes.as_list() == [None]
        assert dataset.output_classes is tf.Tensor
        next_batch = dataset.make_one_shot_iterator().get_next()
        with tf.compat.v1.Session() as session:
            assert [batch.tolist() for batch in run_to_the_end(session, next_batch)] == [[1, 2]]


def test_initializable_iterator_and_output_properties_of_a_batch_reader() -> None:
    with tf.Graph().as_default(), make_batch_reader(URL["plain"], schema_fields=["id", "pair"], **ORDERED) as reader:
        dataset = make_petastorm_dataset(reader)
        assert dataset.output_shapes._asdict() == {"id": tf.TensorShape([None]), "pair": tf.TensorShape([None, None])}
        assert {name: t.name for name, t in dataset.output_types._asdict().items()} == {"id": "int64",
                                                                                       "pair": "float32"}
        iterator = dataset.make_initializable_iterator()
        next_batch = iterator.get_next()
        with tf.compat.v1.Session() as session:
            session.run(iterator.initializer)
            batches = run_to_the_end(session, next_batch)
    assert sorted(i for batch in batches for i in batch.id.tolist()) == list(range(600))
    assert all(batch.pair.shape == (len(batch.id), 2) for batch in batches)


def test_make_tf_dataset_in_a_graph_as_the_spark_converter_gives_it() -> None:
    """The Spark converter's ``make_tf_dataset()``: namedtuple batches, a one-shot iterator in a TF1 session."""
    with tf.Graph().as_default(), make_batch_reader(URL["plain"], schema_fields=["id"], **ORDERED) as reader:
        dataset = make_tf_dataset(reader, 256, structure="namedtuple")
        assert dataset.output_shapes.id.as_list() == [None]
        next_batch = dataset.make_one_shot_iterator().get_next()
        with tf.compat.v1.Session() as session:
            batches = run_to_the_end(session, next_batch)
    assert [len(b.id) for b in batches] == [256, 256, 88]
    assert sorted(i for b in batches for i in b.id.tolist()) == list(range(600))


def test_tf2_semantics_and_unihub_errors_are_kept_in_eager_code() -> None:
    """Still a TF2 dataset: a map keeps the cardinality Keras reads (TF1's map loses it); a one-shot
    iterator, as the dataset's own iterator, raises unihub's error, not TensorFlow's InvalidArgumentError."""
    dataset = make_tf_dataset(URL["plain"], 256, schema_fields=["id"], num_epochs=1)
    mapped = dataset.map(lambda batch: batch["id"]).prefetch(2)
    assert isinstance(mapped, tf.data.Dataset) and isinstance(mapped, tf.compat.v1.data.Dataset)
    assert int(dataset.cardinality()) == int(mapped.cardinality()) == 3
    assert sorted(int(i) for batch in mapped for i in batch) == list(range(600))
    assert sorted(int(i) for batch in iter(mapped.make_one_shot_iterator()) for i in batch) == list(range(600))
    with make_batch_reader(URL["codecless"], schema_fields=["id", "i32n"], workers_count=1) as reader, \
            pytest.raises(ValidationError, match=r"field 'i32n', row \d+ .*a null") as caught:
        iterator = make_petastorm_dataset(reader).make_one_shot_iterator()
        while True:
            iterator.get_next()
    assert not isinstance(caught.value, tf.errors.OpError)
