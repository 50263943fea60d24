"""IPCQ buffers per direction: capture and replay agree on slots, the tl forms of ADR-0046 D3."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest

import kbtrace
from kbtrace.capture import ring
from kbtrace.errors import CaptureError, DeadlockError, ReplayError
from kbtrace.replay import ReplayOptions
from kbtrace.topology import compile_topology

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny():
    return compile_topology(ROOT / "topologies" / "tiny.yaml")


def _bidir(n: int, dtype: str = "f16", twice: bool = False, ipcq=None):
    """The predecessor's 2-rank ring (ADR-0025): each PE sends E and W to the same peer,
    then receives both. ``twice``: a second E send before any receive."""
    def k(tl, x_ptr, y_ptr):
        a = tl.load(x_ptr, (n,), dtype)
        tl.send("intra_E", a)
        if twice:
            tl.send("intra_E", a)
        tl.send("intra_W", a * 2.0)
        e = tl.recv("intra_W", (n,), dtype)
        w = tl.recv("intra_E", (n,), dtype)
        if twice:
            e = tl.recv("intra_W", (n,), dtype)
        tl.store(y_ptr, e + w)

    def build(w, p):
        x = w.tensor("x", (2, n), dtype, init=w.random(1), shard="pes")
        y = w.tensor("y", (2, n), dtype, shard="pes")
        w.launch(k, grid=(2, 1), args=(x, y), neighbors=ring(2), ipcq=ipcq)
        w.output(y, reference=lambda v: v["x"][::-1] * 3.0)
    return SimpleNamespace(build=build, NAME="bidir")


def _run(trace, topo, tmp_path, fid, **over):
    t = topo if not over else compile_topology(ROOT / "topologies" / "tiny.yaml",
                                               overrides=over)
    return kbtrace.replay(trace, t, ReplayOptions(fidelity=fid, out_dir=tmp_path / f"run-{fid}"))


@pytest.mark.parametrize("fid", ["fast", "flit"])
def test_bidirectional_64k_exchange_captures_replays_and_verifies(tiny, tmp_path, fid):
    # 64 KiB per message (> the 16 KiB buffer): E and W have a buffer each, so the two sends
    # to the same peer do not wait for each other (the pooled buffer deadlocked here)
    tr = kbtrace.capture(_bidir(32768), tiny, out_dir=tmp_path / "t")
    run = _run(tr, tiny, tmp_path, fid)
    assert run.makespan_ns > 65536 / 256.0       # at least one 64 KiB drain
    assert kbtrace.verify(run.run_dir).ok
    one = compile_topology(ROOT / "topologies" / "tiny.yaml", overrides={"pe.ipcq.n_slots": 1})
    run1 = kbtrace.replay(tr, one, ReplayOptions(fidelity=fid, out_dir=tmp_path / "one"))
    assert kbtrace.verify(run1.run_dir).ok


def test_capture_refuses_sends_that_wait_for_their_own_receives(tiny, tmp_path):
    # two 16 KiB E sends need 8 slots of a 4-slot buffer before any recv: deadlock
    with pytest.raises(DeadlockError) as e:
        kbtrace.capture(_bidir(8192, twice=True), tiny, out_dir=tmp_path / "t")
    msg = str(e.value)
    assert "tl.send('intra_E')" in msg and "needs 4 slot(s) for 16384 B" in msg
    assert "0 of 4 free, held by send op 1 at test_ipcq.py:" in msg
    assert "--set pe.ipcq.n_slots=8" in msg
    assert not (tmp_path / "t").exists()
    # the same kernel with room for both messages captures and replays
    big = compile_topology(ROOT / "topologies" / "tiny.yaml", overrides={"pe.ipcq.n_slots": 8})
    tr = kbtrace.capture(_bidir(8192, twice=True), big, out_dir=tmp_path / "t8")
    assert kbtrace.verify(kbtrace.replay(tr, big, ReplayOptions(out_dir=tmp_path / "r8"))
                          .run_dir).ok


def test_replay_with_fewer_slots_names_blocked_sends_and_fix(tiny, tmp_path):
    tr = kbtrace.capture(_bidir(4096, twice=True), tiny, out_dir=tmp_path / "t")  # 2+2 slots
    two = compile_topology(ROOT / "topologies" / "tiny.yaml", overrides={"pe.ipcq.n_slots": 2})
    for fid in ("fast", "flit"):
        with pytest.raises(ReplayError) as e:
            kbtrace.replay(tr, two, ReplayOptions(fidelity=fid, out_dir=tmp_path / fid))
        msg = str(e.value)
        assert msg.startswith("replay finalize: IPCQ deadlock:")
        assert "program 0 (sip0.cube0.pe0) send op 2 ('intra_E' -> program 1) at test_ipcq.py:" \
            in msg
        assert "waits for 2 slot(s) of its 'intra_E' buffer: 0 of 2 free (slot_bytes 4096), " \
               "held by send op 1 at test_ipcq.py:" in msg
        assert msg.endswith("(--set pe.ipcq.n_slots=4)")
        assert not (tmp_path / fid).exists()


def test_launch_ipcq_settings_are_recorded_and_timed(tiny, tmp_path):
    runs = {}
    for kind in ("tcm", "hbm"):
        tr = kbtrace.capture(_bidir(2048, ipcq={"buffer_kind": kind, "n_slots": 2}), tiny,
                             out_dir=tmp_path / kind)
        ops = pq.read_table(tr.path / "ops.parquet").to_pylist()
        ipcq = [json.loads(o["extra_json"])["ipcq"] for o in ops if o["kind"] in ("send", "recv")]
        assert ipcq and all(s == {"buffer_kind": kind, "n_slots": 2} for s in ipcq)
        runs[kind] = kbtrace.replay(tr, tiny, ReplayOptions(out_dir=tmp_path / f"r{kind}"))
    assert runs["hbm"].makespan_ns > runs["tcm"].makespan_ns
    with pytest.raises(CaptureError, match="buffer_kind='dram'; use one of tcm, sram, hbm"):
        kbtrace.capture(_bidir(64, ipcq={"buffer_kind": "dram"}), tiny, out_dir=tmp_path / "x")
    with pytest.raises(CaptureError, match="unknown IPCQ setting 'slots'"):
        kbtrace.capture(_bidir(64, ipcq={"slots": 2}), tiny, out_dir=tmp_path / "x")


def _forms(n: int):
    """PE 0 sends x straight from HBM (raw address); PE 1 receives it into y in HBM
    (copy_to_dst), then sends back x+1 which PE 0 receives with recv_no_consume."""
    def k(tl, x_ptr, y_ptr, z_ptr):
        me = tl.program_id(0)
        if me == 0:
            tl.send("intra_E", src_addr=x_ptr, shape=(n,), dtype="f32", space="hbm")
            back = tl.recv_no_consume("intra_E", (n,), "f32")
            tl.store(z_ptr, back)
        else:
            got = tl.recv("intra_W", (n,), "f32", dst_addr=y_ptr, space="hbm")
            assert got.space == "hbm"
            v = tl.load(y_ptr, (n,), "f32")
            tl.send("intra_W", v + 1.0)

    def build(w, p):
        x = w.tensor("x", (n,), "f32", init=w.random(3), pe=(0, 0, 0))
        y = w.tensor("y", (n,), "f32", pe=(0, 0, 1))
        z = w.tensor("z", (n,), "f32", pe=(0, 0, 0))
        w.launch(k, grid=(2, 1), args=(x, y, z), neighbors=ring(2))
        w.output(y, reference=lambda v: v["x"])
        w.output(z, reference=lambda v: v["x"] + 1.0)
    return SimpleNamespace(build=build, NAME="forms")


@pytest.mark.parametrize("fid", ["fast", "flit"])
def test_send_src_addr_recv_dst_addr_and_recv_no_consume(tiny, tmp_path, fid):
    tr = kbtrace.capture(_forms(1024), tiny, out_dir=tmp_path / "t")
    assert all(c["ok"] for c in tr.meta["reference_check"].values())
    ops = {(o["kind"], o["name"], o["program"]): o
           for o in pq.read_table(tr.path / "ops.parquet").to_pylist()}
    send = ops[("send", "send", 0)]
    assert send["src_space"] == "hbm" and send["program"] == 0
    rx = ops[("recv", "recv", 1)]
    assert rx["dst_space"] == "hbm" and rx["program"] == 1
    assert ("recv", "recv_no_consume", 0) in ops
    run = kbtrace.replay(tr, tiny, ReplayOptions(fidelity=fid, out_dir=tmp_path / "r"))
    res = kbtrace.verify(run.run_dir)
    assert res.ok
    # the raw send's data leaves from PE 0's HBM controller; the copy lands in PE 1's
    hops = pq.read_table(run.run_dir / "hops.parquet").to_pylist()
    nodes = {n["node_idx"]: n["node_id"] for n in pq.read_table(run.run_dir / "nodes.parquet")
             .to_pylist()}
    send_nodes = {nodes.get(h["node_idx"]) for h in hops if h["op_id"] == send["op_id"]}
    assert "sip0.cube0.hbm_ctrl.pe0" in send_nodes
    rx_nodes = {nodes.get(h["node_idx"]) for h in hops if h["op_id"] == rx["op_id"]}
    assert "sip0.cube0.hbm_ctrl.pe1" in rx_nodes


def test_recv_no_consume_skips_the_slot_read(tmp_path):
    slow = compile_topology(ROOT / "topologies" / "tiny.yaml",
                            overrides={"pe.ipcq.tcm.bw_gbps": 1.0})
    spans = {}
    for consume in (True, False):
        def k(tl, x_ptr, consume=consume):
            if tl.program_id(0) == 0:
                tl.send("intra_E", tl.load(x_ptr, (256,), "f32"))
            elif consume:
                tl.recv("intra_W", (256,), "f32")
            else:
                tl.recv_no_consume("intra_W", (256,), "f32")

        def build(w, p, k=k):
            x = w.tensor("x", (256,), "f32", init=w.random(0))
            w.launch(k, grid=(2, 1), args=(x,), neighbors=ring(2))
        tr = kbtrace.capture(SimpleNamespace(build=build, NAME="nc"), slow,
                             out_dir=tmp_path / f"t{consume}")
        run = kbtrace.replay(tr, slow, ReplayOptions(out_dir=tmp_path / f"r{consume}"))
        ot = pq.read_table(run.run_dir / "op_timing.parquet").to_pylist()
        r = next(o for o in ot if o["kind"] == "recv")
        spans[consume] = r["t_end_ns"] - r["t_start_ns"]
    # 1 KiB at 1 GB/s = 1024 ns of slot read, only when the receive consumes
    assert spans[True] - spans[False] == pytest.approx(1024.0, abs=1e-6)


def test_send_raw_form_errors(tiny, tmp_path):
    def mk(call):
        def k(tl, x_ptr):
            if tl.program_id(0) == 0:
                call(tl, x_ptr)
            else:
                tl.recv("intra_W")

        def build(w, p):
            x = w.tensor("x", (64,), "f32", init=w.random(0))
            w.launch(k, grid=(2, 1), args=(x,), neighbors=ring(2))
        return SimpleNamespace(build=build, NAME="bad")
    cases = [
        (lambda tl, x: tl.send("intra_E", src_addr=x, shape=(64,), dtype="f32", space="sram"),
         "not sram; pass space='hbm'"),
        (lambda tl, x: tl.send("intra_E", src_addr=x, dtype="f32"),
         "pass shape=... or nbytes=..."),
        (lambda tl, x: tl.send("intra_E", src_addr=x, shape=(65,), dtype="f32", space="hbm"),
         "touches unallocated memory"),
    ]
    for call, want in cases:
        with pytest.raises(CaptureError, match=want.replace("(", r"\(").replace(".", r"\.")):
            kbtrace.capture(mk(call), tiny, out_dir=tmp_path / "x")


def _random_exchange(seed: int):
    """3 PEs in a ring exchange random-sized messages on random directions, each program's
    sends and receives shuffled: some orders deadlock on the slots, most do not."""
    rng = np.random.default_rng(seed)
    table = ring(3)
    acts: dict[int, list[tuple[str, str, int]]] = {p: [] for p in range(3)}
    for p in range(3):
        for d in ("intra_E", "intra_W"):
            q = table[p][d]
            back = "intra_W" if d == "intra_E" else "intra_E"
            for _ in range(int(rng.integers(0, 4))):
                acts[p].append(("send", d, int(rng.choice([16, 64, 256, 512]))))
                acts[q].append(("recv", back, 0))
    for p in range(3):
        rng.shuffle(acts[p])
        if rng.random() < 0.5:      # some receives posted early (recv_async), joined at the end
            acts[p] = [("recv_async", d, 0) if k == "recv" and rng.random() < 0.5 else (k, d, n)
                       for k, d, n in acts[p]]

    def k(tl, x_ptr):
        me = tl.program_id(0)
        futs = []
        for kind, d, n in acts[me]:
            if kind == "send":
                tl.send(d, tl.load(x_ptr, (n,), "f32"))
            elif kind == "recv":
                tl.recv(d)
            else:
                futs.append(tl.recv_async(d))
        for f in futs:
            tl.wait(f)

    def build(w, p):
        x = w.tensor("x", (512,), "f32", init=w.random(seed))
        w.launch(k, grid=(3, 1), args=(x,), neighbors=table)
    return SimpleNamespace(build=build, NAME=f"rx{seed}")


def test_what_captures_replays(tmp_path):
    """Capture and replay agree: every random exchange that captures (with 2 slots of 256 B,
    so sends often wait) replays to the end in both fidelities; the others are refused at
    capture as deadlocks."""
    topo = compile_topology(ROOT / "topologies" / "small.yaml",
                            overrides={"pe.ipcq.n_slots": 2, "pe.ipcq.slot_bytes": 256})
    outcome = {"captured": 0, "refused": 0}
    for seed in range(24):
        try:
            tr = kbtrace.capture(_random_exchange(seed), topo, out_dir=tmp_path / f"t{seed}")
        except DeadlockError:
            outcome["refused"] += 1
            continue
        outcome["captured"] += 1
        for fid in ("fast", "flit"):
            run = kbtrace.replay(tr, topo, ReplayOptions(fidelity=fid,
                                                         out_dir=tmp_path / f"r{seed}{fid}"))
            assert run.ops == tr.meta["n_ops"]
    assert outcome["captured"] >= 8 and outcome["refused"] >= 2, outcome
