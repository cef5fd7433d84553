"""``benchmarks/proc_cpu.py``: the process-tree CPU clock every benchmark side shares (reader.py, peers.py,
petastorm_side.py, cpu_per_row.py), and ``reader_side.py``'s one timed make_reader epoch (the Petastorm half
needs its venv and is not run here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from unihub import ScalarCodec, Unischema, UnischemaField, write_dataset

SIDE = Path(__file__).resolve().parents[1] / "benchmarks" / "reader_side.py"
BUSY = ("import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
        "print('spent', flush=True)\ntime.sleep(30)")


def _tree_cpu_seconds():  # noqa: ANN202 - the benchmark module, imported by path as the scripts do
    sys.path.insert(0, str(SIDE.parent))
    try:
        from proc_cpu import tree_cpu_seconds
    finally:
        sys.path.remove(str(SIDE.parent))
    return tree_cpu_seconds


def test_tree_cpu_counts_a_live_child_and_one_waited_for() -> None:
    clock = _tree_cpu_seconds()
    before = clock()
    child = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "spent\n"  # its 0.3 s spent, it sleeps
    alive = clock() - before
    child.kill()
    child.wait()
    gone = clock() - before
    assert 0.3 <= alive < 5.0, alive
    assert 0.3 <= gone < 5.0, gone  # in this process's children's time once waited for


def test_one_epoch_reports_rows_seconds_and_cpu(tmp_path: Path) -> None:
    schema = Unischema("S", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                             UnischemaField("label", np.int32, (), ScalarCodec(pa.int32()), False)])
    write_dataset(tmp_path / "ds", schema, ({"id": i, "label": i % 3} for i in range(500)))
    job = {"url": f"file://{tmp_path / 'ds'}", "schema_fields": ["id"]}
    out = subprocess.run([sys.executable, str(SIDE), json.dumps(job)], capture_output=True, text=True, timeout=120,
                         check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["rows"] == 500 and result["seconds"] > 0 and result["cpu_s"] > 0, result
