"""HDF5 dtypes <-> unihub fields and values, exactly both ways (the layouts are in ``formats/hdf5/format.py``).

Every value unihub ingests from HDF5 is a *leaf*: a dataset of a plain dtype, one member of a
compound dataset (``tracks.x``, nested ``tracks.pos.x``; array members add their dims), or an
attribute. The leaf's dtype (as h5py reads it) gives its field and its conversions:

=========================  ======================================  =======================================
HDF5 leaf                  unihub field                            back to HDF5 (:func:`to_h5`)
=========================  ======================================  =======================================
numbers, booleans          that type (native byte order)           the recorded dtype, byte order included
enum (``enum_dtype``)      its integer base type                   the same enum (mapping recorded)
complex64 / complex128     float32 / float64, a trailing ``2`` dim  complex again (real, imaginary)
fixed strings ``S<n>``     str when UTF-8, else bytes; trailing    padded with NULs to ``n`` bytes, so
                           NULs dropped (as numpy reads them)      the file's bytes come back exactly
variable-length strings    str when UTF-8, else bytes              the same encoding
opaque ``V<n>``            bytes (exactly ``n``)                   ``V<n>``
vlen numbers               a ``(None,)`` tensor                    vlen of the same base type
=========================  ======================================  =======================================

Anything else (object references, vlen of strings or compounds, float128, datetimes) is refused by
:func:`refusal`, never guessed. Dtypes are recorded as JSON (:func:`dtype_to_json`) so that an export
rebuilds them: enum mappings, compound member names, offsets and item size, string lengths and
encodings. :func:`native` is the exact form ``unihub verify`` compares (see ``hdf5_verify.py``).
"""

from __future__ import annotations

import base64
import decimal
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from unihub.dependencies import require
from unihub.errors import SchemaError
from unihub.schema.codecs import CompressedImageCodec, ScalarCodec, TensorCodec
from unihub.schema.dtypes import cast_exactly
from unihub.schema.unischema import UnischemaField

Member = tuple[str, ...]


def h5py_module() -> Any:
    return require("h5py", extra="hdf5", purpose="HDF5 files")


# -- dtypes as JSON ------------------------------------------------------------------------------
def dtype_to_json(dt: np.dtype) -> Any:
    """A JSON form of an h5py dtype that :func:`dtype_from_json` turns back into the same HDF5 type."""
    h5py = h5py_module()
    if dt.names is not None:
        return {"compound": [[name, dtype_to_json(_member(dt, name)[0]), _member(dt, name)[1]] for name in dt.names],
                "itemsize": dt.itemsize}
    if dt.subdtype is not None:
        base, shape = dt.subdtype
        return {"array": dtype_to_json(base), "shape": list(shape)}
    string = h5py.check_string_dtype(dt)
    if string is not None:
        return {"string": string.length, "encoding": string.encoding}
    vlen = h5py.check_vlen_dtype(dt)
    if vlen is not None:
        return {"vlen": dtype_to_json(np.dtype(vlen))}
    enum = h5py.check_enum_dtype(dt)
    if enum is not None:
        return {"enum": {name: int(value) for name, value in enum.items()}, "base": dt.str}
    if dt.kind == "O":
        raise SchemaError(f"dtype {dt} (object references) has no JSON form")
    return dt.str


def dtype_from_json(data: Any) -> np.dtype:
    """Inverse of :func:`dtype_to_json`."""
    h5py = h5py_module()
    if isinstance(data, str):
        return np.dtype(data)
    if "compound" in data:
        names, formats, offsets = zip(*data["compound"]) if data["compound"] else ((), (), ())
        return np.dtype({"names": list(names), "formats": [dtype_from_json(f) for f in formats],
                         "offsets": list(offsets), "itemsize": data["itemsize"]})
    if "array" in data:
        return np.dtype((dtype_from_json(data["array"]), tuple(data["shape"])))
    if "string" in data:
        return h5py.string_dtype(data["encoding"], data["string"])
    if "vlen" in data:
        return h5py.vlen_dtype(dtype_from_json(data["vlen"]))
    if "enum" in data:
        return h5py.enum_dtype(data["enum"], basetype=np.dtype(data["base"]))
    raise SchemaError(f"unknown HDF5 dtype record {data!r}")


# -- leaves --------------------------------------------------------------------------------------
def leaves_of(dt: np.dtype, prefix: Member = ()) -> list[tuple[Member, np.dtype, tuple[int, ...]]]:
    """The leaves of a dtype: ``(member path, leaf dtype, dims an array member adds)``; ``[((), dt, ())]``
    for a plain dtype. Nested compounds give longer paths, in the compound's member order."""
    if dt.names is not None:
        return [leaf for name in dt.names for leaf in leaves_of(_member(dt, name)[0], (*prefix, name))]
    if dt.subdtype is not None:
        base, shape = dt.subdtype
        return [(path, leaf, (*shape, *dims)) for path, leaf, dims in leaves_of(base, prefix)]
    return [(prefix, dt, ())]


def member_dtype(dt: np.dtype, member: Member) -> np.dtype:
    """The leaf dtype of ``member`` in ``dt`` (array members: their base dtype)."""
    for name in member:
        while dt.subdtype is not None:
            dt = dt.subdtype[0]
        dt = _member(dt, name)[0]
    return dt.subdtype[0] if dt.subdtype is not None else dt


def _member(dt: np.dtype, name: str) -> tuple[np.dtype, int]:
    """``(dtype, byte offset)`` of the member ``name`` of the compound ``dt`` (member paths come
    from :func:`leaves_of`, so ``dt`` is a compound)."""
    fields = dt.fields
    assert fields is not None, f"{dt} has no member {name!r}: not a compound dtype"
    member, offset = fields[name][:2]
    return member, offset


def extract(values: np.ndarray, member: Member) -> np.ndarray:
    """``values[m0][m1]...``: one member's values, array members' dims appended."""
    for name in member:
        values = values[name]
    return values


def kind(dt: np.dtype) -> str:
    """``number``, ``enum``, ``complex``, ``string``, ``opaque``, ``vlen`` or ``other``."""
    h5py = h5py_module()
    if h5py.check_string_dtype(dt) is not None:
        return "string"
    if h5py.check_vlen_dtype(dt) is not None:
        return "vlen"
    if h5py.check_enum_dtype(dt) is not None:
        return "enum"
    if dt.kind in "biu" or (dt.kind == "f" and dt.itemsize <= 8):
        return "number"
    if dt.kind == "c" and dt.itemsize <= 16:
        return "complex"
    if dt.kind == "V" and dt.names is None and dt.subdtype is None:
        return "opaque"
    return "other"


def refusal(dt: np.dtype, cell_ndim: int) -> str | None:
    """Why a leaf of dtype ``dt`` (cells of ``cell_ndim`` dims) cannot be stored exactly, or None."""
    h5py = h5py_module()
    leaf_kind = kind(dt)
    if leaf_kind == "vlen":
        base = np.dtype(h5py.check_vlen_dtype(dt))
        if kind(base) != "number":
            return f"variable-length sequences of {base} (only of numbers are stored)"
        if not base.isnative:
            return (f"variable-length sequences of {base} (of another byte order than this machine's: h5py reads "
                    "their bytes unswapped, so 1.0 would be stored as 4.6e-41)")
        if cell_ndim:
            return "variable-length sequences in an array cell (a ragged array of ragged arrays)"
    if leaf_kind == "opaque" and cell_ndim:
        return f"opaque {dt} values in an array cell"
    if leaf_kind == "other":
        if h5py.check_ref_dtype(dt) is not None:
            return "object or region references"
        return f"dtype {dt} (no exact Arrow type)"
    return None


def field_for(name: str, dt: np.dtype, cell: Sequence[int | None], *, nullable: bool = False,
              text: bool = True) -> UnischemaField:
    """The Unischema field of a leaf of dtype ``dt`` whose cells have shape ``cell`` (None: varies)."""
    leaf_kind, cell = kind(dt), tuple(cell)
    if leaf_kind == "string":
        value_type = np.str_ if text else np.bytes_
        return UnischemaField(name, value_type, cell, None if cell else ScalarCodec(value_type), nullable)
    if leaf_kind == "opaque":
        return UnischemaField(name, np.bytes_, (), ScalarCodec(np.bytes_), nullable)
    if leaf_kind == "vlen":
        base = np.dtype(h5py_module().check_vlen_dtype(dt))
        return UnischemaField(name, base.type, (*cell, None), TensorCodec(), nullable)
    if leaf_kind == "complex":
        return UnischemaField(name, _pair_dtype(dt).type, (*cell, 2), TensorCodec(), nullable)
    scalar_type = np.dtype(dt.str).type
    return UnischemaField(name, scalar_type, cell, TensorCodec() if cell else ScalarCodec(scalar_type), nullable)


def _pair_dtype(dt: np.dtype) -> np.dtype:
    """complex64 -> float32, in ``dt``'s byte order."""
    return np.dtype(f"{dt.byteorder if dt.byteorder in '<>' else '='}f{dt.itemsize // 2}")


def is_text(values: np.ndarray) -> bool:
    """True when every string in ``values`` (bytes or numpy ``S``) decodes as UTF-8."""
    for value in values.ravel():
        try:
            bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return False
    return True


# -- values: HDF5 -> unihub ------------------------------------------------------------------------
def to_unihub(values: np.ndarray, dt: np.dtype, field: UnischemaField) -> Any:
    """Rows ``values`` (``(n, *cell)``, as h5py read them) of a leaf of dtype ``dt`` -> the column of ``field``."""
    leaf_kind = kind(dt)
    wants_bytes = field.numpy_dtype is np.bytes_ or isinstance(field.codec, CompressedImageCodec)
    if leaf_kind == "string":
        decode = np.frompyfunc(_string_decoder(field), 1, 1)
        if values.ndim > 1:  # one (k, ...) object array per row
            return object_array([np.asarray(decode(row), dtype=object) for row in values])
        return np.asarray(decode(values), dtype=object)
    if leaf_kind == "opaque":
        return object_array([bytes(v.tobytes()) for v in values])
    if leaf_kind == "vlen" or (wants_bytes and values.dtype != object):
        if wants_bytes:  # unihub's own export: bytes and encoded images as uint8 rows
            return object_array([np.ascontiguousarray(v).tobytes() for v in values])
        return object_array([cast_exactly(np.asarray(v), field.dtype) for v in values])
    if leaf_kind == "complex":
        values = np.ascontiguousarray(values).view(_pair_dtype(dt)).reshape(*values.shape, 2)
    if values.dtype != field.dtype or values.dtype.metadata:
        values = cast_exactly(values, field.dtype)  # a given schema's narrower dtype: refused, never wrapped
    if not field.is_fixed_shape and values.ndim > 1:  # fixed rows of a field whose shape varies elsewhere
        return object_array(list(values))
    return values


def _string_decoder(field: UnischemaField) -> Any:
    if field.numpy_dtype is np.str_:
        return lambda v: bytes(v).decode("utf-8")
    if field.numpy_dtype is decimal.Decimal:  # unihub exports decimals as their exact text
        return lambda v: decimal.Decimal(bytes(v).decode("ascii"))
    return bytes


def object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array of ``values`` (``out[:] = values`` would broadcast equal-shaped arrays)."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


# -- values: unihub -> HDF5 ------------------------------------------------------------------------
def to_h5(values: Any, dt: np.dtype, where: str) -> np.ndarray:
    """A column of unihub values (no None) -> ``(n, *cell)`` rows of the leaf dtype ``dt``, bit for bit
    what the source held. ``where`` names the field in errors (a value that does not fit)."""
    leaf_kind = kind(dt)
    if leaf_kind == "string":
        return _strings_to_h5(values, dt, where)
    if leaf_kind == "opaque":
        blobs = [bytes(v) for v in values]
        wrong = [i for i, b in enumerate(blobs) if len(b) != dt.itemsize]
        if wrong:
            raise SchemaError(f"{where}, row {wrong[0]}: {len(blobs[wrong[0]])} bytes do not fit opaque {dt}")
        return np.frombuffer(b"".join(blobs), dtype=dt).copy() if blobs else np.empty(0, dt)
    if leaf_kind == "vlen":
        base = np.dtype(h5py_module().check_vlen_dtype(dt))
        out = np.empty(len(values), dtype=dt)
        for i, value in enumerate(values):
            out[i] = np.asarray(value).astype(base, copy=False).ravel()
        return out
    if leaf_kind == "complex":
        pairs = stack(values, _pair_dtype(dt), where)
        if pairs.shape[-1:] != (2,):
            raise SchemaError(f"{where}: complex values are stored as (..., 2) float pairs, got shape {pairs.shape[1:]}")
        return np.ascontiguousarray(pairs).view(dt).reshape(pairs.shape[:-1])
    return stack(values, dt, where)


def stack(values: Any, dt: np.dtype, where: str) -> np.ndarray:
    """Rows of equal shape as one ``(n, *cell)`` array of ``dt`` (refusing rows of another shape)."""
    if isinstance(values, np.ndarray) and values.dtype != object:
        return values.astype(dt, copy=False)
    arrays = [np.asarray(v) for v in values]
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise SchemaError(f"{where}: rows of shapes {sorted(shapes)[:3]} cannot share one HDF5 dataset")
    out = np.empty((len(arrays), *(shapes.pop() if shapes else ())), dtype=dt)
    for i, array in enumerate(arrays):
        out[i] = array
    return out


def _strings_to_h5(values: Any, dt: np.dtype, where: str) -> np.ndarray:
    info = h5py_module().check_string_dtype(dt)
    cells = [np.asarray(v, dtype=object) if isinstance(v, (list, tuple, np.ndarray)) else v for v in values]
    shapes = {np.shape(c) for c in cells}
    if len(shapes) > 1:
        raise SchemaError(f"{where}: rows of shapes {sorted(shapes)[:3]} cannot share one HDF5 dataset")
    out = np.empty((len(cells), *(shapes.pop() if shapes else ())), dtype=object)
    for i, cell in enumerate(cells):
        out[i] = np.frompyfunc(_encode_text, 1, 1)(cell) if isinstance(cell, np.ndarray) else _encode_text(cell)
    if info.length is None:
        return out.astype(dt) if out.size else np.empty(out.shape, dt)
    too_long = [b for b in out.ravel() if len(b) > info.length]
    if too_long:
        raise SchemaError(f"{where}: a {len(too_long[0])}-byte value does not fit the fixed-length strings "
                          f"of {info.length} bytes it came from ({too_long[0][:24]!r})")
    return np.array(out.tolist(), dtype=dt).reshape(out.shape) if out.size else np.empty(out.shape, dt)


def _encode_text(value: Any) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else str(value).encode("ascii") \
        if isinstance(value, decimal.Decimal) else bytes(value)


# -- the exact form verify compares ----------------------------------------------------------------
def native(cell: np.ndarray, dt: np.dtype) -> Any:
    """One cell of a leaf of dtype ``dt`` as h5py reads it, kept exact: numbers as numpy scalars (arrays
    for array cells), variable-length strings as ``bytes``, fixed strings and opaque values as arrays
    of their dtype (numpy's ``S`` scalars drop trailing NULs), vlen sequences as arrays, and enums as
    ``{"value": ..., "enum": mapping}`` so that a lost mapping shows."""
    h5py = h5py_module()
    enum = h5py.check_enum_dtype(dt)
    if enum is not None:
        return {"value": native(np.asarray(cell).astype(np.dtype(dt.str)), np.dtype(dt.str)),
                "enum": {name: int(value) for name, value in sorted(enum.items())}}
    if dt.kind == "O":
        items = [_native_object(v) for v in np.asarray(cell).ravel()]
        return items[0] if np.ndim(cell) == 0 else object_array(items).reshape(np.shape(cell))
    if dt.kind in "SV" or np.ndim(cell):
        return np.array(cell, order="C")  # a copy that keeps 0-d cells 0-d (ascontiguousarray would not)
    return np.asarray(cell)[()]


def _native_object(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value)
    return np.asarray(value)


def string_padding(type_id: Any) -> str | None:
    """How an HDF5 fixed-length string type pads its values, where it is not h5py's (null padding, which
    numpy's ``S`` dtype has): ``nullterm`` or ``spacepad``; None for every other type. The values read
    the same (HDF5 converts the padding), the file's type and bytes do not."""
    h5t = h5py_module().h5t
    if type_id.get_class() != h5t.STRING or type_id.is_variable_str():
        return None
    return {h5t.STR_NULLTERM: "nullterm", h5t.STR_SPACEPAD: "spacepad"}.get(type_id.get_strpad())


def unconverted(type_id: Any) -> Any | None:
    """The memory type that writes values into a type holding a NUL-terminated fixed string (itself, or a
    member of a compound of fixed-size members) byte for byte: ``type_id``, its space-padded members
    NUL-padded (HDF5 pads those with spaces, as it should); None for every other type. HDF5 converting
    numpy's NUL-padded strings to a NUL-terminated type cuts a value that fills all ``n`` bytes to
    ``n - 1`` (``b'abcdef'`` in 6 bytes comes back ``b'abcde'``), where the source held, and h5py read, all of it."""
    if type_id.get_class() == h5py_module().h5t.COMPOUND and type_id.dtype.hasobject:
        return None  # variable-length members: written through h5py's conversion
    return _despaced(type_id) if _holds_nullterm(type_notes(type_id)) else None


def _holds_nullterm(notes: Mapping[str, Any]) -> bool:
    """Whether :func:`type_notes` name a NUL-terminated fixed string: the type's own, or a member's."""
    return notes.get("strpad") == "nullterm" or any(map(_holds_nullterm, (notes.get("members") or {}).values()))


def _despaced(type_id: Any) -> Any:
    """``type_id`` with its space-padded strings (members, array elements) NUL-padded, as numpy's are."""
    h5t = h5py_module().h5t
    if type_id.get_class() == h5t.ARRAY:
        return _elementwise(type_id, _despaced)
    if type_id.get_class() == h5t.COMPOUND:
        return _members_changed(type_id, lambda _, member: _despaced(member))
    if string_padding(type_id) != "spacepad":
        return type_id
    type_id = type_id.copy()
    type_id.set_strpad(h5t.STR_NULLPAD)
    return type_id


def _elementwise(type_id: Any, change: Callable[[Any], Any]) -> Any:
    """``change`` of an array type's elements, the array made again around them (of any other type: of itself)."""
    h5t = h5py_module().h5t
    if type_id.get_class() == h5t.ARRAY:
        return h5t.array_create(_elementwise(type_id.get_super(), change), type_id.get_array_dims())
    return change(type_id)


def _members_changed(type_id: Any, change: Callable[[str, Any], Any]) -> Any:
    """A copy of the compound type ``type_id`` (same size, names and offsets), each member's type
    ``change(name, type)``."""
    h5t = h5py_module().h5t
    out = h5t.create(h5t.COMPOUND, type_id.get_size())
    for i in range(type_id.get_nmembers()):
        name = type_id.get_member_name(i)
        out.insert(name, type_id.get_member_offset(i), change(name.decode("utf-8"), type_id.get_member_type(i)))
    return out


def type_notes(type_id: Any) -> dict[str, Any]:
    """What an HDF5 type holds that its numpy dtype does not show, as a record's keys: a fixed string's
    padding (``strpad``: :func:`string_padding`), a bitfield (``bitfield``: h5py reads one as an
    unsigned integer of its size, and would write that back as an integer), and those of a compound's
    members (``members``: name -> notes; an array member's are its elements')."""
    h5t = h5py_module().h5t
    notes: dict[str, Any] = {}
    padding = string_padding(type_id)
    if padding is not None:
        notes["strpad"] = padding
    if type_id.get_class() == h5t.BITFIELD:
        notes["bitfield"] = True
    if type_id.get_class() == h5t.COMPOUND:
        members = {type_id.get_member_name(i).decode("utf-8"): type_notes(_element(type_id.get_member_type(i)))
                   for i in range(type_id.get_nmembers())}
        if any(members.values()):
            notes["members"] = {name: member for name, member in members.items() if member}
    return notes


def _element(type_id: Any) -> Any:
    """The type of an array type's elements (of any other type: itself)."""
    while type_id.get_class() == h5py_module().h5t.ARRAY:
        type_id = type_id.get_super()
    return type_id


def note_text(record: Mapping[str, Any]) -> str | None:
    """The :func:`type_notes` of ``record`` as one text (``spacepad``, ``bitfield``, then the members'
    as ``members=`` and JSON), None where it has none; :func:`text_notes` reads it back."""
    notes = [str(record["strpad"])] if record.get("strpad") else []
    notes += ["bitfield"] if record.get("bitfield") else []
    if record.get("members"):
        notes.append("members=" + json.dumps(record["members"], sort_keys=True, separators=(",", ":")))
    return " ".join(notes) or None


def text_notes(text: str) -> dict[str, Any]:
    """The :func:`type_notes` a :func:`note_text` holds."""
    head, _, members = text.partition("members=")
    words = head.split()
    return {"strpad": next((w for w in words if w != "bitfield"), None), "bitfield": "bitfield" in words,
            **({"members": json.loads(members)} if members else {})}


def noted(type_id: Any, record: Mapping[str, Any]) -> Any:
    """``type_id`` as ``record``'s :func:`type_notes` say: padded (:func:`padded`), the bitfield of
    its size and byte order, or a compound whose members are as theirs say."""
    if record.get("members"):
        type_id = _noted_members(type_id, record["members"])
    type_id = padded(type_id, record.get("strpad"))
    if not record.get("bitfield"):
        return type_id
    h5t = h5py_module().h5t
    order = "BE" if type_id.get_order() == h5t.ORDER_BE else "LE"
    return getattr(h5t, f"STD_B{8 * type_id.get_size()}{order}").copy()


def _noted_members(type_id: Any, members: Mapping[str, Any]) -> Any:
    """A copy of the compound type ``type_id`` with each member in ``members`` :func:`noted` (an array member's
    elements)."""
    return _members_changed(type_id, lambda name, member: member if name not in members else
                            _elementwise(member, lambda element: noted(element, members[name])))


def padded(type_id: Any, padding: str | None) -> Any:
    """``type_id``, or a copy padding as :func:`string_padding` named it."""
    if padding is None:
        return type_id
    h5t = h5py_module().h5t
    type_id = type_id.copy()
    type_id.set_strpad({"nullterm": h5t.STR_NULLTERM, "spacepad": h5t.STR_SPACEPAD}[padding])
    return type_id


# -- constants: datasets that are not rows, kept exactly in the metadata ---------------------------
def encode_constant(value: np.ndarray | None, dt: np.dtype) -> dict[str, Any]:
    """A dataset's whole value as JSON (dtype, shape, base64 bytes); None: an empty dataspace."""
    record: dict[str, Any] = {"dtype": dtype_to_json(dt), "shape": None if value is None else list(value.shape)}
    if value is None:
        return record
    if dt.hasobject:
        if kind(dt) != "string":
            raise SchemaError(f"dtype {dt} holds variable-length values that are not strings")
        record["items"] = [base64.b64encode(_native_object(v)).decode("ascii") for v in value.ravel()]
    else:
        record["data"] = base64.b64encode(np.ascontiguousarray(value, dtype=dt).tobytes()).decode("ascii")
    return record


def decode_constant(record: dict[str, Any]) -> tuple[np.ndarray | None, np.dtype]:
    """Inverse of :func:`encode_constant`."""
    dt = dtype_from_json(record["dtype"])
    if record["shape"] is None:
        return None, dt
    shape = tuple(record["shape"])
    if "items" in record:
        out = np.empty(shape, dtype=dt)
        for i, item in enumerate(record["items"]):
            out.flat[i] = base64.b64decode(item)
        return out, dt
    return np.frombuffer(base64.b64decode(record["data"]), dtype=dt).reshape(shape).copy(), dt
