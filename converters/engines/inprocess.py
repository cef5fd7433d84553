"""The in-process engine: one task over every input file, in this process, reading ahead in a thread
where that pays (see :attr:`~unihub.converters.tasks.TaskPlan.read_ahead`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from unihub.converters.engines import ENGINES, Engine, OnDone, Wrap
from unihub.converters.readahead import read_ahead
from unihub.converters.tasks import TaskPlan, TaskResult, run_task
from unihub.formats.base import ForeignFormat
from unihub.runtime.memory import memory_budget


@ENGINES.register("inprocess")
class InProcessEngine(Engine):
    """Reads with the driver's own source (nothing re-listed); the source reads its next batches while
    the writer writes this one (both release the GIL)."""

    name = "inprocess"

    def run(self, plan: TaskPlan, files: list[str], *, source: ForeignFormat | None = None,
            wrap: Wrap | None = None, on_done: OnDone | None = None) -> list[TaskResult]:
        def watched(task_source: ForeignFormat, batches: Iterator[Any]) -> Iterator[Any]:
            ahead = (read_ahead(batches, max_bytes=memory_budget().read_ahead_bytes) if plan.read_ahead
                     else iter(batches))
            try:
                yield from (wrap(task_source, ahead) if wrap is not None else ahead)
            finally:
                getattr(ahead, "close", lambda: None)()  # a generator: stops the reading thread

        return [run_task(plan, 0, files, source=source, wrap=watched)]  # ``wrap`` counts its rows, not on_done
