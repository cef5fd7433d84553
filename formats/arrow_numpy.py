"""Numpy views of Arrow arrays without pyarrow's pandas bridge.

pyarrow's ``Array.to_numpy`` (and ``pa.array`` of a numpy array) initialise its pandas support on
first use, which imports pandas: ~0.3 s on the first read of every process (and of every torch
worker), on the path to the first batch. A null-free array of fixed-width numbers is one buffer,
so :func:`to_numpy` maps it directly; anything else goes to pyarrow as before.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_NUMBER_TYPES = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
                 pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.uint64(): np.uint64,
                 pa.float16(): np.float16, pa.float32(): np.float32, pa.float64(): np.float64}


def to_numpy(array: pa.Array) -> np.ndarray:
    """``array.to_numpy(zero_copy_only=False)``: a zero-copy, read-only view for null-free numbers
    (without importing pandas); pyarrow's conversion for everything else."""
    dtype = _NUMBER_TYPES.get(array.type)
    if dtype is None or array.null_count:
        return array.to_numpy(zero_copy_only=False)
    data = array.buffers()[1]
    if data is None:  # an empty array may have no buffer
        return np.empty(0, dtype)
    return np.frombuffer(data, dtype, count=len(array), offset=array.offset * np.dtype(dtype).itemsize)


def int64_array(values: np.ndarray) -> pa.Array:
    """``pa.array(values, pa.int64())`` for a numpy array of indices, without importing pandas."""
    data = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])
