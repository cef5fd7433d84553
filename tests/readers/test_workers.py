"""Worker pools: ordered results, a bounded window, errors re-raised, prompt stop, lazy tasks."""

from __future__ import annotations

import itertools
import os
import random
import threading
import time

import pytest

from unihub.errors import UnihubError
from unihub.readers.workers import Pool

from .sample import within

POOLS = ["thread", "process", "dummy"]


class TaskFailed(RuntimeError):
    pass


def sleepy_square(task: tuple[int, float]) -> tuple[int, int]:
    index, delay = task
    time.sleep(delay)
    return index, os.getpid()


def fail_at(task: int) -> int:
    if task == 7:
        raise TaskFailed(f"task {task} failed on purpose")
    time.sleep(0.002)
    return task


def slow(task: int) -> int:
    time.sleep(0.2)
    return task


@pytest.mark.parametrize("pool_type", POOLS)
@pytest.mark.parametrize("workers", [1, 3])
def test_results_come_back_in_task_order(pool_type, workers):
    rng = random.Random(workers)
    tasks = [(i, rng.choice([0, 0, 0.001, 0.004])) for i in range(120)]
    pool = Pool(pool_type, workers)
    out = list(pool.imap(sleepy_square, tasks, window=7))
    pool.join()
    assert [i for i, _ in out] == list(range(120))
    pids = {pid for _, pid in out}
    if pool_type == "process":
        assert os.getpid() not in pids, "process pool ran tasks in the consumer"
    else:
        assert pids == {os.getpid()}


@pytest.mark.parametrize("pool_type", ["thread", "dummy"])
@pytest.mark.parametrize("window", [1, 2, 5])
def test_window_bounds_tasks_in_flight(pool_type, window):
    lock = threading.Lock()
    state = {"running": 0, "peak": 0, "submitted": 0, "consumed": 0, "ahead": 0}

    def tracked(task: int) -> int:
        with lock:
            state["running"] += 1
            state["peak"] = max(state["peak"], state["running"])
        time.sleep(random.random() * 0.003)
        with lock:
            state["running"] -= 1
        return task

    def tasks():
        for i in range(60):
            state["submitted"] += 1
            # tasks handed out but not consumed: never more than the window (+1 being handed out)
            state["ahead"] = max(state["ahead"], state["submitted"] - state["consumed"])
            yield i

    pool = Pool(pool_type, workers_count=8)
    out = []
    for result in pool.imap(tracked, tasks(), window=window):
        out.append(result)
        state["consumed"] += 1
        time.sleep(0.001)
    pool.join()
    assert out == list(range(60))
    assert 1 <= state["peak"] <= window
    assert state["ahead"] <= window + 1
    if pool_type == "thread" and window > 1:
        assert state["peak"] > 1, "tasks never ran in parallel"


@pytest.mark.parametrize("pool_type", POOLS)
def test_exception_in_task_is_reraised_and_pool_stops(pool_type):
    pool = Pool(pool_type, 3)
    consumed = []

    def consume():
        with pytest.raises(TaskFailed, match="task 7 failed on purpose") as info:
            for result in pool.imap(fail_at, itertools.count(), window=4):
                consumed.append(result)
        return info

    started = time.monotonic()
    info = within(20, consume)
    assert consumed == list(range(7)), "results before the failure are delivered in order"
    assert type(info.value) is TaskFailed
    within(20, pool.join)
    assert time.monotonic() - started < 10
    assert pool.in_flight == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("unihub-worker")]


@pytest.mark.parametrize("pool_type", POOLS)
def test_stop_mid_iteration_returns_promptly(pool_type):
    pool = Pool(pool_type, 2)
    iterator = pool.imap(slow, itertools.count(), window=8)

    def consume_some():
        return [next(iterator) for _ in range(3)]

    assert within(20, consume_some) == [0, 1, 2]
    started = time.monotonic()
    pool.stop()
    iterator.close()
    assert time.monotonic() - started < 0.15, "stop() must not wait for running or pending tasks"
    within(10, pool.join)
    assert time.monotonic() - started < 5.0
    assert pool.in_flight == 0
    with pytest.raises(StopIteration):
        next(iterator)
    assert not [t for t in threading.enumerate() if t.name.startswith("unihub-worker")]


@pytest.mark.parametrize("pool_type", POOLS)
def test_infinite_task_iterator_is_consumed_lazily(pool_type):
    pulled = []

    def tasks():
        for i in itertools.count():
            pulled.append(i)
            yield i

    pool = Pool(pool_type, 2)
    iterator = pool.imap(abs, tasks(), window=3)
    first = within(20, lambda: [next(iterator) for _ in range(10)])
    assert first == list(range(10))
    assert len(pulled) <= 10 + 3 + 1, f"pulled {len(pulled)} tasks for 10 results"
    pool.stop()
    iterator.close()
    pool.join()


def test_empty_task_list():
    for pool_type in POOLS:
        pool = Pool(pool_type, 2)
        assert list(pool.imap(abs, [], window=2)) == []
        pool.join()


def test_bad_pool_options():
    with pytest.raises(UnihubError, match="reader_pool_type"):
        Pool("fiber", 2)  # type: ignore[arg-type]
    with pytest.raises(UnihubError, match="workers_count"):
        Pool("thread", 0)


# -- join: returns once the workers have exited ----------------------------------------------------------
def stuck(task: int) -> int:
    time.sleep(120)
    return task


_CHILDREN_BEFORE: set[int] = set()


@pytest.fixture(autouse=True)
def _note_children_before() -> None:
    """The child processes alive when a test starts (a torch DataLoader's persistent workers that an
    earlier test left to the garbage collector, say): not this test's workers."""
    import multiprocessing

    _CHILDREN_BEFORE.clear()
    _CHILDREN_BEFORE.update(p.pid for p in multiprocessing.active_children())


def worker_processes() -> list:
    """The child processes this test started that are alive."""
    import multiprocessing

    return [p for p in multiprocessing.active_children() if p.is_alive() and p.pid not in _CHILDREN_BEFORE]


def exited(process) -> bool:
    """Whether ``process`` has exited, from its sentinel (``is_alive()`` reaps it, and races the pool
    executor's manager thread, which may be reaping it too: the loser sees no child, and says alive),
    or where /proc exists from its state there (a child the task forked may hold the sentinel open)."""
    from multiprocessing.connection import wait

    if wait([process.sentinel], 0):
        return True
    try:
        with open(f"/proc/{process.pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie: exited, not yet reaped
    except FileNotFoundError:
        return os.path.exists("/proc/self/stat")  # no such process (where /proc would show it)


def test_join_after_stop_returns_once_process_workers_exited():
    """Issue 12: join() after stop() returned at once, the workers still running."""
    pool = Pool("process", 2)
    iterator = pool.imap(slow, itertools.count(), window=4)
    assert within(20, lambda: next(iterator)) == 0
    workers = worker_processes()
    assert len(workers) == 2
    pool.stop()
    within(20, pool.join)
    assert [p.pid for p in workers if not exited(p)] == []
    iterator.close()


def test_join_terminates_process_workers_stuck_past_its_timeout():
    pool = Pool("process", 1)
    iterator = pool.imap(stuck, itertools.count(), window=2)
    threading.Thread(target=lambda: next(iterator, None), daemon=True).start()
    deadline = time.monotonic() + 20
    while not worker_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = worker_processes()
    time.sleep(0.3)  # the worker is inside its two-minute task
    pool.stop()
    started = time.monotonic()
    noted = [p.pid for p in pool._processes]
    within(20, lambda: pool.join(timeout=0.5))
    assert time.monotonic() - started < 5
    alive = [(p.name, p.pid) for p in workers if not exited(p)]
    assert workers and alive == [], f"alive after join: {alive}; the pool's workers: {noted}"


def test_stop_while_the_pool_starts_its_workers_still_joins_them(monkeypatch):
    """A stop() from another thread while the executor is starting a worker (between the process's
    start and the executor's record of it) still leaves that worker to join(), which terminates it."""
    import multiprocessing.process

    original_start = multiprocessing.process.BaseProcess.start
    started = threading.Event()

    def start_then_linger(process) -> None:  # the executor records the process once start() returns
        original_start(process)
        started.set()
        time.sleep(0.5)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start_then_linger)
    pool = Pool("process", 1)
    iterator = pool.imap(stuck, itertools.count(), window=2)
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            next(iterator, None)
        except BaseException as exc:  # noqa: BLE001  (the test asserts there is none)
            errors.append(exc)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    try:
        assert started.wait(20)
        workers = worker_processes()
        pool.stop()  # while the executor has not recorded its worker yet
        started_join = time.monotonic()
        within(20, lambda: pool.join(timeout=0.5))
        assert time.monotonic() - started_join < 5
        consumer.join(20)
        assert workers and [(p.name, p.pid) for p in workers if not exited(p)] == []
        assert errors == []
    finally:
        for process in worker_processes():
            process.kill()


def test_stop_and_join_before_the_first_next_start_no_worker():
    """stop() and join() (from another thread, say) before the consumer's first next(): the iteration
    ends at once, and no worker is started that nothing would join."""
    pool = Pool("process", 2)
    iterator = pool.imap(stuck, itertools.count(), window=4)
    pool.stop()
    pool.join()
    assert next(iterator, None) is None
    started = worker_processes()
    for process in started:
        process.kill()
    assert started == []


def forks_then_sticks(pid_file: str) -> None:
    """A task that forks a helper of its own (no exec: it holds the worker's sentinel pipe open) and
    never returns."""
    helper = os.fork()
    if helper == 0:
        time.sleep(60)
        os._exit(0)
    with open(pid_file, "w") as handle:
        handle.write(str(helper))
    time.sleep(120)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_join_ends_a_stuck_worker_whose_own_child_holds_its_sentinel(tmp_path):
    """join() waits on a worker's sentinel, which a child the task forked keeps open after the worker
    is gone: join still sees the worker end, and returns."""
    pid_file = str(tmp_path / "helper.pid")
    pool = Pool("process", 1)
    iterator = pool.imap(forks_then_sticks, itertools.repeat(pid_file, 1), window=1)
    threading.Thread(target=lambda: next(iterator, None), daemon=True).start()
    try:
        deadline = time.monotonic() + 20
        while not os.path.exists(pid_file) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.1)
        workers = worker_processes()
        pool.stop()
        started = time.monotonic()
        within(20, lambda: pool.join(timeout=0.5))
        assert time.monotonic() - started < 5
        assert workers and all(exited(p) for p in workers)
    finally:
        if os.path.exists(pid_file):
            with open(pid_file) as handle:
                text = handle.read()
            if text:
                try:
                    os.kill(int(text), 9)
                except ProcessLookupError:
                    pass


@pytest.mark.parametrize("ending", ["stop-join", "with-block"])
def test_reader_join_returns_once_process_workers_exited(tmp_path, ending):
    import numpy as np
    import pyarrow as pa

    from unihub import ScalarCodec, Unischema, UnischemaField, make_reader, write_dataset

    schema = Unischema("S", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False)])
    write_dataset(tmp_path / "ds", schema, [{"id": np.arange(2000)}], batched=True, row_group_size_mb=0.001)
    reader = make_reader(tmp_path / "ds", reader_pool_type="process", workers_count=2, num_epochs=None)
    with reader:
        next(reader)
        workers = worker_processes()
        assert len(workers) == 2
        if ending == "stop-join":
            reader.stop()
            within(20, reader.join)
            assert [p.pid for p in workers if not exited(p)] == []
    assert [p.pid for p in workers if not exited(p)] == []


def test_a_reader_starts_one_worker_per_core_it_may_run_on(tmp_path, monkeypatch) -> None:
    # in a container limited to some cores, the cores it may run on, not every core of the host
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    from unihub.readers.reader import default_workers_count
    from unihub.readers.workers import usable_cores
    from unihub.store.dataset import open_dataset

    (tmp_path / "ds").mkdir()
    pq.write_table(pa.table({"x": [1, 2, 3]}), tmp_path / "ds" / "part.parquet")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert usable_cores() == 3
    assert default_workers_count(open_dataset(tmp_path / "ds")) == 3
