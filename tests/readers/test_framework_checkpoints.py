"""The frameworks' own checkpoints: ``torch.distributed.checkpoint`` saves the loaders and readers with a
model and optimizer (torch's ``Stateful``), and resuming mid-epoch gives exactly the remaining rows.

The dataset has 53 rows (a prime) in row groups of a few rows over several files; ids are the rows.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from unihub import ScalarCodec, TensorCodec, Unischema, UnischemaField, write_dataset
from unihub.dependencies import is_available
from unihub.readers.reader import make_batch_reader, make_reader

N = 53
SCHEMA = Unischema("CheckpointTest", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("x", np.float32, (3,), TensorCodec(), False),
])


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("checkpoints") / "ds"
    write_dataset(path, SCHEMA, ({"id": i, "x": np.full(3, i, np.float32)} for i in range(N)),
                  row_group_size_mb=0.0005, rows_per_file=20)
    return str(path)


# -- PyTorch: torch.distributed.checkpoint ---------------------------------------------------------
torch_only = pytest.mark.skipif(not is_available("torch"), reason="torch is not installed")


def _torch_loader(kind: str, url: str) -> Any:
    """A loader of ``kind`` over a fresh reader (unseeded: a resumed one must take the saved seed)."""
    from unihub.readers import pytorch as tp
    if kind == "reader":
        return make_reader(url, reader_pool_type="dummy", shuffle_rows=True, num_epochs=2)
    if kind == "DataLoader":
        reader = make_reader(url, reader_pool_type="dummy", shuffle_rows=True, num_epochs=2)
        return tp.DataLoader(reader, batch_size=4, shuffling_queue_capacity=9)
    if kind == "BatchedDataLoader":
        reader = make_batch_reader(url, reader_pool_type="dummy", shuffle_rows=True, num_epochs=2)
        return tp.BatchedDataLoader(reader, batch_size=5, shuffling_queue_capacity=11)
    reader = make_reader(url, reader_pool_type="dummy", shuffle_rows=True, num_epochs=1)
    return tp.InMemBatchedDataLoader(reader, batch_size=6, num_epochs=2, shuffle=True)


def _ids(item: Any) -> list[int]:
    ids = item["id"] if isinstance(item, dict) else item.id
    return np.atleast_1d(np.asarray(ids)).tolist()


KINDS = ["reader", "DataLoader", "BatchedDataLoader", "InMemBatchedDataLoader"]


@torch_only
@pytest.mark.parametrize("kind", KINDS)
def test_loaders_and_readers_are_torch_stateful(url, kind):
    from torch.distributed.checkpoint.stateful import Stateful
    loader = _torch_loader(kind, url)
    assert isinstance(loader, Stateful)
    state = loader.state_dict()  # the in-memory loader refused before
    loader.load_state_dict(state)


def _train_and_checkpoint(url: str, kind: str, stop: int, path: str) -> tuple[list[int], dict[str, Any]]:
    """Train on ``stop`` items, save model, optimizer and loader with DCP; the ids seen and the weights."""
    import torch
    import torch.distributed.checkpoint as dcp
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = _torch_loader(kind, url)
    seen: list[int] = []
    iterator = iter(loader)
    for _ in range(stop):
        item = next(iterator)
        seen += _ids(item)
        x = torch.as_tensor(np.asarray(item["x"] if isinstance(item, dict) else item.x, np.float32)).reshape(-1, 3)
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
    dcp.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader},
             checkpoint_id=path)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    if hasattr(iterator, "close"):
        iterator.close()
    getattr(loader, "terminate", getattr(loader, "stop", lambda: None))()
    return seen, weights


def _resume(url: str, kind: str, path: str) -> tuple[list[int], dict[str, Any], Any]:
    """A model, optimizer and loader made anew, loaded from ``path`` with DCP: the ids of the rest."""
    import torch
    import torch.distributed.checkpoint as dcp
    torch.manual_seed(1)  # other initial weights: the loaded ones must replace them
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.zeros(1, 3)).sum().backward()
    optimizer.step()  # the optimizer's state exists, for DCP to load into
    loader = _torch_loader(kind, url)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader}
    dcp.load(state, checkpoint_id=path)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    rest = [i for item in loader for i in _ids(item)]
    getattr(loader, "terminate", getattr(loader, "stop", lambda: None))()
    return rest, model.state_dict(), optimizer


@torch_only
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stop", [1, 7, 15])
def test_dcp_saves_the_loader_with_model_and_optimizer_and_resumes_the_rest(url, kind, stop, tmp_path):
    import torch
    seen, weights = _train_and_checkpoint(url, kind, stop, str(tmp_path / "checkpoint"))
    rest, loaded, optimizer = _resume(url, kind, str(tmp_path / "checkpoint"))
    assert len(seen) and len(rest)
    assert Counter(seen + rest) == Counter({i: 2 for i in range(N)})  # two epochs: each row twice, none more
    assert all(torch.equal(weights[k], loaded[k]) for k in weights)
    assert all(int(s["step"]) == stop for s in optimizer.state_dict()["state"].values())


@torch_only
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_in_a_gloo_group_of_one(url, tmp_path):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        seen, _ = _train_and_checkpoint(url, "DataLoader", 5, str(tmp_path / "checkpoint"))
        rest, _, _ = _resume(url, "DataLoader", str(tmp_path / "checkpoint"))
    finally:
        dist.destroy_process_group()
    assert len(seen) == 20 and Counter(seen + rest) == Counter({i: 2 for i in range(N)})


@torch_only
def test_in_memory_loader_resumes_with_another_batch_size_and_reader_seed(url):
    from unihub.readers import pytorch as tp
    with make_reader(url, reader_pool_type="dummy", shuffle_rows=True, seed=5) as reader:
        loader = tp.InMemBatchedDataLoader(reader, batch_size=4, num_epochs=3, shuffle=True, seed=9)
        full = [i for batch in loader for i in batch["id"].tolist()]
    with make_reader(url, reader_pool_type="dummy", shuffle_rows=True, seed=5) as reader:
        loader = tp.InMemBatchedDataLoader(reader, batch_size=4, num_epochs=3, shuffle=True, seed=9)
        iterator = iter(loader)
        head = [i for _ in range(20) for i in next(iterator)["id"].tolist()]
        state = loader.state_dict()
    with make_reader(url, reader_pool_type="dummy", shuffle_rows=True, seed=6) as reader:
        resumed = tp.InMemBatchedDataLoader(reader, batch_size=7, num_epochs=3, shuffle=True, seed=9)
        resumed.load_state_dict(state)
        rest = [i for batch in resumed for i in batch["id"].tolist()]
    assert head + rest == full  # the same rows in the same order: the saved reader seed's rows were reloaded
    with make_reader(url, reader_pool_type="dummy", shuffle_rows=True, seed=5) as reader:
        capped = tp.InMemBatchedDataLoader(reader, batch_size=4, rows_capacity=10)
        with pytest.raises(tp.LoaderStateError, match="rows_capacity"):
            capped.load_state_dict(state)
        with pytest.raises(tp.LoaderStateError, match="InMemBatchedDataLoader"):
            capped.load_state_dict({"version": 1, "reader": {}, "skip": 0, "exclude": []})
