"""``unihub verify SRC DST``: compare two datasets row by row (values, shapes, dtypes).

Either side may be a unihub dataset or a foreign one (read with its inferred schema). Rows
are compared in storage order; images are compared as their encoded bytes, so a lossless
conversion verifies exactly. The report lists the first differences.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from unihub.converters.convert import UNIHUB, _unihub_batches, resolve_source_format
from unihub.formats.foreign import FORMATS


@dataclass
class VerifyReport:
    """The outcome of :func:`verify`."""

    equal: bool
    rows_source: int
    rows_target: int
    differences: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if self.equal:
            return f"equal: {self.rows_source:,} rows, every value identical"
        head = f"DIFFERENT: {self.rows_source:,} rows vs {self.rows_target:,} rows"
        return "\n".join([head, *(f"  {d}" for d in self.differences)])


def _rows(path: str, fmt: str | None) -> tuple[list[str], Iterator[dict[str, Any]]]:
    import unihub.formats.formats_all  # noqa: F401

    name = resolve_source_format(path, fmt)
    if name == UNIHUB:
        batches, schema, _, _ = _unihub_batches(path, None, 256)
    else:
        source = FORMATS.get(name)(path)
        schema = source.infer_schema()
        batches = source.read_batches(schema)
    names = list(schema.fields)

    def rows() -> Iterator[dict[str, Any]]:
        for batch in batches:
            columns = [(batch[n].to_pylist() if isinstance(batch[n], pa.Array) else list(batch[n]))
                       if n in batch else None for n in names]
            count = max((len(c) for c in columns if c is not None), default=0)
            for i in range(count):
                yield {n: (c[i] if c is not None else None) for n, c in zip(names, columns)}

    return names, rows()


def values_equal(a: Any, b: Any) -> tuple[bool, str]:
    """Exact equality of two decoded values, with a description of the first mismatch."""
    if a is None or b is None:
        return (a is None and b is None), f"{_describe(a)} vs {_describe(b)}"
    if isinstance(a, (bytes, bytearray, memoryview)) or isinstance(b, (bytes, bytearray, memoryview)):
        ab, bb = bytes(a) if not isinstance(a, str) else a.encode(), bytes(b) if not isinstance(b, str) else b.encode()
        return ab == bb, f"{len(ab)} bytes vs {len(bb)} bytes"
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        x, y = np.asarray(a), np.asarray(b)
        if x.shape != y.shape:
            return False, f"shape {x.shape} vs {y.shape}"
        if x.dtype != y.dtype and not (x.dtype.kind in "OUS" and y.dtype.kind in "OUS"):
            return False, f"dtype {x.dtype} vs {y.dtype}"
        equal = np.array_equal(x, y, equal_nan=x.dtype.kind in "fc")
        return bool(equal), "values differ" if not equal else ""
    if isinstance(a, (float, np.floating)) and isinstance(b, (float, np.floating)) and np.isnan(a) and np.isnan(b):
        return True, ""
    if isinstance(a, np.generic) and isinstance(b, np.generic) and a.dtype != b.dtype:
        return False, f"dtype {a.dtype} vs {b.dtype}"
    return bool(a == b), f"{a!r} vs {b!r}"


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, np.ndarray):
        return f"array {value.dtype}{value.shape}"
    return type(value).__name__


def verify(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, from_format: str | None = None,
           to_format: str | None = None, max_differences: int = 10) -> VerifyReport:
    """Compare ``src`` and ``dst`` row by row; ``equal`` only when every field of every row matches."""
    src_names, src_rows = _rows(os.fspath(src), from_format)
    dst_names, dst_rows = _rows(os.fspath(dst), to_format)
    differences: list[str] = []
    missing = [n for n in src_names if n not in dst_names]
    extra = [n for n in dst_names if n not in src_names]
    if missing or extra:
        differences.append(f"fields differ: only in source {missing}, only in target {extra}")
    common = [n for n in src_names if n in dst_names]
    n_src = n_dst = 0
    for index, (a, b) in enumerate(itertools.zip_longest(src_rows, dst_rows)):
        n_src += a is not None
        n_dst += b is not None
        if a is None or b is None or len(differences) >= max_differences:
            continue
        for name in common:
            same, why = values_equal(a[name], b[name])
            if not same:
                differences.append(f"row {index}, field {name!r}: {why}")
                if len(differences) >= max_differences:
                    break
    if n_src != n_dst:
        differences.insert(0, f"row counts differ: {n_src:,} vs {n_dst:,}")
    return VerifyReport(not differences, n_src, n_dst, differences[:max_differences])
