"""The package as a whole: lazy optional imports, dependency errors, the error hierarchy, the registry."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest

import unihub
from unihub import errors
from unihub.dependencies import EXTRAS, is_available, require
from unihub.errors import (
    CodecError,
    DatasetExistsError,
    DatasetNotFoundError,
    FormatError,
    ImageDecodeError,
    MissingDependencyError,
    SchemaError,
    UnihubError,
    UnsafeMetadataError,
    UnsupportedFormatError,
    ValidationError,
)
from unihub.registry import Registry

FRAMEWORKS = ["torch", "tensorflow", "pyspark", "h5py", "nvidia.dali", "cv2"]


def imported_after(code: str) -> dict[str, bool]:
    """Run ``code`` in a fresh interpreter and say which framework modules it left in sys.modules."""
    script = (
        "import json, sys\n"
        f"{code}\n"
        f"print(json.dumps({{m: m in sys.modules for m in {FRAMEWORKS!r}}}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- lazy imports -------------------------------------------------------------------------------
def test_import_unihub_leaves_frameworks_out():
    found = imported_after("import unihub")
    assert found == {m: False for m in FRAMEWORKS}


def test_using_the_format_layer_leaves_frameworks_out(tmp_path):
    code = f"""
import numpy as np, pyarrow as pa
import unihub
from unihub import Unischema, UnischemaField, ScalarCodec, TensorCodec, NdarrayCodec, write_dataset, open_dataset
import unihub.schema.spark_types, unihub.schema.frameworks, unihub.petastorm.legacy, unihub.bridges.spark.writer
S = Unischema("S", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64())),
                    UnischemaField("t", np.float32, (2,), TensorCodec()),
                    UnischemaField("n", np.float32, (None,), NdarrayCodec())])
write_dataset({str(tmp_path / 'ds')!r}, S, [{{"id": 1, "t": np.zeros(2, np.float32), "n": np.ones(3, np.float32)}}])
store = open_dataset({str(tmp_path / 'ds')!r})
assert store.num_rows == 1
S.as_arrow_schema(); S.to_json(); Unischema.from_json(S.to_json())
"""
    found = imported_after(code)
    assert found == {m: False for m in FRAMEWORKS}


def test_public_api_resolves():
    for name in unihub.__all__:
        assert getattr(unihub, name) is not None, name
    for name in ("Unischema", "UnischemaField", "ScalarCodec", "CompressedImageCodec", "NdarrayCodec",
                 "CompressedNdarrayCodec", "TensorCodec", "write_dataset", "open_dataset", "materialize_dataset",
                 "dict_to_spark_row", "convert", "verify", "DatasetChangedError"):
        assert name in unihub.__all__
    assert isinstance(unihub.__version__, str) and unihub.__version__.count(".") == 2


# -- dependencies -----------------------------------------------------------------------------------
def test_require_names_the_extra():
    with pytest.raises(MissingDependencyError) as info:
        require("no_such_module_xyz", extra="tf")
    assert isinstance(info.value, ImportError)
    assert isinstance(info.value, UnihubError)
    assert "pip install 'unihub[tf]'" in str(info.value)
    assert "no_such_module_xyz" in str(info.value)
    assert isinstance(info.value.__cause__, ImportError)
    # catching ImportError, as code migrated from Petastorm does, keeps working
    try:
        require("no_such_module_xyz", extra="tf")
    except ImportError as exc:
        assert str(exc) == str(info.value)


def test_require_defaults_and_purpose():
    with pytest.raises(MissingDependencyError, match=r"needed for reading X but is not installed: "
                                                     r"pip install 'unihub\[all\]'"):
        require("no_such_module_xyz", purpose="reading X")
    assert EXTRAS["tensorflow"] == "tf" and EXTRAS["nvidia.dali"] == "dali" and EXTRAS["pyspark"] == "spark"
    assert require("json") is json


def test_is_available_does_not_import():
    assert is_available("json") is True
    assert is_available("no_such_module_xyz") is False
    assert is_available("no_such_module_xyz.sub") is False
    assert is_available("") is False
    found = imported_after("from unihub.dependencies import is_available\n"
                           "[is_available(m) for m in ('torch', 'tensorflow', 'pyspark', 'h5py', 'cv2')]")
    assert found == {m: False for m in FRAMEWORKS}


# -- errors ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("error, builtins", [
    (SchemaError, (ValueError,)),
    (ValidationError, (SchemaError, ValueError)),
    (CodecError, (ValueError,)),
    (ImageDecodeError, (CodecError, ValueError)),
    (FormatError, (ValueError,)),
    (UnsupportedFormatError, (ValueError,)),
    (DatasetNotFoundError, (FileNotFoundError, OSError)),
    (DatasetExistsError, (FileExistsError, OSError)),
    (MissingDependencyError, (ImportError,)),
    (UnsafeMetadataError, ()),
])
def test_error_hierarchy(error, builtins):
    assert issubclass(error, UnihubError)
    for parent in builtins:
        assert issubclass(error, parent)


def test_every_error_class_is_a_unihub_error():
    classes = [obj for _, obj in inspect.getmembers(errors, inspect.isclass)
               if issubclass(obj, BaseException) and obj.__module__ == errors.__name__]
    assert len(classes) >= 11
    assert all(issubclass(cls, UnihubError) for cls in classes)
    assert issubclass(UnihubError, Exception)


def test_error_context_attributes():
    error = ValidationError("field 'x', row 3: bad", field="x", row=3)
    assert (error.field, error.row, str(error)) == ("x", 3, "field 'x', row 3: bad")
    error = CodecError("bad", field="y")
    assert (error.field, error.row) == ("y", None)
    error = FormatError("/d/f.parquet: truncated", path="/d/f.parquet", offset=12)
    assert (error.path, error.offset) == ("/d/f.parquet", 12)
    with pytest.raises(FileNotFoundError):
        raise DatasetNotFoundError("gone")


# -- registry --------------------------------------------------------------------------------------------
def make_registry() -> Registry:
    registry: Registry = Registry("format")

    @registry.register("png", aliases=("image",), extensions=(".PNG", "apng"))
    def png():
        return "png"

    registry.add("jpeg", "jpeg-entry", aliases=("jpg",), extensions=("jpg", ".jpeg"))
    registry.add_unavailable("hdf5", "h5py is needed for HDF5 but is not installed: pip install 'unihub[hdf5]'")
    return registry


def test_registry_lookups():
    registry = make_registry()
    assert registry.get("png")() == "png"
    assert registry.get("image") is registry.get("png")
    assert registry.get("jpg") == "jpeg-entry"
    assert registry.canonical("jpg") == "jpeg" and registry.canonical("other") == "other"
    assert registry.by_extension(".png") == "png"
    assert registry.by_extension("PNG") == "png"
    assert registry.by_extension("apng") == "png"
    assert registry.by_extension(".JPEG") == "jpeg"
    assert registry.by_extension(".gif") is None
    assert "png" in registry and "jpg" in registry and "hdf5" not in registry and 3 not in registry
    assert list(registry) == ["jpeg", "png"]
    assert registry.names() == ["hdf5", "jpeg", "png"]


def test_registry_unknown_name_lists_valid_names():
    with pytest.raises(UnsupportedFormatError) as info:
        make_registry().get("tiff")
    assert str(info.value) == "unknown format 'tiff'; valid names: hdf5, jpeg, png"


def test_registry_unavailable_entries_explain_how_to_install():
    registry = make_registry()
    with pytest.raises(MissingDependencyError, match=r"pip install 'unihub\[hdf5\]'"):
        registry.get("hdf5")
    # once its dependency is registered for real, it is available
    registry.add("hdf5", "hdf5-entry")
    assert registry.get("hdf5") == "hdf5-entry" and "hdf5" in registry
    # and a later add_unavailable does not hide a registered entry
    registry.add_unavailable("hdf5", "should not matter")
    assert registry.get("hdf5") == "hdf5-entry"
    registry.add("png", "replaced")
    assert registry.get("image") == "replaced"


def test_bridges_are_exported_lazily():
    code = ("import unihub, json, sys\n"
            "names = ['make_petastorm_dataset', 'make_tf_dataset', 'tf_tensors', 'make_spark_converter',"
            " 'SparkDatasetConverter', 'make_dali_pipeline']\n"
            "found = [callable(getattr(unihub, n)) for n in names]\n"
            "print(json.dumps([all(found), 'tensorflow' in sys.modules]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True, False]  # found; TF imported only when used
