"""converters/verify.py ``values_equal``: the row-by-row comparison of ``unihub verify`` and what it says differs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from unihub.converters.verify import values_equal


@pytest.mark.parametrize(
    ("a", "b", "why"),
    [
        (None, 1, "None vs int"),
        (np.zeros(2), None, "array float64(2,) vs None"),
        (b"abc", b"abd", "3 bytes vs 3 bytes"),
        (b"abc", "abcd", "3 bytes vs 4 bytes"),
        (np.zeros((2, 3)), np.zeros((3, 2)), "shape (2, 3) vs (3, 2)"),
        (np.zeros(3, np.float32), np.zeros(3, np.float64), "dtype float32 vs float64"),
        (np.array([1.0, np.nan]), np.array([2.0, np.nan]), "values differ"),
        (np.int32(1), np.int64(1), "dtype int32 vs int64"),
        (1, 2, "1 vs 2"),
        (float("nan"), 1.0, "nan vs 1.0"),
        # 0.0 and -0.0 are equal numbers but other values (the rows of two datasets said equal)
        (np.float64(-0.0), np.float64(0.0), "np.float64(-0.0) vs np.float64(0.0)"),
        (0.0, -0.0, "0.0 vs -0.0"),
        (np.array([1.0, -0.0], np.float32), np.array([1.0, 0.0], np.float32), "values differ"),
        (np.array([1j, 0j]), np.array([1j, complex(-0.0, 0.0)]), "values differ"),
    ],
)
def test_different_values_say_how(a: Any, b: Any, why: str) -> None:
    assert values_equal(a, b) == (False, why)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (None, None),
        (b"abc", bytearray(b"abc")),
        (memoryview(b"abc"), "abc"),  # a string as UTF-8 bytes
        (np.array([1.0, np.nan]), np.array([1.0, np.nan])),  # NaN equals NaN in float arrays
        (np.array([-0.0, 2.0]), np.array([-0.0, 2.0])),
        (np.array(["a", "b"], dtype=object), np.array(["a", "b"])),  # object and str dtypes compare alike
        (np.arange(3), [0, 1, 2]),  # a list against an array: as an array
        (float("nan"), np.float32("nan")),
        (np.int64(3), np.int64(3)),
        ("x", "x"),
    ],
)
def test_equal_values(a: Any, b: Any) -> None:
    assert values_equal(a, b)[0] is True
