"""What HDF5 keeps beside its rows, and verify checking it (formats/hdf5/extras.py): empty sample groups,
empty splits, exports of 0 rows, constants and attributes, and exports written with other options."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from unihub import CompressedImageCodec, ScalarCodec, Unischema, UnischemaField, open_dataset, write_dataset
from unihub.cli import main
from unihub.converters.convert import convert
from unihub.converters.verify import verify
from unihub.dependencies import is_available
from unihub.formats.hdf5.format import _PER_FILE_WORDS
from unihub.formats.hdf5.meta import PER_FILE
from unihub.readers.reader import make_batch_reader

pytestmark = pytest.mark.skipif(not is_available("h5py"), reason="h5py is not installed")
h5py = pytest.importorskip("h5py")


def rows_of(path: Path) -> dict[str, list[Any]]:
    """Every value of a unihub dataset by field, in storage order (images as their stored bytes)."""
    names = list(open_dataset(path).schema.fields)
    out: dict[str, list[Any]] = {name: [] for name in names}
    with make_batch_reader(str(path), shuffle_row_groups=False, reader_pool_type="dummy",
                           decode_images=False) as reader:
        for batch in reader:
            for name, column in zip(names, batch):
                out[name].extend(list(column))
    return out


def rewrite(src: Path, dst: Path, keep: Any = None, extra: Any = None) -> None:
    """``src`` written again as ``dst``: the rows ``keep(i)`` accepts, its metadata changed by ``extra``."""
    store = open_dataset(src)
    columns = rows_of(src)
    rows = [dict(zip(columns, values)) for values in zip(*columns.values())]
    metadata = json.loads(json.dumps(store.extra_metadata))
    if extra is not None:
        extra(metadata["hdf5"])
    write_dataset(dst, store.schema, [row for i, row in enumerate(rows) if keep is None or keep(i)],
                  extra_metadata=metadata)


def differences(a: Path, b: Path, **options: Any) -> list[str]:
    report = verify(a, b, options=options or None, max_differences=20)
    assert not report.equal and report.differences, report.summary()
    return report.differences


def assert_equal(a: Path, b: Path, **options: Any) -> None:
    report = verify(a, b, options=options or None)
    assert report.equal, report.summary()


# -- finding 1: a sample group with no datasets -----------------------------------------------------------
def test_an_empty_sample_group_is_a_row_of_nulls_and_goes_back_as_an_empty_group(tmp_path: Path) -> None:
    src, ds, out = tmp_path / "g.h5", tmp_path / "ds", tmp_path / "out.h5"
    with h5py.File(src, "w") as f:
        for name in ("s0", "s2"):
            f[f"{name}/x"] = np.arange(3, dtype=np.float32) + int(name[1])
            f[f"{name}/y"] = np.int64(int(name[1]))
        f.create_group("s1").attrs["note"] = "empty"
    assert convert(src, ds, progress=False).rows == 3
    schema = open_dataset(ds).schema
    assert list(schema.fields) == ["group", "x", "y", "@note"] and schema["x"].nullable and schema["y"].nullable
    rows = rows_of(ds)
    assert rows["group"] == ["s0", "s1", "s2"] and rows["y"] == [0, None, 2] and rows["@note"] == [None, "empty", None]
    assert rows["x"][1] is None and rows["x"][2].tolist() == [2.0, 3.0, 4.0]
    assert_equal(src, ds)
    assert main(["convert", str(ds), str(out), "--quiet"]) == 0
    with h5py.File(out) as f:
        assert [n for n in f] == ["s0", "s1", "s2"] and len(f["s1"]) == 0 and f["s1"].attrs["note"] == "empty"
        assert f["s2/x"].dtype == np.float32 and f["s2/x"][...].tolist() == [2.0, 3.0, 4.0]
    assert_equal(ds, out)
    convert(out, tmp_path / "again", progress=False)
    assert_equal(ds, tmp_path / "again")

    rewrite(ds, tmp_path / "lost", keep=lambda i: i != 1)  # the row of the empty group lost
    assert differences(src, tmp_path / "lost")[0] == "record counts differ: 3 in the source vs 2 in the target"
    with h5py.File(out, "a") as f:
        del f["s1"]
    assert "record counts differ: 3 in the source vs 2 in the target" in differences(ds, out)


def test_attributes_of_groups_inside_the_samples_are_fields(tmp_path: Path) -> None:
    src, ds, out = tmp_path / "inner.h5", tmp_path / "ds", tmp_path / "out.h5"
    with h5py.File(src, "w") as f:
        for i in range(3):
            f[f"s{i}/meta/score"] = np.float32(i)
            f[f"s{i}/meta"].attrs["unit"] = "m"
            f.create_group(f"s{i}/tags").attrs["t"] = np.int8(i)  # a group holding only attributes
    convert(src, ds, progress=False)
    assert list(open_dataset(ds).schema.fields) == ["group", "meta/score", "meta@unit", "tags@t"]
    rows = rows_of(ds)
    assert rows["meta@unit"] == ["m"] * 3 and rows["tags@t"] == [0, 1, 2]
    assert_equal(src, ds)
    convert(ds, out, progress=False)
    with h5py.File(out) as f:
        assert f["s2/tags"].attrs.get_id("t").dtype == np.int8 and f["s2/tags"].attrs["t"] == 2
        assert f["s1/meta"].attrs["unit"] == "m" and len(f["s1/tags"]) == 0
    assert_equal(ds, out)
    with h5py.File(out, "a") as f:
        f["s1/tags"].attrs["t"] = np.int8(5)
    assert differences(ds, out) == ["record 1 (out.h5 group 's1'), field 'tags@t': expected int8(1), found int8(5)"]


def test_a_group_beside_the_samples_stays_outside_the_rows_after_an_export(tmp_path: Path) -> None:
    src = tmp_path / "a.h5"
    with h5py.File(src, "w") as f:
        for i in range(3):
            f[f"s{i}/x"], f[f"s{i}/y"] = np.arange(i + 1), np.int8(i)
        f["meta/classes"] = np.array([b"cat", b"dog"])  # holds other datasets: not a sample
        f["meta"].attrs["k"] = np.int16(1)
        f.create_group("tree/leaf")  # only a group in it: not a sample, kept as a group
    convert(src, tmp_path / "ds", progress=False)
    convert(tmp_path / "ds", tmp_path / "out.h5", progress=False)
    with h5py.File(tmp_path / "out.h5") as f:
        assert json.loads(f.attrs["unihub.layout"])["not_units"] == ["meta", "tree"]
        assert f["meta/classes"][...].tolist() == [b"cat", b"dog"] and "tree/leaf" in f
    assert convert(tmp_path / "out.h5", tmp_path / "again", progress=False).rows == 3
    for a, b in (("a.h5", "ds"), ("ds", "out.h5"), ("out.h5", "again"), ("ds", "again")):
        assert_equal(tmp_path / a, tmp_path / b)
    with h5py.File(tmp_path / "out.h5", "a") as f:
        del f["tree/leaf"]
    assert differences(tmp_path / "ds", tmp_path / "out.h5") == [
        "group '/tree/leaf': expected 'empty', found nothing (missing)"]


# -- finding 2 and 5: units of 0 rows ---------------------------------------------------------------------
def make_splits(path: Path) -> None:
    with h5py.File(path, "w") as f:
        for name, n in (("train", 6), ("val", 3), ("test", 0)):
            f[f"{name}/x"] = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
            f[f"{name}/y"] = np.arange(n, dtype=np.int64)
        f["test"].attrs["count"] = np.int32(0)


def test_an_empty_split_is_kept_and_written_back(tmp_path: Path) -> None:
    src, ds, out = tmp_path / "sp.h5", tmp_path / "ds", tmp_path / "out.h5"
    make_splits(src)
    assert convert(src, ds, progress=False).rows == 9
    assert set(open_dataset(ds).extra_metadata["hdf5"]["empty_datasets"]) == {"test/x", "test/y"}
    assert main(["verify", str(src), str(ds)]) == 0
    assert main(["convert", str(ds), str(out), "--quiet"]) == 0
    with h5py.File(out) as f:
        assert (f["test/x"].shape, f["test/x"].dtype, f["test/y"].shape, f["test/y"].dtype) == \
            ((0, 2), np.float32, (0,), np.int64)
        assert f["test"].attrs.get_id("count").dtype == np.int32 and f["test"].attrs["count"] == 0
        assert f["train/x"].shape == (6, 2) and f["val/y"][...].tolist() == [0, 1, 2]
    assert main(["verify", str(ds), str(out)]) == 0
    assert_equal(src, out)
    convert(out, tmp_path / "again", progress=False)
    assert_equal(out, tmp_path / "again")
    assert_equal(ds, tmp_path / "again")

    rewrite(ds, tmp_path / "lost", extra=lambda meta: meta.pop("empty_datasets"))
    assert differences(src, tmp_path / "lost")[:2] == [
        "dataset '/test/x': expected float32[0, 2] [], found nothing (missing)",
        "dtype of dataset '/test/x': expected '\"<f4\"', found nothing (missing)"]
    with h5py.File(out, "a") as f:
        del f["test/y"]
        del f["test"].attrs["count"]
    assert differences(ds, out) == [
        "dataset '/test/y': expected int64[0] [], found nothing (missing)",
        "dtype of dataset '/test/y': expected '\"<i8\"', found nothing (missing)",
        "attribute 'count' of '/test': expected int32(0), found nothing (missing)",
        "dtype of attribute 'count' of '/test': expected '\"<i4\"', found nothing (missing)",
        "storage of dataset '/test/y': expected {'layout', 'chunks', 'maxshape', 'compression', 'compression_opts', "
        "'shuffle', ...}, found nothing (missing)"]


def test_an_export_of_no_rows_keeps_its_datasets_and_verify_misses_one(tmp_path: Path) -> None:
    src, ds, out = tmp_path / "zero.h5", tmp_path / "ds", tmp_path / "out.h5"
    with h5py.File(src, "w") as f:
        f["x"] = np.zeros((0, 3), np.float32)
        f.create_dataset("names", shape=(0,), dtype=h5py.string_dtype("ascii"))
    convert(src, ds, progress=False)
    convert(ds, out, progress=False)
    with h5py.File(out) as f:
        assert (f["x"].shape, f["x"].dtype) == ((0, 3), np.float32)
        assert f["names"].shape == (0,) and h5py.check_string_dtype(f["names"].dtype).encoding == "ascii"
    assert_equal(ds, out)
    with h5py.File(out, "a") as f:
        del f["x"]
    found = differences(ds, out)
    assert "dtype of the rows of '/x': expected '\"<f4\"', found nothing (missing)" in found
    assert "shape of a row of '/x': expected [3], found nothing (missing)" in found
    assert verify(ds, out).rows_source == 0

    # unihub's own storage too: a field's datasets exist with no rows, and verify misses one
    schema = Unischema("S", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), True)])
    write_dataset(tmp_path / "empty", schema, [])
    convert(tmp_path / "empty", tmp_path / "empty.h5", progress=False)
    assert_equal(tmp_path / "empty", tmp_path / "empty.h5")
    with h5py.File(tmp_path / "empty.h5", "a") as f:
        assert f["id"].shape == (0,) and f["id__isnull"].dtype == np.bool_
        del f["id__isnull"]
    assert differences(tmp_path / "empty", tmp_path / "empty.h5") == [
        "dtype of the rows of '/id__isnull': expected '\"|b1\"', found nothing (missing)",
        "shape of a row of '/id__isnull': expected [], found nothing (missing)"]


# -- finding 3: constants and attributes ----------------------------------------------------------------
def make_extras(path: Path) -> None:
    with h5py.File(path, "w") as f:
        f.attrs["version"] = np.int32(3)
        f["scalar_ds"] = np.float64(3.25)
        f.create_dataset("title", data="run", dtype=h5py.string_dtype("ascii"))
        f["grp/img"] = np.arange(8, dtype=np.uint8).reshape(4, 2)
        f["grp/img"].attrs["note"] = "a"
        f["grp"].attrs["units"] = np.array([1.5, 2.5], dtype=">f4")
        f.create_dataset("names", data=[b"a", b"b", b"c", b"d"], dtype=h5py.string_dtype("ascii"))
        f.create_group("empty").attrs["why"] = np.uint8(7)


def test_verify_compares_constants_and_attributes_by_name(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, ds, out = tmp_path / "c.h5", tmp_path / "ds", tmp_path / "out.h5"
    make_extras(src)
    convert(src, ds, progress=False)
    convert(ds, out, progress=False)
    for a, b in ((src, ds), (ds, out), (src, out)):
        assert_equal(a, b)
    with h5py.File(src, "a") as f:
        f.attrs["version"] = np.int32(4)
        f["scalar_ds"][()] = 3.5
        f["grp/img"].attrs["note"] = "b"
        f["grp"].attrs["units"] = np.array([1.5, 2.5], dtype="<f4")  # the same numbers, another byte order
        del f["title"]
        f.create_dataset("title", data="run", dtype=h5py.string_dtype("utf-8"))
        strings = f["names"][...]
        del f["names"]
        f.create_dataset("names", data=strings, dtype=h5py.string_dtype("utf-8"))
        del f["empty"]
    expected = [
        "dataset '/scalar_ds': expected float64(3.5), found float64(3.25)",
        "dtype of dataset '/title': expected '{\"string\": null, \"encoding\": \"utf-8\"}', "
        "found '{\"string\": null, \"encoding\": \"ascii\"}'",
        "attribute 'version' of '/': expected int32(4), found int32(3)",
        "attribute 'units' of '/grp': expected float32[2] [1.5, 2.5], found >f4[2] [1.5, 2.5]",
        "dtype of attribute 'units' of '/grp': expected '\"<f4\"', found '\">f4\"'",
        "attribute 'note' of '/grp/img': expected b'b', found b'a', first at byte 0",
        "dtype of the rows of '/names': expected '{\"string\": null, \"encoding\": \"utf-8\"}', "
        "found '{\"string\": null, \"encoding\": \"ascii\"}'",
        "attribute 'why' of '/empty': expected nothing, found uint8(7) (not in the source)",
        "dtype of attribute 'why' of '/empty': expected nothing, found '\"|u1\"' (not in the source)",
        "group '/empty': expected nothing, found 'empty' (not in the source)"]
    assert differences(src, ds) == expected
    assert differences(src, out) == expected  # two HDF5 files: both read with h5py
    assert main(["verify", str(src), str(ds)]) == 1
    assert capsys.readouterr().out.splitlines()[1:3] == [f"  {line}" for line in expected[:2]]

    rewrite(ds, tmp_path / "lost", extra=lambda meta: meta["constants"].pop("scalar_ds"))
    found = differences(out, tmp_path / "lost")
    assert found[:2] == ["dataset '/scalar_ds': expected float64(3.25), found nothing (missing)",
                         "dtype of dataset '/scalar_ds': expected '\"<f8\"', found nothing (missing)"]


def test_several_files_keep_and_verify_their_own_attributes(tmp_path: Path) -> None:
    for k in range(2):
        with h5py.File(tmp_path / f"m{k}.h5", "w") as f:
            f["x"] = np.arange(3) + k
            f.attrs["created"] = np.int64(k)
            f["c"] = np.int8(7)
    pattern = str(tmp_path / "m*.h5")
    convert(pattern, tmp_path / "ds", progress=False, from_format="hdf5")
    meta = open_dataset(tmp_path / "ds").extra_metadata["hdf5"]
    assert list(meta["attribute_values_by_file"]) == [str(tmp_path / "m1.h5")] and "constants_by_file" not in meta
    assert verify(pattern, tmp_path / "ds", from_format="hdf5").equal
    rewrite(tmp_path / "ds", tmp_path / "lost", extra=lambda m: m.pop("attribute_values_by_file"))
    report = verify(pattern, tmp_path / "lost", from_format="hdf5")
    assert report.differences == ["m1.h5: attribute 'created' of '/': expected int64(1), found nothing (missing)",
                                  "m1.h5: dtype of attribute 'created' of '/': expected '\"<i8\"', found nothing "
                                  "(missing)"]


def test_an_export_of_several_files_to_one_says_that_it_holds_the_first_files_own(tmp_path: Path) -> None:
    """Files of a folder whose root attributes and constants differ, exported to one HDF5 file: the file holds the
    first one's. Before: without a word (only a verify of the folder against the export found it)."""
    for k in range(2):
        with h5py.File(tmp_path / f"m{k}.h5", "w") as f:
            f["x"] = np.arange(3) + k
            f.attrs["created"] = np.int64(k)
            f["c"] = np.int8(7 + k)
    convert(str(tmp_path / "m*.h5"), tmp_path / "ds", progress=False, from_format="hdf5")
    result = convert(tmp_path / "ds", tmp_path / "one.h5", progress=False)
    assert result.notes == [f"the source's HDF5 files differ in their datasets that are not rows, attributes (1 "
                            f"besides the first, e.g. {tmp_path / 'm1.h5'}): the one file written holds the first "
                            "file's (unihub verify names what differs)"]
    with h5py.File(tmp_path / "one.h5") as f:
        assert f.attrs["created"] == 0 and f["c"][()] == 7
    assert not verify(str(tmp_path / "m*.h5"), tmp_path / "one.h5", from_format="hdf5").equal
    with h5py.File(tmp_path / "m1.h5", "a") as f:  # the same attributes and constants: nothing to say
        f.attrs["created"], f["c"][()] = np.int64(0), np.int8(7)
    convert(str(tmp_path / "m*.h5"), tmp_path / "same", progress=False, from_format="hdf5")
    assert convert(tmp_path / "same", tmp_path / "same.h5", progress=False).notes == []
    assert set(_PER_FILE_WORDS) == set(PER_FILE)  # every entry of a file of its own has words


def test_files_whose_datasets_differ_in_width_verify_row_by_row(tmp_path: Path) -> None:
    """A folder whose files hold ``v`` of (3, 2) and (3, 5) converts to a field of shape (None,); verify
    projected the dataset's rows as one HDF5 dataset per 256 rows and raised 'rows of shapes [(2,), (5,)]
    cannot share one HDF5 dataset' instead of comparing them."""
    for k, width in enumerate((2, 5)):
        with h5py.File(tmp_path / f"w{k}.h5", "w") as f:
            f["v"] = np.arange(3 * width, dtype=np.float32).reshape(3, width) + k
    pattern = str(tmp_path / "w*.h5")
    convert(pattern, tmp_path / "ds", progress=False, from_format="hdf5")
    assert open_dataset(tmp_path / "ds").schema.fields["v"].shape == (None,)
    assert verify(pattern, tmp_path / "ds", from_format="hdf5").equal
    with h5py.File(tmp_path / "w1.h5", "a") as f:
        f["v"][2, 4] = -1
    report = verify(pattern, tmp_path / "ds", from_format="hdf5")
    assert not report.equal and report.differences[0].startswith("record 5 (w1.h5 row 2), field 'v'"), report


def test_left_out_datasets_take_their_attributes_and_empty_groups_stay(tmp_path: Path) -> None:
    src, ds, out = tmp_path / "c.h5", tmp_path / "ds", tmp_path / "out.h5"
    with h5py.File(src, "w") as f:
        f["x"] = np.arange(4)
        f["g/y"] = np.arange(4.0)
        f["g/y"].attrs["u"] = "m"
        f["g"].attrs["v"] = np.int8(2)
        f.create_group("e/f").attrs["w"] = np.int8(3)
    convert(src, ds, progress=False, format_options={"fields": ["x"]})
    assert_equal(src, ds, fields=["x"])
    convert(ds, out, progress=False)
    with h5py.File(out) as f:
        assert "g/y" not in f and f["g"].attrs["v"] == 2 and f["e/f"].attrs["w"] == 3
    assert_equal(ds, out)
    assert_equal(src, out, fields=["x"])


# -- finding 4: exports written with other options ----------------------------------------------------------
def image_dataset(path: Path) -> None:
    from unihub.images.decoders import encode_image

    schema = Unischema("S", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                             UnischemaField("image", np.uint8, (6, 7, 3), CompressedImageCodec("png"), False)])
    write_dataset(path, schema, [{"id": i, "image": encode_image(np.full((6, 7, 3), 9 * i, np.uint8), "png", 0)}
                                 for i in range(3)])


@pytest.mark.parametrize("option", ["images=pixels", "layout=groups"])
def test_verify_projects_a_dataset_the_way_its_export_was_written(tmp_path: Path, option: str) -> None:
    ds, out = tmp_path / "ds", tmp_path / "out.h5"
    image_dataset(ds)
    assert main(["convert", str(ds), str(out), "--option", option, "--quiet"]) == 0
    assert main(["verify", str(ds), str(out)]) == 0
    if option == "images=pixels":
        with h5py.File(out, "a") as f:
            assert f["image"].shape == (3, 6, 7, 3) and f["image"].dtype == np.uint8
            layout = json.loads(f.attrs["unihub.layout"])
            assert layout.pop("images") == "pixels"
            f.attrs["unihub.layout"] = json.dumps(layout)  # as an older export recorded it
        assert_equal(ds, out)  # told by the field the file recorded: a tensor where the dataset has an image
        with h5py.File(out, "a") as f:
            f["image"][2, 0, 0, 0] = 1
        where = "record 2 (out.h5 row 2), field 'image': expected uint8[6, 7, 3] [18, 18"
    else:
        with h5py.File(out, "a") as f:
            assert list(f) == ["sample_00000000", "sample_00000001", "sample_00000002"]
            f["sample_00000001/id"][()] = 5
        where = "record 1 (out.h5 group 'sample_00000001'), field 'id': expected int64(1), found int64(5)"
    assert differences(ds, out)[0].startswith(where)


def test_a_groups_export_of_text_and_ragged_fields_verifies_equal(tmp_path: Path) -> None:
    """HDF5 writes the fill value of a type of variable-length values (a string, a sequence) when space is
    allocated, not only where one is set; verify took that for storage the source chose, and said a
    groups export of any dataset with a text field differed ("storage of member 's' in the groups:
    expected {...}, found nothing"). A member stored with its own options is still named."""
    ds, out = tmp_path / "ds", tmp_path / "out.h5"
    schema = Unischema("T", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                             UnischemaField("s", np.str_, (), ScalarCodec(pa.string()), False)])
    write_dataset(ds, schema, [{"id": i, "s": f"text {i}"} for i in range(3)])
    convert(ds, out, to_format="hdf5", format_options={"layout": "groups"}, progress=False)
    assert_equal(out, ds)
    assert_equal(ds, out)
    src = tmp_path / "src.h5"
    with h5py.File(src, "w") as f:
        for i in range(3):
            f.create_dataset(f"sample_{i}/s", data=f"text {i}", dtype=h5py.string_dtype())
            f.create_dataset(f"sample_{i}/v", data=np.arange(4), chunks=(2,), compression="gzip")
    convert(src, tmp_path / "from_h5", progress=False)
    assert_equal(src, tmp_path / "from_h5")
    with h5py.File(src, "a") as f:
        del f["sample_0/v"]
        f["sample_0/v"] = np.arange(4)
    found = differences(src, tmp_path / "from_h5")
    assert any(d.startswith(("storage of member 'v' in the groups", "storage of dataset '/sample_1/v'"))
               for d in found), found


def test_a_compound_with_gaps_between_its_members_verifies_equal(tmp_path: Path) -> None:
    """A compound constant and attributes whose members leave gaps (a C struct: 4 bytes after a char[4],
    20 at the end), with a space-padded member: numpy copies only a structured value's fields, so the
    gap bytes of the recorded and the read values held whatever memory held, and verify named a
    difference between identical values ('(b'ab', 5) vs (b'ab', 5)'). A changed member is still named."""
    h5t = h5py.h5t
    spaced = h5t.C_S1.copy()
    spaced.set_size(4)
    spaced.set_strpad(h5t.STR_SPACEPAD)
    stored, memory = h5t.create(h5t.COMPOUND, 32), h5t.create(h5t.COMPOUND, 32)
    for compound, name_type in ((stored, spaced), (memory, h5t.py_create(np.dtype("S4")))):
        compound.insert(b"name", 0, name_type)
        compound.insert(b"n", 8, h5t.STD_I32BE)
    dt = np.dtype({"names": ["name", "n"], "formats": ["S4", ">i4"], "offsets": [0, 8], "itemsize": 32})
    value = np.zeros((), dt)
    value["name"], value["n"] = b"ab", 5
    src = tmp_path / "gaps.h5"
    with h5py.File(src, "w") as f:
        f["x"] = np.arange(3)
        scalar = h5py.h5s.create(h5py.h5s.SCALAR)
        h5py.h5a.create(f.id, b"one", stored, scalar).write(value, mtype=memory)
        h5py.h5a.create(f.id, b"many", stored, h5py.h5s.create_simple((3,))).write(np.zeros(3, dt), mtype=memory)
        h5py.h5d.create(f.id, b"const", stored, scalar).write(h5py.h5s.ALL, h5py.h5s.ALL, value, mtype=memory)
    convert(src, tmp_path / "ds", progress=False)
    for _ in range(3):
        assert_equal(src, tmp_path / "ds")
    with h5py.File(src, "a") as f:
        changed = value.copy()
        changed["n"] = 6
        f["const"].id.write(h5py.h5s.ALL, h5py.h5s.ALL, changed, mtype=memory)
    assert differences(src, tmp_path / "ds")[0].startswith("dataset '/const': expected")


@pytest.mark.parametrize("kind", ["groups", "splits"])
def test_units_below_a_container_verify_with_the_container_kept(tmp_path: Path, kind: str) -> None:
    src, ds, out = tmp_path / "nested.h5", tmp_path / "ds", tmp_path / "out.h5"
    with h5py.File(src, "w") as f:
        for i, name in enumerate(("a", "b", "c")):
            f[f"data/{name}/x"] = np.arange(i + 2, dtype=np.int16)
        f["data"].attrs["source"] = "sensor"
        f["data/b"].attrs["n"] = np.int8(3)
    convert(src, ds, progress=False, format_options={"layout": kind})
    assert open_dataset(ds).extra_metadata["hdf5"]["layout"]["container"] == "data"
    convert(ds, out, progress=False)
    for a, b, options in ((src, ds, {"layout": kind}), (ds, out, {}), (src, out, {"layout": kind})):
        assert_equal(a, b, **options)
    with h5py.File(out, "a") as f:
        f["data"].attrs["source"] = "other"
    assert differences(ds, out) == ["attribute 'source' of '/data': expected b'sensor', found b'other', first at byte 0"]


def test_an_export_named_by_another_key_field_ingests_and_verifies_with_it(tmp_path: Path) -> None:
    schema = Unischema("S", [UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), False),
                             UnischemaField("v", np.int64, (), ScalarCodec(pa.int64()), False)])
    write_dataset(tmp_path / "ds", schema, [{"name": f"n{i}", "v": i} for i in range(3)])
    out = tmp_path / "out.h5"
    assert main(["convert", str(tmp_path / "ds"), str(out), "--option", "layout=groups", "--option",
                 "key_field=name", "--quiet"]) == 0
    with h5py.File(out) as f:
        assert list(f) == ["n0", "n1", "n2"] and f["n2/v"][()] == 2
    assert_equal(tmp_path / "ds", out)
    convert(out, tmp_path / "again", progress=False)
    assert open_dataset(tmp_path / "again").schema == schema
    assert_equal(tmp_path / "ds", tmp_path / "again")
