"""Unischema: a tensor schema (dtype, shape with ``None`` dims, codec, nullable) for Parquet.

The schema is data: frozen, hashable fields, rendered on demand to Arrow, Spark,
TensorFlow, torch and namedtuple types, and stored in a dataset's metadata as
versioned JSON (never pickle). Names and arguments are Petastorm's::

    from unihub import Unischema, UnischemaField, CompressedImageCodec, TensorCodec, ScalarCodec
    import numpy as np, pyarrow as pa

    Schema = Unischema("Schema", [
        UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("image", np.uint8, (64, 64, 3), CompressedImageCodec("png"), False),
        UnischemaField("boxes", np.float32, (None, 4), TensorCodec(), False),
    ])
    Schema.id                    # the field
    Schema.as_parquet_schema()   # what the Parquet files hold
"""

from __future__ import annotations

import decimal
import json
import keyword
import math
import re
import warnings
from collections import OrderedDict, namedtuple
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa

from unihub.dependencies import require
from unihub.errors import (
    DecodeFieldError,
    InvalidArgumentError,
    SchemaError,
    UnsupportedFormatError,
    ValidationError,
)
from unihub.schema import dtypes
from unihub.schema.codecs import ScalarCodec, TensorCodec, codec_from_json, parquet_tensor_type
from unihub.schema.frameworks import tf_dtype, tf_spec, torch_dtype
from unihub.schema.metadata_json import FIELD_JSON_SCHEMA, UNISCHEMA_JSON_SCHEMA, check, parse_json
from unihub.schema.spark_types import arrow_to_spark_type
from unihub.schema.validation import stored_as_text, validate_value

if TYPE_CHECKING:
    from unihub.schema.codecs import Codec

#: The key under which a dataset's Unischema JSON lives in Parquet key-value metadata.
SCHEMA_METADATA_KEY = b"unihub.unischema"
#: Version of the JSON form this module writes; readers refuse newer ones with a SchemaError.
SCHEMA_JSON_VERSION = 1

Shape = tuple[int | None, ...]


class _FieldTuple(NamedTuple):
    name: str
    numpy_dtype: Any
    shape: Shape
    codec: Codec | None
    nullable: bool


class UnischemaField(_FieldTuple):
    """One field: ``UnischemaField(name, numpy_dtype, shape, codec=None, nullable=False)``.

    An immutable, hashable namedtuple as in Petastorm. ``numpy_dtype`` is normalised to a
    numpy scalar type (``np.int64``, ``np.str_``, ``np.bytes_``) or ``decimal.Decimal``;
    ``shape`` is a tuple whose ``None`` entries are dimensions that vary by row.
    """

    __slots__ = ()

    def __new__(
        cls,
        name: str,
        numpy_dtype: Any,
        shape: Sequence[int | None] = (),
        codec: Codec | None = None,
        nullable: bool = False,
    ) -> UnischemaField:
        if not isinstance(name, str) or not name:
            raise SchemaError(f"a field name must be a non-empty string, got {name!r}")
        try:
            dims = tuple(None if d is None else int(d) for d in shape)
        except (TypeError, ValueError) as exc:
            raise SchemaError(f"field {name!r}: shape must be a tuple of ints or None, got {shape!r}") from exc
        if any(d is not None and d < 0 for d in dims):
            raise SchemaError(f"field {name!r}: negative dimension in shape {shape!r}")
        if math.prod(d for d in dims if d is not None) >= 2**63:  # numpy, Arrow and TensorFlow count in int64
            raise SchemaError(f"field {name!r}: shape {shape!r} holds 2**63 or more values, which no array can")
        return super().__new__(cls, name, dtypes.normalize_dtype(numpy_dtype), dims, codec, bool(nullable))

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype of decoded values (``object`` for strings, bytes and decimals)."""
        if self.numpy_dtype in (np.str_, np.bytes_) or not isinstance(self.numpy_dtype, type) or not issubclass(self.numpy_dtype, np.generic):
            return np.dtype(object)
        return np.dtype(self.numpy_dtype)

    @property
    def is_fixed_shape(self) -> bool:
        """True when no dimension is ``None``."""
        return None not in self.shape

    def arrow_type(self) -> pa.DataType:
        """The Arrow storage type of this field in Parquet."""
        if self.codec is not None:
            return self.codec.arrow_type(self)
        return _default_arrow_type(self)

    def arrow_field(self) -> pa.Field:
        return pa.field(self.name, self.arrow_type(), nullable=self.nullable)

    def validate(self, value: Any, *, row: int | None = None) -> None:
        """Raise :class:`~unihub.errors.ValidationError` unless ``value`` fits this field."""
        validate_value(self, value, row=row)

    def to_json(self) -> dict[str, Any]:
        """The JSON-able dict that :meth:`from_json` reads back to an equal field."""
        return {
            "name": self.name,
            "dtype": dtypes.dtype_name(self.numpy_dtype),
            "shape": list(self.shape),
            "codec": None if self.codec is None else self.codec.to_json(),
            "nullable": self.nullable,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UnischemaField:
        """Read :meth:`to_json` output, checked against its description
        (:data:`~unihub.schema.metadata_json.FIELD_JSON_SCHEMA`)."""
        try:
            check(data, FIELD_JSON_SCHEMA)
        except SchemaError as exc:
            raise SchemaError(f"schema JSON field {_field_label(data)}: {exc}") from None
        return cls._from_checked_json(data, {}, f"schema JSON field {_field_label(data)}")

    @classmethod
    def _from_checked_json(cls, data: Mapping[str, Any], codecs: dict[Any, Codec], where: str) -> UnischemaField:
        """A field from JSON that fits :data:`FIELD_JSON_SCHEMA` (``where`` names it in errors); ``codecs``
        keeps the codecs made so far by their JSON (codecs are immutable), so a schema of many alike
        fields builds each codec once."""
        codec_json = data.get("codec")
        try:
            codec = None if codec_json is None else _codec_from_json(codec_json, codecs)
            return cls(data["name"], dtypes.dtype_from_name(data["dtype"]), tuple(data["shape"]),
                       codec, data.get("nullable", False))
        except (SchemaError, UnsupportedFormatError) as exc:  # an unknown codec keeps its class
            raise type(exc)(f"{where}: {exc}") from None
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
            raise SchemaError(f"{where}: {exc}") from exc

    def __repr__(self) -> str:
        return (f"UnischemaField({self.name!r}, {dtypes.dtype_name(self.numpy_dtype)}, {self.shape!r}, "
                f"{self.codec!r}, {self.nullable})")

    def __eq__(self, other: object) -> bool:
        """Equal name, dtype, shape and nullability, and equal codecs where both name one: a field
        written without a codec (``codec=None``, the default storage) matches the same field read back
        with the codec it was stored with, as Petastorm's fields (which ignored codecs) did."""
        if not isinstance(other, UnischemaField):
            return NotImplemented
        return (self.name, self.numpy_dtype, self.shape, self.nullable) == \
            (other.name, other.numpy_dtype, other.shape, other.nullable) and \
            (self.codec is None or other.codec is None or self.codec == other.codec)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash((self.name, self.numpy_dtype, self.shape, self.nullable))  # no codec: see __eq__


def _field_label(data: Any) -> str:
    """A field's JSON for a message: its name where it has one, else the start of its JSON."""
    name = data.get("name") if isinstance(data, Mapping) else None
    return repr(name) if isinstance(name, str) else repr(data)[:80]


def _codec_from_json(data: Mapping[str, Any], made: dict[Any, Codec]) -> Codec:
    """The codec of JSON ``data``, made once per distinct JSON in ``made``."""
    try:
        key: Any = tuple(sorted(data.items()))
        hash(key)
    except TypeError:  # a registered codec's config holding lists or objects: made each time
        return codec_from_json(data)
    found = made.get(key)
    if found is None:
        found = made[key] = codec_from_json(data)
    return found


def _default_arrow_type(field: UnischemaField) -> pa.DataType:
    """Codec-less fields: the scalar type, nested in one list per dimension."""
    arrow_type = dtypes.numpy_to_arrow_type(field.numpy_dtype)
    for _ in field.shape:
        arrow_type = pa.list_(arrow_type)
    return arrow_type


#: The attributes of Petastorm's Unischema: a field named so was no attribute there either, and
#: Petastorm warned (its words are kept); reach such a field as ``schema['fields']``.
_PETASTORM_ATTRIBUTES = frozenset({"fields", "create_schema_view", "as_spark_schema", "make_namedtuple",
                                   "make_namedtuple_tf", "from_arrow_schema", "_get_namedtuple", "_name", "_fields"})


class Unischema:
    """A named, ordered collection of :class:`UnischemaField`; fields are attributes too."""

    def __init__(self, name: str, fields: Iterable[UnischemaField], *,
                 attributes: Mapping[str, str] | None = None) -> None:
        """``attributes``: row attribute names to keep (a view's parent's), so that an attribute means
        the same field whichever fields a reader selects (see :attr:`attribute_names`)."""
        self._name = name
        self._inherited = dict(attributes or {})
        self._fields: OrderedDict[str, UnischemaField] = OrderedDict()
        for field in fields:
            if not isinstance(field, UnischemaField):
                raise SchemaError(f"Unischema {name!r}: {field!r} is not a UnischemaField")
            if field.name in self._fields:
                raise SchemaError(f"Unischema {name!r}: field {field.name!r} appears twice")
            if attributes is None and field.name in _PETASTORM_ATTRIBUTES:
                # Petastorm's warning (a view, made with its parent's ``attributes``, was warned about with its parent)
                warnings.warn(f"Can not create dynamic property {field.name} because it conflicts with an existing "
                              f"property of Unischema: schema.{field.name} is the Unischema's own; reach the field "
                              f"as schema[{field.name!r}] or schema.fields[{field.name!r}]", UserWarning,
                              stacklevel=2)
            self._fields[field.name] = field

    # -- access -----------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def fields(self) -> OrderedDict[str, UnischemaField]:
        """Fields by name, in order (a copy: the schema itself is immutable)."""
        return OrderedDict(self._fields)

    def __getattr__(self, item: str) -> UnischemaField:
        fields = self.__dict__.get("_fields")
        if fields is not None and item in fields:
            return fields[item]
        raise AttributeError(f"Unischema {self.__dict__.get('_name')!r} has no field {item!r}")

    def __getitem__(self, name: str) -> UnischemaField:
        try:
            return self._fields[name]
        except KeyError:
            raise KeyError(f"no field {name!r} in Unischema {self._name!r}; fields: {list(self._fields)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._fields

    def __iter__(self):
        return iter(self._fields.values())

    def __len__(self) -> int:
        return len(self._fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unischema) and self._name == other._name and \
            list(self._fields.values()) == list(other._fields.values())

    def __hash__(self) -> int:
        return hash((self._name, tuple(self._fields.values())))

    def __getstate__(self) -> dict[str, Any]:
        """The schema without its row type, which is made again on use: a class made at run time pickles by
        a name its module lacks ("Can't pickle <class 'S_row'>"), so a schema that had made a row failed to
        pickle (a reader's schema, sent to a process), where Petastorm's pickles."""
        state = dict(self.__dict__)
        state.pop("_namedtuple", None)
        return state

    def __repr__(self) -> str:
        body = ",\n".join(f"  {f!r}" for f in self._fields.values())
        return f"Unischema({self._name!r}, [\n{body}\n])"

    # -- selection ----------------------------------------------------------------------
    def create_schema_view(self, fields: Iterable[UnischemaField | str]) -> Unischema:
        """A schema with only ``fields``: fields, exact names or regular expressions (one that matches no
        field is left out with a warning, as :func:`match_unischema_fields` does; none matching gives an
        empty view, as Petastorm's).

        The order is Petastorm's: the fields given as :class:`UnischemaField` first, in the order given,
        then those that names and regexes select, in schema order (Petastorm's came out of a set, in an
        order that changed with ``PYTHONHASHSEED``)."""
        fields = list(fields)
        selected, unmatched = select_unischema_fields(self, fields)
        _warn_unmatched(self, unmatched)
        given = dict.fromkeys(f.name for f in fields if isinstance(f, UnischemaField))
        ordered = [self._fields[name] for name in given] + [f for f in selected if f.name not in given]
        return Unischema(f"{self._name}_view", ordered, attributes=self.attribute_names)

    def select(self, fields: Iterable[UnischemaField | str]) -> Unischema:
        """Alias of :meth:`create_schema_view`."""
        return self.create_schema_view(fields)

    # -- rendering ----------------------------------------------------------------------
    def as_arrow_schema(self, *, with_metadata: bool = True) -> pa.Schema:
        """The Arrow schema of the stored columns as read (encoded values), the Unischema JSON in its metadata."""
        metadata = {SCHEMA_METADATA_KEY: self.to_json().encode()} if with_metadata else None
        return pa.schema([f.arrow_field() for f in self._fields.values()], metadata=metadata)

    def as_parquet_schema(self, *, with_metadata: bool = True) -> pa.Schema:
        """The Arrow schema the Parquet files hold: :meth:`as_arrow_schema`, numeric fixed-shape
        tensors as fixed-size bytes (see :class:`~unihub.schema.codecs.TensorCodec`)."""
        arrow = self.as_arrow_schema(with_metadata=with_metadata)
        fields = []
        for f, arrow_field in zip(self._fields.values(), arrow):
            stored = parquet_tensor_type(f)
            fields.append(arrow_field if stored is None else pa.field(f.name, stored, f.nullable))
        return pa.schema(fields, metadata=arrow.metadata)

    def as_spark_schema(self):
        """A pyspark ``StructType`` of the stored columns (imports pyspark)."""
        types = require("pyspark.sql.types", extra="spark", purpose="Spark schemas")

        def spark_type(f: UnischemaField) -> Any:
            if f.codec is not None:
                return f.codec.spark_dtype(f)
            if f.shape != ():  # as Petastorm: a tensor's Spark form depends on the codec that encodes it
                raise SchemaError(f"An instance of non-scalar UnischemaField {f.name!r} has codec set to None. "
                                  f"Don't know how to guess a Spark type for it: give the field a codec "
                                  f"(NdarrayCodec(), TensorCodec(), CompressedImageCodec('png'))")
            if stored_as_text(f):  # np.bytes_: Petastorm's mapping
                return types.StringType()
            try:
                return arrow_to_spark_type(f.arrow_type())
            except SchemaError as exc:
                raise SchemaError(f"Was not able to map type {f.numpy_dtype} to a spark type (field {f.name!r}): "
                                  f"{exc}") from exc

        return types.StructType([types.StructField(f.name, spark_type(f), f.nullable) for f in self._fields.values()])

    @cached_property
    def attribute_names(self) -> dict[str, str]:
        """Field name -> the attribute of row namedtuples that holds it, distinct for every field.

        A name that is already an identifier keeps it (``a_b``). Any other (HDF5 ``group/x``,
        WebDataset ``seg.png``, ``__key__``, ``class``) is cleaned (``group_x``, ``seg_png``, ``key``,
        ``class_``); a cleaned name that another field has, or an earlier cleaned one took, gets a
        suffix (``a/b`` beside ``a_b`` -> ``a_b_2``). A view (a reader's ``schema_fields``) keeps the
        names of the schema it was cut from, so ``row.a_b_2`` is ``a/b`` whatever else is selected.
        Dicts (loaders, ``make_tf_dataset``) use the field names themselves; ``schema_fields`` accepts either.
        """
        taken = {name for name in self._fields if _is_attribute(name)}
        out: dict[str, str] = {}
        for name in self._fields:  # names inherited from the schema this one was cut from, where free
            inherited = self._inherited.get(name)
            if inherited is not None and not _is_attribute(name) and inherited not in taken:
                out[name] = inherited
                taken.add(inherited)
        for name in self._fields:
            if name in out:
                continue
            if _is_attribute(name):
                out[name] = name
                continue
            base = _field_identifier(name)
            attribute, n = base, 2
            while attribute in taken:
                attribute, n = f"{base}_{n}", n + 1
            taken.add(attribute)
            out[name] = attribute
        return {name: out[name] for name in self._fields}  # in field order: the namedtuple's order

    @cached_property
    def _namedtuple(self) -> type:
        """The row type: one attribute per field, named by :attr:`attribute_names`; its ``_asdict()``
        is keyed by the field names themselves (``{'a/b': ..., 'a_b': ...}``)."""
        name = f"{_identifier(self._name)}_row"
        base = namedtuple(name, list(self.attribute_names.values()))  # type: ignore[misc]
        if all(attribute == field for field, attribute in self.attribute_names.items()):
            return base
        names = tuple(self._fields)

        def as_dict(row: Any) -> dict[str, Any]:
            return dict(zip(names, row))

        return type(name, (base,), {"__slots__": (), "_asdict": as_dict, "field_names": names})

    def _get_namedtuple(self) -> type:
        """The namedtuple type rows of this schema are returned as (Petastorm's name)."""
        return self._namedtuple

    @property
    def namedtuple(self) -> type:
        return self._namedtuple

    def make_namedtuple(self, **values: Any) -> Any:
        """A row namedtuple from keyword values; missing nullable fields become None."""
        return self._namedtuple(*(values.get(name) for name in self._fields))

    def tf_dtypes(self) -> dict[str, Any]:
        """Field name -> ``tf.DType`` (strings and decimals as ``tf.string``)."""
        return {f.name: tf_dtype(f) for f in self._fields.values()}

    def as_tf_specs(self) -> dict[str, Any]:
        """Field name -> ``tf.TensorSpec`` with ``None`` dims kept ``None``."""
        return {f.name: tf_spec(f) for f in self._fields.values()}

    def make_namedtuple_tf(self, *args: Any, **kwargs: Any) -> Any:
        return self._namedtuple(*args, **kwargs)

    def torch_dtypes(self) -> dict[str, Any]:
        """Field name -> ``torch.dtype`` (None where torch has no dtype, e.g. strings)."""
        return {f.name: torch_dtype(f) for f in self._fields.values()}

    def numpy_dtypes(self) -> dict[str, np.dtype]:
        return {f.name: f.dtype for f in self._fields.values()}

    # -- validation ----------------------------------------------------------------------
    def validate(self, row: Mapping[str, Any], *, row_index: int | None = None) -> None:
        """Check one row (a mapping); unknown keys and missing non-nullable fields are errors."""
        unknown = set(row) - set(self._fields)
        if unknown:
            where = f" in row {row_index}" if row_index is not None else ""
            raise ValidationError(f"fields {sorted(unknown)}{where} are not in Unischema {self._name!r}; "
                                  f"its fields are {list(self._fields)}", field=sorted(unknown)[0], row=row_index)
        for field in self._fields.values():
            field.validate(row.get(field.name), row=row_index)

    # -- JSON -------------------------------------------------------------------------------
    def to_json(self) -> str:
        """The versioned JSON form stored in dataset metadata."""
        return json.dumps({
            "format": "unihub.unischema",
            "version": SCHEMA_JSON_VERSION,
            "name": self._name,
            "fields": [f.to_json() for f in self._fields.values()],
        }, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Unischema:
        """Read :meth:`to_json` output, checked against its one description
        (:data:`~unihub.schema.metadata_json.UNISCHEMA_JSON_SCHEMA`): anything else, an unknown
        version included, is a :class:`SchemaError` saying where in the document it is wrong."""
        try:
            data = parse_json(text)
        except SchemaError as exc:
            raise SchemaError(f"Unischema metadata is {exc}") from None
        if not isinstance(data, dict) or data.get("format") != "unihub.unischema":
            raise SchemaError("metadata is not a unihub Unischema (no 'format': 'unihub.unischema')")
        version = data.get("version")
        if version != SCHEMA_JSON_VERSION or type(version) is not int:
            raise SchemaError(f"Unischema JSON version {version!r} is not supported by this unihub "
                              f"(it reads version {SCHEMA_JSON_VERSION}); upgrade unihub")
        try:
            check(data, UNISCHEMA_JSON_SCHEMA)
        except SchemaError as exc:
            raise SchemaError(f"Unischema JSON {exc}") from None
        codecs: dict[Any, Codec] = {}
        return cls(data.get("name", "unnamed"), [
            UnischemaField._from_checked_json(f, codecs, f"Unischema JSON $.fields[{i}] (field {f['name']!r})")
            for i, f in enumerate(data["fields"])])

    # -- inference ---------------------------------------------------------------------------
    @classmethod
    def from_arrow_schema(cls, parquet_dataset: Any, omit_unsupported_fields: bool = True, *,
                          name: str = "inferred") -> Unischema:
        """Infer a Unischema from a plain Arrow/Parquet schema (native types, lists, tensors).

        ``parquet_dataset`` (Petastorm's name): a ``pa.Schema``, or what carries one: a ``pq.ParquetDataset``
        (Petastorm's argument; its partition columns included), a ``pq.ParquetFile``, a ``pa.Table``.
        A column with no Unischema equivalent (a map, a struct) is left out with a ``UserWarning`` naming it,
        as Petastorm warned, or refused with ``omit_unsupported_fields=False``."""
        schema = _arrow_schema_of(parquet_dataset)
        fields, omitted = [], []
        for arrow_field in schema:
            field = infer_field(arrow_field)
            if field is None:
                if omit_unsupported_fields:
                    omitted.append(f"{arrow_field.name!r} ({arrow_field.type})")
                    continue
                raise SchemaError(f"Cannot auto-create unischema due to unsupported column type: column "
                                  f"{arrow_field.name!r} of Arrow type {arrow_field.type} has no Unischema equivalent")
            fields.append(field)
        if omitted:
            warnings.warn(f"left out of the inferred schema, no Unischema equivalent: column{'s' * (len(omitted) > 1)} "
                          f"{', '.join(omitted)} (read such columns with pyarrow, or store them as lists or scalars)",
                          UserWarning, stacklevel=2)
        return cls(name, fields)


def _arrow_schema_of(value: Any) -> pa.Schema:
    """The Arrow schema of a schema, dataset, file or table (see :meth:`Unischema.from_arrow_schema`)."""
    if isinstance(value, pa.Schema):
        return value
    for attribute in ("schema_arrow", "schema"):  # pq.ParquetFile's .schema is a Parquet schema
        candidate = getattr(value, attribute, None)
        if isinstance(candidate, pa.Schema):
            return candidate
    legacy = _legacy_dataset_schema(value)
    if legacy is not None:
        return legacy
    raise InvalidArgumentError(f"expected a pyarrow Schema, ParquetDataset, ParquetFile or Table, "
                               f"got {type(value).__name__}")


def _legacy_dataset_schema(value: Any) -> pa.Schema | None:
    """The schema of a dataset object of pyarrow's legacy ``ParquetDataset`` API (pyarrow < 15, which
    Petastorm's code was written against: ``pieces[0].get_metadata().schema.to_arrow_schema()``, partition
    sets with ``name`` and ``dictionary``), partition columns first as Petastorm put them; None for others."""
    try:
        schema = value.pieces[0].get_metadata().schema.to_arrow_schema()
        partitions = [pa.field(partition.name, partition.dictionary.type) for partition in value.partitions or []]
    except (AttributeError, IndexError, TypeError):
        return None
    if not isinstance(schema, pa.Schema):
        return None
    return pa.schema(partitions + [field for field in schema if field.name not in {p.name for p in partitions}])


def match_unischema_fields(schema: Unischema, field_regex: Iterable[UnischemaField | str]) -> list[UnischemaField]:
    """Fields of ``schema`` named by ``field_regex`` (Petastorm's name): fields, exact names or full-match
    regexes, in schema order.

    A pattern that matches no field is left out, as Petastorm left it out, with a warning that names
    it and the available fields (Petastorm said nothing); :func:`select_unischema_fields` tells the
    caller which patterns matched nothing, for a reader or a copy to refuse. Where Petastorm's old
    prefix matching (``re.match``) would have chosen other fields than the full match, a warning
    names them, in Petastorm's words.
    """
    fields, unmatched = select_unischema_fields(schema, field_regex)
    _warn_unmatched(schema, unmatched)
    return fields


def _warn_unmatched(schema: Unischema, unmatched: list[str]) -> None:
    """The warning for patterns left out because they match no field (at the caller's caller)."""
    if unmatched:
        warnings.warn(f"{unmatched} match no field of Unischema {schema.name!r} (by name, or as a regex matching "
                      f"the whole name) and are left out; fields: {list(schema.fields)}", UserWarning, stacklevel=3)


def select_unischema_fields(schema: Unischema, patterns: Iterable[UnischemaField | str]
                            ) -> tuple[list[UnischemaField], list[str]]:
    """(the fields of ``schema`` that ``patterns`` name, in schema order; the patterns that name none).

    A pattern is a field (which must belong to ``schema``), an exact name, a row attribute name, or a
    regular expression matching a whole name; anything else, a field of another schema or an invalid
    regex is a :class:`~unihub.errors.SchemaError`.
    """
    patterns = list(patterns)
    _warn_if_prefix_match_differs(schema, [p for p in patterns if isinstance(p, str)])
    wanted: set[str] = set()
    unmatched: list[str] = []
    by_attribute = {attribute: name for name, attribute in schema.attribute_names.items()}
    for pattern in patterns:
        if isinstance(pattern, UnischemaField):
            if pattern.name not in schema:
                raise SchemaError(f"field {pattern.name!r} does not belong to the schema {schema.name!r}; "
                                  f"fields: {list(schema.fields)}")
            wanted.add(pattern.name)
            continue
        if not isinstance(pattern, str):
            raise SchemaError(f'Elements of "fields" must be either a string (regular expressions) or an instance '
                              f"of UnischemaField class: select fields by UnischemaField, name or regex, not "
                              f"{pattern!r}")
        if pattern in schema:
            wanted.add(pattern)
            continue
        if pattern in by_attribute:  # a row's attribute name for a field named otherwise (``group_x``)
            wanted.add(by_attribute[pattern])
            continue
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise SchemaError(f"{pattern!r} is neither a field of {schema.name!r} nor a valid regex: {exc}") from exc
        matched = [name for name in schema.fields if regex.fullmatch(name)]
        if not matched:
            unmatched.append(pattern)
        wanted.update(matched)
    return [f for name, f in schema.fields.items() if name in wanted], unmatched


def _warn_if_prefix_match_differs(schema: Unischema, patterns: list[str]) -> None:
    """Petastorm's warning where a pattern's full match picks other fields than its old prefix match."""
    full: set[str] = set()
    prefix: set[str] = set()
    for pattern in patterns:
        try:
            regex = re.compile(pattern)
        except re.error:
            continue  # an exact name that is no regex: match_unischema_fields judges it
        full.update(name for name in schema.fields if name == pattern or regex.fullmatch(name))
        prefix.update(name for name in schema.fields if name == pattern or regex.match(name))
    if full != prefix:
        warnings.warn("schema_fields behavior has changed. Now, regular expression pattern must match the entire "
                      "field name. The change in the behavior affects the following fields: "
                      f"{', '.join(sorted(full ^ prefix))}", UserWarning, stacklevel=4)


def insert_explicit_nulls(unischema: Unischema, row_dict: dict[str, Any]) -> None:
    """Add the nullable fields that ``row_dict`` lacks, as None, in place (Petastorm's function of this
    name); a missing field that is not nullable is a :class:`~unihub.errors.ValidationError` naming it."""
    for name, field in unischema.fields.items():
        if name not in row_dict:
            if not field.nullable:
                raise ValidationError(f"Field {name} is not found in the row_dict, but is not nullable "
                                      f"(Unischema {unischema.name!r})", field=name)
            row_dict[name] = None


def decode_row(row: Mapping[str, Any], schema: Unischema) -> dict[str, Any]:
    """The values of ``row`` (a dict of stored values, e.g. a Spark ``Row.asDict()`` of a dataset's Parquet) decoded
    by their fields' codecs (Petastorm's ``petastorm.utils.decode_row``): a field without one whose dtype is a numpy
    scalar or ``Decimal`` cast to it, text as ``numpy.str_``, None kept, names ``schema`` lacks left out; a value
    that cannot be decoded is a :class:`~unihub.errors.DecodeFieldError` naming its field."""
    decoded: dict[str, Any] = {}
    for name, value in row.items():
        field = schema.fields.get(str(name))
        if field is None:
            continue
        try:
            if value is None:
                decoded[field.name] = None
            elif field.codec is not None:
                value = field.codec.decode(field, value)
                # Petastorm's scalar codec gave numpy_dtype(value): numpy.str_ for text, as its readers do
                decoded[field.name] = np.str_(value) if field.numpy_dtype is np.str_ and type(value) is str else value
            elif isinstance(field.numpy_dtype, type) and issubclass(field.numpy_dtype, (np.generic, decimal.Decimal)):
                decoded[field.name] = field.numpy_dtype(value)
            else:
                decoded[field.name] = value
        except Exception as exc:  # any codec's failure, as Petastorm wrapped it
            raise DecodeFieldError(f'Decoding field "{field.name}" failed: {exc!s:.300}') from exc
    return decoded


def _identifier(name: str) -> str:
    cleaned = re.sub(r"\W", "_", name) or "Unischema"
    return cleaned if not cleaned[0].isdigit() else f"_{cleaned}"


def _is_attribute(name: str) -> bool:
    """True when ``name`` can be a namedtuple attribute as it is."""
    return name.isidentifier() and not name.startswith("_") and not keyword.iskeyword(name)


def _field_identifier(name: str) -> str:
    """A namedtuple-safe attribute name: ``group/x`` -> ``group_x``, ``__key__`` -> ``key``, ``1x`` -> ``x1x``,
    ``class`` -> ``class_``."""
    cleaned = re.sub(r"\W", "_", name).strip("_") or "field"
    cleaned = cleaned if not cleaned[0].isdigit() else f"x{cleaned}"
    return f"{cleaned}_" if keyword.iskeyword(cleaned) else cleaned


# -- inferring fields from a plain Arrow/Parquet schema (Unischema.from_arrow_schema) -----------------------
# Native scalars become ScalarCodec fields; ``fixed_shape_tensor``, fixed-size and variable lists of numbers
# become TensorCodec fields (``None`` for dims that vary); lists of strings/bytes keep codec ``None`` and
# decode as lists; other structs, maps and unions have no tensor equivalent and are skipped (or refused).
def _is_scalar(arrow_type: pa.DataType) -> bool:
    return not pa.types.is_nested(arrow_type) and not isinstance(arrow_type, pa.BaseExtensionType) \
        and not pa.types.is_null(arrow_type)


def _list_shape(arrow_type: pa.DataType) -> tuple[tuple[int | None, ...], pa.DataType] | None:
    """``(shape, value_type)`` of (nested) list types, or None if not a list of scalars."""
    shape: list[int | None] = []
    while True:
        if pa.types.is_fixed_size_list(arrow_type):
            shape.append(arrow_type.list_size)
        elif pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_list_view(arrow_type):
            shape.append(None)
        else:
            break
        arrow_type = arrow_type.value_type
    return (tuple(shape), arrow_type) if shape and _is_scalar(arrow_type) else None


def infer_field(arrow_field: pa.Field) -> UnischemaField | None:
    """The Unischema field for one Arrow field, or None when there is none."""
    arrow_type = arrow_field.type
    name, nullable = arrow_field.name, arrow_field.nullable
    try:
        if isinstance(arrow_type, pa.FixedShapeTensorType):
            return UnischemaField(name, dtypes.arrow_to_numpy_dtype(arrow_type.value_type),
                                  tuple(arrow_type.shape), TensorCodec(), nullable)
        if pa.types.is_dictionary(arrow_type):
            arrow_type = arrow_type.value_type
        if _is_scalar(arrow_type):
            return UnischemaField(name, dtypes.arrow_to_numpy_dtype(arrow_type), (), ScalarCodec(arrow_type), nullable)
        if pa.types.is_struct(arrow_type) and {f.name for f in arrow_type} == {"data", "shape"}:
            data_shape = _list_shape(arrow_type.field("data").type)
            shape_type = arrow_type.field("shape").type
            if data_shape and pa.types.is_fixed_size_list(shape_type):
                value_dtype = dtypes.arrow_to_numpy_dtype(data_shape[1])
                return UnischemaField(name, value_dtype, (None,) * shape_type.list_size, TensorCodec(), nullable)
        listed = _list_shape(arrow_type)
        if listed is not None:
            shape, value_type = listed
            dtype = dtypes.arrow_to_numpy_dtype(value_type)
            codec = TensorCodec() if dtypes.is_numeric(dtype) else None
            return UnischemaField(name, dtype, shape, codec, nullable)
    except SchemaError:
        return None
    return None
