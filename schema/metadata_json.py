"""The JSON unihub keeps in Parquet key-value metadata: one description of it, and its one reader.

A dataset's footers and ``_common_metadata`` carry two JSON documents unihub writes:

- ``unihub.unischema``: the Unischema (:meth:`Unischema.to_json <unihub.schema.unischema.Unischema.to_json>`);
- ``unihub.extra``: an object of provenance (``source_format``, ``skipped_count``, ...) and the
  ``extra_metadata`` a caller gave ``write_dataset``.

Their shape is described once, below, as data in the JSON Schema notation (the subset
:func:`check` implements: ``type``, ``properties``, ``required``, ``additionalProperties``, ``items``,
``minimum``, ``maximum``, ``minLength``, ``enum``, ``const``, ``anyOf``, ``allOf``, ``if``/``then``).
:func:`load_metadata_json` is the one way a dataset's metadata is read: UTF-8 strictly, JSON
within Python's recursion limit, then checked against that description, so that bytes
unihub did not write end in a :class:`~unihub.errors.SchemaError` naming the file, the key and the
place in the document, never in a ``KeyError`` or ``RecursionError`` further on. Keys a caller
chose (``extra_metadata``) may hold any JSON, nested up to :data:`MAX_NESTING` levels.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from unihub.errors import SchemaError

#: Key of the ``extra_metadata`` JSON (write_dataset's argument, a conversion's provenance).
EXTRA_METADATA_KEY = b"unihub.extra"

#: The deepest nesting of arrays and objects read from metadata. unihub's own documents nest 4 deep;
#: a caller's ``extra_metadata`` gets this much, so that printing a value (``repr``, ``json.dumps``, which
#: recurse) never runs out of stack. Python's JSON parser stops by itself at its recursion limit.
MAX_NESTING = 64

_SHAPE = {"type": "array", "items": {"type": ["integer", "null"], "minimum": 0}}

#: The configuration keys of each codec unihub registers (``{"type": name, **config}``); a codec
#: registered elsewhere is checked by its own ``from_config``.
_CODEC_CONFIGS: dict[str, dict[str, Any]] = {
    "scalar": {"arrow_type": {"type": "string", "minLength": 1}},
    "tensor": {},
    "compressed_image": {"image_codec": {"type": "string"},
                         "quality": {"type": "integer", "minimum": 0, "maximum": 100}},
    "ndarray": {},
    "compressed_ndarray": {},
}

CODEC_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type"],
    "properties": {"type": {"type": "string", "minLength": 1}},
    "allOf": [{"if": {"properties": {"type": {"const": name}}},
               "then": {"properties": {"type": {"const": name}, **config}, "additionalProperties": False,
                        "required": ["type", *config]}}
              for name, config in _CODEC_CONFIGS.items()],
}

FIELD_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name", "dtype", "shape"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "dtype": {"type": "string", "minLength": 1},
        "shape": _SHAPE,
        "codec": {"anyOf": [{"type": "null"}, CODEC_JSON_SCHEMA]},
        "nullable": {"type": "boolean"},
    },
}

#: ``unihub.unischema``. Other top-level keys are allowed: ``unihub inspect --json`` output, which adds
#: the dataset's counts beside the schema's own keys, is a ``--schema`` file.
UNISCHEMA_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["format", "version", "fields"],
    "properties": {
        "format": {"const": "unihub.unischema"},
        "version": {"type": "integer"},
        "name": {"type": "string"},
        "fields": {"type": "array", "items": FIELD_JSON_SCHEMA},
    },
}

#: the last second of the year 9999, as a Unix time: later times have no calendar date to print
_YEAR_9999 = 253402300799

_SKIPPED_RECORD = {"type": "object", "properties": {"path": {"type": "string"}, "location": {"type": "string"},
                                                     "reason": {"type": "string"}}}

#: ``unihub.extra``: the keys unihub writes have their types; any other key is the caller's own.
EXTRA_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "source_format": {"type": "string"},
        "source": {"type": "string"},
        "source_files": {"type": "integer", "minimum": 0},
        "skipped_count": {"type": "integer", "minimum": 0},
        "skipped": {"type": "array", "items": _SKIPPED_RECORD},
        "classes": {"type": "array", "items": {"type": "string"}},
        "cache": {"type": "object", "properties": {  # unihub.cacheable's record of a cache it built
            "dataset_id": {"type": "string"}, "version": {"type": "string"}, "source_type": {"type": "string"},
            "built_at": {"type": "number", "minimum": 0, "maximum": _YEAR_9999}}},
        "hdf5": {"type": "object"},
        "tfrecord": {"type": "object"},
        "webdataset": {"type": "object"},
    },
}

#: key -> the description of its JSON, for every JSON document unihub keeps in Parquet metadata
METADATA_JSON_SCHEMAS: dict[bytes, dict[str, Any]] = {
    b"unihub.unischema": UNISCHEMA_JSON_SCHEMA,
    EXTRA_METADATA_KEY: EXTRA_JSON_SCHEMA,
}

_SCALARS = {"string", "integer", "number", "boolean", "null"}
#: JSON's types as the exact Python types json.loads makes of them (no subclasses: ``True`` is no integer)
_JSON_TYPES: dict[str, tuple[type, ...]] = {"object": (dict,), "array": (list,), "string": (str,),
                                            "boolean": (bool,), "null": (type(None),), "integer": (int,),
                                            "number": (int, float)}


class MetadataMismatch(SchemaError):
    """A JSON document that does not fit its description; ``where`` is the place in it (``$.fields[2].codec``)."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


class _Mismatch(Exception):
    """Raised inside a compiled check: the problem, and the place as path segments gathered on the way out
    (innermost first), so that no path is built while a document fits."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.segments: list[str] = []

    def at(self, segment: str) -> _Mismatch:
        self.segments.append(segment)
        return self


def parse_json(raw: bytes | str) -> Any:
    """``raw`` (UTF-8 bytes or text) as JSON, or a :class:`SchemaError` saying why not: not UTF-8, or not
    JSON (nesting past Python's recursion limit included: the parser stops there, in bounded time)."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        try:
            raw = bytes(raw).decode("utf-8")  # strictly: json.loads would guess UTF-16 from a BOM-like start
        except UnicodeDecodeError as exc:
            raise SchemaError(f"not valid JSON: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    try:
        return json.loads(raw)
    except RecursionError as exc:  # Python's words first: what a reader of any JSON tool's message knows
        raise SchemaError(f"{exc} (not valid JSON for unihub: arrays and objects nested past Python's recursion "
                          f"limit; unihub reads at most {MAX_NESTING} levels)") from None
    except ValueError as exc:
        raise SchemaError(f"not valid JSON: {exc}") from None


def _check_free(value: Any) -> None:
    """A value the description leaves free (a caller's own key): any JSON nested at most :data:`MAX_NESTING`
    deep, measured without recursion."""
    if not isinstance(value, (dict, list)):
        return
    level: list[tuple[Any, int]] = [(value, 1)]
    while level:
        item, depth = level.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > MAX_NESTING:
            raise _Mismatch(f"arrays and objects nested deeper than {MAX_NESTING} levels")
        level.extend((child, depth + 1) for child in children)


def load_metadata_json(raw: bytes | str, key: bytes, *, where: str) -> Any:
    """The JSON document under metadata ``key`` (read from file ``where``), parsed and checked against
    its description in :data:`METADATA_JSON_SCHEMAS`; a :class:`SchemaError` names the file, the key and
    what is wrong."""
    name = key.decode("utf-8", "replace")
    try:
        value = parse_json(raw)
        check(value, METADATA_JSON_SCHEMAS[key])
    except SchemaError as exc:
        raise SchemaError(f"{where}: metadata key {name!r}: {exc}") from None
    return value


def check(value: Any, schema: Mapping[str, Any], where: str = "$") -> None:
    """Raise :class:`MetadataMismatch` unless ``value`` fits ``schema`` (the JSON Schema subset this
    module describes its documents in). The description is compiled once into closures, so a schema of
    100,000 fields is checked in about a microsecond a field."""
    try:
        _compiled(schema)(value)
    except _Mismatch as exc:
        raise MetadataMismatch(where + "".join(reversed(exc.segments)), exc.problem) from None


Check = Callable[[Any], None]
_COMPILED: dict[int, tuple[Mapping[str, Any], Check]] = {}


def _compiled(schema: Mapping[str, Any]) -> Check:
    """``schema`` compiled (kept by identity, with the schema itself so an id is never reused: the
    descriptions are module constants)."""
    found = _COMPILED.get(id(schema))
    if found is None or found[0] is not schema:
        found = _COMPILED[id(schema)] = (schema, _compile(schema))
    return found[1]


def _compile(schema: Mapping[str, Any]) -> Check:
    """One closure per keyword of ``schema`` that can apply to the types it allows, run in order."""
    kinds = schema.get("type")
    allowed = set([kinds] if isinstance(kinds, str) else kinds) if kinds is not None else None
    if allowed is not None and allowed <= _SCALARS and set(schema) <= {"type", "minimum", "maximum", "minLength"}:
        return _scalar_step(sorted(allowed), schema.get("minimum"), schema.get("maximum"), schema.get("minLength", 0))
    steps = [*_value_steps(schema, allowed), *_container_steps(schema, allowed), *_combined_steps(schema)]
    if len(steps) == 1:
        return steps[0]

    def run(value: Any) -> None:
        for step in steps:
            step(value)

    return _remembered(run) if _flat_object(schema) else run


def _value_steps(schema: Mapping[str, Any], allowed: set[str] | None) -> list[Check]:
    """The checks of a value itself: its type, ``const``, ``enum``, its range and its length."""
    steps: list[Check] = []
    if allowed is not None:
        steps.append(_type_step(sorted(allowed)))
    if "const" in schema:
        steps.append(_choice_step([schema["const"]], json.dumps(schema["const"])))
    if "enum" in schema:
        steps.append(_choice_step(schema["enum"], f"one of {json.dumps(schema['enum'])}"))
    if "minimum" in schema or "maximum" in schema:
        steps.append(_range_step(schema.get("minimum"), schema.get("maximum")))
    if "minLength" in schema:
        steps.append(_length_step(schema["minLength"]))
    return steps


def _container_steps(schema: Mapping[str, Any], allowed: set[str] | None) -> list[Check]:
    """The checks of an object's members or an array's items, or of any JSON within bounds where
    ``schema`` says nothing of the value's type or form."""
    steps: list[Check] = []
    described = "properties" in schema or "required" in schema or schema.get("additionalProperties") is False
    if described or (allowed is not None and "object" in allowed):
        steps.append(_object_step(schema) if described else _free_object_step)
    if "items" in schema or (allowed is not None and "array" in allowed):
        steps.append(_array_step(schema.get("items")))
    if allowed is None and not described and not {"items", "anyOf", "const", "enum"} & set(schema):
        steps.append(_check_free)  # any JSON, nested within bounds
    return steps


def _combined_steps(schema: Mapping[str, Any]) -> list[Check]:
    """The checks of ``anyOf``, ``allOf`` and ``if``/``then`` (the conditions of ``allOf`` and of ``schema`` last)."""
    steps: list[Check] = []
    if "anyOf" in schema:
        steps.append(_any_of_step(schema["anyOf"]))
    conditions = [part for part in schema.get("allOf", ()) if "if" in part] + ([schema] if "if" in schema else [])
    steps.extend(_compile(part) for part in schema.get("allOf", ()) if "if" not in part)
    if conditions:
        steps.append(_conditions_step(conditions))
    return steps


#: distinct objects a check remembers as passed (codecs: a schema of 100,000 fields has a handful)
_REMEMBERED = 256


def _remembered(check_object: Check) -> Check:
    """``check_object`` for objects of scalars (a codec's JSON), run once per distinct object: one that
    passed before, equal in keys, values and their types, passes at the cost of a set lookup."""
    passed: set[tuple[Any, ...]] = set()

    def step(value: Any) -> None:
        key: tuple[Any, ...] | None = None
        if type(value) is dict:
            try:
                key = (*value.items(), *map(type, value.values()))
                if key in passed:
                    return
            except TypeError:  # a list or object among the values: not remembered
                key = None
        check_object(value)
        if key is not None and len(passed) < _REMEMBERED:
            passed.add(key)

    return step


def _flat_object(schema: Mapping[str, Any]) -> bool:
    """Whether ``schema`` describes objects whose described values are all scalars (see :func:`_remembered`)."""
    if schema.get("type") != "object":
        return False
    parts = [schema, *(part.get("then", part) for part in schema.get("allOf", ()))]
    values = [item for part in parts for item in part.get("properties", {}).values()]
    return all("const" in item or item.get("type") in _SCALARS for item in values)


def _type_step(kinds: list[str]) -> Check:
    exact = _exact_types(kinds) or ()
    finite = "number" in kinds

    def step(value: Any) -> None:
        if type(value) in exact and (not finite or type(value) is not float or math.isfinite(value)):
            return
        raise _Mismatch(f"expected {' or '.join(kinds)}, got {_show(value)}")

    return step


def _scalar_step(kinds: list[str], minimum: float | None, maximum: float | None, shortest: int) -> Check:
    """A number, string, boolean or null and its bounds in one closure (most of a document's values)."""
    typed = _type_step(kinds)
    bounded = _range_step(minimum, maximum) if minimum is not None or maximum is not None else None
    exact = tuple(t for t in _exact_types(kinds) or () if t is not float)  # a float may be NaN: checked below

    def step(value: Any) -> None:
        kind = type(value)
        if kind in exact and bounded is None and (kind is not str or len(value) >= shortest):
            return  # the common case, decided without a further call
        typed(value)
        if bounded is not None:
            bounded(value)
        if kind is str and len(value) < shortest:
            raise _Mismatch(f"expected a non-empty string, got {_show(value)}")

    return step


def _choice_step(options: list[Any], label: str) -> Check:
    def step(value: Any) -> None:
        if not any(_same(value, option) for option in options):
            raise _Mismatch(f"expected {label}, got {_show(value)}")

    return step


def _range_step(minimum: float | None, maximum: float | None) -> Check:
    def step(value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        if minimum is not None and value < minimum:
            raise _Mismatch(f"expected at least {minimum}, got {_show(value)}")
        if maximum is not None and value > maximum:
            raise _Mismatch(f"expected at most {maximum}, got {_show(value)}")

    return step


def _length_step(shortest: int) -> Check:
    def step(value: Any) -> None:
        if isinstance(value, str) and len(value) < shortest:
            raise _Mismatch(f"expected a non-empty string, got {_show(value)}")

    return step


def _object_step(schema: Mapping[str, Any]) -> Check:
    properties = {name: _compile(item) for name, item in schema.get("properties", {}).items()}
    required = tuple(schema.get("required", ()))
    closed = schema.get("additionalProperties", True) is False
    known = ", ".join(sorted(properties))

    def step(value: Any) -> None:
        if not isinstance(value, dict):
            return
        for name in required:
            if name not in value:
                raise _Mismatch(f"lacks the key {name!r}")
        for name, item in value.items():
            described = properties.get(name)
            if described is None and closed:
                raise _Mismatch(f"unknown key {name!r} (known: {known})")
            try:
                (described or _check_free)(item)
            except _Mismatch as exc:
                raise exc.at(f".{name}") from None

    return step


def _free_object_step(value: Any) -> None:
    """An object whose keys the description leaves free (``{"type": "object"}``)."""
    if isinstance(value, dict):
        for name, item in value.items():
            try:
                _check_free(item)
            except _Mismatch as exc:
                raise exc.at(f".{name}") from None


def _array_step(items: Mapping[str, Any] | None) -> Check:
    each = _compile(items) if items is not None else _check_free

    def step(value: Any) -> None:
        if isinstance(value, list):
            for i, item in enumerate(value):
                try:
                    each(item)
                except _Mismatch as exc:
                    raise exc.at(f"[{i}]") from None

    return step


def _any_of_step(options: list[Mapping[str, Any]]) -> Check:
    """Pass when one option fits; otherwise the error of the first option whose type ``value`` has (the
    deepest reason), or one listing the types expected."""
    compiled = [(_exact_types(option.get("type")), _compile(option)) for option in options]
    names = " or ".join(str(option.get("type", "?")) for option in options)

    def step(value: Any) -> None:
        first: _Mismatch | None = None
        for exact, check_option in compiled:
            if exact is not None and type(value) not in exact:
                continue
            try:
                check_option(value)
                return
            except _Mismatch as exc:
                first = first or exc
        raise first or _Mismatch(f"expected {names}, got {_show(value)}")

    return step


def _exact_types(kinds: str | list[str] | None) -> tuple[type, ...] | None:
    """The Python types json.loads makes of JSON ``kinds`` (None: any)."""
    if kinds is None:
        return None
    names = [kinds] if isinstance(kinds, str) else kinds
    return tuple(t for kind in names for t in _JSON_TYPES[kind] if t is not bool or "boolean" in names)


def _conditions_step(parts: list[Mapping[str, Any]]) -> Check:
    """``if``/``then`` pairs. Those of the form ``{"if": {"properties": {K: {"const": V}}}, "then": ...}`` (a
    union told apart by the value of key K, as codecs by ``type``) look the ``then`` up by V."""
    by_value: dict[tuple[str, Any], Check] = {}
    general: list[tuple[Check, Check]] = []
    for part in parts:
        condition = part["if"]
        keys = list(condition.get("properties", {}))
        tag = condition["properties"][keys[0]] if len(condition) == 1 and len(keys) == 1 else {}
        if list(tag) == ["const"] and isinstance(tag["const"], str):
            by_value[(keys[0], tag["const"])] = _compile(part["then"])
        else:
            general.append((_compile(condition), _compile(part["then"])))
    tag_keys = sorted({key for key, _ in by_value})

    def step(value: Any) -> None:
        if isinstance(value, dict):
            for key in tag_keys:
                tagged = value.get(key)
                then = by_value.get((key, tagged)) if isinstance(tagged, str) else None
                if then is not None:
                    then(value)
        for condition, then in general:
            try:
                condition(value)
            except _Mismatch:
                continue
            then(value)

    return step


def _same(value: Any, expected: Any) -> bool:
    return type(value) is type(expected) and value == expected


def _show(value: Any) -> str:
    """A value for a message, short: ``-1``, ``"5"``, ``NaN``, ``[[1]]``, ``an object``."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
