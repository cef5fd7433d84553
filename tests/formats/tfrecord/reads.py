"""What a TFRecord read shows, and the equality of two reads: the test modules that hold the two Example
parsers equal (test_parsers.py, test_example_block.py) share these."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from unihub.errors import FormatError
from unihub.formats.tfrecord.format import TFRecordFormat
from unihub.schema.unischema import Unischema


def read_all(files: Any, schema: Unischema | None, parser: str, batch_size: int, on_error: str) -> dict[str, Any]:
    """Everything a read by ``parser`` shows: batches, the error it ended with, the report."""
    source = TFRecordFormat(files, parser=parser)
    schema = schema or source.infer_schema()
    batches, error = [], None
    try:
        for batch in source.read_batches(schema, batch_size=batch_size, on_error=on_error):  # type: ignore[arg-type]
            batches.append(batch)
    except FormatError as exc:
        error = (str(exc), exc.path, exc.offset)
    return {"batches": batches, "error": error, "records": source.report.records,
            "skipped": [(s.path, s.location, s.reason) for s in source.report.skipped]}


def assert_same(a: Any, b: Any) -> None:
    """``a`` (the block parser's) equals ``b`` (the record parser's): types, dtypes, shapes, bytes."""
    if isinstance(a, pa.Array):  # the block parser hands bytes and text columns over as Arrow arrays
        assert pa.types.is_binary(a.type) or pa.types.is_string(a.type)
        a = a.to_pylist()
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.dtype != object:
            assert a.tobytes() == b.tobytes()
        else:
            for x, y in zip(a.ravel(), b.ravel()):
                assert_same(x, y)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (float, np.floating)) and np.isnan(a):
        assert np.isnan(b)
    else:
        assert a == b
