"""What a TFDS directory declares about its records: ``features.json`` (and ``<name>.labels.txt``) as fields.

TFDS (``tensorflow_datasets``) writes each split as ``<name>-<split>.tfrecord-<i>-of-<n>`` of
``tf.train.Example`` records, with the features it encoded beside them::

    features.json       {"featuresDict": {"features": {"image": {"pythonClassName": "...Image",
                          "image": {"shape": {"dimensions": ["28", "28", "1"]}, "dtype": "uint8"}}, ...}}}
                        (TFDS before 4.6: {"type": "...FeaturesDict", "content": {"image": {"type":
                        "...Image", "content": {"shape": [28, 28, 1], "dtype": "uint8"}}, ...}})
    label.labels.txt    a ClassLabel's names, one a line (a nested one: objects-kind.labels.txt)

A nested FeaturesDict's features are named ``outer/inner`` in the records, and a Sequence of a
feature holds its values flat, one list per record. What the records alone cannot tell, TFDS says:
a ``Sequence(BBoxFeature())`` is ``(None, 4)`` float32 rather than a flat ``(None,)`` list, a
``Tensor(shape=(2, 3), dtype=uint8)`` is a uint8 ``(2, 3)`` tensor rather than six int64 values, a
``ClassLabel`` is an int64 with names. Every such field is written back as the same proto list
kind (int64, float or bytes) with the same values, so an export gives the records back.

``dataset_info.json`` says how many records each shard holds: a shard that frames fewer (a file cut
at a record's end reads cleanly) is an error, not a dataset short of them (:func:`shard_lengths`).

What unihub does not map (Audio, Video, a Sequence of a Sequence, a Tensor TFDS stores as encoded
bytes, uint64, bfloat16, ...) is left to the inference from the records, which keeps every value.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from unihub.errors import SchemaError
from unihub.schema.codecs import CompressedImageCodec, ScalarCodec, TensorCodec
from unihub.schema.unischema import Shape, UnischemaField

if TYPE_CHECKING:
    from unihub.formats.tfrecord.schema import _Stats

#: TFDS dtype names unihub keeps as declared, with the proto list kind TFDS writes them as
_KINDS = {"bool": "int64", "int8": "int64", "int16": "int64", "int32": "int64", "int64": "int64",
          "uint8": "int64", "uint16": "int64", "uint32": "int64",
          "float16": "float", "float32": "float", "float64": "float", "string": "bytes"}


_FILE_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"  # TFDS's, where dataset_info.json names none


@dataclass(frozen=True)
class Declared:
    """One ``tf.train.Example`` feature as TFDS declares it."""

    tfds_type: str  # "ClassLabel", "Image", "Tensor", "BBoxFeature", "Text", "Scalar" (in a Sequence or not)
    dtype: str  # a TFDS dtype name (a key of _KINDS)
    shape: Shape
    image_format: str | None = None  # Image: "png" or "jpeg" (None: not said)
    num_classes: int | None = None  # ClassLabel
    class_names: tuple[str, ...] | None = None  # ClassLabel, where TFDS wrote a labels.txt

    @property
    def kind(self) -> str:
        """The proto list kind TFDS writes the values as."""
        return "bytes" if self.tfds_type == "Image" else _KINDS[self.dtype]

    def field(self, name: str, inferred: UnischemaField, absent: bool) -> UnischemaField:
        """The field TFDS declares (``inferred``: from the records; ``absent``: some record lacks it),
        nullable where a record lacks it, or a single value is an empty list in some."""
        nullable = absent or (inferred.nullable and self.shape == ())
        if self.tfds_type == "Image":
            image = inferred.codec if isinstance(inferred.codec, CompressedImageCodec) else \
                CompressedImageCodec(self.image_format or "png")
            return UnischemaField(name, np.dtype(self.dtype).type, self.shape, image, nullable)
        if self.dtype == "string":  # text where every value is UTF-8, bytes where one is not (as inferred)
            text = inferred.numpy_dtype if inferred.numpy_dtype in (np.str_, np.bytes_) else np.str_
            arrow = pa.string() if text is np.str_ else pa.binary()
            return UnischemaField(name, text, self.shape, ScalarCodec(arrow) if self.shape == () else None, nullable)
        dtype = np.dtype(self.dtype)
        codec = ScalarCodec(pa.from_numpy_dtype(dtype)) if self.shape == () else TensorCodec()
        return UnischemaField(name, dtype.type, self.shape, codec, nullable)

    def describe(self) -> dict[str, Any]:
        """What the dataset's metadata keeps of it: the TFDS type, and a ClassLabel's classes."""
        out: dict[str, Any] = {"type": self.tfds_type}
        if self.num_classes is not None:
            out["num_classes"] = self.num_classes
        if self.class_names is not None:
            out["names"] = list(self.class_names)
        return out


def declared_features(features_json: Mapping[str, Any] | None,
                      class_names: Mapping[str, list[str]]) -> dict[str, Declared]:
    """Feature name in the records -> what ``features.json`` declares, for the features unihub maps
    (see the module docstring); ``class_names``: labels.txt stem -> names. A file TFDS did not write
    (not a FeaturesDict at the top) declares nothing."""
    if not isinstance(features_json, Mapping):
        return {}
    try:
        kind, content = _node(features_json)
        if kind != "FeaturesDict":
            return {}
        return dict(_walk(features_json, "", "", (), class_names))
    except (KeyError, TypeError, ValueError, AttributeError):
        return {}  # a features.json unihub cannot read: the fields are inferred from the records


def apply_declared(fields: list[UnischemaField], stats: Mapping[str, _Stats], total: int,
                   declared: Mapping[str, Declared]) -> list[UnischemaField]:
    """``fields`` (inferred from the ``total`` records, whose statistics are ``stats``), each declared one
    as TFDS declares it; SchemaError where the records hold another list kind than TFDS writes."""
    out = []
    for inferred in fields:
        spec = declared.get(inferred.name)
        if spec is None:
            out.append(inferred)
            continue
        stat = stats[inferred.name]
        other = sorted(stat.kinds - {spec.kind})
        if other:
            where = stat.seen_at.get(other[0])
            raise SchemaError(f"feature {inferred.name!r}: features.json declares a TFDS {spec.tfds_type} "
                              f"({spec.dtype}, written as {spec.kind} lists), but "
                              f"{where or 'a record'} holds {other[0]} lists; give a schema file that says "
                              "which to read")
        out.append(spec.field(inferred.name, inferred, stat.present < total))
    return out


def shard_lengths(dataset_info: Any) -> dict[str, int]:
    """Shard file (its path in the TFDS directory) -> the records TFDS wrote to it, from the splits of
    ``dataset_info.json`` (``shardLengths``, named by ``filepathTemplate`` as TFDS names them)."""
    if not isinstance(dataset_info, Mapping):
        return {}
    out: dict[str, int] = {}
    try:
        for split in dataset_info.get("splits", []):
            lengths = [int(n) for n in split.get("shardLengths", [])]
            digits = max(5, len(str(len(lengths))))
            count = f"{len(lengths):0{digits}d}"
            for i, n in enumerate(lengths):
                index = f"{i:0{digits}d}"
                name = (split.get("filepathTemplate") or _FILE_TEMPLATE).format(
                    DATASET=dataset_info["name"], SPLIT=split["name"], FILEFORMAT=dataset_info.get(
                        "fileFormat") or "tfrecord", SHARD_INDEX=index, NUM_SHARDS=count,
                    SHARD_X_OF_Y=f"{index}-of-{count}")
                out[name] = n
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        return {}  # a dataset_info.json unihub cannot read: no count to check against
    return out


def _node(spec: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(TFDS class name, its content) of one node of features.json, in either form TFDS writes."""
    if "type" in spec:  # the form before TFDS 4.6
        content = spec.get("content") or {}
        if spec["type"].endswith("FeaturesDict"):
            content = {"features": content}
        return spec["type"].rsplit(".", 1)[-1], content
    name = spec["pythonClassName"].rsplit(".", 1)[-1]
    return name, next((v for k, v in spec.items() if k != "pythonClassName" and isinstance(v, dict)), {})


def _shape(value: Any) -> Shape:
    """A TFDS shape: ``[28, null]`` (before 4.6) or ``{"dimensions": ["28", "-1"]}``."""
    dims = value.get("dimensions", []) if isinstance(value, Mapping) else (value or [])
    return tuple(None if d is None or int(d) < 0 else int(d) for d in dims)


def _walk(spec: Mapping[str, Any], name: str, stem: str, outer: Shape,
          class_names: Mapping[str, list[str]]) -> Iterator[tuple[str, Declared]]:
    """The declared features under ``spec`` (named ``name`` in the records, ``stem`` in TFDS's file
    names), inside Sequences that add the dims ``outer``."""
    kind, content = _node(spec)
    if kind == "FeaturesDict":
        for child, child_spec in content["features"].items():
            yield from _walk(child_spec, f"{name}/{child}" if name else child,
                             f"{stem}-{child.replace('/', '.')}" if stem else child.replace("/", "."), outer,
                             class_names)
        return
    if kind == "Sequence":
        length = content.get("length")
        if outer:  # TFDS stores a Sequence of a Sequence as ragged values and row lengths
            return
        yield from _walk(content["feature"], name, stem, (None if length is None or int(length) < 0 else
                                                          int(length),), class_names)
        return
    declared = _declared(kind, content, outer, class_names.get(stem))
    # numbers are stored flat: only a first dim may vary (TFDS stores others ragged, or as bytes)
    if declared is not None and (declared.tfds_type == "Image" or None not in declared.shape[1:]):
        yield name, declared


def _declared(kind: str, content: Mapping[str, Any], outer: Shape, names: list[str] | None) -> Declared | None:
    """One leaf feature (inside Sequences adding ``outer``), or None where unihub leaves it to inference."""
    if kind == "ClassLabel":
        count = content.get("numClasses", content.get("num_classes"))
        return Declared(kind, "int64", outer, num_classes=None if count is None else int(count),
                        class_names=None if names is None else tuple(names))
    if kind == "BBoxFeature":
        return Declared(kind, "float32", (*outer, 4))
    if kind == "Text" and not content.get("use_encoder"):  # an encoder's Text holds int64 ids
        return Declared(kind, "string", outer)
    if kind == "Image" and not outer:
        dtype = content.get("dtype", "uint8")
        fmt = content.get("encodingFormat", content.get("encoding_format")) or None
        if dtype not in ("uint8", "uint16") or fmt not in (None, "png", "jpeg"):
            return None
        return Declared(kind, dtype, _shape(content.get("shape")), image_format=fmt)
    if kind in ("Tensor", "Scalar"):
        encoding = content.get("encoding") or "none"
        dtype = content.get("dtype")
        if encoding != "none" or dtype not in _KINDS:
            return None
        return Declared(kind, dtype, (*outer, *_shape(content.get("shape"))))
    return None
