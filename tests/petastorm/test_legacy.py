"""Safe reading of the Unischema Petastorm pickles into ``_common_metadata``."""

from __future__ import annotations

import _compat_pickle
import builtins
import collections
import decimal
import io
import os
import pickle
import pickletools
import re
import struct
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub.petastorm import legacy
from unihub.petastorm.legacy import (
    PETASTORM_ROW_GROUPS_KEY,
    PETASTORM_UNISCHEMA_KEY,
    PetastormMetadataError,
    UnsafeMetadataError,
    load_petastorm_unischema,
    safe_unpickle,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm" / "unischema" / "_common_metadata"
#: Petastorm 0.4.0's own legacy test dataset: its Unischema pickled by Python 2's cPickle at protocol 0
LEGACY_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm_legacy" / "0.4.0" / "_common_metadata"

#: (name, dtype, shape, codec kind, codec setting, nullable) of the fixture, from its README.
EXPECTED_FIELDS = [
    ("id", np.int64, (), "scalar", pa.int64(), False),
    ("split", np.str_, (), "scalar", pa.string(), False),
    ("label", np.int32, (), "scalar", pa.int32(), False),
    ("score", np.float64, (), "scalar", pa.float64(), True),
    ("image_png", np.uint8, (32, 48, 3), "image", ("png", 80), False),
    ("image_jpeg", np.uint8, (32, 48, 3), "image", ("jpeg", 90), False),
    ("gray", np.uint8, (24, 24), "image", ("png", 80), False),
    ("embedding", np.float32, (16,), "ndarray", None, False),
    ("boxes", np.float32, (None, 4), "ndarray", None, False),
    ("mask", np.uint8, (8, 8), "compressed_ndarray", None, True),
    ("temps", np.float16, (None,), "ndarray", None, True),
]


@pytest.fixture(scope="module")
def fixture_bytes() -> bytes:
    return pq.read_metadata(FIXTURE).metadata[PETASTORM_UNISCHEMA_KEY]


class _RecordingUnpickler(legacy._SafeUnpickler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: set[str] = set()

    def find_class(self, module: str, name: str) -> Any:
        self.seen.add(f"{module}.{name}")
        return super().find_class(module, name)


# ------------------------------------------------------------------------------------------
# The real fixture
# ------------------------------------------------------------------------------------------


def test_fixture_metadata_keys() -> None:
    metadata = pq.read_metadata(FIXTURE).metadata
    assert PETASTORM_UNISCHEMA_KEY in metadata
    assert PETASTORM_ROW_GROUPS_KEY in metadata


def test_fixture_references_only_expected_globals(fixture_bytes: bytes) -> None:
    unpickler = _RecordingUnpickler(io.BytesIO(fixture_bytes))
    unpickler.load()
    assert unpickler.seen == {
        "petastorm.unischema.Unischema", "petastorm.unischema.UnischemaField", "collections.OrderedDict",
        "petastorm.codecs.ScalarCodec", "petastorm.codecs.CompressedImageCodec",
        "petastorm.codecs.NdarrayCodec", "petastorm.codecs.CompressedNdarrayCodec",
        "pyspark.sql.types.LongType", "pyspark.sql.types.StringType", "pyspark.sql.types.IntegerType",
        "pyspark.sql.types.DoubleType",
        "numpy.int64", "numpy.str_", "numpy.int32", "numpy.float64", "numpy.uint8", "numpy.float32",
        "numpy.float16",
    }


def test_safe_unpickle_fixture(fixture_bytes: bytes) -> None:
    schema = safe_unpickle(fixture_bytes)
    assert isinstance(schema, legacy.PetastormUnischema)
    assert schema.name == "FixtureSchema"
    assert isinstance(schema.fields, collections.OrderedDict)
    assert list(schema.fields) == [f[0] for f in EXPECTED_FIELDS]
    for (name, dtype, shape, kind, setting, nullable), field in zip(EXPECTED_FIELDS, schema.fields.values(), strict=True):
        assert isinstance(field, legacy.PetastormUnischemaField)
        assert field.name == name
        assert field.numpy_dtype is dtype  # the real numpy scalar type
        assert field.shape == shape
        assert field.nullable is nullable
        state = field.codec.state_dict()
        if kind == "scalar":
            assert isinstance(field.codec, legacy.PetastormScalarCodec)
            assert isinstance(state["_spark_type"], legacy.SparkDataType)
            assert legacy.spark_to_arrow_type(state["_spark_type"]) == setting
        elif kind == "image":
            assert isinstance(field.codec, legacy.PetastormCompressedImageCodec)
            assert state == {"_image_codec": "." + setting[0], "_quality": setting[1]}
        elif kind == "ndarray":
            assert type(field.codec) is legacy.PetastormNdarrayCodec
        else:
            assert type(field.codec) is legacy.PetastormCompressedNdarrayCodec
    assert schema.fields["split"].codec.state_dict()["_spark_type"].spark_name == "StringType"


def test_load_petastorm_unischema_fixture(fixture_bytes: bytes) -> None:
    from unihub.schema.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
    from unihub.schema.unischema import Unischema, UnischemaField

    schema = load_petastorm_unischema(fixture_bytes)
    assert isinstance(schema, Unischema)
    assert schema.name == "FixtureSchema"
    assert list(schema.fields) == [f[0] for f in EXPECTED_FIELDS]
    for (name, dtype, shape, kind, setting, nullable), field in zip(EXPECTED_FIELDS, schema.fields.values(), strict=True):
        assert isinstance(field, UnischemaField)
        assert (field.name, field.numpy_dtype, field.shape, field.nullable) == (name, dtype, shape, nullable)
        if kind == "scalar":
            assert isinstance(field.codec, ScalarCodec)
            assert field.codec.storage_type == setting
        elif kind == "image":
            assert isinstance(field.codec, CompressedImageCodec)
            assert (field.codec.image_codec, field.codec.quality) == setting
        elif kind == "ndarray":
            assert type(field.codec) is NdarrayCodec
        else:
            assert type(field.codec) is CompressedNdarrayCodec


# ------------------------------------------------------------------------------------------
# Malicious pickles
# ------------------------------------------------------------------------------------------


class _Reduce:
    """Pickles as ``func(*args)``: what an attacker writes into the metadata."""

    def __init__(self, func: Any, args: tuple) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple:
        return self.func, self.args


def _qualname(func: Any) -> str:
    return f"{func.__module__}.{func.__name__}"


def _pickled_name(func: Any, protocol: int) -> str:
    """The global as ``pickle.dumps`` writes it: Python 2 names below protocol 3."""
    module, name = func.__module__, func.__name__
    if protocol < 3:
        module, name = _compat_pickle.REVERSE_NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.REVERSE_IMPORT_MAPPING.get(module, module)
    return f"{module}.{name}"


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    path = tmp_path / "pwned"
    yield path
    assert not path.exists(), "the pickle ran code"


def _attacks(marker: Path) -> list[tuple[Any, tuple]]:
    touch = f"touch {marker}"
    return [
        (os.system, (touch,)),
        (builtins.eval, (f"__import__('os').system({touch!r})",)),
        (builtins.exec, (f"import os; os.system({touch!r})",)),
        (builtins.getattr, ("abc", "upper")),
        (builtins.__import__, ("os",)),
        (subprocess.Popen, (["touch", str(marker)],)),
        (subprocess.check_call, (["touch", str(marker)],)),
        (np.load, (str(marker),)),
        (pickle.loads, (b"",)),
    ]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("attack", range(9))
def test_refuses_malicious_reduce(marker: Path, protocol: int, attack: int) -> None:
    func, args = _attacks(marker)[attack]
    data = pickle.dumps(_Reduce(func, args), protocol=protocol)
    with pytest.raises(UnsafeMetadataError, match="nothing from the pickle was executed") as info:
        safe_unpickle(data)
    assert f"'{_pickled_name(func, protocol)}'" in str(info.value)
    with pytest.raises(UnsafeMetadataError):
        load_petastorm_unischema(data)


def test_os_system_is_refused_as_posix_system(marker: Path) -> None:
    data = pickle.dumps(_Reduce(os.system, (f"touch {marker}",)), protocol=4)
    with pytest.raises(UnsafeMetadataError, match=r"'(posix|nt)\.system'"):
        safe_unpickle(data)


def _stack_global(module: str, name: str, arg: str) -> bytes:
    """Protocol 4: ``module.name(arg)`` via STACK_GLOBAL, the opcode only find_class can check."""

    def s(text: str) -> bytes:
        raw = text.encode()
        return b"\x8c" + bytes([len(raw)]) + raw

    return b"\x80\x04" + s(module) + s(name) + b"\x93" + s(arg) + b"\x85R."


@pytest.mark.parametrize("module, name", [
    ("subprocess", "Popen"), ("posix", "system"), ("os", "system"), ("builtins", "eval"),
    ("builtins", "getattr"), ("builtins", "__import__"), ("__builtin__", "eval"),
    ("numpy", "load"), ("numpy.core.multiarray", "_reconstruct"), ("pyspark.sql.types", "_parse_datatype_json_string"),
    ("petastorm.unischema", "Unischema.__init__"), ("collections", "namedtuple"), ("copyreg", "__newobj__"),
    ("builtins", "type"), ("builtins", "object.__subclasses__"),
])
def test_refuses_stack_global(marker: Path, module: str, name: str) -> None:
    data = _stack_global(module, name, f"touch {marker}")
    with pytest.raises(UnsafeMetadataError, match=re.escape(f"'{module}.{name}'")):
        safe_unpickle(data)


def test_find_class_alone_refuses_without_prescan(marker: Path) -> None:
    # Also with GLOBAL, which the pre-scan catches first: the Unpickler itself must hold.
    data = pickle.dumps(_Reduce(subprocess.Popen, (["touch", str(marker)],)), protocol=2)
    with pytest.raises(UnsafeMetadataError, match="'commands.Popen'"):  # its Python 2 name
        legacy._SafeUnpickler(io.BytesIO(data)).load()
    data = pickle.dumps(_Reduce(subprocess.Popen, (["touch", str(marker)],)), protocol=2, fix_imports=False)
    with pytest.raises(UnsafeMetadataError, match="'subprocess.Popen'"):
        legacy._SafeUnpickler(io.BytesIO(data)).load()


def test_refuses_reconstructor_with_disallowed_base(marker: Path) -> None:
    # copy_reg._reconstructor(<allowed class>, subprocess.Popen, "touch ...")
    data = (b"ccopy_reg\n_reconstructor\n(cpetastorm.unischema\nUnischema\ncsubprocess\nPopen\n"
            + f"S'touch {marker}'\ntR.".encode())
    with pytest.raises(UnsafeMetadataError, match="'subprocess.Popen'"):
        safe_unpickle(data)
    with pytest.raises(UnsafeMetadataError, match="'subprocess.Popen'"):
        legacy._SafeUnpickler(io.BytesIO(data)).load()


def test_refuses_reconstructor_with_allowed_but_wrong_base() -> None:
    data = b"ccopy_reg\n_reconstructor\n(cpetastorm.unischema\nUnischema\nccollections\nOrderedDict\n(ltR."
    with pytest.raises(UnsafeMetadataError, match="with base 'collections.OrderedDict'"):
        safe_unpickle(data)


def test_refuses_reconstructor_of_non_standin_class() -> None:
    data = b"ccopy_reg\n_reconstructor\n(ccollections\nOrderedDict\nc__builtin__\nobject\nNtR."
    with pytest.raises(UnsafeMetadataError, match="_reconstructor of 'collections.OrderedDict'"):
        safe_unpickle(data)


def test_refuses_calling_a_dtype() -> None:
    # numpy.bytes_(2**40) would allocate a terabyte: dtypes are values, never called.
    data = b"cnumpy\nbytes_\n(L1099511627776L\ntR."
    with pytest.raises(UnsafeMetadataError, match="'numpy.bytes_'"):
        safe_unpickle(data)


def test_refuses_calling_a_base_marker() -> None:
    with pytest.raises(UnsafeMetadataError, match="'builtins.object'"):
        safe_unpickle(b"cbuiltins\nobject\n(tR.")


def test_refuses_build_on_allowed_globals() -> None:
    with pytest.raises(UnsafeMetadataError, match="state applied to 'numpy.int64'"):
        safe_unpickle(b"cnumpy\nint64\n(dS'x'\nI1\nsb.")
    with pytest.raises(UnsafeMetadataError, match="state applied to 'copy_reg._reconstructor'"):
        safe_unpickle(b"ccopy_reg\n_reconstructor\n(dS'__defaults__'\n(I1\ntsb.")
    # BUILD on a stand-in *class* fails too and changes nothing.
    with pytest.raises(PetastormMetadataError):
        safe_unpickle(b"cpetastorm.unischema\nUnischema\n(dS'x'\nI1\nsb.")
    assert not hasattr(legacy.PetastormUnischema, "x")
    assert not hasattr(np.int64, "x")


@pytest.mark.parametrize("data", [b"Pmy-id\n.", b"\x80\x01X\x02\x00\x00\x00idQ."])
def test_refuses_persistent_ids(data: bytes) -> None:
    with pytest.raises(UnsafeMetadataError, match="PERSID"):
        safe_unpickle(data)
    with pytest.raises(UnsafeMetadataError, match="persistent id"):
        legacy._SafeUnpickler(io.BytesIO(data)).load()


@pytest.mark.parametrize("data", [b"\x80\x02\x82\x01.", b"\x80\x02\x83\x01\x00.", b"\x80\x02\x84\x01\x00\x00\x00."])
def test_refuses_extension_registry(data: bytes) -> None:
    with pytest.raises(UnsafeMetadataError, match="EXT"):
        safe_unpickle(data)


@pytest.mark.parametrize("data", [b"", b"not a pickle", b"\x80\x04\x95", b"(lp0\n", b"ccollections\nOrderedDict\n(I1\ntR."])
def test_malformed_pickles(data: bytes) -> None:
    with pytest.raises(PetastormMetadataError):
        safe_unpickle(data)


def test_message_is_a_single_string() -> None:
    err = UnsafeMetadataError("refused 'os.system'")
    assert str(err) == "refused 'os.system'"


def test_every_allowed_global_is_inert() -> None:
    for (module, name), value in legacy.ALLOWED_GLOBALS.items():
        assert "." not in name, (module, name)
        assert (value is collections.OrderedDict
                or isinstance(value, legacy._Inert)
                or (isinstance(value, type) and issubclass(value, legacy.StandIn))), (module, name, value)


RESTORE_FIXTURE = FIXTURE.parents[1] / "pyspark_restore" / "_common_metadata"


def test_fields_pickled_by_pyspark_namedtuple_patch(fixture_bytes: bytes, tmp_path: Path) -> None:
    # Written by Petastorm with pyspark's namedtuple patch on (make_pyspark_restore.py): every
    # UnischemaField is a call of pyspark.serializers._restore, as in datasets of older Spark jobs.
    import shutil

    import unihub

    data = pq.read_metadata(RESTORE_FIXTURE).metadata[PETASTORM_UNISCHEMA_KEY]
    unpickler = _RecordingUnpickler(io.BytesIO(data))
    unpickler.load()
    assert "pyspark.serializers._restore" in unpickler.seen
    assert "petastorm.unischema.UnischemaField" not in unpickler.seen
    assert load_petastorm_unischema(data) == load_petastorm_unischema(fixture_bytes)
    dataset = tmp_path / "dataset"
    shutil.copytree(FIXTURE.parent, dataset)
    shutil.copy(RESTORE_FIXTURE, dataset / "_common_metadata")
    with unihub.make_reader(str(dataset), schema_fields=["id", "embedding"], shuffle_row_groups=False) as reader:
        rows = list(reader)
    with unihub.make_reader(str(FIXTURE.parent), schema_fields=["id", "embedding"], shuffle_row_groups=False) as reader:
        assert [(r.id, r.embedding.tobytes()) for r in rows] == [(r.id, r.embedding.tobytes()) for r in reader]


@pytest.mark.parametrize("arguments", [
    b"(S'Popen'\n(S'args'\ntp0\n(S'ls'\ntp1\ntp2\n",  # another namedtuple
    b"(S'UnischemaField'\n(S'name'\nS'cmd'\ntp0\n(S'x'\nS'y'\ntp1\ntp2\n",  # other field names
    b"(S'UnischemaField'\n(S'name'\nS'numpy_dtype'\nS'shape'\nS'codec'\nS'nullable'\ntp0\n(S'x'\ntp1\ntp2\n",
])
def test_pyspark_restore_is_refused_for_anything_but_a_unischema_field(arguments: bytes) -> None:
    with pytest.raises(UnsafeMetadataError, match="_restore"):
        safe_unpickle(b"cpyspark.serializers\n_restore\n" + arguments + b"R.")


# ------------------------------------------------------------------------------------------
# Older Petastorm / Python 2 pickles, made with look-alike classes
# ------------------------------------------------------------------------------------------


def _fake_petastorm() -> dict[str, types.ModuleType]:
    """Modules whose classes pickle exactly like Petastorm's and pyspark's."""
    unischema = types.ModuleType("petastorm.unischema")
    codecs = types.ModuleType("petastorm.codecs")
    spark = types.ModuleType("pyspark.sql.types")

    class UnischemaField(NamedTuple):
        name: str
        numpy_dtype: Any
        shape: tuple
        codec: Any = None
        nullable: bool = False

    class Unischema:
        def __init__(self, name: str, fields: list) -> None:
            self._name = name
            self._fields = collections.OrderedDict((f.name, f) for f in fields)
            for f in fields:
                setattr(self, f.name, f)

    class ScalarCodec:
        def __init__(self, spark_type: Any) -> None:
            self._spark_type = spark_type

    class CompressedImageCodec:
        def __init__(self, image_codec: str = "png", quality: int = 80) -> None:
            self._image_codec = "." + image_codec
            self._quality = quality

    class NdarrayCodec:
        pass

    class CompressedNdarrayCodec:
        pass

    class DataType:
        pass

    spark_classes = {name: type(name, (DataType,), {}) for name in (
        "LongType", "IntegerType", "ShortType", "ByteType", "BooleanType", "FloatType", "DoubleType",
        "StringType", "BinaryType", "DateType", "TimestampType")}

    class DecimalType(DataType):
        def __init__(self, precision: int = 10, scale: int = 0) -> None:
            self.precision, self.scale, self.hasPrecisionInfo = precision, scale, True

    class ArrayType(DataType):
        def __init__(self, elementType: Any, containsNull: bool = True) -> None:
            self.elementType, self.containsNull = elementType, containsNull

    spark_classes.update(DecimalType=DecimalType, ArrayType=ArrayType)
    for module, classes in ((unischema, [UnischemaField, Unischema]),
                            (codecs, [ScalarCodec, CompressedImageCodec, NdarrayCodec, CompressedNdarrayCodec]),
                            (spark, list(spark_classes.values()))):
        for cls in classes:
            cls.__module__ = module.__name__
            cls.__qualname__ = cls.__name__
            setattr(module, cls.__name__, cls)
    petastorm, pyspark, pyspark_sql = (types.ModuleType(n) for n in ("petastorm", "pyspark", "pyspark.sql"))
    return {"petastorm": petastorm, "petastorm.unischema": unischema, "petastorm.codecs": codecs,
            "pyspark": pyspark, "pyspark.sql": pyspark_sql, "pyspark.sql.types": spark}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    modules = _fake_petastorm()
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    u, c, t = modules["petastorm.unischema"], modules["petastorm.codecs"], modules["pyspark.sql.types"]
    schema = u.Unischema("OldSchema", [
        u.UnischemaField("id", np.int64, (), c.ScalarCodec(t.LongType()), False),
        u.UnischemaField("price", decimal.Decimal, (), c.ScalarCodec(t.DecimalType(12, 3)), True),
        u.UnischemaField("when", np.datetime64, (), c.ScalarCodec(t.TimestampType()), False),
        u.UnischemaField("tags", np.str_, (None,), c.ScalarCodec(t.ArrayType(t.StringType())), False),
        u.UnischemaField("raw", np.bytes_, (), c.ScalarCodec(t.BinaryType()), False),
        u.UnischemaField("flag", np.bool_, (), c.ScalarCodec(t.BooleanType()), False),
        u.UnischemaField("image", np.uint8, (np.int64(32), 48, 3), c.CompressedImageCodec("jpeg", 70)),
        u.UnischemaField("tensor", np.dtype("float32"), (None, 3), c.NdarrayCodec()),
        u.UnischemaField("packed", np.int16, (4,), c.CompressedNdarrayCodec(), True),
        u.UnischemaField("no_codec", np.float64, ()),
    ])
    return types.SimpleNamespace(schema=schema, modules=modules)


def _check_old_schema(stand_in: Any) -> None:
    assert isinstance(stand_in, legacy.PetastormUnischema)
    assert stand_in.name == "OldSchema"
    fields = stand_in.fields
    assert list(fields) == ["id", "price", "when", "tags", "raw", "flag", "image", "tensor", "packed", "no_codec"]
    assert fields["price"].numpy_dtype is decimal.Decimal
    assert fields["raw"].numpy_dtype is np.bytes_
    assert isinstance(fields["tensor"].numpy_dtype, legacy.NumpyDtype)
    spark = fields["tags"].codec.state_dict()["_spark_type"]
    assert legacy.spark_to_arrow_type(spark) == pa.list_(pa.string())
    price = fields["price"].codec.state_dict()["_spark_type"]
    assert legacy.spark_to_arrow_type(price) == pa.decimal128(12, 3)
    when = fields["when"].codec.state_dict()["_spark_type"]
    assert legacy.spark_to_arrow_type(when) == pa.timestamp("us")
    assert fields["no_codec"].codec is None


def _check_converted(schema: Any) -> None:
    from unihub.schema.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec

    f = schema.fields
    assert schema.name == "OldSchema"
    assert f["id"].codec.storage_type == pa.int64()
    assert (f["price"].numpy_dtype, f["price"].nullable) == (decimal.Decimal, True)
    assert f["price"].codec.storage_type == pa.decimal128(12, 3)
    assert f["when"].codec.storage_type == pa.timestamp("us")
    assert f["tags"].shape == (None,) and f["tags"].codec.storage_type == pa.list_(pa.string())
    assert f["raw"].codec.storage_type == pa.binary()
    assert f["flag"].codec.storage_type == pa.bool_()
    assert isinstance(f["image"].codec, CompressedImageCodec)
    assert (f["image"].codec.image_codec, f["image"].codec.quality) == ("jpeg", 70)
    assert f["image"].shape == (32, 48, 3) and type(f["image"].shape[0]) is int
    assert (f["tensor"].numpy_dtype, f["tensor"].shape) == (np.float32, (None, 3))
    assert type(f["tensor"].codec) is NdarrayCodec
    assert type(f["packed"].codec) is CompressedNdarrayCodec and f["packed"].nullable
    assert f["no_codec"].codec is None
    assert all(isinstance(x.codec, ScalarCodec) for x in (f["id"], f["price"], f["when"], f["tags"]))


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_all_protocols(fake: types.SimpleNamespace, protocol: int) -> None:
    # Protocols 0/1 are what Python 2's cPickle.dumps wrote: copy_reg._reconstructor,
    # __builtin__.object/tuple; protocol 2 adds _codecs.encode for the numpy scalar's bytes.
    data = pickle.dumps(fake.schema, protocol=protocol)
    _check_old_schema(safe_unpickle(data))
    _check_converted(load_petastorm_unischema(data))


def test_python2_module_names(fake: types.SimpleNamespace) -> None:
    data = pickle.dumps(fake.schema, protocol=0)
    assert b"copy_reg\n_reconstructor" in data and b"__builtin__\n" in data
    # numpy < 2 wrote numpy.core.multiarray; the old alias names must work too.
    data = data.replace(b"numpy._core.multiarray\nscalar", b"numpy.core.multiarray\nscalar")
    data = data.replace(b"cnumpy\nstr_\n", b"cnumpy\nunicode_\n").replace(b"cnumpy\nbytes_\n", b"cnumpy\nstring_\n")
    assert b"numpy.core.multiarray\nscalar" in data and b"unicode_" in data and b"string_" in data
    stand_in = safe_unpickle(data)
    _check_old_schema(stand_in)
    assert stand_in.fields["tags"].numpy_dtype is np.str_
    _check_converted(load_petastorm_unischema(data))


@pytest.mark.parametrize("package", [b"av.ml.dataset_toolkit", b"av.experimental.deepdrive.dataset_toolkit"])
def test_pre_open_source_package_names(fake: types.SimpleNamespace, package: bytes) -> None:
    data = pickle.dumps(fake.schema, protocol=0).replace(b"cpetastorm.", b"c" + package + b".")
    assert b"petastorm" not in data
    _check_old_schema(safe_unpickle(data))


def test_python2_str_and_decimal_type() -> None:
    # As cPickle wrote pyspark's DecimalType(10, 2) at protocol 0: S'' strings, I01 for True.
    data = (b"ccopy_reg\n_reconstructor\np0\n(cpyspark.sql.types\nDecimalType\np1\nc__builtin__\nobject\np2\n"
            b"Ntp3\nRp4\n(dp5\nS'precision'\np6\nI10\nsS'scale'\np7\nI2\nsS'hasPrecisionInfo'\np8\nI01\nsb.")
    spark = safe_unpickle(data)
    assert spark.spark_name == "DecimalType"
    assert spark.state == {"precision": 10, "scale": 2, "hasPrecisionInfo": True}
    assert legacy.spark_to_arrow_type(spark) == pa.decimal128(10, 2)


def test_older_field_without_nullable(fake: types.SimpleNamespace) -> None:
    # UnischemaField before ``nullable`` existed: a 4-tuple.
    data = (b"ccopy_reg\n_reconstructor\n(cpetastorm.unischema\nUnischemaField\nc__builtin__\ntuple\n"
            b"(S'x'\ncnumpy\nint32\n(I2\ntNttR.")
    field = safe_unpickle(data)
    assert (field.name, field.numpy_dtype, field.shape, field.codec, field.nullable) == ("x", np.int32, (2,), None, False)


def cpickle_numbering(data: bytes) -> bytes:
    """A protocol-0 pickle of Python 3 (memo 0, 1, 2, ...) as Python 2's cPickle wrote it (memo 1, 2, 3, ...)."""
    out, start = bytearray(), 0
    for opcode, arg, pos in pickletools.genops(data):
        if opcode.name in ("PUT", "GET"):
            out += data[start:pos] + opcode.code.encode() + f"{arg + 1}\n".encode()
            start = pos + 2 + len(str(arg))
    return bytes(out + data[start:])


def test_python2_cpickle_numbering(fake: types.SimpleNamespace) -> None:
    data = cpickle_numbering(pickle.dumps(fake.schema, protocol=0))
    assert b"\np1\n" in data and b"\np0\n" not in data
    _check_old_schema(safe_unpickle(data))
    _check_converted(load_petastorm_unischema(data))


def test_malicious_global_inside_a_valid_schema(fake: types.SimpleNamespace, marker: Path) -> None:
    fake.schema._fields["id"].codec._spark_type = _Reduce(os.system, (f"touch {marker}",))
    for protocol in (0, 2, 4, 5):
        data = pickle.dumps(fake.schema, protocol=protocol)
        with pytest.raises(UnsafeMetadataError, match=r"'(posix|nt)\.system'"):
            load_petastorm_unischema(data)
    with pytest.raises(UnsafeMetadataError, match=r"'(posix|nt)\.system'"):
        load_petastorm_unischema(cpickle_numbering(pickle.dumps(fake.schema, protocol=0)))


@pytest.fixture(scope="module")
def legacy_bytes() -> bytes:
    return pq.read_metadata(LEGACY_FIXTURE).metadata[PETASTORM_UNISCHEMA_KEY]


def test_petastorm_0_4_0_unischema_reads(legacy_bytes: bytes) -> None:
    assert legacy_bytes.startswith(b"ccopy_reg\n_reconstructor\np1\n")  # cPickle: the memo starts at 1
    schema = load_petastorm_unischema(legacy_bytes)
    assert schema.name == "TestSchema" and len(schema.fields) == 13
    assert schema.fields["matrix"].shape == (32, 16, 3)


@pytest.mark.parametrize("old, new, message", [
    (b"cpetastorm.codecs\nNdarrayCodec\n", b"cposix\nsystem\n", "'posix.system'"),
    (b"cpyspark.sql.types\nStringType\n", b"cbuiltins\neval\n", "'builtins.eval'"),
    (b"c__builtin__\nobject\n", b"csubprocess\nPopen\n", "'subprocess.Popen'"),
    (b"ccopy_reg\n_reconstructor\np1\n", b"ccopy_reg\n_reconstructor\np999999999\n",
     "PUT of memo index 999,999,999 after 0 memoized values"),
    (b"cpetastorm.unischema\nUnischema\np2\n", b"cpetastorm.unischema\nUnischema\np99999999\n",
     "PUT of memo index 99,999,999 after 1 memoized values numbered from 1"),
], ids=["posix.system", "builtins.eval", "subprocess.Popen", "first memo index", "memo gap"])
def test_hostile_edits_of_a_python2_pickle_are_refused(legacy_bytes: bytes, old: bytes, new: bytes,
                                                       message: str) -> None:
    data = legacy_bytes.replace(old, new, 1)
    assert data != legacy_bytes
    with pytest.raises(UnsafeMetadataError, match=re.escape(message)):
        load_petastorm_unischema(data)


def test_unconvertible_content_is_a_value_error(fake: types.SimpleNamespace) -> None:
    fake.schema._fields["id"] = fake.schema._fields["id"]._replace(numpy_dtype=collections.OrderedDict)
    with pytest.raises(ValueError, match="unsupported numpy_dtype"):
        load_petastorm_unischema(pickle.dumps(fake.schema, protocol=4))
    with pytest.raises(PetastormMetadataError, match="expected a pickled petastorm Unischema"):
        load_petastorm_unischema(pickle.dumps(collections.OrderedDict(a=1)))


@pytest.mark.parametrize("code", [b"i3", b"c5", b"M8[xx]"])
def test_a_dtype_code_numpy_lacks_is_a_metadata_error(fake: types.SimpleNamespace, code: bytes) -> None:
    # The pickled dtype('f4') of the field "tensor", edited to a code of the right shape that numpy has not:
    # a TypeError from numpy escaped, and the CLI printed its traceback.
    data = pickle.dumps(fake.schema, protocol=2)
    assert data.count(b"X\x02\x00\x00\x00f4") == 1
    data = data.replace(b"X\x02\x00\x00\x00f4", b"X" + struct.pack("<I", len(code)) + code)
    with pytest.raises(PetastormMetadataError, match=re.escape(f"unsupported pickled numpy dtype '{code.decode()}'")):
        load_petastorm_unischema(data)


@pytest.mark.parametrize("precision", [2**63, 10**100], ids=["2**63", "10**100"])
def test_a_decimal_precision_beyond_a_c_int_is_a_metadata_error(fake: types.SimpleNamespace, precision: int) -> None:
    # pa.decimal128 raised OverflowError, which escaped as it is.
    fake.schema._fields["price"].codec._spark_type.precision = precision
    with pytest.raises(PetastormMetadataError, match=re.escape(f"invalid DecimalType({precision}, 3)")):
        load_petastorm_unischema(pickle.dumps(fake.schema, protocol=4))


@pytest.mark.parametrize("protocol", [0, 2, 4])
def test_real_pyspark_types(protocol: int) -> None:
    spark_types = pytest.importorskip("pyspark.sql.types")
    cases = {
        spark_types.ArrayType(spark_types.DecimalType(12, 3)): pa.list_(pa.decimal128(12, 3)),
        spark_types.TimestampType(): pa.timestamp("us"),
        spark_types.DateType(): pa.date32(),
        spark_types.StringType(): pa.string(),
        spark_types.ByteType(): pa.int8(),
        spark_types.ShortType(): pa.int16(),
        spark_types.FloatType(): pa.float32(),
        spark_types.BinaryType(): pa.binary(),
    }
    for spark_type, arrow_type in cases.items():
        assert legacy.spark_to_arrow_type(safe_unpickle(pickle.dumps(spark_type, protocol=protocol))) == arrow_type


def test_cyclic_pickles_are_value_errors(fake: types.SimpleNamespace) -> None:
    # No hang and no RecursionError: a field list containing itself, a codec holding its field.
    loop: list = []
    loop.append(loop)
    fake.schema._fields = loop
    with pytest.raises(PetastormMetadataError, match="expected a pickled UnischemaField"):
        load_petastorm_unischema(pickle.dumps(fake.schema, protocol=4))
    field = fake.modules["petastorm.unischema"].UnischemaField(
        "x", np.int64, (), fake.modules["petastorm.codecs"].ScalarCodec(None))
    field.codec._spark_type = field
    fake.schema._fields = collections.OrderedDict(x=field)
    with pytest.raises(PetastormMetadataError, match="expected a pyspark.sql.types type"):
        load_petastorm_unischema(pickle.dumps(fake.schema, protocol=4))


def test_allow_list_is_read_only() -> None:
    with pytest.raises(TypeError):
        legacy.ALLOWED_GLOBALS[("os", "system")] = os.system  # type: ignore[index]
