"""Reading the Unischema that Petastorm pickled into a dataset's metadata, without running it.

What Petastorm stores
---------------------
``petastorm.etl.dataset_metadata.materialize_dataset`` writes two entries into the
key-value metadata of a dataset's ``_common_metadata`` Parquet file:

* :data:`PETASTORM_UNISCHEMA_KEY` (``dataset-toolkit.unischema.v1``): ``pickle.dumps`` of
  the ``petastorm.unischema.Unischema``. The pickle references, by module and name,
  ``Unischema`` and ``UnischemaField`` (a namedtuple), ``collections.OrderedDict`` (the
  ``_fields`` map), numpy scalar types (``numpy.int64``, ``numpy.str_``, ...) or
  ``decimal.Decimal`` as field dtypes, the codec classes of ``petastorm.codecs`` and, inside
  ``ScalarCodec``, a ``pyspark.sql.types`` instance (``LongType()``, ``DecimalType(10, 2)``...).
  Python 2 writers used protocol 0, which adds ``copy_reg._reconstructor`` and
  ``__builtin__.object`` / ``__builtin__.tuple``, and ``cPickle`` numbered the memo from 1
  (every dataset of Petastorm 0.4.0-0.7.6 that Petastorm keeps for its legacy tests was written
  so; ``tests/fixtures/petastorm_legacy``); very old datasets name the package
  ``av.ml.dataset_toolkit`` or ``av.experimental.deepdrive.dataset_toolkit``.
* :data:`PETASTORM_ROW_GROUPS_KEY` (``dataset-toolkit.num_row_groups_per_file.v1``): JSON,
  ``{relative file path: number of row groups}``; no pickle involved.

``petastorm.etl.rowgroup_indexing.build_rowgroup_index`` adds a third:

* :data:`PETASTORM_ROWGROUPS_INDEX_KEY` (``dataset-toolkit.rowgroups_index.v1``): ``pickle.dumps``
  of ``{index name: indexer}``, each a ``petastorm.etl.rowgroup_indexers.SingleFieldIndexer``
  (state ``_index_data``: a ``collections.defaultdict(builtins.set)`` of value -> row-group
  numbers; values are numpy scalars, ``str`` or ``decimal.Decimal``) or ``FieldNotNullIndexer``
  (``_index_data``: a set). :mod:`unihub.readers.rowgroup_index` converts the stand-ins.

Why the allow-list is exact
---------------------------
Unpickling calls whatever callables the pickle names, so a dataset downloaded from
anywhere could run ``os.system`` the moment its schema is read. Petastorm's own guard
allowed whole packages (``builtins``, ``numpy``, ``pyspark`` ...), which still lets a pickle
reach ``builtins.eval`` or ``numpy.load``. Here :class:`_SafeUnpickler` resolves a global
only if its exact ``(module, name)`` pair is in :data:`ALLOWED_GLOBALS`, and every entry
maps to something inert: an empty record class (:class:`StandIn`) that only stores its
constructor arguments and pickled state, ``collections.OrderedDict``, a small local function
that validates its arguments (``copyreg._reconstructor``), or, for numpy scalar types and
``decimal.Decimal``, a tag that refuses to be called (``numpy.bytes_(2**40)`` would allocate
a terabyte) and is swapped for the real type once unpickling is over. Nothing from
``petastorm``, ``pyspark`` or ``numpy`` is imported or called. Any other global, a persistent
id, an extension-registry opcode, or pickled state applied to an allowed global raises
:class:`UnsafeMetadataError` before it can do anything. Before unpickling,
:func:`unihub.petastorm.pickle_scan.scan_pickle` also refuses resource bombs (a huge memo index,
deep nesting, values shared until hashing or printing them takes exponential time), and error
messages show pickled values through :func:`brief`, which is bounded whatever the graph. The stand-ins are then converted
to unihub's own :class:`~unihub.schema.unischema.Unischema` by :func:`load_petastorm_unischema`.
"""

from __future__ import annotations

import collections
import contextlib
import decimal
import io
import itertools
import pickle
import re
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa

from unihub.errors import PetastormMetadataError, SchemaError, UnsafeMetadataError
from unihub.petastorm.pickle_scan import DEFAULT_LIMITS, PickleLimits, refusal, scan_pickle
from unihub.schema.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
from unihub.schema.unischema import Unischema, UnischemaField

if TYPE_CHECKING:
    from unihub.schema.codecs import Codec
    from unihub.schema.unischema import Unischema, UnischemaField

__all__ = [
    "ALLOWED_GLOBALS",
    "SPARK_TYPES",
    "NumpyDtype",
    "NumpyScalar",
    "PetastormCompressedImageCodec",
    "PetastormCompressedNdarrayCodec",
    "PetastormNdarrayCodec",
    "PetastormScalarCodec",
    "PetastormUnischema",
    "PetastormUnischemaField",
    "SparkDataType",
    "StandIn",
    "convert_unischema",
    "spark_to_arrow_type",
    "PETASTORM_ROW_GROUPS_KEY",
    "PETASTORM_ROWGROUPS_INDEX_KEY",
    "PetastormFieldNotNullIndexer",
    "PetastormSingleFieldIndexer",
    "PETASTORM_UNISCHEMA_KEY",
    "PetastormMetadataError",
    "UnsafeMetadataError",
    "brief",
    "load_petastorm_unischema",
    "safe_unpickle",
]

#: Key of the pickled ``petastorm.unischema.Unischema`` in ``_common_metadata``.
PETASTORM_UNISCHEMA_KEY = b"dataset-toolkit.unischema.v1"
#: Key of the JSON ``{file: number of row groups}`` map in ``_common_metadata``.
PETASTORM_ROW_GROUPS_KEY = b"dataset-toolkit.num_row_groups_per_file.v1"
#: Key of the pickled ``{index name: indexer}`` that Petastorm's ``build_rowgroup_index`` writes.
PETASTORM_ROWGROUPS_INDEX_KEY = b"dataset-toolkit.rowgroups_index.v1"


_refusal = refusal


# --------------------------------------------------------------------------------------------
# Bounded descriptions of pickled content, for error messages
# --------------------------------------------------------------------------------------------

_BRIEF_ITEMS = 4
_BRIEF_LEVELS = 3
_BRIEF_CHARS = 160
_BRIEF_ATOMS = (bool, float, complex, type(None), decimal.Decimal, type, np.generic, np.dtype)


def brief(obj: Any) -> str:
    """``repr`` of unpickled content for an error message: at most 160 characters, in bounded time.

    A plain ``repr`` of a pickled graph can be exponential in the pickle's size (a shared value is
    printed once per reference); this one shows four items per container, three levels deep.
    """
    text = _brief(obj, _BRIEF_LEVELS)
    return text if len(text) <= _BRIEF_CHARS else text[:_BRIEF_CHARS - 3] + "..."


def _brief_items(items: Any, level: int) -> str:
    shown = [_brief(item, level - 1) for item in itertools.islice(items, _BRIEF_ITEMS + 1)]
    return ", ".join(shown[:_BRIEF_ITEMS] + (["..."] if len(shown) > _BRIEF_ITEMS else []))


def _brief(obj: Any, level: int) -> str:
    atom = _brief_atom(obj)
    if atom is not None:
        return atom
    name = type(obj).__name__
    if isinstance(obj, StandIn):
        name = obj.petastorm_name
    elif not isinstance(obj, (tuple, list, dict, set, frozenset)):
        return f"<{name}>"
    if level <= 0:
        return f"<{name}>"
    if isinstance(obj, StandIn):
        parts = [_brief_items(obj.args, level)] if obj.args else []
        parts += [f"{k}={_brief(v, level - 1)}" for k, v in itertools.islice(obj.kwargs.items(), _BRIEF_ITEMS)]
        parts += [f"state={_brief(obj.state, level - 1)}"] if obj.state is not None else []
        return f"<{name}({', '.join(parts)})>"
    if isinstance(obj, dict):
        return _brief_dict(obj, name, level)
    inner = _brief_items(obj, level)
    if isinstance(obj, list):
        return f"[{inner}]"
    if isinstance(obj, tuple):
        return f"({inner},)" if len(obj) == 1 else f"({inner})"
    return f"{name}({{{inner}}})" if obj else f"{name}()"


def _brief_atom(obj: Any) -> str | None:
    """:func:`brief` of a string, bytes, number or other value shown whole (truncated); None for the rest."""
    if isinstance(obj, (str, bytes, bytearray)):
        return repr(obj[:60]) + ("..." if len(obj) > 60 else "")
    if isinstance(obj, int) and not isinstance(obj, bool):
        return repr(obj) if obj.bit_length() <= 128 else f"<int of {obj.bit_length()} bits>"
    if isinstance(obj, (_Inert, *_BRIEF_ATOMS)):
        return repr(obj)[:_BRIEF_CHARS]
    return None


def _brief_dict(obj: dict[Any, Any], name: str, level: int) -> str:
    """:func:`brief` of a dict (a subclass named around it): its first pairs."""
    pairs = (f"{_brief(k, level - 1)}: {_brief(v, level - 1)}" for k, v in obj.items())
    shown = list(itertools.islice(pairs, _BRIEF_ITEMS + 1))
    text = "{" + ", ".join(shown[:_BRIEF_ITEMS] + (["..."] if len(shown) > _BRIEF_ITEMS else [])) + "}"
    return text if type(obj) is dict else f"{name}({text})"


# --------------------------------------------------------------------------------------------
# Stand-ins
# --------------------------------------------------------------------------------------------


class StandIn:
    """An inert record of a pickled object: the constructor arguments and state, no behaviour.

    ``REDUCE``/``NEWOBJ`` land in ``__new__`` (arguments are stored, nothing else happens) and
    ``BUILD`` lands in ``__setstate__`` (the state is stored as one attribute, so a pickle
    cannot set arbitrary attributes). ``petastorm_name`` is the global it stands in for.
    """

    __slots__ = ("args", "kwargs", "state")
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    state: Any
    petastorm_name: ClassVar[str] = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> StandIn:
        self = object.__new__(cls)
        self.args = args
        self.kwargs = kwargs
        self.state = None
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        """The ``__dict__`` part of the pickled state (``{}`` when there is none)."""
        state = self.state
        if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state)
            state = state[0]
        if state is None:
            return {}
        if not isinstance(state, Mapping):
            raise PetastormMetadataError(f"pickled {self.petastorm_name} has state {brief(state)}, expected a dict")
        return dict(state)

    def __repr__(self) -> str:
        return brief(self)


class PetastormUnischema(StandIn):
    """Stand-in for ``petastorm.unischema.Unischema``: state ``{'_name', '_fields', ...}``."""

    __slots__ = ()
    petastorm_name = "petastorm.unischema.Unischema"

    @property
    def name(self) -> Any:
        return self.state_dict().get("_name")

    @property
    def fields(self) -> Any:
        return self.state_dict().get("_fields")


class PetastormUnischemaField(StandIn):
    """Stand-in for the ``petastorm.unischema.UnischemaField`` namedtuple.

    Its arguments are ``(name, numpy_dtype, shape, codec=None, nullable=False)``; Petastorm
    versions before ``nullable`` existed pickle four.
    """

    __slots__ = ()
    petastorm_name = "petastorm.unischema.UnischemaField"
    _names: ClassVar[tuple[str, ...]] = ("name", "numpy_dtype", "shape", "codec", "nullable")
    _defaults: ClassVar[dict[str, Any]] = {"codec": None, "nullable": False}

    def _get(self, key: str) -> Any:
        index = self._names.index(key)
        if index < len(self.args):
            return self.args[index]
        if key in self.kwargs:
            return self.kwargs[key]
        if key in self._defaults:
            return self._defaults[key]
        raise PetastormMetadataError(f"pickled UnischemaField {brief(self.args)} has no {key!r}")

    name = property(lambda self: self._get("name"))
    numpy_dtype = property(lambda self: self._get("numpy_dtype"))
    shape = property(lambda self: self._get("shape"))
    codec = property(lambda self: self._get("codec"))
    nullable = property(lambda self: self._get("nullable"))


class PetastormCodec(StandIn):
    """Base of the ``petastorm.codecs`` stand-ins; the codec's settings are in ``state``."""

    __slots__ = ()


class PetastormScalarCodec(PetastormCodec):
    """``petastorm.codecs.ScalarCodec``: state ``{'_spark_type': <SparkDataType>}``."""

    __slots__ = ()
    petastorm_name = "petastorm.codecs.ScalarCodec"


class PetastormCompressedImageCodec(PetastormCodec):
    """``petastorm.codecs.CompressedImageCodec``: state ``{'_image_codec': '.png', '_quality': 80}``."""

    __slots__ = ()
    petastorm_name = "petastorm.codecs.CompressedImageCodec"


class PetastormNdarrayCodec(PetastormCodec):
    """``petastorm.codecs.NdarrayCodec`` (``np.save`` bytes); no state."""

    __slots__ = ()
    petastorm_name = "petastorm.codecs.NdarrayCodec"


class PetastormCompressedNdarrayCodec(PetastormCodec):
    """``petastorm.codecs.CompressedNdarrayCodec`` (``np.savez_compressed`` bytes); no state."""

    __slots__ = ()
    petastorm_name = "petastorm.codecs.CompressedNdarrayCodec"


class SparkDataType(StandIn):
    """Base of the ``pyspark.sql.types`` stand-ins; ``spark_name`` is e.g. ``'DecimalType'``."""

    __slots__ = ()
    spark_name: ClassVar[str] = ""


#: Spark types a ScalarCodec may carry; each gets its own SparkDataType subclass.
_SPARK_TYPE_NAMES = (
    "BooleanType", "ByteType", "ShortType", "IntegerType", "LongType", "FloatType", "DoubleType",
    "StringType", "CharType", "VarcharType", "BinaryType", "DecimalType", "DateType",
    "TimestampType", "TimestampNTZType", "ArrayType",
)
SPARK_TYPES: dict[str, type[SparkDataType]] = {
    name: type(name, (SparkDataType,), {
        "__slots__": (), "spark_name": name, "petastorm_name": f"pyspark.sql.types.{name}",
        "__module__": __name__, "__qualname__": f"SparkDataType.{name}",
    })
    for name in _SPARK_TYPE_NAMES
}


class NumpyDtype(StandIn):
    """Stand-in for ``numpy.dtype``: pickled as ``dtype('f4', False, True)`` + a state tuple."""

    __slots__ = ()
    petastorm_name = "numpy.dtype"
    _CODE = re.compile(r"[?bBhHiIlLqQpPefdgFDGSUa]|[biufcSUa]\d{1,6}|[Mm]8(\[\w{1,10}\])?")

    def to_numpy(self) -> np.dtype:
        """The real ``np.dtype``; only plain numeric, bool, string, bytes and datetime dtypes."""
        code = self.args[0] if self.args else None
        if not isinstance(code, str) or not self._CODE.fullmatch(code):
            raise PetastormMetadataError(f"unsupported pickled numpy dtype {brief(code)}")
        try:  # the pattern admits sizes and units numpy has not ('i3', 'c5', 'M8[xx]')
            dtype = np.dtype(code)
        except TypeError:
            raise PetastormMetadataError(f"unsupported pickled numpy dtype {brief(code)}") from None
        state = self.state
        if isinstance(state, tuple) and len(state) > 1 and state[1] in ("<", ">") and dtype.itemsize > 1:
            dtype = dtype.newbyteorder(state[1])
        if dtype.kind in "Mm" and code in ("M8", "m8") and isinstance(state, tuple) and len(state) > 8:
            dtype = self._with_unit(dtype, state[8])  # the unit: state[8] is (None, (b'D', 1, 1, 1))
        return dtype

    _UNITS = frozenset({"Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs", "as"})

    @classmethod
    def _with_unit(cls, dtype: np.dtype, metadata: Any) -> np.dtype:
        if isinstance(metadata, tuple) and len(metadata) == 2 and isinstance(metadata[1], tuple):
            metadata = metadata[1]  # (dtype metadata, (unit, count, 1, 1))
        if not (isinstance(metadata, tuple) and len(metadata) >= 2):
            return dtype
        unit, count = metadata[0], metadata[1]
        unit = unit.decode("ascii", "replace") if isinstance(unit, bytes) else unit
        if unit not in cls._UNITS or isinstance(count, bool) or not isinstance(count, int) or not 0 < count < 2**31:
            raise PetastormMetadataError(f"unsupported pickled datetime unit {brief(metadata)}")
        return np.dtype(f"{dtype.str[:-1]}8[{count if count > 1 else ''}{unit}]")


class PetastormSingleFieldIndexer(StandIn):
    """``petastorm.etl.rowgroup_indexers.SingleFieldIndexer``: state ``{'_index_name', '_column_name',
    '_index_data': {value: set of row groups}}``."""

    __slots__ = ()
    petastorm_name = "petastorm.etl.rowgroup_indexers.SingleFieldIndexer"


class PetastormFieldNotNullIndexer(StandIn):
    """``petastorm.etl.rowgroup_indexers.FieldNotNullIndexer``: ``_index_data`` is a set of row groups."""

    __slots__ = ()
    petastorm_name = "petastorm.etl.rowgroup_indexers.FieldNotNullIndexer"


class NumpyScalar(StandIn):
    """Stand-in for ``numpy.core.multiarray.scalar(dtype, raw_bytes)``, e.g. an ``np.int64`` in a shape."""

    __slots__ = ()
    petastorm_name = "numpy.core.multiarray.scalar"

    def to_python(self) -> Any:
        """The value as a Python ``int``/``float``/``bool``/``str``/``bytes``."""
        return self.to_numpy().item()

    def to_numpy(self) -> np.generic:
        """The value as a numpy scalar (``np.datetime64`` keeps its unit, which ``item()`` may lose)."""
        if len(self.args) != 2 or not isinstance(self.args[0], NumpyDtype):
            raise PetastormMetadataError(f"malformed pickled numpy scalar {self!r}")
        dtype = self.args[0].to_numpy()
        data = self.args[1]
        if isinstance(data, str):  # Python 2 str, decoded as latin-1 by the unpickler
            data = data.encode("latin-1")
        if not isinstance(data, bytes) or len(data) != dtype.itemsize:
            raise PetastormMetadataError(f"malformed pickled numpy scalar {self!r}")
        return np.frombuffer(data, dtype=dtype, count=1)[0]


class _Inert:
    """Base of the allow-list entries that are not stand-in classes: refuses ``BUILD``."""

    __slots__ = ("qualname",)

    def __init__(self, qualname: str) -> None:
        self.qualname = qualname

    def __setstate__(self, state: Any) -> None:
        raise _refusal(f"pickled state applied to '{self.qualname}'")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.qualname}>"


class _BaseMarker(_Inert):
    """``builtins.object`` / ``builtins.tuple``: only valid as the base in ``copyreg._reconstructor``."""

    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise _refusal(f"a call of '{self.qualname}' (allowed only as the base in copyreg._reconstructor)")


class _TypeTag(_Inert):
    """A numpy scalar type or ``decimal.Decimal`` while unpickling; swapped for the real type after.

    The real types are harmless as values (dtype tags) but not as callables: ``numpy.bytes_(2**40)``
    would allocate a terabyte. Petastorm pickles never call them, so calling a tag is refused.
    """

    __slots__ = ("type",)

    def __init__(self, qualname: str, type_: type) -> None:
        super().__init__(qualname)
        self.type = type_

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise _refusal(f"a call of '{self.qualname}' (allowed only as a dtype, not called)")


class _DecimalTag(_TypeTag):
    """``decimal.Decimal``: a dtype tag, and callable with one short string, as a pickled Decimal
    value is rebuilt (the values of an index on a Decimal field). Nothing else is accepted."""

    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != 1 or not isinstance(args[0], str) or len(args[0]) > 128:
            raise _refusal(f"a call of '{self.qualname}' other than with one decimal string")
        return decimal.Decimal(args[0])


class _SafeFunction(_Inert):
    """A local, argument-checking replacement for a function a pickle may call."""

    __slots__ = ("func",)

    def __init__(self, qualname: str, func: Any) -> None:
        super().__init__(qualname)
        self.func = func

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise _refusal(f"'{self.qualname}' called with keyword arguments")
        return self.func(*args)


_OBJECT = _BaseMarker("builtins.object")
_TUPLE = _BaseMarker("builtins.tuple")


def _reconstructor(cls: Any, base: Any, state: Any) -> StandIn:
    """``copyreg._reconstructor`` (protocol 0/1 pickles) restricted to stand-in classes.

    ``base`` must be ``object`` (plain classes; ``state`` is None) or ``tuple`` (namedtuples
    such as UnischemaField; ``state`` is the tuple of values).
    """
    if not (isinstance(cls, type) and issubclass(cls, StandIn) and cls.petastorm_name):
        raise _refusal(f"copyreg._reconstructor of {_global_name(cls)}")
    if base is _OBJECT and state is None:
        return cls()
    if base is _TUPLE and isinstance(state, tuple):
        return cls(*state)
    raise _refusal(f"copyreg._reconstructor of '{cls.petastorm_name}' with base {_global_name(base)}")


def _make_set(items: Any = ()) -> set[Any]:
    """``builtins.set`` as protocols 0-3 pickle a set: ``set([items])``; only from a list or tuple."""
    if not isinstance(items, (list, tuple)):
        raise _refusal(f"'builtins.set' called with {type(items).__name__}")
    return set(items)


def _defaultdict(factory: Any = None) -> dict[Any, Any]:
    """``collections.defaultdict(set)`` (an index's values) as a plain dict: nothing is called later."""
    if factory is not _SET:
        raise _refusal(f"'collections.defaultdict' with the factory {_global_name(factory)}")
    return {}


def _pyspark_restore(name: Any, fields: Any, values: Any) -> PetastormUnischemaField:
    """``pyspark.serializers._restore``: how a UnischemaField is pickled when pyspark's namedtuple
    patch was on in the writing process (pyspark < 3.4, or ``PYSPARK_ENABLE_NAMEDTUPLE_PATCH=1``),
    as in many datasets written from Spark jobs. Only that namedtuple, with its own field names."""
    names = PetastormUnischemaField._names
    if name != "UnischemaField" or not isinstance(fields, tuple) or fields not in (names, names[:4]) \
            or not isinstance(values, tuple) or len(values) != len(fields):
        raise _refusal(f"'pyspark.serializers._restore' of a namedtuple other than UnischemaField "
                       f"({brief(name)}, {brief(fields)})")
    return PetastormUnischemaField(*values)


#: ``builtins.set``: the defaultdict factory of an index, and how old protocols pickle a set
_SET = _SafeFunction("builtins.set", _make_set)


def _latin1_encode(text: Any, encoding: Any = "utf-8") -> bytes:
    """``_codecs.encode`` as Python 3 uses it to pickle ``bytes`` at protocol 2, and nothing else."""
    if isinstance(text, str) and encoding in ("latin1", "latin-1"):
        return text.encode("latin-1")
    raise _refusal(f"'_codecs.encode' with encoding {brief(encoding)}")


# --------------------------------------------------------------------------------------------
# The allow-list
# --------------------------------------------------------------------------------------------

#: numpy scalar type names found in pickles (old aliases included) -> type code.
_NUMPY_SCALAR_CODES = {
    "bool_": "?", "bool": "?", "bool8": "?",
    "int8": "i1", "int16": "i2", "int32": "i4", "int64": "i8",
    "uint8": "u1", "uint16": "u2", "uint32": "u4", "uint64": "u8",
    "byte": "b", "ubyte": "B", "short": "h", "ushort": "H", "intc": "i", "uintc": "I",
    "longlong": "q", "ulonglong": "Q",
    "float16": "f2", "float32": "f4", "float64": "f8", "half": "e", "single": "f", "double": "d",
    "float_": "d", "longdouble": "g", "float128": "g", "float96": "g",
    "complex64": "c8", "complex128": "c16", "complex_": "D", "csingle": "F", "cdouble": "D",
    "clongdouble": "G", "complex256": "G", "complex192": "G",
    "str_": "U", "unicode_": "U", "bytes_": "S", "string_": "S",
    "datetime64": "M8", "timedelta64": "m8",
}

#: Package names Petastorm had before it was open-sourced (see petastorm/etl/legacy.py).
_PETASTORM_PACKAGES = ("petastorm", "av.ml.dataset_toolkit", "av.experimental.deepdrive.dataset_toolkit")


def _build_allow_list() -> dict[tuple[str, str], Any]:
    allowed: dict[tuple[str, str], Any] = {}
    for package in _PETASTORM_PACKAGES:
        allowed[(f"{package}.unischema", "Unischema")] = PetastormUnischema
        allowed[(f"{package}.unischema", "UnischemaField")] = PetastormUnischemaField
        for codec in (PetastormScalarCodec, PetastormCompressedImageCodec, PetastormNdarrayCodec,
                      PetastormCompressedNdarrayCodec):
            allowed[(f"{package}.codecs", codec.petastorm_name.rsplit(".", 1)[1])] = codec
    for name, standin in SPARK_TYPES.items():
        allowed[("pyspark.sql.types", name)] = standin
    for name, code in _NUMPY_SCALAR_CODES.items():
        allowed[("numpy", name)] = _TypeTag(f"numpy.{name}", np.dtype(code).type)
    allowed[("numpy", "dtype")] = NumpyDtype
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "scalar")] = NumpyScalar
    allowed[("decimal", "Decimal")] = _DecimalTag("decimal.Decimal", decimal.Decimal)
    allowed[("collections", "OrderedDict")] = collections.OrderedDict
    allowed[("pyspark.serializers", "_restore")] = _SafeFunction("pyspark.serializers._restore", _pyspark_restore)
    for module in ("copyreg", "copy_reg"):
        allowed[(module, "_reconstructor")] = _SafeFunction(f"{module}._reconstructor", _reconstructor)
    for module in ("builtins", "__builtin__"):
        allowed[(module, "object")] = _OBJECT
        allowed[(module, "tuple")] = _TUPLE
    allowed[("_codecs", "encode")] = _SafeFunction("_codecs.encode", _latin1_encode)
    # row-group indexes (petastorm.etl.rowgroup_indexing), pickled without legacy package names
    for indexer in (PetastormSingleFieldIndexer, PetastormFieldNotNullIndexer):
        allowed[("petastorm.etl.rowgroup_indexers", indexer.petastorm_name.rsplit(".", 1)[1])] = indexer
    allowed[("collections", "defaultdict")] = _SafeFunction("collections.defaultdict", _defaultdict)
    for module in ("builtins", "__builtin__"):
        allowed[(module, "set")] = _SET
    return allowed


#: Every global a Petastorm pickle may reference: exact ``(module, name)`` -> inert stand-in.
ALLOWED_GLOBALS: Mapping[tuple[str, str], Any] = MappingProxyType(_build_allow_list())


def _global_name(obj: Any) -> str:
    if isinstance(obj, _Inert):
        return f"'{obj.qualname}'"
    if isinstance(obj, type) and issubclass(obj, StandIn):
        return f"'{obj.petastorm_name}'"
    if obj is collections.OrderedDict:
        return "'collections.OrderedDict'"
    return f"an object of type {type(obj).__name__}"


# --------------------------------------------------------------------------------------------
# Unpickling
# --------------------------------------------------------------------------------------------

class _SafeUnpickler(pickle.Unpickler):
    """An Unpickler that resolves only :data:`ALLOWED_GLOBALS` and has no persistent ids."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED_GLOBALS[(module, name)]
        except (KeyError, TypeError):
            raise _refusal(f"the global '{module}.{name}'") from None

    def persistent_load(self, pid: Any) -> Any:
        raise _refusal(f"the persistent id {brief(pid)}")


def _resolve_tags(obj: Any, memo: dict[int, Any]) -> Any:
    """Replace every :class:`_TypeTag` in the unpickled graph by its real type (in place where mutable)."""
    if isinstance(obj, _TypeTag):
        return obj.type
    if isinstance(obj, (str, bytes, int, float, complex, type(None))):
        return obj
    key = id(obj)
    if key in memo:
        return memo[key]
    if isinstance(obj, StandIn):
        memo[key] = obj
        obj.args = _resolve_tags(obj.args, memo)
        obj.kwargs = _resolve_tags(obj.kwargs, memo)
        obj.state = _resolve_tags(obj.state, memo)
    elif isinstance(obj, list):
        memo[key] = obj
        obj[:] = [_resolve_tags(item, memo) for item in obj]
    elif isinstance(obj, dict):  # dict and OrderedDict: keep the order
        memo[key] = obj
        items = [(_resolve_tags(k, memo), _resolve_tags(v, memo)) for k, v in obj.items()]
        obj.clear()
        obj.update(items)
    elif isinstance(obj, set):
        memo[key] = obj
        items = [_resolve_tags(item, memo) for item in obj]
        obj.clear()
        obj.update(items)
    elif isinstance(obj, (tuple, frozenset)):
        resolved = type(obj)(_resolve_tags(item, memo) for item in obj)
        memo[key] = resolved
        return resolved
    return obj


def _brief_exception(exc: BaseException) -> str:
    """``repr(exc)`` bounded: an error raised inside the unpickler may carry a pickled value (a KeyError's key)."""
    return f"{type(exc).__name__}({_brief_items(exc.args, _BRIEF_LEVELS)})"[:2 * _BRIEF_CHARS]


@contextlib.contextmanager
def _named(source: str | None) -> Iterator[None]:
    """Put ``source`` (where the pickle was read from) in front of the message of a metadata error."""
    try:
        yield
    except (UnsafeMetadataError, PetastormMetadataError) as exc:
        if source is None:
            raise
        raise type(exc)(f"{source}: {exc}") from exc


def safe_unpickle(data: bytes, *, source: str | None = None, limits: PickleLimits = DEFAULT_LIMITS) -> Any:
    """Unpickle Petastorm metadata into stand-ins (:class:`PetastormUnischema` and friends).

    Raises :class:`UnsafeMetadataError` if the pickle names anything outside
    :data:`ALLOWED_GLOBALS` or would exceed ``limits`` (memo size, opcodes, nesting, sharing;
    see :mod:`unihub.petastorm.pickle_scan`), and :class:`PetastormMetadataError` if it is
    malformed; ``source``, the file it was read from, leads their messages.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected the pickled metadata as bytes, got {type(data).__name__}")
    data = bytes(data)
    with _named(source):
        scan_pickle(data, allowed=ALLOWED_GLOBALS, limits=limits)
        try:
            # latin-1: Python 2 ``str`` objects (numpy scalar bytes, ASCII names) come back intact.
            return _resolve_tags(_SafeUnpickler(io.BytesIO(data), encoding="latin1").load(), {})
        except UnsafeMetadataError:
            raise
        except Exception as exc:
            raise PetastormMetadataError(f"could not unpickle Petastorm metadata: {_brief_exception(exc)}") from exc


# --------------------------------------------------------------------------------------------
# Conversion to unihub's classes
# --------------------------------------------------------------------------------------------

_DTYPE_TYPES = frozenset(v.type for v in ALLOWED_GLOBALS.values() if isinstance(v, _TypeTag))

_SIMPLE_SPARK_TO_ARROW = {
    "LongType": pa.int64(), "IntegerType": pa.int32(), "ShortType": pa.int16(), "ByteType": pa.int8(),
    "BooleanType": pa.bool_(), "FloatType": pa.float32(), "DoubleType": pa.float64(),
    "StringType": pa.string(), "CharType": pa.string(), "VarcharType": pa.string(),
    "BinaryType": pa.binary(), "DateType": pa.date32(),
    # Spark writes TimestampType as INT96 or TIMESTAMP_MICROS; microseconds hold both exactly.
    "TimestampType": pa.timestamp("us"), "TimestampNTZType": pa.timestamp("us"),
}


def _plain(value: Any) -> Any:
    return value.to_python() if isinstance(value, NumpyScalar) else value


def _int(value: Any, what: str) -> int:
    value = _plain(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PetastormMetadataError(f"{what} must be an int, got {brief(value)}")
    return value


def spark_to_arrow_type(spark_type: Any, *, _depth: int = 0) -> pa.DataType:
    """The pyarrow type for a pickled ``pyspark.sql.types`` stand-in."""
    if not isinstance(spark_type, SparkDataType) or _depth > 32:
        raise PetastormMetadataError(f"expected a pyspark.sql.types type in ScalarCodec, got {brief(spark_type)}")
    name = spark_type.spark_name
    if name in _SIMPLE_SPARK_TO_ARROW:
        return _SIMPLE_SPARK_TO_ARROW[name]
    state = spark_type.state_dict()
    if name == "DecimalType":
        precision = _int(state.get("precision", 10), "DecimalType precision")
        scale = _int(state.get("scale", 0), "DecimalType scale")
        try:
            return pa.decimal128(precision, scale)
        except (ValueError, OverflowError, pa.ArrowInvalid) as exc:  # OverflowError: beyond a C int
            raise PetastormMetadataError(f"invalid DecimalType({precision}, {scale})") from exc
    if name == "ArrayType":
        return pa.list_(spark_to_arrow_type(state.get("elementType"), _depth=_depth + 1))
    raise PetastormMetadataError(f"no Arrow type for Spark type {name}")  # pragma: no cover


def _convert_dtype(dtype: Any, field: str) -> Any:
    if isinstance(dtype, NumpyDtype):
        return dtype.to_numpy().type
    if isinstance(dtype, type) and dtype in _DTYPE_TYPES:
        return dtype
    raise PetastormMetadataError(f"field {brief(field)}: unsupported numpy_dtype {brief(dtype)}")


def _convert_shape(shape: Any, field: str) -> tuple[int | None, ...]:
    if not isinstance(shape, (tuple, list)):
        raise PetastormMetadataError(f"field {brief(field)}: shape must be a tuple, got {brief(shape)}")
    dims = tuple(None if d is None else _int(d, f"field {brief(field)}: a shape dimension") for d in shape)
    if any(d is not None and d < 0 for d in dims):
        raise PetastormMetadataError(f"field {brief(field)}: negative dimension in shape {brief(dims)}")
    return dims


def _convert_codec(codec: Any, field: str) -> Codec | None:
    if codec is None:
        return None
    if isinstance(codec, PetastormScalarCodec):
        return ScalarCodec(spark_to_arrow_type(codec.state_dict().get("_spark_type")))
    if isinstance(codec, PetastormCompressedImageCodec):
        state = codec.state_dict()
        image_codec = _plain(state.get("_image_codec", ".png"))
        if not isinstance(image_codec, str):
            raise PetastormMetadataError(f"field {brief(field)}: image codec {brief(image_codec)} is not a string")
        quality = _int(state.get("_quality", 80), f"field {brief(field)}: JPEG quality")
        return CompressedImageCodec(image_codec.lstrip(".").lower(), quality)
    if isinstance(codec, PetastormNdarrayCodec):
        return NdarrayCodec()
    if isinstance(codec, PetastormCompressedNdarrayCodec):
        return CompressedNdarrayCodec()
    raise PetastormMetadataError(f"field {brief(field)}: unsupported codec {brief(codec)}")


def _convert_field(field: Any) -> UnischemaField:
    if not isinstance(field, PetastormUnischemaField):
        raise PetastormMetadataError(f"expected a pickled UnischemaField, got {brief(field)}")
    name = _plain(field.name)
    if not isinstance(name, str):
        raise PetastormMetadataError(f"field name must be a string, got {brief(name)}")
    nullable = _plain(field.nullable)
    if nullable not in (True, False):  # also admits 0/1 from old pickles
        raise PetastormMetadataError(f"field {brief(name)}: nullable must be a bool, got {brief(nullable)}")
    try:
        return UnischemaField(name, _convert_dtype(field.numpy_dtype, name), _convert_shape(field.shape, name),
                              _convert_codec(field.codec, name), bool(nullable))
    except PetastormMetadataError:
        raise
    except SchemaError as exc:  # what unihub's own field or codec refuses (an image codec '\x7fjpeg')
        raise PetastormMetadataError(f"field {brief(name)}: {exc}") from None


def convert_unischema(schema: Any) -> Unischema:
    """Turn a :class:`PetastormUnischema` stand-in into a :class:`unihub.schema.unischema.Unischema`."""
    if not isinstance(schema, PetastormUnischema):
        raise PetastormMetadataError(f"expected a pickled petastorm Unischema, got {brief(schema)}")
    name = _plain(schema.name)
    if not isinstance(name, str):
        raise PetastormMetadataError(f"Unischema name must be a string, got {brief(name)}")
    fields = schema.fields
    if isinstance(fields, Mapping):
        fields = list(fields.values())
    if not isinstance(fields, (list, tuple)):
        raise PetastormMetadataError(f"Unischema {brief(name)} has no field map (got {brief(fields)})")
    return Unischema(name, [_convert_field(f) for f in fields])


def load_petastorm_unischema(data: bytes, *, source: str | None = None) -> Unischema:
    """Safely read the value stored under :data:`PETASTORM_UNISCHEMA_KEY` as a unihub Unischema.

    ``source``, the file ``data`` was read from, leads the message of any error.

    >>> import pyarrow.parquet as pq
    >>> meta = pq.read_metadata("dataset/_common_metadata").metadata
    >>> schema = load_petastorm_unischema(meta[PETASTORM_UNISCHEMA_KEY])  # doctest: +SKIP
    """
    with _named(source):
        return convert_unischema(safe_unpickle(data))
