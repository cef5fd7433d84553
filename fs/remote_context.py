"""How the driver reaches remote stores, carried to tasks that run in other processes on other machines.

A conversion is given its store's endpoint and credentials once, in the driver: ``storage_options``
(:func:`unihub.fs.sources.using`), a URL's query (``s3://b/k?endpoint_override=...``, which then
holds for its bucket) or the environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...). A Spark
executor has none of these: its Python worker runs with the worker's environment and a fresh
module state. :func:`capture` takes all three in the driver; :func:`restored` puts them in place
around a task and takes them away after it (Python workers are reused by later tasks and jobs).

Environment variables travel in groups: where the driver sets any variable of a group (the
endpoint, the credentials, the region, unihub's remote settings), the task sees exactly the
driver's variables of that group, so a key from the driver is never mixed with a session token of
the executor. Spark itself ships the driver's ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` to
its executors the same way (as ``spark.hadoop.fs.s3a.*`` settings); like storage options, they
travel inside the task, so the cluster must be one the credentials may be given to.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from unihub.fs import filesystem as fsutil
from unihub.fs import remote, sources

#: environment variables that say how to reach a store, in groups that travel whole
ENVIRONMENT_GROUPS: tuple[tuple[str, ...], ...] = (
    ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"),
    ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
    ("AWS_REGION", "AWS_DEFAULT_REGION"),
    (remote.TIMEOUT_ENV,),
    (remote.RETRIES_ENV,),
)


@dataclass(frozen=True)
class RemoteContext:
    """What :func:`capture` took: the storage options, the URL queries per (scheme, bucket) and the
    environment (``None``: unset in the task)."""

    storage_options: dict[str, Any] | None = None
    origins: dict[tuple[str, str], str] = field(default_factory=dict)
    environment: dict[str, str | None] = field(default_factory=dict)


def capture() -> RemoteContext:
    """This process's way to its stores, now (in the driver, inside the conversion's ``sources.using``)."""
    environment: dict[str, str | None] = {}
    for group in ENVIRONMENT_GROUPS:
        if any(os.environ.get(name) for name in group):
            environment.update({name: os.environ.get(name) or None for name in group})
    return RemoteContext(fsutil.current_options(), dict(sources._ORIGINS), environment)


@contextmanager
def restored(context: RemoteContext) -> Iterator[None]:
    """Within this block, URLs are opened as the driver that captured ``context`` opens them; before
    and after, this process is as it was."""
    saved_env = {name: os.environ.get(name) for name in context.environment}
    saved_origins = dict(sources._ORIGINS)
    _set_environment(context.environment)
    sources._ORIGINS.update(context.origins)
    try:
        with sources.using(context.storage_options):  # fresh filesystems, made with what is set now
            yield
    finally:
        _set_environment(saved_env)
        sources._ORIGINS.clear()
        sources._ORIGINS.update(saved_origins)


def _set_environment(values: dict[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
