"""TFRecord files of ``tf.train.Example`` records: infer a Unischema, read batches, write back.

On disk a TFRecord file is a sequence of records, each framed as::

    uint64 length (little endian) | uint32 masked_crc32c(length bytes) | data[length] | uint32 masked_crc32c(data)

optionally inside one GZIP stream (TensorFlow's ``compression_type='GZIP'``). ``data`` is a
serialized ``tf.train.Example``, parsed and written by :mod:`unihub.formats.tfexample`.

Neither TensorFlow nor the ``tfrecord`` package is imported (they clash in one process, see
:mod:`unihub.formats.tfexample`), so this module works with either, both or neither
installed; only ``crc32c`` is needed, for the checksums.

Tensors are written flattened; a field whose shape the flat length does not determine (more
than one ``None`` dim, or one that is not the first) also gets a ``<name>/shape`` int64 feature
holding each row's shape, which :meth:`TFRecordFormat.infer_schema` and ``read_batches`` use.
"""

from __future__ import annotations

import decimal
import gzip
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import IO, Any, ClassVar

import numpy as np
import pyarrow as pa

from unihub.dependencies import require
from unihub.errors import FormatError, SchemaError, UnsupportedFormatError
from unihub.formats import dtypes, images
from unihub.formats.codecs import CompressedImageCodec, ScalarCodec, TensorCodec
from unihub.formats.foreign import (
    ColumnBatch,
    ForeignFormat,
    FormatOption,
    OnError,
    ReadReport,
    SchemaOutgrown,
    SkippedRecord,
    check_on_error,
    map_in_workers,
    parse_choice,
    parse_list,
    python_columns,
    register_format,
)
from unihub.formats.schema import Shape, Unischema, UnischemaField
from unihub.formats.tfexample import (
    Feature,
    encode_entries,
    encode_example,  # noqa: F401  (re-exported: part of this module's API)
    encode_feature,
    encode_scalar,
    ld,
    parse_example,
)
from unihub.formats.tffiles import Listing, list_files, named_like_tfrecord
from unihub.formats.tfio import Compression, ZlibWriter, compression_of, normalize_compression, open_records

SHAPE_SUFFIX = "/shape"
_MASK_DELTA = 0xA282EAD8
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
#: records scanned for the schema a single-pass conversion starts with (see provisional_schema)
PROVISIONAL_SAMPLE = 1000
FAST_PATH = True  # read_batches and the schema scan parse blocks of records with numpy (tfbatch.py)


# -- framing -------------------------------------------------------------------------------
def _crc32c() -> Any:
    return require("crc32c", extra="tfrecord", purpose="TFRecord checksums").crc32c


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C of ``data``."""
    return _mask(_crc32c()(data))


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _header_ok(header: bytes) -> bool:
    """True when 12 bytes are a record header whose length CRC holds."""
    return masked_crc(header[:8]) == _U32.unpack_from(header, 8)[0]


def file_compression(path: str, compression: str | None) -> Compression:
    """The compression of ``path``: the option's, or found from the file's bytes (see :mod:`tfio`)."""
    return compression_of(path, compression, _header_ok)


def _open(path: str, compression: str | None) -> IO[bytes]:
    return open_records(path, file_compression(path, compression))


def iter_records(path: str, *, compression: str | None = None, on_error: OnError = "raise",
                 report: ReadReport | None = None) -> Iterator[tuple[int, int, bytes]]:
    """``(record index, byte offset, data)`` for each record of one TFRecord file.

    Offsets count uncompressed bytes. A bad data CRC skips one record; a truncated record or
    a bad length CRC ends the file (nothing after it can be framed) -- with ``on_error='skip'``
    both are noted in ``report``, otherwise they raise :class:`FormatError`.
    """
    crc = _crc32c()
    index = offset = 0
    with _open(path, compression) as f:
        while True:
            data, size, error = _next_record(f, crc)
            if error is not None:
                _fail(path, index, offset, error, on_error, report)
                if not size:
                    return  # the rest of the file cannot be framed
            elif data is None:
                return
            else:
                yield index, offset, data
            index, offset = index + 1, offset + size


def _next_record(f: IO[bytes], crc: Any) -> tuple[bytes | None, int, str | None]:
    """``(data, framed size, error)``: ``(None, 0, None)`` at the end, size 0 when unframeable."""
    try:
        header = f.read(12)
        if not header:
            return None, 0, None
        if len(header) < 12:
            return None, 0, f"truncated record header ({len(header)} of 12 bytes)"
        if _mask(crc(header[:8])) != _U32.unpack_from(header, 8)[0]:
            return None, 0, "length CRC mismatch (corrupt file, or not a TFRecord file)"
        length = _U64.unpack_from(header)[0]
        body = f.read(length + 4)
    except (OSError, EOFError, zlib.error) as exc:  # a gzip/zlib stream cut short or corrupt
        return None, 0, f"unreadable compressed stream ({exc})"
    if len(body) < length + 4:
        return None, 0, f"truncated record: {len(body)} of {length + 4} bytes after the header"
    data = body[:length]
    if _mask(crc(data)) != _U32.unpack_from(body, length)[0]:
        return None, 16 + length, "data CRC mismatch"
    return data, 16 + length, None


def _fail(path: str, index: int, offset: int, reason: str, on_error: OnError,
          report: ReadReport | None, feature: str | None = None) -> None:
    where = f"record {index} at byte offset {offset}" + (f", feature {feature!r}" if feature else "")
    if on_error == "skip":
        if report is not None:
            report.skipped.append(SkippedRecord(path, where, reason))
        return
    raise FormatError(f"{path}: {where}: {reason}", path=path, offset=offset)


# -- schema inference ------------------------------------------------------------------------
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

    def add(self, kind: str | None, values: Any) -> None:
        self.present += 1
        self.lengths.add(len(values))
        if kind is None:
            return
        self.kinds.add(kind)
        if kind == "bytes":
            self.add_bytes(values)

    def add_bytes(self, values: Iterable[bytes]) -> None:
        """Look at bytes values (one feature's or many records'): images? UTF-8 text?"""
        values = list(values)
        if values and (self.all_images or self.utf8):
            data = b"".join(values)
            ends = np.cumsum([len(v) for v in values], dtype=np.int64)
            self.add_byte_spans(np.frombuffer(data, np.uint8), data, ends - [len(v) for v in values], ends)

    def add_byte_spans(self, arr: np.ndarray, data: bytes, starts: np.ndarray, ends: np.ndarray) -> None:
        """:meth:`add_bytes` of the values ``data[starts[i]:ends[i]]`` (``arr`` views ``data``),
        images grouped by header (:func:`images.image_sizes`) rather than parsed one by one."""
        if self.all_images:
            for size, fmt, _ in images.image_sizes(arr, starts, ends):
                if size is None:
                    self.all_images = False
                    break
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


def _scan_files(options: dict[str, Any], files: list[str],
                sample_records: int | None = None) -> tuple[dict[str, _Stats], int]:
    """Per-feature statistics of the records of ``files`` (the first ``sample_records``), and their count."""
    if FAST_PATH:  # a block of records at a time, with numpy (formats/tfbatch.py)
        from unihub.formats.tfbatch import scan_fast
        return scan_fast(options, files, sample_records)
    source = TFRecordFormat(files, **{k: v for k, v in options.items() if k != "on_error"})
    stats: dict[str, _Stats] = {}
    total = 0
    for _, _, _, example in source._examples(options.get("on_error", "raise"), ReadReport()):
        if sample_records is not None and total >= sample_records:
            break
        total += 1
        add_example(stats, example)
    return stats, total


def add_example(stats: dict[str, _Stats], example: dict[str, Feature]) -> None:
    """Count one parsed Example into the per-feature statistics of a schema scan."""
    for name, (kind, values) in example.items():
        stat = stats.setdefault(name, _Stats())
        stat.add(kind, values)
        if name.endswith(SHAPE_SUFFIX) and kind == "int64":
            stat.shapes.add(tuple(int(v) for v in values))


def _merge_scans(parts: list[tuple[dict[str, _Stats], int]]) -> tuple[dict[str, _Stats], int]:
    stats: dict[str, _Stats] = {}
    for part, _ in parts:
        for name, stat in part.items():
            if name in stats:
                stats[name].merge(stat)
            else:
                stats[name] = stat
    return stats, sum(total for _, total in parts)


def empty_means_null(stats: _Stats, total: int) -> bool:
    """True when a feature holds one value or an empty list in every record (never absent): its field
    is a nullable single value whose None stands for the empty list."""
    return stats.lengths == {0, 1} and stats.present == total


def fields_from_stats(stats: dict[str, _Stats], total: int) -> list[UnischemaField]:
    """The fields of features seen with ``stats`` in ``total`` records, sorted by name; a ``<name>/shape``
    feature beside ``<name>`` gives that field's shapes instead of being a field."""
    sidecars = {n for n in stats if n.endswith(SHAPE_SUFFIX) and n[:-len(SHAPE_SUFFIX)] in stats}
    return [_infer_field(n, s, total, stats.get(n + SHAPE_SUFFIX)) for n, s in sorted(stats.items())
            if n not in sidecars]


def _infer_field(name: str, stats: _Stats, total: int, shape_stats: _Stats | None) -> UnischemaField:
    if len(stats.kinds) > 1:
        raise SchemaError(f"TFRecord feature {name!r} holds {sorted(stats.kinds)} lists in different records; "
                          f"give a schema file that says which to read")
    kind = next(iter(stats.kinds), "bytes")
    # one value or an empty list in every record: a nullable single value, None for the empty list
    # (export writes it back as one); absent in some records and empty in others: a list, so that
    # absent (None) and empty stay apart
    empty_as_null = empty_means_null(stats, total)
    nullable = stats.present < total or empty_as_null
    lengths = stats.lengths - {0} if empty_as_null else stats.lengths
    constant = next(iter(lengths)) if len(lengths) == 1 else None
    if kind == "bytes":
        if constant == 1 and stats.all_images and stats.images:
            heights, widths, channels = ({s[i] for s in stats.sizes} for i in range(3))
            dims = [d.pop() if len(d) == 1 else None for d in (heights, widths, channels)]
            shape = dims[:2] if dims[2] == 1 else dims
            codec = CompressedImageCodec("jpeg" if stats.images == {"jpeg"} else "png")
            return UnischemaField(name, np.uint8, tuple(shape), codec, nullable)
        dtype, arrow = (np.str_, pa.string()) if stats.utf8 else (np.bytes_, pa.binary())
        if constant == 1:
            return UnischemaField(name, dtype, (), ScalarCodec(arrow), nullable)
        return UnischemaField(name, dtype, (constant if constant else None,), None, nullable)
    dtype, arrow = (np.int64, pa.int64()) if kind == "int64" else (np.float32, pa.float32())
    if shape_stats is not None and shape_stats.kinds == {"int64"} and len(shape_stats.lengths) == 1:
        shapes = shape_stats.shapes
        rank = next(iter(shape_stats.lengths))
        shape = next(iter(shapes)) if len(shapes) == 1 else tuple(
            dims.pop() if len(dims := {s[i] for s in shapes}) == 1 else None for i in range(rank))
        return UnischemaField(name, dtype, shape, TensorCodec(), nullable)
    if constant == 1:
        return UnischemaField(name, dtype, (), ScalarCodec(arrow), nullable)
    return UnischemaField(name, dtype, (constant if constant else None,), TensorCodec(), nullable)


# -- the format ------------------------------------------------------------------------------
@register_format("tfrecord", aliases=("tfrecords",), extensions=(".tfrecord", ".tfrecords", ".tfrec"))
class TFRecordFormat(ForeignFormat):
    """TFRecord files (plain, GZIP or ZLIB, any number of shards) of ``tf.train.Example``,
    ``tf.train.SequenceExample``, ``TensorProto`` or opaque records (see :mod:`unihub.formats.tfpayload`).

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
    }

    REFERENCE_READER = "TensorFlow's TFRecordDataset and protobuf messages"

    def __init__(self, sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], **options: Any) -> None:
        super().__init__(sources, **options)
        #: features whose empty lists read as None (one value or none in every record): written back
        #: as empty lists (found by the schema inference)
        self.empty_as_null: list[str] = list(options.get("empty_as_null") or ())

    @classmethod
    def detect(cls, path: str) -> bool:
        """A file whose first record header is valid (any compression), or a directory holding such
        files or files named like TFRecord shards (``train-00000-of-00004``, ``x.tfrecord``)."""
        if os.path.isdir(path):
            seen = 0
            for directory, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
                for name in sorted(n for n in names if not n.startswith((".", "_"))):
                    if named_like_tfrecord(name) or cls.detect(os.path.join(directory, name)):
                        return True
                    seen += 1
                    if seen >= 16:
                        return False
            return False
        try:
            if os.path.isfile(path):
                with _open(path, None) as f:
                    head = f.read(12)
                return len(head) == 12 and _header_ok(head)
        except (OSError, EOFError, ImportError, zlib.error, FormatError):
            pass
        return False

    def files(self) -> list[str]:
        """The record files: paths and patterns as given; from directories, the TFRecord files
        (TF shard names, TFDS layouts, any file holding records); see :mod:`unihub.formats.tffiles`."""
        return self._listing.files

    @cached_property
    def _listing(self) -> Listing:
        return list_files(self.sources, split=self.options.get("split"), is_record_file=type(self).detect)

    def metadata(self) -> dict[str, Any]:
        """What the source held besides records: files that are not records, TFDS's JSON files."""
        listing = self._listing
        info: dict[str, Any] = {}
        if listing.ignored:
            info["not_records"] = [os.path.relpath(p, os.path.dirname(self.sources[0].rstrip("/")) or ".")
                                   for p in listing.ignored[:1000]]
        if listing.tfds:
            info["tfds"] = listing.tfds
        if self.payload != "example":
            info["payload"] = self.payload
        if self.options.get("feature_lists"):
            info["feature_lists"] = list(self.options["feature_lists"])
        if self.empty_as_null:
            info["empty_as_null"] = list(self.empty_as_null)
        return {"tfrecord": info} if info else {}

    @classmethod
    def export_options(cls, extra: Mapping[str, Any], schema: Unischema) -> dict[str, Any]:
        """A TFRecord source's payload kind, feature lists and empty lists (of the fields ``schema``
        still has), so an export gives the source back."""
        info = extra.get("tfrecord") or {} if extra.get("source_format") == "tfrecord" else {}
        options: dict[str, Any] = {"payload": info["payload"]} if info.get("payload") else {}
        for key in ("feature_lists", "empty_as_null"):
            names = [name for name in info.get(key) or () if name in schema]
            if names:
                options[key] = names
        return options

    def prepare(self, schema: Unischema) -> None:
        """SequenceExamples: which fields of ``schema`` are feature lists, when no option said."""
        if self.payload == "sequence_example" and self.options.get("feature_lists") is None:
            from unihub.formats.tfpayload import list_fields

            self.options["feature_lists"] = list_fields(self, list(schema))

    def reference_records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """The records as TensorFlow itself reads them (see :mod:`unihub.formats.tfverify`)."""
        from unihub.formats.tfverify import reference_records

        return reference_records(self)

    @classmethod
    def native_records(cls, schema: Unischema, rows: Iterable[Mapping[str, Any]], extra: Mapping[str, Any],
                       **options: Any) -> Iterator[dict[str, Any]]:
        """Rows of a unihub dataset as TensorFlow would read an export of them (see tfverify)."""
        from unihub.formats.tfverify import native_records

        return native_records(schema, rows, extra, **options)

    @cached_property
    def payload(self) -> str:
        """What the records are: the ``payload`` option, or the first record's kind (see tfpayload)."""
        from unihub.formats.tfpayload import detect

        chosen = self.options.get("payload") or "auto"
        return detect(self) if chosen == "auto" else chosen

    def records(self, on_error: OnError, report: ReadReport) -> Iterator[tuple[str, int, int, bytes]]:
        """``(path, record index, byte offset, data)`` for each well-framed record of every file."""
        check_on_error(on_error)
        for path in self.files():
            for index, offset, data in iter_records(path, compression=self.options.get("compression"),
                                                    on_error=on_error, report=report):
                yield path, index, offset, data

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
            from unihub.formats.tfpayload import infer_schema

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
        :attr:`observe` set gathers the statistics of every record for :meth:`refine_schema`.
        Examples only: other payloads are scanned whole first."""
        return self.infer_schema(sample_records=PROVISIONAL_SAMPLE) if self.payload == "example" else None

    def refine_schema(self, observations: Sequence[Any]) -> Unischema:
        """The schema of every record, from the ``(statistics, records)`` each observing read saw."""
        return self._schema_from(*_merge_scans(list(observations)))

    def _schema_from(self, stats: dict[str, _Stats], total: int) -> Unischema:
        if total == 0:
            raise FormatError(f"{self.sources}: no TFRecord records to infer a schema from", path=str(self.sources))
        fields = fields_from_stats(stats, total)
        if not fields:
            raise FormatError(f"{self.sources}: all {total:,} records are empty tf.train.Examples (no features): "
                              "nothing to convert", path=str(self.sources))
        self.empty_as_null = sorted(n for n, s in stats.items() if empty_means_null(s, total))
        return Unischema("TFRecord", fields)

    def read_batches(self, schema: Unischema, *, batch_size: int = 256,
                     on_error: OnError = "raise") -> Iterator[ColumnBatch]:
        if self.payload != "example":
            from unihub.formats.tfpayload import read_batches

            yield from read_batches(self, self.payload, schema, batch_size, on_error)
            return
        plans = [_Plan.of(f) for f in schema]
        if FAST_PATH and plans:  # a block of records at a time, with numpy (formats/tfbatch.py)
            from unihub.formats.tfbatch import read_batches_fast
            yield from read_batches_fast(self, plans, batch_size, on_error)
            return
        readers = [plan.read for plan in plans]
        columns: list[list[Any]] = [[] for _ in plans]
        stats: dict[str, _Stats] = {}
        if self.observe:
            self.report.observed = (stats, 0)
        for path, index, offset, example in self._examples(on_error, self.report):
            try:
                row = [read(example) for read in readers]
            except _Mismatch as exc:
                if self.observe:
                    raise SchemaOutgrown(f"{path} record {index}: {exc.feature!r} {exc.reason}") from None
                _fail(path, index, offset, exc.reason, on_error, self.report, exc.feature)
                continue
            if self.observe:
                add_example(stats, example)
                self.report.observed = (stats, self.report.observed[1] + 1)
            for column, value in zip(columns, row):
                column.append(value)
            self.report.records += 1
            if plans and len(columns[0]) == batch_size:
                yield {p.field.name: p.column(c) for p, c in zip(plans, columns)}
                columns = [[] for _ in plans]
        if columns and columns[0]:
            yield {p.field.name: p.column(c) for p, c in zip(plans, columns)}

    @classmethod
    def write(cls, target: str, schema: Unischema, batches: Iterable[ColumnBatch], *,
              compression: str | None = None, records_per_file: int | None = None, payload: str = "example",
              feature_lists: Sequence[str] | None = None, empty_as_null: Sequence[str] | None = None,
              **options: Any) -> list[str]:
        """Write records to ``target``: a file (``*.tfrecord``) or a directory of ``part-NNNNN`` shards.

        ``payload``: each row as a ``tf.train.Example`` (default), a ``tf.train.SequenceExample``
        (``feature_lists`` names the fields written as feature lists, the rest is the context), a
        ``TensorProto`` of the schema's one field, or that one bytes field as is. Fields named in
        ``empty_as_null`` write None as an empty list (else None leaves the feature out). Each file
        appears atomically (written to a temporary sibling, then renamed).
        """
        if options:
            raise UnsupportedFormatError(f"unknown TFRecord write options: {sorted(options)}")
        kind = normalize_compression(compression) or "none"
        if payload == "example":
            encode = example_encoder(schema, empty_as_null or ())
        else:
            from unihub.formats.tfpayload import row_encoder

            encode = row_encoder(schema, payload, feature_lists or (), empty_as_null or ())
        if records_per_file is not None and records_per_file <= 0:
            raise SchemaError(f"records_per_file must be positive, got {records_per_file}")
        target = os.fspath(target)
        single = records_per_file is None and os.path.splitext(_stem(target))[1] in \
            (".tfrecord", ".tfrecords", ".tfrec")
        writer = _ShardWriter(target, single, kind, records_per_file)
        try:
            for batch in map(python_columns, batches):
                n = len(next(iter(batch.values()))) if batch else 0
                for row in range(n):
                    writer.write(encode(batch, row))
            return writer.close()
        except BaseException:
            writer.abort()
            raise


# -- reading helpers -------------------------------------------------------------------------
_ABSENT: Feature = (None, None)


class _Mismatch(Exception):
    def __init__(self, feature: str, reason: str) -> None:
        super().__init__(reason)
        self.feature, self.reason = feature, reason


@dataclass(frozen=True)
class _Plan:
    """How one field is read from Examples: worked out once per read, not per record."""

    field: UnischemaField
    category: str  # "image" | "str" | "bytes" (scalars), "text" (lists), "scalar" | "tensor" (numbers)
    dtype: np.dtype
    size: int | None  # values per row for fixed shapes
    text: bool = False  # read from a bytes list (category image, str, bytes or text)
    single: bool = False  # one value per row (category image, str, bytes or scalar)

    @classmethod
    def of(cls, f: UnischemaField) -> _Plan:
        text = f.numpy_dtype in (np.str_, np.bytes_) or not _numeric(f.numpy_dtype)
        if isinstance(f.codec, CompressedImageCodec):
            category = "image"
        elif text:
            category = ("str" if f.numpy_dtype is np.str_ else "bytes") if f.shape == () else "text"
        else:
            category = "scalar" if f.shape == () else "tensor"
        return cls(f, category, f.dtype, int(np.prod(f.shape)) if f.is_fixed_shape else None,
                   category in ("image", "str", "bytes", "text"), category in ("image", "str", "bytes", "scalar"))

    def read(self, example: dict[str, Feature]) -> Any:
        """This field's value in ``example`` (fixed-shape tensors flat); raises _Mismatch."""
        f = self.field
        kind, values = example.get(f.name, _ABSENT)
        if values is None or (not len(values) and (kind is None or self.single)):
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
            if category != "str":
                return values[0]
        try:
            if category == "str":
                return values[0].decode("utf-8")
            if category == "text":
                array = np.empty(len(values), dtype=object)  # object, not "S": numpy strips trailing NULs
                array[:] = [v.decode("utf-8") for v in values] if f.numpy_dtype is np.str_ else values
            else:
                array = np.asarray(values, dtype=self.dtype)
        except UnicodeDecodeError as exc:
            raise _Mismatch(f.name, f"not UTF-8 text: {exc}") from None
        if self.size is not None:
            if array.size != self.size:
                raise _Mismatch(f.name, f"expected {self.size} values for shape {f.shape}, found {array.size}")
            return array if category == "tensor" else array.reshape(f.shape)
        return _reshape(f, array, example)

    def column(self, values: list[Any]) -> Any:
        """One batch's column from the values :meth:`read` returned."""
        f = self.field
        if self.category == "scalar":
            if any(v is None for v in values):
                return [None if v is None else f.numpy_dtype(v) for v in values]
            return np.asarray(values, dtype=self.dtype)
        if self.category == "tensor" and self.size is not None:
            if any(v is None for v in values):
                return [None if v is None else v.reshape(f.shape) for v in values]
            return (np.concatenate(values) if values else np.empty(0, self.dtype)).reshape((-1, *f.shape))
        return values


def _numeric(dtype: Any) -> bool:
    return isinstance(dtype, type) and issubclass(dtype, np.generic) and np.dtype(dtype).kind in "biuf"


def _reshape(f: UnischemaField, array: np.ndarray, example: dict[str, Feature]) -> np.ndarray:
    sidecar = example.get(f.name + SHAPE_SUFFIX)
    if sidecar is not None and sidecar[0] == "int64":
        shape = tuple(int(d) for d in sidecar[1])
        if len(shape) != len(f.shape) or any(d is not None and d != s for d, s in zip(f.shape, shape)) or \
                int(np.prod(shape)) != array.size:
            raise _Mismatch(f.name, f"{array.size} values with shape {shape} do not fit {f.shape}")
        return array.reshape(shape)
    if f.shape[0] is None and None not in f.shape[1:]:
        inner = int(np.prod(f.shape[1:]))
        if inner and array.size % inner == 0:
            return array.reshape((-1, *f.shape[1:]))
        raise _Mismatch(f.name, f"{array.size} values do not fill rows of shape {f.shape[1:]}")
    raise _Mismatch(f.name, f"shape {f.shape} needs a {f.name + SHAPE_SUFFIX!r} feature with each row's shape")


# -- writing helpers -------------------------------------------------------------------------
RowEncoder = Callable[[Mapping[str, Any], int], bytes]


def example_encoder(schema: Unischema, empty_as_null: Sequence[str] = ()) -> RowEncoder:
    """``(column batch, row) -> serialized Example`` for ``schema``; fields in ``empty_as_null``
    write None as an empty list, other None values leave their feature out."""
    encoders = _encoders(schema, empty_as_null)

    def encode(batch: Mapping[str, Any], row: int) -> bytes:
        return encode_entries(entry for name, empty, enc in encoders if name in batch
                              and ((value := batch[name][row]) is not None or empty) for entry in enc(value))

    return encode


def _encoders(schema: Unischema, empty_as_null: Sequence[str] = ()) -> list[tuple[str, bool, Any]]:
    """``(field name, None is an empty list, value -> [(encoded key, feature), ...])`` for each field,
    checked up front."""
    out = []
    for f in schema:
        key = ld(1, f.name.encode())
        if f.name in empty_as_null:
            kind = "bytes" if not _numeric(f.numpy_dtype) or isinstance(f.codec, CompressedImageCodec) else \
                "float" if np.dtype(f.numpy_dtype).kind == "f" else "int64"
            empty = [(key, encode_feature(kind, []))]
        else:
            empty = []
        if isinstance(f.codec, CompressedImageCodec):
            def encode(v: Any, f: UnischemaField = f, key: bytes = key) -> list[tuple[bytes, bytes]]:
                return [(key, ld(1, ld(1, f.codec.encode(f, v))))]  # type: ignore[union-attr]
        elif not _numeric(f.numpy_dtype):
            if f.numpy_dtype not in (np.str_, np.bytes_, decimal.Decimal):
                raise SchemaError(f"field {f.name!r}: TFRecord stores numbers, bytes and strings, "
                                  f"not {dtypes.dtype_name(f.numpy_dtype)}")

            def encode(v: Any, f: UnischemaField = f, key: bytes = key) -> list[tuple[bytes, bytes]]:
                items = [v] if f.shape == () else list(np.asarray(v, dtype=object).ravel())
                blobs = [bytes(i) if isinstance(i, (bytes, bytearray, memoryview)) else str(i).encode() for i in items]
                return [(key, encode_feature("bytes", blobs))]
        else:
            kind = "float" if np.dtype(f.numpy_dtype).kind == "f" else "int64"
            sidecar = ld(1, (f.name + SHAPE_SUFFIX).encode()) if f.shape.count(None) > 1 or None in f.shape[1:] \
                else None

            def encode(v: Any, kind: str = kind, key: bytes = key, shape: Shape = f.shape,
                       sidecar: bytes | None = sidecar) -> list[tuple[bytes, bytes]]:
                if shape == ():
                    return [(key, encode_scalar(kind, v))]
                array = np.asarray(v)
                entries = [(key, encode_feature(kind, array.ravel()))]
                return entries + [(sidecar, encode_feature("int64", array.shape))] if sidecar else entries
        out.append((f.name, bool(empty), _or_empty(encode, empty)))
    return out


def _or_empty(encode: Callable[[Any], list[tuple[bytes, bytes]]],
              empty: list[tuple[bytes, bytes]]) -> Callable[[Any], list[tuple[bytes, bytes]]]:
    """``encode``, with None encoded as ``empty`` (an empty list feature)."""
    if not empty:
        return encode
    return lambda value: empty if value is None else encode(value)


def write_records(path: str, records: Iterable[bytes], *, compression: str | None = None) -> str:
    """Frame serialized records (any payload) into one TFRecord file, atomically; returns ``path``."""
    writer = _ShardWriter(path, True, normalize_compression(compression) or "none", None)
    try:
        for record in records:
            writer.write(record)
        return writer.close()[0]
    except BaseException:
        writer.abort()
        raise


_SUFFIXES = {"none": "", "gzip": ".gz", "zlib": ".zlib"}


def _stem(path: str) -> str:
    """``path`` without a compression suffix (``.gz``, ``.zlib``)."""
    return path.removesuffix(".gz").removesuffix(".zlib")


class _ShardWriter:
    """Writes framed records into shards, each via a temporary sibling renamed on close."""

    def __init__(self, target: str, single: bool, compression: Compression, per_file: int | None) -> None:
        self.target, self.single, self.compression, self.per_file = target, single, compression, per_file
        self.done: list[str] = []
        self.final = self.temp = ""
        self.raw: IO[bytes] | None = None
        self.stream: IO[bytes] | None = None
        self.count = 0
        self.crc = _crc32c()
        if not single:
            os.makedirs(target, exist_ok=True)

    def _name(self, shard: int) -> str:
        suffix = _SUFFIXES[self.compression]
        if not self.single:
            return os.path.join(self.target, f"part-{shard:05d}.tfrecord{suffix}")
        if self.per_file is None:
            return self.target
        stem, ext = os.path.splitext(_stem(self.target))
        return f"{stem}-{shard:05d}{ext}{suffix}"

    def _open(self) -> None:
        self.final = self._name(len(self.done))
        self.temp = os.path.join(os.path.dirname(self.final) or ".",
                                 f".{os.path.basename(self.final)}.tmp-{os.getpid()}")
        self.raw = open(self.temp, "wb")  # noqa: SIM115
        if self.compression == "gzip":
            self.stream = gzip.GzipFile(fileobj=self.raw, mode="wb", mtime=0)
        else:
            self.stream = ZlibWriter(self.raw) if self.compression == "zlib" else self.raw  # type: ignore[assignment]

    def write(self, data: bytes) -> None:
        if self.stream is None:
            self._open()
        length = _U64.pack(len(data))
        self.stream.write(length + _U32.pack(_mask(self.crc(length))) + data  # type: ignore[union-attr]
                          + _U32.pack(_mask(self.crc(data))))
        self.count += 1
        if self.per_file is not None and self.count == self.per_file:
            self._finish()

    def _close_streams(self) -> None:
        for stream in (self.stream, self.raw):
            if stream is not None:
                stream.close()
        self.stream = self.raw = None

    def _finish(self) -> None:
        self._close_streams()
        os.replace(self.temp, self.final)
        self.done.append(self.final)
        self.count = 0

    def close(self) -> list[str]:
        if self.stream is None and not self.done:
            self._open()  # no records: still write one (empty) file
        if self.stream is not None:
            self._finish()
        return self.done

    def abort(self) -> None:
        if self.stream is not None:
            self._close_streams()
            os.remove(self.temp)
