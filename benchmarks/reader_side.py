"""unihub's half of ``benchmarks/reader.py``'s make_reader rows: one epoch in a fresh process, a JSON result out.

The counterpart of ``petastorm_side.py`` (which runs Petastorm in its own venv), so that both
contenders are timed alike: each run is a new process, imports are done before the clock starts,
and the clock runs from creating the reader to leaving its ``with`` block after the last row
(worker start-up and shut-down included), touching every field of every row as Petastorm's side
does. Beside the wall time it measures the CPU (user + system seconds) of the whole process tree
over the same span: :func:`tree_cpu_seconds`, which ``petastorm_side.py`` imports too (this module
imports only the standard library at the top for that reason).

    python benchmarks/reader_side.py '{"url": "file:///...", "schema_fields": ["id", "label"]}'

Job keys: ``url`` (required), ``schema_fields`` [null = all], ``reader_kwargs`` [{}] (more
make_reader keyword arguments). Result (the only line on stdout)::

    {"rows": n, "seconds": wall, "cpu_s": user + system of the process tree}
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Any


def _stat_ticks(pid: int | str) -> tuple[int, int]:
    """(parent pid, utime + stime + cutime + cstime in clock ticks) of one process, from ``/proc/PID/stat``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # after the command's ")": state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17), numbered as in proc(5)
    return int(fields[1]), sum(int(v) for v in fields[11:15])


def tree_cpu_seconds(root: int | None = None) -> float:
    """User + system CPU seconds of this process (or ``root``) and all its live descendants, their own and
    their waited-for children's: the difference of two calls is what the tree spent in between, workers
    that started and exited meanwhile included (their time is in their parent's cutime/cstime).

    This process's own share comes from ``getrusage`` (microseconds, all its threads, and the children
    it has waited for); the descendants' from ``/proc/PID/stat`` (clock ticks, 10 ms)."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid, spent = _stat_ticks(entry)
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            children.setdefault(ppid, []).append(int(entry))
            ticks[int(entry)] = spent
    own = 0.0
    if root is None:
        root = os.getpid()
        usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        own = sum(u.ru_utime + u.ru_stime for u in usage)
    else:
        own = ticks.get(root, 0) / os.sysconf("SC_CLK_TCK")
    total, todo = 0, list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return own + total / os.sysconf("SC_CLK_TCK")


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
