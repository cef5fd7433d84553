"""Hostile Parquet key-value metadata: each variant of ``unihub.unischema`` and ``unihub.extra`` that unihub
never writes, written by pyarrow itself into a dataset unihub wrote, is one SchemaError naming the file, the key
and what is wrong, in ``unihub inspect``, ``unihub show``, ``make_reader`` and ``make_batch_reader`` alike;
the CLI prints it as one ``unihub: error:`` line, exits 1, writes nothing and leaves the dataset as it was."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub import (
    CompressedImageCodec,
    ScalarCodec,
    TensorCodec,
    Unischema,
    UnischemaField,
    make_batch_reader,
    make_reader,
    write_dataset,
)
from unihub.cli import main
from unihub.errors import CodecError, FormatError, SchemaError, SchemaMismatchError, UnsupportedFormatError
from unihub.schema.metadata_json import EXTRA_METADATA_KEY, MAX_NESTING, load_metadata_json
from unihub.store.dataset import open_dataset

SCHEMA = Unischema("Hostile", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("v", np.float32, (None,), TensorCodec(), False),
    UnischemaField("img", np.uint8, (4, 4, 3), CompressedImageCodec("png"), True),
])
EXTRA = {"source_format": "tfrecord", "source": "/data/x.tfrecord", "source_files": 1, "skipped_count": 1,
         "skipped": [{"path": "/data/x.tfrecord", "location": "record 3", "reason": "truncated"}],
         "user": {"note": "a caller's own key"}}
UNISCHEMA = b"unihub.unischema"
EXTRA_KEY = EXTRA_METADATA_KEY


def _good_schema() -> dict[str, Any]:
    return json.loads(SCHEMA.to_json())


def schema_json(change: Callable[[dict[str, Any]], Any]) -> bytes:
    """The dataset's own Unischema JSON, changed by ``change`` (which edits the dict in place)."""
    data = _good_schema()
    change(data)
    return json.dumps(data).encode()


def field0(**values: Any) -> bytes:
    return schema_json(lambda d: d["fields"][0].update(values))


def codec0(**values: Any) -> bytes:
    return schema_json(lambda d: d["fields"][0]["codec"].update(values))


def extra_json(**values: Any) -> bytes:
    return json.dumps({**EXTRA, **values}).encode()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# variant -> (key, stored bytes, what the message says is wrong)
HOSTILE: dict[str, tuple[bytes, bytes, str]] = {
    # unihub.extra
    "extra-array": (EXTRA_KEY, b"[1, 2]", r"\$: expected object, got \[1, 2\]"),
    "extra-string": (EXTRA_KEY, b'"provenance"', r'\$: expected object, got "provenance"'),
    "extra-null": (EXTRA_KEY, b"null", r"\$: expected object, got null"),
    "extra-utf16-bom": (EXTRA_KEY, b"\xff\xfe{\x00}\x00", r"not valid JSON: not UTF-8 text \(byte 0"),
    "extra-latin1": (EXTRA_KEY, '{"source": "caf\xe9"}'.encode("latin-1"), r"not valid JSON: not UTF-8 text"),
    "extra-not-json": (EXTRA_KEY, b"{nope", r"not valid JSON: Expecting property name"),
    "extra-truncated": (EXTRA_KEY, extra_json()[:-3], r"not valid JSON"),
    "extra-nested-100000": (EXTRA_KEY, nested(100_000).encode(), r"nested past Python's recursion limit"),
    "extra-user-key-nested-200": (EXTRA_KEY, json.dumps({"user": json.loads(nested(200))}).encode(),
                                  rf"\$\.user: arrays and objects nested deeper than {MAX_NESTING} levels"),
    "skipped_count-string": (EXTRA_KEY, extra_json(skipped_count="5"), r'\$\.skipped_count: expected integer, got "5"'),
    "skipped_count-NaN": (EXTRA_KEY, b'{"skipped_count": NaN}', r"\$\.skipped_count: expected integer, got NaN"),
    "skipped_count-Infinity": (EXTRA_KEY, b'{"skipped_count": Infinity}',
                               r"\$\.skipped_count: expected integer, got Infinity"),
    "skipped_count-negative": (EXTRA_KEY, extra_json(skipped_count=-1), r"\$\.skipped_count: expected at least 0"),
    "skipped_count-bool": (EXTRA_KEY, extra_json(skipped_count=True), r"\$\.skipped_count: expected integer, got true"),
    "skipped-string": (EXTRA_KEY, extra_json(skipped="many"), r'\$\.skipped: expected array, got "many"'),
    "skipped-record-number": (EXTRA_KEY, extra_json(skipped=[7]), r"\$\.skipped\[0\]: expected object, got 7"),
    "source_files-string": (EXTRA_KEY, extra_json(source_files="3"), r'\$\.source_files: expected integer'),
    "classes-numbers": (EXTRA_KEY, extra_json(classes=[1, 2]), r"\$\.classes\[0\]: expected string, got 1"),
    "cache-list": (EXTRA_KEY, extra_json(cache=[1]), r"\$\.cache: expected object"),
    "cache-built_at-1e300": (EXTRA_KEY, extra_json(cache={"dataset_id": "d", "version": "1", "built_at": 1e300}),
                             r"\$\.cache\.built_at: expected at most 253402300799, got 1e\+300"),
    "cache-version-list": (EXTRA_KEY, extra_json(cache={"dataset_id": "d", "version": [1]}),
                           r"\$\.cache\.version: expected string, got \[1\]"),
    # unihub.unischema
    "schema-utf8-broken": (UNISCHEMA, b"\xff" + SCHEMA.to_json().encode(), r"not valid JSON: not UTF-8 text"),
    "schema-not-json": (UNISCHEMA, SCHEMA.to_json().encode()[:-2], r"not valid JSON"),
    "schema-nested-100000": (UNISCHEMA, nested(100_000).encode(), r"nested past Python's recursion limit"),
    "schema-array": (UNISCHEMA, b"[]", r"not a unihub Unischema"),
    "schema-version-string": (UNISCHEMA, schema_json(lambda d: d.update(version="1")),
                              r"Unischema JSON version '1' is not supported"),
    "schema-version-true": (UNISCHEMA, schema_json(lambda d: d.update(version=True)),
                            r"Unischema JSON version True is not supported"),
    "fields-string": (UNISCHEMA, schema_json(lambda d: d.update(fields="abc")),
                      r'\$\.fields: expected array, got "abc"'),
    "fields-object": (UNISCHEMA, schema_json(lambda d: d.update(fields={"id": {}})), r"\$\.fields: expected array"),
    "fields-missing": (UNISCHEMA, schema_json(lambda d: d.pop("fields")), r"\$: lacks the key 'fields'"),
    "name-number": (UNISCHEMA, schema_json(lambda d: d.update(name=5)), r"\$\.name: expected string, got 5"),
    "field-number": (UNISCHEMA, schema_json(lambda d: d["fields"].append(3)), r"\$\.fields\[3\]: expected object"),
    "field-name-empty": (UNISCHEMA, field0(name=""), r"\$\.fields\[0\]\.name: expected a non-empty string"),
    "field-unknown-key": (UNISCHEMA, field0(default=0), r"\$\.fields\[0\]: unknown key 'default'"),
    "field-no-dtype": (UNISCHEMA, schema_json(lambda d: d["fields"][0].pop("dtype")),
                       r"\$\.fields\[0\]: lacks the key 'dtype'"),
    "dtype-number": (UNISCHEMA, field0(dtype=7), r"\$\.fields\[0\]\.dtype: expected string, got 7"),
    "dtype-unknown": (UNISCHEMA, field0(dtype="int3"), r"\$\.fields\[0\] \(field 'id'\): unknown dtype name 'int3'"),
    "shape-string": (UNISCHEMA, field0(shape="3"), r'\$\.fields\[0\]\.shape: expected array, got "3"'),
    "shape-negative": (UNISCHEMA, field0(shape=[-1]), r"\$\.fields\[0\]\.shape\[0\]: expected at least 0, got -1"),
    "shape-fraction": (UNISCHEMA, field0(shape=[1.5]), r"\$\.fields\[0\]\.shape\[0\]: expected integer or null"),
    "nullable-string": (UNISCHEMA, field0(nullable="no"), r'\$\.fields\[0\]\.nullable: expected boolean, got "no"'),
    "codec-minus-1": (UNISCHEMA, field0(codec=-1), r"\$\.fields\[0\]\.codec: expected null or object, got -1"),
    "codec-nested-list": (UNISCHEMA, field0(codec=[[1]]), r"\$\.fields\[0\]\.codec: expected null or object, got \[\[1\]\]"),
    "codec-string": (UNISCHEMA, field0(codec="scalar"), r'\$\.fields\[0\]\.codec: expected null or object, got "scalar"'),
    "codec-unknown-key": (UNISCHEMA, codec0(compression="zstd"), r"\$\.fields\[0\]\.codec: unknown key 'compression'"),
    "codec-no-type": (UNISCHEMA, schema_json(lambda d: d["fields"][0]["codec"].pop("type")),
                      r"\$\.fields\[0\]\.codec: lacks the key 'type'"),
    "codec-type-number": (UNISCHEMA, codec0(type=1), r"\$\.fields\[0\]\.codec\.type: expected string, got 1"),
    "codec-unknown-name": (UNISCHEMA, codec0(type="mystery"), r"unknown codec 'mystery'; valid names: "),
    "scalar-no-arrow-type": (UNISCHEMA, schema_json(lambda d: d["fields"][0]["codec"].pop("arrow_type")),
                             r"\$\.fields\[0\]\.codec: lacks the key 'arrow_type'"),
    "scalar-arrow-type-list": (UNISCHEMA, codec0(arrow_type=["int64"]),
                               r"\$\.fields\[0\]\.codec\.arrow_type: expected string"),
    "scalar-arrow-type-nonsense": (UNISCHEMA, codec0(arrow_type="int65"), r"cannot read Arrow type 'int65'"),
    "scalar-arrow-type-bad-ipc": (UNISCHEMA, codec0(arrow_type="ipc:!!!!"), r"cannot read Arrow type 'ipc:!!!!'"),
    "image-quality-500": (UNISCHEMA, schema_json(lambda d: d["fields"][2]["codec"].update(quality=500)),
                          r"\$\.fields\[2\]\.codec\.quality: expected at most 100, got 500"),
    "image-codec-gif": (UNISCHEMA, schema_json(lambda d: d["fields"][2]["codec"].update(image_codec="gif")),
                        r"\$\.fields\[2\] \(field 'img'\): .*'png' and 'jpeg', not 'gif'"),
    "tensor-extra-key": (UNISCHEMA, schema_json(lambda d: d["fields"][1]["codec"].update(shape=[2])),
                         r"\$\.fields\[1\]\.codec: unknown key 'shape'"),
}


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def good_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hostile") / "good"
    img = np.zeros((4, 4, 3), np.uint8)
    rows = ({"id": i, "v": np.arange(i % 3, dtype=np.float32), "img": img} for i in range(6))
    write_dataset(path, SCHEMA, rows, rows_per_file=3, extra_metadata=EXTRA)
    return path


def with_metadata(good: Path, target: Path, key: bytes, value: bytes, *, common: bool = True) -> Path:
    """A copy of ``good`` whose files (and ``_common_metadata`` when ``common``) hold ``value`` under ``key``,
    written by pyarrow itself."""
    target.mkdir()
    for part in sorted(good.glob("part-*.parquet")):
        table = pq.read_table(part)
        pq.write_table(table.replace_schema_metadata({**table.schema.metadata, key: value}), target / part.name)
    if common:
        schema = pq.read_schema(good / "_common_metadata")
        pq.write_metadata(schema.with_metadata({**schema.metadata, key: value}), target / "_common_metadata")
    return target


def library_error(entry: str, path: Path) -> BaseException:
    opener = {"make_reader": make_reader, "make_batch_reader": make_batch_reader}[entry]
    with pytest.raises(SchemaError) as caught:
        with opener(str(path), reader_pool_type="dummy") as reader:
            next(iter(reader))
    return caught.value


def cli_error(entry: str, path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The one line the CLI prints to stderr (after checking it is one line, exit 1, no output written)."""
    out = tmp_path / "report.html"
    argv = ["inspect", str(path)] if entry == "inspect" else ["show", str(path), "--out", str(out), "--quiet"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("unihub: error: "), err
    assert "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob(".*report*"))
    return lines[0]


@pytest.mark.parametrize("entry", ["inspect", "show", "make_reader", "make_batch_reader"])
@pytest.mark.parametrize("variant", sorted(HOSTILE))
def test_hostile_metadata_is_a_schema_error_naming_file_and_key(
        variant: str, entry: str, good_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key, value, problem = HOSTILE[variant]
    path = with_metadata(good_dataset, tmp_path / "ds", key, value)
    before = tree_digest(path)
    where = re.escape(f"{path / '_common_metadata'}: metadata key '{key.decode()}': ")
    if entry in ("inspect", "show"):
        line = cli_error(entry, path, tmp_path, capsys)
        assert re.match(f"unihub: error: {where}.*{problem}", line), line
    else:
        message = str(library_error(entry, path))
        assert re.match(f"{where}.*{problem}", message), message
    assert tree_digest(path) == before


def test_a_footer_names_itself_where_there_is_no_common_metadata(good_dataset: Path, tmp_path: Path) -> None:
    key, value, problem = HOSTILE["codec-minus-1"]
    path = with_metadata(good_dataset, tmp_path / "ds", key, value, common=False)
    message = str(library_error("make_reader", path))
    assert message.startswith(f"{path / 'part-00000.parquet'}: metadata key 'unihub.unischema': ")
    assert re.search(problem, message)


@pytest.mark.parametrize("entry", ["inspect", "show", "make_batch_reader"])
@pytest.mark.parametrize("file", ["part-00000.parquet", "_common_metadata"])
def test_a_footer_naming_a_column_in_bytes_not_utf8_is_a_named_error(
        file: str, entry: str, good_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: pyarrow's UnicodeDecodeError (building the column paths) escaped as a raw traceback."""
    path = tmp_path / "ds"
    path.mkdir()
    for good in good_dataset.iterdir():
        data = good.read_bytes()
        if good.name == file:  # the footer's schema names "id" first (a binary of length 2): made not UTF-8
            at = data.index(b"\x02id", len(data) - 8 - int.from_bytes(data[-8:-4], "little"))
            data = data[:at + 1] + b"\xf9d" + data[at + 3:]
        (path / good.name).write_bytes(data)
    where = re.escape(f"{path / file}: not a readable Parquet file")
    if entry == "make_batch_reader":
        with pytest.raises(FormatError, match=where):
            with make_batch_reader(str(path), reader_pool_type="dummy") as reader:
                next(iter(reader))
    else:
        assert re.match(f"unihub: error: {where}", cli_error(entry, path, tmp_path, capsys))


def test_metadata_unihub_writes_passes_and_extra_keeps_a_callers_json(good_dataset: Path, tmp_path: Path) -> None:
    """The check refuses only what unihub never writes: a caller's own keys hold any JSON up to the nesting
    bound, and the provenance reads back as written."""
    deep = json.loads("[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1))
    extra = {**EXTRA, "user": {"list": [1, "a", None, 2.5, {"x": [True]}], "deep": deep}, "skipped_count": 0}
    path = with_metadata(good_dataset, tmp_path / "ds", EXTRA_KEY, json.dumps(extra).encode())
    with make_reader(str(path), reader_pool_type="dummy") as reader:
        assert sorted(row.id for row in reader) == list(range(6))
    store = open_dataset(path)
    assert store.extra_metadata == extra
    store.extra_metadata["user"]["list"].clear()  # a copy: the store keeps what it read
    assert store.extra_metadata == extra


# -- a field the schema lists but the files lack -----------------------------------------------------------
@pytest.fixture()
def ghost_dataset(good_dataset: Path, tmp_path: Path) -> Path:
    ghost = {"name": "ghost", "dtype": "int64", "shape": [], "codec": None, "nullable": False}
    return with_metadata(good_dataset, tmp_path / "ds", UNISCHEMA, schema_json(lambda d: d["fields"].append(ghost)))


@pytest.mark.parametrize("opener", [make_reader, make_batch_reader])
def test_a_field_the_files_lack_is_a_named_error_in_the_readers(opener: Callable[..., Any],
                                                                 ghost_dataset: Path) -> None:
    with pytest.raises(SchemaMismatchError, match=re.escape(f"{ghost_dataset}: the schema (unihub metadata) lists 1 "
                                                            "field(s) that the data files hold no column for: 'ghost'")):
        opener(str(ghost_dataset), reader_pool_type="dummy")
    with opener(str(ghost_dataset), schema_fields=["id", "v"], reader_pool_type="dummy") as reader:  # the others read
        assert sum(len(np.atleast_1d(item.id)) for item in reader) == 6


def test_a_field_the_files_lack_is_flagged_by_inspect_and_show(ghost_dataset: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(ghost_dataset)]) == 1
    captured = capsys.readouterr()
    assert "ghost (no column in the files)" in captured.out
    assert captured.err.splitlines() == [captured.err.strip()]
    assert captured.err.startswith(f"unihub: error: {ghost_dataset}: the schema (unihub metadata) lists 1 field(s)")
    assert main(["inspect", str(ghost_dataset), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["missing_fields"] == ["ghost"]
    line = cli_error("show", ghost_dataset, tmp_path, capsys)
    assert "'ghost'" in line


def test_the_description_is_json_schema_that_agrees_with_the_check() -> None:
    """The one description is standard JSON Schema: jsonschema's own validator (where installed) accepts
    what unihub writes and refuses every variant that :func:`check` refuses for its shape."""
    jsonschema = pytest.importorskip("jsonschema")
    from unihub.schema.metadata_json import METADATA_JSON_SCHEMAS, parse_json

    for description in METADATA_JSON_SCHEMAS.values():
        jsonschema.Draft202012Validator.check_schema(description)
    validators = {key: jsonschema.Draft202012Validator(description) for key, description in
                  METADATA_JSON_SCHEMAS.items()}
    assert validators[UNISCHEMA].is_valid(_good_schema()) and validators[EXTRA_KEY].is_valid(EXTRA)
    shaped = {name: (key, value) for name, (key, value, problem) in HOSTILE.items()
              if problem.startswith(r"\$") and "nested" not in problem and "(field '" not in problem}
    assert len(shaped) > 30
    for name, (key, value) in shaped.items():
        assert not validators[key].is_valid(parse_json(value)), name


@pytest.mark.parametrize(("stored", "problem"), [
    (nested(100_000).encode(), "nested past Python's recursion limit"),
    (b"\xff\xfe{\x00}\x00", "not UTF-8 text"),
    (b'{"format": "unihub.rowgroup_index", "version": 1, "indexes": [{"kind": [1]}]}',
     "a row-group index entry is malformed"),
    # the files it was built over, not [path, row groups] pairs: a TypeError or ValueError (unpacking, summing)
    (b'{"format": "unihub.rowgroup_index", "version": 1, "indexes": [], "files": [1]}',
     "the row-group index's files are not [path, row groups] pairs: [1]"),
    (b'{"format": "unihub.rowgroup_index", "version": 1, "indexes": [], "files": [["part-00000.parquet", "x"]]}',
     "the row-group index's files are not [path, row groups] pairs"),
    (b'{"format": "unihub.rowgroup_index", "version": 1, "indexes": [], "files": 5}',
     "the row-group index's files are not [path, row groups] pairs: 5"),
])
def test_a_hostile_rowgroup_index_is_reported_unreadable_by_inspect(
        stored: bytes, problem: str, good_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The row-group index is optional: inspect describes the dataset and says why its index is unreadable."""
    path = with_metadata(good_dataset, tmp_path / "ds", b"unihub.rowgroup_index", stored)
    assert main(["inspect", str(path)]) == 0
    captured = capsys.readouterr()
    assert "unreadable: " in captured.out and problem in captured.out and captured.err == ""


# -- fuzzed metadata: whatever the JSON, a schema, a SchemaError, or the codec registry's error -------------------
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ = settings(max_examples=int(os.environ.get("UNIHUB_FUZZ_EXAMPLES", "60")) * 5, deadline=None, database=None,
                derandomize=not os.environ.get("UNIHUB_FUZZ_RANDOM"))
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8)
    | st.sampled_from(["scalar", "tensor", "compressed_image", "ndarray", "int64", "ipc:", "png", "str"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(
        st.sampled_from(["type", "name", "dtype", "shape", "codec", "nullable", "arrow_type", "quality", "x"]),
        children, max_size=3),
    max_leaves=8)


def mutated(document: Any, steps: list[int], replacement: Any) -> Any:
    """``document`` with the node that ``steps`` lead to (each an index into a container's children) replaced."""
    document = json.loads(json.dumps(document))
    parent: Any = None
    key: Any = None
    node = document
    for step in steps:
        children = sorted(node) if isinstance(node, dict) else range(len(node)) if isinstance(node, list) else []
        if not children:
            break
        parent, key = node, list(children)[step % len(children)]
        node = node[key]
    if parent is None:
        return replacement
    parent[key] = replacement
    return document


@FUZZ
@given(steps=st.lists(st.integers(0, 50), max_size=5), replacement=JSON_VALUES)
def test_fuzzed_unischema_json_is_a_schema_or_a_named_error(steps: list[int], replacement: Any) -> None:
    text = json.dumps(mutated(_good_schema(), steps, replacement))
    try:
        schema = Unischema.from_json(text)
    except (SchemaError, UnsupportedFormatError):
        return
    assert Unischema.from_json(schema.to_json()) == schema  # what was accepted is a schema that round-trips


@FUZZ
@given(steps=st.lists(st.integers(0, 50), max_size=4), replacement=JSON_VALUES)
def test_fuzzed_extra_json_is_refused_by_name_or_shown(steps: list[int], replacement: Any) -> None:
    from unihub.viewer.html import _provenance

    try:
        extra = load_metadata_json(json.dumps(mutated(EXTRA, steps, replacement)).encode(), EXTRA_KEY, where="f")
    except SchemaError as exc:
        assert str(exc).startswith("f: metadata key 'unihub.extra': ")
        return
    assert _provenance(extra).startswith('<section id="provenance">')  # what was accepted, show can render


@pytest.mark.parametrize("shape", [[2**62], [2**40, 2**20], [None], [3, 0]],
                         ids=["2**62", "2**60-values", "varying", "zero"])
def test_a_tensor_shape_that_the_stored_column_does_not_have_is_a_named_error(
        shape: list[int | None], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Tensors of shape (3,) stored as 12-byte values, under a schema that says another shape. Before: OverflowError
    from pa.binary (a width past Arrow's int32), or numpy's ValueError decoding the bytes as numbers ('could not
    convert string to float'); converting it, OverflowError or ArrowInvalid from pa.fixed_shape_tensor."""
    schema = Unischema("Fixed", [UnischemaField("t", np.float32, (3,), TensorCodec(), False)])
    write_dataset(tmp_path / "good", schema, ({"t": np.full(3, i, np.float32)} for i in range(4)))
    value = json.dumps({**json.loads(schema.to_json()), "fields": [
        {**json.loads(schema.to_json())["fields"][0], "shape": shape}]}).encode()
    path = with_metadata(tmp_path / "good", tmp_path / "ds", UNISCHEMA, value)
    before = tree_digest(path)
    for opener in (make_reader, make_batch_reader):
        with pytest.raises(CodecError, match=re.escape(
                f"{path / 'part-00000.parquet'}, row group 0") + r".*field 't': its column holds tensors of 12 bytes, "
                rf"not float32 of shape \({shape[0]}.*: the schema does not describe the column"):
            with opener(str(path), reader_pool_type="dummy") as reader:
                next(iter(reader))
    line = cli_error("show", path, tmp_path, capsys)
    assert "its column holds tensors of 12 bytes" in line
    assert main(["convert", str(path), str(tmp_path / "out"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("unihub: error: ") and "field 't'" in err, err
    assert not (tmp_path / "out").exists() and tree_digest(path) == before


@pytest.mark.parametrize("shape", [[2**63], [10**30], [2**31, 2**31, 2**31], [None, 2**32, 2**31]])
def test_a_tensor_shape_of_2_63_values_or_more_is_refused_when_the_dataset_is_opened(
        shape: list[int | None], good_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: read as a schema, then a raw OverflowError reading or converting; TensorFlow aborted the process
    (SIGABRT: 'Encountered overflow when multiplying') building the element spec of make_petastorm_dataset."""
    path = with_metadata(good_dataset, tmp_path / "ds", UNISCHEMA,
                         schema_json(lambda d: d["fields"][1].update(shape=shape)))
    line = cli_error("inspect", path, tmp_path, capsys)
    assert line.startswith(f"unihub: error: {path / '_common_metadata'}: metadata key 'unihub.unischema': ")
    assert line.endswith("holds 2**63 or more values, which no array can")
    assert "holds 2**63 or more values" in str(library_error("make_reader", path))


@pytest.mark.parametrize("field, described", [
    (UnischemaField("x", np.int64, (), ScalarCodec(pa.int64()), False), "int64 (ScalarCodec): ValueError: "),
    (UnischemaField("x", np.float64, (None,), TensorCodec(), False), "float64 of shape (None,) (TensorCodec): "),
    (UnischemaField("x", np.uint8, (2, 2, 3), CompressedImageCodec("png"), False),
     "uint8 of shape (2, 2, 3) (CompressedImageCodec): TypeError: ")], ids=["int64", "tensor", "image"])
def test_a_type_that_the_stored_column_does_not_have_is_a_named_error(
        field: UnischemaField, described: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Strings stored under a schema that says another type. Before: numpy's raw ValueError ('invalid literal for
    int()', 'could not convert string to float') or memoryview's TypeError from the readers and a traceback from
    ``unihub convert``; ``unihub copy`` named neither source nor rows."""
    schema = Unischema("S", [UnischemaField("x", np.str_, (), ScalarCodec(pa.string()), False)])
    write_dataset(tmp_path / "good", schema, ({"x": f"v{i}"} for i in range(4)))
    document = json.loads(Unischema("S", [field]).to_json())
    path = with_metadata(tmp_path / "good", tmp_path / "ds", UNISCHEMA, json.dumps(document).encode())
    before = tree_digest(path)
    for opener in (make_reader, make_batch_reader):
        with pytest.raises(CodecError, match=re.escape(f"{path / 'part-00000.parquet'}, row group 0: field 'x': its "
                                                       f"column of string does not decode as {described}")):
            with opener(str(path), reader_pool_type="dummy") as reader:
                next(iter(reader))
    assert main(["convert", str(path), str(tmp_path / "out"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("unihub: error: ") and "field 'x'" in err, err
    if field.codec.__class__ is ScalarCodec:  # copy casts the stored table (a tensor's or image's bytes cast fine)
        assert main(["copy", str(path), str(tmp_path / "out")]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{path}, rows 0 to 4: " in err, err
    assert not (tmp_path / "out").exists() and tree_digest(path) == before


@pytest.mark.parametrize("dtype", [np.datetime64, np.timedelta64])
@pytest.mark.parametrize("nulls", [False, True], ids=["no-nulls", "nulls"])
def test_numbers_under_a_time_field_are_a_named_error(dtype: type, nulls: bool, tmp_path: Path) -> None:
    """int64 stored under a schema that says datetime64 or timedelta64. Before: numpy cast the numbers to times of
    no unit, read without an error (a datetime64's repr then failed: 'Cannot convert a NumPy datetime value other
    than NaT with generic units')."""
    schema = Unischema("S", [UnischemaField("t", np.int64, (), None, nulls)])
    write_dataset(tmp_path / "good", schema, ({"t": None if nulls and i == 1 else i * 1000} for i in range(4)))
    document = json.loads(Unischema("S", [UnischemaField("t", dtype, (), None, nulls)]).to_json())
    path = with_metadata(tmp_path / "good", tmp_path / "ds", UNISCHEMA, json.dumps(document).encode())
    name = np.dtype(dtype).name
    for opener in (make_reader, make_batch_reader):
        with pytest.raises(CodecError, match=re.escape(
                f"field 't': its column of int64 does not decode as {name} (no codec): TypeError: int64 values "
                f"have no time unit to read as {name}")):
            with opener(str(path), reader_pool_type="dummy") as reader:
                next(iter(reader))
