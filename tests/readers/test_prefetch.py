"""The read-ahead of remote row groups (readers/prefetch.py): bounded by bytes, first batch before the
rest is fetched, the same rows in the same order, exact resume while fetches are in flight, and a
close that cancels what has not started and leaves no thread.

A "remote" filesystem here is fsspec's local one under another protocol name (unihub takes any
protocol but ``file``/``local`` for a remote one), whose ``cat_file`` can be slowed and counted;
one test reads through moto's S3 server, by both of unihub's S3 filesystems.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from unihub import ScalarCodec, Unischema, UnischemaField, write_dataset
from unihub.errors import InvalidArgumentError, RemoteStorageError
from unihub.readers.prefetch import ByteBudget
from unihub.readers.reader import make_batch_reader, make_reader

fsspec_local = pytest.importorskip("fsspec.implementations.local")

ROWS, ROWS_PER_GROUP, CELL = 400, 20, 4096
SCHEMA = Unischema("Prefetch", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("blob", np.bytes_, (), ScalarCodec(pa.binary()), False),
])


class SlowFiles(fsspec_local.LocalFileSystem):
    """Local files as a remote store: each ranged read waits ``delay`` seconds and is counted."""

    protocol = ("slowfile",)
    cachable = False

    def __init__(self, delay: float = 0.0, fail: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delay, self.fail = delay, fail
        self.open_delay = 0.0  # each file opened (not a ranged read) waits this long
        self.reads: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        with self.lock:
            self.reads.append((start or 0, end or 0))
        if self.fail:
            raise ConnectionError("the store went away")
        time.sleep(self.delay)
        with open(self._strip_protocol(path), "rb") as f:  # not through _open, which an open waits in
            f.seek(start or 0)
            return f.read((end - (start or 0)) if end is not None else -1)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if self.open_delay:
            time.sleep(self.open_delay)
        return super()._open(path, mode=mode, **kwargs)

    @property
    def fetched(self) -> int:
        with self.lock:
            return sum(end - start for start, end in self.reads)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """20 row groups of ~80 KB (random, incompressible bytes), one file."""
    path = tmp_path_factory.mktemp("prefetch") / "ds"
    rng = np.random.default_rng(0)
    batches = ({"id": np.arange(start, start + ROWS_PER_GROUP),
                "blob": [rng.bytes(CELL) for _ in range(ROWS_PER_GROUP)]}
               for start in range(0, ROWS, ROWS_PER_GROUP))
    write_dataset(path, SCHEMA, batches, batched=True, row_group_size_mb=ROWS_PER_GROUP * CELL / 2**20 * 0.9)
    return path


def ids(reader: Any) -> list[int]:
    with reader:
        return [int(i) for batch in reader for i in batch.id]


def group_bytes(dataset: Path) -> int:
    import pyarrow.parquet as pq

    (file,) = dataset.glob("*.parquet")
    meta = pq.ParquetFile(file).metadata
    assert meta.num_row_groups >= 10
    return max(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))


def test_same_rows_and_order_as_without(dataset: Path) -> None:
    """Shuffled, the read-ahead delivers the rows a local read delivers, in the same order, each row
    group fetched once, all from memory (no read besides the fetched ranges)."""
    expected = ids(make_batch_reader(dataset, seed=3, num_epochs=2))
    fs = SlowFiles()
    reader = make_batch_reader(str(dataset), filesystem=fs, seed=3, num_epochs=2)
    assert ids(reader) == expected
    stats = reader.read_ahead
    assert stats is not None and stats.taken == stats.row_groups and stats.dropped == 0
    assert stats.row_groups == 2 * len(reader.store.row_groups)
    without = make_batch_reader(str(dataset), filesystem=SlowFiles(), seed=3, num_epochs=2, read_ahead_mb=0)
    assert ids(without) == expected and without.read_ahead is None


def test_bytes_in_flight_bounded(dataset: Path) -> None:
    """Held bytes never pass the bound (one row group always goes), however slow the consumer."""
    largest = group_bytes(dataset)
    bound = 2.5 * largest / 2**20
    reader = make_batch_reader(str(dataset), filesystem=SlowFiles(), read_ahead_mb=bound, shuffle_row_groups=False)
    with reader:
        for _ in reader:
            time.sleep(0.005)  # a slow consumer: the read-ahead fills up to its bound
    stats = reader.read_ahead
    assert stats is not None
    assert largest < stats.peak_bytes <= bound * 2**20
    one = make_batch_reader(str(dataset), filesystem=SlowFiles(), read_ahead_mb=0.001)
    assert len(ids(one)) == ROWS
    assert one.read_ahead is not None and one.read_ahead.peak_bytes <= largest * 1.2  # one at a time


def test_first_batch_before_the_whole_file(dataset: Path) -> None:
    """The first batch comes when its row group has arrived, not when the read-ahead window has."""
    fs = SlowFiles(delay=0.05)
    total = sum(p.stat().st_size for p in dataset.glob("*.parquet"))
    reader = make_batch_reader(str(dataset), filesystem=fs, shuffle_row_groups=False, read_ahead_mb=1)
    with reader:
        first = next(reader)
        assert int(first.id[0]) == 0
        assert fs.fetched < total / 2
        rest = sum(len(batch.id) for batch in reader)
    assert len(first.id) + rest == ROWS


@pytest.mark.parametrize("make", [make_reader, make_batch_reader])
def test_resume_exact_while_fetches_in_flight(dataset: Path, make: Any) -> None:
    """A state taken mid-epoch while fetches are under way resumes at the next item, exactly."""
    def items(reader: Any) -> list[int]:
        return [int(x.id) if make is make_reader else int(x.id[0]) for x in reader]

    full = items(make(dataset, seed=5, num_epochs=1))
    reader = make(str(dataset), filesystem=SlowFiles(delay=0.02), seed=5, num_epochs=1)
    taken = [int(x.id) if make is make_reader else int(x.id[0]) for _, x in zip(range(len(full) // 3), reader)]
    state = reader.state_dict()
    assert reader.read_ahead is not None and reader.read_ahead.row_groups > reader.read_ahead.taken  # in flight
    reader.stop()
    reader.join()
    resumed = make(str(dataset), filesystem=SlowFiles(), seed=5, num_epochs=1, resume_from=state)
    with resumed:
        assert taken + items(resumed) == full


def test_close_cancels_and_leaves_no_threads(dataset: Path) -> None:
    """Stopping the reader cancels the fetches not started and joins the fetch threads."""
    fs = SlowFiles(delay=0.1)
    before = {t.ident for t in threading.enumerate()}
    reader = make_batch_reader(str(dataset), filesystem=fs, shuffle_row_groups=False, read_ahead_mb=64)
    next(reader)
    reader.stop()
    reader.join()
    started = len(fs.reads)
    time.sleep(0.3)
    assert len(fs.reads) == started  # nothing started after the close
    assert started < len(reader.store.row_groups)  # the rest was cancelled, not fetched
    left = [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert not [name for name in left if "prefetch" in name or "worker" in name], left


def test_failed_fetch_is_a_remote_error(dataset: Path) -> None:
    """A GET of the read-ahead that fails raises in the reader as the read would have: RemoteStorageError."""
    from unihub import open_dataset

    fs = SlowFiles()
    store = open_dataset(str(dataset), filesystem=fs)
    fs.fail = True  # after the footers are read, before the reader (and its read-ahead) begins
    reader = make_batch_reader(store)
    with reader, pytest.raises(RemoteStorageError, match="slowfile://"):
        next(reader)


def test_not_used_where_it_cannot_help(dataset: Path) -> None:
    """Local data, process workers and the local-disk cache read as before; a bad bound is refused."""
    assert make_batch_reader(dataset).read_ahead is None
    local = make_batch_reader(dataset)
    ids(local)
    assert local.read_ahead is None
    process = make_batch_reader(str(dataset), filesystem=SlowFiles(), reader_pool_type="process", workers_count=1)
    assert len(ids(process)) == ROWS and process.read_ahead is None
    with pytest.raises(InvalidArgumentError, match="read_ahead_mb"):
        make_batch_reader(dataset, read_ahead_mb=-1)


def test_byte_budget() -> None:
    budget = ByteBudget(100)
    assert budget.try_acquire(150)  # nothing held: one item always goes
    assert not budget.try_acquire(1)
    budget.release(150)
    assert budget.try_acquire(60) and budget.try_acquire(40) and not budget.try_acquire(1)
    stop = threading.Event()
    stop.set()
    assert not budget.acquire(10, stop)
    assert budget.peak == 150


@pytest.mark.parametrize("kind", ["fsspec", "pyarrow"])
def test_s3_one_get_per_part(s3_server: Any, dataset: Path, kind: str) -> None:
    """Over moto's S3: the rows of the local read, each row group's bytes in one ranged GET (no HEAD
    or re-read per row group), nothing fetched twice."""
    access = s3_server.access(kind)
    prefix = f"prefetch-{uuid.uuid4().hex[:8]}"
    url = s3_server.upload_folder(dataset, prefix)
    s3_server.requests.clear()
    reader = make_batch_reader(url, shuffle_row_groups=False, **access)
    assert ids(reader) == list(range(ROWS))
    spans = [span for group in range(len(reader.store.row_groups)) for span in reader.store.chunk_spans(group)]
    data_end = max(stop for _, stop in spans)
    gets = [r for r in s3_server.requests.object_reads(f"{s3_server.bucket}/{prefix}/") if r[0].endswith(".parquet")]
    starts = [int(byte_range.split("=")[1].split("-")[0]) for _, byte_range in gets if byte_range]
    assert len(starts) == len(gets)  # every GET ranged
    assert len([start for start in starts if start < data_end]) == len(reader.store.row_groups)  # besides the footer's


def test_open_reads_metadata_and_footers_at_once(tmp_path: Path) -> None:
    """Opening a remote dataset reads ``_common_metadata`` and the footers at the same time, a footer
    by one ranged read of the file's tail: one wait of the store, not one after the other."""
    from unihub import open_dataset

    write_dataset(tmp_path / "ds", SCHEMA, {"id": np.arange(10), "blob": [b"x"] * 10}, batched=True)
    fs = SlowFiles(delay=0.5)
    fs.open_delay = 0.5
    started = time.monotonic()
    store = open_dataset(str(tmp_path / "ds"), filesystem=fs)
    seconds = time.monotonic() - started
    assert store.num_rows == 10
    (size,) = [p.stat().st_size for p in (tmp_path / "ds").glob("*.parquet")]
    common = (tmp_path / "ds" / "_common_metadata").stat().st_size
    assert sorted(fs.reads) == sorted([(0, size), (0, common)])  # the whole tail of each small file, in one read
    assert seconds < 0.9, f"{seconds:.2f} s: read one after the other"


def test_s3_open_reads_each_footer_in_one_get(s3_server: Any, dataset: Path) -> None:
    """Opening over s3fs reads a data file's footer with one ranged GET of its tail, no HEAD of it."""
    pytest.importorskip("s3fs")
    from unihub import open_dataset

    prefix = f"footer-{uuid.uuid4().hex[:8]}"
    url = s3_server.upload_folder(dataset, prefix)
    s3_server.requests.clear()
    store = open_dataset(url, storage_options=s3_server.storage_options())
    assert store.num_rows == ROWS
    (data_file,) = [f.path for f in store.files]
    touching = [(method, byte_range) for method, path, byte_range in s3_server.requests.entries
                if path.endswith(data_file.rsplit("/", 1)[1])]
    assert [method for method, _ in touching] == ["GET"] * len(touching) and 1 <= len(touching) <= 2, touching
    assert touching[0][1] is not None and touching[0][1].startswith("bytes=")


def test_read_ahead_begins_when_the_reader_is_made(dataset: Path) -> None:
    """The first row group's GETs go out when the reader is made, not at the first ``next()``; the rows
    are those of a reader that began at its first ``next()``."""
    fs = SlowFiles()
    reader = make_batch_reader(str(dataset), filesystem=fs, shuffle_row_groups=False)
    opened = len(fs.reads)  # the footers'
    deadline = time.monotonic() + 10
    while len(fs.reads) == opened and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(fs.reads) > opened, "no row group fetched before next()"
    assert reader.read_ahead is not None and reader.read_ahead.requests >= 1
    assert ids(reader) == list(range(ROWS))


def test_read_ahead_begun_early_is_dropped_where_the_reader_moves(dataset: Path) -> None:
    """A reader moved before its first ``next()`` (seek, a state loaded) reads from where it was moved
    to, not what its early read-ahead began with; one stopped before reading leaves no fetch thread."""
    expected = ids(make_batch_reader(dataset, shuffle_row_groups=False))
    moved = make_batch_reader(str(dataset), filesystem=SlowFiles(), shuffle_row_groups=False)
    moved.seek(5 * ROWS_PER_GROUP)
    assert ids(moved) == expected[5 * ROWS_PER_GROUP:]
    other = make_batch_reader(dataset, seed=3)
    shuffled = make_batch_reader(str(dataset), filesystem=SlowFiles(), seed=1)
    shuffled.load_state_dict(other.state_dict())  # another seed: another order, from (0, 0) too
    assert ids(shuffled) == ids(other)
    before = {t.ident for t in threading.enumerate()}
    unread = make_batch_reader(str(dataset), filesystem=SlowFiles(delay=0.05), read_ahead_mb=64)
    unread.stop()
    unread.join()
    left = [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert not [name for name in left if "prefetch" in name], left


@pytest.mark.parametrize("kind", ["pyarrow", "fsspec"])
def test_s3_open_in_one_listing(s3_server: Any, dataset: Path, kind: str) -> None:
    """Opening a dataset over S3 lists it once, and asks for no file the listing shows is not there (the
    directory check's HEAD, the manifest, version records, column sets): then the footers' reads."""
    from unihub import open_dataset

    access = s3_server.access(kind)
    prefix = f"open-{uuid.uuid4().hex[:8]}"
    url = s3_server.upload_folder(dataset, prefix)
    s3_server.requests.clear()
    store = open_dataset(url, **access)
    assert store.num_rows == ROWS
    requests = list(s3_server.requests.entries)
    listings = [path for method, path, _ in requests if method == "GET" and path.strip("/") == s3_server.bucket]
    others = [(method, path) for method, path, _ in requests if path.strip("/") != s3_server.bucket]
    # s3fs's directory check under pyarrow's wrapper is a listing of its own
    assert len(listings) == (1 if kind == "pyarrow" else 2), requests
    assert all(path.rsplit("/", 1)[1] in ("_common_metadata", *(f.path.rsplit("/", 1)[1] for f in store.files))
               for _, path in others), others


def test_one_worker_per_core_where_the_read_ahead_waits(dataset: Path) -> None:
    """Remote data fetched ahead is decoded by one worker per core (the fetch threads wait on the
    network); read without the read-ahead, four per core wait for it."""
    from unihub.readers.workers import usable_cores

    cores = usable_cores()
    ahead = make_batch_reader(str(dataset), filesystem=SlowFiles())
    without = make_batch_reader(str(dataset), filesystem=SlowFiles(), read_ahead_mb=0)
    assert (ahead._workers_count, without._workers_count) == (cores, 4 * cores)
    for reader in (ahead, without):
        reader.stop()
        reader.join()
