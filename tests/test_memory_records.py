"""Peak RSS of ingesting and exporting 4 MB records (75 of them, 300 MB, written by TensorFlow),
measured in fresh interpreters (:mod:`tests.memory_probe`): a few row groups, whatever the rows."""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.memory_probe import LIMIT_MB, MB, ROW_GROUP_MB, needs_proc, peak_growth_mib, scratch, tensorflow_writes


@pytest.fixture(scope="module")
def tf_big(tmp_path_factory) -> Iterator[Path]:
    """75 records of 4 MB (300 MB), written by TensorFlow."""
    with scratch(tmp_path_factory, "tf", 3 * 300) as root:  # the source, its ingest and one export
        yield tensorflow_writes(root / "big.tfrecord", 75, 4 * MB)


@pytest.fixture(scope="module")
def ingested(tf_big: Path, tmp_path_factory) -> Iterator[tuple[Path, float]]:
    """The 300 MB TFRecord of 4 MB records converted, and how much the converting process grew."""
    with scratch(tmp_path_factory, "ingest", 300) as root:
        path = root / "big"
        grown = peak_growth_mib("from unihub import convert", f"""
            result = convert({str(tf_big)!r}, {str(path)!r}, row_group_size_mb={ROW_GROUP_MB})
            assert result.rows == 75, result
        """)
        yield path, grown


@pytest.mark.slow
@needs_proc
def test_tfrecord_ingest_of_4mb_records_grows_by_a_few_row_groups(ingested: tuple[Path, float]) -> None:
    path, grown = ingested
    from unihub import open_dataset

    store = open_dataset(path)
    table = store.read_row_group(0)
    assert store.num_rows == 75 and table.column("id").to_pylist()[0] == 0
    assert table.column("data")[0].as_py() == np.random.default_rng(0).integers(
        0, 255, 4 * MB, dtype=np.uint8).tobytes()
    print(f"ingesting 300 MB of 4 MB records grew the process by {grown:.0f} MB (was ~800)")
    assert grown < LIMIT_MB, f"ingesting 300 MB of 4 MB records grew the process by {grown:.0f} MB (was ~800)"


@pytest.mark.slow
@needs_proc
@pytest.mark.parametrize("fmt", ["tfrecord", "webdataset"])
def test_export_of_4mb_records_grows_by_a_few_row_groups(fmt: str, ingested: tuple[Path, float],
                                                         tmp_path: Path) -> None:
    source, _ = ingested
    target = tmp_path / ("out.tfrecord" if fmt == "tfrecord" else "shards")
    grown = peak_growth_mib("from unihub import convert", f"""
        result = convert({str(source)!r}, {str(target)!r}, to_format={fmt!r})
        assert result.rows == 75, result
    """)
    if fmt == "webdataset":
        with tarfile.open(next(target.glob("*.tar"))) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith(".data"))
            first = tar.extractfile(member).read()  # type: ignore[union-attr]
        assert first == np.random.default_rng(0).integers(0, 255, 4 * MB, dtype=np.uint8).tobytes()
    else:
        assert target.stat().st_size > 300 * MB
    print(f"exporting 300 MB of 4 MB records to {fmt} grew the process by {grown:.0f} MB")
    assert grown < LIMIT_MB, f"exporting 300 MB of 4 MB records to {fmt} grew the process by {grown:.0f} MB"
