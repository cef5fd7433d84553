"""WebDataset tar shards <-> Unischema columns.

On disk a WebDataset is a set of POSIX tar files ("shards", often named by a brace pattern
such as ``shard-{000000..000099}.tar``). A sample is a run of consecutive members that share
a key: ``000017.png``, ``000017.cls``, ``000017.seg.png`` form the sample whose ``__key__`` is
``000017`` and whose fields are ``png``, ``cls`` and ``seg.png``. The key is the member name
up to the first dot of its base name; the extension (lower-cased) is everything after it
(webdataset's ``base_plus_ext`` rule). Members named ``__name__`` are metadata and skipped,
as webdataset does; directory entries are skipped too.

Fields by extension (the last dot-component decides): ``png``/``jpg``/``jpeg`` are images
kept as their encoded bytes; ``npy`` are tensors (dtype and shape from the ``.npy`` header,
never unpickled); ``cls``, ``cls2``, ``idx``, ``id``, ... are integers written as text;
``txt`` is text; ``json`` is JSON kept as text; anything else is raw bytes. ``__key__`` is a
``str`` field. An extension missing from some samples makes a nullable field.

Reading uses :mod:`unihub.formats.tarstream` (plain shards memory-mapped, gzip/bzip2/xz ones
streamed), not :mod:`tarfile`, which costs ~70 µs a member, nor the ``webdataset`` package:
importing webdataset imports torch (~1.5 s), and its pipeline skips malformed members silently
where unihub must report them with the shard and offset (bad header checksums included).
The key rule is webdataset's, and the tests check both read the same shards alike.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from unihub.errors import CodecError, FormatError
from unihub.formats import images
from unihub.formats.codecs import CompressedImageCodec, ScalarCodec, TensorCodec
from unihub.formats.foreign import (
    ColumnBatch,
    ForeignFormat,
    FormatOption,
    OnError,
    SkippedRecord,
    expand_sources,
    map_in_workers,
    python_columns,
    register_format,
)
from unihub.formats.npy import load_npy, parse_header
from unihub.formats.schema import Unischema, UnischemaField
from unihub.formats.tarstream import TarFormatError, iter_members
from unihub.formats.validation import shape_matches

KEY_FIELD = "__key__"
#: webdataset.tariterators.base_plus_ext: key = up to the first dot of the base name.
_KEY_RULE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META_RULE = re.compile(r"__[^/]*__($|/)")
IMAGE_EXTENSIONS = {"png": "png", "jpg": "jpeg", "jpeg": "jpeg"}
INT_EXTENSIONS = frozenset({"cls", "cls2", "class", "count", "index", "inx", "id", "idx"})
TEXT_EXTENSIONS = frozenset({"txt", "text", "transcript"})
JSON_EXTENSIONS = frozenset({"json", "jsn"})
NPY_EXTENSIONS = frozenset({"npy"})
SHARD_SUFFIXES = (".tar", ".tgz", ".tar.gz", ".tar.bz2", ".tar.xz")
_NPY_MAGIC = b"\x93NUMPY"


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member name by webdataset's rule, or None when it has no key."""
    match = _KEY_RULE.match(name)
    return None if match is None else (match.group(1), match.group(2).lower())


def _kind(extension: str) -> str:
    """'image', 'npy', 'int', 'text', 'json' or 'bytes', from the last dot-component."""
    last = extension.rsplit(".", 1)[-1]
    if last in IMAGE_EXTENSIONS:
        return "image"
    if last in NPY_EXTENSIONS:
        return "npy"
    if last in INT_EXTENSIONS:
        return "int"
    if last in TEXT_EXTENSIONS:
        return "text"
    return "json" if last in JSON_EXTENSIONS else "bytes"


# ------------------------------------------------------------------------------ tar stage
@dataclass
class Sample:
    """One sample: its shard, key, the offset of its first member, and ``extension -> bytes``."""

    url: str
    key: str
    offset: int
    members: dict[str, bytes] = field(default_factory=dict)


def iter_samples(path: str, *, on_error: OnError = "raise", skipped: list[SkippedRecord] | None = None,
                 ) -> Iterator[Sample]:
    """The samples of one shard, in order; malformed members raise or are listed in ``skipped``."""

    def fail(message: str, offset: int | None) -> None:
        where = f"offset {offset}" if offset is not None else "shard"
        if on_error == "raise":
            raise FormatError(f"{path}: {message}", path=path, offset=offset)
        if skipped is not None:
            skipped.append(SkippedRecord(path, where, message))

    current: Sample | None = None
    offset: int | None = 0
    try:
        for member in iter_members(path, regular_only=False, require_end=True):
            offset = member.offset
            if member.isdir or _is_meta(member.name):
                continue
            if not member.isreg:
                fail(f"member {member.name!r} at offset {offset} is not a regular file "
                     "(link or device); a WebDataset member holds the bytes of one field", offset)
                continue
            parts = split_name(member.name)
            if parts is None:
                fail(f"member {member.name!r} at offset {offset} has no key: a member is named "
                     "<key>.<extension>, with a key before the first dot", offset)
                continue
            key, extension = parts
            if current is not None and current.key != key:
                yield current  # complete: a new key starts
                current = None
            if current is None:
                current = Sample(path, key, offset)
            if extension in current.members:
                fail(f"member {member.name!r} at offset {offset}: key {key!r} already has a "
                     f".{extension} member (samples are runs of members with one key)", offset)
                continue
            current.members[extension] = member.data
    except (TarFormatError, OSError) as exc:
        if isinstance(exc, TarFormatError):
            offset = exc.offset
            parts = None if exc.member is None or _is_meta(exc.member) else split_name(exc.member)
            if current is not None and parts is not None and parts[0] != current.key:
                yield current  # the damaged member starts another key: this sample is complete
                current = None
        reason = exc.reason if isinstance(exc, TarFormatError) else str(exc)
        pending = f"; sample {current.key!r} is incomplete" if current is not None else ""
        current = None
        fail(f"truncated or corrupt tar after offset {offset}: {reason}{pending}", offset)
    if current is not None:
        yield current


def _is_meta(name: str) -> bool:
    """webdataset skips ``__name__`` members (at the top level or as a directory prefix)."""
    return _META_RULE.match(name) is not None


# ------------------------------------------------------------------------- inference
class _FieldStats:
    """What one extension's values look like, accumulated value by value (nothing kept)."""

    def __init__(self, extension: str) -> None:
        self.extension = extension
        self.kind = _kind(extension)
        self.count = 0
        self.shapes: set[tuple[int, ...]] = set()
        self.dtypes: set[np.dtype] = set()
        self.all_int = True
        self.all_float = True

    def add(self, data: bytes) -> None:
        self.count += 1
        if self.kind == "image":
            size = images.image_size(data)
            if size is None:
                return  # corrupt: read_batches reports it; all corrupt makes a bytes field
            height, width, channels = size
            self.shapes.add((height, width) if channels == 1 else (height, width, channels))
        elif self.kind == "npy":
            try:
                dtype, shape, _, _ = parse_header(data)
            except CodecError:
                return
            self.dtypes.add(dtype)
            self.shapes.add(shape)
        elif self.kind == "int" and (self.all_int or self.all_float):
            text = data.decode("utf-8", "replace").strip()
            self.all_int = self.all_int and _parses(int, text)
            self.all_float = self.all_float and _parses(float, text)

    def merge(self, other: _FieldStats) -> None:
        """Add what ``other`` saw (the scans of two sets of shards, as if one)."""
        self.count += other.count
        self.shapes |= other.shapes
        self.dtypes |= other.dtypes
        self.all_int = self.all_int and other.all_int
        self.all_float = self.all_float and other.all_float

    def field(self, nullable: bool) -> UnischemaField:
        name = self.extension
        if self.kind == "image" and self.shapes:
            codec = CompressedImageCodec(IMAGE_EXTENSIONS[name.rsplit(".", 1)[-1]])
            return UnischemaField(name, np.uint8, _merge_shapes(self.shapes, pad=True), codec, nullable)
        if self.kind == "npy" and self.dtypes:
            dtype = np.result_type(*self.dtypes)
            if dtype.kind in "biuf":  # else (complex, strings, datetimes): keep the .npy bytes
                return UnischemaField(name, dtype.type, _merge_shapes(self.shapes, pad=False, name=name),
                                      TensorCodec(), nullable)
        if self.kind == "int" and self.all_int:
            return UnischemaField(name, np.int64, (), ScalarCodec(pa.int64()), nullable)
        if self.kind == "int" and self.all_float:
            return UnischemaField(name, np.float64, (), ScalarCodec(pa.float64()), nullable)
        if self.kind in ("int", "text", "json"):
            return UnischemaField(name, np.str_, (), ScalarCodec(pa.string()), nullable)
        return UnischemaField(name, np.bytes_, (), ScalarCodec(pa.binary()), nullable)


def _scan_shards(files: list[str], sample_records: int | None = None) -> tuple[dict[str, _FieldStats], int]:
    """Statistics per extension over the samples of ``files`` (the first ``sample_records``), and their count.

    Malformed members are left out; :meth:`WebDatasetFormat.read_batches` reports them.
    """
    stats: dict[str, _FieldStats] = {}
    seen = 0
    for path in files:
        for sample in iter_samples(path, on_error="skip", skipped=[]):
            if sample_records is not None and seen >= sample_records:
                return stats, seen
            seen += 1
            for extension, data in sample.members.items():
                stats.setdefault(extension, _FieldStats(extension)).add(data)
    return stats, seen


def _parses(kind: Callable[[str], Any], text: str) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return True


def _merge_shapes(shapes: set[tuple[int, ...]], *, pad: bool, name: str = "") -> tuple[int | None, ...]:
    """One shape for all: sizes that differ become None; gray images join colour ones as C=1."""
    ranks = {len(s) for s in shapes}
    if len(ranks) > 1:
        if not pad:
            raise FormatError(f"field {name!r}: .npy arrays of different ranks ({sorted(shapes)[:4]}); "
                              "pass a schema that stores this field as bytes")
        shapes = {s if len(s) == 3 else (*s, 1) for s in shapes}
    first = next(iter(shapes))
    return tuple(d if all(s[i] == d for s in shapes) else None for i, d in enumerate(first))


# --------------------------------------------------------------------------- decoding
def _decoder(f: UnischemaField) -> Callable[[bytes], Any]:
    """How one member's bytes become a value of field ``f`` (raises ValueError/CodecError)."""
    if isinstance(f.codec, CompressedImageCodec):
        return lambda data: _checked_image(f, data)
    if f.numpy_dtype is np.bytes_:
        return bytes
    if f.numpy_dtype is np.str_:
        return lambda data: data.decode("utf-8")
    if f.shape == () and f.dtype.kind in "biufc":
        return lambda data: _scalar(f, data)
    if f.dtype.kind in "biufc":
        return lambda data: _tensor(f, data)
    return lambda data: data.decode("utf-8")


def _checked_image(f: UnischemaField, data: bytes) -> bytes:
    size = images.image_size(data)
    if size is None:
        raise CodecError(f"field {f.name!r}: {len(data)} bytes are not a readable PNG or JPEG image")
    height, width, channels = size
    found = (height, width) if channels == 1 and len(f.shape) == 2 else (height, width, channels)
    if not shape_matches(found, f.shape):
        raise CodecError(f"field {f.name!r}: image is {found}, the schema says {f.shape}")
    return data


def _scalar(f: UnischemaField, data: bytes) -> Any:
    if data.startswith(_NPY_MAGIC):
        array = load_npy(data)
        if array.shape != ():
            raise CodecError(f"field {f.name!r}: expected a scalar, the .npy holds shape {array.shape}")
        return f.dtype.type(array[()])
    text = data.decode("utf-8").strip()
    return f.dtype.type(int(text) if f.dtype.kind in "iu" else float(text) if f.dtype.kind in "fc" else text)


def _tensor(f: UnischemaField, data: bytes) -> np.ndarray:
    array = load_npy(data)
    if not shape_matches(array.shape, f.shape):
        raise CodecError(f"field {f.name!r}: the .npy holds shape {array.shape}, the schema says {f.shape}")
    return array if array.dtype == f.dtype else array.astype(f.dtype)


def _column(f: UnischemaField, values: list[Any]) -> Any:
    """A list of row values as a column: one numpy array when every row is present and fixed."""
    if any(v is None for v in values) or f.dtype == object or isinstance(f.codec, CompressedImageCodec):
        return values  # images stay a list of encoded bytes
    if f.shape == ():
        return np.asarray(values, dtype=f.dtype)
    return np.stack(values) if f.is_fixed_shape and values else values


# --------------------------------------------------------------------------- encoding
def _encoder(f: UnischemaField) -> tuple[str, Callable[[Any], bytes]]:
    """``(member extension, value -> bytes)`` for field ``f``; the extension names the encoding."""
    name = f.name.replace("/", ".")
    last = name.rsplit(".", 1)[-1].lower()
    if isinstance(f.codec, CompressedImageCodec):
        suffix = "png" if f.codec.image_codec == "png" else "jpg"
        ext = name if last in IMAGE_EXTENSIONS else f"{name}.{suffix}"
        return ext, lambda value: f.codec.encode(f, value)  # type: ignore[union-attr]
    if f.numpy_dtype is np.str_ and f.shape == ():
        ext = name if last in TEXT_EXTENSIONS | JSON_EXTENSIONS else f"{name}.txt"
        return ext, _text_bytes
    if f.numpy_dtype is np.bytes_ and f.shape == ():
        ext = f"{name}.bin" if _kind(last) != "bytes" else name
        return ext, bytes
    if f.shape == () and f.dtype.kind in "iu":
        ext = name if last in INT_EXTENSIONS else f"{name}.cls"
        return ext, lambda value: str(int(value)).encode("ascii")
    if f.dtype.kind in "biufc":
        ext = name if last in NPY_EXTENSIONS else f"{name}.npy"
        return ext, lambda value: _npy_bytes(np.asarray(value, dtype=f.dtype))
    ext = name if last in TEXT_EXTENSIONS else f"{name}.txt"
    return ext, _text_bytes


def _text_bytes(value: Any) -> bytes:
    """Text as UTF-8; a parsed JSON value (dict, list) back to JSON text; others by ``str``."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (dict, list)):
        return json.dumps(value).encode("utf-8")
    return str(value).encode("utf-8")


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _rows(batches: Iterable[ColumnBatch]) -> Iterator[dict[str, Any]]:
    for batch in batches:
        columns = python_columns(batch)
        n = len(next(iter(columns.values()))) if columns else 0
        for i in range(n):
            yield {name: values[i] for name, values in columns.items()}


class _ShardWriter:
    """One shard written to a hidden temporary sibling and renamed into place on close."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{os.getpid()}")
        self.file = open(self.temporary, "wb")  # noqa: SIM115 (closed in commit/abort)
        self.tar = tarfile.open(fileobj=self.file, mode="w", format=tarfile.PAX_FORMAT)

    def add(self, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), 0o444, 0  # reproducible shards
        self.tar.addfile(info, io.BytesIO(data))

    def commit(self) -> None:
        self.tar.close()
        self.file.close()
        os.replace(self.temporary, self.path)

    def abort(self) -> None:
        self.file.close()
        if os.path.exists(self.temporary):
            os.remove(self.temporary)


# ----------------------------------------------------------------------------- format
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

    WRITE_OPTIONS = {
        "samples_per_shard": FormatOption("samples per tar shard (default 10000)", int),
        "pattern": FormatOption("shard file names, with one %d for the shard number (default shard-%06d.tar)"),
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

    def samples(self, *, on_error: OnError = "raise") -> Iterator[Sample]:
        """Every sample of every shard, in shard order; skips land in :attr:`report`."""
        for path in self.files():
            yield from iter_samples(path, on_error=on_error, skipped=self.report.skipped)
            self.report.bytes_read += os.path.getsize(path)  # progress, a shard at a time

    def infer_schema(self, *, sample_records: int | None = None) -> Unischema:
        """Fields from the extensions of the first ``sample_records`` samples (None: all).

        Malformed members are left out of the inference; :meth:`read_batches` reports them.
        """
        files = self.files()
        if sample_records is None and self.workers > 1 and len(files) > 1:
            # whole shards in forked workers; the statistics merge exactly
            parts = map_in_workers(_scan_shards, [files[i::self.workers] for i in range(self.workers)],
                                   self.workers)
            stats, seen = parts[0]
            for part_stats, part_seen in parts[1:]:
                seen += part_seen
                for extension, stat in part_stats.items():
                    if extension in stats:
                        stats[extension].merge(stat)
                    else:
                        stats[extension] = stat
        else:
            stats, seen = _scan_shards(files, sample_records)
        if seen == 0:
            raise FormatError(f"no samples in {self.sources}: the shards are empty or hold no <key>.<ext> "
                              "members", path=self.sources[0] if self.sources else None)
        fields = [UnischemaField(KEY_FIELD, np.str_, (), ScalarCodec(pa.string()), False)]
        fields += [stats[ext].field(nullable=stats[ext].count < seen) for ext in sorted(stats)]
        return Unischema("WebDataset", fields)

    def read_batches(self, schema: Unischema, *, batch_size: int = 256,
                     on_error: OnError = "raise") -> Iterator[ColumnBatch]:
        """Column batches of ``schema``: images as encoded bytes, ``.npy`` as arrays, ints, text."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        decoders = {f.name: _decoder(f) for f in schema if f.name != KEY_FIELD}
        columns: dict[str, list[Any]] = {f.name: [] for f in schema}
        for sample in self.samples(on_error=on_error):
            try:
                row = self._decode(schema, decoders, sample)
            except FormatError as exc:
                if on_error == "raise":
                    raise
                self.report.skipped.append(SkippedRecord(sample.url, f"key {sample.key}", str(exc)))
                continue
            for name, value in row.items():
                columns[name].append(value)
            self.report.records += 1
            if len(columns[next(iter(columns))]) >= batch_size:
                yield {f.name: _column(f, columns[f.name]) for f in schema}
                columns = {f.name: [] for f in schema}
        if columns and columns[next(iter(columns))]:
            yield {f.name: _column(f, columns[f.name]) for f in schema}

    @staticmethod
    def _decode(schema: Unischema, decoders: dict[str, Callable[[bytes], Any]], sample: Sample) -> dict[str, Any]:
        row: dict[str, Any] = {}
        for f in schema:
            if f.name == KEY_FIELD:
                row[f.name] = sample.key
                continue
            data = sample.members.get(f.name)
            if data is None:
                if not f.nullable:
                    raise FormatError(f"{sample.url}: sample {sample.key!r} (offset {sample.offset}) has no "
                                      f".{f.name} member, and field {f.name!r} is not nullable; infer the "
                                      "schema from more samples or make the field nullable",
                                      path=sample.url, offset=sample.offset)
                row[f.name] = None
                continue
            try:
                row[f.name] = decoders[f.name](data)
            except (ValueError, OverflowError, CodecError) as exc:
                raise FormatError(f"{sample.url}: sample {sample.key!r} (offset {sample.offset}), member "
                                  f".{f.name}: {exc}", path=sample.url, offset=sample.offset) from exc
        return row

    def metadata(self) -> dict[str, Any]:
        return {"webdataset": {"shards": [os.path.basename(p) for p in self.files()]}}

    @classmethod
    def write(cls, target: str, schema: Unischema, batches: Iterable[ColumnBatch], *,
              samples_per_shard: int = 10000, pattern: str = "shard-%06d.tar", **options: Any) -> list[str]:
        """Tar shards in directory ``target``, ``samples_per_shard`` samples each; returns their paths.

        A sample's members are ``<key>.<extension>``: the key from ``__key__`` (else the row
        index, zero-padded), the extension from the field name, with a suffix added where the
        name does not already say the encoding (``image`` -> ``image.png``, ``boxes`` ->
        ``boxes.npy``). Null values leave their member out. Each shard is written beside its
        final name and renamed into place when complete.
        """
        if options:
            raise TypeError(f"unknown WebDataset write options: {sorted(options)}")
        if samples_per_shard <= 0:
            raise ValueError(f"samples_per_shard must be positive, got {samples_per_shard}")
        try:
            pattern % 0
        except TypeError as exc:
            raise ValueError(f"pattern must hold one %d-style field for the shard number, got {pattern!r}") from exc
        encoders = {f.name: _encoder(f) for f in schema if f.name != KEY_FIELD}
        extensions = [ext for ext, _ in encoders.values()]
        for ext in extensions:
            if ext.startswith("_") or extensions.count(ext) > 1:
                raise ValueError(f"fields of {schema.name!r} map to the member extension {ext!r}, which is "
                                 "taken twice or starts with '_' (webdataset metadata); rename the field")
        os.makedirs(target, exist_ok=True)
        written: list[str] = []
        shard: _ShardWriter | None = None
        previous_key = None
        try:
            for index, row in enumerate(_rows(batches)):
                if index % samples_per_shard == 0:
                    if shard is not None:
                        shard.commit()
                        written.append(shard.path)
                    shard = _ShardWriter(os.path.join(target, pattern % (index // samples_per_shard)))
                key = _checked_key(row.get(KEY_FIELD), index, previous_key)
                previous_key = key
                for name, (ext, encode) in encoders.items():
                    value = row.get(name)
                    if value is not None:
                        shard.add(f"{key}.{ext}", encode(value))  # type: ignore[union-attr]
            if shard is not None:
                shard.commit()
                written.append(shard.path)
        except BaseException:
            if shard is not None:
                shard.abort()
            raise
        return written


def _checked_key(value: Any, index: int, previous: str | None) -> str:
    """The sample key: ``__key__`` or the zero-padded row index, checked to read back alike."""
    key = f"{index:09d}" if value is None else str(value)
    if split_name(f"{key}.x") != (key, "x"):
        raise ValueError(f"row {index}: key {key!r} would not read back: a key's last path component must be "
                         "non-empty and hold no dot")
    if key == previous:
        raise ValueError(f"row {index}: key {key!r} repeats the previous row's; webdataset would merge the two")
    return key
