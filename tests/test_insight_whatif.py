"""kbtrace whatif: a recorded run re-timed with changed parameters on its dependency graph,
checked against full fast replays of the same change; order flips are flagged."""

from __future__ import annotations

import pytest

from kbtrace.capture import capture
from kbtrace.cli import main
from kbtrace.errors import UsageError
from kbtrace.insight import Retimer, whatif
from kbtrace.insight.base import load_base
from kbtrace.replay import ReplayOptions, replay
from kbtrace.topology import compile_topology
from test_replay_util import TOPO_DIR

ROOT = TOPO_DIR.parent
SMALL = str(TOPO_DIR / "small.yaml")


def _run(base, workload, params, name):
    topo = compile_topology(SMALL)
    tr = base / f"tr-{name}"
    capture(ROOT / "capture" / f"{workload}.py", topo, params, tr)
    return replay(tr, topo, ReplayOptions(out_dir=str(base / name))).run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("whatif")
    return {"ar": _run(base, "ring_allreduce", {}, "ar"),
            "memgemm": _run(base, "gemm", {"cubes": 1}, "memgemm"),
            "comp": _run(base, "gemm_composite", {"M": 64}, "comp")}


def _exact(run, changes):
    return whatif(run, changes, exact=True).makespan_ns


def test_unchanged_parameters_reproduce_the_recorded_run(runs):
    for name in ("ar", "memgemm"):
        w = whatif(runs[name], {"cube.hbm.pc_bw_gbps": 32.0})
        assert w.makespan_ns == pytest.approx(w.base_makespan_ns, abs=0.01)
        assert w.order_stable and w.flips == 0 and w.error_bound_ns == 0.0


@pytest.mark.parametrize("bw", [48.0, 16.0])
def test_stable_order_estimate_matches_a_replay(runs, bw):
    w = whatif(runs["ar"], {"cube.hbm.pc_bw_gbps": bw})
    x = _exact(runs["ar"], {"cube.hbm.pc_bw_gbps": bw})
    print(f"\nring all-reduce, hbm {bw}: estimate {w.makespan_ns:.1f} replay {x:.1f}")
    assert w.order_stable
    assert abs(w.makespan_ns - x) / x <= 0.05
    assert w.makespan_ns == pytest.approx(1031.8 if bw == 48 else 1202.4, abs=0.1)


def test_flipped_order_is_flagged_with_a_bound(runs):
    w = whatif(runs["memgemm"], {"cube.hbm.pc_bw_gbps": 16.0})
    x = _exact(runs["memgemm"], {"cube.hbm.pc_bw_gbps": 16.0})
    print(f"\nmemory-bound gemm, hbm 16: estimate {w.makespan_ns:.1f} replay {x:.1f}; {w.text()}")
    assert not w.order_stable and w.flips > 0
    assert w.hot[0][0] == "sip0.cube0.hbm_ctrl.pe0"
    assert abs(w.makespan_ns - x) <= w.error_bound_ns
    assert "order could flip" in w.text() and "--exact replays" in w.text()


def test_exact_replays_and_retimer_is_reusable(runs):
    x = whatif(runs["memgemm"], {"pe.dma.overhead_ns": 4.0}, exact=True)
    assert x.exact and "replayed (--exact)" in x.text()
    topo = compile_topology(SMALL, overrides={"pe.dma.overhead_ns": 4.0})
    r = replay(load_base(runs["memgemm"]).trace_dir, topo,
               ReplayOptions(out_dir=str(runs["memgemm"].parent / "dma4")))
    assert x.makespan_ns == r.makespan_ns
    rt = Retimer(load_base(runs["memgemm"]))
    a = whatif(runs["memgemm"], {"pe.dma.overhead_ns": 4.0}, retimer=rt)
    b = whatif(runs["memgemm"], {"pe.dma.overhead_ns": 4.0}, retimer=rt)
    assert a.makespan_ns == b.makespan_ns       # deterministic, and the Retimer is reusable
    assert abs(a.makespan_ns - r.makespan_ns) / r.makespan_ns <= 0.05


def test_refusals_point_at_exact(runs, capsys):
    with pytest.raises(UsageError, match="pe.gemm.mac_rows: the re-timing cannot price"):
        whatif(runs["ar"], {"pe.gemm.mac_rows": 64})
    with pytest.raises(UsageError, match="composite op"):
        whatif(runs["comp"], {"pe.gemm.clock_ghz": 2.0})
    with pytest.raises(UsageError, match="nothing to change"):
        whatif(runs["ar"], {})
    assert main(["whatif", str(runs["ar"]), "--set", "pe.ipcq.n_slots=8"]) == 2
    assert "add --exact" in capsys.readouterr().err


def test_cli(runs, capsys):
    assert main(["whatif", str(runs["ar"]), "--set", "cube.hbm.pc_bw_gbps=48"]) == 0
    out = capsys.readouterr().out
    assert "makespan 1,074.4 -> 1,031.8 ns (-3.97%)" in out
    assert "recorded service order holds" in out


def test_later_launches_follow_the_earlier_ones(tmp_path):
    """A run of several launches (tp_mlp: three launches and host copies): a launch starts
    when the previous one completes on the new timeline, so a faster GEMM moves them all."""
    run = _run(tmp_path, "tp_mlp", {}, "tp")
    w = whatif(run, {"pe.gemm.clock_ghz": 1.5})
    x = _exact(run, {"pe.gemm.clock_ghz": 1.5})
    print(f"\ntp_mlp, GEMM 1.5 GHz: estimate {w.makespan_ns:.1f} replay {x:.1f}")
    assert x < 0.85 * w.base_makespan_ns            # the replay gains 17%
    assert abs(w.makespan_ns - x) / x <= 0.05
    same = whatif(run, {"pe.gemm.clock_ghz": 1.0})
    assert same.makespan_ns == pytest.approx(same.base_makespan_ns, abs=0.01)
