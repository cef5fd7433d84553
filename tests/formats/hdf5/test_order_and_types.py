"""What h5py lists and types beyond the values: creation order (``track_order``) of groups below the root,
of constants beside rows, inside splits and sample groups, tracked in some groups and not in others; the
padding and bitfield types of a sample group's attributes; bitfield datasets. Each comes back, or is
refused by name; and verify, reading the files with h5py, names it where it is lost (the old behaviour is
reached by a monkeypatched export or ingest)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.formats.hdf5.test_verify import assert_equal, differences, rewrite
from unihub.converters.convert import convert
from unihub.dependencies import is_available
from unihub.errors import FormatError
from unihub.formats.hdf5 import dtypes as hdf5_dtypes
from unihub.formats.hdf5 import export as hdf5_export
from unihub.formats.hdf5 import meta as hdf5_meta

pytestmark = pytest.mark.skipif(not is_available("h5py"), reason="h5py is not installed")
h5py = pytest.importorskip("h5py")


def tracked(obj: Any) -> bool:
    """Whether an h5py group tracks the creation order of its links."""
    obj = obj["/"] if isinstance(obj, h5py.File) else obj
    return bool(obj.id.get_create_plist().get_link_creation_order() & h5py.h5p.CRT_ORDER_TRACKED)


def round_trip(src: Path, tmp_path: Path, **options: Any) -> Path:
    """``src`` converted to ``ds`` (reading ``options``) and back to ``back.h5``; verify says equal of each pair."""
    convert(src, tmp_path / "ds", progress=False, format_options=options or None)
    convert(tmp_path / "ds", tmp_path / "back.h5", to_format="hdf5", progress=False)
    assert_equal(src, tmp_path / "ds", **options)
    assert_equal(src, tmp_path / "back.h5", **options)
    assert_equal(tmp_path / "ds", tmp_path / "back.h5")
    return tmp_path / "back.h5"


# -- creation order outside the units ---------------------------------------------------------------
def make_tracked_groups(path: Path) -> None:
    """An untracked root holding rows and two groups: ``meta`` tracks creation order (a row dataset, a
    constant, an attribute, in the order z, a, m), ``plain`` does not."""
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(3)
        meta = f.create_group("meta", track_order=True)
        meta["z"] = np.arange(3) + 10
        meta["a"] = np.float64(2.5)  # a constant
        meta["m"] = np.arange(3) + 20
        for name in "zam":
            meta.attrs[name] = np.int8(1)
        plain = f.create_group("plain")
        plain["z"] = np.arange(3)
        plain["a"] = np.arange(3)


def test_a_tracked_group_below_the_root_comes_back_tracked_beside_an_untracked_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The export tracked only the root where the source's did, so ``meta`` came back listing ``a, m, z``;
    now each group tracks as the source's did, the untracked ones stay untracked (not all-or-nothing)."""
    src = tmp_path / "groups.h5"
    make_tracked_groups(src)
    back = round_trip(src, tmp_path, layout="columns")
    with h5py.File(back) as b:
        assert list(b["meta"]) == ["z", "a", "m"] and list(b["meta"].attrs) == ["z", "a", "m"]
        assert tracked(b["meta"]) and not tracked(b["plain"]) and not tracked(b)
        assert list(b["plain"]) == ["a", "z"]
        assert b["meta/a"][()] == 2.5 and b["meta/z"][()].tolist() == [10, 11, 12]
    with monkeypatch.context() as patched:  # the old export: groups made on the way, untracked
        patched.setattr(hdf5_export, "_make_groups", lambda handle, spec: None)
        convert(tmp_path / "ds", tmp_path / "old.h5", to_format="hdf5", progress=False)
    found = differences(src, tmp_path / "old.h5", layout="columns")
    assert "creation order of the links of '/meta': expected ['z', 'a', 'm'], found nothing (missing)" in found


def test_constants_empty_datasets_and_links_keep_their_place_in_creation_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a tracked file the rows' datasets were made first and the constants, empty datasets and links
    after them, so ``c, e, x, l, y`` came back as ``x, y, c, e, l`` (verify named it)."""
    src = tmp_path / "tracked.h5"
    with h5py.File(src, "w", track_order=True) as f:
        f["c"] = np.float64(1.5)
        f.create_dataset("e", data=h5py.Empty("f4"))
        f["x"] = np.arange(3)
        f["l"] = h5py.SoftLink("/x")
        f["y"] = np.arange(3) * 2
    back = round_trip(src, tmp_path)
    with h5py.File(back) as b:
        assert list(b) == ["c", "e", "x", "l", "y"]
        assert b.get("l", getlink=True).path == "/x" and b["y"][()].tolist() == [0, 2, 4]
    with monkeypatch.context() as patched:  # the old export: nothing linked again in its place
        patched.setattr(hdf5_export, "_order_links", lambda handle, spec: None)
        convert(tmp_path / "ds", tmp_path / "old.h5", to_format="hdf5", progress=False)
    with h5py.File(tmp_path / "old.h5") as b:
        assert list(b) == ["x", "y", "c", "e", "l"]
    assert "creation order of the links of '/'[0]: expected 'c', found 'x'" in differences(src, tmp_path / "old.h5")


# -- splits -----------------------------------------------------------------------------------------
def test_splits_tracked_and_untracked_come_back_each_as_it_was(tmp_path: Path) -> None:
    """The export tracked every split (and listed ``train``'s datasets by name), whatever the source's did,
    and verify said equal: it compared creation order in a columns layout only."""
    src = tmp_path / "splits.h5"
    with h5py.File(src, "w") as f:
        train = f.create_group("train", track_order=True)
        train["z"] = np.arange(4)
        train["b"] = np.arange(4) * 2
        test = f.create_group("test")
        test["z"] = np.arange(2)
        test["b"] = np.arange(2) * 2
    back = round_trip(src, tmp_path, layout="splits")
    with h5py.File(back) as b:
        assert not tracked(b) and tracked(b["train"]) and list(b["train"]) == ["z", "b"]
        assert not tracked(b["test"]) and list(b["test"]) == ["b", "z"]
    # metadata from before the order was kept: the export tracks every split, and verify names it
    rewrite(tmp_path / "ds", tmp_path / "old", extra=lambda hdf5: [hdf5.pop(k) for k in ("creation_order", "unit_order")])
    convert(tmp_path / "old", tmp_path / "old.h5", to_format="hdf5", progress=False)
    found = differences(src, tmp_path / "old.h5", layout="splits")
    assert sorted(found) == ["creation order of the links of '/test': expected nothing, found ['b', 'z'] (not in the source)",
                             "creation order of the links of '/train'[0]: expected 'z', found 'b'",
                             "creation order tracked by the container of the splits: expected False, found True"]


# -- sample groups ----------------------------------------------------------------------------------
def make_samples(path: Path, *, tracked_samples: bool = True, pad_second: int | None = None) -> None:
    """Sample groups (tracked unless told) holding ``z`` then ``a`` (``z`` missing in ``s2``), attributes
    ``z`` then ``a``, a space-padded ``title``, a NUL-terminated ``unit`` on ``z`` and a bitfield ``flags``."""
    with h5py.File(path, "w", track_order=True) as f:
        for i, name in enumerate(("s1", "s0", "s2")):
            g = f.create_group(name, track_order=tracked_samples)
            if name != "s2":
                g["z"] = np.arange(3) + i
            g["a"] = np.arange(2) + i
            g.attrs["z"] = i
            g.attrs["a"] = -i
            pad = h5py.h5t.STR_SPACEPAD if pad_second is None or i != pad_second else h5py.h5t.STR_NULLPAD
            title = h5py.h5t.C_S1.copy()
            title.set_size(5)
            title.set_strpad(pad)
            h5py.h5a.create(g.id, b"title", title, h5py.h5s.create(h5py.h5s.SCALAR)).write(
                np.array(b"ab" + b" " * i, "S5"))
            unit = h5py.h5t.C_S1.copy()
            unit.set_size(3)
            unit.set_strpad(h5py.h5t.STR_NULLTERM)
            h5py.h5a.create(g["a"].id, b"unit", unit, h5py.h5s.create(h5py.h5s.SCALAR)).write(np.array(b"m", "S3"))
            h5py.h5a.create(g.id, b"flags", h5py.h5t.STD_B8LE, h5py.h5s.create(h5py.h5s.SCALAR)).write(
                np.array(5 + i, np.uint8))


def test_sample_groups_keep_their_creation_order_and_attribute_types(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A groups layout's samples came back untracked (``a, z``), their attributes NUL-padded and integer,
    and verify said equal: it compared neither inside the sample groups."""
    src = tmp_path / "samples.h5"
    make_samples(src)
    back = round_trip(src, tmp_path, layout="groups")
    with h5py.File(src) as a, h5py.File(back) as b:
        assert list(b) == ["s1", "s0", "s2"]
        for name in ("s1", "s0", "s2"):
            assert tracked(b[name]) and list(b[name]) == list(a[name])
            assert [n for n in b[name].attrs] == ["z", "a", "title", "flags"]
            assert b[name].attrs.get_id("title").get_type().get_strpad() == h5py.h5t.STR_SPACEPAD
            assert b[name].attrs.get_id("flags").get_type().get_class() == h5py.h5t.BITFIELD
            assert b[name].attrs["flags"] == a[name].attrs["flags"] and b[name].attrs["title"] == a[name].attrs["title"]
            assert b[name]["a"].attrs.get_id("unit").get_type().get_strpad() == h5py.h5t.STR_NULLTERM
        assert list(b["s1"]) == ["z", "a"] and list(b["s2"]) == ["a"]
    with monkeypatch.context() as patched:  # the old export: no sample order nor attribute types
        patched.setattr(hdf5_export, "unit_entry", lambda spec, rel: None)
        convert(tmp_path / "ds", tmp_path / "old.h5", to_format="hdf5", progress=False)
    found = differences(src, tmp_path / "old.h5", layout="groups")
    for text in ("creation order of the links of each sample group: expected ['z', 'a'], found nothing (missing)",
                 "creation order of the attributes of each sample group: expected ['z', 'a', 'title', 'flags'], "
                 "found nothing (missing)",
                 "type of attribute 'title' of each sample group: expected 'spacepad', found nothing (missing)",
                 "type of attribute 'flags' of each sample group: expected 'bitfield', found nothing (missing)",
                 "type of attribute 'unit' of 'a' in each sample group: expected 'nullterm', found nothing (missing)"):
        assert text in found, found
    with monkeypatch.context() as patched:  # the old ingest: verify of the source names what it lost
        patched.setattr(hdf5_meta, "unit_order", lambda handle, plan, refuse=False: ({}, None))
        convert(src, tmp_path / "old_ds", progress=False, format_options={"layout": "groups"})
    found = differences(src, tmp_path / "old_ds", layout="groups")
    assert "type of attribute 'title' of each sample group: expected 'spacepad', found nothing (missing)" in found


@pytest.mark.parametrize("how", ["tracked", "padding"])
def test_sample_groups_that_disagree_are_refused_naming_two(tmp_path: Path, how: str) -> None:
    """One order (and one attribute type) is all an export writes for every sample group: samples that
    disagree are refused by name, not given back alike."""
    src = tmp_path / "mixed.h5"
    make_samples(src, pad_second=1 if how == "padding" else None)
    if how == "tracked":
        with h5py.File(src, "a") as f:
            g = f.create_group("s3")
            g["z"] = np.arange(3)
            g["a"] = np.arange(2)
    with pytest.raises(FormatError, match="the sample groups differ: 's1' and 's[03]'"):
        convert(src, tmp_path / "ds", progress=False, format_options={"layout": "groups"})


# -- bitfields ----------------------------------------------------------------------------------------
def make_bitfields(path: Path) -> None:
    """Bitfield datasets (rows of 8 bits, a 16-bit big-endian constant) and attribute, written through
    HDF5's own API (h5py reads them as unsigned integers and has no dtype to write one)."""
    with h5py.File(path, "w") as f:
        rows = h5py.h5d.create(f.id, b"bits", h5py.h5t.STD_B8LE, h5py.h5s.create_simple((4,)))
        rows.write(h5py.h5s.ALL, h5py.h5s.ALL, np.array([1, 2, 4, 128], np.uint8), mtype=h5py.h5t.NATIVE_UINT8)
        wide = h5py.h5d.create(f.id, b"wide", h5py.h5t.STD_B16BE, h5py.h5s.create(h5py.h5s.SCALAR))
        wide.write(h5py.h5s.ALL, h5py.h5s.ALL, np.array(0x8001, ">u2"), mtype=h5py.h5t.STD_U16BE)
        f["x"] = np.arange(4)
        h5py.h5a.create(f["x"].id, b"mask", h5py.h5t.STD_B32LE, h5py.h5s.create(h5py.h5s.SCALAR)).write(
            np.array(7, np.uint32))


def test_bitfields_come_back_as_bitfields_and_verify_names_an_integer(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """h5py reads a bitfield as an unsigned integer; the export wrote that integer type, and verify (which
    compared numpy dtypes) said equal."""
    src = tmp_path / "bits.h5"
    make_bitfields(src)
    back = round_trip(src, tmp_path)
    with h5py.File(src) as a, h5py.File(back) as b:
        for name in ("bits", "wide"):
            assert b[name].id.get_type().get_class() == h5py.h5t.BITFIELD
            assert b[name].id.get_type().get_order() == a[name].id.get_type().get_order()
            assert b[name].id.get_type().get_size() == a[name].id.get_type().get_size()
            assert b[name][()].tolist() == a[name][()].tolist()
        assert b["x"].attrs.get_id("mask").get_type().get_class() == h5py.h5t.BITFIELD and b["x"].attrs["mask"] == 7
    with monkeypatch.context() as patched:  # the old export: h5py's integer types
        patched.setattr(hdf5_export, "noted", lambda type_id, record: hdf5_dtypes.padded(type_id, record.get("strpad")))
        convert(tmp_path / "ds", tmp_path / "old.h5", to_format="hdf5", progress=False)
    found = differences(src, tmp_path / "old.h5")
    assert "storage of dataset '/bits'/bitfield: expected True, found False" in found
    assert "storage of dataset '/wide'/bitfield: expected True, found False" in found
    assert """dtype of attribute 'mask' of '/x': expected '"<u4" (bitfield)', found '"<u4"'""" in found
    with monkeypatch.context() as patched:  # the old ingest: no word of the bitfields
        patched.setattr(hdf5_meta, "type_notes", lambda type_id: {})
        convert(src, tmp_path / "old_ds", progress=False)
    found = differences(src, tmp_path / "old_ds")
    assert "storage of dataset '/bits'/bitfield: expected True, found False" in found


def test_compound_members_keep_their_padding_and_bitfields_and_verify_names_them(tmp_path: Path) -> None:
    """A compound written by C or Fortran: a space-padded and a NUL-terminated string member (one value
    fills its 4 bytes), a bitfield member, an array of space-padded strings, in a dataset and an attribute.
    The export wrote h5py's own member types (NUL-padded strings, an integer) and verify, which compared
    only a whole type's padding, said equal. Members' padding and bitfields are kept and compared now."""
    h5t = h5py.h5t
    spaced, ended = h5t.C_S1.copy(), h5t.C_S1.copy()
    for t, pad in ((spaced, h5t.STR_SPACEPAD), (ended, h5t.STR_NULLTERM)):
        t.set_size(4)
        t.set_strpad(pad)
    compound = h5t.create(h5t.COMPOUND, 20)
    compound.insert(b"name", 0, spaced)
    compound.insert(b"code", 4, ended)
    compound.insert(b"flags", 8, h5t.STD_B32LE)
    compound.insert(b"tags", 12, h5t.array_create(spaced, (2,)))
    dt = np.dtype({"names": ["name", "code", "flags", "tags"], "formats": ["S4", "S4", "<u4", ("S4", (2,))],
                   "offsets": [0, 4, 8, 12], "itemsize": 20})
    values = np.zeros(3, dt)
    values["name"], values["code"], values["flags"] = [b"ab", b"abcd", b""], [b"x", b"wxyz", b""], [1, 2, 4]
    values["tags"] = [[b"t", b"uv"]] * 3
    memory = h5t.create(h5t.COMPOUND, 20)  # the file's types, names and tags NUL-padded: HDF5 pads with spaces
    for i in range(4):
        memory.insert(compound.get_member_name(i), compound.get_member_offset(i),
                      h5t.py_create(dt[i]) if i in (0, 3) else compound.get_member_type(i))
    src = tmp_path / "c.h5"
    with h5py.File(src, "w") as f:
        h5py.h5d.create(f.id, b"rows", compound, h5py.h5s.create_simple((3,))).write(
            h5py.h5s.ALL, h5py.h5s.ALL, values, mtype=memory)
        h5py.h5a.create(f.id, b"first", compound, h5py.h5s.create(h5py.h5s.SCALAR)).write(
            np.ascontiguousarray(values[1:2].reshape(())), mtype=memory)
    assert b"ab  x" in src.read_bytes() and b"abcdwxyz" in src.read_bytes()
    back = round_trip(src, tmp_path)
    with h5py.File(src) as a, h5py.File(back) as b:
        for got in (b["rows"].id.get_type(), b.attrs.get_id("first").get_type()):
            assert got.get_member_type(0).get_strpad() == h5t.STR_SPACEPAD
            assert got.get_member_type(1).get_strpad() == h5t.STR_NULLTERM
            assert got.get_member_type(2).get_class() == h5t.BITFIELD
            assert got.get_member_type(3).get_super().get_strpad() == h5t.STR_SPACEPAD
        assert b["rows"][()].tobytes() == a["rows"][()].tobytes()
        assert b["rows"]["code"].tolist() == [b"x", b"wxyz", b""]  # all 4 bytes of a NUL-terminated member
        assert b.attrs["first"].tobytes() == a.attrs["first"].tobytes()
    assert b"ab  x" in back.read_bytes() and b"abcdwxyz" in back.read_bytes() and b"t   uv  " in back.read_bytes()
    with pytest.MonkeyPatch.context() as patched:  # the old ingest: no word of the members
        patched.setattr(hdf5_meta, "type_notes", lambda type_id: {})
        convert(src, tmp_path / "old_ds", progress=False)
    found = differences(src, tmp_path / "old_ds")
    assert "storage of dataset '/rows'/members: expected {'name', 'code', 'flags', 'tags'}, found None" in found, found
    assert any(d.startswith("dtype of attribute 'first' of '/': expected") for d in found), found


def test_groups_inside_sample_groups_keep_their_creation_order(tmp_path: Path) -> None:
    """A tracked group inside each sample (``sub``: ``z`` then ``y``) came back listing ``y, z``; the export
    now makes each sample's objects in the source's order at every level."""
    src = tmp_path / "nested.h5"
    with h5py.File(src, "w") as f:
        container = f.create_group("data", track_order=True)
        for name in ("b", "a", "c"):
            g = container.create_group(name, track_order=True)
            sub = g.create_group("sub", track_order=True)
            sub["z"] = np.arange(3)
            sub["y"] = np.arange(2)
            g["w"] = np.float32(1)
            g.create_group("meta", track_order=True).attrs["q"] = 2
            g.attrs["k"] = 1
    back = round_trip(src, tmp_path, layout="groups")
    with h5py.File(back) as b:
        assert list(b["data"]) == ["b", "a", "c"]
        for name in ("b", "a", "c"):
            assert list(b["data"][name]) == ["sub", "w", "meta"] and list(b["data"][name]["sub"]) == ["z", "y"]
            assert tracked(b["data"][name]["meta"]) and b["data"][name]["meta"].attrs["q"] == 2
