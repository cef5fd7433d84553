"""``unihub verify`` for TFRecord: the files as TensorFlow itself reads them, never unihub's parser.

The reference side frames records with ``tf.data.TFRecordDataset`` and parses each with
TensorFlow's protobuf messages: ``tf.train.SequenceExample`` (whose ``context`` is an Example's
``features``, so one parse reads both kinds and sees feature lists an Example parse would drop),
else ``TensorProto`` through ``tf.make_ndarray``, else the record is opaque bytes. The unihub side
is encoded back into records exactly as an export would write them, then parsed the same way, so
the two meet in one form:

    {"features": {name: values}, "feature_lists": {name: [values, ...]}}
                                      an Example (no feature lists) or a SequenceExample (its context);
                                      features None: no features (context) field at all
    {"tensor": ndarray}               a TensorProto
    {"record": bytes}                 anything else

``values`` is a list of bytes, a float32 or an int64 array (the list's kind is in the type), compared
bit for bit, so a difference is named by record (file and index) and feature: ``record 6
(part-1.tfrecord record 2), field 'features'/x: expected float32[2] [...], found ...``. An empty list
keeps its kind too (``[]``, ``float32[0]``, ``int64[0]``), and a Feature with no list set is None:
TensorFlow reads all of them as no values, but they are other bytes, which an export keeps. A
SequenceExample without feature lists and an Example with its features are the same record and
compare equal.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from unihub.dependencies import require
from unihub.errors import FormatError
from unihub.formats.tfrecord.payload import row_encoder
from unihub.formats.tfrecord.records import file_compression
from unihub.formats.tfrecord.schema import example_encoder, export_options
from unihub.formats.tfrecord.tensor_proto import TensorProtoError, check_padding
from unihub.fs import sources
from unihub.schema.unischema import Unischema

_TF_COMPRESSION = {"none": "", "gzip": "GZIP", "zlib": "ZLIB"}


#: what TensorFlow's import writes to the process's stderr before its logging reads ``TF_CPP_MIN_LOG_LEVEL``:
#: absl's notice of messages before ``InitializeLog`` and C++ log lines (oneDNN's, on processors it tunes for)
_TF_IMPORT_NOISE = re.compile(r"^[IWEF]\d{4} |absl::InitializeLog")


def _tensorflow() -> Any:
    """TensorFlow, imported quietly: its C++ info and warning lines would fill verify's output. A level the
    user set wins (and shows what it lets through); an import already made is as it was."""
    def imported() -> Any:
        return require("tensorflow", extra="tf", purpose="verifying TFRecord files against TensorFlow's own reader")

    if "TF_CPP_MIN_LOG_LEVEL" in os.environ or "tensorflow" in sys.modules:
        return imported()
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    with _native_stderr_without(_TF_IMPORT_NOISE):
        return imported()


@contextlib.contextmanager
def _native_stderr_without(noise: re.Pattern[str]) -> Iterator[None]:
    """While the block runs, what is written to file descriptor 2 (by C++ as well as Python) goes to a
    temporary file; then its lines that ``noise`` does not match are written to stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode(errors="replace").splitlines(keepends=True)
                    if not noise.search(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def reference_records(source: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every record of ``source`` (a TFRecordFormat) as TensorFlow reads it; see the module docstring."""
    tf = _tensorflow()
    forced = source.options.get("payload") or "auto"
    for path in source.files():
        compression = _TF_COMPRESSION[file_compression(path, source.options.get("compression"))]
        with sources.local_copy(path) as local:  # TensorFlow reads no s3:// (it dropped its S3 filesystem)
            yield from _tf_records(tf, path, local, compression, forced)


def _tf_records(tf: Any, path: str, local: str, compression: str, forced: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The records of one file (``local``: where TensorFlow reads ``path`` from) as TensorFlow reads them."""
    records = iter(tf.data.TFRecordDataset(local, compression_type=compression))
    index = 0
    while True:
        try:
            record = next(records)
        except StopIteration:
            break
        except tf.errors.OpError as exc:
            raise FormatError(f"{path}: TensorFlow cannot read record {index}: {exc.message}", path=path) from None
        try:
            form = native(record.numpy(), forced)
        except TensorProtoError as exc:
            raise FormatError(f"{path}: record {index}: {exc}", path=path) from None
        yield f"{os.path.basename(path)} record {index}", form
        index += 1


def native_records(schema: Unischema, rows: Iterable[Mapping[str, Any]], extra: Mapping[str, Any],
                   **options: Any) -> Iterator[dict[str, Any]]:
    """The rows of a unihub dataset as :func:`reference_records` gives the records an export writes."""
    written = export_options(extra, schema)
    forced = options.get("payload") or "auto"
    payload = forced if forced not in ("auto", None) else written.get("payload", "example")
    shapes, order = written.get("shape_features", ()), written.get("feature_order", ())
    kindless = written.get("empty_without_kind", ())
    empty_context = written.get("empty_context", True)
    if payload == "example":
        encode = example_encoder(schema, written.get("empty_as_null", ()), shapes, order,
                                 written.get("feature_orders"), empty_without_kind=kindless,
                                 empty_context=empty_context)
    else:
        lists = options.get("feature_lists") or written.get("feature_lists", ())
        encode = row_encoder(schema, payload, lists, written.get("empty_as_null", ()), shapes, order,
                             written.get("feature_list_order", ()), written.get("feature_orders"),
                             empty_without_kind=kindless, empty_context=empty_context)
    wide = [f.name for f in schema if isinstance(f.numpy_dtype, type) and np.dtype(f.numpy_dtype) == np.float64]
    listed = set(lists) if payload == "sequence_example" else set()
    for row in rows:
        form = native(encode({name: [value] for name, value in row.items()}, 0), forced)
        yield _unrounded(form, row, wide, listed) if wide and "features" in form else form


def _unrounded(form: dict[str, Any], row: Mapping[str, Any], wide: list[str], lists: set[str]) -> dict[str, Any]:
    """``form`` (a row as an export writes it) with the row's own float64 values where TFRecord's float32
    list rounds them: the export writes what ``tf.train.FloatList`` holds, and verify names the change
    rather than compare the rounded values with themselves."""
    for name in wide:
        value = row.get(name)
        if value is None:
            continue
        if name not in lists:
            written = (form["features"] or {}).get(name)
            if isinstance(written, np.ndarray) and _rounded(written, value):
                form["features"][name] = np.asarray(value, np.float64).ravel()
            continue
        bare = name.removeprefix("feature_lists/")
        key = name if name in form["feature_lists"] else bare
        steps = form["feature_lists"].get(key)
        if steps is not None and any(isinstance(w, np.ndarray) and _rounded(w, v) for w, v in zip(steps, value)):
            form["feature_lists"][key] = [np.asarray(v, np.float64).ravel() for v in value]
    return form


def _rounded(written: np.ndarray, value: Any) -> bool:
    """True where float32 ``written`` does not hold the float64 ``value`` bit for bit."""
    original = np.asarray(value, np.float64).ravel()
    return written.size != original.size or \
        not np.array_equal(written.astype(np.float64).view(np.uint64), original.view(np.uint64))


def native(data: bytes, payload: str = "auto") -> dict[str, Any]:
    """One record in the comparison form, parsed by TensorFlow's messages (``payload`` forces a kind)."""
    tf = _tensorflow()
    from google.protobuf.message import DecodeError
    from tensorflow.core.framework import tensor_pb2

    if payload == "bytes":
        return {"record": bytes(data)}
    if payload in ("auto", "example", "sequence_example"):
        try:
            message = tf.train.SequenceExample.FromString(data)
            if not _unknown_fields(message):
                return _example_form(message)
        except DecodeError:
            pass
    if payload in ("auto", "tensor"):
        try:
            proto = tensor_pb2.TensorProto.FromString(data)
        except DecodeError:
            proto = None
        if proto is not None and proto.dtype and not _unknown_fields(proto):
            if not proto.tensor_content:  # typed values, which make_ndarray pads to the shape: bounded first
                check_padding(tuple(d.size for d in proto.tensor_shape.dim), proto.dtype, len(data))
            try:
                return {"tensor": tf.make_ndarray(proto)}
            except (TypeError, ValueError):
                pass
    return {"record": bytes(data)}


def _unknown_fields(message: Any) -> int:
    from google.protobuf import unknown_fields

    return len(unknown_fields.UnknownFieldSet(message))


def _example_form(message: Any) -> dict[str, Any]:
    """An Example's or SequenceExample's form; ``features`` None where the record has no features (context)
    field at all (``tf.train.Example()``: ``b''``), an empty one (``0a 00``) being other bytes."""
    features = {name: _feature(f) for name, f in sorted(message.context.feature.items())}
    return {"features": features if features or message.HasField("context") else None,
            "feature_lists": {name: [_feature(f) for f in fl.feature]
                              for name, fl in sorted(message.feature_lists.feature_list.items())}}


def _feature(feature: Any) -> Any:
    """A feature's values: a list of bytes, a float32 or an int64 array (the kind is in the type, so a
    difference names the feature and no more, empty lists' too), or None for a Feature with no list set."""
    kind = feature.WhichOneof("kind")
    if kind == "bytes_list":
        return list(feature.bytes_list.value)
    if kind == "float_list":
        return np.array(feature.float_list.value, dtype=np.float32)
    if kind == "int64_list":
        return np.array(feature.int64_list.value, dtype=np.int64)
    return None
