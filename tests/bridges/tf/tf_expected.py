"""What the TensorFlow bridge tests share: real Petastorm 0.13.1's output on the fixtures
(``tests/fixtures/petastorm/tf_expected.pkl``, written by ``make_tf_expected.py``) and the
value form it was recorded in, so unihub's tensors can be put in the same form and compared."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path
from typing import Any

import numpy as np

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "petastorm"
URL = {name: (FIXTURES / name).as_uri() for name in ("unischema", "plain", "codecless")}
#: the NGram and fields make_tf_expected.py used
NGRAM_FIELDS = {-1: ["id", "label", "embedding"], 1: ["id", "image_png", "boxes", "split"]}
ROW_FIELDS = ["id", "label", "embedding", "boxes", "split", "image_png"]
CODECLESS_FIELDS = ["id", "u8", "i16", "f32", "f64n", "flag", "name", "sb", "sb_plain", "label"]
STRING_FIELDS = ["id", "words", "name", "sb", "sb_plain"]


def petastorm_expected() -> dict[str, Any]:
    with open(FIXTURES / "tf_expected.pkl", "rb") as handle:
        return pickle.load(handle)


def value(v: Any) -> Any:
    """A tensor or numpy value as make_tf_expected.py recorded it: lists, strings as UTF-8 bytes, arrays of
    more than 64 elements as a digest of their bytes."""
    a = np.asarray(v.numpy() if hasattr(v, "numpy") else v)
    if a.dtype.kind == "U":
        a = np.char.encode(a, "utf-8")
    if a.dtype == object:
        return np.vectorize(lambda s: s.encode() if isinstance(s, str) else s, otypes=[object])(a).tolist()
    if a.size > 64:
        return ("sha256", a.dtype.name, a.shape, hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest())
    return a.tolist()


def structure(spec_or_tensors: Any) -> list[tuple[str, str, tuple[int | None, ...]]]:
    """[(field, tf dtype name, static shape)] of a namedtuple of specs or tensors, sorted by field."""
    return sorted((k, s.dtype.name, tuple(s.shape.as_list())) for k, s in spec_or_tensors._asdict().items())


def window_values(window: dict[int, Any]) -> dict[int, dict[str, Any]]:
    return {k: {f: value(v) for f, v in t._asdict().items()} for k, t in window.items()}
