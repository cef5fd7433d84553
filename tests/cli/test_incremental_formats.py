"""``unihub convert SRC DST --append`` on the other foreign formats: image folders (PNGs written by Pillow),
HDF5 files (h5py) and WebDataset shards (webdataset's ``TarWriter``). Only the new files are converted, the
rows equal what the formats' own libraries read, and a second run is a no-op; an image folder's labels keep
their meaning across appends or the append is refused by name."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unihub.cli import main
from unihub.store import versions
from unihub.store.dataset import open_dataset

Image = pytest.importorskip("PIL.Image")


def rows(url: str, fields: list[str]) -> list[dict[str, Any]]:
    """Every row of the latest version, as Python values, in the dataset's order."""
    store = open_dataset(url)
    out: list[dict[str, Any]] = []
    for g in range(len(store.row_groups)):
        table = store.read_row_group(g, fields)
        out.extend(table.to_pylist())
    return out


def history(url: str) -> list[versions.Version]:
    import pyarrow.fs as pafs

    return versions.history(pafs.LocalFileSystem(), url)


def convert_append(src: str, dst: str) -> int:
    return main(["convert", src, dst, "--append", "--quiet"])


# -- image folders --------------------------------------------------------------------------------------------
def png(root: Path, rel: str, value: int) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((6, 5, 3), value, np.uint8)).save(root / rel)


def test_an_image_folder_grows_by_its_new_files_labelled_by_the_whole_folder(tmp_path: Path) -> None:
    root, dst = tmp_path / "images", str(tmp_path / "ds")
    for rel, value in [("ant/a1.png", 1), ("bee/b1.png", 2), ("cat/c1.png", 3)]:
        png(root, rel, value)
    assert convert_append(str(root), dst) == 0
    png(root, "cat/c2.png", 4)  # a new image of the last class (it alone would be a folder of one class)
    png(root, "dog/d1.png", 5)  # a new class sorting after the others: a new label
    assert convert_append(str(root), dst) == 0
    assert convert_append(str(root), dst) == 0  # nothing new: no version
    assert [v.added_rows for v in history(dst)] == [3, 2]
    found = rows(dst, ["image", "label", "path"])
    assert [(r["path"], r["label"]) for r in found] == [("ant/a1.png", 0), ("bee/b1.png", 1), ("cat/c1.png", 2),
                                                         ("cat/c2.png", 2), ("dog/d1.png", 3)]
    for r in found:  # the files' own bytes, never re-encoded
        assert r["image"] == (root / r["path"]).read_bytes()
    assert open_dataset(dst).extra_metadata["classes"] == ["ant", "bee", "cat", "dog"]
    assert open_dataset(dst, version=1).extra_metadata["classes"] == ["ant", "bee", "cat"]


def test_an_image_folder_whose_labels_would_change_meaning_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root, dst = tmp_path / "images", str(tmp_path / "ds")
    png(root, "bee/b1.png", 1)
    png(root, "cat/c1.png", 2)
    assert convert_append(str(root), dst) == 0
    capsys.readouterr()
    png(root, "ant/a1.png", 3)  # sorts first: 'bee' would become label 1, 'cat' 2
    assert convert_append(str(root), dst) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("unihub: error: ") and "\n" not in err
    assert "'ant', 'bee', 'cat'" in err and "label would name another class" in err and "nothing was written" in err
    assert len(history(dst)) == 1
    assert [r["label"] for r in rows(dst, ["label"])] == [0, 1]


# -- HDF5 -----------------------------------------------------------------------------------------------------
def test_hdf5_files_are_converted_once_each_and_read_as_h5py_reads_them(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    h5py = pytest.importorskip("h5py")
    raw, dst = tmp_path / "raw", str(tmp_path / "ds")
    raw.mkdir()

    def write(name: str, first: int) -> None:
        rng = np.random.default_rng(first)
        with h5py.File(raw / name, "w") as f:
            f["id"] = np.arange(first, first + 4, dtype=np.int64)
            f["x"] = rng.standard_normal((4, 3)).astype(np.float32)

    def expected(names: list[str]) -> list[tuple[int, bytes]]:
        out = []
        for name in names:
            with h5py.File(raw / name, "r") as f:
                out.extend((int(i), x.tobytes()) for i, x in zip(f["id"][()], f["x"][()]))
        return out

    def found() -> list[tuple[int, bytes]]:
        return [(r["id"], np.asarray(r["x"], np.float32).tobytes()) for r in rows(dst, ["id", "x"])]

    write("a.h5", 0)
    assert convert_append(str(raw / "*.h5"), dst) == 0
    write("b.h5", 100)
    assert convert_append(str(raw / "*.h5"), dst) == 0
    assert convert_append(str(raw / "*.h5"), dst) == 0
    assert found() == expected(["a.h5", "b.h5"])  # bit for bit
    assert [v.added_rows for v in history(dst)] == [4, 4]
    write("a.h5", 50)  # rewritten since it was converted
    capsys.readouterr()
    assert convert_append(str(raw / "*.h5"), dst) == 1
    assert "a.h5" in capsys.readouterr().err
    assert len(history(dst)) == 2


# -- WebDataset -----------------------------------------------------------------------------------------------
def test_webdataset_shards_are_converted_once_each_and_read_as_tarfile_reads_them(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    raw, dst = tmp_path / "shards", str(tmp_path / "ds")
    raw.mkdir()

    def write(name: str, first: int) -> None:
        with wds.TarWriter(str(raw / name)) as sink:
            for i in range(first, first + 3):
                buffer = io.BytesIO()
                Image.fromarray(np.full((4, 4, 3), i % 256, np.uint8)).save(buffer, format="PNG")
                sink.write({"__key__": f"s{i:05d}", "png": buffer.getvalue(), "txt": f"caption {i}"})

    def members(names: list[str]) -> list[tuple[str, bytes, str]]:
        out: dict[str, dict[str, bytes]] = {}
        for name in names:
            with tarfile.open(raw / name) as tar:
                for member in tar.getmembers():
                    key, ext = member.name.split(".", 1)
                    handle = tar.extractfile(member)
                    assert handle is not None
                    out.setdefault(key, {})[ext] = handle.read()
        return [(k, v["png"], v["txt"].decode()) for k, v in out.items()]

    write("shard-000.tar", 0)
    assert convert_append(str(raw / "*.tar"), dst) == 0
    write("shard-001.tar", 10)
    assert convert_append(str(raw / "*.tar"), dst) == 0
    assert convert_append(str(raw / "*.tar"), dst) == 0
    found = [(r["__key__"], r["png"], r["txt"]) for r in rows(dst, ["__key__", "png", "txt"])]
    assert found == members(["shard-000.tar", "shard-001.tar"])
    assert [v.added_rows for v in history(dst)] == [3, 3]


def test_a_compaction_between_incremental_conversions_keeps_what_was_converted(tmp_path: Path) -> None:
    """A compacted version carries the sources of the versions before it: the next ``convert --append`` converts
    only the files added since, and the rows are the same as without the compaction."""
    from unihub.store.compaction import compact_dataset

    root, dst = tmp_path / "images", str(tmp_path / "ds")
    for k, rel in enumerate(["ant/a1.png", "ant/a2.png", "bee/b1.png"]):
        png(root, rel, k + 1)
        assert convert_append(str(root), dst) == 0  # one version a file: 3 parts
    before = rows(dst, ["path", "label"])
    version = compact_dataset(dst)
    assert version is not None and len(version.parts) == 1 and version.operation == "compact"
    assert [s.path for s in version.sources] == [s.path for s in history(dst)[-2].sources]
    png(root, "bee/b2.png", 9)
    assert convert_append(str(root), dst) == 0
    assert convert_append(str(root), dst) == 0  # nothing new: no version
    assert [v.added_rows for v in history(dst)] == [1, 1, 1, 0, 1]
    assert rows(dst, ["path", "label"]) == [*before, {"path": "bee/b2.png", "label": 1}]
