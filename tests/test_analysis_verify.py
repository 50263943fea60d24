"""Phase-2 verification on a hand-built executable trace (GEMM + IPCQ + exp), no capture/replay."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from kbtrace import schema
from kbtrace._io import write_json, write_table
from kbtrace.analysis.synthetic import make_table
from kbtrace.analysis.verifier import execution_order, verify
from kbtrace.capture import executor as ex

A = np.arange(16, dtype=np.float32).reshape(4, 4) / 8
B = np.eye(4, dtype=np.float32) * 2 + 0.25
C = A @ B
D = np.exp(C / 8).astype(np.float32)  # exp of C/8 to keep values small
# op_id, program, seq, kind, name, src, dst, in_addrs, deps, match, t_start, t_end
_OPS = [
    (0, 0, 0, "load", "load", 0x1000, 0x10000, [], [], None, 0, 10),
    (1, 0, 1, "load", "load", 0x2000, 0x10100, [], [], None, 10, 20),
    (2, 0, 2, "dot", "dot", None, 0x10200, [0x10000, 0x10100], [0, 1], None, 20, 30),
    (3, 0, 3, "math", "mul", None, 0x10300, [0x10200], [2], None, 30, 35),
    (4, 0, 4, "store", "store", 0x10200, 0x3000, [], [2], None, 35, 45),
    (5, 0, 5, "send", "send", 0x10300, None, [], [3], 6, 35, 40),
    (6, 1, 0, "recv", "recv", None, 0x20000, [], [], 5, 40, 45),
    (7, 1, 1, "math", "exp", None, 0x20100, [0x20000], [6], None, 45, 55),
    (8, 1, 2, "store", "store", 0x20100, 0x4000, [], [7], None, 55, 65),
]


def _ops_table(digests=None):
    n = len(_OPS)
    return make_table(schema.OPS, {
        "op_id": [o[0] for o in _OPS], "launch": [0] * n, "program": [o[1] for o in _OPS],
        "pid0": [o[1] for o in _OPS], "pid1": [0] * n, "sip": [0] * n, "cube": [0] * n,
        "pe": [o[1] for o in _OPS], "seq": [o[2] for o in _OPS], "kind": [o[3] for o in _OPS],
        "name": [o[4] for o in _OPS], "is_async": [False] * n,
        "src_addr": [o[5] for o in _OPS], "dst_addr": [o[6] for o in _OPS], "nbytes": [64] * n,
        "in_addrs": [o[7] for o in _OPS], "in_spaces": [["tcm"] * len(o[7]) for o in _OPS],
        "in_shapes": [[[4, 4]] * len(o[7]) for o in _OPS],
        "in_dtypes": [["f32"] * len(o[7]) for o in _OPS],
        "scalars": [[0.125] if o[4] == "mul" else [] for o in _OPS],
        "out_shape": [[4, 4]] * n, "out_dtype": ["f32"] * n,
        "acc_dtype": ["f32" if o[3] == "dot" else None for o in _OPS],
        "match_op_id": [o[9] for o in _OPS], "deps": [o[8] for o in _OPS],
        "src_file": ["kern.py"] * n, "src_line": [100 + o[0] for o in _OPS],
        "out_digest": [None if digests is None else digests.get(o[0]) for o in _OPS]})


def _memory_table(a=A):
    rows = [("A", "input", 0x1000, a), ("B", "input", 0x2000, B),
            ("C", "output", 0x3000, np.zeros_like(C)), ("D", "output", 0x4000, np.zeros_like(D)),
            ("C", "reference", None, C), ("D", "reference", None, D)]
    return make_table(schema.MEMORY, {
        "tensor": [r[0] for r in rows], "role": [r[1] for r in rows], "shard": [0] * 6,
        "sip": [0] * 6, "cube": [0] * 6, "pe": [0] * 6, "space": ["hbm"] * 6,
        "addr": [r[2] for r in rows], "dtype": ["f32"] * 6, "shape": [[4, 4]] * 6,
        "offset": [[0, 0]] * 6, "global_shape": [[4, 4]] * 6, "nbytes": [64] * 6,
        "data": [np.ascontiguousarray(r[3], dtype=np.float32).tobytes() for r in rows]})


def _timing_table(times):
    n = len(_OPS)
    return make_table(schema.OP_TIMING, {
        "op_id": [o[0] for o in _OPS], "launch": [0] * n, "program": [o[1] for o in _OPS],
        "sip": [0] * n, "cube": [0] * n, "pe": [o[1] for o in _OPS], "seq": [o[2] for o in _OPS],
        "kind": [o[3] for o in _OPS], "name": [o[4] for o in _OPS], "engine": ["e"] * n,
        "t_issue_ns": [float(times[o[0]][0]) for o in _OPS],
        "t_start_ns": [float(times[o[0]][0]) for o in _OPS],
        "t_end_ns": [float(times[o[0]][1]) for o in _OPS], "queue_ns": [0.0] * n,
        "nbytes": [64] * n})


@pytest.fixture()
def run_dir(tmp_path):
    golden = ex.execute(_ops_table(), _memory_table())
    trace, run = tmp_path / "trace", tmp_path / "run"
    write_table(trace / "ops.parquet", _ops_table(golden.digests))
    write_table(trace / "memory.parquet", _memory_table())
    write_table(run / "op_timing.parquet", _timing_table({o[0]: (o[10], o[11]) for o in _OPS}))
    write_json(run / "run.json", {"run_id": "v", "trace_dir": str(trace),
                                  "schema_version": schema.SCHEMA_VERSION})
    return run


def test_verify_passes(run_dir):
    res = verify(run_dir)
    assert res.ok, res.text()
    assert [(t.tensor, t.ok, t.max_abs) for t in res.tensors] == [("C", True, 0.0), ("D", True, 0.0)]
    assert res.first_divergence is None and res.order_violations == []
    assert res.text().startswith("verify: PASS (9 ops in replay order, 2 output tensors")


def test_tie_break_by_dependency_depth(run_dir):
    # send (op5, depth 4) and store (op4, depth 3) tie at 35 ns: store first by depth
    ops = pq.read_table(run_dir.parent / "trace" / "ops.parquet")
    t = pq.read_table(run_dir / "op_timing.parquet")
    assert execution_order(ops, t) == [0, 1, 2, 3, 4, 5, 6, 7, 8]


def test_corrupted_input_names_first_diverging_op(run_dir):
    bad = A.copy()
    bad[1, 2] += 1.0
    write_table(run_dir.parent / "trace" / "memory.parquet", _memory_table(bad))
    res = verify(run_dir)
    assert not res.ok
    assert res.first_divergence is not None and res.first_divergence.op_id == 0
    c = {t.tensor: t for t in res.tensors}
    assert not c["C"].ok and not c["D"].ok
    assert c["C"].max_abs == pytest.approx(float(np.abs(bad @ B - C).max()))
    assert "first diverging op: op 0 load/load (launch 0, program 0, seq 0) at kern.py:100" in res.text()


def test_swapped_dependent_ops_fail(run_dir):
    times = {o[0]: (o[10], o[11]) for o in _OPS}
    times[0], times[2] = times[2], times[0]   # the dot now runs before the load of A
    write_table(run_dir / "op_timing.parquet", _timing_table(times))
    res = verify(run_dir)
    assert not res.ok
    assert res.first_divergence.op_id == 2 and res.first_divergence.position == 0
    assert res.order_violations == [(2, 0), (2, 1)]  # dot [0,10] before both loads end
    assert "order violation: op 2 starts before its dependency op 0 ends" in res.text()


def test_recv_before_send_reports_instead_of_crashing(run_dir):
    times = {o[0]: (o[10], o[11]) for o in _OPS}
    times[6] = (1, 2)   # recv timed before its send
    write_table(run_dir / "op_timing.parquet", _timing_table(times))
    res = verify(run_dir)
    assert not res.ok and res.first_divergence.op_id == 6
    assert "could not execute" in res.first_divergence.reason


def _compare_whole(got, want, rtol, atol):
    """The single-pass comparison ``_compare`` replaced (its reference)."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    diff = np.abs(g - w)
    diff = np.where(np.isnan(g) & np.isnan(w), 0.0, diff)
    diff = np.where(np.isnan(diff), np.inf, diff)
    nz = np.abs(w) > 0
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float((diff[nz] / np.abs(w[nz])).max()) if nz.any() else 0.0
    return max_abs, max_rel, int(np.count_nonzero(diff > atol + rtol * np.abs(w)))


@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_chunked_compare_equals_a_whole_tensor_pass(monkeypatch, chunk):
    from kbtrace.analysis import verifier as V
    from kbtrace.capture import dtypes
    from kbtrace.capture.dtypes import TOLERANCE
    monkeypatch.setattr(dtypes, "COMPARE_CHUNK", chunk)
    rng = np.random.default_rng(0)
    want = rng.normal(size=(5, 9)).astype(np.float32)
    want[0, 0] = 0.0
    want[1, 2] = np.nan
    got = want + rng.normal(scale=1e-4, size=want.shape).astype(np.float32)
    got[1, 2] = np.nan                 # both NaN: equal
    got[2, 3] = np.nan                 # one NaN: infinitely wrong
    got[3, 4] = np.inf
    cases = [(got, want, "f32"), (want.copy(), want, "f32"), (got[:0], want[:0], "f32"),
             (np.float32(1.5), np.float32(1.25), "f16"),
             (np.arange(12, dtype=np.int32), np.arange(12, dtype=np.int32)[::-1].copy(), "i32")]
    for g, w, dt in cases:
        rtol, atol = TOLERANCE[dt]
        res = V._compare("t", dt, np.asarray(g), np.asarray(w))
        assert (res.max_abs, res.max_rel, res.n_bad) == _compare_whole(
            np.asarray(g), np.asarray(w), rtol, atol), (dt, np.shape(g))
        assert res.ok == (res.n_bad == 0)


def test_compare_follows_isclose_on_infinities_and_nans():
    """``dtypes.compare`` counts as ``np.isclose(equal_nan=True)`` does (the whole-pass
    comparison it replaced called inf == inf a mismatch and missed a finite value against an
    infinite reference), and agrees with ``allclose`` and ``np.isclose``."""
    from kbtrace.capture.dtypes import TOLERANCE, allclose, compare
    inf, nan = np.inf, np.nan
    want = np.array([inf, -inf, inf, 1.0, nan, nan, 2.0, 0.0], np.float32)
    got = np.array([inf, -inf, 1.0, inf, nan, 1.0, 2.0 + 1e-6, 0.0], np.float32)
    rtol, atol = TOLERANCE["f32"]
    close = np.isclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                       equal_nan=True)
    max_abs, max_rel, n_bad = compare(got, want, "f32")
    assert n_bad == int((~close).sum()) == 3 and max_abs == inf
    assert compare(got[[0, 1, 4, 6, 7]], want[[0, 1, 4, 6, 7]], "f32")[2] == 0
    assert allclose(got[[0, 1, 4, 6, 7]], want[[0, 1, 4, 6, 7]], "f32")
    assert not allclose(got, want, "f32") and not allclose(got[:2], want[:3], "f32")
    ints = np.array([1, 2, 3], np.int32)
    assert compare(ints, ints + np.array([0, 0, 1], np.int32), "i32") == (1.0, 1 / 4, 1)


def test_planted_divergence_mid_trace_is_named(run_dir):
    """A wrong multiplier planted in op 3 (the golden digests stay the capture's): verify
    names op 3, D fails and C still matches."""
    import pyarrow as pa
    trace = run_dir.parent / "trace"
    ops = pq.read_table(trace / "ops.parquet")
    scal = ops.column("scalars").to_pylist()
    scal[3] = [0.25]
    ops = ops.set_column(ops.schema.get_field_index("scalars"), "scalars",
                         pa.array(scal, ops.schema.field("scalars").type))
    write_table(trace / "ops.parquet", ops)
    res = verify(run_dir)
    assert not res.ok and res.error is None
    fd = res.first_divergence
    assert (fd.op_id, fd.position, fd.kind, fd.name, fd.seq, fd.src_line) == (3, 3, "math", "mul", 3, 103)
    assert fd.reason.startswith("result digest ") and "!= capture" in fd.reason
    c = {t.tensor: t for t in res.tensors}
    assert c["C"].ok and not c["D"].ok and c["D"].n_bad == 16
    assert "first diverging op: op 3 math/mul (launch 0, program 0, seq 3) at kern.py:103" in res.text()


def test_exec_ops_refuse_columns_they_were_not_built_with():
    """verify builds ``ExecOp``s from the executor's columns only; reading another one fails
    loudly instead of returning a default."""
    op = ex.ExecOp(op_id=1, kind="load")
    assert op.op_id == 1 and op.mem_strides == () and op.out_digest is None
    with pytest.raises(AttributeError, match="launch"):
        _ = op.launch
    assert {"launch", "deps", "src_file"}.isdisjoint(ex.EXEC_FIELDS)
    assert set(ex.ExecOp._fields) == ex.EXEC_FIELDS


def _depth_reference(ids, deps, kinds, match):
    """The dict-and-deque Kahn walk ``verifier._depth`` replaced."""
    from collections import deque
    idset = set(ids)
    preds = {}
    for i, d, k, m in zip(ids, deps, kinds, match, strict=True):
        p = [x for x in (d or []) if x in idset]
        if k == "recv" and m is not None and m in idset:
            p.append(m)
        preds[i] = p
    succ = {i: [] for i in ids}
    indeg = {i: len(p) for i, p in preds.items()}
    for i, p in preds.items():
        for x in p:
            succ[x].append(i)
    depth = {i: 0 for i in ids}
    q = deque(i for i in ids if indeg[i] == 0)
    while q:
        i = q.popleft()
        for s in succ[i]:
            depth[s] = max(depth[s], depth[i] + 1)
            indeg[s] -= 1
            if indeg[s] == 0:
                q.append(s)
    return [depth[i] if indeg[i] == 0 else len(ids) + 1 for i in ids]


def test_dependency_depth_matches_the_dict_walk_on_random_graphs():
    import pyarrow as pa

    from kbtrace.analysis.verifier import _depth
    t = pa.table({"op_id": pa.array([0, 1, 2, 3], pa.int64()),
                  "deps": pa.array([[], [0], [3], [2]], pa.list_(pa.int64())),
                  "kind": pa.array(["load", "recv", "dot", "dot"]).dictionary_encode(),
                  "match_op_id": pa.array([None, 3, None, None], pa.int64())})
    assert _depth(t)[1].tolist() == [0, 5, 5, 5]          # 2 <-> 3 is a cycle: 1 waits on it
    # acyclic: the longest path counts (3 is after 0 directly and via 1, 2; the repeated
    # edge 2 -> 3 counts once per listing), a recv is after its send, unknown ids ignored
    t = pa.table({"op_id": pa.array([10, 11, 12, 13, 14, 15], pa.int64()),
                  "deps": pa.array([[], [10], [11], [10, 12, 12], [10, 99], None],
                                   pa.list_(pa.int64())),
                  "kind": pa.array(["load", "dot", "dot", "send", "recv", "load"])
                  .dictionary_encode(),
                  "match_op_id": pa.array([None, None, None, None, 13, None], pa.int64())})
    assert _depth(t)[1].tolist() == [0, 1, 2, 3, 4, 0]
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        ids = rng.permutation(2 * n)[:n].tolist()
        deps = [None if rng.random() < 0.1 else
                [int(rng.choice(ids)) if rng.random() < 0.8 else int(rng.integers(0, 3 * n))
                 for _ in range(int(rng.integers(0, 4)))] for _ in range(n)]
        kinds = [str(rng.choice(["load", "recv", "send"])) for _ in range(n)]
        match = [None if rng.random() < 0.3 else int(rng.choice(ids)) for _ in range(n)]
        t = pa.table({"op_id": pa.array(ids, pa.int64()),
                      "deps": pa.array(deps, pa.list_(pa.int64())),
                      "kind": pa.array(kinds).dictionary_encode(),
                      "match_op_id": pa.array(match, pa.int64())})
        got_ids, got = _depth(t)
        assert got_ids.tolist() == ids
        assert got.tolist() == _depth_reference(ids, deps, kinds, match)
    for _ in range(100):        # acyclic (deps on earlier ops only): deep level walks
        n = int(rng.integers(1, 300))
        ids = rng.permutation(3 * n)[:n].tolist()
        deps = [[ids[int(j)] for j in rng.integers(0, i, int(rng.integers(0, 4)))] if i else []
                for i in range(n)]
        kinds = [str(rng.choice(["load", "recv", "dot"])) for _ in range(n)]
        match = [ids[int(rng.integers(0, i))] if i and rng.random() < 0.5 else None
                 for i in range(n)]
        t = pa.table({"op_id": pa.array(ids, pa.int64()),
                      "deps": pa.array(deps, pa.list_(pa.int64())),
                      "kind": pa.array(kinds).dictionary_encode(),
                      "match_op_id": pa.array(match, pa.int64())})
        want = _depth_reference(ids, deps, kinds, match)
        assert max(want) < n + 1
        assert _depth(t)[1].tolist() == want


def test_order_violations_match_the_dict_loop_on_random_tables():
    """``_order_violations`` (numpy over the flattened deps) gives the pairs, in order, of
    the dict loop it replaced: null deps, unknown op_ids, repeated timing rows (last wins)."""
    import pyarrow as pa

    from kbtrace.analysis.verifier import _order_violations

    def reference(ids, deps, tids, ts, te):
        start, end = dict(zip(tids, ts, strict=True)), dict(zip(tids, te, strict=True))
        return [(i, x) for i, d in zip(ids, deps, strict=True) for x in d or []
                if x in end and i in start and start[i] < end[x]]

    rng = np.random.default_rng(2)
    for _ in range(300):
        n = int(rng.integers(0, 25))
        ids = rng.permutation(2 * n + 1)[:n].tolist()
        deps = [None if rng.random() < 0.1 else
                [None if rng.random() < 0.05 else int(rng.integers(0, 2 * n + 2))
                 for _ in range(int(rng.integers(0, 4)))] for _ in range(n)]
        tids = [int(rng.integers(0, 2 * n + 2)) for _ in range(int(rng.integers(0, 2 * n + 1)))]
        ts = rng.integers(0, 6, len(tids)).astype(float).tolist()
        te = rng.integers(0, 6, len(tids)).astype(float).tolist()
        ops = pa.table({"op_id": pa.array(ids, pa.int64()),
                        "deps": pa.array(deps, pa.list_(pa.int64()))})
        timing = pa.table({"op_id": pa.array(tids, pa.int64()),
                           "t_start_ns": pa.array(ts, pa.float64()),
                           "t_end_ns": pa.array(te, pa.float64())})
        assert _order_violations(ops, timing) == reference(ids, deps, tids, ts, te)


@pytest.mark.parametrize("young, collections", [(0, 5), (10**9, 0)])
def test_young_generation_collected_between_batches_past_the_threshold(run_dir, monkeypatch,
                                                                      young, collections):
    """Automatic GC is paused while the ops run; between two batches (2 ops each here: 5
    batches of the 9 ops) the young generation is collected only once it grew by
    ``GC_YOUNG`` objects, not after every batch."""
    import gc

    from kbtrace.analysis import verifier
    monkeypatch.setattr(verifier, "OP_BATCH", 2)
    monkeypatch.setattr(verifier, "GC_YOUNG", young)
    seen: list[int] = []

    def note(phase, info):
        if phase == "start" and info["generation"] == 0:
            seen.append(0)

    gc.callbacks.append(note)
    try:
        res = verify(run_dir)
    finally:
        gc.callbacks.remove(note)
    assert res.ok, res.text()
    assert len(seen) == collections


def _int_gemm(tmp_path, acc_of_dot4=0x10400, bits=15):
    """An i32 trace of one tile accumulated over two K steps: loads of A0, B0, A1, B1, a
    zeros fill, dot(A0, B0, acc) -> 0x10400, dot(A1, B1, 0x10400) -> 0x10500, store to the
    output. ``acc_of_dot4``: the accumulator op 6 reads (0x10400 as captured; the golden
    digests are always the captured trace's). ``bits``: the operands' magnitude (15: products
    in float64, 8: in float32)."""
    rng = np.random.default_rng(7)
    a = rng.integers(-2**bits, 2**bits, (4, 16), dtype=np.int32)     # two 4x8 K tiles
    b = rng.integers(-2**bits, 2**bits, (16, 4), dtype=np.int32)
    want = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)   # (wraps as int32)
    t = 0x10000
    rows = [  # op_id, kind, name, src, dst, in_addrs, in_shapes, out_shape, strides, deps
        (0, "load", "load", 0x1000, t, [], [], [4, 8], [16, 1], []),
        (1, "load", "load", 0x2000, t + 0x100, [], [], [8, 4], [4, 1], []),
        (2, "load", "load", 0x1000 + 32, t + 0x200, [], [], [4, 8], [16, 1], []),
        (3, "load", "load", 0x2000 + 128, t + 0x280, [], [], [8, 4], [4, 1], []),
        (4, "fill", "zeros", None, t + 0x300, [], [], [4, 4], [], []),
        (5, "dot", "dot", None, t + 0x400, [t, t + 0x100, t + 0x300],
         [[4, 8], [8, 4], [4, 4]], [4, 4], [], [0, 1, 4]),
        (6, "dot", "dot", None, t + 0x500, [t + 0x200, t + 0x280, t + 0x400],
         [[4, 8], [8, 4], [4, 4]], [4, 4], [], [2, 3, 5]),
        (7, "store", "store", t + 0x500, 0x3000, [], [], [4, 4], [], [6]),
    ]

    def ops_table(acc, digests=None):
        n = len(rows)
        ins = [r[5] if r[0] != 6 else [*r[5][:2], acc] for r in rows]
        return make_table(schema.OPS, {
            "op_id": [r[0] for r in rows], "launch": [0] * n, "program": [0] * n,
            "pid0": [0] * n, "pid1": [0] * n, "sip": [0] * n, "cube": [0] * n, "pe": [0] * n,
            "seq": [r[0] for r in rows], "kind": [r[1] for r in rows],
            "name": [r[2] for r in rows], "is_async": [False] * n,
            "src_addr": [r[3] for r in rows], "dst_addr": [r[4] for r in rows],
            "nbytes": [64] * n, "in_addrs": ins, "in_spaces": [["tcm"] * len(i) for i in ins],
            "in_shapes": [r[6] for r in rows], "in_dtypes": [["i32"] * len(i) for i in ins],
            "scalars": [[]] * n, "out_shape": [r[7] for r in rows], "out_dtype": ["i32"] * n,
            "acc_dtype": ["i32" if r[1] == "dot" else None for r in rows],
            "mem_strides": [r[8] for r in rows], "deps": [r[9] for r in rows],
            "src_file": ["k.py"] * n, "src_line": [200 + r[0] for r in rows],
            "out_digest": [None if digests is None else digests.get(r[0]) for r in rows]})

    mem_rows = [("a", "input", 0x1000, a), ("b", "input", 0x2000, b),
                ("c", "output", 0x3000, np.zeros_like(want)), ("c", "reference", None, want)]
    memory = make_table(schema.MEMORY, {
        "tensor": [r[0] for r in mem_rows], "role": [r[1] for r in mem_rows],
        "shard": [0] * 4, "sip": [0] * 4, "cube": [0] * 4, "pe": [0] * 4, "space": ["hbm"] * 4,
        "addr": [r[2] for r in mem_rows], "dtype": ["i32"] * 4,
        "shape": [list(r[3].shape) for r in mem_rows], "offset": [[0, 0]] * 4,
        "global_shape": [list(r[3].shape) for r in mem_rows],
        "nbytes": [r[3].nbytes for r in mem_rows],
        "data": [np.ascontiguousarray(r[3]).tobytes() for r in mem_rows]})
    golden = ex.execute(ops_table(t + 0x400), memory)
    assert np.array_equal(golden.outputs["c"], want)
    trace, run = tmp_path / "trace", tmp_path / "run"
    write_table(trace / "ops.parquet", ops_table(acc_of_dot4, golden.digests))
    write_table(trace / "memory.parquet", memory)
    n = len(rows)
    write_table(run / "op_timing.parquet", make_table(schema.OP_TIMING, {
        "op_id": list(range(n)), "launch": [0] * n, "program": [0] * n, "sip": [0] * n,
        "cube": [0] * n, "pe": [0] * n, "seq": list(range(n)), "kind": [r[1] for r in rows],
        "name": [r[2] for r in rows], "engine": ["e"] * n,
        "t_issue_ns": [10.0 * i for i in range(n)], "t_start_ns": [10.0 * i for i in range(n)],
        "t_end_ns": [10.0 * i + 5 for i in range(n)], "queue_ns": [0.0] * n,
        "nbytes": [64] * n}))
    write_json(run / "run.json", {"run_id": "i", "trace_dir": str(trace),
                                  "schema_version": schema.SCHEMA_VERSION})
    return run


@pytest.mark.parametrize("batch, bits", [(8192, 15), (3, 15), (8192, 8), (3, 8)])
def test_integer_dots_accumulate_exactly_and_a_wrong_accumulator_is_named(tmp_path, monkeypatch,
                                                                        batch, bits):
    """i32 dots with an accumulator (products through BLAS, the accumulator added in place,
    int32 wrap-around as numpy's): the captured trace passes; a dot reading the wrong
    accumulator (the zeros, not the first dot's result) is named, in a later batch of ops
    too, and the output fails."""
    from kbtrace.analysis import verifier
    monkeypatch.setattr(verifier, "OP_BATCH", batch)
    res = verify(_int_gemm(tmp_path / "ok", bits=bits))
    assert res.ok and res.first_divergence is None, res.text()
    assert [(t.tensor, t.ok, t.max_abs) for t in res.tensors] == [("c", True, 0.0)]
    res = verify(_int_gemm(tmp_path / "bad", acc_of_dot4=0x10300, bits=bits))
    fd = res.first_divergence
    assert not res.ok and res.error is None and fd is not None
    assert (fd.op_id, fd.position, fd.kind, fd.src_line) == (6, 6, "dot", 206)
    assert fd.reason.startswith("result digest ") and "!= capture" in fd.reason
    assert not res.tensors[0].ok and res.tensors[0].n_bad > 0

