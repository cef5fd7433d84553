"""The import graph: DESIGN.md's layers hold (import-linter's contracts in pyproject.toml) and no module
imports itself through others (scripts/import_cycles.py). CI runs both as commands; these tests run them
on the package, and on small generated packages to show that each check fails where it should."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from importlinter.cli import lint_imports

REPO = Path(__file__).resolve().parents[1]


def _load_cycle_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_cycles", REPO / "scripts" / "import_cycles.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


import_cycles = _load_cycle_script()


def _package(root: Path, name: str, modules: dict[str, str]) -> None:
    """A package ``name`` under ``root`` holding ``modules`` (dotted name below the package -> source)."""
    for dotted, source in {"": "", **modules}.items():
        parts = [name, *dotted.split(".")] if dotted else [name]
        for depth in range(1, len(parts) + (0 if dotted else 1)):
            init = root.joinpath(*parts[:depth], "__init__.py")
            init.parent.mkdir(parents=True, exist_ok=True)
            init.touch()
        if dotted:
            root.joinpath(*parts[:-1], parts[-1] + ".py").write_text(textwrap.dedent(source))


@pytest.fixture
def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``tmp_path`` on sys.path, and the generated packages gone from sys.modules afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        sys.modules.pop(name, None)


# -- cycles -----------------------------------------------------------------------------------------
def test_unihub_has_no_import_cycle(capsys: pytest.CaptureFixture[str]) -> None:
    assert import_cycles.main([]) == 0, capsys.readouterr().out
    assert capsys.readouterr().out.strip() == "no import cycle in unihub"


def test_strongly_connected_modules_are_one_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert import_cycles.cycles(graph) == [["a", "b", "c"], ["e"]]
    assert import_cycles.cycles({"a": {"b"}, "b": set()}) == []


def test_a_cycle_through_a_function_level_import_is_found_and_listed(
        on_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _package(on_path, "cyclic_pkg", {
        "low": """
            from typing import TYPE_CHECKING

            if TYPE_CHECKING:  # never runs: no cycle through it
                from cyclic_pkg.top import Top


            def helper():
                from cyclic_pkg.high import value  # inside a function, still a dependency
                return value
            """,
        "high": "from cyclic_pkg.low import helper\n\nvalue = 1\n",
        "top": "from cyclic_pkg.low import helper\n\n\nclass Top:\n    pass\n",
    })
    assert import_cycles.main(["--package", "cyclic_pkg"]) == 1
    out = capsys.readouterr().out
    assert "cycle of 2 modules: cyclic_pkg.high, cyclic_pkg.low" in out
    assert "cyclic_pkg.low:9 -> cyclic_pkg.high" in out and "cyclic_pkg.high:1 -> cyclic_pkg.low" in out
    assert "cyclic_pkg.top" not in out.split("\n", 1)[0]
    assert out.strip().endswith("1 import cycle(s) in cyclic_pkg")


# -- layers -----------------------------------------------------------------------------------------
def test_unihub_keeps_its_layer_contracts() -> None:
    assert lint_imports(config_filename=str(REPO / "pyproject.toml"), no_cache=True, no_logo=True) == 0


def test_an_arrow_pointing_up_breaks_the_layer_contract(on_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _package(on_path, "layered_pkg", {
        "store.writer": "def write():\n    from layered_pkg.readers.reader import read  # up a layer\n    return read\n",
        "readers.reader": "from layered_pkg.store.writer import write\n\n\ndef read():\n    return write\n",
    })
    config = on_path / "importlinter.toml"
    config.write_text(textwrap.dedent("""
        [tool.importlinter]
        root_package = "layered_pkg"

        [[tool.importlinter.contracts]]
        name = "Arrows point down only"
        type = "layers"
        layers = ["layered_pkg.readers", "layered_pkg.store"]
        """))
    monkeypatch.chdir(on_path)
    assert lint_imports(config_filename=str(config), no_cache=True, no_logo=True) == 1
