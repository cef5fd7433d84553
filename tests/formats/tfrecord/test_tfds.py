"""TFDS directories: the fields are what ``features.json`` declares (shapes, dtypes, class names), the
values are what TFDS itself reads, and an export writes back the records TensorFlow parses from the source.

The directories are written by TFDS's own builder (``tfds.core.GeneratorBasedBuilder``, built here,
nothing downloaded).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unihub import make_reader
from unihub.cli import main
from unihub.converters.convert import convert
from unihub.converters.verify import verify
from unihub.errors import FormatError, SchemaError
from unihub.formats.tfrecord.format import TFRecordFormat
from unihub.formats.tfrecord.parsers import EXAMPLE_PARSERS
from unihub.schema.codecs import CompressedImageCodec
from unihub.store.dataset import open_dataset

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")
tfds = pytest.importorskip("tensorflow_datasets")

TRAIN = 7


class UnihubProbe(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A small TFDS dataset of the features whose shapes the records alone do not tell."""

    VERSION = tfds.core.Version("1.0.0")
    # TFDS looks for a checksums file beside a builder in a package through importlib_resources, which
    # etils does not install on Python 3.11; a builder of no package has none to look for
    __module__ = "unihub_probe"

    def _info(self) -> Any:
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(8, 6, 3)),
            "gray": tfds.features.Image(shape=(5, 4, 1)),  # MNIST's kind: one channel
            "label": tfds.features.ClassLabel(names=["cat", "dog", "bird"]),
            "text": tfds.features.Text(),
            "words": tfds.features.Sequence(tfds.features.Text()),
            "boxes": tfds.features.Sequence(tfds.features.BBoxFeature()),
            "objects": tfds.features.Sequence({"bbox": tfds.features.BBoxFeature(),
                                               "kind": tfds.features.ClassLabel(names=["a", "b"])}),
            "pair": tfds.features.Sequence(tfds.features.BBoxFeature(), length=2),
            "tags": tfds.features.Sequence(tfds.features.ClassLabel(num_classes=5)),  # 0 or 1 in each record
            "t": tfds.features.Tensor(shape=(2, 3), dtype=np.float32),
            "u8": tfds.features.Tensor(shape=(4,), dtype=np.uint8),
            "rows": tfds.features.Tensor(shape=(None, 3), dtype=np.int32),
            "flag": tfds.features.Scalar(dtype=np.bool_),
            "meta": {"id": np.int64, "score": np.float64},
            "raw": tfds.features.Tensor(shape=(2,), dtype=np.float64, encoding="bytes"),  # left to the records
        }))

    def _split_generators(self, dl_manager: Any) -> Any:
        return {"train": self._generate_examples(TRAIN), "test": self._generate_examples(2)}

    def _generate_examples(self, n: int) -> Iterator[tuple[int, dict[str, Any]]]:
        rng = np.random.default_rng(n)
        for i in range(n):
            box = tfds.features.BBox(0.1 * (i % 5), 0.2, 0.3 + 0.1 * (i % 5), 0.4)
            yield i, {"image": rng.integers(0, 255, (8, 6, 3), dtype=np.uint8),
                      "gray": rng.integers(0, 255, (5, 4, 1), dtype=np.uint8),
                      "label": ["cat", "dog", "bird"][i % 3], "text": f"héllo {i}" * (i % 3),
                      "words": [f"w{j}é" for j in range(i % 3)],
                      "boxes": [box] * i, "objects": {"bbox": [box] * (i % 3), "kind": [i % 2] * (i % 3)},
                      "pair": [box, box], "tags": [i % 5] * (i % 2), "t": np.arange(6, dtype=np.float32).reshape(2, 3) / (i + 1),
                      "u8": np.array([1, 2, 250, i], np.uint8), "rows": np.full((i % 4, 3), i, np.int32),
                      "flag": bool(i % 2), "meta": {"id": 10 * i, "score": i / 3}, "raw": np.array([i, -i / 7])}


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``<root>/unihub_probe/1.0.0``: two splits, features.json, dataset_info.json, label.labels.txt."""
    root = tmp_path_factory.mktemp("tfds")
    builder = UnihubProbe(data_dir=str(root))
    builder.download_and_prepare()
    return Path(builder.data_dir)


def _tfds_examples(version: Path) -> list[dict[str, Any]]:
    """The train split as TFDS itself reads it (in file order)."""
    builder = tfds.builder_from_directory(str(version))
    return list(tfds.as_numpy(builder.as_dataset(split="train", shuffle_files=False)))


def _records(paths: list[Path]) -> list[Any]:
    """Every record of ``paths`` as TensorFlow parses it."""
    return [tf.train.Example.FromString(r.numpy()) for p in paths for r in tf.data.TFRecordDataset(str(p))]


def test_tfds_features_give_the_declared_fields(tfds_dir: Path, tmp_path: Path) -> None:
    convert(tfds_dir, tmp_path / "ds", format_options={"split": "train"})
    dataset = open_dataset(str(tmp_path / "ds"))
    schema = dataset.schema
    got = {f.name: (np.dtype(f.numpy_dtype).name if f.numpy_dtype not in (str, bytes) else f.numpy_dtype.__name__,
                    f.shape) for f in schema}
    assert got == {
        "image": ("uint8", (8, 6, 3)), "gray": ("uint8", (5, 4, 1)), "label": ("int64", ()), "text": ("str", ()),
        "words": ("str", (None,)),
        "boxes": ("float32", (None, 4)), "objects/bbox": ("float32", (None, 4)), "objects/kind": ("int64", (None,)),
        "pair": ("float32", (2, 4)), "tags": ("int64", (None,)), "t": ("float32", (2, 3)), "u8": ("uint8", (4,)), "rows": ("int32", (None, 3)),
        "flag": ("bool", ()), "meta/id": ("int64", ()), "meta/score": ("float64", ()),
        "raw": ("bytes", ()),  # TFDS's own byte encoding: kept as the bytes it wrote
    }
    assert isinstance(schema.image.codec, CompressedImageCodec) and isinstance(schema.gray.codec, CompressedImageCodec)
    assert not any(f.nullable for f in schema)  # an empty Sequence is an empty array, not None
    info = dataset.extra_metadata["tfrecord"]
    assert info["tfds_features"]["label"] == {"type": "ClassLabel", "num_classes": 3, "names": ["cat", "dog", "bird"]}
    assert info["tfds_features"]["objects/kind"] == {"type": "ClassLabel", "num_classes": 2, "names": ["a", "b"]}
    assert info["tfds_features"]["boxes"] == {"type": "BBoxFeature"} and "raw" not in info["tfds_features"]
    assert info["tfds"]["dataset_info"]["name"] == "unihub_probe"


def test_tfds_values_are_what_tfds_reads(tfds_dir: Path, tmp_path: Path) -> None:
    convert(tfds_dir, tmp_path / "ds", format_options={"split": "train"})
    with make_reader(str(tmp_path / "ds"), shuffle_row_groups=False) as reader:
        rows = [row._asdict() for row in reader]
    theirs = _tfds_examples(tfds_dir)
    assert len(rows) == len(theirs) == TRAIN
    for ours, ex in zip(rows, theirs):
        pairs = [("image", ex["image"]), ("gray", ex["gray"]), ("label", ex["label"]), ("boxes", ex["boxes"]),
                 ("objects/bbox", ex["objects"]["bbox"]), ("objects/kind", ex["objects"]["kind"]),
                 ("pair", ex["pair"]), ("tags", ex["tags"]), ("t", ex["t"]), ("u8", ex["u8"]), ("rows", ex["rows"]),
                 ("flag", ex["flag"]), ("meta/id", ex["meta"]["id"]), ("meta/score", ex["meta"]["score"])]
        for name, value in pairs:
            value = np.asarray(value)
            assert np.asarray(ours[name]).dtype == value.dtype, name
            np.testing.assert_array_equal(ours[name], value, err_msg=name)
            assert np.asarray(ours[name]).shape == value.shape, name
        assert ours["text"] == ex["text"].decode()
        assert list(ours["words"]) == [w.decode() for w in ex["words"]]


def test_tfds_round_trip_gives_the_records_back(tfds_dir: Path, tmp_path: Path) -> None:
    assert main(["convert", str(tfds_dir), str(tmp_path / "ds"), "--option", "split=train", "--quiet"]) == 0
    report = verify(tfds_dir, tmp_path / "ds", options={"split": "train"})
    assert report.equal and report.rows_source == TRAIN, report.summary()
    assert main(["convert", str(tmp_path / "ds"), str(tmp_path / "out.tfrecord"), "--quiet"]) == 0
    source = sorted(tfds_dir.glob("*-train.tfrecord-*"))
    assert _records([tmp_path / "out.tfrecord"]) == _records(source)  # every feature, value and list kind
    assert verify(tmp_path / "ds", tmp_path / "out.tfrecord").equal


def test_records_that_contradict_features_json_are_refused(tfds_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in tfds_dir.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    features = json.loads((copy / "features.json").read_text())
    features["featuresDict"]["features"]["t"]["tensor"]["dtype"] = "int32"  # the records hold floats
    (copy / "features.json").write_text(json.dumps(features))
    first = sorted(copy.glob("*-train.tfrecord-*"))[0]
    with pytest.raises(SchemaError, match=f"feature 't': features.json declares a TFDS Tensor \\(int32, written as "
                                          f"int64 lists\\), but {first} record 0 holds float lists"):
        TFRecordFormat(str(copy), split="train").infer_schema()


def test_features_json_of_tfds_before_4_6(tfds_dir: Path, tmp_path: Path) -> None:
    """TFDS before 4.6 wrote ``{"type": ..., "content": ...}``; TFDS still reads it, and so does unihub."""
    legacy = {"type": "tensorflow_datasets.core.features.features_dict.FeaturesDict", "content": {
        "label": {"type": "tensorflow_datasets.core.features.class_label_feature.ClassLabel",
                  "content": {"num_classes": 3}},
        "boxes": {"type": "tensorflow_datasets.core.features.sequence_feature.Sequence",
                  "content": {"feature": {"type": "tensorflow_datasets.core.features.bounding_boxes.BBoxFeature",
                                          "content": {}}, "length": None}},
        "image": {"type": "tensorflow_datasets.core.features.image_feature.Image",
                  "content": {"shape": [8, 6, 3], "dtype": "uint8", "encoding_format": "png"}},
        "t": {"type": "tensorflow_datasets.core.features.tensor_feature.Tensor",
              "content": {"shape": [2, 3], "dtype": "float32"}},
    }}
    parsed = tfds.features.FeatureConnector.from_json(json.loads(json.dumps(legacy)))  # TFDS's reading (in place)
    assert parsed["boxes"].shape == (None, 4) and parsed["label"].num_classes == 3
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in tfds_dir.iterdir():
        if path.name != "features.json":
            (copy / path.name).write_bytes(path.read_bytes())
    (copy / "features.json").write_text(json.dumps(legacy))
    schema = TFRecordFormat(str(copy), split="train").infer_schema()
    assert (schema.boxes.shape, schema.image.shape, schema.t.shape, schema.label.shape) == ((None, 4), (8, 6, 3),
                                                                                           (2, 3), ())
    assert schema["objects/bbox"].shape == (None,)  # not declared here: as the records alone say


def test_tfds_files_named_by_a_glob_find_features_json_beside_them(tfds_dir: Path) -> None:
    source = TFRecordFormat(str(tfds_dir / "*-train.tfrecord-*"))
    schema = source.infer_schema()
    assert (schema.boxes.shape, schema.t.shape, schema.u8.numpy_dtype) == ((None, 4), (2, 3), np.uint8)
    assert source.metadata()["tfrecord"]["tfds_features"]["label"]["names"] == ["cat", "dog", "bird"]


@pytest.mark.parametrize("parser", list(EXAMPLE_PARSERS))
def test_a_shard_short_of_what_dataset_info_says_is_refused(tfds_dir: Path, tmp_path: Path, parser: str) -> None:
    """A shard cut at a record's end frames cleanly; dataset_info.json's shardLengths tell its records are missing."""
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in tfds_dir.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    assert main(["convert", str(copy), str(tmp_path / "whole"), "--option", "split=train", "--option",
                 f"parser={parser}", "--quiet"]) == 0
    shard = next(copy.glob("*-train.tfrecord-*"))
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(shard))]
    with tf.io.TFRecordWriter(str(shard)) as writer:  # the same file less its last record
        for record in records[:-1]:
            writer.write(record)
    with pytest.raises(FormatError, match=f"{shard}: holds {TRAIN - 1} records, but TFDS's dataset_info.json says "
                                          f"this shard holds {TRAIN}: 1 would be missing"):
        convert(copy, tmp_path / "ds", format_options={"split": "train", "parser": parser})
    assert not (tmp_path / "ds").exists()
