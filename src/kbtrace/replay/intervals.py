"""Busy intervals of an exclusive resource: a flat sorted list ``[s0, e0, s1, e1, ...]``.

Used by fast mode for node overheads (``fabric``). Intervals are disjoint and may touch.

``TIME_EPS``: a gap short of a reservation by less than this still holds it (the
reservation is clipped to the gap). Fast mode computes the same times by different
sums (a closed form's offsets, or hop by hop), which differ in the last bits, and exact
ties between reservations are common (back-to-back transfers); without the tolerance a
rounding error of 1e-14 ns could decide whether a transfer waits a whole overhead.
"""

from __future__ import annotations

from bisect import bisect_right

__all__ = ["prune", "TIME_EPS"]

TIME_EPS = 1e-9     # ns


def prune(iv: list[float], now: float) -> None:
    """Drop the intervals that ended at or before ``now`` (they can block nothing)."""
    k = bisect_right(iv, now)
    del iv[:k - (k & 1)]
