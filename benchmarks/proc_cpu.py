"""The CPU a process tree spends, from ``/proc``: the clock every benchmark here decides on first.

Standard library only: it is imported by the sides that run in the peers' and Petastorm's own venvs
(``peers_side.py``, ``petastorm_side.py``) as well as by unihub's (``reader_side.py``, ``cpu_per_row.py``).
"""

from __future__ import annotations

import os
import resource

_TICK = os.sysconf("SC_CLK_TCK")


def _stat_ticks(pid: int | str) -> tuple[int, int]:
    """(parent pid, utime + stime + cutime + cstime in clock ticks) of one process, from ``/proc/PID/stat``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # after the command's ")": state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17), numbered as in proc(5)
    return int(fields[1]), sum(int(v) for v in fields[11:15])


def tree_cpu_seconds(root: int | None = None) -> float:
    """User + system CPU seconds of this process (or ``root``) and all its live descendants, their own and
    their waited-for children's: the difference of two calls is what the tree spent in between, workers,
    threads and helper processes that started and exited meanwhile included (an exited child's time is in
    its parent's cutime/cstime once the parent has waited for it).

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
    if root is None:
        root = os.getpid()
        usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        own = sum(u.ru_utime + u.ru_stime for u in usage)
    else:
        own = ticks.get(root, 0) / _TICK
    total, todo = 0, list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return own + total / _TICK


def own_cpu_seconds() -> float:
    """User + system CPU seconds of this process alone (all its threads, not its children)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
