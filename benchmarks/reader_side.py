"""unihub's half of ``benchmarks/reader.py``'s make_reader rows: one epoch in a fresh process, a JSON result out.

The counterpart of ``petastorm_side.py`` (which runs Petastorm in its own venv), so that both
contenders are timed alike: each run is a new process, imports are done before the clock starts,
and the clock runs from creating the reader to leaving its ``with`` block after the last row
(worker start-up and shut-down included), touching every field of every row as Petastorm's side
does. Beside the wall time it measures the CPU (user + system seconds) of the whole process tree
over the same span: ``proc_cpu.tree_cpu_seconds``, the clock every side here uses.

    python benchmarks/reader_side.py '{"url": "file:///...", "schema_fields": ["id", "label"]}'

Job keys: ``url`` (required), ``schema_fields`` [null = all], ``reader_kwargs`` [{}] (more
make_reader keyword arguments). Result (the only line on stdout)::

    {"rows": n, "seconds": wall, "cpu_s": user + system of the process tree}
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from proc_cpu import tree_cpu_seconds  # stdlib only


def run(job: dict[str, Any]) -> dict[str, Any]:
    """One epoch of unihub's make_reader: rows, wall seconds and process-tree CPU seconds."""
    from unihub import make_reader

    kwargs = dict(job.get("reader_kwargs") or {})
    if job.get("schema_fields") is not None:
        kwargs["schema_fields"] = list(job["schema_fields"])
    rows = 0
    cpu0, start = tree_cpu_seconds(), time.perf_counter()
    with make_reader(job["url"], **kwargs) as reader:
        fields = None
        for row in reader:
            if fields is None:
                fields = row._fields
            for f in fields:  # touch every field, as petastorm_side.py does
                getattr(row, f)
            rows += 1
    seconds, cpu = time.perf_counter() - start, tree_cpu_seconds() - cpu0
    return {"rows": rows, "seconds": seconds, "cpu_s": cpu}


def main(argv: list[str]) -> int:
    job = json.loads(argv[0])
    import unihub  # noqa: F401  (imported before the clock: a user's process has it already)

    print(json.dumps(run(job)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
