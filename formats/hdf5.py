"""HDF5 files (through h5py, imported only when used) as a foreign format: ingest and export.

Ingest. Every HDF5 dataset whose first axis is the row count becomes a field named by its
path (``group/sub/name``); the rest of its shape and its dtype carry over:

- numbers and booleans: ``(n,)`` -> a :class:`ScalarCodec` field, ``(n, *shape)`` -> a
  :class:`TensorCodec` field of that shape;
- strings (variable or fixed length): ``np.str_`` when every value decodes as UTF-8,
  ``np.bytes_`` otherwise; opaque data (``V``) -> ``np.bytes_``;
- variable-length numbers (``h5py.vlen_dtype``) -> ``(None,)`` tensors.

Scalar (0-d) datasets and the attributes of the file and of each dataset are metadata
(:meth:`HDF5Format.metadata`), not fields. Datasets whose first axes differ raise a
:class:`FormatError` that names the file, the datasets and their lengths, unless the option
``fields=[...]`` (dataset paths or group names) selects a consistent subset, or
``ignore_mismatched=True`` keeps the datasets of the most common length and warns about the
others. Datasets of a dtype Arrow cannot hold (compound, complex, references) are left out
with a warning, or refused when ``fields=`` names them. Data is read in slices of whole
chunks (or ~8 MB, option ``slice_mb``, for contiguous datasets), never a whole file at once.
Several files are read one after the other; the schema comes from the first.

Export (:meth:`HDF5Format.write`): one dataset per field, ``group/name`` making groups, all
chunked and grown with ``resize`` (``maxshape`` ``None`` on axis 0):

- fixed shapes -> ``(n, *shape)`` datasets of the field's dtype; strings (and decimals, as
  their exact text) -> h5py's UTF-8 string dtype; bytes -> ``vlen uint8`` rows;
- shapes with ``None`` dims -> ``vlen`` rows of the flattened values, plus an ``(n, ndim)``
  int64 ``<name>__shape`` dataset when the field has more than one dimension;
- nullable fields -> a boolean ``<name>__isnull`` dataset; null rows hold zeros/empty values;
- images -> their encoded PNG/JPEG bytes as ``vlen uint8`` (``images='bytes'``, the
  default), or decoded pixels stored as a uint8 tensor field (``images='pixels'``).

Each exported dataset carries its Unischema field as JSON in the attribute ``unihub.field``,
so ingesting an export gives back the same schema and values (companions are not fields).
"""

from __future__ import annotations

import decimal
import json
import math
import os
import uuid
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal

import numpy as np

from unihub.dependencies import require
from unihub.errors import DatasetExistsError, FormatError, SchemaError
from unihub.formats import dtypes
from unihub.formats.codecs import CompressedImageCodec, ScalarCodec, TensorCodec
from unihub.formats.foreign import (
    ColumnBatch,
    ForeignFormat,
    FormatOption,
    OnError,
    SkippedRecord,
    parse_bool,
    parse_choice,
    parse_list,
    python_columns,
    register_format,
)
from unihub.formats.schema import Unischema, UnischemaField

#: Attribute holding a dataset's Unischema field (JSON) in files unihub exports.
FIELD_ATTR = "unihub.field"
SCHEMA_NAME_ATTR = "unihub.schema_name"
FIELD_ORDER_ATTR = "unihub.field_order"
SHAPE_SUFFIX = "__shape"
ISNULL_SUFFIX = "__isnull"
_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_VLEN_ROW_BYTES = 64  # a guess at one variable-length row, to size slices and chunks


def _h5py() -> Any:
    return require("h5py", extra="hdf5", purpose="HDF5 files")


def _open(path: str) -> Any:
    try:
        return _h5py().File(path, "r")
    except OSError as exc:
        raise FormatError(f"{path}: not a readable HDF5 file ({exc})", path=path) from exc


def _read_rows(dataset: Any, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of an h5py dataset: the only place data is read (tests watch it)."""
    return dataset[start:stop]


@register_format("hdf5", aliases=("h5",), extensions=(".h5", ".hdf5", ".he5"))
class HDF5Format(ForeignFormat):
    """HDF5 files as a source or sink; see the module docstring for the layout.

    Options: ``fields`` (dataset paths or group names to ingest), ``ignore_mismatched``
    (skip datasets of another length with a warning), ``slice_mb`` (read size, default 8).

    Example::

        source = HDF5Format("train.h5", fields=["images", "labels"])
        schema = source.infer_schema()
        for batch in source.read_batches(schema, batch_size=512): ...
    """

    OPTIONS = {
        "fields": FormatOption("dataset paths or group names to ingest, comma-separated", parse_list),
        "ignore_mismatched": FormatOption("keep the datasets of the most common length, warn about the others",
                                          parse_bool),
        "slice_mb": FormatOption("megabytes read at a time (default 8)", float),
    }
    WRITE_OPTIONS = {
        "images": FormatOption("image fields as their encoded bytes or as decoded pixels (default bytes)",
                               parse_choice("bytes", "pixels")),
        "compression": FormatOption("h5py compression of every dataset (default none)", parse_choice("gzip", "lzf")),
        "chunk_rows": FormatOption("rows per chunk (default: about 1 MB chunks)", int),
    }

    @classmethod
    def detect(cls, path: str) -> bool:
        """True for a file that starts with the HDF5 signature (at 0 or after a user block)."""
        try:
            with open(path, "rb") as handle:
                for offset in (0, 512, 1024, 2048):
                    handle.seek(offset)
                    if handle.read(8) == _SIGNATURE:
                        return True
        except OSError:
            return False
        return False

    # -- ingest -------------------------------------------------------------------------
    def infer_schema(self, *, sample_records: int | None = None) -> Unischema:
        path = self._first_file()
        with _open(path) as handle:
            arrays, _ = _scan(handle)
            names, _ = self._select(path, arrays)
            order = json.loads(handle.attrs.get(FIELD_ORDER_ATTR, "[]"))  # a unihub export's field order
            names.sort(key=lambda n: (order.index(n), "") if n in order else (len(order), n))
            fields = [_field_for(path, name, arrays[name], sample_records) for name in names]
            name = handle.attrs.get(SCHEMA_NAME_ATTR) or os.path.splitext(os.path.basename(path))[0] or "hdf5"
        return Unischema(name.decode() if isinstance(name, bytes) else str(name), fields)

    def read_batches(self, schema: Unischema, *, batch_size: int = 256,
                     on_error: OnError = "raise") -> Iterator[ColumnBatch]:
        if batch_size <= 0:
            raise SchemaError(f"batch_size must be positive, got {batch_size}")
        slice_bytes = int(float(self.options.get("slice_mb", 8)) * (1 << 20))
        for path in self.files():
            with _open(path) as handle:
                yield from self._read_file(path, handle, schema, batch_size, slice_bytes, on_error)

    def _read_file(self, path: str, handle: Any, schema: Unischema, batch_size: int, slice_bytes: int,
                   on_error: OnError) -> Iterator[ColumnBatch]:
        readers = {f.name: _FieldReader(path, handle, f, slice_bytes) for f in schema}
        lengths = {name: r.length for name, r in readers.items()}
        if len(set(lengths.values())) > 1:
            raise FormatError(_mismatch_message(path, lengths), path=path)
        n = next(iter(lengths.values()), 0)
        base, size = self.report.bytes_read, os.path.getsize(path)
        for start in range(0, n, batch_size):
            stop = min(start + batch_size, n)
            try:
                batch = {name: r.rows(start, stop) for name, r in readers.items()}
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                if on_error != "skip":
                    raise FormatError(f"{path}: cannot read rows {start}..{stop - 1}: {exc}", path=path) from exc
                self.report.skipped.append(SkippedRecord(path, f"rows {start}..{stop - 1}", str(exc)))
                continue
            self.report.records += stop - start
            self.report.bytes_read = base + size * stop // n  # rows read, as a share of the file
            yield batch

    def metadata(self) -> dict[str, Any]:
        """``{"hdf5": {"attributes": file attrs, "datasets": {path: attrs}, "scalars": {path: value}}}``
        of the first file (unihub's own bookkeeping attributes left out)."""
        path = self._first_file()
        with _open(path) as handle:
            arrays, scalars = _scan(handle)
            datasets = {}
            for name, dataset in {**arrays, **scalars}.items():
                attrs = _attributes(dataset.attrs)
                if attrs:
                    datasets[name] = attrs
            groups: dict[str, Any] = {}
            handle.visititems(lambda name, obj: groups.__setitem__(name, _attributes(obj.attrs))
                              if isinstance(obj, _h5py().Group) and len(obj.attrs) else None)
            return {"hdf5": {
                "attributes": _attributes(handle.attrs),
                "groups": groups,
                "datasets": datasets,
                "scalars": {name: _jsonable(_read_scalar(d)) for name, d in scalars.items()},
            }}

    def _first_file(self) -> str:
        files = self.files()
        if not files:
            raise FormatError(f"no HDF5 files in {self.sources}", path=self.sources[0] if self.sources else None)
        return files[0]

    def _select(self, path: str, arrays: dict[str, Any]) -> tuple[list[str], int]:
        """The dataset paths that become fields (options ``fields``/``ignore_mismatched``) and the row count."""
        wanted = self.options.get("fields")
        if wanted is not None:
            names = []
            for item in ([wanted] if isinstance(wanted, str) else wanted):
                item = item.strip("/")
                hits = [n for n in arrays if n == item or n.startswith(item + "/")]
                if not hits:
                    raise FormatError(f"{path}: no dataset or group {item!r}; datasets: {sorted(arrays)}", path=path)
                names.extend(h for h in hits if h not in names)
            unsupported = {n: str(arrays[n].dtype) for n in names if not _supported(arrays[n])}
            if unsupported:
                raise FormatError(f"{path}: datasets {unsupported} have dtypes unihub cannot store", path=path)
        else:
            names = [n for n in arrays if _supported(arrays[n])]
            left_out = {n: str(arrays[n].dtype) for n in arrays if n not in names}
            if left_out:
                warnings.warn(f"{path}: left out datasets of dtypes unihub cannot store: {left_out}", stacklevel=3)
        lengths = {n: arrays[n].shape[0] for n in names}
        if len(set(lengths.values())) > 1:
            if not self.options.get("ignore_mismatched", False):
                raise FormatError(_mismatch_message(path, lengths) + "; choose datasets of one length with "
                                  "fields=[...] or skip the others with ignore_mismatched=True", path=path)
            rows = Counter(lengths.values()).most_common(1)[0][0]
            skipped = {n: k for n, k in lengths.items() if k != rows}
            warnings.warn(f"{path}: skipping datasets whose length is not {rows}: {skipped}", stacklevel=3)
            names = [n for n in names if lengths[n] == rows]
        return names, next(iter(lengths.values()), 0)

    # -- export -------------------------------------------------------------------------
    @classmethod
    def write(cls, target: str, schema: Unischema, batches: Iterable[ColumnBatch], *,
              images: Literal["bytes", "pixels"] = "bytes", compression: str | None = None,
              chunk_rows: int | None = None, overwrite: bool = False, **options: Any) -> list[str]:
        """Write ``batches`` to the HDF5 file ``target`` (atomically: a temp sibling renamed on success).

        ``images``: keep encoded bytes or store decoded pixels; ``compression``: h5py's
        (``"gzip"``, ``"lzf"``, None); ``chunk_rows``: rows per chunk (default ~1 MB chunks).
        An existing ``target`` is refused unless ``overwrite=True``.
        """
        if options:
            raise SchemaError(f"unknown HDF5 write options {sorted(options)}")
        if images not in ("bytes", "pixels"):
            raise SchemaError(f"images must be 'bytes' or 'pixels', got {images!r}")
        target = os.fspath(target)
        if os.path.exists(target) and not overwrite:
            raise DatasetExistsError(f"{target} exists; pass overwrite=True to replace it")
        _check_names(schema)
        h5py = _h5py()
        parent, base = os.path.split(os.path.abspath(target))
        temporary = os.path.join(parent, f".{base}.unihub-tmp-{uuid.uuid4().hex[:12]}")
        try:
            with h5py.File(temporary, "w") as handle:
                handle.attrs[SCHEMA_NAME_ATTR] = schema.name
                handle.attrs[FIELD_ORDER_ATTR] = json.dumps(list(schema.fields))
                sinks = [_FieldSink(handle, f, images=images, compression=compression, chunk_rows=chunk_rows)
                         for f in schema]
                for batch in map(python_columns, batches):
                    unknown = set(batch) - set(schema.fields)
                    if unknown:
                        raise SchemaError(f"batch columns {sorted(unknown)} are not fields of {schema.name!r}")
                    lengths = {k: len(v) for k, v in batch.items()}
                    if len(set(lengths.values())) > 1:
                        raise SchemaError(f"columns of one batch must have equal lengths, found {lengths}")
                    n = next(iter(lengths.values()), 0)
                    for sink in sinks:
                        sink.append(batch.get(sink.field.name), n)
            os.replace(temporary, target)
        except BaseException:
            if os.path.exists(temporary):
                os.remove(temporary)
            raise
        return [target]


# -- ingest helpers ---------------------------------------------------------------------------
def _scan(handle: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(datasets with a first axis, scalar datasets) by path; companions of unihub fields left out."""
    h5py = _h5py()
    found: dict[str, Any] = {}
    handle.visititems(lambda name, obj: found.__setitem__(name, obj) if isinstance(obj, h5py.Dataset) else None)
    companions = {name + suffix for name, d in found.items() if FIELD_ATTR in d.attrs
                  for suffix in (SHAPE_SUFFIX, ISNULL_SUFFIX)}
    arrays = {n: d for n, d in found.items() if n not in companions and d.shape}
    scalars = {n: d for n, d in found.items() if n not in companions and not d.shape}
    return arrays, scalars


def _supported(dataset: Any) -> bool:
    h5py = _h5py()
    if FIELD_ATTR in dataset.attrs or h5py.check_string_dtype(dataset.dtype) is not None:
        return True
    vlen = h5py.check_vlen_dtype(dataset.dtype)
    dtype = dataset.dtype if vlen is None else vlen
    if vlen is not None and (dataset.ndim > 1 or h5py.check_string_dtype(vlen) is not None):
        return False
    if dtype.kind == "V" and dtype.names is None and vlen is None:
        return dataset.ndim == 1
    return dtype.kind in "biuf"


def _mismatch_message(path: str, lengths: dict[str, int]) -> str:
    by_length: dict[int, list[str]] = {}
    for name, n in lengths.items():
        by_length.setdefault(n, []).append(name)
    parts = "; ".join(f"{n} rows: {', '.join(repr(x) for x in names)}" for n, names in sorted(by_length.items()))
    return f"{path}: HDF5 datasets differ in length along the first axis ({parts})"


def _field_for(path: str, name: str, dataset: Any, sample_records: int | None) -> UnischemaField:
    """The Unischema field of one dataset: recorded by unihub's export, or inferred."""
    h5py = _h5py()
    recorded = dataset.attrs.get(FIELD_ATTR)
    if recorded is not None:
        data = json.loads(recorded.decode() if isinstance(recorded, bytes) else recorded)
        return UnischemaField.from_json({**data, "name": name})
    trailing = tuple(int(d) for d in dataset.shape[1:])
    if h5py.check_string_dtype(dataset.dtype) is not None:
        kind = np.str_ if _utf8(dataset, sample_records) else np.bytes_
        return UnischemaField(name, kind, trailing, None if trailing else ScalarCodec(kind))
    vlen = h5py.check_vlen_dtype(dataset.dtype)
    if vlen is not None:
        return UnischemaField(name, vlen.type, (None,), TensorCodec())
    if dataset.dtype.kind == "V":
        return UnischemaField(name, np.bytes_, (), ScalarCodec(np.bytes_))
    if trailing:
        return UnischemaField(name, dataset.dtype.type, trailing, TensorCodec())
    return UnischemaField(name, dataset.dtype.type, (), ScalarCodec(dataset.dtype.type))


def _utf8(dataset: Any, sample_records: int | None) -> bool:
    """True when the string dataset says UTF-8, or its (first ``sample_records``) values decode as UTF-8."""
    if _h5py().check_string_dtype(dataset.dtype).encoding == "utf-8":
        return True
    n = dataset.shape[0] if sample_records is None else min(sample_records, dataset.shape[0])
    step = _slice_rows(dataset, 8 << 20)
    for start in range(0, n, step):
        for value in np.asarray(_read_rows(dataset, start, min(start + step, n))).ravel():
            try:
                bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                return False
    return True


def _slice_rows(dataset: Any, target_bytes: int) -> int:
    """Rows per read: whole chunks adding up to about ``target_bytes`` (at least one chunk)."""
    h5py = _h5py()
    variable = h5py.check_vlen_dtype(dataset.dtype) is not None or \
        getattr(h5py.check_string_dtype(dataset.dtype), "length", 0) is None
    row_bytes = max(1, (_VLEN_ROW_BYTES if variable else dataset.dtype.itemsize) * math.prod(dataset.shape[1:]))
    rows = max(1, target_bytes // row_bytes)
    if dataset.chunks:
        chunk = dataset.chunks[0]
        rows = max(chunk, rows // chunk * chunk)
    return max(1, min(rows, dataset.shape[0]))


class _FieldReader:
    """One field of one file: rows served from a cache of one aligned slice (plus companions)."""

    def __init__(self, path: str, handle: Any, field: UnischemaField, slice_bytes: int) -> None:
        if field.name not in handle or not isinstance(handle[field.name], _h5py().Dataset):
            raise FormatError(f"{path}: no dataset {field.name!r} for field {field.name!r}", path=path)
        self.field = field
        self.data = _Slices(handle[field.name], slice_bytes)
        recorded = FIELD_ATTR in self.data.dataset.attrs
        self.shapes = _Slices(handle[field.name + SHAPE_SUFFIX], slice_bytes) \
            if recorded and field.name + SHAPE_SUFFIX in handle else None
        self.isnull = _Slices(handle[field.name + ISNULL_SUFFIX], slice_bytes) \
            if recorded and field.name + ISNULL_SUFFIX in handle else None
        self.convert = _converter(self.data.dataset, field)
        self.length = self.data.dataset.shape[0]

    def rows(self, start: int, stop: int) -> Any:
        values = self.convert(self.data.rows(start, stop))
        if self.shapes is not None:
            shapes = self.shapes.rows(start, stop)
            values = _object_array([v.reshape(s) for v, s in zip(values, shapes)])
        if self.isnull is not None:
            isnull = self.isnull.rows(start, stop)
            if isnull.any():
                values = _object_array([None if null else v for v, null in zip(values, isnull)])
        return values


class _Slices:
    """Rows of a dataset, read one aligned slice (:func:`_slice_rows`) at a time."""

    def __init__(self, dataset: Any, slice_bytes: int) -> None:
        self.dataset = dataset
        self.step = _slice_rows(dataset, slice_bytes)
        self.cached: tuple[int, np.ndarray] | None = None

    def rows(self, start: int, stop: int) -> np.ndarray:
        parts = []
        position = start
        while position < stop:
            first = position // self.step * self.step
            if self.cached is None or self.cached[0] != first:
                self.cached = None  # drop the old slice before reading the next
                self.cached = (first, np.asarray(_read_rows(self.dataset, first,
                                                            min(first + self.step, self.dataset.shape[0]))))
            end = min(stop, first + self.step)
            parts.append(self.cached[1][position - first:end - first])
            position = end
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _converter(dataset: Any, field: UnischemaField) -> Callable[[np.ndarray], Any]:
    """Stored rows -> the field's values (decoded strings, bytes, ragged arrays, cast numbers)."""
    h5py = _h5py()
    dtype = dataset.dtype
    if h5py.check_string_dtype(dtype) is not None:
        if field.numpy_dtype is np.str_:
            decode = np.frompyfunc(lambda v: bytes(v).decode("utf-8"), 1, 1)
        elif field.numpy_dtype is decimal.Decimal:
            decode = np.frompyfunc(lambda v: decimal.Decimal(bytes(v).decode("ascii")), 1, 1)
        else:
            decode = np.frompyfunc(bytes, 1, 1)
        if field.shape:
            return lambda rows: _object_array(list(decode(rows).astype(object)))  # one (k, ...) array per row
        return lambda rows: decode(rows).astype(object)
    vlen = h5py.check_vlen_dtype(dtype)
    if vlen is not None:
        if field.numpy_dtype is np.bytes_ or isinstance(field.codec, CompressedImageCodec):
            return lambda rows: _object_array([np.asarray(v).tobytes() for v in rows])
        return lambda rows: _object_array([np.asarray(v).astype(field.dtype, copy=False) for v in rows])
    if dtype.kind == "V":
        return lambda rows: _object_array([bytes(v.tobytes()) for v in rows])
    if field.dtype != object and dtype != field.dtype:
        return lambda rows: rows.astype(field.dtype)
    return lambda rows: rows


def _object_array(values: Sequence[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):  # out[:] = values would broadcast equal-length arrays to 2-D
        out[i] = value
    return out


def _read_scalar(dataset: Any) -> Any:
    if dataset.shape is None:  # an empty dataspace
        return None
    value = dataset[()]
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def _attributes(attrs: Any) -> dict[str, Any]:
    out = {}
    for key in attrs:
        if key.startswith("unihub."):
            continue
        try:
            out[key] = _jsonable(attrs[key])
        except (OSError, TypeError) as exc:  # an attribute h5py cannot read
            out[key] = f"<unreadable: {exc}>"
    return out


def _jsonable(value: Any) -> Any:
    """Attribute values as JSON types: numpy scalars and arrays to Python, bytes to text."""
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()] if value.dtype != object else [_jsonable(v) for v in value]
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("utf-8", "backslashreplace")
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


# -- export helpers ---------------------------------------------------------------------------
def _check_names(schema: Unischema) -> None:
    names = {f.name for f in schema}
    for name in names:
        for other in names:
            if other.startswith(name + "/"):
                raise SchemaError(f"fields {name!r} and {other!r} cannot both be HDF5 datasets "
                                  f"({name!r} would be a group)")
        if name.endswith((SHAPE_SUFFIX, ISNULL_SUFFIX)) and name.rsplit("__", 1)[0] in names:
            raise SchemaError(f"field {name!r} clashes with a companion dataset of another field")


class _FieldSink:
    """One field's dataset(s) in the file being written, grown batch by batch."""

    def __init__(self, handle: Any, field: UnischemaField, *, images: str, compression: str | None,
                 chunk_rows: int | None) -> None:
        h5py = _h5py()
        self.field = field
        self.image_bytes = isinstance(field.codec, CompressedImageCodec) and images == "bytes"
        self.decode_images = isinstance(field.codec, CompressedImageCodec) and images == "pixels"
        recorded = field._replace(codec=TensorCodec()) if self.decode_images else field
        dtype = field.numpy_dtype
        if self.image_bytes or dtype is np.bytes_:
            if field.shape and not self.image_bytes:
                raise SchemaError(f"field {field.name!r}: HDF5 export stores bytes fields of shape () only")
            self.kind, storage, shape = "bytes", h5py.vlen_dtype(np.uint8), ()
        elif dtype is np.str_ or dtype is decimal.Decimal:  # decimals as their exact text
            if not field.is_fixed_shape or (dtype is decimal.Decimal and field.shape):
                raise SchemaError(f"field {field.name!r}: HDF5 export cannot store strings of shape {field.shape}")
            self.kind, storage, shape = "str", h5py.string_dtype("utf-8"), field.shape
        elif isinstance(dtype, type) and issubclass(dtype, np.generic) and dtypes.is_numeric(dtype) \
                and np.dtype(dtype).kind != "c":
            if field.is_fixed_shape:
                self.kind, storage, shape = "fixed", np.dtype(dtype), field.shape
            else:
                base = np.uint8 if np.dtype(dtype) == np.bool_ else dtype
                self.kind, storage, shape = "ragged", h5py.vlen_dtype(np.dtype(base)), ()
        else:
            raise SchemaError(f"field {field.name!r}: HDF5 export cannot store dtype {dtypes.dtype_name(dtype)}")
        row_bytes = (_VLEN_ROW_BYTES if self.kind != "fixed" else np.dtype(storage).itemsize) * math.prod(shape)
        rows = chunk_rows or max(1, min(65536, (1 << 20) // max(1, row_bytes)))

        def create(name: str, dtype: Any, shape: tuple[int, ...]) -> Any:
            return handle.create_dataset(name, shape=(0, *shape), maxshape=(None, *shape), chunks=(rows, *shape),
                                         dtype=dtype, compression=compression)

        self.data = create(field.name, storage, shape)
        self.data.attrs[FIELD_ATTR] = json.dumps(recorded.to_json())
        ndim = len(field.shape)
        self.shapes = create(field.name + SHAPE_SUFFIX, np.int64, (ndim,)) \
            if self.kind == "ragged" and ndim > 1 else None
        self.isnull = create(field.name + ISNULL_SUFFIX, np.bool_, ()) if field.nullable else None
        self.size = 0

    def append(self, values: Any, n: int) -> None:
        if values is None:
            values = [None] * n
        isnull = np.fromiter((v is None for v in values), dtype=bool, count=n) \
            if not (isinstance(values, np.ndarray) and values.dtype != object) else np.zeros(n, dtype=bool)
        if isnull.any() and not self.field.nullable:
            raise SchemaError(f"field {self.field.name!r} is not nullable but row {self.size + int(np.argmax(isnull))} "
                              "is None")
        if self.decode_images:
            values = [self.field.codec.decode(self.field, v)  # type: ignore[union-attr]
                      if isinstance(v, (bytes, bytearray, memoryview)) else v for v in values]
        stored, shapes = self._storage(values, isnull, n)
        end = self.size + n
        for dataset, rows in ((self.data, stored), (self.shapes, shapes), (self.isnull, isnull)):
            if dataset is not None and n:
                dataset.resize(end, axis=0)
                if self.kind in ("bytes", "ragged") and dataset is self.data:
                    # h5py's __setitem__ turns equal-length rows into a 2-D array: write them as typed
                    typed = np.empty(n, dtype=dataset.dtype)
                    typed[:] = rows
                    dataset.write_direct(typed, dest_sel=np.s_[self.size:end])
                else:
                    dataset[self.size:end] = rows
        self.size = end

    def _storage(self, values: Any, isnull: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray | None]:
        field = self.field
        if self.kind == "fixed":
            if isinstance(values, np.ndarray) and values.dtype != object:
                return values.astype(field.dtype, copy=False).reshape((n, *field.shape)), None
            out = np.zeros((n, *field.shape), dtype=field.dtype)
            for i, v in enumerate(values):
                if v is not None:
                    out[i] = v
            return out, None
        if self.kind == "str":
            out = np.full((n, *field.shape), "", dtype=object)
            for i, v in enumerate(values):
                if v is not None:
                    out[i] = np.asarray(v, dtype=object) if field.shape else \
                        v.decode("utf-8") if isinstance(v, bytes) else str(v)
            return out, None
        if self.kind == "bytes":
            encode = self.field.codec.encode if self.image_bytes else (lambda _, v: bytes(v))  # type: ignore[union-attr]
            return _object_array([np.empty(0, np.uint8) if v is None
                                  else np.frombuffer(encode(field, v), dtype=np.uint8) for v in values]), None
        arrays = [np.zeros((0,) * len(field.shape), field.dtype) if v is None else np.asarray(v, dtype=field.dtype)
                  for v in values]
        base = self.data.dtype.metadata["vlen"]
        flat = _object_array([a.ravel().astype(base, copy=False) for a in arrays])
        shapes = np.array([a.shape for a in arrays], dtype=np.int64).reshape(n, len(field.shape))
        return flat, shapes

