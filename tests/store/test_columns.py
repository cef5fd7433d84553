"""Columns added to existing rows without rewriting the parts (store/columns.py, store/column_sets.py):
every reader sees them, the parts keep their bytes, a backfill replaces values, a kill leaves the old
state, bad input is refused with nothing written."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub import (
    AppendSchemaError,
    ColumnSetError,
    CompressedImageCodec,
    Dataset,
    ScalarCodec,
    TensorCodec,
    Unischema,
    UnischemaField,
    ValidationError,
    add_column,
    add_columns,
    list_columns,
    make_batch_reader,
    make_reader,
    open_dataset,
    remove_columns,
    write_dataset,
)
from unihub.cli.demo import make_image
from unihub.errors import ConcurrentCommitError, VersionNotFoundError
from unihub.fs import publish
from unihub.images.decoders import encode_image
from unihub.store import column_sets, versions

from ..petastorm import test_metadata_write as petastorm_side

petastorm_python = petastorm_side.petastorm_python  # the fixture: Petastorm 0.13.1's venv

N = 120
SCHEMA = Unischema("Pics", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("image", np.uint8, (16, 16, 3), CompressedImageCodec("png"), False),
])
EMB = UnischemaField("emb", np.float32, (8,), TensorCodec(), True)
SPLIT = UnischemaField("split", np.str_, (), ScalarCodec(pa.string()), True)


def embedding(ids: Any) -> np.ndarray:
    """Row ``id``'s embedding: a function of its id, so any reader's rows can be checked."""
    return (np.asarray(ids, dtype=np.float32)[:, None] + np.arange(8, dtype=np.float32) / 10).astype(np.float32)


def split_of(ids: Any) -> list[str]:
    return ["val" if i % 5 == 0 else "train" for i in np.asarray(ids).tolist()]


def write_pics(path: Any, **options: Any) -> Any:
    """``N`` rows of 16x16 PNGs in 4 parts of several row groups each."""
    rng = np.random.default_rng(3)
    images = [encode_image(make_image(rng, 16, 16), "png") for _ in range(N)]
    write_dataset(path, SCHEMA, ({"id": i, "image": images[i]} for i in range(N)), rows_per_file=N // 4,
                  row_group_size_mb=0.008, **options)
    return path


@pytest.fixture
def pics(tmp_path: Path) -> Path:
    path = write_pics(tmp_path / "ds")
    store = open_dataset(path)
    assert len(store.files) == 4 and len(store.row_groups) > 8
    return path


def ids_in_order(path: Path | str, **options: Any) -> np.ndarray:
    store = open_dataset(path, **options)
    return np.concatenate([store.read_row_group(g, ["id"]).column("id").to_numpy() for g in range(len(store.row_groups))])


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every part file: its digest and modification time."""
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in root.iterdir() if p.suffix == ".parquet"}


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_added_column_is_read_by_every_reader(pics: Path) -> None:
    ids = ids_in_order(pics)
    result = add_column(pics, EMB, embedding(ids))
    add_column(pics, SPLIT, split_of(ids))
    assert list_columns(pics) == {"emb": ["emb"], "split": ["split"]}
    assert result.num_rows == N and len(result.files) == 4
    store = open_dataset(pics)
    assert [f.name for f in store.schema] == ["id", "image", "emb", "split"]
    # make_reader, selected and not, shuffled, sharded
    with make_reader(pics, schema_fields=["id", "emb", "split"], workers_count=2, seed=1) as reader:
        rows = list(reader)
    assert sorted(r.id for r in rows) == list(range(N))
    for row in rows:
        np.testing.assert_array_equal(row.emb, embedding([row.id])[0])
        assert row.split == split_of([row.id])[0]
    with make_reader(pics, schema_fields=["id"], workers_count=1) as reader:
        assert sorted(r.id for r in reader) == list(range(N)) and reader.schema.fields.keys() == {"id"}
    with make_reader(pics, workers_count=1, shuffle_row_groups=False) as reader:
        row = next(iter(reader))
    assert row.image.shape == (16, 16, 3) and row.emb.dtype == np.float32
    shards = []
    for shard in range(3):
        with make_batch_reader(pics, schema_fields=["id", "emb"], cur_shard=shard, shard_count=3,
                               shuffle_rows=True, seed=5, workers_count=1) as reader:
            for batch in reader:
                np.testing.assert_array_equal(batch.emb, embedding(batch.id))
                shards.append(np.asarray(batch.id))
    assert sorted(np.concatenate(shards).tolist()) == list(range(N))


def test_random_access_takes_added_columns(pics: Path) -> None:
    ids = ids_in_order(pics)
    add_column(pics, EMB, embedding(ids))
    for cache_mb in (None, 0.001):  # the cache holding the dataset, and rows read group by group (images by page)
        dataset = Dataset(pics, schema_fields=["id", "image", "emb"], cache_mb=cache_mb)
        asked = np.random.default_rng(0).integers(0, N, 40)
        batch = dataset.take(asked)
        np.testing.assert_array_equal(batch.id, ids[asked])
        np.testing.assert_array_equal(batch.emb, embedding(ids[asked]))
        assert batch.image.shape == (40, 16, 16, 3)
        np.testing.assert_array_equal(dataset[7].emb, embedding([ids[7]])[0])


@pytest.mark.slow
def test_torch_loaders_see_added_columns(pics: Path) -> None:
    torch = pytest.importorskip("torch")
    from unihub.bridges.torch import DataLoader, TorchMapDataset

    ids = ids_in_order(pics)
    add_column(pics, EMB, embedding(ids))
    with DataLoader(make_reader(pics, schema_fields=["id", "emb"], workers_count=1), batch_size=16) as loader:
        batches = list(loader)
    got = torch.cat([b["id"] for b in batches]).numpy()
    np.testing.assert_array_equal(torch.cat([b["emb"] for b in batches]).numpy(), embedding(got))
    mapped = TorchMapDataset(str(pics), schema_fields=["id", "emb"])
    loader = torch.utils.data.DataLoader(mapped, batch_size=10, shuffle=True, num_workers=2)  # forked workers
    seen = []
    for batch in loader:
        np.testing.assert_array_equal(batch["emb"].numpy(), embedding(batch["id"].numpy()))
        seen.extend(batch["id"].tolist())
    assert sorted(seen) == list(range(N))


def test_parts_untouched_and_bytes_written_are_the_column_s_own(pics: Path) -> None:
    before = snapshot(pics)
    images = sum(len(v) for g in range(len(open_dataset(pics).row_groups))
                 for v in open_dataset(pics).read_row_group(g, ["image"]).column("image").to_pylist())
    big = UnischemaField("big", np.float32, (64,), TensorCodec(), True)
    values = np.random.default_rng(1).standard_normal((N, 64)).astype(np.float32)  # incompressible
    own = values.nbytes
    result = add_column(pics, big, values)
    assert result.version == 2  # version 1 (the dataset as written) recorded first
    on_disk = sum(p.stat().st_size for p in (pics / column_sets.DIRECTORY).rglob("*") if p.is_file()) + \
        os.path.getsize(versions.record_path(str(pics), 2))  # the side files and the version's record
    assert result.bytes_written == on_disk
    assert own <= result.bytes_written < own * 1.1 + 16_000, (own, result.bytes_written)  # footers, the record
    assert result.bytes_written < images  # nothing of the images is written again
    assert snapshot(pics) == before  # the parts: same bytes, same mtime
    assert sorted(p.name for p in pics.iterdir() if not p.name.startswith("_")) == sorted(before)


def test_backfill_replaces_values_and_old_files(pics: Path) -> None:
    ids = ids_in_order(pics)
    first = add_column(pics, SPLIT, split_of(ids))
    with pytest.raises(ColumnSetError, match="replace=True"):
        add_column(pics, SPLIT, ["x"] * N)
    second = add_column(pics, SPLIT, ["test"] * N, replace=True)
    # the old values stay while a version lists them
    assert all(os.path.exists(f) for f in first.files) and all(os.path.exists(f) for f in second.files)
    with make_reader(pics, schema_fields=["split"], workers_count=1) as reader:
        assert {r.split for r in reader} == {"test"}
    assert remove_columns(pics, "split") == 4
    assert open_dataset(pics).schema.fields.keys() == {"id", "image"}
    assert [(v.number, v.operation) for v in versions.list_versions(pics)] == [
        (1, "write"), (2, "add_columns"), (3, "add_columns"), (4, "remove_columns")]
    versions.vacuum_dataset(pics, 1)  # no kept version lists a side file: they go
    assert not (pics / column_sets.DIRECTORY).exists()


def test_values_from_a_function_of_existing_columns(pics: Path) -> None:
    def double(table: pa.Table) -> np.ndarray:
        return table.column("id").to_numpy() * 2

    add_column(pics, UnischemaField("twice", np.int64, (), ScalarCodec(pa.int64()), False), double, inputs=["id"])
    with make_batch_reader(pics, schema_fields=["id", "twice"], workers_count=1) as reader:
        for batch in reader:
            np.testing.assert_array_equal(batch.twice, np.asarray(batch.id) * 2)
    assert open_dataset(pics).schema["twice"].nullable  # rows appended later read as null


def test_values_as_arrow_chunked_arrays(pics: Path) -> None:
    """What ``pyarrow.compute`` returns for a table's column (a ChunkedArray), from a function or given whole: it
    was a ValidationError ('expected a scalar of dtype int64, found Int64Scalar')."""
    import pyarrow.compute as pc

    thrice = UnischemaField("thrice", np.int64, (), ScalarCodec(pa.int64()), False)
    add_column(pics, thrice, lambda table: pc.multiply(table.column("id"), 3), inputs=["id"])
    ids = ids_in_order(pics)
    add_column(pics, UnischemaField("minus", np.int64, (), ScalarCodec(pa.int64()), False),
               pa.chunked_array([[-i for i in ids[:3]], [-i for i in ids[3:]]]))
    with make_batch_reader(pics, schema_fields=["id", "thrice", "minus"], workers_count=1) as reader:
        for batch in reader:
            np.testing.assert_array_equal(batch.thrice, np.asarray(batch.id) * 3)
            np.testing.assert_array_equal(batch.minus, -np.asarray(batch.id))


def test_a_part_the_set_does_not_cover_reads_null(pics: Path) -> None:
    ids = ids_in_order(pics)
    add_column(pics, EMB, embedding(ids))
    first = pq.read_table(pics / "part-00000.parquet").to_pylist()
    write_dataset(pics, SCHEMA, first, mode="append")  # version 3 carries the set forward
    assert list_columns(pics) == {"emb": ["emb"]}
    with make_reader(pics, schema_fields=["id", "emb"], workers_count=1, shuffle_row_groups=False) as reader:
        rows = list(reader)
    assert len(rows) == N + N // 4
    assert all(r.emb is None for r in rows[N:]) and all(r.emb is not None for r in rows[:N])


def test_an_append_of_rows_holding_an_added_column_is_refused_before_it_is_published(pics: Path) -> None:
    """It was published, and no version after it could be opened ("column set field(s) ['split'] are also
    columns of the part files")."""
    add_column(pics, SPLIT, split_of(ids_in_order(pics)))
    first = pq.read_table(pics / "part-00000.parquet").to_pylist()
    carrying = Unischema("Pics", [*SCHEMA, SPLIT])
    with pytest.raises(AppendSchemaError, match=r"hold field\(s\) \['split'\], which version 2 has as added columns"):
        write_dataset(pics, carrying, ({**row, "split": "test"} for row in first), mode="append")
    assert [v.operation for v in versions.list_versions(str(pics))] == ["write", "add_columns"]
    assert open_dataset(pics).num_rows == N and list_columns(pics) == {"split": ["split"]}


def test_an_add_whose_field_an_append_put_into_the_parts_meanwhile_is_refused(pics: Path) -> None:
    """The race the check above leaves: the append lands while the add writes its side files. The add was
    published, and no version after it could be opened."""
    first = pq.read_table(pics / "part-00000.parquet").to_pylist()
    carrying = Unischema("Pics", [*SCHEMA, SPLIT])

    def values(table: pa.Table) -> list[str]:
        if not (pics / "_unihub_versions").exists() or len(versions.list_versions(str(pics))) == 1:
            write_dataset(pics, carrying, ({**row, "split": "test"} for row in first), mode="append")
        return ["x"] * table.num_rows

    with pytest.raises(ConcurrentCommitError, match=r"an append \(version 2\) added field\(s\) \['split'\]"):
        add_column(pics, SPLIT, values, inputs=["id"])
    assert [v.operation for v in versions.list_versions(str(pics))] == ["write", "append"]
    assert open_dataset(pics).num_rows == N + N // 4 and list_columns(pics) == {}
    assert not list((pics / column_sets.DIRECTORY).rglob("*.parquet"))  # the refused add's files removed


def test_bad_input_is_refused_and_nothing_is_written(pics: Path) -> None:
    before = listing(pics)
    cases = [
        (ColumnSetError, "rows", lambda: add_column(pics, EMB, embedding(range(N - 1)))),
        (ValidationError, "dtype", lambda: add_column(pics, EMB, embedding(range(N)).astype(np.float64))),
        (ValidationError, "shape", lambda: add_column(pics, EMB, np.zeros((N, 7), np.float32))),
        (ColumnSetError, "exists", lambda: add_column(pics, UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()),
                                                                          True), np.arange(N))),
        (ColumnSetError, "name", lambda: add_column(pics, SPLIT, split_of(range(N)), name="../x")),
        (ValidationError, "split", lambda: add_column(pics, SPLIT, [*split_of(range(N - 1)), 7])),  # late in the writing
        (ColumnSetError, "no values", lambda: add_columns(pics, [EMB, SPLIT], {"emb": embedding(range(N))}, name="s")),
    ]
    for error, words, call in cases:
        with pytest.raises(error, match=words):
            call()
        assert listing(pics) == before, words
    add_column(pics, SPLIT, split_of(range(N)))
    with pytest.raises(ColumnSetError, match="column set 'split'"):  # a field of another set
        add_columns(pics, [SPLIT], {"split": split_of(range(N))}, name="other")


KILLED = """
import os, signal
import numpy as np
import pyarrow as pa
from unihub import ScalarCodec, UnischemaField, add_column
SPLIT = UnischemaField("split", np.str_, (), ScalarCodec(pa.string()), True)
calls = []
def values(table):
    calls.append(1)
    if len(calls) == 6:
        os.kill(os.getpid(), signal.SIGKILL)  # side files half written, the record not yet published
    return ["new"] * table.num_rows
add_column({path!r}, SPLIT, values, replace=True, storage_options={options!r})
"""


def test_a_kill_mid_add_leaves_the_old_state(pics: Path) -> None:
    add_column(pics, SPLIT, ["old"] * N)
    records = sorted(os.listdir(pics / publish.VERSIONS_DIR))
    code = textwrap.dedent(KILLED).format(path=str(pics), options=None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    assert sorted(os.listdir(pics / publish.VERSIONS_DIR)) == records
    leftover = [p for p in (pics / column_sets.DIRECTORY).rglob("*.parquet")]
    assert len(leftover) > 4  # the killed run's side files are there, listed by no record
    with make_reader(pics, schema_fields=["split"], workers_count=1) as reader:
        assert {r.split for r in reader} == {"old"}
    add_column(pics, SPLIT, ["newer"] * N, replace=True)  # the next add removes what the kill left
    assert len(list((pics / column_sets.DIRECTORY).rglob("*.parquet"))) == 8  # "old" (version 2) and "newer"
    with make_reader(pics, schema_fields=["split"], workers_count=1) as reader:
        assert {r.split for r in reader} == {"newer"}


def test_spark_and_pyarrow_see_the_parts_only(pics: Path) -> None:
    add_column(pics, EMB, embedding(ids_in_order(pics)))
    table = pq.ParquetDataset(str(pics)).read()
    assert table.num_rows == N and table.column_names == ["id", "image"]


def test_local_disk_cache_sees_a_backfill(pics: Path, tmp_path: Path) -> None:
    from unihub.readers.local_disk_cache import LocalDiskCache

    cache = LocalDiskCache(tmp_path / "cache", 10**8, cleanup=False)
    add_column(pics, SPLIT, ["a"] * N)
    assert set(cache.get_row_group(open_dataset(pics), 1, ["id", "split"]).column("split").to_pylist()) == {"a"}
    assert set(cache.get_row_group(open_dataset(pics), 1, ["id", "split"]).column("split").to_pylist()) == {"a"}
    assert cache.stats.hits == 1
    add_column(pics, SPLIT, ["b"] * N, replace=True)
    assert set(cache.get_row_group(open_dataset(pics), 1, ["id", "split"]).column("split").to_pylist()) == {"b"}
    cache.get_row_group(open_dataset(pics), 1, ["id"])
    assert cache.stats.hits == 1  # the parts' own columns: the same key as before any set (no entry yet here)


def test_show_sees_added_columns(pics: Path) -> None:
    from unihub.viewer import show

    ids = ids_in_order(pics)
    add_column(pics, EMB, embedding(ids))
    add_column(pics, SPLIT, split_of(ids))
    report = show(pics, rows=5, first=True)
    assert {s.name: s.kind for s in report.report.stats} == {"id": "number", "image": "image", "emb": "tensor",
                                                              "split": "string"}  # as written at once
    assert "split" in report.html and "val" in report.html


@pytest.mark.slow
def test_tfrecord_export_sees_added_columns(pics: Path, tmp_path: Path) -> None:
    from unihub import convert

    ids = ids_in_order(pics)
    add_column(pics, EMB, embedding(ids))
    add_column(pics, SPLIT, split_of(ids))
    tf = pytest.importorskip("tensorflow")
    out = tmp_path / "out.tfrecord"
    convert(pics, out, to_format="tfrecord", progress=False)
    files = sorted(str(p) for p in out.rglob("*") if p.is_file()) if out.is_dir() else [str(out)]
    examples = [tf.train.Example.FromString(raw.numpy()) for raw in tf.data.TFRecordDataset(files)]
    assert len(examples) == N
    for example in examples:
        feature = example.features.feature
        i = feature["id"].int64_list.value[0]
        np.testing.assert_allclose(feature["emb"].float_list.value, embedding([i])[0])
        assert feature["split"].bytes_list.value[0].decode() == split_of([i])[0]


def test_on_s3(pics: Path, s3_server: Any) -> None:
    url = s3_server.upload_folder(pics, "columns/ds")
    options = s3_server.storage_options()
    ids = ids_in_order(url, storage_options=options)
    add_column(url, EMB, embedding(ids), storage_options=options)
    add_column(url, SPLIT, ["old"] * N, storage_options=options)
    add_column(url, SPLIT, split_of(ids), replace=True, storage_options=options)
    publish.settle_url(url, options)  # a later write's clean-up keeps the columns
    with make_reader(url, schema_fields=["id", "emb", "split"], storage_options=options, workers_count=2) as reader:
        rows = list(reader)
    assert sorted(r.id for r in rows) == list(range(N))
    for row in rows:
        np.testing.assert_array_equal(row.emb, embedding([row.id])[0])
        assert row.split == split_of([row.id])[0]
    batch = Dataset(url, schema_fields=["id", "emb"], storage_options=options).take([3, 100, 5])
    np.testing.assert_array_equal(batch.emb, embedding(batch.id))
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_server.bucket,
                                                                  Prefix="columns/ds/")["Contents"]]
    assert sum("_unihub_columns/split/" in k for k in keys) == 8  # the replaced set's files: version 3 lists them
    assert {r["split"] for r in open_dataset(url, version=3, storage_options=options).read_row_group(0, ["split"])
            .to_pylist()} == {"old"}
    versions.vacuum_dataset(url, 1, storage_options=options)
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_server.bucket,
                                                                  Prefix="columns/ds/")["Contents"]]
    assert sum("_unihub_columns/split/" in k for k in keys) == 4  # gone with the versions that listed them
    with pytest.raises(ColumnSetError, match="rows"):
        add_column(url, UnischemaField("x", np.int64, (), ScalarCodec(pa.int64()), True), np.arange(3),
                   storage_options=options)


def test_a_dataset_overwritten_drops_its_columns(pics: Path) -> None:
    add_column(pics, SPLIT, split_of(range(N)))
    write_dataset(pics, SCHEMA, [{"id": 0, "image": encode_image(make_image(np.random.default_rng(0), 16, 16), "png")}],
                  overwrite=True)
    assert open_dataset(pics).schema.fields.keys() == {"id", "image"}


def test_predicates_and_filters_on_an_added_column(pics: Path) -> None:
    from unihub import in_lambda

    ids = ids_in_order(pics)
    add_column(pics, SPLIT, split_of(ids))
    with make_reader(pics, schema_fields=["id"], predicate=in_lambda(["split"], lambda s: s == "val"),
                     workers_count=1) as reader:
        assert sorted(r.id for r in reader) == list(range(0, N, 5))
    with make_batch_reader(pics, schema_fields=["id", "split"], filters=[("split", "=", "val")],
                           workers_count=1) as reader:
        found = sorted(i for batch in reader for i in np.asarray(batch.id).tolist())
    assert found == list(range(0, N, 5))


@pytest.mark.slow
def test_petastorm_s_dataset_with_a_column_added(tmp_path: Path, petastorm_python: Path) -> None:  # noqa: F811
    source = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm" / "unischema"
    copy = tmp_path / "ds"
    shutil.copytree(source, copy)
    ids = ids_in_order(copy)
    fold = UnischemaField("fold", np.str_, (), ScalarCodec(pa.string()), True)
    add_column(copy, fold, split_of(ids))
    store = open_dataset(copy)
    assert store.schema_source == "petastorm" and list(store.schema.fields)[-1] == "fold"
    with make_reader(copy, schema_fields=["id", "fold"], workers_count=1) as reader:
        assert {r.id: r.fold for r in reader} == dict(zip(ids.tolist(), split_of(ids)))
    job = {"reader": "make_reader", "fields": ["id", "label"]}
    before, after = petastorm_side.read_with_petastorm(petastorm_python, [{**job, "url": str(source)}, {**job, "url": str(copy)}],
                                        tmp_path)
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)


def test_cli_adds_lists_and_removes(pics: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from unihub.cli import main

    ids = ids_in_order(pics)
    np.save(tmp_path / "emb.npy", embedding(ids))
    (tmp_path / "split.txt").write_text("\n".join(split_of(ids)) + "\n", encoding="utf-8")
    assert main(["columns", "add", str(pics), str(tmp_path / "emb.npy"), "--field", "emb"]) == 0
    assert main(["columns", "add", str(pics), str(tmp_path / "split.txt"), "--field", "split"]) == 0
    assert "the parts are untouched" in capsys.readouterr().out
    assert main(["columns", "add", str(pics), str(tmp_path / "split.txt"), "--field", "split"]) == 1
    assert "replace" in capsys.readouterr().err
    assert main(["columns", "list", str(pics)]) == 0
    assert capsys.readouterr().out == "emb: emb\nsplit: split\n"
    batch = Dataset(pics, schema_fields=["emb", "split"]).take([0, 5])
    np.testing.assert_array_equal(batch.emb, embedding(ids[[0, 5]]))
    assert list(batch.split) == split_of(ids[[0, 5]])
    assert main(["inspect", str(pics)]) == 0
    assert "column sets (added beside the parts): emb: emb; split: split" in capsys.readouterr().out
    assert main(["columns", "rm", str(pics), "emb"]) == 0
    assert list_columns(pics) == {"split": ["split"]}


def test_adds_at_once_both_land_and_a_race_on_one_set_is_refused_by_name(pics: Path) -> None:
    calls = []

    def values(table: pa.Table) -> list[str]:
        calls.append(1)
        if len(calls) == 2:  # another add publishes while this one writes
            add_column(pics, EMB, embedding(ids_in_order(pics)))
        return ["x"] * table.num_rows

    assert add_column(pics, SPLIT, values).version == 3  # put onto the other add's version 2
    assert list_columns(pics) == {"emb": ["emb"], "split": ["split"]} and list_columns(pics, version=2) == \
        {"emb": ["emb"]}
    calls.clear()

    def backfill(table: pa.Table) -> list[str]:
        calls.append(1)
        if len(calls) == 2:  # another backfill of the same set publishes meanwhile
            add_column(pics, SPLIT, ["z"] * N, replace=True)
        return ["w"] * table.num_rows

    with pytest.raises(ConcurrentCommitError, match="column set 'split' was changed by another commit"):
        add_column(pics, SPLIT, backfill, replace=True)
    assert [v.number for v in versions.list_versions(pics)] == [1, 2, 3, 4]
    assert {r["split"] for r in open_dataset(pics).read_row_group(0, ["split"]).to_pylist()} == {"z"}
    assert len(list((pics / column_sets.DIRECTORY).rglob("*.parquet"))) == 12  # the refused add's files removed
    with pytest.raises(VersionNotFoundError, match="no version 9"):
        list_columns(pics, version=9)


def test_a_partitioned_dataset(tmp_path: Path) -> None:
    schema = Unischema("P", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                             UnischemaField("fold", np.int64, (), ScalarCodec(pa.int64()), False)])
    path = tmp_path / "ds"
    write_dataset(path, schema, ({"id": i, "fold": i % 3} for i in range(30)), partition_by=["fold"])
    ids = ids_in_order(path)
    add_column(path, SPLIT, split_of(ids))
    with make_reader(path, workers_count=1) as reader:
        rows = list(reader)
    assert sorted(r.id for r in rows) == list(range(30))
    assert all(r.split == split_of([r.id])[0] and r.fold == r.id % 3 for r in rows)
    assert pq.ParquetDataset(str(path)).read().num_rows == 30


def test_plain_parquet_gets_a_column(plain_parquet: Path) -> None:
    add_column(plain_parquet, SPLIT, split_of(range(10)))
    with make_batch_reader(plain_parquet, workers_count=1, shuffle_row_groups=False) as reader:
        batches = list(reader)
    assert [i for b in batches for i in np.asarray(b.id).tolist()] == list(range(10))
    assert [s for b in batches for s in np.asarray(b.split).tolist()] == split_of(range(10))


@pytest.mark.slow
def test_on_s3_a_kill_mid_add_leaves_the_old_state_and_the_next_write_cleans_up(s3_server: Any) -> None:
    options = s3_server.storage_options()
    url = write_pics(f"s3://{s3_server.bucket}/columns/killed", storage_options=options)  # published by a manifest
    add_column(url, SPLIT, ["old"] * N, storage_options=options)
    code = textwrap.dedent(KILLED).format(path=url, options=options)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]

    def side_keys() -> list[str]:
        listed = s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix="columns/killed/_unihub_columns/")
        return [o["Key"] for o in listed.get("Contents", [])]

    assert len(side_keys()) > 4
    with make_reader(url, schema_fields=["split"], storage_options=options, workers_count=1) as reader:
        assert {r.split for r in reader} == {"old"}
    publish.settle_url(url, options)  # what every write runs first: the dead run's files go, the listed stay
    assert len(side_keys()) == 4
    with make_reader(url, schema_fields=["split"], storage_options=options, workers_count=1) as reader:
        assert {r.split for r in reader} == {"old"}
    write_pics(url, storage_options=options, overwrite=True)  # a new dataset: the columns of the old one go
    assert side_keys() == [] and open_dataset(url, storage_options=options).schema.fields.keys() == {"id", "image"}


def test_equal_to_the_same_rows_written_at_once_and_a_copy_holds_them(pics: Path, tmp_path: Path) -> None:
    from unihub import copy_dataset, verify

    ids = ids_in_order(pics)
    add_column(pics, EMB, embedding(ids))
    add_column(pics, SPLIT, split_of(ids))
    store = open_dataset(pics)
    rows = [r for g in range(len(store.row_groups)) for r in store.read_row_group(g, ["id", "image"]).to_pylist()]
    write_dataset(tmp_path / "once", Unischema("Pics", [*SCHEMA, EMB, SPLIT]),
                  ({**r, "emb": embedding([r["id"]])[0], "split": split_of([r["id"]])[0]} for r in rows))
    report = verify(pics, tmp_path / "once")
    assert report.equal, report.summary()
    copy_dataset(None, pics, tmp_path / "copy")  # the added columns written into the copy's own parts
    assert list_columns(tmp_path / "copy") == {}
    report = verify(tmp_path / "copy", tmp_path / "once")
    assert report.equal, report.summary()


def test_opening_lists_no_side_file_or_version_record(pics: Path) -> None:
    """Opening a grown dataset lists (stats) its data files only: the side files and version records, under
    folders starting with '_', are not walked into (a dataset of 100 appends and 3 sets: 400 stats fewer)."""
    from unihub.store import dataset as dataset_module

    add_column(pics, EMB, embedding(ids_in_order(pics)))
    listed = dataset_module._local_tree(str(pics))
    assert listed and not [p for p in listed if "/_" in p[len(str(pics)):] or "/." in p[len(str(pics)):]]
    assert sorted(dataset_module.list_data_files(open_dataset(pics).filesystem, str(pics))) == \
        sorted(str(p) for p in pics.glob("*.parquet"))


def test_local_footers_are_read_without_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A local dataset's footers are read in the opening thread (threads cost more CPU than they save there)."""
    from unihub.store import dataset as dataset_module

    path = tmp_path / "ds"
    for first in range(0, N, N // 12):  # 12 appends: 12 parts
        write_dataset(path, Unischema("Ids", [SCHEMA.fields["id"]]), {"id": np.arange(first, first + N // 12)},
                      batched=True, mode="append")

    def refused(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("a thread pool for local footers")

    monkeypatch.setattr(dataset_module, "ThreadPoolExecutor", refused)
    store = open_dataset(path)
    assert len(store.files) == 12 and store.num_rows == N


def test_side_files_are_read_whole_and_large_files_mapped(pics: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small local file (a side file) is read whole, not memory-mapped: mapping and unmapping it cost more
    than the copy; a file over SMALL_FILE_BYTES is mapped. The rows read are the same either way."""
    from unihub.fs import filesystem as fsutil

    ids = ids_in_order(pics)
    add_column(pics, EMB, embedding(ids))
    side = next((pics / column_sets.DIRECTORY).rglob("*.parquet"))
    assert isinstance(fsutil.open_local(str(side)), pa.BufferReader)
    assert fsutil.open_local(str(side)).read() == side.read_bytes()
    with make_batch_reader(pics, schema_fields=["id", "emb"], shuffle_row_groups=False) as reader:
        whole = [(b.id, b.emb) for b in reader]
    monkeypatch.setattr(fsutil, "SMALL_FILE_BYTES", 8)
    assert isinstance(fsutil.open_local(str(side)), pa.MemoryMappedFile)
    with make_batch_reader(pics, schema_fields=["id", "emb"], shuffle_row_groups=False) as reader:
        mapped = [(b.id, b.emb) for b in reader]
    assert len(whole) == len(mapped) > 0
    for (ids_a, emb_a), (ids_b, emb_b) in zip(whole, mapped):
        np.testing.assert_array_equal(ids_a, ids_b)
        np.testing.assert_array_equal(emb_a, emb_b)
        np.testing.assert_array_equal(emb_a, embedding(ids_a))


LABEL = UnischemaField("label", np.int64, (), ScalarCodec(pa.int64()), True)


def side_entries(path: Path, version: int | None = None) -> dict[str, dict[str, str]]:
    """Each set of a version (the latest by default): part -> its side file."""
    listed = versions.list_versions(path)
    chosen = listed[-1] if version is None else next(v for v in listed if v.number == version)
    return {s["name"]: {rel: side["file"] for rel, side in s["parts"].items()} for s in chosen.column_sets}


def check_added(path: Path, expected: dict[str, Any], version: int | None = None) -> None:
    """Every row's added fields (in the dataset's row order) are ``expected``'s, bit for bit, through a reader and
    through the store's row groups."""
    store = open_dataset(path, version=version)
    table = pa.concat_tables([store.read_row_group(g) for g in range(len(store.row_groups))])
    assert table["id"].to_pylist() == list(range(N))
    with make_batch_reader(path, version=version, schema_fields=["id", *expected], shuffle_row_groups=False,
                           workers_count=1) as reader:
        batches = list(reader)
    for name, values in expected.items():
        got = np.concatenate([np.asarray(getattr(b, name)) for b in batches])
        assert np.asarray(got).tolist() == np.asarray(values).tolist(), name
        if isinstance(values, np.ndarray) and values.dtype == np.float32:
            assert np.stack(got).tobytes() == values.tobytes()


def test_small_sets_are_folded_into_one_side_file_per_part_read_once(pics: Path, monkeypatch: pytest.MonkeyPatch
                                                                     ) -> None:
    """A set added where the part's other sets' side files are small copies their columns into its own file, and
    the version reads them all from there: one side file opened per part, not one per set. Older versions read
    the files they listed; the values are the same bit for bit."""
    from unihub.fs import filesystem as fsutil

    ids = ids_in_order(pics)
    labels = ids * 7
    add_column(pics, EMB, embedding(ids))
    add_column(pics, SPLIT, split_of(ids))
    add_column(pics, LABEL, labels)
    entries = side_entries(pics)
    assert entries["label"] == entries["split"] == entries["emb"]  # each part: one file, the newest set's
    assert all(f.startswith(f"{column_sets.DIRECTORY}/label/") for f in entries["label"].values())
    assert side_entries(pics, 2)["emb"] != entries["emb"]  # version 2 lists its own files, kept
    expected = {"emb": embedding(ids), "split": split_of(ids), "label": labels}
    opened: list[str] = []
    real = fsutil.open_local
    monkeypatch.setattr(fsutil, "open_local", lambda p: (opened.append(p), real(p))[1])
    check_added(pics, expected)
    assert len(set(opened)) == 4 and all("/label/" in p for p in opened)  # 4 parts, one side file each
    monkeypatch.undo()
    check_added(pics, {"emb": embedding(ids)}, version=2)  # time travel: the files of the versions before
    check_added(pics, {"emb": embedding(ids), "split": split_of(ids)}, version=3)
    versions.vacuum_dataset(pics, 1)  # the latest version's files only: the folded ones
    assert {str(p.relative_to(pics)) for p in (pics / column_sets.DIRECTORY).rglob("*.parquet")} == \
        set(entries["label"].values())
    check_added(pics, expected)


def test_a_large_side_file_is_not_written_again(pics: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A set whose side file for a part is over FOLD_MAX_BYTES keeps it: adding a small label next to an embedding
    writes the label's bytes, not the embedding's again."""
    from unihub.store import columns

    ids = ids_in_order(pics)
    add_column(pics, EMB, embedding(ids))
    monkeypatch.setattr(columns, "FOLD_MAX_BYTES", 64)
    result = add_column(pics, LABEL, ids * 7)
    entries = side_entries(pics)
    assert entries["emb"] == side_entries(pics, 2)["emb"] and set(entries["emb"].values()).isdisjoint(
        entries["label"].values())
    pq_files = [pq.ParquetFile(pics / f) for f in entries["label"].values()]
    assert all(f.schema_arrow.names == ["label"] for f in pq_files) and result.bytes_written < 12_000
    check_added(pics, {"emb": embedding(ids), "label": ids * 7})


def test_a_backfill_of_a_folded_set_and_a_removal(pics: Path) -> None:
    """A backfill of a set folded with others writes its new values with the others' current ones; removing a set
    leaves the others reading the shared file."""
    ids = ids_in_order(pics)
    add_column(pics, EMB, embedding(ids))
    add_column(pics, SPLIT, split_of(ids))
    add_column(pics, EMB, embedding(ids) * 2, replace=True)  # folds split into emb's new file
    entries = side_entries(pics)
    assert entries["emb"] == entries["split"]
    check_added(pics, {"emb": embedding(ids) * 2, "split": split_of(ids)})
    check_added(pics, {"emb": embedding(ids), "split": split_of(ids)}, version=3)
    remove_columns(pics, "emb")
    assert side_entries(pics)["split"] == entries["split"]
    check_added(pics, {"split": split_of(ids)})
    assert "emb" not in open_dataset(pics).schema.fields


def test_a_fold_keeps_a_set_another_commit_rewrote_meanwhile(pics: Path) -> None:
    """A set folded by an add while another commit backfilled it keeps the other commit's values (the copy in the
    add's file is of the values before: unused)."""
    ids = ids_in_order(pics)
    add_column(pics, EMB, embedding(ids))
    calls = []

    def values(table: pa.Table) -> list[str]:
        calls.append(1)
        if len(calls) == 2:  # a backfill of emb publishes while split is written (emb's old files folded)
            add_column(pics, EMB, embedding(ids) + 1, replace=True)
        return split_of(table.column("id").to_pylist())

    assert add_column(pics, SPLIT, values, inputs=["id"]).version == 4
    entries = side_entries(pics)
    assert set(entries["emb"].values()).isdisjoint(entries["split"].values())
    check_added(pics, {"emb": embedding(ids) + 1, "split": split_of(ids)})


def test_a_delete_rewrites_a_folded_side_file_once(pics: Path) -> None:
    """Deleting rows rewrites a part's folded side file as one file read by all its sets."""
    import pyarrow.compute as pc

    ids = ids_in_order(pics)
    add_column(pics, EMB, embedding(ids))
    add_column(pics, SPLIT, split_of(ids))
    version = versions.delete_rows(pics, pc.field("split") == "val")
    assert version is not None
    entries = side_entries(pics)
    assert entries["emb"] == entries["split"] and len(set(entries["emb"].values())) == 4
    kept = [i for i in ids.tolist() if i % 5]
    store = open_dataset(pics)
    table = pa.concat_tables([store.read_row_group(g) for g in range(len(store.row_groups))])
    assert table["id"].to_pylist() == kept and table["split"].to_pylist() == split_of(kept)
    with make_batch_reader(pics, schema_fields=["id", "emb"], shuffle_row_groups=False, workers_count=1) as reader:
        for batch in reader:
            assert np.asarray(batch.emb).tobytes() == embedding(batch.id).tobytes()
    check_added(pics, {"emb": embedding(ids), "split": split_of(ids)}, version=3)


def test_side_file_footers_are_parsed_once_per_process(pics: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second store over the same version (the next epoch's reader) takes the parts' and the side files' footers
    from this process's footer cache (store/footer_cache.py), and reads the same values."""
    from unihub.store import footer_cache

    ids = ids_in_order(pics)
    add_column(pics, EMB, embedding(ids))
    monkeypatch.setattr(footer_cache, "FOOTERS", footer_cache.FooterCache())
    check_added(pics, {"emb": embedding(ids)})
    kept, hits = len(footer_cache.FOOTERS), footer_cache.FOOTERS.hits
    assert kept == 8  # 4 parts, 4 side files
    store = open_dataset(pics)
    table = pa.concat_tables([store.read_row_group(g, ["id", "emb"]) for g in range(len(store.row_groups))])
    assert footer_cache.FOOTERS.hits - hits == 8 and len(footer_cache.FOOTERS) == kept
    assert np.stack(table["emb"].to_numpy(zero_copy_only=False)).tobytes() == embedding(ids).tobytes()
