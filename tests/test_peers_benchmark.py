"""``benchmarks/peers.py --quick``: unihub's contenders and tf.data's pipeline run side by side and are checked.

Only unihub and tf.data (both in this venv): the peers' venvs are never built by the test suite.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "peers.py"
sys.path.insert(0, str(SCRIPT.parent))

import peers_side  # noqa: E402


def test_steady_rate_is_the_rate_between_the_batches_crossing_10_and_90_percent() -> None:
    # 100 batches of 10 rows: 1 s of start-up, then one batch every 10 ms, and a slow tail
    marks = [(1.0 + 0.01 * i, 10 * (i + 1)) for i in range(95)] + [(3.0 + i, 960 + 10 * i) for i in range(5)]
    # 10% = 100 rows at batch 9 (t=1.09), 90% = 900 rows at batch 89 (t=1.89): 800 rows in 0.8 s
    assert peers_side.steady_rate(marks, 1000) == pytest.approx(1000.0)
    assert peers_side.steady_rate([(0.5, 64)], 64) is None  # one batch: nothing to tell


def test_the_result_is_the_last_json_line_even_when_a_tool_printed_after_it() -> None:
    import peers

    printed = '{"rows": 64}\n(raylet) WARNING: 10 PYTHON worker processes have been started\n'
    assert peers._last_json(printed) == {"rows": 64}
    assert peers._last_json("no result\n[1, 2]\n") is None


@pytest.mark.slow
def test_quick_run_times_unihub_and_tfdata_on_the_same_content(tmp_path: Path) -> None:
    data = tmp_path / "data"
    out = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--rows", "640", "--unshuffled", "--only", "unihub,tfdata",
                          "--data", str(data)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {line.split(" | ")[0][2:]: line for line in out.stdout.splitlines() if line.startswith("| ")}
    expected = ["unihub BatchedDataLoader(make_batch_reader)", "unihub DataLoader(make_reader)",
                "unihub TorchIterableDataset, torch DataLoader(2 workers)",
                "unihub TorchMapDataset, torch DataLoader(2 workers)", "unihub make_tf_dataset",
                "tf.data TFRecord, parallel parse + decode_jpeg"]
    for label in expected:
        assert label in rows, out.stdout
        # every contender delivered all 640 rows with the same labels, and the probe rows' pixels
        # (decoded by simplejpeg, or by TensorFlow's libjpeg-turbo) equal the content's, bit for bit
        assert "failed" not in rows[label] and " | yes | " in rows[label], rows[label]
        # CPU ms per 1,000 rows (non-decode part), peak RSS (PSS of its own run)
        assert re.search(r" \| [\d,.]+ \(-?[\d,.]+\) \| [\d,]+ \([\d,]+\) \| ", rows[label]), rows[label]
    assert not any("shuffled" in label for label in rows)
    assert "fastest peer: tf.data TFRecord" in out.stdout
    assert "make_tf_dataset >= 1.25x tf.data's best pipeline (variant " in out.stdout
    assert "unihub DataLoader(make_reader): " in out.stdout and "non-decode CPU" in out.stdout
    assert "round 1: variant batch: " in rows["tf.data TFRecord, parallel parse + decode_jpeg"]  # its sweep
    # the content and each tool's copy are cached, nothing else: no temporary folders left
    from unihub.runtime.memory import DEFAULT_ROW_GROUP_SIZE_MB

    unihub_copy = f"unihub-rg{DEFAULT_ROW_GROUP_SIZE_MB:g}mb"  # rewritten when the default changes
    assert sorted(p.name for p in data.iterdir()) == ["content.npz", "tfrecord", unihub_copy]
    assert list(tmp_path.iterdir()) == [data]
