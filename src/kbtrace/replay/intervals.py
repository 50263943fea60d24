"""Busy intervals of an exclusive resource: a flat sorted list ``[s0, e0, s1, e1, ...]``.

Used by fast mode for router overheads (``fabric``) and HBM pseudo-channels (``hbm``).
Intervals are disjoint and may touch; ``book_after`` and ``fit_gap`` merge touching
ones (a busy stretch is one interval, so a gap search steps over it at once), so a list
they build must not be edited by start time afterwards.

``TIME_EPS``: a gap short of a reservation by less than this still holds it (the
reservation is clipped to the gap). Fast mode computes the same times by different
sums (a closed form's offsets, or hop by hop), which differ in the last bits, and exact
ties between reservations are common (back-to-back transfers); without the tolerance a
rounding error of 1e-14 ns could decide whether a transfer waits a whole overhead.
"""

from __future__ import annotations

from bisect import bisect_right

__all__ = ["prune", "book_after", "fit_gap", "TIME_EPS"]

TIME_EPS = 1e-9     # ns


def prune(iv: list[float], now: float) -> None:
    """Drop the intervals that ended at or before ``now`` (they can block nothing)."""
    k = bisect_right(iv, now)
    del iv[:k - (k & 1)]


def book_after(iv: list[float], s: float, e: float) -> None:
    """Append ``[s, e]``, which starts at or after the last interval's end."""
    if iv and iv[-1] == s:
        iv[-1] = e
    else:
        iv.append(s)
        iv.append(e)


def fit_gap(iv: list[float], t: float, dur: float) -> float:
    """Reserve ``dur`` in the earliest gap at or after ``t``; return its end."""
    n = len(iv)
    if not n or iv[-1] <= t:
        book_after(iv, t, t + dur)
        return t + dur
    i = bisect_right(iv, t)
    s = t
    if i & 1:             # inside a busy interval: from its end
        s = iv[i]
        i += 1
    while i < n and iv[i] - s < dur - TIME_EPS:
        s = iv[i + 1]
        i += 2
    e = s + dur
    if i < n and iv[i] <= e:          # touches the next interval (or would, but for rounding)
        if i and iv[i - 1] == s:      # and the previous one: one interval now
            del iv[i - 1:i + 1]
        else:
            iv[i] = s
    elif i and iv[i - 1] == s:
        iv[i - 1] = e
    else:
        iv[i:i] = (s, e)
    return e
