"""write_dataset: round trips, files and row groups, partitions, metadata, atomicity, bounded memory."""

from __future__ import annotations

import datetime
import decimal
import functools
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub import (
    CodecError,
    DatasetExistsError,
    NdarrayCodec,
    ScalarCodec,
    SchemaError,
    TensorCodec,
    Unischema,
    UnischemaField,
    ValidationError,
    make_batch_reader,
    make_reader,
    open_dataset,
    write_dataset,
)
from unihub.schema.unischema import SCHEMA_METADATA_KEY


def data_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.parquet"))


def assert_rows_round_trip(store, expected_rows, decode_dataset, value_equal):
    columns = decode_dataset(store)
    assert store.num_rows == len(expected_rows)
    by_id = {int(i): k for k, i in enumerate(columns["id"])}
    assert sorted(by_id) == sorted(int(r["id"]) for r in expected_rows)
    for row in expected_rows:
        k = by_id[int(row["id"])]
        for name, value in row.items():
            found = columns[name][k]
            if name in ("score",) and value is not None:
                assert found == np.float32(value) and type(found) is np.float32
            elif name == "price":
                assert found == value and type(found) is decimal.Decimal
            elif name in ("id",):
                assert found == value and isinstance(found, np.int64)
            elif name == "split":
                assert found == value and type(found) is str
            else:
                value_equal(found, value, where=f"row {row['id']}, field {name}")


# -- round trips ----------------------------------------------------------------------------------
def test_rows_round_trip(tmp_path, schema, rows, sample_row, decode_dataset, value_equal):
    result = write_dataset(tmp_path / "ds", schema, rows(300))
    assert result.num_rows == 300
    assert result.url == str(tmp_path / "ds")
    assert result.files == (str(tmp_path / "ds" / "part-00000.parquet"),)
    assert result.num_row_groups == 1
    assert result.bytes_written == (tmp_path / "ds" / "part-00000.parquet").stat().st_size
    store = open_dataset(tmp_path / "ds")
    assert store.schema == schema
    assert store.schema_source == "unihub"
    assert_rows_round_trip(store, [sample_row(i) for i in range(300)], decode_dataset, value_equal)


def test_rows_as_namedtuples(tmp_path, schema, sample_row, decode_dataset, value_equal):
    rows = [schema.make_namedtuple(**sample_row(i)) for i in range(5)]
    write_dataset(tmp_path / "ds", schema, rows)
    assert_rows_round_trip(open_dataset(tmp_path / "ds"), [sample_row(i) for i in range(5)],
                           decode_dataset, value_equal)


def tensor_schema() -> Unischema:
    return Unischema("Columns", [
        UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), False),
        UnischemaField("image", np.uint8, (4, 5, 3), TensorCodec(), False),
        UnischemaField("boxes", np.float32, (None, 4), TensorCodec(), False),
        UnischemaField("emb", np.float32, (8,), NdarrayCodec(), False),
    ])


def column_batch(start: int, n: int) -> dict:
    rng = np.random.default_rng(start)
    return {
        "id": np.arange(start, start + n, dtype=np.int64),
        "name": [f"n{i}" for i in range(start, start + n)],
        "image": rng.integers(0, 256, size=(n, 4, 5, 3), dtype=np.uint8),
        "boxes": [np.full((i % 3, 4), i, dtype=np.float32) for i in range(start, start + n)],
        "emb": rng.standard_normal((n, 8)).astype(np.float32),
    }


def test_column_batches_round_trip(tmp_path, decode_dataset):
    schema = tensor_schema()
    batches = [column_batch(0, 40), column_batch(40, 25), column_batch(65, 0), column_batch(65, 10)]
    result = write_dataset(tmp_path / "ds", schema, iter(batches), batched=True)
    assert result.num_rows == 75
    store = open_dataset(tmp_path / "ds")
    columns = decode_dataset(store)
    table = store.read_row_group(0)
    assert isinstance(table.schema.field("image").type, pa.FixedShapeTensorType)
    np.testing.assert_array_equal(np.stack(columns["id"]), np.arange(75))
    assert columns["name"] == [f"n{i}" for i in range(75)]
    image = np.concatenate([b["image"] for b in batches])
    assert np.stack(columns["image"]).dtype == np.uint8
    np.testing.assert_array_equal(np.stack(columns["image"]), image)
    emb = np.concatenate([b["emb"] for b in batches])
    np.testing.assert_array_equal(np.stack(columns["emb"]), emb)
    for i, boxes in enumerate(columns["boxes"]):
        assert boxes.dtype == np.float32 and boxes.shape == (i % 3, 4)
        assert np.all(boxes == i)


def test_single_column_mapping_is_one_batch(tmp_path):
    result = write_dataset(tmp_path / "ds", tensor_schema(), column_batch(0, 7), batched=True)
    assert result.num_rows == 7


def test_column_batch_validation(tmp_path):
    schema = tensor_schema()
    batch = column_batch(0, 5)
    batch["image"] = batch["image"].astype(np.int16)
    with pytest.raises(ValidationError, match="field 'image': expected dtype uint8, found a column of int16"):
        write_dataset(tmp_path / "a", schema, [batch], batched=True)
    batch = column_batch(0, 5)
    batch["emb"] = batch["emb"][:, :7]
    with pytest.raises(ValidationError, match=r"field 'emb': expected rows of shape \(8,\)"):
        write_dataset(tmp_path / "b", schema, [batch], batched=True)
    batch = column_batch(0, 5)
    batch["name"] = batch["name"][:4]
    with pytest.raises(SchemaError, match="equal lengths"):
        write_dataset(tmp_path / "c", schema, [batch], batched=True)
    batch = column_batch(0, 5)
    batch["extra"] = list(range(5))
    with pytest.raises(SchemaError, match=r"columns \['extra'\] are not fields of 'Columns'"):
        write_dataset(tmp_path / "d", schema, [batch], batched=True)
    with pytest.raises(SchemaError, match="expects column mappings or Arrow tables, got list"):
        write_dataset(tmp_path / "e", schema, [[1, 2]], batched=True)
    assert sorted(os.listdir(tmp_path)) == []


def test_arrow_table_round_trip(tmp_path, decode_dataset):
    schema = tensor_schema()
    n = 12
    rng = np.random.default_rng(7)
    image = rng.integers(0, 256, size=(n, 4, 5, 3), dtype=np.uint8)
    emb = [rng.standard_normal(8).astype(np.float32) for _ in range(n)]
    columns = {
        "emb": schema.emb.codec.encode_column(schema.emb, emb),
        "id": pa.array(np.arange(n, dtype=np.int64)),
        "image": pa.FixedShapeTensorArray.from_numpy_ndarray(image),
        "name": pa.array([f"x{i}" for i in range(n)]),
        "boxes": pa.array([[float(i)] * 4 * (i % 2) for i in range(n)], type=pa.list_(pa.float32())),
    }
    table = pa.table(columns)  # columns in another order than the schema
    result = write_dataset(tmp_path / "ds", schema, table)
    assert result.num_rows == n
    decoded = decode_dataset(open_dataset(tmp_path / "ds"))
    np.testing.assert_array_equal(np.stack(decoded["image"]), image)
    np.testing.assert_array_equal(np.stack(decoded["emb"]), np.stack(emb))
    assert decoded["name"] == [f"x{i}" for i in range(n)]
    assert [b.shape for b in decoded["boxes"]] == [(i % 2, 4) for i in range(n)]
    # record batches, batched
    write_dataset(tmp_path / "rb", schema, table.to_batches(max_chunksize=5), batched=True)
    assert open_dataset(tmp_path / "rb").num_rows == n
    with pytest.raises(SchemaError, match=r"lacks columns \['boxes'\]"):
        write_dataset(tmp_path / "bad", schema, table.drop_columns(["boxes"]))
    with pytest.raises(SchemaError, match="does not match the schema"):
        write_dataset(tmp_path / "bad2", schema, table.set_column(0, "emb", pa.array([[1.5]] * n)))
    with pytest.raises(SchemaError, match=r"has columns \['extra'\], which are not fields"):
        write_dataset(tmp_path / "bad3", schema, table.append_column("extra", pa.array(range(n))))
    assert not (tmp_path / "bad3").exists()


# -- files and row groups --------------------------------------------------------------------------
def test_rows_per_file_splits_files(write_sample):
    path, result = write_sample(100, rows_per_file=30)
    files = data_files(path)
    assert [f.name for f in files] == [f"part-0000{i}.parquet" for i in range(4)]
    assert [pq.read_metadata(f).num_rows for f in files] == [30, 30, 30, 10]
    assert result.files == tuple(str(f) for f in files)
    assert result.num_rows == 100
    store = open_dataset(path)
    assert [rg.first_row for rg in store.row_groups] == [0, 30, 60, 90]
    ids = [pq.read_table(f, columns=["id"]).column("id").to_pylist() for f in files]
    assert ids == [list(range(0, 30)), list(range(30, 60)), list(range(60, 90)), list(range(90, 100))]


def test_row_group_size_makes_several_row_groups(write_sample):
    path, result = write_sample(1000, row_group_size_mb=0.05)
    metadata = pq.read_metadata(path / "part-00000.parquet")
    assert metadata.num_row_groups > 3
    assert result.num_row_groups == metadata.num_row_groups
    sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    assert sum(sizes) == 1000
    assert max(sizes) < 400
    store = open_dataset(path)
    assert [rg.num_rows for rg in store.row_groups] == sizes
    default_path, default = write_sample(1000, name="default")
    assert pq.read_metadata(default_path / "part-00000.parquet").num_row_groups == default.num_row_groups == 1


def test_row_groups_respect_size_with_big_rows(tmp_path):
    # 1 MiB per row: a 2 MiB row group must not hold all 12 rows
    schema = Unischema("Big", [UnischemaField("x", np.uint8, (1024, 1024), TensorCodec(), False)])
    rows = ({"x": np.full((1024, 1024), i, np.uint8)} for i in range(12))
    result = write_dataset(tmp_path / "big", schema, rows, row_group_size_mb=2, compression=None)
    metadata = pq.read_metadata(tmp_path / "big" / "part-00000.parquet")
    sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    assert sum(sizes) == 12 and max(sizes) <= 2
    assert result.num_row_groups == metadata.num_row_groups


def test_rows_per_file_and_row_groups_together(write_sample):
    path, result = write_sample(700, rows_per_file=300, row_group_size_mb=0.05)
    counts = [pq.read_metadata(f).num_rows for f in data_files(path)]
    assert counts == [300, 300, 100]
    assert result.num_row_groups == sum(pq.read_metadata(f).num_row_groups for f in data_files(path))


def test_partition_by_writes_hive_directories(tmp_path, schema, rows, sample_row, decode_dataset, value_equal):
    result = write_dataset(tmp_path / "ds", schema, rows(60), partition_by=["split"])
    dirs = sorted(p.name for p in (tmp_path / "ds").iterdir() if p.is_dir())
    assert dirs == ["split=test", "split=train", "split=val"]
    for split in ("train", "val", "test"):
        footer = pq.read_metadata(tmp_path / "ds" / f"split={split}" / "part-00000.parquet")
        assert footer.num_rows == 20
        assert "split" not in footer.schema.to_arrow_schema().names
    assert result.num_rows == 60
    store = open_dataset(tmp_path / "ds")
    assert store.partition_names == ("split",)
    assert store.schema == schema
    assert_rows_round_trip(store, [sample_row(i) for i in range(60)], decode_dataset, value_equal)
    for info in store.row_groups:
        table = store.read_row_group(info.index, columns=["id", "split"])
        assert table.schema.field("split").type == pa.string()
        split = dict(info.partition)["split"]
        assert set(table.column("split").to_pylist()) == {split}
        assert all(i % 3 == ("train", "val", "test").index(split) for i in table.column("id").to_pylist())


@pytest.mark.parametrize("dtype, arrow_type, values", [
    (np.int32, pa.int32(), [3, -1, 3, 12]),
    (np.bool_, pa.bool_(), [True, False, False, True]),
    (np.str_, pa.string(), ["a b/c", "ü", "a b/c", "x=y"]),
    (np.float64, pa.float64(), [0.1, 2.5, 0.1, -3.0]),
    (decimal.Decimal, pa.decimal128(5, 2), [decimal.Decimal("1.50"), decimal.Decimal("-2.25")]),
])
def test_partition_values_keep_dtype(tmp_path, dtype, arrow_type, values):
    schema = Unischema("P", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                             UnischemaField("key", dtype, (), ScalarCodec(arrow_type), False)])
    write_dataset(tmp_path / "ds", schema, ({"id": i, "key": v} for i, v in enumerate(values)),
                  partition_by=["key"])
    store = open_dataset(tmp_path / "ds")
    assert len(store.files) == len(set(values))
    found = {}
    for info in store.row_groups:
        table = store.read_row_group(info.index)
        assert table.schema.field("key").type == arrow_type
        decoded = schema.key.codec.decode_column(schema.key, table.column("key"))
        for i, key in zip(table.column("id").to_pylist(), decoded, strict=True):
            found[i] = key
    assert [found[i] for i in range(len(values))] == values
    assert all(type(found[i]) is (str if dtype is np.str_ else dtype) for i in found)
    if dtype is decimal.Decimal:
        assert [str(found[i]) for i in range(len(values))] == ["1.50", "-2.25"]


def test_partition_by_null_values(tmp_path):
    schema = Unischema("P", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                             UnischemaField("key", np.str_, (), ScalarCodec(pa.string()), True)])
    write_dataset(tmp_path / "ds", schema, [{"id": 0, "key": None}, {"id": 1, "key": "a"}], partition_by=["key"])
    assert sorted(p.name for p in (tmp_path / "ds").iterdir() if p.is_dir()) == \
        ["key=__HIVE_DEFAULT_PARTITION__", "key=a"]
    store = open_dataset(tmp_path / "ds")
    keys = {}
    for info in store.row_groups:
        table = store.read_row_group(info.index)
        keys.update(zip(table.column("id").to_pylist(), table.column("key").to_pylist(), strict=True))
    assert keys == {0: None, 1: "a"}


@pytest.mark.parametrize("options, message", [
    ({"partition_by": ["nope"]}, "partition_by names 'nope', which is not a field of 'Sample'"),
    ({"partition_by": ["vec"]}, r"partition_by field 'vec' must be a scalar, its shape is \(4,\)"),
    ({"partition_by": ["emb"]}, r"partition_by field 'emb' must be a scalar, its shape is \(3,\)"),
    ({"row_group_size_mb": 0}, "row_group_size_mb must be positive, got 0"),
    ({"rows_per_file": 0}, "rows_per_file must be a positive whole number of rows, got 0"),
    # True wrote one row a file; 2.5 a raw TypeError from the middle of the write
    ({"rows_per_file": True}, "rows_per_file must be a positive whole number of rows, got True"),
    ({"rows_per_file": 2.5}, "rows_per_file must be a positive whole number of rows, got 2.5"),
])
def test_bad_options(tmp_path, schema, rows, options, message):
    with pytest.raises(SchemaError, match=message):
        write_dataset(tmp_path / "ds", schema, rows(3), **options)
    assert not (tmp_path / "ds").exists()


def test_partition_by_bytes_is_refused(tmp_path):
    schema = Unischema("B", [UnischemaField("key", np.bytes_, (), ScalarCodec(pa.binary()), False)])
    with pytest.raises(SchemaError, match="partition_by field 'key' holds bytes"):
        write_dataset(tmp_path / "ds", schema, [{"key": b"a"}], partition_by=["key"])
    assert os.listdir(tmp_path) == []


def test_empty_input_writes_an_openable_dataset(tmp_path, schema, decode_dataset):
    result = write_dataset(tmp_path / "ds", schema, iter([]))
    assert result.num_rows == 0 and result.num_row_groups == 0
    assert len(result.files) == 1
    store = open_dataset(tmp_path / "ds")
    assert store.num_rows == 0
    assert store.row_groups == []
    assert store.schema == schema and store.schema_source == "unihub"
    assert decode_dataset(store) == {name: [] for name in schema.fields}
    with pytest.raises(IndexError, match="row 0 is out of range for a dataset of 0 rows"):
        store.row_group_of(0)
    batched = write_dataset(tmp_path / "batched", tensor_schema(), column_batch(0, 0), batched=True)
    assert batched.num_rows == 0 and open_dataset(tmp_path / "batched").num_rows == 0


# -- metadata ------------------------------------------------------------------------------------------
def test_unischema_json_in_common_metadata_and_every_footer(write_sample, schema):
    path, _ = write_sample(90, rows_per_file=40)
    common = pq.read_metadata(path / "_common_metadata")
    assert common.num_rows == 0
    assert Unischema.from_json(common.metadata[SCHEMA_METADATA_KEY]) == schema
    files = data_files(path)
    assert len(files) == 3
    for f in files:
        footer = pq.read_metadata(f)
        assert Unischema.from_json(footer.metadata[SCHEMA_METADATA_KEY]) == schema
        assert json.loads(footer.metadata[SCHEMA_METADATA_KEY])["version"] == 1
        assert footer.schema.to_arrow_schema().remove_metadata() == \
            schema.as_parquet_schema(with_metadata=False)
    # a single file describes itself
    store = open_dataset(files[1])
    assert store.schema == schema and store.schema_source == "unihub" and store.num_rows == 40


def test_partitioned_metadata_keeps_the_partition_field(tmp_path, schema, rows):
    write_dataset(tmp_path / "ds", schema, rows(9), partition_by=["split"])
    common = pq.read_metadata(tmp_path / "ds" / "_common_metadata")
    assert Unischema.from_json(common.metadata[SCHEMA_METADATA_KEY]).split == schema.split
    footer = pq.read_metadata(tmp_path / "ds" / "split=val" / "part-00000.parquet")
    assert Unischema.from_json(footer.metadata[SCHEMA_METADATA_KEY]) == schema


# -- existing targets and atomicity ---------------------------------------------------------------------
def test_existing_target_needs_overwrite(tmp_path, schema, rows):
    write_dataset(tmp_path / "ds", schema, rows(5))
    with pytest.raises(DatasetExistsError, match="already exists; pass overwrite=True") as info:
        write_dataset(tmp_path / "ds", schema, rows(8))
    assert isinstance(info.value, FileExistsError)
    assert open_dataset(tmp_path / "ds").num_rows == 5
    (tmp_path / "file").write_text("x")
    with pytest.raises(DatasetExistsError):
        write_dataset(tmp_path / "file", schema, rows(1))
    result = write_dataset(tmp_path / "ds", schema, rows(8), overwrite=True)
    assert result.num_rows == 8
    assert open_dataset(tmp_path / "ds").num_rows == 8
    assert sorted(os.listdir(tmp_path)) == ["ds", "file"]


def failing_rows(sample_row, n, bad_at):
    for i in range(n):
        row = sample_row(i)
        if i == bad_at:
            row["vec"] = np.zeros(4, dtype=np.float64)
        yield row


def test_failed_write_leaves_nothing(tmp_path, schema, sample_row):
    parent = tmp_path / "out"
    parent.mkdir()
    with pytest.raises(ValidationError) as info:
        write_dataset(parent / "ds", schema, failing_rows(sample_row, 1000, 700), row_group_size_mb=0.05)
    message = str(info.value)
    assert "field 'vec'" in message and "row 700" in message
    assert "expected dtype float32" in message and "found float64" in message
    assert info.value.field == "vec" and info.value.row == 700
    assert os.listdir(parent) == []


def test_failed_overwrite_keeps_the_old_dataset(tmp_path, schema, rows, sample_row):
    parent = tmp_path / "out"
    write_dataset(parent / "ds", schema, rows(10))
    before = {p.relative_to(parent): p.read_bytes() for p in parent.rglob("*") if p.is_file()}
    with pytest.raises(ValidationError, match="row 700"):
        write_dataset(parent / "ds", schema, failing_rows(sample_row, 1000, 700), overwrite=True,
                      row_group_size_mb=0.05)
    after = {p.relative_to(parent): p.read_bytes() for p in parent.rglob("*") if p.is_file()}
    assert after == before
    assert os.listdir(parent) == ["ds"]
    assert open_dataset(parent / "ds").num_rows == 10


def test_interrupted_write_leaves_nothing(tmp_path, schema, sample_row):
    def interrupted():
        for i in range(600):
            if i == 500:
                raise KeyboardInterrupt
            yield sample_row(i)

    with pytest.raises(KeyboardInterrupt):
        write_dataset(tmp_path / "ds", schema, interrupted(), row_group_size_mb=0.05)
    assert os.listdir(tmp_path) == []


def test_codec_error_names_field_and_row(tmp_path):
    schema = Unischema("C", [UnischemaField("t", np.float32, (2,), TensorCodec(), False)])
    rows = [{"t": np.zeros(2, np.float32)}] * 300 + [{"t": np.zeros(3, np.float32)}]
    with pytest.raises(CodecError, match=r"field 't', row 300: expected shape \(2,\), found \(3,\)") as info:
        write_dataset(tmp_path / "ds", schema, rows, validate=False)
    assert info.value.row == 300
    assert os.listdir(tmp_path) == []


def test_unknown_field_in_a_row(tmp_path, schema, sample_row):
    rows = [sample_row(0), {**sample_row(1), "typo": 1}]
    with pytest.raises(ValidationError, match=r"fields \['typo'\] in row 1 are not in Unischema 'Sample'"):
        write_dataset(tmp_path / "ds", schema, rows)
    with pytest.raises(SchemaError, match="row 0 is a list, expected a mapping"):
        write_dataset(tmp_path / "ds", schema, [[1, 2]])
    assert os.listdir(tmp_path) == []


# -- bounded memory ---------------------------------------------------------------------------------
def test_rows_are_streamed_not_materialised(tmp_path, schema, sample_row):
    parent = tmp_path / "out"
    parent.mkdir()
    n = 3000
    pulled = {"first_file_at": None, "bytes_on_disk_at_end": 0}

    def written_bytes():
        return sum(p.stat().st_size for p in parent.glob(".ds.unihub-tmp-*/part-*.parquet"))

    def generate():
        for i in range(n):
            if pulled["first_file_at"] is None and written_bytes() > 0:
                pulled["first_file_at"] = i
            yield sample_row(i)
        pulled["bytes_on_disk_at_end"] = written_bytes()

    result = write_dataset(parent / "ds", schema, generate(), row_group_size_mb=0.05)
    final_size = (parent / "ds" / "part-00000.parquet").stat().st_size
    assert result.num_rows == n
    # data reached the disk long before the input was exhausted ...
    assert pulled["first_file_at"] is not None and pulled["first_file_at"] <= 600
    # ... and by the end most of it was already written (only the last partial row group and the footer remained)
    assert pulled["bytes_on_disk_at_end"] > 0.7 * final_size
    assert result.num_row_groups > 10
    assert os.listdir(parent) == ["ds"]


def test_file_and_url_targets(tmp_path, schema, rows):
    result = write_dataset(f"file://{tmp_path}/viaurl", schema, rows(4))
    assert result.num_rows == 4
    assert result.files == (f"{tmp_path}/viaurl/part-00000.parquet",)
    assert open_dataset(tmp_path / "viaurl").num_rows == 4
    nested = write_dataset(tmp_path / "a" / "b" / "c", schema, rows(2))
    assert nested.num_rows == 2 and open_dataset(tmp_path / "a" / "b" / "c").num_rows == 2


# -- tensor storage --------------------------------------------------------------------------------------
TensorSchema = Unischema("Tensors", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("pixels", np.uint8, (8, 6, 3), TensorCodec(), False),
    UnischemaField("mat", np.float64, (3, 2), TensorCodec(), True),
    UnischemaField("flags", np.bool_, (4,), TensorCodec(), False),
])


def tensor_rows(n: int) -> list[dict]:
    rng = np.random.default_rng(4)
    return [{"id": i, "pixels": rng.integers(0, 256, (8, 6, 3), dtype=np.uint8),
             "mat": None if i % 5 == 3 else rng.standard_normal((3, 2)),
             "flags": rng.random(4) < 0.5} for i in range(n)]


def test_numeric_fixed_shape_tensors_are_stored_as_fixed_size_bytes(tmp_path):
    rows = tensor_rows(23)
    write_dataset(tmp_path / "t", TensorSchema, rows, row_group_size_mb=0.001)
    files = data_files(tmp_path / "t")
    raw = pq.read_table(files[0])
    assert raw.schema.field("pixels").type == pa.binary(8 * 6 * 3)
    assert raw.schema.field("mat").type == pa.binary(3 * 2 * 8) and raw.schema.field("mat").nullable
    assert pa.types.is_fixed_size_list(raw.schema.field("flags").type.storage_type)  # bit-packed: a list
    assert raw.column("pixels")[1].as_py() == rows[1]["pixels"].tobytes()
    assert raw.column("mat")[0].as_py() == rows[0]["mat"].astype("<f8").tobytes()
    assert raw.column("mat")[3].as_py() is None
    assert pq.read_schema(files[0]).remove_metadata() == TensorSchema.as_parquet_schema(with_metadata=False)

    store = open_dataset(tmp_path / "t")
    assert len(store.row_groups) > 2
    first = store.row_groups[0].num_rows
    table = store.read_row_group(0)
    assert isinstance(table.schema.field("pixels").type, pa.FixedShapeTensorType)
    pixels = TensorSchema.pixels.codec.decode_column(TensorSchema.pixels, table.column("pixels"))
    data_buffer = table.column("pixels").chunk(0).storage.values.buffers()[1]
    assert pixels.ctypes.data == data_buffer.address  # restored without a copy
    np.testing.assert_array_equal(pixels, np.stack([r["pixels"] for r in rows[:first]]))
    with make_reader(str(tmp_path / "t"), shuffle_row_groups=False, reader_pool_type="dummy") as reader:
        got = list(reader)
    assert len(got) == 23
    for row, want in zip(got, rows):
        np.testing.assert_array_equal(row.pixels, want["pixels"])
        assert (row.mat is None) == (want["mat"] is None)
        if want["mat"] is not None:
            np.testing.assert_array_equal(row.mat, want["mat"])
        np.testing.assert_array_equal(row.flags, want["flags"])


def test_tensors_stored_as_lists_still_read(tmp_path):
    """Files whose tensors use Arrow's list layout (pyarrow's own writer, older files) decode the same."""
    rows = tensor_rows(9)
    columns = {f.name: f.codec.encode_column(f, [r[f.name] for r in rows]) for f in TensorSchema}
    table = pa.table(columns, schema=TensorSchema.as_arrow_schema())
    os.makedirs(tmp_path / "lists")
    pq.write_table(table, tmp_path / "lists" / "part-0.parquet")
    assert pa.types.is_fixed_size_list(pq.read_schema(tmp_path / "lists" / "part-0.parquet").field("mat").type.storage_type)
    with make_reader(str(tmp_path / "lists"), reader_pool_type="dummy") as reader:
        got = list(reader)
    np.testing.assert_array_equal(np.stack([r.pixels for r in got]), np.stack([r["pixels"] for r in rows]))
    assert [r.mat is None for r in got] == [r["mat"] is None for r in rows]


def test_a_column_array_encodes_without_per_row_work(tmp_path):
    pixels = np.random.default_rng(1).integers(0, 256, (50, 8, 6, 3), dtype=np.uint8)
    mat = np.random.default_rng(2).standard_normal((50, 3, 2))
    batch = {"id": np.arange(50), "pixels": pixels, "mat": mat, "flags": np.zeros((50, 4), bool)}
    write_dataset(tmp_path / "c", TensorSchema, [batch], batched=True)
    with make_batch_reader(str(tmp_path / "c"), reader_pool_type="dummy") as reader:
        out = next(iter(reader))
    np.testing.assert_array_equal(out.pixels, pixels)
    np.testing.assert_array_equal(np.stack(list(out.mat)), mat)


def test_codec_less_fields_take_nested_lists_ragged_or_not(tmp_path: Path) -> None:
    schema = Unischema("Nested", [
        UnischemaField("ragged", np.float32, (None, None), None, False),
        UnischemaField("grid", np.bytes_, (2, 3), None, False),
        UnischemaField("pairs", np.str_, (None, 2), None, True),
    ])
    rows = [{"ragged": [np.array([1, 2], np.float32), [3.5]], "pairs": [["x", "y"], ["z", "w"]],
             "grid": np.array([[b"a", b"b", b"c"], [b"d", b"", b"\xff"]], dtype=object)},
            {"ragged": [], "pairs": None, "grid": [[b"1", b"2", b"3"], [b"4", b"5", b"6"]]}]
    write_dataset(tmp_path / "ds", schema, rows)
    with make_reader(str(tmp_path / "ds"), shuffle_row_groups=False) as reader:
        got = [r._asdict() for r in reader]
    assert got == [{"ragged": [[1.0, 2.0], [3.5]], "grid": [[b"a", b"b", b"c"], [b"d", b"", b"\xff"]],
                    "pairs": [["x", "y"], ["z", "w"]]},
                   {"ragged": [], "grid": [[b"1", b"2", b"3"], [b"4", b"5", b"6"]], "pairs": None}]
    with pytest.raises(ValidationError, match=r"field 'grid', row 0: expected nested lists of shape \(2, 3\)"):
        write_dataset(tmp_path / "bad", schema, [{"ragged": [], "pairs": None, "grid": [[b"a"], [b"b"]]}])
    with pytest.raises(ValidationError, match=r"field 'ragged', row 0: expected a scalar of dtype float32"):
        write_dataset(tmp_path / "bad", schema, [{"ragged": [["x"]], "pairs": None, "grid": [[b""] * 3] * 2}])
    assert not (tmp_path / "bad").exists()


def test_rows_are_encoded_in_chunks_bounded_by_bytes(tmp_path, monkeypatch):
    """Big rows are not gathered 256 at a time: after the first row, a chunk holds what fits 8 MB."""
    from unihub.store import writer

    chunks: list[int] = []
    encode = writer._encode_rows
    monkeypatch.setattr(writer, "_encode_rows", lambda schema, rows, *a: chunks.append(len(rows)) or encode(
        schema, rows, *a))
    frames = Unischema("Frames", [UnischemaField("id", np.int64, ()),
                                  UnischemaField("frame", np.uint8, (512, 1024, 3), NdarrayCodec(), False)])
    frame = np.zeros((512, 1024, 3), np.uint8)  # 1.5 MB
    write_dataset(tmp_path / "frames", frames, ({"id": i, "frame": frame} for i in range(20)), compression=None)
    assert chunks[0] == 1 and max(chunks) == 5 and sum(chunks) == 20  # 8 MB // 1.5 MB
    chunks.clear()
    small = Unischema("Small", [UnischemaField("id", np.int64, ())])
    write_dataset(tmp_path / "small", small, ({"id": i} for i in range(1000)))
    assert chunks[:2] == [1, 256] and sum(chunks) == 1000


def test_writing_camera_frames_keeps_memory_bounded(tmp_path):
    """Peak memory follows the row-group size, not 256 rows: 40 frames of 1200x1920x3 (6.6 MB), 32 MB row
    groups, grow the writing process by far less than the 40 frames' 264 MB (it grew by ~800 MB before)."""
    import subprocess
    import sys

    script = f"""
import resource
import numpy as np
from unihub import NdarrayCodec, Unischema, UnischemaField, write_dataset
schema = Unischema("Frames", [UnischemaField("id", np.int64, ()),
                              UnischemaField("frame", np.uint8, (1200, 1920, 3), NdarrayCodec(), False)])
frame = np.random.default_rng(0).integers(0, 255, (1200, 1920, 3), dtype=np.uint8)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
write_dataset({str(tmp_path / "frames")!r}, schema, ({{"id": i, "frame": frame.copy()}} for i in range(40)),
              compression=None)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""
    grown_mb = int(subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                                  text=True).stdout.split()[-1])
    assert grown_mb < 200, f"writing 40 frames grew the process by {grown_mb} MB"


def test_every_writer_defaults_to_one_row_group_size():
    """write_dataset, convert, the Spark and pipeline converters, the cache and make_spark_converter
    share DEFAULT_ROW_GROUP_SIZE_MB (chosen by benchmarks/row_groups.py), and the CLI says it."""
    import importlib
    import inspect

    from unihub.bridges.spark.converter import make_spark_converter
    from unihub.cli import build_parser
    from unihub.converters import convert, pipeline, spark
    from unihub.runtime.memory import DEFAULT_ROW_GROUP_SIZE_MB
    from unihub.store import writer

    checked = []
    cacheable = importlib.import_module("unihub.caching.cacheable")
    for module in (writer, convert, pipeline, spark, cacheable):
        for name, member in inspect.getmembers(module):
            functions = [member] if inspect.isfunction(member) else \
                [f for _, f in inspect.getmembers(member, inspect.isfunction)] if inspect.isclass(member) else []
            for fn in functions:
                parameter = inspect.signature(fn).parameters.get("row_group_size_mb")
                if parameter is not None and parameter.default not in (inspect.Parameter.empty, None):
                    assert parameter.default == DEFAULT_ROW_GROUP_SIZE_MB, f"{module.__name__}.{name}"
                    checked.append(fn.__name__)
    assert {"write_dataset", "convert", "convert_with_spark", "cacheable", "build"} <= set(checked), checked
    assert inspect.signature(make_spark_converter).parameters["parquet_row_group_size_bytes"].default == \
        int(DEFAULT_ROW_GROUP_SIZE_MB * 2**20)
    for command in ("convert", "copy"):
        text = " ".join(build_parser()._subparsers._group_actions[0].choices[command].format_help().split())
        assert f"(default {DEFAULT_ROW_GROUP_SIZE_MB:g})" in text, command


@pytest.mark.parametrize("codec", [None, ScalarCodec(pa.timestamp("us"))], ids=["arrow", "scalar"])
@pytest.mark.parametrize("unit", ["Y", "M", "D", "h", "s", "ms", "us"])
def test_datetimes_of_every_unit_are_stored_as_written(tmp_path: Path, codec: ScalarCodec | None, unit: str) -> None:
    """Dates of day unit beside a null were stored as 1970-01-01 (pyarrow's conversion of datetime64[D] with a
    mask); a batched column of datetime64 of any unit was refused ('expected datetime64, found datetime64[us]');
    a field without a codec given a datetime64[ns] value raised pyarrow's raw ArrowNotImplementedError."""
    field = UnischemaField("t", np.datetime64, (), codec, True)
    schema = Unischema("Times", [field])
    values = np.array(["2021-03-01", "1969-07-20", "2024-02-29"], dtype="M8[D]").astype(f"M8[{unit}]")
    expected = [None, *(v.astype("M8[us]") for v in values)]
    write_dataset(tmp_path / "rows", schema, [{"t": v} for v in [None, *values]])
    write_dataset(tmp_path / "batched", schema, [{"t": values}], batched=True)
    with make_reader(tmp_path / "rows", shuffle_row_groups=False) as reader:
        assert [row.t for row in reader] == expected
    with make_batch_reader(tmp_path / "batched", shuffle_row_groups=False) as reader:
        assert [t for batch in reader for t in batch.t] == expected[1:]
    precise = UnischemaField("t", np.datetime64, (), codec, False)
    with pytest.raises(CodecError, match=r"field 't': cannot store values as timestamp\[us\]: .*would lose data"):
        write_dataset(tmp_path / "ns", Unischema("Times", [precise]),
                      [{"t": np.datetime64("2021-01-01T00:00:00.123456789")}])


def test_a_big_endian_array_is_refused_saying_so(tmp_path: Path) -> None:
    """'expected dtype int32, found >i4' read as nonsense (int32 is int32): the error says it is the byte order."""
    schema = Unischema("Order", [UnischemaField("v", np.int32, (2,), NdarrayCodec(), False)])
    swapped = np.array([1, 2], dtype=">i4")
    hint = r"int32 in big-endian byte order \('>i4'\): .* values.astype\('<i4'\)"
    with pytest.raises(ValidationError, match="found " + hint):
        write_dataset(tmp_path / "rows", schema, [{"v": swapped}])
    with pytest.raises(ValidationError, match="found a column of " + hint):
        write_dataset(tmp_path / "batched", schema, [{"v": np.array([[1, 2], [3, 4]], dtype=">i4")}],
                      batched=True)
    write_dataset(tmp_path / "native", schema, [{"v": swapped.astype("<i4")}])


def test_a_numpy_scalar_fits_an_ndarray_field_of_shape_nothing(tmp_path: Path) -> None:
    """Validation took np.float32(-0.0) for a shape () NdarrayCodec field, then the codec refused it: 'expected a
    numpy array of float32, found float32'. Now it is stored as its 0-d array, bit for bit."""
    schema = Unischema("Scalars", [UnischemaField("v", np.float32, (), NdarrayCodec(), False)])
    write_dataset(tmp_path / "ds", schema, [{"v": np.float32(-0.0)}])
    with make_reader(tmp_path / "ds") as reader:
        (row,) = list(reader)
    assert np.asarray(row.v).tobytes() == np.float32(-0.0).tobytes()


@pytest.mark.parametrize("extra, message", [
    ({"source": 5}, r"\$\.source: expected string, got 5"),
    ({"classes": ["a", 1]}, r"\$\.classes\[1\]: expected string, got 1"),
    ({"x": functools.reduce(lambda inner, _: {"x": inner}, range(70), {})}, r"\$\.x: arrays and objects nested deeper than 64 levels"),
])
def test_extra_metadata_a_reader_refuses_is_refused_before_writing(tmp_path, schema, rows, extra, message):
    # it was written (over the dataset there), and every open of it was a SchemaError
    write_dataset(tmp_path / "ds", schema, rows(2))
    with pytest.raises(SchemaError, match=f"extra_metadata: metadata key 'unihub.extra': {message}; a reader "
                                          "would refuse it, so nothing was written"):
        write_dataset(tmp_path / "ds", schema, rows(3), extra_metadata=extra, overwrite=True)
    assert open_dataset(tmp_path / "ds").num_rows == 2
    with pytest.raises(SchemaError, match="extra_metadata must be a mapping .* got str"):
        write_dataset(tmp_path / "new", schema, rows(3), extra_metadata="notes")
    assert not (tmp_path / "new").exists()


def test_extra_metadata_keeps_numpy_values_as_numbers(tmp_path, schema, rows):
    # str() of an array was stored: '[0 1 2 ... 997 998 999]', and a numpy scalar became text ('5')
    mean = np.arange(1000, dtype=np.float32) / 3
    write_dataset(tmp_path / "ds", schema, rows(1),
                  extra_metadata={"mean": mean, "n": np.int64(5), "when": datetime.date(2020, 1, 2)})
    extra = open_dataset(tmp_path / "ds").extra_metadata
    assert extra["mean"] == mean.tolist() and extra["n"] == 5 and extra["when"] == "2020-01-02"


@pytest.mark.parametrize("batched", [False, True], ids=["rows", "columns"])
def test_nat_in_a_field_that_is_not_nullable_is_a_validation_error(tmp_path, batched):
    # NaT is stored as a null: it passed validation and failed in pyarrow ("Column 'ts' is declared
    # non-nullable but contains nulls"), a raw ArrowInvalid naming no row
    schema = Unischema("T", [UnischemaField("ts", np.datetime64, (), None, False),
                             UnischemaField("td", np.timedelta64, (), ScalarCodec(pa.duration("us")), False)])
    ts = np.array(["2020-01-01", "2020-01-02", "2020-01-03"], "datetime64[s]")
    td = np.array([1, 2, "NaT"], "timedelta64[s]")
    data = [{"ts": ts, "td": td}] if batched else [{"ts": a, "td": b} for a, b in zip(ts, td)]
    with pytest.raises(ValidationError, match=r"field 'td', row 2: expected a value, found NaT \(a null; the field "
                                              r"is not nullable\)"):
        write_dataset(tmp_path / "ds", schema, data, batched=batched)
    assert not (tmp_path / "ds").exists()
    nullable = Unischema("T", [f._replace(nullable=True) for f in schema])
    write_dataset(tmp_path / "ds", nullable, data, batched=batched)
    assert open_dataset(tmp_path / "ds").read_row_group(0).column("td").null_count == 1


def test_an_arrow_tensor_column_with_a_null_row_is_written(tmp_path):
    # Arrow makes a None row of a fixed-size list with null values under it: the writer counted those and refused
    # the column ("tensor values contain 3 nulls"); a null inside a row that is not null is still refused
    schema = Unischema("T", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                             UnischemaField("t", np.float32, (3,), TensorCodec(), True)])
    tensor = schema.as_arrow_schema().field("t").type

    def table(cells):
        storage = pa.array(cells, type=tensor.storage_type)
        return pa.table({"id": list(range(len(cells))), "t": pa.ExtensionArray.from_storage(tensor, storage)})

    write_dataset(tmp_path / "ds", schema, table([[1, 2, 3], None, [4, 5, 6]]).slice(1), batched=True)
    with make_batch_reader(str(tmp_path / "ds"), workers_count=1) as reader:
        (batch,) = list(reader)
    assert batch.id.tolist() == [1, 2] and batch.t[0] is None and batch.t[1].tolist() == [4, 5, 6]
    with pytest.raises(CodecError, match="field 't': tensor values contain 1 nulls"):
        write_dataset(tmp_path / "bad", schema, table([[1, None, 3], None]), batched=True)


def test_an_arrow_batch_with_nulls_in_a_field_that_is_not_nullable_is_a_schema_error(tmp_path):
    # pyarrow's cast raised a raw ValueError ("Casting field 'id' with null values to non-nullable")
    schema = Unischema("N", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False)])
    with pytest.raises(SchemaError, match="Arrow batch at row 2 does not match the schema: Casting field 'id' with "
                                          "null values to non-nullable"):
        write_dataset(tmp_path / "ds", schema, [pa.table({"id": [0, 1]}), pa.table({"id": [2, None]})], batched=True)
    assert not (tmp_path / "ds").exists()
