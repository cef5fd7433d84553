"""``benchmarks/row_groups.py --quick``: each row-group size is written, read back whole and reported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "row_groups.py"


@pytest.mark.slow
def test_quick_run_writes_and_reads_each_size(tmp_path: Path) -> None:
    data = tmp_path / "data"
    out = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--data", str(data)], capture_output=True,
                         text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    reads = [line.split(" | ") for line in out.stdout.splitlines() if line.startswith(("| 1 |", "| 32 |"))]
    contenders = {(r[0][2:], r[1]) for r in reads if len(r) == 5}
    assert contenders == {(size, name) for size in ("1", "32") for name in (
        "batched", "batched, shuffled", "DataLoader(make_reader)", "make_batch_reader, 100,000 scalar rows")}
    # every read delivered all rows with the right labels / ids (a wrong count is reported as failed)
    assert not any("failed" in " ".join(r) for r in reads), out.stdout
    groups = {(r[0][2:], r[1]): int(r[2]) for r in reads if len(r) == 6}
    assert groups[("1", "images")] > groups[("32", "images")] == 1
    assert groups[("1", "scalars")] > groups[("32", "scalars")] == 1
    # the copies and the content are kept for later runs; nothing else is left behind
    assert sorted(p.name for p in data.iterdir()) == [
        "content_2000.npz", "images_1", "images_32", "scalars_1", "scalars_32"]
    assert list(tmp_path.iterdir()) == [data]
