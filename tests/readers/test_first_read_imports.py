"""The first read of a JPEG dataset imports neither pandas nor imagecodecs.

pyarrow's ``to_numpy`` and ``pa.array`` load its pandas bridge (~0.3 s of import), and imagecodecs
(PNG) ~0.1 s: both used to sit on the way to a process's first batch (and to every torch
worker's), a large part of a short epoch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from unihub import CompressedImageCodec, ScalarCodec, TensorCodec, Unischema, UnischemaField, write_dataset

CHILD = """
import sys
from unihub import make_batch_reader, make_reader
with make_batch_reader(sys.argv[1], num_epochs=1) as reader:
    batch = next(reader)
    assert batch.image.shape[1:] == (8, 8, 3) and batch.label.dtype.kind == "i" and batch.vec.shape[1:] == (4,)
with make_reader(sys.argv[1], num_epochs=1, shuffle_rows=True, seed=0) as reader:
    row = next(reader)
    assert row.image.shape == (8, 8, 3)
print(sorted(name for name in ("pandas", "imagecodecs") if name in sys.modules))
"""

CHILD_ANY = """
import sys
from unihub import make_batch_reader, make_reader
with make_batch_reader(sys.argv[1], num_epochs=1) as reader:
    assert sum(len(batch[0]) for batch in reader) > 0
with make_reader(sys.argv[1], num_epochs=1) as reader:
    assert sum(1 for _ in reader) > 0
print("pandas" in sys.modules)
"""


@pytest.mark.parametrize("fmt, expected", [("jpeg", "[]"), ("png", "['imagecodecs']")])
def test_the_first_batch_loads_only_the_decoder_it_needs(tmp_path: Path, fmt: str, expected: str) -> None:
    schema = Unischema("S", [
        UnischemaField("image", np.uint8, (8, 8, 3), CompressedImageCodec(fmt), False),
        UnischemaField("label", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("vec", np.float32, (4,), TensorCodec(), False),
    ])
    rng = np.random.default_rng(0)
    rows = [{"image": rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "label": i,
             "vec": rng.random(4, dtype=np.float32)} for i in range(40)]
    write_dataset(tmp_path / "ds", schema, rows)
    done = subprocess.run([sys.executable, "-c", CHILD, (tmp_path / "ds").as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == expected


@pytest.mark.parametrize("name", ["unischema", "plain"])
def test_petastorms_own_datasets_read_without_pandas(name: str) -> None:
    """Written by Petastorm 0.13.1 (tests/fixtures/petastorm): PNG images, strings, nullable columns,
    and a plain Parquet store whose schema is inferred."""
    url = (Path(__file__).resolve().parents[1] / "fixtures" / "petastorm" / name).as_uri()
    done = subprocess.run([sys.executable, "-c", CHILD_ANY, url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"
