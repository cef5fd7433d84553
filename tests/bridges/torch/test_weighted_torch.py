"""WeightedSamplingReader through the PyTorch loaders: DataLoader over row readers,
BatchedDataLoader over batch readers, exact resume of the loader, iterating again."""

from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np
import pytest

from unihub import WeightedSamplingReader, in_lambda, make_batch_reader, make_reader
from unihub.dependencies import is_available
from unihub.readers.weighted import draw_choices

from ...readers.test_weighted import A_IDS, B_IDS, UNISCHEMA, write

pytestmark = pytest.mark.skipif(not is_available("torch"), reason="torch is not installed")
torch = pytest.importorskip("torch")
from unihub.bridges.torch import BatchedDataLoader, DataLoader  # noqa: E402


@pytest.fixture(scope="module")
def urls(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("weighted_torch")
    return write(root / "a", A_IDS), write(root / "b", B_IDS)


def row_mixer(urls: tuple[str, str], **kwargs: Any) -> WeightedSamplingReader:
    readers = [make_reader(u, seed=s, shuffle_rows=True, workers_count=2) for s, u in enumerate(urls)]
    return WeightedSamplingReader(readers, [0.3, 0.7], seed=5, **kwargs)


def batch_mixer(urls: tuple[str, str], **kwargs: Any) -> WeightedSamplingReader:
    readers = [make_batch_reader(u, seed=s, shuffle_rows=True, workers_count=2) for s, u in enumerate(urls)]
    return WeightedSamplingReader(readers, [0.3, 0.7], seed=5, **kwargs)


def loader_ids_iter(loader: Any) -> Any:
    return (batch["id"].tolist() for batch in loader)


def loader_ids(loader: Any) -> list[list[int]]:
    return list(loader_ids_iter(loader))


def test_data_loader_over_row_readers(urls):
    with row_mixer(urls) as mixer:
        expected = [int(r.id) for r in mixer]
    with row_mixer(urls) as mixer, DataLoader(mixer, batch_size=8) as loader:
        batches = list(loader)
        again = loader_ids(loader)  # a second iteration resets the mixer: the same rows again
    assert all(set(b) >= {"id", "vec", "label"} for b in batches)
    assert batches[0]["vec"].shape == (8, 3) and batches[0]["vec"].dtype == torch.float32
    assert [i for b in batches for i in b["id"].tolist()] == expected
    assert again == [b["id"].tolist() for b in batches]


@pytest.mark.parametrize("cut", [1, 5, 9])
def test_data_loader_resumes_exactly(urls, cut):
    with row_mixer(urls) as mixer, DataLoader(mixer, batch_size=7) as loader:
        whole = loader_ids(loader)
    with row_mixer(urls) as mixer:
        loader = DataLoader(mixer, batch_size=7)
        head = list(itertools.islice(loader_ids_iter(loader), cut))
        state = json.loads(json.dumps(loader.state_dict()))
    with row_mixer(urls) as mixer:
        loader = DataLoader(mixer, batch_size=7)
        loader.load_state_dict(state)
        rest = loader_ids(loader)
    assert head + rest == whole


def test_batched_data_loader_over_batch_readers(urls):
    with batch_mixer(urls) as mixer:
        reader_batches = [b.id.tolist() for b in mixer]
    sources = [0 if b[0] < 1000 else 1 for b in reader_batches]
    assert sources == draw_choices(5, [0.3, 0.7], 0, len(sources)).tolist()
    expected = [i for b in reader_batches for i in b]
    with batch_mixer(urls) as mixer, BatchedDataLoader(mixer, batch_size=10) as loader:
        batches = list(loader)
    assert all(len(b["id"]) == 10 for b in batches[:-1]) and batches[0]["vec"].shape == (10, 3)
    assert [i for b in batches for i in b["id"].tolist()] == expected


@pytest.mark.parametrize("cut", [1, 4])
def test_batched_data_loader_resumes_exactly(urls, cut):
    with batch_mixer(urls) as mixer, BatchedDataLoader(mixer, batch_size=10) as loader:
        whole = loader_ids(loader)
    with batch_mixer(urls) as mixer:
        loader = BatchedDataLoader(mixer, batch_size=10)
        head = list(itertools.islice(loader_ids_iter(loader), cut))
        state = json.loads(json.dumps(loader.state_dict()))
    with batch_mixer(urls) as mixer:
        loader = BatchedDataLoader(mixer, batch_size=10)
        loader.load_state_dict(state)
        assert head + loader_ids(loader) == whole


def test_data_loader_over_petastorm_dataset():
    """Petastorm's test_with_torch_api, on Petastorm's own dataset (even and odd ids mixed)."""
    readers = [make_reader(UNISCHEMA, schema_fields=["id", "label", "embedding"], workers_count=1, num_epochs=None,
                           predicate=in_lambda(["id"], lambda i, parity=parity: i % 2 == parity)) for parity in (0, 1)]
    with WeightedSamplingReader(readers, [0.5, 0.5], seed=1) as mixer:
        assert not mixer.batched_output
        with DataLoader(mixer, batch_size=2) as loader:
            batch = next(iter(loader))
    assert batch["id"].shape == (2,) and batch["embedding"].shape == (2, 16)
    assert np.isin(batch["id"].numpy(), np.arange(60)).all()


def test_len_of_a_loader_over_a_mixer_is_unknown(urls):
    with row_mixer(urls) as mixer:
        with pytest.raises(TypeError, match="len"):
            len(DataLoader(mixer, batch_size=4))


def test_data_loader_cuts_a_batch_mixer_into_rows(urls):
    with batch_mixer(urls) as mixer:  # as Petastorm's DataLoader takes a batch reader
        ids = [i for batch in DataLoader(mixer, batch_size=4) for i in batch["id"].tolist()]
    assert len(ids) > 4 and len(set(ids)) == len(ids)
