"""The JSON unihub keeps in Parquet key-value metadata: one description of it, and its one reader.

A dataset's footers and ``_common_metadata`` carry two JSON documents unihub writes:

- ``unihub.unischema``: the Unischema (:meth:`Unischema.to_json <unihub.formats.schema.Unischema.to_json>`);
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
from collections.abc import Mapping
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
        "cache": {"type": "object"},
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

_JSON_TYPES: dict[str, tuple[type, ...]] = {"object": (dict,), "array": (list,), "string": (str,),
                                            "boolean": (bool,), "null": (type(None),), "integer": (int,),
                                            "number": (int, float)}


class MetadataMismatch(SchemaError):
    """A JSON document that does not fit its description; ``where`` is the place in it (``$.fields[2].codec``)."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


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
    except RecursionError:
        raise SchemaError("not valid JSON for unihub: arrays and objects nested past Python's recursion limit "
                          f"(unihub reads at most {MAX_NESTING} levels)") from None
    except ValueError as exc:
        raise SchemaError(f"not valid JSON: {exc}") from None


def _check_free(value: Any, where: str) -> None:
    """A value the description leaves free (a caller's own key): any JSON nested at most :data:`MAX_NESTING`
    deep, measured without recursion."""
    level: list[tuple[Any, int]] = [(value, 1)]
    while level:
        item, depth = level.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > MAX_NESTING:
            raise MetadataMismatch(where, f"arrays and objects nested deeper than {MAX_NESTING} levels")
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
    module describes its documents in)."""
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_is_type(value, kind) for kind in kinds):
            raise MetadataMismatch(where, f"expected {' or '.join(kinds)}, got {_show(value)}")
    if "const" in schema and not _same(value, schema["const"]):
        raise MetadataMismatch(where, f"expected {json.dumps(schema['const'])}, got {_show(value)}")
    if "enum" in schema and not any(_same(value, option) for option in schema["enum"]):
        raise MetadataMismatch(where, f"expected one of {json.dumps(schema['enum'])}, got {_show(value)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise MetadataMismatch(where, f"expected at least {schema['minimum']}, got {_show(value)}")
        if "maximum" in schema and value > schema["maximum"]:
            raise MetadataMismatch(where, f"expected at most {schema['maximum']}, got {_show(value)}")
    if isinstance(value, str) and len(value) < schema.get("minLength", 0):
        raise MetadataMismatch(where, f"expected a non-empty string, got {_show(value)}")
    if isinstance(value, dict):
        _check_object(value, schema, where)
    if isinstance(value, list):
        items = schema.get("items")
        for i, item in enumerate(value):
            if items is None:
                _check_free(item, f"{where}[{i}]")
            else:
                check(item, items, f"{where}[{i}]")
    if "anyOf" in schema:
        _check_any_of(value, schema["anyOf"], where)
    for part in schema.get("allOf", ()):
        check(value, part, where)
    if "if" in schema and _fits(value, schema["if"], where):
        check(value, schema["then"], where)


def _check_object(value: dict[str, Any], schema: Mapping[str, Any], where: str) -> None:
    properties = schema.get("properties", {})
    for name in schema.get("required", ()):
        if name not in value:
            raise MetadataMismatch(where, f"lacks the key {name!r}")
    for name, item in value.items():
        described = properties.get(name)
        if described is not None:
            check(item, described, f"{where}.{name}")
        elif schema.get("additionalProperties", True) is False:
            known = ", ".join(sorted(properties))
            raise MetadataMismatch(where, f"unknown key {name!r} (known: {known})")
        else:
            _check_free(item, f"{where}.{name}")


def _check_any_of(value: Any, options: list[Mapping[str, Any]], where: str) -> None:
    """Pass when one option fits; otherwise the error of the option whose type ``value`` has (the
    deepest reason), or one listing the types expected."""
    errors = []
    for option in options:
        try:
            check(value, option, where)
            return
        except MetadataMismatch as exc:
            errors.append((option, exc))
    typed = [exc for option, exc in errors if "type" in option and _fits(value, {"type": option["type"]}, where)]
    if typed:
        raise typed[0]
    kinds = [str(option.get("type", "?")) for option in options]
    raise MetadataMismatch(where, f"expected {' or '.join(kinds)}, got {_show(value)}")


def _fits(value: Any, schema: Mapping[str, Any], where: str) -> bool:
    try:
        check(value, schema, where)
    except MetadataMismatch:
        return False
    return True


def _is_type(value: Any, kind: str) -> bool:
    if isinstance(value, bool) and kind in ("integer", "number"):
        return False
    if kind == "number" and isinstance(value, float) and not math.isfinite(value):
        return False
    return isinstance(value, _JSON_TYPES[kind])


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
