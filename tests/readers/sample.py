"""What the reader tests share: a schema (scalars, a nullable float, fixed and ragged tensors,
a Petastorm ``NdarrayCodec`` field and, optionally, a small PNG image), exact row comparison,
and a guard that fails a test instead of letting it hang."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from unihub import CompressedImageCodec, NdarrayCodec, ScalarCodec, TensorCodec, Unischema, UnischemaField


def sample_schema(name: str, *, image_shape: tuple[int, int, int] | None = None) -> Unischema:
    fields = [
        UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False),
        UnischemaField("name", np.str_, (), ScalarCodec(pa.string()), False),
        UnischemaField("score", np.float32, (), ScalarCodec(pa.float32()), True),
        UnischemaField("vec", np.float32, (3,), TensorCodec(), False),
        UnischemaField("boxes", np.float32, (None, 4), TensorCodec(), False),
        UnischemaField("emb", np.float64, (2,), NdarrayCodec(), False),
    ]
    if image_shape is not None:
        fields.append(UnischemaField("image", np.uint8, image_shape, CompressedImageCodec("png"), False))
    return Unischema(name, fields)


def sample_row(i: int) -> dict[str, Any]:
    """Row ``i`` of a :func:`sample_schema` dataset (without its image), the same on every call."""
    rng = np.random.default_rng(i)
    return {"id": i, "name": f"row-{i}", "score": float(np.float32(i / 3)), "vec": rng.random(3, dtype=np.float32),
            "boxes": rng.random((i % 3, 4), dtype=np.float32), "emb": rng.standard_normal(2)}


def rows_by_id(reader: Any) -> dict[int, Any]:
    with reader:
        return {int(row.id): row for row in reader}


def assert_rows_equal(found: dict[int, Any], expected: dict[int, Any]) -> None:
    assert sorted(found) == sorted(expected)
    for i, row in expected.items():
        other = found[i]
        assert row._fields == other._fields
        for name in row._fields:
            a, b = getattr(row, name), getattr(other, name)
            if isinstance(a, np.ndarray):
                assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, f"{i}.{name}"
                assert a.tobytes() == b.tobytes(), f"row {i}.{name}"
            else:
                assert type(a) is type(b) and (a == b or (a is None and b is None)), f"row {i}.{name}: {a!r} {b!r}"


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a daemon thread; fail (not hang) if it takes longer than ``seconds``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"did not finish within {seconds} s (hang?)"
    if "error" in box:
        raise box["error"]
    return box.get("value")
