"""The image checks of ingest: one value at a time, a column at a time (the same verdicts), batches."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from unihub import CompressedImageCodec, UnischemaField
from unihub.errors import InvalidArgumentError
from unihub.images import decoders as images
from unihub.schema.image_checks import bad_images, batch_problems, check_mode, drop_rows, has_end, image_problem

from ..images.image_bombs import corrupt_scan, image, jpeg_bomb, pil_jpeg, pil_png, png_bomb, truncated

FIELD = UnischemaField("image", np.uint8, (16, 16, 3), CompressedImageCodec("jpeg"), False)
ANY = FIELD._replace(shape=(None, None, 3))


def _problems(values: list[bytes], field: UnischemaField, mode: str, fit: bool = True) -> list[str | None]:
    return [image_problem(v, field, mode, fit=fit) for v in values]  # type: ignore[arg-type]


def test_each_problem_is_named() -> None:
    jpeg = pil_jpeg(image())
    cases = {
        b"GIF89a not an image": "not a PNG or JPEG image (19 bytes starting b'GIF89a n')",
        jpeg[:20]: "corrupt or unsupported JPEG header (20 bytes)",
        jpeg_bomb(): "JPEG header claims 65000x65000 pixels",
        pil_jpeg(image(8, 8)): "JPEG image of shape (8, 8, 3) uint8 does not fit field 'image' ((16, 16, 3) uint8)",
        pil_png(np.zeros((16, 16, 3), np.uint16)[..., 0]): "does not fit field 'image'",
        truncated(jpeg): "truncated JPEG",
        truncated(pil_png(image())): "truncated PNG",
    }
    for value, reason in cases.items():
        problem = image_problem(value, FIELD, "header")
        assert problem is not None and reason in problem, (reason, problem)
    assert image_problem(jpeg, FIELD, "header") is None
    assert image_problem(corrupt_scan(jpeg), FIELD, "header") is None  # header and EOI are fine ...
    problem = image_problem(corrupt_scan(jpeg), FIELD, "full")  # ... the decode is not
    assert problem is not None and "Corrupt JPEG data" in problem
    assert all(image_problem(v, FIELD, "none") is None for v in cases)


def test_without_fit_only_the_shape_goes_unchecked() -> None:
    assert image_problem(pil_jpeg(image(8, 8)), FIELD, "header", fit=False) is None
    assert "65000x65000" in (image_problem(jpeg_bomb(), FIELD, "header", fit=False) or "")
    assert "truncated" in (image_problem(truncated(pil_jpeg(image())), FIELD, "header", fit=False) or "")


def test_the_end_marker_may_be_followed_by_bytes_but_must_follow_the_scan() -> None:
    jpeg, png = pil_jpeg(image()), pil_png(image())
    assert has_end(jpeg + b"trailing") and has_end(png + b"trailing") and has_end(memoryview(jpeg))
    assert not has_end(jpeg[:-2]) and not has_end(png[:-12]) and not has_end(memoryview(jpeg[:-2]))
    # an EOI before the first scan (an EXIF thumbnail's) does not end the image
    thumbnail = b"\xff\xe1\x00\x08Exif\xff\xd9"
    cut = jpeg[:2] + thumbnail + jpeg[2:len(jpeg) // 2]
    assert not has_end(cut) and has_end(jpeg[:2] + thumbnail + jpeg[2:])


@pytest.mark.parametrize("mode", ["header", "full"])
def test_a_column_at_a_time_gives_the_verdicts_of_one_at_a_time(mode: str) -> None:
    good = [pil_jpeg(image(seed=i)) for i in range(40)]
    values = list(good)
    values[3] = truncated(values[3])
    values[9] = jpeg_bomb()
    values[10] = pil_jpeg(image(8, 8))
    values[17] = corrupt_scan(values[17])
    values[20] = values[20] + b"trailing bytes"
    values[25] = pil_png(image())
    values[26] = b"\xff\xd8\xff garbage"
    values[33] = b""
    buffer = np.frombuffer(b"".join(values), np.uint8)
    ends = np.cumsum([len(v) for v in values])
    starts = ends - [len(v) for v in values]
    for field in (FIELD, ANY):
        expected = [p is not None for p in _problems(values, field, mode)]
        assert bad_images(buffer, starts, ends, field, mode).tolist() == expected  # type: ignore[arg-type]
    assert np.flatnonzero(expected).tolist() == ([3, 9, 17, 26, 33] if mode == "full" else [3, 9, 26, 33])
    assert not bad_images(buffer, starts, ends, FIELD, "none").any()


def test_a_column_of_equal_headers_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    values = [pil_jpeg(image(seed=i)) for i in range(64)]
    buffer = np.frombuffer(b"".join(values), np.uint8)
    ends = np.cumsum([len(v) for v in values])
    calls = []
    real = images.image_size
    monkeypatch.setattr(images, "image_size", lambda data: calls.append(1) or real(data))
    assert not bad_images(buffer, ends - [len(v) for v in values], ends, FIELD, "header").any()
    assert len(calls) == 1


def test_batches_of_any_columns_lose_only_their_bad_rows() -> None:
    jpeg = pil_jpeg(image())
    batch = {"image": np.array([jpeg, None, truncated(jpeg), jpeg], dtype=object),
             "id": np.arange(4), "name": ["a", "b", "c", "d"], "arrow": pa.array([1, 2, 3, 4])}
    nullable = FIELD._replace(nullable=True)
    assert [(r, n) for r, n, _ in batch_problems(batch, [nullable], "header")] == [(2, "image")]
    kept = drop_rows(batch, [2])
    assert kept["id"].tolist() == [0, 1, 3] and kept["name"] == ["a", "b", "d"]
    assert kept["arrow"].to_pylist() == [1, 2, 4] and len(kept["image"]) == 3
    assert batch_problems({"image": pa.array([jpeg, truncated(jpeg)])}, [FIELD], "header")[0][0] == 1


def test_modes_are_checked() -> None:
    assert [check_mode(m) for m in ("header", "full", "none")] == ["header", "full", "none"]
    with pytest.raises(InvalidArgumentError, match="validate_images must be one of header, full, none, got 'fast'"):
        check_mode("fast")


def test_png_bombs_are_refused_in_columns_too() -> None:
    values = [pil_png(image(seed=i)) for i in range(10)] + [png_bomb()]
    buffer = np.frombuffer(b"".join(values), np.uint8)
    ends = np.cumsum([len(v) for v in values])
    field = FIELD._replace(shape=(None, None, 3), codec=CompressedImageCodec("png"))
    assert np.flatnonzero(bad_images(buffer, ends - [len(v) for v in values], ends, field, "header")).tolist() == [10]
