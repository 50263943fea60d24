"""fast's fair share books no more of a link than it spares, however late in the run.

``fifo.share_fifo`` serves streams that meet on a link first come, first served and books
each one's pieces there (``booking.Steps``). An HBM read arrives at its first link as its
bursts are ready, each within ``fifo.BURST_NS`` (1e-6 ns); each stream's share of the served
work was read off at a time tau rounded to the ns clock (3.7e-9 ns fine at 21 ms, 1.2e-7 at
1 s), and next to bursts that steep a tau an ulp off moved up to ~1 ns of work from one
piece to the next: in the first scenario here the pieces booked shares up to 1.16 at 1 us,
7,475 (over a sliver an ulp wide) at 21 ms and 1.67 at 1 s of simulated time (issue 25).
These tests pin the bound (1 + 1e-12) and that every stream is served all its work.
"""

from __future__ import annotations

import pytest

from kbtrace.replay.fabric.booking import Steps, steps_of
from kbtrace.replay.fabric.fifo import BURST_NS, burst_arrival, share_fifo

LATE = [1_000.45, 21_000_000.45, 1.0e9 + 0.45]


def _work(pcs):
    return sum(r * (b - a) for a, b, r in pcs)


@pytest.mark.parametrize("t0", LATE)
def test_streams_meeting_bursts_take_no_more_than_the_link_spares(t0):
    """Two 8 KiB reads (16 bursts of 2 ns of work, ready one by one, the second read's
    ``BURST_NS`` later) and a flow arriving at half the link's rate (20 ns of work from
    0.2 ns on) meet on a link booked a quarter by someone else from 20 to 30 ns: 84 ns of
    work arrives faster than the link serves it, so it is busy from 0 to 84 + 2.5 ns."""
    ready = [t0 + 8.0 * (i // 4) + 1.4 * (i % 4) for i in range(16)]
    ready2 = [t0 + 3.3 + 8.0 * (i // 4) + 1.1 * (i % 4) for i in range(16)]
    flow = [(t0 + 0.2, t0 + 40.2, 0.5)]
    ln = steps_of([t0 + 20.0, t0 + 30.0], [0.25, 0.0])
    got = share_fifo(ln, t0, [[burst_arrival(ready, 32.0, 8192, 512), 32.0, 0.0, 0.0],
                              [burst_arrival(ready2, 32.0, 8192, 512, BURST_NS), 32.0, 0.0, 0.0],
                              [flow, 20.0, 0.0, 0.0]])
    assert max(ln.shares()) <= 1.0 + 1e-12
    assert [_work(pcs) for pcs, _e, _h in got] == pytest.approx([32.0, 32.0, 20.0], rel=1e-9)
    assert max(e for _p, e, _h in got) - t0 == pytest.approx(86.5, abs=1e-6)
    # the link is full throughout: the shares booked add up to 1 at every moment served
    ts, rs = ln.times(), ln.shares()
    assert ts[0] == t0 and ts[-1] - t0 == pytest.approx(86.5, abs=1e-6)
    assert sum(r * (b - a) for a, b, r in zip(ts[:-1], ts[1:], rs[:-1], strict=True)) == pytest.approx(86.5, rel=1e-9)


def test_a_stream_alone_is_served_as_its_bursts_arrive():
    """One read alone at 1 s of simulated time: each 2 ns burst is served from when it is
    ready at the link's full rate, none faster (before: 1.00000048)."""
    t0 = 1.0e9 + 0.45
    ready = [t0 + 8.0 * i for i in range(4)]
    ln = Steps()
    (pcs, end, _h), = share_fifo(ln, t0, [[burst_arrival(ready, 8.0, 2048, 512), 8.0, 0.0, 0.0]])
    assert max(ln.shares()) <= 1.0 + 1e-12
    assert _work(pcs) == pytest.approx(8.0, rel=1e-12)
    assert end - t0 == pytest.approx(26.0, abs=1e-6)


@pytest.mark.parametrize("t_ns", [0.0] + LATE[1:])
def test_a_replay_late_in_the_run_books_no_link_over_its_bandwidth(tmp_path, t_ns):
    """Four PEs read 4 KiB each from PE 0's HBM slice (bursts ready 2.1 ns apart in groups of
    four) while PEs 5 and 6 each write 8 KiB into PE 0: on small.yaml in fast, started at
    ``t_ns``. No link's booked share is ever over 1 (before: 1.0019 at 0 ns, 1.90 at 21 ms,
    2.17 at 1 s), and the last transfer is done 93.1 ns after the start (within the 0.1 ns
    the run's other arithmetic drifts by at 1 s)."""
    from kbtrace.replay.fabric.fast import FastFabric
    from kbtrace.topology import compile_topology
    from kbtrace.topology.model import PeCoord
    from test_replay_fast import _fabric
    from test_replay_util import TOPO_DIR
    small = compile_topology(TOPO_DIR / "small.yaml")
    mem = small.hbm_ctrl(PeCoord(0, 0, 0)).idx
    dma = [small.pe_node(PeCoord(0, 0, p), "dma").idx for p in range(8)]
    fab, _rec = _fabric(FastFabric, small, tmp_path)
    if t_ns > 0.0:
        fab.env.run(until=t_ns)
    done: dict = {}
    for p in range(4):
        ready = [t_ns + 10.0 + 1.3 * p + 2.1 * (i // 4) for i in range(16)]
        ev = fab.send(p, -1, mem, dma[p], 4096, span=(ready[0], ready[-1]), bursts=ready)
        ev.callbacks.append(lambda _e, op=p: done.__setitem__(op, fab.env.now - t_ns))
    for op, src, at in ((4, 5, 2.0), (5, 6, 5.0)):
        fab.env.run(until=t_ns + at)
        ev = fab.send(op, -1, dma[src], dma[0], 8192)
        ev.callbacks.append(lambda _e, op=op: done.__setitem__(op, fab.env.now - t_ns))
    fab.env.run()
    assert max(max(ln.shares()) for ln in fab.link_steps if ln.n) <= 1.0 + 1e-12
    assert sorted(done) == list(range(6))
    assert max(done.values()) == pytest.approx(93.1, abs=0.15)
