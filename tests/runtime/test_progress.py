"""Progress: one switch, a tqdm bar on a terminal, a plain line without tqdm or without a terminal."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from unihub.converters.convert import convert
from unihub.converters.meter import ProgressMeter
from unihub.runtime import progress
from unihub.store.dataset import open_dataset


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _switch_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "_switch", None)
    monkeypatch.delenv(progress.ENV_DISABLE, raising=False)


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """24 PNGs in two classes, written by Pillow."""
    rng = np.random.default_rng(0)
    for i in range(24):
        folder = tmp_path / "images" / ("cat" if i % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(folder / f"{i:03d}.png")
    return tmp_path / "images"


@pytest.fixture
def meters(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ProgressMeter]]:
    """Every meter made while the test runs, each drawing on a fake terminal."""
    made: list[ProgressMeter] = []
    original = ProgressMeter.__init__

    def init(self: ProgressMeter, **kwargs: Any) -> None:
        original(self, **{**kwargs, "stream": Terminal()})
        made.append(self)

    monkeypatch.setattr(ProgressMeter, "__init__", init)
    yield made


def _input_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.png"))


def test_tqdm_bar_on_a_terminal_counts_input_bytes_and_rows(image_folder: Path, tmp_path: Path,
                                                            meters: list[ProgressMeter]) -> None:
    convert(image_folder, tmp_path / "ds")  # progress=None: shown because the stream is a terminal
    (meter,) = meters
    total = _input_bytes(image_folder)
    assert (meter.rows, meter.total_bytes, meter.done_bytes()) == (24, total, total)
    out = meter.stream.getvalue()
    assert "100%|" in out and "B/s" in out and "24 rows]" in out, out  # tqdm's bar, by bytes, rows after it
    assert out.endswith("\n") and open_dataset(tmp_path / "ds").num_rows == 24


def test_without_tqdm_a_terminal_gets_one_plain_line(image_folder: Path, tmp_path: Path,
                                                     meters: list[ProgressMeter],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # ``import tqdm`` now raises ImportError
    convert(image_folder, tmp_path / "ds")
    (meter,) = meters
    out = meter.stream.getvalue()
    mb = _input_bytes(image_folder) / 2**20
    assert "%|" not in out and out.startswith("\r24 rows, ") and out.endswith("\n") and out.count("\n") == 1
    assert f"{mb:,.1f}/{mb:,.1f} MB" in out and "rows/s" in out and "ETA 0 s" in out


def test_by_rows_when_the_source_counts_no_bytes() -> None:
    stream = Terminal()
    meter = ProgressMeter(total_rows=3000, stream=stream)
    list(meter.count({"x": np.zeros(1000)} for _ in range(3)))
    meter.close()
    assert "100%|" in stream.getvalue() and "3000/3000" in stream.getvalue() and "rows/s" in stream.getvalue()


def test_not_a_terminal_is_off_by_default_and_plain_lines_on_request() -> None:
    assert ProgressMeter(stream=io.StringIO()).enabled is False
    stream = io.StringIO()
    meter = ProgressMeter(enabled=True, total_rows=10, stream=stream)
    list(meter.count({"x": np.zeros(5)} for _ in range(2)))
    meter.close()
    assert stream.getvalue().startswith("10 rows, ") and "\r" not in stream.getvalue()
    assert stream.getvalue().count("\n") == 1  # one line per PLAIN_PERIOD (10 s) and the last


@pytest.mark.parametrize("how", ["function", "environment"])
def test_one_switch_turns_every_meter_off(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert progress.is_progress_bar_enabled()
    if how == "function":
        progress.disable_progress_bar()
    else:
        monkeypatch.setenv(progress.ENV_DISABLE, "1")
    assert not progress.is_progress_bar_enabled()
    stream = Terminal()
    for enabled in (None, True):
        meter = ProgressMeter(enabled=enabled, stream=stream)
        assert meter.enabled is False
        list(meter.count([{"x": np.zeros(3)}]))
        meter.close()
    assert stream.getvalue() == ""
    progress.enable_progress_bar()  # wins over the environment too
    assert progress.is_progress_bar_enabled() and ProgressMeter(stream=stream).enabled is True


def test_the_switch_also_silences_the_cache_builder_and_the_throughput_benchmark(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from unihub.bridges.throughput import reader_throughput
    from unihub.caching.cacheable import cacheable

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm" / "unischema"

    def rows() -> Iterator[dict[str, Any]]:
        yield from ({"id": i, "x": np.full(3, i, np.float32)} for i in range(50))

    def run(version: str, **options: Any) -> str:
        cacheable(tmp_path, dataset_id="p", version=version, **options)(rows)()
        reader_throughput(str(fixture), field_regex=["id"], warmup_cycles_count=2, measure_cycles_count=20,
                          spawn_new_process=False, progress=True)
        return capsys.readouterr().err

    assert "measured 20 rows" in run("1", progress=True) , "shown when switched on"
    seen: list[int] = []
    progress.disable_progress_bar()
    try:
        assert run("2", progress=True) == ""
        assert run("3", progress=lambda rows, rate: seen.append(rows)) == ""
    finally:
        progress.enable_progress_bar()
    assert seen[-1] == 50, "a caller's own callback is not a display: still called"


def test_the_switch_is_public() -> None:
    import unihub

    assert unihub.disable_progress_bar is progress.disable_progress_bar
    assert unihub.enable_progress_bar is progress.enable_progress_bar


def _convert_on_a_terminal(src: Path, dst: Path, **env: str) -> str:
    """``unihub convert SRC DST`` with stderr on a pseudo-terminal; what it drew there."""
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # 40 rows, 120 columns
    environ = {**os.environ, **env}
    with subprocess.Popen([sys.executable, "-m", "unihub.cli", "convert", str(src), str(dst)],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=secondary, env=environ) as child:
        os.close(secondary)
        chunks = []
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the child closed its side
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert child.wait(timeout=120) == 0
    os.close(primary)
    return b"".join(chunks).decode()


def test_cli_draws_tqdm_on_a_terminal_and_nothing_when_switched_off(image_folder: Path, tmp_path: Path) -> None:
    drawn = _convert_on_a_terminal(image_folder, tmp_path / "a")
    assert "100%|" in drawn and "24 rows]" in drawn and "converted 24 rows" in drawn, drawn
    quiet = _convert_on_a_terminal(image_folder, tmp_path / "b", UNIHUB_DISABLE_PROGRESS_BAR="1")
    assert "%|" not in quiet and "rows/s]" not in quiet and "converted 24 rows" in quiet, quiet
    assert open_dataset(tmp_path / "a").num_rows == open_dataset(tmp_path / "b").num_rows == 24
