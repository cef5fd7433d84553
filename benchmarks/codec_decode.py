"""Decode of a 100k-row float32 (128,) column: TensorCodec vs NdarrayCodec (target >= 20x).

Both columns are read back from Parquet first, so the timing covers only the decode of an
in-memory Arrow column to one ``(n, 128)`` numpy array. ``np.load per cell`` is how Petastorm
decodes NdarrayCodec (one ``np.load`` per value); unihub's NdarrayCodec parses the header
once and decodes a same-header column in one step.

    python benchmarks/codec_decode.py [--rows 100000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time

import numpy as np
import pyarrow.parquet as pq

from unihub import NdarrayCodec, TensorCodec, Unischema, UnischemaField, write_dataset


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    tensor = UnischemaField("x", np.float32, (128,), TensorCodec(), False)
    ndarray = UnischemaField("x", np.float32, (128,), NdarrayCodec(), False)
    values = np.random.default_rng(0).standard_normal((args.rows, 128), dtype=np.float32)
    columns = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, field in (("tensor", tensor), ("ndarray", ndarray)):
            url = f"{tmp}/{label}"
            write_dataset(url, Unischema(label, [field]), {"x": values}, batched=True, row_group_size_mb=1024)
            columns[label] = pq.read_table(url, columns=["x"]).column("x").combine_chunks()

    tensor_out = tensor.codec.decode_column(tensor, columns["tensor"])
    ndarray_out = ndarray.codec.decode_column(ndarray, columns["ndarray"])
    assert np.array_equal(tensor_out, values) and np.array_equal(ndarray_out, values)
    blobs = columns["ndarray"].to_pylist()

    t_tensor = best_of(args.repeat, lambda: tensor.codec.decode_column(tensor, columns["tensor"]))
    t_ndarray = best_of(args.repeat, lambda: ndarray.codec.decode_column(ndarray, columns["ndarray"]))
    t_percell = best_of(max(1, args.repeat // 2),
                        lambda: np.stack([np.load(io.BytesIO(b)) for b in blobs]))
    print(f"decode of {args.rows:,} rows of float32 (128,), best of {args.repeat}\n")
    print("| codec | seconds | rows/s | TensorCodec is faster by |")
    print("|---|---|---|---|")
    for label, seconds in (("TensorCodec (fixed_shape_tensor)", t_tensor),
                           ("NdarrayCodec (unihub, vectorised header parse)", t_ndarray),
                           ("NdarrayCodec, np.load per cell (Petastorm's way)", t_percell)):
        print(f"| {label} | {seconds:.6f} | {args.rows / seconds:,.0f} | {seconds / t_tensor:,.0f}x |")


if __name__ == "__main__":
    main()
