"""``unihub columns add DS VALUES.npy --field NAME``, ``unihub columns list DS``, ``unihub columns rm DS SET``:
columns added to a dataset's existing rows without rewriting its part files (store/columns.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from unihub.cli.parsers import STORAGE_OPTION, TAG, add_command, arg
from unihub.cli.storage import storage_options_of
from unihub.errors import ColumnSetError
from unihub.schema.codecs import ScalarCodec, TensorCodec
from unihub.schema.unischema import UnischemaField
from unihub.store.columns import add_column, list_columns, remove_columns

_EXAMPLES = (
    "unihub columns add /data/train emb.npy --field embedding     # float32 (N, 512): one row per dataset row",
    "unihub columns add /data/train split.txt --field split --replace   # one line per row: a backfill",
    "unihub columns list s3://bucket/train",
    "unihub columns list /data/train --version 3                   # the sets version 3 reads",
    "unihub columns rm /data/train embedding",
)


def add_columns_commands(sub: Any) -> None:
    """Register ``unihub columns ...`` on the CLI's subparsers."""
    columns = add_command(sub, "columns", None, help="add, list or remove columns added to existing rows (no rewrite)",
                          description="Columns added to a dataset's existing rows, stored beside its part files "
                                      "(which are not rewritten) and joined on read.", examples=_EXAMPLES)
    verbs = columns.add_subparsers(dest="columns_command", required=True)
    add_command(verbs, "add", cmd_columns_add, arg("url", help="dataset (folder or s3://...)"),
                arg("values", help=".npy file of one value per row in the dataset's row order, or a text file "
                                   "of one line per row"),
                arg("--field", required=True, help="the new field's name"),
                arg("--name", help="the column set's name (default: the field's)"),
                arg("--replace", action="store_true", help="replace the set of that name (a backfill)"),
                TAG, STORAGE_OPTION,
                help="add a field from a .npy file (or a text file: one str per line)", examples=_EXAMPLES)
    add_command(verbs, "list", cmd_columns_list, arg("url"),
                arg("--version", type=int, help="the sets of this version (default: the latest)"), STORAGE_OPTION,
                help="the column sets and their fields", examples=_EXAMPLES)
    add_command(verbs, "rm", cmd_columns_rm, arg("url"), arg("name", help="the column set"), TAG, STORAGE_OPTION,
                help="remove a column set", examples=_EXAMPLES)


def field_for(name: str, values: np.ndarray) -> UnischemaField:
    """A nullable field holding ``values``' rows: a scalar of its dtype, or a tensor of its row shape."""
    if values.dtype.kind == "U":
        return UnischemaField(name, np.str_, (), ScalarCodec(pa.string()), True)
    if values.dtype.kind not in "biuf":
        raise ColumnSetError(f"{name}: values of dtype {values.dtype} (numbers, booleans or text are added)")
    if values.ndim == 1:
        return UnischemaField(name, values.dtype.type, (), ScalarCodec(pa.from_numpy_dtype(values.dtype)), True)
    return UnischemaField(name, values.dtype.type, values.shape[1:], TensorCodec(), True)


def read_values(path: str) -> np.ndarray:
    """A ``.npy`` file's array (no pickles), else a text file's lines."""
    if path.endswith(".npy"):
        try:
            return np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ColumnSetError(f"{path}: not a .npy file of numbers or text: {exc}") from exc
    try:
        return np.array(Path(path).read_text(encoding="utf-8").splitlines(), dtype=np.str_)
    except (OSError, UnicodeDecodeError) as exc:
        raise ColumnSetError(f"{path}: cannot read its lines: {exc}") from exc


def cmd_columns_add(args: argparse.Namespace) -> int:
    values = read_values(args.values)
    result = add_column(args.url, field_for(args.field, values), values, name=args.name, replace=args.replace,
                        tag=args.tag, storage_options=storage_options_of(args))
    print(f"added {result.name!r} ({', '.join(result.fields)}) to {result.num_rows:,} rows of {args.url} as version "
          f"{result.version}: {result.bytes_written:,} bytes written in {len(result.files)} file(s); the parts are "
          "untouched")
    return 0


def cmd_columns_list(args: argparse.Namespace) -> int:
    for name, fields in list_columns(args.url, version=args.version, storage_options=storage_options_of(args)).items():
        print(f"{name}: {', '.join(fields)}")
    return 0


def cmd_columns_rm(args: argparse.Namespace) -> int:
    number = remove_columns(args.url, args.name, tag=args.tag, storage_options=storage_options_of(args))
    print(f"removed column set {args.name!r} from {args.url} as version {number} (its files stay for the older "
          "versions until unihub vacuum)")
    return 0
