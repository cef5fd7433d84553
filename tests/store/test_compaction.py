"""Compaction (store/compaction.py, ``unihub compact``): a dataset grown by small appends and column sets joined
into fewer parts as a version; every row and value as before, older versions read as they were, a plain listing
the latest, a failure or a race leaving nothing, on a local disk and on moto's S3 server."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from unihub import (
    ScalarCodec,
    UnischemaField,
    add_column,
    compact_dataset,
    make_batch_reader,
    make_reader,
    open_dataset,
    write_dataset,
)
from unihub.cli import main as cli_main
from unihub.errors import ConcurrentCommitError, InvalidArgumentError
from unihub.fs import publish
from unihub.store import column_sets, compaction, versions

from .test_versions import EMB, KILLED, LABEL, LABELLED, SCHEMA, killed_copies, rows, s3_url, side_files, table_of

s3_url = s3_url  # the fixture: a fresh bucket path on moto's S3 server
SPLIT = UnischemaField("split", np.str_, (), ScalarCodec(pa.string()), True)


def grown(url: str, appends: int = 6, **options: Any) -> None:
    """``appends`` appends of 5 rows, a label and a tensor set on them all, then two more appends (not covered)."""
    for k in range(appends):
        write_dataset(url, SCHEMA, rows(5 * k, 5 * k + 5), mode="append", **options)
    n = 5 * appends
    add_column(url, LABEL, np.arange(n) * 10, **options)
    add_column(url, EMB, np.arange(2 * n, dtype=np.float32).reshape(n, 2), **options)
    for k in range(appends, appends + 2):
        write_dataset(url, SCHEMA, rows(5 * k, 5 * k + 5), mode="append", **options)


def compacts_losing_nothing(url: str, **options: Any) -> None:
    grown(url, **options)
    before = versions.list_versions(url, **options)
    snapshots = {v.number: table_of(url, version=v.number, **options) for v in before}
    version = compact_dataset(url, tag="compacted", **options)
    assert version is not None and version.number == before[-1].number + 1 and version.operation == "compact"
    # the 6 covered parts are one part, the 2 appended after the sets another (not the same sets): 8 -> 2
    assert len(before[-1].parts) == 8 and len(version.parts) == 2 and version.added_rows == 0
    after = table_of(url, **options)
    assert after.equals(snapshots[before[-1].number])  # every stored column, the added ones, bit for bit
    assert [g.num_rows for g in open_dataset(url, **options).row_groups] == [5] * 8  # boundaries kept
    for number, snapshot in snapshots.items():  # time travel: each older version as it was
        assert table_of(url, version=number, **options).equals(snapshot)
    entries = {s["name"]: s["parts"] for s in version.column_sets}
    assert entries["label"].keys() == entries["emb"].keys() == {version.parts[0]}
    assert entries["label"][version.parts[0]]["file"] == entries["emb"][version.parts[0]]["file"]  # one side file
    with make_reader(url, schema_fields=["id", "label", "emb"], shuffle_row_groups=False, workers_count=1,
                     **options) as reader:
        got = [(int(r.id), r.label, None if r.emb is None else r.emb.tolist()) for r in reader]
    assert got == [(i, i * 10 if i < 30 else None, [2.0 * i, 2.0 * i + 1] if i < 30 else None) for i in range(40)]
    assert versions.resolve(*_fs_root(url, options), tag="compacted").number == version.number
    if "://" not in url:  # a plain listing reads the latest version: the 2 parts
        assert sorted(pq.read_table(url)["id"].to_pylist()) == list(range(40))
        assert len([p for p in os.listdir(url) if p.endswith(".parquet")]) == 2
    result = versions.vacuum_dataset(url, 1, **options)
    assert result.kept_versions == (version.number,)
    assert table_of(url, **options).equals(after)
    assert side_files(url, **options) == {s["file"] for e in entries.values() for s in e.values()}
    if "://" not in url:
        assert not os.listdir(os.path.join(url, publish.RETIRED_DIR))


def _fs_root(url: str, options: dict[str, Any]) -> tuple[Any, str]:
    from unihub.fs import filesystem as fsutil

    return fsutil.resolve_filesystem(url, None, options.get("storage_options"))


def test_compaction_joins_small_parts_losing_nothing(tmp_path: Path) -> None:
    compacts_losing_nothing(str(tmp_path / "ds"))


@pytest.mark.slow
def test_s3_compaction_joins_small_parts_losing_nothing(s3_server: Any, s3_url: str) -> None:
    compacts_losing_nothing(s3_url, storage_options=s3_server.storage_options())


def test_runs_end_at_the_target_size_a_schema_change_and_a_partition(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    for k in range(4):
        write_dataset(url, SCHEMA, rows(5 * k, 5 * k + 5), mode="append")
    for k in range(4, 6):  # a nullable field added: parts of another schema
        write_dataset(url, LABELLED, [{**r, "label": str(r["id"])} for r in rows(5 * k, 5 * k + 5)], mode="append")
    size = max(os.path.getsize(os.path.join(url, p)) for p in versions.list_versions(url)[-1].parts)
    before = table_of(url)
    version = compact_dataset(url, target_mb=2.5 * size / 2**20)  # two parts a run at most
    assert version is not None and len(version.parts) == 3  # [0, 1] [2, 3] | [4, 5]
    assert table_of(url).equals(before)
    version = compact_dataset(url)  # the default target: each schema's parts one part
    assert version is not None and len(version.parts) == 2 and table_of(url).equals(before)
    assert compact_dataset(url) is None  # nothing left to join: no version
    assert versions.list_versions(url)[-1].number == version.number
    parted = str(tmp_path / "parted")
    for k in range(4):
        write_dataset(parted, SCHEMA, [{**r, "name": "a" if k >= 2 else "b"} for r in rows(5 * k, 5 * k + 5)],
                      mode="append", partition_by=["name"])  # parts of one folder in a row: joined
    before = table_of(parted)
    version = compact_dataset(parted)
    assert version is not None and sorted(os.path.dirname(p) for p in version.parts) == ["name=a", "name=b"]
    assert sorted(table_of(parted)["id"].to_pylist()) == sorted(before["id"].to_pylist())
    with make_batch_reader(parted, shuffle_row_groups=False, workers_count=1) as reader:
        assert {(int(i), n) for b in reader for i, n in zip(b.id, b.name)} == \
            {(i, "a" if i >= 10 else "b") for i in range(20)}


def test_a_failure_or_a_race_leaves_the_old_version_and_no_file(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    url = str(tmp_path / "ds")
    grown(url)
    listing = sorted(str(p.relative_to(url)) for p in Path(url).rglob("*"))
    latest = versions.list_versions(url)[-1]
    calls = []
    real = compaction._copy_part

    def failing(*args: Any) -> int:
        calls.append(1)
        if len(calls) == 3:
            raise OSError("disk full")
        return real(*args)

    monkeypatch.setattr(compaction, "_copy_part", failing)
    with pytest.raises(OSError, match="disk full"):
        compact_dataset(url)
    assert sorted(str(p.relative_to(url)) for p in Path(url).rglob("*")) == listing
    monkeypatch.setattr(compaction, "_copy_part", real)
    monkeypatch.setattr(publish, "put_if_absent", lambda *a: False)  # another commit took the number
    with pytest.raises(ConcurrentCommitError, match="nothing of this compact was published"):
        compact_dataset(url)
    monkeypatch.undo()
    assert versions.list_versions(url)[-1] == latest
    listed = {f for v in versions.list_versions(url) for f in v.files()}
    assert not [p for p in Path(url).rglob("*.parquet") if str(p.relative_to(url)) not in listed]  # none left
    assert table_of(url).equals(table_of(url, version=latest.number))
    with pytest.raises(InvalidArgumentError, match="target_mb"):
        compact_dataset(url, target_mb=0)


def test_a_part_a_delete_replaced_while_it_was_compacted_is_a_concurrent_commit(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The delete published first and took the part out of the directory: the compaction failed with a bare
    FileNotFoundError ('Failed to open local file ...') instead of the race's named error; nothing is published."""
    url = str(tmp_path / "ds")
    grown(url)
    real = compaction._copy_part

    def a_delete_first(*args: Any) -> int:
        monkeypatch.setattr(compaction, "_copy_part", real)
        versions.delete_rows(url, pc.field("id") == 7)  # in the second part, not yet copied
        return real(*args)

    monkeypatch.setattr(compaction, "_copy_part", a_delete_first)
    with pytest.raises(ConcurrentCommitError, match="nothing of the compaction was published"):
        compact_dataset(url)
    latest = versions.list_versions(url)[-1]
    assert latest.operation == "delete" and 7 not in table_of(url)["id"].to_pylist()
    listed = {f for v in versions.list_versions(url) for f in v.files()}
    assert not [p for p in Path(url).rglob("unihub-*c0*") if str(p.relative_to(url)) not in listed]
    assert compact_dataset(url) is not None  # run again, it lands


def test_a_delete_and_a_backfill_after_a_compaction(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    grown(url)
    compact_dataset(url)
    add_column(url, SPLIT, np.where(np.arange(40) % 4 == 0, "val", "train"))
    version = versions.delete_rows(url, pc.field("split") == "val")
    assert version is not None
    kept = [i for i in range(40) if i % 4]
    table = table_of(url)
    assert table["id"].to_pylist() == kept and table["label"].to_pylist() == [i * 10 if i < 30 else None for i in kept]
    assert column_sets.DIRECTORY in {p.split("/")[0] for p in side_files(url)}


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "ds")
    grown(url)
    assert cli_main(["compact", url, "--tag", "c1"]) == 0
    assert "compacted into 2 part(s) as version" in capsys.readouterr().out
    assert cli_main(["compact", url]) == 0
    assert "nothing compacted" in capsys.readouterr().out
    assert cli_main(["compact", url, "--target-mb", "-1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("unihub: error:") and "target_mb" in err and len(err.strip().splitlines()) == 1


KILLED_COMPACTION = KILLED.split("\nschema = Unischema")[0] + "\n" + textwrap.dedent("""
    from unihub.store import compaction, versions
    wrap(versions, "retire")
    compaction.compact_dataset(sys.argv[1])
    print("done", flush=True)
""")


@pytest.mark.slow
def test_a_kill_at_any_step_of_a_compaction_leaves_the_old_or_the_new_version(tmp_path: Path) -> None:
    """A compaction SIGKILLed at each step (a file renamed, linked or removed, a writer closed, a part retired):
    the dataset reads the old version or the new one, every version before it as it was, and the next commit puts
    right what the kill left (a plain listing is the latest version again)."""
    seed = tmp_path / "seed"
    grown(str(seed), appends=4)
    latest = versions.list_versions(str(seed))[-1].number
    expected = table_of(str(seed))
    outcomes = set()
    for step, url, _, err in killed_copies(tmp_path, seed, KILLED_COMPACTION, 80):
        now = versions.list_versions(url)[-1].number
        assert now in (latest, latest + 1), (step, err)
        outcomes.add(now == latest + 1)
        assert table_of(url).equals(expected), step  # the same rows and values, old version or new
        assert table_of(url, version=latest).equals(expected), step
        write_dataset(url, SCHEMA, rows(500, 501), mode="append")  # settles what the killed compaction left
        assert sorted(pq.read_table(url)["id"].to_pylist()) == sorted(table_of(url)["id"].to_pylist()), step
    assert outcomes == {False, True}


def test_a_reader_state_saved_before_a_compaction_resumes_after_it_exactly(tmp_path: Path) -> None:
    """A compaction keeps every row group (its rows, its place in the order): a training run checkpointed on the
    grown dataset resumes on the compacted one with exactly the rows it had not seen, shuffled as before."""
    url = str(tmp_path / "ds")
    grown(url)
    with make_reader(url, schema_fields=["id"], seed=3, shuffle_rows=True, workers_count=1, num_epochs=1) as reader:
        whole = [int(r.id) for r in reader]
    with make_reader(url, schema_fields=["id"], seed=3, shuffle_rows=True, workers_count=1, num_epochs=1) as reader:
        seen = [int(next(reader).id) for _ in range(13)]
        state = reader.state_dict()
    assert compact_dataset(url) is not None
    with make_reader(url, schema_fields=["id"], seed=3, shuffle_rows=True, workers_count=1, num_epochs=1,
                     resume_from=state) as reader:
        rest = [int(r.id) for r in reader]
    assert seen + rest == whole


def test_a_summary_file_is_rewritten_for_the_joined_parts(tmp_path: Path) -> None:
    """Petastorm's and Spark's ``_metadata`` lists the files and their row groups (Petastorm skips a file it lacks):
    the compaction's version lists the joined parts there (tests/petastorm/test_grown_datasets.py: with Petastorm)."""
    url = str(tmp_path / "ds")
    grown(url)
    Path(url, "_metadata").write_bytes(b"")  # any summary there is rewritten, even one no reader could parse
    version = compact_dataset(url)
    assert version is not None
    summary = pq.read_metadata(Path(url, "_metadata"))
    listed = [summary.row_group(k).column(0).file_path for k in range(summary.num_row_groups)]
    assert list(dict.fromkeys(listed)) == list(version.parts) and summary.num_rows == open_dataset(url).num_rows


def test_parts_of_conversions_from_other_sources_are_joined(tmp_path: Path) -> None:
    """Appends whose files differ only in the conversion's own metadata (``unihub.extra``: its source) are joined;
    the parts' columns and Unischema must match."""
    url = str(tmp_path / "ds")
    for k, source in enumerate(("day1.tfrecord", "day2.tfrecord", "day3.tfrecord")):
        write_dataset(url, SCHEMA, rows(5 * k, 5 * k + 5), mode="append", extra_metadata={"source": source})
    before = table_of(url)
    version = compact_dataset(url)
    assert version is not None and len(version.parts) == 1 and table_of(url).equals(before)


def test_a_compacted_image_dataset_keeps_its_page_index_and_small_image_pages(tmp_path: Path) -> None:
    """The joined parts are written as the parts were (store/file_options.py): an offset index on every column and
    image pages of a few images, so random access still reads a cell by its page."""
    from unihub import Dataset

    from .test_columns import SCHEMA as PICS
    from .test_columns import write_pics

    url = tmp_path / "pics"
    first = tmp_path / "first"
    write_pics(first)
    source = open_dataset(first)
    rows_ = pa.concat_tables(source.read_row_group(g) for g in range(len(source.row_groups))).to_pylist()
    for _ in range(3):  # three appends of the same 120 rows of 16x16 PNGs
        write_dataset(str(url), PICS, ({"id": r["id"], "image": r["image"]} for r in rows_), mode="append")
    before = table_of(str(url))
    assert compact_dataset(url) is not None
    assert table_of(str(url)).equals(before)
    (part,) = [p for p in url.iterdir() if p.suffix == ".parquet"]
    metadata = pq.read_metadata(part)
    assert all(metadata.row_group(g).column(c).has_offset_index for g in range(metadata.num_row_groups)
               for c in range(metadata.num_columns))
    ds = Dataset(str(url), cache_mb=0.001)
    chunk = ds.pages._chunk(0, "image") if ds.pages is not None else None
    assert chunk is not None and len(chunk.locations.sizes) > 1
    taken = ds.take([5, 1])
    assert list(np.asarray(taken.id)) == [before["id"][5].as_py(), before["id"][1].as_py()]


def test_a_dataset_written_once_in_small_files_is_compacted_as_its_version_2(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    write_dataset(url, SCHEMA, rows(0, 20), rows_per_file=5)  # no version recorded: version 1 is implicit
    before = table_of(url)
    assert len(open_dataset(url).files) == 4
    version = compact_dataset(url)
    assert version is not None and version.number == 2 and len(version.parts) == 1
    assert [v.operation for v in versions.list_versions(url)] == ["write", "compact"]
    assert table_of(url).equals(before) and table_of(url, version=1).equals(before)
    assert sorted(pq.read_table(url)["id"].to_pylist()) == list(range(20))


@pytest.mark.parametrize("job", ["compact", "delete", "fold", "cli"])
def test_a_damaged_part_or_side_file_is_a_named_error_and_nothing_is_left(tmp_path: Path, job: str,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A rewrite (compaction, delete, a fold of small column sets) reading a page that fails its CRC raises
    DataCorruptionError naming the file and row group, a file cut short a FormatError naming it; the dataset is as
    it was (no new file, no version) and the CLI prints one line."""
    import pyarrow.compute as pc

    from unihub.errors import DataCorruptionError, FormatError

    from .test_integrity import payload_flip

    url = str(tmp_path / "ds")
    grown(url)
    latest = versions.list_versions(url)[-1]
    side_file = Path(url, next(s for s in latest.column_sets if s["name"] == "emb")["parts"][latest.parts[1]]["file"])
    damaged = side_file if job == "fold" else Path(url, latest.parts[1])
    payload_flip(damaged)
    listing = sorted(str(p.relative_to(url)) for p in Path(url).rglob("*"))
    run = {"compact": lambda: compact_dataset(url), "delete": lambda: versions.delete_rows(url, pc.field("id") < 3),
           "fold": lambda: add_column(url, SPLIT, ["x"] * 40)}
    if job == "cli":
        assert cli_main(["compact", url]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("unihub: error:") and str(damaged) in err[0] and "CRC" in err[0]
    else:
        with pytest.raises(DataCorruptionError, match=f"{re.escape(str(damaged))}: row group 0"):
            run[job]()
    assert sorted(str(p.relative_to(url)) for p in Path(url).rglob("*")) == listing
    if job == "compact":
        damaged.write_bytes(damaged.read_bytes()[:40])  # cut short: no footer
        with pytest.raises(FormatError, match=f"{re.escape(str(damaged))}: not a readable Parquet file"):
            compact_dataset(url)
