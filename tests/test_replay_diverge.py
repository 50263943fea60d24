"""``kbtrace.replay.diverge`` (where fast mode parts from flit mode) and
``benchmarks/bench_diverge.py``, on the ``ucie_crossing`` scenario of the contention set on
small.yaml: PEs 0-3 of cube 0 read from cube 1 while PEs 0-3 of cube 1 read from cube 0."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from contention_set import scenario
from kbtrace.replay import ReplayOptions, replay
from kbtrace.replay.diverge import (
    first_divergence,
    head_delays,
    link_class,
    op_errors,
    over_by_seq,
)
from kbtrace.topology import compile_topology

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    topo = compile_topology(ROOT / "topologies" / "small.yaml")
    tr = scenario("ucie_crossing", topo)
    d = tmp_path_factory.mktemp("diverge")
    return tuple(replay(tr, topo, ReplayOptions(fidelity=f, out_dir=str(d / f)))
                 for f in ("fast", "flit"))


def test_link_class_drops_the_sip_and_cube() -> None:
    assert link_class("sip0.cube3.r0c0", "sip0.cube3.ucie_w.conn0") == "r0c0->ucie_w.conn0"
    assert link_class("sip1.io0.pcie_ep", "fabric.switch0") == "io0.pcie_ep->fabric.switch0"


def test_op_errors_and_the_ops_over_the_threshold(runs: tuple) -> None:
    fast, flit = runs
    e = op_errors(fast, flit)
    assert len(e) == 16
    assert e[8] == pytest.approx(0.0790, abs=1e-4)       # the one op over 5%
    assert int((e > 0.05).sum()) == 1
    assert over_by_seq(fast, flit, 0.05) == {(0, "load"): 1}
    assert over_by_seq(fast, flit, 0.03) == {(0, "load"): 3}
    assert over_by_seq(flit, flit) == {}


def test_head_delays_name_the_ucie_links_where_fast_heads_pass_first(runs: tuple) -> None:
    fast, flit = runs
    d = head_delays(fast, flit, list(range(16)))
    assert d[0].link == "ucie_w->ucie_w.conn1"
    assert d[0].n == 2
    # (10.05 and -6.7 while a moved head's rows kept their booked enter times: the head now
    # enters the UCIe node later, the connector link's booking still as booked, fabric/enters.py)
    assert d[0].a_ns == pytest.approx(4.550329, abs=1e-6)
    assert d[0].ref_ns == pytest.approx(16.75)
    assert d[0].diff_mean_ns == pytest.approx(-12.199671, abs=1e-6)
    assert d[1].link == "ucie_e->ucie_e.conn2"
    assert [x.link for x in head_delays(flit, flit, list(range(16)))] == []
    assert head_delays(fast, flit, []) == []


def test_first_divergence_of_an_op(runs: tuple) -> None:
    fast, flit = runs
    hop, where, what, a, ref = first_divergence(fast, flit, 8)
    assert (hop, where, what) == (13, "ucie_e->ucie_w", "tail")
    assert (a, ref) == (pytest.approx(435.85), pytest.approx(436.25))
    # op 1's latency is exact (its error 0), but it was issued 14 ns early: its first row
    hop, where, what, a, ref = first_divergence(fast, flit, 1)
    assert (hop, where, what) == (0, "sip0.cube0.pe0.pe_cpu", "head")
    assert (a, ref) == (pytest.approx(447.0), pytest.approx(461.0))
    assert first_divergence(flit, flit, 8) is None


def test_bench_diverge_reports_on_two_runs(runs: tuple, capsys: pytest.CaptureFixture) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_diverge
    fast, flit = runs
    assert bench_diverge.main(["--runs", str(fast.run_dir), str(flit.run_dir),
                               "--first", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("makespan 1,161.6 against 1,174.6 ns (1.10%); per op p95 5.01%, "
                          "1 of 16 ops over 5%")
    assert out[1] == "ops over the threshold per (seq, kind): 0/load 1"
    assert out[2] == "heads of 1 ops, link by link (a - ref, ns):"
    assert out[-1].startswith("  op 8 (seq 0, load) 7.90%: first apart at hop 13 ucie_e->ucie_w "
                              "(tail): 435.85 vs 436.25 ns")
