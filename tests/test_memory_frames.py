"""Peak RSS of writing and reading 240 camera frames (1200x1920x3 uint8, 6.9 MB; 1.6 GB in all),
measured in fresh interpreters (:mod:`tests.memory_probe`): a few row groups, whatever the rows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.memory_probe import CAMERA_SETUP, LIMIT_MB, needs_proc, peak_growth_mib, scratch


@pytest.fixture(scope="module")
def frames(tmp_path_factory) -> Iterator[tuple[Path, float]]:
    """240 camera frames (1.6 GB) written by write_dataset, and how much the writing process grew."""
    with scratch(tmp_path_factory, "frames", 1700) as root:
        path = root / "frames"
        grown = peak_growth_mib(CAMERA_SETUP, f"""
            write_dataset({str(path)!r}, Unischema("Frames", FIELDS),
                          ({{"id": i, "frame": frame.copy()}} for i in range(240)), compression=None)
        """)
        yield path, grown


@pytest.mark.slow
@needs_proc
def test_writing_240_camera_frames_grows_by_a_few_row_groups(frames: tuple[Path, float]) -> None:
    path, grown = frames
    from unihub import open_dataset

    assert open_dataset(path).num_rows == 240
    print(f"writing 240 frames (1.6 GB) grew the process by {grown:.0f} MB")
    assert grown < LIMIT_MB, f"writing 240 frames (1.6 GB) grew the process by {grown:.0f} MB"


@pytest.mark.slow
@needs_proc
@pytest.mark.parametrize("batched", [False, True], ids=["make_reader", "make_batch_reader"])
@pytest.mark.parametrize("pool", ["thread", "process"])
def test_reading_camera_frames_grows_by_a_few_row_groups(frames: tuple[Path, float], batched: bool,
                                                         pool: str) -> None:
    """A consumer slower than the workers (as in training) lets the results queue fill: it holds
    32 MB of decoded frames (UNIHUB_MEMORY_MB=128), never fewer than one row group per worker, where
    it held 2 x workers + 2 row groups whatever their size (~370 MB with threads, ~280 MB with processes)."""
    path, _ = frames
    make = "make_batch_reader" if batched else "make_reader"
    slow = (20, 0.05) if batched else (64, 0.02)  # the first items come slower than the workers read them
    grown = peak_growth_mib(f"import time; from unihub import {make}", f"""
        total = 0
        with {make}({str(path)!r}, reader_pool_type={pool!r}, workers_count=2) as reader:
            for i, item in enumerate(reader):
                total += len(item.id) if {batched} else 1
                if i < {slow[0]}:
                    time.sleep({slow[1]})
        assert total == 240, total
    """, env={"UNIHUB_MEMORY_MB": "128"})
    print(f"{make} ({pool} pool) over 240 frames grew the process by {grown:.0f} MB")
    assert grown < LIMIT_MB, f"{make} ({pool} pool) over 240 frames grew the process by {grown:.0f} MB"

