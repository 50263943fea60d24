"""Busy intervals of an exclusive resource: a flat sorted list ``[s0, e0, s1, e1, ...]``.

Used by fast mode for node overheads (``fabric``). Intervals are disjoint and may touch.

``TIME_EPS``: a gap short of a reservation by less than this still holds it (the
reservation is clipped to the gap). Fast mode computes the same times by different
sums (a closed form's offsets, or hop by hop), which differ in the last bits, and exact
ties between reservations are common (back-to-back transfers); without the tolerance a
rounding error of 1e-14 ns could decide whether a transfer waits a whole overhead.

``tol(t)``: the tolerance of the invariants' time comparisons at time ``t``; ``row_faults``:
which busy rows break invariant 1 on their own under it (``invariants``' busy check, and the
recorder naming the op whose row such a check caught).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

__all__ = ["prune", "TIME_EPS", "EPS_NS", "REL_EPS", "tol", "row_faults"]

TIME_EPS = 1e-9     # ns

#: the invariants' comparisons of times allow ``EPS_NS + REL_EPS * |t|``: float64 sums of
#: durations lose precision relative to the times summed, so a fixed tolerance alone fails
#: slow but legal parameters (HBM 1e-10 GB/s, GEMM clock 1e-9 GHz: times of 1e11 ns and more)
EPS_NS = 1e-6
REL_EPS = 1e-9


def tol(t: Any) -> Any:
    """The tolerance of a comparison at time(s) ``t`` (ns; a float or a numpy array)."""
    return EPS_NS + REL_EPS * abs(t)


def row_faults(s: Any, e: Any, b: Any) -> tuple[Any, Any]:
    """Two masks over busy rows ``[s, e]`` busy ``b`` ns (numpy arrays): a negative duration
    (busy below zero, or the interval ending before it starts) and busy longer than the
    interval (over 100%), each beyond ``tol(e)``."""
    te = tol(e)
    return (b < -te) | (e < s - te), b > (e - s) + te


def prune(iv: list[float], now: float) -> None:
    """Drop the intervals that ended at or before ``now`` (they can block nothing)."""
    k = bisect_right(iv, now)
    del iv[:k - (k & 1)]
