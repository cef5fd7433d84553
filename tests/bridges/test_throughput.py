"""``reader_throughput`` / ``unihub throughput``: Petastorm's benchmark on the dataset Petastorm wrote.

No timing is asserted, only that the numbers are those of a run that happened: positive
rates that agree with the mean time, the measuring process's memory, a CPU share.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from unihub import reader_throughput
from unihub.bridges.throughput import BenchmarkResult, ReadMethod, WorkerPoolType, memory_info
from unihub.cli import main
from unihub.dependencies import is_available
from unihub.errors import SchemaError, UnihubError

PETASTORM = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm" / "unischema"


def assert_sane(result: BenchmarkResult) -> None:
    assert isinstance(result, BenchmarkResult) and result._fields == ("time_mean", "samples_per_second",
                                                                       "memory_info", "cpu")
    assert result.time_mean > 0 and result.samples_per_second == pytest.approx(1 / result.time_mean)
    assert result.memory_info.rss > 10 * 2**20 and result.memory_info.vms >= result.memory_info.rss
    assert result.memory_info.peak_rss >= result.memory_info.rss
    assert result.cpu >= 0


@pytest.mark.parametrize("pool_type", [WorkerPoolType.THREAD, "dummy"])
def test_rows_per_second_in_process(pool_type):
    # 60 rows: more cycles than rows, so the reader goes round (num_epochs=None) as Petastorm's
    result = reader_throughput(str(PETASTORM), field_regex=["id", "image_.*"], warmup_cycles_count=20,
                               measure_cycles_count=150, pool_type=pool_type, loaders_count=2,
                               spawn_new_process=False)
    assert_sane(result)


def test_rows_per_second_in_a_fresh_process():
    result = reader_throughput(str(PETASTORM), warmup_cycles_count=10, measure_cycles_count=100, loaders_count=1)
    assert_sane(result)
    assert result.memory_info.rss < memory_info().rss * 4  # measured in another, smaller process


def test_reader_extra_args_and_bad_arguments():
    result = reader_throughput(str(PETASTORM), warmup_cycles_count=0, measure_cycles_count=30,
                               reader_extra_args={"schema_fields": ["id"], "shuffle_row_groups": False},
                               spawn_new_process=False)
    assert_sane(result)
    with pytest.raises(UnihubError, match="measure_cycles_count must be an integer >= 1, got 0"):
        reader_throughput(str(PETASTORM), measure_cycles_count=0, spawn_new_process=False)
    with pytest.raises(ValueError, match="'fibers' is not a valid WorkerPoolType"):
        reader_throughput(str(PETASTORM), pool_type="fibers", spawn_new_process=False)
    with pytest.raises(SchemaError, match="matches 'nope'"):
        reader_throughput(str(PETASTORM), field_regex=["nope"], spawn_new_process=False)


@pytest.mark.slow
@pytest.mark.skipif(not is_available("tensorflow"), reason="tensorflow is not installed")
def test_tf_read_method():
    result = reader_throughput(str(PETASTORM), field_regex=["id", "embedding"], warmup_cycles_count=5,
                               measure_cycles_count=100, read_method=ReadMethod.TF, shuffling_queue_size=20,
                               spawn_new_process=False)
    assert_sane(result)


def test_cli_prints_petastorm_result_line_and_progress(capsys):
    assert main(["throughput", str(PETASTORM), "--field-regex", "id", "label", "-w", "2", "-m", "10", "-n", "200",
                 "--in-process"]) == 0
    captured = capsys.readouterr()
    assert re.fullmatch(r"Average sample read rate: \d+\.\d\d samples/sec; RAM \d+\.\d\d MB \(rss\); "
                        r"CPU \d+\.\d\d%\n", captured.out), captured.out
    lines = captured.err.splitlines()
    assert lines[0] == (f"reading {PETASTORM} (id label) with 2 thread worker(s), python: 10 warmup rows, "
                        "then 200 measured")
    assert re.fullmatch(r"measured 200 rows in \d+\.\d\d s after 10 warmup rows\s*", lines[-1])


def test_cli_json_and_errors(capsys):
    assert main(["throughput", str(PETASTORM), "-m", "0", "-n", "50", "--json", "--quiet", "-p", "dummy",
                 "--reader-pool-type", "thread", "--in-process"]) == 0
    captured = capsys.readouterr()
    info = json.loads(captured.out)
    assert captured.err == ""
    assert set(info) == {"url", "time_mean", "samples_per_second", "memory_info", "cpu"}
    assert info["samples_per_second"] == pytest.approx(1 / info["time_mean"])
    assert set(info["memory_info"]) == {"rss", "vms", "peak_rss"}
    assert main(["throughput", str(PETASTORM), "-n", "0", "--in-process", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err == "unihub: error: measure_cycles_count must be an integer >= 1, got 0\n"
    with pytest.raises(SystemExit):
        main(["throughput", "--help"])
    assert "examples:" in capsys.readouterr().out
