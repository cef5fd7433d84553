"""A bounded pre-scan of Petastorm's pickled metadata, done before anything is unpickled.

:mod:`unihub.petastorm.legacy` unpickles a dataset's pickled Unischema and row-group indexes into
inert stand-ins, so no code from the pickle runs. An unpickler can still be made to exhaust memory
or time by a few hundred bytes: ``LONG_BINPUT 2**27`` makes CPython's memo table 2 GiB, and a
chain of tuples that each hold the previous one twice is ``2**n`` tuples once hashed (as a dict
key) or printed (in an error message), for ``2n`` opcodes. :func:`scan_pickle` walks the opcodes
with :func:`pickletools.genops` and plays the unpickler's stack with placeholder nodes that carry
only sizes, so such a pickle is refused at the byte where it goes too far, before anything is built:

* a global (``GLOBAL``, ``INST``) off the allow-list, or an opcode that bypasses ``find_class``
  (persistent ids, the extension registry);
* more bytes or opcodes than a Petastorm schema or index needs (:class:`PickleLimits`);
* a memo index beyond the number of values memoized so far: picklers number them 0, 1, 2, ...,
  except Python 2's ``cPickle``, which numbers them 1, 2, 3, ... (every Petastorm dataset written
  under Python 2 has such a pickle), so a first ``PUT 1`` sets the numbering to start at 1;
* values nested deeper than ``max_depth``;
* sharing that multiplies work: counting a shared value once per reference, no value may be
  larger than ``expansion`` nodes per opcode read (plus ``expansion_floor``), and neither may
  everything hashed together (dict keys, set members, call arguments), since hashing a tuple
  walks all of it.

A refusal is an :class:`~unihub.errors.UnsafeMetadataError`; bytes that are not a pickle at all
are a :class:`~unihub.errors.PetastormMetadataError`. Both name the byte offset.
"""

from __future__ import annotations

import pickletools
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Any

from unihub.errors import PetastormMetadataError, UnsafeMetadataError

__all__ = ["DEFAULT_LIMITS", "PickleLimits", "refusal", "scan_pickle"]


@dataclass(frozen=True)
class PickleLimits:
    """Resource limits of :func:`scan_pickle`; the defaults are far above any real Petastorm pickle.

    ``max_bytes`` matches the 100 MB that pyarrow reads of a Parquet footer's metadata by default.
    """

    max_bytes: int = 100 * 2**20
    max_opcodes: int = 10_000_000
    max_depth: int = 100
    expansion: int = 64
    expansion_floor: int = 1_000_000


DEFAULT_LIMITS = PickleLimits()

#: Opcodes that bypass ``find_class``: persistent ids, and extension codes served from a process-wide cache.
FORBIDDEN_OPCODES = frozenset({"EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID"})


def refusal(what: str) -> UnsafeMetadataError:
    """The error for a pickle that references ``what``, which is not allow-listed."""
    return UnsafeMetadataError(
        f"refused to load pickled Petastorm metadata: it references {what}, which is not on "
        f"unihub's allow-list of Petastorm schema classes; nothing from the pickle was executed"
    )


def _over_limit(what: str, pos: int | None) -> UnsafeMetadataError:
    return UnsafeMetadataError(
        f"refused to load pickled Petastorm metadata: {what}{'' if pos is None else f' at byte {pos}'}; "
        "no Petastorm schema or index comes near unihub's limits, so the pickle is corrupt or made to "
        "exhaust memory or time; nothing from the pickle was executed"
    )


class _Malformed(Exception):
    """The stack play found what a real unpickler would fail on."""


class _Node:
    """Stands for one unpickled value: its size (nodes, shared ones counted per reference) and depth.

    ``tuple_like`` values (tuples, frozensets) hash and compare by walking their items.
    """

    __slots__ = ("depth", "size", "tuple_like")

    def __init__(self, size: int = 1, depth: int = 1, tuple_like: bool = False) -> None:
        self.size = size
        self.depth = depth
        self.tuple_like = tuple_like


#: every scalar and global: constant-time to hash, never changed (a change would fail in the unpickler)
_ATOM = _Node(1, 0)

_ATOMS = frozenset({
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "STRING", "BINSTRING",
    "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8", "NEXT_BUFFER", "NONE",
    "NEWTRUE", "NEWFALSE", "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "FLOAT",
    "BINFLOAT", "GLOBAL", "EMPTY_TUPLE",
})


class _StackPlay:
    """The unpickler's stack, marks and memo, over :class:`_Node` placeholders."""

    def __init__(self, limits: PickleLimits, size: int) -> None:
        self.limits = limits
        self.size = size  # of the pickle, for FRAME lengths
        self.stack: list[_Node] = []
        self.marks: list[int] = []
        self.memo: dict[int, _Node] = {}
        self.memo_writes = 0
        self.memo_base = 0  # the first memo index: 0, or 1 in the pickles of Python 2's cPickle
        self.opcodes = 0
        self.hashed = 0
        self.pos = 0
        self.handlers: dict[str, Callable[[Any], None]] = {
            "EMPTY_LIST": self._empty, "EMPTY_DICT": self._empty, "EMPTY_SET": self._empty,
            "LIST": self._list, "DICT": self._dict, "TUPLE": self._tuple, "FROZENSET": self._frozenset,
            "TUPLE1": self._tuple_n, "TUPLE2": self._tuple_n, "TUPLE3": self._tuple_n,
            "APPEND": self._append, "APPENDS": self._appends, "SETITEM": self._setitem,
            "SETITEMS": self._setitems, "ADDITEMS": self._additems, "BUILD": self._build,
            "POP": self._pop_op, "DUP": self._dup, "MARK": self._mark, "POP_MARK": self._pop_mark_op,
            "GET": self._get, "BINGET": self._get, "LONG_BINGET": self._get,
            "PUT": self._put, "BINPUT": self._put, "LONG_BINPUT": self._put, "MEMOIZE": self._memoize,
            "STACK_GLOBAL": self._stack_global, "REDUCE": self._call_2, "NEWOBJ": self._call_2,
            "NEWOBJ_EX": self._newobj_ex, "INST": self._call_mark, "OBJ": self._call_mark,
            "READONLY_BUFFER": self._top_op, "STOP": self._pop_op, "PROTO": self._nothing,
            "FRAME": self._frame,
        }
        self.tuple_sizes = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
        self.name = ""
        self.max_depth, self.floor = limits.max_depth, limits.expansion_floor

    # -- the loop, and bookkeeping ----------------------------------------------------------
    def run(self, data: bytes, allowed: Container[tuple[str, str]]) -> None:
        """Play every opcode of ``data``; the hot loop, so scalars take a short path."""
        stack, marks, memo, handlers = self.stack, self.marks, self.memo, self.handlers
        atoms, max_opcodes = _ATOMS, self.limits.max_opcodes
        for count, (opcode, arg, pos) in enumerate(pickletools.genops(data), 1):
            name = opcode.name
            if count > max_opcodes:
                raise _over_limit(f"more than {max_opcodes:,} opcodes", pos)
            if name in atoms:
                stack.append(_ATOM)
                if name == "GLOBAL":
                    _check_global(arg, allowed)
                continue
            if name == "MEMOIZE" and len(stack) > (marks[-1] if marks else 0):  # the commonest, inline
                memo[len(memo)] = stack[-1]
                self.memo_writes += 1
                continue
            if name == "BINGET" and arg in memo:
                stack.append(memo[arg])
                continue
            self.opcodes, self.pos, self.name = count, pos or 0, name
            if name in FORBIDDEN_OPCODES:
                raise refusal(f"the {name} opcode (argument {arg!r:.80}) at byte {pos}")
            if name == "INST":
                _check_global(arg, allowed)
            handlers[name](arg)

    def _budget(self) -> int:
        return self.limits.expansion * self.opcodes + self.limits.expansion_floor

    def _check(self, node: _Node) -> _Node:
        if node.depth <= self.max_depth and node.size <= self.floor:
            return node  # the common case, in two comparisons
        if node.depth > self.max_depth:
            raise _over_limit(f"values nested more than {self.max_depth} deep", self.pos)
        if node.size > self._budget():
            raise _over_limit(f"a value of more than {self._budget():,} parts (shared parts counted once per "
                              f"use) from {self.opcodes:,} opcodes", self.pos)
        return node

    def _charge(self, size: int) -> None:
        """Count the work of hashing (or passing to a call) values of ``size`` nodes."""
        self.hashed += size
        if self.hashed > self.floor and self.hashed > self._budget():
            raise _over_limit(f"hashing more than {self._budget():,} parts (shared parts counted once per use) "
                              f"for {self.opcodes:,} opcodes", self.pos)

    def _hash(self, keys: list[_Node]) -> None:
        self._charge(sum(k.size if k.tuple_like else 1 for k in keys))

    def _new(self, items: list[_Node], tuple_like: bool = False) -> _Node:
        size, depth = 1, 0
        for item in items:
            size += item.size
            if item.depth > depth:
                depth = item.depth
        return self._check(_Node(size, depth + 1, tuple_like))

    def _grow(self, target: _Node, items: list[_Node]) -> None:
        if target is _ATOM or target.tuple_like:
            return  # an unpickler cannot add to these; it fails there
        for item in items:
            target.size += item.size
            if item.depth >= target.depth:
                target.depth = item.depth + 1
        self._check(target)

    def _pop(self) -> _Node:
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            raise _Malformed(f"{self.name} with nothing on the stack")
        return self.stack.pop()

    def _top(self) -> _Node:
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            raise _Malformed(f"{self.name} with nothing on the stack")
        return self.stack[-1]

    def _pop_mark(self) -> list[_Node]:
        if not self.marks:
            raise _Malformed(f"{self.name} without a MARK")
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    # -- opcodes ------------------------------------------------------------------------------
    def _nothing(self, arg: Any) -> None:
        pass

    def _frame(self, arg: Any) -> None:
        if not isinstance(arg, int) or arg > self.size - self.pos:
            raise _Malformed(f"a FRAME of {arg} bytes, longer than the pickle")

    def _empty(self, arg: Any) -> None:
        self.stack.append(_Node())

    def _list(self, arg: Any) -> None:
        self.stack.append(self._new(self._pop_mark()))

    def _dict(self, arg: Any) -> None:
        items = self._pop_mark()
        self._hash(items[::2])
        self.stack.append(self._new(items))

    def _tuple(self, arg: Any) -> None:
        self.stack.append(self._new(self._pop_mark(), tuple_like=True))

    def _tuple_n(self, arg: Any) -> None:
        n = self.tuple_sizes[self.name]
        if len(self.stack) - n < (self.marks[-1] if self.marks else 0):
            raise _Malformed(f"{self.name} with nothing on the stack")
        items = self.stack[-n:]
        del self.stack[-n:]
        self.stack.append(self._new(items, tuple_like=True))

    def _frozenset(self, arg: Any) -> None:
        items = self._pop_mark()
        self._hash(items)
        self.stack.append(self._new(items, tuple_like=True))

    def _append(self, arg: Any) -> None:
        item = self._pop()
        self._grow(self._top(), [item])

    def _appends(self, arg: Any) -> None:
        items = self._pop_mark()
        self._grow(self._top(), items)

    def _setitem(self, arg: Any) -> None:
        value, key = self._pop(), self._pop()
        self._hash([key])
        self._grow(self._top(), [key, value])

    def _setitems(self, arg: Any) -> None:
        items = self._pop_mark()
        self._hash(items[::2])
        self._grow(self._top(), items)

    def _additems(self, arg: Any) -> None:
        items = self._pop_mark()
        self._hash(items)
        self._grow(self._top(), items)

    def _build(self, arg: Any) -> None:
        state = self._pop()
        self._grow(self._top(), [state])

    def _pop_op(self, arg: Any) -> None:
        if len(self.stack) > (self.marks[-1] if self.marks else 0):
            self.stack.pop()
        elif self.marks and self.name == "POP":
            self.marks.pop()
        else:
            raise _Malformed(f"{self.name} with nothing on the stack")

    def _dup(self, arg: Any) -> None:
        self.stack.append(self._top())

    def _mark(self, arg: Any) -> None:
        self.marks.append(len(self.stack))

    def _pop_mark_op(self, arg: Any) -> None:
        self._pop_mark()

    def _top_op(self, arg: Any) -> None:
        self._top()

    def _get(self, arg: Any) -> None:
        node = self.memo.get(arg)
        if node is None:
            raise _Malformed(f"{self.name} of memo index {arg}, which was never set")
        self.stack.append(node)

    def _put(self, arg: Any) -> None:
        if not isinstance(arg, int) or arg < 0:
            raise _Malformed(f"{self.name} with the memo index {arg!r:.40}")
        if arg == 1 and self.memo_writes == 0:
            self.memo_base = 1  # Python 2's cPickle: 'PUT 1' is its first
        if arg > self.memo_writes + self.memo_base:
            numbered = " numbered from 1" if self.memo_base else ""
            raise _over_limit(f"{self.name} of memo index {arg:,} after {self.memo_writes:,} memoized values"
                              f"{numbered} (an unpickler would allocate a memo table that large)", self.pos)
        self.memo[arg] = self._top()
        self.memo_writes += 1

    def _memoize(self, arg: Any) -> None:
        self.memo[len(self.memo)] = self._top()
        self.memo_writes += 1

    def _stack_global(self, arg: Any) -> None:
        self._pop()
        self._pop()
        self.stack.append(_ATOM)

    def _call_2(self, arg: Any) -> None:  # REDUCE(callable, args), NEWOBJ(cls, args)
        stack = self.stack
        if len(stack) - 2 < (self.marks[-1] if self.marks else 0):
            raise _Malformed(f"{self.name} with nothing on the stack")
        args = stack.pop()
        func = stack.pop()
        self._charge(args.size)
        stack.append(self._new([func, args]))

    def _newobj_ex(self, arg: Any) -> None:
        kwargs, args, cls = self._pop(), self._pop(), self._pop()
        self._charge(args.size + kwargs.size)
        self.stack.append(self._new([cls, args, kwargs]))

    def _call_mark(self, arg: Any) -> None:  # INST (class in the argument), OBJ (class first)
        items = self._pop_mark()
        if self.name == "OBJ" and not items:
            raise _Malformed("OBJ without a class")
        self._charge(sum(i.size for i in items))
        self.stack.append(self._new(items))


def scan_pickle(data: bytes, *, allowed: Container[tuple[str, str]], limits: PickleLimits = DEFAULT_LIMITS) -> None:
    """Refuse ``data`` unless every global is in ``allowed`` and unpickling it stays within ``limits``.

    Raises :class:`UnsafeMetadataError` for a refusal, :class:`PetastormMetadataError` for bytes
    an unpickler would fail on; returns None when ``data`` may be unpickled.
    """
    if len(data) > limits.max_bytes:
        raise _over_limit(f"{len(data):,} bytes, more than {limits.max_bytes:,}", None)
    play = _StackPlay(limits, len(data))
    try:
        play.run(data, allowed)
    except UnsafeMetadataError:
        raise
    except _Malformed as exc:
        raise PetastormMetadataError(f"pickled Petastorm metadata is malformed: {exc} at byte {play.pos}") from None
    except Exception as exc:
        raise PetastormMetadataError(f"pickled Petastorm metadata is malformed after byte {play.pos}: "
                                     f"{str(exc)[:200]}") from exc


def _check_global(arg: Any, allowed: Container[tuple[str, str]]) -> None:
    module, _, name = str(arg).partition(" ")
    if (module, name) not in allowed:
        raise refusal(f"the global '{module[:100]}.{name[:100]}'")
