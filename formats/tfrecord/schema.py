"""``tf.train.Example`` features <-> Unischema fields: what a scan saw, the fields it implies, how a
field is read from a parsed Example and written back as features.

A scan counts, per feature, its kinds, lengths, presence, image headers and UTF-8-ness
(:class:`_Stats`); :func:`fields_from_stats` turns that into fields (one value -> a scalar or an
image, k values -> ``(k,)``, varying -> ``(None,)``, a ``<name>/shape`` feature -> each row's
shape). :class:`_Plan` reads one field from a parsed Example; :func:`example_encoder` writes a row
back as an Example. SequenceExample contexts use all of it too (:mod:`unihub.formats.tfrecord.sequence`).
"""

from __future__ import annotations

import decimal
import functools
import hashlib
import heapq
import json
import math
import mmap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from unihub.errors import FormatError, SchemaError
from unihub.formats.tfrecord.example import Feature, NoFeatures, encode_entries, encode_feature, encode_scalar, ld
from unihub.images import decoders as images
from unihub.schema import dtypes, image_checks
from unihub.schema.codecs import CompressedImageCodec, ScalarCodec, TensorCodec
from unihub.schema.image_checks import ValidateImages
from unihub.schema.shapes import fixed_dims
from unihub.schema.unischema import Shape, Unischema, UnischemaField

SHAPE_SUFFIX = "/shape"
#: the row field that names each record's order of features on the wire, where records disagree on it
#: (see :func:`order_id`); no such field (or a null in it): the dataset's one order, ``feature_order``
ORDER_FIELD = "__feature_order__"
#: distinct orders a dataset keeps (``feature_orders``); past them, records keep the one order, flagged
ORDERS_KEPT = 1024
#: the order of an Example with no features field (``b''``, as TensorFlow serializes ``tf.train.Example()``),
#: apart from ``()``, an empty one (``0a 00``): where records of both kinds are mixed, the row's order says which
NO_FEATURES = None


# -- what a scan saw ----------------------------------------------------------------------------
@dataclass
class _Stats:
    kinds: set[str] = field(default_factory=set)
    present: int = 0
    lengths: set[int] = field(default_factory=set)
    images: set[str] = field(default_factory=set)
    sizes: set[tuple[int, int, int]] = field(default_factory=set)
    all_images: bool = True
    utf8: bool = True
    shapes: set[tuple[int, ...]] = field(default_factory=set)
    #: list kind -> the first record that held it ("path record i"), so a mixed feature names both
    seen_at: dict[str, str] = field(default_factory=dict)
    #: the features right before this one on the wire in some record (see :func:`order_on_wire`)
    after: set[str] = field(default_factory=set)
    #: the kinds of the empty lists it held, None for a Feature with no list set (``tf.train.Feature()``,
    #: what touching ``feature["x"]`` leaves): TensorFlow reads both as no values, their bytes differ
    empty_kinds: set[str | None] = field(default_factory=set)

    def add(self, kind: str | None, values: Any, where: str | None = None) -> None:
        self.present += 1
        self.lengths.add(len(values))
        if not len(values):
            self.empty_kinds.add(kind)
        if kind is None:
            return
        self.add_kind(kind, where)
        if kind == "bytes":
            self.add_bytes(values)

    def add_kind(self, kind: str, where: str | None) -> None:
        """Note that a record (``where``, if known) held a ``kind`` list."""
        self.kinds.add(kind)
        if where is not None:
            self.seen_at.setdefault(kind, where)

    def add_bytes(self, values: Iterable[bytes]) -> None:
        """Look at bytes values (one feature's or many records'): images? UTF-8 text?"""
        values = list(values)
        if values and (self.all_images or self.utf8):
            data = b"".join(values)
            ends = np.cumsum([len(v) for v in values], dtype=np.int64)
            self.add_byte_spans(np.frombuffer(data, np.uint8), data, ends - [len(v) for v in values], ends)

    def add_byte_spans(self, arr: np.ndarray, data: bytes | mmap.mmap, starts: np.ndarray, ends: np.ndarray) -> None:
        """:meth:`add_bytes` of the values ``data[starts[i]:ends[i]]`` (``arr`` views ``data``),
        images grouped by header (:func:`images.image_sizes`) rather than parsed one by one."""
        if self.all_images:
            for size, fmt, rows in images.image_size_groups(arr, starts, ends):
                if size is None:  # a PNG/JPEG signature with a header cut or corrupt is a bad image, not bytes
                    start = int(starts[rows[0]])
                    fmt = images.detect_format(arr[start:min(int(ends[rows[0]]), start + 8)].tobytes())
                    if fmt is None:
                        self.all_images = False
                        break
                    self.images.add(fmt)
                    continue
                self.images.add(fmt or "png")
                self.sizes.add(size)
        if self.utf8:
            view = memoryview(data)
            for a, b in zip(starts.tolist(), ends.tolist()):
                try:
                    str(view[a:b], "utf-8")
                except UnicodeDecodeError:
                    self.utf8 = False
                    break

    def merge(self, other: _Stats) -> None:
        """Add what ``other`` saw (the scans of two sets of records, as if one)."""
        self.kinds |= other.kinds
        self.present += other.present
        self.lengths |= other.lengths
        self.images |= other.images
        self.sizes |= other.sizes
        self.all_images = self.all_images and other.all_images
        self.utf8 = self.utf8 and other.utf8
        self.shapes |= other.shapes
        for kind, where in other.seen_at.items():
            self.seen_at.setdefault(kind, where)
        self.after |= other.after
        self.empty_kinds |= other.empty_kinds


class Scan(dict[str, _Stats]):
    """A scan's statistics per feature, and the distinct orders its records had their features in
    (up to one past :data:`ORDERS_KEPT`; :data:`NO_FEATURES` for a record with no features field), and whether
    its records without features held an empty features field (True: ``0a 00``) or none (False: ``b''``): what
    an export needs to write each record as it was."""

    def __init__(self) -> None:
        super().__init__()
        self.orders: set[tuple[str, ...] | None] = set()
        self.empty_features: set[bool] = set()

    def add_order(self, names: tuple[str, ...] | None) -> None:
        if len(self.orders) <= ORDERS_KEPT:
            self.orders.add(names)


def add_example(stats: dict[str, _Stats], example: dict[str, Feature], where: str | None = None) -> None:
    """Count one parsed Example (``where``: ``"path record i"``) into the per-feature statistics of a scan;
    ``example`` in wire order (as parse_example gives it), whose neighbours :func:`order_on_wire` orders
    (and, for a :class:`Scan`, whose order it keeps)."""
    if isinstance(stats, Scan):
        stats.add_order(NO_FEATURES if isinstance(example, NoFeatures) else tuple(example))
        if not example:
            stats.empty_features.add(not isinstance(example, NoFeatures))
    previous = None
    for name, (kind, values) in example.items():
        stat = stats.setdefault(name, _Stats())
        stat.add(kind, values, where)
        if previous is not None:
            stat.after.add(previous)
        previous = name
        if name.endswith(SHAPE_SUFFIX) and kind == "int64":
            stat.shapes.add(tuple(int(v) for v in values))


def _merge_scans(parts: Sequence[tuple[dict[str, _Stats], int]]) -> tuple[Scan, int]:
    stats = Scan()
    for part, _ in parts:
        if isinstance(part, Scan):
            for names in part.orders:
                stats.add_order(names)
            stats.empty_features |= part.empty_features
        for name, stat in part.items():
            if name in stats:
                stats[name].merge(stat)
            else:
                stats[name] = stat
    return stats, sum(total for _, total in parts)


def without_kind(stats: Mapping[str, _Stats]) -> tuple[list[str], list[str]]:
    """The features whose empty lists were all Features with no list set (an export writes theirs so), and
    those where some were and some were lists of a kind (an export writes every one with a list)."""
    kindless = sorted(n for n, s in stats.items() if s.empty_kinds == {None})
    mixed = sorted(n for n, s in stats.items() if None in s.empty_kinds and len(s.empty_kinds) > 1)
    return kindless, mixed


def empty_means_null(stats: _Stats, total: int) -> bool:
    """True when a feature holds one value or an empty list in every record (never absent): its field
    is a nullable single value whose None stands for the empty list."""
    return stats.lengths == {0, 1} and stats.present == total


def shape_features(stats: dict[str, _Stats]) -> list[str]:
    """The features whose ``<name>/shape`` feature holds each record's shape: an int64 list of one
    length (the rank) and no negative size, beside numbers, in the same records, whose sizes are the
    counts of values the records hold (each record's size is its count, so the two sets are equal). Any
    other ``<name>/shape`` is a feature like the rest (kept as a field)."""
    bases = []
    for name, stat in stats.items():
        base = stats.get(name[:-len(SHAPE_SUFFIX)]) if name.endswith(SHAPE_SUFFIX) else None
        if base is None or stat.kinds != {"int64"} or len(stat.lengths) != 1 or stat.present != base.present:
            continue
        if base.kinds and base.kinds <= {"float", "int64"} and all(min(s, default=0) >= 0 for s in stat.shapes) \
                and {math.prod(s) for s in stat.shapes} == base.lengths:
            bases.append(name[:-len(SHAPE_SUFFIX)])
    return sorted(bases)


def order_on_wire(after: Mapping[str, Iterable[str]], what: str = "features") -> tuple[list[str], str | None]:
    """``(order, None)``: the one order of features on the wire that every scanned record follows; or,
    where records disagree, ``(the first seen first, why an export is not byte-exact)``.

    ``after``: each feature (first seen first) -> the features right before it in some record
    (:attr:`_Stats.after`); ``what`` they are (features, feature lists), for the reason.

    Why: ``Features.feature`` is a protobuf map, serialized in the writer's order; TensorFlow's (upb's)
    is a hash order, neither insertion nor name order, seeded per process (and another once the table
    grows: records with more features may order the common ones otherwise). An export writes features
    in this order (:func:`example_encoder`), so a record that follows it comes back byte for byte. The
    records agree on one order exactly when these links have no cycle; then any order keeping every
    link (here: the first seen first, where they leave a choice) is every record's. Records that
    disagree (shards written by different processes, maps of other sizes, a writer ordering each record
    its own way) cannot all come back in one order: the first seen first is kept, and the reason is
    returned; each row then names its own order (:func:`order_table`, :data:`ORDER_FIELD`).
    """
    names = list(after)  # first seen first
    before = {name: {a for a in after[name] if a in after and a != name} for name in names}
    followers: dict[str, list[str]] = {name: [] for name in names}
    for name in names:
        for previous in before[name]:
            followers[previous].append(name)
    rank = {name: i for i, name in enumerate(names)}
    waiting = {name: len(before[name]) for name in names}
    ready = [rank[name] for name in names if not waiting[name]]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:  # Kahn's topological sort, the first seen first where the links leave a choice
        name = names[heapq.heappop(ready)]
        order.append(name)
        for follower in followers[name]:
            waiting[follower] -= 1
            if not waiting[follower]:
                heapq.heappush(ready, rank[follower])
    placed = set(order)
    left = [name for name in names if name not in placed]
    if not left:
        return order, None
    shown = ", ".join(repr(n) for n in left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
    return names, (f"records order the {what} {shown} differently (TensorFlow's writer orders a map by a hash "
                   "seeded per process, and by its size: files written by different processes, or records holding "
                   f"more features, differ), so an export writes some records' {what} in another order: the same "
                   "messages, other bytes")


@functools.lru_cache(maxsize=4 * ORDERS_KEPT)
def order_id(names: tuple[str, ...] | None, lists: tuple[str, ...] | None = None) -> int:
    """A record's order of features (its names on the wire, :data:`NO_FEATURES` for an Example with no
    features field; a SequenceExample's: its context's, and its
    feature ``lists``) as the number its row's :data:`ORDER_FIELD` holds: 8 bytes of a hash of the
    names, a signed int64. A hash, not an index into a table: the same in
    every process and dataset, so rows read by forked workers, copied or appended from another dataset
    name their order in any table that holds it, and an export checks a table against its keys
    (:func:`features_encoder`): a lost or foreign table is refused, never written wrong."""
    key = names if lists is None else {"context": names, "feature_lists": lists}
    digest = hashlib.blake2b(json.dumps(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def order_table(orders: Iterable[tuple[str, ...] | None]) -> dict[str, Any]:
    """The ``feature_orders`` a dataset keeps: each distinct order of its records by its
    :func:`order_id` (a string: JSON's keys are), the names in it (None: :data:`NO_FEATURES`); empty past
    :data:`ORDERS_KEPT` orders."""
    orders = list(orders)
    if len(orders) > ORDERS_KEPT:
        return {}
    return {str(order_id(names)): None if names is NO_FEATURES else list(names)
            for names in sorted(orders, key=lambda names: (names is NO_FEATURES, names or ()))}


def sequence_order_table(orders: Iterable[tuple[tuple[str, ...], tuple[str, ...]]]) -> dict[str, Any]:
    """:func:`order_table` of SequenceExamples' ``(context, feature lists)`` orders."""
    orders = list(orders)
    if len(orders) > ORDERS_KEPT:
        return {}
    return {str(order_id(context, lists)): {"context": list(context), "feature_lists": list(lists)}
            for context, lists in sorted(orders)}


def ordered_rows(schema: Unischema, make: Callable[[Any], Callable[[Mapping[str, Any], int], Any]],
                 orders: Mapping[str, Any] | None, number_of: Callable[[Any], int]
                 ) -> Callable[[Mapping[str, Any], int], Any]:
    """``(column batch, row) -> make(row's order)(batch, row)``: ``make(None)`` for rows without an
    :data:`ORDER_FIELD` value, else ``make(orders[its number])``, made once per order. An order ``orders``
    lacks, or holds under another number (``number_of(entry)``: a table not this dataset's), is a
    FormatError: the row's bytes cannot be told, and a guess would be silently wrong."""
    default = make(None)
    if ORDER_FIELD not in schema.fields:
        return default
    table = dict(orders or {})
    made: dict[int, Callable[[Mapping[str, Any], int], Any]] = {}
    missing = object()

    def encode(batch: Mapping[str, Any], row: int) -> Any:
        number = batch[ORDER_FIELD][row] if ORDER_FIELD in batch else None
        if number is None:
            return default(batch, row)
        encoder = made.get(number)
        if encoder is None:
            entry = table.get(str(number), missing)  # None: NO_FEATURES, a record with no features to order
            if entry is missing or number_of(entry) != number:
                problem = "lacks it" if entry is missing else "holds another order under it (a table not this dataset's)"
                raise FormatError(f"row {row} of a batch: its {ORDER_FIELD} {number} names an order of features "
                                  f"that the dataset's tfrecord.feature_orders ({len(table)} orders) {problem}; "
                                  f"keep the metadata with the rows (a copy, an append), or drop {ORDER_FIELD} "
                                  "to write the features in the dataset's one order")
            encoder = made[number] = make(entry)
        return encoder(batch, row)

    return encode


def order_field() -> UnischemaField:
    """The field an ingest adds where records disagree on their features' order (see :func:`order_id`):
    every row it reads has one, so not nullable (a nullable field would also get a ``<name>_is_present``
    mask in TensorFlow's readers, and no namedtuple field may start with an underscore)."""
    return UnischemaField(ORDER_FIELD, np.int64, (), ScalarCodec(pa.int64()), False)


def fields_from_stats(stats: dict[str, _Stats], total: int) -> list[UnischemaField]:
    """The fields of features seen with ``stats`` in ``total`` records, sorted by name; a ``<name>/shape``
    feature that holds ``<name>``'s shapes (:func:`shape_features`) gives them instead of being a field."""
    shaped = set(shape_features(stats))
    sidecars = {name + SHAPE_SUFFIX for name in shaped}
    return [_infer_field(n, s, total, stats.get(n + SHAPE_SUFFIX) if n in shaped else None)
            for n, s in sorted(stats.items()) if n not in sidecars]


def mixed_kinds(stats: _Stats) -> str:
    """``int64 in some records (a.tfrecord record 0) and float in others (b.tfrecord record 7)``."""
    kinds = sorted(stats.kinds)
    first = [f"{kind} in {'some records' if i == 0 else 'others'}"
             + (f" ({stats.seen_at[kind]})" if kind in stats.seen_at else "") for i, kind in enumerate(kinds)]
    return ", ".join(first[:-1]) + " and " + first[-1]


def _infer_field(name: str, stats: _Stats, total: int, shape_stats: _Stats | None) -> UnischemaField:
    """The field of feature ``name``, seen with ``stats`` in ``total`` records (``shape_stats``: its
    ``/shape`` feature's, where that holds its shapes)."""
    if len(stats.kinds) > 1:
        raise SchemaError(f"TFRecord feature {name!r} holds {mixed_kinds(stats)}; give a schema file that says "
                          "which to read")
    kind = next(iter(stats.kinds), "bytes")
    # one value or an empty list in every record: a nullable single value, None for the empty list
    # (export writes it back as one); absent in some records and empty in others: a list, so that
    # absent (None) and empty stay apart
    empty_as_null = empty_means_null(stats, total)
    nullable = stats.present < total or empty_as_null
    lengths = stats.lengths - {0} if empty_as_null else stats.lengths
    constant = next(iter(lengths)) if len(lengths) == 1 else None
    if kind == "bytes":
        return _bytes_field(name, stats, constant, nullable)
    return _number_field(name, kind, shape_stats, constant, nullable)


def _bytes_field(name: str, stats: _Stats, constant: int | None, nullable: bool) -> UnischemaField:
    """A bytes feature's field: an image (one in every record, all images), text or bytes."""
    if constant == 1 and stats.all_images and stats.images:
        heights, widths, channels = ({s[i] for s in stats.sizes} for i in range(3))
        dims = [d.pop() if len(d) == 1 else None for d in (heights, widths, channels)]
        image_shape = dims[:2] if dims[2] == 1 else dims
        codec = CompressedImageCodec("jpeg" if stats.images == {"jpeg"} else "png")
        return UnischemaField(name, np.uint8, tuple(image_shape), codec, nullable)
    text_dtype, arrow = (np.str_, pa.string()) if stats.utf8 else (np.bytes_, pa.binary())
    if constant == 1:
        return UnischemaField(name, text_dtype, (), ScalarCodec(arrow), nullable)
    return UnischemaField(name, text_dtype, (constant if constant else None,), None, nullable)


def _number_field(name: str, kind: str, shape_stats: _Stats | None, constant: int | None,
                  nullable: bool) -> UnischemaField:
    """An int64 or float feature's field: a tensor shaped by its ``/shape`` feature, a scalar, or a list."""
    dtype, arrow = (np.int64, pa.int64()) if kind == "int64" else (np.float32, pa.float32())
    if shape_stats is not None:
        shapes = shape_stats.shapes
        rank = next(iter(shape_stats.lengths))
        shape: Shape = next(iter(shapes)) if len(shapes) == 1 else tuple(
            seen.pop() if len(seen := {s[i] for s in shapes}) == 1 else None for i in range(rank))
        return UnischemaField(name, dtype, shape, TensorCodec(), nullable)
    if constant == 1:
        return UnischemaField(name, dtype, (), ScalarCodec(arrow), nullable)
    return UnischemaField(name, dtype, (constant if constant else None,), TensorCodec(), nullable)


# -- reading helpers -------------------------------------------------------------------------
_ABSENT: Feature = (None, None)


# -- what a schema would lose --------------------------------------------------------------------
UNLISTED = ("has no field in the schema, and its values would be lost; add it to the schema, or name the "
            "features to convert with --option fields=...")


def unlisted_check(fields: Sequence[UnischemaField], selected: Sequence[str] | None
                   ) -> Callable[[Iterable[str]], str | None]:
    """``check(feature names)``: the first feature of a record that no field reads (its values would
    be lost), or None. Features outside ``selected`` (the ``fields`` option) are left out on purpose."""
    known = {f.name for f in fields} | {f.name + SHAPE_SUFFIX for f in fields if f.shape and f.dtype.kind in "biuf"}
    chosen = None if selected is None else set(selected)

    def check(names: Iterable[str]) -> str | None:
        for name in names:
            if name not in known and (chosen is None or name in chosen):
                return name
        return None

    return check


class _Mismatch(Exception):
    def __init__(self, feature: str | None, reason: str) -> None:
        super().__init__(reason)
        self.feature, self.reason = feature, reason


class _BadImage(_Mismatch):
    """An image that fails its check (:mod:`unihub.schema.image_checks`): a bad record, never a
    sign that a provisional schema was outgrown, so it names no feature (its reason does)."""

    def __init__(self, feature: str, reason: str) -> None:
        super().__init__(None, f"feature {feature!r}: {reason}")


@dataclass(frozen=True)
class _Plan:
    """How one field is read from Examples: worked out once per read, not per record."""

    field: UnischemaField
    category: str  # "image" | "str" | "bytes" (scalars), "text" (lists), "scalar" | "tensor" (numbers)
    dtype: np.dtype
    size: int | None  # values per row for fixed shapes
    text: bool = False  # read from a bytes list (category image, str, bytes or text)
    single: bool = False  # one value per row (category image, str, bytes or scalar)
    validate: ValidateImages = "none"  # category image: how each image is checked (image_checks)
    fit: bool = True  # ... and whether against the field's shape (False: a provisional schema's)
    shaped: bool = True  # category tensor: a <name>/shape feature gives each row's shape (no field of its own)

    @classmethod
    def of(cls, f: UnischemaField, validate: ValidateImages = "none", fit: bool = True,
           fields: Iterable[str] = ()) -> _Plan:
        """The plan of field ``f`` (``fields``: the schema's names; a ``<name>/shape`` among them is a field, not
        ``f``'s shapes)."""
        text = f.numpy_dtype in (np.str_, np.bytes_) or not _numeric(f.numpy_dtype)
        if isinstance(f.codec, CompressedImageCodec):
            category = "image"
        elif text:
            category = ("str" if f.numpy_dtype is np.str_ else "bytes") if f.shape == () else "text"
        else:
            category = "scalar" if f.shape == () else "tensor"
        if f.name == ORDER_FIELD:
            cls = _OrderPlan
        return cls(f, category, f.dtype, int(np.prod(fixed_dims(f.shape))) if f.is_fixed_shape else None,
                   category in ("image", "str", "bytes", "text"), category in ("image", "str", "bytes", "scalar"),
                   validate if category == "image" else "none", fit, f.name + SHAPE_SUFFIX not in fields)

    def checked_image(self, value: bytes) -> bytes:
        """``value``, or :class:`_BadImage` when it fails this plan's image check. Under a provisional
        schema (not ``fit``) a value with no PNG/JPEG signature outgrows it, whatever ``validate`` says:
        the full scan makes such a feature bytes (``_Stats.all_images``), so the sample must not decide."""
        if not self.fit and images.detect_format(value) is None:
            raise _Mismatch(self.field.name, "is not a PNG or JPEG image in every record")
        if self.validate != "none":
            problem = image_checks.image_problem(value, self.field, self.validate, fit=self.fit)
            if problem is not None:
                raise _BadImage(self.field.name, problem)
        return value

    def read(self, example: Mapping[str, Feature]) -> Any:
        """This field's value in ``example`` (fixed-shape tensors flat); raises _Mismatch."""
        f = self.field
        kind, values = example.get(f.name, _ABSENT)
        # a Feature with no list set is an empty list, not an absent feature, where the field holds one
        if values is None or (not len(values) and (self.single or (kind is None and self.size is not None))):
            if f.nullable:
                return None
            if values is None:
                raise _Mismatch(f.name, "missing, and the field is not nullable")
        category = self.category
        if kind is not None and (kind == "bytes") != self.text:
            raise _Mismatch(f.name, f"holds a {kind} list, the schema says {dtypes.dtype_name(f.numpy_dtype)}")
        if self.single:
            if len(values) != 1:
                raise _Mismatch(f.name, f"expected 1 value, found {len(values)}")
            if category == "scalar" and self.dtype not in _EXACT_FROM_PROTO.get(kind, ()):
                return _exact(self, np.asarray(values[:1]))[0]  # another dtype than the proto's: checked here
            if category == "image":
                return self.checked_image(values[0])
            if category != "str":
                return values[0]
        return self._values(values, example)

    def _values(self, values: Any, example: Mapping[str, Feature]) -> Any:
        """The value of a text field (one string, or a list) or of a numeric list or tensor (fixed shapes
        flat), from the feature's ``values`` (of the right kind); raises _Mismatch."""
        f = self.field
        category = self.category
        try:
            if category == "str":
                return values[0].decode("utf-8")
            if category == "text":
                array = np.empty(len(values), dtype=object)  # object, not "S": numpy strips trailing NULs
                array[:] = [v.decode("utf-8") for v in values] if f.numpy_dtype is np.str_ else values
            else:
                array = _exact(self, values)
        except UnicodeDecodeError as exc:
            raise _Mismatch(f.name, f"not UTF-8 text: {exc}") from None
        if self.size is not None:
            if array.size != self.size:
                raise _Mismatch(f.name, f"expected {self.size} values for shape {f.shape}, found {array.size}")
            return array if category == "tensor" else array.reshape(f.shape)
        return _reshape(f, array, example if self.shaped else {})

    def column(self, values: list[Any]) -> Any:
        """One batch's column from the values :meth:`read` returned."""
        f = self.field
        if self.category == "scalar":
            if any(v is None for v in values):
                return [None if v is None else f.numpy_dtype(v) for v in values]
            return np.asarray(values, dtype=self.dtype)  # read() checked each value fits
        if self.category == "tensor" and self.size is not None:
            if any(v is None for v in values):
                return [None if v is None else v.reshape(f.shape) for v in values]
            return (np.concatenate(values) if values else np.empty(0, self.dtype)).reshape((-1, *f.shape))
        return values


#: the dtypes every value of a proto list kind converts to exactly
_EXACT_FROM_PROTO: dict[str | None, tuple[np.dtype, ...]] = {
    "int64": (np.dtype(np.int64),), "float": (np.dtype(np.float32), np.dtype(np.float64))}


def _exact(plan: _Plan, values: Any) -> np.ndarray:
    """``values`` in the field's dtype, or :class:`_Mismatch` when one would change (a narrower dtype)."""
    try:
        return dtypes.cast_exactly(np.asarray(values), plan.dtype)
    except dtypes.InexactCast as exc:
        raise _Mismatch(plan.field.name, str(exc)) from None


def _check_int64(name: str, value: Any) -> None:
    """Refuse a uint64 value past int64's range, which TFRecord's int64 list would hold as a negative number
    (``tf.train.Int64List`` refuses it too)."""
    array = np.asarray(value)
    if array.size and int(array.max()) > np.iinfo(np.int64).max:
        raise SchemaError(f"field {name!r}: {int(array.max())} does not fit TFRecord's int64 (it would read back as "
                          f"{int(array.max()) - 2**64}); TensorFlow's tf.train.Int64List refuses it too")


def _numeric(dtype: Any) -> bool:
    return isinstance(dtype, type) and issubclass(dtype, np.generic) and np.dtype(dtype).kind in "biuf"


def _reshape(f: UnischemaField, array: np.ndarray, example: Mapping[str, Feature]) -> np.ndarray:
    sidecar = example.get(f.name + SHAPE_SUFFIX)
    if sidecar is not None and sidecar[0] == "int64":
        shape = tuple(int(d) for d in sidecar[1])
        if len(shape) != len(f.shape) or any(d is not None and d != s for d, s in zip(f.shape, shape)) or \
                int(np.prod(shape)) != array.size:
            raise _Mismatch(f.name, f"{array.size} values with shape {shape} do not fit {f.shape}")
        return array.reshape(shape)
    if f.shape[0] is None and None not in f.shape[1:]:
        inner = int(np.prod(fixed_dims(f.shape[1:])))
        if inner and array.size % inner == 0:
            return array.reshape((-1, *f.shape[1:]))
        raise _Mismatch(f.name, f"{array.size} values do not fill rows of shape {f.shape[1:]}")
    raise _Mismatch(f.name, f"shape {f.shape} needs a {f.name + SHAPE_SUFFIX!r} feature with each row's shape")


class _OrderPlan(_Plan):
    """:data:`ORDER_FIELD`: not a feature, each record's order of features (:func:`order_id`)."""

    def read(self, example: Mapping[str, Feature]) -> Any:
        return order_id(NO_FEATURES if isinstance(example, NoFeatures) else tuple(example))


# -- writing helpers -------------------------------------------------------------------------
RowEncoder = Callable[[Mapping[str, Any], int], bytes]


def example_encoder(schema: Unischema, empty_as_null: Sequence[str] = (), shapes: Sequence[str] = (),
                    order: Sequence[str] = (), orders: Mapping[str, Any] | None = None, *,
                    empty_without_kind: Sequence[str] = (), empty_context: bool = True) -> RowEncoder:
    """``(column batch, row) -> serialized Example`` for ``schema``; fields in ``empty_as_null``
    write None as an empty list, other None values leave their feature out; fields in ``shapes`` write
    a ``<name>/shape`` feature (as do those whose shape the flat values do not determine); fields in
    ``empty_without_kind`` write an empty list as a Feature with no list set. Features
    are written in ``order`` (the source's, see :func:`order_on_wire`), those it lacks after them in
    the schema's; rows with an :data:`ORDER_FIELD` in theirs, from ``orders`` (see :func:`features_encoder`).
    A row without features has an empty features field only with ``empty_context``, and not where its
    :data:`ORDER_FIELD` says its record had none (:data:`NO_FEATURES`: records of both kinds)."""
    entries = features_encoder(schema, empty_as_null, shapes, order, orders, empty_without_kind)
    bare = order_id(NO_FEATURES)
    if not empty_context or ORDER_FIELD not in schema.fields or str(bare) not in (orders or {}):
        return lambda batch, row: encode_entries(entries(batch, row), empty_context)
    return lambda batch, row: encode_entries(entries(batch, row), batch[ORDER_FIELD][row] != bare
                                             if ORDER_FIELD in batch else True)


EntriesEncoder = Callable[[Mapping[str, Any], int], list[tuple[bytes, bytes]]]


def features_encoder(schema: Unischema, empty_as_null: Sequence[str] = (), shapes: Sequence[str] = (),
                     order: Sequence[str] = (), orders: Mapping[str, Any] | None = None,
                     empty_without_kind: Sequence[str] = ()) -> EntriesEncoder:
    """``(column batch, row) -> [(encoded name, serialized Feature), ...]``: the ``Features`` map of
    :func:`example_encoder` (an Example's, a SequenceExample's context), in ``order``; where ``schema``
    has :data:`ORDER_FIELD`, each row with one in its own, from ``orders`` (``feature_orders``, see
    :func:`order_table`). A row naming an order ``orders`` lacks (or holds under another number: a
    table not this dataset's) is a FormatError: its bytes cannot be told."""
    features = without_order(schema)
    return ordered_rows(schema, lambda names: _entries_in(features, empty_as_null, shapes,
                                                          order if names is None else names, empty_without_kind),
                        orders, lambda names: order_id(NO_FEATURES if names is NO_FEATURES else tuple(names)))


def without_order(schema: Unischema) -> Unischema:
    """``schema`` less its :data:`ORDER_FIELD`, if any: the fields written as features."""
    if ORDER_FIELD not in schema.fields:
        return schema
    return schema.create_schema_view([f for f in schema if f.name != ORDER_FIELD])


def _entries_in(schema: Unischema, empty_as_null: Sequence[str], shapes: Sequence[str],
                order: Sequence[str], empty_without_kind: Sequence[str] = ()) -> EntriesEncoder:
    """:func:`features_encoder` of features only, in one ``order``."""
    encoders = in_order(_encoders(schema, empty_as_null, shapes, empty_without_kind), order)
    if isinstance(encoders, tuple):  # a /shape feature apart from its field: each row's entries sorted
        encoders, rank = encoders

        def sorted_entries(batch: Mapping[str, Any], row: int) -> list[tuple[bytes, bytes]]:
            return sorted((entry for name, empty, enc, _ in encoders if name in batch
                           and ((value := batch[name][row]) is not None or empty) for entry in enc(value)),
                          key=lambda entry: rank[entry[0]])

        return sorted_entries

    def entries(batch: Mapping[str, Any], row: int) -> list[tuple[bytes, bytes]]:
        return [entry for name, empty, enc, _ in encoders if name in batch
                and ((value := batch[name][row]) is not None or empty) for entry in enc(value)]

    return entries


_Encoder = tuple[str, bool, Callable[[Any], list[tuple[bytes, bytes]]], tuple[str, ...]]


def in_order(encoders: list[_Encoder], order: Sequence[str]
             ) -> list[_Encoder] | tuple[list[_Encoder], dict[bytes, float]]:
    """``encoders`` (see :func:`_encoders`) sorted so that their features follow ``order`` (features it
    lacks after it, in the schema's order; a ``/shape`` feature it lacks right after its field). Where
    sorting the fields cannot do it (a ``/shape`` feature apart from its field in ``order``), also each
    encoded key's rank, to sort each row's entries by."""
    if not order:
        return encoders
    place = {name: float(i) for i, name in enumerate(order)}
    for i, (name, *_) in enumerate(encoders):
        place.setdefault(name, len(order) + i)
    for _, _, _, written in encoders:
        for name in written[1:]:
            place.setdefault(name, place[written[0]] + 0.5)
    encoders = sorted(encoders, key=lambda encoder: place[encoder[0]])
    ranks = [place[name] for *_, written in encoders for name in written]
    if ranks == sorted(ranks):
        return encoders
    return encoders, {ld(1, name.encode()): rank for name, rank in place.items()}


def _encoders(schema: Unischema, empty_as_null: Sequence[str] = (),
              shapes: Sequence[str] = (), empty_without_kind: Sequence[str] = ()) -> list[_Encoder]:
    """``(field name, None is an empty list, value -> [(encoded key, feature), ...], the features it writes)``
    for each field, checked up front."""
    out: list[_Encoder] = []
    for f in schema:
        key = ld(1, f.name.encode())
        kindless = f.name in empty_without_kind
        if f.name in empty_as_null:
            kind = "bytes" if not _numeric(f.numpy_dtype) or isinstance(f.codec, CompressedImageCodec) else \
                "float" if np.dtype(f.numpy_dtype).kind == "f" else "int64"
            empty = [(key, b"" if kindless else encode_feature(kind, []))]
        else:
            empty = []
        encode: Callable[[Any], list[tuple[bytes, bytes]]]
        sidecar: bytes | None = None
        if isinstance(f.codec, CompressedImageCodec):
            def encode_image(v: Any, f: UnischemaField = f, key: bytes = key) -> list[tuple[bytes, bytes]]:
                return [(key, ld(1, ld(1, f.codec.encode(f, v))))]  # type: ignore[union-attr]
            encode = encode_image
        elif not _numeric(f.numpy_dtype):
            if f.numpy_dtype not in (np.str_, np.bytes_, decimal.Decimal):
                raise SchemaError(f"field {f.name!r}: TFRecord stores numbers, bytes and strings, "
                                  f"not {dtypes.dtype_name(f.numpy_dtype)}")

            def encode_text(v: Any, f: UnischemaField = f, key: bytes = key) -> list[tuple[bytes, bytes]]:
                items = [v] if f.shape == () else list(np.asarray(v, dtype=object).ravel())
                blobs = [bytes(i) if isinstance(i, (bytes, bytearray, memoryview)) else str(i).encode() for i in items]
                return [(key, encode_feature("bytes", blobs))]
            encode = encode_text
        else:
            kind = "float" if np.dtype(f.numpy_dtype).kind == "f" else "int64"
            sidecar = ld(1, (f.name + SHAPE_SUFFIX).encode()) if f.shape.count(None) > 1 or None in f.shape[1:] \
                or (f.name in shapes and f.shape) else None

            def encode_numbers(v: Any, kind: str = kind, key: bytes = key, shape: Shape = f.shape,
                               sidecar: bytes | None = sidecar, name: str = f.name,
                               wide: bool = np.dtype(f.numpy_dtype) == np.uint64) -> list[tuple[bytes, bytes]]:
                if wide:
                    _check_int64(name, v)
                if shape == ():
                    return [(key, encode_scalar(kind, v))]
                array = np.asarray(v)
                entries = [(key, encode_feature(kind, array.ravel()))]
                return entries + [(sidecar, encode_feature("int64", array.shape))] if sidecar else entries
            encode = encode_numbers
        written: tuple[str, ...] = (f.name,) if sidecar is None else (f.name, f.name + SHAPE_SUFFIX)
        if kindless and f.shape != ():
            encode = _kindless_when_empty(encode, key)
        out.append((f.name, bool(empty), _or_empty(encode, empty), written))
    return out


def _kindless_when_empty(encode: Callable[[Any], list[tuple[bytes, bytes]]],
                         key: bytes) -> Callable[[Any], list[tuple[bytes, bytes]]]:
    """``encode``, with an empty value's own feature (key ``key``) written as a Feature with no list set,
    as the source's empty lists were (its ``/shape`` feature, if any, as ``encode`` writes it)."""
    def encode_kindless(value: Any) -> list[tuple[bytes, bytes]]:
        entries = encode(value)
        if np.size(value) == 0:
            return [(k, b"" if k == key else feature) for k, feature in entries]
        return entries

    return encode_kindless


def _or_empty(encode: Callable[[Any], list[tuple[bytes, bytes]]],
              empty: list[tuple[bytes, bytes]]) -> Callable[[Any], list[tuple[bytes, bytes]]]:
    """``encode``, with None encoded as ``empty`` (an empty list feature)."""
    if not empty:
        return encode
    return lambda value: empty if value is None else encode(value)


# -- what an export writes back ------------------------------------------------------------------
def export_options(extra: Mapping[str, Any], schema: Unischema) -> dict[str, Any]:
    """A TFRecord source's payload kind, feature lists, empty lists (of the fields ``schema``
    still has) and feature order, so an export gives the source back, record for record."""
    info = extra.get("tfrecord") or {} if extra.get("source_format") == "tfrecord" else {}
    options: dict[str, Any] = {"payload": info["payload"]} if info.get("payload") else {}
    for key in ("feature_lists", "empty_as_null", "empty_without_kind", "shape_features"):
        names = [name for name in info.get(key) or () if name in schema]
        if names:
            options[key] = names
    for key in ("feature_order", "feature_list_order"):  # names on the wire, /shape ones too: kept whole
        if info.get(key):
            options[key] = list(info[key])
    if info.get("feature_orders") and ORDER_FIELD in schema.fields:  # each row's own order
        options["feature_orders"] = dict(info["feature_orders"])
    if info.get("empty_context") is False:
        options["empty_context"] = False
    if info.get("tensor_encoding"):
        options["tensor_encoding"] = info["tensor_encoding"]
    return options
