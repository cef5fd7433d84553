"""``unihub verify`` for WebDataset: the shards read by Python's tarfile (never by unihub's tar
reader), the unihub rows as an export would hold them, member names and bytes compared exactly; equal
for faithful conversions, and a difference naming shard, key, field, member, expected and found when
something was lost (issues 10 and 36)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from unihub.cli import main
from unihub.converters.convert import convert
from unihub.converters.verify import verify
from unihub.formats.webdataset.format import WebDatasetFormat
from unihub.images import decoders as images

from .wds_helpers import npy, tar_writer_shards, tarfile_shard

N = 6


def sample(i: int) -> dict[str, bytes | str]:
    return {"__key__": f"{i:06d}", "x.npy": npy(np.arange(3, dtype=np.float32) * i + 0.25),
            "jpg": images.encode_image(np.full((4, 4, 3), 20 * i, np.uint8), "jpeg"), "cls": b"%d\n" % (i % 3),
            "txt": f"text {i}".encode()}


@pytest.fixture()
def shards(tmp_path: Path) -> Path:
    tar_writer_shards(tmp_path / "wds", [sample(i) for i in range(N)], per_shard=3)
    return tmp_path / "wds"


def rewrite(path: Path, change) -> None:
    """Rewrite a shard, each member through ``change(name, data)`` (None drops it)."""
    with tarfile.open(path) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar if m.isreg()]  # type: ignore[union-attr]
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            data = change(name, data)
            if data is not None:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_reference_records_come_from_tarfile(shards: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Members by exact name and bytes, under the extension webdataset names the field by: nothing parsed."""
    import unihub.formats.webdataset.tar as stage
    import unihub.formats.webdataset.tarstream as tarstream

    def no(*args, **kwargs):
        raise AssertionError("the reference must not use unihub's tar reader")

    monkeypatch.setattr(tarstream, "iter_members", no)
    monkeypatch.setattr(stage, "iter_members", no)
    records = list(WebDatasetFormat(str(shards), unihub_schema=False).reference_records())
    assert [where for where, _ in records] == [f"shard-00000{i // 3}.tar key '{i:06d}'" for i in range(N)]
    where, first = records[1]
    assert first == {"__key__": "000001", "x.npy": {"000001.x.npy": sample(1)["x.npy"]},
                     "jpg": {"000001.jpg": sample(1)["jpg"]}, "cls": {"000001.cls": b"1\n"},
                     "txt": {"000001.txt": b"text 1"}}


def test_members_are_compared_as_bytes_never_as_values(tmp_path: Path) -> None:
    """Another spelling of the same value is a difference: ``3`` is not ``003``, a big-endian .npy is not
    its little-endian twin, ``a.JPG`` is not ``a.jpg``; two members one sample spells in two cases are two."""
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    base = {"__key__": "a", "cls": b"3", "x.npy": npy(a), "jpg": b"\xff\xd8\xff"}
    for changed, named in (({"cls": b"003"}, "'cls'/a.cls"), ({"cls": b"3\n"}, "'cls'/a.cls"),
                           ({"x.npy": npy(a.astype(">i4"))}, "'x.npy'/a.x.npy"),
                           ({"x.npy": npy(np.asfortranarray(a))}, "'x.npy'/a.x.npy"),
                           ({"jpg": None, "JPG": b"\xff\xd8\xff"}, "'jpg'/a.jpg: expected b'\\xff\\xd8\\xff', found nothing")):
        other = {k: v for k, v in {**base, **changed}.items() if v is not None}
        tar_writer_shards(tmp_path / "a", [base])
        tar_writer_shards(tmp_path / "b", [other])
        report = verify(str(tmp_path / "a"), str(tmp_path / "b"))
        assert not report.equal, changed
        assert report.differences[0].startswith(f"record 0 (shard-000000.tar key 'a'), field {named}"), report.summary()
    tarfile_shard(tmp_path / "c" / "c.tar", [("a.jpg", b"1"), ("a.JPG", b"1")])
    (record,) = [r for _, r in WebDatasetFormat(str(tmp_path / "c")).reference_records()]
    assert record == {"__key__": "a", "jpg": {"a.jpg": b"1", "a.JPG": b"1"}}


def test_faithful_ingest_is_equal(shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["convert", str(shards), str(tmp_path / "ds"), "--quiet"]) == 0
    assert main(["verify", str(shards), str(tmp_path / "ds")]) == 0
    assert capsys.readouterr().out.startswith(f"equal: {N} rows, every value identical (checked against "
                                              "Python's tarfile)")


@pytest.mark.parametrize(("change", "expected"), [
    (lambda name, data: npy(np.array([0.25, 1.25, 2.2500002], np.float32)) if name == "000001.x.npy" else data,
     "record 1 (shard-000000.tar key '000001'), field 'x.npy'/000001.x.npy: expected 140 bytes "
     "b\"\\x93NUMPY\\x01\\x00v\\x00{'descr': '<f4\"..., found 140 bytes b\"\\x93NUMPY\\x01\\x00v\\x00{'descr': "
     "'<f4\"..., first at byte 136"),
    (lambda name, data: None if name == "000002.txt" else data,
     "record 2 (shard-000000.tar key '000002'), field 'txt': expected nothing, found {'000002.txt'} "
     "(not in the source)"),
    (lambda name, data: b"7" if name == "000000.cls" else data,
     "record 0 (shard-000000.tar key '000000'), field 'cls'/000000.cls: expected b'7', found b'0\\n', "
     "first at byte 0"),
])
def test_a_source_that_differs_is_reported(shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                           change, expected: str) -> None:
    """Tamper with the source after the ingest: verify names the record, field, expected and found."""
    convert(str(shards), str(tmp_path / "ds"), progress=False)
    rewrite(shards / "shard-000000.tar", change)
    report = verify(str(shards), str(tmp_path / "ds"))
    assert not report.equal and report.differences == [expected], report.summary()
    assert main(["verify", str(shards), str(tmp_path / "ds")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("DIFFERENT") and expected in out


def test_records_a_conversion_skipped_are_reported(shards: Path, tmp_path: Path) -> None:
    rewrite(shards / "shard-000001.tar", lambda name, data: b"\x93NUMPY bad" if name == "000004.x.npy" else data)
    result = convert(str(shards), str(tmp_path / "ds"), on_error="skip", progress=False)
    assert result.rows == N - 1
    report = verify(str(shards), str(tmp_path / "ds"))
    assert not report.equal and report.differences[0] == f"record counts differ: {N:,} in the source vs {N - 1:,} " \
                                                          "in the target"


def test_export_check(shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    convert(str(shards), str(tmp_path / "ds"), progress=False)
    convert(str(tmp_path / "ds"), str(tmp_path / "out"), to_format="webdataset", progress=False)
    assert main(["verify", str(tmp_path / "ds"), str(tmp_path / "out")]) == 0
    capsys.readouterr()
    rewrite(tmp_path / "out" / "shard-000000.tar", lambda name, data: b"2" if name == "000003.cls" else data)
    report = verify(str(tmp_path / "ds"), str(tmp_path / "out"))
    assert report.differences == ["record 3 (shard-000000.tar key '000003'), field 'cls'/000003.cls: expected "
                                  "b'0\\n', found b'2', first at byte 0"]
