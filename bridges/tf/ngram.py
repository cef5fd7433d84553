"""NGram windows as tf.data elements: one dict ``{offset: namedtuple of tensors}`` per window, for every
offset from the smallest to the largest (an offset with no fields: an empty namedtuple), as Petastorm's.
Windows cross into TensorFlow in chunks of ``ROW_CHUNK``, are rebuilt per offset in the graph and unbatched.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from unihub.bridges.tf.assemble import assembler, densifier, graph_only, without_autotune
from unihub.bridges.tf.dataset_type import Failures, bridged
from unihub.bridges.tf.encode import encode_columns, flat_signature, rows_to_columns
from unihub.bridges.tf.plans import FieldPlan, field_plans, load_tf, row_type_with_masks
from unihub.bridges.tf.sources import ROW_CHUNK, read_again, serving, tracked
from unihub.errors import InvalidArgumentError


@dataclass(frozen=True)
class _Offset:
    """One offset of an NGram window: its fields' plans and the namedtuple type its rows take (the
    fields, then the masks of the nullable ones)."""

    offset: int
    plans: list[FieldPlan]
    row_type: type


def ngram_plans(reader: Any) -> list[_Offset]:
    """Every offset from the smallest to the largest, in order (an offset with no fields: no plans)."""
    ngram, petastorm_types = reader.ngram, getattr(reader, "petastorm_types", False)
    offsets = []
    for offset in range(min(ngram.fields), max(ngram.fields) + 1):
        view = ngram.get_schema_at_timestep(reader.schema, offset)
        plans = field_plans(list(view), petastorm_types, not getattr(reader, "decode_images", True))
        offsets.append(_Offset(offset, plans, row_type_with_masks(view._get_namedtuple(), plans)))
    if not any(o.plans for o in offsets):
        raise InvalidArgumentError(f"{ngram!r} asks for no fields at any offset; a window would hold nothing")
    return offsets


def ngram_dataset(reader: Any) -> Any:
    """Windows as dicts ``{offset: namedtuple of tensors}``: ``ROW_CHUNK`` windows cross into
    TensorFlow at once as one flat tuple of columns (each offset's fields in turn), are rebuilt
    per offset in the graph and unbatched, as rows are."""
    tf = load_tf()
    offsets = ngram_plans(reader)
    failures = Failures()
    widths = [len(flat_signature(o.plans)) for o in offsets]
    assemblers = [assembler(o.plans, o.row_type) for o in offsets]

    def windows() -> Iterator[tuple[np.ndarray, ...]]:
        while True:
            chunk = list(itertools.islice(reader, ROW_CHUNK))
            if not chunk:
                return
            flat: list[np.ndarray] = []
            for o in offsets:
                if o.plans:
                    flat.extend(encode_columns(o.plans, rows_to_columns(o.plans, [w[o.offset] for w in chunk])))
            yield tuple(flat)

    @read_again(reader)
    def generate() -> Iterator[tuple[np.ndarray, ...]]:
        return serving(reader, windows())

    def assemble(*flat: Any) -> dict[int, Any]:
        window, start = {}, 0
        for o, width, assemble_offset in zip(offsets, widths, assemblers):
            window[o.offset] = assemble_offset(*flat[start:start + width])
            start += width
        return window

    signature = tuple(spec for o in offsets for spec in flat_signature(o.plans))
    dataset = tf.data.Dataset.from_generator(tracked(generate, failures), output_signature=signature)
    dataset = dataset.map(graph_only(assemble)).unbatch()
    if any(p.ragged_rank for o in offsets for p in o.plans):
        densifiers = [densifier(o.plans) for o in offsets]
        dataset = dataset.map(graph_only(lambda window: {o.offset: densify(window[o.offset])
                                                          for o, densify in zip(offsets, densifiers)}))
    return bridged(without_autotune(dataset), failures)
