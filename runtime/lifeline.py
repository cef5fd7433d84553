"""Worker processes that die with their parent.

A forked worker waits on its pool's task queue. When the parent is killed (SIGKILL, the OOM
killer) nothing closes that queue, since every worker inherited both ends of its pipes, so
the workers would wait forever, holding the parent's files and pipes. A pool runs
:func:`die_with_parent` first in each worker (its initializer):

- on Linux the kernel sends the worker SIGKILL when the thread that forked it ends
  (``prctl(PR_SET_PDEATHSIG)``); a parent that died before that call is caught by comparing
  the parent pid;
- elsewhere, or with ``kernel=False`` (pools whose forking thread may end before the pool is
  done, as a reader's), a daemon thread polls the parent pid and ends the worker when it changes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1
#: seconds between two looks at the parent pid where the kernel cannot be asked
POLL_SECONDS = 0.5


def die_with_parent(parent: int, kernel: bool = True) -> None:
    """End this process when process ``parent`` (its parent) ends; see the module docstring."""
    if kernel and _ask_kernel():
        if os.getppid() != parent:  # the parent died before the kernel was asked
            os._exit(1)
        return
    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=_watch, args=(parent,), name="unihub-lifeline", daemon=True).start()


def _ask_kernel() -> bool:
    """``prctl(PR_SET_PDEATHSIG, SIGKILL)``; False where there is no such call."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (AttributeError, OSError):
        return False
    return prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_SECONDS)
    os._exit(1)
