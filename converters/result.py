"""What every conversion path shares: the result it returns, the name of unihub's own format, the
input's size and the refusal when every record was bad (:mod:`unihub.converters.convert` and the ingest
pipeline, :mod:`unihub.converters.pipeline`, both use them)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from unihub.errors import FormatError
from unihub.formats.base import SkippedRecord
from unihub.fs import sources

UNIHUB = "unihub"


@dataclass
class ConvertResult:
    """What a conversion did."""

    source: str
    target: str
    from_format: str
    to_format: str
    rows: int
    seconds: float
    bytes_read: int = 0
    skipped: list[SkippedRecord] = field(default_factory=list)
    #: how the conversion ran where that differs from what was asked (fewer workers: too little input), and what
    #: the output does not hold as the input did (the formats' caveats and export_caveats)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        rate = self.rows / self.seconds if self.seconds > 0 else float("inf")
        text = (f"converted {self.rows:,} rows {self.from_format} -> {self.to_format} in {self.seconds:.1f} s "
                f"({rate:,.0f} rows/s): {self.target}")
        if self.notes:
            text += "; " + "; ".join(self.notes)
        if self.skipped:
            text += f"; skipped {len(self.skipped)} (bad records, datasets left out): " + "; ".join(
                f"{s.path} {s.location}: {s.reason}" for s in self.skipped[:10])
            if len(self.skipped) > 10:
                text += f"; ... {len(self.skipped) - 10} more"
        return text


def all_skipped(skipped: list[SkippedRecord]) -> FormatError:
    """The error of a conversion whose every record was skipped as bad: nothing converted is a failure."""
    first = skipped[0]
    return FormatError(f"every record was skipped as bad ({len(skipped):,}), so nothing was converted; the first: "
                       f"{first.path} {first.location}: {first.reason}", path=first.path)


def total_size(files: list[str]) -> int:
    """Bytes of the input files (one stat each: image folders have many), local paths and URLs alike: a
    remote source counted 0, so it was never converted in forked workers ("too little input")."""
    total = 0
    for path in files:
        if sources.is_url(path):
            continue
        try:
            total += os.stat(path).st_size
        except OSError:
            pass
    return total + sources.total_size([path for path in files if sources.is_url(path)])
