"""Object-store faults while reading: transient ones are retried with backoff, per request; after the
bound a RemoteStorageError names the file; a reader's state taken before a failure resumes after it.

The faults come from :class:`FlakyProxy` (``flaky_proxy.py``) between the client and moto's server:
503 Slow Down (throttling), 500, and connections reset, on a schedule of object GETs, on both S3
paths (fsspec/s3fs and pyarrow's S3FileSystem).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import pytest

pytest.importorskip("moto")
pytest.importorskip("boto3")
pytest.importorskip("s3fs")

from unihub import open_dataset, write_dataset  # noqa: E402
from unihub.errors import RemoteStorageError  # noqa: E402
from unihub.readers.reader import make_reader  # noqa: E402

from .flaky_proxy import FlakyProxy  # noqa: E402
from .sample import sample_row, sample_schema  # noqa: E402
from .test_remote_faults import through  # noqa: E402

TIMEOUT, RETRIES = 2.0, 2
N = 40
SCHEMA = sample_schema("Retries")
KINDS = ["fsspec", "pyarrow"]
#: a request that fails every attempt: the attempts, their backoff (botocore's and the AWS SDK's
#: standard modes: at most 2**attempt s each) and slack for a loaded machine
BOUND = (RETRIES + 1) * TIMEOUT + 2**RETRIES + 10.0


@pytest.fixture(autouse=True)
def settings(monkeypatch) -> None:
    monkeypatch.setenv("UNIHUB_REMOTE_TIMEOUT", str(TIMEOUT))
    monkeypatch.setenv("UNIHUB_REMOTE_RETRIES", str(RETRIES))


@pytest.fixture
def proxy(s3_server) -> Iterator[FlakyProxy]:
    server = FlakyProxy(s3_server.port)
    yield server
    server.close()


@pytest.fixture(scope="module")
def key(s3_server) -> str:
    """40 rows in 3 files of several row groups each."""
    prefix = f"retries-{uuid.uuid4().hex[:8]}"
    write_dataset(f"s3://{s3_server.bucket}/{prefix}", SCHEMA, (sample_row(i) for i in range(N)),
                  row_group_size_mb=0.001, rows_per_file=15, storage_options=s3_server.storage_options())
    return prefix


def ids_and_names(reader: Any) -> list[tuple[int, str]]:
    with reader:
        return [(int(r.id), str(r.name)) for r in reader]


def expected() -> list[tuple[int, str]]:
    return [(i, f"row-{i}") for i in range(N)]


@pytest.mark.parametrize("fault", ["503", "500", "reset"])
@pytest.mark.parametrize("kind", KINDS)
def test_transient_faults_are_retried(s3_server, proxy, key, kind, fault):
    url, options = through(proxy, s3_server, kind, key)
    reader = make_reader(url, reader_pool_type="dummy", shuffle_row_groups=False, **options)
    proxy.fail_first(RETRIES, fault)  # the first row group's first attempts fail, its last does not
    assert sorted(ids_and_names(reader)) == expected()
    assert proxy.failed == RETRIES


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_store_failing_every_few_requests_is_read_whole(s3_server, proxy, key, kind):
    url, options = through(proxy, s3_server, kind, key)
    proxy.fail_each_once("503")  # every request's first attempt, whatever the threads do
    assert sorted(ids_and_names(make_reader(url, reader_pool_type="thread", workers_count=3, **options))) == expected()
    assert proxy.failed >= 3


@pytest.mark.parametrize("read_ahead_mb", [0, 1e-9], ids=["direct", "read-ahead"])
@pytest.mark.parametrize("fault", ["503", "reset"])
@pytest.mark.parametrize("kind", KINDS)
def test_after_the_retries_the_error_names_the_file_and_bytes(s3_server, proxy, key, kind, fault, read_ahead_mb):
    url, options = through(proxy, s3_server, kind, key)
    # a read-ahead of one row group at most (a bound under a byte): a larger one could hold the whole small
    # dataset before the store starts failing, and nothing would be left to fail
    reader = make_reader(url, reader_pool_type="dummy", shuffle_row_groups=False, read_ahead_mb=read_ahead_mb,
                         **options)
    with reader:
        next(reader)
        proxy.fail_always(fault)
        before = proxy.object_gets
        with pytest.raises(RemoteStorageError) as caught:
            list(reader)
    message = str(caught.value)
    assert message.startswith(f"s3://{s3_server.bucket}/{key}/"), message
    assert ".parquet" in message and "row group" in message and "bytes " in message, message
    assert "endpoint_override" not in message and "\n" not in message
    assert proxy.object_gets - before >= RETRIES + 1  # every attempt went to the store


@pytest.mark.parametrize("kind", KINDS)
def test_a_reader_resumes_after_a_failure_from_its_state(s3_server, proxy, key, kind):
    url, options = through(proxy, s3_server, kind, key)
    # no read-ahead: it would hold the whole (small) dataset before the store starts failing
    arguments = {"reader_pool_type": "dummy", "seed": 7, "shuffle_rows": True, "read_ahead_mb": 0, **options}
    whole = ids_and_names(make_reader(url, **arguments))
    reader = make_reader(url, **arguments)
    seen = [(int(r.id), str(r.name)) for r in (next(reader) for _ in range(17))]
    state = reader.state_dict()
    proxy.fail_always("503")
    with pytest.raises(RemoteStorageError):
        for _ in reader:
            pass
    reader.stop()
    proxy.heal()
    rest = ids_and_names(make_reader(url, resume_from=state, **arguments))
    assert seen + rest == whole


# -- random access: page reads ------------------------------------------------------------------------
SHAPE = (24, 24, 3)


@pytest.fixture(scope="module")
def paged_key(s3_server) -> str:
    """200 rows with small images in pages (an offset index per column chunk)."""
    from unihub.schema.codecs import CompressedImageCodec

    schema = sample_schema("Paged", image_shape=SHAPE)
    images = [CompressedImageCodec("png")]  # the field made by sample_schema; the rows give the pixels
    assert images
    prefix = f"retries-paged-{uuid.uuid4().hex[:8]}"
    write_dataset(f"s3://{s3_server.bucket}/{prefix}", schema,
                  ({**sample_row(i), "image": np.random.default_rng(i).integers(0, 256, SHAPE, dtype=np.uint8)}
                   for i in range(200)),
                  row_group_size_mb=0.1, rows_per_file=100, storage_options=s3_server.storage_options())
    return prefix


def paged(url: str, options: dict[str, Any]) -> Any:
    from unihub.readers.random_access import Dataset

    ds = Dataset(url, cache_mb=1e-6, **options)  # the last row group cached only: images are read a page at a time
    assert ds.pages is not None and "image" in ds._paged
    return ds


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_page_reads_are_retried_and_name_their_bytes(s3_server, proxy, paged_key, kind):
    url, options = through(proxy, s3_server, kind, paged_key)
    rows = [int(i) for i in np.random.default_rng(3).permutation(200)[:25]]
    expected = paged(url, options).take(rows)
    ds = paged(url, options)
    ds.take(rows[:1])  # footers and offset indexes read
    proxy.fail_each_once("503")  # each page's first GET fails (reads run in parallel: a fixed period could
    found = ds.take(rows)       # fail one request's every attempt)
    assert proxy.failed >= 2
    for name in ("id", "image"):
        assert np.array_equal(getattr(found, name), getattr(expected, name))
    proxy.fail_always("503")
    with pytest.raises(RemoteStorageError, match=rf"^s3://{s3_server.bucket}/{paged_key}/\S+\.parquet: "
                                                 r"(row group \d+, )?bytes \d+-\d+: "):
        ds.take([r for r in range(200) if r not in rows][:5])


@pytest.mark.parametrize("kind", KINDS)
def test_a_datasets_own_retries_are_what_its_reads_repeat(s3_server, proxy, key, kind):
    from unihub.fs import remote

    url, options = through(proxy, s3_server, kind, key)
    store = open_dataset(url, storage_options={**options.get("storage_options", {}), "unihub_retries": 4})
    assert remote.retries_of(store.filesystem) == 4 != remote.default_retries()  # the environment says 2


@pytest.mark.parametrize(("retries", "outcome"), [(0, "failed"), (2, "read")])
def test_page_reads_repeat_an_unretried_failure_as_the_dataset_says(s3_server, proxy, paged_key, monkeypatch,
                                                                    retries, outcome):
    # a 503 to a small ranged read (a footer's last 8 bytes) is an error body the AWS SDK cannot put in the
    # range and does not retry (remote.is_unretried): unihub reads it again, as often as the dataset's
    # unihub_retries says, not the environment (which says the other)
    monkeypatch.setenv("UNIHUB_REMOTE_RETRIES", str(2 - retries))
    url, options = through(proxy, s3_server, "pyarrow", paged_key)
    ds = paged(url, {**options, "storage_options": {**options.get("storage_options", {}), "unihub_retries": retries}})
    ds.take([0])  # the first file's footer and offset indexes read; the second's when a row of it is taken
    proxy.fail_first(1, "503")
    try:
        result = f"read {len(ds.take([150]).id)}"
    except RemoteStorageError:
        result = "failed"
    assert result.startswith(outcome), result
    assert proxy.failed == 1


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_worker_process_reports_the_file_and_bytes(s3_server, proxy, key, kind):
    url, options = through(proxy, s3_server, kind, key)
    with make_reader(url, reader_pool_type="process", workers_count=2, **options) as reader:
        next(reader)
        proxy.fail_always("503")
        with pytest.raises(RemoteStorageError, match=rf"^s3://{s3_server.bucket}/{key}/\S+\.parquet: row group \d+, "
                                                     r"bytes \d+-\d+: the remote store failed"):
            list(reader)


# -- forked processes: their own connections ----------------------------------------------------------
# The SDKs keep a connection open between requests (as S3 does, and the proxy). A process forked from one
# that used a filesystem, going on with it, would send its requests on its parent's sockets, shared with its
# siblings, and read whichever answer came first: another file's size or bytes.
def same_values(values: dict[str, Any], i: int) -> bool:
    """Whether ``values`` (field -> value) hold every value of :func:`sample_row` ``i``."""
    return all(np.array_equal(np.asarray(values[name]), np.asarray(value)) for name, value in sample_row(i).items())


@pytest.mark.parametrize("kind", KINDS)
def test_worker_processes_read_through_their_own_connections(s3_server, proxy, key, kind):
    url, options = through(proxy, s3_server, kind, key)
    reader = make_reader(url, reader_pool_type="process", workers_count=3, **options)
    opened = len(proxy.requests)
    parent = {port for port, _, _ in proxy.requests}  # the connections that opening the dataset left open
    with reader:
        rows = {int(row.id): row._asdict() for row in reader}
    assert sorted(rows) == list(range(N)) and all(same_values(rows[i], i) for i in range(N))
    workers = {port for port, _, _ in proxy.requests[opened:]}
    assert workers and not workers & parent, f"the workers' requests came on the parent's connections {parent}"


_INHERITED: Any = None  # what a forked process below was handed by its parent (inherited, not pickled)


def _inherit(value: Any) -> None:
    global _INHERITED
    _INHERITED = value


def _take(rows: list[int]) -> list[tuple[int, bool]]:
    """(id, whether every value is right) of each row taken from the inherited dataset."""
    batch = _INHERITED.take(rows)
    return [(int(i), same_values({name: getattr(batch, name)[k] for name in batch._fields}, int(i)))
            for k, i in enumerate(batch.id)]


@pytest.mark.parametrize("kind", KINDS)
def test_forked_processes_read_a_dataset_opened_before_the_fork_through_their_own_connections(
        s3_server, proxy, key, kind):
    import multiprocessing

    from unihub.readers.random_access import Dataset

    url, options = through(proxy, s3_server, kind, key)
    ds = Dataset(url, cache_mb=1e-6, **options)  # the last row group cached only: each take reads
    _inherit(ds)
    assert _take([0, 39]) == [(0, True), (39, True)]  # read here first, as a map-style torch dataset may be
    before = len(proxy.requests)
    parent = {port for port, _, _ in proxy.requests}
    shares = [list(range(k, N, 4)) for k in range(4)]
    with multiprocessing.get_context("fork").Pool(2, initializer=_inherit, initargs=(ds,)) as pool:  # torch's workers
        taken = [row for share in pool.map(_take, shares) for row in share]
    _inherit(None)
    assert sorted(taken) == [(i, True) for i in range(N)]
    workers = {port for port, _, _ in proxy.requests[before:]}
    assert workers and not workers & parent, f"the forked processes' requests came on the parent's connections {parent}"


def test_a_renewed_s3_filesystem_keeps_its_settings_and_retries(s3_server, proxy, key, monkeypatch):
    # what a forked process reads through: made from the pickled form, which drops the retry strategy
    from unihub.fs import filesystem as fsutil
    from unihub.fs import remote

    monkeypatch.setenv("UNIHUB_REMOTE_RETRIES", "4")  # 5 attempts; pyarrow's default strategy makes 3
    url, _ = through(proxy, s3_server, "pyarrow", key)
    fs, root = fsutil.resolve_filesystem(url)
    fresh = remote.renewed(fs)
    assert fresh is not fs and remote.renewed(fs) is fresh and remote.renewed(fresh) is fresh
    assert fresh.__reduce__() == fs.__reduce__()
    part = next(f for f in fs.get_file_info(pafs.FileSelector(root)) if f.path.endswith(".parquet"))
    with fresh.open_input_file(part.path) as file:
        proxy.fail_first(4, "503")
        assert len(file.read()) == part.size
    assert proxy.failed == 4
    subtree = pafs.SubTreeFileSystem(root, fs)
    renewed_subtree = remote.renewed(subtree)
    assert renewed_subtree is not subtree and remote.renewed(subtree) is renewed_subtree
    assert renewed_subtree.base_path == subtree.base_path and renewed_subtree.base_fs == fs
    local = pafs.LocalFileSystem()
    local_subtree = pafs.SubTreeFileSystem("/tmp", local)
    assert remote.renewed(local) is local and remote.renewed(local_subtree) is local_subtree


# -- spawned processes: a dataset pickled to them reads with its retries ------------------------------------
@pytest.mark.parametrize(("kind", "retries", "faults", "outcome"), [
    ("pyarrow", 0, 1, "failed"),  # retries=0: fail at the first transient fault (the SDK's default retries it)
    ("pyarrow", 4, 4, "read"),  # 5 attempts, more than the SDK's default 3
    ("fsspec", 0, 1, "failed"),  # s3fs's own retry loop (5 by default) stays off
])
def test_a_spawned_process_reads_with_the_retries_of_the_dataset_pickled_to_it(
        s3_server, proxy, key, kind, retries, faults, outcome):
    # a dataset sent to a spawned worker (a torch Dataset holding it, a process pool where there is no fork)
    # arrives pickled, its filesystem made anew (pyarrow's pickled form drops the retry strategy; fsspec's,
    # s3fs's own retries): it must not retry by their defaults (3 attempts, 5) instead of unihub_retries
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    url, options = through(proxy, s3_server, kind, key)
    store = open_dataset(url, storage_options={**options.get("storage_options", {}), "unihub_retries": retries})
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        proxy.fail_first(faults, "503")
        # a method of the store, not a function of this module: a spawned child imports what it runs, and
        # this module's name depends on the checkout's folder
        read = pool.submit(store.read_row_group, 0)
        try:
            result = f"read {read.result().num_rows} rows"
        except OSError as exc:  # RemoteStorageError, or pyarrow's own
            result = f"failed: {type(exc).__name__}"
    assert result.startswith(outcome), result
    assert proxy.failed == faults
