"""Inside TensorFlow's graph: the flat arrays that crossed (``encode.py``) back into a namedtuple or dict of
(ragged) tensors, variable-shape rows made dense again after ``unbatch``, and tf.data's autotuning off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from unihub.bridges.tf.plans import FieldPlan, load_tf


def graph_only(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` traced as Python, not rewritten by AutoGraph: its loops run over the fields at
    trace time, and AutoGraph's source transformation took ~0.3 s of the time to first batch."""
    return cast("Callable[..., Any]", load_tf().autograph.experimental.do_not_convert(function))


def assembler(plans: Sequence[FieldPlan], row_type: type | None) -> Callable[..., Any]:
    """The graph function that turns the flat arrays back into a namedtuple of (ragged) tensors,
    or with no ``row_type`` a dict keyed by the fields' own names; the nullable fields' masks follow
    the fields (``row_type`` has them: :func:`row_type_with_masks`)."""
    tf = load_tf()

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

    return graph_only(assemble)


def densifier(plans: Sequence[FieldPlan]) -> Callable[..., Any]:
    """After ``unbatch``: variable-shape fields back to dense tensors of the field's shape."""
    tf = load_tf()

    def densify(row: Any) -> Any:
        values = list(row.values() if isinstance(row, dict) else row)  # the fields, then their masks
        for i, plan in enumerate(plans):
            if isinstance(values[i], tf.RaggedTensor):
                for lengths in values[i].nested_row_lengths():  # a ragged row would be padded: refused
                    tf.debugging.assert_equal(tf.reduce_all(tf.equal(lengths, lengths[:1])), True,
                                              message=f"field {plan.name!r}: a row of lists of different lengths "
                                              "is no dense tensor; read it with make_batch_reader (a RaggedTensor) "
                                              "or leave it out with schema_fields")
                values[i] = values[i].to_tensor()  # one row's array is rectangular: no padding is added
            if plan.ragged_rank:
                values[i] = tf.ensure_shape(values[i], plan.field.shape)
        if isinstance(row, dict):
            return dict(zip(row, values))
        return type(row)(*values)

    return graph_only(densify)


def without_autotune(dataset: Any) -> Any:
    """``dataset`` with tf.data's autotuning off.

    With it on, the end of an iteration waits for the autotune thread's next wake-up, whose period
    doubles from 10 ms up to a minute: an epoch of 5 s then ends 5 s after its last batch, one of
    0.65 s 0.62 s after (measured with TF 2.21 on a bare ``from_generator``; a TFRecord pipeline
    does it too). The reader's own threads already read ahead, so there is nothing to tune here; a
    later ``with_options`` that turns autotuning on wins over this one.
    """
    tf = load_tf()
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)
