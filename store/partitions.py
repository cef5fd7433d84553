"""Hive partition folders (``key=value/``) of a dataset's files: the pairs a path holds, and each value as its
field's (the store's readers, and a delete's filter over a part's rows, add them as columns)."""

from __future__ import annotations

import decimal
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa

from unihub.errors import SchemaError
from unihub.schema.unischema import Unischema, UnischemaField


def partition_of(base: str, path: str) -> tuple[tuple[str, str], ...]:
    """The Hive partition ``(key, value)`` pairs of ``path``'s folders under ``base`` (``k=v/``)."""
    rel = path[len(base):].lstrip("/").split("/")[:-1]
    return tuple((k, unquote(v)) for k, _, v in (part.partition("=") for part in rel) if _ == "=")


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
