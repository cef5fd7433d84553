"""Engines: where a conversion's tasks run. The pipeline (:mod:`unihub.converters.pipeline`) plans
slices of the input files, an engine runs :func:`~unihub.converters.tasks.run_task` on them, and the
pipeline commits once; engines differ only in where the tasks run.

Each engine is one module here that registers its class in :data:`ENGINES` (``inprocess``,
``forked``, ``spark``): adding an engine is one new module, imported by :func:`engine_for`.
"""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from unihub.converters.tasks import TaskPlan, TaskResult
from unihub.errors import InvalidArgumentError
from unihub.formats.base import ForeignFormat
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

#: MiB of input each forked worker must have to read before workers pay for their start (a fork, pyarrow's
#: first use, one more Parquet writer) and for the result's extra part files. On 2 cores, ~70 MB of
#: 64x64 JPEG rows (20k) converted slower with 2 workers than with 1, and 256 MB of TFRecord 1.25-1.45x
#: faster (benchmarks/scale.py); a judgement between the two, to measure again on a quiet machine.
#: ``UNIHUB_FORK_MIN_MB`` overrides it (0: always fork when asked to)
FORK_MIN_MB = 64.0
FORK_MIN_ENV = "UNIHUB_FORK_MIN_MB"


def fork_min_bytes() -> int:
    """Input bytes per forked worker below which a local conversion runs in-process (see FORK_MIN_MB)."""
    text = os.environ.get(FORK_MIN_ENV, "").strip()
    try:
        mb = float(text) if text else FORK_MIN_MB
    except ValueError:
        raise InvalidArgumentError(f"{FORK_MIN_ENV}={text!r} is not a number of MiB") from None
    if mb < 0:
        raise InvalidArgumentError(f"{FORK_MIN_ENV}={text!r} must be >= 0")
    return int(mb * 2**20)


def local_workers(workers: int, files: list[str], input_bytes: int) -> tuple[int, str | None]:
    """The workers a local conversion of ``files`` (``input_bytes`` in all) runs with: ``workers``, or 1
    where the input is too small to pay for forked workers (:func:`fork_min_bytes` each) or is
    one file; with the reason, for the result, when that is fewer than asked for."""
    if workers <= 1:
        return workers, None
    if len(files) <= 1:
        return 1, f"ran in-process, not in {workers} workers: the input is one file"
    least = fork_min_bytes()
    fit = min(workers, input_bytes // least) if least else workers
    if fit >= 2:
        return fit, None if fit == workers else f"ran in {fit} workers, not {workers}: " + _why(input_bytes, least)
    return 1, f"ran in-process, not in {workers} workers: " + _why(input_bytes, least)


def _why(input_bytes: int, least: int) -> str:
    return (f"{input_bytes / 2**20:,.0f} MiB of input is too little to pay for more (a worker pays off from "
            f"{least / 2**20:,.0f} MiB; {FORK_MIN_ENV} sets that)")


def engine_for(engine: str, *, workers: int, files: list[str], master: str = "local[2]",
               spark: Any = None) -> Engine:
    """The engine to run a conversion with: ``'local'`` is forked workers for ``workers`` > 1 and
    several input files, else this process; other names are looked up in :data:`ENGINES`."""
    for module in _MODULES:
        importlib.import_module(f"{__name__}.{module}")
    if engine == "local":
        engine = "forked" if workers > 1 and len(files) > 1 else "inprocess"
    return ENGINES.get(engine)(workers=workers, master=master, spark=spark)
