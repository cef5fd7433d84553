"""TFRecord round trips are byte-exact per record (DESIGN decision 18): ``unihub convert src ds`` then
``unihub convert ds back.tfrecord --to tfrecord`` gives each record's bytes back, as TensorFlow's own
``TFRecordDataset`` reads them.

Why this needs care: ``Features.feature`` is a protobuf map, and TensorFlow (upb) serializes it in a
hash order seeded per process, neither the order the features were given in nor name order. The ingest
notes that order (``feature_order`` in the dataset's metadata) and the export writes it. Where records
disagree (files written by different processes), each row keeps its own (``__feature_order__``).

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
from unihub.formats.tfrecord import format as tfrecord
from unihub.formats.tfrecord.example import parse_example
from unihub.formats.tfrecord.parsers import EXAMPLE_PARSERS
from unihub.formats.tfrecord.sequence import parse_sequence_example
from unihub.schema.unischema import Unischema
from unihub.store.dataset import open_dataset

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


@pytest.mark.parametrize("parser", list(EXAMPLE_PARSERS))
def test_several_files_and_both_read_paths(tmp_path: Path, parser: str) -> None:
    """Shards of one writing process (one order), some records lacking a feature, read with the
    vectorised path and record by record; also with a given schema (the order from prepare's scan)."""
    for shard in range(3):
        _write(tmp_path / "src" / f"train-{shard:05d}-of-00003", missing_label, range(shard * 50, shard * 50 + 50))
    source = _records(tmp_path / "src")
    ds, back = _round_trip(tmp_path / "src", tmp_path, "--option", f"parser={parser}")
    assert _records(back) == source
    schema = tmp_path / "schema.json"
    schema.write_text(open_dataset(str(ds)).schema.to_json())
    given = tmp_path / "given"
    given.mkdir()
    _round_trip(tmp_path / "src", given, "--schema", str(schema), "--option", f"parser={parser}")
    assert _records(given / "back.tfrecord") == source


_WRITER = """
import sys
import tensorflow as tf
path, start, count, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
with tf.io.TFRecordWriter(path) as writer:
    for i in range(start, start + count):
        feature = {n: tf.train.Feature(int64_list=tf.train.Int64List(value=[i * 100 + k])) for k, n in enumerate(names)}
        if i % 7 == 3:  # some records lack a feature: another layout, the same order
            del feature[names[1]]
        writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
"""
NAMES = [f"f{i:02d}" for i in range(12)]
_SEQUENCE_WRITER = """
import sys
import tensorflow as tf
path, start, count, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
with tf.io.TFRecordWriter(path) as writer:
    for i in range(start, start + count):
        context = {n: tf.train.Feature(int64_list=tf.train.Int64List(value=[i * 100 + k])) for k, n in enumerate(names)}
        lists = {"l" + n: tf.train.FeatureList(feature=[tf.train.Feature(float_list=tf.train.FloatList(value=[s]))
                                                        for s in range(i % 3 + 1)]) for n in names[:8]}
        writer.write(tf.train.SequenceExample(context=tf.train.Features(feature=context),
                     feature_lists=tf.train.FeatureLists(feature_list=lists)).SerializeToString())
"""


def _order(record: bytes) -> Any:
    """A record's names on the wire: an Example's features, a SequenceExample's context and lists."""
    try:
        return list(parse_example(record))
    except ValueError:
        context, lists = parse_sequence_example(record)
        return list(context), list(lists or ())


#: records each writer process writes (ids 0 on): enough for every file ``_two_writers`` is asked for
_PROCESS_RECORDS = 1160
_written: dict[str, list[list[bytes]]] = {}


def _process_records(script: str, processes: int, directory: Path) -> list[bytes]:
    """The raw records of ids ``0 ..`` written by writer process number ``processes - 1`` of ``script``: each
    process's records are kept for the module (a record's content is its id's; its feature order, the
    process's), so that the tests share a few starts of TensorFlow rather than two or more each."""
    done = _written.setdefault(script, [])
    while len(done) < processes:
        path = directory / f"writer-{len(done)}.tfrecord"
        subprocess.run([sys.executable, "-c", textwrap.dedent(script), str(path), "0", str(_PROCESS_RECORDS),
                        *NAMES], check=True, capture_output=True)
        done.append(_records(path))
        path.unlink()
    return done[processes - 1]


def _two_writers(directory: Path, counts: tuple[int, int] = (20, 20), script: str = _WRITER) -> tuple[Path, Path]:
    """Two files of records TensorFlow wrote in two processes that order the features differently
    (another process, another seed: nearly always another order); record ids go on from one to the other."""
    directory.mkdir(parents=True, exist_ok=True)
    assert sum(counts) <= _PROCESS_RECORDS
    first = _process_records(script, 1, directory)
    for process in range(2, 9):
        second = _process_records(script, process, directory)
        if _order(second[0]) != _order(first[0]):
            a, b = directory / "part-0.tfrecord", directory / "part-1.tfrecord"
            _interleaved(a, [first[:counts[0]]])
            _interleaved(b, [second[counts[0]:sum(counts)]])
            return a, b
    pytest.skip("TensorFlow wrote the features in one order in every process here")


def _interleaved(path: Path, parts: list[list[bytes]]) -> Path:
    """One file of the raw records of ``parts``, taken in turn (TF's writer, the bytes as they are)."""
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(max(map(len, parts))):
            for part in parts:
                if i < len(part):
                    writer.write(part[i])
    return path


def _assert_exact(source: list[bytes], back: Path) -> None:
    exported = _records(back)
    assert len(exported) == len(source)
    assert [i for i, (a, b) in enumerate(zip(source, exported)) if a != b] == []


def _assert_orders_kept(ds: Path, orders: int = 2) -> None:
    """The dataset keeps each row's order: the field, and a table of the distinct orders."""
    info = _tfrecord_metadata(ds)
    assert "feature_order_differs" not in info
    assert len({tuple(names) for names in info["feature_orders"].values()} - {()}) >= orders
    assert tfrecord.ORDER_FIELD in open_dataset(str(ds)).schema.fields


@pytest.mark.parametrize("parser", list(EXAMPLE_PARSERS))
def test_files_whose_orders_disagree_come_back_byte_for_byte(tmp_path: Path, parser: str) -> None:
    """TensorFlow seeds its map order per process: shards written by two processes order their features
    differently, and no one order gives both back. Each row keeps its own (``__feature_order__``, a
    table in the metadata), and every record comes back byte for byte (it came back as an equal Example
    with other bytes, flagged ``feature_order_differs``); nothing in the summary says otherwise."""
    _two_writers(tmp_path / "src")
    source = _records(tmp_path / "src")
    ds, back = _round_trip(tmp_path / "src", tmp_path, "--option", f"parser={parser}")
    _assert_exact(source, back)
    _assert_orders_kept(ds)
    again = convert(tmp_path / "src", tmp_path / "again", progress=False, format_options={"parser": parser})
    assert not any("disagree" in note for note in again.notes), again.summary()
    assert main(["verify", str(tmp_path / "src"), str(ds)]) == 0


@pytest.mark.parametrize("where", ["from the start", "past the sample"])
def test_one_file_whose_records_disagree(tmp_path: Path, where: str) -> None:
    """One file whose records two processes wrote, taken in turn: from its first records (the single
    pass's sample sees both orders), or only past the 1,000-record sample (the conversion starts over
    with the field): every record comes back byte for byte."""
    early = where == "from the start"
    a, b = _two_writers(tmp_path / "parts", (40, 40) if early else (1100, 60))
    first, second = _records(a), _records(b)
    parts = [first, second] if early else [first[1050:], second]
    src = _interleaved(tmp_path / "src.tfrecord", parts)
    if not early:  # 1,050 records of one order, then both in turn
        src = _interleaved(tmp_path / "joined.tfrecord", [first[:1050] + _records(src)])
    source = _records(src)
    ds, back = _round_trip(src, tmp_path)
    _assert_exact(source, back)
    _assert_orders_kept(ds)


def test_shards_past_the_sample_in_one_pass(tmp_path: Path) -> None:
    """Shards of two processes, the first longer than the single pass's sample: the first record of the
    other shard already shows another order, so the provisional schema keeps each row's from the start
    (no second pass over the input), and every record comes back byte for byte."""
    _two_writers(tmp_path / "src", (1100, 30))
    assert tfrecord.ORDER_FIELD in tfrecord.TFRecordFormat(str(tmp_path / "src")).provisional_schema().fields
    ds, back = _round_trip(tmp_path / "src", tmp_path)
    _assert_exact(_records(tmp_path / "src"), back)
    _assert_orders_kept(ds)


def test_forked_workers(tmp_path: Path) -> None:
    """``--workers 2``: each worker reads its files and numbers their orders the same way (a hash of
    the names), so the rows of both name theirs in the dataset's one table."""
    _two_writers(tmp_path / "src")
    source = _records(tmp_path / "src")
    result = convert(tmp_path / "src", tmp_path / "ds", workers=2, progress=False)
    assert not any("in-process" in note for note in result.notes), result.notes
    back = tmp_path / "back.tfrecord"
    assert main(["convert", str(tmp_path / "ds"), str(back), "--to", "tfrecord", "--quiet"]) == 0
    _assert_exact(source, back)
    _assert_orders_kept(tmp_path / "ds")


def test_a_given_schema(tmp_path: Path) -> None:
    """A schema given (without the order field: the records' own fields) gets the field where the
    records disagree, and every record comes back byte for byte."""
    _two_writers(tmp_path / "src")
    inferred = convert(tmp_path / "src", tmp_path / "inferred", progress=False)
    assert inferred.rows == 40
    schema = tmp_path / "schema.json"
    schema.write_text(Unischema("TFRecord", [f for f in open_dataset(str(tmp_path / "inferred")).schema
                                             if f.name != tfrecord.ORDER_FIELD]).to_json())
    assert "__feature_order__" not in schema.read_text()
    ds, back = _round_trip(tmp_path / "src", tmp_path, "--schema", str(schema))
    _assert_exact(_records(tmp_path / "src"), back)
    _assert_orders_kept(ds)


def test_a_copy_then_export(tmp_path: Path) -> None:
    """A dataset converted to another one (``unihub convert ds ds2``) keeps the rows' orders and their
    table: its export gives every record back byte for byte."""
    _two_writers(tmp_path / "src")
    ds, _ = _round_trip(tmp_path / "src", tmp_path)
    copy, back = tmp_path / "copy", tmp_path / "copy.tfrecord"
    assert main(["convert", str(ds), str(copy), "--quiet"]) == 0
    assert main(["convert", str(copy), str(back), "--to", "tfrecord", "--quiet"]) == 0
    _assert_exact(_records(tmp_path / "src"), back)


def test_an_order_the_table_lacks_is_refused(tmp_path: Path) -> None:
    """A row naming an order that the table lacks (metadata lost, rows of another dataset) or holds
    under another number (another dataset's table) is a named error, never a record written otherwise."""
    from unihub.errors import FormatError
    from unihub.formats.tfrecord.schema import order_field, order_id

    _two_writers(tmp_path / "src")
    ds, _ = _round_trip(tmp_path / "src", tmp_path)
    store = open_dataset(str(ds))
    table = _tfrecord_metadata(ds)["feature_orders"]
    rows = store.read_row_group(0).to_pydict()
    assert set(map(str, rows[tfrecord.ORDER_FIELD])) <= set(table)
    schema = Unischema("TFRecord", list(store.schema))
    assert order_field().name in schema.fields
    number = rows[tfrecord.ORDER_FIELD][0]
    wrong = {**table, str(number): list(reversed(table[str(number)]))}
    assert order_id(tuple(wrong[str(number)])) != number
    for orders in (None, {}, {k: v for k, v in table.items() if k != str(number)}, wrong):
        with pytest.raises(FormatError, match="feature_orders"):
            tfrecord.TFRecordFormat.write(str(tmp_path / "out.tfrecord"), schema, [rows], feature_orders=orders)
    tfrecord.TFRecordFormat.write(str(tmp_path / "out.tfrecord"), schema, [rows], feature_orders=table)


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


def test_sequence_examples_whose_orders_disagree(tmp_path: Path) -> None:
    """SequenceExamples of two TF processes: their contexts and feature lists come back in each record's
    own orders, byte for byte, read as a whole too with a given schema (prepare's scan)."""
    _two_writers(tmp_path / "src", script=_SEQUENCE_WRITER)
    source = _records(tmp_path / "src")
    ds, back = _round_trip(tmp_path / "src", tmp_path)
    _assert_exact(source, back)
    info = _tfrecord_metadata(ds)
    assert info["payload"] == "sequence_example" and "feature_order_differs" not in info
    assert len(info["feature_orders"]) >= 2
    schema = tmp_path / "schema.json"
    given = tmp_path / "given"
    given.mkdir()
    schema.write_text(Unischema("TFRecord", [f for f in open_dataset(str(ds)).schema
                                             if f.name != tfrecord.ORDER_FIELD]).to_json())
    _round_trip(tmp_path / "src", given, "--schema", str(schema))
    _assert_exact(source, given / "back.tfrecord")
    assert main(["verify", str(tmp_path / "src"), str(ds)]) == 0


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
