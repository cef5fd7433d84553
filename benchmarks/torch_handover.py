"""How torch ``DataLoader`` workers hand their batches' shared memory to the main process: over the
channel the main process opened (``bridges/torch/fd_channel.py``), or torch's way (a connection per
storage to the worker's resource-sharer thread), side by side in one run.

Five paths over the peers benchmark's 20,000 rows (64x64 JPEG, label, float32[16]; written by
``peers.py`` first), 2 workers, batch 64, each run a fresh process timed from building the dataset
to the last batch; the two ways alternated, min / median / max of ``--rounds``:

- ``TorchMapDataset`` with a ``transform`` returning a tuple, shuffled: torch collates it field by
  field, into new shared memory for every field of every batch (what the channel is for);
- the same returning a dict: stacked into the worker's pooled shared memory;
- ``TorchIterableDataset`` of rows (``batch_size=None``: torch's collate joins slices of the columns
  into pooled memory);
- ``TorchIterableDataset`` and ``TorchMapDataset`` of batches (pooled shared memory, sent once).

    python benchmarks/torch_handover.py [--rounds 5] [--rows 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PATHS = ("map+transform tuple", "map+transform dict", "iterable rows", "iterable batches", "map batches")

_CHILD = r"""
import json, sys, time
import torch
from unihub.bridges.torch import TorchIterableDataset, TorchMapDataset

def numeric(row):
    return {"image": row["image"], "label": row["label"], "vec": row["vec"]}

def as_tuple(row):
    return row["image"], row["label"], row["vec"]

path, url = sys.argv[1], sys.argv[2]
start = time.perf_counter()
if path.startswith("map+transform"):
    transform = as_tuple if path.endswith("tuple") else numeric
    loader = torch.utils.data.DataLoader(TorchMapDataset(url, transform=transform), batch_size=64, shuffle=True,
                                         num_workers=2, generator=torch.Generator().manual_seed(0))
elif path == "iterable rows":
    loader = torch.utils.data.DataLoader(TorchIterableDataset(url, seed=0), batch_size=64, num_workers=2)
elif path == "iterable batches":
    loader = torch.utils.data.DataLoader(TorchIterableDataset(url, batch_size=64, seed=0), batch_size=None,
                                         num_workers=2)
else:
    loader = torch.utils.data.DataLoader(TorchMapDataset(url), batch_size=64, num_workers=2)
rows, first = 0, None
for batch in loader:
    rows += len(batch[1] if isinstance(batch, list) else batch["label"])
    first = first if first is not None else time.perf_counter() - start
print(json.dumps({"rows": rows, "seconds": time.perf_counter() - start, "first": first}))
"""


def run(path: str, url: str, channel: bool) -> dict[str, float]:
    env = dict(os.environ, UNIHUB_FD_CHANNEL="1" if channel else "0")
    out = subprocess.run([sys.executable, "-c", _CHILD, path, url], capture_output=True, text=True, env=env,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=20_000)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from peers import ensure_copy, make_content

    root = HERE / "data" / f"peers_{args.rows}"
    root.mkdir(parents=True, exist_ok=True)
    url = str(ensure_copy("unihub", Path(sys.executable), make_content(root / "content.npz", args.rows), root))
    results: dict[tuple[str, bool], list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for path in PATHS:
            for channel in (True, False):
                got = run(path, url, channel)
                assert got["rows"] == args.rows, got
                results.setdefault((path, channel), []).append(got)
    print("| path | channel rows/s min / **median** / max | torch's way rows/s min / **median** / max | "
          "ratio of medians | first batch ms (channel / torch's) |")
    print("|---|---|---|---|---|")
    for path in PATHS:
        cells, medians, firsts = [], [], []
        for channel in (True, False):
            rates = sorted(r["rows"] / r["seconds"] for r in results[(path, channel)])
            medians.append(statistics.median(rates))
            firsts.append(1e3 * statistics.median(r["first"] for r in results[(path, channel)]))
            cells.append(f"{rates[0]:,.0f} / **{medians[-1]:,.0f}** / {rates[-1]:,.0f}")
        print(f"| {path} | {cells[0]} | {cells[1]} | {medians[0] / medians[1]:.2f}x | "
              f"{firsts[0]:.0f} / {firsts[1]:.0f} |")


if __name__ == "__main__":
    main()
