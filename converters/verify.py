"""``unihub verify SRC DST``: is DST everything SRC holds, value for value?

When one side is a foreign format (TFRecord, HDF5, WebDataset, an image folder) and the other a
unihub dataset, the foreign side is read by **the format's own library**
(:meth:`~unihub.formats.base.ForeignFormat.reference_records`: TensorFlow or the protobuf
runtime, h5py, tarfile, the file bytes), never by the parser the conversion used, and the unihub
rows are put in that same native form
(:meth:`~unihub.formats.base.ForeignFormat.native_records`: what an export would write). So a
field, a record, a feature list or a bit that the conversion lost shows up as a difference, even
where unihub's own reading of the source would have lost it the same way. Both directions work:
``verify source.tfrecord ds/`` checks an ingest, ``verify ds/ export.tfrecord`` an export.

Two unihub datasets, or two foreign ones, are compared row by row after reading each with unihub.
Every difference names the record, the field, what was expected and what was found.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from unihub.converters.convert import resolve_source_format, unihub_batches
from unihub.converters.result import UNIHUB
from unihub.errors import InvalidArgumentError
from unihub.formats.base import FORMATS, ForeignFormat
from unihub.formats.compare import first_difference, show_value
from unihub.fs import sources


@dataclass
class VerifyReport:
    """The outcome of :func:`verify`."""

    equal: bool
    rows_source: int
    rows_target: int
    differences: list[str] = field(default_factory=list)
    #: how the foreign side was read ("tfrecord's own reader"), or "" for a row-by-row comparison
    reference: str = ""

    def summary(self) -> str:
        how = f" (checked against {self.reference})" if self.reference else ""
        if self.equal:
            return f"equal: {self.rows_source:,} rows, every value identical{how}"
        head = f"DIFFERENT: {self.rows_source:,} rows vs {self.rows_target:,} rows{how}"
        return "\n".join([head, *(f"  {d}" for d in self.differences)])


def _rows(path: str, fmt: str | None, options: Mapping[str, Any]) -> tuple[list[str], Iterator[dict[str, Any]]]:
    import unihub.formats.builtin  # noqa: F401  (registers every format; start-up cost: 0.1 s)

    name = resolve_source_format(path, fmt)
    if name == UNIHUB:
        batches, schema, _, _ = unihub_batches(path, None, 256)
    else:
        source = FORMATS.get(name)(path, **options)
        schema = source.infer_schema()
        batches = source.read_batches(schema)
    names = list(schema.fields)
    return names, _batch_rows(names, batches)


def _batch_rows(names: list[str], batches: Any) -> Iterator[dict[str, Any]]:
    for batch in batches:
        columns = [(batch[n].to_pylist() if isinstance(batch[n], pa.Array) else list(batch[n]))
                   if n in batch else None for n in names]
        count = max((len(c) for c in columns if c is not None), default=0)
        for i in range(count):
            yield {n: (c[i] if c is not None else None) for n, c in zip(names, columns)}


def values_equal(a: Any, b: Any) -> tuple[bool, str]:
    """Exact equality of two decoded values, with a description of the first mismatch."""
    if a is None or b is None:
        return (a is None and b is None), f"{_describe(a)} vs {_describe(b)}"
    if isinstance(a, (bytes, bytearray, memoryview)) or isinstance(b, (bytes, bytearray, memoryview)):
        return _bytes_equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return _arrays_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, (float, np.floating)) and isinstance(b, (float, np.floating)):
        if np.isnan(a) and np.isnan(b):
            return True, ""
        if a == b and np.signbit(a) != np.signbit(b):  # 0.0 and -0.0: equal numbers, other values
            return False, f"{a!r} vs {b!r}"
    if isinstance(a, np.generic) and isinstance(b, np.generic) and a.dtype != b.dtype:
        return False, f"dtype {a.dtype} vs {b.dtype}"
    return bool(a == b), f"{a!r} vs {b!r}"


def _bytes_equal(a: Any, b: Any) -> tuple[bool, str]:
    """:func:`values_equal` where one side is bytes: the other as bytes too (a string as UTF-8)."""
    ab, bb = bytes(a) if not isinstance(a, str) else a.encode(), bytes(b) if not isinstance(b, str) else b.encode()
    return ab == bb, f"{len(ab)} bytes vs {len(bb)} bytes"


def _arrays_equal(x: np.ndarray, y: np.ndarray) -> tuple[bool, str]:
    """:func:`values_equal` of arrays: same shape, same dtype (any mix of object and string dtypes
    counts as one), same values (NaN equal to NaN, 0.0 unlike -0.0)."""
    if x.shape != y.shape:
        return False, f"shape {x.shape} vs {y.shape}"
    if x.dtype != y.dtype and not (x.dtype.kind in "OUS" and y.dtype.kind in "OUS"):
        return False, f"dtype {x.dtype} vs {y.dtype}"
    equal = np.array_equal(x, y, equal_nan=x.dtype.kind in "fc")
    if equal and x.dtype.kind in "fc":
        equal = _same_zero_signs(x, y)
    return bool(equal), "values differ" if not equal else ""


def _same_zero_signs(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether float (or complex) arrays of equal values have their zeros of the same signs."""
    pairs = [(x.real, y.real), (x.imag, y.imag)] if x.dtype.kind == "c" else [(x, y)]
    return all(np.array_equal(np.signbit(p[p == 0]), np.signbit(q[p == 0])) for p, q in pairs)


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, np.ndarray):
        return f"array {value.dtype}{value.shape}"
    return type(value).__name__


def _own_reader(fmt: type[ForeignFormat]) -> bool:
    return fmt.reference_records is not ForeignFormat.reference_records


def verify(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, from_format: str | None = None,
           to_format: str | None = None, max_differences: int = 10,
           options: Mapping[str, Any] | None = None,
           storage_options: Mapping[str, Any] | None = None) -> VerifyReport:
    """Compare ``src`` and ``dst``; ``equal`` only when every field of every record matches.

    ``options`` are reading options of the foreign side (as for ``convert``'s ``format_options``);
    ``storage_options`` reach every file of either side on a remote filesystem (as for ``convert``).
    ``max_differences`` (at least 1: the comparison stops collecting there) are listed.
    """
    if isinstance(max_differences, bool) or not isinstance(max_differences, int) or max_differences < 1:
        raise InvalidArgumentError(f"max_differences must be a whole number >= 1, got {max_differences!r} "
                                   "(with none collected, two different datasets would compare equal)")
    with sources.using(storage_options):
        return _verify(src, dst, from_format=from_format, to_format=to_format, max_differences=max_differences,
                       options=options)


def _verify(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, from_format: str | None,
            to_format: str | None, max_differences: int, options: Mapping[str, Any] | None) -> VerifyReport:
    import unihub.formats.builtin  # noqa: F401  (registers every format; start-up cost: 0.1 s)

    src, dst = os.fspath(src), os.fspath(dst)
    src_format, dst_format = resolve_source_format(src, from_format), resolve_source_format(dst, to_format)
    options = dict(options or {})
    if (src_format == UNIHUB) != (dst_format == UNIHUB):
        foreign_format = dst_format if src_format == UNIHUB else src_format
        if _own_reader(FORMATS.get(foreign_format)):
            return _verify_native(src, dst, foreign_format, src_format == UNIHUB, options, max_differences)
    if src_format == dst_format != UNIHUB and _own_reader(FORMATS.get(src_format)):
        fmt = FORMATS.get(src_format)  # two files of one format: both through its own reader
        first, second = fmt(src, **options), fmt(dst, **options)
        report = _compare(first.reference_records(), second.reference_records(), max_differences,
                          fmt.REFERENCE_READER or f"{src_format}'s own reader")
        return _with_extras(report, first.reference_extras(), second.reference_extras(), max_differences)
    return _verify_rows(src, dst, from_format, to_format, options, max_differences)


def _verify_native(src: str, dst: str, fmt_name: str, export: bool, options: dict[str, Any],
                   max_differences: int) -> VerifyReport:
    """One foreign side read by its own library, the unihub side projected into that form."""
    fmt = FORMATS.get(fmt_name)
    foreign_path, unihub_path = (dst, src) if export else (src, dst)
    source = fmt(foreign_path, **options)
    batches, schema, extra, _ = unihub_batches(unihub_path, None, 256)
    source.prepare(schema)
    native_options = {**source.written_options(), **options}  # the file's own say, under the user's
    reference = source.reference_records()
    projected = ((None, record) for record in
                 fmt.native_records(schema, _batch_rows(list(schema.fields), batches), extra, **native_options))
    expected, found = (projected, reference) if export else (reference, projected)
    report = _compare(expected, found, max_differences, fmt.REFERENCE_READER or f"{fmt_name}'s own reader")
    theirs, ours = source.reference_extras(), fmt.native_extras(schema, extra, **native_options)
    return _with_extras(report, *((ours, theirs) if export else (theirs, ours)), max_differences)


def _with_extras(report: VerifyReport, expected: Mapping[str, Any], found: Mapping[str, Any],
                 max_differences: int) -> VerifyReport:
    """``report`` with the differences of what the two sides hold beside their records
    (:meth:`~unihub.formats.base.ForeignFormat.reference_extras`), compared name by name after them."""
    differences = list(report.differences)
    for name in [*expected, *(n for n in found if n not in expected)]:
        if name not in found:
            difference: str | None = f"{name}: expected {show_value(expected[name])}, found nothing (missing)"
        elif name not in expected:
            difference = f"{name}: expected nothing, found {show_value(found[name])} (not in the source)"
        else:
            difference = first_difference(expected[name], found[name], name)
        if difference is not None:
            differences.append(difference)
    return VerifyReport(not differences, report.rows_source, report.rows_target, differences[:max_differences],
                        reference=report.reference)


def _compare(expected: Iterator[tuple[str | None, Any]], found: Iterator[tuple[str | None, Any]],
             max_differences: int, reference: str) -> VerifyReport:
    """Records of the source and the target, ``(where, record)`` each (``where`` None for unihub rows),
    compared in order; the report names each difference by record and by where the reader found it."""
    differences: list[str] = []
    counts = [0, 0]
    for index, (theirs, ours) in enumerate(itertools.zip_longest(expected, found)):
        counts[0] += theirs is not None
        counts[1] += ours is not None
        if theirs is None or ours is None or len(differences) >= max_differences:
            continue
        where = theirs[0] or ours[0]
        difference = first_difference(theirs[1], ours[1])
        if difference is not None:
            differences.append(f"record {index} ({where}), {difference}" if where else f"record {index}, {difference}")
    if counts[0] != counts[1]:
        differences.insert(0, f"record counts differ: {counts[0]:,} in the source vs {counts[1]:,} in the target")
    return VerifyReport(not differences, counts[0], counts[1], differences[:max_differences], reference=reference)


def _verify_rows(src: str, dst: str, from_format: str | None, to_format: str | None, options: dict[str, Any],
                 max_differences: int) -> VerifyReport:
    """Both sides read by unihub and compared row by row (two unihub datasets, or two foreign ones)."""
    src_names, src_rows = _rows(src, from_format, options)
    dst_names, dst_rows = _rows(dst, to_format, options)
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
