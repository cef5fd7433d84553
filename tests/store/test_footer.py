"""Footers whose column chunks pyarrow's getters cannot survive (store/_footer.py): a compression codec pyarrow
does not know, a definition-level histogram of the wrong length. Each aborted the whole process (SIGABRT: a C++
exception through a Cython property) when unihub read the chunk's compression or its metadata; now unihub asks
nothing of such a footer (pyarrow's read of the row group raises its error, as a FormatError naming the file), or
raises a FormatError naming the file, the row group and the column. Run in a subprocess, so that an abort is a failure
of its test and not of the session."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unihub.store import _footer

ROOT = Path(__file__).resolve().parents[3]
#: each footer's change: (the bytes, their replacement, the problem named here, pyarrow's error reading the chunk)
HOSTILE = {
    # ColumnMetaData of "img": its path (a list of one binary), then field 4, the codec: 0 -> 18 (zigzag 36)
    "codec": (b"\x19\x18\x03img\x15\x00", b"\x19\x18\x03img\x15\x24", "compression codec 18",
              "Unsupported compression codec value: 18"),
    # SchemaElement "img": repetition OPTIONAL -> REQUIRED, while its chunk keeps a histogram of 2 levels
    "histogram": (b"\x25\x02\x18\x03img", b"\x25\x00\x18\x03img", "a definition level histogram of 2 levels, not 1",
                  "Definition level histogram size mismatch"),
    # ColumnMetaData of "img": its path not UTF-8 (pyarrow reads the chunk; its path_in_schema getter raised a raw
    # UnicodeDecodeError)
    "path": (b"\x19\x18\x03img\x15\x00", b"\x19\x18\x03\xf9mg\x15\x00", "a column path in bytes that are not UTF-8",
             None),
}
READ = textwrap.dedent("""
    import sys
    from unihub.errors import FormatError
    from unihub.store import dataset
    dataset.WALK_MIN_CHUNK_BYTES = 0  # every row group's pages walked (their CRCs checked here)
    store = dataset.open_dataset(sys.argv[1])
    for step in (lambda: store.read_row_group(0, views=["img"]), lambda: store.chunk_spans(0)):
        try:
            step()
        except FormatError as exc:
            print("FormatError:", exc)
""")


def good_file() -> bytes:
    """A file of plain, uncompressed binary values, as unihub writes images (with pyarrow's size statistics)."""
    table = pa.table({"img": pa.array([bytes(range(40))] * 50, pa.binary()), "n": pa.array(range(50))})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="none", use_dictionary=False, write_page_checksum=True)
    return buffer.getvalue()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_footer_pyarrow_would_abort_on_is_a_named_error(name: str, tmp_path: Path) -> None:
    old, new, problem, arrow = HOSTILE[name]
    data = good_file()
    assert data.count(old) == 1
    part = tmp_path / "ds" / "part-00000.parquet"
    part.parent.mkdir()
    part.write_bytes(data.replace(old, new))
    done = subprocess.run([sys.executable, "-c", READ, str(tmp_path / "ds")], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    *read, spans = done.stdout.splitlines()
    if arrow is not None:
        assert read[0].startswith(f"FormatError: {part}: cannot read row group 0: {arrow}"), read  # pyarrow's read
    else:
        assert not read  # read by pyarrow
    assert spans.startswith(f"FormatError: {part}: not a readable Parquet file: row group 0, column 0: {problem}")


def test_footers_pyarrow_writes_have_no_problem(tmp_path: Path) -> None:
    """Nested, nullable, compressed and many-row-group footers pass, as do more than 10,000 columns (beyond a page
    header's bound on a Thrift list)."""
    tables = [pa.table({"a": pa.array([[1, None], None, [3]], pa.list_(pa.int32())), "b": ["x", None, "z"],
                        "c": pa.array([{"p": 1.5}, None, {"p": None}])}),
              pa.table({f"c{i}": pa.array([1], pa.int8()) for i in range(10_001)})]
    for table in tables:
        for compression in ("snappy", "zstd", "none")[:3 if table.num_columns < 10 else 1]:
            buffer = io.BytesIO()
            pq.write_table(table, buffer, compression=compression, row_group_size=1)
            buffer.seek(0)
            assert _footer.problem(pq.read_metadata(buffer), _footer.tail(buffer.getvalue())) is None
