"""``tf.train.SequenceExample`` records (video, audio, time series): wire codec, schema, reading.

``SequenceExample{context: Features = 1, feature_lists: FeatureLists = 2}``: the context is a
map of features exactly like an Example's; ``FeatureLists{map<string, FeatureList> = 1}`` maps a
name to ``FeatureList{repeated Feature = 1}``, one Feature per step.

In unihub, each context feature becomes a field as an Example's would, and each feature list a
field whose leading dimension is the step:

- every step of every record holds ``k`` values: shape ``(None,)`` for k = 1 (as TensorFlow's
  ``FixedLenSequenceFeature([])`` gives it), else ``(None, k)``; numbers with a TensorCodec;
- steps of different lengths (ragged): shape ``(None, None)``, no codec: the Arrow-native list of
  lists, read back as one list of values per step;
- bytes become ``str`` when every value is UTF-8 (written back as the same bytes);
- a list some records lack is nullable (``None``); a list with no steps is an empty array.

A feature list whose name is also a context feature's is named ``feature_lists/<name>``. Which
fields are feature lists is the reading option ``feature_lists`` (set by the schema inference, so
conversion tasks and exports know it), and what an export writes back as feature lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from unihub.formats.tfrecord.example import Feature, ld, message_fields, parse_feature, parse_features
from unihub.schema.codecs import TensorCodec
from unihub.schema.unischema import UnischemaField

LIST_PREFIX = "feature_lists/"
_DTYPES = {"float": np.float32, "int64": np.int64}


class Mismatch(Exception):
    """One record's feature list does not fit its field: ``feature`` and ``reason``."""

    def __init__(self, feature: str, reason: str) -> None:
        super().__init__(reason)
        self.feature, self.reason = feature, reason


# -- wire format -----------------------------------------------------------------------------
def parse_sequence_example(buf: bytes) -> tuple[dict[str, Feature], dict[str, list[Feature]] | None]:
    """A serialized SequenceExample -> ``(context, feature_lists)``; ``feature_lists`` is None when the
    record has none (it then reads as a plain Example). ValueError when malformed or another message."""
    context: dict[str, Feature] = {}
    lists: dict[str, list[Feature]] | None = None
    try:
        for number, wire, start, stop in message_fields(buf):
            if number == 1 and wire == 2:
                context.update(parse_features(buf, start, stop))
            elif number == 2 and wire == 2:
                lists = {} if lists is None else lists
                _parse_feature_lists(buf, start, stop, lists)
            else:
                raise ValueError(f"it holds protobuf field {number} (wire type {wire}), which SequenceExamples "
                                 "do not have")
    except (IndexError, ValueError, TypeError) as exc:
        raise ValueError(f"malformed tf.train.SequenceExample: {exc}") from exc
    return context, lists


def _parse_feature_lists(buf: bytes, pos: int, end: int, out: dict[str, list[Feature]]) -> None:
    for number, wire, start, stop in message_fields(buf, pos, end):
        if number != 1 or wire != 2:
            continue
        name, steps = "", []
        for n2, w2, a2, b2 in message_fields(buf, start, stop):
            if n2 == 1 and w2 == 2:
                name = buf[a2:b2].decode("utf-8")
            elif n2 == 2 and w2 == 2:
                steps = [parse_feature(buf, a3, b3) for n3, w3, a3, b3 in message_fields(buf, a2, b2)
                         if n3 == 1 and w3 == 2]
        out[name] = steps


def encode_sequence_example(context: Sequence[tuple[bytes, bytes]], lists: Sequence[tuple[bytes, list[bytes]]],
                            *, empty_context: bool = True) -> bytes:
    """A serialized SequenceExample from ``(ld(1, name), feature)`` context entries and
    ``(ld(1, name), [feature per step])`` feature lists (the lists field only when there are lists; the
    context field without entries only with ``empty_context``: TensorFlow writes none where the
    context was never set)."""
    out = ld(1, b"".join([ld(1, key + ld(2, feature)) for key, feature in context])) \
        if context or empty_context else b""
    if lists:
        out += ld(2, b"".join([ld(1, key + ld(2, b"".join(ld(1, f) for f in steps))) for key, steps in lists]))
    return out


def has_context(buf: bytes) -> bool:
    """Whether a serialized SequenceExample holds the context field (empty or not)."""
    return any(number == 1 for number, _, _, _ in message_fields(buf))


# -- schema inference ------------------------------------------------------------------------
@dataclass
class ListStats:
    """What one feature list looked like over the records scanned."""

    kinds: set[str] = field(default_factory=set)
    present: int = 0
    step_lengths: set[int] = field(default_factory=set)
    utf8: bool = True
    #: the feature lists right before this one on the wire in some record (see tfschema.order_on_wire)
    after: set[str] = field(default_factory=set)

    def add(self, steps: list[Feature]) -> None:
        self.present += 1
        for kind, values in steps:
            if kind is not None:
                self.kinds.add(kind)
            self.step_lengths.add(len(values))
            if kind == "bytes" and self.utf8:
                try:
                    for value in values:
                        bytes(value).decode("utf-8")
                except UnicodeDecodeError:
                    self.utf8 = False


def list_field(name: str, stats: ListStats, total: int) -> UnischemaField:
    """The field of one feature list (see the module docstring); ValueError for mixed kinds."""
    if len(stats.kinds) > 1:
        raise ValueError(f"feature list {name!r} holds {sorted(stats.kinds)} values in different steps or records")
    kind = next(iter(stats.kinds), "bytes")
    nullable = stats.present < total
    k = next(iter(stats.step_lengths)) if len(stats.step_lengths) == 1 else None
    shape: tuple[int | None, ...] = (None,) if k == 1 else (None, k)
    if kind == "bytes":
        return UnischemaField(name, np.str_ if stats.utf8 else np.bytes_, shape, None, nullable)
    dtype = _DTYPES[kind]
    return UnischemaField(name, dtype, shape, TensorCodec() if k is not None else None, nullable)


def field_names(context: Sequence[str], lists: Sequence[str]) -> dict[str, str]:
    """Feature list name -> field name: the name itself, ``feature_lists/<name>`` where a context
    feature has it."""
    taken = set(context)
    return {name: LIST_PREFIX + name if name in taken else name for name in lists}


def list_name(field_name: str, context_names: set[str]) -> str:
    """The feature list a list field reads (the inverse of :func:`field_names`)."""
    bare = field_name.removeprefix(LIST_PREFIX)
    return bare if bare != field_name and bare in context_names else field_name


# -- reading ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepsPlan:
    """How one feature-list field is read from records: worked out once per read."""

    field: UnischemaField
    name: str  # the feature list's name in the records
    kind: str  # "bytes" | "float" | "int64"
    k: int | None  # values per step (None: ragged)

    @classmethod
    def of(cls, f: UnischemaField, name: str) -> StepsPlan:
        text = f.numpy_dtype in (np.str_, np.bytes_)
        kind = "bytes" if text else "float" if np.dtype(f.numpy_dtype).kind == "f" else "int64"
        k = 1 if len(f.shape) == 1 else f.shape[1] if len(f.shape) == 2 else None
        if len(f.shape) not in (1, 2) or f.shape[0] is not None:
            raise ValueError(f"field {f.name!r}: a feature list is stored with shape (None,), (None, k) or "
                             f"(None, None), not {f.shape}")
        return cls(f, name, kind, k)

    def read(self, lists: dict[str, list[Feature]] | None) -> Any:
        """This field's value in one record's feature lists; raises :class:`Mismatch`."""
        f = self.field
        steps = None if lists is None else lists.get(self.name)
        if steps is None:
            if f.nullable:
                return None
            raise Mismatch(self.name, "missing feature list, and the field is not nullable")
        values = self._checked(steps)
        if self.kind == "bytes":
            return self._text(values)
        dtype = _DTYPES[self.kind]
        if self.k is None:
            return [np.asarray(step, dtype) for step in values]
        flat = np.concatenate([np.asarray(step, dtype) for step in values]) if values else np.empty(0, dtype)
        return flat if self.k == 1 else flat.reshape(len(values), self.k)  # k = 0: (steps, 0)

    def _checked(self, steps: list[Feature]) -> list[Any]:
        """The values of each step, each of this plan's kind and (fixed ``k``) length; raises Mismatch."""
        values = []
        for kind, step in steps:
            if kind is not None and kind != self.kind:
                raise Mismatch(self.name, f"a step holds a {kind} list, the schema says {self.kind}")
            if self.k is not None and len(step) != self.k:
                raise Mismatch(self.name, f"a step holds {len(step)} values, the schema says {self.k}")
            values.append(step)
        return values

    def _text(self, values: list[Any]) -> Any:
        """Bytes steps as this field's strings or bytes: one per step (``k`` 1), else a list per step."""
        try:
            rows = [[bytes(v).decode("utf-8") if self.field.numpy_dtype is np.str_ else bytes(v) for v in step]
                    for step in values]
        except UnicodeDecodeError as exc:
            raise Mismatch(self.name, f"not UTF-8 text: {exc}") from None
        return [row[0] for row in rows] if self.k == 1 else rows
