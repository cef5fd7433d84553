"""Look at a dataset before training on it: ``unihub show DATASET`` and ``unihub.show(url)``.

(The package is ``viewer``, not ``show``: ``unihub.show`` is the function, and a subpackage of that
name would replace it on ``unihub`` once imported.)

One self-contained HTML page (no network needed to open it): the schema with codecs; rows, files,
row groups, bytes and the row-group sizes; the conversion's provenance (``unihub.extra``: source
format and files, skipped records with reasons); a grid of sampled rows, their images as thumbnails
with the row's other values under each; per-field statistics. Modules: :mod:`~unihub.viewer.sample`
(the one streaming pass and the choice of rows), :mod:`~unihub.viewer.stats` (bounded accumulators),
:mod:`~unihub.viewer.thumbs` (images -> ``data:`` URIs), :mod:`~unihub.viewer.report` (gathering) and
:mod:`~unihub.viewer.html` (rendering, every data string escaped).

>>> report = unihub.show("/data/train", rows=24, where="label == 3")   # doctest: +SKIP
>>> report.save("train.html")                                            # doctest: +SKIP
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from unihub.errors import DatasetNotFoundError, FormatError, InvalidArgumentError, UnsupportedFormatError
from unihub.fs import atomic, sources
from unihub.store.dataset import open_dataset
from unihub.viewer.describe import foreign_source
from unihub.viewer.html import render
from unihub.viewer.report import Report, gather
from unihub.viewer.sample import Sampling

if TYPE_CHECKING:
    import pyarrow.compute as pc

#: rows a report shows unless told
DEFAULT_ROWS = 16
#: the file ``unihub show`` writes unless told
DEFAULT_REPORT = "report.html"
#: the most rows a report shows (each row's images are embedded in the page)
MAX_ROWS = 1000


@dataclass
class ShowReport:
    """A dataset's report: shown inline by Jupyter (``_repr_html_``), written by :meth:`save`."""

    report: Report
    html: str

    def _repr_html_(self) -> str:
        return self.html

    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the page to ``path`` (a local file, replaced atomically; where ``path`` is a link, the file
        it names); returns the path. A device or pipe (``/dev/stdout``) is written into, never replaced,
        and a directory is refused: replacing it would remove it and everything in it."""
        target = os.fspath(path)
        refuse_directory(target)
        if os.path.exists(target) and not os.path.isfile(target):
            with open(target, "w", encoding="utf-8") as out:
                out.write(self.html)
            return target
        final = os.path.realpath(target)
        temporary = atomic.sibling(final)
        try:
            with open(temporary, "w", encoding="utf-8") as out:
                out.write(self.html)
            atomic.replace(temporary, final)
        except BaseException:
            if os.path.lexists(temporary):
                os.remove(temporary)
            raise
        return target


def refuse_directory(path: str) -> None:
    """Raise ``IsADirectoryError`` where ``path``, where a report is to be written, is a directory."""
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)


def show(url: str | os.PathLike[str], *, rows: int = DEFAULT_ROWS, seed: int = 0, first: bool = False,
         where: str | pc.Expression | None = None, storage_options: dict[str, Any] | None = None,
         progress: Callable[[int, int], None] | None = None) -> ShowReport:
    """A report of the dataset at ``url`` (a directory, Parquet file or URL: unihub, Petastorm or plain
    Parquet): ``rows`` rows at random with ``seed``, or the ``first`` ones, of those matching ``where``
    (pyarrow's expression syntax or DNF JSON as text, see :mod:`unihub.readers.filter_text`, or a
    ``pyarrow.compute.Expression``). The statistics cover the same rows, read one row group at a time.
    ``progress(done, total)`` is called after each row group.
    """
    if isinstance(rows, bool) or not isinstance(rows, int) or not 0 <= rows <= MAX_ROWS:
        raise InvalidArgumentError(f"rows must be an integer from 0 to {MAX_ROWS}, got {rows!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidArgumentError(f"seed must be a non-negative integer, got {seed!r}")
    text = os.fspath(url)
    try:
        store = open_dataset(text, storage_options=storage_options)
    except (FormatError, DatasetNotFoundError) as exc:  # an image folder is no broken Parquet: say what it is
        with sources.using(storage_options):
            foreign = foreign_source(text, "show")
        if foreign is None:
            raise
        raise UnsupportedFormatError(foreign) from exc
    store.require_fields(store.schema.fields)  # before the pass: statistics read every column
    report = gather(store, text, Sampling(rows, seed, first), where=where, progress=progress)
    return ShowReport(report, render(report))


__all__ = ["ShowReport", "refuse_directory", "show"]
