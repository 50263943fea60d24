"""Fast mode's hop rows of a flow whose head moved (``heads``): they carry its true enter
times, not the ones booked when it started.

A flow's head that a node serves later than booked (``heads.serve_head``: a head arriving
there before it goes first) reaches every further node later (``fair._push`` ->
``heads.head_at``). Its rows' leave times moved with it; their enter times kept the booked
ones (issue 25, helper 111: 148 of 156 "tail late" ops of all_gather were such rows), so a
row could say a head entered a node before it had left the link into it.
"""

from __future__ import annotations

import pytest

from kbtrace.replay.fabric.core import fast_fabric
from kbtrace.replay.fabric.flit import FlitFabric
from kbtrace.topology import compile_topology
from test_replay_fast import _fabric
from test_replay_util import TOPO_DIR


def _rows(tmp_path, cls, topo, sends):
    """The hop rows (node, link, t_enter, t_leave) of each op, in the order recorded, of
    ``sends`` (src node, dst node, bytes, start ns) on a fresh fabric ``cls``."""
    fab, rec = _fabric(cls, topo, tmp_path / cls.fidelity)
    got: dict = {}

    def keep(rw):
        got.setdefault(rw[0], []).append((rw[3], rw[4], rw[5], rw[6]))

    rows, hop = rec.rows, rec.hop
    rec.rows = lambda rs: ([keep(r) for r in rs], rows(rs))
    rec.hop = lambda *a: (keep(a), hop(*a))
    rec.transfer = None         # (a compact record: not here, each test's flows move)
    for op, (src, dst, nb, t) in enumerate(sends):
        if t > fab.env.now:
            fab.env.run(until=t)
        fab.send(op, -1, src, dst, nb)
    fab.env.run()
    return got


@pytest.mark.parametrize("at", [8.5, 9.0])
def test_a_pushed_credits_rows_enter_as_its_head_arrives(tmp_path, at):
    """An IPCQ credit (16 B, PE 0 -> PE 7 of cube 0, sent at 0) is pushed at a mesh router
    (router 20, node overhead 2 ns) by a 512 B payload (PE 2 -> PE 3, sent ``at`` ns later)
    whose head arrives there first. Its head then reaches routers 26, 30, 34, 40, 46 and PE 7
    later than booked: its rows there enter as it arrives, as in flit mode (at 8.5: 13.7625,
    16.9125, 19.125, 21.3375, 23.55 and 25.6625 at PE 7). Before, they kept the booked
    times (13.3875, 15.6, ... 24.35), each before the tail had left the link into the node;
    the leave times and the op's completion were already right."""
    from kbtrace.topology.model import PeCoord
    small = compile_topology(TOPO_DIR / "small.yaml")
    dma = [small.pe_node(PeCoord(0, 0, p), "dma").idx for p in range(8)]
    sends = [(dma[0], dma[7], 16, 0.0), (dma[2], dma[3], 512, at)]
    flit = _rows(tmp_path, FlitFabric, small, sends)
    fast = _rows(tmp_path, fast_fabric(), small, sends)
    credit = fast[0]
    assert [r[:2] for r in credit] == [r[:2] for r in flit[0]]
    assert [x for r in credit for x in r[2:]] == pytest.approx(
        [x for r in flit[0] for x in r[2:]], abs=1e-9)
    if at == 8.5:
        assert [r[2] for r in credit[7:]] == pytest.approx(
            [13.7625, 16.9125, 19.125, 21.3375, 23.55, 25.6625], abs=1e-9)
    for a, b in zip(credit, credit[1:], strict=False):      # each entered as the one before left
        assert b[2] == pytest.approx(a[3], abs=1e-9)


def test_a_row_enters_no_later_than_its_link_booking_nor_the_row_after_it():
    """``enters.enter_rows`` on three rows (op, tile, stage, node, link, enter, leave, busy,
    queue, bytes) of a flow whose head moved: row 0's head now arrives at 4.0 (uncapped),
    row 1's at 9.0 but its stream's link booking kept its start at 7.5 (queue 0.5: it enters
    at 7.0, not 9.0), the terminal row's at 12.0. Row 0 then enters no later than row 1 (4.0
    stands); a single flit's row takes its booking from ``Flow.sl`` (row 2: relinked from
    11.0, so 12.0 is capped at 11.0)."""
    from types import SimpleNamespace

    from kbtrace.replay.fabric.enters import INF, enter_rows, entered
    rows = [(1, -1, 9, 5, 0, 1.0, 8.0, 2.0, 0.0, 64),
            (1, -1, 9, 6, 1, 3.0, 12.0, 2.0, 0.5, 64),
            (1, -1, 9, 7, 2, 5.0, 14.0, 2.0, 0.0, 64)]
    f = SimpleNamespace(hn=None, sl={2: [(11.0, 12.0, 1.0)]})
    entered(f, 0, 4.0, INF)
    entered(f, 1, 9.0, 7.5)
    entered(f, 1, 8.0, 7.5)             # (an earlier arrival noted later: the latest stands)
    entered(f, 2, 12.0, INF)
    assert f.hn == {0: (4.0, INF), 1: (9.0, 7.5), 2: (12.0, INF)}
    enter_rows(f, rows)
    assert [r[5] for r in rows] == [4.0, 7.0, 11.0]
    assert [r[8] for r in rows] == [0.0, 0.5, 0.0]
    assert f.hn is None
    rows2 = [(1, -1, 9, 5, 0, 1.0, 8.0, 2.0, 0.0, 64), (1, -1, 9, 6, 1, 3.0, 12.0, 2.0, 0.0, 64)]
    f2 = SimpleNamespace(hn=None, sl=None)
    entered(f2, 0, 6.0, INF)            # row 1 stays at 3.0 (booking at 3.0): row 0 too
    entered(f2, 1, 9.0, 3.0)
    enter_rows(f2, rows2)
    assert [r[5] for r in rows2] == [3.0, 3.0]
