"""A filter written as text (``--where`` on the command line) -> the pyarrow expression ``filters=`` takes.

Two spellings, both what ``filters=`` accepts in Python:

- pyarrow's expression syntax: ``(pc.field("label") == 3) & pc.field("split").isin(["a", "b"])``, with
  bare names for fields (``label >= 3 and split != "test"``), ``and``/``or``/``not`` as well as
  ``&``/``|``/``~``, ``in``/``not in`` a list, ``is None``/``is not None``, and the methods
  ``isin``, ``is_null``, ``is_valid``, ``is_nan``;
- pyarrow's DNF list as JSON: ``[["label", ">", 3], ["split", "in", ["a", "b"]]]``.

The text is parsed with :mod:`ast` and built node by node from an allow-list: it is never evaluated,
so a filter cannot run code. Fields are checked against the dataset's names.
"""

from __future__ import annotations

import ast
import json
import operator
import warnings
from collections.abc import Callable, Collection
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from unihub.errors import FilterExpressionError

_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge}
_METHODS = {"isin": 1, "is_null": 0, "is_valid": 0, "is_nan": 0}
_FIELD_FUNCTIONS = {"field", "pc.field", "ds.field", "pyarrow.compute.field", "pyarrow.dataset.field"}
#: Conditions one filter may hold: Arrow combines them into a chain that it walks recursively in C++, and a
#: chain of some thousands overflows the C stack (a crash, not an error). ``in [...]`` takes any number of values.
MAX_CONDITIONS = 1000


class ParsedFilter(NamedTuple):
    """A filter's expression and the fields it reads."""

    expression: pc.Expression
    fields: tuple[str, ...]


def parse_filter(text: str, names: Collection[str]) -> ParsedFilter:
    """The pyarrow expression ``text`` spells (see the module docstring) and the fields it names, of
    ``names``. Raises :class:`FilterExpressionError` saying what is wrong and where."""
    source = text.strip()
    if not source:
        raise FilterExpressionError("the filter is empty")
    if source.startswith("["):
        return _from_dnf(source, names)
    try:
        with warnings.catch_warnings():  # Python's own warnings about the text ('1if'): the error says what is wrong
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        where = f"at column {exc.offset}" if exc.offset else "at its end"  # Python's 0: the text ended too soon
        raise FilterExpressionError(f"filter {text!r} is not an expression: {exc.msg} {where}") from None
    except (RecursionError, MemoryError):  # what Python's parser raises for nesting it cannot hold
        raise _too_deep(source) from None
    except UnicodeEncodeError as exc:  # a lone surrogate: a byte of argv that is not UTF-8, as Python decodes it
        raise FilterExpressionError(f"filter {text!r} is not UTF-8 text: {exc.reason} at column "
                                    f"{exc.start + 1}") from None
    _check_count(sum(isinstance(n, (ast.Compare, ast.Call)) for n in ast.walk(tree)), source)
    builder = _Builder(text, names)
    try:
        built = builder.build(tree.body)
    except (OverflowError, UnicodeError, pa.ArrowException) as exc:  # a constant Arrow cannot hold (2**70, '\udcff')
        raise FilterExpressionError(f"filter {text!r}: {exc}") from None
    except RecursionError:
        raise _too_deep(source) from None
    if not isinstance(built, pc.Expression):
        raise FilterExpressionError(f"filter {text!r} compares nothing: it is the constant {built!r}")
    return ParsedFilter(built, tuple(builder.used))


def _from_dnf(source: str, names: Collection[str]) -> ParsedFilter:
    import pyarrow.parquet as pq

    try:
        filters = json.loads(source)
    except ValueError as exc:
        raise FilterExpressionError(f"filter {source!r} starts with '[' but is not JSON: {exc}") from None
    except RecursionError:
        raise _too_deep(source) from None
    single = bool(filters) and isinstance(filters[0], list) and bool(filters[0]) and isinstance(filters[0][0], str)
    conjunctions = [filters] if single else filters
    for conj in conjunctions:
        for term in conj if isinstance(conj, list) else [conj]:
            if not (isinstance(term, list) and len(term) == 3 and isinstance(term[0], str)):
                raise FilterExpressionError(f"filter {source!r}: each term is [field, op, value], got {term!r}")
            _check_name(term[0], names, source)
    _check_count(sum(len(conj) if isinstance(conj, list) else 1 for conj in conjunctions), source)
    try:
        expression = pq.filters_to_expression([[tuple(t) for t in conj] for conj in conjunctions])
    except (TypeError, ValueError, OverflowError, pa.ArrowException) as exc:
        raise FilterExpressionError(f"filter {source!r}: {exc}") from None
    return ParsedFilter(expression, tuple(dict.fromkeys(t[0] for conj in conjunctions for t in conj)))


def _too_deep(text: str) -> FilterExpressionError:
    return FilterExpressionError(f"filter {text[:60]!r}... is nested too deeply to parse")


def _check_count(conditions: int, text: str) -> None:
    if conditions > MAX_CONDITIONS:
        raise FilterExpressionError(
            f"filter {text[:60]!r}... holds {conditions:,} conditions, more than the {MAX_CONDITIONS:,} Arrow "
            f"evaluates safely; list many values with `field in [...]` (isin), which counts as one")


def _check_name(name: str, names: Collection[str], text: str) -> None:
    if name not in names:
        raise FilterExpressionError(f"filter {text!r} names {name!r}, which is not a field; the fields: "
                                    f"{', '.join(sorted(names))}")


class _Builder:
    """Turns allowed AST nodes into pyarrow expressions and constants; anything else is an error."""

    def __init__(self, text: str, names: Collection[str]) -> None:
        self.text, self.names = text, names
        self.used: dict[str, None] = {}  # the fields named, in order

    def fail(self, node: ast.AST, what: str) -> FilterExpressionError:
        piece = ast.get_source_segment(self.text.strip(), node) or type(node).__name__
        return FilterExpressionError(f"filter {self.text!r}: {what}: {piece}")

    def build(self, node: ast.AST) -> Any:
        handler = getattr(self, f"_{type(node).__name__}", None)
        if handler is None:
            raise self.fail(node, "not allowed in a filter (fields, constants, comparisons, and/or/not, "
                                  "in, is None, isin/is_null/is_valid/is_nan)")
        return handler(node)

    def _Constant(self, node: ast.Constant) -> Any:  # noqa: N802
        return node.value

    def _Name(self, node: ast.Name) -> Any:  # noqa: N802
        if node.id in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[node.id]
        _check_name(node.id, self.names, self.text)
        self.used[node.id] = None
        return pc.field(node.id)

    def _List(self, node: ast.List | ast.Tuple | ast.Set) -> list[Any]:  # noqa: N802
        values = [self.build(e) for e in node.elts]
        if any(isinstance(v, pc.Expression) for v in values):
            raise self.fail(node, "a list holds constants only")
        return values

    _Tuple = _Set = _List

    def _UnaryOp(self, node: ast.UnaryOp) -> Any:  # noqa: N802
        value = self.build(node.operand)
        if isinstance(node.op, (ast.Not, ast.Invert)):
            return ~self._expression(value, node.operand)
        if isinstance(node.op, ast.USub) and isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value
        raise self.fail(node, "only not/~ and a negative number are allowed")

    def _BoolOp(self, node: ast.BoolOp) -> pc.Expression:  # noqa: N802
        parts = [self._expression(self.build(v), v) for v in node.values]
        combine = operator.and_ if isinstance(node.op, ast.And) else operator.or_
        result = parts[0]
        for part in parts[1:]:
            result = combine(result, part)
        return result

    def _BinOp(self, node: ast.BinOp) -> pc.Expression:  # noqa: N802
        if not isinstance(node.op, (ast.BitAnd, ast.BitOr)):
            raise self.fail(node, "only & and | combine conditions")
        left = self._expression(self.build(node.left), node.left)
        right = self._expression(self.build(node.right), node.right)
        return left & right if isinstance(node.op, ast.BitAnd) else left | right

    def _Compare(self, node: ast.Compare) -> pc.Expression:  # noqa: N802
        result: pc.Expression | None = None
        left = self.build(node.left)
        for op, right_node in zip(node.ops, node.comparators):
            right = self.build(right_node)
            term = self._compare(node, op, left, right)
            result = term if result is None else result & term
            left = right
        assert result is not None  # an ast.Compare has at least one operator
        return result

    def _compare(self, node: ast.AST, op: ast.cmpop, left: Any, right: Any) -> pc.Expression:
        if isinstance(op, (ast.Is, ast.IsNot)):
            if right is not None or not isinstance(left, pc.Expression):
                raise self.fail(node, "'is' takes a field and None")
            return left.is_null() if isinstance(op, ast.Is) else left.is_valid()
        if isinstance(op, (ast.In, ast.NotIn)):
            if not isinstance(left, pc.Expression) or not isinstance(right, list):
                raise self.fail(node, "'in' takes a field and a list of constants")
            member = left.isin(right)
            return member if isinstance(op, ast.In) else ~member
        compare = _COMPARE[type(op)]
        if not (isinstance(left, pc.Expression) or isinstance(right, pc.Expression)):
            raise self.fail(node, "a comparison needs a field on one side")
        return compare(left if isinstance(left, pc.Expression) else pc.scalar(left), right)

    def _Call(self, node: ast.Call) -> pc.Expression:  # noqa: N802
        if node.keywords:
            raise self.fail(node, "keyword arguments are not allowed")
        name = ast.unparse(node.func)
        if name in _FIELD_FUNCTIONS:
            if len(node.args) != 1 or not isinstance(node.args[0], ast.Constant) \
                    or not isinstance(node.args[0].value, str):
                raise self.fail(node, "field() takes one field name")
            _check_name(node.args[0].value, self.names, self.text)
            self.used[node.args[0].value] = None
            return pc.field(node.args[0].value)
        if isinstance(node.func, ast.Attribute) and node.func.attr in _METHODS:
            target = self._expression(self.build(node.func.value), node.func.value)
            args = [self.build(a) for a in node.args]
            if len(args) != _METHODS[node.func.attr]:
                raise self.fail(node, f"{node.func.attr}() takes {_METHODS[node.func.attr]} argument(s)")
            return getattr(target, node.func.attr)(*args)
        raise self.fail(node, "only field(), isin(), is_null(), is_valid() and is_nan() may be called")

    def _expression(self, value: Any, node: ast.AST) -> pc.Expression:
        if not isinstance(value, pc.Expression):
            raise self.fail(node, "a condition is needed here, not a constant")
        return value
