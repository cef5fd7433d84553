"""Which layout an HDF5 file has: columns, splits (a group per split) or groups (a group per sample).

A unihub export says its layout in the root attribute ``unihub.layout``. Otherwise
(``layout='auto'``) unihub looks for sibling groups with members in common, at the root or below a
chain of single child groups. They are samples when there are more than :data:`MAX_SPLITS` of
them, their names are numbered alike (``sample_0017``), or a member is a scalar or members differ
in length within a group; otherwise, when every dataset of the file has the same length, the file
is plain columns (``/images/data``, ``/labels/data``); otherwise the groups are splits. Sibling
groups holding nothing at all are samples too (with no members), never splits. A wrong
guess loses nothing (each reading keeps every value), and ``layout=...`` overrides it.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from unihub.errors import FormatError
from unihub.formats.hdf5.dtypes import h5py_module
from unihub.schema.metadata_json import parse_json

LAYOUTS = ("auto", "columns", "groups", "splits")
#: more sibling groups than this are samples, never splits
MAX_SPLITS = 16
LAYOUT_ATTR = "unihub.layout"


def detect_layout(path: str, handle: Any, layout: str) -> tuple[str, str, list[str]]:
    """``(kind, container, unit names)``; see the module docstring."""
    if layout not in LAYOUTS:
        raise FormatError(f"{path}: layout must be one of {', '.join(LAYOUTS)}, got {layout!r}", path=path)
    recorded = recorded_layout(handle)
    if layout == "auto" and recorded is not None:
        kind, container = recorded.get("kind", "columns"), recorded.get("container", "")
        if kind == "columns":
            return "columns", "", [""]
        base = handle[container] if container else handle
        outside = set(recorded.get("not_units") or ())  # groups the export wrote beside its units
        return kind, container, [n for n in child_groups(base) if n not in outside]
    if layout == "columns":
        return "columns", "", [""]
    found = _sibling_groups(handle)
    if found is None:
        if layout != "auto":
            raise FormatError(f"{path}: layout={layout} needs sibling groups with datasets in common "
                              "(one per sample or per split); found none", path=path)
        return "columns", "", [""]
    container, units = found
    base = handle[container] if container else handle
    if layout == "splits" or (layout == "auto" and not _looks_like_samples(base, units)):
        if layout == "auto" and len(_first_axes(handle)) <= 1:
            return "columns", "", [""]
        return "splits", container, units
    return "groups", container, _with_empty_samples(base, units)


def _with_empty_samples(base: Any, units: list[str]) -> list[str]:
    """The samples and, in their order, the sibling groups holding nothing at all: samples with no
    members (a row of nulls, their attributes as fields), never left out."""
    groups = set(child_groups(base))
    return [n for n in base if n in units or (n in groups and not len(base[n]))]


def child_groups(group: Any) -> list[str]:
    """The names of the groups in ``group`` (h5py's order) reached by hard links: a soft link to a
    group is another name of it, kept as a link, never a second unit."""
    h5g = h5py_module().h5g  # one call a name, not following links: this runs on every sample group
    found = []
    for name in group:
        info = h5g.get_objinfo(group.id, name.encode("utf-8", "surrogateescape"), follow_link=False)
        if info.type == h5g.GROUP and (info.nlink == 1 or _first_name(group, name)):
            found.append(name)
    return found


def _first_name(group: Any, name: str) -> bool:
    """True when ``name`` in ``group`` is the first name of a group that has several (a second hard link
    to a group is another name of it, kept as a link, never a second unit)."""
    path = "/".join(p for p in (group.name.strip("/"), name) if p)
    return object_paths(group.file, set()).get(object_key(group[name])) == path


# -- objects and their names: one visit of the file's links ---------------------------------------
def object_key(obj: Any) -> int:
    """What names one object of a file whatever hard link reaches it: its address."""
    return int(h5py_module().h5o.get_info(obj.id).addr)


def visit_links(handle: Any) -> list[tuple[str, int, int]]:
    """Every link of the file, ``(path, link type, address of the object for a hard link)``, in the
    order of HDF5's visit (by name, a group's links before the next link of its parent), which h5py's
    ``visititems`` follows too; a group reached by two names is walked once. One pass, nothing opened:
    this runs on every link of files of many thousand samples."""
    out: list[tuple[str, int, int]] = []

    def note(name: bytes, info: Any) -> None:  # returning None goes on with the visit
        out.append((name.decode("utf-8", "surrogateescape"), info.type, info.u))

    handle.id.links.visit(note, info=True)
    return out


def object_paths(handle: Any, units: set[str], links: list[tuple[str, int, int]] | None = None) -> dict[int, str]:
    """The first name each object has (``''``: the root), by :func:`object_key`: its first in
    :func:`visit_links` below one of ``units`` (the splits or samples, whose members are read as rows
    by their names there), else its first (the name h5py's ``visititems`` gives it). Every other name
    of an object is a link (``hdf5_layout.find_links``)."""
    h5l = h5py_module().h5l
    paths = {object_key(handle): ""}
    for path, kind_, address in visit_links(handle) if links is None else links:
        if kind_ != h5l.TYPE_HARD:
            continue
        first = paths.setdefault(address, path)
        if first != path and units and below_any(path, units) and not below_any(first, units):
            paths[address] = path
    return paths


def below_any(path: str, roots: set[str]) -> bool:
    """True when ``path`` is one of ``roots`` or below one (one set lookup per level: ``roots`` may be
    thousands of sample groups)."""
    parts = path.split("/")
    return any("/".join(parts[:i]) in roots for i in range(1, len(parts) + 1))


def recorded_json(obj: Any, attr: str) -> Any:
    """The JSON value of ``obj``'s attribute ``attr`` as a unihub export wrote it, or None where there is none.
    Anything else under that name (not JSON text, nested past Python's recursion limit) is a FormatError naming
    the file, the object and the attribute."""
    text = obj.attrs.get(attr)
    if text is None:
        return None
    try:
        return parse_json(text)
    except (ValueError, TypeError) as exc:  # TypeError: not a string (a number, an array)
        raise corrupt_record(obj, attr, exc) from None


def corrupt_record(obj: Any, attr: str, reason: Any) -> FormatError:
    """The error for an attribute ``attr`` of ``obj`` that is not what a unihub export writes there."""
    path = obj.file.filename
    return FormatError(f"{path}: attribute {attr!r} of {obj.name} is not what a unihub export writes there "
                       f"({str(reason)[:200]}); delete the attribute to read the file by its structure", path=path)


def recorded_layout(handle: Any) -> dict[str, Any] | None:
    """What a unihub export recorded of its layout (kind, container, key field, images), or None."""
    recorded = recorded_json(handle, LAYOUT_ATTR)
    if recorded is None:
        return None
    if not isinstance(recorded, dict):
        raise corrupt_record(handle, LAYOUT_ATTR, f"a JSON {type(recorded).__name__}, not an object")
    kind, container = recorded.get("kind", "columns"), recorded.get("container", "")
    if kind not in LAYOUTS[1:] or not isinstance(container, str) \
            or (kind != "columns" and container and not isinstance(handle.get(container), h5py_module().Group)):
        raise corrupt_record(handle, LAYOUT_ATTR, f"layout {kind!r} in {container!r}")
    wrong = [key for key in ("key_field", "images") if not isinstance(recorded.get(key), (str, type(None)))]
    not_units = recorded.get("not_units") or []
    if wrong or not (isinstance(not_units, list) and all(isinstance(n, str) for n in not_units)):
        raise corrupt_record(handle, LAYOUT_ATTR, f"the values of {wrong or ['not_units']}")
    return recorded


def _sibling_groups(handle: Any) -> tuple[str, list[str]] | None:
    """The first group (the root, or down a chain of single child groups) with at least two child
    groups that share datasets: ``(its path, the alike groups' names in h5py's order)``."""
    group, path = handle, ""
    while True:
        children = child_groups(group)
        if len(children) == 1:
            group, path = group[children[0]], "/".join(p for p in (path, children[0]) if p)
            continue
        if len(children) < 2:
            return None
        members = {name: _member_names(group[name]) for name in children}
        common = Counter(members.values()).most_common(1)[0][0]
        alike = [name for name in children if members[name] & common]
        return (path, alike) if len(alike) >= 2 and common else None


def _looks_like_samples(base: Any, units: list[str]) -> bool:
    """Many groups, numbered names, a scalar member or members of different lengths: samples."""
    if len(units) > MAX_SPLITS:
        return True
    numbered = [re.fullmatch(r"(.*?)(\d+)", name) for name in units]
    if all(numbered) and len({m.group(1) for m in numbered if m}) == 1:
        return True
    for name in units:
        shapes = [d.shape for d in datasets_below(base[name]).values()]
        if any(not shape for shape in shapes) or len({shape[0] for shape in shapes}) > 1:
            return True
    return False


def _first_axes(handle: Any) -> set[int]:
    return {d.shape[0] for d in datasets_below(handle).values() if d.shape}


def _member_names(group: Any) -> frozenset[str]:
    """The names of everything below ``group`` (h5py objects are not opened: this runs on every group)."""
    names: list[str] = []
    group.visit(names.append)
    return frozenset(names)


def members_below(group: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every dataset and every group below ``group`` by relative path, in h5py's name order (one visit)."""
    h5py = h5py_module()
    datasets: dict[str, Any] = {}
    groups: dict[str, Any] = {}

    def note(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset):
            datasets[name] = obj
        elif isinstance(obj, h5py.Group):
            groups[name] = obj

    group.visititems(note)
    return datasets, groups


def datasets_below(group: Any) -> dict[str, Any]:
    """Every dataset below ``group`` by relative path, in h5py's name order."""
    h5py = h5py_module()
    found: dict[str, Any] = {}
    group.visititems(lambda name, obj: found.__setitem__(name, obj) if isinstance(obj, h5py.Dataset) else None)
    return found
