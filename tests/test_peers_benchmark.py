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
                "tf.data TFRecord, batched parse_example + decode_jpeg"]
    for label in expected:
        assert label in rows, out.stdout
        # every contender delivered all 640 rows with the same labels, and the probe rows' pixels
        # (decoded by simplejpeg, or by TensorFlow's libjpeg-turbo) equal the content's, bit for bit
        assert "failed" not in rows[label] and " | yes | " in rows[label], rows[label]
        assert re.search(r" \| [\d,]+ \([\d,]+\) \| ", rows[label]), rows[label]  # peak RSS (PSS of its own run)
    assert not any("shuffled" in label for label in rows)
    assert "fastest peer: tf.data TFRecord" in out.stdout
    assert "make_tf_dataset >= 1.3x tf.data's pipeline:" in out.stdout
    assert "of the decode limit:" in out.stdout
    # the content and each tool's copy are cached, nothing else: no temporary folders left
    from unihub.runtime.memory import DEFAULT_ROW_GROUP_SIZE_MB

    unihub_copy = f"unihub-rg{DEFAULT_ROW_GROUP_SIZE_MB:g}mb"  # rewritten when the default changes
    assert sorted(p.name for p in data.iterdir()) == ["content.npz", "tfrecord", unihub_copy]
    assert list(tmp_path.iterdir()) == [data]
