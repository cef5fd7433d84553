"""Zero-size dimensions (``(0,)``, ``(3, 0)``, ``(None, 0)``): stored, written and read back exactly.

Arrow has no fixed-size list of size 0 (pyarrow refuses it, or crashes dividing by it), and an
empty list cannot tell ``(None, 0)``'s first dimension, so TensorCodec stores such fields as its
struct of flat values and row shapes. Every value comes back with its dtype and shape.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from unihub import NdarrayCodec, TensorCodec, Unischema, UnischemaField, make_batch_reader, make_reader
from unihub.store.dataset import open_dataset
from unihub.store.writer import write_dataset

CASES = [  # (shape, dtype, the row values: one None where the field is nullable)
    ((0,), np.int16, [np.zeros((0,), np.int16)] * 3),
    ((3, 0), np.bool_, [np.zeros((3, 0), np.bool_)] * 3),
    ((None, 0), np.float32, [np.zeros((i, 0), np.float32) for i in (0, 2, 5)]),
    ((0, None), np.float64, [np.zeros((0, i), np.float64) for i in (0, 1, 4)]),
    ((2, 0, None), np.uint8, [np.zeros((2, 0, i), np.uint8) for i in (3, 0, 1)]),
    ((None, 2), np.int32, [np.zeros((0, 2), np.int32), np.ones((1, 2), np.int32), np.zeros((0, 2), np.int32)]),
]


def same(found: object, expected: np.ndarray) -> None:
    assert isinstance(found, np.ndarray)
    assert (found.dtype, found.shape) == (expected.dtype, expected.shape)
    assert found.tobytes() == expected.tobytes()


@pytest.mark.parametrize(("shape", "dtype", "values"), CASES)
def test_tensor_codec_column_round_trip(shape: tuple, dtype: type, values: list[np.ndarray]) -> None:
    field = UnischemaField("x", dtype, shape, TensorCodec(), True)
    if 0 in shape:
        assert pa.types.is_struct(field.arrow_type())  # never a fixed_size_list of size 0
    column = field.codec.encode_column(field, [values[0], None, *values[1:]])
    decoded = field.codec.decode_column(field, column)
    assert decoded[1] is None
    for found, expected in zip([decoded[0], *decoded[2:]], values):
        same(found, expected)
    for value in values:  # Petastorm's one-value encode/decode
        same(field.codec.decode(field, field.codec.encode(field, value)), value)


@pytest.mark.parametrize(("shape", "dtype", "values"), CASES)
@pytest.mark.parametrize("codec", [TensorCodec(), NdarrayCodec()], ids=["tensor", "ndarray"])
def test_written_and_read_back(tmp_path: Path, shape: tuple, dtype: type, values: list[np.ndarray],
                               codec: object) -> None:
    schema = Unischema("Z", [UnischemaField("id", np.int64, ()), UnischemaField("x", dtype, shape, codec, True)])
    rows = [{"id": i, "x": v} for i, v in enumerate([*values, None])]
    write_dataset(str(tmp_path / "ds"), schema, rows)
    assert open_dataset(str(tmp_path / "ds")).schema == schema
    with make_reader(str(tmp_path / "ds"), shuffle_row_groups=False) as reader:
        read = {row.id: row.x for row in reader}
    assert read[len(values)] is None
    for i, value in enumerate(values):
        same(read[i], value)
    with make_batch_reader(str(tmp_path / "ds"), shuffle_row_groups=False) as reader:
        batches = list(reader)
    column = [x for batch in batches for x in batch.x]
    assert len(column) == len(values) + 1 and column[-1] is None
    for found, value in zip(column, values):
        same(found, value)


@pytest.mark.parametrize("shape", [(0,), (3, 0)])
def test_fixed_zero_size_column_as_one_array(tmp_path: Path, shape: tuple) -> None:
    """A whole numpy column ``(n, *shape)`` goes in at once and a batch comes back as one array."""
    schema = Unischema("Z", [UnischemaField("x", np.float32, shape, TensorCodec(), False)])
    write_dataset(str(tmp_path / "ds"), schema, {"x": np.zeros((4, *shape), np.float32)}, batched=True)
    with make_batch_reader(str(tmp_path / "ds")) as reader:
        batch = next(iter(reader))
    same(batch.x, np.zeros((4, *shape), np.float32))
