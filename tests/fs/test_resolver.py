"""Petastorm's ``petastorm.fs_utils`` on unihub (fs/resolver.py).

Each expected value is what Petastorm 0.13.1 returned or raised for the same call, observed by running the
same script in ``.venv-petastorm`` (pyarrow 14; s3 paths as fsspec/s3fs strip them, which is what
Petastorm's ``get_dataset_path`` calls). Where unihub's class of a refusal is its own, it is also the
built-in Petastorm raised.
"""

from __future__ import annotations

import pickle
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub import FilesystemResolver, get_dataset_path, get_filesystem_and_path_or_paths, normalize_dir_url
from unihub.fs.resolver import _with_user


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "f.txt").write_bytes(b"hello")
    return tmp_path


def test_a_file_url_gives_a_filesystem_with_petastorms_methods(folder):
    resolver = FilesystemResolver(f"file://{folder}")
    fs = resolver.filesystem()
    assert fs is resolver.filesystem()
    assert resolver.parsed_dataset_url() == urlparse(f"file://{folder}")
    assert resolver.parsed_dataset_url().netloc == ""
    assert resolver.get_dataset_path() == str(folder)
    # Petastorm's pyarrow.localfs answered these so (pyarrow 15 removed it)
    assert (fs.exists(f"{folder}/f.txt"), fs.exists(f"{folder}/nope")) == (True, False)
    assert (fs.isdir(f"{folder}/sub"), fs.isdir(f"{folder}/f.txt"), fs.isfile(f"{folder}/f.txt")) == (True, False, True)
    assert sorted(fs.ls(str(folder))) == [f"{folder}/f.txt", f"{folder}/sub"]
    with fs.open(f"{folder}/f.txt", "rb") as f:
        assert f.read() == b"hello"
    assert FilesystemResolver(urlparse(f"file://{folder}")).get_dataset_path() == str(folder)
    # Petastorm's keyword arguments are taken
    assert FilesystemResolver("file:///x", hadoop_configuration=None, hdfs_driver="libhdfs", user="u",
                              storage_options={"a": 1}).get_dataset_path() == "/x"


def test_the_factory_pickles_and_the_resolver_does_not(folder):
    resolver = FilesystemResolver(f"file://{folder}")
    # Petastorm's factory was a lambda that only dill pickled; the resolver refused with RuntimeError
    made = pickle.loads(pickle.dumps(resolver.filesystem_factory()))()
    assert made.exists(f"{folder}/f.txt")
    with pytest.raises(RuntimeError, match="Pickling FilesystemResolver is not supported"):
        pickle.dumps(resolver)


def test_a_parquet_dataset_reads_through_the_filesystem(tmp_path):
    pq.write_table(pa.table({"id": [1, 2, 3]}), tmp_path / "part-0.parquet")
    resolver = FilesystemResolver(f"file://{tmp_path}")
    table = pq.ParquetDataset(resolver.get_dataset_path(), filesystem=resolver.filesystem()).read()
    assert table.column("id").to_pylist() == [1, 2, 3]


@pytest.mark.parametrize("url, words", [
    ("/abs/path", 'A scheme-less dataset url .* is no longer supported. Please prepend "file://"'),
    ("relative/path", "A scheme-less dataset url"),
    ("s3:///foo/bar", "URLs must be of the form s3://bucket/path"),
    ("gcs:///foo/bar", "URLs must be of the form gcs://bucket/path"),
    ("gs:///foo", "URLs must be of the form gs://bucket/path"),
    ("unknown://foo/bar", "Protocol not known: unknown"),
])
def test_urls_petastorm_refused_are_value_errors(url, words):
    with pytest.raises(ValueError, match=words):
        FilesystemResolver(url)
    with pytest.raises(ValueError, match=words):
        FilesystemResolver(urlparse(url))


def test_filesystem_and_paths_of_urls():
    fs, path = get_filesystem_and_path_or_paths("file:///some/path")
    assert path == "/some/path" and fs.exists("/")
    assert get_filesystem_and_path_or_paths(["file:///a/1.parquet", "file:///a/2.parquet"])[1] == \
        ["/a/1.parquet", "/a/2.parquet"]
    assert get_filesystem_and_path_or_paths(["file:///a/1.parquet"])[1] == ["/a/1.parquet"]
    assert get_filesystem_and_path_or_paths("file:///some/path", filesystem="FS") == ("FS", "/some/path")
    for urls in (["file:///a/1.parquet", "hdfs:///a/2.parquet"], ["s3://b1/a", "s3://b2/a"]):
        with pytest.raises(ValueError, match="The dataset url list must contain url with the same scheme and netloc"):
            get_filesystem_and_path_or_paths(urls)
    with pytest.raises(ValueError, match="must be non-empty"):  # Petastorm: IndexError
        get_filesystem_and_path_or_paths([])


@pytest.mark.parametrize("url, normalized", [
    ("file:///a/b/", "file:///a/b"), ("file:///a/b", "file:///a/b"), ("s3://bucket/", "s3://bucket"),
    ("/x//", "/x/"), ("a", "a"),
])
def test_normalize_dir_url(url, normalized):
    assert normalize_dir_url(url) == normalized


@pytest.mark.parametrize("url", [None, 5, b"file:///x/", ""])  # Petastorm: ValueError ('' an IndexError)
def test_normalize_dir_url_refuses_what_is_not_a_string(url):
    with pytest.raises(ValueError, match="directory url must be a string"):
        normalize_dir_url(url)


@pytest.mark.parametrize("url, path", [
    ("file:///a/b/", "/a/b/"), ("hdfs://nn:8020/a/b/", "/a/b/"), ("hdfs:///a", "/a"), ("file://host/a", "/a"),
    ("s3://bucket/a/b/", "bucket/a/b"), ("s3://bucket", "bucket"), ("s3a://bucket/x", "bucket/x"),
])
def test_get_dataset_path(url, path):
    assert get_dataset_path(urlparse(url)) == path
    assert get_dataset_path(url) == path


def test_an_hdfs_user_goes_in_the_url_pyarrow_reads():
    assert _with_user(urlparse("hdfs://nn:8020/a?replication=2&user=x"), "me") == \
        "hdfs://nn:8020/a?replication=2&user=me"
    assert _with_user(urlparse("hdfs://nn/a"), None) is None
    assert _with_user(urlparse("s3://b/a"), "me") is None


def test_s3_through_s3fs_and_through_pyarrow(s3_server):
    s3fs = pytest.importorskip("s3fs")
    s3_server.client().put_object(Bucket=s3_server.bucket, Key="resolver/f.txt", Body=b"hello")
    url = f"s3://{s3_server.bucket}/resolver"
    with_options = FilesystemResolver(url, storage_options=s3_server.storage_options())
    assert isinstance(with_options.filesystem(), s3fs.S3FileSystem)  # what Petastorm gave for s3://
    query = f"?endpoint_override={s3_server.host}:{s3_server.port}&scheme=http"
    by_pyarrow = FilesystemResolver(url + query)
    for resolver in (with_options, by_pyarrow):
        assert resolver.get_dataset_path() == f"{s3_server.bucket}/resolver"
        fs = resolver.filesystem()
        assert fs.exists(f"{resolver.get_dataset_path()}/f.txt")
        with fs.open(f"{resolver.get_dataset_path()}/f.txt", "rb") as f:
            assert f.read() == b"hello"
        again = pickle.loads(pickle.dumps(resolver.filesystem_factory()))()
        assert again.exists(f"{resolver.get_dataset_path()}/f.txt")
