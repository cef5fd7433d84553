"""WebDataset tar shards <-> Unischema columns.

On disk a WebDataset is a set of POSIX tar files ("shards", often named by a brace pattern
such as ``shard-{000000..000099}.tar``). A sample is a run of adjacent members that share a
key: ``000017.png``, ``000017.cls``, ``000017.seg.png`` form the sample whose ``__key__`` is
``000017`` and whose fields are ``png``, ``cls`` and ``seg.png``. The key is the member name
up to the first dot of its base name; the extension (lower-cased) is everything after it
(webdataset's ``base_plus_ext`` rule). Members named ``__name__`` are metadata and skipped,
as webdataset does; directory entries are skipped too. A key whose members are not adjacent
is an error naming both runs (``--option group_keys=true`` gathers them instead).

Fields by extension (the last dot-component decides; see :mod:`.webdataset_fields`):
``png``/``jpg``/``jpeg`` are images kept as their encoded bytes; ``npy`` are tensors (dtype
and shape from the ``.npy`` header, never unpickled; one dtype and rank per field, else an
error naming two members); ``cls``, ``idx``, ... are integers written as text (float64 where
every text reads back as the same number); ``txt`` is text, ``json`` JSON kept as text (UTF-8,
else bytes); anything else is raw bytes. ``__key__`` is a ``str`` field. An extension missing
from some samples makes a nullable field.

A unihub export writes the same layout and starts each shard with a PAX global header whose
``comment`` holds the dataset's Unischema and which member extension holds which field
(:class:`~unihub.formats.webdataset_tar.ShardHeader`); webdataset and tar tools ignore it, and
unihub's ingest uses it, so ``image`` comes back as ``image`` (not ``image.png``) with its
dtype, shape, codec and nullability. ``--option unihub_schema=false`` names fields by extension.

Reading uses :mod:`unihub.formats.tarstream` (plain shards memory-mapped, gzip/bzip2/xz ones
streamed), not :mod:`tarfile`, which costs ~70 µs a member, nor the ``webdataset`` package:
importing webdataset imports torch (~1.5 s), and its pipeline skips malformed members silently
where unihub must report them with the shard and offset (bad header checksums included).
``unihub verify`` reads the shards with :mod:`tarfile` instead (:mod:`.webdataset_verify`).
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa

from unihub.errors import CodecError, FormatError, SchemaError, UnsupportedFormatError
from unihub.formats.codecs import ScalarCodec
from unihub.formats.foreign import (
    ColumnBatch,
    ForeignFormat,
    FormatOption,
    OnError,
    SkippedRecord,
    expand_sources,
    map_in_workers,
    parse_bool,
    parse_choice,
    python_columns,
    register_format,
)
from unihub.formats.schema import Unischema, UnischemaField
from unihub.formats.tarstream import TarFormatError
from unihub.formats.webdataset_fields import FieldStats, column, decoder, member_encoder
from unihub.formats.webdataset_tar import (
    KEY_FIELD,
    Sample,
    ShardHeader,
    is_meta,
    iter_samples,
    read_header,
    row_key,
    split_name,
)
from unihub.formats.webdataset_verify import native_records, tarfile_records

__all__ = ["KEY_FIELD", "Sample", "WebDatasetFormat", "iter_samples", "split_name"]
SHARD_SUFFIXES = (".tar", ".tgz", ".tar.gz", ".tar.bz2", ".tar.xz")
#: the one member of an export of no rows (a ``__name__`` member: metadata, which every reader skips)
EMPTY_MEMBER = "__empty__"



def _scan_shards(job: tuple[list[str], int | None, bool]) -> tuple[dict[str, FieldStats], int]:
    """Statistics per extension over the samples of the files (the first ``sample_records``), and their count.

    Malformed members are left out; :meth:`WebDatasetFormat.read_batches` reports them.
    """
    files, sample_records, group_keys = job
    stats: dict[str, FieldStats] = {}
    seen = 0
    for path in files:
        for sample in iter_samples(path, on_error="skip", skipped=[], group_keys=group_keys):
            if sample_records is not None and seen >= sample_records:
                return stats, seen
            seen += 1
            for extension, data in sample.members.items():
                stat = stats.get(extension)
                if stat is None:
                    stat = stats[extension] = FieldStats(extension)
                stat.add(data, sample.url, sample.offset, sample.key)
    return stats, seen


def _merged(parts: list[tuple[dict[str, FieldStats], int]]) -> tuple[dict[str, FieldStats], int]:
    stats, seen = parts[0]
    for part_stats, part_seen in parts[1:]:
        seen += part_seen
        for extension, stat in part_stats.items():
            if extension in stats:
                stats[extension].merge(stat)
            else:
                stats[extension] = stat
    return stats, seen


@register_format("webdataset", aliases=("wds", "tar"), extensions=(".tar", ".tgz"))
class WebDatasetFormat(ForeignFormat):
    """WebDataset tar shards: files, directories of shards, globs, ``{000..099}`` braces.

    Example::

        source = WebDatasetFormat("data/shard-{000000..000099}.tar")
        schema = source.infer_schema(sample_records=1000)
        for batch in source.read_batches(schema):   # {"__key__": [...], "jpg": [b"...", ...], "cls": array}
            ...
        WebDatasetFormat.write("out/", schema, batches, samples_per_shard=5000)
    """

    OPTIONS = {
        "group_keys": FormatOption("true: gather each key's members from anywhere in its shard (tars made from a "
                                   "directory with tar cf); holds a shard in memory. Default false: a key's "
                                   "members must be adjacent, else an error names both runs", parse_bool),
        "unihub_schema": FormatOption("false: name fields by member extension even in shards a unihub export wrote "
                                      "(default true: use the Unischema the export recorded in them)", parse_bool),
    }
    WRITE_OPTIONS = {
        "samples_per_shard": FormatOption("samples per tar shard (default 10000)", int),
        "pattern": FormatOption("shard file names, with one %d for the shard number (default shard-%06d.tar)"),
        "image_extensions": FormatOption(
            "content (default): an image member's extension says its bytes' format (.png or .jpg); name: keep a "
            "field name that ends in an image extension (an export of shards ingested by extension)",
            parse_choice("content", "name")),
    }

    @classmethod
    def detect(cls, path: str) -> bool:
        if os.path.isdir(path):
            return any(name.endswith(SHARD_SUFFIXES) for name in os.listdir(path))
        return os.path.isfile(path) and tarfile.is_tarfile(path)

    def files(self) -> list[str]:
        """Shards named by the sources; a directory contributes only its tar files."""
        found: list[str] = []
        for source in self.sources:
            shards = expand_sources([source])
            if os.path.isdir(source):
                shards = [s for s in shards if s.endswith(SHARD_SUFFIXES)]
            found.extend(shards)
        return sorted(dict.fromkeys(found))

    @property
    def group_keys(self) -> bool:
        return bool(self.options.get("group_keys", False))

    def samples(self, *, on_error: OnError = "raise") -> Iterator[Sample]:
        """Every sample of every shard, in shard order; skips land in :attr:`report`."""
        for path in self.files():
            yield from iter_samples(path, on_error=on_error, skipped=self.report.skipped, group_keys=self.group_keys)
            self.report.bytes_read += os.path.getsize(path)  # progress, a shard at a time

    # ------------------------------------------------------------------ the export's header
    @cached_property
    def headers(self) -> dict[str, ShardHeader | None]:
        """Each shard's unihub header (None: none), shards whose first header is unreadable left
        out (reading reports them); empty when ``unihub_schema=false``."""
        if not self.options.get("unihub_schema", True):
            return {}
        found: dict[str, ShardHeader | None] = {}
        for path in self.files():
            try:
                found[path] = read_header(path)
            except TarFormatError:
                continue
        return found

    @cached_property
    def header(self) -> ShardHeader | None:
        """The header every shard shares (a unihub export), or None (name fields by extension)."""
        headed = [(path, h) for path, h in self.headers.items() if h is not None]
        if not headed:
            return None
        first_path, first = headed[0]
        plain = next((path for path, h in self.headers.items() if h is None), None)
        if plain is not None:
            raise FormatError(f"{first_path} holds the Unischema of a unihub export but {plain} does not; convert "
                              "them apart, or pass --option unihub_schema=false to name every field by member "
                              "extension", path=plain, offset=0)
        other = next((path for path, h in headed if not h.same_dataset(first)), None)
        if other is not None:
            raise FormatError(f"{first_path} and {other} come from different unihub exports (their schemas differ); "
                              "convert them apart, or pass --option unihub_schema=false", path=other, offset=0)
        return first

    def _keys_are_rows(self, per_shard: int) -> bool:
        """True when the shards' generated keys are exactly the row numbers of this read (a whole
        export, in order), so a dataset without ``__key__`` loses nothing by dropping them."""
        return all(h is not None and h.first_row == i * per_shard for i, h in enumerate(self.headers.values()))

    # ------------------------------------------------------------------------- schema
    def infer_schema(self, *, sample_records: int | None = None) -> Unischema:
        """Fields from the extensions of the first ``sample_records`` samples (None: all), or the
        Unischema a unihub export recorded in the shards.

        Malformed members are left out of the inference; :meth:`read_batches` reports them.
        """
        header = self.header
        if header is not None:
            if header.first_row is None or self._keys_are_rows(header.samples_per_shard or 0):
                return header.schema
            key = UnischemaField(KEY_FIELD, np.str_, (), ScalarCodec(pa.string()), False)
            return Unischema(header.schema.name, [key, *header.schema])  # a subset of the shards: keep the keys
        files = self.files()
        if sample_records is None and self.workers > 1 and len(files) > 1:
            # whole shards in forked workers; the statistics merge exactly
            jobs = [(files[i::self.workers], None, self.group_keys) for i in range(self.workers)]
            stats, seen = _merged(map_in_workers(_scan_shards, jobs, self.workers))
        else:
            stats, seen = _scan_shards((files, sample_records, self.group_keys))
        if seen == 0:
            raise FormatError(f"no samples in {self.sources}: the shards are empty or hold no <key>.<ext> "
                              "members", path=self.sources[0] if self.sources else None)
        fields = [UnischemaField(KEY_FIELD, np.str_, (), ScalarCodec(pa.string()), False)]
        fields += [stats[ext].field(nullable=stats[ext].count < seen) for ext in sorted(stats)]
        return Unischema("WebDataset", fields)

    # ------------------------------------------------------------------------ reading
    def read_batches(self, schema: Unischema, *, batch_size: int = 256,
                     on_error: OnError = "raise") -> Iterator[ColumnBatch]:
        """Column batches of ``schema``: images as encoded bytes, ``.npy`` as arrays, ints, text."""
        if batch_size <= 0:
            raise SchemaError(f"batch_size must be positive, got {batch_size}")
        read = _SampleReader(schema, self.header, self.headers)
        columns: dict[str, list[Any]] = {f.name: [] for f in schema}
        for sample in self.samples(on_error=on_error):
            try:
                row = read.row(sample)
            except FormatError as exc:
                if on_error == "raise":
                    raise
                self.report.skipped.append(SkippedRecord(sample.url, f"key {sample.key}", str(exc)))
                continue
            for name, value in row.items():
                columns[name].append(value)
            self.report.records += 1
            if len(columns[next(iter(columns))]) >= batch_size:
                yield {f.name: column(f, columns[f.name]) for f in schema}
                columns = {f.name: [] for f in schema}
        if columns and columns[next(iter(columns))]:
            yield {f.name: column(f, columns[f.name]) for f in schema}

    def metadata(self) -> dict[str, Any]:
        """The shard names, and how an export of this dataset names image members so that it gives
        these shards back (by the field names, as ingested; or as the unihub export that wrote them)."""
        header = self.header
        return {"webdataset": {"shards": [os.path.basename(p) for p in self.files()],
                               "image_extensions": header.image_extensions if header is not None else "name"}}

    @classmethod
    def export_options(cls, extra: Mapping[str, Any]) -> dict[str, Any]:
        """A dataset ingested from WebDataset exports its image members under the extensions it was read with."""
        if extra.get("source_format") != "webdataset":
            return {}
        info = extra.get("webdataset")
        mode = info.get("image_extensions", "name") if isinstance(info, Mapping) else "name"
        return {"image_extensions": mode if mode in ("content", "name") else "name"}

    # ------------------------------------------------------------------------- verify
    def reference_records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """The samples as :mod:`tarfile` reads the shards (see :mod:`.webdataset_verify`)."""
        return tarfile_records(self.files(), group_keys=self.group_keys)

    @classmethod
    def native_records(cls, schema: Unischema, rows: Iterable[Mapping[str, Any]],
                       extra: Mapping[str, Any], **options: Any) -> Iterator[dict[str, Any]]:
        """The rows as an export of them (with the write options the dataset's metadata implies) holds them."""
        mode = cls.export_options(extra).get("image_extensions", "content")
        return native_records(schema, rows, image_extensions=mode)

    # ------------------------------------------------------------------------ writing
    @classmethod
    def write(cls, target: str, schema: Unischema, batches: Iterable[ColumnBatch], *,
              samples_per_shard: int = 10000, pattern: str = "shard-%06d.tar", image_extensions: str = "content",
              **options: Any) -> list[str]:
        """Tar shards in directory ``target``, ``samples_per_shard`` samples each; returns their paths.

        A sample's members are ``<key>.<extension>``: the key from ``__key__`` (else the row
        index, zero-padded), the extension from the field name, with a suffix added where the
        name does not already say the encoding (``image`` -> ``image.png`` or ``image.jpg`` by
        the cell's bytes, ``boxes`` -> ``boxes.npy``). Null values leave their member out.
        Each shard starts with the header that gives ingest the schema back, is written beside
        its final name and renamed into place when complete; no rows still write one shard.
        """
        _check_write_options(options, samples_per_shard, pattern, image_extensions)
        encoders, members = _encoders(schema, image_extensions)
        if KEY_FIELD in schema and (schema[KEY_FIELD].numpy_dtype is not np.str_ or schema[KEY_FIELD].shape != ()):
            raise SchemaError(f"field {KEY_FIELD!r} of {schema.name!r} is {schema[KEY_FIELD].numpy_dtype.__name__} "
                              f"of shape {schema[KEY_FIELD].shape}; a WebDataset key is a str")
        header = ShardHeader(schema, members, image_extensions, None if KEY_FIELD in schema else 0, samples_per_shard)
        os.makedirs(target, exist_ok=True)
        writer = _ShardSet(target, pattern, samples_per_shard, header)
        try:
            previous_key = None
            for index, row in enumerate(_rows(batches)):
                shard = writer.shard_for(index)
                key = _checked_key(row.get(KEY_FIELD), index, previous_key, KEY_FIELD in schema)
                previous_key = key
                for name, encode in encoders.items():
                    value = row.get(name)
                    if value is not None:
                        extension, data = encode(value)
                        shard.add(f"{key}.{extension}", data)
            return writer.close()
        except BaseException:
            writer.abort()
            raise


class _SampleReader:
    """Samples -> rows of one schema: members found by extension (or by the export's header),
    decoded, and checked (a member the schema lacks, a key the export did not write)."""

    def __init__(self, schema: Unischema, header: ShardHeader | None,
                 headers: Mapping[str, ShardHeader | None]) -> None:
        self.schema = schema
        self.decoders = {f.name: decoder(f) for f in schema if f.name != KEY_FIELD}
        self.fields = header.members if header is not None else None  # extension -> field name
        self.first_rows = ({path: h.first_row for path, h in headers.items() if h is not None}
                           if header is not None and header.first_row is not None and KEY_FIELD not in schema
                           else None)

    def row(self, sample: Sample) -> dict[str, Any]:
        members = sample.members if self.fields is None else self._by_field(sample)
        if self.first_rows is not None:
            self._check_key(sample)
        row: dict[str, Any] = {}
        used = 0
        for f in self.schema:
            if f.name == KEY_FIELD:
                row[f.name] = sample.key
                continue
            data = members.get(f.name)
            used += data is not None
            if data is None:
                if not f.nullable:
                    raise FormatError(f"{sample.url}: sample {sample.key!r} (offset {sample.offset}) has no member "
                                      f"for field {f.name!r}, which is not nullable; infer the schema from more "
                                      "samples or make the field nullable", path=sample.url, offset=sample.offset)
                row[f.name] = None
                continue
            try:
                row[f.name] = self.decoders[f.name](data)
            except (ValueError, OverflowError, CodecError) as exc:
                raise FormatError(f"{sample.url}: sample {sample.key!r} (offset {sample.offset}), member "
                                  f"{self._member_name(sample, f.name)!r}: {exc}", path=sample.url,
                                  offset=sample.offset) from exc
        if used != len(members):
            extra = next(name for name in members if name not in self.decoders)
            raise FormatError(f"{sample.url}: sample {sample.key!r} (offset {sample.offset}): member "
                              f"'{sample.key}.{extra}' has no field in the schema, and would be lost; add a field "
                              f"{extra!r} to the schema", path=sample.url, offset=sample.offset)
        return row

    def _by_field(self, sample: Sample) -> dict[str, bytes]:
        """``field -> bytes`` by the export's header; a member it does not name is an error."""
        out: dict[str, bytes] = {}
        for extension, data in sample.members.items():
            name = self.fields.get(extension)  # type: ignore[union-attr]
            if name is None or name in out:
                why = ("is not in the Unischema the unihub export recorded in this shard" if name is None else
                       f"is a second member of field {name!r}")
                raise FormatError(f"{sample.url}: sample {sample.key!r} (offset {sample.offset}): member "
                                  f"'{sample.key}.{extension}' {why} (the shard was changed after export); pass "
                                  "--option unihub_schema=false to name fields by member extension",
                                  path=sample.url, offset=sample.offset)
            out[name] = data
        return out

    def _check_key(self, sample: Sample) -> None:
        """A dataset without ``__key__`` drops the keys: only the export's own row numbers may go."""
        expected = row_key(self.first_rows.get(sample.url, 0) + sample.index)  # type: ignore[union-attr]
        if sample.key != expected:
            raise FormatError(f"{sample.url}: sample {sample.key!r} (offset {sample.offset}) is not the export's "
                              f"row key {expected!r}, and the recorded Unischema has no {KEY_FIELD!r} field to keep "
                              "it (samples were added, removed or renamed after export); pass --option "
                              "unihub_schema=false to keep the keys", path=sample.url, offset=sample.offset)

    def _member_name(self, sample: Sample, field_name: str) -> str:
        if self.fields is None:
            return f"{sample.key}.{field_name}"
        extension = next((e for e in sample.members if self.fields.get(e) == field_name), field_name)
        return f"{sample.key}.{extension}"


# --------------------------------------------------------------------------- writing
def _check_write_options(options: Mapping[str, Any], samples_per_shard: int, pattern: str,
                         image_extensions: str) -> None:
    if options:
        raise UnsupportedFormatError(f"unknown WebDataset write options: {sorted(options)}")
    if not isinstance(samples_per_shard, int) or samples_per_shard <= 0:
        raise SchemaError(f"samples_per_shard must be a positive whole number, got {samples_per_shard!r}")
    if image_extensions not in ("content", "name"):
        raise UnsupportedFormatError(f"image_extensions must be 'content' or 'name', got {image_extensions!r}")
    try:
        pattern % 0
    except TypeError as exc:
        raise SchemaError(f"pattern must hold one %d-style field for the shard number, got {pattern!r}") from exc


def _encoders(schema: Unischema, image_extensions: str) -> tuple[dict[str, Callable[[Any], tuple[str, bytes]]],
                                                                  dict[str, str]]:
    """Each field's encoder, and ``member extension -> field`` (checked: one field per extension)."""
    encoders, members = {}, {}
    for f in schema:
        if f.name == KEY_FIELD:
            continue
        extensions, encoders[f.name] = member_encoder(f, image_extensions)
        for extension in extensions:
            lowered = extension.lower()  # as webdataset and ingest read it
            if lowered.startswith("_") or lowered in members:
                taken = f"field {members[lowered]!r}" if lowered in members else "webdataset metadata"
                raise SchemaError(f"field {f.name!r} of {schema.name!r} maps to the member extension {extension!r}, "
                                  f"which {taken} takes too; rename the field")
            members[lowered] = f.name
    return encoders, members


def _rows(batches: Iterable[ColumnBatch]) -> Iterator[dict[str, Any]]:
    for batch in batches:
        columns = python_columns(batch)
        n = len(next(iter(columns.values()))) if columns else 0
        for i in range(n):
            yield {name: values[i] for name, values in columns.items()}


def _checked_key(value: Any, index: int, previous: str | None, keyed: bool) -> str:
    """The sample key: ``__key__`` or the zero-padded row index, checked to read back alike."""
    if keyed and value is None:
        raise SchemaError(f"row {index}: {KEY_FIELD!r} is null; a sample needs a key (an export would make one up "
                          "that ingest could not tell from a real one)")
    key = row_key(index) if not keyed else str(value)
    if split_name(f"{key}.x") != (key, "x") or is_meta(f"{key}.x"):
        raise SchemaError(f"row {index}: key {key!r} would not read back: a key's last path component must be "
                          "non-empty and hold no dot, and no component may be a __name__ (webdataset metadata)")
    if key == previous:
        raise SchemaError(f"row {index}: key {key!r} repeats the previous row's; webdataset would merge the two")
    return key


class _ShardWriter:
    """One shard written to a hidden temporary sibling and renamed into place on close."""

    def __init__(self, path: str, header: str) -> None:
        self.path = path
        self.temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{os.getpid()}")
        self.file = open(self.temporary, "wb")  # noqa: SIM115 (closed in commit/abort)
        self.tar = tarfile.open(fileobj=self.file, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": header})

    def add(self, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), 0o444, 0  # reproducible shards
        self.tar.addfile(info, io.BytesIO(data))  # shares data's buffer (no copy)

    def commit(self) -> None:
        self.tar.close()
        self.file.close()
        os.replace(self.temporary, self.path)

    def abort(self) -> None:
        self.file.close()
        if os.path.exists(self.temporary):
            os.remove(self.temporary)


class _ShardSet:
    """The shards of one export: a new one every ``per_shard`` rows, each with its header."""

    def __init__(self, target: str, pattern: str, per_shard: int, header: ShardHeader) -> None:
        self.target, self.pattern, self.per_shard, self.header = target, pattern, per_shard, header
        self.current: _ShardWriter | None = None
        self.written: list[str] = []

    def shard_for(self, index: int) -> _ShardWriter:
        if index % self.per_shard == 0:
            self._commit()
            number = index // self.per_shard
            first_row = None if self.header.first_row is None else index
            header = ShardHeader(self.header.schema, self.header.members, self.header.image_extensions, first_row,
                                 self.header.samples_per_shard)
            self.current = _ShardWriter(os.path.join(self.target, self.pattern % number), header.to_text())
        return self.current  # type: ignore[return-value]

    def _commit(self) -> None:
        if self.current is not None:
            self.current.commit()
            self.written.append(self.current.path)
            self.current = None

    def close(self) -> list[str]:
        if not self.written and self.current is None:  # no rows: one shard, so the schema still reads back,
            self.shard_for(0).add(EMPTY_MEMBER, b"")  # with a metadata member (tarfile fails on a header alone)
        self._commit()
        return self.written

    def abort(self) -> None:
        if self.current is not None:
            self.current.abort()
