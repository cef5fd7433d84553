"""Gradual cutover: datasets unihub writes with ``petastorm_compatible=True`` open in real Petastorm.

The pickled Unischema is built without Petastorm (stand-ins under Petastorm's class names);
these tests check that unihub's allow-list reader reads it back, what is refused, and then
read the datasets with Petastorm 0.13.1's own ``make_reader`` and ``make_batch_reader`` in a
subprocess of its venv (``benchmarks/petastorm_env.py``; ``UNIHUB_PETASTORM_VENV`` points at
another), comparing every value exactly.
"""

from __future__ import annotations

import decimal
import importlib.util
import json
import os
import pickletools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub import (
    CompressedImageCodec,
    CompressedNdarrayCodec,
    NdarrayCodec,
    ScalarCodec,
    TensorCodec,
    Unischema,
    UnischemaField,
    add_schema,
    copy_dataset,
    dict_to_spark_row,
    make_reader,
    materialize_dataset,
    open_dataset,
    write_dataset,
)
from unihub.errors import PetastormCompatibilityError
from unihub.petastorm.legacy import (
    ALLOWED_GLOBALS,
    PETASTORM_ROW_GROUPS_KEY,
    PETASTORM_UNISCHEMA_KEY,
    load_petastorm_unischema,
)
from unihub.petastorm.pickling import dumps_petastorm_unischema

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "petastorm"
SIDE = Path(__file__).resolve().parent / "petastorm_read_side.py"

SCHEMA = Unischema("Cutover", [
    UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), False),
    UnischemaField("score", np.float32, (), ScalarCodec(pa.float32()), True),
    UnischemaField("small", np.uint8, (), ScalarCodec(pa.uint8()), False),
    UnischemaField("flag", np.bool_, (), ScalarCodec(pa.bool_()), False),
    UnischemaField("price", decimal.Decimal, (), ScalarCodec(pa.decimal128(8, 2)), False),
    UnischemaField("image", np.uint8, (8, 10, 3), CompressedImageCodec("png"), False),
    UnischemaField("gray", np.uint8, (8, 10), CompressedImageCodec("png"), False),
    UnischemaField("photo", np.uint8, (8, 10, 3), CompressedImageCodec("jpeg", 85), False),
    UnischemaField("emb", np.float32, (4,), NdarrayCodec(), False),
    UnischemaField("boxes", np.float32, (None, 4), NdarrayCodec(), False),
    UnischemaField("mask", np.int32, (2, 2), CompressedNdarrayCodec(), True),
    UnischemaField("temps", np.float64, (None,), TensorCodec(), False),
    UnischemaField("split", np.str_, (), ScalarCodec(pa.string()), False),
])


def make_row(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    return {
        "id": i, "name": f"row-{i}", "score": None if i % 4 == 0 else np.float32(i / 3), "small": np.uint8(i * 7 % 256),
        "flag": i % 3 == 0, "price": decimal.Decimal(i * 125) / 100,
        "image": rng.integers(0, 256, (8, 10, 3), dtype=np.uint8), "gray": rng.integers(0, 256, (8, 10), dtype=np.uint8),
        "photo": rng.integers(0, 256, (8, 10, 3), dtype=np.uint8), "emb": rng.random(4, dtype=np.float32),
        "boxes": rng.random((i % 3, 4), dtype=np.float32),
        "mask": None if i % 5 == 2 else np.array([[i, -i], [2 * i, 7]], dtype=np.int32),
        # lengths 0, 2, 3: Petastorm turns a one-element list without a codec into a scalar
        "temps": np.linspace(0, 1, (0, 2, 3)[i % 3]), "split": ("train", "val")[i % 2],
    }


# -- the pickle --------------------------------------------------------------------------------
def _globals(pickled: bytes) -> set[tuple[str, str]]:
    return {tuple(str(arg).split(" ", 1)) for op, arg, _ in pickletools.genops(pickled) if op.name == "GLOBAL"}


def test_pickle_reads_back_through_the_allow_list():
    petastorms = open_dataset(FIXTURES / "unischema").schema
    pickled = dumps_petastorm_unischema(petastorms)
    assert load_petastorm_unischema(pickled) == petastorms  # what Petastorm wrote, written again
    names = _globals(pickled)
    assert names <= set(ALLOWED_GLOBALS) and ("petastorm.unischema", "Unischema") in names
    back = load_petastorm_unischema(dumps_petastorm_unischema(SCHEMA))
    assert [(f.name, f.numpy_dtype, f.shape, f.nullable) for f in back] == \
        [(f.name, f.numpy_dtype, f.shape, f.nullable) for f in SCHEMA]
    assert [type(f.codec).__name__ for f in back] == [type(f.codec).__name__ for f in SCHEMA][:-2] + \
        ["NoneType", "ScalarCodec"]  # a list without a codec, as Petastorm infers one
    assert back["small"].codec == ScalarCodec(pa.int16())  # Spark has no uint8: ShortType, as Petastorm's
    assert back["price"].codec == ScalarCodec(pa.decimal128(8, 2)) and back["name"].codec == SCHEMA["name"].codec
    assert ("numpy", "bool_") in _globals(dumps_petastorm_unischema(SCHEMA))  # numpy 2 says "numpy.bool": not in 1.x


def test_pickle_is_petastorms_structure():
    """Field attributes and the OrderedDict, as Petastorm's ``Unischema.__init__`` leaves them."""
    from unihub.petastorm.legacy import safe_unpickle

    tricky = Unischema("Tricky", [UnischemaField("fields", np.int64, (), ScalarCodec(pa.int64()), False),
                                  UnischemaField("x", np.int64, (), ScalarCodec(pa.int64()), False)])
    standin = safe_unpickle(dumps_petastorm_unischema(tricky))
    state = standin.state_dict()
    assert list(state) == ["_name", "_fields", "x"]  # Petastorm sets no attribute over its own ``fields``
    assert list(state["_fields"]) == ["fields", "x"] and state["x"] is state["_fields"]["x"]
    codec = state["x"].codec.state_dict()["_spark_type"]
    assert codec.spark_name == "LongType"


@pytest.mark.parametrize(("field", "message"), [
    (UnischemaField("t", np.float32, (2, 2), TensorCodec(), False),
     "field 't': TensorCodec with shape (2, 2) is stored as fixed_size_binary[16], which Petastorm cannot decode; "
     "use NdarrayCodec()"),
    (UnischemaField("t", np.float32, (None, 2), TensorCodec(), False), "which Petastorm cannot decode"),
    (UnischemaField("rgba", np.uint8, (4, 4, 4), CompressedImageCodec("png"), False),
     "Petastorm decodes images of shape (H, W) or (H, W, 3), not (4, 4, 4)"),
    (UnischemaField("v", np.float32, (3,), ScalarCodec(pa.list_(pa.float32())), False),
     "a ScalarCodec field of shape (3,) cannot be read by Petastorm, whose ScalarCodec holds scalars"),
])
def test_fields_petastorm_cannot_read_are_refused_before_writing(tmp_path, field, message):
    schema = Unischema("S", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False), field])
    with pytest.raises(PetastormCompatibilityError) as caught:
        write_dataset(tmp_path / "ds", schema, iter(()), petastorm_compatible=True)
    assert message in str(caught.value) and str(caught.value).startswith("Unischema 'S' cannot be written")
    assert list(tmp_path.iterdir()) == []


def test_write_dataset_adds_petastorms_entries(tmp_path):
    result = write_dataset(tmp_path / "ds", SCHEMA, (make_row(i) for i in range(40)), petastorm_compatible=True,
                           partition_by=["split"], rows_per_file=7)
    metadata = pq.read_metadata(tmp_path / "ds" / "_common_metadata").metadata
    counts = json.loads(metadata[PETASTORM_ROW_GROUPS_KEY])
    assert counts == {str(Path(p).relative_to(tmp_path / "ds")): pq.read_metadata(p).num_row_groups
                      for p in result.files}
    assert "split=train/part-00000.parquet" in counts and sum(counts.values()) == result.num_row_groups
    store = open_dataset(tmp_path / "ds")
    assert store.schema_source == "unihub" and store.schema == SCHEMA  # unihub's own JSON still wins
    assert load_petastorm_unischema(metadata[PETASTORM_UNISCHEMA_KEY]).name == "Cutover"
    plain = write_dataset(tmp_path / "plain", SCHEMA, (make_row(i) for i in range(3)))
    assert PETASTORM_UNISCHEMA_KEY not in pq.read_metadata(Path(plain.url) / "_common_metadata").metadata


# -- real Petastorm ----------------------------------------------------------------------------
@pytest.fixture(scope="session")
def petastorm_python() -> Path:
    """The Petastorm 0.13.1 venv's python, built if missing (about a minute; scripts/setup.sh builds it)."""
    spec = importlib.util.spec_from_file_location("petastorm_env", REPO / "benchmarks" / "petastorm_env.py")
    env = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(env)  # type: ignore[union-attr]
    venv = Path(os.environ.get("UNIHUB_PETASTORM_VENV") or env.VENV_DIR)
    try:
        return env.ensure_petastorm_venv(with_tf=False, venv_dir=venv)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"no Petastorm 0.13.1 venv at {venv} and it could not be built: {exc}")


def read_with_petastorm(python: Path, jobs: list[dict[str, Any]], tmp_path: Path) -> list[dict[str, Any]]:
    """Run Petastorm's readers on ``jobs`` (url, reader, fields); each result as {key: array}."""
    for n, job in enumerate(jobs):
        job["out"] = str(tmp_path / f"petastorm-{n}.npz")
        job["url"] = Path(job["url"]).as_uri()
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONWARNINGS="ignore")
    env.pop("PYTHONPATH", None)  # Petastorm's venv, not unihub's packages
    proc = subprocess.run([str(python), str(SIDE), json.dumps(jobs)], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = []
    for job in jobs:
        with np.load(job["out"]) as data:
            results.append({key: data[key] for key in data.files})
    return results


def petastorm_rows(result: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """make_reader's rows keyed by id: field -> array, None, bytes or Decimal."""
    rows: dict[int, dict[str, Any]] = {}
    for n in range(int(result["__count__"])):
        row = _item(result, f"{n}/")
        rows[int(row["id"])] = row
    return rows


def petastorm_columns(result: dict[str, Any]) -> dict[str, list[Any]]:
    """make_batch_reader's batches as whole columns."""
    columns: dict[str, list[Any]] = {}
    for n in range(int(result["__count__"])):
        for name, value in _item(result, f"{n}/").items():
            columns.setdefault(name, []).extend(value)
    return columns


def _item(result: dict[str, Any], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in result:
        if not key.startswith(prefix) or "/" in key[len(prefix):]:
            continue
        name, _, kind = key[len(prefix):].partition(".")
        out[name] = _value(result, prefix + name, kind)
    return out


def _value(result: dict[str, Any], key: str, kind: str) -> Any:
    if kind == "isnull":
        return None
    if kind == "bytes":
        return result[key + ".bytes"].tobytes()
    if kind == "decimal":
        return decimal.Decimal(str(result[key + ".decimal"]))
    if kind == "len":
        items = []
        for j in range(int(result[key + ".len"])):
            sub = f"{key}/{j}"
            found = [k for k in result if k == sub or k.startswith(sub + ".")]
            items.append(_value(result, sub, found[0][len(sub) + 1:] if found[0] != sub else ""))
        return items
    return result[key]


def stored(url: Path) -> dict[int, dict[str, Any]]:
    """Every row's stored values (images and arrays as their bytes), keyed by id."""
    store = open_dataset(url)
    rows: dict[int, dict[str, Any]] = {}
    for info in store.row_groups:
        table = store.read_row_group(info.index).to_pylist()
        rows.update({row["id"]: row for row in table})
    return rows


def opencv_rgb(data: bytes) -> np.ndarray:
    """What Petastorm's codec decodes: OpenCV's pixels, BGR turned to RGB."""
    cv2 = pytest.importorskip("cv2")
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    return image[:, :, (2, 1, 0)] if image.ndim == 3 else image


def assert_exact(found: Any, expected: Any, where: str) -> None:
    if isinstance(expected, np.ndarray) or isinstance(expected, np.generic):
        found = np.asarray(found)
        assert found.dtype == expected.dtype and found.shape == np.shape(expected), \
            f"{where}: {found.dtype}{found.shape} != {expected.dtype}{np.shape(expected)}"
        np.testing.assert_array_equal(found, expected, err_msg=where)
    else:
        assert found == expected, f"{where}: {found!r} != {expected!r}"


@pytest.mark.slow
def test_petastorm_reads_what_write_dataset_wrote(petastorm_python, tmp_path):
    n = 30
    write_dataset(tmp_path / "ds", SCHEMA, (make_row(i) for i in range(n)), petastorm_compatible=True,
                  partition_by=["split"], rows_per_file=6)
    batch_fields = [f.name for f in SCHEMA if f.name != "temps"]  # Petastorm's batches cannot hold ragged lists
    rows_result, batch_result = read_with_petastorm(petastorm_python, [
        {"url": tmp_path / "ds", "reader": "make_reader"},
        {"url": tmp_path / "ds", "reader": "make_batch_reader", "fields": batch_fields}], tmp_path)
    raw = stored(tmp_path / "ds")
    rows = petastorm_rows(rows_result)
    assert sorted(rows) == list(range(n))
    for i, got in rows.items():
        row, where = make_row(i), f"row {i}"
        assert set(got) == set(SCHEMA.fields)
        assert_exact(got["id"], np.int64(i), where)
        assert_exact(got["name"], np.array(row["name"]), where)
        if row["score"] is None:  # Petastorm reads a null float as NaN
            assert got["score"].dtype == np.float32 and np.isnan(got["score"]), where
        else:
            assert_exact(got["score"], row["score"], where)
        assert_exact(got["small"], row["small"], where)
        assert_exact(got["flag"], np.bool_(row["flag"]), where)
        assert got["price"] == row["price"], where
        for name in ("image", "gray", "emb", "boxes"):
            assert_exact(got[name], row[name], f"{where} {name}")
        assert_exact(got["photo"], opencv_rgb(raw[i]["photo"]), f"{where} photo")
        if row["mask"] is None:
            assert got["mask"] is None, where
        else:
            assert_exact(got["mask"], row["mask"], f"{where} mask")
        assert_exact(got["temps"], row["temps"], f"{where} temps")
        assert_exact(got["split"], np.array(row["split"]), where)

    columns = petastorm_columns(batch_result)
    order = [int(v) for v in columns["id"]]
    assert sorted(order) == list(range(n))
    for j, i in enumerate(order):
        row, where = make_row(i), f"batch row {i}"
        assert str(columns["name"][j]) == row["name"] and str(columns["split"][j]) == row["split"], where
        assert (np.isnan(columns["score"][j]) if row["score"] is None else columns["score"][j] == row["score"]), where
        assert columns["small"][j] == row["small"] and columns["flag"][j] == row["flag"], where
        assert columns["price"][j] == row["price"], where
        for name in ("image", "gray", "photo", "emb", "boxes", "mask"):  # Petastorm's batches are not decoded
            assert columns[name][j] == raw[i][name], f"{where} {name}"


def test_petastorm_reads_partition_values_with_spaces_and_accents(petastorm_python, tmp_path):
    # the folders were URL-quoted (split=new%20york, split=%C3%A9t%C3%A9), which Petastorm (and Spark) read as they
    # are: every row of those partitions had split 'new%20york'. Spark's escaping keeps a space and an accent.
    schema = Unischema("Places", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
                                  UnischemaField("split", np.str_, (), ScalarCodec(pa.string()), False)])
    splits = ["new york", "été", "a:b"]
    write_dataset(tmp_path / "ds", schema, ({"id": i, "split": splits[i % 3]} for i in range(6)),
                  partition_by=["split"], petastorm_compatible=True)
    assert sorted(p.name for p in (tmp_path / "ds").glob("split=*")) == ["split=a%3Ab", "split=new york", "split=été"]
    (result,) = read_with_petastorm(petastorm_python, [{"url": tmp_path / "ds", "reader": "make_reader"}], tmp_path)
    rows = petastorm_rows(result)
    assert {i: str(row["split"]) for i, row in rows.items()} == {i: splits[i % 3] for i in range(6) if i % 3 != 2} | \
        {i: "a%3Ab" for i in (2, 5)}  # Petastorm reads an escaped folder as it is, as it reads Spark's
    with make_reader(str(tmp_path / "ds"), workers_count=1) as reader:
        assert {int(row.id): row.split for row in reader} == {i: splits[i % 3] for i in range(6)}


@pytest.mark.slow
def test_petastorm_reads_a_store_given_a_schema_and_a_copy(petastorm_python, tmp_path):
    """``add-schema --petastorm-compatible`` on plain Parquet Spark wrote, and ``copy`` of Petastorm's own
    dataset: Petastorm reads both, the copy exactly as it read the original (``expected.npz``)."""
    plain = Path(shutil.copytree(FIXTURES / "plain", tmp_path / "plain"))
    add_schema(plain, petastorm_compatible=True)
    copy_dataset(None, FIXTURES / "unischema", tmp_path / "copy", ["id", "label", "score", "image_png", "gray",
                                                                    "boxes", "mask"], ["label"], False, 2, 0.5)
    plain_result, copy_result = read_with_petastorm(petastorm_python, [
        {"url": plain, "reader": "make_reader"}, {"url": tmp_path / "copy", "reader": "make_reader"}], tmp_path)

    with make_reader(FIXTURES / "plain", shuffle_row_groups=False, workers_count=1) as reader:
        expected = {int(row.id): row for row in reader}
    rows = petastorm_rows(plain_result)
    assert rows.keys() == expected.keys()
    for i, got in rows.items():
        assert_exact(got["label"], expected[i].label, f"row {i}")
        assert_exact(got["x"], expected[i].x, f"row {i}")
        assert str(got["name"]) == expected[i].name
        assert_exact(got["pair"], expected[i].pair, f"row {i} pair")

    original = np.load(FIXTURES / "expected.npz")
    rows = petastorm_rows(copy_result)
    assert sorted(rows) == list(range(60))
    for i, got in rows.items():
        assert set(got) == {"id", "label", "score", "image_png", "gray", "boxes", "mask"}
        for name, value in got.items():
            if value is None:
                assert f"{i}/{name}.isnull" in original, f"row {i} {name}"
            else:
                assert_exact(value, original[f"{i}/{name}"], f"row {i} {name}")


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning")
def test_petastorm_reads_what_materialize_dataset_wrote(spark, petastorm_python, tmp_path):
    schema = Unischema("SparkCutover", [SCHEMA[name] for name in ("id", "name", "score", "small", "price", "image",
                                                                  "emb", "mask", "temps")])
    url = (tmp_path / "spark_ds").as_uri()
    with materialize_dataset(spark, url, schema, row_group_size_mb=1, petastorm_compatible=True):
        rows = [dict_to_spark_row(schema, {k: v for k, v in make_row(i).items() if k in schema}) for i in range(20)]
        spark.createDataFrame(rows, schema.as_spark_schema()).coalesce(2).write.mode("overwrite").parquet(url)
    metadata = pq.read_metadata(tmp_path / "spark_ds" / "_common_metadata").metadata
    assert load_petastorm_unischema(metadata[PETASTORM_UNISCHEMA_KEY]).name == "SparkCutover"
    (result,) = read_with_petastorm(petastorm_python, [{"url": tmp_path / "spark_ds", "reader": "make_reader"}],
                                    tmp_path)
    got_rows = petastorm_rows(result)
    assert sorted(got_rows) == list(range(20))
    for i, got in got_rows.items():
        row, where = make_row(i), f"row {i}"
        assert str(got["name"]) == row["name"] and got["price"] == row["price"], where
        assert_exact(got["small"], row["small"], where)
        for name in ("image", "emb", "temps"):
            assert_exact(got[name], row[name], f"{where} {name}")
        if row["mask"] is None:
            assert got["mask"] is None, where
        else:
            assert_exact(got["mask"], row["mask"], where)
