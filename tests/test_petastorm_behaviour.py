"""Petastorm 0.13.1's exception types, message words, warnings and small behaviours, as its own tests
assert them (``petastorm/tests/test_unischema.py``, ``test_codec_*.py``, ``test_end_to_end.py``,
``test_parquet_reader.py``, ``test_reader.py``, ``test_pytorch_dataloader.py``).

Each check asserts both: the built-in Petastorm raised (so ``except TypeError`` in migrated code still
catches it) and unihub's own class (so ``except unihub.CodecError`` does too). Datasets are the ones
real Petastorm wrote (``tests/fixtures/petastorm``).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import unihub
from unihub import (
    CodecError,
    CodecTypeError,
    CompressedImageCodec,
    DatasetNotFoundError,
    DatasetUrlError,
    FieldTypeError,
    NoMatchingFieldsError,
    ReaderResetError,
    ScalarCodec,
    SchemaError,
    Unischema,
    UnischemaField,
    ValidationError,
    WeightedSamplingReader,
    dict_to_spark_row,
    insert_explicit_nulls,
    make_batch_reader,
    make_reader,
    match_unischema_fields,
)
from unihub.errors import InvalidArgumentError, NoDataAvailableError, UsageError

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "petastorm"
WITH_SCHEMA = f"file://{FIXTURES / 'unischema'}"  # 60 rows in 3 row groups, Petastorm's Unischema
PLAIN = f"file://{FIXTURES / 'plain'}"  # 600 rows in 2 row groups, Spark's Parquet without a Unischema


def spark_types():
    return pytest.importorskip("pyspark.sql.types")


# -- codecs (test_codec_scalar.py, test_codec_compressed_image.py) ------------------------------------
@pytest.mark.parametrize("value", [[1.2], np.asarray([3.4]), [5, 6]])
def test_a_scalar_codec_given_a_list_raises_petastorms_type_error(value) -> None:
    codec = ScalarCodec(spark_types().FloatType())
    field = UnischemaField("field_float", np.float32, (), codec, False)
    with pytest.raises(TypeError, match="Expected a scalar") as info:
        codec.encode(field, value)
    assert isinstance(info.value, CodecTypeError) and isinstance(info.value, CodecError)
    with pytest.raises(CodecTypeError, match="Expected a scalar as a value for field 'field_float'"):
        codec.encode_column(field, [1.0, value])  # the column path keeps the type (not a re-wrapped error)


def test_a_scalar_codec_on_a_shaped_field_keeps_petastorms_words() -> None:
    codec = ScalarCodec(spark_types().IntegerType())
    field = UnischemaField("field_int", np.int32, (1,), codec, False)
    with pytest.raises(ValueError, match="must be an empty tuple") as info:
        codec.encode(field, np.int32(1))
    assert isinstance(info.value, CodecError) and not isinstance(info.value, TypeError)


def test_an_image_codec_keeps_petastorms_words() -> None:
    codec = CompressedImageCodec("png")
    field = UnischemaField("field_image", np.uint8, (10, 20), codec, False)
    with pytest.raises(CodecError, match=r"Unexpected dimensions.*\(10, 20\), found \(100, 200\)"):
        codec.encode(field, np.zeros((100, 200), dtype=np.uint8))
    with pytest.raises(CodecError, match="Unexpected type.*dtype uint8, found uint16"):
        codec.encode(field, np.zeros((10, 20), dtype=np.uint16))


def test_codecs_print_as_petastorm_printed_them() -> None:
    types = spark_types()
    assert str(ScalarCodec(types.FloatType())) == "ScalarCodec(FloatType())"
    assert str(CompressedImageCodec("png", 80)) == "CompressedImageCodec('png', 80)"
    assert ScalarCodec(types.FloatType()) == ScalarCodec(np.float32)  # the repr changes nothing else
    assert repr(ScalarCodec(pa.int64())) == "ScalarCodec(arrow_type='int64')"


# -- Unischema (test_unischema.py) --------------------------------------------------------------------
def test_dict_to_spark_row_given_a_list_for_a_string_raises_petastorms_type_error() -> None:
    types = spark_types()
    schema = Unischema("TestSchema", [UnischemaField("string_field", np.bytes_, (), ScalarCodec(types.StringType()),
                                                     False)])
    with pytest.raises(TypeError) as info:
        dict_to_spark_row(schema, {"string_field": []})
    assert isinstance(info.value, FieldTypeError) and isinstance(info.value, ValidationError)
    assert "field 'string_field'" in str(info.value)
    with pytest.raises(ValidationError) as null:  # None in a non-nullable field stays a ValueError only
        dict_to_spark_row(schema, {"string_field": None})
    assert not isinstance(null.value, TypeError)


def test_as_spark_schema_refuses_a_tensor_without_a_codec() -> None:
    spark_types()
    schema = Unischema("TestSchema", [UnischemaField("int_vector_unspecified_codec", np.int8, (1,))])
    with pytest.raises(SchemaError, match="non-scalar UnischemaField 'int_vector_unspecified_codec' has codec "
                                          "set to None"):
        schema.as_spark_schema()
    unknown = Unischema("TestSchema", [UnischemaField("x", object, ())])
    with pytest.raises(ValueError, match="Was not able to map type") as info:
        unknown.as_spark_schema()
    assert isinstance(info.value, SchemaError)


def test_schema_views_keep_petastorms_words() -> None:
    types = spark_types()
    schema = Unischema("TestSchema", [
        UnischemaField("int_field", np.int8, (), ScalarCodec(types.IntegerType()), False),
        UnischemaField("string_field", np.bytes_, (), ScalarCodec(types.StringType()), False),
    ])
    with pytest.raises(SchemaError, match="does not belong to the schema"):
        schema.create_schema_view([UnischemaField("id", np.int64, (), ScalarCodec(types.LongType()), False)])
    with pytest.raises(SchemaError, match="must be either a string"):
        schema.create_schema_view([42])


def test_a_field_named_like_a_unischema_attribute_is_warned_about() -> None:
    with pytest.warns(UserWarning, match="Can not create dynamic property fields"):
        schema = Unischema("TestSchema", [UnischemaField("fields", np.int32, (), None, True)])
    assert schema["fields"].name == "fields"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        schema.create_schema_view(["fields"])  # a view is not warned about again


def test_a_regex_whose_prefix_match_differs_is_warned_about() -> None:
    schema = Unischema("TestSchema", [UnischemaField("int32", np.int32, (), None, False),
                                      UnischemaField("uint8", np.uint8, (), None, False),
                                      UnischemaField("uint16", np.uint16, (), None, False)])
    # 'uint8|uint1' matches uint16's first five characters, not all of it
    with pytest.warns(UserWarning, match=r"schema_fields behavior has changed.*following fields: uint16$"):
        assert match_unischema_fields(schema, ["uint8|uint1"]) == [schema["uint8"]]
    with pytest.warns(UserWarning, match=r"schema_fields behavior has changed.*uint16, uint8"):
        assert match_unischema_fields(schema, ["uint"]) == []  # Petastorm's case: warned, and nothing matched
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same fields either way: no warning
        assert match_unischema_fields(schema, ["uint16", "int32", "uint8"]) == list(schema)


def test_fields_without_a_codec_equal_the_same_fields_with_one() -> None:
    bare = UnischemaField("id", np.int64, (), None, False)
    coded = UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False)
    assert bare == coded and coded == bare and hash(bare) == hash(coded) and not bare != coded
    assert {bare: 1}[coded] == 1
    assert coded != UnischemaField("id", np.int64, (), ScalarCodec(pa.int32()), False)  # two codecs still differ
    assert bare != UnischemaField("id", np.int64, (), None, True)
    assert bare != UnischemaField("id", np.int32, (), None, False)


def test_insert_explicit_nulls_as_petastorm() -> None:
    from unihub.schema import unischema as schema_module

    assert unihub.insert_explicit_nulls is schema_module.insert_explicit_nulls  # petastorm.unischema's name
    schema = Unischema("TestSchema", [UnischemaField("nullable", np.int32, (), None, True),
                                      UnischemaField("not_nullable", np.int32, (), None, False)])
    row = {"not_nullable": 1}
    insert_explicit_nulls(schema, row)
    assert row == {"not_nullable": 1, "nullable": None}
    full = {"nullable": 0, "not_nullable": 1}
    insert_explicit_nulls(schema, full)
    assert full == {"nullable": 0, "not_nullable": 1}
    with pytest.raises(ValueError, match="Field not_nullable is not found in the row_dict, but is not nullable") \
            as info:
        insert_explicit_nulls(schema, {"nullable": 0})
    assert isinstance(info.value, ValidationError)


# -- readers (test_reader.py, test_end_to_end.py, test_parquet_reader.py) ----------------------------
def test_an_empty_url_list_is_petastorms_value_error() -> None:
    for factory in (make_reader, make_batch_reader):
        with pytest.raises(ValueError, match="dataset url list must be non-empty") as info:
            factory([])
        assert isinstance(info.value, DatasetUrlError) and isinstance(info.value, DatasetNotFoundError)


def test_schema_fields_that_match_nothing_are_petastorms_runtime_error() -> None:
    for factory, url in ((make_reader, WITH_SCHEMA), (make_batch_reader, PLAIN)):
        with pytest.raises(RuntimeError, match="No fields matching the criteria.*bogus_field.*") as info:
            factory(url, schema_fields=["bogus_field"])
        assert isinstance(info.value, NoMatchingFieldsError) and isinstance(info.value, SchemaError)
        assert url in str(info.value) and "'id'" in str(info.value)  # the dataset and its fields


def test_too_many_shards_keep_petastorms_words() -> None:
    with pytest.raises(NoDataAvailableError, match="Number of row-groups in the dataset"):
        make_reader(WITH_SCHEMA, cur_shard=0, shard_count=10)


def test_shard_seed_is_warned_about_as_deprecated() -> None:
    with pytest.warns(UserWarning, match="shard_seed was deprecated and will be removed in future versions."):
        make_reader(WITH_SCHEMA, shard_seed=123, workers_count=1).stop()


def test_reading_after_stop_keeps_petastorms_words_and_stopped_is_public() -> None:
    reader = make_reader(WITH_SCHEMA, workers_count=1)
    assert reader.stopped is False
    next(reader)
    reader.stop()
    reader.join()
    assert reader.stopped is True
    with pytest.raises(RuntimeError, match="Trying to read a sample.*") as info:
        next(reader)
    assert isinstance(info.value, UsageError)
    reader.reset()  # after stop(): allowed, as Petastorm's
    assert reader.stopped is False
    assert len(list(reader)) == 60
    reader.stop()
    reader.join()


@pytest.mark.parametrize("pool", ["dummy", "thread", "process"])
def test_reset_in_the_middle_of_an_epoch_is_petastorms_not_implemented_error(pool: str) -> None:
    with make_reader(WITH_SCHEMA, reader_pool_type=pool, num_epochs=5, workers_count=1,
                     shuffle_row_groups=False) as reader:
        first = [int(next(reader).id) for _ in range(20)]
        with pytest.raises(NotImplementedError, match="in the middle of iteration") as info:
            reader.reset()
        assert isinstance(info.value, ReaderResetError) and isinstance(info.value, UsageError)
        rest = [int(row.id) for row in reader]  # the refused reset changed nothing
        assert len(first) + len(rest) == 5 * 60
        reader.reset()  # after the last row: allowed
        assert [int(next(reader).id) for _ in range(20)] == first
        reader.start_over()  # unihub's start from anywhere
        assert [int(next(reader).id) for _ in range(20)] == first


def test_a_second_concurrent_pass_of_the_in_memory_loader_raises() -> None:
    pytest.importorskip("torch")
    from unihub.bridges.torch import InMemBatchedDataLoader

    with make_reader(WITH_SCHEMA, schema_fields=["id"], workers_count=1) as reader:
        loader = InMemBatchedDataLoader(reader, batch_size=2, rows_capacity=100, shuffle=False)
        assert reader.stopped  # the rows are in memory: the reader was read and stopped, as Petastorm's
        first = iter(loader)
        next(first)
        second = iter(loader)
        with pytest.raises(RuntimeError, match="InMemBatchedDataLoader couldn't be used multiple times") as info:
            next(second)
        assert isinstance(info.value, UsageError)
        assert sum(len(batch["id"]) for batch in first) == 58  # the first pass goes on
        assert sum(len(batch["id"]) for batch in loader) == 60  # and a finished one may be followed by another


def test_unknown_fields_of_a_transform_spec_are_warned_about_in_petastorms_words() -> None:
    from unihub import TransformSpec
    from unihub.readers.transform import transform_schema

    schema = Unischema("TestSchema", [UnischemaField("string", np.str_, (), None, False),
                                      UnischemaField("int", np.int32, (), None, False)])
    with pytest.warns(UserWarning, match="not part of the schema.*unknown_1"):
        kept = transform_schema(schema, TransformSpec(lambda x: x, removed_fields=["int", "unknown_1"]))
    assert list(kept.fields) == ["string"]
    with pytest.warns(UserWarning, match="selected_fields specified some field names that are not part of the "
                                         "schema.*unknown_2"):
        transform_schema(schema, TransformSpec(lambda x: x, selected_fields=["int", "unknown_2"]))


def test_unknown_cache_and_pool_types_keep_petastorms_words() -> None:
    with pytest.raises(ValueError, match="Unknown cache_type"):
        make_reader(WITH_SCHEMA, cache_type="bogus_cache_type")
    with pytest.raises(ValueError, match="Unknown reader_pool_type"):
        make_reader(WITH_SCHEMA, reader_pool_type="bogus_pool_type")


def test_a_missing_path_without_a_scheme_is_also_petastorms_value_error(tmp_path: Path) -> None:
    from unihub import get_schema_from_dataset_url

    with pytest.raises(ValueError, match="no such file or directory") as info:
        get_schema_from_dataset_url(str(tmp_path / "invalid_url"))  # Petastorm refused any scheme-less URL
    assert isinstance(info.value, DatasetUrlError) and isinstance(info.value, FileNotFoundError)
    with pytest.raises(FileNotFoundError) as with_scheme:
        get_schema_from_dataset_url(f"file://{tmp_path / 'non-existing-path'}")
    assert not isinstance(with_scheme.value, ValueError)  # Petastorm's IOError only
    assert get_schema_from_dataset_url(str(FIXTURES / "unischema")).name  # an existing local path is read


def test_a_second_concurrent_pass_of_the_data_loader_keeps_petastorms_words() -> None:
    pytest.importorskip("torch")
    from unihub.bridges.torch import DataLoader

    with DataLoader(make_reader(WITH_SCHEMA, schema_fields=["id"], workers_count=1), batch_size=2) as loader:
        first = iter(loader)
        next(first)
        with pytest.raises(RuntimeError, match="You must finish a full pass of Petastorm DataLoader before making "
                                               "another pass from the beginning") as info:
            next(iter(loader))
        assert isinstance(info.value, UsageError)
        first.close()


def test_cleanup_cache_prints_petastorms_lines_instead_of_raising(tmp_path: Path, capsys, monkeypatch) -> None:
    with make_reader(WITH_SCHEMA, cache_type="null", workers_count=1) as reader:
        next(reader)
        reader.cleanup_cache()
    assert "Cache cleanup complete." in capsys.readouterr().out

    with make_reader(WITH_SCHEMA, cache_type="local-disk", cache_location=str(tmp_path / "cache"),
                     cache_size_limit=10**9, workers_count=1) as reader:
        next(reader)

        def failing_cleanup() -> None:
            raise OSError("Simulated cleanup error")

        monkeypatch.setattr(reader.cache, "cleanup", failing_cleanup)
        reader.cleanup_cache()
        out = capsys.readouterr().out
        assert "Error cleaning cache: Simulated cleanup error" in out and "Cache cleanup complete." in out
        with pytest.warns(UserWarning, match="Error cleaning cache: Simulated cleanup error"):
            reader.__exit__(None, None, None)  # the with-block's end warns, and prints nothing
        monkeypatch.undo()
    assert capsys.readouterr().out == ""


def test_an_unsupported_converter_dtype_keeps_petastorms_words() -> None:
    from unihub.bridges.spark.converter import make_spark_converter

    class FakeDataFrame:  # the dtype is checked before Spark is used
        sparkSession = None

    with pytest.raises(ValueError, match="dtype float16 is not supported. Use 'float32' or float64"):
        make_spark_converter(FakeDataFrame(), dtype="float16")


def test_a_predicate_that_leaves_no_row_group_is_warned_about(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from unihub import in_set

    table = pa.table({"id": list(range(6)), "split": ["train", "test"] * 3})
    pq.write_to_dataset(table, str(tmp_path), partition_cols=["split"])  # Hive partitions, as Spark writes them
    with pytest.warns(UserWarning, match="No matching data is available for loading.*none of the 2 row groups"):
        reader = make_batch_reader(f"file://{tmp_path}", predicate=in_set({"non existing value"}, "split"),
                                   workers_count=1)
    with reader:
        assert list(reader) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with make_batch_reader(f"file://{tmp_path}", predicate=in_set({"test"}, "split"), workers_count=1) as kept:
            assert sorted(int(i) for batch in kept for i in batch.id) == [1, 3, 5]


# -- issue 43: Petastorm's own tests, run on unihub (benchmarks/petastorm_conformance.py) -------------
INDEXED = FIXTURES / "rowgroup_index"  # Petastorm wrote it, Hive-partitioned by the string field `split`


def test_string_scalars_of_rows_are_numpy_strings_as_petastorms(tmp_path: Path) -> None:
    """test_end_to_end.py::test_simple_read compares type(value): Petastorm's rows hold numpy_dtype(value)."""
    import pyarrow.parquet as pq

    with make_reader(f"file://{INDEXED}", workers_count=1, shuffle_row_groups=False) as reader:
        rows = list(reader)
    assert {type(row.split) for row in rows} == {np.str_}  # the partition value, as Petastorm gave it
    assert {type(row.animal) for row in rows} == {np.str_}  # and any other string scalar
    assert {type(row.caption) for row in rows} <= {np.str_, type(None)}  # nulls stay None
    assert sorted(str(row.split) for row in rows) == ["test"] * 60 + ["train"] * 180
    pq.write_to_dataset(pa.table({"id": [1, 2, 3], "name": ["a", "bb", ""], "part": ["x", "y", "x"]}),
                        str(tmp_path), partition_cols=["part"])
    with make_reader(f"file://{tmp_path}", workers_count=1, shuffle_row_groups=False) as reader:
        rows = sorted(reader, key=lambda row: int(row.id))
    assert [(type(r.name), r.name, type(r.part), r.part) for r in rows] == [
        (np.str_, "a", np.str_, "x"), (np.str_, "bb", np.str_, "y"), (np.str_, "", np.str_, "x")]
    with make_batch_reader(f"file://{tmp_path}", workers_count=1) as batches:  # batches keep their columns
        assert all(batch.name.dtype == object for batch in batches)
    schema = Unischema("Own", [UnischemaField("id", np.int64, (), None, False),
                               UnischemaField("coded", np.str_, (), ScalarCodec(pa.string()), True),
                               UnischemaField("bare", np.str_, (), None, True)])
    unihub.write_dataset(tmp_path / "own", schema, [{"id": 0, "coded": "c", "bare": "b"},
                                                    {"id": 1, "coded": None, "bare": None}])
    with make_reader(tmp_path / "own", workers_count=1, shuffle_row_groups=False) as reader:
        rows = list(reader)  # unihub's own dataset: np.str_ only without a codec (Petastorm's numpy_dtype(value))
    assert [(type(r.coded), type(r.bare)) for r in rows] == [(str, np.str_), (type(None), type(None))]


class EqualPredicate(unihub.PredicateBase):
    """Petastorm's test predicate (test_end_to_end_predicates_impl.py): defines do_include only."""

    def __init__(self, values: dict) -> None:
        self.values = values
        self.calls: list[int] = []

    def get_fields(self):
        return list(self.values)

    def do_include(self, values):
        self.calls.append(len(values))
        return self.values == values


class VectorizedEqualPredicate(EqualPredicate):
    def do_include(self, values):
        self.calls.append(len(values))
        result = [True] * len(values)
        for name in self.values:
            result &= values[name] == self.values[name]
        return result


@pytest.mark.parametrize("factory", [make_reader, make_batch_reader])
@pytest.mark.parametrize("spec", [{"invalid_field_name": 1}, {}, {"invalid_field_name": 1, "id": 11}])
def test_a_predicate_the_dataset_cannot_serve_raises_when_read(factory, spec: dict) -> None:
    """test_end_to_end.py::test_predicate_with_invalid_fields: the reader is made; next() raises ValueError."""
    with factory(WITH_SCHEMA, predicate=EqualPredicate(spec), workers_count=1) as reader:
        for _ in range(2):  # every read, not only the first
            with pytest.raises(ValueError) as info:
                next(reader)
            if spec:
                assert isinstance(info.value, SchemaError)
                assert "column names requested by the predicate (invalid_field_name) are not valid schema " \
                       "names" in str(info.value) and WITH_SCHEMA in str(info.value)
            else:
                assert isinstance(info.value, InvalidArgumentError)
                assert "At least one field name must be returned by predicate" in str(info.value)


def test_a_predicate_of_ones_own_gets_a_row_group_of_columns_in_make_batch_reader() -> None:
    """test_end_to_end.py::test_predicate_on_multiple_fields_batched: one do_include call per row group."""
    predicate = VectorizedEqualPredicate({"id": 11, "label": 4})
    with make_batch_reader(WITH_SCHEMA, predicate=predicate, workers_count=1, shuffle_row_groups=False) as reader:
        batches = [batch for batch in reader if len(batch.id)]
    assert [(batch.id.tolist(), batch.label.tolist()) for batch in batches] == [([11], [4])]
    assert predicate.calls == [20, 20, 20]  # 3 row groups of 20 rows: 3 calls, each given 20 rows
    with make_reader(WITH_SCHEMA, predicate=EqualPredicate({"id": 11}), workers_count=1) as rows:
        assert [int(row.id) for row in rows] == [11]  # make_reader: one row at a time, as before
    with make_batch_reader(WITH_SCHEMA, predicate=EqualPredicate({"id": 11}), workers_count=1) as reader, \
            pytest.raises(InvalidArgumentError, match="once per row group"):
        next(reader)  # a per-row test given a row group: told how make_batch_reader calls it
    for own in (unihub.in_set({11, 12}, "id"), unihub.in_lambda(["id"], lambda i: i in (11, 12))):
        with make_batch_reader(WITH_SCHEMA, predicate=own, workers_count=1) as reader:  # unihub's: row-wise
            assert sorted(int(i) for batch in reader for i in batch.id) == [11, 12]


def test_schema_fields_that_match_nothing_are_left_out_as_petastorm() -> None:
    """test_unischema.py, test_parquet_reader.py::test_invalid_and_valid_column_names: left out (with a word)."""
    schema = Unischema("TestSchema", [UnischemaField("int32", np.int32, (), None, False),
                                      UnischemaField("uint16", np.uint16, (), None, False)])
    with pytest.warns(UserWarning, match=r"\['nomatch'\] match no field of Unischema 'TestSchema'"):
        assert match_unischema_fields(schema, ["nomatch"]) == []
    with pytest.warns(UserWarning, match=r"\['bogus'\] match no field"):
        assert not schema.create_schema_view(["bogus"]).fields
    with pytest.warns(UserWarning, match=r"schema_fields \['idVR46'\] match no field in the dataset file://"):
        reader = make_reader(WITH_SCHEMA, schema_fields=["idVR46", "label"], workers_count=1)
    with reader:
        assert list(next(reader)._asdict()) == ["label"]


def test_copy_refuses_field_regexes_that_match_nothing(tmp_path: Path) -> None:
    """test_copy_dataset.py::test_bad_regex: Petastorm's ValueError words; nothing written."""
    from unihub.converters.copy import copy_dataset

    target = tmp_path / "copy"
    for regexes in (["bogus_name"], ["id", "bogus_name"]):
        with pytest.raises(ValueError, match="do not match any fields") as info:
            copy_dataset(None, WITH_SCHEMA, f"file://{target}", regexes, [], False, 1, 196)
        assert isinstance(info.value, NoMatchingFieldsError) and "'bogus_name'" in str(info.value)
    assert not target.exists()


def test_a_file_listed_twice_is_read_twice_as_petastorm() -> None:
    """test_end_to_end.py::test_simple_read_from_parquet_file."""
    one_file = f"file://{sorted((FIXTURES / 'unischema').glob('*.parquet'))[0]}"
    with make_reader(one_file, schema_fields=["id"], workers_count=1) as once:
        ids = sorted(int(row.id) for row in once)
    with make_reader([one_file, one_file], schema_fields=["id"], workers_count=1) as twice:
        assert sorted(int(row.id) for row in twice) == sorted(ids * 2)


def test_an_ngram_takes_a_decimal_delta_threshold() -> None:
    """test_ngram_end_to_end.py::test_ngram_validation: Decimal('0.5') is a threshold, as Petastorm's."""
    from decimal import Decimal

    from unihub import NGram

    windows = {}
    for threshold in (1, Decimal("1.5"), Decimal("0.5")):
        ngram = NGram({0: ["id"], 1: ["id"]}, delta_threshold=threshold, timestamp_field="id")
        with make_reader(WITH_SCHEMA, schema_fields=ngram, workers_count=1, shuffle_row_groups=False) as reader:
            windows[threshold] = [(int(w[0].id), int(w[1].id)) for w in reader]
    assert windows[Decimal("1.5")] == windows[1] and len(windows[1]) == 57  # ids 0..59 in 3 row groups
    assert windows[Decimal("0.5")] == []
    with pytest.raises(ValueError, match="must be >= 0"):
        NGram({0: ["id"]}, delta_threshold=Decimal("NaN"), timestamp_field="id")


@pytest.mark.parametrize("pool", ["dummy", "thread", "process"])
def test_diagnostics_carry_petastorms_pool_counters(pool: str) -> None:
    """test_reader.py::test_diagnostics_reader_v1, test_bound_size_of_output_queue_size_reader."""
    with make_reader(WITH_SCHEMA, schema_fields=["id"], reader_pool_type=pool, workers_count=1,
                     shuffle_row_groups=False) as reader:
        assert reader.diagnostics["items_produced"] == 0 and reader.diagnostics["output_queue_size"] == 0
        next(reader)
        diagnostics = reader.diagnostics
        consumed, produced = diagnostics["items_consumed"], diagnostics["items_produced"]
        assert 1 <= produced <= consumed <= 3  # 3 row groups: a task each
        assert diagnostics["items_inprocess"] == consumed - produced
        assert diagnostics["output_queue_size"] == produced - 1  # done, not yet handed to the reader
        assert len(list(reader)) == 59 and reader.diagnostics["items_produced"] == 3


def test_a_predicate_on_partitions_only_chooses_row_groups_and_tests_no_row() -> None:
    """test_end_to_end.py::test_predicate_on_partition_batched: a do_include written for a row's dict works
    in make_batch_reader when it tests only partition values (Petastorm gave it to no worker)."""

    class PartitionKeyInSetPredicate(unihub.PredicateBase):
        def __init__(self, values: set) -> None:
            self.values, self.calls = values, []

        def get_fields(self):
            return {"split"}

        def do_include(self, values):
            self.calls.append(values["split"])
            return values["split"] in self.values

    for factory in (make_reader, make_batch_reader):
        predicate = PartitionKeyInSetPredicate({"test"})
        with factory(f"file://{INDEXED}", predicate=predicate, workers_count=1) as reader:
            splits = {str(s) for item in reader for s in np.atleast_1d(item.split)}
        assert splits == {"test"} and sorted(predicate.calls) == ["test", "train"]  # once per partition


class _RowsWithoutState:
    """What Petastorm's ``ReaderMock`` is to its tests: rows of a schema, an iterator, no ``state_dict()``."""

    def __init__(self, schema: Unischema, start: int) -> None:
        self.schema, self.batched_output, self.ngram, self.num_epochs = schema, False, None, None
        self._next = start

    def __iter__(self) -> _RowsWithoutState:
        return self

    def __next__(self) -> object:
        self._next += 1
        return self.schema.make_namedtuple(f1=np.int32(self._next))

    def stop(self) -> None:
        pass

    def join(self) -> None:
        pass


def test_a_loader_over_a_mix_of_readers_without_state_reads_and_refuses_only_its_state() -> None:
    """Petastorm's loaders take a mix of mock readers (test_weighted_sampling_reader.py::test_with_torch_api);
    unihub's loaders track positions through state_dict(), which such readers lack."""
    from unihub.bridges.torch import DataLoader, LoaderStateError

    schema = Unischema("Mocked", [UnischemaField("f1", np.int32, (), ScalarCodec(pa.int32()), False)])
    mixer = WeightedSamplingReader([_RowsWithoutState(schema, 0), _RowsWithoutState(schema, 1000)], [0.5, 0.5],
                                   seed=0)
    assert not mixer.keeps_state
    with DataLoader(mixer, batch_size=2) as loader:
        batch = next(iter(loader))
        assert batch["f1"].shape[0] == 2
        with pytest.raises(LoaderStateError, match="keeps no state"):
            loader.state_dict()


# -- found by running the same code on Petastorm 0.13.1 and on unihub, on these fixtures ----------------
def test_readers_have_petastorms_batched_output_last_row_consumed_and_next() -> None:
    """Petastorm's ``Reader.batched_output`` (its TF bridge read it), ``last_row_consumed`` and ``next()``."""
    with make_batch_reader(PLAIN, workers_count=1) as reader:
        assert reader.batched_output is True
    with make_reader(WITH_SCHEMA, schema_fields=["id"], workers_count=1) as reader:
        assert reader.batched_output is False and reader.last_row_consumed is False
        assert reader.next().id in range(60)
        assert reader.last_row_consumed is False  # rows are left
        assert len(list(reader)) == 59
        assert reader.last_row_consumed is True  # the loop's StopIteration came
        reader.reset()
        assert reader.last_row_consumed is False


@pytest.mark.parametrize("empty", [[], ()])
def test_an_empty_schema_fields_list_reads_every_field_as_petastorm(empty) -> None:
    """Petastorm reads every field for ``schema_fields=[]`` (as for None); it read none here."""
    with make_reader(WITH_SCHEMA, schema_fields=empty, workers_count=1) as reader:
        assert list(reader.schema.fields) == list(unihub.open_dataset(WITH_SCHEMA).schema.fields)
        assert len(list(reader)) == 60
    with make_batch_reader(PLAIN, schema_fields=empty, workers_count=1) as reader:
        assert list(next(reader)._fields) == ["id", "label", "x", "name", "pair"]


def test_a_predicate_that_is_not_one_is_petastorms_value_error() -> None:
    """A plain function as ``predicate``: Petastorm's ValueError, where an AttributeError escaped."""
    for factory, url in ((make_reader, WITH_SCHEMA), (make_batch_reader, PLAIN)):
        with pytest.raises(ValueError, match="predicate parameter is expected to be derived from PredicateBase") \
                as info:
            factory(url, predicate=lambda row: True)
        assert isinstance(info.value, InvalidArgumentError) and "in_lambda" in str(info.value)


def test_reader_arguments_may_be_passed_by_position_in_petastorms_order() -> None:
    """``make_reader(url, fields, 'dummy', 2)`` as Petastorm's signature takes it (``pyarrow_serialize`` is
    ``make_reader``'s fourth, not ``make_batch_reader``'s)."""
    with make_reader(WITH_SCHEMA, ["id"], "dummy", 2, False, 50, 7, False, False) as reader:
        assert reader.diagnostics["pool_type"] == "dummy" and reader.seed == 7
        assert [int(row.id) for row in reader] == list(range(60))  # shuffle_row_groups=False, by position
    with make_batch_reader(PLAIN, ["id"], "dummy", 2, 50, 7) as reader:
        assert reader.diagnostics["pool_type"] == "dummy" and reader.seed == 7
    with pytest.raises(TypeError, match="got multiple values for argument 'reader_pool_type'"):
        make_reader(WITH_SCHEMA, None, "dummy", reader_pool_type="thread")
    with pytest.raises(TypeError, match=r"make_batch_reader\(\) takes from 1 to 27 positional arguments"):
        make_batch_reader(PLAIN, None, *([None] * 26))


def test_a_batch_transforms_uniform_lists_come_back_stacked_as_petastorms() -> None:
    """Petastorm stacks a transform's list columns as it stacks read ones: ``(n, k)``, not an object array."""
    pd = pytest.importorskip("pandas")
    from unihub import TransformSpec

    def halve(frame: pd.DataFrame) -> pd.DataFrame:
        return frame.assign(pair=frame.pair.map(lambda v: np.asarray(v[:1], np.float64)))

    spec = TransformSpec(halve, edit_fields=[("pair", np.float64, (None,), False)])
    with make_batch_reader(PLAIN, schema_fields=["id", "pair"], transform_spec=spec, workers_count=1) as reader:
        batch = next(reader)
    assert batch.pair.dtype == np.float64 and batch.pair.shape == (len(batch.id), 1)
    with make_batch_reader(PLAIN, schema_fields=["id", "pair"], transform_spec=spec, workers_count=1,
                           petastorm_types=False) as reader:
        assert next(reader).pair.dtype == object  # unihub's types keep object arrays for None dims


def test_byte_codecs_give_their_spark_type_without_a_field() -> None:
    """Petastorm's ``codec.spark_dtype()`` takes no field (``StructField(f.name, f.codec.spark_dtype())``)."""
    types = spark_types()
    for codec in (unihub.NdarrayCodec(), unihub.CompressedNdarrayCodec(), CompressedImageCodec("jpeg")):
        assert codec.spark_dtype() == types.BinaryType()
    assert ScalarCodec(types.IntegerType()).spark_dtype() == types.IntegerType()


def test_petastorms_keyword_names_are_taken(tmp_path: Path) -> None:
    """Calls that name Petastorm's parameters: ``match_unischema_fields(schema, field_regex=...)``,
    ``transform_schema(schema, transform_spec=...)``, ``Unischema.from_arrow_schema(parquet_dataset=...)``,
    ``ScalarCodec(spark_type=...)``, ``LocalDiskCache(path=..., expected_row_size_bytes=...)``."""
    from unihub import TransformSpec
    from unihub.readers.local_disk_cache import LocalDiskCache
    from unihub.readers.transform import transform_schema

    schema = Unischema("TestSchema", [UnischemaField("id", np.int64, (), None, False),
                                      UnischemaField("label", np.int32, (), None, False)])
    assert match_unischema_fields(schema, field_regex=["la.*"]) == [schema["label"]]
    assert list(transform_schema(schema, transform_spec=TransformSpec(removed_fields=["id"])).fields) == ["label"]
    inferred = Unischema.from_arrow_schema(parquet_dataset=pa.schema([("x", pa.float32())]))
    assert inferred["x"].numpy_dtype == np.float32
    assert ScalarCodec(spark_type=pa.int16()).arrow_type(inferred["x"]) == pa.int16()
    cache = LocalDiskCache(path=str(tmp_path / "cache"), size_limit_bytes=10**6, expected_row_size_bytes=1000)
    assert cache.location == str(tmp_path / "cache") and cache.row_size_estimate == 1000
    with pytest.raises(ValueError, match="expected_row_size_bytes"):
        LocalDiskCache(path=str(tmp_path / "small"), size_limit_bytes=100, expected_row_size_bytes=1000)


@pytest.mark.parametrize("capacity", [0, 10])
def test_a_collate_fn_of_ones_own_gets_rows_as_dicts_as_petastorms(capacity: int) -> None:
    """Petastorm's DataLoader hands ``collate_fn`` a list of dicts (``row._asdict()``); it got namedtuples,
    so a collate written for Petastorm (``row["id"]``) failed."""
    pytest.importorskip("torch")
    from unihub.bridges.torch import DataLoader, decimal_friendly_collate

    seen: list[Any] = []

    def collate(rows: list[dict[str, Any]]) -> Any:
        seen.extend(rows)
        return {"id": [row["id"] for row in rows], **decimal_friendly_collate([{"label": r["label"]} for r in rows])}

    reader = make_reader(WITH_SCHEMA, schema_fields=["id", "label", "split"], workers_count=1)
    with DataLoader(reader, batch_size=8, collate_fn=collate, shuffling_queue_capacity=capacity) as loader:
        batches = list(loader)
    assert all(type(row) is dict and list(row) == ["id", "split", "label"] for row in seen)
    assert sorted(int(i) for batch in batches for i in batch["id"]) == list(range(60))
    assert batches[0]["label"].shape == (8,)


# -- petastorm.utils.decode_row (test_decode_row.py) ----------------------------------------------------------
def test_decode_row_decodes_a_stored_row_as_the_reader_does() -> None:
    """Rows read as stored (a Spark ``Row.asDict()``) decoded by the fields' codecs: the values ``make_reader`` gives
    (Petastorm's ``petastorm.utils.decode_row``; it was missing); names the schema lacks left out, None kept."""
    import pyarrow.parquet as pq

    from unihub import DecodeFieldError, decode_row, get_schema_from_dataset_url

    schema = get_schema_from_dataset_url(WITH_SCHEMA)
    stored = pq.read_table(str(FIXTURES / "unischema"), schema=None).to_pylist()
    with make_reader(WITH_SCHEMA, shuffle_row_groups=False, num_epochs=1) as reader:
        read = {int(row.id): row._asdict() for row in reader}
    for row in stored:
        decoded = decode_row({**row, "not_a_field": 1}, schema)
        expected = read[int(row["id"])]
        assert set(decoded) == set(expected)
        for name, value in expected.items():
            if row[name] is None:  # Petastorm's decode_row keeps None (its reader gave NaN for a float)
                assert decoded[name] is None
            elif isinstance(value, np.ndarray):
                assert decoded[name].dtype == value.dtype and np.array_equal(decoded[name], value)
            else:
                assert decoded[name] == value and type(decoded[name]) is type(value)
    assert decode_row({"id": None}, schema) == {"id": None}
    image = next(name for name, f in schema.fields.items() if isinstance(f.codec, CompressedImageCodec))
    with pytest.raises(RuntimeError, match=f'Decoding field "{image}" failed') as info:
        decode_row({image: b"not an image"}, schema)
    assert isinstance(info.value, DecodeFieldError) and isinstance(info.value, CodecError)
