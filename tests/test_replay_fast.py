"""Exactness and cost of the replay speed-ups.

* ``HbmController.read`` (per-PC running sums) gives bit-identical finish times and
  PC state to committing the bursts one by one.
* The PE pipeline spends one SimPy event per service in ``fast`` mode (two for a
  DMA read: setup + request leg, data leg) and none on handoffs or op completions.
* Zero-length services complete synchronously without deep recursion.
* DMA channels are held through the round trip: two async loads overlap with two
  read channels and serialise with one.
* The fast fabric's closed-form stretch booking equals booking every hop sequentially
  (hop rows, completion times, reservations; property test), also when its bounded route
  cache is emptied between sends. The first transfer to reach a hop walks it
  (``routes.walk``) with the arithmetic of the plan built for the second: the two agree
  exactly.
* A whole replay with a route cache so small that every new route empties it gives the
  same rows and timings as one with the default bound, value for value.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbtrace.replay import ReplayOptions, replay
from kbtrace.replay.hbm import HbmController
from kbtrace.replay.recorder import _COLS
from kbtrace.topology import compile_topology
from test_replay_util import TOPO_DIR, SynthTrace, hbm, load, on, store


def _hbm_params(rng):
    return SimpleNamespace(pcs_per_pe=rng.choice([1, 2, 8, 16]), burst_bytes=rng.choice([64, 256]),
                           pc_bw_gbps=rng.choice([32.0, 12.5]), efficiency=rng.choice([1.0, 0.77]),
                           switch_penalty_ns=rng.choice([0.0, 3.3]))


def test_hbm_read_equals_burst_by_burst_commits():
    rng = random.Random(3)
    for _ in range(500):
        p = _hbm_params(rng)
        fast, ref = HbmController(0, p), HbmController(0, p)
        t = 0.0
        for _ in range(rng.randint(1, 8)):
            t += rng.choice([0.0, 0.5, 7.0, 100.1])
            addr = rng.randint(0, 1 << 20) * rng.choice([1, 64, 256])
            nb = rng.choice([1, 100, 256, 257, 4096, 9000, 65536])
            if rng.random() < 0.3:      # interleave writes so the turnaround penalty applies
                for h in (fast, ref):
                    for off in range(0, nb, p.burst_bytes):
                        h.commit(addr + off, min(p.burst_bytes, nb - off), t, 1)
                continue
            want = [ref.commit(addr + off, min(p.burst_bytes, nb - off), t, 0)
                    for off in range(0, nb, p.burst_bytes)]
            assert fast.read(addr, nb, t) == want
            assert fast.pc_avail == ref.pc_avail and fast.last_dir == ref.last_dir


def _run(trace, topo, tmp_path, tag, fid="fast"):
    return replay(trace, topo, ReplayOptions(fidelity=fid, out_dir=str(tmp_path / tag)))


def test_fast_pipeline_events_per_op(tmp_path):
    """A sync op dispatched while the scheduler is idle: dispatch + scheduling = 1 event;
    then a load's DMA costs 2 (setup + request leg, data leg), a store's 2 (the HBM commit
    when its data arrives, then completion after the ack leg); a wait on both = 1 (dispatch). An async load pays dispatch and
    scheduling apart (the CPU moves on): 4. The host's launch costs a fixed number of
    events whatever the program."""
    tiny = compile_topology(TOPO_DIR / "tiny.yaml")
    a = hbm(0, 0, 0, tiny)

    def events(n):
        rows = []
        for i in range(n):
            rows.append(load(a + 4096 * i, 4096, seq=4 * i))
            rows.append(store(a + 4096 * (n + i), 4096, seq=4 * i + 1))
            rows.append({**load(a + 4096 * (2 * n + i), 4096, seq=4 * i + 2), "is_async": True})
            rows.append({**on(seq=4 * i + 3), "kind": "wait", "deps": [4 * i + 2]})
        return _run(SynthTrace(rows), tiny, tmp_path, f"n{n}").events

    assert events(11) - events(1) == 10 * (3 + 3 + 4 + 1)


def test_zero_length_services_do_not_recurse(tmp_path):
    """With zero dispatch, scheduler and math time every op of a long program completes
    synchronously inside one callback chain; it must not grow the Python stack per op."""
    topo = compile_topology(TOPO_DIR / "tiny.yaml", overrides={
        "pe.pe_cpu.dispatch_cycles": 0, "pe.scheduler.overhead_ns": 0, "pe.math.overhead_ns": 0})
    n = 3000
    rows = [{**on(seq=i), "kind": "fill", "out_shape": [0], "out_dtype": "f32", "nbytes": 0,
             "deps": [i - 1] if i else []} for i in range(n)]
    r = _run(SynthTrace(rows), topo, tmp_path, "zero")
    ot = r.op_timing()
    t_end = set(ot["t_end_ns"].to_pylist())
    assert len(t_end) == 1 and t_end == set(ot["t_issue_ns"].to_pylist())
    assert r.events < 20


@pytest.mark.parametrize("fid", ("fast", "flit"))
def test_dma_channels_held_through_round_trip(tmp_path, fid):
    """Two async 4 KiB loads of PE0's own slice, then a wait: with one read channel the
    second's DMA stage queues for the whole first round trip; with two they overlap."""
    rows = [{**load(hbm(0, 0, 0, compile_topology(TOPO_DIR / "tiny.yaml"), 65536 * i), 4096,
                    seq=i), "is_async": True} for i in range(2)]
    rows.append({**on(seq=2), "kind": "wait", "deps": [0, 1]})
    dma = {}
    for ch in (1, 2):
        topo = compile_topology(TOPO_DIR / "tiny.yaml", overrides={"pe.dma.read_channels": ch})
        h = _run(SynthTrace(rows), topo, tmp_path, f"ch{ch}", fid).hops_table().to_pylist()
        dma[ch] = sorted((x["op_id"], x["t_enter_ns"], x["t_leave_ns"], x["queue_ns"])
                         for x in h if x["stage"] == "dma_read")
    (_, e0, l0, q0), (_, e1, l1, q1) = dma[1]
    assert q0 == 0.0 and e1 + q1 == pytest.approx(l0)          # waits for the whole round trip
    (_, f0, m0, r0), (_, f1, m1, r1) = dma[2]
    assert r0 == r1 == 0.0 and f1 < m0                          # both channels busy at once
    assert (f0, m0) == (e0, l0) and m1 < l1


def test_hbm_read_span_equals_read():
    rng = random.Random(7)
    p = SimpleNamespace(pcs_per_pe=8, pc_bw_gbps=32.0, efficiency=0.9, burst_bytes=256,
                        switch_penalty_ns=1.5)
    a, b, c = HbmController(0, p), HbmController(0, p), HbmController(0, p)
    t = 0.0
    for _ in range(400):
        t += rng.choice([0.0, 0.5, 3.0, 40.0])
        addr = rng.randrange(0, 1 << 16) * 64
        nb = rng.choice([1, 64, 256, 300, 2048, 4096, 5000, 65536])
        if rng.random() < 0.3:
            for h in (a, b, c):
                h.commit(addr, 256, t, 1)
            continue
        ready = a.read(addr, nb, t)
        assert b.read_span(addr, nb, t) == (min(ready), max(ready))
        assert c.read_bursts(addr, nb, t) == (ready, min(ready), max(ready))
        assert a.pc_avail == b.pc_avail == c.pc_avail and a.last_dir == b.last_dir == c.last_dir
    assert c.read_bursts(0, 0, 7.5) == ([], 7.5, 7.5)


@pytest.mark.parametrize("which", ("pure", "fast mode's"))
def test_hbm_read_lazy_works_out_the_same_burst_times(which):
    """``read_lazy`` (fast mode's flows) leaves the same PC state and (first, last) as
    ``read_bursts``, and ``Bursts.times`` later gives the very same finish times, short last
    bursts and turnaround penalties included, whatever the controller did in between."""
    from kbtrace.replay.fabric.core import hbm_controller
    from kbtrace.replay.hbm import known_bursts
    cls = HbmController if which == "pure" else hbm_controller()
    rng = random.Random(11)
    p = SimpleNamespace(pcs_per_pe=8, pc_bw_gbps=32.0, efficiency=0.9, burst_bytes=256,
                        switch_penalty_ns=1.5)
    a, b = cls(0, p), cls(0, p)
    t = 0.0
    pending = []
    for _ in range(400):
        t += rng.choice([0.0, 0.5, 3.0, 40.0])
        addr = rng.randrange(0, 1 << 16) * 64
        nb = rng.choice([64, 256, 300, 2048, 4096, 5000, 65536])
        if rng.random() < 0.3:
            for h in (a, b):
                h.commit(addr, 256, t, 1)
            continue
        ready, first, last = a.read_bursts(addr, nb, t)
        lazy, first_l, last_l = b.read_lazy(addr, nb, t)
        assert (first_l, last_l) == (first, last)
        assert a.pc_avail == b.pc_avail and a.last_dir == b.last_dir
        pending.append((lazy, ready))
    for lazy, ready in pending:              # asked for long after: the times they were
        assert lazy.times() == ready and lazy.times() is lazy.times()
    assert known_bursts([1.0, 2.5]).times() == [1.0, 2.5]


# --------------------------------------------------------------------------- fast fabric
# The fast fabric books a transfer in closed-form stretches (``_Plan``) and falls back to the
# sequential recursion (``_hop``) only at a resource that is not free. Its docstring claims the
# result equals booking every hop sequentially; checked here against a fabric that does just
# that, on random send sequences over small.yaml (routers with overhead, UCIe crossings, HBM
# commits at the destination), including gaps that fit, stalls and future flit-ready times.

def _hop_by_hop():
    from kbtrace.replay.fabric.fast import FastFabric, _Route
    from kbtrace.replay.fabric.routes import begin

    class HopByHop(FastFabric):
        def send(self, op_id, tile, src, dst, nbytes, addr=0, ready=None, at=None, ack=0.0,
                 span=None):
            key = (src, dst, nbytes)
            rt = self.routes_nb.get(key)
            if rt is None:
                rt = self.routes_nb[key] = _Route(self, src, dst, nbytes)
            now = self.env.now
            h, t = span if span is not None else ((now if at is None else at),) * 2
            self._f = begin(self, rt, op_id, tile, ack)
            for j in range(len(rt.links)):
                h, t = self._hop(rt, j, op_id, tile, h, t, now)
            return self._arrive(rt, op_id, tile, addr, h, t, now, ack)

    return HopByHop


def _always_plan(base=None):
    """A fast fabric (``base``, default ``FastFabric``) that builds (and keeps) a plan the
    first time a hop is reached, instead of walking it (``routes.walk``): the two must
    agree exactly."""
    from kbtrace.replay.fabric.fast import FastFabric, _Route

    class AlwaysPlan(base or FastFabric):
        def send(self, op_id, tile, src, dst, nbytes, *a, **k):
            key = (src, dst, nbytes)
            if key not in self.routes_nb:
                self.routes_nb[key] = _Route(self, src, dst, nbytes)
            rt = self.routes_nb[key]
            rt.plans = [False if p is None else p for p in rt.plans]
            return super().send(op_id, tile, src, dst, nbytes, *a, **k)

    return AlwaysPlan


def _env_for(cls):
    """The environment a fabric class runs on: the compiled core's typed event queue for a
    compiled ``FastFabric`` (``fabric.core.environment``), SimPy's own heap for the .py one."""
    if any(c.__module__.endswith("._fast_c") for c in cls.__mro__):
        from kbtrace.replay.fabric._eventq_c import Env
        return Env()
    from kbtrace.replay.eventq import plain_env
    return plain_env()


def _fabric(cls, topo, tmp):
    from kbtrace.replay.recorder import Recorder
    env = _env_for(cls)
    hbm_p = topo.params.cube.hbm
    hbms = {nd.idx: HbmController(nd.idx, hbm_p) for nd in topo.nodes if nd.kind == "hbm_ctrl"}
    rec = Recorder(tmp, 1 << 16, len(topo.links), 1 << 30)
    return cls(env, topo, rec, hbms), rec


_SMALL = None


def _small():
    global _SMALL
    if _SMALL is None:
        _SMALL = compile_topology(TOPO_DIR / "small.yaml")
    return _SMALL


_send = st.tuples(
    st.integers(0, 31), st.integers(0, 31), st.booleans(),          # DMA pe, HBM pe, read?
    st.sampled_from([1, 64, 100, 128, 4096, 65536]),                # bytes
    st.sampled_from([0.0, 0.0, 0.5, 3.0, 41.25, 1000.0]),          # advance now by
    st.sampled_from([0.0, 0.0, 0.25, 12.5, 300.0]),                # flits ready later by
    st.sampled_from([0.0, 2.0, 64.0]))                             # read: last flit later by


# derandomized: a fixed set of examples, so CI does not meet the known divergence below at
# random (it found it in one full run of 60 random examples)
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sends=st.lists(_send, min_size=1, max_size=40), held_max=st.sampled_from([None, 1, 40]))
def test_fast_stretch_booking_equals_hop_by_hop(tmp_path, sends, held_max):
    """``held_max``: the route cache's bound (None: the default; 1: every new route empties
    the cache, so plans are forgotten and rebuilt mid-sequence)."""
    import numpy as np

    from kbtrace.replay.fabric.fast import FastFabric
    from kbtrace.topology.model import PeCoord
    topo = _small()
    cls = FastFabric if held_max is None else type("Bounded", (FastFabric,), {"HELD_MAX": held_max})
    fast, rec_a = _fabric(cls, topo, tmp_path / "a")
    ref, rec_b = _fabric(_hop_by_hop(), topo, tmp_path / "b")
    planned, rec_c = _fabric(_always_plan(), topo, tmp_path / "c")
    pes = [PeCoord(0, i // 8, i % 8) for i in range(32)]
    fabs = (fast, ref, planned)
    ends: list[dict] = [{}, {}, {}]     # completion per op (a flow's moves when others join)
    for op, (p_dma, p_hbm, read, nb, dt, late, spread) in enumerate(sends):
        dma = topo.pe_node(pes[p_dma], "dma").idx
        mem = topo.hbm_ctrl(pes[p_hbm]).idx
        for fab, got in zip(fabs, ends, strict=True):
            fab.env.run(until=fab.env.now + dt) if dt else None
            now = fab.env.now
            if read:   # HBM -> DMA: flits ready from now + late to now + late + spread
                ev = fab.send(op, -1, mem, dma, nb, span=(now + late, now + late + spread))
            else:      # DMA -> HBM, committed there
                ev = fab.send(op, -1, dma, mem, nb, addr=p_hbm * 4096 + op * 64,
                              at=now + late if late else None)
            ev.callbacks.append(lambda e, got=got, op=op: got.__setitem__(op, e.value))
    # the bookings, from the last send on
    assert _booked(fast) == _booked(planned)
    now = fast.env.now + 1e-6   # (an interval may end at now in one and 1 ulp later in the other)
    for iv_a, iv_b in zip(fast.node_iv, ref.node_iv, strict=True):
        iv_a.prune(now)
        iv_b.prune(now)
        assert np.allclose(iv_a.tolist(), iv_b.tolist(), rtol=0, atol=1e-6)
    for la, lb in zip(fast.link_steps, ref.link_steps, strict=True):
        _same_shares(la.times(), la.shares(), lb.times(), lb.shares(), now)
    for fab in fabs:
        fab.env.run()
    for op in range(len(sends)):
        done = [got[op] for got in ends]
        assert done[0] == pytest.approx(done[1], abs=1e-6), (op, done)
        assert done[0] == done[2], (op, done)       # walking a hop == its plan, exactly
    a, b, c3 = (dict(zip(_COLS, r._pending(), strict=True)) for r in (rec_a, rec_b, rec_c))
    assert len(a["op"]) == len(b["op"]) > 0
    for c in a:
        assert np.array_equal(a[c], c3[c]), c
    # the same rows; their order may differ where two HBM commits fall at times equal up to
    # rounding (each records its row in its own event)
    key_a = np.lexsort((a["enter"].round(6), a["node"], a["link"], a["stage"], a["op"]))
    key_b = np.lexsort((b["enter"].round(6), b["node"], b["link"], b["stage"], b["op"]))
    for c in a:
        assert np.allclose(a[c][key_a], b[c][key_b], rtol=0, atol=1e-6), c


def _booked(fab):
    """A fast fabric's bookings as lists: each link's breakpoints and shares, each node's
    intervals."""
    return ([ln.times() for ln in fab.link_steps], [ln.shares() for ln in fab.link_steps],
            [iv.tolist() for iv in fab.node_iv])


def _same_shares(lt_a, lr_a, lt_b, lr_b, now):
    """Two links' booked bandwidth shares (step functions) agree after ``now`` up to rounding:
    compared in the middle of every stretch between their breakpoints (their breakpoints may
    differ by an ulp, which changes where an equal one is merged, not the function)."""
    from bisect import bisect_right

    def share(lt, lr, x):
        k = bisect_right(lt, x) - 1
        return lr[k] if k >= 0 else 0.0

    pts = sorted({x for x in (*lt_a, *lt_b) if x > now})
    xs = [(a + b) / 2 for a, b in zip(pts, pts[1:], strict=False) if b - a > 1e-5]
    xs += [pts[-1] + 1.0] if pts else []     # after the last: nothing booked in either
    for x in xs:
        assert share(lt_a, lr_a, x) == pytest.approx(share(lt_b, lr_b, x), abs=1e-6), x



def test_bare_events_refuse_a_negative_delay_like_timeout():
    from kbtrace.errors import InvariantError
    from kbtrace.replay.eventq import plain_env
    from kbtrace.replay.fabric.events import after

    env = plain_env()
    ev = after(env, 2.5, "x")
    env.run()
    assert env.now == 2.5 and ev.value == "x"
    with pytest.raises(InvariantError, match=r"scheduled 1 ns in the past \(at 1.5 ns, now 2.5 ns\)"):
        after(env, -1.0)


@pytest.mark.parametrize("mod", ["kbtrace.replay.fabric.events",
                                 "kbtrace.replay.fabric._events_c"])
def test_bare_events_fire_in_the_order_timeouts_would(mod):
    """``after`` pushes its heap entry itself (as ``Environment.schedule`` does): mixed with
    ``env.timeout``s, events due together fire in the order they were made, pure and
    compiled (the twin only where it is built; on the environment its core runs on)."""
    m = pytest.importorskip(mod)
    if mod.endswith("_c"):
        env = pytest.importorskip("kbtrace.replay.fabric._eventq_c").Env()
    else:
        from kbtrace.replay.eventq import plain_env
        env = plain_env()
    fired = []
    for i, (kind, d) in enumerate([("t", 1.0), ("a", 1.0), ("t", 0.5), ("a", 1.0), ("a", 0.0),
                                   ("t", 1.0)]):
        ev = env.timeout(d, i) if kind == "t" else m.after(env, d, i)
        ev.callbacks.append(lambda e, i=i: fired.append((env.now, i, e.value)))
    env.run()
    assert fired == [(0.0, 4, 4), (0.5, 2, 2), (1.0, 0, 0), (1.0, 1, 1), (1.0, 3, 3), (1.0, 5, 5)]


def test_plans_are_built_for_the_second_transfer_on_a_route(tmp_path):
    from kbtrace.replay.fabric.fast import FastFabric, _Plan
    from kbtrace.topology.model import PeCoord
    topo = _small()
    fab, _rec = _fabric(FastFabric, topo, tmp_path)
    dma = topo.pe_node(PeCoord(0, 0, 1), "dma").idx
    mem = topo.hbm_ctrl(PeCoord(0, 1, 0)).idx
    fab.send(0, -1, mem, dma, 4096)
    rt = fab.routes_nb[(mem, dma, 4096)]
    assert rt.plans[0] is False and not any(isinstance(p, _Plan) for p in rt.plans)
    held = fab.held
    fab.env.run(until=10_000.0)       # the path is free again
    fab.send(1, -1, mem, dma, 4096)
    assert isinstance(rt.plans[0], _Plan)
    assert fab.held == held + rt.plans[0].n_res + rt.plans[0].n_rows


def test_an_emptied_route_cache_is_freed_without_the_cyclic_gc(tmp_path):
    """A plan does not refer back to its route (which holds it), so the routes and plans
    ``evict`` drops are freed by reference counting: a replay that empties its cache often
    (fair share: plans from many hops) left ~1.7 M objects at 100 k ops to the cyclic
    garbage collector, whose passes cost ~0.7 CPU s each."""
    import gc

    from kbtrace.replay.fabric.fast import FastFabric, _Plan
    from kbtrace.replay.fabric.heads import prune_all
    from kbtrace.topology.model import PeCoord
    topo = _small()
    fab, _rec = _fabric(FastFabric, topo, tmp_path)
    dma = topo.pe_node(PeCoord(0, 0, 1), "dma").idx
    mem = topo.hbm_ctrl(PeCoord(0, 1, 0)).idx

    def plans() -> int:
        return sum(type(o) is _Plan for o in gc.get_objects())

    gc.collect()
    gc.disable()
    try:
        fab.send(0, -1, mem, dma, 4096)
        fab.env.run(until=10_000.0)
        fab.send(1, -1, mem, dma, 4096)
        fab.env.run()
        prune_all(fab, fab.env.now)     # (the links drop the completed reads' bookings,
        fab._f = None                   # and the fabric the last flow it booked)
        assert plans() == 1
        fab.evict()
        assert plans() == 0 and not fab.routes_nb
    finally:
        gc.enable()


def test_a_tiny_route_cache_changes_no_result(tmp_path, monkeypatch):
    """Routes and plans are a cache: emptying it (``evict``) before every new route gives the
    same rows and timings, value for value (only the Parquet row groups differ: each
    eviction flushes the recorder)."""
    import pyarrow.parquet as pq

    from kbtrace.capture import capture
    from kbtrace.replay import fabric as F
    topo = compile_topology(TOPO_DIR / "default.yaml")
    tr = capture(TOPO_DIR.parent / "capture" / "gemm.py", topo, {"M": 128, "N": 128, "K": 64},
                 tmp_path / "tr")
    ref = replay(tr, topo, ReplayOptions(fidelity="fast", out_dir=str(tmp_path / "ref")))
    evictions = []
    cls = F.core.status()[0]      # the FastFabric replay uses (compiled or pure)
    evict = cls.evict

    def counted(self):
        evictions.append(self.env.now)
        evict(self)

    monkeypatch.setattr(cls, "HELD_MAX", 1)   # every new route empties the cache
    monkeypatch.setattr(cls, "evict", counted)
    small = replay(tr, topo, ReplayOptions(fidelity="fast", out_dir=str(tmp_path / "small")))
    assert len(evictions) >= 40
    assert (small.hops, small.makespan_ns) == (ref.hops, ref.makespan_ns)
    for name in ("hops.parquet", "op_timing.parquet"):
        a = pq.read_table(tmp_path / "ref" / name)
        b = pq.read_table(tmp_path / "small" / name)
        assert a.equals(b), name


def _perturbed(base, seed):
    """``base`` with random per-node overheads (some 0), link bandwidths (some 0: mode 0
    links), propagation delays and flit size, the same for a given ``seed``."""

    class Perturbed(base):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            r = random.Random(seed)
            self.node_ov = [r.choice([0.0, 0.0, 1 / 3, 2.0, 0.1, 8.0]) for _ in self.node_ov]
            self.link_bw = [r.choice([0.0, 100 / 3, 64.0, 128.0, 3.7]) for _ in self.link_bw]
            self.link_prop = [r.choice([0.0, 0.1, 0.7, 1 / 7]) for _ in self.link_prop]
            self.flit_bytes = r.choice([64, 100, 256])

    return Perturbed


@pytest.mark.parametrize("topo_name, seed", [("tiny", 1), ("small", 2), ("default", 3)])
def test_walk_equals_plan_between_any_nodes(tmp_path, topo_name, seed):
    """Walking a hop (first transfer) and its plan (later ones) agree exactly between any two
    nodes (SRAM, IO, PCIe and host destinations, 2 SIPs on default.yaml) with perturbed
    overheads, zero-bandwidth links, odd delays and flit sizes, and a route cache emptied
    every few routes."""
    import numpy as np

    from kbtrace.replay.fabric import FastFabric
    topo = compile_topology(TOPO_DIR / f"{topo_name}.yaml")
    bounded = type("Bounded", (FastFabric,), {"HELD_MAX": 40})
    a, rec_a = _fabric(_perturbed(bounded, seed), topo, tmp_path / "a")
    b, rec_b = _fabric(_perturbed(_always_plan(), seed), topo, tmp_path / "b")
    rng = random.Random(seed)
    nodes = range(len(topo.nodes))
    hot = rng.sample(nodes, 10)
    for op in range(150):
        src = rng.choice(hot if rng.random() < 0.8 else nodes)
        dst = rng.choice(hot if rng.random() < 0.8 else nodes)
        if src == dst:
            continue
        nb = rng.choice([0, 1, 64, 100, 128, 129, 256, 4096])
        dt = rng.choice([0.0, 0.0, 0.0, 0.5, 1 / 3, 2.0, 8.0, 100.0])
        late = rng.choice([0.0, 0.0, 0.25, 1 / 3, 2.0, 12.5])
        spread = rng.choice([None, 0.0, 2.0, 1 / 7, 64.0])
        done = []
        for f in (a, b):
            if dt:
                f.env.run(until=f.env.now + dt)
            now = f.env.now
            if spread is None:
                ev = f.send(op, -1, src, dst, nb, at=now + late if late else None)
            else:
                ev = f.send(op, -1, src, dst, nb, span=(now + late, now + late + spread))
            done.append(ev.value)
        assert done[0] == done[1], (op, done)
    pa_, pb_ = (dict(zip(_COLS, r._pending(), strict=True)) for r in (rec_a, rec_b))
    for c in pa_:
        assert np.array_equal(pa_[c], pb_[c]), c
    assert _booked(a) == _booked(b)


@pytest.mark.parametrize("nb", [257, 260, 300, 772, 1000, 1284, 1500, 4000])
@pytest.mark.parametrize("owner", [0, 1])
def test_lone_partial_burst_load_fast_equals_flit(tmp_path, nb, owner):
    """An HBM read whose short last burst finishes before the full ones: flits leave in ready
    order, so the short flit leads, and fast mode's closed form must know it (found by the
    fuzz test: fast was up to 2.3 ns early on the own slice and 5 ns late from PE1's). The
    full bursts then become ready together and queue one after another (772 B: three, fast
    was 2 ns early; 1284 B: five, 4 ns; found by a longer fuzz run)."""
    tiny = compile_topology(TOPO_DIR / "tiny.yaml")
    tr = SynthTrace([load(hbm(0, 0, owner, tiny, 4 * 64), nb)])
    lat = {}
    for fid in ("fast", "flit"):
        row = _run(tr, tiny, tmp_path, f"{fid}-{nb}-{owner}", fid).op_timing().to_pylist()[0]
        lat[fid] = row["t_end_ns"] - row["t_issue_ns"]
    assert lat["fast"] == pytest.approx(lat["flit"], abs=1e-6), lat


def test_fast_stretch_equals_hop_by_hop_two_identical_reads_meeting(tmp_path):
    """The example hypothesis found (2026-11-25): PE 8 (cube 1) reads 4 KiB twice from PE 0's
    slice (cube 0) at once, flits ready 300-364 ns later. Stretch booking put the second
    read's overhead at sip0.cube1.r0c0 at 353.12 ns, hop by hop at 352.22 ns: the two
    shared a link from 320.8 ns (stretch booking) or 320.7999999999999 ns (hop by hop), and
    the fair share split the first read's piece there at 372.79999999999995 / 372.8 in one
    and not in the other; the next link spreads the work that reached it before its head
    over the first piece, so the split moved 1.2 units of work and 0.9 ns downstream. Pieces
    either side of such a sliver are one piece now (``fifo.share_fifo``)."""
    test_fast_stretch_booking_equals_hop_by_hop.hypothesis.inner_test(
        tmp_path, [(8, 0, True, 4096, 0.0, 300.0, 64.0)] * 2, None)


@pytest.mark.parametrize("bk, mod", [("booking", "ledger"), ("_booking_c", "_ledger_c")])
def test_a_reservations_owner_is_kept_beside_it(bk, mod):
    """A node's reservation's owner (``booking.Spans.own``, read by ``ledger.Slots.owner``),
    pure and compiled: written beside the reservation as two C doubles (the flow by its slot
    and serial number, its head's arrival), it moves with it as reservations are inserted
    before it or cut, survives the arrays' growth, and goes with it; ``disown`` forgets those
    starting up to its time. A head that arrived before the reservation starts names its hop
    (where the node is on its route). An owner complete since, its slot left or reused, is
    ``DONE``."""
    b = pytest.importorskip(f"kbtrace.replay.fabric.{bk}")
    m = pytest.importorskip(f"kbtrace.replay.fabric.{mod}")
    tab = m.Slots()
    rt = SimpleNamespace(nodes=(4, 9, 7, 3))
    a, c, d = (SimpleNamespace(name=x, rt=rt) for x in "acd")
    sa, sc, sd = (tab.enter(f, 4) for f in (a, c, d))
    assert tab.key(sc) == 2 * 2 ** 20 + sc        # (its serial, 2, and slot; SLOTS_MAX)
    iv = b.Spans()
    iv.push(10.0, 12.0)
    iv.push(12.5, 13.0)
    assert not iv.owned() and tab.owner(iv, 0, 7) is None
    tab.own(iv, 0, sa, 10.0)
    tab.own(iv, iv.find(12.5), sc, 11.25)
    assert iv.owned() and (tab.owner(iv, 0, 7), tab.owner(iv, 2, 7)) == (a, (c, 2, 11.25))
    iv.insert2(0, 8.0, 9.0)             # (before both: they move, it has none)
    iv.push(14.0, 15.0)
    assert [tab.owner(iv, i, 7) for i in range(0, 8, 2)] == [None, a, (c, 2, 11.25), None]
    tab.own(iv, iv.find(14.0), sd, 14.0)
    for k in range(20):                 # (the arrays grow: 16 values at first)
        iv.push(20.0 + k, 20.5 + k)
    assert iv.n == 48 and iv.find(12.5) == 4 and tab.owner(iv, 4, 3) == (c, 3, 11.25)
    iv.disown(10.0)                     # (starts up to 10 forgotten: a's)
    assert [tab.owner(iv, i, 7) for i in range(0, 8, 2)] == [None, None, (c, 2, 11.25), d]
    b.unreserve(iv, 12.5)               # (c's goes with its reservation)
    assert iv.tolist()[:6] == [8.0, 9.0, 10.0, 12.0, 14.0, 15.0]
    assert [tab.owner(iv, i, 7) for i in range(0, 8, 2)] == [None, None, d, None]
    tab.leave(sd)                       # d complete
    assert tab.owner(iv, 4, 7) is m.DONE and m.DONE.fin
    tab.recycle()
    assert tab.enter(SimpleNamespace(name="e"), 4) == sd   # (its slot reused: not d's)
    assert tab.owner(iv, 4, 7) is m.DONE


def test_too_many_flows_under_way_is_one_replay_error(monkeypatch):
    """``Slots.key`` packs a slot in 20 bits: the (pure) ledger refuses the slot past
    ``SLOTS_MAX`` with a ReplayError naming the fidelities that have no such limit, not an
    OverflowError's traceback; freed slots are reused first, so only flows under way count."""
    from kbtrace.errors import ReplayError
    from kbtrace.replay.fabric import ledger
    monkeypatch.setattr(ledger, "SLOTS_MAX", 2)
    tab = ledger.Slots()
    s0, s1 = tab.enter(SimpleNamespace(), 3), tab.enter(SimpleNamespace(), 3)
    assert (s0, s1) == (0, 1)
    with pytest.raises(ReplayError, match=r"more than 2 transfers under way at once; replay "
                                          r"with --fidelity fast-fcfs or flit"):
        tab.enter(SimpleNamespace(), 3)
    tab.leave(s0)
    tab.recycle()
    assert tab.enter(SimpleNamespace(), 3) == 0
