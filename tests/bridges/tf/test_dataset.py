"""bridges/tf/dataset.py: make_petastorm_dataset and make_tf_dataset over row and batch readers.

One dataset of 60 rows in row groups of a few rows (scalars, a PNG image, fixed and
ragged tensors, strings, bytes, decimals) is written once per module; values read back
through TensorFlow are compared exactly with what was written.
"""

from __future__ import annotations

import decimal
import gc
import os
import types
import warnings
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub import (
    CompressedImageCodec,
    NdarrayCodec,
    ScalarCodec,
    SchemaError,
    TensorCodec,
    UnihubError,
    Unischema,
    UnischemaField,
    ValidationError,
    write_dataset,
)
from unihub.bridges.tf import dataset as tf_bridge
from unihub.bridges.tf import sources as tf_sources
from unihub.bridges.tf.dataset import make_petastorm_dataset, make_tf_dataset, output_signature
from unihub.errors import InvalidArgumentError
from unihub.readers.reader import make_batch_reader, make_reader

from .tf_expected import CODECLESS_FIELDS, STRING_FIELDS, URL, petastorm_expected, structure, value

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

N = 60
SCHEMA = Unischema("TfTest", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("image", np.uint8, (8, 8, 3), CompressedImageCodec("png"), False),
    UnischemaField("vec", np.float32, (None, 4), TensorCodec(), False),
    UnischemaField("feat", np.float32, (4,), TensorCodec(), False),
    UnischemaField("label", np.float32, (), ScalarCodec(pa.float32()), False),
    UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), False),
    UnischemaField("raw", np.bytes_, (), ScalarCodec(pa.binary()), False),
    UnischemaField("price", decimal.Decimal, (), ScalarCodec(pa.decimal128(10, 2)), False),
])


def make_row(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    feat = rng.random(4, dtype=np.float32)
    return {"id": i, "image": rng.integers(0, 256, (8, 8, 3), dtype=np.uint8),
            "vec": rng.random((i % 3, 4), dtype=np.float32), "feat": feat, "label": np.float32(feat.sum()),
            "name": f"row-{i}", "raw": bytes([i % 256]) * (i % 4), "price": decimal.Decimal(i) / 4}


ROWS = [make_row(i) for i in range(N)]


@pytest.fixture(scope="module")
def tf() -> Any:
    return pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tf") / "data"
    write_dataset(path, SCHEMA, ROWS, row_group_size_mb=0.002, rows_per_file=25)
    return path.as_uri()


def assert_row(row: Any, i: int | None = None) -> None:
    """One row of tensors (or numpy values) equals the written row with its id."""
    i = int(np.asarray(row.id)) if i is None else i
    want = ROWS[i]
    np.testing.assert_array_equal(np.asarray(row.image), want["image"])
    np.testing.assert_array_equal(np.asarray(row.vec), want["vec"])
    assert np.asarray(row.vec).shape == want["vec"].shape
    np.testing.assert_array_equal(np.asarray(row.feat), want["feat"])
    assert np.asarray(row.label) == want["label"]
    assert np.asarray(row.name).item() == want["name"].encode()
    assert np.asarray(row.raw).item() == want["raw"]
    assert decimal.Decimal(np.asarray(row.price).item().decode()) == want["price"]


def rows_of_batch(batch: Any) -> list[Any]:
    """A batch (a namedtuple, or make_tf_dataset's dict) of tensors (vec ragged) as row namespaces of numpy values."""
    columns = batch if isinstance(batch, dict) else batch._asdict()
    n = len(columns["id"])
    vec = columns["vec"].to_list()
    return [types.SimpleNamespace(**{name: np.asarray(vec[j], np.float32).reshape(-1, 4) if name == "vec"
                                     else np.asarray(value[j]) for name, value in columns.items()})
            for j in range(n)]


def test_row_reader_signature_and_values(tf: Any, url: str) -> None:
    with make_reader(url, num_epochs=1, workers_count=1) as reader:
        dataset = make_petastorm_dataset(reader)
        spec = dataset.element_spec
        assert type(spec).__name__ == "TfTest_row"
        for field in SCHEMA:
            s = getattr(spec, field.name)
            assert isinstance(s, tf.TensorSpec) and tuple(s.shape) == field.shape, field.name
        assert (spec.id.dtype, spec.image.dtype, spec.vec.dtype, spec.label.dtype) == \
            (tf.int64, tf.uint8, tf.float32, tf.float32)
        assert spec.name.dtype == spec.raw.dtype == spec.price.dtype == tf.string
        rows = list(dataset)
    assert sorted(int(r.id) for r in rows) == list(range(N))
    for row in rows:
        assert isinstance(row.vec, tf.Tensor)
        assert_row(row)
    # decoded images equal unihub's own decoding
    with make_reader(url, num_epochs=1, workers_count=1, schema_fields=["id", "image"]) as reader:
        images = {int(r.id): r.image for r in reader}
    for row in rows:
        np.testing.assert_array_equal(row.image.numpy(), images[int(row.id)])


def test_batch_reader(tf: Any, url: str) -> None:
    with make_batch_reader(url, num_epochs=1, workers_count=1) as reader:
        dataset = make_petastorm_dataset(reader)
        spec = dataset.element_spec
        assert tuple(spec.image.shape) == (None, 8, 8, 3) and tuple(spec.id.shape) == (None,)
        assert isinstance(spec.vec, tf.RaggedTensorSpec) and tuple(spec.vec.shape) == (None, None, 4)
        batches = list(dataset)
    assert len(batches) > 5  # one per row group
    rows = [r for b in batches for r in rows_of_batch(b)]
    assert sorted(int(r.id) for r in rows) == list(range(N))
    for row in rows:
        assert_row(row)


def test_make_tf_dataset_batches(tf: Any, url: str) -> None:
    dataset = make_tf_dataset(url, 16, workers_count=1)
    assert tuple(dataset.element_spec["feat"].shape) == (None, 4)
    batches = list(dataset)
    assert [len(b["id"]) for b in batches] == [16, 16, 16, 12] and int(dataset.cardinality()) == 4
    rows = [r for b in batches for r in rows_of_batch(b)]
    assert sorted(int(r.id) for r in rows) == list(range(N))
    for row in rows:
        assert_row(row)
    # every iteration opens a fresh reader: a second pass yields all rows again
    assert sum(len(b["id"]) for b in dataset) == N
    dropped = make_tf_dataset(url, 16, drop_remainder=True, workers_count=1, schema_fields=["id"])
    assert [len(b["id"]) for b in dropped] == [16, 16, 16] and int(dropped.cardinality()) == 3


def test_dense_fields_are_cut_into_batches_inside_tensorflow(tf: Any, url: str) -> None:
    """Without ragged fields the reader's chunks cross whole and ``rebatch`` cuts them: the same
    batch sizes, every row once with its values, shuffled or not, with or without the remainder."""
    dense = [name for name in SCHEMA.fields if name != "vec"]
    for shuffle in (0, 25):
        dataset = make_tf_dataset(url, 16, shuffle_buffer=shuffle, seed=3, workers_count=2, schema_fields=dense,
                                  shuffle_row_groups=False)
        batches = list(dataset)
        assert [len(b["id"]) for b in batches] == [16, 16, 16, 12] and int(dataset.cardinality()) == 4
        ids = [int(i) for b in batches for i in b["id"].numpy()]
        assert sorted(ids) == list(range(N)) and (ids == sorted(ids)) == (shuffle == 0)
        for b in batches:
            for j, i in enumerate(b["id"].numpy()):
                want = ROWS[int(i)]
                np.testing.assert_array_equal(b["image"][j].numpy(), want["image"])
                np.testing.assert_array_equal(b["feat"][j].numpy(), want["feat"])
                assert b["name"][j].numpy() == want["name"].encode() and b["raw"][j].numpy() == want["raw"]
                assert decimal.Decimal(b["price"][j].numpy().decode()) == want["price"]
        dropped = make_tf_dataset(url, 16, shuffle_buffer=shuffle, seed=3, drop_remainder=True, schema_fields=dense)
        assert [len(b["id"]) for b in dropped] == [16, 16, 16]


def test_datasets_leave_autotuning_off(tf: Any, url: str) -> None:
    """tf.data's autotune thread made the end of an iteration wait for its next wake-up (as long
    as the epoch): the datasets unihub makes turn it off, and a user's later options win."""
    dataset = make_tf_dataset(url, 16, schema_fields=["id"])
    assert dataset.options().autotune.enabled is False
    with make_reader(url, num_epochs=1, schema_fields=["id"]) as reader:
        assert make_petastorm_dataset(reader).options().autotune.enabled is False
    options = tf.data.Options()
    options.autotune.enabled = True
    assert dataset.with_options(options).options().autotune.enabled is True


def test_shuffle_buffer_is_seeded(tf: Any, url: str) -> None:
    def order(seed: int, buffer: int) -> list[int]:
        ds = make_tf_dataset(url, 8, shuffle_buffer=buffer, seed=seed, workers_count=1, schema_fields=["id"])
        return [int(i) for b in ds for i in b["id"].numpy()]

    plain = order(0, 0)
    shuffled = order(0, 30)
    assert sorted(shuffled) == list(range(N)) and shuffled != plain
    assert order(0, 30) == shuffled and order(1, 30) != shuffled


def test_row_reader_through_make_tf_dataset(tf: Any, url: str) -> None:
    with make_reader(url, num_epochs=1, workers_count=1) as reader:
        batches = list(make_tf_dataset(reader, 7))
    assert [len(b["id"]) for b in batches] == [7] * 8 + [4]
    for row in (r for b in batches for r in rows_of_batch(b)):
        assert_row(row)
    with make_reader(url, num_epochs=1, workers_count=1, schema_fields=["id", "vec"]) as reader:
        rows = list(make_tf_dataset(reader))  # batch_size=None: rows, as make_petastorm_dataset
    assert sorted(int(r["id"]) for r in rows) == list(range(N))
    assert all(r["vec"].shape == ROWS[int(r["id"])]["vec"].shape for r in rows)


def test_num_epochs_two_yields_twice(tf: Any, url: str) -> None:
    ids = [int(i) for b in make_tf_dataset(url, 10, num_epochs=2, workers_count=1, schema_fields=["id"])
           for i in b["id"].numpy()]
    assert sorted(ids) == sorted(list(range(N)) * 2)
    with make_reader(url, num_epochs=2, workers_count=1, schema_fields=["id"]) as reader:
        assert sorted(int(r.id) for r in make_petastorm_dataset(reader)) == sorted(list(range(N)) * 2)


def test_tf_function_sums_a_column(tf: Any, url: str) -> None:
    dataset = make_tf_dataset(url, 9, workers_count=1, schema_fields=["id", "vec"])

    @tf.function
    def total(ds: Any) -> Any:
        s = tf.constant(0, tf.int64)
        for batch in ds:
            s += tf.reduce_sum(batch["id"]) + tf.cast(tf.reduce_sum(batch["vec"].row_lengths()), tf.int64) * 0
        return s

    assert int(total(dataset)) == N * (N - 1) // 2


def test_keras_fit(tf: Any, url: str) -> None:
    keras = pytest.importorskip("keras")
    dataset = make_tf_dataset(url, 16, shuffle_buffer=20, seed=0, workers_count=1, schema_fields=["feat", "label"])
    pairs = dataset.map(lambda b: (b["feat"], b["label"]))
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    history = model.fit(pairs, epochs=2, verbose=0, shuffle=False)
    losses = history.history["loss"]
    assert len(losses) == 2 and all(np.isfinite(losses)) and losses[1] < losses[0]


def test_readers_are_stopped(tf: Any, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[Any] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        opened.append(make_batch_reader(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(tf_bridge, "make_batch_reader", recording)
    dataset = make_tf_dataset(url, 4, num_epochs=None, workers_count=2, schema_fields=["id"])
    iterator = iter(dataset)
    for _ in range(5):  # forever: abandon it part way
        next(iterator)
    del iterator
    gc.collect()
    assert len(opened) == 2  # the probe for the schema, then the iteration's reader
    assert all(r._stopped and r._pool is None for r in opened)
    opened.clear()
    assert sum(len(b["id"]) for b in make_tf_dataset(url, 32, workers_count=2, schema_fields=["id"])) == N
    gc.collect()
    assert opened and all(r._stopped and r._pool is None for r in opened)


@pytest.fixture(scope="module")
def nulls_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    schema = Unischema("Nulls", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                 UnischemaField("score", np.float32, (), ScalarCodec(pa.float32()), True)])
    path = tmp_path_factory.mktemp("tf") / "nulls"
    write_dataset(path, schema, ({"id": i, "score": None if i == 7 else i / 2} for i in range(20)))
    return path.as_uri()


def test_null_in_a_numeric_field_is_filled_and_masked(tf: Any, nulls_url: str) -> None:
    """A nullable field comes with its ``<field>_is_present`` mask, the null filled (NaN for a
    float); with Petastorm's types, Petastorm's structure (no mask, the null float NaN)."""
    batches = list(make_tf_dataset(nulls_url, 8, workers_count=1))
    assert list(batches[0]) == ["id", "score", "score_is_present"]
    ids = np.concatenate([b["id"].numpy() for b in batches])
    scores = np.concatenate([b["score"].numpy() for b in batches])
    present = np.concatenate([b["score_is_present"].numpy() for b in batches])
    assert ids.tolist() == list(range(20)) and present.tolist() == [i != 7 for i in range(20)]
    assert np.isnan(scores[7]) and scores[ids != 7].tolist() == [i / 2 for i in range(20) if i != 7]
    with make_reader(nulls_url, num_epochs=1, workers_count=1) as reader:
        rows = list(make_petastorm_dataset(reader))
    assert type(rows[0]).__name__ == "Nulls_row" and rows[0]._fields == ("id", "score", "score_is_present")
    assert [bool(r.score_is_present) for r in rows] == [i != 7 for i in range(20)] and np.isnan(rows[7].score)
    batches = list(make_tf_dataset(nulls_url, 8, workers_count=1, petastorm_types=True))
    assert list(batches[0]) == ["id", "score"] and np.isnan(batches[0]["score"][7])


def test_fields_without_a_tf_type(tf: Any) -> None:
    schema = Unischema("Obj", [UnischemaField("id", np.int64, ()), UnischemaField("blob", np.object_, ())])
    with pytest.raises(SchemaError, match="'blob' holds Python objects.*schema_fields"):
        output_signature(schema)
    with pytest.raises(UnihubError, match="expected a unihub reader"):
        make_petastorm_dataset(iter([]))  # type: ignore[arg-type]  # a wrong argument, on purpose
    with pytest.raises(UnihubError, match="batch_size"):
        make_tf_dataset("file:///nowhere", 0)


def test_numpy_stages_without_tf() -> None:
    """Re-batching and shuffling are numpy only: exact sizes, every row once, seeded."""
    batches = [{"x": np.arange(start, start + n)} for start, n in [(0, 5), (5, 1), (6, 11), (17, 3)]]
    sizes = [len(b["x"]) for b in tf_sources.rebatched(iter(batches), 4, False)]
    assert sizes == [4, 4, 4, 4, 4]
    assert [len(b["x"]) for b in tf_sources.rebatched(iter(batches), 6, True)] == [6, 6, 6]
    out = [np.concatenate([b["x"] for b in tf_sources.shuffled(iter(batches), 8, np.random.default_rng(s))])
           for s in (0, 0, 1)]
    assert sorted(out[0].tolist()) == list(range(20)) and out[0].tolist() != list(range(20))
    assert out[0].tolist() == out[1].tolist() != out[2].tolist()


def test_rebatching_copies_only_batches_across_two_chunks() -> None:
    """Whole batches are views of the arriving arrays; a batch across two is a new array on a
    64-byte boundary (TensorFlow takes such an array without copying it again)."""
    chunks = [{"x": np.arange(start, start + n, dtype=np.int64).repeat(16).reshape(n, 16)}
              for start, n in [(0, 10), (10, 7), (17, 1), (18, 9)]]
    out = list(tf_sources.rebatched(iter(chunks), 4, False))
    assert [len(b["x"]) for b in out] == [4, 4, 4, 4, 4, 4, 3]
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in out]), np.concatenate([c["x"] for c in chunks]))
    shared = [any(np.shares_memory(b["x"], c["x"]) for c in chunks) for b in out]
    assert shared == [True, True, False, True, False, True, True]
    assert all(b["x"].ctypes.data % 64 == 0 for b, views in zip(out, shared) if not views)


def test_signature_of_variable_dims(tf: Any) -> None:
    schema = Unischema("V", [UnischemaField("m", np.int32, (3, None)), UnischemaField("t", np.datetime64, ())])
    rows = output_signature(schema)
    assert tuple(rows.m.shape) == (3, None) and rows.t.dtype == tf.int64
    batches = output_signature(schema, batched=True)
    assert isinstance(batches.m, tf.RaggedTensorSpec) and batches.m.ragged_rank == 2



STRINGS = Unischema("Strings", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("one", np.str_, (1,), NdarrayCodec(), False),
    UnischemaField("two", np.str_, (2,), NdarrayCodec(), False),
    UnischemaField("raw", np.bytes_, (2,), NdarrayCodec(), False),
])


def string_row(i: int) -> dict[str, Any]:
    return {"id": i, "one": np.array([f"é{i}"]), "two": np.array([f"x{i}", "日本" * (i % 3)]),
            "raw": np.array([bytes([255, i]), b"a\x00b" * (i % 2)])}


@pytest.fixture(scope="module")
def strings_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tf") / "strings"
    write_dataset(path, STRINGS, [string_row(i) for i in range(23)], rows_per_file=10)
    return path.as_uri()


def assert_string_row(tf: Any, row: Any) -> None:
    """One row's string tensors: tf.string of the field's shape, holding what the unihub reader yields."""
    i = int(np.asarray(row["id"] if isinstance(row, dict) else row.id))
    want = string_row(i)
    for name in ("one", "two", "raw"):
        value = row[name] if isinstance(row, dict) else getattr(row, name)
        assert value.dtype == tf.string and tuple(value.shape) == STRINGS.fields[name].shape, name
        expected = [v.encode() if isinstance(v, str) else v for v in want[name].tolist()]
        assert value.numpy().tolist() == expected, (name, i)


def test_fixed_shape_strings(tf: Any, strings_url: str) -> None:
    with make_reader(strings_url, num_epochs=1, workers_count=1) as reader:
        read = {int(r.id): r for r in reader}
    for i, row in read.items():  # the unihub reader's own values are what TensorFlow must carry
        for name in ("one", "two", "raw"):
            np.testing.assert_array_equal(getattr(row, name), string_row(i)[name])
    with make_reader(strings_url, num_epochs=1, workers_count=1) as reader:
        dataset = make_petastorm_dataset(reader)
        assert tuple(dataset.element_spec.two.shape) == (2,) and dataset.element_spec.one.dtype == tf.string
        rows = list(dataset)
    assert sorted(int(r.id) for r in rows) == list(range(23))
    for row in rows:
        assert_string_row(tf, row)
    with make_batch_reader(strings_url, num_epochs=1, workers_count=1) as reader:
        dataset = make_petastorm_dataset(reader)
        assert tuple(dataset.element_spec.raw.shape) == (None, 2)
        batches = list(dataset)
    assert sorted(len(b.id) for b in batches) == [3, 10, 10]
    for batch in batches:
        for j in range(len(batch.id)):
            assert_string_row(tf, {name: value[j] for name, value in batch._asdict().items()})
    for source in (strings_url, make_reader(strings_url, num_epochs=1, workers_count=1)):  # a URL, a row reader
        batches = list(make_tf_dataset(source, 4, workers_count=1) if isinstance(source, str)
                       else make_tf_dataset(source, 4))
        assert [len(b["id"]) for b in batches] == [4] * 5 + [3]
        assert tuple(batches[0]["two"].shape) == (4, 2)
        for batch in batches:
            for j in range(len(batch["id"])):
                assert_string_row(tf, {name: value[j] for name, value in batch.items()})


def test_fixed_shape_strings_match_petastorm(tf: Any) -> None:
    """codecless/ (written by Petastorm): ``words`` (np.str_, (2,), NdarrayCodec) and string scalars, row by row."""
    expected = petastorm_expected()["string_rows"]
    with make_reader(URL["codecless"], schema_fields=STRING_FIELDS, workers_count=2) as reader:
        dataset = make_petastorm_dataset(reader)
        assert structure(dataset.element_spec) == expected["structure"]
        rows = {int(r.id): {f: value(v) for f, v in r._asdict().items()} for r in dataset}
    assert rows == {r["id"]: r for r in expected["rows"]}


def by_id(batches: list[Any]) -> dict[str, np.ndarray]:
    """A batch dataset's columns, concatenated and put in id order."""
    columns = {f: np.concatenate([np.asarray(getattr(b, f)) for b in batches]) for f in batches[0]._fields}
    order = np.argsort(columns["id"])
    return {f: c[order] for f, c in columns.items()}


def test_batch_readers_match_petastorm(tf: Any) -> None:
    """Petastorm's make_petastorm_dataset over its make_batch_reader on plain/ and codecless/: same dtypes,
    static shapes and values (the list column ``pair`` dense, as Petastorm stacks it)."""
    expected = petastorm_expected()["batches"]
    for name, fields in (("plain", None), ("codecless", CODECLESS_FIELDS)):
        with make_batch_reader(URL[name], schema_fields=fields, workers_count=2) as reader:
            dataset = make_petastorm_dataset(reader)
            assert structure(dataset.element_spec) == expected[name]["structure"], name
            got = by_id(list(dataset))
        want = by_id([types.SimpleNamespace(**b, _fields=list(b)) for b in expected[name]["batches"]])
        assert sorted(got) == sorted(want)
        for field, column in want.items():
            np.testing.assert_array_equal(got[field], column, err_msg=f"{name}.{field}")
    assert got["f64n"].dtype == np.float64 and np.isnan(got["f64n"][0])  # a null float is NaN, as Petastorm's


def test_batch_reader_fields_petastorm_could_not_carry(tf: Any) -> None:
    """codecless/'s ``words`` (np.str_ (2,), NdarrayCodec) reaches TensorFlow decoded (Petastorm's batch reader
    passes the np.save blobs and TensorFlow refused their shape); a null in the int field ``i32n`` is the
    null error (Petastorm cast its NaN to int32, giving -2147483648)."""
    expected = petastorm_expected()["batches"]
    assert expected["codecless_words_error"] == "InvalidArgumentError"
    assert -2147483648 in expected["codecless_i32n"][0]
    with make_batch_reader(URL["codecless"], schema_fields=["id", "words"], workers_count=1) as reader:
        own = by_id(list(reader))
    with make_batch_reader(URL["codecless"], schema_fields=["id", "words"], workers_count=1) as reader:
        dataset = make_petastorm_dataset(reader)
        assert dataset.element_spec.words.dtype == tf.string and tuple(dataset.element_spec.words.shape) == (None, 2)
        got = by_id(list(dataset))
    assert got["words"].shape == (40, 2)
    assert got["words"].tolist() == np.char.encode(own["words"], "utf-8").tolist()
    assert got["words"][7].tolist() == [b"w7", b"x7"]
    with make_batch_reader(URL["codecless"], schema_fields=["id", "i32n"], workers_count=1) as reader, \
            pytest.raises(ValidationError, match=r"field 'i32n', row \d+ .*a null.*petastorm_types=False") as caught:
        list(make_petastorm_dataset(reader))  # raised as unihub's error, not TensorFlow's InvalidArgumentError
    assert caught.value.field == "i32n" and not isinstance(caught.value, tf.errors.OpError)


@pytest.fixture(scope="module")
def thumbnails(tmp_path_factory: pytest.TempPathFactory) -> str:
    """20,000 JPEG thumbnails: decoding keeps a reader busy for a while, so that TensorFlow is still
    pulling from the generator when a program that took one batch ends."""
    from unihub import CompressedImageCodec, ScalarCodec, Unischema, UnischemaField, write_dataset

    schema = Unischema("Thumbs", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                  UnischemaField("image", np.uint8, (64, 64, 3), CompressedImageCodec("jpeg"), False)])
    tile = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    blob = CompressedImageCodec("jpeg").encode(schema.image, tile)
    path = tmp_path_factory.mktemp("thumbs") / "ds"
    write_dataset(path, schema, {"id": np.arange(20_000), "image": [blob] * 20_000}, batched=True)
    return str(path)


def test_a_program_that_leaves_iterators_unfinished_exits(thumbnails: str) -> None:
    """Ending the program with dataset iterators part-way through must not hang: TensorFlow's prefetch
    thread was left inside the generator, needing Python while the interpreter finalized (it hung
    2 runs in 3 before the readers were stopped by an exit hook). One program leaves one iterator of
    each kind unfinished (it was a program per kind: six starts of TensorFlow for three)."""
    import subprocess
    import sys

    makes = {"make_tf_dataset": f"make_tf_dataset({thumbnails!r}, batch_size=64, seed=0)",
             "shuffled": f"make_tf_dataset({thumbnails!r}, batch_size=64, seed=0, shuffle_buffer=1000)",
             "make_petastorm_dataset": f"make_petastorm_dataset(make_reader({thumbnails!r}))"}
    script = ("import os\nos.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
              "from unihub import make_reader\nfrom unihub.bridges.tf.dataset import make_petastorm_dataset, make_tf_dataset\n"
              "iterators = []\n"
              + "".join(f"iterators.append(iter({make}))\nnext(iterators[-1])\nprint('first batch: {how}')\n"
                        for how, make in makes.items()))
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert [line for line in out.stdout.splitlines() if line.startswith("first batch")] == \
            [f"first batch: {how}" for how in makes], out.stdout


NULLABLE = Unischema("Nullable", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("price", decimal.Decimal, (), ScalarCodec(pa.decimal128(10, 2)), True),
    UnischemaField("when", np.datetime64, (), ScalarCodec(pa.timestamp("us")), True),
    UnischemaField("flag", np.bool_, (), ScalarCodec(pa.bool_()), True),
    UnischemaField("grid", np.float32, (2, 2), TensorCodec(), True),
    UnischemaField("pair", np.str_, (2,), NdarrayCodec(), True),
    UnischemaField("points", np.int16, (None, 2), TensorCodec(), True),
])


def nullable_row(i: int) -> dict[str, Any]:
    """Every field but ``id`` null in the even rows."""
    if i % 2 == 0:
        return {"id": i, **{name: None for name in NULLABLE.fields if name != "id"}}
    return {"id": i, "price": decimal.Decimal(i) / 4, "when": np.datetime64(1000 + i, "us"), "flag": bool(i % 3),
            "grid": np.full((2, 2), i, np.float32), "pair": np.array([f"a{i}", "b"]),
            "points": np.full((i % 4, 2), i, np.int16)}


def test_nullable_fields_of_every_kind(tf: Any, tmp_path: Any) -> None:
    """A null becomes its fill value (tf_bridge.fill_value) beside a False ``<field>_is_present``:
    decimals and strings b"", dates 0, booleans False, a float tensor NaN, a ragged field no rows;
    the values beside them are the reader's, in batches and rows alike."""
    write_dataset(tmp_path / "ds", NULLABLE, [nullable_row(i) for i in range(12)], rows_per_file=5)
    url = (tmp_path / "ds").as_uri()
    with make_reader(url, num_epochs=1, workers_count=1) as reader:
        rows = [{k: v.numpy() for k, v in r._asdict().items()} for r in make_petastorm_dataset(reader)]
    batches = list(make_tf_dataset(url, 5, workers_count=1))
    rows += [{k: v[j].numpy() for k, v in b.items()} for b in batches for j in range(len(b["id"]))]  # points: ragged
    assert sorted(int(r["id"]) for r in rows) == sorted(list(range(12)) * 2)
    for row in rows:
        i = int(row["id"])
        want = nullable_row(i)
        for name in NULLABLE.fields:
            if name == "id":
                continue
            assert bool(row[name + "_is_present"]) == (i % 2 == 1), (name, i)
        if i % 2 == 0:
            assert row["price"] == b"" and row["when"] == 0 and row["flag"] == np.False_
            assert row["grid"].shape == (2, 2) and np.isnan(row["grid"]).all()
            assert row["pair"].tolist() == [b"", b""] and row["points"].shape == (0, 2)
            continue
        assert decimal.Decimal(row["price"].decode()) == want["price"] and row["when"] == (1000 + i) * 1000  # us as ns
        assert row["flag"] == want["flag"] and row["grid"].tobytes() == want["grid"].tobytes()
        assert row["pair"].tolist() == [f"a{i}".encode(), b"b"]
        assert row["points"].dtype == np.int16 and row["points"].tobytes() == want["points"].tobytes()
        assert row["points"].shape == want["points"].shape


def test_ngram_windows_mask_their_nullable_fields(tf: Any, tmp_path: Any) -> None:
    """Each offset's namedtuple has the masks of its own nullable fields, after its fields."""
    from unihub import NGram

    write_dataset(tmp_path / "ds", NULLABLE, [nullable_row(i) for i in range(12)], rows_per_file=5)
    ngram = NGram(fields={0: ["id", "flag", "points"], 1: ["id", "when"]}, delta_threshold=1, timestamp_field="id")
    with make_reader((tmp_path / "ds").as_uri(), schema_fields=ngram, num_epochs=1, workers_count=1) as reader:
        windows = list(make_petastorm_dataset(reader))
    assert windows and all(int(w[1].id) == int(w[0].id) + 1 for w in windows)
    assert windows[0][0]._fields == ("id", "flag", "points", "flag_is_present", "points_is_present")
    assert windows[0][1]._fields == ("id", "when", "when_is_present")
    for window in windows:
        first, second = int(window[0].id), int(window[1].id)
        assert bool(window[0].flag_is_present) == bool(window[0].points_is_present) == (first % 2 == 1)
        assert bool(window[1].when_is_present) == (second % 2 == 1)
        assert int(window[1].when) == ((1000 + second) * 1000 if second % 2 else 0)  # us as ns
        assert window[0].points.numpy().tobytes() == (nullable_row(first)["points"].tobytes() if first % 2 else b"")


def dates_url(tmp_path: Any, days: list[str]) -> str:
    """Plain Parquet written by pyarrow: a date32 column (days on disk), timestamps of two units and a duration."""

    day = np.array(days, "datetime64[D]")
    table = pa.table({"id": np.arange(len(days)), "day": pa.array(day, pa.date32()),
                      "stamp_ms": pa.array(day.astype("M8[ms]") + np.timedelta64(7, "s"), pa.timestamp("ms")),
                      "stamp_us": pa.array(day.astype("M8[us]") - np.timedelta64(3, "us"), pa.timestamp("us")),
                      "wait": pa.array(np.arange(len(days)) - 1, pa.duration("ms"))})
    pq.write_table(table, tmp_path / "dates.parquet")
    return tmp_path.as_uri()


def test_dates_and_durations_are_int64_nanoseconds(tf: Any, tmp_path: Any) -> None:
    """As Petastorm's TensorFlow bridge gives them (its tests read 2019-01-02 as 1546387200000000000): dates
    and timestamps as nanoseconds since the Unix epoch, durations as nanoseconds, whatever the stored
    unit (days, ms, us), in make_petastorm_dataset over batches and rows, make_tf_dataset and tf_tensors."""
    from unihub.bridges.tf.graph import tf_tensors

    url = dates_url(tmp_path, ["2019-01-02", "1970-01-01", "1677-09-22", "2262-04-11"])
    expected = {"id": [0, 1, 2, 3],
                "day": [1546387200 * 10**9, 0, -9223286400 * 10**9, 9223286400 * 10**9],
                "stamp_ms": [1546387207 * 10**9, 7 * 10**9, -9223286393 * 10**9, 9223286407 * 10**9],
                "stamp_us": [1546387200 * 10**9 - 3000, -3000, -9223286400 * 10**9 - 3000, 9223286400 * 10**9 - 3000],
                "wait": [-10**6, 0, 10**6, 2 * 10**6]}
    with make_batch_reader(url) as reader:
        batches = [{k: v.numpy().tolist() for k, v in b._asdict().items()} for b in make_petastorm_dataset(reader)]
    assert batches == [expected]
    assert [{k: v.numpy().tolist() for k, v in b.items()} for b in make_tf_dataset(url, 4)] == [expected]
    with make_reader(url, shuffle_row_groups=False) as reader:
        rows = [{k: int(v) for k, v in r._asdict().items()} for r in make_petastorm_dataset(reader)]
    assert rows == [{k: v[i] for k, v in expected.items()} for i in range(4)]
    with tf.Graph().as_default(), make_batch_reader(url) as reader:
        tensors = tf_tensors(reader)
        assert tensors.day.dtype == tf.int64
        with tf.compat.v1.Session() as session:
            assert {k: v.tolist() for k, v in session.run(tensors)._asdict().items()} == expected


def test_dates_beyond_int64_nanoseconds_are_an_error(tf: Any, tmp_path: Any) -> None:
    """A date int64 nanoseconds cannot hold is refused naming its field and row (numpy's cast wraps it)."""
    url = dates_url(tmp_path, ["2019-01-02", "2262-04-12"])
    with make_batch_reader(url, schema_fields=["id", "day"]) as reader, \
            pytest.raises(ValidationError, match=r"field 'day', row 1 .*2262-04-12.*int64 nanoseconds") as caught:
        list(make_petastorm_dataset(reader))
    assert caught.value.field == "day" and caught.value.row == 1


def test_shuffled_int96_dates_beyond_nanoseconds_are_an_error(tf: Any, tmp_path: Any) -> None:
    """Spark's INT96 row groups come as nanoseconds, or as microseconds where one holds a date past 1677-2262
    (store/int96.py); rows of both in one shuffled batch were numpy's objects joined in nanoseconds: 9999-12-31
    went to TensorFlow wrapped to 1816-03-29, without an error."""
    import datetime

    for name, stamps in (("a", [datetime.datetime(2020, 1, 1), None]), ("b", [datetime.datetime(9999, 12, 31)])):
        pq.write_table(pa.table({"ts": pa.array(stamps, pa.timestamp("us"))}), tmp_path / f"{name}.parquet",
                       use_deprecated_int96_timestamps=True)
    dataset = make_tf_dataset(tmp_path.as_uri(), 3, shuffle_buffer=3, seed=1, shuffle_row_groups=False,
                              workers_count=1)
    with pytest.raises(ValidationError, match=r"9999-12-31.*int64 nanoseconds"):
        list(dataset)


def test_iterating_again_reads_the_reader_again_with_petastorms_warning(tf: Any) -> None:
    """As Petastorm's make_petastorm_dataset: a second iteration (or ``repeat``) after the reader's end resets
    the reader with a UserWarning whose start Petastorm's users match (an ended reader gave an empty
    iteration); after an iteration left part way the reader is not reset: no row comes twice, no warning."""
    match = "Running multiple iterations over make_petastorm_dataset is not recommend for performance issue"
    with make_batch_reader(URL["plain"], schema_fields=["id"], workers_count=1) as reader:
        dataset = make_petastorm_dataset(reader)
        assert sorted(i for b in dataset for i in b.id.numpy().tolist()) == list(range(600))
        with pytest.warns(UserWarning, match=match):
            assert sorted(i for b in dataset for i in b.id.numpy().tolist()) == list(range(600))
        with pytest.warns(UserWarning, match=match):
            assert sorted(i for b in dataset.repeat(2) for i in b.id.numpy().tolist()) == sorted(list(range(600)) * 2)
    with make_reader(URL["unischema"], schema_fields=["id"], workers_count=1) as reader:
        dataset = make_petastorm_dataset(reader)
        first = [int(r.id) for r in dataset.take(10)]
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            rest = [int(r.id) for r in dataset]  # rows the first iteration took into TensorFlow are not read again
    assert len(first) == 10 and not set(first) & set(rest)


def test_plain_parquet_ragged_lists_of_lists_are_ragged_tensors_and_never_padded(tf: Any, tmp_path: Any) -> None:
    """A plain ``list<list<int64>>`` column whose inner lists differ in length (Petastorm's inferred schema
    left it out): batches are RaggedTensors of exactly the stored values, where the encoder refused a ragged
    row; a row reader's dense row of such lists is refused rather than padded with 0."""

    nested = [[[1, 2], [3]], [[4]], [], [[5, 6], [7, 8]], [[9], []]]
    pq.write_table(pa.table({"id": pa.array(range(5)), "ll": pa.array(nested, pa.list_(pa.list_(pa.int64())))}),
                   tmp_path / "part.parquet")
    with make_batch_reader(str(tmp_path), shuffle_row_groups=False, workers_count=1) as reader:
        batch = next(iter(make_petastorm_dataset(reader)))
    assert batch.ll.to_list() == nested
    with make_reader(str(tmp_path), shuffle_row_groups=False, workers_count=1, schema_fields=["ll"]) as reader:
        rows = iter(make_petastorm_dataset(reader))
        with pytest.raises(tf.errors.InvalidArgumentError, match="a row of lists of different lengths"):
            next(rows)


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize(("values", "arrow_type"), [
    ([[[1], []], [[9], None, []]], pa.list_(pa.list_(pa.int64()))),  # a null inner list
    ([["a"], ["b", None]], pa.list_(pa.string())),  # a null string in a list
])
def test_a_null_inside_a_rows_lists_is_refused_by_field_and_row(tf: Any, tmp_path: Any, batched: bool,
                                                                 values: list[Any], arrow_type: Any) -> None:
    """A tf.RaggedTensor holds no null and a ``_is_present`` mask only says which rows are null, so a null
    inside a row's lists is a ValidationError naming the field and row (it became an empty list silently,
    which the stored ``[]`` rows also are; a null string in a list was blamed on 'nested values')."""
    pq.write_table(pa.table({"id": pa.array(range(2)), "v": pa.array(values, arrow_type)}), tmp_path / "part.parquet")
    make = make_batch_reader if batched else make_reader
    with make(str(tmp_path), shuffle_row_groups=False, workers_count=1, petastorm_types=False) as reader:
        with pytest.raises(ValidationError, match="field 'v', row 1 of a batch read: a null inside") as caught:
            list(make_petastorm_dataset(reader))
    assert (caught.value.field, caught.value.row) == ("v", 1)


def test_lists_of_dates_durations_and_decimals_keep_every_value(tf: Any, tmp_path: Any) -> None:
    """Lists of timestamps, dates, durations and decimals read as Python scalars (pandas' Timestamp for ns): a
    fixed-size list of ns timestamps lost its nanoseconds (1 ns became 0), and a variable-length list of them
    (or of dates, decimals, lists of timestamps) was refused as 'nested values at depth 0'."""
    day = 86_400 * 10**9
    pq.write_table(pa.table({
        "fixed_ns": pa.array([[1, 2], [3, 10**18 + 7]], pa.list_(pa.timestamp("ns"), 2)),
        "fixed_dur": pa.array([[1, -2], [3, 4]], pa.list_(pa.duration("ns"), 2)),
        "ns": pa.array([[1], [2, 3]], pa.list_(pa.timestamp("ns"))),
        "dates": pa.array([[1], []], pa.list_(pa.date32())),
        "decimals": pa.array([[decimal.Decimal("1.5")], [decimal.Decimal("-2.0"), decimal.Decimal("0.0")]],
                             pa.list_(pa.decimal128(5, 1))),
        "nested": pa.array([[[1], []], []], pa.list_(pa.list_(pa.timestamp("s")))),
    }), tmp_path / "part.parquet")
    with make_batch_reader(str(tmp_path), workers_count=1, petastorm_types=False) as reader:
        batch = next(iter(make_petastorm_dataset(reader)))
    assert batch.fixed_ns.numpy().tolist() == [[1, 2], [3, 10**18 + 7]]
    assert batch.fixed_dur.numpy().tolist() == [[1, -2], [3, 4]]
    assert batch.ns.to_list() == [[1], [2, 3]]
    assert batch.dates.to_list() == [[day], []]
    assert batch.decimals.to_list() == [[b"1.5"], [b"-2.0", b"0.0"]]
    assert batch.nested.to_list() == [[[10**9], []], []]


def test_images_left_encoded_are_their_png_bytes(tf: Any, url: str) -> None:
    """With ``decode_images=False`` an image field is its stored PNG bytes, a tf.string that tf.io.decode_png
    turns into the written image (the plan took the schema's (8, 8, 3) uint8 and every batch failed with
    'values that do not make a (8, 8, 3) uint8 tensor (invalid literal for int() ...)')."""
    dataset = make_tf_dataset(url, batch_size=7, schema_fields=["id", "image"], decode_images=False, workers_count=1)
    assert dataset.element_spec["image"] == tf.TensorSpec((None,), tf.string)
    seen = 0
    for batch in dataset:
        for i, png in zip(batch["id"].numpy(), batch["image"]):
            assert np.array_equal(tf.io.decode_png(png).numpy(), ROWS[i]["image"])
            seen += 1
    assert seen == N
    with make_reader(url, schema_fields=["id", "image"], decode_images=False, workers_count=1) as reader:
        row = next(iter(make_petastorm_dataset(reader)))
    assert row.image.dtype == tf.string and row.image.shape == ()
    assert np.array_equal(tf.io.decode_png(row.image).numpy(), ROWS[int(row.id)]["image"])


def test_make_tf_dataset_refuses_resume_from_with_a_url(tf: Any, url: str) -> None:
    """A URL dataset opens a fresh reader on every iteration: with ``resume_from=`` each Keras epoch resumed at
    the same row, and the cardinality of a whole epoch ended the first with TensorFlow's 'expected to contain
    9 elements but contained only 8'. Refused by name, pointing at a resumed reader."""
    with make_batch_reader(url, schema_fields=["id"], workers_count=1, num_epochs=1) as reader:
        rows = iter(reader)
        next(rows), next(rows)
        state = reader.state_dict()
    with pytest.raises(InvalidArgumentError, match="resume_from= would resume every one"):
        make_tf_dataset(url, batch_size=7, schema_fields=["id"], resume_from=state)
    with make_batch_reader(url, schema_fields=["id"], workers_count=1, num_epochs=1, resume_from=state) as reader:
        rest = [i for b in make_tf_dataset(reader, batch_size=7) for i in b["id"].numpy()]
    assert 0 < len(rest) < N and len(set(rest)) == len(rest)


@pytest.mark.parametrize("batched", [True, False])
def test_bytes_and_strings_in_lists_keep_their_trailing_nul(tf: Any, tmp_path: Any, batched: bool) -> None:
    """Bytes and strings in lists reach TensorFlow whole: they went through numpy's fixed-width strings,
    which drop trailing NULs (b"\\xff\\x00" became b"\\xff", "a\\x00" became "a")."""
    pq.write_table(pa.table({
        "blobs": pa.array([[b"\xff\x00"], [], [b"", b"x\x00\x00"]], pa.list_(pa.binary())),
        "words": pa.array([["a\x00"], [], ["b"]], pa.list_(pa.string())),
        "pairs": pa.array([[b"\x00", b"y\x00"], [b"1", b"2"], [b"", b""]], pa.list_(pa.binary(), 2)),
    }), tmp_path / "part.parquet")
    make = make_batch_reader if batched else make_reader
    with make(str(tmp_path), shuffle_row_groups=False, workers_count=1, petastorm_types=False) as reader:
        items = list(make_petastorm_dataset(reader))

    def as_list(value: Any) -> list[Any]:
        return value.to_list() if isinstance(value, tf.RaggedTensor) else value.numpy().tolist()

    got = {name: [v for item in items for v in (as_list(getattr(item, name)) if batched
                                                 else [as_list(getattr(item, name))])]
           for name in ("blobs", "words", "pairs")}
    assert got == {"blobs": [[b"\xff\x00"], [], [b"", b"x\x00\x00"]], "words": [[b"a\x00"], [], [b"b"]],
                   "pairs": [[b"\x00", b"y\x00"], [b"1", b"2"], [b"", b""]]}
