"""What a TFRecord file's records are, and reading the ones that are not ``tf.train.Example``.

TFRecord frames any bytes. The records of real datasets are ``tf.train.Example`` (read by
:mod:`unihub.formats.tfrecord.format` and :mod:`unihub.formats.tfrecord.example_block`), ``tf.train.SequenceExample``
(:mod:`unihub.formats.tfrecord.sequence`), ``TensorProto`` (``tf.io.serialize_tensor``,
:mod:`unihub.formats.tfrecord.tensor_proto`) or opaque bytes. The ``payload`` reading option says which:

- ``auto`` (the default): the kind of the first record; a later record of another kind is an error
  naming it (a SequenceExample among Examples would lose its feature lists), and a first record
  that is none of the three is refused, naming it, rather than read as an empty Example;
- ``example``, ``sequence_example``, ``tensor``: every record must be one (a SequenceExample
  without feature lists is accepted under ``sequence_example``: it reads as an Example);
- ``bytes``: each record is kept whole in one ``record`` bytes field, whatever it holds.

A tensor payload becomes one field, ``tensor``: its dtype and shape from the protos (dimensions
that differ between records are ``None``); records of different dtypes or ranks are an error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from unihub.errors import FormatError, SchemaError
from unihub.formats.base import ColumnBatch, OnError, ReadReport, check_on_error
from unihub.formats.tfrecord.example import encode_feature, ld, message_fields
from unihub.formats.tfrecord.records import _fail
from unihub.formats.tfrecord.schema import (
    ORDER_FIELD,
    ORDERS_KEPT,
    RowEncoder,
    _Mismatch,
    _Plan,
    _Stats,
    add_example,
    features_encoder,
    fields_from_stats,
    order_field,
    order_id,
    order_on_wire,
    ordered_rows,
    sequence_order_table,
    shape_features,
    without_kind,
    without_order,
)
from unihub.formats.tfrecord.sequence import (
    LIST_PREFIX,
    ListStats,
    Mismatch,
    StepsPlan,
    encode_sequence_example,
    field_names,
    has_context,
    list_field,
    list_name,
)
from unihub.formats.tfrecord.sequence import parse_sequence_example as parse_sequence
from unihub.formats.tfrecord.tensor_proto import ENCODINGS, TensorProtoError, encode_tensor, parse_tensor
from unihub.runtime.memory import BatchCut
from unihub.schema.codecs import ScalarCodec, TensorCodec
from unihub.schema.unischema import Unischema, UnischemaField

if TYPE_CHECKING:
    from unihub.formats.tfrecord.format import TFRecordFormat

PAYLOADS = ("auto", "example", "sequence_example", "tensor", "bytes")
_TENSOR_FIELDS = 18  # TensorProto's field numbers run from 1 (dtype) to 18 (float8_val)
TENSOR_FIELD = "tensor"
BYTES_FIELD = "record"
_WHAT = {"example": "tf.train.Example", "sequence_example": "tf.train.SequenceExample",
         "tensor": "TensorProto (tf.io.serialize_tensor)"}


def classify(data: bytes) -> str | None:
    """``'example'``, ``'sequence_example'``, ``'tensor'``, or None for a record that is none of them."""
    if not data:
        return "example"  # an Example without features
    try:
        fields = {(number, wire) for number, wire, _, _ in message_fields(data)}
    except (IndexError, ValueError):
        return None
    if fields <= {(1, 2)}:
        return "example"
    if fields <= {(1, 2), (2, 2)}:
        return "sequence_example"
    if (1, 0) in fields and all(number <= _TENSOR_FIELDS for number, _ in fields):
        return "tensor"  # a TensorProto's layout: one unihub cannot store is refused by its dtype, by name
    return None


def detect(source: TFRecordFormat) -> str:
    """The payload kind of ``source``'s first readable record (``'example'`` when there is none)."""
    for path, index, offset, data in source.records("skip", ReadReport()):
        kind = classify(data)
        if kind is None:
            raise FormatError(f"{path}: record {index} at byte offset {offset} is not a tf.train.Example, "
                              f"SequenceExample or TensorProto ({_why_not(data)}); to keep each record as bytes, "
                              "pass --option payload=bytes", path=path, offset=offset)
        return kind
    return "example"


def _why_not(data: bytes) -> str:
    head = data[:16].hex(" ")
    try:
        numbers = sorted({n for n, _, _, _ in message_fields(data)})
    except (IndexError, ValueError) as exc:
        return f"{len(data)} bytes that are no protobuf message ({exc}), starting {head}"
    return f"a protobuf message with fields {numbers[:8]}, {len(data)} bytes starting {head}"


# -- schema inference ---------------------------------------------------------------------------
def infer_schema(source: TFRecordFormat, kind: str, sample_records: int | None) -> Unischema:
    """The schema of ``source``'s records (the first ``sample_records``) of payload ``kind``."""
    report = ReadReport()
    records = source.records(source.on_error, report)
    if sample_records is not None:
        records = (r for r, _ in zip(records, range(sample_records)))
    if kind == "bytes":
        total = sum(1 for _ in records)
        fields = [UnischemaField(BYTES_FIELD, np.bytes_, (), ScalarCodec(pa.binary()), False)]
    elif kind == "tensor":
        total, fields, encodings = _infer_tensor(records, source.on_error, report)
        source.tensor_encoding = ENCODINGS[0] if ENCODINGS[0] in encodings or not encodings else ENCODINGS[1]
        source.tensor_encoding_differs = not encodings
    else:
        total, fields = _infer_sequence(source, records, report)
    if total == 0:
        raise FormatError(f"{source.where}: no readable TFRecord records to infer a schema from (empty files, or "
                          "every record skipped as bad)", path=source.sources[0])
    return Unischema("TFRecord", fields)


_Orders = set[tuple[tuple[str, ...], tuple[str, ...]]]  # distinct (context features, feature lists) orders


def _infer_sequence(source: TFRecordFormat, records: Iterator[tuple[str, int, int, bytes]],
                    report: ReadReport) -> tuple[int, list[UnischemaField]]:
    """The fields of SequenceExample records (the context's, then the feature lists'), and their count;
    notes on ``source`` what the export needs (empty lists, shape features, orders on the wire)."""
    total, context, lists, orders, contexts = _scan_sequences(source, records, report)
    fields = fields_from_stats(context, total)
    names = field_names([f.name for f in fields], sorted(lists))
    try:
        fields += [list_field(names[name], stats, total) for name, stats in sorted(lists.items())]
    except ValueError as exc:
        raise SchemaError(f"{source.where}: {exc}; give a schema file that says which to read") from None
    source.options.setdefault("feature_lists", [names[name] for name in sorted(lists)])
    source.empty_as_null = sorted(n for n, s in context.items() if s.lengths == {0, 1} and s.present == total)
    source.shape_features = shape_features(context)
    source.empty_without_kind, source.empty_without_kind_differs = without_kind(context)
    source.empty_context = contexts != {False}  # every record without context features had no context field
    source.empty_context_differs = contexts == {False, True}
    if _note_orders(source, context, lists, orders):
        fields.append(order_field())
    source._scanned = True
    return total, fields


def _scan_sequences(source: TFRecordFormat, records: Iterator[tuple[str, int, int, bytes]], report: ReadReport
                    ) -> tuple[int, dict[str, _Stats], dict[str, ListStats], _Orders, set[bool]]:
    """``(records, the context's statistics, the feature lists', the distinct (context, feature lists) orders,
    whether records without context features hold an empty context field: True, False or both)`` of the
    SequenceExamples of ``records``; bad records reported per ``source.on_error``."""
    context: dict[str, _Stats] = {}
    lists: dict[str, ListStats] = {}
    orders: _Orders = set()
    contexts: set[bool] = set()
    total = 0
    explicit = source.options.get("payload") == "sequence_example"
    for path, index, offset, data in records:
        try:
            ctx, steps = _sequence(data, explicit)
        except ValueError as exc:
            _fail(path, index, offset, str(exc), source.on_error, report)
            continue
        add_example(context, ctx, f"{path} record {index}")
        if not ctx:
            contexts.add(has_context(data))
        if len(orders) <= ORDERS_KEPT:
            orders.add((tuple(ctx), tuple(steps or ())))
        previous = None
        for name, value in (steps or {}).items():  # in wire order, as add_example notes the context's
            stat = lists.setdefault(name, ListStats())
            stat.add(value)
            if previous is not None:
                stat.after.add(previous)
            previous = name
        total += 1
    return total, context, lists, orders, contexts


def _note_orders(source: TFRecordFormat, context: dict[str, _Stats], lists: dict[str, ListStats],
                 orders: _Orders) -> bool:
    """Note on ``source`` the order of the context's features and of the feature lists on the wire, and
    where records disagree, each distinct order; True when each row must keep its own (the ORDER_FIELD)."""
    source.feature_order, context_differs = order_on_wire({name: stat.after for name, stat in context.items()})
    source.feature_list_order, lists_differ = order_on_wire({name: stat.after for name, stat in lists.items()},
                                                            "feature lists")
    source.feature_order_differs = "; ".join(filter(None, [context_differs, lists_differ])) or None
    # records that disagree: each row keeps its own orders (the ORDER_FIELD), unless too many differ
    source.feature_orders = sequence_order_table(orders) if source.feature_order_differs else {}
    if not source.feature_orders:
        return False
    if ORDER_FIELD in context or ORDER_FIELD in lists:
        raise FormatError(f"{source.where}: the records hold a feature named {ORDER_FIELD!r}, the field unihub "
                          "keeps each record's order of features in; rename it", path=source.sources[0])
    source.feature_order_differs = None
    return True


def _sequence(data: bytes, explicit: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One record as a SequenceExample; without feature lists it is an Example, accepted only when
    the ``sequence_example`` payload was asked for (else it is a record of another kind)."""
    ctx, steps = parse_sequence(data)
    if steps is None and not explicit:
        raise ValueError("a tf.train.Example (no feature_lists), among tf.train.SequenceExamples: a dataset mixing "
                         "the two cannot be converted as one; if it is a SequenceExample without feature lists, "
                         "pass --option payload=sequence_example")
    return ctx, steps


def _infer_tensor(records: Iterator[tuple[str, int, int, bytes]], on_error: OnError,
                  report: ReadReport) -> tuple[int, list[UnischemaField], set[str]]:
    """The field of TensorProto records, their count, and the :data:`.tensor_proto.ENCODINGS` that give
    every record back byte for byte (none: some record is written otherwise)."""
    first: tuple[str, int, np.ndarray] | None = None
    encodings = set(ENCODINGS)
    shapes: set[tuple[int, ...]] = set()
    utf8 = True
    total = 0
    for path, index, offset, data in records:
        try:
            array = parse_tensor(data)
        except TensorProtoError as exc:
            _fail(path, index, offset, str(exc) if first is None else f"{exc} (the records before it are "
                  "TensorProtos)", on_error, report)
            continue
        if first is None:
            first = (path, index, array)
        elif array.dtype != first[2].dtype or array.ndim != first[2].ndim:
            raise FormatError(f"{path}: record {index} at byte offset {offset} holds a {_label(array)} tensor, "
                              f"record {first[1]} of {first[0]} a {_label(first[2])} one: one field cannot hold "
                              "both", path=path, offset=offset)
        shapes.add(array.shape)
        encodings = {e for e in encodings if encode_tensor(array, e) == data}
        if array.dtype == object and utf8:
            utf8 = all(_is_utf8(v) for v in array.ravel().tolist())
        total += 1
    if first is None:
        return 0, [], encodings
    array = first[2]
    shape = tuple(dims.pop() if len(dims := {s[i] for s in shapes}) == 1 else None for i in range(array.ndim))
    if array.dtype == object:
        dtype, arrow = (np.str_, pa.string()) if utf8 else (np.bytes_, pa.binary())
        field = UnischemaField(TENSOR_FIELD, dtype, shape, ScalarCodec(arrow) if shape == () else None, False)
    elif shape == ():
        field = UnischemaField(TENSOR_FIELD, array.dtype.type, (), ScalarCodec(array.dtype.type), False)
    else:
        field = UnischemaField(TENSOR_FIELD, array.dtype.type, shape, TensorCodec(), False)
    return total, [field], encodings


def _label(array: np.ndarray) -> str:
    return f"{'string' if array.dtype == object else array.dtype.name} rank-{array.ndim}"


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# -- reading --------------------------------------------------------------------------------------
def read_batches(source: TFRecordFormat, kind: str, schema: Unischema, batch_size: int,
                 on_error: OnError) -> Iterator[ColumnBatch]:
    """Column batches of ``schema`` from records of payload ``kind`` (not ``example``)."""
    check_on_error(on_error)
    read_row, columns = _row_reader(source, kind, schema)
    rows: list[list[Any]] = []
    report = source.report
    cut = BatchCut(batch_size, source.batch_bytes)
    for path, index, offset, data in source.records(on_error, report):
        try:
            rows.append(read_row(data))
        except _Mismatch as exc:
            _fail(path, index, offset, exc.reason, on_error, report, exc.feature)
            continue
        except (ValueError, Mismatch) as exc:
            feature = getattr(exc, "feature", None)
            _fail(path, index, offset, getattr(exc, "reason", str(exc)), on_error, report, feature)
            continue
        report.records += 1
        if cut.add(len(data)):
            yield columns(rows)
            rows = []
            cut.reset()
    if rows:
        yield columns(rows)


def _row_reader(source: TFRecordFormat, kind: str, schema: Unischema
                ) -> tuple[Callable[[bytes], list[Any]], Callable[[list[list[Any]]], ColumnBatch]]:
    """``(record bytes -> row values, rows -> column batch)`` for payload ``kind``."""
    fields = list(schema)
    if kind == "bytes":  # an image field checks each record's image
        check = _Plan.of(fields[0], source.validate_images).checked_image
        return (lambda data: [check(bytes(data))]), (lambda rows: {fields[0].name: pa.array([r[0] for r in rows],
                                                                                             pa.binary())})
    if kind == "tensor":
        f = fields[0]
        plan = _Plan.of(f)
        return (lambda data: [_tensor_value(f, parse_tensor(data))]), (lambda rows: {f.name: plan.column(
            [r[0] for r in rows])})
    explicit = source.options.get("payload") == "sequence_example"
    source.prepare(schema)  # a schema given without saying which fields are feature lists: as the records say
    listed = set(source.options["feature_lists"])
    keep_order = ORDER_FIELD in schema.fields  # each row's orders of context and lists (see order_id)
    fields = list(without_order(schema))
    context_names = {f.name for f in fields if f.name not in listed}
    plans: list[Any] = [StepsPlan.of(f, list_name(f.name, context_names)) if f.name in listed
                        else _Plan.of(f, source.validate_images, fields=context_names) for f in fields]

    def read(data: bytes) -> list[Any]:
        ctx, steps = _sequence(data, explicit)
        row = [p.read(steps) if isinstance(p, StepsPlan) else p.read(ctx) for p in plans]
        return row + [order_id(tuple(ctx), tuple(steps or ()))] if keep_order else row

    def columns(rows: list[list[Any]]) -> ColumnBatch:
        batch = {p.field.name: [r[j] for r in rows] if isinstance(p, StepsPlan) else p.column([r[j] for r in rows])
                 for j, p in enumerate(plans)}
        if keep_order:
            batch[ORDER_FIELD] = np.array([r[-1] for r in rows], np.int64)
        return batch

    return read, columns


def list_fields(source: TFRecordFormat, fields: list[UnischemaField]) -> list[str]:
    """The fields that name a feature list in some record (``feature_lists/<name>`` or ``<name>``)."""
    names: set[str] = set()
    context: set[str] = set()
    for _, _, _, data in source.records("skip", ReadReport()):
        try:
            ctx, steps = parse_sequence(data)
        except ValueError:
            continue  # the read reports it
        names.update(steps or ())
        context.update(ctx)
    return [f.name for f in fields if list_name(f.name, context) in names and
            (f.name.startswith(LIST_PREFIX) or f.name not in context)]


def _tensor_value(f: UnischemaField, array: np.ndarray) -> Any:
    """One tensor record as field ``f``'s value (flat for fixed shapes, as _Plan.column expects)."""
    if array.dtype != f.dtype and not (array.dtype == object and f.dtype == object):
        raise _Mismatch(f.name, f"a {array.dtype} tensor, the schema says {np.dtype(f.dtype)}")
    if len(array.shape) != len(f.shape) or any(d is not None and d != s for d, s in zip(f.shape, array.shape)):
        raise _Mismatch(f.name, f"a tensor of shape {array.shape}, the schema says {f.shape}")
    if array.dtype == object:
        values = array.tolist()
        if f.numpy_dtype is np.str_:
            try:
                values = array.reshape(-1)
                decoded = [v.decode("utf-8") for v in values.tolist()]
            except UnicodeDecodeError as exc:
                raise _Mismatch(f.name, f"not UTF-8 text: {exc}") from None
            values = np.array(decoded, dtype=object).reshape(array.shape).tolist() if array.shape else decoded[0]
        return values
    if f.shape == ():
        return array[()]
    return array.reshape(-1) if f.is_fixed_shape else array


# -- writing --------------------------------------------------------------------------------------
def row_encoder(schema: Unischema, payload: str, feature_lists: Sequence[str],
                empty_as_null: Sequence[str], shape_features: Sequence[str] = (),
                feature_order: Sequence[str] = (), feature_list_order: Sequence[str] = (),
                feature_orders: Mapping[str, Any] | None = None, *, empty_context: bool = True,
                tensor_encoding: str = ENCODINGS[0], empty_without_kind: Sequence[str] = ()) -> RowEncoder:
    """``(column batch, row) -> record bytes`` for the payloads other than ``example``; a SequenceExample's
    context features in ``feature_order`` and feature lists in ``feature_list_order`` (names on the wire;
    others after them), as the source had them (see :func:`~unihub.formats.tfrecord.schema.order_on_wire`); a row
    with an ``__feature_order__`` in its own, from ``feature_orders`` (see :func:`.tfschema.ordered_rows`); a row
    without context features with an empty context field only with ``empty_context``; context fields in
    ``empty_without_kind`` with an empty list as a Feature with no list set; a TensorProto as
    ``tensor_encoding`` (:data:`.tensor_proto.ENCODINGS`) says."""
    if payload == "sequence_example":
        sequence = without_order(schema)
        return ordered_rows(schema, lambda entry: _sequence_encoder(
            sequence, feature_lists, empty_as_null, shape_features,
            feature_order if entry is None else entry["context"],
            feature_list_order if entry is None else entry["feature_lists"], empty_context,
            empty_without_kind), feature_orders,
            lambda entry: order_id(tuple(entry["context"]), tuple(entry["feature_lists"])))
    fields = list(schema)
    if payload in ("tensor", "bytes"):
        if len(fields) != 1:
            raise SchemaError(f"payload={payload} writes one field per record; {schema.name!r} has "
                              f"{len(fields)}: {[f.name for f in fields]} (select one field first)")
        name = fields[0].name
        if payload == "tensor":
            return lambda batch, row: encode_tensor(_tensor_array(fields[0], batch[name][row]), tensor_encoding)
        if fields[0].numpy_dtype not in (np.bytes_, np.str_) or fields[0].shape != ():
            raise SchemaError(f"payload=bytes writes a bytes field as each record; {name!r} is "
                              f"{fields[0].numpy_dtype.__name__} of shape {fields[0].shape}")
        return lambda batch, row: _record_bytes(name, batch[name][row], row)
    raise SchemaError(f"TFRecord payload must be example, sequence_example, tensor or bytes, not {payload!r}")


def _sequence_encoder(schema: Unischema, feature_lists: Sequence[str], empty_as_null: Sequence[str],
                      shape_features: Sequence[str], feature_order: Sequence[str],
                      feature_list_order: Sequence[str], empty_context: bool = True,
                      empty_without_kind: Sequence[str] = ()) -> RowEncoder:
    """:func:`row_encoder` of SequenceExamples in one order of context features and feature lists."""
    fields = list(schema)
    unknown = sorted(set(feature_lists) - set(schema.fields))
    if unknown:
        raise SchemaError(f"feature_lists names {unknown}, which are not fields of {schema.name!r}")
    context = schema.create_schema_view([f for f in fields if f.name not in feature_lists]) \
        if len(feature_lists) < len(fields) else Unischema(schema.name, [])
    encode_context = features_encoder(context, empty_as_null, shape_features, feature_order,
                                      empty_without_kind=empty_without_kind)
    context_names = set(context.fields)
    wire_names = {f.name: list_name(f.name, context_names) for f in fields if f.name in feature_lists}
    place = {name: i for i, name in enumerate(feature_list_order)}
    lists = [(f.name, ld(1, wire_names[f.name].encode()), StepsPlan.of(f, f.name).kind)
             for f in sorted((f for f in fields if f.name in feature_lists),
                             key=lambda f: place.get(wire_names[f.name], len(place)))]

    def encode(batch: Mapping[str, Any], row: int) -> bytes:
        steps = [(key, [encode_feature(kind, _utf8(step) if kind == "bytes" else step)
                        for step in _steps(batch[name][row])])
                 for name, key, kind in lists if name in batch and batch[name][row] is not None]
        return encode_sequence_example(encode_context(batch, row), steps, empty_context=empty_context)

    return encode


def _steps(value: Any) -> list[list[Any]]:
    """A feature-list value as the values of each step: rows of a ``(steps, k)`` array, the items
    of a ``(steps,)`` one (one value a step), or the lists of a ragged value."""
    if isinstance(value, np.ndarray) and value.dtype != object:
        return [[v] for v in value.tolist()] if value.ndim == 1 else [list(r) for r in value]
    return [list(step) if isinstance(step, (list, tuple, np.ndarray)) else [step] for step in value]


def _utf8(values: list[Any]) -> list[bytes]:
    return [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in values]


def _tensor_array(f: UnischemaField, value: Any) -> np.ndarray:
    """A tensor field's value as the array to serialize (text as an object array of str/bytes)."""
    if f.numpy_dtype not in (np.str_, np.bytes_):
        return np.asarray(value, dtype=f.dtype)
    if f.shape:
        return np.array(value, dtype=object)
    array = np.empty((), dtype=object)
    array[()] = value
    return array


def _record_bytes(name: str, value: Any, row: int) -> bytes:
    if value is None:
        raise SchemaError(f"row {row}: field {name!r} is null; payload=bytes cannot write a missing record")
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)
