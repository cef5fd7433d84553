"""``add_schema``: Petastorm's ``petastorm-generate-metadata.py`` for an existing Parquet store.

Writes a Unischema into a store some other tool wrote (plain Parquet from Spark, pandas, or a
Petastorm dataset whose schema should change), without touching its data files: the
Unischema JSON goes into ``_common_metadata``, where :func:`unihub.open_dataset` looks first,
so ``make_reader`` afterwards reads the store with that schema. The schema is the one given
(a :class:`~unihub.Unischema`, a JSON file, or ``module.attr`` as Petastorm's
``--unischema_class``), else the one the store already carries, else one inferred from the
Arrow types. It must describe the store's columns (and Hive partition keys) exactly, with
types of the same kind as the stored ones; otherwise :class:`SchemaMismatchError` names every
difference and nothing is written. ``_common_metadata`` is replaced atomically.

``petastorm_compatible=True`` also writes what Petastorm 0.13.1 reads (its pickled Unischema,
row groups per file); by default that happens when the store already had Petastorm's
metadata, so both kinds of reader see the same schema.

    from unihub import add_schema
    add_schema("/data/spark_output", "schema.json", petastorm_compatible=True)
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from unihub.converters.convert import load_schema
from unihub.errors import DatasetNotFoundError, SchemaError, SchemaMismatchError
from unihub.fs import filesystem as fsutil
from unihub.fs import remote
from unihub.petastorm.legacy import PETASTORM_UNISCHEMA_KEY, load_petastorm_unischema
from unihub.schema.codecs import TensorCodec, parquet_tensor_type
from unihub.schema.dtypes import numpy_to_arrow_type
from unihub.schema.unischema import SCHEMA_METADATA_KEY, Unischema
from unihub.store.dataset import (
    COMMON_METADATA,
    check_files_agree,
    list_data_files,
    partition_of,
    partition_value,
    read_footers,
    read_metadata,
    resolve_schema,
)
from unihub.store.metadata_files import petastorm_metadata, replace_common_metadata, write_summary_metadata

SchemaOrigin = Literal["given", "unihub", "petastorm", "inferred"]


@dataclass(frozen=True)
class AddSchemaResult:
    """What :func:`add_schema` wrote."""

    url: str
    schema: Unischema
    origin: SchemaOrigin
    petastorm_compatible: bool

    def summary(self) -> str:
        origin = {"given": "given", "unihub": "kept from the store", "petastorm": "kept from Petastorm's metadata",
                  "inferred": "inferred from the Parquet types"}[self.origin]
        extra = " and Petastorm's metadata" if self.petastorm_compatible else ""
        return f"wrote Unischema {self.schema.name!r} ({len(self.schema)} fields, {origin}){extra} into " \
               f"{fsutil.join(self.url, COMMON_METADATA)}"


@remote.naming_url("dataset_url")
def add_schema(dataset_url: str | os.PathLike[str], schema: Unischema | str | os.PathLike[str] | None = None, *,
               unischema_class: Any = None, petastorm_compatible: bool | None = None,
               use_summary_metadata: bool = False, storage_options: dict[str, Any] | None = None,
               filesystem: Any = None) -> AddSchemaResult:
    """Write a Unischema into the Parquet store at ``dataset_url``; see the module docstring.

    ``schema``: a Unischema or a JSON file (``Unischema.to_json()``, ``unihub inspect --json``);
    ``unischema_class``: ``"module.attr"`` (or the object) naming a unihub or Petastorm Unischema.
    ``use_summary_metadata`` also writes ``_metadata`` with every file's row groups.
    """
    url = os.fspath(dataset_url)
    if schema is not None and unischema_class is not None:
        raise SchemaError("give either schema or unischema_class, not both")
    fs, root = fsutil.resolve_filesystem(url, filesystem, storage_options)
    if not fsutil.is_dir(fs, root):
        raise DatasetNotFoundError(f"{url}: no such directory (add_schema writes into a dataset directory)")
    paths = sorted(list_data_files(fs, root))
    if not paths:
        raise DatasetNotFoundError(f"{url}: the directory holds no Parquet data files")
    footers = read_footers(fs, paths)
    file_schema = footers[0].schema.to_arrow_schema()
    check_files_agree(paths, footers, file_schema)
    partitions = [partition_of(root, p) for p in paths]
    common_path = fsutil.join(root, COMMON_METADATA)
    common = dict(read_metadata(fs, common_path).metadata or {}) if fsutil.exists(fs, common_path) else {}

    given = schema if schema is not None else unischema_class
    origin: SchemaOrigin
    if given is not None:
        chosen, origin = (load_unischema(given) if unischema_class is None else locate_unischema(given)), "given"
    else:
        stored = dict(common)
        for key, value in (footers[0].metadata or {}).items():
            stored.setdefault(key, value)
        chosen, origin = resolve_schema(stored, file_schema, partitions, url)
    check_schema_matches(chosen, file_schema, partitions, url)
    if petastorm_compatible is None:
        petastorm_compatible = PETASTORM_UNISCHEMA_KEY in common

    metadata = {**(file_schema.metadata or {}), **common, SCHEMA_METADATA_KEY: chosen.to_json().encode()}
    if petastorm_compatible:
        metadata.update(petastorm_metadata(chosen, fs, root, paths))
    else:
        metadata.pop(PETASTORM_UNISCHEMA_KEY, None)  # it would contradict the new schema
    replace_common_metadata(fs, root, file_schema.with_metadata(metadata))
    if use_summary_metadata:
        write_summary_metadata(fs, root, paths, read_metadata(fs, paths[0]))
    return AddSchemaResult(url, chosen, origin, petastorm_compatible)


def generate_petastorm_metadata(spark: Any, dataset_url: str, unischema_class: Any = None,
                                use_summary_metadata: bool = False, hdfs_driver: str = "libhdfs3", *,
                                schema: Unischema | str | os.PathLike[str] | None = None,
                                petastorm_compatible: bool | None = None,
                                storage_options: dict[str, Any] | None = None) -> AddSchemaResult:
    """Petastorm's name and arguments for :func:`add_schema`.

    ``spark`` is not needed (footers are read with pyarrow) and is left running, unlike
    Petastorm's, which stopped it; ``hdfs_driver`` is accepted for the signature.
    """
    return add_schema(dataset_url, schema, unischema_class=unischema_class, petastorm_compatible=petastorm_compatible,
                      use_summary_metadata=use_summary_metadata, storage_options=storage_options)


# -- finding the schema -------------------------------------------------------------------------
def load_unischema(schema: Unischema | str | os.PathLike[str]) -> Unischema:
    """A Unischema, a Petastorm Unischema object (converted), or one read from a JSON file."""
    if isinstance(schema, Unischema):
        return schema
    if type(schema).__name__ == "Unischema" and type(schema).__module__.endswith("unischema"):
        return _from_petastorm(schema)
    if isinstance(schema, (str, os.PathLike)):
        return load_schema(schema)
    raise SchemaError(f"expected a Unischema or a JSON file, got {type(schema).__name__}")


def locate_unischema(dotted: Any) -> Unischema:
    """The Unischema named ``"package.module.attr"`` (imported, as Petastorm's ``--unischema_class``)."""
    if not isinstance(dotted, str):
        return load_unischema(dotted)
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.startswith(exc.name):
                continue  # this prefix is not a module: try a shorter one
            raise SchemaError(f"importing {module_name!r} for {dotted!r} failed: {exc}") from exc
        try:
            for attribute in parts[cut:]:
                obj = getattr(obj, attribute)
        except AttributeError as exc:
            raise SchemaError(f"{dotted!r}: module {module_name!r} has no {'.'.join(parts[cut:])!r}") from exc
        if isinstance(obj, Unischema) or type(obj).__name__ == "Unischema":
            return load_unischema(obj)
        raise SchemaError(f"{dotted!r} is a {type(obj).__name__}, not a Unischema")
    raise SchemaError(f"cannot import {dotted!r}: no module of that name (is its directory on PYTHONPATH?)")


def _from_petastorm(schema: Any) -> Unischema:
    """A ``petastorm.unischema.Unischema`` object as unihub's, through the allow-listed unpickler."""
    import pickle

    return load_petastorm_unischema(pickle.dumps(schema))


# -- matching the store -----------------------------------------------------------------------
def _kind(arrow_type: pa.DataType) -> str:
    """A type's kind, width aside: ``'int'``, ``'float'``, ``'string'``, ``'list<float>'`` ..."""
    if isinstance(arrow_type, pa.BaseExtensionType):
        arrow_type = arrow_type.storage_type
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    checks = (("int", pa.types.is_integer), ("float", pa.types.is_floating), ("bool", pa.types.is_boolean),
              ("string", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t) or str(t) == "string_view"),
              ("binary", lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t) or
               pa.types.is_fixed_size_binary(t) or str(t) == "binary_view"),
              ("decimal", pa.types.is_decimal), ("date", pa.types.is_date), ("timestamp", pa.types.is_timestamp),
              ("time", pa.types.is_time), ("duration", pa.types.is_duration), ("struct", pa.types.is_struct),
              ("map", pa.types.is_map), ("null", pa.types.is_null))
    for name, check in checks:
        if check(arrow_type):
            return name
    if hasattr(arrow_type, "value_type"):  # lists of every kind
        return f"list<{_kind(arrow_type.value_type)}>"
    return str(arrow_type)


def _leaf_kind(kind: str) -> str:
    return kind.replace("list<", "").replace(">", "")


def _compatible(field: Any, stored: pa.DataType) -> bool:
    expected = parquet_tensor_type(field) or field.arrow_type()
    want, have = _kind(expected), _kind(stored)
    if want == have or (have == "null" and field.nullable):
        return True
    if want == "int" and have == "decimal":  # Spark stores uint64 as decimal(20, 0)
        return stored.scale == 0
    if isinstance(field.codec, TensorCodec):  # tensors Spark or others wrote as (nested) lists
        return have.startswith("list<") and _leaf_kind(have) == _kind(numpy_to_arrow_type(field.numpy_dtype))
    return False


def check_schema_matches(schema: Unischema, file_schema: pa.Schema, partitions: list[tuple[tuple[str, str], ...]],
                         url: str) -> None:
    """Raise :class:`SchemaMismatchError` unless ``schema`` names exactly the store's columns and
    partition keys, each with a type of the stored kind (integer widths may differ)."""
    partition_names = [k for k, _ in partitions[0]] if partitions else []
    columns = {f.name: f.type for f in file_schema}
    names = set(columns) | set(partition_names)
    problems = []
    missing = [f.name for f in schema if f.name not in names]
    if missing:
        problems.append(f"fields not in the store: {missing}")
    unnamed = [n for n in [*columns, *partition_names] if n not in schema]
    if unnamed:
        problems.append(f"columns the schema does not name: {unnamed}")
    for field in schema:
        if field.name in columns and not _compatible(field, columns[field.name]):
            problems.append(f"{field.name!r} is {parquet_tensor_type(field) or field.arrow_type()} in the schema "
                            f"but {columns[field.name]} in the store")
        elif field.name in partition_names:
            for raw in sorted({dict(p).get(field.name, "") for p in partitions}):
                try:
                    partition_value(field, raw)
                except SchemaError as exc:
                    problems.append(str(exc))
                    break
    if problems:
        raise SchemaMismatchError(f"Unischema {schema.name!r} does not match the columns of {url}: "
                                  + "; ".join(problems))
