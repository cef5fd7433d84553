"""Runs INSIDE the Petastorm 0.13.1 venv (``.venv-petastorm``): reads datasets with Petastorm's own
readers and saves what they returned into ``.npz`` files for the tests to compare.

    .venv-petastorm/bin/python petastorm_read_side.py '[{"url": "file:///...", "out": "/tmp/a.npz",
                                                        "reader": "make_reader", "fields": null}]'

Item ``n`` (a row, or a batch of ``make_batch_reader``) is saved field by field under
``"<n>/<field>"`` as ``np.asarray(value)``; a None under ``"<n>/<field>.isnull"``; bytes as uint8
under ``".bytes"``; a Decimal as its text under ``".decimal"``; an object array element by element
under ``"<n>/<field>/<j>"``. Only numpy is needed to save (no pickles in the files).
"""

import decimal
import json
import sys
import warnings

import numpy as np


def _save(arrays, key, value):
    if value is None:
        arrays[key + ".isnull"] = np.array(True)
    elif isinstance(value, (bytes, bytearray)):
        arrays[key + ".bytes"] = np.frombuffer(bytes(value), np.uint8)
    elif isinstance(value, decimal.Decimal):
        arrays[key + ".decimal"] = np.array(str(value))
    else:
        array = np.asarray(value)  # pandas Categorical (partition columns of batches) too
        if array.dtype != object:
            arrays[key] = array
            return
        arrays[key + ".len"] = np.array(len(array))
        for j, item in enumerate(array):
            _save(arrays, f"{key}/{j}", item)


def main():
    warnings.simplefilter("ignore")
    from petastorm import make_batch_reader, make_reader

    for job in json.loads(sys.argv[1]):
        make = make_reader if job["reader"] == "make_reader" else make_batch_reader
        arrays = {}
        with make(job["url"], schema_fields=job.get("fields"), reader_pool_type="dummy", shuffle_row_groups=False,
                  num_epochs=1) as reader:
            arrays["__schema__"] = np.array(str(reader.schema))
            count = 0
            for n, item in enumerate(reader):
                for name, value in item._asdict().items():
                    _save(arrays, f"{n}/{name}", value)
                count += 1
            arrays["__count__"] = np.array(count)
        np.savez(job["out"], **arrays)


if __name__ == "__main__":
    main()
