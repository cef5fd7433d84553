"""The two ``tf.train.Example`` parsers of a TFRecord read, named in one place, and the reference one.

``block`` (the default, :mod:`unihub.formats.tfrecord.example_block`) parses a block of records at a
time with numpy; ``record`` (here) parses one record at a time with
:func:`~unihub.formats.tfrecord.example.parse_example`. Both give the same batches (values and
dtypes), errors (messages, offsets, record numbers), reports and schema statistics;
``tests/formats/tfrecord/test_parsers.py`` holds them equal on generated and corrupted records. The
block parser hands every record it cannot vouch for to the record parser's code, so the record parser
is the reference. The choice is the reading option ``parser`` (``TFRecordFormat(..., parser="record")``,
``--option parser=record``), a parameter that travels with the source to forked and Spark workers.

Why hand-written and not protobuf's own classes: ``benchmarks/example_parsers.py`` parsed 100,000
Examples (a 32x32 JPEG, a label, 4 floats, 8 ints) with protobuf 7.36 (upb) classes built from
``example.proto`` in a private ``DescriptorPool`` (TensorFlow and the ``tfrecord`` package register the
same names in the default pool, so neither's classes can be used beside the other's) and with unihub's
two parsers; CPU µs per record, best of 3 alternated rounds, twice (2 shared cores, 2026-12-06):

=======================================================  ==========  ===============
parser                                                   ints < 128  ints up to 2^40
=======================================================  ==========  ===============
protobuf ``FromString`` alone (no value taken out)             1.55             1.63
protobuf into columns (values appended, numpy per block)       8.29             8.51
protobuf into a dict of lists/arrays (as parse_example)       24.88            24.96
unihub ``record`` (``parse_example``)                         10.28            28.21
unihub ``block`` (1,024 records into numpy/Arrow columns)      1.47             2.22
=======================================================  ==========  ===============

The block parser, which serves every read, costs less than protobuf's bare ``FromString`` and 4-6x
less than protobuf's best columnar use: it stays. (Before 2026-12-06 it decoded multi-byte varints
run by run, 19.7 µs a record with large ints, slower than protobuf; they are decoded all at once now,
see ``example_block._varint_rows``.) The record parser, which reads only what the block parser hands
over (another layout, damage) and is the reference, costs less than protobuf's per-record form with
small ints (10.3 against 24.9) and 13% more with large ones; it stays too: protobuf parses a
SequenceExample or a TensorProto among Examples as an Example with unknown fields, dropping their data
without a word (parse_example refuses it and says what the record is: DESIGN decision 12), it reads
what TensorFlow reads (held equal in the property test), and it needs nothing installed (protobuf is no
dependency of unihub).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from unihub.formats.base import ColumnBatch, OnError, ReadReport, SchemaOutgrown
from unihub.formats.tfrecord.example_block import read_blocks, scan_blocks
from unihub.formats.tfrecord.records import _fail
from unihub.formats.tfrecord.schema import UNLISTED, Scan, _Mismatch, _Plan, add_example, unlisted_check
from unihub.runtime.memory import BatchCut, value_nbytes

if TYPE_CHECKING:  # format.py imports this module
    from unihub.formats.tfrecord.format import TFRecordFormat

__all__ = ["DEFAULT_PARSER", "EXAMPLE_PARSERS", "ExampleParser", "ParserName", "read_records", "scan_records"]

ParserName = Literal["block", "record"]
DEFAULT_PARSER: ParserName = "block"


# -- the reference: record by record ------------------------------------------------------------
def scan_records(source: TFRecordFormat, on_error: OnError, sample_records: int | None = None) -> tuple[Scan, int]:
    """Per-feature statistics of the records of ``source`` (the first ``sample_records``), and their count."""
    stats = Scan()
    total = 0
    for path, index, _, example in source._examples(on_error, ReadReport()):
        if sample_records is not None and total >= sample_records:
            break
        total += 1
        add_example(stats, example, f"{path} record {index}")
    return stats, total


def read_records(source: TFRecordFormat, plans: list[_Plan], batch_size: int,
                 on_error: OnError) -> Iterator[ColumnBatch]:
    """What :meth:`TFRecordFormat.read_batches` yields for Examples, parsed a record at a time."""
    columns: list[list[Any]] = [[] for _ in plans]
    unlisted = unlisted_check([p.field for p in plans], source.options.get("fields"))
    cut = BatchCut(batch_size, source.batch_bytes)
    if source.observe:
        source.report.observed = (Scan(), 0)
    for path, index, offset, example in source._examples(on_error, source.report):
        row = _row(source, plans, unlisted, example, path, index, offset, on_error)
        if row is None:
            continue
        for column, value in zip(columns, row):
            column.append(value)
        source.report.records += 1
        if plans and cut.add(value_nbytes(row)):
            yield {p.field.name: p.column(c) for p, c in zip(plans, columns)}
            columns = [[] for _ in plans]
            cut.reset()
    if columns and columns[0]:
        yield {p.field.name: p.column(c) for p, c in zip(plans, columns)}


def _row(source: TFRecordFormat, plans: list[_Plan], unlisted: Callable[[Any], str | None], example: Any,
         path: str, index: int, offset: int, on_error: OnError) -> list[Any] | None:
    """One record's values, a plan each (and its statistics, when the read observes); None where the
    record fails (reported or raised per ``on_error``)."""
    try:
        lost = unlisted(example)
        if lost is not None:
            raise _Mismatch(lost, UNLISTED)
        row = [plan.read(example) for plan in plans]
    except _Mismatch as exc:
        if source.observe and exc.feature is not None:  # not a bad image (_BadImage): the schema is outgrown
            raise SchemaOutgrown(f"{path} record {index}: {exc.feature!r} {exc.reason}") from None
        _fail(path, index, offset, exc.reason, on_error, source.report, exc.feature)
        return None
    if source.observe:
        stats, seen = source.report.observed
        add_example(stats, example, f"{path} record {index}")
        source.report.observed = (stats, seen + 1)
    return row


# -- the pair ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExampleParser:
    """One way to parse a source's Examples: its schema scan and its read."""

    #: ``scan(source, on_error, sample_records) -> (statistics, records)``
    scan: Callable[[TFRecordFormat, OnError, int | None], tuple[Scan, int]]
    #: ``read(source, plans, batch_size, on_error) -> batches``
    read: Callable[[TFRecordFormat, list[_Plan], int, OnError], Iterator[ColumnBatch]]


#: the two parsers (the ``parser`` option): the same batches, errors, reports and statistics from each
EXAMPLE_PARSERS: dict[ParserName, ExampleParser] = {
    "block": ExampleParser(scan_blocks, read_blocks),  # a block at a time, with numpy: the default
    "record": ExampleParser(scan_records, read_records),  # a record at a time: the reference
}
