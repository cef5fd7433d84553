"""``add_schema`` / ``unihub add-schema``: Petastorm's generate-metadata tool, on plain Parquet Spark wrote.

The Unischema lands in ``_common_metadata`` (replaced atomically, data files untouched) and
``make_reader`` then reads the store with it; a schema that does not match the store's
columns is refused by name and nothing is written.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub import (
    NdarrayCodec,
    ScalarCodec,
    TensorCodec,
    Unischema,
    UnischemaField,
    add_schema,
    generate_petastorm_metadata,
    make_batch_reader,
    make_reader,
    open_dataset,
)
from unihub.cli import main
from unihub.errors import DatasetNotFoundError, PetastormCompatibilityError, SchemaError, SchemaMismatchError
from unihub.petastorm.legacy import PETASTORM_ROW_GROUPS_KEY, PETASTORM_UNISCHEMA_KEY, load_petastorm_unischema
from unihub.schema.unischema import SCHEMA_METADATA_KEY

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm"


@pytest.fixture
def plain(tmp_path: Path) -> Path:
    """A copy of the plain Parquet store Spark wrote (no _common_metadata, no Unischema)."""
    return Path(shutil.copytree(FIXTURES / "plain", tmp_path / "plain"))


def digests(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir()) if p.is_file()}


def columns_of(url: Path) -> dict[str, list]:
    with make_batch_reader(url, shuffle_row_groups=False, workers_count=1) as reader:
        batches = list(reader)
    return {name: [v for b in batches for v in getattr(b, name)] for name in reader.schema.fields}


def schema_with(**changes: UnischemaField) -> Unischema:
    """The plain store's inferred schema, with some fields replaced."""
    fields = [changes.get(f.name, f) for f in open_dataset(FIXTURES / "plain").schema]
    return Unischema("PlainSchema", fields)


def test_inferred_schema_is_written_and_read_back(plain, value_equal):
    before, data = columns_of(plain), {k: v for k, v in digests(plain).items() if k.endswith(".parquet")}
    result = add_schema(plain)
    assert result.origin == "inferred" and result.petastorm_compatible is False
    store = open_dataset(plain)
    assert store.schema_source == "unihub" and store.schema == open_dataset(FIXTURES / "plain").schema
    metadata = pq.read_metadata(plain / "_common_metadata").metadata
    assert Unischema.from_json(metadata[SCHEMA_METADATA_KEY]) == store.schema
    assert PETASTORM_UNISCHEMA_KEY not in metadata
    assert {k: v for k, v in digests(plain).items() if k.endswith(".parquet")} == data  # data files untouched
    after = columns_of(plain)
    for name in before:
        for i, (a, b) in enumerate(zip(after[name], before[name])):
            value_equal(a, b, where=f"{name}[{i}]")
    assert sorted(p.name for p in plain.iterdir()) == sorted([*data, "_SUCCESS", "_common_metadata"])


def test_given_schema_is_what_make_reader_reads(plain, tmp_path):
    expected = columns_of(plain)
    schema = schema_with(label=UnischemaField("label", np.int64, (), ScalarCodec(pa.int64()), True),
                         pair=UnischemaField("pair", np.float32, (2,), TensorCodec(), False))
    path = tmp_path / "schema.json"
    path.write_text(schema.to_json())
    assert add_schema(plain, path).origin == "given"
    assert open_dataset(plain).schema == schema
    with make_reader(plain, shuffle_row_groups=False, workers_count=1) as reader:
        rows = list(reader)
    assert len(rows) == 600
    for i, row in enumerate(rows):
        assert type(row.label) is np.int64 or row.label is None
        assert (None if row.label is None else int(row.label)) == (None if expected["label"][i] is None
                                                                     else int(expected["label"][i]))
        assert row.pair.shape == (2,) and row.pair.dtype == np.float32
        np.testing.assert_array_equal(row.pair, expected["pair"][i])
        assert row.name == expected["name"][i]


def test_a_schema_that_does_not_match_is_refused_by_name(plain):
    bad = Unischema("Bad", [
        UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("name", np.int32, (), ScalarCodec(pa.int32()), False),
        UnischemaField("pair", np.float32, (2,), NdarrayCodec(), False),
        UnischemaField("extra", np.float32, (), ScalarCodec(pa.float32()), False),
    ])
    with pytest.raises(SchemaMismatchError) as caught:
        add_schema(plain, bad)
    assert str(caught.value) == (
        f"Unischema 'Bad' does not match the columns of {plain}: fields not in the store: ['extra']; "
        "columns the schema does not name: ['label', 'x']; 'name' is int32 in the schema but string in the store; "
        "'pair' is binary in the schema but list<element: float not null> in the store")
    assert isinstance(caught.value, SchemaError)
    assert not (plain / "_common_metadata").exists()
    add_schema(plain)
    before = digests(plain)
    with pytest.raises(SchemaMismatchError):
        add_schema(plain, schema_with(x=UnischemaField("x", np.str_, (), ScalarCodec(pa.string()), False)))
    assert digests(plain) == before and sorted(p.name for p in plain.iterdir() if p.name.startswith(".")) == []


def test_unischema_class_is_imported(plain, tmp_path, monkeypatch):
    (tmp_path / "my_schemas.py").write_text(textwrap.dedent("""
        import numpy as np
        from unihub import ScalarCodec, TensorCodec, Unischema, UnischemaField

        class Holder:
            Schema = Unischema("FromModule", [
                UnischemaField("id", np.int64, (), ScalarCodec(np.int64), False),
                UnischemaField("label", np.int32, (), ScalarCodec(np.int32), True),
                UnischemaField("x", np.float64, (), ScalarCodec(np.float64), False),
                UnischemaField("name", np.str_, (), ScalarCodec(np.str_), False),
                UnischemaField("pair", np.float32, (None,), TensorCodec(), False),
            ])
        NOT_A_SCHEMA = 3
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    result = generate_petastorm_metadata(None, str(plain), "my_schemas.Holder.Schema")
    assert result.schema.name == "FromModule" and open_dataset(plain).schema.name == "FromModule"
    with pytest.raises(SchemaError, match="'my_schemas.NOT_A_SCHEMA' is a int, not a Unischema"):
        add_schema(plain, unischema_class="my_schemas.NOT_A_SCHEMA")
    with pytest.raises(SchemaError, match="module 'my_schemas' has no 'Missing'"):
        add_schema(plain, unischema_class="my_schemas.Missing")
    with pytest.raises(SchemaError, match="cannot import 'no_such_module.Schema'"):
        add_schema(plain, unischema_class="no_such_module.Schema")


def test_petastorm_compatible_adds_petastorm_metadata(plain):
    result = add_schema(plain, petastorm_compatible=True)
    assert result.petastorm_compatible
    metadata = pq.read_metadata(plain / "_common_metadata").metadata
    petastorm_view = load_petastorm_unischema(metadata[PETASTORM_UNISCHEMA_KEY])
    assert [f.codec for f in petastorm_view][-1] is None  # the array column, as Petastorm infers it
    assert [(f.name, f.numpy_dtype, f.shape) for f in petastorm_view] == \
        [(f.name, f.numpy_dtype, f.shape) for f in open_dataset(plain).schema]
    assert json.loads(metadata[PETASTORM_ROW_GROUPS_KEY]) == {
        p.name: pq.read_metadata(p).num_row_groups for p in plain.glob("*.parquet")}
    assert open_dataset(plain).schema_source == "unihub"  # unihub's JSON still comes first


def test_a_petastorm_dataset_keeps_its_schema_and_petastorm_metadata(tmp_path):
    root = Path(shutil.copytree(FIXTURES / "unischema", tmp_path / "ps"))
    original = open_dataset(root).schema
    result = add_schema(root)
    assert (result.origin, result.petastorm_compatible) == ("petastorm", True)
    store = open_dataset(root)
    assert store.schema_source == "unihub" and store.schema == original
    metadata = pq.read_metadata(root / "_common_metadata").metadata
    assert load_petastorm_unischema(metadata[PETASTORM_UNISCHEMA_KEY]) == original
    assert b"org.apache.spark.version" in metadata  # what was there is kept
    with pytest.raises(PetastormCompatibilityError, match="'embedding': TensorCodec .* use NdarrayCodec"):
        add_schema(root, Unischema("T", [f if f.name != "embedding" else f._replace(codec=TensorCodec())
                                         for f in original]))
    assert pq.read_metadata(root / "_common_metadata").metadata == metadata
    add_schema(root, petastorm_compatible=False)
    assert PETASTORM_UNISCHEMA_KEY not in pq.read_metadata(root / "_common_metadata").metadata


def test_hive_partitions_are_part_of_the_schema(tmp_path):
    table = pa.table({"id": pa.array(range(8), pa.int64()), "fold": pa.array([i % 2 for i in range(8)], pa.int64())})
    pq.write_to_dataset(table, tmp_path / "parted", partition_cols=["fold"])
    add_schema(tmp_path / "parted")
    assert list(open_dataset(tmp_path / "parted").schema.fields) == ["id", "fold"]
    with make_reader(tmp_path / "parted", workers_count=1) as reader:
        assert sorted((int(r.id), int(r.fold)) for r in reader) == [(i, i % 2) for i in range(8)]
    no_fold = Unischema("NoFold", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False)])
    with pytest.raises(SchemaMismatchError, match=r"columns the schema does not name: \['fold'\]"):
        add_schema(tmp_path / "parted", no_fold)


def test_not_a_store(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="no such directory"):
        add_schema(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match="holds no Parquet data files"):
        add_schema(tmp_path / "empty")


def test_cli_add_schema(plain, tmp_path, capsys):
    assert main(["add-schema", str(plain), "--petastorm-compatible"]) == 0
    out = capsys.readouterr().out
    assert out == (f"wrote Unischema 'plain' (5 fields, inferred from the Parquet types) and Petastorm's metadata "
                   f"into {plain}/_common_metadata\n")
    (tmp_path / "bad.json").write_text(schema_with(x=UnischemaField("x", np.str_, (), None, False)).to_json())
    assert main(["add-schema", str(plain), "--schema", str(tmp_path / "bad.json")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("unihub: error: Unischema 'PlainSchema' does not match")
    with pytest.raises(SystemExit):
        main(["add-schema", "--help"])
    assert "--unischema-class" in capsys.readouterr().out
