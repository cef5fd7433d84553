"""The one check of an elastic resume, for every reader, loader and bridge that has one: what the new ranks
delivered of an epoch is the rest of it after the rows the old ranks delivered."""

from __future__ import annotations

from collections.abc import Collection, Sequence


def check_rest_of_epoch(gone: Collection[int], new: Sequence[Sequence[int]], total: int, remainder: str,
                        where: str = "") -> None:
    """``new`` (each new rank's rows of an epoch of ``total`` rows, ids ``0..total-1``) after ``gone`` (the rows
    old ranks delivered of it): ranks equal; no row again; ``'pad'``: every other row, wrapping round to
    ``ceil(rest / ranks)`` each; ``'drop'``: ``floor(rest / ranks)`` each, no row twice."""
    assert len({len(rows) for rows in new}) == 1, f"{where}ranks not equal {[len(rows) for rows in new]}"
    gone, count = set(gone), len(new)
    flat = [i for rows in new for i in rows]
    rest = set(range(total)) - gone
    assert not set(flat) & gone, f"{where}rows delivered again {sorted(set(flat) & gone)[:10]}"
    if remainder == "pad":
        assert set(flat) == rest and len(flat) == count * -(-len(rest) // count), where
    else:
        assert len(flat) == len(set(flat)) == count * (len(rest) // count) and set(flat) <= rest, where
