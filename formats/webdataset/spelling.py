"""WebDataset members spelled exactly: what a typed field's value does not say about its member.

A field holds a member's value typed for the readers (``.cls`` as an int, ``.npy`` as a native-order,
C-order array, a ``jpg`` field for ``b.JPG``), and an export writes each value in one canonical form
(:func:`~unihub.formats.webdataset.fields.member_encoder`: ``7``, ``np.save``'s header, ``b.jpg``).
Where a source member is spelled otherwise -- ``007``, ``+3``, `` 4``, ``3\\n`` or ``2`` in a float64
field; a big-endian or Fortran-order ``.npy``, or another header padding or version; an extension in
other case, ``b.JPG``, or ``c.jpeg`` in a ``jpg`` field -- ingest records the spelling in the row's :data:`SPELLING_FIELD`, a nullable
string holding JSON ``{field: {"ext": "JPG", "text": "007", "npy": "<header>"}}`` (null where every
member is canonical, so most rows hold nothing), and the export writes the member back from the value
and its spelling, byte for byte:

- ``ext``: the member extension as spelled (it differs from the canonical one in case, or is an alias:
  ``jpeg`` in a ``jpg`` field);
- ``text``: the member's text (UTF-8), which the field's decoder reads back as the row's value;
- ``npy``: the ``.npy`` header (Latin-1 for its bytes), whose dtype and memory order the value's data
  is written in (a byte swap and a transposition: the same values).

A spelling is checked both ways: at ingest the member is rebuilt from value and spelling and must be
its bytes (else a :class:`~unihub.errors.FormatError` naming the member), and at export a spelling
must still fit its value (a changed value with a stale spelling is refused, never written wrong).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from unihub.errors import CodecError, SchemaError
from unihub.formats.webdataset.fields import (
    NPY_EXTENSIONS,
    decoder,
    last_component,
    member_encoder,
    native_order,
    npy_header,
    same_member_kind,
)
from unihub.images import decoders as images
from unihub.schema.codecs import CompressedImageCodec, ScalarCodec
from unihub.schema.metadata_json import parse_json
from unihub.schema.npy import parse_header
from unihub.schema.unischema import Unischema, UnischemaField

#: the row field that holds the spellings of its members (never a member itself)
SPELLING_FIELD = "__spelling__"
#: one field's spelling: ``{"ext": ..., "text": ..., "npy": ...}`` (any of them)
Spelling = dict[str, str]


def spelling_field() -> UnischemaField:
    """The field an ingest adds where some member needs its spelling kept (null in the rows that need none)."""
    return UnischemaField(SPELLING_FIELD, np.str_, (), ScalarCodec(pa.string()), True)


def _npy_spelled(header: bytes, value: Any) -> bytes:
    """``value`` written under ``header``: its data in the header's byte order and memory order."""
    dtype, shape, fortran, _ = parse_header(header)
    array = np.asarray(value)
    if native_order(dtype) != native_order(array.dtype) or shape != array.shape:
        raise CodecError(f"the recorded .npy header says {dtype} of shape {shape}, the value is {array.dtype} "
                         f"of shape {array.shape}")
    return header + array.astype(dtype, copy=False).tobytes(order="F" if fortran else "C")


def _same_value(a: Any, b: Any) -> bool:
    """Equal values, floats bit for bit (``-0.0`` is not ``0.0``; a NaN equals only its own bits)."""
    if isinstance(a, (float, np.floating)) or isinstance(b, (float, np.floating)):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        x, y = np.asarray(a), np.asarray(b)
        return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
    return bool(a == b)


class FieldSpeller:
    """One field's canonical member and how a spelling changes it (the export's and ingest's one rule)."""

    def __init__(self, f: UnischemaField, image_extensions: str) -> None:
        self.field = f
        self.extensions, self.encode = member_encoder(f, image_extensions)
        self.image = isinstance(f.codec, CompressedImageCodec)
        self.npy = not self.image and f.dtype.kind in "biufcmM" and \
            last_component(self.extensions[0]) in NPY_EXTENSIONS  # values the export writes with np.save
        #: the value is the member's bytes (images, bytes) or their UTF-8 text: only the name can differ
        self.verbatim = self.image or (f.shape == () and f.numpy_dtype in (np.bytes_, np.str_))
        self._decode: Callable[[bytes], Any] | None = None

    def canonical_extension(self, value: Any) -> str:
        """The extension the export gives ``value`` (an image's says its bytes' format)."""
        if not self.image:
            return self.extensions[0]
        png, jpg = self.extensions[0], self.extensions[-1]  # one, where the field's name keeps its extension
        return jpg if images.detect_format(value) == "jpeg" else png

    def member(self, value: Any, spelling: Spelling | None) -> tuple[str, bytes]:
        """``(extension, bytes)`` of the member of ``value``: the canonical one, or as ``spelling`` says."""
        if not spelling:
            return self.encode(value)
        extension = self.canonical_extension(value)
        spelled = spelling.get("ext", extension)
        if not same_member_kind(spelled, extension):
            raise CodecError(f"field {self.field.name!r}: the recorded extension {spelled!r} is not the value's "
                             f"{extension!r} (the value changed after ingest)")
        if "npy" in spelling:
            return spelled, _npy_spelled(spelling["npy"].encode("latin-1"), value)
        if "text" in spelling:
            data = spelling["text"].encode("utf-8")
            if self._decode is None:
                self._decode = decoder(self.field, "none", fit=False)
            try:
                same = _same_value(self._decode(data), value)
            except (ValueError, OverflowError, CodecError):
                same = False
            if not same:
                raise CodecError(f"field {self.field.name!r}: the recorded text {spelling['text'][:40]!r} does not "
                                 f"read back as the value {value!r} (the value changed after ingest)")
            return spelled, data
        return spelled, self.encode(value)[1]

    def spelling(self, extension: str, data: bytes, value: Any) -> Spelling | None:
        """What ``value`` needs beside it to give member ``<key>.<extension>`` of ``data`` back (None:
        nothing); CodecError where no spelling does (another extension, text that is not UTF-8)."""
        spelling: Spelling = {}
        if self.npy:
            canonical = self.extensions[0]
            array = np.asarray(value)
            header = npy_header(array.dtype, array.shape)
            if data[:len(header)] != header or len(data) != len(header) + array.nbytes:
                _, _, _, offset = parse_header(data)
                spelling["npy"] = bytes(data[:offset]).decode("latin-1")
        elif self.verbatim:
            canonical = self.canonical_extension(value)
        else:
            canonical, written = self.encode(value)
            if written != data:
                try:
                    spelling["text"] = bytes(data).decode("utf-8")
                except UnicodeDecodeError:
                    raise CodecError(f"field {self.field.name!r} would write this member as {written[:40]!r}, "
                                     "and its bytes are not text that could be kept beside the value") from None
        if extension != canonical:
            if not same_member_kind(extension, canonical):
                raise CodecError(f"field {self.field.name!r} writes its members as {canonical!r}, not {extension!r}")
            spelling["ext"] = extension
        if spelling and self.member(value, spelling) != (extension, bytes(data)):
            raise CodecError(f"field {self.field.name!r}: the value and its spelling {sorted(spelling)} do not give "
                             "the member's bytes back")
        return spelling or None


class RowSpeller:
    """Every field of a schema: rows -> members (export, verify) and members -> spellings (ingest)."""

    def __init__(self, schema: Unischema, image_extensions: str) -> None:
        self.fields = {f.name: FieldSpeller(f, image_extensions) for f in schema
                       if f.name not in ("__key__", SPELLING_FIELD)}
        self.keeps = SPELLING_FIELD in schema

    def members(self, row: Mapping[str, Any]) -> Iterator[tuple[str, str, bytes]]:
        """``(field, extension, bytes)`` of each non-null value of ``row``, spelled as recorded."""
        spellings = parse_spellings(row.get(SPELLING_FIELD))
        for name, speller in self.fields.items():
            value = row.get(name)
            if value is not None:
                extension, data = speller.member(value, spellings.get(name))
                yield name, extension, data


def parse_spellings(text: str | None) -> dict[str, Spelling]:
    if not text:
        return {}
    try:
        spellings = parse_json(text)
    except ValueError as exc:
        raise SchemaError(f"field {SPELLING_FIELD!r} holds {text[:60]!r}, which is not JSON: {exc}") from None
    if not isinstance(spellings, dict) or not all(isinstance(v, dict) and all(_spelled(k, x) for k, x in v.items())
                                                  for v in spellings.values()):
        raise SchemaError(f"field {SPELLING_FIELD!r} holds {text[:60]!r}, not an object of objects of strings "
                          "as unihub records them")
    return spellings


def _spelled(key: str, value: Any) -> bool:
    """Whether ``value`` is a string :meth:`FieldSpeller.member` can encode: ``npy`` headers are latin-1, the
    rest UTF-8 (JSON can spell a lone surrogate, which neither encodes)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("latin-1" if key == "npy" else "utf-8")
    except UnicodeEncodeError:
        return False
    return True


def spellings_text(spellings: Mapping[str, Spelling]) -> str | None:
    """The :data:`SPELLING_FIELD` value of a row (None: every member canonical)."""
    return json.dumps(spellings, sort_keys=True, separators=(",", ":")) if spellings else None

