"""HDF5 layout detection and the reading options (formats/hdf5/layout.py) on files made with h5py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from unihub import ScalarCodec, Unischema, UnischemaField
from unihub.converters.convert import convert
from unihub.dependencies import is_available
from unihub.errors import FormatError, InvalidArgumentError, SchemaError, UnsupportedFormatError
from unihub.formats.base import parse_options

pytestmark = pytest.mark.skipif(not is_available("h5py"), reason="h5py is not installed")
h5py = pytest.importorskip("h5py")

from unihub.formats.hdf5.detect import MAX_SPLITS  # noqa: E402
from unihub.formats.hdf5.format import HDF5Format  # noqa: E402
from unihub.formats.hdf5.layout import CONSTANT_BYTES  # noqa: E402


def rows(fmt: HDF5Format, schema: Unischema | None = None) -> dict[str, list]:
    schema = schema or fmt.infer_schema()
    out: dict[str, list] = {name: [] for name in schema.fields}
    for batch in fmt.read_batches(schema, batch_size=3):
        for name, values in batch.items():
            out[name].extend(list(values))
    return out


def layout_of(path: Path, **options) -> str:
    return HDF5Format(path, **options).metadata()["hdf5"]["layout"]["kind"]


def test_groups_sharing_a_dataset_name_stay_columns_when_lengths_agree(tmp_path: Path) -> None:
    path = tmp_path / "cols.h5"
    with h5py.File(path, "w") as f:  # /images/data and /labels/data: two columns, not two splits
        f["images/data"] = np.zeros((5, 2), np.uint8)
        f["labels/data"] = np.arange(5)
    assert layout_of(path) == "columns"
    assert list(HDF5Format(path).infer_schema().fields) == ["images/data", "labels/data"]


def test_numbered_groups_many_groups_or_scalar_members_are_samples(tmp_path: Path) -> None:
    cases = {
        "numbered": [(f"item{i}", {"a": np.zeros((3, 2)), "b": np.zeros(3)}) for i in range(3)],
        "scalar": [(name, {"a": np.zeros(3), "b": np.int8(1)}) for name in ("left", "right")],
        "lengths": [(name, {"a": np.zeros(3), "b": np.zeros(4)}) for name in ("left", "right")],
        "many": [(f"{chr(97 + i)}x", {"a": np.zeros(2)}) for i in range(MAX_SPLITS + 1)],
    }
    for case, groups in cases.items():
        path = tmp_path / f"{case}.h5"
        with h5py.File(path, "w") as f:
            for name, members in groups:
                for member, value in members.items():
                    f[f"{name}/{member}"] = value
        assert layout_of(path) == "groups", case
        assert HDF5Format(path).infer_schema().fields["group"].numpy_dtype is np.str_


def test_splits_are_few_unnumbered_groups_of_different_lengths(tmp_path: Path) -> None:
    path = tmp_path / "splits.h5"
    with h5py.File(path, "w") as f:
        f["train/x"], f["train/y"] = np.arange(5.0), np.arange(5)
        f["val/x"], f["val/y"] = np.arange(2.0), np.arange(2)
    assert layout_of(path) == "splits"
    got = rows(HDF5Format(path, split=["val"]))
    assert got["split"] == ["val", "val"] and got["y"] == [0, 1]
    with pytest.raises(FormatError, match=r"splits.h5: no split 'test'; its splits: 'train', 'val'"):
        HDF5Format(path, split=["test"]).infer_schema()


def test_samples_below_a_chain_of_single_groups_with_constants_beside(tmp_path: Path) -> None:
    path = tmp_path / "nested.h5"
    with h5py.File(path, "w") as f:
        f["version"] = np.int32(2)
        f["classes"] = np.array([b"a", b"b"])
        for i in range(3):
            f[f"data/sample_{i}/x"] = np.full(i + 1, i, dtype=np.int32)
    fmt = HDF5Format(path)
    meta = fmt.metadata()["hdf5"]
    assert meta["layout"]["container"] == "data" and meta["layout"]["kind"] == "groups"
    assert set(meta["constants"]) == {"version", "classes"} and meta["scalars"] == {"version": 2}
    got = rows(fmt)
    assert got["group"] == ["sample_0", "sample_1", "sample_2"]
    assert [x.tolist() for x in got["x"]] == [[0], [1, 1], [2, 2, 2]]


def test_forced_layouts(tmp_path: Path) -> None:
    path = tmp_path / "pair.h5"
    with h5py.File(path, "w") as f:  # two groups of equal length: columns unless told otherwise
        f["left/x"], f["right/x"] = np.arange(3), np.arange(3) + 10
    assert layout_of(path) == "columns"
    assert rows(HDF5Format(path, layout="splits"))["x"] == [0, 1, 2, 10, 11, 12]
    assert [x.tolist() for x in rows(HDF5Format(path, layout="groups"))["x"]] == [[0, 1, 2], [10, 11, 12]]
    flat = tmp_path / "flat.h5"
    with h5py.File(flat, "w") as f:
        f["x"] = np.arange(3)
    with pytest.raises(FormatError, match="flat.h5: layout=groups needs sibling groups"):
        HDF5Format(flat, layout="groups").infer_schema()
    with pytest.raises(FormatError, match="split= selects groups .* layout is 'columns'"):
        HDF5Format(flat, split=["train"]).infer_schema()


def test_key_field_clash_and_rename(tmp_path: Path) -> None:
    path = tmp_path / "clash.h5"
    with h5py.File(path, "w") as f:
        for i in range(3):
            f[f"s{i}/group"] = np.int8(i)
    with pytest.raises(FormatError, match=r"clash.h5: 'group' names both .* key field \(choose another with key_field"):
        HDF5Format(path).infer_schema()
    got = rows(HDF5Format(path, key_field="sample"))
    assert got["sample"] == ["s0", "s1", "s2"] and got["group"] == [0, 1, 2]


def test_member_dtype_conflict_is_refused_naming_member_and_groups(tmp_path: Path) -> None:
    path = tmp_path / "conflict.h5"
    with h5py.File(path, "w") as f:
        for i in range(4):
            f[f"s{i}/x"] = np.zeros(2, np.float32 if i != 2 else np.float64)
            f[f"s{i}/m"] = np.zeros((2, 2) if i != 3 else (2,))
            f[f"s{i}/ok"] = np.int8(i)
    with pytest.raises(FormatError) as info:
        HDF5Format(path).infer_schema()
    text = str(info.value)
    assert "conflict.h5" in text and "'x': dtype \"<f4\" in 's0' but \"<f8\" in 's2'" in text
    assert "'m': 2 dimensions in 's0' but 1 in 's3'" in text
    with pytest.warns(UserWarning, match="left out"):
        fmt = HDF5Format(path, ignore_unsupported=True)
        assert list(fmt.infer_schema().fields) == ["group", "ok"]
    list(fmt.read_batches(fmt.infer_schema()))
    assert sorted(s.location for s in fmt.report.skipped) == ["dataset 'm'", "dataset 'x'"]


def test_constants_beyond_the_limit_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.h5"
    with h5py.File(path, "w") as f:
        f["mean"] = np.zeros(CONSTANT_BYTES // 8 + 1)
        for i in range(2):
            f[f"s{i}/x"] = np.int8(i)
    with pytest.raises(FormatError, match="'mean': .* bytes: datasets that are not rows are kept in the metadata"):
        HDF5Format(path).infer_schema()


def test_a_given_schema_reads_its_fields_and_refuses_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "mixed.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(4)
        f["short"] = np.arange(2)
        f.create_dataset("links", shape=(4,), dtype=h5py.ref_dtype)
    schema = Unischema("s", [UnischemaField("x", np.int64, (), ScalarCodec(np.int64))])
    assert rows(HDF5Format(path), schema)["x"] == [0, 1, 2, 3]
    with pytest.raises(FormatError, match="'links'"):
        HDF5Format(path, fields=["x", "links"]).infer_schema()


def test_groups_read_errors_name_the_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from unihub.formats.hdf5 import read as hdf5_read

    path = tmp_path / "g.h5"
    with h5py.File(path, "w") as f:
        for i in range(5):
            f[f"s{i}/x"] = np.int8(i)
    real = hdf5_read.read_whole

    def flaky(dataset):
        if dataset.name == "/s3/x":
            raise OSError("Can't read data")
        return real(dataset)

    monkeypatch.setattr(hdf5_read, "read_whole", flaky)
    fmt = HDF5Format(path)
    schema = fmt.infer_schema()
    with pytest.raises(FormatError, match=r"g.h5: cannot read group 's3': Can't read data"):
        list(fmt.read_batches(schema, batch_size=1))
    got = list(fmt.read_batches(schema, batch_size=1, on_error="skip"))
    assert [b["group"][0] for b in got] == ["s0", "s1", "s2", "s4"]
    assert [s.location for s in fmt.report.skipped] == ["group 's3'"]


def test_options_parse_from_the_cli() -> None:
    options = parse_options(HDF5Format, ["layout=Groups", "split=train,val", "key_field=name",
                                         "ignore_unsupported=yes", "fields=a,b/c"], writing=False)
    assert options == {"layout": "groups", "split": ["train", "val"], "key_field": "name",
                       "ignore_unsupported": True, "fields": ["a", "b/c"]}
    assert parse_options(HDF5Format, ["layout=splits", "key_field=s"], writing=True) == \
        {"layout": "splits", "key_field": "s"}
    with pytest.raises(UnsupportedFormatError, match="layout"):
        parse_options(HDF5Format, ["layout=rows"], writing=False)


def test_bad_sizes_and_a_selection_of_no_dataset_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    """slice_mb=nan or inf failed as a bare ValueError/OverflowError mid-read and 0 or -1 was taken;
    chunk_rows=-5 was h5py's OverflowError and 0 the default; fields= (empty) or naming only the key
    field converted 0 rows of a 5-row file without a word."""
    src = tmp_path / "s.h5"
    with h5py.File(src, "w") as f:
        f["train/x"] = np.arange(5)
        f["val/x"] = np.arange(2)
    for bad in (float("nan"), float("inf"), 0, -1.0, True):
        with pytest.raises(InvalidArgumentError, match="slice_mb must be"):
            convert(src, tmp_path / "ds", format_options={"slice_mb": bad}, progress=False)
    for fields in ([], "split", ["split"]):
        with pytest.raises(FormatError, match="selects no dataset; fields: 'x'"):
            convert(src, tmp_path / "ds", format_options={"fields": fields}, progress=False)
    assert not (tmp_path / "ds").exists()
    convert(src, tmp_path / "ds", format_options={"slice_mb": 0.5}, progress=False)
    for bad in (0, -5, True, 2.5):
        with pytest.raises(SchemaError, match="chunk_rows must be"):
            convert(tmp_path / "ds", tmp_path / "out.h5", to_format="hdf5", format_options={"chunk_rows": bad},
                    progress=False)
        assert not (tmp_path / "out.h5").exists()


def test_export_layouts_of_a_plain_dataset(tmp_path: Path) -> None:
    schema = Unischema("S", [UnischemaField("split", np.str_, (), ScalarCodec(np.str_)),
                             UnischemaField("x", np.float32, (), ScalarCodec(np.float32), True),
                             UnischemaField("name", np.str_, (), ScalarCodec(np.str_))])
    batch = {"split": ["a", "a", "b"], "x": [np.float32(1), None, np.float32(3)], "name": ["p", "q", "r"]}
    HDF5Format.write(str(tmp_path / "groups.h5"), schema, [batch], layout="groups", key_field="name")
    with h5py.File(tmp_path / "groups.h5") as f:
        assert list(f) == ["p", "q", "r"] and "x" not in f["q"] and f["r/x"][()] == np.float32(3)
    fmt = HDF5Format(tmp_path / "groups.h5")
    assert fmt.infer_schema()["x"] == schema["x"]
    assert rows(fmt)["x"] == [np.float32(1), None, np.float32(3)]
    HDF5Format.write(str(tmp_path / "splits.h5"), schema, [batch], layout="splits")
    with h5py.File(tmp_path / "splits.h5") as f:
        assert list(f) == ["a", "b"] and f["a/x"].shape == (2,) and f["a/x__isnull"][...].tolist() == [False, True]
    assert rows(HDF5Format(tmp_path / "splits.h5"))["name"] == ["p", "q", "r"]
    with pytest.raises(SchemaError, match="field 'part'"):
        HDF5Format.write(str(tmp_path / "bad.h5"), schema, [batch], layout="splits", key_field="part")
    assert not (tmp_path / "bad.h5").exists()
    for asked in ({"compression": "gzip"}, {"chunk_rows": 2}):  # ignored before: the groups were written as ever
        with pytest.raises(SchemaError, match="the groups layout writes each sample's datasets whole"):
            HDF5Format.write(str(tmp_path / "bad.h5"), schema, [batch], layout="groups", key_field="name", **asked)
        assert not (tmp_path / "bad.h5").exists()


def test_skips_of_ignore_mismatched_are_listed(tmp_path: Path) -> None:
    path = tmp_path / "mixed.h5"
    with h5py.File(path, "w") as f:
        f["a"], f["b"], f["c"] = np.arange(5), np.arange(5.0), np.arange(2)
    with pytest.warns(UserWarning, match="'c': 2"):
        fmt = HDF5Format(path, ignore_mismatched=True)
        schema = fmt.infer_schema()
    assert rows(fmt, schema)["a"] == [0, 1, 2, 3, 4]
    assert [(s.location, s.reason) for s in fmt.report.skipped] == [("dataset 'c'", "2 rows, not 5 (ignore_mismatched)")]
    assert fmt.metadata()["hdf5"]["left_out"] == {"c": "2 rows, not 5 (ignore_mismatched)"}


def test_constants_that_differ_between_files_are_kept_per_file(tmp_path: Path) -> None:
    for k in range(3):
        with h5py.File(tmp_path / f"shard{k}.h5", "w") as f:
            f["x"] = np.arange(2) + k
            f["shard"] = np.int32(k if k < 2 else 0)
    meta = HDF5Format(str(tmp_path / "shard*.h5")).metadata()["hdf5"]
    assert meta["scalars"] == {"shard": 0}
    assert list(meta["constants_by_file"]) == [str(tmp_path / "shard1.h5")]


@pytest.mark.parametrize(("attr", "value", "reason"), [
    ("unihub.layout", "[" * 100_000, "maximum recursion depth"),  # was a RecursionError
    ("unihub.layout", "[1, 2]", "a JSON list, not an object"),  # was an AttributeError
    ("unihub.layout", b"\xff\xfe", "Expecting value"),  # was ignored: the file read as if not an export
    ("unihub.layout", '{"kind": 5, "container": []}', "layout 5 in []"),  # was 0 rows of 10, exit 0
    ("unihub.layout", '{"kind": "groups", "container": "x"}', "layout 'groups' in 'x'"),  # a dataset, not a group
    ("unihub.layout", '{"kind": "groups", "not_units": "ab"}', "the values of ['not_units']"),
    ("unihub.layout", '{"kind": "columns", "key_field": 3}', "the values of ['key_field']"),
    ("unihub.field", "not json", "Expecting value"),  # was a JSONDecodeError
    ("unihub.field", "[1, 2]", "'list' object is not a mapping"),  # was a TypeError
    ("unihub.field", np.arange(3), "not ndarray"),  # was a TypeError
    ("unihub.field", '{"numpy_dtype": "int64", "shape": [' + "9" * 5000 + "]}", "Exceeds the limit"),
    ("unihub.field_order", "[" * 100_000, "maximum recursion depth"),  # the three were raw tracebacks
    ("unihub.field_order", "not json", "Expecting value"),
    ("unihub.field_order", "5", "a JSON int, not a list of field names"),
])
def test_a_corrupt_recorded_layout_or_field_is_a_format_error_naming_it(tmp_path: Path, attr: str, value: object,
                                                                        reason: str) -> None:
    path = tmp_path / "hostile.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(10)
        (f["x"] if attr == "unihub.field" else f).attrs[attr] = value
    with pytest.raises(FormatError) as caught:
        HDF5Format(path).infer_schema()
    where = "/x" if attr == "unihub.field" else "/"
    assert str(caught.value).startswith(f"{path}: attribute {attr!r} of {where} is not what a unihub export writes")
    assert reason in str(caught.value) and caught.value.path == str(path)
