"""HDF5 files (through h5py, imported only when used) as a foreign format: ingest, export, verify.

Layouts recognised on ingest (option ``layout``: ``auto`` detects them, see ``hdf5_layout.py``):

- **columns**: every dataset whose first axis is the row count is a field named by its path
  (``images/pixels``); the rest of its shape is the field's. Datasets of other lengths are refused
  by name unless ``fields=[...]`` picks a consistent subset or ``ignore_mismatched=True`` keeps the
  most common length (the others listed as skipped).
- **splits**: sibling groups holding the same datasets, one group per split, of any lengths
  (``/train/images``, ``/train/labels``, ``/val/images``, ...): all splits, one after the other,
  with the split's name in a string field ``split`` (option ``key_field``); option ``split=train``
  (or ``train,val``) reads some. A dataset missing from a split is a nullable field, None there.
- **groups**: one group per sample (``/sample_00000/image``, ``/sample_00000/label``, ...): one
  row per group, its name in a string field ``group`` (option ``key_field``), every member whole
  (0-d datasets are scalars; shapes that vary between samples are ``None`` dims; members some
  groups lack are nullable), and the attributes of the group, of its members and of the groups
  inside it as fields ``@name``, ``member@name`` and ``inner/group@name``. Rows come in h5py's order of the groups: by name (byte order:
  ``sample_10`` before ``sample_2`` unless zero-padded), or by creation where the file tracks it.
  The groups may sit below a chain of single groups (``/data/sample_00000/...``). A sibling group
  holding nothing at all is a sample with no members: a row of nulls (its attributes as fields),
  exported back as an empty group.

In every layout a compound dataset gives one field per member, named ``dataset.member``
(``tracks.x``; nested ``tracks.pos.x``; array members add their dims): Unischema fields are
tensors, which every reader and framework bridge serves as they are, and Parquet stores a struct's
members as separate columns anyway. Values convert exactly both ways (``hdf5_types.py``): enums
as their integers, complex numbers as trailing ``(2,)`` float pairs, fixed-length strings as
str/bytes re-padded to their length on export. Datasets that are not rows (scalars, and in the
groups and splits layouts anything outside the units) are kept exactly in the metadata
(``constants``, 1 MB in all), and so are the attributes outside the rows (``attribute_values``;
as JSON values too); export writes both back, and the groups outside the rows (``group_paths``:
an empty one too). A unit of 0 rows (an empty split, a file of 0 rows) keeps its datasets, their
dtypes and shapes, in ``empty_datasets``, written back on export. The file's structure is kept
too, and made again on export (``hdf5_meta.py``): how each source dataset is stored (layout, chunk
shape, maximum shape, filters with their options, fill value: ``storage``), every other name of an
object (a second hard link, a soft link to an object of the file: ``links``), dimension scales with
their names, attachments and labels (``dimension_scales``) and named datatypes (``named_types``).
Anything else is refused with a :class:`FormatError` naming file and object (references in
attributes, an external, dangling or user-defined link, a link inside a split or sample group ...),
unless ``ignore_unsupported=True`` leaves it out, listed as skipped and in ``left_out``.
Data is read in slices of whole chunks (about ``slice_mb``), never a whole file at once; several
files are read one after the other, the schema covers them all.

Export (:meth:`HDF5Format.write`, option ``layout``): a dataset ingested from HDF5 goes back to
its own layout and dtypes (:meth:`HDF5Format.export_options`), so that ingest -> export -> ingest
is exact, each source dataset stored as it was (a contiguous one contiguous, compressed ones with
their filters and chunks). Any other field is stored unihub's way, one dataset per field (``group/name`` making
groups), chunked and grown with ``resize``:

- fixed shapes -> ``(n, *shape)`` datasets of the field's dtype; strings (and decimals, as
  their exact text) -> h5py's UTF-8 string dtype; bytes -> ``vlen uint8`` rows;
- shapes with ``None`` dims -> ``vlen`` rows of the flattened values, plus an ``(n, ndim)``
  int64 ``<name>__shape`` dataset when the field has more than one dimension;
- nullable fields -> a boolean ``<name>__isnull`` dataset; null rows hold zeros/empty values;
- images -> their encoded PNG/JPEG bytes as ``vlen uint8`` (``images='bytes'``, the
  default), or decoded pixels stored as a uint8 tensor field (``images='pixels'``).

Each such dataset carries its Unischema field as JSON in the attribute ``unihub.field`` (the
groups layout records the schema once, in the root attribute ``unihub.schema``), and the root
attribute ``unihub.layout`` names the layout (and ``images``, and the groups beside the units that are
no split or sample), so ingesting an export gives back the same schema.

``unihub verify`` reads HDF5 with h5py itself (``hdf5_verify.py``), and beside the rows compares what
the file holds outside them (``hdf5_extras.py``: datasets that are not rows, attributes, empty groups,
the datasets of units of 0 rows, the dtypes of the rows' datasets, how each dataset is stored, links,
dimension scales, named datatypes, and any dataset of the file the conversion holds nowhere). Verifying an export follows how
that file says it was written (layout, key field, images as pixels), with no option needed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any, Literal

from unihub.errors import FormatError, InvalidArgumentError, SchemaError, UnihubError
from unihub.formats.base import (
    ColumnBatch,
    ForeignFormat,
    FormatOption,
    OnError,
    SkippedRecord,
    parse_bool,
    parse_choice,
    parse_list,
    register_format,
)
from unihub.formats.hdf5.detect import LAYOUTS, recorded_layout
from unihub.formats.hdf5.dtypes import h5py_module
from unihub.formats.hdf5.export import FIELD_ORDER_ATTR, SCHEMA_NAME_ATTR, write_file
from unihub.formats.hdf5.extras import native_extras, reference_extras
from unihub.formats.hdf5.files import open_hdf5
from unihub.formats.hdf5.layout import Plan, discover
from unihub.formats.hdf5.meta import PER_FILE, file_metadata, merge_fields, schema_name
from unihub.formats.hdf5.read import batches_of, infer_fields, unit_readers
from unihub.formats.hdf5.selection import select
from unihub.formats.hdf5.storage import asked_of, export_spec
from unihub.formats.hdf5.verify import native_records, reference_records, verify_spec
from unihub.fs import sources
from unihub.fs.outputs import Outputs
from unihub.runtime.memory import batch_nbytes, is_amount
from unihub.schema.codecs import CompressedImageCodec
from unihub.schema.image_checks import batch_problems, drop_rows
from unihub.schema.unischema import Unischema, UnischemaField

_SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: how many of a folder's files :meth:`HDF5Format.detect` looks at
_DETECT_SAMPLE = 16
__all__ = ["FIELD_ORDER_ATTR", "SCHEMA_NAME_ATTR", "HDF5Format"]


def _open(path: str) -> Any:
    try:
        return open_hdf5(path)
    except OSError as exc:
        raise FormatError(f"{path}: not a readable HDF5 file ({exc})", path=path) from exc


#: the per-file entries of an ingest's metadata (:data:`~unihub.formats.hdf5.meta.PER_FILE`), in words
_PER_FILE_WORDS = {"constants": "datasets that are not rows", "empty_datasets": "empty datasets",
                   "attribute_values": "attributes", "group_paths": "groups", "storage": "storage",
                   "member_storage": "storage", "links": "links", "dimension_scales": "dimension scales",
                   "named_types": "named types", "creation_order": "creation order",
                   "unit_order": "order of splits or groups"}


@register_format("hdf5", aliases=("h5",), extensions=(".h5", ".hdf5", ".he5"))
class HDF5Format(ForeignFormat):
    """HDF5 files as a source or sink; see the module docstring for the layouts and options.

    Example::

        source = HDF5Format("data.h5", split="train")     # /train/..., /val/...: just train
        schema = source.infer_schema()
        for batch in source.read_batches(schema, batch_size=512): ...
    """

    REFERENCE_READER = "h5py"
    OPTIONS = {
        "fields": FormatOption("fields to ingest: dataset paths, group names or prefixes, comma-separated",
                               parse_list),
        "layout": FormatOption("auto (default), columns, splits (a group per split) or groups (a group per "
                               "sample)", parse_choice(*LAYOUTS)),
        "split": FormatOption("the splits to read (splits layout), comma-separated; default all", parse_list),
        "key_field": FormatOption("the field holding the split / group name (default split / group)", str),
        "ignore_unsupported": FormatOption("leave out what cannot be stored exactly (listed as skipped) "
                                           "instead of refusing the file", parse_bool),
        "ignore_mismatched": FormatOption("keep the datasets of the most common length, skip the others "
                                          "(columns layout)", parse_bool),
        "slice_mb": FormatOption("megabytes read at a time (default 8)", float),
    }
    WRITE_OPTIONS = {
        "layout": FormatOption("columns, splits or groups (default: the layout an HDF5 ingest came from, "
                               "else columns)", parse_choice("columns", "splits", "groups")),
        "key_field": FormatOption("the field naming each row's split / group (default split / group)", str),
        "images": FormatOption("image fields as their encoded bytes or as decoded pixels (default bytes)",
                               parse_choice("bytes", "pixels")),
        "compression": FormatOption("h5py compression of the datasets of rows, columns and splits layouts (default: "
                                    "as an HDF5 source stored them, else none)", parse_choice("gzip", "lzf")),
        "chunk_rows": FormatOption("rows per chunk, columns and splits layouts (default: as an HDF5 source stored "
                                   "them, else about 1 MB chunks)", int),
    }

    def __init__(self, sources: Any, **options: Any) -> None:
        super().__init__(sources, **options)
        if not is_amount(self.options.get("slice_mb", 8)):  # NaN, inf or a negative size failed as they were used
            raise InvalidArgumentError(f"slice_mb must be a number of megabytes above 0, got "
                                       f"{self.options['slice_mb']!r}")
        self._discovered: dict[str, Plan] = {}
        self._plans: dict[tuple[str, tuple[str, ...] | None], Plan] = {}
        self._prepared: Unischema | None = None

    @classmethod
    def written_by_unihub(cls, fs: Any, path: str) -> bool:
        """An export of unihub's: its root holds the schema name and field order unihub writes."""
        with fs.open_input_file(path) as raw, h5py_module().File(raw, "r") as handle:
            return SCHEMA_NAME_ATTR in handle.attrs and FIELD_ORDER_ATTR in handle.attrs

    @classmethod
    def detect(cls, path: str) -> bool:
        """True for a file that starts with the HDF5 signature (at 0 or after a user block), or a directory
        whose first visible files (up to 16, walked in order) all do: a folder is read whole, every file in it."""
        if sources.isdir(path):
            sample = list(islice(_visible_files(path), _DETECT_SAMPLE))
            return bool(sample) and all(cls.detect(file) for file in sample)
        try:
            with sources.open_input(path) as handle:
                for offset in (0, 512, 1024, 2048):
                    handle.seek(offset)
                    if handle.read(8) == _SIGNATURE:
                        return True
        except OSError:
            return False
        return False

    def _plan(self, path: str, handle: Any, only: Sequence[str] | None = None) -> Plan:
        """The file's :class:`Plan` with the options applied (its structure is discovered once:
        inference, metadata and reading share it)."""
        if path not in self._discovered:
            try:
                self._discovered[path] = discover(path, handle, self.options)
            except (OSError, KeyError, RuntimeError) as exc:  # h5py on a damaged file
                raise FormatError(f"{path}: cannot read the file's structure ({exc})", path=path) from exc
        key = (path, tuple(only) if only is not None else None)
        if key not in self._plans:  # once: selecting warns about what it leaves out
            self._plans[key] = select(self._discovered[path], self.options, only=only)
        return self._plans[key]

    # -- ingest -------------------------------------------------------------------------
    def infer_schema(self, *, sample_records: int | None = None) -> Unischema:
        """The fields of every file, merged (a field some files lack is nullable)."""
        files = self._files()
        merged: dict[str, Any] = {}
        for path in files:
            with _open(path) as handle:
                plan = self._plan(path, handle)
                fields = infer_fields(plan, handle, sample_records)
                if path == files[0]:
                    name, order = schema_name(path, handle)
                merged = merge_fields(merged, fields, path, first=path == files[0])
        fields = list(merged.values())
        fields.sort(key=lambda f: (order.index(f.name), "") if f.name in order else (len(order), ""))
        return Unischema(name, fields)

    def read_batches(self, schema: Unischema, *, batch_size: int = 256,
                     on_error: OnError = "raise") -> Iterator[ColumnBatch]:
        if batch_size <= 0:
            raise SchemaError(f"batch_size must be positive, got {batch_size}")
        slice_bytes = int(float(self.options.get("slice_mb", 8)) * (1 << 20))
        for path in self.files():
            with _open(path) as handle:
                plan = self._plan(path, handle, only=list(schema.fields))
                self.report.skipped.extend(SkippedRecord(path, f"dataset {name!r}", reason)
                                           for name, reason in plan.ignored.items())
                yield from self._read_file(path, unit_readers(path, handle, plan, schema, slice_bytes),
                                           batch_size, on_error, list(schema))

    def _read_file(self, path: str, readers: list[Any], batch_size: int, on_error: OnError,
                   fields: Sequence[UnischemaField] = ()) -> Iterator[ColumnBatch]:
        total = sum(reader.length for reader in readers) or 1
        base, size, done = self.report.bytes_read, sources.getsize(path), 0
        for reader in readers:
            ranges = batches_of(reader, batch_size, self.batch_bytes)
            for start, stop in ranges:
                try:
                    batch = reader.rows(start, stop)
                    ranges.seen(stop - start, batch_nbytes(batch))
                except UnihubError:
                    raise
                except (OSError, ValueError, KeyError, UnicodeDecodeError) as exc:
                    location = reader.where(start, stop)
                    if on_error != "skip":
                        raise FormatError(f"{path}: cannot read {location}: {exc}", path=path) from exc
                    self.report.skipped.append(SkippedRecord(path, location, str(exc)))
                    continue
                finally:
                    done += stop - start
                batch, rows = self._checked_images(path, reader, start, batch, fields, on_error)
                self.report.records += rows
                self.report.bytes_read = base + size * done // total  # rows read, as a share of the file
                if rows:
                    yield batch

    def _checked_images(self, path: str, reader: Any, start: int, batch: dict[str, Any],
                        fields: Sequence[UnischemaField], on_error: OnError) -> tuple[dict[str, Any], int]:
        """``batch`` (rows ``start``.. of ``reader``) and its row count, rows whose encoded image fails its
        check (:mod:`unihub.schema.image_checks`) raised as a FormatError, or left out when skipping."""
        rows = len(next(iter(batch.values()))) if batch else 0
        problems = batch_problems(batch, fields, self.validate_images)
        for row, name, reason in problems:
            location = reader.where(start + row, start + row + 1)
            if on_error != "skip":
                raise FormatError(f"{path}: {location}, field {name!r}: {reason}", path=path)
            self.report.skipped.append(SkippedRecord(path, location, f"field {name!r}: {reason}"))
        if not problems:
            return batch, rows
        bad = {row for row, _, _ in problems}
        return drop_rows(batch, bad), rows - len(bad)

    def metadata(self) -> dict[str, Any]:
        """``{"hdf5": {...}}``: the attributes of the file, its groups and datasets, its scalars as
        JSON values, and what export and verify need: ``layout`` (kind, key field, the dtype of every
        source dataset, where each field comes from), ``constants`` (datasets that are not rows,
        exactly), ``empty_datasets``, ``attribute_values``, ``group_paths`` (``<key>_by_file`` where
        other files differ) and ``left_out``."""
        files = self._files()
        with _open(files[0]) as handle:
            meta = file_metadata(handle, self._plan(files[0], handle))
        for path in files[1:]:
            with _open(path) as handle:
                other = file_metadata(handle, self._plan(path, handle), per_file=True)
            for key, value in other.items():
                if value != meta[key]:
                    meta.setdefault(f"{key}_by_file", {})[path] = value
        return {"hdf5": meta}

    def _files(self) -> list[str]:
        files = self.files()
        if not files:
            raise FormatError(f"no HDF5 files in {self.where}", path=self.sources[0] if self.sources else None)
        return files

    # -- export -------------------------------------------------------------------------
    @classmethod
    def export_options(cls, extra: Mapping[str, Any], schema: Unischema) -> dict[str, Any]:
        """A dataset ingested from HDF5 is written back in its layout and dtypes (``source``: its
        ``hdf5`` metadata; fields ``schema`` lacks, or holds changed, are written unihub's way)."""
        source = extra.get("hdf5") if extra.get("source_format") == "hdf5" else None
        layout = (source or {}).get("layout") if isinstance(source, Mapping) else None
        return {"layout": layout.get("kind", "columns"), "source": source} if layout else {}

    @classmethod
    def export_caveats(cls, schema: Unischema, options: Mapping[str, Any]) -> list[str]:
        """An ingest of several files whose own entries differ (root attributes, constants, ...) written back
        as the one file an export writes: that file holds the first source file's."""
        source = options.get("source")
        differ = [key for key in PER_FILE if isinstance(source, Mapping) and source.get(f"{key}_by_file")]
        if not differ:
            return []
        others = sorted({path for key in differ for path in source[f"{key}_by_file"]})  # type: ignore[index]
        what = ", ".join(dict.fromkeys(_PER_FILE_WORDS.get(key, key) for key in differ))
        return [f"the source's HDF5 files differ in their {what} ({len(others)} besides the first, e.g. "
                f"{others[0]}): the one file written holds the first file's (unihub verify names what differs)"]

    @classmethod
    def write(cls, target: str | Outputs, schema: Unischema, batches: Iterable[ColumnBatch], *,
              images: Literal["bytes", "pixels"] = "bytes", compression: str | None = None,
              chunk_rows: int | None = None, layout: str = "columns", key_field: str | None = None,
              source: Mapping[str, Any] | None = None, overwrite: bool = False, **options: Any) -> list[str]:
        """Write ``batches`` to the HDF5 file ``target`` (atomically: a temp sibling renamed on success).

        Given :class:`~unihub.fs.outputs.Outputs` on a remote filesystem, the file is written in a
        temporary directory in ``$TMPDIR`` and then streamed there: h5py needs a seekable, readable
        file, so this is the one export that writes locally (and needs local disk for the whole file).

        ``layout``: ``columns``, ``splits`` or ``groups`` (``key_field`` names each row's split or
        group); ``source``: the ``hdf5`` metadata of an HDF5 ingest, whose datasets are rebuilt
        with their dtypes (:meth:`export_options` passes it); ``images``: keep encoded bytes or
        store decoded pixels; ``compression``: h5py's (``"gzip"``, ``"lzf"``, None);
        ``chunk_rows``: rows per chunk (default ~1 MB chunks). An existing ``target`` is refused
        unless ``overwrite=True``.
        """
        if options:
            raise SchemaError(f"unknown HDF5 write options {sorted(options)}")
        if images not in ("bytes", "pixels"):
            raise SchemaError(f"images must be 'bytes' or 'pixels', got {images!r}")
        if layout not in ("columns", "splits", "groups"):
            raise SchemaError(f"layout must be 'columns', 'splits' or 'groups', got {layout!r}")
        if chunk_rows is not None and (isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int)
                                       or chunk_rows < 1):
            raise SchemaError(f"chunk_rows must be a whole number of rows >= 1, got {chunk_rows!r}")
        spec = export_spec(schema, layout=layout, key_field=key_field, source=source, images=images)
        spec.asked = asked_of({"compression": compression, "chunk_rows": chunk_rows})
        if spec.kind == "groups" and spec.asked:  # a sample's datasets are whole, one per row: nothing to chunk
            raise SchemaError(f"{' and '.join(sorted(spec.asked))} set(s) the datasets of rows of the columns and "
                              "splits layouts; the groups layout writes each sample's datasets whole (pass "
                              "layout='columns' or leave the option out)")
        if not isinstance(target, Outputs):
            return write_file(target, schema, batches, spec, compression=compression, chunk_rows=chunk_rows,
                              overwrite=overwrite)
        with target.local_file() as local:  # h5py seeks and reads back: a remote target is spooled locally
            write_file(local, schema, batches, spec, compression=compression, chunk_rows=chunk_rows,
                       overwrite=overwrite)
        return [target.path()]

    # -- verify: h5py's own reading -----------------------------------------------------
    def reference_records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every row as h5py reads it (see ``hdf5_verify.py``), in ingest order."""
        yield from reference_records(self._files(), self.options)

    @classmethod
    def native_records(cls, schema: Unischema, rows: Iterable[Mapping[str, Any]],
                       extra: Mapping[str, Any], **options: Any) -> Iterator[dict[str, Any]]:
        """A unihub dataset's rows as :meth:`reference_records` reads an export of them."""
        yield from native_records(schema, rows, extra, options)

    def reference_extras(self) -> dict[str, Any]:
        """What the files hold beside their rows, as h5py reads it (see ``hdf5_extras.py``)."""
        return reference_extras(self._files(), self.options)

    @classmethod
    def native_extras(cls, schema: Unischema, extra: Mapping[str, Any], **options: Any) -> dict[str, Any]:
        """What an export of a unihub dataset writes beside its rows (see ``hdf5_extras.py``)."""
        return native_extras(schema, extra, verify_spec(schema, extra, options), options)

    def prepare(self, schema: Unischema) -> None:
        """Keep the schema read with: :meth:`written_options` compares it with the fields a unihub export
        recorded."""
        self._prepared = schema

    def written_options(self) -> dict[str, Any]:
        """How a unihub export says it was written (root attribute ``unihub.layout``): its ``layout``,
        ``key_field`` and ``images`` (where an older export did not record ``images``: ``pixels`` when
        it recorded as a tensor a field the schema read with holds as an image)."""
        path = self._files()[0]
        with _open(path) as handle:
            recorded = recorded_layout(handle)
            if recorded is None:
                return {}
            options = {"layout": recorded.get("kind", "columns"), "key_field": recorded.get("key_field"),
                       "images": recorded.get("images"), **asked_of(recorded)}
            schema = self._prepared
            if options["images"] is None and schema is not None:
                plan = self._plan(path, handle)
                pixels = [leaf.field for leaf in plan.leaves.values() if leaf.recorded is not None
                          and not isinstance(leaf.recorded.codec, CompressedImageCodec) and leaf.field in schema.fields
                          and isinstance(schema[leaf.field].codec, CompressedImageCodec)]
                options["images"] = "pixels" if pixels else None
        return {key: value for key, value in options.items() if value is not None}


def _visible_files(root: str) -> Iterator[str]:
    """The files under ``root`` in name order, as a folder source is listed (leaving out ``.``/``_`` names)."""
    for directory, dirs, names in sources.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        yield from (sources.join(directory, n) for n in sorted(names) if not n.startswith((".", "_")))
