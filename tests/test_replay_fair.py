"""Fast mode's fair share (``replay/fabric/fair.py``): streams that meet on a link are served
first come, first served together, the one booked first slowed and its completion moved.

The link arithmetic (``fifo.share_fifo``, ``booking.unbook``, ``fair.coarse``) with concrete
values, then the fabric: a read alone is booked as before; a second read on the same path
0.5 ns later interleaves with it, so both finish together where the first used to keep its
full rate (flit mode's interleaving). The scenario set (``test_replay_contention_set``) and
``test_replay_fast_contention`` compare whole replays with flit mode.
"""

from __future__ import annotations

import pytest

from kbtrace.replay.fabric.booking import Steps, steps_of, take_rate, unbook
from kbtrace.replay.fabric.fair import coarse
from kbtrace.replay.fabric.fifo import share_fifo
from kbtrace.replay.recorder import _COLS


def test_fifo_shares_in_proportion_to_arrival_after_the_backlog():
    """A arrived over [0, 10] at the full rate, 5 of it served alone by t = 5; B arrives over
    [5, 15]. From 5 on twice the link's rate arrives: each gets half, A's last work (arrived
    at 10) leaves at 15, then B alone at the full rate until 20."""
    ln = Steps()
    res = share_fifo(ln, 5.0, [[[(0.0, 10.0, 1.0)], 10.0, 5.0, 0.0],
                                   [[(5.0, 15.0, 1.0)], 10.0, 0.0, 1.0]])
    assert res == [([(5.0, 15.0, 0.5)], 15.0, -1.0),
                   ([(5.0, 15.0, 0.5), (15.0, 20.0, 1.0)], 20.0, 7.0)]
    assert (ln.times(), ln.shares()) == ([5.0, 15.0, 20.0], [1.0, 1.0, 0.0])     # booked: the link full


def test_a_backlog_is_served_with_what_the_link_spares():
    ln = Steps()      # twice the link's rate for 10 ns: it queues, the link full until 20
    assert share_fifo(ln, 0.0, [[[(0.0, 10.0, 2.0)], 20.0, 0.0, 0.0]]) == \
        [([(0.0, 20.0, 1.0)], 20.0, -1.0)]
    ln = steps_of([0.0, 10.0], [0.5, 0.0])     # half of it booked until 10: 5 served by then
    assert share_fifo(ln, 0.0, [[[(0.0, 10.0, 2.0)], 20.0, 0.0, 0.0]]) == \
        [([(0.0, 10.0, 0.5), (10.0, 25.0, 1.0)], 25.0, -1.0)]
    assert (ln.times(), ln.shares()) == ([0.0, 10.0, 25.0], [1.0, 1.0, 0.0])


def test_unbook_gives_back_the_rest_and_returns_what_was_served():
    ln = Steps()
    assert take_rate(ln, 0.0, 10.0, 10.0)
    assert unbook(ln, [(0.0, 10.0, 1.0)], 4.0) == 4.0
    assert (ln.times(), ln.shares()) == ([0.0, 4.0], [1.0, 0.0])


def test_coarse_keeps_span_and_work():
    pcs = [(float(i), i + 1.0, 0.5 + 0.1 * (i % 3)) for i in range(40)]
    c = coarse(pcs, 4)
    assert len(c) == 4
    assert c[0][0] == 0.0 and c[-1][1] == 40.0
    assert sum(r * (b - a) for a, b, r in c) == pytest.approx(sum(r * (b - a) for a, b, r in pcs))
    assert all(c[i][1] == c[i + 1][0] for i in range(3))
    assert coarse(pcs[:3], 4) == pcs[:3]


def _read(fab, op, mem, dma, at, got):
    fab.env.run(until=at)
    ev = fab.send(op, -1, mem, dma, 65536, span=(at, at))
    ev.callbacks.append(lambda e: got.__setitem__(op, (fab.env.now, e.value)))
    return ev


def test_a_flow_booked_first_is_slowed_and_its_completion_moved(tmp_path):
    from kbtrace.replay.fabric.fast import FastFabric
    from kbtrace.topology.model import PeCoord
    from test_replay_fast import _fabric, _small
    topo = _small()
    dma = topo.pe_node(PeCoord(0, 0, 2), "dma").idx
    mem = topo.hbm_ctrl(PeCoord(0, 0, 1)).idx
    fab, rec = _fabric(FastFabric, topo, tmp_path / "alone")
    got: dict = {}
    assert _read(fab, 0, mem, dma, 3.0, got).value == 281.0      # booked alone
    fab.env.run()
    assert got == {0: (281.0, 281.0)}
    fab, rec = _fabric(FastFabric, topo, tmp_path / "two")
    got = {}
    ev0 = _read(fab, 0, mem, dma, 3.0, got)
    assert ev0.value == 281.0
    _read(fab, 1, mem, dma, 3.5, got)         # the same path, 0.5 ns later
    fab.env.run()
    # interleaved: both finish after twice the time; the first, booked for 281.0, moved (the
    # second arrives at each link after the first as the link before serves it: 537.4074 and
    # 538.4205 when it was described as arriving at its own share of each link)
    assert got[0][0] == got[0][1] == pytest.approx(537.9189, abs=1e-3)
    assert got[1][0] == got[1][1] == pytest.approx(538.4189, abs=1e-3)
    rows = dict(zip(_COLS, rec._pending(), strict=True))
    assert len(rows["op"]) == 18                   # 8 links + the terminal row each
    leave = rows["leave"][rows["op"] == 0]
    assert leave.max() == pytest.approx(537.9189, abs=1e-3)   # its rows were rewritten


def _writes(cls, topo, tmp, starts):
    """16 KiB HBM writes into PE 0's slice from the PEs and at the times of ``starts``; per op
    its completion and the time its tail leaves the last link (into the controller)."""
    from kbtrace.topology.model import PeCoord
    from test_replay_fast import _fabric
    mem = topo.hbm_ctrl(PeCoord(0, 0, 0)).idx
    fab, rec = _fabric(cls, topo, tmp)
    done: dict = {}
    for op, (pe, at) in enumerate(starts):
        if at > fab.env.now:
            fab.env.run(until=at)
        dma = topo.pe_node(PeCoord(0, 0, pe), "dma").idx
        ev = fab.send(op, -1, dma, mem, 16384, span=(at, at))
        ev.callbacks.append(lambda e, op=op: done.__setitem__(op, e.value))
    fab.env.run()
    rows = dict(zip(_COLS, rec._pending(), strict=True))
    last = topo.links[int(rows["link"][(rows["op"] == 0) & (rows["link"] >= 0)][-1])]
    assert topo.nodes[last.dst].kind == "hbm_ctrl"
    tails = {op: float(rows["leave"][(rows["op"] == op) & (rows["link"] == last.idx)][0])
             for op in done}
    return done, tails


@pytest.mark.parametrize("core", ["pure", "default"])
@pytest.mark.parametrize("second, tails, done, near", [
    # both start together: PE 1's write, booked first, used to keep the last link at its full
    # rate (tail 70.2, done 81.25) while PE 2's queued behind it; flit mode interleaves them
    # (tails 124.25 / 137.25, done 133.25 / 149.25), and its bursts reach the controller as
    # the last link serves them (``heads.arrivals``)
    (3.0, (124.0308, 137.25), (134.4441, 150.4441), 1.5),
    # PE 2's write starts after PE 1's head reached the controller (its bursts committed
    # already): PE 1's completion still moves past its tail (flit: tails 107.25 / 137.25,
    # done 118.25 / 150.25)
    (20.0, (106.1943, 137.25), (114.1943, 145.3720), 5.0),
])
def test_hbm_writes_that_meet_on_a_link_share_it(tmp_path, core, second, tails, done,
                                                  near):
    from kbtrace.replay.fabric.core import status
    from kbtrace.replay.fabric.fast import FastFabric
    from kbtrace.replay.fabric.flit import FlitFabric
    from test_replay_fast import _small
    cls = FastFabric if core == "pure" else status()[0]
    topo = _small()
    alone, _ = _writes(cls, topo, tmp_path / "alone", [(1, 3.0)])
    assert alone == {0: 81.25}
    got, got_tails = _writes(cls, topo, tmp_path / "two", [(1, 3.0), (2, second)])
    assert [got_tails[0], got_tails[1]] == pytest.approx(list(tails), abs=1e-3)
    assert [got[0], got[1]] == pytest.approx(list(done), abs=1e-3)
    assert all(got[op] > got_tails[op] for op in got)     # never done before its last flit
    flit, flit_tails = _writes(FlitFabric, topo, tmp_path / "flit", [(1, 3.0), (2, second)])
    assert all(abs(got_tails[op] - flit_tails[op]) < 1.5 for op in got)    # the links: as flit
    assert all(abs(got[op] - flit[op]) < near for op in got)


@pytest.mark.parametrize("core", ["pure", "default"])
def test_a_completed_flow_is_freed_by_reference_counting(tmp_path, core):
    """A flow and the records of its per-link bookings (``fair.Booked``) refer to each other
    while it is under way; complete, it drops them and leaves its slot (the links' bookings
    and the nodes' reservations name it by slot, ``ledger``), so nothing holds it: no
    flow waits for the cyclic garbage collector (with a cycle left, every flow of a large
    replay lived until a collection, and those collections took a fifth of its time)."""
    import gc

    from kbtrace.replay.fabric.core import status
    from kbtrace.replay.fabric.fast import FastFabric
    from kbtrace.topology.model import PeCoord
    from test_replay_fast import _fabric, _small
    cls = FastFabric if core == "pure" else status()[0]
    topo = _small()
    dma = topo.pe_node(PeCoord(0, 0, 2), "dma").idx
    mem = topo.hbm_ctrl(PeCoord(0, 0, 1)).idx

    def flows() -> int:
        return sum(type(o).__name__ == "Flow" for o in gc.get_objects())

    gc.collect()
    gc.disable()
    try:
        fab, _rec = _fabric(cls, topo, tmp_path / core)
        got: dict = {}
        _read(fab, 0, mem, dma, 3.0, got)
        _read(fab, 1, mem, dma, 3.5, got)     # they meet: the first is moved
        fab.env.run()
        assert sorted(got) == [0, 1]
        tab = fab.flow_slots                # (owners by slot, beside the reservations)
        assert sum(tab.owner(iv, i, n) is not None for n, iv in enumerate(fab.node_iv)
                   for i in range(0, iv.n, 2)) == 14
        assert flows() == 1                   # (the last flow booked)
        fab._f = None
        assert fab.flow_slots.flows == [None, None] and flows() == 0
    finally:
        gc.enable()


def test_fifo_ends_when_what_waits_is_below_the_clock_resolution():
    """At t ~ 1e8 ns one ulp is ~1.5e-8 ns: a backlog of 2.5e-11 ns of work must still be
    served (in one tick), not loop (as fit_rate once did, issue 22)."""
    t0 = 1.0e8
    ln = steps_of([t0 - 10.0, t0 + 1e-6], [0.5, 0.0])
    (pcs, end, _h), = share_fifo(ln, t0, [[[(t0 - 10.0, t0, 1.0)], 10.0, 10.0 - 2.5e-11,
                                                0.0]])
    assert t0 <= end <= t0 + 1e-6
    assert sum(r * (b - a) for a, b, r in pcs) == pytest.approx(2.5e-11, abs=1e-7)
