"""The reading options that choose what of an HDF5 file becomes rows, applied to a discovered plan.

``fields`` (names or prefixes of fields: ``images``, ``tracks`` for ``tracks.x``, ``meta/``...),
``split`` (splits to read), ``ignore_unsupported`` (leave out, listed, what cannot be stored
exactly, instead of refusing the file) and ``ignore_mismatched`` (columns: keep the datasets of the
most common length). Refusals name the file and a few of what they refuse, then how many more.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from unihub.errors import FormatError
from unihub.formats.hdf5.layout import Plan, discover, some


def plan_file(path: str, handle: Any, options: Mapping[str, Any], *, only: Iterable[str] | None = None) -> Plan:
    """The :class:`Plan` of the open file ``handle`` with every reading option applied."""
    return select(discover(path, handle, options), options, only=only)


def select(discovered: Plan, options: Mapping[str, Any], *, only: Iterable[str] | None = None) -> Plan:
    """A copy of ``discovered`` with the options ``fields``, ``split``, ``ignore_unsupported`` and
    ``ignore_mismatched`` applied: what cannot be ingested is refused. ``only``: the fields of a given
    schema; the plan keeps just those and refuses nothing else."""
    plan = dataclasses.replace(discovered, units=list(discovered.units), leaves=dict(discovered.leaves),
                               constants=list(discovered.constants), refused=dict(discovered.refused),
                               ignored={}, left_out={})
    _select(plan, options, strict=only is None)
    _select_splits(plan, options.get("split"))
    ignore_mismatched = bool(options.get("ignore_mismatched", False))
    if only is not None and not ignore_mismatched:
        _keep_only(plan, only)
    _check_lengths(plan, ignore_mismatched, warn=only is None)
    if only is not None:
        _keep_only(plan, only)
    return plan


def _keep_only(plan: Plan, names: Iterable[str]) -> None:
    wanted = set(names)
    plan.leaves = {name: leaf for name, leaf in plan.leaves.items() if name in wanted}


def matches(name: str, item: str) -> bool:
    return name == item or name.startswith((item + "/", item + ".", item + "@"))


def _select(plan: Plan, options: Mapping[str, Any], *, strict: bool) -> None:
    """Option ``fields`` (names or prefixes of fields) and ``ignore_unsupported``; refuse the rest
    (``strict``: nothing else chose the fields)."""
    wanted = options.get("fields")
    if wanted is not None:
        _select_fields(plan, [wanted] if isinstance(wanted, str) else wanted)
    elif plan.refused and options.get("ignore_unsupported", False):
        if strict:
            warnings.warn(f"{plan.path}: left out (ignore_unsupported): {some(plan.refused)}", stacklevel=4)
        plan.ignored.update(plan.refused)
        plan.refused = {}
    elif plan.refused and strict:
        raise FormatError(refusal_message(plan.path, plan.refused), path=plan.path)


def _select_fields(plan: Plan, wanted: Iterable[str]) -> None:
    """Option ``fields``: keep the fields named or prefixed by ``wanted``, the others left out (listed);
    refuse a name that matches no field or matches one that cannot be ingested."""
    chosen: set[str] = set()
    wanted = list(wanted)
    for raw in wanted:
        item = raw.strip("/")
        if item == plan.key_field:
            continue
        refused = {n: r for n, r in plan.refused.items() if matches(n, item)}
        if refused:
            raise FormatError(refusal_message(plan.path, refused), path=plan.path)
        hits = [n for n in plan.leaves if matches(n, item)]
        if not hits:
            raise FormatError(f"{plan.path}: no dataset or group {item!r}; fields: {some(plan.leaves, 10)}",
                              path=plan.path)
        chosen.update(hits)
    if not chosen:  # nothing, or only the key field: no dataset says how many rows there are
        raise FormatError(f"{plan.path}: fields={','.join(wanted)!r} selects no dataset; fields: "
                          f"{some(plan.leaves, 10)}", path=plan.path)
    plan.left_out.update({n: "not selected by fields=" for n in plan.leaves if n not in chosen})
    plan.left_out.update({n: f"not selected by fields= ({r})" for n, r in plan.refused.items()})
    plan.leaves = {n: leaf for n, leaf in plan.leaves.items() if n in chosen}
    plan.refused = {}


def refusal_message(path: str, refused: Mapping[str, str]) -> str:
    """What cannot be ingested and why (a few named, then how many more), and the ways out."""
    items = list(refused.items())
    text = "; ".join(f"{name!r}: {reason}" for name, reason in items[:5])
    if len(items) > 5:
        text += f"; and {len(items) - 5} more"
    return (f"{path}: cannot convert {len(items)} HDF5 value(s) exactly ({text}); leave them out with "
            "--option ignore_unsupported=true (they are then listed), or choose fields with --option fields=...")


def _select_splits(plan: Plan, split: Any) -> None:
    """Option ``split``: the splits to read (in the file's order)."""
    if split is None:
        return
    names = [split] if isinstance(split, str) else list(split)
    if plan.kind != "splits":
        raise FormatError(f"{plan.path}: split= selects groups of a file with one group per split, but this "
                          f"file's layout is {plan.kind!r}", path=plan.path)
    unknown = [n for n in names if n not in plan.units]
    if unknown:
        raise FormatError(f"{plan.path}: no split {some(unknown)}; its splits: {some(plan.units, 10)}",
                          path=plan.path)
    dropped = [plan.unit_path(unit) + "/" for unit in plan.units if unit not in names]
    plan.left_out.update({c: "not selected by split=" for c in plan.constants if c.startswith(tuple(dropped))})
    plan.constants = [c for c in plan.constants if not c.startswith(tuple(dropped))]
    plan.dropped = [unit for unit in plan.units if unit not in names]
    plan.units = [unit for unit in plan.units if unit in names]


def _check_lengths(plan: Plan, ignore_mismatched: bool, *, warn: bool = True) -> None:
    """Columns: the selected datasets must share one length (``ignore_mismatched`` keeps the most
    common); splits: within each split."""
    if plan.kind == "groups":
        return
    for unit in plan.units:
        lengths = {leaf.path: plan.lengths[unit, leaf.path] for leaf in plan.leaves.values()
                   if (unit, leaf.path) in plan.lengths}
        if len(set(lengths.values())) <= 1:
            continue
        where = plan.path if plan.kind == "columns" else f"{plan.path}, split {unit!r}"
        if plan.kind == "splits" or not ignore_mismatched:
            hint = (" or skip the others with --option ignore_mismatched=true (ignore_mismatched=True in "
                    "Python)") if plan.kind == "columns" else ""
            raise FormatError(mismatch_message(where, lengths) + "; choose datasets of one length with "
                              f"--option fields=...{hint}", path=plan.path)
        rows = Counter(lengths.values()).most_common(1)[0][0]
        skipped = {n: k for n, k in lengths.items() if k != rows}
        if warn:
            warnings.warn(f"{plan.path}: skipping datasets whose length is not {rows}: "
                          f"{', '.join(f'{n!r}: {k}' for n, k in list(skipped.items())[:10])}", stacklevel=4)
        for name, leaf in list(plan.leaves.items()):
            if leaf.path in skipped:
                plan.ignored[name] = f"{skipped[leaf.path]} rows, not {rows} (ignore_mismatched)"
                del plan.leaves[name]


def mismatch_message(where: str, lengths: Mapping[str, int]) -> str:
    """``x.h5: HDF5 datasets differ in length along the first axis (10 rows: 'a', 'b'; 7 rows: 'c')``."""
    by_length: dict[int, list[str]] = {}
    for name, n in lengths.items():
        by_length.setdefault(n, []).append(name)
    groups = sorted(by_length.items())
    parts = "; ".join(f"{n} rows: {some(names)}" for n, names in groups[:6])
    if len(groups) > 6:
        parts += f"; and {len(groups) - 6} more lengths"
    return f"{where}: HDF5 datasets differ in length along the first axis ({parts})"
