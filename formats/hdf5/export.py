"""Writing an HDF5 file from column batches, by an :class:`~unihub.formats.hdf5.storage.ExportSpec`.

One writer per layout: columns (datasets grown with ``resize`` along axis 0, chunked), splits (the
same inside one group per split, in order of first appearance) and groups (one group per row,
named by the key field, its members whole). Containers of splits and groups track creation order,
so h5py lists them in the order written. Where the source's metadata records it, every group tracks
creation order as the source's did (``creation_order``, ``unit_order``: made first, :func:`_make_groups`),
the rows' datasets and a sample's members are created in the source's order, and constants, empty
datasets and links are linked again into theirs (:func:`_order_links`). The file is written beside
the target and renamed into place only when complete.

A dataset the source's metadata describes is stored as the source stored it (:func:`create_stored`:
layout, chunk shape, filters with their options, fill value): grown in place where the source's
layout can grow (chunked, unlimited along the rows), else staged in a scratch file beside the target
and copied into a dataset of its final size (contiguous, compact, fixed-size chunked). Then the
source's links and dimension scales are made again.

Every write is preceded by room reserved on disk for it (:mod:`unihub.formats.hdf5.room`): HDF5
crashes the interpreter when a write of variable-length values fails, so a full disk is met first
by a Python error, and the failed file is then closed into nothing (:func:`_discard`) and removed.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from unihub.errors import DatasetExistsError, SchemaError, UnihubError
from unihub.formats.base import ColumnBatch, python_columns
from unihub.formats.hdf5.detect import LAYOUT_ATTR
from unihub.formats.hdf5.dtypes import decode_constant, dtype_from_json, h5py_module, noted, text_notes, unconverted
from unihub.formats.hdf5.layout import FIELD_ATTR, ISNULL_SUFFIX, SCHEMA_ATTR, SHAPE_SUFFIX
from unihub.formats.hdf5.read import slice_rows
from unihub.formats.hdf5.room import DiskRoom, nbytes_of
from unihub.formats.hdf5.storage import (
    ExportSpec,
    Storage,
    Typed,
    assemble,
    chunk_rows_for,
    sample_values,
    storage_of,
    storage_rows,
)
from unihub.fs import filesystem as fsutil
from unihub.schema.unischema import Unischema
from unihub.schema.validation import column_length

SCHEMA_NAME_ATTR = "unihub.schema_name"
FIELD_ORDER_ATTR = "unihub.field_order"


def write_file(target: str, schema: Unischema, batches: Iterable[ColumnBatch], spec: ExportSpec, *,
               compression: str | None, chunk_rows: int | None, overwrite: bool) -> list[str]:
    """Write ``batches`` to ``target`` (a temporary sibling renamed on success); see the module docstring."""
    target = os.fspath(target)
    if os.path.exists(target) and not overwrite:
        raise DatasetExistsError(f"{target} exists; pass --overwrite (overwrite=True) to replace it")
    _check_names(schema)
    h5py = h5py_module()
    parent, base = os.path.split(os.path.abspath(target))
    temporary = fsutil.temporary_sibling(os.path.join(parent, base))
    handle = None
    room = DiskRoom()
    staging = _Staging(fsutil.temporary_sibling(os.path.join(parent, base)), room)
    options = {"compression": compression, "chunk_rows": chunk_rows, "staging": staging, "spec": spec, "room": room}
    try:
        handle = h5py.File(temporary, "w", track_order=_root_tracked(spec))
        room.track(handle)
        room.ensure(0)
        _root_attributes(handle, schema, spec)
        _make_groups(handle, spec)
        writer = _WRITERS[spec.kind](handle, schema, spec, options)
        for batch in map(python_columns, batches):
            writer.append(batch, column_length(schema, batch))
        staging.finish()
        room.ensure(0)
        _write_empty(handle, spec.empty, options)
        _write_constants(handle, spec.constants, spec.storage, room)
        for path in spec.groups:  # groups the datasets did not make: empty ones, an empty split
            handle.require_group(path)
        for path, dtype in spec.named_types.items():  # before the attributes: they may have their own
            parent = path.rpartition("/")[0]
            (handle.require_group(parent) if parent else handle)[path.rpartition("/")[2]] = dtype_from_json(dtype)
        _write_attributes(handle, spec.attributes, room)
        if spec.kind != "columns":
            _record_units(handle, spec, set(writer.units) | set(spec.units))
        room.ensure(0)  # the links, the scales and what closing flushes
        _write_links(handle, spec.links)
        _write_scales(handle, spec.scales)
        _order_links(handle, spec)
        handle.close()
        room.release(temporary)
        os.replace(temporary, target)
    except BaseException:
        if handle is not None:
            # HDF5 met no failure where the disk's room ran out first, or unihub or Ctrl-C stopped it
            _discard(handle, intact=room.refused or isinstance(sys.exc_info()[1], (UnihubError, KeyboardInterrupt)))
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    finally:
        staging.close()
    return [target]


def _root_tracked(spec: ExportSpec) -> bool:
    """Whether the root tracks creation order: as the source's did (``creation_order``; a container of
    units: ``unit_order``), else only where it holds the splits or sample groups (listed as written)."""
    if spec.kind != "columns" and not spec.container:
        return True if spec.unit_order is None else bool(spec.unit_order.get("container_tracked"))
    return "" in spec.creation_order


def unit_entry(spec: ExportSpec, rel: str) -> dict[str, Any] | None:
    """The recorded ``unit_order`` entry of the object at ``rel`` in every unit ({}: it tracks nothing);
    None where the metadata records none (an ingest before it, or no HDF5 source)."""
    if spec.unit_order is None:
        return None
    return dict((spec.unit_order.get("members") or {}).get(rel) or {})


def _tracks(entry: Mapping[str, Any] | None, default: bool | None) -> bool | None:
    """h5py's ``track_order`` for an object of a recorded ``unit_order`` entry (``default`` where none)."""
    return default if entry is None else "links" in entry or "attributes" in entry


def _make_groups(handle: Any, spec: ExportSpec) -> None:
    """The source's groups outside the units, made first (parents first), each tracking creation order
    where the source's did (``creation_order``): a group h5py makes on the way to a dataset does not."""
    if spec.kind == "splits" and not spec.units:  # metadata from before the splits were recorded: as then
        return
    if spec.kind == "columns":
        units: tuple[str, ...] = ()
    else:
        units = (spec.container, *("/".join(p for p in (spec.container, u) if p) for u in spec.units)) \
            if spec.kind == "splits" else (spec.container,)
    for path in sorted(spec.groups, key=lambda p: p.count("/")):
        if path in handle or any(path == u or path.startswith(u + "/") for u in units if u) or path in units:
            continue
        handle.create_group(path, track_order=path in spec.creation_order)


def _order_links(handle: Any, spec: ExportSpec) -> None:
    """Each group that tracks creation order listing the source's names in the source's order
    (``creation_order``): the rows' datasets were made first, constants, empty datasets and links after them."""
    for path, entry in spec.creation_order.items():
        if "links" in entry and (not path or path in handle):
            _relink(handle[path] if path else handle, entry["links"])


def _relink(group: Any, order: list[str]) -> None:
    """List ``order``'s names of ``group`` (a group tracking creation order) in that order: the names
    after the longest start of ``order`` already listed in order are linked again, each at the end
    (a hard link through a second name, so that the object stays; a soft link as it was)."""
    h5py = h5py_module()
    names = [n for n in order if group.get(n, getlink=True) is not None]
    wanted = set(names)
    listed = iter([n for n in group if n in wanted])
    keep = 0
    for name in names:
        if not any(m == name for m in listed):
            break
        keep += 1
    for name in names[keep:]:
        link = group.get(name, getlink=True)
        if isinstance(link, h5py.HardLink):
            spare = f"{name}.unihub-relink"
            group[spare] = group[name]
            del group[name]
            group[name] = group[spare]
            del group[spare]
        else:
            del group[name]
            group[name] = link


def _discard(handle: Any, *, intact: bool) -> None:
    """Close an HDF5 file that a failed export leaves behind, so that it can be removed.

    A file that HDF5 wrote without a failure (``intact``: the export stopped on an error of its own,
    or on a disk without room for the next write, which :class:`DiskRoom` found first) closes as
    usual, into the room reserved for it. But HDF5 cannot close a file whose writes fail (a full
    disk, a file-size limit): its objects stay open, a second close crashes, and the library
    crashes the interpreter at exit flushing them. So such a file's descriptor is first pointed at
    /dev/null, where the remaining writes succeed into nothing, and the close that follows is clean.
    The first error is the one raised.
    """
    if not handle.id.valid:  # closed already
        return
    if intact:
        try:
            handle.close()
        except (OSError, RuntimeError, ValueError):  # the export's own error is the one to report
            pass
        return
    try:
        descriptor = handle.id.get_vfd_handle()
        null = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(null, descriptor)
        finally:
            os.close(null)
    except (OSError, ValueError, TypeError):  # no POSIX descriptor: close it as it is
        pass
    try:
        handle.close()
    except (OSError, RuntimeError, ValueError):  # the write already failed with the error to report
        pass


def _check_names(schema: Unischema) -> None:
    names = {f.name for f in schema}
    for name in names:
        for other in names:
            if other.startswith(name + "/"):
                raise SchemaError(f"fields {name!r} and {other!r} cannot both be HDF5 datasets "
                                  f"({name!r} would be a group)")
        if name.endswith((SHAPE_SUFFIX, ISNULL_SUFFIX)) and name.rsplit("__", 1)[0] in names:
            raise SchemaError(f"field {name!r} clashes with a companion dataset of another field")


def _root_attributes(handle: Any, schema: Unischema, spec: ExportSpec) -> None:
    handle.attrs[SCHEMA_NAME_ATTR] = schema.name
    handle.attrs[FIELD_ORDER_ATTR] = json.dumps(list(schema.fields))
    handle.attrs[LAYOUT_ATTR] = json.dumps({"kind": spec.kind, "container": spec.container,
                                            "key_field": spec.key_field, "images": spec.images, **spec.asked})
    if spec.kind == "groups":  # no dataset carries unihub.field there: the fields are recorded once
        handle.attrs[SCHEMA_ATTR] = schema.to_json()


def _write_constants(handle: Any, constants: Mapping[str, Any], storage: Mapping[str, Any], room: DiskRoom) -> None:
    """Datasets that were not rows, back where they were (after the rows: units keep their order),
    stored as the source stored them."""
    h5py = h5py_module()
    for path, record in constants.items():
        if path in handle:
            raise SchemaError(f"the source's dataset {path!r} clashes with an exported one")
        value, dt = decode_constant(record)
        room.ensure(0 if value is None else nbytes_of(value))
        if path in storage:
            dataset = create_stored(handle, path, dt, None if value is None else value.shape, storage[path])
            if value is not None and value.size:
                _write_rows(dataset, value, 0, len(value), room) if value.ndim else _write_scalar(dataset, value)
            continue
        handle.create_dataset(path, data=h5py.Empty(dt) if value is None else value, dtype=dt)


def _write_links(handle: Any, links: Mapping[str, Mapping[str, str]]) -> None:
    """The source's other names of its objects: hard links to the object's first name, soft links as
    written (an object the export left out takes its links with it)."""
    h5py = h5py_module()
    for path, link in links.items():
        target = link.get("hard", link.get("object", ""))
        if path in handle or (target and target not in handle):
            continue
        parent, _, name = path.rpartition("/")
        group = handle.require_group(parent) if parent else handle
        group[name] = handle[target] if "hard" in link else h5py.SoftLink(link["soft"])


def _write_scales(handle: Any, scales: Mapping[str, Any]) -> None:
    """The source's dimension scales (``make_scale`` with their names), then each dataset's dimensions:
    the scales attached in their order, and the labels."""
    for path, name in (scales.get("scales") or {}).items():
        if path in handle:
            handle[path].make_scale(name)
    for path, dims in (scales.get("dims") or {}).items():
        if path not in handle:
            continue
        dataset = handle[path]
        for dim, (label, attached) in zip(dataset.dims, dims):
            for scale in attached:
                if scale in handle:
                    dim.attach_scale(handle[scale])
            if label:
                dim.label = label


def _record_units(handle: Any, spec: ExportSpec, units: set[str]) -> None:
    """Name in ``unihub.layout`` the container's groups that are no split or sample (the source's groups
    written back beside them), so that an ingest of the export reads the units it wrote, no more."""
    h5py = h5py_module()
    base = handle[spec.container] if spec.container else handle
    outside = [n for n in base if n not in units and base.get(n, getclass=True) is h5py.Group]
    if outside:
        handle.attrs[LAYOUT_ATTR] = json.dumps({**json.loads(handle.attrs[LAYOUT_ATTR]), "not_units": outside})


def _write_empty(handle: Any, empty: Mapping[str, Any], options: Mapping[str, Any]) -> None:
    """The datasets of units of 0 rows (an empty split, a file of 0 rows), with their dtypes and shapes,
    created as the rows' datasets are (chunked, growable); one the rows made already is left as it is."""
    for path, record in empty.items():
        if path in handle:
            continue
        value, dt = decode_constant(record)
        if value is None:  # an ingest records the datasets of 0 rows, which have a shape
            raise SchemaError(f"the source's empty dataset {path!r} is recorded without a shape")
        stored = options["spec"].storage.get(path)
        if stored is not None:
            create_stored(handle, path, dt, value.shape, stored)
            continue
        parent, _, name = path.rpartition("/")
        _create(handle.require_group(parent) if parent else handle, name, dt, tuple(value.shape[1:]), options)


def _write_attributes(handle: Any, attributes: Mapping[str, Mapping[str, Any]], room: DiskRoom) -> None:
    """The source's attributes back on the objects the export has (a dataset left out takes its own), a fixed
    string padded as the source's was (``strpad``: h5py writes its own padding, NULs, else), a bitfield
    as a bitfield (h5py would write an integer)."""
    h5py = h5py_module()
    for path, values in attributes.items():
        owner = handle.get(path) if path else handle
        if owner is None:
            continue
        for name, record in values.items():
            value, dt = decode_constant(record)
            room.ensure(0 if value is None else nbytes_of(value))
            typed = h5py.Datatype(noted(h5py.h5t.py_create(dt, logical=1), record)) \
                if record.get("strpad") or record.get("bitfield") or record.get("members") else dt
            owner.attrs.create(name, data=h5py.Empty(dt) if value is None else value, dtype=typed)
            if value is not None:
                _rewrite_exactly(owner.attrs.get_id(name), value)


def _rewrite_exactly(attr: Any, value: np.ndarray) -> None:
    """The attribute's value written again byte for byte where h5py's write converts it (:func:`unconverted`)."""
    mtype = unconverted(attr.get_type())
    if mtype is not None:
        attr.write(np.ascontiguousarray(value), mtype=mtype)


def _write_scalar(dataset: Any, value: np.ndarray) -> None:
    """The value of a scalar dataset, byte for byte into a NUL-terminated string (:func:`unconverted`)."""
    mtype = unconverted(dataset.id.get_type())
    if mtype is None:
        dataset.write_direct(value)
        return
    h5s = h5py_module().h5s
    dataset.id.write(h5s.ALL, h5s.ALL, np.ascontiguousarray(value), mtype=mtype)


def _append(dataset: Any, rows: np.ndarray, start: int, n: int, room: DiskRoom) -> None:
    """Grow ``dataset`` by ``n`` rows and write them."""
    if not n:
        return
    dataset.resize(start + n, axis=0)
    _write_rows(dataset, rows, start, n, room)


def _write_rows(dataset: Any, rows: np.ndarray, start: int, n: int, room: DiskRoom) -> None:
    """Write ``n`` rows at ``start`` (the dataset holds them already), with room for them on disk."""
    h5py = h5py_module()
    room.ensure(nbytes_of(rows))
    if h5py.check_vlen_dtype(dataset.dtype) is not None and h5py.check_string_dtype(dataset.dtype) is None:
        # h5py's __setitem__ turns equal-length rows into a 2-D array: write them as typed
        typed = np.empty(n, dtype=dataset.dtype)
        typed[:] = rows
        dataset.write_direct(typed, dest_sel=np.s_[start:start + n])
        return
    mtype = unconverted(dataset.id.get_type())
    if mtype is not None:  # byte for byte: h5py's conversion would cut a value that fills the string
        rows = np.ascontiguousarray(rows)
        selection = dataset.id.get_space()
        selection.select_hyperslab((start, *(0,) * (rows.ndim - 1)), rows.shape)
        dataset.id.write(h5py.h5s.create_simple(rows.shape), selection, rows, mtype=mtype)
        return
    try:
        dataset[start:start + n] = rows
    except ValueError as exc:
        if "embedded NULL" not in str(exc):
            raise
        row = start + next((i for i, v in enumerate(rows) if isinstance(v, str) and "\0" in v), 0)
        raise SchemaError(f"HDF5 dataset {dataset.name!r}, row {row}: a variable-length HDF5 string cannot hold a "
                          "NUL character ('\\x00'); store the field as bytes (np.bytes_), or leave the character out") from None


#: the filter h5py sets for each ``compression`` an export takes (gzip: deflate at level 4; lzf)
_ASKED_FILTERS = {"gzip": [1, 1, [4]], "lzf": [32000, 1, []]}


def as_asked(record: Mapping[str, Any], dtype: np.dtype, cell: tuple[int, ...], options: Mapping[str, Any]) -> Any:
    """The storage record of a source dataset of rows as the export's ``compression`` / ``chunk_rows`` ask
    (options for every dataset, which the source's own storage would otherwise override without a word):
    chunked in those rows, growable, the source's filters replaced by the compression asked (kept where only
    ``chunk_rows`` is); its type's notes, fill value and times as the source's. ``record`` where neither is."""
    if not options.get("compression") and not options.get("chunk_rows"):
        return record
    filters = [_ASKED_FILTERS[options["compression"]]] if options.get("compression") else record.get("filters") or []
    return {**record, "layout": "chunked", "filters": filters,
            "chunks": [chunk_rows_for(dtype, cell, options.get("chunk_rows")), *["="] * len(cell)],
            "maxshape": [None, *["="] * len(cell)]}


def _create(group: Any, name: str, dtype: np.dtype, shape: tuple[int, ...], options: Mapping[str, Any]) -> Any:
    rows = chunk_rows_for(dtype, shape, options["chunk_rows"])
    # a zero-size dimension cannot hold a chunk of size 0: chunk it by 1 and leave its extent open
    # (HDF5 allows a chunk larger than the data only along an unlimited dimension)
    chunks = (rows, *(d or 1 for d in shape))
    maxshape = (None, *(d if d else None for d in shape))
    try:
        return group.create_dataset(name, shape=(0, *shape), maxshape=maxshape, chunks=chunks,
                                    dtype=dtype, compression=options["compression"])
    except (ValueError, OverflowError) as exc:  # a shape HDF5 cannot hold: chunk dims past 2^32, sizes past 2^64
        raise SchemaError(f"HDF5 dataset {name!r}: rows of shape {shape} cannot be stored in HDF5 ({exc})") from None


def create_stored(group: Any, path: str, dtype: np.dtype, shape: tuple[int, ...] | None,
                  record: Mapping[str, Any]) -> Any:
    """A new dataset ``path`` of ``group`` stored as ``record`` says (``hdf5_meta.storage_record``: layout,
    chunks, maximum shape, filter pipeline, fill value, times and string padding), of ``shape`` (None: an empty
    dataspace). A chunk that spanned a dimension spans it again; one longer than a fixed dimension
    is cut to it (fewer rows than the source's);
    a fixed dimension of 0 rows is left unlimited, as no chunk fits it."""
    h5py = h5py_module()
    h5d, h5p, h5s = h5py.h5d, h5py.h5p, h5py.h5s
    parent, _, name = path.rpartition("/")
    owner = group.require_group(parent) if parent else group
    dcpl = h5p.create(h5p.DATASET_CREATE)
    space = _dataspace(h5s, dcpl, shape, record)
    if record["layout"] == "compact":
        dcpl.set_layout(h5d.COMPACT)
    for code, flags, values in record.get("filters") or ():
        dcpl.set_filter(code, flags, tuple(values))
    dcpl.set_fill_time(record["fill_time"])
    dcpl.set_alloc_time(record["alloc_time"])
    dcpl.set_obj_track_times(bool(record.get("track_times")))
    if record.get("track_order"):  # its attributes listed in creation order, as h5py's track_order sets
        dcpl.set_attr_creation_order(h5p.CRT_ORDER_TRACKED | h5p.CRT_ORDER_INDEXED)
    if record.get("fillvalue") is not None:
        value, fill_dtype = decode_constant(record["fillvalue"])
        string = h5py.check_string_dtype(fill_dtype)
        if string is not None and string.length is not None:  # as h5py sets one: through a vlen string
            fill = np.array(np.asarray(value).item(), dtype=h5py.string_dtype(string.encoding)).reshape(1)
        else:
            fill = np.asarray(value, dtype=fill_dtype).reshape(1)
        dcpl.set_fill_value(fill)
    type_id = noted(h5py.h5t.py_create(dtype, logical=1), record)
    return h5py.Dataset(h5d.create(owner.id, name.encode("utf-8"), type_id, space, dcpl=dcpl))


def _dataspace(h5s: Any, dcpl: Any, shape: tuple[int, ...] | None, record: Mapping[str, Any]) -> Any:
    """The dataspace of :func:`create_stored`'s dataset, its chunks set in ``dcpl`` where it is chunked."""
    if shape is None:
        return h5s.create(h5s.NULL)
    if not shape:
        return h5s.create(h5s.SCALAR)
    recorded = list(record.get("maxshape") or ["="] * len(shape))
    maxshape = tuple(h5s.UNLIMITED if m is None else d if m == "=" else max(int(m), d)
                     for m, d in zip(recorded, shape))
    if record["layout"] == "chunked":
        chunks = tuple(max(1, d if c == "=" else c if m == h5s.UNLIMITED else min(c, m))
                       for c, m, d in zip(record["chunks"], maxshape, shape))
        maxshape = tuple(h5s.UNLIMITED if m == 0 else m for m in maxshape)
        dcpl.set_chunk(chunks)
    return h5s.create_simple(tuple(shape), maxshape)


class _Staging:
    """Rows of datasets that cannot grow as the source stored them (contiguous, compact, or chunked
    with a fixed number of rows): written to a scratch file beside the target as they come, then
    copied, a slice at a time, into a dataset of the final size stored as the source's was."""

    def __init__(self, path: str, room: DiskRoom) -> None:
        self.path, self.room = path, room
        self.scratch: Any = None
        self.staged: list[tuple[Any, str, np.dtype, Any, Mapping[str, Any]]] = []

    def stage(self, group: Any, path: str, dtype: np.dtype, cell: tuple[int, ...], record: Mapping[str, Any]) -> Any:
        """A growable dataset in the scratch file for ``path`` of ``group``, copied there by :meth:`finish`."""
        if self.scratch is None:
            self.scratch = h5py_module().File(self.path, "w")
            self.room.track(self.scratch)
        staged = _create(self.scratch, str(len(self.staged)), dtype, cell, {"chunk_rows": None, "compression": None})
        self.staged.append((group, path, dtype, staged, record))
        return staged

    def finish(self) -> None:
        """Every staged dataset into its place, stored as its record says."""
        for group, path, dtype, staged, record in self.staged:
            final = create_stored(group, path, dtype, staged.shape, record)
            step = slice_rows(staged, 8 << 20)
            for start in range(0, staged.shape[0], step):
                stop = min(start + step, staged.shape[0])
                _write_rows(final, staged[start:stop], start, stop - start, self.room)
        self.staged = []

    def close(self) -> None:
        """Close and remove the scratch file."""
        if self.scratch is not None:
            self.scratch.close()
            self.scratch = None
        if os.path.exists(self.path):
            os.remove(self.path)


class _FieldSink:
    """One field stored unihub's way: its dataset and companions, grown batch by batch."""

    def __init__(self, group: Any, storage: Storage, options: Mapping[str, Any]) -> None:
        self.storage, self.size, self.room = storage, 0, options["room"]
        self.datasets = {name: _create(group, name, dtype, shape, options)
                         for name, (dtype, shape) in storage.datasets().items()}
        self.datasets[storage.field.name].attrs[FIELD_ATTR] = json.dumps(storage.recorded().to_json())

    def append(self, values: Any, n: int) -> None:
        for name, rows in storage_rows(self.storage, values, n, self.size).items():
            _append(self.datasets[name], rows, self.size, n, self.room)
        self.size += n


class _TypedSink:
    """A source dataset rebuilt from its fields, created at its first row (its cell shape then known).
    A source dataset that is absent (every row None) stays absent; a null among values is refused."""

    def __init__(self, group: Any, typed: Typed, options: Mapping[str, Any]) -> None:
        self.group, self.typed, self.options = group, typed, options
        self.dataset: Any = None
        self.size = 0

    def append(self, batch: Mapping[str, Any], n: int) -> None:
        if not n:
            return
        columns = {name: batch.get(name) for name, _ in self.typed.members}
        present = np.ones(n, dtype=bool)
        for values in columns.values():
            if values is None:
                present[:] = False
            elif not (isinstance(values, np.ndarray) and values.dtype != object):
                present &= np.fromiter((v is not None for v in values), dtype=bool, count=n)
        written = 0 if self.dataset is None else self.dataset.shape[0]
        if present.any() and (not present.all() or written != self.size) or (self.dataset is not None
                                                                            and not present.any()):
            row = self.size + int(np.argmin(present)) if present.any() and written == self.size else written
            raise SchemaError(f"field {self.typed.members[0][0]!r}, row {row}: HDF5 dataset {self.typed.path!r} "
                              "holds a value in every row or in none; a null cannot be stored in its dtype")
        if present.all():
            rows = assemble(self.typed, columns, "")
            if self.dataset is None:
                self.dataset = self._open(rows.shape[1:])
            _append(self.dataset, rows, written, n, self.options["room"])
        self.size += n

    def _open(self, cell: tuple[int, ...]) -> Any:
        """The dataset the rows grow: the source's own where it can grow (chunked, unlimited along the
        rows), else a staged one that :class:`_Staging` copies into one stored as the source's was."""
        path = "/".join(p for p in (self.group.name.strip("/"), self.typed.path) if p)
        record = self.options["spec"].storage.get(path)
        if record is None:
            return _create(self.group, self.typed.path, self.typed.dtype, cell, self.options)
        record = as_asked(record, self.typed.dtype, cell, self.options)
        if record["layout"] == "chunked" and record["maxshape"][:1] == [None]:
            return create_stored(self.group, self.typed.path, self.typed.dtype, (0, *cell), record)
        return self.options["staging"].stage(self.group, self.typed.path, self.typed.dtype, cell, record)


class _ColumnsWriter:
    """Every field a dataset of the file (or of one split's group) along axis 0."""

    def __init__(self, group: Any, schema: Unischema, spec: ExportSpec, options: Mapping[str, Any]) -> None:
        self.generic = [_FieldSink(group, storage_of(f, spec.images), options) for f in spec.generic]
        typed = [t for t in spec.typed if t.attr is None]
        order = (spec.creation_order.get(group.name.strip("/")) or {}).get("links")
        if order:  # the group tracks creation order: its datasets made (at their first rows) in the source's
            place = {name: i for i, name in enumerate(order)}
            typed.sort(key=lambda t: place.get(t.path.split("/")[0], len(place)))
        self.typed = [_TypedSink(group, t, options) for t in typed]

    def append(self, batch: Mapping[str, Any], n: int) -> None:
        for sink in self.generic:
            sink.append(batch.get(sink.storage.field.name), n)
        for typed in self.typed:
            typed.append(batch, n)


class _SplitsWriter:
    """One group per split (the key field's value), each written like columns."""

    def __init__(self, handle: Any, schema: Unischema, spec: ExportSpec, options: Mapping[str, Any]) -> None:
        if spec.key_field is None or spec.key_field not in schema.fields:
            raise SchemaError(f"--option layout=splits writes one group per value of field {spec.key_field!r}, "
                              f"which {schema.name!r} lacks; name the field with --option key_field=...")
        self.key: str = spec.key_field
        self.schema, self.spec, self.options = schema, spec, options
        tracked = True if spec.unit_order is None else bool(spec.unit_order.get("container_tracked"))
        self.container = handle.create_group(spec.container, track_order=tracked) if spec.container else handle
        self.splits: dict[str, _ColumnsWriter] = {}

    @property
    def units(self) -> list[str]:
        return list(self.splits)

    def append(self, batch: Mapping[str, Any], n: int) -> None:
        names = list(batch[self.key])
        start = 0
        while start < n:
            stop = start + 1
            while stop < n and names[stop] == names[start]:
                stop += 1
            writer = self.splits.get(names[start]) or self._open(names[start])
            writer.append({k: v[start:stop] for k, v in batch.items() if k != self.key}, stop - start)
            start = stop

    def _open(self, name: Any) -> _ColumnsWriter:
        if not isinstance(name, str) or not name or "/" in name or name in self.container:
            raise SchemaError(f"split name {name!r} (field {self.key!r}) cannot name a new HDF5 group")
        path = "/".join(p for p in (self.spec.container, name) if p)
        tracked = True if self.spec.unit_order is None else path in self.spec.creation_order
        group = self.container.create_group(name, track_order=tracked)
        self.splits[name] = _ColumnsWriter(group, self.schema, self.spec, self.options)
        return self.splits[name]


class _GroupsWriter:
    """One group per row, named by the key field (``sample_00000000``, ... without one)."""

    def __init__(self, handle: Any, schema: Unischema, spec: ExportSpec, options: Mapping[str, Any]) -> None:
        self.spec, self.count, self.room = spec, 0, options["room"]
        self.key = spec.key_field if spec.key_field in schema.fields else None
        self.units: set[str] = set()
        self.inner = {t.path for t in spec.typed if t.attr is not None and t.group}  # groups inside a sample
        self.typed = {t.path for t in spec.typed if t.attr is None}  # the source's datasets: stored as they were
        tracked = True if spec.unit_order is None else bool(spec.unit_order.get("container_tracked"))
        self.container = handle.create_group(spec.container, track_order=tracked) if spec.container else handle
        # the source's order of a sample's names (links, and each object's attributes), where it tracked them
        self.tracked = _tracks(unit_entry(spec, ""), None)
        members = (spec.unit_order or {}).get("members") or {}
        self.link_order = {rel: {n: i for i, n in enumerate(entry.get("links") or ())} for rel, entry in members.items()}
        self.attribute_order = {rel: {n: i for i, n in enumerate(entry.get("attributes") or ())}
                                for rel, entry in members.items()}

    def append(self, batch: Mapping[str, Any], n: int) -> None:
        for i in range(n):
            row = {name: values[i] for name, values in batch.items()}
            name = row.get(self.key) if self.key else f"sample_{self.count:08d}"
            if not isinstance(name, str) or not name or "/" in name or name in (".", "..") or name in self.container:
                raise SchemaError(f"row {self.count}: {name!r} (field {self.key!r}) cannot name a new HDF5 group")
            self.room.ensure(sum(nbytes_of(value) for value in row.values() if value is not None))
            group = self.container.create_group(name, track_order=self.tracked)
            self.units.add(name)
            self._write_sample(group, sample_values(self.spec, row, f"row {self.count} (group {name!r})"))
            self.count += 1

    def _write_sample(self, group: Any, values: list[tuple[str, str | None, np.ndarray]]) -> None:
        """A sample group's datasets (and groups holding only attributes) in the source's order of its
        links, then the attributes in each object's order of its attributes (``unit_order``)."""
        datasets: list[tuple[str, np.ndarray | None]] = [(p, value) for p, attr, value in values if attr is None]
        # the groups inside it that hold only attributes, made in their place among the datasets
        datasets += [(path, None) for path in sorted({p for p, a, _ in values if a is not None and p})
                     if path in self.inner and not any(d == path or d.startswith(path + "/") for d, _ in datasets)]
        for path, value in sorted(datasets, key=lambda item: self._place(item[0])):
            if value is None:
                self._inner(group, path)
            else:
                self._write_dataset(group, path, value)
        attributes = [(path, attr, value) for path, attr, value in values if attr is not None]
        order = self.attribute_order
        for path, attr, value in sorted(attributes, key=lambda a: order.get(a[0], {}).get(str(a[1]), 1 << 30)):
            self._write_attribute(group, path, str(attr), value)

    def _place(self, path: str) -> tuple[int, ...]:
        """Where ``path`` comes in a sample's creation order: its place in each group on the way to it."""
        parts = path.split("/")
        return tuple(self.link_order.get("/".join(parts[:i]), {}).get(part, 1 << 30) for i, part in enumerate(parts))

    def _inner(self, group: Any, path: str) -> Any:
        """The group ``path`` inside a sample group, and the groups on the way, each made tracking creation
        order where the source's did (``unit_order``)."""
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            rel = "/".join(parts[:i])
            if rel not in group:
                group.create_group(rel, track_order=_tracks(unit_entry(self.spec, rel), None))
        return group[path]

    def _write_dataset(self, group: Any, path: str, value: np.ndarray) -> None:
        """One dataset of a sample group: as the source stored it where it is the source's, else h5py's default."""
        stored = self.spec.storage.get(f"{group.name.strip('/')}/{path}", self.spec.member_storage.get(path))
        if "/" in path:
            self._inner(group, path.rpartition("/")[0])
        if stored is not None and path in self.typed:
            dataset = create_stored(group, path, value.dtype, value.shape, stored)
            if value.size:
                _write_rows(dataset, value, 0, len(value), self.room) if value.ndim else _write_scalar(dataset, value)
        else:
            group.create_dataset(path, data=value, dtype=value.dtype)

    def _write_attribute(self, group: Any, path: str, attr: str, value: np.ndarray) -> None:
        """One attribute of a sample group (``path`` ''), of a dataset in it, or of a group inside it."""
        if path and path not in group and path not in self.inner:
            raise SchemaError(f"row {self.count}: attribute {attr!r} belongs to {path!r}, which is None")
        # the group's own, a member's, or a group's inside it (made when no dataset made it)
        owner = group if not path else group[path] if path in group else self._inner(group, path)
        note = ((unit_entry(self.spec, path) or {}).get("notes") or {}).get(attr)
        if note is None:
            owner.attrs.create(attr, data=value, dtype=value.dtype)
            return
        h5py = h5py_module()  # a padding or a bitfield: the source's type, which the value's dtype does not say
        record = text_notes(note)
        owner.attrs.create(attr, data=value, dtype=h5py.Datatype(noted(h5py.h5t.py_create(value.dtype, logical=1),
                                                                       record)))
        _rewrite_exactly(owner.attrs.get_id(attr), value)


_WRITERS: dict[str, Any] = {
    "columns": lambda handle, schema, spec, options: _ColumnsWriter(handle, schema, spec, options),
    "splits": _SplitsWriter,
    "groups": _GroupsWriter,
}
