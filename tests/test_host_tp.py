"""Tensor parallelism (ADR-0027): capture/tp_mlp.py verified in every float dtype, on 2 and 4
SIPs, fast against flit; TP groups and region primitives; bad input."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kbtrace.analysis import verify
from kbtrace.capture import capture
from kbtrace.errors import CaptureError
from kbtrace.host import DPPolicy, tp
from kbtrace.replay import ReplayOptions, replay
from kbtrace.topology import compile_topology

ROOT = Path(__file__).resolve().parents[1]
TP_MLP = ROOT / "capture" / "tp_mlp.py"


@pytest.fixture(scope="module")
def default():
    return compile_topology(ROOT / "topologies" / "default.yaml")


@pytest.fixture(scope="module")
def four_sips():
    return compile_topology(ROOT / "topologies" / "default.yaml",
                            overrides={"system.sips.count": "4"})


def run_tp_mlp(topo, tmp_path, fidelities=("fast",), **params):
    tr = capture(TP_MLP, topo, params=params, out_dir=tmp_path / "trace")
    runs = {f: replay(tr, topo, ReplayOptions(fidelity=f, out_dir=str(tmp_path / f)))
            for f in fidelities}
    return tr, runs


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_tp_mlp_verifies_on_default(default, tmp_path, dtype):
    tr, runs = run_tp_mlp(default, tmp_path, dtype=dtype)
    assert tr.meta["reference_check"]["y"]["ok"]
    res = verify(runs["fast"].run_dir)
    assert res.ok, res.text()
    ops = tr.ops().to_pylist()
    kinds = Counter((o["launch"], o["kind"]) for o in ops)
    # 2 ranks x 8 PEs: fc1 GEMM (4 K tiles), fc2 GEMM (8 input shards) into each rank's f32
    # partial, the collectives' all-reduce (LRAB inter-SIP phase: one exchange per SIP), the
    # cast of each PE's columns
    cast = 16 if dtype != "f32" else 0
    assert kinds == {(-1, "h2d"): 2, (0, "fill"): 16, (0, "load"): 128, (0, "dot"): 64,
                     (0, "store"): 16, (1, "fill"): 16, (1, "load"): 256, (1, "dot"): 128,
                     (1, "store"): 16, (2, "load"): 2, (2, "send"): 2, (2, "recv"): 2,
                     (2, "math"): 2, (2, "store"): 2, (3, "load"): 16, (3, "store"): 16,
                     (-1, "d2h"): 8} | ({(0, "math"): cast, (3, "math"): cast} if cast else {})
    # the input goes to both SIPs, the result comes back from rank 0's 8 PEs
    assert sorted(o["sip"] for o in ops if o["kind"] == "h2d") == [0, 1]
    assert {(o["sip"], o["cube"]) for o in ops if o["kind"] == "d2h"} == {(0, 0)}
    sends = [o for o in ops if o["kind"] == "send"]
    assert all(o["peer_sip"] != o["sip"] and o["direction"].startswith("global_")
               for o in sends)


def test_tp_mlp_on_four_sips_fast_within_2pct_of_flit(four_sips, tmp_path):
    tr, runs = run_tp_mlp(four_sips, tmp_path, fidelities=("fast", "flit"), tp=4)
    for run in runs.values():
        res = verify(run.run_dir)
        assert res.ok, res.text()
    fast, flit = runs["fast"].makespan_ns, runs["flit"].makespan_ns
    assert abs(fast / flit - 1) < 0.02, (fast, flit)
    assert {o["sip"] for o in tr.ops().to_pylist()} == {0, 1, 2, 3}


def test_tp_mlp_on_a_sub_group_rings_the_partials(four_sips, tmp_path):
    """tp=2 of 4 SIPs: the collectives reduce over every SIP, so the layer rings its group."""
    tr, runs = run_tp_mlp(four_sips, tmp_path, tp=2)
    assert tr.meta["reference_check"]["y"]["ok"]
    assert verify(runs["fast"].run_dir).ok
    ops = tr.ops().to_pylist()
    assert {o["sip"] for o in ops} == {0, 1}
    assert sum(o["kind"] == "send" for o in ops) == 32       # 2 ranks x 8 PEs x (1 + 1) steps


def test_tp_mlp_tp_larger_than_the_sips_is_one_error(default, tmp_path):
    with pytest.raises(CaptureError, match=r"tensor-parallel size 4 must be between 1 and the 2 "
                                           r"SIP\(s\).*--set system.sips.count=N"):
        capture(TP_MLP, default, params={"tp": 4}, out_dir=tmp_path / "t")
    assert not (tmp_path / "t").exists()


def wl(build):
    return SimpleNamespace(NAME="t", PARAMS={}, build=build)


@pytest.fixture(scope="module")
def small2():
    return compile_topology(ROOT / "topologies" / "small.yaml",
                            overrides={"system.sips.count": "2"})


def test_groups_layers_and_primitives(small2, tmp_path):
    """Column then row parallel on 2 SIPs x 2 cubes, plus scatter_to_tp_region: every value
    against numpy (RowParallel = the concatenated matmul, ADR-0027 T2)."""
    rng = np.random.default_rng(5)
    w1 = rng.integers(-2, 3, (64, 128)).astype(np.float32)
    w2 = rng.integers(-2, 3, (128, 64)).astype(np.float32)
    xv = rng.integers(-2, 3, (2, 64)).astype(np.float32)

    def build(w, p):
        g = tp.initialize_model_parallel(w)
        assert g.ranks == (0, 1) and g.size == 2 and g.rank(1) == 1
        fc1 = tp.ColumnParallelLinear(w, g, 64, 128, "f32", w1, name="fc1", cubes=2, BK=32)
        fc2 = tp.RowParallelLinear(w, g, 128, 64, "f32", w2, name="fc2", cubes=2)
        x = tp.rank_tensor(w, g, "x", (2, 64), "f32", DPPolicy(num_cubes=2, num_pes=1),
                           init=lambda i: xv)
        assert tp.copy_to_tp_region(x) is x
        h = fc1(x)
        y = fc2(h)
        s = tp.scatter_to_tp_region(w, x, "xs", cubes=2)
        for r in g.ranks:
            w.output(h[r], reference=lambda v, r=r: xv @ w1[:, r * 64:(r + 1) * 64])
            w.output(y[r], reference=lambda v: (xv @ w1) @ w2)
            w.output(s[r], reference=lambda v, r=r: xv[:, r * 32:(r + 1) * 32])
        with pytest.raises(CaptureError, match="needs an all-gather"):
            tp.gather_from_tp_region(w, h)
    tr = capture(wl(build), small2, out_dir=tmp_path / "t")
    assert len(tr.meta["reference_check"]) == 6
    assert all(c["ok"] for c in tr.meta["reference_check"].values()), tr.meta["reference_check"]


@pytest.mark.parametrize("make,match", [
    (lambda w, g: tp.ColumnParallelLinear(w, g, 64, 127, "f32", np.zeros((64, 127))),
     "out_features 127 does not split over 2 ranks"),
    (lambda w, g: tp.RowParallelLinear(w, g, 63, 64, "f32", np.zeros((63, 64))),
     "in_features 63 does not split over 2 ranks"),
    (lambda w, g: tp.ColumnParallelLinear(w, g, 64, 128, "f32", np.zeros((8, 8))),
     r"weight \(8, 8\), expected \(64, 128\)"),
    (lambda w, g: tp.initialize_model_parallel(w, 0), "tensor-parallel size 0"),
])
def test_bad_tp_input(small2, tmp_path, make, match):
    def build(w, p):
        make(w, tp.initialize_model_parallel(w))
    with pytest.raises(CaptureError, match=match):
        capture(wl(build), small2, out_dir=tmp_path / "t")
