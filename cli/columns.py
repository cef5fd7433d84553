"""``unihub columns add DS VALUES.npy --field NAME``, ``unihub columns list DS``, ``unihub columns rm DS SET``:
columns added to a dataset's existing rows without rewriting its part files (store/columns.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from unihub.cli.storage import add_storage_option, storage_options_of
from unihub.errors import ColumnSetError
from unihub.schema.codecs import ScalarCodec, TensorCodec
from unihub.schema.unischema import UnischemaField
from unihub.store.columns import add_column, list_columns, remove_columns

_EXAMPLES = """examples:
  unihub columns add /data/train emb.npy --field embedding     # float32 (N, 512): one row per dataset row
  unihub columns add /data/train split.txt --field split --replace   # one line per row: a backfill
  unihub columns list s3://bucket/train
  unihub columns list /data/train --version 3                   # the sets version 3 reads
  unihub columns rm /data/train embedding"""


def add_columns_commands(sub: Any) -> None:
    """Register ``unihub columns ...`` on the CLI's subparsers."""
    columns = sub.add_parser("columns", help="add, list or remove columns added to existing rows (no rewrite)",
                             description="Columns added to a dataset's existing rows, stored beside its part files "
                                         "(which are not rewritten) and joined on read.",
                             formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EXAMPLES)
    verbs = columns.add_subparsers(dest="columns_command", required=True)
    add = verbs.add_parser("add", help="add a field from a .npy file (or a text file: one str per line)",
                           formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EXAMPLES)
    add.add_argument("url", help="dataset (folder or s3://...)")
    add.add_argument("values", help=".npy file of one value per row in the dataset's row order, or a text file "
                                    "of one line per row")
    add.add_argument("--field", required=True, help="the new field's name")
    add.add_argument("--name", help="the column set's name (default: the field's)")
    add.add_argument("--replace", action="store_true", help="replace the set of that name (a backfill)")
    add.add_argument("--tag", help="a name for the version it makes")
    add_storage_option(add)
    add.set_defaults(func=cmd_columns_add)
    listing = verbs.add_parser("list", help="the column sets and their fields",
                               formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EXAMPLES)
    listing.add_argument("url")
    listing.add_argument("--version", type=int, help="the sets of this version (default: the latest)")
    add_storage_option(listing)
    listing.set_defaults(func=cmd_columns_list)
    rm = verbs.add_parser("rm", help="remove a column set", formatter_class=argparse.RawDescriptionHelpFormatter,
                          epilog=_EXAMPLES)
    rm.add_argument("url")
    rm.add_argument("name", help="the column set")
    rm.add_argument("--tag", help="a name for the version it makes")
    add_storage_option(rm)
    rm.set_defaults(func=cmd_columns_rm)


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
