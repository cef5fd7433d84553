"""The Spark engine: one Spark task per slice of the input files, on executors of a cluster.

The driver ships absolute paths and URLs only (executors run in their own working directory)
and how it reaches remote stores (storage options, URL queries, the ``AWS_*`` environment:
:mod:`unihub.formats.remote_context`), and a session unihub starts runs its executors' Python
workers with the driver's interpreter and unihub importable, so no ``PYSPARK_PYTHON`` is needed.
A task attempt is idempotent (it replaces what an earlier attempt of the same task left), and the
error a failing task raised reaches the caller as that error (its unihub class, message and
attributes: :mod:`unihub.converters.task_errors`), not as Spark's stack trace or a retry's.

Speculative execution (``spark.speculation=true``) is refused up front
(:class:`~unihub.errors.SparkSettingError`): two attempts of one task would run at once and write
the same part names, one deleting the other's files; and a losing attempt, which Spark stops
only some time after the job has ended, could still add a file to the committed dataset.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from unihub.converters import task_errors
from unihub.converters.engines import ENGINES, Engine, OnDone, Wrap
from unihub.converters.tasks import TaskPlan, TaskResult, file_slices, run_task
from unihub.errors import FormatError, SparkSettingError
from unihub.formats import remote_context
from unihub.formats.foreign import ForeignFormat, SchemaOutgrown

#: ``unihub.errors.FormatError: message`` or ``unihub.formats.foreign.SchemaOutgrown: reason`` in a
#: Python traceback that Spark passes on as text
_PYTHON_ERROR = re.compile(r"^(?:[\w.]*\.)?(?P<name>\w*(?:Error|SchemaOutgrown)): (?P<message>.*)$")


@ENGINES.register("spark")
class SparkEngine(Engine):
    """``spark`` is an existing SparkSession (left running); without one the session this process
    already has is used, else one is started on ``master`` and stopped by :meth:`close`."""

    name = "spark"

    def __init__(self, *, workers: int = 1, master: str = "local[2]", spark: Any = None) -> None:
        super().__init__(workers=workers, master=master, spark=spark)
        self.session, self._created = session(spark, master)

    def run(self, plan: TaskPlan, files: list[str], *, source: ForeignFormat | None = None,
            wrap: Wrap | None = None, on_done: OnDone | None = None) -> list[TaskResult]:
        if not files:
            return []
        sc = self.session.sparkContext
        slices = file_slices(files, sc.defaultParallelism * 2)
        group = f"unihub-convert-{uuid.uuid4().hex[:12]}"
        context = remote_context.capture()  # the driver's way to its stores, for the executors
        sc.setJobGroup(group, f"unihub convert {plan.src}", interruptOnCancel=True)
        try:
            results: list[TaskResult] = sc.parallelize(slices, numSlices=len(slices)).mapPartitionsWithIndex(
                lambda index, part: spark_task(plan, context, index, part)).collect()
        except Exception as exc:
            sc.cancelJobGroup(group)
            raise task_error(exc, plan.src) from None
        if on_done is not None:
            for result, part in zip(results, slices):
                on_done(result, part)
        return results

    def close(self) -> None:
        if self._created:
            self.session.stop()
            self._created = False


def spark_task(plan: TaskPlan, context: remote_context.RemoteContext, index: int,
               part: Iterator[list[str]]) -> list[TaskResult]:
    """Task ``index`` on an executor: its slices converted with the driver's way to its stores; a unihub
    error leaves as a carrier, so that the driver raises it whole (:func:`task_error`)."""
    try:
        with remote_context.restored(context):
            return [run_task(plan, index, files) for files in part]
    except BaseException as exc:
        carrier = task_errors.carrier(exc)
        if carrier is None:
            raise
        raise carrier from exc


def session(spark: Any, master: str) -> tuple[Any, bool]:
    """``(session, created)``: ``spark``, else this process's running session, else a new one on ``master``
    whose executors run this interpreter with unihub importable."""
    if spark is not None:
        return refuse_speculation(spark, created=False), False
    from unihub.dependencies import require

    sql = require("pyspark.sql", extra="spark", purpose="the Spark conversion engine")
    running = sql.SparkSession.getActiveSession()
    if running is None and require("pyspark").SparkContext._active_spark_context is not None:
        running = sql.SparkSession.builder.getOrCreate()  # this process's context, started elsewhere
    if running is not None:  # someone else's session: use it, leave it running
        return refuse_speculation(running, created=False), False
    builder = sql.SparkSession.builder.master(master).appName("unihub-convert")
    for key, value in executor_settings().items():
        builder = builder.config(key, value)
    with python_for_executors():
        started = builder.getOrCreate()
    return refuse_speculation(started, created=True), True


def refuse_speculation(spark: Any, *, created: bool) -> Any:
    """``spark``, unless it runs speculative attempts (see the module docstring): then a
    :class:`~unihub.errors.SparkSettingError`, after stopping the session if unihub ``created`` it."""
    if spark.sparkContext.getConf().get("spark.speculation", "false").strip().lower() != "true":
        return spark
    if created:
        spark.stop()
    raise SparkSettingError(
        "spark.speculation=true: a conversion on Spark writes each task's part files straight into the "
        "target's staging area, and a speculative second attempt of a task would write and delete the "
        "same files while the first still runs (a losing attempt may even write after the commit); "
        "run it with spark.speculation=false (Spark's default)")


@contextmanager
def python_for_executors() -> Iterator[None]:
    """While a SparkContext starts: ``PYSPARK_PYTHON`` set to this interpreter unless the user set it
    (PySpark takes its executors' Python from that variable alone, when the context starts)."""
    if os.environ.get("PYSPARK_PYTHON"):
        yield
        return
    os.environ["PYSPARK_PYTHON"] = sys.executable
    try:
        yield
    finally:
        os.environ.pop("PYSPARK_PYTHON", None)


def executor_settings() -> dict[str, str]:
    """Spark settings that run executors' Python workers with this interpreter and unihub importable
    (what the user set in the environment wins)."""
    import unihub

    settings = {"spark.ui.showConsoleProgress": "false"}
    if not os.environ.get("PYSPARK_PYTHON"):
        settings["spark.pyspark.python"] = sys.executable  # for spark-submit; PySpark: python_for_executors
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(unihub.__file__)))
    paths = [package_parent, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    settings["spark.executorEnv.PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return settings


def task_error(exc: BaseException, src: str) -> BaseException:
    """The error a failed task raised, out of Spark's text: the same unihub error class and message
    (a FormatError when it is another kind), or :class:`SchemaOutgrown` for a single pass to start over."""
    import unihub.errors

    text = str(exc)
    whole = task_errors.carried(text)  # the task's own error, as it was raised
    if whole is not None:
        return whole
    for line in text.splitlines():
        found = _PYTHON_ERROR.match(line.strip())
        if found is None or found["name"].startswith(("Py4J", "Python")):
            continue
        name, message = found["name"], found["message"]
        if name == "SchemaOutgrown":
            return SchemaOutgrown(message)
        kind = getattr(unihub.errors, name, None)
        if isinstance(kind, type) and issubclass(kind, unihub.errors.UnihubError):
            error = kind.__new__(kind)
            Exception.__init__(error, message)
            for attribute in ("path", "offset", "field", "row", "url"):
                if not hasattr(error, attribute):
                    setattr(error, attribute, None)
            return error
        return FormatError(f"Spark conversion of {src} failed: {name}: {message}", path=src)
    first = text.splitlines()[0] if text else type(exc).__name__
    return FormatError(f"Spark conversion of {src} failed: {first}", path=src)


def task_error_text(exc: BaseException) -> str:
    """The Python exception line of a failed task, out of Spark's Java stack trace."""
    text = str(exc)
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("unihub.errors.") or "Error: " in stripped and not stripped.startswith(
                ("py4j", "org.apache", "java.", "at ")):
            return stripped
    return text.splitlines()[0] if text else type(exc).__name__
