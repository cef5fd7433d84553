"""A distributed job's rank and world size: readers given no shard read their rank's (runtime/world.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from unihub import ScalarCodec, Unischema, UnischemaField, make_reader, write_dataset
from unihub.runtime.world import detected_world, shard_or_detected

SCHEMA = Unischema("World", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False)])


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("world") / "ds"
    write_dataset(path, SCHEMA, ({"id": i} for i in range(40)), row_group_size_mb=0.0002, rows_per_file=10)
    return path


def ids(url: Path, **options) -> list[int]:
    with make_reader(url, shuffle_row_groups=False, shard_by="row", reader_pool_type="dummy", **options) as reader:
        return [int(row.id) for row in reader]


def test_rank_and_world_size_variables_shard_a_reader_given_no_shard(dataset, monkeypatch):
    whole = ids(dataset)
    assert sorted(whole) == list(range(40))
    parts = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        assert detected_world() == (rank, 3)
        parts.append(ids(dataset))
        assert ids(dataset, cur_shard=0, shard_count=1) == whole  # a shard given wins
    assert sorted(set(parts[0] + parts[1] + parts[2])) == whole and len({len(p) for p in parts}) == 1
    monkeypatch.setenv("UNIHUB_AUTO_SHARD", "0")
    assert detected_world() is None and ids(dataset) == whole


@pytest.mark.parametrize("rank, world", [("0", "1"), ("x", "2"), ("3", "2"), (None, "2")])
def test_no_job_of_several_processes_reads_everything(monkeypatch, rank, world):
    monkeypatch.delenv("RANK", raising=False)
    if rank is not None:
        monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", world)
    assert detected_world() is None and shard_or_detected(None, None) == (None, None)
    assert shard_or_detected(1, 4) == (1, 4)


def test_an_initialised_torch_process_group_is_read(dataset, tmp_path):
    pytest.importorskip("torch")
    script = textwrap.dedent(f"""
        import os, sys
        import torch.distributed as dist
        from unihub import make_reader
        rank = int(sys.argv[1])
        dist.init_process_group("gloo", init_method="file://{tmp_path}/rendezvous", rank=rank, world_size=2)
        os.environ.pop("RANK", None); os.environ.pop("WORLD_SIZE", None)
        with make_reader({str(dataset)!r}, shuffle_row_groups=False, shard_by="row", reader_pool_type="dummy") as r:
            print(sorted(int(row.id) for row in r))
        dist.destroy_process_group()
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(rank)], stdout=subprocess.PIPE, text=True, env=env,
                              cwd=tmp_path) for rank in range(2)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    halves = [eval(out.strip().splitlines()[-1]) for out in outs]  # noqa: S307  (our own printed lists)
    assert sorted(halves[0] + halves[1]) == list(range(40)) and len(halves[0]) == 20
