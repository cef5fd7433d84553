"""WebDataset -> unihub -> WebDataset gives every tar member back, name and bytes (issue 36), while the
fields stay typed for the readers: ``.cls`` ints, ``.npy`` arrays in native order. What a value does
not say (``007``, ``b.JPG``, a big-endian ``.npy`` header) rides in the row's ``__spelling__``; what
cannot be kept is refused naming the member. Shards are written by webdataset's TarWriter (tarfile for
names it would not write), and compared with tarfile member by member, byte for byte.

Each bug the user found has a test where ``unihub verify`` fails on the old, lossy behaviour (kept
reachable by monkeypatching the spelling away) and passes on the fixed one."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unihub import ScalarCodec, SchemaError, TensorCodec, Unischema, UnischemaField
from unihub.converters.convert import convert
from unihub.converters.verify import verify
from unihub.errors import CodecError
from unihub.formats.webdataset import fields as webdataset_fields
from unihub.formats.webdataset import spelling as webdataset_spelling
from unihub.formats.webdataset.format import WebDatasetFormat
from unihub.formats.webdataset.spelling import SPELLING_FIELD
from unihub.images import decoders as images
from unihub.store.dataset import open_dataset

from .wds_helpers import batch_rows, npy, reader_rows, refused, same, tar_writer_shards, tarfile_shard

JPG = images.encode_image(np.full((4, 4, 3), 90, np.uint8), "jpeg")
PNG = images.encode_image(np.full((4, 4, 3), 30, np.uint8), "png")
A = np.arange(6, dtype=np.float32).reshape(2, 3) + 0.5


def npy_v2(array: np.ndarray) -> bytes:
    """A version 2.0 ``.npy`` (numpy writes it for headers over 64 KiB; here for a small one)."""
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, version=(2, 0))
    return buffer.getvalue()


def hand_header(array: np.ndarray, descr: str) -> bytes:
    """A ``.npy`` with a header no np.save writes: another descr spelling, 16-byte padding (numpy < 1.9)."""
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {array.shape!r}, }}"
    text += " " * (-(10 + len(text) + 1) % 16) + "\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode("latin-1") + array.tobytes()


def members(path: Path) -> list[tuple[str, bytes]]:
    """Every regular member of every shard under ``path`` (the export's metadata member aside), as tarfile reads them."""
    found = []
    for shard in sorted(path.glob("*.tar")):
        with tarfile.open(shard) as tar:
            found += [(m.name, tar.extractfile(m).read()) for m in tar if m.isreg()]  # type: ignore[union-attr]
    return found


def by_sample(found: list[tuple[str, bytes]]) -> list[dict[str, bytes]]:
    """Members grouped into samples (adjacent runs of a key), each ``name -> bytes``: the order of a sample's
    members is webdataset's business, not a value (an export writes them in field order)."""
    samples: list[dict[str, bytes]] = []
    last = None
    for name, data in found:
        key = name.split(".", 1)[0]
        if key != last:
            samples.append({})
            last = key
        samples[-1][name] = data
    return samples


def round_trip(tmp_path: Path, samples: list[dict[str, Any]]) -> tuple[Path, Path, Path]:
    """Source shards (TarWriter) -> ``ds`` -> exported shards; checks every member comes back."""
    src, ds, out = tmp_path / "src", tmp_path / "ds", tmp_path / "out"
    tar_writer_shards(src, samples, per_shard=3)
    convert(str(src), str(ds), progress=False)
    convert(str(ds), str(out), to_format="webdataset", progress=False)
    assert by_sample(members(out)) == by_sample(members(src))
    for a, b in ((src, ds), (ds, out), (src, out)):
        report = verify(str(a), str(b))
        assert report.equal, report.summary()
    return src, ds, out


@pytest.fixture()
def lossy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The behaviour before issue 36: ingest keeps no spelling, the export writes the canonical member."""
    monkeypatch.setattr(webdataset_fields.FieldStats, "spelled", lambda self, f: False)
    monkeypatch.setattr(webdataset_spelling.FieldSpeller, "spelling", lambda self, extension, data, value: None)
    monkeypatch.setattr(webdataset_spelling.FieldSpeller, "member", lambda self, value, spelling: self.encode(value))


# ------------------------------------------------------------------------- the whole set
def everything(i: int) -> dict[str, Any]:
    npys = [npy(A.astype(">f4")), npy(np.asfortranarray(A)), npy_v2(A), npy(A), hand_header(A, "<f4"), npy(A)]
    cls = [b"007", b"+3", b" 4", b"5\n", b"6", b"1_000"]
    score = [b"2", b"1.5", b"-0", b"2.50", b"1e3", b"nan"]
    extension = ["jpg", "JPG", "Jpg", "jpg", "jpg", "jpG"]
    return {"__key__": f"{i:06d}", "x.npy": npys[i], "cls": cls[i], "score.cls": score[i], extension[i]: JPG,
            "seg.png" if i % 2 else "Seg.PNG": PNG, "Mask.NPY" if i == 4 else "mask.npy": npy(np.arange(3, dtype=np.int16) - i),
            "json": b"\xef\xbb\xbf{\"a\": 1}\r\n" if i == 0 else b'{"a": 2}', "txt": "t\u00fc".encode("utf-16"),
            "u8.npy": hand_header(np.arange(2, dtype=np.uint8), "<u1" if i == 1 else "|u1")}


def test_every_member_comes_back_and_values_stay_typed(tmp_path: Path) -> None:
    samples = [everything(i) for i in range(6)]
    src, ds, out = round_trip(tmp_path, samples)
    schema = open_dataset(str(ds)).schema
    assert {name: (f.numpy_dtype, f.shape) for name, f in schema.fields.items()} == {
        "__key__": (np.str_, ()), "cls": (np.int64, ()), "score.cls": (np.float64, ()), "jpg": (np.uint8, (4, 4, 3)),
        "seg.png": (np.uint8, (4, 4, 3)), "mask.npy": (np.int16, (3,)), "x.npy": (np.float32, (2, 3)),
        "json": (np.str_, ()), "txt": (np.bytes_, ()), "u8.npy": (np.uint8, (2,)), SPELLING_FIELD: (np.str_, ())}
    for rows in (reader_rows(ds), batch_rows(ds)):
        assert [int(r["cls"]) for r in rows] == [7, 3, 4, 5, 6, 1000]
        assert all(isinstance(r["cls"], np.int64) for r in rows)
        assert [float(r["score.cls"]) for r in rows][:5] == [2.0, 1.5, -0.0, 2.5, 1000.0]
        for i, row in enumerate(rows):
            same(row["x.npy"], A, "x.npy")  # native float32, C order, the same values
            same(row["mask.npy"], np.arange(3, dtype=np.int16) - i, "mask.npy")
            assert row["jpg"] == JPG and row["seg.png"] == PNG
    spellings = [json.loads(r[SPELLING_FIELD]) if r[SPELLING_FIELD] else {} for r in reader_rows(ds)]
    assert spellings[1]["jpg"] == {"ext": "JPG"} and spellings[0]["cls"] == {"text": "007"}
    assert spellings[0]["score.cls"] == {"text": "2"} and "npy" in spellings[0]["x.npy"]
    assert "x.npy" not in spellings[3]  # np.save's own bytes need nothing beside the value
    again = tmp_path / "again"
    convert(str(out), str(again), progress=False)  # the export's shards read back as the dataset they came from
    assert open_dataset(str(again)).schema == schema
    for x, y in zip(reader_rows(ds), reader_rows(again)):
        for name in x:
            same(y[name], x[name], name)


def test_canonical_shards_need_no_spelling(tmp_path: Path) -> None:
    """np.save's bytes, int text as Python prints it, lower-case names: no __spelling__ field at all."""
    samples = [{"__key__": f"{i:04d}", "x.npy": npy(A * i), "cls": str(i - 1).encode(), "jpg": JPG} for i in range(5)]
    _, ds, _ = round_trip(tmp_path, samples)
    assert SPELLING_FIELD not in open_dataset(str(ds)).schema.fields


# ------------------------------------------------------- each bug: verify fails on the old behaviour
BUGS = {
    "big-endian npy": ("x.npy", npy(A.astype(">f4"))),
    "fortran-order npy": ("x.npy", npy(np.asfortranarray(A))),
    "class text 007": ("cls", b"007"),
    "class text +3": ("cls", b"+3"),
    "class text ' 4'": ("cls", b" 4"),
    "class text with a newline": ("cls", b"3\n"),
    "int text in a float field": ("cls", b"2"),  # sample 1 holds 1.5: a float64 field
    "upper-case image extension": ("JPG", JPG),
    "upper-case npy extension": ("X.NPY", npy(A)),
    ".jpeg beside .jpg": ("jpeg", JPG),
}
#: the member the other sample holds in the field of each odd name
TWINS = {"JPG": ("jpg", JPG), "X.NPY": ("x.npy", npy(A)), "jpeg": ("jpg", PNG)}


def bug_samples(bug: str) -> list[dict[str, Any]]:
    name, data = BUGS[bug]
    plain = {"x.npy": npy(A), "cls": b"1.5" if bug == "int text in a float field" else b"1"}
    twin, twin_data = TWINS.get(name, (name, data))
    plain[twin] = twin_data if name in TWINS else plain.get(twin, data)
    first = {k: v for k, v in plain.items() if k != twin}
    return [{"__key__": "000000", **first, name: data}, {"__key__": "000001", **plain}]


def names_member(difference: str, name: str) -> bool:
    """The difference names shard, key, field (webdataset's: the extension in lower case) and member:
    ``record 0 (shard-000000.tar key '000000'), field 'cls'/000000.cls: expected b'007', found b'7'``, or
    ``..., field 'jpeg': expected {'000000.jpeg'}, found nothing (missing)``."""
    where = f"record 0 (shard-000000.tar key '000000'), field '{name.lower()}'"
    return difference.startswith(f"{where}/000000.{name}: expected ") or \
        difference.startswith(f"{where}: expected {{'000000.{name}'}}, found nothing (missing)")


@pytest.mark.parametrize("bug", list(BUGS))
def test_verify_fails_on_the_old_lossy_ingest(tmp_path: Path, bug: str, request: pytest.FixtureRequest) -> None:
    name, data = BUGS[bug]
    src, ds, out = round_trip(tmp_path / "fixed", bug_samples(bug))  # fixed: every member back, verify equal
    request.getfixturevalue("lossy")
    tar_writer_shards(tmp_path / "src", bug_samples(bug), per_shard=3)
    convert(str(tmp_path / "src"), str(tmp_path / "ds"), progress=False)
    report = verify(str(tmp_path / "src"), str(tmp_path / "ds"))
    assert not report.equal and names_member(report.differences[0], name), report.summary()
    convert(str(tmp_path / "ds"), str(tmp_path / "out"), to_format="webdataset", progress=False)
    assert by_sample(members(tmp_path / "out")) != by_sample(members(tmp_path / "src"))
    report = verify(str(tmp_path / "src"), str(tmp_path / "out"))  # tar against tar, both through tarfile
    assert not report.equal and names_member(report.differences[0], name), report.summary()


@pytest.mark.parametrize("bug", list(BUGS))
def test_verify_fails_on_an_export_that_drops_the_spelling(tmp_path: Path, bug: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The ingest keeps the spelling, an export that ignores it (the old one) is caught against the source."""
    name, _ = BUGS[bug]
    tar_writer_shards(tmp_path / "src", bug_samples(bug), per_shard=3)
    convert(str(tmp_path / "src"), str(tmp_path / "ds"), progress=False)
    monkeypatch.setattr(webdataset_spelling.FieldSpeller, "member", lambda self, value, spelling: self.encode(value))
    convert(str(tmp_path / "ds"), str(tmp_path / "out"), to_format="webdataset", progress=False)
    report = verify(str(tmp_path / "src"), str(tmp_path / "out"))
    assert not report.equal and names_member(report.differences[0], name), report.summary()


def test_jpeg_and_jpg_members_are_one_field(tmp_path: Path) -> None:
    """``a.jpg``, ``b.jpeg``, ``c.JPEG``: one ``jpg`` image field for the loaders, each member's name kept."""
    samples = [{"__key__": "a", "jpg": JPG, "cls": b"0"}, {"__key__": "b", "jpeg": PNG, "cls": b"1"},
               {"__key__": "c", "JPEG": JPG, "cls": b"2"}, {"__key__": "d", "seg.jpeg": PNG, "cls": b"3"}]
    _, ds, out = round_trip(tmp_path, samples)
    schema = open_dataset(str(ds)).schema
    assert list(schema.fields) == ["__key__", "cls", "jpg", "seg.jpeg", SPELLING_FIELD]  # seg.jpeg alone: its own
    assert schema["jpg"].nullable  # d holds none
    assert [r["jpg"] for r in reader_rows(ds)] == [JPG, PNG, JPG, None]
    assert [m for m, _ in members(out)] == ["a.cls", "a.jpg", "b.cls", "b.jpeg", "c.cls", "c.JPEG", "d.cls",
                                            "d.seg.jpeg"]


def test_jpeg_and_jpg_in_one_sample_stay_two_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One field cannot hold both; found after the provisional sample, the conversion starts over."""
    from unihub.formats.webdataset import format as webdataset

    monkeypatch.setattr(webdataset, "PROVISIONAL_SAMPLE", 2)
    samples = [{"__key__": "a", "jpg": JPG}, {"__key__": "b", "jpeg": PNG}, {"__key__": "c", "jpg": JPG, "jpeg": PNG}]
    _, ds, _ = round_trip(tmp_path, samples)
    assert list(open_dataset(str(ds)).schema.fields) == ["__key__", "jpeg", "jpg"]
    assert [(r["jpg"], r["jpeg"]) for r in reader_rows(ds)] == [(JPG, None), (None, PNG), (JPG, PNG)]


# ---------------------------------------------------------------------------- refusals
def test_one_extension_in_two_cases_in_one_sample_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """webdataset reads both as 'jpg' (one would overwrite the other): refused naming both members."""
    tarfile_shard(tmp_path / "wds" / "a.tar", [("k.jpg", JPG), ("k.JPG", PNG)])
    line = refused(["convert", str(tmp_path / "wds"), str(tmp_path / "ds")], capsys, tmp_path / "ds")
    assert "a.tar: member 'k.JPG' at offset 1536: key 'k' already has a .jpg member ('k.jpg'" in line


def test_a_given_schema_without_the_spelling_field_refuses_what_it_would_change(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    tar_writer_shards(tmp_path / "wds", [{"__key__": "a", "cls": b"1"}, {"__key__": "b", "cls": b"007"}])
    schema = Unischema("S", [UnischemaField("__key__", np.str_, (), ScalarCodec(np.str_)),
                             UnischemaField("cls", np.int64, (), ScalarCodec(np.int64))])
    (tmp_path / "schema.json").write_text(schema.to_json())
    line = refused(["convert", str(tmp_path / "wds"), str(tmp_path / "ds"), "--schema", str(tmp_path / "schema.json")],
                   capsys, tmp_path / "ds")
    assert "sample 'b' (offset 2048): member 'b.cls' would not come back byte for byte from field 'cls' alone " \
           "(an export would write another text)" in line
    assert f"'{SPELLING_FIELD}'" in line


@pytest.mark.parametrize("name", [SPELLING_FIELD, "__key__"])
def test_a_member_named_like_a_field_unihub_adds_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                            name: str) -> None:
    """``a.__key__`` was a SchemaError naming no shard ('field __key__ appears twice')."""
    tarfile_shard(tmp_path / "wds" / "a.tar", [("a.cls", b"1"), (f"a.{name}", b"{}")])  # TarWriter skips it
    line = refused(["convert", str(tmp_path / "wds"), str(tmp_path / "ds")], capsys, tmp_path / "ds")
    assert f"holds members named <key>.{name}: that extension is the field unihub keeps" in line


def test_a_value_changed_after_ingest_is_not_written_with_a_stale_spelling(tmp_path: Path) -> None:
    """A spelling that no longer reads back as its value is refused: never '007' for an 8."""

    schema = Unischema("S", [UnischemaField("cls", np.int64, (), ScalarCodec(np.int64)),
                             UnischemaField("x.npy", np.float32, (2, 3), TensorCodec()),
                             webdataset_spelling.spelling_field()])
    header = npy(A.astype(">f4"))[:128].decode("latin-1")
    for row, message in (({"cls": 8, "x.npy": A, SPELLING_FIELD: '{"cls":{"text":"007"}}'},
                          "row 0 .* the recorded text '007' does not read back as the value 8"),
                         ({"cls": 8, "x.npy": A[:, :2], SPELLING_FIELD: json.dumps({"x.npy": {"npy": header}})},
                          r"the recorded .npy header says >f4 of shape \(2, 3\), the value is float32 of shape \(2, 2\)"),
                         ({"cls": 8, "x.npy": A, SPELLING_FIELD: '{"cls":{"ext":"idx"}}'},
                          "the recorded extension 'idx' is not the value's 'cls'")):
        with pytest.raises(CodecError, match=message):
            WebDatasetFormat.write(str(tmp_path / "out"), schema, [{k: [v] for k, v in row.items()}])


def test_spellings_outside_the_provisional_sample_convert_in_a_full_scan(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The first samples are canonical, a later one is not: the single pass starts over and keeps it."""
    from unihub.formats.webdataset import format as webdataset

    monkeypatch.setattr(webdataset, "PROVISIONAL_SAMPLE", 4)
    samples = [{"__key__": f"{i:04d}", "cls": str(i).encode(), "x.npy": npy(A)} for i in range(12)]
    samples[9]["cls"] = b"09"
    samples[10]["x.npy"] = npy(A.astype(">f4"))
    src, ds, _ = round_trip(tmp_path, samples)
    assert SPELLING_FIELD in open_dataset(str(ds)).schema.fields
    assert [int(r["cls"]) for r in reader_rows(ds)] == list(range(12))


def test_the_fast_column_path_leaves_nothing_unspelled(tmp_path: Path) -> None:
    """Blocks read as columns (every sample alike) with leading zeros or big-endian headers throughout."""
    samples = [{"__key__": f"{i:04d}", "cls": b"%03d" % i, "x.npy": npy((A * i).astype(">f4"))} for i in range(40)]
    _, ds, _ = round_trip(tmp_path, samples)
    rows = batch_rows(ds)
    assert [int(r["cls"]) for r in rows] == list(range(40))
    for i, row in enumerate(rows):
        same(row["x.npy"], A * i, "x.npy")


def test_capitals_after_lower_case_samples_keep_their_spelling(tmp_path: Path) -> None:
    """``B.TXT`` last in its shard, after samples whose ``.txt`` went out as columns: read member by member,
    it joined their columns and lost its capitals (verify said unequal, the export wrote ``B.txt``)."""
    src, ds, out = tmp_path / "src", tmp_path / "ds", tmp_path / "out"
    names = ["a.txt", "b.txt", "B.TXT"]
    tarfile_shard(src / "shard-000000.tar", [(name, b"%d" % i) for i, name in enumerate(names)])
    convert(str(src), str(ds), progress=False)
    assert verify(str(src), str(ds)).equal
    assert SPELLING_FIELD in open_dataset(str(ds)).schema.fields
    convert(str(ds), str(out), to_format="webdataset", progress=False)
    assert members(out) == [(name, b"%d" % i) for i, name in enumerate(names)]


def test_unreadable_spelling_is_a_named_error() -> None:
    with pytest.raises(SchemaError, match=f"field '{SPELLING_FIELD}' holds 'nope', which is not JSON"):
        webdataset_spelling.parse_spellings("nope")
    with pytest.raises(SchemaError, match="not an object of objects"):
        webdataset_spelling.parse_spellings("[1]")


@pytest.mark.parametrize("text", ["[" * 100_000, '{"cls":{"text":5}}', '{"cls":{"ext":null}}', '{"x.npy":{"npy":[1]}}',
                                  '{"cls":{"text":"\\ud800"}}', '{"x.npy":{"npy":"\\u0100"}}'])
def test_a_hostile_spelling_is_a_named_error(tmp_path: Path, text: str) -> None:
    # Were a RecursionError from json.loads, then AttributeError ('int' object has no attribute 'encode') or
    # UnicodeEncodeError where FieldSpeller.member used the value.

    schema = Unischema("S", [UnischemaField("cls", np.int64, (), ScalarCodec(np.int64)),
                             UnischemaField("x.npy", np.float32, (2, 3), TensorCodec()),
                             webdataset_spelling.spelling_field()])
    with pytest.raises(SchemaError, match=f"field '{SPELLING_FIELD}' holds "):
        WebDatasetFormat.write(str(tmp_path / "out"), schema, [{"cls": [8], "x.npy": [A], SPELLING_FIELD: [text]}])
