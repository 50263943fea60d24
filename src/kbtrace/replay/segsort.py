"""The recorder's batch kernels as plain loops, for the compiled core: sorts, the busy-window
sweep, and the expansion of compact transfers.

Each hop batch is put in (op rank, time) order twice (``Recorder.flush``: hop order and
``crit_ns`` order) and its busy intervals, with the windows carried from earlier batches, in
(resource, start) order, then swept into connected windows (``invariants.BusyCheck``).
Numpy does that in passes over whole columns (``colsort.lexsort2``: a stable argsort of the
times and a radix pass on the integer key; the sweep ranks the ends with one more argsort
to find each resource's running maximum), which is what runs interpreted. Compiled
(``setup.py``: ``_segsort_c``, typed by ``segsort.pxd``), these loops do the same in one
or two passes: ``order`` places the rows by their integer key (a counting sort: stable)
and sorts each key's rows by time in place (insertion sort for a few rows, a stable merge
sort for more), ``windows`` walks the sorted intervals once, ``expand`` writes the pending
rows (``Recorder._pending``: compact transfers expanded by their plans, explicit rows
between them) in one pass instead of numpy's repeat / gather / scatter passes, and
``finish`` writes a batch's output columns in hop order, typed, with each row's
``crit_ns`` and each op's ``t_end``, in two passes instead of some thirty numpy gathers,
casts and sweeps (``Recorder.flush``).
``fabric.core.seg_kernels()`` gives the compiled module, or None where the core is pure
Python.

Both give the same results as the numpy passes: ``order`` the permutation ``np.lexsort``
gives (ties by position; times must not be NaN: the callers check), ``windows`` the same
windows (starts, ends, counts; a window's busy time is summed in row order here and
pairwise by ``np.add.reduceat`` there, so it may differ in its last bits: it is compared
with a tolerance and written nowhere), ``expand`` and ``finish`` the same values bit for bit
(an op's ``queue_ns``, a sum, stays numpy's ``np.add.reduceat`` in both).
"""

from __future__ import annotations

import numpy as np

__all__ = ["order", "windows", "expand", "finish", "SMALL"]

#: a key's rows sorted by insertion up to this many, by merging beyond
SMALL = 24
_NEG_INF = float("-inf")


def order(minor: np.ndarray, major: np.ndarray, lo: int, span: int) -> np.ndarray:
    """``np.lexsort((minor, major))`` (``minor`` float64 without NaN, ``major`` int64 in
    ``[lo, lo + span)``): the permutation sorting by ``major``, ties by ``minor``, then by
    position."""
    n = len(minor)
    out = np.empty(n, dtype=np.int64)
    _order(minor, major, lo, np.zeros(span + 1, dtype=np.int64), out,
           np.empty(n, dtype=np.int64))
    return out


def _order(minor: np.ndarray, major: np.ndarray, lo: int, cnt: np.ndarray, out: np.ndarray,
           tmp: np.ndarray) -> None:
    n = minor.shape[0]
    span = cnt.shape[0] - 1
    small = SMALL
    for i in range(n):                      # counting sort by major (stable)
        cnt[major[i] - lo + 1] += 1
    for k in range(1, span + 1):
        cnt[k] += cnt[k - 1]
    for i in range(n):
        k = major[i] - lo
        out[cnt[k]] = i
        cnt[k] += 1
    a = 0
    for k in range(span):                   # each key's rows [a, b) by minor (stable)
        b = cnt[k]
        if b - a <= small:
            _insertion(minor, out, a, b)
        else:
            _merge_sort(minor, out, tmp, a, b)
        a = b


def _insertion(minor: np.ndarray, out: np.ndarray, a: int, b: int) -> None:
    """``out[a:b]`` stably by ``minor``, in place (insertion sort: for short runs)."""
    for i in range(a + 1, b):
        x = out[i]
        v = minor[x]
        j = i - 1
        while j >= a and minor[out[j]] > v:
            out[j + 1] = out[j]
            j -= 1
        out[j + 1] = x


def _merge_sort(minor: np.ndarray, out: np.ndarray, tmp: np.ndarray, a: int, b: int) -> None:
    """``out[a:b]`` stably by ``minor``: runs of ``SMALL`` by insertion, then merged pairwise
    (through ``tmp``)."""
    small = SMALL
    r = a
    while r < b:
        e = r + small if r + small < b else b
        _insertion(minor, out, r, e)
        r = e
    w = small
    while w < b - a:
        r = a
        while r < b:
            m = r + w if r + w < b else b
            e = r + 2 * w if r + 2 * w < b else b
            i = r
            j = m
            k = r
            while i < m and j < e:
                if minor[out[j]] < minor[out[i]]:   # (ties: the left run's first)
                    tmp[k] = out[j]
                    j += 1
                else:
                    tmp[k] = out[i]
                    i += 1
                k += 1
            while i < m:
                tmp[k] = out[i]
                i += 1
                k += 1
            while j < e:
                tmp[k] = out[j]
                j += 1
                k += 1
            for i in range(r, e):
                out[i] = tmp[i]
            r = e
        w *= 2


def windows(res: np.ndarray, s: np.ndarray, e: np.ndarray, b: np.ndarray, c: np.ndarray,
            perm: np.ndarray, eps: float, rel: float) -> tuple[np.ndarray, ...]:
    """The connected windows of intervals ``(res, s, e, b, c)`` (resource, start, end, busy,
    count) taken in the order ``perm`` (by resource, then start): a window opens at a
    resource's first interval and where a start lies beyond the resource's running maximum
    end ``m`` by more than ``eps + rel * |m|``. Returns ``(resource, start, end, busy,
    count)`` per window, in that order."""
    n = len(perm)
    w_r = np.empty(n, dtype=np.int64)
    w_s = np.empty(n)
    w_e = np.empty(n)
    w_b = np.empty(n)
    w_c = np.empty(n, dtype=np.int64)
    m = _windows(res, s, e, b, c, perm, eps, rel, w_r, w_s, w_e, w_b, w_c)
    return w_r[:m], w_s[:m], w_e[:m], w_b[:m], w_c[:m]


def _windows(res: np.ndarray, s: np.ndarray, e: np.ndarray, b: np.ndarray, c: np.ndarray,
             perm: np.ndarray, eps: float, rel: float, w_r: np.ndarray, w_s: np.ndarray,
             w_e: np.ndarray, w_b: np.ndarray, w_c: np.ndarray) -> int:
    n = perm.shape[0]
    m = -1
    run = 0.0
    r0 = 0
    for i in range(n):
        k = perm[i]
        r = res[k]
        x = e[k]
        if m < 0 or r != r0:                # a resource's first interval
            r0 = r
            run = x
        elif s[k] > run + (eps + rel * abs(run)):  # beyond the running end: a new window
            if x > run:
                run = x
        else:                               # in the window
            if x > w_e[m]:
                w_e[m] = x
            w_b[m] += b[k]
            w_c[m] += c[k]
            if x > run:
                run = x
            continue
        m += 1
        w_r[m] = r
        w_s[m] = s[k]
        w_e[m] = x
        w_b[m] = b[k]
        w_c[m] = c[k]
    return m + 1


def expand(C: np.ndarray, X: np.ndarray, off: np.ndarray, pnb: np.ndarray, pst: np.ndarray,
           pnd: np.ndarray, plk: np.ndarray, pbusy: np.ndarray, pen: np.ndarray,
           pla: np.ndarray, plb: np.ndarray, pterm: np.ndarray, m: int) -> np.ndarray:
    """``Recorder._pending``'s columns (``(10, m)``: op, tile, stage, node, link, enter,
    leave, busy, queue, nbytes) of compact transfers ``C`` (``(position, op, tile, plan, h0,
    t0, done, n)`` rows) and explicit rows ``X`` in creation order: explicit row ``i`` after
    the rows of every transfer recorded at position ``<= i``. A transfer's ``j``-th row is
    its plan's (row ``off[plan] + j``): enter ``h0 + EN``, leave ``max(t0 + LA, h0 + LB)``
    (as ``np.maximum``: a NaN first operand wins) or ``done`` for the terminal row, queue 0."""
    out = np.empty((10, m))
    _expand(C, X, off, pnb, pst, pnd, plk, pbusy, pen, pla, plb, pterm.view(np.uint8), out)
    return out


def _expand(C: np.ndarray, X: np.ndarray, off: np.ndarray, pnb: np.ndarray, pst: np.ndarray,
            pnd: np.ndarray, plk: np.ndarray, pbusy: np.ndarray, pen: np.ndarray,
            pla: np.ndarray, plb: np.ndarray, pterm: np.ndarray, out: np.ndarray) -> None:
    nc = C.shape[0]
    nx = X.shape[0]
    r = 0                                   # the next output row
    ix = 0                                  # the next explicit row
    for t in range(nc + 1):
        pos = int(C[t, 0]) if t < nc else nx
        while ix < pos:                     # explicit rows created before this transfer
            for f in range(10):
                out[f, r] = X[ix, f]
            ix += 1
            r += 1
        if t == nc:
            break
        pid = int(C[t, 3])
        h0 = C[t, 4]
        t0 = C[t, 5]
        base = off[pid]
        for j in range(int(C[t, 7])):
            i = base + j
            out[0, r] = C[t, 1]
            out[1, r] = C[t, 2]
            out[2, r] = pst[i]
            out[3, r] = pnd[i]
            out[4, r] = plk[i]
            out[5, r] = h0 + pen[i]
            if pterm[i]:
                out[6, r] = C[t, 6]
            else:
                a = t0 + pla[i]
                b = h0 + plb[i]
                out[6, r] = a if (a >= b or a != a) else b
            out[7, r] = pbusy[i]
            out[8, r] = 0.0
            out[9, r] = pnb[pid]
            r += 1


def finish(P: np.ndarray, order: np.ndarray, lo: np.ndarray, t_issue: np.ndarray,
           t_end: np.ndarray) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """``Recorder.flush``'s columns of a batch of finalised rows ``P`` (``(10, n)``, as
    ``expand`` writes them) in hop order ``order`` (by op rank, then enter), with ``crit_ns``
    from the crit order ``lo`` (by op rank, then leave): ``([op, hop, tile, stage, node,
    link, enter, leave, busy, queue, crit, nbytes], starts, seg_ops)`` (``hop`` / ``tile`` /
    ``node`` / ``link`` int32, ``stage`` int16, ``op`` / ``nbytes`` int64; each op's first
    position and its id). Each op's ``t_end`` becomes the latest of it and its rows' leave
    times (``t_end`` is updated in place). The same values as the numpy passes there:
    ``np.maximum``'s (NaN first), the same subtractions and casts."""
    n = order.shape[0]
    op = np.empty(n, dtype=np.int64)
    hop = np.empty(n, dtype=np.int32)
    tile = np.empty(n, dtype=np.int32)
    stage = np.empty(n, dtype=np.int16)
    node = np.empty(n, dtype=np.int32)
    link = np.empty(n, dtype=np.int32)
    en = np.empty(n)
    lv = np.empty(n)
    busy = np.empty(n)
    q = np.empty(n)
    crit = np.empty(n)
    nb = np.empty(n, dtype=np.int64)
    starts = np.empty(n, dtype=np.int64)
    seg_ops = np.empty(n, dtype=np.int64)
    tmp = np.empty(n)
    m = _finish(P, order, lo, t_issue, t_end, tmp, op, hop, tile, stage, node, link, en, lv,
                busy, q, crit, nb, starts, seg_ops)
    return ([op, hop, tile, stage, node, link, en, lv, busy, q, crit, nb], starts[:m],
            seg_ops[:m])


def _mx(a: float, b: float) -> float:
    """``np.maximum(a, b)``: NaN if either is."""
    return a if (a >= b or a != a) else b


def _finish(P: np.ndarray, order: np.ndarray, lo: np.ndarray, t_issue: np.ndarray,
            t_end: np.ndarray, crit_r: np.ndarray, op: np.ndarray, hop: np.ndarray,
            tile: np.ndarray, stage: np.ndarray, node: np.ndarray, link: np.ndarray,
            en: np.ndarray, lv: np.ndarray, busy: np.ndarray, q: np.ndarray,
            crit: np.ndarray, nb: np.ndarray, starts: np.ndarray, seg_ops: np.ndarray) -> int:
    n = order.shape[0]
    m = 0
    i = 0
    while i < n:                            # crit, one op (a run of one op id) at a time
        x = P[0, lo[i]]
        j = i + 1
        while j < n and P[0, lo[j]] == x:
            j += 1
        o = int(x)
        iss = t_issue[o]
        y = P[6, lo[i]]
        for k in range(i + 1, j):           # (np.maximum.reduceat)
            y = _mx(y, P[6, lo[k]])
        te = _mx(t_end[o], y)
        prev = _NEG_INF
        for k in range(i, j):
            y = P[6, lo[k]]
            f = _mx(prev, iss)
            crit_r[lo[k]] = y - f if y > f else 0.0
            prev = y
        f = _mx(iss, prev)
        if te > f:
            crit_r[lo[j - 1]] += te - f
        t_end[o] = te
        starts[m] = i
        seg_ops[m] = o
        m += 1
        i = j
    s = 0
    for k in range(n):                      # the columns in hop order
        r = order[k]
        x = P[0, r]
        if k == 0 or x != P[0, order[k - 1]]:
            s = k
        op[k] = int(x)                      # (truncated, as astype does)
        hop[k] = k - s
        tile[k] = int(P[1, r])
        stage[k] = int(P[2, r])
        node[k] = int(P[3, r])
        link[k] = int(P[4, r])
        en[k] = P[5, r]
        lv[k] = P[6, r]
        busy[k] = P[7, r]
        q[k] = P[8, r]
        crit[k] = crit_r[r]
        nb[k] = int(P[9, r])
    return m
