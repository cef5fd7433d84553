"""Resource bombs in Petastorm's pickled metadata are refused fast and small, before unpickling."""

from __future__ import annotations

import contextlib
import pickle
import struct
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub.cli import main
from unihub.errors import PetastormMetadataError, UnsafeMetadataError
from unihub.petastorm import legacy
from unihub.petastorm.legacy import brief, load_petastorm_unischema, safe_unpickle
from unihub.petastorm.pickle_scan import PickleLimits, scan_pickle
from unihub.readers.rowgroup_index import read_rowgroup_indexes
from unihub.store.dataset import open_dataset

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "petastorm"
LEGACY_FIXTURES = FIXTURES.parent / "petastorm_legacy"  # Petastorm 0.4.0-0.7.6, pickled by Python 2's cPickle
PICKLE_KEYS = (legacy.PETASTORM_UNISCHEMA_KEY, legacy.PETASTORM_ROWGROUPS_INDEX_KEY)


@contextlib.contextmanager
def fast_and_small(seconds: float = 2.0, megabytes: float = 50.0) -> Iterator[None]:
    """Assert that the block takes less than ``seconds`` and allocates less than ``megabytes`` at its peak."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < seconds, f"took {elapsed:.2f} s"
    assert peak < megabytes * 2**20, f"allocated {peak / 2**20:.0f} MiB at the peak"


# -- the bombs, built by hand as the fuzzer found them ----------------------------------------
def memo_bomb(index: int) -> bytes:
    """``PROTO 4, NONE, LONG_BINPUT index, STOP``: CPython sizes its memo table to the index."""
    return b"\x80\x04N" + b"r" + struct.pack("<I", index) + b"."


def tuple_chain_key(levels: int) -> bytes:
    """``t[i+1] = (t[i], t[i])``, then ``{t[levels]: None}``: hashing the key walks 2**levels tuples."""
    out = bytearray(b"\x80\x04)\x94")  # EMPTY_TUPLE, MEMOIZE
    for i in range(levels):
        out += b"h" + bytes([i]) + b"h" + bytes([i]) + b"\x86\x94"  # BINGET i, BINGET i, TUPLE2, MEMOIZE
    return bytes(out + b"}h" + bytes([levels]) + b"Ns.")  # EMPTY_DICT, BINGET last, NONE, SETITEM, STOP


def list_chain(levels: int) -> bytes:
    """``l[i+1] = [l[i], l[i]]``: the repr in an error message ("expected a Unischema, got [...]") is 2**levels."""
    out = bytearray(b"\x80\x04]\x94")  # EMPTY_LIST, MEMOIZE
    for i in range(levels):
        out += b"]\x94(h" + bytes([i]) + b"h" + bytes([i]) + b"e"  # EMPTY_LIST, MEMOIZE, MARK, 2 x BINGET, APPENDS
    return bytes(out + b".")


@pytest.mark.parametrize("index", [2**24, 2**27, 2**32 - 1])
def test_memo_index_bomb_is_refused_fast_and_small(index: int) -> None:
    data = memo_bomb(index)
    assert len(data) == 9
    with fast_and_small(), pytest.raises(UnsafeMetadataError, match=f"memo index {index:,} after 0 memoized values"):
        safe_unpickle(data)


def test_tuple_chain_hashed_as_a_dict_key_is_refused() -> None:
    data = tuple_chain_key(70)
    assert len(data) == 430
    with fast_and_small(), pytest.raises(UnsafeMetadataError, match=r"a value of more than [\d,]+ parts"):
        safe_unpickle(data)


def test_hashing_a_big_shared_key_many_times_is_refused() -> None:
    # each key alone is within bounds (2**16 parts); hashed 20,000 times it is 1.3e9 units of work
    chain = tuple_chain_key(16)[:-5]
    data = chain + b"}(" + (b"h\x10N" * 20_000) + b"u."  # EMPTY_DICT, MARK, (BINGET 16, NONE) x n, SETITEMS
    with fast_and_small(), pytest.raises(UnsafeMetadataError, match="hashing more than"):
        safe_unpickle(data)


def test_list_chain_in_an_error_message_is_refused() -> None:
    data = list_chain(70)
    assert len(data) < 600
    with fast_and_small(), pytest.raises(UnsafeMetadataError, match="parts"):
        load_petastorm_unischema(data)


def test_error_messages_built_from_pickle_content_are_bounded() -> None:
    # 2**18 lists is within bounds; the message that shows the value stays short
    with fast_and_small(), pytest.raises(PetastormMetadataError, match="expected a pickled petastorm") as info:
        load_petastorm_unischema(list_chain(18))
    assert len(str(info.value)) < 300


def test_deep_nesting_is_refused() -> None:
    data = b"\x80\x04" + b"]" * 1000 + b"a" * 999 + b"."  # 1000 EMPTY_LISTs, each APPENDed into the one below
    with fast_and_small(), pytest.raises(UnsafeMetadataError, match="nested more than 100 deep"):
        safe_unpickle(data)


def test_memo_indexes_in_picklers_order_are_accepted_and_gaps_refused() -> None:
    assert safe_unpickle(b"\x80\x02N" + b"q\x00" + b"Nq\x01" + b"\x86.") == (None, None)
    with pytest.raises(UnsafeMetadataError, match="BINPUT of memo index 2 after 1 memoized values"):
        safe_unpickle(b"\x80\x02N" + b"q\x00" + b"Nq\x02" + b"\x86.")
    with pytest.raises(UnsafeMetadataError, match="PUT of memo index 999,999,999 after 0"):
        safe_unpickle(b"Np999999999\n.")


def test_python2_cpickle_numbers_its_memo_from_1_and_gaps_are_still_refused() -> None:
    # Python 2's cPickle (every Petastorm dataset written under Python 2) numbers its memo 1, 2, 3, ...
    assert safe_unpickle(b"(Np1\nNp2\nt.") == (None, None)  # protocol 0
    assert safe_unpickle(b"\x80\x02Nq\x01Nq\x02\x86.") == (None, None)  # protocol 2
    with pytest.raises(UnsafeMetadataError, match="PUT of memo index 3 after 1 memoized values numbered from 1"):
        safe_unpickle(b"(Np1\nNp3\nt.")
    with pytest.raises(UnsafeMetadataError, match="PUT of memo index 2 after 0 memoized values"):
        safe_unpickle(b"Np2\n.")  # only a first index of 1 starts the numbering at 1
    with pytest.raises(UnsafeMetadataError, match="BINPUT of memo index 2 after 1 memoized values \\("):
        safe_unpickle(b"\x80\x02Nq\x00Nq\x02\x86.")  # numbered from 0: no gap of one allowed either


@pytest.mark.parametrize("index", [2**24, 2**27, 2**32 - 1])
def test_memo_index_bomb_after_cpickle_numbering_is_refused_fast_and_small(index: int) -> None:
    data = b"\x80\x02Nq\x01" + b"r" + struct.pack("<I", index) + b"."  # BINPUT 1, then LONG_BINPUT index
    with fast_and_small(), pytest.raises(UnsafeMetadataError,
                                         match=f"memo index {index:,} after 1 memoized values numbered from 1"):
        safe_unpickle(data)


@pytest.mark.parametrize("data, message", [
    (b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\x7fN.", "FRAME of 9223372036854775807 bytes, longer than the pickle"),
    (b"\x80\x04h\x05.", "BINGET of memo index 5, which was never set"),
    (b"\x80\x04a.", "APPEND with nothing on the stack"),
    (b"\x80\x04(t\x86.", "TUPLE2 with nothing on the stack"),
    (b"\x80\x04Ne.", "APPENDS without a MARK"),
    (b"\x80\x04\x8e" + struct.pack("<Q", 2**40) + b"N.", "expected 1099511627776 bytes in a bytes8, but only 2 remain"),
])
def test_malformed_pickles_name_the_byte(data: bytes, message: str) -> None:
    with fast_and_small(), pytest.raises(PetastormMetadataError, match=f"malformed.*{message}|{message}.*byte"):
        safe_unpickle(data)


def test_limits_on_bytes_and_opcodes() -> None:
    data = pickle.dumps(list(range(100)), protocol=2)
    scan_pickle(data, allowed=())
    with pytest.raises(UnsafeMetadataError, match="more than 50 opcodes"):
        scan_pickle(data, allowed=(), limits=PickleLimits(max_opcodes=50))
    with pytest.raises(UnsafeMetadataError, match=f"{len(data)} bytes, more than 100"):
        scan_pickle(data, allowed=(), limits=PickleLimits(max_bytes=100))


def _fixture_pickles() -> list[tuple[str, bytes]]:
    found = []
    for path in sorted(FIXTURES.glob("*/_common_metadata")) + sorted(LEGACY_FIXTURES.glob("*/_common_metadata")):
        metadata = pq.read_metadata(path).metadata
        found += [(f"{path.parent.name}:{key.decode()}", metadata[key]) for key in PICKLE_KEYS if key in metadata]
    return found


@pytest.mark.parametrize("name, data", _fixture_pickles())
def test_real_petastorm_pickles_are_far_below_the_limits(name: str, data: bytes) -> None:
    # a fifth of the default depth (Python 2's protocol-0 Unischemas nest 13 deep), no more parts than two per
    # opcode: the real pickles still pass
    scan_pickle(data, allowed=legacy.ALLOWED_GLOBALS, limits=PickleLimits(max_depth=20, expansion=2, expansion_floor=0))
    safe_unpickle(data)


def test_brief_is_bounded() -> None:
    nested: list = []
    for _ in range(50):
        nested = [nested, nested, nested, nested, nested]
    huge_int = 1 << 100_000
    for value in (nested, {i: "x" * 10_000 for i in range(10_000)}, huge_int, ("a" * 10**6,), b"b" * 10**6):
        with fast_and_small(0.5, 5):
            assert len(brief(value)) <= 160
    assert brief(huge_int) == "<int of 100001 bits>"
    assert brief({"a": [1, (2,)], "b": {3}}) == "{'a': [1, (2,)], 'b': set({3})}"


# -- through a dataset and the CLI -------------------------------------------------------------
def _dataset_with(tmp_path: Path, entries: dict[bytes, bytes]) -> Path:
    root = tmp_path / "ds"
    root.mkdir()
    table = pa.table({"id": pa.array([1, 2, 3], pa.int64())})
    pq.write_table(table, root / "part-0.parquet")
    pq.write_metadata(table.schema.with_metadata(entries), root / "_common_metadata")
    return root


def test_a_bomb_in_common_metadata_names_the_file_and_is_one_cli_line(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    root = _dataset_with(tmp_path, {legacy.PETASTORM_UNISCHEMA_KEY: memo_bomb(2**27)})
    with fast_and_small(), pytest.raises(UnsafeMetadataError) as info:
        open_dataset(str(root))
    assert str(info.value).startswith(f"{root / '_common_metadata'} (dataset-toolkit.unischema.v1): refused")
    capsys.readouterr()
    assert main(["inspect", str(root)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("unihub: error: ") and "memo index 134,217,728" in err


def test_a_bomb_in_a_rowgroup_index_names_the_dataset(tmp_path: Path) -> None:
    root = _dataset_with(tmp_path, {legacy.PETASTORM_ROWGROUPS_INDEX_KEY: tuple_chain_key(70)})
    store = open_dataset(str(root))
    with fast_and_small(), pytest.raises(UnsafeMetadataError, match=r"\(dataset-toolkit.rowgroups_index.v1\): refused"):
        read_rowgroup_indexes(store)
