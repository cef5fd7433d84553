"""bridges/tf/checkpoint.py: a ReaderPosition resumes elastically, and after an elastic resume.

Ranks take batches through ``position.track(make_tf_dataset(reader, ...))`` (tf.data prefetching ahead of
what they take), save their positions, and a run with another number of ranks resumes from all of them:
checked on row ids as tests/readers/test_elastic.py checks readers. In the epoch the run stopped in, the
new ranks deliver exactly the rows no old rank's model took (``pad``: all of them, ranks equal by wrapping
round; ``drop``: each at most once, ranks equal); later epochs are a fresh run's with the new world size.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from unihub import ScalarCodec, Unischema, UnischemaField, open_dataset, write_dataset
from unihub.readers.reader import Reader, make_batch_reader, make_reader

tf = pytest.importorskip("tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from unihub.bridges.tf.checkpoint import PositionStateError, ReaderPosition, saved_position  # noqa: E402
from unihub.bridges.tf.dataset import make_tf_dataset  # noqa: E402

from ...elastic_rest import check_rest_of_epoch  # noqa: E402
from ..keras_fit import fit_recorded  # noqa: E402

N = 203  # rows, in row groups of ~8 over files of 50: shards cut row groups and files
SCHEMA = Unischema("Position", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False)])
OPTIONS: dict[str, Any] = dict(shuffle_row_groups=True, shuffle_rows=True, seed=5, num_epochs=2,
                               reader_pool_type="dummy")
BATCH = 6
Rows = list[list[tuple[int, int]]]  # each rank's (epoch, id) of the rows its model took


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: Any) -> Path:
    path = tmp_path_factory.mktemp("positions") / "ds"
    write_dataset(path, SCHEMA, ({"id": i} for i in range(N)), row_group_size_mb=0.0001, rows_per_file=50)
    assert len(open_dataset(path).row_groups) >= 16  # shard_by="row_group" over 8 ranks
    return path


def _open(dataset: Path, shard: int, count: int, remainder: str, batched: bool = False, **options: Any) -> Reader:
    make = make_batch_reader if batched else make_reader
    return make(dataset, cur_shard=shard, shard_count=count, shard_remainder=remainder,
                **{"shard_by": "row", **OPTIONS, **options})


def _epochs_ahead(reader: Reader) -> list[int]:
    """The epoch of each row the reader has still to deliver, in order (its plans from where it stands)."""
    epoch, task, offset = reader._where()
    done_before = sum(t.num_rows for t in reader.plan_of(epoch)[:task]) + offset + getattr(reader, "_skip_rows", 0)
    out: list[int] = []
    while epoch < reader.num_epochs:
        size = sum(t.num_rows for t in reader.plan_of(epoch))
        out += [epoch] * (size - done_before)
        epoch, done_before = epoch + 1, 0
    return out


def _take(position: ReaderPosition, batches: int | None, shuffle: int = 0) -> list[tuple[int, int]]:
    """(epoch, id) of the rows of the next ``batches`` batches the model takes (all: None), through
    ``shuffle`` rows of make_tf_dataset's shuffle buffer (a reader of one epoch then: rows of two epochs
    would mix in the buffer)."""
    epochs = _epochs_ahead(position.reader)
    assert not shuffle or position.reader.num_epochs == 1
    dataset = position.track(make_tf_dataset(position.reader, batch_size=BATCH, prefetch=3, shuffle_buffer=shuffle,
                                             seed=len(epochs)))
    ids: list[int] = []
    iterator = iter(dataset)
    for _ in range(len(epochs) if batches is None else batches):
        batch = next(iterator, None)
        if batch is None:
            break
        ids += batch["id"].numpy().tolist()
    assert position.rows_taken == len(ids)  # the rows taken, not those tf.data fetched ahead
    return list(zip(epochs, ids))


def _run(dataset: Path, count: int, stops: list[int | None], resume_from: Any, remainder: str,
         tmp_path: Path | None = None, shuffle: int = 0, **options: Any) -> tuple[Rows, list[dict[str, Any]]]:
    """Each rank's rows up to its stop and its saved position; resumed from ``resume_from`` (every rank's
    positions: a list; or one position per rank: a dict of lists), through tf.train.Checkpoint where a
    folder is given."""
    rows, states = [], []
    for k in range(count):
        with _open(dataset, k, count, remainder, **options) as reader:
            position = ReaderPosition(reader)
            if isinstance(resume_from, dict):
                position.load_state_dict(resume_from["each"][k])
            elif resume_from is not None:
                position.load_state_dict(resume_from)
            rows.append(_take(position, stops[k], shuffle))
            if tmp_path is None:
                states.append(json.loads(json.dumps(position.state_dict())))
            else:
                saved = tf.train.Checkpoint(data=position).save(str(tmp_path / f"rank{k}" / "ckpt"))
                states.append(saved_position(saved))
    return rows, states


def _fresh_epoch(dataset: Path, epoch: int, shard: int, count: int, remainder: str, **options: Any) -> list[int]:
    with _open(dataset, shard, count, remainder, **options) as reader:
        return [i for e, i in _take(ReaderPosition(reader), None) if e == epoch]


def _check_resumed(dataset: Path, before: Rows, after: Rows, remainder: str, epochs: int = OPTIONS["num_epochs"],
                   shuffled: bool = False, shard_by: str = "row") -> None:
    """``after`` (each new rank's rows to the end) continues ``before`` (every earlier rank's, of all the
    runs before) as an elastic resume must (``shuffled``: through a shuffle buffer, in another order)."""
    count = len(after)
    old = Counter((e, i) for rows in before for e, i in rows)
    start = min((e for rows in after for e, _ in rows), default=epochs)
    for epoch in range(start, epochs):
        gone = {i for e, i in old if e == epoch}
        new = [[i for e, i in rows if e == epoch] for rows in after]
        if not gone:  # nothing of it was taken: planned afresh for the new shard count
            for k, rows in enumerate(new):
                fresh = _fresh_epoch(dataset, epoch, k, count, remainder, num_epochs=epochs, shard_by=shard_by)
                assert (sorted(rows) == sorted(fresh)) if shuffled else (rows == fresh)
            continue
        check_rest_of_epoch(gone, new, N, remainder, f"epoch {epoch}: ")


def test_a_position_after_an_elastic_resume_counts_the_resumed_epochs_rows(dataset: Path) -> None:
    """A reader resumed elastically plans its epoch as a run of what was left (fewer rows than an epoch):
    the position of its model past that run's end is in the next epoch, on the right row (before, it was
    counted with a whole epoch's rows: the restored reader re-delivered taken rows and skipped others)."""
    _, states = _run(dataset, 3, [20, 9, 14], None, "drop")  # rank 1 stops in epoch 0, 13 rows before its end
    with _open(dataset, 0, 2, "drop") as reader:
        reader.load_state_dict([s["reader"] | {"skip": s["row"]} for s in states])
        position = ReaderPosition(reader)
        head = _take(position, 8)
        saved = json.loads(json.dumps(position.state_dict()))
    with _open(dataset, 0, 2, "drop") as reader:
        reader.load_state_dict([s["reader"] | {"skip": s["row"]} for s in states])
        whole = _take(ReaderPosition(reader), None)
    with _open(dataset, 0, 2, "drop", seed=11) as reader:  # one by one on the same world size (the seed saved wins)
        position = ReaderPosition(reader)
        position.load_state_dict(saved)
        tail = _take(position, None)
    assert len(head) == 8 * BATCH and {e for e, _ in head} == {0, 1}  # past the resumed epoch's end
    assert head + tail == whole  # every row of the rank's stream once, in its order


@settings(max_examples=16, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
          phases=[Phase.explicit, Phase.generate])
@given(old=st.integers(1, 8), new=st.integers(1, 8), data=st.data(), remainder=st.sampled_from(["pad", "drop"]),
       shard_by=st.sampled_from(["row", "row_group"]), batched=st.booleans(), checkpoint=st.booleans())
def test_positions_of_any_world_size_resume_on_any_other(dataset: Path, tmp_path_factory: Any, old: int, new: int,
                                                         data: Any, remainder: str, shard_by: str, batched: bool,
                                                         checkpoint: bool) -> None:
    stops = data.draw(st.lists(st.integers(0, 2 * N // (old * BATCH) + 1), min_size=old, max_size=old))
    folder = tmp_path_factory.mktemp("ckpt") if checkpoint else None
    before, states = _run(dataset, old, stops, None, remainder, folder, batched=batched, shard_by=shard_by)
    after, _ = _run(dataset, new, [None] * new, states, remainder, batched=batched, shard_by=shard_by)
    _check_resumed(dataset, before, after, remainder, shard_by=shard_by)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
          phases=[Phase.explicit, Phase.generate])
@given(sizes=st.lists(st.integers(1, 8), min_size=3, max_size=3), data=st.data(), again=st.booleans())
def test_an_elastically_resumed_run_saves_positions_that_resume_again(dataset: Path, sizes: list[int], data: Any,
                                                                     again: bool) -> None:
    """Run A stops anywhere; run B resumes A's positions on another world size and stops anywhere (in the
    resumed epoch or the next); run C resumes B's: on a third world size, or each rank its own position."""
    first, second, third = sizes
    if not again:
        third = second
    stops = data.draw(st.lists(st.integers(0, N // (first * BATCH) + 1), min_size=first, max_size=first))
    rows_a, states_a = _run(dataset, first, stops, None, "drop")
    stops = data.draw(st.lists(st.integers(0, 2 * N // (second * BATCH) + 1), min_size=second, max_size=second))
    rows_b, states_b = _run(dataset, second, stops, states_a, "drop")
    rows_c, _ = _run(dataset, third, [None] * third, states_b if again else {"each": states_b}, "drop")
    if again:
        _check_resumed(dataset, rows_a + rows_b, rows_c, "drop")
    else:  # each rank goes on with its own stream: B's rows and C's together are B's uninterrupted
        whole, _ = _run(dataset, second, [None] * second, states_a, "drop")
        assert [b + c for b, c in zip(rows_b, rows_c)] == whole


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
          phases=[Phase.explicit, Phase.generate])
@given(old=st.integers(1, 8), new=st.integers(1, 8), data=st.data(), shuffle=st.integers(1, 80),
       remainder=st.sampled_from(["pad", "drop"]), batched=st.booleans())
def test_positions_through_a_shuffle_buffer_resume_with_the_buffers_rows(dataset: Path, old: int, new: int, data: Any,
                                                                        shuffle: int, remainder: str,
                                                                        batched: bool) -> None:
    """Through make_tf_dataset's shuffle buffer the model takes rows out of the reader's order: the rows that
    sat in the buffers (read, not taken) are read again after the resume, and no row taken is."""
    stops = data.draw(st.lists(st.integers(0, N // (old * BATCH) + 1), min_size=old, max_size=old))
    options = dict(batched=batched, num_epochs=1)
    before, states = _run(dataset, old, stops, None, remainder, shuffle=shuffle, **options)
    assert any(s.get("exclude") for s in states) or not any(stops) or shuffle < BATCH
    after, _ = _run(dataset, new, [None] * new, states, remainder, shuffle=shuffle, **options)
    _check_resumed(dataset, before, after, remainder, epochs=1, shuffled=True)


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("stop", [1, 5, 9])
@pytest.mark.parametrize("shard", [(0, 1), (1, 2), (2, 3)])
def test_a_shuffled_datasets_position_restores_one_by_one_through_tf_checkpoint(dataset: Path, tmp_path: Path,
                                                                                batched: bool, stop: int,
                                                                                shard: tuple[int, int]) -> None:
    """Alone, sharded or not: the rows that sat in the buffer are read again, no row taken is, and a position saved
    after the restore (the reader still passing over rows taken before) restores as exactly."""
    k, count = shard
    with _open(dataset, k, count, "drop", batched, num_epochs=1) as reader:
        position = ReaderPosition(reader)
        head = _take(position, stop, shuffle=40)
        saved = tf.train.Checkpoint(data=position).save(str(tmp_path / "ckpt"))
    share = sorted(_fresh_epoch(dataset, 0, k, count, "drop", batched=batched, num_epochs=1))
    assert saved_position(saved).get("exclude")  # rows taken past the first one not taken
    with _open(dataset, k, count, "drop", batched, num_epochs=1) as reader:
        position = ReaderPosition(reader)
        tf.train.Checkpoint(data=position).restore(saved).assert_consumed()
        tail = _take(position, None, shuffle=40)
    assert sorted(i for _, i in head + tail) == share  # each row once: the buffer's were read again
    with _open(dataset, k, count, "drop", batched, num_epochs=1) as reader:
        position = ReaderPosition(reader)
        tf.train.Checkpoint(data=position).restore(saved).assert_consumed()
        middle = _take(position, 2, shuffle=40)
        again = tf.train.Checkpoint(data=position).save(str(tmp_path / "again"))
    assert saved_position(again).get("exclude")  # the rows taken before the restore, not yet passed
    with _open(dataset, k, count, "drop", batched, num_epochs=1) as reader:
        position = ReaderPosition(reader)
        tf.train.Checkpoint(data=position).restore(again).assert_consumed()
        rest = _take(position, None, shuffle=40)
    assert sorted(i for _, i in head + middle + rest) == share


def test_positions_that_cannot_resume_elastically_are_refused_by_name(dataset: Path, tmp_path: Path) -> None:
    _, states = _run(dataset, 2, [2, 3], None, "pad")
    with _open(dataset, 0, 3, "pad") as reader:
        position = ReaderPosition(reader)
        with pytest.raises(PositionStateError, match="ReaderPosition.state_dict"):
            position.load_state_dict([states[0], {"version": 1}])
        old = [dict(s, reader={k: v for k, v in s["reader"].items() if k != "shard"}) for s in states]
        with pytest.raises(PositionStateError, match="lacks 'shard'"):
            position.load_state_dict(old)
        with pytest.raises(PositionStateError, match="different seeds"):
            position.load_state_dict([states[0], dict(states[1], reader=dict(states[1]["reader"], seed=9))])
        for row in ("3", 1.5, None, True, -1):  # once a raw ValueError/TypeError, or int(1.5) taken as row 1
            with pytest.raises(PositionStateError, match="ReaderPosition.state_dict"):
                position.load_state_dict([states[0], dict(states[1], row=row)])
            with pytest.raises(PositionStateError, match="ReaderPosition.state_dict"):
                position.load_state_dict(dict(states[1], row=row))
        with pytest.raises(PositionStateError, match="past the end of its epoch"):  # once: the rank's rows all gone
            position.load_state_dict([states[0], dict(states[1], row=10**6)])
    with _open(dataset, 0, 3, "pad", shuffle_rows=False) as reader:
        with pytest.raises(PositionStateError, match="other reader options"):
            ReaderPosition(reader).load_state_dict(states)
    with pytest.raises(PositionStateError, match="no reader position 'data'"):
        with _open(dataset, 0, 1, "pad") as reader:
            saved_position(tf.train.Checkpoint(other=ReaderPosition(reader)).save(str(tmp_path / "ckpt")))


def test_the_record_of_rows_handed_out_folds_what_was_taken() -> None:
    from unihub.bridges.tf.emitted import Emitted
    record = Emitted()
    record.add(np.array([2, 0, 5]))
    record.add(np.array([1, 7, 3, 4, 9]))
    assert record.taken(0)[0] == 0 and record.taken(2)[0] == 1
    low, above = record.taken(3)
    assert low == 1 and above.tolist() == [2, 5]
    low, above = record.taken(6)
    assert low == 4 and above.tolist() == [5, 7]
    low, above = record.taken(7)
    assert low == 6 and above.tolist() == [7]
    with pytest.raises(ValueError, match="more than"):
        record.taken(9)
    record.reset()
    assert not record.active and record.taken(0)[0] == 0


def _keras_fit(dataset_path: Path, backup: str, seen: list[list[int]], interrupt_at: int | None) -> None:
    fit_recorded(dataset_path, backup, seen, interrupt_at, batch_size=BATCH, shuffle_buffer=30)


def test_keras_fit_through_a_shuffle_buffer_resumes_with_backup_and_restore_on_the_rows_not_trained(
        dataset: Path, tmp_path: Path) -> None:
    pytest.importorskip("keras")
    first: list[list[int]] = []
    with pytest.raises(RuntimeError, match="interrupted"):
        _keras_fit(dataset, str(tmp_path / "backup"), first, interrupt_at=10)
    resumed: list[list[int]] = []
    _keras_fit(dataset, str(tmp_path / "backup"), resumed, interrupt_at=None)
    # the last backup was after batch 8 (save_freq=3): what batches 9 and 10 took is trained again
    trained = [i for batch in first[:9] + resumed for i in batch]
    assert sorted(trained) == list(range(N))


@pytest.mark.parametrize("text", ["not json", "[" * 100_000])
def test_a_checkpoint_whose_position_is_not_json_is_a_position_state_error(dataset: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          text: str) -> None:
    """Before: json.loads' JSONDecodeError or RecursionError, from saved_position and from a restore."""
    with _open(dataset, 0, 1, "pad") as reader:
        position = ReaderPosition(reader)
        monkeypatch.setattr(ReaderPosition, "_serialize_to_tensors", lambda self: {"state": tf.constant(text)})
        saved = tf.train.Checkpoint(data=position).save(str(tmp_path / "ckpt"))
        monkeypatch.undo()
        with pytest.raises(PositionStateError, match="the saved reader position is not JSON"):
            saved_position(saved)
        with pytest.raises(PositionStateError, match="the saved reader position is not JSON"):
            tf.train.Checkpoint(data=position).restore(saved)
