"""Any data loader's output as Unischema rows: tf.data, torch, Keras, iterables of dicts.

A source becomes a :class:`Source`: what kind it is, its rows (``name -> numpy value, bytes or
str``) and, for ``tf.data``, the schema its ``element_spec`` gives. Nested dicts and tuples are
flattened to readable names (``{"image": {"encoded": b}}`` -> ``image_encoded``; tuple members
by position, ``field_0``, ``field_1``, or by ``names=``; Keras batches ``x``, ``y``,
``sample_weight``). Other sources get their schema from their first rows: a dimension that
varies among them is ``None``. Frameworks are never imported here: a value is recognised by the
module of its type, so a torch dataset does not pull in TensorFlow.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from unihub.errors import SchemaError
from unihub.schema.codecs import CompressedImageCodec, ScalarCodec, TensorCodec
from unihub.schema.unischema import Unischema, UnischemaField

Row = dict[str, Any]

#: rows looked at to infer a schema (dimensions that vary among them become None)
SAMPLE_ROWS = 64
_KERAS_NAMES = ("x", "y", "sample_weight")
#: about how many bytes of a tf.data pipeline's output are converted at a time
BATCH_BYTES = 8 << 20
#: rows tf batches at a time where a pipeline has string fields (then joined up to BATCH_BYTES)
STRING_BATCH_ROWS = 64


@dataclass
class Source:
    """A loader adapted: ``kind`` names it (shown by ``unihub inspect``), ``rows`` yields flat rows."""

    kind: str
    rows: Iterator[Row]
    schema: Unischema | None = None
    #: set instead of ``rows`` where the loader can hand over whole columns (tf.data, fixed shapes)
    batches: Iterator[Row] | None = None


def adapt(loader: Any, *, names: Sequence[str] | None = None) -> Source:
    """The :class:`Source` for ``loader``: a ``tf.data.Dataset``, a torch map-style or iterable
    dataset, a Keras ``PyDataset``/``Sequence``, or any iterable of dicts or tuples."""
    bases = {f"{c.__module__}.{c.__qualname__}" for c in type(loader).__mro__}
    if hasattr(loader, "element_spec") and type(loader).__module__.startswith("tensorflow"):
        return _tf_source(loader, names)
    if any(b.startswith("keras") and b.rsplit(".", 1)[-1] in ("PyDataset", "Sequence") for b in bases):
        return Source("keras PyDataset", _keras_rows(loader, names))
    if "torch.utils.data.dataset.IterableDataset" in bases:
        return Source("torch IterableDataset", (flatten(_torch_item(item), names) for item in loader))
    if "torch.utils.data.dataset.Dataset" in bases:
        return Source("torch Dataset", (flatten(_torch_item(loader[i]), names) for i in range(len(loader))))
    if type(loader).__name__ == "DataFrame":  # pandas, polars, ...: iterating one yields its columns, not rows
        raise SchemaError(f"cannot cache a {type(loader).__module__.split('.')[0]} DataFrame directly (iterating it "
                          "yields its columns): return its rows, e.g. df.to_dict('records') or df.iter_rows(named=True)")
    if isinstance(loader, (str, bytes, Mapping)) or not isinstance(loader, Iterable):
        raise SchemaError(f"cannot cache a {type(loader).__name__}: return a tf.data.Dataset, a torch Dataset, "
                          "a Keras PyDataset or an iterable of dicts or tuples")
    return Source("iterable", (flatten(item, names) for item in loader))


def _torch_item(item: Any) -> Any:
    """A torch dataset's element; a list is its parts, as torch's ``default_collate`` reads it (``[image, label]``)."""
    return tuple(item) if isinstance(item, list) else item


# -- flattening ------------------------------------------------------------------------------
def flatten(item: Any, names: Sequence[str] | None = None) -> Row:
    """One row from a loader's element: nested dicts and tuples flattened, leaves as numpy."""
    row: Row = {}
    _flatten_into(row, item, "", names)
    return row


def _flatten_into(row: Row, value: Any, prefix: str, names: Sequence[str] | None) -> None:
    if isinstance(value, Mapping):
        for key, member in value.items():
            _flatten_into(row, member, f"{prefix}_{key}" if prefix else str(key), None)
    elif isinstance(value, tuple) and not hasattr(value, "_fields"):
        if names is not None and len(names) != len(value):
            raise SchemaError(f"names= gives {len(names)} names for elements of {len(value)} parts: {list(names)}")
        for i, member in enumerate(value):
            name = names[i] if names is not None else (f"{prefix}_{i}" if prefix else f"field_{i}")
            _flatten_into(row, member, name, None)
    elif isinstance(value, tuple):  # a namedtuple: its own names
        _flatten_into(row, value._asdict(), prefix, None)  # type: ignore[attr-defined]
    else:
        if not prefix:
            prefix = names[0] if names else "field_0"
        if prefix in row:
            raise SchemaError(f"two parts of an element flatten to the field name {prefix!r}; pass names=")
        row[prefix] = leaf(value)


def leaf(value: Any) -> Any:
    """A value as unihub stores it: numpy for tensors, arrays and PIL images; bytes and str as they are."""
    if value is None or isinstance(value, (bytes, str, np.ndarray, np.generic)):
        return value
    module = type(value).__module__
    if module.startswith("torch"):
        try:
            return value.detach().cpu().numpy()
        except TypeError as exc:  # bfloat16 and others numpy has no dtype for
            raise SchemaError(f"a torch tensor of dtype {value.dtype} has no numpy dtype and cannot be cached; cast "
                              "it in the loader (.float())") from exc
    if module.startswith("tensorflow"):
        if type(value).__name__ == "RaggedTensor":
            return _dense(value)
        value = value.numpy()
        return value if not isinstance(value, np.ndarray) or value.dtype != object else _strings(value)
    if module.startswith("PIL"):
        return np.asarray(value)
    if isinstance(value, bool):
        return np.bool_(value)
    if isinstance(value, int):
        return np.int64(value)
    if isinstance(value, float):
        return np.float64(value)
    if isinstance(value, list):
        return np.asarray(value)
    return value


def _dense(ragged: Any) -> np.ndarray:
    """One element of a ragged tf.data pipeline as an array: stored with ``None`` dims, it must be rectangular."""
    try:
        values = np.asarray(ragged.to_list(), dtype=ragged.dtype.as_numpy_dtype)
    except ValueError as exc:  # numpy's "inhomogeneous shape"
        raise SchemaError(f"a ragged element of shape {ragged.shape} has inner rows of different lengths; only "
                          "elements that are rectangular arrays can be cached (pad them, or split the "
                          "ragged part into its values and row lengths)") from exc
    if values.ndim != ragged.shape.rank:  # no rows (``[]``): the dims inside them are empty too
        values = values.reshape([0 if d is None else d for d in ragged.shape.as_list()])
    return values


def _strings(values: np.ndarray) -> Any:
    if values.ndim == 0:
        return values.item()
    raise SchemaError(f"a string tensor of shape {values.shape} cannot be stored; only scalar strings can")


# -- tf.data ------------------------------------------------------------------------------------
def _tf_source(ds: Any, names: Sequence[str] | None) -> Source:
    fields: list[UnischemaField] = []
    _spec_fields(fields, ds.element_spec, "", names)
    schema = Unischema("cache", fields)
    import tensorflow as tf

    if int(ds.cardinality()) == tf.data.INFINITE_CARDINALITY:  # the build would never end
        raise SchemaError("the tf.data pipeline is endless (a repeat() without a count?); cache one pass of it")
    specs = tf.nest.flatten(ds.element_spec)
    if all(type(s).__name__ == "TensorSpec" and s.shape.is_fully_defined() for s in specs):
        # fixed shapes: tf batches the elements and numpy columns go to the writer whole, about
        # BATCH_BYTES at a time (per element, conversion costs more than a fast pipeline); strings,
        # whose size the spec does not say (a label or a 4 MB frame), are batched a few rows at a
        # time and joined up to BATCH_BYTES as measured
        strings = any(s.dtype.name == "string" for s in specs)
        row_bytes = sum(s.shape.num_elements() * s.dtype.size for s in specs if s.dtype.name != "string")
        size = max(1, min(STRING_BATCH_ROWS if strings else 1024, BATCH_BYTES // max(row_bytes, 1)))
        batches: Iterator[Row] = (flatten(b, names) for b in ds.batch(size).as_numpy_iterator())
        return Source("tf.data", iter(()), schema, batches=_joined(batches, BATCH_BYTES) if strings else batches)
    return Source("tf.data", (flatten(element, names) for element in ds), schema)


def _joined(batches: Iterator[Row], limit: int) -> Iterator[Row]:
    """Consecutive column batches joined into batches of about ``limit`` bytes (bytes values by their length)."""
    pending: list[Row] = []
    size = 0
    for batch in batches:
        pending.append(batch)
        size += sum(sum(map(len, v)) if v.dtype == object else v.nbytes for v in batch.values())
        if size >= limit:
            yield _concat(pending)
            pending, size = [], 0
    if pending:
        yield _concat(pending)


def _concat(batches: list[Row]) -> Row:
    if len(batches) == 1:
        return batches[0]
    return {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}


def _spec_fields(out: list[UnischemaField], spec: Any, prefix: str, names: Sequence[str] | None) -> None:
    if isinstance(spec, Mapping):
        for key, member in spec.items():
            _spec_fields(out, member, f"{prefix}_{key}" if prefix else str(key), None)
        return
    if isinstance(spec, tuple):
        if names is not None and len(names) != len(spec):
            raise SchemaError(f"names= gives {len(names)} names for elements of {len(spec)} parts: {list(names)}")
        for i, member in enumerate(spec):
            name = names[i] if names is not None else (f"{prefix}_{i}" if prefix else f"field_{i}")
            _spec_fields(out, member, name, None)
        return
    name = prefix or (names[0] if names else "field_0")
    kind = type(spec).__name__
    if kind not in ("TensorSpec", "RaggedTensorSpec"):
        raise SchemaError(f"element part {name!r} is a {kind}; only tensors and ragged tensors can be cached")
    shape = tuple(spec.shape.as_list()) if spec.shape.rank is not None else None
    if shape is None:
        raise SchemaError(f"element part {name!r} has an unknown rank; give the pipeline a shape (ensure_shape)")
    if spec.dtype.name == "string":
        if shape:
            raise SchemaError(f"element part {name!r} is a string tensor of shape {shape}; only scalar strings can "
                              "be cached")
        out.append(UnischemaField(name, np.bytes_, (), ScalarCodec(pa.binary()), False))
        return
    dtype = np.dtype(spec.dtype.as_numpy_dtype)
    codec = TensorCodec() if shape else _scalar_codec(name, dtype)
    out.append(UnischemaField(name, dtype.type, shape, codec, False))


# -- Keras ------------------------------------------------------------------------------------
def _keras_rows(ds: Any, names: Sequence[str] | None) -> Iterator[Row]:
    """Rows of a Keras PyDataset/Sequence, whose items are batches ``x``, ``(x, y)`` or ``(x, y, w)``."""
    for i in range(_keras_batches(ds)):
        batch = _keras_batch(ds[i])
        names_here = names if names is not None or isinstance(batch, Mapping) else _KERAS_NAMES[:len(batch)]
        columns = flatten(batch, names_here)
        sizes = {len(v) for v in columns.values()}
        if len(sizes) != 1:
            raise SchemaError(f"Keras batch {i}: parts hold different numbers of rows {sorted(sizes)}")
        for j in range(sizes.pop()):
            yield {name: leaf(column[j]) for name, column in columns.items()}


def _keras_batches(ds: Any) -> int:
    """How many batches: Keras 3's ``num_batches`` (``None`` when endless), else ``len()`` (``Sequence``)."""
    count = getattr(ds, "num_batches", None) if hasattr(type(ds), "num_batches") else len(ds)
    if not isinstance(count, int):
        raise SchemaError(f"the Keras {type(ds).__name__} says it has {count!r} batches; only a finite PyDataset "
                          "can be cached")
    return count


def _keras_batch(batch: Any) -> Any:
    """A batch as Keras reads it: a dict, or a tuple ``(x,)``, ``(x, y)``, ``(x, y, w)`` (a list is a tuple,
    an array is ``(x,)``); a list in it holds a multi-input model's inputs, one part each (``x_0``, ``x_1``)."""
    if isinstance(batch, Mapping):
        return batch
    parts = tuple(batch) if isinstance(batch, list) else batch if isinstance(batch, tuple) else (batch,)
    return tuple(tuple(p) if isinstance(p, list) else p for p in parts)


# -- schema from rows ---------------------------------------------------------------------------
def infer_schema(rows: Iterator[Row], *, image_format: str | Mapping[str, str] | None = None,
                 sample: int = SAMPLE_ROWS) -> tuple[Unischema, Iterator[Row]]:
    """A schema from the first ``sample`` rows, and all rows (those looked at included)."""
    head = list(itertools.islice(rows, sample))
    if not head:
        raise SchemaError("the loader yielded no rows; there is nothing to cache")
    _check_image_names(head[0], image_format)
    fields = [_field(name, [r.get(name) for r in head], image_format) for name in head[0]]
    for i, row in enumerate(head):
        if row.keys() != head[0].keys():
            raise SchemaError(f"row {i} has fields {sorted(row)}, row 0 has {sorted(head[0])}")
    return Unischema("cache", fields), itertools.chain(head, rows)


def image_fields(schema: Unischema, image_format: str | Mapping[str, str] | None) -> Unischema:
    """``schema`` with decoded-image fields stored as PNG/JPEG where ``image_format`` says so."""
    if image_format is None:
        return schema
    _check_image_names(schema.fields, image_format)
    return Unischema(schema.name, [_as_image(f, image_format) for f in schema])


def _check_image_names(fields: Iterable[str], image_format: str | Mapping[str, str] | None) -> None:
    """A SchemaError where ``image_format`` names a field the loader does not yield (a typo stores raw pixels)."""
    unknown = sorted(set(image_format) - set(fields)) if isinstance(image_format, Mapping) else []
    if unknown:
        raise SchemaError(f"image_format names {unknown}, which are not fields of the loader's elements; its fields "
                          f"are {sorted(fields)}")


def _field(name: str, values: list[Any], image_format: str | Mapping[str, str] | None) -> UnischemaField:
    present = [v for v in values if v is not None]
    nullable = len(present) < len(values)
    if not present:
        raise SchemaError(f"field {name!r} is None in every one of the first {len(values)} rows; pass schema=")
    first = present[0]
    if isinstance(first, bytes):
        return UnischemaField(name, np.bytes_, (), ScalarCodec(pa.binary()), nullable)
    if isinstance(first, str):
        return UnischemaField(name, np.str_, (), ScalarCodec(pa.string()), nullable)
    arrays = [np.asarray(v) for v in present]
    dtypes = {a.dtype for a in arrays}
    if len(dtypes) != 1:
        raise SchemaError(f"field {name!r} has values of several dtypes {sorted(map(str, dtypes))} in the first rows")
    ranks = {a.ndim for a in arrays}
    if len(ranks) != 1:
        raise SchemaError(f"field {name!r} has values of several ranks {sorted(ranks)} in the first rows")
    dtype = arrays[0].dtype
    if dtype.kind == "O":
        raise SchemaError(f"field {name!r} holds Python objects ({type(first).__name__}); cannot cache them")
    shape = tuple(d if all(a.shape[k] == d for a in arrays) else None for k, d in enumerate(arrays[0].shape))
    if not shape:
        return UnischemaField(name, dtype.type, (), _scalar_codec(name, dtype), nullable)
    return _as_image(UnischemaField(name, dtype.type, shape, TensorCodec(), nullable), image_format)


def _scalar_codec(name: str, dtype: np.dtype) -> ScalarCodec:
    """The codec of a scalar field of ``dtype``; a SchemaError naming the field where Arrow has no such type."""
    try:
        return ScalarCodec(pa.from_numpy_dtype(dtype))
    except (pa.ArrowNotImplementedError, TypeError) as exc:
        raise SchemaError(f"field {name!r} holds {dtype} scalars, which no Arrow type stores; cast them in the "
                          "loader") from exc


def _as_image(f: UnischemaField, image_format: str | Mapping[str, str] | None) -> UnischemaField:
    fmt = image_format.get(f.name) if isinstance(image_format, Mapping) else image_format
    if fmt is None:
        return f
    is_image = f.numpy_dtype == np.uint8 and (len(f.shape) == 2 or (len(f.shape) == 3 and f.shape[2] in (1, 3, 4)))
    if not is_image:
        if isinstance(image_format, Mapping):
            raise SchemaError(f"image_format names {f.name!r}, whose values ({f.numpy_dtype.__name__}, shape "
                              f"{f.shape}) are not uint8 images (H, W) or (H, W, 1|3|4)")
        return f
    return UnischemaField(f.name, np.uint8, f.shape, CompressedImageCodec(fmt), f.nullable)
