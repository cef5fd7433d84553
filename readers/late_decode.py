"""Decoding images after the shuffle: a shuffling queue holds encoded bytes, not pixels.

A shuffling loader keeps thousands of rows waiting so that a batch mixes rows from far apart.
Decoded, each 64x64 RGB row is 12 KB, the queue must fill with decoded rows before the first
batch, and every row is copied into the queue and out again. Encoded, a row is its JPEG/PNG file
(~2 KB here): the queue fills after a read, not after thousands of decodes, and takes a fifth of
the memory. tf.data shuffles serialized records before parsing them for the same reason.

The reader hands out the image fields encoded (:meth:`unihub.readers.reader.Reader.images_decoded_later`)
with one more column, :data:`SOURCE_ROW` (each row's row number in the dataset), and the
loader decodes each batch it draws, a few batches ahead on a small thread pool
(:class:`DecodeAhead`). The values are those the reader would have decoded, through the same
column loop (:meth:`~unihub.schema.codecs.CompressedImageCodec.decode_blobs`, straight from the
queued bytes), and a corrupt image is reported with its file, row group and row, as the reader
reports it; with the reader's ``on_decode_error='skip'`` its row is dropped from the drawn batch
(a row short) and counted in the reader's diagnostics.
"""

from __future__ import annotations

import bisect
import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import CancelledError, Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from unihub.errors import CodecError
from unihub.readers.batching import take_columns
from unihub.readers.decode import DecodePolicy, DecodeSkips, OnDecodeError, decode_images, undecodable_rows
from unihub.readers.loader import SOURCE_ROW, located
from unihub.schema.codecs import CompressedImageCodec
from unihub.schema.unischema import UnischemaField
from unihub.store.dataset import ParquetStore

Columns = dict[str, Any]


@dataclass(frozen=True)
class LateImages:
    """Image fields a reader handed out encoded, and how to decode them as the reader would have."""

    store: ParquetStore
    fields: tuple[UnischemaField, ...]
    policy: DecodePolicy
    #: threads to decode with (the reader's workers, at most one per core)
    threads: int
    #: the reader's: raise on an image that does not decode, or drop its row (readers/decode.py)
    on_decode_error: OnDecodeError = "raise"
    #: the reader's count of rows dropped, which this adds to
    skips: DecodeSkips = field(default_factory=DecodeSkips, compare=False)
    #: the reader's worker threads while they run (:meth:`~unihub.readers.workers.Pool.threads_to_share`),
    #: which decode too: reading and decoding on the same threads makes ~25% fewer context switches than
    #: a pool of each (a 2-core machine: make_tf_dataset, shuffled, 3-5% less CPU per row)
    reader_threads: Callable[[], Executor | None] = field(default=lambda: None, compare=False)

    @property
    def columns(self) -> frozenset[str]:
        """The columns that come encoded, and :data:`SOURCE_ROW`."""
        return frozenset([f.name for f in self.fields] + [SOURCE_ROW])

    def decode(self, columns: Mapping[str, Any], into: Mapping[str, np.ndarray] | None = None) -> Columns:
        """``columns`` with their images decoded and :data:`SOURCE_ROW` dropped; with
        ``on_decode_error='skip'``, without the rows whose images do not decode. A fixed-shape image
        field is decoded into ``into[name]`` where that is the array its column would be (a batch's
        room in a torch worker's shared memory); a batch with rows dropped gets new memory."""
        try:
            return self._decode(columns, into)
        except CodecError:
            if self.on_decode_error != "skip":
                raise
            bad = undecodable_rows(self.fields, {f.name: _blobs(columns[f.name]) for f in self.fields})
            if not bad:  # no row fails on its own: not a corrupt image
                raise
        dropped = sorted(bad)
        self.skips.add([str(self._located(bad[row], columns[SOURCE_ROW])) for row in dropped])
        keep = np.setdiff1d(np.arange(len(columns[SOURCE_ROW]), dtype=np.int64), dropped)
        return self._decode(take_columns(columns, keep))

    def _decode(self, columns: Mapping[str, Any], into: Mapping[str, np.ndarray] | None = None) -> Columns:
        out = {name: column for name, column in columns.items() if name != SOURCE_ROW}
        for f in self.fields:
            try:
                out[f.name] = decode_images(f, _blobs(columns[f.name]), policy=self.policy,
                                            into=into.get(f.name) if into else None)
            except CodecError as exc:
                raise self._located(exc, columns[SOURCE_ROW]) from exc
        return out

    def _located(self, exc: CodecError, source_rows: Sequence[int]) -> CodecError:
        """``exc`` (a row of the decoded batch) with the file, row group and row it came from."""
        if exc.row is None or not 0 <= exc.row < len(source_rows):
            return exc
        first_rows = [info.first_row for info in self.store.row_groups]  # only on an error
        dataset_row = int(source_rows[exc.row])
        info = self.store.row_groups[bisect.bisect_right(first_rows, dataset_row) - 1]
        rows = np.asarray(source_rows, dtype=np.int64) - info.first_row
        return located(exc, info, rows)


def _blobs(column: Sequence[Any]) -> list[Any]:
    """An encoded image column's values as the decoders take them: the numpy views of the file that
    :func:`~unihub.readers.loader.encoded_images` hands out (untracked by the garbage collector while a
    queue holds them) as memoryviews, for the moment of decoding."""
    return [value.data if type(value) is np.ndarray else value for value in column]


#: the decoded image bytes of one batch from which a loader cuts its batches from encoded rows and decodes each
#: whole into its own memory; below it, the reader decodes and batches are sliced from its decode tasks' (and
#: joined where they straddle two). Measured (CPU per 100,000 rows, unshuffled, alternated): 64x64 JPEG, 64-row
#: batches of 0.8 MiB: cutting costs BatchedDataLoader 4.3-4.5 -> 4.7 s and make_tf_dataset 5.0 -> 6.0 s;
#: 256x256, 12 MiB batches: it saves 10-30% (the joins' and TensorFlow's copies of big fresh pages).
CUT_MIN_BATCH_BYTES = 4 * 2**20


def cut_pays(fields: Iterable[UnischemaField], batch_size: int | None) -> bool:
    """Whether batches of ``batch_size`` rows of ``fields`` are cut encoded and decoded whole: their
    images' decoded bytes reach :data:`CUT_MIN_BATCH_BYTES`, or an image's size is not fixed (no batches: no)."""
    if not batch_size:
        return False
    total = 0
    for f in fields:
        if not isinstance(f.codec, CompressedImageCodec):
            continue
        dims = [d for d in f.shape if d is not None]
        if len(dims) < len(f.shape):
            return True
        total += int(np.prod(dims, dtype=np.int64)) * np.dtype(f.numpy_dtype).itemsize
    return total * batch_size >= CUT_MIN_BATCH_BYTES


def decoded_later(reader: Any, wanted: bool = True) -> contextlib.AbstractContextManager[LateImages | None]:
    """``reader.images_decoded_later()`` where ``wanted`` and the reader has it (a unihub
    :class:`~unihub.readers.reader.Reader`), else a block that yields None: the reader decodes."""
    later = getattr(reader, "images_decoded_later", None)
    if wanted and later is not None:
        return cast("contextlib.AbstractContextManager[LateImages | None]", later())
    return contextlib.nullcontext()


@dataclass(eq=False)
class _Job:
    """A batch :class:`DecodeAhead` decodes: its key, columns and memory, and its decode."""

    key: Any
    columns: Mapping[str, Any]
    into: Mapping[str, np.ndarray] | None
    future: Future[Columns] | None = None


class DecodeAhead:
    """Decodes batches' encoded images on :attr:`LateImages.threads` threads, in the order given.

    :meth:`submit` queues a batch (with a key: its rows' positions, say); :meth:`ready` hands
    back decoded batches, oldest first, while more than :attr:`ahead` are queued, so that many are
    decoding while the consumer uses one; :meth:`drain` hands back the rest. :meth:`keys` are the
    queued batches' keys. The batches decode on the reader's worker threads while it has them
    (:attr:`LateImages.reader_threads`), else, and once its pool stopped (the end of its rows, with the
    queue's last draws still to decode), on threads of this one's own.
    """

    def __init__(self, late: LateImages) -> None:
        self._late = late
        self._threads = max(1, late.threads)
        #: batches kept decoding ahead of the consumer (two per thread)
        self.ahead = 2 * self._threads
        self._pool: ThreadPoolExecutor | None = None  # made when the reader's threads are not there
        self._jobs: deque[_Job] = deque()

    def submit(self, key: Any, columns: Mapping[str, Any], into: Mapping[str, np.ndarray] | None = None) -> None:
        """Queue ``columns`` to decode (their fixed-shape images into ``into``'s arrays where given)."""
        job = _Job(key, columns, into)
        self._jobs.append(job)
        executor = self._late.reader_threads()
        if executor is not None:
            try:
                job.future = executor.submit(self._late.decode, columns, into)
                return
            except RuntimeError:  # the reader's pool stopped since it was handed out
                pass
        self._decode_here()

    def _decode_here(self) -> None:
        """Start, in order, on this one's own threads, every queued batch not started yet or whose decode
        the stop of the reader's pool cancelled (queued there when its rows ended)."""
        for job in self._jobs:
            if job.future is None or job.future.cancelled():
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="unihub-decode")
                job.future = self._pool.submit(self._late.decode, job.columns, job.into)

    def keys(self) -> list[Any]:
        return [job.key for job in self._jobs]

    def ready(self) -> Iterator[tuple[Any, Columns]]:
        """``(key, decoded columns)`` of the oldest batches until :attr:`ahead` are left queued."""
        return self._handed_back(self.ahead)

    def drain(self) -> Iterator[tuple[Any, Columns]]:
        """``(key, decoded columns)`` of every batch queued, oldest first."""
        return self._handed_back(0)

    def _handed_back(self, keep: int) -> Iterator[tuple[Any, Columns]]:
        while len(self._jobs) > keep:
            job = self._jobs[0]
            assert job.future is not None
            try:
                decoded = job.future.result()  # a decode error is raised here, in the consumer
            except CancelledError:  # queued on the reader's threads when its pool stopped
                self._decode_here()
                continue
            self._jobs.popleft()
            yield job.key, decoded

    def close(self) -> None:
        """Cancel what has not started and wait for what has (a batch's decode: milliseconds)."""
        jobs = [job.future for job in self._jobs if job.future is not None]
        self._jobs.clear()
        for future in jobs:
            # not concurrent.futures.wait: a future cancelled in a queue no thread will take again (the
            # reader's stopped pool) is never "notified", and wait() would wait for it for ever
            if not future.cancel():
                with contextlib.suppress(CancelledError):
                    future.exception()  # running: wait for it
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> DecodeAhead:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
