"""kbtrace probe: cases on the real layout, lower-bound parts, invariants, exit codes, JSON."""

from __future__ import annotations

import json

import polars as pl
import pytest

from kbtrace.cli import main
from kbtrace.studies import probe as P
from kbtrace.topology import compile_topology
from kbtrace.topology.model import PeCoord


@pytest.fixture(scope="module")
def default_probe():
    return P.run_probe("topologies/default.yaml")


def test_cases_pick_cubes_that_add_hops_on_this_layout():
    topo = compile_topology("topologies/default.yaml")
    cases = {c.name: c for c in P.probe_cases(topo)}
    assert len(cases) == 14       # 4 H2D + 4 D2H + 5 PE DMA (ADR-0049) + cross-SIP
    # the IO chiplet sits on the W side: cubes 0, 4, 8, 12 are all shoreline cubes (1 hop),
    # so the hop cases walk east along row 0
    assert [cases[f"h2d-{h}hop"].dst for h in (1, 2, 3, 4)] == [PeCoord(0, c, 0)
                                                                 for c in (0, 1, 2, 3)]
    assert cases["pe-same-half-hbm"].dst == PeCoord(0, 0, 1)
    assert cases["pe-cross-half-hbm"].dst == PeCoord(0, 0, 7)
    assert cases["pe-cross-cube-hbm-best"].dst == PeCoord(0, 1, 0)
    assert cases["pe-cross-cube-hbm-worst"].dst == PeCoord(0, 15, 0)
    assert cases["pe-cross-sip-hbm"].dst == PeCoord(1, 0, 0)
    small = {c.name for c in P.probe_cases(compile_topology("topologies/small.yaml"))}
    # 2x2 cubes with the IO chiplet on the W side: cubes 0 and 2 are 1 hop, 1 and 3 are 2
    assert "pe-cross-sip-hbm" not in small and "h2d-2hop" in small and "h2d-3hop" not in small
    assert len(small) == 9


def test_local_case_is_its_lower_bound_parts(default_probe):
    r = default_probe.cases.filter(pl.col("case") == "pe-local-hbm").row(0, named=True)
    # 32 KiB over the 256 GB/s router -> hbm_ctrl link, a 256 B burst commit at 8 x 32 GB/s,
    # DMA 2 ns + router 2 ns + hbm 0 ns + the ack back through the router 2 ns, 0.2 mm of wire
    assert r["drain_ns"] == pytest.approx(128.0)
    assert r["commit_ns"] == pytest.approx(8.0)
    assert r["overhead_ns"] == pytest.approx(6.0)
    assert r["floor_ns"] == pytest.approx(142.2)
    assert r["actual_ns"] == pytest.approx(143.2)
    assert r["bottleneck"] == "sip0.cube0.r0c0 -> sip0.cube0.hbm_ctrl.pe0"
    assert r["efficiency"] == pytest.approx(142.2 / 143.2)
    assert r["eff_bw_gbps"] == pytest.approx(32768 / 143.2)


def test_every_case_is_at_or_above_its_floor(default_probe):
    c = default_probe.cases
    assert (c["actual_ns"] >= c["floor_ns"] - 1e-6).all()
    assert ((c["efficiency"] > 0.85) & (c["efficiency"] <= 1.0)).all()
    # host copies enter at the SIP's PCIe EP (the reference's injection point)
    assert set(c.filter(pl.col("category") == "h2d")["src"]) == {"sip0.io0.pcie_ep"}


def test_h2d_local_cube_matches_the_reference():
    """The predecessor measured 65.5 / 545 / 8,230 ns for 4 KiB / 64 KiB / 1 MiB written from
    the PCIe EP into the local cube (reference: commitlog §3, README calibration check)."""
    res = P.run_probe("topologies/default.yaml", "h2d-1hop", sweep=True,
                      sizes=(4096, 65536, 1048576))
    got = dict(zip(res.sweep["nbytes"], res.sweep["actual_ns"], strict=True))
    for n, ref in ((4096, 65.5), (65536, 545.0), (1048576, 8230.0)):
        assert got[n] == pytest.approx(ref, rel=0.01)


def test_default_invariants_pass(default_probe):
    inv = default_probe.invariants
    assert inv.height == 5 and inv["ok"].all() and default_probe.ok


def test_invariant_failures_are_detected():
    topo = compile_topology("topologies/default.yaml")
    cases = P.probe_cases(topo)
    actual = {c.name: 100.0 + i for i, c in enumerate(cases)}
    actual["h2d-3hop"] = 50.0                     # not monotone
    actual["pe-cross-sip-hbm"] = 1.0              # faster than local
    bad = {r["invariant"] for r in P._invariants(cases, actual) if not r["ok"]}
    assert bad == {"H2D increases with cube hops",
                   "PE DMA local <= cross-PE <= cross-cube <= cross-SIP (nearest of each)"}


def test_sweep_sizes_and_utilisation_grow(tmp_path):
    res = P.run_probe("topologies/small.yaml", "pe-local-hbm", sweep=True)
    sw = res.sweep
    assert sw["nbytes"].to_list() == list(P.SWEEP_SIZES)
    u = sw["util"].to_list()
    assert u == sorted(u) and u[0] < 0.6 < 0.99 < u[-1]
    assert res.invariants.height == 0 and res.ok        # one case: nothing to compare


def test_cli_probe_json_and_exit_codes(capsys, monkeypatch):
    assert main(["probe", "-t", "small", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and len(out["cases"]) == 9 and out["nbytes"] == 32768
    assert main(["probe", "-t", "small", "--case", "h2d-9hop"]) == 2
    assert "no such probe case" in capsys.readouterr().err
    assert main(["probe", "-t", "small", "--nbytes", "0"]) == 2
    assert "--nbytes 0" in capsys.readouterr().err
    real = P.run_probe

    def failing(*a, **k):
        res = real(*a, **k)
        res.invariants = res.invariants.with_columns(pl.lit(False).alias("ok"))
        return res
    monkeypatch.setattr(P, "run_probe", failing)
    assert main(["probe", "-t", "small"]) == 1
    out = capsys.readouterr().out
    assert "[x] FAIL H2D increases with cube hops" in out and "[v]" not in out
