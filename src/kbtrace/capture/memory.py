"""The memory image: a sparse, byte-addressable store keyed by 51-bit physical address.

Shared by capture (where ``tl.load`` reads real values from it) and the data
executor (which replays every op against it). Memory is paged (1 MiB pages,
created zero-filled on first write; ``np.zeros`` maps them lazily, so resident
memory follows the bytes actually written), so HBM slices, TCM and SRAM of any
topology fit without reserving their capacity. A long kernel fills its TCM and
then reuses it (``Allocator``), so the TCM part of resident memory is bounded by
``pe.tcm.size_kb`` per PE used (2 MiB on default.yaml), not by trace length.

Also here: ``Allocator`` (aligned, fixed capacity; bump allocation, then reuse of
dead handles' buffers: TCM load buffers and compute scratch per program; HBM per PE
slice uses the bump only) and ``RegionMap`` (the allocated ranges the address
sanitizer checks every access against, with the last writer of each range for
dependencies and pending-value tracking).
"""

from __future__ import annotations

import bisect
import math
import weakref
from collections.abc import Iterable, Sequence
from operator import itemgetter
from typing import Any

import numpy as np

from kbtrace.capture.dtypes import STORAGE
from kbtrace.errors import SanitizerError

__all__ = ["MemoryImage", "Allocator", "FreeList", "Region", "RegionMap", "span_elems"]

_PAGE_BITS = 20
_PAGE = 1 << _PAGE_BITS
_MASK = _PAGE - 1


def span_elems(shape: Sequence[int], strides: Sequence[int] | None) -> int:
    """Elements spanned by a strided view (1 + max offset); prod(shape) when contiguous."""
    if not strides:
        return math.prod(shape) if len(shape) else 1
    if len(shape) == 2 and len(strides) == 2:     # a tile (the common case), without a loop
        d0, d1 = shape
        return 0 if d0 == 0 or d1 == 0 else 1 + (d0 - 1) * strides[0] + (d1 - 1) * strides[1]
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))


_START = itemgetter(0)


_CHUNK_BITS = 13   # read-cache invalidation granularity (8 KiB)
_CACHE_CAP = 4096  # cached reads kept at most (then the cache starts over)
_DIG_GENS = 16     # cache generations a noted digest outlives its entry for, at most


def _chunks(addr: int, nbytes: int, shape: tuple[int, ...], strides: tuple[int, ...] | None,
            isz: int) -> Iterable[int]:
    """Read-cache chunks a read of ``nbytes`` spanned at ``addr`` touches: the whole span, or
    for a 2-d tile whose span holds over 4 chunks per row, each row's chunks only (a
    (BM, BK) tile of a (M, K) matrix spans ~BM x K elements: indexing the span made every
    cached load cost O(K); bytes between its rows never change what it read)."""
    lo, hi = addr >> _CHUNK_BITS, (addr + max(nbytes, 1) - 1) >> _CHUNK_BITS
    if strides is None or len(shape) != 2 or hi - lo < 4 * shape[0] or min(strides) < 0:
        return range(lo, hi + 1)
    step, ext = strides[0] * isz, ((shape[1] - 1) * strides[1] + 1) * isz
    out: set[int] = set()
    for a in range(addr, addr + shape[0] * step, step):
        out.update(range(a >> _CHUNK_BITS, ((a + ext - 1) >> _CHUNK_BITS) + 1))
    return out


class MemoryImage:
    """Sparse paged bytes. ``read``/``write`` take element strides for tiles of larger tensors.

    ``cached_read`` / ``remember`` keep a bounded cache of recent reads and writes as
    read-only arrays with a slot for their digest (``[stored, digest, compute]`` entries),
    so the executor does not re-read, re-convert or re-hash bytes that are already resident.
    Every ``write`` drops the cached entries whose span it touches (8 KiB granularity), so
    a cached read always returns what the pages hold.
    """

    __slots__ = ("_pages", "_cache", "_idx", "_dig", "_gen")

    def __init__(self) -> None:
        self._pages: dict[int, np.ndarray] = {}
        #: (addr, shape, dtype, strides) -> [stored (read-only), digest | None, compute | None]
        self._cache: dict[tuple[Any, ...], list[Any]] = {}
        #: chunk number -> keys of cached entries (and noted digests) whose span touches it
        self._idx: dict[int, set[tuple[Any, ...]]] = {}
        #: (addr, shape, dtype, strides) -> digest of what a read there returns (``note_digest``);
        #: outlives the cache for ``_DIG_GENS`` of its generations, dropped by writes as it is
        self._dig: dict[tuple[Any, ...], int] = {}
        self._gen = 0

    def _invalidate(self, chunks: Iterable[int]) -> None:
        """Drop the cached entries (and noted digests) indexed under any of ``chunks``."""
        idx, cache, dig = self._idx, self._cache, self._dig
        for c in chunks:
            keys = idx.pop(c, None)
            if keys:
                for k in keys:
                    cache.pop(k, None)
                    if dig:
                        dig.pop(k, None)

    def _keep(self, key: tuple[Any, ...], nbytes: int, entry: list[Any],
              isz: int = 1) -> None:
        """Cache ``entry`` for ``key`` = (addr, shape, dtype, element strides | None), indexed
        by the chunks its read touches (``isz``: bytes per element, for strided keys)."""
        cache = self._cache
        if len(cache) >= _CACHE_CAP:
            cache.clear()
            self._gen += 1
            if self._gen >= _DIG_GENS:      # the index serves the digests too: reset both
                self._gen = 0
                self._idx.clear()
                self._dig.clear()
        cache[key] = entry
        addr = key[0]
        idx = self._idx
        for c in _chunks(addr, nbytes, key[1], key[3], isz):
            keys = idx.get(c)
            if keys is None:
                idx[c] = {key}
            else:
                keys.add(key)

    def cached_read(self, addr: int, shape: Sequence[int], dtype: str,
                    strides: Sequence[int] | None = None) -> list[Any]:
        """``[stored, digest, compute]`` of ``read(addr, shape, dtype, strides)``; ``stored`` is
        read-only and shared with later identical reads (fill the digest/compute slots in place)."""
        shape = tuple(shape)
        st = tuple(strides) if strides else None
        key = (addr, shape, dtype, st)
        entry = self._cache.get(key)
        if entry is None:
            stored = self.read(addr, shape, dtype, st)
            stored.flags.writeable = False
            entry = [stored, self._dig.get(key) if self._dig else None, None]
            isz = stored.itemsize
            self._keep(key, span_elems(shape, st) * isz, entry, isz)
        return entry

    def note_digest(self, key: tuple[Any, ...], entry: list[Any]) -> None:
        """Remember ``entry``'s digest (slot 1) for reads at ``key`` (``cached_read``'s key)
        after the cache dropped the entry, if ``entry`` is still what a read there returns."""
        if self._cache.get(key) is entry and entry[1] is not None:
            self._dig[key] = entry[1]

    def remember(self, addr: int, dtype: str, entry: list[Any]) -> None:
        """Record that ``entry[0]`` (storage array of ``dtype``) was just written contiguously at
        ``addr``: a later contiguous read of the same shape and dtype returns ``entry``."""
        stored = entry[0]
        assert isinstance(stored, np.ndarray)
        stored.flags.writeable = False
        self._keep((addr, stored.shape, dtype, None), stored.nbytes, entry)

    def clear(self) -> None:
        """Forget every page and cached read (the image reads as zeros again): a capture
        frees its images this way once the kernels ran and the outputs were gathered."""
        self._pages.clear()
        self._cache.clear()
        self._idx.clear()
        self._dig.clear()
        self._gen = 0

    def _page(self, no: int) -> np.ndarray:
        page = self._pages.get(no)
        if page is None:
            page = self._pages[no] = np.zeros(_PAGE, dtype=np.uint8)
        return page

    def read_bytes(self, addr: int, nbytes: int) -> np.ndarray:
        off = addr & _MASK
        if off + nbytes <= _PAGE:
            page = self._pages.get(addr >> _PAGE_BITS)
            if page is None:
                return np.zeros(nbytes, dtype=np.uint8)
            return page[off:off + nbytes].copy()
        out = np.empty(nbytes, dtype=np.uint8)
        pos = 0
        while pos < nbytes:
            a = addr + pos
            off = a & _MASK
            n = min(_PAGE - off, nbytes - pos)
            page = self._pages.get(a >> _PAGE_BITS)
            out[pos:pos + n] = 0 if page is None else page[off:off + n]
            pos += n
        return out

    def write_bytes(self, addr: int, data: np.ndarray) -> None:
        buf = data.ravel().view(np.uint8)     # (a view when data is contiguous, else a copy)
        nbytes = buf.size
        if self._idx:
            lo, hi = addr >> _CHUNK_BITS, (addr + max(nbytes, 1) - 1) >> _CHUNK_BITS
            self._invalidate(range(lo, hi + 1))
        off = addr & _MASK
        if off + nbytes <= _PAGE:  # within one page (the common case)
            page = self._pages.get(addr >> _PAGE_BITS)
            if page is None:
                page = self._page(addr >> _PAGE_BITS)
            page[off:off + nbytes] = buf
            return
        pos = 0
        while pos < nbytes:
            a = addr + pos
            off = a & _MASK
            n = min(_PAGE - off, nbytes - pos)
            self._page(a >> _PAGE_BITS)[off:off + n] = buf[pos:pos + n]
            pos += n

    def read(self, addr: int, shape: Sequence[int], dtype: str,
             strides: Sequence[int] | None = None) -> np.ndarray:
        """Storage-dtype array of ``shape`` (a copy) read at ``addr`` with optional element strides."""
        sdt = STORAGE[dtype]
        shape = tuple(shape)
        if not strides:
            n = math.prod(shape) * sdt.itemsize
            return self.read_bytes(addr, n).view(sdt).reshape(shape)
        isz = sdt.itemsize
        nbytes = span_elems(shape, strides) * isz
        off = addr & _MASK
        if off + nbytes <= _PAGE and off % isz == 0:
            page = self._pages.get(addr >> _PAGE_BITS)
            if page is None:
                return np.zeros(shape, dtype=sdt)
            flat = page[off:off + nbytes].view(sdt)   # no copy of the span: gather the tile only
        else:
            groups = _page_rows(addr, shape, strides, isz)
            if groups is not None:        # rows gathered page by page, never the whole span
                out = np.empty(shape, dtype=sdt)
                step = strides[0] * isz
                for r0, r1 in groups:
                    out[r0:r1] = self.read(addr + r0 * step, (r1 - r0, *shape[1:]), dtype, strides)
                return out
            flat = self.read_bytes(addr, nbytes).view(sdt)
        view = np.lib.stride_tricks.as_strided(
            flat, shape=shape, strides=tuple(s * isz for s in strides), writeable=False)
        return view.copy()  # always a copy (a contiguous view would alias the page)

    def write(self, addr: int, stored: np.ndarray, strides: Sequence[int] | None = None) -> None:
        """Write a storage-dtype array at ``addr`` (contiguous, or scattered with element strides)."""
        if not strides:
            self.write_bytes(addr, stored)
            return
        isz = stored.dtype.itemsize
        if self._idx:
            nbytes = span_elems(stored.shape, strides) * isz
            self._invalidate(_chunks(addr, nbytes, stored.shape, tuple(strides), isz))
        self._scatter(addr, stored, strides, isz)

    def _scatter(self, addr: int, stored: np.ndarray, strides: Sequence[int], isz: int) -> None:
        """``write``'s strided stores once the cache was told: in place on the page when the
        span lies in one, else page by page over the rows (a row across pages alone, through
        a copy of its span); only a tile whose rows interleave copies its whole span."""
        shape = stored.shape
        nbytes = span_elems(shape, strides) * isz
        off = addr & _MASK
        in_page = off + nbytes <= _PAGE and off % isz == 0
        if not in_page:
            groups = _page_rows(addr, shape, strides, isz)
            if groups is not None:
                step = strides[0] * isz
                for r0, r1 in groups:
                    self._scatter(addr + r0 * step, stored[r0:r1], strides, isz)
                return
        flat = (self._page(addr >> _PAGE_BITS)[off:off + nbytes] if in_page
                else self.read_bytes(addr, nbytes)).view(stored.dtype)
        view = np.lib.stride_tricks.as_strided(
            flat, shape=shape, strides=tuple(s * isz for s in strides))
        view[...] = stored
        if not in_page:
            self.write_bytes(addr, flat)


def _page_rows(addr: int, shape: tuple[int, ...], strides: Sequence[int],
               isz: int) -> list[tuple[int, int]] | None:
    """Runs ``(r0, r1)`` of a strided view's leading rows that each lie within one page (a
    run of one row may cross a page boundary), or None where that does not help: one row,
    an unaligned address, or rows that interleave (a transposed tile), which copy their span.

    A (BM, BK) tile of a (M, K) matrix spans ~BM x K elements: copying the span to gather
    the tile made each such read and write O(K) once the span outgrew a page."""
    if len(shape) < 2 or shape[0] < 2 or addr % isz or min(strides) < 0:
        return None
    step = strides[0] * isz
    ext = span_elems(shape[1:], strides[1:]) * isz
    if ext == 0 or step < ext:
        return None
    runs: list[tuple[int, int]] = []
    r0, n = 0, shape[0]
    while r0 < n:
        a = addr + r0 * step
        page_end = ((a >> _PAGE_BITS) + 1) << _PAGE_BITS
        r1 = min(n, (page_end - ext - addr) // step + 1) if a + ext <= page_end else r0 + 1
        runs.append((r0, r1))
        r0 = r1
    return runs


class Allocator:
    """Allocator over ``[base, base + capacity)`` with ``align``-byte alignment: a bump
    allocator until it is full, then first fit over the buffers of dead handles.

    While the bump cursor fits, addresses are those of a plain bump allocator (the
    recorder's hot paths inline that step). Every buffer is noted with a weak
    reference to the handle that owns it (``owned``). When the bump does not fit,
    ``reclaim`` returns the lowest aligned gap between buffers that are still
    owned by a live handle or *pinned* (read or written by an asynchronous op: a
    send or composite still in flight, a receive landing), and parks the cursor at
    the capacity so every later allocation comes back to ``reclaim``. Handles die
    by reference counting (capture pauses the cyclic GC), so which buffers are
    free, and hence every address, is deterministic. Only ops of one program use
    its allocators, and they are issued in program order, so a reclaimed buffer's
    earlier readers are done with it when the replay reaches its next writer.

    ``reclaim`` resumes its walk where the previous one stopped when nothing below that
    point changed: the owners' weak references carry ``died`` as their callback, so a death
    below it (or a buffer noted or pinned there) restarts the next walk from the bottom,
    and a request no larger than a gap the walk passed does too. While the op log holds
    the handles of a long kernel, the buffers fill the TCM one after another, and each
    allocation then costs the spans it adds, not every span below it. The result is the
    lowest fitting gap either way (``tests/test_capture_memory.py`` checks it against a
    walk from the bottom).
    """

    __slots__ = ("base", "capacity", "align", "cursor", "name", "owned", "pinned", "_spans",
                 "_off", "_scan_i", "_scan_pos", "_scan_gap", "died")

    def __init__(self, base: int, capacity: int, name: str, align: int = 16) -> None:
        self.base, self.capacity, self.align, self.name = base, capacity, align, name
        self.cursor = 0
        #: weak references to the handles owning buffers noted here since the last
        #: ``reclaim`` (each spans its handle's ``addr`` .. ``addr + nbytes``); the hot
        #: paths append to it
        self.owned: list[Any] = []
        #: start -> end (offsets) of buffers never to reclaim
        self.pinned: dict[int, int] = {}
        #: (start, end, weak reference or None if pinned) of the buffers known to be in use,
        #: sorted by start; dead owners are dropped as ``reclaim`` walks past them
        self._spans: list[tuple[int, int, Any]] = []
        #: id of a noted owner's reference -> its buffer's start (for ``died``)
        self._off: dict[Any, int] = {}
        #: the last walk: ``_spans[:_scan_i]`` are live and end (aligned) at ``_scan_pos``,
        #: the largest gap between them is ``_scan_gap`` (-1: none)
        self._scan_i, self._scan_pos, self._scan_gap = 0, 0, -1
        #: the weak-reference callback to give owners' references (bound once)
        self.died = self._died

    def _rescan(self) -> None:
        self._scan_i, self._scan_pos, self._scan_gap = 0, 0, -1

    def _died(self, r: Any) -> None:
        s = self._off.pop(id(r), None)
        if s is not None and s < self._scan_pos:
            self._rescan()

    def alloc(self, nbytes: int, what: str) -> int:
        """Bump allocation (no reclaiming: for buffers that live as long as the allocator)."""
        start = -(-self.cursor // self.align) * self.align
        if start + nbytes > self.capacity:
            raise SanitizerError(
                f"{self.name} overflow: {what} needs {nbytes} B but only "
                f"{max(0, self.capacity - start)} of {self.capacity} B are free; "
                f"use smaller tiles or fewer live tiles per program")
        self.cursor = start + nbytes
        return self.base + start

    def pin(self, addr: int, nbytes: int) -> None:
        """Never reclaim ``[addr, addr + nbytes)`` (if it is ours)."""
        off = addr - self.base
        if 0 <= off < self.capacity:
            old = self.pinned.get(off)
            if old is not None:
                self._spans.remove((off, old, None))
            self.pinned[off] = off + nbytes
            bisect.insort(self._spans, (off, off + nbytes, None), key=_START)
            self._rescan()

    def _note(self) -> None:
        """Move the buffers noted since the last reclaim, if still owned, into ``_spans``."""
        base, spans, off, died = self.base, self._spans, self._off, self.died
        low = self._scan_pos
        for r in self.owned:
            h = r()
            if h is not None:
                if r.__callback__ is not died:      # (a reference made without it)
                    r = weakref.ref(h, died)
                s = h.addr - base
                bisect.insort(spans, (s, s + h.nbytes, r), key=_START)
                off[id(r)] = s
                if s < low:
                    low = -1
        if low < 0:
            self._rescan()
        self.owned = []

    def _live(self) -> list[tuple[int, int]]:
        """Sorted (start, end) offsets of the buffers still in use; forgets dead owners."""
        self._note()
        self._spans = [t for t in self._spans if t[2] is None or t[2]() is not None]
        self._rescan()
        return sorted({(s, e) for s, e, _ in self._spans})

    def reclaim(self, nbytes: int) -> int | None:
        """Offset of the lowest gap of ``nbytes`` between live or pinned buffers, or None.

        Walks the spans in address order only up to that gap, dropping the dead owners it
        passes (those further on are dropped by a later walk)."""
        self._note()
        spans = self._spans
        al = self.align
        if nbytes > self._scan_gap:     # no gap below the last walk's end fits: resume there
            i, pos, gap = self._scan_i, self._scan_pos, self._scan_gap
        else:
            i, pos, gap = 0, 0, -1
        n = len(spans)
        while i < n:
            s, e, r = spans[i]
            if r is not None and r() is None:
                del spans[i]
                n -= 1
                continue
            if s - pos >= nbytes:
                break
            if s - pos > gap:
                gap = s - pos
            if e > pos:
                pos = -(-e // al) * al
            i += 1
        self._scan_i, self._scan_pos, self._scan_gap = i, pos, gap
        if i == n and self.capacity - pos < nbytes:
            return None
        self.cursor = self.capacity
        return pos

    def full(self, nbytes: int, what: str) -> str:
        """The overflow message once nothing can be reclaimed: what holds the space."""
        spans = self._live()
        held = sum(e - s for s, e in spans)
        n_pin = len(self.pinned)
        pinned = f" ({n_pin} pinned by sends, composites or receives)" if n_pin else ""
        return (f"{self.name} overflow: {what} needs {nbytes} B but {len(spans)} live "
                f"buffer(s){pinned} hold {held} of {self.capacity} B and no gap fits; use "
                f"smaller tiles or keep fewer tiles alive at once per program")

    def reset(self) -> None:
        self.cursor = 0
        self.owned.clear()
        self._spans.clear()
        self.pinned.clear()
        self._off.clear()
        self._rescan()


class FreeList:
    """First-fit allocator with free and coalescing over ``[base, base + capacity)``
    (ADR-0048 D1): a sorted list of free ``(offset, size)`` blocks; ``alloc`` cuts the first
    block that fits (``align``-ed), ``free`` returns a range and merges it with its
    neighbours. ``high`` is the high-water mark: an allocation below it reuses memory an
    earlier, freed allocation had. Host tensors' HBM slices use it."""

    __slots__ = ("base", "capacity", "align", "name", "free_blocks", "used", "high")

    def __init__(self, base: int, capacity: int, name: str, align: int = 256) -> None:
        self.base, self.capacity, self.align, self.name = base, capacity, align, name
        self.free_blocks: list[tuple[int, int]] = [(0, capacity)]
        self.used = 0
        self.high = 0

    def largest(self) -> int:
        return max((n for _o, n in self.free_blocks), default=0)

    def alloc(self, nbytes: int, what: str) -> tuple[int, bool]:
        """(address, whether it reuses freed memory) of ``nbytes`` (rounded up to ``align``)."""
        need = -(-max(nbytes, 1) // self.align) * self.align
        for i, (off, size) in enumerate(self.free_blocks):
            if size >= need:
                if size == need:
                    del self.free_blocks[i]
                else:
                    self.free_blocks[i] = (off + need, size - need)
                self.used += need
                reused = off < self.high
                self.high = max(self.high, off + need)
                return self.base + off, reused
        raise SanitizerError(
            f"{self.name} overflow: {what} needs {nbytes} B but the largest free block is "
            f"{self.largest()} B ({self.capacity - self.used} of {self.capacity} B free in "
            f"{len(self.free_blocks)} block(s)); free tensors no longer used (w.free) or place "
            f"it on another PE")

    def free(self, addr: int, nbytes: int) -> None:
        """Return ``[addr, addr + nbytes)`` (as allocated) and merge it with free neighbours."""
        off = addr - self.base
        size = -(-max(nbytes, 1) // self.align) * self.align
        self.used -= size
        blocks = self.free_blocks
        i = bisect.bisect_left(blocks, (off,))
        if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == off:
            i -= 1
            off, size = blocks[i][0], blocks[i][1] + size
            del blocks[i]
        if i < len(blocks) and off + size == blocks[i][0]:
            size += blocks[i][1]
            del blocks[i]
        blocks.insert(i, (off, size))


class Region:
    """An allocated address range: a tensor shard, a TCM buffer, scratch."""

    __slots__ = ("start", "end", "label", "space", "dtype", "writers")

    def __init__(self, start: int, nbytes: int, label: str, space: str, dtype: str | None) -> None:
        self.start, self.end, self.label, self.space, self.dtype = start, start + nbytes, label, space, dtype
        #: (start, end, op_id, pending) of the most recent writes into this region
        self.writers: list[tuple[int, int, int, bool]] = []

    def note_write(self, start: int, end: int, op_id: int, pending: bool) -> None:
        self.writers = [w for w in self.writers if not (start <= w[0] and w[1] <= end)]
        self.writers.append((start, end, op_id, pending))

    def readers_view(self, start: int, end: int) -> tuple[list[int], bool]:
        """(op_ids of the last writers overlapping [start, end), whether any is pending)."""
        deps: list[int] = []
        pending = False
        for ws, we, op, pend in self.writers:
            if ws < end and start < we:
                deps.append(op)
                pending = pending or pend
        return sorted(set(deps)), pending


class RegionMap:
    """Sorted, non-overlapping allocated ranges; ``find`` returns the one holding an access."""

    __slots__ = ("_starts", "_regions")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._regions: list[Region] = []

    def add(self, region: Region) -> Region:
        i = bisect.bisect_right(self._starts, region.start)
        if (i > 0 and self._regions[i - 1].end > region.start) or (
                i < len(self._regions) and self._regions[i].start < region.end):
            raise SanitizerError(f"allocation {region.label} at {region.start:#x} overlaps another "
                                 f"allocation; place tensors on distinct ranges")
        self._starts.insert(i, region.start)
        self._regions.insert(i, region)
        return region

    def remove(self, region: Region) -> None:
        i = bisect.bisect_left(self._starts, region.start)
        if i < len(self._regions) and self._regions[i] is region:
            del self._starts[i], self._regions[i]

    def remove_space(self, space: str) -> None:
        keep = [r for r in self._regions if r.space != space]
        self._regions = keep
        self._starts = [r.start for r in keep]

    def find(self, addr: int, nbytes: int) -> Region | None:
        i = bisect.bisect_right(self._starts, addr) - 1
        if i < 0:
            return None
        r = self._regions[i]
        if addr + max(nbytes, 1) <= r.end:
            return r
        return None

    def nearest(self, addr: int) -> Region | None:
        i = bisect.bisect_right(self._starts, addr) - 1
        return self._regions[i] if i >= 0 else None
