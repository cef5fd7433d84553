"""Shuffled loaders decode images after the shuffle (readers/late_decode.py): the same batches as
decoding in the reader, bit for bit, the same resume, corrupt images reported where they are, and
the reader handed back decoding as before."""

from __future__ import annotations

import contextlib
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from unihub import (
    CompressedImageCodec,
    ScalarCodec,
    TensorCodec,
    Unischema,
    UnischemaField,
    make_batch_reader,
    make_reader,
    write_dataset,
)
from unihub.errors import CodecError
from unihub.readers import late_decode
from unihub.readers.loader import SOURCE_ROW
from unihub.readers.predicates import in_lambda
from unihub.readers.transform import TransformSpec
from unihub.store.dataset import open_dataset

torch = pytest.importorskip("torch")
from unihub.bridges.torch import BatchedDataLoader, DataLoader  # noqa: E402

N = 700
Images = Unischema("Images", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("photo", np.uint8, (16, 16, 3), CompressedImageCodec("jpeg", 90), False),
    UnischemaField("mask", np.uint8, (None, None), CompressedImageCodec("png"), True),
    UnischemaField("vec", np.float32, (3,), TensorCodec(), False),
])


def image_rows(corrupt: int | None = None):
    rng = np.random.default_rng(0)
    for i in range(N):
        side = 4 + i % 5
        mask = None if i % 7 == 3 else rng.integers(0, 255, (side, side + 1), dtype=np.uint8)
        photo: Any = rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)
        if i == corrupt:
            photo = b"\xff\xd8\xff\xe0" + b"not a jpeg" * 8
        yield {"id": i, "photo": photo, "mask": mask, "vec": np.full(3, i, np.float32)}


@pytest.fixture(autouse=True)
def cut_small_batches_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loaders cut batches from encoded rows however small their images (by default only from
    :data:`late_decode.CUT_MIN_BATCH_BYTES` of decoded images a batch): these tests' images are small."""
    monkeypatch.setattr(late_decode, "CUT_MIN_BATCH_BYTES", 0)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("late") / "ds"
    write_dataset(path, Images, image_rows(), row_group_size_mb=0.05, rows_per_file=300)
    assert len(open_dataset(path).row_groups) >= 8, "the tests need rows from many row groups in a queue"
    return path


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows decoded after a shuffle (a test that expects late decoding checks it happened)."""
    seen: list[int] = []
    original = late_decode.LateImages.decode

    def counting(self: Any, columns: Any, *into: Any) -> Any:
        seen.append(len(columns[SOURCE_ROW]))
        return original(self, columns, *into)

    monkeypatch.setattr(late_decode.LateImages, "decode", counting)
    return seen


def batches_of(loader: Any) -> list[dict[str, Any]]:
    with loader:
        return list(loader)


def assert_same_value(a: Any, b: Any, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert a.numpy().tobytes() == b.numpy().tobytes(), where  # bit for bit: NaN equals NaN, -0.0 is not 0.0
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            assert_same_value(x, y, f"{where}[{k}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, where
        assert a.tobytes() == b.tobytes(), where
    else:
        assert type(a) is type(b) and (a == b or (a is None and b is None)), where


def assert_same_batches(eager: list[dict[str, Any]], late: list[dict[str, Any]]) -> None:
    assert len(eager) == len(late)
    for i, (a, b) in enumerate(zip(eager, late)):
        assert list(a) == list(b), f"batch {i}: the same fields in the same order"
        for name in a:
            assert_same_value(a[name], b[name], f"batch {i}, {name}")


def loader_batches(dataset: Path, late: bool, monkeypatch: pytest.MonkeyPatch, *, rows: bool = False,
                   loader_options: dict[str, Any] | None = None, **reader_options: Any) -> list[dict[str, Any]]:
    kind = DataLoader if rows else BatchedDataLoader
    monkeypatch.setattr(kind, "_late_decoding", late)
    reader = (make_reader if rows else make_batch_reader)(dataset, seed=3, workers_count=2, **reader_options)
    options = dict(batch_size=32, shuffling_queue_capacity=200, seed=9) | (loader_options or {})
    return batches_of(kind(reader, **options))


CASES = [
    pytest.param({}, {}, id="defaults"),
    pytest.param(dict(shuffle_rows=True, shuffle_row_groups=True), {}, id="shuffled-rows"),
    pytest.param(dict(cur_shard=1, shard_count=3, shard_by="row", num_epochs=2), {}, id="row-shard-2-epochs"),
    pytest.param(dict(predicate=in_lambda(["id"], lambda id: id % 3 != 0)), {}, id="predicate"),
    pytest.param(dict(petastorm_types=True), {}, id="petastorm-types"),
    pytest.param(dict(schema_fields=["id", "photo"], reader_pool_type="process"), {}, id="process-pool"),
    pytest.param({}, dict(variable="pad", batch_size=50, shuffling_queue_capacity=64), id="pad-small-queue"),
]


@pytest.mark.parametrize("rows", [False, True], ids=["BatchedDataLoader", "DataLoader"])
@pytest.mark.parametrize("reader_options, loader_options", CASES)
def test_decoding_after_the_shuffle_gives_the_same_batches(dataset, monkeypatch, decodes, rows, reader_options,
                                                          loader_options) -> None:
    if rows and "variable" in loader_options:
        loader_options = {k: v for k, v in loader_options.items() if k != "variable"}
    eager = loader_batches(dataset, False, monkeypatch, rows=rows, loader_options=loader_options, **reader_options)
    assert not decodes
    late = loader_batches(dataset, True, monkeypatch, rows=rows, loader_options=loader_options, **reader_options)
    assert sum(decodes) == sum(len(b["id"]) for b in late), "every row's images were decoded after the shuffle"
    assert_same_batches(eager, late)
    ids = torch.cat([b["id"] for b in late]).tolist()
    assert len(ids) == len(set(ids)) or reader_options.get("num_epochs") == 2
    assert all(SOURCE_ROW not in b for b in late)


def test_the_images_match_what_was_written(dataset, decodes) -> None:
    written = {row["id"]: row for row in image_rows()}
    with make_batch_reader(dataset, seed=1) as reader:
        batches = list(BatchedDataLoader(reader, batch_size=64, shuffling_queue_capacity=300, seed=2))
    assert decodes
    seen = 0
    for batch in batches:
        for k, i in enumerate(batch["id"].tolist()):
            assert batch["photo"][k].shape == (16, 16, 3)  # lossy JPEG: decoded as the reader decodes it
            mask = batch["mask"][k]
            expected = written[i]["mask"]
            assert (mask is None) if expected is None else np.array_equal(mask.numpy(), expected)
            seen += 1
    assert seen == N


def test_no_late_decoding_where_the_reader_must_decode(dataset, decodes, monkeypatch) -> None:
    # a transform sees decoded images; decode_images=False hands out bytes
    spec = TransformSpec(lambda frame: frame, selected_fields=["id", "photo"])
    with make_batch_reader(dataset, transform_spec=spec) as reader:
        batches = list(BatchedDataLoader(reader, batch_size=40, shuffling_queue_capacity=100))
    assert batches[0]["photo"].shape[1:] == (16, 16, 3)
    with make_reader(dataset, decode_images=False, schema_fields=["id", "photo"]) as reader:
        batches = list(DataLoader(reader, batch_size=40, shuffling_queue_capacity=100))
    assert isinstance(batches[0]["photo"][0], bytes)
    assert not decodes


def test_the_reader_decodes_again_after_the_loader(dataset, decodes) -> None:
    with make_batch_reader(dataset, schema_fields=["id", "photo"], num_epochs=None) as reader:
        loader = BatchedDataLoader(reader, batch_size=16, shuffling_queue_capacity=100, seed=0)
        iterator = iter(loader)
        for _ in range(5):
            next(iterator)
        iterator.close()  # an early break
        assert decodes
        batch = next(reader)
        assert batch._fields == ("id", "photo")
        assert batch.photo.dtype == np.uint8 and batch.photo.shape[1:] == (16, 16, 3)
    assert not [t for t in threading.enumerate() if t.name.startswith("unihub-decode")], "decode threads stopped"


def test_a_reader_part_read_before_the_loader_delivers_the_rest_once(dataset, decodes) -> None:
    with make_reader(dataset, shuffle_row_groups=False) as reader:
        first = [int(next(reader).id) for _ in range(45)]
        loader = DataLoader(reader, batch_size=20, shuffling_queue_capacity=100, seed=1)
        rest = [i for batch in loader for i in batch["id"].tolist()]
        assert decodes
    assert first == list(range(45))
    assert sorted(rest) == list(range(45, N))


@pytest.mark.parametrize("closed_first", [False, True], ids=["state-then-close", "loop-broken-then-state"])
@pytest.mark.parametrize("rows", [False, True], ids=["BatchedDataLoader", "DataLoader"])
def test_resume_delivers_exactly_the_rest(dataset, decodes, rows, closed_first) -> None:
    make, kind = (make_reader, DataLoader) if rows else (make_batch_reader, BatchedDataLoader)
    with make(dataset, seed=5, workers_count=2) as reader:
        loader = kind(reader, batch_size=25, shuffling_queue_capacity=150, seed=4)
        iterator = iter(loader)
        before = [next(iterator) for _ in range(9)]
        if closed_first:  # as `for batch in loader: ... break` does: batches were still decoding
            iterator.close()
        state = loader.state_dict()
        iterator.close()
    assert decodes
    with make(dataset, seed=5, workers_count=2) as reader:
        loader = kind(reader, batch_size=25, shuffling_queue_capacity=150, seed=4)
        loader.load_state_dict(state)
        after = list(loader)
    ids = [i for b in before + after for i in b["id"].tolist()]
    assert sorted(ids) == list(range(N)), "every row exactly once"
    written = {row["id"]: row for row in image_rows()}
    for batch in after:
        for k, i in enumerate(batch["id"].tolist()):
            expected = written[i]["mask"]
            mask = batch["mask"][k]
            assert (mask is None) if expected is None else np.array_equal(mask.numpy(), expected)


CORRUPT = 321


@pytest.fixture(scope="module")
def corrupt_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("late-corrupt") / "ds"
    write_dataset(path, Images, image_rows(corrupt=CORRUPT), row_group_size_mb=0.05, rows_per_file=300)
    return path


@pytest.mark.parametrize("rows", [False, True], ids=["BatchedDataLoader", "DataLoader"])
def test_a_corrupt_image_is_reported_with_its_file_and_row(corrupt_dataset, decodes, rows) -> None:
    store = open_dataset(corrupt_dataset)
    info, local = store.row_group_of(CORRUPT)
    make, kind = (make_reader, DataLoader) if rows else (make_batch_reader, BatchedDataLoader)
    with make(corrupt_dataset, seed=2) as reader:
        with pytest.raises(CodecError) as caught:
            for _ in kind(reader, batch_size=30, shuffling_queue_capacity=400, seed=0):
                pass
    assert decodes, "the error came from decoding after the shuffle"
    error = caught.value
    message = str(error)
    assert error.field == "photo" and error.row == local, message
    assert Path(info.path).name in message and f"row group {info.row_group}" in message, message
    assert re.search(rf"\brow {local}\b", message) and f"row {CORRUPT} of the dataset" in message, message
    assert not [t for t in threading.enumerate() if t.name.startswith("unihub-decode")]


def test_make_tf_dataset_shuffled_gives_the_same_batches(dataset, decodes, monkeypatch) -> None:
    pytest.importorskip("tensorflow")
    from unihub.bridges.tf import dataset as tf_bridge

    def batches(late: bool) -> list[dict[str, Any]]:
        monkeypatch.setattr(tf_bridge, "LATE_DECODING", late)
        ds = tf_bridge.make_tf_dataset(dataset, batch_size=32, shuffle_buffer=150, seed=6,
                                       schema_fields=["id", "photo", "vec"])
        return [{k: v.numpy() for k, v in b.items()} for b in ds]

    eager = batches(False)
    assert not decodes
    late = batches(True)
    assert sum(decodes) == N
    assert_same_batches(eager, late)
    assert sorted(i for b in late for i in b["id"].tolist()) == list(range(N))


def test_fields_whose_names_are_not_identifiers(tmp_path, monkeypatch, decodes) -> None:
    # rows are namedtuples with attribute names made from the field names; the encoded rows carry one
    # more field, and must be made the same way
    odd = Unischema("Odd", [UnischemaField("row id", np.int64, (), ScalarCodec(pa.int64()), False),
                            UnischemaField("cam/left", np.uint8, (8, 8, 3), CompressedImageCodec("png"), False)])
    write_dataset(tmp_path / "ds", odd, ({"row id": i, "cam/left": np.full((8, 8, 3), i % 251, np.uint8)}
                                         for i in range(300)), row_group_size_mb=0.01)
    for rows in (False, True):
        eager = loader_batches(tmp_path / "ds", False, monkeypatch, rows=rows)
        late = loader_batches(tmp_path / "ds", True, monkeypatch, rows=rows)
        assert_same_batches(eager, late)
        assert list(late[0]) == ["row id", "cam/left"]
        assert all(bool((b["cam/left"][k] == i % 251).all()) for b in late for k, i in enumerate(b["row id"].tolist()))
    assert sum(decodes) == 600


@pytest.mark.parametrize("taken_first", [False, True], ids=["seek", "seek-then-next"])
@pytest.mark.parametrize("rows", [False, True], ids=["BatchedDataLoader", "DataLoader"])
def test_a_reader_that_sought_delivers_from_there(dataset, decodes, rows, taken_first) -> None:
    # CachedDataset.stream(start_offset) hands loaders a reader positioned by seek()
    make, kind = (make_reader, DataLoader) if rows else (make_batch_reader, BatchedDataLoader)
    with make(dataset, shuffle_row_groups=False) as reader:
        reader.seek(250)
        first: list[int] = []
        if taken_first:
            item = next(reader)
            first = [int(item.id)] if rows else item.id.tolist()
        rest = [i for b in kind(reader, batch_size=20, shuffling_queue_capacity=64, seed=0) for i in b["id"].tolist()]
    assert decodes
    assert sorted(first + rest) == list(range(250, N))


PETASTORM = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm" / "unischema"


@pytest.mark.parametrize("rows", [False, True], ids=["BatchedDataLoader", "DataLoader"])
def test_a_dataset_petastorm_wrote(monkeypatch, decodes, rows) -> None:
    # Petastorm's own files: PNG and OpenCV-written JPEG fields, a gray image, nullable floats as NaN
    # (Petastorm's types), ndarrays: the same batches whether decoded before or after the shuffle
    eager = loader_batches(PETASTORM, False, monkeypatch, rows=rows, loader_options=dict(batch_size=7,
                                                                                           shuffling_queue_capacity=20))
    late = loader_batches(PETASTORM, True, monkeypatch, rows=rows, loader_options=dict(batch_size=7,
                                                                                         shuffling_queue_capacity=20))
    assert_same_batches(eager, late)
    assert sum(decodes) == 60 and sorted(i for b in late for i in b["id"].tolist()) == list(range(60))
    assert {"image_png", "image_jpeg", "gray"} <= set(late[0])


def test_make_tf_dataset_over_a_dataset_petastorm_wrote(monkeypatch, decodes) -> None:
    pytest.importorskip("tensorflow")
    from unihub.bridges.tf import dataset as tf_bridge

    def batches(late: bool) -> list[dict[str, Any]]:
        monkeypatch.setattr(tf_bridge, "LATE_DECODING", late)
        ds = tf_bridge.make_tf_dataset(PETASTORM, batch_size=8, shuffle_buffer=25, seed=3,
                                       schema_fields=["id", "score", "image_png", "image_jpeg", "gray"])
        return [{k: v.numpy() for k, v in b.items()} for b in ds]

    eager = batches(False)
    late = batches(True)
    assert_same_batches(eager, late)
    assert sum(decodes) == 60


def test_queued_images_are_views_of_the_file_or_their_own_bytes(dataset) -> None:
    """A shuffling queue holds encoded images as the reader read them: views of the memory-mapped
    file (no copy; held, they pin only the file's pages) where the pages allow it, else each value's
    own bytes (holding a few rows does not keep their row group's copy alive). Neither is an object
    the garbage collector tracks: a queue of memoryviews set off full collections (every object of
    the process walked, ~0.2 s with TensorFlow imported) once per ~80,000 rows."""
    import gc

    import pyarrow.parquet as pq

    store = open_dataset(dataset)
    with make_batch_reader(dataset, shuffle_row_groups=False, workers_count=1) as reader:
        with reader.images_decoded_later() as late:
            assert late is not None and {f.name for f in late.fields} == {"photo", "mask"}
            batches = list(reader)
    seen = {"photo": set(), "mask": set()}
    for batch in batches:
        rows = getattr(batch, SOURCE_ROW)
        info = next(i for i in store.row_groups if i.first_row <= rows[0] < i.first_row + i.num_rows)
        stored = pq.ParquetFile(info.path).read_row_group(info.row_group, columns=["photo", "mask"])
        for name in seen:
            values = getattr(batch, name)
            assert values.dtype == object and values.shape == rows.shape
            seen[name] |= {type(v).__name__ for v in values if v is not None}
            assert not any(gc.is_tracked(v) for v in values)
            assert all(not v.flags.owndata and not v.flags.writeable for v in values if isinstance(v, np.ndarray))
            expected = stored.column(name).take(pa.array(rows - info.first_row)).to_pylist()
            assert [None if v is None else bytes(v) for v in values] == expected
    # the JPEGs are plain pages without nulls: views; the PNG masks have nulls, which pyarrow reads
    assert seen == {"photo": {"ndarray"}, "mask": {"bytes"}}


@pytest.fixture(scope="module")
def cut_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Row groups of ~230 rows, which readers cut into decode tasks (with DECODE_TASK_BYTES lowered)."""
    path = tmp_path_factory.mktemp("late-cut") / "ds"
    write_dataset(path, Images, image_rows(), row_group_size_mb=0.2)
    assert len(open_dataset(path).row_groups) >= 3
    return path


@pytest.mark.parametrize("options", [dict(shuffle_row_groups=False), dict(seed=2, shuffle_rows=True),
                                     dict(seed=2, cur_shard=1, shard_count=2, shard_by="row")],
                         ids=["in-order", "shuffled-rows", "row-shard"])
def test_a_reader_decoding_later_reads_a_row_group_once_and_keeps_its_positions(cut_dataset, monkeypatch,
                                                                                options) -> None:
    """Its images decoded later, a reader reads a row group's decode tasks as one (they are cut for
    decoding, which no longer happens in them), and every position it gives (state_dict after each
    row) is the one the reader decoding itself gives: a state saved either way resumes either way."""
    from unihub.readers import loader as loader_module
    from unihub.readers import reader as reader_module

    monkeypatch.setattr(reader_module, "DECODE_TASK_BYTES", 60 * 2**10)  # tasks of 64 rows or so
    calls: list[int] = []
    original = loader_module.RowGroupLoader.__call__
    monkeypatch.setattr(loader_module.RowGroupLoader, "__call__",
                        lambda self, job: calls.append(job[2].num_rows) or original(self, job))

    def positions(late: bool) -> tuple[list[int], list[dict[str, Any]]]:
        with make_reader(cut_dataset, workers_count=2, **options) as reader:
            with reader.images_decoded_later() if late else contextlib.nullcontext():
                ids, states = [], [reader.state_dict()]
                for row in reader:
                    ids.append(int(row.id))
                    states.append(reader.state_dict())
        return ids, states

    eager_ids, eager_states = positions(False)
    tasks = len(calls)
    calls.clear()
    late_ids, late_states = positions(True)
    groups = len(open_dataset(cut_dataset).row_groups)
    assert tasks > groups + 2, "the dataset's row groups were cut into decode tasks"
    assert len(calls) <= groups + 2  # a row group once (a row shard may end part-way through two)
    assert late_ids == eager_ids
    assert [(s["epoch"], s["task"], s["offset"]) for s in late_states] == \
        [(s["epoch"], s["task"], s["offset"]) for s in eager_states]
    for k in (1, 70, len(late_ids) // 2, len(late_ids) - 1):  # a late state resumes an eager reader exactly
        with make_reader(cut_dataset, workers_count=2, **options) as reader:
            reader.load_state_dict(late_states[k])
            assert [int(r.id) for r in reader] == eager_ids[k:]


def test_a_batch_reader_decoding_later_delivers_the_same_batches_at_the_same_positions(cut_dataset,
                                                                                      monkeypatch) -> None:
    """Its row groups read as one task, a batch reader still delivers a batch per task of the plan
    (a shuffling queue then fills as it would), each followed by the decoding reader's position."""
    from unihub.readers import loader as loader_module
    from unihub.readers import reader as reader_module

    monkeypatch.setattr(reader_module, "DECODE_TASK_BYTES", 60 * 2**10)
    calls: list[int] = []
    original = loader_module.RowGroupLoader.__call__
    monkeypatch.setattr(loader_module.RowGroupLoader, "__call__",
                        lambda self, job: calls.append(1) or original(self, job))
    with make_batch_reader(cut_dataset, seed=4, shuffle_rows=True) as reader:
        eager = [(b.id.tolist(), reader.state_dict()) for b in reader]
    tasks = len(calls)
    calls.clear()
    with make_batch_reader(cut_dataset, seed=4, shuffle_rows=True) as reader:
        with reader.images_decoded_later():
            late = [(b.id.tolist(), reader.state_dict()) for b in reader]
    assert len(calls) < tasks / 2
    assert late == eager
    with make_batch_reader(cut_dataset, seed=4, shuffle_rows=True) as reader:  # seek() into a merged row group
        reader.seek(70)
        with reader.images_decoded_later():
            after_seek = [b.id.tolist() for b in reader]
    flat = [i for ids, _ in eager for i in ids]
    assert [i for ids in after_seek for i in ids] == flat[70:]



@pytest.mark.parametrize("stop_after", [1, 100, 231])
def test_leaving_late_decoding_part_way_through_a_merged_row_group_delivers_the_rest_once(cut_dataset, monkeypatch,
                                                                                      stop_after) -> None:
    from unihub.readers import reader as reader_module

    monkeypatch.setattr(reader_module, "DECODE_TASK_BYTES", 60 * 2**10)
    with make_reader(cut_dataset, shuffle_row_groups=False, seed=6, shuffle_rows=True) as reader:
        expected = [int(r.id) for r in reader]
    with make_reader(cut_dataset, shuffle_row_groups=False, seed=6, shuffle_rows=True) as reader:
        with reader.images_decoded_later():
            first = [int(next(reader).id) for _ in range(stop_after)]
        rest = [r for r in reader]
    assert first + [int(r.id) for r in rest] == expected
    assert isinstance(rest[0].photo, np.ndarray) and rest[0].photo.shape == (16, 16, 3)  # decoded again


@pytest.mark.parametrize("rows", [False, True], ids=["BatchedDataLoader", "DataLoader"])
@pytest.mark.parametrize("options", [dict(shuffle_rows=True), dict(shuffle_row_groups=False)],
                         ids=["shuffled-rows", "in-order"])
def test_row_groups_read_as_one_task_give_the_same_batches(cut_dataset, monkeypatch, decodes, rows, options) -> None:
    """A late-decoding reader reads a row group's tasks as one, but hands its rows to the loader task by
    task (a batch reader's batches, a row reader's columns): the shuffling queue fills as it does when the
    reader decodes, so the batches are the same, bit for bit."""
    from unihub.readers import loader as loader_module
    from unihub.readers import reader as reader_module

    monkeypatch.setattr(reader_module, "DECODE_TASK_BYTES", 60 * 2**10)
    calls: list[int] = []
    original = loader_module.RowGroupLoader.__call__
    monkeypatch.setattr(loader_module.RowGroupLoader, "__call__",
                        lambda self, job: calls.append(1) or original(self, job))
    loader_options = dict(batch_size=16, shuffling_queue_capacity=150)
    eager = loader_batches(cut_dataset, False, monkeypatch, rows=rows, loader_options=loader_options, **options)
    eager_tasks = len(calls)
    calls.clear()
    late = loader_batches(cut_dataset, True, monkeypatch, rows=rows, loader_options=loader_options, **options)
    assert len(calls) < eager_tasks / 2 and decodes  # read as merged tasks, decoded after the shuffle
    assert_same_batches(eager, late)


def test_make_tf_dataset_over_row_groups_read_as_one_task(cut_dataset, monkeypatch, decodes) -> None:
    pytest.importorskip("tensorflow")
    from unihub.bridges.tf import dataset as tf_bridge
    from unihub.readers import reader as reader_module

    monkeypatch.setattr(reader_module, "DECODE_TASK_BYTES", 60 * 2**10)

    def batches(late: bool) -> list[dict[str, Any]]:
        monkeypatch.setattr(tf_bridge, "LATE_DECODING", late)
        ds = tf_bridge.make_tf_dataset(cut_dataset, batch_size=16, shuffle_buffer=150, seed=3,
                                       schema_fields=["id", "photo", "vec"])
        return [{k: v.numpy() for k, v in b.items()} for b in ds]

    assert_same_batches(batches(False), batches(True))
    assert decodes


@pytest.mark.parametrize("batched", [False, True])
def test_a_state_with_rows_to_pass_over_resumes_exactly_through_merged_row_groups(cut_dataset, monkeypatch,
                                                                                  batched) -> None:
    """A resumed state's rows to pass over (``skip``/``exclude``) are dropped from batches that stand for
    several tasks of the plan (a row group read as one, images decoded later): the rest once, in order, a
    state saved part-way resuming exactly."""
    from unihub.readers import reader as reader_module

    monkeypatch.setattr(reader_module, "DECODE_TASK_BYTES", 60 * 2**10)  # tasks of 64 rows or so
    make = make_batch_reader if batched else make_reader
    options = dict(seed=2, shuffle_rows=True, workers_count=2, schema_fields=["id", "photo"])

    def ids(item: Any) -> list[int]:
        return [int(i) for i in item.id] if batched else [int(item.id)]

    with make(cut_dataset, **options) as reader:
        fresh = [i for item in reader for i in ids(item)]
        assert len(fresh) == N
    with make(cut_dataset, **options) as reader:
        head = len(ids(next(reader)))
        state = dict(reader.state_dict(), skip=3, exclude=[0, 60, 61, 62, 200, 201, 500])
    gone = {head + x for x in [0, 1, 2, 3, 63, 64, 65, 203, 204, 503]}
    expected = [row for at, row in enumerate(fresh) if at >= head and at not in gone]
    with make(cut_dataset, resume_from=state, **options) as reader:
        with reader.images_decoded_later():
            if batched:
                got, states = [], []
                for item in reader:
                    got += ids(item)
                    states.append((len(got), reader.state_dict()))
            else:
                got, states = [], []
                while (columns := reader.next_columns(1000)) is not None:
                    got += [int(i) for i in columns["id"]]
                    states.append((len(got), reader.state_dict()))
    assert got == expected
    for taken, saved in states[:: max(1, len(states) // 5)]:
        with make(cut_dataset, resume_from=saved, **options) as reader:
            assert [i for item in reader for i in ids(item)] == expected[taken:]


# -- unshuffled loaders: batches cut from encoded rows, each decoded straight into its own memory ------------
IN_ORDER_CASES = [
    pytest.param({}, {}, id="defaults"),
    pytest.param(dict(shuffle_row_groups=False), dict(batch_size=64), id="in-file-order"),
    pytest.param(dict(shuffle_rows=True, shuffle_row_groups=True), {}, id="shuffled-rows"),
    pytest.param(dict(cur_shard=1, shard_count=3, shard_by="row", num_epochs=2), {}, id="row-shard-2-epochs"),
    pytest.param(dict(predicate=in_lambda(["id"], lambda id: id % 3 != 0)), {}, id="predicate"),
    pytest.param(dict(petastorm_types=True), {}, id="petastorm-types"),
    pytest.param(dict(schema_fields=["id", "photo"], reader_pool_type="process"), {}, id="process-pool"),
    pytest.param({}, dict(variable="pad", batch_size=50), id="pad"),
]


@pytest.mark.parametrize("rows", [False, True], ids=["BatchedDataLoader", "DataLoader"])
@pytest.mark.parametrize("reader_options, loader_options", IN_ORDER_CASES)
def test_unshuffled_batches_decoded_late_are_the_readers_bit_for_bit(dataset, monkeypatch, decodes, rows,
                                                                    reader_options, loader_options) -> None:
    """Unshuffled, a batch across two reader batches (row groups of ~50 rows here, batches of 32-64) is
    decoded into its own memory instead of concatenated from two decoded ones: the same batches, in the
    same order, every one of ``batch_size`` rows but the last."""
    if rows and "variable" in loader_options:
        loader_options = {k: v for k, v in loader_options.items() if k != "variable"}
    loader_options = dict(loader_options, shuffling_queue_capacity=0)
    eager = loader_batches(dataset, False, monkeypatch, rows=rows, loader_options=loader_options, **reader_options)
    assert not decodes
    late = loader_batches(dataset, True, monkeypatch, rows=rows, loader_options=loader_options, **reader_options)
    assert sum(decodes) == sum(len(b["id"]) for b in late), "every row's images were decoded in the loader"
    assert_same_batches(eager, late)
    size = loader_options.get("batch_size", 32)
    assert all(len(b["id"]) == size for b in late[:-1]) and 0 < len(late[-1]["id"]) <= size
    assert all(SOURCE_ROW not in b for b in late)


@pytest.mark.parametrize("closed_first", [False, True], ids=["state-then-close", "loop-broken-then-state"])
@pytest.mark.parametrize("rows", [False, True], ids=["BatchedDataLoader", "DataLoader"])
def test_unshuffled_resume_is_exact_across_a_batch_of_two_reader_batches(dataset, monkeypatch, decodes, rows,
                                                                         closed_first) -> None:
    """A state saved after any batch (batches decoding ahead of it, and rows held for the next one,
    are not delivered) resumes the rest exactly: in order, each row once, the same batches."""
    make, kind = (make_reader, DataLoader) if rows else (make_batch_reader, BatchedDataLoader)
    first_rows = [info.first_row for info in open_dataset(dataset).row_groups]

    def loader(reader: Any) -> Any:
        return kind(reader, batch_size=40)

    with make(dataset, shuffle_row_groups=False, workers_count=2) as reader:
        whole = [b["id"].tolist() for b in loader(reader)]
    assert [i for b in whole for i in b] == list(range(N))
    # batches across a row group's end: every cut below follows one or comes just before one
    across = [k for k, b in enumerate(whole) if any(b[0] < r <= b[-1] for r in first_rows)]
    assert len(across) > len(whole) // 2
    for cut in (1, across[0] + 1, across[1], across[len(across) // 2] + 1, len(whole) - 1):
        with make(dataset, shuffle_row_groups=False, workers_count=2) as reader:
            run = loader(reader)
            iterator = iter(run)
            before = [next(iterator)["id"].tolist() for _ in range(cut)]
            if closed_first:  # as `for batch in loader: ... break` does: batches were still decoding
                iterator.close()
            state = run.state_dict()
            iterator.close()
        with make(dataset, shuffle_row_groups=False, workers_count=2) as reader:
            run = loader(reader)
            run.load_state_dict(state)
            after = [b["id"].tolist() for b in run]
        assert before == whole[:cut], cut
        assert [i for b in before + after for i in b] == list(range(N)), f"the rest exactly once, in order ({cut})"
    assert decodes


def test_unshuffled_states_are_the_decoding_readers_where_both_hold_the_same_rows(dataset, monkeypatch) -> None:
    """A state of the late-decoding loader resumes a loader whose reader decodes, and the other way round."""
    def run(late: bool, cut: int, state: dict[str, Any] | None = None) -> tuple[list[int], dict[str, Any]]:
        monkeypatch.setattr(BatchedDataLoader, "_late_decoding", late)
        with make_batch_reader(dataset, shuffle_row_groups=False) as reader:
            loader = BatchedDataLoader(reader, batch_size=45)
            if state is not None:
                loader.load_state_dict(state)
            iterator = iter(loader)
            got = [i for _, b in zip(range(cut), iterator) for i in b["id"].tolist()]
            saved = loader.state_dict()
            iterator.close()
        return got, saved

    for late in (False, True):
        got, state = run(late, 5)
        rest, _ = run(not late, 10**6, state)
        assert got + rest == list(range(N))


def test_unshuffled_with_rows_skipped_for_corrupt_images_decodes_in_the_reader(corrupt_dataset, decodes) -> None:
    """``on_decode_error='skip'`` drops a row in the reader, before the batches are cut: decoding in the
    loader would leave that batch a row short, so the reader decodes (every batch of ``batch_size``)."""
    with make_batch_reader(corrupt_dataset, shuffle_row_groups=False, on_decode_error="skip") as reader:
        with pytest.warns(UserWarning):
            batches = list(BatchedDataLoader(reader, batch_size=32))
    assert not decodes
    ids = [i for b in batches for i in b["id"].tolist()]
    assert ids == [i for i in range(N) if i != CORRUPT]
    assert all(len(b["id"]) == 32 for b in batches[:-1])


def test_a_torch_worker_decodes_unshuffled_images_into_the_storage_its_batch_leaves_in(dataset, monkeypatch) -> None:
    """In a torch worker (its pool of shared storages), a batch's images are decoded into the storage its
    other numeric columns are moved to: one storage, no copy of the pixels on the way out."""
    from unihub.bridges.torch import base, tensors
    from unihub.bridges.torch.shared_batches import StoragePool

    copied: list[int] = []
    original = tensors.copy_into
    monkeypatch.setattr(base, "copy_into", lambda t, s: copied.append(s.nbytes) or original(t, s))
    monkeypatch.setattr(tensors, "copy_into", lambda t, s: copied.append(s.nbytes) or original(t, s))
    eager = loader_batches(dataset, False, monkeypatch, loader_options=dict(shuffling_queue_capacity=0),
                           schema_fields=["id", "photo", "vec"])
    monkeypatch.setattr(BatchedDataLoader, "_late_decoding", True)
    with make_batch_reader(dataset, seed=3, workers_count=2, schema_fields=["id", "photo", "vec"]) as reader:
        loader = BatchedDataLoader(reader, batch_size=32)
        loader._shared_batches = StoragePool()
        late = [{name: column.clone() for name, column in batch.items()} if k % 3 else batch
                for k, batch in enumerate(loader)]
    assert_same_batches(eager, late)
    for batch in late[::3]:
        storages = {column.untyped_storage().data_ptr() for column in batch.values()}
        assert len(storages) == 1 and batch["photo"].is_shared()
    photo = 16 * 16 * 3
    assert copied and max(copied) < photo, "no batch's images were copied, only its ids and vectors"


def tf_cut_batches_match_the_readers(dataset: Any, decodes: list[int], monkeypatch: pytest.MonkeyPatch,
                                     options: dict[str, Any]) -> list[dict[str, Any]]:
    """make_tf_dataset's batches with ``options``, cut from encoded rows and decoded whole (each batch once,
    ``decodes`` counting the rows of each decode), bit for bit those of the reader decoding; returns them."""
    pytest.importorskip("tensorflow")
    from unihub.bridges.tf import dataset as tf_bridge

    def batches(late: bool) -> list[dict[str, Any]]:
        monkeypatch.setattr(tf_bridge, "LATE_DECODING", late)
        ds = tf_bridge.make_tf_dataset(dataset, **options)
        return [{k: v.to_list() if hasattr(v, "to_list") else v.numpy()  # a ragged field as lists
                 for k, v in (b._asdict() if hasattr(b, "_asdict") else b).items()} for b in ds]

    eager = batches(False)
    assert not decodes
    late = batches(True)
    size = options["batch_size"]
    rows = N // size * size if options.get("drop_remainder") else N
    assert sum(decodes) == rows, "each batch decoded whole, once"
    assert set(decodes[:-1]) == {size}
    assert_same_batches(eager, late)
    return late


@pytest.mark.parametrize("options", [dict(), dict(drop_remainder=True, batch_size=50),
                                     dict(shuffle_row_groups=False, schema_fields=["id", "photo", "vec"]),
                                     dict(structure="namedtuple", petastorm_types=True, schema_fields=["id", "photo", "vec"])],
                         ids=["defaults", "drop-remainder", "in-file-order-dense", "namedtuple-petastorm-types"])
def test_make_tf_dataset_unshuffled_decodes_each_cut_batch(dataset, decodes, monkeypatch, options) -> None:
    """Unshuffled, make_tf_dataset cuts its batches from encoded images and decodes each into its own
    memory (no batch of two reader batches copied, in TensorFlow or numpy): the same batches, bit for bit."""
    options = dict(dict(batch_size=32, seed=6), **options)
    late = tf_cut_batches_match_the_readers(dataset, decodes, monkeypatch, options)
    if options.get("shuffle_row_groups") is False:
        assert [i for b in late for i in b["id"].tolist()] == list(range(N))


def test_make_tf_dataset_unshuffled_skipping_corrupt_images_decodes_in_the_reader(corrupt_dataset, decodes) -> None:
    """With ``on_decode_error='skip'`` the reader decodes (a row dropped after the cut would leave a batch short)."""
    pytest.importorskip("tensorflow")
    from unihub.bridges.tf.dataset import make_tf_dataset

    with pytest.warns(UserWarning):
        ds = make_tf_dataset(corrupt_dataset, batch_size=32, shuffle_row_groups=False, on_decode_error="skip",
                             schema_fields=["id", "photo"])
        ids = [b["id"].numpy().tolist() for b in ds]
    assert not decodes
    assert [i for b in ids for i in b] == [i for i in range(N) if i != CORRUPT]
    assert all(len(b) == 32 for b in ids[:-1])


@pytest.mark.parametrize("shuffle", [0, 100], ids=["unshuffled", "shuffled"])
@pytest.mark.parametrize("hold", [True, False], ids=["batches-held", "batches-dropped"])
def test_make_tf_dataset_reuses_an_images_room_only_once_nothing_views_it(dataset, monkeypatch, hold,
                                                                          shuffle) -> None:
    """Large image batches are decoded into recycled memory (TensorFlow leaves glibc mapping new pages for
    each), shuffled or not: a batch the program still holds keeps its values, however far the epoch goes;
    dropped, its memory serves a later batch."""
    pytest.importorskip("tensorflow")
    from unihub.bridges.tf import dataset as tf_bridge
    from unihub.bridges.tf import sources

    def batches(late: bool) -> list[Any]:
        monkeypatch.setattr(tf_bridge, "LATE_DECODING", late)
        ds = tf_bridge.make_tf_dataset(dataset, batch_size=32, shuffle_row_groups=False, shuffle_buffer=shuffle,
                                       seed=4, schema_fields=["id", "photo", "vec"])
        return [b if hold or not late else {k: v.numpy().copy() for k, v in b.items()} for b in ds]

    eager = [{k: v.numpy() for k, v in b.items()} for b in batches(False)]
    monkeypatch.setattr(sources, "OVERSIZE_BYTES", 1)  # this dataset's batches are small: every one recycled
    pieces: list[int] = []
    original = sources.RecycledRoom.array
    monkeypatch.setattr(sources.RecycledRoom, "array",
                        lambda self, *a: (lambda out: pieces.append(out.base.ctypes.data) or out)(original(self, *a)))
    late = batches(True)
    assert_same_batches(eager, [{k: np.asarray(v) for k, v in b.items()} for b in late])
    assert len(pieces) == len(late)
    if hold:
        assert len(set(pieces)) == len(pieces), "no memory of a batch held was given to another"
    else:
        # how many batches TensorFlow holds ahead varies with the machine's load: some memory served twice
        assert len(set(pieces)) < len(pieces), "the memory of dropped batches was reused"


@pytest.mark.parametrize("options", [dict(), dict(drop_remainder=True, batch_size=50),
                                     dict(shuffle_buffer=1000, schema_fields=["id", "photo", "vec"]),
                                     dict(structure="namedtuple", petastorm_types=True, schema_fields=["id", "photo", "vec"])],
                         ids=["defaults", "drop-remainder", "buffer-over-the-epoch", "namedtuple-petastorm-types"])
def test_make_tf_dataset_shuffled_decodes_each_cut_batch_after_the_buffers_draw(dataset, decodes, monkeypatch,
                                                                                options) -> None:
    """Shuffled, make_tf_dataset cuts its batches from the shuffle buffer's encoded draws and decodes each
    into its own memory (was: each draw decoded in pieces, then TensorFlow's rebatch copying the batches):
    the same rows in the same batches, bit for bit, as the reader decoding them before the shuffle."""
    options = dict(dict(batch_size=32, seed=6, shuffle_buffer=100), **options)
    late = tf_cut_batches_match_the_readers(dataset, decodes, monkeypatch, options)
    rows = N // options["batch_size"] * options["batch_size"] if options.get("drop_remainder") else N
    ids = [i for b in late for i in b["id"].tolist()]
    assert ids != sorted(ids) and len(set(ids)) == len(ids) == rows


def test_make_tf_dataset_shuffled_skipping_corrupt_images_drops_the_row_before_the_cut(corrupt_dataset,
                                                                                      decodes) -> None:
    """With ``on_decode_error='skip'`` a shuffled dataset decodes each draw before the batches are cut, as
    before: the corrupt row is dropped and every batch but the last is full."""
    pytest.importorskip("tensorflow")
    from unihub.bridges.tf.dataset import make_tf_dataset

    with pytest.warns(UserWarning):
        ds = make_tf_dataset(corrupt_dataset, batch_size=32, shuffle_buffer=100, seed=2, on_decode_error="skip",
                             schema_fields=["id", "photo"])
        ids = [b["id"].numpy().tolist() for b in ds]
    assert sum(decodes) == N, "decoded after the shuffle, in the shuffle buffer's draws"
    assert sorted(i for b in ids for i in b) == [i for i in range(N) if i != CORRUPT]
    assert all(len(b) == 32 for b in ids[:-1])


@pytest.mark.parametrize("cut", [1, 6, 19])
def test_make_tf_dataset_shuffled_resume_through_a_position_is_exact(dataset, decodes, cut) -> None:
    """A ReaderPosition of a shuffled dataset whose batches are decoded after the cut (TensorFlow
    prefetching decoded batches ahead): the model's first batches as a whole run's, and the rest after the
    resume every other row once (the buffer's rows read again)."""
    pytest.importorskip("tensorflow")
    from unihub.bridges.tf.checkpoint import ReaderPosition
    from unihub.bridges.tf.dataset import make_tf_dataset

    def run(batches: int | None, state: dict[str, Any] | None = None) -> tuple[list[list[int]], dict[str, Any]]:
        with make_batch_reader(dataset, shuffle_row_groups=False, workers_count=2) as reader:
            position = ReaderPosition(reader)
            if state is not None:
                position.load_state_dict(state)
            ds = position.track(make_tf_dataset(reader, batch_size=32, shuffle_buffer=90, seed=3, prefetch=4))
            iterator = iter(ds)
            got = [b["id"].numpy().tolist() for _, b in zip(range(batches if batches is not None else 10**6),
                                                                iterator)]
            return got, position.state_dict()

    whole, _ = run(None)
    assert sum(decodes) == N and decodes.count(32) == len(whole) - 1, "each batch decoded whole, after the cut"
    head, state = run(cut)
    assert head == whole[:cut]
    rest, _ = run(None, state)
    assert sorted(i for b in head + rest for i in b) == list(range(N))


def test_small_images_are_decoded_by_the_reader_and_big_ones_after_the_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    from unihub.schema.codecs import CompressedImageCodec
    from unihub.schema.unischema import UnischemaField

    monkeypatch.undo()
    image = UnischemaField("image", np.uint8, (64, 64, 3), CompressedImageCodec("jpeg"), False)
    big = UnischemaField("image", np.uint8, (256, 256, 3), CompressedImageCodec("jpeg"), False)
    ragged = UnischemaField("image", np.uint8, (None, None, 3), CompressedImageCodec("png"), False)
    label = UnischemaField("label", np.int64, (), None, False)
    assert not late_decode.cut_pays([image, label], 64)       # 0.8 MiB a batch: the reader decodes
    assert late_decode.cut_pays([big, label], 64)             # 12 MiB a batch
    assert late_decode.cut_pays([ragged], 64)                 # sizes unknown
    assert not late_decode.cut_pays([label], 64) and not late_decode.cut_pays([big], None)
    assert not late_decode.cut_pays([ragged], None)  # no batches to cut


def test_the_loaders_and_make_tf_dataset_cut_only_batches_the_gate_lets_through(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Unshuffled, with fixed-size images under CUT_MIN_BATCH_BYTES a batch, the reader decodes (no late decode);
    with the gate lowered the same loaders cut and decode each batch after: the same batches either way."""
    from unihub.bridges.tf import dataset as tf_bridge

    photos = Unischema("Photos", [Images.fields["id"], Images.fields["photo"]])
    path = tmp_path / "photos"
    write_dataset(path, photos, ({"id": r["id"], "photo": r["photo"]} for r in image_rows()), row_group_size_mb=0.05)
    seen: list[int] = []
    original = late_decode.LateImages.decode
    monkeypatch.setattr(late_decode.LateImages, "decode",
                        lambda self, columns, *into: (seen.append(1), original(self, columns, *into))[1])

    def runs() -> tuple[list[list[int]], list[list[int]]]:
        with make_batch_reader(path, shuffle_row_groups=False, workers_count=1) as reader:
            torch_ids = [b["id"].tolist() for b in BatchedDataLoader(reader, batch_size=32)]
        tf_ids = [b["id"].numpy().tolist() for b in tf_bridge.make_tf_dataset(str(path), batch_size=32, shuffle_row_groups=False,
                                                                     workers_count=1)]
        return torch_ids, tf_ids

    monkeypatch.setattr(late_decode, "CUT_MIN_BATCH_BYTES", 4 * 2**20)  # the default: 32 16x16 photos are 24 KiB
    gated = runs()
    assert not seen, "small fixed-size images: the reader decodes"
    monkeypatch.setattr(late_decode, "CUT_MIN_BATCH_BYTES", 0)
    cut = runs()
    assert seen, "past the gate: batches cut encoded and decoded after"
    assert gated == cut and [i for b in cut[0] for i in b] == list(range(N))


# -- where the drawn batches decode: the reader's threads, then DecodeAhead's own ------------------------
def test_drawn_batches_decode_on_the_readers_worker_threads(dataset, monkeypatch) -> None:
    """A thread pool reader's workers decode the drawn batches too (fewer threads switching than a pool of
    each); the queue's last draws, after its rows ended and its pool stopped, decode on threads of their own."""
    threads: list[str] = []
    original = late_decode.LateImages.decode

    def noting(self: Any, columns: Any, *into: Any) -> Any:
        threads.append(threading.current_thread().name)
        return original(self, columns, *into)

    monkeypatch.setattr(late_decode.LateImages, "decode", noting)
    with make_batch_reader(dataset, workers_count=2, seed=3) as reader:
        batches = list(BatchedDataLoader(reader, batch_size=16, shuffling_queue_capacity=64, seed=3))
    assert sum(len(b["id"]) for b in batches) == N
    assert {name.rsplit("_", 1)[0] for name in threads} == {"unihub-worker", "unihub-decode"}, threads


class _Decodes:
    """A stand-in for LateImages: doubles ``x``, noting the thread; the reader's pool until it is stopped."""

    def __init__(self, reader_pool: Any) -> None:
        self.threads = 2
        self.pool, self.stopped, self.names = reader_pool, False, []

    def reader_threads(self) -> Any:
        return None if self.stopped else self.pool

    def decode(self, columns: Any, into: Any = None) -> Any:
        self.names.append(threading.current_thread().name)
        return {"x": columns["x"] * 2}


def test_batches_the_readers_stopped_pool_cancelled_decode_on_threads_of_their_own() -> None:
    from concurrent.futures import ThreadPoolExecutor

    gate = threading.Event()
    reader_pool = ThreadPoolExecutor(1, thread_name_prefix="reader")
    reader_pool.submit(gate.wait)  # its one thread busy: the batches queued there wait
    late = _Decodes(reader_pool)
    with late_decode.DecodeAhead(late) as decoder:  # type: ignore[arg-type]
        for key in range(3):
            decoder.submit(key, {"x": np.array([key])})
        reader_pool.shutdown(wait=False, cancel_futures=True)  # the reader's rows ended: its queue cancelled
        late.stopped = True
        decoder.submit(3, {"x": np.array([3])})
        gate.set()
        done = list(decoder.drain())
    assert [(key, columns["x"].tolist()) for key, columns in done] == [(k, [2 * k]) for k in range(4)]
    assert len(late.names) == 4 and all(name.startswith("unihub-decode") for name in late.names)


def test_closing_with_batches_the_readers_stopped_pool_cancelled_returns() -> None:
    """close() waits for running decodes only: one cancelled in a queue no thread takes again is never
    'notified', and concurrent.futures.wait would wait for it for ever (make_tf_dataset's resume hung)."""
    from concurrent.futures import ThreadPoolExecutor

    gate = threading.Event()
    reader_pool = ThreadPoolExecutor(1)
    reader_pool.submit(gate.wait)
    decoder = late_decode.DecodeAhead(_Decodes(reader_pool))  # type: ignore[arg-type]
    decoder.submit(0, {"x": np.array([0])})
    reader_pool.shutdown(wait=False, cancel_futures=True)
    closing = threading.Thread(target=decoder.close, daemon=True)
    closing.start()
    closing.join(60)
    gate.set()
    assert not closing.is_alive(), "close() waited for a decode no thread will run"
