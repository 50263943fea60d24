"""How fast mode shares what concurrent transfers contend for.

fast books a transfer when it starts, for the times its head and tail will reach each
resource; these tests pin what it does when others hold a resource then:

* a link's bookings are bandwidth shares (``take_rate``): a stream fed slower than the
  link books only the share its input allows, and streams overlap until the shares reach 1;
* a stream that finds too little to spare is served with what is left, from its arrival on
  (``fit_rate``: it uses gaps of any length instead of waiting for one that holds it
  whole), and books only that, so no link is ever over 100%;
* a node's per-transaction overhead is served in the gaps between earlier bookings
  (``serve``, preemptive resume);
* an HBM write, committed when its head arrives, books its later bursts ahead; each
  pseudo-channel serves in arrival order as flit mode's does, so a read or burst arriving
  before a burst booked ahead goes first and that burst (and its write's completion) moves
  back (``HbmController.write_stream``, ``heads.HbmWrite``);
* end to end: two PEs reading 64 KiB each across the same UCIe crossing finish exactly as in
  flit mode (serialised on the crossing before: 67% late), four within 30% (71% before).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kbtrace.replay import ReplayOptions, replay
from kbtrace.replay.fabric.booking import (
    Spans,
    Steps,
    fit_rate,
    serve,
    spans_of,
    steps_of,
    take_rate,
)
from kbtrace.replay.fabric.ledger import Slots
from kbtrace.replay.hbm import HbmController
from kbtrace.topology import compile_topology
from test_replay_util import TOPO_DIR, SynthTrace, hbm, load


def test_link_shares_overlap_until_the_bandwidth_is_used():
    ln = Steps()
    assert take_rate(ln, 0.0, 16.0, 4.0)          # busy 4 ns over 16: a quarter
    assert take_rate(ln, 2.0, 10.0, 4.0)          # half more from 2 to 10
    assert (ln.times(), ln.shares()) == ([0.0, 2.0, 10.0, 16.0], [0.25, 0.75, 0.25, 0.0])
    assert not take_rate(ln, 4.0, 8.0, 4.0)       # all of it: only a quarter to spare
    assert (ln.times(), ln.shares()) == ([0.0, 2.0, 10.0, 16.0], [0.25, 0.75, 0.25, 0.0])
    assert take_rate(ln, 12.0, 16.0, 3.0)         # three quarters: exactly what is left
    assert (ln.times(), ln.shares()) == ([0.0, 2.0, 10.0, 12.0, 16.0], [0.25, 0.75, 0.25, 1.0, 0.0])
    assert take_rate(ln, 16.0, 20.0, 4.0)         # free after the last booking
    assert (ln.times()[-3:], ln.shares()[-3:]) == ([16.0, 16.0, 20.0], [0.0, 1.0, 0.0])


def test_a_stream_gets_what_the_link_has_to_spare():
    ln = steps_of([0.0, 2.0, 10.0, 16.0], [0.25, 0.75, 0.25, 0.0])
    # alone it would cross in [4, 8] at the link's full rate (head 1 ns, body 3, last 1)
    start, head, tail = fit_rate(ln, 0.0, 4.0, 1.0, 3.0, 0.0, 1.0, 4.0)
    # a quarter to spare until 10 (1.5 ns of work), then three quarters: 2.5 ns more by 40/3
    assert start == 4.0                                # served at once, slower
    assert head == pytest.approx(8.0)                  # 1 ns of work at a quarter
    assert tail == pytest.approx(40 / 3)
    assert ln.times() == pytest.approx([0.0, 2.0, 4.0, 10.0, 40 / 3, 16.0])
    assert ln.shares() == pytest.approx([0.25, 0.75, 1.0, 1.0, 0.25, 0.0])   # never over 1
    # free: the closed form, booking the share its input allows
    ln = Steps()
    assert fit_rate(ln, 0.0, 4.0, 1.0, 3.0, 12.0, 1.0, 4.0) == (4.0, 5.0, 13.0)
    assert (ln.times(), ln.shares()) == ([4.0, 13.0], [4.0 / 9.0, 0.0])


def test_node_overhead_uses_gaps_shorter_than_itself():
    iv = spans_of([10.0, 18.0])
    assert serve(iv, 0.0, 6.0, 8.0) == 22.0           # 4 ns before 10, 4 after 18
    assert iv.tolist() == [6.0, 10.0, 10.0, 18.0, 18.0, 22.0]
    assert serve(iv, 0.0, 30.0, 2.0) == 32.0
    assert serve(Spans(), 0.0, 1.0, 2.0) == 3.0


def _controller(fast: bool) -> HbmController:
    p = SimpleNamespace(pcs_per_pe=8, burst_bytes=256, pc_bw_gbps=32.0, efficiency=1.0,
                        switch_penalty_ns=0.0)
    h = HbmController(0, p)
    if fast:
        h.pc_iv = [[] for _ in range(h.n_pcs)]
    return h


def _commits(h: HbmController, addr: int, nb: int, head: float, tail: float) -> float:
    """A write's bursts committed one by one, arriving evenly between ``head`` and ``tail``
    (each PC serves in commit order: what flit mode does when they arrive in that order)."""
    n = -(-nb // h.burst)
    step = (tail - head) / (n - 1) if n > 1 else 0.0
    return max(h.commit(addr + off, min(h.burst, nb - off), head + i * step, 1)
               for i, off in enumerate(range(0, nb, h.burst)))


def _in_arrival_order(h: HbmController, reqs: list) -> list[float]:
    """Flit mode's pseudo-channels: ``reqs`` (``(kind, addr, nbytes, head, tail)``, a read's
    bursts all arriving at ``head``, a write's evenly between ``head`` and ``tail``) committed
    burst by burst in arrival order (ties: in request order); each request's last finish."""
    bursts = []
    for r, (kind, addr, nb, head, tail) in enumerate(reqs):
        n = -(-nb // h.burst)
        step = (tail - head) / (n - 1) if kind == "w" and n > 1 else 0.0
        for i, off in enumerate(range(0, nb, h.burst)):
            bursts.append((head + i * step, r, addr + off, min(h.burst, nb - off), kind == "w"))
    done = [0.0] * len(reqs)
    for t, r, addr, sz, w in sorted(bursts, key=lambda b: (b[0], b[1])):
        done[r] = max(done[r], h.commit(addr, sz, t, int(w)))
    return done


class _Write:
    """What ``write_stream`` needs of a write's completion (``heads.HbmWrite``): its bursts
    booked ahead, and a call when they move."""

    def __init__(self) -> None:
        self.pend: list[list] = []
        self.pushes = 0

    def push(self) -> None:
        self.pushes += 1

    def done(self) -> float:
        return max(x[2] for x in self.pend)


def test_write_bursts_booked_ahead_queue_in_arrival_order():
    """Write A: 16 bursts (8 ns each) arriving 16 ns apart from 0, committed when its head
    arrives (fast mode books it then) -- pseudo-channel p serves it at [16p, 16p + 8] and
    [16p + 128, 16p + 136]. Write B: 8 bursts all arriving at 10, one per channel. Each
    channel serves in arrival order, as flit mode's, which commits each flit as it arrives: B
    goes after A's first burst on channel 0 and before A's bursts that arrive after 10 on the
    others ([10, 18] everywhere), and A's burst on channel 1, arriving at 16, moves to [18, 26]
    (A is told: ``push``). (Before: B took the gaps A left, [24, 32] on channel 1.)"""
    fast = _controller(True)
    a, b = _Write(), _Write()
    assert fast.write_stream(0, 16 * 256, 0.0, 240.0, 0.0, w=a) == 248.0
    assert len(a.pend) == 15 and a.pushes == 0          # all but the first booked ahead
    assert fast.write_stream(0, 8 * 256, 10.0, 10.0, 10.0, w=b) == 18.0
    assert a.pushes == 1 and a.pend[0][:3] == [16.0, 8.0, 26.0] and a.done() == 248.0
    fast.settle()
    scalar = _controller(False)
    reqs = [("w", 0, 16 * 256, 0.0, 240.0), ("w", 0, 8 * 256, 10.0, 10.0)]
    assert _in_arrival_order(scalar, reqs) == [248.0, 18.0]
    assert fast.pc_avail == scalar.pc_avail


def test_write_bursts_arrive_when_given():
    """``at``: per burst, when it arrives (a write that streams met on its last link, served
    there at several rates: ``heads.arrivals``). Write A's 8 bursts (8 ns each, burst i on
    channel i) arrive at 0, 1, ..., 5, then 30 and 31; B's 8 bursts all at 12 go after A's
    first six (channel 5 is busy with A's until 13) and before its last two: B ends at 21,
    A at 39, as committing them burst by burst in arrival order gives. Spread evenly over
    [0, 31], A's bursts 2 and 3 would arrive at 8.86 and 13.29 and B would end at 24.86."""
    fast = _controller(True)
    a, b = _Write(), _Write()
    at = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 30.0, 31.0]
    assert fast.write_stream(0, 2048, 0.0, 31.0, 0.0, w=a, at=at) == 39.0
    assert fast.write_stream(0, 2048, 12.0, 12.0, 12.0, w=b) == 21.0
    assert a.done() == 39.0
    fast.settle()
    scalar = _controller(False)
    bursts = [(t, 0, 256 * i) for i, t in enumerate(at)] + [(12.0, 1, 256 * i) for i in range(8)]
    done = [0.0, 0.0]
    for t, r, addr in sorted(bursts):
        done[r] = max(done[r], scalar.commit(addr, 256, t, 1))
    assert done == [39.0, 21.0]
    assert fast.pc_avail == scalar.pc_avail


def test_a_read_goes_before_write_bursts_that_arrive_after_it():
    """Write A as above; a read of 8 bursts arriving at 10 is served as write B was: [10, 18]
    on every channel, where taking the gaps A left ended it at 32 and queueing behind A's
    bursts booked ahead at 256."""
    fast = _controller(True)
    a = _Write()
    fast.write_stream(0, 16 * 256, 0.0, 240.0, 0.0, w=a)
    assert fast.read_span(0, 8 * 256, 10.0) == (18.0, 18.0)
    assert a.pushes == 1 and a.pend[0][2] == 26.0
    assert fast.read(0, 256, 20.0) == [28.0]       # channel 0 serves A again at 128
    fast.settle()
    scalar = _controller(False)
    reqs = [("w", 0, 16 * 256, 0.0, 240.0), ("r", 0, 8 * 256, 10.0, 10.0),
            ("r", 0, 256, 20.0, 20.0)]
    assert _in_arrival_order(scalar, reqs) == [248.0, 18.0, 28.0]
    assert fast.pc_avail == scalar.pc_avail


def test_fast_reads_and_writes_equal_flit_arrival_order():
    """A write's 8 bursts arrive at 0..7 (burst i on channel i) and a read of 16 bursts from
    channel 2 on at 3: channels 0..3 serve the write's burst first, 4..7 the read's two (their
    write bursts arrive after it), as flit mode does; the write's completion moves from 15 to
    27."""
    fast = _controller(True)
    a = _Write()
    assert fast.write_stream(0, 2048, 0.0, 7.0, 0.0, w=a) == 15.0
    got = fast.read(512, 4096, 3.0)
    assert got == [18.0, 19.0, 11.0, 11.0, 11.0, 11.0, 16.0, 17.0,
                   26.0, 27.0, 19.0, 19.0, 19.0, 19.0, 24.0, 25.0]
    assert a.done() == 27.0
    fast.settle()
    scalar = _controller(False)
    reqs = [("w", 0, 2048, 0.0, 7.0), ("r", 512, 4096, 3.0, 3.0)]
    assert _in_arrival_order(scalar, reqs) == [27.0, max(got)]
    assert fast.pc_avail == scalar.pc_avail


@pytest.mark.parametrize("readers, worst", [(2, 1e-9), (4, 0.005)])
def test_concurrent_reads_across_one_ucie_crossing(tmp_path, readers, worst):
    """PEs 0..n-1 of cube 0 each read 64 KiB from their counterpart's slice in cube 1, all at
    once.
    Fast used to serialise whole transfers on the shared crossing (2 readers: 1,237 ns vs
    742 in flit mode; 4: 1,767 vs 1,034); it shared the links' bandwidth, but a stream booked
    first kept its full rate on a mesh link three of them share (4 readers: 1,282.5 ns, 24%
    late). With the fair share (``fabric/fair.py``) the streams that meet there are served
    together, first come, first served, as their flits interleave: 1,034.2 ns."""
    small = compile_topology(TOPO_DIR / "small.yaml")
    nb = 65536
    tr = SynthTrace([load(hbm(0, 1, p, small, p * nb), nb, pe=p, program=p)
                     for p in range(readers)], f"ucie{readers}")
    ms = {f: replay(tr, small, ReplayOptions(fidelity=f, out_dir=str(tmp_path / f))).makespan_ns
          for f in ("flit", "fast")}
    assert abs(ms["fast"] - ms["flit"]) <= ms["flit"] * worst, ms


@pytest.mark.parametrize("pen", [0.0, 3.3])
def test_write_equals_the_scalar_commit_when_nothing_is_booked_ahead(pen):
    """Writes whose bursts each arrive after everything booked on their channel: the same
    times as committing them one by one in arrival order, read/write turnaround penalty
    included."""
    slow, fast = _controller(False), _controller(True)
    for h in (slow, fast):
        h.penalty = pen
    seq = [("r", 0, 1024, 0.0, 0.0), ("w", 256, 2048, 40.0, 47.0), ("r", 768, 512, 120.0, 0.0),
           ("w", 0, 600, 200.0, 203.0)]
    for kind, addr, nb, t, tail in seq:
        if kind == "r":
            assert slow.read(addr, nb, t) == fast.read(addr, nb, t)
        else:
            assert _commits(slow, addr, nb, t, tail) == fast.write_stream(addr, nb, t, tail, t)
    fast.settle()
    assert (slow.pc_avail, slow.last_dir) == (fast.pc_avail, fast.last_dir)


def test_a_stream_that_finds_the_link_taken_queues_until_it_has_bandwidth():
    """Its queueing is the wait for its first share of bandwidth (the hop row's
    ``queue_ns``), so its busy window holds all of its service: found by the replay fuzz test,
    where a head delayed by slower service made the window start too late and the busy-window
    check saw the link over 100%."""
    ln = steps_of([0.0, 10.0], [1.0, 0.0])
    assert fit_rate(ln, 0.0, 2.0, 1.0, 3.0, 0.0, 1.0, 4.0) == (10.0, 11.0, 14.0)
    ln = steps_of([0.0, 1.0, 3.0, 20.0], [1.0, 0.5, 1.0, 0.0])
    start, head, tail = fit_rate(ln, 0.0, 0.5, 1.0, 1.0, 0.0, 1.0, 2.0)
    assert (start, head, tail) == (1.0, 3.0, 21.0)     # half speed on [1, 3], then after 20


def test_a_gap_short_by_rounding_still_holds_its_reservation():
    """Fast mode computes the same time by different sums (a closed form's offsets, or hop by
    hop), which differ in the last bits. A gap short of an overhead by such an error holds it
    (the reservation is clipped to the gap) instead of costing a whole further wait, so the
    two ways agree (found by the stretch-vs-hop-by-hop property test: 2 ns apart)."""
    iv = spans_of([10.0, 12.0])
    end = serve(iv, 0.0, 8.000000000000004, 2.0)       # the gap [8.0..04, 10] is 2 - 4e-15
    assert end == 10.000000000000004 and iv.tolist() == [8.000000000000004, 10.0, 10.0, 12.0]
    ln = steps_of([0.0, 10.0 + 1e-14, 20.0], [0.5, 1.0, 0.0])
    assert take_rate(ln, 2.0, 10.0, 4.0)           # half of [2, 10]: up to the full part
    assert (ln.times(), ln.shares()) == ([0.0, 2.0, 10.0 + 1e-14, 20.0], [0.5, 1.0, 1.0, 0.0])
    ln = steps_of([0.0, 5.0, 10.0 - 1e-14], [1.0, 1.0, 0.0])  # a sliver of bandwidth before 10
    assert fit_rate(ln, 0.0, 2.0, 1.0, 1.0, 0.0, 1.0, 2.0)[0] == 10.0 - 1e-14


def test_a_stream_held_back_catches_up_when_the_link_frees():
    """Work that waited is served as fast as the link spares, not only at the stream's share:
    the delay met on one link does not stay (nor grow on every further shared link: four PEs
    reading from small.yaml's diagonal cube were 94% late in fast mode, 2.3% now)."""
    ln = steps_of([0.0, 10.0], [1.0, 0.0])                  # taken whole until 10
    # half the link's rate (5 ns of work arriving over [0, 10]): all of it waits until 10,
    # then crosses at the full rate (at its share it would end at 20)
    assert fit_rate(ln, 0.0, 0.0, 1.0, 9.0, 0.0, 1.0, 5.0) == (10.0, 10.5, 15.0)
    assert (ln.times(), ln.shares()) == ([0.0, 10.0, 15.0], [1.0, 1.0, 0.0])
    ln = steps_of([0.0, 10.0], [0.5, 0.0])                  # half of it until 10
    # 0.8 of the rate arriving, 0.5 served: 3 ns wait at 10, then served at the full rate
    assert fit_rate(ln, 0.0, 0.0, 1.0, 9.0, 0.0, 1.0, 8.0) == (0.0, 1.6, 13.0)
    assert (ln.times(), ln.shares()) == ([0.0, 10.0, 13.0], [1.0, 1.0, 0.0])


def test_fast_fcfs_keeps_bookings_where_they_were_made(tmp_path):
    """``fast-fcfs`` is fast mode without the fair share: the four UCIe readers above come
    out as before it (a stream booked first keeps its full rate on the mesh link three of
    them share: 1,282.5 ns against flit's 1,034.2), ``fast`` as flit; a transfer alone on
    its path is the same in all three; the run records its fidelity."""
    import json
    small = compile_topology(TOPO_DIR / "small.yaml")
    nb = 65536
    tr = SynthTrace([load(hbm(0, 1, p, small, p * nb), nb, pe=p, program=p)
                     for p in range(4)], "ucie4")
    runs = {f: replay(tr, small, ReplayOptions(fidelity=f, out_dir=str(tmp_path / f)))
            for f in ("flit", "fast", "fast-fcfs")}
    ms = {f: r.makespan_ns for f, r in runs.items()}
    assert ms["fast-fcfs"] == pytest.approx(1282.5, abs=0.1)
    assert ms["fast"] == pytest.approx(ms["flit"], rel=0.005)
    assert json.loads((runs["fast-fcfs"].run_dir / "run.json").read_text())["fidelity"] \
        == "fast-fcfs"
    lone = SynthTrace([load(hbm(0, 1, 0, small, 0), nb, pe=0, program=0)], "lone")
    one = {f: replay(lone, small, ReplayOptions(fidelity=f, out_dir=str(tmp_path / f"1{f}")))
           .makespan_ns for f in ("flit", "fast", "fast-fcfs")}
    assert one["fast"] == one["fast-fcfs"] == pytest.approx(one["flit"], abs=1e-6)


def _same_in_both_modes(tmp_path, topo, sends, done):
    """Each of ``sends`` (src node, dst node, bytes, start ns; op ids in order) started at its
    time on a fresh flit and a fresh fast fabric of ``topo``: each op's done time equals
    ``done[op]`` to 1e-9 ns in both."""
    for fidelity, got in _done_times(tmp_path, topo, sends).items():
        assert got == pytest.approx(done, abs=1e-9), fidelity


@pytest.mark.parametrize("read, at, done", [
    (False, 14.0, {0: 35.7, 1: 31.7}),      # PE 4's store overtakes PE 7's at a mesh node
    (True, 4.0, {0: 34.3, 1: 17.7}),        # a one-flit read crosses a store there
    (True, 10.0, {0: 35.0, 1: 23.7}),
    (True, 20.0, {0: 34.4, 1: 33.7})])
def test_a_one_flit_store_whose_head_arrives_later_gives_way(tmp_path, read, at, done):
    """A one-flit HBM write (PE 7's DMA to PE 0's slice, booked at 0) and a one-flit transfer
    started ``at`` ns later (PE 4's store to the same slice, or a read of it into PE 4) meet
    at mesh nodes; where the later one's head arrives first, flit mode's node serves it
    first. Fast mode moves the store's head, its link booking after the node and its HBM
    commit (``heads.HbmWrite.recommit``): as flit mode, to the 0.1 ns. Before, the store's
    node overhead kept its time and the other waited behind it (PE 4's store done at 37.6
    instead of 31.7, the read at 19.7 instead of 17.7)."""
    from kbtrace.topology.model import PeCoord
    small = compile_topology(TOPO_DIR / "small.yaml")
    pe7, pe4 = (small.pe_node(PeCoord(0, 0, p), "dma").idx for p in (7, 4))
    mem = small.hbm_ctrl(PeCoord(0, 0, 0)).idx
    _same_in_both_modes(tmp_path, small, [(pe7, mem, 128, 0.0),
                                          (*((mem, pe4) if read else (pe4, mem)), 128, at)], done)


def test_single_flits_cross_a_link_in_arrival_order(tmp_path):
    """PEs 0..7 each read 256 B (one flit) twice from PE 0's slice, all at once: their reads
    leave the HBM controller one after another, and a read booked later may arrive at the
    controller's link before one booked earlier (which waited for a pseudo-channel). Flit
    mode's link serves whole flits first come, first served; fast mode gives the later-booked
    flit the link and books the other again behind it, its flow delayed (``heads.serve_flit``).
    Every read as in flit mode: before, the flit booked first kept the link and the other took
    what it spared (PE 1's second read done at 143.65 instead of 141.15, PE 5's first at
    154.25 instead of 155.75)."""
    small = compile_topology(TOPO_DIR / "small.yaml")
    tr = SynthTrace([load(hbm(0, 0, 0, small, r * 256), 256, pe=p, program=p, seq=r)
                     for r in range(2) for p in range(8)], "flits")
    ends = {}
    for f in ("flit", "fast"):
        run = replay(tr, small, ReplayOptions(fidelity=f, out_dir=str(tmp_path / f)))
        ends[f] = run.op_timing()["t_end_ns"].to_pylist()
    assert ends["flit"][9] == pytest.approx(141.15, abs=1e-6)
    assert ends["flit"][5] == pytest.approx(155.75, abs=1e-6)
    assert ends["fast"] == pytest.approx(ends["flit"], abs=1e-6)


def _moved_flow(fab, rt, op):
    from kbtrace.replay.fabric.fair import Flow
    return Flow(fab, rt, op, -1, 0.0)


def _owners(tab, iv) -> list:
    """Who holds each of node 0's reservations ``iv``, in order (``ledger.Slots.owner``)."""
    return [tab.owner(iv, i, 0) for i in range(0, iv.n, 2)]


def test_a_moved_credit_takes_the_gaps_and_pushes_no_one():
    """``heads.head_at``: flow g, a single flit between PEs (an IPCQ credit), booked at node 0
    for [10, 12], now arrives at 12.5; flow h's head (arrived at 13) holds the node for
    [13, 15]. g takes the gaps (12.5-13, then 15-16.5) and h keeps its time. First come, first served (g first at [12.5, 14.5], h pushed to [14.5, 16.5], and on
    along its path) made fast mode chaotic: llama_layer on default.yaml came out 11,996 ns
    with the PCIe switch overhead at 5.0 ns and 19,147 ns at 5.000001 (flit mode 11,881 at
    both), see ``test_llama_layer.test_llama_layer_default_is_stable``."""
    from kbtrace.replay.fabric.heads import head_at
    from kbtrace.replay.fabric.pull import pull_behind
    niv = spans_of([10.0, 12.0, 13.0, 15.0])
    tab = Slots()
    fab = SimpleNamespace(env=SimpleNamespace(now=0.0, _now=0.0), push_depth=0, _f=None,
                          flow_slots=tab, hbm={}, node_kind=["ucie"], node_ov=[2.0],   # (g: from no HBM ctrl)
                          body_in=[[]],
                          pull_behind=pull_behind)      # (h's head was not queued behind g)
    g_rt = SimpleNamespace(links=(0,), nodes=(0, 1), hops=((niv, 2.0, Steps(), 0, 1, 0.25, 0.0, 0.0,
                                                            0.0),), fixed=False)
    h_rt = SimpleNamespace(links=(0,), nodes=(0, 1), hops=((niv, 2.0, Steps(), 0, 0, 0.0, 0.0, 0.0,
                                                            0.0),), fixed=False)
    g, h = _moved_flow(fab, g_rt, 1), _moved_flow(fab, h_rt, 2)
    tab.own(niv, 0, g.slot, 10.0)
    tab.own(niv, 2, h.slot, 13.0)
    assert head_at(fab, g, 0, 10.0, 12.5) == 16.5
    assert niv.tolist() == [12.5, 13.0, 13.0, 15.0, 15.0, 16.5]
    assert _owners(tab, niv) == [None, h, None]     # h's stands, movable


@pytest.mark.parametrize("at, done", [(8.25, {0: 25.4125, 1: 16.5}), (8.5, {0: 25.6625, 1: 16.75}),
                                      (9.0, {0: 26.1625, 1: 17.25})])
def test_a_moved_credit_is_still_served_after_a_head_that_arrives_first(tmp_path, at, done):
    """An IPCQ credit (16 B, PE 0 -> PE 7 of cube 0, sent at 0) and a 512 B payload (PE 2 ->
    PE 3, sent ``at`` ns later) meet at two mesh routers. The payload's head arrives first at
    both; booked later, it pushes the credit at the first (``heads.serve_head``), and the
    credit's head then reaches the second after it (``heads.head_at``). As in flit mode, the
    payload goes first there too: the credit's moved reservation at a mesh router is noted as
    its, so the payload's head pushes it again. Before, the moved credit took the gap at its
    new time and the payload waited behind it (at 8.5: payload done at 18.75, credit at
    24.725, against 16.75 and 25.6625)."""
    from kbtrace.topology.model import PeCoord
    small = compile_topology(TOPO_DIR / "small.yaml")
    dma = [small.pe_node(PeCoord(0, 0, p), "dma").idx for p in range(8)]
    _same_in_both_modes(tmp_path, small, [(dma[0], dma[7], 16, 0.0), (dma[2], dma[3], 512, at)],
                        done)


@pytest.mark.parametrize("at, done", [(8.5, {0: 25.6625, 1: 21.025, 2: 16.75}),
                                      (9.25, {0: 26.4125, 1: 21.775, 2: 20.5})])
def test_a_moved_credit_goes_before_a_credit_that_arrives_after_it_at_a_router(tmp_path, at,
                                                                               done):
    """Two IPCQ credits (16 B, PE 0 -> PE 7 of cube 0 sent at 0, PE 1 -> PE 2 at 3.5) meet at
    a mesh router, the second arriving within the first's 2 ns overhead: it waits behind it.
    A 512 B payload (PE 2 -> PE 3, sent ``at`` ns later) then pushes the first credit at an
    earlier router, so it reaches the shared router later than booked, but still before the
    second. Flit mode serves it first there; so does fast mode now (a moved credit is served
    at a mesh router as any moved head, ``heads.head_at`` -> ``serve_head``), pushing the
    second. Before, it took the gaps around the second's reservation: 2 ns late (27.6625 /
    28.4125), the second credit early (20.65) and, at 8.5, the payload 1.625 ns late."""
    from kbtrace.topology.model import PeCoord
    small = compile_topology(TOPO_DIR / "small.yaml")
    dma = [small.pe_node(PeCoord(0, 0, p), "dma").idx for p in range(8)]
    _same_in_both_modes(tmp_path, small, [(dma[0], dma[7], 16, 0.0), (dma[1], dma[2], 16, 3.5),
                                          (dma[2], dma[3], 512, at)], done)


@pytest.mark.parametrize("at, done", [(11.0, {0: 32.7, 1: 32.25, 2: 28.7}),
                                      (11.5, {0: 33.2, 1: 32.75, 2: 29.2})])
def test_a_credit_queued_behind_a_head_that_moved_later_goes_first(tmp_path, at, done):
    """A 512 B IPCQ payload (PE 1 -> PE 6 of cube 0, sent at 0) and an IPCQ credit (16 B, PE 4
    -> PE 2, sent at 10) meet at a mesh router, the credit's head arriving within the
    payload's overhead there: booked later, it waits behind it. A second payload (PE 2 -> PE 6,
    sent ``at`` ns later) then pushes the first at an earlier router, so that one reaches the
    shared router after the credit. Flit mode serves the credit first there; so does fast mode
    now: the credit is served again from its arrival in the gap the moved head left, and its
    link booking, rows and completion move earlier (``pull.pull_behind``). Before, it kept its
    reservation behind the moved head's old one (nothing in fast mode moved earlier): done at
    33.85 instead of 32.25 / 32.75 (ring_allreduce on small.yaml, router 26: payload 212 and
    credit 263)."""
    from kbtrace.topology.model import PeCoord
    small = compile_topology(TOPO_DIR / "small.yaml")
    dma = [small.pe_node(PeCoord(0, 0, p), "dma").idx for p in range(8)]
    _same_in_both_modes(tmp_path, small, [(dma[1], dma[6], 512, 0.0), (dma[4], dma[2], 16, 10.0),
                                          (dma[2], dma[6], 512, at)], done)


@pytest.mark.parametrize("first, second, at, done", [
    ((0, 7, 16), (2, 3, 512), 9.25, {0: 26.4125, 1: 18.5}),
    ((0, 7, 16), (2, 3, 512), 9.75, {0: 26.9125, 1: 19.0}),
    ((2, 3, 512), (3, 2, 16), 4.5, {0: 9.25, 1: 10.525})])
def test_a_payloads_second_flit_waits_behind_heads_that_arrived_before_it(tmp_path, first,
                                                                          second, at, done):
    """A 512 B IPCQ payload (two flits) meets an IPCQ credit (16 B) at a mesh router, the credit's
    head arriving between the payload's two flits: flit mode's node is one FIFO, so the
    payload's second flit waits until the credit's 2 ns overhead is done. Fast mode holds the
    payload's tail there too: booked before the payload (the credit sent at 0, the payload
    ``at`` ns later: ``bodies.body_hold``) and after it (the payload PE 2 -> PE 3 at 0, the
    credit PE 3 -> PE 2 at 4.5 ns: ``bodies.hold_bodies``). Before, the second flit passed: the
    payload 1 ns early (17.5, 18.0 and 8.25 ns)."""
    from kbtrace.topology.model import PeCoord
    small = compile_topology(TOPO_DIR / "small.yaml")
    dma = [small.pe_node(PeCoord(0, 0, p), "dma").idx for p in range(8)]
    (a0, b0, nb0), (a1, b1, nb1) = first, second
    _same_in_both_modes(tmp_path, small, [(dma[a0], dma[b0], nb0, 0.0),
                                          (dma[a1], dma[b1], nb1, at)], done)


def test_heads_pushed_at_a_node_are_served_again_in_arrival_order():
    """``heads.serve_head``: node 0 holds two reservations of heads that arrive after a new
    one (arriving at 10.5, overhead 2): g's for [12, 14] (its head arrives at 11.5: it moved
    later after h had queued behind its old reservation) and h's for [14, 16] (arrives at
    11.0). Both go after the new head, as flit mode's FIFO serves them: h first ([12.5,
    14.5]), then g ([14.5, 16.5]). Before, they were served again in the order of their old
    reservations (g at [12.5, 14.5], h at [14.5, 16.5]): ring_allreduce on small.yaml, router
    26, payloads 311 and 212 pushed by 231, 2 ns apart from flit mode, per-op p95 4.62%
    (0.00% now)."""
    from kbtrace.replay.fabric.heads import serve_head
    niv = spans_of([12.0, 14.0, 14.0, 16.0])
    tab = Slots()
    fab = SimpleNamespace(env=SimpleNamespace(now=0.0, _now=0.0), push_depth=0, _f=None,
                          flow_slots=tab, hbm={}, node_kind=["router"], node_ov=[2.0], body_in=[[]])
    rt = SimpleNamespace(links=(0,), nodes=(0, 1), hops=((niv, 2.0, Steps(), 0, 0, 0.0, 0.0, 0.0,
                                                          0.0),), fixed=False)
    g, h = _moved_flow(fab, rt, 1), _moved_flow(fab, rt, 2)
    tab.own(niv, 0, g.slot, 11.5)
    tab.own(niv, 2, h.slot, 11.0)
    assert serve_head(fab, 0, niv, 0.0, 10.5, 2.0, 0, None) == 12.5
    assert niv.tolist() == [10.5, 12.5, 12.5, 14.5, 14.5, 16.5]
    assert _owners(tab, niv) == [None, (h, 0, 11.0), (g, 0, 11.5)]


def _done_times(tmp_path, topo, sends, send=None):
    """Each of ``sends`` (src node, dst node, bytes, start ns; op ids in order) started at its
    time on a fresh flit and a fresh fast fabric of ``topo``: ``{fidelity: {op: done ns}}``.
    ``send(fab, op, item)``: how an item is sent (its start ns is ``item[-2]`` then; default:
    ``fab.send`` of the item's nodes and bytes, start ns last)."""
    from kbtrace.replay.fabric.fast import FastFabric
    from kbtrace.replay.fabric.flit import FlitFabric
    from test_replay_fast import _fabric
    out: dict = {}
    for cls in (FlitFabric, FastFabric):
        fab, _rec = _fabric(cls, topo, tmp_path / cls.fidelity)
        got = out[cls.fidelity] = {}
        for op, item in enumerate(sends):
            t = item[-1] if send is None else item[-2]
            if t > fab.env.now:
                fab.env.run(until=t)
            ev = (fab.send(op, -1, *item[:3]) if send is None else send(fab, op, item))
            ev.callbacks.append(lambda _e, op=op, fab=fab, got=got: got.__setitem__(op, fab.env.now))
        fab.env.run()
    return out


@pytest.mark.parametrize("src, at, flit, fast", [
    (1, 10.0, 36.6625, 36.9325),     # before: 66.6625 (behind the whole stream)
    (1, 20.0, 46.6625, 55.3675),     # before: 66.6625
    (0, 10.0, 62.575, 62.575)])      # from the stream's own DMA: behind all of it, as before
def test_a_credit_crosses_a_stream_first_come_first_served(tmp_path, src, at, flit, fast):
    """PE 0 sends 8 KiB to PE 7 at 0 (a flow: its flits fill every mesh link on the way); an
    IPCQ credit (16 B, one flit) from PE ``src`` to PE 7 (PE 6 for src 0) starts ``at`` ns later
    and meets it on the links into PE 7. Flit mode's link FIFO sends the credit after the flits
    queued when it arrives, before those arriving after it (~1 ns of queue per link). Fast mode
    serves the credit with the flows still arriving there first come, first served
    (``heads._in_fifo``, ``fifo.share_fifo``), the stream pushed by the flit's time: 0.27 ns
    late at 10 ns, 8.7 ns late at 20 ns (at each router the credit's head overhead holds the
    stream's flits in flit mode, which the fluid backlog does not see). Before, the credit took
    what the stream spared, after all of it (66.66 ns at both). A DMA's flow on its first link
    keeps its booking (its data is all there, a backlog its fluid arrival does not describe):
    a credit from the stream's own DMA still goes after all of it, as in flit mode."""
    from kbtrace.topology.model import PeCoord
    small = compile_topology(TOPO_DIR / "small.yaml")
    dma = [small.pe_node(PeCoord(0, 0, p), "dma").idx for p in range(8)]
    got = _done_times(tmp_path, small, [(dma[0], dma[7], 8192, 0.0),
                                        (dma[src], dma[7 if src else 6], 16, at)])
    assert got["flit"][1] == pytest.approx(flit, abs=1e-3)
    assert got["fast"][1] == pytest.approx(fast, abs=1e-3)
    assert got["fast"][0] == pytest.approx(got["flit"][0], abs=1e-3)


def _read_done_times(tmp_path, topo, mem, reads):
    """Each of ``reads`` (destination node, bytes, start ns, per-burst ready times; op ids in
    order) read from HBM controller ``mem`` on a fresh flit and a fresh fast fabric of
    ``topo``, as the engine sends them (fast: the first and last burst, and the bursts):
    ``{fidelity: {op: done ns}}``."""
    from kbtrace.replay.fabric.flit import FlitFabric

    def send(fab, op, read):
        dst, nb, _t, ready = read
        if isinstance(fab, FlitFabric):
            return fab.send(op, -1, mem, dst, nb, ready=ready)
        return fab.send(op, -1, mem, dst, nb, span=(min(ready), max(ready)),
                        bursts=ready if len(ready) > 1 else None)
    return _done_times(tmp_path, topo, reads, send)


@pytest.mark.parametrize("first, at, fast", [
    ("flit", 11.4, 52.600001),     # before: 47.6 (across the link as the read's flits queued)
    ("flit", 16.0, 52.600001),     # before: 51.6
    ("read", 11.4, 52.923077),     # before: 47.769
    ("read", 16.0, 53.984615)])    # before: 52.369
def test_a_one_flit_read_waits_behind_the_bursts_ready_before_it(tmp_path, first, at, fast):
    """PE 0 reads 2 KiB from its own HBM slice whose bursts are ready seven at 10 ns and the
    last at 19.4 ns (its pseudo-channel busy), and PE 7 reads one flit from the same slice,
    ready ``at`` ns, booked before the 2 KiB read (``first`` "flit") or after it ("read").
    Flit mode's link FIFO out of the controller sends the one flit behind the seven bursts
    ready before it (17 -> 18 ns) and before the last: done at 52.6 ns, the 2 KiB read at
    21.5. Fast mode describes the read's arrival at its first link as its bursts are ready
    (``fifo.burst_arrival``) and serves single flits booked before it with it first come,
    first served (``pull.read_first``): exact to the 1e-6 ns a group of bursts takes to
    arrive there. Booked after the read, the flit meets the read's booking, a mean share
    from its first burst to its last, which has served less than the link would have by
    then: 0.32 / 1.38 ns late. Before, it crossed in the share the read left: up to 5 ns
    early, as in llama_layer on default.yaml, where the cube's gemms after it then read
    their weights from the slice 32 ns apart."""
    from kbtrace.topology.model import PeCoord
    small = compile_topology(TOPO_DIR / "small.yaml")
    mem = small.hbm_ctrl(PeCoord(0, 0, 0)).idx
    dma = [small.pe_node(PeCoord(0, 0, p), "dma").idx for p in range(8)]
    flit = (dma[7], 256, 0.0, [at])
    read = (dma[0], 2048, 0.0, [10.0] * 7 + [19.4])
    reads = [flit, read] if first == "flit" else [read, flit]
    got = _read_done_times(tmp_path, small, mem, reads)
    i = 0 if first == "flit" else 1
    assert got["flit"][i] == pytest.approx(52.6, abs=1e-9)
    assert got["flit"][1 - i] == pytest.approx(21.5, abs=1e-9)
    assert got["fast"][i] == pytest.approx(fast, abs=1e-6)
    assert got["fast"][1 - i] == pytest.approx(21.5, abs=1e-5)


def test_bursts_ready_together_go_in_the_order_their_reads_were_booked(tmp_path):
    """Two 2 KiB reads from one slice: PE 7's bursts ready four at 10 and four at 18 ns, PE 0's
    booked after it four at 18 and four at 26. Flit mode puts PE 7's four of 18 ns on the
    link first (done 52.6 ns, PE 0's at 33.1). Fast mode serves them first come, first
    served, the later-booked read's bursts put ``fifo.BURST_NS`` later: the same (equal
    arrivals would share the link in proportion; before, at mean shares: PE 0 29.88 ns)."""
    from kbtrace.topology.model import PeCoord
    small = compile_topology(TOPO_DIR / "small.yaml")
    mem = small.hbm_ctrl(PeCoord(0, 0, 0)).idx
    dma = [small.pe_node(PeCoord(0, 0, p), "dma").idx for p in range(8)]
    got = _read_done_times(tmp_path, small, mem, [(dma[7], 2048, 0.0, [10.0] * 4 + [18.0] * 4),
                                                  (dma[0], 2048, 1.0, [18.0] * 4 + [26.0] * 4)])
    assert got["flit"] == pytest.approx({0: 52.6, 1: 33.1}, abs=1e-9)
    assert got["fast"] == pytest.approx({0: 52.6, 1: 33.1}, abs=1e-5)


@pytest.mark.parametrize("t_ns", [1_000.45, 21_255_624.45, 1.0e9 + 0.45, 2.0e10 + 0.45])
def test_bursts_arrive_whole_however_late_in_the_run(t_ns):
    """An HBM read's bursts arrive at its first link within ``BURST_NS`` each; at 21 ms the
    ns clock's resolution is 3.7e-9 ns, so a share of ``work / BURST_NS`` over the rounded
    span made an 8 KiB read arrive 0.16% short (31.948 of 32 ns of work), the link before
    served it faster than it could, and bench_e2e's 1.0 M-op gemm failed the busy check in
    `fast`. Every burst's work now arrives whole, and a stream of them is served whole."""
    from kbtrace.replay.fabric.booking import Steps
    from kbtrace.replay.fabric.fifo import BURST_NS, burst_arrival, share_fifo
    ready = [t_ns + 8.0 * (i // 4) + 1.4 * (i % 4) for i in range(16)]
    for lag in (0.0, BURST_NS):
        arr = burst_arrival(ready, 32.0, 8192, 512, lag)
        assert len(arr) == 16 and all(b > a for a, b, _r in arr)
        assert sum(r * (b - a) for a, b, r in arr) == pytest.approx(32.0, rel=1e-12)
    (pcs, end, _hd), = share_fifo(Steps(), t_ns, [[burst_arrival(ready, 32.0, 8192, 512),
                                                   32.0, 0.0, 0.0]])
    assert sum(r * (b - a) for a, b, r in pcs) == pytest.approx(32.0, rel=1e-9)
    assert end >= ready[-1]
