"""``adopt_files`` / ``unihub adopt``: data files another tool put into a dataset's folder (Spark's
``mode("append")``, pyarrow, a copy) become its next version where they fit the latest schema, and are read by
unihub's readers from then on; a file that does not fit is a named error and nothing is published."""

from __future__ import annotations

import io
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from unihub import (
    AppendSchemaError,
    FormatError,
    ScalarCodec,
    Unischema,
    UnischemaField,
    VersionNotFoundError,
    adopt_files,
    list_versions,
    make_batch_reader,
    make_reader,
    open_dataset,
    write_dataset,
)
from unihub.fs import filesystem as fsutil
from unihub.viewer.describe import describe_dataset

from .test_versions import SCHEMA, ids, rows, table_of

FOREIGN = "part-00001-0f1e2d3c-c000.snappy.parquet"  # as Spark names an appended file


def grown(tmp_path: Path) -> str:
    """A dataset with version records: a write and an append (8 rows)."""
    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 6))
    write_dataset(url, SCHEMA, rows(6, 8), mode="append")
    return url


def foreign_table(url: str, first_id: int, n: int = 4) -> pa.Table:
    """``n`` rows of the dataset's columns as another tool writes them: every column nullable, no unihub metadata."""
    table = pq.read_table(open_dataset(url).files[0].path).slice(0, n)
    table = table.set_column(0, "id", pa.array(range(first_id, first_id + n), pa.int64()))
    return table.cast(pa.schema([f.with_nullable(True) for f in table.schema])).replace_schema_metadata(None)


def test_a_file_another_tool_wrote_is_adopted_and_read_with_the_rest(tmp_path: Path) -> None:
    url = grown(tmp_path)
    table = foreign_table(url, 100)
    pq.write_table(table, f"{url}/{FOREIGN}")
    version = adopt_files(url, tag="spark")
    assert version is not None and (version.number, version.operation, version.tag, version.added_rows) == (
        3, "adopt", "spark", 4)
    assert version.parts == (*list_versions(url)[1].parts, FOREIGN)
    assert ids(url) == [*range(8), *range(100, 104)] and ids(url, version=2) == list(range(8))
    with make_reader(url, shuffle_row_groups=False) as reader:
        read = {int(r.id): r for r in reader}
    for copied in rows(0, 4):  # the file holds rows 0-3's values under ids 100-103: read bit-exact
        row = read[100 + copied["id"]]
        assert row.vec.dtype == np.float32 and row.vec.tobytes() == copied["vec"].tobytes()
        assert row.name == copied["name"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "no version lists" warning any more
        write_dataset(url, SCHEMA, rows(8, 9), mode="append")
    assert adopt_files(url) is None and len(list_versions(url)) == 4


def test_a_file_without_a_nullable_field_reads_nulls_there(tmp_path: Path) -> None:
    url = grown(tmp_path)
    pq.write_table(foreign_table(url, 100).drop_columns(["name"]), f"{url}/{FOREIGN}")
    assert adopt_files(url) is not None
    assert table_of(url)["name"].to_pylist()[-4:] == [None] * 4
    with make_batch_reader(url, shuffle_row_groups=False) as reader:
        assert sorted(int(i) for batch in reader for i in batch.id) == [*range(8), *range(100, 104)]


def _nulls_in_id(table: pa.Table) -> pa.Table:
    return table.set_column(0, "id", pa.array([100, None, 102, 103], pa.int64()))


MISFITS = {
    "a column the dataset lacks": (lambda t: t.append_column("extra", pa.array([1] * 4)),
                                   "extra: not a column of the dataset"),
    "another integer width": (lambda t: t.set_column(0, "id", t["id"].cast(pa.int32())),
                              "id: int32 in the file, int64 in the dataset"),
    "a null where the dataset has none": (_nulls_in_id, "id: nulls in the file where the dataset's may not be null"),
    "a field that may not be null missing": (lambda t: t.drop_columns(["id"]),
                                             "id: missing, and the dataset's may not be null"),
    "the columns in another order": (lambda t: t.select(["vec", "id", "name"]),
                                     r"columns in the order \['vec', 'id', 'name'\]"),
}


@pytest.mark.parametrize("change, message", MISFITS.values(), ids=MISFITS.keys())
def test_a_file_that_does_not_fit_is_named_and_nothing_is_adopted(tmp_path: Path, change: Any, message: str) -> None:
    url = grown(tmp_path)
    pq.write_table(foreign_table(url, 200), f"{url}/a-{FOREIGN}")  # one that fits, before the one that does not
    pq.write_table(change(foreign_table(url, 100)), f"{url}/{FOREIGN}")
    with pytest.raises(AppendSchemaError, match=rf"{FOREIGN}: does not fit the dataset's schema, so no file was "
                                                rf"adopted: .*{message}"):
        adopt_files(url)
    assert len(list_versions(url)) == 2 and ids(url) == list(range(8))
    assert (tmp_path / "ds" / FOREIGN).exists() and (tmp_path / "ds" / f"a-{FOREIGN}").exists()


def test_nulls_are_looked_for_where_the_statistics_do_not_say(tmp_path: Path) -> None:
    url = grown(tmp_path)
    pq.write_table(_nulls_in_id(foreign_table(url, 100)), f"{url}/{FOREIGN}", write_statistics=False)
    with pytest.raises(AppendSchemaError, match="id: nulls in the file where"):
        adopt_files(url)
    pq.write_table(foreign_table(url, 100), f"{url}/{FOREIGN}", write_statistics=False)
    assert adopt_files(url) is not None


@pytest.mark.parametrize("content", [b"", b"PAR1 not really", b"PAR1" + bytes(200) + b"PAR1"],
                         ids=["empty", "a header only", "a footer of zeros"])
def test_a_file_that_is_not_parquet_is_a_format_error_naming_it(tmp_path: Path, content: bytes) -> None:
    url = grown(tmp_path)
    (tmp_path / "ds" / FOREIGN).write_bytes(content)
    with pytest.raises(FormatError, match=rf"{FOREIGN}: not a Parquet file unihub can adopt"):
        adopt_files(url)
    assert len(list_versions(url)) == 2


def test_a_file_whose_footer_pyarrow_cannot_read_is_not_adopted(tmp_path: Path) -> None:
    """A compression codec pyarrow does not know (store/_footer.py): the file fitted the schema and was adopted, and
    the dataset's latest version could not be read ('Unsupported compression codec value: 18')."""
    url = grown(tmp_path)
    buffer = io.BytesIO()
    pq.write_table(foreign_table(url, 100), buffer, compression="none")
    data, codec = buffer.getvalue(), b"\x19\x18\x02id\x15"  # ColumnMetaData of "id": its path, then its codec
    assert data.count(codec + b"\x00") == 1
    (tmp_path / "ds" / FOREIGN).write_bytes(data.replace(codec + b"\x00", codec + b"\x24"))  # 0 -> 18 (zigzag 36)
    with pytest.raises(FormatError, match=rf"{FOREIGN}: not a readable Parquet file: .*compression codec 18"):
        adopt_files(url)
    assert len(list_versions(url)) == 2 and ids(url) == list(range(8))


def test_nothing_to_adopt_writes_nothing(tmp_path: Path) -> None:
    """A dataset written once on a local disk: every file in it is its version 1 (no record made)."""
    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 6))
    pq.write_table(foreign_table(url, 100), f"{url}/{FOREIGN}")
    assert adopt_files(url) is None and not (tmp_path / "ds" / "_unihub_versions").exists()
    with make_reader(url, schema_fields=["id"], shuffle_row_groups=False) as reader:  # read as version 1 all along
        assert sorted(int(r.id) for r in reader) == [*range(6), *range(100, 104)]


def test_a_tag_in_use_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 6))
    write_dataset(url, SCHEMA, rows(6, 8), mode="append", tag="more")
    pq.write_table(foreign_table(url, 100), f"{url}/{FOREIGN}")
    with pytest.raises(VersionNotFoundError, match="tag 'more' names version 2 already"):
        adopt_files(url, tag="more")


def test_adopted_files_are_deleted_from_and_compacted_like_the_others(tmp_path: Path) -> None:
    from unihub import compact_dataset, delete_rows

    url = grown(tmp_path)
    pq.write_table(foreign_table(url, 100), f"{url}/{FOREIGN}")
    adopt_files(url)
    delete_rows(url, pc.field("id") == 101)
    compact_dataset(url)
    assert ids(url) == [*range(8), 100, 102, 103]


def test_the_command_line_adopts_and_names_a_misfit(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from unihub.cli import main

    url = grown(tmp_path)
    pq.write_table(foreign_table(url, 100), f"{url}/{FOREIGN}")
    assert main(["inspect", url]) == 0
    assert "not in any version: 1 data file(s) another tool wrote" in capsys.readouterr().out
    assert main(["adopt", url, "--tag", "spark"]) == 0
    assert capsys.readouterr().out == f"adopted 1 file(s), 4 row(s), as version 3: {url}\n  {FOREIGN}\n"
    assert main(["adopt", url]) == 0
    assert "nothing adopted, no version made" in capsys.readouterr().out
    pq.write_table(foreign_table(url, 200).drop_columns(["id"]), f"{url}/b-{FOREIGN}")
    assert main(["adopt", url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("unihub: error: ") and err.count("\n") == 1 and "id: missing" in err


def test_on_s3_a_file_appended_to_a_dataset_written_once_is_adopted(s3_server: Any) -> None:
    """Written once on an object store, a dataset is what its manifest lists: another tool's file is not read
    until adopted (version 1 is recorded first)."""
    url = f"s3://{s3_server.bucket}/adopt-{uuid.uuid4().hex[:8]}/ds"
    options = s3_server.storage_options()
    fs, root = fsutil.resolve_filesystem(url, None, options)
    write_dataset(url, SCHEMA, rows(0, 6), storage_options=options)
    with fs.open_output_stream(f"{root}/{FOREIGN}") as out:
        pq.write_table(foreign_table_of(url, options), out)
    assert ids(url, storage_options=options) == list(range(6))
    described = describe_dataset(url, store=open_dataset(url, storage_options=options))
    assert described["foreign_files"] == [FOREIGN]  # unihub inspect's line
    version = adopt_files(url, storage_options=options)
    assert version is not None and version.number == 2
    assert [v.operation for v in list_versions(url, storage_options=options)] == ["write", "adopt"]
    assert ids(url, storage_options=options) == [*range(6), *range(100, 104)]


def foreign_table_of(url: str, options: dict[str, Any]) -> pa.Table:
    store = open_dataset(url, storage_options=options)
    with store.filesystem.open_input_file(store.files[0].path) as handle:
        table = pq.read_table(handle).slice(0, 4)  # as stored
    table = table.set_column(0, "id", pa.array(range(100, 104), pa.int64()))
    return table.cast(pa.schema([f.with_nullable(True) for f in table.schema])).replace_schema_metadata(None)


SPARK_SCHEMA = Unischema("Scalars", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                     UnischemaField("score", np.float64, (), ScalarCodec(pa.float64()), False),
                                     UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), True)])


@pytest.mark.spark
def test_rows_spark_appended_are_adopted_and_read_as_spark_wrote_them(spark: Any, tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    write_dataset(url, SPARK_SCHEMA, [{"id": i, "score": i / 3, "name": f"n{i}"} for i in range(6)])
    write_dataset(url, SPARK_SCHEMA, [{"id": 6, "score": 2.0, "name": None}], mode="append")
    appended = [(100 + i, (100 + i) / 7, None if i % 2 else f"s{i}") for i in range(5)]
    spark.createDataFrame(appended, "id long, score double, name string").coalesce(1) \
        .write.mode("append").parquet(url)
    version = adopt_files(url)
    assert version is not None and version.added_rows == 5
    assert all(rel.startswith("part-") and rel.endswith(".parquet") for rel in version.parts[-1:])
    with make_reader(url, shuffle_row_groups=False) as reader:
        read = sorted((int(r.id), float(r.score), r.name) for r in reader)
    assert read[-5:] == appended and len(read) == 12
    shutil.rmtree(tmp_path / "ds")


def test_petastorms_listing_names_the_adopted_file(tmp_path: Path) -> None:
    """Petastorm takes each file's row groups from ``_common_metadata``'s JSON: the adopted file is listed there."""
    import json

    from unihub.petastorm.legacy import PETASTORM_ROW_GROUPS_KEY

    url = str(tmp_path / "ds")
    write_dataset(url, SPARK_SCHEMA, [{"id": i, "score": i / 3, "name": f"n{i}"} for i in range(6)],
                  petastorm_compatible=True)
    write_dataset(url, SPARK_SCHEMA, [{"id": 6, "score": 2.0, "name": None}], mode="append")
    pq.write_table(pa.table({"id": [100, 101], "score": [0.5, 1.5], "name": ["a", None]}), f"{url}/{FOREIGN}")
    version = adopt_files(url)
    assert version is not None
    listed = json.loads(pq.read_metadata(f"{url}/_common_metadata").metadata[PETASTORM_ROW_GROUPS_KEY])
    assert sorted(listed) == sorted(version.parts) and listed[FOREIGN] == 1


def test_a_partitioned_dataset_adopts_files_under_its_partition_folders_only(tmp_path: Path) -> None:
    schema = Unischema("Cities", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                  UnischemaField("city", np.str_, (), ScalarCodec(pa.string()), False)])
    url = str(tmp_path / "ds")
    write_dataset(url, schema, [{"id": i, "city": "ab"[i % 2]} for i in range(6)], partition_by=["city"])
    write_dataset(url, schema, [{"id": 10, "city": "a"}], partition_by=["city"], mode="append")
    (tmp_path / "ds" / "city=c").mkdir()
    pq.write_table(pa.table({"id": pa.array([20, 21], pa.int64())}), f"{url}/city=c/{FOREIGN}")
    pq.write_table(pa.table({"id": pa.array([30], pa.int64())}), f"{url}/{FOREIGN}")
    with pytest.raises(AppendSchemaError, match=rf"ds/{FOREIGN}: .*partition folders \(none\): the dataset's files are "
                                                r"under city=\.\.\."):
        adopt_files(url)
    (tmp_path / "ds" / FOREIGN).unlink()
    assert adopt_files(url) is not None
    with make_reader(url, shuffle_row_groups=False) as reader:
        assert sorted((int(r.id), r.city) for r in reader) == [
            *sorted((i, "ab"[i % 2]) for i in range(6)), (10, "a"), (20, "c"), (21, "c")]


def test_a_dataset_without_versions_keeps_a_files_own_nullable_flag(tmp_path: Path) -> None:
    """Only a version's files are read under its schema's null flags (adopt checked them); in a dataset without
    versions another tool's file may hold nulls under a column the first file stores as required."""
    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 3))
    pq.write_table(foreign_table(url, 100, 3).set_column(0, "id", pa.array([None, 7, 8], pa.int64())),
                   f"{url}/{FOREIGN}")
    store = open_dataset(url)
    table = store.read_row_group(len(store.row_groups) - 1)
    assert table.schema.field("id").nullable and table.column("id").to_pylist() == [None, 7, 8]
