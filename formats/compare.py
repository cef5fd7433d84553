"""Exact comparison of native records, for verify: the first difference, down to the bits.

A format's ``reference_records`` (its own library's reading) and ``native_records`` (unihub's rows in
that same form) are compared with :func:`first_difference` by :mod:`unihub.converters.verify`, and by
formats that match parts of a file against each other (HDF5's dimension scales).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def first_difference(expected: Any, found: Any, where: str = "") -> str | None:
    """The first way ``found`` differs from ``expected`` (``"field 'x': expected ..., found ..."``),
    or None when they are identical: same types, dtypes, shapes, and bits (NaN equals a NaN of the
    same bits; -0.0 differs from 0.0). Dicts are compared key by key, lists item by item."""
    if isinstance(expected, Mapping) and isinstance(found, Mapping):
        for key in expected:
            if key not in found:
                return f"{_at(where, key)}: expected {show_value(expected[key])}, found nothing (missing)"
        for key in found:
            if key not in expected:
                return f"{_at(where, key)}: expected nothing, found {show_value(found[key])} (not in the source)"
        for key in expected:
            difference = first_difference(expected[key], found[key], _at(where, key))
            if difference is not None:
                return difference
        return None
    if isinstance(expected, (list, tuple)) and isinstance(found, (list, tuple)):
        if len(expected) != len(found):
            return f"{where or 'record'}: expected {len(expected)} items, found {len(found)}"
        for i, (a, b) in enumerate(zip(expected, found)):
            difference = first_difference(a, b, f"{where}[{i}]")
            if difference is not None:
                return difference
        return None
    if _same_leaf(expected, found):
        return None
    return f"{where or 'record'}: expected {show_value(expected)}, found {show_value(found)}{_where_they_differ(expected, found)}"


def _where_they_differ(a: Any, b: Any) -> str:
    """``', first at index (2, 1): 3 vs 4'`` for arrays of one shape and dtype, ``', first at byte 57'``
    for bytes: the descriptions alone may show the same leading values."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape and a.dtype == b.dtype \
            and a.dtype != object and a.size:
        diff = np.flatnonzero(~_bitwise_equal(a, b))
        if diff.size:
            at = np.unravel_index(int(diff[0]), a.shape)
            return f", first at index {tuple(int(i) for i in at)}: {str(a[at])} vs {str(b[at])}"
    if isinstance(a, (bytes, bytearray, memoryview)) and isinstance(b, (bytes, bytearray, memoryview)):
        x, y = bytes(a), bytes(b)
        offset = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        return f", first at byte {offset}"
    return ""


def _bitwise_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise: the same bits (NaN equal to the same NaN, -0.0 unlike 0.0)."""
    width = a.dtype.itemsize
    x = _without_gaps(a).reshape(-1).view(np.uint8).reshape(-1, width)
    y = _without_gaps(b).reshape(-1).view(np.uint8).reshape(-1, width)
    return (x == y).all(1)


def _without_gaps(a: np.ndarray) -> np.ndarray:
    """``a`` contiguous, the bytes a structured dtype leaves between and after its fields zeroed: numpy
    copies only the fields, so those bytes hold whatever memory held and two copies of one value differ."""
    if a.dtype.names is None:
        return np.ascontiguousarray(a)
    out = np.zeros(a.shape, a.dtype)
    for name in a.dtype.names:
        out[name] = _without_gaps(a[name])
    return out


def _same_leaf(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype == object:
            return all(first_difference(x, y) is None for x, y in zip(a.ravel().tolist(), b.ravel().tolist()))
        return _without_gaps(a).tobytes() == _without_gaps(b).tobytes()
    if isinstance(a, (bytes, bytearray, memoryview)) and isinstance(b, (bytes, bytearray, memoryview)):
        return bytes(a) == bytes(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and _without_gaps(np.asarray(a)).tobytes() == _without_gaps(np.asarray(b)).tobytes()
    if isinstance(a, float):
        return math.copysign(1.0, a) == math.copysign(1.0, b) and (a == b or (math.isnan(a) and math.isnan(b)))
    return bool(a == b)


def _at(where: str, key: Any) -> str:
    return f"{where}/{key}" if where else f"field {key!r}" if isinstance(key, str) else f"[{key}]"


def show_value(value: Any) -> str:
    """A short description of a value for messages (bounded: values can be megabytes)."""
    if isinstance(value, np.ndarray):
        body = ", ".join(str(v) for v in value.ravel()[:8])[:120]
        return f"{value.dtype}{list(value.shape)} [{body}{', ...' if value.size > 8 else ''}]"
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return repr(data) if len(data) <= 24 else f"{len(data)} bytes {data[:24]!r}..."
    if isinstance(value, (list, tuple)):
        open_, close = "[]" if isinstance(value, list) else "()"
        items = ", ".join(show_value(v) for v in value[:4])
        return f"{open_}{items}{close}" if len(value) <= 4 else f"{len(value)} items {open_}{items}, ...{close}"
    if isinstance(value, Mapping):
        return "{" + ", ".join(map(repr, list(value)[:6])) + (", ...}" if len(value) > 6 else "}")
    if isinstance(value, np.generic):
        return f"{value.dtype.name}({value.item()!r})"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
