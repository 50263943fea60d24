"""Capture errors: pending values in control flow, sanitizers, deadlocks, CLI exit codes."""

from __future__ import annotations

import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from kbtrace.capture import capture, ring
from kbtrace.cli import main
from kbtrace.errors import CaptureError, DeadlockError, SanitizerError
from kbtrace.topology import compile_topology

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small():
    return compile_topology(ROOT / "topologies" / "small.yaml")


def _workload(kernel, *, n=64, grid=(2, 1), neighbors=None, shape=None, dtype="f32"):
    def build(w, p):
        x = w.tensor("x", shape or (n,), dtype, init=w.random(0))
        y = w.tensor("y", shape or (n,), dtype)
        w.launch(kernel, grid=grid, args=(x, y), neighbors=neighbors)
    return SimpleNamespace(NAME="t", PARAMS={}, build=build)


def _run(kernel, small, tmp_path, **kw):
    return capture(_workload(kernel, **kw), small, out_dir=tmp_path)


def test_pending_value_in_if_names_kernel_program_line_and_op(small, tmp_path):
    def branchy(tl, x, y):
        a = tl.load(x, (64,), "f32")
        s = tl.sum(a, axis=0)
        if s > 0:  # pending: compute results are not known during capture
            tl.store(y, a)
    with pytest.raises(CaptureError) as ei:
        _run(branchy, small, tmp_path)
    msg = str(ei.value)
    assert "kernel 'branchy' program 0" in msg and "test_capture_errors.py:" in msg
    assert "'gt'" in msg and "truth value" in msg and "tl.load" in msg
    assert not (tmp_path / "ops.parquet").exists()


@pytest.mark.parametrize("use", ["float", "item", "index", "data"])
def test_every_pending_value_use_raises(small, tmp_path, use):
    def k(tl, x, y):
        d = tl.exp(tl.load(x, (64,), "f32"))
        {"float": lambda: float(d), "item": d.item, "index": lambda: d[0],
         "data": lambda: d.data}[use]()
    with pytest.raises(CaptureError, match="pending result of op 'exp'"):
        _run(k, small, tmp_path)


def test_loaded_values_allow_control_flow(small, tmp_path):
    seen = []

    def k(tl, x, y):
        a = tl.load(x, (64,), "f32")
        seen.append((float(a[3]), bool(a[0] > 10.0), a.data.shape))
    _run(k, small, tmp_path)
    assert len(seen) == 2 and seen[0][1:] == (False, (64,))


def test_tcm_overflow(small, tmp_path):
    def hog(tl, x, y):
        live = [tl.load(x, (256,), "f32") for _ in range(2000)]  # 2000 x 1 KiB > 1 MiB, all alive
        assert live
    with pytest.raises(SanitizerError, match=r"TCM of sip0.cube0.pe0 overflow: tl.load of "
                       r"\(256,\) f32 needs 1024 B but 1024 live buffer\(s\) hold 1048576 of "
                       r"1048576 B and no gap fits; use smaller tiles"):
        _run(hog, small, tmp_path, n=256)


def test_scratch_overflow(small, tmp_path):
    def hog(tl, x, y):
        a = tl.load(x, (256,), "f32")
        keep = [a + 1.0 for _ in range(2000)]
        assert keep
    with pytest.raises(SanitizerError, match="scratch of sip0.cube0.pe0 overflow"):
        _run(hog, small, tmp_path, n=256)


def test_out_of_range_and_unallocated(small, tmp_path):
    def past_end(tl, x, y):
        tl.load(x, (65,), "f32")
    with pytest.raises(SanitizerError, match=r"4 B past the end of tensor 'x'"):
        _run(past_end, small, tmp_path)

    def wild(tl, x, y):
        tl.load(x + (1 << 30), (4,), "f32")
    with pytest.raises(SanitizerError, match="unallocated memory"):
        _run(wild, small, tmp_path)


def test_shape_and_dtype_mismatch(small, tmp_path):
    def wrong_dtype(tl, x, y):
        tl.load(x, (64,), "f16")
    with pytest.raises(SanitizerError, match=r"tensor 'x' \(dtype f32\) as f16"):
        _run(wrong_dtype, small, tmp_path)

    def bad_dot(tl, x, y):
        a = tl.load(x, (8, 8), "f32")
        b = tl.load(x, (4, 16), "f32")
        tl.dot(a, b)
    with pytest.raises(SanitizerError, match=r"\(8, 8\) x \(4, 16\)"):
        _run(bad_dot, small, tmp_path)

    def bad_bcast(tl, x, y):
        tl.load(x, (8, 8), "f32") + tl.load(x, (4, 16), "f32")
    with pytest.raises(SanitizerError, match="do not broadcast"):
        _run(bad_bcast, small, tmp_path)

    def mixed(tl, x, y):
        tl.load(x, (8,), "f32") + tl.zeros((8,), "f16")
    _run(mixed, small, tmp_path)          # promoted to f32 (Triton's rules) by default
    with pytest.raises(SanitizerError, match="dtypes differ"):
        capture(_workload(mixed), small, out_dir=tmp_path, strict=("promote",))


def test_both_recv_first_deadlocks(small, tmp_path):
    def k(tl, x, y):
        got = tl.recv("intra_E", (64,), "f32")
        tl.send("intra_E", got)
    with pytest.raises(DeadlockError) as ei:
        _run(k, small, tmp_path, neighbors=ring(2))
    msg = str(ei.value)
    assert "program 0 (sip0.cube0.pe0) in tl.recv('intra_E') at test_capture_errors.py:" in msg
    assert "program 1 (sip0.cube0.pe1) in tl.recv('intra_E')" in msg


def test_unreceived_send(small, tmp_path):
    def k(tl, x, y):
        if tl.program_id(0) == 0:
            tl.send("intra_E", tl.load(x, (64,), "f32"))
    with pytest.raises(SanitizerError, match=r"send op 1 from program 0 .*never received"):
        _run(k, small, tmp_path, neighbors=ring(2))


def test_missing_neighbour_and_recv_shape_mismatch(small, tmp_path):
    def k(tl, x, y):
        tl.send("intra_N", tl.load(x, (64,), "f32"))
    with pytest.raises(CaptureError, match="no neighbour in direction 'intra_N'"):
        _run(k, small, tmp_path, neighbors=ring(2))

    def k2(tl, x, y):
        tl.send("intra_E", tl.load(x, (64,), "f32"))
        tl.recv("intra_W", (32,), "f32")
    with pytest.raises(SanitizerError, match=r"expects \(32,\) f32 but program 0 sent \(64,\) f32 \(send op 1, line test_capture_errors.py:"):
        _run(k2, small, tmp_path, neighbors=ring(2))


def test_recv_async_and_pending_payload(small, tmp_path):
    def k(tl, x, y):
        fut = tl.recv_async("intra_W", (64,), "f32")   # posted before the neighbour sends
        a = tl.load(x, (64,), "f32") * 2.0              # pending payload
        tl.send("intra_E", a)
        tl.store(y, tl.wait(fut))
    tr = _run(k, small, tmp_path, neighbors=ring(2))
    ops = tr.ops().to_pylist()
    recvs = [r for r in ops if r["kind"] == "recv"]
    assert [r["name"] for r in recvs] == ["recv_async"] * 2 and all(r["is_async"] for r in recvs)
    for r in recvs:
        send = ops[r["match_op_id"]]
        assert send["op_id"] < r["op_id"] and send["match_op_id"] == r["op_id"]
        wait = next(o for o in ops if o["kind"] == "wait" and o["program"] == r["program"])
        assert wait["deps"] == [r["op_id"]] and wait["handle_id"] == r["handle_id"]
    # program order: recv_async is seq 0 even though its op_id comes after the send
    assert sorted(r["seq"] for r in recvs) == [0, 0]


def test_kernel_exception_is_wrapped(small, tmp_path):
    def k(tl, x, y):
        raise ValueError("boom")
    with pytest.raises(CaptureError, match=r"program 0 .*line test_capture_errors.py:\d+: kernel "
                                           r"raised ValueError: boom"):
        _run(k, small, tmp_path)


def test_tl_outside_kernel():
    from kbtrace.capture import tl
    with pytest.raises(CaptureError, match="outside a kernel"):
        tl.program_id(0)


@pytest.mark.parametrize("body,expect", [
    ("""
        a = tl.load(x, (64,), "f32")
        if tl.exp(a) > 0:
            pass
     """, "pending result"),
    ("""
        live = [tl.load(x, (256,), "f32") for _ in range(2000)]
     """, "overflow"),
    ("""
        tl.recv("intra_E", (64,), "f32")
     """, "deadlock"),
])
def test_cli_exits_nonzero_with_one_line(tmp_path, capsys, body, expect):
    src = textwrap.dedent('''
        from kbtrace.capture import ring
        PARAMS = {"n": 256}
        def k(tl, x):
        ''') + textwrap.indent(textwrap.dedent(body), "    ") + textwrap.dedent('''
        def build(w, p):
            x = w.tensor("x", (p.n,), "f32", init=w.random(0))
            w.launch(k, grid=(2, 1), args=(x,), neighbors=ring(2))
        ''')
    wl = tmp_path / "bad.py"
    wl.write_text(src)
    rc = main(["capture", str(wl), "--topology", str(ROOT / "topologies" / "small.yaml"),
               "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc != 0 and err.count("\n") == 1 and expect in err.lower()
    assert not (tmp_path / "out" / "trace.json").exists()


def test_several_launches_in_sequence_and_cube_sharding(small, tmp_path):
    def double(tl, x, y):
        pid = tl.program_id(1)
        a = tl.load(x, (1, 16), "f32")
        tl.store(y, a * 2.0)
        assert pid == tl.program_id(1) and tl.num_programs(1) == 4

    def plus_one(tl, y, z):
        b = tl.load(y, (1, 16), "f32")            # written from a pending value -> pending
        assert b.pending
        tl.store(z, b + 1.0)

    def build(w, p):
        x = w.tensor("x", (4, 16), "f32", init=w.random(0), shard="cubes")
        y = w.tensor("y", (4, 16), "f32", shard="cubes")
        z = w.tensor("z", (4, 16), "f32", shard="cubes")
        w.launch(double, grid=(1, 4), args=(x, y))
        w.launch(plus_one, grid=(1, 4), args=(y, z))
        w.output(z, reference=lambda v: v["x"] * 2.0 + 1.0)

    tr = capture(SimpleNamespace(NAME="seq", PARAMS={}, build=build), small, out_dir=tmp_path)
    assert tr.meta["reference_check"]["z"]["ok"]
    assert [ln["n_ops"] for ln in tr.meta["launches"]] == [12, 12]
    ops = tr.ops().to_pylist()
    assert {(r["launch"], r["cube"], r["pe"]) for r in ops} == {
        (li, c, 0) for li in (0, 1) for c in range(4)}
    for r in ops:
        if r["launch"] == 1 and r["kind"] == "load":
            (dep,) = r["deps"]                       # the store of launch 0 on the same cube
            assert ops[dep]["kind"] == "store" and ops[dep]["launch"] == 0
            assert ops[dep]["cube"] == r["cube"]


def test_placement_outside_topology(small, tmp_path):
    def build(w, p):
        w.tensor("x", (4,), "f32", pe=(0, 9, 0))
    with pytest.raises(CaptureError, match="sip0.cube9.pe0, which 'small' does not have"):
        capture(SimpleNamespace(NAME="p", PARAMS={}, build=build), small, out_dir=tmp_path)
