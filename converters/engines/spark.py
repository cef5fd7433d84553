"""The Spark engine: one Spark task per slice of the input files, on executors of a cluster.

The driver ships absolute paths and URLs only (executors run in their own working directory)
and how it reaches remote stores (storage options, URL queries, the ``AWS_*`` environment:
:mod:`unihub.fs.remote_context`), and a session unihub starts runs its executors' Python
workers with the driver's interpreter and unihub importable, so no ``PYSPARK_PYTHON`` is needed.
A task attempt is idempotent (it replaces what an earlier attempt of the same task left), and the
error a failing task raised reaches the caller as that error (its unihub class, message and
attributes: :mod:`unihub.converters.task_errors`), not as Spark's stack trace or a retry's.

A job in which no task runs for ``UNIHUB_SPARK_STALL_TIMEOUT`` seconds (default 120; ``unihub convert
--spark-stall-timeout``) is cancelled with :class:`~unihub.errors.SparkStalledError`: a standalone cluster
that lost all its workers would otherwise keep the job waiting for executors forever, silently. The
CLI sends the JVM's own output (Spark's log, and in local mode its executors') to a log file unless
``--verbose`` (:func:`console`), so a failed task is the one ``unihub: error:`` line.

Speculative execution (``spark.speculation=true``) is refused up front
(:class:`~unihub.errors.SparkSettingError`): two attempts of one task would run at once and write
the same part names, one deleting the other's files; and a losing attempt, which Spark stops
only some time after the job has ended, could still add a file to the committed dataset.
"""

from __future__ import annotations

import contextvars
import os
import re
import signal
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import unihub.errors
from unihub.converters import task_errors
from unihub.converters.engines import ENGINES, Engine, OnDone, Wrap
from unihub.converters.tasks import TaskPlan, TaskResult, file_slices, run_task
from unihub.dependencies import require
from unihub.errors import FormatError, InvalidArgumentError, SparkSettingError, SparkStalledError
from unihub.formats.base import ForeignFormat, SchemaOutgrown
from unihub.fs import remote_context
from unihub.runtime import interrupts

#: ``unihub.errors.FormatError: message`` or ``unihub.formats.base.SchemaOutgrown: reason`` in a
#: Python traceback that Spark passes on as text
_PYTHON_ERROR = re.compile(r"^(?:[\w.]*\.)?(?P<name>\w*(?:Error|SchemaOutgrown)): (?P<message>.*)$")

#: The folder that holds the ``unihub`` package, which executors' Python workers must be able to import.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: seconds a job may go with no task running before it is given up (see the module docstring); long enough
#: for executors to start on a loaded cluster, short enough that a lost cluster is named within minutes
STALL_TIMEOUT_S = 120.0
STALL_TIMEOUT_ENV = "UNIHUB_SPARK_STALL_TIMEOUT"
#: where the CLI sends the driver JVM's output while it starts (None: to the terminal); see :func:`console`
_JVM_LOG: contextvars.ContextVar[str | None] = contextvars.ContextVar("unihub_spark_jvm_log", default=None)
_Result = TypeVar("_Result")


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
        context = remote_context.capture()  # the driver's way to its stores, for the executors
        try:
            results: list[TaskResult] = run_job(sc, f"unihub convert {plan.src}", lambda: sc.parallelize(
                slices, numSlices=len(slices)).mapPartitionsWithIndex(
                lambda index, part: spark_task(plan, context, index, part)).collect())
        except SparkStalledError:
            raise
        except Exception as exc:
            raise task_error(exc, plan.src) from None
        if on_done is not None:
            for result, part in zip(results, slices):
                on_done(result, part)
        return results

    def close(self) -> None:
        if self._created:
            with interrupts.deferred():  # a Ctrl-C inside py4j's call printed py4j's tracebacks; it waits
                self.session.stop()
            self._created = False


def stall_timeout() -> float | None:
    """Seconds a job may run no task before it is given up: ``UNIHUB_SPARK_STALL_TIMEOUT`` (``0`` or
    ``none``: never), else :data:`STALL_TIMEOUT_S`."""
    text = os.environ.get(STALL_TIMEOUT_ENV, "").strip()
    return parse_stall_timeout(text, STALL_TIMEOUT_ENV) if text else STALL_TIMEOUT_S


def parse_stall_timeout(text: str, where: str) -> float | None:
    """Seconds from ``text`` (``0`` or ``none``: None, never give up); an InvalidArgumentError naming ``where``
    (the variable or option) for anything else. The CLI's ``--spark-stall-timeout`` is checked here too."""
    if text.strip().lower() in ("none", "0"):
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:  # NaN and negatives too
        raise InvalidArgumentError(f"{where}={text.strip()!r} is not a number of seconds (> 0, or 0/none: "
                                   "never give up)")
    return seconds


def run_job(sc: Any, description: str, action: Callable[[], _Result]) -> _Result:
    """``action()``, a Spark action, run as a job group of its own that is cancelled when it fails, and
    given up with :class:`~unihub.errors.SparkStalledError` when no task of it runs for :func:`stall_timeout`
    seconds (a watcher thread polls Spark's status tracker).

    The action runs in a thread of its own while this one waits: a Ctrl-C then lands here, not inside
    py4j's blocking call (which printed py4j's tracebacks and left the job running), and the job is
    cancelled and its tasks ended before the KeyboardInterrupt goes on, so that none writes into a staging
    area the caller then removes."""
    group = f"unihub-{uuid.uuid4().hex[:12]}"
    outcome: dict[str, Any] = {}

    def submit() -> None:
        try:
            sc.setJobGroup(group, description, interruptOnCancel=True)  # per thread (PySpark pins threads)
            outcome["result"] = action()
        except BaseException as exc:  # noqa: BLE001 (handed to the waiting thread)
            outcome["error"] = exc

    watcher = _StallWatcher(sc, group, stall_timeout(), description)
    # PySpark's thread: it takes the caller's local properties (scheduler pool, job tags) to the job with it
    runner = require("pyspark").InheritableThread(submit, name="unihub-spark-job", daemon=True)
    watcher.start()
    try:
        runner.start()
        try:
            while runner.is_alive():
                runner.join(0.1)
        except BaseException:  # Ctrl-C: the job cancelled, and its end awaited, before anything is removed
            sc.cancelJobGroup(group)
            runner.join()
            raise
        if "error" in outcome:
            sc.cancelJobGroup(group)
            if watcher.stalled is not None:
                raise watcher.stalled from None
            raise outcome["error"]
        return cast(_Result, outcome["result"])
    finally:
        watcher.stop()


class _StallWatcher(threading.Thread):
    """Cancels job group ``group`` when none of its tasks has run for ``timeout`` seconds: no task active
    and no task ended since the last look (a task that runs long is progress; executors that never come,
    or were all lost, are not). ``stalled`` then holds the error to raise."""

    def __init__(self, sc: Any, group: str, timeout: float | None, description: str) -> None:
        super().__init__(name="unihub-spark-stall-watcher", daemon=True)
        self.sc, self.group, self.timeout, self.description = sc, group, timeout, description
        self.stalled: SparkStalledError | None = None
        self._done = threading.Event()

    def run(self) -> None:
        if self.timeout is None:
            return
        last_progress, seen = time.monotonic(), None
        while not self._done.wait(min(1.0, self.timeout / 10)):
            try:
                active, ended = self._tasks()
            except Exception:  # the context is stopping: the job's own error says why
                return
            if active or ended != seen:
                last_progress, seen = time.monotonic(), ended
            elif time.monotonic() - last_progress > self.timeout:
                self.stalled = SparkStalledError(
                    f"{self.description}: no Spark task ran for {self.timeout:g} s on {self.sc.master} "
                    f"({self._executors()}); the cluster lost its workers or has no free cores for this job, "
                    f"so it was cancelled (wait longer: --spark-stall-timeout SECONDS or {STALL_TIMEOUT_ENV})")
                self.sc.cancelJobGroup(self.group)
                return

    def _tasks(self) -> tuple[int, int]:
        """Tasks of the group running now, and ended so far (completed or failed)."""
        tracker = self.sc.statusTracker()
        active = ended = 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    active += stage.numActiveTasks
                    ended += stage.numCompletedTasks + stage.numFailedTasks
        return active, ended

    def _executors(self) -> str:
        try:  # the driver is listed among the block managers too
            count = int(self.sc._jsc.sc().getExecutorMemoryStatus().size()) - 1
        except Exception:
            return "executors unknown"
        if self.sc.master.startswith("local"):
            return "local mode"
        return f"{count} executor{'s' if count != 1 else ''} registered"

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=5)


@contextmanager
def console(verbose: bool) -> Iterator[str | None]:
    """For the CLI: unless ``verbose``, a Spark session started inside sends its JVM's output (Spark's log
    at WARN, a failed task's stack traces, and PySpark's pandas warning) to a temporary log file, so that
    an error is one ``unihub: error:`` line; yields that file's path (None when verbose). The file is
    removed when the block ends without an error and kept, for the caller to name, when it raises."""
    if verbose:
        yield None
        return
    handle, path = tempfile.mkstemp(prefix="unihub-spark-", suffix=".log")
    os.close(handle)
    token = _JVM_LOG.set(path)
    try:
        yield path
    except BaseException:
        if os.path.getsize(path) == 0:
            os.unlink(path)
        raise
    else:
        os.unlink(path)
    finally:
        _JVM_LOG.reset(token)


@contextmanager
def _jvm_output() -> Iterator[None]:
    """While a session starts: file descriptors 1 and 2 (which the JVM, and the Python workers it forks,
    inherit) to the :func:`console` log, when there is one; this process's own are put back after."""
    path = _JVM_LOG.get()
    if path is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    log = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, original in zip((1, 2), saved):
            os.dup2(original, fd)
            os.close(original)
        os.close(log)


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

    with _jvm_output():
        sql = require("pyspark.sql", extra="spark", purpose="the Spark conversion engine")
    running = sql.SparkSession.getActiveSession()
    if running is None and require("pyspark").SparkContext._active_spark_context is not None:
        running = sql.SparkSession.builder.getOrCreate()  # this process's context, started elsewhere
    if running is not None:  # someone else's session: use it, leave it running
        return refuse_speculation(running, created=False), False
    builder = sql.SparkSession.builder.master(master).appName("unihub-convert")
    for key, value in executor_settings().items():
        builder = builder.config(key, value)
    with python_for_executors(), _jvm_output(), _own_sigint():
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
def _own_sigint() -> Iterator[None]:
    """While a SparkContext starts: the SIGINT handler in place before it is put back after (PySpark installs
    its own, which calls into the JVM from inside a blocked call: a Ctrl-C of the ``unihub`` command printed
    py4j's tracebacks instead of its one line, and did not cancel the job)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        if before is not None:
            signal.signal(signal.SIGINT, before)


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
    settings = {"spark.ui.showConsoleProgress": "false"}
    if not os.environ.get("PYSPARK_PYTHON"):
        settings["spark.pyspark.python"] = sys.executable  # for spark-submit; PySpark: python_for_executors
    package_parent = os.path.dirname(_PACKAGE_DIR)
    paths = [package_parent, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    settings["spark.executorEnv.PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return settings


def task_error(exc: BaseException, src: str) -> BaseException:
    """The error a failed task raised, out of Spark's text: the same unihub error class and message
    (a FormatError when it is another kind), or :class:`SchemaOutgrown` for a single pass to start over."""
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
