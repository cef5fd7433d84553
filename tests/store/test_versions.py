"""A dataset that grows (store/versions.py): append, versions, time travel, tags, vacuum, reader pinning,
concurrent appenders and a kill mid-append, on a local disk and on moto's S3 server."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from unihub import (
    ScalarCodec,
    TensorCodec,
    Unischema,
    UnischemaField,
    add_column,
    compact_dataset,
    make_batch_reader,
    make_reader,
    open_dataset,
    write_dataset,
)
from unihub.errors import (
    AppendSchemaError,
    ConcurrentCommitError,
    DatasetChangedError,
    FilterExpressionError,
    InvalidArgumentError,
    SchemaError,
    VersionNotFoundError,
)
from unihub.fs import publish
from unihub.store import versions

SCHEMA = Unischema("Grow", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                            UnischemaField("vec", np.float32, (3,), TensorCodec(), False),
                            UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), True)])
OTHER = Unischema("Grow", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                           UnischemaField("vec", np.float32, (4,), TensorCodec(), False),
                           UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), True)])
ROOT = Path(__file__).resolve().parents[2]


def rows(start: int, stop: int) -> list[dict[str, Any]]:
    return [{"id": i, "vec": np.arange(3, dtype=np.float32) * i, "name": None if i % 3 else f"n{i}"}
            for i in range(start, stop)]


def table_of(url: str, **options: Any) -> pa.Table:
    """Every stored column of every row group of one version, in reading order."""
    store = open_dataset(url, **options)
    return pa.concat_tables([store.read_row_group(i) for i in range(len(store.row_groups))])


def ids(url: str, **options: Any) -> list[int]:
    return table_of(url, **options)["id"].to_pylist()


# -- local ------------------------------------------------------------------------------------------------
def test_append_makes_versions_each_read_bit_exactly_after_later_appends_and_vacuum(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 10), rows_per_file=4)
    assert open_dataset(url).version is None  # a dataset written once records nothing: read as before
    assert not (tmp_path / "ds" / publish.VERSIONS_DIR).exists()
    first = table_of(url)
    result = write_dataset(url, SCHEMA, rows(10, 15), mode="append", tag="day-2")
    assert result.num_rows == 5 and all(os.path.exists(f) for f in result.files)
    second = table_of(url)
    write_dataset(url, SCHEMA, rows(15, 22), mode="append")
    third = table_of(url)
    assert third["id"].to_pylist() == list(range(22))
    history = versions.list_versions(url)
    assert [(v.number, v.operation, v.tag, v.added_rows) for v in history] == [
        (1, "write", None, None), (2, "append", "day-2", 5), (3, "append", None, 7)]
    assert table_of(url, version=1).equals(first) and table_of(url, version=2).equals(second)
    assert table_of(url, tag="day-2").equals(second) and table_of(url, version=3).equals(third)
    assert open_dataset(url, version=2).version == 2 and open_dataset(url).version == 3
    # the latest version is a plain listing of the directory: pyarrow (and Spark) read it as it is
    assert sorted(pq.read_table(url)["id"].to_pylist()) == list(range(22))
    removed = versions.vacuum_dataset(url, 2)
    assert removed.removed_versions == (1,) and removed.kept_versions == (2, 3)
    assert table_of(url, version=2).equals(second) and table_of(url, version=3).equals(third)
    with pytest.raises(VersionNotFoundError, match="no version 1; versions there: 2 \\(day-2\\), 3"):
        open_dataset(url, version=1)
    versions.vacuum_dataset(url, 1)
    assert table_of(url).equals(third)
    assert sorted(pq.read_table(url)["id"].to_pylist()) == list(range(22))
    with make_batch_reader(url, version=3, shuffle_row_groups=False) as reader:
        assert [int(i) for b in reader for i in b.id] == list(range(22))


def test_append_to_a_missing_dataset_starts_it_and_tags_are_unique(tmp_path: Path) -> None:
    url = str(tmp_path / "new")
    write_dataset(url, SCHEMA, rows(0, 3), mode="append", tag="first")
    assert [(v.number, v.operation, v.tag) for v in versions.list_versions(url)] == [(1, "write", "first")]
    with pytest.raises(VersionNotFoundError, match="tag 'first' names version 1 already"):
        write_dataset(url, SCHEMA, rows(3, 4), mode="append", tag="first")
    with pytest.raises(VersionNotFoundError, match="no tag 'nope'"):
        make_reader(url, tag="nope")
    with pytest.raises(SchemaError, match="tag= names the version an append makes"):
        write_dataset(str(tmp_path / "other"), SCHEMA, rows(0, 1), tag="x")
    with pytest.raises(SchemaError, match="not with overwrite"):
        write_dataset(url, SCHEMA, rows(0, 1), mode="append", overwrite=True)
    assert ids(url) == [0, 1, 2]
    # a version's number is an int (True read version 1, "1" was a raw "Unknown format code 'd'"), a tag a str
    for wrong, message in [("1", "got '1'; a version's name is tag="), (True, "got True"), (1.0, "got 1.0")]:
        with pytest.raises(InvalidArgumentError, match=f"version= is a version's number \\(an int\\), {message}"):
            open_dataset(url, version=wrong)
    with pytest.raises(InvalidArgumentError, match="tag= is a version's name"):
        make_reader(url, tag=1)
    assert open_dataset(url, version=np.int64(1)).num_rows == 3


def test_append_of_another_schema_is_refused_by_name_and_changes_nothing(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 4))
    before = sorted(os.listdir(url))
    other = [{"id": 9, "vec": np.zeros(4, np.float32), "name": "x"}]
    with pytest.raises(AppendSchemaError, match=r"in 1 field\(s\): vec: float32\(3,\)"):
        write_dataset(url, OTHER, other, mode="append")
    assert sorted(os.listdir(url)) == before and ids(url) == [0, 1, 2, 3]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".ds.unihub-tmp")]


def test_append_of_the_fields_in_another_order_is_refused_by_name(tmp_path: Path) -> None:
    """Accepted before: the version's schema (and every row's namedtuple) took the appended order, and the row
    groups of one version read their columns in two orders."""
    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 4))
    before = sorted(os.listdir(url))
    reordered = Unischema("Grow", [SCHEMA.fields["vec"], SCHEMA.fields["id"], SCHEMA.fields["name"]])
    with pytest.raises(AppendSchemaError, match=r"in another order \(vec, id, name; the dataset's: id, vec, name\)"):
        write_dataset(url, reordered, rows(4, 6), mode="append")
    assert sorted(os.listdir(url)) == before and ids(url) == [0, 1, 2, 3]
    wider = Unischema("Grow", [SCHEMA.fields["id"], UnischemaField("new", np.int32, (), ScalarCodec(pa.int32()), True),
                               *list(SCHEMA.fields.values())[1:]])
    write_dataset(url, wider, [{**row, "new": 1} for row in rows(4, 6)], mode="append")  # a new field anywhere
    assert list(open_dataset(url).schema.fields) == ["id", "new", "vec", "name"] and ids(url) == list(range(6))


def test_append_without_the_datasets_partitioning_says_so(tmp_path: Path) -> None:
    """The message described the field the same on both sides ("key: int32() scalar not null in the dataset,
    int32() scalar not null appended")."""
    keyed = Unischema("Keyed", [*SCHEMA, UnischemaField("key", np.int32, (), ScalarCodec(pa.int32()), False)])
    url = str(tmp_path / "ds")
    write_dataset(url, keyed, [{**row, "key": 1} for row in rows(0, 3)], partition_by=["key"])
    with pytest.raises(AppendSchemaError, match=r"key: int32\(\) scalar not null in partition folders \(partition_by\) "
                                                r"in the dataset, int32\(\) scalar not null appended"):
        write_dataset(url, keyed, [{**row, "key": 2} for row in rows(3, 4)], mode="append")
    write_dataset(url, keyed, [{**row, "key": 2} for row in rows(3, 4)], mode="append", partition_by=["key"])
    assert sorted(ids(url)) == [0, 1, 2, 3]


def test_a_reader_pins_the_version_it_opened(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 40), rows_per_file=5)
    seen = []
    with make_reader(url, shuffle_row_groups=False, workers_count=1, results_queue_size=1) as reader:
        for n, row in enumerate(reader):
            seen.append(int(row.id))
            if n == 2:  # appends while it reads: not seen, and no DatasetChangedError
                write_dataset(url, SCHEMA, rows(40, 50), mode="append")
                write_dataset(url, SCHEMA, rows(50, 55), mode="append")
    assert seen == list(range(40))
    with make_reader(url, shuffle_row_groups=False) as reader:
        assert sorted(int(r.id) for r in reader) == list(range(55))


def test_an_overwrite_starts_a_new_history(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 4))
    write_dataset(url, SCHEMA, rows(4, 6), mode="append")
    write_dataset(url, SCHEMA, rows(100, 102), overwrite=True)
    assert [v.number for v in versions.list_versions(url)] == [1]
    assert ids(url) == [100, 101]
    with pytest.raises(VersionNotFoundError):
        open_dataset(url, version=2)


def test_petastorm_fixture_reads_as_before_and_has_one_implicit_version(tmp_path: Path) -> None:
    fixture = ROOT / "tests" / "fixtures" / "petastorm" / "unischema"  # written by Petastorm 0.13.1 itself
    store = open_dataset(str(fixture))
    assert store.version is None and store.schema_source == "petastorm"
    assert [(v.number, v.recorded) for v in versions.list_versions(str(fixture))] == [(1, False)]
    assert open_dataset(str(fixture), version=1).num_rows == store.num_rows
    assert not (fixture / publish.VERSIONS_DIR).exists()


# -- processes: concurrent appenders, a kill mid-append ------------------------------------------------------
APPENDER = textwrap.dedent("""
    import sys, time, numpy as np, pyarrow as pa
    from unihub import ScalarCodec, TensorCodec, Unischema, UnischemaField, write_dataset
    schema = Unischema("Grow", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                UnischemaField("vec", np.float32, (3,), TensorCodec(), False),
                                UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), True)])
    url, first, count, start_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    options = eval(sys.argv[5]) if len(sys.argv) > 5 else {}
    while time.time() < start_at:
        time.sleep(0.001)
    for k in range(count):
        n = first + 10 * k
        write_dataset(url, schema, [{"id": i, "vec": np.arange(3, dtype=np.float32) * i, "name": None}
                                    for i in range(n, n + 10)], mode="append", **options)
""")


def run_appenders(url: str, storage_options: dict[str, Any] | None = None, count: int = 4) -> None:
    start_at = time.time() + 3.0  # both imported and waiting: they append at the same moments
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent)}
    extra = [repr({"storage_options": storage_options})] if storage_options else []
    children = [subprocess.Popen([sys.executable, "-c", APPENDER, url, str(first), str(count), str(start_at), *extra],
                                 env=env, stderr=subprocess.PIPE, text=True) for first in (1000, 5000)]
    for child in children:
        _, err = child.communicate(timeout=300)
        assert child.returncode == 0, err


def expected_after_appenders(count: int = 4) -> list[int]:
    return sorted(i for first in (1000, 5000) for k in range(count) for i in range(first + 10 * k, first + 10 * k + 10))


@pytest.mark.slow
def test_two_processes_appending_at_once_both_land(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 5))
    run_appenders(url)
    history = versions.list_versions(url)
    assert [v.number for v in history] == list(range(1, 10))  # every append a version of its own, none lost
    assert sorted(ids(url)) == list(range(5)) + expected_after_appenders()
    for v in history:  # each version holds its predecessor's files and one append more
        assert sorted(ids(url, version=v.number)) == sorted(set(ids(url)) & set(ids(url, version=v.number)))
        assert len(ids(url, version=v.number)) == 5 + 10 * (v.number - 1)
    assert sorted(pq.read_table(url)["id"].to_pylist()) == sorted(ids(url))


KILLED = textwrap.dedent("""
    import os, sys, time, numpy as np, pyarrow as pa
    from unihub import ScalarCodec, TensorCodec, Unischema, UnischemaField, write_dataset
    step, seen = int(os.environ["KILL_AT"]), {"n": 0}
    def wrap(module, name):
        real = getattr(module, name)
        def wrapped(*args, **kwargs):
            seen["n"] += 1
            if seen["n"] == step:
                print("paused", flush=True)
                time.sleep(600)
            return real(*args, **kwargs)
        setattr(module, name, wrapped)
    for name in ("rename", "link", "unlink", "makedirs", "replace"):
        wrap(os, name)
    import pyarrow.parquet as pq
    wrap(pq.ParquetWriter, "close")
    wrap(pq, "write_metadata")
    schema = Unischema("Grow", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                UnischemaField("vec", np.float32, (3,), TensorCodec(), False),
                                UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), True)])
    write_dataset(sys.argv[1], schema, [{"id": i, "vec": np.zeros(3, np.float32), "name": None}
                                        for i in range(100, 120)], mode="append", rows_per_file=7)
    print("done", flush=True)
""")


def killed_copies(tmp_path: Path, seed: Path, script: str, steps: int = 60) -> Iterator[tuple[int, str, str, str]]:
    """For each step, a copy of ``seed`` with ``script`` run on it and SIGKILLed at its ``step``-th wrapped call
    (``KILLED``'s ``wrap``): yields (step, the copy, what the script printed: "paused" or "done", its stderr),
    until a run is not killed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent)}
    for step in range(1, steps):
        url = str(tmp_path / f"ds{step}")
        shutil.copytree(seed, url)
        child = subprocess.Popen([sys.executable, "-c", script, url], env={**env, "KILL_AT": str(step)},
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = child.stdout.readline().strip()  # type: ignore[union-attr]
        if line == "paused":
            child.send_signal(signal.SIGKILL)
        _, err = child.communicate(timeout=120)
        yield step, url, line, err
        if line == "done":
            return


@pytest.mark.slow
def test_a_kill_at_any_step_of_an_append_leaves_the_old_or_the_new_version(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    write_dataset(str(seed), SCHEMA, rows(0, 10), rows_per_file=4)
    write_dataset(str(seed), SCHEMA, rows(10, 12), mode="append")  # recorded: the kill hits a recorded history
    old, new = list(range(12)), list(range(12)) + list(range(100, 120))
    outcomes = set()
    for step, url, _, err in killed_copies(tmp_path, seed, KILLED):
        found = ids(url)
        assert found in (old, new), (step, str(found), err)
        outcomes.add(found == new)
        # the next append removes what the killed one left: then the directory lists exactly the latest
        write_dataset(url, SCHEMA, rows(200, 201), mode="append")
        assert sorted(pq.read_table(url)["id"].to_pylist()) == sorted(ids(url)), step
    assert outcomes == {False, True}


# -- S3 (moto) --------------------------------------------------------------------------------------------
@pytest.fixture
def s3_url(s3_server: Any) -> str:
    return f"s3://{s3_server.bucket}/grow-{uuid.uuid4().hex[:8]}/ds"


def test_s3_append_versions_vacuum_and_pinning(s3_server: Any, s3_url: str) -> None:
    options = {"storage_options": s3_server.storage_options()}
    write_dataset(s3_url, SCHEMA, rows(0, 6), rows_per_file=3, **options)
    first = table_of(s3_url, **options)
    pinned = open_dataset(s3_url, **options)
    write_dataset(s3_url, SCHEMA, rows(6, 9), mode="append", tag="b", **options)
    second = table_of(s3_url, **options)
    write_dataset(s3_url, SCHEMA, rows(9, 12), mode="append", **options)
    # a store opened before the appends reads its version (no DatasetChangedError)
    assert pa.concat_tables([pinned.read_row_group(i) for i in range(len(pinned.row_groups))]).equals(first)
    assert [v.number for v in versions.list_versions(s3_url, **options)] == [1, 2, 3]
    assert table_of(s3_url, version=1, **options).equals(first)
    assert table_of(s3_url, tag="b", **options).equals(second)
    assert ids(s3_url, **options) == list(range(12))
    publish.settle_url(s3_url, s3_server.storage_options())  # the records' files are kept by a settle
    assert ids(s3_url, **options) == list(range(12))
    result = versions.vacuum_dataset(s3_url, 2, **options)
    assert result.removed_versions == (1,)
    assert table_of(s3_url, tag="b", **options).equals(second)
    with pytest.raises(VersionNotFoundError):
        open_dataset(s3_url, version=1, **options)
    with pytest.raises(AppendSchemaError):
        write_dataset(s3_url, OTHER, [{"id": 1, "vec": np.zeros(4, np.float32), "name": None}], mode="append",
                      **options)
    assert ids(s3_url, **options) == list(range(12))


def test_s3_overwrite_starts_a_new_history_and_pyarrow_s3_appends_by_claim(s3_server: Any, s3_url: str) -> None:
    options = {"storage_options": s3_server.storage_options()}
    write_dataset(s3_url, SCHEMA, rows(0, 3), mode="append", **options)  # a missing dataset: version 1
    write_dataset(s3_url, SCHEMA, rows(3, 5), mode="append", **options)
    # its manifest lists no parts (the records do): a settle must not take it for a write never published
    publish.settle_url(s3_url, s3_server.storage_options())
    assert [v.number for v in versions.list_versions(s3_url, **options)] == [1, 2]
    assert ids(s3_url, **options) == list(range(5)) and ids(s3_url, version=1, **options) == [0, 1, 2]
    write_dataset(s3_url, SCHEMA, rows(50, 52), overwrite=True, **options)
    assert ids(s3_url, **options) == [50, 51] and [v.number for v in versions.list_versions(s3_url, **options)] == [1]
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_server.bucket,
                                                                 Prefix=s3_url.split("/", 3)[3])["Contents"]]
    assert not [k for k in keys if publish.VERSIONS_DIR in k]  # the old history's records are gone
    # pyarrow's own S3 client has no conditional PUT: the claim protocol publishes the record
    fs = s3_server.pyarrow_filesystem()
    path = s3_url[len("s3://"):]
    write_dataset(path, SCHEMA, rows(52, 55), mode="append", filesystem=fs)
    assert ids(path, filesystem=fs) == [50, 51, 52, 53, 54]
    assert publish.put_if_absent(fs, f"{path}/_unihub_versions/00000002.json", b"{}") is False
    assert not [i for i in fs.get_file_info(pafs.FileSelector(f"{path}/_unihub_versions")) if "claim" in i.path]


@pytest.mark.slow
def test_s3_two_processes_appending_at_once_both_land(s3_server: Any, s3_url: str) -> None:
    options = s3_server.storage_options()
    write_dataset(s3_url, SCHEMA, rows(0, 5), storage_options=options)
    run_appenders(s3_url, options, count=3)
    assert [v.number for v in versions.list_versions(s3_url, storage_options=options)] == list(range(1, 8))
    assert sorted(ids(s3_url, storage_options=options)) == list(range(5)) + expected_after_appenders(3)


def test_a_store_of_a_replaced_file_still_says_so(tmp_path: Path) -> None:
    """Pinning is by file list: a file rewritten under the same name (not an append) is still refused."""
    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 4))
    store = open_dataset(url)
    write_dataset(url, SCHEMA, rows(0, 9), overwrite=True)
    with pytest.raises(DatasetChangedError):
        store.read_row_group(0)


LABELLED = Unischema("Grow", [*SCHEMA.fields.values(),
                              UnischemaField("label", np.str_, (), ScalarCodec(pa.string()), True)])


def test_an_append_may_add_a_nullable_field_older_rows_read_it_as_nulls(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 4))
    first = table_of(url)
    write_dataset(url, LABELLED, [{**r, "label": f"l{r['id']}"} for r in rows(4, 6)], mode="append")
    write_dataset(url, SCHEMA, rows(6, 7), mode="append")  # rows without it: nulls too
    assert table_of(url, version=1).equals(first)  # version 1 as it was: no label column
    latest = table_of(url)
    assert latest["label"].to_pylist() == [None] * 4 + ["l4", "l5", None]
    with make_reader(url, shuffle_row_groups=False) as reader:
        assert [(int(r.id), r.label) for r in reader] == [(i, f"l{i}" if i in (4, 5) else None) for i in range(7)]
    # plain Parquet readers: the schema in _common_metadata is the latest's
    plain = pq.read_table(url, schema=pq.read_schema(os.path.join(url, "_common_metadata")))
    assert sorted(plain["id"].to_pylist()) == list(range(7)) and plain["label"].null_count == 5
    not_null = Unischema("Grow", [*SCHEMA.fields.values(),
                                  UnischemaField("label", np.str_, (), ScalarCodec(pa.string()), False)])
    with pytest.raises(AppendSchemaError, match="label: str\\(\\) scalar nullable in the dataset, str\\(\\) scalar "
                                                "not null appended"):
        write_dataset(url, not_null, [{**rows(9, 10)[0], "label": "x"}], mode="append")
    assert table_of(url).equals(latest)


def test_rows_appended_without_a_nullable_field_the_first_write_had_read_it_as_nulls(tmp_path: Path) -> None:
    """An append may leave out a nullable field (its rows read nulls): the dataset opened with a FormatError
    ("columns differ") where the first write's files had the field."""
    url = str(tmp_path / "ds")
    write_dataset(url, LABELLED, [{**r, "label": f"l{r['id']}"} for r in rows(0, 3)])
    write_dataset(url, SCHEMA, rows(3, 5), mode="append")
    assert table_of(url)["label"].to_pylist() == ["l0", "l1", "l2", None, None]
    with make_reader(url, shuffle_row_groups=False) as reader:
        assert [(int(r.id), r.label) for r in reader] == [(i, f"l{i}" if i < 3 else None) for i in range(5)]
    with make_batch_reader(url, shuffle_row_groups=False) as reader:
        assert [v for batch in reader for v in batch.label] == ["l0", "l1", "l2", None, None]
    assert table_of(url, version=1)["label"].to_pylist() == ["l0", "l1", "l2"]


S3_KILLED = textwrap.dedent("""
    import sys, time, numpy as np, pyarrow as pa
    from unihub import ScalarCodec, TensorCodec, Unischema, UnischemaField, write_dataset
    from unihub.fs import publish
    from unihub.store import versions
    where = sys.argv[3]
    def pausing(real):
        def wrapped(*args, **kwargs):
            print("paused", flush=True)
            time.sleep(600)
        return wrapped
    if where == "placed":  # every part copied in, the record not yet written
        publish.put_if_absent = pausing(publish.put_if_absent)
    else:  # the record written, the staging area not yet removed
        real_commit = versions.commit_append
        def commit(fs, staging, target, **kwargs):
            versions.fsutil.remove = pausing(None)
            return real_commit(fs, staging, target, **kwargs)
        versions.commit_append = commit
    schema = Unischema("Grow", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                UnischemaField("vec", np.float32, (3,), TensorCodec(), False),
                                UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), True)])
    write_dataset(sys.argv[1], schema, [{"id": i, "vec": np.zeros(3, np.float32), "name": None}
                                        for i in range(100, 110)], mode="append", rows_per_file=4,
                  storage_options=eval(sys.argv[2]))
""")


@pytest.mark.parametrize("where", ["placed", "recorded"])
def test_s3_a_kill_mid_append_leaves_the_old_or_the_new_version(s3_server: Any, s3_url: str, where: str) -> None:
    options = s3_server.storage_options()
    write_dataset(s3_url, SCHEMA, rows(0, 6), storage_options=options)
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent)}
    child = subprocess.Popen([sys.executable, "-c", S3_KILLED, s3_url, repr(options), where], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "paused"  # type: ignore[union-attr]
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=60)
    expected = list(range(6)) if where == "placed" else list(range(6)) + list(range(100, 110))
    assert ids(s3_url, storage_options=options) == expected
    write_dataset(s3_url, SCHEMA, rows(200, 201), mode="append", storage_options=options)  # settles first
    assert ids(s3_url, storage_options=options) == [*expected, 200]
    prefix = s3_url.split("/", 3)[3]
    keys = [o["Key"][len(prefix) + 1:] for o in s3_server.client().list_objects_v2(
        Bucket=s3_server.bucket, Prefix=prefix + "/")["Contents"]]
    listed = {f for v in versions.list_versions(s3_url, storage_options=options) for f in v.files()}
    # nothing the killed run left: every data file is one a version lists
    assert {k for k in keys if publish.is_data(k)} <= listed


# -- delete by predicate ----------------------------------------------------------------------------------------
def test_delete_rows_is_a_version_older_ones_read_bit_exactly_and_the_directory_lists_the_latest(
        tmp_path: Path) -> None:
    import pyarrow.compute as pc

    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 12), rows_per_file=4)
    write_dataset(url, SCHEMA, rows(12, 16), mode="append")
    before = table_of(url)
    pinned = open_dataset(url)  # opened before the delete: reads its version to the end
    version = versions.delete_rows(url, (pc.field("id") >= 2) & (pc.field("id") < 9), tag="cleaned")
    assert version is not None and (version.number, version.operation, version.added_rows) == (3, "delete", -7)
    assert ids(url) == [0, 1, *range(9, 16)]
    assert table_of(url, version=2).equals(before) and ids(url, version=1) == list(range(12))
    assert pa.concat_tables([pinned.read_row_group(i) for i in range(len(pinned.row_groups))]).equals(before)
    assert sorted(pq.read_table(url)["id"].to_pylist()) == ids(url)  # the directory lists the latest version
    assert versions.delete_rows(url, pc.field("id") > 1000) is None  # nothing matched: no version
    assert [v.operation for v in versions.list_versions(url)] == ["write", "append", "delete"]
    write_dataset(url, SCHEMA, rows(20, 22), mode="append")
    assert ids(url, tag="cleaned") == [0, 1, *range(9, 16)] and ids(url)[-2:] == [20, 21]
    result = versions.vacuum_dataset(url, 2)
    assert result.kept_versions == (3, 4) and not os.listdir(tmp_path / "ds" / "_unihub_versions" / "retired")
    assert ids(url, version=3) == [0, 1, *range(9, 16)]
    assert sorted(pq.read_table(url)["id"].to_pylist()) == ids(url)


def test_s3_delete_rows_keeps_older_versions_readable_after_a_settle(s3_server: Any, s3_url: str) -> None:
    import pyarrow.compute as pc

    options = {"storage_options": s3_server.storage_options()}
    write_dataset(s3_url, SCHEMA, rows(0, 8), rows_per_file=4, **options)
    before = table_of(s3_url, **options)
    versions.delete_rows(s3_url, pc.field("id") < 3, **options)
    publish.settle_url(s3_url, s3_server.storage_options())  # the retired files are kept by a settle
    assert ids(s3_url, **options) == list(range(3, 8))
    assert table_of(s3_url, version=1, **options).equals(before)
    versions.vacuum_dataset(s3_url, 1, **options)
    with pytest.raises(VersionNotFoundError):
        open_dataset(s3_url, version=1, **options)
    assert ids(s3_url, **options) == list(range(3, 8))


def test_delete_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from unihub.cli import main

    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 6))
    assert main(["delete", url, "--where", "id >= 4", "--tag", "small"]) == 0
    assert "deleted 2 row(s) as version 2" in capsys.readouterr().out
    assert ids(url) == [0, 1, 2, 3] and ids(url, version=1) == list(range(6))
    assert main(["delete", url, "--where", "nope > 1"]) == 1
    assert "nope" in capsys.readouterr().err


def test_a_delete_filter_naming_no_field_or_comparing_other_types_is_a_named_error(tmp_path: Path) -> None:
    """A misspelled field or a comparison Arrow cannot make was pyarrow's raw ArrowInvalid / ArrowNotImplementedError
    from the middle of the rewrite; it is a FilterExpressionError naming the dataset and the filter, and nothing is
    written."""
    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 6))
    before = sorted(f for f in os.listdir(url) if f.endswith(".parquet"))
    for where, named in ((pc.field("idd") < 3, "idd"), (pc.field("id") < "a", "id")):
        with pytest.raises(FilterExpressionError, match=f"the delete's filter .*{named}.* cannot be evaluated"):
            versions.delete_rows(url, where)
    for where in ("id < 3", True, [True] * 6):  # the text was "Filter should be array-like" from the rewrite
        with pytest.raises(FilterExpressionError, match=r"delete_rows takes a pyarrow.compute expression .*not "):
            versions.delete_rows(url, where)
    assert sorted(f for f in os.listdir(url) if f.endswith(".parquet")) == before and ids(url) == list(range(6))
    assert [v.operation for v in versions.list_versions(url)] == ["write"]


def test_a_delete_filters_on_partition_keys_and_on_fields_appended_parts_lack(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The filter sees each part's rows as reading shows them: its partition folders' values, and nulls for the
    version's fields the part lacks (an append after it added them, or it was an append lacking them). Both were a
    raw ArrowInvalid ("No match for FieldRef.Name"), nothing deleted."""
    from unihub.cli import main

    keyed = Unischema("Keyed", [*SCHEMA, UnischemaField("key", np.int32, (), ScalarCodec(pa.int32()), False)])
    url = str(tmp_path / "keyed")
    write_dataset(url, keyed, [{**row, "key": row["id"] % 3} for row in rows(0, 9)], partition_by=["key"])
    assert versions.delete_rows(url, pc.field("key") == 1).added_rows == -3
    assert sorted(ids(url)) == [0, 2, 3, 5, 6, 8]
    assert main(["delete", url, "--where", "key == 2 and id > 4"]) == 0 and "deleted 2 row(s)" in capsys.readouterr().out
    assert sorted(ids(url)) == [0, 2, 3, 6]
    url = str(tmp_path / "grown")
    narrower = Unischema("Grow", [f for f in SCHEMA if f.name != "name"])
    wider = Unischema("Grow", [*SCHEMA, UnischemaField("extra", np.int64, (), ScalarCodec(pa.int64()), True)])
    write_dataset(url, SCHEMA, [{**row, "name": f"n{row['id']}"} for row in rows(0, 4)])
    write_dataset(url, narrower, [{k: v for k, v in row.items() if k != "name"} for row in rows(4, 8)], mode="append")
    write_dataset(url, wider, [{**row, "name": "w", "extra": row["id"]} for row in rows(8, 12)], mode="append")
    assert versions.delete_rows(url, pc.field("name").is_null()).added_rows == -4  # the narrower part's
    assert versions.delete_rows(url, pc.field("extra") >= 10).added_rows == -2
    assert versions.delete_rows(url, pc.field("name") == "n1").added_rows == -1
    assert ids(url) == [0, 2, 3, 8, 9] and ids(url, version=3) == list(range(12))


KILLED_DELETE = KILLED.split("\nschema = Unischema")[0] + "\n" + textwrap.dedent("""
    import pyarrow.compute as pc
    from unihub.store import versions
    wrap(versions, "retire")
    versions.delete_rows(sys.argv[1], pc.field("id") >= 5)
    print("done", flush=True)
""")


@pytest.mark.slow
@pytest.mark.parametrize("with_columns", [False, True])
def test_a_kill_at_any_step_of_a_delete_leaves_the_old_or_the_new_version(tmp_path: Path, with_columns: bool) -> None:

    seed = tmp_path / "seed"
    write_dataset(str(seed), SCHEMA, rows(0, 10), rows_per_file=4)
    if with_columns:  # the side files of the parts a delete rewrites are rewritten too
        add_column(str(seed), LABEL, np.arange(10) * 10)
    write_dataset(str(seed), SCHEMA, rows(10, 12), mode="append")
    old, new = list(range(12)), list(range(5))
    before = versions.list_versions(str(seed))[-1].number
    outcomes = set()
    for step, url, _, err in killed_copies(tmp_path, seed, KILLED_DELETE):
        found = ids(url)
        assert found in (old, new), (step, str(found), err)
        outcomes.add(found == new)
        assert ids(url, version=before) == old
        if with_columns:
            assert labels(url) == [i * 10 if i < 10 else None for i in found]
            assert labels(url, version=before) == [*range(0, 100, 10), None, None]
        write_dataset(url, SCHEMA, rows(200, 201), mode="append")  # settles what the killed delete left
        assert sorted(pq.read_table(url)["id"].to_pylist()) == sorted(ids(url)), step
    assert outcomes == {False, True}


# -- column adds, backfills and removals are versions ------------------------------------------------------------
LABEL = UnischemaField("label", np.int64, (), ScalarCodec(pa.int64()), True)


def side_files(url: str, **options: Any) -> set[str]:
    """The side files of the dataset's column sets (relative to its root)."""
    from unihub.fs import filesystem as fsutil
    from unihub.store import column_sets

    fs, root = fsutil.resolve_filesystem(url, options.get("filesystem"), options.get("storage_options"))
    return {f"{column_sets.DIRECTORY}/{rel}" for rel in publish.files_under(fs, f"{root}/{column_sets.DIRECTORY}")}


def labels(url: str, **options: Any) -> list[int | None]:
    return table_of(url, **options)["label"].to_pylist()


def grow_with_columns(url: str, **options: Any) -> None:
    """Write, add a column, append, backfill it: versions 1-4, each read bit-exactly after the later ones, a
    reader opened before the backfill reading the old values, then vacuum --keep 1."""

    write_dataset(url, SCHEMA, rows(0, 10), rows_per_file=4, **options)
    first = table_of(url, **options)
    added = add_column(url, LABEL, np.arange(10) * 10, tag="labelled", **options)  # version 1 recorded first
    assert added.version == 2
    second = table_of(url, **options)
    assert second.drop(["label"]).equals(first) and second["label"].to_pylist() == list(range(0, 100, 10))
    write_dataset(url, SCHEMA, rows(10, 14), mode="append", **options)
    third = table_of(url, **options)
    assert labels(url, **options) == [*range(0, 100, 10), None, None, None, None]  # not covered: null
    pinned = open_dataset(url, **options)  # version 3, opened before the backfill
    old_files = side_files(url, **options)

    def backfill(table: pa.Table) -> np.ndarray:
        return table.column("id").to_numpy() * 100

    assert add_column(url, LABEL, backfill, inputs=["id"], replace=True, **options).version == 4
    fourth = table_of(url, **options)
    assert fourth["label"].to_pylist() == [i * 100 for i in range(14)]
    assert [(v.number, v.operation, v.tag) for v in versions.list_versions(url, **options)] == [
        (1, "write", None), (2, "add_columns", "labelled"), (3, "append", None), (4, "add_columns", None)]
    assert table_of(url, version=1, **options).equals(first)  # no label column
    assert table_of(url, tag="labelled", **options).equals(second)
    assert table_of(url, version=3, **options).equals(third) and table_of(url, version=4, **options).equals(fourth)
    assert pa.concat_tables([pinned.read_row_group(i) for i in range(len(pinned.row_groups))]).equals(third)
    assert old_files < side_files(url, **options)  # the replaced values stay while versions 2 and 3 list them
    with make_reader(url, version=2, schema_fields=["id", "label"], shuffle_row_groups=False, workers_count=1,
                     **options) as reader:
        assert [(int(r.id), int(r.label)) for r in reader] == [(i, i * 10) for i in range(10)]
    result = versions.vacuum_dataset(url, 1, **options)
    assert result.removed_versions == (1, 2, 3) and old_files <= set(result.removed_files)
    assert side_files(url, **options) == {f for v in versions.list_versions(url, **options) for f in v.files()
                                          if f.startswith("_unihub_columns/")}
    for number in (1, 2, 3):
        with pytest.raises(VersionNotFoundError, match=f"no version {number}; versions there: 4"):
            open_dataset(url, version=number, **options)
    assert table_of(url, **options).equals(fourth)
    if "://" not in url:  # a plain listing of the directory is the latest version's parts (their columns only)
        assert sorted(pq.read_table(url)["id"].to_pylist()) == list(range(14))


def test_column_adds_are_versions_read_bit_exactly_after_appends_backfills_and_vacuum(tmp_path: Path) -> None:
    grow_with_columns(str(tmp_path / "ds"))


@pytest.mark.slow
def test_s3_column_adds_are_versions_read_bit_exactly_after_appends_backfills_and_vacuum(
        s3_server: Any, s3_url: str) -> None:
    grow_with_columns(s3_url, storage_options=s3_server.storage_options())
    publish.settle_url(s3_url, s3_server.storage_options())  # a later write's clean-up keeps version 4's files
    assert labels(s3_url, storage_options=s3_server.storage_options()) == [i * 100 for i in range(14)]


def test_a_column_removal_is_a_version_and_older_versions_join_their_sets_after_a_delete(tmp_path: Path) -> None:
    import pyarrow.compute as pc

    from unihub import add_column, list_columns, remove_columns

    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 10), rows_per_file=4)
    add_column(url, LABEL, np.arange(10))
    assert remove_columns(url, "label", tag="plain") == 3
    assert list_columns(url) == {} and list_columns(url, version=2) == {"label": ["label"]}
    before = side_files(url)
    with pytest.raises(VersionNotFoundError, match="tag 'plain' names version 3 already"):
        add_column(url, LABEL, np.arange(10), tag="plain")  # refused before anything is written
    assert side_files(url) == before and len(versions.list_versions(url)) == 3
    versions.delete_rows(url, pc.field("id") < 5)  # version 4: the parts of version 2 retired beside the records
    assert labels(url, version=2) == list(range(10))  # joined to the retired parts
    assert "label" not in table_of(url, tag="plain").column_names and ids(url) == list(range(5, 10))


# -- deleting rows from a version with column sets ---------------------------------------------------------------
SPLIT = UnischemaField("split", np.str_, (), ScalarCodec(pa.string()), True)
EMB = UnischemaField("emb", np.float32, (2,), TensorCodec(), True)
EMB_VALUES = np.random.default_rng(7).standard_normal((16, 2)).astype(np.float32)


def kept_after(table: pa.Table, where: Any) -> pa.Table:
    """``table`` without the rows ``where`` holds for (a null result keeps the row), as a delete leaves it."""
    return table.filter(~where | where.is_null())


def check_readers(url: str, expected: pa.Table, version: int | None = None, **options: Any) -> None:
    """make_reader, make_batch_reader and random access read exactly ``expected``'s rows with their added values."""
    from unihub import Dataset

    ids_, labels_, splits = (expected[n].to_pylist() for n in ("id", "label", "split"))
    embs = {i: EMB_VALUES[i] for i in ids_ if i < 16}
    with make_reader(url, version=version, schema_fields=["id", "label", "split", "emb"], shuffle_row_groups=False,
                     workers_count=1, **options) as reader:
        got = list(reader)
    assert [(int(r.id), r.label, r.split) for r in got] == list(zip(ids_, labels_, splits))
    for row in got:
        if int(row.id) in embs:
            assert row.emb.tobytes() == embs[int(row.id)].tobytes()
        else:
            assert row.emb is None
    with make_batch_reader(url, version=version, schema_fields=["id", "label"], shuffle_row_groups=False,
                           workers_count=1, **options) as reader:
        batches = list(reader)
    assert np.concatenate([b.id for b in batches]).tolist() == ids_
    dataset = Dataset(open_dataset(url, version=version, **options), schema_fields=["id", "label", "emb"])
    asked = np.random.default_rng(1).integers(0, len(ids_), 25)
    taken = dataset.take(asked)
    assert np.asarray(taken.id).tolist() == [ids_[k] for k in asked]
    covered = [j for j, k in enumerate(asked) if ids_[k] < 16]
    assert np.stack([taken.emb[j] for j in covered]).tobytes() == \
        np.stack([embs[ids_[asked[j]]] for j in covered]).tobytes()


def delete_with_column_sets(url: str, **options: Any) -> None:
    """Three sets (one a tensor) over 2 parts of 2 row groups, a part appended after them (not covered: nulls);
    deletes by an added column of each set's kind and by a part column: each later version reads exactly the rows
    left with their added values, each earlier one as it was, a column added after joins, a vacuum keeps the
    latest."""
    import pyarrow.compute as pc


    write_dataset(url, SCHEMA, rows(0, 16), rows_per_file=8, row_group_size_mb=1e-4, **options)
    assert [g.num_rows for g in open_dataset(url, **options).row_groups] == [4, 4, 4, 4]
    add_column(url, LABEL, np.where(np.arange(16) % 5 == 0, -1, np.arange(16) * 10), **options)
    add_column(url, SPLIT, np.where(np.arange(16) % 7 == 3, "val", "train"), **options)
    add_column(url, EMB, EMB_VALUES, **options)
    write_dataset(url, SCHEMA, rows(16, 20), mode="append", **options)  # version 5
    snapshots = {5: table_of(url, **options)}
    deletes = [pc.field("label") == -1, pc.field("split") == "val", (pc.field("id") < 2) | (pc.field("id") >= 18)]
    for number, where in enumerate(deletes, start=6):
        version = versions.delete_rows(url, where, **options)
        expected = kept_after(snapshots[number - 1], where)
        assert version is not None and version.number == number
        assert version.added_rows == expected.num_rows - snapshots[number - 1].num_rows
        snapshots[number] = table_of(url, **options)
        assert snapshots[number].equals(expected)  # every stored column, the added ones bit-exact
    assert snapshots[8]["id"].to_pylist() == [2, 4, 6, 7, 8, 9, 11, 12, 13, 14, 16, 17]
    assert snapshots[8]["label"].to_pylist()[-3:] == [140, None, None]
    check_readers(url, snapshots[8], **options)
    check_readers(url, snapshots[5], version=5, **options)  # time travel: the rows before the deletes
    for number, snapshot in snapshots.items():
        assert table_of(url, version=number, **options).equals(snapshot)
    latest = versions.list_versions(url, **options)[-1]
    for column_set in latest.column_sets:  # each side file follows its part: its rows, its new part's row groups
        assert set(column_set["parts"]) <= set(latest.parts)
    # a column added after the deletes joins the rows that are left
    other = UnischemaField("other", np.int64, (), ScalarCodec(pa.int64()), True)
    left = np.asarray(snapshots[8]["id"].to_pylist())
    add_column(url, other, left * 3, **options)
    assert table_of(url, **options)["other"].to_pylist() == (left * 3).tolist()
    final = table_of(url, **options)
    result = versions.vacuum_dataset(url, 1, **options)
    assert result.kept_versions == (9,)
    assert table_of(url, **options).equals(final)
    check_readers(url, snapshots[8], **options)
    assert side_files(url, **options) == {f for f in latest_files(url, **options) if f.startswith("_unihub_columns/")}
    with pytest.raises(VersionNotFoundError):
        open_dataset(url, version=5, **options)
    if "://" not in url:
        assert not os.listdir(os.path.join(url, publish.RETIRED_DIR))
        assert sorted(pq.read_table(url)["id"].to_pylist()) == left.tolist()


def latest_files(url: str, **options: Any) -> set[str]:
    return versions.list_versions(url, **options)[-1].files()


def test_delete_rows_with_column_sets_by_added_and_part_columns(tmp_path: Path) -> None:
    delete_with_column_sets(str(tmp_path / "ds"))


@pytest.mark.slow
def test_s3_delete_rows_with_column_sets_by_added_and_part_columns(s3_server: Any, s3_url: str) -> None:
    delete_with_column_sets(s3_url, storage_options=s3_server.storage_options())


def test_a_delete_with_column_sets_refused_at_publishing_leaves_nothing(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow.compute as pc


    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 10), rows_per_file=4)
    add_column(url, LABEL, np.arange(10))
    before, files = table_of(url), sorted(str(p) for p in Path(url).rglob("*") if p.is_file())
    monkeypatch.setattr(publish, "put_if_absent", lambda *args: False)  # another commit took the number
    with pytest.raises(ConcurrentCommitError):
        versions.delete_rows(url, pc.field("label") > 6)
    monkeypatch.undo()
    assert table_of(url).equals(before) and len(versions.list_versions(url)) == 2
    # what the delete wrote is gone; its retired copies of the parts are only links to the same files
    left = sorted(str(p) for p in Path(url).rglob("*") if p.is_file() and publish.RETIRED_DIR not in str(p))
    assert left == [f for f in files if publish.RETIRED_DIR not in f]


@pytest.mark.parametrize("winner", ["delete", "compact"])
def test_two_rewrites_of_the_same_part_at_once_keep_every_version_readable(tmp_path: Path, winner: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A delete refused because another delete (or a compaction) of the same part published first removed the
    retired copy that the winner's older versions read: versions 1 and 2 lost the part for good."""

    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 10), rows_per_file=5)
    write_dataset(url, SCHEMA, rows(10, 15), mode="append")
    before = {v: table_of(url, version=v) for v in (1, 2)}
    real = publish.put_if_absent

    def other_commit_first(fs: Any, path: str, data: bytes) -> bool:
        monkeypatch.setattr(publish, "put_if_absent", real)
        # the other commit runs while this delete has retired its parts and is about to publish
        if winner == "delete":
            versions.delete_rows(url, pc.field("id") == 1)
        else:
            assert compact_dataset(url) is not None
        return real(fs, path, data)

    monkeypatch.setattr(publish, "put_if_absent", other_commit_first)
    with pytest.raises(ConcurrentCommitError):
        versions.delete_rows(url, pc.field("id") == 2)
    assert [v.number for v in versions.list_versions(url)] == [1, 2, 3]
    for number, table in before.items():
        assert table_of(url, version=number).equals(table)
    assert table_of(url).num_rows == (14 if winner == "delete" else 15)
    versions.delete_rows(url, pc.field("id") == 2)  # run again, it lands
    for number, table in before.items():
        assert table_of(url, version=number).equals(table)


def test_a_delete_whose_part_another_delete_replaced_meanwhile_is_a_concurrent_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other delete published first and took the part out of the directory: this one failed retiring it with a
    bare FileNotFoundError instead of the race's named error."""

    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 10), rows_per_file=5)
    real = versions.publish_rewrite

    def other_first(*args: Any) -> None:
        monkeypatch.setattr(versions, "publish_rewrite", real)
        versions.delete_rows(url, pc.field("id") == 1)
        real(*args)

    monkeypatch.setattr(versions, "publish_rewrite", other_first)
    with pytest.raises(ConcurrentCommitError, match="replaced part-00000.parquet meanwhile"):
        versions.delete_rows(url, pc.field("id") == 2)
    assert ids(url) == [0, 2, 3, 4, 5, 6, 7, 8, 9] and ids(url, version=1) == list(range(10))
    versions.delete_rows(url, pc.field("id") == 2)
    assert ids(url) == [0, 3, 4, 5, 6, 7, 8, 9] and ids(url, version=1) == list(range(10))


def test_a_delete_of_every_row_is_a_version_of_no_rows(tmp_path: Path) -> None:
    """Its record lists no part: opening it said 'the directory holds no Parquet data files (is it a dataset?)', and
    so did every reader of the latest version, until the next append."""

    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 6), rows_per_file=4)
    version = versions.delete_rows(url, pc.field("id") >= 0)
    assert version is not None and version.parts == () and version.added_rows == -6
    store = open_dataset(url)
    assert store.num_rows == 0 and store.version == 2 and list(store.schema.fields) == ["id", "vec", "name"]
    with make_reader(url) as reader:
        assert list(reader) == []
    with make_batch_reader(url) as reader:
        assert list(reader) == []
    assert open_dataset(url, version=1).num_rows == 6
    assert add_column(url, LABEL, np.zeros(0, np.int64)).version == 3
    write_dataset(url, SCHEMA, rows(10, 12), mode="append")
    assert ids(url) == [10, 11] and table_of(url)["label"].to_pylist() == [None, None]


def test_a_partitioned_dataset_of_no_rows_reads_as_none(tmp_path: Path) -> None:
    """With every row deleted (or none written) no partition folder is left: readers refused the dataset, 'the data
    files hold no column for: 'key'', blaming the schema for a column no row reads; an append then reads as usual."""
    keyed = Unischema("Keyed", [*SCHEMA, UnischemaField("key", np.int32, (), ScalarCodec(pa.int32()), False)])
    url = str(tmp_path / "ds")
    write_dataset(url, keyed, [{**row, "key": row["id"] % 2} for row in rows(0, 6)], partition_by=["key"])
    assert versions.delete_rows(url, pc.field("id") >= 0) is not None
    for make in (make_reader, make_batch_reader):
        with make(url) as reader:
            assert list(reader) == []
    empty = str(tmp_path / "empty")
    write_dataset(empty, keyed, [], partition_by=["key"])
    with make_batch_reader(empty) as reader:
        assert list(reader) == []
    write_dataset(url, keyed, [{**row, "key": 5} for row in rows(6, 8)], mode="append", partition_by=["key"])
    with make_reader(url, shuffle_row_groups=False) as reader:
        assert [(int(r.id), int(r.key)) for r in reader] == [(6, 5), (7, 5)]


def test_delete_on_an_added_column_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from unihub.cli import main

    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 6))
    add_column(url, LABEL, np.array([0, -1, 2, -1, 4, 5]))
    assert main(["delete", url, "--where", "label == -1"]) == 0
    assert "deleted 2 row(s) as version 3" in capsys.readouterr().out
    assert ids(url) == [0, 2, 4, 5] and labels(url) == [0, 2, 4, 5] and labels(url, version=2)[1] == -1


def test_a_delete_of_every_row_a_set_covers_keeps_its_field_as_nulls(tmp_path: Path) -> None:
    """A version's column sets are its fields whatever rows are left: the schema does not lose a field
    because a delete removed the rows its set covered (the appended rows read it as nulls, as before)."""
    import pyarrow.compute as pc


    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 6))
    add_column(url, LABEL, np.arange(6) * 10)
    write_dataset(url, SCHEMA, rows(6, 9), mode="append")  # rows no set covers
    versions.delete_rows(url, pc.field("id") < 6)
    assert ids(url) == [6, 7, 8]
    assert "label" in open_dataset(url).schema.fields
    assert labels(url) == [None, None, None]
    with make_reader(url, schema_fields=["id", "label"], shuffle_row_groups=False) as reader:
        assert [(int(r.id), r.label) for r in reader] == [(6, None), (7, None), (8, None)]
    assert labels(url, version=3) == [0, 10, 20, 30, 40, 50, None, None, None]  # before the delete


def test_a_dataset_with_sets_from_before_versions_keeps_them_in_version_1(tmp_path: Path) -> None:
    """``_unihub_columns.json`` (sets added before versions held them) is version 1's; the next commit records it."""
    from unihub import add_column, list_columns
    from unihub.store import column_sets

    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 6), rows_per_file=4)
    add_column(url, LABEL, np.arange(6))
    latest = versions.list_versions(url)[-1]
    shutil.rmtree(os.path.join(url, publish.VERSIONS_DIR))  # as the earlier layout had it
    Path(url, column_sets.RECORD).write_bytes(column_sets.of_version(latest.column_sets, "x").to_json())
    assert labels(url) == list(range(6)) and open_dataset(url).version is None
    assert [(v.number, v.recorded) for v in versions.list_versions(url)] == [(1, False)]
    assert labels(url, version=1) == list(range(6))
    add_column(url, UnischemaField("other", np.int64, (), ScalarCodec(pa.int64()), True), np.zeros(6, np.int64))
    assert list_columns(url) == {"label": ["label"], "other": ["other"]}
    assert list_columns(url, version=1) == {"label": ["label"]} and labels(url, version=1) == list(range(6))
    assert not os.path.exists(os.path.join(url, column_sets.RECORD))  # one place decides: the versions


ADDER = textwrap.dedent("""
    import sys, time, numpy as np, pyarrow as pa
    from unihub import ScalarCodec, UnischemaField, add_column
    url, count, start_at = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    options = eval(sys.argv[4]) if len(sys.argv) > 4 else {}
    label = UnischemaField("label", np.int64, (), ScalarCodec(pa.int64()), True)
    while time.time() < start_at:
        time.sleep(0.001)
    for k in range(count):
        add_column(url, label, lambda table: table.column("id").to_numpy() * 2, inputs=["id"], replace=k > 0,
                   **options)
""")


def add_and_append_at_once(url: str, storage_options: dict[str, Any] | None = None, count: int = 3) -> None:
    """One process adds (then backfills) a column ``count`` times while another appends ``count`` times."""
    start_at = time.time() + 3.0
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent)}
    extra = [repr({"storage_options": storage_options})] if storage_options else []
    children = [subprocess.Popen([sys.executable, "-c", APPENDER, url, "1000", str(count), str(start_at), *extra],
                                 env=env, stderr=subprocess.PIPE, text=True),
                subprocess.Popen([sys.executable, "-c", ADDER, url, str(count), str(start_at), *extra],
                                 env=env, stderr=subprocess.PIPE, text=True)]
    for child in children:
        _, err = child.communicate(timeout=300)
        assert child.returncode == 0, err


def check_adds_and_appends_landed(url: str, count: int = 3, **options: Any) -> None:
    history = versions.list_versions(url, **options)
    assert [v.number for v in history] == list(range(1, 2 + 2 * count))  # none lost
    assert sorted(v.operation for v in history[1:]) == ["add_columns"] * count + ["append"] * count
    expected = list(range(5)) + [i for k in range(count) for i in range(1000 + 10 * k, 1010 + 10 * k)]
    assert sorted(ids(url, **options)) == expected
    for v in history:
        if v.operation == "add_columns":  # the rows its version had: their values; rows appended later: null
            table = table_of(url, version=v.number, **options)
            found = dict(zip(table["id"].to_pylist(), table["label"].to_pylist()))
            assert all(found[i] == 2 * i for i in range(5)), v.number
            assert all(label in (None, 2 * i) for i, label in found.items()), v.number


@pytest.mark.slow
def test_a_column_add_and_an_append_at_once_both_land(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 5))
    add_and_append_at_once(url)
    check_adds_and_appends_landed(url)


@pytest.mark.slow
def test_s3_a_column_add_and_an_append_at_once_both_land(s3_server: Any, s3_url: str) -> None:
    options = s3_server.storage_options()
    write_dataset(s3_url, SCHEMA, rows(0, 5), storage_options=options)
    add_and_append_at_once(s3_url, options)
    check_adds_and_appends_landed(s3_url, storage_options=options)


KILLED_ADD = KILLED.split("\nschema = Unischema")[0] + "\n" + textwrap.dedent("""
    from unihub import ScalarCodec, UnischemaField, add_column
    from unihub.fs import publish
    wrap(publish, "put_if_absent")
    label = UnischemaField("label", np.int64, (), ScalarCodec(pa.int64()), True)
    add_column(sys.argv[1], label, np.arange(12) + 1000, replace=True)
    print("done", flush=True)
""")


@pytest.mark.slow
def test_a_kill_at_any_step_of_a_column_add_leaves_the_old_or_the_new_version(tmp_path: Path) -> None:

    seed = tmp_path / "seed"
    write_dataset(str(seed), SCHEMA, rows(0, 10), rows_per_file=4)
    write_dataset(str(seed), SCHEMA, rows(10, 12), mode="append")
    add_column(str(seed), LABEL, np.arange(12))
    old, new = list(range(12)), list(range(1000, 1012))
    outcomes = set()
    for step, url, _, err in killed_copies(tmp_path, seed, KILLED_ADD):
        found = labels(url)
        assert found in (old, new), (step, str(found), err)
        outcomes.add(found == new)
        assert labels(url, version=3) == old and ids(url) == list(range(12))
        # the next commit removes what the killed add left: every side file is one a version lists
        add_column(url, UnischemaField("other", np.int64, (), ScalarCodec(pa.int64()), True), np.zeros(12, np.int64))
        assert side_files(url) <= {f for v in versions.list_versions(url) for f in v.files()}, step
    assert outcomes == {False, True}


def test_a_delete_rewrites_a_summary_file_for_the_latest_parts(tmp_path: Path) -> None:
    """Petastorm's and Spark's ``_metadata`` lists the files and their row groups: after a delete it lists the
    rewritten part, not the one that left the directory (tests/petastorm/test_grown_datasets.py: with Petastorm)."""
    import pyarrow.compute as pc

    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 10))
    part = open_dataset(url).files[0].path
    collected = [pq.read_metadata(part)]
    collected[0].set_file_path(os.path.basename(part))
    pq.write_metadata(pq.read_schema(part), os.path.join(url, "_metadata"), metadata_collector=collected)  # as Spark
    version = versions.delete_rows(url, pc.field("id") < 3)
    assert version is not None and ids(url) == list(range(3, 10))
    summary = pq.read_metadata(os.path.join(url, "_metadata"))
    assert {summary.row_group(k).column(0).file_path for k in range(summary.num_row_groups)} == set(version.parts)
    assert summary.num_rows == 7 and not os.path.exists(part)


@pytest.mark.slow
def test_vacuum_removes_what_a_killed_column_add_left_in_a_dataset_never_appended_to(tmp_path: Path) -> None:
    """Before: vacuum returned at once where the dataset had no version records, so the side files a column add
    killed before its commit left stayed for good. A dead run's data file stays there (it may hold rows whose
    records were lost: a copy made without ``_unihub_versions/``)."""
    seed = tmp_path / "seed"
    write_dataset(str(seed), SCHEMA, rows(0, 12), rows_per_file=5)
    unrecorded = 0
    for step, url, _, err in killed_copies(tmp_path, seed, KILLED_ADD):
        if "label" in open_dataset(url).schema.fields:
            assert labels(url) == list(range(1000, 1012)), (step, err)  # the add landed, with its records
            continue
        sides = side_files(url)
        runs = {publish.run_of(f) for f in sides} - {None}
        strays = [f"unihub-{run}-part-00000.parquet" for run in runs]  # named as a dead append's part
        for name in strays:
            shutil.copy(seed / "part-00000.parquet", os.path.join(url, name))
        read, recorded = ids(url), versions.list_versions(url)[-1].recorded
        result = versions.vacuum_dataset(url, 1)
        assert not side_files(url) and sides <= set(result.removed_files), (step, result)
        assert not os.path.exists(os.path.join(url, "_unihub_columns")), step
        if not recorded:  # (with records, a dead run's unlisted data file goes: nothing reads it)
            assert all(os.path.exists(os.path.join(url, name)) for name in strays), step
            assert ids(url) == read and result.kept_versions == (1,), step
            unrecorded += bool(sides)
    assert unrecorded, "no kill left side files without records: the test tests nothing"
