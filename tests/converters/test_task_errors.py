"""A task's unihub error, carried through text as Spark carries it: the same class, message and attributes."""

from __future__ import annotations

import traceback

import pytest

from unihub import ScalarCodec, Unischema, UnischemaField
from unihub.converters.task_errors import MARKER, carried, carrier
from unihub.errors import (
    DataCorruptionError,
    DatasetChangedError,
    FormatError,
    RemoteStorageError,
    UnihubError,
    ValidationError,
)
from unihub.formats.base import SchemaOutgrown


def _through_text(error: BaseException) -> BaseException | None:
    """``error`` raised in a task as spark_task raises it, then rebuilt from its traceback text (as the
    driver gets it, wrapped in Spark's own lines)."""
    try:
        try:
            raise error
        except BaseException as exc:
            wrapper = carrier(exc)
            assert wrapper is not None
            raise wrapper from exc
    except BaseException:
        text = traceback.format_exc()
    return carried("org.apache.spark.SparkException: Job aborted\n" + text + "\n\tat org.apache.spark.Foo")


@pytest.mark.parametrize("error", [
    FormatError("/d/part-1.tfrecord: record 3: data CRC mismatch", path="/d/part-1.tfrecord", offset=1234),
    ValidationError("field 'x' row 7: expected shape (3,)", field="x", row=7),
    DataCorruptionError("page CRC", path="s3://b/k.parquet", row_group=2, column="image"),
    DatasetChangedError("gone", path="/d/part-0.parquet"),
    RemoteStorageError("s3://b/k: timed out\nafter 2 retries", url="s3://b/k"),
    FormatError("no path given"),
], ids=lambda e: type(e).__name__)
def test_a_unihub_error_comes_back_whole(error: UnihubError) -> None:
    back = _through_text(error)
    assert type(back) is type(error)
    assert str(back) == str(error) and back.args == error.args
    assert vars(back) == vars(error)


def test_a_schema_outgrown_brings_its_schema() -> None:
    schema = Unischema("s", [UnischemaField("id", "int64", (), ScalarCodec("int64"), False)])
    back = _through_text(SchemaOutgrown("/d/x.tfrecord record 40: 'vec' longer", schema))
    assert isinstance(back, SchemaOutgrown) and str(back) == "/d/x.tfrecord record 40: 'vec' longer"
    assert back.schema is not None and back.schema.to_json() == schema.to_json()


def test_other_errors_are_not_carried() -> None:
    assert carrier(OSError("disk")) is None
    assert carrier(KeyboardInterrupt()) is None


@pytest.mark.parametrize("record", [
    '{"class":"os:system","args":["echo hi"],"attributes":{}}',  # not unihub's
    '{"class":"unihub.errors:InvalidArgumentError.__init__","args":[],"attributes":{}}',  # not a class
    '{"class":"builtins:ValueError","args":["x"],"attributes":{}}',
    '{"class":"unihub.errors:FormatError"',  # cut short
    '{"class":"unihub.nowhere:FormatError","args":[],"attributes":{}}',  # a module never imported
])
def test_nothing_but_a_unihub_class_is_rebuilt(record: str) -> None:
    assert carried(f"{MARKER}{record}\n") is None
    assert carried("unihub.errors.FormatError: plain text, no record") is None
