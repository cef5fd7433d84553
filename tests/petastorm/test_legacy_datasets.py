"""Petastorm's own legacy datasets, 0.4.0 to 0.7.6, open in unihub with every value intact.

``tests/fixtures/petastorm_legacy/<version>/`` holds the datasets Petastorm keeps for its
``test_reading_legacy_datasets.py`` (see the README there): each written by that release's
``generate_dataset_for_legacy_tests.py`` under Python 2, so the Unischema and the row-group
indexes are protocol-0 ``cPickle`` pickles whose memo numbering starts at 1. The tests read them
as Petastorm's test does, then check every value of every row:

* for all six, against the Parquet values decoded by hand (``np.load`` of the NdarrayCodec bytes,
  OpenCV for the PNGs, as Petastorm decodes them) and against the formulas of Petastorm's
  ``_randomize_row`` (``id2 = id % 2``, ``partition_key = p_<id // 10>``, ...);
* for 0.7.6, the only one Petastorm 0.13.1 still opens (the older pickles name
  ``pyspark.serializers._restore``, which pyspark 3.4 removed), against what Petastorm's own
  ``make_reader`` returns (slow: it runs in the Petastorm venv).

A copy made by ``copy_dataset`` is an upgrade path: real Petastorm 0.13.1 reads the copy of 0.4.0.
"""

from __future__ import annotations

import decimal
import io
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.petastorm.test_metadata_write import (
    assert_exact,
    opencv_rgb,
    petastorm_python,  # noqa: F401 (a fixture)
    petastorm_rows,
    read_with_petastorm,
)
from unihub import (
    CompressedImageCodec,
    NdarrayCodec,
    ScalarCodec,
    SingleIndexSelector,
    Unischema,
    UnischemaField,
    copy_dataset,
    make_batch_reader,
    make_reader,
    open_dataset,
)
from unihub.readers.rowgroup_index import read_rowgroup_indexes

LEGACY = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm_legacy"
VERSIONS = ("0.4.0", "0.4.3", "0.5.1", "0.6.0", "0.7.0", "0.7.6")
ROWS = 100
IMAGE = (32, 16, 3)

#: Petastorm's ``TestSchema`` (petastorm/tests/test_common.py) at 0.7.6, with the release that added each field
TEST_SCHEMA_FIELDS = [
    ("0.4.0", UnischemaField("partition_key", np.str_, (), ScalarCodec(pa.string()), False)),
    ("0.4.0", UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False)),
    ("0.4.0", UnischemaField("id2", np.int32, (), ScalarCodec(pa.int16()), False)),
    ("0.5.1", UnischemaField("id_float", np.float64, (), ScalarCodec(pa.float64()), False)),
    ("0.5.1", UnischemaField("id_odd", np.bool_, (), ScalarCodec(pa.bool_()), False)),
    ("0.4.0", UnischemaField("python_primitive_uint8", np.uint8, (), ScalarCodec(pa.int16()), False)),
    ("0.4.0", UnischemaField("image_png", np.uint8, IMAGE, CompressedImageCodec("png"), False)),
    ("0.4.0", UnischemaField("matrix", np.float32, IMAGE, NdarrayCodec(), False)),
    ("0.4.0", UnischemaField("decimal", decimal.Decimal, (), ScalarCodec(pa.decimal128(10, 9)), False)),
    ("0.4.0", UnischemaField("matrix_uint16", np.uint16, IMAGE, NdarrayCodec(), False)),
    ("0.7.6", UnischemaField("matrix_uint32", np.uint32, IMAGE, NdarrayCodec(), False)),
    ("0.4.0", UnischemaField("matrix_string", np.bytes_, (None, None), NdarrayCodec(), False)),  # (None,) to 0.5.1
    ("0.4.0", UnischemaField("empty_matrix_string", np.bytes_, (None,), NdarrayCodec(), False)),
    ("0.4.0", UnischemaField("matrix_nullable", np.uint16, IMAGE, NdarrayCodec(), True)),
    ("0.4.0", UnischemaField("sensor_name", np.str_, (1,), NdarrayCodec(), False)),
    ("0.4.0", UnischemaField("string_array_nullable", np.str_, (None,), NdarrayCodec(), True)),
    ("0.7.6", UnischemaField("integer_nullable", np.int32, (), ScalarCodec(pa.int16()), True)),
]


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def expected_schema(version: str) -> Unischema:
    """Petastorm's TestSchema as that release wrote it, fields in name order (as its Unischema kept them)."""
    fields = []
    for added, field in TEST_SCHEMA_FIELDS:
        if _release(added) > _release(version):
            continue
        if field.name == "matrix_string" and _release(version) < (0, 6, 0):
            field = UnischemaField(field.name, field.numpy_dtype, (None,), field.codec, field.nullable)
        fields.append(field)
    return Unischema("TestSchema", sorted(fields, key=lambda f: f.name))


def url(version: str) -> str:
    return (LEGACY / version).as_uri()


def decoded_by_hand(field: UnischemaField, value: Any) -> Any:
    """A stored value as Petastorm's codec decodes it, without unihub: np.load, OpenCV, the dtype."""
    if value is None:
        return None
    if isinstance(field.codec, NdarrayCodec):
        return np.load(io.BytesIO(value), allow_pickle=False)
    if isinstance(field.codec, CompressedImageCodec):
        return opencv_rgb(value)
    if field.numpy_dtype is decimal.Decimal:
        return value
    return field.numpy_dtype(value)


def raw_rows(version: str) -> dict[int, dict[str, Any]]:
    """Every row of the dataset straight from its Parquet files, keyed by id; partition_key from the directory."""
    schema = expected_schema(version)
    rows: dict[int, dict[str, Any]] = {}
    for path in sorted((LEGACY / version).glob("partition_key=*/*.parquet")):
        for row in pq.ParquetFile(path).read().to_pylist():
            row["partition_key"] = path.parent.name.partition("=")[2]
            rows[row["id"]] = {name: decoded_by_hand(schema.fields[name], value) for name, value in row.items()}
    assert len(rows) == ROWS
    return rows


def assert_rows_equal(found: dict[int, dict[str, Any]], expected: dict[int, dict[str, Any]], where: str) -> None:
    assert sorted(found) == sorted(expected), f"{where}: ids differ"
    for row_id, row in expected.items():
        assert sorted(found[row_id]) == sorted(row), f"{where}: fields of row {row_id} differ"
        for name, value in row.items():
            assert_exact(found[row_id][name], value, f"{where}, row {row_id}, {name}")


def read_rows(version_url: str) -> dict[int, dict[str, Any]]:
    with make_reader(version_url, workers_count=1) as reader:
        rows = list(reader)
    assert len(rows) == ROWS
    return {int(row.id): row._asdict() for row in rows}


def test_the_fixture_holds_every_legacy_version() -> None:
    assert tuple(sorted(p.name for p in LEGACY.iterdir() if p.is_dir())) == VERSIONS


@pytest.mark.parametrize("version", VERSIONS)
def test_make_reader_reads_every_row_as_stored(version: str) -> None:
    # Petastorm's test_reading_legacy_dataset, then every value against the Parquet decoded by hand
    with make_reader(url(version), workers_count=1) as reader:
        all_data = list(reader)
    assert len(all_data) == ROWS
    assert len(all_data[0]._fields) > 5
    assert all_data[0].matrix.shape == IMAGE
    assert_rows_equal({int(row.id): row._asdict() for row in all_data}, raw_rows(version), version)


@pytest.mark.parametrize("version", VERSIONS)
def test_values_follow_petastorms_generator(version: str) -> None:
    """The deterministic part of ``_randomize_row``, checked on what unihub reads."""
    rows = read_rows(url(version))
    for row_id, row in rows.items():
        assert row["id2"] == row_id % 2 and row["partition_key"] == f"p_{row_id // 10}"
        assert row["sensor_name"].tolist() == ["test_sensor"] and row["empty_matrix_string"].shape == (0,)
        assert row["matrix_nullable"] is None
        strings = row["string_array_nullable"]
        if row_id % 5 == 0:
            assert strings is None
        else:
            assert strings.tolist() == ([] if row_id % 4 == 0 else [str(row_id), str(row_id + 1)])
        if "id_float" in row:
            assert row["id_float"] == float(row_id) and row["id_odd"] == bool(row_id % 2)
        if "integer_nullable" in row:
            assert row["integer_nullable"] == (None if row_id % 2 else row_id)


@pytest.mark.parametrize("version", VERSIONS)
def test_make_batch_reader_reads_every_row_as_stored(version: str) -> None:
    expected = raw_rows(version)
    columns: dict[str, list[Any]] = {}
    with make_batch_reader(url(version), workers_count=1) as reader:
        for batch in reader:
            for name, values in batch._asdict().items():
                columns.setdefault(name, []).extend(values)
    assert sorted(columns) == sorted(expected_schema(version).fields)
    assert sorted(int(i) for i in columns["id"]) == list(range(ROWS))
    for n, row_id in enumerate(int(i) for i in columns["id"]):
        for name, value in expected[row_id].items():
            found = columns[name][n]
            if value is None and name == "integer_nullable":  # a null in an integer column: NaN, as in Petastorm
                assert np.isnan(found), f"{version}, row {row_id}, {name}: {found!r} is not NaN"
            elif value is None or isinstance(value, decimal.Decimal):
                assert found == value, f"{version}, row {row_id}, {name}: {found!r} != {value!r}"
            else:
                np.testing.assert_array_equal(found, value, err_msg=f"{version}, row {row_id}, {name}")


@pytest.mark.parametrize("version", VERSIONS)
def test_schema_and_rowgroup_indexes(version: str) -> None:
    store = open_dataset(url(version))
    assert store.schema_source == "petastorm"
    assert store.schema == expected_schema(version)
    # the row-group indexes Petastorm's build_rowgroup_index pickled, and a selector using one
    indexes = read_rowgroup_indexes(store).indexes
    assert sorted(indexes) == sorted({"id", "sensor_name", "string_array_nullable"}
                                     | ({"partition_key"} if _release(version) >= (0, 6, 0) else set()))
    with make_reader(url(version), rowgroup_selector=SingleIndexSelector("id", [42]), workers_count=1) as reader:
        assert sorted(int(row.id) for row in reader) == list(range(40, 50))  # partition p_4 is one row group


@pytest.mark.parametrize("version", VERSIONS)
def test_copy_dataset_keeps_every_value(version: str, tmp_path: Path) -> None:
    result = copy_dataset(None, url(version), tmp_path / "copy")
    assert result.rows == ROWS
    assert open_dataset(tmp_path / "copy").schema == expected_schema(version)
    assert_rows_equal(read_rows((tmp_path / "copy").as_uri()), raw_rows(version), f"copy of {version}")


@pytest.mark.slow
def test_petastorm_reads_0_7_6_as_unihub_does(petastorm_python: Path, tmp_path: Path) -> None:  # noqa: F811
    (result,) = read_with_petastorm(petastorm_python, [{"url": str(LEGACY / "0.7.6"), "reader": "make_reader"}],
                                    tmp_path)
    assert_rows_equal(read_rows(url("0.7.6")), petastorm_rows(result), "0.7.6 vs Petastorm 0.13.1")


@pytest.mark.slow
def test_petastorm_reads_unihubs_copy_of_0_4_0(petastorm_python: Path, tmp_path: Path) -> None:  # noqa: F811
    # Petastorm 0.13.1 cannot open 0.4.0 itself; unihub's copy carries a Unischema pickle it reads
    copy_dataset(None, url("0.4.0"), tmp_path / "copy")
    (result,) = read_with_petastorm(petastorm_python, [{"url": str(tmp_path / "copy"), "reader": "make_reader"}],
                                    tmp_path)
    assert_rows_equal(petastorm_rows(result), raw_rows("0.4.0"), "Petastorm 0.13.1 reading unihub's copy of 0.4.0")
