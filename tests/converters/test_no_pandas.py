"""Conversions never import pandas: pyarrow's own conversions from Python lists and numpy arrays do
(~0.3 s a process, on every CLI run), so unihub builds those arrays itself (``schema/arrow_numpy.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ..formats.webdataset.test_tarstream_fast import webdataset_shard


@pytest.mark.parametrize("kind", ["webdataset", "hdf5", "imagefolder"])
def test_a_conversion_does_not_import_pandas(tmp_path: Path, kind: str) -> None:
    """pyarrow's own conversions from Python lists and numpy import pandas (~0.3 s a process)."""
    if kind == "webdataset":
        source = webdataset_shard(tmp_path / "w.tar", 50)
    elif kind == "hdf5":
        import h5py

        source = tmp_path / "d.h5"
        with h5py.File(source, "w") as f:
            f["images"] = np.zeros((20, 8, 8, 3), np.uint8)
            f["labels"] = np.arange(20)
            f["names"] = np.array([b"n%d" % i for i in range(20)])
    else:
        from PIL import Image

        source = tmp_path / "images"
        for label in ("cat", "dog"):
            (source / label).mkdir(parents=True)
            for i in range(3):
                Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(source / label / f"{i}.png")
    code = ("import sys; from unihub.converters.convert import convert; "
            f"convert({str(source)!r}, {str(tmp_path / 'out')!r}, progress=False); "
            "assert 'pandas' not in sys.modules, 'pandas was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
