"""Fixtures of the cache tests: the moto S3 server of tests/readers, shared here without moving it."""

from __future__ import annotations

from ..readers.conftest import s3_server  # noqa: F401
