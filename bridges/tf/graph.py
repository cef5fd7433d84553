"""TensorFlow 1 graph mode: Petastorm's ``tf_tensors``, tensors that read the next row when run.

``tf_tensors(reader)`` puts one ``tf.numpy_function`` (``tf.compat.v1.py_func`` without its
deprecation warning) in the default graph; each ``session.run`` of its outputs calls
``next(reader)`` once and converts the item as :mod:`unihub.bridges.tf.dataset` does (same dtypes,
static shapes from the Unischema, a nullable field's null filled beside its ``<field>_is_present``
mask, or refused with Petastorm's types).
The end of the reader is ``tf.errors.OutOfRangeError``. With ``shuffling_queue_capacity > 0``
the items go through a ``tf.compat.v1.RandomShuffleQueue`` fed by one queue-runner thread (start
it with ``tf.compat.v1.train.start_queue_runners``); the queue's size op is named
:data:`RANDOM_SHUFFLING_QUEUE_SIZE`, as Petastorm named it.

    with tf.Graph().as_default(), make_reader(url, num_epochs=1) as reader:
        row = tf_tensors(reader)                      # a namedtuple of tensors
        loss = model(row.image, row.label)
        with tf.compat.v1.Session() as session:
            while True:
                try:
                    session.run(loss)
                except tf.errors.OutOfRangeError:
                    break

Under eager execution the function runs at once, so each call returns the next item as eager
tensors (Petastorm's behaviour); a shuffling queue needs a graph and is refused there. For
TF2 code, :func:`~unihub.bridges.tf.dataset.make_petastorm_dataset` is the streaming form.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from unihub.bridges.tf.encode import encode_columns, encode_values, null_error, present_mask, rows_to_columns
from unihub.bridges.tf.ngram import ngram_plans
from unihub.bridges.tf.plans import FieldPlan, check_reader, fill_value, load_tf, row_type_with_masks
from unihub.errors import InvalidArgumentError, SchemaError, UsageError
from unihub.schema.shapes import shape_matches

#: the name of the shuffling queue's size op (``graph.get_tensor_by_name(NAME + ":0")``), Petastorm's
RANDOM_SHUFFLING_QUEUE_SIZE = "random_shuffling_queue_size"


def _as_transport(plan: FieldPlan, value: np.ndarray) -> np.ndarray:
    """``numpy_function`` encodes numpy unicode arrays as ASCII: strings go as object arrays (str or bytes).
    A single ``bytes`` goes in as it is: numpy's ``S`` dtype would cut its trailing NUL bytes."""
    if plan.np_dtype is None:
        return value.astype(object) if isinstance(value, np.ndarray) else np.asarray(value, dtype=object)
    return value


def _row_values(plans: Sequence[FieldPlan], row: Any) -> list[np.ndarray]:
    """One row namedtuple (or a window's offset) as the function's arrays, checked against the schema:
    the fields, then the nullable fields' masks."""
    columns = rows_to_columns(plans, [row])
    out, masks = [], []
    for plan in plans:
        column = columns[plan.name]
        present = bool(present_mask(column)[0])
        if not present and not plan.masked:
            raise null_error(plan.name, 0)
        if not present:
            value = fill_value(plan.field)
        else:
            if plan.ragged_rank:  # one row of a variable-shape field is a dense array of its own shape
                column = np.asarray(column[0])[np.newaxis]
            value = encode_values(plan, column)[0]
        if not shape_matches(np.shape(value), plan.field.shape):
            raise SchemaError(f"field {plan.name!r}: a value of shape {np.shape(value)} where the schema says "
                              f"{plan.field.shape}")
        out.append(_as_transport(plan, value))
        if plan.masked:
            masks.append(np.array(present))
    return out + masks


def _check_options(reader: Any, capacity: Any, min_after_dequeue: Any) -> None:
    for name, value in (("shuffling_queue_capacity", capacity), ("min_after_dequeue", min_after_dequeue)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise InvalidArgumentError(f"{name} must be a non-negative integer, got {value!r}")
    if capacity > 0 and reader.batched:
        raise InvalidArgumentError("shuffling_queue_capacity can not be used with a reader that produces batched "
                                   "output (make_batch_reader): each batch is a row group, and shuffling whole "
                                   "batches does not decorrelate rows; use shuffle_rows=True on the reader")
    if capacity > 0 and min_after_dequeue >= capacity:
        raise InvalidArgumentError(f"min_after_dequeue ({min_after_dequeue}) must be smaller than "
                                   f"shuffling_queue_capacity ({capacity}), or the queue can never give a row")


def _shuffled(tensors: list[Any], capacity: int, min_after_dequeue: int) -> list[Any]:
    """The function's outputs through a RandomShuffleQueue with one enqueuing queue-runner thread."""
    v1 = load_tf().compat.v1
    queue = v1.RandomShuffleQueue(capacity, min_after_dequeue, [t.dtype for t in tensors])
    queue.size(name=RANDOM_SHUFFLING_QUEUE_SIZE)  # a node others may look up by its well-known name
    v1.train.add_queue_runner(v1.train.QueueRunner(queue, [queue.enqueue(tensors)]))
    dequeued = queue.dequeue()
    return list(dequeued) if isinstance(dequeued, (list, tuple)) else [dequeued]


def tf_tensors(reader: Any, shuffling_queue_capacity: int = 0, min_after_dequeue: int = 0) -> Any:
    """Tensors that yield the reader's next item each time they are run (Petastorm's ``tf_tensors``).

    A row reader gives a namedtuple of tensors with the fields' shapes (``None`` dims unknown), a
    nullable field's ``<field>_is_present`` mask after them (as :mod:`unihub.bridges.tf.dataset` gives it);
    a batch reader one with a leading ``None`` batch dim (a field with variable dims cannot be a
    dense batch: a SchemaError, use ``make_petastorm_dataset`` for RaggedTensors); an NGram
    reader a dict ``{offset: namedtuple of tensors}`` for every offset from min to max.
    ``shuffling_queue_capacity > 0`` adds a RandomShuffleQueue of that capacity that keeps at
    least ``min_after_dequeue`` items (row and NGram readers only); its runner must be started.

        with tf.Graph().as_default(), make_reader(url) as reader:
            row = tf_tensors(reader, shuffling_queue_capacity=100, min_after_dequeue=50)
            with tf.compat.v1.Session() as session:
                coord = tf.compat.v1.train.Coordinator()
                threads = tf.compat.v1.train.start_queue_runners(session, coord=coord)
                print(session.run(row).id)
                coord.request_stop(); coord.join(threads)
    """
    plans = check_reader(reader)
    _check_options(reader, shuffling_queue_capacity, min_after_dequeue)
    tf = load_tf()
    if shuffling_queue_capacity > 0 and tf.executing_eagerly():
        raise UsageError("tf_tensors with a shuffling queue builds TensorFlow 1 graph ops, which eager execution "
                         "cannot run; call it inside `with tf.Graph().as_default():`, or use "
                         "make_petastorm_dataset(reader).shuffle(n) in TensorFlow 2")
    groups = _groups(reader, plans)
    leading = (None,) if reader.batched else ()
    # (dtype, static shape) of each tensor a group's namedtuple holds: its fields, then their masks
    specs = [[(p.tf_dtype, leading + tuple(p.field.shape)) for p in group] +
             [(tf.bool, leading) for p in group if p.masked] for _, group, _ in groups]
    flat_specs = [spec for group_specs in specs for spec in group_specs]
    tensors = list(tf.numpy_function(_next_item(reader, plans, groups), [tf.constant(1)],
                                     [dtype for dtype, _ in flat_specs], stateful=True))
    if shuffling_queue_capacity > 0:
        tensors = _shuffled(tensors, shuffling_queue_capacity, min_after_dequeue)
    for tensor, (_, shape) in zip(tensors, flat_specs):
        tensor.set_shape(shape)
    out: dict[int | None, Any] = {}
    start = 0
    for (offset, _, row_type), group_specs in zip(groups, specs):
        out[offset] = row_type(*tensors[start:start + len(group_specs)])
        start += len(group_specs)
    return out[None] if reader.ngram is None else out


#: (offset, its fields' plans, its namedtuple type) of each namedtuple an item holds: one (offset None) for a
#: row or batch, one per offset for an NGram window
_Group = tuple[int | None, list[FieldPlan], type]


def _groups(reader: Any, plans: list[FieldPlan]) -> list[_Group]:
    """The namedtuples the reader's items become; a batch reader's variable-dim fields are a SchemaError."""
    if reader.ngram is not None:
        return [(o.offset, o.plans, o.row_type) for o in ngram_plans(reader)]
    ragged = [p.name for p in plans if p.ragged_rank]
    if reader.batched and ragged:
        raise SchemaError(f"fields {ragged} have variable dims, so a batch of them is not a dense tensor; read "
                          "them with make_reader, or use make_petastorm_dataset (tf.RaggedTensor batches)")
    return [(None, plans, row_type_with_masks(reader.schema._get_namedtuple(), plans))]


def _next_item(reader: Any, plans: list[FieldPlan], groups: list[_Group]) -> Any:
    """The function ``numpy_function`` runs: the reader's next item as the arrays of ``groups`` in turn."""
    def next_item(_: Any) -> list[np.ndarray]:
        item = next(reader)  # StopIteration: TensorFlow raises OutOfRangeError
        if reader.ngram is not None:
            return [v for offset, group, _ in groups for v in _row_values(group, item[offset])]
        if reader.batched:
            encoded = encode_columns(plans, dict(zip(reader.schema.fields, item)))  # no ragged fields: one array each
            return [_as_transport(p, v) for p, v in zip(plans, encoded)] + list(encoded[len(plans):])
        return _row_values(plans, item)
    return next_item
