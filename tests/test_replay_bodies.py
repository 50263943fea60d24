"""A stream's later flits held at a mesh router by heads that arrive there before them, where
its body is longer than its head's overhead (``replay.fabric.bodies``, fast mode): flit mode's
router serves one FIFO, so a head that arrives while a 2 KiB stream's flits are still coming
in holds the flits behind it for its 2 ns overhead. Each case: two transfers on small.yaml,
the second started ``at`` ns after the first; both modes end each at ``done`` (ns)."""

from __future__ import annotations

import pytest

from kbtrace.topology import compile_topology
from kbtrace.topology.model import PeCoord
from test_replay_fast_contention import _same_in_both_modes
from test_replay_util import TOPO_DIR


@pytest.mark.parametrize("first, second, at, done", [
    # a one-flit transfer (PE 2 -> PE 1) booked before a 2 KiB PE 4 -> PE 0 stream whose
    # flits reach a router after its head: the stream's tail waits (``bodies.body_hold``,
    # the free path handing that hop to ``routes.hop_seq``: ``routes.held``); was 26.7
    (("pe", 2, "pe", 1, 256), ("pe", 4, "pe", 0, 2048), 3.0, {0: 24.85, 1: 27.7}),
    # a 2 KiB PE 0 -> PE 3 stream booked first, an IPCQ credit (PE 4 -> PE 2) booked after it
    # whose head arrives at a router while the stream's flits are still coming in
    # (``bodies.hold_bodies``): the stream pushed 1 ns; was 30.0
    (("pe", 0, "pe", 3, 2048), ("pe", 4, "pe", 2, 16), 3.0, {0: 31.0, 1: 26.275}),
    # llama_layer's shape: 2 KiB from PE 0's HBM controller into PE 0 behind the head of a
    # one-flit store into that slice at the router after the controller; was 14.1
    (("pe", 1, "hbm", 0, 256), ("hbm", 0, "pe", 0, 2048), 3.0, {0: 17.1, 1: 15.1}),
])
def test_a_long_body_waits_behind_heads_that_arrived_before_its_flits(tmp_path, first, second,
                                                                      at, done):
    small = compile_topology(TOPO_DIR / "small.yaml")

    def node(kind, p):
        c = PeCoord(0, 0, p)
        return small.pe_node(c, "dma").idx if kind == "pe" else small.hbm_ctrl(c).idx

    (k0, a0, l0, b0, nb0), (k1, a1, l1, b1, nb1) = first, second
    _same_in_both_modes(tmp_path, small, [(node(k0, a0), node(l0, b0), nb0, 0.0),
                                          (node(k1, a1), node(l1, b1), nb1, at)], done)


def test_bodies_reads_the_ledgers_records_by_its_layout():
    """``bodies.hold_bodies`` reads ``ledger.Recs`` / ``Slots`` arrays by index with copies of
    ledger's constants (C values in its compiled twin): they must agree."""
    from kbtrace.replay.fabric import bodies, ledger
    assert (bodies.GONE, bodies.LIVE, bodies.REC, bodies.HOP) == (
        ledger.GONE, ledger.LIVE, ledger.REC, ledger.HOP) == (0, 1, 3, 5)
