"""Petastorm ``np.save`` cells that contradict their field are read as errors naming file, row group and row."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub import CodecError, NdarrayCodec, ScalarCodec, Unischema, UnischemaField, make_batch_reader, make_reader
from unihub.cli import main
from unihub.schema.unischema import SCHEMA_METADATA_KEY

SCHEMA = Unischema("S", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                         UnischemaField("x", np.float32, (4,), NdarrayCodec(), False)])


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def dataset(root: Path, bad: dict[int, np.ndarray]) -> Path:
    """30 rows in row groups of 10, cells written as np.save writes them, row ``i`` replaced by ``bad[i]``."""
    cells = [npy(bad.get(i, np.full(4, i, np.float32))) for i in range(30)]
    table = pa.table({"id": pa.array(range(30), pa.int64()), "x": pa.array(cells, pa.binary())})
    root.mkdir()
    pq.write_table(table.replace_schema_metadata({SCHEMA_METADATA_KEY: SCHEMA.to_json().encode()}),
                   root / "part-0.parquet", row_group_size=10)
    return root


@pytest.mark.parametrize("bad, row, message", [
    ({17: np.zeros(4, np.float64)}, 17, "the stored array is float64, the field is float32"),
    ({23: np.zeros((2, 2), np.float32)}, 23, r"the stored array has shape \(2, 2\), the field \(4,\)"),
    ({i: np.zeros(5, np.float32) for i in range(10, 20)}, 10, r"has shape \(5,\)"),  # a whole row group: one header
])
def test_contradicting_cells_name_file_row_group_and_row(tmp_path: Path, bad: dict[int, np.ndarray], row: int,
                                                         message: str) -> None:
    root = dataset(tmp_path / "ds", bad)
    delivered: list[int] = []
    with pytest.raises(CodecError, match=message) as info:
        with make_reader(str(root), shuffle_row_groups=False, reader_pool_type="dummy") as reader:
            for r in reader:
                delivered.append(int(r.id))
    assert str(info.value).startswith(f"{root / 'part-0.parquet'}, row group {row // 10} (row {row} of the dataset): "
                                      f"field 'x', row {row % 10}: ")
    assert info.value.field == "x" and info.value.row == row % 10
    assert delivered == list(range(row // 10 * 10))
    with pytest.raises(CodecError, match=message), make_batch_reader(str(root), reader_pool_type="dummy") as reader:
        list(reader)


def test_contradicting_cells_are_one_cli_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root = dataset(tmp_path / "ds", {3: np.zeros(4, np.int8)})
    assert main(["convert", str(root), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("unihub: error: ") and "row 3 of the dataset" in err
    assert not (tmp_path / "out").exists()


def test_big_endian_cells_of_the_field_dtype_read(tmp_path: Path) -> None:
    root = dataset(tmp_path / "ds", {i: np.full(4, i, ">f4") for i in range(30)})
    with make_reader(str(root), shuffle_row_groups=False, reader_pool_type="dummy") as reader:
        assert [r.x.tolist() for r in reader] == [[float(i)] * 4 for i in range(30)]
