"""Address geometry of the memory image (``image.MemoryImage``): its 1 MiB pages, the read
cache's 8 KiB invalidation chunks, and what a strided view spans and touches of them.

Pure functions of an address, a shape and strides (no state): ``span_elems`` (also the
capture's op geometry, ``_semantics``), ``_chunks`` (the read-cache chunks a read touches)
and ``_page_rows`` (a strided tile's rows grouped by the page they lie in).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = ["span_elems"]

_PAGE_BITS = 20
_PAGE = 1 << _PAGE_BITS
_MASK = _PAGE - 1
_CHUNK_BITS = 13   # read-cache invalidation granularity (8 KiB)


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
    starts = range(addr, addr + shape[0] * step, step)
    if ext <= 1 << _CHUNK_BITS:    # each row touches the chunk it starts in and its last byte's
        out = {a >> _CHUNK_BITS for a in starts}
        out.update({(a + ext - 1) >> _CHUNK_BITS for a in starts})
        return out
    out = set()
    for a in starts:
        out.update(range(a >> _CHUNK_BITS, ((a + ext - 1) >> _CHUNK_BITS) + 1))
    return out


def _page_rows(addr: int, shape: tuple[int, ...], strides: Sequence[int],
               isz: int) -> list[tuple[int, int, int]] | None:
    """Runs ``(r0, r1, ext)`` of a strided view's leading rows: ``ext`` 0 for rows that all lie
    within one page, else a single row across a page boundary and the bytes its span takes.
    None where runs do not help: one row, an unaligned address, or rows that interleave (a
    transposed tile), which copy their whole span.

    A (BM, BK) tile of a (M, K) matrix spans ~BM x K elements: copying the span to gather
    the tile made each such read and write O(K) once the span outgrew a page."""
    if len(shape) < 2 or shape[0] < 2 or addr % isz or min(strides) < 0:
        return None
    step = strides[0] * isz
    ext = span_elems(shape[1:], strides[1:]) * isz
    if ext == 0 or step < ext:
        return None
    runs: list[tuple[int, int, int]] = []
    r0, n = 0, shape[0]
    while r0 < n:
        a = addr + r0 * step
        page_end = ((a >> _PAGE_BITS) + 1) << _PAGE_BITS
        if a + ext <= page_end:
            r1 = min(n, (page_end - ext - addr) // step + 1)
            runs.append((r0, r1, 0))
        else:
            r1 = r0 + 1
            runs.append((r0, r1, ext))
        r0 = r1
    return runs
