"""Ctrl-C and SIGTERM reach a real ``unihub convert`` wherever it is: importing unihub, parsing its
arguments, converting. Every time the command's last line is ``unihub: interrupted`` (``unihub:
terminated``), it exits 130 (143), prints no traceback, and leaves nothing beside its destination.

Before, 1 run in 11 ended so: a signal during the imports (a second or more) printed a raw
KeyboardInterrupt or ended the process silently (rc -2), and SIGTERM left ``.DST.unihub-tmp-*``.

A signal is sent no earlier than the command's own handlers are in place (``SigCgt`` of
``/proc/PID/status`` lists SIGTERM, which Python itself does not catch): before unihub's first line
runs, the interpreter is Python's (see :mod:`unihub.runtime.interrupts`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from unihub import convert, package_version
from unihub.cli.demo import write_demo_dataset
from unihub.dependencies import is_available

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/status (Linux)")

COPIES = 30  # of 17 MB of TFRecord (links, no space): the conversion takes well over the latest signal's 2 s
# on a fast machine (6 took 1.9 s on one); every test stops it early, so a slow machine waits no longer
LAST_LINES = {signal.SIGINT: "unihub: interrupted", signal.SIGTERM: "unihub: terminated"}


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A glob of TFRecord shards: images, strings, ragged tensors."""
    root = tmp_path_factory.mktemp("signals")
    write_demo_dataset(str(root / "demo"), rows=2000)
    convert(root / "demo", root / "tfrecord", to_format="tfrecord", progress=False)
    first = next((root / "tfrecord").iterdir())
    for copy in range(1, COPIES):
        os.link(first, root / "tfrecord" / f"copy-{copy}.tfrecord")
    return str(root / "tfrecord" / "*.tfrecord")


def _as_from_a_terminal() -> None:
    """A shell starting a job in the background makes it ignore SIGINT: a terminal's job does not."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(command: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_from_a_terminal, start_new_session=True)


def _handles_sigterm(pid: int) -> bool:
    """Whether process ``pid`` catches SIGTERM (unihub's handlers are in place)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


def _wait(condition: object, what: str, process: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert process.poll() is None, f"the command ended before {what}: {process.stderr.read()[-2000:]}"  # type: ignore[union-attr]
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.005)


def _interrupt(command: list[str], number: signal.Signals, *, delay: float | None = None, staged: Path | None = None,
               group: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``command`` and send it ``number``: ``delay`` seconds after its start (not before its handlers
    are in place), or once a staging area appeared in ``staged``; to its whole group with ``group``
    (as a terminal's Ctrl-C, workers too). Returns the command's end, once its group is gone."""
    started = time.monotonic()
    process = _start(command)
    _wait(lambda: _handles_sigterm(process.pid), "its handlers were in place", process)
    if staged is not None:
        _wait(lambda: any(".unihub-tmp-" in name for name in os.listdir(staged)), "it staged its output", process)
    elif delay is not None:
        time.sleep(max(0.0, started + delay - time.monotonic()))
    assert process.poll() is None, "the command ended before the signal: make the conversion longer"
    os.killpg(process.pid, number) if group else os.kill(process.pid, number)
    _, err = process.communicate(timeout=300)
    _wait_for_group_gone(process.pid)
    return subprocess.CompletedProcess(command, process.returncode, "", err)


def _wait_for_group_gone(group: int, timeout: float = 60) -> None:
    """Until no process of ``group`` (the command's workers) remains."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, "a worker of the command outlived it"
        time.sleep(0.01)


def _assert_stopped(done: subprocess.CompletedProcess[str], number: signal.Signals, destination: Path) -> None:
    assert done.returncode == 128 + number, (done.returncode, done.stderr[-3000:])
    assert done.stderr.splitlines()[-1:] == [LAST_LINES[number]], done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr[-3000:]
    assert os.listdir(destination.parent) == [], [(r, d, f) for r, d, f in os.walk(destination.parent)]


def _convert_command(shards: str, destination: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "unihub.cli", "convert", shards, str(destination), "--quiet", *options]


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("when", ["at once", "staged"])
def test_a_signal_while_starting_or_converting_is_one_line_and_leaves_nothing(shards: str, tmp_path: Path,
                                                                              number: signal.Signals,
                                                                              when: str) -> None:
    (tmp_path / "out").mkdir()
    destination = tmp_path / "out" / "ds"
    done = _interrupt(_convert_command(shards, destination), number,
                      delay=0.0 if when == "at once" else None, staged=destination.parent if when == "staged" else None)
    _assert_stopped(done, number, destination)


@pytest.mark.slow
@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("delay", [0.05, 0.2, 0.5, 1.0, 2.0])
def test_a_signal_at_any_delay_is_one_line_and_leaves_nothing(shards: str, tmp_path: Path, number: signal.Signals,
                                                              delay: float) -> None:
    (tmp_path / "out").mkdir()
    destination = tmp_path / "out" / "ds"
    done = _interrupt(_convert_command(shards, destination), number, delay=delay)
    _assert_stopped(done, number, destination)


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_group_stops_the_workers_too(shards: str, tmp_path: Path, number: signal.Signals) -> None:
    """As a terminal's Ctrl-C reaches the command's forked workers: they print nothing and end with it."""
    (tmp_path / "out").mkdir()
    destination = tmp_path / "out" / "ds"
    done = _interrupt(_convert_command(shards, destination, "--workers", "2"), number, staged=destination.parent,
                      group=True)
    _assert_stopped(done, number, destination)


@pytest.mark.spark
@pytest.mark.skipif(not (is_available("pyspark") and shutil.which("java")), reason="a local Spark needs pyspark and java")
def test_ctrl_c_of_a_spark_conversion_is_one_line_and_leaves_nothing(shards: str, tmp_path: Path) -> None:
    """``--engine spark``: PySpark's own SIGINT handler (installed as its context starts) and a Ctrl-C landing in
    py4j's blocking call printed py4j's tracebacks (``KeyboardInterrupt while sending command``, 16-73 lines)
    before the last line; the job is cancelled and the command's one line is all there is."""
    (tmp_path / "out").mkdir()
    destination = tmp_path / "out" / "ds"
    process = _start(_convert_command(shards, destination, "--engine", "spark"))

    def writing() -> bool:  # a task has written a part: the driver waits in the job's collect
        staging = [name for name in os.listdir(destination.parent) if ".unihub-tmp-" in name]
        return any(os.listdir(destination.parent / staging[0])) if staging else False

    _wait(writing, "a task wrote a part", process)
    os.kill(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=300)
    done = subprocess.CompletedProcess(process.args, process.returncode, "", err)
    for line in done.stderr.splitlines():  # the kept log of Spark's output, named for reading
        if line.startswith("unihub: Spark's log: "):
            os.unlink(line.removeprefix("unihub: Spark's log: "))
    _assert_stopped(done, signal.SIGINT, destination)


@pytest.mark.spark
@pytest.mark.skipif(not (is_available("pyspark") and shutil.which("java")), reason="a local Spark needs pyspark and java")
def test_ctrl_c_while_spark_stops_is_one_line(shards: str, tmp_path: Path) -> None:
    """A Ctrl-C after the commit, while the session unihub started stops, landed inside py4j's call and printed
    its tracebacks (12-16 lines); it waits for the stop, then is the one line."""
    (tmp_path / "out").mkdir()
    destination = tmp_path / "out" / "ds"
    process = _start(_convert_command(shards, destination, "--engine", "spark"))
    _wait(destination.exists, "it committed", process, timeout=300)
    os.kill(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=300)
    for line in err.splitlines():
        if line.startswith("unihub: Spark's log: "):
            os.unlink(line.removeprefix("unihub: Spark's log: "))
    assert process.returncode == 130, err[-3000:]
    assert err.splitlines()[-1:] == [LAST_LINES[signal.SIGINT]], err[-3000:]
    assert "Traceback" not in err and "Error" not in err, err[-3000:]
    assert os.listdir(destination.parent) == ["ds"]


@pytest.mark.parametrize("target", ["out.h5", "out.tfrecord"])
def test_a_signal_during_an_export_is_one_line_and_leaves_nothing(shards: str, tmp_path: Path, target: str) -> None:
    (tmp_path / "out").mkdir()
    destination = tmp_path / "out" / target
    done = _interrupt(_convert_command(shards, destination), signal.SIGTERM, staged=destination.parent)
    _assert_stopped(done, signal.SIGTERM, destination)


CONSOLE_SCRIPT = """import sys
from unihub.cli import main
if __name__ == '__main__':
    sys.exit(main())
"""


def test_the_console_script_answers_at_once(shards: str, tmp_path: Path) -> None:
    """The ``unihub`` script pip writes (it imports the package before ``main`` runs): the handlers are
    in place from the package's first lines."""
    script = tmp_path / "bin" / "unihub"
    script.parent.mkdir()
    script.write_text(CONSOLE_SCRIPT)
    (tmp_path / "out").mkdir()
    destination = tmp_path / "out" / "ds"
    done = _interrupt([sys.executable, str(script), "convert", shards, str(destination), "--quiet"], signal.SIGINT,
                      delay=0.0)
    _assert_stopped(done, signal.SIGINT, destination)


def test_python_m_unihub_is_the_command(shards: str, tmp_path: Path) -> None:
    """``python -m unihub`` runs the command as ``unihub`` does, its handlers in place from the package's first lines."""
    version = subprocess.run([sys.executable, "-m", "unihub", "--version"], capture_output=True, text=True, timeout=120)
    assert (version.returncode, version.stdout) == (0, f"unihub {package_version()}\n"), version.stderr
    (tmp_path / "out").mkdir()
    destination = tmp_path / "out" / "ds"
    done = _interrupt([sys.executable, "-m", "unihub", "convert", shards, str(destination), "--quiet"], signal.SIGINT,
                      delay=0.0)
    _assert_stopped(done, signal.SIGINT, destination)


def test_a_program_importing_unihub_keeps_its_own_handlers() -> None:
    check = ("import signal, unihub, unihub.cli; "
             "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler; "
             "assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120,
                          preexec_fn=_as_from_a_terminal)
    assert done.returncode == 0, done.stderr


def test_main_called_from_python_puts_the_handlers_back(tmp_path: Path) -> None:
    from unihub.cli import main

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert main(["inspect", str(tmp_path / "missing")]) == 1
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def _dispositions(queue: object) -> None:
    queue.put((int(signal.getsignal(signal.SIGINT) == signal.SIG_IGN),  # type: ignore[attr-defined]
               int(signal.getsignal(signal.SIGTERM) == signal.SIG_IGN)))


def test_workers_leave_signals_to_the_command_and_programs_it_runs_keep_theirs() -> None:
    """A pool's worker forked while the command runs ignores SIGINT and SIGTERM (the command stops it);
    a program the command runs through ``subprocess`` (Spark's JVM) does not inherit that."""
    import multiprocessing

    from unihub.runtime import interrupts

    fork = multiprocessing.get_context("fork")
    with interrupts.raised():
        queue = fork.Queue()
        worker = fork.Process(target=_dispositions, args=(queue,))
        worker.start()
        ignored = queue.get(timeout=60)
        worker.join(timeout=60)
        program = subprocess.run([sys.executable, "-c", "import signal; print(int(signal.getsignal(signal.SIGTERM)))"],
                                 capture_output=True, text=True, timeout=60, preexec_fn=_as_from_a_terminal)
    assert ignored == (1, 1)
    assert program.stdout.strip() == str(int(signal.SIG_DFL))
