"""The schema the reader tests share: scalars, a nullable float, fixed and ragged tensors,
a Petastorm ``NdarrayCodec`` field and, optionally, a small PNG image."""

from __future__ import annotations

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
