"""The forked engine (``convert(workers=N)``): tasks in N forked worker processes on this machine."""

from __future__ import annotations

from unihub.converters.engines import ENGINES, Engine, OnDone, Wrap
from unihub.converters.tasks import TaskPlan, TaskResult, file_slices, run_task
from unihub.formats.base import ForeignFormat, frozen_for_fork, process_pool


@ENGINES.register("forked")
class ForkedEngine(Engine):
    """A few slices per worker, so that workers finish together; results collected in task order.

    Ctrl-C or a failing task cancels what has not started and waits for the running workers to
    exit before the error is raised, so the caller can remove the staging area without a worker
    writing into it afterwards. The workers die with this process (:mod:`unihub.runtime.lifeline`).
    """

    name = "forked"

    def run(self, plan: TaskPlan, files: list[str], *, source: ForeignFormat | None = None,
            wrap: Wrap | None = None, on_done: OnDone | None = None) -> list[TaskResult]:
        import unihub.formats.builtin  # noqa: F401  (imported once here, not in every forked worker)
        import unihub.store.writer  # noqa: F401  (as above: once here, not in every forked worker)

        slices = file_slices(files, self.workers * 4)
        pool = process_pool(self.workers)
        results = []
        try:
            with frozen_for_fork():  # the workers start at the first submit
                futures = [pool.submit(run_task, plan, index, part) for index, part in enumerate(slices)]
            for part, future in zip(slices, futures):
                results.append(future.result())
                if on_done is not None:
                    on_done(results[-1], part)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return results
