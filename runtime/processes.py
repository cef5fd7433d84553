"""Telling whether a process still runs, even after its pid was given to another one.

A pid alone names a process only while it runs: once it has exited and been reaped, the kernel
may hand the same number to a new process. The pid and the process's start time together name
one process for as long as the machine runs (Linux ``/proc``; elsewhere the pid is all there is).
"""

from __future__ import annotations

import os


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks after boot (Linux), else None."""
    found = _stat(pid)
    return None if found is None else found[1]


def is_running(pid: int, started: int | None = None) -> bool:
    """Whether process ``pid`` runs and, with ``started`` (from :func:`start_time`), is the process
    that started then rather than a later one given its pid. A zombie (exited, not yet reaped) does
    not run; another user's live process does."""
    if pid != os.getpid():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's live process
            pass
    found = _stat(pid)
    if found is None:  # no /proc: the pid is all there is to go by
        return True
    state, start = found
    return state != "Z" and (not started or start == started)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) of a process from ``/proc/<pid>/stat`` (Linux), else None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    try:
        fields = stat.rsplit(b")", 1)[1].split()  # the name before ')' may hold spaces
        return fields[0].decode(), int(fields[19])  # fields 3 and 22 of proc(5)
    except (IndexError, ValueError):
        return None
