"""Engines: where a conversion's tasks run. The pipeline (:mod:`unihub.converters.pipeline`) plans
slices of the input files, an engine runs :func:`~unihub.converters.tasks.run_task` on them, and the
pipeline commits once; engines differ only in where the tasks run.

Each engine is one module here that registers its class in :data:`ENGINES` (``inprocess``,
``forked``, ``spark``): adding an engine is one new module, imported by :func:`engine_for`.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from unihub.converters.tasks import TaskPlan, TaskResult
from unihub.formats.foreign import ForeignFormat
from unihub.registry import Registry

#: ``wrap(source, batches)``: watches a task's batches in this process (progress)
Wrap = Callable[[ForeignFormat, Iterator[Any]], Iterator[Any]]
#: ``on_done(result, files)``: in the driver after each task that ran elsewhere (not watched by ``wrap``)
OnDone = Callable[[TaskResult, list[str]], None]

_MODULES = ("inprocess", "forked", "spark")


class Engine(ABC):
    """Runs conversion tasks; a context manager that releases what it started (a Spark session)."""

    name: ClassVar[str] = ""

    def __init__(self, *, workers: int = 1, master: str = "local[2]", spark: Any = None) -> None:
        self.workers, self.master, self.spark = workers, master, spark

    @abstractmethod
    def run(self, plan: TaskPlan, files: list[str], *, source: ForeignFormat | None = None,
            wrap: Wrap | None = None, on_done: OnDone | None = None) -> list[TaskResult]:
        """Run tasks over contiguous slices of ``files`` (task ``i`` gets the i-th slice); the results in
        task order. ``source`` (the driver's reader) and ``wrap`` serve engines that run in this process.
        A failed task raises its own error, after every task of this run has stopped."""

    def close(self) -> None:
        """Release what the engine started (nothing, unless it started something)."""
        return None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


ENGINES: Registry[type[Engine]] = Registry("engine")


def engine_for(engine: str, *, workers: int, files: list[str], master: str = "local[2]",
               spark: Any = None) -> Engine:
    """The engine to run a conversion with: ``'local'`` is forked workers for ``workers`` > 1 and
    several input files, else this process; other names are looked up in :data:`ENGINES`."""
    for module in _MODULES:
        importlib.import_module(f"{__name__}.{module}")
    if engine == "local":
        engine = "forked" if workers > 1 and len(files) > 1 else "inprocess"
    return ENGINES.get(engine)(workers=workers, master=master, spark=spark)
