"""Empty Examples and features whose bytes TensorFlow reads as nothing: a Feature with no list set
(``tf.train.Feature()``, what touching ``feature["x"]`` leaves) beside empty lists, and an Example with no
features field (``tf.train.Example()``, ``b''``) beside an empty one (``0a 00``). An export writes each back
byte for byte, and verify tells them apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from unihub.converters.convert import convert
from unihub.converters.verify import verify
from unihub.formats.tfrecord import format as tfr
from unihub.store.dataset import open_dataset

tf = pytest.importorskip("tensorflow")


def _records(path: Path, records: list[bytes]) -> Path:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)
    return path


def _read(path: Path) -> list[bytes]:
    return [r.numpy() for r in tf.data.TFRecordDataset(str(path))]


def _touched(i: int) -> bytes:
    """An Example whose ``label`` is set in even records and only touched in odd ones, and whose ``tags``
    is always only touched (no list of any kind)."""
    ex = tf.train.Example()
    ex.features.feature["id"].int64_list.value.append(i)
    if i % 2 == 0:
        ex.features.feature["label"].int64_list.value.append(i * 10)
    else:
        ex.features.feature["label"]  # noqa: B018  (touched: a Feature with no list set)
    ex.features.feature["tags"]  # noqa: B018
    return ex.SerializeToString()


def _round_trip(tmp_path: Path, name: str, records: list[bytes]) -> None:
    """``records`` written by TensorFlow, converted to ``ds`` and back to ``back.tfrecord``: the same bytes, and
    verify of the source against the dataset says equal."""
    source = _records(tmp_path / f"{name}.tfrecord", records)
    convert(source, tmp_path / "ds")
    convert(tmp_path / "ds", tmp_path / "back.tfrecord")
    assert _read(tmp_path / "back.tfrecord") == records
    report = verify(source, tmp_path / "ds")
    assert report.equal, report.summary()


def test_features_with_no_list_set_export_back_byte_for_byte(tmp_path: Path) -> None:
    records = [_touched(i) for i in range(6)]
    assert b"\x12\x00" in records[1]  # the Feature with no list: field 2, empty
    _round_trip(tmp_path, "touched", records)
    report = verify(tmp_path / "ds", tmp_path / "back.tfrecord")
    assert report.equal, report.summary()


def test_verify_tells_a_feature_with_no_list_from_an_empty_list(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A dataset that does not keep the fact (as written before it was kept) exports empty lists, as
    before: verify names the feature where TensorFlow's messages differ in kind."""
    source = _records(tmp_path / "touched.tfrecord", [_touched(i) for i in range(4)])
    convert(source, tmp_path / "new")
    assert open_dataset(str(tmp_path / "new")).extra_metadata["tfrecord"]["empty_without_kind"] == ["label", "tags"]
    monkeypatch.setattr(tfr, "without_kind", lambda stats: ([], []))  # an ingest that kept no such fact
    convert(source, tmp_path / "ds")
    assert "empty_without_kind" not in open_dataset(str(tmp_path / "ds")).extra_metadata["tfrecord"]
    convert(tmp_path / "ds", tmp_path / "old.tfrecord")
    assert _read(tmp_path / "old.tfrecord")[1] != _read(source)[1]  # as before: empty lists
    report = verify(source, tmp_path / "ds")
    assert not report.equal
    assert "'features'/label: expected None, found int64[0] []" in report.summary()


def test_records_mixing_empty_lists_and_no_list_say_so(tmp_path: Path) -> None:
    def record(i: int) -> bytes:
        ex = tf.train.Example()
        ex.features.feature["id"].int64_list.value.append(i)
        if i % 2:
            ex.features.feature["x"].int64_list.value.extend([])  # an empty int64_list
            ex.features.feature["x"].int64_list.SetInParent()
        else:
            ex.features.feature["x"]  # noqa: B018
        return ex.SerializeToString()

    source = _records(tmp_path / "mixed.tfrecord", [record(i) for i in range(4)])
    result = convert(source, tmp_path / "ds")
    assert any("Feature with no list set" in note for note in result.notes), result.notes


def _maybe_bare(i: int, bare: bool) -> bytes:
    """An Example with an ``id``, or none: ``tf.train.Example()`` (``b''``) where ``bare``, else one whose
    features were set (``0a 00``)."""
    ex = tf.train.Example()
    if i % 3:
        ex.features.feature["id"].int64_list.value.append(i)
    elif not bare:
        ex.features.SetInParent()
    return ex.SerializeToString()


@pytest.mark.parametrize("bare", [True, False])
def test_examples_without_features_export_back_byte_for_byte(tmp_path: Path, bare: bool) -> None:
    records = [_maybe_bare(i, bare) for i in range(6)]
    assert records[0] == (b"" if bare else b"\x0a\x00")
    _round_trip(tmp_path, "empty", records)



def test_verify_tells_an_example_without_features_from_an_empty_one(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A dataset that does not keep the fact (as written before it was kept) exports ``0a 00``, as before:
    verify says where."""
    source = _records(tmp_path / "bare.tfrecord", [_maybe_bare(i, True) for i in range(4)])
    note = tfr.TFRecordFormat._note

    def forgetful(self: tfr.TFRecordFormat, *args: Any) -> None:
        note(self, *args)
        self.empty_context = True

    monkeypatch.setattr(tfr.TFRecordFormat, "_note", forgetful)
    convert(source, tmp_path / "ds")
    convert(tmp_path / "ds", tmp_path / "old.tfrecord")
    assert _read(tmp_path / "old.tfrecord")[0] == b"\x0a\x00"
    report = verify(source, tmp_path / "ds")
    assert not report.equal
    assert report.differences == ["record 0 (bare.tfrecord record 0), field 'features': expected None, found {}",
                                  "record 3 (bare.tfrecord record 3), field 'features': expected None, found {}"]


def test_shards_scanned_in_workers_merge_the_facts(tmp_path: Path) -> None:
    """Each worker scans whole shards; the kinds of the empty lists and the bare records merge as one scan's.
    ``tags`` is absent from the second shard's records: its Features with no list set read as empty lists,
    not as absent features (None), so they come back."""
    (tmp_path / "src").mkdir()
    shards = [[_touched(i) for i in range(4)], [_maybe_bare(i, True) for i in range(1, 3)] + [_maybe_bare(0, True)]]
    for n, records in enumerate(shards):
        _records(tmp_path / "src" / f"part-{n}.tfrecord", records)
    convert(tmp_path / "src", tmp_path / "ds", workers=2, progress=False)
    info = open_dataset(str(tmp_path / "ds")).extra_metadata["tfrecord"]
    assert info["empty_without_kind"] == ["label", "tags"] and info["empty_context"] is False
    convert(tmp_path / "ds", tmp_path / "back.tfrecord")
    assert _read(tmp_path / "back.tfrecord") == shards[0] + shards[1]
    report = verify(tmp_path / "src", tmp_path / "ds")
    assert report.equal, report.summary()


def _bare_or_empty(i: int) -> bytes:
    """An Example with an ``id`` (most), ``tf.train.Example()`` (``b''``) or one whose features were set
    but hold none (``0a 00``)."""
    ex = tf.train.Example()
    if i % 5 == 1:
        return b""
    if i % 5 == 3:
        ex.features.SetInParent()
    else:
        ex.features.feature["id"].int64_list.value.append(i)
    return ex.SerializeToString()


@pytest.mark.parametrize("late", [False, True])
def test_records_mixing_no_features_field_and_an_empty_one_export_back_byte_for_byte(tmp_path: Path, late: bool) -> None:
    """A file mixing ``b''`` and ``0a 00`` came back all ``0a 00`` (one flag for the dataset, and a caveat);
    each row now names which it was through its order of features (``__feature_order__``). ``late``: the
    first ``b''`` after the records a single pass starts its schema from, in a second shard."""
    records = [_bare_or_empty(i) for i in range(10)]
    assert b"" in records and b"\x0a\x00" in records
    if late:
        (tmp_path / "src").mkdir()
        first = [_bare_or_empty(0)] * (tfr.PROVISIONAL_SAMPLE + 5) + [_bare_or_empty(3)]
        _records(tmp_path / "src" / "part-0.tfrecord", first)
        _records(tmp_path / "src" / "part-1.tfrecord", records)
        source, records = tmp_path / "src", first + records
    else:
        source = _records(tmp_path / "mixed.tfrecord", records)
    result = convert(source, tmp_path / "ds", progress=False)
    assert not any("features field" in note for note in result.notes), result.notes
    assert tfr.ORDER_FIELD in open_dataset(str(tmp_path / "ds")).schema.fields
    convert(tmp_path / "ds", tmp_path / "back.tfrecord")
    assert _read(tmp_path / "back.tfrecord") == records
    for a, b in ((source, tmp_path / "ds"), (tmp_path / "ds", tmp_path / "back.tfrecord")):
        report = verify(a, b)
        assert report.equal, report.summary()


def test_verify_names_the_records_a_dataset_without_each_rows_kind_gives_back_with_a_features_field(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As before the rows kept it: one features field for every record without features, said in a note,
    and verify names the ``b''`` records."""
    source = _records(tmp_path / "mixed.tfrecord", [_bare_or_empty(i) for i in range(10)])
    note = tfr.TFRecordFormat._note

    def one_flag(self: tfr.TFRecordFormat, *args: Any) -> None:
        note(self, *args)
        self.feature_orders, self.empty_context_differs = {}, True

    monkeypatch.setattr(tfr.TFRecordFormat, "_note", one_flag)
    result = convert(source, tmp_path / "ds", progress=False)
    assert any("hold an empty features field and some none" in note for note in result.notes), result.notes
    convert(tmp_path / "ds", tmp_path / "old.tfrecord")
    assert b"" not in _read(tmp_path / "old.tfrecord")
    report = verify(source, tmp_path / "ds")
    assert report.differences == ["record 1 (mixed.tfrecord record 1), field 'features': expected None, found {}",
                                  "record 6 (mixed.tfrecord record 6), field 'features': expected None, found {}"]
