"""convert() when things go wrong: --skip-corrupt before the read, atomic exports, a failing writer,
and the progress bar's input bytes."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import pytest

from unihub import make_reader, open_dataset
from unihub.converters import convert as convert_module
from unihub.converters.convert import ProgressMeter, convert
from unihub.errors import FormatError
from unihub.formats.tfrecord import format as tfr
from unihub.formats.tfrecord import records as tfio
from unihub.formats.tfrecord.example import encode_example, encode_feature


def _tfrecord(path: Path, rows: int, bad: int | None = None) -> str:
    """``rows`` records of id + vec; record ``bad`` gets a data CRC that does not match."""
    tfio.write_records(str(path), [encode_example({"id": encode_feature("int64", [i]),
                                                  "vec": encode_feature("float", [i * 0.5] * 3)})
                                  for i in range(rows)])
    if bad is not None:
        offsets = [offset for _, offset, _ in tfio.iter_records(str(path))]
        data = bytearray(path.read_bytes())
        data[offsets[bad] + 14] ^= 0xFF  # inside the record's payload
        path.write_bytes(bytes(data))
    return str(path)


@pytest.mark.parametrize("to_format, target", [("unihub", "ds"), ("webdataset", "shards")])
def test_skip_corrupt_holds_for_the_schema_scan_too(tmp_path: Path, to_format: str, target: str) -> None:
    """A bad record among the ones the schema is inferred from is skipped, not fatal, and listed once."""
    src = _tfrecord(tmp_path / "in.tfrecord", 30, bad=2)
    with pytest.raises(FormatError, match="record 2 .*data CRC mismatch"):
        convert(src, tmp_path / "strict", to_format=to_format, progress=False)
    result = convert(src, tmp_path / target, to_format=to_format, on_error="skip", progress=False)
    assert result.rows == 29
    assert [s.location.split(" at ")[0] for s in result.skipped] == ["record 2"]
    if to_format == "unihub":
        ids = [row.id for row in make_reader(str(tmp_path / target), shuffle_row_groups=False)]
        assert ids == [i for i in range(30) if i != 2]


@pytest.mark.parametrize("to_format, target", [("webdataset", "shards"), ("tfrecord", "records"),
                                               ("tfrecord", "one.tfrecord"), ("hdf5", "out.h5")])
def test_a_failed_export_leaves_nothing_and_an_overwrite_replaces_every_shard(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, to_format: str, target: str) -> None:
    src = _tfrecord(tmp_path / "in.tfrecord", 40)
    convert(src, tmp_path / "uh", progress=False)
    original = convert_module.unihub_batches

    def failing(*args: Any) -> Any:  # the source fails after its first batch
        batches, schema, extra, rows = original(*args)

        def gen() -> Any:
            yield next(batches)
            raise OSError("disk went away")
        return gen(), schema, extra, rows

    monkeypatch.setattr(convert_module, "unihub_batches", failing)
    with pytest.raises(OSError, match="disk went away"):
        convert(tmp_path / "uh", tmp_path / target, to_format=to_format, progress=False, batch_size=8)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.tfrecord", "uh"]  # no target, no hidden dir

    monkeypatch.setattr(convert_module, "unihub_batches", original)
    old = tmp_path / target
    if old.suffix:
        old.write_bytes(b"old")
    else:
        old.mkdir()
        (old / "shard-000099.tar").write_bytes(b"stale")
    convert(tmp_path / "uh", old, to_format=to_format, progress=False, overwrite_foreign=True)  # not unihub's
    assert not (old / "shard-000099.tar").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["in.tfrecord", "uh", target])
    assert convert(old, tmp_path / "back", from_format=to_format, progress=False).rows == 40


def test_a_failing_writer_stops_the_read_ahead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import unihub.converters.tasks as tasks

    src = _tfrecord(tmp_path / "in.tfrecord", 2000)  # many more batches than the read-ahead holds

    def broken(fs: Any, directory: str, schema: Any, rows: Any, **kwargs: Any) -> None:
        next(iter(rows))
        raise RuntimeError("writer broke")

    monkeypatch.setattr(tasks, "write_parts", broken)  # what every conversion task writes with
    monkeypatch.setattr(tfr, "PROVISIONAL_SAMPLE", 10)
    monkeypatch.setattr(tfr.TFRecordFormat, "provisional_schema", lambda self: None)  # the direct path
    with pytest.raises(RuntimeError, match="writer broke") as caught:  # the traceback keeps convert's frame
        convert(src, tmp_path / "ds", progress=False, batch_size=8)
    assert not [t for t in threading.enumerate() if t.name == "unihub-read-ahead"], caught


def test_progress_counts_tfrecord_input_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bar shows input MB against the total, and an ETA, for a format that counts what it read."""
    src = _tfrecord(tmp_path / "in.tfrecord", 3000)
    stream = io.StringIO()
    original = ProgressMeter.__init__
    monkeypatch.setattr(ProgressMeter, "__init__", lambda self, **kw: original(self, **{**kw, "stream": stream}))
    convert(src, tmp_path / "ds", progress=True)
    total = Path(src).stat().st_size / 2**20
    last = stream.getvalue().strip().split("\r")[-1]
    assert last.startswith("3,000 rows") and f"{total:,.1f}/{total:,.1f} MB" in last and "ETA 0 s" in last
    assert open_dataset(tmp_path / "ds").num_rows == 3000


def test_an_unknown_on_error_is_refused_by_every_reader(tmp_path: Path) -> None:
    from unihub.errors import SchemaError
    from unihub.formats.imagefolder.format import ImageFolderFormat

    src = _tfrecord(tmp_path / "in.tfrecord", 3)
    source = tfr.TFRecordFormat(src)
    (tmp_path / "images" / "a").mkdir(parents=True)
    for reader in (source.read_batches(source.infer_schema(), on_error="maybe"),
                   ImageFolderFormat(str(tmp_path / "images")).read_batches(None, on_error="maybe")):  # type: ignore[arg-type]
        with pytest.raises(SchemaError, match="on_error must be 'raise' or 'skip', got 'maybe'"):
            next(iter(reader))
    with pytest.raises(SchemaError, match="on_error must be"):
        convert(src, tmp_path / "ds", on_error="maybe", progress=False)  # type: ignore[arg-type]
