"""A ``TorchMapDataset`` sampler batch in a worker goes to torch's ``default_collate`` whole (as
markers, bridges/torch/sampler_rows.py ``SamplerBatch``), not cut into rows and joined back: the batches are
the ones collating the rows gives, and a ``collate_fn`` of the user's own still gets rows."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unihub.schema.codecs import CompressedImageCodec, TensorCodec
from unihub.schema.unischema import Unischema, UnischemaField
from unihub.store.writer import write_dataset

torch = pytest.importorskip("torch")

from unihub.bridges.torch import TorchMapDataset  # noqa: E402
from unihub.bridges.torch import datasets as torch_datasets  # noqa: E402
from unihub.bridges.torch.sampler_rows import SamplerBatch  # noqa: E402

N = 200
CUTS = multiprocessing.get_context("fork").Value("i", 0)  # rows cut from sampler batches in the workers


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    schema = Unischema("Batches", [
        UnischemaField("id", np.int64, ()),
        UnischemaField("vec", np.float32, (3,), TensorCodec(), False),
        UnischemaField("plain", np.float32, (2,)),  # no codec: a column of arrays, not one tensor
        UnischemaField("image", np.uint8, (8, 8, 3), CompressedImageCodec("png"), False),
    ])
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("batches") / "ds"
    write_dataset(path, schema, ({"id": i, "vec": np.full(3, i, np.float32), "plain": np.full(2, i, np.float32),
                                  "image": rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)} for i in range(N)),
                  row_group_size_mb=0.02)
    return path


def _count_cuts(_: int) -> None:
    """worker_init_fn: counts, in shared memory, each sampler batch a worker cuts into rows."""
    original = torch_datasets.rows_of_columns

    def counting(*args: Any, **kwargs: Any) -> Any:
        with CUTS.get_lock():
            CUTS.value += 1
        return original(*args, **kwargs)

    torch_datasets.rows_of_columns = counting


def _epoch(path: Path, workers: int, collate_fn: Any = None, fields: Any = ("id", "vec", "image")
           ) -> list[dict[str, Any]]:
    CUTS.value = 0
    options = {} if collate_fn is None else {"collate_fn": collate_fn}
    loader = torch.utils.data.DataLoader(TorchMapDataset(path, list(fields)), batch_size=16, shuffle=True,
                                         num_workers=workers,
                                         generator=torch.Generator().manual_seed(5),
                                         worker_init_fn=_count_cuts if workers else None, **options)
    return [dict(batch) for batch in loader]


def _same(found: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert len(found) == len(expected) == -(-N // 16)
    for got, want in zip(found, expected):
        assert got.keys() == want.keys()
        for key in want:
            assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key])


def test_batches_in_workers_go_whole_and_equal_collated_rows(images):
    rows = _epoch(images, 0)  # no worker: rows, collated
    whole = _epoch(images, 2)
    assert CUTS.value == 0  # no batch was cut into rows in a worker
    _same(whole, rows)


def test_a_column_that_is_not_one_tensor_goes_as_rows(images):
    """A field without a codec decodes to a column of arrays: its rows are collated by torch."""
    fields = ("id", "plain", "image")
    got = _epoch(images, 2, fields=fields)
    assert CUTS.value == len(got)
    _same(got, _epoch(images, 0, fields=fields))


def test_a_collate_fn_of_one_s_own_still_gets_rows(images):
    seen: list[type] = []

    def own(batch: list[Any]) -> Any:
        seen.append(type(batch[0]))
        return torch.utils.data.default_collate([dict(row) for row in batch])

    got = _epoch(images, 2, collate_fn=own)
    assert CUTS.value == len(got)  # every batch cut into rows, for the user's function
    _same(got, _epoch(images, 0))


def test_markers_of_several_batches_collate_as_their_rows(images):
    """Markers mixed from two batches (nothing torch does; a caller of the collate could): each is
    its batch's row at that position, as the rows would be."""
    from torch.utils.data._utils.collate import default_collate_fn_map

    first = {"id": torch.arange(4), "vec": torch.zeros(4, 3)}
    second = {"id": torch.arange(10, 14), "vec": torch.ones(4, 3)}
    markers = [SamplerBatch(first)] * 2 + [SamplerBatch(second)] * 2
    collated = default_collate_fn_map[SamplerBatch](markers)
    assert collated["id"].tolist() == [0, 1, 12, 13]
    assert collated["vec"].tolist() == [[0.0] * 3] * 2 + [[1.0] * 3] * 2
