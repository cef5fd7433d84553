"""Hive partition folders (``key=value/``) of a dataset's files: the pairs a path holds, and each value as its
field's (the store's readers, and a delete's filter over a part's rows, add them as columns)."""

from __future__ import annotations

import decimal
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa

from unihub.errors import FormatError, SchemaError
from unihub.schema.unischema import Unischema, UnischemaField

#: the characters Spark escapes in a partition folder's value (``ExternalCatalogUtils.escapePathName``): controls,
#: the path's own separators and what Hive reads as patterns; anything else (a space, ``é``) stays as it is
_ESCAPED = frozenset(chr(c) for c in range(0x20)) | frozenset('"#%\'*/:=?\\\x7f{[]^')


def folder_value(value: Any) -> str:
    """The ``v`` of a ``key=v`` partition folder for ``value``, escaped as Spark escapes it (``%2F`` for ``/``): the
    folder Spark would write, which Spark, pyarrow and Petastorm read back as the value. Every character is read
    back by :func:`partition_of`'s ``unquote``."""
    if value is None:
        return "__HIVE_DEFAULT_PARTITION__"
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in str(value))


def partition_of(base: str, path: str) -> tuple[tuple[str, str], ...]:
    """The Hive partition ``(key, value)`` pairs of ``path``'s folders under ``base`` (``k=v/``)."""
    rel = path[len(base):].lstrip("/").split("/")[:-1]
    return tuple((k, unquote(v)) for k, _, v in (part.partition("=") for part in rel) if _ == "=")


def keyed_partitions(paths: list[str], partitions: list[tuple[tuple[str, str], ...]],
                     rows: list[int]) -> list[tuple[tuple[str, str], ...]]:
    """The partitions of the files of ``paths`` that hold rows (``rows``: each file's count; all, where none does),
    every one naming the same keys, else a FormatError naming the first file that differs (a file beside ``k=1/``
    folders, or ``k=1/j=2/`` beside ``k=1/``; Spark refuses such a tree too). The keys were read from the first
    file's path: another file's rows lost a key, or failed to read. An empty file (an append of no rows) is
    left out: it adds no values."""
    held = [k for k, n in enumerate(rows) if n] or list(range(len(paths)))
    keys = {k for k, _ in partitions[held[0]]} if held else set()
    for k in held[1:]:
        if {key for key, _ in partitions[k]} != keys:
            named = sorted(key for key, _ in partitions[k])
            raise FormatError(f"{paths[k]}: its partition folders name the keys {named}, {paths[held[0]]}'s name "
                              f"{sorted(keys)}: a dataset's files sit at one depth of "
                              f"key=value folders, with the same keys; move the files to where their keys belong",
                              path=paths[k])
    return [partitions[k] for k in held]


def partition_value(field_: UnischemaField, raw: str) -> Any:
    """A Hive partition directory's value (``key=raw``) as the field's Python value."""
    if raw == "__HIVE_DEFAULT_PARTITION__":
        return None
    if field_.numpy_dtype is np.str_:
        return raw
    if field_.numpy_dtype is decimal.Decimal:
        return decimal.Decimal(raw)
    if field_.numpy_dtype is np.bool_ and raw.lower() in ("true", "false"):
        return raw.lower() == "true"  # np.bool_("False") is True
    try:
        return field_.numpy_dtype(raw).item()
    except (ValueError, TypeError, OverflowError) as exc:
        raise SchemaError(f"partition value {raw!r} of {field_.name!r} is not a {field_.dtype}") from exc


def with_partitions(table: pa.Table, schema: Unischema, partition: tuple[tuple[str, str], ...]) -> pa.Table:
    """``table`` with a column per partition key of ``partition`` that ``schema`` lists, each row the folder's
    value."""
    for key, raw in partition:
        if key in schema.fields and key not in table.column_names:
            field_ = schema[key]
            table = table.append_column(field_.arrow_field(), pa.array([partition_value(field_, raw)] * table.num_rows,
                                                                        type=field_.arrow_type()))
    return table
