"""scripts/complexity.py: CI's check that no function exceeds complexity 20 outside the listed exceptions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "complexity.py"


def branchy(name: str, branches: int, indent: str = "") -> str:
    """Source of a function whose cyclomatic complexity is ``branches + 1``."""
    lines = [f"{indent}def {name}(x):"]
    lines += [f"{indent}    if x == {i}:\n{indent}        return {i}" for i in range(branches)]
    lines.append(f"{indent}    return -1")
    return "\n".join(lines) + "\n"


def run_check(root: Path, exceptions: str) -> subprocess.CompletedProcess[str]:
    """Run the script over the package ``root`` with an exceptions file holding ``exceptions``."""
    listed = root.parent / "exceptions.txt"
    listed.write_text(exceptions, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root), "--exceptions", str(listed)],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A package with one simple function and one of complexity 22 in ``sub/busy.py``."""
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "simple.py").write_text(branchy("calm", 3), encoding="utf-8")
    (root / "sub" / "busy.py").write_text("class Busy:\n" + branchy("method", 21, indent="    "), encoding="utf-8")
    return root


def test_an_over_complex_method_fails_and_is_named(package: Path) -> None:
    result = run_check(package, "")
    assert result.returncode == 1
    assert "sub/busy.py:2: Busy.method has complexity 22 > 20" in result.stderr
    assert "calm" not in result.stderr


def test_a_listed_exception_with_its_reason_passes(package: Path) -> None:
    result = run_check(package, "# the list\nsub/busy.py::Busy.method  a generated table of branches\n")
    assert result.returncode == 0, result.stderr
    assert "no function over 20" in result.stdout


def test_an_exception_without_a_reason_fails(package: Path) -> None:
    result = run_check(package, "sub/busy.py::Busy.method\n")
    assert result.returncode == 1
    assert "expected 'path::qualname  reason'" in result.stderr


def test_a_stale_exception_fails_once_the_function_is_split(package: Path) -> None:
    (package / "sub" / "busy.py").write_text("class Busy:\n" + branchy("method", 5, indent="    "), encoding="utf-8")
    result = run_check(package, "sub/busy.py::Busy.method  was a generated table of branches\n")
    assert result.returncode == 1
    assert "sub/busy.py::Busy.method is listed but its complexity is 6 <= 20" in result.stderr


def test_an_exception_for_a_function_that_is_gone_fails(package: Path) -> None:
    result = run_check(package, "sub/busy.py::Busy.method  a table\nsub/busy.py::Busy.renamed  no longer here\n")
    assert result.returncode == 1
    assert "sub/busy.py::Busy.renamed is listed but no longer exists" in result.stderr
    assert "Busy.method" not in result.stderr


def test_a_nested_function_is_measured_on_its_own(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "outer.py").write_text("def outer():\n" + branchy("inner", 25, indent="    ") + "    return inner\n")
    result = run_check(root, "")
    assert result.returncode == 1
    assert "outer.inner has complexity 26 > 20" in result.stderr


def test_tests_benchmarks_and_scripts_are_not_the_package(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    for folder in ("tests", "benchmarks", "scripts", ".venv"):
        (root / folder).mkdir(parents=True)
        (root / folder / "busy.py").write_text(branchy("busy", 30), encoding="utf-8")
    result = run_check(root, "")
    assert result.returncode == 0, result.stderr
