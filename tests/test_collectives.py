"""Collectives: LRAB, 3-level and ring all-reduce over PEs, cubes and SIPs; the host API."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest

import kbtrace
from kbtrace.capture.workload import load_workload
from kbtrace.collectives import Geometry, neighbor_table
from kbtrace.errors import CaptureError
from kbtrace.replay import ReplayOptions
from kbtrace.topology import compile_topology

ROOT = Path(__file__).resolve().parents[1]
ALLREDUCE = ROOT / "capture" / "allreduce.py"
#: the reference's correctness case (ADR-0029 T1-T6): 2 SIPs x 2 cubes x 4 PEs
S2C2P4 = {"system.sips.count": 2, "sip.cube_mesh_w": 2, "sip.cube_mesh_h": 1,
          "cube.pes.count": 4}
SIX = {"ring_1d": {}, "torus_2d": {"system.sips.w": 2, "system.sips.h": 3},
       "mesh_2d": {"system.sips.w": 2, "system.sips.h": 3}}


def _topo(**over):
    return compile_topology(ROOT / "topologies" / "small.yaml", overrides=over)


@pytest.mark.parametrize("algorithm", ["lrab", "hier3", "ring"])
def test_rank_plus_one_exact_in_f16_2sips_2cubes_4pes(tmp_path, algorithm):
    """Every PE of 2 SIPs x 2 cubes x 4 PEs starts with rank + 1 and ends with sum(1..16)."""
    topo = _topo(**S2C2P4)
    tr = kbtrace.capture(ALLREDUCE, topo, {"algorithm": algorithm, "pes": 4, "n_elem": 64,
                                           "dtype": "f16"}, out_dir=tmp_path / "t")
    assert tr.meta["reference_check"]["x"] == {"ok": True, "max_abs_err": 0.0, "dtype": "f16"}
    spans = {}
    for fid in ("fast", "flit"):
        run = kbtrace.replay(tr, topo, ReplayOptions(fidelity=fid, out_dir=tmp_path / fid))
        res = kbtrace.verify(run.run_dir)
        assert res.ok
        spans[fid] = run.makespan_ns
    assert abs(spans["fast"] - spans["flit"]) / spans["flit"] < 0.02
    ops = pq.read_table(tr.path / "ops.parquet",
                        columns=["kind", "direction", "sip", "peer_sip"]).to_pylist()
    sends = [o for o in ops if o["kind"] == "send"]
    assert any(o["sip"] != o["peer_sip"] for o in sends)   # the SIPs exchange over the fabric
    dirs = {o["direction"] for o in sends}
    assert dirs == ({"E"} if algorithm == "ring" else
                    {"intra_E", "intra_W", "global_E", "W" if algorithm == "lrab" else "N"}
                    | ({"E"} if algorithm == "lrab" else {"S"}))


def test_reference_values_are_sum_1_to_16(tmp_path):
    w = load_workload(ALLREDUCE)
    topo = _topo(**S2C2P4)
    tr = kbtrace.capture(w, topo, {"algorithm": "hier3", "pes": 4, "n_elem": 8},
                         out_dir=tmp_path / "t")
    run = kbtrace.replay(tr, topo, ReplayOptions(out_dir=tmp_path / "r"))
    res = kbtrace.verify(run.run_dir)
    assert res.ok and [(t.tensor, t.max_abs) for t in res.tensors] == [("x", 0.0)]
    mem = pq.read_table(tr.path / "memory.parquet").to_pylist()
    ref = [r for r in mem if r["tensor"] == "x" and r["role"] == "reference"]
    assert ref and {v for r in ref for v in np.frombuffer(r["data"], np.float16)} == {136.0}


@pytest.mark.parametrize("fabric", list(SIX))
def test_lrab_on_six_sips(tmp_path, fabric):
    """LRAB with the centre root on 6 SIPs (2x2 cubes each): every cube holds sum(1..24)."""
    topo = _topo(**{"system.sips.count": 6, "system.sips.topology": fabric, **SIX[fabric]})
    tr = kbtrace.capture(ALLREDUCE, topo, {"n_elem": 512}, out_dir=tmp_path / "t")
    assert tr.meta["reference_check"]["x"]["ok"]
    spans = {}
    for fid in ("fast", "flit"):
        run = kbtrace.replay(tr, topo, ReplayOptions(fidelity=fid, out_dir=tmp_path / fid))
        assert kbtrace.verify(run.run_dir).ok
        spans[fid] = run.makespan_ns
    assert abs(spans["fast"] - spans["flit"]) / spans["flit"] < 0.02
    ops = pq.read_table(tr.path / "ops.parquet", columns=["kind", "direction", "sip", "cube"])
    sends = [o for o in ops.to_pylist() if o["kind"] == "send"]
    glob = {o["cube"] for o in sends if o["direction"].startswith("global_")}
    assert glob == {3}                     # only the root cube (1, 1) of the 2x2 mesh
    want = {"ring_1d": {"global_E"}, "torus_2d": {"global_E", "global_S"},
            "mesh_2d": {"global_E", "global_W", "global_N", "global_S"}}[fabric]
    assert {o["direction"] for o in sends if o["direction"].startswith("global_")} == want


def test_lrab_phases_and_roots_on_a_4x4_mesh():
    topo = _topo(**{"sip.cube_mesh_w": 4, "sip.cube_mesh_h": 4})
    g = Geometry.of(topo, 1, tuple(range(16)), "centre")
    assert g.root == (2, 2) and g.root_cube == 10
    assert Geometry.of(topo, 1, tuple(range(16)), "corner").root_cube == 15
    t = neighbor_table("lrab", g)
    assert t[10] == {"E": 11, "W": 9, "N": 6, "S": 14}
    assert t[0] == {"E": 1, "S": 4}                     # corner: no wrap on the cube mesh
    ring = neighbor_table("hier3", g)
    assert ring[0] == {"S": 1, "N": 15} and ring[15] == {"S": 0, "N": 14}


def test_neighbor_tables_follow_the_sip_fabric():
    topo = _topo(**{"system.sips.count": 6, "system.sips.topology": "torus_2d",
                    "system.sips.w": 3, "system.sips.h": 2, "cube.pes.count": 2})
    g = Geometry.of(topo, 2, (0, 1, 2, 3), "centre")
    t = neighbor_table("lrab", g)
    # program of sip 0, cube 3, PE 1: its global_* peers are cube 3 / PE 1 of SIPs 1, 2, 3
    me = g.index(0, 3, 1)
    assert {d: divmod(p, 2 * 4) for d, p in t[me].items() if d.startswith("global_")} == {
        "global_E": (1, 3 * 2 + 1), "global_W": (2, 7), "global_N": (3, 7), "global_S": (3, 7)}
    assert t[me]["intra_E"] == g.index(0, 3, 0) and t[me]["W"] == g.index(0, 2, 1)
    flat = neighbor_table("ring", g)
    assert flat[g.index(5, 3, 1)]["E"] == g.index(0, 0, 0)


def test_single_cube_fast_path_skips_the_mesh(tmp_path):
    topo = _topo(**{"system.sips.count": 2})
    tr = kbtrace.capture(ALLREDUCE, topo, {"cubes": 1, "n_elem": 256}, out_dir=tmp_path / "t")
    assert all(c["ok"] for c in tr.meta["reference_check"].values())
    ops = pq.read_table(tr.path / "ops.parquet", columns=["kind", "direction"]).to_pylist()
    assert {o["direction"] for o in ops if o["kind"] == "send"} == {"global_E"}
    assert kbtrace.verify(kbtrace.replay(tr, topo, ReplayOptions(out_dir=tmp_path / "r"))
                          .run_dir).ok


def test_centre_root_beats_corner_root(tmp_path):
    topo = _topo(**{"sip.cube_mesh_w": 4, "sip.cube_mesh_h": 4, "system.sips.count": 2})
    spans = {}
    for root in ("centre", "corner"):
        tr = kbtrace.capture(ALLREDUCE, topo, {"root": root, "n_elem": 2048},
                             out_dir=tmp_path / root)
        spans[root] = kbtrace.replay(tr, topo, ReplayOptions(out_dir=tmp_path / f"r{root}")
                                     ).makespan_ns
    assert spans["centre"] < spans["corner"]


def _job(build):
    return SimpleNamespace(build=build, NAME="job")


def test_bad_input_is_one_clear_error(tmp_path):
    topo = _topo(**{"system.sips.count": 2})

    def cap(build):
        with pytest.raises(CaptureError) as e:
            kbtrace.capture(_job(build), topo, out_dir=tmp_path / "x")
        assert "\n" not in str(e.value)
        return str(e.value)

    def one_rank(w, p):
        w.all_reduce(w.tensor("g", (64,), "f16", pe=(0, 0, 0)))
    assert "'g' is not present on every rank: SIP(s) [1] of 2 hold no shard" in cap(one_rank)

    def bad_op(w, p):
        w.all_reduce(w.tensor("g", (8, 64), "f16", shard="cubes"), op="max")
    assert "unsupported op 'max'; supported: sum" in cap(bad_op)

    def dtypes(w, p):
        w.all_reduce([w.tensor("a", (64,), "f16", pe=(0, 0, 0)),
                      w.tensor("b", (64,), "f32", pe=(1, 0, 0))])
    assert "tensors 'a' (f16) and 'b' (f32) have different dtypes" in cap(dtypes)

    def shapes(w, p):
        w.all_reduce([w.tensor("a", (64,), "f16", pe=(0, 0, 0)),
                      w.tensor("b", (32,), "f16", pe=(1, 0, 0))])
    assert "every shard must have the same shape" in cap(shapes)

    def algo(w, p):
        w.all_reduce(w.tensor("g", (8, 64), "f16", shard="cubes"), algorithm="tree")
    assert "unknown algorithm 'tree'; use one of lrab, hier3, ring" in cap(algo)

    def ring_split(w, p):
        w.all_reduce(w.tensor("g", (8, 63), "f16", shard="cubes"), algorithm="ring")
    assert "ring needs the shard's 63 elements to split over the 8 PEs" in cap(ring_split)

    def kind(w, p):
        w.all_reduce(w.tensor("g", (8, 64), "f16", shard="cubes"), buffer_kind="dram")
    assert "buffer_kind='dram'; use one of tcm, sram, hbm" in cap(kind)


def test_cli_bad_params_and_fabric_exit_2(tmp_path, capsys):
    from kbtrace.cli import main
    for argv, want in (
        (["capture", str(ALLREDUCE), "-t", "small", "-p", "algorithm=tree", "-o",
          str(tmp_path / "a")], "unknown algorithm 'tree'"),
        (["capture", str(ALLREDUCE), "-t", "small", "--set", "system.sips.count=6", "--set",
          "system.sips.topology=torus_2d", "-o", str(tmp_path / "b")],
         "6 SIPs are not a square"),
        (["capture", str(ALLREDUCE), "-t", "small", "--set", "system.sips.count=17", "-o",
          str(tmp_path / "c")], "at most 16 SIPs"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert want in err and err.count("\n") == 1 and "Traceback" not in err


def test_buffer_kinds_order_tcm_hbm_sram(tmp_path):
    topo = _topo(**{"system.sips.count": 2})
    spans = {}
    for kind in ("tcm", "hbm", "sram"):
        tr = kbtrace.capture(ALLREDUCE, topo, {"buffer_kind": kind, "n_elem": 8192},
                             out_dir=tmp_path / kind)
        spans[kind] = kbtrace.replay(tr, topo, ReplayOptions(out_dir=tmp_path / f"r{kind}")
                                     ).makespan_ns
    assert spans["tcm"] < spans["hbm"] < spans["sram"]
