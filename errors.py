"""The exception hierarchy: every error unihub raises on purpose is a :class:`UnihubError`.

Each class also derives from the built-in exception a caller would naturally catch
(``FileNotFoundError``, ``ValueError``, ``ImportError``), as HuggingFace datasets does,
so ``except ValueError`` keeps working for code migrated from Petastorm.
Messages say what went wrong, where (file, field, row, offset) and how to fix it.
"""

from __future__ import annotations

import os
from typing import Any


class UnihubError(Exception):
    """Root of every error unihub raises on purpose."""


class SchemaError(UnihubError, ValueError):
    """A Unischema is malformed, or a value does not match its field."""


class ValidationError(SchemaError):
    """A row's value has the wrong dtype or shape, or is null in a non-nullable field."""

    def __init__(self, message: str, *, field: str | None = None, row: int | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.row = row


class CodecError(UnihubError, ValueError):
    """A value could not be encoded or decoded by its field's codec."""

    def __init__(self, message: str, *, field: str | None = None, row: int | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.row = row


class FormatError(UnihubError, ValueError):
    """A file is not what it claims to be: truncated, corrupt, or another format."""

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset


class InvalidArgumentError(UnihubError, ValueError):
    """An argument of the wrong value or type (``num_epochs=-10``, ``cur_shard='0'``, ``make_reader(None)``);
    Petastorm raised ValueError for these."""


class NoDataAvailableError(InvalidArgumentError):
    """Shards that would be empty: more shards than row groups to deal out (Petastorm's error of this
    name). Sharding by row (``shard_by='row'``) gives every rank rows even then."""


class UsageError(UnihubError, RuntimeError):
    """A reader or loader used out of turn: read after ``stop()``, iterated by two loops at once
    (Petastorm raised RuntimeError for these)."""


class UnsupportedFormatError(UnihubError, ValueError):
    """A format, codec or option name that unihub does not know."""


class DatasetNotFoundError(UnihubError, FileNotFoundError):
    """A path that does not exist or holds no dataset."""


class DatasetExistsError(UnihubError, FileExistsError):
    """An output path already exists and overwriting was not asked for."""


class ForeignOutputError(DatasetExistsError):
    """An overwrite would replace something unihub did not write (a source file, another tool's data, a
    folder of one's own): ``--overwrite`` replaces only unihub's own datasets and exports it can recognise;
    ``--overwrite-foreign`` (``overwrite_foreign=True``) says to replace anything. The message names the path."""


class UnsafeMetadataError(UnihubError):
    """Dataset metadata tried to reach code outside the allow-list, or to exhaust memory or time
    (a pickle bomb); nothing was run."""


class PetastormMetadataError(SchemaError):
    """A dataset's metadata holds no Unischema where one is needed (``get_schema_from_dataset_url`` on
    plain Parquet), or Petastorm's pickled metadata is corrupt or holds something unihub cannot convert
    (Petastorm's error of this name)."""


class SchemaMismatchError(SchemaError):
    """A Unischema does not describe the columns of the Parquet store it is given for."""


class ColumnSetError(SchemaError):
    """Columns cannot be added as asked: a field the dataset has, values of the wrong length, a bad set name
    (store/columns.py)."""


class PetastormCompatibilityError(SchemaError):
    """A field cannot be written in a form Petastorm 0.13.1 reads (a fixed-shape TensorCodec, RGBA images)."""


class MissingDependencyError(UnihubError, ImportError):
    """An optional framework is not installed; the message names the extra to install."""


class ImageDecodeError(CodecError):
    """Bytes that should hold a PNG or JPEG image could not be decoded."""


class DecodeFieldError(CodecError, RuntimeError):
    """:func:`~unihub.schema.unischema.decode_row` could not decode a field's value (Petastorm's
    ``petastorm.utils.DecodeFieldError``, a ``RuntimeError``); the cause is chained."""


class DatasetChangedError(UnihubError, RuntimeError):
    """A file of a dataset changed or vanished after the dataset was opened (an overwrite while a
    reader was reading): rows read from it would mix two versions, so none are given. Open the
    dataset again (a new reader) to read what is there now."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class DataCorruptionError(FormatError):
    """Stored bytes no longer match the checksum or counts written with them (a Parquet data page whose
    CRC-32 fails, a page that decodes to fewer values than its column chunk holds): the file was damaged
    after it was written. Nothing of the damaged row group is returned."""

    def __init__(self, message: str, *, path: str | None = None, row_group: int | None = None,
                 column: str | None = None) -> None:
        super().__init__(message, path=path)
        self.row_group = row_group
        self.column = column


class RemoteStorageError(UnihubError, OSError):
    """A remote store (S3 and others, through pyarrow or fsspec) did not answer in time, refused the
    connection or cut a response short, after the configured retries (``UNIHUB_REMOTE_TIMEOUT``,
    ``UNIHUB_REMOTE_RETRIES``); the message names the URL."""

    def __init__(self, message: str, *, url: str | None = None) -> None:
        super().__init__(message)
        self.url = url


class OutputError(UnihubError, OSError):
    """An output the disk cannot take: no space left, a file too large, a read-only or forbidden
    destination. The message names the destination, the reason and what to do; ``errno``,
    ``strerror`` and ``filename`` are those of the system's error, which is the ``__cause__``."""

    def __init__(self, message: str, *, code: int | None = None, filename: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.errno, self.filename = code, filename
        self.strerror = os.strerror(code) if code else None

    def __str__(self) -> str:  # the message, not OSError's "[Errno n] ..." form
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:  # to a forked worker's parent, with the system's error
        return (type(self), (self.message,), {"errno": self.errno, "filename": self.filename,
                                              "strerror": self.strerror})


class UnsupportedFilesystemError(UnihubError, ValueError):
    """A URL whose scheme no filesystem unihub can reach handles (not pyarrow's, not an installed
    fsspec protocol); the message names the URL. unihub never takes ``scheme://...`` for a local path."""


class CacheError(UnihubError):
    """A cache of a data loader (``unihub.cacheable``) cannot be built, opened, listed or removed as
    asked; the message names the cache."""


class CacheTimeoutError(CacheError, TimeoutError):
    """Waited longer than ``wait_timeout`` for another process to build a cache; the message names the
    cache and who holds its build lease."""


class SparkSettingError(UnihubError, ValueError):
    """A Spark session set up in a way a conversion cannot run safely under (``spark.speculation=true``:
    two attempts of one task at once would write and delete the same part files); the message names
    the setting and the value to use."""


class SparkStalledError(UnihubError, TimeoutError):
    """A Spark job of a conversion or copy in which no task ran for the stall timeout (the cluster lost its
    workers, or has no free cores for it); the message names the master, the executors and the setting."""


class FilterExpressionError(InvalidArgumentError):
    """A filter given as text (``unihub show --where``) is not one unihub can build: not an expression,
    a construct outside the allow-list, or a name that is not a field; the message quotes the filter."""


# -- Petastorm's built-in exception types, kept under unihub's classes ------------------------------
# Where Petastorm 0.13.1 raised TypeError or RuntimeError, unihub raises its own class that is also
# that built-in, so ``except TypeError`` / ``except RuntimeError`` in migrated code still catches it.

class CodecTypeError(CodecError, TypeError):
    """A value of the wrong kind for its codec: a list or an array where ``ScalarCodec`` stores one
    scalar (Petastorm raised TypeError)."""


class FieldTypeError(ValidationError, TypeError):
    """A row's value of the wrong type for its field (a list in a string field), found by
    ``dict_to_spark_row`` or validation (Petastorm raised TypeError)."""


class NoMatchingFieldsError(SchemaError, RuntimeError):
    """A field name or regular expression of ``schema_fields`` names no field of the dataset (Petastorm
    raised RuntimeError when none matched); the message names the pattern, the dataset and its fields."""


class DatasetUrlError(DatasetNotFoundError, ValueError):
    """A dataset URL that names no dataset where Petastorm refused the URL itself with ValueError: an
    empty list of URLs, or a path without a scheme (which Petastorm refused and unihub reads as a
    local path) that does not exist."""


class ReaderResetError(UsageError, NotImplementedError):
    """``reset()`` in the middle of an epoch (Petastorm raised NotImplementedError): rows already in
    flight would be neither delivered nor dropped in a defined way. Read to the end, or call
    ``start_over()``, which starts from the first epoch wherever the reader is."""


class ReaderStateError(UnihubError, ValueError):
    """A saved reader state that does not belong to this reader's dataset and options, or states of
    several ranks that do not belong to one run (another seed, dataset or options)."""


class VersionNotFoundError(DatasetNotFoundError, ValueError):
    """A version number or tag that names no version of the dataset (never written, removed by ``unihub
    vacuum``, or from before an overwrite, which starts a new history); the message lists those there are."""


class ConcurrentCommitError(UnihubError, RuntimeError):
    """Another writer published the version this append was about to publish, and retrying did not land it
    (or the other's schema no longer fits): nothing of this append is published; run it again."""


class AppendSchemaError(SchemaMismatchError):
    """Rows appended to a dataset whose schema differs from the dataset's (another field, type, shape or
    codec): the message names the fields that differ."""


class SourceChangedError(UnihubError, ValueError):
    """An incremental conversion (``convert --append``) found a source file that was converted before and
    has changed since (another size and checksum): its new contents are not in the dataset, so the
    conversion refuses before it writes anything; the message names the files."""
