"""The ``unihub`` command line: inspect (table and JSON), demo, errors and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from unihub import ScalarCodec, TensorCodec, Unischema, UnischemaField, write_dataset
from unihub.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm"

Small = Unischema("Small", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("vec", np.float32, (None, 3), TensorCodec(), True),
])


@pytest.fixture()
def small_dataset(tmp_path: Path) -> Path:
    url = tmp_path / "small"
    rows = [{"id": i, "vec": np.ones((i % 3, 3), np.float32) if i % 4 else None} for i in range(50)]
    write_dataset(url, Small, rows, rows_per_file=20)
    return url


def test_inspect_prints_schema_rows_files_and_row_groups(small_dataset: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["inspect", str(small_dataset)]) == 0
    out = capsys.readouterr().out
    assert "rows: 50" in out and "files: 3" in out and "row groups: 3" in out
    assert "Small (unihub metadata)" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("id ", "vec "))}
    assert lines["id"][1:3] == ["int64", "()"] and lines["id"][-1] == "no"
    assert lines["vec"][1:3] == ["float32", "(None,"] and lines["vec"][-1] == "yes"


def test_inspect_json(small_dataset: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["inspect", str(small_dataset), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["rows"] == 50 and info["files"] == 3 and info["row_groups"] == 3 and info["bytes"] > 0
    assert info["fields"][1] == {"name": "vec", "dtype": "float32", "shape": [None, 3],
                                 "codec": {"type": "tensor"}, "nullable": True}


def test_inspect_json_is_a_schema_file(small_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["inspect", str(small_dataset), "--json"]) == 0
    (tmp_path / "schema.json").write_text(capsys.readouterr().out)
    assert main(["convert", str(small_dataset), str(tmp_path / "again"), "--schema", str(tmp_path / "schema.json"),
                 "--quiet"]) == 0
    from unihub.store.dataset import open_dataset

    assert open_dataset(str(tmp_path / "again")).schema == Small
    assert main(["verify", str(small_dataset), str(tmp_path / "again")]) == 0


def test_inspect_into_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    wide = Unischema("Wide", [UnischemaField(f"f{i:04d}", np.int64, (), ScalarCodec(pa.int64()), False)
                              for i in range(2000)])
    write_dataset(tmp_path / "wide", wide, [{f"f{i:04d}": i for i in range(2000)}])
    for extra in ([], ["--json"]):  # `unihub inspect DS | head -c 20`: far more than a pipe buffer
        process = subprocess.Popen([sys.executable, "-m", "unihub.cli", "inspect", str(tmp_path / "wide"), *extra],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert process.stdout is not None and process.stderr is not None
        head = process.stdout.read(20)
        process.stdout.close()
        err = process.stderr.read().decode()
        assert process.wait(timeout=60) == 141
        assert head and err == ""


def test_inspect_petastorm_dataset(capsys: pytest.CaptureFixture) -> None:
    assert main(["inspect", str(FIXTURES / "unischema")]) == 0
    out = capsys.readouterr().out
    assert "Petastorm metadata" in out and "rows: 60" in out
    assert "compressed_image(image_codec=jpeg, quality=90)" in out


def test_inspect_errors_are_one_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["inspect", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("unihub: error: ") and "no such file or directory" in err and err.count("\n") == 1
    (tmp_path / "empty").mkdir()
    assert main(["inspect", str(tmp_path / "empty")]) == 1
    assert "holds no Parquet data files" in capsys.readouterr().err
    (tmp_path / "notparquet").mkdir()
    (tmp_path / "notparquet" / "part-0.parquet").write_bytes(b"this is not parquet at all")
    assert main(["inspect", str(tmp_path / "notparquet")]) == 1
    err = capsys.readouterr().err
    assert "part-0.parquet" in err and "not a readable Parquet file" in err


def test_usage_errors_exit_2() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["inspect"])
    assert exc.value.code == 2


def test_console_script_demo(tmp_path: Path) -> None:
    out_dir = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "unihub.cli", "demo", str(out_dir), "--rows", "200",
                           "--steps", "60"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"write_dataset {out_dir / 'demo'}" in out and out.count("rows: 200 ") == 3
    assert "schema:  TFRecord (unihub metadata)" in out and "schema:  ImageFolder (unihub metadata)" in out
    assert "compressed_image(image_codec=jpeg" in out and "compressed_image(image_codec=png, quality=80)" in out
    assert "PyTorch DataLoader, batch 64" in out and "PyTorch BatchedDataLoader" in out
    trained = next(line for line in out.splitlines() if line.startswith("trained 60 steps"))
    before, after = (float(x) for x in trained.split("loss ")[1].split(",")[0].split(" -> "))
    assert after < before * 0.7, trained  # the tiny model learns the classes from what the loader feeds it
    for name in ("demo", "tfrecord_unihub", "images_unihub"):
        assert (out_dir / name / "_common_metadata").exists()


def test_warnings_are_one_line_and_verbose_goes_after_the_command(tmp_path: Path) -> None:
    import h5py

    with h5py.File(tmp_path / "other.h5", "w") as f:
        f.create_dataset("labels", data=np.arange(3))
    with h5py.File(tmp_path / "main.h5", "w") as f:
        f.create_dataset("x", data=np.arange(3.0))
        f["labels"] = h5py.ExternalLink("other.h5", "/labels")
    done = subprocess.run([sys.executable, "-m", "unihub.cli", "convert", str(tmp_path / "main.h5"),
                           str(tmp_path / "ds"), "--option", "ignore_unsupported=true", "--quiet"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    warning_lines = [line for line in done.stderr.splitlines() if "labels" in line]
    assert warning_lines and all(line.startswith("unihub: warning: ") for line in warning_lines), done.stderr
    assert "UserWarning" not in done.stderr
    failed = subprocess.run([sys.executable, "-m", "unihub.cli", "inspect", str(tmp_path / "missing"), "--verbose"],
                            capture_output=True, text=True)
    assert failed.returncode == 1 and "Traceback" in failed.stderr  # --verbose after the command shows it


def test_a_missing_source_and_an_empty_glob_say_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Not "cannot tell its format": what is wrong is that nothing is there."""
    (tmp_path / "a.tfrecord").write_bytes(b"")
    cases = {str(tmp_path / "nope.tfrecord"): f"{tmp_path / 'nope.tfrecord'}: no such file or directory",
             str(tmp_path / "nodir"): f"{tmp_path / 'nodir'}: no such file or directory",
             str(tmp_path / "data" / "*.tfrecord"): f"{tmp_path / 'data' / '*.tfrecord'}: the glob matches no file",
             str(tmp_path / "{a,b}.tfrecord"): None,  # b is looked up where it is read
             str(tmp_path / "{x*,a}.tfrecord"): f"{tmp_path / 'x*.tfrecord'}: the glob matches no file (in "}
    for src, expected in cases.items():
        assert main(["convert", src, str(tmp_path / "out"), "--quiet"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("unihub: error: ") and err.count("\n") == 1, err
        if expected is not None:
            assert expected in err, err
        assert "cannot tell its format" not in err
    assert main(["verify", str(tmp_path / "nope.h5"), str(tmp_path / "out")]) == 1
    assert "nope.h5: no such file or directory" in capsys.readouterr().err


def test_inspect_of_a_foreign_source_names_its_format_and_how_to_convert_it(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture) -> None:
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "x.h5", "w") as handle:  # written by h5py, as a user's file is
        handle["a"] = np.arange(3)
    assert main(["inspect", str(tmp_path / "x.h5")]) == 1
    err = capsys.readouterr().err
    assert err == (f"unihub: error: {tmp_path / 'x.h5'}: a file in the hdf5 format, not a unihub dataset; convert it "
                   f"first, e.g. unihub convert {tmp_path / 'x.h5'} x_unihub, then inspect that\n")
    assert "Parquet magic bytes" not in err


def test_demo_refuses_a_folder_holding_files_no_demo_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    (mine / "demo").mkdir()
    assert main(["demo", str(mine), "--rows", "10", "--steps", "1"]) == 1
    assert capsys.readouterr().err == (f"unihub: error: {mine} holds files no demo wrote (thesis.tex): the demo "
                                       "replaces its folder; name a new or empty one, or an earlier demo's\n")
    assert sorted(p.name for p in mine.iterdir()) == ["demo", "thesis.tex"]


@pytest.mark.parametrize(("option", "line"), [
    (["--rows", "-5"], "unihub: error: rows must be a whole number >= 1, got -5\n"),
    (["--rows", "0"], "unihub: error: rows must be a whole number >= 1, got 0\n"),
    (["--steps", "-1"], "unihub: error: steps must be a whole number >= 0, got -1\n"),  # trained forever
])
def test_demo_refuses_bad_counts_before_writing(option: list[str], line: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", str(tmp_path / "demo"), *option]) == 1
    assert capsys.readouterr().err == line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("command", "line"), [
    (["copy", "{ds}", "{tmp}/copy", "--row-group-size-mb", "nan"], "row_group_size_mb must be positive, got nan"),
    (["copy", "{ds}", "{tmp}/copy", "--row-group-size-mb", "inf"], "row_group_size_mb must be positive, got inf"),
    (["compact", "{ds}", "--target-mb", "inf"], "target_mb must be a positive number of megabytes, got inf"),
    (["throughput", "{ds}", "--cache-location", "{tmp}/cache", "--cache-size-limit-mb", "nan", "--in-process",
      "--quiet", "-n", "5"], "cache_size_limit must be a positive number of bytes"),
])
def test_a_size_of_nan_or_inf_is_one_error_line(command: list[str], line: str, small_dataset: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """They ended in a traceback (int(nan * 2**20)) where 0 and negative sizes were one line."""
    argv = [part.format(ds=small_dataset, tmp=tmp_path) for part in command]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"unihub: error: {line}") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small"]


@pytest.mark.parametrize(("command", "line"), [
    (["throughput", "{tmp}/missing", "-n", "5"], "{tmp}/missing: no such file or directory"),
    (["throughput", "{ds}", "-n", "5", "--field-regex", "nothing.*"], "No fields matching the criteria ['nothing.*']"),
])
def test_throughput_of_a_dataset_it_cannot_read_is_one_error_line(
        command: list[str], line: str, small_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: its banner ('reading ... with 3 thread worker(s) ...') on stderr first, then the measuring child's
    error: two lines."""
    argv = [part.format(ds=small_dataset, tmp=tmp_path) for part in command]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"unihub: error: {line.format(tmp=tmp_path)}") and err.count("\n") == 1, err
