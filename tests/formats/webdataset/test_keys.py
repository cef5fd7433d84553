"""Keys that would escape the folder a shard is extracted into (``../../x``, ``/abs/x``, backslashes, NUL): a
WebDataset export refuses them by name, leaving nothing, so that no shard unihub writes can plant a file
outside its folder through an extractor that does not filter names (``tarfile.extractall`` without a filter,
GNU tar with ``--absolute-names``, Windows extractors). Such keys are still ingested as they are."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from unihub import Unischema, UnischemaField, write_dataset
from unihub.converters.convert import convert
from unihub.errors import SchemaError
from unihub.formats.webdataset.tar import escaping_reason

from .wds_helpers import tar_writer_shards

ESCAPING = ["../../x", "/abs/x", "a/../../b", "a\\..\\b"]


@pytest.mark.parametrize("key", ESCAPING)
def test_a_hostile_shard_converts_but_exports_nothing(tmp_path: Path, key: str) -> None:
    tar_writer_shards(tmp_path / "src", [{"__key__": "s000", "txt": b"first"}, {"__key__": key, "txt": b"evil"}])
    convert(tmp_path / "src", tmp_path / "ds", progress=False)  # ingested as it is: Parquet extracts nothing
    with pytest.raises(SchemaError, match=r"row 1: key .* would be written as member .*, outside the folder the "
                                          r"shard is extracted into \(it "):
        convert(tmp_path / "ds", tmp_path / "out", to_format="webdataset", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "src"]


def test_the_cli_names_the_key_in_one_line(tmp_path: Path) -> None:
    tar_writer_shards(tmp_path / "src", [{"__key__": "../../x", "txt": b"evil"}])
    done = subprocess.run([sys.executable, "-m", "unihub.cli", "convert", str(tmp_path / "src"), str(tmp_path / "ds")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([sys.executable, "-m", "unihub.cli", "convert", str(tmp_path / "ds"), str(tmp_path / "out"),
                           "--to", "webdataset"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("unihub: error: row 0: key '../../x' would be written as member '../../x.txt'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "src"]


@pytest.mark.parametrize("key", ["a\0b", "/x", "../x"])
def test_keys_of_any_source_are_checked(tmp_path: Path, key: str) -> None:
    """A ``__key__`` column from anywhere (here a dataset written by write_dataset) meets the same check."""
    schema = Unischema("Keys", [UnischemaField("__key__", np.str_, ()), UnischemaField("x", np.int64, ())])
    write_dataset(tmp_path / "ds", schema, [{"__key__": "fine", "x": 1}, {"__key__": key, "x": 2}])
    with pytest.raises(SchemaError, match=rf"row 1: key {re.escape(repr(key))} would be written"):
        convert(tmp_path / "ds", tmp_path / "out", to_format="webdataset", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_keys_inside_the_folder_round_trip_and_extract_inside(tmp_path: Path) -> None:
    keys = ["s000", "ok/sub/k", "./a", "a/b.c/d", "a/..b"]
    tar_writer_shards(tmp_path / "src", [{"__key__": key, "txt": key.encode()} for key in keys], per_shard=10)
    convert(tmp_path / "src", tmp_path / "ds", progress=False)
    convert(tmp_path / "ds", tmp_path / "out", to_format="webdataset", progress=False)
    (shard,) = (tmp_path / "out").iterdir()
    with tarfile.open(shard) as tar:
        assert [m.name for m in tar.getmembers()] == [f"{key}.txt" for key in keys]
        tar.extractall(tmp_path / "extracted", filter="data")  # the strict filter finds nothing to refuse
    assert sorted(str(p.relative_to(tmp_path / "extracted")) for p in (tmp_path / "extracted").rglob("*.txt")) == \
        sorted(f"{key}.txt".removeprefix("./") for key in keys)


@pytest.mark.parametrize("name", [f"{key}.txt" for key in ESCAPING] + ["a\0b.txt"])
def test_what_the_data_filter_refuses_is_refused(tmp_path: Path, name: str) -> None:
    """The names refused are those Python's own strict extraction filter refuses or rewrites (or, for a backslash
    or NUL, those that mean a path on Windows or are cut short in a tar header)."""
    assert escaping_reason(name) is not None
    if "\\" not in name and "\0" not in name:
        try:
            kept = tarfile.data_filter(tarfile.TarInfo(name), str(tmp_path))
        except tarfile.FilterError:
            return
        assert kept.name != name
