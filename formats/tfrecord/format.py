"""TFRecord files as a foreign format: infer a Unischema, read batches, write back.

Records are framed, checksummed and (de)compressed by :mod:`unihub.formats.tfrecord.records`; the files of a
source are found by :mod:`unihub.formats.tfrecord.files`. A record is a serialized ``tf.train.Example``
(parsed and written by :mod:`unihub.formats.tfrecord.example`; read a block at a time by
:mod:`unihub.formats.tfrecord.example_block`, or record by record, per the ``parser`` option: see
:mod:`unihub.formats.tfrecord.parsers`) or, per the ``payload`` option, a SequenceExample, a TensorProto or
opaque bytes (:mod:`unihub.formats.tfrecord.payload`). Where TFDS wrote the records, the fields are
what its ``features.json`` declares (:mod:`unihub.formats.tfrecord.tfds`).

Neither TensorFlow nor the ``tfrecord`` package is imported (they clash in one process, see
:mod:`unihub.formats.tfrecord.example`), so this module works with either, both or neither
installed; only ``crc32c`` is needed, for the checksums.

Tensors are written flattened; a field whose shape the flat length does not determine (more
than one ``None`` dim, or one that is not the first) also gets a ``<name>/shape`` int64 feature
holding each row's shape, which :meth:`TFRecordFormat.infer_schema` and ``read_batches`` use.

An export gives each record back byte for byte (DESIGN decision 18): the scan notes the features'
order on the wire (a map's, which TensorFlow writes in a hash order), the dataset's metadata keeps it
(``feature_order``), and the export writes it. Where records disagree on it (shards of several writing
processes), each row names its own in one more field, ``__feature_order__`` (null: the one order),
a hash of the order that the metadata's table ``feature_orders`` maps back to the names (see
:func:`~unihub.formats.tfrecord.schema.order_id`); past :data:`~unihub.formats.tfrecord.schema.ORDERS_KEPT` orders,
the metadata says why an export is not exact (``feature_order_differs``).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import cached_property, partial
from typing import Any, ClassVar

import numpy as np

from unihub.errors import FormatError, SchemaError, UnsupportedFormatError
from unihub.formats.base import (
    ColumnBatch,
    ForeignFormat,
    FormatOption,
    OnError,
    ReadReport,
    check_on_error,
    map_in_workers,
    parse_bool,
    parse_choice,
    parse_list,
    python_columns,
    register_format,
)
from unihub.formats.tfrecord.example import Feature, parse_example
from unihub.formats.tfrecord.files import Listing, list_files, named_like_tfrecord, tfds_beside
from unihub.formats.tfrecord.parsers import DEFAULT_PARSER, EXAMPLE_PARSERS, ParserName
from unihub.formats.tfrecord.payload import detect, infer_schema, list_fields, read_batches, row_encoder
from unihub.formats.tfrecord.records import (
    _fail,
    _header_ok,
    _open,
    _ShardWriter,
    _stem,
    iter_records,
    named_compression,
    normalize_compression,
)
from unihub.formats.tfrecord.schema import (
    ORDER_FIELD,
    SHAPE_SUFFIX,
    Scan,
    _merge_scans,
    _Plan,
    _Stats,
    empty_means_null,
    example_encoder,
    export_options,
    fields_from_stats,
    order_field,
    order_on_wire,
    order_table,
    shape_features,
    without_kind,
)
from unihub.formats.tfrecord.tensor_proto import ENCODINGS
from unihub.formats.tfrecord.tfds import Declared, apply_declared, declared_features, shard_lengths
from unihub.formats.tfrecord.verify import native_records, reference_records
from unihub.fs import sources
from unihub.fs.outputs import Outputs, outputs_for
from unihub.schema.unischema import Unischema

#: records scanned for the schema a single-pass conversion starts with (see provisional_schema)
PROVISIONAL_SAMPLE = 1000
#: files whose first record a single pass also looks at for another order of features (provisional_schema)
ORDER_PEEKS = 16


# -- schema inference ------------------------------------------------------------------------
def _scan_files(options: dict[str, Any], files: list[str],
                sample_records: int | None = None) -> tuple[Scan, int]:
    """Per-feature statistics of the records of ``files`` (the first ``sample_records``), and their count,
    by the ``parser`` option's parser."""
    source = TFRecordFormat(files, **{k: v for k, v in options.items() if k != "on_error"})
    return EXAMPLE_PARSERS[source.parser].scan(source, options.get("on_error", "raise"), sample_records)


def _selected(stats: dict[str, _Stats], fields: Sequence[str] | None, sources: Sequence[str]) -> dict[str, _Stats]:
    """The statistics of the features ``fields`` names (with their ``/shape`` features); all without it."""
    if fields is None:
        return stats
    missing = [name for name in fields if name not in stats]
    if missing:
        raise FormatError(f"{', '.join(sources)}: no feature {missing[0]!r} in the records (--option fields); "
                          f"features: {sorted(stats)[:20]}", path=sources[0])
    wanted = set(fields) | {name + SHAPE_SUFFIX for name in fields}
    return {name: stat for name, stat in stats.items() if name in wanted}


# -- the format ------------------------------------------------------------------------------
@register_format("tfrecord", aliases=("tfrecords",), extensions=(".tfrecord", ".tfrecords", ".tfrec"))
class TFRecordFormat(ForeignFormat):
    """TFRecord files (plain, GZIP or ZLIB, any number of shards) of ``tf.train.Example``,
    ``tf.train.SequenceExample``, ``TensorProto`` or opaque records (see :mod:`unihub.formats.tfrecord.payload`).

    Options: ``compression`` (auto: found from each file's bytes), ``payload`` (auto: the first
    record's kind), ``split`` (the shard set of a directory holding several), ``feature_lists``
    (the fields read from a SequenceExample's feature lists; set by the schema inference).

    Example::

        source = TFRecordFormat("/data/train-*.tfrecord.gz")
        schema = source.infer_schema(sample_records=1000)
        for batch in source.read_batches(schema, batch_size=256):
            ...
    """

    OPTIONS: ClassVar[dict[str, FormatOption]] = {
        "compression": FormatOption("auto (found from each file's bytes), none, gzip or zlib (default auto)"),
        "split": FormatOption("the shard set to convert where a directory holds several (train, validation, ...)"),
        "payload": FormatOption("what records hold: auto (the first record's kind), example, sequence_example, "
                                "tensor, or bytes (each record kept whole in a 'record' field)",
                                parse_choice("auto", "example", "sequence_example", "tensor", "bytes")),
        "feature_lists": FormatOption("SequenceExample: the fields read from feature lists, comma-separated "
                                      "(default: inferred)", parse_list),
        "fields": FormatOption("the features to convert, comma-separated; the others are left out (default: all, "
                               "and a feature a given --schema lacks is refused)", parse_list),
        "parser": FormatOption("how Examples are parsed: block (a block of records at a time, with numpy; the "
                               "default) or record (one at a time: the reference, slower); both read the same",
                               parse_choice(*EXAMPLE_PARSERS)),
    }
    WRITE_OPTIONS: ClassVar[dict[str, FormatOption]] = {
        "compression": FormatOption("none, gzip or zlib (default none)"),
        "records_per_file": FormatOption("records per shard (default: one file, or one shard)", int),
        "payload": FormatOption("what each record holds: example (default), sequence_example, tensor (the one "
                                "field as a TensorProto) or bytes (the one bytes field as is)",
                                parse_choice("example", "sequence_example", "tensor", "bytes")),
        "feature_lists": FormatOption("sequence_example: the fields written as feature lists, comma-separated "
                                      "(default: the source's)", parse_list),
        "empty_as_null": FormatOption("fields whose nulls are written as empty lists, not left out "
                                      "(default: as in the source)", parse_list),
        "empty_without_kind": FormatOption("fields whose empty lists are written as a Feature with no list set, "
                                           "as tf.train.Feature() is (default: as in the source)", parse_list),
        "shape_features": FormatOption("fields written with a <name>/shape feature holding each row's shape "
                                       "(default: as in the source)", parse_list),
        "feature_order": FormatOption("the order of each record's features, comma-separated; the others after "
                                      "them in the schema's order (default: the source's)", parse_list),
        "feature_list_order": FormatOption("sequence_example: the order of the feature lists, likewise",
                                           parse_list),
        "empty_context": FormatOption("write an empty context (an Example's features field) where a record has no "
                                      "context feature (false: none, as TensorFlow writes a context never set, "
                                      "and tf.train.Example(); default: as in the source, else true)", parse_bool),
        "tensor_encoding": FormatOption("tensor: serialize_tensor (numbers as tensor_content) or make_tensor_proto "
                                        "(a tensor of one value, and bool and uint16 tensors, as typed values); "
                                        "default: as in the source, else serialize_tensor",
                                        parse_choice(*ENCODINGS)),
    }

    REFERENCE_READER = "TensorFlow's TFRecordDataset and protobuf messages"

    def __init__(self, sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], **options: Any) -> None:
        super().__init__(sources, **options)
        #: features whose empty lists read as None (one value or none in every record): written back
        #: as empty lists; and features a ``<name>/shape`` feature gave the shapes of: written back with
        #: it (both found by the schema inference)
        self.empty_as_null: list[str] = []
        self.shape_features: list[str] = []
        #: features whose empty lists were Features with no list set (``tf.train.Feature()``): written
        #: back so; and those where some were and some had a kind (an export writes every one with one)
        self.empty_without_kind: list[str] = []
        self.empty_without_kind_differs: list[str] = []
        #: the order of the features on the wire, and why some records differ from it (None: none does);
        #: see :func:`~unihub.formats.tfrecord.schema.order_on_wire`
        self.feature_order: list[str] = []
        self.feature_order_differs: str | None = None
        self.feature_list_order: list[str] = []  # a SequenceExample's feature lists, likewise
        #: whether records without (context) features hold an empty features (context) field (False: none
        #: does: ``b''`` for an Example), and whether some do and some do not (an export then writes every
        #: such record with one)
        self.empty_context = True
        self.empty_context_differs = False
        #: how TensorProto records write their numbers (:data:`.tensor_proto.ENCODINGS`), and whether
        #: some record is written in neither way (an export then gives the same tensors, other bytes)
        self.tensor_encoding = ENCODINGS[0]
        self.tensor_encoding_differs = False
        #: where records disagree on the order: each distinct one by its number (the rows' ORDER_FIELD)
        self.feature_orders: dict[str, Any] = {}
        self._links: dict[str, set[str]] = {}  # the last scan's features -> those right before them
        self._scanned = False

    @classmethod
    def detect(cls, path: str) -> bool:
        """A file whose first record header is valid (any compression), or a directory holding such
        files or files named like TFRecord shards (``train-00000-of-00004``, ``x.tfrecord``)."""
        if sources.isdir(path):
            seen = 0
            for directory, dirs, names in sources.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
                for name in sorted(n for n in names if not n.startswith((".", "_"))):
                    if named_like_tfrecord(name) or cls.detect(sources.join(directory, name)):
                        return True
                    seen += 1
                    if seen >= 16:
                        return False
            return False
        try:
            if sources.isfile(path):
                with _open(path, None) as f:
                    head = f.read(12)
                return len(head) == 12 and _header_ok(head)
        except (OSError, EOFError, ImportError, zlib.error, FormatError):
            pass
        return False

    def files(self) -> list[str]:
        """The record files: paths and patterns as given; from directories, the TFRecord files
        (TF shard names, TFDS layouts, any file holding records); see :mod:`unihub.formats.tfrecord.files`."""
        return self._listing.files

    @cached_property
    def _listing(self) -> Listing:
        return list_files(self.sources, split=self.options.get("split"), is_record_file=type(self).detect)

    def metadata(self) -> dict[str, Any]:
        """What the source held besides records: files that are not records, TFDS's JSON files."""
        listing = self._listing
        tfds_beside(listing)
        info: dict[str, Any] = {}
        if listing.ignored:
            info["not_records"] = [os.path.relpath(p, os.path.dirname(self.sources[0].rstrip("/")) or ".")
                                   for p in listing.ignored[:1000]]
        if listing.tfds:
            info["tfds"] = listing.tfds
        if self.tfds_features:  # the TFDS type of each field it declares, a ClassLabel's classes
            info["tfds_features"] = {name: spec.describe() for name, spec in sorted(self.tfds_features.items())}
        if self.payload != "example":
            info["payload"] = self.payload
        if self.options.get("feature_lists"):
            info["feature_lists"] = list(self.options["feature_lists"])
        if self.empty_as_null:
            info["empty_as_null"] = list(self.empty_as_null)
        if self.empty_without_kind:
            info["empty_without_kind"] = list(self.empty_without_kind)
        if self.shape_features:
            info["shape_features"] = list(self.shape_features)
        if self.feature_order:
            info["feature_order"] = list(self.feature_order)
        if self.feature_list_order:
            info["feature_list_order"] = list(self.feature_list_order)
        if self.feature_orders:
            info["feature_orders"] = dict(self.feature_orders)
        if self.feature_order_differs:
            info["feature_order_differs"] = self.feature_order_differs
        if not self.empty_context:
            info["empty_context"] = False
        if self.tensor_encoding != ENCODINGS[0]:
            info["tensor_encoding"] = self.tensor_encoding
        return {"tfrecord": info} if info else {}

    def caveats(self) -> list[str]:
        caveats = [f"the records disagree on their features' order ({self.feature_order_differs}): an export holds "
                   "the same Examples, but not every record's bytes"] if self.feature_order_differs else []
        if self.empty_context_differs:
            what, field = ("SequenceExamples", "context") if self.payload == "sequence_example" else \
                ("Examples", "features field")
            caveats.append(f"some {what} without {field.split()[0]} features hold an empty {field} and some none: "
                           f"an export writes every such record with one (the same {what}, other bytes)")
        if self.empty_without_kind_differs:
            caveats.append(f"the features {self.empty_without_kind_differs[:8]} are in some records an empty list "
                           "and in others a Feature with no list set: an export writes every one as a list (the "
                           "same values, other bytes)")
        if self.tensor_encoding_differs:
            caveats.append("some TensorProtos are written otherwise than tf.io.serialize_tensor and "
                           "tf.make_tensor_proto(array) write the tensors they hold (one value over a shape, as "
                           "make_tensor_proto(value, shape=...) writes, is one such): an export holds the same "
                           "tensors, other bytes")
        return caveats

    @classmethod
    def export_caveats(cls, schema: Unischema, options: Mapping[str, Any]) -> list[str]:
        """float64 fields of an Example or SequenceExample export: a FloatList holds float32."""
        if options.get("payload", "example") not in ("example", "sequence_example"):
            return []
        rounded = [f.name for f in schema if f.numpy_dtype is np.float64]
        return [f"the float64 fields {rounded} are written as float32 (a FloatList holds no float64): values "
                "float32 does not hold are rounded (unihub verify names them; payload=tensor writes one field's "
                "float64 as it is)"] if rounded else []

    @classmethod
    def export_options(cls, extra: Mapping[str, Any], schema: Unischema) -> dict[str, Any]:
        """A TFRecord source's payload kind, feature lists, empty lists (of the fields ``schema``
        still has) and feature order, so an export gives the source back, record for record."""
        return export_options(extra, schema)

    def prepare(self, schema: Unischema) -> Unischema | None:
        """What the records say beyond a given schema: which fields are feature lists (SequenceExamples,
        when no option said), which nulls were empty lists and which fields had ``/shape`` features
        (a scan, when no inference ran), so that the metadata and an export keep them. Where the records
        disagree on their features' order, ``schema`` with the field that keeps each row's."""
        if self.payload == "sequence_example" and self.options.get("feature_lists") is None:
            self.options["feature_lists"] = list_fields(self, list(schema))
        if self.payload == "example" and not self._scanned:
            stats, total = _scan_files({"on_error": self.on_error, **self.options}, self.files())
            self._note(stats, total)
        elif self.payload == "sequence_example" and not self._scanned:
            infer_schema(self, self.payload, None)  # the context's empty lists and shape features
        if self.feature_orders and ORDER_FIELD not in schema.fields:
            return Unischema(schema.name, [*schema, order_field()])
        return None

    def reference_records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """The records as TensorFlow itself reads them (see :mod:`unihub.formats.tfrecord.verify`)."""
        return reference_records(self)

    @classmethod
    def native_records(cls, schema: Unischema, rows: Iterable[Mapping[str, Any]], extra: Mapping[str, Any],
                       **options: Any) -> Iterator[dict[str, Any]]:
        """Rows of a unihub dataset as TensorFlow would read an export of them (see tfverify)."""
        return native_records(schema, rows, extra, **options)

    @cached_property
    def tfds_features(self) -> dict[str, Declared]:
        """The features a TFDS directory's ``features.json`` declares (see :mod:`unihub.formats.tfrecord.tfds`)."""
        listing = self._listing
        tfds_beside(listing)
        return declared_features(listing.tfds.get("features"), listing.class_names) if self.payload == "example" \
            else {}

    @cached_property
    def _shard_lengths(self) -> dict[str, int]:
        """TFDS shard file -> its records, where a ``dataset_info.json`` is beside the records."""
        listing = self._listing
        tfds_beside(listing)
        return shard_lengths(listing.tfds.get("dataset_info"))

    def check_count(self, path: str, framed: int) -> None:
        """FormatError where TFDS's ``dataset_info.json`` says ``path`` holds more records than the
        ``framed`` ones: a file cut at a record's end frames cleanly, and its lost records would vanish."""
        expected = next((n for name, n in self._shard_lengths.items() if path == name or path.endswith("/" + name)),
                        None)
        if expected is not None and framed < expected:
            raise FormatError(f"{path}: holds {framed:,} records, but TFDS's dataset_info.json says this shard "
                              f"holds {expected:,}: {expected - framed:,} would be missing (a cut or replaced "
                              "file?); restore it (to convert the records there are, move dataset_info.json away)",
                              path=path)

    @property
    def parser(self) -> ParserName:
        """Which Example parser reads the records: the ``parser`` option (see :mod:`unihub.formats.tfrecord.parsers`)."""
        chosen = self.options.get("parser") or DEFAULT_PARSER
        if chosen not in EXAMPLE_PARSERS:
            raise UnsupportedFormatError(f"tfrecord option parser: {chosen!r} is none of {', '.join(EXAMPLE_PARSERS)}")
        return chosen

    @cached_property
    def payload(self) -> str:
        """What the records are: the ``payload`` option, or the first record's kind (see tfpayload)."""
        chosen = self.options.get("payload") or "auto"
        return detect(self) if chosen == "auto" else chosen

    def records(self, on_error: OnError, report: ReadReport) -> Iterator[tuple[str, int, int, bytes]]:
        """``(path, record index, byte offset, data)`` for each well-framed record of every file."""
        check_on_error(on_error)
        for path in self.files():
            framed, skipped = 0, len(report.skipped)
            for index, offset, data in iter_records(path, compression=self.options.get("compression"),
                                                    on_error=on_error, report=report):
                framed = index + 1
                yield path, index, offset, data
            if len(report.skipped) == skipped:  # a bad record skipped is reported already
                self.check_count(path, framed)

    def _examples(self, on_error: OnError, report: ReadReport) -> Iterator[tuple[str, int, int, dict[str, Feature]]]:
        """``(path, record index, byte offset, parsed Example)`` for each good record of every file."""
        for path, index, offset, data in self.records(on_error, report):
            try:
                example = parse_example(data)
            except ValueError as exc:
                _fail(path, index, offset, str(exc), on_error, report)
                continue
            yield path, index, offset, example

    def infer_schema(self, *, sample_records: int | None = None) -> Unischema:
        if self.payload != "example":
            return infer_schema(self, self.payload, sample_records)
        files = self.files()
        options = {"on_error": self.on_error, **self.options}  # bad records: as the read will treat them
        if sample_records is None and self.workers > 1 and len(files) > 1:
            # whole files in forked workers; the statistics merge exactly
            slices = [files[i::self.workers] for i in range(self.workers)]
            parts = map_in_workers(partial(_scan_files, options), slices, self.workers)
            stats, total = _merge_scans(parts)
        else:
            stats, total = _scan_files(options, files, sample_records)
        return self._schema_from(stats, total)

    def provisional_schema(self) -> Unischema | None:
        """The schema of the first records (:data:`PROVISIONAL_SAMPLE`); read_batches with
        :attr:`observe` set gathers the statistics of every record for :meth:`refine_schema`; with
        the order field where other files' first records order the features otherwise.
        Examples only: other payloads are scanned whole first."""
        if self.payload != "example":
            return None
        schema = self.infer_schema(sample_records=PROVISIONAL_SAMPLE)
        if ORDER_FIELD not in schema.fields and self._other_files_disagree():
            return Unischema(schema.name, [*schema, order_field()])
        return schema

    def _other_files_disagree(self) -> bool:
        """Whether the first records of other files (:data:`ORDER_PEEKS` of them, spread over the list)
        order their features otherwise than the sample did: shards of several writing processes, the
        common case. Then the single pass keeps each row's order from the start, rather than start over
        once it has read everything (a guess only: :meth:`refine_schema` decides, from every record)."""
        files = self.files()[1:]
        links = {name: set(after) for name, after in self._links.items()}
        for path in files[::max(1, len(files) // ORDER_PEEKS)][:ORDER_PEEKS]:
            try:
                first = next(iter_records(path, compression=self.options.get("compression")), None)
                names = list(parse_example(first[2])) if first is not None else []
            except (ValueError, OSError, EOFError, zlib.error):  # the read says what, where
                continue
            for previous, name in zip([None, *names], names):
                links.setdefault(name, set()).update([previous] if previous is not None else [])
        return order_on_wire(links)[1] is not None

    def refine_schema(self, observations: Sequence[Any]) -> Unischema:
        """The schema of every record, from the ``(statistics, records)`` each observing read saw."""
        return self._schema_from(*_merge_scans(list(observations)))

    def _schema_from(self, every: dict[str, _Stats], total: int) -> Unischema:
        stats = _selected(every, self.options.get("fields"), self.sources)
        if total == 0:
            raise FormatError(f"{self.where}: no readable TFRecord records to infer a schema from (empty files, "
                              "or every record skipped as bad)", path=self.sources[0])
        try:
            fields = apply_declared(fields_from_stats(stats, total), stats, total, self.tfds_features)
        except SchemaError as exc:
            raise SchemaError(f"{self.where}: {exc}") from None
        if not fields:
            raise FormatError(f"{self.where}: all {total:,} records are empty tf.train.Examples (no features): "
                              "nothing to convert", path=self.sources[0])
        self._note(stats, total, every)
        return Unischema("TFRecord", fields + [order_field()] if self.feature_orders else fields)

    def _note(self, stats: dict[str, _Stats], total: int, every: dict[str, _Stats] | None = None) -> None:
        """Keep what the export needs from a scan: empty lists read as None, ``/shape`` features, the
        features' order on the wire (of ``every`` feature, the unselected ones too: they link the others)."""
        self.empty_as_null = sorted(n for n, s in stats.items() if empty_means_null(s, total))
        self.shape_features = shape_features(stats)
        self.empty_without_kind, self.empty_without_kind_differs = without_kind(stats)
        every = stats if every is None else every
        if isinstance(every, Scan):  # records without features: an empty features field (0a 00) or none (b'')
            self.empty_context = every.empty_features != {False}
            self.empty_context_differs = every.empty_features == {False, True}
        if ORDER_FIELD in every:
            raise FormatError(f"{self.where}: the records hold a feature named {ORDER_FIELD!r}, the field unihub "
                              "keeps each record's order of features in; rename it", path=self.sources[0])
        self._links = {name: stat.after for name, stat in every.items()}
        self.feature_order, self.feature_order_differs = order_on_wire(self._links)
        # records that disagree (on the order, or on a features field where none is): each row keeps its own
        # order (the ORDER_FIELD; NO_FEATURES for b''), unless too many differ
        self.feature_orders = order_table(every.orders) if (self.feature_order_differs or self.empty_context_differs) \
            and isinstance(every, Scan) else {}
        if self.feature_orders:
            self.feature_order_differs = None
            self.empty_context_differs = False
        self._scanned = True

    def read_batches(self, schema: Unischema, *, batch_size: int = 256,
                     on_error: OnError = "raise") -> Iterator[ColumnBatch]:
        if self.payload != "example":
            yield from read_batches(self, self.payload, schema, batch_size, on_error)
            return
        plans = [_Plan.of(f, self.validate_images, fit=not self.observe, fields=schema.fields) for f in schema]
        parser = self.parser if plans else "record"  # no field: nothing to gather into columns
        yield from EXAMPLE_PARSERS[parser].read(self, plans, batch_size, on_error)

    @classmethod
    def write(cls, target: str | Outputs, schema: Unischema, batches: Iterable[ColumnBatch], *,
              compression: str | None = None, records_per_file: int | None = None, payload: str = "example",
              feature_lists: Sequence[str] | None = None, empty_as_null: Sequence[str] | None = None,
              shape_features: Sequence[str] | None = None, feature_order: Sequence[str] | None = None,
              feature_list_order: Sequence[str] | None = None,
              feature_orders: Mapping[str, Any] | None = None, empty_context: bool = True,
              tensor_encoding: str = ENCODINGS[0], empty_without_kind: Sequence[str] | None = None,
              **options: Any) -> list[str]:
        """Write records to ``target``: a file (``*.tfrecord``) or a directory of ``part-NNNNN`` shards.

        ``payload``: each row as a ``tf.train.Example`` (default), a ``tf.train.SequenceExample``
        (``feature_lists`` names the fields written as feature lists, the rest is the context), a
        ``TensorProto`` of the schema's one field, or that one bytes field as is. Fields named in
        ``empty_as_null`` write None as an empty list (else None leaves the feature out), those in
        ``empty_without_kind`` an empty list as a Feature with no list set. Each record's
        features (and feature lists) are written in ``feature_order`` (``feature_list_order``; an ingest's:
        the source's), the others after them; a row whose ``__feature_order__`` names another order (an
        ingest's of records that disagreed), in that one, from ``feature_orders``. A record without
        (context) features has an empty features (context) field only with ``empty_context``; a TensorProto
        is written as ``tensor_encoding`` says (``serialize_tensor`` or ``make_tensor_proto``). Given a
        path, each file appears atomically (written to a temporary sibling, then renamed); given
        :class:`~unihub.fs.outputs.Outputs` (what ``convert`` stages and commits as one, on any
        filesystem), each is streamed straight to its place there.
        """
        if options:
            raise UnsupportedFormatError(f"unknown TFRecord write options: {sorted(options)}")
        encode = _record_encoder(schema, payload, feature_lists or (), empty_as_null or (), shape_features or (),
                                 feature_order or (), feature_list_order or (), feature_orders, empty_context,
                                 tensor_encoding, empty_without_kind or ())
        if records_per_file is not None and records_per_file <= 0:
            raise SchemaError(f"records_per_file must be positive, got {records_per_file}")
        outputs = outputs_for(target)
        single = records_per_file is None and os.path.splitext(_stem(outputs.root))[1] in \
            (".tfrecord", ".tfrecords", ".tfrec")
        # one file named x.tfrecord.gz is GZIP unless the option says otherwise: a plain file would lie in its name
        kind = normalize_compression(compression) or (named_compression(outputs.root) if single else None) or "none"
        writer = _ShardWriter(outputs, single, kind, records_per_file)
        try:
            for batch in map(python_columns, batches):
                n = len(next(iter(batch.values()))) if batch else 0
                for row in range(n):
                    writer.write(encode(batch, row))
            return writer.close()
        except BaseException:
            writer.abort()
            raise


def _record_encoder(schema: Unischema, payload: str, feature_lists: Sequence[str], empty_as_null: Sequence[str],
                    shape_features: Sequence[str], feature_order: Sequence[str], feature_list_order: Sequence[str],
                    feature_orders: Mapping[str, Any] | None, empty_context: bool, tensor_encoding: str,
                    empty_without_kind: Sequence[str]) -> Any:
    """The function that serializes a row of a batch as :meth:`TFRecordFormat.write`'s ``payload`` says."""
    if payload == "example":
        return example_encoder(schema, empty_as_null, shape_features, feature_order, feature_orders,
                               empty_without_kind=empty_without_kind, empty_context=empty_context)
    return row_encoder(schema, payload, feature_lists, empty_as_null, shape_features, feature_order,
                       feature_list_order, feature_orders, empty_context=empty_context,
                       tensor_encoding=tensor_encoding, empty_without_kind=empty_without_kind)
