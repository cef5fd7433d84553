"""Fail when a function of the package is more complex than the limit and not a listed exception.

STYLE.md keeps cyclomatic complexity under 20. This script measures every function, method and nested
function of the package with radon (tests/, benchmarks/ and scripts/ are not the package) and exits 1
listing:

- each block whose complexity exceeds the limit and is not in the exceptions file;
- each listed exception that no longer exceeds the limit or no longer exists, so the list stays true.

The exceptions file holds one ``path::qualname  reason`` a line (``readers/loader.py::RowGroupLoader.__call__
hot loop: splitting it costs 4% CPU per row``); ``#`` starts a comment. A method's qualname is
``Class.method``, a nested function's ``outer.inner``.

Usage: ``.venv/bin/python scripts/complexity.py [--root DIR] [--exceptions FILE] [--limit N]``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from radon.visitors import Class, ComplexityVisitor, Function, code2ast

LIMIT = 20
REPOSITORY = Path(__file__).resolve().parent.parent
EXCEPTIONS = Path(__file__).resolve().parent / "complexity_exceptions.txt"
# folders of the checkout that are not the package (the repository root is the package `unihub`)
NOT_PACKAGE = {"tests", "benchmarks", "scripts", "build", "dist"}


@dataclass(frozen=True)
class Block:
    """One measured function: where it is and its cyclomatic complexity."""

    path: str
    qualname: str
    lineno: int
    complexity: int

    @property
    def key(self) -> str:
        """The name the exceptions file uses: ``path::qualname``."""
        return f"{self.path}::{self.qualname}"


def package_files(root: Path) -> Iterator[Path]:
    """The package's Python files under ``root``, leaving out hidden folders and those that are not the package."""
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts[:-1]
        if parts and (parts[0] in NOT_PACKAGE or any(part.startswith(".") for part in parts)):
            continue
        yield path


def _function_blocks(path: str, function: Function, prefix: str) -> Iterator[Block]:
    """A function and, separately, its nested functions (radon leaves their complexity out of the outer one)."""
    qualname = f"{prefix}{function.name}"
    yield Block(path, qualname, function.lineno, function.complexity)
    for closure in function.closures:
        yield from _function_blocks(path, closure, f"{qualname}.")


def _class_blocks(path: str, cls: Class, prefix: str) -> Iterator[Block]:
    """The methods of a class and of the classes nested in it."""
    qualname = f"{prefix}{cls.name}"
    for method in cls.methods:
        yield from _function_blocks(path, method, f"{qualname}.")
    for inner in cls.inner_classes:
        yield from _class_blocks(path, inner, f"{qualname}.")


def measure(root: Path) -> list[Block]:
    """Every function, method and nested function of the package under ``root``, with its complexity."""
    blocks: list[Block] = []
    for file in package_files(root):
        path = file.relative_to(root).as_posix()
        visitor = ComplexityVisitor.from_ast(code2ast(file.read_text(encoding="utf-8")))
        for function in visitor.functions:
            blocks.extend(_function_blocks(path, function, ""))
        for cls in visitor.classes:
            blocks.extend(_class_blocks(path, cls, ""))
    return blocks


def read_exceptions(file: Path) -> tuple[dict[str, str], list[str]]:
    """The listed exceptions (``path::qualname`` -> reason) and the problems of the file's lines."""
    exceptions: dict[str, str] = {}
    problems: list[str] = []
    if not file.exists():
        return exceptions, problems
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        key, _, reason = text.partition(" ")
        if "::" not in key or not reason.strip():
            problems.append(f"{file.name}:{number}: expected 'path::qualname  reason', got {line.strip()!r}")
        elif key in exceptions:
            problems.append(f"{file.name}:{number}: {key} is listed twice")
        else:
            exceptions[key] = reason.strip()
    return exceptions, problems


def check(root: Path, exceptions_file: Path, limit: int = LIMIT) -> list[str]:
    """The problems found: blocks over ``limit`` not listed, and listed exceptions that are stale or malformed."""
    exceptions, problems = read_exceptions(exceptions_file)
    measured: dict[str, Block] = {}
    for block in measure(root):
        # two definitions with one name (e.g. a property's getter and setter): the more complex one counts
        if block.key not in measured or block.complexity > measured[block.key].complexity:
            measured[block.key] = block
    for key, block in sorted(measured.items()):
        if block.complexity > limit and key not in exceptions:
            problems.append(
                f"{block.path}:{block.lineno}: {block.qualname} has complexity {block.complexity} > {limit}: "
                f"split it, or list it in {exceptions_file.name} with the reason"
            )
    for key in sorted(exceptions):
        listed = measured.get(key)
        if listed is None:
            problems.append(f"{exceptions_file.name}: {key} is listed but no longer exists: remove it from the list")
        elif listed.complexity <= limit:
            problems.append(
                f"{exceptions_file.name}: {key} is listed but its complexity is {listed.complexity} <= {limit}: "
                "remove it from the list"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    """Run the check; print each problem and return 1 if there is any, else print a summary and return 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=REPOSITORY, help="the package's folder (default: this checkout)")
    parser.add_argument("--exceptions", type=Path, default=EXCEPTIONS, help="the listed exceptions")
    parser.add_argument(
        "--limit", type=int, default=LIMIT, help="the largest complexity allowed (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    problems = check(args.root, args.exceptions, args.limit)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"complexity: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"complexity: no function over {args.limit} outside {args.exceptions.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
