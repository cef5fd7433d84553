"""Remote storage faults: a bounded wait per request, bounded retries, one error that names the URL.

By their defaults, S3 through fsspec (s3fs on botocore) waits minutes on a server that accepts
and never answers (s3fs's retry loop, nested twice for a read, around botocore's: up to 5 x 5 x 5
attempts of 15 s), and both it and
pyarrow's own S3FileSystem (the AWS SDK) raise their own exceptions: botocore's
``EndpointConnectionError``, aiohttp's ``ClientPayloadError``, pyarrow's ``OSError`` "AWS Error
NETWORK_CONNECTION ...". unihub sets up the filesystems it makes from a URL with two settings and
turns a remote failure into :class:`~unihub.errors.RemoteStorageError` naming the URL:

``timeout`` (``UNIHUB_REMOTE_TIMEOUT``, default 10 s)
    the most a request waits to connect, and then for each next part of the answer (s3fs's
    ``connect_timeout``/``read_timeout``; pyarrow's ``connect_timeout``/``request_timeout``);
``retries`` (``UNIHUB_REMOTE_RETRIES``, default 2)
    how many times a failed request is tried again, by the AWS rules of what is transient
    (connection errors, timeouts, 5xx, throttling): botocore's "standard" retry mode under s3fs
    (s3fs's own loops are turned off: they multiply with it and with each other) and the AWS SDK's
    standard retry strategy under pyarrow. An answer cut short after its headers, which botocore
    cannot retry, is read again by unihub as many times (:func:`read_retrying`).

A frozen or dead server is so reported within about ``(retries + 1) * timeout`` seconds plus
backoff. Two waits that
aiohttp (under s3fs) never times out are closed as well: an upload waiting for "100 Continue"
(the ``Expect`` header is dropped) and an upload blocked on a server that stopped reading (on
Linux, ``TCP_USER_TIMEOUT`` on its sockets: unacknowledged data for ``timeout`` closes them). Per call:
``storage_options={"unihub_timeout": 2, "unihub_retries": 1}`` (taken out before the rest reach
fsspec; an ``s3://`` URL given only these still goes to pyarrow's filesystem); for a process: the
environment variables. Settings already in ``storage_options`` (``config_kwargs``) or in a
filesystem object passed as ``filesystem=`` are kept; their failures are translated all the same.

A process forked from one that used pyarrow's S3 (or GCS, Azure) filesystem reads through a copy of
its own (:func:`renewed`, with these settings): the SDK's kept-alive connections are not fork-safe. A
process the filesystem is pickled to (a spawned worker) has these settings too (:class:`ConfiguredS3FileSystem`).
"""

from __future__ import annotations

import datetime
import functools
import inspect
import os
import random
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import pyarrow.fs as pafs

from unihub.errors import DatasetChangedError, InvalidArgumentError, RemoteStorageError, UnihubError

TIMEOUT_ENV = "UNIHUB_REMOTE_TIMEOUT"
RETRIES_ENV = "UNIHUB_REMOTE_RETRIES"
TIMEOUT_OPTION = "unihub_timeout"
RETRIES_OPTION = "unihub_retries"
DEFAULT_TIMEOUT = 10.0
DEFAULT_RETRIES = 2

#: packages whose exceptions are network failures (HTTP clients and the S3 SDKs under fsspec)
_NETWORK_PACKAGES = frozenset({"botocore", "aiobotocore", "aiohttp", "urllib3", "requests", "http"})
#: what pyarrow's S3 and GCS filesystems (C++ SDKs) put in the OSError of a failed request
_PYARROW_MARKERS = ("AWS Error", "curlCode", "google::cloud::Status", "GCS Error")
_MESSAGE_LIMIT = 400
F = TypeVar("F", bound=Callable[..., Any])
_CUT_SHORT = frozenset({"ClientPayloadError", "IncompleteRead", "IncompleteReadError", "ResponseStreamingError"})
#: what pyarrow's S3 filesystem raises, unretried, where the AWS SDK could not put an answer into the
#: buffer of a ranged read: an error body longer than the range (S3's 503 "Slow Down" to an 8-byte read)
_UNRETRIED_SDK = ("Failed to flush response stream",)
#: what pyarrow's S3 filesystem puts in the OSError of a request the store refused for its credentials
_DENIED_MARKERS = ("ACCESS_DENIED", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "HTTP status 403")


@dataclass(frozen=True)
class RemoteSettings:
    """How long a remote request may wait (seconds) and how many times it is tried again."""

    timeout: float = DEFAULT_TIMEOUT
    retries: int = DEFAULT_RETRIES

    def __post_init__(self) -> None:
        if not isinstance(self.timeout, (int, float)) or isinstance(self.timeout, bool) or not self.timeout > 0:
            raise InvalidArgumentError(f"the remote timeout must be a number of seconds > 0, got {self.timeout!r} "
                                       f"({TIMEOUT_OPTION} / {TIMEOUT_ENV})")
        if not isinstance(self.retries, int) or isinstance(self.retries, bool) or self.retries < 0:
            raise InvalidArgumentError(f"the remote retries must be a whole number >= 0, got {self.retries!r} "
                                       f"({RETRIES_OPTION} / {RETRIES_ENV})")


def split_settings(storage_options: Mapping[str, Any] | None) -> tuple[RemoteSettings, dict[str, Any]]:
    """unihub's remote settings (from ``storage_options``, else the environment, else the defaults)
    and the storage options left for fsspec."""
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise InvalidArgumentError(f"storage_options must be a mapping of fsspec's options, got "
                                   f"{type(storage_options).__name__}")
    options = dict(storage_options or {})
    timeout = options.pop(TIMEOUT_OPTION, None)
    retries = options.pop(RETRIES_OPTION, None)
    if timeout is None:
        timeout = _from_env(TIMEOUT_ENV, float, DEFAULT_TIMEOUT)
    if retries is None:
        retries = _from_env(RETRIES_ENV, int, DEFAULT_RETRIES)
    return RemoteSettings(timeout, retries), options


def _from_env(name: str, kind: type, default: Any) -> Any:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        raise InvalidArgumentError(f"{name}={text!r} is not a {'number' if kind is float else 'whole number'}") from None


def fsspec_options(protocol: str, options: dict[str, Any], settings: RemoteSettings) -> dict[str, Any]:
    """``options`` for ``fsspec.filesystem(protocol, ...)`` with the timeouts and botocore's retries
    filled in (s3fs), where the caller did not set them."""
    if protocol not in ("s3", "s3a"):
        return options
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("connect_timeout", settings.timeout)
    config.setdefault("read_timeout", settings.timeout)
    config.setdefault("retries", {"mode": "standard", "total_max_attempts": settings.retries + 1})
    if _supports_socket_factory():
        connector = dict(config.get("connector_args") or {})
        connector.setdefault("socket_factory", UnacknowledgedTimeout(int(settings.timeout * 1000)))
        config["connector_args"] = connector
    return {**options, "config_kwargs": config}


def configure_fsspec(fs: Any) -> Any:
    """Turn s3fs's own retry loop off (one attempt: botocore retries, see the module docstring); ``fs`` back."""
    if is_s3fs(fs) and hasattr(fs, "retries"):
        fs.retries = 1
    return fs


def read_retrying(read: Any, retries: int) -> Any:
    """``read()``, again up to ``retries`` times (after :func:`backoff`) while it fails in a way its
    client does not retry: an answer cut short after its headers (a read of an fsspec file moves its
    position only when it succeeds, so it can be repeated), or pyarrow's S3 read that could not take
    an error answer (:func:`is_unretried`)."""
    for attempt in range(retries + 1):
        try:
            return read()
        except Exception as exc:
            if attempt == retries or not is_unretried(exc):
                raise
            time.sleep(backoff(attempt))


def backoff(attempt: int) -> float:
    """Seconds to wait before trying again after failed attempt ``attempt`` (from 0): exponential from
    0.1 s, at most 2 s, half of it random (jitter: clients that failed together do not retry together)."""
    ceiling = min(0.1 * 2**attempt, 2.0)
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def read_range(filesystem: pafs.FileSystem, path: str, start: int, stop: int,
               handles: dict[str, Any] | None = None) -> Any:
    """Bytes ``start:stop`` of the file ``path``: one ranged GET, no other request where it can (an
    fsspec filesystem's ``cat_file``, without the existence check and buffering of an opened file),
    remote failures as for any read. pyarrow's own filesystems open the file (S3: a HEAD request)
    unless ``handles`` holds it open already (it is kept there; their ``read_at`` is thread-safe)."""
    handler = getattr(filesystem, "handler", None)
    inner = getattr(handler, "fs", None)
    url = display_url(filesystem, path)
    if inner is not None and reads_ranges(filesystem):
        retries = getattr(handler, "retries", DEFAULT_RETRIES)
        with remote_errors(url, broad=True):
            return read_retrying(lambda: inner.cat_file(path, start=start, end=stop), retries)
    with remote_errors(url):
        handle = handles.get(path) if handles is not None else None
        if handle is None:
            handle = opened = filesystem.open_input_file(path)
            if handles is not None:
                handle = handles.setdefault(path, opened)  # another thread's, where it came first
                if handle is not opened:
                    opened.close()
        try:
            return handle.read_at(stop - start, start)
        finally:
            if handles is None:
                handle.close()


def reads_ranges(filesystem: pafs.FileSystem) -> bool:
    """Whether :func:`read_range` reads ``filesystem`` without opening the file (fsspec's ``cat_file``)."""
    return callable(getattr(getattr(getattr(filesystem, "handler", None), "fs", None), "cat_file", None))


def is_cut_short(exc: BaseException) -> bool:
    """True for an HTTP answer whose body ended before its length (aiohttp's, botocore's or http.client's)."""
    return any(cls.__name__ in _CUT_SHORT for cls in type(exc).__mro__)


def is_unretried(exc: BaseException) -> bool:
    """True for a transient failure its client gave up on at once: an answer cut short, or pyarrow's S3
    read whose error answer (a 5xx, throttling) did not fit the range asked."""
    return is_cut_short(exc) or (is_sdk_failure(exc) and any(marker in str(exc) for marker in _UNRETRIED_SDK))


def default_retries() -> int:
    """The retries of this process's settings (``UNIHUB_REMOTE_RETRIES``, else the default)."""
    return split_settings(None)[0].retries


def retries_of(fs: pafs.FileSystem) -> int:
    """How many times :func:`read_retrying` repeats a read of ``fs``: the retries unihub configured it with
    (``unihub_retries``), else this process's (:func:`default_retries`)."""
    base = fs.base_fs if isinstance(fs, pafs.SubTreeFileSystem) else fs
    if isinstance(base, ConfiguredS3FileSystem):
        return base.attempts - 1
    retries = getattr(getattr(base, "handler", None), "retries", None)  # fsspec's, through its pyarrow handler
    return retries if isinstance(retries, int) and not isinstance(retries, bool) else default_retries()


def before_upload(fs: Any) -> None:
    """Have s3fs send request bodies without waiting for "100 Continue" (botocore asks for it on
    every upload, and aiohttp waits for it with no timeout: a frozen server hangs the upload)."""
    if not is_s3fs(fs) or not callable(getattr(fs, "connect", None)):
        return
    client = fs.connect()  # s3fs's client (made on first use, no request sent)
    client.meta.events.register("before-send.s3", _drop_expect_header, unique_id="unihub-no-expect-continue")


def _drop_expect_header(request: Any, **_: Any) -> None:
    request.headers.pop("Expect", None)


def is_s3fs(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return "s3" in protocol


class UnacknowledgedTimeout:
    """aiohttp's socket factory: TCP sockets that close when sent data stays unacknowledged, or
    cannot be sent to a peer that stopped reading, for ``milliseconds`` (Linux ``TCP_USER_TIMEOUT``;
    aiohttp has no timeout for writing a request body)."""

    def __init__(self, milliseconds: int) -> None:
        self.milliseconds = milliseconds

    def __call__(self, addr_info: Any) -> socket.socket:
        family, kind, proto = addr_info[:3]
        sock = socket.socket(family, kind, proto)
        if family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, self.milliseconds)
        return sock

    def __repr__(self) -> str:  # fsspec keys its instance cache on the options' text
        return f"UnacknowledgedTimeout({self.milliseconds})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnacknowledgedTimeout) and other.milliseconds == self.milliseconds

    def __hash__(self) -> int:
        return hash(self.milliseconds)


@functools.lru_cache(maxsize=1)
def _supports_socket_factory() -> bool:
    """True where the OS has ``TCP_USER_TIMEOUT`` and aiobotocore passes a socket factory to aiohttp."""
    if not hasattr(socket, "TCP_USER_TIMEOUT"):
        return False
    try:
        from aiobotocore.config import AioConfig

        AioConfig(connector_args={"socket_factory": UnacknowledgedTimeout(1000)})
    except Exception:  # not installed, or a version without the option
        return False
    return True


def configure_pyarrow(fs: pafs.FileSystem, settings: RemoteSettings) -> pafs.FileSystem:
    """pyarrow's S3 filesystem made from a URL, again with the timeouts (where the URL set none),
    the AWS SDK's standard retry strategy and parts uploaded as they fill (no unbounded queue of
    parts in memory); GCS's with its retries bounded by the timeouts (where the URL set no
    ``retry_limit_seconds``: its client retried an unreachable store for minutes, deaf to Ctrl-C);
    any other filesystem as it is."""
    if isinstance(fs, getattr(pafs, "GcsFileSystem", ())):
        return _bounded_gcs(fs, settings)
    if not isinstance(fs, getattr(pafs, "S3FileSystem", ())):
        return fs
    reduced: Any = fs.__reduce__()
    options = dict(reduced[1][0])  # the constructor's keyword arguments, as pickling uses them
    for key in ("connect_timeout", "request_timeout"):
        if options.get(key) is None or options[key] < 0:
            options[key] = settings.timeout
    # pyarrow's background writes queue every part that is not uploaded yet, without a bound:
    # writing faster than the store takes it grew RSS by 45-200 MB over a local write (6 MB rows
    # to moto); uploading each part as it fills keeps memory within the row-group bound
    options["background_writes"] = False
    return ConfiguredS3FileSystem(attempts=settings.retries + 1, **options)


def _bounded_gcs(fs: pafs.FileSystem, settings: RemoteSettings) -> pafs.FileSystem:
    """``fs`` (pyarrow's GCS filesystem) again, retrying for at most the timeout times the attempts."""
    reconstruct, (options, *_) = fs.__reduce__()
    if options.get("retry_time_limit") is not None:
        return fs
    options = {**options, "retry_time_limit": datetime.timedelta(seconds=settings.timeout * (settings.retries + 1))}
    return reconstruct(options)


class ConfiguredS3FileSystem(pafs.S3FileSystem):
    """pyarrow's S3 filesystem with the AWS SDK's standard retry strategy of ``attempts`` attempts (the
    first and its retries), also in a copy made from its pickled form: in a process it is pickled to (a
    dataset or reader sent to a spawned worker) or a forked one (:func:`renewed`). pyarrow's own pickled
    form drops the retry strategy: such a copy would retry as the SDK does by default."""

    def __init__(self, *, attempts: int, **options: Any) -> None:
        super().__init__(retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=attempts), **options)
        self.attempts = attempts

    def __reduce__(self) -> tuple[Any, ...]:
        options = dict(super().__reduce__()[1][0])
        options.pop("retry_strategy", None)  # pyarrow 26 leaves it out; one that kept it would pass it twice
        return _configured_s3, (options, self.attempts)


def _configured_s3(options: dict[str, Any], attempts: int) -> ConfiguredS3FileSystem:
    """A :class:`ConfiguredS3FileSystem` from its pickled form (pickle passes no keyword arguments)."""
    return ConfiguredS3FileSystem(attempts=attempts, **options)


#: pyarrow's cloud filesystems: C++ SDKs that keep HTTP connections open between requests
_CLOUD = tuple(c for c in (getattr(pafs, n, None) for n in ("S3FileSystem", "GcsFileSystem", "AzureFileSystem"))
               if c is not None)
#: (process, id of a filesystem inherited from another) -> (that filesystem, this process's copy)
_RENEWED: dict[tuple[int, int], tuple[pafs.FileSystem, pafs.FileSystem]] = {}


def renewed(fs: pafs.FileSystem) -> pafs.FileSystem:
    """This process's copy of ``fs``, a filesystem that a process it was forked from made or used: for
    pyarrow's cloud filesystems (S3, GCS, Azure; also under a ``SubTreeFileSystem``), a new one with the
    same settings (made once per process; ``fs`` is kept alive, unused); any other, ``fs`` itself.

    Their SDKs keep connections open between requests (HTTP keep-alive, as S3 does), and a forked process
    inherits the sockets: a child that went on using ``fs`` would send its requests on the connections of
    its parent and siblings, and read whichever answer comes first, another process's (another object's
    size, or bytes). An inherited one is never destroyed here either: its SDK would close the shared
    connections (a TLS close alert on the parent's socket). fsspec's filesystems are made again in a forked
    process by their pyarrow handler (:mod:`unihub.fs.filesystem`)."""
    if not isinstance(fs.base_fs if isinstance(fs, pafs.SubTreeFileSystem) else fs, _CLOUD):
        return fs
    key = (os.getpid(), id(fs))
    found = _RENEWED.get(key)
    if found is None:  # setdefault: two threads renewing at once get the same copy
        found = _RENEWED.setdefault(key, (fs, _copy(fs)))
        _RENEWED.setdefault((key[0], id(found[1])), (found[1], found[1]))  # the copy renewed again: itself
    return found[1]


def _copy(fs: pafs.FileSystem) -> pafs.FileSystem:
    """A new ``fs`` from its pickled form (no connections; configure_pyarrow's keeps its retries)."""
    if isinstance(fs, pafs.SubTreeFileSystem):
        return pafs.SubTreeFileSystem(fs.base_path, _copy(fs.base_fs))
    make, args = fs.__reduce__()[:2]
    return make(*args)


def is_remote_failure(exc: BaseException) -> bool:
    """True for an exception that says the remote store failed (unreachable, timed out, cut off),
    as fsspec's HTTP clients or pyarrow's cloud SDKs raise it; False for a missing file."""
    if isinstance(exc, RemoteStorageError):
        return True
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if type(exc).__name__ == "FSTimeoutError":  # fsspec.exceptions: a sync call into an async filesystem timed out
        return True
    cause: BaseException | None = exc
    for _ in range(4):  # s3fs raises OSError(EIO) from botocore's error for a 5xx answer retried in vain
        if cause is None:
            break
        if any(cls.__module__.split(".")[0] in _NETWORK_PACKAGES for cls in type(cause).__mro__):
            return True
        cause = cause.__cause__
    return is_sdk_failure(exc)


def is_sdk_failure(exc: BaseException) -> bool:
    """True for the ``OSError`` of a failed request in pyarrow's S3 or GCS filesystem (a C++ SDK)."""
    return isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError) and \
        any(marker in str(exc) for marker in _PYARROW_MARKERS)


def as_remote_error(exc: BaseException, url: str, *, broad: bool = False,
                    detail: str | None = None) -> UnihubError | None:
    """``exc`` as a :class:`RemoteStorageError` naming ``url``, or None when it is no remote failure; an
    object overwritten since it was listed (s3fs's ``FileExpired``: its ETag is no longer the one
    listed) is a :class:`DatasetChangedError`, as on a local disk, not a failure to retry or wait out.

    Only pyarrow's SDK errors count, unless ``broad`` (for calls that go to an fsspec filesystem
    and nowhere else: there any network or timeout error is the store's). ``detail`` (what was being
    read: ``"row group 3, bytes 4-1027"``) follows the URL in the message, also in a
    ``RemoteStorageError`` raised before (by the filesystem, which knows the file but not the why)."""
    if isinstance(exc, DatasetChangedError):
        return None  # said already, by a call below: raised as it is
    if _object_changed(exc):
        where = f"{public_url(url)}: {detail}" if detail else public_url(url)
        return DatasetChangedError(f"{where}: the object changed since the dataset was opened (its ETag is no "
                                   "longer the one listed): it was overwritten while it was read, and rows of two "
                                   "versions would mix; open the dataset again to read what is there now",
                                   path=public_url(url))
    if isinstance(exc, RemoteStorageError):
        return exc if detail is None else _with_detail(exc, public_url(url), detail)
    denied = _access_denied(exc, url)
    if not (denied or (is_remote_failure(exc) if broad else is_sdk_failure(exc))):
        return None
    url = public_url(url)
    text = " ".join(str(exc).split()) or "no message"
    if len(text) > _MESSAGE_LIMIT:
        text = text[:_MESSAGE_LIMIT] + " ..."
    where = f"{url}: {detail}" if detail else url
    if denied:  # no retry or longer wait helps: the answer was a refusal
        return RemoteStorageError(f"{where}: the remote store refused access ({type(exc).__name__}: {text}); check "
                                  "the credentials (storage_options 'key'/'secret', AWS_ACCESS_KEY_ID, a profile) "
                                  "and what they are allowed on the bucket", url=url)
    return RemoteStorageError(
        f"{where}: the remote store failed ({type(exc).__name__}: {text}); gave up after the retries "
        f"(how long a request waits and how often it is retried: {TIMEOUT_ENV}, {RETRIES_ENV} or "
        f"storage_options {TIMEOUT_OPTION!r}, {RETRIES_OPTION!r})", url=url)


def _access_denied(exc: BaseException, url: str) -> bool:
    """Whether ``exc`` is a remote store's refusal of the credentials (HTTP 403): s3fs's ``PermissionError``,
    pyarrow's "AWS Error ACCESS_DENIED" and kin. It was a bare ``PermissionError('Forbidden')`` naming no URL
    (s3fs), or a failure "after the retries" that told to raise the timeout (pyarrow)."""
    if isinstance(exc, PermissionError):
        return "://" in url and not url.startswith("file://")
    return is_sdk_failure(exc) and any(marker in str(exc) for marker in _DENIED_MARKERS)


def _object_changed(exc: BaseException) -> bool:
    """Whether ``exc`` or what caused it is s3fs's ``FileExpired`` (a read whose ``If-Match`` ETag failed)."""
    cause: BaseException | None = exc
    for _ in range(4):
        if cause is None:
            return False
        if type(cause).__name__ == "FileExpired":
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _with_detail(exc: RemoteStorageError, url: str, detail: str) -> RemoteStorageError:
    """``exc`` again, with ``detail`` after the URL it begins with (or before its message)."""
    message, named = str(exc), exc.url or url
    if f": {detail}: " in message:
        return exc
    head = f"{named}: "
    message = f"{head}{detail}: {message[len(head):]}" if message.startswith(head) else f"{url}: {detail}: {message}"
    error = RemoteStorageError(message, url=named)
    error.__cause__ = exc.__cause__
    return error


@contextmanager
def remote_errors(url: str, *, broad: bool = False) -> Iterator[None]:
    """Turn a remote failure raised inside the block into :class:`RemoteStorageError` naming ``url``
    (``broad``: see :func:`as_remote_error`)."""
    try:
        yield
    except RemoteStorageError as exc:
        outer = public_url(url)
        if exc.url is None or exc.url.startswith(outer):
            raise
        raise RemoteStorageError(f"{outer}: {exc}", url=outer) from exc  # a temporary or part file failed
    except Exception as exc:
        error = as_remote_error(exc, url, broad=broad)
        if error is None:
            raise
        raise error from exc


def naming_url(argument: str) -> Callable[[F], F]:
    """Decorator: a remote failure inside the function is a :class:`RemoteStorageError` naming the URL
    its ``argument`` holds (for a list of URLs, the first)."""

    def decorate(function: F) -> F:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            url = signature.bind_partial(*args, **kwargs).arguments.get(argument, "")
            if not isinstance(url, (str, os.PathLike)):
                url = next(iter(url), "") if isinstance(url, (list, tuple)) else ""
            with remote_errors(os.fspath(url)):
                return function(*args, **kwargs)

        return cast(F, call)

    return decorate


def public_url(url: str) -> str:
    """``url`` without its query and user part, which may hold credentials (``s3://KEY:SECRET@bucket``,
    ``?secret_key=``): what an error message may show."""
    if "://" not in url:
        return url
    scheme, _, rest = url.partition("://")
    rest = rest.split("?")[0].split("#")[0]
    host, slash, path = rest.partition("/")
    return f"{scheme}://{host.rpartition('@')[2]}{slash}{path}"


def display_url(fs: pafs.FileSystem, path: str) -> str:
    """``path`` on ``fs`` as a URL a user recognises: ``s3://bucket/key``; local paths as they are."""
    if isinstance(fs, pafs.LocalFileSystem) or "://" in path:
        return path
    scheme = fs.type_name
    if isinstance(fs, pafs.PyFileSystem):
        protocol = getattr(getattr(fs.handler, "fs", None), "protocol", "")
        scheme = protocol[0] if isinstance(protocol, (tuple, list)) else protocol
    return f"{scheme}://{path.lstrip('/')}" if scheme and scheme not in ("file", "local") else path
