"""Finding TFRecord files as TensorFlow and TFDS write them: compression by content (plain, GZIP,
ZLIB, mixed in one folder), TF shard names without extension, TFDS layouts, splits, missing shards.

Every input is written by TensorFlow's own ``tf.io.TFRecordWriter``.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import numpy as np
import pytest

from unihub import make_batch_reader
from unihub.cli import main
from unihub.converters.convert import convert
from unihub.converters.verify import verify
from unihub.errors import FormatError
from unihub.formats.base import detect_format
from unihub.formats.tfrecord.format import TFRecordFormat

tf = pytest.importorskip("tensorflow")


def _example(i: int) -> bytes:
    return tf.train.Example(features=tf.train.Features(feature={
        "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
        "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"row {i}".encode() * (i % 7 + 1)])),
        "vec": tf.train.Feature(float_list=tf.train.FloatList(value=[i / 3, -i, 0.25])),
    })).SerializeToString()


def _write(path: Path, ids: range, compression: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path), options=compression) as writer:
        for i in ids:
            writer.write(_example(i))
    return path


def _ids(dataset: Path) -> list[int]:
    with make_batch_reader(str(dataset), shuffle_row_groups=False) as reader:
        return [int(i) for batch in reader for i in batch.id]


def _left(tmp_path: Path, name: str) -> list[str]:
    return [p.name for p in tmp_path.iterdir() if name in p.name]


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_each_compression_is_found_from_the_bytes(tmp_path: Path, compression: str | None) -> None:
    src = _write(tmp_path / "data.tfrecord", range(300), compression)
    convert(src, tmp_path / "ds")
    assert _ids(tmp_path / "ds") == list(range(300))
    report = verify(src, tmp_path / "ds")
    assert report.equal, report.summary()


def test_one_folder_mixing_compressions(tmp_path: Path) -> None:
    _write(tmp_path / "src" / "a.tfrecord", range(0, 40))
    _write(tmp_path / "src" / "b.tfrecord", range(40, 90), "GZIP")
    _write(tmp_path / "src" / "c.tfrecord", range(90, 100), "ZLIB")
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "ds"), "--quiet"]) == 0
    assert _ids(tmp_path / "ds") == list(range(100))


def test_forcing_a_compression(tmp_path: Path) -> None:
    src = _write(tmp_path / "z", range(20), "ZLIB")
    convert(src, tmp_path / "ds", from_format="tfrecord", format_options={"compression": "ZLIB"})
    assert _ids(tmp_path / "ds") == list(range(20))
    with pytest.raises(FormatError, match="z: record 0 at byte offset 0: length CRC mismatch"):
        convert(src, tmp_path / "ds2", from_format="tfrecord", format_options={"compression": "none"})
    assert not _left(tmp_path, "ds2")


def test_a_truncated_zlib_file_is_a_named_error(tmp_path: Path) -> None:
    src = _write(tmp_path / "z.tfrecord", range(200), "ZLIB")
    data = src.read_bytes()
    cut = tmp_path / "cut.tfrecord"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(FormatError, match=r"cut\.tfrecord: record \d+ at byte offset \d+: .*zlib stream"):
        convert(cut, tmp_path / "ds")
    assert not _left(tmp_path, "ds")
    assert zlib.decompress(data)  # the untouched source is a whole zlib stream


def test_zlib_export_is_read_by_tensorflow(tmp_path: Path) -> None:
    convert(_write(tmp_path / "a.tfrecord", range(30)), tmp_path / "ds")
    assert main(["convert", str(tmp_path / "ds"), str(tmp_path / "out.tfrecord"), "--option", "compression=zlib",
                 "--quiet"]) == 0
    records = list(tf.data.TFRecordDataset(str(tmp_path / "out.tfrecord"), compression_type="ZLIB"))
    assert [tf.train.Example.FromString(r.numpy()).features.feature["id"].int64_list.value[0]
            for r in records] == list(range(30))
    report = verify(tmp_path / "ds", tmp_path / "out.tfrecord")
    assert report.equal, report.summary()


def test_a_folder_of_tf_named_shards_without_extension(tmp_path: Path) -> None:
    for shard in range(3):
        _write(tmp_path / "imagenet" / f"train-{shard:05d}-of-00003", range(shard * 10, shard * 10 + 10))
    assert detect_format(str(tmp_path / "imagenet")) == "tfrecord"
    assert main(["convert", str(tmp_path / "imagenet"), str(tmp_path / "ds"), "--quiet"]) == 0
    assert _ids(tmp_path / "ds") == list(range(30))


def test_an_extensionless_glob(tmp_path: Path) -> None:
    for shard in range(2):
        _write(tmp_path / f"train-{shard:05d}-of-00002", range(shard * 5, shard * 5 + 5), "GZIP")
    pattern = str(tmp_path / "train-*")
    assert detect_format(pattern) == "tfrecord"
    assert main(["convert", pattern, str(tmp_path / "ds"), "--quiet", "--workers", "2"]) == 0
    assert _ids(tmp_path / "ds") == list(range(10))


def _tfds(root: Path) -> Path:
    version = root / "mnist" / "3.0.1"
    for shard in range(2):
        _write(version / f"mnist-train.tfrecord-{shard:05d}-of-00002", range(shard * 8, shard * 8 + 8))
    _write(version / "mnist-test.tfrecord-00000-of-00001", range(100, 104))
    (version / "dataset_info.json").write_text(json.dumps({"name": "mnist", "version": "3.0.1"}))
    (version / "features.json").write_text(json.dumps({"type": "tensorflow_datasets.core.features.FeaturesDict"}))
    (version / "label.labels.txt").write_text("0\n1\n")
    return root / "mnist"


def test_a_tfds_layout_chooses_a_split_and_keeps_its_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root = _tfds(tmp_path)
    assert detect_format(str(root)) == "tfrecord"
    assert main(["convert", str(root), str(tmp_path / "ds"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("unihub: error: ") and err.count("\n") == 1
    assert "2 shard sets" in err and "mnist-test.tfrecord" in err and "split=" in err
    assert not _left(tmp_path, "ds")

    assert main(["convert", str(root), str(tmp_path / "ds"), "--option", "split=train", "--quiet"]) == 0
    assert _ids(tmp_path / "ds") == list(range(16))
    from unihub.store.dataset import open_dataset

    extra = open_dataset(str(tmp_path / "ds")).extra_metadata["tfrecord"]
    assert extra["tfds"]["dataset_info"] == {"name": "mnist", "version": "3.0.1"}
    assert sorted(os.path.basename(p) for p in extra["not_records"]) == \
        ["dataset_info.json", "features.json", "label.labels.txt"]
    report = verify(root, tmp_path / "ds", options={"split": "train"})
    assert report.equal, report.summary()

    assert main(["convert", str(root), str(tmp_path / "test"), "--option", "split=test", "--quiet"]) == 0
    assert _ids(tmp_path / "test") == list(range(100, 104))
    assert main(["convert", str(root), str(tmp_path / "x"), "--option", "split=valid", "--quiet"]) == 1
    assert "no shard set named 'valid'; its splits: test, train" in capsys.readouterr().err


def test_tfds_json_nested_past_pythons_limit_is_left_unread_as_unreadable_json_is(tmp_path: Path) -> None:
    # json.loads' RecursionError escaped _keep_tfds (it kept out OSError and ValueError only): a traceback.
    root = _tfds(tmp_path)
    (root / "3.0.1" / "features.json").write_text("[" * 100_000)
    (root / "3.0.1" / "dataset_info.json").write_text('{"a": ' * 50_000)
    assert main(["convert", str(root), str(tmp_path / "ds"), "--option", "split=train", "--quiet"]) == 0
    assert _ids(tmp_path / "ds") == list(range(16))


def test_a_missing_shard_is_an_error_naming_it(tmp_path: Path) -> None:
    for shard in (0, 1, 3):
        _write(tmp_path / "src" / f"train-{shard:05d}-of-00004", range(3))
    with pytest.raises(FormatError, match=r"train-\*-of-00004: shard set of 4 files lacks 1 \(shard 2\)"):
        convert(tmp_path / "src", tmp_path / "ds")
    with pytest.raises(FormatError, match="lacks 1"):
        convert(str(tmp_path / "src" / "train-*"), tmp_path / "ds")
    assert not _left(tmp_path, "ds")
    # named one by one, or by a glob for some shards only, the files are what the user chose
    named = [str(tmp_path / "src" / f"train-{s:05d}-of-00004") for s in (0, 1)]
    assert TFRecordFormat(named).files() == named
    assert TFRecordFormat(str(tmp_path / "src" / "train-0000[01]-of-00004")).files() == named
    with pytest.raises(FormatError, match=r"lacks 1 \(shard 2\)"):  # a glob that would list shard 2
        TFRecordFormat(str(tmp_path / "src" / "train-0000[0-3]-of-00004")).files()


def test_files_that_hold_no_records_are_left_out_by_content(tmp_path: Path) -> None:
    _write(tmp_path / "src" / "part-a", range(5))  # no extension, found by its bytes
    (tmp_path / "src" / "README.md").write_text("# shards\n")
    np.save(tmp_path / "src" / "stats.npy", np.arange(3))
    source = TFRecordFormat(str(tmp_path / "src"))
    assert [os.path.basename(f) for f in source.files()] == ["part-a"]
    assert sorted(source.metadata()["tfrecord"]["not_records"]) == ["src/README.md", "src/stats.npy"]


# -- a shard set is its stem and -of-N, whatever each file's compression ---------------------------
def _mixed_set(root: Path) -> Path:
    """``train-00000-of-00002.tfrecord`` (plain) and ``train-00001-of-00002.tfrecord.gz`` (GZIP)."""
    _write(root / "train-00000-of-00002.tfrecord", range(0, 12))
    _write(root / "train-00001-of-00002.tfrecord.gz", range(12, 20), "GZIP")
    return root


def _tf_records(paths: list[Path]) -> list[bytes]:
    """Every record of ``paths`` as TensorFlow reads them (the compression from the name)."""
    return [r.numpy() for p in paths for r in tf.data.TFRecordDataset(
        str(p), compression_type="GZIP" if p.name.endswith(".gz") else "")]


@pytest.mark.parametrize("how", ["directory", "split", "braces"])
def test_a_set_with_one_shard_compressed_converts_whole(tmp_path: Path, how: str) -> None:
    src = _mixed_set(tmp_path / "src")
    given, options = {
        "directory": (str(src), {}),
        "split": (str(src), {"split": "train"}),
        "braces": (str(src / "train-0000{0-of-00002.tfrecord,1-of-00002.tfrecord.gz}"), {}),
    }[how]
    convert(given, tmp_path / "ds", format_options=options)
    assert _ids(tmp_path / "ds") == list(range(20))
    report = verify(given, tmp_path / "ds", options=options)  # every record against TensorFlow's parse
    assert report.equal and report.rows_source == 20, report.summary()
    # and back: the export holds the very records TensorFlow reads from the two shards
    assert main(["convert", str(tmp_path / "ds"), str(tmp_path / "out.tfrecord"), "--quiet"]) == 0
    originals = _tf_records(sorted(src.iterdir()))
    assert [tf.train.Example.FromString(r) for r in _tf_records([tmp_path / "out.tfrecord"])] == \
        [tf.train.Example.FromString(r) for r in originals]


def test_a_set_with_one_shard_compressed_still_needs_every_shard(tmp_path: Path) -> None:
    src = _mixed_set(tmp_path / "src")
    (src / "train-00000-of-00002.tfrecord").unlink()
    with pytest.raises(FormatError, match=r"train-\*-of-00002\.tfrecord: shard set of 2 files lacks 1 \(shard 0\)"):
        convert(src, tmp_path / "ds")
    # a shard there under two names would be read twice
    _write(src / "train-00001-of-00002.tfrecord", range(12, 20))
    _write(src / "train-00000-of-00002.tfrecord", range(0, 12))
    with pytest.raises(FormatError, match=r"a shard is there under two names \(train-00001-of-00002\.tfrecord, "
                                          r"train-00001-of-00002\.tfrecord\.gz\)"):
        convert(src, tmp_path / "ds")
    assert not _left(tmp_path, "ds")
    # named one by one, the files are what the user chose
    named = [str(src / "train-00000-of-00002.tfrecord"), str(src / "train-00001-of-00002.tfrecord.gz")]
    assert TFRecordFormat(named).files() == named


def test_a_file_named_twice_under_two_spellings_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``{tf/a,./tf/a}`` or a relative and an absolute path name one file: its rows are stored once,
    as for ``{tf/a,tf/a}``; verify against that file says equal."""
    _write(tmp_path / "tf" / "a.tfrecord", range(5))
    monkeypatch.chdir(tmp_path)
    for i, given in enumerate(["{tf/a.tfrecord,./tf/a.tfrecord}", f"{{{tmp_path}/tf/a.tfrecord,tf/a.tfrecord}}"]):
        assert main(["convert", given, f"ds{i}", "--quiet"]) == 0
        assert _ids(tmp_path / f"ds{i}") == list(range(5))
        assert verify("tf/a.tfrecord", f"ds{i}").equal
