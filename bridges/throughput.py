"""``reader_throughput``: Petastorm's ``petastorm-throughput.py`` benchmark, on unihub's readers.

Opens ``make_reader(dataset_url, num_epochs=None, ...)`` and times ``measure_cycles_count``
reads after ``warmup_cycles_count`` untimed ones; one cycle reads one row (``next(reader)``,
or the next element of ``make_petastorm_dataset(reader)`` with ``read_method='tf'``). The
result has Petastorm's fields: ``time_mean`` (seconds per row), ``samples_per_second``,
``memory_info`` (``rss``, ``vms`` and ``peak_rss`` bytes of the measuring process) and ``cpu``
(its CPU time over the measured wall time, in percent of one core); with a local-disk cache
(``reader_extra_args={"cache_type": "local-disk", ...}``) also ``result.cache_stats``, the cache's
hits, misses and bytes over the run (``Reader.cache_stats``). As Petastorm's, it runs
in a fresh process unless ``spawn_new_process=False``, so that the memory figures are the
reader's alone.

    from unihub import reader_throughput
    result = reader_throughput("/data/train", field_regex=["image", "label"], measure_cycles_count=2000)
    print(result.samples_per_second)
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections import namedtuple
from collections.abc import Callable, Iterator, Sequence
from enum import Enum
from functools import partial
from typing import Any

from unihub.errors import UnihubError
from unihub.readers.reader import make_reader
from unihub.runtime.progress import is_progress_bar_enabled


class BenchmarkResult(namedtuple("BenchmarkResult", ["time_mean", "samples_per_second", "memory_info", "cpu"])):
    """Petastorm's four fields (a tuple of them, as Petastorm's), and ``cache_stats``: the local-disk
    cache's counts over the run, ``{"reader": ..., "node": ...}`` as ``Reader.cache_stats`` gives
    them, or None without that cache (an attribute, not a fifth field)."""

    cache_stats: dict[str, Any] | None = None

MemoryInfo = namedtuple("MemoryInfo", ["rss", "vms", "peak_rss"])


class WorkerPoolType(Enum):
    """The reader's worker pool: threads, processes, or none (Petastorm's ``dummy``)."""

    THREAD = "thread"
    PROCESS = "process"
    NONE = "dummy"

    def __str__(self) -> str:
        return self.value


class ReadMethod(Enum):
    """``python``: ``next(reader)``; ``tf``: the next element of ``make_petastorm_dataset(reader)``."""

    TF = "tf"
    PYTHON = "python"

    def __str__(self) -> str:
        return self.value


def reader_throughput(dataset_url: str, field_regex: Sequence[str] | None = None, warmup_cycles_count: int = 300,
                      measure_cycles_count: int = 1000, pool_type: WorkerPoolType | str = WorkerPoolType.THREAD,
                      loaders_count: int = 3, profile_threads: bool = False,
                      read_method: ReadMethod | str = ReadMethod.PYTHON, shuffling_queue_size: int = 500,
                      min_after_dequeue: int = 400, reader_extra_args: dict[str, Any] | None = None,
                      spawn_new_process: bool = True, progress: bool = False) -> BenchmarkResult:
    """Measure rows per second of ``make_reader`` with Petastorm's benchmark arguments.

    ``field_regex``: the fields to read (names or full-match regexes; all when None);
    ``pool_type``/``loaders_count``: the reader's ``reader_pool_type``/``workers_count``;
    ``reader_extra_args``: more ``make_reader`` arguments. With ``read_method='tf'`` rows go
    through a ``tf.data`` shuffle buffer of ``shuffling_queue_size`` rows (tf.data has no
    ``min_after_dequeue``; it is accepted and unused, as is ``profile_threads``).
    ``progress=True`` writes a progress line to stderr about once a second (unless progress is
    switched off: :func:`unihub.runtime.progress.disable_progress_bar`).
    """
    pool_type, read_method = WorkerPoolType(str(pool_type)), ReadMethod(str(read_method))
    for name, value, least in (("warmup_cycles_count", warmup_cycles_count, 0),
                               ("measure_cycles_count", measure_cycles_count, 1), ("loaders_count", loaders_count, 1)):
        if not isinstance(value, int) or value < least:
            raise UnihubError(f"{name} must be an integer >= {least}, got {value!r}")
    measure = partial(_measure, dataset_url=os.fspath(dataset_url),
                      field_regex=list(field_regex) if field_regex else None,
                      warmup_cycles_count=warmup_cycles_count, measure_cycles_count=measure_cycles_count,
                      pool_type=pool_type, loaders_count=loaders_count, read_method=read_method,
                      shuffling_queue_size=shuffling_queue_size, reader_extra_args=dict(reader_extra_args or {}),
                      progress=bool(progress) and is_progress_bar_enabled())  # decided here: a child has its own switch
    if not spawn_new_process:
        return measure()
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # a fresh interpreter (not a fork of this one): its memory is the reader's alone
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as executor:
        return executor.submit(measure).result()


def _measure(dataset_url: str, field_regex: list[str] | None, warmup_cycles_count: int, measure_cycles_count: int,
             pool_type: WorkerPoolType, loaders_count: int, read_method: ReadMethod, shuffling_queue_size: int,
             reader_extra_args: dict[str, Any], progress: bool) -> BenchmarkResult:
    reader_args = {"reader_pool_type": str(pool_type), "workers_count": loaders_count, **reader_extra_args}
    if field_regex and "schema_fields" not in reader_args:
        reader_args["schema_fields"] = field_regex
    reader_args.setdefault("num_epochs", None)
    report = _Progress(warmup_cycles_count, measure_cycles_count) if progress else None
    with make_reader(dataset_url, **reader_args) as reader:
        if read_method is ReadMethod.PYTHON:
            result = _time_warmup_and_work(lambda: next(reader), warmup_cycles_count, measure_cycles_count, report)
        else:
            rows = _tf_rows(reader, shuffling_queue_size)
            result = _time_warmup_and_work(lambda: next(rows), warmup_cycles_count, measure_cycles_count, report)
        result.cache_stats = reader.cache_stats  # before the with-block's end, which may remove the cache
    return result


def _tf_rows(reader: Any, shuffling_queue_size: int) -> Iterator[Any]:
    from unihub.bridges.tf.dataset import make_petastorm_dataset  # start-up cost: 16 ms, for read_method="tf" only

    dataset = make_petastorm_dataset(reader)
    if shuffling_queue_size:
        dataset = dataset.shuffle(shuffling_queue_size)
    return iter(dataset)


def _time_warmup_and_work(work: Callable[[], Any], warmup: int, measure: int,
                          report: _Progress | None) -> BenchmarkResult:
    for done in range(warmup):
        work()
        if report is not None:
            report.update("warmup", done + 1)
    cpu_start, wall_start = _cpu_seconds(), time.perf_counter()
    for done in range(measure):
        work()
        if report is not None:
            report.update("measure", done + 1, wall_start)
    wall = time.perf_counter() - wall_start
    cpu = 100.0 * (_cpu_seconds() - cpu_start) / wall if wall > 0 else 0.0
    if report is not None:
        report.close(measure, wall)
    time_mean = wall / measure
    return BenchmarkResult(time_mean=time_mean, samples_per_second=1.0 / time_mean if time_mean > 0 else float("inf"),
                           memory_info=memory_info(), cpu=cpu)


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def memory_info() -> MemoryInfo:
    """This process's resident and virtual memory now, and its peak resident memory, in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak *= 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    try:
        with open("/proc/self/statm") as handle:
            vms_pages, rss_pages = (int(v) for v in handle.read().split()[:2])
        page = os.sysconf("SC_PAGE_SIZE")
        rss = rss_pages * page
        return MemoryInfo(rss=rss, vms=vms_pages * page, peak_rss=max(peak, rss))  # ru_maxrss lags a little
    except (OSError, ValueError):
        return MemoryInfo(rss=peak, vms=0, peak_rss=peak)


class _Progress:
    """``warmup 120/300 rows`` / ``measuring 450/1000 rows, 1,234 rows/s`` on stderr, about once a second."""

    def __init__(self, warmup: int, measure: int, period: float = 1.0) -> None:
        self.totals = {"warmup": warmup, "measure": measure}
        self.period = period
        self.last = time.perf_counter()
        self.tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
        self.shown = False

    def update(self, phase: str, done: int, start: float | None = None) -> None:
        now = time.perf_counter()
        if now - self.last < self.period:
            return
        self.last = now
        text = f"{'warmup' if phase == 'warmup' else 'measuring'} {done:,}/{self.totals[phase]:,} rows"
        if start is not None and now > start:
            text += f", {done / (now - start):,.0f} rows/s"
        sys.stderr.write(f"\r{text}   " if self.tty else text + "\n")
        sys.stderr.flush()
        self.shown = True

    def close(self, measured: int, seconds: float) -> None:
        """The last line: what was measured, in how long."""
        end = "\r" if self.tty and self.shown else ""
        sys.stderr.write(f"{end}measured {measured:,} rows in {seconds:,.2f} s after {self.totals['warmup']:,} "
                         "warmup rows   \n")
        sys.stderr.flush()
