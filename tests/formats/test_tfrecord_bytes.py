"""TFRecord round trips are byte-exact per record (DESIGN decision 18): ``unihub convert src ds`` then
``unihub convert ds back.tfrecord --to tfrecord`` gives each record's bytes back, as TensorFlow's own
``TFRecordDataset`` reads them.

Why this needs care: ``Features.feature`` is a protobuf map, and TensorFlow (upb) serializes it in a
hash order seeded per process, neither the order the features were given in nor name order. The ingest
notes that order (``feature_order`` in the dataset's metadata) and the export writes it. Where records
disagree (files written by different processes), the metadata says so (``feature_order_differs``).

Every source is written by TensorFlow's ``tf.io.TFRecordWriter``.
"""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unihub import convert
from unihub.cli import main
from unihub.formats import tfrecord
from unihub.formats.parquet import open_dataset
from unihub.formats.tfexample import parse_example

tf = pytest.importorskip("tensorflow")
PIL = pytest.importorskip("PIL.Image")


def _jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (6, 5, 3), np.uint8)
    out = io.BytesIO()
    PIL.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def _bytes(*values: bytes) -> Any:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(values)))


def _ints(*values: int) -> Any:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))


def _floats(*values: float) -> Any:
    return tf.train.Feature(float_list=tf.train.FloatList(value=list(values)))


def image_label_vec(i: int) -> dict[str, Any]:
    """The issue's records: an image, a label, four floats."""
    rng = np.random.default_rng(i)
    return {"image": _bytes(_jpeg(i)), "label": _ints(i % 7), "vec": _floats(*rng.random(4).tolist())}


def many_kinds(i: int) -> dict[str, Any]:
    """Eleven features: text, ids, varying lists, a big negative int, a tensor with its /shape. (TF's
    order of three features is name order in one process of six; of eleven, nearly never.)"""
    return {"name": _bytes(f"sample {i}".encode()), "id": _ints(i), "big": _ints(-(2 ** 40) - i),
            "tokens": _ints(*range(i % 5 + 1)), "scores": _floats(*[i / 7] * (i % 3 + 1)),
            "blob": _bytes(bytes([i % 256, 0, 255])), "tags": _bytes(b"a", b"bb"[: i % 2 + 1]),
            "weight": _floats(0.5 + i), "flag": _ints(i % 2), "x": _floats(*np.arange(6) + i),
            "x/shape": _ints(2, 3)}


def missing_label(i: int) -> dict[str, Any]:
    """The issue's records, every third one without its label."""
    feature = image_label_vec(i)
    if i % 3 == 1:
        del feature["label"]
    return feature


def _write(path: Path, make: Callable[[int], dict[str, Any]], ids: range, compression: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path), options=compression) as writer:
        for i in ids:
            writer.write(tf.train.Example(features=tf.train.Features(feature=make(i))).SerializeToString())
    return path


def _records(path: Path) -> list[bytes]:
    """Every record's bytes, as TensorFlow's TFRecordDataset reads them (each file in name order)."""
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    out = []
    for file in files:
        compression = "GZIP" if file.name.endswith(".gz") else ""
        out += [r.numpy() for r in tf.data.TFRecordDataset(str(file), compression_type=compression)]
    return out


def _round_trip(src: Path, tmp_path: Path, *ingest: str) -> tuple[Path, Path]:
    ds, back = tmp_path / "ds", tmp_path / "back.tfrecord"
    assert main(["convert", str(src), str(ds), "--quiet", *ingest]) == 0
    assert main(["convert", str(ds), str(back), "--to", "tfrecord", "--quiet"]) == 0
    return ds, back


def _tfrecord_metadata(ds: Path) -> dict[str, Any]:
    return dict(open_dataset(str(ds)).extra_metadata.get("tfrecord") or {})


@pytest.mark.parametrize("make", [image_label_vec, many_kinds, missing_label])
@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_export_gives_each_record_back_byte_for_byte(tmp_path: Path, make: Callable[[int], dict[str, Any]],
                                                     compression: str | None) -> None:
    name = "src.tfrecord.gz" if compression else "src.tfrecord"
    src = _write(tmp_path / name, make, range(60), compression)
    source = _records(src)
    ds, back = _round_trip(src, tmp_path)
    exported = _records(back)
    assert len(exported) == len(source)
    assert [i for i, (a, b) in enumerate(zip(source, exported)) if a != b] == []
    info = _tfrecord_metadata(ds)
    assert info["feature_order"] == list(parse_example(source[0]))
    assert "feature_order_differs" not in info


@pytest.mark.parametrize("fast", [True, False])
def test_several_files_and_both_read_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast: bool) -> None:
    """Shards of one writing process (one order), some records lacking a feature, read with the
    vectorised path and record by record; also with a given schema (the order from prepare's scan)."""
    monkeypatch.setattr(tfrecord, "FAST_PATH", fast)
    for shard in range(3):
        _write(tmp_path / "src" / f"train-{shard:05d}-of-00003", missing_label, range(shard * 50, shard * 50 + 50))
    source = _records(tmp_path / "src")
    ds, back = _round_trip(tmp_path / "src", tmp_path)
    assert _records(back) == source
    schema = tmp_path / "schema.json"
    schema.write_text(open_dataset(str(ds)).schema.to_json())
    given = tmp_path / "given"
    given.mkdir()
    _round_trip(tmp_path / "src", given, "--schema", str(schema))
    assert _records(given / "back.tfrecord") == source


_WRITER = """
import sys
import tensorflow as tf
names = sys.argv[2:]
with tf.io.TFRecordWriter(sys.argv[1]) as writer:
    for i in range(20):
        feature = {n: tf.train.Feature(int64_list=tf.train.Int64List(value=[i])) for n in names}
        writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
"""


def test_files_whose_orders_disagree_are_reported(tmp_path: Path) -> None:
    """TensorFlow seeds its map order per process: shards written by two processes order their features
    differently, and no one order gives both back. The metadata says so, rather than claim exactness."""
    names = [f"f{i:02d}" for i in range(12)]
    (tmp_path / "src").mkdir()
    orders = []
    for attempt in range(8):  # another process, another seed: nearly always another order
        path = tmp_path / "src" / f"part-{attempt}.tfrecord"
        subprocess.run([sys.executable, "-c", textwrap.dedent(_WRITER), str(path), *names], check=True,
                       capture_output=True)
        order = list(parse_example(_records(path)[0]))
        if orders and order != orders[0]:
            orders.append(order)
            break
        if orders:
            path.unlink()
        else:
            orders.append(order)
    else:
        pytest.skip("TensorFlow wrote the features in one order in every process here")
    source = _records(tmp_path / "src")
    ds, back = _round_trip(tmp_path / "src", tmp_path)
    info = _tfrecord_metadata(ds)
    assert "differently" in info["feature_order_differs"]
    assert info["feature_order"] == orders[0]  # the first file's records come back exactly
    exported = _records(back)
    assert exported[:20] == source[:20] and exported[20:] != source[20:]
    assert [tf.train.Example.FromString(r) for r in exported] == [tf.train.Example.FromString(r) for r in source]
    again = convert(tmp_path / "src", tmp_path / "again", progress=False)  # and the conversion's summary says so
    assert any("disagree on their features' order" in note for note in again.notes), again.summary()
    assert "not every record's bytes" in again.summary()


def _sequence_example(i: int) -> bytes:
    """Context and feature lists, some records without the 'words' list."""
    context = {"id": _ints(i), "title": _bytes(f"clip {i}".encode()), "rate": _floats(24.0), "kind": _ints(i % 3),
               "lang": _bytes(b"en")}
    lists = {"frames": [_floats(*np.arange(3) + s) for s in range(i % 4 + 1)],
             "labels": [_ints(s) for s in range(i % 4 + 1)], "audio": [_bytes(b"\x00\x01")] * 2,
             "boxes": [_floats(0.5, 0.25)], "words": [_bytes(b"w")] * (i % 2)}
    if i % 5 == 2:
        del lists["words"]
    return tf.train.SequenceExample(
        context=tf.train.Features(feature=context),
        feature_lists=tf.train.FeatureLists(feature_list={
            name: tf.train.FeatureList(feature=steps) for name, steps in lists.items()})).SerializeToString()


def test_sequence_examples_come_back_byte_for_byte(tmp_path: Path) -> None:
    """A SequenceExample's context and feature lists are maps too: both come back in TF's order."""
    src = tmp_path / "clips.tfrecord"
    with tf.io.TFRecordWriter(str(src)) as writer:
        for i in range(40):
            writer.write(_sequence_example(i))
    source = _records(src)
    ds, back = _round_trip(src, tmp_path)
    assert [i for i, (a, b) in enumerate(zip(source, _records(back))) if a != b] == []
    assert len(_records(back)) == len(source)
    info = _tfrecord_metadata(ds)
    assert info["payload"] == "sequence_example" and "feature_order_differs" not in info


def test_an_order_given_for_the_export(tmp_path: Path) -> None:
    """``--option feature_order=...`` orders an export's features, a ``/shape`` feature apart from its
    field too; features it leaves out follow in the schema's order. The Examples stay TF's."""
    src = _write(tmp_path / "src.tfrecord", many_kinds, range(10))
    ds, _ = _round_trip(src, tmp_path)
    back = tmp_path / "ordered.tfrecord"
    assert main(["convert", str(ds), str(back), "--to", "tfrecord", "--quiet",
                 "--option", "feature_order=x,id,x/shape,name"]) == 0
    exported = _records(back)
    rest = [name for name in open_dataset(str(ds)).schema.fields if name not in ("x", "id", "name")]
    assert [list(parse_example(r)) for r in exported] == [["x", "id", "x/shape", "name", *rest]] * 10
    assert [tf.train.Example.FromString(r) for r in exported] == [tf.train.Example.FromString(r)
                                                                  for r in _records(src)]


def test_features_only_late_records_hold(tmp_path: Path) -> None:
    """Features first seen past the single pass's sample (1,000 records) make the conversion start over
    with the whole input's schema: the order noted is then the whole input's too (it was the sample's,
    and the export silently wrote the late records otherwise)."""
    def late_extras(i: int) -> dict[str, Any]:
        feature = many_kinds(i)
        if i >= 1100:
            feature.update({"extra_a": _ints(i), "extra_b": _bytes(b"b"), "extra_c": _floats(1.5)})
        return feature

    src = _write(tmp_path / "src.tfrecord", late_extras, range(1200))
    ds, back = _round_trip(src, tmp_path)
    info = _tfrecord_metadata(ds)
    assert set(info["feature_order"]) >= {"extra_a", "extra_b", "extra_c"}
    # TF orders a bigger map otherwise (its hash table grew): exact, or said not to be
    exact = _records(back) == _records(src)
    assert exact != ("feature_order_differs" in info)
