"""Peak memory of a piece of work, measured in a fresh interpreter.

``peak_growth_mib(setup, work)`` runs ``setup`` (imports, opening files), resets the process's
peak RSS to its current RSS (``/proc/self/clear_refs``), runs ``work`` and returns by how much the
peak RSS (``VmHWM``) rose above the RSS before ``work``: what the work itself held at its worst,
file-backed pages it kept mapped included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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
