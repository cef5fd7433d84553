"""Random access by global row index: ``Dataset(url).take([...])``, ``ds[i]``, ``len(ds)``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unihub import (
    open_dataset,
    write_dataset,
)
from unihub.readers.random_access import Dataset
from unihub.readers.reader import make_reader

from .sample import sample_schema

N = 90
SCHEMA = sample_schema("RandomAccess", image_shape=(6, 5, 3))


def make_row(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(1000 + i)
    return {
        "id": i,
        "name": f"r{i}",
        "score": None if i % 4 == 1 else float(np.float32(i * 1.5)),
        "vec": rng.random(3, dtype=np.float32),
        "boxes": rng.random((i % 4, 4), dtype=np.float32),
        "emb": rng.standard_normal(2),
        "image": rng.integers(0, 256, (6, 5, 3), dtype=np.uint8),
    }


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("random_access") / "ds"
    write_dataset(path, SCHEMA, (make_row(i) for i in range(N)), row_group_size_mb=0.002, rows_per_file=25)
    store = open_dataset(path)
    assert len(store.row_groups) >= 15 and len(store.files) == 4
    return path


@pytest.fixture(scope="module")
def reader_rows(dataset) -> list[Any]:
    """Every row as make_reader delivers it, in dataset order."""
    with make_reader(dataset, shuffle_row_groups=False) as reader:
        rows = list(reader)
    assert [int(r.id) for r in rows] == list(range(N))
    return rows


def assert_same(found: Any, expected: Any, where: str) -> None:
    if expected is None:
        assert found is None, where
    elif isinstance(expected, np.ndarray):
        assert isinstance(found, np.ndarray), where
        assert found.dtype == expected.dtype and found.shape == expected.shape, where
        assert found.tobytes() == expected.tobytes(), where
    else:
        if type(expected) is np.str_ and type(found) is str:  # a batch's string; a row's is np.str_ (decode.py)
            found = np.str_(found)
        assert type(found) is type(expected) and found == expected, f"{where}: {found!r} != {expected!r}"


def column_item(batch: Any, name: str, k: int) -> Any:
    return getattr(batch, name)[k]


INDEX_LISTS = [
    [0],
    [N - 1, 0],
    [5, 4, 3, 2, 1, 0],
    [17, 17, 3, 17, 3],  # duplicates
    [-1, -N, -2, 10],  # negative indices
    [88, 1, 45, 24, 25, 26, 50, 0, 75, 74],  # across files and row-group boundaries
    list(range(N))[::-1],
]


@pytest.mark.parametrize("indices", INDEX_LISTS)
def test_take_returns_requested_rows_in_order(dataset, reader_rows, indices):
    ds = Dataset(dataset)
    batch = ds.take(indices)
    assert batch._fields == tuple(SCHEMA.fields)
    wanted = [i % N for i in indices]
    assert batch.id.tolist() == wanted
    for k, i in enumerate(wanted):
        for name in SCHEMA.fields:
            assert_same(column_item(batch, name, k), getattr(reader_rows[i], name), f"take[{k}] = row {i}.{name}")


def test_take_accepts_numpy_indices(dataset):
    ds = Dataset(dataset)
    indices = np.array([30, 2, 2, 61], dtype=np.int32)
    assert ds.take(indices).id.tolist() == [30, 2, 2, 61]


def test_fixed_shape_columns_come_back_stacked(dataset):
    batch = Dataset(dataset).take([3, 60, 9])
    assert batch.vec.shape == (3, 3) and batch.vec.dtype == np.float32
    assert batch.image.shape == (3, 6, 5, 3) and batch.image.dtype == np.uint8
    assert batch.emb.shape == (3, 2)


def test_getitem_and_len(dataset, reader_rows):
    ds = Dataset(dataset)
    assert len(ds) == N
    for i in (0, 1, 24, 25, 44, N - 1, -1, -N):
        row = ds[i]
        assert row._fields == tuple(SCHEMA.fields)
        expected = reader_rows[i % N]
        for name in SCHEMA.fields:
            assert_same(getattr(row, name), getattr(expected, name), f"ds[{i}].{name}")


@pytest.mark.parametrize("bad", [[N], [0, N + 5], [-N - 1], [10**9], np.array([2**64 - 1], np.uint64),
                                 np.array([0, 2**63], np.uint64)])
def test_out_of_range_is_an_index_error(dataset, bad):
    """(uint64 indices past int64 wrapped to negative ones: 2**64 - 1 read the last row.)"""
    ds = Dataset(dataset)
    with pytest.raises(IndexError, match=str(N)):
        ds.take(bad)
    with pytest.raises(IndexError):
        ds[bad[-1]]


@pytest.mark.parametrize("bad", [-N - 1, -N - 7])
def test_a_negative_index_out_of_range_is_named_as_given(dataset, bad):
    """The message named the index after counting it from the end (``-N - 1`` as ``-1``, a row that exists)."""
    with pytest.raises(IndexError, match=rf"^row index {bad} is out of range for a dataset of {N} rows$"):
        Dataset(dataset).take([0, bad])


@pytest.mark.parametrize("bad", [[1.5], [0, 2.0], [True, False], ["3"]])
def test_non_integer_indices_are_refused(dataset, bad):
    with pytest.raises(TypeError, match="integers"):
        Dataset(dataset).take(bad)


def test_schema_fields_and_decode_images(dataset, reader_rows):
    ds = Dataset(dataset, schema_fields=["id", "image"], decode_images=False)
    assert tuple(ds.schema.fields) == ("id", "image")
    batch = ds.take([7, 2])
    assert batch._fields == ("id", "image")
    assert batch.id.tolist() == [7, 2]
    assert all(isinstance(b, bytes) and b.startswith(b"\x89PNG") for b in batch.image)
    decoded = Dataset(dataset, schema_fields=["im.*"]).take([7])
    assert decoded._fields == ("image",)
    assert np.array_equal(decoded.image[0], reader_rows[7].image)


def test_neighbouring_lookups_reuse_row_groups(dataset, reader_rows):
    ds = Dataset(dataset, cached_row_groups=2)
    for i in list(range(0, N, 3)) + list(range(N - 1, 0, -7)):
        assert int(ds[i].id) == i
        assert_same(ds[i].boxes, reader_rows[i].boxes, f"row {i}")


def test_empty_take(dataset):
    """Columns of no rows are shaped as those of rows: (0, *shape) for a fixed shape (they were all (0,))."""
    ds = Dataset(dataset)
    empty, some = ds.take([]), ds.take([0, 1])
    for name in SCHEMA.fields:
        full, none = getattr(some, name), getattr(empty, name)
        assert len(none) == 0, name
        if full.dtype != object:  # (an object column: nulls among these rows, or ragged ones)
            assert none.dtype == full.dtype and none.shape[1:] == full.shape[1:], name
    encoded = Dataset(dataset, decode_images=False).take([])
    assert encoded.image.shape == (0,) and encoded.image.dtype == object


def test_the_row_group_cache_is_bounded_in_bytes(dataset, monkeypatch):
    """A sampler's random indices read each row group once while the groups fit in ``cache_mb``,
    however small they are; a tight ``cache_mb`` keeps only the last group, 0 groups keep none."""
    from unihub.store.dataset import ParquetStore

    reads: list[int] = []
    original = ParquetStore.read_row_group
    monkeypatch.setattr(ParquetStore, "read_row_group",
                        lambda self, group, columns=None, **kw: reads.append(group) or original(self, group, columns,
                                                                                                **kw))
    ds = Dataset(dataset)
    groups = len(ds.store.row_groups)
    assert groups > 4  # more than the old count-bounded cache held
    order = np.random.default_rng(0).permutation(N)
    for start in range(0, N, 16):
        assert ds.take(order[start:start + 16]).id.tolist() == order[start:start + 16].tolist()
    assert sorted(reads) == list(range(groups))  # each once
    reads.clear()
    tight = Dataset(dataset, cache_mb=1e-6)
    tight.take([0]), tight.take([0]), tight.take([N - 1]), tight.take([N - 1]), tight.take([0])
    assert reads == [0, groups - 1, 0]  # the last group read stays, nothing more
    reads.clear()
    none = Dataset(dataset, cached_row_groups=0)
    none.take([0]), none.take([0])
    assert reads == [0, 0]


@pytest.mark.parametrize("options, words", [(dict(cache_mb=-1), "cache_mb"), (dict(cached_row_groups=-1), "cached_row_groups")])
def test_bad_cache_bounds_are_refused(dataset, options, words):
    from unihub.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match=words):
        Dataset(dataset, **options)


def test_files_that_store_a_column_differently_are_taken_from(tmp_path) -> None:
    # plain Parquet whose files disagree on a column's type: the rows of several row groups cannot be
    # joined before decoding, so each group is decoded on its own (the values and dtype are the reader's)
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name, ids, arrow_type in (("a", range(0, 10), pa.int32()), ("b", range(10, 20), pa.int64())):
        pq.write_table(pa.table({"id": pa.array(ids, arrow_type), "x": pa.array([i / 2 for i in ids])}),
                       tmp_path / f"{name}.parquet", row_group_size=4)
    wanted = [15, 2, 11, 3, 19, 0, 15]
    batch = Dataset(tmp_path).take(wanted)
    with make_reader(tmp_path, shuffle_row_groups=False) as reader:
        rows = {int(r.id): r for r in reader}
    assert batch.id.tolist() == wanted and batch.id.dtype == rows[0].id.dtype
    assert batch.x.tolist() == [i / 2 for i in wanted]


def test_binary_cells_at_rows_are_the_taken_values_without_a_copy() -> None:
    import pyarrow as pa

    from unihub.schema.codecs import BinaryCells, binary_views, column_as_array

    values = [b"a", None, b"", b"xyz" * 10, b"\xff\x00", None, b"last"]
    for kind in (pa.binary(), pa.large_binary()):
        array = pa.array(values, kind)
        for column, cells in ((array, values), (array.slice(2, 4), values[2:6]),
                              (pa.chunked_array([array]), values),
                              (pa.chunked_array([array.slice(0, 3), array.slice(3)]), values)):
            rows = np.array([len(cells) - 1, 0, 1, 1, len(cells) // 2], dtype=np.int64)
            got = [None if v is None else bytes(v) for v in BinaryCells(column).at(rows)]
            taken = binary_views(column_as_array(column.take(pa.array(rows))))
            assert got == [None if v is None else bytes(v) for v in taken] == [cells[r] for r in rows]
            whole = binary_views(column_as_array(column))  # every value, in order
            assert [None if v is None else bytes(v) for v in whole] == cells
    assert BinaryCells(pa.array(["s", None])).at(np.array([1, 0])) == [None, "s"]  # not binary: its values


def test_take_of_nullable_and_corrupt_images(tmp_path) -> None:
    import pyarrow as pa

    from unihub import CompressedImageCodec, ScalarCodec, Unischema, UnischemaField
    from unihub.errors import CodecError

    schema = Unischema("Images", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                  UnischemaField("image", np.uint8, (4, 3, 3), CompressedImageCodec("png"), True)])
    rng = np.random.default_rng(7)
    images = [None if i % 3 == 1 else rng.integers(0, 256, (4, 3, 3), dtype=np.uint8) for i in range(30)]
    write_dataset(tmp_path / "ds", schema, ({"id": i, "image": images[i]} for i in range(30)),
                  row_group_size_mb=0.0005, rows_per_file=10)
    ds = Dataset(tmp_path / "ds")
    asked = [29, 1, 0, 13, 13, 22, 4]
    batch = ds.take(asked)
    with make_reader(tmp_path / "ds", shuffle_row_groups=False) as reader:
        rows = {int(r.id): r.image for r in reader}
    for k, i in enumerate(asked):
        assert_same(batch.image[k], rows[i], f"row {i}")
        assert (batch.image[k] is None) == (images[i] is None)
    write_dataset(tmp_path / "bad", schema, ({"id": i, "image": b"\x89PNG\r\n\x1a\n" + b"junk" * 5 if i == 12 else
                                              images[i]} for i in range(30)), row_group_size_mb=0.0005)
    for into in (None, {"image": np.zeros((3, 4, 3, 3), np.uint8)}):  # decoded into memory given too
        with pytest.raises(CodecError) as caught:
            Dataset(tmp_path / "bad").take([3, 12, 5], into=into)
        # the row counted in its row group, as the readers count it, and the dataset's row in the message
        assert caught.value.field == "image" and "(row 12 of the dataset)" in str(caught.value)
        store = open_dataset(tmp_path / "bad")
        group = next(g for g in store.row_groups if g.first_row <= 12 < g.first_row + g.num_rows)
        assert caught.value.row == 12 - group.first_row


@pytest.mark.parametrize("petastorm_types", [False, True])
def test_columns_gathered_without_arrows_take_are_what_its_take_gives(tmp_path, petastorm_types) -> None:
    """Fixed-width columns are gathered from the row groups' buffers by numpy; a column with nulls in
    a group touched, or of another type in another file, is taken by Arrow as before. Either way the
    values and dtypes are what decoding Arrow's take of the whole dataset gives."""
    import datetime
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    from unihub.readers.decode import DecodePolicy, decode_column

    def table(first: int, count: int, small_type: pa.DataType) -> pa.Table:
        ids = list(range(first, first + count))
        return pa.table({
            "id": pa.array(ids, pa.int64()),
            "small": pa.array([i % 100 for i in ids], small_type),
            "half": pa.array(np.array(ids, np.float16) / 8),
            "when": pa.array([datetime.datetime(2020, 1, 1) + datetime.timedelta(hours=i) for i in ids], pa.timestamp("ms")),
            "code": pa.array([i.to_bytes(3, "big") for i in ids], pa.binary(3)),
            "price": pa.array([decimal.Decimal(i) / 4 for i in ids], pa.decimal128(9, 2)),
            "maybe": pa.array([None if i == 3 else i for i in ids], pa.int32()),  # a null in the first group only
            "pair": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(2 * first, 2 * (first + count), dtype=np.float32)), 2),
        })

    pq.write_table(table(0, 24, pa.int16()), tmp_path / "a.parquet", row_group_size=8)
    pq.write_table(table(24, 16, pa.int16()), tmp_path / "b.parquet", row_group_size=8)
    pq.write_table(table(40, 8, pa.int32()), tmp_path / "c.parquet", row_group_size=8)  # "small" stored wider
    ds = Dataset(tmp_path, petastorm_types=petastorm_types)
    whole = pa.concat_tables([pq.read_table(tmp_path / f"{name}.parquet") for name in "abc"], promote_options="permissive")
    policy = DecodePolicy.for_store(ds.store.schema_source, petastorm_types, batched=True)
    rng = np.random.default_rng(5)
    for indices in ([0, 5, 7], [9, 30, 12, 9], [41, 2, 47, 10], list(rng.permutation(48)), list(rng.integers(8, 48, 30))):
        batch = ds.take(indices)
        taken = whole.take(pa.array(indices))
        for f in ds.schema:
            expected = decode_column(f, taken.column(f.name), policy=policy)
            found = getattr(batch, f.name)
            assert found.dtype == expected.dtype and found.shape == expected.shape, (f.name, indices)
            same = found.tolist() == expected.tolist() if found.dtype == object else found.tobytes() == expected.tobytes()
            assert same, (f.name, indices)  # bytes: NaN for a null in Petastorm's types


def test_take_into_arrays_given(dataset, reader_rows) -> None:
    """Columns go into the arrays ``into`` names where those have the column's shape and dtype (a torch
    worker's shared memory); the others are new memory, and the arrays given for them are left alone."""
    ds = Dataset(dataset)
    asked = [88, 3, 45, 3, 60]
    plain = ds.take(asked)
    into = {"id": np.full(5, -1, np.int64), "image": np.zeros((5, 6, 5, 3), np.uint8),
            "vec": np.full((5, 3), 7, np.float32), "emb": np.full((5, 3), 7.0)}  # emb: the wrong shape
    batch = ds.take(asked, into=into)
    assert batch.id is into["id"] and batch.image is into["image"] and batch.vec is into["vec"]
    assert batch.emb is not into["emb"] and (into["emb"] == 7.0).all()
    for name in plain._fields:
        for k in range(len(asked)):
            assert_same(column_item(batch, name, k), column_item(plain, name, k), f"{name}[{k}]")
    read_only = np.zeros(5, np.int64)
    read_only.flags.writeable = False
    assert ds.take(asked, into={"id": read_only}).id is not read_only


def test_take_into_is_refused_for_arrays_that_overlap_and_keeps_the_pixel_limit(dataset, monkeypatch) -> None:
    from unihub.errors import ImageDecodeError, InvalidArgumentError
    from unihub.images import decoders as images

    ds = Dataset(dataset, schema_fields=["id", "vec", "emb", "image"])
    shared = np.zeros((2, 4))
    with pytest.raises(InvalidArgumentError, match="'vec' and 'emb' share memory"):
        ds.take([1, 2], into={"vec": shared.view(np.float32)[:, :3], "emb": shared[:, 2:]})
    one = np.zeros(64, np.uint8)  # one buffer, apart: as a torch worker's pool storage is cut
    into = {"id": one[:16].view(np.int64), "emb": one[32:64].view(np.float64).reshape(2, 2)}
    batch = ds.take([1, 2], into=into)
    assert batch.id is into["id"] and batch.emb is into["emb"] and batch.id.tolist() == [1, 2]
    monkeypatch.setattr(images, "MAX_IMAGE_PIXELS", 20)  # the images are 6x5
    for into in (None, {"image": np.zeros((2, 6, 5, 3), np.uint8)}):
        with pytest.raises(ImageDecodeError, match="more than the limit of 20"):
            ds.take([1, 2], into=into)


def test_a_take_over_the_whole_cached_dataset_is_what_the_row_groups_give(tmp_path) -> None:
    """Once every row group is cached, a take gathers each field over the whole dataset at once
    (images as views of the cached bytes, fixed-width cells copied together): the same values,
    dtypes and decoding into given arrays as taking group by group; a dataset with a field it cannot
    gather, or whose fixed-width cells are above a quarter of the cache, is taken group by group."""
    import pyarrow as pa

    from unihub import CompressedImageCodec, ScalarCodec, TensorCodec, Unischema, UnischemaField

    schema = Unischema("Whole", [
        UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("jpeg", np.uint8, (8, 6, 3), CompressedImageCodec("jpeg", 90), False),
        UnischemaField("png", np.uint8, (5, 7), CompressedImageCodec("png"), False),
        UnischemaField("vec", np.float32, (3,), TensorCodec(), False),
        UnischemaField("half", np.float16, (), ScalarCodec(pa.float16()), False),
    ])
    rng = np.random.default_rng(11)
    rows = [{"id": i, "jpeg": rng.integers(0, 256, (8, 6, 3), dtype=np.uint8),
             "png": rng.integers(0, 256, (5, 7), dtype=np.uint8), "vec": rng.random(3, dtype=np.float32),
             "half": np.float16(i / 8)} for i in range(60)]
    write_dataset(tmp_path / "ds", schema, iter(rows), row_group_size_mb=0.002, rows_per_file=25)
    whole, by_group = Dataset(tmp_path / "ds"), Dataset(tmp_path / "ds", cached_row_groups=2)
    assert len(whole.store.row_groups) >= 6
    whole.take(list(range(60)))  # every row group read and cached: the next take gathers over them all
    whole.take([0])
    assert whole._whole is not None and set(whole._whole.images) == {"jpeg", "png"}
    for indices in ([0], [59, 0, 31], [7, 7, 40, 7, -1, -60], list(rng.permutation(60)), list(rng.integers(0, 60, 90))):
        found, expected = whole.take(indices), by_group.take(indices)
        for f in schema:
            a, b = getattr(found, f.name), getattr(expected, f.name)
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), (f.name, indices)
        into = {"jpeg": np.zeros((len(indices), 8, 6, 3), np.uint8), "vec": np.zeros((len(indices), 3), np.float32)}
        given = whole.take(indices, into=into)
        assert given.jpeg is into["jpeg"] and given.vec is into["vec"]
        assert into["jpeg"].tobytes() == expected.jpeg.tobytes() and into["vec"].tobytes() == expected.vec.tobytes()
    assert by_group._whole is None

    fields = ["id", "vec", "half"]
    roomy = Dataset(tmp_path / "ds", schema_fields=fields)
    roomy.take(list(range(60)))
    held, cells = roomy._cached_bytes, 60 * (8 + 12 + 2)
    assert held < 4 * cells  # so a cache that just holds it has less than 4x its cells
    tight = Dataset(tmp_path / "ds", schema_fields=fields, cache_mb=(held + 1) / 2**20)
    tight.take(list(range(60)))
    tight.take([0])
    assert len(tight._cache) == len(tight.store.row_groups) and tight._whole is None and tight._whole_refused
    encoded = Dataset(tmp_path / "ds", decode_images=False)  # encoded images are not gathered this way
    encoded.take(list(range(60)))
    encoded.take([0])
    assert encoded._whole is None and encoded._whole_refused
    assert encoded.take([3, 50]).jpeg.tolist() == by_group_bytes(tmp_path / "ds", [3, 50])


def by_group_bytes(path: Path, indices: list[int]) -> list[bytes]:
    return list(Dataset(path, decode_images=False, cached_row_groups=1).take(indices).jpeg)


@pytest.mark.parametrize("petastorm_types", [False, True])
def test_the_whole_cached_dataset_of_files_petastorm_wrote(petastorm_types) -> None:
    """Petastorm's own files (snappy pages, OpenCV's JPEGs, a gray PNG): gathered over the whole cached
    dataset where every field allows it, and the same values and dtypes as group by group."""
    path = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm" / "unischema"
    fields = ["id", "label", "image_png", "image_jpeg", "gray"]
    whole = Dataset(path, schema_fields=fields, petastorm_types=petastorm_types)
    by_group = Dataset(path, schema_fields=fields, petastorm_types=petastorm_types, cached_row_groups=1)
    whole.take(list(range(len(whole))))
    indices = list(np.random.default_rng(0).integers(0, len(whole), 50)) + [-1, 0]
    found, expected = whole.take(indices), by_group.take(indices)
    assert whole._whole is not None and set(whole._whole.images) == {"image_png", "image_jpeg", "gray"}
    for name in fields:
        a, b = getattr(found, name), getattr(expected, name)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name


def test_the_row_group_cache_defaults_to_the_memory_budget(dataset, monkeypatch):
    """``cache_mb=None`` (the default) is the memory budget, ``UNIHUB_MEMORY_MB``: a tiny budget keeps
    only the last group read, the default (512 MB) the whole dataset. A random sampler over a dataset
    above the old fixed 128 MB read a whole row group for most rows it asked for."""
    from unihub.runtime.memory import ENV, memory_budget
    from unihub.store.dataset import ParquetStore

    reads: list[int] = []
    original = ParquetStore.read_row_group
    monkeypatch.setattr(ParquetStore, "read_row_group",
                        lambda self, group, columns=None, **kw: reads.append(group) or original(self, group, columns,
                                                                                                **kw))
    monkeypatch.delenv(ENV, raising=False)
    assert Dataset(dataset)._cache_bytes == memory_budget().total_bytes == 512 * 2**20
    monkeypatch.setenv(ENV, "0.000001")
    tight = Dataset(dataset)
    tight.take([0]), tight.take([0]), tight.take([N - 1]), tight.take([0])
    assert reads == [0, len(tight.store.row_groups) - 1, 0]  # the last group read stays, nothing more
