"""The TensorFlow bridges on converted data, checked against the sources' own libraries.

TFRecord files written by ``tf.io.TFRecordWriter`` whose records lack some features (each such
feature converts to a nullable field), and image folders written by PIL mixing gray ("L") and RGB
PNGs and JPEGs (a rank-3 image field, some of whose rows are gray), are converted with
``unihub.convert`` and read back through ``make_tf_dataset`` and ``make_petastorm_dataset`` over
row and batch readers. Every value is compared bit for bit with TensorFlow's parse of each record
(``tf.train.Example``) and with PIL's pixels; a null is its fill value beside a False
``<field>_is_present``. Errors met while reading cross the bridge as unihub's own.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

tf = pytest.importorskip("tensorflow")
Image = pytest.importorskip("PIL.Image")

from unihub import (  # noqa: E402
    CompressedImageCodec,
    ScalarCodec,
    SchemaError,
    Unischema,
    UnischemaField,
    ValidationError,
    convert,
    write_dataset,
)
from unihub.bridges.tf import dataset as tf_bridge  # noqa: E402
from unihub.bridges.tf import encode as tf_encode  # noqa: E402
from unihub.bridges.tf import plans as tf_plans  # noqa: E402
from unihub.bridges.tf.dataset import PRESENT_SUFFIX, make_petastorm_dataset, make_tf_dataset  # noqa: E402
from unihub.errors import ImageDecodeError  # noqa: E402
from unihub.formats.tfrecord.schema import ORDER_FIELD  # noqa: E402
from unihub.readers.reader import make_batch_reader, make_reader  # noqa: E402

from .test_graph import run_all  # noqa: E402
from .tf_expected import structure  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

RECORDS = 40


def example(i: int) -> Any:
    """Record ``i``: ``id`` always; every other feature left out of some records, ``vec`` also
    given empty in some (an empty list, not a missing one)."""
    feature = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}
    if i % 3:
        feature["score"] = tf.train.Feature(float_list=tf.train.FloatList(value=[np.float32(i) / np.float32(7)]))
    if i % 4 != 1:
        feature["count"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[i * 1_000_003 - 2**40]))
    if i % 5 != 2:
        feature["name"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"név-{i}".encode()]))
    if i % 6 != 3:
        feature["blob"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes([255, i, 0])]))
    if i % 2:
        values = [] if i % 7 == 1 else [np.float32(-i) / np.float32(3)] * (i % 4 + 1)
        feature["vec"] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
    if i % 5 != 4:
        feature["triple"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[i, -i, 2**62 + i]))
    return tf.train.Example(features=tf.train.Features(feature=feature))


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[int, Any]]:
    """The converted dataset's URL, and each record as TensorFlow parses the file TFRecordWriter wrote."""
    root = tmp_path_factory.mktemp("tf_converted")
    source = root / "records"
    source.mkdir()
    with tf.io.TFRecordWriter(str(source / "part-0.tfrecord")) as writer:
        for i in range(RECORDS):
            writer.write(example(i).SerializeToString())
    parsed = [tf.train.Example.FromString(raw.numpy()) for raw in tf.data.TFRecordDataset(str(source / "part-0.tfrecord"))]
    by_id = {int(e.features.feature["id"].int64_list.value[0]): e for e in parsed}
    assert sorted(by_id) == list(range(RECORDS))
    convert(source, root / "converted", row_group_size_mb=0.0005)
    return (root / "converted").as_uri(), by_id


NULLABLE = ["blob", "count", "name", "score", "triple", "vec"]


def tf_values(feature: Any) -> np.ndarray:
    """A feature's values as TensorFlow parsed them, in the dtype the field holds them."""
    kind = feature.WhichOneof("kind")
    if kind == "float_list":
        return np.asarray(feature.float_list.value, np.float32)
    if kind == "int64_list":
        return np.asarray(feature.int64_list.value, np.int64)
    return np.asarray(feature.bytes_list.value, dtype=object)


def assert_record(row: dict[str, Any], parsed: dict[int, Any], names: list[str] = NULLABLE) -> None:
    """One row (numpy values by name) equals its record: the values bit for bit where the record has
    the feature, the fill value (NaN, 0, b"", no values) and a False mask where it lacks it."""
    record = parsed[int(row["id"])].features.feature
    for name in names:
        got, present = row[name], bool(row[name + PRESENT_SUFFIX])  # bytes stay bytes (numpy's cut trailing NULs)
        assert present == (name in record), (name, int(row["id"]))
        if name in ("name", "blob"):
            assert type(got) is bytes and got == (record[name].bytes_list.value[0] if present else b""), name
            continue
        want = tf_values(record[name]) if present else {
            "score": np.full(1, np.nan, np.float32), "count": np.zeros(1, np.int64),
            "vec": np.zeros(0, np.float32), "triple": np.zeros(3, np.int64)}[name]
        if name in ("score", "count"):
            assert np.shape(got) == () and len(want) == 1, name
            want = want[0]
        assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes(), name


def rows_of(batch: Any) -> list[dict[str, np.ndarray]]:
    """A batch (dict or namedtuple of tensors, ragged ones too) as rows of numpy values."""
    columns = batch if isinstance(batch, dict) else batch._asdict()
    rows = []
    for j in range(int(next(iter(columns.values())).shape[0])):
        row = {}
        for name, column in columns.items():
            value = column[j]
            row[name] = (value.to_tensor() if isinstance(value, tf.RaggedTensor) else value).numpy()
        rows.append(row)
    return rows


def numpy_row(row: Any) -> dict[str, np.ndarray]:
    return {name: value.numpy() for name, value in (row if isinstance(row, dict) else row._asdict()).items()}


def test_make_tf_dataset_fills_nulls_and_masks_them(records: tuple[str, dict[int, Any]]) -> None:
    """Batches of a URL (the ragged ``vec`` re-batched in numpy), plain and shuffled; without ``vec``
    the batches are cut inside TensorFlow. Each field's mask follows the fields, as tf.bool."""
    url, parsed = records
    with make_batch_reader(url) as reader:  # what the conversion made of the features some records lack
        assert sorted(f.name for f in reader.schema if f.nullable) == NULLABLE
        assert [reader.schema.fields[n].shape for n in ("vec", "triple", "score")] == [(None,), (3,), ()]
    for shuffle in (0, 9):
        dataset = make_tf_dataset(url, 6, shuffle_buffer=shuffle, seed=2, workers_count=2)
        spec = dataset.element_spec
        fields = ["blob", "count", "id", "name", "score", "triple", "vec"]
        fields += [n for n in spec if n == ORDER_FIELD]  # where TF wrote the records' maps in other orders
        assert list(spec) == fields + [n + PRESENT_SUFFIX for n in NULLABLE]
        assert all(spec[n + PRESENT_SUFFIX].dtype == tf.bool and tuple(spec[n + PRESENT_SUFFIX].shape) == (None,)
                   for n in NULLABLE)
        assert isinstance(spec["vec"], tf.RaggedTensorSpec) and tuple(spec["triple"].shape) == (None, 3)
        batches = list(dataset)
        assert [len(b["id"]) for b in batches] == [6] * 6 + [4]
        rows = [r for b in batches for r in rows_of(b)]
        assert sorted(int(r["id"]) for r in rows) == list(range(RECORDS))
        for row in rows:
            assert_record(row, parsed)
    dense = make_tf_dataset(url, 16, workers_count=1, schema_fields=["id", "score", "triple", "name"])
    rows = [r for b in dense for r in rows_of(b)]
    assert sorted(int(r["id"]) for r in rows) == list(range(RECORDS))
    for row in rows:
        record = parsed[int(row["id"])].features.feature
        assert bool(row["score_is_present"]) == ("score" in record)
        want = tf_values(record["score"]) if "score" in record else np.full(1, np.nan, np.float32)
        assert row["score"].tobytes() == want.tobytes()


def test_make_petastorm_dataset_over_rows_and_batches(records: tuple[str, dict[int, Any]]) -> None:
    url, parsed = records
    with make_reader(url, num_epochs=1, workers_count=1) as reader:
        dataset = make_petastorm_dataset(reader)
        spec = dataset.element_spec
        assert type(spec).__name__ == "TFRecord_row" and spec._fields[-len(NULLABLE):] == tuple(
            n + PRESENT_SUFFIX for n in NULLABLE)
        assert tuple(spec.vec.shape) == (None,) and spec.vec_is_present.dtype == tf.bool
        rows = [numpy_row(r) for r in dataset]
    assert sorted(int(r["id"]) for r in rows) == list(range(RECORDS))
    for row in rows:
        assert_record(row, parsed)
    with make_batch_reader(url, num_epochs=1, workers_count=1) as reader:
        batches = list(make_petastorm_dataset(reader))
    assert len(batches) > 3  # one per row group
    rows = [r for b in batches for r in rows_of(b)]
    assert sorted(int(r["id"]) for r in rows) == list(range(RECORDS))
    for row in rows:
        assert_record(row, parsed)
    with make_reader(url, num_epochs=1, workers_count=1) as reader:  # a row reader's rows re-batched
        rows = [r for b in make_tf_dataset(reader, 7) for r in rows_of(b)]
    assert sorted(int(r["id"]) for r in rows) == list(range(RECORDS))
    for row in rows:
        assert_record(row, parsed)


def test_tf_tensors_fill_nulls_and_mask_them(records: tuple[str, dict[int, Any]]) -> None:
    """TF1 graph mode (tf_tensors) gives the same form: rows of a row reader, batches of a batch
    reader (without the ragged ``vec``, which a dense batch cannot hold)."""
    url, parsed = records
    tensors, samples, _ = run_all(lambda: make_reader(url, num_epochs=1, workers_count=1))
    assert tensors._fields[-len(NULLABLE):] == tuple(n + PRESENT_SUFFIX for n in NULLABLE)
    assert tensors.vec_is_present.dtype == tf.bool and tensors.vec_is_present.shape.rank == 0
    assert sorted(int(s.id) for s in samples) == list(range(RECORDS))
    for sample in samples:
        assert_record(sample._asdict(), parsed)
    fields = ["id", "blob", "count", "name", "score", "triple"]
    _, samples, _ = run_all(lambda: make_batch_reader(url, num_epochs=1, workers_count=1, schema_fields=fields))
    rows = [{name: column[j] for name, column in batch._asdict().items()} for batch in samples
            for j in range(len(batch.id))]
    assert sorted(int(r["id"]) for r in rows) == list(range(RECORDS))
    for row in rows:
        assert_record(row, parsed, fields[1:])


def test_masks_match_the_output_signature(records: tuple[str, dict[int, Any]]) -> None:
    url, _ = records
    with make_batch_reader(url) as reader:
        schema = reader.schema
    signature = tf_bridge.output_signature(schema, batched=True)
    with make_batch_reader(url, num_epochs=1) as reader:
        spec = make_petastorm_dataset(reader).element_spec
    assert type(signature) is type(spec) and structure(signature) == structure(spec)
    assert tf_bridge.output_signature(schema, petastorm_types=True)._fields == tuple(schema.attribute_names.values())


def test_a_mask_name_a_field_already_has_is_refused(tmp_path: Path) -> None:
    schema = Unischema("Clash", [UnischemaField("x", np.int64, (), ScalarCodec(pa.int64()), True),
                                 UnischemaField("x_is_present", np.bool_, (), ScalarCodec(pa.bool_()), False)])
    write_dataset(tmp_path / "ds", schema, [{"x": None, "x_is_present": False}])
    with pytest.raises(SchemaError, match=r"\['x_is_present'\].*masks of nullable fields"):
        make_tf_dataset((tmp_path / "ds").as_uri(), 1)


# -- image folders mixing gray and RGB ------------------------------------------------------------
def write_folder(root: Path, sizes: str) -> dict[str, np.ndarray]:
    """A class folder tree of gray and RGB PNGs and JPEGs written by PIL; each file's pixels as PIL
    reads them, gray ones as (H, W, 1), by path."""
    rng = np.random.default_rng(5)
    pixels = {}
    for label in ("cats", "dogs"):
        (root / label).mkdir(parents=True)
        for i in range(7):
            mode, ext = ("L" if i % 2 else "RGB"), ("png" if i % 3 else "jpg")
            height, width = (9, 7) if sizes == "same" else (int(rng.integers(5, 20)), int(rng.integers(5, 20)))
            shape = (height, width) if mode == "L" else (height, width, 3)
            path = root / label / f"{i}.{ext}"
            Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(path)
            with Image.open(path) as image:
                assert image.mode == mode
                read = np.asarray(image)
            pixels[f"{label}/{i}.{ext}"] = read[..., np.newaxis] if mode == "L" else read
    return pixels


@pytest.fixture(scope="module", params=["same", "varied"])
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("images")
    pixels = write_folder(root / "source", request.param)
    convert(root / "source", root / "converted", row_group_size_mb=0.0005)
    return (root / "converted").as_uri(), pixels


def assert_images(rows: list[dict[str, Any]], pixels: dict[str, np.ndarray]) -> None:
    """Every file once, each image its PIL pixels bit for bit, rank 3 (gray ones (H, W, 1))."""
    paths = [r["path"].decode() if isinstance(r["path"], bytes) else str(r["path"]) for r in rows]
    assert sorted(paths) == sorted(pixels)
    for path, row in zip(paths, rows):
        image = np.asarray(row["image"])
        assert image.dtype == np.uint8 and image.shape == pixels[path].shape, path
        assert image.tobytes() == pixels[path].tobytes(), path


def test_mixed_folder_schema_is_rank_3(folder: tuple[str, dict[str, np.ndarray]]) -> None:
    """The schema's image field is rank 3 with no fixed channel count, and the numpy readers give
    every image that rank (gray ones (H, W, 1)), rows and batches alike."""
    url, pixels = folder
    with make_reader(url, num_epochs=1, workers_count=1) as reader:
        field = reader.schema.fields["image"]
        assert len(field.shape) == 3 and field.shape[2] is None
        rows = [r._asdict() for r in reader]
    assert_images(rows, pixels)
    with make_batch_reader(url, num_epochs=1, workers_count=1) as reader:
        rows = [dict(zip(b._fields, values)) for b in reader for values in zip(*b)]
    assert_images(rows, pixels)


def test_mixed_folder_through_tensorflow(folder: tuple[str, dict[str, np.ndarray]]) -> None:
    """make_tf_dataset (plain, and shuffled: the images decoded after the shuffle) and
    make_petastorm_dataset over row and batch readers: every image rank 3, PIL's pixels."""
    url, pixels = folder
    for shuffle in (0, 6):
        dataset = make_tf_dataset(url, 4, shuffle_buffer=shuffle, seed=1, workers_count=2)
        assert tuple(dataset.element_spec["image"].shape) == (None, None, None, None)
        assert_images([r for b in dataset for r in rows_of(b)], pixels)
    with make_reader(url, num_epochs=1, workers_count=1) as reader:
        dataset = make_petastorm_dataset(reader)
        assert len(dataset.element_spec.image.shape) == 3
        assert_images([numpy_row(r) for r in dataset], pixels)
    with make_batch_reader(url, num_epochs=1, workers_count=1) as reader:
        assert_images([r for b in make_petastorm_dataset(reader) for r in rows_of(b)], pixels)


# -- errors cross as unihub's ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def corrupt_image_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Row 5's PNG is cut short (its bytes still start as a PNG, so the writer stores them)."""
    schema = Unischema("Corrupt", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                   UnischemaField("image", np.uint8, (None, None, 3), CompressedImageCodec("png"), False)])
    rng = np.random.default_rng(0)
    blobs = [CompressedImageCodec("png").encode(schema.image, rng.integers(0, 256, (4, 5, 3), dtype=np.uint8))
             for _ in range(8)]
    blobs[5] = blobs[5][:40]
    path = tmp_path_factory.mktemp("corrupt") / "ds"
    write_dataset(path, schema, [{"id": i, "image": blob} for i, blob in enumerate(blobs)])
    return path.as_uri()


def test_a_corrupt_image_crosses_as_unihubs_error(corrupt_image_url: str) -> None:
    """Iterating the dataset raises the ImageDecodeError the reader raised (its field and row), not
    TensorFlow's InvalidArgumentError; a dataset TensorFlow maps on its own carries its text."""
    for make in (lambda: make_tf_dataset(corrupt_image_url, 4, workers_count=1),
                 lambda: make_petastorm_dataset(make_reader(corrupt_image_url, num_epochs=1, workers_count=1))):
        with pytest.raises(ImageDecodeError, match=r"field 'image', row 5") as caught:
            list(make())
        assert not isinstance(caught.value, tf.errors.OpError) and caught.value.field == "image"
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"ImageDecodeError: .*field 'image', row 5"):
        list(make_tf_dataset(corrupt_image_url, 4, workers_count=1).map(lambda batch: batch))


@pytest.mark.parametrize("shuffle_buffer", [0, 3])
def test_a_skipped_image_leaves_the_row_count_unknown(corrupt_image_url: str, shuffle_buffer: int) -> None:
    """With ``on_decode_error='skip'`` the dataset asserted the stored row count as its cardinality, so the
    row dropped made TensorFlow fail the epoch ("expected to contain 8 elements but contained only 7")."""
    dataset = make_tf_dataset(corrupt_image_url, 1, shuffle_buffer=shuffle_buffer, seed=0, workers_count=1,
                              on_decode_error="skip")
    with pytest.warns(UserWarning, match="on_decode_error='skip'"):
        ids = sorted(int(i) for batch in dataset for i in batch["id"].numpy())
    assert ids == [0, 1, 2, 3, 4, 6, 7]
    assert make_tf_dataset(corrupt_image_url, 1, workers_count=1).cardinality().numpy() == 8


def test_values_of_another_rank_are_named_not_numpys_error() -> None:
    """A row whose rank is not the schema's (a gray (H, W) image in a rank-3 field) is a
    ValidationError naming the field and row, not numpy's 'inhomogeneous shape' ValueError."""
    field = UnischemaField("image", np.uint8, (None, None, None), CompressedImageCodec("png"), False)
    column = np.empty(3, dtype=object)
    column[:] = [np.zeros((2, 3, 3), np.uint8), np.zeros((2, 3, 1), np.uint8), np.zeros((4, 2), np.uint8)]
    with pytest.raises(ValidationError, match=r"field 'image', row 2 .*shape \(4, 2\).*\(None, None, None\)") as caught:
        tf_encode.encode_columns(tf_plans.field_plans([field]), {"image": column})
    assert (caught.value.field, caught.value.row) == ("image", 2)
