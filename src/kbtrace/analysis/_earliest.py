"""The timeline's fabric cut, counted as the hops stream by (``perfetto._fabric_cut``).

``Earliest(k)`` takes the entry times of the fabric hops (link hops and HBM accesses) a batch
at a time and keeps the ``k`` earliest (``np.partition``); once it holds ``k``, a batch keeps
only the times not later than the ``k``-th earliest so far before it is added (a later one
cannot be among the ``k`` earliest; a NaN there filters nothing). The island twins' scan of
the hops (``islands._hop_rows``) feeds one when ``Run.materialize`` asks, so the timeline need
not scan the 29 M hops of a million gemm ops again (~0.45 CPU s through DuckDB).
"""

from __future__ import annotations

import numpy as np

__all__ = ["Earliest"]


class Earliest:
    """The number of times added and the ``k``-th earliest of them (see the module docstring).
    ``complete``: set by the feeder once every fabric hop was added."""

    def __init__(self, k: int) -> None:
        self.k, self.n, self.complete = k, 0, False
        self.low = np.empty(0)
        self._top = np.inf

    def add(self, t: np.ndarray) -> None:
        self.n += len(t)
        self.low = np.concatenate([self.low, t[t <= self._top] if self._top < np.inf else t])
        if len(self.low) > self.k:
            self.low = np.partition(self.low, self.k - 1)[:self.k]
            self._top = float(self.low.max())

    def cut(self) -> float | None:
        """The ``k``-th earliest time, when more than ``k`` were added and it is finite."""
        if self.n <= self.k or not len(self.low):
            return None
        c = float(self.low.max())
        return c if np.isfinite(c) else None

    def close(self) -> None:
        """(Held in ``Run._scans`` while the views are made, which closes what it holds.)"""
        self.low = np.empty(0)
