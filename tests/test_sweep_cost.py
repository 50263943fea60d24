"""A sweep point's predicted cost (``replay/_sweepcost``, issue 22, target 7): the contention
factor of concrete topology parameters, the order a first run hands points out in, and
outputs that do not depend on that order or on -j."""

from __future__ import annotations

import pytest

from kbtrace.replay import _sweepcost, _sweepsafe
from kbtrace.replay._sweepcost import contention, cost
from kbtrace.replay.sweep import run_sweep
from test_replay_util import TOPO_DIR
from test_sweep_parallel import files

ROOT = TOPO_DIR.parent
SMALL = str(TOPO_DIR / "small.yaml")
BW = "cube.hbm.pc_bw_gbps"
GEMM = str(ROOT / "capture" / "gemm.py")


def factor(**over):
    return contention(_sweepcost._params(SMALL, over))


@pytest.mark.parametrize(("over", "want"), [
    ({BW: 8}, 0.625),           # slice 64 GB/s, links 256: 0.5 + 0.5 * 64 / 256
    ({BW: 16}, 0.75),
    ({}, 1.0),                  # the default: slice 8 x 32 = 256 GB/s = every link
    ({BW: 48}, 1.5),            # 384 GB/s into the 256 GB/s controller link
    ({BW: 64}, 2.0),
    ({BW: 96}, 2.0),            # capped
    ({"cube.hbm.router_bw_gbps": 128}, 2.0),
    ({"cube.hbm.router_bw_gbps": 512}, 1.0),
    ({"cube.mesh.link_bw_gbps": 64}, 1.25),     # they meet past the controller
    ({"cube.pes.bw_gbps": 128}, 1.25),
    ({"cube.mesh.link_bw_gbps": 512}, 1.0),     # the PE link (256) is the narrower
    ({BW: 64, "cube.mesh.link_bw_gbps": 64}, 2.0),
    ({"cube.hbm.pcs_per_pe": 4}, 0.75),
    ({"cube.hbm.efficiency": 0.5}, 0.75),       # slice and exit both halved
    ({BW: -1}, 0.0),            # does not compile: the point fails at once, last
])
def test_contention_factor(over, want):
    assert factor(**over) == pytest.approx(want)


def test_params_cached_per_value_read(monkeypatch):
    """Grid keys the factor does not read share one parameter build per topology."""
    monkeypatch.setattr(_sweepcost, "_PARAMS", {})
    for v in (1.0, 2.0, 3.0):
        factor(**{"cube.mesh.router_overhead_ns": 2.0, "cube.pes.distance_mm": v})
    assert len(_sweepcost._PARAMS) == 4 - 1     # pes.distance_mm is read (cube.pes.*)
    for v in (1.0, 2.0, 3.0):
        factor(**{"cube.sram.overhead_ns": v})
    assert len(_sweepcost._PARAMS) == 4         # one more, for all three


def test_cost_is_ops_times_factor(tmp_path):
    from kbtrace.capture import capture
    capture(GEMM, SMALL, {"M": 64, "N": 64, "K": 64}, tmp_path / "t")       # 20 ops
    job = {"trace_dir": str(tmp_path / "t"), "topology": SMALL, "fidelity": "fast",
           "params": {BW: 64}}
    assert cost(job) == 20 * 2.0
    assert cost({**job, "fidelity": "fast-fcfs", "params": {BW: 16}}) == 20 * 0.75
    assert cost({**job, "fidelity": "flit"}) == 20 * _sweepsafe.FLIT_OP_COST   # factor 1
    assert cost({**job, "params": {BW: -1}}) == 0.0
    assert cost({**job, "trace_dir": str(tmp_path / "none")}) == 0.0    # not captured yet


def _go_parallel(monkeypatch):
    """Workers whatever the work and the load; every job to a worker, recorded."""
    submitted: list[int] = []
    submit = _sweepsafe.Pool.submit
    monkeypatch.setattr(_sweepsafe.Pool, "submit", lambda self, fn, *a: submitted.append(
        a[0]["point"] if fn.__name__ == "run_point" else -1) or submit(self, fn, *a))
    monkeypatch.setattr(_sweepsafe, "MIN_PARALLEL_OPS", 0)
    monkeypatch.setattr(_sweepsafe, "MIN_PARALLEL_OPS_FORK", 0)
    monkeypatch.setattr(_sweepsafe, "free_cores", lambda: 2)
    monkeypatch.setattr(_sweepsafe.Pool, "LOCAL", False)
    return submitted


def test_first_run_hands_points_out_by_predicted_cost(tmp_path, monkeypatch):
    """A first run (no point.json) hands points out largest predicted first: the point
    whose HBM slice outruns its controller link before the others, the slowest slice last,
    two traces by their ops times the factor; -j 1 records that order too; the files are
    the same at -j 1 and -j 2, whatever the order."""
    from kbtrace.capture import capture
    capture(GEMM, SMALL, {"M": 64, "N": 64, "K": 64}, tmp_path / "a")        # 20 ops
    capture(GEMM, SMALL, {"M": 64, "N": 64, "K": 128}, tmp_path / "b")       # 32 ops
    cfg = {"traces": [str(tmp_path / "a"), str(tmp_path / "b")], "topologies": [SMALL],
           "grid": {BW: [8, 32, 64], "cube.mesh.link_bw_gbps": [128, 256]}}
    # factor per (pc_bw, link_bw): (8, 128) 0.75, (8, 256) 0.625, (32, 128) 1.25,
    # (32, 256) 1, (64, *) 2; points 0-5 trace a (20 ops), 6-11 b (32 ops): costs 15 12.5
    # 25 20 40 40 | 24 20 40 32 64 64, largest first (ties in config order)
    want = [10, 11, 4, 5, 8, 9, 2, 6, 3, 7, 0, 1]
    submitted = _go_parallel(monkeypatch)
    par = run_sweep(cfg, tmp_path / "j2", jobs=2)
    assert [p for p in submitted if p >= 0] == want
    assert [j.index for j in par.cpu.jobs] == want
    monkeypatch.undo()
    monkeypatch.setattr(_sweepsafe, "MIN_PARALLEL_OPS_FORK", 0)
    monkeypatch.setattr(_sweepsafe, "MIN_PARALLEL_OPS", 0)
    one = run_sweep(cfg, tmp_path / "j1", jobs=1)
    assert [j.index for j in one.cpu.jobs] == want      # the order -j 2 would take
    assert files(tmp_path / "j1") == files(tmp_path / "j2")
    assert one.points.equals(par.points)


def test_small_sweep_asks_for_no_prediction(tmp_path, monkeypatch):
    """Below the work that starts workers, -j 1 and -j 2 order points by ops and build no
    topology parameters for them."""
    from kbtrace.capture import capture
    capture(GEMM, SMALL, {"M": 64, "N": 64, "K": 64}, tmp_path / "t")
    monkeypatch.setattr(_sweepcost, "_PARAMS", {})
    cfg = {"traces": [str(tmp_path / "t")], "topologies": [SMALL], "grid": {BW: [8, 64]}}
    for jobs in (1, 2):
        res = run_sweep(cfg, tmp_path / f"s{jobs}", jobs=jobs)
        assert [j.index for j in res.cpu.jobs] == [0, 1]
    assert _sweepcost._PARAMS == {}
