"""TensorFlow bridge: ``tf.data.Dataset`` s over unihub readers (Petastorm's ``make_petastorm_dataset``).

Columns, not rows, cross into TensorFlow: a reader's batches (or, for a row reader,
chunks of rows gathered into numpy columns) go through one ``Dataset.from_generator`` as
flat numpy arrays, and a ``map`` rebuilds the namedtuple of tensors inside the graph.
So the per-row Python cost of Petastorm's bridge (one generator call per row) is gone.
:func:`make_tf_dataset` shuffles in numpy; without ragged fields the reader's chunks cross whole
and TensorFlow cuts the batches (``Dataset.rebatch``), else numpy re-batches, one call per batch;
image batches (shuffled or not) are cut in numpy from the encoded images, then each decoded whole.
The datasets made here leave tf.data's autotuning off (see :func:`~unihub.bridges.tf.assemble.without_autotune`).

How values are typed (from the Unischema, see :func:`output_signature`):

- numbers and booleans keep their dtype; ``datetime64`` becomes ``tf.int64`` nanoseconds since the Unix
  epoch and ``timedelta64`` ``tf.int64`` nanoseconds, whatever their stored unit (as Petastorm's);
- ``np.str_``, ``np.bytes_`` and ``decimal.Decimal`` become ``tf.string`` (decimals as ``str(d)``);
- a field whose shape has ``None`` dims is a ``tf.Tensor`` with those dims ``None`` in a row
  element, and a ``tf.RaggedTensor`` in a batch (rows differ in length; ragged keeps every
  value without padding; call ``.to_tensor()`` to pad);
- TensorFlow tensors cannot hold nulls, so a nullable field (``nullable=True``: every TFRecord
  feature some records lack, once converted) comes as two: its values with each null filled
  (:func:`~unihub.bridges.tf.plans.fill_value`: NaN for floats, 0 for other numbers, dates and booleans, ``b""`` for
  strings and decimals, in the field's shape; no values along ``None`` dims), and a ``tf.bool``
  feature ``<field>_is_present``, False where the row held a null. The masks come after all the
  fields, in the fields' order (dict keys, or namedtuple fields). Readers with Petastorm's
  types (``petastorm_types``, the default for datasets Petastorm wrote) keep Petastorm's
  structure instead: a null float is NaN there, a null date or duration in a batch int64's minimum (NaT,
  as Petastorm's), and any other null a
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

The modules, one job each: ``plans.py`` (how each field travels, ``output_signature``, ``fill_value``),
``encode.py`` (numpy columns -> the flat arrays that cross), ``sources.py`` (the readers served and the
numpy stages: shuffle, late decoding, re-batching), ``assemble.py`` (the graph side), ``ngram.py``
(windows), and this one, which builds the datasets.

    with make_reader("file:///data/train", num_epochs=1) as reader:
        for row in make_petastorm_dataset(reader):        # one namedtuple of tensors per row
            ...
    dataset = make_tf_dataset("file:///data/train", batch_size=64, shuffle_buffer=1000, seed=0)
    model.fit(dataset.map(lambda b: (b["features"], b["label"])), epochs=2)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, Literal

import numpy as np

from unihub.bridges.tf.assemble import assembler, densifier, without_autotune
from unihub.bridges.tf.dataset_type import Failures, bridged
from unihub.bridges.tf.emitted import Emitted, emitted_of
from unihub.bridges.tf.encode import encode_columns, flat_signature
from unihub.bridges.tf.ngram import ngram_dataset
from unihub.bridges.tf.plans import (
    PRESENT_SUFFIX,
    Columns,
    FieldPlan,
    check_reader,
    fill_value,
    load_tf,
    output_signature,
    row_type_with_masks,
)
from unihub.bridges.tf.sources import (
    READ_AGAIN_WARNING,
    ROW_CHUNK,
    column_batches,
    decode_late,
    read_again,
    rebatched,
    shuffled,
    tracked,
)
from unihub.errors import InvalidArgumentError
from unihub.readers.batching import columns_length
from unihub.readers.late_decode import cut_pays, decoded_later
from unihub.readers.reader import Reader, make_batch_reader
from unihub.readers.weighted import WeightedSamplingReader
from unihub.schema.codecs import CompressedImageCodec

#: with the two dataset makers, the names README and Petastorm's users reach through this module
__all__ = ["AUTOTUNE", "PRESENT_SUFFIX", "READ_AGAIN_WARNING", "ROW_CHUNK", "fill_value", "make_petastorm_dataset",
           "make_tf_dataset", "output_signature"]


#: ``tf.data.AUTOTUNE`` without importing TensorFlow
AUTOTUNE = -1


#: a dataset's images are decoded after the shuffle and the cut where the reader can hand them out
#: encoded (readers/late_decode.py); False decodes them in the reader (the same batches)
LATE_DECODING = True


def _dataset(source: Callable[[], Iterator[Columns]], plans: Sequence[FieldPlan], row_type: type | None,
             failures: Failures, *, unbatch: bool, rebatch: tuple[int, bool] | None = None) -> Any:
    """``source``'s columns as a dataset; ``rebatch=(size, drop_remainder)`` cuts them into batches
    of ``size`` rows inside TensorFlow (see :func:`make_tf_dataset`); unihub errors recorded in ``failures``."""
    tf = load_tf()

    def generate() -> Generator[tuple[np.ndarray, ...], None, None]:
        for columns in source():
            if columns_length(columns):
                yield encode_columns(plans, columns)

    dataset = tf.data.Dataset.from_generator(tracked(generate, failures), output_signature=flat_signature(plans))
    if rebatch is not None:
        dataset = dataset.rebatch(rebatch[0], drop_remainder=rebatch[1])
    dataset = dataset.map(assembler(plans, row_type))
    if unbatch:
        dataset = dataset.unbatch()
        if any(p.ragged_rank for p in plans):
            dataset = dataset.map(densifier(plans))
    return without_autotune(dataset)


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
    plans = check_reader(reader)
    if reader.ngram is not None:
        return ngram_dataset(reader)
    failures = Failures()
    dataset = _dataset(read_again(reader)(lambda: column_batches(reader, plans, ROW_CHUNK)), plans,
                       row_type_with_masks(reader.schema._get_namedtuple(), plans), failures, unbatch=not reader.batched)
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
    abandoned (so ``resume_from=`` is refused there: resume a reader and pass it). A reader passed in is read
    once and stays the caller's to stop.

    ``shuffle_buffer`` rows are shuffled across reader batches (numpy, seeded by ``seed``);
    ``batch_size=None`` keeps the reader's own batches (rows for a row reader); variable-shape
    fields are ``tf.RaggedTensor`` in batches; a nullable field's ``<field>_is_present`` mask
    follows the fields (see the module docstring). From a URL with a known row count (no predicate or
    filters, finite ``num_epochs``, no ``on_decode_error='skip'``) the dataset's cardinality is set. ``prefetch`` is a buffer size
    (``AUTOTUNE`` = ``tf.data.AUTOTUNE``; 0 or None: no prefetch).
    """
    _check_options(batch_size, shuffle_buffer, structure)
    owned = not isinstance(reader_or_url, (Reader, WeightedSamplingReader))
    plans, batched, row_type, rows_per_epoch, epochs = (
        _probed(reader_or_url, seed, reader_kwargs) if owned else _given(reader_or_url, reader_kwargs))
    iterations = itertools.count()
    # dense fields cross in the reader's (shuffled) chunks and TensorFlow cuts the batches
    # (``rebatch``, in C++): each crossing costs ~1 ms of Python under the GIL, which the
    # decoding threads then wait for; ragged fields travel as flat values + row lengths, which
    # only numpy can re-batch. Images are decoded after numpy cut the batches (after the shuffle buffer's
    # draw, shuffled), each into its own memory, which crosses whole: no batch is copied
    late_cut = bool(batch_size) and _decodes_cut_batches(reader_or_url, owned, plans, batched, reader_kwargs) and \
        cut_pays([p.field for p in plans], batch_size)
    in_graph = bool(batch_size) and not any(p.ragged_rank for p in plans) and not late_cut

    def source() -> Iterator[Columns]:
        k = next(iterations)
        reader = (make_batch_reader(reader_or_url, seed=None if seed is None else seed + k, **reader_kwargs)
                  if owned else reader_or_url)
        # which rows a shuffled dataset over a given reader hands out, where a ReaderPosition of it needs them
        emitted = None if owned else emitted_of(reader_or_url)
        if emitted is not None and not shuffle_buffer:
            emitted.reset()  # the rows reach the model in the reader's order
            emitted = None
        elif emitted is not None:
            emitted.start()
        try:
            rng = np.random.default_rng(None if seed is None else [seed, k]) if shuffle_buffer else None
            yield from _batches(reader, plans, batch_size or ROW_CHUNK, shuffle_buffer, rng,
                                rebatch=(batch_size, drop_remainder) if batch_size and not in_graph else None,
                                emitted=emitted, late_cut=late_cut)
        finally:
            if owned:
                reader.stop()
                reader.join()

    failures = Failures()
    dataset = _dataset(source, plans, row_type if structure == "namedtuple" else None, failures,
                       unbatch=batch_size is None and not batched,
                       rebatch=(batch_size, drop_remainder) if in_graph and batch_size else None)
    # with on_decode_error='skip' a row whose image fails to decode is dropped: the count is not known
    if batch_size and rows_per_epoch is not None and epochs is not None and \
            reader_kwargs.get("on_decode_error", "raise") == "raise":
        dataset = _with_cardinality(dataset, rows_per_epoch * epochs, batch_size, drop_remainder)
    if prefetch:
        dataset = dataset.prefetch(prefetch)
    return bridged(dataset, failures)


def _check_options(batch_size: Any, shuffle_buffer: Any, structure: Any) -> None:
    """:class:`~unihub.errors.InvalidArgumentError` for a :func:`make_tf_dataset` option out of range."""
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise InvalidArgumentError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    if not isinstance(shuffle_buffer, int) or shuffle_buffer < 0:
        raise InvalidArgumentError(f"shuffle_buffer must be a non-negative integer, got {shuffle_buffer!r}")
    if structure not in ("dict", "namedtuple"):
        raise InvalidArgumentError(f"structure must be 'dict' or 'namedtuple', got {structure!r}")


_Layout = tuple[list[FieldPlan], bool, type, int | None, int | None]  # plans, batched, row type, rows, epochs


def _probed(url: Any, seed: int | None, reader_kwargs: dict[str, Any]) -> _Layout:
    """What :func:`make_tf_dataset` needs to know of the readers it will open on ``url``, from one opened
    and stopped at once (which validates the options and schema); the row count where it is known."""
    if reader_kwargs.get("resume_from") is not None:
        # each iteration opens a fresh reader: each would resume at the same row, and the cardinality set
        # from a whole epoch's rows would end the resumed one with a FailedPreconditionError
        raise InvalidArgumentError("make_tf_dataset opens a fresh reader on each iteration of a URL, so resume_from= "
                                   "would resume every one of them: resume a reader and pass it, "
                                   "make_tf_dataset(make_batch_reader(url, resume_from=...), ...), or restore a "
                                   "ReaderPosition (unihub.bridges.tf.checkpoint)")
    probe = make_batch_reader(url, seed=seed, **reader_kwargs)
    try:
        plans = check_reader(probe)
        return (plans, True, row_type_with_masks(probe.schema._get_namedtuple(), plans), probe.num_rows_per_epoch,
                probe.num_epochs)
    finally:
        probe.stop()
        probe.join()


def _given(reader: Any, reader_kwargs: dict[str, Any]) -> _Layout:
    """The same of a reader given to :func:`make_tf_dataset`; no row count (it may be part way through)."""
    if reader_kwargs:
        raise InvalidArgumentError(f"reader options {sorted(reader_kwargs)} apply to a URL, not to a reader given")
    if reader.ngram is not None:
        raise InvalidArgumentError("make_tf_dataset re-batches rows, and an NGram reader yields windows of rows: "
                                   "use make_petastorm_dataset(reader) (one {offset: namedtuple} per window), "
                                   "then .batch() it")
    plans = check_reader(reader)
    return plans, reader.batched, row_type_with_masks(reader.schema._get_namedtuple(), plans), None, None


def _decodes_cut_batches(reader_or_url: Any, owned: bool, plans: Sequence[FieldPlan], batched: bool,
                         reader_kwargs: dict[str, Any]) -> bool:
    """Whether :func:`make_tf_dataset` cuts its batches from encoded images (shuffled or not) and decodes
    each batch after (:func:`_batches`): a batch reader with image fields that keeps every row (with
    ``on_decode_error='skip'`` a row dropped after the cut would leave its batch short)."""
    if not (LATE_DECODING and batched and any(isinstance(p.field.codec, CompressedImageCodec) for p in plans)):
        return False
    on_error = reader_kwargs.get("on_decode_error", "raise") if owned else \
        getattr(reader_or_url, "on_decode_error", None)  # a mix of readers: none of its own
    return bool(on_error == "raise")


def _batches(reader: Any, plans: Sequence[FieldPlan], chunk_rows: int, shuffle_buffer: int,
             rng: np.random.Generator | None, rebatch: tuple[int, bool] | None,
             emitted: Emitted | None = None, late_cut: bool = False) -> Iterator[Columns]:
    """One iteration's columns of ``reader`` (a row reader's gathered ``chunk_rows`` at a time): shuffled
    through ``shuffle_buffer`` rows by ``rng``, their images decoded after the shuffle where the reader can
    give them encoded, and with ``rebatch=(size, drop_remainder)`` re-batched in numpy (else the chunks,
    which TensorFlow cuts); ``emitted`` records which rows the shuffle let out, in order. ``late_cut``
    (re-batched): the batches are cut from encoded images (after the shuffle), each then decoded whole."""
    # images decoded after the shuffle: a batch reader's (a row reader's rows are gathered as they are)
    later = (bool(shuffle_buffer) or (late_cut and rebatch is not None)) and LATE_DECODING and reader.batched
    with decoded_later(reader, later) as late:
        batches = column_batches(reader, plans, chunk_rows)
        if shuffle_buffer and rng is not None:
            batches = shuffled(batches, shuffle_buffer, rng, emitted)
        if late is not None and late_cut and rebatch is not None:
            yield from decode_late(rebatched(batches, *rebatch), late, whole=True)
            return
        if late is not None:
            batches = decode_late(batches, late)
        if rebatch is not None:
            batches = rebatched(batches, *rebatch)
        yield from batches


def _with_cardinality(dataset: Any, rows: int, batch_size: int, drop_remainder: bool) -> Any:
    """``dataset`` told its number of batches (``rows`` known: Keras then shows progress and needs no first
    pass to count)."""
    batches = rows // batch_size if drop_remainder else -(-rows // batch_size)
    return dataset.apply(load_tf().data.experimental.assert_cardinality(batches))
