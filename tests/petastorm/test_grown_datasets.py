"""A Petastorm dataset grown by unihub (appends, deletes, compactions) stays readable by Petastorm 0.13.1.

Petastorm reads the data files a directory listing finds and takes their row groups from a ``_metadata`` summary
(a file it lacks is skipped: its rows silently missing) or else from ``_common_metadata``'s row-group JSON (a file
it lacks: a ``KeyError``). Every commit rewrites both for the latest version (``store/listings.py``): checked here
against the files themselves, and with real Petastorm (slow: its venv) on its own fixture dataset.
"""

from __future__ import annotations

import json
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from tests.petastorm.test_metadata_write import (
    SCHEMA,
    make_row,
    petastorm_columns,
    petastorm_python,  # noqa: F401 (a fixture)
    petastorm_rows,
    read_with_petastorm,
)
from unihub import (
    ScalarCodec,
    TensorCodec,
    Unischema,
    UnischemaField,
    compact_dataset,
    delete_rows,
    list_versions,
    make_reader,
    open_dataset,
    vacuum_dataset,
    write_dataset,
)
from unihub.errors import SchemaError
from unihub.fs import atomic
from unihub.fs import filesystem as fsutil
from unihub.petastorm.legacy import PETASTORM_ROW_GROUPS_KEY, PETASTORM_UNISCHEMA_KEY, load_petastorm_unischema
from unihub.store import listings, versions
from unihub.store.metadata_files import write_summary_metadata

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm" / "unischema"


def metadata_of(url: Path) -> dict[bytes, bytes]:
    return dict(pq.read_metadata(url / "_common_metadata").metadata)


def listed_counts(url: Path) -> dict[str, int]:
    """Petastorm's row-group JSON, as it reads it."""
    return json.loads(metadata_of(url)[PETASTORM_ROW_GROUPS_KEY])


def latest_counts(url: Path) -> dict[str, int]:
    """Row groups per part file of the latest version, read from the files."""
    parts = list_versions(str(url))[-1].parts
    return {rel: pq.read_metadata(url / rel).num_row_groups for rel in parts}


def summary_counts(url: Path) -> dict[str, int]:
    """Row groups per file as the ``_metadata`` summary lists them."""
    summary = pq.read_metadata(url / "_metadata")
    counts: dict[str, int] = {}
    for k in range(summary.num_row_groups):
        path = summary.row_group(k).column(0).file_path
        counts[path] = counts.get(path, 0) + 1
    return counts


def ids(url: Path) -> list[int]:
    with make_reader(str(url), schema_fields=["id"], num_epochs=1, shuffle_row_groups=False) as reader:
        return sorted(int(row.id) for row in reader)


def with_summary(url: Path) -> None:
    """A ``_metadata`` summary of the dataset's files, as Spark and Petastorm's ``materialize_dataset`` leave one."""
    paths = [f.path for f in open_dataset(url).files]
    write_summary_metadata(pafs.LocalFileSystem(), str(url), paths, pq.read_metadata(paths[0]))


# -- the listings, read from the files ----------------------------------------------------------
def test_an_append_lists_its_parts_in_petastorms_json(tmp_path: Path) -> None:
    url = tmp_path / "ds"
    write_dataset(url, SCHEMA, (make_row(i) for i in range(10)), petastorm_compatible=True)
    pickled = metadata_of(url)[PETASTORM_UNISCHEMA_KEY]
    for k in (1, 2):
        write_dataset(url, SCHEMA, (make_row(i) for i in range(10 * k, 10 * k + 10)), mode="append", rows_per_file=4)
        assert listed_counts(url) == latest_counts(url) and len(latest_counts(url)) == 1 + 3 * k
    assert metadata_of(url)[PETASTORM_UNISCHEMA_KEY] == pickled
    assert open_dataset(url).schema == SCHEMA and ids(url) == list(range(30))


def test_a_delete_and_a_compaction_list_the_new_parts_in_the_json_and_the_summary(tmp_path: Path) -> None:
    """Both were refused where a summary was there (it would have listed files that are gone)."""
    url = tmp_path / "ds"
    write_dataset(url, SCHEMA, (make_row(i) for i in range(12)), petastorm_compatible=True, rows_per_file=3)
    with_summary(url)
    delete_rows(url, pc.field("id") < 4)
    assert listed_counts(url) == summary_counts(url) == latest_counts(url)
    assert not any(rel.startswith("part-00000") for rel in latest_counts(url))  # rows 0-2: the file is gone
    assert pq.read_metadata(url / "_metadata").num_rows == 8
    compact_dataset(url)
    assert listed_counts(url) == summary_counts(url) == latest_counts(url) and len(latest_counts(url)) == 1
    assert pq.read_metadata(url / "_metadata").num_rows == 8 and ids(url) == list(range(4, 12))


def test_an_append_rewrites_a_summary_or_removes_one_that_cannot_list_the_new_schema(tmp_path: Path) -> None:
    url = tmp_path / "ds"
    write_dataset(url, SCHEMA, (make_row(i) for i in range(6)), petastorm_compatible=True)
    with_summary(url)
    write_dataset(url, SCHEMA, (make_row(i) for i in range(6, 9)), mode="append")
    assert summary_counts(url) == latest_counts(url) and pq.read_metadata(url / "_metadata").num_rows == 9
    wider = Unischema("Cutover", [*SCHEMA, UnischemaField("extra", np.int64, (), ScalarCodec(pa.int64()), True)])
    write_dataset(url, wider, ({**make_row(i), "extra": i} for i in range(9, 11)), mode="append")
    assert not (url / "_metadata").exists()  # Petastorm goes by the JSON: the files' schemas differ
    assert listed_counts(url) == latest_counts(url)
    # Petastorm reads every field of its Unischema from every file: not "extra", which the files before lack
    assert list(load_petastorm_unischema(metadata_of(url)[PETASTORM_UNISCHEMA_KEY]).fields) == list(SCHEMA.fields)
    assert open_dataset(url).schema == wider


def test_an_append_grows_the_summary_reading_only_the_new_parts_footers(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A dataset that grows by appends: each commit reads the summary and its own parts' footers, not every part's
    (a request each on an object store); a delete's parts are no such growth, and every footer is read again."""
    url = tmp_path / "ds"
    write_dataset(url, SCHEMA, (make_row(i) for i in range(12)), petastorm_compatible=True, rows_per_file=3)
    with_summary(url)
    read: list[str] = []
    real = listings._footers
    monkeypatch.setattr(listings, "_footers", lambda fs, root, parts: read.extend(parts) or real(fs, root, parts))
    for k in (1, 2):
        write_dataset(url, SCHEMA, (make_row(i) for i in range(12 * k, 12 * k + 4)), mode="append", rows_per_file=2)
        parts = list_versions(str(url))[-1].parts
        assert len(parts) == 4 + 2 * k and sorted(read) == sorted(parts[-2:])  # only the append's two
        read.clear()
        assert summary_counts(url) == latest_counts(url) and listed_counts(url) == latest_counts(url)
        groups = pq.read_metadata(url / "_metadata")
        assert [groups.row_group(g).column(0).file_path for g in range(groups.num_row_groups)] == [
            rel for rel in parts for _ in range(latest_counts(url)[rel])]  # in the order of the parts
    assert pq.read_metadata(url / "_metadata").num_rows == 20 and ids(url) == sorted([*range(12), *range(12, 16),
                                                                                     *range(24, 28)])
    delete_rows(url, pc.field("id") == 13)
    assert len(read) == len(list_versions(str(url))[-1].parts) and summary_counts(url) == latest_counts(url)


def test_a_field_petastorm_cannot_read_removes_its_entries_with_a_warning(tmp_path: Path) -> None:
    """Petastorm then refuses the dataset by name ("Could not find row group metadata"), not a stale listing. An
    append adding such a field keeps Petastorm's Unischema before it (the fields every file has), so only a
    dataset whose Unischema must be pickled anew comes to this."""
    url = tmp_path / "ds"
    write_dataset(url, SCHEMA, (make_row(i) for i in range(4)), petastorm_compatible=True)
    wider = Unischema("Cutover", [*SCHEMA, UnischemaField("fixed", np.float32, (2,), TensorCodec(), True)])
    write_dataset(url, wider, ({**make_row(i), "fixed": np.ones(2, np.float32)} for i in range(4, 6)), mode="append")
    assert list(load_petastorm_unischema(metadata_of(url)[PETASTORM_UNISCHEMA_KEY]).fields) == list(SCHEMA.fields)
    schema = pq.read_schema(url / "_common_metadata")  # the row-group JSON without the pickled Unischema
    listings.replace_common_metadata(pafs.LocalFileSystem(), str(url), schema.with_metadata(
        {k: v for k, v in schema.metadata.items() if k != PETASTORM_UNISCHEMA_KEY}))
    with pytest.warns(UserWarning, match="Petastorm's metadata is removed from _common_metadata"):
        write_dataset(url, wider, ({**make_row(i), "fixed": np.ones(2, np.float32)} for i in range(6, 8)),
                      mode="append")
    assert not {PETASTORM_ROW_GROUPS_KEY, PETASTORM_UNISCHEMA_KEY} & set(metadata_of(url))
    assert open_dataset(url).schema == wider and ids(url) == list(range(8))


def test_petastorms_unischema_lists_only_the_fields_every_part_stores(tmp_path: Path) -> None:
    """Petastorm reads each field of its Unischema from every file (a file without one fails the read: its rows
    cannot be made), so an append adding a nullable field keeps the Unischema before, and one lacking a nullable
    field takes it out; the unihub schema stays the version's."""
    narrower = Unischema("Cutover", [f for f in SCHEMA if f.name != "score"])
    wider = Unischema("Cutover", [*SCHEMA, UnischemaField("extra", np.int64, (), ScalarCodec(pa.int64()), True)])
    for name, appended, rows in [("narrower", narrower, ({k: v for k, v in make_row(i).items() if k != "score"}
                                                         for i in range(4, 6))),
                                 ("wider", wider, ({**make_row(i), "extra": i} for i in range(4, 6)))]:
        url = tmp_path / name
        write_dataset(url, SCHEMA, (make_row(i) for i in range(4)), petastorm_compatible=True)
        write_dataset(url, appended, rows, mode="append")
        pickled = load_petastorm_unischema(metadata_of(url)[PETASTORM_UNISCHEMA_KEY])
        assert list(pickled.fields) == list((narrower if name == "narrower" else SCHEMA).fields), name
        assert open_dataset(url).schema == (SCHEMA if name == "narrower" else wider) and ids(url) == list(range(6))
    url = tmp_path / "asked-later"  # Petastorm's entries added where the parts differ already
    write_dataset(url, SCHEMA, (make_row(i) for i in range(4)))
    write_dataset(url, wider, ({**make_row(i), "extra": i} for i in range(4, 6)), mode="append")
    write_dataset(url, narrower, ({k: v for k, v in make_row(i).items() if k != "score"} for i in range(6, 8)),
                  mode="append", petastorm_compatible=True)
    assert list(load_petastorm_unischema(metadata_of(url)[PETASTORM_UNISCHEMA_KEY]).fields) == list(narrower.fields)


def test_a_dataset_without_petastorms_entries_gets_none_unless_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = tmp_path / "ds"
    write_dataset(url, SCHEMA, (make_row(i) for i in range(4)))
    with monkeypatch.context() as patched, warnings.catch_warnings():
        warnings.simplefilter("error")
        patched.setattr(versions, "latest_parts", None)  # its history is not read again (every record: a GET on S3)
        write_dataset(url, SCHEMA, (make_row(i) for i in range(4, 6)), mode="append")
    assert PETASTORM_ROW_GROUPS_KEY not in metadata_of(url) and not (url / "_metadata").exists()
    write_dataset(url, SCHEMA, (make_row(i) for i in range(6, 8)), mode="append", petastorm_compatible=True)
    assert listed_counts(url) == latest_counts(url) and len(latest_counts(url)) == 3
    assert load_petastorm_unischema(metadata_of(url)[PETASTORM_UNISCHEMA_KEY]).name == "Cutover"


def test_the_listings_follow_a_version_that_overtook_the_one_committed(tmp_path: Path) -> None:
    """Another commit's rewrite may be of the version before this one: the rewrite is repeated until the version
    it lists is still the latest."""
    url = tmp_path / "ds"
    write_dataset(url, SCHEMA, (make_row(i) for i in range(4)), petastorm_compatible=True)
    write_dataset(url, SCHEMA, (make_row(i) for i in range(4, 6)), mode="append")
    old, new = ("part-00000.parquet",), tuple(list_versions(str(url))[-1].parts)
    asked = iter([(2, new), (2, new)])
    listings.follow_latest(pafs.LocalFileSystem(), str(url), (1, old), lambda: next(asked))
    assert list(listed_counts(url)) == list(new) and next(asked, None) is None


def test_a_listing_that_cannot_be_rewritten_is_a_warning_after_the_version_is_published(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error would have the append run again: its rows twice."""
    url = tmp_path / "ds"
    write_dataset(url, SCHEMA, (make_row(i) for i in range(4)), petastorm_compatible=True)

    def unreadable(*args: Any, **kwargs: Any) -> None:
        raise OSError("the footer could not be read")

    monkeypatch.setattr(listings, "_footers", unreadable)
    with pytest.warns(UserWarning, match="version 2 is published, but the listings .* the footer could not be read"):
        write_dataset(url, SCHEMA, (make_row(i) for i in range(4, 6)), mode="append")
    assert [v.number for v in list_versions(str(url))] == [1, 2] and ids(url) == list(range(6))
    assert list(listed_counts(url)) == ["part-00000.parquet"]  # the version before, until the next commit
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_dataset(url, SCHEMA, (make_row(i) for i in range(6, 7)), mode="append")
    assert listed_counts(url) == latest_counts(url) and len(latest_counts(url)) == 3


def test_on_s3_every_commit_lists_the_latest_parts(s3_server: Any) -> None:
    """An object store has no rename: the listings are written under a hidden name, then moved (copied)."""
    url = f"s3://{s3_server.bucket}/grown-{uuid.uuid4().hex[:8]}/ds"
    options = s3_server.storage_options()
    fs, root = fsutil.resolve_filesystem(url, None, options)

    def counts(name: str) -> dict[str, int]:
        with fs.open_input_file(f"{root}/{name}") as handle:
            footer = pq.read_metadata(handle)
        if name == "_common_metadata":
            return json.loads(footer.metadata[PETASTORM_ROW_GROUPS_KEY])
        found: dict[str, int] = {}
        for k in range(footer.num_row_groups):
            path = footer.row_group(k).column(0).file_path
            found[path] = found.get(path, 0) + 1
        return found

    write_dataset(url, SCHEMA, (make_row(i) for i in range(6)), petastorm_compatible=True, rows_per_file=3,
                  storage_options=options)
    paths = [f.path for f in open_dataset(url, storage_options=options).files]
    with fs.open_input_file(paths[0]) as handle:
        write_summary_metadata(fs, root, paths, pq.read_metadata(handle))
    write_dataset(url, SCHEMA, (make_row(i) for i in range(6, 9)), mode="append", storage_options=options)
    delete_rows(url, pc.field("id") < 2, storage_options=options)
    compact_dataset(url, storage_options=options)
    parts = list_versions(url, storage_options=options)[-1].parts
    assert list(counts("_common_metadata")) == list(counts("_metadata")) == list(parts) and len(parts) == 1
    assert not [info.path for info in fs.get_file_info(pafs.FileSelector(root)) if ".unihub-tmp-" in info.path]
    write_dataset(url, SCHEMA, (make_row(i) for i in range(2)), overwrite=True, storage_options=options)
    assert not fsutil.exists(fs, f"{root}/_metadata")  # it listed the replaced dataset's files


def test_a_vacuum_rewrites_listings_a_killed_commit_left_a_version_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before it removes the files they may still list."""
    url = tmp_path / "ds"
    write_dataset(url, SCHEMA, (make_row(i) for i in range(4)), petastorm_compatible=True)
    with monkeypatch.context() as patched:
        patched.setattr(listings, "rewrite_listings", lambda *args, **kwargs: None)  # as if killed before it
        delete_rows(url, pc.field("id") < 2)
    assert list(listed_counts(url)) == ["part-00000.parquet"] and not (url / "part-00000.parquet").exists()
    vacuum_dataset(str(url), 1)
    assert listed_counts(url) == latest_counts(url) and ids(url) == [2, 3]


def test_the_temporaries_of_a_rewrite_a_killed_run_left_are_removed_by_the_next_commit(tmp_path: Path) -> None:
    """A kill between writing a listing under its hidden name and moving it in leaves that file; a live run's stays."""
    url = tmp_path / "ds"
    write_dataset(url, SCHEMA, (make_row(i) for i in range(4)), petastorm_compatible=True)
    write_dataset(url, SCHEMA, (make_row(i) for i in range(4, 6)), mode="append")
    dead = f"{atomic.run_id().split('-')[0]}-999999999-1-abcdef"  # no process has that pid
    left = [url / f"._common_metadata.unihub-{dead}.tmp", url / f"._metadata.unihub-{dead}.tmp"]
    live = url / f"._metadata.unihub-{atomic.run_id()}.tmp"
    for path in [*left, live]:
        path.write_bytes(b"half a footer")
    delete_rows(url, pc.field("id") == 0)
    assert not any(path.exists() for path in left) and live.exists()
    assert listed_counts(url) == latest_counts(url) and ids(url) == list(range(1, 6))


@pytest.mark.parametrize("hostile", [b"[" * 100_000, b"\xff\xfe", b"not json", b"[1, 2]", b'{"part-00000.parquet": -3}'])
def test_a_hostile_row_group_json_is_read_again_from_the_files(tmp_path: Path, hostile: bytes) -> None:
    """Petastorm's JSON is untrusted bytes: whatever it holds, the rewrite counts the row groups from the footers."""
    url = tmp_path / "ds"
    write_dataset(url, SCHEMA, (make_row(i) for i in range(4)), petastorm_compatible=True)
    schema = pq.read_schema(url / "_common_metadata")
    pq.write_metadata(schema.with_metadata({**schema.metadata, PETASTORM_ROW_GROUPS_KEY: hostile}),
                      url / "_common_metadata")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_dataset(url, SCHEMA, (make_row(i) for i in range(4, 6)), mode="append")
    assert listed_counts(url) == latest_counts(url) and ids(url) == list(range(6))


def test_a_summary_of_files_of_two_schemas_is_a_named_error(tmp_path: Path) -> None:
    """The file whose schema differs is named (a listing's rewrite then removes the summary instead)."""
    pq.write_table(pa.table({"id": [1]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [1], "x": [2.0]}), tmp_path / "b.parquet")
    footers = [pq.read_metadata(tmp_path / name) for name in ("a.parquet", "b.parquet")]
    with pytest.raises(SchemaError, match=r"/b\.parquet: its Parquet schema differs from .*/a\.parquet's"):
        listings.summary_of(footers, ["a.parquet", "b.parquet"], str(tmp_path))


# -- real Petastorm --------------------------------------------------------------------------------
@pytest.mark.slow
def test_petastorm_reads_its_own_dataset_after_unihub_appended_deleted_and_compacted(
        petastorm_python: Path, tmp_path: Path) -> None:  # noqa: F811
    """The dataset Petastorm wrote (its fixture), grown by unihub; each stage copied and read by Petastorm's
    ``make_reader``: the ids and values unihub reads for the same version."""
    url = tmp_path / "ds"
    shutil.copytree(FIXTURE, url)
    with make_reader(str(url), num_epochs=1, shuffle_row_groups=False) as reader:
        rows = {int(r.id): r._asdict() for r in reader}
    stages = []

    def stage(name: str) -> None:
        stages.append((name, ids(url)))
        shutil.copytree(url, tmp_path / name)

    write_dataset(url, open_dataset(url).schema, ({**row, "id": i + 100} for i, row in rows.items()), mode="append")
    stage("appended")
    delete_rows(url, pc.field("id") < 10)
    stage("deleted")
    compact_dataset(url)
    stage("compacted")
    assert [s[1] for s in stages] == [[*range(60), *range(100, 160)], [*range(10, 60), *range(100, 160)],
                                      [*range(10, 60), *range(100, 160)]]
    fields = ["id", "label", "embedding", "split"]
    found = read_with_petastorm(petastorm_python, [{"url": str(tmp_path / name), "reader": "make_reader",
                                                    "fields": fields} for name, _ in stages], tmp_path)
    for (name, expected), result in zip(stages, found):
        read = petastorm_rows(result)
        assert sorted(read) == expected, name
        for i, row in read.items():
            source = rows[i % 100]
            for field in fields[1:]:
                assert np.array_equal(np.asarray(row[field]), np.asarray(source[field])), (name, i, field)


@pytest.mark.slow
def test_petastorm_reads_every_row_after_an_append_added_or_lacked_a_nullable_field(
        petastorm_python: Path, tmp_path: Path) -> None:  # noqa: F811
    """Both readers, every field of Petastorm's Unischema: before, a file without one of them failed the read
    ("S_view.__new__() missing 1 required positional argument")."""
    narrower = Unischema("Cutover", [f for f in SCHEMA if f.name != "score"])
    wider = Unischema("Cutover", [*SCHEMA, UnischemaField("extra", np.int64, (), ScalarCodec(pa.int64()), True)])
    for name, appended, rows in [("narrower", narrower, [{k: v for k, v in make_row(i).items() if k != "score"}
                                                         for i in range(4, 6)]),
                                 ("wider", wider, [{**make_row(i), "extra": i} for i in range(4, 6)])]:
        write_dataset(tmp_path / name, SCHEMA, (make_row(i) for i in range(4)), petastorm_compatible=True)
        write_dataset(tmp_path / name, appended, rows, mode="append")
    found = read_with_petastorm(petastorm_python, [{"url": str(tmp_path / name), "reader": reader, "fields": fields}
                                                   for name in ("narrower", "wider")
                                                   for reader, fields in (("make_reader", None),
                                                                          ("make_batch_reader", ["id", "name"]))],
                                tmp_path)
    for (name, kept), rows_read, batches in zip([("narrower", narrower), ("wider", SCHEMA)], found[::2], found[1::2]):
        read = petastorm_rows(rows_read)
        assert sorted(read) == list(range(6)), name
        assert all(set(row) == set(kept.fields) for row in read.values()), name
        assert np.array_equal(read[5]["emb"], make_row(5)["emb"]), name
        assert sorted(petastorm_columns(batches)["id"]) == list(range(6)), name
