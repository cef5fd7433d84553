"""``unihub.show``: the report of real datasets (images written by PIL, Petastorm's own, plain Parquet,
a conversion that skipped records, one on S3), its sample, statistics, escaping and bounded reads."""

from __future__ import annotations

import html
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import unihub
from unihub import CompressedImageCodec, ScalarCodec, Unischema, UnischemaField, write_dataset
from unihub.errors import DatasetNotFoundError, FilterExpressionError, InvalidArgumentError
from unihub.store.dataset import ParquetStore

from ..conftest import make_row
from .conftest import FIXTURES, N, cards, decoded, pil, pixels


def test_the_sample_grid_holds_every_sampled_image_as_a_small_embedded_thumbnail(images_dataset: Path) -> None:
    report = unihub.show(images_dataset, rows=6, seed=1)
    grid = cards(report.html)
    assert sorted(grid) == [row.index for row in report.report.sample] and len(grid) == 6
    for row, thumbs in grid.items():
        original = pixels(row)
        expected_formats = ["jpeg", "png", "jpeg", "jpeg"] if row != 7 else ["jpeg", "png", "jpeg"]
        assert [fmt for fmt, _ in thumbs] == expected_formats  # alpha as PNG, the rest as JPEG
        rgb, rgba, gray16 = (decoded(blob) for _, blob in thumbs[:3])
        assert np.abs(rgb.astype(int) - original["rgb"]).mean() < 3
        assert np.array_equal(rgba, original["rgba"])  # PNG: exact
        assert np.abs(gray16.astype(int) - (original["gray16"] >> 8)).mean() < 3  # 16-bit shown by its top 8 bits
        if row != 7:
            photo = decoded(thumbs[3][1])
            assert photo.shape == (100, 67, 3)  # 300 x 200 shrunk 3 times: the longer side at most 128
            assert np.abs(photo.astype(int) - original["photo"][1::3, 1::3][:100, :67]).mean() < 4
    assert ("photo: null" in report.html) == (7 in grid)
    assert report.html.count('class="thumb"') == sum(len(t) for t in grid.values())


def test_counts_schema_and_row_groups_are_the_datasets(images_dataset: Path) -> None:
    report = unihub.show(images_dataset, rows=2)
    info = report.report.description
    assert (info["rows"], info["files"], info["row_groups"]) == (N, 4, 4)
    assert report.report.row_group_rows == [10, 10, 10, 10]
    for text in ("<tr><th>rows</th><td>40</td></tr>", "<tr><th>files</th><td>4</td></tr>",
                 "<td>gray16</td><td>uint16</td><td>(None, None)</td>", "(None, 4)",
                 "compressed_image(image_codec=jpeg"):
        assert text in report.html


def test_statistics_match_the_values(images_dataset: Path, sample_dataset: Path) -> None:
    stats = {s.name: s for s in unihub.show(images_dataset, rows=0).report.stats}
    scores = np.array([i / 8 for i in range(N) if i % 5], np.float32)
    assert (stats["score"].nulls, stats["score"].counted) == (8, 32)
    assert stats["score"].minimum == pytest.approx(scores.min()) and stats["score"].mean == pytest.approx(scores.mean())
    assert dict(stats["label"].classes.counts) == {0: 10, 1: 10, 2: 10, 3: 10}
    assert dict(stats["boxes"].shapes) == {(0, 4): 14, (1, 4): 13, (2, 4): 13}
    assert (stats["photo"].kind, stats["photo"].nulls) == ("image", 1)  # from the footers: image bytes unread
    histogram = stats["id"].histogram.edges_and_counts()
    assert sum(c for _, _, c in histogram) == N

    rows = [make_row(i) for i in range(50)]
    stats = {s.name: s for s in unihub.show(sample_dataset, rows=0).report.stats}
    assert dict(stats["split"].classes.counts) == {"train": 17, "val": 17, "test": 16}
    assert sum(c for _, _, c in stats["split"].lengths.edges_and_counts()) == 50
    assert stats["ragged"].nulls == sum(r["ragged"] is None for r in rows)
    assert stats["ragged"].shapes == Counter(r["ragged"].shape for r in rows if r["ragged"] is not None)
    assert stats["mat"].maximum == max(r["mat"].max() for r in rows)
    assert stats["price"].kind == "other" and stats["price"].nulls == 0


def test_where_narrows_the_sample_and_the_statistics(images_dataset: Path) -> None:
    report = unihub.show(images_dataset, rows=50, where="label == 2 or score is None")
    expected = [i for i in range(N) if i % 4 == 2 or i % 5 == 0]
    assert report.report.matched == len(expected)
    assert [row.index for row in report.report.sample] == expected
    stats = {s.name: s for s in report.report.stats}
    assert stats["id"].rows == len(expected) and stats["score"].nulls == 8
    assert f"{len(expected)} (filter: label == 2 or score is None)" in report.html
    first = unihub.show(images_dataset, rows=3, first=True, where='[["label", "=", 3]]')
    assert [row.index for row in first.report.sample] == [3, 7, 11]


def test_seed_chooses_the_sample_and_first_takes_the_first_rows(images_dataset: Path) -> None:
    a, b = (unihub.show(images_dataset, rows=5, seed=s).report.sample for s in (3, 3))
    c = unihub.show(images_dataset, rows=5, seed=4).report.sample
    assert [r.index for r in a] == [r.index for r in b] != [r.index for r in c]
    assert [r.index for r in unihub.show(images_dataset, rows=4, first=True).report.sample] == [0, 1, 2, 3]


def test_images_are_decoded_for_the_sampled_rows_only_and_unread_where_footers_count_nulls(
        images_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from unihub.images import decoders as images

    decodes, reads = [], []
    decode, read = images.decode_image, ParquetStore.read_row_group
    monkeypatch.setattr(images, "decode_image", lambda data, *a, **k: decodes.append(1) or decode(data, *a, **k))

    def logged(self: ParquetStore, index: int, columns: Any = None, **kwargs: Any) -> pa.Table:
        reads.append((index, tuple(columns or self.arrow_schema.names)))
        return read(self, index, columns, **kwargs)

    monkeypatch.setattr(ParquetStore, "read_row_group", logged)
    report = unihub.show(images_dataset, rows=3, seed=0)
    assert len(decodes) == sum(1 for row in report.report.sample for t in row.thumbs if t.uri is not None)
    # one pass (unihub's footers hold no image statistics), then the sampled row groups alone
    assert [i for i, _ in reads[:4]] == [0, 1, 2, 3]
    assert sorted(i for i, _ in reads[4:]) == sorted({row.index // 10 for row in report.report.sample})

    reads.clear()
    petastorm = unihub.show(FIXTURES / "unischema", rows=2, seed=0)  # Petastorm's footers count image nulls
    sampled_files = {row.index // 20 for row in petastorm.report.sample}
    assert sorted(i for i, columns in reads if "image_jpeg" in columns) == sorted(sampled_files)
    assert {s.name: s.nulls for s in petastorm.report.stats}["image_jpeg"] == 0


HOSTILE = ['</script><script>document.body.setAttribute("data-pwned","1")</script>',
           '"><img src=x onerror="document.body.setAttribute(\'data-pwned\',\'2\')">',
           "<style>body{display:none}</style>&amp;"]


def hostile_dataset(path: Path) -> Path:
    schema = Unischema('<script>alert("schema")</script>', [
        UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("note", np.str_, (), ScalarCodec(pa.string()), False),
        UnischemaField("image", np.uint8, (24, 32, 3), CompressedImageCodec("png"), False)])
    write_dataset(path, schema, ({"id": i, "note": HOSTILE[i % 3], "image": pil(pixels(i)["rgb"], "PNG")}
                                 for i in range(6)),
                  extra_metadata={"source_format": HOSTILE[0], "source": HOSTILE[1], HOSTILE[2]: [HOSTILE[0]]})
    return path


def test_strings_from_the_data_are_escaped(tmp_path: Path) -> None:
    page = unihub.show(hostile_dataset(tmp_path / "hostile"), rows=6).html
    for text in HOSTILE + ['<script>alert("schema")</script>']:
        assert text not in page
        assert html.escape(text) in page
    assert page.count("<script>") == 1  # the page's own, allowed by its Content-Security-Policy hash
    assert "default-src 'none'" in page


def test_plain_parquet_and_petastorms_own_dataset() -> None:
    petastorm = unihub.show(FIXTURES / "unischema", rows=8)
    assert (petastorm.report.description["rows"], petastorm.report.description["files"]) == (60, 3)
    assert "Petastorm metadata (pickle, allow-listed)" in petastorm.html
    assert sum(len(t) for t in cards(petastorm.html).values()) == 8 * 3  # image_png, image_jpeg, gray
    stats = {s.name: s for s in petastorm.report.stats}
    assert dict(stats["split"].classes.counts) == {"train": 20, "val": 20, "test": 20}
    assert stats["score"].nulls == 12 and stats["temps"].shapes  # (None,) dims: a shape distribution
    plain = unihub.show(FIXTURES / "plain", rows=5, where="label > 2")
    assert plain.report.description["schema_source"] == "inferred" and plain.report.description["rows"] == 600
    assert 0 < plain.report.matched < 600 and '<table class="rows">' in plain.html  # no images: a table of rows


def test_provenance_lists_the_conversions_source_and_skipped_records(tmp_path: Path) -> None:
    src = tmp_path / "folder"
    for i in range(6):
        (src / f"class{i % 2}").mkdir(parents=True, exist_ok=True)
        data = pil(pixels(i)["rgb"], "PNG")
        (src / f"class{i % 2}" / f"{i}.png").write_bytes(data[:-30] if i == 4 else data)
    unihub.convert(str(src), str(tmp_path / "ds"), on_error="skip", progress=False)
    report = unihub.show(tmp_path / "ds", rows=10)
    extra = report.report.provenance
    assert (extra["source_format"], extra["source_files"], extra["skipped_count"]) == ("imagefolder", 6, 1)
    assert extra["skipped"][0]["path"].endswith("4.png") and "truncated" in extra["skipped"][0]["reason"]
    assert "<h3>Skipped records: 1</h3>" in report.html and html.escape(extra["skipped"][0]["reason"]) in report.html
    assert "class0, class1" in report.html  # the classes the folder layout gave
    assert len(cards(report.html)) == 5


def test_a_dataset_on_s3(s3_server: Any, images_dataset: Path) -> None:
    pytest.importorskip("s3fs")
    prefix = f"show-{uuid.uuid4().hex[:8]}"
    url = s3_server.upload_folder(images_dataset, prefix)
    remote = unihub.show(url, rows=4, seed=2, storage_options=s3_server.storage_options())
    local = unihub.show(images_dataset, rows=4, seed=2)
    assert [r.index for r in remote.report.sample] == [r.index for r in local.report.sample]
    assert cards(remote.html) == cards(local.html)
    assert remote.report.description["rows"] == N and f"<h1>{url}</h1>" in remote.html


def test_save_replaces_the_file_and_leaves_nothing_else(images_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "report.html"
    out.parent.mkdir()
    out.write_text("old")
    report = unihub.show(images_dataset, rows=1)
    assert report.save(out) == str(out) and out.read_text(encoding="utf-8") == report.html
    assert report._repr_html_() == report.html
    assert [p.name for p in out.parent.iterdir()] == ["report.html"]


def test_bad_arguments_are_named_errors(images_dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(FilterExpressionError, match="names 'lbl', which is not a field"):
        unihub.show(images_dataset, where="lbl > 1")
    with pytest.raises(InvalidArgumentError, match="rows must be an integer from 0 to 1000, got -1"):
        unihub.show(images_dataset, rows=-1)
    with pytest.raises(DatasetNotFoundError):
        unihub.show(tmp_path / "missing")


def test_show_is_a_lazy_public_function() -> None:
    import importlib
    import subprocess

    code = ("import sys, unihub; assert 'unihub.viewer' not in sys.modules; "
            "assert callable(unihub.show) and unihub.ShowReport.__name__ == 'ShowReport'; print('ok')")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "ok"
    importlib.import_module("unihub.viewer.html")
    assert callable(unihub.show)  # importing the package does not shadow the function


def test_a_corrupt_image_is_shown_as_its_reason_and_the_rest_renders(tmp_path: Path) -> None:
    schema = Unischema("Cut", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                               UnischemaField("image", np.uint8, (24, 32, 3), CompressedImageCodec("png"), False)])
    blobs = [pil(pixels(i)["rgb"], "PNG") for i in range(3)]
    blobs[1] = blobs[1][:-40]  # cut short, as a partial copy would be
    write_dataset(tmp_path / "cut", schema, ({"id": i, "image": blobs[i]} for i in range(3)))
    report = unihub.show(tmp_path / "cut", rows=3, first=True)
    assert [len(t) for _, t in sorted(cards(report.html).items())] == [1, 0, 1]
    problem = report.report.sample[1].thumbs[0].problem
    assert problem and f'<div class="bad">image: {html.escape(problem)}</div>' in report.html


def test_save_never_replaces_a_directory_a_pipe_or_a_link(images_dataset: Path, tmp_path: Path) -> None:
    import os
    import stat

    report = unihub.show(images_dataset, rows=0)
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    with pytest.raises(IsADirectoryError):  # a replace would remove the folder and what it holds
        report.save(folder)
    assert [p.name for p in folder.iterdir()] == ["keep.txt"]

    pipe = tmp_path / "pipe"  # as /dev/stdout or /dev/null: written into, not replaced by a file
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    try:
        page = report.html.encode()
        assert len(page) < 60_000  # within a pipe's buffer: save does not wait for the read
        report.save(pipe)
        assert stat.S_ISFIFO(os.lstat(pipe).st_mode)
        assert os.read(reader, 2 * len(page)) == page
    finally:
        os.close(reader)

    real = tmp_path / "real.html"
    real.write_text("old")
    (tmp_path / "link.html").symlink_to(real)
    report.save(tmp_path / "link.html")  # the file the link names is replaced; the link stays
    assert (tmp_path / "link.html").is_symlink() and real.read_text(encoding="utf-8") == report.html
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "link.html", "pipe", "real.html"]


def test_sampled_values_are_the_stored_ones_whoever_wrote_the_dataset(tmp_path: Path) -> None:
    """Petastorm's read types would show a null as NaN and a nullable integer as a float: the sample shows
    what is stored, as the statistics count it."""
    import pyarrow.parquet as pq

    (tmp_path / "plain").mkdir()
    pq.write_table(pa.table({"i": pa.array([1, None, 2**53 + 1], pa.int64()), "f": pa.array([0.5, None, 1.5])}),
                   tmp_path / "plain" / "part-0.parquet")
    plain = unihub.show(tmp_path / "plain", rows=3, first=True).report
    assert [dict(row.values)["i"] for row in plain.sample] == ["1", "null", "9007199254740993"]
    assert [dict(row.values)["f"] for row in plain.sample] == ["0.5", "null", "1.5"]
    petastorm = unihub.show(FIXTURES / "unischema", rows=60, first=True).report
    scores = [dict(row.values)["score"] for row in petastorm.sample]
    assert scores.count("null") == {s.name: s.nulls for s in petastorm.stats}["score"] == 12 and "nan" not in scores


def test_float32_and_nanosecond_times_are_shown_as_stored(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    (tmp_path / "plain").mkdir()
    pq.write_table(pa.table({"f": pa.array([0.1, 2.5], pa.float32()),
                             "t": pa.array([1577836800123456789, 0], pa.timestamp("ns"))}),
                   tmp_path / "plain" / "part-0.parquet")
    rows = [dict(row.values) for row in unihub.show(tmp_path / "plain", rows=2, first=True).report.sample]
    assert rows == [{"f": "0.1", "t": "2020-01-01T00:00:00.123456789"}, {"f": "2.5", "t": "1970-01-01T00:00:00.000000000"}]


def test_long_values_are_cut_in_the_class_counts_and_the_provenance(tmp_path: Path) -> None:
    schema = Unischema("Long", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                UnischemaField("text", np.str_, (), ScalarCodec(pa.string()), False)])
    values = ["a" * 1_000_000, "b" * 1_000_000]  # two classes of a megabyte each
    write_dataset(tmp_path / "long", schema, ({"id": i, "text": values[i % 2]} for i in range(4)),
                  extra_metadata={"note": "n" * 1_000_000, "files": ["f" * 1_000_000] * 2})
    report = unihub.show(tmp_path / "long", rows=2)
    assert dict({s.name: s for s in report.report.stats}["text"].classes.counts) == {values[0]: 2, values[1]: 2}
    assert len(report.html) < 50_000  # not the megabytes of the values
    assert "a" * 119 + "…" in report.html and "n" * 1999 + "…" in report.html and "f" * 1999 + "…" in report.html
