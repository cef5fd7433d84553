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
Examples (a 32x32 JPEG, a label, 4 floats, 8 ints) with protobuf 7.36 (upb) from a private
``DescriptorPool`` built from ``example.proto`` (TensorFlow and the ``tfrecord`` package register
the same names in the default pool, so neither's classes can be used beside the other's), 5 rounds
alternated, best round, CPU µs per record on 2 shared cores (2026-12-06):

=====================================================  ========
protobuf ``Example.FromString`` only                       0.83
protobuf ``FromString`` + values out (lists, numpy)        4.56
unihub per record (``parse_example``)                      5.63
unihub block (1,024 records into numpy/Arrow columns)      0.48
=====================================================  ========

The block parser, which serves every read, is the fastest by 9x over protobuf with the values taken
out (what a reader needs), and protobuf would add a dependency (DESIGN decision 11) that clashes with
TensorFlow's and ``tfrecord``'s registrations. protobuf with values out is ~20% faster than the
per-record parser, which only reads the records the block parser hands over (another layout, damage)
and serves as the reference: kept, since its errors name what is wrong where (protobuf says only
"Error parsing message") and it needs nothing installed. So: the hand-written parsers stay.
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
