"""Vectorised TFRecord reading: frame and parse a block of ``tf.train.Example`` records at once.

Why: parsing record by record in Python costs ~12 µs a record, several times TensorFlow's C++
reader. Records of one dataset are nearly always written alike -- the same features in the same
order, only the payload lengths and bytes differing -- so one record's *skeleton* (its wire
tokens: tags, length-varint widths, feature names, which payload belongs to which feature)
describes the others. The skeleton of a block's first record is checked against every record
of the block with numpy, a token at a time for all records together, and the payloads of the
records that match are gathered into columns (floats and one-byte varints by fancy indexing).
A record that differs in any way (another feature order, a missing feature, a length varint of
another width, anything unusual) falls back to :func:`~unihub.formats.tfrecord.example.parse_example`
and :meth:`_Plan.read`, so the batches, errors and report are exactly the per-record path's.

Records come a block at a time from :mod:`unihub.formats.tfrecord.framing` (framing and CRC checks).
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from unihub.formats.base import ColumnBatch, OnError, ReadReport, SchemaOutgrown, check_on_error
from unihub.formats.tfrecord.example import _packed_varints, _varint, parse_example
from unihub.formats.tfrecord.framing import Block, Error, Framer
from unihub.formats.tfrecord.records import _fail
from unihub.formats.tfrecord.schema import (
    SHAPE_SUFFIX,
    UNLISTED,
    Scan,
    _Mismatch,
    _OrderPlan,
    _Plan,
    _Stats,
    add_example,
    order_id,
    unlisted_check,
)
from unihub.fs import sources
from unihub.images import decoders as images
from unihub.schema import image_checks

if TYPE_CHECKING:  # format.py imports this module (through parsers.py)
    from unihub.formats.tfrecord.format import TFRecordFormat

__all__ = ["read_blocks", "scan_blocks"]

SCAN_BLOCK = 2048  # records parsed at a time by the schema scan
BLOCK = 1024  # about as many records parsed at a time by read_batches (whole batches)
TEMPLATES = 4  # skeletons tried per block before the rest of it is parsed record by record
_CONST, _OPEN, _CLOSE, _LEAF = range(4)


# -- skeletons -----------------------------------------------------------------------------
@dataclass
class _Skeleton:
    """One record's wire tokens, and per feature its kind and leaf (payload) numbers."""

    ops: list[tuple[int, Any, int]]
    features: dict[str, tuple[str, list[int]]]
    leaves: int


_KINDS = {0x0A: "bytes", 0x12: "float", 0x1A: "int64"}


def _length(data: bytes, pos: int) -> tuple[int, int, int]:
    """``(value, width, position after)`` of the length varint at ``pos``."""
    value, after = _varint(data, pos)
    return value, after - pos, after


class _SkeletonBuilder:
    """The tokens of one record, gathered field by field (see :func:`skeleton`)."""

    def __init__(self) -> None:
        self.ops: list[tuple[int, Any, int]] = []
        self.features: dict[str, tuple[str, list[int]]] = {}
        self.leaves = 0

    def const(self, raw: bytes) -> None:
        if self.ops and self.ops[-1][0] == _CONST:
            self.ops[-1] = (_CONST, self.ops[-1][1] + raw, 0)
        else:
            self.ops.append((_CONST, raw, 0))

    def open(self, width: int) -> None:
        self.ops.append((_OPEN, width, 0))

    def entry(self, data: bytes, pos: int) -> int | None:
        """Add the feature map entry at ``pos``; the position after it, or None where it is unusual."""
        if data[pos] != 0x0A:
            return None
        size, width, entry = _length(data, pos + 1)
        entry_end = entry + size
        self.const(b"\x0a")
        self.open(width)
        if data[entry] != 0x0A:
            return None
        size, _, name_at = _length(data, entry + 1)
        name = data[name_at:name_at + size].decode("utf-8")
        tag = name_at + size
        if name in self.features or data[tag] != 0x12:
            return None
        self.const(data[entry:tag + 1])
        size, width2, feature = _length(data, tag + 1)
        if feature + size != entry_end or feature >= entry_end or data[feature] not in _KINDS:
            return None
        kind = _KINDS[data[feature]]
        self.open(width2)
        self.const(data[feature:feature + 1])
        size, width3, item = _length(data, feature + 1)
        if item + size != entry_end:
            return None
        self.open(width3)
        leaves = self.payloads(data, item, entry_end)
        if leaves is None:
            return None
        slots, width4 = leaves
        if not slots or (kind != "bytes" and len(slots) != 1) or max(width, width2, width3, width4) > 5:
            return None
        self.ops += [(_CLOSE, 0, 0)] * 3
        self.features[name] = (kind, slots)
        return entry_end

    def payloads(self, data: bytes, item: int, entry_end: int) -> tuple[list[int], int] | None:
        """Add a list's values from ``item`` to ``entry_end``: their leaf numbers and the last one's length
        width, or None where they are unusual (another field, a value past the entry's end)."""
        slots: list[int] = []
        width = 0
        while item < entry_end:
            if data[item] != 0x0A:
                return None
            size, width, payload = _length(data, item + 1)
            self.const(b"\x0a")
            self.ops.append((_LEAF, width, self.leaves))
            slots.append(self.leaves)
            self.leaves += 1
            item = payload + size
        if item != entry_end:
            return None
        return slots, width

    def skeleton(self) -> _Skeleton:
        return _Skeleton([(c, np.frombuffer(a, np.uint8) if c == _CONST else a, b) for c, a, b in self.ops],
                         self.features, self.leaves)


def skeleton(data: bytes) -> _Skeleton | None:
    """The skeleton of a serialized Example in the usual layout, or None for anything else
    (fields other than the feature map, empty or kind-less features, repeated names ...)."""
    builder = _SkeletonBuilder()
    try:
        if not data or data[0] != 0x0A:
            return None
        size, width, pos = _length(data, 1)
        if pos + size != len(data) or width > 5:
            return None
        builder.const(b"\x0a")
        builder.open(width)
        while pos < len(data):
            after = builder.entry(data, pos)
            if after is None:
                return None
            pos = after
        builder.ops.append((_CLOSE, 0, 0))
    except (IndexError, ValueError):
        return None
    return builder.skeleton()


def match(arr: np.ndarray, starts: np.ndarray, ends: np.ndarray,
          sk: _Skeleton) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Walk every record ``arr[starts[i]:ends[i]]`` along ``sk`` at once.

    Returns ``ok`` (the records laid out exactly like the skeleton's), and each leaf's payload
    start and length, shape ``(leaves, n)`` (meaningful where ``ok``).
    """
    n = len(starts)
    last = len(arr) - 1
    pos = starts.copy()
    ok = np.ones(n, bool)
    stack: list[np.ndarray] = []
    leaf_start = np.zeros((sk.leaves, n), np.int64)
    leaf_size = np.zeros((sk.leaves, n), np.int64)
    for code, arg, slot in sk.ops:
        if code == _CONST:
            if len(arg) == 1:
                ok &= arr[np.minimum(pos, last)] == arg[0]
            else:
                ok &= (arr[np.minimum(pos[:, None] + np.arange(len(arg)), last)] == arg).all(1)
            pos += len(arg)
        elif code == _CLOSE:
            ok &= pos == stack.pop()
        else:
            byte = arr[np.minimum(pos, last)].astype(np.int64)
            value = byte & 0x7F
            for j in range(1, arg):
                ok &= byte >= 0x80
                byte = arr[np.minimum(pos + j, last)].astype(np.int64)
                value |= (byte & 0x7F) << (7 * j)
            ok &= byte < 0x80
            pos += arg
            if code == _OPEN:
                stack.append(pos + value)
            else:
                leaf_start[slot] = pos
                leaf_size[slot] = value
                pos += value
    ok &= pos == ends
    return ok, leaf_start, leaf_size


# -- columns -------------------------------------------------------------------------------
def _gather(arr: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """``arr[starts[i]:starts[i] + width]`` for each i, as rows of a ``(n, width)`` array."""
    return arr[starts[:, None] + np.arange(width)]


def _feature(data: bytes | mmap.mmap, kind: str, starts: list[int], sizes: list[int]) -> tuple[str, Any]:
    """One record's feature as parse_example gives it, from its leaves' bounds."""
    if kind == "bytes":
        return kind, [data[s:s + z] for s, z in zip(starts, sizes)]
    start, size = starts[0], sizes[0]
    if kind == "float":
        return kind, np.frombuffer(data, "<f4", size // 4, start)
    if size == 1 and data[start] < 0x80:
        return kind, [data[start]]
    return kind, _packed_varints(data, start, start + size)


def _column(plan: _Plan, sk: _Skeleton, block: Block, arr: np.ndarray, rows: np.ndarray,
            leaf_start: np.ndarray, leaf_size: np.ndarray, bad: np.ndarray) -> tuple[bool, Any]:
    """Field ``plan`` of the records ``rows`` of ``block`` (laid out like ``sk``).

    Returns ``(final, values)``: numpy values (vectorised; a row each, tensors flat) or a list of
    per-row values for :meth:`_Plan.column`; rows that do not fit are marked in ``bad``.
    """
    f = plan.field
    if isinstance(plan, _OrderPlan):  # not a feature: the order of the skeleton's, every row's
        return True, np.full(len(rows), order_id(tuple(sk.features)), np.int64)
    kind, slots = sk.features.get(f.name, (None, []))
    if kind is None and f.nullable:
        return False, [None] * len(rows)
    if kind is not None and (kind == "bytes") == plan.text:
        starts, sizes = leaf_start[slots[0]][rows], leaf_size[slots[0]][rows]
        column = _vector_column(plan, kind, len(slots), block, arr, starts, sizes, bad)
        if column is not None:
            return True, column
    return False, _row_values(plan, sk, block, rows, leaf_start, leaf_size, bad)


def _vector_column(plan: _Plan, kind: str, leaves: int, block: Block, arr: np.ndarray, starts: np.ndarray,
                   sizes: np.ndarray, bad: np.ndarray) -> Any:
    """Field ``plan`` of a feature of ``kind`` whose values (``leaves`` of them) start at ``starts`` and
    span ``sizes``, vectorised (Arrow for bytes and text, numpy for numbers), or None where that is not
    done (the caller reads it record by record); rows that do not fit are marked in ``bad``."""
    if plan.category in ("image", "bytes", "str") and leaves == 1:
        column = _binary_column(block.data, arr, starts, sizes, plan.category == "str")
        if column is not None:
            if plan.category == "image" and (plan.validate != "none" or not plan.fit):
                # failing images take the per-record path, which says why (or, under a provisional
                # schema, that a value with no image header outgrows it: _Plan.checked_image)
                mode = "header" if plan.validate == "none" else plan.validate
                bad |= image_checks.bad_images(arr, starts, starts + sizes, plan.field, mode, fit=plan.fit)
            return column
        return None  # record by record: the values that are not UTF-8 fail there
    numeric = plan.category == "scalar" or (plan.category == "tensor" and plan.size)
    width = (plan.size or 0) if plan.category == "tensor" else 1  # a tensor is numeric when size is set
    values = None
    if numeric and kind == "float" and plan.dtype in (np.float32, np.float64):  # exact; narrower: checked later
        bad |= sizes != 4 * width
        values = _gather(arr, np.where(bad, 0, starts), 4 * width).view("<f4").astype(plan.dtype)
    elif numeric and kind == "int64" and plan.dtype == np.int64:
        values = _int_values(block.data, arr, starts, sizes, width, bad)
    if values is None:
        return None
    return values[:, 0] if plan.category == "scalar" else values


def _int_values(data: bytes | mmap.mmap, arr: np.ndarray, starts: np.ndarray, sizes: np.ndarray, width: int,
                bad: np.ndarray) -> np.ndarray:
    """``(rows, width)`` int64 values of packed varint runs: one-byte varints by fancy indexing, the
    others all at once (:func:`_varint_rows`); runs that are malformed or hold another count are marked
    in ``bad``."""
    bytes_ = _gather(arr, np.where(sizes == width, starts, 0), width)
    simple = (sizes == width) & (bytes_ < 0x80).all(1)
    values = bytes_.astype(np.int64)
    other = np.flatnonzero(~simple)
    if len(other):
        _varint_rows(arr, other, starts[other], sizes[other], width, values, bad)
    return values


def _varint_rows(arr: np.ndarray, rows: np.ndarray, starts: np.ndarray, sizes: np.ndarray, width: int,
                 values: np.ndarray, bad: np.ndarray) -> None:
    """Decode the packed varint runs ``arr[starts[i]:starts[i] + sizes[i]]`` into ``values[rows[i]]``, all runs
    at once with :func:`~unihub.formats.tfrecord.example._packed_varints`' arithmetic; a run that is empty,
    ends inside a varint (parse_example finds it malformed) or holds other than ``width`` values is marked
    in ``bad``. (Record by record, multi-byte varints cost ~20 µs a record: more than protobuf's parse.)"""
    last = arr[np.maximum(starts + sizes - 1, 0)]
    whole = (sizes > 0) & (last < 0x80)
    bad[rows[~whole]] = True
    rows, starts, sizes = rows[whole], starts[whole], sizes[whole]
    if not len(rows):
        return
    total = int(sizes.sum())
    before = np.cumsum(sizes) - sizes  # where each run begins in the runs end to end
    raw = arr[np.repeat(starts - before, sizes) + np.arange(total)]
    ends = np.flatnonzero(raw < 0x80)  # each varint's last byte; every run ends with one
    firsts = np.concatenate(([0], ends[:-1] + 1))
    position = np.arange(total) - np.repeat(firsts, ends - firsts + 1)
    parts = (raw & 0x7F).astype(np.uint64) << (7 * position).astype(np.uint64)
    ints = np.add.reduceat(parts, firsts).view(np.int64)
    counts = np.bincount(np.repeat(np.arange(len(rows)), sizes)[ends], minlength=len(rows))
    fits = counts == width
    bad[rows[~fits]] = True
    values[rows[fits]] = ints[np.repeat(fits, counts)].reshape(-1, width)


def _row_values(plan: _Plan, sk: _Skeleton, block: Block, rows: np.ndarray, leaf_start: np.ndarray,
                leaf_size: np.ndarray, bad: np.ndarray) -> list[Any]:
    """Field ``plan`` of each record of ``rows``, read by :meth:`_Plan.read` from the record's feature(s) as
    parse_example gives them; a record that fails is marked in ``bad`` (the per-record reader says why)."""
    f = plan.field
    names = [n_ for n_ in (f.name, f.name + SHAPE_SUFFIX) if n_ in sk.features]
    bounds = [(n_, sk.features[n_][0], [leaf_start[s][rows].tolist() for s in sk.features[n_][1]],
               [leaf_size[s][rows].tolist() for s in sk.features[n_][1]]) for n_ in names]
    out: list[Any] = []
    data = block.data
    for i in range(len(rows)):
        try:
            example = {n_: _feature(data, k, [s[i] for s in st], [z[i] for z in sz]) for n_, k, st, sz in bounds}
            out.append(plan.read(example))
        except Exception:  # noqa: BLE001  (the per-record reader reports or raises it, in order)
            bad[i] = True
            out.append(None)
    return out


def _binary_column(data: Any, arr: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
                   text: bool) -> pa.Array | None:
    """The values ``data[starts[i]:starts[i] + sizes[i]]`` as one Arrow binary (``text``: UTF-8
    string) array, copied once by Arrow rather than into a Python object each; None when
    ``text`` and some value is not UTF-8, or the span is too wide for Arrow's 32-bit views."""
    n = len(starts)
    if not n:
        return pa.array([], pa.string() if text else pa.binary())
    base = int(starts.min())
    offsets = starts - base
    if int((offsets + sizes).max()) >= 2**31:
        blobs = [data[a:b] for a, b in zip(starts.tolist(), (starts + sizes).tolist())]
        array = pa.array(blobs, pa.binary())
    else:
        # a binary_view array over the buffer (length, 4-byte prefix, buffer 0, offset; values of
        # up to 12 bytes inline), cast to plain binary: one copy, in C++
        views = np.zeros((n, 16), np.uint8)
        views[:, :4] = sizes.astype("<i4")[:, None].view(np.uint8)
        heads = images.leading_bytes(arr, starts, sizes, 12)
        short = sizes <= 12
        views[short, 4:] = heads[short]
        views[~short, 4:8] = heads[~short, :4]
        views[~short, 12:] = offsets[~short].astype("<i4")[:, None].view(np.uint8)
        buffer = pa.py_buffer(data).slice(base, int((offsets + sizes).max()))
        array = pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(views), buffer]).cast(pa.binary())
    if not text:
        return array
    try:
        return array.cast(pa.string())
    except pa.ArrowInvalid:
        return None


def _concat(columns: list[Any]) -> Any:
    """Final columns (numpy or Arrow) end to end."""
    if isinstance(columns[0], pa.Array):
        return pa.concat_arrays(columns)
    return np.concatenate(columns)


def _rows(value: tuple[bool, Any]) -> list[Any]:
    final, column = value
    if isinstance(column, pa.Array):
        return column.to_pylist()
    return list(column) if final else column


def _select(value: tuple[bool, Any], keep: np.ndarray) -> tuple[bool, Any]:
    final, column = value
    if isinstance(column, pa.Array):
        return True, column.filter(pa.array(keep))
    if final:
        return True, column[keep]
    return False, [v for v, k in zip(column, keep.tolist()) if k]


@dataclass
class _Pending:
    """Numbers (in the block) of the records no template has taken yet."""

    left: np.ndarray


def _template_groups(block: Block, arr: np.ndarray,
                     pending: _Pending) -> Iterator[tuple[Any, np.ndarray, np.ndarray, np.ndarray]]:
    """Up to TEMPLATES groups of records laid out like one skeleton: ``(skeleton, ok, leaf starts, leaf sizes)``.

    Each skeleton is taken from the first pending record; ``ok`` marks the pending records that
    match it. The caller clears ``ok`` for records it rejects; they stay in ``pending.left`` for
    the next template or, at the end, the per-record path. Stops when a template takes nothing.
    """
    for _ in range(TEMPLATES):
        left = pending.left
        if not len(left):
            return
        first = int(left[0])
        sk = skeleton(block.data[block.starts[first]:block.ends[first]])
        if sk is None:
            return
        ok, leaf_start, leaf_size = match(arr, block.starts[left], block.ends[left], sk)
        if not ok.any():
            return
        yield sk, ok, leaf_start, leaf_size
        if not ok.any():  # the caller rejected them all: the next template would be the same
            return
        pending.left = left[~ok]


_Columns = list[tuple[bool, Any]]  # a plan each: (final, values), see _column


def _parse_block(block: Block, plans: list[_Plan], stats: dict[str, _Stats] | None = None,
                 unlisted: Callable[[Iterable[str]], str | None] | None = None, path: str = ""
                 ) -> tuple[np.ndarray, _Columns, list[Error]]:
    """The good records of ``block`` (their numbers in it, ascending), each plan's column of them
    (numpy or per-row values), and the records that fail, in order (``index`` their number).

    With ``stats`` (a single pass), the good records (of the file ``path``) are also counted into a
    schema scan's statistics, from the same template match. ``unlisted(feature names)`` names a feature the
    schema would lose (see :func:`unihub.formats.tfrecord.schema.unlisted_check`): its records fail.
    """
    arr = np.frombuffer(block.data, np.uint8)
    pending = _Pending(np.arange(len(block.indices)))
    groups = _template_columns(block, arr, pending, plans, stats, unlisted, path)
    slow_at, slow_rows, failures = _record_columns(block, pending.left, plans, stats, unlisted, path)
    if not slow_at and len(groups) <= 1:
        at, columns = groups[0] if groups else (np.zeros(0, np.int64), [])
        return at, columns, failures
    at, columns = _interleave(groups, slow_at, slow_rows, len(plans))
    return at, columns, failures


def _template_columns(block: Block, arr: np.ndarray, pending: _Pending, plans: list[_Plan],
                      stats: dict[str, _Stats] | None, unlisted: Callable[[Iterable[str]], str | None] | None,
                      path: str) -> list[tuple[np.ndarray, _Columns]]:
    """``(record numbers, columns)`` of each group of records laid out like a template, vectorised;
    the records left (another layout, or failing here) stay in ``pending.left``."""
    groups: list[tuple[np.ndarray, _Columns]] = []
    for sk, ok, leaf_start, leaf_size in _template_groups(block, arr, pending):
        rows = np.flatnonzero(ok)
        if unlisted is not None and unlisted(sk.features) is not None:
            ok[rows] = False  # the record-by-record path below says which feature, record by record
            continue
        bad = np.zeros(len(rows), bool)
        columns = [_column(p, sk, block, arr, rows, leaf_start, leaf_size, bad) for p in plans]
        if stats is not None and not bad.all():  # records the scan finds malformed go the slow way too
            fine = np.flatnonzero(~bad)
            bad[fine[_scan_group(block, arr, sk, rows[fine], leaf_start, leaf_size, stats, path,
                                 pending.left[rows[fine]])]] = True
        if bad.any():
            keep = ~bad
            columns = [_select(c, keep) for c in columns]
            ok[rows[bad]] = False
            rows = rows[keep]
        if len(rows):
            groups.append((pending.left[rows], columns))
    return groups


def _record_columns(block: Block, left: np.ndarray, plans: list[_Plan], stats: dict[str, _Stats] | None,
                    unlisted: Callable[[Iterable[str]], str | None] | None, path: str
                    ) -> tuple[list[int], list[list[Any]], list[Error]]:
    """The records ``left`` of ``block`` record by record, like parsers.read_records: the numbers of the
    good ones, their rows (a value per plan), and the failures."""
    slow_at: list[int] = []
    slow_rows: list[list[Any]] = []
    failures: list[Error] = []
    data = block.data
    for i in left.tolist():
        try:
            example = parse_example(data[block.starts[i]:block.ends[i]])
        except ValueError as exc:
            failures.append(Error(i, block.offsets[i], str(exc)))
            continue
        lost = unlisted(example) if unlisted is not None else None
        if lost is not None:
            failures.append(Error(i, block.offsets[i], UNLISTED, lost))
            continue
        try:
            slow_rows.append([p.read(example) for p in plans])
            slow_at.append(i)
            if stats is not None:
                add_example(stats, example, f"{path} record {block.indices[i]}")
        except _Mismatch as exc:
            failures.append(Error(i, block.offsets[i], exc.reason, exc.feature))
    return slow_at, slow_rows, failures


def _interleave(groups: list[tuple[np.ndarray, _Columns]], slow_at: list[int], slow_rows: list[list[Any]],
                plans: int) -> tuple[np.ndarray, _Columns]:
    """The template groups' columns and the rows read record by record, in file order."""
    order = np.concatenate([at for at, _ in groups] + [np.array(slow_at, np.int64)])
    rank = np.argsort(order, kind="stable")
    out: _Columns = []
    for j in range(plans):
        if not slow_at and all(columns[j][0] for _, columns in groups):
            column = _concat([columns[j][1] for _, columns in groups])
            out.append((True, column.take(pa.array(rank)) if isinstance(column, pa.Array) else column[rank]))
            continue
        values: list[Any] = []
        for _, columns in groups:
            values += _rows(columns[j])
        values += [row[j] for row in slow_rows]
        out.append((False, [values[r] for r in rank.tolist()]))
    return order[rank], out


def _finish(plans: list[_Plan], pieces: list[list[tuple[bool, Any]]]) -> ColumnBatch:
    """One batch from pieces of parsed blocks."""
    batch = {}
    for j, p in enumerate(plans):
        if all(piece[j][0] for piece in pieces):  # scalars (n,), tensors flat (n, size), Arrow bytes/text
            column = pieces[0][j][1] if len(pieces) == 1 else _concat([piece[j][1] for piece in pieces])
            keep_shape = p.category == "scalar" or isinstance(column, pa.Array)
            batch[p.field.name] = column if keep_shape else column.reshape((-1, *p.field.shape))
        else:
            batch[p.field.name] = p.column([v for piece in pieces for v in _rows(piece[j])])
    return batch


@dataclass
class _Gathering:
    """The batch being gathered from pieces of parsed blocks: ``have`` rows, ``held`` record bytes."""

    plans: list[_Plan]
    batch_size: int
    budget: int  # record bytes a batch holds at most
    pieces: list[_Columns] = field(default_factory=list)
    have: int = 0
    held: int = 0

    def block_records(self) -> int:
        """How many records to take next: what completes this batch, and whole batches up to about BLOCK."""
        need = self.batch_size - self.have
        return need + self.batch_size * max(0, (BLOCK - need) // self.batch_size)

    def deal(self, item: Block, good_at: np.ndarray, columns: _Columns, failures: list[Error], path: str,
             on_error: OnError, report: ReadReport) -> Iterator[ColumnBatch]:
        """Hand a parsed block's good records to the batches, each full batch yielded; its failures are
        reported (or raised) and ``report.records`` counted in between, where the per-record reader does."""
        base, row, fired = report.records, 0, 0
        # a block ends at ``budget - held`` bytes, so only its last batch can fill by bytes
        row_bytes = (int(item.ends[-1]) - int(item.starts[0])) / len(item.indices)
        while True:
            need = self.batch_size - self.have
            cut = int(good_at[row + need - 1]) if len(good_at) - row >= need else len(item.indices)
            while fired < len(failures) and failures[fired].index < cut:
                error = failures[fired]
                report.records = base + int(np.searchsorted(good_at, error.index))
                _fail(path, item.indices[error.index], error.offset, error.reason, on_error, report, error.feature)
                fired += 1
            take = min(need, len(good_at) - row)
            if take:
                self.pieces.append([(final, values[row:row + take]) for final, values in columns])
            row += take
            self.have += take
            self.held += int(take * row_bytes)
            report.records = base + row
            if self.have < self.batch_size and self.held < self.budget:
                break
            yield self.finish()

    def finish(self) -> ColumnBatch:
        """The batch gathered so far; the next one starts empty."""
        batch = _finish(self.plans, self.pieces)
        self.pieces, self.have, self.held = [], 0, 0
        return batch


def read_blocks(source: TFRecordFormat, plans: list[_Plan], batch_size: int,
                on_error: OnError) -> Iterator[ColumnBatch]:
    """What :meth:`TFRecordFormat.read_batches` yields, a block of records at a time (a block of at most
    ``source.batch_bytes`` of records, less what the batch being gathered already holds).

    A block may hold more records than a batch; its failures are reported (or raised) and
    ``report.records`` counted in between the batches exactly where the per-record reader does.
    """
    check_on_error(on_error)
    report = source.report
    unlisted = unlisted_check([p.field for p in plans], source.options.get("fields"))
    gathering = _Gathering(plans, batch_size, source.batch_bytes)
    stats = Scan() if source.observe else None
    if stats is not None:
        report.observed = (stats, 0)
    done = report.bytes_read  # input bytes of the files before this one
    for path in source.files():
        yield from _read_file(source, path, gathering, stats, unlisted, on_error, done)
        done += sources.getsize(path)
        report.bytes_read = done
    if gathering.have:
        yield gathering.finish()


def _read_file(source: TFRecordFormat, path: str, gathering: _Gathering, stats: Scan | None,
               unlisted: Callable[[Iterable[str]], str | None], on_error: OnError, done: int) -> Iterator[ColumnBatch]:
    """The batches filled by the records of the file ``path`` (``done``: input bytes of the files before it).

    With ``stats`` (a single pass), the statistics a schema scan would gather, and no record the provisional
    schema cannot hold (:class:`SchemaOutgrown`)."""
    report = source.report
    framer = Framer(path, source.options.get("compression"))
    skipped = len(report.skipped)
    try:
        while (item := framer.take(gathering.block_records(), gathering.budget - gathering.held)) is not None:
            if isinstance(item, Error):
                _fail(path, item.index, item.offset, item.reason, on_error, report)
                continue
            report.bytes_read = done + framer.consumed()
            good_at, columns, failures = _parse_block(item, gathering.plans, stats, unlisted, path)
            if stats is not None:
                outgrown = next((f for f in failures if f.feature is not None), None)
                if outgrown is not None:
                    raise SchemaOutgrown(f"{path} record {item.indices[outgrown.index]}: "
                                         f"{outgrown.feature!r} {outgrown.reason}")
                report.observed = (stats, report.observed[1] + len(good_at))
            yield from gathering.deal(item, good_at, columns, failures, path, on_error, report)
        if len(report.skipped) == skipped:  # a bad record skipped is reported already
            source.check_count(path, framer.index)
    finally:
        framer.close()


# -- schema inference ----------------------------------------------------------------------
def _varint_counts(arr: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
                   data: bytes | mmap.mmap) -> tuple[np.ndarray, np.ndarray]:
    """How many varints each packed run ``arr[starts[i]:starts[i] + sizes[i]]`` holds, and
    which runs end inside a varint (parse_example finds those malformed)."""
    n = len(starts)
    if not n or int(sizes.max()) <= 64:
        width = int(sizes.max()) if n else 0
        last = len(arr) - 1
        column = np.arange(width)
        ends = (arr[np.minimum(starts[:, None] + column, last)] < 0x80) & (column < sizes[:, None])
        cut = (sizes > 0) & (arr[np.minimum(starts + sizes - 1, last)] >= 0x80)
        return ends.sum(1), cut
    counts = np.zeros(n, np.int64)
    cut = np.zeros(n, bool)
    for i, (start, size) in enumerate(zip(starts.tolist(), sizes.tolist())):
        try:
            counts[i] = len(_packed_varints(data, start, start + size))
        except ValueError:
            cut[i] = True
    return counts, cut


def _scan_group(block: Block, arr: np.ndarray, sk: _Skeleton, rows: np.ndarray, leaf_start: np.ndarray,
                leaf_size: np.ndarray, stats: dict[str, _Stats], path: str, numbers: np.ndarray) -> np.ndarray:
    """Add the records ``rows`` (laid out like ``sk``; ``numbers``: theirs in the block) of ``path`` to
    ``stats``, as _Stats.add would one by one; returns which of them parse_example finds malformed (not
    added: they take the slow path)."""
    bad = np.zeros(len(rows), bool)
    lengths: dict[str, Any] = {}
    for name, (kind, slots) in sk.features.items():
        if kind == "bytes":
            lengths[name] = np.full(len(rows), len(slots))
        elif kind == "float":
            lengths[name] = leaf_size[slots[0]][rows] // 4
        else:
            lengths[name], cut = _varint_counts(arr, leaf_start[slots[0]][rows], leaf_size[slots[0]][rows],
                                                block.data)
            bad |= cut
    keep = rows[~bad]
    if not len(keep):
        return bad
    data = block.data
    where = f"{path} record {block.indices[int(numbers[~bad][0])]}"
    if isinstance(stats, Scan):
        stats.add_order(tuple(sk.features))
        if not sk.features:  # an empty features field (0a 00): b'' has no skeleton, add_example notes it
            stats.empty_features.add(True)
    previous = None
    for name, (kind, slots) in sk.features.items():  # in wire order, as add_example notes it
        stat = stats.setdefault(name, _Stats())
        if previous is not None:
            stat.after.add(previous)
        previous = name
        stat.present += len(keep)
        stat.add_kind(kind, where)
        stat.lengths.update(np.unique(lengths[name][~bad]).tolist())
        if kind == "bytes" and (stat.all_images or stat.utf8):
            starts = np.concatenate([leaf_start[s][keep] for s in slots])
            stat.add_byte_spans(arr, data, starts, starts + np.concatenate([leaf_size[s][keep] for s in slots]))
        if kind == "int64" and name.endswith(SHAPE_SUFFIX):
            starts, ends = leaf_start[slots[0]][keep].tolist(), (leaf_start[slots[0]] + leaf_size[slots[0]])[keep]
            for start, end in zip(starts, ends.tolist()):
                stat.shapes.add(tuple(int(v) for v in _feature(data, kind, [start], [end - start])[1]))
    return bad


def _scan_block(block: Block, stats: dict[str, _Stats], path: str, on_error: OnError, report: ReadReport) -> int:
    """Add the records of ``block`` to ``stats``; returns how many parsed."""
    arr = np.frombuffer(block.data, np.uint8)
    pending = _Pending(np.arange(len(block.indices)))
    good = 0
    for sk, ok, leaf_start, leaf_size in _template_groups(block, arr, pending):
        rows = np.flatnonzero(ok)
        bad = _scan_group(block, arr, sk, rows, leaf_start, leaf_size, stats, path, pending.left[rows])
        ok[rows[bad]] = False
        good += int(len(rows) - bad.sum())
    data = block.data
    for i in pending.left.tolist():  # the rest record by record, like parsers.scan_records
        try:
            example = parse_example(data[block.starts[i]:block.ends[i]])
        except ValueError as exc:
            _fail(path, block.indices[i], block.offsets[i], str(exc), on_error, report)
            continue
        good += 1
        add_example(stats, example, f"{path} record {block.indices[i]}")
    return good


def _next_good(framer: Framer, path: str, on_error: OnError, report: ReadReport) -> bool:
    """Read on to the next record that parses (True) or the file's end (False), reporting the rest."""
    while (item := framer.take(1)) is not None:
        if isinstance(item, Error):
            _fail(path, item.index, item.offset, item.reason, on_error, report)
            continue
        try:
            parse_example(item.data[item.starts[0]:item.ends[0]])
            return True
        except ValueError as exc:
            _fail(path, item.indices[0], item.offsets[0], str(exc), on_error, report)
    return False


def scan_blocks(source: TFRecordFormat, on_error: OnError,
                sample_records: int | None = None) -> tuple[Scan, int]:
    """What :func:`unihub.formats.tfrecord.parsers.scan_records` returns, a block of records at a time."""
    check_on_error(on_error)
    report = ReadReport()
    stats = Scan()
    total = 0
    for path in source.files():
        framer = Framer(path, source.options.get("compression"))
        try:
            while True:
                limit = SCAN_BLOCK if sample_records is None else min(SCAN_BLOCK, sample_records - total)
                if limit <= 0:  # the per-record scan stops at the first good record past the sample
                    if _next_good(framer, path, on_error, report):
                        return stats, total
                    break
                item = framer.take(limit, source.batch_bytes)  # big records: a few at a time
                if item is None:
                    break
                if isinstance(item, Error):
                    _fail(path, item.index, item.offset, item.reason, on_error, report)
                    continue
                total += _scan_block(item, stats, path, on_error, report)
        finally:
            framer.close()
    return stats, total
