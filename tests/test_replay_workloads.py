"""Replay of real captured workloads (capture/): fast vs flit agreement, crit sums,
GEMM tile scaling, HBM bandwidth sensitivity."""

from __future__ import annotations

import copy

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from kbtrace.capture import capture
from kbtrace.replay import ReplayOptions, replay
from kbtrace.replay.compare import compare_runs
from kbtrace.topology import address, compile_topology
from test_replay_util import TOPO_DIR, SynthTrace, on

ROOT = TOPO_DIR.parent
WORKLOADS = {
    "gemm": {"M": 128, "N": 128, "K": 128},
    "gemm_composite": {"M": 128, "N": 64, "K": 128},
    "softmax": {"R": 128},
    "ring_allreduce": {},
    "data_dependent": {"R": 32},
    "attention": {"S": 128},
    "gemm_sharded": {"M": 128, "N": 128, "K": 128},
    "all_gather": {"peers": 8},
}


@pytest.fixture(scope="module")
def small():
    return compile_topology(TOPO_DIR / "small.yaml")


@pytest.fixture(scope="module")
def traces(small, tmp_path_factory):
    d = tmp_path_factory.mktemp("traces")
    return {w: capture(ROOT / "capture" / f"{w}.py", small, p, d / w) for w, p in WORKLOADS.items()}


@pytest.fixture(scope="module")
def runs(small, traces, tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    return {(w, f): replay(t, small, ReplayOptions(fidelity=f, out_dir=str(d / f"{w}-{f}")))
            for w, t in traces.items() for f in ("flit", "fast")}


@pytest.mark.parametrize("w", sorted(WORKLOADS))
def test_fast_agrees_with_flit(runs, w):
    ag = compare_runs(runs[(w, "fast")], runs[(w, "flit")])
    assert ag.makespan_err <= 0.02, ag
    assert ag.median_op_err <= 0.05, ag
    assert runs[(w, "fast")].events < runs[(w, "flit")].events


@pytest.mark.parametrize("w", sorted(WORKLOADS))
def test_crit_sums_to_op_latency(runs, w):
    r = runs[(w, "fast")]
    ot = r.op_timing()
    crit = r.hops_table().group_by("op_id").aggregate([("crit_ns", "sum")])
    by_op = dict(zip(crit["op_id"].to_pylist(), crit["crit_ns_sum"].to_pylist(), strict=True))
    lat = pc.subtract(ot["t_end_ns"], ot["t_issue_ns"]).to_numpy()
    # metadata-only calls (fills, trans) are no command: no hop rows, zero latency
    assert [by_op.get(o, 0.0) for o in ot["op_id"].to_pylist()] == pytest.approx(lat, abs=1e-6)
    meta = [o for o, k, n in zip(ot["op_id"].to_pylist(), ot["kind"].to_pylist(),
                                 ot["name"].to_pylist(), strict=True)
            if k == "fill" or (k, n) == ("math", "trans")]
    assert all(o not in by_op for o in meta)
    assert len(by_op) == len(ot) - len(meta)


def test_ring_allreduce_every_send_matched(runs):
    ot = runs[("ring_allreduce", "flit")].op_timing()
    kinds = ot["kind"].to_pylist()
    assert kinds.count("send") == kinds.count("recv") > 0


def _composite(topo, m, n, k):
    c = address.hbm_addr(0, 0, 0)
    a = c + (8 << 20)
    b = c + (16 << 20)
    return SynthTrace([
        {**on(), "kind": "composite", "name": "gemm", "is_async": True, "m": m, "n": n, "k": k,
         "in_addrs": [a, b], "in_spaces": ["hbm", "hbm"], "in_dtypes": ["f16", "f16"],
         "in_shapes": [[m, k], [k, n]], "dst_space": "hbm", "dst_addr": c, "out_dtype": "f16",
         "out_shape": [m, n], "nbytes": m * n * 2, "handle_id": 0},
        {**on(seq=1), "kind": "wait", "deps": [0]}])


def test_more_gemm_tiles_take_longer(small, tmp_path):
    t = {}
    for shape in ((64, 64, 64), (128, 64, 64), (128, 128, 128)):
        r = replay(_composite(small, *shape), small,
                   ReplayOptions(out_dir=str(tmp_path / "x".join(map(str, shape)))))
        hops = r.hops_table()
        t[shape] = (r.makespan_ns, len(set(hops["tile"].to_pylist()) - {-1}))
    (a, ta), (b, tb), (c, tc) = t.values()
    assert (ta, tb, tc) == (4, 8, 32)        # (M/32)*(N/32)*(K/64) tiles
    assert a < b < c


def test_halved_hbm_bandwidth_slows_memory_stages(traces, tmp_path):
    full = compile_topology(TOPO_DIR / "small.yaml")
    half = compile_topology(TOPO_DIR / "small.yaml", overrides={"cube.hbm.pc_bw_gbps": 16})
    out = {}
    for name, topo in (("full", full), ("half", half)):
        r = replay(traces["gemm"], topo, ReplayOptions(out_dir=str(tmp_path / name)))
        h = r.hops_table()
        mem = h.filter(pc.is_in(h["stage"].cast(pa.string()), pa.array(["hbm", "dma_read"])))
        out[name] = (r.makespan_ns, pc.sum(pc.subtract(mem["t_leave_ns"], mem["t_enter_ns"])).as_py())
    assert out["half"][1] > 1.3 * out["full"][1]
    assert out["half"][0] > out["full"][0]


def test_cli_replay_prints_and_refuses_misfit(traces, tmp_path, capsys):
    from kbtrace.cli import main
    tr = traces["softmax"]
    out = tmp_path / "cli"
    rc = main(["replay", str(tr.path), "--topology", str(TOPO_DIR / "small.yaml"),
               "--fidelity", "fast", "--set", "cube.mesh.link_bw_gbps=128", "-o", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "makespan" in text and "ops" in text and "hops" in text and "events" in text
    assert str(out) in text
    assert {p.name for p in out.iterdir()} >= {"op_timing.parquet", "hops.parquet", "run.json",
                                               "nodes.parquet", "links.parquet"}
    rc = main(["replay", str(tr.path), "--topology", str(TOPO_DIR / "tiny.yaml"),
               "-o", str(tmp_path / "bad")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "does not have" in err


def test_progress_reports_and_changes_nothing(traces, small, tmp_path, monkeypatch, capsys):
    """``progress`` sees ops, events and simulated time grow and the final state; the run's
    files are byte-identical to a run without it; the CLI prints it on request."""
    import hashlib

    from kbtrace.cli import main
    from kbtrace.replay import engine
    monkeypatch.setattr(engine, "PROGRESS_EVERY", 1000)
    tr = traces["softmax"]
    seen = []
    a = replay(tr, small, ReplayOptions(fidelity="flit", out_dir=str(tmp_path / "a")),
               progress=seen.append)
    b = replay(tr, small, ReplayOptions(fidelity="flit", out_dir=str(tmp_path / "b")))
    assert len(seen) == a.events // 1000 + 1
    assert [p.events for p in seen] == sorted(p.events for p in seen)
    assert [p.sim_ns for p in seen] == sorted(p.sim_ns for p in seen)
    assert [p.ops_done for p in seen] == sorted(p.ops_done for p in seen)
    assert any(0 < p.ops_done < a.ops for p in seen)      # reported mid-run
    last = seen[-1]
    assert (last.ops_done, last.ops, last.events, last.sim_ns, last.fraction) == \
        (a.ops, a.ops, a.events, a.makespan_ns, 1.0)
    for f in ("op_timing.parquet", "hops.parquet"):
        assert hashlib.sha256((a.run_dir / f).read_bytes()).digest() == \
            hashlib.sha256((b.run_dir / f).read_bytes()).digest()
    rc = main(["replay", str(tr.path), "--topology", str(TOPO_DIR / "small.yaml"), "--progress",
               "-o", str(tmp_path / "cli")])
    err = capsys.readouterr().err.splitlines()
    assert rc == 0 and err[-1].startswith(f"replay: {a.ops}/{a.ops} ops (100%), t = ")


def test_memoised_plans_equal_fresh_ones(small, traces, tmp_path):
    """Sim.plan (``OpCore.plan``) memoises plans: for every op of every workload (the same op
    shapes at other addresses too, operands in and out of TCM) it returns what plan_for builds."""
    from kbtrace.replay.engine import Sim
    from kbtrace.replay.ops import load_ops, plan_for

    for w, tr in traces.items():
        from kbtrace.replay.source import OpSource
        ops = load_ops(tr.ops())
        sim = Sim(small, OpSource(tr.ops()), ReplayOptions(out_dir=str(tmp_path / w)),
                  tmp_path / w)
        planned = [o for o in ops if o.kind not in ("wait", "cycles", "send", "recv", "h2d", "d2h")]
        for o in planned:
            assert sim.plan(o) == plan_for(o, small.params), (w, o.op_id)
        loads = [o for o in planned if o.kind == "load"]
        again = [o for o in loads if o is not loads[0] and (o.src_addr, o.nbytes) ==
                 (loads[0].src_addr, loads[0].nbytes)]
        if again:                                  # one plan object per distinct load
            assert sim.plan(again[0]) is sim.plan(loads[0])
        for o in planned:       # the same op with an operand elsewhere, or its result
            if o.kind not in ("dot", "composite"):
                continue
            for field, spaces in (("in_addrs", o.in_spaces), ("dst_addr", [o.dst_space])):
                if "hbm" not in spaces:
                    continue
                moved = copy.copy(o)
                setattr(moved, field, [a + 4096 for a in o.in_addrs] if field == "in_addrs"
                        else o.dst_addr + 4096)
                assert sim.plan(moved) == plan_for(moved, small.params) != plan_for(
                    o, small.params), (w, o.op_id, field)
        sim.rec.hops.abort()


def _varying(ops, fields, shift):
    """The ``fields`` columns of ``ops``, their input addresses moved by ``shift``."""
    return [[(tuple(a + shift for a in o.in_addrs) if f == "in_addrs" and o.in_addrs
              else getattr(o, f)) for o in ops] for f in fields]


def test_template_keyed_plans_equal_fresh_ones(small, traces, tmp_path):
    """A dot or composite built from a template (``ops.build_ops``: ``Op.tpl``) is memoised by
    the template's id and the addresses of its operands outside TCM (``OpCore.plan``): its plan
    is plan_for's, one object for the template at one address, a new one when an operand moves."""
    from kbtrace.replay.engine import Sim
    from kbtrace.replay.ops import TEMPLATE, VARYING, build_ops, load_ops, plan_for
    from kbtrace.replay.source import OpSource

    moved_apart = 0
    for w, tr in traces.items():
        ops = [o for o in load_ops(tr.ops()) if o.kind in ("dot", "composite")]
        if not ops:
            continue
        assert {o.tpl for o in ops} == {-1}                 # not built from a template
        sim = Sim(small, OpSource(tr.ops()), ReplayOptions(out_dir=str(tmp_path / w)),
                  tmp_path / w)
        sigs = [tuple(getattr(o, f) for f in TEMPLATE) for o in ops]
        templates = list(dict.fromkeys(sigs))
        ids = [templates.index(sg) for sg in sigs]
        built, again, moved = (build_ops(templates, ids, *_varying(ops, VARYING, shift))
                               for shift in (0, 0, 4096))
        assert [b.tpl for b in built] == ids
        for o, b, b2, m in zip(ops, built, again, moved, strict=True):
            assert sim.plan(b) == plan_for(o, small.params), (w, o.op_id)
            assert sim.plan(b2) is sim.plan(b)
            assert sim.plan(m) == plan_for(m, small.params), (w, o.op_id)
            moved_apart += plan_for(m, small.params) != plan_for(o, small.params)
        sim.rec.hops.abort()
    assert moved_apart > 0      # some operand outside TCM: the key told the addresses apart
