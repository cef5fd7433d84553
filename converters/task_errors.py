"""A failed task's unihub error, carried across Spark's Python worker -> JVM -> driver boundary whole.

PySpark does not send a task's exception object back: the driver gets the Python worker's traceback
as text inside Spark's own error, so the class, message and attributes (``path``, ``offset``,
``field``, ``row``, ...) of a :class:`~unihub.errors.UnihubError` would be lost or guessed from the
text. The task therefore adds a note to its error before it leaves the worker (:func:`annotate`):
one traceback line, ``unihub-task-error: {json}``, holding the class's name, the exception's
arguments and its attributes as JSON values. The driver finds that line in Spark's text and builds
the same class with the same arguments and attributes (:func:`carried`). Nothing is unpickled: the
class must be a unihub class already imported in the driver, and values are JSON (a Unischema
travels as its JSON form).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from unihub.errors import UnihubError
from unihub.formats.base import SchemaOutgrown
from unihub.schema.unischema import Unischema

MARKER = "unihub-task-error: "
#: what may be rebuilt in the driver: unihub's errors, and a single pass's request to start over
_CARRIED = (UnihubError, SchemaOutgrown)
_SCHEMA = "__unischema__"


class CarriedError(Exception):
    """Raised in a task from its unihub error, to carry that error to the driver in Spark's text."""


def carrier(exc: BaseException) -> CarriedError | None:
    """The error to raise from ``exc`` in a task (``raise carrier from exc``); None when ``exc`` is not
    unihub's, which the driver reads from Spark's text as before."""
    if not isinstance(exc, _CARRIED):
        return None
    kind = type(exc)
    record = {"class": f"{kind.__module__}:{kind.__qualname__}", "args": [_to_json(a) for a in exc.args],
              "attributes": {k: _to_json(v) for k, v in vars(exc).items() if k != "__notes__"}}
    return CarriedError(MARKER + json.dumps(record, separators=(",", ":")))


def carried(text: str) -> BaseException | None:
    """The error a task annotated, rebuilt from Spark's text of the failure; None when there is none."""
    for line in text.splitlines():
        start = line.find(MARKER)
        if start < 0:
            continue
        try:
            record = json.loads(line[start + len(MARKER):])
            return _rebuild(record["class"], record["args"], record["attributes"])
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # not a record this version wrote: Spark's text is read as before
    return None


def _rebuild(name: str, args: list[Any], attributes: dict[str, Any]) -> BaseException | None:
    module_name, _, qualname = name.partition(":")
    module = sys.modules.get(module_name) if module_name.startswith("unihub.") else None
    kind: Any = module
    for part in qualname.split("."):
        kind = getattr(kind, part, None)
    if not (isinstance(kind, type) and issubclass(kind, _CARRIED)):
        return None
    error: BaseException = kind.__new__(kind)
    BaseException.__init__(error, *[_from_json(a) for a in args])
    for key, value in attributes.items():
        setattr(error, key, _from_json(value))
    return error


def _to_json(value: Any) -> Any:
    if isinstance(value, Unischema):
        return {_SCHEMA: value.to_json()}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    return str(value)


def _from_json(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {_SCHEMA}:
        return Unischema.from_json(value[_SCHEMA])
    return value
