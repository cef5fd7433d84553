"""Peak memory of a piece of work, measured in a fresh interpreter.

``peak_growth_mib(setup, work)`` runs ``setup`` (imports, opening files), resets the process's
peak RSS to its current RSS (``/proc/self/clear_refs``), runs ``work`` and returns by how much the
peak RSS (``VmHWM``) rose above the RSS before ``work``: what the work itself held at its worst,
file-backed pages it kept mapped included.

The tests that use it write gigabytes: :func:`scratch` gives them a directory that is removed when
they are done, and :func:`needs_room` skips them, saying what is missing, on a disk without the room.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from unihub.dependencies import is_available

#: skip marker for tests that need Linux's /proc to reset and read the peak RSS
needs_proc = pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(),
                                reason="needs Linux /proc to measure peak RSS")

_CHILD = r'''
import gc, json

def _kib(key):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1])

{setup}
gc.collect()
with open("/proc/self/clear_refs", "w") as _f:  # the peak restarts at the current RSS
    _f.write("5")
_base = _kib("VmRSS")
{work}
print(json.dumps({{"growth_kib": _kib("VmHWM") - _base}}))
'''


def peak_growth_mib(setup: str, work: str, *, env: dict[str, str] | None = None, timeout: float = 300) -> float:
    """Peak RSS growth (MiB) of ``work`` after ``setup``, both Python source, in a subprocess."""
    code = _CHILD.format(setup=textwrap.dedent(setup), work=textwrap.dedent(work))
    full_env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    full_env.update(env or {})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["growth_kib"] / 1024


MB = 2**20
ROW_GROUP_MB = 32
#: what a process grows by whatever it reads or writes: Arrow's and the allocators' pools, threads
OVERHEAD_MB = 64
#: peak RSS growth allowed to writing, ingest, export and reading: a small multiple of the row group
LIMIT_MB = 6 * ROW_GROUP_MB + OVERHEAD_MB  # 256 MB
#: the setup of a process that writes camera frames (1200x1920x3 uint8, 6.9 MB) and lidar clouds
CAMERA_SETUP = """
import numpy as np
from unihub import TensorCodec, Unischema, UnischemaField, write_dataset
rng = np.random.default_rng(0)
frame = rng.integers(0, 255, (1200, 1920, 3), dtype=np.uint8)
cloud = rng.random((102_000, 4), dtype=np.float32)
FIELDS = [UnischemaField("id", np.int64, ()), UnischemaField("frame", np.uint8, (1200, 1920, 3), TensorCodec(), False)]
LIDAR = UnischemaField("lidar", np.float32, (None, 4), TensorCodec(), False)
"""


def needs_room(path: Path, mib: float) -> None:
    """Skip, naming what is missing, unless ``path``'s disk has ``mib`` MiB free and some to spare:
    these tests measure RSS over data far bigger than it, and a full disk says nothing about that."""
    free = shutil.disk_usage(path).free / MB
    if free < mib + 1024:
        pytest.skip(f"needs {mib:.0f} MiB of data (+1 GiB to spare) free under {path}; {free:.0f} MiB are")


@contextmanager
def scratch(tmp_path_factory: pytest.TempPathFactory, name: str, mib: float) -> Iterator[Path]:
    """A new directory for ``mib`` MiB of test data, removed afterwards (for module fixtures: their
    data would otherwise stay on disk until the session ends)."""
    path = tmp_path_factory.mktemp(name)
    try:
        needs_room(path, mib)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def tensorflow_writes(path: Path, count: int, size: int) -> Path:
    """``count`` tf.train.Examples (``id``, ``data``: ``size`` random bytes) written by TensorFlow."""
    if not is_available("tensorflow"):
        pytest.skip("tensorflow is not installed")
    script = textwrap.dedent(f"""
        import os
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
        import numpy as np
        import tensorflow as tf

        with tf.io.TFRecordWriter({str(path)!r}) as w:
            for i in range({count}):
                data = np.random.default_rng(i).integers(0, 255, {size}, dtype=np.uint8).tobytes()
                w.write(tf.train.Example(features=tf.train.Features(feature={{
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                    "data": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data]))}})).SerializeToString())
    """)
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, timeout=300)
    return path

