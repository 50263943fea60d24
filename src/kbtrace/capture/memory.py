"""Capture's address spaces: allocators and the sanitizer's region map (the bytes
themselves are in ``image.MemoryImage``).

``Allocator`` (aligned, fixed capacity; bump allocation, then reuse of dead handles'
buffers: TCM load buffers and compute scratch per program; HBM per PE slice uses the
bump only; ``FreeList`` for host allocations) and ``RegionMap`` (the allocated ranges the address
sanitizer checks every access against, with the last writer of each range for
dependencies and pending-value tracking). A long kernel fills its TCM and then reuses
it, so the TCM part of the image's resident memory is bounded by ``pe.tcm.size_kb`` per
PE used (2 MiB on default.yaml), not by trace length.
"""

from __future__ import annotations

import bisect
import weakref
from operator import itemgetter
from typing import Any

from kbtrace.errors import SanitizerError

__all__ = ["Allocator", "FreeList", "Owner", "Region", "RegionMap"]

_START = itemgetter(0)


class Owner(weakref.ref):
    """The weak reference an ``Allocator`` notes a buffer's owning handle by, carrying the
    buffer's span (``addr``, ``nbytes``: set by whoever makes it) for ``Allocator.died``,
    which runs when the handle is gone."""

    __slots__ = ("addr", "nbytes")
    addr: int
    nbytes: int


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
                 "_off", "_scan_i", "_scan_pos", "_scan_gap", "died", "tracer")

    def __init__(self, base: int, capacity: int, name: str, align: int = 16,
                 tracer: Any = None) -> None:
        self.base, self.capacity, self.align, self.name = base, capacity, align, name
        #: told of every noted buffer whose owner died (``died``): its ``dead`` list gets
        #: (``next_op``, addr, nbytes), the op from which on nothing reads the buffer's bytes
        #: before writing them (``Drainer``: the executor's image drops them there)
        self.tracer = tracer
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
        t = self.tracer
        if t is not None and r.__class__ is Owner:
            t.dead.append((t.next_op, r.addr, r.nbytes))
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
                if r.__callback__ is not died or r.__class__ is not Owner:  # (made without)
                    r = Owner(h, died)
                    r.addr, r.nbytes = h.addr, h.nbytes
                s = r.addr - base       # (the owner's span is its handle's, set with it)
                bisect.insort(spans, (s, s + r.nbytes, r), key=_START)
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
