"""TensorFlow bridge: ``tf.data.Dataset`` s over unihub readers (Petastorm's ``make_petastorm_dataset``).

Columns, not rows, cross into TensorFlow: a reader's batches (or, for a row reader,
chunks of rows gathered into numpy columns) go through one ``Dataset.from_generator`` as
flat numpy arrays, and a ``map`` rebuilds the namedtuple of tensors inside the graph.
So the per-row Python cost of Petastorm's bridge (one generator call per row) is gone.
:func:`make_tf_dataset` shuffles in numpy; without ragged fields the reader's chunks cross whole
and TensorFlow cuts the batches (``Dataset.rebatch``), else numpy re-batches, one call per batch.
The datasets made here leave tf.data's autotuning off (see :func:`_without_autotune`).

How values are typed (from the Unischema, see :func:`output_signature`):

- numbers and booleans keep their dtype; ``datetime64`` becomes ``tf.int64`` nanoseconds since the Unix
  epoch and ``timedelta64`` ``tf.int64`` nanoseconds, whatever their stored unit (as Petastorm's);
- ``np.str_``, ``np.bytes_`` and ``decimal.Decimal`` become ``tf.string`` (decimals as ``str(d)``);
- a field whose shape has ``None`` dims is a ``tf.Tensor`` with those dims ``None`` in a row
  element, and a ``tf.RaggedTensor`` in a batch (rows differ in length; ragged keeps every
  value without padding; call ``.to_tensor()`` to pad);
- TensorFlow tensors cannot hold nulls, so a nullable field (``nullable=True``: every TFRecord
  feature some records lack, once converted) comes as two: its values with each null filled
  (:func:`fill_value`: NaN for floats, 0 for other numbers, dates and booleans, ``b""`` for
  strings and decimals, in the field's shape; no values along ``None`` dims), and a ``tf.bool``
  feature ``<field>_is_present``, False where the row held a null. The masks come after all the
  fields, in the fields' order (dict keys, or namedtuple fields). Readers with Petastorm's
  types (``petastorm_types``, the default for datasets Petastorm wrote) keep Petastorm's
  structure instead: a null float is NaN there, and any other null a
  :class:`~unihub.errors.ValidationError` naming the field and row;
- codec-less ``object`` fields have no TensorFlow type: a SchemaError when the dataset is made.

A unihub error met while reading (a corrupt image, a null Petastorm's types cannot carry) is
raised as itself, naming the field and row, by the iterators of the datasets made here;
TensorFlow carries it as a ``tf.errors.InvalidArgumentError`` holding its message wherever
TensorFlow iterates on its own (a ``Dataset.map`` of them, ``model.fit``, a ``tf.function``).
The datasets, and every dataset made from them, also answer TF1's idioms as Petastorm's
``tf.compat.v1`` datasets did (``make_one_shot_iterator()``, ``make_initializable_iterator()``,
``output_shapes``/``output_types``/``output_classes``, in ``tf.Graph().as_default()`` with
``tf.compat.v1.Session``), with TF2's semantics (:mod:`unihub.bridges.tf.dataset_type`).

An NGram reader (``make_reader(url, schema_fields=NGram(...))``) gives one element per window,
as Petastorm's: a dict ``{offset: namedtuple of tensors}`` for every offset from the smallest to
the largest (an offset with no fields: an empty namedtuple). Windows cross in chunks too.
Petastorm's TF1 graph-mode ``tf_tensors`` is in :mod:`unihub.bridges.tf.graph`.

    with make_reader("file:///data/train", num_epochs=1) as reader:
        for row in make_petastorm_dataset(reader):        # one namedtuple of tensors per row
            ...
    dataset = make_tf_dataset("file:///data/train", batch_size=64, shuffle_buffer=1000, seed=0)
    model.fit(dataset.map(lambda b: (b["features"], b["label"])), epochs=2)
"""

from __future__ import annotations

import atexit
import collections
import decimal
import functools
import itertools
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np

from unihub.bridges.tf.dataset_type import Failures, bridged
from unihub.dependencies import require
from unihub.errors import InvalidArgumentError, SchemaError, UnihubError, ValidationError
from unihub.readers.batching import ARRIVAL_ROWS, Rebatcher, ShuffleBuffer, columns_length, slice_columns
from unihub.readers.late_decode import DecodeAhead, decoded_later
from unihub.readers.loader import SOURCE_ROW
from unihub.readers.reader import Reader, make_batch_reader
from unihub.readers.weighted import WeightedSamplingReader
from unihub.schema.shapes import shape_matches

if TYPE_CHECKING:
    from unihub.readers.late_decode import LateImages
    from unihub.schema.unischema import Unischema, UnischemaField

#: rows a row reader's output is gathered into before crossing into TensorFlow
ROW_CHUNK = 256
#: ``tf.data.AUTOTUNE`` without importing TensorFlow
AUTOTUNE = -1
#: the name of the ``tf.bool`` feature beside each nullable field: ``<field>_is_present``
PRESENT_SUFFIX = "_is_present"

Columns = dict[str, np.ndarray]


def _tf() -> Any:
    return require("tensorflow", extra="tf", purpose="tf.data datasets")


@dataclass(frozen=True)
class _FieldPlan:
    """How one field travels: its TF dtype, numpy dtype for numbers (None: tf.string), ragged rank."""

    field: UnischemaField
    tf_dtype: Any
    np_dtype: np.dtype | None
    ragged_rank: int  # 0: dense in a batch; r: the first r dims of a row are ragged
    #: nulls filled (:func:`fill_value`) and a ``<name>_is_present`` mask beside the values
    masked: bool = False

    @property
    def name(self) -> str:
        return self.field.name

    @property
    def mask_name(self) -> str:
        return self.field.name + PRESENT_SUFFIX


def _plan_field(field: UnischemaField, petastorm_types: bool = False) -> _FieldPlan:
    """The transport plan of one field, or a SchemaError when TensorFlow has no type for it.

    ``petastorm_types`` (a reader with Petastorm's types): a 1-D list of numbers travels as a dense
    ``(n, k)`` tensor, as Petastorm's datasets give it, not a RaggedTensor, and a nullable field
    has no mask (Petastorm's structure)."""
    tf = _tf()
    kind = field.numpy_dtype
    if kind is decimal.Decimal or kind in (np.str_, np.bytes_):
        tf_dtype, np_dtype = tf.string, None
    elif kind in (np.datetime64, np.timedelta64):
        tf_dtype, np_dtype = tf.int64, np.dtype(np.int64)
    elif kind is np.object_:
        raise SchemaError(f"field {field.name!r} holds Python objects (no codec or a nested Arrow type) and has no "
                          "TensorFlow type; leave it out with schema_fields= or convert it with a TransformSpec")
    else:
        try:
            np_dtype = np.dtype(kind)
            tf_dtype = tf.as_dtype(np_dtype)
        except TypeError as exc:
            raise SchemaError(f"field {field.name!r}: numpy dtype {np_dtype} has no TensorFlow type; leave it out "
                              "with schema_fields= or convert it with a TransformSpec") from exc
    none_dims = [i for i, d in enumerate(field.shape) if d is None]
    if petastorm_types and field.shape == (None,) and np_dtype is not None:
        none_dims = []
    return _FieldPlan(field, tf_dtype, np_dtype, none_dims[-1] + 1 if none_dims else 0,
                      masked=field.nullable and not petastorm_types)


def _plans(fields: Sequence[UnischemaField], petastorm_types: bool = False) -> list[_FieldPlan]:
    """The fields' plans; a SchemaError where a nullable field's mask would take a field's name."""
    plans = [_plan_field(f, petastorm_types) for f in fields]
    names = {p.name for p in plans}
    taken = [p.mask_name for p in plans if p.masked and p.mask_name in names]
    if taken:
        raise SchemaError(f"fields {taken} have the names of the masks of nullable fields ('<field>{PRESENT_SUFFIX}', "
                          "True where the field holds a value); leave one out with schema_fields=")
    return plans


def _row_type(row_type: type, plans: Sequence[_FieldPlan]) -> type:
    """``row_type`` (a schema's namedtuple) with the nullable fields' masks after its fields."""
    masks = tuple(p.mask_name for p in plans if p.masked)
    return _namedtuple(row_type.__name__, tuple(row_type._fields) + masks) if masks else row_type  # type: ignore[attr-defined]


@functools.cache
def _namedtuple(name: str, fields: tuple[str, ...]) -> type:
    return collections.namedtuple(name, fields)


def output_signature(schema: Unischema, *, batched: bool = False, petastorm_types: bool = False) -> Any:
    """The schema's namedtuple of ``tf.TensorSpec`` (``tf.RaggedTensorSpec`` for variable dims when batched).

    ``None`` dims stay ``None``; ``batched`` adds a leading ``None`` batch dim. A nullable field's
    ``<field>_is_present`` mask (``tf.bool``) follows the fields, unless ``petastorm_types``.
    """
    tf = _tf()
    specs = []
    plans = _plans(list(schema), petastorm_types)
    for plan in plans:
        shape = ((None,) if batched else ()) + tuple(plan.field.shape)
        if batched and plan.ragged_rank:
            ragged_shape = (None,) * (plan.ragged_rank + 1) + shape[plan.ragged_rank + 1:]
            specs.append(tf.RaggedTensorSpec(ragged_shape, plan.tf_dtype, ragged_rank=plan.ragged_rank))
        else:
            specs.append(tf.TensorSpec(shape, plan.tf_dtype, name=plan.name))
    specs.extend(tf.TensorSpec((None,) if batched else (), tf.bool, name=p.mask_name) for p in plans if p.masked)
    return _row_type(schema._get_namedtuple(), plans)(*specs)


# -- numpy stages: rows -> columns -> shuffled -> re-batched -> flat arrays ---------------------------
def fill_value(field: UnischemaField) -> np.ndarray:
    """What a null of ``field`` becomes in TensorFlow, beside its ``<field>_is_present`` mask.

    NaN for floats (a null float is NaN in Petastorm's types too), 0 for other numbers, dates and
    booleans (False), ``b""`` for strings and decimals; an array of it in the field's shape, its
    ``None`` dims 0 long (a ragged row of no values). The dtype is the one TensorFlow is given.
    """
    kind = field.numpy_dtype
    shape = tuple(0 if d is None else d for d in field.shape)
    if kind is decimal.Decimal or kind in (np.str_, np.bytes_):
        return np.full(shape, b"", dtype=object)
    dtype = np.dtype(np.int64) if kind in (np.datetime64, np.timedelta64) else np.dtype(kind)
    return np.full(shape, np.nan if dtype.kind in "fc" else 0, dtype=dtype)


def _null_error(name: str, row: int) -> ValidationError:
    return ValidationError(f"field {name!r}, row {row} of a batch read: a null, which TensorFlow tensors cannot hold, "
                           "and Petastorm's types (petastorm_types=True) give it no mask; read with "
                           f"petastorm_types=False (nulls filled, and a '{name}{PRESENT_SUFFIX}' mask), fill it with a "
                           "TransformSpec, or leave the field out with schema_fields=", field=name, row=row)


def _present(column: Any) -> np.ndarray:
    """Where ``column`` holds a value: only an object column holds nulls (None)."""
    if isinstance(column, np.ndarray) and column.dtype == object:
        return np.fromiter((v is not None for v in column), dtype=bool, count=len(column))
    return np.ones(len(column), dtype=bool)


def _rows_to_columns(plans: Sequence[_FieldPlan], rows: list[Any]) -> Columns:
    """A chunk of row namedtuples as numpy columns (dense where the field's shape is fixed; nulls as
    None in an object column)."""
    columns: Columns = {}
    for plan, values in zip(plans, zip(*rows)):
        dense = not plan.ragged_rank and not any(v is None for v in values)
        if plan.field.shape and dense:  # fixed shape (numbers or strings): one dense array
            columns[plan.name] = _stacked(plan, values)
        elif plan.np_dtype is not None and dense:
            columns[plan.name] = np.asarray(values)
        else:
            column = np.empty(len(values), dtype=object)
            for i, value in enumerate(values):
                column[i] = value
            columns[plan.name] = column
    return columns


# -- readers TensorFlow pulls from, stopped when the program ends --------------------------------
_served: weakref.WeakSet[Any] = weakref.WeakSet()  # readers the generators are reading
_generators: weakref.WeakSet[Any] = weakref.WeakSet()  # generators TensorFlow holds
_last_pull = [0.0]  # when a generator was last resumed or left (monotonic)
_lock = threading.Lock()
_exit_hook: list[bool] = []
EXIT_WAIT_S = 2.0  # the most the exit hook waits for the generators to end
QUIET_S = 0.05  # no generator resumed for this long: TensorFlow is not pulling


def _stop_served_readers() -> None:
    """At exit, stop the readers TensorFlow's generators read and let the generators end.

    A ``tf.data`` iterator the program leaves unfinished is destroyed while the interpreter
    finalizes, after waiting for its prefetch thread; when that thread is inside the generator
    (or about to enter it, or to finalize it) it needs Python, which finalization no longer runs:
    the process hung at exit. This runs first thing at shutdown (before thread pools are shut
    down): the readers stop, a generator resumed then ends, and TensorFlow finalizes it while
    Python still runs. A generator TensorFlow is not pulling from (its prefetch buffer full)
    stays suspended; the iterator's destruction does not need Python then.
    """
    with _lock:
        readers = list(_served)
    for reader in readers:
        reader.stop()
    deadline = time.monotonic() + EXIT_WAIT_S
    while time.monotonic() < deadline:
        with _lock:
            if not len(_generators) or time.monotonic() - _last_pull[0] > QUIET_S:
                return
        time.sleep(0.005)


def _register_exit_hook() -> None:
    with _lock:
        if _exit_hook:
            return
        _exit_hook.append(True)
    # threading's own exit hooks run before the interpreter joins threads and shuts thread pools
    # down (the reader's among them), atexit's only after
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise AttributeError
        register(_stop_served_readers)
    except (AttributeError, RuntimeError):
        atexit.register(_stop_served_readers)


def _pulled() -> None:
    _last_pull[0] = time.monotonic()


def _tracked(make: Callable[[], Generator[Any, None, None]], failures: Failures) -> Callable[[], Iterator[Any]]:
    """``make`` (a ``from_generator`` generator function), its generators known to the exit hook,
    which also sees when TensorFlow last resumed one, and the unihub errors they raise recorded in
    ``failures`` for the dataset's iterators (:func:`~unihub.bridges.tf.dataset_type.bridged`)."""
    def pull() -> Iterator[Any]:
        inner = make()
        try:
            for item in inner:
                _pulled()
                yield item
                _pulled()
        except UnihubError as exc:
            failures.record(exc)
            raise
        finally:
            _pulled()
            inner.close()

    def generator() -> Iterator[Any]:
        _register_exit_hook()
        outer = pull()
        with _lock:
            _generators.add(outer)
        return outer
    return generator


def _serving(reader: Any, batches: Iterator[Any]) -> Generator[Any, None, None]:
    """``batches`` of ``reader``, with the reader known to the exit hook while they are read."""
    with _lock:
        _served.add(reader)
    try:
        yield from batches
    finally:
        with _lock:
            _served.discard(reader)


def _column_batches(reader: Reader, plans: Sequence[_FieldPlan], chunk_rows: int) -> Iterator[Columns]:
    """The reader's batches as columns; a row reader's rows gathered ``chunk_rows`` at a time."""
    return _serving(reader, _columns_of(reader, plans, chunk_rows))


def _columns_of(reader: Reader, plans: Sequence[_FieldPlan], chunk_rows: int) -> Iterator[Columns]:
    names = [p.name for p in plans]
    if reader.batched:
        for batch in reader:
            columns = dict(zip(names, batch))
            if len(batch) > len(names):  # the reader decodes its images later: the rows' sources
                columns[SOURCE_ROW] = batch[-1]
            yield columns
        return
    while True:
        rows = list(itertools.islice(reader, chunk_rows))
        if not rows:
            return
        yield _rows_to_columns(plans, rows)


def _shuffled(batches: Iterator[Columns], capacity: int, rng: np.random.Generator) -> Iterator[Columns]:
    """Rows shuffled through a buffer of ``capacity`` rows: each arriving batch lets out a random
    sample of the buffer, so no row leaves before ``capacity`` others have arrived (as tf.data's)."""
    buffer = ShuffleBuffer(reserve=capacity + ARRIVAL_ROWS)
    for columns in batches:
        buffer.add(columns)
        extra = buffer.size - capacity
        if extra > 0:
            yield buffer.take_random(extra, rng)[0]
    if buffer.size:
        yield buffer.take_random(buffer.size, rng)[0]


#: rows decoded in one piece after a shuffle: the queue's last draw (all it holds) is cut so
#: that every thread decodes a share of it, not one thread the whole of it
DECODE_PIECE_ROWS = 512


def _decoded(batches: Iterator[Columns], late: LateImages) -> Iterator[Columns]:
    """``batches`` whose images came encoded, decoded a few ahead on ``late.threads`` threads."""
    with DecodeAhead(late) as decoder:
        for columns in batches:
            n = columns_length(columns)
            for start in range(0, n, DECODE_PIECE_ROWS):
                decoder.submit(None, slice_columns(columns, start, start + DECODE_PIECE_ROWS) if n > DECODE_PIECE_ROWS
                               else columns)
                yield from (decoded for _, decoded in decoder.ready())
        yield from (decoded for _, decoded in decoder.drain())


#: a shuffled dataset's images are decoded after the shuffle where the reader can hand them out
#: encoded (readers/late_decode.py); False decodes them in the reader (the same batches)
LATE_DECODING = True


def _rebatched(batches: Iterator[Columns], size: int, drop_remainder: bool) -> Iterator[Columns]:
    """Batches of exactly ``size`` rows (the last may be smaller unless ``drop_remainder``)."""
    return (batch for batch, _ in Rebatcher(size).batches(batches, drop_remainder))


def _encode_values(plan: _FieldPlan, column: np.ndarray) -> np.ndarray:
    """A dense column in the field's transport dtype (tf.string values as an object array)."""
    if column.dtype == object and not (present := _present(column)).all():
        raise _null_error(plan.name, int(np.flatnonzero(~present)[0]))
    if column.dtype == object and plan.field.shape and column.ndim == 1 and len(column):
        column = _stacked(plan, list(column))  # fixed-shape arrays one per row
    if plan.np_dtype is None:
        if plan.field.numpy_dtype is decimal.Decimal:
            return np.array([str(v) for v in column.ravel()], dtype=object).reshape(column.shape)
        return column
    if column.dtype == object and plan.field.numpy_dtype in (np.datetime64, np.timedelta64) and len(column):
        # their scalars (numpy's, or datetime.date/datetime/timedelta) as one typed array, in their own unit
        column = np.asarray(list(column), dtype=plan.field.numpy_dtype)
    if column.dtype.kind in "mM":
        return _nanoseconds(plan, column)
    if column.dtype == object and not len(column):
        column = np.empty((0, *(d or 0 for d in plan.field.shape)), plan.np_dtype)
    if column.dtype.kind == "f" and plan.np_dtype.kind in "biu" and (nan := np.isnan(column)).any():
        # a batch reader with Petastorm's types gives nulls of int fields as NaN
        raise _null_error(plan.name, int(np.flatnonzero(nan.reshape(len(column), -1).any(axis=1))[0]))
    return column.astype(plan.np_dtype, copy=False)


#: nanoseconds in one unit of the datetime64/timedelta64 units Arrow's dates, times and durations come in
NANOSECONDS_PER_UNIT = {"W": 7 * 86_400 * 10**9, "D": 86_400 * 10**9, "h": 3_600 * 10**9, "m": 60 * 10**9,
                        "s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}


def _nanoseconds(plan: _FieldPlan, column: np.ndarray) -> np.ndarray:
    """Dates and times as int64 nanoseconds since the Unix epoch, durations as int64 nanoseconds, whatever
    unit they are stored in (a date32 column's days too), as Petastorm gives them to TensorFlow; NaT stays
    int64's minimum. A value int64 nanoseconds cannot hold (outside the years 1677-2262, or finer than a
    nanosecond) is a ValidationError naming the field and row, not a number wrapped by numpy's cast."""
    unit, count = np.datetime_data(column.dtype)
    absent = np.isnat(column)
    if unit in NANOSECONDS_PER_UNIT:  # exact integer arithmetic (numpy's own cast back from ns overflows near the ends)
        factor = NANOSECONDS_PER_UNIT[unit] * count
        ticks = column.view(np.int64)
        lost = (np.abs(ticks) > np.iinfo(np.int64).max // factor) & ~absent
        nanoseconds = np.where(absent, ticks, ticks * factor) if factor > 1 else ticks
    else:  # years, months, or finer than ns: numpy's cast, checked by the way back
        converted = column.astype(f"{column.dtype.kind}8[ns]")
        lost = (converted.astype(column.dtype) != column) & ~absent
        nanoseconds = converted.view(np.int64)
    if lost.any():
        row = int(np.flatnonzero(lost.reshape(len(column), -1).any(axis=1))[0])
        raise ValidationError(f"field {plan.name!r}, row {row} of a batch read: {column.reshape(len(column), -1)[row]} "
                              "cannot be int64 nanoseconds (the unit of dates and durations in TensorFlow: years "
                              "1677-2262, nothing finer than 1 ns); convert it with a TransformSpec or leave the "
                              "field out with schema_fields=", field=plan.name, row=row)
    return nanoseconds


def _stacked(plan: _FieldPlan, values: Sequence[Any]) -> np.ndarray:
    """One array of the rows' arrays; rows of different shapes are a SchemaError saying what to do."""
    try:
        return np.stack(values)
    except ValueError:
        raise SchemaError(f"field {plan.name!r}: rows of different lengths ({sorted({np.shape(v) for v in values})[:4]}) "
                          "in a field read as a dense tensor, as Petastorm reads lists; read with "
                          "petastorm_types=False to get a RaggedTensor") from None


def _encode(plans: Sequence[_FieldPlan], columns: Columns) -> tuple[np.ndarray, ...]:
    """Flat arrays for ``from_generator``: a dense column, or flat values + nested row lengths, for
    each field, then the nullable fields' masks. Values TensorFlow cannot take are a ValidationError
    naming the field."""
    out: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    for plan in plans:
        column = columns[plan.name]
        present = _present(column)
        if not plan.masked and not present.all():
            raise _null_error(plan.name, int(np.flatnonzero(~present)[0]))
        try:
            if plan.ragged_rank:
                out.extend(_ragged(plan, column))
            else:
                out.append(_dense(plan, column, present))
        except UnihubError:
            raise
        except (ValueError, TypeError, OverflowError) as exc:  # numpy's, on values the schema does not describe
            raise ValidationError(f"field {plan.name!r}: values that do not make a {plan.field.shape} "
                                  f"{plan.tf_dtype.name} tensor ({type(exc).__name__}: {exc})", field=plan.name) from exc
        if plan.masked:
            masks.append(present)
    return tuple(out + masks)


def _dense(plan: _FieldPlan, column: np.ndarray, present: np.ndarray) -> np.ndarray:
    """A field of fixed shape as one array, its nulls filled."""
    if present.all():
        values = _encode_values(plan, column)
    else:
        fill = fill_value(plan.field)
        kept = _encode_values(plan, column[present]) if present.any() else fill[np.newaxis]
        values = np.empty((len(column), *kept.shape[1:]), dtype=kept.dtype)
        values[~present] = fill
        values[present] = kept
    if not shape_matches(values.shape[1:], plan.field.shape):
        raise SchemaError(f"field {plan.name!r}: values of shape {values.shape[1:]} where the schema "
                          f"says {plan.field.shape}")
    return values


def _ragged(plan: _FieldPlan, column: np.ndarray) -> list[np.ndarray]:
    """A field with ``None`` dims as its flat values and the row lengths of each ragged dim; a null
    is a row of no values."""
    given = [None if r is None else np.asarray(r) for r in column]
    ndim = len(plan.field.shape)
    for row, value in enumerate(given):
        if value is not None and value.ndim != ndim:
            raise ValidationError(f"field {plan.name!r}, row {row} of a batch read: a value of shape {value.shape} "
                                  f"where the schema says {plan.field.shape}", field=plan.name, row=row)
    empty = fill_value(plan.field)
    like = next((r for r in given if r is not None), None)
    empty = empty if like is None else empty.astype(like.dtype)
    rows = [empty if r is None else r for r in given]
    rank = plan.ragged_rank
    inner = tuple(d for d in plan.field.shape[rank:] if d is not None)
    assert len(inner) == len(plan.field.shape) - rank  # ragged_rank is past the field's last None dim
    shapes = np.array([r.shape[:rank] for r in rows], dtype=np.int64).reshape(len(rows), rank)
    flat = [r.reshape(-1, *inner) for r in rows]
    flat_values = np.concatenate(flat) if flat else np.empty((0, *inner), dtype=object)
    if flat_values.shape[1:] != inner:
        raise SchemaError(f"field {plan.name!r}: rows of shape {rows[0].shape} where the schema says "
                          f"{plan.field.shape}")
    out = [_encode_values(plan, flat_values)]
    for level in range(rank):
        out.append(np.repeat(shapes[:, level], np.prod(shapes[:, :level], axis=1)))
    return out


def _flat_signature(plans: Sequence[_FieldPlan]) -> tuple[Any, ...]:
    tf = _tf()
    specs: list[Any] = []
    for plan in plans:
        inner = tuple(plan.field.shape[plan.ragged_rank:])
        specs.append(tf.TensorSpec((None, *inner), plan.tf_dtype))
        specs.extend(tf.TensorSpec((None,), tf.int64) for _ in range(plan.ragged_rank))
    specs.extend(tf.TensorSpec((None,), tf.bool) for plan in plans if plan.masked)
    return tuple(specs)


def _graph_only(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` traced as Python, not rewritten by AutoGraph: its loops run over the fields at
    trace time, and AutoGraph's source transformation took ~0.3 s of the time to first batch."""
    return cast("Callable[..., Any]", _tf().autograph.experimental.do_not_convert(function))


def _assembler(plans: Sequence[_FieldPlan], row_type: type | None) -> Callable[..., Any]:
    """The graph function that turns the flat arrays back into a namedtuple of (ragged) tensors,
    or with no ``row_type`` a dict keyed by the fields' own names; the nullable fields' masks follow
    the fields (``row_type`` has them: :func:`_row_type`)."""
    tf = _tf()

    def assemble(*flat: Any) -> Any:
        values, i = [], 0
        for plan in plans:
            if plan.ragged_rank:
                lengths = flat[i + 1:i + 1 + plan.ragged_rank]
                values.append(tf.RaggedTensor.from_nested_row_lengths(flat[i], lengths, validate=False))
            else:
                values.append(flat[i])
            i += 1 + plan.ragged_rank
        masks = list(flat[i:])
        if row_type is None:
            names = [p.name for p in plans] + [p.mask_name for p in plans if p.masked]
            return dict(zip(names, values + masks))
        return row_type(*values, *masks)

    return _graph_only(assemble)


def _densifier(plans: Sequence[_FieldPlan]) -> Callable[..., Any]:
    """After ``unbatch``: variable-shape fields back to dense tensors of the field's shape."""
    tf = _tf()

    def densify(row: Any) -> Any:
        values = list(row.values() if isinstance(row, dict) else row)  # the fields, then their masks
        for i, plan in enumerate(plans):
            if isinstance(values[i], tf.RaggedTensor):
                values[i] = values[i].to_tensor()  # one row's array is rectangular: no padding is added
            if plan.ragged_rank:
                values[i] = tf.ensure_shape(values[i], plan.field.shape)
        if isinstance(row, dict):
            return dict(zip(row, values))
        return type(row)(*values)

    return _graph_only(densify)


def _without_autotune(dataset: Any) -> Any:
    """``dataset`` with tf.data's autotuning off.

    With it on, the end of an iteration waits for the autotune thread's next wake-up, whose period
    doubles from 10 ms up to a minute: an epoch of 5 s then ends 5 s after its last batch, one of
    0.65 s 0.62 s after (measured with TF 2.21 on a bare ``from_generator``; a TFRecord pipeline
    does it too). The reader's own threads already read ahead, so there is nothing to tune here; a
    later ``with_options`` that turns autotuning on wins over this one.
    """
    tf = _tf()
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def _dataset(source: Callable[[], Iterator[Columns]], plans: Sequence[_FieldPlan], row_type: type | None,
             failures: Failures, *, unbatch: bool, rebatch: tuple[int, bool] | None = None) -> Any:
    """``source``'s columns as a dataset; ``rebatch=(size, drop_remainder)`` cuts them into batches
    of ``size`` rows inside TensorFlow (see :func:`make_tf_dataset`); unihub errors recorded in ``failures``."""
    tf = _tf()

    def generate() -> Generator[tuple[np.ndarray, ...], None, None]:
        for columns in source():
            if columns_length(columns):
                yield _encode(plans, columns)

    dataset = tf.data.Dataset.from_generator(_tracked(generate, failures), output_signature=_flat_signature(plans))
    if rebatch is not None:
        dataset = dataset.rebatch(rebatch[0], drop_remainder=rebatch[1])
    dataset = dataset.map(_assembler(plans, row_type))
    if unbatch:
        dataset = dataset.unbatch()
        if any(p.ragged_rank for p in plans):
            dataset = dataset.map(_densifier(plans))
    return _without_autotune(dataset)


def _check_reader(reader: Any) -> list[_FieldPlan]:
    """The reader's field plans; an NGram reader's are per offset (:func:`_ngram_plans`)."""
    if not isinstance(reader, (Reader, WeightedSamplingReader)):
        raise InvalidArgumentError(f"expected a unihub reader (make_reader/make_batch_reader), got {type(reader).__name__}")
    if reader.ngram is not None:
        return []
    return _plans(list(reader.schema), getattr(reader, "petastorm_types", False))


@dataclass(frozen=True)
class _Offset:
    """One offset of an NGram window: its fields' plans and the namedtuple type its rows take (the
    fields, then the masks of the nullable ones)."""

    offset: int
    plans: list[_FieldPlan]
    row_type: type


def _ngram_plans(reader: Any) -> list[_Offset]:
    """Every offset from the smallest to the largest, in order (an offset with no fields: no plans)."""
    ngram, petastorm_types = reader.ngram, getattr(reader, "petastorm_types", False)
    offsets = []
    for offset in range(min(ngram.fields), max(ngram.fields) + 1):
        view = ngram.get_schema_at_timestep(reader.schema, offset)
        plans = _plans(list(view), petastorm_types)
        offsets.append(_Offset(offset, plans, _row_type(view._get_namedtuple(), plans)))
    if not any(o.plans for o in offsets):
        raise InvalidArgumentError(f"{ngram!r} asks for no fields at any offset; a window would hold nothing")
    return offsets


#: warned when a dataset of make_petastorm_dataset is iterated again after it read its reader to the end
#: (Petastorm's words, which its users' tests match)
READ_AGAIN_WARNING = ("Running multiple iterations over make_petastorm_dataset is not recommend for performance "
                      "issue: each iteration resets the reader and reads it again. Use the reader's num_epochs "
                      "to read it several times, or the dataset's cache() before repeat()")


def _read_again(reader: Any) -> Callable[[Callable[[], Iterator[Any]]], Callable[[], Generator[Any, None, None]]]:
    """A source of ``reader``'s batches that, started again once an earlier start read the reader to the
    end (a second iteration of the dataset, ``repeat()``), warns and resets the reader first, as
    Petastorm's ``make_petastorm_dataset`` did: an ended reader would give an empty iteration. A source
    left part way (``take(n)``) goes on where the reader is."""
    def wrap(source: Callable[[], Iterator[Any]]) -> Callable[[], Generator[Any, None, None]]:
        read_to_the_end = [False]

        def read() -> Generator[Any, None, None]:
            if read_to_the_end[0]:
                warnings.warn(READ_AGAIN_WARNING, UserWarning, stacklevel=2)
                reader.reset()
                read_to_the_end[0] = False
            yield from source()
            read_to_the_end[0] = True
        return read
    return wrap


def _ngram_dataset(reader: Any) -> Any:
    """Windows as dicts ``{offset: namedtuple of tensors}``: ``ROW_CHUNK`` windows cross into
    TensorFlow at once as one flat tuple of columns (each offset's fields in turn), are rebuilt
    per offset in the graph and unbatched, as rows are."""
    tf = _tf()
    offsets = _ngram_plans(reader)
    failures = Failures()
    widths = [len(_flat_signature(o.plans)) for o in offsets]
    assemblers = [_assembler(o.plans, o.row_type) for o in offsets]

    def windows() -> Iterator[tuple[np.ndarray, ...]]:
        while True:
            chunk = list(itertools.islice(reader, ROW_CHUNK))
            if not chunk:
                return
            flat: list[np.ndarray] = []
            for o in offsets:
                if o.plans:
                    flat.extend(_encode(o.plans, _rows_to_columns(o.plans, [w[o.offset] for w in chunk])))
            yield tuple(flat)

    @_read_again(reader)
    def generate() -> Iterator[tuple[np.ndarray, ...]]:
        return _serving(reader, windows())

    def assemble(*flat: Any) -> dict[int, Any]:
        window, start = {}, 0
        for o, width, assembler in zip(offsets, widths, assemblers):
            window[o.offset] = assembler(*flat[start:start + width])
            start += width
        return window

    signature = tuple(spec for o in offsets for spec in _flat_signature(o.plans))
    dataset = tf.data.Dataset.from_generator(_tracked(generate, failures), output_signature=signature)
    dataset = dataset.map(_graph_only(assemble)).unbatch()
    if any(p.ragged_rank for o in offsets for p in o.plans):
        densifiers = [_densifier(o.plans) for o in offsets]
        dataset = dataset.map(_graph_only(lambda window: {o.offset: densify(window[o.offset])
                                                          for o, densify in zip(offsets, densifiers)}))
    return bridged(_without_autotune(dataset), failures)


def make_petastorm_dataset(reader: Reader) -> Any:
    """A ``tf.data.Dataset`` over a reader, as Petastorm's: namedtuples of tensors.

    A row reader gives one element per row (variable dims as ``None`` in the shapes); a batch
    reader gives one element per reader batch (a leading ``None`` dim; variable-shape fields
    as ``tf.RaggedTensor``); an NGram reader one dict ``{offset: namedtuple}`` per window. A
    nullable field's ``<field>_is_present`` mask follows the fields (see the module docstring). Rows
    (windows) cross into TensorFlow in chunks of :data:`ROW_CHUNK` and are unbatched in the graph.
    The caller owns the reader (``with reader:``). Iterating the dataset again (a second loop,
    ``repeat()``) after it read the reader to the end resets the reader and reads it again, with
    Petastorm's UserWarning (:data:`READ_AGAIN_WARNING`): the reader's ``num_epochs`` reads faster.

        with make_reader(url) as reader:
            for row in make_petastorm_dataset(reader).take(2):
                print(row.id, row.image.shape)
    """
    plans = _check_reader(reader)
    if reader.ngram is not None:
        return _ngram_dataset(reader)
    failures = Failures()
    dataset = _dataset(_read_again(reader)(lambda: _column_batches(reader, plans, ROW_CHUNK)), plans,
                       _row_type(reader.schema._get_namedtuple(), plans), failures, unbatch=not reader.batched)
    return bridged(dataset, failures)


def make_tf_dataset(reader_or_url: Any, batch_size: int | None = None, *, shuffle_buffer: int = 0,
                    seed: int | None = None, prefetch: int | None = AUTOTUNE, drop_remainder: bool = False,
                    structure: Literal["dict", "namedtuple"] = "dict", **reader_kwargs: Any) -> Any:
    """A ``tf.data.Dataset`` of ``batch_size``-row batches, re-batched in numpy: dicts keyed by the
    schema's own field names (``structure="namedtuple"``: the row namedtuples, as Petastorm's).

    ``reader_or_url``: a dataset URL (read with :func:`unihub.make_batch_reader` and
    ``reader_kwargs``: ``schema_fields``, ``num_epochs``, ``workers_count``, ...) or a reader.
    From a URL, every iteration of the dataset (each Keras epoch) opens a fresh reader, seeded
    ``seed + k`` on the k-th iteration, and stops and joins it when the iteration ends or is
    abandoned. A reader passed in is read once and stays the caller's to stop.

    ``shuffle_buffer`` rows are shuffled across reader batches (numpy, seeded by ``seed``);
    ``batch_size=None`` keeps the reader's own batches (rows for a row reader); variable-shape
    fields are ``tf.RaggedTensor`` in batches; a nullable field's ``<field>_is_present`` mask
    follows the fields (see the module docstring). From a URL with a known row count (no predicate or
    filters, finite ``num_epochs``) the dataset's cardinality is set. ``prefetch`` is a buffer size
    (``AUTOTUNE`` = ``tf.data.AUTOTUNE``; 0 or None: no prefetch).
    """
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise InvalidArgumentError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    if not isinstance(shuffle_buffer, int) or shuffle_buffer < 0:
        raise InvalidArgumentError(f"shuffle_buffer must be a non-negative integer, got {shuffle_buffer!r}")
    if structure not in ("dict", "namedtuple"):
        raise InvalidArgumentError(f"structure must be 'dict' or 'namedtuple', got {structure!r}")
    owned = not isinstance(reader_or_url, (Reader, WeightedSamplingReader))
    if owned:
        probe = make_batch_reader(reader_or_url, seed=seed, **reader_kwargs)  # validates options and schema
        try:
            plans, batched = _check_reader(probe), True
            row_type = _row_type(probe.schema._get_namedtuple(), plans)
            rows_per_epoch, epochs = probe.num_rows_per_epoch, probe.num_epochs
        finally:
            probe.stop()
            probe.join()
    else:
        if reader_kwargs:
            raise InvalidArgumentError(f"reader options {sorted(reader_kwargs)} apply to a URL, not to a reader given")
        if reader_or_url.ngram is not None:
            raise InvalidArgumentError("make_tf_dataset re-batches rows, and an NGram reader yields windows of rows: "
                                       "use make_petastorm_dataset(reader) (one {offset: namedtuple} per window), "
                                       "then .batch() it")
        plans, batched = _check_reader(reader_or_url), reader_or_url.batched
        row_type = _row_type(reader_or_url.schema._get_namedtuple(), plans)
        rows_per_epoch = epochs = None  # a reader given may be part way through
    iterations = itertools.count()
    # dense fields cross in the reader's (shuffled) chunks and TensorFlow cuts the batches
    # (``rebatch``, in C++): each crossing costs ~1 ms of Python under the GIL, which the
    # decoding threads then wait for; ragged fields travel as flat values + row lengths, which
    # only numpy can re-batch
    in_graph = bool(batch_size) and not any(p.ragged_rank for p in plans)

    def source() -> Iterator[Columns]:
        k = next(iterations)
        reader = (make_batch_reader(reader_or_url, seed=None if seed is None else seed + k, **reader_kwargs)
                  if owned else reader_or_url)
        try:
            # images decoded after the shuffle: a batch reader's (a row reader's rows are gathered as they are)
            with decoded_later(reader, bool(shuffle_buffer) and LATE_DECODING and reader.batched) as late:
                batches = _column_batches(reader, plans, batch_size or ROW_CHUNK)
                if shuffle_buffer:
                    batches = _shuffled(batches, shuffle_buffer,
                                        np.random.default_rng(None if seed is None else [seed, k]))
                if late is not None:
                    batches = _decoded(batches, late)
                if batch_size and not in_graph:
                    batches = _rebatched(batches, batch_size, drop_remainder)
                yield from batches
        finally:
            if owned:
                reader.stop()
                reader.join()

    failures = Failures()
    dataset = _dataset(source, plans, row_type if structure == "namedtuple" else None, failures,
                       unbatch=batch_size is None and not batched,
                       rebatch=(batch_size, drop_remainder) if in_graph and batch_size else None)
    if batch_size and rows_per_epoch is not None and epochs is not None:
        rows = rows_per_epoch * epochs  # known: Keras then shows progress and needs no first pass to count
        batches = rows // batch_size if drop_remainder else -(-rows // batch_size)
        dataset = dataset.apply(_tf().data.experimental.assert_cardinality(batches))
    if prefetch:
        dataset = dataset.prefetch(prefetch)
    return bridged(dataset, failures)
