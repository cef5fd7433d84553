"""Image folders holding special files and hostile links: a FIFO, a link to /dev/zero, link loops,
links out of the folder, oversized files. Each run of the CLI is a subprocess with a time and memory
limit: a hang or an unbounded read fails the test instead of hanging the suite."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.image_folders import rows_of, write_image_folder
from unihub.errors import FormatError
from unihub.formats.imagefolder.format import ImageFolderFormat
from unihub.images.decoders import encode_image
from unihub.schema.unischema import Unischema

TIMEOUT_S = 60  # the runs take ~1-2 s; the bound is for load, a hang takes forever
MEMORY_BYTES = 2 * 2**30  # /dev/zero read to exhaustion goes past any bound; a run here needs ~300 MB


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``unihub ARGS`` in a subprocess bounded in time and address space."""
    return subprocess.run([sys.executable, "-m", "unihub.cli", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, preexec_fn=_limit_memory, check=False)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single ``unihub: error:`` line of a failed run (exit 1, no traceback)."""
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("unihub: error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return write_image_folder(tmp_path / "train", classes=2, per_class=3)


def tree_listing(root: Path) -> dict[str, tuple[bool, bytes | None]]:
    """Every entry under ``root`` (links not followed): whether it is a link, and a regular file's bytes."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            regular = path.is_file() and not path.is_symlink()
            found[str(path.relative_to(root))] = (path.is_symlink(), path.read_bytes() if regular else None)
    return found


def test_fifo_named_png_is_named_not_waited_on(folder: Path, tmp_path: Path) -> None:
    os.mkfifo(folder / "class0" / "x.png")
    before = tree_listing(folder)
    line = one_error_line(run_cli("convert", str(folder), str(tmp_path / "out")))
    assert f"{folder}/class0/x.png: not a regular file (a FIFO)" in line
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["train"]
    assert tree_listing(folder) == before
    done = run_cli("convert", str(folder), str(tmp_path / "out"), "--skip-corrupt")
    assert done.returncode == 0, done.stderr
    assert "class0/x.png file: not a regular file (a FIFO)" in done.stderr
    assert len(rows_of(tmp_path / "out")) == 6


def test_link_to_dev_zero_is_never_read(folder: Path, tmp_path: Path) -> None:
    os.symlink("/dev/zero", folder / "class1" / "x.png")
    line = one_error_line(run_cli("convert", str(folder), str(tmp_path / "out")))
    assert f"{folder}/class1/x.png: a symbolic link to /dev/zero, outside the folder: not followed" in line
    line = one_error_line(run_cli("convert", str(folder), str(tmp_path / "out"), "--follow-links"))
    assert "a symbolic link to /dev/zero, not a regular file (a character device): never opened" in line
    assert [p.name for p in tmp_path.iterdir()] == ["train"]


def test_link_loops_end_and_are_recorded(folder: Path, tmp_path: Path) -> None:
    """a/l1 -> . and a/l2 -> . double a following walk at each level; neither form is followed."""
    os.symlink(".", folder / "class0" / "l1")
    os.symlink(".", folder / "class0" / "l2")
    os.symlink("..", folder / "class1" / "up")
    for extra in ((), ("--follow-links",)):
        out = tmp_path / f"out{len(extra)}"
        done = run_cli("convert", str(folder), str(out), *extra)
        assert done.returncode == 0, done.stderr
        assert len(rows_of(out)) == 6
        assert "left out 3 file(s)" in done.stderr and "class0/l1, class0/l2, class1/up" in done.stderr
    source = ImageFolderFormat(str(folder), follow_links=True)
    with pytest.warns(UserWarning, match="left out 3 file"):
        list(source.read_batches(source.infer_schema(), on_error="skip"))
    reasons = {os.path.relpath(s.path, folder): s.reason for s in source.report.skipped}
    assert reasons["class0/l1"] == f"a symbolic link to {folder}/class0, a folder it lies in: a loop, not followed"
    assert reasons["class1/up"] == f"a symbolic link to {folder}, a folder it lies in: a loop, not followed"


def test_links_inside_read_links_outside_only_when_asked(folder: Path, tmp_path: Path) -> None:
    pool = tmp_path / "pool"
    pool.mkdir()
    outside = encode_image(np.full((12, 10, 3), 7, np.uint8), "png")
    (pool / "o.png").write_bytes(outside)
    (pool / "sub").mkdir()
    (pool / "sub" / "deep.png").write_bytes(outside)
    os.symlink(pool / "o.png", folder / "class0" / "o.png")
    os.symlink(pool / "sub", folder / "class0" / "linked")
    os.symlink("../class1/00.png", folder / "class0" / "in.png")  # inside: read as the file it names
    line = one_error_line(run_cli("convert", str(folder), str(tmp_path / "out")))
    assert f"{folder}/class0/linked: a symbolic link to {pool}/sub, outside the folder" in line
    done = run_cli("convert", str(folder), str(tmp_path / "out"), "--follow-links")
    assert done.returncode == 0, done.stderr
    rows = {path: (label, image) for path, label, image in rows_of(tmp_path / "out")}
    assert rows["class0/o.png"] == (0, outside) and rows["class0/linked/deep.png"] == (0, outside)
    assert rows["class0/in.png"] == (0, (folder / "class1" / "00.png").read_bytes())
    assert len(rows) == 9
    verified = run_cli("verify", str(folder), str(tmp_path / "out"), "--option", "follow_links=true")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_links_to_folders_inside_are_left_out_with_a_word(folder: Path) -> None:
    os.symlink("../class1", folder / "class0" / "again")
    source = ImageFolderFormat(str(folder))
    with pytest.warns(UserWarning, match="links not followed: class0/again"):
        rows = list(source.read_batches(source.infer_schema()))
    assert sum(len(b["path"]) for b in rows) == 6
    assert "not followed, its files are read where they lie" in source.report.skipped[0].reason


def test_file_size_is_bounded_before_reading(folder: Path, tmp_path: Path) -> None:
    big = folder / "class1" / "big.png"
    big.write_bytes(encode_image(np.zeros((12, 10, 3), np.uint8), "png") + bytes(2 * 2**20))
    (folder / "class1" / "movie.mp4").write_bytes(bytes(3 * 2**20))  # no image: left out as before
    source = ImageFolderFormat(str(folder), max_file_mb=1)
    schema: Unischema = source.infer_schema()
    with pytest.raises(FormatError, match=r"big.png: 2,[\d,]+ bytes or more, above the limit of 1,048,576 bytes"):
        list(source.read_batches(schema))
    line = one_error_line(run_cli("convert", str(folder), str(tmp_path / "out"), "--option", "max_file_mb=1"))
    assert "big.png: 2,097,2" in line and "--option max_file_mb=N raises it" in line
    done = run_cli("convert", str(folder), str(tmp_path / "out"))  # under the default 256 MiB
    assert done.returncode == 0, done.stderr


def test_max_file_mb_inf_is_no_limit_and_a_tiny_one_not_zero(folder: Path, tmp_path: Path) -> None:
    """``max_file_mb=inf`` raised OverflowError (int of infinity), a traceback from the CLI; it is no limit, as
    None is for ``MAX_IMAGE_FILE_BYTES``. A fraction of a byte was a limit of 0 bytes: it rounds up."""
    big = folder / "class1" / "big.png"
    big.write_bytes(encode_image(np.zeros((12, 10, 3), np.uint8), "png") + bytes(2 * 2**20))
    assert ImageFolderFormat(str(folder), max_file_mb=float("inf")).max_file_bytes is None
    assert ImageFolderFormat(str(folder), max_file_mb=1e-9).max_file_bytes == 1
    source = ImageFolderFormat(str(folder), max_file_mb=float("inf"))
    assert len(next(source.read_batches(source.infer_schema()))["path"]) == 7
    done = run_cli("convert", str(folder), str(tmp_path / "out"), "--option", "max_file_mb=inf")
    assert done.returncode == 0, done.stderr


def test_listing_a_dataset_folder_with_a_link_loop_ends(folder: Path, tmp_path: Path) -> None:
    """``inspect`` opens a folder as a dataset first; Arrow's recursive listing followed a/l -> . forever."""
    os.symlink(".", folder / "class0" / "l1")
    os.symlink(".", folder / "class0" / "l2")
    line = one_error_line(run_cli("inspect", str(folder)))
    assert line.startswith(f"unihub: error: {folder}: a folder in the imagefolder format, not a unihub dataset")
    done = run_cli("convert", str(folder), str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    os.symlink(".", tmp_path / "out" / "again")  # a loop inside a dataset's own folder
    shown = run_cli("inspect", str(tmp_path / "out"))
    assert shown.returncode == 0 and "rows: 6   files: 1" in shown.stdout, shown.stdout + shown.stderr


def test_read_regular_refuses_what_is_not_a_bounded_regular_file(tmp_path: Path) -> None:
    """Checked on the open file: a FIFO without a writer opens and is refused at once (a file swapped
    for one after the walk does not block), a device is never read, a file is bounded by bytes."""
    from unihub.fs import sources

    os.mkfifo(tmp_path / "pipe.png")
    with pytest.raises(sources.NotReadable, match=r"not a regular file \(a FIFO\)"):
        sources.read_regular(str(tmp_path / "pipe.png"))
    with pytest.raises(sources.NotReadable, match=r"not a regular file \(a character device\)"):
        sources.read_regular("/dev/zero", max_bytes=None)
    (tmp_path / "f.bin").write_bytes(bytes(range(256)) * 5)
    with pytest.raises(sources.NotReadable, match="1,280 bytes or more, above the limit of 1,000 bytes"):
        sources.read_regular(str(tmp_path / "f.bin"), max_bytes=1000)
    assert sources.read_regular(str(tmp_path / "f.bin"), max_bytes=1280) == bytes(range(256)) * 5
    assert sources.read_regular(str(tmp_path / "f.bin"), 10, max_bytes=100) == bytes(range(10))
