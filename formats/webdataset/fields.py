"""WebDataset members <-> field values, exactly or not at all.

- the kind an extension says (its last dot-component): ``png``/``jpg``/``jpeg`` images, ``npy``
  arrays, ``cls``/``idx``/... integers written as text, ``txt`` text, ``json`` JSON text, else bytes;
- :class:`FieldStats`: what one extension's members hold, for schema inference. A field is
  given a type only when every member converts to it without loss: ``.npy`` arrays of one dtype
  and rank (different dtypes or ranks are an error naming both members), integer text that
  fits int64, decimal text whose float64 prints back as the same number, UTF-8 text; anything
  else stays bytes;
- :func:`decoder`: a member's bytes as a value of a field (no dtype conversion but byte order;
  text numbers only where they fit the field exactly);
- :func:`member_encoder`: a value as ``(member extension, bytes)``, the extension saying the
  encoding (an image's by its bytes: ``.png`` or ``.jpg``): the canonical member of a value, which
  :mod:`.webdataset_spelling` keeps the source's other spellings of (``007``, a big-endian ``.npy``).
"""

from __future__ import annotations

import decimal
import functools
import io
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from unihub.errors import CodecError, FormatError, SchemaError
from unihub.images import decoders as images
from unihub.schema import image_checks
from unihub.schema.codecs import CompressedImageCodec, ScalarCodec, TensorCodec
from unihub.schema.image_checks import ValidateImages
from unihub.schema.npy import load_npy, parse_header
from unihub.schema.shapes import shape_matches
from unihub.schema.unischema import UnischemaField

IMAGE_EXTENSIONS = {"png": "png", "jpg": "jpeg", "jpeg": "jpeg"}
INT_EXTENSIONS = frozenset({"cls", "cls2", "class", "count", "index", "inx", "id", "idx"})
TEXT_EXTENSIONS = frozenset({"txt", "text", "transcript"})
JSON_EXTENSIONS = frozenset({"json", "jsn"})
NPY_EXTENSIONS = frozenset({"npy"})
_NPY_MAGIC = b"\x93NUMPY"
_INT64 = (-2**63, 2**63 - 1)
#: (shard, offset of the sample, key): where a value was first seen, for messages
Where = tuple[str, int, str]


def last_component(extension: str) -> str:
    return extension.rsplit(".", 1)[-1].lower()


#: extensions that name one kind of member: a field reads both (``b.jpeg`` beside ``a.jpg``: one ``jpg`` field,
#: the member's own extension kept as its spelling)
ALIASES = {"jpeg": "jpg"}


def field_extension(extension: str) -> str:
    """The extension of the field a member of (lower-case) ``extension`` belongs to where both spellings
    occur: ``seg.jpeg`` -> ``seg.jpg``; any other extension is its own."""
    head, dot, last = extension.rpartition(".")
    alias = ALIASES.get(last)
    return extension if alias is None else f"{head}{dot}{alias}"


def same_member_kind(spelled: str, extension: str) -> bool:
    """True when member extension ``spelled`` may stand for ``extension`` (case apart, or an alias)."""
    return field_extension(spelled.lower()) == field_extension(extension.lower())


def kind_of(extension: str) -> str:
    """'image', 'npy', 'int', 'text', 'json' or 'bytes', from the last dot-component."""
    last = last_component(extension)
    if last in IMAGE_EXTENSIONS:
        return "image"
    if last in NPY_EXTENSIONS:
        return "npy"
    if last in INT_EXTENSIONS:
        return "int"
    if last in TEXT_EXTENSIONS:
        return "text"
    return "json" if last in JSON_EXTENSIONS else "bytes"


def native_order(dtype: np.dtype) -> np.dtype:
    """``dtype`` in this machine's byte order (``>f4`` -> ``float32``): the same values."""
    return dtype.newbyteorder("=") if dtype.byteorder not in "=|" else dtype


# ------------------------------------------------------------------------- inference
class FieldStats:
    """What one extension's members hold, accumulated member by member (nothing kept)."""

    def __init__(self, extension: str) -> None:
        self.extension = extension
        self.kind = kind_of(extension)
        self.count = 0
        self.shapes: set[tuple[int, ...]] = set()
        self.dtypes: dict[np.dtype, Where] = {}  # first member of each dtype
        self.ranks: dict[int, Where] = {}  # first member of each rank
        self.depths: dict[int, Where] = {}  # first image of each bit depth (8, or 16: a 16-bit PNG)
        self.all_int = self.all_float = self.all_utf8 = True
        #: every member is what the field's export writes for its value (else rows keep their spelling):
        #: the extension in lower case, integer or float text as printed back, np.save's own .npy header
        self.respelled = False
        self.plain_int_text = self.plain_float_text = self.plain_npy = True
        #: a sample holds a member of this extension and one of its alias (``a.jpg`` and ``a.jpeg``): two fields
        self.beside_alias = False

    def add(self, data: bytes, url: str, offset: int, key: str, *, respelled: bool = False) -> None:
        self.count += 1
        self.respelled = self.respelled or respelled
        if self.kind == "image":
            size = images.image_size(data)
            if size is None:
                return  # corrupt: read_batches reports it; all corrupt makes a bytes field
            height, width, channels = size
            self.shapes.add((height, width) if channels == 1 else (height, width, channels))
            depth = bit_depth(data)
            if depth not in self.depths:
                self.depths[depth] = (url, offset, key)
        elif self.kind == "npy":
            try:
                dtype, shape, _, end = parse_header(data)
            except CodecError:
                return
            dtype = native_order(dtype)
            self.plain_npy = self.plain_npy and bytes(data[:end]) == npy_header(dtype, shape)
            if dtype not in self.dtypes:
                self.dtypes[dtype] = (url, offset, key)
            if len(shape) not in self.ranks:
                self.ranks[len(shape)] = (url, offset, key)
            self.shapes.add(shape)
        elif self.kind == "int" and (self.all_int or self.all_float):
            self._add_number(data)
        elif self.kind in ("int", "text", "json") and self.all_utf8:
            self._add_text(data)

    def _add_number(self, data: bytes) -> None:
        try:
            value = int(data)  # ASCII digits only: UTF-8 too
        except ValueError:
            self.all_int = False
            if self._add_text(data):
                number = exact_float(data.decode("utf-8"), np.float64)
                self.all_float = self.all_float and number is not None
                self.plain_float_text = self.all_float and self.plain_float_text and \
                    float_text(number).encode("ascii") == data
            return
        self.plain_int_text = self.plain_int_text and str(value).encode("ascii") == data
        self.plain_float_text = False  # a float64 field writes '2.0'
        # integer text is compared as the number it spells ('003' is 3), but '-0' is a number an int
        # cannot hold: such a field is float64 (which keeps -0.0 and writes it back as '-0')
        self.all_int = self.all_int and _INT64[0] <= value <= _INT64[1] and not (value == 0 and b"-" in data)
        self.all_float = self.all_float and (abs(value) <= 2**53 or exact_float(str(value), np.float64) is not None)

    def _add_text(self, data: bytes) -> bool:
        """False (and no typed field) when ``data`` is not UTF-8."""
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            self.all_utf8 = self.all_int = self.all_float = False
            return False
        return True

    def merge(self, other: FieldStats) -> None:
        """Add what ``other`` saw (the scans of two sets of shards, as if one)."""
        self.count += other.count
        self.shapes |= other.shapes
        _merge_first(self.dtypes, other.dtypes)
        _merge_first(self.ranks, other.ranks)
        _merge_first(self.depths, other.depths)
        self.all_int = self.all_int and other.all_int
        self.all_float = self.all_float and other.all_float
        self.all_utf8 = self.all_utf8 and other.all_utf8
        self.respelled = self.respelled or other.respelled
        self.beside_alias = self.beside_alias or other.beside_alias
        self.plain_int_text = self.plain_int_text and other.plain_int_text
        self.plain_float_text = self.plain_float_text and other.plain_float_text
        self.plain_npy = self.plain_npy and other.plain_npy

    def spelled(self, f: UnischemaField) -> bool:
        """True when some member of field ``f`` (made by :meth:`field`) is not what its export writes
        back for the value: the rows must keep the spelling (:mod:`.webdataset_spelling`)."""
        if self.respelled:
            return True
        if isinstance(f.codec, TensorCodec) or (self.kind == "npy" and f.numpy_dtype is not np.bytes_):
            return not self.plain_npy
        if f.numpy_dtype is np.int64:
            return not self.plain_int_text
        if f.numpy_dtype is np.float64:
            return not self.plain_float_text
        return False

    def field(self, nullable: bool) -> UnischemaField:
        name = self.extension
        if self.kind == "image" and self.shapes:
            self._refuse_mixed(self.depths, "bit depths", "images")
            codec = CompressedImageCodec(IMAGE_EXTENSIONS[last_component(name)])
            dtype = np.uint16 if 16 in self.depths else np.uint8
            return UnischemaField(name, dtype, merge_shapes(self.shapes, pad=True), codec, nullable)
        if self.kind == "npy" and self.dtypes and all(d.kind in "biuf" for d in self.dtypes):
            self._refuse_mixed(self.dtypes, "dtypes", ".npy members")
            self._refuse_mixed(self.ranks, "ranks", ".npy members")
            npy_dtype = next(iter(self.dtypes))
            return UnischemaField(name, npy_dtype.type, merge_shapes(self.shapes, pad=False), TensorCodec(), nullable)
        if self.kind == "int" and self.all_int:
            return UnischemaField(name, np.int64, (), ScalarCodec(pa.int64()), nullable)
        if self.kind == "int" and self.all_float:
            return UnischemaField(name, np.float64, (), ScalarCodec(pa.float64()), nullable)
        if self.kind in ("int", "text", "json") and self.all_utf8:
            return UnischemaField(name, np.str_, (), ScalarCodec(pa.string()), nullable)
        return UnischemaField(name, np.bytes_, (), ScalarCodec(pa.binary()), nullable)

    def _refuse_mixed(self, seen: dict[Any, Where], what: str, members: str) -> None:
        """Members of one extension that no one field holds exactly: an error naming two of them."""
        if len(seen) < 2:
            return
        (a, (url_a, _, key_a)), (b, (url_b, offset_b, key_b)) = sorted(seen.items(), key=lambda item: item[1])[:2]
        shows: dict[str, Callable[[Any], str]] = {
            "dtypes": str, "ranks": lambda rank: f"rank {rank}", "bit depths": lambda bits: f"{bits}-bit"}
        show = shows[what]
        raise FormatError(f"field {self.extension!r}: {members} of different {what}: {show(a)} in {url_a} key "
                          f"{key_a!r}, {show(b)} in {url_b} key {key_b!r}; one field would change them. Pass a "
                          "schema (--schema) that stores this field as bytes to keep each member as it is",
                          path=url_b, offset=offset_b)


_K = TypeVar("_K")


def _merge_first(mine: dict[_K, Where], theirs: dict[_K, Where]) -> None:
    """Add ``theirs`` to ``mine``, keeping the first in shard order of each value (as one scan finds it)."""
    for value, where in theirs.items():
        mine[value] = min(mine.get(value, where), where)


def bit_depth(data: bytes) -> int:
    """16 for a 16-bit PNG (it decodes to uint16), else 8 (JPEG, and PNGs of 1 to 8 bits)."""
    return 16 if data[:4] == b"\x89PNG" and len(data) > 24 and data[24] == 16 else 8


def merge_shapes(shapes: set[tuple[int, ...]], *, pad: bool) -> tuple[int | None, ...]:
    """One shape for all: sizes that differ become None; gray images join colour ones as C=1."""
    if len({len(s) for s in shapes}) > 1 and pad:
        shapes = {s if len(s) == 3 else (*s, 1) for s in shapes}
    first = next(iter(shapes))
    return tuple(d if all(s[i] == d for s in shapes) else None for i, d in enumerate(first))


def exact_float(text: str, dtype: Any) -> Any:
    """``text`` as a ``dtype`` float when that float prints back as the same number (``'2.50'``,
    ``'1e3'``, ``'nan'``), else None (``'0.1000000000000000000001'`` would lose digits)."""
    try:
        with np.errstate(over="ignore"):
            value = np.dtype(dtype).type(float(text))
    except (ValueError, OverflowError):
        return None
    if not np.isfinite(value):  # only where the text says so: '1e400' is not inf
        return value if text.strip().lower().lstrip("+-") in ("nan", "inf", "infinity") else None
    try:
        same = decimal.Decimal(str(value)) == decimal.Decimal(text.strip().replace("_", ""))
    except decimal.InvalidOperation:
        return None
    return value if same else None


# --------------------------------------------------------------------------- decoding
def decoder(f: UnischemaField, validate_images: ValidateImages = "header", *, fit: bool = True) -> Callable[[bytes], Any]:
    """How one member's bytes become a value of field ``f`` (raises ValueError/CodecError); images
    are checked as ``validate_images`` says (:mod:`unihub.schema.image_checks`), and against the
    field's shape and bit depth unless ``fit`` is False (a provisional schema's are not final)."""
    if isinstance(f.codec, CompressedImageCodec):
        depth = 16 if f.dtype == np.uint16 else 8
        return lambda data: _checked_image(f, depth, data, validate_images, fit)
    if f.numpy_dtype is np.bytes_ and f.shape == ():
        return bytes
    if f.numpy_dtype is np.str_ and f.shape == ():
        return lambda data: data.decode("utf-8")
    if f.numpy_dtype is decimal.Decimal and f.shape == ():
        return lambda data: _decimal(f, data)
    if _array_kind(f):
        dtype = f.dtype
        return _scalar_decoder(f, dtype) if f.shape == () else (lambda data: _tensor(f, dtype, data))
    raise SchemaError(f"field {f.name!r} ({f.numpy_dtype.__name__} of shape {f.shape}) has no WebDataset member "
                      "form: members hold images, .npy arrays of numbers, booleans or datetimes, numbers, text "
                      "or bytes")


def _array_kind(f: UnischemaField) -> bool:
    """Numbers, booleans, datetimes: what ``.npy`` members hold exactly (no pickle)."""
    return f.dtype.kind in "biufcmM"


def _checked_image(f: UnischemaField, depth: int, data: bytes, validate_images: ValidateImages,
                   fit: bool = True) -> bytes:
    size = images.image_size(data)
    if size is None:
        raise CodecError(f"field {f.name!r}: {len(data)} bytes are not a readable PNG or JPEG image")
    height, width, channels = size
    found = (height, width) if channels == 1 and len(f.shape) == 2 else (height, width, channels)
    if fit and not shape_matches(found, f.shape):
        raise CodecError(f"field {f.name!r}: image is {found}, the schema says {f.shape}")
    if fit and bit_depth(data) != depth:
        raise CodecError(f"field {f.name!r}: a {bit_depth(data)}-bit image, the field is {f.dtype}")
    if validate_images != "none":  # the pixel limit, the end marker, a decode ('full')
        fmt = "png" if data[:1] == b"\x89" else "jpeg"
        problem = images.pixel_limit_problem(height, width, fmt) or image_checks.body_problem(data, fmt, validate_images)
        if problem is not None:
            raise CodecError(f"field {f.name!r}: {problem}")
    return data


def _decimal(f: UnischemaField, data: bytes) -> decimal.Decimal:
    try:
        return decimal.Decimal(data.decode("utf-8"))
    except decimal.InvalidOperation as exc:
        raise CodecError(f"field {f.name!r}: {data[:40]!r} is not a decimal number") from exc


def _loaded(f: UnischemaField, dtype: np.dtype, data: bytes) -> np.ndarray:
    """A ``.npy`` member as an array of exactly ``dtype`` (a byte-order swap is the only change)."""
    array = load_npy(data)
    if array.dtype == dtype:
        return array
    found = native_order(array.dtype)
    if not (found == dtype or (dtype.kind in "mM" and found.kind == dtype.kind and
                               np.datetime_data(dtype)[0] == "generic")):
        raise CodecError(f"field {f.name!r}: the .npy holds {array.dtype}, the field is {dtype}; converting would "
                         "change values (pass a schema with the member's dtype, or one storing the field as bytes)")
    return array if found == array.dtype else array.astype(found)


def _scalar_decoder(f: UnischemaField, dtype: np.dtype) -> Callable[[bytes], Any]:
    """A scalar from a 0-d ``.npy`` member, or from text: an integer, or a float that reads back as that text."""
    cast, kind = dtype.type, dtype.kind

    def decode(data: bytes) -> Any:
        if data.startswith(_NPY_MAGIC):
            array = _loaded(f, dtype, data)
            if array.shape != ():
                raise CodecError(f"field {f.name!r}: expected a scalar, the .npy holds shape {array.shape}")
            return array[()]
        if kind in "iu":
            return cast(int(data))
        if kind == "b" and data.strip() in (b"0", b"1"):
            return cast(int(data))
        text = data.decode("utf-8")
        if kind == "f":
            value = exact_float(text, dtype)
            if value is None:
                raise CodecError(f"field {f.name!r}: {text.strip()[:40]!r} does not fit {dtype} exactly")
            return value
        raise CodecError(f"field {f.name!r}: {dtype} values come in .npy members, not as text {text[:20]!r}")

    return decode


def _tensor(f: UnischemaField, dtype: np.dtype, data: bytes) -> np.ndarray:
    array = _loaded(f, dtype, data)
    if not shape_matches(array.shape, f.shape):
        raise CodecError(f"field {f.name!r}: the .npy holds shape {array.shape}, the schema says {f.shape}")
    return array


def column(f: UnischemaField, values: list[Any]) -> Any:
    """A list of row values as a column: one numpy array when every row is present and fixed."""
    if any(v is None for v in values) or f.dtype == object or isinstance(f.codec, CompressedImageCodec):
        return values  # images stay a list of encoded bytes
    if f.shape == ():
        return np.asarray(values, dtype=f.dtype) if f.dtype.kind not in "mM" else values
    return np.stack(values) if f.is_fixed_shape and values else values


# --------------------------------------------------------------------------- encoding
#: ``value -> (member extension, bytes)``
Encode = Callable[[Any], tuple[str, bytes]]


def member_encoder(f: UnischemaField, image_extensions: str = "content") -> tuple[tuple[str, ...], Encode]:
    """The member extensions field ``f`` may write, and how a value becomes ``(extension, bytes)``.

    The extension is the field name (``/`` as ``.``) where its last component already says the
    encoding, else the name plus one that does: ``image`` -> ``image.png`` or ``image.jpg`` by
    each cell's bytes, ``boxes`` -> ``boxes.npy``, ``label`` -> ``label.cls``, ``caption`` ->
    ``caption.txt``. With ``image_extensions='name'`` a name ending in an image extension is
    kept whatever the bytes (shards ingested by extension, exported back as they were).
    """
    name = f.name.replace("/", ".")
    last = last_component(name)
    if isinstance(f.codec, CompressedImageCodec):
        return _image_encoder(f, name, last, image_extensions)
    if _array_kind(f) and last in NPY_EXTENSIONS:
        return (name,), lambda value: (name, _npy_bytes(f, value))
    if f.numpy_dtype is np.bytes_ and f.shape == ():
        return (name,), lambda value: (name, bytes(value))
    if f.numpy_dtype is np.str_ and f.shape == ():
        ext = name if last in TEXT_EXTENSIONS | JSON_EXTENSIONS | INT_EXTENSIONS else f"{name}.txt"
        return (ext,), lambda value: (ext, value.encode("utf-8"))
    if f.shape == () and f.dtype.kind in "iu":
        ext = name if last in INT_EXTENSIONS else f"{name}.cls"
        return (ext,), lambda value: (ext, str(int(value)).encode("ascii"))
    if f.shape == () and f.dtype == np.float64 and last in INT_EXTENSIONS:  # as ingest read it: text
        return (name,), lambda value: (name, float_text(value).encode("ascii"))
    if _array_kind(f):
        ext = f"{name}.npy"
        return (ext,), lambda value: (ext, _npy_bytes(f, value))
    if f.numpy_dtype is decimal.Decimal and f.shape == ():
        ext = name if last in TEXT_EXTENSIONS else f"{name}.txt"
        return (ext,), lambda value: (ext, str(value).encode("ascii"))
    raise SchemaError(f"field {f.name!r} ({f.numpy_dtype.__name__} of shape {f.shape}) has no WebDataset member "
                      "form that reads back exactly (lists of text or bytes, objects); leave it out of the export")


def float_text(value: Any) -> str:
    """A float64 as the shortest text that reads back as it, the sign of a NaN included (``-nan``)."""
    value = float(value)
    return "-nan" if value != value and np.signbit(value) else repr(value)


def _image_encoder(f: UnischemaField, name: str, last: str, mode: str) -> tuple[tuple[str, ...], Encode]:
    keep = mode == "name" and last in IMAGE_EXTENSIONS
    png = name if keep or last == "png" else f"{name}.png"
    jpg = name if keep or last in ("jpg", "jpeg") else f"{name}.jpg"

    def encode(value: Any) -> tuple[str, bytes]:
        data = f.codec.encode(f, value)  # type: ignore[union-attr]  # bytes as stored, or arrays encoded
        return (jpg if images.detect_format(data) == "jpeg" else png), data

    return tuple(dict.fromkeys((png, jpg))), encode


def _npy_bytes(f: UnischemaField, value: Any) -> bytes:
    return npy_bytes(np.asarray(value) if f.dtype.kind in "mM" else np.asarray(value, dtype=f.dtype))


@functools.lru_cache(maxsize=256)
def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The header ``np.save`` writes for a C-order array of ``dtype`` and ``shape`` (magic to padding)."""
    buffer = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue()


def npy_bytes(array: np.ndarray) -> bytes:
    """``np.save``'s bytes of ``array`` in C order: the one ``.npy`` member an export writes for a value."""
    return npy_header(array.dtype, array.shape) + np.ascontiguousarray(array).tobytes()
