"""Shapes whose ``None`` dimensions vary by row: does a found shape match, and the fixed dims of one.

Used by the codecs, the value checks (:mod:`unihub.schema.validation`), the writer and the formats; it
sits below them all.
"""

from __future__ import annotations

from unihub.errors import SchemaError


def shape_matches(found: tuple[int, ...], expected: tuple[int | None, ...]) -> bool:
    """True when ``found`` has the rank of ``expected`` and equal sizes where not ``None``."""
    return len(found) == len(expected) and all(e is None or e == f for f, e in zip(found, expected))


def fixed_dims(shape: tuple[int | None, ...]) -> tuple[int, ...]:
    """``shape`` typed as having no ``None`` dimension, for code that checked it has none
    (``field.is_fixed_shape``); a SchemaError when it has one."""
    dims = tuple(d for d in shape if d is not None)
    if len(dims) != len(shape):
        raise SchemaError(f"shape {shape} has dimensions that vary by row, expected a fixed shape")
    return dims
