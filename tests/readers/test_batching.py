"""The one shuffling buffer (readers/batching.py) on numpy and torch columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from unihub.readers.batching import Rebatcher, ShuffleBuffer, concat, take


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_shuffle_buffer_hands_out_every_row_once_with_its_own_values(backend: str) -> None:
    """Random adds and draws, array and list columns (a column turning ragged midway): each row
    comes out once with its columns still together, and nothing else is lost or repeated."""
    if backend == "torch":
        torch = pytest.importorskip("torch")
        array = torch.from_numpy
    else:
        def array(values: np.ndarray) -> np.ndarray:
            return values

    rng = np.random.default_rng(0)
    buffer, seen, next_position = ShuffleBuffer(), [], 0
    for step in range(60):
        n = int(rng.integers(1, 40))
        positions = np.arange(next_position, next_position + n)
        next_position += n
        ragged_rows = [np.full(int(p % 3) + 1, float(p)) for p in positions]
        ragged = ([array(r) for r in ragged_rows] if backend == "torch" else np.array(ragged_rows + [None],
                                                                                          dtype=object)[:-1])
        columns = {"id": array(positions.copy()),
                   "vec": array(np.repeat(positions[:, None], 3, axis=1).astype(np.float32)),
                   "name": [f"r{p}" for p in positions],
                   "ragged": ragged if step >= 30 else array(np.full((n, 2), positions[:, None], np.float64))}
        buffer.add(columns, positions)
        if buffer.size > 50:
            count = int(rng.integers(1, buffer.size))
            out, taken = buffer.take_random(count, rng)
            assert [int(i) for i in out["id"]] == taken.tolist()
            assert all((np.asarray(row) == p).all() for row, p in zip(out["vec"], taken))
            assert list(out["name"]) == [f"r{p}" for p in taken]
            assert all((np.asarray(r) == float(p)).all() for r, p in zip(out["ragged"], taken))
            seen += taken.tolist()
            assert sorted(buffer.positions().tolist()) == sorted(set(range(next_position)) - set(seen))
    out, taken = buffer.take_random(buffer.size, rng)
    seen += taken.tolist()
    assert sorted(seen) == list(range(next_position)) and buffer.size == 0


def test_positions_default_to_consecutive_numbers_and_draws_are_seeded() -> None:
    def draws(seed: int) -> list[int]:
        buffer = ShuffleBuffer()
        buffer.add({"x": np.arange(10)})
        buffer.add({"x": np.arange(10, 15)})
        assert buffer.positions().tolist() == list(range(15))
        out, positions = buffer.take_random(6, np.random.default_rng(seed))
        assert out["x"].tolist() == positions.tolist()
        return positions.tolist()

    assert draws(1) == draws(1) != draws(2)


def test_a_reserved_buffer_takes_its_room_once() -> None:
    """Filling a queue whose size is known does not copy it into ever bigger room; a batch bigger
    than the reserve still fits (the room grows), and every row comes out once with its values."""
    rng = np.random.default_rng(0)
    buffer = ShuffleBuffer(reserve=100)
    buffer.add({"x": np.arange(10, dtype=np.float32), "s": [str(i) for i in range(10)]})
    room = buffer.columns["x"]
    assert len(room) == 100
    for start in range(10, 100, 10):
        buffer.add({"x": np.arange(start, start + 10, dtype=np.float32), "s": [str(i) for i in range(start, start + 10)]})
        assert buffer.columns["x"] is room
    out, positions = buffer.take_random(30, rng)
    buffer.add({"x": np.arange(100, 150, dtype=np.float32), "s": [str(i) for i in range(100, 150)]},
               np.arange(100, 150))  # 120 rows > 100
    assert buffer.columns["x"] is not room and buffer.size == 120
    rest, rest_positions = buffer.take_random(buffer.size, rng)
    xs = np.concatenate([out["x"], rest["x"]])
    assert sorted(xs.tolist()) == list(range(150))
    assert [int(v) for v in out["s"] + rest["s"]] == xs.astype(int).tolist()
    np.testing.assert_array_equal(np.concatenate([positions, rest_positions]), xs.astype(np.int64))


def test_take_and_concat_keep_tensors_tensors_also_where_numpy_cannot_hold_them() -> None:
    """CPU tensors move through numpy views (no torch threads woken); a dtype numpy lacks (bfloat16)
    goes through torch itself; the values and dtypes are torch's own either way."""
    torch = pytest.importorskip("torch")
    from unihub.readers.batching import concat, take

    index = np.array([4, 0, 2, 2])
    for dtype in (torch.uint8, torch.int64, torch.float32, torch.bool, torch.bfloat16):
        a = torch.arange(12).reshape(6, 2).to(dtype)
        b = torch.arange(100, 104).reshape(2, 2).to(dtype)
        joined = concat([a, b])
        assert isinstance(joined, torch.Tensor) and joined.dtype == dtype and torch.equal(joined, torch.cat([a, b]))
        taken = take(a, index)
        assert taken.dtype == dtype and torch.equal(taken, a[torch.from_numpy(index)])
        buffer = ShuffleBuffer()
        buffer.add({"x": a})
        buffer.add({"x": b})
        out, positions = buffer.take_random(8, np.random.default_rng(3))
        assert out["x"].dtype == dtype and torch.equal(out["x"], joined[torch.from_numpy(positions)])
    assert concat([np.arange(2), np.arange(3)]).tolist() == [0, 1, 0, 1, 2]
    assert concat([["a"], torch.arange(2)])[0] == "a"  # mixed columns become lists


def test_numeric_rows_are_copied_into_aligned_memory() -> None:
    """take/concat of numbers land on 64-byte boundaries (what TensorFlow takes without a copy),
    with the same values and dtypes numpy's own would give; object columns stay numpy's."""
    rng = np.random.default_rng(1)
    for dtype in (np.uint8, np.int64, np.float32, np.bool_, "datetime64[ns]", "<U3"):
        parts = [rng.integers(0, 100, (n, 3)).astype(dtype) for n in (5, 1, 7)]
        index = rng.permutation(13)[:9]
        joined, taken = concat(parts), take(np.concatenate(parts), index)
        np.testing.assert_array_equal(joined, np.concatenate(parts))
        np.testing.assert_array_equal(taken, np.concatenate(parts)[index])
        assert joined.dtype == taken.dtype == parts[0].dtype
        assert joined.ctypes.data % 64 == 0 and taken.ctypes.data % 64 == 0
        assert joined.flags.writeable and taken.flags.writeable
    objects = np.array([b"a", None, "c"], dtype=object)
    assert concat([objects, objects]).tolist() == [b"a", None, "c"] * 2
    assert take(objects, np.array([2, 0])).tolist() == ["c", b"a"]
    with pytest.raises(ValueError):
        concat([np.zeros((2, 3)), np.zeros((2, 4))])


def test_the_loader_moves_cpu_rows_without_torchs_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches across reader batches and a shuffling queue join and draw rows through numpy views:
    ``torch.cat`` and tensor indexing would wake torch's OpenMP threads, whose spin-waiting took the
    cores from the decoding threads. The rows still all come, once, with their values."""
    torch = pytest.importorskip("torch")
    from unihub import ScalarCodec, TensorCodec, Unischema, UnischemaField, make_batch_reader, write_dataset
    from unihub.bridges.torch import BatchedDataLoader

    schema = Unischema("S", [UnischemaField("id", np.int64, (), ScalarCodec(np.int64), False),
                             UnischemaField("x", np.uint8, (4, 3), TensorCodec(), False)])
    write_dataset(tmp_path / "ds", schema, ({"id": i, "x": np.full((4, 3), i % 256, np.uint8)} for i in range(500)),
                  row_group_size_mb=0.002)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.cat called")

    monkeypatch.setattr(torch, "cat", refuse)
    for capacity in (0, 100):
        with BatchedDataLoader(make_batch_reader((tmp_path / "ds").as_uri(), num_epochs=1, seed=1), batch_size=37,
                               shuffling_queue_capacity=capacity, seed=1) as loader:
            batches = list(loader)
        got = np.concatenate([b["id"].numpy() for b in batches])
        assert sorted(got.tolist()) == list(range(500))
        assert all((b["x"].numpy() == (b["id"].numpy() % 256)[:, None, None]).all() for b in batches)


@pytest.mark.parametrize("seed", range(6))
def test_rebatcher_cuts_any_chunks_into_batches_and_knows_what_it_holds(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in rng.integers(0, 23, 12)]
    size, drop = int(rng.integers(1, 9)), bool(seed % 2)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    chunks = [{"x": np.arange(a, a + n), "label": [f"r{i}" for i in range(a, a + n)]}
              for a, n in zip(starts[:-1].tolist(), sizes)]
    rebatcher = Rebatcher(size)
    taken = 0  # rows handed in so far, known from the chunks the generator has asked for

    def counted():
        nonlocal taken
        for chunk in chunks:
            taken += len(chunk["x"])
            yield chunk

    delivered: list[int] = []
    for batch, joined in rebatcher.batches(counted(), drop_remainder=drop):
        rows = batch["x"].tolist()
        assert batch["label"] == [f"r{i}" for i in rows]
        last = len(delivered) + len(rows) == sum(sizes)
        assert len(rows) == size or (last and not drop and len(rows) < size)
        in_one_chunk = any(a <= rows[0] and rows[-1] < a + n for a, n in zip(starts[:-1].tolist(), sizes))
        assert in_one_chunk or joined, "a batch across chunks is joined"
        assert joined or (in_one_chunk and len(rows) == size), "a batch not joined is a view of one chunk"
        delivered += rows
        pending = rebatcher.pending("x")
        assert (np.concatenate(pending).tolist() if pending else []) == list(range(len(delivered), taken))
    total = sum(sizes)
    assert delivered == list(range(total - (total % size if drop else 0)))
    assert rebatcher.pending("x") == []


def test_dates_of_two_units_are_joined_in_one_that_holds_both() -> None:
    """Row groups of Spark's INT96 come as nanoseconds or (a date past 1677-2262) microseconds; numpy's join
    in nanoseconds wrapped 9999-12-31 to 1816-03-29. Where no unit holds both, each row keeps its own."""
    near = np.array(["2020-01-01T00:00:00.000001", "NaT"], "M8[ns]")
    far = np.array(["9999-12-31"], "M8[us]")
    joined = concat([near, far])
    assert joined.dtype == np.dtype("M8[us]") and joined.tolist()[2] == far[0].item()
    assert concat([near, np.array(["2000-01-01"], "M8[us]")]).dtype == np.dtype("M8[ns]")
    finer = np.array(["2020-01-01T00:00:00.000000001"], "M8[ns]")
    rows = concat([finer, far])
    assert rows.dtype == object and rows[0] == finer[0] and rows[1] == far[0]
