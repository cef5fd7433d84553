"""tf_tensors (bridges/tf/graph.py): Petastorm's TF1 graph-mode tensors, checked against what real
Petastorm 0.13.1 gave on the same fixtures (``tf_expected.pkl``) and against the unihub reader."""

from __future__ import annotations

import os
from typing import Any

import pytest

from unihub import NGram, make_batch_reader, make_reader, write_dataset
from unihub.errors import InvalidArgumentError, SchemaError, UsageError

from .test_dataset import STRINGS, string_row
from .tf_expected import NGRAM_FIELDS, ROW_FIELDS, STRING_FIELDS, URL, petastorm_expected, structure, value

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
from unihub.bridges.tf.graph import RANDOM_SHUFFLING_QUEUE_SIZE, tf_tensors  # noqa: E402

ORDERED = {"workers_count": 1, "shuffle_row_groups": False}


def run_all(make: Any, **options: Any) -> tuple[Any, list[Any], str]:
    """tf_tensors in a graph, run to the end: (the tensors, every sample, the error that ended it)."""
    with tf.Graph().as_default(), make() as reader:
        tensors = tf_tensors(reader, **options)
        samples = []
        with tf.compat.v1.Session() as session:
            coord = tf.compat.v1.train.Coordinator()
            threads = tf.compat.v1.train.start_queue_runners(session, coord=coord)
            try:
                while True:
                    samples.append(session.run(tensors))
            except tf.errors.OutOfRangeError as exc:
                end = type(exc).__name__
            coord.request_stop()
            coord.join(threads)
    return tensors, samples, end


def as_values(sample: Any) -> Any:
    if isinstance(sample, dict):
        return {k: as_values(t) for k, t in sample.items()}
    return {f: value(v) for f, v in sample._asdict().items()}


def test_rows_match_petastorm() -> None:
    expected = petastorm_expected()["tf_tensors_rows"]
    tensors, samples, end = run_all(lambda: make_reader(URL["unischema"], schema_fields=ROW_FIELDS, **ORDERED))
    assert structure(tensors) == expected["structure"][None]
    assert tuple(tensors.boxes.shape.as_list()) == (None, 4) and tensors.split.dtype == tf.string
    assert (len(samples), end) == (expected["total"], expected["end"]) == (60, "OutOfRangeError")
    got = [as_values(s) for s in samples]
    assert got[:5] == expected["samples"]
    with make_reader(URL["unischema"], schema_fields=ROW_FIELDS, **ORDERED) as reader:  # the reader's own rows
        assert got == [as_values(r) for r in reader]


def test_ngram_windows_match_petastorm() -> None:
    expected = petastorm_expected()["tf_tensors_ngram"]
    ngram = NGram(NGRAM_FIELDS, delta_threshold=1, timestamp_field="id")
    tensors, samples, end = run_all(lambda: make_reader(URL["unischema"], schema_fields=ngram, **ORDERED))
    assert {k: structure(t) for k, t in tensors.items()} == expected["structure"]
    assert list(tensors) == [-1, 0, 1] and tensors[0] == ()
    assert (len(samples), end) == (expected["total"], expected["end"]) == (54, "OutOfRangeError")
    assert [as_values(s) for s in samples[:5]] == expected["samples"]


def test_batch_reader_matches_petastorm() -> None:
    expected = petastorm_expected()["tf_tensors_batch"]
    tensors, samples, end = run_all(lambda: make_batch_reader(URL["plain"], **ORDERED))
    assert structure(tensors) == expected["structure"][None]  # pair: (None, None) float32, dense per batch
    assert (len(samples), end) == (expected["total"], expected["end"]) == (2, "OutOfRangeError")
    assert as_values(samples[0]) == expected["samples"][0]
    assert samples[1].pair.shape == (300, 2)


def test_fixed_shape_strings() -> None:
    """codecless/'s ``words`` (np.str_, (2,)) and string scalars: what Petastorm's dataset gave, row by row."""
    expected = petastorm_expected()["string_rows"]
    tensors, samples, _ = run_all(lambda: make_reader(URL["codecless"], schema_fields=STRING_FIELDS, **ORDERED))
    assert structure(tensors) == expected["structure"]
    assert {int(s.id): as_values(s) for s in samples} == {r["id"]: r for r in expected["rows"]}


def test_unicode_and_binary_strings(tmp_path: Any) -> None:
    """Non-ASCII text and bytes with NULs in fixed-shape fields (py_func would encode numpy text as ASCII)."""
    write_dataset(tmp_path / "s", STRINGS, [string_row(i) for i in range(12)], rows_per_file=5)
    _, samples, _ = run_all(lambda: make_reader((tmp_path / "s").as_uri(), **ORDERED))
    assert sorted(int(s.id) for s in samples) == list(range(12))
    for sample in samples:
        want = {k: value(v) for k, v in string_row(int(sample.id)).items()}
        assert as_values(sample) == want and sample.two.shape == (2,)


def test_shuffling_queue() -> None:
    tensors, samples, end = run_all(lambda: make_reader(URL["unischema"], schema_fields=["id", "label"], **ORDERED),
                                    shuffling_queue_capacity=20, min_after_dequeue=10)
    ids = [int(s.id) for s in samples]
    assert sorted(ids) == list(range(60)) and ids != list(range(60)) and end == "OutOfRangeError"
    with make_reader(URL["unischema"], schema_fields=["id", "label"], **ORDERED) as reader:
        labels = {int(r.id): int(r.label) for r in reader}
    assert all(int(s.label) == labels[int(s.id)] for s in samples)  # each label travels with its row
    assert tensors.id.shape == () and tensors.label.dtype == tf.int32
    with tf.Graph().as_default() as graph, make_reader(URL["unischema"], schema_fields=["id"], **ORDERED) as reader:
        tf_tensors(reader, 10, 2)
        assert graph.get_tensor_by_name(RANDOM_SHUFFLING_QUEUE_SIZE + ":0").dtype == tf.int32


def test_eager_gives_the_next_row_as_petastorm() -> None:
    expected = petastorm_expected()["eager"]
    with make_reader(URL["unischema"], schema_fields=["id", "label"], **ORDERED) as reader:
        assert [as_values(tf_tensors(reader)) for _ in range(2)] == expected["calls"]
        assert expected["shuffle_error"][0] == "RuntimeError"  # Petastorm's queue runner under eager execution
        with pytest.raises(UsageError, match=r"tf.Graph\(\).as_default\(\).*make_petastorm_dataset"):
            tf_tensors(reader, shuffling_queue_capacity=10, min_after_dequeue=5)


def test_errors() -> None:
    with tf.Graph().as_default():
        with make_batch_reader(URL["plain"], **ORDERED) as reader:
            with pytest.raises(InvalidArgumentError, match="batched output"):
                tf_tensors(reader, shuffling_queue_capacity=10)
        with make_batch_reader(URL["unischema"], schema_fields=["id", "boxes"], **ORDERED) as reader:
            with pytest.raises(SchemaError, match=r"\['boxes'\] have variable dims.*make_petastorm_dataset"):
                tf_tensors(reader)
        with make_reader(URL["unischema"], schema_fields=["id"], **ORDERED) as reader:
            for capacity, after in ((-1, 0), (10, 10), (1.5, 0)):
                with pytest.raises(InvalidArgumentError):
                    tf_tensors(reader, capacity, after)
        with pytest.raises(InvalidArgumentError, match="expected a unihub reader"):
            tf_tensors(iter([]))
    # with Petastorm's types a null (but a float's NaN) cannot be a tensor: the reader's
    # ValidationError, carried by TensorFlow's error (session.run raises TensorFlow's own)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"ValidationError: field 'mask', row 0 .*a null"):
        run_all(lambda: make_reader(URL["unischema"], schema_fields=["id", "mask"], **ORDERED))


def test_tf1_dataset_idioms_on_petastorm_datasets() -> None:
    """Code written for Petastorm under TF1 graphs: a one-shot iterator over make_petastorm_dataset, and
    the dataset's output shapes and types through tf.compat.v1, give what tf_tensors gives."""
    from unihub import make_petastorm_dataset

    expected = petastorm_expected()["tf_tensors_rows"]
    with tf.Graph().as_default(), make_reader(URL["unischema"], schema_fields=ROW_FIELDS, **ORDERED) as reader:
        dataset = make_petastorm_dataset(reader)
        shapes, types = tf.compat.v1.data.get_output_shapes(dataset), tf.compat.v1.data.get_output_types(dataset)
        assert sorted((f, types._asdict()[f].name, tuple(s.as_list())) for f, s in shapes._asdict().items()) \
            == expected["structure"][None]
        next_row = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        samples = []
        with tf.compat.v1.Session() as session, pytest.raises(tf.errors.OutOfRangeError):
            while True:
                samples.append(as_values(session.run(next_row)))
    assert len(samples) == expected["total"] == 60 and samples[:5] == expected["samples"]
    with tf.Graph().as_default(), make_batch_reader(URL["plain"], **ORDERED) as reader:
        dataset = make_petastorm_dataset(reader)
        assert tuple(tf.compat.v1.data.get_output_shapes(dataset).pair.as_list()) == (None, None)
        next_batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        ids = []
        with tf.compat.v1.Session() as session, pytest.raises(tf.errors.OutOfRangeError):
            while True:
                ids.extend(session.run(next_batch).id.tolist())
    assert sorted(ids) == list(range(600))
