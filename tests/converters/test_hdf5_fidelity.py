"""Issue 10, HDF5: every layout converts exactly (read back through unihub's readers, verified against
h5py, exported back to the same file structure) or is refused by name, leaving nothing behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unihub import make_batch_reader, make_reader, open_dataset, write_dataset
from unihub.cli import main
from unihub.converters.convert import convert
from unihub.converters.verify import verify
from unihub.dependencies import is_available
from unihub.errors import FormatError, SchemaError

pytestmark = pytest.mark.skipif(not is_available("h5py"), reason="h5py is not installed")
h5py = pytest.importorskip("h5py")

COLOR = h5py.enum_dtype({"RED": 0, "GREEN": 1, "BLUE": 42}, basetype="i1") if h5py else None
TRACK = np.dtype([("x", "<f4"), ("name", "S4"), ("pos", "<i2", (3,)), ("sub", [("a", "u1"), ("b", ">f8")])])


# -- helpers ------------------------------------------------------------------------------------
def read_back(path: Path) -> dict[str, list[Any]]:
    """Every value of a unihub dataset by field, row by row (make_reader), in storage order."""
    names = list(open_dataset(path).schema.fields)
    out: dict[str, list[Any]] = {name: [] for name in names}
    with make_reader(str(path), shuffle_row_groups=False, reader_pool_type="dummy") as reader:
        for row in reader:
            for name, value in zip(names, row):  # names like 'tracks.x' or '@label' are no identifiers
                out[name].append(value)
    return out


def read_batches(path: Path) -> dict[str, list[Any]]:
    """The same through make_batch_reader (columns), concatenated."""
    names = list(open_dataset(path).schema.fields)
    out: dict[str, list[Any]] = {name: [] for name in names}
    with make_batch_reader(str(path), shuffle_row_groups=False, reader_pool_type="dummy") as reader:
        for batch in reader:
            for name, column in zip(names, batch):
                out[name].extend(list(column))
    return out


def same(found: Any, expected: Any) -> bool:
    """Exactly equal: type, dtype, shape and bytes for arrays and numpy scalars."""
    if isinstance(expected, np.ndarray):
        return isinstance(found, np.ndarray) and found.dtype == expected.dtype and found.shape == expected.shape \
            and np.ascontiguousarray(found).tobytes() == np.ascontiguousarray(expected).tobytes()
    if isinstance(expected, np.generic):
        return type(found) is type(expected) and found.tobytes() == expected.tobytes()
    return type(found) is type(expected) and found == expected


def assert_column(found: list[Any], expected: list[Any]) -> None:
    assert len(found) == len(expected)
    for i, (a, b) in enumerate(zip(found, expected)):
        assert same(a, b), f"row {i}: {a!r} != {b!r}"


def left_only(tmp_path: Path, *names: str) -> None:
    """Nothing else in tmp_path: no target, no hidden temporary beside it."""
    assert sorted(os.listdir(tmp_path)) == sorted(names)


# -- one group per sample ---------------------------------------------------------------------------
def make_groups(path: Path, n: int = 12) -> dict[str, list[Any]]:
    """Groups of images of varying size, 0-d labels, attributes, an optional member; returns the values."""
    rng = np.random.default_rng(1)
    expected: dict[str, list[Any]] = {"group": [], "image": [], "label": [], "@camera": [], "@weight": [],
                                      "depth": [], "meta/score": [], "image@units": []}
    with h5py.File(path, "w") as f:
        f["classes"] = np.array([b"cat", b"dog"], dtype="S5")  # not a row: kept as a constant
        for i in range(n):
            g = f.create_group(f"sample_{i:05d}")
            image = rng.integers(0, 255, (3 + i % 3, 4, 3), dtype=np.uint8)
            g["image"] = image
            g["image"].attrs["units"] = "counts"
            g["label"] = np.int16(i - 5)
            g["meta/score"] = np.float32(i / 7)
            g.attrs["camera"] = f"cam{i % 2}"
            g.attrs["weight"] = np.float64(i) / 3
            depth = rng.random((2, 2)).astype(np.float32) if i % 3 == 0 else None
            if depth is not None:
                g["depth"] = depth
            values = {"group": f"sample_{i:05d}", "image": image, "label": np.int16(i - 5),
                      "@camera": f"cam{i % 2}", "@weight": np.float64(i) / 3, "depth": depth,
                      "meta/score": np.float32(i / 7), "image@units": "counts"}
            for key, value in values.items():
                expected[key].append(value)
    return expected


def test_one_group_per_sample_is_one_row_per_group(tmp_path: Path) -> None:
    src, dst = tmp_path / "samples.h5", tmp_path / "ds"
    expected = make_groups(src)
    result = convert(src, dst, progress=False)
    assert result.rows == 12 and not result.skipped
    schema = open_dataset(dst).schema
    assert list(schema.fields) == ["group", "depth", "image", "label", "meta/score", "@camera", "@weight",
                                   "image@units"]
    assert schema["image"].shape == (None, 4, 3) and schema["image"].numpy_dtype is np.uint8
    assert schema["label"].shape == () and schema["label"].numpy_dtype is np.int16
    assert schema["depth"].nullable and not schema["image"].nullable
    for reading in (read_back(dst), read_batches(dst)):
        for name, values in expected.items():
            assert_column(reading[name], values)
    extra = open_dataset(dst).extra_metadata["hdf5"]
    assert extra["layout"]["kind"] == "groups" and "classes" in extra["constants"]
    report = verify(src, dst)
    assert report.equal, report.summary()
    assert report.reference == "h5py"


def test_groups_export_back_to_the_same_file_and_ingest_again(tmp_path: Path) -> None:
    src = tmp_path / "samples.h5"
    make_groups(src)
    convert(src, tmp_path / "ds", progress=False)
    convert(tmp_path / "ds", tmp_path / "back.h5", progress=False)
    with h5py.File(src) as a, h5py.File(tmp_path / "back.h5") as b:
        assert [n for n in b if isinstance(b[n], h5py.Group)] == [n for n in a if isinstance(a[n], h5py.Group)]
        for name in a:
            if isinstance(a[name], h5py.Dataset):
                assert b[name].dtype == a[name].dtype and b[name][...].tobytes() == a[name][...].tobytes()
                continue
            assert dict(a[name].attrs) == {k: v for k, v in b[name].attrs.items()}
            for member in ("image", "label", "meta/score", "depth"):
                assert (member in a[name]) == (member in b[name])
                if member in a[name]:
                    x, y = a[name][member], b[name][member]
                    assert (x.dtype, x.shape, x[...].tobytes()) == (y.dtype, y.shape, y[...].tobytes())
            assert b[name]["image"].attrs["units"] == "counts"
    assert verify(tmp_path / "ds", tmp_path / "back.h5").equal  # the export check
    convert(tmp_path / "back.h5", tmp_path / "again", progress=False)
    assert open_dataset(tmp_path / "again").schema == open_dataset(tmp_path / "ds").schema
    assert verify(tmp_path / "ds", tmp_path / "again").equal
    report = verify(tmp_path / "back.h5", tmp_path / "again")
    assert report.equal, report.summary()


def test_group_order_is_h5py_order_by_name_or_creation(tmp_path: Path) -> None:
    for tracked, order in ((False, ["s10", "s2", "s9"]), (True, ["s9", "s10", "s2"])):
        src = tmp_path / f"order{tracked}.h5"
        with h5py.File(src, "w", track_order=tracked) as f:
            for name in ("s9", "s10", "s2"):
                f[f"{name}/x"] = np.int8(int(name[1:]))
        convert(src, tmp_path / f"ds{tracked}", progress=False)
        rows = read_back(tmp_path / f"ds{tracked}")
        assert rows["group"] == order and rows["x"] == [np.int8(int(n[1:])) for n in order]
        assert verify(src, tmp_path / f"ds{tracked}").equal


# -- splits -----------------------------------------------------------------------------------------
def make_splits(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    rng = np.random.default_rng(2)
    splits = {"train": 23, "val": 7, "test": 4}
    data = {}
    with h5py.File(path, "w") as f:
        for name, n in splits.items():
            images = rng.random((n, 2, 3)).astype(np.float32)
            labels = np.arange(n, dtype=np.int64) + 100 if name != "test" else None  # test has no labels
            f[f"{name}/images"] = images
            if labels is not None:
                f[f"{name}/labels"] = labels
            data[name] = (images, labels)
    return data


def test_nested_splits_convert_all_with_a_split_field(tmp_path: Path) -> None:
    src, dst = tmp_path / "splits.h5", tmp_path / "ds"
    data = make_splits(src)
    assert convert(src, dst, progress=False).rows == 34
    schema = open_dataset(dst).schema
    assert list(schema.fields) == ["split", "images", "labels"] and schema["labels"].nullable
    rows = read_batches(dst)
    order = ["test", "train", "val"]  # h5py's name order
    assert rows["split"] == [s for s in order for _ in range(len(data[s][0]))]
    assert_column(rows["images"], [image for s in order for image in data[s][0]])
    assert rows["labels"] == [None] * 4 + [np.int64(v) for s in ("train", "val") for v in data[s][1]]
    report = verify(src, dst)
    assert report.equal, report.summary()
    convert(dst, tmp_path / "back.h5", progress=False)  # back to /test/images, /train/images, /train/labels ...
    with h5py.File(tmp_path / "back.h5") as f:
        assert [n for n in f if isinstance(f[n], h5py.Group)] == order and "labels" not in f["test"]
        assert f["train/images"][...].tobytes() == data["train"][0].tobytes() and f["val/labels"].dtype == np.int64
    assert verify(dst, tmp_path / "back.h5").equal


def test_split_option_selects_splits_from_python_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "splits.h5"
    data = make_splits(src)
    convert(src, tmp_path / "train", progress=False, format_options={"split": ["train"]})
    rows = read_back(tmp_path / "train")
    assert rows["split"] == ["train"] * 23 and rows["labels"] == [np.int64(v) for v in data["train"][1]]
    assert verify(src, tmp_path / "train", options={"split": ["train"]}).equal
    report = verify(src, tmp_path / "train")  # against the whole file: the other splits are missing
    assert not report.equal and "record counts differ: 34 in the source vs 23" in report.summary()

    assert main(["convert", str(src), str(tmp_path / "val"), "--option", "split=val", "--quiet"]) == 0
    assert read_back(tmp_path / "val")["split"] == ["val"] * 7
    assert main(["verify", str(src), str(tmp_path / "val"), "--option", "split=val"]) == 0
    capsys.readouterr()
    assert main(["convert", str(src), str(tmp_path / "nope"), "--option", "split=holdout", "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("unihub: error:") and "'holdout'" in err[0] and "splits.h5" in err[0]
    assert not (tmp_path / "nope").exists()


# -- dtypes -------------------------------------------------------------------------------------------
def make_types(path: Path, n: int = 10) -> None:
    tracks = np.zeros(n, TRACK)
    tracks["x"] = np.arange(n) / 4
    tracks["name"] = [b"t%d" % i for i in range(n)]
    tracks["pos"] = np.arange(n * 3).reshape(n, 3)
    tracks["sub"]["a"] = np.arange(n)
    tracks["sub"]["b"] = np.arange(n) * 1.5
    with h5py.File(path, "w") as f:
        f.create_dataset("color", data=np.array([0, 1, 42, 1, 0, 42, 42, 1, 0, 0], dtype="i1"), dtype=COLOR)
        f["z"] = (np.arange(n) - 1j * np.arange(n) / 3).astype(np.complex64)
        f["zz"] = np.full((n, 2), 1e300 + 1e-300j, dtype=np.complex128)
        f["code"] = np.array([b"ab", b"abcdefghij", b"a\x00b", b"", b"\x00x", b"z\x00\x00", b"q", b"r", b"s", b"t"],
                             dtype="S10")
        f["blob"] = np.array([b"\xff\x00%d" % i for i in range(n)], dtype="S4")  # not UTF-8: bytes
        f["tracks"] = tracks
        f["big"] = np.arange(n, dtype=">i4") * -7
        f["raw"] = np.array([b"\x00\x01\x02\x00"] * n, dtype="V4")
        f.create_dataset("names", data=[f"zoë{i}" for i in range(n)], dtype=h5py.string_dtype())
        f["count"] = np.int32(5)
        f["title"] = np.bytes_(b"run\x00")
        f.create_dataset("note", data="héllo", dtype=h5py.string_dtype())


def test_compound_enum_complex_strings_and_opaque_convert_exactly(tmp_path: Path) -> None:
    src, dst = tmp_path / "types.h5", tmp_path / "ds"
    make_types(src)
    convert(src, dst, progress=False)
    schema = open_dataset(dst).schema
    assert [n for n in schema.fields if n.startswith("tracks")] == \
        ["tracks.x", "tracks.name", "tracks.pos", "tracks.sub.a", "tracks.sub.b"]
    assert schema["tracks.pos"].shape == (3,) and schema["tracks.sub.b"].numpy_dtype is np.float64
    assert schema["z"].shape == (2,) and schema["z"].numpy_dtype is np.float32
    assert schema["color"].numpy_dtype is np.int8 and schema["blob"].numpy_dtype is np.bytes_
    rows = read_back(dst)
    with h5py.File(src) as f:
        z = f["z"][...]
        assert_column(rows["z"], [np.array([v.real, v.imag], dtype=np.float32) for v in z])
        assert_column(rows["color"], list(f["color"][...].astype(np.int8)))
        assert rows["code"] == [bytes(v).decode() for v in f["code"][...]]  # NUL padding dropped, as numpy does
        assert rows["blob"] == [bytes(v) for v in f["blob"][...]]
        assert_column(rows["tracks.pos"], list(f["tracks"][...]["pos"]))
        assert_column(rows["tracks.sub.b"], [np.float64(v) for v in f["tracks"][...]["sub"]["b"]])
        assert_column(rows["big"], [np.int32(v) for v in f["big"][...]])
        assert rows["raw"] == [b"\x00\x01\x02\x00"] * 10 and rows["names"][1] == "zoë1"
    extra = open_dataset(dst).extra_metadata["hdf5"]
    assert extra["layout"]["datasets"]["color"]["enum"] == {"RED": 0, "GREEN": 1, "BLUE": 42}
    assert set(extra["constants"]) == {"count", "title", "note"}
    report = verify(src, dst)
    assert report.equal, report.summary()


def test_dtypes_export_back_bit_for_bit(tmp_path: Path) -> None:
    src = tmp_path / "types.h5"
    make_types(src)
    convert(src, tmp_path / "ds", progress=False)
    convert(tmp_path / "ds", tmp_path / "back.h5", progress=False)
    with h5py.File(src) as a, h5py.File(tmp_path / "back.h5") as b:
        assert set(b) == set(a)
        for name in a:
            x, y = a[name], b[name]
            assert x.dtype == y.dtype and x.dtype.str == y.dtype.str, name  # byte order kept too
            assert x.dtype.names == y.dtype.names and x.dtype.itemsize == y.dtype.itemsize, name
            assert h5py.check_enum_dtype(y.dtype) == h5py.check_enum_dtype(x.dtype), name
            assert h5py.check_string_dtype(y.dtype) == h5py.check_string_dtype(x.dtype), name
            assert x.shape == y.shape and x[...].tobytes() == y[...].tobytes() if x.dtype.kind != "O" \
                else list(x[...].ravel()) == list(y[...].ravel()), name
    assert verify(tmp_path / "ds", tmp_path / "back.h5").equal
    convert(tmp_path / "back.h5", tmp_path / "again", progress=False)
    assert open_dataset(tmp_path / "again").schema == open_dataset(tmp_path / "ds").schema
    assert verify(tmp_path / "back.h5", tmp_path / "again").equal


def test_a_fixed_string_too_long_for_its_source_is_refused_on_export(tmp_path: Path) -> None:
    src = tmp_path / "types.h5"
    make_types(src)
    convert(src, tmp_path / "ds", progress=False)
    store = open_dataset(tmp_path / "ds")
    rows = read_back(tmp_path / "ds")
    rows["code"][3] = "eleven byte"
    write_dataset(tmp_path / "edited", store.schema, [dict(zip(rows, v)) for v in zip(*rows.values())],
                  extra_metadata=store.extra_metadata)
    with pytest.raises(SchemaError, match=r"field 'code'.*11-byte value does not fit .* 10 bytes"):
        convert(tmp_path / "edited", tmp_path / "out.h5", progress=False)
    assert not (tmp_path / "out.h5").exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".")]


# -- refusals, opt-outs, verify catching losses --------------------------------------------------------
def test_what_cannot_be_stored_is_refused_by_name_and_leaves_nothing(tmp_path: Path) -> None:
    src = tmp_path / "refs.h5"
    with h5py.File(src, "w") as f:
        f["x"] = np.arange(4)
        f.create_dataset("links", shape=(4,), dtype=h5py.ref_dtype)
        f.create_dataset("words", shape=(4,), dtype=h5py.vlen_dtype(h5py.string_dtype()))
    with pytest.raises(FormatError) as info:
        convert(src, tmp_path / "ds", progress=False)
    message = str(info.value)
    assert str(src) in message and "'links'" in message and "references" in message and "'words'" in message
    assert "ignore_unsupported" in message and info.value.path == str(src)
    left_only(tmp_path, "refs.h5")

    with pytest.warns(UserWarning, match="left out .*'links', 'words'"):
        result = convert(src, tmp_path / "ds", progress=False, format_options={"ignore_unsupported": True})
    assert list(open_dataset(tmp_path / "ds").schema.fields) == ["x"]
    assert sorted(s.location for s in result.skipped) == ["dataset 'links'", "dataset 'words'"]
    assert "skipped 2" in result.summary()
    assert set(open_dataset(tmp_path / "ds").extra_metadata["hdf5"]["left_out"]) == {"links", "words"}


def test_cli_refusal_is_one_bounded_error_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "many.h5"
    with h5py.File(src, "w") as f:  # 300 datasets of 300 lengths: once a 66 KB message
        for i in range(300):
            f[f"d{i:03d}"] = np.arange(i + 1)
        f.create_dataset("links", shape=(3,), dtype=h5py.ref_dtype)
    assert main(["convert", str(src), str(tmp_path / "ds"), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("unihub: error:") and str(src) in err[0] and "'links'" in err[0]
    assert len(err[0]) < 600
    with pytest.warns(UserWarning, match="left out"):
        code = main(["convert", str(src), str(tmp_path / "ds"), "--quiet", "--option", "ignore_unsupported=true"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "differ in length" in err[0] and "and 294 more lengths" in err[0] and len(err[0]) < 1000
    left_only(tmp_path, "many.h5")


def test_verify_reports_a_field_left_out_and_a_changed_value(tmp_path: Path) -> None:
    src = tmp_path / "samples.h5"
    make_groups(src)
    convert(src, tmp_path / "subset", progress=False, format_options={"fields": ["image", "label"]})
    report = verify(src, tmp_path / "subset")
    assert not report.equal
    assert "record 1 (samples.h5 group 'sample_00001'), field 'meta/score': expected float32(0.1428571492433548), " \
        "found nothing (missing)" in report.summary()
    assert verify(src, tmp_path / "subset", options={"fields": ["image", "label"]}).equal

    convert(src, tmp_path / "ds", progress=False)
    store = open_dataset(tmp_path / "ds")
    rows = read_back(tmp_path / "ds")
    rows["label"][5] = np.int16(99)
    rows["image"][7] = rows["image"][7].copy()
    rows["image"][7][0, 0, 0] ^= 1
    write_dataset(tmp_path / "tampered", store.schema, [dict(zip(rows, v)) for v in zip(*rows.values())],
                  extra_metadata=store.extra_metadata)
    report = verify(src, tmp_path / "tampered")
    text = report.summary()
    assert not report.equal and len(report.differences) == 2
    assert "record 5 (samples.h5 group 'sample_00005'), field 'label': expected int16(0), found int16(99)" in text
    assert "record 7 (samples.h5 group 'sample_00007'), field 'image': expected uint8[4, 4, 3]" in text


def test_verify_catches_a_lost_enum_mapping_and_a_string_length(tmp_path: Path) -> None:
    src = tmp_path / "types.h5"
    make_types(src)
    convert(src, tmp_path / "ds", progress=False)
    store = open_dataset(tmp_path / "ds")
    extra = dict(store.extra_metadata)
    layout = dict(extra["hdf5"]["layout"])
    layout["datasets"] = {**layout["datasets"], "color": "|i1"}  # the mapping lost
    extra["hdf5"] = {**extra["hdf5"], "layout": layout}
    rows = read_back(tmp_path / "ds")
    write_dataset(tmp_path / "lost", store.schema, [dict(zip(rows, v)) for v in zip(*rows.values())],
                  extra_metadata=extra)
    text = verify(src, tmp_path / "lost").summary()
    assert "field 'color': expected {'value', 'enum'}, found int8(0)" in text

    layout["datasets"] = {**layout["datasets"], "color": extra_color(store), "code": {"string": 12, "encoding": "ascii"}}
    write_dataset(tmp_path / "narrow", store.schema, [dict(zip(rows, v)) for v in zip(*rows.values())],
                  extra_metadata=extra)  # recorded as S12: an export would pad the strings to 12 bytes
    text = verify(src, tmp_path / "narrow").summary()
    assert "record 0 (types.h5 row 0), field 'code': expected |S10[] [b'ab'], found |S12[] [b'ab']" in text


def extra_color(store: Any) -> Any:
    return store.extra_metadata["hdf5"]["layout"]["datasets"]["color"]


def test_several_files_of_one_layout_merge_their_shapes(tmp_path: Path) -> None:
    for k in range(2):
        with h5py.File(tmp_path / f"part{k}.h5", "w") as f:
            for i in range(3):
                f[f"s{k}{i}/image"] = np.full((2 + k, 2), i, dtype=np.uint8)
                f[f"s{k}{i}/label"] = np.int64(i)
    convert(str(tmp_path / "part*.h5"), tmp_path / "ds", progress=False, workers=2)
    assert open_dataset(tmp_path / "ds").schema["image"].shape == (None, 2)
    rows = read_back(tmp_path / "ds")
    assert rows["group"] == ["s00", "s01", "s02", "s10", "s11", "s12"]
    assert [r.shape for r in rows["image"]] == [(2, 2)] * 3 + [(3, 2)] * 3
    assert verify(str(tmp_path / "part*.h5"), tmp_path / "ds", from_format="hdf5").equal


def test_compounds_with_string_and_enum_members_in_groups_and_attributes(tmp_path: Path) -> None:
    record = np.dtype([("s", h5py.string_dtype()), ("e", h5py.enum_dtype({"A": 1, "B": 2}, basetype="u1")),
                       ("z", "<c8")])
    src = tmp_path / "comp.h5"
    with h5py.File(src, "w") as f:
        for i in range(3):
            values = np.zeros(2 + i, record)
            values["s"], values["e"], values["z"] = [b"x%d" % k for k in range(2 + i)], 1 + i % 2, 1j * i
            f[f"s{i}/rec"] = values
            f[f"s{i}"].attrs.create("meta", data=np.array((b"hi", 2, 3j), dtype=record), dtype=record)
            f[f"s{i}"].attrs["fixed"] = np.bytes_(b"ab\x00")
    convert(src, tmp_path / "ds", progress=False)
    schema = open_dataset(tmp_path / "ds").schema
    assert list(schema.fields) == ["group", "rec.s", "rec.e", "rec.z", "@fixed", "@meta.s", "@meta.e", "@meta.z"]
    rows = read_back(tmp_path / "ds")
    assert [list(v) for v in rows["rec.s"]] == [[f"x{k}" for k in range(2 + i)] for i in range(3)]
    assert rows["@meta.z"][0].tolist() == [0.0, 3.0] and rows["@fixed"] == ["ab"] * 3
    assert verify(src, tmp_path / "ds").equal
    convert(tmp_path / "ds", tmp_path / "back.h5", progress=False)
    with h5py.File(src) as a, h5py.File(tmp_path / "back.h5") as b:
        for i in range(3):
            x, y = a[f"s{i}/rec"], b[f"s{i}/rec"]
            assert y.dtype == x.dtype and h5py.check_enum_dtype(y.dtype["e"]) == {"A": 1, "B": 2}
            assert x[...].tolist() == y[...].tolist()
            assert b[f"s{i}"].attrs.get_id("fixed").dtype == np.dtype("S3")
    assert verify(tmp_path / "ds", tmp_path / "back.h5").equal


def test_attributes_and_datasets_outside_the_rows_are_kept_exactly_and_written_back(tmp_path: Path) -> None:
    src = tmp_path / "attrs.h5"
    with h5py.File(src, "w") as f:
        f.attrs["version"] = np.int32(3)
        f.attrs["tag"] = np.bytes_(b"v1\x00")
        f.attrs.create("name", "zoë", dtype=h5py.string_dtype())
        f["train/x"], f["val/x"] = np.arange(3.0), np.arange(2.0)
        f["train"].attrs["n"] = np.uint16(3)
        f["train/x"].attrs["scale"] = np.array([0.5, 2], dtype=np.float16)
        f["train/count"] = np.int64(3)  # a scalar inside a split: a constant
        f.create_dataset("nothing", data=h5py.Empty("<f4"))
        f.attrs["self"] = f["train"].ref  # a reference: refused by name, or left out and listed when asked
    with pytest.raises(FormatError, match=r"attrs\.h5.*'@self': attribute 'self' of / holds object or region refer"):
        convert(src, tmp_path / "ds", progress=False, format_options={"layout": "splits"})
    with pytest.warns(UserWarning, match="left out .ignore_unsupported.: '@self'"):
        result = convert(src, tmp_path / "ds", progress=False,
                         format_options={"layout": "splits", "ignore_unsupported": True})
    assert result.rows == 5 and [s.location for s in result.skipped] == ["dataset '@self'"]
    meta = open_dataset(tmp_path / "ds").extra_metadata["hdf5"]
    assert meta["attributes"]["version"] == 3 and set(meta["constants"]) == {"train/count", "nothing"}
    convert(tmp_path / "ds", tmp_path / "back.h5", progress=False)
    with h5py.File(src) as a, h5py.File(tmp_path / "back.h5") as b:
        for path in ("", "train", "train/x"):
            x, y = (a[path] if path else a).attrs, (b[path] if path else b).attrs
            for name in x:
                if name == "self":
                    assert name not in y
                    continue
                assert y.get_id(name).dtype == x.get_id(name).dtype, (path, name)
                assert np.asarray(y[name]).tobytes() == np.asarray(x[name]).tobytes() or y[name] == x[name]
        assert b["train/count"].dtype == np.int64 and b["train/count"][()] == 3
        assert b["nothing"].shape is None and b["nothing"].dtype == np.dtype("<f4")
    assert verify(tmp_path / "ds", tmp_path / "back.h5").equal


def test_an_external_link_is_refused_by_name_or_left_out_when_asked(tmp_path: Path) -> None:
    import h5py

    with h5py.File(tmp_path / "other.h5", "w") as f:
        f.create_dataset("labels", data=np.arange(5))
    with h5py.File(tmp_path / "main.h5", "w") as f:
        f.create_dataset("x", data=np.arange(5.0))
        f["labels"] = h5py.ExternalLink("other.h5", "/labels")
        f["alias"] = h5py.SoftLink("/x")  # an alias of data read anyway: no loss
    with pytest.raises(FormatError, match=r"main\.h5.*'labels'.*external link to other\.h5:/labels"):
        convert(tmp_path / "main.h5", tmp_path / "ds")
    assert not [p for p in tmp_path.iterdir() if "ds" in p.name]
    with pytest.warns(UserWarning, match="left out .ignore_unsupported.: 'labels'"):
        result = convert(tmp_path / "main.h5", tmp_path / "ds", format_options={"ignore_unsupported": True})
    assert [s.location for s in result.skipped] == ["dataset 'labels'"]


def test_zero_size_dimensions_and_zero_rows_export_and_verify(tmp_path: Path) -> None:
    import h5py

    with h5py.File(tmp_path / "zerodim.h5", "w") as f:
        f.create_dataset("x", data=np.zeros((4, 0), "f4"))
        f.create_dataset("y", data=np.arange(4))
    with h5py.File(tmp_path / "zero.h5", "w") as f:
        f.create_dataset("x", data=np.zeros((0, 3), "f4"))
        f.create_dataset("y", data=np.zeros(0, "i8"))
    for name, rows in (("zerodim", 4), ("zero", 0)):
        src, ds, back = tmp_path / f"{name}.h5", tmp_path / f"{name}_ds", tmp_path / f"{name}_back.h5"
        convert(src, ds)
        convert(ds, back)
        for a, b in ((src, ds), (ds, back), (src, back)):
            report = verify(a, b)
            assert report.equal and report.rows_source == rows, report.summary()
        with h5py.File(back) as f, h5py.File(src) as g:
            for name in ("x", "y"):
                assert (f[name].shape, f[name].dtype) == (g[name].shape, g[name].dtype), (src, name)
