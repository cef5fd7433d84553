"""Fail on any import cycle between unihub's modules, listing each with the lines that close it.

``lint-imports`` checks the layers (pyproject.toml, ``[tool.importlinter]``), but a layer contract cannot see
a cycle between two modules of one layer (``readers.cache`` <-> ``readers.local_disk_cache``). This walks
grimp's graph of every import, function-level ones included (an import inside a function is still a
dependency; only those under ``if TYPE_CHECKING:`` are left out, as they never run) and reports each
strongly connected group of modules. The root ``unihub/__init__.py`` (it re-exports the public API from
every layer), tests/, benchmarks/ and scripts/ are outside the check.

    .venv/bin/python scripts/import_cycles.py            # exit 0: no cycle; 1: each cycle listed
    .venv/bin/python scripts/import_cycles.py --package other_package
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping

import grimp

OUTSIDE = ("tests", "benchmarks", "scripts")


def import_graph(package: str) -> dict[str, set[str]]:
    """``{module: modules it imports}`` over ``package``'s own modules, without the root and OUTSIDE."""
    graph = grimp.build_graph(package, cache_dir=None, exclude_type_checking_imports=True)
    left_out = tuple(f"{package}.{name}" for name in OUTSIDE)
    modules = {m for m in graph.modules if m != package and not m.startswith(left_out)}
    return {m: graph.find_modules_directly_imported_by(m) & modules for m in modules}


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (or one importing itself), each sorted;
    Tarjan's algorithm, iterative so that a deep import chain cannot overflow the stack."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1 or node in graph[node]:
                    found.append(sorted(group))
    return sorted(found)


def describe(package: str, group: list[str]) -> str:
    """One cycle: its modules, then each import between them with its line."""
    graph = grimp.build_graph(package, cache_dir=None, exclude_type_checking_imports=True)
    members = set(group)
    lines = [f"cycle of {len(group)} modules: {', '.join(group)}"]
    for importer in group:
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & members):
            for detail in graph.get_import_details(importer=importer, imported=imported):
                lines.append(f"    {importer}:{detail['line_number']} -> {imported}   {detail['line_contents']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="unihub", help="the package to check (default: unihub)")
    args = parser.parse_args(argv)
    found = cycles(import_graph(args.package))
    for group in found:
        print(describe(args.package, group))
    print(f"{len(found)} import cycle(s) in {args.package}" if found else f"no import cycle in {args.package}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
