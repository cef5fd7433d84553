"""open_dataset: locations, the row-group index, errors for what is not a dataset, plain Parquet, fsspec;
Petastorm's schema look-ups (get_schema_from_dataset_url, infer_or_load_unischema)."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from unihub import (
    CompressedImageCodec,
    CompressedNdarrayCodec,
    DatasetNotFoundError,
    FormatError,
    NdarrayCodec,
    PetastormMetadataError,
    ScalarCodec,
    SchemaError,
    TensorCodec,
    Unischema,
    UnischemaField,
    add_schema,
    get_schema_from_dataset_url,
    infer_or_load_unischema,
    make_batch_reader,
    match_unischema_fields,
    open_dataset,
    write_dataset,
)
from unihub.dependencies import is_available
from unihub.store.dataset import RowGroupInfo

requires_fsspec = pytest.mark.skipif(not is_available("fsspec"), reason="fsspec is not installed")


def pyarrow_index(paths):
    """(path, row group, rows, first row, bytes) for every row group, from pyarrow's own footers."""
    index, first = [], 0
    for path in paths:
        metadata = pq.read_metadata(path)
        for i in range(metadata.num_row_groups):
            rg = metadata.row_group(i)
            index.append((str(path), i, rg.num_rows, first, rg.total_byte_size))
            first += rg.num_rows
    return index


def store_index(store):
    return [(rg.path, rg.row_group, rg.num_rows, rg.first_row, rg.total_byte_size) for rg in store.row_groups]


# -- locations -------------------------------------------------------------------------------------
def test_open_local_path(write_sample, schema):
    path, result = write_sample(100, rows_per_file=40, row_group_size_mb=0.01)
    for url in (path, str(path), str(path) + "/"):
        store = open_dataset(url)
        assert store.schema == schema
        assert store.schema_source == "unihub"
        assert store.num_rows == 100
        assert store.path == str(path)
        assert [f.path for f in store.files] == list(result.files)
        assert [f.num_rows for f in store.files] == [40, 40, 20]
        assert store.total_bytes == sum(f.size_bytes for f in store.files) == result.bytes_written
        assert store.arrow_schema.names == list(schema.fields)
        assert store.partition_names == ()


def test_open_file_url(write_sample, schema):
    path, _ = write_sample(10)
    store = open_dataset(f"file://{path}")
    assert store.url == f"file://{path}"
    assert store.path == str(path)
    assert isinstance(store.filesystem, pafs.LocalFileSystem)
    assert store.num_rows == 10 and store.schema == schema


def test_open_single_parquet_file(write_sample, schema):
    path, _ = write_sample(30, rows_per_file=20)
    store = open_dataset(path / "part-00001.parquet")
    assert store.num_rows == 10
    assert store.schema == schema and store.schema_source == "unihub"
    assert [f.path for f in store.files] == [str(path / "part-00001.parquet")]
    assert store.read_row_group(0).column("id").to_pylist() == list(range(20, 30))


def test_row_group_index_matches_pyarrow(write_sample):
    path, result = write_sample(1000, rows_per_file=400, row_group_size_mb=0.02)
    store = open_dataset(path)
    files = sorted(path.glob("*.parquet"))
    assert len(files) == 3
    expected = pyarrow_index(files)
    assert len(expected) > 6 and len(expected) == result.num_row_groups
    assert store_index(store) == expected
    assert [rg.index for rg in store.row_groups] == list(range(len(expected)))
    assert all(isinstance(rg, RowGroupInfo) for rg in store.row_groups)
    assert [f.num_row_groups for f in store.files] == [pq.read_metadata(f).num_row_groups for f in files]
    for info in store.row_groups:
        table = store.read_row_group(info.index, columns=["id"])
        assert table.column("id").to_pylist() == list(range(info.first_row, info.first_row + info.num_rows))


def test_row_group_of(write_sample):
    path, _ = write_sample(250, rows_per_file=100, row_group_size_mb=0.02)
    store = open_dataset(path)
    for row in range(250):
        info, local = store.row_group_of(row)
        assert 0 <= local < info.num_rows
        assert info.first_row + local == row
    assert store.row_group_of(0) == (store.row_groups[0], 0)
    last = store.row_groups[-1]
    assert store.row_group_of(249) == (last, last.num_rows - 1)
    first_of_second = store.row_groups[1].first_row
    assert store.row_group_of(first_of_second) == (store.row_groups[1], 0)
    assert store.row_group_of(first_of_second - 1) == (store.row_groups[0], store.row_groups[0].num_rows - 1)
    for bad in (-1, 250, 10**9):
        with pytest.raises(IndexError, match=f"row {bad} is out of range for a dataset of 250 rows"):
            store.row_group_of(bad)


def test_read_row_group_columns(write_sample):
    path, _ = write_sample(20)
    store = open_dataset(path)
    table = store.read_row_group(0, columns=["vec", "id"])
    assert table.column_names == ["vec", "id"]
    assert isinstance(table.schema.field("vec").type, pa.FixedShapeTensorType)


def test_reads_keep_one_file_open_per_thread_and_reopen_after_the_budget(write_sample, monkeypatch):
    import pickle
    from concurrent.futures import ThreadPoolExecutor

    from unihub.store import dataset as parquet

    path, _ = write_sample(300, rows_per_file=100, row_group_size_mb=0.001)
    store = open_dataset(path)
    assert len(store.files) == 3 and len(store.row_groups) > 3
    expected = [pq.ParquetFile(rg.path).read_row_group(rg.row_group, columns=["id"]) for rg in store.row_groups]
    opened = []
    real_open = store._open_file.__func__

    def counting_open(self, file_path, verify):
        before = getattr(self._open, "handle", None)
        result = real_open(self, file_path, verify)
        if self._open.handle is not before:
            opened.append(file_path)
        return result

    monkeypatch.setattr(parquet.ParquetStore, "_open_file", counting_open)
    for i in range(len(store.row_groups)):  # in file order: one open per file
        assert store.read_row_group(i, ["id"]).equals(expected[i])
    assert len(opened) == 3
    opened.clear()
    monkeypatch.setattr(parquet, "_MAPPED_BYTES_BEFORE_REOPEN", 1)  # every read past the budget reopens
    for i in range(len(store.row_groups)):
        assert store.read_row_group(i).num_rows == expected[i].num_rows
    assert len(opened) == len(store.row_groups)
    monkeypatch.undo()

    # threads read concurrently through their own handles; a pickled store opens its own
    order = [i for _ in range(20) for i in range(len(store.row_groups))]
    with ThreadPoolExecutor(4) as pool:
        tables = list(pool.map(lambda i: store.read_row_group(i, ["id"]), order))
    assert [t.column("id").to_pylist() for t in tables] == [expected[i].column("id").to_pylist() for i in order]
    copy = pickle.loads(pickle.dumps(store))
    assert copy.read_row_group(2, ["id"]).equals(store.read_row_group(2, ["id"]))


# -- what is not a dataset ---------------------------------------------------------------------------
def test_missing_path(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="no such file or directory") as info:
        open_dataset(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(DatasetNotFoundError):
        open_dataset(f"file://{tmp_path}/nope")


def test_directory_without_parquet(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match="holds no Parquet data files"):
        open_dataset(tmp_path / "empty")
    only_hidden = tmp_path / "hidden"
    (only_hidden / "_temporary").mkdir(parents=True)
    pq.write_table(pa.table({"x": [1]}), only_hidden / "_temporary" / "part-0.parquet")
    pq.write_table(pa.table({"x": [1]}), only_hidden / ".part-1.parquet")
    (only_hidden / "_SUCCESS").write_bytes(b"")
    with pytest.raises(DatasetNotFoundError, match="holds no Parquet data files"):
        open_dataset(only_hidden)


def test_non_parquet_file_in_dataset(write_sample):
    path, _ = write_sample(10)
    (path / "notes.txt").write_text("this is not parquet, and it is long enough to have a footer" * 3)
    with pytest.raises(FormatError, match="not a readable Parquet file") as info:
        open_dataset(path)
    assert info.value.path == str(path / "notes.txt")
    assert str(path / "notes.txt") in str(info.value)


def test_truncated_parquet_file_in_dataset(write_sample):
    path, _ = write_sample(40, rows_per_file=20)
    victim = path / "part-00001.parquet"
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    with pytest.raises(FormatError) as info:
        open_dataset(path)
    assert info.value.path == str(victim)
    assert f"{victim}: not a readable Parquet file ({len(data) // 2} bytes)" in str(info.value)
    victim.write_bytes(b"")
    with pytest.raises(FormatError, match=r"part-00001.parquet: not a readable Parquet file \(0 bytes\)"):
        open_dataset(path)


def test_corrupt_common_metadata(write_sample):
    path, _ = write_sample(5)
    (path / "_common_metadata").write_bytes(b"PAR1 garbage")
    with pytest.raises(FormatError, match="_common_metadata: not a readable Parquet file"):
        open_dataset(path)


def test_files_with_different_columns(tmp_path):
    root = tmp_path / "mixed"
    root.mkdir()
    pq.write_table(pa.table({"a": [1], "b": [2]}), root / "part-0.parquet")
    pq.write_table(pa.table({"a": [1], "c": [2]}), root / "part-1.parquet")
    with pytest.raises(FormatError, match=r"part-1.parquet: columns differ .* \(missing \['b'\], extra \['c'\]\)"):
        open_dataset(root)


def test_unsupported_schema_version_names_the_dataset(write_sample):
    path, _ = write_sample(3)
    file = path / "part-00000.parquet"
    table = pq.read_table(file)
    metadata = dict(table.schema.metadata)
    metadata[b"unihub.unischema"] = metadata[b"unihub.unischema"].replace(b'"version":1', b'"version":7')
    pq.write_table(table.replace_schema_metadata(metadata), file)
    (path / "_common_metadata").unlink()
    with pytest.raises(SchemaError, match=f"{file}: metadata key 'unihub.unischema': Unischema JSON version 7 is not "
                                          "supported"):
        open_dataset(path)


# -- plain Parquet -----------------------------------------------------------------------------------
def test_plain_parquet_is_inferred(plain_parquet):
    store = open_dataset(plain_parquet)
    assert store.schema_source == "inferred"
    assert store.schema.name == "plain"
    assert list(store.schema.fields) == ["id", "name", "pair"]
    assert store.schema.id == UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), True)
    assert store.schema["name"] == UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), True)
    assert store.schema.pair == UnischemaField("pair", np.float32, (None,), TensorCodec(), True)
    assert store.num_rows == 10
    assert store_index(store) == pyarrow_index(sorted(plain_parquet.glob("*.parquet")))
    assert [rg.num_rows for rg in store.row_groups] == [3, 3, 4]
    table = store.read_row_group(2)
    pair = store.schema.pair
    decoded = pair.codec.decode_column(pair, table.column("pair"))
    assert [r.tolist() for r in decoded] == [[float(i), i + 0.5] for i in range(6, 10)]
    assert all(r.dtype == np.float32 for r in decoded)


def test_plain_parquet_partitions_are_inferred(tmp_path):
    root = tmp_path / "hive"
    for year in (2020, 2021):
        for city in ("paris", "new york"):
            folder = root / f"year={year}" / f"city={city.replace(' ', '%20')}"
            folder.mkdir(parents=True)
            pq.write_table(pa.table({"x": [1.0, 2.0]}), folder / "part-0.parquet")
    store = open_dataset(root)
    assert store.schema_source == "inferred"
    assert store.partition_names == ("year", "city")
    assert store.schema.year == UnischemaField("year", np.int64, (), ScalarCodec(pa.int64()), False)
    assert store.schema.city == UnischemaField("city", np.str_, (), ScalarCodec(pa.string()), False)
    seen = set()
    for info in store.row_groups:
        table = store.read_row_group(info.index)
        assert table.schema.field("year").type == pa.int64()
        seen.update(zip(table.column("year").to_pylist(), table.column("city").to_pylist(), strict=True))
    assert seen == {(2020, "paris"), (2020, "new york"), (2021, "paris"), (2021, "new york")}


def test_plain_parquet_partition_values_past_int64_are_text(tmp_path):
    # digits past int64 (an id, a hash) were inferred as int64 and every read failed with a raw OverflowError
    # ("Python int too large to convert to C long"); they are text, as a value that is no int would be
    root = tmp_path / "hive"
    for key in ("99999999999999999999", "7"):
        (root / f"key={key}").mkdir(parents=True)
        pq.write_table(pa.table({"x": [1.0]}), root / f"key={key}" / "part-0.parquet")
    store = open_dataset(root)
    assert store.schema.key == UnischemaField("key", np.str_, (), ScalarCodec(pa.string()), False)
    values = {store.read_row_group(info.index).column("key")[0].as_py() for info in store.row_groups}
    assert values == {"99999999999999999999", "7"}
    with make_batch_reader(str(root), workers_count=1) as reader:
        assert sorted(v for batch in reader for v in batch.key) == ["7", "99999999999999999999"]


def test_a_partition_folder_past_its_fields_range_is_a_schema_error(tmp_path):
    # a folder k=99999999999 beside a dataset's int32 partitions: a raw OverflowError from numpy, now named
    schema = Unischema("S", [UnischemaField("k", np.int32, (), ScalarCodec(pa.int32()), False),
                             UnischemaField("x", np.float64, (), ScalarCodec(pa.float64()), False)])
    write_dataset(tmp_path / "ds", schema, [{"k": 1, "x": 1.0}], partition_by=["k"])
    (tmp_path / "ds" / "k=99999999999").mkdir()
    (tmp_path / "ds" / "k=1" / "part-00000.parquet").rename(tmp_path / "ds" / "k=99999999999" / "part-00000.parquet")
    with pytest.raises(SchemaError, match="partition value '99999999999' of 'k' is not a int32"):
        open_dataset(tmp_path / "ds").read_row_group(0)


@pytest.mark.parametrize("loose", ["a.parquet", "z.parquet"], ids=["listed-first", "listed-last"])
def test_files_at_other_partition_depths_are_a_format_error(tmp_path, loose):
    # the keys came from the first file's path: a file beside k=1/ listed first dropped k from every row
    # (the schema had no k), listed last failed every read with a raw KeyError ('Field "k" does not exist')
    root = tmp_path / "tree"
    (root / "k=1").mkdir(parents=True)
    pq.write_table(pa.table({"id": [0, 1]}), root / "k=1" / "part.parquet")
    pq.write_table(pa.table({"id": [2, 3]}), root / loose)
    with pytest.raises(FormatError, match=r"partition folders name the keys \[.*\], .*'s name \[.*\]: a dataset's "
                                          "files sit at one depth of key=value folders") as info:
        open_dataset(root)
    assert info.value.path.endswith("k=1/part.parquet" if loose == "a.parquet" else "z.parquet")


def test_an_empty_append_beside_partition_folders_is_read(tmp_path):
    # an append of no rows writes one empty file at the root: it holds no keys and no rows, and is passed over
    schema = Unischema("S", [UnischemaField("k", np.int32, (), ScalarCodec(pa.int32()), False),
                             UnischemaField("x", np.float64, (), ScalarCodec(pa.float64()), False)])
    write_dataset(tmp_path / "ds", schema, [{"k": 1, "x": 1.0}], partition_by=["k"])
    write_dataset(tmp_path / "ds", schema, [], partition_by=["k"], mode="append")
    store = open_dataset(tmp_path / "ds")
    assert store.partition_names == ("k",) and store.num_rows == 1
    with make_batch_reader(str(tmp_path / "ds"), workers_count=1) as reader:
        assert [(b.k.tolist(), b.x.tolist()) for b in reader] == [([1], [1.0])]


def test_dataset_written_by_pyarrow_with_unischema_metadata(tmp_path, schema, sample_row):
    # a footer-only dataset (no _common_metadata) opens from the footer's JSON
    root = tmp_path / "footer_only"
    write_dataset(root, schema, (sample_row(i) for i in range(4)))
    (root / "_common_metadata").unlink()
    store = open_dataset(root)
    assert store.schema == schema and store.schema_source == "unihub"


# -- fsspec ---------------------------------------------------------------------------------------------
@requires_fsspec
def test_open_via_fsspec_memory_filesystem(schema, sample_row):
    import fsspec

    memory = fsspec.filesystem("memory")
    root = f"/unihub-test-{uuid.uuid4().hex}/ds"
    try:
        result = write_dataset(root, schema, (sample_row(i) for i in range(25)), filesystem=memory,
                               rows_per_file=10)
        assert result.num_rows == 25
        # not a local disk: published by a manifest written last, parts under names of their run
        listed = sorted(p.rsplit("/", 1)[1] for p in memory.ls(root, detail=False))
        parts = [n for n in listed if n.endswith(".parquet")]
        assert [n.rsplit("-", 1)[1] for n in parts] == [f"0000{i}.parquet" for i in range(3)]
        assert "_common_metadata" in listed and "_unihub_manifest.json" in listed
        assert [p.rsplit("/", 1)[1] for p in result.files] == parts
        assert memory.ls(root.rsplit("/", 1)[0], detail=False) == [root]  # no temporary sibling left
        store = open_dataset(root, filesystem=memory)
        assert store.schema == schema and store.num_rows == 25
        assert [rg.num_rows for rg in store.row_groups] == [10, 10, 5]
        assert store.read_row_group(2, columns=["id"]).column("id").to_pylist() == list(range(20, 25))
        via_url = open_dataset(f"memory:/{root}")
        assert via_url.num_rows == 25
    finally:
        memory.rm(root.rsplit("/", 1)[0], recursive=True)


@requires_fsspec
def test_open_via_fsspec_local_filesystem(write_sample, schema):
    import fsspec

    path, _ = write_sample(12, rows_per_file=5)
    store = open_dataset(str(path), filesystem=fsspec.filesystem("file"))
    assert store.schema == schema
    assert [rg.num_rows for rg in store.row_groups] == [5, 5, 2]
    assert store_index(store) == pyarrow_index(sorted(path.glob("*.parquet")))


def test_open_via_pyarrow_filesystem(write_sample):
    path, _ = write_sample(6)
    store = open_dataset(str(path), filesystem=pafs.LocalFileSystem())
    assert store.num_rows == 6


def test_schema_metadata_survives_schema_view(write_sample, schema):
    path, _ = write_sample(3)
    store = open_dataset(path)
    view = store.schema.create_schema_view(["id", "v.*"])
    assert list(view.fields) == ["id", "vec"]
    assert isinstance(store.schema, Unischema)


# -- Petastorm's schema look-ups ------------------------------------------------------------------------
PETASTORM_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm"


def test_get_schema_from_dataset_url_of_a_petastorm_dataset():
    root = PETASTORM_FIXTURES / "unischema"
    files = sorted(p.as_uri() for p in root.glob("part-*.parquet"))
    for source in (root.as_uri(), str(root), files):
        schema = get_schema_from_dataset_url(source)
        assert schema.name == "FixtureSchema"
        assert list(schema.fields) == ["id", "split", "label", "score", "image_png", "image_jpeg", "gray",
                                       "embedding", "boxes", "mask", "temps"]
        assert schema.id == UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False)
        assert schema.score == UnischemaField("score", np.float64, (), ScalarCodec(pa.float64()), True)
        assert schema.image_jpeg == UnischemaField("image_jpeg", np.uint8, (32, 48, 3),
                                                   CompressedImageCodec("jpeg", quality=90), False)
        assert schema.boxes == UnischemaField("boxes", np.float32, (None, 4), NdarrayCodec(), False)
        assert schema.mask == UnischemaField("mask", np.uint8, (8, 8), CompressedNdarrayCodec(), True)
    picked = match_unischema_fields(get_schema_from_dataset_url(root.as_uri(), hdfs_driver="libhdfs"), ["image_.*"])
    assert [f.name for f in picked] == ["image_png", "image_jpeg"]


def test_get_schema_from_dataset_url_of_a_unihub_dataset(write_sample, schema):
    path, _ = write_sample(5)
    assert get_schema_from_dataset_url(path.as_uri()) == schema
    assert get_schema_from_dataset_url(str(path), filesystem=pafs.LocalFileSystem()) == schema


def test_get_schema_from_dataset_url_of_plain_parquet_says_what_to_do(plain_parquet):
    for source in (PETASTORM_FIXTURES / "plain", plain_parquet):
        with pytest.raises(PetastormMetadataError, match=r"no Unischema.*unihub add-schema .*make_batch_reader"):
            get_schema_from_dataset_url(str(source))
    assert issubclass(PetastormMetadataError, SchemaError) and issubclass(PetastormMetadataError, ValueError)
    with pytest.raises(DatasetNotFoundError):
        get_schema_from_dataset_url(str(plain_parquet / "missing"))
    add_schema(plain_parquet)  # what the message advises
    schema = get_schema_from_dataset_url(str(plain_parquet))
    assert list(schema.fields) == ["id", "name", "pair"]
    assert schema.pair == UnischemaField("pair", np.float32, (None,), TensorCodec(), True)


def test_infer_or_load_unischema(plain_parquet, write_sample, schema, monkeypatch):
    inferred = infer_or_load_unischema(str(plain_parquet))
    assert list(inferred.fields) == ["id", "name", "pair"]
    assert inferred.id == UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), True)
    assert inferred["name"] == UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), True)
    assert infer_or_load_unischema(open_dataset(plain_parquet)) == inferred
    from_files = infer_or_load_unischema(pq.ParquetDataset(str(plain_parquet)))  # named after its first file
    assert list(from_files) == list(inferred)
    path, _ = write_sample(3)
    assert infer_or_load_unischema(path) == schema  # stored: loaded, not inferred
    monkeypatch.chdir(PETASTORM_FIXTURES)  # ParquetDataset keeps relative paths as given
    stored = infer_or_load_unischema(pq.ParquetDataset("unischema"))
    assert stored == get_schema_from_dataset_url(str(PETASTORM_FIXTURES / "unischema"))
    assert stored.image_png.codec == CompressedImageCodec("png")


def test_footers_of_unchanged_local_files_are_read_once_per_process(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a local dataset again (a reader per epoch) parses no footer it parsed before; a file changed since
    (size or modification time) is read again, and its new rows are what the store reads."""
    import os

    from unihub.store import dataset as dataset_module
    from unihub.store import footer_cache

    path = tmp_path / "ds"
    schema = Unischema("Ids", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False)])
    for first in (0, 10, 20):
        write_dataset(path, schema, {"id": np.arange(first, first + 10)}, batched=True, mode="append")
    monkeypatch.setattr(footer_cache, "FOOTERS", footer_cache.FooterCache())
    parsed: list[str] = []
    real = dataset_module._read_metadata
    monkeypatch.setattr(dataset_module, "_read_metadata", lambda fs, p, *a: (
        parsed.append(p) if not os.path.basename(p).startswith("_") else None, real(fs, p, *a))[1])  # data files
    first = open_dataset(path)
    assert len(parsed) == 3 and len(footer_cache.FOOTERS) == 3
    parsed.clear()
    again = open_dataset(path)
    assert parsed == [] and again.num_rows == first.num_rows == 30
    part = next(f.path for f in first.files if pq.read_table(f.path)["id"][0].as_py() == 10)  # the second append's
    pq.write_table(pa.table({"id": np.arange(100, 115)}, schema=pq.read_schema(part)), part)  # another size
    os.utime(part, ns=(1, 1))  # and another time
    changed = open_dataset(path)
    assert parsed == [part]
    ids = sorted(changed.read_row_group(i, ["id"])["id"].to_pylist()[0] for i in range(len(changed.row_groups)))
    assert ids == [0, 20, 100] and changed.num_rows == 35


def test_the_footer_cache_is_bounded_by_bytes_least_recently_used_out(tmp_path: Path) -> None:
    from unihub.store import footer_cache

    paths = []
    for k in range(4):
        paths.append(str(tmp_path / f"f{k}.parquet"))
        pq.write_table(pa.table({"x": np.arange(10)}), paths[-1])
    footers = [pq.read_metadata(p) for p in paths]
    cache = footer_cache.FooterCache(limit=int(footers[0].serialized_size * 2.5))
    keys = [footer_cache.stat_key(p) for p in paths]
    cache.put(keys[0], footers[0])
    cache.put(keys[1], footers[1])
    assert cache.get(keys[0]) is footers[0]  # 0 used last: 1 goes first
    cache.put(keys[2], footers[2])
    assert len(cache) == 2 and cache.get(keys[1]) is None and cache.get(keys[0]) is footers[0]
    assert footer_cache.key_of(paths[0], 10, None) is None and cache.get(None) is None  # no time: not kept
    assert cache.get((paths[3], keys[3][1], keys[3][2] + 1)) is None  # another time: another file


def test_a_process_forked_while_the_footer_cache_is_locked_can_use_it() -> None:
    """A reader thread may hold the footer cache's lock at the moment torch forks its workers: the child gets a
    lock of its own (else its first open would wait forever)."""
    import os
    import time

    from unihub.store import footer_cache

    with footer_cache.FOOTERS._lock:
        child = os.fork()
        if child == 0:
            footer_cache.FOOTERS.get(("/nowhere", 1, 1))
            os._exit(0)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(child, 9)
        os.waitpid(child, 0)
        pytest.fail("the forked child waited on its parent's lock")
    assert os.waitstatus_to_exitcode(done[1]) == 0
