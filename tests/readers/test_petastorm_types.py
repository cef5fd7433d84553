"""Types as Petastorm gives them, on a dataset real Petastorm 0.13.1 wrote (``fixtures/petastorm/codecless``,
made by ``make_codecless.py``): scalars declared without a codec, ``np.bytes_`` with and without
``ScalarCodec(StringType())``, nullable numbers, and what Petastorm's own readers and PyTorch loaders
returned for it (``codecless_expected.pkl``)."""

from __future__ import annotations

import datetime
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub import Dataset, make_batch_reader, make_reader

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm"
URL = str(FIXTURES / "codecless")


@pytest.fixture(scope="module")
def expected() -> dict[str, Any]:
    with open(FIXTURES / "codecless_expected.pkl", "rb") as handle:
        return pickle.load(handle)


def _same(found: Any, described: tuple, where: str) -> None:
    """``found`` is what Petastorm's ``described`` value was: type, dtype and value (NaN equal to NaN)."""
    kind, dtype, *value = described
    if kind == "NoneType":
        assert found is None, where
    elif kind == "ndarray":
        shape, items = value
        assert isinstance(found, np.ndarray) and found.shape == tuple(shape), where
        assert found.dtype.kind == np.dtype(dtype).kind and found.tolist() == items, where
    else:
        assert isinstance(found, np.generic) and found.dtype == np.dtype(dtype), (where, found, dtype)
        item = value[0]
        assert found.item() == item or (isinstance(item, float) and np.isnan(item) and np.isnan(found)), where


def test_rows_have_petastorms_types(expected: dict[str, Any]) -> None:
    with make_reader(URL, shuffle_row_groups=False, workers_count=1) as reader:
        rows = {int(r.id): r._asdict() for r in reader}
    assert sorted(rows) == sorted(expected["rows"])
    for row_id, fields in expected["rows"].items():
        for name, described in fields.items():
            found, text = rows[row_id][name], described[0] == "generic" and described[1][1] in "US"
            if text:  # Petastorm's np.str_ / np.bytes_ scalars: str / bytes of the same value
                assert isinstance(found, str if described[1][1] == "U" else bytes), (row_id, name)
                assert found == described[2], (row_id, name)
            else:
                _same(found, described, f"{row_id}/{name}")


def _columns(reader: Any) -> dict[str, np.ndarray]:
    batches = [b._asdict() for b in reader]
    return {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}


def test_batches_have_petastorms_types_where_they_keep_the_declared_type(expected: dict[str, Any]) -> None:
    with make_batch_reader(URL, shuffle_row_groups=False, workers_count=1) as reader:
        got = _columns(reader)
    petastorm = {name: np.concatenate([np.array(part[3], dtype=np.dtype(part[1]) if part[1] != "|O" else object)
                                       for part in parts]) for name, parts in expected["batches"].items()}
    for name in ("id", "i16", "f32", "f64n", "i32n", "flag", "label"):  # the same dtype and values, NaN included
        assert got[name].dtype == petastorm[name].dtype, name
        np.testing.assert_array_equal(got[name], petastorm[name], err_msg=name)
    # documented differences: the declared dtype where Petastorm's pandas path lost it
    assert petastorm["u8"].dtype == np.int16 and got["u8"].dtype == np.uint8
    np.testing.assert_array_equal(got["u8"], petastorm["u8"])
    assert got["sb"].tolist() == [s.encode() for s in petastorm["sb"].tolist()]  # np.bytes_: bytes, not str
    assert got["name"].dtype == object and got["name"].tolist() == petastorm["name"].tolist()  # str objects
    assert got["words"].shape == (40, 2)  # NdarrayCodec decoded (Petastorm's batches keep the npy bytes)


def test_random_access_and_unihub_types(expected: dict[str, Any]) -> None:
    taken = Dataset(URL).take([1, 4])
    assert taken.i32n.dtype == np.float64 and np.isnan(taken.i32n[0]) and taken.i32n[1] == 4000
    with make_batch_reader(URL, shuffle_row_groups=False, workers_count=1, petastorm_types=False) as reader:
        got = _columns(reader)
    assert got["i32n"].dtype == object and got["i32n"][1] is None and got["i32n"][2] == np.int32(2000)
    assert got["f64n"].dtype == object and got["f64n"][0] is None


def test_torch_loaders_give_matching_tensors(expected: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    from unihub.bridges.torch import BatchedDataLoader, DataLoader

    fields = ["id", "u8", "i16", "f32", "flag", "label"]
    with DataLoader(make_reader(URL, schema_fields=fields, shuffle_row_groups=False), batch_size=8) as loader:
        rows = next(iter(loader))
    with BatchedDataLoader(make_batch_reader(URL, schema_fields=fields, shuffle_row_groups=False),
                           batch_size=8) as loader:
        batches = next(iter(loader))
    for name in fields:
        petastorm = expected["torch"]["DataLoader"][name]
        want = "torch.bool" if name == "flag" else petastorm  # Petastorm turns bool into uint8 (old torch)
        assert str(rows[name].dtype) == want and str(batches[name].dtype) == want, name
    assert rows["u8"].tolist() == list(range(200, 208)) and isinstance(batches["f32"], torch.Tensor)


PLAIN = str(FIXTURES / "plain")


def test_plain_parquet_batches_as_petastorm_gives_them() -> None:
    with open(FIXTURES / "plain_expected.pkl", "rb") as handle:
        petastorm = pickle.load(handle)
    with make_batch_reader(PLAIN, shuffle_row_groups=False, workers_count=1) as reader:
        got = _columns(reader)
    order, theirs = np.argsort(got["id"]), np.argsort(petastorm["id"]["values"])
    for name, column in petastorm.items():
        values = np.array(column["values"], dtype=np.dtype(column["dtype"]))[theirs]
        mine = got[name][order]
        assert mine.shape == tuple(column["shape"]), name  # pair: one (n, 2) array, not ragged
        if name == "name":
            assert mine.tolist() == values.tolist()  # str objects (Petastorm: a '<U' array)
        else:
            assert mine.dtype == values.dtype, name
            np.testing.assert_array_equal(mine, values, err_msg=name)


def test_plain_parquet_lists_are_dense_in_the_bridges() -> None:
    torch = pytest.importorskip("torch")
    from unihub.bridges.torch import BatchedDataLoader

    with BatchedDataLoader(make_batch_reader(PLAIN, workers_count=1), batch_size=16) as loader:
        pair = next(iter(loader))["pair"]
    assert isinstance(pair, torch.Tensor) and tuple(pair.shape) == (16, 2) and pair.dtype == torch.float32
    tf = pytest.importorskip("tensorflow")
    from unihub import make_petastorm_dataset, make_tf_dataset

    batch = next(iter(make_tf_dataset(PLAIN, 16, workers_count=1)))
    assert isinstance(batch["pair"], tf.Tensor) and tuple(batch["pair"].shape) == (16, 2)
    with make_reader(PLAIN, workers_count=1) as reader:
        row = next(iter(make_petastorm_dataset(reader)))
    assert tuple(row.pair.shape) == (2,) and row.pair.dtype == tf.float32
    with make_batch_reader(PLAIN, workers_count=1, petastorm_types=False) as reader:
        assert isinstance(next(iter(make_petastorm_dataset(reader))).pair, tf.RaggedTensor)


def test_nulls_inside_float_lists_of_plain_parquet_read_as_nan(tmp_path: Path) -> None:
    """Petastorm 0.13.1 read a null inside a float list as NaN (rows ``[1.5, nan]``, batches one ``(n, k)``
    array); unihub raised ``CodecError`` on the whole row group. A null inside an int list stays an error."""

    from unihub.errors import CodecError

    pq.write_table(pa.table({
        "id": pa.array(range(4)),
        "ragged": pa.array([[1.5, None, 2.0], None, [], [None]], pa.list_(pa.float32())),
        "pair": pa.array([[1.0, None], [2.0, 3.0], [None, None], [4.0, 5.0]], pa.list_(pa.float64())),
        "ints": pa.array([[1, None], [2, 3], [4, 5], [6, 7]], pa.list_(pa.int32())),
    }), tmp_path / "part.parquet")
    fields = ["id", "ragged", "pair"]
    with make_reader(str(tmp_path), schema_fields=fields, shuffle_row_groups=False, workers_count=1) as reader:
        rows = list(reader)
    np.testing.assert_array_equal(rows[0].ragged, np.array([1.5, np.nan, 2.0], np.float32))
    assert rows[1].ragged is None and rows[2].ragged.size == 0 and np.isnan(rows[3].ragged).all()
    np.testing.assert_array_equal(np.stack([r.pair for r in rows]), [[1, np.nan], [2, 3], [np.nan, np.nan], [4, 5]])
    with make_batch_reader(str(tmp_path), schema_fields=["pair"], workers_count=1) as reader:
        pair = next(iter(reader)).pair
    assert pair.dtype == np.float64 and pair.shape == (4, 2) and int(np.isnan(pair).sum()) == 3
    with pytest.raises(CodecError, match="'ints'"), make_batch_reader(str(tmp_path), schema_fields=["ints"],
                                                                       workers_count=1) as reader:
        next(iter(reader))


def test_timestamps_with_nulls_in_batches_are_datetime64_with_nat_as_petastorms(tmp_path: Path) -> None:
    """Petastorm 0.13.1's batches of a nullable timestamp column are one ``datetime64[unit]`` array with NaT;
    unihub gave an object array of None and ``np.datetime64`` (no ``.astype``, no arithmetic). An all-null
    row group keeps the stored unit; unihub's types (``petastorm_types=False``) keep None."""


    stamps = [None, datetime.datetime(2021, 1, 1, 0, 0, 1), None, datetime.datetime(2021, 1, 1, 0, 0, 3), None, None]
    pq.write_table(pa.table({"id": pa.array(range(6)), "ts": pa.array(stamps, pa.timestamp("ms"))}),
                   tmp_path / "part.parquet", row_group_size=4)
    with make_batch_reader(str(tmp_path), shuffle_row_groups=False, workers_count=1) as reader:
        batches = [b.ts for b in reader]
    assert [b.dtype for b in batches] == [np.dtype("datetime64[ms]")] * 2  # the second row group all null
    found = np.concatenate(batches)
    assert np.isnat(found).tolist() == [s is None for s in stamps]
    assert found[3] == np.datetime64("2021-01-01T00:00:03.000")
    with make_batch_reader(str(tmp_path), shuffle_row_groups=False, workers_count=1, petastorm_types=False) as reader:
        assert next(iter(reader)).ts[0] is None


def test_row_times_are_in_petastorms_units(tmp_path: Path) -> None:
    """Petastorm 0.13.1's rows held ``np.datetime64(pandas value)``: timestamps (stored in any unit) and durations
    in microseconds, dates in days; unihub's rows kept the stored unit (``datetime64[ns]`` from Spark's INT96).
    Batches keep the stored unit, as Petastorm's did; unihub's types (``petastorm_types=False``) keep it in rows."""


    moment = datetime.datetime(2021, 1, 1, 0, 0, 1, 250)
    pq.write_table(pa.table({
        "ns": pa.array([moment, None], pa.timestamp("ns")), "ms": pa.array([moment, moment], pa.timestamp("ms")),
        "tz": pa.array([moment, moment], pa.timestamp("s", tz="UTC")),
        "day": pa.array([datetime.date(2021, 1, 2), None], pa.date32()),
        "took": pa.array([datetime.timedelta(seconds=2), None], pa.duration("ns"))}), tmp_path / "part.parquet")
    with make_reader(str(tmp_path), shuffle_row_groups=False, workers_count=1) as reader:
        first, second = [row._asdict() for row in reader]
    assert {name: value.dtype.str[1:] for name, value in first.items()} == {
        "ns": "M8[us]", "ms": "M8[us]", "tz": "M8[us]", "day": "M8[D]", "took": "m8[us]"}
    assert first["ns"] == np.datetime64("2021-01-01T00:00:01.000250") and second["ns"] is None
    assert first["tz"] == np.datetime64("2021-01-01T00:00:01") and first["took"] == np.timedelta64(2, "s")
    with make_batch_reader(str(tmp_path), workers_count=1) as reader:
        assert next(iter(reader)).ns.dtype == np.dtype("M8[ns]")
    with make_reader(str(tmp_path), workers_count=1, petastorm_types=False) as reader:
        assert next(iter(reader)).ns.dtype == np.dtype("M8[ns]")
    # Petastorm dropped a nanosecond's digits; unihub keeps the stored unit where microseconds would change a value
    fine = np.array(["2021-01-01T00:00:01.000000001", "NaT"], "M8[ns]")
    pq.write_table(pa.table({"fine": pa.array(fine, pa.timestamp("ns")),
                             "far": pa.array([2 ** 61, 0], pa.int64()).cast(pa.timestamp("ms"))}),
                   tmp_path / "part.parquet")  # 2**61 ms is past what microseconds hold: numpy would wrap it
    with make_reader(str(tmp_path), shuffle_row_groups=False, workers_count=1) as reader:
        first, second = [row._asdict() for row in reader]
    assert first["fine"] == fine[0] and first["fine"].dtype == np.dtype("M8[ns]") and second["fine"] is None
    assert first["far"].astype(np.int64) == 2 ** 61 and first["far"].dtype == np.dtype("M8[ms]")
    assert second["far"] == np.datetime64(0, "ms")


def test_plain_parquet_with_ragged_lists_of_lists_reads_without_naming_fields(tmp_path: Path) -> None:
    """A plain ``list<list<int64>>`` column with inner lists of different lengths: Petastorm 0.13.1's inferred
    schema left it out (ARROW-1644) and read the rest; unihub's reads failed ("nested lists are ragged"), so
    a dataset Petastorm read needed ``schema_fields`` to read at all. Its ragged rows now come as object arrays
    of their inner arrays, even ones as 2-D arrays, in both readers."""

    nested = [[[1, 2], [3]], [[4, 5]], [], None]
    pq.write_table(pa.table({"id": pa.array(range(4)), "ll": pa.array(nested, pa.list_(pa.list_(pa.int64())))}),
                   tmp_path / "part.parquet")
    with make_reader(str(tmp_path), shuffle_row_groups=False, workers_count=1) as reader:
        rows = [row.ll for row in reader]
    with make_batch_reader(str(tmp_path), shuffle_row_groups=False, workers_count=1) as reader:
        assert [len(b.id) for b in reader] == [4]
    assert [a.tolist() for a in rows[0]] == [[1, 2], [3]] and rows[0].dtype == object
    assert rows[1].tolist() == [[4, 5]] and rows[1].dtype == np.int64
    assert rows[2].shape == (0, 0) and rows[3] is None


def test_asking_for_a_column_of_a_type_unihub_does_not_read_says_so(tmp_path: Path) -> None:
    """A plain Parquet struct column asked for by name was reported as matching 'no field in the dataset', though
    the files hold it; the warning (and the error, when nothing else matches) now names it with its type."""
    import warnings

    from unihub.errors import NoMatchingFieldsError

    pq.write_table(pa.table({"id": pa.array(range(3)), "st": pa.array([{"a": i} for i in range(3)])}),
                   tmp_path / "part.parquet")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with make_batch_reader(str(tmp_path), schema_fields=["id", "st"], workers_count=1) as reader:
            assert next(iter(reader))._fields == ("id",)
    assert any("'st' (struct<a: int64>) is a column of a type unihub does not read" in str(w.message) for w in caught)
    with pytest.raises(NoMatchingFieldsError, match=r"'st' \(struct<a: int64>\) is a column of a type"):
        make_reader(str(tmp_path), schema_fields=["st"])
