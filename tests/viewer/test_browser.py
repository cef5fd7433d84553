"""The report in a real browser: headless Chromium (Debian's ``chromium``) opens the file with no network,
every thumbnail decodes, no script error fires, the hostile dataset's strings stay text; a screenshot is
kept as a test artifact under ``$UNIHUB_TEST_ARTIFACTS`` (default: the test's tmp_path)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import unihub

from .test_show import hostile_dataset

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/setup.sh installs "
                                                          "Debian's chromium package)")]


def chromium(page: Path, profile: Path, *args: str) -> str:
    """Run headless Chromium on ``page`` with its own profile directory; its stdout."""
    command = [str(CHROMIUM), "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
               "--disable-extensions", "--disable-background-networking", f"--user-data-dir={profile}",
               "--virtual-time-budget=5000", *args, page.resolve().as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HOME": str(profile)})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def body_attributes(dom: str) -> dict[str, str]:
    body = re.search(r"<body([^>]*)>", dom)
    assert body is not None, dom[:500]
    return dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))


def artifacts(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("UNIHUB_TEST_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_the_page_renders_every_thumbnail_without_script_errors(images_dataset: Path, tmp_path: Path) -> None:
    report = unihub.show(images_dataset, rows=12, seed=4)
    expected = sum(1 for row in report.report.sample for t in row.thumbs if t.uri is not None)
    page = Path(report.save(tmp_path / "report.html"))
    body = body_attributes(chromium(page, tmp_path / "profile", "--dump-dom"))
    assert body["data-rendered"] == "ok", body
    assert (body["data-thumbs"], body["data-thumbs-decoded"], body["data-script-errors"]) == (
        str(expected), str(expected), "0")
    assert expected == 12 * 4 - sum(1 for row in report.report.sample if row.index == 7)

    shot = artifacts(tmp_path) / "show-images.png"
    chromium(page, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,2000")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_a_hostile_dataset_runs_no_script(tmp_path: Path) -> None:
    page = Path(unihub.show(hostile_dataset(tmp_path / "hostile"), rows=6).save(tmp_path / "hostile.html"))
    dom = chromium(page, tmp_path / "profile", "--dump-dom")
    body = body_attributes(dom)
    assert "data-pwned" not in body and body["data-rendered"] == "ok" and body["data-thumbs"] == "6", body
    assert dom.count("<script") == 1  # the page's own; the data's are text
    chromium(page, tmp_path / "profile", f"--screenshot={artifacts(tmp_path) / 'show-hostile.png'}",
             "--window-size=1280,1600")
