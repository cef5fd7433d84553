"""Big row groups of images are cut into decode tasks: the same rows in the same order, each row
group read once, and both workers busy from the first batch."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from unihub import (
    CompressedImageCodec,
    ScalarCodec,
    Unischema,
    UnischemaField,
    make_batch_reader,
    make_reader,
    write_dataset,
)
from unihub.readers.reader import decode_task_rows
from unihub.store.dataset import ParquetStore

N = 600
Images = Unischema("Images", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("image", np.uint8, (16, 16, 3), CompressedImageCodec("png"), False),
])


@pytest.fixture(scope="module")
def one_big_group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    rows = ({"id": i, "image": rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)} for i in range(N))
    path = tmp_path_factory.mktemp("tasks") / "ds"
    write_dataset(path, Images, rows, row_group_size_mb=64)  # every row in one row group
    return path


def test_task_rows_follow_the_decoded_image_size() -> None:
    assert decode_task_rows(list(Images.fields.values()), decode_images=False) is None
    assert decode_task_rows([Images.id], decode_images=True) is None
    assert decode_task_rows(list(Images.fields.values()), decode_images=True) == 2048  # 768 B images: the cap
    frames = UnischemaField("frame", np.uint8, (1200, 1920, 3), CompressedImageCodec("jpeg"), False)
    assert decode_task_rows([frames], decode_images=True) == 64  # 6.9 MB frames: the floor
    thumbs = UnischemaField("thumb", np.uint8, (64, 64, 3), CompressedImageCodec("jpeg"), False)
    assert decode_task_rows([thumbs], decode_images=True) == 341  # 4 MiB of pixels


@pytest.mark.parametrize("options", [dict(shuffle_row_groups=False), dict(shuffle_rows=True, seed=4),
                                     dict(shuffle_rows=True, seed=4, cur_shard=1, shard_count=2, shard_by="row")])
def test_cut_tasks_deliver_the_same_rows_in_the_same_order_reading_the_group_once(one_big_group, options,
                                                                                   monkeypatch) -> None:
    with make_reader(one_big_group, decode_images=False, **options) as reader:
        expected = [int(r.id) for r in reader]  # no decoding: one task per row group
    with make_reader(one_big_group, decode_images=False) as reader:
        images = {int(r.id): r.image for r in reader}
    reads = []
    original = ParquetStore.read_row_group
    monkeypatch.setattr(ParquetStore, "read_row_group",
                        lambda self, group, columns=None, **kw: reads.append(group) or original(self, group, columns,
                                                                                                **kw))
    monkeypatch.setattr("unihub.readers.reader.DECODE_TASK_BYTES", 64 * 768)  # 64-row tasks
    with make_reader(one_big_group, workers_count=2, **options) as reader:
        rows = list(reader)
    assert [int(r.id) for r in rows] == expected
    assert reads == [0]  # ten tasks, one read
    from unihub.images.decoders import decode_image

    for row in rows[::97]:
        np.testing.assert_array_equal(row.image, decode_image(images[int(row.id)]))
    with make_batch_reader(one_big_group, workers_count=2, **options) as reader:
        batches = [b.id.tolist() for b in reader]
    assert list(itertools.chain.from_iterable(batches)) == expected
    # tasks of 60 rows (ten, five in a shard), the first ramped up as 8 + 16 + 32 + 4 rows (FIRST_TASK_SHARE)
    assert [len(b) for b in batches] == [8, 16, 32, 4] + [60] * (len(expected) // 60 - 1)


def test_the_first_batch_waits_for_a_few_images_not_a_whole_task(one_big_group, monkeypatch) -> None:
    """An epoch's first task is a share of a task (then twice that, ...): the first rows come after
    decoding a few images; states saved inside the ramp resume exactly."""
    from unihub.readers.reader import FIRST_TASK_SHARE

    monkeypatch.setattr("unihub.readers.reader.DECODE_TASK_BYTES", 64 * 768)  # 64-row tasks
    decoded: list[int] = []
    import unihub.schema.codecs as codecs

    original = codecs.CompressedImageCodec.decode_column
    monkeypatch.setattr(codecs.CompressedImageCodec, "decode_column",
                        lambda self, field, column, **kw: decoded.append(len(column)) or original(self, field, column,
                                                                                                  **kw))
    with make_batch_reader(one_big_group, workers_count=1, num_epochs=2) as reader:
        first = next(reader)
        assert len(first.id) == 64 // FIRST_TASK_SHARE == decoded[0]
        state = reader.state_dict()
        rest = [int(i) for b in reader for i in b.id]
    assert len(rest) == 2 * N - len(first.id)
    with make_batch_reader(one_big_group, workers_count=1, num_epochs=2) as reader:
        reader.load_state_dict(state)
        assert [int(i) for b in reader for i in b.id] == rest
    with make_batch_reader(one_big_group, workers_count=1, num_epochs=2) as reader:
        sizes = [len(b.id) for b in reader]
    assert sizes[:4] == sizes[13:17] == [8, 16, 32, 4]  # each epoch starts with the ramp


def test_resume_inside_a_cut_row_group(one_big_group, monkeypatch) -> None:
    monkeypatch.setattr("unihub.readers.reader.DECODE_TASK_BYTES", 50 * 768)
    options = dict(shuffle_rows=True, seed=9, num_epochs=2)
    with make_reader(one_big_group, **options) as reader:
        full = [int(r.id) for r in reader]
    with make_reader(one_big_group, **options) as reader:
        head = [int(next(reader).id) for _ in range(N + 77)]
        state = reader.state_dict()
    with make_reader(one_big_group, resume_from=state, **options) as reader:
        assert head + [int(r.id) for r in reader] == full
