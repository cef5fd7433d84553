"""The Petastorm import shim of the conformance run holds no logic, and the conformance run works.

``benchmarks/petastorm_shim/petastorm`` lets Petastorm's own tests import unihub under Petastorm's
module paths. Its pass rate is only a measure of unihub if the shim adds nothing: every module may
hold imports, ``__all__``, docstrings and plain name bindings (``a = b``, ``a = b.c``), nothing
else, and every name it binds must come from unihub.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHIM_ROOT = REPO_ROOT / "benchmarks" / "petastorm_shim"
SHIM_MODULES = sorted((SHIM_ROOT / "petastorm").rglob("*.py"))


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _is_name_or_attribute(node: ast.expr) -> bool:
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _is_all(node: ast.stmt) -> bool:
    if not (isinstance(node, ast.Assign) and [ast.unparse(target) for target in node.targets] == ["__all__"]):
        return False
    return isinstance(node.value, (ast.List, ast.Tuple)) and all(
        isinstance(element, ast.Constant) and isinstance(element.value, str) for element in node.value.elts)


def logic_in(source: str) -> list[str]:
    """The statements of a module that are not an import, ``__all__``, a docstring or ``a = b(.c)``."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or _is_docstring(node) or _is_all(node):
            continue
        if (isinstance(node, ast.Assign) and all(isinstance(target, ast.Name) for target in node.targets)
                and _is_name_or_attribute(node.value)):
            continue
        found.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return found


def test_the_shim_has_modules():
    names = {path.relative_to(SHIM_ROOT).as_posix() for path in SHIM_MODULES}
    assert {"petastorm/__init__.py", "petastorm/unischema.py", "petastorm/pytorch.py",
            "petastorm/etl/dataset_metadata.py"} <= names


@pytest.mark.parametrize("path", SHIM_MODULES, ids=lambda path: path.relative_to(SHIM_ROOT).as_posix())
def test_shim_module_holds_only_imports_and_bindings(path):
    assert logic_in(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("source", [
    "def f():\n    pass\n",
    "class A:\n    pass\n",
    "x = make()\n",
    "x = lambda: 1\n",
    "if True:\n    x = 1\n",
    "x = 1\n",
    "x: int = y\n",
    "x = y[0]\n",
    "x += y\n",
    "__all__ = names()\n",
    "try:\n    import a\nexcept ImportError:\n    a = None\n",
    "for _ in range(3):\n    pass\n",
    "print('x')\n",
])
def test_the_check_finds_logic(source):
    assert logic_in(source), source


def test_the_check_accepts_bindings():
    source = '"""doc"""\nimport a\nfrom a.b import c as d\nx = d\ny = a.b.c\n__all__ = ["x", "y"]\n'
    assert logic_in(source) == []


def _shim_module_names() -> list[str]:
    names = []
    for path in SHIM_MODULES:
        parts = list(path.relative_to(SHIM_ROOT).with_suffix("").parts)
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.fixture
def shim_on_path(monkeypatch):
    """Import the shim as ``petastorm`` (this venv has no real Petastorm), then forget it again."""
    monkeypatch.syspath_prepend(str(SHIM_ROOT))
    for name in [name for name in sys.modules if name == "petastorm" or name.startswith("petastorm.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [name for name in sys.modules if name == "petastorm" or name.startswith("petastorm.")]:
        del sys.modules[name]


def test_every_name_the_shim_binds_is_unihubs(shim_on_path):
    for module_name in _shim_module_names():
        if module_name.endswith(("tf_utils", "spark", "spark_dataset_converter", "spark_utils")):
            pytest.importorskip("tensorflow" if "tf" in module_name else "pyspark")
        module = importlib.import_module(module_name)
        assert module.__file__.startswith(str(SHIM_ROOT)), module_name
        for name in getattr(module, "__all__", []):
            value = getattr(module, name)
            if isinstance(value, type(sys)):  # a submodule of the shim itself
                assert value.__name__.startswith("petastorm."), (module_name, name)
                continue
            origin = getattr(value, "__module__", "") or ""
            assert origin.split(".")[0] == "unihub", f"{module_name}.{name} comes from {origin!r}, not unihub"


def test_every_module_lists_what_it_binds():
    for path in SHIM_MODULES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bound = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                 for alias in node.names}
        bound |= {target.id for node in tree.body if isinstance(node, ast.Assign)
                  for target in node.targets if isinstance(target, ast.Name) and target.id != "__all__"}
        listed = {value for node in tree.body if _is_all(node) for value in ast.literal_eval(node.value)}
        assert bound == listed, path


PETASTORM_PYTHON = REPO_ROOT / ".venv-petastorm" / "bin" / "python"
needs_petastorm_venv = pytest.mark.skipif(not PETASTORM_PYTHON.exists(),
                                          reason="no .venv-petastorm (benchmarks/petastorm_env.py)")


def _conformance_module():
    spec = importlib.util.spec_from_file_location("petastorm_conformance",
                                                  REPO_ROOT / "benchmarks" / "petastorm_conformance.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@needs_petastorm_venv
def test_every_exclusion_names_a_petastorm_test():
    """A renamed or mistyped exclusion would silently count a private test as applicable."""
    conformance = _conformance_module()
    tests_dir = conformance.petastorm_tests_dir()
    for name in conformance.EXCLUDED_FILES:
        assert (tests_dir / name).is_file(), name
    for test_id in conformance.EXCLUDED_TESTS:
        file_name, _, test_name = test_id.partition("::")
        test_name = test_name.rpartition("::")[2]  # a unittest class's test: file::Class::test
        tree = ast.parse((tests_dir / file_name).read_text(encoding="utf-8"))
        defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert test_name in defined, test_id


def test_exclusion_reason_matches_parameters_and_files():
    conformance = _conformance_module()
    assert conformance.exclusion_reason("test_unischema.py::test_fullmatch") is not None
    assert conformance.exclusion_reason("test_ngram_end_to_end.py::test_ngram_basic[reader_factory0]") is not None
    assert conformance.exclusion_reason("test_ngram_end_to_end.py::test_ngram_basic_tf") is None
    assert conformance.exclusion_reason("test_fs_utils.py::anything") is not None
    assert conformance.exclusion_reason("test_unischema.py::test_fields") is None


@pytest.mark.slow
@needs_petastorm_venv
def test_conformance_run_on_a_subset(tmp_path):
    out = tmp_path / "table.json"
    markdown = tmp_path / "table.md"
    """Two files that need no Spark session (test_predicates.py's datasets took ~100 s of Spark jobs in each venv):
    test_unischema.py has exclusions, a test failing on Petastorm itself and tests failing on unihub (grouped)."""
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "petastorm_conformance.py"), "--only", "test_unischema.py",
         "--only", "test_codec_ndarray.py", "--json", str(out), "--markdown", str(markdown)],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = json.loads(out.read_text())
    assert sorted(table["files"]) == ["test_codec_ndarray.py", "test_unischema.py"]
    assert table["applicable"] >= 10  # most of both files' tests pass on real Petastorm 0.13.1
    assert 0 <= table["passing"] <= table["applicable"]
    assert table["failing"] == table["applicable"] - table["passing"]
    assert sum(group["count"] for group in table["failure_groups"]) == table["failing"]
    assert any(test_id.startswith("test_unischema.py::") for test_id in table["excluded"])
    assert table["percent"] == round(100 * table["passing"] / table["applicable"], 1)
    assert "passing on unihub" in proc.stdout
    assert markdown.read_text().startswith("| applicable |")
