"""Codecs: column round trips (bit-exact), zero-copy tensors, Petastorm's .npy cells, the codec registry."""

from __future__ import annotations

import datetime
import decimal
import importlib
import io
import pickle
import re
import tracemalloc
import zipfile

import numpy as np
import pyarrow as pa
import pytest

import unihub.schema.codecs as codecs_package
from unihub import (
    CODECS,
    CodecError,
    CodecTypeError,
    CompressedImageCodec,
    CompressedNdarrayCodec,
    NdarrayCodec,
    ScalarCodec,
    SchemaError,
    TensorCodec,
    Unischema,
    UnischemaField,
    UnsupportedFormatError,
    ValidationError,
    make_reader,
    write_dataset,
)
from unihub.schema.codecs import Codec, codec_from_json
from unihub.schema.codecs.tensor import parquet_tensor_type

NUMERIC_DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
                  np.float16, np.float32, np.float64]


def random_values(dtype, shape, rng):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    values = rng.standard_normal(shape).astype(dtype)
    if values.size:  # the extremes and signed zero must survive bit-exactly too
        flat = values.reshape(-1)
        flat[0] = np.finfo(dtype).max
        flat[-1] = -0.0
    return values


def assert_rows_equal(decoded, expected):
    """``decoded`` (array or object array) holds exactly ``expected`` (arrays or None), bit for bit."""
    assert len(decoded) == len(expected)
    for i, (found, want) in enumerate(zip(decoded, expected, strict=True)):
        if want is None:
            assert found is None, f"row {i}: expected None, found {found!r}"
            continue
        assert isinstance(found, np.ndarray), f"row {i}: {type(found)}"
        assert found.dtype == want.dtype, f"row {i}: dtype {found.dtype} != {want.dtype}"
        assert found.shape == want.shape, f"row {i}: shape {found.shape} != {want.shape}"
        assert found.tobytes() == np.ascontiguousarray(want).tobytes(), f"row {i}: values differ"


def npy_bytes(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def chunked(array: pa.Array, *cuts: int) -> pa.ChunkedArray:
    bounds = [0, *cuts, len(array)]
    return pa.chunked_array([array.slice(a, b - a) for a, b in zip(bounds, bounds[1:], strict=False)], type=array.type)


# -- ScalarCodec -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
def test_scalar_numeric_round_trip(dtype):
    rng = np.random.default_rng(0)
    values = random_values(dtype, 20, rng)
    field = UnischemaField("x", dtype, (), ScalarCodec(dtype), False)
    array = field.codec.encode_column(field, values)
    assert array.type == pa.from_numpy_dtype(np.dtype(dtype))
    decoded = field.codec.decode_column(field, array)
    assert decoded.dtype == np.dtype(dtype) and decoded.shape == (20,)
    assert decoded.tobytes() == values.tobytes()
    # from a Python list of numpy scalars, too
    again = field.codec.decode_column(field, field.codec.encode_column(field, list(values)))
    assert again.tobytes() == values.tobytes()
    # sliced and chunked
    sliced = field.codec.decode_column(field, array.slice(3, 5))
    assert sliced.dtype == np.dtype(dtype) and sliced.tobytes() == values[3:8].tobytes()
    whole = field.codec.decode_column(field, chunked(array, 7, 12))
    assert whole.dtype == np.dtype(dtype) and whole.tobytes() == values.tobytes()


@pytest.mark.parametrize("dtype, arrow_type, values", [
    (np.int64, pa.int64(), [5, None, -3, None]),
    (np.float32, pa.float32(), [1.5, None, np.float32(3.25), None]),
    (np.uint64, pa.uint64(), [2**64 - 1, None, 0, 7]),
    (np.bool_, pa.bool_(), [True, None, False, True]),
])
def test_scalar_nulls_stay_none_and_values_keep_dtype(dtype, arrow_type, values):
    field = UnischemaField("x", dtype, (), ScalarCodec(arrow_type), True)
    array = field.codec.encode_column(field, values)
    assert array.null_count == values.count(None)
    decoded = field.codec.decode_column(field, array)
    assert decoded.dtype == object and decoded.shape == (4,)
    for found, want in zip(decoded, values, strict=True):
        if want is None:
            assert found is None
        else:
            assert type(found) is dtype and found == dtype(want)
    sliced = field.codec.decode_column(field, array.slice(1, 2))
    assert sliced[0] is None and type(sliced[1]) is dtype and sliced[1] == dtype(values[2])


@pytest.mark.parametrize("dtype, arrow_type, values", [
    (np.str_, pa.string(), ["a", "ünïcödé", "", None, "z" * 100]),
    (np.str_, pa.large_string(), ["a", None, "b"]),
    (np.bytes_, pa.binary(), [b"\x00\xff", None, b"", b"abc"]),
    (decimal.Decimal, pa.decimal128(10, 2), [decimal.Decimal("12345678.90"), None, decimal.Decimal("-0.01")]),
])
def test_scalar_object_round_trip(dtype, arrow_type, values):
    field = UnischemaField("x", dtype, (), ScalarCodec(arrow_type), True)
    array = field.codec.encode_column(field, values)
    assert array.type == arrow_type
    decoded = field.codec.decode_column(field, array)
    assert decoded.dtype == object
    assert list(decoded) == values
    assert [type(v) for v in decoded] == [type(v) for v in values]
    assert list(field.codec.decode_column(field, chunked(array, 1, 2))) == values
    assert list(field.codec.decode_column(field, array.slice(1, 2))) == values[1:3]


def test_scalar_decimal_keeps_scale():
    field = UnischemaField("x", decimal.Decimal, (), ScalarCodec(pa.decimal128(10, 2)), False)
    decoded = field.codec.decode_column(field, field.codec.encode_column(field, [decimal.Decimal("1.5")]))
    assert str(decoded[0]) == "1.50"


def test_scalar_timestamps_round_trip():
    field = UnischemaField("t", np.datetime64, (), ScalarCodec(pa.timestamp("ms")), True)
    values = [np.datetime64("2020-01-01T00:00:00.123"), None, np.datetime64("2021-06-30")]
    array = field.codec.encode_column(field, values)
    assert array.to_pylist() == [datetime.datetime(2020, 1, 1, 0, 0, 0, 123000), None,
                                 datetime.datetime(2021, 6, 30)]
    decoded = field.codec.decode_column(field, array)
    assert decoded[0] == np.datetime64("2020-01-01T00:00:00.123") and decoded[1] is None
    assert decoded[2] == np.datetime64("2021-06-30T00:00:00.000")
    dense = np.array(["2020-01-01T00:00:00.123", "1970-01-01"], dtype="M8[ms]")
    decoded = field.codec.decode_column(field, field.codec.encode_column(field, dense))
    assert decoded.dtype == np.dtype("M8[ms]") and decoded.tobytes() == dense.tobytes()
    ns = UnischemaField("t", np.datetime64, (), ScalarCodec(pa.timestamp("ns")), False)
    precise = [np.datetime64("2021-01-01T00:00:00.123456789")]
    assert ns.codec.decode_column(ns, ns.codec.encode_column(ns, precise))[0] == precise[0]
    utc = UnischemaField("t", np.datetime64, (), ScalarCodec(pa.timestamp("us", tz="UTC")), False)
    decoded = utc.codec.decode_column(utc, utc.codec.encode_column(utc, [np.datetime64("2020-02-03T04:05:06")]))
    assert decoded[0] == np.datetime64("2020-02-03T04:05:06")
    day = UnischemaField("d", np.datetime64, (), ScalarCodec(pa.date32()), False)
    decoded = day.codec.decode_column(day, day.codec.encode_column(day, [np.datetime64("2020-01-02")]))
    assert decoded[0] == np.datetime64("2020-01-02")


def test_scalar_dictionary_column_decodes():
    field = UnischemaField("x", np.str_, (), ScalarCodec(pa.string()), False)
    array = pa.array(["a", "b", "a"]).dictionary_encode()
    assert list(field.codec.decode_column(field, array)) == ["a", "b", "a"]


def test_scalar_codec_accepts_spellings():
    assert ScalarCodec(pa.int32()).storage_type == pa.int32()
    assert ScalarCodec(np.int32).storage_type == pa.int32()
    assert ScalarCodec("int32").storage_type == pa.int32()
    assert ScalarCodec(arrow_type=pa.float16()).storage_type == pa.float16()
    assert ScalarCodec(str).storage_type == pa.string()
    assert ScalarCodec(np.int32) == ScalarCodec(pa.int32())
    with pytest.raises(SchemaError, match="ScalarCodec needs"):
        ScalarCodec()


def test_scalar_encode_errors_name_the_field():
    field = UnischemaField("count", np.int8, (), ScalarCodec(pa.int8()), False)
    with pytest.raises(CodecError, match="field 'count': cannot store values as int8") as info:
        field.codec.encode_column(field, [1, 1000])
    assert info.value.field == "count"


def test_scalar_encode_refuses_what_is_not_one_scalar_as_petastorm_did():
    field = UnischemaField("count", np.int64, (), ScalarCodec(pa.int64()), False)
    assert field.codec.encode(field, np.array(7)) == 7 and field.codec.encode(field, np.int64(8)) == 8
    for value, found in [([1, 2], "a list"), ((1,), "a tuple"), (np.array([1]), r"an array of shape \(1,\)")]:
        # Petastorm's TypeError and words, unihub's class and detail
        with pytest.raises(CodecTypeError, match=f"Expected a scalar as a value for field 'count': found {found}"):
            field.codec.encode(field, value)
        with pytest.raises(TypeError):
            field.codec.encode_column(field, [7, value])  # the column path keeps the type
    shaped = UnischemaField("count", np.int64, (1,), ScalarCodec(pa.int64()), False)
    with pytest.raises(CodecError, match=r"The shape field of unischema_field 'count' must be an empty tuple .*"
                                         r"stores scalars, but the field's shape is \(1,\)"):
        shaped.codec.encode(shaped, 1)
    listed = UnischemaField("tags", np.str_, (None,), ScalarCodec(pa.list_(pa.string())), False)
    assert listed.codec.encode(listed, ["a", "b"]) == ["a", "b"]  # a list type holds lists


@pytest.mark.parametrize("lengths", [(2, 2, 2), (0, 0), (0, 1, 3)])
def test_scalar_list_of_numbers_without_nulls_decodes_to_an_array_per_row(lengths: tuple[int, ...]) -> None:
    """Was "setting an array element with a sequence" (the whole object column cast to the field's dtype), so a
    row group of such lists without a null could not be read."""
    field = UnischemaField("ids", np.int32, (None,), ScalarCodec(pa.list_(pa.int64())), True)
    array = pa.array([list(range(n)) for n in lengths], pa.list_(pa.int64()))
    decoded = field.codec.decode_column(field, array)
    assert decoded.dtype == object and decoded.shape == (len(lengths),)
    for cell, n in zip(decoded, lengths):
        assert cell.dtype == np.int32 and cell.tolist() == list(range(n))


# -- TensorCodec ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
def test_tensor_fixed_round_trip_zero_copy(dtype):
    rng = np.random.default_rng(1)
    values = random_values(dtype, (10, 2, 3), rng)
    field = UnischemaField("t", dtype, (2, 3), TensorCodec(), False)
    array = field.codec.encode_column(field, list(values))
    assert isinstance(array.type, pa.FixedShapeTensorType)
    assert list(array.type.shape) == [2, 3] and array.type.value_type == pa.from_numpy_dtype(np.dtype(dtype))
    decoded = field.codec.decode_column(field, array)
    assert decoded.dtype == np.dtype(dtype) and decoded.shape == (10, 2, 3)
    assert decoded.tobytes() == values.tobytes()
    if dtype is not np.bool_:  # Arrow packs booleans into bits: no view is possible
        assert array.storage.values.buffers()[1].address == decoded.__array_interface__["data"][0]
        sliced = field.codec.decode_column(field, array.slice(3, 5))
        assert sliced.shape == (5, 2, 3) and sliced.tobytes() == values[3:8].tobytes()
        assert np.shares_memory(sliced, decoded)
    whole = field.codec.decode_column(field, chunked(array, 4))
    assert whole.shape == (10, 2, 3) and whole.tobytes() == values.tobytes()


def test_tensor_fixed_zero_copy_from_parquet(tmp_path):
    import pyarrow.parquet as pq

    field = UnischemaField("t", np.float32, (4, 4), TensorCodec(), False)
    values = np.arange(5 * 16, dtype=np.float32).reshape(5, 4, 4)
    pq.write_table(pa.table({"t": field.codec.encode_column(field, values)}), tmp_path / "t.parquet")
    column = pq.read_table(tmp_path / "t.parquet").column("t")
    decoded = field.codec.decode_column(field, column)
    assert decoded.shape == (5, 4, 4) and decoded.dtype == np.float32
    np.testing.assert_array_equal(decoded, values)
    storage = column.chunk(0).storage
    start = storage.values.buffers()[1].address + storage.values.offset * 4
    assert decoded.__array_interface__["data"][0] == start


def test_tensor_fixed_encodes_a_whole_ndarray_column():
    field = UnischemaField("t", np.int32, (3,), TensorCodec(), False)
    values = np.arange(12, dtype=np.int32).reshape(4, 3)
    decoded = field.codec.decode_column(field, field.codec.encode_column(field, values))
    assert decoded.dtype == np.int32 and decoded.tobytes() == values.tobytes()


def test_tensor_fixed_with_nulls():
    field = UnischemaField("t", np.float64, (2, 2), TensorCodec(), True)
    values = [np.eye(2), None, np.full((2, 2), -1.0), None]
    array = field.codec.encode_column(field, values)
    assert array.null_count == 2
    decoded = field.codec.decode_column(field, array)
    assert decoded.dtype == object
    assert_rows_equal(decoded, values)
    assert_rows_equal(field.codec.decode_column(field, array.slice(1, 3)), values[1:])
    assert_rows_equal(field.codec.decode_column(field, chunked(array, 1, 3)), values)


def test_tensor_first_dim_none_round_trip():
    rng = np.random.default_rng(2)
    field = UnischemaField("boxes", np.float32, (None, 4), TensorCodec(), True)
    values = [random_values(np.float32, (n, 4), rng) if n >= 0 else None for n in (3, 0, -1, 1, 5, 2, -1, 4, 1)]
    array = field.codec.encode_column(field, values)
    assert array.type == pa.list_(pa.float32())
    assert_rows_equal(field.codec.decode_column(field, array), values)
    assert_rows_equal(field.codec.decode_column(field, array.slice(3, 5)), values[3:8])
    assert_rows_equal(field.codec.decode_column(field, chunked(array, 2, 6)), values)


def test_tensor_all_none_dims_round_trip():
    rng = np.random.default_rng(3)
    field = UnischemaField("r", np.int16, (None, None, 2), TensorCodec(), True)
    shapes = [(1, 3, 2), (0, 2, 2), None, (4, 1, 2), (2, 2, 2), None, (3, 0, 2), (1, 1, 2)]
    values = [None if s is None else random_values(np.int16, s, rng) for s in shapes]
    array = field.codec.encode_column(field, values)
    assert pa.types.is_struct(array.type)
    assert_rows_equal(field.codec.decode_column(field, array), values)
    assert_rows_equal(field.codec.decode_column(field, array.slice(3, 5)), values[3:8])
    assert_rows_equal(field.codec.decode_column(field, chunked(array, 1, 5)), values)


def test_tensor_variable_dims_that_happen_to_agree_still_decode():
    field = UnischemaField("r", np.uint8, (None, None), TensorCodec(), False)
    values = [np.full((2, 3), i, dtype=np.uint8) for i in range(4)]
    decoded = field.codec.decode_column(field, field.codec.encode_column(field, values))
    assert_rows_equal(decoded, values)


def test_tensor_scalar_field():
    field = UnischemaField("s", np.float32, (), TensorCodec(), False)
    values = np.array([1.5, -2.0, 3.25], dtype=np.float32)
    array = field.codec.encode_column(field, values)
    assert array.type == pa.float32()
    decoded = field.codec.decode_column(field, array)
    assert decoded.dtype == np.float32 and decoded.tobytes() == values.tobytes()


@pytest.mark.parametrize("storage", [
    pa.array([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [7.0, 8.0, 9.0, 10.0, 11.0, 12.0]], type=pa.list_(pa.float32())),
    pa.array([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [7.0, 8.0, 9.0, 10.0, 11.0, 12.0]], type=pa.list_(pa.float32(), 6)),
    pa.array([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [7.0, 8.0, 9.0, 10.0, 11.0, 12.0]], type=pa.large_list(pa.float32())),
    pa.array([[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [[7.0, 8.0, 9.0], [10.0, 11.0, 12.0]]],
             type=pa.list_(pa.list_(pa.float32()))),
    pa.array([[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [[7.0, 8.0, 9.0], [10.0, 11.0, 12.0]]],
             type=pa.list_(pa.list_(pa.float32(), 3), 2)),
], ids=["list", "fixed_size_list", "large_list", "list_of_lists", "fixed_of_fixed"])
def test_tensor_decodes_foreign_list_columns_with_the_field_shape(storage):
    field = UnischemaField("t", np.float32, (2, 3), TensorCodec(), False)
    decoded = field.codec.decode_column(field, storage)
    assert decoded.dtype == np.float32 and decoded.shape == (2, 2, 3)
    np.testing.assert_array_equal(decoded, np.arange(1, 13, dtype=np.float32).reshape(2, 2, 3))
    sliced = field.codec.decode_column(field, storage.slice(1, 1))
    assert sliced.shape == (1, 2, 3)
    np.testing.assert_array_equal(sliced[0], np.arange(7, 13, dtype=np.float32).reshape(2, 3))


def test_tensor_decodes_spark_arrays_with_none_dims():
    # Spark writes array<float> (list<element: float>) and array<array<int>>, nulls included
    field = UnischemaField("boxes", np.float32, (None, 4), TensorCodec(), True)
    storage = pa.array([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], None, []],
                       type=pa.list_(pa.field("element", pa.float32())))
    decoded = field.codec.decode_column(field, storage)
    assert_rows_equal(decoded, [np.arange(8, dtype=np.float32).reshape(2, 4), None,
                                np.zeros((0, 4), np.float32)])
    nested = UnischemaField("grid", np.int64, (None, None), TensorCodec(), False)
    storage = pa.array([[[1, 2], [3, 4], [5, 6]], [[7, 8, 9]]], type=pa.list_(pa.list_(pa.int64())))
    decoded = nested.codec.decode_column(nested, storage)
    assert_rows_equal(decoded, [np.array([[1, 2], [3, 4], [5, 6]]), np.array([[7, 8, 9]])])
    ragged = pa.array([[[1, 2]], [[1, 2], [3]]], type=pa.list_(pa.list_(pa.int64())))
    with pytest.raises(CodecError, match="field 'grid', row 1: nested lists are ragged"):
        nested.codec.decode_column(nested, ragged)


def test_tensor_wrong_size_list_is_codec_error():
    field = UnischemaField("t", np.float32, (2, 3), TensorCodec(), False)
    storage = pa.array([[1.0] * 6, [1.0] * 5], type=pa.list_(pa.float32()))
    with pytest.raises(CodecError, match=r"field 't', row 1: expected 6 values for shape \(2, 3\), found 5"):
        field.codec.decode_column(field, storage)


@pytest.mark.parametrize("value, message", [
    (np.zeros((2, 3), np.float64), "row 1: expected dtype float32, found float64"),
    (np.zeros((3, 2), np.float32), r"row 1: expected shape \(2, 3\), found \(3, 2\)"),
])
def test_tensor_encode_errors_name_field_and_row(value, message):
    field = UnischemaField("t", np.float32, (2, 3), TensorCodec(), False)
    with pytest.raises(CodecError, match=f"field 't', {message}") as info:
        field.codec.encode_column(field, [np.zeros((2, 3), np.float32), value])
    assert info.value.field == "t" and info.value.row == 1


# -- NdarrayCodec (Petastorm's np.save cells) ------------------------------------------------------
@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
def test_ndarray_bytes_are_np_save_bytes(dtype):
    rng = np.random.default_rng(4)
    field = UnischemaField("x", dtype, (3, 4), NdarrayCodec(), False)
    values = [random_values(dtype, (3, 4), rng) for _ in range(6)]
    array = field.codec.encode_column(field, values)
    assert array.type == pa.binary()
    assert array.to_pylist() == [npy_bytes(v) for v in values]
    assert field.codec.encode(field, values[0]) == npy_bytes(values[0])
    decoded = field.codec.decode_column(field, array)
    assert decoded.dtype == np.dtype(dtype) and decoded.shape == (6, 3, 4)
    assert decoded.tobytes() == np.stack(values).tobytes()
    sliced = field.codec.decode_column(field, array.slice(3, 2))
    assert sliced.shape == (2, 3, 4) and sliced.tobytes() == np.stack(values[3:5]).tobytes()
    assert field.codec.decode_column(field, chunked(array, 2)).tobytes() == np.stack(values).tobytes()


def test_ndarray_decodes_cells_written_by_np_save():
    field = UnischemaField("x", np.int16, (None, None), NdarrayCodec(), True)
    base = np.arange(24, dtype=np.int16)
    values = [
        base[:6].reshape(2, 3),
        np.asfortranarray(base[:12].reshape(3, 4)),
        None,
        base[:0].reshape(0, 5),
        base[:8].reshape(4, 2).T,  # a non-contiguous view, saved in Fortran order
        base.astype(">i2")[:4].reshape(2, 2).astype(np.int16),
    ]
    cells = pa.array([None if v is None else npy_bytes(v) for v in values], type=pa.binary())
    decoded = field.codec.decode_column(field, cells)
    assert decoded.dtype == object
    assert_rows_equal(decoded, values)
    assert_rows_equal(field.codec.decode_column(field, cells.slice(1, 4)), values[1:5])


def test_ndarray_decodes_fortran_order_fixed_shape():
    field = UnischemaField("x", np.float32, (3, 4), NdarrayCodec(), False)
    values = [np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4) * i) for i in range(5)]
    decoded = field.codec.decode_column(field, pa.array([npy_bytes(v) for v in values], type=pa.binary()))
    assert decoded.dtype == np.float32 and decoded.shape == (5, 3, 4)
    np.testing.assert_array_equal(decoded, np.stack(values))
    single = field.codec.decode(field, npy_bytes(values[2]))
    assert single.dtype == np.float32 and single.shape == (3, 4)
    np.testing.assert_array_equal(single, values[2])


def test_ndarray_big_endian_and_scalar_cells():
    field = UnischemaField("x", np.float64, (2,), NdarrayCodec(), False)
    big = np.array([1.5, -2.25], dtype=">f8")
    decoded = field.codec.decode(field, npy_bytes(big))
    np.testing.assert_array_equal(decoded, [1.5, -2.25])
    scalar = UnischemaField("s", np.int32, (), NdarrayCodec(), False)
    cells = pa.array([npy_bytes(np.int32(i)) for i in range(3)], type=pa.binary())
    decoded = scalar.codec.decode_column(scalar, cells)
    np.testing.assert_array_equal(decoded, [0, 1, 2])


def test_ndarray_refuses_pickled_objects():
    field = UnischemaField("x", np.float64, (2,), NdarrayCodec(), False)
    blob = npy_bytes(np.array([1, "a", None], dtype=object))
    assert b"\x80" in blob  # it holds a pickle
    with pytest.raises(CodecError, match="Python objects, which would need pickle; refused"):
        field.codec.decode(field, blob)
    with pytest.raises(CodecError, match="pickle"):
        field.codec.decode_column(field, pa.array([blob, blob], type=pa.binary()))


@pytest.mark.parametrize("blob, message", [
    (b"not an npy file at all", "not .npy bytes"),
    (npy_bytes(np.arange(10, dtype=np.float64))[:-8], "truncated"),
    (b"\x93NUMPY\x09\x00" + b"\x00" * 20, "version 9 is not supported"),
])
def test_ndarray_corrupt_cells_are_codec_errors(blob, message):
    field = UnischemaField("x", np.float64, (None,), NdarrayCodec(), False)
    with pytest.raises(CodecError, match=message):
        field.codec.decode_column(field, pa.array([blob], type=pa.binary()))


@pytest.mark.parametrize("value, message", [
    ([1.0, 2.0], "expected a numpy array of float64, found list"),
    (np.zeros(2, np.float32), "expected dtype float64, found float32"),
    (np.zeros(3), r"expected shape \(2,\), found \(3,\)"),
])
def test_ndarray_encode_checks_values(value, message):
    field = UnischemaField("x", np.float64, (2,), NdarrayCodec(), False)
    with pytest.raises(CodecError, match=f"field 'x': {message}"):
        field.codec.encode_column(field, [value])


# -- CompressedNdarrayCodec -----------------------------------------------------------------------
def test_compressed_ndarray_matches_savez_compressed():
    rng = np.random.default_rng(5)
    field = UnischemaField("m", np.int32, (None, 3), CompressedNdarrayCodec(), True)
    values = [rng.integers(-1000, 1000, size=(n, 3), dtype=np.int32) for n in (2, 0, 5)] + [None]
    array = field.codec.encode_column(field, values)
    assert array.type == pa.binary()
    for cell, value in zip(array.to_pylist(), values, strict=True):
        if value is None:
            assert cell is None
            continue
        theirs = io.BytesIO()
        np.savez_compressed(theirs, arr=value)
        with zipfile.ZipFile(io.BytesIO(cell)) as ours_zip, zipfile.ZipFile(theirs) as their_zip:
            assert ours_zip.namelist() == their_zip.namelist() == ["arr.npy"]
            assert ours_zip.getinfo("arr.npy").compress_type == zipfile.ZIP_DEFLATED
            assert ours_zip.read("arr.npy") == their_zip.read("arr.npy") == npy_bytes(value)
        with np.load(io.BytesIO(cell)) as archive:
            np.testing.assert_array_equal(archive["arr"], value)
    assert_rows_equal(field.codec.decode_column(field, array), values)
    assert_rows_equal(field.codec.decode_column(field, array.slice(1, 3)), values[1:])


def test_compressed_ndarray_decodes_savez_compressed_cells():
    field = UnischemaField("m", np.float32, (2, 2), CompressedNdarrayCodec(), False)
    values = [np.full((2, 2), i, dtype=np.float32) for i in range(3)]
    cells = []
    for value in values:
        buffer = io.BytesIO()
        np.savez_compressed(buffer, arr=value)
        cells.append(buffer.getvalue())
    decoded = field.codec.decode_column(field, pa.array(cells, type=pa.binary()))
    assert decoded.dtype == np.float32 and decoded.shape == (3, 2, 2)
    np.testing.assert_array_equal(decoded, np.stack(values))


def test_compressed_ndarray_refuses_pickled_objects():
    field = UnischemaField("m", np.float32, (2,), CompressedNdarrayCodec(), False)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, arr=np.array([{"evil": 1}, None], dtype=object))
    with pytest.raises(CodecError, match="field 'm', row 0: .npy holds Python objects, which would need pickle"):
        field.codec.decode_column(field, pa.array([buffer.getvalue()], type=pa.binary()))



# -- cells that contradict their field (Petastorm returned them as they were) ----------------------
def npz_bytes(array) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, arr=array)
    return buffer.getvalue()


@pytest.mark.parametrize("cells, message", [
    # one header for the column: the vectorised path checks it once
    ([np.zeros(4, np.float64)] * 3, "field 'x', row 0: the stored array is float64, the field is float32"),
    ([np.zeros(5, np.float32)] * 3, r"field 'x', row 0: the stored array has shape \(5,\), the field \(4,\)"),
    ([np.zeros((2, 2), np.float32)] * 3, r"field 'x', row 0: the stored array has shape \(2, 2\), the field \(4,\)"),
    # headers differ: cell by cell, the first bad row named
    ([np.zeros(4, np.float32), np.ones(4, np.float32), np.zeros(4, np.int32)],
     "field 'x', row 2: the stored array is int32, the field is float32"),
    ([np.zeros(4, np.float32), np.zeros(3, np.float32)], r"field 'x', row 1: the stored array has shape \(3,\)"),
])
def test_ndarray_cells_that_contradict_the_field_are_codec_errors(cells, message):
    field = UnischemaField("x", np.float32, (4,), NdarrayCodec(), True)
    column = pa.array([npy_bytes(c) for c in cells], type=pa.binary())
    with pytest.raises(CodecError, match=message) as info:
        field.codec.decode_column(field, column)
    assert info.value.field == "x" and info.value.row == int(re.search(r"row (\d+)", message).group(1))
    with pytest.raises(CodecError, match="field 'x': the stored array"):
        field.codec.decode(field, npy_bytes(cells[-1]))


def test_ndarray_free_dims_take_any_size_but_not_another_rank():
    field = UnischemaField("v", np.int16, (None, 3), NdarrayCodec(), True)
    good = [np.zeros((n, 3), np.int16) for n in (0, 1, 5)]
    assert_rows_equal(field.codec.decode_column(field, pa.array([npy_bytes(v) for v in good] + [None])), good + [None])
    bad = pa.array([npy_bytes(good[1]), npy_bytes(np.zeros((2, 4), np.int16))])
    with pytest.raises(CodecError, match=r"row 1: the stored array has shape \(2, 4\), the field \(None, 3\)"):
        field.codec.decode_column(field, bad)
    with pytest.raises(CodecError, match=r"row 0: the stored array has shape \(3,\)"):
        field.codec.decode_column(field, pa.array([npy_bytes(np.zeros(3, np.int16))]))


def test_ndarray_cell_with_a_giant_declared_shape_is_refused_before_allocating():
    header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000,), }".ljust(117) + b"\n"
    cell = b"\x93NUMPY\x01\x00v\x00" + header + b"\0" * 8
    assert len(cell) == 136
    field = UnischemaField("x", np.float64, (None,), NdarrayCodec(), False)
    tracemalloc.start()
    try:
        with pytest.raises(CodecError, match=r"field 'x', row 1: .npy data at byte 128 is truncated: shape "
                                             r"\(1000000000,\) of float64 is 8,000,000,000 bytes, found 8"):
            field.codec.decode_column(field, pa.array([npy_bytes(np.zeros(1)), cell]))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10 * 2**20


def test_compressed_ndarray_cells_that_contradict_the_field():
    field = UnischemaField("m", np.uint8, (8, 8), CompressedNdarrayCodec(), False)
    good = np.arange(64, dtype=np.uint8).reshape(8, 8)
    assert_rows_equal(field.codec.decode_column(field, pa.array([npz_bytes(good)])), [good])
    assert field.codec.decode(field, npz_bytes(good)).flags.writeable
    for value, message in ((np.zeros((8, 9), np.uint8), r"the stored array has shape \(8, 9\), the field \(8, 8\)"),
                           (np.zeros((8, 8), np.int64), "the stored array is int64, the field is uint8")):
        with pytest.raises(CodecError, match=f"field 'm', row 1: {message}") as info:
            field.codec.decode_column(field, pa.array([npz_bytes(good), npz_bytes(value)]))
        assert info.value.row == 1


def test_compressed_ndarray_hostile_archives_are_codec_errors():
    field = UnischemaField("m", np.float64, (None,), CompressedNdarrayCodec(), False)
    giant = io.BytesIO()
    with zipfile.ZipFile(giant, "w", zipfile.ZIP_DEFLATED) as archive:  # a header claiming 8 GB, 8 bytes of data
        archive.writestr("arr.npy", b"\x93NUMPY\x01\x00v\x00" +
                         b"{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000,), }".ljust(117) + b"\n" +
                         b"\0" * 8)
    other = io.BytesIO()
    np.savez_compressed(other, data=np.zeros(3))
    bombs = []
    for method in (zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA):  # 64 MB of zeros in a few KB: was inflated whole
        bomb = io.BytesIO()
        with zipfile.ZipFile(bomb, "w", method) as archive:
            archive.writestr("arr.npy", b"\x93NUMPY\x01\x00v\x00" +
                             b"{'descr': '<f8', 'fortran_order': False, 'shape': (8388608,), }".ljust(117) + b"\n" +
                             bytes(2**26))
        bombs.append((bomb.getvalue(), f"compressed by method {method}, not stored or deflated as numpy writes it"))
    cases = [*bombs, (giant.getvalue(), "truncated: shape \\(1000000000,\\) of float64 is 8,000,000,000 bytes"),
             (other.getvalue(), "the .npz holds no array 'arr'"),
             (b"PK\x03\x04 not really a zip", "not a readable .npz"),
             (npz_bytes(np.zeros(4))[:-30], "not a readable .npz")]
    for cell, message in cases:
        tracemalloc.start()
        try:
            with pytest.raises(CodecError, match=f"field 'm', row 0: .*{message}"):
                field.codec.decode_column(field, pa.array([cell]))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 10 * 2**20, message

# -- registry, equality, JSON ---------------------------------------------------------------------
ALL_CODECS = [
    ScalarCodec(pa.int16()),
    ScalarCodec(pa.timestamp("us", tz="UTC")),
    TensorCodec(),
    CompressedImageCodec("png"),
    CompressedImageCodec("jpeg", quality=73),
    NdarrayCodec(),
    CompressedNdarrayCodec(),
]


def test_registry_knows_every_codec_by_name():
    assert CODECS.names() == ["compressed_image", "compressed_ndarray", "ndarray", "scalar", "tensor"]
    assert CODECS.get("scalar") is ScalarCodec
    assert CODECS.get("tensor") is TensorCodec
    assert CODECS.get("compressed_image") is CompressedImageCodec
    assert CODECS.get("ndarray") is NdarrayCodec
    assert CODECS.get("compressed_ndarray") is CompressedNdarrayCodec
    assert "tensor" in CODECS and "nope" not in CODECS


def test_each_codec_has_its_module_and_the_package_keeps_every_public_name():
    """One module per codec; what the one codecs module offered is still importable from the package."""
    homes = {"ScalarCodec": "scalar", "TensorCodec": "tensor", "CompressedImageCodec": "image",
             "NdarrayCodec": "ndarray", "CompressedNdarrayCodec": "ndarray", "Codec": "base", "CODECS": "base",
             "register_codec": "base", "codec_from_json": "base", "column_as_array": "base",
             "stack_if_fixed": "base", "type_is_spark": "scalar", "parquet_tensor_type": "tensor",
             "tensor_to_parquet": "tensor", "tensor_from_parquet": "tensor", "image_pixels_allowed": "image",
             "BinaryCells": "binary", "Spans": "binary", "binary_views": "binary", "spans_at": "binary"}
    for name, module in homes.items():
        home = importlib.import_module(f"unihub.schema.codecs.{module}")
        assert getattr(codecs_package, name) is getattr(home, name), name
    assert sorted(codecs_package.__all__) == sorted(homes)
    for name in CODECS.names():
        assert CODECS.get(name).__module__.rsplit(".", 1)[1] == homes[CODECS.get(name).__name__]


@pytest.mark.parametrize("codec", ALL_CODECS, ids=repr)
def test_codec_json_round_trip(codec):
    data = codec.to_json()
    assert data["type"] == type(codec).json_name
    back = codec_from_json(data)
    assert type(back) is type(codec) and back == codec and hash(back) == hash(codec)
    assert back.config() == codec.config()
    assert codec_from_json(pickle.loads(pickle.dumps(data))) == codec


def test_unknown_codec_name_lists_valid_names():
    with pytest.raises(UnsupportedFormatError) as info:
        codec_from_json({"type": "zstd_tensor"})
    assert str(info.value) == ("unknown codec 'zstd_tensor'; valid names: "
                               "compressed_image, compressed_ndarray, ndarray, scalar, tensor")
    with pytest.raises(SchemaError, match="has no 'type'"):
        codec_from_json({"quality": 3})


def test_codecs_equal_and_hash_by_config():
    assert ScalarCodec(pa.int16()) == ScalarCodec(np.int16)
    assert hash(ScalarCodec(pa.int16())) == hash(ScalarCodec(np.int16))
    assert ScalarCodec(pa.int16()) != ScalarCodec(pa.int32())
    assert ScalarCodec(pa.timestamp("ms")) != ScalarCodec(pa.timestamp("ms", tz="UTC"))
    assert CompressedImageCodec("jpg", 73) == CompressedImageCodec("jpeg", quality=73)
    assert CompressedImageCodec("jpeg", 73) != CompressedImageCodec("jpeg", 74)
    assert CompressedImageCodec("png") != CompressedImageCodec("jpeg")
    assert TensorCodec() == TensorCodec() and hash(TensorCodec()) == hash(TensorCodec())
    assert NdarrayCodec() != CompressedNdarrayCodec()
    assert TensorCodec() != NdarrayCodec()
    assert len({*ALL_CODECS, *[codec_from_json(c.to_json()) for c in ALL_CODECS]}) == len(ALL_CODECS)
    assert repr(CompressedImageCodec("jpeg", 73)) == "CompressedImageCodec('jpeg', 73)"  # Petastorm's str()


@pytest.mark.parametrize("args, message", [
    (("gif",), "supports 'png' and 'jpeg', not 'gif'"),
    (("jpeg", 101), "quality must be within 0..100, got 101"),
    (("jpeg", -1), "quality must be within 0..100, got -1"),
    (("jpeg", 50.7), "quality must be within 0..100, got 50.7"),  # was cut to 50 without a word
    (("jpeg", True), "quality must be within 0..100, got True"),  # was quality 1
    (("jpeg", "high"), "quality must be within 0..100, got 'high'"),  # was int()'s raw ValueError
])
def test_image_codec_rejects_bad_config(args, message):
    with pytest.raises(SchemaError, match=message):
        CompressedImageCodec(*args)


def test_a_codec_is_one_class():
    class DoubleCodec(Codec):
        """A toy codec: stores x * 2 as float64."""

        def arrow_type(self, field):
            return pa.float64()

        def encode(self, field, value):
            return float(value) * 2

        def decode(self, field, value):
            return np.float64(value / 2)

    field = UnischemaField("d", np.float64, (), DoubleCodec(), True)
    array = field.codec.encode_column(field, [1.0, None, 2.5])
    assert array.to_pylist() == [2.0, None, 5.0]
    decoded = field.codec.decode_column(field, array)
    assert list(decoded) == [1.0, None, 2.5]


# -- CompressedImageCodec (needs images/decoders.py and its decoders) ------------------------------
def _images_module():
    try:
        from unihub.images import decoders as images
    except ImportError as exc:  # the decoder libraries are missing
        pytest.skip(f"image decoders are not available: {exc}")
    return images


def image_values(shape, n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=shape, dtype=np.uint8) for _ in range(n)]


@pytest.mark.parametrize("shape", [(16, 20, 3), (9, 7, 4), (12, 5)], ids=["rgb", "rgba", "gray"])
def test_png_round_trip_is_lossless(shape):
    _images_module()
    field = UnischemaField("img", np.uint8, shape, CompressedImageCodec("png"), False)
    values = image_values(shape, 6)
    array = field.codec.encode_column(field, values)
    assert array.type == pa.binary()
    assert all(cell.startswith(b"\x89PNG\r\n\x1a\n") for cell in array.to_pylist())
    decoded = field.codec.decode_column(field, array)
    assert decoded.dtype == np.uint8 and decoded.shape == (6, *shape)
    assert decoded.tobytes() == np.stack(values).tobytes()
    sliced = field.codec.decode_column(field, array.slice(3, 2))
    assert sliced.shape == (2, *shape) and sliced.tobytes() == np.stack(values[3:5]).tobytes()
    whole = field.codec.decode_column(field, chunked(array, 2, 4))
    assert whole.tobytes() == np.stack(values).tobytes()


def test_image_encode_refuses_an_image_that_does_not_fit_the_field():
    _images_module()
    field = UnischemaField("img", np.uint8, (4, 4, 3), CompressedImageCodec("png"), False)
    assert field.codec.encode(field, np.zeros((4, 4, 3), np.uint8)).startswith(b"\x89PNG")
    for shape in [(5, 4, 3), (4, 4), (4, 4, 1)]:
        with pytest.raises(CodecError, match=rf"Unexpected dimensions of 'img' feature: expected an image of shape "
                                             rf"\(4, 4, 3\), found {re.escape(str(shape))}"):
            field.codec.encode(field, np.zeros(shape, np.uint8))
    any_size = UnischemaField("img", np.uint8, (None, None, 3), CompressedImageCodec("png"), False)
    assert any_size.codec.encode(any_size, np.zeros((5, 9, 3), np.uint8)).startswith(b"\x89PNG")


def test_png_nulls_and_variable_shapes():
    _images_module()
    field = UnischemaField("img", np.uint8, (None, None, 3), CompressedImageCodec("png"), True)
    values = [image_values((4, 6, 3), 1)[0], None, image_values((7, 2, 3), 1, seed=1)[0]]
    array = field.codec.encode_column(field, values)
    assert array.null_count == 1
    decoded = field.codec.decode_column(field, array)
    assert decoded.dtype == object
    assert_rows_equal(decoded, values)
    raw = field.codec.decode_column(field, array, decode=False)
    assert list(raw) == array.to_pylist() and raw[1] is None


def test_jpeg_quality_and_closeness():
    _images_module()
    yy, xx = np.mgrid[0:32, 0:48]
    smooth = np.stack([yy * 8, xx * 5, (yy + xx) * 3], axis=-1).astype(np.uint8)
    low = UnischemaField("img", np.uint8, (32, 48, 3), CompressedImageCodec("jpeg", quality=10), False)
    high = UnischemaField("img", np.uint8, (32, 48, 3), CompressedImageCodec("jpeg", quality=95), False)
    low_bytes = low.codec.encode(low, smooth)
    high_bytes = high.codec.encode(high, smooth)
    assert low_bytes.startswith(b"\xff\xd8\xff") and high_bytes.startswith(b"\xff\xd8\xff")
    assert len(low_bytes) < len(high_bytes)
    decoded = high.codec.decode_column(high, pa.array([high_bytes, low_bytes], type=pa.binary()))
    assert decoded.dtype == np.uint8 and decoded.shape == (2, 32, 48, 3)
    assert np.abs(decoded[0].astype(int) - smooth).mean() < 3
    assert np.abs(decoded[0].astype(int) - smooth).mean() < np.abs(decoded[1].astype(int) - smooth).mean()


def test_image_bytes_are_stored_as_given_and_opencv_pngs_decode_to_rgb():
    cv2 = pytest.importorskip("cv2")
    _images_module()
    field = UnischemaField("img", np.uint8, (8, 8, 3), CompressedImageCodec("jpeg", quality=50), False)
    rgb = image_values((8, 8, 3), 1)[0]
    ok, png = cv2.imencode(".png", rgb[..., ::-1])  # OpenCV writes BGR, as Petastorm did
    assert ok
    array = field.codec.encode_column(field, [png.tobytes()])
    assert array.to_pylist() == [png.tobytes()]  # no re-encode, even in a jpeg field
    decoded = field.codec.decode_column(field, array)
    assert decoded.tobytes() == rgb.tobytes()


def test_image_errors_name_field_and_row():
    _images_module()
    field = UnischemaField("img", np.uint8, (8, 8, 3), CompressedImageCodec("png"), False)
    good_png = field.codec.encode(field, np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(CodecError, match="field 'img', row 1: 4 bytes are neither PNG nor JPEG") as bad_bytes:
        field.codec.encode_column(field, [good_png, b"GIF8"])
    assert bad_bytes.value.row == 1
    with pytest.raises(CodecError, match="field 'img': 4 bytes are neither PNG nor JPEG"):
        field.codec.encode_column(field, [bytearray(b"GIF8")])  # not bytes: the value-by-value path
    with pytest.raises(CodecError, match="Unexpected type of 'img' feature: expected an image of dtype uint8, "
                                         "found float32"):
        field.codec.encode_column(field, [np.zeros((8, 8, 3), np.float32)])
    good = field.codec.encode(field, np.zeros((8, 8, 3), np.uint8))
    cells = pa.array([good, good[: len(good) // 2]], type=pa.binary())
    with pytest.raises(CodecError, match="field 'img', row 1: corrupt or mismatched PNG image") as info:
        field.codec.decode_column(field, cells)
    assert info.value.row == 1
    wrong = field.codec.encode(UnischemaField("img", np.uint8, (5, 5, 3), CompressedImageCodec("png")),
                               np.zeros((5, 5, 3), np.uint8))
    with pytest.raises(ValidationError, match=r"field 'img': expected an image of shape \(8, 8, 3\), "
                                              r"found PNG bytes of shape \(5, 5, 3\)"):
        field.validate(wrong)
    with pytest.raises(CodecError, match="field 'img', row 0"):
        field.codec.decode_column(field, pa.array([wrong], type=pa.binary()))


def test_encoded_image_bytes_are_checked_for_bit_depth(tmp_path):
    # bytes already PNG/JPEG are stored as given: a 16-bit PNG in a uint8 field (or 8-bit in uint16) and a JPEG
    # in a uint16 field were written, their shape checked, and failed only when read ("corrupt or mismatched")
    images = _images_module()
    gray8 = UnischemaField("img", np.uint8, (4, 5), CompressedImageCodec("png"), False)
    gray16 = UnischemaField("img", np.uint16, (4, 5), CompressedImageCodec("png"), False)
    png16 = images.encode_image(np.full((4, 5), 40000, np.uint16), "png")
    png8 = images.encode_image(np.zeros((4, 5), np.uint8), "png")
    jpeg8 = images.encode_image(np.zeros((4, 5), np.uint8), "jpeg", 90)
    for field, data, found in ((gray8, png16, "PNG bytes of uint16 pixels"),
                               (gray16, png8, "PNG bytes of uint8 pixels"),
                               (gray16, jpeg8, "JPEG bytes of uint8 pixels")):
        with pytest.raises(ValidationError, match=f"field 'img', row 3: expected an image of dtype "
                                                  f"{np.dtype(field.dtype).name}, found {found}"):
            field.validate(data, row=3)
    gray8.validate(png8)
    gray16.validate(png16)
    schema = Unischema("S", [gray8])
    with pytest.raises(ValidationError, match="row 1: expected an image of dtype uint8"):
        write_dataset(tmp_path / "ds", schema, [{"img": png8}, {"img": png16}])
    assert not (tmp_path / "ds").exists()
    write_dataset(tmp_path / "ds", schema, [{"img": png8}])
    with make_reader(str(tmp_path / "ds"), workers_count=1) as reader:
        assert next(iter(reader)).img.tolist() == np.zeros((4, 5), np.uint8).tolist()


@pytest.mark.parametrize("shape", [(8, 8, 3), (None, None, 3)], ids=["fixed", "variable"])
def test_image_decode_blobs_is_decode_column_on_the_bytes(shape):
    # a shuffling loader decodes the bytes it queued (readers/late_decode.py) with decode_blobs: the
    # same values, nulls and errors as decode_column on the stored column
    _images_module()
    field = UnischemaField("img", np.uint8, shape, CompressedImageCodec("jpeg"), True)
    rng = np.random.default_rng(3)
    blobs = [field.codec.encode(field, rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)) for _ in range(4)]
    for cells in (blobs, [blobs[0], None, blobs[2]]):
        stored = field.codec.decode_column(field, pa.array(cells, type=pa.binary()))
        queued = field.codec.decode_blobs(field, list(cells))
        assert stored.dtype == queued.dtype and stored.shape == queued.shape
        for a, b in zip(stored, queued):
            assert (a is None and b is None) or a.tobytes() == b.tobytes()
    truncated = [blobs[0], blobs[1][: len(blobs[1]) // 2]]
    with pytest.raises(CodecError, match="field 'img', row 1: corrupt or mismatched JPEG image") as info:
        field.codec.decode_blobs(field, truncated)
    assert info.value.row == 1


@pytest.mark.parametrize("shape", [(8, 8, 3), (None, None, 3)], ids=["fixed", "variable"])
def test_a_corrupt_image_is_named_by_its_own_format(shape):
    # an image folder mixing PNG and JPEG keeps each file's bytes under the majority's codec: a corrupt JPEG
    # in a PNG field was "corrupt or mismatched PNG image: ... corrupt or truncated JPEG"
    images = _images_module()
    field = UnischemaField("img", np.uint8, shape, CompressedImageCodec("png"), False)
    jpeg = images.encode_image(np.zeros((8, 8, 3), np.uint8), "jpeg", 90)
    png = images.encode_image(np.zeros((8, 8, 3), np.uint8), "png")
    broken = jpeg[:len(jpeg) - 40] + b"\0" * 30 + jpeg[-10:]
    with pytest.raises(CodecError, match="field 'img', row 1: corrupt or mismatched JPEG image") as info:
        field.codec.decode_column(field, pa.array([png, broken], type=pa.binary()))
    assert info.value.row == 1 and "PNG" not in str(info.value)


def test_scalar_decodes_spark_decimal_uint64():
    # Spark has no unsigned types: a uint64 field is stored as decimal(20, 0)
    field = UnischemaField("big", np.uint64, (), ScalarCodec(pa.uint64()), True)
    stored = pa.array([decimal.Decimal(2**64 - 1), decimal.Decimal(0), decimal.Decimal(2**63 + 5)],
                      type=pa.decimal128(20, 0))
    decoded = field.codec.decode_column(field, stored)
    assert decoded.dtype == np.uint64
    assert decoded.tolist() == [2**64 - 1, 0, 2**63 + 5]
    with_null = field.codec.decode_column(field, pa.array([decimal.Decimal(7), None], type=pa.decimal128(20, 0)))
    assert with_null[1] is None and type(with_null[0]) is np.uint64 and with_null[0] == 7


def test_tensor_decodes_spark_struct_with_list_shapes_and_null_rows():
    # Spark writes struct<data: array<T>, shape: array<int>>; a null row has an empty shape list
    field = UnischemaField("r", np.uint8, (None, None), TensorCodec(), True)
    struct = pa.struct([("data", pa.list_(pa.uint8())), ("shape", pa.list_(pa.int32()))])
    stored = pa.array([{"data": [1, 2, 3, 4, 5, 6], "shape": [2, 3]}, None, {"data": [7, 8], "shape": [1, 2]}],
                      type=struct)
    expected = [np.arange(1, 7, dtype=np.uint8).reshape(2, 3), None, np.array([[7, 8]], dtype=np.uint8)]
    assert_rows_equal(field.codec.decode_column(field, stored), expected)
    assert_rows_equal(field.codec.decode_column(field, stored.slice(1)), expected[1:])
    bad = pa.array([{"data": [1, 2, 3, 4, 5], "shape": [2, 3]}], type=struct)
    with pytest.raises(CodecError, match=r"field 'r', row 0: 5 values do not fit the stored shape \(2, 3\)"):
        field.codec.decode_column(field, bad)


def test_tensor_decodes_struct_with_fixed_size_list_data():
    # struct<data: fixed_size_list<T, n>, shape: ...> (another writer's layout): n values a row,
    # reshaped to each row's stored shape (the data's offsets were None and crashed the decode)
    field = UnischemaField("r", np.float32, (None, None), TensorCodec(), False)
    data = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(8, dtype=np.float32)), 4)
    shapes = pa.FixedSizeListArray.from_arrays(pa.array([2, 2, 1, 4], pa.int32()), 2)
    stored = pa.StructArray.from_arrays([data, shapes], names=["data", "shape"])
    expected = [np.arange(4, dtype=np.float32).reshape(2, 2), np.arange(4, 8, dtype=np.float32).reshape(1, 4)]
    assert_rows_equal(field.codec.decode_column(field, stored), expected)
    assert_rows_equal(field.codec.decode_column(field, stored.slice(1)), expected[1:])


@pytest.mark.parametrize("shape", [(2**61, 3), (2**31, 2**20, 2**10), (2**31,)])
def test_a_tensor_shape_arrow_cannot_hold_is_a_schema_error(shape: tuple[int, ...]) -> None:
    # As a features.json of TFDS or a hostile Unischema may declare: pa.fixed_shape_tensor's OverflowError or
    # ArrowInvalid escaped, and the writer's pa.binary(width) overflowed first.
    field = UnischemaField("t", np.float32, shape, TensorCodec())
    assert parquet_tensor_type(field) is None  # no fixed_size_binary is that wide: not stored as bytes
    with pytest.raises(SchemaError, match=re.escape(f"field 't': shape {shape} is larger than an Arrow tensor holds")):
        field.arrow_type()
