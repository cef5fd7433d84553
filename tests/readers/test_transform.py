"""TransformSpec: the schema change (Petastorm's rules), row and batch transforms in the reader, errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from unihub import ScalarCodec, SchemaError, TensorCodec, Unischema, UnischemaField, write_dataset
from unihub.readers.reader import make_batch_reader, make_reader
from unihub.readers.transform import TransformSpec, edit_field, transform_schema

NUM_ROWS = 40
POOLS = ("thread", "process", "dummy")

Schema = Unischema("T", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("vec", np.float32, (4,), TensorCodec(), False),
    UnischemaField("label", np.int32, (), ScalarCodec(pa.int32()), False),
    UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), False),
])


def make_row(i: int) -> dict:
    return {"id": i, "vec": np.arange(4, dtype=np.float32) + i, "label": i % 3, "name": f"n{i}"}


class TransformFailed(RuntimeError):
    """Raised by a user transform; must reach the consumer as itself."""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    url = str(tmp_path_factory.mktemp("transform") / "ds")
    write_dataset(url, Schema, (make_row(i) for i in range(NUM_ROWS)), rows_per_file=10)
    return url


def read_all(url: str, maker=make_reader, **kwargs):
    with maker(url, shuffle_row_groups=False, **kwargs) as reader:
        return reader.schema, list(reader)


# -- the schema -----------------------------------------------------------------------------------------
def test_transform_schema_follows_petastorm_order():
    spec = TransformSpec(edit_fields=[edit_field("vec", np.float64, (2, 2)), ("extra", np.str_, (), True)],
                         removed_fields=["name"])
    out = transform_schema(Schema, spec)
    # kept fields in order, then the edited ones in edit_fields order (Petastorm's transform_schema)
    assert list(out.fields) == ["id", "label", "vec", "extra"]
    assert out.vec.shape == (2, 2) and out.vec.numpy_dtype is np.float64 and out.vec.codec is None
    assert out.extra.nullable
    selected = transform_schema(Schema, TransformSpec(selected_fields=["name", "id"]))
    assert list(selected.fields) == ["name", "id"]
    assert transform_schema(Schema, None) is Schema


def test_transform_spec_argument_errors():
    with pytest.raises(SchemaError):
        TransformSpec(removed_fields=["name"], selected_fields=["id"])
    with pytest.raises(SchemaError):
        TransformSpec(lambda r: r, batch_format="arrow")
    with pytest.raises(SchemaError):
        transform_schema(Schema, TransformSpec(edit_fields=["not a field"]))
    with pytest.warns(UserWarning, match="no_such"):
        out = transform_schema(Schema, TransformSpec(removed_fields=["no_such", "name"]))
    assert list(out.fields) == ["id", "vec", "label"]


# -- make_reader: a function per row ------------------------------------------------------------------
def edit_row(row: dict) -> dict:
    row = dict(row)
    row["vec"] = (row["vec"].astype(np.float64) * 2).reshape(2, 2)
    row["label_name"] = f"L{row['label']}"
    del row["name"]
    return row


@pytest.mark.parametrize("pool", POOLS)
def test_row_transform_edits_values_and_shapes(dataset, pool):
    spec = TransformSpec(edit_row, edit_fields=[("vec", np.float64, (2, 2), False), ("label_name", np.str_, (), False)],
                         removed_fields=["name"])
    schema, rows = read_all(dataset, transform_spec=spec, reader_pool_type=pool, workers_count=2)
    assert list(schema.fields) == ["id", "label", "vec", "label_name"]
    assert schema.vec.shape == (2, 2) and schema.vec.numpy_dtype is np.float64
    assert [int(r.id) for r in rows] == list(range(NUM_ROWS))
    for row in rows:
        assert row._fields == ("id", "label", "vec", "label_name")
        i = int(row.id)
        assert row.vec.dtype == np.float64 and row.vec.shape == (2, 2)
        np.testing.assert_array_equal(row.vec, (np.arange(4) + i).reshape(2, 2) * 2)
        assert row.label_name == f"L{i % 3}"


def test_removed_and_selected_fields_without_func(dataset):
    schema, rows = read_all(dataset, transform_spec=TransformSpec(removed_fields=["vec", "name"]))
    assert list(schema.fields) == ["id", "label"]
    assert rows[5]._fields == ("id", "label") and int(rows[5].label) == 5 % 3
    schema, rows = read_all(dataset, transform_spec=TransformSpec(selected_fields=["name", "id"]))
    assert list(schema.fields) == ["name", "id"]
    assert [(r.name, int(r.id)) for r in rows[:3]] == [("n0", 0), ("n1", 1), ("n2", 2)]


def test_selected_fields_with_func_and_schema_fields(dataset):
    spec = TransformSpec(lambda row: {**row, "sum": float(row["vec"].sum())}, edit_fields=[("sum", np.float64, (), False)],
                         selected_fields=["sum", "id"])
    schema, rows = read_all(dataset, schema_fields=["id", "vec"], transform_spec=spec)
    assert list(schema.fields) == ["sum", "id"]
    assert [r.sum for r in rows] == [float((np.arange(4) + i).sum()) for i in range(NUM_ROWS)]


# -- make_batch_reader: a function per batch ----------------------------------------------------------
def edit_frame(frame):
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"expected a DataFrame, got {type(frame)}")
    frame = frame[frame["id"] % 2 == 0].copy()
    frame["double"] = frame["id"] * 2
    frame["vec"] = frame["vec"].map(lambda v: v + 100)
    return frame


@pytest.mark.parametrize("pool", ("thread", "process"))
def test_batch_transform_gets_a_pandas_dataframe(dataset, pool):
    spec = TransformSpec(edit_frame, edit_fields=[("double", np.int64, (), False)], removed_fields=["name"])
    schema, batches = read_all(dataset, make_batch_reader, transform_spec=spec, reader_pool_type=pool,
                               workers_count=2)
    assert list(schema.fields) == ["id", "vec", "label", "double"]
    ids = np.concatenate([b.id for b in batches])
    assert ids.tolist() == list(range(0, NUM_ROWS, 2))
    assert np.concatenate([b.double for b in batches]).tolist() == [2 * i for i in ids]
    vec = np.concatenate([b.vec for b in batches])
    assert vec.shape == (len(ids), 4)
    np.testing.assert_array_equal(vec, np.arange(4)[None, :] + ids[:, None] + 100)
    assert all(b._fields == ("id", "vec", "label", "double") for b in batches)


def test_batch_transform_with_numpy_format(dataset):
    def norms(columns):
        if not all(isinstance(v, np.ndarray) for v in columns.values()) or columns["vec"].shape[1:] != (4,):
            raise TypeError("expected numpy columns")
        return {"id": columns["id"], "norm": np.linalg.norm(columns["vec"], axis=1)}

    spec = TransformSpec(norms, edit_fields=[("norm", np.float64, (), False)], selected_fields=["norm", "id"],
                         batch_format="numpy")
    schema, batches = read_all(dataset, make_batch_reader, transform_spec=spec)
    assert list(schema.fields) == ["norm", "id"]
    norm = np.concatenate([b.norm for b in batches])
    expected = [np.linalg.norm(np.arange(4, dtype=np.float32) + i) for i in range(NUM_ROWS)]
    np.testing.assert_allclose(norm, expected, rtol=1e-6)


# -- errors -----------------------------------------------------------------------------------------------
def fail_on_25(row):
    if row["id"] == 25:
        raise TransformFailed("cannot transform row 25")
    return row


@pytest.mark.parametrize("pool", POOLS)
def test_a_failing_transform_surfaces_its_exception_and_stops_the_reader(dataset, pool):
    reader = make_reader(dataset, transform_spec=TransformSpec(fail_on_25), reader_pool_type=pool,
                         workers_count=2, shuffle_row_groups=False)
    delivered = []
    with pytest.raises(TransformFailed, match="cannot transform row 25"):
        for row in reader:
            delivered.append(int(row.id))
    assert delivered == list(range(20))  # the row groups before the failing one, nothing after
    assert reader.diagnostics["in_flight"] == 0
    with pytest.raises(TransformFailed):  # it does not skip the failed task and go on
        next(reader)
    reader.stop()
    reader.join()


@pytest.mark.parametrize("pool", ("thread", "process"))
def test_a_failing_batch_transform_surfaces_its_exception(dataset, pool):
    def fail(frame):
        raise TransformFailed(f"batch of {len(frame)} rows refused")

    with make_batch_reader(dataset, transform_spec=TransformSpec(fail), reader_pool_type=pool,
                           workers_count=2) as reader:
        with pytest.raises(TransformFailed, match="batch of 10 rows refused"):
            next(reader)


def test_a_row_transform_value_of_another_kind_than_declared_is_passed_on_not_cast(dataset):
    """A row transform that returns a float (or a string) for a field declared int, without ``edit_fields``: the
    rows held ``int32(label * 1.5)`` (4.5 -> 4, silently), or a bare ``ValueError: invalid literal for int()``.
    Petastorm passed the value on, as unihub's batch transforms do; a Python int still takes the declared type."""
    spec = TransformSpec(lambda r: {**r, "label": r["label"] * 1.5, "id": f"#{r['id']}", "vec": r["vec"]})
    _, rows = read_all(dataset, schema_fields=["id", "label", "vec"], transform_spec=spec, workers_count=1)
    assert [(r.id, float(r.label)) for r in rows[:3]] == [("#0", 0.0), ("#1", 1.5), ("#2", 3.0)]
    _, batches = read_all(dataset, make_batch_reader, schema_fields=["id", "label"], workers_count=1,
                          transform_spec=TransformSpec(lambda df: df.assign(label=df.label * 1.5)))
    assert batches[0].label[:3].tolist() == [0.0, 1.5, 3.0]
    _, rows = read_all(dataset, schema_fields=["id", "label"], workers_count=1,
                       transform_spec=TransformSpec(lambda r: {**r, "label": int(r["label"]) + 1}))
    assert rows[0].label == 1 and rows[0].label.dtype == np.int32


def test_a_row_transform_number_out_of_the_declared_range_is_passed_on_not_wrapped(dataset):
    """A row transform returning numbers a declared ``int32``/``float32`` cannot hold: the int raised a bare
    ``OverflowError`` from the reader and the float became inf. Petastorm passed such values on as they were;
    numbers that fit still take the declared type."""
    spec = TransformSpec(lambda r: {**r, "label": int(r["id"]) + 2 ** 40, "big": 1e300 * (int(r["id"]) + 1)},
                         edit_fields=[("big", np.float32, (), False)])
    _, rows = read_all(dataset, schema_fields=["id", "label"], transform_spec=spec, workers_count=1)
    assert [(int(r.label), float(r.big)) for r in rows[:2]] == [(2 ** 40, 1e300), (2 ** 40 + 1, 2e300)]
    spec = TransformSpec(lambda r: {**r, "label": int(r["id"]) + 7, "big": 0.5}, edit_fields=[("big", np.float32, (), False)])
    _, rows = read_all(dataset, schema_fields=["id", "label"], transform_spec=spec, workers_count=1)
    assert rows[0].label == 7 and rows[0].label.dtype == np.int32 and rows[0].big.dtype == np.float32


def test_a_transform_missing_a_declared_field_is_a_schema_error(dataset):
    spec = TransformSpec(lambda row: row, edit_fields=[("new", np.int64, (), False)])
    with pytest.raises(SchemaError, match="new"):
        read_all(dataset, transform_spec=spec)
    with pytest.raises(SchemaError, match="new"):
        read_all(dataset, make_batch_reader, transform_spec=spec)
    with pytest.raises(SchemaError, match="new"):
        read_all(dataset, transform_spec=TransformSpec(edit_fields=[("new", np.int64, (), False)]))


def test_a_transform_returning_the_wrong_type_is_a_schema_error(dataset):
    with pytest.raises(SchemaError, match="dict"):
        read_all(dataset, transform_spec=TransformSpec(lambda row: list(row.values())))
    with pytest.raises(SchemaError, match="DataFrame"):
        read_all(dataset, make_batch_reader, transform_spec=TransformSpec(lambda frame: frame.to_dict()))
