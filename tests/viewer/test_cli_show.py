"""``unihub show``: writes the page, takes the library's options, fails with one line and leaves nothing."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from unihub.cli import main

from .conftest import cards


def test_show_writes_one_page(images_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "train.html"
    assert main(["show", str(images_dataset), "--rows", "3", "--first", "--where", "label >= 1",
                 "--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert sorted(cards(page)) == [1, 2, 3] and "Sample: 3 rows, the first 3" in page
    assert capsys.readouterr().err == f"wrote {out}: 40 rows, 3 shown\n"
    monkeypatch.chdir(tmp_path)
    opened: list[str] = []
    monkeypatch.setattr("webbrowser.open", lambda url: opened.append(url) or True)
    assert main(["show", str(images_dataset), "--rows", "2", "--seed", "9", "--open"]) == 0
    assert opened == [(tmp_path / "report.html").resolve().as_uri()]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "train.html"]


@pytest.mark.parametrize(("args", "line"), [
    (["--where", "lbl > 1"], "unihub: error: filter 'lbl > 1' names 'lbl', which is not a field"),
    (["--rows", "5000"], "unihub: error: rows must be an integer from 0 to 1000, got 5000"),
    (["--out", "no/such/dir/r.html"], "unihub: error: cannot write no/such/dir/r.html: "),
])
def test_a_bad_option_is_one_line_and_exit_1_with_nothing_written(
        args: list[str], line: str, images_dataset: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["show", str(images_dataset), *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_a_missing_dataset_and_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["show", str(tmp_path / "nope")]) == 1
    assert capsys.readouterr().err == f"unihub: error: {tmp_path / 'nope'}: no such file or directory\n"
    with pytest.raises(SystemExit) as usage:
        main(["show", str(tmp_path), "--seed", "1", "--first"])
    assert usage.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["show", "--help"])
    text = capsys.readouterr().out
    assert "examples:" in text and "unihub show /data/train --rows 48" in text and "--storage-option" in text


def test_a_dataset_on_s3_with_storage_options(s3_server: Any, images_dataset: Path, tmp_path: Path) -> None:
    pytest.importorskip("s3fs")
    prefix = f"cli-show-{uuid.uuid4().hex[:8]}"
    for path in sorted(images_dataset.rglob("*")):
        if path.is_file():
            s3_server.client().upload_file(str(path), s3_server.bucket,
                                           f"{prefix}/{path.relative_to(images_dataset).as_posix()}")
    out = tmp_path / "s3.html"
    assert main(["show", f"s3://{s3_server.bucket}/{prefix}", "--rows", "2", "--out", str(out),
                 "--storage-option", f"client_kwargs.endpoint_url={s3_server.endpoint_url}"]) == 0
    assert len(cards(out.read_text(encoding="utf-8"))) == 2


def test_progress_when_asked_and_quiet(images_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import unihub.runtime.progress

    monkeypatch.setattr(unihub.runtime.progress, "is_terminal", lambda stream: True)  # as on a terminal
    monkeypatch.setitem(sys.modules, "tqdm", None)  # the plain line, whatever is installed
    assert main(["show", str(images_dataset), "--rows", "1", "--out", str(tmp_path / "a.html")]) == 0
    err = capsys.readouterr().err
    assert "4/4 row groups read" in err and err.rstrip().endswith("1 shown")
    assert main(["show", str(images_dataset), "--rows", "1", "--out", str(tmp_path / "b.html"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_out_naming_a_directory_is_refused_before_the_pass_and_the_directory_stays(
        images_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    assert main(["show", str(images_dataset), "--rows", "1", "--out", str(folder)]) == 1
    assert capsys.readouterr().err == f"unihub: error: cannot write {folder}: Is a directory\n"
    assert [p.name for p in folder.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize(("where", "line"), [
    ("score > 'a'", "unihub: error: filters (score > \"a\") cannot be evaluated on the columns id (int64), "),
    ("boxes > 1", "unihub: error: filters (boxes > 1) cannot be evaluated on the columns id (int64), "),
    ("not label", "unihub: error: filters invert(label) cannot be evaluated on the columns id (int64), "),
    ("id > 99999999999999999999999", "unihub: error: filter 'id > 99999999999999999999999': Python int too large"),
])
def test_a_filter_the_columns_cannot_take_is_one_line(where: str, line: str, images_dataset: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(images_dataset), "--where", where, "--out", str(tmp_path / "r.html")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_out_naming_a_file_of_the_dataset_is_refused_and_the_dataset_stays(images_dataset: Path, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    single = tmp_path / "one.parquet"
    shutil.copyfile(next(images_dataset.glob("*.parquet")), single)
    copy = tmp_path / "copy"
    shutil.copytree(images_dataset, copy)
    before = {p: p.read_bytes() for p in [single, *copy.iterdir()] if p.is_file()}
    for dataset, out in ((single, single), (f"file://{single}", single), (copy, copy / "_common_metadata")):
        assert main(["show", str(dataset), "--rows", "1", "--out", str(out)]) == 1
        assert capsys.readouterr().err == (f"unihub: error: cannot write {out}: it is a file of the dataset {dataset}, "
                                           "which the page would replace; write it elsewhere\n")
    assert {p: p.read_bytes() for p in before} == before
    assert main(["show", str(copy), "--rows", "1", "--out", str(copy / "report.html"), "--quiet"]) == 0  # a new file


def test_show_of_an_image_folder_says_what_it_is_not_which_file_is_no_parquet(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    from .conftest import pil

    (tmp_path / "photos" / "cat").mkdir(parents=True)
    (tmp_path / "photos" / "cat" / "a.png").write_bytes(pil(np.zeros((4, 4, 3), np.uint8), "PNG"))
    assert main(["show", str(tmp_path / "photos"), "--out", str(tmp_path / "r.html")]) == 1
    photos = tmp_path / "photos"
    assert capsys.readouterr().err == (f"unihub: error: {photos}: a folder in the imagefolder format, not a unihub "
                                       f"dataset; convert it first, e.g. unihub convert {photos} photos_unihub, then "
                                       "show that\n")
