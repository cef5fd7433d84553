"""``unihub verify`` for WebDataset: the shards read by Python's tarfile (never by unihub's tar
reader), the unihub rows as an export would hold them; equal for faithful conversions, and a
difference naming record, field, expected and found when something was lost (issue 10)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from unihub.cli import main
from unihub.converters.convert import convert
from unihub.converters.verify import verify
from unihub.formats import images
from unihub.formats.webdataset import WebDatasetFormat
from unihub.formats.webdataset_fields import member_value

from .wds_helpers import npy, tar_writer_shards

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
    import unihub.formats.tarstream as tarstream
    import unihub.formats.webdataset_tar as stage

    def no(*args, **kwargs):
        raise AssertionError("the reference must not use unihub's tar reader")

    monkeypatch.setattr(tarstream, "iter_members", no)
    monkeypatch.setattr(stage, "iter_members", no)
    records = list(WebDatasetFormat(str(shards), unihub_schema=False).reference_records())
    assert [where for where, _ in records] == [f"shard-00000{i // 3}.tar key '{i:06d}'" for i in range(N)]
    where, first = records[1]
    assert first.keys() == {"__key__", "x.npy", "jpg", "cls", "txt"}
    assert first["cls"] == "1" and first["txt"] == b"text 1" and first["jpg"] == sample(1)["jpg"]
    np.testing.assert_array_equal(first["x.npy"], np.arange(3, dtype=np.float32) + 0.25)


def test_normal_forms_lose_nothing() -> None:
    """Re-saved arrays and re-printed numbers are equal; another dtype, shape, bit or number is not."""
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    for again in (npy(np.asfortranarray(a)), npy(a.astype(">i4"))):
        assert member_value("x.npy", again).tobytes() == member_value("x.npy", npy(a)).tobytes()
        assert member_value("x.npy", again).dtype == np.int32
    assert member_value("x.npy", npy(a.astype(np.int64))).dtype == np.int64
    assert member_value("x.npy", npy(a.reshape(3, 2))).shape == (3, 2)
    assert member_value("x.npy", b"\x93NUMPY broken") == b"\x93NUMPY broken"
    assert member_value("a.cls", b"3\n") == member_value("a.cls", b"003") == member_value("a.cls", b"3.0") == "3"
    assert member_value("a.cls", b"2.50") == member_value("a.cls", b"2.5") == "2.5"
    assert member_value("a.cls", b"1e3") == "1000" and member_value("a.cls", b"NaN") == "nan"
    assert member_value("a.cls", b"0.10000000000000000001") != member_value("a.cls", b"0.1")
    assert member_value("a.cls", b"-0.0") == "-0" != member_value("a.cls", b"0")
    assert member_value("a.cls", b"-nan") == "-nan" != member_value("a.cls", b"NaN")
    assert member_value("a.cls", b"x") == b"x" and member_value("a.cls", b"\xff") == b"\xff"
    assert member_value("t.txt", b"3\n") == b"3\n"  # text is bytes, exactly


def test_faithful_ingest_is_equal(shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["convert", str(shards), str(tmp_path / "ds"), "--quiet"]) == 0
    assert main(["verify", str(shards), str(tmp_path / "ds")]) == 0
    assert capsys.readouterr().out.startswith(f"equal: {N} rows, every value identical (checked against "
                                              "Python's tarfile)")


@pytest.mark.parametrize(("change", "expected"), [
    (lambda name, data: npy(np.array([0.25, 1.25, 2.2500002], np.float32)) if name == "000001.x.npy" else data,
     "record 1 (shard-000000.tar key '000001'), field 'x.npy': expected float32[3] [0.25, 1.25, 2.2500002], "
     "found float32[3] [0.25, 1.25, 2.25], first at index (2,): 2.2500002 vs 2.25"),
    (lambda name, data: None if name == "000002.txt" else data,
     "record 2 (shard-000000.tar key '000002'), field 'txt': expected nothing, found b'text 2' "
     "(not in the source)"),
    (lambda name, data: b"7" if name == "000000.cls" else data,
     "record 0 (shard-000000.tar key '000000'), field 'cls': expected '7', found '0'"),
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
    assert report.differences == ["record 3 (shard-000000.tar key '000003'), field 'cls': expected '0', found '2'"]
