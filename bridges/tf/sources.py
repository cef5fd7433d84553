"""What TensorFlow's generators read: the readers they serve (stopped when the program ends, so that an
unfinished ``tf.data`` iterator cannot hang the exit) and the numpy stages between a reader and
TensorFlow (columns, shuffled, decoded late, re-batched), each a small function over an iterator.
"""

from __future__ import annotations

import atexit
import itertools
import math
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from unihub.bridges.tf.dataset_type import Failures
from unihub.bridges.tf.emitted import Emitted
from unihub.bridges.tf.encode import rows_to_columns
from unihub.bridges.tf.plans import Columns, FieldPlan
from unihub.errors import UnihubError
from unihub.readers.batching import ARRIVAL_ROWS, Rebatcher, ShuffleBuffer, columns_length, slice_columns
from unihub.readers.late_decode import DecodeAhead
from unihub.readers.loader import SOURCE_ROW
from unihub.readers.reader import Reader
from unihub.schema.arrow_numpy import ALIGNMENT, OVERSIZE_BYTES
from unihub.schema.codecs import image_pixels_allowed
from unihub.schema.shapes import fixed_dims

if TYPE_CHECKING:
    from unihub.readers.late_decode import LateImages


#: rows a row reader's output is gathered into before crossing into TensorFlow
ROW_CHUNK = 256


# -- readers TensorFlow pulls from, stopped when the program ends --------------------------------
_served: weakref.WeakSet[Any] = weakref.WeakSet()  # readers the generators are reading
_generators: weakref.WeakSet[Any] = weakref.WeakSet()  # generators TensorFlow holds
_last_pull = [0.0]  # when a generator was last resumed or left (monotonic)
_lock = threading.Lock()
_exit_hook: list[bool] = []
EXIT_WAIT_S = 2.0  # the most the exit hook waits for the generators to end
QUIET_S = 0.05  # no generator resumed for this long: TensorFlow is not pulling


def _stop_served_readers() -> None:
    """At exit, stop the readers TensorFlow's generators read and let the generators end.

    A ``tf.data`` iterator the program leaves unfinished is destroyed while the interpreter
    finalizes, after waiting for its prefetch thread; when that thread is inside the generator
    (or about to enter it, or to finalize it) it needs Python, which finalization no longer runs:
    the process hung at exit. This runs first thing at shutdown (before thread pools are shut
    down): the readers stop, a generator resumed then ends, and TensorFlow finalizes it while
    Python still runs. A generator TensorFlow is not pulling from (its prefetch buffer full)
    stays suspended; the iterator's destruction does not need Python then.
    """
    with _lock:
        readers = list(_served)
    for reader in readers:
        reader.stop()
    deadline = time.monotonic() + EXIT_WAIT_S
    while time.monotonic() < deadline:
        with _lock:
            if not len(_generators) or time.monotonic() - _last_pull[0] > QUIET_S:
                return
        time.sleep(0.005)


def _register_exit_hook() -> None:
    with _lock:
        if _exit_hook:
            return
        _exit_hook.append(True)
    # threading's own exit hooks run before the interpreter joins threads and shuts thread pools
    # down (the reader's among them), atexit's only after
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise AttributeError
        register(_stop_served_readers)
    except (AttributeError, RuntimeError):
        atexit.register(_stop_served_readers)


def _pulled() -> None:
    _last_pull[0] = time.monotonic()


def tracked(make: Callable[[], Generator[Any, None, None]], failures: Failures) -> Callable[[], Iterator[Any]]:
    """``make`` (a ``from_generator`` generator function), its generators known to the exit hook,
    which also sees when TensorFlow last resumed one, and the unihub errors they raise recorded in
    ``failures`` for the dataset's iterators (:func:`~unihub.bridges.tf.dataset_type.bridged`)."""
    def pull() -> Iterator[Any]:
        inner = make()
        try:
            for item in inner:
                _pulled()
                yield item
                _pulled()
        except UnihubError as exc:
            failures.record(exc)
            raise
        finally:
            _pulled()
            inner.close()

    def generator() -> Iterator[Any]:
        _register_exit_hook()
        outer = pull()
        with _lock:
            _generators.add(outer)
        return outer
    return generator


def serving(reader: Any, batches: Iterator[Any]) -> Generator[Any, None, None]:
    """``batches`` of ``reader``, with the reader known to the exit hook while they are read."""
    with _lock:
        _served.add(reader)
    try:
        yield from batches
    finally:
        with _lock:
            _served.discard(reader)


# -- numpy stages: reader batches -> columns -> shuffled -> decoded -> re-batched ----------------------
def column_batches(reader: Reader, plans: Sequence[FieldPlan], chunk_rows: int) -> Iterator[Columns]:
    """The reader's batches as columns; a row reader's rows gathered ``chunk_rows`` at a time."""
    return serving(reader, _columns_of(reader, plans, chunk_rows))


def _columns_of(reader: Reader, plans: Sequence[FieldPlan], chunk_rows: int) -> Iterator[Columns]:
    names = [p.name for p in plans]
    if reader.batched:
        for batch in reader:
            columns = dict(zip(names, batch))
            if len(batch) > len(names):  # the reader decodes its images later: the rows' sources
                columns[SOURCE_ROW] = batch[-1]
            yield columns
        return
    while True:
        rows = list(itertools.islice(reader, chunk_rows))
        if not rows:
            return
        yield rows_to_columns(plans, rows)


def shuffled(batches: Iterator[Columns], capacity: int, rng: np.random.Generator,
             emitted: Emitted | None = None) -> Iterator[Columns]:
    """Rows shuffled through a buffer of ``capacity`` rows: each arriving batch lets out a random
    sample of the buffer, so no row leaves before ``capacity`` others have arrived (as tf.data's).
    ``emitted`` records the stream positions of the rows let out, in order."""
    buffer = ShuffleBuffer(reserve=capacity + ARRIVAL_ROWS)
    arrived = 0
    for columns in batches:
        n = columns_length(columns)
        buffer.add(columns, np.arange(arrived, arrived + n, dtype=np.int64))
        arrived += n
        extra = buffer.size - capacity
        if extra > 0:
            yield _let_out(buffer, extra, rng, emitted)
    if buffer.size:
        yield _let_out(buffer, buffer.size, rng, emitted)


def _let_out(buffer: ShuffleBuffer, count: int, rng: np.random.Generator, emitted: Emitted | None) -> Columns:
    columns, positions = buffer.take_random(count, rng)
    if emitted is not None:
        emitted.add(positions)
    return columns


#: pieces of a :class:`RecycledRoom` kept beyond the batches decoding: those in TensorFlow's prefetch
#: buffer and the one the model holds
RECYCLED_BEYOND_AHEAD = 6

#: rows decoded in one piece after a shuffle: the queue's last draw (all it holds) is cut so
#: that every thread decodes a share of it, not one thread the whole of it
DECODE_PIECE_ROWS = 512


class RecycledRoom:
    """Memory for decoded image batches, each piece reused once nothing references it any more.

    TensorFlow sets glibc's trim threshold when it runs a generator (``M_TRIM_THRESHOLD``), which
    fixes the mmap threshold at 128 KB: every large array is then new pages, mapped and zeroed by the
    kernel (256x256 images, 64-row batches of 12 MiB: ~30 ms of system time per 1,000 rows). A batch
    handed to TensorFlow keeps its array referenced (TensorFlow holds the array, or copied it); once
    only this pool refers to a piece, no batch views it and it is refilled. At most ``keep`` pieces.
    """

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._pieces: list[np.ndarray] = []

    def array(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised aligned array of ``shape``: a free piece's, or new memory (kept if there is room)."""
        size = math.prod(shape) * np.dtype(dtype).itemsize
        piece = next((p for p in self._pieces if p.nbytes == size + ALIGNMENT and sys.getrefcount(p) == _UNVIEWED),
                     None)
        if piece is None:
            piece = np.empty(size + ALIGNMENT, np.uint8)
            if len(self._pieces) < self._keep:
                self._pieces.append(piece)
        start = -piece.ctypes.data % ALIGNMENT
        return piece[start:start + size].view(dtype).reshape(shape)


#: ``sys.getrefcount`` of a piece of :class:`RecycledRoom` that no array views: the pool's list, the
#: generator expression's variable and the call's argument
_UNVIEWED = 3


def _room_for(late: LateImages, columns: Columns, room: RecycledRoom) -> dict[str, np.ndarray]:
    """Arrays from ``room`` for ``columns``' fixed-shape images of at least :data:`OVERSIZE_BYTES` a batch."""
    n = columns_length(columns)
    out = {}
    for f in late.fields:
        if f.is_fixed_shape and n and image_pixels_allowed(f) and \
                n * math.prod(fixed_dims(f.shape)) * np.dtype(f.dtype).itemsize >= OVERSIZE_BYTES:
            out[f.name] = room.array((n, *fixed_dims(f.shape)), f.dtype)
    return out


def decode_late(batches: Iterator[Columns], late: LateImages, whole: bool = False) -> Iterator[Columns]:
    """``batches`` whose images came encoded, decoded a few ahead on ``late.threads`` threads (in pieces
    of at most :data:`DECODE_PIECE_ROWS` rows, unless ``whole``: cut batches that must stay as they are,
    whose large image columns are decoded into a :class:`RecycledRoom`)."""
    piece = DECODE_PIECE_ROWS if not whole else None
    with DecodeAhead(late) as decoder:
        room = RecycledRoom(keep=decoder.ahead + RECYCLED_BEYOND_AHEAD) if whole else None
        for columns in batches:
            n = columns_length(columns)
            if room is not None:
                decoder.submit(None, columns, _room_for(late, columns, room))
                yield from (decoded for _, decoded in decoder.ready())
                continue
            for start in range(0, n, piece or max(n, 1)):
                decoder.submit(None, slice_columns(columns, start, start + piece) if piece and n > piece else columns)
                yield from (decoded for _, decoded in decoder.ready())
        yield from (decoded for _, decoded in decoder.drain())


def rebatched(batches: Iterator[Columns], size: int, drop_remainder: bool) -> Iterator[Columns]:
    """Batches of exactly ``size`` rows (the last may be smaller unless ``drop_remainder``)."""
    return (batch for batch, _ in Rebatcher(size).batches(batches, drop_remainder))


#: warned when a dataset of make_petastorm_dataset is iterated again after it read its reader to the end
#: (Petastorm's words, which its users' tests match)
READ_AGAIN_WARNING = ("Running multiple iterations over make_petastorm_dataset is not recommend for performance "
                      "issue: each iteration resets the reader and reads it again. Use the reader's num_epochs "
                      "to read it several times, or the dataset's cache() before repeat()")


def read_again(reader: Any) -> Callable[[Callable[[], Iterator[Any]]], Callable[[], Generator[Any, None, None]]]:
    """A source of ``reader``'s batches that, started again once an earlier start read the reader to the
    end (a second iteration of the dataset, ``repeat()``), warns and resets the reader first, as
    Petastorm's ``make_petastorm_dataset`` did: an ended reader would give an empty iteration. A source
    left part way (``take(n)``) goes on where the reader is."""
    def wrap(source: Callable[[], Iterator[Any]]) -> Callable[[], Generator[Any, None, None]]:
        read_to_the_end = [False]

        def read() -> Generator[Any, None, None]:
            if read_to_the_end[0]:
                warnings.warn(READ_AGAIN_WARNING, UserWarning, stacklevel=2)
                reader.reset()
                read_to_the_end[0] = False
            yield from source()
            read_to_the_end[0] = True
        return read
    return wrap
