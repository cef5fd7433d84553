"""make_petastorm_dataset over NGram readers: one ``{offset: namedtuple of tensors}`` per window.

Checked against real Petastorm 0.13.1 on the Petastorm-written ``unischema`` fixture (its
windows, structure and values, from ``tf_expected.pkl``) and against what the unihub reader
itself yields on a dataset written here (shuffled rows, several workers, ragged fields, strings).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from unihub import NGram, ScalarCodec, TensorCodec, Unischema, UnischemaField, write_dataset
from unihub.errors import InvalidArgumentError
from unihub.readers.reader import make_reader

from .tf_expected import NGRAM_FIELDS, URL, petastorm_expected, structure, value, window_values

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
from unihub.bridges.tf.dataset import make_petastorm_dataset, make_tf_dataset  # noqa: E402

SEQ = Unischema("Seq", [
    UnischemaField("ts", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("value", np.float32, (), ScalarCodec(pa.float32()), False),
    UnischemaField("vec", np.float32, (2,), TensorCodec(), False),
    UnischemaField("track", np.int32, (None, 3), TensorCodec(), False),
    UnischemaField("sensor", np.str_, (), ScalarCodec(pa.string()), False),
])
#: timestamps 0..99 with a gap of 10 after every 9th row, so windows break there
TIMESTAMPS = np.cumsum([10 if i % 9 == 8 else 1 for i in range(100)])


def seq_row(i: int) -> dict[str, Any]:
    return {"ts": int(TIMESTAMPS[i]), "value": i / 2, "vec": np.array([i, -i], np.float32),
            "track": np.arange(3 * (i % 4), dtype=np.int32).reshape(-1, 3) + i, "sensor": f"s-{i % 5}-é"}


@pytest.fixture(scope="module")
def seq_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tf_ngram") / "seq"
    rng = np.random.default_rng(1)  # 4 files of 25 rows, out of timestamp order inside each file
    order = np.concatenate([start + rng.permutation(25) for start in range(0, 100, 25)])
    write_dataset(path, SEQ, [seq_row(int(i)) for i in order], rows_per_file=25)
    return path.as_uri()


def by_first_timestamp(windows: list[dict[int, dict[str, Any]]], offset: int, field: str) -> dict[Any, Any]:
    keyed = {w[offset][field]: w for w in windows}
    assert len(keyed) == len(windows)
    return keyed


def test_windows_match_petastorm() -> None:
    expected = petastorm_expected()["ngram"]
    ngram = NGram(NGRAM_FIELDS, delta_threshold=1, timestamp_field="id")
    with make_reader(URL["unischema"], schema_fields=ngram, workers_count=2) as reader:
        dataset = make_petastorm_dataset(reader)
        assert {k: structure(s) for k, s in dataset.element_spec.items()} == expected["structure"]
        assert list(dataset.element_spec) == [-1, 0, 1] and dataset.element_spec[0] == ()
        windows = [window_values(w) for w in dataset]
    assert len(windows) == len(expected["windows"]) == 54
    assert by_first_timestamp(windows, -1, "id") == by_first_timestamp(expected["windows"], -1, "id")


def test_windows_match_the_reader(seq_url: str) -> None:
    ngram = NGram({-2: ["ts", "track"], 0: ["ts", "value", "vec", "sensor"]}, delta_threshold=1,
                  timestamp_field="ts")
    with make_reader(seq_url, schema_fields=ngram, num_epochs=1, workers_count=1, shuffle_row_groups=False) as reader:
        from_reader = [window_values(w) for w in reader]
    with make_reader(seq_url, schema_fields=ngram, num_epochs=1, workers_count=3, shuffle_rows=True) as reader:
        dataset = make_petastorm_dataset(reader)
        spec = dataset.element_spec
        assert list(spec) == [-2, -1, 0] and len(spec[-1]) == 0
        assert tuple(spec[-2].track.shape) == (None, 3) and spec[-2].track.dtype == tf.int32
        assert tuple(spec[0].vec.shape) == (2,) and spec[0].sensor.dtype == tf.string
        windows = list(dataset)
    assert all(isinstance(w[-2].track, tf.Tensor) for w in windows)
    # 4 files of 25 rows, runs of 9 consecutive timestamps: a window lies in one file and one run
    assert len(windows) == len(from_reader) == 71
    got = [window_values(w) for w in windows]
    assert by_first_timestamp(got, -2, "ts") == by_first_timestamp(from_reader, -2, "ts")
    for w in got:
        assert w[0]["ts"] - w[-2]["ts"] == 2
        assert w[0]["sensor"] == value(seq_row(int(np.searchsorted(TIMESTAMPS, w[0]["ts"])))["sensor"])


def test_windows_batch_and_run_in_a_tf_function(seq_url: str) -> None:
    ngram = NGram({0: ["ts", "value"], 1: ["ts", "vec"]}, delta_threshold=1, timestamp_field="ts")
    with make_reader(seq_url, schema_fields=ngram, workers_count=1, num_epochs=2) as reader:
        batches = list(make_petastorm_dataset(reader).batch(8))
    first, second = (np.concatenate([b[k].ts.numpy() for b in batches]) for k in (0, 1))
    assert len(first) == 2 * 85 and np.all(second - first == 1)  # pairs inside a file and a run, twice
    assert tuple(batches[0][1].vec.shape) == (8, 2)

    @tf.function
    def total(ds: Any) -> Any:
        s = tf.constant(0.0)
        for window in ds:
            s += window[0].value + window[1].vec[0]
        return s

    with make_reader(seq_url, schema_fields=ngram, workers_count=1) as reader:
        pairs = list(reader)
    with make_reader(seq_url, schema_fields=ngram, workers_count=1) as reader:
        assert float(total(make_petastorm_dataset(reader))) == pytest.approx(
            sum(float(w[0].value) + float(w[1].vec[0]) for w in pairs))


def test_make_tf_dataset_points_to_make_petastorm_dataset(seq_url: str) -> None:
    ngram = NGram({0: ["ts"], 1: ["ts"]}, delta_threshold=1, timestamp_field="ts")
    with make_reader(seq_url, schema_fields=ngram, workers_count=1) as reader, \
            pytest.raises(InvalidArgumentError, match="NGram reader.*make_petastorm_dataset"):
        make_tf_dataset(reader, 4)
    empty = NGram({0: [], 1: []}, delta_threshold=1, timestamp_field="ts")
    with make_reader(seq_url, schema_fields=empty, workers_count=1) as reader, \
            pytest.raises(InvalidArgumentError, match="no fields at any offset"):
        make_petastorm_dataset(reader)
