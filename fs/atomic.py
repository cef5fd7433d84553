"""Replacing a local file or directory atomically, and finishing what a killed run left beside it.

A writer stages its output in a hidden sibling of the destination ``DST`` and puts it in place at
the end (:func:`replace`). Siblings are named after their owner, the process that made them::

    .DST.unihub-tmp-<owner>-<random>   a run's staging area
    .DST.unihub-old-<owner>-<random>   the previous DST, renamed aside for a moment (see below)

where ``<owner>`` is ``<where>-<pid>-<start>``: a hash of the host, boot and pid namespace, the
process id and the process's start time, so that a sibling can be told to belong to a live
process or to a dead one even after pids are reused (:func:`owner_alive`).

On Linux, ``renameat2(RENAME_EXCHANGE)`` swaps the staged output with the old ``DST`` in one
step: a kill at any moment leaves the old or the new dataset at ``DST``; the old one, now under
the staging name, is removed afterwards. Where the swap is refused (another system, a filesystem
without it), the old ``DST`` is renamed aside and the new one renamed in: a kill between the two
leaves ``DST`` missing and the old dataset whole in an ``unihub-old`` sibling (an ``unihub-old``
name only ever holds a whole dataset).

:func:`settle` finishes such interrupted commits; writers call it before they write ``DST`` and
:func:`~unihub.store.dataset.open_dataset` when ``DST`` is missing. It puts the newest old
dataset back where ``DST`` is missing, and removes old copies and staging areas whose owner is
gone, never those of a live process.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from unihub.runtime import processes

Kind = Literal["tmp", "old"]
_KINDS: tuple[Kind, ...] = ("tmp", "old")

#: siblings named by unihub versions that did not record their owner (``unihub-tmp-<12 hex>``):
#: a staging area counts as abandoned once nothing in it changed for this long, an old copy once
#: it was renamed aside this long ago (those versions renamed the new dataset in right after)
LEGACY_GRACE_SECONDS = {"tmp": 3600.0, "old": 60.0}

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
#: errors that say "this system or filesystem cannot do that rename", not "that rename failed"
_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}

_OWNER = re.compile(r"(?P<where>[0-9a-f]{8})-(?P<pid>\d+)-(?P<start>\d+)-[0-9a-f]{6}")
_LEGACY = re.compile(r"[0-9a-f]{12}")


@dataclass(frozen=True)
class Sibling:
    """A staging area or old copy found beside a destination."""

    path: str
    kind: Kind
    alive: bool  # its owner may still be at work: leave it alone


def sibling(target: str, kind: Kind = "tmp") -> str:
    """A new hidden name beside ``target`` owned by this process (nothing is created)."""
    parent, name = os.path.split(target.rstrip("/"))
    hidden = f".{name}.unihub-{kind}-{_owner()}-{uuid.uuid4().hex[:6]}"
    return f"{parent.rstrip('/')}/{hidden}" if parent else hidden


def run_id() -> str:
    """A name for one run of this process, ``<where>-<pid>-<start>-<random>``, that :func:`owner_alive`
    can judge (object stores name the files of a run with it: :mod:`unihub.fs.publish`)."""
    return f"{_owner()}-{uuid.uuid4().hex[:6]}"


def replace(temporary: str, target: str) -> None:
    """Put ``temporary`` (a file or directory) at ``target``, replacing what is there, atomically
    where the system can swap the two; the old ``target`` is removed afterwards."""
    while True:
        if not os.path.lexists(target):
            try:
                _rename_noreplace(temporary, target)
                return
            except FileExistsError:  # made meanwhile by another run: swap with it
                continue
        try:
            swapped = _exchange(temporary, target)
        except FileNotFoundError:
            if not os.path.lexists(target):  # removed meanwhile: rename, as to a new target
                continue
            raise
        if swapped:
            remove(temporary)  # holds the old target now
            return
        if not os.path.isdir(temporary) and not os.path.isdir(target):
            os.replace(temporary, target)  # atomic for files everywhere
            return
        _replace_in_two_steps(temporary, target)
        return


def _replace_in_two_steps(temporary: str, target: str) -> None:
    """The old ``target`` aside, then ``temporary`` in (a kill between leaves the old aside: :func:`settle`)."""
    old = sibling(target, "old")
    os.rename(target, old)
    try:
        os.rename(temporary, target)
    except BaseException:
        os.rename(old, target)
        raise
    discard(old)


def settle(target: str) -> str | None:
    """Finish what interrupted commits left beside ``target``; see the module docstring.

    Best effort: what cannot be changed (no permission) stays. Returns the old copy that should
    be at ``target`` but could not be put back, else None.
    """
    target = target.rstrip("/")
    found = siblings(target)
    olds = [s.path for s in found if s.kind == "old" and not s.alive]
    missing: str | None = None
    if olds and not os.path.lexists(target):
        newest = max(olds, key=_changed_ns)
        try:
            _rename_noreplace(newest, target)
            olds.remove(newest)
        except FileNotFoundError:  # put back by another process meanwhile
            olds.remove(newest)
        except FileExistsError:  # a new target meanwhile: the old copies are garbage
            pass
        except OSError:
            missing = newest
    if os.path.lexists(target):
        for path in olds:
            discard(path)
    for s in found:
        if s.kind == "tmp" and not s.alive:
            remove(s.path)
    return missing


def siblings(target: str) -> list[Sibling]:
    """The staging areas and old copies beside ``target`` (one listing of its directory)."""
    parent, name = os.path.split(target.rstrip("/"))
    try:
        entries = os.listdir(parent or ".")
    except OSError:
        return []
    found = []
    for entry in entries:
        for kind in _KINDS:
            prefix = f".{name}.unihub-{kind}-"
            if entry.startswith(prefix):
                path = os.path.join(parent, entry)
                found.append(Sibling(path, kind, _in_use(path, entry[len(prefix):], kind)))
    return found


def discard(old: str) -> None:
    """Remove an old copy: renamed to a staging name first, so an ``unihub-old`` name never holds a part."""
    parent, hidden = os.path.split(old)
    name = hidden[1:].rsplit(".unihub-old-", 1)[0]
    doomed = sibling(os.path.join(parent, name), "tmp")
    try:
        os.rename(old, doomed)
    except OSError:
        return
    remove(doomed)


def remove(path: str) -> None:
    """Delete a file or directory tree; missing is fine, and so is what cannot be deleted."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


# -- owners ------------------------------------------------------------------------------------------
def owner_alive(where: str, pid: int, start: int) -> bool:
    """Whether the process that named a sibling ``<where>-<pid>-<start>`` may still run.

    Another host, boot or pid namespace cannot be asked: taken as alive (its siblings stay). A
    zombie is dead; a process with the same pid but another start time is another process.
    """
    if where != _where():
        return True
    return processes.is_running(pid, start)


def _in_use(path: str, suffix: str, kind: Kind) -> bool:
    match = _OWNER.fullmatch(suffix)
    if match is not None:
        return owner_alive(match["where"], int(match["pid"]), int(match["start"]))
    if _LEGACY.fullmatch(suffix):  # no owner recorded: abandoned once it stopped changing
        try:
            stat = os.lstat(path)
        except OSError:
            return True
        changed = stat.st_mtime if kind == "tmp" else stat.st_ctime  # ctime: when it was renamed aside
        return time.time() - changed < LEGACY_GRACE_SECONDS[kind]
    return True  # not a name unihub makes: never touched


def _owner() -> str:
    return f"{_where()}-{os.getpid()}-{processes.start_time(os.getpid()) or 0}"


_WHERE: str | None = None


def _where() -> str:
    """8 hex digits naming this host, boot and pid namespace (where a pid means one process)."""
    global _WHERE
    if _WHERE is None:
        parts = [socket.gethostname()]
        for source in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/pid"):
            try:
                parts.append(os.readlink(source) if source.endswith("/pid") else open(source).read().strip())
            except OSError:
                parts.append("")
        _WHERE = hashlib.sha1("\0".join(parts).encode()).hexdigest()[:8]
    return _WHERE


def _changed_ns(path: str) -> int:
    try:
        return os.lstat(path).st_ctime_ns  # a rename sets it: the newest old copy was set aside last
    except OSError:
        return -1


# -- renameat2 ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _libc_renameat2() -> Callable[..., int] | None:
    """libc's ``renameat2``; None where there is none (not Linux, or a libc before glibc 2.28)."""
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def _exchange(a: str, b: str) -> bool:
    """Swap ``a`` and ``b`` atomically; False where the system or filesystem cannot."""
    return _renameat2(a, b, _RENAME_EXCHANGE)


def rename_noreplace(src: str, dest: str) -> None:
    """Rename ``src`` to ``dest`` unless ``dest`` exists (then FileExistsError): a new dataset put in place
    where another may have been made meanwhile (:mod:`unihub.store.versions`)."""
    _rename_noreplace(src, dest)


def _rename_noreplace(src: str, dest: str) -> None:
    """Rename ``src`` to ``dest``, FileExistsError if ``dest`` exists (checked and renamed at once where
    the system can)."""
    if _renameat2(src, dest, _RENAME_NOREPLACE):
        return
    if os.path.lexists(dest):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dest)
    os.rename(src, dest)


def _renameat2(src: str, dest: str, flags: int) -> bool:
    """``renameat2(src, dest, flags)``: True when done, False when unsupported, OSError when it failed."""
    function = _libc_renameat2()
    if function is None:
        return False
    if function(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dest), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), src, None, dest)
