"""Whole-dataset conversion: source -> canonical (Unischema Parquet) -> sink, streaming.

``convert(src, dst)`` ingests a foreign dataset (TFRecord, HDF5, WebDataset, image folder)
into a unihub dataset, exports a unihub dataset back to a foreign format, or rewrites a
unihub dataset. Formats are detected from paths and contents unless given. Output is atomic
(each writer writes beside the target and renames on success), the source is only read.

    from unihub.converters.convert import convert
    convert("data/train-*.tfrecord", "data/train")                 # TFRecord -> unihub
    convert("data/train", "export/shards", to_format="webdataset")  # unihub -> tar shards
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from unihub.errors import DatasetExistsError, SchemaError, UnsupportedFormatError
from unihub.formats.foreign import FORMATS, ColumnBatch, OnError, SkippedRecord, detect_format, expand_braces
from unihub.formats.schema import Unischema

UNIHUB = "unihub"


@dataclass
class ConvertResult:
    """What a conversion did."""

    source: str
    target: str
    from_format: str
    to_format: str
    rows: int
    seconds: float
    bytes_read: int = 0
    skipped: list[SkippedRecord] = field(default_factory=list)

    def summary(self) -> str:
        rate = self.rows / self.seconds if self.seconds > 0 else float("inf")
        text = (f"converted {self.rows:,} rows {self.from_format} -> {self.to_format} in {self.seconds:.1f} s "
                f"({rate:,.0f} rows/s): {self.target}")
        if self.skipped:
            text += f"; skipped {len(self.skipped)} bad records: " + "; ".join(
                f"{s.path} {s.location}: {s.reason}" for s in self.skipped[:10])
            if len(self.skipped) > 10:
                text += f"; ... {len(self.skipped) - 10} more"
        return text


def is_unihub_dataset(path: str) -> bool:
    """A directory holding Parquet files (or ``_common_metadata``), or a ``.parquet`` file."""
    base = expand_braces(os.fspath(path))[0]
    if os.path.isfile(base):
        return base.endswith((".parquet", ".parq", ".pq"))
    if not os.path.isdir(base):
        return "://" in base and not base.startswith("file://")
    for _root, _, names in os.walk(base):
        if any(n == "_common_metadata" or n.endswith(".parquet") for n in names):
            return True
    return False


def resolve_source_format(src: str, from_format: str | None) -> str:
    if from_format:
        return UNIHUB if from_format in (UNIHUB, "parquet") else FORMATS.canonical(from_format)
    if is_unihub_dataset(src):
        return UNIHUB
    name = detect_format(src)
    if name is None:
        raise UnsupportedFormatError(f"{src}: cannot tell its format from the name or contents; pass --from "
                                     f"(one of: {', '.join([UNIHUB, *FORMATS.names()])})")
    return name


def resolve_target_format(dst: str, to_format: str | None) -> str:
    if to_format:
        return UNIHUB if to_format in (UNIHUB, "parquet") else FORMATS.canonical(to_format)
    import unihub.formats.formats_all  # noqa: F401

    ext = os.path.splitext(dst)[1]
    name = FORMATS.by_extension(ext) if ext and ext != ".parquet" else None
    return name or UNIHUB


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, from_format: str | None = None,
            to_format: str | None = None, schema: Unischema | str | os.PathLike[str] | None = None,
            overwrite: bool = False, row_group_size_mb: float = 32, batch_size: int = 256,
            on_error: OnError = "raise", progress: bool | None = None, format_options: Mapping[str, Any] | None = None,
            engine: str = "local", master: str = "local[2]", spark: Any = None) -> ConvertResult:
    """Convert ``src`` to ``dst``; see the module docstring. ``schema`` is a Unischema or a JSON file."""
    import unihub.formats.formats_all  # noqa: F401  (registers every format)

    src, dst = os.fspath(src), os.fspath(dst)
    source_format = resolve_source_format(src, from_format)
    target_format = resolve_target_format(dst, to_format)
    if engine not in ("local", "spark"):
        raise UnsupportedFormatError(f"engine must be 'local' or 'spark', got {engine!r}")
    if engine == "spark":
        if source_format == UNIHUB or target_format != UNIHUB:
            raise UnsupportedFormatError("engine='spark' converts a foreign format into unihub; "
                                         f"use the local engine for {source_format} -> {target_format}")
        from unihub.converters.spark import convert_with_spark  # imports this module: keep it local

        return convert_with_spark(src, dst, from_format=source_format, schema=schema, overwrite=overwrite,
                                  master=master, spark=spark, row_group_size_mb=row_group_size_mb,
                                  on_error=on_error, format_options=format_options)
    if os.path.exists(dst) and not overwrite:
        raise DatasetExistsError(f"{dst} already exists; pass --overwrite (overwrite=True) to replace it")
    start = time.perf_counter()
    meter = ProgressMeter(enabled=progress)
    given = load_schema(schema) if schema is not None else None
    if source_format == UNIHUB:
        batches, out_schema, extra, report = _unihub_batches(src, given, batch_size)
    else:
        source = FORMATS.get(source_format)(src, **dict(format_options or {}))
        out_schema = given or source.infer_schema()
        batches = source.read_batches(out_schema, batch_size=batch_size, on_error=on_error)
        extra = {"source_format": source_format, "source": src, **source.metadata()}
        report = source
    counted = meter.count(batches)
    if target_format == UNIHUB:
        from unihub.formats.writer import write_dataset

        result = write_dataset(dst, out_schema, counted, batched=True, row_group_size_mb=row_group_size_mb,
                               overwrite=overwrite, extra_metadata=extra)
        rows = result.num_rows
    else:
        sink = FORMATS.get(target_format)
        options = _export_options(target_format, extra, overwrite)
        sink.write(dst, out_schema, counted, **options)
        rows = meter.rows
    meter.close()
    return ConvertResult(src, dst, source_format, target_format, rows, time.perf_counter() - start,
                         skipped=list(getattr(getattr(report, "report", None), "skipped", []) or []))


def _export_options(target_format: str, extra: Mapping[str, Any], overwrite: bool) -> dict[str, Any]:
    """Options the sink needs from the source's metadata (class names for image folders)."""
    import inspect

    write = FORMATS.get(target_format).write
    params = inspect.signature(write).parameters
    options: dict[str, Any] = {}
    if "overwrite" in params:
        options["overwrite"] = overwrite
    if "classes" in params and extra.get("classes"):
        options["classes"] = list(extra["classes"])
    return options


def _unihub_batches(src: str, given: Unischema | None, batch_size: int):
    """Column batches of a unihub dataset, images as their stored bytes, in storage order."""
    from unihub.formats.parquet import open_dataset
    from unihub.readers.reader import make_batch_reader

    store = open_dataset(src)
    schema = given or store.schema
    extra = dict(store.extra_metadata)

    def batches() -> Iterator[ColumnBatch]:
        with make_batch_reader(store, schema_fields=list(schema.fields), shuffle_row_groups=False,
                               decode_images=False, workers_count=2) as reader:
            names = list(reader.schema.fields)  # field names need not be identifiers (``image.png``)
            for batch in reader:
                yield dict(zip(names, batch))

    return batches(), schema, extra, None


def load_schema(schema: Unischema | str | os.PathLike[str]) -> Unischema:
    """A Unischema, or one read from a JSON file (``Unischema.to_json()`` output)."""
    if isinstance(schema, Unischema):
        return schema
    path = os.fspath(schema)
    try:
        with open(path, encoding="utf-8") as handle:
            return Unischema.from_json(handle.read())
    except OSError as exc:
        raise SchemaError(f"cannot read schema file {path}: {exc}") from exc


class ProgressMeter:
    """Counts rows through the pipeline; draws a one-line progress bar on a terminal (stderr)."""

    def __init__(self, *, enabled: bool | None = None, total: int | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.total = total
        self.rows = 0
        self.start = time.perf_counter()
        self._last = 0.0

    def count(self, batches) -> Iterator[ColumnBatch]:
        for batch in batches:
            n = _batch_rows(batch)
            self.rows += n
            self._draw()
            yield batch

    def _draw(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or (not force and now - self._last < 0.2):
            return
        self._last = now
        elapsed = max(now - self.start, 1e-9)
        rate = self.rows / elapsed
        eta = f", ETA {(self.total - self.rows) / rate:.0f} s" if self.total and rate else ""
        sys.stderr.write(f"\r{self.rows:,} rows, {rate:,.0f} rows/s{eta}   ")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(force=True)
            sys.stderr.write("\n")


def _batch_rows(batch: Any) -> int:
    if hasattr(batch, "num_rows"):
        return int(batch.num_rows)
    for values in (batch.values() if isinstance(batch, Mapping) else []):
        return len(values)
    return 0
