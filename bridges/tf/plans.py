"""How each field travels into TensorFlow (its plan: TF dtype, numpy dtype, ragged rank, null mask), and
the ``tf.TensorSpec`` s that follow from the Unischema. The typing rules are in ``dataset.py``'s docstring.

TensorFlow is imported when a function needs it, never when this module is imported.
"""

from __future__ import annotations

import collections
import decimal
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from unihub.dependencies import require
from unihub.errors import InvalidArgumentError, SchemaError
from unihub.readers.reader import Reader
from unihub.readers.weighted import WeightedSamplingReader
from unihub.schema.codecs import CompressedImageCodec
from unihub.schema.unischema import UnischemaField

if TYPE_CHECKING:
    from unihub.schema.unischema import Unischema


#: the name of the ``tf.bool`` feature beside each nullable field: ``<field>_is_present``
PRESENT_SUFFIX = "_is_present"


Columns = dict[str, np.ndarray]


def load_tf() -> Any:
    """TensorFlow, or :class:`~unihub.errors.MissingDependencyError` with the install hint."""
    return require("tensorflow", extra="tf", purpose="tf.data datasets")


@dataclass(frozen=True)
class FieldPlan:
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


def _plan_field(field: UnischemaField, petastorm_types: bool = False) -> FieldPlan:
    """The transport plan of one field, or a SchemaError when TensorFlow has no type for it.

    ``petastorm_types`` (a reader with Petastorm's types): a 1-D list of numbers travels as a dense
    ``(n, k)`` tensor, as Petastorm's datasets give it, not a RaggedTensor, and a nullable field
    has no mask (Petastorm's structure)."""
    tf = load_tf()
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
    return FieldPlan(field, tf_dtype, np_dtype, none_dims[-1] + 1 if none_dims else 0,
                      masked=field.nullable and not petastorm_types)


def field_plans(fields: Sequence[UnischemaField], petastorm_types: bool = False,
                encoded_images: bool = False) -> list[FieldPlan]:
    """The fields' plans; a SchemaError where a nullable field's mask would take a field's name.
    ``encoded_images`` (a reader with ``decode_images=False``): image fields are their PNG/JPEG bytes, a
    ``tf.string`` each (``tf.io.decode_image`` decodes them), not the decoded shape their schema gives."""
    plans = [_plan_field(_encoded(f) if encoded_images else f, petastorm_types) for f in fields]
    names = {p.name for p in plans}
    taken = [p.mask_name for p in plans if p.masked and p.mask_name in names]
    if taken:
        raise SchemaError(f"fields {taken} have the names of the masks of nullable fields ('<field>{PRESENT_SUFFIX}', "
                          "True where the field holds a value); leave one out with schema_fields=")
    return plans


def _encoded(field: UnischemaField) -> UnischemaField:
    """An image field as the bytes a reader that does not decode images gives; any other field as it is."""
    if not isinstance(field.codec, CompressedImageCodec):
        return field
    return UnischemaField(field.name, np.bytes_, (), None, field.nullable)


def row_type_with_masks(row_type: type, plans: Sequence[FieldPlan]) -> type:
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
    tf = load_tf()
    specs = []
    plans = field_plans(list(schema), petastorm_types)
    for plan in plans:
        shape = ((None,) if batched else ()) + tuple(plan.field.shape)
        if batched and plan.ragged_rank:
            ragged_shape = (None,) * (plan.ragged_rank + 1) + shape[plan.ragged_rank + 1:]
            specs.append(tf.RaggedTensorSpec(ragged_shape, plan.tf_dtype, ragged_rank=plan.ragged_rank))
        else:
            specs.append(tf.TensorSpec(shape, plan.tf_dtype, name=plan.name))
    specs.extend(tf.TensorSpec((None,) if batched else (), tf.bool, name=p.mask_name) for p in plans if p.masked)
    return row_type_with_masks(schema._get_namedtuple(), plans)(*specs)


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


def check_reader(reader: Any) -> list[FieldPlan]:
    """The reader's field plans; an NGram reader's are per offset (:func:`~unihub.bridges.tf.ngram.ngram_plans`)."""
    if not isinstance(reader, (Reader, WeightedSamplingReader)):
        raise InvalidArgumentError(f"expected a unihub reader (make_reader/make_batch_reader), got {type(reader).__name__}")
    if reader.ngram is not None:
        return []
    return field_plans(list(reader.schema), getattr(reader, "petastorm_types", False),
                       not getattr(reader, "decode_images", True))
