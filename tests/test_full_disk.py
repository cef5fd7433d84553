"""Every writer onto a real full disk: a tmpfs of 4 MiB, mounted for each test (CI runs as root).

Through the CLI each is exit 1 and one ``unihub: error:`` line naming the destination and "No space
left on device", with nothing left on the disk and an old destination there before left intact; from
Python, :class:`~unihub.errors.OutputError` (an ``OSError`` with errno ENOSPC) naming the destination.
The HDF5 export crashed the interpreter here (SIGSEGV in h5py's ``write_direct``), leaving its
temporary to fill the disk: the CLI cases run in a subprocess.
"""

from __future__ import annotations

import errno
import filecmp
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from unihub import convert, copy_dataset, write_dataset
from unihub.cli.demo import DemoSchema, demo_rows, write_demo_dataset
from unihub.errors import OutputError

DISK_SIZE = "4m"
ROWS = 800  # 6.8 MB of Parquet, 8 MB of HDF5: twice what the disk holds


def _mount_small_disk(where: Path) -> None:
    if not sys.platform.startswith("linux") or shutil.which("mount") is None:
        pytest.skip("a tmpfs is mounted with Linux's mount")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs of {DISK_SIZE} here (it needs root): {done.stderr.strip()}")


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real filesystem of 4 MiB, unmounted after the test."""
    disk = tmp_path / "disk"
    disk.mkdir()
    _mount_small_disk(disk)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The demo dataset (images, strings, ragged tensors) and the same as TFRecord shards."""
    root = tmp_path_factory.mktemp("sources")
    write_demo_dataset(str(root / "demo"), rows=ROWS)
    convert(root / "demo", root / "tfrecord", to_format="tfrecord", progress=False)
    return {"demo": root / "demo", "tfrecord": root / "tfrecord"}


def _unihub(*args: str) -> subprocess.CompletedProcess[str]:
    quiet = ("--quiet",) if args[0] != "verify" else ()
    return subprocess.run([sys.executable, "-m", "unihub.cli", *args, *quiet], capture_output=True, text=True,
                          timeout=600)


def _assert_one_line_no_space(done: subprocess.CompletedProcess[str], destination: Path) -> None:
    assert done.returncode == 1, (done.returncode, done.stderr[-3000:])  # HDF5: -11 (SIGSEGV) before
    assert done.stderr.count("\n") == 1, done.stderr[-3000:]
    assert re.fullmatch(rf"unihub: error: cannot write {re.escape(str(destination))}: No space left on device"
                        r"( \(\S+\))?; free some space, or write elsewhere\n", done.stderr), done.stderr


EXPORTS = {
    "hdf5": ("out.h5",),
    "hdf5-groups": ("out.h5", "--option", "layout=groups"),
    "tfrecord": ("out.tfrecord",),
    "webdataset": ("shards.tar",),
    "imagefolder": ("folder", "--to", "imagefolder"),
    "unihub": ("out",),
}


@pytest.mark.parametrize("export", list(EXPORTS))
def test_an_export_onto_a_full_disk_is_one_line_and_leaves_nothing(sources: dict[str, Path], small_disk: Path,
                                                                   export: str) -> None:
    name, *options = EXPORTS[export]
    done = _unihub("convert", str(sources["demo"]), str(small_disk / name), *options)
    _assert_one_line_no_space(done, small_disk / name)
    assert os.listdir(small_disk) == []


def test_an_ingest_onto_a_full_disk_is_one_line_and_leaves_nothing(sources: dict[str, Path],
                                                                   small_disk: Path) -> None:
    done = _unihub("convert", str(sources["tfrecord"]), str(small_disk / "out"))
    _assert_one_line_no_space(done, small_disk / "out")
    assert os.listdir(small_disk) == []


def test_a_copy_onto_a_full_disk_is_one_line_and_leaves_nothing(sources: dict[str, Path], small_disk: Path) -> None:
    done = _unihub("copy", str(sources["demo"]), str(small_disk / "copy"))
    _assert_one_line_no_space(done, small_disk / "copy")
    assert os.listdir(small_disk) == []


#: an HDF5 file of small chunks: a few rows take less than the disk (chunks of ~1 MB: 4.6 MB for 20 rows)
SMALL_CHUNKS = ("--option", "chunk_rows=64")


@pytest.mark.parametrize("export", ["hdf5", "unihub"])
def test_an_old_destination_survives_a_full_disk(sources: dict[str, Path], small_disk: Path, export: str) -> None:
    name, *options = EXPORTS[export]
    options += SMALL_CHUNKS if export == "hdf5" else ()
    small = small_disk.parent / "small"
    write_demo_dataset(str(small), rows=20)
    assert _unihub("convert", str(small), str(small_disk / name), *options).returncode == 0
    kept = small_disk.parent / "kept"
    shutil.copytree(small_disk, kept)
    done = _unihub("convert", str(sources["demo"]), str(small_disk / name), *options, "--overwrite")
    _assert_one_line_no_space(done, small_disk / name)
    comparison = filecmp.dircmp(kept, small_disk)
    assert os.listdir(small_disk) == [name]
    assert not comparison.diff_files and not comparison.left_only and not comparison.right_only
    assert all(filecmp.cmp(kept / n, small_disk / n, shallow=False) for n in comparison.common_files)


def _assert_names_no_space(error: OutputError, destination: Path) -> None:
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC
    assert str(error).startswith(f"cannot write {destination}: No space left on device")
    assert str(error).endswith("; free some space, or write elsewhere")


def test_write_dataset_onto_a_full_disk_raises_output_error(small_disk: Path) -> None:
    with pytest.raises(OutputError) as raised:  # a raw OSError from pyarrow before
        write_dataset(small_disk / "ds", DemoSchema, demo_rows(ROWS))
    _assert_names_no_space(raised.value, small_disk / "ds")
    assert os.listdir(small_disk) == []


def test_convert_and_copy_onto_a_full_disk_raise_output_error(sources: dict[str, Path], small_disk: Path) -> None:
    with pytest.raises(OutputError) as raised:
        convert(sources["tfrecord"], small_disk / "out", progress=False)
    _assert_names_no_space(raised.value, small_disk / "out")
    with pytest.raises(OutputError) as raised:
        copy_dataset(None, sources["demo"], small_disk / "copy")
    _assert_names_no_space(raised.value, small_disk / "copy")
    assert os.listdir(small_disk) == []


NO_FALLOCATE = """
import sys
import unihub.formats.hdf5.room as room
room._libc_fallocate = lambda: None  # a filesystem that cannot reserve: its free space is checked instead
from unihub.cli import main
sys.exit(main(["convert", sys.argv[1], sys.argv[2], "--quiet"]))
"""


def test_an_hdf5_export_where_nothing_can_be_reserved_still_fails_cleanly(sources: dict[str, Path],
                                                                         small_disk: Path) -> None:
    done = subprocess.run([sys.executable, "-c", NO_FALLOCATE, str(sources["demo"]), str(small_disk / "out.h5")],
                          capture_output=True, text=True, timeout=600)
    _assert_one_line_no_space(done, small_disk / "out.h5")
    assert os.listdir(small_disk) == []


def test_an_hdf5_export_that_fits_is_written_whole_and_keeps_no_reserved_blocks(sources: dict[str, Path],
                                                                               small_disk: Path) -> None:
    """The room reserved ahead of HDF5's writes is given back: the file takes the blocks of its size."""
    small = small_disk.parent / "small"
    write_demo_dataset(str(small), rows=100)
    assert _unihub("convert", str(small), str(small_disk / "out.h5"), *SMALL_CHUNKS).returncode == 0
    stat = os.stat(small_disk / "out.h5")
    assert stat.st_blocks * 512 < stat.st_size + (64 << 10)
    assert _unihub("verify", str(small), str(small_disk / "out.h5")).returncode == 0
