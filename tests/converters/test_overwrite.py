"""``--overwrite`` replaces only what unihub wrote (DESIGN decision 19), and a glob the shell expanded
into SRC and DST is named as such.

A user ran ``unihub convert data/*.tfrecord --overwrite`` on a folder of two TFRecord files: the shell
made the second file DST, and the conversion replaced it with the first. Every test here writes its
foreign files with the format's own library (TensorFlow, PIL, pyarrow) and checks they are untouched.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub import ScalarCodec, Unischema, UnischemaField, convert, write_dataset
from unihub.cli import main
from unihub.converters.copy import copy_dataset
from unihub.errors import DatasetExistsError, ForeignOutputError
from unihub.store.ownership import not_unihubs

tf = pytest.importorskip("tensorflow")

Ids = Unischema("Ids", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False)])


def _tfrecord(path: Path, n: int, start: int = 0) -> Path:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(start, start + n):
            feature = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return path


def _digest(path: Path) -> dict[str, str]:
    """Every file under ``path`` (or ``path`` itself) -> its SHA-256: what "untouched" is checked against."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _ids(tfrecord: Path) -> list[int]:
    return [int(tf.train.Example.FromString(r.numpy()).features.feature["id"].int64_list.value[0])
            for r in tf.data.TFRecordDataset(str(tfrecord))]


def test_an_expanded_glob_of_two_files_does_not_replace_the_second(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    first, second = _tfrecord(tmp_path / "a.tfrecord", 3), _tfrecord(tmp_path / "b.tfrecord", 4, start=10)
    before = _digest(second)
    assert main(["convert", str(first), str(second), "--overwrite"]) == 1  # what the shell made of data/*.tfrecord
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("unihub: error: ") and str(second) in err[0]
    assert "replaces only what unihub wrote" in err[0] and "quote it" in err[0] and "--overwrite-foreign" in err[0]
    assert _digest(second) == before and _ids(second) == [10, 11, 12, 13]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tfrecord", "b.tfrecord"]  # nothing staged is left


def test_an_expanded_glob_of_three_files_says_to_quote_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    files = [str(_tfrecord(tmp_path / f"{name}.tfrecord", 2)) for name in "abc"]
    before = {f: _digest(Path(f)) for f in files}
    with pytest.raises(SystemExit) as done:
        main(["convert", *files, "--overwrite"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "convert takes one SRC and one DST, but 3 paths were given" in err
    assert f"quote it so that unihub expands it, e.g. unihub convert '{tmp_path}/*.tfrecord' DST" in err
    assert {f: _digest(Path(f)) for f in files} == before
    with pytest.raises(SystemExit) as done:  # other stray arguments keep argparse's own message
        main(["inspect", files[0], "--no-such-flag"])
    assert done.value.code == 2 and "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_the_quoted_glob_converts_every_file(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    for name, start in (("a", 0), ("b", 10)):
        _tfrecord(tmp_path / "data" / f"{name}.tfrecord", 3, start=start)
    assert main(["convert", str(tmp_path / "data" / "*.tfrecord"), str(tmp_path / "ds"), "--quiet"]) == 0
    table = pq.read_table(tmp_path / "ds")
    assert sorted(table.column("id").to_pylist()) == [0, 1, 2, 10, 11, 12]


def test_overwrite_replaces_a_unihub_dataset_and_an_empty_folder(tmp_path: Path) -> None:
    source = _tfrecord(tmp_path / "a.tfrecord", 5)
    write_dataset(tmp_path / "ds", Ids, [{"id": 99}])
    convert(source, tmp_path / "ds", overwrite=True, progress=False)
    assert sorted(pq.read_table(tmp_path / "ds").column("id").to_pylist()) == [0, 1, 2, 3, 4]
    (tmp_path / "empty").mkdir()
    convert(source, tmp_path / "empty", overwrite=True, progress=False)
    assert pq.read_table(tmp_path / "empty").num_rows == 5
    with pytest.raises(DatasetExistsError, match="already exists; pass overwrite=True"):
        convert(source, tmp_path / "ds", progress=False)  # and without overwrite, nothing is replaced


def test_overwrite_refuses_a_folder_unihub_did_not_write(tmp_path: Path) -> None:
    from PIL import Image

    source = _tfrecord(tmp_path / "a.tfrecord", 5)
    photos = tmp_path / "photos"
    (photos / "cat").mkdir(parents=True)
    Image.fromarray(np.full((4, 4, 3), 7, np.uint8)).save(photos / "cat" / "1.png")
    (photos / "notes.txt").write_text("mine")
    before = _digest(photos)
    with pytest.raises(ForeignOutputError, match=r"photos exists and is a folder of 2 entries that is not a unihub "
                                                 r"dataset: --overwrite replaces only what unihub wrote"):
        convert(source, photos, overwrite=True, progress=False)
    assert _digest(photos) == before
    with pytest.raises(ForeignOutputError):  # write_dataset and copy_dataset hold to the same rule
        write_dataset(photos, Ids, [{"id": 1}], overwrite=True)
    write_dataset(tmp_path / "ds", Ids, [{"id": 1}])
    with pytest.raises(ForeignOutputError):
        copy_dataset(None, str(tmp_path / "ds"), str(photos), overwrite_output=True)
    assert _digest(photos) == before
    convert(source, photos, overwrite_foreign=True, progress=False)  # said explicitly: replaced
    assert pq.read_table(photos).num_rows == 5 and not (photos / "notes.txt").exists()


def test_overwrite_refuses_parquet_another_tool_wrote(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    pq.write_table(pa.table({"x": [1, 2]}), theirs / "part-0.parquet")  # Spark's or pandas' Parquet: no Unischema
    before = _digest(theirs)
    source = _tfrecord(tmp_path / "a.tfrecord", 2)
    assert main(["convert", str(source), str(theirs), "--overwrite"]) == 1
    assert "without a Unischema in its metadata" in capsys.readouterr().err
    assert _digest(theirs) == before
    assert main(["convert", str(source), str(theirs), "--overwrite-foreign", "--quiet"]) == 0
    assert pq.read_table(theirs).column("id").to_pylist() == [0, 1]


def test_an_export_that_records_no_writer_needs_overwrite_foreign(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    write_dataset(tmp_path / "ds", Ids, [{"id": i} for i in range(3)])
    out = tmp_path / "out.tfrecord"
    assert main(["convert", str(tmp_path / "ds"), str(out), "--quiet"]) == 0
    assert not_unihubs(*_local(out)) == ("is a tfrecord file that unihub cannot tell it wrote (tfrecord files do "
                                         "not record their writer)")
    assert main(["convert", str(tmp_path / "ds"), str(out), "--overwrite"]) == 1
    assert "--overwrite-foreign" in capsys.readouterr().err
    write_dataset(tmp_path / "ds2", Ids, [{"id": 7}])
    assert main(["convert", str(tmp_path / "ds2"), str(out), "--overwrite-foreign", "--quiet"]) == 0
    assert _ids(out) == [7]


def _local(path: Path) -> tuple[object, str]:
    import pyarrow.fs as pafs

    return pafs.LocalFileSystem(), str(path)


def test_an_hdf5_export_is_recognised_and_an_hdf5_file_of_ones_own_is_not(tmp_path: Path) -> None:
    h5py = pytest.importorskip("h5py")
    write_dataset(tmp_path / "ds", Ids, [{"id": i} for i in range(3)])
    ours = tmp_path / "out.h5"
    convert(tmp_path / "ds", ours, progress=False)
    convert(tmp_path / "ds", ours, overwrite=True, progress=False)  # unihub's export: its root attributes say so
    theirs = tmp_path / "theirs.h5"
    with h5py.File(theirs, "w") as handle:
        handle["id"] = np.arange(5)
    before = _digest(theirs)
    with pytest.raises(ForeignOutputError, match="is a hdf5 file that unihub cannot tell it wrote"):
        convert(tmp_path / "ds", theirs, overwrite=True, progress=False)
    assert _digest(theirs) == before


def test_a_target_inside_the_source_dataset_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """An export or copy written into the unihub dataset it reads would land among its part files and
    break it (every later read took the TFRecord for a Parquet part); rewriting the dataset in place
    with --overwrite stays allowed."""
    convert(_tfrecord(tmp_path / "a.tfrecord", 3), tmp_path / "ds")
    before = _digest(tmp_path / "ds")
    for inside in ("back.tfrecord", "copy", "x/y.h5"):
        assert main(["convert", str(tmp_path / "ds"), str(tmp_path / "ds" / inside), "--quiet"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("unihub: error: ") and "is inside the source" in err[0]
        assert _digest(tmp_path / "ds") == before
    # a folder of TFRecord files converted to TFRecord inside itself: a later read doubled the rows
    (tmp_path / "tf").mkdir()
    _tfrecord(tmp_path / "tf" / "a.tfrecord", 3)
    assert main(["convert", str(tmp_path / "tf"), str(tmp_path / "tf" / "b.tfrecord"), "--quiet"]) == 1
    assert "is inside the source" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "tf").iterdir()] == ["a.tfrecord"]
    assert main(["convert", str(tmp_path / "ds"), str(tmp_path / "ds"), "--overwrite", "--quiet"]) == 0
    assert main(["convert", str(tmp_path / "ds"), str(tmp_path / "back.tfrecord"), "--quiet"]) == 0
    assert _ids(tmp_path / "back.tfrecord") == [0, 1, 2]
