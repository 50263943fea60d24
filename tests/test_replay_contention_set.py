"""The contention scenario set (``contention_set``) replayed in both modes: fast against flit.

Each scenario's makespan error and per-op error distribution are held to what fast mode
achieves (README, Fidelity); the bounds are the measured figures rounded up, so a change that
makes fast mode worse under contention fails here. ``small.yaml`` runs by default; the same
set on ``default.yaml`` (which adds the cross-SIP PCIe readers) is ``slow``.
"""

from __future__ import annotations

import pytest

from contention_set import SCENARIOS, compare, scenario
from kbtrace.topology import compile_topology
from test_replay_util import TOPO_DIR

#: scenario -> (makespan error, per-op error p95) fast mode stays within, per topology
BOUNDS = {
    "small": {"one_to_many": (1e-6, 1e-6), "many_to_one": (0.012, 0.61),
              "cross_mesh": (0.001, 0.002), "ucie_readers_2": (1e-9, 1e-9),
              "ucie_readers_4": (0.001, 0.007), "ucie_crossing": (0.012, 0.051),
              "mixed_sizes": (0.007, 0.10), "far_readers_4": (0.006, 0.016),
              "readers_writers": (0.001, 0.27)},
}
BOUNDS["default"] = {**BOUNDS["small"], "far_readers_4": (1e-4, 0.03)}


@pytest.fixture(scope="module", params=["small", pytest.param("default", marks=pytest.mark.slow)])
def topo(request):
    return request.param, compile_topology(TOPO_DIR / f"{request.param}.yaml")


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_contention_scenario_fast_vs_flit(topo, name, tmp_path):
    tn, t = topo
    e = compare(scenario(name, t), t, tmp_path)
    mk, p95 = BOUNDS[tn][name]
    assert e.makespan_err <= mk, (tn, name, e)
    assert e.op_p95 <= p95, (tn, name, e)
    assert e.op_median <= e.op_p95 <= e.op_max
