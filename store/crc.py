"""CRC-32 as zlib computes it (Parquet's page checksums), at memory speed where it can be.

zlib's ``crc32`` runs at 2-4 GB/s of one core here; ISA-L's (the ``isal`` package, a dependency)
uses the processor's carry-less multiply: ~50 GB/s on data in the cache, ~20 GB/s from memory, so
checking every page of a 4 MB row group costs ~0.1-0.2 ms instead of ~1.5. Both release the GIL on
large buffers and give the same values; zlib's stands in where ``isal`` is not installed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

crc32: Callable[[Any], int]
try:
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; a platform without its wheel
    from zlib import crc32

#: which implementation :data:`crc32` is
IMPLEMENTATION = "isal" if crc32.__module__.startswith("isal") else "zlib"
