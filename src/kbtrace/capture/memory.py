"""The memory image: a sparse, byte-addressable store keyed by 51-bit physical address.

Shared by capture (where ``tl.load`` reads real values from it) and the data
executor (which replays every op against it). Memory is paged (64 KiB pages,
created on first write, zero-filled), so HBM slices, TCM and SRAM of any
topology fit without reserving their capacity.

Also here: ``Allocator`` (bump allocation, aligned, fixed capacity: TCM load
buffers and compute scratch per program, HBM per PE slice) and ``RegionMap``
(the allocated ranges the address sanitizer checks every access against, with
the last writer of each range for dependencies and pending-value tracking).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import numpy as np

from kbtrace.capture.dtypes import STORAGE
from kbtrace.errors import SanitizerError

__all__ = ["MemoryImage", "Allocator", "Region", "RegionMap", "span_elems"]

_PAGE_BITS = 20
_PAGE = 1 << _PAGE_BITS
_MASK = _PAGE - 1


def span_elems(shape: Sequence[int], strides: Sequence[int] | None) -> int:
    """Elements spanned by a strided view (1 + max offset); prod(shape) when contiguous."""
    if not strides:
        return math.prod(shape) if len(shape) else 1
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))


class MemoryImage:
    """Sparse paged bytes. ``read``/``write`` take element strides for tiles of larger tensors."""

    __slots__ = ("_pages",)

    def __init__(self) -> None:
        self._pages: dict[int, np.ndarray] = {}

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
        buf = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        nbytes = buf.size
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
        span = span_elems(shape, strides)
        nbytes = span * sdt.itemsize
        off = addr & _MASK
        page = self._pages.get(addr >> _PAGE_BITS)
        if off + nbytes <= _PAGE and page is not None and off % sdt.itemsize == 0:
            flat = page[off:off + nbytes].view(sdt)   # no copy of the span: gather the tile only
        else:
            flat = self.read_bytes(addr, nbytes).view(sdt)
        view = np.lib.stride_tricks.as_strided(
            flat, shape=shape, strides=tuple(s * sdt.itemsize for s in strides), writeable=False)
        return np.ascontiguousarray(view)

    def write(self, addr: int, stored: np.ndarray, strides: Sequence[int] | None = None) -> None:
        """Write a storage-dtype array at ``addr`` (contiguous, or scattered with element strides)."""
        if not strides:
            self.write_bytes(addr, stored)
            return
        sdt = stored.dtype
        span = span_elems(stored.shape, strides)
        nbytes = span * sdt.itemsize
        off = addr & _MASK
        in_page = off + nbytes <= _PAGE and off % sdt.itemsize == 0
        flat = (self._page(addr >> _PAGE_BITS)[off:off + nbytes] if in_page
                else self.read_bytes(addr, nbytes)).view(sdt)
        view = np.lib.stride_tricks.as_strided(
            flat, shape=stored.shape, strides=tuple(s * sdt.itemsize for s in strides))
        view[...] = stored
        if not in_page:
            self.write_bytes(addr, flat)


class Allocator:
    """Bump allocator over ``[base, base + capacity)`` with ``align``-byte alignment."""

    __slots__ = ("base", "capacity", "align", "cursor", "name")

    def __init__(self, base: int, capacity: int, name: str, align: int = 16) -> None:
        self.base, self.capacity, self.align, self.name = base, capacity, align, name
        self.cursor = 0

    def alloc(self, nbytes: int, what: str) -> int:
        start = -(-self.cursor // self.align) * self.align
        if start + nbytes > self.capacity:
            raise SanitizerError(
                f"{self.name} overflow: {what} needs {nbytes} B but only "
                f"{max(0, self.capacity - start)} of {self.capacity} B are free; "
                f"use smaller tiles or fewer live tiles per program")
        self.cursor = start + nbytes
        return self.base + start

    def reset(self) -> None:
        self.cursor = 0


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
