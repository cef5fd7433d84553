"""The contract every foreign format module implements, and the registry that finds them.

A foreign format (TFRecord, HDF5, WebDataset tar shards, image folders, ...) is one module
in ``formats/`` defining a :class:`ForeignFormat` subclass decorated with
:func:`register_format`. It knows three things, and nothing about the pipeline around it:

- :meth:`ForeignFormat.infer_schema`: a Unischema for the source, found by scanning records;
- :meth:`ForeignFormat.read_batches`: the records as column batches of that schema
  (image fields keep their encoded bytes; nothing is re-encoded);
- :meth:`ForeignFormat.write`: export column batches of a Unischema back to the format;
- :meth:`ForeignFormat.reference_records` / :meth:`ForeignFormat.native_records`: the records
  as the format's own library reads them, and a unihub dataset's rows in that same form, so
  that ``unihub verify`` checks a conversion against the source itself, not against unihub's
  own reading of it.

Each format declares the options it takes in :attr:`ForeignFormat.OPTIONS` (for reading) and
:attr:`ForeignFormat.WRITE_OPTIONS` (for :meth:`~ForeignFormat.write`): the CLI's
``--option KEY=VALUE`` parses them with these declarations, ``unihub convert --help`` lists
them, and an option a format does not take is refused, never silently ignored.

``converters/`` composes these with :func:`unihub.write_dataset` and the readers.
"""

from __future__ import annotations

import gc
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from unihub.errors import FormatError, SchemaError, UnsupportedFormatError
from unihub.fs import sources as fsrc
from unihub.registry import Registry
from unihub.runtime.interrupts import deferred
from unihub.runtime.lifeline import die_with_parent
from unihub.runtime.memory import memory_budget
from unihub.schema.unischema import Unischema

if TYPE_CHECKING:
    from unihub.fs.outputs import Outputs
    from unihub.schema.image_checks import ValidateImages

FORMATS: Registry[type[ForeignFormat]] = Registry("format")
T = TypeVar("T")

OnError = Literal["raise", "skip"]
#: A column batch: field name -> one value per row (numpy array, a list for ragged/bytes/None, or an
#: Arrow array of bytes/text a format read straight from its input buffer).
ColumnBatch = Mapping[str, Any]


def register_format(name: str, *, aliases: tuple[str, ...] = (), extensions: tuple[str, ...] = ()):
    """Class decorator: register a format under ``name`` (and aliases, file extensions)."""

    def add(cls: type[ForeignFormat]) -> type[ForeignFormat]:
        cls.format_name = name
        FORMATS.add(name, cls, aliases=aliases, extensions=extensions)
        return cls

    return add


@dataclass(frozen=True)
class FormatOption:
    """One option a format takes: its help line, and how the CLI's ``KEY=VALUE`` text becomes a value."""

    help: str
    parse: Callable[[str], Any] = str


def parse_bool(text: str) -> bool:
    """``true/yes/1/on`` or ``false/no/0/off`` (any case)."""
    lowered = text.strip().lower()
    if lowered in ("true", "yes", "1", "on"):
        return True
    if lowered in ("false", "no", "0", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def parse_list(text: str) -> list[str]:
    """Comma-separated items: ``a,b/c`` -> ``['a', 'b/c']``; empty text is no item. An empty item is refused
    (``classes=cat,,dog`` dropped one and gave dog cat's next label)."""
    if not text.strip():
        return []
    items = [item.strip() for item in text.split(",")]
    if "" in items:
        raise ValueError(f"item {items.index('') + 1} of {text!r} is empty")
    return items


def parse_choice(*choices: str) -> Callable[[str], str]:
    """A parser accepting one of ``choices`` (case-insensitive), returned as spelled in ``choices``."""

    def parse(text: str) -> str:
        for choice in choices:
            if text.strip().lower() == choice.lower():
                return choice
        raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")

    parse.__name__ = "|".join(choices)
    return parse


def check_options(fmt: type[ForeignFormat], options: Mapping[str, Any], *, writing: bool) -> None:
    """Refuse options ``fmt`` does not take (for writing, or reading), naming the ones it does."""
    declared = fmt.WRITE_OPTIONS if writing else fmt.OPTIONS
    unknown = sorted(set(options) - set(declared))
    if unknown:
        verb = "writing" if writing else "reading"
        valid = ", ".join(sorted(declared)) or "none"
        raise UnsupportedFormatError(f"{fmt.format_name} takes no option {', '.join(map(repr, unknown))} when "
                                     f"{verb}; its {verb} options: {valid}")


def parse_options(fmt: type[ForeignFormat], pairs: Iterable[str], *, writing: bool) -> dict[str, Any]:
    """``['KEY=VALUE', ...]`` (the CLI's ``--option``) -> typed options of ``fmt``, each checked."""
    declared = fmt.WRITE_OPTIONS if writing else fmt.OPTIONS
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise UnsupportedFormatError(f"--option takes KEY=VALUE, got {pair!r}")
        check_options(fmt, {key: None}, writing=writing)
        try:
            options[key] = declared[key].parse(text)
        except ValueError as exc:
            raise UnsupportedFormatError(f"{fmt.format_name} option {key}: {exc}") from None
    return options


@dataclass
class SkippedRecord:
    """A record ``on_error='skip'`` left out: where it was and why."""

    path: str
    location: str  # "record 17", "offset 4096", "key 000123", "dataset 'x'" ...
    reason: str


class SchemaOutgrown(Exception):
    """A single-pass read met records its provisional schema cannot store as the whole input
    needs (a list longer than the sample's, a feature the sample lacked). Not an input error:
    ``convert`` starts over with ``schema``, or with a full scan when that is None."""

    def __init__(self, reason: str, schema: Unischema | None = None) -> None:
        super().__init__(reason, schema)
        self.reason, self.schema = reason, schema

    def __str__(self) -> str:
        return self.reason


def same_storage(a: Unischema, b: Unischema) -> bool:
    """True when data written with schema ``a`` is stored exactly as ``b`` would store it
    (same columns, Arrow types and nullability), so a footer restamp turns one into the other."""
    return a.as_parquet_schema(with_metadata=False).equals(b.as_parquet_schema(with_metadata=False))


@dataclass
class ReadReport:
    """What a read saw: records read and skipped (filled in while batches are produced)."""

    records: int = 0
    skipped: list[SkippedRecord] = field(default_factory=list)
    #: what an observing read saw, for ForeignFormat.refine_schema (format-defined, picklable)
    observed: Any = None
    #: input bytes consumed so far, where the format counts them (for progress and ETA)
    bytes_read: int = 0
    #: files passed over as no record of the format (an image folder's ``notes.txt``), relative to the
    #: source; each is in ``skipped`` too. Said in one warning at the end of a read (see ``in_task``)
    left_out: list[str] = field(default_factory=list)


class ForeignFormat(ABC):
    """A source (or sink) in a foreign format; see the module docstring.

    ``sources`` are files, directories or glob/brace patterns, as the format allows.
    ``options`` are format-specific keyword options (e.g. ``compression='GZIP'``).
    """

    format_name: ClassVar[str] = ""
    #: the options reading takes (the constructor's ``**options``): name -> :class:`FormatOption`
    OPTIONS: ClassVar[Mapping[str, FormatOption]] = {}
    #: the options :meth:`write` takes
    WRITE_OPTIONS: ClassVar[Mapping[str, FormatOption]] = {}
    #: what :meth:`reference_records` reads with, for verify's report ("h5py", "tarfile", ...)
    REFERENCE_READER: ClassVar[str] = ""
    #: a source folder reads every subfolder as data (an image folder's classes), so ``convert`` writes no
    #: output inside it in any format (one would be a class of its next read)
    SUBFOLDERS_ARE_DATA: ClassVar[bool] = False

    def __init__(self, sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], **options: Any) -> None:
        check_options(type(self), options, writing=False)
        self.sources = [os.fspath(s) for s in ([sources] if isinstance(sources, (str, os.PathLike)) else sources)]
        self.options = options
        self.report = ReadReport()
        #: a conversion task's read (``run_task`` sets it): what sums up the whole source, the files it leaves
        #: out, is the driver's to record and say once for all its tasks (not once per worker)
        self.in_task = False
        #: processes a format may use for its scans (``convert(workers=N)`` sets it); the results
        #: must not depend on it
        self.workers = 1
        #: what schema scans do with a bad record: ``'skip'`` leaves it out of the inference (``convert``
        #: sets it from ``on_error``, so ``--skip-corrupt`` holds before the read too)
        self.on_error: OnError = "raise"
        #: single pass (see :meth:`provisional_schema`): read_batches does not hold records to the
        #: schema's details but leaves what it saw in ``report.observed`` for :meth:`refine_schema`
        self.observe = False
        #: how image values are checked before they are stored, ``'header'``, ``'full'`` or ``'none'``
        #: (:mod:`unihub.schema.image_checks`; ``convert(validate_images=...)`` sets it)
        self.validate_images: ValidateImages = "header"
        #: most bytes of rows :meth:`read_batches` gathers into one batch: a batch ends at ``batch_size``
        #: rows or at this many bytes, whichever comes first (:mod:`unihub.runtime.memory`; ``convert`` sets it)
        self.batch_bytes: int = memory_budget().batch_bytes

    @classmethod
    def detect(cls, path: str) -> bool:
        """True when ``path`` looks like this format (by extension, then by content)."""
        return False

    @abstractmethod
    def infer_schema(self, *, sample_records: int | None = None) -> Unischema:
        """A Unischema for the source, from ``sample_records`` records (None: all)."""

    @abstractmethod
    def read_batches(self, schema: Unischema, *, batch_size: int = 256,
                     on_error: OnError = "raise") -> Iterator[ColumnBatch]:
        """Column batches of ``schema``, each of at most ``batch_size`` rows and about
        :attr:`batch_bytes` bytes (a batch ends at either; a row is never split); bad records raise
        :class:`FormatError` naming file and record/offset/key, or with ``on_error='skip'`` are
        counted in :attr:`report`."""

    def metadata(self) -> dict[str, Any]:
        """Extra JSON-able metadata to keep with the converted dataset (class names, attributes)."""
        return {}

    def prepare(self, schema: Unischema) -> Unischema | None:
        """Called once with the schema a conversion reads with (inferred or given), before
        :meth:`metadata` and the read: a format settles here what reading with it needs and records
        it in :attr:`options` (conversion tasks get those), e.g. TFRecord's feature-list fields.
        Returns the schema to read with instead where the source needs a field more to give itself
        back (TFRecord's ``__feature_order__``), else None."""
        return None

    def provisional_schema(self) -> Unischema | None:
        """A schema to start reading with before every record is scanned, or None (infer first).

        ``convert`` then reads the input once with :attr:`observe` set and calls
        :meth:`refine_schema` with every ``report.observed``. When the refined schema stores
        data differently (:func:`same_storage`), or a read raises :class:`SchemaOutgrown` on a
        record the provisional schema cannot hold, the conversion starts over with the full
        schema, so the result never depends on the sample.
        """
        return None

    def refine_schema(self, observations: Sequence[Any]) -> Unischema:
        """The schema from what read_batches observed (one entry per reader); see provisional_schema."""
        raise NotImplementedError(f"{type(self).__name__} has no single-pass schema")

    def files(self) -> list[str]:
        """The input files, expanded from :attr:`sources` (sorted, deterministic)."""
        return expand_sources(self.sources)

    def subset(self, files: Sequence[str]) -> ForeignFormat:
        """This source reading only ``files`` (some of :meth:`files`), as itself would read them: what
        ``convert --append`` converts of a source whose other files are in the dataset already."""
        return type(self)(list(files), **self.options)

    def append_conflict(self, extra: Mapping[str, Any]) -> str | None:
        """Why this source's rows cannot be added to a dataset whose ``unihub.extra`` metadata is ``extra``
        although their schema fits (a label index that would change meaning), or None where they can."""
        return None

    @property
    def where(self) -> str:
        """The sources for messages: ``a.tfrecord``, or ``a.tfrecord, b.tfrecord and 8 more``."""
        shown = ", ".join(self.sources[:2])
        return shown + (f" and {len(self.sources) - 2} more" if len(self.sources) > 2 else "")

    @classmethod
    @abstractmethod
    def write(cls, target: str | Outputs, schema: Unischema, batches: Iterable[ColumnBatch],
              **options: Any) -> list[str]:
        """Export column batches of ``schema`` to ``target`` in this format; returns the files written.
        ``target`` is a local path, or :class:`~unihub.fs.outputs.Outputs` on any filesystem
        (what ``convert`` gives: an export staged there and committed as one)."""

    @classmethod
    def export_options(cls, extra: Mapping[str, Any], schema: Unischema) -> dict[str, Any]:
        """Write options that follow from a dataset's ``unihub.extra`` metadata (what its source was:
        class names, a TFRecord payload kind), so that an ingest exported back gives the source again.
        ``schema`` is what is being written (metadata may name fields a narrower schema dropped).
        Options the user gives override these."""
        return {}

    @classmethod
    def export_caveats(cls, schema: Unischema, options: Mapping[str, Any]) -> list[str]:
        """What an export of ``schema`` with write ``options`` does not hold as the dataset does (a TFRecord
        Example's float32 for float64 fields): said in the conversion's summary (``ConvertResult.notes``)."""
        return []

    def caveats(self) -> list[str]:
        """What an export of this ingest will not give back exactly, known once the records are read
        (a TFRecord's records disagreeing on their features' order): said in the conversion's summary."""
        return []

    @classmethod
    def written_by_unihub(cls, fs: Any, path: str) -> bool:
        """Whether the file at ``path`` (on the pyarrow filesystem ``fs``) is an export unihub wrote, told
        from a mark the format keeps (an attribute, a header): ``--overwrite`` replaces only such files
        (:mod:`unihub.store.ownership`). Formats whose files record no writer say False."""
        return False

    # -- verify: the format's own reading ---------------------------------------------------
    def reference_records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every record as the format's *own* library reads it (TensorFlow or the protobuf runtime,
        h5py, tarfile, the file bytes), never through unihub's parsers: ``(where, record)`` in the
        order :meth:`read_batches` gives rows, ``where`` naming file and record for messages.

        A record is a dict of plain values (bytes, str, numbers, numpy arrays, lists and dicts of
        them) keyed by the source's own names. ``unihub verify`` compares these with
        :meth:`native_records` of the converted dataset, value by value and bit by bit.
        """
        raise UnsupportedFormatError(f"{self.format_name} cannot be verified against its own reader yet")

    @classmethod
    def native_records(cls, schema: Unischema, rows: Iterable[Mapping[str, Any]],
                       extra: Mapping[str, Any], **options: Any) -> Iterator[dict[str, Any]]:
        """The rows of a unihub dataset (``{field name: value}``, images as stored bytes) as
        :meth:`reference_records` would give the records an export of them holds; ``extra`` is the
        dataset's ``unihub.extra`` metadata, ``options`` the reading options of the other side."""
        raise UnsupportedFormatError(f"{cls.format_name} cannot be verified against its own reader yet")

    def reference_extras(self) -> dict[str, Any]:
        """What the source holds beside its records (attributes, datasets that are not rows, empty
        groups, dtypes that the records' form does not show), read by the format's own library:
        ``{name: value}``, each name saying what and where (``"attribute 'version' of '/'"``). ``unihub
        verify`` compares these with :meth:`native_extras` after the records, name by name, so that
        what a conversion keeps in ``unihub.extra`` is checked too. Default: nothing beside the records."""
        return {}

    @classmethod
    def native_extras(cls, schema: Unischema, extra: Mapping[str, Any], **options: Any) -> dict[str, Any]:
        """What an export of a unihub dataset (``schema``, ``unihub.extra`` metadata ``extra``) writes
        beside its records, in the form of :meth:`reference_extras`; ``options`` as for
        :meth:`native_records`. Default: nothing."""
        return {}

    def written_options(self) -> dict[str, Any]:
        """The write options the source says it was written with (unihub's own exports record them),
        called after :meth:`prepare`: verify passes them to :meth:`native_records` and
        :meth:`native_extras` (under the reading options given), so that a dataset is projected the
        way *that* file was written. Default: none."""
        return {}


def check_on_error(on_error: Any) -> None:
    """Refuse an ``on_error`` other than ``'raise'`` or ``'skip'``."""
    if on_error not in ("raise", "skip"):
        raise SchemaError(f"on_error must be 'raise' or 'skip', got {on_error!r}")


def python_columns(batch: ColumnBatch) -> dict[str, Any]:
    """``batch`` with its Arrow columns as Python lists, for writers that go value by value."""
    import pyarrow as pa

    return {name: values.to_pylist() if isinstance(values, pa.Array) else values for name, values in batch.items()}


def map_in_workers(fn: Callable[[Any], T], items: Sequence[Any], workers: int) -> list[T]:
    """``[fn(item) for item in items]`` in ``workers`` forked processes (``fn`` and items picklable)."""
    if workers <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    with process_pool(min(workers, len(items))) as pool:
        with frozen_for_fork():  # the workers start at the first submit
            futures = [pool.submit(fn, item) for item in items]
        return [future.result() for future in futures]


def process_pool(workers: int) -> Any:
    """A ``ProcessPoolExecutor`` of ``workers`` forked processes (spawned where fork is missing),
    which start at the first submit (submit inside :func:`frozen_for_fork`).
    The workers die with this process (:mod:`unihub.runtime.lifeline`): a killed conversion leaves none."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method),
                               initializer=die_with_parent, initargs=(os.getpid(),))


@contextmanager
def frozen_for_fork() -> Iterator[None]:
    """Leave the objects that exist now out of garbage collection while workers are forked (and, in
    them, for good): a worker's collection touches every object it tracks, and each touch of a page
    shared with this process copies it (copy-on-write), which for a process holding much costs
    every worker tens of milliseconds. SIGINT and SIGTERM wait until the workers have started
    (:func:`unihub.runtime.interrupts.deferred`)."""
    gc.freeze()
    try:
        with deferred():  # a signal landing while the pool starts its threads would leave one unjoinable
            yield
    finally:
        gc.unfreeze()


def expand_sources(sources: Sequence[str]) -> list[str]:
    """Files named by paths, directories (their files, recursively), globs and ``{a..b}`` braces, on
    any filesystem (:mod:`unihub.fs.sources`: URLs are listed through theirs and returned as URLs)."""
    files: list[str] = []
    for source in sources:
        for pattern in expand_braces(fsrc.without_query(source)):  # a query holds for the files listed
            if fsrc.isdir(pattern):
                for root, dirs, names in fsrc.walk(pattern):
                    dirs[:] = [d for d in dirs if not d.startswith((".", "_"))] if fsrc.is_url(pattern) else dirs
                    files.extend(f"{root.rstrip('/')}/{n}" if fsrc.is_url(root) else os.path.join(root, n)
                                 for n in names if not n.startswith((".", "_")))
            elif any(c in pattern for c in "*?["):
                matched = fsrc.glob(pattern)
                if not matched and fsrc.is_url(pattern):
                    raise FormatError(f"{pattern}: no file matches", path=pattern)
                files.extend(matched)
            elif fsrc.exists(pattern):
                files.append(pattern)
            else:
                raise FormatError(f"{pattern}: no such file or directory", path=pattern)
    return unique_files(files)


def unique_files(files: Sequence[str]) -> list[str]:
    """``files`` sorted, each file once however it was spelt (``tf/a``, ``./tf/a``, an absolute path):
    a file named twice in a source list would otherwise be read, and its rows stored, twice."""
    unique = {file if fsrc.is_url(file) else os.path.abspath(file): file for file in reversed(files)}
    return sorted(unique.values())


def expand_braces(pattern: str) -> list[str]:
    """``shard-{000..002}.tar`` -> the three names; ``{a,b}`` alternatives too (webdataset's syntax)."""
    import re

    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    head, tail, body = pattern[:match.start()], pattern[match.end():], match.group(1)
    ranged = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if ranged:
        lo, hi = ranged.groups()
        width = len(lo) if lo.startswith("0") else 0
        options = [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    else:
        options = body.split(",")
    return [p for option in options for p in expand_braces(head + option + tail)]


def detect_format(path: str) -> str | None:
    """The registered format name that claims ``path``, by extension first, then by content."""
    import unihub.formats.builtin  # noqa: F401  (registers every format; start-up cost: 0.1 s)

    base = expand_braces(fsrc.without_query(os.fspath(path)))[0]  # its query (endpoint_override=...) kept for the bucket
    if any(c in base for c in "*?["):  # a glob: judge by the first file it matches
        base = next(iter(fsrc.glob(base)), base)
    parts = os.path.basename(base).split(".")
    for ext in (os.path.splitext(base)[1], "." + ".".join(parts[-2:]) if len(parts) > 2 else ""):
        name = FORMATS.by_extension(ext) if ext else None
        if name is not None:
            return name
    for name in FORMATS:
        if FORMATS.get(name).detect(base):
            return name
    return None
