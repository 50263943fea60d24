"""capture/llama_layer.py: one Llama decoder layer, TP over SIPs, verified against numpy in
both fidelities; op_counts (the --dry-run) equals what capture records."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from kbtrace.cli import main
from kbtrace.topology import compile_topology

ROOT = Path(__file__).resolve().parents[1]
SETS = ["--set", "system.sips.count=2", "--set", "sip.cube_mesh_w=1", "--set",
        "sip.cube_mesh_h=1"]        # 2 SIPs (TP = 2) x 1 cube x 8 PEs


def _module():
    spec = importlib.util.spec_from_file_location("llama_layer", ROOT / "capture" / "llama_layer.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(("phase", "fidelity"), [("prefill", "fast"), ("prefill", "flit"),
                                                 ("decode", "fast")])
def test_llama_layer_verifies(phase, fidelity, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "llama_layer", "-p", f"phase={phase}", *SETS, "--fidelity", fidelity,
                 "--no-report"]) == 0
    out = capsys.readouterr().out
    assert "verify    PASS" in out
    trace = next((tmp_path / "data" / "traces").iterdir())
    counts = json.loads((trace / "trace.json").read_text())["op_counts"]
    topo = compile_topology(ROOT / "topologies" / "small.yaml",
                            overrides={"system.sips.count": 2, "sip.cube_mesh_w": 1,
                                       "sip.cube_mesh_h": 1})
    mod = _module()
    p = SimpleNamespace(**{**mod.PARAMS, "phase": phase})
    assert mod.op_counts(p, topo) == counts
    # TP = 2: two all-reduces per sequence, one send and one recv each per program
    assert counts["send"] == counts["recv"] == 2 * 16


def test_dry_run_full_size(capsys):
    assert main(["capture", "llama_layer", "-t", "default", "-p", "d_model=8192", "-p",
                 "heads=64", "-p", "kv_heads=8", "-p", "ffn=28672", "-p", "seq=2048",
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "70,912 ops (composite=1,024, dot=16,384, load=12,288, math=29,952" in out
    assert main(["capture", "gemm", "--dry-run"]) == 2
    assert "needs the workload to define op_counts" in capsys.readouterr().err
    assert main(["capture", "llama_layer", "-p", "heads=7", "--dry-run"]) == 2


@pytest.mark.slow
def test_llama_layer_default_is_stable(tmp_path):
    """Fast mode on default.yaml (TP over 2 SIPs, the credits crossing PCIe) does not jump when
    a parameter moves by a hair: with the PCIe switch overhead at 5.0, 5.000001 and 5.001 ns
    flit mode gives 11,881.1, 11,881.1 and 11,881.5 ns; fast mode gave 11,996.4, 19,147.3 and
    21,009.8 before a moved IPCQ credit stopped pushing other heads at further nodes
    (``heads.head_at``), 11,989.8, 11,998.0 and 11,987.1 after; 11,995.1, 11,997.7 and
    11,987.1 since a moved credit's reservation at a mesh router may be pushed; 11,966.1,
    11,977.5 and 11,980.8 since heads pushed at a node are served again in arrival order
    (``heads.serve_head``); 11,902.7, 11,896.5 and 11,883.3 since a credit that waits on a
    link is served first come, first served with the streams still arriving there
    (``heads._in_fifo``); 11,894.3, 11,877.8 and 11,875.4 since an HBM read reaches its first
    link as its bursts are ready (``fifo.burst_arrival``, ``pull.read_first``). With the mesh
    router overhead at 2.000002 ns: 11,883.5 (11,880.2 before it, 12,011.8 before that,
    12,010.1 before that; 14,068.0 with moved credits pushed at every node, also UCIe and PCIe
    nodes)."""
    from kbtrace.capture import capture
    from kbtrace.replay import ReplayOptions, replay
    got = []
    for i, (key, v) in enumerate((("system.pcie.switch_overhead_ns", 5.0),
                                  ("system.pcie.switch_overhead_ns", 5.000001),
                                  ("system.pcie.switch_overhead_ns", 5.001),
                                  ("cube.mesh.router_overhead_ns", 2.000002))):
        topo = compile_topology(ROOT / "topologies" / "default.yaml", {key: v})
        tr = capture(ROOT / "capture" / "llama_layer.py", topo, [], tmp_path / f"t{i}")
        run = replay(tr, topo, ReplayOptions(fidelity="fast", out_dir=str(tmp_path / f"r{i}")))
        got.append(run.makespan_ns)
    assert got == pytest.approx([11_894.3, 11_877.8, 11_875.4, 11_883.5], abs=0.1)
    assert max(abs(x / 11_881.1 - 1.0) for x in got) < 0.011    # flit mode, each within 1.1%
