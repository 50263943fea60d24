"""The memory image: a sparse, byte-addressable store keyed by 51-bit physical address.

Shared by capture (where ``tl.load`` reads real values from it) and the data
executor (which replays every op against it). Memory is paged (1 MiB pages,
created zero-filled on first write; ``np.zeros`` maps them lazily, so resident
memory follows the bytes actually written), so HBM slices, TCM and SRAM of any
topology fit without reserving their capacity.

A write that is also cached (``write_entry``: a load's TCM copy, a dot's result) is kept
*dirty*: its entry stands in for the page bytes until something reads or partly overwrites
them through the pages (``_settle``), or a later write covers it whole and it is dropped.
Most never reach a page: at 100 k gemm ops the TCM and scratch pages were ~100 k page
faults (~2.4 us each here, system time) and ~1 us of copying per op. A contiguous read of
a dirty span as written (same address, shape and dtype) returns its entry from the dirty
map, so dirty entries are not in the read cache (no LRU order, chunk index or byte count
kept for them: that bookkeeping was ~30% of verify's CPU at 1.0 M gemm ops).

Strided tiles (a (BM, BK) tile of a (M, K) matrix) are gathered and scattered through
views of the pages, a page's run of rows at a time, so a tile costs its own bytes and
not its span's (which grows with K). A bounded read cache (``cached_read``) serves
repeated reads without re-reading, re-converting or re-hashing; writes invalidate it
at 8 KiB granularity, by the chunks a strided access's rows actually touch.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from kbtrace.capture._geometry import (
    _CHUNK_BITS,
    _MASK,
    _PAGE,
    _PAGE_BITS,
    _chunks,
    _page_rows,
    span_elems,
)
from kbtrace.capture.dtypes import STORAGE

__all__ = ["MemoryImage", "span_elems"]

# The read cache keeps at most _CACHE_CAP entries and _CACHE_BYTES of stored arrays (an
# entry cached under two keys, a load's source and its TCM copy, counts once); the least
# recently used entry leaves first. A gemm's tile comes back when the next program sharing
# its row of A or column of B reaches it, a number of entries later that grows with K: at
# K = 15,616 (244 K steps) between 4,096 and 8,192 (a least-recently-used cache of 4,096
# entries still missed 1.07 M of 4.0 M reads, one of 8,192 80 k). (A cache that started
# over every 4,096 entries missed 28% of the reads at K = 15,616, against 5% at K = 5,184:
# that made capture's cost per op grow with K.)
_CACHE_CAP = 65_536
_CACHE_BYTES = 256 << 20
_DIG_SPAN = 65_536    # evictions after which the index and the digest memo start over
_NO_KEYS: set[tuple[Any, ...]] = set()     # (a chunk the index has not: never added to)


class _Dead:
    """A dirty span's forgotten bytes (``MemoryImage.drop``): the pages never get them."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


#: one marker per size
_DEAD: dict[int, _Dead] = {}


class MemoryImage:
    """Sparse paged bytes. ``read``/``write`` take element strides for tiles of larger tensors.

    ``cached_read`` / ``remember`` keep a bounded cache of recent reads and writes as
    read-only arrays with a slot for their digest (``[stored, digest, compute]`` entries),
    so the executor does not re-read, re-convert or re-hash bytes that are already resident.
    Every ``write`` drops the cached entries whose span it touches (8 KiB granularity), so
    a cached read always returns what the pages hold.
    """

    __slots__ = ("_pages", "_cache", "_idx", "_dig", "_evicted", "_bytes", "_keys", "_dirty",
                 "_dchunk", "_shared")

    def __init__(self) -> None:
        self._pages: dict[int, np.ndarray] = {}
        #: (addr, shape, dtype, strides) -> [stored (read-only), digest | None, compute | None]
        #: in use order: a hit moves its entry to the end, the first one is evicted
        self._cache: OrderedDict[tuple[Any, ...], list[Any]] = OrderedDict()
        #: chunk number -> keys of cached entries (and noted digests) whose span touches it
        self._idx: dict[int, set[tuple[Any, ...]]] = {}
        #: (addr, shape, dtype, strides) -> digest of what a read there returns (``note_digest``);
        #: outlives its entry's eviction for up to ``_DIG_SPAN`` evictions, dropped by writes as
        #: the entry is
        self._dig: dict[tuple[Any, ...], int] = {}
        self._evicted = 0
        self._bytes = 0     # stored bytes of the cached entries, once per entry
        #: id of a cached entry -> how many keys it is cached under (while cached, an entry's
        #: id cannot be reused: the cache holds it)
        self._keys: dict[int, int] = {}
        #: address -> ``[stored, digest, compute]`` entry (``stored`` contiguous, read-only)
        #: whose bytes the pages do not hold yet (dirty spans never overlap one another), or
        #: the ``_Dead`` marker of bytes forgotten there (``drop``), and chunk number ->
        #: addresses of those touching it
        self._dirty: dict[int, Any] = {}
        self._dchunk: dict[int, set[int]] = {}
        #: numbers of the pages this image holds the same array of as another image
        #: (``write_shared``): copied before a write into them
        self._shared: set[int] = set()

    def _invalidate(self, chunks: Iterable[int]) -> None:
        """Drop the cached entries (and noted digests) indexed under any of ``chunks``."""
        idx, cache, dig = self._idx, self._cache, self._dig
        for c in chunks:
            keys = idx.pop(c, None)
            if keys:
                for k in keys:
                    e = cache.pop(k, None)
                    if e is not None:
                        self._release(e)
                    if dig:
                        dig.pop(k, None)

    def _hold(self, entry: list[Any]) -> None:
        """Count ``entry`` cached under one more key (its bytes on the first)."""
        n = self._keys.get(id(entry), 0)
        if not n:
            self._bytes += entry[0].nbytes
        self._keys[id(entry)] = n + 1

    def _release(self, entry: list[Any]) -> None:
        """Count ``entry`` cached under one key fewer (its bytes back on the last)."""
        n = self._keys[id(entry)] - 1
        if n:
            self._keys[id(entry)] = n
        else:
            del self._keys[id(entry)]
            self._bytes -= entry[0].nbytes

    def _keep(self, key: tuple[Any, ...], nbytes: int, entry: list[Any],
              isz: int = 1) -> None:
        """Cache ``entry`` for ``key`` = (addr, shape, dtype, element strides | None), indexed
        by the chunks its read touches (``isz``: bytes per element, for strided keys)."""
        cache = self._cache
        old = cache.pop(key, None)
        if old is not None:
            self._release(old)
        self._hold(entry)
        while len(cache) >= _CACHE_CAP or (self._bytes > _CACHE_BYTES and cache):
            self._release(cache.popitem(last=False)[1])
            self._evicted += 1
        if self._evicted >= _DIG_SPAN:
            # the index still lists evicted keys (harmless: popping them is a no-op) and
            # serves the digest memo: both start over, and with them the cache
            self._forget()
            self._hold(entry)
        cache[key] = entry
        idx = self._idx
        for c in _chunks(key[0], nbytes, key[1], key[3], isz):
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
        if not strides:
            d = self._dirty.get(addr) if self._dirty else None
            if d is not None and d.__class__ is list:       # (a dirty span as written)
                s = d[0]
                if s.shape == shape and s.dtype == STORAGE[dtype]:
                    return d
            st = None
        else:
            st = tuple(strides)
        key = (addr, shape, dtype, st)
        cache = self._cache
        entry = cache.get(key)
        if entry is not None:
            cache.move_to_end(key)
        else:
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
        flags = stored.flags
        if flags.writeable:
            flags.writeable = False
        self._keep((addr, stored.shape, dtype, None), stored.nbytes, entry)

    def write_entry(self, addr: int, dtype: str, entry: list[Any]) -> None:
        """``write(addr, entry[0])`` then ``remember(addr, dtype, entry)``, with the page bytes
        deferred: the array is kept dirty (module docstring) until a read or a partial
        overwrite through the pages needs them."""
        stored = entry[0]
        nbytes = stored.nbytes
        flags = stored.flags
        if not nbytes or not flags.c_contiguous:
            self.write(addr, stored)
            self.remember(addr, dtype, entry)
            return
        lo, hi = addr >> _CHUNK_BITS, (addr + nbytes - 1) >> _CHUNK_BITS
        idx = self._idx
        if idx and (lo in idx or (hi > lo and any(c in idx for c in range(lo + 1, hi + 1)))):
            self._invalidate(range(lo, hi + 1) if hi > lo else (lo,))
        dirty = self._dirty
        old = dirty.get(addr)
        if old is not None and (old.nbytes if old.__class__ is _Dead
                                else old[0].nbytes) == nbytes:
            # the same span again (a reused buffer): no other dirty entry overlaps it, as
            # none overlaps the one it replaces, and the span's chunks are indexed already
            dirty[addr] = entry
        else:
            dchunk = self._dchunk
            if dchunk and (lo in dchunk or hi in dchunk or any(
                    c in dchunk for c in range(lo + 1, hi))):
                self._displace(addr, nbytes, lo, hi, True)
            dirty[addr] = entry
            for c in range(lo, hi + 1):
                d = dchunk.get(c)
                if d is None:
                    dchunk[c] = {addr}
                else:
                    d.add(addr)
        if flags.writeable:     # (``remember``; setting the flag costs ~4x reading it)
            flags.writeable = False

    def _displace(self, addr: int, nbytes: int, lo: int, hi: int, covering: bool) -> None:
        """Dirty arrays overlapping ``[addr, addr + nbytes)`` (chunks ``lo..hi``) are written to
        the pages, or, when ``covering`` (a contiguous write of the whole span follows), those
        lying wholly inside it are dropped instead."""
        end = addr + nbytes
        dirty, dchunk = self._dirty, self._dchunk
        for c in range(lo, hi + 1):
            ds = dchunk.get(c)
            if not ds:
                continue
            for d in list(ds):
                ent = dirty.get(d)
                if ent is None:
                    continue
                dead = ent.__class__ is _Dead
                dend = d + (ent.nbytes if dead else ent[0].nbytes)
                if d < end and addr < dend:
                    del dirty[d]
                    for c2 in range(d >> _CHUNK_BITS, ((dend - 1) >> _CHUNK_BITS) + 1):
                        s2 = dchunk.get(c2)
                        if s2 is not None:
                            s2.discard(d)
                            if not s2:
                                del dchunk[c2]
                    if not (covering and addr <= d and dend <= end) and not dead:
                        self._put(d, ent[0].reshape(-1).view(np.uint8))

    def drop(self, spans: Iterable[tuple[int, int]]) -> None:
        """Forget what was written to each ``(addr, nbytes)`` span: the caller knows nothing
        reads those bytes before a later write covers them (a buffer whose owner died). A
        dirty entry spanning exactly such a span is replaced by a ``_Dead`` marker of its
        size (never written to the pages: the next write there takes ``write_entry``'s
        same-span path); other cached reads of the span age out of the cache. Anything
        else stays: keeping bytes is always correct. Without it every PE's TCM stays
        resident as dirty arrays once the allocators cycled through it (512 MiB on
        default.yaml at 1.0 M gemm ops)."""
        dirty, dead = self._dirty, _DEAD
        get = dirty.get
        for addr, nbytes in spans:
            ent = get(addr)
            if ent is None or ent.__class__ is _Dead or ent[0].nbytes != nbytes:
                continue
            mark = dead.get(nbytes)
            if mark is None:
                mark = dead[nbytes] = _Dead(nbytes)
            dirty[addr] = mark

    def _settle(self, addr: int, nbytes: int) -> None:
        """Write the dirty arrays overlapping ``[addr, addr + nbytes)`` to the pages."""
        if nbytes > 0:
            self._displace(addr, nbytes, addr >> _CHUNK_BITS,
                           (addr + nbytes - 1) >> _CHUNK_BITS, False)

    def clear(self) -> None:
        """Forget every page and cached read (the image reads as zeros again): a capture
        frees its images this way once the kernels ran and the outputs were gathered."""
        self._pages.clear()
        self._shared.clear()
        self._dirty.clear()
        self._dchunk.clear()
        self._forget()

    def forget_reads_at(self, addrs: Iterable[int]) -> None:
        """Drop the cached reads starting at each of ``addrs`` (a caller that knows nothing
        reads there again: verify, from the order it runs the ops in; a later read would
        read the pages again); their keys leave the index unless a noted digest needs them
        (kept, every A / B tile's key of a 1.0 M-op gemm was there: ~48 MiB)."""
        idx, cache, dig = self._idx, self._cache, self._dig
        for addr in addrs:
            keys = idx.get(addr >> _CHUNK_BITS)
            if keys:
                for k in [k for k in keys if k[0] == addr]:
                    e = cache.pop(k, None)
                    if e is not None:
                        self._release(e)
                        self._evicted += 1
                        if k not in dig:
                            isz = e[0].itemsize
                            for c in _chunks(k[0], span_elems(k[1], k[3]) * isz, k[1], k[3], isz):
                                idx.get(c, _NO_KEYS).discard(k)

    def forget_reads(self) -> None:
        """Drop the read cache (and the digest memo): the pages and dirty spans stay, so
        every read returns what it did (verify, once its ops ran: the A / B tiles of a
        1.0 M-op gemm were 81 MiB of it)."""
        self._forget()

    def _forget(self) -> None:
        """Start the read cache, its index and the digest memo over (the pages stay)."""
        self._cache.clear()
        self._idx.clear()
        self._dig.clear()
        self._evicted = 0
        self._bytes = 0
        self._keys.clear()

    def _page(self, no: int) -> np.ndarray:
        """Page ``no`` to write into: made (zeros) if missing, copied first if shared."""
        page = self._pages.get(no)
        if page is None:
            page = self._pages[no] = np.zeros(_PAGE, dtype=np.uint8)
        elif no in self._shared:
            page = self._pages[no] = page.copy()
            self._shared.discard(no)
        return page

    def write_shared(self, other: MemoryImage, addr: int, stored: np.ndarray) -> None:
        """``write(addr, stored)`` into this image and ``other`` (contiguous), the pages
        both hold alike kept once: shared (each image copies a shared page before it writes
        into it, ``_page``). Capture's two images start with the same tensors (``Tracer
        .write_initial``): at 1.0 M gemm ops on default.yaml they held the inputs twice
        (97 MiB each). Where either holds a page of its own there (or ``other`` reads it
        through a cache or dirty arrays), ``other`` gets a plain ``write``."""
        nbytes = stored.nbytes
        if nbytes <= 0 or other._idx or other._dirty:
            self.write(addr, stored)
            other.write(addr, stored)
            return
        nos = range(addr >> _PAGE_BITS, ((addr + nbytes - 1) >> _PAGE_BITS) + 1)
        mine, theirs = self._pages, other._pages
        fresh = {no for no in nos if no not in mine and no not in theirs}
        first, end = (addr + _MASK) >> _PAGE_BITS, (addr + nbytes) >> _PAGE_BITS
        if (end > first and stored.flags.c_contiguous and not self._idx and not self._dirty
                and all(no in fresh for no in range(first, end))):
            # the whole pages it covers, in neither image yet: both borrow them from
            # ``stored`` (read-only views, copied before a write like any shared page), so
            # the tensor's bytes are held once, not once more by the pages (a gemm's inputs:
            # 81 MiB at 1.0 M ops); the partial pages at either end are written as before
            buf = stored.reshape(-1).view(np.uint8)
            for no in range(first, end):
                page = buf[(no << _PAGE_BITS) - addr:((no + 1) << _PAGE_BITS) - addr]
                page.flags.writeable = False
                mine[no] = theirs[no] = page
                self._shared.add(no)
                other._shared.add(no)
            head, tail = (first << _PAGE_BITS) - addr, (end << _PAGE_BITS) - addr
            if head:
                self.write_shared(other, addr, buf[:head])
            if tail < nbytes:
                self.write_shared(other, addr + tail, buf[tail:])
            return
        for no in nos:       # a page shared by the two takes this write once, in place
            if (no in self._shared and theirs.get(no) is mine.get(no)
                    and mine[no].flags.writeable):      # (not a page borrowed from a tensor)
                self._shared.discard(no)
        self.write(addr, stored)
        rest = False
        for no in nos:
            page, op = mine[no], theirs.get(no)
            if op is page or (op is None and no in fresh):
                theirs[no] = page
                self._shared.add(no)
                other._shared.add(no)
            else:
                rest = True
        if rest:                # (pages ``other`` had of its own: written there too)
            other.write(addr, stored)

    def read_bytes(self, addr: int, nbytes: int) -> np.ndarray:
        if self._dirty:
            self._settle(addr, nbytes)
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
        if self._idx or self._dirty:
            lo, hi = addr >> _CHUNK_BITS, (addr + max(nbytes, 1) - 1) >> _CHUNK_BITS
            if self._idx:
                self._invalidate(range(lo, hi + 1))
            if self._dirty and nbytes:
                self._displace(addr, nbytes, lo, hi, True)
        self._put(addr, buf)

    def _put(self, addr: int, buf: np.ndarray) -> None:
        """Bytes ``buf`` (uint8) into the pages at ``addr`` (the cache is told by the caller)."""
        nbytes = buf.size
        off = addr & _MASK
        if off + nbytes <= _PAGE:  # within one page (the common case)
            page = self._pages.get(addr >> _PAGE_BITS)
            if page is None or self._shared:
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
        if self._dirty:
            self._settle(addr, nbytes)
        off = addr & _MASK
        bstrides = tuple(s * isz for s in strides)
        if off + nbytes <= _PAGE and off % isz == 0:
            page = self._pages.get(addr >> _PAGE_BITS)
            if page is None:
                return np.zeros(shape, dtype=sdt)
            # a view of the page (no copy of the span: the ndarray constructor, ~7x cheaper
            # than as_strided), then the tile gathered; always a copy: a view would alias
            return np.ndarray(shape, sdt, page, off, bstrides).copy()
        runs = _page_rows(addr, shape, strides, isz)
        if runs is not None:              # rows gathered page by page, never the whole span
            return self._gather(addr, shape, sdt, bstrides, runs)
        return np.ndarray(shape, sdt, self.read_bytes(addr, nbytes), 0, bstrides).copy()

    def _gather(self, addr: int, shape: tuple[int, ...], sdt: np.dtype, bstrides: tuple[int, ...],
                runs: list[tuple[int, int, int]]) -> np.ndarray:
        """``read``'s strided tile over ``_page_rows``' runs: a view of each run's page
        copied into its rows (a row across a boundary through a copy of its own span)."""
        out = np.empty(shape, dtype=sdt)
        pages, step, rest = self._pages, bstrides[0], shape[1:]
        for r0, r1, ext in runs:
            a = addr + r0 * step
            if ext:
                out[r0] = np.ndarray(rest, sdt, self.read_bytes(a, ext), 0, bstrides[1:])
                continue
            page = pages.get(a >> _PAGE_BITS)
            if page is None:
                out[r0:r1] = 0
            else:
                out[r0:r1] = np.ndarray((r1 - r0, *rest), sdt, page, a & _MASK, bstrides)
        return out

    def write(self, addr: int, stored: np.ndarray, strides: Sequence[int] | None = None) -> None:
        """Write a storage-dtype array at ``addr`` (contiguous, or scattered with element strides)."""
        if not strides:
            self.write_bytes(addr, stored)
            return
        isz = stored.dtype.itemsize
        if self._idx or self._dirty:
            nbytes = span_elems(stored.shape, strides) * isz
            if self._idx:
                self._invalidate(_chunks(addr, nbytes, stored.shape, tuple(strides), isz))
            if self._dirty:     # (a strided write leaves gaps: what it overlaps goes to pages)
                self._settle(addr, nbytes)
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
            runs = _page_rows(addr, shape, strides, isz)
            if runs is not None:
                step = strides[0] * isz
                for r0, r1, _ in runs:
                    self._scatter(addr + r0 * step, stored[r0:r1], strides, isz)
                return
        bstrides = tuple(s * isz for s in strides)
        if in_page:
            np.ndarray(shape, stored.dtype, self._page(addr >> _PAGE_BITS), off, bstrides)[...] = stored
            return
        flat = self.read_bytes(addr, nbytes)
        np.ndarray(shape, stored.dtype, flat, 0, bstrides)[...] = stored
        self.write_bytes(addr, flat)
