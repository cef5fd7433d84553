"""Shared by the WebDataset fidelity tests: shards written with webdataset's own TarWriter (or
tarfile, for orders TarWriter cannot make), datasets read back three ways, exact comparisons."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unihub import FormatError, make_batch_reader, make_reader
from unihub.cli import main
from unihub.store.dataset import open_dataset

wds = pytest.importorskip("webdataset")


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def tar_writer_shards(root: Path, samples: list[dict[str, Any]], per_shard: int = 4) -> list[Path]:
    """``samples`` (``__key__`` and extension -> bytes) as shards written by ``webdataset.TarWriter``."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(0, len(samples), per_shard):
        path = root / f"shard-{s // per_shard:06d}.tar"
        with wds.TarWriter(str(path), encoder=False) as writer:
            for sample in samples[s:s + per_shard]:
                writer.write(sample)
        paths.append(path)
    return paths


def tarfile_shard(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """A tar of ``members`` in exactly this order (tarfile, for orders TarWriter never writes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def same(found: Any, expected: Any, where: str = "") -> None:
    """Exactly equal: numpy values by dtype, shape and bytes; everything else by type and value."""
    if isinstance(expected, np.ndarray):
        assert isinstance(found, np.ndarray), (where, found)
        assert (found.dtype, found.shape) == (expected.dtype, expected.shape), where
        assert np.ascontiguousarray(found).tobytes() == np.ascontiguousarray(expected).tobytes(), where
    elif isinstance(expected, np.generic):
        assert type(found) is type(expected) and found.tobytes() == expected.tobytes(), (where, found, expected)
    else:
        assert type(found) is type(expected) and found == expected, (where, found, expected)


def reader_rows(path: Path) -> list[dict[str, Any]]:
    """Every row of a dataset through ``make_reader`` (images decoded off), in storage order."""
    schema = open_dataset(str(path)).schema
    names = list(schema.fields)
    with make_reader(str(path), shuffle_row_groups=False, decode_images=False) as reader:
        return [dict(zip(names, row)) for row in reader]


def batch_rows(path: Path) -> list[dict[str, Any]]:
    """Every row through ``make_batch_reader``, split out of its column batches."""
    schema = open_dataset(str(path)).schema
    names = list(schema.fields)
    rows: list[dict[str, Any]] = []
    with make_batch_reader(str(path), shuffle_row_groups=False, decode_images=False) as reader:
        for batch in reader:
            columns = dict(zip(names, batch))
            rows.extend({n: columns[n][i] for n in names} for i in range(len(columns[names[0]])))
    return rows


def refused(argv: list[str], capsys: pytest.CaptureFixture, dst: Path, error: type[Exception] = FormatError) -> str:
    """Run the CLI expecting ``error`` (seen with ``--verbose``), then exit 1 with one ``unihub: error:``
    line, and nothing at or beside ``dst`` either time."""
    with pytest.raises(error):
        main(["--verbose", *argv])
    assert not dst.exists() and not [n for n in os.listdir(dst.parent) if n.startswith(".")]
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("unihub: error: "), err
    assert not dst.exists()
    assert not [n for n in os.listdir(dst.parent) if n.startswith(".")], os.listdir(dst.parent)
    return lines[0]
