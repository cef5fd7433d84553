"""``convert``'s pipeline: worker processes, the progress bar, a schema file, Ctrl-C."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from unihub import CompressedImageCodec, ScalarCodec, Unischema, UnischemaField, open_dataset
from unihub.cli import main
from unihub.cli.demo import make_image
from unihub.converters.convert import ProgressMeter, convert
from unihub.converters.verify import verify
from unihub.errors import FormatError
from unihub.images.decoders import encode_image

from ..image_folders import rows_of, write_image_folder


@pytest.fixture()
def image_folder(tmp_path: Path) -> Path:
    """5 classes x 6 PNGs of 12x10x3."""
    return write_image_folder(tmp_path / "folder")


# -- workers -------------------------------------------------------------------------------------------
def test_workers_give_the_same_dataset_in_input_order(image_folder: Path, tmp_path: Path) -> None:
    one = convert(image_folder, tmp_path / "one", progress=False)
    two = convert(image_folder, tmp_path / "two", progress=False, workers=2)
    assert one.rows == two.rows == 30
    assert rows_of(tmp_path / "one") == rows_of(tmp_path / "two")  # same rows, same order
    store = open_dataset(tmp_path / "two")
    assert store.extra_metadata["classes"] == [f"class{c}" for c in range(5)]
    assert len(store.files) > 1  # each worker task wrote its own part files
    assert verify(image_folder, tmp_path / "two").equal
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_workers_report_skipped_records_and_leave_nothing_on_error(image_folder: Path, tmp_path: Path) -> None:
    bad = image_folder / "class3" / "02.png"
    bad.write_bytes(bad.read_bytes()[:50])
    with pytest.raises(FormatError, match="02.png"):
        convert(image_folder, tmp_path / "ds", progress=False, workers=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]  # no target, no temporary directory
    result = convert(image_folder, tmp_path / "ds", progress=False, workers=2, on_error="skip")
    assert result.rows == 29 and [s.path for s in result.skipped] == [str(bad)]


def test_workers_overwrite_and_bad_values(image_folder: Path, tmp_path: Path) -> None:
    convert(image_folder, tmp_path / "ds", progress=False)
    convert(image_folder, tmp_path / "ds", progress=False, workers=0, overwrite=True)  # 0: one per core
    assert open_dataset(tmp_path / "ds").num_rows == 30
    with pytest.raises(ValueError, match="workers must be a whole number >= 0"):
        convert(image_folder, tmp_path / "x", workers=-1)


# -- progress -------------------------------------------------------------------------------------------
def test_progress_line_shows_rows_megabytes_rate_and_eta() -> None:
    stream = io.StringIO()
    meter = ProgressMeter(enabled=True, total_bytes=400 * 2**20, stream=stream)
    meter.start -= 2.0  # two seconds in
    meter.advance(1000, 100 * 2**20)
    line = meter.line()
    assert line.startswith("1,000 rows, 100.0/400.0 MB, ")
    rate = int(line.split(", ")[2].split(" ")[0].replace(",", ""))
    assert 450 <= rate <= 500  # ~1000 rows in ~2 s
    eta = float(line.rsplit("ETA ", 1)[1].split(" ")[0])
    assert 5 <= eta <= 6.5  # 300 MB left at ~50 MB/s
    meter.close()
    assert stream.getvalue().endswith("\n") and "ETA" in stream.getvalue()

    by_rows = ProgressMeter(enabled=True, total_rows=4000, stream=io.StringIO())
    by_rows.start -= 1.0
    assert by_rows.line().startswith("0 rows, 0.0 MB")
    list(by_rows.count([{"x": np.zeros(1000, np.float64)}]))
    assert by_rows.line().startswith("1,000 rows, 0.0 MB") and "ETA 3 s" in by_rows.line()


def test_progress_is_off_when_stderr_is_not_a_terminal(image_folder: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    assert ProgressMeter(stream=io.StringIO()).enabled is False
    assert main(["convert", str(image_folder), str(tmp_path / "ds")]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err and err.count("\n") == 1 and "converted 30 rows" in err


def test_progress_bar_on_request(image_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    convert(image_folder, tmp_path / "ds", progress=True)
    err = capsys.readouterr().err  # not a terminal: plain lines, no carriage returns
    assert err.startswith("30 rows, ") and "\r" not in err and " MB" in err and "rows/s" in err and "ETA" in err


# -- a schema file -----------------------------------------------------------------------------------------
def write_schema(path: Path, shape: tuple[int, ...]) -> Path:
    schema = Unischema("Folder", [
        UnischemaField("image", np.uint8, shape, CompressedImageCodec("png"), False),
        UnischemaField("label", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("path", np.str_, (), ScalarCodec(pa.string()), False),
    ])
    path.write_text(schema.to_json())
    return path


def test_schema_file_that_fits_is_used(image_folder: Path, tmp_path: Path) -> None:
    schema_file = write_schema(tmp_path / "s.json", (None, None, 3))
    assert main(["convert", str(image_folder), str(tmp_path / "ds"), "--schema", str(schema_file), "--quiet"]) == 0
    assert open_dataset(tmp_path / "ds").schema.image.shape == (None, None, 3)


def test_schema_file_that_does_not_match_the_data_is_a_clear_error(image_folder: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    schema_file = write_schema(tmp_path / "s.json", (64, 64, 3))
    assert main(["convert", str(image_folder), str(tmp_path / "ds"), "--schema", str(schema_file)]) == 1
    err = capsys.readouterr().err
    assert "class0/00.png" in err and "(12, 10, 3)" in err and "(64, 64, 3)" in err
    assert not (tmp_path / "ds").exists()
    (tmp_path / "bad.json").write_text(json.dumps({"format": "something else"}))
    assert main(["convert", str(image_folder), str(tmp_path / "ds"), "--schema", str(tmp_path / "bad.json")]) == 1
    err = capsys.readouterr().err
    assert "schema file" in err and "bad.json" in err and "not a unihub Unischema" in err
    assert main(["convert", str(image_folder), str(tmp_path / "ds"), "--schema", str(tmp_path / "none.json")]) == 1
    assert "cannot read schema file" in capsys.readouterr().err


# -- Ctrl-C ------------------------------------------------------------------------------------------------
SLOW_CONVERT = """
import signal, sys, time
# as from a terminal: a shell that starts jobs in the background makes them ignore SIGINT
signal.signal(signal.SIGINT, signal.default_int_handler)
import unihub.formats.imagefolder.format as imagefolder
real_read = imagefolder._read_and_probe
def slow_read(*args, **kwargs):  # the data pass, after the schema is inferred
    print("reading", flush=True)
    time.sleep(0.05)
    return real_read(*args, **kwargs)
imagefolder._read_and_probe = slow_read
from unihub.cli import main
sys.exit(main(["convert", sys.argv[1], sys.argv[2], "--workers", sys.argv[3], "--row-group-size-mb", "0.001"]))
"""


@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_leaves_neither_target_nor_temporary_directory(image_folder: Path, tmp_path: Path,
                                                              workers: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", SLOW_CONVERT, str(image_folder), str(out / "ds"), workers],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    seen = 0
    while seen < 8:  # let it write a few row groups first (two workers' lines may interleave)
        line = proc.stdout.readline()
        assert line, "the conversion ended before it was interrupted"
        seen += line.count("reading")
    assert any(p.name.startswith(".ds") for p in out.iterdir())  # the temporary directory exists mid-way
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group, workers too
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    time.sleep(0.3)
    assert list(out.iterdir()) == []


def test_image_folder_schema_scan_in_workers_equals_the_serial_scan(tmp_path: Path) -> None:
    from unihub.formats.imagefolder.format import ImageFolderFormat

    rng = np.random.default_rng(2)
    root = tmp_path / "many"
    blobs = {(h, fmt): encode_image(make_image(rng, h, 5), fmt) for h in (4, 6) for fmt in ("png", "jpeg")}
    for i in range(1201):  # above the size where the scan goes parallel
        klass = root / f"c{i % 3}"
        klass.mkdir(parents=True, exist_ok=True)
        h, fmt = (6 if i == 1100 else 4), ("jpeg" if i % 7 == 0 else "png")  # one odd size, a few JPEGs
        (klass / f"{i:05d}.{'jpg' if fmt == 'jpeg' else 'png'}").write_bytes(blobs[(h, fmt)])
    serial = ImageFolderFormat(str(root)).infer_schema()
    parallel_source = ImageFolderFormat(str(root))
    parallel_source.workers = 2
    assert parallel_source.infer_schema() == serial
    assert serial.image.shape == (None, 5, 3) and serial.image.codec.image_codec == "png"
    result = convert(root, tmp_path / "ds", progress=False, workers=2)
    assert result.rows == 1201 and open_dataset(tmp_path / "ds").schema == serial


@pytest.mark.parametrize("workers", [1, 2])
def test_single_pass_refines_a_schema_the_sample_got_wrong(tmp_path: Path, workers: int) -> None:
    """Image folders are read once with a schema from a sample; files get the schema of every image."""
    import pyarrow.parquet as pq

    from unihub.formats.imagefolder.format import ImageFolderFormat
    from unihub.schema.unischema import SCHEMA_METADATA_KEY

    rng = np.random.default_rng(3)
    root = tmp_path / "folder"
    common, odd = encode_image(make_image(rng, 4, 5), "png"), encode_image(make_image(rng, 7, 5), "png")
    for i in range(1105):
        klass = root / f"c{i % 2}"
        klass.mkdir(parents=True, exist_ok=True)
        (klass / f"{i:05d}.png").write_bytes(odd if i == 1103 else common)  # c1/01103.png: last listed
    source = ImageFolderFormat(str(root))
    assert source.provisional_schema().image.shape == (4, 5, 3)  # the sample misses the odd one
    full = source.infer_schema()
    assert full.image.shape == (None, 5, 3)

    result = convert(root, tmp_path / "ds", progress=False, workers=workers)
    assert result.rows == 1105
    store = open_dataset(tmp_path / "ds")
    assert store.schema == full
    for f in store.files:
        assert Unischema.from_json(pq.read_metadata(f.path).metadata[SCHEMA_METADATA_KEY]) == full
    assert verify(root, tmp_path / "ds").equal
