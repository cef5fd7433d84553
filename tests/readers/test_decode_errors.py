"""Images that pass every ingest check but fail to decode (issue 37): a JPEG written by Pillow whose
entropy-coded data is overwritten keeps its header, its end marker and Pillow's ``verify()``, so
``--validate-images header`` (the default, chosen by benchmarks/validate_images.py) stores it. A read
names its file, row group, row and field; ``on_decode_error='skip'`` drops the row, counts it in the
diagnostics, warns once and finishes the epoch, in the readers and the PyTorch loaders alike."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from unihub import convert, make_batch_reader, make_reader
from unihub.errors import ImageDecodeError, InvalidArgumentError
from unihub.images.decoders import decode_image
from unihub.schema.codecs import CompressedImageCodec
from unihub.schema.image_checks import image_problem
from unihub.schema.unischema import UnischemaField
from unihub.store.dataset import open_dataset

PIL = pytest.importorskip("PIL.Image")

CLASSES, PER_CLASS = 3, 12
CORRUPT = ("class1/03.jpg", "class2/10.jpg")


def photo_like(seed: int) -> np.ndarray:
    """A smooth gradient with noise: entropy-coded data of some length, as a photograph's."""
    y, x = np.mgrid[0:48, 0:40]
    base = np.stack([(x * 5) % 256, (y * 4) % 256, ((x + y) * 3) % 256], -1)
    return (base + np.random.default_rng(seed).integers(0, 40, base.shape)).astype(np.uint8)


def pillow_jpeg(seed: int) -> bytes:
    buffer = io.BytesIO()
    PIL.fromarray(photo_like(seed)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def corrupt_scan(jpeg: bytes) -> bytes:
    """``jpeg`` with 40 bytes a third into its entropy-coded segment overwritten (no marker among them)."""
    sos = jpeg.find(b"\xff\xda")
    start = sos + 2 + ((jpeg[sos + 2] << 8) | jpeg[sos + 3])
    data = bytearray(jpeg)
    at = start + (len(jpeg) - start) // 3
    data[at:at + 40] = bytes(range(7, 247, 6))
    return bytes(data)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corrupt") / "photos"
    for c in range(CLASSES):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(PER_CLASS):
            data = pillow_jpeg(100 * c + i)
            if f"class{c}/{i:02d}.jpg" in CORRUPT:
                data = corrupt_scan(data)
            (root / f"class{c}" / f"{i:02d}.jpg").write_bytes(data)
    return root


@pytest.fixture(scope="module")
def dataset(folder: Path) -> Path:
    """The folder converted with the default checks (header), in row groups of a few rows."""
    out = folder.parent / "ds"
    convert(str(folder), str(out), row_group_size_mb=0.02, progress=False)
    assert len(open_dataset(out).row_groups) >= 3
    return out


def good_paths() -> list[str]:
    return sorted(f"class{c}/{i:02d}.jpg" for c in range(CLASSES) for i in range(PER_CLASS)
                  if f"class{c}/{i:02d}.jpg" not in CORRUPT)


def test_the_corrupt_jpeg_passes_every_check_but_a_decode(folder: Path, tmp_path: Path) -> None:
    data = (folder / CORRUPT[0]).read_bytes()
    PIL.open(io.BytesIO(data)).verify()  # Pillow's own check passes
    field = UnischemaField("image", np.uint8, (48, 40, 3), CompressedImageCodec("jpeg"), False)
    assert image_problem(data, field, "header") is None
    with pytest.raises(ImageDecodeError, match="Corrupt JPEG data"):
        decode_image(data)
    refused = subprocess.run([sys.executable, "-m", "unihub.cli", "convert", str(folder), str(tmp_path / "out"),
                              "--validate-images", "full"], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert f"unihub: error: {folder}/{CORRUPT[0]}: corrupt or truncated JPEG" in refused.stderr
    assert not (tmp_path / "out").exists()


def test_a_read_names_file_row_group_row_and_field(dataset: Path) -> None:
    store = open_dataset(dataset)
    paths = [p for g in range(len(store.row_groups)) for p in store.read_row_group(g, ["path"]).column(0).to_pylist()]
    at = paths.index(CORRUPT[0])
    group = next(g for g in store.row_groups if g.first_row <= at < g.first_row + g.num_rows)
    with make_reader(dataset, shuffle_row_groups=False) as reader, \
            pytest.raises(ImageDecodeError) as caught:
        for _ in reader:
            pass
    message = str(caught.value)
    assert message.startswith(f"{group.path}, row group {group.row_group} (row {at} of the dataset): "
                              f"field 'image', row {at - group.first_row}: corrupt or mismatched JPEG image")
    assert (caught.value.field, caught.value.row) == ("image", at - group.first_row)


@pytest.mark.parametrize("pool", ["thread", "process", "dummy"])
def test_skip_drops_the_rows_counts_them_and_warns_once(dataset: Path, pool: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with make_reader(dataset, on_decode_error="skip", reader_pool_type=pool, workers_count=2,
                         num_epochs=2, seed=3) as reader:
            rows = [(row.path, row.image) for row in reader]
            diagnostics = reader.diagnostics
    assert sorted(p for p, _ in rows) == sorted(good_paths() * 2)
    for path, image in rows[:5]:
        assert np.array_equal(image, decode_image((dataset.parent / "photos" / path).read_bytes()))
    assert diagnostics["decode_errors_skipped"] == 4  # two rows, two epochs
    assert all(re.search(r"row group \d+ \(row \d+ of the dataset\): field 'image', row \d+: corrupt", m)
               for m in diagnostics["decode_errors"])
    skips = [w for w in caught if "on_decode_error='skip'" in str(w.message)]
    assert len(skips) == 1


def test_batch_reader_skips_too(dataset: Path) -> None:
    with pytest.warns(UserWarning, match="dropped a row whose image does not decode"), \
            make_batch_reader(dataset, on_decode_error="skip", shuffle_row_groups=False) as reader:
        paths = [p for batch in reader for p in batch.path]
        assert reader.diagnostics["decode_errors_skipped"] == 2
    assert paths == good_paths()


def test_on_decode_error_takes_raise_or_skip(dataset: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="on_decode_error must be one of 'raise', 'skip', got 'ignore'"):
        make_reader(dataset, on_decode_error="ignore")


torch = pytest.importorskip("torch")
from unihub.bridges.torch import BatchedDataLoader, DataLoader  # noqa: E402


@pytest.mark.parametrize("shuffle", [0, 10])
def test_torch_loaders_finish_the_epoch(dataset: Path, shuffle: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shuffled, the images are decoded after the draw (readers/late_decode.py): the drawn batch is a
    row short; in order, the reader drops the row and batches stay whole."""
    from unihub.readers import late_decode
    from unihub.readers import loader as row_loader

    looked_for: list[str] = []
    for module in (late_decode, row_loader):
        def spy(*args, _module=module, _real=module.undecodable_rows):
            looked_for.append(_module.__name__)
            return _real(*args)
        monkeypatch.setattr(module, "undecodable_rows", spy)
    with pytest.warns(UserWarning, match="on_decode_error='skip'"):
        loader = DataLoader(make_reader(dataset, on_decode_error="skip", seed=1), batch_size=4,
                            shuffling_queue_capacity=shuffle, seed=2)
        with loader:
            batches = list(loader)
    paths = [p for batch in batches for p in batch["path"]]
    assert sorted(paths) == good_paths()
    assert loader.diagnostics["decode_errors_skipped"] == 2
    assert all(tuple(b["image"].shape[1:]) == (48, 40, 3) for b in batches)
    if not shuffle:
        assert [len(b["path"]) for b in batches] == [4] * 8 + [2]
    assert set(looked_for) == {"unihub.readers.late_decode" if shuffle else "unihub.readers.loader"}
    with pytest.warns(UserWarning, match="on_decode_error='skip'"):
        batched = BatchedDataLoader(make_batch_reader(dataset, on_decode_error="skip", seed=1), batch_size=5,
                                    shuffling_queue_capacity=shuffle, seed=2)
        with batched:
            paths = [p for batch in batched for p in batch["path"]]
    assert sorted(paths) == good_paths()


def test_a_loader_resumes_past_skipped_rows(dataset: Path) -> None:
    """A state saved after a skip resumes with exactly the rows not yet delivered."""
    with pytest.warns(UserWarning):
        first = DataLoader(make_reader(dataset, on_decode_error="skip", seed=5), batch_size=3,
                           shuffling_queue_capacity=6, seed=7)
        delivered, state = [], None
        with first:
            for k, batch in enumerate(first):
                delivered += list(batch["path"])
                if k == 5:
                    state = first.state_dict()
                    break
        second = DataLoader(make_reader(dataset, on_decode_error="skip", seed=5), batch_size=3,
                            shuffling_queue_capacity=6, seed=7)
        second.load_state_dict(state)
        with second:
            rest = [p for batch in second for p in batch["path"]]
    assert sorted(delivered + rest) == good_paths()
