"""schema/arrow_numpy.py gives what pyarrow's ``to_numpy(zero_copy_only=False)`` gives, value for value
and dtype for dtype, on sliced, chunk-offset, empty and null-holding arrays of every type it handles."""

from __future__ import annotations

import resource
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from unihub.schema.arrow_numpy import (
    ALIGNMENT,
    arrow_backed_empty,
    fixed_width_cells,
    from_fixed_width_cells,
    int64_array,
    numpy_dtype,
    to_numpy,
    without_validity,
)

TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(),
         pa.float16(), pa.float32(), pa.float64(), pa.bool_(), pa.string(), pa.large_string(), pa.binary(),
         pa.large_binary(), pa.timestamp("us"), pa.date32(), pa.list_(pa.int32())]


def _values(arrow_type: pa.DataType, n: int, rng: np.random.Generator) -> pa.Array:
    if pa.types.is_floating(arrow_type):
        data = rng.standard_normal(n).astype(arrow_type.to_pandas_dtype())
    elif pa.types.is_integer(arrow_type):
        info = np.iinfo(arrow_type.to_pandas_dtype())
        data = rng.integers(info.min, info.max, n, dtype=arrow_type.to_pandas_dtype(), endpoint=True)
    elif pa.types.is_boolean(arrow_type):
        data = rng.random(n) < 0.5
    elif pa.types.is_timestamp(arrow_type) or pa.types.is_date(arrow_type):
        return pa.array(rng.integers(0, 10**6, n).tolist(), pa.int32() if pa.types.is_date(arrow_type) else pa.int64()
                        ).cast(arrow_type)
    elif pa.types.is_list(arrow_type):
        return pa.array([[int(v)] * int(v % 3) for v in rng.integers(0, 9, n)], arrow_type)
    else:
        text = [f"s{v}\u00e9" for v in rng.integers(0, 1000, n)]
        return pa.array([t.encode() for t in text] if "binary" in str(arrow_type) else text, arrow_type)
    return pa.array(data, arrow_type)


@pytest.mark.parametrize("arrow_type", TYPES, ids=str)
def test_the_same_values_and_dtype_as_pyarrows_conversion(arrow_type: pa.DataType) -> None:
    rng = np.random.default_rng(7)
    whole = _values(arrow_type, 37, rng)
    with_nulls = pa.array([None if i % 4 == 1 else v for i, v in enumerate(whole.to_pylist())], arrow_type)
    chunked = pa.chunked_array([whole.slice(0, 10), with_nulls.slice(10)])
    for array in (whole, whole.slice(3, 21), whole.slice(37), with_nulls, with_nulls.slice(5, 9), whole.slice(9, 0),
                  chunked, pa.chunked_array([whole]), pa.chunked_array([], arrow_type)):
        ours, theirs = to_numpy(array), array.to_numpy(zero_copy_only=False)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        if array.null_count == 0 and numpy_dtype(array.type) is not None:
            assert numpy_dtype(array.type) == ours.dtype
        for a, b in zip(ours.tolist(), theirs.tolist()):
            if isinstance(a, float) and np.isnan(a):
                assert np.isnan(b)
            elif isinstance(a, list) or hasattr(a, "tolist"):
                assert np.asarray(a).tolist() == np.asarray(b).tolist()
            else:
                assert a == b and type(a) is type(b)


def test_int64_array_holds_the_indices() -> None:
    index = np.array([5, 0, 2**40, 3], dtype=np.int64)[::2]  # not contiguous
    assert int64_array(index).type == pa.int64() and int64_array(index).to_pylist() == [5, 2**40]
    assert int64_array(np.array([7, 1], dtype=np.int32)).to_pylist() == [7, 1]


@pytest.mark.parametrize("arrow_type", [pa.int16(), pa.float64(), pa.bool_()], ids=str)
def test_without_validity_keeps_every_valid_value_in_place(arrow_type: pa.DataType) -> None:
    values = _values(arrow_type, 30, np.random.default_rng(1)).to_pylist()
    array = pa.array([None if i % 3 == 0 else v for i, v in enumerate(values)], arrow_type).slice(4, 20)
    bare = without_validity(array)
    assert bare.null_count == 0 and len(bare) == 20 and bare.type == arrow_type
    assert [b for a, b in zip(array.to_pylist(), bare.to_pylist()) if a is not None] == \
        [a for a in array.to_pylist() if a is not None]


def _fixed_width_arrays() -> list[pa.Array]:
    import datetime
    import decimal

    rng = np.random.default_rng(0)
    return [
        pa.array(rng.integers(-9, 9, 20)), pa.array(rng.integers(0, 200, 20).astype(np.uint8)),
        pa.array(rng.random(20).astype(np.float16)), pa.array(rng.random(20)),
        pa.array([datetime.datetime(2020, 1, i + 1) for i in range(20)], pa.timestamp("us", tz="UTC")),
        pa.array([datetime.date(2021, 2, i + 1) for i in range(20)], pa.date32()),
        pa.array([bytes([i]) * 5 for i in range(20)], pa.binary(5)),
        pa.array([decimal.Decimal(i) / 4 for i in range(20)], pa.decimal128(9, 2)),
        pa.FixedSizeListArray.from_arrays(pa.array(rng.random(60).astype(np.float32)), 3),
        pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(pa.array(np.arange(120, dtype=np.int16)), 2), 3),
        pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.float32(), [2, 2]),
                                       pa.FixedSizeListArray.from_arrays(pa.array(np.arange(80, dtype=np.float32)), 4)),
    ]


@pytest.mark.parametrize("array", _fixed_width_arrays(), ids=lambda a: str(a.type))
def test_fixed_width_cells_gathered_are_the_values_at_those_rows(array: pa.Array) -> None:
    rows = np.array([4, 0, 7, 7, 2])
    for view in (array, array.slice(3, 12), pa.chunked_array([array.slice(5)]), array.slice(2).slice(3)):
        cells = fixed_width_cells(view)
        assert cells is not None and cells.shape[0] == len(view) and not cells.flags.writeable
        gathered = from_fixed_width_cells(view.type, cells[rows])
        gathered.validate(full=True)
        # against the values, not Arrow's take: pyarrow 26 takes wrong values from a sliced nested fixed-size list
        assert gathered.type == view.type and gathered.to_pylist() == [view.to_pylist()[r] for r in rows]


@pytest.mark.parametrize("array", [
    pa.array([1, None, 3]), pa.array([True, False]), pa.array(["x", "y"]), pa.array([b"x"]), pa.array([[1], [2, 3]]),
    pa.FixedSizeListArray.from_arrays(pa.array([1, None, 3, 4]), 2), pa.chunked_array([[1], [2]]),
    pa.array([{"a": 1}]), pa.array([1, 2]).dictionary_encode(),
], ids=lambda a: str(a.type))
def test_fixed_width_cells_are_none_for_what_is_not_one_fixed_width_buffer(array: Any) -> None:
    assert fixed_width_cells(array) is None


@pytest.mark.parametrize("shape", [(3, 5), (64, 256, 256, 3)])  # 45 bytes (Arrow's pool), 12 MiB (numpy's)
def test_arrow_backed_empty_is_aligned_writable_and_of_its_shape(shape: tuple[int, ...]) -> None:
    array = arrow_backed_empty(shape, np.uint8)
    assert array.shape == shape and array.dtype == np.uint8 and array.flags.writeable and array.flags.c_contiguous
    assert array.ctypes.data % ALIGNMENT == 0
    array[...] = 7
    assert int(array.sum()) == 7 * array.size


def test_oversize_arrays_reuse_their_pages_instead_of_faulting_in_fresh_ones() -> None:
    # jemalloc returns a freed >= 8 MiB extent to the system at once: each 12 MiB batch written page by page
    # faulted ~3,000 fresh pages in (the unshuffled loaders over 256x256 images: ~50 faults a row)
    shape = (64, 256, 256, 3)
    for _ in range(3):  # warm: glibc raises its mmap threshold once a chunk of this size is freed
        arrow_backed_empty(shape, np.uint8)[...] = 1
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        arrow_backed_empty(shape, np.uint8)[...] = 1
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    # fresh pages every time would be 20 x 3,072; glibc's heap state after a whole suite's tests costs some
    # re-faults (CI saw ~520 an array), so the bound is a third of fresh, which Arrow's pool here exceeds 3x
    assert faults < 20 * 3072 // 3, faults
