"""What an append costs a dataset with a ``_metadata`` summary (Spark's, Petastorm's ``materialize_dataset``): the
summary and Petastorm's row-group JSON are rewritten for the new version at every commit (store/listings.py).

A dataset of ``--parts`` one-row-group parts with a summary, then ``--appends`` appends of 10 rows; the wall and CPU
time (this process) of each append is printed. Run it against another checkout with ``PYTHONPATH`` to compare::

    python benchmarks/append_listings.py --parts 500 --appends 5
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from unihub import ScalarCodec, Unischema, UnischemaField, open_dataset, write_dataset
from unihub.store.metadata_files import write_summary_metadata

SCHEMA = Unischema("Ids", [UnischemaField("id", np.int64, (), ScalarCodec(pa.int64()), False)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", type=int, default=500)
    parser.add_argument("--appends", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"{tmp}/ds"
        write_dataset(url, SCHEMA, ({"id": i} for i in range(4 * args.parts)), rows_per_file=4)
        paths = [f.path for f in open_dataset(url).files]
        write_summary_metadata(pafs.LocalFileSystem(), url, paths, pq.read_metadata(paths[0]))
        times = []
        for k in range(args.appends):
            cpu, wall = time.process_time(), time.perf_counter()
            write_dataset(url, SCHEMA, ({"id": i} for i in range(10**6 + 10 * k, 10**6 + 10 * k + 10)), mode="append")
            times.append((time.perf_counter() - wall, time.process_time() - cpu))
    print(f"{len(paths)} parts with a _metadata summary; each append, wall / CPU s: "
          + "  ".join(f"{w:.3f} / {c:.3f}" for w, c in times))


if __name__ == "__main__":
    main()
