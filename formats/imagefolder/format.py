"""Image folders (torchvision ``ImageFolder`` style) in and out of unihub.

On disk, one root directory in one of two layouts::

    root/                        root/
      cat/                         0001.png
        0001.png                   0002.jpg
        sub/0002.jpg               ...
      dog/
        0003.jpeg
      ...
    class layout                 flat layout

- **Class layout** (the root has subdirectories): the classes are the sorted names of the
  root's subdirectories, as torchvision's ``find_classes`` lists them (empty ones included, so
  label indices agree), but for hidden ones and links to folders not followed, which torchvision
  counts as classes (a ``.ipynb_checkpoints/`` in the root is torchvision's class 0 and shifts
  its other labels by one); each class folder is read recursively. Files lying
  directly in the root belong to no class: they are left out with a warning and listed in
  :attr:`~unihub.formats.base.ForeignFormat.report`. Fields: ``image``, ``label``
  (int64, the index into ``metadata()["classes"]``) and ``path``.
- **Flat layout** (no subdirectories): ``image`` and ``path`` only, no label.

Names starting with ``.`` (``.DS_Store``, ``.ipynb_checkpoints/``) are ignored. Records come
in torchvision's order: by class, then directory, then file name.

Only regular files are read, and none larger than ``max_file_mb`` (default
:data:`~unihub.images.decoders.MAX_IMAGE_FILE_BYTES`, 256 MiB), checked before reading. Symbolic
links are treated as ``tar`` and ``rsync`` treat them unless asked to follow (``follow_links=True``,
``--follow-links``, as ``tar -h`` / ``rsync -L``):

- a link to a regular file inside the folder is read, as the file it names (torchvision reads it too);
- a link to a folder is not descended into (its files are read where they lie): left out with a warning
  and recorded in the report; with ``follow_links=True`` it is, unless it leads back into a folder the
  walk is inside (a loop: left out and recorded), so a walk always ends;
- a link leading out of the folder raises :class:`~unihub.errors.FormatError` naming it (``on_error='skip'``
  leaves it out, recorded); ``follow_links=True`` reads through it;
- a special file (FIFO, socket, device, also through a link) is never opened: named like a corrupt image
  when its name says PNG/JPEG (or another image format), else left out like any other non-image;
- a file over the size limit is named like a corrupt image, unless its first bytes show it is no image.

Images are recognised by their magic bytes, not their extension (``x.png`` holding a JPEG
is a JPEG), and kept as the bytes on disk, never re-encoded. Only PNG and JPEG are read:

- a file that is no image (``labels.txt``) is left out with a warning and recorded in the
  report, whatever ``on_error`` says;
- a corrupt image (bad header; a PNG without its ``IEND`` chunk or a JPEG without its
  end-of-image marker, i.e. truncated; a header claiming more than
  :data:`~unihub.images.decoders.MAX_IMAGE_PIXELS`; with ``verify=True`` or
  ``convert(validate_images='full')`` also any that fails to decode), a ``.png/.jpg/.jpeg``
  file holding something else, or another image format (``.gif``, ``.webp``, ...) raises
  :class:`~unihub.errors.FormatError` naming the file, or with ``on_error='skip'`` is skipped
  and recorded. ``validate_images='none'`` checks only that a file is a PNG/JPEG.

Schema inference reads only the headers (the first 64 KiB of each file; the whole file where its header runs
past them: a JPEG frame, or a PNG's tRNS, after large metadata):

- the ``image`` codec is ``CompressedImageCodec`` of the majority format (PNG on a tie).
  A folder mixing PNG and JPEG keeps every file's own bytes; the decoders sniff the format
  of each cell, so such a column decodes correctly whatever the codec says;
- shape ``(H, W, C)``, each dimension ``None`` where images differ; ``(H, W)`` when every
  image is gray. When gray and colour images are mixed the shape is ``(H, W, None)`` and the
  gray rows decode to ``(H, W, 1)`` arrays, so every value has the field's rank
  (:func:`~unihub.images.decoders.gray_in_rank_3`); the files' bytes are stored as given, never
  re-encoded as RGB;
- dtype uint8, or uint16 when every image is a 16-bit PNG (mixing 8- and 16-bit is refused).

:meth:`ImageFolderFormat.write` exports any dataset with an image field back to such a tree,
writing the same bytes (see there).
"""

from __future__ import annotations

import math
import os
import shutil
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from unihub.errors import DatasetExistsError, DatasetNotFoundError, FormatError, SchemaError
from unihub.formats.base import (
    ColumnBatch,
    ForeignFormat,
    FormatOption,
    OnError,
    ReadReport,
    SkippedRecord,
    check_on_error,
    map_in_workers,
    parse_bool,
    parse_list,
    python_columns,
    register_format,
)
from unihub.fs import filesystem as fsutil
from unihub.fs import publish
from unihub.fs import sources as fsrc
from unihub.fs.outputs import LocalOutputs, Outputs
from unihub.images import decoders as images
from unihub.runtime.memory import BatchCut
from unihub.schema.codecs import CompressedImageCodec, ScalarCodec
from unihub.schema.image_checks import jpeg_scan_start
from unihub.schema.shapes import shape_matches
from unihub.schema.unischema import Unischema, UnischemaField

IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg"})
#: Image formats unihub does not read: errors (or skips), never silently dropped as non-images.
OTHER_IMAGE_EXTENSIONS = frozenset({".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm", ".pbm",
                                    ".jp2", ".j2k", ".heic", ".heif", ".avif", ".ico", ".jxl"})
_HEAD_BYTES = 65536  # enough for the PNG chunks before IDAT and the JPEG segments before SOF
_DETECT_SAMPLE = 16
_DETECT_DEPTH = 2  # folders below a class folder that detection looks into for its first files
_PROVISIONAL_SAMPLE = 1000  # images whose headers make the schema a single-pass conversion starts with
_EXTENSION = {"png": "png", "jpeg": "jpg"}
FIELDS = ("image", "label", "path")
CLASS_FOLDERS = "class folder labels"  # verify's name for the class list beside the records


@dataclass(frozen=True)
class _Entry:
    path: str  # relative to the root, '/'-separated
    label: int | None
    #: 'file' (read it), 'left out' (recorded, warned) or 'refused' (an error unless skipping)
    status: str = "file"
    reason: str = ""


@dataclass(frozen=True)
class _Listing:
    classes: tuple[str, ...] | None  # None: flat layout
    entries: tuple[_Entry, ...]
    outside: tuple[str, ...]  # class layout: files directly in the root


#: header statistics of images: formats counted, sizes ``(H, W, C)``, bit depths with the first image of each
_Seen = tuple[Counter[str], set[tuple[int, int, int]], dict[int, str]]


@dataclass(frozen=True)
class _Probe:
    """What a file's bytes are: ``kind`` 'image' (with fmt/size/depth), 'other' or 'bad' (with reason)."""

    kind: str
    fmt: str | None = None
    size: tuple[int, int, int] | None = None
    depth: int = 8
    reason: str = ""
    #: the bytes probed end inside a PNG's chunks before IDAT: a tRNS chunk (an alpha channel) may lie beyond
    partial: bool = False


@register_format("imagefolder", aliases=("images", "folder"))
class ImageFolderFormat(ForeignFormat):
    """A folder of PNG/JPEG images, by class (``root/<class>/<file>``) or flat.

    Options: ``verify=True`` decodes every image while reading, to catch corrupt pixel data
    that a header and end-marker check cannot see (several times slower).

    Example::

        source = ImageFolderFormat("/data/train")
        schema = source.infer_schema()          # image, label, path
        source.metadata()                       # {"classes": ["cat", "dog"]}
        for batch in source.read_batches(schema, on_error="skip"): ...
    """

    def __init__(self, sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], **options: Any) -> None:
        super().__init__(sources, **options)
        if len(self.sources) != 1:
            raise FormatError(f"an image folder is one root directory, got {len(self.sources)} sources: "
                              f"{self.where}")
        self.root = fsrc.without_query(self.sources[0])  # a query holds for the bucket, not in file names
        if not fsrc.isdir(self.root):
            raise DatasetNotFoundError(f"{self.root}: not a directory; an image folder is a directory of "
                                       "class folders holding PNG/JPEG files, or of the files themselves")

    OPTIONS = {
        "verify": FormatOption("decode every image while reading, to catch corrupt pixel data (slower)", parse_bool),
        "follow_links": FormatOption("follow symbolic links out of the folder and into folders (loops are "
                                     "still not followed); the CLI's --follow-links", parse_bool),
        "max_file_mb": FormatOption("the largest file read, in MiB (default 256, inf for no limit; larger ones "
                                    "are refused before reading)", float),
    }
    WRITE_OPTIONS = {
        "image_field": FormatOption("the field written as the image files (default: the only image field)"),
        "label_field": FormatOption("the field naming each row's class folder (default 'label')"),
        "path_field": FormatOption("the field holding each file's path (default 'path')"),
        "classes": FormatOption("class folder names by label index, comma-separated (default: the source's)",
                                parse_list),
    }

    # -------------------------------------------------------------------- contract
    @classmethod
    def detect(cls, path: str) -> bool:
        """True for a directory whose first files (directly, or in its first folders: a class folder may hold
        only folders, ``<class>/<video>/<frame>.jpg``) are mostly PNG/JPEG."""
        if not fsrc.isdir(path):
            return False
        sample: list[str] = []
        for name, is_dir in _visible_typed(path):
            full = os.path.join(path, name)
            if is_dir:
                sample.extend(_first_files(full, _DETECT_DEPTH))
            else:
                sample.append(full)
            if len(sample) >= _DETECT_SAMPLE:
                break
        hits = sum(images.detect_format(_head(f, 8)) is not None for f in sample[:_DETECT_SAMPLE])
        return hits > 0 and 2 * hits >= min(len(sample), _DETECT_SAMPLE)

    @classmethod
    def of_files(cls, root: str, classes: tuple[str, ...] | None, files: Sequence[str],
                 **options: Any) -> ImageFolderFormat:
        """The folder ``root`` reading just ``files`` (paths from its listing: a conversion task's slice),
        labelled by the whole root's ``classes`` (None: the flat layout), without listing the folder again."""
        source = cls(root, **options)
        prefix = os.path.join(root, "")
        label_of = {name: i for i, name in enumerate(classes or ())}
        entries = []
        for path in files:
            # the files come from the source's listing (root + relative path); relpath is slow
            rel = (path[len(prefix):] if path.startswith(prefix) else os.path.relpath(path, root)).replace(os.sep, "/")
            label = None if classes is None else label_of[rel.split("/", 1)[0]]
            entries.append(_Entry(rel, label))
        source.__dict__["_listing"] = _Listing(classes, tuple(entries), ())
        return source

    def files(self) -> list[str]:
        """Every candidate file (images and any others, not hidden; regular files only), in reading order."""
        return [os.path.join(self.root, e.path) for e in self._listing.entries if e.status == "file"]

    def subset(self, files: Sequence[str]) -> ImageFolderFormat:
        """The folder reading only ``files``, labelled by the whole folder's classes (``convert --append``)."""
        return self.of_files(self.root, self._listing.classes, files, **self.options)

    def append_conflict(self, extra: Mapping[str, Any]) -> str | None:
        """Rows of this folder fit a dataset converted from it before only while the labels keep their meaning:
        the same layout, and the dataset's classes the first of the folder's (class folders added after
        the last one in sorted order are new labels; one sorting before, or removed, renumbers them)."""
        old, new = extra.get("classes"), self._listing.classes
        if (old is None) != (new is None):
            return (f"{self.root} is now in the {'flat' if new is None else 'class'} layout and the dataset was "
                    f"converted from the {'flat' if old is None else 'class'} layout")
        if old is not None and new is not None and list(new[:len(old)]) != list(old):
            return (f"the class folders of {self.root} changed: the dataset's labels index {_shown(old)}, the "
                    f"folder's would index {_shown(new)}, so a label would name another class (only folders "
                    "sorting after the last class may be added)")
        return None

    @property
    def follow_links(self) -> bool:
        """Whether links are followed out of the folder and into folders (see the module docstring)."""
        return bool(self.options.get("follow_links"))

    @property
    def max_file_bytes(self) -> int | None:
        """The largest file read: the ``max_file_mb`` option (``inf``: no limit), else
        :data:`images.MAX_IMAGE_FILE_BYTES`."""
        mb = self.options.get("max_file_mb")
        if mb is None:
            return images.MAX_IMAGE_FILE_BYTES
        if not mb > 0:
            raise SchemaError(f"max_file_mb must be a positive number of MiB, got {mb!r}")
        # inf: no limit, as None is for MAX_IMAGE_FILE_BYTES (int() of it raised OverflowError); a fraction of a
        # byte rounds up, never to a limit of 0 bytes that refuses every file
        return None if math.isinf(float(mb)) else math.ceil(float(mb) * 2**20)

    def metadata(self) -> dict[str, Any]:
        """``{"classes": [...]}`` for the class layout (label ``i`` is ``classes[i]``); ``{}`` when flat."""
        classes = self._listing.classes
        return {} if classes is None else {"classes": list(classes)}

    def infer_schema(self, *, sample_records: int | None = None) -> Unischema:
        """``image`` (+ ``label``) + ``path`` from the headers of the first ``sample_records`` images."""
        entries = self._listing.entries
        if sample_records is None and self.workers > 1 and len(entries) > 1000:
            # every header, in forked workers (the merge is exact: counts and sets)
            slices = [entries[i::self.workers] for i in range(self.workers)]
            parts = map_in_workers(partial(_scan_headers, self.root, limit=None, max_bytes=self.max_file_bytes),
                                   slices, self.workers)
        else:
            parts = [_scan_headers(self.root, entries, limit=sample_records, max_bytes=self.max_file_bytes)]
        return self.refine_schema(parts)

    def provisional_schema(self) -> Unischema:
        """The schema of up to 1,000 images spread over the folder; :meth:`refine_schema` completes it.

        Every image field stores the bytes as given, so the stored columns do not depend on
        what the whole folder holds: a conversion can read each file once (convert's single
        pass) and correct the schema's shapes and codec afterwards.
        """
        entries = self._listing.entries
        step = max(1, len(entries) // _PROVISIONAL_SAMPLE)
        return self.refine_schema([_scan_headers(self.root, entries[::step][:_PROVISIONAL_SAMPLE], limit=None,
                                                 max_bytes=self.max_file_bytes)])

    def refine_schema(self, observations: Sequence[Any]) -> Unischema:
        """The schema from header statistics ``(formats, sizes, depths)`` of some or all images."""
        formats: Counter[str] = sum((p[0] for p in observations), Counter())
        sizes = set().union(*(p[1] for p in observations))
        depths: dict[int, str] = {}  # bit depth -> the first image of it, to name in a refusal
        for part in observations:
            for depth, path in part[2].items():
                depths.setdefault(depth, path)
        if not formats:
            raise FormatError(f"{self.root}: no PNG or JPEG images found{self._outside_hint()}", path=self.root)
        if len(depths) > 1:
            examples = ", ".join(f"{depth}-bit: {path}" for depth, path in sorted(depths.items()))
            raise FormatError(f"{self.root}: mixes 8-bit and 16-bit PNG images ({examples}), which one field "
                              "cannot hold without re-encoding; convert them to one bit depth first", path=self.root)
        fields = [UnischemaField("image", np.uint16 if set(depths) == {16} else np.uint8, _image_shape(sizes),
                                 CompressedImageCodec("jpeg" if formats["jpeg"] > formats["png"] else "png"),
                                 False)]
        if self._listing.classes is not None:
            fields.append(UnischemaField("label", np.int64, (), ScalarCodec(pa.int64()), False))
        fields.append(UnischemaField("path", np.str_, (), ScalarCodec(pa.string()), False))
        return Unischema("ImageFolder", fields)

    def _outside_hint(self) -> str:
        """Where the images went when a class layout found none: the files lying directly in the root (a
        subfolder, even an empty one, makes the root a class layout, which leaves them out)."""
        listing = self._listing
        if listing.classes is None or not listing.outside:
            return ""
        return (f" in its class folders {_shown(listing.classes)}; the {len(listing.outside)} file(s) directly in "
                f"it ({_shown(listing.outside)}) belong to no class and are left out: move them into class "
                "folders, or the subfolders out of the root for the flat layout")

    def read_batches(self, schema: Unischema, *, batch_size: int = 256,
                     on_error: OnError = "raise") -> Iterator[ColumnBatch]:
        """Batches of ``{"image": [bytes], "label": int64 array, "path": [str]}`` (the fields of ``schema``)."""
        wanted = self._wanted_fields(schema, batch_size, on_error)
        image_field = schema["image"] if "image" in schema and not self.observe else None
        check = self.validate_images != "none"  # header: pixel limit, fit, end marker; full: decode too
        verify = bool(self.options.get("verify")) or self.validate_images == "full"
        self.report = ReadReport()
        seen: _Seen = (Counter(), set(), {})
        if self.observe:
            self.report.observed = seen
        others = [] if self.in_task else self._record_outside()  # the files left out, warned about at the end
        batch: dict[str, list[Any]] = {name: [] for name in wanted}
        cut = BatchCut(batch_size, self.batch_bytes)
        prefix = os.path.join(self.root, "")
        max_bytes = self.max_file_bytes
        for entry in self._listing.entries:
            full = prefix + entry.path
            data, probe = self._read_entry(full, entry, max_bytes, image_field, check, verify, seen)
            if probe.kind != "image":
                self._leave_out(full, entry.path, probe, on_error, others)
                continue
            self.report.records += 1
            for name, value in (("image", data), ("label", entry.label), ("path", entry.path)):
                if name in batch:
                    batch[name].append(value)
            if cut.add(len(data)):
                yield _finish(batch)
                batch = {name: [] for name in wanted}
                cut.reset()
        if batch[wanted[0]]:
            yield _finish(batch)
        self.report.left_out = others
        if not self.in_task:
            self.warn_left_out(others)

    def warn_left_out(self, files: Sequence[str]) -> None:
        """One warning naming the files a read left out (a conversion's driver says it once for all tasks)."""
        if files:
            shown = ", ".join(files[:3]) + (", ..." if len(files) > 3 else "")
            warnings.warn(f"{self.root}: left out {len(files)} file(s) that are not images, lie outside the "
                          f"class folders or are links not followed: "
                          f"{shown} (listed in .report.skipped)", UserWarning, stacklevel=3)

    def _wanted_fields(self, schema: Unischema, batch_size: int, on_error: OnError) -> list[str]:
        """The names of ``schema``'s fields, once :meth:`read_batches`' arguments are checked: fields an
        image folder has (a flat one has no label), a positive batch size, a known ``on_error``."""
        if batch_size <= 0:
            raise SchemaError(f"batch_size must be positive, got {batch_size}")
        check_on_error(on_error)
        wanted = [f.name for f in schema]
        if not wanted:
            raise SchemaError("the schema has no fields to read")
        unknown = [n for n in wanted if n not in FIELDS]
        if unknown:
            raise SchemaError(f"an image folder has fields {list(FIELDS)}, not {unknown}")
        if "label" in wanted and self._listing.classes is None:
            raise SchemaError(f"{self.root} is a flat image folder (no class folders), so it has no 'label'")
        return wanted

    def _record_outside(self) -> list[str]:
        """The files lying directly in the root of a class layout, each recorded in the report as skipped."""
        for rel in self._listing.outside:
            self.report.skipped.append(SkippedRecord(os.path.join(self.root, rel), "file",
                                                     "outside the class folders (class layout)"))
        return list(self._listing.outside)

    def _read_entry(self, full: str, entry: _Entry, max_bytes: int | None, image_field: UnischemaField | None,
                    check: bool, verify: bool, seen: _Seen) -> tuple[bytes, _Probe]:
        """The bytes of ``entry`` (none unless a file to read; at most ``max_bytes``) and what they are: an
        image checked against ``image_field`` where ``check``; while observing (no ``image_field``) each
        image's format, size and bit depth are noted in ``seen``, which the schema is refined from."""
        if entry.status == "file" and not fsrc.utf8_name(entry.path):  # the path field is text: never a traceback
            data, probe = b"", _Probe("bad", reason=f"its path {entry.path!r} is not UTF-8, which the path field "
                                                    "stores as text; rename it")
        elif entry.status == "file":
            data, probe = _read_and_probe(full, entry.path, max_bytes, complete=check, verify=verify)
        else:  # a special file or a link the walk did not follow (sources.tree_entries)
            data, probe = b"", _Probe("bad" if entry.status == "refused" else "other", reason=entry.reason)
        self.report.bytes_read += len(data)
        if probe.kind == "image" and check:
            probe = _checked(probe, image_field)
        if probe.kind == "image" and image_field is None:
            seen[0][probe.fmt] += 1  # type: ignore[index]
            seen[1].add(probe.size)  # type: ignore[arg-type]
            seen[2].setdefault(probe.depth, entry.path)
        return data, probe

    def _leave_out(self, full: str, rel: str, probe: _Probe, on_error: OnError, others: list[str]) -> None:
        """A file ``full`` that is no record: one that is no image (``probe.kind`` 'other') is left out,
        recorded and added to ``others``; a corrupt one ('bad') raises, or is skipped (recorded) under
        ``on_error='skip'``."""
        if probe.kind == "other":
            self.report.skipped.append(SkippedRecord(full, "file", probe.reason or "not a PNG or JPEG image"))
            others.append(rel)
        elif on_error == "raise":
            raise FormatError(f"{full}: {probe.reason} (--skip-corrupt, on_error='skip' in Python, leaves "
                              "it out)", path=full)
        else:
            self.report.skipped.append(SkippedRecord(full, "file", probe.reason))

    @classmethod
    def write(cls, target: str | Outputs, schema: Unischema, batches: Iterable[ColumnBatch], *,
              image_field: str | None = None, label_field: str | None = "label", path_field: str | None = "path",
              classes: Sequence[str] | None = None, overwrite: bool = False, **options: Any) -> list[str]:
        """Write ``target/<class>/<file>`` (or ``target/<file>`` without labels); returns the files written.

        The image bytes are written as they are (arrays are encoded with the field's codec,
        PNG by default). A row's class folder is ``classes[label]`` (pass the source's
        ``metadata()["classes"]``), a string label itself, or ``str(label)`` otherwise (then
        re-ingesting sorts the folder names as strings: pass ``classes`` for faithful labels).
        The file name is the row's ``path`` when present (prefixed with the class folder unless
        it already starts with it), else ``<row index>.png|jpg``. With ``classes`` every class
        folder is created, empty ones too (not on an object store, which has no directories).
        Given a path, written into a hidden sibling directory renamed onto ``target`` at the end:
        a failure leaves nothing behind; an existing ``target`` is refused unless ``overwrite=True``.
        Given :class:`~unihub.fs.outputs.Outputs` (what ``convert`` stages and commits as one,
        on any filesystem), each file is written straight to its place there.
        """
        if options:
            raise SchemaError(f"unknown image folder write options {sorted(options)}")
        image = _pick_image_field(schema, image_field)
        label = label_field if label_field and label_field in schema else None
        path = path_field if path_field and path_field in schema else None
        if isinstance(target, Outputs):  # staged by the caller, on any filesystem
            return _write_tree(target, image, label, path, classes, batches)
        target = os.path.abspath(os.fspath(target))
        publish.settle_url(target)  # a killed run's old folder back in place, its temporaries removed
        if os.path.lexists(target) and not overwrite:
            raise DatasetExistsError(f"{target} already exists; pass --overwrite (overwrite=True) to replace it")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        temporary = fsutil.temporary_sibling(target)
        try:
            written = _write_tree(LocalOutputs(temporary), image, label, path, classes, batches)
            publish.commit(pafs.LocalFileSystem(), temporary, target)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        return [os.path.join(target, os.path.relpath(p, temporary)) for p in written]

    REFERENCE_READER = "the files' bytes, listed as torchvision's ImageFolder lists them"
    SUBFOLDERS_ARE_DATA = True  # a folder written inside would be a class, or turn a flat folder into classes

    def reference_records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Each PNG/JPEG file as ``{"path": its path, "class": its class folder, "image": its bytes}``,
        listed as torchvision's ``ImageFolder`` lists them (sorted class folders, then
        ``sorted(os.walk(...))``, then sorted names), with none of unihub's listing or probing code.
        Names starting with ``.`` are not data; files that are not PNG/JPEG by their magic bytes are
        not images."""
        root, follow = self.root, self.follow_links
        real_root = os.path.realpath(root)
        for dirpath, name, files in _reference_walks(root, follow):
            rel_dir = fsrc.relative(dirpath, root)
            if any(part.startswith(".") for part in rel_dir.split("/") if part != "."):
                continue
            for file in files:
                path = os.path.join(dirpath, file)
                if not fsrc.is_url(path) and not _reference_readable(path, real_root, follow):
                    continue  # a special file, or a link out of the folder not followed: no record
                with fsrc.open_input(path) as handle:
                    data = handle.read()
                if file.startswith(".") or not data.startswith(_MAGIC_BYTES):
                    continue
                rel = fsrc.relative(path, root)
                yield rel, ({"path": rel, "image": data} if name is None else {"path": rel, "class": name, "image": data})

    def reference_extras(self) -> dict[str, Any]:
        """The class folders, listed as torchvision's ``find_classes`` lists them (nothing when flat): labels
        index them, so an empty one added or removed renumbers every label after it, the files unchanged."""
        classes = _reference_classes(self.root, fsrc.scandir(self.root), self.follow_links)
        return {CLASS_FOLDERS: _labels_of(classes)} if classes else {}

    def written_options(self) -> dict[str, Any]:
        """``class_folders``: the folder's class folders, what :meth:`native_extras` compares with where
        neither the dataset records class names nor ``classes`` is given (an export names the folders by
        the labels then, and the records' class names compare them)."""
        classes = _reference_classes(self.root, fsrc.scandir(self.root), self.follow_links)
        return {"class_folders": classes} if classes else {}

    @classmethod
    def native_extras(cls, schema: Unischema, extra: Mapping[str, Any], **options: Any) -> dict[str, Any]:
        """The class folders an export makes: the class names the dataset records (its labels index them),
        else the ``classes`` given, else (labels naming the folders) the folder's own ``class_folders``."""
        classes = extra.get("classes") or options.get("classes") or options.get("class_folders")
        return {CLASS_FOLDERS: _labels_of(classes)} if classes else {}

    @classmethod
    def native_records(cls, schema: Unischema, rows: Iterable[Mapping[str, Any]], extra: Mapping[str, Any],
                       **options: Any) -> Iterator[dict[str, Any]]:
        """Rows as the files an export writes (its own naming: :func:`_destination`, so a row without a
        path is ``<class>/<row index>.png``): the image bytes, the class folder of the label, the path."""
        image = _pick_image_field(schema, options.get("image_field"))
        label, path = (name if name and name in schema else None for name in
                       (options.get("label_field", "label"), options.get("path_field", "path")))
        classes = extra.get("classes") or options.get("classes") or None
        for index, row in enumerate(rows):
            data, ext = _image_bytes(image, row[image.name], index)
            value = None if label is None else row.get(label)
            class_dir = None if value is None else _class_dir(value, classes, index)
            rel = _destination(None if path is None else row.get(path), class_dir, index, ext)
            record: dict[str, Any] = {"path": rel} if class_dir is None else {"path": rel, "class": class_dir}
            yield {**record, "image": bytes(data)}  # a file out of place is named by its path, not its bytes

    @classmethod
    def export_caveats(cls, schema: Unischema, options: Mapping[str, Any]) -> list[str]:
        """Labels that would read back as others: an ingest (and torchvision's ImageFolder) numbers the class
        folders in sorted order, so ``classes`` out of that order, or integer labels written as folder names
        (``'10'`` sorts before ``'2'``), come back renumbered."""
        label = options.get("label_field", "label")
        if not label or label not in schema:
            return []
        classes = options.get("classes")
        if classes:
            order = sorted(classes)
            return [] if list(classes) == order else [
                f"the classes {_shown(list(classes))} are not in sorted order: an ingest and torchvision's "
                f"ImageFolder number the folders {_shown(order)}, so the labels read back differ"]
        if schema[label].numpy_dtype is not np.str_:
            return ["no classes were given, so each label's folder is its number: with 10 or more labels an "
                    "ingest and torchvision's ImageFolder sort the names as text ('10' before '2') and read other "
                    "labels back; pass classes (--option classes=...)"]
        return []

    @classmethod
    def export_options(cls, extra: Mapping[str, Any], schema: Unischema) -> dict[str, Any]:
        """The source's class names, so labels map back to the same folders."""
        return {"classes": list(extra["classes"])} if extra.get("classes") else {}

    # -------------------------------------------------------------------- listing
    @cached_property
    def _listing(self) -> _Listing:
        root, follow = self.root, self.follow_links
        inside = frozenset() if fsrc.is_url(root) else frozenset([fsrc.directory_key(root)])
        listed = fsrc.tree_entries(root, root, follow_links=follow, inside=inside)
        dirs = [e.name for e in listed if e.kind == "dir"]
        unread = [_Entry(e.name, None, *_status(e)) for e in listed if e.kind not in ("dir", "file")]
        files = [e.name for e in listed if e.kind == "file"]
        if not dirs:
            entries = sorted([*(_Entry(n, None) for n in files), *unread], key=lambda e: e.path)
            return _Listing(None, tuple(entries), ())
        walked = [_Entry(rel, label, status, reason) for label, name in enumerate(dirs)
                  for rel, status, reason in _walk(root, name, follow, inside)]
        return _Listing(tuple(dirs), tuple(unread + walked), tuple(files))


# ------------------------------------------------------------------------ reading
def _scan_headers(root: str, entries: Sequence[_Entry], limit: int | None, max_bytes: int | None = None
                  ) -> _Seen:
    """(image formats counted, sizes, bit depths with the first image of each) from the headers of
    ``entries``, up to ``limit`` images."""
    formats: Counter[str] = Counter()
    sizes: set[tuple[int, int, int]] = set()
    depths: dict[int, str] = {}
    for entry in entries:
        if limit is not None and sum(formats.values()) >= limit:
            break
        full = os.path.join(root, entry.path)
        if entry.status != "file":
            continue
        try:
            head = fsrc.read_regular(full, _HEAD_BYTES)
            probe = _probe(head, entry.path, complete=False)
            if (probe.kind == "bad" or probe.partial) and len(head) == _HEAD_BYTES:
                # headers longer than the head: a JPEG's frame, or a PNG's tRNS after large metadata chunks
                # (XMP, an ICC profile), which decides its channels, is only in the whole file
                probe = _probe(fsrc.read_regular(full, max_bytes=max_bytes), entry.path, complete=False)
        except fsrc.NotReadable:
            continue
        if probe.kind != "image":
            continue  # non-images and corrupt files are reported by read_batches
        formats[probe.fmt] += 1  # type: ignore[index]
        sizes.add(probe.size)  # type: ignore[arg-type]
        depths.setdefault(probe.depth, entry.path)
    return formats, sizes, depths


def _first_files(folder: str, depth: int) -> list[str]:
    """The first files of ``folder`` (at most :data:`_DETECT_SAMPLE`), or where it holds none, those of the
    first of its first few subfolders that holds some, down to ``depth`` levels below it."""
    entries = _visible_typed(folder)
    files = [os.path.join(folder, n) for n, sub in entries if not sub][:_DETECT_SAMPLE]
    if files or depth == 0:
        return files
    for name in [n for n, sub in entries if sub][:_DETECT_SAMPLE]:
        files = _first_files(os.path.join(folder, name), depth - 1)
        if files:
            break
    return files


def _visible_typed(directory: str) -> list[tuple[str, bool]]:
    """``(name, is a directory)`` of the entries not hidden, sorted by name (one listing)."""
    return sorted((n, d) for n, d in fsrc.scandir(directory) if not n.startswith("."))


def _walk(root: str, class_dir: str, follow_links: bool,
          inside: frozenset[tuple[int, int]]) -> list[tuple[str, str, str]]:
    """``(path relative to root, status, reason)`` of each entry under ``root/class_dir`` that is not a
    folder (hidden ones pruned), in torchvision's order: by folder, then name. Links are followed as
    :func:`~unihub.fs.sources.tree_entries` says, so the walk ends whatever links the tree holds."""
    found: list[tuple[str, str, str, str]] = []
    top = fsrc.join(root, class_dir)
    if fsrc.is_url(root):  # an object store: no links, no special files; one listing of the whole prefix
        for dirpath, dirnames, filenames in fsrc.walk(top):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            found.extend((fsrc.relative(dirpath, root), f, "file", "") for f in filenames if not f.startswith("."))
        return [(f"{d}/{f}", status, reason) for d, f, status, reason in sorted(found)]
    pending = [(top, inside | {fsrc.directory_key(top)})]
    while pending:
        directory, within = pending.pop()
        rel_dir = fsrc.relative(directory, root)
        for entry in fsrc.tree_entries(directory, root, follow_links=follow_links, inside=within):
            if entry.kind == "dir":
                sub = fsrc.join(directory, entry.name)
                pending.append((sub, within | {fsrc.directory_key(sub)}))
            else:
                found.append((rel_dir, entry.name, *_status(entry)))
    return [(f"{d}/{f}", status, reason) for d, f, status, reason in sorted(found)]


def _status(entry: fsrc.TreeEntry) -> tuple[str, str]:
    """``(status, reason)`` of a walked entry that is no folder: a special file is refused when its name
    says it is an image (``x.png``), else left out like any file that is no image."""
    if entry.kind == "special":
        return ("refused" if _image_name(entry.name) else "left out"), entry.reason
    return entry.kind, entry.reason


def _image_name(name: str) -> bool:
    ext = os.path.splitext(name)[1].lower()
    return ext in IMAGE_EXTENSIONS or ext in OTHER_IMAGE_EXTENSIONS


def _head(path: str, size: int) -> bytes:
    """The first ``size`` bytes of a regular file; none of anything else (detection must not block)."""
    try:
        return fsrc.read_regular(path, size)
    except (fsrc.NotReadable, OSError):
        return b""


def _read_and_probe(full: str, rel: str, max_bytes: int | None, *, complete: bool,
                    verify: bool) -> tuple[bytes, _Probe]:
    """A listed file's bytes and what they are (:func:`_probe`); a file that turned out not regular,
    or larger than ``max_bytes``, is probed by its name or first bytes and not read."""
    try:
        data = fsrc.read_regular(full, max_bytes=max_bytes)
    except fsrc.NotReadable as exc:
        if exc.reason.startswith("not a regular file"):
            return b"", _Probe("bad" if _image_name(rel) else "other", reason=exc.reason)
        head = fsrc.read_regular(full, _HEAD_BYTES)
        if _probe(head, rel, complete=False).kind == "other":
            return head, _Probe("other")
        return head, _Probe("bad", reason=f"{exc.reason} (--option max_file_mb=N raises it; "
                                          "unihub.images.decoders.MAX_IMAGE_FILE_BYTES in Python)")
    return data, _probe(data, rel, complete=complete, verify=verify)


def _reference_walks(root: str, follow: bool) -> list[tuple[str, str | None, list[str]]]:
    """``(folder, class folder or None, sorted file names)`` as torchvision's ``ImageFolder`` lists them:
    the root's files when it has no class folders (not hidden; links to folders only with ``follow``),
    else each class folder's ``sorted(os.walk(...))``, by class."""
    entries = fsrc.scandir(root)  # (on object stores, listed through the store's filesystem)
    classes = _reference_classes(root, entries, follow)
    if not classes:
        return [(root, None, sorted(n for n, is_dir in entries if not is_dir))]
    return [(dirpath, name, sorted(files)) for name in classes
            for dirpath, _, files in sorted(_reference_walk(os.path.join(root, name), follow))]


def _reference_classes(root: str, entries: Sequence[tuple[str, bool]], follow: bool) -> list[str]:
    """The class folders among the root's ``entries``, sorted as torchvision's ``find_classes`` sorts them
    (not hidden; links to folders only with ``follow``); empty when the folder is flat."""
    return sorted(n for n, is_dir in entries if is_dir and not n.startswith(".") and
                  (follow or not os.path.islink(os.path.join(root, n))))


def _labels_of(classes: Sequence[str]) -> dict[str, int]:
    """``{class folder: its label}``, so that verify names a folder added or missing."""
    return {name: label for label, name in enumerate(classes)}


def _reference_walk(top: str, follow: bool) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk`` as torchvision's ImageFolder walks (``followlinks``, when links are followed), but never
    into a loop."""
    return fsrc.walk_following_links(top) if follow and not fsrc.is_url(top) else fsrc.walk(top)


def _reference_readable(path: str, real_root: str, follow: bool) -> bool:
    """A regular file (through links), inside the folder unless links are followed."""
    if not os.path.isfile(path):
        return False
    target = os.path.realpath(path)
    return follow or target.startswith(os.path.join(real_root, ""))


#: the last image header probed, ``(spans, their bytes, fmt, size, depth, scan start)``: files from
#: one encoder at one size share those bytes, so a compare or two stands in for the header walks
_last_header: tuple[images.Spans, list[bytes], str, tuple[int, int, int], int, int | None] | None = None


def _probe(data: bytes, name: str, *, complete: bool, verify: bool = False) -> _Probe:
    """Classify a file's bytes; ``complete``: ``data`` is the whole file, so truncation is checked."""
    global _last_header
    known = _last_header
    if known is not None and all(data.startswith(part, a) for (a, _), part in zip(known[0], known[1])):
        _, _, fmt, size, depth, sos = known
        partial = False
    else:
        detected = images.detect_format(data)
        if detected is None:
            ext = os.path.splitext(name)[1].lower()
            if ext in IMAGE_EXTENSIONS:
                return _Probe("bad", reason=f"not a PNG or JPEG file despite its {ext} extension "
                                            f"({len(data)} bytes starting {data[:8]!r})")
            if ext in OTHER_IMAGE_EXTENSIONS:
                return _Probe("bad", reason=f"{ext} images are not supported (only PNG and JPEG); convert them first")
            return _Probe("other")
        fmt = detected
        found, spans = images.image_size_spans(data)
        if found is None:
            return _Probe("bad", reason=f"corrupt or unsupported {fmt.upper()} header ({len(data)} bytes)")
        size = found
        depth = data[24] if fmt == "png" else 8
        sos = jpeg_scan_start(data) if fmt == "jpeg" else None
        partial = fmt == "png" and spans is None  # the walk reached the end before IDAT
        if fmt == "jpeg":  # the scan start's walk reads on from the frame header, through the SOS marker
            spans = None if sos is None else ((0, sos + 2),)
        if spans is not None:
            _last_header = (spans, [data[a:b] for a, b in spans], fmt, size, depth, sos)
    if complete and not _has_end(data, fmt, sos):
        return _Probe("bad", reason=f"truncated {fmt.upper()} ({len(data)} bytes, no end marker)")
    if verify:
        try:
            images.decode_image(data)
        except images.ImageDecodeError as exc:
            return _Probe("bad", reason=str(exc))
    return _Probe("image", fmt, size, 16 if depth == 16 else 8, partial=partial)


def _has_end(data: bytes, fmt: str, sos: int | None) -> bool:
    """PNG: ends with the IEND chunk. JPEG: an EOI marker after the first top-level start of scan."""
    if fmt == "png":
        return data.rfind(b"IEND\xaeB`\x82") >= 0
    return sos is not None and data.rfind(b"\xff\xd9") > sos


def _checked(probe: _Probe, field: UnischemaField | None) -> _Probe:
    """A 'bad' probe for an image above the pixel limit, or (``field`` given) one that does not fit it."""
    height, width, _ = probe.size  # type: ignore[misc]
    problem = images.pixel_limit_problem(height, width, probe.fmt)  # type: ignore[arg-type]
    if problem is not None:
        return _Probe("bad", reason=problem)
    return probe if field is None else _check_fits(probe, field)


def _check_fits(probe: _Probe, field: UnischemaField) -> _Probe:
    """A 'bad' probe when the image's header does not fit the schema's image field."""
    height, width, channels = probe.size  # type: ignore[misc]
    found = (height, width) if channels == 1 and len(field.shape) == 2 else (height, width, channels)
    dtype = np.uint16 if probe.depth == 16 else np.uint8
    if not shape_matches(found, field.shape) or np.dtype(dtype) != field.dtype:
        return _Probe("bad", reason=f"{probe.fmt.upper()} image of shape {found} {np.dtype(dtype).name} does not "  # type: ignore[union-attr]
                                    f"fit field {field.name!r} ({field.shape} {field.dtype}); infer the schema "
                                    "from all records (sample_records=None)")
    return probe


def _image_shape(sizes: set[tuple[int, int, int]]) -> tuple[int | None, ...]:
    heights, widths, channels = (set(dim) for dim in zip(*sizes))

    def one(values: set[int]) -> int | None:
        return next(iter(values)) if len(values) == 1 else None

    if channels == {1}:
        return one(heights), one(widths)
    return one(heights), one(widths), one(channels)


def _finish(batch: dict[str, list[Any]]) -> dict[str, Any]:
    if "label" in batch:
        return {**batch, "label": np.asarray(batch["label"], dtype=np.int64)}
    return batch


# ------------------------------------------------------------------------ writing
_MAGIC_BYTES = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")


def _pick_image_field(schema: Unischema, name: str | None) -> UnischemaField:
    if name is not None:
        if name not in schema:
            raise SchemaError(f"image_field {name!r} is not a field of {schema.name!r}; fields: {list(schema.fields)}")
        return schema[name]
    candidates = [f for f in schema if isinstance(f.codec, CompressedImageCodec)]
    if not candidates:
        candidates = [f for f in schema if f.dtype in (np.uint8, np.uint16) and len(f.shape) in (2, 3)]
    if len(candidates) != 1:
        found = [f.name for f in candidates]
        raise SchemaError(f"cannot tell which field holds the images ({found or 'none found'}); "
                          "pass image_field=")
    return candidates[0]


def _write_tree(outputs: Outputs, image: UnischemaField, label: str | None, path: str | None,
                classes: Sequence[str] | None, batches: Iterable[ColumnBatch]) -> list[str]:
    """The class folders (empty ones too) and every row's file under ``outputs``; their full paths."""
    repeated = sorted(name for name, count in Counter(classes or ()).items() if count > 1)
    if repeated:  # two labels into one folder: re-ingested, they would be one class
        raise FormatError(f"classes name the folder(s) {repeated} for more than one label; each label needs "
                          "its own class folder")
    outputs.makedirs()
    for name in classes or ():
        outputs.makedirs(_safe_component(name, "class name"))
    return [outputs.path(rel) for rel in _write_rows(outputs, image, label, path, classes, batches)]


def _write_rows(outputs: Outputs, image: UnischemaField, label: str | None, path: str | None,
                classes: Sequence[str] | None, batches: Iterable[ColumnBatch]) -> list[str]:
    """Write each row's image as one file of ``outputs``, in ``outputs.parallel_files`` threads (file creation
    is kernel time locally, a request's latency remotely: both overlap); returns the relative paths."""
    from concurrent.futures import Future, ThreadPoolExecutor

    threads = outputs.parallel_files
    written: list[str] = []
    seen: set[str] = set()
    in_flight: list[Future[None]] = []
    with ThreadPoolExecutor(threads, thread_name_prefix="unihub-imagefolder-write") as pool:
        for batch in batches:
            columns = batch.to_pydict() if isinstance(batch, (pa.RecordBatch, pa.Table)) else python_columns(batch)
            if image.name not in columns:
                raise SchemaError(f"a batch has no {image.name!r} column; it has {list(columns)}")
            values = columns[image.name]
            labels = columns.get(label) if label else None
            paths = columns.get(path) if path else None
            jobs: list[tuple[str, Any]] = []
            for i in range(len(values)):
                index = len(written)
                data, ext = _image_bytes(image, values[i], index)
                class_dir = None if labels is None else _class_dir(labels[i], classes, index)
                rel = _destination(None if paths is None else paths[i], class_dir, index, ext)
                if rel in seen:
                    raise FormatError(f"rows write the same file {rel!r} twice (row {index})", path=rel)
                seen.add(rel)
                jobs.append((rel, data))
                written.append(rel)
            in_flight += [pool.submit(_write_files, outputs, jobs[k::threads]) for k in range(threads)]
            while len(in_flight) > 2 * threads:  # at most two batches' bytes held
                in_flight.pop(0).result()
        for future in in_flight:
            future.result()
    return written


def _write_files(outputs: Outputs, jobs: Sequence[tuple[str, Any]]) -> None:
    for rel, data in jobs:
        outputs.write_file(rel, data)


def _image_bytes(field: UnischemaField, value: Any, row: int) -> tuple[bytes | bytearray | memoryview, str]:
    """The bytes to write (as given, or encoded from an array) and their file extension."""
    if value is None:
        raise FormatError(f"row {row}: field {field.name!r} is null; an image folder needs an image in every row")
    if isinstance(value, (bytes, bytearray, memoryview)):
        fmt = images.detect_format(value)
        if fmt is None:
            raise FormatError(f"row {row}: field {field.name!r} holds {len(value)} bytes that are neither PNG "
                              "nor JPEG")
        return value, _EXTENSION[fmt]
    codec = field.codec if isinstance(field.codec, CompressedImageCodec) else CompressedImageCodec("png")
    return images.encode_image(np.asarray(value), codec.image_codec, codec.quality), _EXTENSION[codec.image_codec]


def _class_dir(value: Any, classes: Sequence[str] | None, row: int) -> str:
    if value is None:
        raise FormatError(f"row {row}: the label is null; every row of a class folder tree needs one")
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, str):
        return _safe_component(value, "class name")
    index = int(value)
    if classes is None:
        return str(index)
    if not 0 <= index < len(classes):
        raise FormatError(f"row {row}: label {index} is outside the {len(classes)} classes")
    return _safe_component(classes[index], "class name")


def _safe_component(name: str, what: str) -> str:
    """A single visible path component: no separators, no '..', not hidden (re-ingest would ignore it)."""
    if not name or name in (".", "..") or "/" in name or os.sep in name or name.startswith("."):
        raise FormatError(f"{what} {name!r} cannot be a folder name (empty, hidden or containing a separator)")
    return name


def _destination(path: Any, class_dir: str | None, index: int, ext: str) -> str:
    """The relative '/'-path a row is written to; refuses absolute paths, '..' and hidden names."""
    if path is None:
        name = f"{index:08d}.{ext}"
        return name if class_dir is None else f"{class_dir}/{name}"
    parts = str(path).replace("\\", "/").split("/")
    if str(path).startswith("/") or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
        raise FormatError(f"row {index}: path {path!r} is not a plain relative path (absolute, '..', empty or "
                          "hidden components)")
    if class_dir is not None and parts[0] != class_dir:
        parts.insert(0, class_dir)
    return "/".join(parts)


def _shown(classes: Sequence[str]) -> str:
    """Class names for a message: all of a few, else the first and last ones."""
    names = [repr(c) for c in classes]
    return "[" + (", ".join(names) if len(names) <= 8 else ", ".join(names[:4]) + ", ..., " + ", ".join(names[-3:])) + "]"
