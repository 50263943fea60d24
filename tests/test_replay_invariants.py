"""The streamed busy check (invariant 1) and batching: verdicts, messages, carried state.

``BusyCheck`` sees a run's busy intervals batch by batch with a watermark and keeps
only the windows that can still grow. It must give the verdict and utilisation of
one sweep over all intervals (property test against a plain-Python reference) while
carrying a bounded number of windows through a replay.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbtrace.errors import InvariantError
from kbtrace.replay import ReplayOptions, invariants, replay
from kbtrace.replay.engine import Sim
from kbtrace.replay.invariants import EPS_NS, BusyCheck
from kbtrace.replay.source import OpSource
from kbtrace.topology import compile_topology
from test_replay_util import TOPO_DIR, SynthTrace, hbm, load

LINK = 185            # tiny.yaml: sip0.cube0.hbm_ctrl.pe0 -> sip0.cube0.r0c0


@pytest.fixture(scope="module")
def tiny():
    return compile_topology(TOPO_DIR / "tiny.yaml")


@pytest.fixture
def sim(tiny, tmp_path):
    src = OpSource(SynthTrace([load(hbm(0, 0, 0, tiny), 4096)]).ops())
    s = Sim(tiny, src, ReplayOptions(), tmp_path)
    yield s
    s.rec.hops.abort()
    src.close()


def feed(chk: BusyCheck, ivs: list[tuple[int, float, float, float]], watermark: float) -> None:
    r, s, e, b = zip(*ivs, strict=True) if ivs else ((), (), (), ())
    chk.add(np.array(r, dtype=np.int64), np.array(s, dtype=float), np.array(e, dtype=float),
            np.array(b, dtype=float), watermark)


def test_full_link_passes_at_100_percent(sim):
    chk = BusyCheck(sim)
    feed(chk, [(LINK, 100.0, 110.0, 10.0), (LINK, 110.0, 125.0, 15.0)], 0.0)
    assert chk.close() == pytest.approx(1.0)


def test_overbooked_link_names_resource_and_window(sim):
    chk = BusyCheck(sim)
    feed(chk, [(LINK, 100.0, 110.0, 10.0), (LINK, 102.0, 112.0, 10.0)], 0.0)  # 20 ns in 12 ns
    with pytest.raises(InvariantError, match=r"link sip0\.cube0\.hbm_ctrl\.pe0->sip0\.cube0"
                                             r"\.r0c0: busy 20\.000 ns in window "
                                             r"\[100\.000, 112\.000\] ns of 12\.000 ns with "
                                             r"capacity 1 \(over 100%\)"):
        chk.close()


def test_hop_busier_than_its_interval(sim):
    with pytest.raises(InvariantError, match=r"busy 11\.000 ns inside a 10\.000 ns interval"):
        feed(BusyCheck(sim), [(LINK, 0.0, 10.0, 11.0)], 0.0)


def test_window_growing_across_batches_is_checked_whole(sim):
    """The first batch's window stays open past the watermark; the second batch's
    interval joins it and overbooks it (each batch alone is fine)."""
    chk = BusyCheck(sim)
    feed(chk, [(LINK, 100.0, 110.0, 10.0)], 105.0)
    assert chk.n_open == 1 and chk.n_windows == 0
    feed(chk, [(LINK, 106.0, 111.0, 5.0)], 107.0)          # [100, 111]: 15 ns in 11 ns
    assert chk.n_open == 1 and chk.n_windows == 0               # still open: not judged yet
    with pytest.raises(InvariantError, match=r"busy 15\.000 ns in window \[100\.000, 111\.000\]"):
        feed(chk, [], 200.0)                                   # the watermark passes: judged


def test_finished_windows_are_dropped(sim):
    chk = BusyCheck(sim)
    feed(chk, [(LINK, 0.0, 10.0, 10.0), (LINK, 20.0, 30.0, 5.0), (LINK + 1, 0.0, 4.0, 4.0)], 25.0)
    assert (chk.n_open, chk.n_windows) == (1, 2)             # [20, 30] may still grow
    assert chk.max_util == pytest.approx(1.0)
    feed(chk, [(LINK, 40.0, 50.0, 10.0)], math.inf)
    assert (chk.n_open, chk.n_windows) == (0, 4)
    assert chk.close() == pytest.approx(1.0)


def test_interval_before_the_watermark_is_an_engine_bug(sim):
    chk = BusyCheck(sim)
    feed(chk, [(LINK, 60.0, 70.0, 1.0)], 50.0)
    with pytest.raises(InvariantError, match=r"starts before 50\.000 ns"):
        feed(chk, [(LINK, 40.0, 45.0, 1.0)], 80.0)


def test_dma_channels_count_as_capacity(sim):
    rid = sim.rec.rid(sim.pes[next(iter(sim.pes))].n_dma, "dma_read")
    cap = sim.params.pe.dma.read_channels
    chk = BusyCheck(sim)
    feed(chk, [(rid, 0.0, 10.0, 10.0)] * cap, 0.0)
    assert chk.close() == pytest.approx(1.0)
    chk = BusyCheck(sim)
    feed(chk, [(rid, 0.0, 10.0, 10.0)] * (cap + 1), 0.0)
    with pytest.raises(InvariantError, match=rf"\(dma_read\): busy .* with capacity {cap}"):
        chk.close()


# ----------------------------------------------------------------------------- property test
def _one_sweep(ivs, cap):
    """Reference: all intervals at once, per resource sorted by start, plain Python."""
    by = defaultdict(list)
    for r, s, e, b in ivs:
        by[r].append((s, e, b))
    util, over = 0.0, False
    for r, lst in by.items():
        lst.sort(key=lambda x: x[0])
        wins: list[list[float]] = []
        for s, e, b in lst:
            if wins and s <= wins[-1][1] + EPS_NS:
                w = wins[-1]
                w[1], w[2], w[3] = max(w[1], e), w[2] + b, w[3] + 1
            else:
                wins.append([s, e, b, 1])
        for ws, we, wb, wc in wins:
            over |= wb > cap[r] * (we - ws) + EPS_NS * wc
            if we > ws:
                util = max(util, wb / (cap[r] * (we - ws)))
    return over, util


_iv = st.tuples(st.sampled_from([0, 1, 2]), st.integers(0, 60), st.integers(1, 12),
                st.sampled_from([1.0, 0.5, 0.25]), st.integers(0, 5))   # res, start, len, busy/len, batch


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.lists(_iv, max_size=40))
def test_streamed_equals_one_sweep(sim, raw):
    dma = sim.rec.rid(sim.pes[next(iter(sim.pes))].n_dma, "dma_read")
    res_ids = (LINK, LINK + 1, dma)
    cap = {LINK: 1, LINK + 1: 1, dma: sim.params.pe.dma.read_channels}
    ivs = [(res_ids[r], s / 2, s / 2 + n / 2, f * n / 2, k) for r, s, n, f, k in raw]
    over, util = _one_sweep([iv[:4] for iv in ivs], cap)
    chk = BusyCheck(sim)
    n_batches = max((iv[4] for iv in ivs), default=0) + 1
    try:
        for k in range(n_batches):
            later = [iv[1] for iv in ivs if iv[4] > k]        # no later interval starts earlier
            feed(chk, [iv[:4] for iv in ivs if iv[4] == k], min(later, default=math.inf))
        got = chk.close()
    except InvariantError:
        assert over
        return
    assert not over
    assert got == pytest.approx(util, rel=1e-12)


# ----------------------------------------------------------------------------- in a replay
def test_replay_carries_few_windows(monkeypatch, tmp_path):
    """gemm on small.yaml in 512-row batches: windows are checked as the run goes and
    only a small fraction of them is ever held at once."""
    from kbtrace.capture import capture
    seen: list[BusyCheck] = []

    class Spy(BusyCheck):
        def __init__(self, sim, *kernels):
            super().__init__(sim, *kernels)
            seen.append(self)

    monkeypatch.setattr(invariants, "BusyCheck", Spy)
    small = compile_topology(TOPO_DIR / "small.yaml")
    tr = capture(TOPO_DIR.parent / "capture" / "gemm.py", small, {"M": 256, "N": 256, "K": 128},
                 tmp_path / "tr")
    run = replay(tr, small, ReplayOptions(out_dir=str(tmp_path / "run"), batch_rows=512))
    (chk,) = seen
    assert chk.n_open == 0 and chk.n_windows > 1000
    assert chk.max_open < 0.1 * chk.n_windows, (chk.max_open, chk.n_windows, run.hops)
    assert 0.5 < chk.max_util <= 1.0 + 1e-9


@pytest.mark.parametrize("workload,fid", [("gemm", "fast"), ("ring_allreduce", "fast"),
                                          ("ring_allreduce", "flit")])
def test_batch_size_changes_nothing_but_row_groups(tmp_path, workload, fid):
    """``batch_rows`` only bounds memory: 1-row, odd-sized and default batches give the same
    op timing, the same hop rows and the same run id (the busy check sees every batch)."""
    from kbtrace.capture import capture
    small = compile_topology(TOPO_DIR / "small.yaml")
    params = {"M": 256, "N": 256, "K": 128} if workload == "gemm" else {}
    tr = capture(TOPO_DIR.parent / "capture" / f"{workload}.py", small, params, tmp_path / "tr")
    runs = [replay(tr, small, ReplayOptions(fidelity=fid, out_dir=str(tmp_path / f"b{b}"),
                                            batch_rows=b))
            for b in (1, 97, 65536)]
    groups = [pq.ParquetFile(r.run_dir / "hops.parquet").metadata.num_row_groups for r in runs]
    assert groups[0] > groups[1] > groups[2] >= 1
    ref = runs[-1]
    for r in runs[:-1]:
        assert r.run_id == ref.run_id
        assert r.op_timing().equals(ref.op_timing())
        assert r.hops_table().equals(ref.hops_table())


def test_memory_ops_below_their_lower_bound_are_caught_in_op_order():
    """Invariant 5, checked ``_CHECK_ROWS`` memory ops at a time: the first op (by op_id) that
    took less than its bound is the error; otherwise the latest issue + bound comes back, an
    undefined one passed over."""
    from types import SimpleNamespace

    from kbtrace.replay.invariants import _above_bounds
    rec = SimpleNamespace(t_issue=np.array([0.0, 10.0, 20.0, np.nan, 5.0]),
                          t_end=np.array([8.0, 13.0, 30.0, np.nan, 6.0]))
    what = [("load", 64), ("store", 128), ("load", 256), ("load", 8), ("load", 8)]
    assert _above_bounds(rec, [0, 1, 2, 3], [8.0, 3.0, 9.0, 1.0], what, 0.0, "fast") == 29.0
    assert _above_bounds(rec, [0, 1], [1.0, 1.0], what, 50.0, "fast") == 50.0
    assert _above_bounds(rec, [], [], [], 7.0, "fast") == 7.0
    with pytest.raises(InvariantError, match=r"op 1 \(store, 128 B\) took 3\.000 ns, below its "
                       r"analytical lower bound 3\.500 ns \(fast-fcfs mode\)"):
        _above_bounds(rec, [0, 1, 4], [8.0, 3.5, 2.0], what, 0.0, "fast-fcfs")


def test_memory_bounds_once_per_key_and_first_op_below_is_the_error(tiny, tmp_path,
                                                                    monkeypatch):
    """Invariant 5 over a trace's loads and stores (vectorised per read batch): a bound is
    computed once per (kind, DMA, memory node, bytes), with the DMA of the op's PE and the
    node its address resolves to; the first op (by op_id) under its bound is the error."""
    from test_replay_util import store
    rows = [load(hbm(0, 0, 0, tiny), 4096), store(hbm(0, 0, 0, tiny, 8192), 4096),
            load(hbm(0, 0, 0, tiny, 4096), 4096, seq=2), load(hbm(0, 0, 0, tiny), 256, seq=3)]
    rows[1]["seq"] = 1
    calls = []

    def bound(topo, kind, a, mem, nb):
        calls.append((kind, a, mem, nb))
        return 1e9 if kind == "store" else 0.0

    monkeypatch.setattr(invariants, "_lower_bound", bound)
    with pytest.raises(InvariantError, match=r"op 1 \(store, 4096 B\) took [0-9.]+ ns, below "
                       r"its analytical lower bound 1000000000\.000 ns \(fast mode\)"):
        replay(SynthTrace(rows), tiny, ReplayOptions(out_dir=str(tmp_path / "run")))
    from kbtrace.topology.model import PeCoord
    dma = tiny.pe_node(PeCoord(0, 0, 0), "dma").idx
    mem = tiny.resolve(hbm(0, 0, 0, tiny)).idx
    assert sorted(calls) == [("load", dma, mem, 256), ("load", dma, mem, 4096),
                             ("store", dma, mem, 4096)]


def test_recorder_names_the_op_of_a_hop_busier_than_its_interval(sim):
    """A hop row busier than its own interval is a model bug; the recorder names its op
    (the busy check sees intervals only) so the bug can be found in a large run."""
    from kbtrace import schema
    rows = [  # op, tile, stage, node, link, enter, leave, busy, queue, nbytes
        (7, -1, schema.STAGES.index("fabric"), 1, LINK, 100.0, 164.0, 64.0, 0.0, 8192),
        (9, -1, schema.STAGES.index("fabric"), 1, LINK, 100.0, 163.946, 64.0, 0.0, 8192),
        (9, -1, schema.STAGES.index("fabric"), 1, LINK, 100.0, 170.0, 64.0, 10.0, 8192),
    ]
    r = np.array(rows, dtype=float).T
    assert sim.rec._culprit(r) == " (op 9's fabric row)"
    assert sim.rec._culprit(r[:, :1]) == ""
