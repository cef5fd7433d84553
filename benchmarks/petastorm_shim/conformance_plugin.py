"""pytest plugin of the Petastorm conformance run (``benchmarks/petastorm_conformance.py``).

Loaded with ``-p conformance_plugin`` in both runs (real Petastorm and unihub's shim). It is the
harness, not the shim, so it may hold logic:

- writes one JSON line per test outcome (and per failed collection) to
  ``$CONFORMANCE_RESULTS``, as it happens, so a run that is killed still leaves what it saw;
- deselects the node ids listed in ``$CONFORMANCE_DESELECT`` (excluded tests, tests already run,
  Spark tests when Spark does not start) and records why;
- ends the process when one test runs past ``$CONFORMANCE_TIMEOUT_S`` seconds (the runner then
  starts the file again without the tests already done);
- with ``$CONFORMANCE_PLACEHOLDERS=1`` (the unihub run): a name a test file imports from
  ``petastorm.*`` that unihub has no counterpart for becomes a placeholder that raises
  ``NotInUnihub`` when used, so one missing name fails the tests that use it, not every
  test of the file. Names only excluded (private) tests use are caught the same way.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest

_RESULTS = os.environ.get("CONFORMANCE_RESULTS")
_TIMEOUT_S = float(os.environ.get("CONFORMANCE_TIMEOUT_S", "0") or 0)
_SPARK_FIXTURES = {"synthetic_dataset", "scalar_dataset", "many_columns_non_petastorm_dataset", "spark_test_ctx"}
_lock = threading.Lock()


def _record(**entry: Any) -> None:
    if not _RESULTS:
        return
    with _lock, open(_RESULTS, "a", encoding="utf-8") as out:
        out.write(json.dumps(entry) + "\n")
        out.flush()


def _deselect_reasons() -> dict[str, str]:
    path = os.environ.get("CONFORMANCE_DESELECT")
    if not path or not Path(path).exists():
        return {}
    return json.loads(Path(path).read_text(encoding="utf-8"))


def short_id(nodeid: str) -> str:
    """``petastorm/tests/test_x.py::t[a]`` -> ``test_x.py::t[a]``: one id in both runs.

    Parameters that hold a path into the run's folder (the legacy datasets' URLs) lose the folder.
    """
    path, _, rest = nodeid.partition("::")
    for tests_folder in ("/petastorm/tests/", "/petastorm_tests/"):
        rest = rest.replace(f"{Path.cwd()}{tests_folder}", "tests/")
    return f"{Path(path).name}::{rest}" if rest else Path(path).name


def _cause(report: Any) -> str:
    """The failure's first line; with the line that says more where the first says little."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return "?"
    cause = lines[0]
    if cause.endswith("Regex pattern did not match."):  # pytest.raises(match=...): say what was expected
        cause += " " + " ".join(lines[1:3])  # pytest's "Expected regex: ..." and "Actual message: ..."
    elif cause.endswith(":"):  # e.g. Spark's PythonException: the worker's own error comes last
        errors = [line for line in lines[1:] if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line)]
        cause += " " + (errors[-1] if errors else lines[-1])
    return cause[:300]


class NotInUnihub(AttributeError):
    """A test used a ``petastorm`` name the shim does not bind (no unihub counterpart)."""


class _Placeholder:
    def __init__(self, qualname: str) -> None:
        object.__setattr__(self, "_qualname", qualname)

    def _missing(self, *_: Any, **__: Any) -> Any:
        raise NotInUnihub(f"{self._qualname} has no unihub counterpart")

    __call__ = __iter__ = __enter__ = __getitem__ = _missing

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self._missing()

    def __repr__(self) -> str:
        return f"<missing {self._qualname}>"


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self.__name__}.{name}")


def _imported_names(tests_dir: Path) -> dict[str, set[str]]:
    """``{module: {names}}`` for every ``from petastorm.x import ...`` in the copied tests."""
    wanted: dict[str, set[str]] = {}
    for path in sorted(tests_dir.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "petastorm":
                if not node.module.startswith("petastorm.tests"):
                    wanted.setdefault(node.module, set()).update(alias.name for alias in node.names)
    return wanted


def _module_or_placeholder(name: str) -> types.ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is None or not name.startswith(error.name):
            raise
    parent, _, leaf = name.rpartition(".")
    module = _PlaceholderModule(name)
    module.__path__ = []  # a package, so that deeper placeholder modules can hang below it
    sys.modules[name] = module
    if parent:
        setattr(_module_or_placeholder(parent), leaf, module)
    return module


def _install_placeholders(tests_dir: Path) -> None:
    for module_name, names in _imported_names(tests_dir).items():
        module = _module_or_placeholder(module_name)
        for name in names:
            if not hasattr(module, name):
                try:
                    importlib.import_module(f"{module_name}.{name}")
                except ModuleNotFoundError:
                    setattr(module, name, _Placeholder(f"{module_name}.{name}"))


class _PytestLoggerHooks:
    """The hook of the pytest-logger plugin that Petastorm's conftest.py implements (logging setup only)."""

    @pytest.hookspec
    def pytest_logger_config(self, logger_config: Any) -> None:
        """Called by pytest-logger; declared here so pytest accepts the conftest without the plugin."""


def pytest_addhooks(pluginmanager: Any) -> None:
    if not pluginmanager.hasplugin("logger"):
        pluginmanager.add_hookspecs(_PytestLoggerHooks)


def pytest_configure(config: Any) -> None:
    if os.environ.get("CONFORMANCE_PLACEHOLDERS") == "1":
        import petastorm

        _install_placeholders(Path(petastorm.__file__).parent / "tests")


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    reasons = _deselect_reasons()
    no_spark = os.environ.get("CONFORMANCE_NO_SPARK") == "1"
    kept, dropped = [], []
    for item in items:
        test_id = short_id(item.nodeid)
        file_name = test_id.split("::")[0]
        reason = reasons.get(test_id) or reasons.get(test_id.split("[")[0]) or reasons.get(f"{file_name}::")
        if reason is None and no_spark and _SPARK_FIXTURES & set(getattr(item, "fixturenames", ())):
            reason = "not run: Spark does not start here"
        if reason is None:
            kept.append(item)
            continue
        dropped.append(item)
        if reason != "done":
            _record(id=test_id, outcome="deselected", cause=reason)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    _record(event="collected", ids=[short_id(item.nodeid) for item in kept])


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _record(event="collect_error", file=short_id(report.nodeid), cause=_cause(report))


_timer: threading.Timer | None = None


def _time_out(test_id: str) -> None:
    _record(id=test_id, outcome="failed", cause=f"Timeout: no result in {_TIMEOUT_S:.0f} s")
    os._exit(3)


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    global _timer
    _record(event="start", id=short_id(nodeid))
    if _TIMEOUT_S > 0:
        _timer = threading.Timer(_TIMEOUT_S, _time_out, args=(short_id(nodeid),))
        _timer.daemon = True
        _timer.start()


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    if _timer is not None:
        _timer.cancel()


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: Any) -> None:
    test_id = short_id(report.nodeid)
    if report.failed:
        cause = _cause(report)
        _record(id=test_id, outcome="failed", cause=cause if report.when == "call" else f"({report.when}) {cause}")
    elif report.skipped and report.when in ("setup", "call"):
        outcome = "xfailed" if hasattr(report, "wasxfail") else "skipped"
        _record(id=test_id, outcome=outcome, cause=_cause(report) if report.longrepr else "")
    elif report.when == "call" and report.passed:
        _record(id=test_id, outcome="xpassed" if hasattr(report, "wasxfail") else "passed")
