"""Every kind of loader cached and read back bit-exactly, with its values, names and shapes."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest

from unihub import SchemaError, cacheable, make_reader, open_dataset
from unihub.caching import list_caches
from unihub.schema.codecs import CompressedImageCodec


def _jpeg(seed: int) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")
    return out.getvalue()


def _rows(url: str) -> dict[int, dict]:
    with make_reader(url, shuffle_row_groups=False, workers_count=1) as reader:
        return {i: row._asdict() for i, row in enumerate(reader)}


def _left(root: Path) -> list[str]:
    return sorted(os.listdir(root)) if root.exists() else []


def test_tf_data_nested_dicts_ragged_and_strings_round_trip(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    jpegs = [_jpeg(i) for i in range(6)]
    boxes = tf.ragged.constant([[1.5] * (i % 3) for i in range(6)], dtype=tf.float32)
    ds = tf.data.Dataset.from_tensor_slices({"image": {"encoded": jpegs, "label": np.arange(6, dtype=np.int64)},
                                             "boxes": boxes,
                                             "pixels": np.arange(6 * 4, dtype=np.float32).reshape(6, 2, 2)})

    cached = cacheable(tmp_path, dataset_id="tf", version="1")(lambda: ds)()
    schema = open_dataset(cached.url).schema
    assert set(schema.fields) == {"image_encoded", "image_label", "boxes", "pixels"}
    assert schema.boxes.shape == (None,) and schema.pixels.shape == (2, 2) and schema.image_encoded.numpy_dtype is np.bytes_
    rows = _rows(cached.url)
    assert len(cached) == 6 and cached.info.source_type == "tf.data"
    for i in range(6):
        assert rows[i]["image_encoded"] == jpegs[i]  # encoded bytes stay encoded, bit for bit
        assert rows[i]["image_label"] == i
        assert rows[i]["boxes"].tolist() == [1.5] * (i % 3)
        np.testing.assert_array_equal(rows[i]["pixels"], np.arange(i * 4, i * 4 + 4, dtype=np.float32).reshape(2, 2))


def test_tf_data_tuples_named_by_position_or_names(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    ds = tf.data.Dataset.from_tensor_slices((np.arange(4, dtype=np.int32), np.array([b"a", b"b", b"c", b"d"])))
    by_position = cacheable(tmp_path, dataset_id="pos", version="1")(lambda: ds)()
    assert list(open_dataset(by_position.url).schema.fields) == ["field_0", "field_1"]
    named = cacheable(tmp_path, dataset_id="named", version="1", names=["x", "label"])(lambda: ds)()
    rows = _rows(named.url)
    assert [rows[i]["x"] for i in range(4)] == [0, 1, 2, 3] and rows[3]["label"] == b"d"


def test_torch_map_style_dataset_with_tensors_numpy_and_pil_images_as_png(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from PIL import Image

    images = [np.random.default_rng(i).integers(0, 255, (5, 7, 3), dtype=np.uint8) for i in range(10)]

    class Pairs(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 10

        def __getitem__(self, i: int):
            return Image.fromarray(images[i]), torch.tensor([i, -i], dtype=torch.int16), np.float64(i) / 3

    cached = cacheable(tmp_path, dataset_id="torch", version="1", names=["image", "pair", "score"],
                       image_format="png")(Pairs)()
    schema = open_dataset(cached.url).schema
    assert isinstance(schema.image.codec, CompressedImageCodec) and schema.pair.numpy_dtype == np.int16
    rows = _rows(cached.url)
    assert cached.info.source_type == "torch Dataset"
    for i in range(10):
        np.testing.assert_array_equal(rows[i]["image"], images[i])  # PNG: lossless
        assert rows[i]["pair"].tolist() == [i, -i] and rows[i]["score"] == np.float64(i) / 3


def test_torch_iterable_dataset(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            for i in range(7):
                yield {"id": torch.tensor(i), "text": f"row {i}"}

    cached = cacheable(tmp_path, dataset_id="it", version="1")(Stream)()
    rows = _rows(cached.url)
    assert cached.info.source_type == "torch IterableDataset"
    assert [(rows[i]["id"], rows[i]["text"]) for i in range(7)] == [(i, f"row {i}") for i in range(7)]


def test_torch_list_elements_are_parts_and_bfloat16_is_a_named_error(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")

    class Listed(torch.utils.data.Dataset):
        def __init__(self, dtype=torch.float32) -> None:
            self.dtype = dtype

        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int):  # a list, as default_collate reads it: [image, label]
            return [torch.full((3,), float(i), dtype=self.dtype), torch.full((3,), float(-i), dtype=self.dtype)]

    cached = cacheable(tmp_path, dataset_id="list", version="1", names=["image", "label"])(Listed)()
    rows = _rows(cached.url)
    assert list(open_dataset(cached.url).schema.fields) == ["image", "label"]
    assert [(rows[i]["image"].tolist(), rows[i]["label"].tolist()) for i in range(4)] == \
        [([i] * 3, [-i] * 3) for i in range(4)]
    with pytest.raises(SchemaError, match="bfloat16 has no numpy dtype"):
        cacheable(tmp_path, dataset_id="bf16", version="1")(lambda: Listed(torch.bfloat16))()
    assert _left(tmp_path / "bf16") == []


def test_keras_pydataset_batches_become_rows_x_y(tmp_path: Path) -> None:
    keras = pytest.importorskip("keras")

    class Batches(keras.utils.PyDataset):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int):
            x = np.arange(i * 8, i * 8 + 8, dtype=np.float32).reshape(4, 2)
            return x, np.arange(i * 4, i * 4 + 4)

    cached = cacheable(tmp_path, dataset_id="keras", version="1")(Batches)()
    rows = _rows(cached.url)
    assert len(cached) == 12 and cached.info.source_type == "keras PyDataset"
    assert [int(rows[i]["y"]) for i in range(12)] == list(range(12))
    np.testing.assert_array_equal(rows[5]["x"], [10.0, 11.0])


def test_keras_batches_are_read_as_keras_reads_them(tmp_path: Path) -> None:
    """A list batch is (x, y), a list in it a multi-input model's inputs, an array alone x; Keras 3's
    ``num_batches`` counts the batches."""
    keras = pytest.importorskip("keras")

    class MultiInput(keras.utils.PyDataset):
        @property
        def num_batches(self) -> int:
            return 2

        def __getitem__(self, i: int):  # two inputs of two rows each: as many inputs as rows
            a = np.arange(i * 4, i * 4 + 4, dtype=np.float32).reshape(2, 2)
            return [[a, -a], np.arange(i * 2, i * 2 + 2)]

    class XOnly(keras.utils.PyDataset):
        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int):
            return np.full((3, 2), i, np.float32)

    rows = _rows(cacheable(tmp_path, dataset_id="multi", version="1")(MultiInput)().url)
    assert len(rows) == 4
    for i in range(4):
        assert rows[i]["x_0"].tolist() == [2 * i, 2 * i + 1] and rows[i]["x_1"].tolist() == [-2 * i, -2 * i - 1]
        assert rows[i]["y"] == i
    rows = _rows(cacheable(tmp_path, dataset_id="x", version="1")(XOnly)().url)
    assert [rows[i]["x"].tolist() for i in range(6)] == [[i // 3] * 2 for i in range(6)]


def test_iterable_of_dicts_varying_dimensions_become_none(tmp_path: Path) -> None:
    cached = cacheable(tmp_path, dataset_id="dicts", version="1")(
        lambda: ({"id": i, "points": np.full((i % 4 + 1, 3), i, np.float32), "raw": bytes([i])} for i in range(50)))()
    schema = open_dataset(cached.url).schema
    assert schema.points.shape == (None, 3)
    rows = _rows(cached.url)
    assert all(rows[i]["points"].shape == (i % 4 + 1, 3) and rows[i]["raw"] == bytes([i]) for i in range(50))


@pytest.mark.parametrize("loader, message", [
    (lambda: 42, "cannot cache a int"),
    (lambda: iter(()), "yielded no rows"),
    (lambda: ({"a": object()} for _ in range(3)), "Python objects"),
    (lambda: ((1, 2) for _ in range(3)), "names= gives 1 names"),
    (lambda: ({"z": np.complex64(1j)} for _ in range(3)), "'z' holds complex64 scalars, which no Arrow type"),
    (lambda: __import__("pandas").DataFrame({"a": [1, 2, 3], "b": [4, 5, 6]}), "pandas DataFrame directly"),
])
def test_loaders_that_cannot_be_cached_are_named_errors_and_leave_nothing(tmp_path: Path, loader, message) -> None:
    names = ["only"] if "names=" in message else None
    with pytest.raises(SchemaError, match=message):
        cacheable(tmp_path / "root", dataset_id="bad", version="1", names=names)(loader)()
    assert _left(tmp_path / "root" / "bad") == []


def test_tf_data_decoded_images_stored_as_png_when_asked(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    images = np.random.default_rng(0).integers(0, 255, (300, 6, 5, 3), dtype=np.uint8)
    ds = tf.data.Dataset.from_tensor_slices({"image": images, "label": np.arange(300)})
    cached = cacheable(tmp_path, dataset_id="png", version="1", image_format={"image": "png"})(lambda: ds)()
    schema = open_dataset(cached.url).schema
    assert isinstance(schema.image.codec, CompressedImageCodec) and schema.image.codec.image_codec == "png"
    rows = _rows(cached.url)
    assert len(rows) == 300
    for i in (0, 149, 299):
        np.testing.assert_array_equal(rows[i]["image"], images[i])
        assert rows[i]["label"] == i


@pytest.mark.parametrize("spec", ["fixed", "ragged", "complex", "bfloat16", "inner ragged", "endless"])
def test_tf_data_that_cannot_be_cached_is_a_named_error_and_publishes_nothing(tmp_path: Path, spec: str) -> None:
    """An empty pipeline (fixed shapes go through tf's batches, ragged ones row by row), scalars Arrow has
    no type for, ragged elements that are not rectangular, an endless pipeline (the build would never end):
    a SchemaError, no cache, nothing left."""
    tf = pytest.importorskip("tensorflow")
    ds, message = {
        "fixed": (tf.data.Dataset.from_tensor_slices(np.zeros((0, 3), np.float32)), "yielded no rows"),
        "ragged": (tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[1.0]])).take(0), "yielded no rows"),
        "complex": (tf.data.Dataset.from_tensor_slices(np.ones(3, np.complex64)), "complex64 scalars"),
        "bfloat16": (tf.data.Dataset.from_tensor_slices(tf.ones(3, tf.bfloat16)), "bfloat16 scalars"),
        "inner ragged": (tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[[1, 2]], [[3, 4], [5]]])),
                         "inner rows of different lengths"),
        # says it is endless (as repeat() does) but ends, so that the old code fails rather than never ends
        "endless": (tf.data.Dataset.range(3).apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY)),
                    "endless"),
    }[spec]
    with pytest.raises(SchemaError, match=message):
        cacheable(tmp_path, dataset_id="bad", version="1")(lambda: ds)()
    assert _left(tmp_path / "bad") == [] and list_caches(tmp_path) == []


def test_tf_data_ragged_elements_that_are_rectangular_round_trip(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    ds = tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[[1, 2], [3, 4]], [[5, 6]], []], dtype=tf.int32))
    rows = _rows(cacheable(tmp_path, dataset_id="rect", version="1")(lambda: ds)().url)
    assert [rows[i]["field_0"].tolist() for i in range(3)] == [[[1, 2], [3, 4]], [[5, 6]], []]


@pytest.mark.parametrize("kind", ["iterable", "tf.data"])
def test_image_format_naming_no_field_is_refused(tmp_path: Path, kind: str) -> None:
    """A typo in ``image_format={field: ...}`` would store the images raw, silently: refused before writing."""
    images = np.zeros((3, 4, 5, 3), np.uint8)
    if kind == "tf.data":
        tf = pytest.importorskip("tensorflow")
        loader = lambda: tf.data.Dataset.from_tensor_slices({"image": images})  # noqa: E731
    else:
        loader = lambda: ({"image": image} for image in images)  # noqa: E731
    with pytest.raises(SchemaError, match=r"image_format names \['imag'\], which are not fields.*\['image'\]"):
        cacheable(tmp_path, dataset_id="typo", version="1", image_format={"imag": "png"})(loader)()
    assert _left(tmp_path / "typo") == []


def test_tf_data_string_fields_are_converted_a_bounded_number_of_bytes_at_a_time(tmp_path: Path) -> None:
    """A string's size is not in the spec: 100 KB values were batched 1,024 rows (100 MB) at a time, a 1 MB one
    1 GB (3.6 GB peak for a cache of 1.2 GB). tf batches them a few rows at a time, joined up to BATCH_BYTES
    as measured: small strings still go to the writer in big batches, in order, every value as it was."""
    tf = pytest.importorskip("tensorflow")
    from unihub.caching.sources import BATCH_BYTES, adapt

    blob = tf.constant(b"x" * 100_000)
    big = tf.data.Dataset.range(200).map(lambda i: {"id": i, "raw": tf.strings.join([tf.strings.as_string(i), blob])})
    batches = list(adapt(big).batches)
    assert max(sum(map(len, b["raw"])) for b in batches) <= 2 * BATCH_BYTES
    assert np.concatenate([b["id"] for b in batches]).tolist() == list(range(200))
    small = tf.data.Dataset.range(3000).map(lambda i: {"id": i, "label": tf.strings.as_string(i)})
    batches = list(adapt(small).batches)
    assert len(batches) <= 3 and [v for b in batches for v in b["label"]] == [str(i).encode() for i in range(3000)]
    rows = _rows(cacheable(tmp_path, dataset_id="big", version="1")(lambda: big)().url)
    assert [rows[i]["raw"] for i in (0, 199)] == [b"0" + b"x" * 100_000, b"199" + b"x" * 100_000]
