"""Property tests: routes are connected, deterministic, > 0 ns and use only existing links."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbtrace.topology import compile_topology

TOPO = Path(__file__).resolve().parents[1] / "topologies"
SMALL = compile_topology(TOPO / "small.yaml", use_cache=False)
TWO_SIP = compile_topology(TOPO / "small.yaml", overrides={"system.sips.count": 2}, use_cache=False)


def _check(topo, s, d):
    r = topo.route(s, d)
    assert r.nodes[0] == s and r.nodes[-1] == d
    assert len(r.links) == len(r.nodes) - 1
    for i, li in enumerate(r.links):
        ln = topo.links[li]
        assert (ln.src, ln.dst) == (r.nodes[i], r.nodes[i + 1])
    assert len(set(r.nodes)) == len(r.nodes)                 # no loops
    assert r.lower_bound_ns(0) > 0                           # ADR-0002 D4
    if r.bottleneck_gbps > 0:                                # payload-carrying route
        assert r.lower_bound_ns(1 << 20) > r.lower_bound_ns(4096)
    else:                                                    # command-only (e.g. pe_cpu -> scheduler)
        assert all(topo.links[i].bw_gbps == 0 for i in r.links)
    assert r.overhead_ns == pytest.approx(sum(topo.nodes[n].overhead_ns for n in r.nodes[1:]))
    return r


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_routes_small(data):
    n = len(SMALL.nodes)
    s = data.draw(st.integers(0, n - 1))
    d = data.draw(st.integers(0, n - 1).filter(lambda x: x != s))
    _check(SMALL, s, d)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_routes_two_sips(data):
    n = len(TWO_SIP.nodes)
    s = data.draw(st.integers(0, n - 1))
    d = data.draw(st.integers(0, n - 1).filter(lambda x: x != s))
    _check(TWO_SIP, s, d)


def test_routes_deterministic_across_compiles():
    other = compile_topology(TOPO / "small.yaml", use_cache=False)
    pairs = [(a, b) for a in range(0, len(SMALL.nodes), 37) for b in range(5, len(SMALL.nodes), 41) if a != b]
    assert [SMALL.route(a, b) for a, b in pairs] == [other.route(a, b) for a, b in pairs]


@pytest.mark.parametrize("side", ["N", "S", "E", "W"])
def test_io_chiplet_sides(side):
    t = compile_topology(TOPO / "small.yaml", overrides={"sip.io_chiplets": f"[{{side: {side}}}]"},
                         use_cache=False)
    for c in range(4):
        r = t.route("host", f"sip0.cube{c}.hbm_ctrl.pe3")
        assert [t.nodes[n].kind for n in r.nodes].count("io_ucie") == 1
        assert r.lower_bound_ns(0) > 0
