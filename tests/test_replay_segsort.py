"""The recorder's compiled batch sorts and busy-window sweep (``replay/segsort.py``) give what
the numpy passes give: ``order`` the permutation of ``np.lexsort`` (ties by position), and
``windows`` the windows of ``invariants.BusyCheck``'s sweep. The ``.py`` reference is checked
on small inputs (interpreted), the compiled twin, where it is built, on large ones; a replay
with it writes the same bytes as one without (``test_replay_core``)."""

from __future__ import annotations

import numpy as np
import pytest

from kbtrace.replay import segsort
from kbtrace.replay.colsort import lexsort2
from kbtrace.replay.fabric.core import seg_kernels
from kbtrace.replay.invariants import EPS_NS, REL_EPS, BusyCheck

IMPLS = [pytest.param(segsort, 300, id="reference")]
if seg_kernels() is not None:
    IMPLS.append(pytest.param(seg_kernels(), 20_000, id="compiled"))


def _keys(rng, n, span, kind):
    major = rng.integers(0, span, n).astype(np.int64) + 10**9
    minor = (rng.integers(0, 30, n) * 0.5) if kind == "ties" else rng.random(n) * 1e6
    minor = np.asarray(minor, dtype=np.float64)
    minor[::9] = -0.0 if kind == "ties" else minor[::9]
    return minor, major


@pytest.mark.parametrize(("impl", "n"), IMPLS)
@pytest.mark.parametrize("span", [1, 4, 300, 5_000])
@pytest.mark.parametrize("kind", ["ties", "spread"])
def test_order_is_lexsort(impl, n, span, kind):
    rng = np.random.default_rng(span + n)
    minor, major = _keys(rng, n, span, kind)
    lo = int(major.min())
    got = impl.order(minor, major, lo, int(major.max()) - lo + 1)
    assert np.array_equal(got, np.lexsort((minor, major)))


def test_order_small_cases():
    minor = np.array([2.0, 1.0, 1.0, 0.5, 2.0])
    major = np.array([7, 7, 3, 7, 3], dtype=np.int64)
    assert segsort.order(minor, major, 3, 5).tolist() == [2, 4, 3, 1, 0]
    assert segsort.order(np.empty(0), np.empty(0, dtype=np.int64), 0, 1).tolist() == []
    # a key's rows past SMALL are merge-sorted: descending times, ties kept in place
    m = np.repeat(np.arange(40, 0, -1, dtype=np.float64), 2)
    assert segsort.order(m, np.zeros(80, dtype=np.int64), 0, 1).tolist() == \
        np.lexsort((m, np.zeros(80))).tolist()


def _numpy_windows(res, s, e, b, c):
    """``BusyCheck.add``'s numpy sweep (no kernels) of intervals, via a stub check."""
    chk = BusyCheck.__new__(BusyCheck)
    chk.sim = None
    chk._kernels = None
    chk._w = -np.inf
    got = []
    chk._close = got.append
    chk._open = (np.empty(0, dtype=np.int64), np.empty(0), np.empty(0), np.empty(0),
                 np.empty(0, dtype=np.int64))
    chk.add(res, s, e, b, -np.inf)
    return got[0]


@pytest.mark.parametrize(("impl", "n"), IMPLS)
@pytest.mark.parametrize("seed", range(6))
def test_windows_are_the_numpy_sweeps(impl, n, seed):
    rng = np.random.default_rng(seed)
    res = rng.integers(0, [1, 3, 40, 400, 7, 2][seed], n).astype(np.int64)
    s = np.round(rng.random(n) * 1_000, seed % 3)
    d = rng.random(n) * 4.0
    d[::7] = 0.0
    e = s + d
    e[::11] = s[::11] - 5e-7            # a hair short of its start: within the tolerance
    b = d * rng.random(n)
    b[::11] = 0.0
    c = np.ones(n, dtype=np.int64)
    want = _numpy_windows(res, s, e, b, c)
    got = impl.windows(res, s, e, b, c, lexsort2(s, res), EPS_NS, REL_EPS)
    for w, g, name in zip(want, got, ("resource", "start", "end", "busy", "count"), strict=True):
        if name == "busy":              # summed in another order: the last bits may differ
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-9)
        else:
            assert np.array_equal(g, w), name
    if len(np.unique(res)) * 4 < n:
        assert len(got[0]) < n          # (some intervals did merge)


def test_windows_of_three_intervals():
    res = np.array([1, 1, 1, 2], dtype=np.int64)
    s = np.array([0.0, 5.0, 20.0, 0.0])
    e = np.array([10.0, 12.0, 30.0, 1.0])
    b = np.array([10.0, 7.0, 10.0, 1.0])
    c = np.ones(4, dtype=np.int64)
    w = segsort.windows(res, s, e, b, c, np.arange(4, dtype=np.int64), EPS_NS, REL_EPS)
    assert [x.tolist() for x in w] == [[1, 1, 2], [0.0, 20.0, 0.0], [12.0, 30.0, 1.0],
                                       [17.0, 10.0, 1.0], [2, 1, 1]]


def _recorder(tmp_path, name, kernels):
    from kbtrace.replay.recorder import Recorder
    return Recorder(tmp_path / name, 100, 8, 1 << 20, None, kernels=kernels)


def _recorder_n(tmp_path, name, kernels, n_ops):
    from kbtrace.replay.recorder import Recorder
    return Recorder(tmp_path / name, n_ops, 8, 1 << 20, None, kernels=kernels)


@pytest.mark.parametrize(("impl", "n"), IMPLS)
def test_expand_gives_the_pending_rows_numpy_gives(tmp_path, impl, n):
    """Compact transfers and explicit rows interleaved (several transfers at one position,
    explicit rows before, between and after them): the compiled expansion gives
    ``Recorder._pending``'s numpy columns, value for value."""
    rng = np.random.default_rng(n)
    recs = [_recorder(tmp_path, "a", None), _recorder(tmp_path, "b", impl)]
    plans: list[int] = []
    for _ in range(5):
        k = int(rng.integers(1, 6))
        rows = [(int(rng.integers(0, 8)), int(rng.integers(0, 50)), int(rng.integers(-1, 8)),
                 float(rng.random()), float(rng.random() * 9), float(rng.choice([-np.inf, 1.5])),
                 float(rng.random() * 9), False) for _ in range(k - 1)]
        rows.append((3, 7, -1, 2.5, float(rng.random()), 0.0, 0.0, True))
        for rec in recs:
            rec.add_plan(rows, 64 * k)
        plans.append(k)
    for _ in range(n // 10):
        if rng.random() < 0.5:
            row = (int(rng.integers(0, 100)), -1, 2, 5, -1, float(rng.random()),
                   float(rng.random()), 0.0, 0.25, 0)
            for rec in recs:
                rec.rows([row])
        else:
            pid = int(rng.integers(0, len(plans)))
            h0, t0 = float(rng.random() * 100), float(rng.random() * 100)
            args = (int(rng.integers(0, 100)), int(rng.integers(-1, 4)), pid, h0, t0,
                    h0 + 50.0, int(rng.integers(1, plans[pid] + 1)))
            for rec in recs:
                rec.transfer(*args)
    want, got = (rec._pending() for rec in recs)
    assert want.shape == got.shape == (10, want.shape[1])
    assert want.tobytes() == got.tobytes()


@pytest.mark.parametrize(("impl", "n"), IMPLS)
def test_finish_gives_the_columns_numpy_gives(tmp_path, impl, n):
    """A flushed batch (ops completing out of order, rows of one op out of time order, ties
    in enter and leave, an op whose end lies past its last row, rows of ops still in flight
    carried): the compiled finalisation writes the same hop rows, and leaves the same per-op
    ``t_end`` and ``queue``, as the numpy passes, byte for byte."""
    import pyarrow.parquet as pq
    rng = np.random.default_rng(n + 1)
    n_ops = max(40, n // 20)
    recs = [_recorder_n(tmp_path, "a", None, n_ops), _recorder_n(tmp_path, "b", impl, n_ops)]
    ops = rng.permutation(n_ops)
    for rnd in range(2):
        part = ops[rnd * n_ops // 2:(rnd + 1) * n_ops // 2]
        for o in part.tolist():
            t_issue = float(rng.integers(0, 50))
            for _ in range(int(rng.integers(1, 12))):
                en = t_issue + float(rng.integers(0, 20)) * 0.5
                lv = en + float(rng.choice([0.0, 0.5, float(rng.random() * 9)]))
                row = (o, int(rng.integers(-1, 4)), int(rng.integers(0, 14)),
                       int(rng.integers(0, 300)), int(rng.integers(-1, 8)), en, lv,
                       float(rng.random()), float(rng.choice([0.0, rng.random()])),
                       int(rng.integers(0, 4096)))
                for rec in recs:
                    rec.rows([row])
        late = part[: len(part) // 3].tolist()      # completed later: carried over
        for o in part.tolist():
            if o in late:
                continue
            t_end = float(rng.integers(0, 80))
            for rec in recs:
                rec.op_done(o, 1.0, 2.0, t_end, "pe")
        for rec in recs:
            rec.flush(100.0)
        for o in late:
            for rec in recs:
                rec.op_done(o, 1.0, 2.0, 3.0, "pe")
    for rec in recs:
        rec.close()
    want, got = (pq.read_table(tmp_path / d / "hops.parquet") for d in ("a", "b"))
    assert want.num_rows > n_ops
    assert want.equals(got)
    for c in ("t_end", "queue", "t_issue"):
        assert getattr(recs[0], c).tobytes() == getattr(recs[1], c).tobytes(), c
