"""The recorder's pending rows: float64 fields written in place into one growable buffer.

``Recorder`` keeps the hop rows it cannot finalise yet (explicit rows, ten fields; fast
mode's compact transfer records, eight) and the ops completed since the last flush (five)
until their batch is flushed. A row is written
field by field into a flat ``array('d')`` (``HopRows.add``, ``CompactRows.add``) instead of
being kept as a tuple of Python numbers and converted with ``np.fromiter`` at the flush;
``take()`` hands the rows over as an ``(n, width)`` numpy array, ``clear()`` empties the
buffer (kept, so a run allocates it a few times, not once per row). ``IssueRows`` is the
recorder's issue log in the same form (two fields per issued op, the oldest dropped with
``drop``).

Compiled with the fast-mode core (``setup.py``: ``_rowbuf_c``, typed by ``rowbuf.pxd``: the
buffer is a typed memoryview of the array, so a row is ten C stores); this file is the
reference and what runs where nothing was compiled. Both store the same doubles (a Python
int or float converted as ``float()`` does), so the batches written are byte-identical.

The id fields (op, tile, stage, node, link, bytes, plan, count) arrive as Python ints and
are stored through ``float()``: compiled, that reads an int straight into a C double, where a
``double`` parameter or a store of the int first makes a float object of it
(``PyFloat_AsDouble``: ~30 per op of a gemm replay before).
"""

from __future__ import annotations

from array import array

import numpy as np

__all__ = ["HopRows", "CompactRows", "DoneRows", "IssueRows"]


class _Rows:
    """Rows of ``width`` float64 fields, in the order they were added."""
    __slots__ = ("width", "n", "cap", "_arr", "_buf")

    def __init__(self, width: int, cap: int = 1024) -> None:
        self.width = width
        self.n = 0
        self.cap = cap
        self._arr = array("d", bytes(8 * width * cap))
        self._buf = self._arr           # compiled: a typed view of ``_arr``

    def _grow(self) -> None:
        """Double the capacity (a new array: one with a view on it cannot be resized)."""
        new = array("d", bytes(16 * self.width * self.cap))
        new[:self.n * self.width] = self._arr[:self.n * self.width]
        self._arr = new
        self._buf = new
        self.cap *= 2

    def take(self) -> np.ndarray:
        """The rows added since the last ``clear`` as an ``(n, width)`` float64 array (a copy)."""
        m = self.n * self.width
        return np.frombuffer(self._arr, dtype=np.float64, count=m).reshape(
            self.n, self.width).copy()

    def clear(self) -> None:
        self.n = 0

    def drop(self, k: int) -> None:
        """Forget the first ``k`` rows (the rest move to the front: a slice assignment of the
        same, non-zero length, what an array allows while the view on it is held)."""
        w = self.width
        m = (self.n - k) * w
        if m:
            self._arr[:m] = self._arr[k * w:self.n * w]
        self.n -= k


class HopRows(_Rows):
    """Explicit hop rows: ``(op, tile, stage_code, node, link, enter, leave, busy, queue,
    nbytes)``."""
    __slots__ = ()

    def __init__(self, cap: int = 1024) -> None:
        super().__init__(10, cap)

    def add(self, op: int, tile: int, stage: int, node: int, link: int, enter: float,
            leave: float, busy: float, queue: float, nbytes: int) -> None:
        if self.n == self.cap:
            self._grow()
        i = self.n * 10                 # (the view indexed in place: a local copy of it
        self._buf[i] = float(op)        # costs two atomic reference counts per row)
        self._buf[i + 1] = float(tile)
        self._buf[i + 2] = float(stage)
        self._buf[i + 3] = float(node)
        self._buf[i + 4] = float(link)
        self._buf[i + 5] = enter
        self._buf[i + 6] = leave
        self._buf[i + 7] = busy
        self._buf[i + 8] = queue
        self._buf[i + 9] = float(nbytes)
        self.n += 1

    def extend(self, rows: list[tuple]) -> None:
        """Rows given as tuples of the ten fields (compiled: each a direct call of ``add``,
        its fields read as a tuple's items: a row of another type is a TypeError there)."""
        for r in rows:
            self.add(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9])


class CompactRows(_Rows):
    """Compact transfer records: ``(position, op, tile, plan, h0, t0, done, n)``; ``rows``:
    the rows they stand for (the sum of ``n``); ``x``: the explicit rows, among which
    ``transfer`` places a record."""
    __slots__ = ("x", "rows")

    def __init__(self, cap: int = 1024, x: HopRows | None = None) -> None:
        super().__init__(8, cap)
        self.x = x
        self.rows = 0.0

    def add(self, pos: float, op: float, tile: float, plan: float, h0: float, t0: float,
            done: float, n: float) -> None:
        if self.n == self.cap:
            self._grow()
        i = self.n * 8
        self._buf[i] = pos
        self._buf[i + 1] = float(op)
        self._buf[i + 2] = float(tile)
        self._buf[i + 3] = float(plan)
        self._buf[i + 4] = h0
        self._buf[i + 5] = t0
        self._buf[i + 6] = done
        self._buf[i + 7] = float(n)
        self.n += 1
        self.rows += float(n)

    def transfer(self, op: float, tile: float, plan: float, h0: float, t0: float,
                 done: float, n: float) -> None:
        """A record placed after the explicit rows ``x`` holds so far."""
        x = self.x
        assert x is not None, "CompactRows.transfer: no explicit rows (x) to place it among"
        self.add(x.n, op, tile, plan, h0, t0, done, n)

    def clear(self) -> None:
        self.n = 0
        self.rows = 0.0


class IssueRows(_Rows):
    """Ops issued, in issue (= time) order: ``(t_issue, op)``."""
    __slots__ = ()

    def __init__(self, cap: int = 1024) -> None:
        super().__init__(2, cap)

    def add(self, t_issue: float, op: float) -> None:
        if self.n == self.cap:
            self._grow()
        i = self.n * 2
        self._buf[i] = t_issue
        self._buf[i + 1] = op
        self.n += 1


class DoneRows(_Rows):
    """Ops completed since the last flush, in completion order: ``(op, t_issue, t_start,
    t_end, engine code)``; ``codes`` / ``names``: the engines' codes (in order of first
    completion); ``x`` / ``c``: the pending hop rows, whose count says when a flush is due
    (``batch_rows``); ``iss``: the ops issued (the recorder's issue log, here so that it is
    the same build of this module as the other buffers)."""
    __slots__ = ("codes", "names", "x", "c", "batch_rows", "iss")

    def __init__(self, x: HopRows, c: CompactRows, batch_rows: int, cap: int = 1024) -> None:
        super().__init__(5, cap)
        self.codes: dict[str, int] = {}
        self.names: list[str] = []
        self.x = x
        self.c = c
        self.batch_rows = batch_rows
        self.iss = IssueRows()

    def add(self, op: int, t_issue: float, t_start: float, t_end: float, engine: str) -> bool:
        """Op ``op`` completed on ``engine`` (a node id); True when the pending hop rows make
        a batch (the recorder flushes then)."""
        code = self.codes.get(engine)
        if code is None:
            code = self.codes[engine] = len(self.names)
            self.names.append(engine)
        if self.n == self.cap:
            self._grow()
        i = self.n * 5
        self._buf[i] = op
        self._buf[i + 1] = t_issue
        self._buf[i + 2] = t_start
        self._buf[i + 3] = t_end
        self._buf[i + 4] = code
        self.n += 1
        return self.x.n + self.c.rows >= self.batch_rows
