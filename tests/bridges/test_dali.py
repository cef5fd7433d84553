"""The DALI bridge on the CPU (``device_id=None``): sources, decode equality, sharding, epochs, iterators."""

from __future__ import annotations

import io
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub import CompressedImageCodec, ScalarCodec, Unischema, UnischemaField, write_dataset
from unihub.dependencies import is_available
from unihub.images.decoders import ImageDecodeError, decode_image, encode_image
from unihub.readers.random_access import Dataset

pytestmark = pytest.mark.skipif(not is_available("nvidia.dali"), reason="needs nvidia-dali (unihub[dali])")

N = 60  # rows: 60 = 2 shards x 3 batches x 10, and 7 full batches of 8 + 4 left over


def _schema(codec: str) -> Unischema:
    return Unischema("Dali", [
        UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("image", np.uint8, (32, 32, 3), CompressedImageCodec(codec), False),
        UnischemaField("label", np.int32, (), ScalarCodec(pa.int32()), False),
    ])


def _image(i: int) -> np.ndarray:
    """Smooth gradients plus noise: JPEG-like content that still exercises every pixel value range."""
    y, x = np.mgrid[0:32, 0:32]
    base = np.stack([(x * 8 + i) % 256, (y * 8 + 2 * i) % 256, ((x + y) * 4 + 3 * i) % 256], axis=-1)
    noise = np.random.default_rng(i).integers(0, 16, (32, 32, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def _write(path: Path, codec: str, n: int = N) -> Path:
    rows = ({"id": i, "image": _image(i), "label": np.int32(i % 10)} for i in range(n))
    write_dataset(path, _schema(codec), rows, row_group_size_mb=0.01)  # several row groups
    return path


@pytest.fixture(scope="module")
def png_url(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("dali") / "png", "png")


@pytest.fixture(scope="module")
def jpeg_url(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("dali") / "jpeg", "jpeg")


def _epoch_ids(pipe) -> list[int]:
    from unihub.bridges.dali import iterate_epoch

    return [int(i) for _, ids, *_ in iterate_epoch(pipe) for i in ids]


def _decoded_by_dali(url: Path, batch_size: int = 10) -> dict[int, np.ndarray]:
    """Image by id, as a CPU DALI pipeline of batches of ``batch_size`` decodes them (a last part batch dropped)."""
    from unihub.bridges.dali import iterate_epoch, make_dali_pipeline

    pipe = make_dali_pipeline(url, batch_size, other_fields=("id",))
    try:
        return {int(i): img for images, ids in iterate_epoch(pipe) for img, i in zip(images, ids)}
    finally:
        pipe.source.close()


def test_png_decode_is_bit_exact(png_url: Path) -> None:
    decoded = _decoded_by_dali(png_url)
    raw = Dataset(png_url, ["id", "image"], decode_images=False)
    assert sorted(decoded) == list(range(N))
    for i, image in decoded.items():
        expected = decode_image(raw[i].image)
        assert image.dtype == np.uint8 and image.shape == (32, 32, 3)
        np.testing.assert_array_equal(image, expected)
        np.testing.assert_array_equal(image, _image(i))  # PNG is lossless


def test_jpeg_decode_matches_unihub(jpeg_url: Path) -> None:
    decoded = _decoded_by_dali(jpeg_url)
    raw = Dataset(jpeg_url, ["id", "image"], decode_images=False)
    worst = 0
    for i, image in decoded.items():
        diff = np.abs(image.astype(np.int16) - decode_image(raw[i].image).astype(np.int16))
        worst = max(worst, int(diff.max()))
    # measured: DALI's CPU decoder (libjpeg-turbo through nvImageCodec) and unihub's (libjpeg-turbo)
    # give the same pixels; a GPU (nvJPEG) decode differs by a few levels, which this does not test
    assert worst == 0, f"JPEG pixels differ by up to {worst}"


def test_a_16_bit_png_field_keeps_its_values(tmp_path: Path) -> None:
    """DALI decodes to uint8 unless told otherwise, scaling a uint16 field's pixels down to 8 bits
    (the readers give them as stored)."""
    schema = Unischema("Wide", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                UnischemaField("image", np.uint16, (5, 6, 3), CompressedImageCodec("png"), False)])
    pixels = [np.random.default_rng(i).integers(0, 2**16, (5, 6, 3)).astype(np.uint16) for i in range(4)]
    write_dataset(tmp_path / "wide", schema, ({"id": i, "image": image} for i, image in enumerate(pixels)))
    decoded = _decoded_by_dali(tmp_path / "wide", 4)
    assert sorted(decoded) == [0, 1, 2, 3]
    for i, image in decoded.items():
        assert image.dtype == np.uint16
        np.testing.assert_array_equal(image, pixels[i])


@pytest.mark.parametrize("codec", ["jpeg", "png"])
def test_an_exif_orientation_turns_no_image(tmp_path: Path, codec: str) -> None:
    """DALI turns an image by its EXIF orientation unless told not to: a 16x8 image tagged 'rotate 90' came
    out 8x16, not the pixels (nor the fixed shape) make_reader and Petastorm give for the same bytes."""
    from PIL import Image

    from unihub import make_reader

    def tagged(orientation: int) -> bytes:
        exif, out = Image.Exif(), io.BytesIO()
        exif[0x0112] = orientation
        Image.fromarray(_image(orientation)[:16]).save(out, codec.upper(), exif=exif.tobytes(), quality=95)
        return out.getvalue()

    schema = Unischema("Turned", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                  UnischemaField("image", np.uint8, (16, 32, 3), CompressedImageCodec(codec), False)])
    write_dataset(tmp_path / "turned", schema, ({"id": o, "image": tagged(o)} for o in (1, 3, 6, 8)))
    with make_reader(tmp_path / "turned") as reader:
        expected = {int(row.id): row.image for row in reader}
    decoded = _decoded_by_dali(tmp_path / "turned", 4)
    assert sorted(decoded) == sorted(expected)
    for i, image in decoded.items():
        assert image.shape == (16, 32, 3)
        np.testing.assert_array_equal(image, expected[i])


def _gpus() -> int:
    from nvidia.dali.backend import GetCUDADeviceCount

    try:
        return int(GetCUDADeviceCount())
    except RuntimeError:  # no driver
        return 0


@pytest.mark.gpu
def test_gpu_decode_matches_the_readers(png_url: Path, jpeg_url: Path) -> None:
    """docs/frameworks/dali.md's device_id=0 example: 'mixed' decoding gives the PNGs' exact pixels, as the
    CPU does, and the torch iterator hands over CUDA tensors (JPEG: nvJPEG may differ by a few levels)."""
    if not _gpus():
        pytest.skip("needs an NVIDIA GPU")
    from unihub.bridges.dali import iterate_epoch, make_dali_pipeline, make_dali_torch_iterator

    pipe = make_dali_pipeline(png_url, 10, other_fields=("id",), device_id=0)
    try:
        ids = []
        for images, batch_ids in iterate_epoch(pipe):
            for image, i in zip(images, batch_ids):
                np.testing.assert_array_equal(image, _image(int(i)))
                ids.append(int(i))
        assert ids == list(range(N))
    finally:
        pipe.source.close()
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA build of torch")
    pipe = make_dali_pipeline(jpeg_url, 8, other_fields=("label",), device_id=0, resize=(16, 16),
                              normalize=((124, 116, 104), (58, 57, 57)))
    try:
        batch = next(iter(make_dali_torch_iterator(pipe)))[0]
        assert batch["image"].is_cuda and tuple(batch["image"].shape) == (8, 3, 16, 16)
        assert batch["label"].tolist() == [i % 10 for i in range(8)]
    finally:
        pipe.source.close()


def test_fixture_has_several_row_groups(png_url: Path) -> None:
    assert len(Dataset(png_url).store.row_groups) > 2  # so rebatching crosses reader batches


@pytest.mark.parametrize("last_batch, sizes, expected_ids", [
    ("drop", [8] * 7, list(range(56))),
    ("pad", [8] * 8, list(range(60)) + [0, 1, 2, 3]),
    ("partial", [8] * 7 + [4], list(range(60))),
])
def test_batch_source_rebatches_each_epoch(png_url: Path, last_batch: str, sizes: list[int],
                                           expected_ids: list[int]) -> None:
    from unihub.bridges.dali import DaliBatchSource

    with DaliBatchSource(png_url, 8, ["id", "image"], last_batch=last_batch) as source:
        assert len(source) == len(sizes) and source.rows_per_epoch == N
        for _ in range(2):  # iter() starts each epoch, as DALI's reset() does with cycle="raise"
            batches = list(iter(source))
            assert [len(ids) for ids, _ in batches] == sizes
            assert [int(i) for ids, _ in batches for i in ids] == expected_ids
            ids, images = batches[0]
            assert ids[0].shape == () and ids[0].dtype == np.int64
            assert images[0].dtype == np.uint8 and images[0].ndim == 1
            np.testing.assert_array_equal(decode_image(images[3].tobytes()), _image(3))


def test_batch_source_shuffles_per_epoch(png_url: Path) -> None:
    from unihub.bridges.dali import DaliBatchSource

    with DaliBatchSource(png_url, 10, ["id"], shuffle=True, seed=3) as source:
        epochs = [[int(i) for (ids,) in iter(source) for i in ids] for _ in range(2)]
    assert all(sorted(e) == list(range(N)) for e in epochs)
    assert epochs[0] != epochs[1] and epochs[0] != list(range(N))


def _by_next(source) -> list[int]:
    """The ids of the source's current epoch, asked for with next() alone."""
    ids = []
    while True:
        try:
            ids += [int(i) for i in next(source)[0]]
        except StopIteration:
            return ids


def test_iterating_iter_of_the_source_skips_no_epoch(png_url: Path) -> None:
    """``for batch in iter(source)`` (and ``list(iter(source))``) call iter() twice: that is one epoch, not the
    first skipped, which would lose the rows a start_offset resumes."""
    from unihub.bridges.dali import DaliBatchSource

    with DaliBatchSource(png_url, 8, ["id"], shuffle=True, seed=3, last_batch="partial", start_offset=13) as source:
        expected = [_by_next(source)]
        iter(source)
        expected.append(_by_next(source))
    assert len(expected[0]) == N - 13 and len(expected[1]) == N
    with DaliBatchSource(png_url, 8, ["id"], shuffle=True, seed=3, last_batch="partial", start_offset=13) as source:
        epochs = [[int(i) for batch in iter(source) for i in batch[0]], [int(i) for (ids,) in list(iter(source))
                                                                         for i in ids]]
    assert epochs == expected


def _claiming_8x8(path: Path) -> Path:
    """A dataset whose stored schema says its images are (8, 8, 3) though row 1's is 16x12: as a writer of
    another tool, or a file since replaced, could leave it (unihub's own writers refuse it)."""
    schema = Unischema("Claims", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                  UnischemaField("image", np.uint8, (None, None, 3), CompressedImageCodec("png"), False)])
    images = [np.zeros((8, 8, 3), np.uint8), np.full((16, 12, 3), 7, np.uint8), np.ones((8, 8, 3), np.uint8)]
    write_dataset(path, schema, ({"id": i, "image": encode_image(image, "png")} for i, image in enumerate(images)))
    for file in path.iterdir():
        if file.suffix == ".parquet" or file.name == "_common_metadata":
            table = pq.read_table(file)
            metadata = dict(table.schema.metadata)
            metadata[b"unihub.unischema"] = metadata[b"unihub.unischema"].replace(b"[null,null,3]", b"[8,8,3]")
            if file.suffix == ".parquet":
                pq.write_table(table.replace_schema_metadata(metadata), file)
            else:
                pq.write_metadata(table.schema.with_metadata(metadata), file)
    return path


def test_an_image_contradicting_the_field_s_dims_is_refused_as_the_readers_refuse_it(tmp_path: Path) -> None:
    """DALI would decode it at its own size (or resize it without a word): the sources check the header."""
    from unihub import make_batch_reader
    from unihub.bridges.dali import DaliBatchSource, DaliSampleSource, iterate_epoch, make_dali_pipeline

    url = _claiming_8x8(tmp_path / "claims")
    with make_batch_reader(url, workers_count=1) as reader:
        assert reader.schema.image.shape == (8, 8, 3)
        with pytest.raises(ImageDecodeError, match="row 1"):
            next(reader)
    with DaliBatchSource(url, 3, ["id", "image"]) as source:
        with pytest.raises(ImageDecodeError, match=r"sample 1 of shard 0: field 'image': PNG image of shape "
                                                   r"\(16, 12, 3\), expected \(8, 8, 3\)"):
            next(source)

    class Info:
        epoch_idx, idx_in_epoch, idx_in_batch = 0, 1, 1

    with pytest.raises(ImageDecodeError, match=r"\(row 1 of the dataset\): field 'image': PNG image of shape \(16, 12"):
        DaliSampleSource(url, ["id", "image"])(Info())
    pipe = make_dali_pipeline(url, 3, other_fields=("id",), resize=(4, 4), last_batch="partial")
    try:
        with pytest.raises(ImageDecodeError, match="expected"):
            list(iterate_epoch(pipe))
    finally:
        pipe.source.close()


def test_a_null_in_another_field_is_refused_naming_field_and_sample(tmp_path: Path) -> None:
    """DALI fails on the object array a null makes with no word of the field (RuntimeError: unknown format
    string 'O'); the sources refuse it, naming the field and the sample."""
    from unihub.bridges.dali import DaliBatchSource, DaliSampleSource, iterate_epoch, make_dali_pipeline
    from unihub.errors import CodecError

    schema = Unischema("Nulls", [*_schema("png").fields.values(),
                                 UnischemaField("score", np.float32, (), ScalarCodec(pa.float32()), True)])
    rows = ({"id": i, "image": _image(i), "label": np.int32(0), "score": None if i == 2 else np.float32(i)}
            for i in range(4))
    url = tmp_path / "nulls"
    write_dataset(url, schema, rows)
    pipe = make_dali_pipeline(url, 4, other_fields=("id", "score"))
    try:
        with pytest.raises(CodecError, match=r"epoch 0, sample 2 of shard 0: field 'score': a null"):
            list(iterate_epoch(pipe))
    finally:
        pipe.source.close()
    with DaliBatchSource(url, 2, ["id", "score"]) as source:
        with pytest.raises(CodecError, match="sample 2 of shard 0: field 'score'"):  # a reader batch at a time
            next(source)
    with pytest.raises(CodecError, match=r"\(row 2 of the dataset\): field 'score': a null"):
        DaliSampleSource(url, ["id", "score"])(_Info(2))


def test_fields_dali_cannot_take_are_refused_by_the_sources_too(tmp_path: Path) -> None:
    """A string, or a second image field (a mask) DALI would get as a string of bytes, failed inside DALI
    with no word of the field ('unknown format string: 2w', 'stoi'); make_dali_pipeline and the sources
    built directly for a pipeline of one's own refuse them naming the field."""
    from unihub.bridges.dali import DaliBatchSource, DaliSampleSource, make_dali_pipeline
    from unihub.errors import SchemaError

    schema = Unischema("Masks", [*_schema("png").fields.values(),
                                 UnischemaField("mask", np.uint8, (32, 32), CompressedImageCodec("png"), False),
                                 UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), False)])
    rows = ({"id": i, "image": _image(i), "label": np.int32(0), "mask": _image(i)[..., 0], "name": f"n{i}"}
            for i in range(4))
    url = tmp_path / "masks"
    write_dataset(url, schema, rows)
    with pytest.raises(SchemaError, match=r"field 'mask' holds PNG/JPEG images but is not an image field"):
        make_dali_pipeline(url, 2, other_fields=("id", "mask"))
    with pytest.raises(SchemaError, match=r"field 'mask' holds PNG/JPEG images but is not an image field .*'image'"):
        DaliBatchSource(url, 2, ["image", "mask"], image_fields=["image"])
    for fields in (["id", "name"], ["image", "name"]):
        with pytest.raises(SchemaError, match="field 'name' has dtype"):
            DaliBatchSource(url, 2, fields)
        with pytest.raises(SchemaError, match="field 'name' has dtype"):
            DaliSampleSource(url, fields)(_Info(0))
    with DaliBatchSource(url, 2, ["image", "mask"]) as source:  # both images: bytes for two decoders
        images, masks = next(source)
        np.testing.assert_array_equal(decode_image(masks[1].tobytes()), _image(1)[..., 0])


def test_a_refused_sample_is_named_by_file_row_group_and_row(tmp_path: Path) -> None:
    """As docs/frameworks/dali.md promises and the readers do: a sample position alone ('epoch 0, sample 5 of
    shard 1') or the dataset's URL did not say which file holds the bad image, shuffled and sharded."""
    from unihub.bridges.dali import DaliBatchSource, DaliSampleSource

    schema = Unischema("Holes", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                 UnischemaField("image", np.uint8, (32, 32, 3), CompressedImageCodec("png"), True)])
    url = tmp_path / "holes"
    write_dataset(url, schema, ({"id": i, "image": None if i == 12 else _image(i)} for i in range(20)),
                  row_group_size_mb=0.005, rows_per_file=7)
    store = Dataset(url).store
    group = next(g for g in store.row_groups if g.first_row <= 12 < g.first_row + g.num_rows)
    assert len(store.files) == 3 and group.row_group > 0 and group.path != store.row_groups[0].path
    where = f"{group.path}, row group {group.row_group} (row 12 of the dataset)"
    refused = 0
    for shard in range(2):
        options = dict(shuffle=True, seed=1, shard_id=shard, num_shards=2)
        with DaliBatchSource(url, 10, ["id", "image"], **options) as source:
            try:
                list(source)
            except ImageDecodeError as exc:
                refused += 1
                assert str(exc).startswith(f"{where}, epoch 0, sample "), str(exc)
        sample = DaliSampleSource(url, ["id", "image"], **options)
        for i in range(10):
            try:
                sample(_Info(i))
            except ImageDecodeError as exc:
                refused += 1
                assert str(exc).startswith(f"{where}: field 'image'"), str(exc)
    assert refused == 2  # once by each source


def test_a_complex_field_is_refused_not_read_as_floats(tmp_path: Path) -> None:
    """DALI has no complex type: it took a complex64 field's bytes as float32, [1+2j, 3+4j] arriving as
    [1.0, 2.0], real and imaginary parts mixed up and half the values gone."""
    from unihub import NdarrayCodec
    from unihub.bridges.dali import make_dali_pipeline
    from unihub.errors import SchemaError

    schema = Unischema("Complex", [*_schema("png").fields.values(),
                                   UnischemaField("z", np.complex64, (2,), NdarrayCodec(), False)])
    rows = ({"id": i, "image": _image(i), "label": np.int32(0), "z": np.array([1 + 2j, 3 + 4j], np.complex64)}
            for i in range(2))
    write_dataset(tmp_path / "complex", schema, rows)
    with pytest.raises(SchemaError, match=r"field 'z' has dtype .*complex64.*DALI takes bool, int, uint and float"):
        make_dali_pipeline(tmp_path / "complex", 2, other_fields=("z",))


def test_pipeline_two_epochs_and_shards(png_url: Path) -> None:
    from unihub.bridges.dali import make_dali_pipeline

    seen: list[Counter[int]] = [Counter(), Counter()]  # per epoch
    for shard in range(2):
        pipe = make_dali_pipeline(png_url, 10, other_fields=("id",), shard_id=shard, num_shards=2, shuffle=True)
        for epoch in range(2):
            ids = _epoch_ids(pipe)
            assert len(ids) == N // 2
            seen[epoch].update(ids)
        pipe.source.close()
    # the reader's plan shuffles row groups before cutting shards, so a shard's rows change
    # from epoch to epoch; in every epoch the two shards cover the dataset exactly once
    assert seen[0] == seen[1] == Counter(range(N))


@pytest.mark.parametrize("parallel", [False, True])
def test_the_pipeline_shards_as_a_stream_dropping_the_remainder(png_url: Path, parallel: bool) -> None:
    """docs/guide/caching.md: DALI's sources take a stream's arguments on its plan; a stream with
    drop_shard_remainder=True (floor(N/S) rows a shard) had no pipeline to match, every shard after the
    first began elsewhere, so a start_offset counted on one resumed the other at other rows."""
    from unihub import make_reader
    from unihub.bridges.dali import make_dali_pipeline

    for shard in (0, 6):
        with make_reader(png_url, schema_fields=["id"], shuffle_row_groups=True, shuffle_rows=True, seed=3,
                         cur_shard=shard, shard_count=7, shard_by="row", shard_remainder="drop") as reader:
            reader.seek(2)
            expected = [int(row.id) for row in reader]
        pipe = make_dali_pipeline(png_url, 3, other_fields=("id",), shard_id=shard, num_shards=7, shuffle=True,
                                  seed=3, shard_remainder="drop", start_offset=2, parallel=parallel,
                                  py_num_workers=1)
        try:
            assert _epoch_ids(pipe) == expected and len(expected) == N // 7 - 2
        finally:
            getattr(pipe.source, "close", lambda: None)()
            del pipe


@pytest.mark.parametrize("parallel", [False, True])
def test_start_offset_resumes_the_first_epoch_exactly(png_url: Path, parallel: bool) -> None:
    """A pipeline at ``start_offset=k`` serves what a whole one serves after its first k samples,
    then whole epochs; every shard alike."""
    from unihub.bridges.dali import make_dali_pipeline

    options = dict(other_fields=("id",), shard_id=1, num_shards=2, shuffle=True, seed=4, parallel=parallel,
                   py_num_workers=1, last_batch="pad" if parallel else "partial")
    whole = make_dali_pipeline(png_url, 10, **options)
    try:
        epochs = [_epoch_ids(whole) for _ in range(2)]
    finally:
        getattr(whole.source, "close", lambda: None)()
        del whole
    for offset in (10, 13):
        pipe = make_dali_pipeline(png_url, 10, start_offset=offset, **options)
        try:
            first = _epoch_ids(pipe)
            assert first[:N // 2 - offset] == epochs[0][offset:]
            if not parallel:  # partial batches: nothing else
                assert first == epochs[0][offset:]
            assert _epoch_ids(pipe) == epochs[1]
        finally:
            getattr(pipe.source, "close", lambda: None)()
            del pipe


def test_start_offset_beyond_the_shard_is_refused(png_url: Path) -> None:
    from unihub.bridges.dali import DaliBatchSource, make_dali_pipeline
    from unihub.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="beyond this shard's 30 rows"):
        DaliBatchSource(png_url, 10, ["id"], shard_id=0, num_shards=2, start_offset=30)
    with pytest.raises(InvalidArgumentError, match="beyond this shard's 30 rows"):
        make_dali_pipeline(png_url, 10, other_fields=("id",), shard_id=0, num_shards=2, parallel=True,
                           start_offset=30)
    for parallel in (False, True):  # the batch source's error blamed seek(), which the caller never called
        with pytest.raises(InvalidArgumentError, match="start_offset must be an int >= 0, got -1"):
            make_dali_pipeline(png_url, 10, parallel=parallel, start_offset=-1)


@pytest.mark.parametrize("num_shards", [1, 3])
def test_the_sample_source_follows_the_batch_source_s_shuffled_order(png_url: Path, num_shards: int) -> None:
    """Both are on the readers' plan (docs/frameworks/dali.md): a start_offset counted on one resumes the other
    at the same rows. The sample source used to draw its own permutation when shuffled."""
    from unihub.bridges.dali import DaliBatchSource, DaliSampleSource

    for shard in range(num_shards):
        options = dict(shuffle=True, seed=4, shard_id=shard, num_shards=num_shards)
        with DaliBatchSource(png_url, 8, ["id"], last_batch="partial", **options) as source:
            epochs = [[int(i) for (ids,) in source for i in ids] for _ in range(2)]
        sample = DaliSampleSource(png_url, ["id"], start_offset=5, **options)
        ids = [[int(sample.dataset.take([int(i)]).id[0]) for i in sample.indices(epoch)] for epoch in range(2)]
        assert ids == [epochs[0][5:], epochs[1]]
        assert epochs[0] != epochs[1] and sorted(epochs[0]) != epochs[0]


def test_sample_indices_is_a_pure_plan() -> None:
    from unihub.bridges.dali import sample_indices

    np.testing.assert_array_equal(sample_indices(10, shard_id=1, num_shards=3), [4, 5, 6, 7])
    np.testing.assert_array_equal(sample_indices(10, shard_id=2, num_shards=3), [8, 9, 0, 1])  # 'pad' wraps
    assert len(sample_indices(10, shard_id=2, num_shards=3, shard_remainder="drop")) == 3
    a = [sample_indices(100, shard_id=s, num_shards=4, epoch=1, shuffle=True, seed=7) for s in range(4)]
    assert sorted(np.concatenate(a).tolist()) == list(range(100))
    np.testing.assert_array_equal(a[0], sample_indices(100, shard_id=0, num_shards=4, epoch=1, shuffle=True, seed=7))
    assert not np.array_equal(a[0], sample_indices(100, shard_id=0, num_shards=4, epoch=2, shuffle=True, seed=7))


@pytest.mark.parametrize("shuffle, shards, remainder", [(True, 1, "pad"), (True, 3, "pad"), (True, 4, "drop"),
                                                         (False, 3, "pad")])
def test_sample_source_reads_the_readers_plan(png_url: Path, shuffle: bool, shards: int, remainder: str) -> None:
    """Shuffled, the parallel source's rows are the reader's and ``CachedDataset.stream``'s, row for row and
    epoch for epoch, so a ``start_offset`` saved by one resumes at the same row in the other."""
    from unihub import make_reader
    from unihub.bridges.dali import DaliSampleSource

    assert len(Dataset(png_url).store.row_groups) > 2
    for shard in range(shards):
        source = DaliSampleSource(png_url, ["id"], shard_id=shard, num_shards=shards, shuffle=shuffle, seed=3,
                                  shard_remainder=remainder, start_offset=4)
        with make_reader(png_url, schema_fields=["id"], shuffle_row_groups=shuffle, shuffle_rows=shuffle, seed=3,
                         cur_shard=shard if shards > 1 else None, shard_count=shards if shards > 1 else None,
                         shard_by="row", shard_remainder=remainder, num_epochs=2) as reader:
            reader.seek(4)
            expected = [int(row.id) for row in reader]
        ids = Dataset(png_url, ["id"]).take(np.concatenate([source.indices(0), source.indices(1)])).id
        assert ids.tolist() == expected


class _Info:
    def __init__(self, idx_in_epoch: int, idx_in_batch: int = 0, epoch_idx: int = 0) -> None:
        self.idx_in_epoch, self.idx_in_batch, self.iteration, self.epoch_idx = idx_in_epoch, idx_in_batch, 0, epoch_idx


def test_sample_source_pickles_and_serves_rows(png_url: Path) -> None:
    from unihub.bridges.dali import DaliSampleSource

    source = DaliSampleSource(png_url, ["image", "id"], shard_id=1, num_shards=2, last_batch="pad")
    image, i = source(_Info(0))
    assert int(i) == N // 2 and image.dtype == np.uint8 and image.ndim == 1
    np.testing.assert_array_equal(decode_image(image.tobytes()), _image(N // 2))
    clone = pickle.loads(pickle.dumps(source))  # after use: the open dataset stays behind
    assert clone._dataset is None and int(clone(_Info(5))[1]) == N // 2 + 5
    with pytest.raises(StopIteration):
        clone(_Info(N // 2, idx_in_batch=0))
    assert int(clone(_Info(N // 2 + 1, idx_in_batch=3))[1]) == N // 2 + 1  # 'pad' completes a batch


def test_the_sample_source_takes_this_process_s_image_limit_to_its_workers(png_url: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A spawned DALI worker imports unihub afresh: it refused with the default MAX_IMAGE_PIXELS the images a
    raised limit lets through (and served what a lowered one refuses), unlike the batch source."""
    from unihub.bridges.dali import DaliSampleSource
    from unihub.images import decoders

    source = DaliSampleSource(png_url, ["image", "id"])
    monkeypatch.setattr(decoders, "MAX_IMAGE_PIXELS", 32 * 32 - 1)
    worker = pickle.dumps(source)  # as DALI hands it to a spawned worker
    monkeypatch.setattr(decoders, "MAX_IMAGE_PIXELS", 178_956_970)  # the worker's own, fresh import
    with pytest.raises(ImageDecodeError, match="more than the limit of 1,023"):
        pickle.loads(worker)(_Info(0))
    assert decoders.MAX_IMAGE_PIXELS == 178_956_970  # put back after the sample
    monkeypatch.setattr(decoders, "MAX_IMAGE_PIXELS", None)
    worker = pickle.dumps(source)
    monkeypatch.setattr(decoders, "MAX_IMAGE_PIXELS", 10)
    assert int(pickle.loads(worker)(_Info(3))[1]) == 3


def test_parallel_pipeline_every_id_once_per_epoch(png_url: Path) -> None:
    from unihub.bridges.dali import make_dali_pipeline

    seen: list[Counter[int]] = [Counter(), Counter()]  # per epoch
    for shard in range(2):
        pipe = make_dali_pipeline(png_url, 10, other_fields=("id", "label"), shard_id=shard, num_shards=2,
                                  parallel=True, py_num_workers=2, py_start_method="spawn", shuffle=True, seed=5)
        epochs = [_epoch_ids(pipe) for _ in range(2)]
        assert [len(e) for e in epochs] == [N // 2] * 2 and epochs[0] != epochs[1]  # reshuffled per epoch
        for counter, ids in zip(seen, epochs):
            counter.update(ids)
        del pipe
    assert seen[0] == seen[1] == Counter(range(N))  # the shards of each epoch cover the dataset once


def test_torch_iterator_shapes(png_url: Path) -> None:
    pytest.importorskip("torch")
    import torch

    from unihub.bridges.dali import make_dali_pipeline, make_dali_torch_iterator

    pipe = make_dali_pipeline(png_url, 8, other_fields=("id", "label"), last_batch="pad")
    iterator = make_dali_torch_iterator(pipe, size=N, last_batch_policy="partial")
    for _ in range(2):
        batches = [b[0] for b in iterator]
        assert [len(b["id"]) for b in batches] == [8] * 7 + [4]
        first = batches[0]
        assert isinstance(first["image"], torch.Tensor) and first["image"].shape == (8, 32, 32, 3)
        assert first["image"].dtype == torch.uint8 and first["label"].shape == (8,)
        assert sorted(int(i) for b in batches for i in b["id"]) == list(range(N))
    pipe.source.close()


def test_torch_iterator_size_is_every_epoch_s_samples(png_url: Path) -> None:
    """DALI's iterator counts ``size`` samples per epoch and goes on in the same stream: a size the source's
    epochs do not hold made its later epochs come out empty (a resumed source's shorter first epoch, a
    'drop' source) or begin mid-epoch; it is refused, and the size that fits gives the source's epochs."""
    pytest.importorskip("torch")
    from unihub.bridges.dali import DaliBatchSource, DaliBridgeError, make_dali_pipeline, make_dali_torch_iterator

    options = dict(other_fields=("id",), shuffle=True, seed=2)
    with DaliBatchSource(png_url, 8, ["id"], last_batch="partial", shuffle=True, seed=2) as source:
        expected = [[int(i) for (ids,) in source for i in ids] for _ in range(2)]
    for last_batch, size, offset, match in [("pad", N, 10, "resumed at start_offset=10, holds 50 samples"),
                                            ("drop", N, 0, "holds 56 samples"), ("pad", 20, 0, "pass size=60")]:
        pipe = make_dali_pipeline(png_url, 8, last_batch=last_batch, start_offset=offset, **options)
        try:
            with pytest.raises(DaliBridgeError, match=match):
                make_dali_torch_iterator(pipe, size=size, last_batch_policy="partial")
        finally:
            pipe.source.close()
    pipe = make_dali_pipeline(png_url, 8, last_batch="pad", **options)
    try:
        iterator = make_dali_torch_iterator(pipe, size=N, last_batch_policy="partial")
        assert [[int(i) for b in iterator for i in b[0]["id"]] for _ in range(2)] == expected
    finally:
        pipe.source.close()


def test_tf_dataset_one_epoch(jpeg_url: Path) -> None:
    pytest.importorskip("tensorflow")
    if not is_available("nvidia.dali_tf_plugin"):
        pytest.skip("needs nvidia-dali-tf-plugin-cuda120 built for this TensorFlow")
    from unihub.bridges.dali import make_dali_tf_dataset
    from unihub.errors import SchemaError

    with pytest.raises(SchemaError, match=r"fields \['boxes'\] have a None dim"):
        make_dali_tf_dataset(Path(__file__).parents[1] / "fixtures" / "petastorm" / "unischema", 8,
                             image_field="image_png", other_fields=("boxes",))
    dataset = make_dali_tf_dataset(jpeg_url, 8, other_fields=("id", "label"))
    batches = [(images.numpy(), ids.numpy(), labels.numpy()) for images, ids, labels in dataset]
    assert len(batches) == N // 8 and batches[0][0].shape == (8, 32, 32, 3) and batches[0][2].dtype == np.int32
    ids = np.concatenate([b[1] for b in batches])
    assert sorted(ids.tolist()) == list(range(N // 8 * 8))
    raw = Dataset(jpeg_url, ["image"], decode_images=False)
    for images, ids, labels in batches[:2]:  # the zero-padded bytes decode to the same pixels
        for image, i, label in zip(images, ids, labels):
            np.testing.assert_array_equal(image, decode_image(raw[int(i)].image))
            assert label == i % 10


def test_the_tf_feed_pads_image_bytes_only() -> None:
    """make_dali_tf_dataset's dense batches: a ragged float field went through the bytes' zero padding and
    came out as uint8, [1.5, 300.25] as [1, 44]; the dataset now refuses such a field up front."""
    from unihub.bridges.dali import DaliBridgeError, _dense

    padded = _dense([np.array([1, 2, 3], np.uint8), np.array([4], np.uint8)])
    np.testing.assert_array_equal(padded, [[1, 2, 3], [4, 0, 0]])
    with pytest.raises(DaliBridgeError, match="only encoded image bytes are padded"):
        _dense([np.array([1.5, 300.25], np.float32), np.array([-3.5], np.float32)])


@pytest.mark.parametrize("layout, shape", [("CHW", (3, 16, 24)), ("HWC", (16, 24, 3))])
def test_resize_and_normalize(png_url: Path, layout: str, shape: tuple[int, ...]) -> None:
    from unihub.bridges.dali import iterate_epoch, make_dali_pipeline

    pipe = make_dali_pipeline(png_url, 10, resize=(16, 24), normalize=((128.0,) * 3, (64.0,) * 3), layout=layout)
    (images,), *_ = list(iterate_epoch(pipe))
    pipe.source.close()
    assert images[0].shape == shape and images[0].dtype == np.float32
    assert -2.1 <= float(images[0].min()) and float(images[0].max()) <= 2.1

    pipe = make_dali_pipeline(png_url, 10, resize=(16, 24))
    (images,), *_ = list(iterate_epoch(pipe))
    pipe.source.close()
    assert images[0].shape == (16, 24, 3) and images[0].dtype == np.uint8


def test_bad_options_are_refused(png_url: Path) -> None:
    from unihub.bridges.dali import DaliBatchSource, DaliBridgeError, make_dali_pipeline
    from unihub.errors import SchemaError

    for batch_size in (0, True):  # True was a batch of 1
        with pytest.raises(DaliBridgeError, match="batch_size"):
            make_dali_pipeline(png_url, batch_size)
    with pytest.raises(DaliBridgeError, match="shard_id"):
        make_dali_pipeline(png_url, 4, shard_id=2, num_shards=2)
    with pytest.raises(SchemaError, match="not a compressed image"):
        make_dali_pipeline(png_url, 4, image_field="label")
    with pytest.raises(SchemaError, match="no field"):
        make_dali_pipeline(png_url, 4, other_fields=("nope",))
    # DALI took these without a word (a resize to (0, -5) gave 3x5 images) or failed when run, naming no argument
    for bad, match in [(dict(resize=(0, -5)), "resize"), (dict(resize=(8.5, 9)), "resize"),
                       (dict(layout="chw", normalize=((1,) * 3, (1,) * 3)), "layout"),
                       (dict(normalize=((1, 2), (1, 1, 1))), "normalize"), (dict(normalize=((0,), (0,))), "normalize")]:
        with pytest.raises(DaliBridgeError, match=match):
            make_dali_pipeline(png_url, 4, **bad)
    for parallel in (False, True):  # DALI had one output too few: an IndexError when run
        with pytest.raises(DaliBridgeError, match=r"fields \['image'\] are asked for twice"):
            make_dali_pipeline(png_url, 4, other_fields=("id", "image"), parallel=parallel)
    with pytest.raises(DaliBridgeError, match=r"fields \['id'\] are asked for twice"):
        DaliBatchSource(png_url, 4, ["id", "image", "id"])  # it gave two lists for the three names
