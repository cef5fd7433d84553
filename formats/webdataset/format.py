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
``png``/``jpg``/``jpeg`` are images kept as their encoded bytes (uint8, or uint16 for 16-bit
PNGs; one bit depth per field); ``npy`` are tensors (dtype
and shape from the ``.npy`` header, never unpickled; one dtype and rank per field, else an
error naming two members); ``cls``, ``idx``, ... are integers written as text (float64 where
every text reads back as the same number); ``txt`` is text, ``json`` JSON kept as text (UTF-8,
else bytes); anything else is raw bytes. ``__key__`` is a ``str`` field. An extension missing
from some samples makes a nullable field. ``.jpeg`` members join the ``.jpg`` field where both occur
(never in one sample).

Every member comes back from an export byte for byte, name included: where a member is not what the
export would write for its value (``007`` or ``3\n`` as a class, ``2`` in a float64 field, a
big-endian or Fortran-order ``.npy``, ``b.JPG``, ``c.jpeg`` in the ``jpg`` field), the row's
``__spelling__`` field keeps the difference (:mod:`.webdataset_spelling`); shards that need none
have no such field.

A unihub export writes the same layout and starts each shard with a PAX global header whose
``comment`` holds the dataset's Unischema and which member extension holds which field
(:class:`~unihub.formats.webdataset.tar.ShardHeader`); webdataset and tar tools ignore it, and
unihub's ingest uses it, so ``image`` comes back as ``image`` (not ``image.png``) with its
dtype, shape, codec and nullability. ``--option unihub_schema=false`` names fields by extension.

Reading uses :mod:`unihub.formats.webdataset.tarstream` (plain shards memory-mapped, gzip/bzip2/xz ones
streamed), not :mod:`tarfile`, which costs ~70 µs a member, nor the ``webdataset`` package:
importing webdataset imports torch (~1.5 s), and its pipeline skips malformed members silently
where unihub must report them with the shard and offset (bad header checksums included).
``unihub verify`` reads the shards with :mod:`tarfile` instead (:mod:`.webdataset_verify`).
Samples come a window of the shard at a time (:mod:`.webdataset_blocks`): where every sample of a
window has the same members, they go out as one Arrow array an extension, with no Python object a
member, and :mod:`.webdataset_columns` turns those into the batch's columns.
"""

from __future__ import annotations

import copy
import os
import posixpath
import tarfile
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa

from unihub.errors import CodecError, FormatError, SchemaError
from unihub.formats.base import (
    ColumnBatch,
    ForeignFormat,
    FormatOption,
    OnError,
    SchemaOutgrown,
    SkippedRecord,
    expand_braces,
    expand_sources,
    map_in_workers,
    parse_bool,
    parse_choice,
    register_format,
    unique_files,
)
from unihub.formats.webdataset.blocks import SampleBlock, iter_blocks
from unihub.formats.webdataset.columns import ColumnReader, observe
from unihub.formats.webdataset.fields import FieldStats, column, decoder, field_extension
from unihub.formats.webdataset.spelling import SPELLING_FIELD, RowSpeller, Spelling, spelling_field, spellings_text
from unihub.formats.webdataset.tar import (
    KEY_FIELD,
    Sample,
    ShardHeader,
    is_unihub_comment,
    iter_samples,
    read_header,
    row_key,
    split_name,
)
from unihub.formats.webdataset.tarstream import TarFormatError
from unihub.formats.webdataset.verify import native_records, tarfile_records
from unihub.formats.webdataset.write import write_shards
from unihub.fs import sources
from unihub.fs.outputs import Outputs
from unihub.runtime.memory import BatchCut
from unihub.schema.codecs import CompressedImageCodec, ScalarCodec
from unihub.schema.image_checks import ValidateImages
from unihub.schema.unischema import Unischema, UnischemaField

__all__ = ["KEY_FIELD", "Sample", "WebDatasetFormat", "iter_samples", "split_name"]
SHARD_SUFFIXES = (".tar", ".tgz", ".tar.gz", ".tar.bz2", ".tar.xz")
#: samples scanned for the schema a single-pass conversion starts with (see provisional_schema)
PROVISIONAL_SAMPLE = 1000
#: batches whose columns are made in one go (each step's fixed cost shared by more rows), then cut apart
_UNIT_BATCHES = 4


def _cut(batches: Iterable[ColumnBatch], rows: int) -> Iterator[ColumnBatch]:
    """``batches`` cut into batches of at most ``rows`` rows (slices: nothing copied)."""
    for batch in batches:
        count = len(next(iter(batch.values()))) if batch else 0
        if count <= rows:
            yield batch
            continue
        for start in range(0, count, rows):
            yield {name: values[start:start + rows] for name, values in batch.items()}


def _scan_shards(job: tuple[list[str], int | None, bool]) -> tuple[dict[str, FieldStats], int]:
    """Statistics per extension over the samples of the files (the first ``sample_records``), and their count.

    Malformed members are left out; :meth:`WebDatasetFormat.read_batches` reports them.
    """
    files, sample_records, group_keys = job
    stats: dict[str, FieldStats] = {}
    seen = 0
    for path in files:
        for block in iter_blocks(path, on_error="skip", skipped=[], group_keys=group_keys):
            if sample_records is not None:
                if seen >= sample_records:
                    return stats, seen
                block = block.slice(0, min(len(block), sample_records - seen))
            observe(stats, block, {})
            seen += len(block)
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


def _folded(stats: dict[str, FieldStats]) -> dict[str, FieldStats]:
    """``stats`` with each alias extension (``seg.jpeg``) read into the field of its main one (``seg.jpg``) where
    both occur and never in one sample: one image field, the alias members keeping their spelling."""
    folded = dict(stats)
    for extension, stat in stats.items():
        main = field_extension(extension)
        if main != extension and main in folded and not stat.beside_alias:
            merged = copy.deepcopy(folded[main])
            merged.merge(stat)
            merged.respelled = True
            folded[main] = merged
            del folded[extension]
    return folded


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
        "samples_per_shard": FormatOption("samples per tar shard (default 10000; a target named x.tar is one shard "
                                          "of every sample unless this is given)", int),
        "pattern": FormatOption("shard file names, with one %d for the shard number (default shard-%06d.tar)"),
        "image_extensions": FormatOption(
            "content (default): an image member's extension says its bytes' format (.png or .jpg); name: keep a "
            "field name that ends in an image extension (an export of shards ingested by extension)",
            parse_choice("content", "name")),
    }

    @classmethod
    def written_by_unihub(cls, fs: Any, path: str) -> bool:
        """A shard of unihub's: its PAX global header holds the unihub header an export writes (tarfile reads
        the headers before the first member, not its data)."""
        with fs.open_input_file(path) as raw, tarfile.open(fileobj=raw, mode="r:") as tar:
            return is_unihub_comment(tar.pax_headers.get("comment"))

    @classmethod
    def detect(cls, path: str) -> bool:
        if sources.isdir(path):
            return any(name.lower().endswith(SHARD_SUFFIXES) for name in sources.listdir(path))
        if not sources.isfile(path):
            return False
        with sources.open_input(path) as handle:
            try:
                return tarfile.is_tarfile(handle)
            except (EOFError, zlib.error):  # a gzip stream cut short or corrupt, which tarfile lets through
                return False

    def files(self) -> list[str]:
        """Shards named by the sources (a directory contributes only its tar files), sorted by name,
        or in export order where every shard holds a unihub export's header."""
        return list(self._files)

    @cached_property
    def _files(self) -> list[str]:
        named = self._named_files
        headers = self.headers
        if headers and len(headers) == len(named) and all(h is not None for h in headers.values()):
            return sorted(named, key=lambda path: headers[path].first_row)  # type: ignore[union-attr]
        return named

    def caveats(self) -> list[str]:
        """Shards of a folder source found in more than one of its folders (``train/``, ``val/``): read as one
        dataset, which may not be what was meant."""
        folders = sorted({posixpath.dirname(path) for path in self._named_files})
        if len(folders) < 2 or not any(sources.isdir(s) for s in self.sources):
            return []
        shown = ", ".join(folders[:3]) + (f", ... ({len(folders)} in all)" if len(folders) > 3 else "")
        return [f"the shards come from {len(folders)} folders ({shown}), read as one dataset: convert each folder on "
                "its own to keep them apart"]

    @cached_property
    def _named_files(self) -> list[str]:
        found: list[str] = []
        for source in self.sources:
            for pattern in expand_braces(sources.without_query(source)):  # a folder in {a,b} is a folder too
                shards = expand_sources([pattern])
                if sources.isdir(pattern):
                    shards = [s for s in shards if s.lower().endswith(SHARD_SUFFIXES)]  # a.TAR too
                found.extend(shards)
        return unique_files(found)

    @property
    def group_keys(self) -> bool:
        return bool(self.options.get("group_keys", False))

    def samples(self, *, on_error: OnError = "raise") -> Iterator[Sample]:
        """Every sample of every shard, in shard order; skips land in :attr:`report`."""
        for block in self.blocks(on_error=on_error):
            yield from block.samples()

    def blocks(self, *, on_error: OnError = "raise") -> Iterator[SampleBlock]:
        """:meth:`samples` in blocks, members as columns where they allow (:mod:`.webdataset_blocks`)."""
        for path in self.files():
            yield from iter_blocks(path, on_error=on_error, skipped=self.report.skipped, group_keys=self.group_keys)
            self.report.bytes_read += sources.getsize(path)  # progress, a shard at a time

    # ------------------------------------------------------------------ the export's header
    @cached_property
    def headers(self) -> dict[str, ShardHeader | None]:
        """Each shard's unihub header (None: none), shards whose first header is unreadable left
        out (reading reports them); empty when ``unihub_schema=false``."""
        if not self.options.get("unihub_schema", True):
            return {}
        found: dict[str, ShardHeader | None] = {}
        for path in self._named_files:
            try:
                found[path] = read_header(path)
            except TarFormatError:
                continue
        return found

    @cached_property
    def header(self) -> ShardHeader | None:
        """The header every shard shares (a unihub export), or None (name fields by extension)."""
        headed = [(path, header) for path in self.files() if (header := self.headers.get(path)) is not None]
        if not headed:
            return None
        first_path, first = headed[0]
        plain = next((path for path in self.files() if path in self.headers and self.headers[path] is None), None)
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
        export), so a dataset without ``__key__`` loses nothing by dropping them."""
        firsts = [self.headers.get(path) for path in self.files()]
        return all(h is not None and h.first_row == i * per_shard for i, h in enumerate(firsts))

    # ------------------------------------------------------------------------- schema
    def infer_schema(self, *, sample_records: int | None = None) -> Unischema:
        """Fields from the extensions of the first ``sample_records`` samples (None: all), or the
        Unischema a unihub export recorded in the shards.

        Malformed members are left out of the inference; :meth:`read_batches` reports them.
        """
        header = self.header
        if header is not None:
            if not header.row_keys or self._keys_are_rows(header.samples_per_shard):
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
        return self._schema_from(stats, seen)

    def provisional_schema(self) -> Unischema | None:
        """The schema of the first :data:`PROVISIONAL_SAMPLE` samples, for a single pass: read_batches
        with :attr:`observe` set gathers the statistics of every sample for :meth:`refine_schema`.
        None for a unihub export's shards, whose header holds the schema (no scan needed)."""
        if self.header is not None:
            return None
        return self.infer_schema(sample_records=PROVISIONAL_SAMPLE)

    def refine_schema(self, observations: Sequence[Any]) -> Unischema:
        """The schema of every sample, from the ``(statistics, samples)`` each observing read saw."""
        parts = [part for part in observations if part is not None]
        return self._schema_from(*_merged(parts)) if parts else self._schema_from({}, 0)

    def _schema_from(self, stats: dict[str, FieldStats], seen: int) -> Unischema:
        if seen == 0:
            for path in self.files():  # every sample was malformed: the first fault (file, offset) says why
                for _ in iter_samples(path, group_keys=self.group_keys):
                    pass
            raise FormatError(f"no samples in {self.where}: the shards are empty or hold no <key>.<ext> "
                              "members", path=self.sources[0] if self.sources else None)
        for name, holds in ((KEY_FIELD, "each sample's key"), (SPELLING_FIELD, "members' spellings")):
            if name in stats:  # the field unihub adds: two fields of one name, one member's bytes lost
                raise FormatError(f"{self.where} holds members named <key>.{name}: that extension is the field "
                                  f"unihub keeps {holds} in (their bytes would be lost); rename the members",
                                  path=self.sources[0] if self.sources else None)
        stats = _folded(stats)
        fields = [UnischemaField(KEY_FIELD, np.str_, (), ScalarCodec(pa.string()), False)]
        fields += [stats[ext].field(nullable=stats[ext].count < seen) for ext in sorted(stats)]
        if any(stats[f.name].spelled(f) for f in fields[1:]):
            fields.append(spelling_field())  # members an export would spell otherwise: each row keeps how
        return Unischema("WebDataset", fields)

    # ------------------------------------------------------------------------ reading
    def read_batches(self, schema: Unischema, *, batch_size: int = 256,
                     on_error: OnError = "raise") -> Iterator[ColumnBatch]:
        """Column batches of ``schema``: images as encoded bytes, ``.npy`` as arrays, ints, text."""
        if batch_size <= 0:
            raise SchemaError(f"batch_size must be positive, got {batch_size}")
        read = _SampleReader(schema, self.header, self.headers, self.validate_images, observe=self.observe)
        stats: dict[str, FieldStats] = {}
        seen = 0
        if self.observe:
            self.report.observed = (stats, 0)
        pending: list[SampleBlock] = []
        cut = BatchCut(_UNIT_BATCHES * batch_size, self.batch_bytes)  # a unit: the columns made at once
        for block in self.blocks(on_error=on_error):
            start = 0
            for end, size in enumerate(block.sample_bytes(), start=1):
                if cut.add(size):
                    pending.append(block.slice(start, end))
                    start = end
                    unit = SampleBlock.concat(pending)
                    if self.observe:
                        seen += len(unit)
                        self.report.observed = (stats, seen)
                    yield from _cut(self._batch(read, unit, stats, on_error), batch_size)
                    pending = []
                    cut.reset()
            if start < len(block):
                pending.append(block.slice(start, len(block)))
        if pending:
            unit = SampleBlock.concat(pending)
            if self.observe:
                self.report.observed = (stats, seen + len(unit))
            yield from _cut(self._batch(read, unit, stats, on_error), batch_size)

    def _batch(self, read: _SampleReader, block: SampleBlock, stats: dict[str, FieldStats],
               on_error: OnError) -> Iterator[ColumnBatch]:
        """One column batch of the samples of ``block``: a field at a time where the columns allow
        (:mod:`.webdataset_columns`), else row by row (bad samples raise or are skipped)."""
        cache: dict[str, Any] = {}
        if self.observe:
            observe(stats, block, cache)
        columns = read.columns(block, cache)
        if columns is not None:
            self.report.records += len(block)
            yield columns
            return
        rows: dict[str, list[Any]] = {f.name: [] for f in read.schema}
        for sample in block.samples():
            try:
                row = read.row(sample)
            except FormatError as exc:
                if on_error == "raise":
                    raise
                self.report.skipped.append(SkippedRecord(sample.url, f"key {sample.key}", str(exc)))
                continue
            for name, value in row.items():
                rows[name].append(value)
            self.report.records += 1
        if rows and rows[next(iter(rows))]:
            yield {f.name: column(f, rows[f.name]) for f in read.schema}

    def metadata(self) -> dict[str, Any]:
        """The shard names, and how an export of this dataset names image members so that it gives
        these shards back (by the field names, as ingested; or as the unihub export that wrote them)."""
        header = self.header
        return {"webdataset": {"shards": [os.path.basename(p) for p in self.files()],
                               "image_extensions": header.image_extensions if header is not None else "name"}}

    @classmethod
    def export_options(cls, extra: Mapping[str, Any], schema: Unischema) -> dict[str, Any]:
        """A dataset ingested from WebDataset exports its image members under the extensions it was read with."""
        if extra.get("source_format") != "webdataset":
            return {}
        info = extra.get("webdataset")
        mode = info.get("image_extensions", "name") if isinstance(info, Mapping) else "name"
        return {"image_extensions": mode if mode in ("content", "name") else "name"}

    # ------------------------------------------------------------------------- verify
    REFERENCE_READER = "Python's tarfile"

    def reference_records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """The samples as :mod:`tarfile` reads the shards (see :mod:`.webdataset_verify`)."""
        return tarfile_records(self.files(), group_keys=self.group_keys)

    @classmethod
    def native_records(cls, schema: Unischema, rows: Iterable[Mapping[str, Any]],
                       extra: Mapping[str, Any], **options: Any) -> Iterator[dict[str, Any]]:
        """The rows as an export of them (with the write options the dataset's metadata implies) holds them."""
        mode = cls.export_options(extra, schema).get("image_extensions", "content")
        return native_records(schema, rows, image_extensions=mode)

    # ------------------------------------------------------------------------ writing
    @classmethod
    def write(cls, target: str | Outputs, schema: Unischema, batches: Iterable[ColumnBatch], *,
              samples_per_shard: int | None = None, pattern: str = "shard-%06d.tar", image_extensions: str = "content",
              **options: Any) -> list[str]:
        """Tar shards in directory ``target``, ``samples_per_shard`` samples each (default 10000); returns their
        paths. A ``target`` named ``x.tar`` is one shard holding every sample, unless ``samples_per_shard`` is given.

        A sample's members are ``<key>.<extension>``: the key from ``__key__`` (else the row
        index, zero-padded), the extension from the field name, with a suffix added where the
        name does not already say the encoding (``image`` -> ``image.png`` or ``image.jpg`` by
        the cell's bytes, ``boxes`` -> ``boxes.npy``). Null values leave their member out.
        Each shard starts with the header that gives ingest the schema back; given a path, it is
        written beside its final name and renamed into place when complete; given
        :class:`~unihub.fs.outputs.Outputs` (any filesystem), streamed there. No rows still
        write one shard.
        """
        return write_shards(target, schema, batches, samples_per_shard=samples_per_shard, pattern=pattern,
                            image_extensions=image_extensions, **options)


class _SampleReader:
    """Samples -> rows of one schema: members found by extension (or by the export's header),
    decoded, and checked (a member the schema lacks, a key the export did not write)."""

    def __init__(self, schema: Unischema, header: ShardHeader | None,
                 headers: Mapping[str, ShardHeader | None], validate_images: ValidateImages = "header", *,
                 observe: bool = False) -> None:
        self.schema = schema
        self.observe = observe  # a provisional schema: what it does not hold is SchemaOutgrown, not bad input
        self.decoders = {f.name: decoder(f, validate_images, fit=not observe) for f in schema
                         if f.name not in (KEY_FIELD, SPELLING_FIELD)}
        #: how each field's export writes a member, so that a member spelled otherwise keeps its spelling
        self.spellers = RowSpeller(schema, header.image_extensions if header is not None else "name")
        self.images = {f.name for f in schema if isinstance(f.codec, CompressedImageCodec)}
        self.fields = header.members if header is not None else None  # extension -> field name
        self.first_rows = ({path: h.first_row for path, h in headers.items() if h is not None}
                           if header is not None and header.row_keys and KEY_FIELD not in schema else None)
        #: the fast path, where fields are named by extension
        self.fast = ColumnReader(list(schema), validate_images, fit=not observe) if header is None else None

    def columns(self, block: SampleBlock, cache: dict[str, Any]) -> dict[str, Any] | None:
        """The columns of the samples of ``block`` a field at a time, or None (read them with :meth:`row`)."""
        return None if self.fast is None else self.fast.columns(block, cache)

    def row(self, sample: Sample) -> dict[str, Any]:
        """One sample as a row; a provisional schema that does not hold it raises SchemaOutgrown."""
        try:
            return self._row(sample)
        except _Outgrown as exc:
            if self.observe:
                raise SchemaOutgrown(str(exc)) from None
            raise FormatError(str(exc), path=exc.path, offset=exc.offset) from exc.__cause__  # its own class

    def _row(self, sample: Sample) -> dict[str, Any]:
        members = self._by_extension(sample) if self.fields is None else self._by_field(sample)
        if self.first_rows is not None:
            self._check_key(sample)
        row: dict[str, Any] = {}
        spellings: dict[str, Spelling] = {}
        used = 0
        for f in self.schema:
            if f.name == KEY_FIELD:
                row[f.name] = sample.key
                continue
            if f.name == SPELLING_FIELD:
                continue
            extension, data = members.get(f.name, (f.name, None))
            used += data is not None
            if data is None:
                if not f.nullable:
                    raise _Outgrown(f"{sample.url}: sample {sample.key!r} (offset {sample.offset}) has no member "
                                      f"for field {f.name!r}, which is not nullable; infer the schema from more "
                                      "samples or make the field nullable", path=sample.url, offset=sample.offset)
                row[f.name] = None
                continue
            try:
                row[f.name] = value = self.decoders[f.name](data)
                spelling = self.spellers.fields[f.name].spelling(extension, data, value)
            except (ValueError, OverflowError, CodecError) as exc:
                kind = FormatError if f.name in self.images else _Outgrown  # a bad image is bad input anyway
                raise kind(f"{sample.url}: sample {sample.key!r} (offset {sample.offset}), member "
                                  f"'{sample.key}.{extension}': {exc}", path=sample.url,
                                  offset=sample.offset) from exc
            if spelling is not None:
                spellings[f.name] = spelling
        if used != len(members):
            extra = next(name for name in members if name not in self.decoders)
            raise _Outgrown(f"{sample.url}: sample {sample.key!r} (offset {sample.offset}): member "
                            f"'{sample.key}.{members[extra][0]}' has no field in the schema, and would be lost; add "
                            f"a field {extra!r} to the schema", path=sample.url, offset=sample.offset)
        if spellings and not self.spellers.keeps:
            name = next(iter(spellings))
            raise _Outgrown(f"{sample.url}: sample {sample.key!r} (offset {sample.offset}): member "
                            f"'{sample.key}.{members[name][0]}' would not come back byte for byte from field {name!r} "
                            f"alone (an export would write another {_SPELT[min(spellings[name])]}); "
                            f"the schema needs the nullable str field {SPELLING_FIELD!r} that keeps each row's "
                            "spelling (infer the schema, or add it), or a bytes field", path=sample.url,
                            offset=sample.offset)
        if self.spellers.keeps:
            row[SPELLING_FIELD] = spellings_text(spellings)
        return row

    def _by_extension(self, sample: Sample) -> dict[str, tuple[str, bytes]]:
        """``field -> (extension as spelled, bytes)``, fields named by extension (in lower case), an alias's
        member (``a.jpeg``) in the field of its main extension (``jpg``) where the schema has no field of its own."""
        out: dict[str, tuple[str, bytes]] = {}
        for extension, data in sample.members.items():
            name = extension if extension in self.decoders else field_extension(extension)
            if name not in self.decoders:
                name = extension  # no field: refused by _row, naming the member
            if name in out:
                raise _Outgrown(f"{sample.url}: sample {sample.key!r} (offset {sample.offset}): members "
                                f"'{sample.key}.{out[name][0]}' and '{sample.key}.{sample.spelled.get(extension, extension)}'"
                                f" both belong to field {name!r}; infer the schema from more samples (two fields)",
                                path=sample.url, offset=sample.offset)
            out[name] = (sample.spelled.get(extension, extension), data)
        return out

    def _by_field(self, sample: Sample) -> dict[str, tuple[str, bytes]]:
        """``field -> (extension as spelled, bytes)`` by the export's header; a member it does not name is an error."""
        out: dict[str, tuple[str, bytes]] = {}
        for extension, data in sample.members.items():
            name = self.fields.get(extension)  # type: ignore[union-attr]
            if name is None or name in out:
                why = ("is not in the Unischema the unihub export recorded in this shard" if name is None else
                       f"is a second member of field {name!r}")
                raise FormatError(f"{sample.url}: sample {sample.key!r} (offset {sample.offset}): member "
                                  f"'{sample.key}.{extension}' {why} (the shard was changed after export); pass "
                                  "--option unihub_schema=false to name fields by member extension",
                                  path=sample.url, offset=sample.offset)
            out[name] = (sample.spelled.get(extension, extension), data)
        return out

    def _check_key(self, sample: Sample) -> None:
        """A dataset without ``__key__`` drops the keys: only the export's own row numbers may go."""
        expected = row_key(self.first_rows.get(sample.url, 0) + sample.index)  # type: ignore[union-attr]
        if sample.key != expected:
            raise FormatError(f"{sample.url}: sample {sample.key!r} (offset {sample.offset}) is not the export's "
                              f"row key {expected!r}, and the recorded Unischema has no {KEY_FIELD!r} field to keep "
                              "it (samples were added, removed or renamed after export); pass --option "
                              "unihub_schema=false to keep the keys", path=sample.url, offset=sample.offset)


#: what a spelling keeps, in words
_SPELT = {"ext": "extension", "npy": ".npy header", "text": "text"}


class _Outgrown(FormatError):
    """A sample the schema does not hold: bad input under a final schema, SchemaOutgrown under a provisional one."""
