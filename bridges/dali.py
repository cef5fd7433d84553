"""NVIDIA DALI bridge: unihub datasets as DALI external sources, decoded by DALI (on the GPU).

unihub hands DALI the *encoded* PNG/JPEG bytes (``decode_images=False``) and DALI decodes
them: ``device='mixed'`` decodes on the GPU (nvJPEG), ``'cpu'`` with libjpeg-turbo/libpng.
Two sources, one per external-source mode:

- :class:`DaliBatchSource` for ``fn.external_source(source=..., batch=True, num_outputs=k)``:
  an iterable over a unihub batch reader, rebatched to exactly ``batch_size`` samples.
- :class:`DaliSampleSource` for ``parallel=True`` (``batch=False``): a picklable callable of
  ``nvidia.dali.types.SampleInfo`` served by random access (:class:`~unihub.readers.random_access.Dataset`).

Each yields, per sample, a 1-D ``uint8`` array of the image bytes and one numpy array per
other field. :func:`make_dali_pipeline` builds the usual source -> decode -> resize ->
normalize pipeline; :func:`make_dali_torch_iterator` and :func:`make_dali_tf_dataset`
hand it to PyTorch and TensorFlow.

    pipe = make_dali_pipeline("file:///data/train", batch_size=64, other_fields=("label",),
                              device_id=0, resize=(224, 224), normalize=((124, 116, 104), (58, 57, 57)))
    for batch in make_dali_torch_iterator(pipe):
        train_step(batch[0]["image"], batch[0]["label"])

Shuffling and sharding stay in unihub (the reader's plan, or :func:`sample_indices`);
DALI only decodes and augments.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from unihub.dependencies import require
from unihub.errors import CodecError, InvalidArgumentError, SchemaError, UnihubError
from unihub.images import decoders as images
from unihub.readers.plan import PlanConfig, epoch_plan, task_rows
from unihub.readers.random_access import Dataset
from unihub.readers.reader import make_batch_reader
from unihub.schema.codecs import CompressedImageCodec
from unihub.schema.unischema import Unischema, UnischemaField
from unihub.store.dataset import open_dataset

if TYPE_CHECKING:
    from nvidia.dali.pipeline import Pipeline

LastBatch = Literal["drop", "pad", "partial"]
ShardRemainder = Literal["drop", "pad"]
_LAST_BATCH = ("drop", "pad", "partial")
#: the numpy types DALI has (no complex: it read a complex64 array's bytes as float32, the values mixed up;
#: no longdouble)
_DALI_TYPES = (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
               np.float16, np.float32, np.float64)


class DaliBridgeError(UnihubError, ValueError):
    """Options the DALI bridge cannot serve (a bad batch size, shard, field or policy)."""


def _dali(purpose: str) -> Any:
    return require("nvidia.dali", extra="dali", purpose=purpose)


def _check_fields(fields: Sequence[UnischemaField], image_fields: Sequence[str]) -> None:
    """DALI takes numeric tensors, and image bytes to decode: refuse strings, decimals, object columns and
    images not among ``image_fields`` (DALI would get their bytes as a string) up front."""
    for f in fields:
        if f.name in image_fields:
            if not isinstance(f.codec, CompressedImageCodec):
                raise SchemaError(f"field {f.name!r} is not a compressed image (codec {f.codec!r}); "
                                  "DALI's decoder needs PNG/JPEG bytes")
            continue
        if isinstance(f.codec, CompressedImageCodec):
            raise SchemaError(f"field {f.name!r} holds PNG/JPEG images but is not an image field of this source "
                              f"({list(image_fields)}), so DALI would get its bytes as a string: leave it out, or "
                              "decode it in a pipeline of your own over a source that names it an image field")
        if not (isinstance(f.numpy_dtype, type) and issubclass(f.numpy_dtype, _DALI_TYPES)):
            raise SchemaError(f"field {f.name!r} has dtype {f.numpy_dtype!r}; DALI takes bool, int, uint and float "
                              "fields of up to 64 bits only, leave it out of the fields")


def _to_sample(value: Any, is_image: bool, name: str = "", shape: tuple[int | None, ...] | None = None) -> np.ndarray:
    if is_image:
        _check_image(value, name, shape)
        return np.frombuffer(value, dtype=np.uint8)
    if value is None:  # DALI would fail on the object array with no word of the field
        raise CodecError(f"field {name!r}: a null, and DALI takes no nulls (fill them, or leave the field out)",
                         field=name)
    array = np.asarray(value)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)  # the latter makes 0-d 1-d


def _check_image(value: Any, name: str, shape: tuple[int | None, ...] | None = None) -> None:
    """Refuse (ImageDecodeError) what DALI's decoders would allocate without bound: a header unihub cannot
    read, or one claiming more than ``images.MAX_IMAGE_PIXELS`` (a decompression bomb). DALI allocates
    the pixels a header claims, on the host (``'cpu'``) or the GPU, before decoding any data. Also an
    image whose header contradicts the fixed dims of the field's ``shape``, as the readers refuse it (DALI
    would decode it at its own size)."""
    size = images.image_size(value) if value is not None else None
    if size is None:
        raise images.ImageDecodeError(f"field {name!r}: not a readable PNG or JPEG header, DALI would not decode it "
                                      f"({'null' if value is None else f'{len(value)} bytes'})", field=name)
    fmt = images.detect_format(value) or "image"
    try:
        images.check_pixels(size[0], size[1], fmt)
        if shape is not None:
            images.check_shape(size, shape, fmt.upper())
    except images.ImageDecodeError as exc:
        raise images.ImageDecodeError(f"field {name!r}: {exc}", field=name) from None


def _located(exc: CodecError, where: str) -> CodecError:
    """``exc`` (of its own class) with the sample it is about named first."""
    return type(exc)(f"{where}: {exc}", field=exc.field)


def _row_where(store: Any, row: int) -> str:
    """Row ``row`` of the dataset named as the readers name it: file, row group, row."""
    group = store.row_groups[bisect.bisect_right([g.first_row for g in store.row_groups], row) - 1]
    return f"{group.path}, row group {group.row_group} (row {row} of the dataset)"


def _check_batch(batch_size: int, last_batch: str) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise DaliBridgeError(f"batch_size must be a positive integer, got {batch_size!r}")
    if last_batch not in _LAST_BATCH:
        raise DaliBridgeError(f"last_batch must be one of {_LAST_BATCH}, got {last_batch!r}")


def _check_offset(start_offset: int) -> None:
    if not isinstance(start_offset, (int, np.integer)) or isinstance(start_offset, bool) or start_offset < 0:
        raise InvalidArgumentError(f"start_offset must be an int >= 0, got {start_offset!r}")


def _check_augment(resize: Any, normalize: Any, layout: str) -> None:
    """Refuse what DALI would take without a word (a resize to 0 or -5 rows gives 3; 8.5 rounds) or refuse
    only when the pipeline runs, with no word of which argument."""
    if resize is not None and (not isinstance(resize, (tuple, list)) or len(resize) != 2 or not all(
            isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n > 0 for n in resize)):
        raise DaliBridgeError(f"resize must be (height, width), two positive ints, got {resize!r}")
    if layout not in ("CHW", "HWC"):
        raise DaliBridgeError(f"layout must be 'CHW' or 'HWC', got {layout!r}")
    if normalize is not None:
        try:
            mean, std = (np.asarray(v, dtype=np.float64) for v in normalize)
        except (TypeError, ValueError):
            mean = std = np.empty(0)
        if not (mean.ndim == std.ndim == 1 and len(mean) in (1, 3) and len(std) in (1, 3) and np.all(std != 0)
                and np.all(np.isfinite(mean)) and np.all(np.isfinite(std))):
            raise DaliBridgeError(f"normalize must be (mean, std), each 1 or 3 finite numbers (per channel), std "
                                  f"not 0, got {normalize!r}")


def _check_unique(fields: Sequence[str]) -> None:
    """One output per field: a name given twice would leave DALI an output short (an IndexError in its run)."""
    twice = sorted({name for name in fields if list(fields).count(name) > 1})
    if twice:
        raise DaliBridgeError(f"fields {twice} are asked for twice (the image field is output first); name each once")


def _check_shard(shard_id: int, num_shards: int) -> None:
    if num_shards < 1 or not 0 <= shard_id < num_shards:
        raise DaliBridgeError(f"shard_id must be in [0, num_shards), got shard_id={shard_id}, num_shards={num_shards}")


# -- batch mode ---------------------------------------------------------------------------------
class DaliBatchSource:
    """Iterable for ``fn.external_source(source=..., batch=True, num_outputs=len(fields), cycle="raise")``.

    Each ``next()`` returns one list of ``batch_size`` numpy samples per field (in ``fields``
    order): image fields as 1-D ``uint8`` byte arrays, others as arrays of the field's
    dtype and shape. Reader batches (one per row-group task) are cut and joined to exactly
    ``batch_size``. At the end of an epoch ``next()`` raises StopIteration; ``iter()``
    (what DALI calls on ``pipeline.reset()`` with ``cycle="raise"``; without it DALI
    never asks again) starts the next epoch once ``next()`` was called in the current one; an
    ``iter()`` before that keeps the epoch just started (``for batch in iter(source)`` and
    ``list(iter(source))`` call it twice). The incomplete last batch of an epoch is:

    - ``'drop'`` (default): left out, so DALI always sees full batches;
    - ``'pad'``: filled up by repeating the epoch's first samples (count the real ones
      with :attr:`rows_per_epoch`, or pass ``size=`` to the framework iterator);
    - ``'partial'``: delivered short (DALI accepts batches up to its ``batch_size``).

    One unihub reader runs across all epochs (``num_epochs=None``) so each epoch gets its
    own shuffle from ``(seed, epoch)``; ``shard_id``/``num_shards`` shard by row
    (``shard_by='row'``, equal contiguous blocks). ``start_offset`` starts the first epoch at
    that row of the shard's order without reading the rows before it (exact resume: pass the
    samples already consumed; ``CachedDataset.stream``'s contract); later epochs are whole.
    :meth:`close` stops its workers.
    """

    def __init__(self, url: Any, batch_size: int, fields: Sequence[str], *, image_fields: Sequence[str] | None = None,
                 last_batch: LastBatch = "drop", shard_id: int = 0, num_shards: int = 1,
                 shard_remainder: ShardRemainder = "pad", shuffle: bool = False, seed: int | None = 0,
                 workers_count: int | None = None, storage_options: dict[str, Any] | None = None,
                 start_offset: int = 0) -> None:
        _check_batch(batch_size, last_batch)
        _check_shard(shard_id, num_shards)
        _check_unique(fields)
        _check_offset(start_offset)
        self.batch_size = batch_size
        self.last_batch = last_batch
        self._shard = shard_id
        self._plan: dict[str, Any] = dict(shard_id=shard_id, num_shards=num_shards, shuffle=shuffle,
                                          shard_remainder=shard_remainder)  # to name a refused sample's row
        # the shard always given: DALI's shard_id/num_shards (0 of 1: everything) are the pipeline's, not the job's
        self._reader = make_batch_reader(
            url, schema_fields=list(fields), decode_images=False, num_epochs=None, seed=seed,
            shuffle_row_groups=shuffle, shuffle_rows=shuffle, cur_shard=shard_id,
            shard_count=num_shards, shard_by="row", shard_remainder=shard_remainder,
            workers_count=workers_count, storage_options=storage_options)
        try:
            self._is_image = self._order_fields(fields, image_fields)
            if start_offset:
                self._reader.seek(start_offset)
        except BaseException:
            self.close()
            raise
        self.rows_per_epoch: int = self._reader.num_rows_per_epoch or 0
        self.start_offset = start_offset
        self.epoch = -1  # the epoch being served; iter() moves to the next one
        self._left = 0  # rows of the current epoch not yet taken from the reader
        self._pending: list[list[np.ndarray]] = [[] for _ in self.fields]
        self._taken = 0  # samples at the head of _pending already served (dropped a reader batch at a time)
        self._first: list[list[np.ndarray]] | None = None  # the epoch's first batch, for 'pad'
        self._fresh = False  # an epoch started by iter() and not yet asked for a batch

    def _order_fields(self, fields: Sequence[str], image_fields: Sequence[str] | None) -> tuple[bool, ...]:
        """Put ``self.fields`` in the order asked and check them; whether each is an image field."""
        self.fields = tuple(self._reader.schema.fields)
        order = {name: i for i, name in enumerate(fields)}
        if set(order) != set(self.fields):
            raise DaliBridgeError(f"fields {list(fields)} do not match the dataset's {list(self.fields)}")
        self.fields = tuple(sorted(self.fields, key=order.__getitem__))
        if image_fields is None:
            image_fields = [f.name for f in self._reader.schema if isinstance(f.codec, CompressedImageCodec)]
        _check_fields(list(self._reader.schema), image_fields)
        return tuple(name in image_fields for name in self.fields)

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(self.rows_per_epoch, self.batch_size)
        return full + (1 if rest and self.last_batch != "drop" else 0)

    def __iter__(self) -> DaliBatchSource:
        """Start the next epoch (the rest of the current one, if any, is skipped); keep the current one if no
        ``next()`` was called in it yet, so that iterating ``iter(source)`` does not skip a whole epoch."""
        if self._fresh:
            return self
        while self._left > 0:  # rows of an unfinished epoch still in the reader
            self._take_reader_batch()
        self.epoch += 1
        self._left = self._epoch_rows()
        self._pending, self._taken = [[] for _ in self.fields], 0
        self._first = None
        self._fresh = True
        return self

    def __next__(self) -> list[list[np.ndarray]]:
        if self.epoch < 0:
            iter(self)
        self._fresh = False
        while len(self._pending[0]) - self._taken < self.batch_size and self._left > 0:
            self._pending, self._taken = [column[self._taken:] for column in self._pending], 0
            self._take_reader_batch(keep=True)
        start = self._taken
        n = min(self.batch_size, len(self._pending[0]) - start)
        if n == 0 or (n < self.batch_size and self.last_batch == "drop"):
            self._pending, self._taken = [[] for _ in self.fields], 0
            raise StopIteration
        batch = [column[start:start + n] for column in self._pending]
        self._taken += n
        if self._first is None:
            self._first = batch
        if n < self.batch_size and self.last_batch == "pad":
            batch = [column + _cycle(first, self.batch_size - n) for column, first in zip(batch, self._first)]
        return batch

    def _take_reader_batch(self, keep: bool = False) -> None:
        columns = next(self._reader)
        n = min(len(columns[0]), self._left)
        first = self.rows_per_epoch - self._left  # the first of these rows in the shard's epoch order
        self._left -= n
        if keep:
            by_name, schema = columns._asdict(), self._reader.schema
            for out, name, is_image in zip(self._pending, self.fields, self._is_image):
                column, shape, before = by_name[name], schema[name].shape, len(out)
                try:
                    out.extend(_to_sample(column[i], is_image, name, shape) for i in range(n))
                except CodecError as exc:  # a refused image or a null; the samples before it are in out
                    raise _located(exc, self._where(first + len(out) - before)) from None

    def _where(self, sample: int) -> str:
        """Sample ``sample`` of the current epoch's order named as the readers name a row, then as DALI sees it."""
        store = self._reader.store
        rows = sample_indices([group.num_rows for group in store.row_groups], epoch=self.epoch,
                              seed=self._reader.seed, **self._plan)
        return f"{_row_where(store, int(rows[sample]))}, epoch {self.epoch}, sample {sample} of shard {self._shard}"

    def _epoch_rows(self) -> int:
        """Rows of the current epoch this source serves (the first epoch from ``start_offset``)."""
        return self.rows_per_epoch - (self.start_offset if self.epoch == 0 else 0)

    def close(self) -> None:
        """Stop the reader's workers."""
        self._reader.stop()
        self._reader.join()

    def __enter__(self) -> DaliBatchSource:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _cycle(values: list[np.ndarray], count: int) -> list[np.ndarray]:
    return [values[i % len(values)] for i in range(count)]


# -- sample mode (parallel) -----------------------------------------------------------------
def sample_indices(row_group_sizes: int | Sequence[int], *, shard_id: int = 0, num_shards: int = 1, epoch: int = 0,
                   shuffle: bool = False, seed: int = 0, shard_remainder: ShardRemainder = "pad") -> np.ndarray:
    """Global row indices one shard reads in ``epoch``, in order: pure, no I/O.

    The order is the readers' plan (:mod:`unihub.readers.plan`) for a dataset of row groups of
    ``row_group_sizes`` rows (an int: one row group): with ``shuffle`` its row groups and the rows in
    each are permuted by ``(seed, epoch)``, the same on every shard, so that shards stay disjoint and a
    ``start_offset`` means the same rows as a reader's or ``CachedDataset.stream``'s. The epoch's
    sequence is cut into ``num_shards`` equal contiguous blocks: ``'pad'`` gives each ``ceil(N/S)``
    rows, wrapping around to the start; ``'drop'`` gives each ``floor(N/S)``.
    """
    _check_shard(shard_id, num_shards)
    sizes = (row_group_sizes,) if isinstance(row_group_sizes, (int, np.integer)) else tuple(row_group_sizes)
    sharded = num_shards > 1
    config = PlanConfig(tuple(int(n) for n in sizes), seed=seed, shuffle_row_groups=shuffle, shuffle_rows=shuffle,
                        cur_shard=shard_id if sharded else None, shard_count=num_shards if sharded else None,
                        shard_by="row", shard_remainder=shard_remainder)
    firsts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    rows = []
    for task in epoch_plan(config, epoch):
        order = task_rows(task, seed, epoch, sizes[task.row_group])
        rows.append(firsts[task.row_group] + (np.arange(task.start, task.stop) if order is None else order))
    return np.concatenate(rows).astype(np.int64) if rows else np.empty(0, np.int64)


class DaliSampleSource:
    """Picklable ``source`` for ``fn.external_source(parallel=True, batch=False, num_outputs=k)``.

    Called with a ``nvidia.dali.types.SampleInfo``; returns a tuple with one numpy array
    per field (image bytes as 1-D ``uint8``), row ``sample_indices(...)[idx_in_epoch]``
    (the readers' and :class:`DaliBatchSource`'s order) read with ``Dataset.take``. Past the shard's end it raises StopIteration, which DALI
    turns into the end of the epoch; ``last_batch='pad'`` instead completes the last
    batch with the shard's first rows (a batch that would start past the end still
    stops), ``'drop'`` (default) stops at once so the incomplete batch is left out.

    ``start_offset`` starts the first epoch at that sample of the shard's order (exact resume);
    later epochs are whole.

    DALI pickles the source to its worker processes, so it holds only the URL and
    options; the dataset opens on first call in each process.
    """

    def __init__(self, url: Any, fields: Sequence[str], *, image_fields: Sequence[str] | None = None,
                 batch_size: int | None = None, last_batch: Literal["drop", "pad"] = "drop", shard_id: int = 0,
                 num_shards: int = 1, shard_remainder: ShardRemainder = "pad", shuffle: bool = False,
                 seed: int = 0, storage_options: dict[str, Any] | None = None, start_offset: int = 0) -> None:
        _check_shard(shard_id, num_shards)
        _check_offset(start_offset)
        if last_batch not in ("drop", "pad"):
            raise DaliBridgeError(f"a sample source's last_batch must be 'drop' or 'pad', got {last_batch!r}")
        self.url = os.fspath(url) if isinstance(url, os.PathLike) else url
        self.fields = tuple(fields)
        self.image_fields = None if image_fields is None else tuple(image_fields)
        self.batch_size = batch_size
        self.last_batch = last_batch
        self.shard_id, self.num_shards, self.shard_remainder = shard_id, num_shards, shard_remainder
        self.shuffle, self.seed = shuffle, int(seed)
        self.storage_options = storage_options
        self.start_offset = start_offset
        self._dataset: Any = None
        self._indices: tuple[int, np.ndarray] | None = None  # (epoch, indices) of the last epoch asked
        self._pixel_limit: tuple[int | None] | None = None  # the pickling process's MAX_IMAGE_PIXELS, in a worker

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_dataset"] = None  # open files stay behind; the worker opens its own
        state["_indices"] = None
        # a spawned worker imports unihub afresh: the image limit this process set (raised, lowered, None)
        # goes with the source, so that both DALI modes refuse the same images
        state["_pixel_limit"] = (images.MAX_IMAGE_PIXELS,)
        return state

    @property
    def dataset(self) -> Any:
        """The random-access dataset, opened on first use in this process."""
        if self._dataset is None:
            dataset = Dataset(self.url, list(self.fields), decode_images=False, storage_options=self.storage_options)
            if self.image_fields is None:
                self.image_fields = tuple(f.name for f in dataset.schema if isinstance(f.codec, CompressedImageCodec))
            _check_fields(list(dataset.schema), self.image_fields)
            self._dataset = dataset
        return self._dataset

    def indices(self, epoch: int) -> np.ndarray:
        """This shard's global row indices in ``epoch`` (the first epoch from ``start_offset``)."""
        if self._indices is None or self._indices[0] != epoch:
            full = self._epoch_indices(epoch)
            if epoch == 0 and self.start_offset:
                if self.start_offset >= len(full):
                    raise InvalidArgumentError(f"start_offset {self.start_offset} is beyond this shard's "
                                               f"{len(full)} rows per epoch")
                full = full[self.start_offset:]
            self._indices = (epoch, full)
        return self._indices[1]

    def _epoch_indices(self, epoch: int) -> np.ndarray:
        sizes = [group.num_rows for group in self.dataset.store.row_groups]
        return sample_indices(sizes, shard_id=self.shard_id, num_shards=self.num_shards, epoch=epoch,
                              shuffle=self.shuffle, seed=self.seed, shard_remainder=self.shard_remainder)

    def __len__(self) -> int:
        """Rows in this shard per (whole) epoch."""
        return len(self._epoch_indices(0))

    def __call__(self, sample_info: Any) -> tuple[np.ndarray, ...]:
        if self._pixel_limit is None:
            return self._sample(sample_info)
        with images.pixel_limit(self._pixel_limit[0]):
            return self._sample(sample_info)

    def _sample(self, sample_info: Any) -> tuple[np.ndarray, ...]:
        indices = self.indices(int(sample_info.epoch_idx))
        i = int(sample_info.idx_in_epoch)
        if i >= len(indices):
            if self.last_batch == "drop" or int(sample_info.idx_in_batch) == 0 or not len(indices):
                raise StopIteration
            i = i % len(indices)
        row = self.dataset.take([int(indices[i])])
        image_fields = self.image_fields or ()
        schema = self.dataset.schema
        try:
            return tuple(_to_sample(getattr(row, name)[0], name in image_fields, name, schema[name].shape)
                         for name in self.fields)
        except CodecError as exc:
            raise _located(exc, _row_where(self.dataset.store, int(indices[i]))) from None


# -- pipelines and framework iterators ---------------------------------------------------------
def make_dali_pipeline(url: Any, batch_size: int, *, image_field: str = "image", other_fields: Sequence[str] = (),
                       device_id: int | None = None, num_threads: int = 2,
                       resize: tuple[int, int] | None = None,
                       normalize: tuple[Sequence[float], Sequence[float]] | None = None,
                       layout: Literal["CHW", "HWC"] = "CHW", shard_id: int = 0, num_shards: int = 1,
                       shuffle: bool = False, parallel: bool = False, py_num_workers: int = 2,
                       py_start_method: Literal["fork", "spawn"] = "spawn", last_batch: LastBatch = "drop",
                       seed: int = 0, prefetch_queue_depth: int = 2, storage_options: dict[str, Any] | None = None,
                       start_offset: int = 0, shard_remainder: ShardRemainder = "pad") -> Pipeline:
    """A DALI pipeline: unihub source -> ``fn.decoders.image`` (RGB) -> resize -> normalize.

    Outputs, in order: the decoded images (HWC of the field's dtype, ``uint8`` or a 16-bit PNG
    field's ``uint16``; ``float32`` in ``layout`` after ``normalize``), then each of ``other_fields``;
    the names are in the pipeline's ``output_map`` attribute. ``device_id=None`` runs on the CPU; an
    int decodes with ``device='mixed'`` on that GPU. ``resize=(h, w)``; ``normalize=(mean, std)`` per
    channel on the image's scale (0-255, DALI's convention; 0-65535 for ``uint16``).
    ``parallel=True`` reads through a :class:`DaliSampleSource` in ``py_num_workers`` processes
    (``last_batch`` 'drop' or 'pad'), else a :class:`DaliBatchSource` in this process (kept as
    ``pipeline.source``; close it when done). ``start_offset`` resumes the first epoch at that sample of the shard.
    ``shard_remainder`` as the sources take it ('pad': ``ceil(N/S)`` rows a shard, wrapping; 'drop':
    ``floor``, what ``CachedDataset.stream(drop_shard_remainder=True)`` reads). The pipeline is built.
    """
    dali = _dali("DALI pipelines")
    from nvidia.dali import fn

    _check_batch(batch_size, last_batch)
    _check_shard(shard_id, num_shards)
    _check_augment(resize, normalize, layout)
    fields = [image_field, *other_fields]
    image_dtype = np.dtype(_check_schema(url, fields, image_field, storage_options)[image_field].numpy_dtype)
    if parallel:
        if last_batch == "partial":
            raise DaliBridgeError("a parallel (sample) source cannot deliver a partial batch; use 'drop' or 'pad'")
        source: Any = DaliSampleSource(url, fields, image_fields=[image_field], batch_size=batch_size,
                                       last_batch=last_batch, shard_id=shard_id, num_shards=num_shards,
                                       shuffle=shuffle, seed=seed, storage_options=storage_options,
                                       start_offset=start_offset, shard_remainder=shard_remainder)
        source.indices(0)  # a start_offset beyond the shard is refused here, not in a DALI worker
        pipe = dali.pipeline.Pipeline(batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=seed,
                                      py_num_workers=py_num_workers, py_start_method=py_start_method,
                                      prefetch_queue_depth=prefetch_queue_depth)
    else:
        source = DaliBatchSource(url, batch_size, fields, image_fields=[image_field], last_batch=last_batch,
                                 shard_id=shard_id, num_shards=num_shards, shuffle=shuffle, seed=seed,
                                 storage_options=storage_options, start_offset=start_offset,
                                 shard_remainder=shard_remainder)
        pipe = dali.pipeline.Pipeline(batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=seed,
                                      prefetch_queue_depth=prefetch_queue_depth)
    with pipe:
        if parallel:
            outputs = fn.external_source(source=source, batch=False, parallel=True, num_outputs=len(fields))
        else:
            outputs = fn.external_source(source=source, batch=True, num_outputs=len(fields), cycle="raise")
        images = decode_and_augment(outputs[0], device_id=device_id, resize=resize, normalize=normalize,
                                    layout=layout, dtype=image_dtype)
        pipe.set_outputs(images, *outputs[1:])
    pipe.build()
    pipe.source = source
    pipe.output_map = fields
    return pipe


def decode_and_augment(encoded: Any, *, device_id: int | None, resize: tuple[int, int] | None = None,
                       normalize: tuple[Sequence[float], Sequence[float]] | None = None,
                       layout: Literal["CHW", "HWC"] = "CHW", dtype: Any = np.uint8) -> Any:
    """The DALI graph after the source (inside a pipeline's scope): decode RGB, resize, normalize.

    Pixels are decoded as stored, as the readers (and Petastorm) decode them: not turned by an EXIF
    orientation tag, which DALI applies by default. ``dtype`` is the image field's: ``uint16`` decodes
    a 16-bit PNG to its own values (DALI's default, uint8, scales them down to 8 bits)."""
    from nvidia.dali import fn, types

    wide = np.dtype(dtype) == np.uint16
    images = fn.decoders.image(encoded, device="mixed" if device_id is not None else "cpu",
                               output_type=types.DALIImageType.RGB, adjust_orientation=False,
                               dtype=types.DALIDataType.UINT16 if wide else types.DALIDataType.UINT8)
    if resize is not None:
        h, w = resize
        images = fn.resize(images, resize_y=h, resize_x=w)
    if normalize is not None:
        mean, std = normalize
        images = fn.crop_mirror_normalize(images, mean=list(mean), std=list(std), dtype=types.DALIDataType.FLOAT,
                                          output_layout=layout)
    return images


def _check_schema(url: Any, fields: Sequence[str], image_field: str,
                  storage_options: dict[str, Any] | None) -> Unischema:
    """Refuse fields DALI cannot take; the dataset's schema."""
    _check_unique(fields)
    store = open_dataset(os.fspath(url) if isinstance(url, os.PathLike) else url, storage_options=storage_options)
    missing = [name for name in fields if name not in store.schema.fields]
    if missing:
        raise SchemaError(f"{store.url}: no field {missing}; fields: {list(store.schema.fields)}")
    _check_fields([store.schema[name] for name in fields], [image_field])
    return store.schema


def make_dali_torch_iterator(pipeline: Pipeline, output_map: Sequence[str] | None = None, *, size: int = -1,
                             last_batch_policy: Literal["fill", "drop", "partial"] = "fill",
                             auto_reset: bool = True) -> Any:
    """``DALIGenericIterator`` over ``pipeline``: yields ``[{name: torch.Tensor}]`` per batch.

    ``output_map`` defaults to the pipeline's (``make_dali_pipeline`` sets it). With
    ``size=-1`` the epoch ends when the unihub source does (DALI then uses 'fill');
    with ``size=N`` real samples (e.g. a padded source's ``rows_per_epoch``),
    ``'partial'`` trims the padding off the last batch. DALI counts ``size`` samples per epoch and
    goes on in the same stream, so ``size`` must be what every epoch of a unihub source holds: a
    source resumed at a ``start_offset`` (a shorter first epoch) takes ``size=-1`` (its exact epochs
    with ``last_batch='partial'``).
    """
    require("torch", extra="torch", purpose="the DALI PyTorch iterator")
    plugin = require("nvidia.dali.plugin.pytorch", extra="dali", purpose="the DALI PyTorch iterator")
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy

    policies = {"fill": LastBatchPolicy.FILL, "drop": LastBatchPolicy.DROP, "partial": LastBatchPolicy.PARTIAL}
    if last_batch_policy not in policies:
        raise DaliBridgeError(f"last_batch_policy must be one of {sorted(policies)}, got {last_batch_policy!r}")
    names = list(output_map if output_map is not None else getattr(pipeline, "output_map", ()))
    if not names:
        raise DaliBridgeError("pass output_map: the names of the pipeline's outputs, in order")
    if size >= 0:
        _check_size(size, getattr(pipeline, "source", None))
    return plugin.DALIGenericIterator([pipeline], names, size=size, auto_reset=auto_reset,
                                      last_batch_policy=policies[last_batch_policy],
                                      last_batch_padded=size >= 0)


def _check_size(size: int, source: Any) -> None:
    """Refuse a ``size`` other than the real samples of every epoch of a unihub ``source``: DALI's iterator
    would end its epochs elsewhere than the source, so that later epochs came out empty (a source with
    fewer samples) or began in the middle of one (more)."""
    if isinstance(source, DaliBatchSource):
        rows = source.rows_per_epoch
    elif isinstance(source, DaliSampleSource) and source.batch_size:
        rows = len(source)
    else:
        return
    counts = [n - n % source.batch_size if source.last_batch == "drop" else n
              for n in (rows - source.start_offset, rows)]  # the first epoch, then every other
    if set(counts) == {size}:
        return
    if counts[0] != counts[1]:
        raise DaliBridgeError(f"size={size}, but the source's first epoch, resumed at start_offset="
                              f"{source.start_offset}, holds {counts[0]} samples and the later ones {counts[1]}: "
                              "DALI's iterator counts the same size each epoch; pass size=-1 (with the source's "
                              "last_batch='partial', every epoch exact)")
    raise DaliBridgeError(f"size={size}, but every epoch of the source holds {counts[1]} samples "
                          f"(last_batch={source.last_batch!r}): pass size={counts[1]} or size=-1")


def make_dali_tf_dataset(url: Any, batch_size: int, *, image_field: str = "image", other_fields: Sequence[str] = (),
                         device_id: int | None = None, num_threads: int = 2, resize: tuple[int, int] | None = None,
                         normalize: tuple[Sequence[float], Sequence[float]] | None = None,
                         layout: Literal["CHW", "HWC"] = "CHW", shard_id: int = 0, num_shards: int = 1,
                         shuffle: bool = False, seed: int = 0, storage_options: dict[str, Any] | None = None,
                         start_offset: int = 0, shard_remainder: ShardRemainder = "pad") -> Any:
    """One epoch as a ``tf.data.Dataset`` (``nvidia.dali.plugin.tf.experimental.DALIDatasetWithInputs``).

    Yields ``(images, *other_fields)`` of exactly ``batch_size`` rows (the incomplete last
    batch is dropped). Needs the ``nvidia-dali-tf-plugin`` built for the installed
    TensorFlow. Its constraints shape the graph: external sources must have one output
    each and give dense, uniform batches, and ``cycle='raise'`` is refused so the dataset
    cannot restart; hence one source per field fed from one :class:`DaliBatchSource`,
    image bytes zero-padded to the batch's longest (PNG and JPEG decoders stop at their
    end marker and ignore the padding), and a new dataset per epoch.
    """
    require("tensorflow", extra="tf", purpose="the DALI TensorFlow dataset")
    dali_tf = require("nvidia.dali.plugin.tf", extra="dali", purpose="the DALI TensorFlow dataset (also "
                      "pip install nvidia-dali-tf-plugin-cuda120 for this TensorFlow)")
    dali = _dali("the DALI TensorFlow dataset")
    import tensorflow as tf
    from nvidia.dali import fn

    _check_batch(batch_size, "drop")
    _check_augment(resize, normalize, layout)
    fields = [image_field, *other_fields]
    schema = _check_schema(url, fields, image_field, storage_options)
    h, w = resize if resize is not None else schema[image_field].shape[:2]
    if h is None or w is None:
        raise SchemaError(f"field {image_field!r} has shape {schema[image_field].shape}; TensorFlow needs a fixed "
                          "image size: pass resize=(h, w)")
    ragged = [name for name in other_fields if None in schema[name].shape]
    if ragged:  # _dense pads bytes only: it made a ragged float field's values uint8
        raise SchemaError(f"fields {ragged} have a None dim; the TensorFlow dataset takes batches of one shape: "
                          "leave them out, or read them with make_dali_pipeline")
    stored_dtype = np.dtype(schema[image_field].numpy_dtype)
    source = DaliBatchSource(url, batch_size, fields, image_fields=[image_field], shard_id=shard_id,
                             num_shards=num_shards, shuffle=shuffle, seed=seed, storage_options=storage_options,
                             start_offset=start_offset, shard_remainder=shard_remainder)
    feed = _FanOut(iter(source), len(fields), on_end=source.close)  # one epoch: then free the workers
    pipe = dali.pipeline.Pipeline(batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=seed)
    with pipe:
        inputs = [fn.external_source(source=feed.field(k), batch=True) for k in range(len(fields))]
        images = decode_and_augment(inputs[0], device_id=device_id, resize=resize, normalize=normalize, layout=layout,
                                    dtype=stored_dtype)
        pipe.set_outputs(images, *inputs[1:])
    if normalize is not None:
        image_shape, image_dtype = ((3, h, w) if layout == "CHW" else (h, w, 3)), tf.float32
    else:
        image_shape, image_dtype = (h, w, 3), tf.as_dtype(stored_dtype)
    shapes = [(batch_size, *image_shape)] + [(batch_size, *schema[name].shape) for name in other_fields]
    dtypes = [image_dtype] + [tf.as_dtype(np.dtype(schema[name].numpy_dtype)) for name in other_fields]
    return dali_tf.experimental.DALIDatasetWithInputs(pipeline=pipe, batch_size=batch_size,
                                                      output_shapes=tuple(shapes), output_dtypes=tuple(dtypes),
                                                      device_id=device_id)


class _FanOut:
    """Serves batch ``n`` of one iterator to ``k`` single-output callbacks, whatever order they run in."""

    def __init__(self, batches: Iterator[list[list[np.ndarray]]], k: int,
                 on_end: Callable[[], None] | None = None) -> None:
        self._batches, self._k, self._on_end = batches, k, on_end
        self._calls = [0] * k
        self._held: dict[int, tuple[list[list[np.ndarray]], int]] = {}  # n -> (batch, fields still to serve)
        self._made = 0

    def field(self, k: int) -> Any:
        return lambda: self._serve(k)

    def _serve(self, k: int) -> np.ndarray:
        n = self._calls[k]
        while n >= self._made:
            try:
                self._held[self._made] = (next(self._batches), self._k)
            except StopIteration:  # ends the dataset
                if self._on_end is not None:
                    self._on_end()
                    self._on_end = None
                raise
            self._made += 1
        self._calls[k] = n + 1
        batch, left = self._held[n]
        self._held[n] = (batch, left - 1)
        if left == 1:
            del self._held[n]
        return _dense(batch[k])


def _dense(samples: list[np.ndarray]) -> np.ndarray:
    """Samples as one array; 1-D byte strings of different lengths are zero-padded to the longest."""
    if len({s.shape for s in samples}) == 1:
        return np.stack(samples)
    if not all(s.ndim == 1 and s.dtype == np.uint8 for s in samples):  # padding other values would change them
        raise DaliBridgeError(f"samples of shapes {sorted({s.shape for s in samples})} and dtype {samples[0].dtype} "
                              "make no dense batch; only encoded image bytes are padded")
    out = np.zeros((len(samples), max(len(s) for s in samples)), dtype=np.uint8)
    for row, s in enumerate(samples):
        out[row, :len(s)] = s
    return out


def iterate_epoch(pipeline: Pipeline) -> Iterator[tuple[Any, ...]]:
    """One epoch of ``pipeline.run()`` outputs as tuples of numpy batches (CPU outputs; tests, tools).

    Ends at the source's StopIteration and resets the pipeline for the next epoch.
    """
    while True:
        try:
            outputs = pipeline.run()
        except StopIteration:
            pipeline.reset()
            return
        yield tuple(_as_numpy(out) for out in outputs)


def _as_numpy(tensor_list: Any) -> list[np.ndarray]:
    if hasattr(tensor_list, "as_cpu"):
        tensor_list = tensor_list.as_cpu()
    return [np.array(tensor_list[i]) for i in range(len(tensor_list))]
