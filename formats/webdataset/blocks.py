"""WebDataset samples a block at a time, their members as columns.

:func:`iter_blocks` gives what :func:`~unihub.formats.webdataset.tar.iter_samples` gives -- the same
samples in the same order, the same errors and skips -- as :class:`SampleBlock` s. Where tarstream
found a window of a shard with numpy (:class:`~unihub.formats.webdataset.tarstream.MemberTable`) and its members
are the usual ones -- regular files named ``<key>.<ext>`` in plain ASCII, extensions in lower case
(capitals are kept in :attr:`Sample.spelled <unihub.formats.webdataset.tar.Sample.spelled>`), every sample with the same
extensions in the same order, no key seen before in the shard -- the samples wholly inside the window
become one block whose members are copied from the mapped shard into one Arrow binary array an
extension, with no Python object a member or a sample. Everything else (the samples that straddle
windows, other names, repeated keys, other layouts, damage) goes member by member through
:class:`~unihub.formats.webdataset.tar.Grouper`, as iter_samples does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from unihub.errors import FormatError
from unihub.formats.base import OnError, SkippedRecord
from unihub.formats.webdataset.tar import Grouper, Sample, after_damage, failer
from unihub.formats.webdataset.tarstream import BLOCK, MemberTable, TarFormatError, TarMember, iter_tables
from unihub.schema.arrow_numpy import MAX_BINARY, binary_array

#: member-by-member samples gathered before they go out as one block
_FLUSH = 256


@dataclass
class SampleBlock:
    """Samples in shard order: for each its shard, key, offset of its first member and position in its
    shard; the members either as ``columns`` (``extension -> binary array``, every sample holding each
    extension once) or as :class:`Sample` objects (``sample_list``)."""

    urls: list[str]
    keys: list[str]
    offsets: list[int]
    indexes: list[int]
    columns: dict[str, pa.Array] | None = None
    sample_list: list[Sample] | None = None

    @classmethod
    def of_samples(cls, samples: list[Sample]) -> SampleBlock:
        return cls([s.url for s in samples], [s.key for s in samples], [s.offset for s in samples],
                   [s.index for s in samples], sample_list=samples)

    def __len__(self) -> int:
        return len(self.keys)

    def samples(self) -> list[Sample]:
        """The samples as objects (made from the columns the first time)."""
        if self.sample_list is None:
            columns = self.columns or {}
            values = {extension: array.to_pylist() for extension, array in columns.items()}
            self.sample_list = [Sample(url, key, offset, {e: v[i] for e, v in values.items()}, index)
                                for i, (url, key, offset, index)
                                in enumerate(zip(self.urls, self.keys, self.offsets, self.indexes))]
        return self.sample_list

    def extensions(self) -> list[str]:
        """Every member extension of the block, in first-seen order."""
        if self.columns is not None:
            return list(self.columns)
        seen: dict[str, None] = {}
        for sample in self.sample_list or ():
            seen.update(dict.fromkeys(sample.members))
        return list(seen)

    def member_count(self) -> int:
        if self.columns is not None:
            return len(self.columns) * len(self)
        return sum(len(s.members) for s in self.sample_list or ())

    def column(self, extension: str) -> pa.Array | None:
        """The ``extension`` member of every sample as one binary array, or None where a sample lacks
        it (or the members are too many bytes for one array)."""
        if self.columns is not None:
            return self.columns.get(extension)
        values = [s.members.get(extension) for s in self.sample_list or ()]
        if any(v is None for v in values):
            return None
        try:
            return binary_array(values)  # type: ignore[arg-type]
        except ValueError:  # more bytes than one array holds
            return None

    def sample_bytes(self) -> list[int]:
        """The bytes of each sample's members."""
        if self.columns is not None:
            total = np.zeros(len(self), np.int64)
            for array in self.columns.values():
                offsets = np.frombuffer(array.buffers()[1], np.int32, len(array) + 1, array.offset * 4)
                total += np.diff(offsets)
            return total.tolist()
        return [sum(map(len, s.members.values())) for s in self.sample_list or ()]

    def slice(self, start: int, stop: int) -> SampleBlock:
        if start == 0 and stop == len(self):
            return self
        cut = slice(start, stop)
        return SampleBlock(self.urls[cut], self.keys[cut], self.offsets[cut], self.indexes[cut],
                           None if self.columns is None else {e: a[start:stop] for e, a in self.columns.items()},
                           None if self.sample_list is None else self.sample_list[cut])

    @classmethod
    def concat(cls, blocks: Sequence[SampleBlock]) -> SampleBlock:
        """One block of ``blocks`` in order: columns where every block has the same ones."""
        if len(blocks) == 1:
            return blocks[0]
        urls, keys, offsets, indexes = [], [], [], []
        for block in blocks:
            urls += block.urls
            keys += block.keys
            offsets += block.offsets
            indexes += block.indexes
        layout = next((b.columns for b in blocks if b.columns is not None), None)
        parts = [b.as_columns(list(layout)) for b in blocks] if layout is not None else []
        if layout is not None and all(p is not None for p in parts):
            arrays = {e: [p[e] for p in parts] for e in layout}  # type: ignore[index]
            if all(sum(a.nbytes for a in chunks) <= MAX_BINARY for chunks in arrays.values()):
                return cls(urls, keys, offsets, indexes, {e: pa.concat_arrays(chunks) for e, chunks in arrays.items()})
        return cls(urls, keys, offsets, indexes, sample_list=[s for b in blocks for s in b.samples()])

    def as_columns(self, extensions: list[str]) -> dict[str, pa.Array] | None:
        """The members as columns of exactly ``extensions``, or None where a sample has others or names one
        in capitals (columns keep no :attr:`Sample.spelled <unihub.formats.webdataset.tar.Sample.spelled>`)."""
        if self.columns is not None:
            return self.columns if set(self.columns) == set(extensions) else None
        if any(s.members.keys() != set(extensions) or s.spelled for s in self.sample_list or ()):
            return None
        columns = {e: self.column(e) for e in extensions}
        return None if any(c is None for c in columns.values()) else columns


def iter_blocks(path: str, *, on_error: OnError = "raise", skipped: list[SkippedRecord] | None = None,
                group_keys: bool = False) -> Iterator[SampleBlock]:
    """The samples of shard ``path`` as :func:`~unihub.formats.webdataset.tar.iter_samples` gives them, in
    blocks (see the module's docstring)."""
    grouper = Grouper(path, group_keys, failer(path, on_error, skipped))
    waiting: list[Sample] = []  # complete samples read member by member, not yet out
    count = 0

    def out(block: SampleBlock) -> SampleBlock:
        nonlocal count
        block.indexes = list(range(count, count + len(block)))
        if block.sample_list is not None:
            for sample, index in zip(block.sample_list, block.indexes):
                sample.index = index
        count += len(block)
        return block

    def flush() -> Iterator[SampleBlock]:
        if waiting:
            yield out(SampleBlock.of_samples(waiting[:]))
            waiting.clear()

    def take(members: Iterable[TarMember]) -> None:
        for member in members:
            done = grouper.take(member)
            if done is not None:
                waiting.append(done)

    def read(item: MemberTable | TarMember) -> Iterator[SampleBlock]:
        plan = None if group_keys or isinstance(item, TarMember) else _plan(item, grouper)
        if plan is None:
            take([item] if isinstance(item, TarMember) else item.members())
            if len(waiting) >= _FLUSH:
                yield from flush()
            return
        table, head, stop, width, keys = plan
        take(table.members(stop=head))  # the end of the sample the last window left open
        if grouper.current is not None:
            waiting.append(grouper.current)  # the next member has another key: it is complete
        grouper.current = grouper.skipping = None
        yield from flush()
        grouper.runs.update(zip(keys, table.firsts[head:stop:width].tolist()))
        yield out(_block(path, table, head, stop, width, keys))
        grouper.started = True
        take(table.members(start=stop))  # the sample this window leaves open

    try:
        for item in iter_tables(path, require_end=True):
            try:
                yield from read(item)
            except FormatError as exc:
                if isinstance(exc, TarFormatError):
                    raise  # a corrupt PAX global header: damage, below
                yield from flush()  # the grouper refused a member: the samples before it go out first
                raise
    except (TarFormatError, OSError) as exc:
        complete, report = after_damage(exc, grouper)
        waiting.extend(complete)
        yield from flush()
        report()
        return
    waiting.extend(grouper.finish())
    yield from flush()


#: what :func:`_plan` decides: the table, where its whole samples start and stop, members a sample, their keys
_Plan = tuple[MemberTable, int, int, int, list[str]]


def _plan(table: MemberTable, grouper: Grouper) -> _Plan | None:
    """Where ``table`` holds whole samples of one layout that may go out as columns, or None (read it
    member by member). The members before them end the sample the grouper holds open; those after
    them start the one the next window ends."""
    if not _plain_names(table):
        return None  # names tarstream or the grouper must look at one by one
    keys, _, extensions = zip(*[name.partition(".") for name in table.names])  # the key rule for plain names
    bounds = _whole_samples(keys, grouper.current.key if grouper.current is not None else grouper.skipping)
    if bounds is None:
        return None
    head, stop, width = bounds
    firsts = keys[head:stop:width]
    if not _one_layout(keys, extensions, head, stop, width):
        return None
    if len(set(firsts)) < len(firsts) or not grouper.runs.keys().isdisjoint(firsts):
        return None  # a key repeated: the grouper says where
    if stop < len(keys) and _refused(keys[stop], extensions[stop], firsts, grouper):
        return None  # the grouper refuses the member after them while it still holds their last one open
    if int(table.sizes[head:stop].sum()) > MAX_BINARY:
        return None
    return table, head, stop, width, list(firsts)


def _refused(key: str, extension: str, firsts: tuple[str, ...], grouper: Grouper) -> bool:
    """Whether the grouper refuses a member of ``key`` and ``extension`` that follows the samples ``firsts``:
    no key, or a key it has seen before (``group_keys`` off)."""
    return not (key and extension) or key in grouper.runs or key in firsts


def _plain_names(table: MemberTable) -> bool:
    """Whether every member is a regular file named in plain ASCII, with no folder, none starting with
    ``__`` (names the key rule of :func:`_plan` reads as the grouper does)."""
    joined = "\0".join(table.names)
    return (table.regular and joined.isascii() and "/" not in joined and not joined.startswith("__")
            and "\0__" not in joined)


def _whole_samples(keys: tuple[str, ...], is_open: str | None) -> tuple[int, int, int] | None:
    """``(head, stop, width)``: the members ``keys[head:stop]`` that are whole samples of ``width``
    members each -- after those of the sample ``is_open`` (the key of the one the grouper holds open),
    before those of the last key (which the next window may go on with) -- or None where there are none
    or they do not divide into samples of the first one's width."""
    head = 0
    while head < len(keys) and keys[head] == is_open:
        head += 1
    stop = len(keys)
    while stop > head and keys[stop - 1] == keys[-1]:
        stop -= 1
    width = 1
    while head + width < stop and keys[head + width] == keys[head]:
        width += 1
    if stop == head or (stop - head) % width:
        return None
    return head, stop, width


def _one_layout(keys: tuple[str, ...], extensions: tuple[str, ...], head: int, stop: int, width: int) -> bool:
    """Whether every sample of ``keys[head:stop]`` is ``width`` members of one key with the first sample's
    extensions in its order, each extension once and in lower case (capitals are kept in
    ``Sample.spelled``: the grouper's), and no member without a key or a dot (the grouper reports it)."""
    samples = (stop - head) // width
    firsts, layout = keys[head:stop:width], extensions[head:head + width]
    if "" in firsts or "" in layout:
        return False
    for j in range(width):
        if (j and keys[head + j:stop:width] != firsts) or extensions[head + j:stop:width] != (layout[j],) * samples:
            return False
    return len({extension.lower() for extension in layout}) == width and all(e == e.lower() for e in layout)


def _block(path: str, table: MemberTable, head: int, stop: int, width: int, keys: list[str]) -> SampleBlock:
    """The samples of ``table[head:stop]``, ``width`` members each, as columns copied from the shard."""
    columns: dict[str, pa.Array] = {}
    with memoryview(table.buffer) as whole:
        for j in range(width):
            starts = (table.owns[head + j:stop:width] + BLOCK).tolist()
            ends = (table.owns[head + j:stop:width] + BLOCK + table.sizes[head + j:stop:width]).tolist()
            extension = table.names[head + j].partition(".")[2]  # lower case (see _plan)
            columns[extension] = binary_array([whole[start:end] for start, end in zip(starts, ends)])
    return SampleBlock([path] * len(keys), keys, table.firsts[head:stop:width].tolist(), [], columns)
